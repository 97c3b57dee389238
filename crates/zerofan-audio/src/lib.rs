//! zerofan-audio: live audio capture into pooled buffers, handed over
//! without allocating on the real-time thread, and published to MQTT topics.
//!
//! # Map of the crate
//!
//! - [`list_devices`] / [`DeviceInfo`] (`device`): capture sources of every
//!   cpal host (ALSA and PulseAudio on Linux, WASAPI on Windows, CoreAudio
//!   on macOS), loopback sources included.
//! - [`Capture`] (`capture`): opens a device at a chosen rate, channel count
//!   and [`SampleFormat`], cuts the stream into packets of
//!   [`CaptureConfig::packet_duration`] (10 ms by default) and hands
//!   [`CaptureEvent`]s (packets, errors, end) to a sink on its own thread.
//!   [`Capture::stats`] counts packets, drops and pool use.
//! - [`Packetizer`] / [`PacketReceiver`] (`packetizer`): the real-time core
//!   as a pure struct: arbitrary callback slices in, whole packets in pooled
//!   buffers out, through two bounded wait-free SPSC rings. Never allocates,
//!   locks or blocks (proved by `tests/no_alloc.rs`).
//! - [`header`]: the 32-byte wire header (magic, version, format, channels,
//!   rate, frames, seq, timestamp) in front of each published packet, so a
//!   listener detects gaps.
//! - `publish` (feature `mqtt`, on by default): a bounded publisher task that streams packets to a topic
//!   with zerofan-client (expert mode: header and samples written straight
//!   into the outgoing frame; or zero-copy `Bytes`).
//!
//! # Example
//!
//! ```no_run
//! # fn demo() -> Result<(), zerofan_audio::AudioError> {
//! use zerofan_audio::{Capture, CaptureConfig, CaptureEvent, SampleFormat};
//!
//! let config = CaptureConfig { sample_rate: Some(48_000), channels: Some(1),
//!                              format: SampleFormat::I16, ..Default::default() };
//! let mut capture = Capture::start(config, |event| {
//!     if let CaptureEvent::Packet(p) = event {
//!         println!("seq {} {} bytes", p.info().seq, p.samples().len());
//!     }
//!     true
//! })?;
//! std::thread::sleep(std::time::Duration::from_secs(1));
//! capture.stop();
//! println!("{:?}", capture.stats());
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod capture;
mod device;
mod error;
mod format;
pub mod header;
mod packetizer;
#[cfg(feature = "mqtt")]
pub mod publish;

pub use capture::{
    Capture, CaptureEvent, CaptureStats, EndReason, Sink, StreamError, START_TIMEOUT, STOP_TIMEOUT,
};
pub use device::{list_devices, DefaultConfig, DeviceInfo, DEFAULT_LOOPBACK, LOOPBACK_PREFIX};
pub use error::AudioError;
pub use format::{CaptureConfig, DeviceSelector, PacketInfo, SampleFormat, StreamParams};
pub use header::{decode_header, decode_packet, encode_header, HEADER_LEN};
pub use packetizer::{packet_channel, InputSample, Packet, PacketReceiver, Packetizer};

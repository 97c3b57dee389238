//! Sample formats, per-packet info and the capture configuration.

use std::time::Duration;

/// How samples are laid out in a packet: interleaved frames, little-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleFormat {
    /// Signed 16-bit integers (2 bytes per sample).
    I16,
    /// 32-bit IEEE floats in [-1, 1] (4 bytes per sample).
    F32,
}

impl SampleFormat {
    /// Bytes per sample (one channel of one frame).
    pub const fn bytes_per_sample(self) -> usize {
        match self {
            SampleFormat::I16 => 2,
            SampleFormat::F32 => 4,
        }
    }

    /// The code used in the wire header (1 = i16, 2 = f32).
    pub const fn code(self) -> u8 {
        match self {
            SampleFormat::I16 => 1,
            SampleFormat::F32 => 2,
        }
    }

    /// The format for a wire header code.
    pub const fn from_code(code: u8) -> Option<SampleFormat> {
        match code {
            1 => Some(SampleFormat::I16),
            2 => Some(SampleFormat::F32),
            _ => None,
        }
    }

    /// `"i16"` or `"f32"`, the names the Node API uses.
    pub const fn as_str(self) -> &'static str {
        match self {
            SampleFormat::I16 => "i16",
            SampleFormat::F32 => "f32",
        }
    }

    /// Parses `"i16"` / `"s16"` / `"int16"` or `"f32"` / `"float32"`
    /// (case-insensitive), as a Node caller would spell them.
    pub fn parse(s: &str) -> Option<SampleFormat> {
        match s.to_ascii_lowercase().as_str() {
            "i16" | "s16" | "int16" | "s16le" => Some(SampleFormat::I16),
            "f32" | "float32" | "float" | "f32le" => Some(SampleFormat::F32),
            _ => None,
        }
    }
}

impl std::fmt::Display for SampleFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a listener needs to know about one packet. Travels in the wire
/// header (see [`crate::header`]) and with every local packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketInfo {
    /// Packet index since the capture started. Dropped packets use up their
    /// number too, so a gap in `seq` is a lost packet.
    pub seq: u64,
    /// Capture time of the packet's first frame, in nanoseconds on the
    /// audio host's monotonic stream clock: cpal's `InputStreamTimestamp::
    /// capture` advanced by the frames before it in the same callback, but
    /// never less than the previous packet's timestamp plus one packet
    /// duration. Backends estimate these times (PulseAudio interpolates
    /// latency, bursts of data carry one estimate), so the floor keeps the
    /// steps exact (one packet duration) while the backend's estimate lags,
    /// and follows it when it jumps ahead (a real gap). Only differences
    /// between packets of one stream mean something; the exact sample
    /// position of a packet is `seq * frames`.
    pub timestamp_ns: u64,
    /// Frames per second.
    pub sample_rate: u32,
    /// Interleaved channels per frame.
    pub channels: u16,
    /// Sample format of the payload.
    pub format: SampleFormat,
}

/// Which device to capture from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DeviceSelector {
    /// The default input device of the default host (on Linux the
    /// PulseAudio host when a server is reachable, else ALSA).
    #[default]
    Default,
    /// A device matched by, in this order: its full id as listed
    /// (`"pulseaudio:zf_null.monitor"`, `"alsa:pulse"`; the host part is
    /// matched ignoring ASCII case), its id within its
    /// host (`"zf_null.monitor"`, `"pulse"`), its name
    /// (`"Monitor of Null Output"`). See [`crate::list_devices`].
    Named(String),
}

impl DeviceSelector {
    /// `Default` for `None` or an empty string / `"default"`, else `Named`:
    /// the mapping of the Node API's `device` option.
    pub fn from_option(device: Option<&str>) -> DeviceSelector {
        match device {
            None | Some("") | Some("default") => DeviceSelector::Default,
            Some(name) => DeviceSelector::Named(name.to_owned()),
        }
    }
}

/// How to capture. Build with [`CaptureConfig::default`] and set fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureConfig {
    /// Which input device.
    pub device: DeviceSelector,
    /// Frames per second; `None` takes the device's default rate.
    pub sample_rate: Option<u32>,
    /// Channels; `None` takes the device's default channel count.
    pub channels: Option<u16>,
    /// Format of the packets handed out (the device stream is opened in this
    /// format when the device offers it, else in the other one and
    /// converted while copying, which costs nothing extra: every sample is
    /// copied once either way).
    pub format: SampleFormat,
    /// Duration of one packet. Default 10 ms. Must be at least 1 ms and at
    /// most 1 s, and a whole number of frames at the chosen rate is taken
    /// (rounded down, at least one frame).
    pub packet_duration: Duration,
    /// How many finished packets may wait for the consumer, and how many
    /// empty buffers wait for the callback. When either runs out, the
    /// packet is dropped and counted. Default 256 (2.56 s at 10 ms: room
    /// for a consumer thread starved of CPU for a while, at 2 × 256 pooled
    /// buffers, 1 MiB for 48 kHz mono i16).
    pub queue_packets: usize,
    /// Frames per device callback to ask the backend for. `None` (default)
    /// leaves it to the backend: the packetizer takes any callback size.
    /// It does not tame cpal's PulseAudio host, which may deliver record
    /// data in bursts of up to 64 KiB (0.7 s at 48 kHz mono i16) either way
    /// (so `queue_packets` must absorb one), and makes a fixed record buffer
    /// exactly one callback long, which overruns when the reading thread is
    /// late. For steady 10 ms delivery on Linux, capture through ALSA's
    /// `pulse` PCM (device `"alsa:pulse"`, source from `PULSE_SOURCE`).
    pub buffer_frames: Option<u32>,
    /// After this long without a device callback, a (non-fatal)
    /// `CaptureEvent::Error` of kind `"Stalled"` is sent, once per stall:
    /// some backends (cpal's PulseAudio host among them) say nothing when
    /// a device disappears, the data just stops. Not fatal because a
    /// suspended source stops the same way and resumes. `None` disables.
    /// Default 2 s.
    pub stall_timeout: Option<Duration>,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            device: DeviceSelector::Default,
            sample_rate: None,
            channels: None,
            format: SampleFormat::I16,
            packet_duration: Duration::from_millis(10),
            queue_packets: 256,
            buffer_frames: None,
            stall_timeout: Some(Duration::from_secs(2)),
        }
    }
}

/// The parameters a capture actually runs with, after defaults were filled
/// in from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamParams {
    /// Frames per second.
    pub sample_rate: u32,
    /// Channels per frame.
    pub channels: u16,
    /// Format of the packets handed out.
    pub format: SampleFormat,
    /// Frames per packet.
    pub frames_per_packet: u32,
}

impl StreamParams {
    /// Sample bytes in one packet (without the header).
    pub fn packet_bytes(&self) -> usize {
        self.frames_per_packet as usize * self.channels as usize * self.format.bytes_per_sample()
    }

    /// Frames per packet for `duration` at `sample_rate`: rounded down, at
    /// least 1.
    pub fn frames_for(sample_rate: u32, duration: Duration) -> u32 {
        let frames = u128::from(sample_rate) * duration.as_nanos() / 1_000_000_000;
        frames.clamp(1, u128::from(u32::MAX)) as u32
    }

    /// Nanoseconds that `frames` frames last.
    pub fn frames_to_ns(&self, frames: u64) -> u64 {
        (u128::from(frames) * 1_000_000_000 / u128::from(self.sample_rate.max(1))) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_sizes() {
        let p = StreamParams {
            sample_rate: 48_000,
            channels: 1,
            format: SampleFormat::I16,
            frames_per_packet: StreamParams::frames_for(48_000, Duration::from_millis(10)),
        };
        assert_eq!(p.frames_per_packet, 480);
        assert_eq!(p.packet_bytes(), 960);
        let stereo_f32 = StreamParams {
            channels: 2,
            format: SampleFormat::F32,
            ..p
        };
        assert_eq!(stereo_f32.packet_bytes(), 3840);
        assert_eq!(
            StreamParams::frames_for(44_100, Duration::from_millis(10)),
            441
        );
        assert_eq!(StreamParams::frames_for(8_000, Duration::from_nanos(1)), 1);
        assert_eq!(p.frames_to_ns(480), 10_000_000);
    }

    #[test]
    fn format_names() {
        for f in [SampleFormat::I16, SampleFormat::F32] {
            assert_eq!(SampleFormat::parse(f.as_str()), Some(f));
            assert_eq!(SampleFormat::from_code(f.code()), Some(f));
        }
        assert_eq!(SampleFormat::parse("FLOAT32"), Some(SampleFormat::F32));
        assert_eq!(SampleFormat::parse("u8"), None);
        assert_eq!(
            DeviceSelector::from_option(Some("")),
            DeviceSelector::Default
        );
        assert_eq!(
            DeviceSelector::from_option(Some("x")),
            DeviceSelector::Named("x".into())
        );
    }
}

//! A running capture: the cpal stream, the pump thread that takes packets
//! off the real-time side, and the events it hands to a sink.
//!
//! Threads:
//! - the audio callback (owned by cpal, real-time): feeds a [`Packetizer`];
//! - the pump thread (one per capture, named `zerofan-audio`): builds and
//!   owns the cpal stream (so the stream never changes threads, which some
//!   backends require), parks until the callback unparks it, takes
//!   packets and backend errors, keeps the empty-buffer ring full, and calls
//!   the sink with [`CaptureEvent`]s. The sink runs on this thread only.
//!
//! A slow sink slows the pump, the packet ring fills, and the callback
//! drops packets (counted): nothing queues without bound. A sink that
//! forwards into its own bounded queue (a tokio channel, napi's
//! threadsafe function) reports "full" by returning `false`, which counts
//! as a sink drop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use cpal::traits::{DeviceTrait, StreamTrait};
use zerofan_pool::{Pool, PoolConfig};

use crate::device::{choose, our_format, supported_ranges, Chosen, DeviceInfo};
use crate::error::AudioError;
use crate::format::{CaptureConfig, SampleFormat, StreamParams};
use crate::packetizer::{bump, packet_channel, Counters, InputSample, Packet, PacketReceiver};

/// How long [`Capture::start`] waits for the device to open and start.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);

/// How long [`Capture::stop`] waits for the audio backend to let go of
/// the stream before it returns without it.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// What a capture hands its sink, in order, on the pump thread.
#[derive(Debug)]
pub enum CaptureEvent {
    /// A full packet.
    Packet(Packet),
    /// The backend reported a problem. Non-fatal ones (an overrun) leave
    /// the capture running; a fatal one is followed by `Ended`.
    Error(StreamError),
    /// The capture is over; nothing follows.
    Ended(EndReason),
}

/// A problem the audio backend reported while capturing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamError {
    /// cpal's error kind (`"Xrun"`, `"DeviceNotAvailable"`,
    /// `"StreamInvalidated"`, ...).
    pub kind: String,
    /// Human-readable text.
    pub message: String,
    /// The stream is dead (device unplugged, server gone).
    pub fatal: bool,
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

/// Why a capture ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// [`Capture::stop`] (or drop).
    Stopped,
    /// The device went away or the stream died; the text says how.
    DeviceLost(String),
}

/// Counters of one capture, from [`Capture::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CaptureStats {
    /// Packets handed to the sink and accepted by it.
    pub packets: u64,
    /// Packets the device produced (handed over or dropped).
    pub captured: u64,
    /// All drops: `drops_queue_full + drops_no_buffer + drops_sink`.
    pub drops: u64,
    /// Dropped in the callback: the packet queue was full (consumer slow).
    pub drops_queue_full: u64,
    /// Dropped in the callback: no empty buffer was ready.
    pub drops_no_buffer: u64,
    /// Refused by the sink (its own queue was full).
    pub drops_sink: u64,
    /// Frames the callback received.
    pub frames: u64,
    /// Device callbacks so far.
    pub callbacks: u64,
    /// Most frames one callback delivered: a backend that delivers in
    /// bursts larger than the packet queue (`queue_packets` packets) loses
    /// packets however fast the consumer is.
    pub max_callback_frames: u64,
    /// Errors the backend reported (overruns included).
    pub errors: u64,
    /// Overruns / underruns among them.
    pub xruns: u64,
    /// Pool gets served from memory the pool held.
    pub pool_hits: u64,
    /// Pool gets that allocated.
    pub pool_misses: u64,
    /// `pool_hits / (pool_hits + pool_misses)`, 0 before the first get.
    pub pool_hit_rate: f64,
    /// Bytes of pooled buffers out of the pool: in the rings, in the sink,
    /// in Node Buffers not yet collected, in the MQTT client's queue.
    pub bytes_outstanding: u64,
    /// Bytes the pool keeps for reuse.
    pub bytes_retained: u64,
}

/// What the pump reports once the stream runs.
struct Started {
    params: StreamParams,
    device: DeviceInfo,
    counters: Arc<Counters>,
}

/// A running capture. Stops on [`stop`](Self::stop) or drop.
pub struct Capture {
    params: StreamParams,
    device: DeviceInfo,
    counters: Arc<Counters>,
    pool: Pool,
    stop: Arc<AtomicBool>,
    pump: Option<JoinHandle<()>>,
    /// Disconnected when the pump thread's closure returns: lets `stop`
    /// wait for it with a deadline, which `JoinHandle::join` has not.
    pump_done: mpsc::Receiver<()>,
    end: Arc<Mutex<Option<EndReason>>>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("params", &self.params)
            .field("device", &self.device.id)
            .finish()
    }
}

/// The sink's signature: takes each event, returns `false` when it refused
/// a packet (counted as a sink drop; ignored for other events).
pub type Sink = Box<dyn FnMut(CaptureEvent) -> bool + Send + 'static>;

impl Capture {
    /// Opens the device of `config`, starts capturing and calls `sink` with
    /// every [`CaptureEvent`] on the capture's own thread. Returns once the
    /// stream runs (or failed to start, within [`START_TIMEOUT`]).
    ///
    /// Each capture has its own [`Pool`] (so its stats are its own),
    /// warmed up with enough buffers for both rings.
    pub fn start(
        config: CaptureConfig,
        sink: impl FnMut(CaptureEvent) -> bool + Send + 'static,
    ) -> Result<Capture, AudioError> {
        validate(&config)?;
        let pool = Pool::new(PoolConfig::default());
        let stop = Arc::new(AtomicBool::new(false));
        let end = Arc::new(Mutex::new(None));
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let (done_tx, pump_done) = mpsc::sync_channel::<()>(0);
        let pump = {
            let (pool, stop, end) = (pool.clone(), stop.clone(), end.clone());
            let sink: Sink = Box::new(sink);
            thread::Builder::new()
                .name("zerofan-audio".into())
                .spawn(move || {
                    let _done = done_tx;
                    pump(config, sink, pool, stop, end, ready_tx)
                })
                .map_err(|e| AudioError::Thread(e.to_string()))?
        };
        match ready_rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(s)) => Ok(Capture {
                params: s.params,
                device: s.device,
                counters: s.counters,
                pool,
                stop,
                pump: Some(pump),
                pump_done,
                end,
            }),
            Ok(Err(e)) => {
                let _ = pump.join();
                Err(e)
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // The backend hangs; the thread exits if it ever returns.
                stop.store(true, Ordering::Release);
                Err(AudioError::StartTimeout(START_TIMEOUT))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = pump.join();
                Err(AudioError::Thread(
                    "capture thread exited while starting".into(),
                ))
            }
        }
    }

    /// Like [`start`](Self::start), with the events in a bounded tokio
    /// channel of `capacity` events. A packet that finds the channel full
    /// is dropped and counted (`drops_sink`). The channel closes when the
    /// capture ends (after an `Ended` event if there was room for it);
    /// [`end_reason`](Self::end_reason) says why either way.
    pub fn start_channel(
        config: CaptureConfig,
        capacity: usize,
    ) -> Result<(Capture, tokio::sync::mpsc::Receiver<CaptureEvent>), AudioError> {
        let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
        let capture = Capture::start(config, move |ev| tx.try_send(ev).is_ok())?;
        Ok((capture, rx))
    }

    /// The parameters the capture runs with (rate, channels, format, frames
    /// per packet), defaults filled in.
    pub fn params(&self) -> StreamParams {
        self.params
    }

    /// The device being captured.
    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// Packet and pool counters. Cheap (relaxed loads and a pool snapshot).
    pub fn stats(&self) -> CaptureStats {
        stats(&self.counters, &self.pool)
    }

    /// Why the capture ended, once it has.
    pub fn end_reason(&self) -> Option<EndReason> {
        self.end.lock().map(|g| g.clone()).unwrap_or(None)
    }

    /// Whether the capture has ended (stopped, or the device was lost).
    pub fn is_ended(&self) -> bool {
        self.end_reason().is_some()
    }

    /// Asks the capture to stop and returns at once: the pump stops the
    /// stream, delivers what was captured, sends `Ended(Stopped)` and exits.
    /// For callers that must not block, such as a JavaScript thread that
    /// also has to drain the events the pump is sending (joining the pump
    /// there could deadlock); [`stop`](Self::stop) or drop afterwards then
    /// returns immediately once `Ended` was seen.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(pump) = &self.pump {
            pump.thread().unpark();
        }
    }

    /// Stops the stream, delivers the packets already captured, sends
    /// `Ended(Stopped)` (unless it ended before) and waits for the pump
    /// thread. Idempotent.
    ///
    /// Waits at most [`STOP_TIMEOUT`] for the backend to let go of the
    /// stream: a sound server that stopped answering (paused, wedged)
    /// never answers the request cpal's PulseAudio stream waits for when
    /// dropped. Then `stop` returns all the same, the capture counts as
    /// ended (`Stopped`), and the pump thread is left to finish on its
    /// own: its sink gets the rest, `Ended` last, if the server ever
    /// answers.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let Some(pump) = self.pump.take() else {
            return;
        };
        pump.thread().unpark();
        match self.pump_done.recv_timeout(STOP_TIMEOUT) {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Ok(mut end) = self.end.lock() {
                    end.get_or_insert(EndReason::Stopped);
                }
                // Detached: dropping the handle does not wait.
                drop(pump);
            }
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = pump.join();
            }
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop();
    }
}

fn validate(c: &CaptureConfig) -> Result<(), AudioError> {
    let bad = |m: String| Err(AudioError::InvalidConfig(m));
    if c.packet_duration < Duration::from_millis(1) || c.packet_duration > Duration::from_secs(1) {
        return bad(format!(
            "packet duration {:?} outside 1 ms ..= 1 s",
            c.packet_duration
        ));
    }
    if c.sample_rate == Some(0) || c.sample_rate.is_some_and(|r| r > 1_536_000) {
        return bad(format!("sample rate {:?}", c.sample_rate));
    }
    if c.channels == Some(0) || c.channels.is_some_and(|n| n > 64) {
        return bad(format!("channels {:?}", c.channels));
    }
    if !(2..=65_536).contains(&c.queue_packets) {
        return bad(format!(
            "queue_packets {} outside 2..=65536",
            c.queue_packets
        ));
    }
    Ok(())
}

pub(crate) fn stats(c: &Counters, pool: &Pool) -> CaptureStats {
    let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let m = pool.metrics();
    let (qf, nb, sk) = (
        ld(&c.dropped_queue_full),
        ld(&c.dropped_no_buffer),
        ld(&c.dropped_by_sink),
    );
    CaptureStats {
        packets: ld(&c.delivered),
        captured: ld(&c.captured),
        drops: qf + nb + sk,
        drops_queue_full: qf,
        drops_no_buffer: nb,
        drops_sink: sk,
        frames: ld(&c.frames),
        callbacks: ld(&c.callbacks),
        max_callback_frames: ld(&c.max_callback_frames),
        errors: ld(&c.errors),
        xruns: ld(&c.xruns),
        pool_hits: m.hits,
        pool_misses: m.misses,
        pool_hit_rate: m.hit_rate(),
        bytes_outstanding: m.bytes_outstanding,
        bytes_retained: m.bytes_retained,
    }
}

/// The stream and the receiving end, once opened.
struct Opened {
    stream: cpal::Stream,
    params: StreamParams,
    receiver: PacketReceiver,
    errors: mpsc::Receiver<cpal::Error>,
}

fn pump(
    config: CaptureConfig,
    mut sink: Sink,
    pool: Pool,
    stop: Arc<AtomicBool>,
    end: Arc<Mutex<Option<EndReason>>>,
    ready: SyncSender<Result<Started, AudioError>>,
) {
    let opened = choose(&config.device).and_then(|chosen| {
        let o = open(&chosen, &config, pool)?;
        o.stream.play()?;
        Ok((o, chosen.info))
    });
    let (mut o, device) = match opened {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let counters = o.receiver.counters().clone();
    if ready
        .send(Ok(Started {
            params: o.params,
            device,
            counters: counters.clone(),
        }))
        .is_err()
    {
        return; // start() gave up (timeout): nobody listens.
    }
    // A safety net and the watchdog's clock: the callback unparks this
    // thread per packet.
    let tick =
        (config.packet_duration * 4).clamp(Duration::from_millis(20), Duration::from_millis(250));
    let deliver = |sink: &mut Sink, p: Packet| {
        if sink(CaptureEvent::Packet(p)) {
            bump(&counters.delivered, 1);
        } else {
            bump(&counters.dropped_by_sink, 1);
        }
    };
    // Stall watchdog: callbacks counted by the packetizer.
    let mut last_callbacks = 0u64;
    let mut last_progress = std::time::Instant::now();
    let mut stall_reported = false;
    let reason = 'run: loop {
        while let Some(p) = o.receiver.try_recv() {
            deliver(&mut sink, p);
        }
        if let Some(limit) = config.stall_timeout {
            let now_callbacks = counters.callbacks.load(Ordering::Relaxed);
            if now_callbacks != last_callbacks {
                last_callbacks = now_callbacks;
                last_progress = std::time::Instant::now();
                stall_reported = false;
            } else if !stall_reported && last_progress.elapsed() >= limit {
                stall_reported = true;
                bump(&counters.errors, 1);
                sink(CaptureEvent::Error(StreamError {
                    kind: "Stalled".into(),
                    message: format!(
                        "no audio from the device for {:?} (unplugged, suspended or gone)",
                        last_progress.elapsed()
                    ),
                    fatal: false,
                }));
            }
        }
        while let Ok(e) = o.errors.try_recv() {
            let kind = e.kind();
            bump(&counters.errors, 1);
            if kind == cpal::ErrorKind::Xrun {
                bump(&counters.xruns, 1);
            }
            let fatal = matches!(
                kind,
                cpal::ErrorKind::DeviceNotAvailable | cpal::ErrorKind::StreamInvalidated
            );
            let err = StreamError {
                kind: format!("{kind:?}"),
                message: e.to_string(),
                fatal,
            };
            let text = err.to_string();
            sink(CaptureEvent::Error(err));
            if fatal {
                break 'run EndReason::DeviceLost(text);
            }
        }
        if stop.load(Ordering::Acquire) {
            break EndReason::Stopped;
        }
        thread::park_timeout(tick);
    };
    // Stop the callbacks, then hand over what they completed.
    drop(o.stream);
    while let Some(p) = o.receiver.drain_one() {
        deliver(&mut sink, p);
    }
    if let Ok(mut g) = end.lock() {
        *g = Some(reason.clone());
    }
    sink(CaptureEvent::Ended(reason));
}

/// Picks the stream configuration and builds the (paused) stream.
fn open(chosen: &Chosen, config: &CaptureConfig, pool: Pool) -> Result<Opened, AudioError> {
    let def = chosen.info.default_config.as_ref();
    let rate = config
        .sample_rate
        .or(def.map(|d| d.sample_rate))
        .ok_or_else(|| AudioError::Unsupported("device has no default rate: set one".into()))?;
    let channels = config
        .channels
        .or(def.map(|d| d.channels))
        .ok_or_else(|| AudioError::Unsupported("device has no default channels: set".into()))?;
    let ranges = supported_ranges(chosen);
    let fits = |f: cpal::SampleFormat| {
        ranges
            .iter()
            .find(|r| r.sample_format() == f && r.channels() == channels && r.contains_rate(rate))
            .cloned()
    };
    let (want, other) = match config.format {
        SampleFormat::I16 => (cpal::SampleFormat::I16, cpal::SampleFormat::F32),
        SampleFormat::F32 => (cpal::SampleFormat::F32, cpal::SampleFormat::I16),
    };
    let (device_format, range) = if let Some(r) = fits(want) {
        (want, Some(r))
    } else if let Some(r) = fits(other) {
        (other, Some(r))
    } else if ranges.is_empty() {
        // The device would not list its configurations: just try.
        (want, None)
    } else {
        let offered: Vec<String> = ranges
            .iter()
            .map(|r| {
                format!(
                    "{} ch {} {}..={} Hz",
                    r.channels(),
                    r.sample_format(),
                    r.min_sample_rate(),
                    r.max_sample_rate()
                )
            })
            .collect();
        return Err(AudioError::Unsupported(format!(
            "{rate} Hz, {channels} channels in i16 or f32 on {}; it offers {offered:?}",
            chosen.info.id
        )));
    };
    let params = StreamParams {
        sample_rate: rate,
        channels,
        format: config.format,
        frames_per_packet: StreamParams::frames_for(rate, config.packet_duration),
    };
    // A fixed callback size only when asked for and within the device's
    // range; else (or if the backend refuses it) the backend's default.
    let fixed = match (
        config.buffer_frames,
        range.as_ref().map(|r| *r.buffer_size()),
    ) {
        (Some(n), Some(cpal::SupportedBufferSize::Range { min, max }))
            if (min..=max).contains(&n) =>
        {
            Some(cpal::BufferSize::Fixed(n))
        }
        (Some(n), None | Some(cpal::SupportedBufferSize::Unknown)) => {
            Some(cpal::BufferSize::Fixed(n))
        }
        _ => None,
    };
    let mut last_err = None;
    for buffer_size in fixed.into_iter().chain([cpal::BufferSize::Default]) {
        let stream_config = cpal::StreamConfig {
            channels,
            sample_rate: rate,
            buffer_size,
        };
        let (mut packetizer, receiver) = packet_channel(params, pool.clone(), config.queue_packets);
        packetizer.set_notify(Some(thread::current()));
        let (err_tx, errors) = mpsc::sync_channel(32);
        let built = match our_format(device_format) {
            Some(SampleFormat::I16) => {
                build::<i16>(&chosen.device, stream_config, packetizer, err_tx)
            }
            _ => build::<f32>(&chosen.device, stream_config, packetizer, err_tx),
        };
        match built {
            Ok(stream) => {
                return Ok(Opened {
                    stream,
                    params,
                    receiver,
                    errors,
                })
            }
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.map_or_else(
        || AudioError::Unsupported("no buffer size accepted".into()),
        AudioError::Backend,
    ))
}

fn build<S: InputSample + cpal::SizedSample>(
    device: &cpal::Device,
    config: cpal::StreamConfig,
    mut packetizer: crate::packetizer::Packetizer,
    errors: SyncSender<cpal::Error>,
) -> Result<cpal::Stream, cpal::Error> {
    let pump = thread::current();
    device.build_input_stream::<S, _, _>(
        config,
        move |data: &[S], info: &cpal::InputCallbackInfo| {
            // The real-time path: timestamps are plain arithmetic, push
            // copies into a pooled buffer and may unpark the pump.
            let ts = info.timestamp().capture.as_nanos() as u64;
            packetizer.push(data, ts);
        },
        move |e: cpal::Error| {
            // Never blocks: a full error queue drops the report (the pump
            // still counts the ones it sees).
            if let Err(TrySendError::Full(_)) = errors.try_send(e) {}
            pump.unpark();
        },
        Some(Duration::from_secs(10)),
    )
}

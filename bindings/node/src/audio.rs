//! Live audio capture into JavaScript (zerofan-audio), and onto MQTT topics.
//!
//! - `listDevices()` runs `zerofan_audio::list_devices` on the libuv pool.
//! - `captureNative(options, onEvent)` creates a threadsafe function over
//!   `onEvent` with a bounded queue, then starts the capture on the libuv
//!   pool (`Capture::start` may block up to 15 s) and resolves with a
//!   [`NativeCapture`]. The sink runs on the capture's own thread: packets
//!   are offered without blocking (a full queue refuses them, counted as
//!   `drops_sink`), errors too, and `Ended` is delivered blocking, after
//!   which the threadsafe function is released.
//! - `NativeCapture::stop` asks the capture to stop and returns; `Ended`
//!   follows. A sound server that stopped answering keeps the capture
//!   thread waiting for it (see `Capture::stop`): past `STOP_TIMEOUT` a
//!   watchdog thread sends `end` itself and releases the function, so
//!   that neither the emitter nor the event loop waits on the server.
//! - Each packet reaches JavaScript as `onEvent('data', buffer, info)`:
//!   with `useExternalBuffer` an external Buffer over the samples in the
//!   packet's pooled memory, whose finalizer gives the buffer back to the
//!   capture's pool (see [`crate::payload::to_buffer`]); else a copy.
//! - `NativeCapture::publish` streams the same packets to a topic with the
//!   Rust client inside a `NativeClient` (`zerofan_audio::publish`).

use crate::client::NativeClient;
use crate::payload::{copy_buffer, to_buffer};
use crate::{arg_err, js_err};
use bytes::Bytes;
use napi::bindgen_prelude::*;
use napi::threadsafe_function::{
    ErrorStrategy, ThreadSafeCallContext, ThreadsafeFunction, ThreadsafeFunctionCallMode,
};
use napi::{Env, JsFunction, JsObject, JsUnknown, Status};
use napi_derive::napi;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use zerofan_audio::publish::{PublishConfig, PublishStats, Publisher};
use zerofan_audio::{
    list_devices, Capture, CaptureConfig, CaptureEvent, CaptureStats, DeviceInfo, DeviceSelector,
    EndReason, PacketInfo, SampleFormat, HEADER_LEN, STOP_TIMEOUT,
};
use zerofan_client::QoS;

/// Events that may wait for the JavaScript thread (bounded; beyond it
/// packets are dropped and counted as sink drops).
const DEFAULT_JS_QUEUE: usize = 256;

/// A device's default input format.
#[napi(object)]
pub struct NativeDefaultConfig {
    pub sample_rate: u32,
    pub channels: u32,
    pub sample_format: String,
}

/// One capture source, as `listDevices()` returns it.
#[napi(object)]
pub struct NativeAudioDevice {
    pub id: String,
    pub host: String,
    pub name: String,
    pub is_default: bool,
    pub is_loopback: bool,
    pub default_config: Option<NativeDefaultConfig>,
}

impl From<DeviceInfo> for NativeAudioDevice {
    fn from(d: DeviceInfo) -> Self {
        NativeAudioDevice {
            id: d.id,
            host: d.host,
            name: d.name,
            is_default: d.is_default,
            is_loopback: d.is_loopback,
            default_config: d.default_config.map(|c| NativeDefaultConfig {
                sample_rate: c.sample_rate,
                channels: u32::from(c.channels),
                sample_format: c.sample_format,
            }),
        }
    }
}

/// `list_devices()` off the JavaScript thread.
pub struct ListDevices;

impl Task for ListDevices {
    type Output = Vec<DeviceInfo>;
    type JsValue = Vec<NativeAudioDevice>;

    fn compute(&mut self) -> Result<Self::Output> {
        Ok(list_devices())
    }

    fn resolve(&mut self, _env: Env, output: Self::Output) -> Result<Self::JsValue> {
        Ok(output.into_iter().map(NativeAudioDevice::from).collect())
    }
}

/// The capture sources of every host, with their default formats.
#[napi(ts_return_type = "Promise<NativeAudioDevice[]>")]
pub fn list_audio_devices() -> AsyncTask<ListDevices> {
    AsyncTask::new(ListDevices)
}

/// Options of `captureNative` (the JS `capture()` options).
#[napi(object)]
pub struct NativeCaptureOptions {
    pub device: Option<String>,
    pub sample_rate: Option<u32>,
    pub channels: Option<u32>,
    /// `'i16'` (default) or `'f32'`.
    pub format: Option<String>,
    /// Packet duration in milliseconds (default 10).
    pub packet_ms: Option<f64>,
    /// Default true.
    pub use_external_buffer: Option<bool>,
    pub queue_packets: Option<u32>,
    pub buffer_frames: Option<u32>,
    /// Events that may wait for the JavaScript thread (default 256).
    pub js_queue: Option<u32>,
}

fn config_from(o: &NativeCaptureOptions) -> Result<CaptureConfig> {
    let mut c = CaptureConfig {
        device: DeviceSelector::from_option(o.device.as_deref()),
        sample_rate: o.sample_rate,
        ..Default::default()
    };
    if let Some(ch) = o.channels {
        c.channels = Some(u16::try_from(ch).map_err(|_| arg_err("channels above 65535"))?);
    }
    if let Some(f) = &o.format {
        c.format = SampleFormat::parse(f)
            .ok_or_else(|| arg_err(format!("format must be 'i16' or 'f32', not {f:?}")))?;
    }
    if let Some(ms) = o.packet_ms {
        if !(ms.is_finite() && ms > 0.0) {
            return Err(arg_err(format!("invalid packetMs {ms}")));
        }
        c.packet_duration = Duration::from_secs_f64(ms / 1000.0);
    }
    if let Some(q) = o.queue_packets {
        c.queue_packets = q as usize;
    }
    c.buffer_frames = o.buffer_frames;
    Ok(c)
}

/// What crosses from the capture thread to the JavaScript thread.
enum JsEvent {
    /// Header and samples (the wire form), over the pooled buffer.
    Packet {
        info: PacketInfo,
        frames: u32,
        wire: Bytes,
    },
    Error {
        kind: String,
        message: String,
        fatal: bool,
    },
    Ended {
        reason: &'static str,
        message: String,
    },
}

type EventFn = ThreadsafeFunction<JsEvent, ErrorStrategy::Fatal>;

/// The `onEvent` arguments for one event: `('data', buffer, info)`,
/// `('error', {code, message, fatal})` or `('end', {reason, message})`.
fn js_args(env: &Env, ev: JsEvent, external: bool) -> Result<Vec<JsUnknown>> {
    match ev {
        JsEvent::Packet {
            info: i,
            frames,
            wire,
        } => {
            let samples = wire.slice(HEADER_LEN.min(wire.len())..);
            let mut info = env.create_object()?;
            info.set_named_property("seq", env.create_int64(i.seq as i64)?)?;
            info.set_named_property("timestampNs", env.create_bigint_from_u64(i.timestamp_ns)?)?;
            info.set_named_property("sampleRate", env.create_uint32(i.sample_rate)?)?;
            info.set_named_property("channels", env.create_uint32(u32::from(i.channels))?)?;
            info.set_named_property("format", env.create_string(i.format.as_str())?)?;
            info.set_named_property("frames", env.create_uint32(frames)?)?;
            let buffer = if external {
                // The samples as a slice of the packet's pooled buffer: no
                // copy; the finalizer drops the `Bytes` and the buffer
                // returns to the capture's pool.
                to_buffer(env, samples, true)?
            } else {
                copy_buffer(env, &samples)?
            };
            Ok(vec![
                env.create_string("data")?.into_unknown(),
                buffer.into_unknown(),
                info.into_unknown(),
            ])
        }
        JsEvent::Error {
            kind,
            message,
            fatal,
        } => {
            let mut e = env.create_object()?;
            e.set_named_property("code", env.create_string(&kind)?)?;
            e.set_named_property("message", env.create_string(&message)?)?;
            e.set_named_property("fatal", env.get_boolean(fatal)?)?;
            Ok(vec![
                env.create_string("error")?.into_unknown(),
                e.into_unknown(),
            ])
        }
        JsEvent::Ended { reason, message } => {
            let mut e = env.create_object()?;
            e.set_named_property("reason", env.create_string(reason)?)?;
            e.set_named_property("message", env.create_string(&message)?)?;
            Ok(vec![
                env.create_string("end")?.into_unknown(),
                e.into_unknown(),
            ])
        }
    }
}

/// What the sink shares with the JavaScript side.
#[derive(Default)]
struct Shared {
    /// The events' way to JavaScript: taken by whoever sends `end`, the
    /// sink or the stop watchdog, so that `end` comes once and nothing
    /// after it.
    events: Mutex<Option<EventFn>>,
    /// Notified when `events` is taken (the stop watchdog waits on it).
    ended: Condvar,
    publisher: Mutex<Option<Publisher>>,
    /// The counters of the last publisher, when it was replaced or closed.
    closed_stats: Mutex<Option<PublishStats>>,
}

impl Shared {
    /// Sends `end` unless it was sent, then releases the function.
    fn end(&self, reason: &'static str, message: String) {
        let f = self.events.lock().ok().and_then(|mut g| g.take());
        self.ended.notify_all();
        if let Some(f) = f {
            let _ = f.call(
                JsEvent::Ended { reason, message },
                ThreadsafeFunctionCallMode::Blocking,
            );
            self.close_publisher();
        }
    }

    /// Whether `end` was sent (or nothing will send it).
    fn end_sent(&self) -> bool {
        self.events.lock().map_or(true, |g| g.is_none())
    }

    /// Drops the current publisher (its task publishes what is queued and
    /// ends), keeping its counters.
    fn close_publisher(&self) {
        let old = self.publisher.lock().ok().and_then(|mut g| g.take());
        if let Some(old) = old {
            if let Ok(mut s) = self.closed_stats.lock() {
                *s = Some(old.stats());
            }
        }
    }
}

/// The sink run on the capture thread; `shared.events` holds the function.
fn make_sink(
    shared: Arc<Shared>,
    deliver: Arc<AtomicBool>,
) -> impl FnMut(CaptureEvent) -> bool + Send + 'static {
    move |event| {
        if let CaptureEvent::Ended(r) = event {
            let (reason, message) = match r {
                EndReason::Stopped => ("stopped", String::new()),
                EndReason::DeviceLost(m) => ("device-lost", m),
            };
            // Nothing follows: release the function (and let the event
            // loop end) now rather than when the thread exits.
            shared.end(reason, message);
            return true;
        }
        let Ok(events) = shared.events.lock() else {
            return false;
        };
        let Some(f) = events.as_ref() else {
            return false;
        };
        match event {
            CaptureEvent::Packet(p) => {
                let (info, frames) = (*p.info(), p.frames());
                let wire = p.into_wire_bytes();
                let publisher = shared.publisher.lock().ok().and_then(|g| g.clone());
                let pub_ok = publisher.map_or(true, |pb| pb.offer(wire.clone()));
                let js_ok = !deliver.load(Ordering::Relaxed)
                    || f.call(
                        JsEvent::Packet { info, frames, wire },
                        ThreadsafeFunctionCallMode::NonBlocking,
                    ) == Status::Ok;
                pub_ok && js_ok
            }
            CaptureEvent::Error(e) => {
                let _ = f.call(
                    JsEvent::Error {
                        kind: e.kind,
                        message: e.message,
                        fatal: e.fatal,
                    },
                    ThreadsafeFunctionCallMode::NonBlocking,
                );
                true
            }
            CaptureEvent::Ended(_) => true,
        }
    }
}

/// `Capture::start` off the JavaScript thread.
pub struct StartCapture {
    start: Option<(CaptureConfig, EventFn)>,
    shared: Arc<Shared>,
    deliver: Arc<AtomicBool>,
}

impl Task for StartCapture {
    type Output = Capture;
    type JsValue = NativeCapture;

    fn compute(&mut self) -> Result<Self::Output> {
        let (config, tsfn) = self
            .start
            .take()
            .ok_or_else(|| js_err("capture already started"))?;
        if let Ok(mut events) = self.shared.events.lock() {
            *events = Some(tsfn);
        }
        let started = Capture::start(config, make_sink(self.shared.clone(), self.deliver.clone()))
            .map_err(js_err);
        if started.is_err() {
            // Release the function: nothing will call it.
            if let Ok(mut events) = self.shared.events.lock() {
                events.take();
            }
        }
        started
    }

    fn resolve(&mut self, _env: Env, capture: Self::Output) -> Result<Self::JsValue> {
        let params = capture.params();
        let device_id = capture.device().id.clone();
        Ok(NativeCapture {
            capture: Mutex::new(Some(capture)),
            shared: self.shared.clone(),
            deliver: self.deliver.clone(),
            final_stats: Mutex::new(None),
            frames_per_packet: params.frames_per_packet,
            sample_rate: params.sample_rate,
            channels: u32::from(params.channels),
            format: params.format.as_str().to_string(),
            device_id,
        })
    }
}

/// Starts a capture; resolves once the device runs. `onEvent(kind, ...)`
/// receives `('data', buffer, info)`, `('error', {code, message, fatal})`
/// and finally `('end', {reason, message})`.
#[napi(ts_return_type = "Promise<NativeCapture>")]
pub fn capture_native(
    options: NativeCaptureOptions,
    #[napi(ts_arg_type = "(kind: string, a: any, b?: any) => void")] on_event: JsFunction,
) -> Result<AsyncTask<StartCapture>> {
    let config = config_from(&options)?;
    let external = options.use_external_buffer.unwrap_or(true);
    let queue = options
        .js_queue
        .map_or(DEFAULT_JS_QUEUE, |n| n.max(1) as usize);
    let tsfn: EventFn = on_event
        .create_threadsafe_function(queue, move |cx: ThreadSafeCallContext<JsEvent>| {
            js_args(&cx.env, cx.value, external)
        })?;
    Ok(AsyncTask::new(StartCapture {
        start: Some((config, tsfn)),
        shared: Arc::new(Shared::default()),
        deliver: Arc::new(AtomicBool::new(true)),
    }))
}

/// Publish counters, camelCased.
#[napi(object)]
pub struct NativePublishStats {
    pub offered: f64,
    pub dropped: f64,
    pub published: f64,
    pub acked: f64,
    pub failed: f64,
}

impl From<PublishStats> for NativePublishStats {
    fn from(s: PublishStats) -> Self {
        NativePublishStats {
            offered: s.offered as f64,
            dropped: s.dropped as f64,
            published: s.published as f64,
            acked: s.acked as f64,
            failed: s.failed as f64,
        }
    }
}

/// The capture's pool.
#[napi(object)]
pub struct NativeCapturePoolStats {
    pub packets: f64,
    pub drops: f64,
    pub hits: f64,
    pub misses: f64,
    pub hit_rate: f64,
    pub outstanding_bytes: f64,
}

/// `Capture::stats()`, camelCased.
#[napi(object)]
pub struct NativeCaptureStats {
    pub packets: f64,
    pub captured: f64,
    pub drops: f64,
    pub drops_queue_full: f64,
    pub drops_no_buffer: f64,
    pub drops_sink: f64,
    pub frames: f64,
    pub callbacks: f64,
    pub max_callback_frames: f64,
    pub errors: f64,
    pub xruns: f64,
    pub pool: NativeCapturePoolStats,
    pub publish: Option<NativePublishStats>,
}

/// A running capture (the JavaScript emitter holds one).
#[napi]
pub struct NativeCapture {
    capture: Mutex<Option<Capture>>,
    shared: Arc<Shared>,
    deliver: Arc<AtomicBool>,
    /// Counters of a released capture.
    final_stats: Mutex<Option<CaptureStats>>,
    frames_per_packet: u32,
    sample_rate: u32,
    channels: u32,
    format: String,
    device_id: String,
}

#[napi]
impl NativeCapture {
    /// Asks the capture to stop and returns at once; `end` follows, from
    /// the capture thread, or from a watchdog past `STOP_TIMEOUT` when
    /// the backend keeps that thread waiting (a sound server that stopped
    /// answering).
    #[napi]
    pub fn stop(&self) {
        let Ok(g) = self.capture.lock() else {
            return;
        };
        let Some(c) = g.as_ref() else {
            return;
        };
        c.request_stop();
        let shared = self.shared.clone();
        let watchdog = std::thread::Builder::new()
            .name("zerofan-audio-stop".into())
            .spawn(move || {
                if let Ok(events) = shared.events.lock() {
                    let waited = shared
                        .ended
                        .wait_timeout_while(events, STOP_TIMEOUT, |e| e.is_some());
                    if waited.map_or(true, |(e, _)| e.is_none()) {
                        return;
                    }
                }
                shared.end(
                    "stopped",
                    format!(
                        "the audio backend did not let go of the stream within {STOP_TIMEOUT:?} \
                         (a sound server not answering): its thread ends on its own"
                    ),
                );
            });
        // No thread for the watchdog: `end` then waits for the backend.
        drop(watchdog);
    }

    /// Drops the capture once it has ended (its thread has exited, so this
    /// does not block), keeping its final counters for `stats`. One whose
    /// `end` came from the stop watchdog (sent, the capture not ended) is
    /// dropped on a thread of its own: its capture thread still waits on
    /// the backend.
    #[napi]
    pub fn release(&self) {
        let end_sent = self.shared.end_sent();
        if let Ok(mut g) = self.capture.lock() {
            if end_sent || g.as_ref().is_some_and(Capture::is_ended) {
                if let Some(mut c) = g.take() {
                    if let Ok(mut f) = self.final_stats.lock() {
                        *f = Some(c.stats());
                    }
                    if !c.is_ended() {
                        let _ = std::thread::Builder::new()
                            .name("zerofan-audio-drop".into())
                            .spawn(move || c.stop());
                    } else {
                        c.stop();
                    }
                }
            }
        }
    }

    /// Whether packets are sent to JavaScript (`data` events). Off when
    /// only publishing.
    #[napi]
    pub fn set_deliver(&self, on: bool) {
        self.deliver.store(on, Ordering::Relaxed);
    }

    /// Streams every following packet (32-byte header + samples) to
    /// `topic` with `client`'s Rust client.
    #[napi]
    pub fn publish(&self, client: &NativeClient, topic: String, qos: Option<u32>) -> Result<()> {
        let qos = u8::try_from(qos.unwrap_or(0))
            .ok()
            .and_then(QoS::from_u8)
            .ok_or_else(|| arg_err("invalid QoS"))?;
        let config = PublishConfig {
            qos,
            ..Default::default()
        };
        let handle =
            napi::bindgen_prelude::within_runtime_if_available(tokio::runtime::Handle::current);
        let (publisher, _task) = Publisher::spawn_on(&handle, client.rust_client(), topic, config);
        let mut g = self
            .shared
            .publisher
            .lock()
            .map_err(|_| js_err("publisher lock poisoned"))?;
        if let Some(old) = g.replace(publisher) {
            if let Ok(mut s) = self.shared.closed_stats.lock() {
                *s = Some(old.stats());
            }
        }
        Ok(())
    }

    /// Packet, drop, pool and (when publishing) publish counters.
    #[napi]
    pub fn stats(&self) -> Result<NativeCaptureStats> {
        let g = self
            .capture
            .lock()
            .map_err(|_| js_err("capture lock poisoned"))?;
        let s = match g.as_ref() {
            Some(c) => c.stats(),
            None => self
                .final_stats
                .lock()
                .ok()
                .and_then(|f| *f)
                .unwrap_or_default(),
        };
        let publish = self
            .shared
            .publisher
            .lock()
            .ok()
            .and_then(|p| p.as_ref().map(Publisher::stats))
            .or_else(|| self.shared.closed_stats.lock().ok().and_then(|s| *s))
            .map(NativePublishStats::from);
        Ok(NativeCaptureStats {
            packets: s.packets as f64,
            captured: s.captured as f64,
            drops: s.drops as f64,
            drops_queue_full: s.drops_queue_full as f64,
            drops_no_buffer: s.drops_no_buffer as f64,
            drops_sink: s.drops_sink as f64,
            frames: s.frames as f64,
            callbacks: s.callbacks as f64,
            max_callback_frames: s.max_callback_frames as f64,
            errors: s.errors as f64,
            xruns: s.xruns as f64,
            pool: NativeCapturePoolStats {
                packets: s.packets as f64,
                drops: s.drops as f64,
                hits: s.pool_hits as f64,
                misses: s.pool_misses as f64,
                hit_rate: s.pool_hit_rate,
                outstanding_bytes: s.bytes_outstanding as f64,
            },
            publish,
        })
    }

    /// The parameters the capture runs with.
    #[napi(getter)]
    pub fn params(&self, env: Env) -> Result<JsObject> {
        let mut o = env.create_object()?;
        o.set_named_property("sampleRate", self.sample_rate)?;
        o.set_named_property("channels", self.channels)?;
        o.set_named_property("format", self.format.as_str())?;
        o.set_named_property("framesPerPacket", self.frames_per_packet)?;
        o.set_named_property("device", self.device_id.as_str())?;
        Ok(o)
    }
}

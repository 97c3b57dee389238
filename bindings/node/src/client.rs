//! `NativeClient`: the zerofan Rust client driven from JavaScript.
//!
//! Messages travel to JavaScript by a pull: `takeBatch(max)` returns up to
//! `max` messages that are queued now, synchronously (`undefined` if none
//! is), and `nextBatch(max)` returns a Promise resolved with up to `max`
//! messages as soon as at least one is there (`null` once the client is
//! closed). The JavaScript wrapper takes batches with `takeBatch` while
//! there are any (yielding to its event loop between them), waits on
//! `nextBatch` when the queue is empty, and emits `message` for each
//! entry. Why a pull and not a ThreadsafeFunction per message:
//!
//! - a busy stream is read from the client's queue on the JavaScript
//!   thread, one lock per batch, with no trip through the tokio runtime
//!   and no wakeup of either thread; a quiet stream still delivers each
//!   message on its own at once, one Promise resolution per batch;
//! - backpressure is built in: while JavaScript is busy no batch is asked
//!   for, the bounded incoming queue fills, the client stops reading the
//!   socket and the broker's flow control takes over. A ThreadsafeFunction
//!   queue would either grow without bound or block a tokio worker.
//!
//! A batch is `[topics, meta, payloads, props]`, built with as few napi
//! calls per message as possible:
//! - `topics`: the distinct topic strings of the batch;
//! - `meta`: a Buffer of four little-endian u32 per message: `flags |
//!   topicIndex << 4` (flags = QoS | retain << 2 | dup << 3), offset and
//!   length of the payload, and the index of the ArrayBuffer it is in
//!   (`0xFFFFFFFF` for an empty payload);
//! - `payloads`: with external buffers (the default), an array with one
//!   external `ArrayBuffer` per pooled read buffer the batch's payloads
//!   were cut from, over the part of it from the batch's first to its last
//!   payload (see [`crate::payload::to_arraybuffer`]); JavaScript makes
//!   each payload a `Buffer` view into it. No byte is copied and there is
//!   one napi call and one finalizer per read buffer, not per message.
//!   With copies (`useExternalBuffer: false`), one Buffer holding every
//!   payload of the batch back to back, which JavaScript slices with
//!   `subarray`;
//! - `props`: `undefined`, or `[index, properties, ...]` for the messages
//!   that carry MQTT 5 properties.

use crate::payload::{alloc_buffer, to_arraybuffer, to_buffer};
use crate::pool::{self, PoolStats};
use crate::{arg_err, js_err, tls};
use bytes::Bytes;
use napi::bindgen_prelude::{Buffer, Either};
use napi::{Env, JsObject, JsUndefined, JsUnknown, NapiRaw, NapiValue, Result};
use napi_derive::napi;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Mutex};
use zerofan_client::{
    Backoff, Client, ClientError, ClientOptions, ConnState, Incoming, LastWill, Message,
    Properties, Protocol, PublishOptions, QoS, RetainHandling, Subscription, Transport,
};
use zerofan_codec::MqttStr;
use zerofan_pool::Pool;

/// Most messages in one batch when the caller asks for more.
const MAX_BATCH: u32 = 4096;

/// Will message, MQTT.js style.
#[napi(object)]
pub struct NativeWill {
    pub topic: String,
    pub payload: Option<Either<String, Buffer>>,
    pub qos: Option<u32>,
    pub retain: Option<bool>,
}

/// Everything `connectNative` needs; the JavaScript layer fills it from a
/// URL and MQTT.js options.
#[napi(object)]
pub struct NativeConnectOptions {
    /// "mqtt", "mqtts", "ws" or "wss".
    pub protocol: String,
    pub host: String,
    pub port: u32,
    /// WebSocket path (default "/mqtt").
    pub path: Option<String>,
    pub client_id: Option<String>,
    /// 4 (3.1.1) or 5 (default).
    pub protocol_version: Option<u32>,
    pub clean: Option<bool>,
    /// Seconds; 0 turns keep alive off.
    pub keepalive: Option<u32>,
    pub username: Option<String>,
    pub password: Option<Either<String, Buffer>>,
    pub session_expiry_interval: Option<u32>,
    pub will: Option<NativeWill>,
    /// Milliseconds between reconnect attempts; 0 turns reconnecting off.
    pub reconnect_period: Option<u32>,
    /// Milliseconds to wait for CONNACK.
    pub connect_timeout: Option<u32>,
    pub receive_maximum: Option<u32>,
    pub maximum_packet_size: Option<u32>,
    /// Messages the native incoming queue holds before reading pauses.
    pub incoming_capacity: Option<u32>,
    pub max_inflight: Option<u32>,
    pub resubscribe: Option<bool>,
    /// PEM text of trusted CAs (mqtts/wss).
    pub ca: Option<Vec<String>>,
    pub servername: Option<String>,
    pub reject_unauthorized: Option<bool>,
    /// Payloads as external Buffers (default true) or copies.
    pub use_external_buffer: Option<bool>,
    /// Bytes: gives this client a pool of its own with this retention cap.
    pub pool_size: Option<f64>,
}

/// One subscription request.
#[napi(object)]
pub struct NativeSubscription {
    pub topic: String,
    pub qos: u32,
    pub nl: Option<bool>,
    pub rap: Option<bool>,
    pub rh: Option<u32>,
}

/// MQTT 5 publish properties, MQTT.js names.
#[napi(object)]
pub struct NativePublishProperties {
    pub payload_format_indicator: Option<bool>,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Buffer>,
    pub user_properties: Option<Vec<Vec<String>>>,
}

/// What the broker answered to a publish.
#[napi(object)]
pub struct NativePublishAck {
    pub message_id: u32,
    pub reason_code: u32,
}

/// A connection state change.
#[napi(object)]
pub struct NativeState {
    /// "connecting", "connected", "reconnecting" or "closed".
    pub state: String,
    /// Why the connection was lost (reconnecting).
    pub error: Option<String>,
    pub session_present: Option<bool>,
    pub assigned_client_id: Option<String>,
    /// Connections made so far, so the caller sees connects it missed.
    pub connects: f64,
    /// Connections lost so far.
    pub losses: f64,
}

/// Client counters.
#[napi(object)]
pub struct NativeClientStats {
    pub connects: f64,
    pub connection_losses: f64,
    pub sessions_resumed: f64,
    pub publishes_resent: f64,
    pub resubscribed: f64,
    pub publishes_sent: f64,
    pub messages_received: f64,
    pub bytes_in: f64,
    pub bytes_out: f64,
}

/// A connected client (the JavaScript wrapper holds one).
#[napi]
pub struct NativeClient {
    client: Client,
    ops: mpsc::UnboundedSender<Op>,
    incoming: Arc<Mutex<Incoming>>,
    state: Arc<Mutex<watch::Receiver<ConnState>>>,
    external: bool,
    pool: Pool,
    client_id: String,
}

fn qos_of(n: u32) -> Result<QoS> {
    u8::try_from(n)
        .ok()
        .and_then(QoS::from_u8)
        .ok_or_else(|| arg_err(format!("invalid QoS {n}")))
}

fn bytes_of(v: Either<String, Buffer>) -> Bytes {
    match v {
        Either::A(s) => Bytes::from(s),
        Either::B(b) => Bytes::copy_from_slice(&b),
    }
}

fn mqtt_str(s: String) -> Result<MqttStr> {
    MqttStr::try_from(s).map_err(arg_err)
}

fn options_from(o: NativeConnectOptions) -> Result<(ClientOptions, bool, Pool)> {
    let addr = format!("{}:{}", o.host, o.port);
    let reject = o.reject_unauthorized.unwrap_or(true);
    let server_name = o.servername.clone().unwrap_or_else(|| o.host.clone());
    let path = o.path.clone().unwrap_or_else(|| "/mqtt".to_string());
    let transport = match o.protocol.as_str() {
        "mqtt" | "tcp" => Transport::tcp(addr),
        "mqtts" | "ssl" | "tls" => {
            Transport::tls(addr, tls::settings(&server_name, o.ca.as_deref(), reject)?)
        }
        "ws" => Transport::websocket(addr, path),
        "wss" => Transport::websocket_tls(
            addr,
            path,
            tls::settings(&server_name, o.ca.as_deref(), reject)?,
        ),
        other => return Err(arg_err(format!("unsupported protocol {other:?}"))),
    };
    let mut c = ClientOptions::with_transport(transport);
    c.protocol = match o.protocol_version.unwrap_or(5) {
        5 => Protocol::V5,
        4 => Protocol::V311,
        3 => Protocol::V31,
        v => return Err(arg_err(format!("unsupported protocolVersion {v}"))),
    };
    if let Some(id) = o.client_id {
        c.client_id = id;
    }
    c.clean_start = o.clean.unwrap_or(true);
    if let Some(k) = o.keepalive {
        c.keep_alive = u16::try_from(k).map_err(|_| arg_err("keepalive above 65535"))?;
    }
    c.username = o.username;
    c.password = o.password.map(bytes_of);
    if let Some(s) = o.session_expiry_interval {
        c.session_expiry = s;
    }
    if let Some(w) = o.will {
        c.will = Some(LastWill::new(
            w.topic,
            w.payload.map(bytes_of).unwrap_or_default(),
            qos_of(w.qos.unwrap_or(0))?,
            w.retain.unwrap_or(false),
        ));
    }
    let period = o.reconnect_period.unwrap_or(1000);
    c.reconnect = period > 0;
    let p = Duration::from_millis(u64::from(period.max(1)));
    c.backoff = Backoff {
        initial: p,
        max: p,
        multiplier: 1.0,
    };
    if let Some(t) = o.connect_timeout {
        c.connect_timeout = Duration::from_millis(u64::from(t.max(1)));
    }
    if let Some(n) = o.receive_maximum {
        c.receive_maximum = Some(u16::try_from(n).unwrap_or(u16::MAX));
    }
    c.maximum_packet_size = o.maximum_packet_size;
    if let Some(n) = o.incoming_capacity {
        c.incoming_capacity = n.max(1) as usize;
    }
    if let Some(n) = o.max_inflight {
        c.max_inflight = u16::try_from(n).unwrap_or(u16::MAX).max(1);
    }
    if let Some(r) = o.resubscribe {
        c.resubscribe = r;
    }
    let pool = match o.pool_size {
        Some(bytes) => pool::dedicated(bytes.max(0.0) as usize),
        None => pool::shared().clone(),
    };
    c.pool = Some(pool.clone());
    Ok((c, o.use_external_buffer.unwrap_or(true), pool))
}

/// Connect; resolves with a `NativeClient` once the broker accepted the
/// connection (CONNACK), rejects if the first attempt fails.
#[napi(ts_return_type = "Promise<NativeClient>")]
pub fn connect_native(env: Env, options: NativeConnectOptions) -> Result<JsObject> {
    let (opts, external, pool) = options_from(options)?;
    env.execute_tokio_future(
        async move {
            let (client, incoming) = Client::connect(opts).await.map_err(js_err)?;
            let client_id = match client.state() {
                ConnState::Connected(info) => info.client_id.clone(),
                _ => String::new(),
            };
            let (ops, rx) = mpsc::unbounded_channel();
            tokio::spawn(drive(client.clone(), rx));
            Ok((client, incoming, client_id, ops))
        },
        move |_env, (client, incoming, client_id, ops)| {
            let state = client.state_watch();
            Ok(NativeClient {
                client,
                ops,
                incoming: Arc::new(Mutex::new(incoming)),
                state: Arc::new(Mutex::new(state)),
                external,
                pool,
                client_id,
            })
        },
    )
}

type Done<T> = oneshot::Sender<std::result::Result<T, String>>;

/// An operation from JavaScript, queued in call order.
enum Op {
    Publish {
        topic: String,
        qos: QoS,
        /// Boxed: MQTT 5 properties make it large, and most publishes
        /// have none.
        opts: Box<PublishOptions>,
        payload: Bytes,
        done: Done<NativePublishAck>,
    },
    Subscribe {
        list: Vec<Subscription>,
        done: Done<Vec<u32>>,
    },
    Unsubscribe {
        topics: Vec<String>,
        done: Done<Vec<u32>>,
    },
    End {
        done: Done<()>,
    },
}

/// Carries out the operations one after the other, so that they reach the
/// broker in the order JavaScript made them (a publish after a subscribe
/// goes out after the SUBACK; publishes keep their order). A publish only
/// waits here until it is in the client's outgoing queue; its
/// acknowledgement is awaited on a task of its own.
async fn drive(client: Client, mut rx: mpsc::UnboundedReceiver<Op>) {
    while let Some(op) = rx.recv().await {
        match op {
            Op::Publish {
                topic,
                qos,
                opts,
                payload,
                done,
            } => {
                match client.publish_ext(&topic, qos, &opts, payload).await {
                    Ok(delivery) => {
                        tokio::spawn(async move {
                            let r = delivery.await.map_err(|e| e.to_string()).map(|ack| {
                                NativePublishAck {
                                    message_id: u32::from(ack.packet_id),
                                    reason_code: u32::from(ack.reason.0),
                                }
                            });
                            let _ = done.send(r);
                        });
                    }
                    Err(e) => {
                        let _ = done.send(Err(e.to_string()));
                    }
                }
            }
            Op::Subscribe { list, done } => {
                let r = client
                    .subscribe_many(list, Properties::default())
                    .await
                    .map(|ack| ack.reasons.iter().map(|r| u32::from(r.0)).collect())
                    .map_err(|e| e.to_string());
                let _ = done.send(r);
            }
            Op::Unsubscribe { topics, done } => {
                let r = client
                    .unsubscribe_many(topics, Properties::default())
                    .await
                    .map(|ack| ack.reasons.iter().map(|r| u32::from(r.0)).collect())
                    .map_err(|e| e.to_string());
                let _ = done.send(r);
            }
            Op::End { done } => {
                let r = match client.disconnect().await {
                    Ok(()) | Err(ClientError::Closed) => Ok(()),
                    Err(e) => Err(e.to_string()),
                };
                let _ = done.send(r);
            }
        }
    }
}

/// Queue `op` and return a Promise of its outcome.
fn queued<T, F>(env: &Env, ops: &mpsc::UnboundedSender<Op>, make: F) -> Result<JsObject>
where
    T: Send + napi::bindgen_prelude::ToNapiValue + 'static,
    F: FnOnce(Done<T>) -> Op,
{
    let (done, rx) = oneshot::channel();
    let sent = ops.send(make(done)).is_ok();
    env.execute_tokio_future(
        async move {
            if !sent {
                return Err(js_err(ClientError::Closed));
            }
            match rx.await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(js_err(e)),
                Err(_) => Err(js_err(ClientError::Closed)),
            }
        },
        |_env, v| Ok(v),
    )
}

fn state_of(s: &ConnState, client: &Client) -> NativeState {
    let st = client.stats();
    let mut out = NativeState {
        state: String::new(),
        error: None,
        session_present: None,
        assigned_client_id: None,
        connects: st.connects as f64,
        losses: st.connection_losses as f64,
    };
    match s {
        ConnState::Connecting => out.state = "connecting".into(),
        ConnState::Reconnecting(e) => {
            out.state = "reconnecting".into();
            out.error = Some(e.clone());
        }
        ConnState::Connected(info) => {
            out.state = "connected".into();
            out.session_present = Some(info.session_present);
            out.assigned_client_id = Some(info.client_id.clone());
        }
        ConnState::Closed => out.state = "closed".into(),
    }
    out
}

/// The part of one pooled read buffer that holds a batch's payloads from
/// that buffer: it becomes one external `ArrayBuffer`.
struct Span {
    /// The whole read buffer (identity: address and length).
    buf: Bytes,
    /// First payload byte of the batch in `buf`.
    start: usize,
    /// One past the last payload byte of the batch in `buf`.
    end: usize,
}

/// `meta` word 3 of a message with an empty payload: no ArrayBuffer.
const NO_BUFFER: u32 = u32::MAX;

/// Which span each payload is in, and its offset in that span's
/// `ArrayBuffer`: `(span index or NO_BUFFER, offset)` per message.
fn plan_spans(msgs: &[Message]) -> (Vec<Span>, Vec<(u32, usize)>) {
    let mut spans: Vec<Span> = Vec::new();
    // Absolute offsets in the read buffer first; made relative to the span
    // start once every span is known.
    let mut at: Vec<(u32, usize)> = Vec::with_capacity(msgs.len());
    for m in msgs {
        if m.payload.is_empty() {
            at.push((NO_BUFFER, 0));
            continue;
        }
        let (buf, off) = match m.read_buffer() {
            Some((buf, off)) => (buf, off),
            // Not cut from a read buffer (not the case for a message from
            // the client's reader): the payload is its own span.
            None => (&m.payload, 0),
        };
        let end = off + m.payload.len();
        // Messages of one read arrive together: look from the last span.
        let same = spans
            .iter()
            .rposition(|s| s.buf.as_ptr() == buf.as_ptr() && s.buf.len() == buf.len());
        let idx = match same {
            Some(i) => {
                let s = &mut spans[i];
                s.start = s.start.min(off);
                s.end = s.end.max(end);
                i
            }
            None => {
                spans.push(Span {
                    buf: buf.clone(),
                    start: off,
                    end,
                });
                spans.len() - 1
            }
        };
        at.push((idx as u32, off));
    }
    for a in &mut at {
        if let Some(s) = spans.get(a.0 as usize) {
            a.1 -= s.start;
        }
    }
    (spans, at)
}

/// Build the JavaScript value for a batch (see the module docs):
/// `[topics, meta, payloads, props]`.
fn batch_to_js(env: &Env, msgs: Vec<Message>, external: bool) -> Result<JsObject> {
    let n = msgs.len();
    // Distinct topics, most recent first in the search: a batch usually
    // carries one or a few topics.
    let mut topic_keys: Vec<Bytes> = Vec::new();
    let mut topics = env.create_array_with_length(1)?;
    // Written straight into the Buffer JavaScript gets: 16 bytes a message.
    let (meta_buf, meta) = alloc_buffer(env, n * 16)?;
    let mut meta = meta.chunks_exact_mut(16);
    let mut props: Option<JsObject> = None;
    let mut props_len = 0u32;
    let (spans, at) = if external {
        plan_spans(&msgs)
    } else {
        (Vec::new(), Vec::new())
    };
    let copy_total: usize = if external {
        0
    } else {
        msgs.iter().map(|m| m.payload.len()).sum()
    };
    let mut copy_buf = if external {
        None
    } else {
        Some(alloc_buffer(env, copy_total)?)
    };
    let mut offset = 0usize;
    for (i, m) in msgs.into_iter().enumerate() {
        let key = m.topic.as_bytes();
        let recent = topic_keys.len().saturating_sub(8);
        let idx = match topic_keys[recent..].iter().rposition(|k| k == key) {
            Some(j) => recent + j,
            None => {
                topics.set_element(topic_keys.len() as u32, env.create_string(m.topic())?)?;
                topic_keys.push(key.clone());
                topic_keys.len() - 1
            }
        };
        let flags = (m.qos as u32) | (u32::from(m.retain) << 2) | (u32::from(m.dup) << 3);
        let w0 = flags | ((idx as u32) << 4);
        let (span, off) = match (at.get(i), &mut copy_buf) {
            (Some(&(span, off)), _) => (span, off),
            (None, Some((_, data))) => {
                let len = m.payload.len();
                data[offset..offset + len].copy_from_slice(&m.payload);
                offset += len;
                (0, offset - len)
            }
            (None, None) => (NO_BUFFER, 0),
        };
        if let Some(slot) = meta.next() {
            for (dst, w) in
                slot.chunks_exact_mut(4)
                    .zip([w0, off as u32, m.payload.len() as u32, span])
            {
                dst.copy_from_slice(&w.to_le_bytes());
            }
        }
        if !m.properties.is_empty() {
            let arr = match &mut props {
                Some(a) => a,
                None => props.insert(env.create_array_with_length(2)?),
            };
            arr.set_element(props_len, env.create_uint32(i as u32)?)?;
            arr.set_element(
                props_len + 1,
                properties_to_js(env, &m.properties, external)?,
            )?;
            props_len += 2;
        }
    }
    drop(topic_keys);
    let mut out = env.create_array_with_length(4)?;
    out.set_element(0, topics)?;
    out.set_element(1, meta_buf)?;
    match copy_buf {
        Some((buf, _)) => out.set_element(2, buf)?,
        None => {
            // Every Rust value that points into the spans (the messages,
            // the topic keys) is gone by now: see `to_arraybuffer`.
            let mut arr = env.create_array_with_length(spans.len())?;
            for (i, s) in spans.into_iter().enumerate() {
                arr.set_element(i as u32, to_arraybuffer(env, s.buf.slice(s.start..s.end))?)?;
            }
            out.set_element(2, arr)?
        }
    }
    match props {
        Some(p) => out.set_element(3, p)?,
        None => out.set_element(3, env.get_undefined()?)?,
    }
    Ok(out)
}

/// MQTT 5 PUBLISH properties as MQTT.js names them.
fn properties_to_js(env: &Env, p: &Properties, external: bool) -> Result<JsObject> {
    let mut o = env.create_object()?;
    if let Some(v) = p.payload_format_indicator {
        o.set_named_property("payloadFormatIndicator", env.get_boolean(v == 1)?)?;
    }
    if let Some(v) = p.message_expiry_interval {
        o.set_named_property("messageExpiryInterval", env.create_uint32(v)?)?;
    }
    if let Some(v) = &p.content_type {
        o.set_named_property("contentType", env.create_string(v.as_str())?)?;
    }
    if let Some(v) = &p.response_topic {
        o.set_named_property("responseTopic", env.create_string(v.as_str())?)?;
    }
    if let Some(v) = &p.correlation_data {
        o.set_named_property("correlationData", to_buffer(env, v.clone(), external)?)?;
    }
    if !p.subscription_identifiers.is_empty() {
        let mut ids = env.create_array_with_length(p.subscription_identifiers.len())?;
        for (i, id) in p.subscription_identifiers.iter().enumerate() {
            ids.set_element(i as u32, env.create_uint32(*id)?)?;
        }
        // MQTT.js gives a number for one identifier, an array for several.
        if p.subscription_identifiers.len() == 1 {
            o.set_named_property(
                "subscriptionIdentifier",
                env.create_uint32(p.subscription_identifiers[0])?,
            )?;
        } else {
            o.set_named_property("subscriptionIdentifier", ids)?;
        }
    }
    if !p.user_properties.is_empty() {
        // MQTT.js: { key: value } or { key: [values...] } for repeated keys.
        let mut up = env.create_object()?;
        for (k, v) in &p.user_properties {
            let key = k.as_str();
            if up.has_named_property(key)? {
                let prev: JsUnknown = up.get_named_property(key)?;
                let arr = if prev.is_array()? {
                    // SAFETY: `is_array` just said `prev` is an array, and an
                    // array is an object.
                    unsafe { JsObject::from_raw_unchecked(env.raw(), prev.raw()) }
                } else {
                    let mut a = env.create_array_with_length(1)?;
                    a.set_element(0, prev)?;
                    a
                };
                let mut arr = arr;
                let n = arr.get_array_length()?;
                arr.set_element(n, env.create_string(v.as_str())?)?;
                up.set_named_property(key, arr)?;
            } else {
                up.set_named_property(key, env.create_string(v.as_str())?)?;
            }
        }
        o.set_named_property("userProperties", up)?;
    }
    if let Some(v) = p.topic_alias {
        o.set_named_property("topicAlias", env.create_uint32(u32::from(v))?)?;
    }
    Ok(o)
}

fn publish_properties(p: NativePublishProperties) -> Result<Properties> {
    let mut props = Properties {
        payload_format_indicator: p.payload_format_indicator.map(u8::from),
        message_expiry_interval: p.message_expiry_interval,
        content_type: p.content_type.map(mqtt_str).transpose()?,
        response_topic: p.response_topic.map(mqtt_str).transpose()?,
        correlation_data: p.correlation_data.map(|b| Bytes::copy_from_slice(&b)),
        ..Properties::default()
    };
    for kv in p.user_properties.unwrap_or_default() {
        let mut it = kv.into_iter();
        let (Some(k), Some(v)) = (it.next(), it.next()) else {
            return Err(arg_err("userProperties: want [key, value] pairs"));
        };
        props.user_properties.push((mqtt_str(k)?, mqtt_str(v)?));
    }
    Ok(props)
}

#[napi]
impl NativeClient {
    /// Up to `max` waiting messages (at least one); `null` once closed.
    #[napi(ts_return_type = "Promise<Array<any> | null>")]
    pub fn next_batch(&self, env: Env, max: u32) -> Result<JsObject> {
        let incoming = self.incoming.clone();
        let max = max.clamp(1, MAX_BATCH) as usize;
        let external = self.external;
        env.execute_tokio_future(
            async move {
                let mut rx = incoming.lock().await;
                let mut v = Vec::with_capacity(max.min(256));
                if rx.recv_many(&mut v, max).await == 0 {
                    return Ok(None);
                }
                Ok(Some(v))
            },
            move |env, batch| match batch {
                None => Ok(None),
                Some(msgs) => batch_to_js(env, msgs, external).map(Some),
            },
        )
    }

    /// Up to `max` messages that are ready now, as a batch like
    /// `nextBatch` gives, without waiting and without a trip through the
    /// tokio runtime; `undefined` when none is ready (or a `nextBatch` is
    /// waiting for messages: the caller awaits that instead).
    #[napi(ts_return_type = "Array<any> | undefined")]
    pub fn take_batch(&self, env: Env, max: u32) -> Result<Either<JsObject, JsUndefined>> {
        let max = max.clamp(1, MAX_BATCH) as usize;
        let msgs = {
            let Ok(mut rx) = self.incoming.try_lock() else {
                return env.get_undefined().map(Either::B);
            };
            let mut v = Vec::with_capacity(max.min(256));
            if rx.try_recv_many(&mut v, max) == 0 {
                return env.get_undefined().map(Either::B);
            }
            v
        };
        batch_to_js(&env, msgs, self.external).map(Either::A)
    }

    /// The next connection state change (resolves at once with the current
    /// state when `current` is true).
    #[napi(ts_return_type = "Promise<NativeState>")]
    pub fn next_state(&self, env: Env, current: bool) -> Result<JsObject> {
        let state = self.state.clone();
        let client = self.client.clone();
        env.execute_tokio_future(
            async move {
                let mut rx = state.lock().await;
                if !current && rx.changed().await.is_err() {
                    return Ok(state_of(&ConnState::Closed, &client));
                }
                let s = rx.borrow_and_update().clone();
                Ok(state_of(&s, &client))
            },
            |_env, s| Ok(s),
        )
    }

    /// Publish; resolves when the broker acknowledged it (QoS 1/2) or it
    /// was written (QoS 0).
    #[napi(ts_return_type = "Promise<NativePublishAck>")]
    pub fn publish(
        &self,
        env: Env,
        topic: String,
        payload: Either<String, Buffer>,
        qos: u32,
        retain: bool,
        properties: Option<NativePublishProperties>,
    ) -> Result<JsObject> {
        let qos = qos_of(qos)?;
        // The one copy of a publish: out of the JavaScript heap, which may
        // move or change after this call returns.
        let payload = bytes_of(payload);
        let opts = Box::new(PublishOptions {
            retain,
            properties: properties
                .map(publish_properties)
                .transpose()?
                .unwrap_or_default(),
        });
        queued(&env, &self.ops, |done| Op::Publish {
            topic,
            qos,
            opts,
            payload,
            done,
        })
    }

    /// Subscribe; resolves with one reason code (granted QoS or failure
    /// code >= 0x80) per subscription.
    #[napi(ts_return_type = "Promise<number[]>")]
    pub fn subscribe(&self, env: Env, subs: Vec<NativeSubscription>) -> Result<JsObject> {
        let mut list = Vec::with_capacity(subs.len());
        for s in subs {
            let rh = match s.rh.unwrap_or(0) {
                0 => RetainHandling::SendAtSubscribe,
                1 => RetainHandling::SendIfNew,
                2 => RetainHandling::DoNotSend,
                n => return Err(arg_err(format!("invalid retain handling {n}"))),
            };
            list.push(
                Subscription::new(s.topic, qos_of(s.qos)?)
                    .no_local(s.nl.unwrap_or(false))
                    .retain_as_published(s.rap.unwrap_or(false))
                    .retain_handling(rh),
            );
        }
        queued(&env, &self.ops, |done| Op::Subscribe { list, done })
    }

    /// Unsubscribe; resolves with the MQTT 5 reason codes (empty on 3.1.1).
    #[napi(ts_return_type = "Promise<number[]>")]
    pub fn unsubscribe(&self, env: Env, topics: Vec<String>) -> Result<JsObject> {
        queued(&env, &self.ops, |done| Op::Unsubscribe { topics, done })
    }

    /// Send DISCONNECT and stop; resolves once closed.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn end(&self, env: Env) -> Result<JsObject> {
        queued(&env, &self.ops, |done| Op::End { done })
    }

    /// The client identifier in use.
    #[napi(getter)]
    pub fn client_id(&self) -> String {
        self.client_id.clone()
    }

    /// Whether payloads are external Buffers.
    #[napi(getter)]
    pub fn use_external_buffer(&self) -> bool {
        self.external
    }

    /// Counters of this client.
    #[napi]
    pub fn stats(&self) -> NativeClientStats {
        let s = self.client.stats();
        NativeClientStats {
            connects: s.connects as f64,
            connection_losses: s.connection_losses as f64,
            sessions_resumed: s.sessions_resumed as f64,
            publishes_resent: s.publishes_resent as f64,
            resubscribed: s.resubscribed as f64,
            publishes_sent: s.publishes_sent as f64,
            messages_received: s.messages_received as f64,
            bytes_in: s.bytes_in as f64,
            bytes_out: s.bytes_out as f64,
        }
    }

    /// Statistics of the pool this client reads into.
    #[napi]
    pub fn pool_stats(&self) -> PoolStats {
        pool::stats_of(&self.pool)
    }
}

impl NativeClient {
    /// The Rust client (for the audio publisher, `crate::audio`).
    pub(crate) fn rust_client(&self) -> Client {
        self.client.clone()
    }
}

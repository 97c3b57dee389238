//! Webhooks (`[[webhook]]`): the core's events (see `core::events`), taken
//! after each call into the core (`Shared::dispatch`), stamped and put in
//! one bounded queue per webhook; a worker task per webhook POSTs them as
//! JSON arrays of at most `batch_size`. Nothing here waits on the hot path:
//! a full queue drops the new event (counted), a failed POST is retried
//! [`MAX_RETRIES`] times with doubling backoff, and after [`BREAK_AFTER`]
//! failed batches in a row the circuit opens: the worker sends nothing for
//! a while (doubling up to [`MAX_OPEN`]) and then tries one batch.

use super::state::Shared;
use crate::config::WebhookConfig;
use crate::core::events::{Event, EventKind};
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Retries of one batch before it counts as failed.
pub const MAX_RETRIES: u32 = 2;
/// First retry delay; doubles with each retry.
pub const BACKOFF: Duration = Duration::from_millis(100);
/// Failed batches in a row that open the circuit.
pub const BREAK_AFTER: u32 = 3;
/// First open period; doubles while the endpoint stays dead.
pub const OPEN_FOR: Duration = Duration::from_secs(1);
/// Longest open period.
pub const MAX_OPEN: Duration = Duration::from_secs(30);
/// Largest response body read (and discarded) from a receiver.
const MAX_RESPONSE: usize = 64 * 1024;

/// One webhook's counters for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WebhookFigures {
    /// The URL.
    pub url: String,
    /// Batches the receiver took (2xx).
    pub posts_ok: u64,
    /// Batches given up on after their retries.
    pub posts_failed: u64,
    /// Attempts repeated after a failure.
    pub retries: u64,
    /// Events delivered.
    pub events_sent: u64,
    /// Events dropped because the queue was full.
    pub dropped_queue_full: u64,
    /// Events dropped with a failed batch.
    pub dropped_failed: u64,
    /// Times the circuit opened.
    pub circuit_opens: u64,
    /// The circuit is open now.
    pub circuit_open: bool,
    /// Events waiting now.
    pub queued: u64,
}

impl WebhookFigures {
    /// Add another shard's figures for the same webhook.
    pub fn add(&mut self, o: &WebhookFigures) {
        self.posts_ok += o.posts_ok;
        self.posts_failed += o.posts_failed;
        self.retries += o.retries;
        self.events_sent += o.events_sent;
        self.dropped_queue_full += o.dropped_queue_full;
        self.dropped_failed += o.dropped_failed;
        self.circuit_opens += o.circuit_opens;
        self.circuit_open |= o.circuit_open;
        self.queued += o.queued;
    }
}

/// With several shards, each shard posts its own core's events (a client's
/// events come from the one shard its session lives on, so they stay in
/// order), with queues of its own; `/metrics` adds their figures up.
pub(super) fn start_on_shard(
    shared: &Rc<Shared>,
    configs: &[crate::config::WebhookConfig],
) -> Vec<tokio::task::JoinHandle<()>> {
    let Ok(Some(w)) = Webhooks::new(configs) else {
        // Checked at startup on shard 0: an error stopped the broker there.
        return Vec::new();
    };
    shared.broker.borrow_mut().set_event_mask(w.mask());
    let w = Rc::new(w);
    let tasks = w.start();
    let _ = shared.ops.webhooks.set(w);
    tasks
}

/// An event as a queue keeps it: its own bytes (a message's topic, and its
/// payload only where a webhook sends payloads), never a reference to the
/// message, which would pin a publisher's read buffer while it waits.
#[derive(Debug)]
struct Stamped {
    kind: EventKind,
    at: SystemTime,
    client_id: Option<String>,
    username: Option<Box<str>>,
    topic: Option<Box<str>>,
    qos: Option<u8>,
    retain: Option<bool>,
    reason: Option<u8>,
    payload: Option<Bytes>,
    count: Option<u64>,
}

impl Stamped {
    fn new(e: &Event, at: SystemTime, with_payload: bool, count: Option<u64>) -> Stamped {
        let m = e.message.as_ref();
        Stamped {
            kind: e.kind,
            at,
            client_id: e.client_id.as_ref().map(|c| c.to_string()),
            username: e.username.clone(),
            topic: m
                .map(|m| m.topic.as_str().into())
                .or_else(|| e.topic.clone()),
            qos: e.qos,
            retain: m.map(|m| m.retain),
            reason: e.reason,
            payload: m
                .filter(|_| with_payload)
                .map(|m| Bytes::copy_from_slice(&m.payload)),
            count,
        }
    }
}

struct Hook {
    cfg: WebhookConfig,
    mask: u16,
    authority: String,
    path: String,
    queue: RefCell<VecDeque<Rc<Stamped>>>,
    notify: tokio::sync::Notify,
    figures: RefCell<WebhookFigures>,
    sender: RefCell<Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>>,
}

/// Every webhook, and what the drain remembers between calls.
pub struct Webhooks {
    hooks: Vec<Rc<Hook>>,
    mask: u16,
    scratch: RefCell<Vec<Event>>,
    /// Events the core's buffer dropped (it was full).
    core_dropped: Cell<u64>,
    /// The core's dropped-messages total at the last drain.
    dropped_seen: Cell<u64>,
    /// Some webhook sends payloads: queued events copy them.
    payloads: bool,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhooks")
            .field("hooks", &self.hooks.len())
            .finish()
    }
}

/// `http://HOST[:PORT][/PATH]` as (authority with port, path).
pub fn split_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("webhook url {url}: only http:// is supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(format!("webhook url {url}: no host"));
    }
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    let authority = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((authority, path.to_string()))
}

impl Webhooks {
    /// Webhooks for `configs` (none: `None`); unknown event names are an
    /// error.
    pub fn new(configs: &[WebhookConfig]) -> Result<Option<Webhooks>, String> {
        if configs.is_empty() {
            return Ok(None);
        }
        let mut hooks = Vec::new();
        let mut all = 0u16;
        for cfg in configs {
            let mut mask = 0u16;
            for name in &cfg.events {
                let kind = EventKind::from_name(name)
                    .ok_or_else(|| format!("webhook {}: unknown event {name}", cfg.url))?;
                mask |= kind.bit();
            }
            if cfg.events.is_empty() {
                mask = EventKind::ALL.iter().fold(0, |m, k| m | k.bit());
            }
            all |= mask;
            let (authority, path) = split_url(&cfg.url)?;
            hooks.push(Rc::new(Hook {
                cfg: cfg.clone(),
                mask,
                authority,
                path,
                queue: RefCell::new(VecDeque::new()),
                notify: tokio::sync::Notify::new(),
                figures: RefCell::new(WebhookFigures {
                    url: cfg.url.clone(),
                    ..WebhookFigures::default()
                }),
                sender: RefCell::new(None),
            }));
        }
        Ok(Some(Webhooks {
            hooks,
            mask: all,
            scratch: RefCell::new(Vec::new()),
            core_dropped: Cell::new(0),
            dropped_seen: Cell::new(0),
            payloads: configs.iter().any(|c| c.include_payload),
        }))
    }

    /// The event kinds the core should record.
    pub fn mask(&self) -> u16 {
        self.mask
    }

    /// Start one worker per webhook.
    pub fn start(self: &Rc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        self.hooks
            .iter()
            .map(|h| tokio::task::spawn_local(worker(h.clone())))
            .collect()
    }

    /// Counters of every webhook, and the events the core's buffer dropped.
    pub fn figures(&self) -> (Vec<WebhookFigures>, u64) {
        let list = self
            .hooks
            .iter()
            .map(|h| {
                let mut f = h.figures.borrow().clone();
                f.queued = h.queue.borrow().len() as u64;
                f
            })
            .collect();
        (list, self.core_dropped.get())
    }

    /// Take the core's events and queue them for the webhooks that want
    /// them. Called after each call into the core.
    pub fn drain(&self, shared: &Shared) {
        let mut events = std::mem::take(&mut *self.scratch.borrow_mut());
        let dropped_now = {
            let Ok(mut b) = shared.broker.try_borrow_mut() else {
                return;
            };
            self.core_dropped.set(b.take_events(&mut events));
            (self.mask & EventKind::MessageDropped.bit() != 0).then(|| b.metrics().dropped_total())
        };
        let mut extra = None;
        if let Some(total) = dropped_now {
            let seen = self.dropped_seen.replace(total);
            if total > seen {
                extra = Some(total - seen);
            }
        }
        if events.is_empty() && extra.is_none() {
            *self.scratch.borrow_mut() = events;
            return;
        }
        let at = SystemTime::now();
        for event in events.drain(..) {
            self.fan_out(&event, at, None);
        }
        if let Some(n) = extra {
            let event = Event {
                kind: EventKind::MessageDropped,
                client_id: None,
                username: None,
                topic: None,
                qos: None,
                message: None,
                reason: None,
            };
            self.fan_out(&event, at, Some(n));
        }
        *self.scratch.borrow_mut() = events;
    }

    /// Queue `e` for every webhook that wants it and has room; its queued
    /// form is made once, and only if some queue takes it (a dead
    /// receiver's full queue costs a counter, not a copy).
    fn fan_out(&self, e: &Event, at: SystemTime, count: Option<u64>) {
        let bit = e.kind.bit();
        let mut made: Option<Rc<Stamped>> = None;
        for h in &self.hooks {
            if h.mask & bit == 0 {
                continue;
            }
            if let (Some(m), false) = (&e.message, h.cfg.topics.is_empty()) {
                let topic = m.topic.as_str();
                if !h
                    .cfg
                    .topics
                    .iter()
                    .any(|f| zerofan_codec::topic::matches(f, topic))
                {
                    continue;
                }
            }
            let mut q = h.queue.borrow_mut();
            if q.len() >= h.cfg.queue_size {
                h.figures.borrow_mut().dropped_queue_full += 1;
                if h.cfg.queue_full != crate::config::QueueFull::DropOldest {
                    continue;
                }
                q.pop_front();
            }
            let item =
                made.get_or_insert_with(|| Rc::new(Stamped::new(e, at, self.payloads, count)));
            q.push_back(item.clone());
            drop(q);
            h.notify.notify_one();
        }
    }
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-11-25T01:02:03.456Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

fn to_json(e: &Stamped, include_payload: bool) -> Value {
    let mut v = json!({
        "event": e.kind.name(),
        "timestamp": rfc3339(e.at),
        "clientid": e.client_id,
        "username": e.username.as_deref(),
    });
    if let Some(t) = &e.topic {
        v["topic"] = json!(t.as_ref());
    }
    if let Some(q) = e.qos {
        v["qos"] = json!(q);
    }
    if let Some(r) = e.retain {
        v["retain"] = json!(r);
    }
    if let Some(r) = e.reason {
        v["reason"] = json!(r);
    }
    if let Some(n) = e.count {
        v["count"] = json!(n);
    }
    if let (Some(p), true) = (&e.payload, include_payload) {
        v["payload_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(p));
    }
    v
}

async fn worker(hook: Rc<Hook>) {
    let mut failed_in_a_row = 0u32;
    let mut open_for = OPEN_FOR;
    loop {
        if hook.queue.borrow().is_empty() {
            hook.notify.notified().await;
            continue;
        }
        let batch: Vec<Rc<Stamped>> = {
            let mut q = hook.queue.borrow_mut();
            let n = q.len().min(hook.cfg.batch_size);
            q.drain(..n).collect()
        };
        let count = batch.len() as u64;
        let body: Vec<Value> = batch
            .iter()
            .map(|e| to_json(e, hook.cfg.include_payload))
            .collect();
        // The messages go now, not when the POST is done.
        drop(batch);
        let body = Bytes::from(Value::Array(body).to_string());
        let tries = if failed_in_a_row >= BREAK_AFTER {
            1 // half-open: one attempt
        } else {
            1 + MAX_RETRIES
        };
        let mut ok = false;
        for attempt in 0..tries {
            if attempt > 0 {
                hook.figures.borrow_mut().retries += 1;
                tokio::time::sleep(BACKOFF * 2u32.pow(attempt - 1)).await;
            }
            match post(&hook, body.clone()).await {
                Ok(()) => {
                    ok = true;
                    break;
                }
                Err(e) => tracing::debug!(url = %hook.cfg.url, error = %e, "webhook POST failed"),
            }
        }
        let open = {
            let mut f = hook.figures.borrow_mut();
            if ok {
                f.posts_ok += 1;
                f.events_sent += count;
                f.circuit_open = false;
                failed_in_a_row = 0;
                open_for = OPEN_FOR;
                false
            } else {
                f.posts_failed += 1;
                f.dropped_failed += count;
                failed_in_a_row += 1;
                let open = failed_in_a_row >= BREAK_AFTER;
                if open {
                    f.circuit_opens += 1;
                    f.circuit_open = true;
                }
                open
            }
        };
        if open {
            tracing::warn!(url = %hook.cfg.url, seconds = open_for.as_secs_f64(), "webhook unreachable: circuit open");
            tokio::time::sleep(open_for).await;
            open_for = (open_for * 2).min(MAX_OPEN);
        }
    }
}

/// One POST of `body`, within the webhook's timeout; a 2xx answer is
/// success. The connection is kept for the next batch.
async fn post(hook: &Hook, body: Bytes) -> Result<(), String> {
    let timeout = Duration::from_millis(hook.cfg.timeout_ms);
    tokio::time::timeout(timeout, async {
        let reuse = hook.sender.borrow_mut().take().filter(|s| !s.is_closed());
        let mut sender = match reuse {
            Some(s) => s,
            None => {
                let stream = tokio::net::TcpStream::connect(&hook.authority)
                    .await
                    .map_err(|e| format!("connect {}: {e}", hook.authority))?;
                let _ = stream.set_nodelay(true);
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::task::spawn_local(async move {
                    let _ = conn.await;
                });
                sender
            }
        };
        sender.ready().await.map_err(|e| e.to_string())?;
        let mut req = hyper::Request::post(hook.path.as_str())
            .header("host", hook.authority.as_str())
            .header("content-type", "application/json")
            .header("user-agent", "zerofan");
        for (k, v) in &hook.cfg.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let _ = Limited::new(resp.into_body(), MAX_RESPONSE).collect().await;
        *hook.sender.borrow_mut() = Some(sender);
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("answered {status}"))
        }
    })
    .await
    .map_err(|_| "timed out".to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            split_url("http://127.0.0.1:8080/hook?x=1").unwrap(),
            ("127.0.0.1:8080".to_string(), "/hook?x=1".to_string())
        );
        assert_eq!(
            split_url("http://example.com").unwrap(),
            ("example.com:80".to_string(), "/".to_string())
        );
        assert!(split_url("https://x/").is_err());
        assert!(split_url("http:///x").is_err());
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_568_523_456);
        assert_eq!(rfc3339(t), "2026-11-25T01:02:03.456Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn unknown_event_names_are_refused() {
        let cfg = WebhookConfig {
            url: "http://127.0.0.1:1/".into(),
            events: vec!["client.exploded".into()],
            topics: vec![],
            include_payload: false,
            headers: Default::default(),
            timeout_ms: 100,
            queue_size: 10,
            batch_size: 10,
            queue_full: Default::default(),
        };
        assert!(Webhooks::new(&[cfg]).is_err());
    }

    fn connected(id: &'static str) -> Event {
        Event {
            kind: EventKind::ClientConnected,
            client_id: Some(id.into()),
            username: None,
            topic: None,
            qos: None,
            message: None,
            reason: None,
        }
    }

    #[test]
    fn full_queues_drop_by_policy_and_count() {
        use crate::config::QueueFull;
        for (policy, kept) in [
            (QueueFull::DropNew, ["a", "b"]),
            (QueueFull::DropOldest, ["b", "c"]),
        ] {
            let cfg = WebhookConfig {
                url: "http://127.0.0.1:1/".into(),
                events: vec!["client.connected".into()],
                topics: vec![],
                include_payload: false,
                headers: Default::default(),
                timeout_ms: 100,
                queue_size: 2,
                batch_size: 10,
                queue_full: policy,
            };
            let w = Webhooks::new(&[cfg]).unwrap().unwrap();
            let at = SystemTime::now();
            for id in ["a", "b", "c"] {
                w.fan_out(&connected(id), at, None);
            }
            let q = w.hooks[0].queue.borrow();
            let ids: Vec<&str> = q.iter().filter_map(|e| e.client_id.as_deref()).collect();
            assert_eq!(ids, kept, "{policy:?}");
            assert_eq!(w.hooks[0].figures.borrow().dropped_queue_full, 1);
        }
    }
}

//! A native publisher for tests and benchmarks: publishes a stream of
//! messages from the tokio runtime, so the load does not cost the
//! JavaScript thread anything and every client under test sees the same
//! stream.
//!
//! Each payload starts with a 16-byte header: the send time (nanoseconds
//! since the Unix epoch, little endian; 0 unless `stamp`) and the sequence
//! number (little endian). Byte `i` of the rest is `(seq + i) & 0xff`, so a
//! receiver can check every byte (`verifyPayload` in JavaScript).

use crate::{arg_err, js_err};
use bytes::BufMut;
use napi::{Env, JsObject, Result};
use napi_derive::napi;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use zerofan_client::{Client, ClientOptions, Protocol, QoS};

/// What to publish.
#[napi(object)]
pub struct LoadOptions {
    pub host: Option<String>,
    pub port: u32,
    pub topic: String,
    /// Payload bytes (at least 16).
    pub size: u32,
    /// Messages per second; 0 or absent: as fast as the connection takes.
    pub rate: Option<f64>,
    /// Stop after this many messages.
    pub count: Option<f64>,
    /// Stop after this many milliseconds.
    pub duration_ms: Option<f64>,
    pub qos: Option<u32>,
    /// Put the send time in the header (for latency).
    pub stamp: Option<bool>,
}

/// What a load publisher did.
#[napi(object)]
pub struct LoadResult {
    pub sent: f64,
    pub elapsed_ms: f64,
    pub error: Option<String>,
}

/// A running load publisher.
#[napi]
pub struct LoadPublisher {
    stop: watch::Sender<bool>,
    done: watch::Receiver<Option<(u64, f64, Option<String>)>>,
    sent: Arc<AtomicU64>,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

struct Plan {
    client: Client,
    topic: String,
    size: usize,
    qos: QoS,
    rate: f64,
    count: u64,
    duration: Option<Duration>,
    stamp: bool,
}

async fn run(plan: Plan, sent: Arc<AtomicU64>, mut stop: watch::Receiver<bool>) -> Option<String> {
    let start = Instant::now();
    let mut seq: u64 = 0;
    // The last publish's outcome: awaited before disconnecting, so that
    // "done" means every message left (QoS 0) or was acknowledged (QoS
    // 1/2: acknowledgements come in order), not merely queued.
    let mut last = None;
    let body = plan.size.saturating_sub(16);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        if *stop.borrow() {
            break;
        }
        if let Some(d) = plan.duration {
            if start.elapsed() >= d {
                break;
            }
        }
        if seq >= plan.count {
            break;
        }
        // How many to send now: the whole backlog against the schedule
        // when paced, a slice of 256 when running flat out.
        let due = if plan.rate > 0.0 {
            let want = (start.elapsed().as_secs_f64() * plan.rate) as u64 + 1;
            want.min(plan.count).saturating_sub(seq)
        } else {
            256.min(plan.count - seq)
        };
        for _ in 0..due {
            let s = seq;
            let stamp = plan.stamp;
            let r = plan
                .client
                .publish_with(&plan.topic, plan.qos, |buf| {
                    buf.reserve(16 + body);
                    buf.put_u64_le(if stamp { now_ns() } else { 0 });
                    buf.put_u64_le(s);
                    for i in 0..body {
                        buf.put_u8((s as usize).wrapping_add(i) as u8);
                    }
                })
                .await;
            match r {
                Ok(delivery) => last = Some(delivery),
                Err(e) => return Some(e.to_string()),
            }
            seq += 1;
            sent.store(seq, Ordering::Relaxed);
        }
        if plan.rate > 0.0 {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => {}
            }
        } else {
            tokio::task::yield_now().await;
        }
    }
    let failed = match last {
        Some(d) => match tokio::time::timeout(Duration::from_secs(30), d).await {
            Ok(r) => r.err().map(|e| e.to_string()),
            Err(_) => Some("no acknowledgement of the last message within 30 s".into()),
        },
        None => None,
    };
    let _ = plan.client.disconnect().await;
    failed
}

/// Connect and start publishing; resolves once connected.
#[napi(ts_return_type = "Promise<LoadPublisher>")]
pub fn start_load_publisher(env: Env, o: LoadOptions) -> Result<JsObject> {
    if o.size < 16 {
        return Err(arg_err("size must be at least 16"));
    }
    let qos = QoS::from_u8(o.qos.unwrap_or(0) as u8).ok_or_else(|| arg_err("invalid qos"))?;
    let addr = format!(
        "{}:{}",
        o.host.unwrap_or_else(|| "127.0.0.1".into()),
        o.port
    );
    let opts = ClientOptions::new(addr)
        .protocol(Protocol::V5)
        .reconnect(false)
        .outgoing_capacity(1024);
    let rate = o.rate.unwrap_or(0.0).max(0.0);
    let count = o.count.map_or(u64::MAX, |c| c.max(0.0) as u64);
    let duration = o
        .duration_ms
        .map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0));
    let (topic, size, stamp) = (o.topic, o.size as usize, o.stamp.unwrap_or(false));
    env.execute_tokio_future(
        async move {
            let (client, _incoming) = Client::connect(opts).await.map_err(js_err)?;
            let (stop_tx, stop_rx) = watch::channel(false);
            let (done_tx, done_rx) = watch::channel(None);
            let sent = Arc::new(AtomicU64::new(0));
            let plan = Plan {
                client,
                topic,
                size,
                qos,
                rate,
                count,
                duration,
                stamp,
            };
            let s = sent.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let err = run(plan, s.clone(), stop_rx).await;
                let ms = start.elapsed().as_secs_f64() * 1000.0;
                done_tx.send_replace(Some((s.load(Ordering::Relaxed), ms, err)));
            });
            Ok(LoadPublisher {
                stop: stop_tx,
                done: done_rx,
                sent,
            })
        },
        |_env, p| Ok(p),
    )
}

#[napi]
impl LoadPublisher {
    /// Messages published so far.
    #[napi(getter)]
    pub fn sent(&self) -> f64 {
        self.sent.load(Ordering::Relaxed) as f64
    }

    /// Ask it to stop.
    #[napi]
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Resolves when it has finished (stopped, count or duration reached)
    /// and its last message was written (QoS 0) or acknowledged (QoS 1/2),
    /// so every message counted in `sent` has reached the broker.
    #[napi(ts_return_type = "Promise<LoadResult>")]
    pub fn done(&self, env: Env) -> Result<JsObject> {
        let mut rx = self.done.clone();
        env.execute_tokio_future(
            async move {
                let r = rx
                    .wait_for(|d| d.is_some())
                    .await
                    .map_err(|_| js_err("publisher vanished"))?
                    .clone();
                let (sent, elapsed_ms, error) = r.unwrap_or((0, 0.0, None));
                Ok(LoadResult {
                    sent: sent as f64,
                    elapsed_ms,
                    error,
                })
            },
            |_env, r| Ok(r),
        )
    }
}

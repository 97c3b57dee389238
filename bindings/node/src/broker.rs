//! The zerofan broker inside the Node.js process.
//!
//! `startBroker` runs `zerofan_broker::embed::spawn` (the broker on a thread
//! of its own with its own current-thread tokio runtime and `LocalSet`: the
//! broker is single-threaded by design and never touches the JavaScript
//! thread) off the JavaScript thread, and resolves once the listeners are
//! bound. `stats()` asks the broker thread for a fresh snapshot of its
//! core's figures (`BrokerHandle::stats`): no internal client, nothing
//! subscribed to `$SYS`. `close()` shuts it down gracefully (MQTT 5 clients
//! get DISCONNECT 0x8B, the store is flushed) and resolves when the thread
//! has ended.

use crate::js_err;
use napi::{Env, JsObject, Result};
use napi_derive::napi;
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use zerofan_broker::config::Config;
use zerofan_broker::embed::{self, BrokerHandle};

/// Where and how to run the broker.
#[napi(object)]
pub struct BrokerOptions {
    /// Listen host (default 127.0.0.1).
    pub host: Option<String>,
    /// Listen port (default 1883; 0 picks a free port).
    pub port: Option<u32>,
    /// Directory of the embedded store (retained messages, persistent
    /// sessions); created if missing. Without it the broker runs in memory.
    pub data_dir: Option<String>,
    /// Seconds between `$SYS/broker/...` refreshes for MQTT subscribers
    /// (default 1; 0 turns `$SYS` off). `stats()` does not depend on it.
    pub sys_interval: Option<u32>,
    /// Messages a session queue holds before it drops.
    pub max_queued_messages: Option<u32>,
    /// Largest packet accepted, bytes.
    pub max_packet_size: Option<u32>,
    /// Shards (threads), each with its own event loop and core (default:
    /// one per available core; 1 = the single-thread broker).
    pub threads: Option<u32>,
    /// Broker settings as TOML (the `zerofan` binary's config file
    /// format); `host`/`port` and the fields above override it.
    pub config_toml: Option<String>,
}

/// The running broker.
#[napi]
pub struct NativeBroker {
    /// `None` once `close()` was called.
    handle: Arc<Mutex<Option<BrokerHandle>>>,
    addrs: Vec<SocketAddr>,
    /// The figures taken as `close()` began, for `stats()` afterwards.
    last: Arc<Mutex<Option<embed::BrokerStats>>>,
    data_dir: Option<String>,
}

impl Drop for NativeBroker {
    /// Collected without `close()`: stop the broker on a thread of its own,
    /// so that the garbage collector never waits for its shutdown.
    fn drop(&mut self) {
        let h = self.handle.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = h {
            let _ = std::thread::Builder::new()
                .name("zerofan-broker-stop".into())
                .spawn(move || drop(h));
        }
    }
}

/// Figures from the broker.
#[napi(object)]
pub struct BrokerStats {
    pub uptime_ms: f64,
    pub clients_connected: f64,
    pub connections: f64,
    pub messages_received: f64,
    pub messages_sent: f64,
    pub messages_dropped: f64,
    pub retained: f64,
    pub bytes_received: f64,
    pub bytes_sent: f64,
    pub pool_hits: f64,
    pub pool_misses: f64,
    pub pool_hit_rate: f64,
    pub pool_bytes_outstanding: f64,
    /// Sessions that exist, connected or not.
    pub sessions: f64,
    /// Subscriptions, all sessions.
    pub subscriptions: f64,
    /// Messages waiting in session queues.
    pub queued_messages: f64,
    /// Every figure under its `$SYS/broker/...` name (e.g.
    /// "messages/sent"), taken from the core like the fields above.
    pub sys: HashMap<String, String>,
}

fn config_from(o: &BrokerOptions) -> Result<Config> {
    let mut config = match &o.config_toml {
        Some(t) => Config::from_toml(t, "startBroker options").map_err(js_err)?,
        None => Config::default(),
    };
    if o.host.is_some() || o.port.is_some() || o.config_toml.is_none() {
        let host = o.host.clone().unwrap_or_else(|| "127.0.0.1".into());
        let port = u16::try_from(o.port.unwrap_or(1883)).map_err(|_| js_err("bad port"))?;
        let addrs: Vec<SocketAddr> = (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| js_err(format!("cannot resolve {host}: {e}")))?
            .collect();
        let first = addrs
            .first()
            .copied()
            .ok_or_else(|| js_err(format!("no address for {host}")))?;
        config.listen = vec![first];
    }
    if let Some(dir) = &o.data_dir {
        config.data_dir = Some(dir.into());
    }
    config.sys_interval = u64::from(o.sys_interval.unwrap_or(1));
    if let Some(n) = o.max_queued_messages {
        config.max_queued_messages = n as usize;
    }
    if let Some(n) = o.max_packet_size {
        config.max_packet_size = n;
    }
    if let Some(n) = o.threads {
        config.threads = n as usize;
    }
    config.validate().map_err(js_err)?;
    Ok(config)
}

/// Start a broker; resolves with its handle once it listens.
#[napi(ts_return_type = "Promise<NativeBroker>")]
pub fn start_broker_native(env: Env, options: BrokerOptions) -> Result<JsObject> {
    let config = config_from(&options)?;
    if let Some(dir) = &options.data_dir {
        std::fs::create_dir_all(dir).map_err(|e| js_err(format!("dataDir {dir}: {e}")))?;
    }
    let data_dir = options.data_dir.clone();
    env.execute_tokio_future(
        async move {
            // `spawn` blocks until the listeners are bound (or failed).
            let handle = tokio::task::spawn_blocking(move || embed::spawn(config))
                .await
                .map_err(js_err)?
                .map_err(|e| js_err(format!("broker failed to start: {e}")))?;
            Ok(NativeBroker {
                addrs: handle.local_addrs(),
                handle: Arc::new(Mutex::new(Some(handle))),
                last: Arc::new(Mutex::new(None)),
                data_dir,
            })
        },
        |_env, b| Ok(b),
    )
}

/// `$SYS/broker/...` names for the figures (the names the broker publishes
/// under `$SYS`, so code that read them from there finds them here).
fn sys_map(st: &embed::BrokerStats) -> HashMap<String, String> {
    let s = &st.snapshot;
    let g = &s.gauges;
    let mut out = zerofan_broker::core::sys_figures(
        &s.metrics,
        &s.shell,
        st.uptime.as_secs(),
        g.sessions_online,
        st.sessions as usize,
        g.retained,
    );
    // Two more than `$SYS` has.
    out.push(("messages/queued", g.queued_messages.to_string()));
    out.push(("subscriptions/count", g.subscriptions.to_string()));
    out.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn to_js_stats(st: &embed::BrokerStats) -> BrokerStats {
    let n = |v: u64| v as f64;
    BrokerStats {
        uptime_ms: st.uptime.as_secs_f64() * 1000.0,
        clients_connected: n(st.clients_connected),
        connections: n(st.connections_total),
        messages_received: n(st.messages_received),
        messages_sent: n(st.messages_sent),
        messages_dropped: n(st.messages_dropped),
        retained: n(st.retained),
        bytes_received: n(st.bytes_received),
        bytes_sent: n(st.bytes_sent),
        pool_hits: n(st.pool_hits),
        pool_misses: n(st.pool_misses),
        pool_hit_rate: st.pool_hit_rate,
        pool_bytes_outstanding: n(st.pool_bytes_outstanding),
        sessions: n(st.sessions),
        subscriptions: n(st.subscriptions),
        queued_messages: n(st.queued_messages),
        sys: sys_map(st),
    }
}

impl NativeBroker {
    /// `read`'s figures from the running broker, or after `close()` those
    /// taken as it began.
    fn figures(&self, read: fn(&BrokerHandle) -> embed::BrokerStats) -> BrokerStats {
        let st = match &*self.handle.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(h) => read(h),
            None => self
                .last
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_default(),
        };
        to_js_stats(&st)
    }
}

#[napi]
impl NativeBroker {
    /// The addresses the broker listens on ("host:port").
    #[napi(getter)]
    pub fn addresses(&self) -> Vec<String> {
        self.addrs.iter().map(|a| a.to_string()).collect()
    }

    /// The first listening port.
    #[napi(getter)]
    pub fn port(&self) -> u32 {
        self.addrs.first().map_or(0, |a| u32::from(a.port()))
    }

    /// The data directory given at start.
    #[napi(getter)]
    pub fn data_dir(&self) -> Option<String> {
        self.data_dir.clone()
    }

    /// Whether `close()` has been called.
    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.handle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// Fresh figures from the broker's core (after `close()`, those taken
    /// as it began).
    #[napi]
    pub fn stats(&self) -> BrokerStats {
        self.figures(BrokerHandle::stats)
    }

    /// The figures the broker thread published last (it refreshes them
    /// every half second and on every `stats()` call), without waiting for
    /// it: never blocks the JavaScript thread (after `close()`, those taken
    /// as it began).
    #[napi]
    pub fn latest_stats(&self) -> BrokerStats {
        self.figures(BrokerHandle::latest_stats)
    }

    /// Stop gracefully (MQTT 5 clients get DISCONNECT 0x8B, the store is
    /// flushed); resolves once the broker's thread has ended.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn close(&self, env: Env) -> Result<JsObject> {
        let handle = self.handle.lock().unwrap_or_else(|e| e.into_inner()).take();
        let last = self.last.clone();
        env.execute_tokio_future(
            async move {
                let Some(h) = handle else {
                    return Ok(());
                };
                tokio::task::spawn_blocking(move || {
                    *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(h.stats());
                    h.shutdown()
                })
                .await
                .map_err(js_err)?
                .map_err(js_err)
            },
            |_env, ()| Ok(()),
        )
    }
}

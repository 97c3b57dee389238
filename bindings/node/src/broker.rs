//! The zerofan broker inside the Node.js process.
//!
//! `startBroker` spawns a thread that runs `zerofan_broker::shell::Server`
//! on its own current-thread tokio runtime and `LocalSet` (the broker is
//! single-threaded by design and never touches the JavaScript thread), and
//! resolves once the listeners are bound. `close()` signals the server's
//! shutdown future and resolves when the thread has ended.
//!
//! Statistics: the broker library keeps its counters inside `Server::run`
//! and publishes them only as `$SYS/broker/...` retained messages, so this
//! adapter keeps one internal client subscribed to `$SYS/broker/#` and
//! serves `stats()` from the latest values (refreshed every `sysInterval`
//! seconds, default 1). That client is left out of `clients/connected`.

use crate::js_err;
use napi::{Env, JsObject, Result};
use napi_derive::napi;
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::oneshot;
use zerofan_broker::config::Config;
use zerofan_broker::shell::Server;
use zerofan_client::{Client, ClientOptions, Protocol, QoS};

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
    /// Seconds between `$SYS` refreshes, which is how often `stats()`
    /// changes (default 1).
    pub sys_interval: Option<u32>,
    /// Messages a session queue holds before it drops.
    pub max_queued_messages: Option<u32>,
    /// Largest packet accepted, bytes.
    pub max_packet_size: Option<u32>,
    /// Broker settings as TOML (the `zerofan` binary's config file
    /// format); `host`/`port` and the fields above override it.
    pub config_toml: Option<String>,
}

/// The running broker.
#[napi]
pub struct NativeBroker {
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    thread: Arc<Mutex<Option<JoinHandle<std::io::Result<()>>>>>,
    addrs: Vec<SocketAddr>,
    sys: Arc<Mutex<HashMap<String, String>>>,
    monitor: Option<Client>,
    started: Instant,
    data_dir: Option<String>,
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
    /// Every `$SYS/broker/...` figure, by name (e.g. "messages/sent").
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
    let sys_on = config.sys_interval > 0;
    let (bound_tx, bound_rx) = oneshot::channel::<std::io::Result<Vec<SocketAddr>>>();
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("zerofan-broker".into())
        .spawn(move || run_broker(config, bound_tx, shutdown_rx))
        .map_err(js_err)?;
    let thread = Arc::new(Mutex::new(Some(thread)));
    let t2 = thread.clone();
    env.execute_tokio_future(
        async move {
            let addrs = match bound_rx.await {
                Ok(Ok(a)) => a,
                Ok(Err(e)) => {
                    let _ = join(&t2);
                    return Err(js_err(format!("broker failed to start: {e}")));
                }
                Err(_) => {
                    let err = join(&t2).err().map(|e| e.to_string());
                    return Err(js_err(format!(
                        "broker thread ended before listening: {}",
                        err.unwrap_or_default()
                    )));
                }
            };
            let sys = Arc::new(Mutex::new(HashMap::new()));
            let monitor = if sys_on {
                monitor(&addrs, sys.clone()).await
            } else {
                None
            };
            Ok(NativeBroker {
                shutdown: Mutex::new(Some(shutdown_tx)),
                thread,
                addrs,
                sys,
                monitor,
                started: Instant::now(),
                data_dir,
            })
        },
        |_env, b| Ok(b),
    )
}

fn join(t: &Mutex<Option<JoinHandle<std::io::Result<()>>>>) -> std::io::Result<()> {
    let h = t.lock().unwrap_or_else(|e| e.into_inner()).take();
    match h.map(|h| h.join()) {
        None => Ok(()),
        Some(Ok(r)) => r,
        Some(Err(_)) => Err(std::io::Error::other("broker thread panicked")),
    }
}

fn run_broker(
    config: Config,
    bound: oneshot::Sender<std::io::Result<Vec<SocketAddr>>>,
    shutdown: oneshot::Receiver<()>,
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let server = match Server::bind(config).await {
            Ok(s) => s,
            Err(e) => {
                let kind = e.kind();
                let msg = e.to_string();
                let _ = bound.send(Err(e));
                return Err(std::io::Error::new(kind, msg));
            }
        };
        let _ = bound.send(Ok(server.local_addrs()));
        server
            .run(async move {
                let _ = shutdown.await;
            })
            .await
    })
}

/// The internal `$SYS` subscriber (see the module docs).
async fn monitor(addrs: &[SocketAddr], sys: Arc<Mutex<HashMap<String, String>>>) -> Option<Client> {
    let mut addr = *addrs.first()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let opts = ClientOptions::new(addr.to_string())
        .protocol(Protocol::V5)
        .client_id("zerofan-node-stats")
        .pool(zerofan_pool::Pool::global().clone());
    let (client, mut incoming) = Client::connect(opts).await.ok()?;
    client
        .subscribe("$SYS/broker/#", QoS::AtMostOnce)
        .await
        .ok()?;
    tokio::spawn(async move {
        while let Some(m) = incoming.recv().await {
            let name = m.topic().trim_start_matches("$SYS/broker/").to_string();
            let value = String::from_utf8_lossy(&m.payload).into_owned();
            sys.lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(name, value);
        }
    });
    Some(client)
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
        self.shutdown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// The latest figures (refreshed every `sysInterval` seconds).
    #[napi]
    pub fn stats(&self) -> BrokerStats {
        let sys = self.sys.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let n = |k: &str| {
            sys.get(k)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let own = if self.monitor.is_some() { 1.0 } else { 0.0 };
        BrokerStats {
            uptime_ms: self.started.elapsed().as_secs_f64() * 1000.0,
            clients_connected: (n("clients/connected") - own).max(0.0),
            connections: (n("clients/connections") - own).max(0.0),
            messages_received: n("messages/received"),
            messages_sent: n("messages/sent"),
            messages_dropped: n("messages/dropped"),
            retained: n("messages/retained/count"),
            bytes_received: n("bytes/received"),
            bytes_sent: n("bytes/sent"),
            pool_hits: n("pool/hits"),
            pool_misses: n("pool/misses"),
            pool_hit_rate: n("pool/hit_rate"),
            pool_bytes_outstanding: n("pool/bytes_outstanding"),
            sys,
        }
    }

    /// Stop: disconnect every client and end the broker's thread.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn close(&self, env: Env) -> Result<JsObject> {
        let tx = self
            .shutdown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let monitor = self.monitor.clone();
        let thread = self.thread.clone();
        env.execute_tokio_future(
            async move {
                if let Some(m) = monitor {
                    let _ = m.disconnect().await;
                }
                if let Some(tx) = tx {
                    let _ = tx.send(());
                }
                tokio::task::spawn_blocking(move || join(&thread))
                    .await
                    .map_err(js_err)?
                    .map_err(js_err)
            },
            |_env, ()| Ok(()),
        )
    }
}

//! Running the broker inside another program.
//!
//! [`spawn`] starts the broker on a thread of its own, with the runtime the
//! `zerofan` binary uses (a current-thread tokio runtime and a `LocalSet`;
//! with `threads` other than 1, by default one per available core, the
//! other shards run on threads of their own; none touches the caller's
//! threads), and returns once every listener is bound. The
//! [`BrokerHandle`] it returns gives the bound addresses, the broker's
//! figures read directly from its core ([`BrokerHandle::stats`]; no client
//! subscribed to `$SYS`), and a graceful [`BrokerHandle::shutdown`]: MQTT 5
//! clients get DISCONNECT 0x8B (server shutting down), writers get a
//! moment to flush, the store is closed (flushed) and the thread joined.
//! Dropping the handle does the same.
//!
//! ```no_run
//! let mut config = zerofan_broker::config::Config::default();
//! config.listen = vec!["127.0.0.1:0".parse().unwrap()];
//! let broker = zerofan_broker::embed::spawn(config)?;
//! println!("listening on {:?}", broker.local_addrs());
//! println!("{} clients", broker.stats().clients_connected);
//! broker.shutdown()?;
//! # Ok::<(), std::io::Error>(())
//! ```

use crate::config::Config;
use crate::shell::prometheus::Snapshot;
use crate::shell::{Server, SnapshotFn};
use std::io;
use std::net::SocketAddr;
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How often the broker thread refreshes [`BrokerHandle::latest_stats`].
const REFRESH: Duration = Duration::from_millis(500);
/// How long [`BrokerHandle::stats`] waits for the broker thread to answer
/// before it settles for the latest published figures.
const STATS_WAIT: Duration = Duration::from_secs(1);

/// The broker's figures at one moment, taken in one short borrow of its
/// core (the same figures `/metrics` and `$SYS/broker/...` show).
#[derive(Clone, Debug, Default)]
pub struct BrokerStats {
    /// Time since the broker started serving.
    pub uptime: Duration,
    /// Clients connected now (sessions with a connection attached).
    pub clients_connected: u64,
    /// Network connections open now (CONNECT received or not).
    pub connections_open: u64,
    /// Connections accepted since start.
    pub connections_total: u64,
    /// Sessions that exist, connected or not.
    pub sessions: u64,
    /// Subscriptions, all sessions.
    pub subscriptions: u64,
    /// Retained messages stored.
    pub retained: u64,
    /// Messages waiting in session queues.
    pub queued_messages: u64,
    /// PUBLISH packets received from clients.
    pub messages_received: u64,
    /// PUBLISH packets sent to clients.
    pub messages_sent: u64,
    /// Messages dropped for any reason (queue full, expired, too large).
    pub messages_dropped: u64,
    /// Bytes read from sockets.
    pub bytes_received: u64,
    /// Bytes written to sockets.
    pub bytes_sent: u64,
    /// Payload bytes received in PUBLISH packets.
    pub payload_bytes_received: u64,
    /// Payload bytes sent in PUBLISH packets.
    pub payload_bytes_sent: u64,
    /// Quiet connections parked now (no task of their own, see
    /// `park_after_ms`).
    pub connections_parked: u64,
    /// Read-buffer pool: requests.
    pub pool_gets: u64,
    /// Read-buffer pool: requests served from the pool.
    pub pool_hits: u64,
    /// Read-buffer pool: requests that allocated.
    pub pool_misses: u64,
    /// Read-buffer pool: hits / gets.
    pub pool_hit_rate: f64,
    /// Read-buffer pool: bytes handed out and not yet back.
    pub pool_bytes_outstanding: u64,
    /// Read-buffer pool: bytes held for reuse.
    pub pool_bytes_retained: u64,
    /// Every figure: all counters (by QoS, refusals by reason...), gauges,
    /// store and per-listener figures.
    pub snapshot: Snapshot,
}

impl BrokerStats {
    /// The summary fields of `s`, and `s` itself.
    pub fn from_snapshot(s: Snapshot) -> BrokerStats {
        let (m, g, sh) = (&s.metrics, &s.gauges, &s.shell);
        let n = |v: usize| v as u64;
        BrokerStats {
            uptime: Duration::from_secs_f64(s.uptime_seconds.max(0.0)),
            clients_connected: n(g.sessions_online),
            connections_open: n(g.connections),
            connections_total: m.connections_opened,
            sessions: n(g.sessions_online + g.sessions_offline),
            subscriptions: n(g.subscriptions),
            retained: n(g.retained),
            queued_messages: n(g.queued_messages),
            messages_received: m.messages_received,
            messages_sent: m.messages_sent,
            messages_dropped: m.dropped_total(),
            bytes_received: sh.bytes_received,
            bytes_sent: sh.bytes_sent,
            payload_bytes_received: m.payload_bytes_received,
            payload_bytes_sent: m.payload_bytes_sent,
            connections_parked: sh.connections_parked,
            pool_gets: sh.pool_gets,
            pool_hits: sh.pool_hits,
            pool_misses: sh.pool_misses,
            pool_hit_rate: sh.pool_hit_rate,
            pool_bytes_outstanding: sh.pool_bytes_outstanding,
            pool_bytes_retained: sh.pool_bytes_retained,
            snapshot: s,
        }
    }
}

/// A broker running on its own thread (see the module docs). Dropping it
/// shuts the broker down and waits for the thread.
pub struct BrokerHandle {
    listeners: Vec<(SocketAddr, String)>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<io::Result<()>>>,
    requests: mpsc::UnboundedSender<std_mpsc::Sender<BrokerStats>>,
    latest: Arc<Mutex<BrokerStats>>,
}

impl std::fmt::Debug for BrokerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerHandle")
            .field("listeners", &self.listeners)
            .field("running", &self.is_running())
            .finish()
    }
}

/// Start a broker with `config` on a new thread; returns once every
/// listener is bound (port 0 gets a free port: see
/// [`BrokerHandle::local_addrs`]) and the store, if any, is open. Fails as
/// the binary would at startup: an address in use, unreadable security
/// files, a store that cannot be opened. Blocks the calling thread for that
/// long; from async code, call it in `spawn_blocking`.
pub fn spawn(config: Config) -> io::Result<BrokerHandle> {
    spawn_inner(config, None, None)
}

/// Test-only: [`spawn`], each shard applying what the other shards send
/// it only `delay` after it starts (see `Server::delay_peer_start`).
#[doc(hidden)]
pub fn spawn_with_slow_peers(config: Config, delay: Duration) -> io::Result<BrokerHandle> {
    spawn_inner(config, None, Some(delay))
}

/// [`spawn`] as one node of a cluster, linked to the others by `links`
/// (see [`crate::shell::links`]). A node runs one shard: `threads` 0 (the
/// default) means 1 here, and more than 1 is refused.
pub fn spawn_linked(
    mut config: Config,
    links: crate::shell::links::LinkSetup,
) -> io::Result<BrokerHandle> {
    if config.threads == 0 {
        config.threads = 1;
    }
    spawn_inner(config, Some(links), None)
}

fn spawn_inner(
    config: Config,
    links: Option<crate::shell::links::LinkSetup>,
    peer_delay: Option<Duration>,
) -> io::Result<BrokerHandle> {
    let (bound_tx, bound_rx) = std_mpsc::channel::<io::Result<Vec<(SocketAddr, String)>>>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (req_tx, req_rx) = mpsc::unbounded_channel();
    let latest = Arc::new(Mutex::new(BrokerStats::default()));
    let published = latest.clone();
    let thread = std::thread::Builder::new()
        .name("zerofan-broker".into())
        .spawn(move || {
            run(
                config, links, peer_delay, bound_tx, stop_rx, req_rx, published,
            )
        })?;
    match bound_rx.recv() {
        Ok(Ok(listeners)) => Ok(BrokerHandle {
            listeners,
            stop: Some(stop_tx),
            thread: Some(thread),
            requests: req_tx,
            latest,
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(match thread.join() {
            Ok(Err(e)) => e,
            Ok(Ok(())) => io::Error::other("broker thread ended before listening"),
            Err(_) => io::Error::other("broker thread panicked before listening"),
        }),
    }
}

/// The broker thread: bind, report, serve until told to stop.
fn run(
    config: Config,
    links: Option<crate::shell::links::LinkSetup>,
    peer_delay: Option<Duration>,
    bound: std_mpsc::Sender<io::Result<Vec<(SocketAddr, String)>>>,
    stop: oneshot::Receiver<()>,
    requests: mpsc::UnboundedReceiver<std_mpsc::Sender<BrokerStats>>,
    latest: Arc<Mutex<BrokerStats>>,
) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let served = local.block_on(&rt, async move {
        let mut server = match Server::bind(config).await {
            Ok(s) => s,
            Err(e) => {
                let _ = bound.send(Err(io::Error::new(e.kind(), e.to_string())));
                return Err(e);
            }
        };
        if let Some(l) = links {
            server.set_links(l);
        }
        if let Some(d) = peer_delay {
            server.delay_peer_start(d);
        }
        server.set_monitor(move |snap| monitor(snap, requests, latest));
        let _ = bound.send(Ok(server.local_listeners()));
        server
            .run(async move {
                // A dropped handle (sender gone) stops the broker too.
                let _ = stop.await;
            })
            .await
    });
    // Dropping the runtime and the LocalSet drops the broker's tasks and so
    // the core, which closes (flushes) the store, before the thread ends.
    drop(local);
    drop(rt);
    served
}

/// Beside the broker: answer stats requests with a fresh snapshot, and
/// publish one every [`REFRESH`] for [`BrokerHandle::latest_stats`].
async fn monitor(
    snap: SnapshotFn,
    mut requests: mpsc::UnboundedReceiver<std_mpsc::Sender<BrokerStats>>,
    latest: Arc<Mutex<BrokerStats>>,
) {
    let publish = |s: &BrokerStats| {
        *latest.lock().unwrap_or_else(|e| e.into_inner()) = s.clone();
    };
    let mut tick = tokio::time::interval(REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = requests.recv() => match r {
                Some(answer) => {
                    let s = BrokerStats::from_snapshot(snap());
                    publish(&s);
                    let _ = answer.send(s);
                }
                None => return,
            },
            _ = tick.tick() => publish(&BrokerStats::from_snapshot(snap())),
        }
    }
}

impl BrokerHandle {
    /// The bound addresses (real ports when port 0 was asked for), in
    /// listener order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners.iter().map(|(a, _)| *a).collect()
    }

    /// Each bound address with its kind (`mqtt`, `mqtt+tls`, `websockets`...).
    pub fn local_listeners(&self) -> &[(SocketAddr, String)] {
        &self.listeners
    }

    /// Fresh figures, taken on the broker thread now (waits for it to
    /// answer, at most a second; then, or if the thread has ended, the
    /// latest figures it published).
    pub fn stats(&self) -> BrokerStats {
        let (tx, rx) = std_mpsc::channel();
        if self.is_running() && self.requests.send(tx).is_ok() {
            if let Ok(s) = rx.recv_timeout(STATS_WAIT) {
                return s;
            }
        }
        self.latest_stats()
    }

    /// The figures the broker thread published last (every half second and
    /// on every [`BrokerHandle::stats`] call), without waiting for it.
    pub fn latest_stats(&self) -> BrokerStats {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether the broker thread is still serving.
    pub fn is_running(&self) -> bool {
        self.stop.is_some() && self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stop gracefully and wait for the broker thread: listeners close,
    /// MQTT 5 clients get DISCONNECT 0x8B (server shutting down), their
    /// writers get up to two seconds to flush, the store is closed and
    /// flushed. Returns the thread's error, if it failed while serving.
    pub fn shutdown(mut self) -> io::Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(io::Error::other("broker thread panicked")),
        }
    }
}

impl Drop for BrokerHandle {
    fn drop(&mut self) {
        if let Err(e) = self.stop_and_join() {
            tracing::warn!(error = %e, "embedded broker ended with an error");
        }
    }
}

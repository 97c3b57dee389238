//! Listeners, the timer task and graceful shutdown (each connection's task
//! is in `conn.rs`).

use super::listener::accept_loop;
use super::state::Shared;
use crate::config::Config;
use crate::core::{Broker, SecurityConfig};
use crate::security::PreparedListener;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// How long a closing connection may take to flush before it is cut.
pub(super) const FLUSH_GRACE: Duration = Duration::from_secs(2);
/// The timer task wakes at least this often.
const TICK: Duration = Duration::from_millis(250);

/// Takes a fresh snapshot of the running broker's figures (one short
/// borrow of the core), for a [`Server::set_monitor`] task.
pub type SnapshotFn = Rc<dyn Fn() -> super::prometheus::Snapshot>;

/// A task started beside the broker, on its thread (see
/// [`Server::set_monitor`]).
type Monitor = Box<dyn FnOnce(SnapshotFn) -> Pin<Box<dyn Future<Output = ()>>>>;

/// A bound broker, ready to run.
pub struct Server {
    config: Config,
    listeners: Vec<TcpListener>,
    prepared: Vec<PreparedListener>,
    security: SecurityConfig,
    /// The embedded store, opened (and recovered) by `bind`; `None` in memory.
    persist: Option<super::persist::Opened>,
    /// The metrics listener and the SIGHUP handler.
    ops: super::ops::OpsSetup,
    /// Started with the broker, aborted at shutdown (see `set_monitor`).
    monitor: Option<Monitor>,
    /// Bridges to other brokers, checked and their files read.
    bridges: Vec<crate::bridge::Prepared>,
    /// This node of a cluster, when `[cluster]` is set; the node-to-node
    /// links take it from here.
    cluster: Option<std::sync::Arc<zerofan_cluster::Cluster>>,
    /// Links to the other nodes of a cluster (see `set_links`).
    links: Option<super::links::LinkSetup>,
    /// Test-only (see `delay_peer_start`).
    peer_delay: Option<Duration>,
}

impl Server {
    /// Read the security files of `config` and bind every listener.
    pub async fn bind(config: Config) -> io::Result<Server> {
        let loaded = crate::security::load(&config)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        // Before any listener: a store that cannot be opened (or is in a
        // newer format) stops the broker here, with the store's message.
        let persist = super::persist::open(&config)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let bridges = crate::bridge::prepare(&config.bridge)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let ops = super::ops::OpsSetup::prepare(&config).await?;
        // Before the MQTT listeners: a node that cannot start or join its
        // cluster does not serve clients.
        let cluster = crate::cluster::start(&config).await?;
        let mut listeners = Vec::new();
        for l in &loaded.listeners {
            let bound =
                super::listener::bind(l.config.bind, config.listen_backlog).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot listen on {}: {e}", l.config.bind))
                })?;
            listeners.push(bound);
        }
        Ok(Server {
            config,
            listeners,
            prepared: loaded.listeners,
            security: loaded.core,
            persist,
            ops,
            monitor: None,
            bridges,
            cluster,
            links: None,
            peer_delay: None,
        })
    }

    /// This node's cluster handle, when `[cluster]` is set.
    pub fn cluster(&self) -> Option<&std::sync::Arc<zerofan_cluster::Cluster>> {
        self.cluster.as_ref()
    }

    /// The metrics listener's address, if `metrics` is set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.ops.metrics_addr()
    }

    /// `https` when the HTTP listener has TLS, else `http`.
    pub fn http_scheme(&self) -> &'static str {
        self.ops.http_scheme()
    }

    /// Where SIGHUP gets the configuration to reload (see [`super::reload`]).
    pub fn set_reloader(&mut self, reloader: super::reload::Reloader) {
        self.ops.set_reloader(reloader);
    }

    /// Run `monitor` beside the broker, on its thread, from when it starts
    /// serving until shutdown (the task is then aborted). It gets a function
    /// that takes a fresh snapshot of the broker's figures: how an embedder
    /// ([`crate::embed`]) reads statistics without a client on `$SYS`.
    pub fn set_monitor<F, Fut>(&mut self, monitor: F)
    where
        F: FnOnce(SnapshotFn) -> Fut + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        self.monitor = Some(Box::new(move |snap| Box::pin(monitor(snap))));
    }

    /// Run as one node of a cluster: route to and from the nodes `links`
    /// names (see [`super::links`]).
    pub fn set_links(&mut self, links: super::links::LinkSetup) {
        self.links = Some(links);
    }

    /// Test-only: each shard (of several) applies what the other shards
    /// send it only `delay` after it starts, as a slow shard at start-up
    /// would. Tests use it to show what a listener may serve meanwhile.
    #[doc(hidden)]
    pub fn delay_peer_start(&mut self, delay: Duration) {
        self.peer_delay = Some(delay);
    }

    /// Each bound address with its kind (`mqtt`, `mqtt+tls`,
    /// `websockets+tls`, ...).
    pub fn local_listeners(&self) -> Vec<(SocketAddr, String)> {
        self.listeners
            .iter()
            .zip(&self.prepared)
            .filter_map(|(l, p)| Some((l.local_addr().ok()?, p.config.kind())))
            .collect()
    }

    /// The addresses actually bound (real ports for port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Serve until `shutdown` completes, then disconnect everyone (MQTT 5
    /// clients get DISCONNECT 0x8B) and return. Must run inside a `LocalSet`.
    ///
    /// With `threads` above 1, shard 0 runs here and the others on threads
    /// of their own, each accepting on every listener; they stop with it.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let n = self.config.shard_count();
        if let (Some(c), None) = (&self.cluster, &self.links) {
            self.links = Some(super::claims::link_setup(c.clone()));
        }
        if n > 1 && self.links.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster node runs one thread for now: set threads = 1",
            ));
        }
        let names = self.local_listeners();
        // One store for every shard (see `persist`).
        let bridge_ids: Vec<String> = self.config.bridge.iter().map(|b| b.local_id()).collect();
        let mut stores = self
            .persist
            .take()
            .map(|p| p.split(&bridge_ids))
            .unwrap_or_default()
            .into_iter();
        let first_store = stores.next();
        // One shard: no queues, no other thread, no cross-thread cost.
        let mut meshes = if n > 1 {
            super::shards::wire(n)
        } else {
            Vec::new()
        }
        .into_iter();
        let first = meshes.next();
        // Limits that hold for the process: shared by every shard.
        let limits = (n > 1).then(|| super::limits::Limits::new(self.prepared.len()));
        let throttle = (n > 1).then(|| {
            std::sync::Arc::new(std::sync::Mutex::new(zerofan_auth::FailureTracker::new(
                self.security.throttle,
            )))
        });
        let mut others = Vec::new();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut listeners = Vec::new();
        for l in self.listeners {
            listeners.push(l.into_std()?);
        }
        for (mesh, inbox) in meshes {
            let clones = listeners
                .iter()
                .map(|l| l.try_clone())
                .collect::<io::Result<Vec<_>>>()?;
            // Shard 0 publishes `$SYS` for all of them.
            let mut config = self.config.clone();
            config.sys_interval = 0;
            let shard = Shard {
                config,
                security: self.security.clone(),
                prepared: self.prepared.clone(),
                listeners: clones,
                names: names.clone(),
                mesh: Some((mesh, inbox)),
                persist: stores.next(),
                bridges: Vec::new(),
                links: None,
                cluster: None,
                limits: limits.clone(),
                throttle: throttle.clone(),
                peer_delay: self.peer_delay,
            };
            let mut stop = stop_rx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("zerofan-shard-{}", others.len() + 1))
                .spawn(move || -> io::Result<()> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, async move {
                        let stopped = async move {
                            let _ = stop.wait_for(|s| *s).await;
                        };
                        shard.run(None, None, stopped).await
                    })
                })?;
            others.push(thread);
        }
        let shard = Shard {
            config: self.config,
            security: self.security,
            prepared: self.prepared,
            listeners,
            names,
            mesh: first,
            persist: first_store,
            bridges: self.bridges,
            links: self.links,
            cluster: self.cluster,
            limits,
            throttle,
            peer_delay: self.peer_delay,
        };
        let result = shard.run(Some(self.ops), self.monitor, shutdown).await;
        let _ = stop_tx.send(true);
        for t in others {
            match t.join() {
                Ok(Err(e)) => tracing::warn!(error = %e, "a shard stopped with an error"),
                Err(_) => tracing::error!("a shard panicked"),
                Ok(Ok(())) => {}
            }
        }
        result
    }
}

/// One shard: a core and the tasks around it, on one thread.
struct Shard {
    config: Config,
    security: SecurityConfig,
    prepared: Vec<PreparedListener>,
    listeners: Vec<std::net::TcpListener>,
    names: Vec<(SocketAddr, String)>,
    mesh: Option<(
        super::shards::Mesh,
        tokio::sync::mpsc::Receiver<super::shards::Envelope>,
    )>,
    persist: Option<super::persist::ShardStore>,
    /// Bridges run on shard 0.
    bridges: Vec<crate::bridge::Prepared>,
    /// Cluster links (one shard only).
    links: Option<super::links::LinkSetup>,
    /// The cluster node, for claims of client ids (one shard only).
    cluster: Option<std::sync::Arc<zerofan_cluster::Cluster>>,
    /// Connection limits over every shard (several shards only).
    limits: Option<std::sync::Arc<super::limits::Limits>>,
    /// The login throttle's memory, shared by every shard's core.
    throttle: Option<std::sync::Arc<std::sync::Mutex<zerofan_auth::FailureTracker>>>,
    /// Test-only (see [`Server::delay_peer_start`]).
    peer_delay: Option<Duration>,
}

impl Shard {
    /// Serve until `shutdown`; `ops` (metrics, SIGHUP) and `monitor` run on
    /// shard 0 only.
    async fn run(
        self,
        ops: Option<super::ops::OpsSetup>,
        monitor: Option<Monitor>,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        // Shard 0 starts webhooks with the HTTP server (`ops`); the
        // others post their own cores' events.
        let hooks_here = match (&ops, &self.mesh) {
            (None, Some(_)) => self.config.webhook.clone(),
            _ => Vec::new(),
        };
        // Persistent sessions are copied to `[cluster] replicas` nodes.
        let copies = self.config.cluster.as_ref().map_or(1, |c| c.replicas);
        let limits = self
            .config
            .cluster
            .as_ref()
            .map(|c| (c.max_replica_sessions, c.max_replica_bytes));
        let mut broker = Broker::new(self.config, Instant::now());
        broker.set_replicas(copies);
        if let Some((sessions, bytes)) = limits {
            broker.set_replica_limits(sessions, bytes);
        }
        broker.set_security(self.security);
        if let Some(t) = self.throttle {
            broker.share_login_throttle(t);
        }
        let durable = self.persist.map(|p| super::persist::attach(&mut broker, p));
        let (mesh, inbox) = match self.mesh {
            Some((m, rx)) => {
                broker.set_peers(crate::core::PeerId(m.me() as u16), &m.peers());
                (Some(m), Some(rx))
            }
            None => (None, None),
        };
        if self.links.is_some() {
            // Alone until the links bring nodes in.
            broker.set_peers(crate::core::PeerId(0), &[crate::core::PeerId(0)]);
        }
        let (mut shared, poll) = Shared::new(broker);
        shared.mesh = mesh;
        shared.links = self.links.as_ref().map(|l| super::links::Links::new(l.me));
        shared.limits = self.limits;
        let shared = Rc::new(shared);
        for (index, (addr, kind)) in self.names.into_iter().enumerate() {
            shared.ops.name_listener(index, addr, &kind);
        }
        let release = durable
            .map(|n| tokio::task::spawn_local(super::persist::release_loop(shared.clone(), n)));
        let mut tasks: Vec<JoinHandle<()>> = Vec::new();
        // Bridge connections count under the index past the listeners.
        tasks.extend(super::bridges::start(
            &shared,
            self.bridges,
            self.prepared.len(),
        ));
        for (index, (listener, prepared)) in
            self.listeners.into_iter().zip(self.prepared).enumerate()
        {
            let accept = accept_loop(
                shared.clone(),
                TcpListener::from_std(listener)?,
                index,
                Rc::new(prepared),
            );
            let s = shared.clone();
            tasks.push(tokio::task::spawn_local(async move {
                // A cluster node serves once it has the others' state.
                if let Some(links) = s.links.as_ref() {
                    links.ready().await;
                }
                // A shard, once every shard routes what the others restored.
                if let Some(mesh) = s.mesh.as_ref() {
                    mesh.started().await;
                }
                accept.await
            }));
        }
        let mut background: Vec<JoinHandle<()>> = Vec::new();
        if let Some(rx) = inbox {
            background.push(tokio::task::spawn_local(super::shards::inbox_loop(
                shared.clone(),
                rx,
                self.peer_delay,
            )));
            background.push(tokio::task::spawn_local(super::shards::drain_backlogs(
                shared.clone(),
            )));
            background.push(tokio::task::spawn_local(super::shards::flush_loop(
                shared.clone(),
            )));
        }
        if let Some(setup) = self.links {
            background.extend(super::links::start(&shared, setup));
        }
        if let Some(cluster) = self.cluster {
            background.extend(super::claims::start(&shared, cluster));
        }
        background.push(tokio::task::spawn_local(super::http_auth::auth_loop(
            shared.clone(),
        )));
        background.push(tokio::task::spawn_local(timer_loop(shared.clone())));
        if let Some(p) = poll {
            background.push(tokio::task::spawn_local(super::park::lot_loop(
                shared.clone(),
                p,
            )));
        }
        let busy_poll = shared.broker.borrow().config().busy_poll_us;
        let shards = shared.mesh.as_ref().map_or(1, |m| m.count());
        if busy_poll > 0 && super::spin::may_spin(shards) {
            background.push(tokio::task::spawn_local(super::spin::spin_loop(
                shared.clone(),
                Duration::from_micros(busy_poll),
            )));
        }
        if let Some(ops) = ops {
            background.extend(ops.start(&shared));
        }
        if !hooks_here.is_empty() {
            background.extend(super::webhook::start_on_shard(&shared, &hooks_here));
        }
        if let Some(m) = monitor {
            let s = shared.clone();
            background.push(tokio::task::spawn_local(m(Rc::new(move || {
                super::ops::Ops::snapshot(&s)
            }))));
        }
        if let Some(release) = release {
            background.push(release);
        }
        shutdown.await;
        tracing::info!("shutting down");
        shared.ops.shutting_down.set(true);
        for t in &tasks {
            t.abort();
        }
        shared.broker.borrow_mut().shutdown(Instant::now());
        shared.dispatch();
        let deadline = Instant::now() + FLUSH_GRACE + Duration::from_secs(1);
        while !shared.conns.borrow().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for t in background {
            t.abort();
        }
        Ok(())
    }
}

async fn timer_loop(shared: Rc<Shared>) {
    loop {
        let now = Instant::now();
        let next = shared.broker.borrow().poll_timeout();
        let at = next.map_or(now + TICK, |t| t.min(now + TICK));
        tokio::time::sleep_until(at.into()).await;
        let now = Instant::now();
        if shared.mesh.is_some() {
            super::shards::exchange_figures(&shared);
        } else {
            let stats = shared.shell_stats();
            shared.broker.borrow_mut().set_shell_stats(stats);
        }
        shared.broker.borrow_mut().handle_timeout(now);
        shared.dispatch();
        super::park::sweep(&shared, now, TICK);
    }
}

/// Run a broker on the current thread until SIGINT or SIGTERM, printing
/// `zerofan listening on ADDR` for every listener once bound; writes the
/// `pid_file` and tells systemd (`NOTIFY_SOCKET`) it is ready, then
/// stopping.
pub fn run_until_signal(config: Config) -> io::Result<()> {
    run_until_signal_with(config, None)
}

/// [`run_until_signal`], reloading on SIGHUP from `reloader`; prints
/// `zerofan metrics on http://ADDR/metrics` first when metrics are served.
pub fn run_until_signal_with(
    config: Config,
    reloader: Option<super::reload::Reloader>,
) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let pid_file = config.pid_file.clone();
    local.block_on(&rt, async move {
        // Before anything tells the world the broker runs (listening
        // lines, pid file, READY=1): a SIGTERM right after is a clean stop.
        let signals = shutdown_signal();
        let mut server = Server::bind(config).await?;
        // Once bound, so a service manager that reads it finds a broker
        // accepting connections; removed when this scope ends.
        let _pid = pid_file
            .as_deref()
            .map(crate::sd_notify::PidFile::create)
            .transpose()?;
        if let Some(r) = reloader {
            server.set_reloader(r);
        }
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            if let Some(addr) = server.metrics_addr() {
                let scheme = server.http_scheme();
                writeln!(out, "zerofan metrics on {scheme}://{addr}/metrics")?;
                writeln!(out, "zerofan http on {scheme}://{addr}/")?;
            }
            for (addr, kind) in server.local_listeners() {
                writeln!(out, "zerofan listening on {addr} {kind}")?;
            }
            out.flush()?;
        }
        // `run` polls this only after its accept loops are started.
        let shutdown = async {
            crate::sd_notify::notify("READY=1");
            signals.await;
            crate::sd_notify::notify("STOPPING=1");
        };
        server.run(shutdown).await
    })
}

/// SIGINT or SIGTERM. The handlers are installed by this call, not when
/// the future is first polled: a service manager may send SIGTERM as soon
/// as it sees the pid file or READY=1, which come before that poll.
fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            match (term, int) {
                (Some(mut term), Some(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                (Some(mut term), None) => {
                    term.recv().await;
                }
                (None, Some(mut int)) => {
                    int.recv().await;
                }
                (None, None) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

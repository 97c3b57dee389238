//! The shell's operability state: readiness, per-listener connection
//! figures, reload counts, and what is prepared before the broker prints
//! that it listens (the metrics listener, the SIGHUP handler).

use super::prometheus::{ListenerFigures, Snapshot};
use super::reload::Reloader;
use super::state::Shared;
use crate::config::Config;
use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Operability state shared by the shell's tasks.
#[derive(Debug)]
pub struct Ops {
    started: Instant,
    /// Listeners are bound and the store is open.
    pub ready: Cell<bool>,
    /// Shutdown has begun (`/readyz` answers 503).
    pub shutting_down: Cell<bool>,
    pub(super) listeners: RefCell<Vec<ListenerFigures>>,
    /// Reloads that took effect.
    pub reloads_ok: Cell<u64>,
    /// Reloads refused.
    pub reloads_failed: Cell<u64>,
    /// HTTP requests turned away (too many at once).
    pub http_refused: Cell<u64>,
    /// Bearer tokens and the failure table of `/api/`.
    pub api_auth: RefCell<super::api::auth::ApiAuth>,
    /// The HTTP listener is bound to a loopback address.
    pub http_loopback: Cell<bool>,
    /// Webhooks, when configured (drained by `Shared::dispatch`).
    pub webhooks: std::cell::OnceCell<Rc<super::webhook::Webhooks>>,
    /// The other shards' webhook figures, as of the last refresh
    /// (`shards::refresh_figures`).
    pub(super) webhooks_elsewhere: RefCell<(Vec<super::webhook::WebhookFigures>, u64)>,
}

impl Default for Ops {
    fn default() -> Self {
        Ops {
            started: Instant::now(),
            ready: Cell::new(false),
            shutting_down: Cell::new(false),
            listeners: RefCell::new(Vec::new()),
            reloads_ok: Cell::new(0),
            reloads_failed: Cell::new(0),
            http_refused: Cell::new(0),
            api_auth: RefCell::default(),
            http_loopback: Cell::new(false),
            webhooks: std::cell::OnceCell::new(),
            webhooks_elsewhere: RefCell::default(),
        }
    }
}

impl Ops {
    /// Name listener `index` (its bound address and kind) for `/metrics`.
    pub fn name_listener(&self, index: usize, addr: SocketAddr, kind: &str) {
        let mut ls = self.listeners.borrow_mut();
        if ls.len() <= index {
            ls.resize(index + 1, ListenerFigures::default());
        }
        ls[index].addr = addr.to_string();
        ls[index].kind = kind.to_string();
    }

    /// Count a connection on listener `index` until the guard drops.
    pub fn track(shared: &Rc<Shared>, index: usize) -> ListenerGuard {
        {
            let mut ls = shared.ops.listeners.borrow_mut();
            if ls.len() <= index {
                ls.resize(index + 1, ListenerFigures::default());
            }
            ls[index].open += 1;
            ls[index].opened += 1;
        }
        ListenerGuard {
            shared: shared.clone(),
            index,
            limit_moved: false,
        }
    }

    /// The core's log rate limit ([`crate::core::Broker::log_gate`]) for
    /// per-client errors the shell sees: `Some(suppressed)` means log now.
    pub fn log_gate(shared: &Shared, kind: &str) -> Option<u64> {
        shared
            .broker
            .try_borrow_mut()
            .ok()?
            .log_gate(Instant::now(), kind)
    }

    /// Whether `/readyz` says ready: started, store open, not shutting
    /// down, and the listeners serve.
    pub fn is_ready(shared: &Shared) -> bool {
        shared.ops.ready.get()
            && !shared.ops.shutting_down.get()
            && shared.broker.borrow().store_figures().open
            // Not before the listeners serve (see `Mesh::started`,
            // `Links::ready`): until then connections wait in the backlog.
            && shared.mesh.as_ref().is_none_or(|m| m.serving())
            && shared.links.as_ref().is_none_or(|l| l.is_ready())
    }

    /// Gather a `/metrics` page's figures (one short borrow of the core).
    pub fn snapshot(shared: &Shared) -> Snapshot {
        let mut shell = shared.shell_stats();
        let mut others = None;
        let (metrics, gauges, store, gauges_here) = {
            let b = shared.broker.borrow();
            if let Some(o) = b.other_shards() {
                shell.add(&o.shell);
                others = Some(o.listeners.clone());
            }
            (
                b.total_metrics(),
                b.gauges(),
                b.store_figures(),
                b.shard_gauges(),
            )
        };
        let ops = &shared.ops;
        let mut listeners: Vec<ListenerFigures> = ops.listeners.borrow().clone();
        // The other shards accept on the same listeners.
        for (l, (open, opened)) in listeners.iter_mut().zip(others.unwrap_or_default()) {
            l.open += open;
            l.opened += opened;
        }
        listeners.retain(|l| !l.addr.is_empty());
        let shards = shared
            .mesh
            .as_ref()
            .map(|m| {
                let mut t = m.table();
                if let Some(mine) = t.get_mut(m.me()) {
                    mine.gauges = gauges_here.clone();
                }
                t.iter()
                    .map(|f| (f.gauges.connections, f.gauges.sessions_online))
                    .collect()
            })
            .unwrap_or_default();
        Snapshot {
            shards,
            uptime_seconds: ops.started.elapsed().as_secs_f64(),
            metrics,
            gauges,
            shell,
            store,
            listeners,
            reloads_ok: ops.reloads_ok.get(),
            reloads_failed: ops.reloads_failed.get(),
            http_refused: ops.http_refused.get(),
            api_auth: ops.api_auth.borrow().figures,
            webhooks: {
                let (mut hooks, mut lost) =
                    ops.webhooks.get().map(|w| w.figures()).unwrap_or_default();
                let elsewhere = ops.webhooks_elsewhere.borrow();
                for (h, o) in hooks.iter_mut().zip(&elsewhere.0) {
                    h.add(o);
                }
                lost += elsewhere.1;
                (hooks, lost)
            },
            bridges: shared
                .bridges
                .borrow()
                .iter()
                .map(|b| b.figures())
                .collect(),
        }
    }
}

/// Counts one open connection on a listener; dropping it uncounts it.
pub struct ListenerGuard {
    shared: Rc<Shared>,
    index: usize,
    /// The connection left for another shard with its place in the
    /// process-wide limits (see [`Self::limit_moves`]).
    limit_moved: bool,
}

impl ListenerGuard {
    /// The broker this guard counts in: a connection's task holds only its
    /// guard, not a second handle.
    pub fn shared(&self) -> &Rc<Shared> {
        &self.shared
    }

    /// The listener's index in the configuration.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The connection parks: it stays counted as open (the guard no longer
    /// uncounts it), and its listener is returned for [`Self::resume`].
    pub fn park(&mut self) -> u16 {
        let index = u16::try_from(self.index).unwrap_or(u16::MAX);
        self.index = usize::MAX;
        index
    }

    /// A parked connection on listener `index` runs again: the guard takes
    /// over its count without counting it twice.
    pub fn resume(shared: &Rc<Shared>, index: u16) -> ListenerGuard {
        ListenerGuard {
            shared: shared.clone(),
            index: index as usize,
            limit_moved: false,
        }
    }

    /// The connection moves to another shard, which takes over its place
    /// in the process-wide limits: this guard no longer uncounts it there.
    /// Counting it again on the way would let a client see the limit
    /// reached one connection early, until this shard's task ends.
    pub(super) fn limit_moves(&mut self) {
        self.limit_moved = true;
    }
}

impl std::fmt::Debug for ListenerGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerGuard")
            .field("index", &self.index)
            .finish()
    }
}

impl Drop for ListenerGuard {
    fn drop(&mut self) {
        if self.index != usize::MAX && !self.limit_moved {
            super::limits::closed(&self.shared, self.index);
        }
        if let Some(l) = self.shared.ops.listeners.borrow_mut().get_mut(self.index) {
            l.open = l.open.saturating_sub(1);
        }
    }
}

/// Set up before the broker announces its listeners: the metrics
/// listener is bound (a bad address fails startup) and SIGHUP is caught
/// (its default action would kill the process).
pub struct OpsSetup {
    metrics: Option<TcpListener>,
    api_auth: super::api::auth::ApiAuth,
    http_tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    webhooks: Option<super::webhook::Webhooks>,
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
    reloader: Option<Reloader>,
}

impl std::fmt::Debug for OpsSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpsSetup")
            .field("metrics", &self.metrics)
            .field("reloader", &self.reloader.is_some())
            .finish()
    }
}

impl OpsSetup {
    /// Bind the metrics listener of `config` (if any) and catch SIGHUP.
    pub async fn prepare(config: &Config) -> io::Result<OpsSetup> {
        let metrics = match config.http {
            // The same backlog as the MQTT listeners: a storm of scrapes or
            // API calls queues rather than being refused at 128.
            Some(addr) => Some(super::listener::bind(addr, config.listen_backlog).map_err(
                |e| io::Error::new(e.kind(), format!("cannot serve metrics on {addr}: {e}")),
            )?),
            None => None,
        };
        let loopback = config.http.is_some_and(|a| a.ip().is_loopback());
        let api_auth = super::api::auth::ApiAuth::load(config, loopback)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let http_tls = match &config.http_tls {
            Some(t) => Some(crate::security::server_config(t).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("http_tls: {e}"))
            })?),
            None => None,
        };
        let webhooks = super::webhook::Webhooks::new(&config.webhook)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        #[cfg(unix)]
        let hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot catch SIGHUP: reload disabled");
                None
            }
        };
        Ok(OpsSetup {
            metrics,
            api_auth,
            http_tls,
            webhooks,
            #[cfg(unix)]
            hangup,
            reloader: None,
        })
    }

    /// Where SIGHUP gets the new configuration from.
    pub fn set_reloader(&mut self, reloader: Reloader) {
        self.reloader = Some(reloader);
    }

    /// `https` when the HTTP listener has TLS, else `http`.
    pub fn http_scheme(&self) -> &'static str {
        if self.http_tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The metrics listener's address.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Start the HTTP server and the SIGHUP task; mark the broker ready.
    pub fn start(self, shared: &Rc<Shared>) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        let reloader = self.reloader.map(Rc::new);
        if let Some(w) = self.webhooks {
            shared.broker.borrow_mut().set_event_mask(w.mask());
            let w = Rc::new(w);
            tasks.extend(w.start());
            let _ = shared.ops.webhooks.set(w);
        }
        if let Some(l) = self.metrics {
            let loopback = l.local_addr().is_ok_and(|a| a.ip().is_loopback());
            shared.ops.http_loopback.set(loopback);
            *shared.ops.api_auth.borrow_mut() = self.api_auth;
            let admin = Rc::new(super::api::admin::Admin::new(
                shared.clone(),
                reloader.clone(),
            ));
            tasks.push(tokio::task::spawn_local(super::http::serve(
                l,
                shared.clone(),
                admin,
                self.http_tls,
            )));
        }
        #[cfg(unix)]
        if let Some(hup) = self.hangup {
            tasks.push(tokio::task::spawn_local(super::reload::sighup_loop(
                shared.clone(),
                hup,
                reloader,
            )));
        }
        shared.ops.ready.set(true);
        tasks
    }
}

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
    listeners: RefCell<Vec<ListenerFigures>>,
    /// Reloads that took effect.
    pub reloads_ok: Cell<u64>,
    /// Reloads refused.
    pub reloads_failed: Cell<u64>,
    /// HTTP requests turned away (too many at once).
    pub http_refused: Cell<u64>,
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

    /// Whether `/readyz` says ready.
    pub fn is_ready(shared: &Shared) -> bool {
        shared.ops.ready.get()
            && !shared.ops.shutting_down.get()
            && shared.broker.borrow().store_figures().open
    }

    /// Gather a `/metrics` page's figures (one short borrow of the core).
    pub fn snapshot(shared: &Shared) -> Snapshot {
        let shell = shared.shell_stats();
        let (metrics, gauges, store) = {
            let b = shared.broker.borrow();
            (b.metrics().clone(), b.gauges(), b.store_figures())
        };
        let ops = &shared.ops;
        Snapshot {
            uptime_seconds: ops.started.elapsed().as_secs_f64(),
            metrics,
            gauges,
            shell,
            store,
            listeners: ops
                .listeners
                .borrow()
                .iter()
                .filter(|l| !l.addr.is_empty())
                .cloned()
                .collect(),
            reloads_ok: ops.reloads_ok.get(),
            reloads_failed: ops.reloads_failed.get(),
            http_refused: ops.http_refused.get(),
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
        }
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
        let metrics = match config.metrics {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| {
                io::Error::new(e.kind(), format!("cannot serve metrics on {addr}: {e}"))
            })?),
            None => None,
        };
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
            #[cfg(unix)]
            hangup,
            reloader: None,
        })
    }

    /// Where SIGHUP gets the new configuration from.
    pub fn set_reloader(&mut self, reloader: Reloader) {
        self.reloader = Some(reloader);
    }

    /// The metrics listener's address.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Start the HTTP server and the SIGHUP task; mark the broker ready.
    pub fn start(self, shared: &Rc<Shared>) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        if let Some(l) = self.metrics {
            tasks.push(tokio::task::spawn_local(super::http::serve(
                l,
                shared.clone(),
            )));
        }
        #[cfg(unix)]
        if let Some(hup) = self.hangup {
            tasks.push(tokio::task::spawn_local(super::reload::sighup_loop(
                shared.clone(),
                hup,
                self.reloader,
            )));
        }
        shared.ops.ready.set(true);
        tasks
    }
}

//! Listeners, per-connection tasks, the timer task and graceful shutdown.

use super::reader::{reader_loop, ReadEnd};
use super::state::{ConnHandle, Shared};
use super::writer::writer_loop;
use crate::config::Config;
use crate::core::{Broker, ShellStats};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long a closing connection may take to flush before it is cut.
const FLUSH_GRACE: Duration = Duration::from_secs(2);
/// The timer task wakes at least this often.
const TICK: Duration = Duration::from_millis(250);

/// A bound broker, ready to run.
pub struct Server {
    config: Config,
    listeners: Vec<TcpListener>,
}

impl Server {
    /// Bind every listen address of `config`.
    pub async fn bind(config: Config) -> io::Result<Server> {
        let mut listeners = Vec::new();
        for addr in &config.listen {
            listeners.push(TcpListener::bind(addr).await?);
        }
        Ok(Server { config, listeners })
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
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let shared = Rc::new(Shared::new(Broker::new(self.config, Instant::now())));
        let mut tasks: Vec<JoinHandle<()>> = Vec::new();
        for listener in self.listeners {
            tasks.push(tokio::task::spawn_local(accept_loop(
                shared.clone(),
                listener,
            )));
        }
        let timer = tokio::task::spawn_local(timer_loop(shared.clone()));
        shutdown.await;
        tracing::info!("shutting down");
        for t in &tasks {
            t.abort();
        }
        shared.broker.borrow_mut().shutdown(Instant::now());
        shared.dispatch();
        let deadline = Instant::now() + FLUSH_GRACE + Duration::from_secs(1);
        while !shared.conns.borrow().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        timer.abort();
        Ok(())
    }
}

async fn accept_loop(shared: Rc<Shared>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tokio::task::spawn_local(connection(shared.clone(), stream, peer));
            }
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn connection(shared: Rc<Shared>, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let id = shared
        .broker
        .borrow_mut()
        .connection_opened(Instant::now(), peer);
    let handle = Rc::new(ConnHandle::default());
    shared.conns.borrow_mut().insert(id, handle.clone());
    let (rd, wr) = stream.into_split();
    let mut writer = tokio::task::spawn_local(writer_loop(shared.clone(), id, handle.clone(), wr));
    let end = reader_loop(&shared, id, &handle, rd).await;
    if end == ReadEnd::PeerClosed {
        shared
            .broker
            .borrow_mut()
            .connection_lost(Instant::now(), id);
        shared.dispatch();
        handle.write.notify_one();
    }
    if tokio::time::timeout(FLUSH_GRACE, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    if end == ReadEnd::CloseRequested {
        shared
            .broker
            .borrow_mut()
            .connection_lost(Instant::now(), id);
        shared.dispatch();
    }
    shared.conns.borrow_mut().remove(&id);
}

async fn timer_loop(shared: Rc<Shared>) {
    loop {
        let now = Instant::now();
        let next = shared.broker.borrow().poll_timeout();
        let at = next.map_or(now + TICK, |t| t.min(now + TICK));
        tokio::time::sleep_until(at.into()).await;
        let mut stats = ShellStats {
            bytes_received: shared.bytes_in.get(),
            bytes_sent: shared.bytes_out.get(),
            ..ShellStats::default()
        };
        shared.buffers.stats(&mut stats);
        {
            let mut broker = shared.broker.borrow_mut();
            broker.set_shell_stats(stats);
            broker.handle_timeout(Instant::now());
        }
        shared.dispatch();
    }
}

/// Run a broker on the current thread until SIGINT or SIGTERM, printing
/// `zerofan listening on ADDR` for every listener once bound.
pub fn run_until_signal(config: Config) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let server = Server::bind(config).await?;
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            for addr in server.local_addrs() {
                writeln!(out, "zerofan listening on {addr}")?;
            }
            out.flush()?;
        }
        server.run(shutdown_signal()).await
    })
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

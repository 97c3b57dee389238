//! The shell's side of bridges (see [`crate::bridge`]): each bridge's
//! connection into this broker is an in-memory pipe accepted like a socket
//! (a `Transport::Boxed` connection on a listener index past the
//! configured ones, so the defaults apply: no password, no ACL), so the
//! bridge is an ordinary MQTT 5 session here, with its queue, limits and
//! durability. No port is opened for it and no loopback socket is used.

use super::conn::connection;
use super::listener::Transport;
use super::state::Shared;
use crate::bridge::{BridgeStats, Prepared};
use crate::core::ConnectionMeta;
use bytes::Bytes;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::io::DuplexStream;
use tokio::task::JoinHandle;
use zerofan_client::{BoxedIo, Connector};

/// Bytes each way an in-memory pipe buffers (as a socket buffer would).
const PIPE: usize = 256 * 1024;
/// Pipes opened and not yet accepted; more at once is refused (the
/// bridge's client retries with its backoff).
const PENDING_PIPES: usize = 4;

/// Start every bridge; `listener` is the index their connections are
/// counted under (one past the configured listeners). The tasks end when
/// aborted (shutdown).
pub(super) fn start(
    shared: &Rc<Shared>,
    bridges: Vec<Prepared>,
    listener: usize,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    if bridges.is_empty() {
        return tasks;
    }
    let peer = SocketAddr::from(([127, 0, 0, 1], 0));
    for p in bridges {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<DuplexStream>(PENDING_PIPES);
        let s = shared.clone();
        tasks.push(tokio::task::spawn_local(async move {
            while let Some(stream) = rx.recv().await {
                let meta = ConnectionMeta {
                    listener,
                    identity: None,
                    ..ConnectionMeta::default()
                };
                tokio::task::spawn_local(connection(
                    s.clone(),
                    Transport::Boxed(Box::new(stream)),
                    peer,
                    meta,
                ));
            }
        }));
        let local = zerofan_client::Transport::Custom(Connector::new(move || {
            let tx = tx.clone();
            Box::pin(async move {
                let (ours, theirs) = tokio::io::duplex(PIPE);
                tx.try_send(theirs).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::WouldBlock, "broker busy")
                })?;
                Ok(Box::new(ours) as BoxedIo)
            })
        }));
        let remote = crate::bridge::remote_transport(p.config.socket_addresses(), p.tls.clone());
        let s = shared.clone();
        let notify: crate::bridge::Notify = Rc::new(move |topic: &str, payload: Bytes| {
            s.broker
                .borrow_mut()
                .publish_own(Instant::now(), topic, payload);
            s.dispatch();
        });
        let stats = Rc::new(BridgeStats::new(&p.config.name));
        shared.bridges.borrow_mut().push(stats.clone());
        tasks.push(tokio::task::spawn_local(crate::bridge::run(
            p.config, local, remote, notify, stats,
        )));
    }
    tasks.push(tokio::task::spawn_local(sys_loop(shared.clone())));
    tasks
}

/// `$SYS/broker/bridge/NAME/...` every `sys_interval` seconds.
async fn sys_loop(shared: Rc<Shared>) {
    loop {
        let every = shared.broker.borrow().config().sys_interval;
        if every == 0 {
            tokio::time::sleep(Duration::from_secs(60)).await;
            continue;
        }
        let figures: Vec<_> = shared
            .bridges
            .borrow()
            .iter()
            .map(|b| b.figures())
            .collect();
        {
            let now = Instant::now();
            let mut b = shared.broker.borrow_mut();
            for f in &figures {
                for (name, value) in f.sys() {
                    let topic = format!("$SYS/broker/bridge/{}/{name}", f.name);
                    b.publish_own(now, &topic, Bytes::from(value));
                }
            }
        }
        shared.dispatch();
        tokio::time::sleep(Duration::from_secs(every)).await;
    }
}

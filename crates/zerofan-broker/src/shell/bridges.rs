//! The shell's side of bridges (see [`crate::bridge`]): each bridge's
//! connection into this broker is a packet link driven as a connection
//! (`local_conn.rs`) on a listener index past the configured ones, so the
//! defaults apply (no password, no ACL), and the bridge is an ordinary
//! MQTT 5 session here, with its queue, limits and durability. No port is
//! opened for it, no socket is used, and no payload is copied.

use super::state::Shared;
use crate::bridge::{BridgeStats, Opener, Prepared};
use bytes::Bytes;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

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
    for p in bridges {
        let remote = crate::bridge::remote_transport(p.config.socket_addresses(), p.tls.clone());
        tasks.push(start_one(shared, p, listener, remote));
    }
    tasks.push(tokio::task::spawn_local(sys_loop(shared.clone())));
    tasks
}

/// One bridge, reaching the remote broker over `remote`.
pub(super) fn start_one(
    shared: &Rc<Shared>,
    p: Prepared,
    listener: usize,
    remote: zerofan_client::Transport,
) -> JoinHandle<()> {
    let stats = Rc::new(BridgeStats::new(&p.config.name));
    shared.bridges.borrow_mut().push(stats.clone());
    let s = shared.clone();
    let waits = stats.link_waits.clone();
    let local: Opener = Rc::new(move || super::local_conn::open(&s, listener, &waits));
    let s = shared.clone();
    let notify: crate::bridge::Notify = Rc::new(move |topic: &str, payload: Bytes| {
        s.broker
            .borrow_mut()
            .publish_own(Instant::now(), topic, payload);
        s.dispatch();
    });
    let s = shared.clone();
    let run = crate::bridge::run(p.config, local, remote, notify, stats);
    tokio::task::spawn_local(async move {
        // Like a listener: what the bridge brings in must reach the
        // sessions other shards restored (see `Mesh::started`).
        if let Some(mesh) = s.mesh.as_ref() {
            mesh.started().await;
        }
        run.await
    })
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

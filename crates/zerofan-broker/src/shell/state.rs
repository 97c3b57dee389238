//! What the shell's tasks share on their one thread: the core behind a
//! `RefCell` (never borrowed across an await), each connection's waker and
//! the encoder every connection borrows for one batch.

use super::buffers::Buffers;
use crate::core::{Broker, ConnId, ConnTable, ShellStats};
use std::cell::{Cell, RefCell};
use std::task::Waker;

/// How the core's wake-ups reach a connection: its task's waker, or its
/// socket while parked (see `park.rs`), kept in `Shared::conns` itself (no
/// allocation of its own). The task looks at the core on every wake
/// (output, closing), so no other state is needed.
#[derive(Debug, Default)]
pub struct ConnHandle {
    /// The task's waker, from its last poll.
    pub waker: Option<Waker>,
    /// The socket while the connection is parked (no task then).
    pub parked: Option<std::net::TcpStream>,
    /// The parked connection's listener (for its figures when it resumes);
    /// [`ConnHandle::NEVER_PARKS`] for a TLS or WebSocket connection, which
    /// the parking sweep then skips.
    pub listener: u16,
    /// Parking sweeps since the task last ran. While parked: the quick
    /// parks it has left (see `conn.rs`) in the low two bits, and the
    /// sweeps that found it parked above them (see [`ConnHandle::parked_for`]).
    pub quiet: u8,
    /// The sweep asks the task to park.
    pub park: bool,
}

impl ConnHandle {
    /// `listener` of a connection that never parks.
    pub const NEVER_PARKS: u16 = u16::MAX;

    /// While parked: the quick parks it has left, and the parking sweeps
    /// that found it parked (at most 63).
    pub(super) fn parked_for(&self) -> (u8, u8) {
        (self.quiet & 3, self.quiet >> 2)
    }

    /// While parked: one more sweep found it parked.
    pub(super) fn swept_parked(&mut self) {
        let (fresh, sweeps) = self.parked_for();
        self.quiet = (sweeps.saturating_add(1).min(63) << 2) | fresh;
    }

    /// Keep the waker of the task polling now (cloned only when it changed).
    pub(super) fn set_waker(&mut self, waker: &Waker) {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            self.waker = Some(waker.clone());
        }
    }
}

/// Shared by every task of one broker.
pub struct Shared {
    /// The sans-IO core.
    pub broker: RefCell<Broker>,
    /// Live connections, under the core's ids (slots like the core's: see
    /// `core/slots.rs`).
    pub conns: RefCell<ConnTable<ConnHandle>>,
    /// The connection whose task is running: `dispatch` does not wake it,
    /// since it looks at its output before it next waits anyway.
    pub current: Cell<Option<ConnId>>,
    /// A connection's task ran since the busy poller last looked.
    pub activity: Cell<bool>,
    /// The busy poller's waker while it sleeps (see `spin.rs`).
    pub spinner: Cell<Option<std::task::Waker>>,
    /// Batch, scratch and chunk space, borrowed by one connection at a time.
    pub encoder: RefCell<super::writer::Encoder>,
    /// Read buffers.
    pub buffers: Buffers,
    /// Bytes read from sockets.
    pub bytes_in: Cell<u64>,
    /// Bytes written to sockets.
    pub bytes_out: Cell<u64>,
    /// Readiness, per-listener figures, reload counts (`/metrics`).
    pub ops: super::ops::Ops,
    /// Parked connections (see `park.rs`).
    pub lot: super::park::Lot,
    /// The queues to the other shards, when there are several.
    pub(super) mesh: Option<super::shards::Mesh>,
    /// The links to the other nodes, in a cluster.
    pub(super) links: Option<super::links::Links>,
    /// Connection limits counted over every shard, when there are several.
    pub(super) limits: Option<std::sync::Arc<super::limits::Limits>>,
    /// Wakes the HTTP authentication task (`http_auth.rs`).
    pub auth_wake: tokio::sync::Notify,
    /// Wakes the cluster's claim task (`claims.rs`).
    pub claim_wake: tokio::sync::Notify,
    /// Wakes the claims that wait for an old owner's copy (`claims.rs`).
    pub handover_wake: tokio::sync::Notify,
    /// This node's cluster node, for its figures (shard 0 of a cluster node).
    pub cluster: std::cell::OnceCell<std::sync::Arc<zerofan_cluster::Cluster>>,
    /// Each bridge's figures (see `bridges.rs`).
    pub bridges: RefCell<Vec<std::rc::Rc<crate::bridge::BridgeStats>>>,
    wake_scratch: RefCell<Vec<ConnId>>,
}

impl Shared {
    /// Wrap a broker; also the poller for parked connections, which the
    /// lot's task (`park::lot_loop`) runs.
    pub fn new(broker: Broker) -> (Self, Option<mio::Poll>) {
        let buffers = Buffers::new(broker.config().pool_max_retained_bytes);
        let park_after = std::time::Duration::from_millis(broker.config().park_after_ms);
        let (lot, poll) = super::park::Lot::new(park_after);
        let shared = Shared {
            broker: RefCell::new(broker),
            conns: RefCell::new(ConnTable::default()),
            current: Cell::new(None),
            activity: Cell::new(false),
            spinner: Cell::new(None),
            encoder: RefCell::default(),
            buffers,
            bytes_in: Cell::new(0),
            bytes_out: Cell::new(0),
            ops: super::ops::Ops::default(),
            lot,
            mesh: None,
            links: None,
            limits: None,
            auth_wake: tokio::sync::Notify::new(),
            claim_wake: tokio::sync::Notify::new(),
            handover_wake: tokio::sync::Notify::new(),
            cluster: std::cell::OnceCell::new(),
            bridges: RefCell::new(Vec::new()),
            wake_scratch: RefCell::new(Vec::new()),
        };
        (shared, poll)
    }

    /// The shell's own figures for `$SYS` and `/metrics`.
    pub fn shell_stats(&self) -> ShellStats {
        let (parked, parks) = self.lot.figures();
        let mut stats = ShellStats {
            bytes_received: self.bytes_in.get(),
            bytes_sent: self.bytes_out.get(),
            connections_parked: parked,
            connection_parks: parks,
            ..ShellStats::default()
        };
        self.buffers.stats(&mut stats);
        if let Some(links) = &self.links {
            links.stats_into(&mut stats);
        }
        if let Some(mesh) = &self.mesh {
            stats.shard_start_timeouts = mesh.start_timeouts();
        }
        if let Some(c) = self.cluster.get() {
            stats.cluster_members = c.member_count() as u64;
            stats.cluster_leader_changes = c.leader_changes();
            stats.cluster_replication_lag =
                c.replication_lag().values().copied().max().unwrap_or(0);
            stats.cluster_claims = c.claims();
            stats.cluster_tls_refused = c.tls_refused();
            stats.cluster_lease_expiries = c.lease_expiries();
            stats.cluster_lost_handed = c.lost_handed();
        }
        if let Ok(b) = self.broker.try_borrow() {
            let (images, bytes) = b.replica_images();
            stats.cluster_replica_images = images as u64;
            stats.cluster_replica_bytes = bytes as u64;
        }
        stats
    }

    /// Hand what the core has for other shards to their inboxes.
    pub(super) fn send_to_peers(&self, mesh: &super::shards::Mesh) {
        loop {
            let batch = self.broker.borrow_mut().poll_peer_transmit();
            let Some(batch) = batch else {
                return;
            };
            let (full, back) = mesh.send_batch(batch);
            if let Some(full) = full {
                self.broker.borrow_mut().set_peer_congested(full, true);
            }
            if let Some(back) = back {
                self.broker.borrow_mut().reuse_peer_batch(back);
            }
        }
    }

    /// Wake the task of every connection the core touched (new output, or
    /// closing) since the last call.
    pub fn dispatch(&self) {
        if let Some(w) = self.ops.webhooks.get() {
            w.drain(self);
        }
        if let Some(mesh) = &self.mesh {
            mesh.flush_soon();
        }
        if let Some(links) = &self.links {
            links.send_from(self);
        }
        if self.broker.borrow().has_auth_requests() {
            self.auth_wake.notify_one();
        }
        if self.broker.borrow().has_claims() {
            self.claim_wake.notify_one();
        }
        if self.broker.borrow_mut().take_handover_news() {
            self.handover_wake.notify_waiters();
        }
        let mut ids = std::mem::take(&mut *self.wake_scratch.borrow_mut());
        self.broker.borrow_mut().take_wakeups(&mut ids);
        if ids.is_empty() {
            *self.wake_scratch.borrow_mut() = ids;
            return;
        }
        {
            let conns = self.conns.borrow();
            let current = self.current.get();
            for id in ids.drain(..) {
                if Some(id) == current {
                    continue;
                }
                let Some(h) = conns.get(&id) else {
                    continue;
                };
                if h.parked.is_some() {
                    self.lot.want(id);
                } else if let Some(w) = &h.waker {
                    w.wake_by_ref();
                }
            }
        }
        *self.wake_scratch.borrow_mut() = ids;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_connection_handle_is_24_bytes() {
        // One per connection, in a 32-byte slot of the shell's connection
        // table with its generation: the socket of a parked connection is
        // kept here, not in a task.
        assert_eq!(std::mem::size_of::<super::ConnHandle>(), 24);
        assert_eq!(crate::core::ConnTable::<super::ConnHandle>::SLOT_BYTES, 32);
    }
}

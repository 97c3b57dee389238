//! A cluster node's ownership lease, as the core sees it: the node serves
//! the client ids it claimed through the cluster only while it holds the
//! lease (see `zerofan_cluster`'s `lease` module for why that keeps one
//! owner per client id across a partition). When the lease runs out, every
//! connection whose client id was claimed is dropped (MQTT 5: DISCONNECT
//! 0x9C Use another server, as 0x88 Server unavailable is not allowed in a
//! DISCONNECT; 3.1.1: closed), and CONNECTs are refused with 0x88 (3.1.1:
//! return code 3) until it is renewed.
//!
//! The cluster says so from its own task, which may run after others: a
//! node that was paused (SIGSTOP) wakes up with messages for its clients
//! queued on its links while its sessions were served elsewhere. So the
//! core also knows when the lease ends ([`Lease::renewed`]) and drops the
//! clients itself at the first event past it, before it delivers anything.
//!
//! An acknowledgement that stopped waiting for its replicas because every
//! one it was sent to went away ([`Lease::hold_skipped`]) waits instead for
//! a renewal sent after that: a node cut off from the others sees them all
//! away, and would acknowledge on the strength of its own disk what the
//! node that takes its sessions over never gets. Renewed, the node is not
//! cut off (the replicas are what is away): it goes. Lost, it is refused.
//! One that a reachable replica has goes at once.

use super::ids::ConnId;
use super::replica::Waiter;
use std::collections::{HashSet, VecDeque};
use std::time::Instant;

#[derive(Debug, Default)]
pub(crate) struct Lease {
    lost: bool,
    /// Connections whose client id the cluster gave this node. Bounded by
    /// the connections: each is forgotten when it closes.
    claimed: HashSet<ConnId>,
    /// When the lease runs out, as the cluster last renewed it.
    until: Option<Instant>,
    /// Lost because `until` passed, not because the cluster said so.
    overdue: bool,
    /// Answers released because a replica was away, and since when, in
    /// order. Bounded by the answers owed (acknowledgements per connection
    /// are bounded).
    skipped: VecDeque<(Instant, Waiter)>,
}

impl Lease {
    pub(crate) fn lost(&self) -> bool {
        self.lost
    }

    pub(crate) fn claimed(&mut self, conn: ConnId) {
        self.claimed.insert(conn);
    }

    pub(crate) fn forget(&mut self, conn: ConnId) {
        self.claimed.remove(&conn);
    }

    /// The lease is `held` or not: the connections to drop now (those
    /// claimed, when it was just lost), in a stable order.
    pub(crate) fn set(&mut self, held: bool) -> Vec<ConnId> {
        self.overdue = false;
        let was_lost = std::mem::replace(&mut self.lost, !held);
        if held || was_lost {
            return Vec::new();
        }
        let mut conns: Vec<ConnId> = self.claimed.drain().collect();
        conns.sort_unstable();
        conns
    }

    /// The cluster renewed the lease until `until`, by a renewal sent at
    /// `sent`. True when the lease was lost only because the last renewal
    /// had passed: it is held again (`set(true)`). With it, the answers
    /// held since before `sent`, to release.
    pub(crate) fn renewed(
        &mut self,
        sent: Instant,
        until: Instant,
        now: Instant,
    ) -> (bool, Vec<Waiter>) {
        self.until = Some(until);
        let back = self.overdue && now < until;
        let mut free = Vec::new();
        while self.skipped.front().is_some_and(|(at, _)| *at <= sent) {
            if let Some((_, w)) = self.skipped.pop_front() {
                free.push(w);
            }
        }
        (back, free)
    }

    /// Answers the replicas released, in order, from `alone` on with no
    /// replica having them (all away): those are held until a renewal sent
    /// after `now`, and so is any behind answers held already, to keep
    /// their order. Returns what goes now; without a lease (no cluster),
    /// all of it.
    pub(crate) fn hold_skipped(
        &mut self,
        now: Instant,
        mut ready: Vec<Waiter>,
        alone: Option<usize>,
    ) -> Vec<Waiter> {
        if self.until.is_none() {
            return ready;
        }
        let go = if self.skipped.is_empty() {
            alone.unwrap_or(ready.len()).min(ready.len())
        } else {
            0
        };
        let held = ready.split_off(go);
        self.skipped.extend(held.into_iter().map(|w| (now, w)));
        ready
    }

    /// Whether answers to `conn` wait for a renewal: what follows for it
    /// waits behind them.
    #[inline]
    pub(crate) fn holds(&self, conn: ConnId) -> bool {
        self.skipped
            .iter()
            .any(|(_, w)| matches!(w, Waiter::Ack(c, _) if *c == conn))
    }

    /// Hold `w` behind the answers waiting for a renewal, until one sent
    /// after `now`.
    pub(crate) fn hold_behind(&mut self, now: Instant, w: Waiter) {
        self.skipped.push_back((now, w));
    }

    /// The lease is lost: the answers held for a renewal, to refuse.
    pub(crate) fn take_skipped(&mut self) -> Vec<Waiter> {
        self.skipped.drain(..).map(|(_, w)| w).collect()
    }

    /// Whether the lease ran out at `now` and the clients are still here:
    /// then they go ([`Lease::expire`]).
    #[inline]
    pub(crate) fn overdue(&self, now: Instant) -> bool {
        !self.lost && self.until.is_some_and(|u| now >= u)
    }

    /// The lease ran out before the cluster said so: the connections to
    /// drop.
    pub(crate) fn expire(&mut self) -> Vec<ConnId> {
        let conns = self.set(false);
        self.overdue = true;
        conns
    }
}

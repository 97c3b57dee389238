//! Ownership leases: never two owners of a client id, also across a
//! partition.
//!
//! A node serves the client ids it owns only while it holds a lease. It
//! renews the lease every `lease / 8`, and at once when it learns of a new
//! leader (a leader's death must not cost the survivors their leases: the
//! election takes up to 1.2 s, see `raft_config`): it notes its own clock
//! at `t_s`, then asks the leader, which answers only once fresh
//! heartbeats, sent after
//! the request arrived, were acknowledged by a quorum (openraft's
//! `get_read_log_id`). The lease then runs until `t_s + lease` on the
//! node's clock. A node that cannot renew (cut off from the majority, or
//! from every leader) drops its clients when the lease runs out and refuses
//! new CONNECTs until it renews again.
//!
//! Before a leader commits a claim that takes a client id from another
//! node, that node must have let go of it: either it answered a `Fence`
//! request (its connection is dropped before it answers, see
//! [`FENCE_TIMEOUT`]), or its lease must have run out: at
//! `start + grant_after(lease)` on the leader's clock, where `start` is the
//! later of the last renewal this leader answered for that node and the
//! moment it became leader. Why that is late enough:
//!
//! - If this leader answered the node's last renewal at `a`, the node sent
//!   it at `t_s` before `a` (in real time), so its lease ends before real
//!   time `a + lease·(1+ρ)`, ρ bounding how much faster or slower one
//!   node's clock runs than real time.
//! - If an earlier leader answered it, that leader had it confirmed by a
//!   quorum after `t_s`. Some node of that quorum also voted for this
//!   leader, and acknowledged the old leader's heartbeat before that vote
//!   (after it, it would refuse the old term). So `t_s` comes before this
//!   leader's election, and the lease ends before `election + lease·(1+ρ)`.
//! - The leader waits `grant_after` on its own clock: at least
//!   `grant_after·(1−ρ)` of real time. `grant_after = lease·9/8 + 100 ms`
//!   covers ρ up to 5% (real clocks are within 0.01%); the 100 ms is for
//!   the broker to act on the expiry.
//! - A claim due within [`CLAIM_HOLD`] waits on the leader and is checked
//!   again when due (same leader, same term), then committed: only ever
//!   later than the wait, never earlier.
//!
//! Merely having heard from the owner recently is not enough: it may be cut
//! off the moment after, before it learns of the claim, and serve on
//! until its lease runs out (the simulation in `sim.rs` shows it).
//!
//! Not covered: two claims of one client id racing through the leader at
//! once (the client connecting to two nodes in the same instant); the log
//! orders them and the loser's node drops the connection when it applies
//! the later claim, within a heartbeat, as before leases.

use crate::types::Raft;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::{timeout, Instant};

/// The default lease. A client id of a dead node is taken over
/// `grant_after` (2.9 s) after the election that follows its death (0.9–1.2 s
/// when it led), so under 5 s; the survivors renew within an election and
/// a renewal period (1.5 s at most), a second of room for a loaded machine.
pub const DEFAULT_LEASE: Duration = Duration::from_millis(2500);
/// Shortest lease accepted. Below about 1.5 s, the death of a leader makes
/// every node drop its clients before a new leader renews their leases.
pub const MIN_LEASE: Duration = Duration::from_secs(1);
/// How long a leader holds a claim whose takeover is due this soon, rather
/// than refusing it (the claimant would retry): it is answered the moment
/// the old owner's lease must have run out. Well within the 2 s a
/// forwarded claim waits for its answer.
pub(crate) const CLAIM_HOLD: Duration = Duration::from_secs(1);
/// How long a leader waits for the owner to answer a `Fence` before it
/// falls back on the owner's lease.
pub(crate) const FENCE_TIMEOUT: Duration = Duration::from_millis(500);

/// How long after `start` a leader may take a client id from a node out of
/// touch (see the module doc).
pub fn grant_after(lease: Duration) -> Duration {
    lease * 9 / 8 + Duration::from_millis(100)
}

/// How often a node renews its lease.
pub(crate) fn renew_every(lease: Duration) -> Duration {
    lease / 8
}

/// How long one renewal may take: longer than the period, so that a slow
/// quorum on a loaded machine still renews (the next one starts late).
pub(crate) fn renew_within(lease: Duration) -> Duration {
    lease / 4
}

/// This node's own lease.
#[derive(Debug)]
pub(crate) struct Holder {
    lease: Duration,
    until: Option<Instant>,
    /// Tests: renewals no longer count (see [`Holder::lapse`]).
    #[cfg(test)]
    lapsed: bool,
}

impl Holder {
    pub(crate) fn new(lease: Duration) -> Holder {
        Holder {
            lease,
            until: None,
            #[cfg(test)]
            lapsed: false,
        }
    }

    /// Tests: the lease runs out now and is never renewed again, as for a
    /// node that hears no majority (without losing the one that carries
    /// the test's claims).
    #[cfg(test)]
    pub(crate) fn lapse(&mut self) {
        self.until = None;
        self.lapsed = true;
    }

    /// A renewal sent at `sent` was confirmed.
    pub(crate) fn renewed(&mut self, sent: Instant) {
        #[cfg(test)]
        if self.lapsed {
            return;
        }
        let until = sent + self.lease;
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }

    pub(crate) fn held(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| now < u)
    }

    pub(crate) fn until(&self) -> Option<Instant> {
        self.until
    }
}

/// What a leader knows of the leases it renewed.
#[derive(Debug)]
pub(crate) struct Grants {
    lease: Duration,
    /// The term this node leads and since when.
    leading: Option<(u64, Instant)>,
    /// Per member: when this leader last answered its renewal. Bounded by
    /// the membership (only members are answered).
    answered: HashMap<u64, Instant>,
}

impl Grants {
    pub(crate) fn new(lease: Duration) -> Grants {
        Grants {
            lease,
            leading: None,
            answered: HashMap::new(),
        }
    }

    /// Follow this node's role: leading `term` (`None`: not leading). A new
    /// term starts afresh: renewals answered before count from it.
    pub(crate) fn role(&mut self, leading: Option<u64>, now: Instant) {
        match (leading, self.leading) {
            (Some(t), Some((held, _))) if t == held => {}
            (Some(t), _) => {
                self.leading = Some((t, now));
                self.answered.clear();
            }
            (None, _) => {
                self.leading = None;
                self.answered.clear();
            }
        }
    }

    /// This leader confirmed `node`'s renewal at `now` (recorded after the
    /// quorum answered: late is safe, it only moves the grant later).
    pub(crate) fn answered(&mut self, node: u64, now: Instant) {
        if self.leading.is_some() {
            self.answered.insert(node, now);
        }
    }

    /// Whether a claim may take a client id from `owner` (which did not
    /// answer a fence) now: `Err(wait)` while its lease may still run.
    pub(crate) fn takeover(&self, owner: u64, now: Instant) -> Result<(), Duration> {
        let Some((_, since)) = self.leading else {
            return Err(grant_after(self.lease));
        };
        let start = self.answered.get(&owner).map_or(since, |a| since.max(*a));
        let at = start + grant_after(self.lease);
        if now >= at {
            Ok(())
        } else {
            Err(at - now)
        }
    }

    pub(crate) fn forget(&mut self, node: u64) {
        self.answered.remove(&node);
    }
}

/// The node a claim by `claimant`, committed by `leader`, takes a client
/// id from, when it must let go first (the leader applies the claim, and
/// drops its own connection, at commit).
pub(crate) fn must_fence(leader: u64, owner: Option<u64>, claimant: u64) -> Option<u64> {
    owner.filter(|&o| o != claimant && o != leader)
}

/// The leader's side of a renewal: confirm leadership with a quorum
/// (heartbeats sent after this call), within `within`.
pub(crate) async fn confirm(raft: &Raft, within: Duration) -> bool {
    matches!(timeout(within, raft.get_read_log_id()).await, Ok(Ok(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_runs_from_when_its_renewal_was_sent() {
        let t0 = Instant::now();
        let mut h = Holder::new(Duration::from_secs(3));
        assert!(!h.held(t0), "no lease before the first renewal");
        h.renewed(t0);
        // A late answer to an older request does not shorten it.
        h.renewed(t0 - Duration::from_secs(1));
        assert_eq!(h.until(), Some(t0 + Duration::from_secs(3)));
        assert!(h.held(t0 + Duration::from_millis(2999)));
        assert!(!h.held(t0 + Duration::from_secs(3)));
    }

    #[test]
    fn a_takeover_from_a_silent_node_waits_for_its_lease() {
        let lease = Duration::from_secs(3);
        let t0 = Instant::now();
        let mut g = Grants::new(lease);
        assert!(g.takeover(2, t0).is_err(), "not leading");
        g.role(Some(5), t0);
        // Never renewed here: counted from the election.
        let wait = g.takeover(2, t0).unwrap_err();
        assert_eq!(wait, grant_after(lease));
        // Renewed at t0 + 1 s: counted from then.
        g.answered(2, t0 + Duration::from_secs(1));
        let now = t0 + Duration::from_secs(2);
        assert_eq!(
            g.takeover(2, now).unwrap_err(),
            grant_after(lease) - Duration::from_secs(1)
        );
        let done = t0 + Duration::from_secs(1) + grant_after(lease);
        assert_eq!(g.takeover(2, done), Ok(()));
        // A new term starts afresh.
        g.role(Some(6), done);
        assert!(g.takeover(2, done).is_err());
        assert_eq!(must_fence(1, Some(2), 3), Some(2));
        assert_eq!(must_fence(1, Some(1), 3), None, "the leader itself");
        assert_eq!(must_fence(1, Some(3), 3), None, "already the claimant's");
        assert_eq!(must_fence(1, None, 3), None);
        assert!(grant_after(lease) * 95 / 100 > lease * 105 / 100);
    }
}

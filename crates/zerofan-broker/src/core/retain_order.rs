//! An order of retained-message changes that every node agrees on, so that
//! nodes which changed the same topic on both sides of a partition keep
//! the same message once they hear of each other again (last writer wins
//! by this order, not by arrival order).
//!
//! Each change carries a [`Stamp`]: a hybrid logical clock (milliseconds
//! of wall time in the high 48 bits, a counter in the low 16; never below
//! anything this node has seen, so a change made after hearing of another
//! orders after it) and the node id, which breaks ties. A clear (empty
//! payload) keeps its stamp as a tombstone, so that an older set arriving
//! late does not bring the topic back.
//!
//! Without a cluster (no node id, no wall clock given) stamps still order
//! the changes a node makes, which is all one node needs.
//!
//! `$SYS/` is not synchronised at all: each node's figures are about
//! itself, kept in its own store and never sent as retained changes, as a
//! mosquitto broker's are its own. Other `$` topics a client may publish
//! are ordinary retained messages and converge like any.

use std::collections::HashMap;
use std::time::Instant;

/// Where a retained change sits in the cluster-wide order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp {
    /// Hybrid logical clock: wall milliseconds << 16 | counter.
    pub hlc: u64,
    /// The node that made the change (0 outside a cluster).
    pub node: u64,
}

/// Topics with a stamp kept; past it a new topic's change is applied
/// without one (counted), and a late older change to it could win.
pub(crate) const MAX_STAMPS: usize = 1 << 20;

#[derive(Debug, Default)]
pub(crate) struct RetainOrder {
    node: u64,
    /// The wall clock (Unix ms) at an instant, given by the shell.
    anchor: Option<(Instant, u64)>,
    clock: u64,
    stamps: HashMap<Box<str>, Stamp>,
    /// Changes applied without a stamp kept (table full).
    pub(crate) unstamped: u64,
}

impl RetainOrder {
    /// This node's id and the wall clock at `now` (Unix ms).
    pub(crate) fn set_node(&mut self, node: u64, now: Instant, unix_ms: u64) {
        self.node = node;
        self.anchor = Some((now, unix_ms));
    }

    fn wall(&self, now: Instant) -> u64 {
        self.anchor.map_or(0, |(at, ms)| {
            let since = now.saturating_duration_since(at).as_millis();
            (ms + u64::try_from(since).unwrap_or(u64::MAX - ms)) << 16
        })
    }

    /// The stamp of a change made here now (the caller records it with
    /// [`RetainOrder::admit`]).
    pub(crate) fn local(&mut self, now: Instant) -> Stamp {
        self.clock = self.wall(now).max(self.clock.saturating_add(1));
        Stamp {
            hlc: self.clock,
            node: self.node,
        }
    }

    /// A change to `topic` stamped `stamp` (made here or heard of): whether
    /// it is the newest seen for the topic and must be applied. The clock
    /// moves past it either way.
    pub(crate) fn admit(&mut self, topic: &str, stamp: Stamp) -> bool {
        self.clock = self.clock.max(stamp.hlc);
        let full = self.stamps.len() >= MAX_STAMPS;
        match self.stamps.get_mut(topic) {
            Some(kept) if *kept > stamp => false,
            Some(kept) => {
                *kept = stamp;
                true
            }
            None if full => {
                self.unstamped += 1;
                true
            }
            None => {
                self.stamps.insert(topic.into(), stamp);
                true
            }
        }
    }

    /// The stamp of the change `topic` last took (zero: older than any).
    pub(crate) fn stamp_of(&self, topic: &str) -> Stamp {
        self.stamps.get(topic).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stamps_order_by_clock_then_node_and_never_go_back() {
        let t0 = Instant::now();
        let mut a = RetainOrder::default();
        let mut b = RetainOrder::default();
        a.set_node(1, t0, 1_000);
        // B's wall clock is 5 s behind A's.
        b.set_node(2, t0, 500);
        let s1 = a.local(t0);
        let s2 = a.local(t0);
        assert!(s2 > s1, "same millisecond: the counter moves");
        assert!(a.admit("t", s2));
        assert!(!a.admit("t", s1), "an older change loses");
        // B hears of A's change, then makes its own: it orders after, even
        // with a slower wall clock.
        assert!(b.admit("t", s2));
        let s3 = b.local(t0 + Duration::from_millis(1));
        assert!(s3 > s2);
        // Equal clocks: the node id decides.
        let x = Stamp { hlc: 7, node: 1 };
        let y = Stamp { hlc: 7, node: 2 };
        assert!(a.admit("u", y));
        assert!(!a.admit("u", x));
        assert_eq!(a.stamp_of("u"), y);
        assert_eq!(a.stamp_of("none"), Stamp::default());
    }
}

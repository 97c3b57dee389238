//! A batch too large for one link frame comes in parts
//! ([`super::frame_parts`]): a copy sent to a claimant (the answer to
//! `PeerEvent::CopyWanted`), or the records of a session a new owner
//! installed from a copy, of a session of about 256 MiB (queue limits
//! raised far above their defaults). Unlike full images to a replica
//! (`image_batches`), such a batch cannot be applied part by part: a
//! claimant judges a copy as a whole against its own (`previous`: the
//! epoch and version that lead its first part), and a replica keys a
//! session's version to whole batches. So the parts are kept here and go
//! on as the one batch they were when the last arrives; only that one is
//! answered (an answer covers every change up to its own).
//!
//! A link delivers a sender's parts in order with nothing between them
//! (they leave in one event). A part out of order (its sender restarted
//! or left between two) or past the bound drops what was kept, counted
//! and logged, and is answered all the same: a sender must not wait
//! forever, and one that restarted has nothing waiting on it any more.

use super::{PeerId, ReplOp};
use crate::core::hash::HashMap;

/// Bytes of one sender's held parts past which they are dropped. A batch
/// this large holds about one session's queue (`max_queued_bytes`, 64 MiB
/// by default); this leaves room for queue limits raised far above that.
pub(super) const MAX_HELD: usize = 4 << 30;

/// What a batch from a link is, parts considered.
#[derive(Debug)]
pub(crate) enum Joined {
    /// A whole batch: a plain one, or every part of one, in order,
    /// without their marks.
    Whole(Vec<ReplOp>),
    /// A part, kept until the last one; not answered.
    Held,
    /// A part that does not follow the ones held: it and they are gone.
    Dropped,
}

/// The parts held per sender, and how many batches were dropped.
#[derive(Debug, Default)]
pub(crate) struct Parts {
    held: HashMap<PeerId, Held>,
    dropped: u64,
}

#[derive(Debug, Default)]
struct Held {
    /// The index the next part must have.
    next: u32,
    bytes: usize,
    ops: Vec<ReplOp>,
}

impl Parts {
    /// `ops`, a batch `from` sent, joined with the parts held before it.
    pub(crate) fn join(&mut self, from: PeerId, ops: Vec<ReplOp>) -> Joined {
        self.join_at(from, ops, MAX_HELD)
    }

    fn join_at(&mut self, from: PeerId, ops: Vec<ReplOp>, max: usize) -> Joined {
        let Some(&ReplOp::Part { index, last }) = ops.first() else {
            return Joined::Whole(ops);
        };
        if index == 0 {
            // An earlier batch left unfinished is superseded.
            if self.held.insert(from, Held::default()).is_some() {
                self.dropped += 1;
            }
        }
        let bytes: usize = ops.iter().map(ReplOp::size).sum();
        let follows = self
            .held
            .get(&from)
            .is_some_and(|h| h.next == index && h.bytes + bytes <= max);
        if !follows {
            self.held.remove(&from);
            self.dropped += 1;
            tracing::warn!(
                ?from,
                index,
                "a part of a batch out of order or past its bound: dropped"
            );
            return Joined::Dropped;
        }
        let Some(h) = self.held.get_mut(&from) else {
            return Joined::Dropped;
        };
        h.ops.extend(ops.into_iter().skip(1));
        h.bytes += bytes;
        h.next = h.next.saturating_add(1);
        if !last {
            return Joined::Held;
        }
        match self.held.remove(&from) {
            Some(h) => Joined::Whole(h.ops),
            None => Joined::Dropped,
        }
    }

    /// `peer` restarted or left: what it sent of a batch will not be
    /// finished.
    pub(crate) fn forget(&mut self, peer: PeerId) {
        if self.held.remove(&peer).is_some() {
            self.dropped += 1;
        }
    }

    /// Batches dropped unfinished since the last call.
    pub(crate) fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(index: u32, last: bool, clients: &[&str]) -> Vec<ReplOp> {
        let mut ops = vec![ReplOp::Part { index, last }];
        ops.extend(clients.iter().map(|c| ReplOp::Drop {
            client: (*c).into(),
        }));
        ops
    }

    fn clients(j: Joined) -> Vec<String> {
        match j {
            Joined::Whole(ops) => ops
                .iter()
                .map(|op| op.client().unwrap_or("?").to_owned())
                .collect(),
            other => panic!("not whole: {other:?}"),
        }
    }

    #[test]
    fn parts_in_order_go_on_as_one_batch_and_plain_batches_pass() {
        let (a, b) = (PeerId(1), PeerId(2));
        let mut p = Parts::default();
        assert_eq!(
            clients(p.join(a, part(0, false, &["x"])[1..].to_vec())),
            ["x"]
        );
        assert!(matches!(p.join(a, part(0, false, &["a0"])), Joined::Held));
        // Another sender's parts are apart.
        assert!(matches!(p.join(b, part(0, false, &["b0"])), Joined::Held));
        assert!(matches!(
            p.join(a, part(1, false, &["a1", "a2"])),
            Joined::Held
        ));
        assert_eq!(
            clients(p.join(a, part(2, true, &["a3"]))),
            ["a0", "a1", "a2", "a3"]
        );
        assert_eq!(clients(p.join(b, part(1, true, &["b1"]))), ["b0", "b1"]);
        assert_eq!(p.take_dropped(), 0);
    }

    #[test]
    fn a_part_out_of_order_or_past_the_bound_drops_the_batch() {
        let a = PeerId(1);
        let mut p = Parts::default();
        // Missing its first part.
        assert!(matches!(p.join(a, part(1, true, &["x"])), Joined::Dropped));
        // A gap.
        assert!(matches!(p.join(a, part(0, false, &["x"])), Joined::Held));
        assert!(matches!(p.join(a, part(2, true, &["y"])), Joined::Dropped));
        // Nothing held any more: its last part alone is dropped too.
        assert!(matches!(p.join(a, part(1, true, &["y"])), Joined::Dropped));
        assert_eq!(p.take_dropped(), 3);
        // A new batch supersedes one left unfinished.
        assert!(matches!(p.join(a, part(0, false, &["x"])), Joined::Held));
        assert!(matches!(p.join(a, part(0, false, &["z"])), Joined::Held));
        assert_eq!(clients(p.join(a, part(1, true, &["w"]))), ["z", "w"]);
        assert_eq!(p.take_dropped(), 1);
        // Past the bound (each op counts 32 bytes).
        assert!(matches!(
            p.join_at(a, part(0, false, &["x"]), 100),
            Joined::Held
        ));
        assert!(matches!(
            p.join_at(a, part(1, true, &["y", "z"]), 100),
            Joined::Dropped
        ));
        // A sender gone with parts held.
        assert!(matches!(p.join(a, part(0, false, &["x"])), Joined::Held));
        p.forget(a);
        assert!(matches!(p.join(a, part(1, true, &["y"])), Joined::Dropped));
        assert_eq!(p.take_dropped(), 3);
    }
}

//! Ownership epochs on replicated changes.
//!
//! The cluster's log gives a client id to one node at a time, with an epoch
//! that rises on every claim. A node that lost a client id (cut off,
//! paused, slow to hear of the newer claim) may still send changes for its
//! session; without the epoch a replica would apply them over the copy the
//! new owner writes. So the owner names, once per batch and client id, the
//! epoch of the claim under which it owns that id (`ReplOp::Epoch`, before
//! the first change of that id), and a replica keeps the newest epoch seen
//! per client id ([`Fence`]): changes at that epoch or newer apply, older
//! ones are ignored, counted, and reported back to their sender
//! (`PeerEvent::ReplicaStale`), which treats its session as taken over.
//!
//! Epoch 0 means "not known": a session restored from the owner's own
//! store and not claimed since, or a core without a cluster log (tests).
//! Such changes apply as before epochs existed, except over a copy another
//! node wrote under a known epoch.
//!
//! The epoch known for a client id with a copy here is stored with the
//! copy and read back at start (`disk`): a copy read back has no live
//! owner yet, so changes under an older claim stay stale; changes naming
//! no epoch apply to it, as its owner's (an owner restarted from its own
//! store names none until its client claims the id again).

use super::ReplOp;
use crate::core::hash::{HashMap, HashSet};

/// The owner's side: the epoch of each client id it copies, with how many
/// batches of its changes went out under it (its version, see
/// `ReplOp::Epoch`), and which of them the batch being recorded has named
/// already.
#[derive(Debug, Default)]
pub(crate) struct Epochs {
    /// Bounded by the sessions here: set when a claim is granted, gone
    /// when the session ends or moves (see `Replication::end_epoch`).
    by_client: HashMap<Box<str>, (u64, u64)>,
    /// Client ids whose epoch the batch being recorded carries already.
    stamped: HashSet<Box<str>>,
}

impl Epochs {
    pub(super) fn set(&mut self, client: &str, epoch: u64) {
        if self.get(client) != Some(epoch) {
            // A new claim counts its batches from none; within one batch
            // its changes name it again.
            self.by_client.insert(client.into(), (epoch, 0));
            self.stamped.remove(client);
        }
    }

    pub(super) fn get(&self, client: &str) -> Option<u64> {
        self.by_client.get(client).map(|e| e.0)
    }

    /// The epoch and the version of the last batch that named it.
    pub(super) fn get_versioned(&self, client: &str) -> Option<(u64, u64)> {
        self.by_client.get(client).copied()
    }

    pub(super) fn end(&mut self, client: &str) {
        self.by_client.remove(client);
    }

    /// Before the batch's first change of `client`: its epoch, if known,
    /// and the batch's version.
    pub(super) fn stamp(&mut self, client: &str, ops: &mut Vec<ReplOp>) {
        let Some((epoch, version)) = self.by_client.get_mut(client) else {
            return;
        };
        if !self.stamped.contains(client) {
            self.stamped.insert(client.into());
            *version += 1;
            ops.push(ReplOp::Epoch {
                client: client.into(),
                epoch: *epoch,
                version: *version,
            });
        }
    }

    /// The batch was taken: the next one names its epochs again.
    pub(super) fn batch_taken(&mut self) {
        self.stamped.clear();
    }
}

/// What a replica does with one change.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Apply it (the image may have been dropped first: a newer owner).
    Apply,
    /// Older than the newest claim seen: ignore it.
    Stale,
}

/// The replica's side: the newest epoch seen per client id.
#[derive(Debug)]
pub(crate) struct Fence {
    known: HashMap<Box<str>, u64>,
    max: usize,
    /// Changes ignored as stale.
    pub(crate) stale: u64,
    /// Epochs forgotten because the table was full (only of client ids
    /// with no image here).
    pub(crate) forgotten: u64,
    /// Client ids (and the epoch their ignored changes named) to report to
    /// each sender, in the order seen.
    notices: Vec<(Box<str>, u64)>,
}

impl Default for Fence {
    fn default() -> Self {
        Fence {
            known: HashMap::default(),
            max: 2 * super::MAX_IMAGES,
            stale: 0,
            forgotten: 0,
            notices: Vec::new(),
        }
    }
}

impl Fence {
    /// Twice the images held: room for the ids whose session ended.
    pub(super) fn set_limit(&mut self, images: usize) {
        self.max = images.saturating_mul(2).max(16);
    }

    /// The newest epoch seen for `client` (0: none).
    pub(crate) fn known(&self, client: &str) -> u64 {
        self.known.get(client).copied().unwrap_or(0)
    }

    /// Judge a change of `client` at `epoch` from a sender that does
    /// (`from_owner`) or does not own the image held here (`None`: no
    /// image). Returns the verdict and whether the image must be dropped
    /// first (a newer claim by another node).
    pub(super) fn judge(
        &mut self,
        client: &str,
        epoch: u64,
        from_owner: Option<bool>,
        has_image: &dyn Fn(&str) -> bool,
    ) -> (Verdict, bool) {
        let known = self.known(client);
        if epoch == 0 {
            // Not known to its sender: as before epochs, unless another
            // node wrote (or ended) the copy under a known claim.
            if known > 0 && from_owner != Some(true) {
                self.stale += 1;
                return (Verdict::Stale, false);
            }
            return (Verdict::Apply, false);
        }
        if epoch < known {
            self.stale += 1;
            if !self
                .notices
                .iter()
                .any(|(c, e)| &**c == client && *e == epoch)
            {
                self.notices.push((client.into(), epoch));
            }
            return (Verdict::Stale, false);
        }
        if epoch > known {
            self.raise(client, epoch, has_image);
            return (Verdict::Apply, from_owner == Some(false));
        }
        (Verdict::Apply, false)
    }

    /// This node itself was granted `client` at `epoch`.
    pub(super) fn claimed(&mut self, client: &str, epoch: u64, has_image: &dyn Fn(&str) -> bool) {
        if epoch > self.known(client) {
            self.raise(client, epoch, has_image);
        }
    }

    /// A copy of `client` read back from disk was stored under `epoch`.
    pub(super) fn read_back(&mut self, client: &str, epoch: u64, has_image: &dyn Fn(&str) -> bool) {
        self.claimed(client, epoch, has_image);
    }

    fn raise(&mut self, client: &str, epoch: u64, has_image: &dyn Fn(&str) -> bool) {
        if !self.known.contains_key(client) && self.known.len() >= self.max {
            // Full: forget the ids with no copy here (their session ended
            // or moved); a stale change of one may then start an image
            // again, as before epochs.
            let before = self.known.len();
            self.known.retain(|c, _| has_image(c));
            self.forgotten += (before - self.known.len()) as u64;
            if self.known.len() >= self.max {
                self.forgotten += 1;
                return;
            }
        }
        self.known.insert(client.into(), epoch);
    }

    /// The stale notices of the batch just applied.
    pub(crate) fn take_notices(&mut self) -> Vec<(Box<str>, u64)> {
        std::mem::take(&mut self.notices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(f: &mut Fence, epoch: u64, from_owner: Option<bool>) -> (Verdict, bool) {
        f.judge("c", epoch, from_owner, &|_| true)
    }

    #[test]
    fn older_epochs_are_stale_and_reported_once_per_batch() {
        let mut f = Fence::default();
        assert_eq!(judge(&mut f, 2, None), (Verdict::Apply, false));
        // A newer claim by another node drops that node's image first.
        assert_eq!(judge(&mut f, 3, Some(false)), (Verdict::Apply, true));
        assert_eq!(judge(&mut f, 3, Some(true)), (Verdict::Apply, false));
        assert_eq!(judge(&mut f, 2, Some(false)), (Verdict::Stale, false));
        assert_eq!(judge(&mut f, 2, Some(false)), (Verdict::Stale, false));
        assert_eq!(f.stale, 2);
        assert_eq!(f.take_notices(), [("c".into(), 2)]);
        assert!(f.take_notices().is_empty());
    }

    #[test]
    fn an_unknown_epoch_applies_only_to_its_own_image_once_one_is_known() {
        let mut f = Fence::default();
        // Nothing known: as before epochs.
        assert_eq!(judge(&mut f, 0, None), (Verdict::Apply, false));
        assert_eq!(judge(&mut f, 0, Some(false)), (Verdict::Apply, false));
        f.claimed("c", 5, &|_| false);
        assert_eq!(judge(&mut f, 0, Some(true)), (Verdict::Apply, false));
        assert_eq!(judge(&mut f, 0, Some(false)), (Verdict::Stale, false));
        assert_eq!(judge(&mut f, 0, None), (Verdict::Stale, false));
        // Not reported: its sender could not tell which claim it meant.
        assert!(f.take_notices().is_empty());
    }

    #[test]
    fn the_table_is_bounded_and_forgets_ids_without_a_copy_first() {
        let mut f = Fence::default();
        f.set_limit(8);
        for i in 0..16 {
            f.claimed(&format!("c{i}"), 1, &|_| false);
        }
        assert_eq!(f.known.len(), 16);
        // Full: the ids without a copy go to make room.
        f.claimed("new", 1, &|c| c == "c0");
        assert_eq!(f.known.len(), 2);
        assert_eq!(f.forgotten, 15);
        assert_eq!(f.known("c0"), 1);
        assert_eq!(f.known("new"), 1);
        // Full of ids with copies: the new one is not kept, and counted.
        for i in 0..14 {
            f.claimed(&format!("d{i}"), 1, &|_| true);
        }
        f.claimed("last", 1, &|_| true);
        assert_eq!(f.known("last"), 0);
        assert_eq!(f.forgotten, 16);
    }
}

//! Which copy a claim may serve. A node granted a client id may hold an
//! image of its session, but that image may be stale: this node was away
//! from the owner's replica set while a newer owner wrote copies it never
//! got. The cluster's answer to the claim names the previous owner and the
//! epoch under which it owned the id (as the log's ownership table had it
//! when the claim applied); only an image that owner wrote under that
//! epoch is the newest copy.
//!
//! A strict local rule ("the copy's epoch is the claim's minus one") would
//! refuse good copies: claim retries that commit, and claims whose client
//! left before the answer, raise the epoch too. The log skips the
//! claimant's own earlier claims when it names the previous owner, so a
//! retry on this node still finds the owner before it.

use super::{disk, Disk, Images, PeerId};

/// The owner before a granted claim, as the cluster's log had it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreviousOwner {
    /// Its peer id here (`None`: a node this one never linked to, whose
    /// copies cannot be here).
    pub peer: Option<PeerId>,
    /// The epoch of its claim.
    pub epoch: u64,
}

impl Images {
    /// Drop the image of `client` unless it is the copy `prev` wrote under
    /// its epoch. True when one was dropped.
    pub(crate) fn refuse_stale(
        &mut self,
        client: &str,
        prev: &PreviousOwner,
        disk: &mut Disk<'_>,
    ) -> bool {
        if self.is_current(client, prev) != Some(false) {
            return false;
        }
        self.forget(client, disk);
        true
    }

    /// Whether the image of `client` is the copy `prev` wrote under its
    /// epoch (`None`: no image here).
    pub(crate) fn is_current(&self, client: &str, prev: &PreviousOwner) -> Option<bool> {
        let img = self.by_client.get(client)?;
        let known = self.fence.known(client);
        let current = match img.owner {
            // Read back from disk: the node that wrote it is not known,
            // the epoch it was stored under is. None stored (written
            // before epochs were, or under no known claim): judged as
            // before epochs.
            Some(disk::RESTORED) => img.epoch == 0 || img.epoch == prev.epoch,
            // No owner: as before epochs.
            None => true,
            // Epoch 0: its owner never named one (a session it restored
            // from its own store, not claimed since).
            // Or a copy another node kept of it, sent here under that
            // epoch (see `Images::copy_ops`).
            Some(owner) => {
                (prev.peer == Some(owner) && (known == prev.epoch || known == 0))
                    || (img.epoch != 0 && img.epoch == prev.epoch)
            }
        };
        Some(current)
    }
}

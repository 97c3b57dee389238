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
//!
//! Copies written under that epoch may still differ: an owner cut off
//! from one replica only (a partial partition) goes on with the others,
//! and the copy it left behind lacks what it acknowledged since. So each
//! batch an owner sends names how many batches of the session's changes
//! it made under its claim (its version, see `ReplOp::Epoch`), and a claim
//! whose old owner did not hand over asks the other nodes for a copy
//! newer than its own (`PeerEvent::CopyWanted`). Only a newer one replaces
//! it ([`Judged`]), keeping the stranded entries it lacks: they are no
//! part of the owner's changes, and the node that sent it may not have
//! had them all. A copy read back from disk has the version it had when
//! written (a store of format 2 kept none: 0), and is judged by it the
//! same way; one with no version is served as it is. A copy asked for over
//! none here, or newer than one read back, is applied as the previous
//! owner's ([`Judged::Asked`]).

use super::stranded::{Unread, STRANDED_BASE};
use super::{disk, Disk, Images, PeerId, ReplOp};
use crate::core::hash::HashMap;

/// The owner before a granted claim, as the cluster's log had it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreviousOwner {
    /// Its peer id here (`None`: a node this one never linked to, whose
    /// copies cannot be here).
    pub peer: Option<PeerId>,
    /// The epoch of its claim.
    pub epoch: u64,
    /// It let go only because its lease ran out: it dropped its clients
    /// without their wills, which its copies keep armed for the node that
    /// takes the id next (see `Broker::install_replica`).
    pub lapsed: bool,
}

/// What a batch is to the copies here.
#[derive(Debug)]
pub(super) enum Judged {
    /// Changes of the sessions `from` owns, or a full image from a new
    /// owner, or a copy over none here (or one of another claim, or of no
    /// known version): applied as they come.
    Owners,
    /// Another node's copy of a session under the same claim as the one
    /// here, newer: it replaces it as `owner`'s (the owner of the copy
    /// here), so that what is stranded for `owner` still finds it; the
    /// stranded entries `kept` of the one it replaces are queued again
    /// unless it holds them (see `Images::merge_stranded`).
    Newer { owner: PeerId, kept: Vec<Unread> },
    /// Another node's copy under the same claim, not newer: ignored.
    Older,
    /// Another node's copy of `client` that a claim here asked for, naming
    /// `owner`, over none here or newer than a copy read back from disk
    /// under the same claim: that one goes, and the copy is applied as
    /// `owner`'s, as `Newer` is (the ids it carries are the owner's;
    /// applied as the sender's, they could meet those of the sender's own
    /// messages here). Nothing of one read back is kept: its entries have
    /// no marks, so its stranded ones cannot be told from the sender's.
    Asked { client: Box<str>, owner: PeerId },
}

impl Images {
    /// What `ops` from `from` are: another node's copy (`Images::copy_ops`:
    /// its epoch, then a full image, of one session) of a session copied
    /// here under the same claim is judged by its version.
    pub(super) fn judge_batch(&self, from: PeerId, ops: &[ReplOp]) -> Judged {
        let (
            Some(ReplOp::Epoch {
                client,
                epoch,
                version,
            }),
            Some(ReplOp::Reset { client: reset, .. }),
        ) = (ops.first(), ops.get(1))
        else {
            return Judged::Owners;
        };
        if client != reset {
            return Judged::Owners;
        }
        let asked = || {
            self.asked
                .iter()
                .find(|(c, p)| c == client && p.peer != Some(from) && p.epoch == *epoch)
                .and_then(|(_, p)| p.peer)
                .map(|owner| Judged::Asked {
                    client: client.clone(),
                    owner,
                })
        };
        let Some(img) = self.by_client.get(client) else {
            return asked().unwrap_or(Judged::Owners);
        };
        let Some(owner) = img.owner.filter(|o| *o != from) else {
            return Judged::Owners;
        };
        if *epoch == 0 || img.epoch != *epoch || img.version == 0 {
            return Judged::Owners;
        }
        if owner == disk::RESTORED {
            // Read back: only a copy a claim here asked for is another
            // node's, judged by its version and applied as the owner it
            // named (keyed by no owner, its ids would meet other nodes'
            // ids). Any other is its owner's full image: it replaces the
            // copy, whose owner is then known again (left as it was, the
            // owner's next change would find a copy of nobody's and start
            // one without what only a full image carries).
            return match asked() {
                Some(a) if *version > img.version => a,
                Some(_) => Judged::Older,
                None => Judged::Owners,
            };
        }
        if *version <= img.version {
            return Judged::Older;
        }
        Judged::Newer {
            owner,
            kept: self.all_stranded(client),
        }
    }

    /// Whether the copy of `client` here, `from`'s under the claim of
    /// `epoch`, holds the changes of `from`'s batch at `version` already
    /// (its link delivered them late).
    pub(super) fn holds_version(
        &self,
        from: PeerId,
        client: &str,
        epoch: u64,
        version: u64,
    ) -> bool {
        version > 0
            && self
                .by_client
                .get(client)
                .is_some_and(|i| i.owner == Some(from) && i.epoch == epoch && i.version >= version)
    }

    /// Another node's newer copy (see [`Judged::Newer`]) with the ids it gave
    /// its own stranded entries and messages replaced by fresh ones here:
    /// those of its owner are the owner's, the same on every node, but
    /// those of two nodes' stranded ones may meet. Returns its client id.
    pub(super) fn as_owners(
        &mut self,
        mut ops: Vec<ReplOp>,
        now_ms: u64,
    ) -> (Box<str>, Vec<ReplOp>) {
        let mut ids: HashMap<u64, u64> = HashMap::default();
        let mut fresh = |id: &mut u64, images: &mut Images| {
            if *id >= STRANDED_BASE {
                *id = *ids
                    .entry(*id)
                    .or_insert_with(|| images.next_stranded(now_ms));
            }
        };
        let mut client = None;
        for op in &mut ops {
            match op {
                ReplOp::Message { id, .. } => fresh(&mut id.0, self),
                ReplOp::Enqueue { entry, item, .. } => {
                    fresh(&mut entry.0, self);
                    fresh(&mut item.msg.0, self);
                }
                ReplOp::Dequeue { entry, .. } | ReplOp::Send { entry, .. } => {
                    fresh(&mut entry.0, self)
                }
                ReplOp::Reset { client: c, .. } if client.is_none() => client = Some(c.clone()),
                _ => {}
            }
        }
        (client.unwrap_or_default(), ops)
    }

    /// A claim here asks the other nodes for a copy of `client`, naming
    /// `prev` as the owner before it: kept, when no copy is here or one
    /// read back from disk, until the claim is answered
    /// ([`Images::claim_answered`]; see [`Judged::Asked`]).
    pub(crate) fn asked_for_copy(&mut self, client: &str, prev: PreviousOwner) {
        let none_or_read_back = self
            .by_client
            .get(client)
            .is_none_or(|i| i.owner == Some(disk::RESTORED) && i.version > 0);
        self.asked.retain(|(c, _)| &**c != client);
        if !none_or_read_back {
            return;
        }
        if self.asked.len() >= super::MAX_ASKED {
            self.asked.pop_front();
        }
        self.asked.push_back((client.into(), prev));
    }

    /// `client`'s claim here was answered: the copies it asked for came
    /// (or every node said it had none).
    pub(crate) fn claim_answered(&mut self, client: &str) {
        if !self.asked.is_empty() {
            self.asked.retain(|(c, _)| &**c != client);
        }
    }

    /// The version of the copy of `client` (0: none, or not known).
    pub(crate) fn version(&self, client: &str) -> u64 {
        self.by_client.get(client).map_or(0, |i| i.version)
    }

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

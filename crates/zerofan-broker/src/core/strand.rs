//! Messages published while a node is away, for its persistent sessions.
//!
//! A node whose link has been down a while (`Broker::set_peer_away`) is
//! not waited for: what crosses to it then may never arrive, or arrive
//! after its sessions were taken over elsewhere. So a message for an away
//! node's subscribers goes to every other node as well
//! (`PeerEvent::Stranded`), and is acknowledged once they all have it:
//!
//! - a node holding copies of the away node's sessions queues it in the
//!   copies whose subscriptions match (`Images::strand`), so that the node
//!   that serves a session next has it;
//! - a node serving a session taken from the away node already ([`Strands`]
//!   remembers which) queues it there, unless the sender sent it to the
//!   node's subscribers anyway (it knew the session is there: `direct`).
//!
//! The away node gets it too, on its link: if it comes back owning the
//! sessions still, it has it, and its full copies replace the ones here.
//! If it comes back restarted, its link's queue was lost: the publisher's
//! node sends it again what it stranded for it lately ([`KEEP_FOR`]), for
//! the sessions it has held all along (not those served from a copy since,
//! which had it there).

use super::hash::HashMap;
use super::message::Message;
use super::peer::PeerId;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long a message stranded for a node is kept for it, should it come
/// back restarted: a restart takes seconds.
pub(crate) const KEEP_FOR: Duration = Duration::from_secs(60);
/// Most messages kept per away node; past it the oldest is forgotten
/// (counted).
pub(crate) const KEEP_MAX: usize = 10_000;

/// The sessions served here from a copy, by client id, with the node they
/// were taken from when it was away at the time (`None`: it handed them
/// over): messages other nodes strand for that node are theirs too. The
/// others are this node's own, which get what is sent again to it after
/// a restart. One per session here at most (forgotten when it ends).
#[derive(Debug, Default)]
pub(crate) struct Strands {
    taken: HashMap<Box<str>, Option<PeerId>>,
    /// Per away node, what this node stranded for it lately, oldest first.
    kept: HashMap<PeerId, VecDeque<(Instant, Rc<Message>)>>,
}

impl Strands {
    /// Whether any session here is served from a copy.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        !self.taken.is_empty()
    }

    /// `client`'s session is served here from a copy: `from`'s, away at
    /// the time (`None`: not away).
    pub(crate) fn took(&mut self, client: &str, from: Option<PeerId>) {
        self.taken.insert(client.into(), from);
    }

    /// Whether a message stranded for `owners` is `client`'s: taken from
    /// one of them; or, `owners` empty (sent again to this node after it
    /// restarted), a session of this node's own, not served from a copy.
    pub(crate) fn is_for(&self, client: &str, owners: &[PeerId]) -> bool {
        match self.taken.get(client) {
            Some(Some(from)) => owners.contains(from),
            Some(None) => false,
            None => owners.is_empty(),
        }
    }

    /// Keep `msg`, stranded for `owner` at `now`. Returns how many older
    /// ones were forgotten for the bound.
    pub(crate) fn keep(&mut self, owner: PeerId, now: Instant, msg: Rc<Message>) -> usize {
        let q = self.kept.entry(owner).or_default();
        let mut forgot = 0;
        while q
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > KEEP_FOR)
        {
            q.pop_front();
        }
        while q.len() >= KEEP_MAX {
            q.pop_front();
            forgot += 1;
        }
        q.push_back((now, msg));
        forgot
    }

    /// `owner` came back restarted (what was queued for it dropped): what
    /// was kept for it, to send again.
    pub(crate) fn take_kept(&mut self, owner: PeerId, now: Instant) -> Vec<Rc<Message>> {
        self.kept
            .remove(&owner)
            .into_iter()
            .flatten()
            .filter(|(at, _)| now.duration_since(*at) <= KEEP_FOR)
            .map(|(_, m)| m)
            .collect()
    }

    /// Nothing need be kept for `peer` (back without a restart, or left).
    pub(crate) fn forget_peer(&mut self, peer: PeerId) {
        self.kept.remove(&peer);
    }

    /// `client`'s session ended here.
    pub(crate) fn ended(&mut self, client: &str) {
        if !self.taken.is_empty() {
            self.taken.remove(client);
        }
    }
}

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

use super::hash::HashMap;
use super::peer::PeerId;

/// The sessions served here that were taken over from a node away at the
/// time, by client id: messages other nodes strand for that node are
/// theirs too. One per session here at most (forgotten when it ends).
#[derive(Debug, Default)]
pub(crate) struct Strands {
    taken: HashMap<Box<str>, PeerId>,
}

impl Strands {
    /// Whether any session here was taken from an away node.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        !self.taken.is_empty()
    }

    /// `client`'s session, served here now, was `from`'s, away.
    pub(crate) fn took(&mut self, client: &str, from: PeerId) {
        self.taken.insert(client.into(), from);
    }

    /// The away node `client`'s session was taken from, if any.
    pub(crate) fn taken_from(&self, client: &str) -> Option<PeerId> {
        self.taken.get(client).copied()
    }

    /// `client`'s session ended here.
    pub(crate) fn ended(&mut self, client: &str) {
        if !self.taken.is_empty() {
            self.taken.remove(client);
        }
    }
}

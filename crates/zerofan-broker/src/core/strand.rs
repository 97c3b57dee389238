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
//!
//! Every node gets a stranded message with the same [`Mark`]. An away
//! node that was only paused reads it from its link when it wakes, queues
//! it and replicates that, mark included: the copies then hold it twice,
//! stranded and as the owner's own, and drop the stranded entry
//! (`Images::strand` and `Images::unstrand`).

use super::hash::{HashMap, HashSet};
use super::message::Message;
use super::peer::PeerId;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};
use zerofan_store::MsgId;

/// How long a message stranded for a node is kept for it, should it come
/// back restarted: a restart takes seconds.
pub(crate) const KEEP_FOR: Duration = Duration::from_secs(60);
/// Most messages kept per away node; past it the oldest is forgotten
/// (counted).
pub(crate) const KEEP_MAX: usize = 10_000;
/// Most message bytes (topic and payload) kept per away node, likewise.
pub(crate) const KEEP_BYTES: usize = 64 << 20;

/// A stranded message's identity, the same on every node: the node it
/// was published at and that node's count, which starts from the clock so
/// that a restarted node does not give a mark again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mark {
    node: u64,
    seq: u64,
}

impl Mark {
    pub(crate) fn new(node: u64, seq: u64) -> Self {
        Mark { node, seq }
    }

    pub(crate) fn node(self) -> u64 {
        self.node
    }

    pub(crate) fn seq(self) -> u64 {
        self.seq
    }
}

/// How far a node had read the marked messages of each node that sent it
/// some (node id, highest mark count), when it wrote a full image of a
/// session: the image holds every such message that matched it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MarksRead(Vec<(u64, u64)>);

impl MarksRead {
    pub(crate) fn new(read: Vec<(u64, u64)>) -> Self {
        MarksRead(read)
    }

    /// Each node and its highest mark count read.
    pub(crate) fn as_slice(&self) -> &[(u64, u64)] {
        &self.0
    }

    /// Whether the message marked `mark` had been read.
    pub(crate) fn covers(&self, mark: Mark) -> bool {
        self.0
            .iter()
            .any(|&(node, seq)| node == mark.node && seq >= mark.seq)
    }
}

/// The messages a copy held when its session was served from it, by the
/// store id of the node that owned it (`from`). That node may not have
/// known yet, cut off from this one (a partial partition): it went on
/// queueing its publishers' messages in the session, and forwarded them
/// here for other subscribers, on a link that delivers them only once it
/// heals. Those the copy held are the session's already, and are skipped
/// for it; the others are new to it. Kept [`KEEP_FOR`]: a cut heals in
/// seconds.
#[derive(Debug)]
struct Held {
    from: PeerId,
    ids: HashSet<MsgId>,
    until: Instant,
}

/// A message stranded for a node at a time, with its mark.
type Kept = (Instant, Rc<Message>, Option<Mark>);

/// What was stranded for one away node, oldest first, and its bytes.
#[derive(Debug, Default)]
struct KeptFor {
    q: VecDeque<Kept>,
    bytes: usize,
}

impl KeptFor {
    fn pop(&mut self) {
        if let Some((_, m, _)) = self.q.pop_front() {
            self.bytes -= m.size();
        }
    }
}

/// The sessions served here from a copy, by client id, with the node they
/// were taken from when it was away at the time (`None`: it handed them
/// over): messages other nodes strand for that node are theirs too. The
/// others are this node's own, which get what is sent again to it after
/// a restart. One per session here at most (forgotten when it ends).
#[derive(Debug, Default)]
pub(crate) struct Strands {
    taken: HashMap<Box<str>, Option<PeerId>>,
    /// Per away node, what this node stranded for it lately, oldest first.
    kept: HashMap<PeerId, KeptFor>,
    /// Per peer, the last mark it gave that this node read (marks come
    /// from the node that gave them, in order): see [`MarksRead`].
    /// Bounded by the peers.
    read: HashMap<PeerId, Mark>,
    /// Per session served here from a copy: the old owner's store ids of
    /// the messages that copy held, for a while (see [`Held`]).
    held: HashMap<Box<str>, Held>,
    /// Per node, until when a session served from its copy may still hold
    /// its ids: one lookup per message from it, not a walk of `held`.
    /// Bounded by the peers.
    held_until: HashMap<PeerId, Instant>,
    /// This node's id in the cluster (0: none, no marks given).
    node: u64,
    /// The last mark's count.
    seq: u64,
}

impl Strands {
    /// This node's id in the cluster.
    pub(crate) fn set_node(&mut self, node: u64) {
        self.node = node;
    }

    /// A fresh mark for a message stranded now (none outside a cluster).
    pub(crate) fn mark(&mut self, now_ms: u64) -> Option<Mark> {
        if self.node == 0 {
            return None;
        }
        let floor = super::peer::count_from_clock(now_ms);
        self.seq = self.seq.saturating_add(1).max(floor);
        Some(Mark::new(self.node, self.seq))
    }

    /// A message marked `mark` came from `from`.
    #[inline]
    pub(crate) fn read(&mut self, from: PeerId, mark: Option<Mark>) {
        if let Some(m) = mark {
            self.read.insert(from, m);
        }
    }

    /// How far the marks of each node were read, for a full image.
    pub(crate) fn marks_read(&self) -> MarksRead {
        MarksRead(self.read.values().map(|m| (m.node, m.seq)).collect())
    }

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

    /// Keep `msg`, stranded for `owner` at `now` as `mark`. Returns how
    /// many older ones were forgotten for the bound.
    pub(crate) fn keep(
        &mut self,
        owner: PeerId,
        now: Instant,
        msg: Rc<Message>,
        mark: Option<Mark>,
    ) -> usize {
        let k = self.kept.entry(owner).or_default();
        let mut forgot = 0;
        while k
            .q
            .front()
            .is_some_and(|(at, _, _)| now.duration_since(*at) > KEEP_FOR)
        {
            k.pop();
        }
        while !k.q.is_empty() && (k.q.len() >= KEEP_MAX || k.bytes + msg.size() > KEEP_BYTES) {
            k.pop();
            forgot += 1;
        }
        k.bytes += msg.size();
        k.q.push_back((now, msg, mark));
        forgot
    }

    /// `owner` came back restarted (what was queued for it dropped): what
    /// was kept for it, to send again, with its mark.
    pub(crate) fn take_kept(
        &mut self,
        owner: PeerId,
        now: Instant,
    ) -> Vec<(Rc<Message>, Option<Mark>)> {
        self.kept
            .remove(&owner)
            .into_iter()
            .flat_map(|k| k.q)
            .filter(|(at, _, _)| now.duration_since(*at) <= KEEP_FOR)
            .map(|(_, m, mark)| (m, mark))
            .collect()
    }

    /// Nothing need be kept for `peer` (back without a restart, or left).
    pub(crate) fn forget_peer(&mut self, peer: PeerId) {
        self.kept.remove(&peer);
    }

    /// `peer` left the cluster.
    pub(crate) fn peer_left(&mut self, peer: PeerId) {
        self.forget_peer(peer);
        self.read.remove(&peer);
    }

    /// `client`'s session ended here.
    pub(crate) fn ended(&mut self, client: &str) {
        if !self.taken.is_empty() {
            self.taken.remove(client);
        }
        if !self.held.is_empty() {
            self.held.remove(client);
        }
    }

    /// `client`'s session is served here from a copy that held the
    /// messages `ids` of `from`'s store (see [`Held`]).
    pub(crate) fn hold(&mut self, client: &str, from: PeerId, ids: HashSet<MsgId>, now: Instant) {
        if ids.is_empty() {
            return;
        }
        self.held.retain(|_, h| h.until > now);
        let until = now + KEEP_FOR;
        self.held.insert(client.into(), Held { from, ids, until });
        let last = self.held_until.entry(from).or_insert(until);
        *last = (*last).max(until);
    }

    /// Whether a session here was served from a copy of `from`'s lately.
    #[inline]
    pub(crate) fn holds_from(&self, from: PeerId, now: Instant) -> bool {
        !self.held.is_empty() && self.held_until.get(&from).is_some_and(|&u| u > now)
    }

    /// Whether `client`'s session was served from a copy that held `from`'s
    /// message `id`.
    pub(crate) fn held(&self, client: &str, from: PeerId, id: MsgId) -> bool {
        self.held
            .get(client)
            .is_some_and(|h| h.from == from && h.ids.contains(&id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use zerofan_codec::{MqttStr, Props, QoS};

    fn msg(size: usize) -> Rc<Message> {
        Rc::new(Message::owned(
            MqttStr::try_from("t").unwrap(),
            Bytes::from(vec![0u8; size - 1]),
            QoS::AtLeastOnce,
            false,
            Props::new(),
            None,
        ))
    }

    /// Per away node: at most `KEEP_MAX` messages and `KEEP_BYTES`
    /// bytes, none older than `KEEP_FOR`; the oldest go first, counted
    /// when pushed out by a bound.
    #[test]
    fn what_is_kept_for_an_away_node_is_bounded() {
        let (a, b) = (PeerId(1), PeerId(2));
        let now = Instant::now();
        let mut s = Strands::default();
        let forgot: usize = (0..KEEP_MAX + 5)
            .map(|_| s.keep(a, now, msg(10), None))
            .sum();
        assert_eq!(forgot, 5);
        assert_eq!(s.take_kept(a, now).len(), KEEP_MAX);

        let big = KEEP_BYTES / 4 + 1;
        let forgot: usize = (0..4).map(|_| s.keep(b, now, msg(big), None)).sum();
        assert_eq!(forgot, 1, "four would pass the byte bound");
        assert_eq!(s.take_kept(b, now).len(), 3);

        s.keep(a, now, msg(10), None);
        let later = now + KEEP_FOR + Duration::from_secs(1);
        assert_eq!(s.keep(a, later, msg(10), None), 0, "expired, not counted");
        assert_eq!(s.take_kept(a, later).len(), 1);
    }
}

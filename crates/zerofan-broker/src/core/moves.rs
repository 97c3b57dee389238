//! A persistent session moving between two live nodes (a takeover, a
//! drained node's clients going elsewhere): no message published meanwhile
//! is lost, none is delivered twice, and each publisher's order holds.
//!
//! The nodes learn of the move at different times: a publisher's node may
//! still send a message to the old owner after the session left it, or to
//! the new owner before it knows the session's subscriptions are there. So
//! the switch is made where each publisher's node makes it, in the order of
//! its own links:
//!
//! 1. The old owner ([`Leaving`]) hands the session over, but keeps its
//!    subscriptions: what matches them is relayed to the new owner
//!    (`PeerEvent::Relayed`) instead of queued.
//! 2. The new owner ([`Arriving`]), once it serves the session, announces
//!    the subscriptions, then tells every node `Moved`.
//! 3. Every node answers `Moved` with `Flushed`, to every node: what it
//!    sends after that goes to the new owner's subscriptions.
//! 4. The old owner relays what a node sent before that node's `Flushed`;
//!    once every node has flushed, it says `RelayDone` and ends the session.
//! 5. The new owner drops, for the moving session, what a node sent it
//!    directly before that node's `Flushed` (the old owner relays it), and
//!    holds what came after until `RelayDone`: relayed messages go first.
//!
//! Acknowledgements wait for what they promise ([`Answer`]): the old owner
//! answers a fence, or acknowledges a publisher of its own, only once the
//! new owner has the relays so far (a fence of its own to it, chained); the
//! new owner answers a node whose messages it holds, or acknowledges a
//! publisher of its own whose messages it holds, only once they are queued.
//!
//! A move that has not finished after [`MOVE_TIMEOUT`], or whose other end
//! goes away, ends all the same: what is held is queued, the relay stops.
//!
//! A link that starts over (its node restarted) drops what was queued on
//! it, a `Moved` or a `Flushed` among it. So each node keeps, for
//! [`MOVE_TIMEOUT`], the moves it announced and those it flushed, and
//! says them again to a node whose link starts over ([`Retell`]): a move
//! whose old owner restarted ends once its nodes have switched, not at its
//! deadline. Said again, a flush names the new owner, so that no other
//! move of the same client takes it.

use super::hash::HashSet;
use super::ids::{ConnId, SessionId};
use super::outbox::Outgoing;
use super::peer::PeerId;
use super::session::Queued;
use super::strand::Mark;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a move may wait for the nodes' `Flushed` (a move takes a round
/// trip between nodes, milliseconds): past it, it ends as it stands.
pub(crate) const MOVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Moves announced by an old owner (`Relaying`) and not served here yet
/// that are kept; past it the oldest is forgotten (its relays dropped,
/// counted).
const MAX_EXPECTED: usize = 1024;

/// Moves announced or flushed within [`MOVE_TIMEOUT`] that are kept to
/// be said again; past it the oldest is forgotten (counted): a node whose
/// link starts over then leaves that move to its deadline.
const MAX_TOLD: usize = 1024;

/// An answer that waits for a move (see the module's doc).
#[derive(Debug)]
pub(crate) enum Answer {
    /// `Seen` for a peer's change (a fence).
    Seen(PeerId, u64),
    /// A publisher's PUBACK / PUBREC.
    Ack(ConnId, Outgoing),
}

/// The moves this node takes part in.
#[derive(Debug, Default)]
pub(crate) struct Moves {
    leaving: Vec<(SessionId, Leaving)>,
    arriving: Vec<(SessionId, Arriving)>,
    expected: VecDeque<Expected>,
    /// Nodes this one relayed to, and the fence that covers the relays.
    relayed_to: Vec<RelayFence>,
    /// Answers waiting for nodes to have our relays, in the order given.
    chained: VecDeque<Chained>,
    /// What this node said of moves lately (oldest first).
    told: VecDeque<Told>,
}

/// A move this node announced (`to: None`: it is the new owner) or
/// flushed (`to`: the new owner), until `until`.
#[derive(Debug)]
struct Told {
    client: Box<str>,
    to: Option<PeerId>,
    until: Instant,
}

/// What to say again to a node whose link started over.
#[derive(Debug, PartialEq)]
pub(crate) enum Retell {
    /// `Moved`: this node serves the session (announced after its
    /// subscriptions, which the link's new start carries first).
    Moved(Box<str>),
    /// `Flushed`, naming the new owner.
    Flushed(Box<str>, PeerId),
}

/// At the old owner: a session handed over, its matches relayed.
#[derive(Debug)]
pub(crate) struct Leaving {
    pub(crate) client: Box<str>,
    pub(crate) to: PeerId,
    /// Nodes whose `Flushed` has not come (`None`: this node, which
    /// flushes when the new owner's `Moved` comes).
    waiting: Vec<Option<PeerId>>,
    pub(crate) deadline: Instant,
}

/// At the new owner: a session served here, what the old owner relays
/// still to come.
#[derive(Debug)]
pub(crate) struct Arriving {
    pub(crate) client: Box<str>,
    from: PeerId,
    /// Nodes whose `Flushed` has not come: the old owner relays what they
    /// sent before it.
    before: Vec<PeerId>,
    /// Messages that came after a node's `Flushed`, in order.
    held: Vec<Queued>,
    /// The nodes, and this node's publishers, whose messages are held.
    held_nodes: Vec<PeerId>,
    held_conns: Vec<ConnId>,
    /// Answers to them, until `held` is queued.
    answers: Vec<Answer>,
    /// The marks of the messages the copy it was served from held (see
    /// `strand`): stranded for the old owner while it was away, they may
    /// reach it after it let go and come back relayed. The session has
    /// them: dropped.
    had: HashSet<Mark>,
    pub(crate) deadline: Instant,
}

impl Arriving {
    fn had(&self, item: &Queued) -> bool {
        !self.had.is_empty() && item.msg.mark().is_some_and(|m| self.had.contains(&m))
    }
}

#[derive(Debug)]
struct Expected {
    client: Box<str>,
    from: PeerId,
    /// Relays that came before the session was served here.
    relays: Vec<Queued>,
    /// A claim that never came here (not committed) leaves the old owner
    /// relaying until its deadline; a later claim is not that move.
    deadline: Instant,
}

#[derive(Debug)]
struct RelayFence {
    to: PeerId,
    /// The last fence sent to it after relays.
    fence: u64,
    /// Relays sent since that fence.
    fresh: bool,
}

#[derive(Debug)]
struct Chained {
    /// (node, fence) pairs to be seen first.
    needs: Vec<(PeerId, u64)>,
    answer: Answer,
}

/// What a match of a moving session becomes.
pub(crate) enum Hit {
    /// Queue it as usual.
    Deliver(Queued),
    /// Relay it to the new owner.
    Relay(PeerId, Box<str>, Queued),
    /// Nothing here: it reaches the session another way.
    Drop,
    /// Held until the move is done.
    Held,
    /// The hold is full: queue what is held, then this.
    Overflow(Queued),
}

impl Moves {
    /// Whether any move is on (one test per message otherwise).
    #[inline]
    pub(crate) fn any(&self) -> bool {
        !self.leaving.is_empty() || !self.arriving.is_empty()
    }

    /// Whether answers may have to wait.
    #[inline]
    pub(crate) fn gates(&self) -> bool {
        self.any() || !self.chained.is_empty() || !self.relayed_to.is_empty()
    }

    pub(crate) fn leaving(&self, sid: SessionId) -> Option<&Leaving> {
        self.leaving.iter().find(|(s, _)| *s == sid).map(|(_, l)| l)
    }

    pub(crate) fn leaving_of(&self, client: &str) -> Option<SessionId> {
        self.leaving
            .iter()
            .find(|(_, l)| &*l.client == client)
            .map(|(s, _)| *s)
    }

    /// Start relaying `sid`'s matches to `to`; `nodes` are the nodes to
    /// wait for (this one included, as `None`).
    pub(crate) fn leave(
        &mut self,
        sid: SessionId,
        client: &str,
        to: PeerId,
        nodes: Vec<Option<PeerId>>,
        deadline: Instant,
    ) {
        self.leaving.push((
            sid,
            Leaving {
                client: client.into(),
                to,
                waiting: nodes,
                deadline,
            },
        ));
    }

    /// `nodes` (`None`: this one) flushed `client`'s move to `to` (`None`:
    /// not said, the latest): its session when the relay is over (end it
    /// with [`Moves::take_leaving`]). A flush of a move to another node is
    /// not this one's.
    pub(crate) fn flushed_leaving(
        &mut self,
        client: &str,
        nodes: &[Option<PeerId>],
        to: Option<PeerId>,
    ) -> Option<SessionId> {
        let (sid, l) = self
            .leaving
            .iter_mut()
            .find(|(_, l)| &*l.client == client)?;
        if to.is_some_and(|t| t != l.to) {
            return None;
        }
        l.waiting.retain(|n| !nodes.contains(n));
        l.waiting.is_empty().then_some(*sid)
    }

    /// This node announced `client`'s move here (`to: None`) or flushed
    /// its move to `to`, at `now`: kept for [`MOVE_TIMEOUT`], to be said
    /// again (see [`Moves::retell`]). Returns whether one still in its
    /// time was forgotten to keep the bound.
    pub(crate) fn told(&mut self, client: &str, to: Option<PeerId>, now: Instant) -> bool {
        self.forget_told(now);
        self.told.retain(|t| &*t.client != client);
        let forgot = self.told.len() >= MAX_TOLD;
        if forgot {
            self.told.pop_front();
        }
        self.told.push_back(Told {
            client: client.into(),
            to,
            until: now + MOVE_TIMEOUT,
        });
        forgot
    }

    fn forget_told(&mut self, now: Instant) {
        while self.told.front().is_some_and(|t| t.until <= now) {
            self.told.pop_front();
        }
    }

    /// What to say again to `peer`, whose link started over at `now`: the
    /// moves told within [`MOVE_TIMEOUT`], but not a flush of a move to
    /// `peer` itself (it needs none: it heard of its own move first hand).
    /// `serves` says whether this node still has a session it announced
    /// (one moving away again is not said to be here).
    pub(crate) fn retell(
        &mut self,
        peer: PeerId,
        now: Instant,
        serves: impl Fn(&str) -> bool,
    ) -> Vec<Retell> {
        self.forget_told(now);
        self.told
            .iter()
            .filter_map(|t| match t.to {
                None if serves(&t.client) && self.leaving_of(&t.client).is_none() => {
                    Some(Retell::Moved(t.client.clone()))
                }
                None => None,
                Some(to) if to == peer => None,
                Some(to) => Some(Retell::Flushed(t.client.clone(), to)),
            })
            .collect()
    }

    /// Stop relaying `sid` (done, timed out, or its client back).
    pub(crate) fn take_leaving(&mut self, sid: SessionId) -> Option<Leaving> {
        let i = self.leaving.iter().position(|(s, _)| *s == sid)?;
        Some(self.leaving.swap_remove(i).1)
    }

    /// The old owner `from` relays `client` to this node, until
    /// `deadline` at the latest. Returns the relays of moves forgotten
    /// to keep the bound.
    pub(crate) fn expect_relay(
        &mut self,
        client: Box<str>,
        from: PeerId,
        deadline: Instant,
    ) -> usize {
        let mut forgot = 0;
        self.expected.retain(|e| e.client != client);
        while self.expected.len() >= MAX_EXPECTED {
            if let Some(e) = self.expected.pop_front() {
                forgot += e.relays.len();
            }
        }
        self.expected.push_back(Expected {
            client,
            from,
            relays: Vec::new(),
            deadline,
        });
        forgot
    }

    /// Whether an old owner said it relays `client` here.
    pub(crate) fn expects_relay(&self, client: &str) -> bool {
        self.expected.iter().any(|e| &*e.client == client)
    }

    /// Whether `from` relays `client` here: expected, or arriving.
    pub(crate) fn relayed_by(&self, client: &str, from: PeerId) -> bool {
        self.expected
            .iter()
            .any(|e| &*e.client == client && e.from == from)
            || self.arriving_of(client, from).is_some()
    }

    /// Whether `sid` is arriving here.
    pub(crate) fn is_arriving(&self, sid: SessionId) -> bool {
        self.arriving.iter().any(|(s, _)| *s == sid)
    }

    /// A relay for `client` from `from` that came before its session is
    /// served here: kept (false when nothing expects it, or `bound` are
    /// kept already).
    pub(crate) fn keep_early(
        &mut self,
        client: &str,
        from: PeerId,
        item: Queued,
        bound: usize,
    ) -> bool {
        match self
            .expected
            .iter_mut()
            .find(|e| &*e.client == client && e.from == from)
        {
            Some(e) if e.relays.len() < bound => {
                e.relays.push(item);
                true
            }
            _ => false,
        }
    }

    /// `client`'s session is served here as `sid`: when its old owner
    /// relays, the move's second half begins; returns the relays that came
    /// first. `nodes` are the other nodes, which must flush.
    /// `had`: the marks of the messages its copy held (see [`Arriving`]).
    pub(crate) fn arrive(
        &mut self,
        sid: SessionId,
        client: &str,
        nodes: Vec<PeerId>,
        now: Instant,
        had: HashSet<Mark>,
    ) -> Option<Vec<Queued>> {
        let i = self.expected.iter().position(|e| &*e.client == client)?;
        let e = self.expected.remove(i)?;
        if e.deadline <= now {
            return None;
        }
        let deadline = now + MOVE_TIMEOUT;
        // The old owner relays what it sends before its own `Flushed`, also
        // when it was not reachable here a moment ago (its link back after
        // a restart): its direct copies are dropped, not held as well.
        let mut before = nodes;
        if !before.contains(&e.from) {
            before.push(e.from);
        }
        let a = Arriving {
            client: e.client,
            from: e.from,
            before,
            held: Vec::new(),
            held_nodes: Vec::new(),
            held_conns: Vec::new(),
            answers: Vec::new(),
            had,
            deadline,
        };
        self.arriving.push((sid, a));
        Some(e.relays)
    }

    /// Whether a message relayed for `sid` is one its copy held already.
    pub(crate) fn had(&self, sid: SessionId, item: &Queued) -> bool {
        self.arriving
            .iter()
            .find(|(s, _)| *s == sid)
            .is_some_and(|(_, a)| a.had(item))
    }

    /// Forget what `client`'s old owner (`from`; any: `None`) said: its
    /// session not resumed here, or the relay over before it was.
    pub(crate) fn forget_relay(&mut self, client: &str, from: Option<PeerId>) -> bool {
        let before = self.expected.len();
        self.expected
            .retain(|e| &*e.client != client || from.is_some_and(|f| f != e.from));
        self.expected.len() != before
    }

    /// The arriving session of `client` relayed by `from`.
    pub(crate) fn arriving_of(&self, client: &str, from: PeerId) -> Option<SessionId> {
        self.arriving
            .iter()
            .find(|(_, a)| &*a.client == client && a.from == from)
            .map(|(s, _)| *s)
    }

    /// `node` flushed `client`'s move: its messages go to the session here
    /// from now on (after `RelayDone`).
    pub(crate) fn flushed_arriving(&mut self, client: &str, node: PeerId) {
        if let Some((_, a)) = self.arriving.iter_mut().find(|(_, a)| &*a.client == client) {
            a.before.retain(|n| *n != node);
        }
    }

    /// What `sid`'s move holds, given up (the hold is full): the messages
    /// and the answers that waited for them; later ones are held anew.
    pub(crate) fn release_held(&mut self, sid: SessionId) -> (Vec<Queued>, Vec<Answer>) {
        match self.arriving.iter_mut().find(|(s, _)| *s == sid) {
            Some((_, a)) => {
                a.held_nodes.clear();
                a.held_conns.clear();
                (std::mem::take(&mut a.held), std::mem::take(&mut a.answers))
            }
            None => (Vec::new(), Vec::new()),
        }
    }

    /// The move of `sid` is over: what it held, and the answers that
    /// waited for it.
    pub(crate) fn take_arriving(&mut self, sid: SessionId) -> Option<Arriving> {
        let i = self.arriving.iter().position(|(s, _)| *s == sid)?;
        Some(self.arriving.swap_remove(i).1)
    }

    /// What a match of `sid` from `node` (`None`: published here, by
    /// `publisher`) becomes while moves are on.
    pub(crate) fn hit(
        &mut self,
        sid: SessionId,
        node: Option<PeerId>,
        publisher: Option<ConnId>,
        item: Queued,
        bound: usize,
    ) -> Hit {
        if let Some((_, l)) = self.leaving.iter().find(|(s, _)| *s == sid) {
            if !l.waiting.contains(&node) {
                // That node sends it to the new owner itself.
                return Hit::Drop;
            }
            let to = l.to;
            let client = l.client.clone();
            match self.relayed_to.iter_mut().find(|r| r.to == to) {
                Some(r) => r.fresh = true,
                None => self.relayed_to.push(RelayFence {
                    to,
                    fence: 0,
                    fresh: true,
                }),
            }
            return Hit::Relay(to, client, item);
        }
        let Some((_, a)) = self.arriving.iter_mut().find(|(s, _)| *s == sid) else {
            return Hit::Deliver(item);
        };
        if item.share.is_some() {
            // A shared group's message was sent to one node: no other way.
            return Hit::Deliver(item);
        }
        if node.is_some_and(|n| a.before.contains(&n)) {
            return Hit::Drop;
        }
        if a.held.len() >= bound {
            return Hit::Overflow(item);
        }
        match node {
            Some(n) if !a.held_nodes.contains(&n) => a.held_nodes.push(n),
            None => {
                if let Some(c) = publisher.filter(|c| !a.held_conns.contains(c)) {
                    a.held_conns.push(c);
                }
            }
            _ => {}
        }
        a.held.push(item);
        Hit::Held
    }

    /// Keep `answer` while a move holds messages of the one it goes to;
    /// given back otherwise.
    pub(crate) fn hold_answer(&mut self, answer: Answer) -> Option<Answer> {
        let held = |a: &Arriving| match &answer {
            Answer::Seen(p, _) => a.held_nodes.contains(p),
            Answer::Ack(c, _) => a.held_conns.contains(c),
        };
        match self.arriving.iter_mut().find(|(_, a)| held(a)) {
            Some((_, a)) => {
                a.answers.push(answer);
                None
            }
            None => Some(answer),
        }
    }

    /// The nodes relayed to whose relays may not all be confirmed.
    pub(crate) fn relay_targets(&self) -> Vec<PeerId> {
        self.relayed_to.iter().map(|r| r.to).collect()
    }

    /// The nodes relayed to since their last fence: each gets a new fence
    /// (`stamp` numbers it), which `answer` waits for with the earlier
    /// ones not yet seen (`seen` says what each node has seen). Returns the
    /// fences to send, and `answer` when it need not wait.
    pub(crate) fn chain(
        &mut self,
        answer: Answer,
        mut stamp: impl FnMut() -> u64,
        seen: impl Fn(PeerId) -> u64,
        fences: &mut Vec<(PeerId, u64)>,
    ) -> Option<Answer> {
        let mut needs = Vec::new();
        for r in &mut self.relayed_to {
            if r.fresh {
                r.fresh = false;
                r.fence = stamp();
                fences.push((r.to, r.fence));
            }
            if seen(r.to) < r.fence {
                needs.push((r.to, r.fence));
            }
        }
        // Nodes that have every relay need no fence any more.
        self.relayed_to.retain(|r| seen(r.to) < r.fence);
        if needs.is_empty() && self.chained.is_empty() {
            return Some(answer);
        }
        // Behind the earlier ones: a later answer never overtakes them.
        self.chained.push_back(Chained { needs, answer });
        None
    }

    /// The chained answers free now, in order (`seen` as for
    /// [`Moves::chain`]), each with whether it is refused: a `gone` node,
    /// waited for no more, never confirmed the relays it waited for, which
    /// may be lost with that node's link (cut off from this node only, it
    /// may serve the session all the same).
    pub(crate) fn unchain(
        &mut self,
        seen: impl Fn(PeerId) -> u64,
        gone: Option<PeerId>,
    ) -> Vec<(Answer, bool)> {
        if let Some(g) = gone {
            self.relayed_to.retain(|r| r.to != g);
        }
        let mut free = Vec::new();
        while let Some(c) = self.chained.front() {
            if c.needs.iter().any(|&(p, f)| Some(p) != gone && seen(p) < f) {
                break;
            }
            let refused = c.needs.iter().any(|&(p, f)| Some(p) == gone && seen(p) < f);
            if let Some(c) = self.chained.pop_front() {
                free.push((c.answer, refused));
            }
        }
        free
    }

    /// `peer` is gone (away, left): the moves that wait for it go on
    /// without it. Returns the leaving sessions whose relay is over (their
    /// new owner, or every node they waited for, gone), and the arriving
    /// ones whose old owner is gone.
    pub(crate) fn peer_gone(&mut self, peer: PeerId) -> (Vec<SessionId>, Vec<SessionId>) {
        let mut left = Vec::new();
        for (sid, l) in &mut self.leaving {
            l.waiting.retain(|n| *n != Some(peer));
            if l.to == peer || l.waiting.is_empty() {
                left.push(*sid);
            }
        }
        let mut arrived = Vec::new();
        for (sid, a) in &mut self.arriving {
            a.before.retain(|n| *n != peer);
            if a.from == peer {
                arrived.push(*sid);
            }
        }
        self.expected.retain(|e| e.from != peer);
        (left, arrived)
    }

    /// The moves past their deadline at `now`.
    pub(crate) fn overdue(&self, now: Instant) -> (Vec<SessionId>, Vec<SessionId>) {
        let left = self
            .leaving
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(s, _)| *s)
            .collect();
        let arrived = self
            .arriving
            .iter()
            .filter(|(_, a)| a.deadline <= now)
            .map(|(s, _)| *s)
            .collect();
        (left, arrived)
    }
}

impl Arriving {
    /// What was held, in order, and the answers that waited for it.
    pub(crate) fn into_parts(self) -> (Vec<Queued>, Vec<Answer>) {
        (self.held, self.answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flush that names another new owner is not this move's (a move of
    /// the same client before or after), so the relay still waits.
    #[test]
    fn a_flush_of_a_move_to_another_node_is_not_taken() {
        let now = Instant::now();
        let mut m = Moves::default();
        let (to, other, node) = (PeerId(1), PeerId(3), Some(PeerId(2)));
        m.leave(SessionId(7), "c", to, vec![None, node], now + MOVE_TIMEOUT);
        assert_eq!(m.flushed_leaving("c", &[node], Some(other)), None);
        assert_eq!(m.flushed_leaving("c", &[node], Some(to)), None);
        assert_eq!(m.leaving(SessionId(7)).map(|l| l.waiting.len()), Some(1));
        assert_eq!(m.flushed_leaving("c", &[None], None), Some(SessionId(7)));
    }

    /// Said again: what this node announced while it still serves it, and
    /// what it flushed except to the new owner itself; nothing past the
    /// deadline; at most `MAX_TOLD` kept.
    #[test]
    fn moves_told_are_said_again_until_their_deadline() {
        let now = Instant::now();
        let until = now + MOVE_TIMEOUT;
        let mut m = Moves::default();
        assert!(!m.told("a", None, now));
        assert!(!m.told("gone", None, now));
        assert!(!m.told("b", Some(PeerId(1)), now));
        assert!(!m.told("c", Some(PeerId(2)), now));
        let serves = |c: &str| c != "gone";
        assert_eq!(
            m.retell(PeerId(2), now, serves),
            [
                Retell::Moved("a".into()),
                Retell::Flushed("b".into(), PeerId(1))
            ]
        );
        assert_eq!(m.retell(PeerId(2), until, serves), []);
        for i in 0..MAX_TOLD {
            assert!(!m.told(&i.to_string(), None, now));
        }
        assert!(m.told("over", None, now), "the oldest forgotten");
        assert_eq!(m.retell(PeerId(2), now, |_| true).len(), MAX_TOLD);
        // Past their time they make room without counting.
        assert!(!m.told("later", None, until));
        assert_eq!(m.retell(PeerId(2), until, |_| true).len(), 1);
    }
}

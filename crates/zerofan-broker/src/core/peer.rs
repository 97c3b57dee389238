//! Peers: the other instances of this core that together make one broker
//! (the shards of one process today; the nodes of a cluster later), and
//! what crosses between them.
//!
//! A peer is "one more shard behind a queue". The shell moves
//! [`PeerBatch`]es from [`Broker::poll_peer_transmit`] of one core to
//! [`Broker::handle_peer`] of another, in order: per source and destination
//! the events must arrive in the order they were polled, which is what keeps
//! each publisher's messages in order at every subscriber.
//!
//! [`Broker::poll_peer_transmit`]: super::Broker::poll_peer_transmit
//! [`Broker::handle_peer`]: super::Broker::handle_peer

use super::message::Message;
use std::sync::Arc;

/// Output that waits until every peer has seen a change.
#[derive(Debug)]
pub(crate) enum Deferred {
    /// The acknowledgement of a PUBLISH: retained (every node keeps it),
    /// or `durable`, crossed to nodes that may queue it for persistent
    /// sessions (see `PeerEvent::Fence`).
    Ack {
        /// The PUBACK / PUBREC.
        out: super::outbox::Outgoing,
        /// Crossed for persistent sessions: not sent when a node it went
        /// to is lost before it confirmed (see `Peers::take_refused`).
        durable: bool,
    },
    /// A SUBACK, and the retained messages its subscriptions replay.
    SubAck(
        super::outbox::Outgoing,
        super::ids::SessionId,
        super::subscribe::Replay,
    ),
}

/// A message for the persistent sessions of `owners` (nodes away from
/// the sender): the receiver keeps it in its copies of their sessions, and
/// queues it for those of their sessions it serves now (see `strand`).
/// `direct` and `shares` as in [`PeerEvent::Publish`], which this replaces
/// when the receiver has subscribers for it.
#[derive(Debug)]
pub struct Stranded {
    /// The away nodes whose sessions it is for (the sender's peer ids; on
    /// a cluster link, node ids: the links translate); none: the
    /// receiver's own sessions, sent again to it after it restarted.
    pub owners: Vec<PeerId>,
    /// The message, its payload shared.
    pub msg: Message,
    /// Deliver to the receiver's ordinary subscriptions too.
    pub direct: bool,
    /// Shared groups for which the sender chose the receiver.
    pub shares: Vec<Arc<str>>,
}

/// Which peer: a shard's index in its process (a node id, later).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u16);

/// What one core tells another.
#[derive(Debug)]
pub enum PeerEvent {
    /// The sender now has subscribers on `filter` (in `group` when shared),
    /// or, with `add == false`, no longer has any.
    Interest {
        /// The filter without any `$share/{group}/` prefix.
        filter: Box<str>,
        /// The shared group, if any.
        group: Option<Box<str>>,
        /// True when the first subscriber came, false when the last left.
        add: bool,
        /// The sender's change number, answered with [`PeerEvent::Seen`].
        seq: u64,
    },
    /// A message published at the sender, for the receiver's subscribers.
    /// Its payload is the publisher's buffer, shared, never copied.
    Publish {
        /// The message (no origin session: that lives on the sender).
        msg: Message,
        /// Deliver to the receiver's ordinary subscriptions.
        direct: bool,
        /// The shared groups (`$share/{group}/{filter}`) for which the
        /// sender chose the receiver: one of its members gets the message.
        shares: Vec<Arc<str>>,
        /// The sender's store id of the message, when it wrote it for
        /// persistent sessions of its own: a receiver that took one of
        /// those sessions from a copy skips it there when the copy held
        /// it (see `strand::Strands::held`).
        id: Option<zerofan_store::MsgId>,
    },
    /// A message for the persistent sessions of nodes away from the
    /// sender as well (see `strand`); boxed, as it is rare and larger than
    /// the others.
    Stranded(Box<Stranded>),
    /// Push-back across cores: a subscriber here fell behind on messages of
    /// the receiver's session `session` (`hold`), or caught up (`!hold`).
    /// The receiver stops (or resumes) reading that publisher.
    Hold {
        /// The publishing session, at the receiver.
        session: super::ids::SessionId,
        /// Stop (true) or resume (false) reading it.
        hold: bool,
    },
    /// A retained message set (or cleared, when its payload is empty) at
    /// the sender: every peer keeps every retained message, so that a
    /// subscription anywhere sees it.
    Retain {
        /// The message; an empty payload clears.
        msg: Message,
        /// The sender's change number, answered with [`PeerEvent::Seen`].
        seq: u64,
        /// Its place in the cluster-wide order of retained changes: the
        /// newest wins on every node (see `retain_order`).
        stamp: super::retain_order::Stamp,
    },
    /// The sender holds the acknowledgement of a QoS 1/2 message it sent
    /// on until the receiver has made durable what it wrote for the
    /// sender's events so far (a persistent session's queue entry): the
    /// receiver answers [`PeerEvent::Seen`] once its store has it (at once
    /// without a store). One goes after the publishes of a batch, not
    /// after each (see `Slot::push`).
    Fence {
        /// The sender's change number.
        seq: u64,
    },
    /// The receiver did not keep all it was sent up to the sender's
    /// change `seq` (a fence): it queued messages in a session another node
    /// had taken, its replica said (`ReplicaStale`). The acknowledgements
    /// that waited for it to keep a message crossed to it by then are
    /// refused, as when it goes away. Sent before any `Seen` that covers
    /// `seq`.
    Refused {
        /// The sender's fence.
        seq: u64,
    },
    /// The receiver applied the sender's changes up to `seq` (subscription
    /// interests, retained messages): what waited on them may go (a SUBACK,
    /// the acknowledgement of a retained PUBLISH), so that a client told
    /// "subscribed" or "retained" finds it so on every shard.
    Seen {
        /// The last change applied.
        seq: u64,
    },
    /// The receiver handled `bytes` (topic and payload) of the sender's
    /// [`PeerEvent::Publish`]es: the sender may cross that much more (see
    /// [`WINDOW`]).
    Consumed {
        /// Bytes handled since the last `Consumed`.
        bytes: u64,
    },
    /// Operations on persistent sessions the sender owns, for the
    /// receiver's copies (see `replica`); answered with
    /// [`PeerEvent::ReplicaAck`].
    Replicate {
        /// The sender's replication change number.
        seq: u64,
        /// The operations, oldest first, shared by every replica.
        ops: super::replica::ReplBatch,
    },
    /// The receiver keeps the sender's [`PeerEvent::Replicate`]s up to `seq`.
    ReplicaAck {
        /// The last change kept.
        seq: u64,
    },
    /// The receiver ignored the sender's changes of these client ids,
    /// made under these (older) claim epochs: another node owns them now.
    /// Sent before the `ReplicaAck` of the same batch (see
    /// `replica::fence`).
    ReplicaStale {
        /// Client id and the epoch its ignored changes named.
        clients: Vec<(Box<str>, u64)>,
    },
    /// The sender, which owned `client` until the cluster gave it to the
    /// receiver, has sent the receiver its session's full image (when it
    /// had a persistent one and the receiver is not among its replicas,
    /// which hold it already): a claim waiting for a current copy there
    /// goes on (see `Broker::awaits_handover`).
    Handover {
        /// The client id.
        client: Box<str>,
    },
    /// The sender was granted `client` under a claim whose previous owner
    /// held it at `epoch` and did not hand it over (away, dead, silent):
    /// a receiver that keeps a copy written under that epoch, newer than
    /// the sender's (see `replica::previous`), sends it (its full image,
    /// then [`PeerEvent::Handover`]); one that does not answers
    /// [`PeerEvent::NoCopy`].
    CopyWanted {
        /// The client id.
        client: Box<str>,
        /// The previous owner's claim epoch.
        epoch: u64,
        /// The version of the sender's copy under that epoch (0: it has
        /// none, or does not know it).
        have: u64,
    },
    /// The answer to [`PeerEvent::CopyWanted`] of a node that sends no
    /// copy.
    NoCopy {
        /// The client id.
        client: Box<str>,
    },
    /// The sender, the old owner of `client`'s persistent session, keeps
    /// relaying what matches its subscriptions to the receiver, the new
    /// owner, until every node has flushed (see `moves`). Sent just before
    /// the [`PeerEvent::Handover`].
    Relaying {
        /// The client id.
        client: Box<str>,
    },
    /// A message that matched `client`'s moving session at its old owner
    /// (the sender), for that session alone at the new owner.
    Relayed {
        /// The client id.
        client: Box<str>,
        /// The message (its payload shared, never copied).
        msg: Message,
        /// The QoS it is delivered at (already the subscription's).
        qos: zerofan_codec::QoS,
        /// The RETAIN flag to deliver.
        retain: bool,
        /// The matching subscription identifiers.
        sub_ids: Vec<u32>,
    },
    /// Every node has flushed `client`'s move: the sender relays no more.
    RelayDone {
        /// The client id.
        client: Box<str>,
    },
    /// The sender serves `client`'s persistent session now, its
    /// subscriptions announced before this: every node answers with
    /// [`PeerEvent::Flushed`].
    Moved {
        /// The client id.
        client: Box<str>,
    },
    /// What the sender sends after this that matches `client`'s session
    /// goes to its new owner (sent to every node).
    Flushed {
        /// The client id.
        client: Box<str>,
        /// The new owner (a cluster link carries its node id), when the
        /// flush is sent again on a link that started over: only that
        /// move's old owner takes it. `None`: the move of the latest
        /// `Moved`, as the links are ordered.
        to: Option<PeerId>,
    },
}

/// Bytes of publishes (topic and payload) a core crosses to one peer
/// before that peer confirms them ([`PeerEvent::Consumed`]); past it, the
/// publishers are not read until it does. A peer whose subscriber falls
/// behind asks for a publisher to be held ([`PeerEvent::Hold`]) in the
/// same turn it confirms, so at most this much more crosses before the
/// Hold is seen: the subscriber's shard keeps that much past its bound
/// (`deliver::HOLD_SLACK`), and nothing is dropped.
pub(crate) const WINDOW: u64 = 1024 * 1024;

/// Confirmed bytes a core gathers before it sends [`PeerEvent::Consumed`]:
/// a confirmation per batch would send a batch back (and wake the sender)
/// for every batch received. Well under [`WINDOW`], so a sender held for a
/// full window is always confirmed below it.
const CONFIRM_AT: u64 = WINDOW / 8;

/// Emptied batches a slot keeps for its next ones (given back by the
/// shell, see [`Peers::reuse`]), so that a steady stream of batches
/// allocates none.
const SPARES: usize = 4;

/// Outputs (SUBACKs, acknowledgements of retained messages) one connection
/// may have waiting for the peers to see a change; at this many its input
/// is held (see [`Peers::holds`]) until some go. A client that pipelines
/// SUBSCRIBEs while a peer is slow cannot grow the queue without bound.
pub(crate) const DEFERRED_PER_CONN: u32 = 256;

/// A batch buffer larger than this (in events) is freed, not kept: one
/// burst must not pin its memory.
const SPARE_MAX_EVENTS: usize = 4096;

/// The events for one peer, in order, batched per turn of the sender's
/// event loop.
#[derive(Debug)]
pub struct PeerBatch {
    /// Where the events go.
    pub to: PeerId,
    /// The events, oldest first.
    pub events: Vec<PeerEvent>,
}

/// The least a count taken at UNIX milliseconds `ms` starts from: above
/// any count taken at an earlier millisecond, with room for a million a
/// millisecond before the count runs ahead of the clock. A run's change
/// numbers start there (see [`Peers::new`]), and so do strand marks.
pub(crate) fn count_from_clock(ms: u64) -> u64 {
    ms.min((1 << 43) - 1) << 20
}

/// This core's view of its peers: who it is, who they are, what waits to be
/// sent to each, and which of them cannot take more for now.
#[derive(Debug, Default)]
pub(crate) struct Peers {
    me: Option<PeerId>,
    /// One slot per peer (never this core), in `PeerId` order.
    slots: Vec<Slot>,
    /// Connections whose input is held until a congested peer drains.
    holding: Vec<super::ids::ConnId>,
    /// Connections held because a subscriber at that peer is behind.
    held_for: Vec<(PeerId, super::ids::ConnId)>,
    /// Our last change number (see [`PeerEvent::Seen`]).
    seq: u64,
    /// Output waiting until every peer has seen a change: (change, to).
    deferred: std::collections::VecDeque<(u64, super::ids::ConnId, Deferred)>,
    /// How many of `deferred` each connection has (entries of none absent).
    owed: super::hash::HashMap<super::ids::ConnId, u32>,
}

#[derive(Debug)]
struct Slot {
    id: PeerId,
    outbox: Vec<PeerEvent>,
    /// Emptied batch buffers for the next batches (at most [`SPARES`]).
    spare: Vec<Vec<PeerEvent>>,
    congested: bool,
    /// The last of our changes this peer has applied.
    seen: u64,
    /// Unreachable for now (a node whose link is down): what waits for
    /// every peer does not wait for it.
    away: bool,
    /// Counts its publishes against [`WINDOW`]: a shard of this process.
    /// A cluster node's link has its own bounded queue instead.
    windowed: bool,
    /// Bytes of publishes crossed to it, not confirmed yet.
    unconfirmed: u64,
    /// Bytes of its publishes handled here, to confirm in the next batch.
    consumed: u64,
    /// A QoS 1/2 message crossed to it since the last durable fence.
    crossed_durable: bool,
    /// The last durable fence after a QoS 1/2 message crossed to it: an
    /// acknowledgement waiting on a later one lost nothing with it.
    durable_upto: u64,
    /// A `Fence` not queued yet (its change number), see [`Slot::push`].
    fence: Option<u64>,
}

impl Slot {
    /// `id`, having seen our changes up to `seen`, `windowed` when a
    /// shard of this process.
    fn new(id: PeerId, seen: u64, windowed: bool) -> Slot {
        Slot {
            id,
            outbox: Vec::new(),
            spare: Vec::new(),
            congested: false,
            seen,
            away: false,
            windowed,
            unconfirmed: 0,
            consumed: 0,
            crossed_durable: false,
            durable_upto: 0,
            fence: None,
        }
    }

    /// Congested, and not away (see [`Peers::congested`]).
    fn holds_publishers(&self) -> bool {
        self.congested && !self.away
    }

    /// Queue `event`. A `Fence` waits, in `fence`, until the next event
    /// that is not a `Publish` or the end of the batch, and a later fence
    /// replaces it: a fence asks the receiver to answer once what came
    /// before it is durable, so one moved past publishes answers later for
    /// more, and one per batch of publishes does what one per publish did.
    /// The receiver sends its copies to its replicas at each fence (their
    /// answers are part of its `Seen`): one per publish made a replica
    /// batch of every message.
    fn push(&mut self, event: PeerEvent) {
        match event {
            PeerEvent::Fence { seq } => {
                self.fence = Some(self.fence.map_or(seq, |f| f.max(seq)));
            }
            PeerEvent::Publish { .. } => self.outbox.push(event),
            event => {
                self.queue_fence();
                self.outbox.push(event);
            }
        }
    }

    /// Queue the fence that waits, if any.
    fn queue_fence(&mut self) {
        if let Some(seq) = self.fence.take() {
            self.outbox.push(PeerEvent::Fence { seq });
        }
    }
}

impl Peers {
    /// Peers `others` of the core `me`, started at UNIX milliseconds
    /// `started_ms`. Change numbers start from that clock, as marks do
    /// (`Strands::mark`): a restarted node gives none its former self
    /// gave, so a peer's late answer to that self (a `Seen` it held for
    /// its replicas, sent once the new link is up) cannot pass for an
    /// answer to this one and release an acknowledgement early.
    pub(crate) fn new(
        me: PeerId,
        others: impl IntoIterator<Item = PeerId>,
        started_ms: u64,
    ) -> Self {
        let first = count_from_clock(started_ms);
        let mut slots: Vec<Slot> = others
            .into_iter()
            .filter(|&p| p != me)
            .map(|id| Slot::new(id, first, true))
            .collect();
        slots.sort_by_key(|s| s.id);
        slots.dedup_by_key(|s| s.id);
        Peers {
            me: Some(me),
            slots,
            holding: Vec::new(),
            held_for: Vec::new(),
            seq: first,
            deferred: Default::default(),
            owed: Default::default(),
        }
    }

    /// Count from the clock at UNIX milliseconds `started_ms` (see
    /// [`Peers::new`]) when peers came before it: only while every peer
    /// has seen every change and nothing waits, so no number given out
    /// is skipped for a peer that has not answered it. Never backwards.
    pub(crate) fn start_at(&mut self, started_ms: u64) {
        let first = count_from_clock(started_ms);
        let idle = self.deferred.is_empty() && self.slots.iter().all(|s| s.seen == self.seq);
        if first > self.seq && idle {
            self.seq = first;
            for s in &mut self.slots {
                s.seen = first;
            }
        }
    }

    /// Add `peer` (a node that joined). It starts as having seen every
    /// change so far: it gets the full state instead (`peer_joined`).
    pub(crate) fn add(&mut self, peer: PeerId) {
        if Some(peer) == self.me || self.slot(peer).is_some() {
            return;
        }
        let i = self.slots.partition_point(|s| s.id < peer);
        let seen = self.seq;
        self.slots.insert(i, Slot::new(peer, seen, false));
    }

    /// Remove `peer` (a node that left): what it held is released, what
    /// waited for it to see a change may go. Returns the connections to
    /// read again and the output that may go.
    pub(crate) fn remove(
        &mut self,
        peer: PeerId,
    ) -> (Vec<super::ids::ConnId>, Vec<(super::ids::ConnId, Deferred)>) {
        let Ok(i) = self.slots.binary_search_by_key(&peer, |s| s.id) else {
            return (Vec::new(), Vec::new());
        };
        self.slots.remove(i);
        let mut wake = self.release_held_by(peer);
        if !self.slots.iter().any(|s| s.congested) {
            wake.append(&mut self.holding);
        }
        // Nothing new seen: only the minimum over the others may move.
        let ready = match self.slots.first().map(|s| (s.id, s.seen)) {
            Some((id, seen)) => self.seen(id, seen),
            None => self.seen_by_all(),
        };
        (wake, ready)
    }

    /// Forget every hold `peer` put on our connections; returns those free
    /// again.
    pub(crate) fn release_held_by(&mut self, peer: PeerId) -> Vec<super::ids::ConnId> {
        let mut free: Vec<_> = self
            .held_for
            .iter()
            .filter(|e| e.0 == peer)
            .map(|e| e.1)
            .collect();
        self.held_for.retain(|e| e.0 != peer);
        free.retain(|&c| !self.holds(c));
        free
    }

    /// With no peers left, nothing waits.
    /// Whether anything waits for peers' answers (see [`Peers::ready`]).
    #[inline]
    pub(crate) fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// What waits no more: every peer that is not away has seen its
    /// change (or no such peer is left).
    pub(crate) fn ready(&mut self) -> Vec<(super::ids::ConnId, Deferred)> {
        if self.deferred.is_empty() {
            return Vec::new();
        }
        let all = self
            .slots
            .iter()
            .filter(|s| !s.away)
            .map(|s| s.seen)
            .min()
            .unwrap_or(u64::MAX);
        let mut ready = Vec::new();
        while self.deferred.front().is_some_and(|d| d.0 <= all) {
            if let Some((_, conn, out)) = self.deferred.pop_front() {
                self.paid(conn);
                ready.push((conn, out));
            }
        }
        ready
    }

    /// One of `conn`'s deferred outputs went.
    fn paid(&mut self, conn: super::ids::ConnId) {
        if let Some(n) = self.owed.get_mut(&conn) {
            *n -= 1;
            if *n == 0 {
                self.owed.remove(&conn);
            }
        }
    }

    /// The acknowledgements waiting for `peer` to confirm a change up to
    /// `seq` that crossed to it, taken out: `peer` went away or lost its
    /// state (a restart; `seq` then unbounded), or refused them (see
    /// `PeerEvent::Refused`). The message they acknowledge may never have
    /// reached its store (see `Broker::refuse_unconfirmed`). A retained
    /// message reaches a node that comes back with the full state: only a
    /// crossed message may be lost.
    pub(crate) fn take_refused(
        &mut self,
        peer: PeerId,
        seq: u64,
    ) -> Vec<(super::ids::ConnId, super::outbox::Outgoing)> {
        let Some((seen, upto)) = self.slot(peer).map(|s| (s.seen, s.durable_upto)) else {
            return Vec::new();
        };
        // Waiting on it, and for a message that crossed to it: a node new
        // to this one (a first link) has lost nothing.
        let lost = |d: u64| d > seen && d <= upto.min(seq);
        tracing::debug!(
            ?peer,
            seen,
            upto,
            seq,
            waiting = self.deferred.len(),
            first = self.deferred.front().map(|d| d.0),
            "answers that crossed to a node checked"
        );
        if !self.deferred.iter().any(|d| lost(d.0)) {
            return Vec::new();
        }
        let mut refused = Vec::new();
        let mut keep = std::collections::VecDeque::with_capacity(self.deferred.len());
        for (d, conn, out) in std::mem::take(&mut self.deferred) {
            match out {
                Deferred::Ack { out, durable: true } if lost(d) => refused.push((conn, out)),
                out => keep.push_back((d, conn, out)),
            }
        }
        self.deferred = keep;
        for &(conn, _) in &refused {
            self.paid(conn);
        }
        refused
    }

    /// `peer` is unreachable (`away`), or back: while away, what waits
    /// for every peer goes without it. Returns what may go now.
    pub(crate) fn set_away(
        &mut self,
        peer: PeerId,
        away: bool,
    ) -> Vec<(super::ids::ConnId, Deferred)> {
        match self.slot(peer) {
            Some(s) => {
                s.away = away;
                let seen = s.seen;
                self.seen(peer, seen)
            }
            None => Vec::new(),
        }
    }

    fn seen_by_all(&mut self) -> Vec<(super::ids::ConnId, Deferred)> {
        self.owed.clear();
        self.deferred.drain(..).map(|(_, c, d)| (c, d)).collect()
    }

    /// This core's id, when it has peers at all.
    pub(crate) fn me(&self) -> Option<PeerId> {
        self.me.filter(|_| !self.slots.is_empty())
    }

    /// Whether there is anyone to talk to (with `--threads 1`, never: the
    /// routing path then does nothing peer-related).
    pub(crate) fn any(&self) -> bool {
        !self.slots.is_empty()
    }

    fn slot(&mut self, peer: PeerId) -> Option<&mut Slot> {
        let i = self.slots.binary_search_by_key(&peer, |s| s.id).ok()?;
        self.slots.get_mut(i)
    }

    #[inline]
    fn slot_ref(&self, peer: PeerId) -> Option<&Slot> {
        let i = self.slots.binary_search_by_key(&peer, |s| s.id).ok()?;
        self.slots.get(i)
    }

    /// Every peer, in `PeerId` order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.slots.iter().map(|s| s.id)
    }

    /// The peers that are not away.
    pub(crate) fn reachable(&self) -> Vec<PeerId> {
        let me = self.me();
        self.slots
            .iter()
            .filter(|s| Some(s.id) != me && !s.away)
            .map(|s| s.id)
            .collect()
    }

    /// Whether `peer` is a peer now and not away: one that can answer.
    pub(crate) fn is_live(&self, peer: PeerId) -> bool {
        self.slot_ref(peer).is_some_and(|s| !s.away)
    }

    /// Whether `peer` is away (see [`Peers::set_away`]).
    pub(crate) fn is_away(&self, peer: PeerId) -> bool {
        self.slot_ref(peer).is_some_and(|s| s.away)
    }

    /// Whether any peer is away (one test per message otherwise).
    #[inline]
    pub(crate) fn any_away(&self) -> bool {
        self.slots.iter().any(|s| s.away)
    }

    /// Queue `event` for `peer`.
    pub(crate) fn send(&mut self, peer: PeerId, event: PeerEvent) {
        if let Some(s) = self.slot(peer) {
            s.push(event);
        }
    }

    /// Queue an event for every peer; `make` builds each one's copy.
    pub(crate) fn send_all(&mut self, mut make: impl FnMut() -> PeerEvent) {
        for s in &mut self.slots {
            s.push(make());
        }
    }

    /// Whether `peer` cannot take more for now (see
    /// [`Broker::set_peer_congested`](super::Broker::set_peer_congested)).
    /// Never an away one: nothing waits for it, and its link's queue,
    /// which no one drains while it is away, drops what is past its bound
    /// (what is stranded for its sessions is kept by their copies), so
    /// holding publishers for it would stop them until it came back.
    pub(crate) fn congested(&self, peer: PeerId) -> bool {
        self.slot_ref(peer).is_some_and(Slot::holds_publishers)
    }

    /// Mark `peer` congested or not. Returns the connections to read again
    /// when no peer is congested any more.
    pub(crate) fn set_congested(
        &mut self,
        peer: PeerId,
        congested: bool,
    ) -> Vec<super::ids::ConnId> {
        if let Some(s) = self.slot(peer) {
            s.congested = congested;
        }
        self.release()
    }

    /// The connections held for a congested peer or a full window, when
    /// none is any more (also when a congested peer went away).
    pub(crate) fn release(&mut self) -> Vec<super::ids::ConnId> {
        if self
            .slots
            .iter()
            .any(|s| s.holds_publishers() || s.unconfirmed > WINDOW)
        {
            Vec::new()
        } else {
            std::mem::take(&mut self.holding)
        }
    }

    /// A publish of `bytes` crossed to `peer`; true when its window is now
    /// full (the publisher is to be held).
    pub(crate) fn crossed(&mut self, peer: PeerId, bytes: u64, durable: bool) -> bool {
        self.slot(peer).is_some_and(|s| {
            s.crossed_durable |= durable;
            if !s.windowed {
                return false;
            }
            s.unconfirmed = s.unconfirmed.saturating_add(bytes);
            s.unconfirmed > WINDOW
        })
    }

    /// A publish of `bytes` from `peer` was handled here.
    pub(crate) fn handled(&mut self, peer: PeerId, bytes: u64) {
        if let Some(s) = self.slot(peer).filter(|s| s.windowed) {
            s.consumed = s.consumed.saturating_add(bytes);
        }
    }

    /// `peer` confirmed `bytes`: the connections to read again, if no
    /// window is full and no peer congested any more.
    pub(crate) fn confirmed(&mut self, peer: PeerId, bytes: u64) -> Vec<super::ids::ConnId> {
        if let Some(s) = self.slot(peer) {
            s.unconfirmed = s.unconfirmed.saturating_sub(bytes);
        }
        self.release()
    }

    /// Hold `conn`'s input until no peer is congested.
    pub(crate) fn hold(&mut self, conn: super::ids::ConnId) {
        if !self.holding.contains(&conn) {
            self.holding.push(conn);
        }
    }

    /// Whether `conn` is held for a congested peer, for a subscriber
    /// behind at a peer, or for too many outputs waiting for the peers.
    #[inline]
    pub(crate) fn holds(&self, conn: super::ids::ConnId) -> bool {
        (!self.holding.is_empty() && self.holding.contains(&conn))
            || (!self.held_for.is_empty() && self.held_for.iter().any(|&(_, c)| c == conn))
            || (!self.owed.is_empty()
                && self
                    .owed
                    .get(&conn)
                    .is_some_and(|&n| n >= DEFERRED_PER_CONN))
    }

    /// `peer` holds (or releases) `conn`. True when `conn` is free again.
    pub(crate) fn held_for(&mut self, peer: PeerId, conn: super::ids::ConnId, hold: bool) -> bool {
        if hold {
            if !self.held_for.contains(&(peer, conn)) {
                self.held_for.push((peer, conn));
            }
            false
        } else {
            self.held_for.retain(|&e| e != (peer, conn));
            !self.holds(conn)
        }
    }

    /// Forget `conn` (it closed).
    pub(crate) fn forget(&mut self, conn: super::ids::ConnId) {
        self.holding.retain(|&c| c != conn);
        self.held_for.retain(|&(_, c)| c != conn);
    }

    /// Every peer that is not away has applied every change so far.
    pub(crate) fn caught_up(&self) -> bool {
        self.slots.iter().all(|s| s.away || s.seen >= self.seq)
    }

    /// Whether output for `conn` waits until every peer has seen a change.
    pub(crate) fn owes(&self, conn: super::ids::ConnId) -> bool {
        !self.owed.is_empty() && self.owed.contains_key(&conn)
    }

    /// The last change number handed out.
    pub(crate) fn last_seq(&self) -> u64 {
        self.seq
    }

    /// A new change number, for a change every peer must apply.
    pub(crate) fn stamp(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Durable fence `seq` was sent: it covers the QoS 1/2 messages that
    /// crossed since the last one (see `take_refused`).
    pub(crate) fn fenced_durable(&mut self, seq: u64) {
        for s in &mut self.slots {
            if std::mem::take(&mut s.crossed_durable) {
                s.durable_upto = seq;
            }
        }
    }

    /// Send `out` to `conn` once every peer has seen change `seq`. True
    /// when `conn` now has [`DEFERRED_PER_CONN`] waiting: its input is
    /// held until one goes.
    pub(crate) fn defer(&mut self, seq: u64, conn: super::ids::ConnId, out: Deferred) -> bool {
        self.deferred.push_back((seq, conn, out));
        let n = self.owed.entry(conn).or_insert(0);
        *n += 1;
        *n == DEFERRED_PER_CONN
    }

    /// `peer` has seen our changes up to `seq`: what may go now.
    pub(crate) fn seen(&mut self, peer: PeerId, seq: u64) -> Vec<(super::ids::ConnId, Deferred)> {
        // None of ours is past `self.seq`: a higher answer was meant for a
        // former self of this node (see `Peers::new`).
        let seq = seq.min(self.seq);
        if let Some(s) = self.slot(peer) {
            s.seen = s.seen.max(seq);
        }
        self.ready()
    }

    /// The last of our changes `peer` has applied (all, for a peer not
    /// known: nothing waits for it).
    pub(crate) fn seen_by(&self, peer: PeerId) -> u64 {
        self.slot_ref(peer).map_or(u64::MAX, |s| s.seen)
    }

    /// The next peer's batch of events, if any waits.
    pub(crate) fn poll(&mut self) -> Option<PeerBatch> {
        for s in &mut self.slots {
            s.queue_fence();
            // Confirmed with whatever else goes to it this turn (a Hold
            // first), or alone once it adds up to `CONFIRM_AT`.
            if s.consumed >= CONFIRM_AT || (s.consumed > 0 && !s.outbox.is_empty()) {
                let bytes = std::mem::take(&mut s.consumed);
                s.outbox.push(PeerEvent::Consumed { bytes });
            }
        }
        let s = self.slots.iter_mut().find(|s| !s.outbox.is_empty())?;
        let next = s.spare.pop().unwrap_or_default();
        Some(PeerBatch {
            to: s.id,
            events: std::mem::replace(&mut s.outbox, next),
        })
    }

    /// A batch polled here, emptied by its receiver: its buffer serves a
    /// next batch to the same peer (kept while few and not too large).
    pub(crate) fn reuse(&mut self, mut batch: PeerBatch) {
        batch.events.clear();
        if batch.events.capacity() > SPARE_MAX_EVENTS {
            return;
        }
        if let Some(s) = self.slot(batch.to) {
            if s.spare.len() < SPARES {
                s.spare.push(batch.events);
            }
        }
    }
}

/// The shard (of `shards`) that owns the session of `client_id`: the same
/// in every process and every run (FNV-1a), so that a client id always
/// lands on one shard. An empty id (the broker assigns one) stays where it
/// arrived.
pub fn shard_of(client_id: &[u8], shards: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in client_id {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // `shards` is at most a few hundred: the cast back cannot truncate.
    (h % shards.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Peers given before the log count from the log's clock once it
    /// comes, but only while nothing is unanswered; never backwards.
    #[test]
    fn peers_given_before_the_log_count_from_its_clock() {
        let ms = 1_700_000_000_000;
        let mut p = Peers::new(PeerId(0), [PeerId(1)], 0);
        assert_eq!(p.last_seq(), 0);
        p.start_at(ms);
        assert_eq!(p.last_seq(), count_from_clock(ms));
        assert!(p.caught_up(), "the peer counts as having seen it");
        p.start_at(ms - 1);
        assert_eq!(p.last_seq(), count_from_clock(ms), "never backwards");
        let mut busy = Peers::new(PeerId(0), [PeerId(1)], 0);
        let change = busy.stamp();
        busy.start_at(ms);
        assert_eq!(busy.last_seq(), change, "a change unanswered: kept");
    }

    fn publish() -> PeerEvent {
        let topic = zerofan_codec::MqttStr::try_from("t").unwrap();
        PeerEvent::Publish {
            msg: Message::owned(
                topic,
                bytes::Bytes::from_static(b"m"),
                zerofan_codec::QoS::AtLeastOnce,
                false,
                zerofan_codec::Props::default(),
                None,
            ),
            direct: true,
            shares: Vec::new(),
            id: None,
        }
    }

    /// What one batch to `PeerId(1)` holds: `P` for a publish, `F` and
    /// its change number for a fence, `other` for the rest.
    fn shape(p: &mut Peers) -> Vec<String> {
        let batch = p.poll().expect("a batch");
        assert_eq!(batch.to, PeerId(1));
        let shape = batch
            .events
            .iter()
            .map(|e| match e {
                PeerEvent::Publish { .. } => "P".to_string(),
                PeerEvent::Fence { seq } => format!("F{seq}"),
                _ => "other".to_string(),
            })
            .collect();
        assert!(p.poll().is_none(), "one batch");
        shape
    }

    /// A durable fence after every publish is sent once per batch, after
    /// the publishes, naming the last: the receiver sends its copies to
    /// its replicas at each fence, so one per publish made a replica batch
    /// of every message. Any other event queues the waiting fence first.
    #[test]
    fn fences_after_publishes_go_once_per_batch() {
        let mut p = Peers::new(PeerId(0), [PeerId(1)], 0);
        for seq in 1..=3 {
            p.send(PeerId(1), publish());
            p.send_all(|| PeerEvent::Fence { seq });
        }
        assert_eq!(shape(&mut p), ["P", "P", "P", "F3"]);

        p.send(PeerId(1), publish());
        p.send(PeerId(1), PeerEvent::Fence { seq: 4 });
        p.send(PeerId(1), PeerEvent::Seen { seq: 9 });
        p.send(PeerId(1), publish());
        p.send(PeerId(1), PeerEvent::Fence { seq: 5 });
        assert_eq!(shape(&mut p), ["P", "F4", "other", "P", "F5"]);

        p.send(PeerId(1), PeerEvent::Fence { seq: 6 });
        assert_eq!(shape(&mut p), ["F6"], "a fence alone goes too");
        assert!(p.poll().is_none());
    }
}

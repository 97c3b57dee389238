//! Persistent sessions copied to other nodes, so that losing the owner
//! node loses nothing it acknowledged.
//!
//! - The owner: every durable operation the core stages for a persistent
//!   session (see [`DurableLog`]) is recorded on its way to the store
//!   ([`Mirror`]) and sent, once per core event, to the replica set as one
//!   `PeerEvent::Replicate`. Acknowledgements that event produced (and
//!   every `Seen` this node answers) wait until the replicas answered
//!   `ReplicaAck` ([`Replication`]); a replica that is away is not waited
//!   for (counted).
//! - A replica: keeps what the owners sent as images ([`Images`]): per
//!   client id its subscriptions, queue, inflight, inbound QoS 2 ids and
//!   will, each message once however many entries reference it. Bounded
//!   in images and bytes; what does not fit is refused and counted.
//! - Failover: the node granted a client id installs its image as the
//!   live session (`Images::take` gives it in the store's recovery form).
//!
//! - On disk: a replica writes what it holds to its own store before it
//!   answers (see `disk`), each message once, and reads it back at start.
//!
//! Clean sessions write nothing to the store, so they cost nothing here
//! per message; only a connected clean client's will has a copy (see
//! `orphans`), bounded apart from persistent sessions' copies.

use super::hash::{HashMap, HashSet};
use super::ids::ConnId;
use super::orphans::ArmedWill;
use super::outbox::Outgoing;
use super::peer::PeerId;
use super::strand::{Mark, MarksRead};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use zerofan_store::{
    EntryId, InflightPhase, Lsn, MsgId, QueueEntry, RecoveredEntry, RecoveredInflight,
    RecoveredSession, RecoveredSubscription, SessionMeta, StoreError, StoreStats, StoredMessage,
    StoredWill, SubOptions,
};

use super::durable::DurableLog;

mod batch;
mod disk;
mod fence;
mod outgoing;
mod parts;
mod previous;
mod queue;
mod read;
mod stranded;
mod window;
pub(crate) use disk::{Disk, Drops};
pub(crate) use fence::Fence;
pub use outgoing::ReplBatch;
pub(crate) use outgoing::{frame_parts, image_batches, IMAGE_SPLIT};
pub(crate) use parts::Joined;
pub use previous::PreviousOwner;
pub(crate) use read::joins_read;
pub(crate) use stranded::QueueBound;

/// One durable operation of a persistent session, as an owner sends it to
/// its replicas. Entry and message ids are the owner's.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplOp {
    /// The session exists (or its expiry changed).
    Session {
        /// Client id.
        client: Box<str>,
        /// Expiry.
        meta: SessionMeta,
    },
    /// A full image of the session follows: forget what was known of it.
    Reset {
        /// Client id.
        client: Box<str>,
        /// Expiry.
        meta: SessionMeta,
        /// From the owner: how far it had read what other nodes stranded
        /// for it. A copy keeps its stranded entries past that (see
        /// `strand`); none: it keeps none.
        read: Option<MarksRead>,
    },
    /// The session ended.
    Drop {
        /// Client id.
        client: Box<str>,
    },
    /// A subscription was added or replaced.
    Subscribe {
        /// Client id.
        client: Box<str>,
        /// Topic filter.
        filter: Box<str>,
        /// Options.
        options: SubOptions,
        /// Subscription identifier.
        id: Option<u32>,
    },
    /// A subscription was removed.
    Unsubscribe {
        /// Client id.
        client: Box<str>,
        /// Topic filter.
        filter: Box<str>,
    },
    /// A message that queue entries after it reference: sent once per
    /// replica and event, however many sessions queue it.
    Message {
        /// The owner's id of it.
        id: MsgId,
        /// The message (its payload shared, not copied).
        msg: Arc<StoredMessage>,
        /// The mark it was stranded with for this owner's sessions, if it
        /// was: a copy that holds it stranded drops that entry when the
        /// owner's own arrives (see `strand`).
        mark: Option<Mark>,
    },
    /// A queue entry was appended.
    Enqueue {
        /// Client id.
        client: Box<str>,
        /// The owner's id of the entry.
        entry: EntryId,
        /// The entry.
        item: QueueEntry,
    },
    /// A queue entry was removed unsent.
    Dequeue {
        /// Client id.
        client: Box<str>,
        /// The entry.
        entry: EntryId,
    },
    /// A queue entry went out with `pid`.
    Send {
        /// Client id.
        client: Box<str>,
        /// The entry.
        entry: EntryId,
        /// Its packet id.
        pid: u16,
    },
    /// PUBREC arrived for outbound `pid`.
    PubRec {
        /// Client id.
        client: Box<str>,
        /// Packet id.
        pid: u16,
    },
    /// Outbound `pid` is finished.
    Complete {
        /// Client id.
        client: Box<str>,
        /// Packet id.
        pid: u16,
    },
    /// Inbound QoS 2 `pid` was taken (PUBREC sent).
    Qos2Received {
        /// Client id.
        client: Box<str>,
        /// Packet id.
        pid: u16,
    },
    /// PUBREL arrived for inbound `pid`.
    Qos2Released {
        /// Client id.
        client: Box<str>,
        /// Packet id.
        pid: u16,
    },
    /// The changes of `client` that follow in this batch are made under
    /// the claim of `epoch` (see `fence`). Nodes of one build talk to each
    /// other: a plain operation of its own, not a versioned field.
    Epoch {
        /// Client id.
        client: Box<str>,
        /// The sender's claim epoch.
        epoch: u64,
        /// How many batches of `client`'s changes its owner had made under
        /// that claim, this one included (0: not counted): of two copies
        /// written under one claim, the higher holds more of the owner's
        /// changes (see `previous`).
        version: u64,
    },
    /// The receiver left the sender's replica set: forget every copy of
    /// the sender's sessions (one operation, however many there are).
    ForgetOwner,
    /// Part `index` of a batch sent in several because one link frame
    /// could not hold it ([`frame_parts`]), `last` on its final one: the
    /// receiver keeps the parts and applies them as one batch (see
    /// `parts`).
    Part {
        /// From 0, one more in each part.
        index: u32,
        /// The batch's last part.
        last: bool,
    },
    /// A will waits for its delay.
    SetWill {
        /// Client id.
        client: Box<str>,
        /// The will.
        will: Box<StoredWill>,
    },
    /// The will was published or cancelled.
    ClearWill {
        /// Client id.
        client: Box<str>,
    },
}

impl ReplOp {
    /// The session it is about (none for a message).
    pub(crate) fn client(&self) -> Option<&str> {
        match self {
            ReplOp::Message { .. } | ReplOp::ForgetOwner | ReplOp::Part { .. } => None,
            ReplOp::Session { client, .. }
            | ReplOp::Epoch { client, .. }
            | ReplOp::Reset { client, .. }
            | ReplOp::Drop { client }
            | ReplOp::Subscribe { client, .. }
            | ReplOp::Unsubscribe { client, .. }
            | ReplOp::Enqueue { client, .. }
            | ReplOp::Dequeue { client, .. }
            | ReplOp::Send { client, .. }
            | ReplOp::PubRec { client, .. }
            | ReplOp::Complete { client, .. }
            | ReplOp::Qos2Received { client, .. }
            | ReplOp::Qos2Released { client, .. }
            | ReplOp::SetWill { client, .. }
            | ReplOp::ClearWill { client } => Some(client),
        }
    }

    /// Bytes it stands for (for the figures).
    pub(crate) fn size(&self) -> usize {
        match self {
            ReplOp::Message { msg, .. } => msg.topic.len() + msg.payload.len() + 32,
            _ => 32,
        }
    }
}

// ----- the owner: recording what the store is told ------------------------

/// What the mirrored log recorded since the last flush.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    on: bool,
    ops: Vec<ReplOp>,
    /// Messages written (or named by the core) since the last flush, to
    /// send before the first entry that references them.
    known: HashMap<MsgId, Arc<StoredMessage>>,
    /// Messages already in `ops`.
    sent: HashSet<MsgId>,
    /// The marks of stranded messages among `known` (see `strand`).
    marks: HashMap<MsgId, Mark>,
    /// Persistent sessions claimed here since start (see
    /// `Broker::send_images`); one leaves when the store drops it.
    claimed: HashSet<Box<str>>,
    /// The claim epoch of each client id owned here (see `fence`).
    epochs: fence::Epochs,
}

impl Recorder {
    fn push(&mut self, op: ReplOp) {
        // A replica's own copies go to its store, not to its replicas.
        if self.on && !op.client().is_some_and(disk::is_copy) {
            if let Some(c) = op.client() {
                self.epochs.stamp(c, &mut self.ops);
            }
            self.ops.push(op);
        }
    }
}

/// The durable log with every session operation also recorded for the
/// replicas. Retained messages are not recorded: every node keeps them
/// already (`PeerEvent::Retain`).
pub(crate) struct Mirror {
    inner: Box<dyn DurableLog>,
    rec: Rc<RefCell<Recorder>>,
}

impl DurableLog for Mirror {
    fn put_message(&mut self, msg: &StoredMessage) -> Result<MsgId, StoreError> {
        let id = self.inner.put_message(msg)?;
        let mut r = self.rec.borrow_mut();
        if r.on {
            r.known.insert(id, Arc::new(msg.clone()));
        }
        Ok(id)
    }
    fn set_retained(&mut self, topic: &str, msg: MsgId) -> Result<(), StoreError> {
        self.inner.set_retained(topic, msg)
    }
    fn clear_retained(&mut self, topic: &str) -> Result<(), StoreError> {
        self.inner.clear_retained(topic)
    }
    fn put_session(&mut self, client_id: &str, meta: SessionMeta) -> Result<(), StoreError> {
        self.inner.put_session(client_id, meta)?;
        self.rec.borrow_mut().push(ReplOp::Session {
            client: client_id.into(),
            meta,
        });
        Ok(())
    }
    fn drop_session(&mut self, client_id: &str) -> Result<(), StoreError> {
        self.inner.drop_session(client_id)?;
        let mut r = self.rec.borrow_mut();
        r.claimed.remove(client_id);
        r.push(ReplOp::Drop {
            client: client_id.into(),
        });
        // Named in this batch already: the epoch may go with the session.
        r.epochs.end(client_id);
        Ok(())
    }
    fn subscribe(
        &mut self,
        client_id: &str,
        filter: &str,
        options: SubOptions,
        id: Option<u32>,
    ) -> Result<(), StoreError> {
        self.inner.subscribe(client_id, filter, options, id)?;
        self.rec.borrow_mut().push(ReplOp::Subscribe {
            client: client_id.into(),
            filter: filter.into(),
            options,
            id,
        });
        Ok(())
    }
    fn unsubscribe(&mut self, client_id: &str, filter: &str) -> Result<(), StoreError> {
        self.inner.unsubscribe(client_id, filter)?;
        self.rec.borrow_mut().push(ReplOp::Unsubscribe {
            client: client_id.into(),
            filter: filter.into(),
        });
        Ok(())
    }
    fn enqueue(&mut self, client_id: &str, entry: &QueueEntry) -> Result<EntryId, StoreError> {
        let id = self.inner.enqueue(client_id, entry)?;
        let mut r = self.rec.borrow_mut();
        if r.on && !disk::is_copy(client_id) {
            if !r.sent.contains(&entry.msg) {
                if let Some(msg) = r.known.get(&entry.msg).cloned() {
                    r.sent.insert(entry.msg);
                    let mark = r.marks.get(&entry.msg).copied();
                    r.ops.push(ReplOp::Message {
                        id: entry.msg,
                        msg,
                        mark,
                    });
                }
            }
            r.push(ReplOp::Enqueue {
                client: client_id.into(),
                entry: id,
                item: entry.clone(),
            });
        }
        Ok(id)
    }
    fn dequeue(&mut self, client_id: &str, entry: EntryId) -> Result<(), StoreError> {
        self.inner.dequeue(client_id, entry)?;
        self.rec.borrow_mut().push(ReplOp::Dequeue {
            client: client_id.into(),
            entry,
        });
        Ok(())
    }
    fn send(&mut self, client_id: &str, entry: EntryId, packet_id: u16) -> Result<(), StoreError> {
        self.inner.send(client_id, entry, packet_id)?;
        self.rec.borrow_mut().push(ReplOp::Send {
            client: client_id.into(),
            entry,
            pid: packet_id,
        });
        Ok(())
    }
    fn pubrec(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.inner.pubrec(client_id, packet_id)?;
        self.rec.borrow_mut().push(ReplOp::PubRec {
            client: client_id.into(),
            pid: packet_id,
        });
        Ok(())
    }
    fn complete(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.inner.complete(client_id, packet_id)?;
        self.rec.borrow_mut().push(ReplOp::Complete {
            client: client_id.into(),
            pid: packet_id,
        });
        Ok(())
    }
    fn qos2_received(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.inner.qos2_received(client_id, packet_id)?;
        self.rec.borrow_mut().push(ReplOp::Qos2Received {
            client: client_id.into(),
            pid: packet_id,
        });
        Ok(())
    }
    fn qos2_released(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.inner.qos2_released(client_id, packet_id)?;
        self.rec.borrow_mut().push(ReplOp::Qos2Released {
            client: client_id.into(),
            pid: packet_id,
        });
        Ok(())
    }
    fn set_will(&mut self, client_id: &str, will: &StoredWill) -> Result<(), StoreError> {
        // An armed will is for the replicas only (see
        // `Broker::dur_will_armed`), which keep it in memory only (see
        // `Disk::set_will`).
        if will.armed.is_none() {
            self.inner.set_will(client_id, will)?;
        }
        self.rec.borrow_mut().push(ReplOp::SetWill {
            client: client_id.into(),
            will: Box::new(will.clone()),
        });
        Ok(())
    }
    fn clear_will(&mut self, client_id: &str) -> Result<(), StoreError> {
        self.inner.clear_will(client_id)?;
        self.rec.borrow_mut().push(ReplOp::ClearWill {
            client: client_id.into(),
        });
        Ok(())
    }
    fn set_epoch(&mut self, client_id: &str, epoch: u64, version: u64) -> Result<(), StoreError> {
        // Not recorded: only a replica's copies store an epoch, and owners
        // name theirs with `ReplOp::Epoch`.
        self.inner.set_epoch(client_id, epoch, version)
    }
    fn commit(&mut self) -> Result<Lsn, StoreError> {
        self.inner.commit()
    }
    fn copies(&mut self) -> &mut dyn DurableLog {
        // Not recorded: a copy's message recorded as one this node's
        // sessions might send cost a clone and a map entry per message
        // (and each other operation a client id allocated to be dropped).
        self.inner.copies()
    }
    fn durable_lsn(&self) -> Lsn {
        self.inner.durable_lsn()
    }
    fn stats(&self) -> Option<StoreStats> {
        self.inner.stats()
    }
    fn counts_from_ms(&self) -> u64 {
        self.inner.counts_from_ms()
    }
}

/// What waits for the replicas.
#[derive(Debug)]
pub(crate) enum Waiter {
    /// A PUBACK / PUBREC.
    Ack(ConnId, Outgoing),
    /// A peer's `Seen` answer.
    Seen(PeerId, u64),
}

/// What the replicas' answers released.
#[derive(Debug)]
pub(crate) struct Ready {
    /// In order.
    pub(crate) waiters: Vec<Waiter>,
    /// Those that waited on changes a replica called stale: refused.
    pub(crate) refused: Vec<Waiter>,
    /// How many went without an away replica's answer.
    pub(crate) without: u64,
    /// The first that went without any replica's answer (every replica it
    /// was sent to away): on this node's disk only.
    pub(crate) alone: Option<usize>,
}

/// The owner's side: the replica count, what was sent to whom, and what
/// waits for their answers.
#[derive(Debug, Default)]
pub(crate) struct Replication {
    /// Copies kept of a persistent session, this node's included (0 or 1:
    /// none elsewhere).
    copies: usize,
    rec: Rc<RefCell<Recorder>>,
    /// The last change number sent.
    seq: u64,
    /// Per replica: the last change sent, the last answered.
    sent: BTreeMap<PeerId, (u64, u64)>,
    /// Output waiting for the replicas to have change `.0`.
    waiting: VecDeque<(u64, Waiter)>,
    /// Acknowledgements waiting, per connection (its later ones queue
    /// behind them, in order).
    per_conn: HashMap<ConnId, usize>,
    /// The replica set in force (see `Broker::replica_set_changed`).
    current: Vec<PeerId>,
    /// What replicas hold for other nodes.
    pub(crate) images: Images,
    /// Clean takeovers' drops not yet answered by every replica.
    pub(crate) drops: Drops,
    /// The link read in progress, if any (see `read`).
    read: read::LinkRead,
    /// Parts of batches too large for one frame, held until their last
    /// (see `parts`).
    pub(crate) parts: parts::Parts,
    /// Changes a replica called stale, as ranges (after, up to]: what
    /// waits on them is refused, not released (see
    /// [`Replication::taint`]). Bounded by the replicas' answers: each
    /// range goes once the waiters pass it.
    tainted: VecDeque<(u64, u64)>,
}

impl Replication {
    /// `peer` ignored some of the changes sent to it and not answered yet
    /// (`ReplicaStale`, before its answer): another node owns those
    /// sessions now, so what this node queued in them is nowhere else,
    /// and what waits on those changes must not be confirmed.
    pub(crate) fn taint(&mut self, peer: PeerId) {
        if let Some(&(sent, acked)) = self.sent.get(&peer) {
            if sent > acked {
                self.tainted.push_back((acked, sent));
            }
        }
    }

    /// Keep `copies` copies of each persistent session (this node's
    /// included).
    pub(crate) fn set_copies(&mut self, copies: usize) {
        self.copies = copies;
        self.rec.borrow_mut().on = copies > 1;
    }

    /// Whether persistent sessions are copied at all.
    pub(crate) fn on(&self) -> bool {
        self.copies > 1
    }

    /// `log`, with its session operations also recorded here.
    pub(crate) fn wrap(&self, log: Box<dyn DurableLog>) -> Box<dyn DurableLog> {
        Box::new(Mirror {
            inner: log,
            rec: self.rec.clone(),
        })
    }

    /// Whether the message `id` must still be named (with
    /// [`Replication::note_message`]) before an entry references it.
    pub(crate) fn wants_message(&self, id: MsgId) -> bool {
        let r = self.rec.borrow();
        r.on && !r.known.contains_key(&id) && !r.sent.contains(&id)
    }

    /// The message `id` (written in an earlier event) is about to be
    /// queued again.
    pub(crate) fn note_message(&self, id: MsgId, msg: StoredMessage) {
        self.rec.borrow_mut().known.insert(id, Arc::new(msg));
    }

    /// The message `id`, about to be queued, was stranded as `mark`: it
    /// goes to the replicas with it.
    pub(crate) fn note_mark(&self, id: MsgId, mark: Mark) {
        let mut r = self.rec.borrow_mut();
        if r.on {
            r.marks.insert(id, mark);
        }
    }

    /// `client` was claimed here: its session is this node's to copy.
    pub(crate) fn claim(&self, client: &str) {
        let mut r = self.rec.borrow_mut();
        if r.on && !r.claimed.contains(client) {
            r.claimed.insert(client.into());
        }
    }

    /// Whether `client` was claimed here since start.
    pub(crate) fn is_claimed(&self, client: &str) -> bool {
        self.rec.borrow().claimed.contains(client)
    }

    /// Forget what was recorded for `client` since the last call (its
    /// session moved to another node: the copies must stay).
    pub(crate) fn unrecord(&self, client: &str) {
        let mut r = self.rec.borrow_mut();
        r.ops.retain(|op| op.client() != Some(client));
        // Not owned here any more: nothing goes out under its old claim.
        r.epochs.end(client);
    }

    /// `client` was granted to this node under the claim of `epoch` (0:
    /// not known): its changes carry it from now on.
    pub(crate) fn set_epoch(&self, client: &str, epoch: u64) {
        let mut r = self.rec.borrow_mut();
        if r.on && epoch > 0 {
            r.epochs.set(client, epoch);
        }
    }

    /// The epoch `client` is owned under here, if known.
    pub(crate) fn epoch(&self, client: &str) -> Option<u64> {
        self.rec.borrow().epochs.get(client)
    }

    /// Forget `client`'s epoch unless its session is copied from here
    /// (claimed): a clean session leaves nothing to fence.
    pub(crate) fn keep_epoch_if_claimed(&self, client: &str) {
        let mut r = self.rec.borrow_mut();
        if !r.claimed.contains(client) {
            r.epochs.end(client);
        }
    }

    /// `client`'s epoch as an operation to put before its changes, if known.
    pub(crate) fn epoch_op(&self, client: &str) -> Option<ReplOp> {
        let (epoch, version) = self.rec.borrow().epochs.get_versioned(client)?;
        Some(ReplOp::Epoch {
            client: client.into(),
            epoch,
            version,
        })
    }

    /// Whether operations were recorded since the last `take_ops`.
    pub(crate) fn has_recorded(&self) -> bool {
        !self.rec.borrow().ops.is_empty()
    }

    /// The recorded operations since the last call.
    pub(crate) fn take_ops(&mut self) -> Vec<ReplOp> {
        let mut r = self.rec.borrow_mut();
        r.known.clear();
        r.sent.clear();
        r.marks.clear();
        r.epochs.batch_taken();
        std::mem::take(&mut r.ops)
    }

    /// The replica set among `peers` (sorted, reachable): the first
    /// `copies - 1`.
    pub(crate) fn targets(&self, peers: impl Iterator<Item = PeerId>) -> Vec<PeerId> {
        peers.take(self.copies.saturating_sub(1)).collect()
    }

    /// The replica set in force.
    pub(crate) fn current(&self) -> &[PeerId] {
        &self.current
    }

    /// Make `set` the replica set; returns the one before.
    pub(crate) fn set_current(&mut self, set: Vec<PeerId>) -> Vec<PeerId> {
        std::mem::replace(&mut self.current, set)
    }

    /// Number this run's changes from UNIX milliseconds `started_ms`, as
    /// the peers' are (`peer::count_from_clock`): a replica's late answer to
    /// this node's former self cannot pass for an answer to this one.
    /// Only before the first change.
    pub(crate) fn start_at(&mut self, started_ms: u64) {
        if self.seq == 0 {
            self.seq = super::peer::count_from_clock(started_ms);
        }
    }

    /// The change number the next [`Replication::stamp`] gives.
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq + 1
    }

    /// Whether something sent to `peer` is not answered yet.
    pub(crate) fn unanswered(&self, peer: PeerId) -> bool {
        self.sent
            .get(&peer)
            .is_some_and(|(sent, acked)| sent > acked)
    }

    /// A new change number for operations sent to `to`.
    pub(crate) fn stamp(&mut self, to: &[PeerId]) -> u64 {
        self.seq += 1;
        for p in to {
            self.sent.entry(*p).or_insert((0, 0)).0 = self.seq;
        }
        self.seq
    }

    /// Whether something sent is not answered yet by a replica that is
    /// not away, or something waits.
    fn outstanding(&self, away: &dyn Fn(PeerId) -> bool) -> bool {
        !self.waiting.is_empty()
            || self
                .sent
                .iter()
                .any(|(p, (sent, acked))| sent > acked && !away(*p))
    }

    /// Hold a peer's `Seen` answer until the replicas have every change
    /// sent so far (true), if any is unanswered.
    pub(crate) fn wait_seen(
        &mut self,
        peer: PeerId,
        seq: u64,
        away: &dyn Fn(PeerId) -> bool,
    ) -> bool {
        if !self.outstanding(away) {
            return false;
        }
        self.waiting.push_back((self.seq, Waiter::Seen(peer, seq)));
        true
    }

    /// Hold an acknowledgement until the replicas have every change sent
    /// so far.
    pub(crate) fn hold_ack(&mut self, conn: ConnId, out: Outgoing) {
        *self.per_conn.entry(conn).or_insert(0) += 1;
        self.waiting.push_back((self.seq, Waiter::Ack(conn, out)));
    }

    /// Whether acknowledgements of `conn` wait for the replicas: what
    /// follows for it waits behind them.
    #[inline]
    pub(crate) fn holds(&self, conn: ConnId) -> bool {
        !self.per_conn.is_empty() && self.per_conn.contains_key(&conn)
    }

    /// `peer` answered change `seq`, or is gone (`seq == u64::MAX` with
    /// `forget`). What may go, as [`Replication::ready`] says.
    pub(crate) fn answered(
        &mut self,
        peer: PeerId,
        seq: u64,
        forget: bool,
        away: &dyn Fn(PeerId) -> bool,
    ) -> Ready {
        if forget {
            self.sent.remove(&peer);
        } else if let Some(s) = self.sent.get_mut(&peer) {
            // None of ours is past `self.seq`: a higher answer was meant
            // for a former self of this node.
            s.1 = s.1.max(seq.min(self.seq));
            let sent = &self.sent;
            self.drops
                .settle(|d| sent.values().all(|(sent, acked)| *acked >= d || *sent < d));
        }
        self.ready(away)
    }

    /// What waits no more, in order.
    pub(crate) fn ready(&mut self, away: &dyn Fn(PeerId) -> bool) -> Ready {
        let mut out = Vec::new();
        let mut refused = Vec::new();
        let mut without = 0;
        let mut alone = None;
        while let Some(&(seq, _)) = self.waiting.front() {
            let mut skipped = false;
            let mut kept = false;
            let done = self.sent.iter().all(|(p, (sent, acked))| {
                if *sent < seq {
                    true
                } else if *acked >= seq {
                    kept = true;
                    true
                } else if away(*p) {
                    skipped = true;
                    true
                } else {
                    false
                }
            });
            if !done {
                break;
            }
            let tainted = self
                .tainted
                .iter()
                .any(|&(after, upto)| seq > after && seq <= upto);
            if skipped && !kept && alone.is_none() && !tainted {
                alone = Some(out.len());
            }
            let Some((_, w)) = self.waiting.pop_front() else {
                break;
            };
            if let Waiter::Ack(c, _) = &w {
                if let Some(n) = self.per_conn.get_mut(c) {
                    *n -= 1;
                    if *n == 0 {
                        self.per_conn.remove(c);
                    }
                }
            }
            if tainted {
                refused.push(w);
                continue;
            }
            without += u64::from(skipped);
            out.push(w);
        }
        // A range no waiter can fall in any more goes.
        let next = self.waiting.front().map_or(self.seq + 1, |w| w.0);
        self.tainted.retain(|&(_, upto)| upto >= next);
        Ready {
            waiters: out,
            refused,
            without,
            alone,
        }
    }

    /// Forget `conn` (it closed): its acknowledgements are not sent.
    pub(crate) fn forget(&mut self, conn: ConnId) {
        if self.per_conn.remove(&conn).is_some() {
            self.waiting
                .retain(|(_, w)| !matches!(w, Waiter::Ack(c, _) if *c == conn));
        }
    }
}

// ----- the replica: images of other nodes' sessions -----------------------

/// Most images a node keeps for other nodes.
pub(crate) const MAX_IMAGES: usize = 100_000;
/// Most message bytes (topic and payload) those images may hold.
pub(crate) const MAX_BYTES: usize = 256 << 20;

/// An outbound delivery in flight: packet id, phase, and what was sent
/// (none once PUBREC arrived).
type InflightCopy = (u16, InflightPhase, Option<(EntryId, QueueEntry)>);

/// One session as a replica knows it.
#[derive(Debug, Default)]
struct Image {
    owner: Option<PeerId>,
    meta: SessionMeta,
    subs: BTreeMap<Box<str>, (SubOptions, Option<u32>)>,
    queue: queue::Queue,
    /// By send order: (packet id, phase, entry), found by packet id
    /// without a scan (see `window`).
    inflight: window::Window,
    qos2: BTreeSet<u16>,
    will: Option<Box<StoredWill>>,
    /// The owner's queue entry id -> this node's store's.
    local: HashMap<EntryId, EntryId>,
    /// Entries of the batch being applied left out of the store (see
    /// `batch`).
    quiet: Vec<EntryId>,
    /// Packet ids out without a store record (see `batch`).
    unwritten: HashSet<u16>,
    /// The newest claim epoch known for the client id when the copy was
    /// last written, stored with it (0: none known): read back at start,
    /// it fences the copy and judges it at a claim (see `previous`).
    epoch: u64,
    /// The version of the owner's last batch applied (see
    /// `ReplOp::Epoch`; 0: not known, as for a copy read back from disk).
    version: u64,
}

impl Image {
    /// Whether this copy is written to this node's store: not one of a
    /// clean session (expiry 0), which holds only its client's armed will
    /// and is not read back after a restart (its owner sends it again, see
    /// `disk::restore`), so writing it would cost a record per clean
    /// CONNECT with a will, and its drop another, for nothing.
    fn on_disk(&self) -> bool {
        self.meta.expiry_interval > 0
    }

    /// Whether this copy is `owner`'s and holds a will (see `orphans`).
    fn holds_will_of(&self, owner: PeerId) -> bool {
        self.owner == Some(owner) && self.will.is_some()
    }
}

/// What a replica holds of other nodes' sessions. Each message is kept
/// once per owner, counted by the entries that reference it.
#[derive(Debug)]
pub(crate) struct Images {
    by_client: HashMap<Box<str>, Image>,
    messages: HashMap<(PeerId, MsgId), (Arc<StoredMessage>, usize)>,
    /// The id in this node's store of each message written there.
    local_msg: HashMap<(PeerId, MsgId), MsgId>,
    /// Message bytes held (topic and payload).
    bytes: usize,
    /// Images of clean sessions among them (see `held`).
    clean: usize,
    max_images: usize,
    max_bytes: usize,
    /// Operations applied.
    pub(crate) applied: u64,
    /// Operations refused: the images were full (or named a message that
    /// was refused).
    pub(crate) refused: u64,
    /// Images dropped because their session expired.
    pub(crate) expired: u64,
    /// Entries left out of the store since the last `take_unwritten`.
    unwritten: u64,
    /// The newest claim epoch seen per client id.
    pub(crate) fence: Fence,
    /// The last id given to a stranded entry or message.
    stranded_next: u64,
    /// Images held per owner: a message stranded for an owner with none
    /// here costs no scan.
    per_owner: HashMap<PeerId, usize>,
    /// Marks of messages held (see `stranded`).
    marks: stranded::Marks,
    /// Stranded entries the owner's own replaced since the last
    /// `take_unstranded`.
    unstranded: u64,
    /// Stranded entries kept past a full image since the last
    /// `take_unstranded`.
    restranded: u64,
    /// Batches left unapplied because the copy here held them already:
    /// another node's copy no newer than it, or its owner's batch that a
    /// link delivered late (see `previous`).
    pub(crate) batches_had: u64,
    /// Client ids whose claim asked the other nodes for a copy, none or
    /// one read back from disk being here, with the owner the claim named
    /// (see `previous`). Oldest first, at most [`MAX_ASKED`].
    asked: VecDeque<(Box<str>, previous::PreviousOwner)>,
}

/// Copies asked for that are remembered: as many claims as wait for
/// copies at once (`claims::MAX_HANDED`).
const MAX_ASKED: usize = 1024;

impl Default for Images {
    fn default() -> Self {
        Images {
            by_client: HashMap::default(),
            messages: HashMap::default(),
            local_msg: HashMap::default(),
            bytes: 0,
            clean: 0,
            max_images: MAX_IMAGES,
            max_bytes: MAX_BYTES,
            applied: 0,
            refused: 0,
            expired: 0,
            unwritten: 0,
            fence: Fence::default(),
            stranded_next: 0,
            per_owner: HashMap::default(),
            marks: stranded::Marks::default(),
            unstranded: 0,
            restranded: 0,
            batches_had: 0,
            asked: VecDeque::new(),
        }
    }
}

/// Whose changes a batch applied to the images holds.
enum Batch {
    /// The owner's (or a new owner's): the versions it names follow them.
    Owners,
    /// Another node's newer copy of `client`, standing for the owner's;
    /// then the stranded entries of the copy it replaced, unless it holds
    /// them (see `previous`).
    Copy(Box<str>, Vec<stranded::Unread>),
    /// Messages this node strands for an owner away: no part of its
    /// changes, so no version.
    Stranded,
}

fn msg_size(m: &StoredMessage) -> usize {
    m.topic.len() + m.payload.len()
}

impl Images {
    /// Bound what is kept.
    pub(crate) fn set_limits(&mut self, images: usize, bytes: usize) {
        self.max_images = images;
        self.max_bytes = bytes;
        self.fence.set_limit(images);
    }

    /// Images held.
    pub(crate) fn len(&self) -> usize {
        self.by_client.len()
    }

    /// Images held of clean sessions (`clean`) or of persistent ones:
    /// each kind is bounded on its own, so that clean clients' wills never
    /// take the room of persistent sessions' copies.
    fn held(&self, clean: bool) -> usize {
        if clean {
            self.clean
        } else {
            self.by_client.len() - self.clean
        }
    }

    /// Message bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether an image of `client` is held.
    pub(crate) fn has(&self, client: &str) -> bool {
        self.by_client.contains_key(client)
    }

    /// Client ids of `owner`'s copies that hold a will (armed or
    /// pending), with the claim each was written under (0: not known):
    /// should `owner` be dead, a node holding them publishes it (see
    /// `orphans`).
    pub(crate) fn wills_of(&self, owner: PeerId) -> Vec<(Box<str>, u64)> {
        self.owned_by(owner)
            .filter(|(_, i)| i.will.is_some())
            .map(|(c, i)| (c.clone(), i.epoch))
            .collect()
    }

    /// `owner`'s copies here (none scanned when it has none).
    fn owned_by(&self, owner: PeerId) -> impl Iterator<Item = (&Box<str>, &Image)> {
        let any = self.per_owner.get(&owner).is_some_and(|n| *n > 0);
        self.by_client
            .iter()
            .take_while(move |_| any)
            .filter(move |(_, i)| i.owner == Some(owner))
    }

    /// The owner of the copy of `client` here, and the newest claim epoch
    /// known when it was last written (0: none).
    pub(crate) fn owner_of(&self, client: &str) -> Option<(PeerId, u64)> {
        let i = self.by_client.get(client)?;
        Some((i.owner?, i.epoch))
    }

    /// `owner`'s copies here whose will is armed (its client was connected
    /// when the copy was last written), with the claim each was written
    /// under; none of an unknown claim (see `orphans`).
    pub(crate) fn armed_wills_of(&self, owner: PeerId) -> Vec<ArmedWill> {
        self.owned_by(owner)
            .filter(|(_, i)| i.epoch > 0)
            .filter_map(|(c, i)| {
                let w = i.will.as_ref().filter(|w| w.armed.is_some())?;
                Some(ArmedWill {
                    client_id: c.clone(),
                    epoch: i.epoch,
                    due: i.meta.expiry_interval == 0 || w.armed == Some(0),
                    will: w.clone(),
                })
            })
            .collect()
    }

    /// Give `client`'s copy `will` again (one its owner's restarted run
    /// wrote over): false without a copy.
    pub(crate) fn rearm(
        &mut self,
        client: &str,
        will: Box<StoredWill>,
        disk: &mut Disk<'_>,
    ) -> bool {
        let Some(i) = self.by_client.get_mut(client) else {
            return false;
        };
        if i.on_disk() {
            disk.set_will(client, &will);
        }
        i.will = Some(will);
        true
    }

    /// The connection `client`'s copy holds a will armed for was lost at
    /// UNIX milliseconds `ms`: the will is pending, due its delay after
    /// that (at most the session's expiry), as a will of a client that
    /// left is.
    pub(crate) fn will_lost_at(&mut self, client: &str, ms: u64, disk: &mut Disk<'_>) {
        let Some(i) = self.by_client.get_mut(client) else {
            return;
        };
        let expiry = i.meta.expiry_interval;
        let on_disk = i.on_disk();
        let Some(w) = i.will.as_mut() else {
            return;
        };
        let Some(delay) = w.armed.take() else {
            return;
        };
        let wait = crate::core::message::will_wait(delay, expiry);
        w.due_at_ms = ms.saturating_add(u64::from(wait) * 1000);
        if on_disk {
            disk.set_will(client, w);
        }
    }

    /// Whether the copy of `client` here is `owner`'s and holds a will.
    pub(crate) fn holds_will_of(&self, client: &str, owner: PeerId) -> bool {
        self.by_client
            .get(client)
            .is_some_and(|i| i.holds_will_of(owner))
    }

    /// Whether the copy of `client` here is of a clean session (expiry
    /// 0): it holds only its client's will, armed (see `orphans`).
    pub(crate) fn is_clean(&self, client: &str) -> bool {
        self.by_client
            .get(client)
            .is_some_and(|i| i.meta.expiry_interval == 0)
    }

    /// The will the copy of `client` here holds (armed or pending).
    pub(crate) fn will_of(&self, client: &str) -> Option<&StoredWill> {
        self.by_client.get(client)?.will.as_deref()
    }

    /// The node that wrote `client`'s image, when it has subscriptions (a
    /// session whose matches that node relays when it hands it over).
    pub(crate) fn subscribed_owner(&self, client: &str) -> Option<PeerId> {
        self.by_client
            .get(client)
            .filter(|i| !i.subs.is_empty())
            .and_then(|i| i.owner)
    }

    fn unref(&mut self, owner: PeerId, msg: MsgId) {
        let key = (owner, msg);
        if let Some(m) = self.messages.get_mut(&key) {
            m.1 = m.1.saturating_sub(1);
            if m.1 == 0 {
                self.forget_message(key);
            }
        }
    }

    /// Nothing references the message: the store forgets it at its next
    /// commit too.
    fn forget_message(&mut self, key: (PeerId, MsgId)) {
        if let Some((m, _)) = self.messages.remove(&key) {
            self.bytes -= msg_size(&m);
        }
        self.local_msg.remove(&key);
        self.marks.forget(key);
    }

    fn drop_image(&mut self, client: &str, disk: &mut Disk<'_>) {
        let Some(img) = self.by_client.remove(client) else {
            return;
        };
        if let Some(n) = img.owner.and_then(|o| self.per_owner.get_mut(&o)) {
            *n = n.saturating_sub(1);
        }
        if img.meta.expiry_interval == 0 {
            self.clean = self.clean.saturating_sub(1);
        }
        if img.on_disk() {
            disk.drop_session(client);
        }
        let Some(owner) = img.owner else { return };
        for e in img.queue.values() {
            self.unref(owner, e.msg);
        }
        for (_, _, e) in img.inflight.iter() {
            if let Some((_, e)) = e {
                self.unref(owner, e.msg);
            }
        }
    }

    /// Apply `ops` from `from`. Operations on a session another node owns
    /// now are ignored: `Session` or `Reset` from a new owner starts the
    /// image over. A copy another node sent under the same claim as the
    /// one here replaces it only when newer, as its owner's (see
    /// `previous`).
    /// `now_ms` (UNIX milliseconds) tells which images expired: they
    /// make room when the images are full.
    pub(crate) fn apply(
        &mut self,
        from: PeerId,
        ops: Vec<ReplOp>,
        now_ms: u64,
        disk: &mut Disk<'_>,
    ) {
        match self.judge_batch(from, &ops) {
            previous::Judged::Owners => self.apply_batch(from, ops, Batch::Owners, now_ms, disk),
            previous::Judged::Older => self.batches_had += 1,
            previous::Judged::Newer { owner, kept } => {
                let (client, ops) = self.as_owners(ops, now_ms);
                self.apply_batch(owner, ops, Batch::Copy(client, kept), now_ms, disk);
            }
            previous::Judged::Asked { client, owner } => {
                self.asked.retain(|(c, _)| *c != client);
                self.drop_image(&client, disk);
                let (client, ops) = self.as_owners(ops, now_ms);
                self.apply_batch(owner, ops, Batch::Copy(client, Vec::new()), now_ms, disk);
            }
        }
    }

    /// [`Images::apply`] of `ops`, as `from`'s.
    fn apply_batch(
        &mut self,
        from: PeerId,
        ops: Vec<ReplOp>,
        batch: Batch,
        now_ms: u64,
        disk: &mut Disk<'_>,
    ) {
        // Messages named in this batch but referenced by no entry go at
        // its end.
        let mut fresh: Vec<MsgId> = Vec::new();
        let quiet = if disk.on() {
            batch::ends_within(&ops)
        } else {
            Vec::new()
        };
        let mut left_out: HashSet<Box<str>> = HashSet::default();
        // The epochs and versions this batch names (see `fence`), with the
        // client ids it changes without one (version 0); those whose
        // changes the copy here holds already (see `previous`).
        let mut epochs: HashMap<Box<str>, (u64, u64)> = HashMap::default();
        let mut had: HashSet<Box<str>> = HashSet::default();
        // Client ids this batch carries a full image of.
        let mut full: HashSet<Box<str>> = HashSet::default();
        let mut ops = ops.into_iter().enumerate().peekable();
        while let Some((n, op)) = ops.next() {
            let op = match op {
                ReplOp::Epoch {
                    client,
                    epoch,
                    version,
                } => {
                    let full = matches!(ops.peek(), Some((_, ReplOp::Reset { .. })));
                    if !full && self.holds_version(from, &client, epoch, version) {
                        self.batches_had += 1;
                        had.insert(client.clone());
                    }
                    epochs.insert(client, (epoch, version));
                    continue;
                }
                ReplOp::ForgetOwner => {
                    self.forget_owner(from, disk);
                    continue;
                }
                op => op,
            };
            if let Some(c) = op.client() {
                if !had.is_empty() && had.contains(c) {
                    continue;
                }
                let epoch = match epochs.get(c) {
                    Some(e) => e.0,
                    None if matches!(batch, Batch::Stranded) => 0,
                    None => {
                        epochs.insert(c.into(), (0, 0));
                        0
                    }
                };
                if !self.fenced(from, c, epoch, disk) {
                    continue;
                }
            }
            if let ReplOp::Reset { client, .. } = &op {
                full.insert(client.clone());
            }
            let q = quiet.get(n).copied().unwrap_or(false);
            if q {
                if let Some(c) = op.client().filter(|c| !left_out.contains(*c)) {
                    left_out.insert(c.into());
                }
            }
            if self.apply_one(from, op, &mut fresh, now_ms, q, disk) {
                self.applied += 1;
            } else {
                self.refused += 1;
            }
        }
        if !left_out.is_empty() {
            self.write_left_out(from, left_out, disk);
        }
        for (c, (epoch, version)) in epochs {
            if had.contains(&c) {
                continue;
            }
            if let Some(img) = self.by_client.get_mut(&c) {
                // A batch of the owner's missing before this one (shed
                // from a link's queue while this node was away): the copy
                // holds less than this version says, and keeps the last
                // it holds whole until a full image, so that a claim
                // here asks for a newer copy (see `previous`).
                let whole = version <= img.version.saturating_add(1) || full.contains(&c);
                if whole && img.owner == Some(from) && (epoch == 0 || img.epoch == epoch) {
                    if version > img.version && disk.on() && img.on_disk() {
                        // With the batch's changes, so that a copy read
                        // back from disk is judged by it (`previous`).
                        disk.set_epoch(&c, img.epoch, version);
                    }
                    img.version = version;
                }
            }
        }
        if let Batch::Copy(c, kept) = batch {
            self.merge_stranded(from, &c, kept, &mut fresh, now_ms, disk);
        }
        for id in fresh {
            let key = (from, id);
            if self.messages.get(&key).is_some_and(|m| m.1 == 0) {
                self.forget_message(key);
            }
        }
    }

    /// Whether a change of `client` at `epoch` from `from` may apply
    /// (false: stale, counted); drops an older owner's image first.
    fn fenced(&mut self, from: PeerId, client: &str, epoch: u64, disk: &mut Disk<'_>) -> bool {
        // A change naming no epoch over a copy read back from disk is
        // judged as its owner's: an owner restarted from its own store
        // names none until its client claims the id again, and refusing
        // it would leave that copy behind while the owner, answered all
        // the same (it cannot be told which claim it missed), acknowledges
        // what the copy lacks. So it applies, as before epochs were stored.
        let held = self.by_client.get(client).map(|i| {
            let owns = i.owner == Some(from) || (epoch == 0 && i.owner == Some(disk::RESTORED));
            (owns, i.epoch)
        });
        let by_client = &self.by_client;
        let (verdict, drop) = self.fence.judge(client, epoch, held.map(|h| h.0), &|c| {
            by_client.contains_key(c)
        });
        if drop {
            self.drop_image(client, disk);
        } else if verdict == fence::Verdict::Apply && held.is_some_and(|h| epoch > h.1) {
            // The owner's newer claim: its copy here now stands under it.
            self.keep_epoch(client, disk);
        }
        verdict == fence::Verdict::Apply
    }

    /// Store the epoch known for `client` with its copy when it is newer
    /// than the one stored, in the commit of the changes it fences, so a
    /// restart reads it back (see `disk`).
    fn keep_epoch(&mut self, client: &str, disk: &mut Disk<'_>) {
        let known = self.fence.known(client);
        if let Some(img) = self.by_client.get_mut(client) {
            if known > img.epoch {
                img.epoch = known;
                if img.on_disk() {
                    disk.set_epoch(client, known, img.version);
                }
            }
        }
    }

    /// Every image `from` owns goes: this node left its replica set.
    fn forget_owner(&mut self, from: PeerId, disk: &mut Disk<'_>) {
        let gone: Vec<Box<str>> = self
            .by_client
            .iter()
            .filter(|(_, i)| i.owner == Some(from))
            .map(|(c, _)| c.clone())
            .collect();
        for c in &gone {
            self.drop_image(c, disk);
        }
    }

    /// This node was granted `client` at `epoch`: older owners' changes
    /// of it are stale from now on. A copy held here is not stored with
    /// the epoch: the same event takes it or forgets it
    /// (`Broker::install_replica`).
    pub(crate) fn claimed(&mut self, client: &str, epoch: u64) {
        let by_client = &self.by_client;
        self.fence
            .claimed(client, epoch, &|c| by_client.contains_key(c));
    }

    /// Another node was granted `client` under a claim after the one at
    /// `epoch` (it asks for the copy written under that one): changes
    /// naming `epoch` are stale from now on, so that its owner, cut off
    /// from that node, is told so rather than confirmed what the copy
    /// sent there lacks.
    pub(crate) fn superseded(&mut self, client: &str, epoch: u64) {
        self.claimed(client, epoch.saturating_add(1));
    }

    /// The image of `client` owned by `from`, if any.
    fn owned(&mut self, from: PeerId, client: &str) -> Option<&mut Image> {
        self.by_client
            .get_mut(client)
            .filter(|i| i.owner == Some(from))
    }

    /// `from` removed `entry` of `client` unsent.
    fn dequeue(&mut self, from: PeerId, client: &str, entry: EntryId, disk: &mut Disk<'_>) {
        let mut msg = None;
        if let Some(i) = self.owned(from, client) {
            msg = i.queue.remove(&entry).map(|e| e.msg);
            if let Some(l) = i.local.remove(&entry) {
                disk.dequeue(client, l);
            }
        }
        if let Some(m) = msg {
            self.unref(from, m);
        }
    }

    /// False when refused (full, or naming what is not there).
    fn apply_one(
        &mut self,
        from: PeerId,
        op: ReplOp,
        fresh: &mut Vec<MsgId>,
        now_ms: u64,
        quiet: bool,
        disk: &mut Disk<'_>,
    ) -> bool {
        let (full, read) = match &op {
            ReplOp::Reset { read, .. } => (true, read.clone()),
            _ => (false, None),
        };
        match op {
            ReplOp::Session { client, meta } | ReplOp::Reset { client, meta, .. } => {
                // A new owner, or a full image of the same one: start over.
                let over = matches!(
                    self.by_client.get(&*client),
                    Some(i) if full || i.owner != Some(from)
                );
                let unread = match &read {
                    Some(read) if over => self.unread_stranded(from, &client, read),
                    _ => Vec::new(),
                };
                if full {
                    tracing::debug!(
                        client = &*client,
                        ?from,
                        over,
                        kept = unread.len(),
                        ?read,
                        "full image"
                    );
                }
                if over {
                    self.drop_image(&client, disk);
                }
                let clean = meta.expiry_interval == 0;
                if !self.by_client.contains_key(&*client) {
                    if self.held(clean) >= self.max_images {
                        self.sweep(now_ms, disk);
                    }
                    if self.held(clean) >= self.max_images {
                        return false;
                    }
                    *self.per_owner.entry(from).or_default() += 1;
                    self.clean += usize::from(clean);
                    self.by_client.insert(
                        client.clone(),
                        Image {
                            owner: Some(from),
                            meta,
                            ..Image::default()
                        },
                    );
                }
                if let Some(i) = self.by_client.get_mut(&*client) {
                    if (i.meta.expiry_interval == 0) != clean {
                        self.clean = if clean {
                            self.clean + 1
                        } else {
                            self.clean.saturating_sub(1)
                        };
                        if clean {
                            // No longer kept on disk (see `Image::on_disk`).
                            disk.drop_session(&client);
                        }
                    }
                    i.meta = meta;
                }
                if !clean {
                    disk.put_session(&client, meta);
                }
                // A copy started (over) under a known claim stores it.
                self.keep_epoch(&client, disk);
                for kept in unread {
                    self.restrand(from, &client, kept, fresh, now_ms, disk);
                }
                true
            }
            ReplOp::Drop { client } => {
                // A copy read back from disk has no owner yet: anyone's
                // drop ends it (see `disk::RESTORED`).
                let restored = self
                    .by_client
                    .get(&*client)
                    .is_some_and(|i| i.owner == Some(disk::RESTORED));
                if restored || self.owned(from, &client).is_some() {
                    self.drop_image(&client, disk);
                }
                true
            }
            ReplOp::Subscribe {
                client,
                filter,
                options,
                id,
            } => match self.owned(from, &client) {
                Some(i) => {
                    disk.subscribe(&client, &filter, options, id);
                    i.subs.insert(filter, (options, id));
                    true
                }
                None => false,
            },
            ReplOp::Unsubscribe { client, filter } => {
                if let Some(i) = self.owned(from, &client) {
                    if i.subs.remove(&filter).is_some() {
                        disk.unsubscribe(&client, &filter);
                    }
                }
                true
            }
            ReplOp::Message { id, msg, mark } => {
                let key = (from, id);
                if self.messages.contains_key(&key) {
                    return true;
                }
                let size = msg_size(&msg);
                if self.bytes + size > self.max_bytes {
                    self.sweep(now_ms, disk);
                }
                if self.bytes + size > self.max_bytes {
                    return false;
                }
                self.bytes += size;
                self.messages.insert(key, (msg, 0));
                if let Some(m) = mark {
                    self.marks.named(key, m);
                }
                fresh.push(id);
                true
            }
            ReplOp::Enqueue {
                client,
                entry,
                item,
            } => {
                let key = (from, item.msg);
                let owned = self
                    .by_client
                    .get(&*client)
                    .is_some_and(|i| i.owner == Some(from));
                if !owned || !self.messages.contains_key(&key) {
                    return false;
                }
                // Ended within this batch: no record (see `batch`).
                let local = if quiet {
                    None
                } else {
                    self.enqueue_on_disk(key, &client, &item, disk)
                };
                let mut size = 0;
                if let Some(m) = self.messages.get_mut(&key) {
                    m.1 += 1;
                    size = msg_size(&m.0);
                }
                if let Some(i) = self.by_client.get_mut(&*client) {
                    if let Some(l) = local {
                        i.local.insert(entry, l);
                    }
                    if quiet {
                        i.quiet.push(entry);
                        self.unwritten += 1;
                    }
                    i.queue.insert(entry, item, size);
                }
                self.unstrand(key, &client, disk);
                true
            }
            ReplOp::Dequeue { client, entry } => {
                self.dequeue(from, &client, entry, disk);
                true
            }
            ReplOp::Send { client, entry, pid } => {
                let Some(i) = self.owned(from, &client) else {
                    return false;
                };
                let Some(e) = i.queue.remove(&entry) else {
                    return false;
                };
                let mut gone = None;
                if let Some(f) = i.inflight.remove(pid) {
                    gone = f.2.map(|(_, e)| e.msg);
                    if !i.end_unwritten(pid) {
                        disk.complete(&client, pid);
                    }
                }
                match i.local.remove(&entry) {
                    Some(l) => disk.send(&client, l, pid),
                    None if disk.on() => i.sent_unwritten(pid),
                    None => {}
                }
                i.inflight
                    .push_back((pid, InflightPhase::PublishSent, Some((entry, e))));
                if let Some(m) = gone {
                    self.unref(from, m);
                }
                true
            }
            ReplOp::PubRec { client, pid } => {
                let Some(i) = self.owned(from, &client) else {
                    return false;
                };
                let mut gone = None;
                match i.inflight.get_mut(pid) {
                    Some(f) => {
                        f.1 = InflightPhase::PubrecReceived;
                        gone = f.2.take().map(|(_, e)| e.msg);
                        if !i.unwritten.contains(&pid) {
                            disk.pubrec(&client, pid);
                        }
                    }
                    // A full image names a delivery past PUBREC this way.
                    None => {
                        i.inflight
                            .push_back((pid, InflightPhase::PubrecReceived, None));
                        disk.past_pubrec(&client, pid);
                    }
                }
                if let Some(m) = gone {
                    self.unref(from, m);
                }
                true
            }
            ReplOp::Complete { client, pid } => {
                let mut gone = None;
                if let Some(i) = self.owned(from, &client) {
                    if let Some(f) = i.inflight.remove(pid) {
                        gone = f.2.map(|(_, e)| e.msg);
                        if !i.end_unwritten(pid) {
                            disk.complete(&client, pid);
                        }
                    }
                }
                if let Some(m) = gone {
                    self.unref(from, m);
                }
                true
            }
            ReplOp::Qos2Received { client, pid } => match self.owned(from, &client) {
                Some(i) => {
                    if i.qos2.insert(pid) {
                        disk.qos2_received(&client, pid);
                    }
                    true
                }
                None => false,
            },
            ReplOp::Qos2Released { client, pid } => {
                if let Some(i) = self.owned(from, &client) {
                    if i.qos2.remove(&pid) {
                        disk.qos2_released(&client, pid);
                    }
                }
                true
            }
            ReplOp::SetWill { client, will } => match self.owned(from, &client) {
                Some(i) => {
                    if i.on_disk() {
                        disk.set_will(&client, &will);
                    }
                    i.will = Some(will);
                    true
                }
                None => false,
            },
            // Taken out in `apply` (a part's mark on its link's arrival).
            ReplOp::Epoch { .. } | ReplOp::ForgetOwner | ReplOp::Part { .. } => true,
            ReplOp::ClearWill { client } => {
                if let Some(i) = self.owned(from, &client) {
                    if i.will.take().is_some() && i.on_disk() {
                        disk.clear_will(&client);
                    }
                }
                true
            }
        }
    }

    /// Drop the images of sessions that expired (their owner is gone: a
    /// live owner drops them itself). Returns how many went.
    pub(crate) fn sweep(&mut self, now_ms: u64, disk: &mut Disk<'_>) -> usize {
        let expired: Vec<Box<str>> = self
            .by_client
            .iter()
            .filter(|(_, i)| i.meta.expires_at_ms.is_some_and(|at| at <= now_ms))
            .map(|(c, _)| c.clone())
            .collect();
        for c in &expired {
            self.drop_image(c, disk);
        }
        self.expired += expired.len() as u64;
        expired.len()
    }

    /// Take the image of `client` (this node now owns it), in the form the
    /// store's recovery gives, with the old owner's ids.
    pub(crate) fn take(&mut self, client: &str, disk: &mut Disk<'_>) -> Option<RecoveredSession> {
        let rs = self.snapshot(client)?;
        self.drop_image(client, disk);
        Some(rs)
    }

    /// The packet ids in flight in the copy of `client`, with their phase.
    #[cfg(test)]
    pub(crate) fn inflight_phases(&self, client: &str) -> Option<Vec<(u16, InflightPhase)>> {
        let img = self.by_client.get(client)?;
        Some(
            img.inflight
                .iter()
                .map(|(pid, phase, _)| (*pid, *phase))
                .collect(),
        )
    }

    /// The image of `client` in the store's recovery form, kept.
    pub(crate) fn snapshot(&self, client: &str) -> Option<RecoveredSession> {
        let img = self.by_client.get(client)?;
        let owner = img.owner?;
        let entry = |id: EntryId, e: &QueueEntry| {
            let message = self.messages.get(&(owner, e.msg))?.0.clone();
            Some(RecoveredEntry {
                id,
                entry: e.clone(),
                message,
            })
        };
        let rs = RecoveredSession {
            client_id: client.to_owned(),
            meta: img.meta,
            subscriptions: img
                .subs
                .iter()
                .map(|(f, (options, id))| RecoveredSubscription {
                    filter: f.to_string(),
                    options: *options,
                    id: *id,
                })
                .collect(),
            queue: img
                .queue
                .iter()
                .filter_map(|(id, e)| entry(*id, e))
                .collect(),
            inflight: img
                .inflight
                .iter()
                .map(|(pid, phase, e)| RecoveredInflight {
                    packet_id: *pid,
                    phase: *phase,
                    entry: e.as_ref().and_then(|(id, e)| entry(*id, e)),
                })
                .collect(),
            incoming_qos2: img.qos2.iter().copied().collect(),
            will: img.will.as_deref().cloned(),
            // The session's own store keeps none (see `disk`).
            epoch: 0,
            version: 0,
        };
        Some(rs)
    }

    /// The operations that rebuild the copy of `client` at another node,
    /// when it was written under the claim of `epoch` and holds more of
    /// its owner's changes than the asker's (version `have`, 0: none
    /// there; see `PeerEvent::CopyWanted`): the entry and message ids are
    /// its owner's, unique per sender as the receiver keys them, with the
    /// messages' marks.
    pub(crate) fn copy_ops(&self, client: &str, epoch: u64, have: u64) -> Option<Vec<ReplOp>> {
        let img = self.by_client.get(client)?;
        if epoch == 0 || img.epoch != epoch || (have > 0 && img.version <= have) {
            return None;
        }
        // Read back from disk, its ids are this node's own: only for an
        // asker with no copy, which keys them as this node's.
        if have > 0 && img.owner == Some(disk::RESTORED) {
            return None;
        }
        let (owner, version) = (img.owner?, img.version);
        let rs = self.snapshot(client)?;
        let c = || -> Box<str> { client.into() };
        let mut ops = vec![
            ReplOp::Epoch {
                client: c(),
                epoch,
                version,
            },
            ReplOp::Reset {
                client: c(),
                meta: rs.meta,
                read: None,
            },
        ];
        for s in rs.subscriptions {
            ops.push(ReplOp::Subscribe {
                client: c(),
                filter: s.filter.into_boxed_str(),
                options: s.options,
                id: s.id,
            });
        }
        let mut named = HashSet::default();
        let mut entry = |e: RecoveredEntry, ops: &mut Vec<ReplOp>| {
            if named.insert(e.entry.msg) {
                ops.push(ReplOp::Message {
                    id: e.entry.msg,
                    msg: e.message,
                    mark: self.marks.mark_of((owner, e.entry.msg)),
                });
            }
            ops.push(ReplOp::Enqueue {
                client: c(),
                entry: e.id,
                item: e.entry,
            });
        };
        for f in rs.inflight {
            match (f.phase, f.entry) {
                (InflightPhase::PublishSent, Some(e)) => {
                    let id = e.id;
                    entry(e, &mut ops);
                    ops.push(ReplOp::Send {
                        client: c(),
                        entry: id,
                        pid: f.packet_id,
                    });
                }
                (InflightPhase::PublishSent, None) => {}
                (InflightPhase::PubrecReceived, _) => ops.push(ReplOp::PubRec {
                    client: c(),
                    pid: f.packet_id,
                }),
            }
        }
        for e in rs.queue {
            entry(e, &mut ops);
        }
        for pid in rs.incoming_qos2 {
            ops.push(ReplOp::Qos2Received { client: c(), pid });
        }
        if let Some(will) = rs.will {
            ops.push(ReplOp::SetWill {
                client: c(),
                will: Box::new(will),
            });
        }
        Some(ops)
    }

    /// Forget the image of `client` (a clean start took its id).
    pub(crate) fn forget(&mut self, client: &str, disk: &mut Disk<'_>) {
        self.drop_image(client, disk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(client: &str, epoch: u64, version: u64, full: bool) -> Vec<ReplOp> {
        let mut ops = vec![ReplOp::Epoch {
            client: client.into(),
            epoch,
            version,
        }];
        let meta = SessionMeta {
            expiry_interval: 60,
            expires_at_ms: None,
        };
        ops.push(if full {
            ReplOp::Reset {
                client: client.into(),
                meta,
                read: None,
            }
        } else {
            ReplOp::Session {
                client: client.into(),
                meta,
            }
        });
        ops
    }

    /// A copy that missed a batch of its owner's (shed while this node was
    /// away) does not claim the versions after it, until a full image.
    #[test]
    fn a_batch_missing_between_holds_the_copys_version() {
        let mut im = Images::default();
        let mut durable = crate::core::durable::Durable::memory(std::time::Instant::now());
        let owner = PeerId(1);
        let mut apply = |im: &mut Images, ops| {
            im.apply(owner, ops, 0, &mut Disk::new(&mut durable));
        };
        apply(&mut im, batch("a", 3, 1, true));
        apply(&mut im, batch("a", 3, 2, false));
        assert_eq!(im.version("a"), 2);
        // Version 3 lost.
        apply(&mut im, batch("a", 3, 4, false));
        apply(&mut im, batch("a", 3, 5, false));
        assert_eq!(im.version("a"), 2, "holds 4 and 5, not 3");
        apply(&mut im, batch("a", 3, 5, true));
        assert_eq!(im.version("a"), 5, "whole again");
    }

    /// A replica's answer to this node's former self (numbered from that
    /// run's start, or from 0 before runs were numbered from the clock)
    /// releases nothing waiting for this run's changes.
    #[test]
    fn a_late_answer_to_a_former_self_releases_nothing() {
        let mut r = Replication::default();
        r.start_at(1_000);
        let seq = r.stamp(&[PeerId(1)]);
        assert!(r.wait_seen(PeerId(2), 7, &|_| false));
        let none = |_| false;
        let ready = r.answered(PeerId(1), 5_000, false, &none);
        assert!(
            ready.waiters.is_empty(),
            "released by the former self's answer"
        );
        let ready = r.answered(PeerId(1), seq, false, &none);
        assert_eq!(ready.waiters.len(), 1);
    }
}

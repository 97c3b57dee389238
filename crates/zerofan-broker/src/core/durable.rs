//! Durability in the core: what the broker stages in the durable log and
//! when an inbound acknowledgement may go out.
//!
//! The core owns a [`DurableLog`] (the embedded store, or nothing with
//! `--memory`). Staging is in memory and never blocks; at the end of each
//! core event the broker commits once, and every PUBACK / PUBREC that event
//! produced for a message it wrote is *held* with the commit's LSN. The shell
//! calls [`Broker::release_durable`] when the store reports progress, and the
//! held acknowledgements reach their connections' outboxes in order.
//!
//! `Durable` holds the log, the staging and the held acknowledgements with
//! its own methods; the staging hooks that read sessions are `broker.rs`'s
//! durability section.
//!
//! Only persistent sessions (Session Expiry Interval above 0) and retained
//! messages are written; a publish that reaches only clean sessions costs one
//! branch here and is acknowledged at once.

use super::hash::HashMap;
use super::ids::ConnId;
use super::message::Message;
use super::outbox::Outgoing;
use super::peer::PeerId;
use super::session::{Queued, Session};
use bytes::Bytes;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use zerofan_codec::{MqttStr, Properties, QoS, SubscriptionOptions, Will};
pub use zerofan_store::{
    EntryId, Lsn, MessageProperties, MsgId, QueueEntry, Recovered, SessionMeta, StoreError,
    StoreStats, StoredMessage, StoredWill, SubOptions,
};

/// The operations the core stages in a durable log. The embedded store
/// implements it (see `crate::persist`); tests use recording fakes. Every
/// call but [`DurableLog::commit`] only stages, in memory, and none blocks.
pub trait DurableLog {
    /// Write a message once; reference it by the returned id.
    fn put_message(&mut self, msg: &StoredMessage) -> Result<MsgId, StoreError>;
    /// Make `msg` the retained message of `topic`.
    fn set_retained(&mut self, topic: &str, msg: MsgId) -> Result<(), StoreError>;
    /// Clear the retained message of `topic`.
    fn clear_retained(&mut self, topic: &str) -> Result<(), StoreError>;
    /// Create or update a persistent session.
    fn put_session(&mut self, client_id: &str, meta: SessionMeta) -> Result<(), StoreError>;
    /// Forget a session and everything it holds.
    fn drop_session(&mut self, client_id: &str) -> Result<(), StoreError>;
    /// Add or replace a subscription.
    fn subscribe(
        &mut self,
        client_id: &str,
        filter: &str,
        options: SubOptions,
        id: Option<u32>,
    ) -> Result<(), StoreError>;
    /// Remove a subscription.
    fn unsubscribe(&mut self, client_id: &str, filter: &str) -> Result<(), StoreError>;
    /// Append to a session's queue.
    fn enqueue(&mut self, client_id: &str, entry: &QueueEntry) -> Result<EntryId, StoreError>;
    /// Remove a queue entry that will not be sent.
    fn dequeue(&mut self, client_id: &str, entry: EntryId) -> Result<(), StoreError>;
    /// A queue entry went out as a QoS 1/2 PUBLISH with `packet_id`.
    fn send(&mut self, client_id: &str, entry: EntryId, packet_id: u16) -> Result<(), StoreError>;
    /// PUBREC arrived for an outbound QoS 2 delivery.
    fn pubrec(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError>;
    /// An outbound delivery is finished or abandoned.
    fn complete(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError>;
    /// An inbound QoS 2 packet id was taken (PUBREC sent).
    fn qos2_received(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError>;
    /// PUBREL arrived for an inbound QoS 2 packet id.
    fn qos2_released(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError>;
    /// Keep a will waiting for its delay.
    fn set_will(&mut self, client_id: &str, will: &StoredWill) -> Result<(), StoreError>;
    /// The will was published or cancelled.
    fn clear_will(&mut self, client_id: &str) -> Result<(), StoreError>;
    /// Record the ownership epoch a session is held under, and its
    /// version under it (replaces the ones before; goes with the session).
    /// A replica's copies carry them.
    fn set_epoch(&mut self, client_id: &str, epoch: u64, version: u64) -> Result<(), StoreError>;
    /// Hand what is staged to the writer; never blocks.
    fn commit(&mut self) -> Result<Lsn, StoreError>;
    /// The log a replica's copies of other nodes' sessions are written
    /// to: this one, or for a log that also records what it is told for
    /// this node's replicas (`replica::Mirror`), the log under it, as
    /// copies are not replicated further.
    fn copies(&mut self) -> &mut dyn DurableLog;
    /// The highest durable LSN (cheap).
    fn durable_lsn(&self) -> Lsn;
    /// The store's counters, if it has any.
    fn stats(&self) -> Option<StoreStats> {
        None
    }
    /// UNIX milliseconds this run's counts start from at least: a former
    /// run's clock, saved by the store, should the wall clock now be
    /// behind it (`Store::counts_from_ms`); 0 for a log that keeps none.
    fn counts_from_ms(&self) -> u64 {
        0
    }
}

/// The stored id of a [`Message`], set once it has been written (0: not
/// written). Copies made for compaction carry it along.
#[derive(Debug, Default)]
pub struct StoredId(AtomicU64);

impl StoredId {
    /// The id, if the message was written.
    pub fn get(&self) -> Option<MsgId> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            n => Some(MsgId(n - 1)),
        }
    }

    /// Remember the id.
    pub fn set(&self, id: MsgId) {
        self.0.store(id.0.saturating_add(1), Ordering::Relaxed);
    }

    /// Forget the id (it was another node's: the message is written here
    /// anew).
    pub fn clear(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    /// A copy holding the same id.
    pub fn copy(&self) -> StoredId {
        StoredId(AtomicU64::new(self.0.load(Ordering::Relaxed)))
    }
}

/// The broker's durability state: the log (none with `--memory`), the
/// acknowledgements waiting for a commit to be durable, and the clock anchor
/// that turns `Instant`s into the store's UNIX milliseconds.
pub(crate) struct Durable {
    log: Option<Box<dyn DurableLog>>,
    /// Something was staged since the last commit.
    dirty: bool,
    /// (instant, UNIX ms) of the same moment.
    anchor: (Instant, u64),
    /// UNIX ms this run's counts start from (see `count_ms`).
    counts_from: u64,
    /// Acknowledgements of the current event, waiting for its commit.
    pending: Vec<(ConnId, Outgoing)>,
    /// Acknowledgements waiting for their LSN to be durable, in LSN order.
    held: VecDeque<(Lsn, ConnId, Outgoing)>,
    /// Held acknowledgements per connection (later ones queue behind them).
    held_per_conn: HashMap<ConnId, usize>,
    /// Peers' changes of the current event, answered once its commit is
    /// durable (see `PeerEvent::Fence`).
    seen_pending: Vec<(PeerId, u64)>,
    /// Those answers waiting for their LSN to be durable, in LSN order.
    seen_held: VecDeque<(Lsn, PeerId, u64)>,
    /// The LSN of the last commit.
    last_commit: Lsn,
    /// `ReplicaAck`s of the current event and those waiting for their LSN
    /// (a replica answers once what it holds is on its disk).
    replica_acks: PeerAnswers,
}

/// Answers to peers held for a commit, as `seen_*` are.
#[derive(Default)]
struct PeerAnswers {
    pending: Vec<(PeerId, u64)>,
    held: VecDeque<(Lsn, PeerId, u64)>,
}

impl Durable {
    pub(crate) fn memory(now: Instant) -> Self {
        Durable {
            log: None,
            dirty: false,
            anchor: (now, 0),
            counts_from: 0,
            pending: Vec::new(),
            held: VecDeque::new(),
            held_per_conn: HashMap::default(),
            seen_pending: Vec::new(),
            seen_held: VecDeque::new(),
            last_commit: 0,
            replica_acks: PeerAnswers::default(),
        }
    }

    /// The log itself, for staging many records at once (marked dirty).
    pub(crate) fn log_mut(&mut self) -> Option<&mut dyn DurableLog> {
        let log = self.log.as_mut()?;
        self.dirty = true;
        Some(log.as_mut())
    }

    /// Hold the `ReplicaAck` of peer `from`'s change `seq` for this event's
    /// commit. False without a log: answer at once.
    pub(crate) fn hold_replica_ack(&mut self, from: PeerId, seq: u64) -> bool {
        if self.on() {
            self.replica_acks.pending.push((from, seq));
            true
        } else {
            false
        }
    }

    /// The oldest held `ReplicaAck`, if its commit is at or below `durable`.
    pub(crate) fn pop_released_replica_ack(&mut self, durable: Lsn) -> Option<(PeerId, u64)> {
        if self.replica_acks.held.front()?.0 > durable {
            return None;
        }
        let (_, peer, seq) = self.replica_acks.held.pop_front()?;
        Some((peer, seq))
    }

    /// Hold `out` for `conn` until this event's commit is durable.
    pub(crate) fn hold(&mut self, conn: ConnId, out: Outgoing) {
        self.pending.push((conn, out));
    }

    /// Hold `out` for `conn`, whose records were committed already (it
    /// waited for the replicas since), until the last commit is durable:
    /// behind what is held, ahead of this event's (newer) answers, which
    /// it must not wait for (they may go to the replicas again). Without
    /// a log: `out`, to send now.
    pub(crate) fn hold_committed(
        &mut self,
        conn: ConnId,
        out: Outgoing,
    ) -> Option<(ConnId, Outgoing)> {
        if !self.on() {
            return Some((conn, out));
        }
        *self.held_per_conn.entry(conn).or_insert(0) += 1;
        self.held.push_back((self.last_commit, conn, out));
        None
    }

    /// Whether the current event holds answers.
    #[inline]
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Keep the current event's answers `keep` gives back (in order); the
    /// others it took elsewhere.
    pub(crate) fn retain_pending(
        &mut self,
        mut keep: impl FnMut(ConnId, Outgoing) -> Option<Outgoing>,
    ) {
        let pending = std::mem::take(&mut self.pending);
        for (conn, out) in pending {
            if let Some(out) = keep(conn, out) {
                self.pending.push((conn, out));
            }
        }
    }

    /// The acknowledgements of the current event (they wait for the
    /// replicas first, see `replica`).
    pub(crate) fn take_pending(&mut self) -> Vec<(ConnId, Outgoing)> {
        std::mem::take(&mut self.pending)
    }

    /// True when a durable log is attached.
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.log.is_some()
    }

    /// UNIX milliseconds this run's counts started from (0 without a log):
    /// the wall clock when the log was attached, or later (see `attach`).
    pub(crate) fn counts_from_ms(&self) -> u64 {
        self.counts_from
    }

    /// UNIX milliseconds of `at`.
    pub(crate) fn unix_ms(&self, at: Instant) -> u64 {
        let (i, ms) = self.anchor;
        if at >= i {
            ms.saturating_add(u64::try_from(at.duration_since(i).as_millis()).unwrap_or(u64::MAX))
        } else {
            ms.saturating_sub(u64::try_from(i.duration_since(at).as_millis()).unwrap_or(u64::MAX))
        }
    }

    /// The instant of UNIX milliseconds `ms` (clamped to what `Instant` can hold).
    pub(crate) fn instant(&self, ms: u64) -> Instant {
        let (i, now_ms) = self.anchor;
        if ms >= now_ms {
            i.checked_add(Duration::from_millis(ms - now_ms))
                .unwrap_or(i + Duration::from_secs(86_400 * 365 * 30))
        } else {
            i.checked_sub(Duration::from_millis(now_ms - ms))
                .unwrap_or(i)
        }
    }

    /// Run one staging call, marking the log dirty.
    pub(crate) fn try_stage<T>(
        &mut self,
        f: impl FnOnce(&mut dyn DurableLog) -> Result<T, StoreError>,
    ) -> Option<Result<T, StoreError>> {
        let log = self.log.as_mut()?;
        self.dirty = true;
        Some(f(log.as_mut()))
    }

    /// [`Durable::try_stage`], with errors counted and logged (the 1st,
    /// 2nd, 4th, 8th...: a failed store must not flood the log).
    pub(crate) fn stage<T>(
        &mut self,
        errors: &mut u64,
        f: impl FnOnce(&mut dyn DurableLog) -> Result<T, StoreError>,
    ) -> Option<T> {
        match self.try_stage(f)? {
            Ok(v) => Some(v),
            Err(e) => {
                *errors += 1;
                if errors.is_power_of_two() {
                    tracing::error!(error = %e, errors = *errors, "store operation failed");
                }
                None
            }
        }
    }

    /// Attach `log`; `now_unix_ms` is the wall clock at `now`. Returns
    /// the UNIX ms this run's counts start from: the clock, or what the
    /// log saved of a former run's if later.
    pub(crate) fn attach(
        &mut self,
        log: Box<dyn DurableLog>,
        now: Instant,
        now_unix_ms: u64,
    ) -> u64 {
        self.counts_from = now_unix_ms.max(log.counts_from_ms());
        self.log = Some(log);
        self.anchor = (now, now_unix_ms);
        self.counts_from
    }

    /// UNIX ms by the clock the cluster's counts take (change numbers,
    /// strand marks): the wall clock at `at`, never before where this
    /// run's counts started. Deadlines keep the wall clock (`unix_ms`).
    pub(crate) fn count_ms(&self, at: Instant) -> u64 {
        self.unix_ms(at).max(self.counts_from)
    }

    /// The log's counters, when one is attached.
    pub(crate) fn stats(&self) -> Option<StoreStats> {
        self.log.as_ref().and_then(|l| l.stats())
    }

    /// Acknowledgements held until their commit is durable.
    pub(crate) fn held_acks(&self) -> usize {
        self.held.len() + self.pending.len()
    }

    /// The log's durable LSN, when a log is attached.
    pub(crate) fn durable_lsn(&self) -> Option<Lsn> {
        self.log.as_ref().map(|l| l.durable_lsn())
    }

    /// The oldest held acknowledgement, if its commit is at or below
    /// `durable`.
    pub(crate) fn pop_released_ack(&mut self, durable: Lsn) -> Option<(ConnId, Outgoing)> {
        if self.held.front()?.0 > durable {
            return None;
        }
        let (_, conn, out) = self.held.pop_front()?;
        if let Some(n) = self.held_per_conn.get_mut(&conn) {
            *n -= 1;
            if *n == 0 {
                self.held_per_conn.remove(&conn);
            }
        }
        Some((conn, out))
    }

    /// The oldest held answer to a peer, if its commit is at or below
    /// `durable`.
    pub(crate) fn pop_released_seen(&mut self, durable: Lsn) -> Option<(PeerId, u64)> {
        if self.seen_held.front()?.0 > durable {
            return None;
        }
        let (_, peer, seq) = self.seen_held.pop_front()?;
        Some((peer, seq))
    }

    /// Hold the answer to peer `from`'s change `seq` for this event's
    /// commit. False without a log: answer at once.
    pub(crate) fn hold_seen(&mut self, from: PeerId, seq: u64) -> bool {
        if self.on() {
            self.seen_pending.push((from, seq));
            true
        } else {
            false
        }
    }

    /// Hold a PUBACK / PUBREC for this event's commit when something was
    /// written for it (or an earlier one of `conn` waits); else give it
    /// back to be sent at once.
    pub(crate) fn hold_ack(&mut self, conn: ConnId, out: Outgoing) -> Option<Outgoing> {
        if self.dirty || self.held_per_conn.contains_key(&conn) {
            self.pending.push((conn, out));
            None
        } else {
            Some(out)
        }
    }

    /// The end of a core event: commit what it staged (once) and hold its
    /// acknowledgements until that commit is durable. A failed commit is
    /// counted in `errors`.
    /// Nothing staged or waiting: [`Durable::end_event`] would be `Idle`.
    #[inline]
    pub(crate) fn idle(&self) -> bool {
        !self.dirty
            && self.pending.is_empty()
            && self.seen_pending.is_empty()
            && self.replica_acks.pending.is_empty()
    }

    pub(crate) fn end_event(&mut self, errors: &mut u64) -> EventEnd {
        if self.idle() {
            return EventEnd::Idle;
        }
        let Some(log) = self.log.as_mut() else {
            // No log: nothing can be pending; send whatever is.
            return EventEnd::SendNow(std::mem::take(&mut self.pending));
        };
        if !self.dirty && self.pending.is_empty() {
            // Only peers' changes: they wait for the last commit.
            let lsn = self.last_commit;
            for (peer, seq) in self.seen_pending.drain(..) {
                self.seen_held.push_back((lsn, peer, seq));
            }
            for (peer, seq) in self.replica_acks.pending.drain(..) {
                self.replica_acks.held.push_back((lsn, peer, seq));
            }
            return EventEnd::Release;
        }
        self.dirty = false;
        match log.commit() {
            Ok(lsn) => {
                self.last_commit = lsn;
                for (conn, out) in self.pending.drain(..) {
                    *self.held_per_conn.entry(conn).or_insert(0) += 1;
                    self.held.push_back((lsn, conn, out));
                }
                for (peer, seq) in self.seen_pending.drain(..) {
                    self.seen_held.push_back((lsn, peer, seq));
                }
                for (peer, seq) in self.replica_acks.pending.drain(..) {
                    self.replica_acks.held.push_back((lsn, peer, seq));
                }
                // Nothing was staged after all (a replica's empty change):
                // `lsn` is the last commit, maybe durable already, and then
                // the store has no progress left to report.
                if lsn <= log.durable_lsn() {
                    return EventEnd::Release;
                }
            }
            Err(e) => {
                // Nothing more can be made durable: the acknowledgements are
                // never sent (the publishers will resend after a restart).
                *errors += 1;
                self.pending.clear();
                self.replica_acks.pending.clear();
                tracing::error!(error = %e, "store commit failed; holding acknowledgements");
            }
        }
        EventEnd::Committed
    }
}

/// What the broker does after [`Durable::end_event`].
pub(crate) enum EventEnd {
    /// Nothing was staged or held.
    Idle,
    /// No log: these acknowledgements go out now.
    SendNow(Vec<(ConnId, Outgoing)>),
    /// Only peers' changes were held: release what is durable already.
    Release,
    /// Committed (or failed): the held acknowledgements wait for the log.
    Committed,
}

/// The form the store keeps of a message.
pub(crate) fn to_stored(msg: &Message, d: &Durable) -> StoredMessage {
    let p = &msg.properties;
    StoredMessage {
        topic: msg.topic.as_bytes().clone(),
        payload: msg.payload.clone(),
        qos: msg.qos as u8,
        retain: msg.retain,
        expires_at_ms: msg.expires_at.map(|at| d.unix_ms(at)),
        properties: MessageProperties {
            payload_format_indicator: p.payload_format_indicator,
            content_type: p.content_type.as_ref().map(|s| s.as_bytes().clone()),
            response_topic: p.response_topic.as_ref().map(|s| s.as_bytes().clone()),
            correlation_data: p.correlation_data.clone(),
            user_properties: p
                .user_properties
                .iter()
                .map(|(k, v)| (k.as_bytes().clone(), v.as_bytes().clone()))
                .collect(),
        },
    }
}

/// A message read back from the store; `None` if its bytes are not valid
/// MQTT strings (a damaged record is dropped, never trusted).
pub(crate) fn from_stored(s: &StoredMessage, d: &Durable) -> Option<Message> {
    let string = |b: &Bytes| MqttStr::from_bytes(b.clone()).ok();
    let mut properties = Properties {
        payload_format_indicator: s.properties.payload_format_indicator,
        correlation_data: s.properties.correlation_data.clone(),
        ..Properties::default()
    };
    if let Some(b) = &s.properties.content_type {
        properties.content_type = Some(string(b)?);
    }
    if let Some(b) = &s.properties.response_topic {
        properties.response_topic = Some(string(b)?);
    }
    for (k, v) in &s.properties.user_properties {
        properties.user_properties.push((string(k)?, string(v)?));
    }
    Some(Message::owned(
        string(&s.topic)?,
        s.payload.clone(),
        QoS::from_u8(s.qos)?,
        s.retain,
        properties.into(),
        s.expires_at_ms.map(|ms| d.instant(ms)),
    ))
}

pub(super) fn sub_options(o: &SubscriptionOptions) -> SubOptions {
    SubOptions {
        qos: o.qos as u8,
        no_local: o.no_local,
        retain_as_published: o.retain_as_published,
        retain_handling: o.retain_handling,
    }
}

/// A will as the store and the replicas keep it: due at `due_at_ms`, or
/// armed with its delay (its client still connected).
pub(super) fn stored_will(w: &Will, d: &Durable, due_at_ms: u64, armed: Option<u32>) -> StoredWill {
    let mut message = to_stored(&will_message(w), d);
    // A will's expiry counts from its publication.
    message.expires_at_ms = None;
    StoredWill {
        message,
        due_at_ms,
        armed,
        message_expiry_interval: w.properties.message_expiry_interval,
    }
}

/// The will of a connected client, armed: due its delay after the
/// connection is known to be lost (see `Broker::dur_will_armed`).
pub(super) fn armed_will(w: &Will, d: &Durable) -> StoredWill {
    let delay = w.properties.will_delay_interval.unwrap_or(0);
    stored_will(w, d, 0, Some(delay))
}

/// The will a stored one holds (none: its record is damaged); when it is
/// due is the caller's.
pub(super) fn will_from_stored(w: &StoredWill, d: &Durable) -> Option<Will> {
    let m = from_stored(&w.message, d)?;
    let mut properties = m.properties.into_inner();
    properties.message_expiry_interval = w.message_expiry_interval;
    Some(Will {
        topic: m.topic,
        payload: m.payload,
        qos: m.qos,
        retain: m.retain,
        properties: properties.into(),
    })
}

/// The message a will becomes (for storing it).
pub(super) fn will_message(w: &Will) -> Message {
    Message::owned(
        w.topic.clone(),
        w.payload.clone(),
        w.qos,
        w.retain,
        w.properties.clone(),
        None,
    )
}

/// What stands in for a QoS 2 delivery past PUBREC after a restart: only
/// its packet id matters (PUBREL is resent), the store tracks it.
pub(super) fn placeholder() -> Queued {
    Queued {
        msg: Rc::new(Message::owned(
            MqttStr::default(),
            Bytes::new(),
            QoS::ExactlyOnce,
            false,
            Default::default(),
            None,
        )),
        qos: QoS::ExactlyOnce,
        retain: false,
        sub_ids: Vec::new(),
        share: None,
        entry: Some(EntryId(u64::MAX)),
        replay: false,
    }
}

/// The session is no longer persistent: its items have no stored entries.
pub(super) fn forget_entries(s: &mut Session) {
    for q in s.queue_iter_mut() {
        q.entry = None;
    }
    for f in s.flight.iter_mut().flat_map(|fl| fl.inflight.values_mut()) {
        f.item.entry = None;
    }
    if let Some(f) = s.flight_any() {
        f.evicted.clear();
    }
}

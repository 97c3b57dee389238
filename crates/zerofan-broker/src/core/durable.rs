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
//! Only persistent sessions (Session Expiry Interval above 0) and retained
//! messages are written; a publish that reaches only clean sessions costs one
//! branch here and is acknowledged at once.

use super::broker::Broker;
use super::hash::HashMap;
use super::ids::{ConnId, SessionId};
use super::message::Message;
use super::outbox::Outgoing;
use super::session::{Inflight, InflightState, PendingWill, Queued, Session, SubRecord};
use super::timers::Timer;
use super::trie::SubEntry;
use bytes::Bytes;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerofan_codec::{MqttStr, Properties, Protocol, QoS, SubscriptionOptions, Will};
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
    /// Hand what is staged to the writer; never blocks.
    fn commit(&mut self) -> Result<Lsn, StoreError>;
    /// The highest durable LSN (cheap).
    fn durable_lsn(&self) -> Lsn;
    /// The store's counters, if it has any.
    fn stats(&self) -> Option<StoreStats> {
        None
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
    /// Acknowledgements of the current event, waiting for its commit.
    pending: Vec<(ConnId, Outgoing)>,
    /// Acknowledgements waiting for their LSN to be durable, in LSN order.
    held: VecDeque<(Lsn, ConnId, Outgoing)>,
    /// Held acknowledgements per connection (later ones queue behind them).
    held_per_conn: HashMap<ConnId, usize>,
    /// Peers' changes of the current event, answered once its commit is
    /// durable (see `PeerEvent::Fence`).
    seen_pending: Vec<(super::peer::PeerId, u64)>,
    /// Those answers waiting for their LSN to be durable, in LSN order.
    seen_held: VecDeque<(Lsn, super::peer::PeerId, u64)>,
    /// The LSN of the last commit.
    last_commit: Lsn,
}

impl Durable {
    pub(crate) fn memory(now: Instant) -> Self {
        Durable {
            log: None,
            dirty: false,
            anchor: (now, 0),
            pending: Vec::new(),
            held: VecDeque::new(),
            held_per_conn: HashMap::default(),
            seen_pending: Vec::new(),
            seen_held: VecDeque::new(),
            last_commit: 0,
        }
    }

    /// Hold `out` for `conn` until this event's commit is durable.
    pub(crate) fn hold(&mut self, conn: ConnId, out: Outgoing) {
        self.pending.push((conn, out));
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
    fn try_stage<T>(
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

fn sub_options(o: &SubscriptionOptions) -> SubOptions {
    SubOptions {
        qos: o.qos as u8,
        no_local: o.no_local,
        retain_as_published: o.retain_as_published,
        retain_handling: o.retain_handling,
    }
}

impl Broker {
    /// Attach a durable log (the broker then writes persistent sessions and
    /// retained messages to it). `now_unix_ms` is the wall clock at `now`,
    /// used only to convert deadlines to and from the store's UNIX time.
    pub fn set_durable_log(&mut self, log: Box<dyn DurableLog>, now: Instant, now_unix_ms: u64) {
        // Persistent sessions' operations are also recorded for replicas.
        self.durable.log = Some(self.repl.wrap(log));
        self.durable.anchor = (now, now_unix_ms);
    }

    /// The store's counters (log size, fsyncs, bytes written...), when a
    /// durable log is attached.
    pub fn store_stats(&self) -> Option<StoreStats> {
        self.durable.log.as_ref().and_then(|l| l.stats())
    }

    /// Count what opening the store repaired (a torn or corrupt tail cut
    /// off: `truncated_bytes` above 0).
    pub fn note_store_recovery(&mut self, truncated_bytes: u64) {
        if truncated_bytes > 0 {
            self.metrics.store_torn_tails += 1;
            self.metrics.store_truncated_bytes += truncated_bytes;
        }
    }

    /// Acknowledgements held until their commit is durable.
    pub fn held_acks(&self) -> usize {
        self.durable.held.len() + self.durable.pending.len()
    }

    /// The store made progress: every held acknowledgement whose commit is
    /// now durable goes to its connection's outbox. Call
    /// [`Broker::take_wakeups`] afterwards.
    pub fn release_durable(&mut self) {
        let Some(log) = self.durable.log.as_ref() else {
            return;
        };
        let durable = log.durable_lsn();
        while self
            .durable
            .held
            .front()
            .is_some_and(|(lsn, _, _)| *lsn <= durable)
        {
            let Some((_, conn, out)) = self.durable.held.pop_front() else {
                break;
            };
            if let Some(n) = self.durable.held_per_conn.get_mut(&conn) {
                *n -= 1;
                if *n == 0 {
                    self.durable.held_per_conn.remove(&conn);
                }
            }
            if let Some(c) = self.conns.get_mut(&conn) {
                c.outbox.push_back(out);
                self.wake(conn);
            }
        }
        while self
            .durable
            .seen_held
            .front()
            .is_some_and(|(lsn, _, _)| *lsn <= durable)
        {
            if let Some((_, peer, seq)) = self.durable.seen_held.pop_front() {
                self.peers.send(peer, super::peer::PeerEvent::Seen { seq });
            }
        }
    }

    /// Answer a peer's change `seq` (a `Fence`, an interest, a retained
    /// message) with `Seen` once everything this core wrote so far (for
    /// the peer's earlier messages among it) is durable, in order.
    pub(crate) fn durable_seen(&mut self, from: super::peer::PeerId, seq: u64) {
        // And once the replicas have what this node replicated so far.
        if self.replica_holds_seen(from, seq) {
            return;
        }
        self.durable_seen_now(from, seq);
    }

    /// [`Broker::durable_seen`], replicas answered.
    pub(crate) fn durable_seen_now(&mut self, from: super::peer::PeerId, seq: u64) {
        if self.durable.on() {
            self.durable.seen_pending.push((from, seq));
        } else {
            self.peers.send(from, super::peer::PeerEvent::Seen { seq });
        }
    }

    /// Send the PUBACK / PUBREC of an inbound PUBLISH: at once when nothing
    /// was written for it, else once its commit is durable.
    pub(crate) fn send_publish_ack(&mut self, conn: ConnId, out: Outgoing) {
        // Behind this connection's acknowledgements that wait for replicas.
        let Some(out) = self.repl.wait_behind(conn, out) else {
            return;
        };
        let d = &mut self.durable;
        if d.dirty || d.held_per_conn.contains_key(&conn) {
            d.pending.push((conn, out));
        } else if let Some(c) = self.conns.get_mut(&conn) {
            c.outbox.push_back(out);
            self.wake(conn);
        }
    }

    /// The end of a core event: commit what it staged (once) and hold its
    /// acknowledgements until that commit is durable.
    pub(crate) fn end_event(&mut self) {
        self.flush_replication();
        // What waited for peers that are all away now goes (see
        // `Broker::set_peer_away`).
        let ready = self.peers.ready();
        self.release_deferred(ready);
        let d = &mut self.durable;
        if !d.dirty && d.pending.is_empty() && d.seen_pending.is_empty() {
            return;
        }
        let Some(log) = d.log.as_mut() else {
            // No log: nothing can be pending; send whatever is.
            let pending = std::mem::take(&mut d.pending);
            for (conn, out) in pending {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.outbox.push_back(out);
                    self.wake(conn);
                }
            }
            return;
        };
        if !d.dirty && d.pending.is_empty() {
            // Only peers' changes: they wait for the last commit.
            let lsn = d.last_commit;
            for (peer, seq) in d.seen_pending.drain(..) {
                d.seen_held.push_back((lsn, peer, seq));
            }
            self.release_durable();
            return;
        }
        d.dirty = false;
        match log.commit() {
            Ok(lsn) => {
                d.last_commit = lsn;
                for (conn, out) in d.pending.drain(..) {
                    *d.held_per_conn.entry(conn).or_insert(0) += 1;
                    d.held.push_back((lsn, conn, out));
                }
                for (peer, seq) in d.seen_pending.drain(..) {
                    d.seen_held.push_back((lsn, peer, seq));
                }
            }
            Err(e) => {
                // Nothing more can be made durable: the acknowledgements are
                // never sent (the publishers will resend after a restart).
                self.metrics.store_errors += 1;
                d.pending.clear();
                tracing::error!(error = %e, "store commit failed; holding acknowledgements");
            }
        }
    }

    // ----- staging hooks, called from the protocol handlers ---------------

    /// The stored id of `msg`, writing it if it was not yet.
    fn stored_msg(&mut self, msg: &Message) -> Option<MsgId> {
        if let Some(id) = msg.stored().get() {
            return Some(id);
        }
        let stored = to_stored(msg, &self.durable);
        let id = self
            .durable
            .stage(&mut self.metrics.store_errors, |l| l.put_message(&stored))?;
        msg.stored().set(id);
        Some(id)
    }

    /// A retained message was set.
    pub(crate) fn dur_set_retained(&mut self, msg: &Message) {
        if !self.durable.on() {
            return;
        }
        if let Some(id) = self.stored_msg(msg) {
            let topic = msg.topic.as_str();
            self.durable.stage(&mut self.metrics.store_errors, |l| {
                l.set_retained(topic, id)
            });
        }
    }

    /// A retained message was cleared.
    pub(crate) fn dur_clear_retained(&mut self, topic: &str) {
        if self.durable.on() {
            self.durable
                .stage(&mut self.metrics.store_errors, |l| l.clear_retained(topic));
        }
    }

    /// Give `item` a queue entry in `sid`'s stored queue if the session is
    /// persistent and the item is QoS 1/2. Returns the client id used.
    pub(crate) fn dur_enqueue(&mut self, sid: SessionId, item: &mut Queued) {
        if !self.durable.on() || item.qos == QoS::AtMostOnce || item.entry.is_some() {
            return;
        }
        let Some(client) = self
            .sessions
            .get(&sid)
            .filter(|s| s.expiry_interval > 0)
            .map(|s| s.client_id.clone())
        else {
            return;
        };
        let Some(msg) = self.stored_msg(&item.msg) else {
            return;
        };
        if self.repl.wants_message(msg) {
            self.repl
                .note_message(msg, to_stored(&item.msg, &self.durable));
        }
        let mut entry = QueueEntry {
            msg,
            qos: item.qos as u8,
            retain: item.retain,
            subscription_ids: item.sub_ids.clone(),
            share: item.share.as_deref().map(str::to_owned),
        };
        let errors = &mut self.metrics.store_errors;
        let mut id = self
            .durable
            .try_stage(|l| l.enqueue(&client, &entry))
            .and_then(Result::ok);
        if id.is_none() {
            // The message id may be stale (a retained message replaced since):
            // write the message again and retry once.
            let stored = to_stored(&item.msg, &self.durable);
            if let Some(m) = self.durable.stage(errors, |l| l.put_message(&stored)) {
                entry.msg = m;
                id = self.durable.stage(errors, |l| l.enqueue(&client, &entry));
            }
        }
        item.entry = id;
    }

    /// Queue entries of `sid` evicted to make room: dequeue them.
    pub(crate) fn dur_evicted(&mut self, sid: SessionId) {
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if s.flight().evicted.is_empty() {
            return;
        }
        let evicted = s
            .flight_any()
            .map(|f| std::mem::take(&mut f.evicted))
            .unwrap_or_default();
        let client = s.client_id.clone();
        for e in evicted {
            self.durable
                .stage(&mut self.metrics.store_errors, |l| l.dequeue(&client, e));
        }
    }

    /// A queue entry of `sid` was not queued after all, or left unsent.
    pub(crate) fn dur_dequeue(&mut self, sid: SessionId, entry: Option<EntryId>) {
        let Some(e) = entry else { return };
        let Some(client) = self.sessions.get(&sid).map(|s| s.client_id.clone()) else {
            return;
        };
        self.durable
            .stage(&mut self.metrics.store_errors, |l| l.dequeue(&client, e));
    }

    /// A stored delivery of `sid` ended (PUBACK, PUBCOMP, refused PUBREC,
    /// handed over).
    pub(crate) fn dur_complete(&mut self, sid: SessionId, pid: u16) {
        let Some(client) = self.sessions.get(&sid).map(|s| s.client_id.clone()) else {
            return;
        };
        self.durable
            .stage(&mut self.metrics.store_errors, |l| l.complete(&client, pid));
    }

    /// PUBREC for a stored QoS 2 delivery.
    pub(crate) fn dur_pubrec(&mut self, sid: SessionId, pid: u16) {
        let Some(client) = self.sessions.get(&sid).map(|s| s.client_id.clone()) else {
            return;
        };
        self.durable
            .stage(&mut self.metrics.store_errors, |l| l.pubrec(&client, pid));
    }

    /// The client id of `sid` if it is persistent and a log is attached.
    fn persistent_client(&self, sid: SessionId) -> Option<MqttStr> {
        if !self.durable.on() {
            return None;
        }
        self.sessions
            .get(&sid)
            .filter(|s| s.expiry_interval > 0)
            .map(|s| s.client_id.clone())
    }

    /// An inbound QoS 2 packet id was taken by `sid`.
    pub(crate) fn dur_qos2_received(&mut self, sid: SessionId, pid: u16) {
        if let Some(client) = self.persistent_client(sid) {
            self.durable.stage(&mut self.metrics.store_errors, |l| {
                l.qos2_received(&client, pid)
            });
        }
    }

    /// PUBREL for an inbound QoS 2 packet id of `sid`.
    pub(crate) fn dur_qos2_released(&mut self, sid: SessionId, pid: u16) {
        if let Some(client) = self.persistent_client(sid) {
            self.durable.stage(&mut self.metrics.store_errors, |l| {
                l.qos2_released(&client, pid)
            });
        }
    }

    /// A connection attached to `sid` (after CONNECT set its expiry): keep
    /// the session (no deadline while connected) or make sure the store has
    /// none. `cancelled_will`: a will waiting for its delay was cancelled.
    pub(crate) fn dur_connected(&mut self, sid: SessionId, cancelled_will: bool) {
        if !self.durable.on() {
            return;
        }
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        let client = s.client_id.clone();
        let errors = &mut self.metrics.store_errors;
        if s.expiry_interval == 0 {
            // Not persistent (any more): the store keeps nothing of it.
            if s.stored {
                s.stored = false;
                forget_entries(s);
                self.durable.stage(errors, |l| l.drop_session(&client));
            }
            return;
        }
        s.stored = true;
        let meta = SessionMeta {
            expiry_interval: s.expiry_interval,
            expires_at_ms: None,
        };
        self.durable.stage(errors, |l| l.put_session(&client, meta));
        if cancelled_will {
            self.durable.stage(errors, |l| l.clear_will(&client));
        }
    }

    /// A persistent session lost its connection: its expiry deadline, and
    /// its will if it waits for a delay.
    pub(crate) fn dur_detached(&mut self, sid: SessionId) {
        if !self.durable.on() {
            return;
        }
        let Some(s) = self.sessions.get(&sid) else {
            return;
        };
        if s.expiry_interval == 0 {
            return;
        }
        let client = s.client_id.clone();
        let meta = SessionMeta {
            expiry_interval: s.expiry_interval,
            expires_at_ms: s.expires_at.map(|at| self.durable.unix_ms(at)),
        };
        let will = s.pending_will.as_ref().map(|w| {
            let mut message = to_stored(&will_message(&w.will), &self.durable);
            message.expires_at_ms = None;
            StoredWill {
                message,
                due_at_ms: self.durable.unix_ms(w.at),
                message_expiry_interval: w.will.properties.message_expiry_interval,
            }
        });
        let errors = &mut self.metrics.store_errors;
        self.durable.stage(errors, |l| l.put_session(&client, meta));
        if let Some(w) = will {
            self.durable.stage(errors, |l| l.set_will(&client, &w));
        }
    }

    /// A will waiting for its delay was published.
    pub(crate) fn dur_will_published(&mut self, sid: SessionId) {
        if let Some(client) = self.persistent_client(sid) {
            self.durable
                .stage(&mut self.metrics.store_errors, |l| l.clear_will(&client));
        }
    }

    /// A session ended (clean start, expiry, not persistent any more);
    /// `stored`: the store has a record of it.
    pub(crate) fn dur_session_ended(&mut self, client_id: &str, stored: bool) {
        if stored && self.durable.on() {
            self.durable.stage(&mut self.metrics.store_errors, |l| {
                l.drop_session(client_id)
            });
        }
    }

    /// A subscription of `sid` was added or replaced.
    pub(crate) fn dur_subscribed(&mut self, sid: SessionId, filter: &str, record: SubRecord) {
        if let Some(client) = self.persistent_client(sid) {
            let options = sub_options(&record.options);
            self.durable.stage(&mut self.metrics.store_errors, |l| {
                l.subscribe(&client, filter, options, record.id)
            });
        }
    }

    /// A subscription of `sid` was removed.
    pub(crate) fn dur_unsubscribed(&mut self, sid: SessionId, filter: &str) {
        if let Some(client) = self.persistent_client(sid) {
            self.durable.stage(&mut self.metrics.store_errors, |l| {
                l.unsubscribe(&client, filter)
            });
        }
    }

    /// Before `share`'s items leave `from` (hand-over): their stored entries
    /// and inflight deliveries in `from` end; the receiving member stores
    /// its own (in the same commit).
    pub(crate) fn dur_release_shared(&mut self, from: SessionId, share: &str) {
        if !self.durable.on() {
            return;
        }
        let Some(s) = self.sessions.get_mut(&from) else {
            return;
        };
        let mut pids = Vec::new();
        let mut entries = Vec::new();
        for (pid, f) in &s.flight().inflight {
            if f.state == InflightState::AwaitingAck
                && f.item.share.as_deref() == Some(share)
                && f.item.entry.is_some()
            {
                pids.push(*pid);
            }
        }
        for q in s.queue_iter_mut() {
            if q.share.as_deref() == Some(share) {
                if let Some(e) = q.entry.take() {
                    entries.push(e);
                }
            }
        }
        for f in s.flight.iter_mut().flat_map(|fl| fl.inflight.values_mut()) {
            if f.state == InflightState::AwaitingAck && f.item.share.as_deref() == Some(share) {
                f.item.entry = None;
            }
        }
        let client = s.client_id.clone();
        let errors = &mut self.metrics.store_errors;
        for pid in pids {
            self.durable.stage(errors, |l| l.complete(&client, pid));
        }
        for e in entries {
            self.durable.stage(errors, |l| l.dequeue(&client, e));
        }
    }

    // ----- recovery ---------------------------------------------------------

    /// Rebuild retained messages and persistent sessions from what the
    /// store held, then run every deadline that passed while the broker was
    /// down (expired sessions go, overdue wills are published).
    pub fn restore(&mut self, recovered: Recovered, now: Instant) {
        let mut messages: HashMap<u64, Rc<Message>> = HashMap::default();
        let mut damaged = 0u64;
        for r in recovered.retained {
            match self.restored_message(&mut messages, r.msg, &r.message) {
                Some(m) => self.store.set(m),
                None => damaged += 1,
            }
        }
        for rs in recovered.sessions {
            let Ok(client_id) = MqttStr::try_from(rs.client_id.as_str()) else {
                damaged += 1;
                continue;
            };
            if self.by_client.contains_key(&client_id) {
                continue;
            }
            let sid = SessionId(self.next_session);
            self.next_session += 1;
            let protocol = if rs.meta.expiry_interval == u32::MAX {
                Protocol::V311
            } else {
                Protocol::V5
            };
            let mut s = Session::new(client_id.clone(), protocol);
            s.expiry_interval = rs.meta.expiry_interval;
            s.stored = true;
            for sub in &rs.subscriptions {
                let Some(qos) = QoS::from_u8(sub.options.qos) else {
                    damaged += 1;
                    continue;
                };
                let options = SubscriptionOptions {
                    qos,
                    no_local: sub.options.no_local,
                    retain_as_published: sub.options.retain_as_published,
                    retain_handling: sub.options.retain_handling,
                };
                let entry = SubEntry {
                    session: sid,
                    options,
                    id: sub.id,
                };
                self.router.subscribe(&sub.filter, entry);
                s.flight_mut().subscriptions.insert(
                    sub.filter.as_str().into(),
                    SubRecord {
                        options,
                        id: sub.id,
                    },
                );
            }
            for e in &rs.queue {
                let Some(item) = self.restored_item(&mut messages, e) else {
                    damaged += 1;
                    continue;
                };
                let _ = s.push(
                    item,
                    usize::MAX,
                    usize::MAX,
                    crate::config::QueueFull::DropNew,
                );
            }
            for f in &rs.inflight {
                let (item, state) = match (&f.entry, f.phase) {
                    (Some(e), zerofan_store::InflightPhase::PublishSent) => {
                        match self.restored_item(&mut messages, e) {
                            Some(item) => (item, InflightState::AwaitingAck),
                            None => {
                                damaged += 1;
                                continue;
                            }
                        }
                    }
                    _ => (placeholder(), InflightState::AwaitingComp),
                };
                let fl = s.flight_mut();
                let seq = fl.next_seq;
                fl.next_seq += 1;
                s.flight_mut()
                    .inflight
                    .insert(f.packet_id, Inflight { item, state, seq });
            }
            if !rs.incoming_qos2.is_empty() {
                s.flight_mut()
                    .incoming_qos2
                    .extend(rs.incoming_qos2.iter().copied());
            }
            if let Some(w) = &rs.will {
                match from_stored(&w.message, &self.durable) {
                    Some(m) => {
                        let mut properties = m.properties.into_inner();
                        properties.message_expiry_interval = w.message_expiry_interval;
                        let at = self.durable.instant(w.due_at_ms);
                        s.pending_will = Some(Box::new(PendingWill {
                            will: Will {
                                topic: m.topic,
                                payload: m.payload,
                                qos: m.qos,
                                retain: m.retain,
                                properties: properties.into(),
                            },
                            at,
                        }));
                        self.timers.arm(at, Timer::Will(sid));
                    }
                    None => damaged += 1,
                }
            }
            // No deadline stored: the session was connected when the broker
            // stopped; its expiry counts from now.
            let at = match rs.meta.expires_at_ms {
                Some(ms) => Some(self.durable.instant(ms)),
                None if s.expiry_interval != u32::MAX => {
                    let at = super::message::later(now, s.expiry_interval);
                    if let Some(at) = at {
                        let meta = SessionMeta {
                            expiry_interval: s.expiry_interval,
                            expires_at_ms: Some(self.durable.unix_ms(at)),
                        };
                        let client = rs.client_id.as_str();
                        self.durable.stage(&mut self.metrics.store_errors, |l| {
                            l.put_session(client, meta)
                        });
                    }
                    at
                }
                None => None,
            };
            if let Some(at) = at {
                s.expires_at = Some(at);
                self.timers.arm(at, Timer::SessionExpiry(sid));
            }
            self.sessions.insert(sid, Box::new(s));
            self.by_client.insert(client_id, sid);
        }
        if damaged > 0 {
            tracing::warn!(
                damaged,
                "store records that could not be restored were skipped"
            );
        }
        self.metrics.store_restore_skipped += damaged;
        self.handle_timeout(now);
        self.end_event();
    }

    fn restored_message(
        &mut self,
        cache: &mut HashMap<u64, Rc<Message>>,
        id: MsgId,
        stored: &StoredMessage,
    ) -> Option<Rc<Message>> {
        if let Some(m) = cache.get(&id.0) {
            return Some(m.clone());
        }
        let m = from_stored(stored, &self.durable)?;
        m.stored().set(id);
        let m = Rc::new(m);
        cache.insert(id.0, m.clone());
        Some(m)
    }

    fn restored_item(
        &mut self,
        cache: &mut HashMap<u64, Rc<Message>>,
        e: &zerofan_store::RecoveredEntry,
    ) -> Option<Queued> {
        let msg = self.restored_message(cache, e.entry.msg, &e.message)?;
        Some(Queued {
            msg,
            qos: QoS::from_u8(e.entry.qos)?,
            retain: e.entry.retain,
            sub_ids: e.entry.subscription_ids.clone(),
            share: e.entry.share.as_deref().map(Arc::from),
            entry: Some(e.id),
            replay: false,
        })
    }
}

/// The message a will becomes (for storing it).
fn will_message(w: &Will) -> Message {
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
fn placeholder() -> Queued {
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
fn forget_entries(s: &mut Session) {
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

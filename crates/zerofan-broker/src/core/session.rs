//! Session state: subscriptions, the bounded queue, the inflight window and
//! the QoS 2 receive state. Outlives connections while its expiry allows.

use super::client_id::ClientId;
use super::hash::{HashMap, HashSet};
use super::ids::ConnId;
use super::message::Message;
use super::moment::Moment;
use super::session_queue::SessionQueue;
use crate::config::QueueFull;
use std::cell::Cell;
use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;
use zerofan_codec::{Protocol, QoS, SubscriptionOptions, Will};

/// A message waiting in a session queue, with its per-subscriber options.
#[derive(Clone, Debug)]
pub(crate) struct Queued {
    /// The shared message.
    pub msg: Rc<Message>,
    /// QoS for this subscriber (already downgraded).
    pub qos: QoS,
    /// RETAIN flag to send.
    pub retain: bool,
    /// Matching subscription identifiers.
    pub sub_ids: Vec<u32>,
    /// The shared subscription (full `$share/...` filter) it came through,
    /// so it can move to another member if this one leaves unacknowledged.
    pub share: Option<Arc<str>>,
    /// Its entry in the durable store (persistent sessions, QoS 1/2).
    pub entry: Option<zerofan_store::EntryId>,
    /// A retained message replayed for a new subscription: a reference to
    /// what the retained store holds, never dropped by the online bound and
    /// not counted as the subscriber falling behind.
    pub replay: bool,
}

#[cfg(test)]
impl Queued {
    /// A message on topic `t` with `payload` at `qos`, nothing else set.
    pub(super) fn for_test(qos: QoS, payload: bytes::Bytes) -> Queued {
        Queued {
            msg: Rc::new(Message::owned(
                zerofan_codec::MqttStr::from_static("t"),
                payload,
                qos,
                false,
                Default::default(),
                None,
            )),
            qos,
            retain: false,
            sub_ids: Vec::new(),
            share: None,
            entry: None,
            replay: false,
        }
    }
}

/// What one queue slot costs besides the message's bytes: counted against
/// the online bound, so a flood of empty payloads is bounded too.
pub(super) const SLOT: usize = std::mem::size_of::<Queued>();

/// What an item costs against the online bound.
pub(super) fn cost(q: &Queued) -> usize {
    q.msg.size() + SLOT
}

/// A subscriber whose online queue passed its high-water mark.
#[derive(Debug)]
pub(crate) struct Behind {
    /// When it passed the mark.
    pub since: Instant,
    /// Publisher connections whose reading waits for this subscriber.
    pub holding: Vec<ConnId>,
    /// Publishers at other cores (their sessions there) held the same way.
    pub holding_remote: Vec<(super::peer::PeerId, super::ids::SessionId)>,
    /// It stayed behind past `slow_consumer_timeout_ms`: it holds no
    /// publisher any more, and what goes over its high-water mark is dropped
    /// until it drains below its low-water mark.
    pub slow: bool,
}

/// Where a QoS 1/2 delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InflightState {
    /// PUBLISH sent, waiting for PUBACK (QoS 1) or PUBREC (QoS 2).
    AwaitingAck,
    /// PUBREL sent, waiting for PUBCOMP.
    AwaitingComp,
}

/// One QoS 1/2 delivery in flight.
#[derive(Clone, Debug)]
pub(crate) struct Inflight {
    /// What was sent.
    pub item: Queued,
    /// Progress.
    pub state: InflightState,
    /// Send order, for in-order redelivery.
    pub seq: u64,
}

/// A subscription as the session remembers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SubRecord {
    /// Options.
    pub options: SubscriptionOptions,
    /// Subscription identifier (never 0: the codec refuses it). Non-zero so
    /// that the record is 8 bytes and `SubMap` 24 (see `submap.rs`).
    pub id: Option<NonZeroU32>,
}

/// A will waiting for its delay (or its session's end).
#[derive(Clone, Debug)]
pub(crate) struct PendingWill {
    /// The will from CONNECT.
    pub will: Will,
    /// When it is due.
    pub at: Instant,
}

/// What [`Session::push`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PushOutcome {
    /// Queued without loss.
    Queued,
    /// Queued after dropping an older QoS 0 message.
    DroppedOldQos0,
    /// Queued after dropping the oldest message (QoS 1/2 policy).
    DroppedOldest,
    /// Not queued: QoS 0 message with the queue full of QoS 1/2.
    DroppedNewQos0,
    /// Not queued (QoS 1/2, `drop_new`).
    DroppedNew,
    /// Not queued and the consumer must be disconnected.
    Disconnect,
}

/// One session.
#[derive(Debug)]
pub(crate) struct Session {
    /// The client identifier, valid as an MQTT string (it came as an
    /// `MqttStr`). Its own copy, inline when short (see `client_id.rs`):
    /// an `MqttStr` would pin the CONNECT's buffer. The core lends it
    /// (`&str`) and copies it only for what outlives the call (an event, a
    /// replica's image, a rare log line).
    pub client_id: ClientId,
    /// The connection currently attached, if any.
    pub conn: Option<ConnId>,
    /// Protocol of the last connection.
    pub protocol: Protocol,
    /// Session Expiry Interval in seconds (u32::MAX: never).
    pub expiry_interval: u32,
    /// When an absent session expires, against the core's start (see
    /// [`Moment`]): 8 bytes where `Option<Instant>` takes 16.
    expires_at: Moment,
    /// Messages not yet sent, with the counters the bounds read. Private:
    /// only this module's methods change it (the retained replay's cost
    /// in `Flight` must follow it).
    queue: SessionQueue,
    /// The durable store has a record of this session.
    pub stored: bool,
    /// A takeover that resumes the session is closing its old connection:
    /// the session is re-attached at once, so `detach` leaves its queue
    /// as it is (no offline trim, no compaction copies).
    pub resuming: bool,
    /// In a cluster: the replicas hold the will of the connected client
    /// (armed, see `Broker::dur_will_armed`), which must go when the
    /// connection ends without publishing or scheduling it.
    pub will_armed: bool,
    /// Subscriptions by full filter (including `$share/...`); one without
    /// a table of its own (see `submap.rs`). Here rather than in `Flight`:
    /// a device that subscribes once and then idles would otherwise pay
    /// for the whole `Flight` (152 bytes) to hold 24.
    pub subscriptions: super::submap::SubMap<SubRecord>,
    /// QoS 1/2 state, allocated on first use.
    pub flight: Option<Box<Flight>>,
}

/// What a session holds once it exchanges QoS 1/2 messages, falls behind
/// or waits to publish a delayed will: boxed apart, so a session that only
/// connects and subscribes (most devices, most of the time) pays one
/// pointer for all of it.
#[derive(Debug, Default)]
pub(crate) struct Flight {
    /// QoS 1/2 deliveries in flight by packet id.
    pub inflight: HashMap<u16, Inflight>,
    /// In-flight PUBLISHes to resend (DUP) after a resume, oldest first,
    /// sent as the client's window allows.
    pub resend: VecDeque<u16>,
    /// Send order of the next in-flight delivery.
    pub next_seq: u64,
    /// Next packet id to try (0 is read as 1).
    next_pid: u16,
    /// QoS 2 packet ids received (PUBREC sent), waiting for PUBREL.
    pub incoming_qos2: HashSet<u16>,
    /// Stored queue entries dropped to make room, for the store to forget.
    pub evicted: Vec<zerofan_store::EntryId>,
    /// [`cost`] of the retained replay items in the queue.
    pub replay_cost: usize,
    /// Set while the online queue is over its high-water mark.
    pub behind: Option<Box<Behind>>,
    /// The will of a lost connection, waiting for its delay. Here, not in
    /// `Session`: few sessions ever hold one, and its 8 bytes took every
    /// session from 88 bytes to 96.
    pending_will: Option<Box<PendingWill>>,
}

/// What a session without a `Flight` reads as: one empty `Flight` per
/// thread, made once and kept for the thread's life. Not a `static`: a
/// `Flight` holds `Rc`s (messages are counted without atomics on the
/// broker's one thread), which cannot be shared between threads.
fn no_flight() -> &'static Flight {
    thread_local! {
        // `const`, made on first use below: a lazily initialised
        // thread-local checks its state on every read, and this is read
        // a few times per delivery to a session without QoS 1/2 state.
        static NO_FLIGHT: Cell<Option<&'static Flight>> = const { Cell::new(None) };
    }
    NO_FLIGHT.with(|c| {
        c.get().unwrap_or_else(|| {
            let f: &'static Flight = Box::leak(Box::default());
            c.set(Some(f));
            f
        })
    })
}

impl Session {
    /// A fresh session.
    pub(crate) fn new(client_id: ClientId, protocol: Protocol) -> Self {
        Session {
            client_id,
            conn: None,
            protocol,
            expiry_interval: 0,
            expires_at: Moment::NONE,
            queue: SessionQueue::default(),
            stored: false,
            resuming: false,
            will_armed: false,
            subscriptions: Default::default(),
            flight: None,
        }
    }

    /// When the session expires if absent; `base` is the core's start, the
    /// same for every call (see [`Moment`]).
    pub(crate) fn expires_at(&self, base: Instant) -> Option<Instant> {
        self.expires_at.get(base)
    }

    /// Set (or clear) when the session expires; `base` as for
    /// [`Session::expires_at`].
    pub(crate) fn set_expires_at(&mut self, base: Instant, at: Option<Instant>) {
        self.expires_at = Moment::new(base, at);
    }

    /// Messages queued, not yet sent.
    #[inline]
    pub(crate) fn queue_len(&self) -> usize {
        self.queue.len()
    }

    #[inline]
    pub(crate) fn queue_is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Payload bytes queued.
    #[inline]
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queue.bytes()
    }

    /// The next message to send.
    #[inline]
    pub(crate) fn queue_front(&self) -> Option<&Queued> {
        self.queue.front()
    }

    /// The queued items, to update what the counters do not count (the
    /// message's own bytes after compaction, store entries); an item's QoS
    /// and cost must stay as they are.
    pub(crate) fn queue_iter_mut(&mut self) -> impl Iterator<Item = &mut Queued> {
        self.queue.iter_mut()
    }

    /// Give every small message this session holds (queued or in flight)
    /// bytes of its own, so that waiting for an absent client does not pin
    /// publishers' read buffers; the number of copies made. Sizes do not
    /// change, so the counters stay true.
    pub(crate) fn compact(&mut self) -> u64 {
        let mut copies = 0;
        let inflight = self
            .flight
            .iter_mut()
            .flat_map(|fl| fl.inflight.values_mut())
            .map(|f| &mut f.item);
        for q in self.queue.iter_mut().chain(inflight) {
            if q.msg.worth_compacting() {
                q.msg = Rc::new(q.msg.compacted());
                copies += 1;
            }
        }
        copies
    }

    /// An empty queue that grew past `keep` slots in a burst gives its
    /// space back.
    pub(crate) fn release_queue_space(&mut self, keep: usize) {
        self.queue.release_space(keep);
    }

    /// An empty queue gives back all its space (the client is parked or
    /// gone).
    pub(crate) fn release_queue(&mut self) {
        self.queue.release();
    }

    /// The will of a lost connection, waiting for its delay.
    pub(crate) fn pending_will(&self) -> Option<&PendingWill> {
        self.flight.as_deref()?.pending_will.as_deref()
    }

    pub(crate) fn take_pending_will(&mut self) -> Option<Box<PendingWill>> {
        self.flight.as_deref_mut()?.pending_will.take()
    }

    pub(crate) fn set_pending_will(&mut self, will: Box<PendingWill>) {
        self.flight_mut().pending_will = Some(will);
    }

    pub(crate) fn flight(&self) -> &Flight {
        match self.flight.as_deref() {
            Some(f) => f,
            None => no_flight(),
        }
    }

    /// Whether (and how) the session is behind; read on every delivery,
    /// so without the empty `Flight` stand-in of [`Session::flight`].
    #[inline]
    pub(crate) fn behind(&self) -> Option<&Behind> {
        self.flight.as_deref().and_then(|f| f.behind.as_deref())
    }

    /// Subscriptions and QoS 1/2 state to change, if ever used (for
    /// removals, which need no allocation).
    pub(crate) fn flight_any(&mut self) -> Option<&mut Flight> {
        self.flight.as_deref_mut()
    }

    /// Subscriptions and QoS 1/2 state, allocated now if never used.
    pub(crate) fn flight_mut(&mut self) -> &mut Flight {
        self.flight.get_or_insert_with(Box::default)
    }

    /// A packet id not in flight. The caller guarantees the window is below
    /// 65,535, so one always exists.
    pub(crate) fn alloc_packet_id(&mut self) -> u16 {
        let f = self.flight_mut();
        loop {
            let pid = f.next_pid.max(1);
            f.next_pid = if pid == u16::MAX { 1 } else { pid + 1 };
            if !f.inflight.contains_key(&pid) {
                return pid;
            }
        }
    }

    /// Queue a message within the offline bounds (messages and payload
    /// bytes), applying the full-queue policy.
    pub(crate) fn push(
        &mut self,
        item: Queued,
        max_messages: usize,
        max_bytes: usize,
        policy: QueueFull,
    ) -> PushOutcome {
        let size = item.msg.size();
        self.push_within(item, policy, false, |s| {
            s.queue.len() >= max_messages
                || (s.queue.bytes() + size > max_bytes && !s.queue.is_empty())
        })
    }

    /// Queue a message for a connected client: bounded by [`cost`] (bytes
    /// and slots, retained replay left out), not by a message count, so a
    /// burst a busy subscriber reads a moment later is kept.
    #[inline]
    pub(crate) fn push_online(
        &mut self,
        item: Queued,
        max_cost: usize,
        policy: QueueFull,
    ) -> PushOutcome {
        let c = cost(&item);
        self.push_within(item, policy, true, |s| {
            let load = s.online_cost();
            load > 0 && load + c > max_cost
        })
    }

    /// Queue a retained message replayed for a new subscription. Never
    /// dropped: it is a reference to a message the retained store holds,
    /// so what it adds is bounded by the store.
    pub(crate) fn push_replay(&mut self, mut item: Queued) {
        item.replay = true;
        self.flight_mut().replay_cost += cost(&item);
        self.queue.push_back(item);
    }

    /// What the online bound counts: queued bytes and slots, less the
    /// retained replay.
    #[inline]
    pub(crate) fn online_cost(&self) -> usize {
        let replay = self.flight.as_deref().map_or(0, |f| f.replay_cost);
        (self.queue.bytes() + self.queue.len() * SLOT).saturating_sub(replay)
    }

    fn push_within(
        &mut self,
        item: Queued,
        policy: QueueFull,
        online: bool,
        full: impl Fn(&Session) -> bool,
    ) -> PushOutcome {
        if !full(self) {
            self.queue.push_back(item);
            return PushOutcome::Queued;
        }
        if item.qos == QoS::AtMostOnce {
            // QoS 0 makes room by dropping the oldest QoS 0 message, never a
            // QoS 1/2 one.
            if let Some(pos) = self.droppable(online, true) {
                self.remove_at(pos);
                if !full(self) {
                    self.queue.push_back(item);
                    return PushOutcome::DroppedOldQos0;
                }
            }
            return PushOutcome::DroppedNewQos0;
        }
        match policy {
            QueueFull::DropNew => PushOutcome::DroppedNew,
            QueueFull::Disconnect => PushOutcome::Disconnect,
            QueueFull::DropOldest => {
                while full(self) {
                    let Some(pos) = self.droppable(online, false) else {
                        break;
                    };
                    self.remove_at(pos);
                }
                self.queue.push_back(item);
                PushOutcome::DroppedOldest
            }
        }
    }

    /// The oldest item a full queue may drop (QoS 0 only if `qos0`); the
    /// online bound never drops retained replay, which it does not count.
    fn droppable(&self, online: bool, qos0: bool) -> Option<usize> {
        if qos0 && self.queue.qos0() == 0 {
            return None;
        }
        self.queue
            .iter()
            .position(|q| !(online && q.replay) && (!qos0 || q.qos == QoS::AtMostOnce))
    }

    /// Drop every queued live QoS 0 message (a subscriber dropped as slow);
    /// returns how many.
    pub(crate) fn drop_qos0(&mut self) -> usize {
        let mut dropped = 0;
        self.queue
            .retain(|q| q.qos != QoS::AtMostOnce || q.replay, |_| dropped += 1);
        dropped
    }

    /// Apply the offline bounds to what a session that just lost its
    /// connection still has queued: QoS 0 goes first, then QoS 1/2 as the
    /// policy says (`disconnect`: the newest, as `drop_new`). Returns the
    /// QoS 0 and the QoS 1/2 messages dropped.
    pub(crate) fn trim_offline(
        &mut self,
        max_messages: usize,
        max_bytes: usize,
        policy: QueueFull,
    ) -> (u64, u64) {
        let over = |s: &Session| {
            s.queue.len() > max_messages || (s.queue.bytes() > max_bytes && s.queue.len() > 1)
        };
        let (mut qos0, mut other) = (0, 0);
        while over(self) {
            if let Some(pos) = self.droppable(false, true) {
                self.remove_at(pos);
                qos0 += 1;
                continue;
            }
            let pos = match policy {
                QueueFull::DropOldest => 0,
                QueueFull::DropNew | QueueFull::Disconnect => self.queue.len().saturating_sub(1),
            };
            self.remove_at(pos);
            other += 1;
        }
        (qos0, other)
    }

    fn remove_at(&mut self, pos: usize) -> Option<Queued> {
        let q = self.queue.remove(pos)?;
        self.forget(&q);
        if let Some(e) = q.entry {
            self.flight_mut().evicted.push(e);
        }
        Some(q)
    }

    /// Update the replay's cost for an item that left the queue.
    #[inline]
    fn forget(&mut self, q: &Queued) {
        if q.replay {
            let f = self.flight_mut();
            f.replay_cost = f.replay_cost.saturating_sub(cost(q));
        }
    }

    /// Take the next queued message.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<Queued> {
        let q = self.queue.pop_front()?;
        self.forget(&q);
        Some(q)
    }

    /// Take the oldest queued QoS 0 message: it needs no inflight slot, so
    /// it may overtake QoS 1/2 messages waiting for the window.
    #[inline]
    pub(crate) fn pop_qos0(&mut self) -> Option<Queued> {
        if self.queue.qos0() == 0 {
            return None;
        }
        let pos = self.queue.iter().position(|q| q.qos == QoS::AtMostOnce)?;
        self.remove_at(pos)
    }

    /// Remove every queued or unacknowledged message that came through the
    /// shared subscription `share`, oldest first, for another member.
    pub(crate) fn take_shared(&mut self, share: &str) -> Vec<Queued> {
        let mut flying: Vec<&Inflight> = self
            .flight()
            .inflight
            .values()
            .filter(|f| {
                f.state == InflightState::AwaitingAck && f.item.share.as_deref() == Some(share)
            })
            .collect();
        flying.sort_by_key(|f| f.seq);
        let mut out: Vec<Queued> = flying.into_iter().map(|f| f.item.clone()).collect();
        if let Some(fl) = self.flight.as_deref_mut() {
            fl.inflight.retain(|_, f| {
                !(f.state == InflightState::AwaitingAck && f.item.share.as_deref() == Some(share))
            });
        }
        let mut gone = Vec::new();
        self.queue
            .retain(|q| q.share.as_deref() != Some(share), |q| gone.push(q));
        for q in gone {
            self.forget(&q);
            out.push(q);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::time::Duration;

    fn q(qos: QoS, n: u8) -> Queued {
        Queued::for_test(qos, Bytes::from(vec![n]))
    }

    #[test]
    fn expiry_stamps_are_exact_to_the_nanosecond() {
        // A base a day ahead of now, so that instants before it exist.
        let now = Instant::now();
        let base = now + Duration::from_secs(86_400);
        let mut s = Session::new("c".into(), Protocol::V5);
        assert_eq!(s.expires_at(base), None);
        let longest = Duration::from_secs(u64::from(u32::MAX - 1));
        let ats = [
            base,
            base + Duration::from_nanos(1),
            base + Duration::from_millis(1500),
            // A restored expiry that passed before the core started.
            now + Duration::from_nanos(7),
            base + longest + Duration::from_nanos(999_999_999),
        ];
        for at in ats {
            s.set_expires_at(base, Some(at));
            assert_eq!(s.expires_at(base), Some(at));
        }
        s.set_expires_at(base, None);
        assert_eq!(s.expires_at(base), None);
        // Past 292 years it saturates, still later than anything nearer.
        let far = base + Duration::from_secs(300 * 365 * 86_400);
        s.set_expires_at(base, Some(far));
        assert!(s.expires_at(base).is_some_and(|at| at > base + longest));
    }

    #[test]
    fn packet_ids_skip_inflight_and_wrap() {
        let mut s = Session::new("c".into(), Protocol::V5);
        s.flight_mut().next_pid = u16::MAX;
        assert_eq!(s.alloc_packet_id(), u16::MAX);
        s.flight_mut().inflight.insert(
            1,
            Inflight {
                item: q(QoS::AtLeastOnce, 0),
                state: InflightState::AwaitingAck,
                seq: 0,
            },
        );
        assert_eq!(s.alloc_packet_id(), 2);
    }

    #[test]
    fn full_queue_policies() {
        let mut s = Session::new("c".into(), Protocol::V5);
        assert_eq!(
            s.push(q(QoS::AtMostOnce, 0), 2, 100, QueueFull::DropNew),
            PushOutcome::Queued
        );
        assert_eq!(
            s.push(q(QoS::AtLeastOnce, 1), 2, 100, QueueFull::DropNew),
            PushOutcome::Queued
        );
        // QoS 0 evicts the older QoS 0.
        assert_eq!(
            s.push(q(QoS::AtMostOnce, 2), 2, 100, QueueFull::DropNew),
            PushOutcome::DroppedOldQos0
        );
        assert_eq!(
            s.push(q(QoS::AtLeastOnce, 3), 2, 100, QueueFull::DropNew),
            PushOutcome::DroppedNew
        );
        assert_eq!(
            s.push(q(QoS::AtLeastOnce, 3), 2, 100, QueueFull::Disconnect),
            PushOutcome::Disconnect
        );
        assert_eq!(
            s.push(q(QoS::AtLeastOnce, 4), 2, 100, QueueFull::DropOldest),
            PushOutcome::DroppedOldest
        );
        let left: Vec<u8> = s.queue.iter().map(|q| q.msg.payload[0]).collect();
        assert_eq!(left, vec![2, 4]);
        assert_eq!(s.queued_bytes(), 4);
    }
}

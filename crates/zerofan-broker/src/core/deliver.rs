//! Outbound delivery: session queues (bounded, with drop counters), the
//! inflight window, topic aliases towards the client, and the batches the
//! shell's writer pulls.

use super::broker::Broker;
use super::connection::{Connection, Phase};
use super::ids::{ConnId, SessionId};
use super::message::{copy_str, Message};
use super::outbox::{Delivery, Outgoing, Transmit};
use super::peer::{PeerEvent, PeerId};
use super::session::{Behind, Inflight, InflightState, PushOutcome, Queued};
use super::timers::Timer;
use crate::config::{Config, QueueFull};
use std::rc::Rc;
use std::time::{Duration, Instant};
use zerofan_codec::{QoS, ReasonCode};

/// Queue capacity (entries) a session keeps once its queue is empty; more
/// is released, so a subscriber that once took a burst does not hold its
/// peak forever.
const QUEUE_KEEP: usize = 64;

impl Broker {
    /// Put a message in a session's queue, within its bounds.
    pub(crate) fn enqueue(&mut self, now: Instant, sid: SessionId, item: Queued) {
        let mut cache = None;
        self.enqueue_with(now, sid, item, &mut cache);
    }

    /// [`Broker::enqueue`] sharing one compacted copy between every absent
    /// session of the same message.
    pub(crate) fn enqueue_with(
        &mut self,
        now: Instant,
        sid: SessionId,
        mut item: Queued,
        compacted: &mut Option<Rc<Message>>,
    ) {
        // Stored before any compaction copy, which then carries the id.
        self.dur_enqueue(sid, &mut item);
        let entry = item.entry;
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if s.conn.is_none() {
            if item.qos == QoS::AtMostOnce {
                // QoS 0 is not kept for absent clients.
                return;
            }
            if item.msg.worth_compacting() {
                let copy = compacted.get_or_insert_with(|| {
                    self.metrics.compactions += 1;
                    Rc::new(item.msg.compacted())
                });
                item.msg = copy.clone();
            }
        }
        let cfg = &self.config;
        let origin = (item.msg.origin_peer, item.msg.origin);
        let outcome = if s.conn.is_some() {
            // A slow subscriber keeps no more than its high-water mark.
            let slow = s.flight().behind.as_ref().is_some_and(|b| b.slow);
            let bound = if slow {
                high_water(cfg)
            } else if held_remote(s.flight().behind.as_deref(), origin) {
                cfg.max_online_queued_bytes.saturating_add(HOLD_SLACK)
            } else {
                cfg.max_online_queued_bytes
            };
            s.push_online(item, bound, cfg.queue_full)
        } else {
            s.push(
                item,
                cfg.max_queued_messages,
                cfg.max_queued_bytes,
                cfg.queue_full,
            )
        };
        let conn = s.conn;
        if conn.is_some() && s.online_cost() > high_water(cfg) {
            self.fall_behind(now, sid, origin);
        }
        if entry.is_some() {
            self.dur_evicted(sid);
            if matches!(outcome, PushOutcome::DroppedNew | PushOutcome::Disconnect) {
                self.dur_dequeue(sid, entry);
            }
        }
        match outcome {
            PushOutcome::Queued => {}
            PushOutcome::DroppedOldQos0 | PushOutcome::DroppedNewQos0 => {
                self.metrics.dropped_qos0_queue_full += 1
            }
            PushOutcome::DroppedOldest | PushOutcome::DroppedNew => {
                self.metrics.dropped_queue_full += 1
            }
            PushOutcome::Disconnect => {
                self.metrics.dropped_queue_full += 1;
                self.disconnect_slow(now, conn, "queue full");
                return;
            }
        }
        if let Some(conn) = conn {
            self.wake(conn);
        }
    }

    /// Queue a retained message replayed for a new subscription of an
    /// online session: never dropped (see [`Session::push_replay`]), sent
    /// as the client's window and socket allow.
    ///
    /// [`Session::push_replay`]: super::session::Session::push_replay
    pub(crate) fn enqueue_replay(&mut self, sid: SessionId, mut item: Queued) {
        self.dur_enqueue(sid, &mut item);
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        s.push_replay(item);
        if let Some(conn) = s.conn {
            self.wake(conn);
        }
    }

    /// `sid`'s online queue is over its high-water mark: start its slow
    /// consumer clock, and stop reading the publisher of this message until
    /// it drains (not the subscriber itself: it could then never drain).
    fn fall_behind(
        &mut self,
        now: Instant,
        sid: SessionId,
        origin: (Option<PeerId>, Option<SessionId>),
    ) {
        let timeout = Duration::from_millis(self.config.slow_consumer_timeout_ms);
        let publisher = match origin {
            (None, Some(o)) => self.sessions.get(&o).and_then(|p| p.conn),
            _ => None,
        };
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        let own = s.conn;
        let f = s.flight_mut();
        if f.behind.is_none() {
            f.behind = Some(Box::new(Behind {
                since: now,
                holding: Vec::new(),
                holding_remote: Vec::new(),
                slow: false,
            }));
            // A timeout too large for the clock never fires.
            if let Some(at) = now.checked_add(timeout) {
                self.timers.arm(at, Timer::SlowConsumer(sid));
            }
        }
        let Some(b) = f.behind.as_deref_mut() else {
            return;
        };
        if b.slow {
            return;
        }
        if let (Some(peer), Some(session)) = origin {
            // Published at another core: that core holds its publisher.
            if !b.holding_remote.contains(&(peer, session)) {
                b.holding_remote.push((peer, session));
                self.metrics.publisher_throttles += 1;
                self.peers.send(
                    peer,
                    PeerEvent::Hold {
                        session,
                        hold: true,
                    },
                );
            }
            return;
        }
        let Some(pc) = publisher.filter(|&pc| Some(pc) != own) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&pc) else {
            return;
        };
        if c.held_by.is_none() {
            c.held_by = Some(sid);
            b.holding.push(pc);
            self.metrics.publisher_throttles += 1;
        }
    }

    /// `sid` caught up, went away or was dropped as slow: the publishers it
    /// held are read again.
    pub(crate) fn release_publishers(&mut self, sid: SessionId) {
        let (holding, remote) = match self
            .sessions
            .get_mut(&sid)
            .and_then(|s| s.flight_any())
            .and_then(|f| f.behind.as_deref_mut())
        {
            Some(b) => (
                std::mem::take(&mut b.holding),
                std::mem::take(&mut b.holding_remote),
            ),
            None => return,
        };
        for (peer, session) in remote {
            self.peers.send(
                peer,
                PeerEvent::Hold {
                    session,
                    hold: false,
                },
            );
        }
        for pc in holding {
            if let Some(c) = self.conns.get_mut(&pc) {
                if c.held_by == Some(sid) {
                    c.held_by = None;
                    self.wake(pc);
                }
            }
        }
    }

    /// [`Broker::release_publishers`], and the session is no longer behind.
    pub(crate) fn caught_up(&mut self, sid: SessionId) {
        self.release_publishers(sid);
        if let Some(f) = self.sessions.get_mut(&sid).and_then(|s| s.flight_any()) {
            f.behind = None;
        }
    }

    /// The slow consumer timer of `sid` fired.
    pub(crate) fn on_slow_timer(&mut self, now: Instant, sid: SessionId) {
        let timeout = Duration::from_millis(self.config.slow_consumer_timeout_ms);
        let Some(s) = self.sessions.get(&sid) else {
            return;
        };
        let Some(b) = s.flight().behind.as_deref() else {
            return;
        };
        if b.slow {
            return;
        }
        if b.since.checked_add(timeout).is_none_or(|at| at > now) {
            // Caught up and fell behind again since this timer was armed:
            // that episode armed a timer of its own.
            return;
        }
        let client = s.client_id.clone();
        let queued = s.online_cost();
        let conn = s.conn;
        self.metrics.slow_subscribers_dropped += 1;
        self.release_publishers(sid);
        if let Some(suppressed) = self.log_gate(now, "slow consumer") {
            tracing::warn!(
                client = client.as_str(),
                queued,
                suppressed,
                "dropping a slow consumer"
            );
        }
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if let Some(b) = s.flight_any().and_then(|f| f.behind.as_deref_mut()) {
            b.slow = true;
        }
        if self.config.queue_full == QueueFull::Disconnect {
            self.disconnect_slow(now, conn, "slow consumer");
        } else {
            let dropped = s.drop_qos0();
            self.metrics.dropped_qos0_queue_full += dropped as u64;
        }
    }

    /// `queue_full = "disconnect"`: close a subscriber that cannot keep up
    /// (0x97), counted.
    fn disconnect_slow(&mut self, now: Instant, conn: Option<ConnId>, what: &'static str) {
        if let Some(conn) = conn {
            self.metrics.slow_consumer_disconnects += 1;
            self.close_with(now, conn, ReasonCode::QUOTA_EXCEEDED, Some(what), true);
        }
    }

    /// The body of [`Broker::poll_transmit`].
    pub(crate) fn fill_batch(
        &mut self,
        now: Instant,
        conn: ConnId,
        out: &mut Vec<Outgoing>,
        max: usize,
    ) -> Transmit {
        let Some(c) = self.conns.get_mut(&conn) else {
            return Transmit::Gone;
        };
        c.woken = false;
        while out.len() < max {
            match c.outbox.pop_front() {
                Some(item) => out.push(item),
                None => break,
            }
        }
        if c.outbox.is_empty() && c.outbox.capacity() > 0 {
            // An idle connection keeps no outbox capacity (224 bytes after
            // its CONNACK); a busy one pays one allocation per batch.
            c.outbox = std::collections::VecDeque::new();
        }
        let sid = match c.phase {
            Phase::Closing => {
                return if c.outbox.is_empty() {
                    Transmit::Close
                } else {
                    Transmit::Open
                };
            }
            Phase::AwaitingConnect | Phase::AwaitingTakeover | Phase::AwaitingAuth => {
                return Transmit::Open
            }
            Phase::Connected(sid) => sid,
        };
        let Some(s) = self.sessions.get_mut(&sid) else {
            return Transmit::Open;
        };
        let window = usize::from(c.send_window);
        while out.len() < max {
            let Some(&pid) = s.flight().resend.front() else {
                break;
            };
            if s.flight()
                .inflight
                .len()
                .saturating_sub(s.flight().resend.len())
                >= window
            {
                break;
            }
            s.flight_mut().resend.pop_front();
            let Some(f) = s.flight().inflight.get(&pid) else {
                continue;
            };
            if f.state != InflightState::AwaitingAck {
                continue;
            }
            let mut d = make_delivery(c, &f.item, pid, now);
            d.dup = true;
            self.metrics.messages_sent += 1;
            self.metrics.messages_sent_by_qos[d.qos as usize] += 1;
            out.push(Outgoing::Publish(d));
        }
        while out.len() < max {
            let Some(front) = s.queue_front() else {
                // A burst is over: give its queue space back.
                s.release_queue_space(QUEUE_KEEP);
                break;
            };
            let next = if front.qos != QoS::AtMostOnce && s.flight().inflight.len() >= window {
                // Flow control: never more than the client's Receive Maximum
                // unacknowledged (MQTT-3.3.4-9). QoS 0 is not counted, so it
                // may go ahead of the waiting QoS 1/2 messages.
                s.pop_qos0()
            } else {
                s.pop()
            };
            let Some(item) = next else {
                break;
            };
            if item.msg.is_expired(now) {
                self.metrics.dropped_expired += 1;
                if let Some(e) = item.entry {
                    let client = s.client_id.as_str();
                    self.durable
                        .stage(&mut self.metrics.store_errors, |l| l.dequeue(client, e));
                }
                continue;
            }
            if c.protocol.is_v5() && !fits(c, &item, now) {
                // Never send more than the client's Maximum Packet Size; the
                // message is dropped as if delivered (MQTT-3.1.2-25).
                self.metrics.dropped_too_large += 1;
                if let Some(e) = item.entry {
                    let client = s.client_id.as_str();
                    self.durable
                        .stage(&mut self.metrics.store_errors, |l| l.dequeue(client, e));
                }
                continue;
            }
            let pid = if item.qos == QoS::AtMostOnce {
                0
            } else {
                s.alloc_packet_id()
            };
            // A stored QoS 2 delivery goes out only once its `send` record is
            // durable: a restart then resends it with DUP and the same packet
            // id (deduplicated by the client), never as a new message.
            let hold = item.entry.is_some() && item.qos == QoS::ExactlyOnce;
            if let (Some(e), true) = (item.entry, pid != 0) {
                let client = s.client_id.as_str();
                self.durable
                    .stage(&mut self.metrics.store_errors, |l| l.send(client, e, pid));
            }
            let d = if item.qos == QoS::AtMostOnce {
                // Nothing of it is kept: the delivery takes the message's
                // reference instead of one more up and down.
                into_delivery(c, item, now)
            } else {
                let d = make_delivery(c, &item, pid, now);
                let f = s.flight_mut();
                let seq = f.next_seq;
                f.next_seq += 1;
                s.flight_mut().inflight.insert(
                    pid,
                    Inflight {
                        item,
                        state: InflightState::AwaitingAck,
                        seq,
                    },
                );
                d
            };
            self.metrics.messages_sent += 1;
            self.metrics.payload_bytes_sent += d.message.payload.len() as u64;
            self.metrics.messages_sent_by_qos[d.qos as usize] += 1;
            self.metrics.payload_bytes_sent_by_qos[d.qos as usize] +=
                d.message.payload.len() as u64;
            if hold {
                self.durable.hold(conn, Outgoing::Publish(d));
            } else {
                out.push(Outgoing::Publish(d));
            }
        }
        if s.flight().behind.is_some() && s.online_cost() < low_water(&self.config) {
            self.caught_up(sid);
        }
        Transmit::Open
    }

    /// A shared-subscription member `from` leaves `share` (or just lost its
    /// connection, `keep_if_alone`): its queued and unacknowledged messages
    /// of that group go to other members.
    pub(crate) fn hand_over_shared(
        &mut self,
        now: Instant,
        from: SessionId,
        share: &str,
        keep_if_alone: bool,
    ) {
        self.dur_release_shared(from, share);
        let items = match self.sessions.get_mut(&from) {
            Some(s) => s.take_shared(share),
            None => return,
        };
        for mut item in items {
            let sessions = &self.sessions;
            let online = |s: SessionId| sessions.get(&s).is_some_and(|x| x.conn.is_some());
            let pick = self.router.other_member(share, from, online);
            if pick.is_none() && !keep_if_alone {
                // No member left here: one at another shard takes it.
                if let Some(peer) = self.router.peer_member(share) {
                    self.metrics.peer_forwarded += 1;
                    let event = PeerEvent::Publish {
                        msg: item.msg.for_peer(),
                        direct: false,
                        shares: vec![share.into()],
                    };
                    self.peers.send(peer, event);
                    continue;
                }
            }
            match pick {
                Some(e) => {
                    item.qos = e.options.qos.min(item.msg.qos);
                    item.sub_ids = e.id.into_iter().collect();
                    self.enqueue(now, e.session, item);
                }
                None if keep_if_alone => {
                    self.dur_enqueue(from, &mut item);
                    let entry = item.entry;
                    if let Some(s) = self.sessions.get_mut(&from) {
                        let cfg = &self.config;
                        let outcome = s.push(
                            item,
                            cfg.max_queued_messages,
                            cfg.max_queued_bytes,
                            cfg.queue_full,
                        );
                        if entry.is_some() {
                            self.dur_evicted(from);
                            if matches!(outcome, PushOutcome::DroppedNew | PushOutcome::Disconnect)
                            {
                                self.dur_dequeue(from, entry);
                            }
                        }
                    }
                }
                None => {}
            }
        }
    }

    /// Remove one of `sid`'s subscriptions from the router.
    pub(crate) fn trie_remove(&mut self, filter: &str, sid: SessionId) -> bool {
        self.router.unsubscribe(filter, sid)
    }
}

/// Online queue cost past which a subscriber is behind: its publishers are
/// held, and its slow consumer clock runs.
/// What a subscriber behind may queue past its bound from a publisher on
/// another shard that it already asked to stop: that shard goes on reading
/// until the Hold reaches it (a few reads of at most 64 KiB each, the
/// batches in its queue), and those messages are kept, not dropped; past
/// this, they are dropped and counted as any other.
pub(crate) const HOLD_SLACK: usize = 4 * 1024 * 1024;

/// Whether `behind` already holds the remote publisher `origin`.
fn held_remote(behind: Option<&Behind>, origin: (Option<PeerId>, Option<SessionId>)) -> bool {
    match (behind, origin) {
        (Some(b), (Some(peer), Some(session))) => b.holding_remote.contains(&(peer, session)),
        _ => false,
    }
}

pub(crate) fn high_water(cfg: &Config) -> usize {
    cfg.max_online_queued_bytes / 2
}

/// Online queue cost below which a subscriber behind has caught up.
pub(crate) fn low_water(cfg: &Config) -> usize {
    cfg.max_online_queued_bytes / 4
}

/// Whether the delivery fits the client's Maximum Packet Size, counted with
/// the full topic (an alias could only make it smaller).
fn fits(c: &Connection, item: &Queued, now: Instant) -> bool {
    if c.max_packet_out == u32::MAX {
        return true;
    }
    let header = zerofan_codec::PublishHeader {
        dup: false,
        qos: item.qos,
        retain: item.retain,
        packet_id: 1,
        topic: item.msg.topic.as_str(),
        topic_alias: None,
        properties: &item.msg.properties,
        message_expiry_interval: item.msg.remaining_expiry(now),
        subscription_identifiers: &item.sub_ids,
        payload_len: item.msg.payload.len(),
    };
    header
        .packet_len(c.protocol)
        .is_ok_and(|len| len <= c.max_packet_out as usize)
}

/// Build the per-subscriber PUBLISH of a message that stays queued or in
/// flight (see [`delivery`]).
pub(crate) fn make_delivery(
    c: &mut Connection,
    item: &Queued,
    packet_id: u16,
    now: Instant,
) -> Delivery {
    let ids = item.sub_ids.clone();
    delivery(
        c,
        item.msg.clone(),
        item.qos,
        item.retain,
        ids,
        packet_id,
        now,
    )
}

/// The QoS 0 PUBLISH of a queued item that nothing keeps afterwards: it
/// moves into the delivery.
fn into_delivery(c: &mut Connection, item: Queued, now: Instant) -> Delivery {
    delivery(c, item.msg, item.qos, item.retain, item.sub_ids, 0, now)
}

/// Build the per-subscriber PUBLISH, choosing a topic alias when the client
/// allows them: the first message on a topic establishes one, later ones
/// send only the alias.
fn delivery(
    c: &mut Connection,
    message: Rc<Message>,
    qos: QoS,
    retain: bool,
    subscription_identifiers: Vec<u32>,
    packet_id: u16,
    now: Instant,
) -> Delivery {
    let (topic_alias, send_topic) = if c.alias_max_out == 0 {
        (None, true)
    } else if let Some(&a) = c
        .aliases
        .as_ref()
        .and_then(|al| al.outgoing.get(&message.topic))
    {
        (Some(a), false)
    } else if c.aliases.as_ref().map_or(0, |al| al.outgoing.len()) < usize::from(c.alias_max_out) {
        let out = &mut c.aliases_mut().outgoing;
        let a = out.len() as u16 + 1;
        out.insert(copy_str(&message.topic), a);
        (Some(a), true)
    } else {
        (None, true)
    };
    // Subscription identifiers and the expiry interval exist in MQTT 5 only.
    let (subscription_identifiers, message_expiry_interval) = if c.protocol.is_v5() {
        (subscription_identifiers, message.remaining_expiry(now))
    } else {
        (Vec::new(), None)
    };
    Delivery {
        message,
        qos,
        packet_id,
        dup: false,
        retain,
        topic_alias,
        send_topic,
        subscription_identifiers,
        message_expiry_interval,
    }
}

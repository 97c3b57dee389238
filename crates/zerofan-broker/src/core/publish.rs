//! Inbound PUBLISH and the acknowledgement flows in both directions, and
//! routing a message to every matching session.

use super::broker::Broker;
use super::ids::{ConnId, SessionId};
use super::message::{copy_str, Message};
use super::outbox::Outgoing;
use super::session::InflightState;
use super::wire::Wire;
use std::rc::Rc;
use std::time::Instant;
use zerofan_codec::{Ack, Packet, Publish, QoS, ReasonCode};

/// Messages at most this large are copied out of their read buffer before
/// being kept for long (retained, offline queues): a small slice must not
/// pin a large pooled buffer.
pub(crate) const COMPACT_AT_MOST: usize = 8 * 1024;

impl Broker {
    /// PUBLISH from a client.
    pub(crate) fn on_publish(
        &mut self,
        now: Instant,
        conn: ConnId,
        sid: SessionId,
        mut p: Publish,
        wire: Option<Wire>,
    ) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if p.retain && !self.config.retain_available {
            self.close_with(
                now,
                conn,
                ReasonCode::RETAIN_NOT_SUPPORTED,
                Some("retain not supported"),
                true,
            );
            return;
        }
        if let Some(alias) = p.properties.topic_alias {
            if alias == 0 || alias > self.config.topic_alias_maximum {
                self.close_with(
                    now,
                    conn,
                    ReasonCode::TOPIC_ALIAS_INVALID,
                    Some("topic alias out of range"),
                    true,
                );
                return;
            }
            if p.topic.is_empty() {
                match c.aliases.as_ref().and_then(|al| al.incoming.get(&alias)) {
                    Some(t) => p.topic = t.clone(),
                    None => {
                        self.protocol_error(now, conn, "unknown topic alias");
                        return;
                    }
                }
            } else {
                // Kept for the connection's life: copied, not a slice pinning
                // this packet's read buffer.
                c.aliases_mut().incoming.insert(alias, copy_str(&p.topic));
            }
        }
        if zerofan_codec::topic::validate_topic_name(&p.topic).is_err()
            || topic_levels(&p.topic) > self.config.max_topic_levels
        {
            self.close_with(
                now,
                conn,
                ReasonCode::TOPIC_NAME_INVALID,
                Some("invalid topic name"),
                true,
            );
            return;
        }
        if self.publish_refused(now, conn, sid, &p) {
            return;
        }
        let protocol = self.conns.get(&conn).map(|c| c.protocol);
        let v5 = protocol.is_some_and(|p| p.is_v5());
        self.metrics.messages_received += 1;
        self.metrics.payload_bytes_received += p.payload.len() as u64;
        self.metrics.messages_received_by_qos[p.qos as usize] += 1;
        self.metrics.payload_bytes_received_by_qos[p.qos as usize] += p.payload.len() as u64;
        let pid = p.packet_id;
        let qos = p.qos;

        if qos == QoS::ExactlyOnce {
            let Some(s) = self.sessions.get_mut(&sid) else {
                return;
            };
            if s.flight().incoming_qos2.contains(&pid) {
                // A resent PUBLISH of a message already taken: ack, do not route twice.
                self.send_publish_ack(
                    conn,
                    Outgoing::from_packet(Packet::PubRec(ack(pid, ReasonCode::SUCCESS))),
                );
                return;
            }
            if s.flight().incoming_qos2.len() >= usize::from(self.config.receive_maximum) {
                self.close_with(
                    now,
                    conn,
                    ReasonCode::RECEIVE_MAXIMUM_EXCEEDED,
                    Some("receive maximum exceeded"),
                    true,
                );
                return;
            }
            s.flight_mut().incoming_qos2.insert(pid);
            self.dur_qos2_received(sid, pid);
        }

        // (A publish into `$SYS/` was refused by `publish_refused`.)
        let mut msg = Message::from_publish(p, Some(sid), now);
        if let (Some(w), Some(protocol)) = (wire, protocol) {
            msg.attach_wire(w, protocol, &mut self.wire_scratch);
        }
        let msg = Rc::new(msg);
        if self.events.on() {
            let id = self.sessions.get(&sid).map(|s| &s.client_id);
            self.events.published(id, &msg);
        }
        self.retain_refused = false;
        let matched = self.route(now, msg);
        // A retained message that went to the peers: acknowledged once every
        // shard has it (see `PeerEvent::Seen`).
        let fence = self.ack_fence.take();
        let reason = if std::mem::take(&mut self.retain_refused) && v5 {
            ReasonCode::QUOTA_EXCEEDED
        } else if matched == 0 && v5 {
            ReasonCode::NO_MATCHING_SUBSCRIBERS
        } else {
            ReasonCode::SUCCESS
        };
        // Held until durable when this publish was written (see `durable`).
        let out = match qos {
            QoS::AtMostOnce => return,
            QoS::AtLeastOnce => Outgoing::from_packet(Packet::PubAck(ack(pid, reason))),
            QoS::ExactlyOnce => Outgoing::from_packet(Packet::PubRec(ack(pid, reason))),
        };
        match fence {
            Some(seq) => self.peers.defer(seq, conn, super::peer::Deferred::Ack(out)),
            None => self.send_publish_ack(conn, out),
        }
    }

    /// PUBREL from a client: the QoS 2 message is complete.
    pub(crate) fn on_pubrel(&mut self, conn: ConnId, sid: SessionId, a: Ack) {
        let known = self
            .sessions
            .get_mut(&sid)
            .and_then(|s| s.flight_any())
            .is_some_and(|f| f.incoming_qos2.remove(&a.packet_id));
        let v5 = self.conns.get(&conn).is_some_and(|c| c.protocol.is_v5());
        let reason = if known || !v5 {
            ReasonCode::SUCCESS
        } else {
            ReasonCode::PACKET_IDENTIFIER_NOT_FOUND
        };
        if known {
            self.dur_qos2_released(sid, a.packet_id);
        }
        // After the release is durable: a restart must not treat the packet
        // id, free again for the client, as still taken.
        self.send_publish_ack(
            conn,
            Outgoing::from_packet(Packet::PubComp(ack(a.packet_id, reason))),
        );
    }

    /// PUBACK from a client: a QoS 1 delivery is done.
    pub(crate) fn on_puback(&mut self, conn: ConnId, sid: SessionId, a: Ack) {
        if let Some(s) = self.sessions.get_mut(&sid) {
            let done = s.flight().inflight.get(&a.packet_id).is_some_and(|f| {
                f.item.qos == QoS::AtLeastOnce && f.state == InflightState::AwaitingAck
            });
            if done {
                let stored = s
                    .flight_mut()
                    .inflight
                    .remove(&a.packet_id)
                    .is_some_and(|f| f.item.entry.is_some());
                // The window has room again.
                if !s.queue_is_empty() {
                    self.wake(conn);
                }
                if stored {
                    self.dur_complete(sid, a.packet_id);
                }
            }
        }
    }

    /// PUBREC from a client: answer PUBREL (or drop the message on an error code).
    pub(crate) fn on_pubrec(&mut self, conn: ConnId, sid: SessionId, a: Ack) {
        let v5 = self.conns.get(&conn).is_some_and(|c| c.protocol.is_v5());
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        match s
            .flight_any()
            .and_then(|f| f.inflight.get_mut(&a.packet_id))
        {
            Some(f) if f.item.qos == QoS::ExactlyOnce => {
                let stored = f.item.entry.is_some();
                if a.reason.is_error() {
                    s.flight_mut().inflight.remove(&a.packet_id);
                    if !s.queue_is_empty() {
                        self.wake(conn);
                    }
                    if stored {
                        self.dur_complete(sid, a.packet_id);
                    }
                    return;
                }
                f.state = InflightState::AwaitingComp;
                if stored {
                    self.dur_pubrec(sid, a.packet_id);
                }
                // The payload is no longer needed; keep only the id state.
                self.send(conn, Packet::PubRel(ack(a.packet_id, ReasonCode::SUCCESS)));
            }
            _ => {
                let reason = if v5 {
                    ReasonCode::PACKET_IDENTIFIER_NOT_FOUND
                } else {
                    ReasonCode::SUCCESS
                };
                self.send(conn, Packet::PubRel(ack(a.packet_id, reason)));
            }
        }
    }

    /// PUBCOMP from a client: a QoS 2 delivery is done.
    pub(crate) fn on_pubcomp(&mut self, conn: ConnId, sid: SessionId, a: Ack) {
        if let Some(s) = self.sessions.get_mut(&sid) {
            let done = s
                .flight()
                .inflight
                .get(&a.packet_id)
                .is_some_and(|f| f.state == InflightState::AwaitingComp);
            if done {
                let stored = s
                    .flight_mut()
                    .inflight
                    .remove(&a.packet_id)
                    .is_some_and(|f| f.item.entry.is_some());
                if !s.queue_is_empty() {
                    self.wake(conn);
                }
                if stored {
                    self.dur_complete(sid, a.packet_id);
                }
            }
        }
    }

    /// The message to keep for long: small ones are copied out of their read
    /// buffer (counted), large ones are worth the buffer they hold.
    pub(crate) fn keepable(&mut self, msg: &Rc<Message>) -> Rc<Message> {
        if msg.worth_compacting() {
            self.metrics.compactions += 1;
            Rc::new(msg.compacted())
        } else {
            msg.clone()
        }
    }
}

/// How many levels a topic has (one more than its `/` separators).
fn topic_levels(topic: &str) -> usize {
    1 + topic.bytes().filter(|&b| b == b'/').count()
}

/// An acknowledgement packet body.
pub(crate) fn ack(packet_id: u16, reason: ReasonCode) -> Ack {
    Ack {
        packet_id,
        reason,
        properties: Default::default(),
    }
}

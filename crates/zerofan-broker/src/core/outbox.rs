//! What the core hands to the shell to write: control packets and
//! deliveries that reference a shared message.

use super::message::Message;
use super::wire::Wire;
use std::rc::Rc;
use zerofan_codec::{Ack, Packet, Protocol, PublishHeader, QoS, ReasonCode};

/// One item for the connection's writer. Kept small (about 64 bytes), since
/// every connection's outbox holds some: the rare large control packets are
/// boxed, the frequent acknowledgements carry only what varies.
#[derive(Debug)]
pub enum Outgoing {
    /// A control packet to encode as-is.
    Packet(Box<Packet>),
    /// PUBACK / PUBREC / PUBREL / PUBCOMP without properties.
    Ack {
        /// Which acknowledgement.
        kind: AckKind,
        /// Packet identifier.
        packet_id: u16,
        /// Reason code (MQTT 5).
        reason: ReasonCode,
    },
    /// A PUBLISH of a shared message: the writer encodes only the small
    /// per-delivery header and sends the shared payload as its own iovec.
    Publish(Delivery),
}

/// The four acknowledgement packets of the QoS 1/2 flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckKind {
    /// PUBACK.
    PubAck,
    /// PUBREC.
    PubRec,
    /// PUBREL.
    PubRel,
    /// PUBCOMP.
    PubComp,
}

impl Outgoing {
    /// The outbox form of a control packet.
    pub fn from_packet(packet: Packet) -> Outgoing {
        let (kind, a) = match packet {
            Packet::PubAck(a) if a.properties.is_empty() => (AckKind::PubAck, a),
            Packet::PubRec(a) if a.properties.is_empty() => (AckKind::PubRec, a),
            Packet::PubRel(a) if a.properties.is_empty() => (AckKind::PubRel, a),
            Packet::PubComp(a) if a.properties.is_empty() => (AckKind::PubComp, a),
            other => return Outgoing::Packet(Box::new(other)),
        };
        Outgoing::Ack {
            kind,
            packet_id: a.packet_id,
            reason: a.reason,
        }
    }

    /// The control packet to encode; `None` for a PUBLISH delivery.
    pub fn control_packet(&self) -> Option<Packet> {
        match self {
            Outgoing::Packet(p) => Some((**p).clone()),
            Outgoing::Ack {
                kind,
                packet_id,
                reason,
            } => {
                let a = Ack {
                    packet_id: *packet_id,
                    reason: *reason,
                    properties: Default::default(),
                };
                Some(match kind {
                    AckKind::PubAck => Packet::PubAck(a),
                    AckKind::PubRec => Packet::PubRec(a),
                    AckKind::PubRel => Packet::PubRel(a),
                    AckKind::PubComp => Packet::PubComp(a),
                })
            }
            Outgoing::Publish(_) => None,
        }
    }
}

/// The per-subscriber part of one PUBLISH.
#[derive(Debug)]
pub struct Delivery {
    /// The shared message (payload shared with every other subscriber).
    pub message: Rc<Message>,
    /// QoS of this delivery.
    pub qos: QoS,
    /// Packet identifier (0 at QoS 0).
    pub packet_id: u16,
    /// DUP flag (a redelivery).
    pub dup: bool,
    /// RETAIN flag of this delivery.
    pub retain: bool,
    /// Topic alias to send, if any.
    pub topic_alias: Option<u16>,
    /// False when the alias is already established and the topic is left out.
    pub send_topic: bool,
    /// Matching subscription identifiers (MQTT 5).
    pub subscription_identifiers: Vec<u32>,
    /// Remaining message expiry interval, if the message has one.
    pub message_expiry_interval: Option<u32>,
}

impl Delivery {
    /// The packet as received, when this delivery to a `protocol` client is
    /// byte for byte that packet: QoS 0, no RETAIN or DUP, the full topic,
    /// nothing added per subscriber, and an encoding of the same family.
    pub fn wire(&self, protocol: Protocol) -> Option<&Wire> {
        let w = self.message.wire()?;
        let plain = self.qos == QoS::AtMostOnce
            && !self.dup
            && !self.retain
            && self.send_topic
            && self.topic_alias.is_none()
            && self.subscription_identifiers.is_empty()
            && self.message_expiry_interval.is_none()
            && w.is_v5() == protocol.is_v5();
        plain.then_some(w)
    }

    /// The header the codec writes for this delivery.
    pub fn header(&self) -> PublishHeader<'_> {
        PublishHeader {
            dup: self.dup,
            qos: self.qos,
            retain: self.retain,
            packet_id: self.packet_id,
            topic: if self.send_topic {
                self.message.topic.as_str()
            } else {
                ""
            },
            topic_alias: self.topic_alias,
            properties: &self.message.properties,
            message_expiry_interval: self.message_expiry_interval,
            subscription_identifiers: &self.subscription_identifiers,
            payload_len: self.message.payload.len(),
        }
    }
}

/// What [`crate::core::Broker::poll_transmit`] says about a connection after
/// filling the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transmit {
    /// Keep the connection open; more may come later.
    Open,
    /// Write what you were given, then close the connection.
    Close,
    /// The connection is unknown (already lost); stop.
    Gone,
}

#[cfg(test)]
mod tests {
    #[test]
    fn outbox_items_stay_small() {
        assert!(std::mem::size_of::<super::Outgoing>() <= 72);
    }
}

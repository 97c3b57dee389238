//! What the core hands to the shell to write: control packets and
//! deliveries that reference a shared message.

use super::message::Message;
use super::wire::Wire;
use std::collections::VecDeque;
use std::rc::Rc;
use zerofan_codec::{Ack, Packet, Protocol, PublishHeader, QoS, ReasonCode};

/// A connection's items waiting for its writer. Boxed and made on the
/// first item, dropped when the connection parks ([`Outbox::release`]): a
/// parked connection (almost all of a device fleet's, almost all the
/// time) holds 8 bytes for it where an empty `VecDeque` took 32. A running
/// one keeps the box, and gives its buffer back whenever the writer has
/// taken everything, as the inline `VecDeque` did.
#[derive(Debug, Default)]
// The extra allocation is the point: 8 bytes held while idle.
#[allow(clippy::box_collection)]
pub(crate) struct Outbox(Option<Box<VecDeque<Outgoing>>>);

impl Outbox {
    #[inline]
    pub(crate) fn push_back(&mut self, item: Outgoing) {
        self.0.get_or_insert_with(Box::default).push_back(item);
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Move items to `out` until it holds `max`; an outbox left empty
    /// gives its buffer back (224 bytes after a CONNACK).
    #[inline]
    pub(crate) fn take_into(&mut self, out: &mut Vec<Outgoing>, max: usize) {
        let Some(q) = self.0.as_mut() else {
            return;
        };
        let n = max.saturating_sub(out.len()).min(q.len());
        out.extend(q.drain(..n));
        if q.is_empty() && q.capacity() > 0 {
            **q = VecDeque::new();
        }
    }

    /// Drop the box if empty (the connection parks).
    pub(crate) fn release(&mut self) {
        if self.is_empty() {
            self.0 = None;
        }
    }
}

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
    use super::{Outbox, Outgoing};
    use zerofan_codec::Packet;

    #[test]
    fn outbox_items_stay_small() {
        assert!(std::mem::size_of::<Outgoing>() <= 72);
        assert_eq!(std::mem::size_of::<Outbox>(), 8);
    }

    #[test]
    fn the_writer_takes_batches_in_order_and_a_parked_outbox_holds_nothing() {
        let mut o = Outbox::default();
        let mut out = Vec::new();
        o.take_into(&mut out, 10);
        assert!(out.is_empty() && o.is_empty());
        for _ in 0..5 {
            o.push_back(Outgoing::from_packet(Packet::PingResp));
        }
        out.push(Outgoing::from_packet(Packet::PingReq));
        o.take_into(&mut out, 4);
        assert_eq!((out.len(), o.len()), (4, 2), "filled up to the batch size");
        assert!(o.0.is_some());
        out.clear();
        o.take_into(&mut out, 4);
        assert_eq!((out.len(), o.len()), (2, 0));
        assert!(
            o.0.as_ref().is_some_and(|q| q.capacity() == 0),
            "drained: its buffer is given back, the box kept"
        );
        o.push_back(Outgoing::from_packet(Packet::PingResp));
        o.release();
        assert_eq!(o.len(), 1, "an outbox with items keeps them");
        o.take_into(&mut out, 10);
        o.release();
        assert!(o.0.is_none(), "parked: nothing held");
    }
}

//! What the core hands to the shell to write: control packets and
//! deliveries that reference a shared message.

use super::message::Message;
use std::sync::Arc;
use zerofan_codec::{Packet, PublishHeader, QoS};

/// One item for the connection's writer.
///
/// `Packet` is large (a `Properties` inline) but items live only briefly in
/// the outbox, and boxing would cost an allocation per acknowledgement.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Outgoing {
    /// A control packet to encode as-is.
    Packet(Packet),
    /// A PUBLISH of a shared message: the writer encodes only the small
    /// per-delivery header and sends the shared payload as its own iovec.
    Publish(Delivery),
}

/// The per-subscriber part of one PUBLISH.
#[derive(Debug)]
pub struct Delivery {
    /// The shared message (payload shared with every other subscriber).
    pub message: Arc<Message>,
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

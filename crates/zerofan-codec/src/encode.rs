//! Encoding packets straight into a `BufMut`.

use crate::error::EncodeError;
use crate::packet::{Packet, Protocol, QoS};
use crate::properties::Properties;
use bytes::BufMut;

/// Encode `packet` for a peer speaking `protocol` into `dst`.
pub fn encode(
    packet: &Packet,
    protocol: Protocol,
    dst: &mut impl BufMut,
) -> Result<(), EncodeError> {
    let _ = (packet, protocol, dst);
    todo!("codec helper")
}

/// The number of bytes [`encode`] would write, fixed header included; used
/// to honour a peer's Maximum Packet Size before encoding.
pub fn encoded_len(packet: &Packet, protocol: Protocol) -> Result<usize, EncodeError> {
    let _ = (packet, protocol);
    todo!("codec helper")
}

/// The per-delivery view of one shared PUBLISH: everything that differs
/// between subscribers (QoS, packet id, retain, topic alias, subscription
/// identifiers, remaining expiry) with the shared parts borrowed. The
/// broker keeps one message and writes one small header per subscriber.
#[derive(Clone, Copy, Debug)]
pub struct PublishHeader<'a> {
    /// DUP flag.
    pub dup: bool,
    /// QoS of this delivery.
    pub qos: QoS,
    /// RETAIN flag of this delivery.
    pub retain: bool,
    /// Packet identifier (ignored at QoS 0).
    pub packet_id: u16,
    /// Topic name to write; empty to rely on an already established alias.
    pub topic: &'a str,
    /// Topic alias to send (MQTT 5), if any.
    pub topic_alias: Option<u16>,
    /// The message's own properties. Its `topic_alias`,
    /// `subscription_identifiers` and `message_expiry_interval` are ignored in
    /// favour of the fields of this struct.
    pub properties: &'a Properties,
    /// Remaining Message Expiry Interval to send, if the message has one.
    pub message_expiry_interval: Option<u32>,
    /// Subscription identifiers of the matching subscriptions (MQTT 5).
    pub subscription_identifiers: &'a [u32],
    /// Length of the payload that will follow the header.
    pub payload_len: usize,
}

impl PublishHeader<'_> {
    /// Length of the whole packet (header plus payload) on the wire.
    pub fn packet_len(&self, protocol: Protocol) -> Result<usize, EncodeError> {
        let _ = protocol;
        todo!("codec helper")
    }
}

/// Write only the fixed header and variable header of a PUBLISH; the
/// `payload_len` bytes of payload are sent after it, as their own iovec.
pub fn encode_publish_header(
    header: &PublishHeader<'_>,
    protocol: Protocol,
    dst: &mut impl BufMut,
) -> Result<(), EncodeError> {
    let _ = (header, protocol, dst);
    todo!("codec helper")
}

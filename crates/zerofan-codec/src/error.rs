//! Decode and encode errors.

use crate::reason::ReasonCode;

/// Why a frame could not be decoded. Carries the MQTT 5 reason code the
/// receiver should send in its DISCONNECT (or CONNACK), and a short static
/// description for logs and the Reason String property.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} (reason code {:#04x})", reason.0)]
pub struct DecodeError {
    /// 0x81 malformed packet, 0x82 protocol error, 0x95 packet too large,
    /// 0x90 topic name invalid, 0x8F topic filter invalid, 0x84 unsupported
    /// protocol version, 0x94 topic alias invalid, ...
    pub reason: ReasonCode,
    /// What was wrong, for humans.
    pub what: &'static str,
}

impl DecodeError {
    /// A new error.
    pub const fn new(reason: ReasonCode, what: &'static str) -> Self {
        Self { reason, what }
    }
    /// 0x81 Malformed Packet.
    pub const fn malformed(what: &'static str) -> Self {
        Self::new(ReasonCode::MALFORMED_PACKET, what)
    }
    /// 0x82 Protocol Error.
    pub const fn protocol(what: &'static str) -> Self {
        Self::new(ReasonCode::PROTOCOL_ERROR, what)
    }
}

/// Why a packet could not be encoded (a value the wire format cannot carry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The packet would exceed 268,435,455 bytes of remaining length.
    #[error("packet too large for MQTT")]
    TooLarge,
    /// A field's value is not representable (e.g. QoS 0 with a packet id, a
    /// subscription identifier of 0, a binary field over 65,535 bytes).
    #[error("invalid field: {0}")]
    Invalid(&'static str),
    /// The packet does not exist in this protocol version (AUTH under 3.x).
    #[error("packet not available in this protocol version")]
    WrongProtocol,
}

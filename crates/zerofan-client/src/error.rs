//! Everything that can go wrong for a caller of the client.

use zerofan_codec::{DecodeError, EncodeError, ReasonCode};

/// Why a client operation failed. One enum for the whole crate so a caller
/// can match on the cause without knowing which layer (socket, TLS,
/// WebSocket, codec, broker) produced it.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket failed (connect refused, reset, ...).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The TLS configuration or handshake failed.
    #[error("tls: {0}")]
    Tls(String),
    /// The WebSocket upgrade or a WebSocket frame failed.
    #[error("websocket: {0}")]
    WebSocket(String),
    /// The broker refused the connection with this CONNACK reason code.
    #[error("connection refused by the broker: reason 0x{:02x}", .0 .0)]
    Refused(ReasonCode),
    /// The broker closed the connection with a DISCONNECT and this reason.
    #[error("disconnected by the broker: reason 0x{:02x}", .0 .0)]
    ServerDisconnect(ReasonCode),
    /// The broker broke the protocol (unexpected packet, bad topic alias...).
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// The broker sent something the codec refuses.
    #[error("broker sent a bad packet: {0}")]
    Decode(#[from] DecodeError),
    /// A packet could not be encoded (too large, bad property, ...).
    #[error("cannot encode packet: {0}")]
    Encode(#[from] EncodeError),
    /// A topic name or filter breaks the MQTT rules.
    #[error("invalid topic: {0}")]
    InvalidTopic(String),
    /// An expert-mode closure misused the frame buffer.
    #[error("bad payload: {0}")]
    Payload(&'static str),
    /// The packet is larger than the broker's Maximum Packet Size.
    #[error("packet of {size} bytes exceeds the broker's maximum packet size {max}")]
    PacketTooLarge {
        /// Size of the packet on the wire.
        size: usize,
        /// The limit the broker announced in CONNACK.
        max: u32,
    },
    /// The broker's Maximum QoS is lower than the QoS asked for.
    #[error("the broker does not support QoS {0}")]
    QosNotSupported(u8),
    /// A QoS 0 message was queued when the connection dropped; QoS 0 is
    /// never resent.
    #[error("connection lost before the QoS 0 message was written")]
    ConnectionLost,
    /// The broker did not answer in time (CONNACK, PINGRESP).
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// The client was shut down ([`crate::Client::disconnect`]) or its
    /// event loop ended.
    #[error("client closed")]
    Closed,
}

/// Shorthand for results of this crate.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

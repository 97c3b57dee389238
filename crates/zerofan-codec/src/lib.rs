//! zerofan-codec: a sans-IO, zero-copy codec for MQTT 3.1, 3.1.1 and 5.0.
//!
//! No sockets, no async, no clock: bytes in, packets out, and back.
//!
//! - [`framing`]: find packet boundaries in a partial buffer ([`frame`]),
//!   checking the remaining length and the maximum packet size before any
//!   body is buffered; Variable Byte Integer helpers.
//! - [`decode`](mod@decode): turn one complete frame (`Bytes`) into a [`Packet`] whose
//!   topic names and payloads are slices of that frame, never copies.
//! - [`encode`](mod@encode): write a [`Packet`] into any `BufMut`; for PUBLISH also
//!   [`encode_publish_header`], which writes only the fixed and variable
//!   header so a payload can travel as its own iovec.
//! - [`packet`], [`properties`] ([`Properties`], and [`Props`], the boxed
//!   form every packet holds), [`reason`], [`string`]: the data types;
//!   [`reason`] also maps MQTT 5 reason codes to 3.x CONNACK / SUBACK return
//!   codes ([`v3_connack_code`], [`v3_suback_code`]) and says which codes
//!   each packet type allows.
//! - [`topic`]: topic-name and topic-filter validation and matching.
//! - [`DecodeError`]: every malformed input, with the MQTT 5 reason code it
//!   deserves (the table is in the [`decode`](mod@decode) module documentation).
//!
//! Hot-path costs: framing and decoding a PUBLISH without properties
//! allocate nothing (the payload is the frame advanced past its headers, the
//! topic a slice of it, the properties a null [`Props`]); one with
//! properties (but no user properties or subscription identifiers) allocates
//! once, the box its [`Props`] points to. [`encode_publish_header`]
//! allocates nothing. `tests/alloc.rs` proves all three with a counting
//! allocator, and that a `Packet` stays at most 128 bytes.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod decode;
pub mod encode;
pub mod error;
pub mod framing;
pub mod packet;
pub mod properties;
pub mod reason;
pub mod string;
pub mod topic;
mod wire;

pub use decode::decode;
pub use encode::{encode, encode_publish_header, encoded_len, PublishHeader};
pub use error::{DecodeError, EncodeError};
pub use framing::{frame, Frame, MAX_REMAINING_LENGTH};
pub use packet::*;
pub use properties::{Properties, Props};
pub use reason::{connack_reason_from_v3, v3_connack_code, v3_suback_code, ReasonCode};
pub use string::{MqttStr, StrError};

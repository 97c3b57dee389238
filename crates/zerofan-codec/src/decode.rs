//! Decoding one complete frame into a [`Packet`], zero-copy.

use crate::error::DecodeError;
use crate::packet::{Packet, Protocol};
use bytes::Bytes;

/// Decode one complete packet. `frame` must be exactly the bytes that
/// [`crate::frame`] reported as `Complete(len)` (fixed header included).
///
/// `protocol` is the connection's version; a CONNECT is decoded by the
/// version it announces itself, whatever `protocol` says. Topic names,
/// payloads, binary data and strings in the result are slices of `frame`.
pub fn decode(frame: Bytes, protocol: Protocol) -> Result<Packet, DecodeError> {
    let _ = (frame, protocol);
    todo!("codec helper")
}

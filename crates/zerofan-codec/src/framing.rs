//! Incremental framing: where does the next packet end in a partial buffer?

use crate::error::DecodeError;

/// The answer of [`frame`] for the bytes received so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A whole packet of `len` bytes (fixed header included) starts the buffer.
    Complete(usize),
    /// At least this many more bytes are needed before the answer can change.
    NeedMore(usize),
    /// The stream is broken (bad remaining length, packet over the maximum
    /// size: 0x95, reserved packet type, ...); close the connection.
    Invalid(DecodeError),
}

/// Look at the start of `buf` and say whether a complete packet is there.
///
/// The remaining length is decoded and checked against `max_packet_size`
/// (the whole packet, fixed header included, as MQTT 5 counts it) as soon as
/// its bytes are in, so a peer announcing 268 MB is refused before a single
/// body byte is buffered. Reserved packet types and fixed-header flags the
/// spec fixes are checked here too.
pub fn frame(buf: &[u8], max_packet_size: u32) -> Frame {
    let _ = (buf, max_packet_size);
    todo!("codec helper")
}

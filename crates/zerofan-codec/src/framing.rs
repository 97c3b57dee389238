//! Incremental framing: where does the next packet end in a partial buffer?
//!
//! Also the Variable Byte Integer helpers (§1.5.5) the rest of the codec
//! uses: [`varint_len`], [`read_varint`], [`write_varint`].
//!
//! **Non-minimal remaining lengths are refused.** MQTT 5 \[MQTT-1.5.5-1\]
//! and 3.1.1 §2.2.3 require the minimum number of bytes; a Variable Byte
//! Integer whose last byte is `0x00` (for example `0x80 0x00` for 0) is
//! answered with 0x81 Malformed Packet. This keeps packet lengths computed
//! from values ([`crate::encoded_len`]) equal to lengths seen on the wire.

use crate::error::{DecodeError, EncodeError};
use bytes::BufMut;

/// The largest remaining length MQTT can express: 268,435,455 bytes.
pub const MAX_REMAINING_LENGTH: u32 = 268_435_455;

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
///
/// Pass `u32::MAX` for "no limit". What is checked (all 0x81 Malformed
/// Packet unless said otherwise):
/// - packet type 0 is reserved. Type 15 is accepted here (it is AUTH in
///   MQTT 5); [`crate::decode()`] refuses it under 3.x;
/// - the flags of PUBREL, SUBSCRIBE and UNSUBSCRIBE must be `0b0010` (or
///   `0b1010`, DUP set, which [`crate::decode()`] accepts under MQTT 3.1
///   only), those of every other type but PUBLISH `0`; a PUBLISH with QoS 3
///   is refused;
/// - the remaining length must fit in 4 bytes and be minimally encoded;
/// - the whole packet must not exceed `max_packet_size` (0x95 Packet Too Large).
pub fn frame(buf: &[u8], max_packet_size: u32) -> Frame {
    let Some((&first, rest)) = buf.split_first() else {
        return Frame::NeedMore(2);
    };
    if let Err(e) = check_first_byte(first) {
        return Frame::Invalid(e);
    }
    match read_varint(rest) {
        Err(e) => Frame::Invalid(e),
        Ok(None) => Frame::NeedMore(1),
        Ok(Some((remaining, n))) => {
            let total = 1 + n + remaining as usize;
            if total as u64 > u64::from(max_packet_size) {
                return Frame::Invalid(DecodeError::new(
                    crate::reason::ReasonCode::PACKET_TOO_LARGE,
                    "packet exceeds the maximum packet size",
                ));
            }
            if buf.len() >= total {
                Frame::Complete(total)
            } else {
                Frame::NeedMore(total - buf.len())
            }
        }
    }
}

/// Check the first byte of a fixed header: packet type and flags.
pub(crate) fn check_first_byte(b: u8) -> Result<(), DecodeError> {
    let flags = b & 0x0F;
    match b >> 4 {
        0 => Err(DecodeError::malformed("reserved packet type 0")),
        3 => {
            if flags & 0b0110 == 0b0110 {
                Err(DecodeError::malformed("PUBLISH with QoS 3"))
            } else {
                Ok(())
            }
        }
        6 | 8 | 10 => {
            // 0b1010 (DUP set) is valid in MQTT 3.1 only; framing does not
            // know the protocol, so `decode` refuses it for 3.1.1 and 5.
            if flags & 0b0111 == 0b0010 {
                Ok(())
            } else {
                Err(DecodeError::malformed(
                    "PUBREL/SUBSCRIBE/UNSUBSCRIBE fixed header flags must be 0b0010",
                ))
            }
        }
        _ => {
            if flags == 0 {
                Ok(())
            } else {
                Err(DecodeError::malformed("reserved fixed header flags set"))
            }
        }
    }
}

/// Parse a whole fixed header at the start of `buf`: `(first byte,
/// remaining length, header length)`. Incomplete headers are malformed.
pub(crate) fn parse_fixed_header(buf: &[u8]) -> Result<(u8, u32, usize), DecodeError> {
    let Some((&first, rest)) = buf.split_first() else {
        return Err(DecodeError::malformed("empty frame"));
    };
    check_first_byte(first)?;
    match read_varint(rest)? {
        Some((remaining, n)) => Ok((first, remaining, 1 + n)),
        None => Err(DecodeError::malformed("truncated remaining length")),
    }
}

/// Bytes a Variable Byte Integer takes: 1 to 4 (values over
/// [`MAX_REMAINING_LENGTH`] are not representable; 4 is returned for them
/// and [`write_varint`] refuses them).
pub const fn varint_len(v: u32) -> usize {
    if v < 0x80 {
        1
    } else if v < 0x4000 {
        2
    } else if v < 0x20_0000 {
        3
    } else {
        4
    }
}

/// Read a Variable Byte Integer at the start of `buf`.
///
/// `Ok(Some((value, bytes used)))`, `Ok(None)` when `buf` ends before the
/// last byte, `Err` (0x81) for a fifth byte or a non-minimal encoding.
pub fn read_varint(buf: &[u8]) -> Result<Option<(u32, usize)>, DecodeError> {
    let mut value: u32 = 0;
    for i in 0..4 {
        let Some(&b) = buf.get(i) else {
            return Ok(None);
        };
        value |= u32::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            if i > 0 && b == 0 {
                return Err(DecodeError::malformed(
                    "variable byte integer not minimally encoded",
                ));
            }
            return Ok(Some((value, i + 1)));
        }
    }
    Err(DecodeError::malformed(
        "variable byte integer longer than 4 bytes",
    ))
}

/// Write `v` as a Variable Byte Integer; `EncodeError::TooLarge` over
/// [`MAX_REMAINING_LENGTH`].
pub fn write_varint(v: u32, dst: &mut impl BufMut) -> Result<(), EncodeError> {
    if v > MAX_REMAINING_LENGTH {
        return Err(EncodeError::TooLarge);
    }
    let mut x = v;
    loop {
        let mut b = (x & 0x7F) as u8;
        x >>= 7;
        if x > 0 {
            b |= 0x80;
        }
        dst.put_u8(b);
        if x == 0 {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_boundaries() {
        for (v, n) in [
            (0u32, 1usize),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (2_097_151, 3),
            (2_097_152, 4),
            (MAX_REMAINING_LENGTH, 4),
        ] {
            let mut b = Vec::new();
            write_varint(v, &mut b).unwrap();
            assert_eq!(b.len(), n);
            assert_eq!(varint_len(v), n);
            assert_eq!(read_varint(&b).unwrap(), Some((v, n)));
            assert_eq!(read_varint(&b[..n - 1]).unwrap(), None);
        }
        assert_eq!(
            write_varint(MAX_REMAINING_LENGTH + 1, &mut Vec::new()),
            Err(EncodeError::TooLarge)
        );
        assert!(read_varint(&[0x80, 0x80, 0x80, 0x80, 0x01]).is_err());
        assert!(read_varint(&[0xff, 0x00]).is_err());
    }
}

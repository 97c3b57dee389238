//! The fixed 32-byte header that travels in front of every published
//! packet, so that a listener knows the format without a side channel and
//! can detect gaps (a jump in `seq`) and timing (the capture timestamp).
//!
//! Layout (all integers little-endian, every field naturally aligned, so the
//! samples that follow start 32-byte aligned in the pooled buffer):
//!
//! | offset | size | field                                        |
//! |-------:|-----:|----------------------------------------------|
//! |      0 |    4 | magic `b"ZFAU"`                              |
//! |      4 |    1 | version, [`HEADER_VERSION`] (1)              |
//! |      5 |    1 | format: 1 = i16 LE, 2 = f32 LE               |
//! |      6 |    2 | channels (u16)                               |
//! |      8 |    4 | sample rate in Hz (u32)                      |
//! |     12 |    4 | frames in this packet (u32)                  |
//! |     16 |    8 | seq (u64): packet index since capture start  |
//! |     24 |    8 | timestamp_ns (u64): capture time, first frame|
//!
//! `seq` counts every packet the device produced, dropped ones included, so
//! a missing number is a packet lost (locally, to a slow consumer, or on the
//! way). `frames` lets a listener check the payload length
//! (`frames * channels * bytes per sample`).

use crate::format::{PacketInfo, SampleFormat};

/// Length of the header in bytes.
pub const HEADER_LEN: usize = 32;
/// The first four bytes of every header.
pub const HEADER_MAGIC: [u8; 4] = *b"ZFAU";
/// The header version this crate writes and reads.
pub const HEADER_VERSION: u8 = 1;

/// Why [`decode_header`] or [`decode_packet`] refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer than [`HEADER_LEN`] bytes.
    #[error("packet too short for the audio header: {0} bytes")]
    TooShort(usize),
    /// The first four bytes are not [`HEADER_MAGIC`].
    #[error("not a zerofan audio packet (bad magic)")]
    BadMagic,
    /// A version this crate does not know.
    #[error("unsupported audio header version {0}")]
    UnsupportedVersion(u8),
    /// A format byte this crate does not know.
    #[error("unknown sample format code {0}")]
    UnknownFormat(u8),
    /// Zero channels or a zero sample rate.
    #[error("invalid stream parameters in header (channels {channels}, rate {rate})")]
    InvalidParameters {
        /// Channels field.
        channels: u16,
        /// Sample rate field.
        rate: u32,
    },
    /// The payload after the header is not `frames * channels * bytes`.
    #[error("payload is {actual} bytes, header says {expected}")]
    LengthMismatch {
        /// Bytes the header announces.
        expected: usize,
        /// Bytes present.
        actual: usize,
    },
}

/// Writes the header for `info` with `frames` frames into `out`.
///
/// `out` must be at least [`HEADER_LEN`] bytes; only the first
/// [`HEADER_LEN`] are written. Returns `false` (writing nothing) when it is
/// shorter, so a caller on the real-time thread never panics.
pub fn encode_header(info: &PacketInfo, frames: u32, out: &mut [u8]) -> bool {
    let Some(h) = out.get_mut(..HEADER_LEN) else {
        return false;
    };
    h[0..4].copy_from_slice(&HEADER_MAGIC);
    h[4] = HEADER_VERSION;
    h[5] = info.format.code();
    h[6..8].copy_from_slice(&info.channels.to_le_bytes());
    h[8..12].copy_from_slice(&info.sample_rate.to_le_bytes());
    h[12..16].copy_from_slice(&frames.to_le_bytes());
    h[16..24].copy_from_slice(&info.seq.to_le_bytes());
    h[24..32].copy_from_slice(&info.timestamp_ns.to_le_bytes());
    true
}

/// The header as an array (convenience around [`encode_header`]).
pub fn header_bytes(info: &PacketInfo, frames: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    encode_header(info, frames, &mut h);
    h
}

/// Reads the header at the start of `buf`: the packet's info and its frame
/// count. Does not look at what follows; see [`decode_packet`].
pub fn decode_header(buf: &[u8]) -> Result<(PacketInfo, u32), HeaderError> {
    let h: &[u8; HEADER_LEN] = buf
        .get(..HEADER_LEN)
        .and_then(|s| s.try_into().ok())
        .ok_or(HeaderError::TooShort(buf.len()))?;
    if h[0..4] != HEADER_MAGIC {
        return Err(HeaderError::BadMagic);
    }
    if h[4] != HEADER_VERSION {
        return Err(HeaderError::UnsupportedVersion(h[4]));
    }
    let format = SampleFormat::from_code(h[5]).ok_or(HeaderError::UnknownFormat(h[5]))?;
    let channels = u16::from_le_bytes([h[6], h[7]]);
    let sample_rate = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if channels == 0 || sample_rate == 0 {
        return Err(HeaderError::InvalidParameters {
            channels,
            rate: sample_rate,
        });
    }
    let frames = u32::from_le_bytes([h[12], h[13], h[14], h[15]]);
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&h[16..24]);
    let mut ts = [0u8; 8];
    ts.copy_from_slice(&h[24..32]);
    Ok((
        PacketInfo {
            seq: u64::from_le_bytes(seq),
            timestamp_ns: u64::from_le_bytes(ts),
            sample_rate,
            channels,
            format,
        },
        frames,
    ))
}

/// Reads a whole published packet: its info and its samples (the bytes
/// after the header), checking that their length matches the header.
pub fn decode_packet(buf: &[u8]) -> Result<(PacketInfo, &[u8]), HeaderError> {
    let (info, frames) = decode_header(buf)?;
    let samples = &buf[HEADER_LEN..];
    let expected = frames as usize * info.channels as usize * info.format.bytes_per_sample();
    if samples.len() != expected {
        return Err(HeaderError::LengthMismatch {
            expected,
            actual: samples.len(),
        });
    }
    Ok((info, samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> PacketInfo {
        PacketInfo {
            seq: 0x0102_0304_0506_0708,
            timestamp_ns: 123_456_789_012,
            sample_rate: 48_000,
            channels: 2,
            format: SampleFormat::F32,
        }
    }

    #[test]
    fn round_trip() {
        let h = header_bytes(&info(), 480);
        assert_eq!(&h[..4], b"ZFAU");
        assert_eq!(decode_header(&h), Ok((info(), 480)));
        let i16_info = PacketInfo {
            format: SampleFormat::I16,
            channels: 1,
            ..info()
        };
        assert_eq!(
            decode_header(&header_bytes(&i16_info, 0)),
            Ok((i16_info, 0))
        );
    }

    #[test]
    fn layout_is_fixed() {
        // A listener in another language relies on these offsets.
        let h = header_bytes(&info(), 480);
        assert_eq!(
            h,
            [
                b'Z', b'F', b'A', b'U', 1, 2, 2, 0, // magic, version, f32, 2 ch
                0x80, 0xBB, 0, 0, // 48000
                0xE0, 1, 0, 0, // 480 frames
                8, 7, 6, 5, 4, 3, 2, 1, // seq
                0x14, 0x1A, 0x99, 0xBE, 0x1C, 0, 0, 0, // 123456789012
            ]
        );
    }

    #[test]
    fn rejects_bad_input() {
        let good = header_bytes(&info(), 480);
        assert_eq!(decode_header(&good[..31]), Err(HeaderError::TooShort(31)));
        let mut b = good;
        b[0] = b'X';
        assert_eq!(decode_header(&b), Err(HeaderError::BadMagic));
        let mut b = good;
        b[4] = 9;
        assert_eq!(decode_header(&b), Err(HeaderError::UnsupportedVersion(9)));
        let mut b = good;
        b[5] = 7;
        assert_eq!(decode_header(&b), Err(HeaderError::UnknownFormat(7)));
        let mut b = good;
        b[6] = 0;
        b[7] = 0;
        assert!(matches!(
            decode_header(&b),
            Err(HeaderError::InvalidParameters { channels: 0, .. })
        ));
        assert!(!encode_header(&info(), 1, &mut [0u8; 10]));
    }

    #[test]
    fn packet_length_is_checked() {
        let mut p = header_bytes(&info(), 2).to_vec();
        p.extend_from_slice(&[0u8; 16]); // 2 frames * 2 ch * 4 bytes
        let (i, samples) = decode_packet(&p).expect("valid packet");
        assert_eq!((i, samples.len()), (info(), 16));
        p.push(0);
        assert_eq!(
            decode_packet(&p),
            Err(HeaderError::LengthMismatch {
                expected: 16,
                actual: 17
            })
        );
    }
}

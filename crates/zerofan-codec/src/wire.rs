//! Internal wire helpers: the zero-copy reader, the property id sets per
//! packet type, and the output abstraction the encoder uses to count
//! before it writes.

use crate::error::DecodeError;
use crate::framing::read_varint;
use crate::string::{MqttStr, StrError};
use bytes::{BufMut, Bytes};

/// Property identifiers (§2.2.2.2).
pub(crate) mod id {
    pub const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
    pub const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
    pub const CONTENT_TYPE: u8 = 0x03;
    pub const RESPONSE_TOPIC: u8 = 0x08;
    pub const CORRELATION_DATA: u8 = 0x09;
    pub const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
    pub const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
    pub const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
    pub const SERVER_KEEP_ALIVE: u8 = 0x13;
    pub const AUTHENTICATION_METHOD: u8 = 0x15;
    pub const AUTHENTICATION_DATA: u8 = 0x16;
    pub const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
    pub const WILL_DELAY_INTERVAL: u8 = 0x18;
    pub const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
    pub const RESPONSE_INFORMATION: u8 = 0x1A;
    pub const SERVER_REFERENCE: u8 = 0x1C;
    pub const REASON_STRING: u8 = 0x1F;
    pub const RECEIVE_MAXIMUM: u8 = 0x21;
    pub const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
    pub const TOPIC_ALIAS: u8 = 0x23;
    pub const MAXIMUM_QOS: u8 = 0x24;
    pub const RETAIN_AVAILABLE: u8 = 0x25;
    pub const USER_PROPERTY: u8 = 0x26;
    pub const MAXIMUM_PACKET_SIZE: u8 = 0x27;
    pub const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
    pub const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
    pub const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;
}

/// Which packet a property list belongs to; each allows its own set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ctx {
    Connect,
    Will,
    ConnAck,
    Publish,
    /// PUBACK, PUBREC, PUBREL, PUBCOMP.
    Ack,
    Subscribe,
    SubAck,
    Unsubscribe,
    UnsubAck,
    Disconnect,
    Auth,
}

const fn bits(ids: &[u8]) -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < ids.len() {
        m |= 1u64 << ids[i];
        i += 1;
    }
    m
}

impl Ctx {
    /// Bit `n` set when property id `n` is allowed.
    pub(crate) const fn allowed(self) -> u64 {
        use id::*;
        match self {
            Ctx::Connect => bits(&[
                SESSION_EXPIRY_INTERVAL,
                RECEIVE_MAXIMUM,
                MAXIMUM_PACKET_SIZE,
                TOPIC_ALIAS_MAXIMUM,
                REQUEST_RESPONSE_INFORMATION,
                REQUEST_PROBLEM_INFORMATION,
                USER_PROPERTY,
                AUTHENTICATION_METHOD,
                AUTHENTICATION_DATA,
            ]),
            Ctx::Will => bits(&[
                WILL_DELAY_INTERVAL,
                PAYLOAD_FORMAT_INDICATOR,
                MESSAGE_EXPIRY_INTERVAL,
                CONTENT_TYPE,
                RESPONSE_TOPIC,
                CORRELATION_DATA,
                USER_PROPERTY,
            ]),
            Ctx::ConnAck => bits(&[
                SESSION_EXPIRY_INTERVAL,
                RECEIVE_MAXIMUM,
                MAXIMUM_QOS,
                RETAIN_AVAILABLE,
                MAXIMUM_PACKET_SIZE,
                ASSIGNED_CLIENT_IDENTIFIER,
                TOPIC_ALIAS_MAXIMUM,
                REASON_STRING,
                USER_PROPERTY,
                WILDCARD_SUBSCRIPTION_AVAILABLE,
                SUBSCRIPTION_IDENTIFIER_AVAILABLE,
                SHARED_SUBSCRIPTION_AVAILABLE,
                SERVER_KEEP_ALIVE,
                RESPONSE_INFORMATION,
                SERVER_REFERENCE,
                AUTHENTICATION_METHOD,
                AUTHENTICATION_DATA,
            ]),
            Ctx::Publish => bits(&[
                PAYLOAD_FORMAT_INDICATOR,
                MESSAGE_EXPIRY_INTERVAL,
                TOPIC_ALIAS,
                RESPONSE_TOPIC,
                CORRELATION_DATA,
                USER_PROPERTY,
                SUBSCRIPTION_IDENTIFIER,
                CONTENT_TYPE,
            ]),
            Ctx::Ack | Ctx::SubAck | Ctx::UnsubAck => bits(&[REASON_STRING, USER_PROPERTY]),
            Ctx::Subscribe => bits(&[SUBSCRIPTION_IDENTIFIER, USER_PROPERTY]),
            Ctx::Unsubscribe => bits(&[USER_PROPERTY]),
            Ctx::Disconnect => bits(&[
                SESSION_EXPIRY_INTERVAL,
                REASON_STRING,
                USER_PROPERTY,
                SERVER_REFERENCE,
            ]),
            Ctx::Auth => bits(&[
                AUTHENTICATION_METHOD,
                AUTHENTICATION_DATA,
                REASON_STRING,
                USER_PROPERTY,
            ]),
        }
    }

    /// Is property `id` allowed here?
    #[inline]
    pub(crate) const fn allows(self, id: u8) -> bool {
        id < 64 && self.allowed() & (1u64 << id) != 0
    }
}

const EOF: DecodeError = DecodeError::malformed("packet ends before a field does");

/// A cursor over part of a frame; every slice it hands out shares `frame`.
pub(crate) struct Reader<'a> {
    frame: &'a Bytes,
    pos: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(frame: &'a Bytes, pos: usize, end: usize) -> Self {
        Self { frame, pos, end }
    }

    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.end.saturating_sub(self.pos)
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<(usize, usize), DecodeError> {
        if n > self.remaining() {
            return Err(EOF);
        }
        let start = self.pos;
        self.pos += n;
        Ok((start, self.pos))
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (s, e) = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(self.frame.get(s..e).ok_or(EOF)?);
        Ok(out)
    }

    #[inline]
    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    #[inline]
    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    #[inline]
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    /// A Variable Byte Integer (§1.5.5).
    pub(crate) fn varint(&mut self) -> Result<u32, DecodeError> {
        let avail = self.frame.get(self.pos..self.end).ok_or(EOF)?;
        match read_varint(avail)? {
            Some((v, n)) => {
                self.pos += n;
                Ok(v)
            }
            None => Err(EOF),
        }
    }

    /// `n` bytes as a slice of the frame (no copy).
    #[inline]
    pub(crate) fn bytes(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        let (s, e) = self.take(n)?;
        if s == e {
            return Ok(Bytes::new());
        }
        Ok(self.frame.slice(s..e))
    }

    /// Binary Data (§1.5.6): two-byte length, then the bytes.
    #[inline]
    pub(crate) fn binary(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u16()? as usize;
        self.bytes(n)
    }

    /// UTF-8 Encoded String (§1.5.4), validated: 0x81 when invalid.
    #[inline]
    pub(crate) fn string(&mut self) -> Result<MqttStr, DecodeError> {
        let n = self.u16()? as usize;
        let b = self.bytes(n)?;
        MqttStr::from_bytes(b).map_err(str_error)
    }

    /// A PUBLISH or will topic name: a valid MQTT string (0x81 otherwise)
    /// without `+` or `#` (0x90). May be empty; the caller decides.
    #[inline]
    pub(crate) fn topic_name(&mut self) -> Result<MqttStr, DecodeError> {
        let n = self.u16()? as usize;
        let (s, e) = self.take(n)?;
        let view = self.frame.get(s..e).ok_or(EOF)?;
        if !plain_topic(view) {
            crate::string::validate(view).map_err(str_error)?;
            if view.iter().any(|&c| c == b'+' || c == b'#') {
                return Err(DecodeError::new(
                    crate::reason::ReasonCode::TOPIC_NAME_INVALID,
                    "topic name contains a wildcard",
                ));
            }
        }
        if s == e {
            return Ok(MqttStr::new());
        }
        Ok(MqttStr::from_validated(self.frame.slice(s..e)))
    }

    /// Where the cursor is, as an offset into the frame.
    #[inline]
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// A reader over the next `n` bytes; `self` skips past them.
    pub(crate) fn sub(&mut self, n: usize) -> Result<Reader<'a>, DecodeError> {
        let (s, e) = self.take(n)?;
        Ok(Reader::new(self.frame, s, e))
    }
}

/// True when every byte is ASCII, not NUL and not a wildcard: then the
/// bytes are a valid MQTT string and a valid (possibly empty) topic name.
/// Branch-free over 16-byte chunks so it vectorises.
#[inline]
pub(crate) fn plain_topic(b: &[u8]) -> bool {
    #[inline(always)]
    fn odd(c: u8) -> u8 {
        u8::from(c.wrapping_sub(1) >= 0x7F) | u8::from(c == b'+') | u8::from(c == b'#')
    }
    let mut bad = 0u8;
    let mut chunks = b.chunks_exact(16);
    for chunk in &mut chunks {
        for &c in chunk {
            bad |= odd(c);
        }
    }
    // The tail, padded with a harmless byte, goes through the same
    // fixed-width loop.
    let rem = chunks.remainder();
    let mut last = [b'a'; 16];
    if let Some(dst) = last.get_mut(..rem.len()) {
        dst.copy_from_slice(rem);
    }
    for &c in &last {
        bad |= odd(c);
    }
    bad == 0
}

pub(crate) fn str_error(e: StrError) -> DecodeError {
    match e {
        StrError::InvalidUtf8 => DecodeError::malformed("string is not valid UTF-8"),
        StrError::NullChar => DecodeError::malformed("string contains U+0000"),
        StrError::TooLong => DecodeError::malformed("string longer than 65535 bytes"),
    }
}

/// Where the encoder's bytes go: a counter first, then the real buffer.
pub(crate) trait Out {
    fn u8(&mut self, v: u8);
    fn u16(&mut self, v: u16);
    fn u32(&mut self, v: u32);
    fn slice(&mut self, s: &[u8]);
    fn varint(&mut self, v: u32);
}

/// Counts bytes without writing them.
#[derive(Default)]
pub(crate) struct Counter(pub usize);

impl Out for Counter {
    #[inline]
    fn u8(&mut self, _: u8) {
        self.0 += 1;
    }
    #[inline]
    fn u16(&mut self, _: u16) {
        self.0 += 2;
    }
    #[inline]
    fn u32(&mut self, _: u32) {
        self.0 += 4;
    }
    #[inline]
    fn slice(&mut self, s: &[u8]) {
        self.0 += s.len();
    }
    #[inline]
    fn varint(&mut self, v: u32) {
        self.0 += crate::framing::varint_len(v);
    }
}

/// Writes into a `BufMut` whose capacity was checked beforehand. Small
/// writes gather in a stack buffer, flushed by slices too large for it and
/// on drop, so a packet costs a few `put_slice` calls, not one per field.
pub(crate) struct Writer<'a, B: BufMut> {
    dst: &'a mut B,
    buf: [u8; 64],
    len: usize,
}

impl<'a, B: BufMut> Writer<'a, B> {
    pub(crate) fn new(dst: &'a mut B) -> Self {
        Self {
            dst,
            buf: [0; 64],
            len: 0,
        }
    }

    #[inline]
    fn flush(&mut self) {
        if self.len > 0 {
            self.dst.put_slice(&self.buf[..self.len]);
            self.len = 0;
        }
    }

    #[inline]
    fn small(&mut self, s: &[u8]) {
        if self.len + s.len() > self.buf.len() {
            self.flush();
        }
        if let Some(dst) = self.buf.get_mut(self.len..self.len + s.len()) {
            dst.copy_from_slice(s);
            self.len += s.len();
        }
    }
}

impl<B: BufMut> Drop for Writer<'_, B> {
    fn drop(&mut self) {
        self.flush();
    }
}

impl<B: BufMut> Out for Writer<'_, B> {
    #[inline]
    fn u8(&mut self, v: u8) {
        self.small(&[v]);
    }
    #[inline]
    fn u16(&mut self, v: u16) {
        self.small(&v.to_be_bytes());
    }
    #[inline]
    fn u32(&mut self, v: u32) {
        self.small(&v.to_be_bytes());
    }
    #[inline]
    fn slice(&mut self, s: &[u8]) {
        if s.len() <= 16 {
            self.small(s);
        } else {
            self.flush();
            self.dst.put_slice(s);
        }
    }
    #[inline]
    fn varint(&mut self, v: u32) {
        let mut b = [0u8; 4];
        let n = varint_into(v, &mut b);
        self.small(&b[..n]);
    }
}

/// Write `v` (at most [`crate::framing::MAX_REMAINING_LENGTH`], checked by
/// the caller; larger values are truncated to 4 bytes) into `out`, returning
/// the number of bytes used.
#[inline]
pub(crate) fn varint_into(v: u32, out: &mut [u8; 4]) -> usize {
    let mut x = v;
    let mut i = 0;
    loop {
        let mut b = (x & 0x7F) as u8;
        x >>= 7;
        if x > 0 && i < 3 {
            b |= 0x80;
        }
        out[i] = b;
        i += 1;
        if x == 0 || i == 4 {
            return i;
        }
    }
}

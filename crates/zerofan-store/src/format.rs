//! The on-disk format: the manifest, the log header, record frames and
//! record bodies. Everything is little-endian.
//!
//! ```text
//! data dir/
//!   MANIFEST            "zerofan-store format=4 generation=7\n" (replaced atomically)
//!   log-000007.zlog     the live log; older generations are deleted
//!   CLOCK               "zerofan-store clock=1764460800000\n": UNIX ms a run may
//!                       have counted to, saved every second (see `clock`)
//!
//! log    = header frame*
//! header = "ZFSTORE\0" (8) | format version u32 | reserved u32 (0) | generation u64
//!          | snapshot length u64                                              (32 bytes)
//! frame  = length u32 (bit 31: last frame of a commit) | CRC-32 (IEEE) of the
//!          length field and the body u32 | body
//! body   = kind u8 | fields (see [`Record`])
//! ```
//!
//! A frame is valid when its length fits in the file and its checksum
//! matches. Recovery replays valid frames commit by commit: the frames of a
//! commit are applied only once the frame marked "last of a commit" is read,
//! so a commit is all or nothing. Recovery cuts the file after the last
//! complete commit, at the first invalid frame or a commit left unfinished (a
//! torn or corrupt tail). Frames are self-contained and
//! position-independent, so compaction copies live ones verbatim into the
//! next generation's log: the first `snapshot length` bytes after the header
//! of a compacted log are that copy, applied frame by frame (the log was
//! fsynced whole before the manifest named it).

use crate::types::{MessageProperties, StoredMessage, SubOptions};
use bytes::Bytes;
use std::borrow::Cow;

/// The format this build writes and the newest it reads. Version 2 added
/// the `Epoch` record, version 3 a version after its epoch, version 4 the
/// armed `Will` record (kind 18); the layout is otherwise version 1's,
/// and this build still reads versions 1 to 3 (an `Epoch` record without
/// a version has version 0) and marks the store as 4 when it opens it.
/// The version rises with each new field because an older decoder takes
/// what it does not know for a damaged tail and cuts the log there: an
/// older build must refuse a newer store rather than silently drop
/// everything after the first new record.
pub(crate) const FORMAT_VERSION: u32 = 4;
/// First bytes of every log file.
pub(crate) const MAGIC: &[u8; 8] = b"ZFSTORE\0";
/// Size of the log header.
pub(crate) const HEADER_LEN: u64 = 32;
/// Where the format version lies in the log header.
pub(crate) const HEADER_VERSION_AT: u64 = 8;
/// Bit 31 of a frame's length field: the last frame of a commit.
pub(crate) const COMMIT_END: u32 = 1 << 31;
/// Size of a frame's length and checksum.
pub(crate) const FRAME_HEADER: usize = 8;
/// Largest body accepted (a PUBLISH is at most 256 MiB; leave room).
pub(crate) const MAX_BODY: usize = 300 << 20;
/// The manifest file name.
pub(crate) const MANIFEST: &str = "MANIFEST";

/// The file name of the log of `generation`.
pub(crate) fn log_name(generation: u64) -> String {
    format!("log-{generation:06}.zlog")
}

/// The generation of a log file name, if it is one.
pub(crate) fn parse_log_name(name: &str) -> Option<u64> {
    name.strip_prefix("log-")?
        .strip_suffix(".zlog")?
        .parse()
        .ok()
}

/// The log header for `generation`, whose first `snapshot_len` bytes after
/// the header are a compacted snapshot.
pub(crate) fn header(generation: u64, snapshot_len: u64) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&generation.to_le_bytes());
    h[24..32].copy_from_slice(&snapshot_len.to_le_bytes());
    h
}

/// What a log header says: the format version, and the snapshot length
/// (meaningful only for a version this build reads).
pub(crate) fn parse_header(data: &[u8]) -> Result<(u32, u64), &'static str> {
    if data.get(..8) != Some(MAGIC.as_slice()) {
        return Err("log file does not start with the zerofan store magic");
    }
    let mut v = [0u8; 4];
    v.copy_from_slice(data.get(8..12).ok_or("log file shorter than its header")?);
    let mut n = [0u8; 8];
    n.copy_from_slice(data.get(24..32).ok_or("log file shorter than its header")?);
    Ok((u32::from_le_bytes(v), u64::from_le_bytes(n)))
}

/// The manifest's text for `generation`.
pub(crate) fn manifest_text(generation: u64) -> String {
    format!("zerofan-store format={FORMAT_VERSION} generation={generation}\n")
}

/// What a manifest says: (format version, generation). The version is read
/// first and on its own, so a newer layout is still reported as newer.
pub(crate) fn parse_manifest(text: &str) -> Result<(u32, Option<u64>), &'static str> {
    let mut words = text.split_whitespace();
    if words.next() != Some("zerofan-store") {
        return Err("MANIFEST does not start with \"zerofan-store\"");
    }
    let mut version = None;
    let mut generation = None;
    for w in words {
        if let Some(v) = w.strip_prefix("format=") {
            version = v.parse::<u32>().ok();
        } else if let Some(g) = w.strip_prefix("generation=") {
            generation = g.parse::<u64>().ok();
        }
    }
    match version {
        Some(v) => Ok((v, generation)),
        None => Err("MANIFEST has no readable format=N"),
    }
}

/// Record kinds (the first byte of a body).
mod kind {
    pub const MESSAGE: u8 = 1;
    pub const RETAIN: u8 = 2;
    pub const UNRETAIN: u8 = 3;
    pub const SESSION: u8 = 4;
    pub const DROP_SESSION: u8 = 5;
    pub const SUBSCRIBE: u8 = 6;
    pub const UNSUBSCRIBE: u8 = 7;
    pub const ENQUEUE: u8 = 8;
    pub const DEQUEUE: u8 = 9;
    pub const SEND: u8 = 10;
    pub const PUBREC: u8 = 11;
    pub const COMPLETE: u8 = 12;
    pub const QOS2_IN: u8 = 13;
    pub const QOS2_DONE: u8 = 14;
    pub const WILL: u8 = 15;
    pub const CLEAR_WILL: u8 = 16;
    pub const EPOCH: u8 = 17;
    pub const ARMED_WILL: u8 = 18;
}

/// One record: a change to the stored state. Sessions are named by a small
/// numeric key (assigned by the `Session` record) so per-message records stay
/// small. Field layouts (after the kind byte; `str16` = u16 length + bytes,
/// `msg` = the message fields below):
///
/// | kind | record | fields |
/// | --- | --- | --- |
/// | 1 | `Message` | id u64, msg |
/// | 2 | `Retain` | msg id u64, topic str16 |
/// | 3 | `Unretain` | topic str16 |
/// | 4 | `Session` | key u32, expiry interval u32, has deadline u8, [deadline ms u64], client id str16 |
/// | 5 | `DropSession` | key u32 |
/// | 6 | `Subscribe` | key u32, options u8, has id u8, [id u32], filter str16 |
/// | 7 | `Unsubscribe` | key u32, filter str16 |
/// | 8 | `Enqueue` | key u32, entry u64, msg id u64, flags u8 (bits 0-1 qos, 2 retain, 3 has share), n u16, n × sub id u32, [share str16] |
/// | 9 | `Dequeue` | key u32, entry u64 |
/// | 10 | `Send` | key u32, entry u64, packet id u16 (queue entry → inflight, PUBLISH sent) |
/// | 11 | `Pubrec` | key u32, packet id u16 (inflight → PUBREC received; creates it if absent) |
/// | 12 | `Complete` | key u32, packet id u16 (inflight done: PUBACK, PUBCOMP, or abandoned) |
/// | 13 | `Qos2In` | key u32, packet id u16 |
/// | 14 | `Qos2Done` | key u32, packet id u16 |
/// | 15 | `Will` | key u32, due ms u64, has expiry u8, [expiry u32], msg |
/// | 16 | `ClearWill` | key u32 |
/// | 17 | `Epoch` | key u32, epoch u64 (format 2), version u64 (format 3) |
/// | 18 | `Will`, armed (format 4) | key u32, delay u32, has expiry u8, [expiry u32], msg |
///
/// Message fields: flags u8 (bits 0-1 qos, 2 retain, 3 has expiry, 4 payload
/// format indicator, 5 content type, 6 response topic, 7 correlation data),
/// [expires at ms u64], [pfi u8], [content type str16], [response topic
/// str16], [correlation data str16], n user properties u16, n × (str16,
/// str16), topic str16, payload length u32, payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    Message {
        id: u64,
        msg: MsgBody<'a>,
    },
    Retain {
        msg: u64,
        topic: &'a [u8],
    },
    Unretain {
        topic: &'a [u8],
    },
    Session {
        key: u32,
        expiry_interval: u32,
        expires_at_ms: Option<u64>,
        client: &'a [u8],
    },
    DropSession {
        key: u32,
    },
    Subscribe {
        key: u32,
        options: u8,
        id: Option<u32>,
        filter: &'a [u8],
    },
    Unsubscribe {
        key: u32,
        filter: &'a [u8],
    },
    Enqueue {
        key: u32,
        entry: u64,
        msg: u64,
        flags: u8,
        sub_ids: Cow<'a, [u32]>,
        share: Option<&'a [u8]>,
    },
    Dequeue {
        key: u32,
        entry: u64,
    },
    Send {
        key: u32,
        entry: u64,
        pid: u16,
    },
    Pubrec {
        key: u32,
        pid: u16,
    },
    Complete {
        key: u32,
        pid: u16,
    },
    Qos2In {
        key: u32,
        pid: u16,
    },
    Qos2Done {
        key: u32,
        pid: u16,
    },
    Will {
        key: u32,
        due_ms: u64,
        /// Armed: its client is connected, and this is its Will Delay
        /// Interval in seconds (`due_ms` is then 0 and not used).
        armed: Option<u32>,
        expiry: Option<u32>,
        msg: MsgBody<'a>,
    },
    ClearWill {
        key: u32,
    },
    Epoch {
        key: u32,
        epoch: u64,
        version: u64,
    },
}

/// The message fields of a `Message` or `Will` record: a message to encode,
/// or the raw encoded fields of a decoded record (parsed only when needed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MsgBody<'a> {
    /// To encode.
    Msg(&'a StoredMessage),
    /// As decoded: already checked by [`parse_message`].
    Raw(&'a [u8]),
}

/// Start a frame in `buf`; returns where it starts, for [`finish_frame`].
pub(crate) fn begin_frame(buf: &mut Vec<u8>) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER]);
    start
}

/// Fill in the length and checksum of the frame started at `start` (the
/// last frame in `buf`); `end` marks it as the last frame of a commit.
pub(crate) fn finish_frame(buf: &mut [u8], start: usize, end: bool) -> Result<(), &'static str> {
    let body_len = buf.len() - start - FRAME_HEADER;
    if body_len > MAX_BODY {
        return Err("record larger than the store's limit");
    }
    let field = (body_len as u32) | if end { COMMIT_END } else { 0 };
    buf[start..start + 4].copy_from_slice(&field.to_le_bytes());
    let crc = frame_crc(field, &buf[start + FRAME_HEADER..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn frame_crc(field: u32, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&field.to_le_bytes());
    h.update(body);
    h.finalize()
}

/// What is at `data[pos..]`: a valid frame's body and total length, or why
/// not.
pub(crate) enum Frame<'a> {
    /// A frame whose checksum matches; `end` when it closes a commit.
    Valid {
        body: &'a [u8],
        len: usize,
        end: bool,
    },
    /// Fewer bytes than the frame claims (a torn write).
    Torn,
    /// The checksum does not match (or the length is absurd).
    Corrupt,
}

/// Read the frame at `data[pos..]`.
pub(crate) fn read_frame(data: &[u8], pos: usize) -> Frame<'_> {
    let rest = data.get(pos..).unwrap_or_default();
    if rest.len() < FRAME_HEADER {
        return Frame::Torn;
    }
    let field = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
    let len = (field & !COMMIT_END) as usize;
    let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
    if len == 0 || len > MAX_BODY {
        return Frame::Corrupt;
    }
    let Some(body) = rest.get(FRAME_HEADER..FRAME_HEADER + len) else {
        return Frame::Torn;
    };
    if frame_crc(field, body) != crc {
        return Frame::Corrupt;
    }
    Frame::Valid {
        body,
        len: FRAME_HEADER + len,
        end: field & COMMIT_END != 0,
    }
}

/// Mark the frame at `buf[start..]` (the last one in `buf`) as the end of a
/// commit.
pub(crate) fn mark_commit_end(buf: &mut [u8], start: usize) {
    // Cannot fail: the frame was finished (and its size checked) before.
    let _ = finish_frame(buf, start, true);
}

/// Append `rec` as one frame to `buf`. On error `buf` is left unchanged.
pub(crate) fn encode(rec: &Record<'_>, buf: &mut Vec<u8>) -> Result<(), &'static str> {
    let start = begin_frame(buf);
    let r = encode_body(rec, buf).and_then(|()| finish_frame(buf, start, false));
    if r.is_err() {
        buf.truncate(start);
    }
    r
}

fn encode_body(rec: &Record<'_>, b: &mut Vec<u8>) -> Result<(), &'static str> {
    match rec {
        Record::Message { id, msg } => {
            b.push(kind::MESSAGE);
            put_u64(b, *id);
            put_msg(b, msg)?;
        }
        Record::Retain { msg, topic } => {
            b.push(kind::RETAIN);
            put_u64(b, *msg);
            put_str16(b, topic)?;
        }
        Record::Unretain { topic } => {
            b.push(kind::UNRETAIN);
            put_str16(b, topic)?;
        }
        Record::Session {
            key,
            expiry_interval,
            expires_at_ms,
            client,
        } => {
            b.push(kind::SESSION);
            put_u32(b, *key);
            put_u32(b, *expiry_interval);
            put_opt_u64(b, *expires_at_ms);
            put_str16(b, client)?;
        }
        Record::DropSession { key } => {
            b.push(kind::DROP_SESSION);
            put_u32(b, *key);
        }
        Record::Subscribe {
            key,
            options,
            id,
            filter,
        } => {
            b.push(kind::SUBSCRIBE);
            put_u32(b, *key);
            b.push(*options);
            put_opt_u32(b, *id);
            put_str16(b, filter)?;
        }
        Record::Unsubscribe { key, filter } => {
            b.push(kind::UNSUBSCRIBE);
            put_u32(b, *key);
            put_str16(b, filter)?;
        }
        Record::Enqueue {
            key,
            entry,
            msg,
            flags,
            sub_ids,
            share,
        } => {
            b.push(kind::ENQUEUE);
            put_u32(b, *key);
            put_u64(b, *entry);
            put_u64(b, *msg);
            b.push((flags & 0b111) | if share.is_some() { 8 } else { 0 });
            let n = u16::try_from(sub_ids.len()).map_err(|_| "too many subscription ids")?;
            put_u16(b, n);
            for id in sub_ids.iter() {
                put_u32(b, *id);
            }
            if let Some(s) = share {
                put_str16(b, s)?;
            }
        }
        Record::Dequeue { key, entry } => {
            b.push(kind::DEQUEUE);
            put_u32(b, *key);
            put_u64(b, *entry);
        }
        Record::Send { key, entry, pid } => {
            b.push(kind::SEND);
            put_u32(b, *key);
            put_u64(b, *entry);
            put_u16(b, *pid);
        }
        Record::Pubrec { key, pid } => key_pid(b, kind::PUBREC, *key, *pid),
        Record::Complete { key, pid } => key_pid(b, kind::COMPLETE, *key, *pid),
        Record::Qos2In { key, pid } => key_pid(b, kind::QOS2_IN, *key, *pid),
        Record::Qos2Done { key, pid } => key_pid(b, kind::QOS2_DONE, *key, *pid),
        Record::Will {
            key,
            due_ms,
            armed,
            expiry,
            msg,
        } => {
            match armed {
                Some(delay) => {
                    b.push(kind::ARMED_WILL);
                    put_u32(b, *key);
                    put_u32(b, *delay);
                }
                None => {
                    b.push(kind::WILL);
                    put_u32(b, *key);
                    put_u64(b, *due_ms);
                }
            }
            put_opt_u32(b, *expiry);
            put_msg(b, msg)?;
        }
        Record::ClearWill { key } => {
            b.push(kind::CLEAR_WILL);
            put_u32(b, *key);
        }
        Record::Epoch {
            key,
            epoch,
            version,
        } => {
            b.push(kind::EPOCH);
            put_u32(b, *key);
            put_u64(b, *epoch);
            put_u64(b, *version);
        }
    }
    Ok(())
}

fn key_pid(b: &mut Vec<u8>, kind: u8, key: u32, pid: u16) {
    b.push(kind);
    put_u32(b, key);
    put_u16(b, pid);
}

fn put_u16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_opt_u32(b: &mut Vec<u8>, v: Option<u32>) {
    b.push(u8::from(v.is_some()));
    if let Some(v) = v {
        put_u32(b, v);
    }
}
fn put_opt_u64(b: &mut Vec<u8>, v: Option<u64>) {
    b.push(u8::from(v.is_some()));
    if let Some(v) = v {
        put_u64(b, v);
    }
}
fn put_str16(b: &mut Vec<u8>, s: &[u8]) -> Result<(), &'static str> {
    let n = u16::try_from(s.len()).map_err(|_| "string longer than 65,535 bytes")?;
    put_u16(b, n);
    b.extend_from_slice(s);
    Ok(())
}

fn put_msg(b: &mut Vec<u8>, msg: &MsgBody<'_>) -> Result<(), &'static str> {
    let m = match msg {
        MsgBody::Raw(raw) => {
            b.extend_from_slice(raw);
            return Ok(());
        }
        MsgBody::Msg(m) => m,
    };
    if m.qos > 2 {
        return Err("QoS above 2");
    }
    let p = &m.properties;
    let flags = m.qos
        | (u8::from(m.retain) << 2)
        | (u8::from(m.expires_at_ms.is_some()) << 3)
        | (u8::from(p.payload_format_indicator.is_some()) << 4)
        | (u8::from(p.content_type.is_some()) << 5)
        | (u8::from(p.response_topic.is_some()) << 6)
        | (u8::from(p.correlation_data.is_some()) << 7);
    b.push(flags);
    if let Some(t) = m.expires_at_ms {
        put_u64(b, t);
    }
    if let Some(v) = p.payload_format_indicator {
        b.push(v);
    }
    for s in [&p.content_type, &p.response_topic, &p.correlation_data]
        .into_iter()
        .flatten()
    {
        put_str16(b, s)?;
    }
    let n = u16::try_from(p.user_properties.len()).map_err(|_| "too many user properties")?;
    put_u16(b, n);
    for (k, v) in &p.user_properties {
        put_str16(b, k)?;
        put_str16(b, v)?;
    }
    put_str16(b, &m.topic)?;
    let n = u32::try_from(m.payload.len()).map_err(|_| "payload too large")?;
    put_u32(b, n);
    b.extend_from_slice(&m.payload);
    Ok(())
}

/// A bounds-checked reader: every getter fails instead of panicking, so a
/// damaged body can only be refused.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

type Bad = &'static str;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        let end = self.pos.checked_add(n).ok_or("length overflow")?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or("record shorter than its fields")?;
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, Bad> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, Bad> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, Bad> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, Bad> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn flag(&mut self) -> Result<bool, Bad> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err("bad flag byte"),
        }
    }
    fn opt_u32(&mut self) -> Result<Option<u32>, Bad> {
        Ok(if self.flag()? {
            Some(self.u32()?)
        } else {
            None
        })
    }
    fn opt_u64(&mut self) -> Result<Option<u64>, Bad> {
        Ok(if self.flag()? {
            Some(self.u64()?)
        } else {
            None
        })
    }
    fn str16(&mut self) -> Result<&'a [u8], Bad> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
    fn rest(&mut self) -> &'a [u8] {
        let s = self.buf.get(self.pos..).unwrap_or_default();
        self.pos = self.buf.len();
        s
    }
    fn end(&self) -> Result<(), Bad> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err("trailing bytes in record")
        }
    }
}

/// Decode a frame body. Message fields are checked here (so a `Raw` body
/// always parses later) but not copied.
pub(crate) fn decode(body: &[u8]) -> Result<Record<'_>, Bad> {
    let mut r = Reader { buf: body, pos: 0 };
    let k = r.u8()?;
    let rec = match k {
        kind::MESSAGE => {
            let id = r.u64()?;
            let raw = r.rest();
            parse_message(raw)?;
            Record::Message {
                id,
                msg: MsgBody::Raw(raw),
            }
        }
        kind::RETAIN => Record::Retain {
            msg: r.u64()?,
            topic: r.str16()?,
        },
        kind::UNRETAIN => Record::Unretain { topic: r.str16()? },
        kind::SESSION => Record::Session {
            key: r.u32()?,
            expiry_interval: r.u32()?,
            expires_at_ms: r.opt_u64()?,
            client: r.str16()?,
        },
        kind::DROP_SESSION => Record::DropSession { key: r.u32()? },
        kind::SUBSCRIBE => Record::Subscribe {
            key: r.u32()?,
            options: r.u8()?,
            id: r.opt_u32()?,
            filter: r.str16()?,
        },
        kind::UNSUBSCRIBE => Record::Unsubscribe {
            key: r.u32()?,
            filter: r.str16()?,
        },
        kind::ENQUEUE => {
            let key = r.u32()?;
            let entry = r.u64()?;
            let msg = r.u64()?;
            let flags = r.u8()?;
            if flags & 3 == 3 || flags & !0b1111 != 0 {
                return Err("bad queue entry flags");
            }
            let n = r.u16()?;
            let mut sub_ids = Vec::with_capacity(usize::from(n).min(64));
            for _ in 0..n {
                sub_ids.push(r.u32()?);
            }
            let share = if flags & 8 != 0 {
                Some(r.str16()?)
            } else {
                None
            };
            Record::Enqueue {
                key,
                entry,
                msg,
                flags: flags & 0b111,
                sub_ids: Cow::Owned(sub_ids),
                share,
            }
        }
        kind::DEQUEUE => Record::Dequeue {
            key: r.u32()?,
            entry: r.u64()?,
        },
        kind::SEND => Record::Send {
            key: r.u32()?,
            entry: r.u64()?,
            pid: r.u16()?,
        },
        kind::PUBREC => Record::Pubrec {
            key: r.u32()?,
            pid: r.u16()?,
        },
        kind::COMPLETE => Record::Complete {
            key: r.u32()?,
            pid: r.u16()?,
        },
        kind::QOS2_IN => Record::Qos2In {
            key: r.u32()?,
            pid: r.u16()?,
        },
        kind::QOS2_DONE => Record::Qos2Done {
            key: r.u32()?,
            pid: r.u16()?,
        },
        kind::WILL | kind::ARMED_WILL => {
            let key = r.u32()?;
            let (due_ms, armed) = if k == kind::WILL {
                (r.u64()?, None)
            } else {
                (0, Some(r.u32()?))
            };
            let expiry = r.opt_u32()?;
            let raw = r.rest();
            parse_message(raw)?;
            Record::Will {
                key,
                due_ms,
                armed,
                expiry,
                msg: MsgBody::Raw(raw),
            }
        }
        kind::CLEAR_WILL => Record::ClearWill { key: r.u32()? },
        kind::EPOCH => Record::Epoch {
            key: r.u32()?,
            epoch: r.u64()?,
            // Format 2 wrote none.
            version: if r.pos < r.buf.len() { r.u64()? } else { 0 },
        },
        _ => return Err("unknown record kind"),
    };
    r.end()?;
    Ok(rec)
}

/// Where each field of encoded message fields lies (ranges into the raw
/// slice), so a message can be materialized as slices of one allocation.
struct MessageLayout {
    qos: u8,
    retain: bool,
    expires_at_ms: Option<u64>,
    pfi: Option<u8>,
    content_type: Option<(usize, usize)>,
    response_topic: Option<(usize, usize)>,
    correlation: Option<(usize, usize)>,
    user: Vec<((usize, usize), (usize, usize))>,
    topic: (usize, usize),
    payload: (usize, usize),
}

fn parse_message(raw: &[u8]) -> Result<MessageLayout, Bad> {
    let mut r = Reader { buf: raw, pos: 0 };
    let flags = r.u8()?;
    let qos = flags & 3;
    if qos == 3 {
        return Err("bad QoS");
    }
    let expires_at_ms = if flags & 8 != 0 { Some(r.u64()?) } else { None };
    let pfi = if flags & 16 != 0 { Some(r.u8()?) } else { None };
    let range = |r: &mut Reader<'_>| -> Result<(usize, usize), Bad> {
        let s = r.str16()?;
        Ok((r.pos - s.len(), r.pos))
    };
    let content_type = if flags & 32 != 0 {
        Some(range(&mut r)?)
    } else {
        None
    };
    let response_topic = if flags & 64 != 0 {
        Some(range(&mut r)?)
    } else {
        None
    };
    let correlation = if flags & 128 != 0 {
        Some(range(&mut r)?)
    } else {
        None
    };
    let n = r.u16()?;
    let mut user = Vec::new();
    for _ in 0..n {
        let k = range(&mut r)?;
        let v = range(&mut r)?;
        user.push((k, v));
    }
    let topic = range(&mut r)?;
    let len = r.u32()? as usize;
    let start = r.pos;
    r.take(len)?;
    r.end()?;
    Ok(MessageLayout {
        qos,
        retain: flags & 4 != 0,
        expires_at_ms,
        pfi,
        content_type,
        response_topic,
        correlation,
        user,
        topic,
        payload: (start, start + len),
    })
}

/// Turn checked raw message fields into a message whose topic, payload and
/// properties are all slices of one allocation: `raw` is copied once.
pub(crate) fn materialize_message(raw: &[u8]) -> Result<StoredMessage, Bad> {
    let l = parse_message(raw)?;
    let all = Bytes::copy_from_slice(raw);
    let s = |(a, b): (usize, usize)| all.slice(a..b);
    Ok(StoredMessage {
        topic: s(l.topic),
        payload: s(l.payload),
        qos: l.qos,
        retain: l.retain,
        expires_at_ms: l.expires_at_ms,
        properties: MessageProperties {
            payload_format_indicator: l.pfi,
            content_type: l.content_type.map(s),
            response_topic: l.response_topic.map(s),
            correlation_data: l.correlation.map(s),
            user_properties: l.user.into_iter().map(|(k, v)| (s(k), s(v))).collect(),
        },
    })
}

/// The options byte is stored as-is; check it when decoding a subscription.
pub(crate) fn sub_options(b: u8) -> SubOptions {
    SubOptions::from_byte(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: deterministic noise without a dependency.
    fn rng(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    #[test]
    fn decoding_arbitrary_bodies_never_panics() {
        let mut s = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..200_000 {
            let len = (rng(&mut s) % 64) as usize;
            let mut body: Vec<u8> = (0..len).map(|_| rng(&mut s) as u8).collect();
            if let Some(k) = body.first_mut() {
                *k %= 19; // mostly real kinds
            }
            let _ = decode(&body);
            let _ = materialize_message(&body);
            let _ = read_frame(&body, (rng(&mut s) % 70) as usize);
        }
    }

    #[test]
    fn every_record_kind_encodes_and_decodes() {
        let m = StoredMessage {
            topic: Bytes::from_static(b"t"),
            payload: Bytes::from_static(b"p"),
            qos: 2,
            ..Default::default()
        };
        let recs = [
            Record::Message {
                id: 1,
                msg: MsgBody::Msg(&m),
            },
            Record::Retain {
                msg: 1,
                topic: b"t",
            },
            Record::Unretain { topic: b"t" },
            Record::Session {
                key: 1,
                expiry_interval: 5,
                expires_at_ms: Some(9),
                client: b"c",
            },
            Record::DropSession { key: 1 },
            Record::Subscribe {
                key: 1,
                options: 0x2d,
                id: Some(3),
                filter: b"a/#",
            },
            Record::Unsubscribe {
                key: 1,
                filter: b"a/#",
            },
            Record::Enqueue {
                key: 1,
                entry: 2,
                msg: 1,
                flags: 5,
                sub_ids: Cow::Owned(vec![1, 2]),
                share: Some(b"$share/g/a"),
            },
            Record::Dequeue { key: 1, entry: 2 },
            Record::Send {
                key: 1,
                entry: 2,
                pid: 3,
            },
            Record::Pubrec { key: 1, pid: 3 },
            Record::Complete { key: 1, pid: 3 },
            Record::Qos2In { key: 1, pid: 4 },
            Record::Qos2Done { key: 1, pid: 4 },
            Record::Will {
                key: 1,
                due_ms: 7,
                armed: None,
                expiry: None,
                msg: MsgBody::Msg(&m),
            },
            Record::Will {
                key: 1,
                due_ms: 0,
                armed: Some(30),
                expiry: Some(9),
                msg: MsgBody::Msg(&m),
            },
            Record::ClearWill { key: 1 },
            Record::Epoch {
                key: 1,
                epoch: u64::MAX - 3,
                version: u64::MAX - 4,
            },
        ];
        for rec in &recs {
            let mut buf = Vec::new();
            encode(rec, &mut buf).unwrap();
            let Frame::Valid { body, len, end } = read_frame(&buf, 0) else {
                panic!("invalid frame for {rec:?}");
            };
            assert_eq!(len, buf.len());
            assert!(!end);
            let back = decode(body).unwrap();
            match (rec, &back) {
                (Record::Message { id: a, .. }, Record::Message { id: b, msg }) => {
                    assert_eq!(a, b);
                    let MsgBody::Raw(raw) = msg else { panic!() };
                    assert_eq!(materialize_message(raw).unwrap(), m);
                }
                (
                    Record::Will {
                        due_ms,
                        armed,
                        expiry,
                        ..
                    },
                    Record::Will {
                        msg,
                        due_ms: d,
                        armed: a,
                        expiry: e,
                        ..
                    },
                ) => {
                    assert_eq!((due_ms, armed, expiry), (d, a, e));
                    let MsgBody::Raw(raw) = msg else { panic!() };
                    assert_eq!(materialize_message(raw).unwrap(), m);
                }
                _ => assert_eq!(rec, &back),
            }
            mark_commit_end(&mut buf, 0);
            assert!(matches!(
                read_frame(&buf, 0),
                Frame::Valid { end: true, .. }
            ));
        }
    }

    /// Format 2 wrote an `Epoch` without a version: read as version 0.
    #[test]
    fn a_format_2_epoch_has_version_0() {
        let mut body = vec![kind::EPOCH];
        body.extend_from_slice(&7u32.to_le_bytes());
        body.extend_from_slice(&5u64.to_le_bytes());
        let want = Record::Epoch {
            key: 7,
            epoch: 5,
            version: 0,
        };
        assert_eq!(decode(&body), Ok(want));
        body.extend_from_slice(&[1, 2, 3]);
        assert!(decode(&body).is_err(), "a short version is damage");
    }
}

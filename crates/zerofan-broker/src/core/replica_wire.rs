//! The wire form of [`ReplOp`]s (inside a `Replicate` frame of
//! `peer_wire`). Headers go into small buffers; each payload is a chunk of
//! its own (vectored write) and decodes as a slice of the read buffer.
//! Deadlines travel as UNIX milliseconds, as the store keeps them.

use super::peer_wire::WireError;
use super::replica::ReplOp;
use super::strand::{Mark, MarksRead};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::sync::Arc;
use zerofan_store::{
    EntryId, MessageProperties, MsgId, QueueEntry, SessionMeta, StoredMessage, StoredWill,
    SubOptions,
};

const SESSION: u8 = 1;
const RESET: u8 = 2;
const DROP: u8 = 3;
const SUBSCRIBE: u8 = 4;
const UNSUBSCRIBE: u8 = 5;
const MESSAGE: u8 = 6;
const ENQUEUE: u8 = 7;
const DEQUEUE: u8 = 8;
const SEND: u8 = 9;
const PUBREC: u8 = 10;
const COMPLETE: u8 = 11;
const QOS2_RECEIVED: u8 = 12;
const QOS2_RELEASED: u8 = 13;
const SET_WILL: u8 = 14;
const CLEAR_WILL: u8 = 15;
/// Added with ownership epochs (see `replica::fence`); an older build
/// refuses the frame ("unknown replica operation") rather than apply
/// unfenced changes.
const EPOCH: u8 = 16;
const FORGET_OWNER: u8 = 17;
/// A will whose client is still connected (link format 8).
const ARMED_WILL: u8 = 18;
/// A part of a batch too large for one frame (link format 9).
const PART: u8 = 19;
/// Room reserved per operation: an enqueue of a 23-byte client id, or a
/// message's header with a short topic, fits.
const OP_HEAD: usize = 64;

/// Encode `ops` as chunks appended to `parts`: headers built in `buf`,
/// payloads as their own `Bytes`.
pub(crate) fn encode(ops: &[ReplOp], parts: &mut Vec<Bytes>) -> Result<(), WireError> {
    // Sized for the batch up front: grown from empty, a batch of a full
    // window of deliveries reallocated (and copied) its headers again and
    // again. Headers split off for payloads share this allocation.
    let mut buf = BytesMut::with_capacity(4 + ops.len() * OP_HEAD);
    let n = u32::try_from(ops.len()).map_err(|_| WireError("too many operations"))?;
    buf.put_u32(n);
    for op in ops {
        match op {
            ReplOp::Session { client, meta } | ReplOp::Reset { client, meta, .. } => {
                let tag = if matches!(op, ReplOp::Reset { .. }) {
                    RESET
                } else {
                    SESSION
                };
                buf.put_u8(tag);
                put_str(&mut buf, client)?;
                buf.put_u32(meta.expiry_interval);
                put_opt_u64(&mut buf, meta.expires_at_ms);
                if let ReplOp::Reset { read, .. } = op {
                    put_marks_read(&mut buf, read.as_ref())?;
                }
            }
            ReplOp::Drop { client } => {
                buf.put_u8(DROP);
                put_str(&mut buf, client)?;
            }
            ReplOp::Subscribe {
                client,
                filter,
                options,
                id,
            } => {
                buf.put_u8(SUBSCRIBE);
                put_str(&mut buf, client)?;
                put_str(&mut buf, filter)?;
                buf.put_u8(options.to_byte());
                match id {
                    Some(i) => {
                        buf.put_u8(1);
                        buf.put_u32(*i);
                    }
                    None => buf.put_u8(0),
                }
            }
            ReplOp::Unsubscribe { client, filter } => {
                buf.put_u8(UNSUBSCRIBE);
                put_str(&mut buf, client)?;
                put_str(&mut buf, filter)?;
            }
            ReplOp::Message { id, msg, mark } => {
                buf.put_u8(MESSAGE);
                buf.put_u64(id.0);
                match mark {
                    Some(m) => {
                        buf.put_u8(1);
                        buf.put_u64(m.node());
                        buf.put_u64(m.seq());
                    }
                    None => buf.put_u8(0),
                }
                put_message(&mut buf, parts, msg)?;
            }
            ReplOp::Enqueue {
                client,
                entry,
                item,
            } => {
                buf.put_u8(ENQUEUE);
                put_str(&mut buf, client)?;
                buf.put_u64(entry.0);
                buf.put_u64(item.msg.0);
                buf.put_u8(item.qos);
                buf.put_u8(u8::from(item.retain));
                let n = u16::try_from(item.subscription_ids.len())
                    .map_err(|_| WireError("too many subscription ids"))?;
                buf.put_u16(n);
                for i in &item.subscription_ids {
                    buf.put_u32(*i);
                }
                match &item.share {
                    Some(s) => {
                        buf.put_u8(1);
                        put_str(&mut buf, s)?;
                    }
                    None => buf.put_u8(0),
                }
            }
            ReplOp::Dequeue { client, entry } => {
                buf.put_u8(DEQUEUE);
                put_str(&mut buf, client)?;
                buf.put_u64(entry.0);
            }
            ReplOp::Send { client, entry, pid } => {
                buf.put_u8(SEND);
                put_str(&mut buf, client)?;
                buf.put_u64(entry.0);
                buf.put_u16(*pid);
            }
            ReplOp::PubRec { client, pid }
            | ReplOp::Complete { client, pid }
            | ReplOp::Qos2Received { client, pid }
            | ReplOp::Qos2Released { client, pid } => {
                buf.put_u8(match op {
                    ReplOp::PubRec { .. } => PUBREC,
                    ReplOp::Complete { .. } => COMPLETE,
                    ReplOp::Qos2Received { .. } => QOS2_RECEIVED,
                    _ => QOS2_RELEASED,
                });
                put_str(&mut buf, client)?;
                buf.put_u16(*pid);
            }
            ReplOp::SetWill { client, will } => {
                match will.armed {
                    Some(delay) => {
                        buf.put_u8(ARMED_WILL);
                        put_str(&mut buf, client)?;
                        buf.put_u32(delay);
                    }
                    None => {
                        buf.put_u8(SET_WILL);
                        put_str(&mut buf, client)?;
                        buf.put_u64(will.due_at_ms);
                    }
                }
                match will.message_expiry_interval {
                    Some(i) => {
                        buf.put_u8(1);
                        buf.put_u32(i);
                    }
                    None => buf.put_u8(0),
                }
                put_message(&mut buf, parts, &will.message)?;
            }
            ReplOp::ClearWill { client } => {
                buf.put_u8(CLEAR_WILL);
                put_str(&mut buf, client)?;
            }
            ReplOp::Epoch {
                client,
                epoch,
                version,
            } => {
                buf.put_u8(EPOCH);
                put_str(&mut buf, client)?;
                buf.put_u64(*epoch);
                buf.put_u64(*version);
            }
            ReplOp::ForgetOwner => buf.put_u8(FORGET_OWNER),
            ReplOp::Part { index, last } => {
                buf.put_u8(PART);
                buf.put_u32(*index);
                buf.put_u8(u8::from(*last));
            }
        }
    }
    if !buf.is_empty() {
        parts.push(buf.freeze());
    }
    Ok(())
}

/// The message's fields, then its payload as a chunk of its own.
fn put_message(
    buf: &mut BytesMut,
    parts: &mut Vec<Bytes>,
    m: &StoredMessage,
) -> Result<(), WireError> {
    put_bytes16(buf, &m.topic)?;
    buf.put_u8(m.qos);
    buf.put_u8(u8::from(m.retain));
    put_opt_u64(buf, m.expires_at_ms);
    let p = &m.properties;
    match p.payload_format_indicator {
        Some(v) => {
            buf.put_u8(1);
            buf.put_u8(v);
        }
        None => buf.put_u8(0),
    }
    for b in [&p.content_type, &p.response_topic, &p.correlation_data] {
        match b {
            Some(b) => {
                buf.put_u8(1);
                put_bytes16(buf, b)?;
            }
            None => buf.put_u8(0),
        }
    }
    let n = u16::try_from(p.user_properties.len())
        .map_err(|_| WireError("too many user properties"))?;
    buf.put_u16(n);
    for (k, v) in &p.user_properties {
        put_bytes16(buf, k)?;
        put_bytes16(buf, v)?;
    }
    let len = u32::try_from(m.payload.len()).map_err(|_| WireError("payload too large"))?;
    buf.put_u32(len);
    if !m.payload.is_empty() {
        parts.push(buf.split().freeze());
        parts.push(m.payload.clone());
    }
    Ok(())
}

fn put_str(buf: &mut BytesMut, s: &str) -> Result<(), WireError> {
    put_bytes16(buf, s.as_bytes())
}

fn put_bytes16(buf: &mut BytesMut, b: &[u8]) -> Result<(), WireError> {
    let n = u16::try_from(b.len()).map_err(|_| WireError("string too long"))?;
    buf.put_u16(n);
    buf.put_slice(b);
    Ok(())
}

/// A full image's marks read: a flag, then a count and the pairs.
fn put_marks_read(buf: &mut BytesMut, read: Option<&MarksRead>) -> Result<(), WireError> {
    let Some(read) = read else {
        buf.put_u8(0);
        return Ok(());
    };
    let read = read.as_slice();
    let n = u16::try_from(read.len()).map_err(|_| WireError("too many nodes' marks"))?;
    buf.put_u8(1);
    buf.put_u16(n);
    for &(node, seq) in read {
        buf.put_u64(node);
        buf.put_u64(seq);
    }
    Ok(())
}

fn put_opt_u64(buf: &mut BytesMut, v: Option<u64>) {
    match v {
        Some(v) => {
            buf.put_u8(1);
            buf.put_u64(v);
        }
        None => buf.put_u8(0),
    }
}

/// The client ids (and epochs) of a `ReplicaStale` frame.
pub(crate) fn encode_stale(
    clients: &[(Box<str>, u64)],
    buf: &mut BytesMut,
) -> Result<(), WireError> {
    let n = u32::try_from(clients.len()).map_err(|_| WireError("too many client ids"))?;
    buf.put_u32(n);
    for (c, e) in clients {
        put_str(buf, c)?;
        buf.put_u64(*e);
    }
    Ok(())
}

/// Decode what [`encode_stale`] wrote (the rest of `f`).
pub(crate) fn decode_stale(f: &mut Bytes) -> Result<Vec<(Box<str>, u64)>, WireError> {
    let n = get_u32(f)?;
    // Each takes at least 10 bytes: a count past that is a lie.
    if usize::try_from(n).unwrap_or(usize::MAX) > f.remaining() / 10 + 1 {
        return Err(WireError("bad client id count"));
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        out.push((get_str(f)?, get_u64(f)?));
    }
    Ok(out)
}

/// Decode the operations of a `Replicate` frame (the rest of `f`).
pub(crate) fn decode(f: &mut Bytes) -> Result<Vec<ReplOp>, WireError> {
    let n = get_u32(f)?;
    // Each operation takes at least 3 bytes: a count past that is a lie.
    if usize::try_from(n).unwrap_or(usize::MAX) > f.remaining() / 3 + 1 {
        return Err(WireError("bad operation count"));
    }
    let mut ops = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let tag = get_u8(f)?;
        let op = match tag {
            SESSION | RESET => {
                let client = get_str(f)?;
                let meta = SessionMeta {
                    expiry_interval: get_u32(f)?,
                    expires_at_ms: get_opt_u64(f)?,
                };
                if tag == RESET {
                    let read = match get_u8(f)? {
                        0 => None,
                        _ => {
                            let n = usize::from(get_u16(f)?);
                            need(f, n * 16)?;
                            let pairs = (0..n).map(|_| (f.get_u64(), f.get_u64())).collect();
                            Some(MarksRead::new(pairs))
                        }
                    };
                    ReplOp::Reset { client, meta, read }
                } else {
                    ReplOp::Session { client, meta }
                }
            }
            DROP => ReplOp::Drop {
                client: get_str(f)?,
            },
            SUBSCRIBE => {
                let client = get_str(f)?;
                let filter = get_str(f)?;
                let options = SubOptions::from_byte(get_u8(f)?);
                let id = match get_u8(f)? {
                    0 => None,
                    _ => Some(get_u32(f)?),
                };
                ReplOp::Subscribe {
                    client,
                    filter,
                    options,
                    id,
                }
            }
            UNSUBSCRIBE => ReplOp::Unsubscribe {
                client: get_str(f)?,
                filter: get_str(f)?,
            },
            MESSAGE => {
                let id = MsgId(get_u64(f)?);
                let mark = match get_u8(f)? {
                    0 => None,
                    _ => Some(Mark::new(get_u64(f)?, get_u64(f)?)),
                };
                let msg = Arc::new(get_message(f)?);
                ReplOp::Message { id, msg, mark }
            }
            ENQUEUE => {
                let client = get_str(f)?;
                let entry = EntryId(get_u64(f)?);
                let msg = MsgId(get_u64(f)?);
                let qos = get_u8(f)?;
                let retain = get_u8(f)? != 0;
                let k = get_u16(f)?;
                let mut subscription_ids = Vec::with_capacity(usize::from(k).min(64));
                for _ in 0..k {
                    subscription_ids.push(get_u32(f)?);
                }
                let share = match get_u8(f)? {
                    0 => None,
                    _ => Some(get_str(f)?.into_string()),
                };
                ReplOp::Enqueue {
                    client,
                    entry,
                    item: QueueEntry {
                        msg,
                        qos,
                        retain,
                        subscription_ids,
                        share,
                    },
                }
            }
            DEQUEUE => ReplOp::Dequeue {
                client: get_str(f)?,
                entry: EntryId(get_u64(f)?),
            },
            SEND => ReplOp::Send {
                client: get_str(f)?,
                entry: EntryId(get_u64(f)?),
                pid: get_u16(f)?,
            },
            PUBREC | COMPLETE | QOS2_RECEIVED | QOS2_RELEASED => {
                let client = get_str(f)?;
                let pid = get_u16(f)?;
                match tag {
                    PUBREC => ReplOp::PubRec { client, pid },
                    COMPLETE => ReplOp::Complete { client, pid },
                    QOS2_RECEIVED => ReplOp::Qos2Received { client, pid },
                    _ => ReplOp::Qos2Released { client, pid },
                }
            }
            EPOCH => ReplOp::Epoch {
                client: get_str(f)?,
                epoch: get_u64(f)?,
                version: get_u64(f)?,
            },
            FORGET_OWNER => ReplOp::ForgetOwner,
            PART => ReplOp::Part {
                index: get_u32(f)?,
                last: get_u8(f)? != 0,
            },
            SET_WILL | ARMED_WILL => {
                let client = get_str(f)?;
                let (due_at_ms, armed) = if tag == SET_WILL {
                    (get_u64(f)?, None)
                } else {
                    (0, Some(get_u32(f)?))
                };
                let message_expiry_interval = match get_u8(f)? {
                    0 => None,
                    _ => Some(get_u32(f)?),
                };
                let message = get_message(f)?;
                ReplOp::SetWill {
                    client,
                    will: Box::new(StoredWill {
                        message,
                        due_at_ms,
                        armed,
                        message_expiry_interval,
                    }),
                }
            }
            CLEAR_WILL => ReplOp::ClearWill {
                client: get_str(f)?,
            },
            _ => return Err(WireError("unknown replica operation")),
        };
        ops.push(op);
    }
    Ok(ops)
}

fn get_message(f: &mut Bytes) -> Result<StoredMessage, WireError> {
    let topic = get_bytes16(f)?;
    let qos = get_u8(f)?;
    let retain = get_u8(f)? != 0;
    let expires_at_ms = get_opt_u64(f)?;
    let payload_format_indicator = match get_u8(f)? {
        0 => None,
        _ => Some(get_u8(f)?),
    };
    let opt = |f: &mut Bytes| -> Result<Option<Bytes>, WireError> {
        Ok(match get_u8(f)? {
            0 => None,
            _ => Some(get_bytes16(f)?),
        })
    };
    let content_type = opt(f)?;
    let response_topic = opt(f)?;
    let correlation_data = opt(f)?;
    let k = get_u16(f)?;
    let mut user_properties = Vec::with_capacity(usize::from(k).min(64));
    for _ in 0..k {
        user_properties.push((get_bytes16(f)?, get_bytes16(f)?));
    }
    let len = get_u32(f)? as usize;
    if f.remaining() < len {
        return Err(WireError("truncated frame"));
    }
    // A slice of the read buffer: no copy.
    let payload = f.split_to(len);
    Ok(StoredMessage {
        topic,
        payload,
        qos,
        retain,
        expires_at_ms,
        properties: MessageProperties {
            payload_format_indicator,
            content_type,
            response_topic,
            correlation_data,
            user_properties,
        },
    })
}

fn need(f: &Bytes, n: usize) -> Result<(), WireError> {
    if f.remaining() < n {
        Err(WireError("truncated frame"))
    } else {
        Ok(())
    }
}

fn get_u8(f: &mut Bytes) -> Result<u8, WireError> {
    need(f, 1)?;
    Ok(f.get_u8())
}

fn get_u16(f: &mut Bytes) -> Result<u16, WireError> {
    need(f, 2)?;
    Ok(f.get_u16())
}

fn get_u32(f: &mut Bytes) -> Result<u32, WireError> {
    need(f, 4)?;
    Ok(f.get_u32())
}

fn get_u64(f: &mut Bytes) -> Result<u64, WireError> {
    need(f, 8)?;
    Ok(f.get_u64())
}

fn get_opt_u64(f: &mut Bytes) -> Result<Option<u64>, WireError> {
    Ok(match get_u8(f)? {
        0 => None,
        _ => Some(get_u64(f)?),
    })
}

fn get_bytes16(f: &mut Bytes) -> Result<Bytes, WireError> {
    let n = usize::from(get_u16(f)?);
    need(f, n)?;
    Ok(f.split_to(n))
}

/// Copied out of the frame (as `Box<str>`) without first making a
/// `Bytes` of it: that took and gave back a reference to the read buffer,
/// two atomic operations for each of the four client ids a message's
/// operations carry.
fn get_str(f: &mut Bytes) -> Result<Box<str>, WireError> {
    let n = usize::from(get_u16(f)?);
    need(f, n)?;
    let s: Box<str> = std::str::from_utf8(&f[..n])
        .map_err(|_| WireError("invalid string"))?
        .into();
    f.advance(n);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::super::peer::PeerEvent;
    use super::super::peer_wire::{FrameDecoder, FrameEncoder, LinkFrame};
    use super::*;
    use std::time::Instant;

    fn msg(payload: &'static [u8]) -> StoredMessage {
        StoredMessage {
            topic: Bytes::from_static(b"t/1"),
            payload: Bytes::from_static(payload),
            qos: 2,
            retain: true,
            expires_at_ms: Some(77),
            properties: MessageProperties {
                payload_format_indicator: Some(1),
                content_type: Some(Bytes::from_static(b"text/plain")),
                response_topic: None,
                correlation_data: Some(Bytes::from_static(b"\x00\x01")),
                user_properties: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
            },
        }
    }

    fn every_op() -> Vec<ReplOp> {
        let c: Box<str> = "client".into();
        let meta = SessionMeta {
            expiry_interval: 60,
            expires_at_ms: Some(5),
        };
        vec![
            ReplOp::Reset {
                client: c.clone(),
                meta,
                read: Some(MarksRead::new(vec![(1, 7), (3, u64::MAX)])),
            },
            ReplOp::Reset {
                client: c.clone(),
                meta,
                read: None,
            },
            ReplOp::Session {
                client: c.clone(),
                meta: SessionMeta::default(),
            },
            ReplOp::Subscribe {
                client: c.clone(),
                filter: "a/#".into(),
                options: SubOptions::from_byte(0x1a),
                id: Some(9),
            },
            ReplOp::Unsubscribe {
                client: c.clone(),
                filter: "b".into(),
            },
            ReplOp::Message {
                id: MsgId(3),
                msg: Arc::new(msg(b"payload bytes")),
                mark: Some(Mark::new(2, 1 << 60)),
            },
            ReplOp::Enqueue {
                client: c.clone(),
                entry: EntryId(4),
                item: QueueEntry {
                    msg: MsgId(3),
                    qos: 1,
                    retain: false,
                    subscription_ids: vec![1, 2],
                    share: Some("$share/g/a".into()),
                },
            },
            ReplOp::Dequeue {
                client: c.clone(),
                entry: EntryId(4),
            },
            ReplOp::Send {
                client: c.clone(),
                entry: EntryId(5),
                pid: 6,
            },
            ReplOp::PubRec {
                client: c.clone(),
                pid: 6,
            },
            ReplOp::Complete {
                client: c.clone(),
                pid: 6,
            },
            ReplOp::Qos2Received {
                client: c.clone(),
                pid: 8,
            },
            ReplOp::Qos2Released {
                client: c.clone(),
                pid: 8,
            },
            ReplOp::SetWill {
                client: c.clone(),
                will: Box::new(StoredWill {
                    message: msg(b"gone"),
                    due_at_ms: 99,
                    armed: None,
                    message_expiry_interval: Some(10),
                }),
            },
            ReplOp::SetWill {
                client: c.clone(),
                will: Box::new(StoredWill {
                    message: msg(b"armed"),
                    due_at_ms: 0,
                    armed: Some(30),
                    message_expiry_interval: None,
                }),
            },
            ReplOp::ClearWill { client: c.clone() },
            ReplOp::Epoch {
                client: c.clone(),
                epoch: u64::MAX - 1,
                version: 7,
            },
            ReplOp::ForgetOwner,
            ReplOp::Part {
                index: 3,
                last: true,
            },
            ReplOp::Drop { client: c },
        ]
    }

    #[test]
    fn every_operation_crosses_whole_and_payloads_are_not_copied() {
        let now = Instant::now();
        let ops = every_op();
        let ev = PeerEvent::Replicate {
            seq: 42,
            ops: ops.clone().into(),
        };
        let f = FrameEncoder::default().encode(&ev, now).unwrap();
        // The payloads are chunks of their own: the publisher's Bytes.
        assert!(f.chunks.iter().any(|c| &c[..] == b"payload bytes"));
        let mut buf = BytesMut::new();
        for c in &f.chunks {
            buf.extend_from_slice(c);
        }
        let range = buf.as_ptr_range();
        let got = FrameDecoder::default().decode(&mut buf, now).unwrap();
        let Some(LinkFrame::Event(PeerEvent::Replicate { seq, ops: back })) = got else {
            panic!("not a Replicate frame");
        };
        assert_eq!(seq, 42);
        let back = back.into_ops();
        assert_eq!(back, ops);
        let Some(ReplOp::Message { msg, .. }) =
            back.iter().find(|op| matches!(op, ReplOp::Message { .. }))
        else {
            panic!("no message");
        };
        // Decoded in place: the payload lies in the read buffer.
        assert!(range.contains(&msg.payload.as_ptr()));

        let ack = FrameEncoder::default()
            .encode(&PeerEvent::ReplicaAck { seq: 7 }, now)
            .unwrap();
        let mut buf = BytesMut::new();
        for c in &ack.chunks {
            buf.extend_from_slice(c);
        }
        assert!(matches!(
            FrameDecoder::default().decode(&mut buf, now),
            Ok(Some(LinkFrame::Event(PeerEvent::ReplicaAck { seq: 7 })))
        ));
        let clients: Vec<(Box<str>, u64)> = vec![("a".into(), 3), ("b".into(), u64::MAX)];
        let stale = PeerEvent::ReplicaStale {
            clients: clients.clone(),
        };
        let f = FrameEncoder::default().encode(&stale, now).unwrap();
        let mut buf = BytesMut::new();
        for c in &f.chunks {
            buf.extend_from_slice(c);
        }
        let got = FrameDecoder::default().decode(&mut buf, now).unwrap();
        let Some(LinkFrame::Event(PeerEvent::ReplicaStale { clients: back })) = got else {
            panic!("not a ReplicaStale frame");
        };
        assert_eq!(back, clients);
    }

    #[test]
    fn truncated_or_lying_frames_are_errors() {
        let mut parts = Vec::new();
        encode(&every_op(), &mut parts).unwrap();
        let whole: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        for cut in 0..whole.len() {
            let mut f = Bytes::copy_from_slice(&whole[..cut]);
            assert!(decode(&mut f).is_err(), "cut at {cut}");
        }
        let mut f = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 1]);
        assert!(decode(&mut f).is_err());
    }
}

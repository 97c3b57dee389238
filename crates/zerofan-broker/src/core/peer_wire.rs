//! The wire form of [`PeerEvent`]s, for peers behind a socket (the nodes
//! of a cluster).
//!
//! One frame per event: `len: u32 BE` (what follows), `version: u8`,
//! `kind: u8`, then the kind's fields. A message travels as an embedded
//! MQTT 5 PUBLISH packet at the end of its frame, so the codec that checks
//! client input checks this too, and its topic, properties and payload
//! decode as slices of the read buffer (no copy). Encoding writes only the
//! headers into a scratch buffer; the payload `Bytes` follows as its own
//! chunk, for a vectored write.
//!
//! What is not carried: a message's place in a store, its packet as
//! received, and the peer it first came from (a node's peer ids are its
//! own). Expiry travels as the milliseconds left, so the clocks of the two
//! nodes need not agree.

use super::ids::SessionId;
use super::message::Message;
use super::peer::{PeerEvent, PeerId, Stranded};
use super::strand::Mark;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerofan_codec::{MqttStr, Packet, Protocol, PublishHeader, QoS};
use zerofan_store::MsgId;

/// The format version this build writes and reads; a frame of another is
/// refused, so nodes of different formats fail at their first frame
/// instead of misreading each other. 2: a publish's flags may carry a
/// stranded message's mark, and so may a replicated message. 3: a
/// replicated full image says how far its owner had read other nodes'
/// marks. 4: `Refused`, a fence's negative answer. 5: a relayed message
/// carries its mark, a forwarded publish its sender's store id, and
/// `NoCopy` answers `CopyWanted`. 6: a replicated batch names its
/// session's version, and `CopyWanted` the asker's. 7: `Flushed` may name
/// the move's new owner. 8: a replicated will may be armed (its client
/// still connected to the owner). 9: a replicated batch too large for
/// one frame comes in parts (`ReplOp::Part`).
pub const VERSION: u8 = 9;
/// The largest frame accepted: an MQTT packet of the largest size, with
/// room for the shared group names and fields around it.
pub const MAX_FRAME: usize = zerofan_codec::MAX_REMAINING_LENGTH as usize + 5 + 1024 * 1024;
/// Bytes before a frame's body (the length).
const LEN: usize = 4;

const INTEREST: u8 = 1;
const PUBLISH: u8 = 2;
const HOLD: u8 = 3;
const RETAIN: u8 = 4;
const SEEN: u8 = 5;
const SYNC: u8 = 6;
const ASK: u8 = 7;
const SYNCED: u8 = 8;
const HELLO: u8 = 9;
const RESUME: u8 = 10;
const START: u8 = 11;
const ACK: u8 = 12;
const FENCE: u8 = 13;
const CONSUMED: u8 = 14;
const REPLICATE: u8 = 15;
const REPLICA_ACK: u8 = 16;
const REPLICA_STALE: u8 = 17;
const HANDOVER: u8 = 18;
const COPY_WANTED: u8 = 19;
const RELAYING: u8 = 20;
const RELAYED: u8 = 21;
const RELAY_DONE: u8 = 22;
const MOVED: u8 = 23;
const FLUSHED: u8 = 24;
const STRANDED: u8 = 25;
const REFUSED: u8 = 26;
const NO_COPY: u8 = 27;

/// What one frame holds.
// Nearly every frame is an `Event`: boxing it to shrink the rare others
// would allocate once per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum LinkFrame {
    /// An event for the core.
    Event(PeerEvent),
    /// The sender's full state (interests, retained messages) follows:
    /// forget its interests known so far (a reconnected link).
    Sync,
    /// Answer with `Seen { seq }` once everything before this frame is
    /// applied: the sender's earlier answers may have been lost with a
    /// link that broke.
    Ask(u64),
    /// The state that followed the last `Sync` is complete.
    Synced,
    /// A link's first frame, from the node that writes on it: its
    /// incarnation (a new one each time it starts).
    Hello(u64),
    /// The answer to `Hello`, from the node that reads: its own
    /// incarnation, and how many of the writer's frames (of that
    /// incarnation) it has applied.
    Resume {
        /// The reader's incarnation.
        incarnation: u64,
        /// Frames applied so far.
        next: u64,
    },
    /// The writer's frames from here on are numbered from this.
    Start(u64),
    /// The reader has applied the writer's frames before this number.
    Ack(u64),
}

/// A frame that cannot be read (the link is then closed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub &'static str);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for WireError {}

/// One encoded frame: its chunks (headers, then a payload when it carries a
/// message), and what the sender's queue needs to know of it.
#[derive(Debug, Clone)]
pub struct EncodedFrame {
    /// Headers and payload, in order.
    pub chunks: Vec<Bytes>,
    /// Bytes on the wire.
    pub len: usize,
    /// A PUBLISH (droppable when the link's queue overflows), and its QoS.
    pub publish: Option<QoS>,
    /// Operations for a replica (droppable too while the node is away: it
    /// gets full images again when it is back, see
    /// `Broker::set_peer_away`).
    pub replica: bool,
    /// What the frame sets on its receiver, if a later frame with the same
    /// key sets it anew.
    pub state: Option<StateKey>,
}

/// The state a frame sets on its receiver that a later frame with the same
/// key replaces whole: a node's interest in a filter (added or not), a
/// topic's retained message (a newer one, or none), how far the sender's
/// changes must be durable before the receiver answers (a fence, whose
/// answer covers every earlier one). Of several such frames not yet sent,
/// the last tells the receiver all it needs, so an overflowing queue keeps
/// only that one (`shell::links`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StateKey {
    /// A filter and its shared group.
    Interest(Box<str>, Option<Box<str>>),
    /// A retained message's topic.
    Retain(MqttStr),
    /// A `Fence`: its answer, `Seen`, counts up to its change number.
    Fence,
}

/// Room left in the scratch buffer below which a frame starts a new
/// block of [`HEADS_BLOCK`] bytes (a head may still outgrow it).
const HEAD_ROOM: usize = 512;
const HEADS_BLOCK: usize = 16 * 1024;

/// Writes frames; counts what it wrote.
#[derive(Debug, Default)]
pub struct FrameEncoder {
    scratch: BytesMut,
    /// Frames encoded.
    pub frames: u64,
    /// Bytes encoded.
    pub bytes: u64,
}

impl FrameEncoder {
    /// Encode `event` (expiry measured from `now`).
    pub fn encode(&mut self, event: &PeerEvent, now: Instant) -> Result<EncodedFrame, WireError> {
        let start = self.begin();
        let mut payload = None;
        let mut publish = None;
        let mut state = None;
        match event {
            PeerEvent::Interest {
                filter,
                group,
                add,
                seq,
            } => {
                self.scratch.put_u8(INTEREST);
                self.scratch
                    .put_u8(u8::from(*add) | (u8::from(group.is_some()) << 1));
                self.scratch.put_u64(*seq);
                put_str(&mut self.scratch, filter)?;
                if let Some(g) = group {
                    put_str(&mut self.scratch, g)?;
                }
                state = Some(StateKey::Interest(filter.clone(), group.clone()));
            }
            PeerEvent::Publish {
                msg,
                direct,
                shares,
                id,
            } => {
                self.scratch.put_u8(PUBLISH);
                put_publish(&mut self.scratch, msg, *direct, shares, *id, now)?;
                payload = Some(msg.payload.clone());
                publish = Some(msg.qos);
            }
            PeerEvent::Stranded(st) => {
                let Stranded {
                    owners,
                    msg,
                    direct,
                    shares,
                } = &**st;
                self.scratch.put_u8(STRANDED);
                let n = u8::try_from(owners.len()).map_err(|_| WireError("too many owners"))?;
                self.scratch.put_u8(n);
                for o in owners {
                    self.scratch.put_u16(o.0);
                }
                put_publish(&mut self.scratch, msg, *direct, shares, None, now)?;
                payload = Some(msg.payload.clone());
                publish = Some(msg.qos);
            }
            PeerEvent::Hold { session, hold } => {
                self.scratch.put_u8(HOLD);
                self.scratch.put_u8(u8::from(*hold));
                self.scratch.put_u64(session.0);
            }
            PeerEvent::Retain { msg, seq, stamp } => {
                self.scratch.put_u8(RETAIN);
                self.scratch.put_u64(*seq);
                self.scratch.put_u64(stamp.hlc);
                self.scratch.put_u64(stamp.node);
                put_message(&mut self.scratch, msg, now)?;
                payload = Some(msg.payload.clone());
                state = Some(StateKey::Retain(msg.topic.clone()));
            }
            PeerEvent::Seen { seq } => {
                self.scratch.put_u8(SEEN);
                self.scratch.put_u64(*seq);
            }
            PeerEvent::Fence { seq } => {
                self.scratch.put_u8(FENCE);
                self.scratch.put_u64(*seq);
                state = Some(StateKey::Fence);
            }
            PeerEvent::Refused { seq } => {
                self.scratch.put_u8(REFUSED);
                self.scratch.put_u64(*seq);
            }
            PeerEvent::Consumed { bytes } => {
                self.scratch.put_u8(CONSUMED);
                self.scratch.put_u64(*bytes);
            }
            PeerEvent::Replicate { seq, ops } => {
                self.scratch.put_u8(REPLICATE);
                self.scratch.put_u64(*seq);
                return self.finish_parts(start, ops);
            }
            PeerEvent::ReplicaAck { seq } => {
                self.scratch.put_u8(REPLICA_ACK);
                self.scratch.put_u64(*seq);
            }
            PeerEvent::ReplicaStale { clients } => {
                self.scratch.put_u8(REPLICA_STALE);
                super::replica_wire::encode_stale(clients, &mut self.scratch)?;
            }
            PeerEvent::Handover { client } => {
                self.scratch.put_u8(HANDOVER);
                put_str(&mut self.scratch, client)?;
            }
            PeerEvent::CopyWanted {
                client,
                epoch,
                have,
            } => {
                self.scratch.put_u8(COPY_WANTED);
                self.scratch.put_u64(*epoch);
                self.scratch.put_u64(*have);
                put_str(&mut self.scratch, client)?;
            }
            PeerEvent::NoCopy { client } => {
                self.scratch.put_u8(NO_COPY);
                put_str(&mut self.scratch, client)?;
            }
            PeerEvent::Relaying { client } => {
                self.scratch.put_u8(RELAYING);
                put_str(&mut self.scratch, client)?;
            }
            PeerEvent::Relayed {
                client,
                msg,
                qos,
                retain,
                sub_ids,
            } => {
                self.scratch.put_u8(RELAYED);
                let mark = msg.mark();
                self.scratch.put_u8(
                    *qos as u8 | (u8::from(*retain) << 2) | (u8::from(mark.is_some()) << 3),
                );
                if let Some(m) = mark {
                    self.scratch.put_u64(m.node());
                    self.scratch.put_u64(m.seq());
                }
                put_str(&mut self.scratch, client)?;
                let n = u16::try_from(sub_ids.len())
                    .map_err(|_| WireError("too many subscription identifiers"))?;
                self.scratch.put_u16(n);
                for id in sub_ids {
                    self.scratch.put_u32(*id);
                }
                put_message(&mut self.scratch, msg, now)?;
                payload = Some(msg.payload.clone());
                publish = Some(*qos);
            }
            PeerEvent::RelayDone { client } => {
                self.scratch.put_u8(RELAY_DONE);
                put_str(&mut self.scratch, client)?;
            }
            PeerEvent::Moved { client } => {
                self.scratch.put_u8(MOVED);
                put_str(&mut self.scratch, client)?;
            }
            PeerEvent::Flushed { client, to } => {
                self.scratch.put_u8(FLUSHED);
                // 0 is no node (node ids start at 1).
                self.scratch.put_u16(to.map_or(0, |p| p.0));
                put_str(&mut self.scratch, client)?;
            }
        }
        let mut f = self.finish(start, payload, publish)?;
        f.state = state;
        Ok(f)
    }

    /// The frame that tells the receiver a full state follows.
    pub fn sync(&mut self) -> EncodedFrame {
        let start = self.begin();
        self.scratch.put_u8(SYNC);
        // Fits: a frame of six bytes.
        self.finish(start, None, None).unwrap_or(EncodedFrame {
            chunks: Vec::new(),
            len: 0,
            publish: None,
            replica: false,
            state: None,
        })
    }

    /// A frame of the link's own handshake: `Hello`, `Resume`, `Start`
    /// or `Ack` (see [`LinkFrame`]).
    pub fn control(&mut self, frame: &LinkFrame) -> Option<EncodedFrame> {
        let start = self.begin();
        match *frame {
            LinkFrame::Hello(inc) => {
                self.scratch.put_u8(HELLO);
                self.scratch.put_u64(inc);
            }
            LinkFrame::Resume { incarnation, next } => {
                self.scratch.put_u8(RESUME);
                self.scratch.put_u64(incarnation);
                self.scratch.put_u64(next);
            }
            LinkFrame::Start(n) => {
                self.scratch.put_u8(START);
                self.scratch.put_u64(n);
            }
            LinkFrame::Ack(n) => {
                self.scratch.put_u8(ACK);
                self.scratch.put_u64(n);
            }
            _ => {
                self.scratch.truncate(start);
                return None;
            }
        }
        self.finish(start, None, None).ok()
    }

    /// The frame that ends a full state (see [`LinkFrame::Synced`]).
    pub fn synced(&mut self) -> EncodedFrame {
        let start = self.begin();
        self.scratch.put_u8(SYNCED);
        self.finish(start, None, None).unwrap_or(EncodedFrame {
            chunks: Vec::new(),
            len: 0,
            publish: None,
            replica: false,
            state: None,
        })
    }

    /// The frame that asks for `Seen { seq }` (see [`LinkFrame::Ask`]).
    pub fn ask(&mut self, seq: u64) -> EncodedFrame {
        let start = self.begin();
        self.scratch.put_u8(ASK);
        self.scratch.put_u64(seq);
        self.finish(start, None, None).unwrap_or(EncodedFrame {
            chunks: Vec::new(),
            len: 0,
            publish: None,
            replica: false,
            state: None,
        })
    }

    fn begin(&mut self) -> usize {
        // Each frame's head is split off the scratch buffer and shared
        // with the writer: room for many heads at once makes one
        // allocation serve them all. Grown from empty, every frame
        // allocated its head anew and reallocated it as it grew.
        if self.scratch.capacity() - self.scratch.len() < HEAD_ROOM {
            self.scratch.reserve(HEADS_BLOCK);
        }
        let start = self.scratch.len();
        self.scratch.put_u32(0);
        self.scratch.put_u8(VERSION);
        start
    }

    /// A `Replicate` frame: its head, then the operations' chunks (one
    /// per payload, not copied).
    fn finish_parts(
        &mut self,
        start: usize,
        ops: &super::replica::ReplBatch,
    ) -> Result<EncodedFrame, WireError> {
        // Encoded once for every link that sends the batch.
        let parts = match ops.wire() {
            Ok(parts) => parts,
            Err(e) => {
                self.scratch.truncate(start);
                return Err(e);
            }
        };
        let extra: usize = parts.iter().map(Bytes::len).sum();
        let body = self.scratch.len() - start - LEN + extra;
        if body > MAX_FRAME {
            self.scratch.truncate(start);
            return Err(WireError("frame too large"));
        }
        let len = u32::try_from(body).map_err(|_| WireError("frame too large"))?;
        self.scratch[start..start + LEN].copy_from_slice(&len.to_be_bytes());
        let mut chunks = Vec::with_capacity(parts.len() + 1);
        chunks.push(self.scratch.split().freeze());
        chunks.extend_from_slice(parts);
        self.frames += 1;
        self.bytes += (LEN + body) as u64;
        Ok(EncodedFrame {
            chunks,
            len: LEN + body,
            publish: None,
            replica: true,
            state: None,
        })
    }

    fn finish(
        &mut self,
        start: usize,
        payload: Option<Bytes>,
        publish: Option<QoS>,
    ) -> Result<EncodedFrame, WireError> {
        let extra = payload.as_ref().map_or(0, Bytes::len);
        let body = self.scratch.len() - start - LEN + extra;
        if body > MAX_FRAME {
            self.scratch.truncate(start);
            return Err(WireError("frame too large"));
        }
        let len = u32::try_from(body).map_err(|_| WireError("frame too large"))?;
        self.scratch[start..start + LEN].copy_from_slice(&len.to_be_bytes());
        let head = self.scratch.split().freeze();
        let mut chunks = vec![head];
        chunks.extend(payload.filter(|p| !p.is_empty()));
        self.frames += 1;
        self.bytes += (LEN + body) as u64;
        Ok(EncodedFrame {
            chunks,
            len: LEN + body,
            publish,
            replica: false,
            state: None,
        })
    }
}

/// Flags of a message's fields.
const HAS_ORIGIN: u8 = 1;
const HAS_EXPIRY: u8 = 2;

fn put_message(dst: &mut BytesMut, msg: &Message, now: Instant) -> Result<(), WireError> {
    // A session id of another peer means nothing past this node.
    let origin = msg.origin.filter(|_| msg.origin_peer.is_none());
    let mut flags = 0;
    if origin.is_some() {
        flags |= HAS_ORIGIN;
    }
    if msg.expires_at.is_some() {
        flags |= HAS_EXPIRY;
    }
    dst.put_u8(flags);
    if let Some(o) = origin {
        dst.put_u64(o.0);
    }
    if let Some(at) = msg.expires_at {
        let left = at.saturating_duration_since(now).as_millis();
        dst.put_u64(u64::try_from(left).unwrap_or(u64::MAX));
    }
    let header = PublishHeader {
        dup: false,
        qos: msg.qos,
        retain: msg.retain,
        // Any non-zero id: the receiver does not use it.
        packet_id: 1,
        topic: msg.topic.as_str(),
        topic_alias: None,
        properties: &msg.properties,
        message_expiry_interval: None,
        subscription_identifiers: &[],
        payload_len: msg.payload.len(),
    };
    zerofan_codec::encode_publish_header(&header, Protocol::V5, dst)
        .map_err(|_| WireError("message cannot be encoded"))
}

fn put_str(dst: &mut BytesMut, s: &str) -> Result<(), WireError> {
    let n = u16::try_from(s.len()).map_err(|_| WireError("string too long"))?;
    dst.put_u16(n);
    dst.put_slice(s.as_bytes());
    Ok(())
}

/// Reads frames from a connection's read buffer; counts what it read.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    /// Frames decoded.
    pub frames: u64,
    /// Bytes decoded.
    pub bytes: u64,
}

impl FrameDecoder {
    /// Take the first complete frame off `buf`: `Ok(None)` until one is
    /// complete. Messages in it are slices of `buf`'s memory (`buf` keeps
    /// the rest). An error leaves `buf` as it was; the link must close.
    pub fn decode(
        &mut self,
        buf: &mut BytesMut,
        now: Instant,
    ) -> Result<Option<LinkFrame>, WireError> {
        let Some(head) = buf.get(..LEN) else {
            return Ok(None);
        };
        let mut len = [0u8; LEN];
        len.copy_from_slice(head);
        let body = u32::from_be_bytes(len) as usize;
        if body > MAX_FRAME {
            return Err(WireError("frame too large"));
        }
        if buf.len() < LEN + body {
            buf.reserve(LEN + body - buf.len());
            return Ok(None);
        }
        let frame = buf.split_to(LEN + body).freeze().slice(LEN..);
        self.frames += 1;
        self.bytes += (LEN + body) as u64;
        decode_body(frame, now).map(Some)
    }
}

/// Decode one frame's body (after its length).
pub fn decode_body(mut f: Bytes, now: Instant) -> Result<LinkFrame, WireError> {
    let version = get_u8(&mut f)?;
    if version != VERSION {
        return Err(WireError("unknown frame version"));
    }
    let event = match get_u8(&mut f)? {
        INTEREST => {
            let flags = get_u8(&mut f)?;
            let seq = get_u64(&mut f)?;
            let filter = get_str(&mut f)?;
            let group = if flags & 2 != 0 {
                Some(get_str(&mut f)?)
            } else {
                None
            };
            end(&f)?;
            PeerEvent::Interest {
                filter: filter.as_str().into(),
                group: group.map(|g| g.as_str().into()),
                add: flags & 1 != 0,
                seq,
            }
        }
        PUBLISH => {
            let (msg, direct, shares, id) = get_publish(f, now)?;
            PeerEvent::Publish {
                msg,
                direct,
                shares,
                id,
            }
        }
        STRANDED => {
            let n = get_u8(&mut f)?;
            let mut owners = Vec::with_capacity(usize::from(n));
            for _ in 0..n {
                owners.push(PeerId(get_u16(&mut f)?));
            }
            let (msg, direct, shares, _) = get_publish(f, now)?;
            PeerEvent::Stranded(Box::new(Stranded {
                owners,
                msg,
                direct,
                shares,
            }))
        }
        HOLD => {
            let hold = get_u8(&mut f)? & 1 != 0;
            let session = SessionId(get_u64(&mut f)?);
            end(&f)?;
            PeerEvent::Hold { session, hold }
        }
        RETAIN => {
            let seq = get_u64(&mut f)?;
            let stamp = super::retain_order::Stamp {
                hlc: get_u64(&mut f)?,
                node: get_u64(&mut f)?,
            };
            let msg = get_message(f, now)?;
            PeerEvent::Retain { msg, seq, stamp }
        }
        SEEN => {
            let seq = get_u64(&mut f)?;
            end(&f)?;
            PeerEvent::Seen { seq }
        }
        REFUSED => {
            let seq = get_u64(&mut f)?;
            end(&f)?;
            PeerEvent::Refused { seq }
        }
        FENCE => {
            let seq = get_u64(&mut f)?;
            end(&f)?;
            PeerEvent::Fence { seq }
        }
        CONSUMED => {
            let bytes = get_u64(&mut f)?;
            end(&f)?;
            PeerEvent::Consumed { bytes }
        }
        REPLICATE => {
            let seq = get_u64(&mut f)?;
            let ops = super::replica_wire::decode(&mut f)?;
            end(&f)?;
            PeerEvent::Replicate {
                seq,
                ops: ops.into(),
            }
        }
        REPLICA_ACK => {
            let seq = get_u64(&mut f)?;
            end(&f)?;
            PeerEvent::ReplicaAck { seq }
        }
        REPLICA_STALE => {
            let clients = super::replica_wire::decode_stale(&mut f)?;
            end(&f)?;
            PeerEvent::ReplicaStale { clients }
        }
        HANDOVER => {
            let client = get_str(&mut f)?;
            end(&f)?;
            PeerEvent::Handover {
                client: client.as_str().into(),
            }
        }
        COPY_WANTED => {
            let epoch = get_u64(&mut f)?;
            let have = get_u64(&mut f)?;
            let client = get_str(&mut f)?;
            end(&f)?;
            PeerEvent::CopyWanted {
                client: client.as_str().into(),
                epoch,
                have,
            }
        }
        NO_COPY => PeerEvent::NoCopy {
            client: get_client(&mut f)?,
        },
        RELAYING => PeerEvent::Relaying {
            client: get_client(&mut f)?,
        },
        RELAYED => {
            let flags = get_u8(&mut f)?;
            let qos = QoS::from_u8(flags & 3).ok_or(WireError("bad QoS"))?;
            let mark = if flags & 8 != 0 {
                Some(Mark::new(get_u64(&mut f)?, get_u64(&mut f)?))
            } else {
                None
            };
            let client = get_str(&mut f)?.as_str().into();
            let n = get_u16(&mut f)?;
            let mut sub_ids = Vec::with_capacity(usize::from(n).min(64));
            for _ in 0..n {
                if f.remaining() < 4 {
                    return Err(WireError("truncated frame"));
                }
                sub_ids.push(f.get_u32());
            }
            let mut msg = get_message(f, now)?;
            msg.set_mark(mark);
            PeerEvent::Relayed {
                client,
                msg,
                qos,
                retain: flags & 4 != 0,
                sub_ids,
            }
        }
        RELAY_DONE => PeerEvent::RelayDone {
            client: get_client(&mut f)?,
        },
        MOVED => PeerEvent::Moved {
            client: get_client(&mut f)?,
        },
        FLUSHED => {
            let to = get_u16(&mut f)?;
            PeerEvent::Flushed {
                to: (to != 0).then_some(PeerId(to)),
                client: get_client(&mut f)?,
            }
        }
        SYNC => {
            end(&f)?;
            return Ok(LinkFrame::Sync);
        }
        SYNCED => {
            end(&f)?;
            return Ok(LinkFrame::Synced);
        }
        HELLO => {
            let inc = get_u64(&mut f)?;
            end(&f)?;
            return Ok(LinkFrame::Hello(inc));
        }
        RESUME => {
            let incarnation = get_u64(&mut f)?;
            let next = get_u64(&mut f)?;
            end(&f)?;
            return Ok(LinkFrame::Resume { incarnation, next });
        }
        START => {
            let n = get_u64(&mut f)?;
            end(&f)?;
            return Ok(LinkFrame::Start(n));
        }
        ACK => {
            let n = get_u64(&mut f)?;
            end(&f)?;
            return Ok(LinkFrame::Ack(n));
        }
        ASK => {
            let seq = get_u64(&mut f)?;
            end(&f)?;
            return Ok(LinkFrame::Ask(seq));
        }
        _ => return Err(WireError("unknown frame kind")),
    };
    Ok(LinkFrame::Event(event))
}

/// A frame that holds a client id and nothing after it.
fn get_client(f: &mut Bytes) -> Result<Box<str>, WireError> {
    let client = get_str(f)?;
    end(f)?;
    Ok(client.as_str().into())
}

fn get_message(mut f: Bytes, now: Instant) -> Result<Message, WireError> {
    let flags = get_u8(&mut f)?;
    let origin = if flags & HAS_ORIGIN != 0 {
        Some(SessionId(get_u64(&mut f)?))
    } else {
        None
    };
    let left = if flags & HAS_EXPIRY != 0 {
        Some(get_u64(&mut f)?)
    } else {
        None
    };
    let publish = match zerofan_codec::decode(f, Protocol::V5) {
        Ok(Packet::Publish(p)) => p,
        Ok(_) => return Err(WireError("not a PUBLISH")),
        Err(_) => return Err(WireError("malformed message")),
    };
    if publish.topic.is_empty() {
        return Err(WireError("message without a topic"));
    }
    let mut msg = Message::from_publish(publish, origin, now);
    // A time past what the clock can hold never comes: no expiry.
    msg.expires_at = left.and_then(|ms| now.checked_add(Duration::from_millis(ms)));
    Ok(msg)
}

/// What a `Publish` (and a `Stranded`, after its owners) carries.
fn put_publish(
    out: &mut BytesMut,
    msg: &Message,
    direct: bool,
    shares: &[Arc<str>],
    id: Option<MsgId>,
    now: Instant,
) -> Result<(), WireError> {
    let mark = msg.mark();
    out.put_u8(u8::from(direct) | (u8::from(mark.is_some()) << 1) | (u8::from(id.is_some()) << 2));
    if let Some(m) = mark {
        out.put_u64(m.node());
        out.put_u64(m.seq());
    }
    if let Some(id) = id {
        out.put_u64(id.0);
    }
    let n = u16::try_from(shares.len()).map_err(|_| WireError("too many groups"))?;
    out.put_u16(n);
    for s in shares {
        put_str(out, s)?;
    }
    put_message(out, msg, now)
}

/// [`put_publish`] read back: the message (with its mark), `direct` and
/// the groups.
#[allow(clippy::type_complexity)]
fn get_publish(
    mut f: Bytes,
    now: Instant,
) -> Result<(Message, bool, Vec<Arc<str>>, Option<MsgId>), WireError> {
    let flags = get_u8(&mut f)?;
    let mark = if flags & 2 != 0 {
        Some(Mark::new(get_u64(&mut f)?, get_u64(&mut f)?))
    } else {
        None
    };
    let id = if flags & 4 != 0 {
        Some(MsgId(get_u64(&mut f)?))
    } else {
        None
    };
    let n = get_u16(&mut f)?;
    let mut shares = Vec::with_capacity(usize::from(n).min(64));
    for _ in 0..n {
        shares.push(Arc::<str>::from(get_str(&mut f)?.as_str()));
    }
    let mut msg = get_message(f, now)?;
    msg.set_mark(mark);
    Ok((msg, flags & 1 != 0, shares, id))
}

fn get_u8(f: &mut Bytes) -> Result<u8, WireError> {
    if f.remaining() < 1 {
        return Err(WireError("truncated frame"));
    }
    Ok(f.get_u8())
}

fn get_u16(f: &mut Bytes) -> Result<u16, WireError> {
    if f.remaining() < 2 {
        return Err(WireError("truncated frame"));
    }
    Ok(f.get_u16())
}

fn get_u64(f: &mut Bytes) -> Result<u64, WireError> {
    if f.remaining() < 8 {
        return Err(WireError("truncated frame"));
    }
    Ok(f.get_u64())
}

fn get_str(f: &mut Bytes) -> Result<MqttStr, WireError> {
    let n = usize::from(get_u16(f)?);
    if f.remaining() < n {
        return Err(WireError("truncated frame"));
    }
    MqttStr::from_bytes(f.split_to(n)).map_err(|_| WireError("invalid string"))
}

fn end(f: &Bytes) -> Result<(), WireError> {
    if f.is_empty() {
        Ok(())
    } else {
        Err(WireError("trailing bytes in frame"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use zerofan_codec::{Properties, Props};

    fn message(topic: &str, payload: &[u8], qos: QoS, retain: bool, props: Properties) -> Message {
        let mut m = Message::owned(
            MqttStr::try_from(topic).unwrap(),
            Bytes::copy_from_slice(payload),
            qos,
            retain,
            Props::from(props),
            None,
        );
        m.origin = Some(SessionId(42));
        m
    }

    /// Encode every event into one byte stream, as a link writes it.
    fn wire(events: &[PeerEvent], now: Instant) -> BytesMut {
        let mut enc = FrameEncoder::default();
        let mut out = BytesMut::new();
        for e in events {
            let f = enc.encode(e, now).unwrap();
            for c in &f.chunks {
                out.extend_from_slice(c);
            }
        }
        assert_eq!(enc.frames, events.len() as u64);
        assert_eq!(enc.bytes, out.len() as u64);
        out
    }

    fn read_all(mut buf: BytesMut, now: Instant) -> Vec<LinkFrame> {
        let mut dec = FrameDecoder::default();
        let mut got = Vec::new();
        while let Some(f) = dec.decode(&mut buf, now).unwrap() {
            got.push(f);
        }
        assert!(buf.is_empty(), "bytes left over");
        got
    }

    fn events(f: Vec<LinkFrame>) -> Vec<PeerEvent> {
        f.into_iter()
            .map(|f| match f {
                LinkFrame::Event(e) => e,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn every_event_crosses_whole() {
        let now = Instant::now();
        let props = Properties {
            content_type: Some(MqttStr::from_static("text/plain")),
            response_topic: Some(MqttStr::from_static("re/ply")),
            correlation_data: Some(Bytes::from_static(b"cd")),
            payload_format_indicator: Some(1),
            user_properties: vec![(MqttStr::from_static("k"), MqttStr::from_static("v"))],
            ..Properties::default()
        };
        let mut expiring = message("a/b", b"hello", QoS::ExactlyOnce, true, props);
        expiring.expires_at = Some(now + Duration::from_millis(1500));
        let sent = vec![
            PeerEvent::Interest {
                filter: "a/+".into(),
                group: Some("g".into()),
                add: true,
                seq: 7,
            },
            PeerEvent::Interest {
                filter: "x/#".into(),
                group: None,
                add: false,
                seq: u64::MAX,
            },
            PeerEvent::Publish {
                msg: expiring,
                direct: true,
                shares: vec!["$share/g/a/+".into(), "$share/h/#".into()],
                id: Some(MsgId(41)),
            },
            PeerEvent::Hold {
                session: SessionId(9),
                hold: true,
            },
            PeerEvent::Retain {
                msg: message("r", b"", QoS::AtMostOnce, true, Properties::default()),
                seq: 3,
                stamp: crate::core::Stamp {
                    hlc: 9 << 16,
                    node: 4,
                },
            },
            PeerEvent::Seen { seq: 11 },
            PeerEvent::Fence { seq: 12 },
            PeerEvent::Refused { seq: 13 },
        ];
        let later = now + Duration::from_millis(100);
        let got = events(read_all(wire(&sent, now), later));
        assert_eq!(got.len(), sent.len());
        assert_eq!(format!("{:?}", got[0]), format!("{:?}", sent[0]));
        assert_eq!(format!("{:?}", got[1]), format!("{:?}", sent[1]));
        let PeerEvent::Publish {
            msg,
            direct,
            shares,
            id,
        } = &got[2]
        else {
            panic!("{:?}", got[2]);
        };
        assert!(*direct);
        assert_eq!(*id, Some(MsgId(41)));
        assert_eq!(shares.len(), 2);
        assert_eq!(&*shares[1], "$share/h/#");
        assert_eq!(msg.topic.as_str(), "a/b");
        assert_eq!(&msg.payload[..], b"hello");
        assert_eq!(msg.qos, QoS::ExactlyOnce);
        assert!(msg.retain);
        assert_eq!(msg.origin, Some(SessionId(42)));
        assert_eq!(msg.properties.content_type.as_deref(), Some("text/plain"));
        assert_eq!(msg.properties.response_topic.as_deref(), Some("re/ply"));
        assert_eq!(msg.properties.correlation_data.as_deref(), Some(&b"cd"[..]));
        assert_eq!(msg.properties.payload_format_indicator, Some(1));
        assert_eq!(msg.properties.user_properties.len(), 1);
        // 1.5 s left when sent, measured from the receiver's clock.
        assert_eq!(msg.expires_at, Some(later + Duration::from_millis(1500)));
        assert_eq!(format!("{:?}", got[3]), format!("{:?}", sent[3]));
        let PeerEvent::Retain { msg, seq: 3, stamp } = &got[4] else {
            panic!("{:?}", got[4]);
        };
        assert!(msg.payload.is_empty() && msg.retain);
        assert_eq!((stamp.hlc, stamp.node), (9 << 16, 4), "the stamp crosses");
        assert_eq!(format!("{:?}", got[5]), format!("{:?}", sent[5]));
    }

    #[test]
    fn link_frames_cross_whole() {
        let mut enc = FrameEncoder::default();
        let f = enc.sync();
        assert_eq!(f.len, 6);
        let mut buf = BytesMut::from(&f.chunks[0][..]);
        let got = FrameDecoder::default()
            .decode(&mut buf, Instant::now())
            .unwrap();
        assert!(matches!(got, Some(LinkFrame::Sync)));
        let f = enc.ask(77);
        let mut buf = BytesMut::from(&f.chunks[0][..]);
        let got = FrameDecoder::default()
            .decode(&mut buf, Instant::now())
            .unwrap();
        assert!(matches!(got, Some(LinkFrame::Ask(77))));
        let f = enc.synced();
        let mut buf = BytesMut::from(&f.chunks[0][..]);
        let got = FrameDecoder::default()
            .decode(&mut buf, Instant::now())
            .unwrap();
        assert!(matches!(got, Some(LinkFrame::Synced)));
        for c in [
            LinkFrame::Hello(5),
            LinkFrame::Resume {
                incarnation: 6,
                next: 7,
            },
            LinkFrame::Start(8),
            LinkFrame::Ack(9),
        ] {
            let f = enc.control(&c).unwrap();
            let mut buf = BytesMut::from(&f.chunks[0][..]);
            let got = FrameDecoder::default()
                .decode(&mut buf, Instant::now())
                .unwrap()
                .unwrap();
            assert_eq!(format!("{got:?}"), format!("{c:?}"));
        }
        assert!(enc.control(&LinkFrame::Sync).is_none());
    }

    #[test]
    fn the_payload_is_a_chunk_of_its_own_and_decodes_in_place() {
        let now = Instant::now();
        let payload = Bytes::from(vec![7u8; 4096]);
        let mut m = message("t", b"", QoS::AtLeastOnce, false, Properties::default());
        m.payload = payload.clone();
        let ev = PeerEvent::Publish {
            msg: m,
            direct: true,
            shares: Vec::new(),
            id: None,
        };
        let f = FrameEncoder::default().encode(&ev, now).unwrap();
        // Encoding did not copy the payload: the second chunk is it.
        assert_eq!(f.chunks.len(), 2);
        assert_eq!(f.chunks[1].as_ptr(), payload.as_ptr());
        let mut buf = BytesMut::with_capacity(f.len);
        for c in &f.chunks {
            buf.extend_from_slice(c);
        }
        let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
        let got = events(read_all(buf, now));
        let PeerEvent::Publish { msg, .. } = &got[0] else {
            panic!()
        };
        // Decoding did not copy it either: it points into the read buffer.
        assert!(range.contains(&(msg.payload.as_ptr() as usize)));
        assert_eq!(msg.payload, payload);
    }

    #[test]
    fn frames_split_anywhere_wait_for_the_rest() {
        let now = Instant::now();
        let sent = vec![
            PeerEvent::Seen { seq: 1 },
            PeerEvent::Publish {
                msg: message("a", b"xyz", QoS::AtMostOnce, false, Properties::default()),
                direct: true,
                shares: Vec::new(),
                id: None,
            },
        ];
        let all = wire(&sent, now);
        for cut in 0..all.len() {
            let mut dec = FrameDecoder::default();
            let mut buf = BytesMut::from(&all[..cut]);
            let mut n = 0;
            while dec.decode(&mut buf, now).unwrap().is_some() {
                n += 1;
            }
            buf.extend_from_slice(&all[cut..]);
            while dec.decode(&mut buf, now).unwrap().is_some() {
                n += 1;
            }
            assert_eq!(n, 2, "cut at {cut}");
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        let now = Instant::now();
        let mut dec = FrameDecoder::default();
        let mut buf = BytesMut::from(&[0xffu8, 0xff, 0xff, 0xff, 1][..]);
        assert_eq!(
            dec.decode(&mut buf, now).unwrap_err(),
            WireError("frame too large")
        );
        let bad = |body: &[u8]| {
            let mut buf = BytesMut::new();
            buf.put_u32(body.len() as u32);
            buf.put_slice(body);
            FrameDecoder::default().decode(&mut buf, now)
        };
        for other in [1, VERSION + 1] {
            let e = bad(&[other, SEEN, 0, 0, 0, 0, 0, 0, 0, 1]).unwrap_err();
            assert_eq!(e, WireError("unknown frame version"));
        }
        assert!(bad(&[VERSION, SEEN, 0, 0, 0, 0, 0, 0, 0, 1]).is_ok());
        assert!(bad(&[VERSION, 99]).is_err(), "kind");
        assert!(bad(&[VERSION, SEEN, 0, 0]).is_err(), "short");
        assert!(
            bad(&[VERSION, SEEN, 0, 0, 0, 0, 0, 0, 0, 1, 5]).is_err(),
            "long"
        );
        assert!(
            bad(&[VERSION, PUBLISH, 1, 0, 0, 0, 0x30, 0]).is_err(),
            "no topic"
        );
        assert!(bad(&[VERSION, INTEREST, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 2, 0xff, 0xfe]).is_err());
        assert!(bad(&[]).is_err(), "empty");
        // A well-formed PUBLISH frame, cut anywhere inside its body.
        let sent = [PeerEvent::Publish {
            msg: message(
                "a/b",
                b"payload",
                QoS::AtLeastOnce,
                false,
                Properties::default(),
            ),
            direct: false,
            shares: vec!["$share/g/a/b".into()],
            id: Some(MsgId(7)),
        }];
        let whole = wire(&sent, now);
        for cut in LEN + 1..whole.len() {
            assert!(bad(&whole[LEN..cut]).is_err(), "cut at {cut}");
        }
    }

    fn arb_event() -> impl Strategy<Value = PeerEvent> {
        let topic = "[a-z]{1,8}(/[a-z0-9]{0,5}){0,3}";
        prop_oneof![
            (
                topic,
                proptest::option::of("[a-z]{1,5}"),
                any::<bool>(),
                any::<u64>()
            )
                .prop_map(|(f, g, add, seq)| PeerEvent::Interest {
                    filter: f.into(),
                    group: g.map(Into::into),
                    add,
                    seq,
                }),
            (
                topic,
                proptest::collection::vec(any::<u8>(), 0..300),
                0u8..3,
                any::<bool>(),
                any::<bool>(),
                proptest::collection::vec("[a-z]{1,6}", 0..3),
                proptest::option::of("[a-z ]{0,10}"),
                proptest::option::of((any::<u64>(), any::<u64>())),
                proptest::option::of(any::<u64>()),
            )
                .prop_map(|(t, p, q, retain, direct, shares, ct, mark, id)| {
                    let qos = [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce][usize::from(q)];
                    let props = Properties {
                        content_type: ct.map(|c| MqttStr::try_from(c.as_str()).unwrap()),
                        ..Properties::default()
                    };
                    let mut msg = message(&t, &p, qos, retain, props);
                    msg.set_mark(mark.map(|(n, s)| Mark::new(n, s)));
                    PeerEvent::Publish {
                        msg,
                        direct,
                        shares: shares.into_iter().map(Into::into).collect(),
                        id: id.map(MsgId),
                    }
                }),
            (
                proptest::collection::vec(any::<u16>(), 0..3),
                topic,
                proptest::collection::vec(any::<u8>(), 0..100),
                any::<bool>(),
                proptest::collection::vec("[a-z]{1,6}", 0..2),
                (any::<u64>(), any::<u64>()),
            )
                .prop_map(|(o, t, p, direct, shares, (node, seq))| {
                    let mut msg = message(&t, &p, QoS::AtLeastOnce, false, Properties::default());
                    msg.set_mark(Some(Mark::new(node, seq)));
                    PeerEvent::Stranded(Box::new(Stranded {
                        owners: o.into_iter().map(PeerId).collect(),
                        msg,
                        direct,
                        shares: shares.into_iter().map(Into::into).collect(),
                    }))
                }),
            (any::<u64>(), any::<bool>()).prop_map(|(s, hold)| PeerEvent::Hold {
                session: SessionId(s),
                hold
            }),
            any::<u64>().prop_map(|seq| PeerEvent::Seen { seq }),
            any::<u64>().prop_map(|seq| PeerEvent::Fence { seq }),
            any::<u64>().prop_map(|seq| PeerEvent::Refused { seq }),
            any::<u64>().prop_map(|bytes| PeerEvent::Consumed { bytes }),
            "[a-z/]{0,12}".prop_map(|c| PeerEvent::Handover { client: c.into() }),
            "[a-z/]{0,12}".prop_map(|c| PeerEvent::NoCopy { client: c.into() }),
            ("[a-z/]{0,12}", any::<u64>(), any::<u64>()).prop_map(|(c, epoch, have)| {
                PeerEvent::CopyWanted {
                    client: c.into(),
                    epoch,
                    have,
                }
            }),
            "[a-z/]{0,12}".prop_map(|c| PeerEvent::Relaying { client: c.into() }),
            "[a-z/]{0,12}".prop_map(|c| PeerEvent::RelayDone { client: c.into() }),
            "[a-z/]{0,12}".prop_map(|c| PeerEvent::Moved { client: c.into() }),
            ("[a-z/]{0,12}", proptest::option::of(1u16..)).prop_map(|(c, to)| {
                PeerEvent::Flushed {
                    client: c.into(),
                    to: to.map(PeerId),
                }
            }),
            (
                "[a-z/]{0,12}",
                topic,
                proptest::collection::vec(any::<u8>(), 0..100),
                0u8..3,
                any::<bool>(),
                proptest::collection::vec(any::<u32>(), 0..4),
                proptest::option::of((any::<u64>(), any::<u64>())),
            )
                .prop_map(|(c, t, p, q, retain, sub_ids, mark)| {
                    let qos = [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce][usize::from(q)];
                    let mut msg = message(&t, &p, qos, false, Properties::default());
                    msg.set_mark(mark.map(|(n, s)| Mark::new(n, s)));
                    PeerEvent::Relayed {
                        client: c.into(),
                        msg,
                        qos,
                        retain,
                        sub_ids,
                    }
                }),
        ]
    }

    proptest! {
        #[test]
        fn events_round_trip(sent in proptest::collection::vec(arb_event(), 1..20)) {
            let now = Instant::now();
            let got = events(read_all(wire(&sent, now), now));
            prop_assert_eq!(got.len(), sent.len());
            for (g, s) in got.iter().zip(&sent) {
                // Debug covers every field (a decoded message's private
                // fields are those of a fresh message: compare the rest).
                match (g, s) {
                    (PeerEvent::Publish { msg: a, direct: da, shares: sa, id: ia },
                     PeerEvent::Publish { msg: b, direct: db, shares: sb, id: ib }) => {
                        prop_assert_eq!(ia, ib);
                        prop_assert_eq!(&a.topic, &b.topic);
                        prop_assert_eq!(&a.payload, &b.payload);
                        prop_assert_eq!(a.qos, b.qos);
                        prop_assert_eq!(a.retain, b.retain);
                        prop_assert_eq!(a.origin, b.origin);
                        prop_assert_eq!(&a.properties.content_type, &b.properties.content_type);
                        prop_assert_eq!(a.mark(), b.mark());
                        prop_assert_eq!(da, db);
                        prop_assert_eq!(sa, sb);
                    }
                    (PeerEvent::Stranded(a), PeerEvent::Stranded(b)) => {
                        prop_assert_eq!(&a.owners, &b.owners);
                        prop_assert_eq!(&a.msg.topic, &b.msg.topic);
                        prop_assert_eq!(&a.msg.payload, &b.msg.payload);
                        prop_assert_eq!(a.msg.qos, b.msg.qos);
                        prop_assert_eq!(a.msg.mark(), b.msg.mark());
                        prop_assert_eq!((a.direct, &a.shares), (b.direct, &b.shares));
                    }
                    (PeerEvent::Relayed { client: ca, msg: a, qos: qa, retain: ra, sub_ids: ia },
                     PeerEvent::Relayed { client: cb, msg: b, qos: qb, retain: rb, sub_ids: ib }) => {
                        prop_assert_eq!(ca, cb);
                        prop_assert_eq!(&a.topic, &b.topic);
                        prop_assert_eq!(&a.payload, &b.payload);
                        prop_assert_eq!(a.qos, b.qos);
                        prop_assert_eq!(a.mark(), b.mark());
                        prop_assert_eq!((qa, ra, ia), (qb, rb, ib));
                    }
                    _ => prop_assert_eq!(format!("{g:?}"), format!("{s:?}")),
                }
            }
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut buf = BytesMut::from(&bytes[..]);
            let mut dec = FrameDecoder::default();
            for _ in 0..200 {
                match dec.decode(&mut buf, Instant::now()) {
                    Ok(Some(_)) => continue,
                    _ => break,
                }
            }
        }
    }
}

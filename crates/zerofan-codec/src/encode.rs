//! Encoding packets straight into a `BufMut`.
//!
//! The encoder refuses (with [`EncodeError`]) anything the decoder would
//! refuse as malformed or a protocol error, so what it writes always decodes
//! back: packet identifier 0 where one is required, QoS 0 with a packet
//! identifier or DUP, a reason code not valid for the packet type, a 0/1
//! property with another value, Receive Maximum / Maximum Packet Size /
//! Topic Alias / Subscription Identifier 0, more than one Subscription
//! Identifier in SUBSCRIBE, Authentication Data without a method, empty
//! SUBSCRIBE / UNSUBSCRIBE / SUBACK / UNSUBACK lists, binary data over
//! 65,535 bytes, a packet over 268,435,455 bytes of remaining length
//! ([`EncodeError::TooLarge`]), a destination `BufMut` too small for the
//! packet. Nothing is written when an error is returned.
//!
//! Topic names of PUBLISH are only checked for emptiness (an empty topic
//! needs MQTT 5 and a Topic Alias); the broker forwards names it already
//! validated on the way in, and scanning them again would cost every
//! delivery. Topic filters are not validated (see [`crate::topic`]).
//!
//! # Properties
//!
//! Properties are written in ascending identifier order. Only the properties
//! the packet type allows are written; any other field set in the
//! [`Properties`] is ignored (so a will's properties can be reused for the
//! PUBLISH of the will message: its Will Delay Interval is simply left out).
//!
//! # MQTT 3.1 and 3.1.1
//!
//! Properties are dropped, and so are reason codes where the wire has none
//! (PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK, DISCONNECT). CONNACK reason
//! codes become return codes with [`crate::reason::v3_connack_code`]; SUBACK
//! failures become 0x80 ([`crate::reason::v3_suback_code`]). MQTT 3.1 has no
//! Session Present flag: it is written as 0. MQTT 5 subscription options
//! other than the QoS are dropped. AUTH is [`EncodeError::WrongProtocol`].
//!
//! # Omitted fields (MQTT 5)
//!
//! PUBACK / PUBREC / PUBREL / PUBCOMP with reason 0x00 and no properties are
//! just the packet identifier; with another reason and no properties, the
//! property length is left out. DISCONNECT and AUTH with reason 0x00 and no
//! properties have a remaining length of 0.

use crate::error::EncodeError;
use crate::framing::{varint_len, write_varint, MAX_REMAINING_LENGTH};
use crate::packet::*;
use crate::properties::Properties;
use crate::reason::{v3_connack_code, v3_suback_code, ReasonCode};
use crate::topic::{split_shared, validate_topic_name};
use crate::wire::{id, Counter, Ctx, Out, Writer};
use bytes::BufMut;

/// Encode `packet` for a peer speaking `protocol` into `dst`.
///
/// A CONNECT is written in the version its own `protocol` field names,
/// whatever `protocol` says (as [`crate::decode()`] reads it). See the module
/// documentation for what is refused and what is dropped under 3.x.
pub fn encode(
    packet: &Packet,
    protocol: Protocol,
    dst: &mut impl BufMut,
) -> Result<(), EncodeError> {
    let first = first_byte(packet, protocol)?;
    let mut c = Counter(0);
    body(&mut c, packet, protocol)?;
    let total = total_len(c.0)?;
    if dst.remaining_mut() < total {
        return Err(EncodeError::Invalid("destination buffer too small"));
    }
    dst.put_u8(first);
    write_varint(c.0 as u32, dst)?;
    body(&mut Writer::new(dst), packet, protocol)
}

/// The number of bytes [`encode`] would write, fixed header included; used
/// to honour a peer's Maximum Packet Size before encoding.
pub fn encoded_len(packet: &Packet, protocol: Protocol) -> Result<usize, EncodeError> {
    first_byte(packet, protocol)?;
    let mut c = Counter(0);
    body(&mut c, packet, protocol)?;
    total_len(c.0)
}

#[inline]
fn total_len(remaining: usize) -> Result<usize, EncodeError> {
    if remaining > MAX_REMAINING_LENGTH as usize {
        return Err(EncodeError::TooLarge);
    }
    Ok(1 + varint_len(remaining as u32) + remaining)
}

/// The per-delivery view of one shared PUBLISH: everything that differs
/// between subscribers (QoS, packet id, retain, topic alias, subscription
/// identifiers, remaining expiry) with the shared parts borrowed. The
/// broker keeps one message and writes one small header per subscriber.
#[derive(Clone, Copy, Debug)]
pub struct PublishHeader<'a> {
    /// DUP flag.
    pub dup: bool,
    /// QoS of this delivery.
    pub qos: QoS,
    /// RETAIN flag of this delivery.
    pub retain: bool,
    /// Packet identifier (ignored at QoS 0).
    pub packet_id: u16,
    /// Topic name to write; empty to rely on an already established alias.
    pub topic: &'a str,
    /// Topic alias to send (MQTT 5), if any.
    pub topic_alias: Option<u16>,
    /// The message's own properties. Its `topic_alias`,
    /// `subscription_identifiers` and `message_expiry_interval` are ignored in
    /// favour of the fields of this struct.
    pub properties: &'a Properties,
    /// Remaining Message Expiry Interval to send, if the message has one.
    pub message_expiry_interval: Option<u32>,
    /// Subscription identifiers of the matching subscriptions (MQTT 5).
    pub subscription_identifiers: &'a [u32],
    /// Length of the payload that will follow the header.
    pub payload_len: usize,
}

impl PublishHeader<'_> {
    /// Length of the whole packet (header plus payload) on the wire.
    pub fn packet_len(&self, protocol: Protocol) -> Result<usize, EncodeError> {
        let v = self.view();
        let mut c = Counter(0);
        publish_var_header(&mut c, &v, protocol)?;
        total_len(c.0.saturating_add(self.payload_len))
    }

    /// Length of what [`encode_publish_header`] writes (the packet without
    /// its payload).
    pub fn header_len(&self, protocol: Protocol) -> Result<usize, EncodeError> {
        Ok(self.packet_len(protocol)? - self.payload_len)
    }

    fn view(&self) -> PubView<'_> {
        PubView {
            dup: self.dup,
            qos: self.qos,
            retain: self.retain,
            packet_id: if self.qos == QoS::AtMostOnce {
                0
            } else {
                self.packet_id
            },
            topic: self.topic.as_bytes(),
            props: self.properties,
            ovr: Ovr {
                message_expiry_interval: self.message_expiry_interval,
                topic_alias: self.topic_alias,
                subscription_identifiers: self.subscription_identifiers,
            },
        }
    }
}

/// Write only the fixed header and variable header of a PUBLISH; the
/// `payload_len` bytes of payload are sent after it, as their own iovec.
/// Never allocates (beyond what `dst` itself does to grow).
pub fn encode_publish_header(
    header: &PublishHeader<'_>,
    protocol: Protocol,
    dst: &mut impl BufMut,
) -> Result<(), EncodeError> {
    // The hot path of every delivery: lengths are computed arithmetically
    // and the bytes go out in three or four `put_slice` calls.
    let v = header.view();
    let first = publish_first_byte(&v)?;
    let v5 = protocol.is_v5();
    if v.topic.is_empty() && !(v5 && v.ovr.topic_alias.is_some()) {
        return Err(EncodeError::Invalid(
            "empty topic name needs MQTT 5 and a topic alias",
        ));
    }
    if v.topic.len() > 65535 {
        return Err(EncodeError::Invalid("string longer than 65535 bytes"));
    }
    let queued = v.qos != QoS::AtMostOnce;
    if queued && v.packet_id == 0 {
        return Err(EncodeError::Invalid("packet identifier 0"));
    }
    let props_len = if v5 && !publish_props_empty(v.props, &v.ovr) {
        props_len(v.props, Ctx::Publish, v.ovr)?
    } else {
        0
    };
    let var_len = 2
        + v.topic.len()
        + if queued { 2 } else { 0 }
        + if v5 {
            varint_len(props_len as u32) + props_len
        } else {
            0
        };
    let remaining = var_len.saturating_add(header.payload_len);
    let total = total_len(remaining)?;
    let header_len = total - header.payload_len;
    if dst.remaining_mut() < header_len {
        return Err(EncodeError::Invalid("destination buffer too small"));
    }
    // Fixed header, topic length, and (for short topics) the topic, packet
    // identifier and property length: one `put_slice` in the usual case.
    let mut head = [0u8; 64];
    head[0] = first;
    let mut n = 1 + put_varint(remaining as u32, &mut head, 1);
    let tl = v.topic.len();
    head[n] = (tl >> 8) as u8;
    head[n + 1] = tl as u8;
    n += 2;
    if tl <= 64 - 13 {
        head[n..n + tl].copy_from_slice(v.topic);
        n += tl;
    } else {
        dst.put_slice(&head[..n]);
        dst.put_slice(v.topic);
        n = 0;
    }
    if queued {
        head[n] = (v.packet_id >> 8) as u8;
        head[n + 1] = v.packet_id as u8;
        n += 2;
    }
    if v5 {
        n += put_varint(props_len as u32, &mut head, n);
    }
    if n > 0 {
        dst.put_slice(&head[..n]);
    }
    if props_len > 0 {
        props_content(&mut Writer::new(dst), v.props, Ctx::Publish, v.ovr)?;
    }
    Ok(())
}

/// Write a Variable Byte Integer (at most 4 bytes, value range-checked by
/// the caller) into `buf` at `at`; the number of bytes written.
#[inline(always)]
fn put_varint(v: u32, buf: &mut [u8; 64], at: usize) -> usize {
    let mut x = v;
    let mut i = 0;
    while i < 4 {
        let b = (x & 0x7F) as u8;
        x >>= 7;
        if let Some(slot) = buf.get_mut(at + i) {
            *slot = if x > 0 && i < 3 { b | 0x80 } else { b };
        }
        i += 1;
        if x == 0 {
            break;
        }
    }
    i
}

/// Nothing to write among the properties a PUBLISH may carry.
#[inline(always)]
fn publish_props_empty(p: &Properties, ovr: &Ovr<'_>) -> bool {
    p.payload_format_indicator.is_none()
        && ovr.message_expiry_interval.is_none()
        && p.content_type.is_none()
        && p.response_topic.is_none()
        && p.correlation_data.is_none()
        && ovr.subscription_identifiers.is_empty()
        && ovr.topic_alias.is_none()
        && p.user_properties.is_empty()
}

/// Property values that a PUBLISH header may override.
#[derive(Clone, Copy)]
struct Ovr<'a> {
    message_expiry_interval: Option<u32>,
    topic_alias: Option<u16>,
    subscription_identifiers: &'a [u32],
}

impl<'a> Ovr<'a> {
    fn of(p: &'a Properties) -> Self {
        Ovr {
            message_expiry_interval: p.message_expiry_interval,
            topic_alias: p.topic_alias,
            subscription_identifiers: &p.subscription_identifiers,
        }
    }
}

struct PubView<'a> {
    dup: bool,
    qos: QoS,
    retain: bool,
    packet_id: u16,
    topic: &'a [u8],
    props: &'a Properties,
    ovr: Ovr<'a>,
}

fn publish_first_byte(v: &PubView<'_>) -> Result<u8, EncodeError> {
    if v.qos == QoS::AtMostOnce && v.dup {
        return Err(EncodeError::Invalid("DUP set on a QoS 0 PUBLISH"));
    }
    Ok(0x30 | (u8::from(v.dup) << 3) | ((v.qos as u8) << 1) | u8::from(v.retain))
}

fn publish_var_header<O: Out>(
    o: &mut O,
    v: &PubView<'_>,
    protocol: Protocol,
) -> Result<(), EncodeError> {
    let v5 = protocol.is_v5();
    if v.topic.is_empty() && !(v5 && v.ovr.topic_alias.is_some()) {
        return Err(EncodeError::Invalid(
            "empty topic name needs MQTT 5 and a topic alias",
        ));
    }
    string(o, v.topic)?;
    match (v.qos, v.packet_id) {
        (QoS::AtMostOnce, 0) => {}
        (QoS::AtMostOnce, _) => {
            return Err(EncodeError::Invalid("packet identifier on a QoS 0 PUBLISH"))
        }
        (_, 0) => return Err(EncodeError::Invalid("packet identifier 0")),
        (_, pid) => o.u16(pid),
    }
    if v5 {
        props(o, v.props, Ctx::Publish, v.ovr)?;
    }
    Ok(())
}

fn first_byte(packet: &Packet, protocol: Protocol) -> Result<u8, EncodeError> {
    Ok(match packet {
        Packet::Connect(_) => 0x10,
        Packet::ConnAck(_) => 0x20,
        Packet::Publish(p) => publish_first_byte(&PubView {
            dup: p.dup,
            qos: p.qos,
            retain: p.retain,
            packet_id: p.packet_id,
            topic: p.topic.as_bytes(),
            props: &p.properties,
            ovr: Ovr::of(&p.properties),
        })?,
        Packet::PubAck(_) => 0x40,
        Packet::PubRec(_) => 0x50,
        Packet::PubRel(_) => 0x62,
        Packet::PubComp(_) => 0x70,
        Packet::Subscribe(_) => 0x82,
        Packet::SubAck(_) => 0x90,
        Packet::Unsubscribe(_) => 0xA2,
        Packet::UnsubAck(_) => 0xB0,
        Packet::PingReq => 0xC0,
        Packet::PingResp => 0xD0,
        Packet::Disconnect(_) => 0xE0,
        Packet::Auth(_) => {
            if !protocol.is_v5() {
                return Err(EncodeError::WrongProtocol);
            }
            0xF0
        }
    })
}

fn body<O: Out>(o: &mut O, packet: &Packet, protocol: Protocol) -> Result<(), EncodeError> {
    let v5 = protocol.is_v5();
    match packet {
        Packet::Connect(c) => connect(o, c),
        Packet::ConnAck(c) => connack(o, c, protocol),
        Packet::Publish(p) => {
            let v = PubView {
                dup: p.dup,
                qos: p.qos,
                retain: p.retain,
                packet_id: p.packet_id,
                topic: p.topic.as_bytes(),
                props: &p.properties,
                ovr: Ovr::of(&p.properties),
            };
            publish_var_header(o, &v, protocol)?;
            o.slice(&p.payload);
            Ok(())
        }
        Packet::PubAck(a) | Packet::PubRec(a) => ack(o, a, v5, ReasonCode::valid_in_puback),
        Packet::PubRel(a) | Packet::PubComp(a) => ack(o, a, v5, ReasonCode::valid_in_pubrel),
        Packet::Subscribe(s) => subscribe(o, s, v5),
        Packet::SubAck(s) => suback(o, s, v5),
        Packet::Unsubscribe(u) => {
            pid(o, u.packet_id)?;
            if v5 {
                props(o, &u.properties, Ctx::Unsubscribe, Ovr::of(&u.properties))?;
            }
            if u.filters.is_empty() {
                return Err(EncodeError::Invalid("UNSUBSCRIBE without topic filters"));
            }
            for f in &u.filters {
                string(o, f.as_bytes())?;
            }
            Ok(())
        }
        Packet::UnsubAck(u) => {
            pid(o, u.packet_id)?;
            if v5 {
                props(o, &u.properties, Ctx::UnsubAck, Ovr::of(&u.properties))?;
                if u.reasons.is_empty() {
                    return Err(EncodeError::Invalid("UNSUBACK without reason codes"));
                }
                for r in &u.reasons {
                    if !r.valid_in_unsuback() {
                        return Err(EncodeError::Invalid("reason code not valid in UNSUBACK"));
                    }
                    o.u8(r.0);
                }
            }
            Ok(())
        }
        Packet::PingReq | Packet::PingResp => Ok(()),
        Packet::Disconnect(d) => {
            if v5 {
                if !d.reason.valid_in_disconnect() {
                    return Err(EncodeError::Invalid("reason code not valid in DISCONNECT"));
                }
                reason_and_props(o, d.reason, &d.properties, Ctx::Disconnect)?;
            }
            Ok(())
        }
        Packet::Auth(a) => {
            if !v5 {
                return Err(EncodeError::WrongProtocol);
            }
            if !a.reason.valid_in_auth() {
                return Err(EncodeError::Invalid("reason code not valid in AUTH"));
            }
            reason_and_props(o, a.reason, &a.properties, Ctx::Auth)
        }
    }
}

/// Reason code and properties, both left out when the reason is success
/// and there are no properties, the property length left out when there
/// are no properties.
fn reason_and_props<O: Out>(
    o: &mut O,
    reason: ReasonCode,
    p: &Properties,
    ctx: Ctx,
) -> Result<(), EncodeError> {
    let ovr = Ovr::of(p);
    let len = props_len(p, ctx, ovr)?;
    if reason == ReasonCode::SUCCESS && len == 0 {
        return Ok(());
    }
    o.u8(reason.0);
    if len > 0 {
        o.varint(len as u32);
        props_content(o, p, ctx, ovr)?;
    }
    Ok(())
}

fn connect<O: Out>(o: &mut O, c: &Connect) -> Result<(), EncodeError> {
    let (name, level): (&[u8], u8) = match c.protocol {
        Protocol::V31 => (b"MQIsdp", 3),
        Protocol::V311 => (b"MQTT", 4),
        Protocol::V5 => (b"MQTT", 5),
    };
    let level = if c.bridge { level | 0x80 } else { level };
    let v5 = c.protocol.is_v5();
    if !v5 && c.password.is_some() && c.username.is_none() {
        return Err(EncodeError::Invalid(
            "password without user name (MQTT 3.x)",
        ));
    }
    let mut flags = 0u8;
    if c.clean_start {
        flags |= 0x02;
    }
    if let Some(w) = &c.will {
        flags |= 0x04 | ((w.qos as u8) << 3);
        if w.retain {
            flags |= 0x20;
        }
    }
    if c.password.is_some() {
        flags |= 0x40;
    }
    if c.username.is_some() {
        flags |= 0x80;
    }
    string(o, name)?;
    o.u8(level);
    o.u8(flags);
    o.u16(c.keep_alive);
    if v5 {
        props(o, &c.properties, Ctx::Connect, Ovr::of(&c.properties))?;
    }
    string(o, c.client_id.as_bytes())?;
    if let Some(w) = &c.will {
        if v5 {
            props(o, &w.properties, Ctx::Will, Ovr::of(&w.properties))?;
        }
        if validate_topic_name(&w.topic).is_err() {
            return Err(EncodeError::Invalid("will topic is not a valid topic name"));
        }
        string(o, w.topic.as_bytes())?;
        binary(o, &w.payload)?;
    }
    if let Some(u) = &c.username {
        string(o, u.as_bytes())?;
    }
    if let Some(p) = &c.password {
        binary(o, p)?;
    }
    Ok(())
}

fn connack<O: Out>(o: &mut O, c: &ConnAck, protocol: Protocol) -> Result<(), EncodeError> {
    if c.session_present && c.reason != ReasonCode::SUCCESS {
        return Err(EncodeError::Invalid(
            "CONNACK with Session Present and an error code",
        ));
    }
    match protocol {
        Protocol::V5 => {
            if !c.reason.valid_in_connack() {
                return Err(EncodeError::Invalid("reason code not valid in CONNACK"));
            }
            o.u8(u8::from(c.session_present));
            o.u8(c.reason.0);
            props(o, &c.properties, Ctx::ConnAck, Ovr::of(&c.properties))
        }
        Protocol::V311 => {
            o.u8(u8::from(c.session_present));
            o.u8(v3_connack_code(c.reason));
            Ok(())
        }
        Protocol::V31 => {
            o.u8(0);
            o.u8(v3_connack_code(c.reason));
            Ok(())
        }
    }
}

fn ack<O: Out>(
    o: &mut O,
    a: &Ack,
    v5: bool,
    valid: fn(ReasonCode) -> bool,
) -> Result<(), EncodeError> {
    pid(o, a.packet_id)?;
    if v5 {
        if !valid(a.reason) {
            return Err(EncodeError::Invalid(
                "reason code not valid for this acknowledgement",
            ));
        }
        reason_and_props(o, a.reason, &a.properties, Ctx::Ack)?;
    }
    Ok(())
}

fn subscribe<O: Out>(o: &mut O, s: &Subscribe, v5: bool) -> Result<(), EncodeError> {
    pid(o, s.packet_id)?;
    if v5 {
        props(o, &s.properties, Ctx::Subscribe, Ovr::of(&s.properties))?;
    }
    if s.filters.is_empty() {
        return Err(EncodeError::Invalid("SUBSCRIBE without topic filters"));
    }
    for (f, opt) in &s.filters {
        string(o, f.as_bytes())?;
        let mut b = opt.qos as u8;
        if v5 {
            if opt.retain_handling > 2 {
                return Err(EncodeError::Invalid("retain handling over 2"));
            }
            if opt.no_local && split_shared(f).is_some() {
                return Err(EncodeError::Invalid("No Local on a shared subscription"));
            }
            b |= (u8::from(opt.no_local) << 2)
                | (u8::from(opt.retain_as_published) << 3)
                | (opt.retain_handling << 4);
        }
        o.u8(b);
    }
    Ok(())
}

fn suback<O: Out>(o: &mut O, s: &SubAck, v5: bool) -> Result<(), EncodeError> {
    pid(o, s.packet_id)?;
    if v5 {
        props(o, &s.properties, Ctx::SubAck, Ovr::of(&s.properties))?;
    }
    if s.reasons.is_empty() {
        return Err(EncodeError::Invalid("SUBACK without reason codes"));
    }
    for r in &s.reasons {
        if v5 {
            if !r.valid_in_suback() {
                return Err(EncodeError::Invalid("reason code not valid in SUBACK"));
            }
            o.u8(r.0);
        } else {
            o.u8(v3_suback_code(*r));
        }
    }
    Ok(())
}

#[inline]
fn pid<O: Out>(o: &mut O, id: u16) -> Result<(), EncodeError> {
    if id == 0 {
        return Err(EncodeError::Invalid("packet identifier 0"));
    }
    o.u16(id);
    Ok(())
}

#[inline]
fn string<O: Out>(o: &mut O, s: &[u8]) -> Result<(), EncodeError> {
    if s.len() > 65535 {
        return Err(EncodeError::Invalid("string longer than 65535 bytes"));
    }
    o.u16(s.len() as u16);
    o.slice(s);
    Ok(())
}

#[inline]
fn binary<O: Out>(o: &mut O, s: &[u8]) -> Result<(), EncodeError> {
    if s.len() > 65535 {
        return Err(EncodeError::Invalid("binary data longer than 65535 bytes"));
    }
    o.u16(s.len() as u16);
    o.slice(s);
    Ok(())
}

/// Property length then properties.
fn props<O: Out>(o: &mut O, p: &Properties, ctx: Ctx, ovr: Ovr<'_>) -> Result<(), EncodeError> {
    let len = props_len(p, ctx, ovr)?;
    o.varint(len as u32);
    if len > 0 {
        props_content(o, p, ctx, ovr)?;
    }
    Ok(())
}

fn props_len(p: &Properties, ctx: Ctx, ovr: Ovr<'_>) -> Result<usize, EncodeError> {
    let mut c = Counter(0);
    props_content(&mut c, p, ctx, ovr)?;
    if c.0 > MAX_REMAINING_LENGTH as usize {
        return Err(EncodeError::TooLarge);
    }
    Ok(c.0)
}

fn nonzero_msg(pid: u8) -> &'static str {
    match pid {
        id::RECEIVE_MAXIMUM => "receive maximum 0",
        id::TOPIC_ALIAS => "topic alias 0",
        id::MAXIMUM_PACKET_SIZE => "maximum packet size 0",
        _ => "property value 0",
    }
}

#[inline]
fn flag_byte(v: u8) -> Result<u8, EncodeError> {
    if v > 1 {
        return Err(EncodeError::Invalid("property value must be 0 or 1"));
    }
    Ok(v)
}

fn props_content<O: Out>(
    o: &mut O,
    p: &Properties,
    ctx: Ctx,
    ovr: Ovr<'_>,
) -> Result<(), EncodeError> {
    let allowed = ctx.allowed();
    let has = |id: u8| allowed & (1u64 << id) != 0;

    macro_rules! byte01 {
        ($id:expr, $field:expr) => {
            if let Some(v) = $field {
                if has($id) {
                    o.u8($id);
                    o.u8(flag_byte(v)?);
                }
            }
        };
    }
    macro_rules! u16p {
        ($id:expr, $field:expr, $nonzero:expr) => {
            if let Some(v) = $field {
                if has($id) {
                    if $nonzero && v == 0 {
                        return Err(EncodeError::Invalid(nonzero_msg($id)));
                    }
                    o.u8($id);
                    o.u16(v);
                }
            }
        };
    }
    macro_rules! u32p {
        ($id:expr, $field:expr, $nonzero:expr) => {
            if let Some(v) = $field {
                if has($id) {
                    if $nonzero && v == 0 {
                        return Err(EncodeError::Invalid(nonzero_msg($id)));
                    }
                    o.u8($id);
                    o.u32(v);
                }
            }
        };
    }
    macro_rules! strp {
        ($id:expr, $field:expr) => {
            if let Some(v) = &$field {
                if has($id) {
                    o.u8($id);
                    string(o, v.as_bytes())?;
                }
            }
        };
    }
    macro_rules! binp {
        ($id:expr, $field:expr) => {
            if let Some(v) = &$field {
                if has($id) {
                    o.u8($id);
                    binary(o, v)?;
                }
            }
        };
    }

    byte01!(id::PAYLOAD_FORMAT_INDICATOR, p.payload_format_indicator);
    u32p!(
        id::MESSAGE_EXPIRY_INTERVAL,
        ovr.message_expiry_interval,
        false
    );
    strp!(id::CONTENT_TYPE, p.content_type);
    if let Some(t) = &p.response_topic {
        if has(id::RESPONSE_TOPIC) {
            if validate_topic_name(t).is_err() {
                return Err(EncodeError::Invalid("response topic is not a topic name"));
            }
            o.u8(id::RESPONSE_TOPIC);
            string(o, t.as_bytes())?;
        }
    }
    binp!(id::CORRELATION_DATA, p.correlation_data);
    if has(id::SUBSCRIPTION_IDENTIFIER) {
        let ids = ovr.subscription_identifiers;
        if ctx == Ctx::Subscribe && ids.len() > 1 {
            return Err(EncodeError::Invalid(
                "more than one subscription identifier in SUBSCRIBE",
            ));
        }
        for &v in ids {
            if v == 0 || v > MAX_REMAINING_LENGTH {
                return Err(EncodeError::Invalid(
                    "subscription identifier outside 1..=268435455",
                ));
            }
            o.u8(id::SUBSCRIPTION_IDENTIFIER);
            o.varint(v);
        }
    }
    u32p!(
        id::SESSION_EXPIRY_INTERVAL,
        p.session_expiry_interval,
        false
    );
    strp!(id::ASSIGNED_CLIENT_IDENTIFIER, p.assigned_client_identifier);
    u16p!(id::SERVER_KEEP_ALIVE, p.server_keep_alive, false);
    strp!(id::AUTHENTICATION_METHOD, p.authentication_method);
    if p.authentication_data.is_some()
        && p.authentication_method.is_none()
        && has(id::AUTHENTICATION_DATA)
    {
        return Err(EncodeError::Invalid(
            "authentication data without authentication method",
        ));
    }
    binp!(id::AUTHENTICATION_DATA, p.authentication_data);
    byte01!(
        id::REQUEST_PROBLEM_INFORMATION,
        p.request_problem_information
    );
    u32p!(id::WILL_DELAY_INTERVAL, p.will_delay_interval, false);
    byte01!(
        id::REQUEST_RESPONSE_INFORMATION,
        p.request_response_information
    );
    strp!(id::RESPONSE_INFORMATION, p.response_information);
    strp!(id::SERVER_REFERENCE, p.server_reference);
    strp!(id::REASON_STRING, p.reason_string);
    u16p!(id::RECEIVE_MAXIMUM, p.receive_maximum, true);
    u16p!(id::TOPIC_ALIAS_MAXIMUM, p.topic_alias_maximum, false);
    u16p!(id::TOPIC_ALIAS, ovr.topic_alias, true);
    byte01!(id::MAXIMUM_QOS, p.maximum_qos);
    byte01!(id::RETAIN_AVAILABLE, p.retain_available);
    if has(id::USER_PROPERTY) {
        for (k, v) in &p.user_properties {
            o.u8(id::USER_PROPERTY);
            string(o, k.as_bytes())?;
            string(o, v.as_bytes())?;
        }
    }
    u32p!(id::MAXIMUM_PACKET_SIZE, p.maximum_packet_size, true);
    byte01!(
        id::WILDCARD_SUBSCRIPTION_AVAILABLE,
        p.wildcard_subscription_available
    );
    byte01!(
        id::SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        p.subscription_identifier_available
    );
    byte01!(
        id::SHARED_SUBSCRIPTION_AVAILABLE,
        p.shared_subscription_available
    );
    Ok(())
}

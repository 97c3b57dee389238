//! Decoding one complete frame into a [`Packet`], zero-copy.
//!
//! # What is checked, and with which reason code
//!
//! | problem | code |
//! | --- | --- |
//! | field runs past the end, trailing bytes after the body, bad fixed-header flags, reserved bits set, QoS 3, DUP at QoS 0, invalid UTF-8 or U+0000 in a string, unknown property or one the packet type may not carry, reason code not valid for the packet type, bad remaining length, AUTH under 3.x | 0x81 Malformed Packet |
//! | duplicated single-valued property, packet identifier 0 where one is required, Receive Maximum 0, Maximum Packet Size 0, Subscription Identifier 0, a 0/1 property with another value, Retain Handling 3, No Local on a shared subscription, SUBSCRIBE / UNSUBSCRIBE / SUBACK / UNSUBACK without entries, Authentication Data without Authentication Method, PUBLISH with empty topic and no Topic Alias (v5), CONNACK with Session Present and an error code, Response Topic with wildcards | 0x82 Protocol Error |
//! | CONNECT with an unknown protocol name or level (answer CONNACK 0x84, or return code 1 under 3.x) | 0x84 Unsupported Protocol Version |
//! | PUBLISH or will topic name with `+` / `#`, or empty (3.x, will) | 0x90 Topic Name Invalid |
//! | Topic Alias 0 | 0x94 Topic Alias Invalid |
//!
//! Under 3.x, where the wire has no reason codes, the connection is simply
//! closed; the code still tells logs and metrics why.
//!
//! Packet identifier 0 is a Protocol Error (0x82): the field is well formed,
//! its value breaks a rule of the protocol (\[MQTT-2.2.1-3\]).
//!
//! # What is left to the caller
//!
//! - **Topic filters** in SUBSCRIBE and UNSUBSCRIBE are checked only as
//!   UTF-8 strings (the no-local-on-shared rule aside). The broker calls
//!   [`crate::topic::validate_topic_filter`] per filter and answers 0x8F in
//!   SUBACK for the bad ones, which MQTT 5 allows and is kinder than
//!   closing the connection.
//! - Direction rules the decoder cannot see: a Subscription Identifier in a
//!   client's PUBLISH, a Session Expiry Interval in a server's DISCONNECT,
//!   Topic Alias over the negotiated maximum, a client id over 23 bytes.
//! - Payload Format Indicator 1 with a payload that is not UTF-8 (0x99),
//!   which the spec lets a receiver check or not.

use crate::error::DecodeError;
use crate::framing::parse_fixed_header;
use crate::packet::*;
use crate::properties::{Properties, Props};
use crate::reason::{connack_reason_from_v3, ReasonCode};
use crate::topic::{split_shared, validate_topic_name};
use crate::wire::{id, Ctx, Reader};
use bytes::{Buf, Bytes};

const TRAILING: DecodeError = DecodeError::malformed("trailing bytes after the packet body");
const PID_ZERO: DecodeError = DecodeError::protocol("packet identifier 0");
const DUPLICATE: DecodeError = DecodeError::protocol("property included more than once");

/// Decode one complete packet. `frame` must be exactly the bytes that
/// [`crate::frame`] reported as `Complete(len)` (fixed header included).
///
/// `protocol` is the connection's version; a CONNECT is decoded by the
/// version it announces itself, whatever `protocol` says. Topic names,
/// payloads, binary data and strings in the result are slices of `frame`.
///
/// The maximum packet size is not checked here (that is [`crate::frame`]'s
/// job). A frame longer or shorter than its remaining length says is 0x81.
/// See the module documentation for every check and its reason code.
pub fn decode(frame: Bytes, protocol: Protocol) -> Result<Packet, DecodeError> {
    let (first, remaining, header_len) = parse_fixed_header(&frame)?;
    let total = header_len + remaining as usize;
    if frame.len() != total {
        return Err(DecodeError::malformed(
            "frame length differs from its remaining length",
        ));
    }
    let v5 = protocol.is_v5();
    if first & 0x08 != 0 && matches!(first >> 4, 6 | 8 | 10) && protocol != Protocol::V31 {
        // MQTT 3.1 lets a client set DUP on a resent PUBREL, SUBSCRIBE or
        // UNSUBSCRIBE (3.1 §2.1); 3.1.1 and 5 fix these flags at 0b0010.
        return Err(DecodeError::malformed(
            "PUBREL/SUBSCRIBE/UNSUBSCRIBE fixed header flags must be 0b0010",
        ));
    }
    // PUBLISH first and in tail position: it is the hot path, and returning
    // it straight from here lets the compiler build it in place.
    if first >> 4 == 3 {
        return publish(frame, header_len, total, first, v5);
    }
    let mut r = Reader::new(&frame, header_len, total);
    let packet = match first >> 4 {
        1 => Packet::Connect(Box::new(connect(&mut r)?)),
        2 => Packet::ConnAck(connack(&mut r, protocol)?),
        4 => Packet::PubAck(ack(&mut r, v5, ReasonCode::valid_in_puback)?),
        5 => Packet::PubRec(ack(&mut r, v5, ReasonCode::valid_in_puback)?),
        6 => Packet::PubRel(ack(&mut r, v5, ReasonCode::valid_in_pubrel)?),
        7 => Packet::PubComp(ack(&mut r, v5, ReasonCode::valid_in_pubrel)?),
        8 => Packet::Subscribe(subscribe(&mut r, v5)?),
        9 => Packet::SubAck(suback(&mut r, v5)?),
        10 => Packet::Unsubscribe(unsubscribe(&mut r, v5)?),
        11 => Packet::UnsubAck(unsuback(&mut r, v5)?),
        12 => Packet::PingReq,
        13 => Packet::PingResp,
        14 => Packet::Disconnect(disconnect(&mut r, v5)?),
        15 if v5 => Packet::Auth(auth(&mut r)?),
        15 => return Err(DecodeError::malformed("AUTH is an MQTT 5 packet")),
        _ => return Err(DecodeError::malformed("reserved packet type")),
    };
    if r.remaining() != 0 {
        return Err(TRAILING);
    }
    Ok(packet)
}

#[inline]
fn nonzero_pid(r: &mut Reader<'_>) -> Result<u16, DecodeError> {
    match r.u16()? {
        0 => Err(PID_ZERO),
        id => Ok(id),
    }
}

fn connect(r: &mut Reader<'_>) -> Result<Connect, DecodeError> {
    let name = r.binary()?;
    let level = r.u8()?;
    // The top bit marks a bridge (mosquitto's `try_private`).
    let bridge = level & 0x80 != 0;
    let protocol = match (&name[..], level & 0x7F) {
        (b"MQIsdp", 3) => Protocol::V31,
        (b"MQTT", 4) => Protocol::V311,
        (b"MQTT", 5) => Protocol::V5,
        _ => {
            return Err(DecodeError::new(
                ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
                "unsupported protocol name or level",
            ))
        }
    };
    let v5 = protocol.is_v5();
    let flags = r.u8()?;
    if flags & 0x01 != 0 {
        return Err(DecodeError::malformed("CONNECT reserved flag set"));
    }
    let clean_start = flags & 0x02 != 0;
    let will_flag = flags & 0x04 != 0;
    let will_qos_bits = (flags >> 3) & 0x03;
    let will_retain = flags & 0x20 != 0;
    let has_password = flags & 0x40 != 0;
    let has_username = flags & 0x80 != 0;
    let Some(will_qos) = QoS::from_u8(will_qos_bits) else {
        return Err(DecodeError::malformed("will QoS 3"));
    };
    if !will_flag && (will_qos_bits != 0 || will_retain) {
        return Err(DecodeError::malformed(
            "will QoS or will retain set without the will flag",
        ));
    }
    if !v5 && has_password && !has_username {
        return Err(DecodeError::malformed(
            "password flag without user name flag (MQTT 3.x)",
        ));
    }
    let keep_alive = r.u16()?;
    let properties = if v5 {
        read_properties(r, Ctx::Connect)?
    } else {
        Props::new()
    };
    let client_id = r.string()?;
    let will = if will_flag {
        let properties = if v5 {
            read_properties(r, Ctx::Will)?
        } else {
            Props::new()
        };
        let topic = r.string()?;
        validate_topic_name(&topic)?;
        let payload = r.binary()?;
        Some(Will {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            properties,
        })
    } else {
        None
    };
    let username = if has_username {
        Some(r.string()?)
    } else {
        None
    };
    let password = if has_password {
        Some(r.binary()?)
    } else {
        None
    };
    Ok(Connect {
        protocol,
        clean_start,
        keep_alive,
        properties,
        client_id,
        will,
        username,
        password,
        bridge,
    })
}

fn connack(r: &mut Reader<'_>, protocol: Protocol) -> Result<ConnAck, DecodeError> {
    let flags = r.u8()?;
    let code = r.u8()?;
    let session_present = match protocol {
        // MQTT 3.1: the first byte is reserved (no Session Present).
        Protocol::V31 => false,
        _ => {
            if flags & 0xFE != 0 {
                return Err(DecodeError::malformed("CONNACK reserved flags set"));
            }
            flags & 0x01 != 0
        }
    };
    let (reason, properties) = if protocol.is_v5() {
        let reason = ReasonCode(code);
        if !reason.valid_in_connack() {
            return Err(DecodeError::malformed("reason code not valid in CONNACK"));
        }
        (reason, read_properties(r, Ctx::ConnAck)?)
    } else {
        let Some(reason) = connack_reason_from_v3(code) else {
            return Err(DecodeError::malformed("reserved CONNACK return code"));
        };
        (reason, Props::new())
    };
    if session_present && reason != ReasonCode::SUCCESS {
        return Err(DecodeError::protocol(
            "CONNACK with Session Present and an error code",
        ));
    }
    Ok(ConnAck {
        session_present,
        reason,
        properties,
    })
}

/// The payload: the frame itself advanced past the headers, so it costs no
/// reference count (and an empty payload does not pin the frame).
#[inline]
fn payload_of(mut frame: Bytes, at: usize) -> Bytes {
    if at >= frame.len() {
        return Bytes::new();
    }
    frame.advance(at);
    frame
}

fn publish(
    frame: Bytes,
    header_len: usize,
    total: usize,
    first: u8,
    v5: bool,
) -> Result<Packet, DecodeError> {
    let dup = first & 0x08 != 0;
    let retain = first & 0x01 != 0;
    let Some(qos) = QoS::from_u8((first >> 1) & 0x03) else {
        return Err(DecodeError::malformed("PUBLISH with QoS 3"));
    };
    if dup && qos == QoS::AtMostOnce {
        return Err(DecodeError::malformed("PUBLISH with DUP at QoS 0"));
    }
    let mut r = Reader::new(&frame, header_len, total);
    let topic = r.topic_name()?;
    let packet_id = if qos == QoS::AtMostOnce {
        0
    } else {
        nonzero_pid(&mut r)?
    };
    let mut properties = Props::new();
    if v5 {
        let len = r.varint()? as usize;
        if len > 0 {
            // The one allocation of a PUBLISH with properties: the list is
            // read straight into its box (first mutable access allocates).
            read_property_list(&mut r, Ctx::Publish, &mut properties, len)?;
        }
    }
    if topic.is_empty() && properties.topic_alias.is_none() {
        return Err(if v5 {
            DecodeError::protocol("empty topic name without a topic alias")
        } else {
            DecodeError::new(ReasonCode::TOPIC_NAME_INVALID, "empty topic name")
        });
    }
    let at = r.position();
    let payload = payload_of(frame, at);
    // Without properties nothing is allocated: `properties` is a null pointer.
    Ok(Packet::Publish(Publish {
        dup,
        qos,
        retain,
        topic,
        packet_id,
        properties,
        payload,
    }))
}

fn ack(r: &mut Reader<'_>, v5: bool, valid: fn(ReasonCode) -> bool) -> Result<Ack, DecodeError> {
    let packet_id = nonzero_pid(r)?;
    let mut ack = Ack {
        packet_id,
        ..Ack::default()
    };
    if v5 && r.remaining() > 0 {
        ack.reason = ReasonCode(r.u8()?);
        if !valid(ack.reason) {
            return Err(DecodeError::malformed(
                "reason code not valid for this acknowledgement",
            ));
        }
        if r.remaining() > 0 {
            ack.properties = read_properties(r, Ctx::Ack)?;
        }
    }
    Ok(ack)
}

fn subscribe(r: &mut Reader<'_>, v5: bool) -> Result<Subscribe, DecodeError> {
    let packet_id = nonzero_pid(r)?;
    let properties = if v5 {
        read_properties(r, Ctx::Subscribe)?
    } else {
        Props::new()
    };
    let mut filters = Vec::new();
    while r.remaining() > 0 {
        let filter = r.string()?;
        let o = r.u8()?;
        let Some(qos) = QoS::from_u8(o & 0x03) else {
            return Err(DecodeError::malformed("subscription with QoS 3"));
        };
        let options = if v5 {
            if o & 0xC0 != 0 {
                return Err(DecodeError::malformed(
                    "reserved subscription option bits set",
                ));
            }
            let retain_handling = (o >> 4) & 0x03;
            if retain_handling == 3 {
                return Err(DecodeError::protocol("retain handling 3"));
            }
            let no_local = o & 0x04 != 0;
            if no_local && split_shared(&filter).is_some() {
                return Err(DecodeError::protocol("No Local on a shared subscription"));
            }
            SubscriptionOptions {
                qos,
                no_local,
                retain_as_published: o & 0x08 != 0,
                retain_handling,
            }
        } else {
            if o & 0xFC != 0 {
                return Err(DecodeError::malformed(
                    "reserved subscription option bits set",
                ));
            }
            SubscriptionOptions {
                qos,
                ..SubscriptionOptions::default()
            }
        };
        filters.push((filter, options));
    }
    if filters.is_empty() {
        return Err(DecodeError::protocol("SUBSCRIBE without topic filters"));
    }
    Ok(Subscribe {
        packet_id,
        properties,
        filters,
    })
}

fn suback(r: &mut Reader<'_>, v5: bool) -> Result<SubAck, DecodeError> {
    let packet_id = nonzero_pid(r)?;
    let properties = if v5 {
        read_properties(r, Ctx::SubAck)?
    } else {
        Props::new()
    };
    let mut reasons = Vec::with_capacity(r.remaining());
    while r.remaining() > 0 {
        let code = ReasonCode(r.u8()?);
        let ok = if v5 {
            code.valid_in_suback()
        } else {
            matches!(code.0, 0x00..=0x02 | 0x80)
        };
        if !ok {
            return Err(DecodeError::malformed("reason code not valid in SUBACK"));
        }
        reasons.push(code);
    }
    if reasons.is_empty() {
        return Err(DecodeError::protocol("SUBACK without return codes"));
    }
    Ok(SubAck {
        packet_id,
        properties,
        reasons,
    })
}

fn unsubscribe(r: &mut Reader<'_>, v5: bool) -> Result<Unsubscribe, DecodeError> {
    let packet_id = nonzero_pid(r)?;
    let properties = if v5 {
        read_properties(r, Ctx::Unsubscribe)?
    } else {
        Props::new()
    };
    let mut filters = Vec::new();
    while r.remaining() > 0 {
        filters.push(r.string()?);
    }
    if filters.is_empty() {
        return Err(DecodeError::protocol("UNSUBSCRIBE without topic filters"));
    }
    Ok(Unsubscribe {
        packet_id,
        properties,
        filters,
    })
}

fn unsuback(r: &mut Reader<'_>, v5: bool) -> Result<UnsubAck, DecodeError> {
    let packet_id = nonzero_pid(r)?;
    if !v5 {
        return Ok(UnsubAck {
            packet_id,
            ..UnsubAck::default()
        });
    }
    let properties = read_properties(r, Ctx::UnsubAck)?;
    let mut reasons = Vec::with_capacity(r.remaining());
    while r.remaining() > 0 {
        let code = ReasonCode(r.u8()?);
        if !code.valid_in_unsuback() {
            return Err(DecodeError::malformed("reason code not valid in UNSUBACK"));
        }
        reasons.push(code);
    }
    if reasons.is_empty() {
        return Err(DecodeError::protocol("UNSUBACK without reason codes"));
    }
    Ok(UnsubAck {
        packet_id,
        properties,
        reasons,
    })
}

fn disconnect(r: &mut Reader<'_>, v5: bool) -> Result<Disconnect, DecodeError> {
    let mut d = Disconnect::default();
    if v5 && r.remaining() > 0 {
        d.reason = ReasonCode(r.u8()?);
        if !d.reason.valid_in_disconnect() {
            return Err(DecodeError::malformed(
                "reason code not valid in DISCONNECT",
            ));
        }
        if r.remaining() > 0 {
            d.properties = read_properties(r, Ctx::Disconnect)?;
        }
    }
    Ok(d)
}

fn auth(r: &mut Reader<'_>) -> Result<Auth, DecodeError> {
    let mut a = Auth::default();
    if r.remaining() > 0 {
        a.reason = ReasonCode(r.u8()?);
        if !a.reason.valid_in_auth() {
            return Err(DecodeError::malformed("reason code not valid in AUTH"));
        }
        if r.remaining() > 0 {
            a.properties = read_properties(r, Ctx::Auth)?;
        }
    }
    Ok(a)
}

#[inline]
fn once<T>(slot: &mut Option<T>, v: T) -> Result<(), DecodeError> {
    if slot.is_some() {
        return Err(DUPLICATE);
    }
    *slot = Some(v);
    Ok(())
}

#[inline]
fn bool_byte(r: &mut Reader<'_>) -> Result<u8, DecodeError> {
    match r.u8()? {
        v @ (0 | 1) => Ok(v),
        _ => Err(DecodeError::protocol("property value must be 0 or 1")),
    }
}

/// A property list: Variable Byte Integer length, then properties, read
/// straight into their box; an empty list allocates nothing.
fn read_properties(r: &mut Reader<'_>, ctx: Ctx) -> Result<Props, DecodeError> {
    let len = r.varint()? as usize;
    let mut p = Props::new();
    if len > 0 {
        read_property_list(r, ctx, &mut p, len)?;
    }
    Ok(p)
}

fn read_property_list(
    r: &mut Reader<'_>,
    ctx: Ctx,
    p: &mut Properties,
    len: usize,
) -> Result<(), DecodeError> {
    let mut r = r.sub(len)?;
    while r.remaining() > 0 {
        let pid = r.u8()?;
        if !ctx.allows(pid) {
            return Err(DecodeError::malformed(
                "property unknown or not allowed in this packet",
            ));
        }
        match pid {
            id::PAYLOAD_FORMAT_INDICATOR => {
                let v = bool_byte(&mut r)?;
                once(&mut p.payload_format_indicator, v)?
            }
            id::MESSAGE_EXPIRY_INTERVAL => once(&mut p.message_expiry_interval, r.u32()?)?,
            id::CONTENT_TYPE => once(&mut p.content_type, r.string()?)?,
            id::RESPONSE_TOPIC => {
                let t = r.string()?;
                if validate_topic_name(&t).is_err() {
                    return Err(DecodeError::protocol("response topic is not a topic name"));
                }
                once(&mut p.response_topic, t)?
            }
            id::CORRELATION_DATA => once(&mut p.correlation_data, r.binary()?)?,
            id::SUBSCRIPTION_IDENTIFIER => {
                let v = r.varint()?;
                if v == 0 {
                    return Err(DecodeError::protocol("subscription identifier 0"));
                }
                if ctx == Ctx::Subscribe && !p.subscription_identifiers.is_empty() {
                    return Err(DUPLICATE);
                }
                p.subscription_identifiers.push(v);
            }
            id::SESSION_EXPIRY_INTERVAL => once(&mut p.session_expiry_interval, r.u32()?)?,
            id::ASSIGNED_CLIENT_IDENTIFIER => once(&mut p.assigned_client_identifier, r.string()?)?,
            id::SERVER_KEEP_ALIVE => once(&mut p.server_keep_alive, r.u16()?)?,
            id::AUTHENTICATION_METHOD => once(&mut p.authentication_method, r.string()?)?,
            id::AUTHENTICATION_DATA => once(&mut p.authentication_data, r.binary()?)?,
            id::REQUEST_PROBLEM_INFORMATION => {
                let v = bool_byte(&mut r)?;
                once(&mut p.request_problem_information, v)?
            }
            id::WILL_DELAY_INTERVAL => once(&mut p.will_delay_interval, r.u32()?)?,
            id::REQUEST_RESPONSE_INFORMATION => {
                let v = bool_byte(&mut r)?;
                once(&mut p.request_response_information, v)?
            }
            id::RESPONSE_INFORMATION => once(&mut p.response_information, r.string()?)?,
            id::SERVER_REFERENCE => once(&mut p.server_reference, r.string()?)?,
            id::REASON_STRING => once(&mut p.reason_string, r.string()?)?,
            id::RECEIVE_MAXIMUM => {
                let v = r.u16()?;
                if v == 0 {
                    return Err(DecodeError::protocol("receive maximum 0"));
                }
                once(&mut p.receive_maximum, v)?
            }
            id::TOPIC_ALIAS_MAXIMUM => once(&mut p.topic_alias_maximum, r.u16()?)?,
            id::TOPIC_ALIAS => {
                let v = r.u16()?;
                if v == 0 {
                    return Err(DecodeError::new(
                        ReasonCode::TOPIC_ALIAS_INVALID,
                        "topic alias 0",
                    ));
                }
                once(&mut p.topic_alias, v)?
            }
            id::MAXIMUM_QOS => {
                let v = bool_byte(&mut r)?;
                once(&mut p.maximum_qos, v)?
            }
            id::RETAIN_AVAILABLE => {
                let v = bool_byte(&mut r)?;
                once(&mut p.retain_available, v)?
            }
            id::USER_PROPERTY => {
                let k = r.string()?;
                let v = r.string()?;
                p.user_properties.push((k, v));
            }
            id::MAXIMUM_PACKET_SIZE => {
                let v = r.u32()?;
                if v == 0 {
                    return Err(DecodeError::protocol("maximum packet size 0"));
                }
                once(&mut p.maximum_packet_size, v)?
            }
            id::WILDCARD_SUBSCRIPTION_AVAILABLE => {
                let v = bool_byte(&mut r)?;
                once(&mut p.wildcard_subscription_available, v)?
            }
            id::SUBSCRIPTION_IDENTIFIER_AVAILABLE => {
                let v = bool_byte(&mut r)?;
                once(&mut p.subscription_identifier_available, v)?
            }
            id::SHARED_SUBSCRIPTION_AVAILABLE => {
                let v = bool_byte(&mut r)?;
                once(&mut p.shared_subscription_available, v)?
            }
            _ => {
                return Err(DecodeError::malformed(
                    "property unknown or not allowed in this packet",
                ))
            }
        }
    }
    if p.authentication_data.is_some() && p.authentication_method.is_none() {
        return Err(DecodeError::protocol(
            "authentication data without authentication method",
        ));
    }
    Ok(())
}

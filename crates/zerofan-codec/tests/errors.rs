//! Malformed inputs and the exact reason code each must produce.

use bytes::Bytes;
use zerofan_codec::framing::write_varint;
use zerofan_codec::*;

const V31: Protocol = Protocol::V31;
const V311: Protocol = Protocol::V311;
const V5: Protocol = Protocol::V5;

/// A packet with a correct remaining length around `body`.
fn pkt(first: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![first];
    write_varint(body.len() as u32, &mut v).unwrap();
    v.extend_from_slice(body);
    v
}

/// CONNECT body: header for `name`/`level`, `flags`, keep alive 60, then `rest`.
fn connect(name: &[u8], level: u8, flags: u8, rest: &[u8]) -> Vec<u8> {
    let mut b = vec![0, name.len() as u8];
    b.extend_from_slice(name);
    b.extend_from_slice(&[level, flags, 0, 60]);
    b.extend_from_slice(rest);
    pkt(0x10, &b)
}

#[test]
fn framing_errors() {
    let table: &[(&str, &[u8], u32, u8)] = &[
        ("reserved type 0", b"\x00\x00", u32::MAX, 0x81),
        ("PUBREL flags 0", b"\x60\x02\x00\x01", u32::MAX, 0x81),
        ("SUBSCRIBE flags 0", b"\x80\x00", u32::MAX, 0x81),
        ("UNSUBSCRIBE flags 0", b"\xa0\x00", u32::MAX, 0x81),
        ("PINGREQ flag set", b"\xc1\x00", u32::MAX, 0x81),
        ("CONNECT flag set", b"\x18\x00", u32::MAX, 0x81),
        ("AUTH flag set", b"\xf2\x00", u32::MAX, 0x81),
        ("PUBLISH QoS 3", b"\x36\x00", u32::MAX, 0x81),
        (
            "5-byte remaining length",
            b"\x30\xff\xff\xff\xff\x01",
            u32::MAX,
            0x81,
        ),
        (
            "non-minimal remaining length",
            b"\x30\x80\x00",
            u32::MAX,
            0x81,
        ),
        ("non-minimal 3 bytes", b"\x30\x81\x80\x00", u32::MAX, 0x81),
        ("268 MB announced", b"\x30\xff\xff\xff\x7f", 1 << 20, 0x95),
        ("one over the maximum", b"\x30\x0a", 11, 0x95),
    ];
    for (name, wire, max, code) in table {
        match frame(wire, *max) {
            Frame::Invalid(e) => assert_eq!(e.reason, ReasonCode(*code), "{name}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn framing_need_more() {
    assert_eq!(frame(b"", u32::MAX), Frame::NeedMore(2));
    assert_eq!(frame(b"\x30", u32::MAX), Frame::NeedMore(1));
    assert_eq!(frame(b"\x30\x80", u32::MAX), Frame::NeedMore(1));
    assert_eq!(frame(b"\x30\x05\x00\x03", u32::MAX), Frame::NeedMore(3));
    assert_eq!(frame(b"\x30\x0a", 12), Frame::NeedMore(10));
    assert_eq!(frame(b"\xc0\x00\xd0\x00", 2), Frame::Complete(2));
    // Exactly the maximum remaining length is fine.
    assert_eq!(
        frame(b"\x30\xff\xff\xff\x7f", u32::MAX),
        Frame::NeedMore(268_435_455)
    );
    // Type 15 frames (AUTH); decode decides by version.
    assert_eq!(frame(b"\xf0\x00", u32::MAX), Frame::Complete(2));
}

#[test]
fn decode_errors() {
    let abc: &[u8] = b"\x00\x03abc";
    let table: Vec<(&str, Protocol, Vec<u8>, u8)> = vec![
        // CONNECT
        ("unknown level 6", V311, connect(b"MQTT", 6, 2, abc), 0x84),
        ("MQTT level 3", V311, connect(b"MQTT", 3, 2, abc), 0x84),
        ("MQIsdp level 4", V311, connect(b"MQIsdp", 4, 2, abc), 0x84),
        ("bad protocol name", V311, connect(b"MQTX", 4, 2, abc), 0x84),
        (
            "bridge bit on an unknown level",
            V311,
            connect(b"MQTT", 0x86, 2, abc),
            0x84,
        ),
        ("reserved flag", V311, connect(b"MQTT", 4, 0x03, abc), 0x81),
        (
            "reserved flag v5",
            V5,
            connect(b"MQTT", 5, 0x03, b"\x00\x00\x03abc"),
            0x81,
        ),
        (
            "will QoS without will",
            V311,
            connect(b"MQTT", 4, 0x0a, abc),
            0x81,
        ),
        (
            "will retain without will",
            V311,
            connect(b"MQTT", 4, 0x22, abc),
            0x81,
        ),
        ("will QoS 3", V311, connect(b"MQTT", 4, 0x1e, abc), 0x81),
        (
            "password without user name 3.1.1",
            V311,
            connect(b"MQTT", 4, 0x42, b"\x00\x03abc\x00\x02pw"),
            0x81,
        ),
        (
            "password without user name 3.1",
            V31,
            connect(b"MQIsdp", 3, 0x42, b"\x00\x03abc\x00\x02pw"),
            0x81,
        ),
        (
            "will topic with wildcard",
            V311,
            connect(b"MQTT", 4, 0x06, b"\x00\x03abc\x00\x03a/#\x00\x00"),
            0x90,
        ),
        (
            "empty will topic",
            V311,
            connect(b"MQTT", 4, 0x06, b"\x00\x03abc\x00\x00\x00\x00"),
            0x90,
        ),
        (
            "trailing byte",
            V311,
            connect(b"MQTT", 4, 2, b"\x00\x03abc\x00"),
            0x81,
        ),
        (
            "client id truncated",
            V311,
            connect(b"MQTT", 4, 2, b"\x00\x05abc"),
            0x81,
        ),
        (
            "username flag, no username",
            V311,
            connect(b"MQTT", 4, 0x82, abc),
            0x81,
        ),
        (
            "invalid UTF-8",
            V311,
            connect(b"MQTT", 4, 2, b"\x00\x03a\xffc"),
            0x81,
        ),
        (
            "U+0000",
            V311,
            connect(b"MQTT", 4, 2, b"\x00\x03a\x00c"),
            0x81,
        ),
        (
            "surrogate",
            V311,
            connect(b"MQTT", 4, 2, b"\x00\x03\xed\xa0\x80"),
            0x81,
        ),
        (
            "overlong UTF-8",
            V311,
            connect(b"MQTT", 4, 2, b"\x00\x02\xc0\xaf"),
            0x81,
        ),
        (
            "receive maximum 0",
            V5,
            connect(b"MQTT", 5, 2, b"\x03\x21\x00\x00\x00\x03abc"),
            0x82,
        ),
        (
            "maximum packet size 0",
            V5,
            connect(b"MQTT", 5, 2, b"\x05\x27\x00\x00\x00\x00\x00\x03abc"),
            0x82,
        ),
        (
            "duplicate session expiry",
            V5,
            connect(
                b"MQTT",
                5,
                2,
                b"\x0a\x11\x00\x00\x00\x01\x11\x00\x00\x00\x02\x00\x03abc",
            ),
            0x82,
        ),
        (
            "auth data without method",
            V5,
            connect(b"MQTT", 5, 2, b"\x04\x16\x00\x01x\x00\x03abc"),
            0x82,
        ),
        (
            "request problem information 2",
            V5,
            connect(b"MQTT", 5, 2, b"\x02\x17\x02\x00\x03abc"),
            0x82,
        ),
        (
            "topic alias in CONNECT",
            V5,
            connect(b"MQTT", 5, 2, b"\x03\x23\x00\x01\x00\x03abc"),
            0x81,
        ),
        (
            "will delay in CONNECT properties",
            V5,
            connect(b"MQTT", 5, 2, b"\x05\x18\x00\x00\x00\x01\x00\x03abc"),
            0x81,
        ),
        (
            "session expiry in will properties",
            V5,
            connect(
                b"MQTT",
                5,
                6,
                b"\x00\x00\x03abc\x05\x11\x00\x00\x00\x01\x00\x01t\x00\x00",
            ),
            0x81,
        ),
        (
            "property length past the end",
            V5,
            connect(b"MQTT", 5, 2, b"\x09\x00\x03abc"),
            0x81,
        ),
        (
            "4-byte property id varint",
            V5,
            connect(b"MQTT", 5, 2, b"\x02\x91\x01\x00\x03abc"),
            0x81,
        ),
        // CONNACK
        ("CONNACK reserved flags", V311, pkt(0x20, b"\x02\x00"), 0x81),
        ("CONNACK return code 6", V311, pkt(0x20, b"\x00\x06"), 0x81),
        (
            "session present with error",
            V311,
            pkt(0x20, b"\x01\x05"),
            0x82,
        ),
        ("CONNACK trailing", V311, pkt(0x20, b"\x00\x00\x00"), 0x81),
        (
            "CONNACK v5 reason 0x10",
            V5,
            pkt(0x20, b"\x00\x10\x00"),
            0x81,
        ),
        ("CONNACK v5 no properties", V5, pkt(0x20, b"\x00\x00"), 0x81),
        (
            "CONNACK v5 maximum QoS 2",
            V5,
            pkt(0x20, b"\x00\x00\x02\x24\x02"),
            0x82,
        ),
        // PUBLISH
        ("QoS 0 with DUP", V311, pkt(0x38, b"\x00\x01t"), 0x81),
        ("topic with +", V311, pkt(0x30, b"\x00\x03a/+"), 0x90),
        ("topic with #", V5, pkt(0x30, b"\x00\x01#\x00"), 0x90),
        ("empty topic 3.1.1", V311, pkt(0x30, b"\x00\x00"), 0x90),
        ("empty topic 3.1", V31, pkt(0x30, b"\x00\x00"), 0x90),
        (
            "empty topic, no alias",
            V5,
            pkt(0x30, b"\x00\x00\x00"),
            0x82,
        ),
        (
            "QoS 1 packet id 0",
            V311,
            pkt(0x32, b"\x00\x03a/b\x00\x00"),
            0x82,
        ),
        (
            "QoS 2 packet id 0 v5",
            V5,
            pkt(0x34, b"\x00\x03a/b\x00\x00\x00"),
            0x82,
        ),
        (
            "QoS 1 missing packet id",
            V311,
            pkt(0x32, b"\x00\x03a/b\x00"),
            0x81,
        ),
        (
            "topic alias 0",
            V5,
            pkt(0x30, b"\x00\x03a/b\x03\x23\x00\x00"),
            0x94,
        ),
        (
            "duplicate message expiry",
            V5,
            pkt(
                0x30,
                b"\x00\x01t\x0a\x02\x00\x00\x00\x01\x02\x00\x00\x00\x02",
            ),
            0x82,
        ),
        (
            "duplicate topic alias",
            V5,
            pkt(0x30, b"\x00\x01t\x06\x23\x00\x01\x23\x00\x02"),
            0x82,
        ),
        (
            "session expiry in PUBLISH",
            V5,
            pkt(0x30, b"\x00\x01t\x05\x11\x00\x00\x00\x01"),
            0x81,
        ),
        (
            "unknown property 0x05",
            V5,
            pkt(0x30, b"\x00\x01t\x02\x05\x00"),
            0x81,
        ),
        (
            "subscription id 0",
            V5,
            pkt(0x30, b"\x00\x01t\x02\x0b\x00"),
            0x82,
        ),
        (
            "payload format 2",
            V5,
            pkt(0x30, b"\x00\x01t\x02\x01\x02"),
            0x82,
        ),
        (
            "response topic with wildcard",
            V5,
            pkt(0x30, b"\x00\x01t\x04\x08\x00\x01#"),
            0x82,
        ),
        (
            "property length past end",
            V5,
            pkt(0x30, b"\x00\x03a/b\x05"),
            0x81,
        ),
        (
            "user property without value",
            V5,
            pkt(0x30, b"\x00\x01t\x04\x26\x00\x01k"),
            0x81,
        ),
        (
            "content type invalid UTF-8",
            V5,
            pkt(0x30, b"\x00\x01t\x04\x03\x00\x01\xff"),
            0x81,
        ),
        // Acks
        (
            "PUBACK v3 with reason",
            V311,
            pkt(0x40, b"\x00\x01\x00"),
            0x81,
        ),
        ("PUBACK packet id 0", V311, pkt(0x40, b"\x00\x00"), 0x82),
        ("PUBACK short", V5, pkt(0x40, b"\x00"), 0x81),
        (
            "PUBACK v5 reason 0x92",
            V5,
            pkt(0x40, b"\x00\x01\x92"),
            0x81,
        ),
        (
            "PUBREC v5 reason 0x04",
            V5,
            pkt(0x50, b"\x00\x01\x04"),
            0x81,
        ),
        (
            "PUBREL v5 reason 0x10",
            V5,
            pkt(0x62, b"\x00\x01\x10"),
            0x81,
        ),
        (
            "PUBCOMP v5 reason 0x80",
            V5,
            pkt(0x70, b"\x00\x01\x80"),
            0x81,
        ),
        (
            "PUBACK v5 topic alias property",
            V5,
            pkt(0x40, b"\x00\x01\x00\x03\x23\x00\x01"),
            0x81,
        ),
        (
            "PUBACK v5 duplicate reason string",
            V5,
            pkt(0x40, b"\x00\x01\x00\x08\x1f\x00\x01a\x1f\x00\x01b"),
            0x82,
        ),
        // SUBSCRIBE
        ("SUBSCRIBE no filters", V311, pkt(0x82, b"\x00\x01"), 0x82),
        (
            "SUBSCRIBE packet id 0",
            V311,
            pkt(0x82, b"\x00\x00\x00\x01a\x00"),
            0x82,
        ),
        (
            "SUBSCRIBE v3 reserved bit",
            V311,
            pkt(0x82, b"\x00\x01\x00\x01a\x04"),
            0x81,
        ),
        (
            "SUBSCRIBE QoS 3",
            V311,
            pkt(0x82, b"\x00\x01\x00\x01a\x03"),
            0x81,
        ),
        (
            "SUBSCRIBE missing options",
            V311,
            pkt(0x82, b"\x00\x01\x00\x01a"),
            0x81,
        ),
        (
            "SUBSCRIBE v5 no filters",
            V5,
            pkt(0x82, b"\x00\x01\x00"),
            0x82,
        ),
        (
            "retain handling 3",
            V5,
            pkt(0x82, b"\x00\x01\x00\x00\x01a\x30"),
            0x82,
        ),
        (
            "v5 reserved option bit",
            V5,
            pkt(0x82, b"\x00\x01\x00\x00\x01a\x40"),
            0x81,
        ),
        (
            "no local on shared",
            V5,
            pkt(0x82, b"\x00\x01\x00\x00\x0a$share/g/a\x04"),
            0x82,
        ),
        (
            "two subscription ids",
            V5,
            pkt(0x82, b"\x00\x01\x04\x0b\x01\x0b\x02\x00\x01a\x00"),
            0x82,
        ),
        (
            "reason string in SUBSCRIBE",
            V5,
            pkt(0x82, b"\x00\x01\x04\x1f\x00\x01x\x00\x01a\x00"),
            0x81,
        ),
        (
            "filter invalid UTF-8",
            V311,
            pkt(0x82, b"\x00\x01\x00\x01\xfe\x00"),
            0x81,
        ),
        // SUBACK / UNSUBSCRIBE / UNSUBACK
        ("SUBACK v3 code 3", V311, pkt(0x90, b"\x00\x01\x03"), 0x81),
        (
            "SUBACK v5 code 0x90",
            V5,
            pkt(0x90, b"\x00\x01\x00\x90"),
            0x81,
        ),
        ("SUBACK empty", V311, pkt(0x90, b"\x00\x01"), 0x82),
        ("UNSUBSCRIBE no filters", V311, pkt(0xa2, b"\x00\x01"), 0x82),
        (
            "UNSUBSCRIBE v5 no filters",
            V5,
            pkt(0xa2, b"\x00\x01\x00"),
            0x82,
        ),
        (
            "UNSUBSCRIBE packet id 0",
            V5,
            pkt(0xa2, b"\x00\x00\x00\x00\x01a"),
            0x82,
        ),
        (
            "UNSUBACK v3 trailing",
            V311,
            pkt(0xb0, b"\x00\x01\x00"),
            0x81,
        ),
        (
            "UNSUBACK v5 code 0x10",
            V5,
            pkt(0xb0, b"\x00\x01\x00\x10"),
            0x81,
        ),
        ("UNSUBACK v5 empty", V5, pkt(0xb0, b"\x00\x01\x00"), 0x82),
        // PING / DISCONNECT / AUTH
        ("PINGREQ with body", V311, pkt(0xc0, b"\x00"), 0x81),
        ("PINGRESP with body", V5, pkt(0xd0, b"\x00"), 0x81),
        ("DISCONNECT v3 with body", V311, pkt(0xe0, b"\x00"), 0x81),
        ("DISCONNECT v5 reason 0x05", V5, pkt(0xe0, b"\x05"), 0x81),
        (
            "DISCONNECT v5 topic alias property",
            V5,
            pkt(0xe0, b"\x00\x03\x23\x00\x01"),
            0x81,
        ),
        ("AUTH under 3.1.1", V311, pkt(0xf0, b""), 0x81),
        ("AUTH under 3.1", V31, pkt(0xf0, b""), 0x81),
        ("AUTH reason 0x01", V5, pkt(0xf0, b"\x01"), 0x81),
        (
            "AUTH data without method",
            V5,
            pkt(0xf0, b"\x18\x04\x16\x00\x01x"),
            0x82,
        ),
        // Frames that disagree with their length.
        (
            "frame longer than its length",
            V311,
            b"\xc0\x00\x00".to_vec(),
            0x81,
        ),
        (
            "frame shorter than its length",
            V311,
            b"\x30\x05\x00\x03a".to_vec(),
            0x81,
        ),
        ("empty frame", V5, Vec::new(), 0x81),
        ("truncated remaining length", V5, b"\x30\x80".to_vec(), 0x81),
        ("reserved type 0", V5, b"\x00\x00".to_vec(), 0x81),
    ];
    let mut failures = Vec::new();
    for (name, protocol, wire, code) in &table {
        match decode(Bytes::copy_from_slice(wire), *protocol) {
            Ok(p) => failures.push(format!("{name}: decoded as {p:?}")),
            Err(e) if e.reason != ReasonCode(*code) => failures.push(format!(
                "{name}: got {:#04x} ({}), want {code:#04x}",
                e.reason.0, e.what
            )),
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(table.len() > 90);
}

/// mosquitto's `try_private`: the top bit of a known level marks a bridge.
#[test]
fn bridge_bit_is_a_mark_not_an_error() {
    let abc: &[u8] = b"\x00\x03abc";
    for (name, level, want) in [
        (&b"MQTT"[..], 0x84, V311),
        (b"MQIsdp", 0x83, Protocol::V31),
        (b"MQTT", 4, V311),
    ] {
        match decode(Bytes::from(connect(name, level, 2, abc)), V311) {
            Ok(Packet::Connect(c)) => {
                assert_eq!(c.protocol, want);
                assert_eq!(c.bridge, level & 0x80 != 0);
            }
            other => panic!("level {level:#04x}: {other:?}"),
        }
    }
}

#[test]
fn encode_errors() {
    use bytes::BytesMut;
    let s = |v: &str| MqttStr::try_from(v).unwrap();
    let bad: Vec<(&str, Protocol, Packet)> = vec![
        (
            "QoS 0 with packet id",
            V5,
            Packet::Publish(Publish {
                topic: s("t"),
                packet_id: 1,
                ..Publish::default()
            }),
        ),
        (
            "QoS 1 packet id 0",
            V5,
            Packet::Publish(Publish {
                topic: s("t"),
                qos: QoS::AtLeastOnce,
                ..Publish::default()
            }),
        ),
        (
            "QoS 0 DUP",
            V311,
            Packet::Publish(Publish {
                topic: s("t"),
                dup: true,
                ..Publish::default()
            }),
        ),
        ("empty topic v3", V311, Packet::Publish(Publish::default())),
        (
            "empty topic no alias",
            V5,
            Packet::Publish(Publish::default()),
        ),
        (
            "topic alias 0",
            V5,
            Packet::Publish(Publish {
                topic: s("t"),
                properties: Properties {
                    topic_alias: Some(0),
                    ..Properties::default()
                }
                .into(),
                ..Publish::default()
            }),
        ),
        (
            "subscription id 0",
            V5,
            Packet::Publish(Publish {
                topic: s("t"),
                properties: Properties {
                    subscription_identifiers: vec![0],
                    ..Properties::default()
                }
                .into(),
                ..Publish::default()
            }),
        ),
        (
            "PUBACK reason 0x92",
            V5,
            Packet::PubAck(Ack {
                packet_id: 1,
                reason: ReasonCode(0x92),
                properties: Default::default(),
            }),
        ),
        ("PUBACK packet id 0", V311, Packet::PubAck(Ack::default())),
        (
            "SUBSCRIBE empty",
            V311,
            Packet::Subscribe(Subscribe {
                packet_id: 1,
                ..Default::default()
            }),
        ),
        (
            "SUBACK empty",
            V5,
            Packet::SubAck(SubAck {
                packet_id: 1,
                ..Default::default()
            }),
        ),
        (
            "CONNACK session present with error",
            V311,
            Packet::ConnAck(ConnAck {
                session_present: true,
                reason: ReasonCode::NOT_AUTHORIZED,
                properties: Default::default(),
            }),
        ),
        (
            "CONNACK receive maximum 0",
            V5,
            Packet::ConnAck(ConnAck {
                properties: Properties {
                    receive_maximum: Some(0),
                    ..Properties::default()
                }
                .into(),
                ..ConnAck::default()
            }),
        ),
        (
            "DISCONNECT reason 0x18",
            V5,
            Packet::Disconnect(Disconnect {
                reason: ReasonCode(0x18),
                ..Disconnect::default()
            }),
        ),
        (
            "correlation data over 64 KiB",
            V5,
            Packet::Publish(Publish {
                topic: s("t"),
                properties: Properties {
                    correlation_data: Some(Bytes::from(vec![0u8; 70_000])),
                    ..Properties::default()
                }
                .into(),
                ..Publish::default()
            }),
        ),
    ];
    for (name, protocol, packet) in bad {
        let mut out = BytesMut::new();
        assert!(
            matches!(
                encode(&packet, protocol, &mut out),
                Err(EncodeError::Invalid(_))
            ),
            "{name}"
        );
        assert!(out.is_empty(), "{name}: nothing written on error");
        assert!(encoded_len(&packet, protocol).is_err(), "{name}");
    }
    // Too large for MQTT at all.
    let huge = Packet::Publish(Publish {
        topic: s("t"),
        payload: Bytes::from(vec![0u8; 268_435_456]),
        ..Publish::default()
    });
    assert_eq!(encoded_len(&huge, V311), Err(EncodeError::TooLarge));
    // A destination too small is refused, not a panic.
    let mut small = [0u8; 4];
    let mut dst: &mut [u8] = &mut small;
    assert!(encode(&Packet::PingReq, V5, &mut dst).is_ok());
    let p = Packet::Publish(Publish {
        topic: s("topic"),
        payload: Bytes::from_static(b"payload"),
        ..Publish::default()
    });
    assert!(matches!(
        encode(&p, V5, &mut dst),
        Err(EncodeError::Invalid(_))
    ));
}

/// MQTT 3.1 lets a client set DUP on a resent PUBREL, SUBSCRIBE or
/// UNSUBSCRIBE (3.1 §2.1); 3.1.1 and 5 fix their flags at 0b0010.
#[test]
fn dup_on_pubrel_subscribe_unsubscribe_is_valid_in_3_1_only() {
    let packets: [(&str, Vec<u8>); 3] = [
        ("PUBREL", pkt(0x6a, b"\x00\x01")),
        ("SUBSCRIBE", pkt(0x8a, b"\x00\x01\x00\x01a\x01")),
        ("UNSUBSCRIBE", pkt(0xaa, b"\x00\x01\x00\x01a")),
    ];
    for (name, wire) in packets {
        assert!(
            matches!(frame(&wire, u32::MAX), Frame::Complete(n) if n == wire.len()),
            "{name}: framing"
        );
        let packet = decode(Bytes::from(wire.clone()), V31);
        assert!(packet.is_ok(), "{name} with DUP under 3.1: {packet:?}");
        for protocol in [V311, V5] {
            let err = decode(Bytes::from(wire.clone()), protocol)
                .expect_err("DUP must be refused outside 3.1");
            assert_eq!(err.reason, ReasonCode(0x81), "{name} {protocol:?}");
        }
    }
    // Other flag bits stay refused under 3.1 too.
    assert!(matches!(frame(b"\x86\x00", u32::MAX), Frame::Invalid(_)));
}

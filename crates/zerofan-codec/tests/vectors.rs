//! Hand-written byte vectors from the specifications, for every packet type
//! in MQTT 3.1, 3.1.1 and 5.0, checked in both directions: the bytes frame
//! and decode to the packet, and the packet encodes to exactly the bytes.

use bytes::{Bytes, BytesMut};
use zerofan_codec::*;

fn s(v: &str) -> MqttStr {
    MqttStr::try_from(v).unwrap()
}

#[track_caller]
fn both(protocol: Protocol, wire: &[u8], packet: Packet) {
    assert_eq!(
        frame(wire, u32::MAX),
        Frame::Complete(wire.len()),
        "frame of {wire:02x?}"
    );
    let got = decode(Bytes::copy_from_slice(wire), protocol).expect("decode");
    assert_eq!(got, packet, "decode of {wire:02x?} under {protocol:?}");
    let mut out = BytesMut::new();
    encode(&packet, protocol, &mut out).expect("encode");
    assert_eq!(&out[..], wire, "encode of {packet:?} under {protocol:?}");
    assert_eq!(encoded_len(&packet, protocol).unwrap(), wire.len());
}

/// Encode-only direction where 3.x drops what the packet carries.
#[track_caller]
fn enc(protocol: Protocol, packet: Packet, wire: &[u8]) {
    let mut out = BytesMut::new();
    encode(&packet, protocol, &mut out).expect("encode");
    assert_eq!(&out[..], wire, "encode of {packet:?} under {protocol:?}");
}

const V3: [Protocol; 2] = [Protocol::V31, Protocol::V311];
const ALL: [Protocol; 3] = [Protocol::V31, Protocol::V311, Protocol::V5];

fn connect(protocol: Protocol) -> Connect {
    Connect {
        protocol,
        clean_start: true,
        keep_alive: 60,
        properties: Default::default(),
        client_id: s("abc"),
        will: None,
        username: None,
        password: None,
        bridge: false,
    }
}

#[test]
fn connect_v31() {
    let wire = b"\x10\x11\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x03abc";
    both(
        Protocol::V31,
        wire,
        Packet::Connect(Box::new(connect(Protocol::V31))),
    );
    // A CONNECT announces its own version, whatever the connection thinks.
    assert_eq!(
        decode(Bytes::from_static(wire), Protocol::V5).unwrap(),
        Packet::Connect(Box::new(connect(Protocol::V31)))
    );
}

#[test]
fn connect_v311_minimal() {
    let wire = b"\x10\x0f\x00\x04MQTT\x04\x02\x00\x3c\x00\x03abc";
    both(
        Protocol::V311,
        wire,
        Packet::Connect(Box::new(connect(Protocol::V311))),
    );
}

#[test]
fn connect_v311_full() {
    let wire =
        b"\x10\x1d\x00\x04MQTT\x04\xee\x00\x0a\x00\x01c\x00\x03w/t\x00\x02by\x00\x01u\x00\x02pw";
    let c = Connect {
        protocol: Protocol::V311,
        clean_start: true,
        keep_alive: 10,
        properties: Default::default(),
        client_id: s("c"),
        will: Some(Will {
            topic: s("w/t"),
            payload: Bytes::from_static(b"by"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: Default::default(),
        }),
        username: Some(s("u")),
        password: Some(Bytes::from_static(b"pw")),
        bridge: false,
    };
    both(Protocol::V311, wire, Packet::Connect(Box::new(c)));
}

#[test]
fn connect_v5() {
    let wire = b"\x10\x15\x00\x04MQTT\x05\x02\x00\x3c\x05\x11\x00\x00\x00\x0a\x00\x03abc";
    let mut c = connect(Protocol::V5);
    c.properties.session_expiry_interval = Some(10);
    both(Protocol::V5, wire, Packet::Connect(Box::new(c)));
}

#[test]
fn connect_v5_will_and_username() {
    let wire = b"\x10\x1c\x00\x04MQTT\x05\x86\x00\x3c\x00\x00\x01c\x05\x18\x00\x00\x00\x05\x00\x01t\x00\x00\x00\x01u";
    let mut c = connect(Protocol::V5);
    c.client_id = s("c");
    c.username = Some(s("u"));
    c.will = Some(Will {
        topic: s("t"),
        payload: Bytes::new(),
        qos: QoS::AtMostOnce,
        retain: false,
        properties: Properties {
            will_delay_interval: Some(5),
            ..Properties::default()
        }
        .into(),
    });
    both(Protocol::V5, wire, Packet::Connect(Box::new(c)));
}

#[test]
fn connect_v5_password_without_username() {
    let wire = b"\x10\x12\x00\x04MQTT\x05\x42\x00\x3c\x00\x00\x01c\x00\x02pw";
    let mut c = connect(Protocol::V5);
    c.client_id = s("c");
    c.password = Some(Bytes::from_static(b"pw"));
    both(Protocol::V5, wire, Packet::Connect(Box::new(c.clone())));
    // Not in 3.1.1: the encoder refuses, the decoder calls it malformed.
    c.protocol = Protocol::V311;
    let p = Packet::Connect(Box::new(c));
    assert!(matches!(
        encode(&p, Protocol::V311, &mut BytesMut::new()),
        Err(EncodeError::Invalid(_))
    ));
}

#[test]
fn connack_all_versions() {
    both(
        Protocol::V311,
        b"\x20\x02\x01\x00",
        Packet::ConnAck(ConnAck {
            session_present: true,
            ..ConnAck::default()
        }),
    );
    both(
        Protocol::V311,
        b"\x20\x02\x00\x05",
        Packet::ConnAck(ConnAck {
            reason: ReasonCode::NOT_AUTHORIZED,
            ..ConnAck::default()
        }),
    );
    both(
        Protocol::V31,
        b"\x20\x02\x00\x00",
        Packet::ConnAck(ConnAck::default()),
    );
    // 3.1 has no Session Present: dropped on the wire.
    enc(
        Protocol::V31,
        Packet::ConnAck(ConnAck {
            session_present: true,
            ..ConnAck::default()
        }),
        b"\x20\x02\x00\x00",
    );
    for (reason, code) in [(0x84u8, 1u8), (0x85, 2), (0x88, 3), (0x86, 4), (0x87, 5)] {
        for p in V3 {
            both(
                p,
                &[0x20, 0x02, 0x00, code],
                Packet::ConnAck(ConnAck {
                    reason: ReasonCode(reason),
                    ..ConnAck::default()
                }),
            );
        }
    }
    // Other MQTT 5 errors map to 3 (server unavailable) or their nearest 3.x code.
    enc(
        Protocol::V311,
        Packet::ConnAck(ConnAck {
            reason: ReasonCode::SERVER_BUSY,
            ..ConnAck::default()
        }),
        b"\x20\x02\x00\x03",
    );
    enc(
        Protocol::V311,
        Packet::ConnAck(ConnAck {
            reason: ReasonCode::BANNED,
            ..ConnAck::default()
        }),
        b"\x20\x02\x00\x05",
    );
    both(
        Protocol::V5,
        b"\x20\x03\x00\x00\x00",
        Packet::ConnAck(ConnAck::default()),
    );
    both(
        Protocol::V5,
        b"\x20\x08\x00\x86\x05\x1f\x00\x02no",
        Packet::ConnAck(ConnAck {
            reason: ReasonCode::BAD_USER_NAME_OR_PASSWORD,
            properties: Properties {
                reason_string: Some(s("no")),
                ..Properties::default()
            }
            .into(),
            ..ConnAck::default()
        }),
    );
    both(
        Protocol::V5,
        b"\x20\x16\x01\x00\x13\x12\x00\x01x\x21\x00\x0a\x22\x00\x05\x24\x01\x27\x00\x00\x10\x00\x28\x00",
        Packet::ConnAck(ConnAck {
            session_present: true,
            reason: ReasonCode::SUCCESS,
            properties: Properties {
                assigned_client_identifier: Some(s("x")),
                receive_maximum: Some(10),
                topic_alias_maximum: Some(5),
                maximum_qos: Some(1),
                maximum_packet_size: Some(4096),
                wildcard_subscription_available: Some(0),
                ..Properties::default()
            }.into(),
        }),
    );
}

#[test]
fn publish_v3() {
    for p in V3 {
        both(
            p,
            b"\x30\x07\x00\x03a/bhi",
            Packet::Publish(Publish {
                topic: s("a/b"),
                payload: Bytes::from_static(b"hi"),
                ..Publish::default()
            }),
        );
        both(
            p,
            b"\x3b\x09\x00\x03a/b\x00\x07hi",
            Packet::Publish(Publish {
                dup: true,
                qos: QoS::AtLeastOnce,
                retain: true,
                topic: s("a/b"),
                packet_id: 7,
                payload: Bytes::from_static(b"hi"),
                ..Publish::default()
            }),
        );
        both(
            p,
            b"\x34\x07\x00\x01t\x00\x01xy",
            Packet::Publish(Publish {
                qos: QoS::ExactlyOnce,
                topic: s("t"),
                packet_id: 1,
                payload: Bytes::from_static(b"xy"),
                ..Publish::default()
            }),
        );
    }
}

#[test]
fn publish_v5() {
    both(
        Protocol::V5,
        b"\x30\x08\x00\x03a/b\x00hi",
        Packet::Publish(Publish {
            topic: s("a/b"),
            payload: Bytes::from_static(b"hi"),
            ..Publish::default()
        }),
    );
    both(
        Protocol::V5,
        b"\x32\x18\x00\x03a/b\x00\x01\x0e\x01\x01\x0b\x05\x23\x00\x01\x26\x00\x01k\x00\x01vhi",
        Packet::Publish(Publish {
            qos: QoS::AtLeastOnce,
            topic: s("a/b"),
            packet_id: 1,
            properties: Properties {
                payload_format_indicator: Some(1),
                subscription_identifiers: vec![5],
                topic_alias: Some(1),
                user_properties: vec![(s("k"), s("v"))],
                ..Properties::default()
            }
            .into(),
            payload: Bytes::from_static(b"hi"),
            ..Publish::default()
        }),
    );
    // Empty topic name with a topic alias.
    both(
        Protocol::V5,
        b"\x30\x06\x00\x00\x03\x23\x00\x05",
        Packet::Publish(Publish {
            properties: Properties {
                topic_alias: Some(5),
                ..Properties::default()
            }
            .into(),
            ..Publish::default()
        }),
    );
    // Under 3.x the properties are dropped.
    enc(
        Protocol::V311,
        Packet::Publish(Publish {
            topic: s("a/b"),
            properties: Properties {
                message_expiry_interval: Some(9),
                ..Properties::default()
            }
            .into(),
            payload: Bytes::from_static(b"hi"),
            ..Publish::default()
        }),
        b"\x30\x07\x00\x03a/bhi",
    );
}

fn ack(id: u16, reason: u8) -> Ack {
    Ack {
        packet_id: id,
        reason: ReasonCode(reason),
        properties: Default::default(),
    }
}

#[test]
fn acks_v3() {
    for p in V3 {
        both(p, b"\x40\x02\x00\x01", Packet::PubAck(ack(1, 0)));
        both(p, b"\x50\x02\x00\x01", Packet::PubRec(ack(1, 0)));
        both(p, b"\x62\x02\x00\x01", Packet::PubRel(ack(1, 0)));
        both(p, b"\x70\x02\x00\x01", Packet::PubComp(ack(1, 0)));
        // Reason codes have no place on the 3.x wire.
        enc(p, Packet::PubAck(ack(1, 0x10)), b"\x40\x02\x00\x01");
    }
}

#[test]
fn acks_v5() {
    let v = Protocol::V5;
    both(v, b"\x40\x02\x00\x01", Packet::PubAck(ack(1, 0)));
    both(v, b"\x40\x03\x00\x01\x10", Packet::PubAck(ack(1, 0x10)));
    both(
        v,
        b"\x50\x08\x00\x01\x80\x04\x1f\x00\x01x",
        Packet::PubRec(Ack {
            packet_id: 1,
            reason: ReasonCode(0x80),
            properties: Properties {
                reason_string: Some(s("x")),
                ..Properties::default()
            }
            .into(),
        }),
    );
    both(v, b"\x62\x03\x00\x01\x92", Packet::PubRel(ack(1, 0x92)));
    both(v, b"\x70\x02\x00\x01", Packet::PubComp(ack(1, 0)));
    // Success with an explicit empty property length also decodes.
    assert_eq!(
        decode(Bytes::from_static(b"\x40\x04\x00\x01\x00\x00"), v).unwrap(),
        Packet::PubAck(ack(1, 0))
    );
}

#[test]
fn subscribe_all_versions() {
    for p in V3 {
        both(
            p,
            b"\x82\x0c\x00\x0a\x00\x03a/b\x01\x00\x01#\x02",
            Packet::Subscribe(Subscribe {
                packet_id: 10,
                properties: Default::default(),
                filters: vec![
                    (
                        s("a/b"),
                        SubscriptionOptions {
                            qos: QoS::AtLeastOnce,
                            ..Default::default()
                        },
                    ),
                    (
                        s("#"),
                        SubscriptionOptions {
                            qos: QoS::ExactlyOnce,
                            ..Default::default()
                        },
                    ),
                ],
            }),
        );
    }
    both(
        Protocol::V5,
        b"\x82\x0b\x00\x0a\x02\x0b\x07\x00\x03a/b\x2d",
        Packet::Subscribe(Subscribe {
            packet_id: 10,
            properties: Properties {
                subscription_identifiers: vec![7],
                ..Properties::default()
            }
            .into(),
            filters: vec![(
                s("a/b"),
                SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    no_local: true,
                    retain_as_published: true,
                    retain_handling: 2,
                },
            )],
        }),
    );
}

#[test]
fn suback_all_versions() {
    for p in V3 {
        both(
            p,
            b"\x90\x04\x00\x0a\x01\x80",
            Packet::SubAck(SubAck {
                packet_id: 10,
                properties: Default::default(),
                reasons: vec![ReasonCode(1), ReasonCode(0x80)],
            }),
        );
        // Every MQTT 5 failure is 0x80 in 3.x.
        enc(
            p,
            Packet::SubAck(SubAck {
                packet_id: 10,
                properties: Default::default(),
                reasons: vec![ReasonCode(2), ReasonCode::TOPIC_FILTER_INVALID],
            }),
            b"\x90\x04\x00\x0a\x02\x80",
        );
    }
    both(
        Protocol::V5,
        b"\x90\x05\x00\x0a\x00\x01\x8f",
        Packet::SubAck(SubAck {
            packet_id: 10,
            properties: Default::default(),
            reasons: vec![ReasonCode(1), ReasonCode(0x8F)],
        }),
    );
}

#[test]
fn unsubscribe_and_unsuback() {
    for p in V3 {
        both(
            p,
            b"\xa2\x07\x00\x0b\x00\x03a/b",
            Packet::Unsubscribe(Unsubscribe {
                packet_id: 11,
                properties: Default::default(),
                filters: vec![s("a/b")],
            }),
        );
        both(
            p,
            b"\xb0\x02\x00\x0b",
            Packet::UnsubAck(UnsubAck {
                packet_id: 11,
                ..UnsubAck::default()
            }),
        );
    }
    both(
        Protocol::V5,
        b"\xa2\x08\x00\x0b\x00\x00\x03a/b",
        Packet::Unsubscribe(Unsubscribe {
            packet_id: 11,
            properties: Default::default(),
            filters: vec![s("a/b")],
        }),
    );
    both(
        Protocol::V5,
        b"\xb0\x05\x00\x0b\x00\x00\x11",
        Packet::UnsubAck(UnsubAck {
            packet_id: 11,
            properties: Default::default(),
            reasons: vec![ReasonCode(0), ReasonCode(0x11)],
        }),
    );
}

#[test]
fn ping_all_versions() {
    for p in ALL {
        both(p, b"\xc0\x00", Packet::PingReq);
        both(p, b"\xd0\x00", Packet::PingResp);
    }
}

#[test]
fn disconnect_all_versions() {
    for p in V3 {
        both(p, b"\xe0\x00", Packet::Disconnect(Disconnect::default()));
        enc(
            p,
            Packet::Disconnect(Disconnect {
                reason: ReasonCode::DISCONNECT_WITH_WILL,
                ..Disconnect::default()
            }),
            b"\xe0\x00",
        );
    }
    let v = Protocol::V5;
    both(v, b"\xe0\x00", Packet::Disconnect(Disconnect::default()));
    both(
        v,
        b"\xe0\x01\x04",
        Packet::Disconnect(Disconnect {
            reason: ReasonCode::DISCONNECT_WITH_WILL,
            ..Disconnect::default()
        }),
    );
    both(
        v,
        b"\xe0\x07\x00\x05\x11\x00\x00\x00\x00",
        Packet::Disconnect(Disconnect {
            reason: ReasonCode::SUCCESS,
            properties: Properties {
                session_expiry_interval: Some(0),
                ..Properties::default()
            }
            .into(),
        }),
    );
}

#[test]
fn auth_v5_only() {
    let v = Protocol::V5;
    both(v, b"\xf0\x00", Packet::Auth(Auth::default()));
    let a = Auth {
        reason: ReasonCode::CONTINUE_AUTHENTICATION,
        properties: Properties {
            authentication_method: Some(s("SCR")),
            authentication_data: Some(Bytes::from_static(b"x")),
            ..Properties::default()
        }
        .into(),
    };
    both(
        v,
        b"\xf0\x0c\x18\x0a\x15\x00\x03SCR\x16\x00\x01x",
        Packet::Auth(a.clone()),
    );
    for p in V3 {
        assert_eq!(
            encode(&Packet::Auth(a.clone()), p, &mut BytesMut::new()),
            Err(EncodeError::WrongProtocol)
        );
        assert_eq!(
            decode(Bytes::from_static(b"\xf0\x00"), p)
                .unwrap_err()
                .reason,
            ReasonCode::MALFORMED_PACKET
        );
    }
}

#[test]
fn publish_header_matches_full_encode() {
    let props = Properties {
        content_type: Some(s("text/plain")),
        message_expiry_interval: Some(100),
        topic_alias: Some(9),
        ..Properties::default()
    };
    let payload = Bytes::from_static(b"hello world");
    for p in ALL {
        let h = PublishHeader {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            packet_id: 42,
            topic: "a/b",
            topic_alias: Some(3),
            properties: &props,
            message_expiry_interval: Some(50),
            subscription_identifiers: &[1, 300],
            payload_len: payload.len(),
        };
        let mut out = BytesMut::new();
        encode_publish_header(&h, p, &mut out).unwrap();
        assert_eq!(out.len() + payload.len(), h.packet_len(p).unwrap());
        out.extend_from_slice(&payload);
        let expect = Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: s("a/b"),
            packet_id: 42,
            properties: if p.is_v5() {
                Properties {
                    content_type: Some(s("text/plain")),
                    message_expiry_interval: Some(50),
                    topic_alias: Some(3),
                    subscription_identifiers: vec![1, 300],
                    ..Properties::default()
                }
                .into()
            } else {
                Props::new()
            },
            payload: payload.clone(),
        };
        let mut full = BytesMut::new();
        encode(&Packet::Publish(expect.clone()), p, &mut full).unwrap();
        assert_eq!(out, full);
        assert_eq!(decode(out.freeze(), p).unwrap(), Packet::Publish(expect));
    }
}

#[test]
fn decode_is_zero_copy() {
    let wire = Bytes::from_static(b"\x30\x08\x00\x03a/b\x00hi");
    let range = wire.as_ptr() as usize..wire.as_ptr() as usize + wire.len();
    let Packet::Publish(p) = decode(wire.clone(), Protocol::V5).unwrap() else {
        panic!()
    };
    assert!(range.contains(&(p.topic.as_bytes().as_ptr() as usize)));
    assert!(range.contains(&(p.payload.as_ptr() as usize)));
}

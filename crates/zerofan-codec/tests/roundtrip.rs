//! Property-based tests: every valid packet of every version, with every
//! property its type allows, survives encode -> frame -> decode unchanged;
//! and arbitrary or mutated bytes never make frame or decode panic.

mod common;

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::option::of;
use proptest::prelude::*;
use zerofan_codec::*;

fn arb_str() -> impl Strategy<Value = MqttStr> {
    "[^\\x00]{0,8}".prop_map(|s| MqttStr::try_from(s).unwrap())
}

fn arb_topic() -> impl Strategy<Value = MqttStr> {
    "[a-zA-Z0-9_$ é€/]{1,16}".prop_map(|s| MqttStr::try_from(s).unwrap())
}

fn arb_filter() -> impl Strategy<Value = MqttStr> {
    "[a-z/+#$é]{1,12}".prop_map(|s| MqttStr::try_from(s).unwrap())
}

fn arb_bytes() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..12).prop_map(Bytes::from)
}

fn arb_qos() -> impl Strategy<Value = QoS> {
    prop_oneof![
        Just(QoS::AtMostOnce),
        Just(QoS::AtLeastOnce),
        Just(QoS::ExactlyOnce)
    ]
}

/// Every property set to a random valid value (or not set).
fn arb_all_properties() -> impl Strategy<Value = Properties> {
    let a = (
        of(0u8..=1),
        of(any::<u32>()),
        of(arb_str()),
        of(arb_topic()),
        of(arb_bytes()),
        vec(1u32..=268_435_455, 0..3),
        of(any::<u32>()),
        of(arb_str()),
        of(any::<u16>()),
    );
    let b = (
        of(arb_str()),
        of(arb_bytes()),
        of(0u8..=1),
        of(any::<u32>()),
        of(0u8..=1),
        of(arb_str()),
        of(arb_str()),
        of(arb_str()),
        of(1u16..),
    );
    let c = (
        of(any::<u16>()),
        of(1u16..),
        of(0u8..=1),
        of(0u8..=1),
        vec((arb_str(), arb_str()), 0..3),
        of(1u32..),
        of(0u8..=1),
        of(0u8..=1),
        of(0u8..=1),
    );
    (a, b, c).prop_map(
        |(
            (pfi, mei, ct, rt, cd, sids, sei, aci, ska),
            (am, ad, rpi, wdi, rri, ri, sr, rs, rm),
            (tam, ta, mq, ra, up, mps, wsa, sia, ssa),
        )| Properties {
            payload_format_indicator: pfi,
            message_expiry_interval: mei,
            content_type: ct,
            response_topic: rt,
            correlation_data: cd,
            subscription_identifiers: sids,
            session_expiry_interval: sei,
            assigned_client_identifier: aci,
            server_keep_alive: ska,
            authentication_data: if am.is_some() { ad } else { None },
            authentication_method: am,
            request_problem_information: rpi,
            will_delay_interval: wdi,
            request_response_information: rri,
            response_information: ri,
            server_reference: sr,
            reason_string: rs,
            receive_maximum: rm,
            topic_alias_maximum: tam,
            topic_alias: ta,
            maximum_qos: mq,
            retain_available: ra,
            user_properties: up,
            maximum_packet_size: mps,
            wildcard_subscription_available: wsa,
            subscription_identifier_available: sia,
            shared_subscription_available: ssa,
        },
    )
}

/// Which properties each packet may carry, written out from the spec
/// tables independently of the codec's own.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Connect,
    Will,
    ConnAck,
    Publish,
    Ack,
    Subscribe,
    SubAck,
    Unsubscribe,
    UnsubAck,
    Disconnect,
    Auth,
}

fn restrict(p: Properties, kind: Kind) -> Properties {
    use Kind::*;
    let has = |kinds: &[Kind]| {
        kinds
            .iter()
            .any(|k| std::mem::discriminant(k) == std::mem::discriminant(&kind))
    };
    let mut out = Properties::default();
    macro_rules! keep {
        ($field:ident, $kinds:expr) => {
            if has(&$kinds) {
                out.$field = p.$field.clone();
            }
        };
    }
    keep!(payload_format_indicator, [Will, Publish]);
    keep!(message_expiry_interval, [Will, Publish]);
    keep!(content_type, [Will, Publish]);
    keep!(response_topic, [Will, Publish]);
    keep!(correlation_data, [Will, Publish]);
    keep!(subscription_identifiers, [Publish, Subscribe]);
    keep!(session_expiry_interval, [Connect, ConnAck, Disconnect]);
    keep!(assigned_client_identifier, [ConnAck]);
    keep!(server_keep_alive, [ConnAck]);
    keep!(authentication_method, [Connect, ConnAck, Auth]);
    keep!(authentication_data, [Connect, ConnAck, Auth]);
    keep!(request_problem_information, [Connect]);
    keep!(will_delay_interval, [Will]);
    keep!(request_response_information, [Connect]);
    keep!(response_information, [ConnAck]);
    keep!(server_reference, [ConnAck, Disconnect]);
    keep!(
        reason_string,
        [ConnAck, Ack, SubAck, UnsubAck, Disconnect, Auth]
    );
    keep!(receive_maximum, [Connect, ConnAck]);
    keep!(topic_alias_maximum, [Connect, ConnAck]);
    keep!(topic_alias, [Publish]);
    keep!(maximum_qos, [ConnAck]);
    keep!(retain_available, [ConnAck]);
    keep!(
        user_properties,
        [
            Connect,
            Will,
            ConnAck,
            Publish,
            Ack,
            Subscribe,
            SubAck,
            Unsubscribe,
            UnsubAck,
            Disconnect,
            Auth
        ]
    );
    keep!(maximum_packet_size, [Connect, ConnAck]);
    keep!(wildcard_subscription_available, [ConnAck]);
    keep!(subscription_identifier_available, [ConnAck]);
    keep!(shared_subscription_available, [ConnAck]);
    if matches!(kind, Subscribe) {
        out.subscription_identifiers.truncate(1);
    }
    out
}

fn props(protocol: Protocol, kind: Kind) -> BoxedStrategy<Properties> {
    if protocol.is_v5() {
        arb_all_properties()
            .prop_map(move |p| restrict(p, kind))
            .boxed()
    } else {
        Just(Properties::default()).boxed()
    }
}

fn codes(list: &'static [u8]) -> impl Strategy<Value = ReasonCode> {
    proptest::sample::select(list).prop_map(ReasonCode)
}

const CONNACK_V5: &[u8] = &[
    0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97,
    0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F,
];
const CONNACK_V3: &[u8] = &[0x00, 0x84, 0x85, 0x88, 0x86, 0x87];
const PUBACK_V5: &[u8] = &[0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99];
const PUBREL_V5: &[u8] = &[0x00, 0x92];
const SUBACK_V5: &[u8] = &[
    0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2,
];
const SUBACK_V3: &[u8] = &[0x00, 0x01, 0x02, 0x80];
const UNSUBACK_V5: &[u8] = &[0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91];
const DISCONNECT_V5: &[u8] = &[
    0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95,
    0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2,
];
const AUTH_V5: &[u8] = &[0x00, 0x18, 0x19];
const SUCCESS: &[u8] = &[0x00];

fn arb_connect(protocol: Protocol) -> impl Strategy<Value = Packet> {
    let will = (
        arb_topic(),
        arb_bytes(),
        arb_qos(),
        any::<bool>(),
        props(protocol, Kind::Will),
    )
        .prop_map(|(topic, payload, qos, retain, properties)| Will {
            topic,
            payload,
            qos,
            retain,
            properties: properties.into(),
        });
    (
        any::<bool>(),
        any::<u16>(),
        props(protocol, Kind::Connect),
        arb_str(),
        of(will),
        of(arb_str()),
        of(arb_bytes()),
        any::<bool>(),
    )
        .prop_map(
            move |(
                clean_start,
                keep_alive,
                properties,
                client_id,
                will,
                mut username,
                password,
                bridge,
            )| {
                if !protocol.is_v5() && password.is_some() && username.is_none() {
                    username = Some(MqttStr::new());
                }
                Packet::Connect(Box::new(Connect {
                    protocol,
                    clean_start,
                    keep_alive,
                    properties: properties.into(),
                    client_id,
                    will,
                    username,
                    password,
                    bridge,
                }))
            },
        )
}

fn arb_publish(protocol: Protocol) -> impl Strategy<Value = Packet> {
    (
        any::<bool>(),
        arb_qos(),
        any::<bool>(),
        prop_oneof![3 => arb_topic(), 1 => Just(MqttStr::new())],
        1u16..,
        props(protocol, Kind::Publish),
        vec(any::<u8>(), 0..64),
    )
        .prop_map(
            move |(dup, qos, retain, mut topic, pid, mut properties, payload)| {
                let queued = qos != QoS::AtMostOnce;
                if topic.is_empty() {
                    if protocol.is_v5() {
                        properties.topic_alias.get_or_insert(1);
                    } else {
                        topic = MqttStr::from_static("t");
                    }
                }
                Packet::Publish(Publish {
                    dup: dup && queued,
                    qos,
                    retain,
                    topic,
                    packet_id: if queued { pid } else { 0 },
                    properties: properties.into(),
                    payload: Bytes::from(payload),
                })
            },
        )
}

fn arb_ack(protocol: Protocol) -> impl Strategy<Value = Packet> {
    let v5 = protocol.is_v5();
    let pub_codes = if v5 { PUBACK_V5 } else { SUCCESS };
    let rel_codes = if v5 { PUBREL_V5 } else { SUCCESS };
    (
        0u8..4,
        1u16..,
        codes(pub_codes),
        codes(rel_codes),
        props(protocol, Kind::Ack),
    )
        .prop_map(|(kind, packet_id, pr, rr, properties)| {
            let ack = |reason| Ack {
                packet_id,
                reason,
                properties: properties.clone().into(),
            };
            match kind {
                0 => Packet::PubAck(ack(pr)),
                1 => Packet::PubRec(ack(pr)),
                2 => Packet::PubRel(ack(rr)),
                _ => Packet::PubComp(ack(rr)),
            }
        })
}

fn arb_subscribe(protocol: Protocol) -> impl Strategy<Value = Packet> {
    let v5 = protocol.is_v5();
    let opts =
        (arb_qos(), any::<bool>(), any::<bool>(), 0u8..=2).prop_map(move |(qos, nl, rap, rh)| {
            SubscriptionOptions {
                qos,
                no_local: nl && v5,
                retain_as_published: rap && v5,
                retain_handling: if v5 { rh } else { 0 },
            }
        });
    (
        1u16..,
        props(protocol, Kind::Subscribe),
        vec((arb_filter(), opts), 1..4),
    )
        .prop_map(|(packet_id, properties, filters)| {
            Packet::Subscribe(Subscribe {
                packet_id,
                properties: properties.into(),
                filters,
            })
        })
}

fn arb_other(protocol: Protocol) -> BoxedStrategy<Packet> {
    let v5 = protocol.is_v5();
    let connack = (
        any::<bool>(),
        codes(if v5 { CONNACK_V5 } else { CONNACK_V3 }),
        props(protocol, Kind::ConnAck),
    )
        .prop_map(move |(sp, reason, properties)| {
            Packet::ConnAck(ConnAck {
                session_present: sp && reason == ReasonCode::SUCCESS && protocol != Protocol::V31,
                reason,
                properties: properties.into(),
            })
        });
    let suback = (
        1u16..,
        props(protocol, Kind::SubAck),
        vec(codes(if v5 { SUBACK_V5 } else { SUBACK_V3 }), 1..5),
    )
        .prop_map(|(packet_id, properties, reasons)| {
            Packet::SubAck(SubAck {
                packet_id,
                properties: properties.into(),
                reasons,
            })
        });
    let unsubscribe = (
        1u16..,
        props(protocol, Kind::Unsubscribe),
        vec(arb_filter(), 1..4),
    )
        .prop_map(|(packet_id, properties, filters)| {
            Packet::Unsubscribe(Unsubscribe {
                packet_id,
                properties: properties.into(),
                filters,
            })
        });
    let unsuback = (
        1u16..,
        props(protocol, Kind::UnsubAck),
        vec(codes(UNSUBACK_V5), if v5 { 1..5 } else { 0..1 }),
    )
        .prop_map(|(packet_id, properties, reasons)| {
            Packet::UnsubAck(UnsubAck {
                packet_id,
                properties: properties.into(),
                reasons,
            })
        });
    let disconnect = (
        codes(if v5 { DISCONNECT_V5 } else { SUCCESS }),
        props(protocol, Kind::Disconnect),
    )
        .prop_map(|(reason, properties)| {
            Packet::Disconnect(Disconnect {
                reason,
                properties: properties.into(),
            })
        });
    let auth = (codes(AUTH_V5), props(protocol, Kind::Auth)).prop_map(|(reason, properties)| {
        Packet::Auth(Auth {
            reason,
            properties: properties.into(),
        })
    });
    let mut s = prop_oneof![
        connack,
        suback,
        unsubscribe,
        unsuback,
        disconnect,
        Just(Packet::PingReq),
        Just(Packet::PingResp),
    ]
    .boxed();
    if v5 {
        s = prop_oneof![6 => s, 1 => auth].boxed();
    }
    s
}

fn arb_packet(protocol: Protocol) -> impl Strategy<Value = Packet> {
    prop_oneof![
        arb_connect(protocol),
        arb_publish(protocol),
        arb_ack(protocol),
        arb_subscribe(protocol),
        arb_other(protocol),
    ]
}

fn arb_protocol_packet() -> impl Strategy<Value = (Protocol, Packet)> {
    prop_oneof![
        arb_packet(Protocol::V31).prop_map(|p| (Protocol::V31, p)),
        arb_packet(Protocol::V311).prop_map(|p| (Protocol::V311, p)),
        arb_packet(Protocol::V5).prop_map(|p| (Protocol::V5, p)),
    ]
}

fn roundtrip(protocol: Protocol, packet: &Packet) -> Result<(), TestCaseError> {
    let len = encoded_len(packet, protocol).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut out = BytesMut::new();
    encode(packet, protocol, &mut out).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(out.len(), len);
    prop_assert_eq!(frame(&out, u32::MAX), Frame::Complete(len));
    // Every shorter prefix asks for more bytes, never a packet.
    for cut in [0, 1, len / 2, len - 1] {
        if cut < len {
            prop_assert!(matches!(frame(&out[..cut], u32::MAX), Frame::NeedMore(_)));
        }
    }
    let back = decode(out.freeze(), protocol).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&back, packet);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn every_packet_roundtrips((protocol, packet) in arb_protocol_packet()) {
        roundtrip(protocol, &packet)?;
    }

    #[test]
    fn publish_header_equals_full_encode(
        protocol in prop_oneof![Just(Protocol::V31), Just(Protocol::V311), Just(Protocol::V5)],
        packet in arb_publish(Protocol::V5),
        alias in of(1u16..),
        expiry in of(any::<u32>()),
        sids in vec(1u32..=268_435_455, 0..3),
    ) {
        let Packet::Publish(mut p) = packet else { unreachable!() };
        if p.topic.is_empty() && !protocol.is_v5() {
            p.topic = MqttStr::from_static("t");
        }
        let alias = if p.topic.is_empty() { alias.or(Some(1)) } else { alias };
        let h = PublishHeader {
            dup: p.dup,
            qos: p.qos,
            retain: p.retain,
            packet_id: p.packet_id,
            topic: &p.topic,
            topic_alias: alias,
            properties: &p.properties,
            message_expiry_interval: expiry,
            subscription_identifiers: &sids,
            payload_len: p.payload.len(),
        };
        let mut head = BytesMut::new();
        encode_publish_header(&h, protocol, &mut head).unwrap();
        prop_assert_eq!(head.len() + p.payload.len(), h.packet_len(protocol).unwrap());
        prop_assert_eq!(head.len(), h.header_len(protocol).unwrap());
        let mut full = p.clone();
        if protocol.is_v5() {
            full.properties.topic_alias = alias;
            full.properties.message_expiry_interval = expiry;
            full.properties.subscription_identifiers = sids.clone();
        } else {
            full.properties = Props::new();
        }
        let mut want = BytesMut::new();
        encode(&Packet::Publish(full), protocol, &mut want).unwrap();
        head.extend_from_slice(&p.payload);
        prop_assert_eq!(head, want);
    }
}

fn poke(protocol: Protocol, data: &[u8]) {
    let mut rest = data;
    while let Frame::Complete(n) = frame(rest, u32::MAX) {
        let (one, tail) = rest.split_at(n);
        if let Ok(p) = decode(Bytes::copy_from_slice(one), protocol) {
            // Whatever decodes must encode and decode back to itself.
            let mut out = BytesMut::new();
            encode(&p, protocol, &mut out).expect("decoded packet encodes");
            assert_eq!(decode(out.freeze(), protocol).expect("re-decodes"), p);
        }
        rest = tail;
    }
    let _ = frame(data, 16);
    let _ = decode(Bytes::copy_from_slice(data), protocol);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8000))]

    #[test]
    fn random_bytes_never_panic(data in vec(any::<u8>(), 0..200)) {
        for protocol in [Protocol::V31, Protocol::V311, Protocol::V5] {
            poke(protocol, &data);
        }
    }

    #[test]
    fn mutated_packets_never_panic(
        which in any::<prop::sample::Index>(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        for protocol in [Protocol::V31, Protocol::V311, Protocol::V5] {
            let samples = common::samples(protocol);
            let (_, packet) = &samples[which.index(samples.len())];
            let mut out = BytesMut::new();
            encode(packet, protocol, &mut out).unwrap();
            let mut bytes = out.to_vec();
            for (i, b) in &edits {
                let i = i.index(bytes.len());
                bytes[i] = *b;
            }
            let keep = bytes.len() - cut.index(bytes.len() / 4 + 1);
            bytes.truncate(keep);
            poke(protocol, &bytes);
        }
    }
}

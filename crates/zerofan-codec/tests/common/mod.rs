//! Sample packets shared by the tests (and the fuzz seed corpus writer).
#![allow(dead_code)]

use bytes::Bytes;
use zerofan_codec::*;

pub fn s(v: &str) -> MqttStr {
    MqttStr::try_from(v).unwrap()
}

/// A valid packet of every type with a few properties, for `protocol`.
pub fn samples(protocol: Protocol) -> Vec<(&'static str, Packet)> {
    let v5 = protocol.is_v5();
    let props = |p: Properties| if v5 { p } else { Properties::default() };
    let user = vec![(s("k"), s("v"))];
    let mut out = vec![
        (
            "connect",
            Packet::Connect(Box::new(Connect {
                bridge: false,
                protocol,
                clean_start: true,
                keep_alive: 30,
                properties: props(Properties {
                    session_expiry_interval: Some(60),
                    receive_maximum: Some(20),
                    maximum_packet_size: Some(65536),
                    topic_alias_maximum: Some(10),
                    request_problem_information: Some(1),
                    request_response_information: Some(0),
                    user_properties: user.clone(),
                    authentication_method: Some(s("PLAIN")),
                    authentication_data: Some(Bytes::from_static(b"data")),
                    ..Properties::default()
                })
                .into(),
                client_id: s("client-1"),
                will: Some(Will {
                    topic: s("will/topic"),
                    payload: Bytes::from_static(b"gone"),
                    qos: QoS::AtLeastOnce,
                    retain: true,
                    properties: props(Properties {
                        will_delay_interval: Some(5),
                        payload_format_indicator: Some(1),
                        message_expiry_interval: Some(100),
                        content_type: Some(s("text/plain")),
                        response_topic: Some(s("resp/t")),
                        correlation_data: Some(Bytes::from_static(b"corr")),
                        user_properties: user.clone(),
                        ..Properties::default()
                    })
                    .into(),
                }),
                username: Some(s("user")),
                password: Some(Bytes::from_static(b"secret")),
            })),
        ),
        (
            "connack",
            Packet::ConnAck(ConnAck {
                session_present: protocol != Protocol::V31,
                reason: ReasonCode::SUCCESS,
                properties: props(Properties {
                    session_expiry_interval: Some(60),
                    receive_maximum: Some(100),
                    maximum_qos: Some(1),
                    retain_available: Some(1),
                    maximum_packet_size: Some(1 << 20),
                    assigned_client_identifier: Some(s("auto-1")),
                    topic_alias_maximum: Some(16),
                    reason_string: Some(s("welcome")),
                    user_properties: user.clone(),
                    wildcard_subscription_available: Some(1),
                    subscription_identifier_available: Some(1),
                    shared_subscription_available: Some(1),
                    server_keep_alive: Some(20),
                    response_information: Some(s("info")),
                    server_reference: Some(s("other:1883")),
                    ..Properties::default()
                })
                .into(),
            }),
        ),
        (
            "publish0",
            Packet::Publish(Publish {
                topic: s("sensors/1/temp"),
                payload: Bytes::from_static(b"21.5"),
                ..Publish::default()
            }),
        ),
        (
            "publish1",
            Packet::Publish(Publish {
                dup: true,
                qos: QoS::AtLeastOnce,
                retain: true,
                topic: s("a/b"),
                packet_id: 7,
                properties: props(Properties {
                    payload_format_indicator: Some(0),
                    message_expiry_interval: Some(9),
                    content_type: Some(s("bin")),
                    response_topic: Some(s("r/t")),
                    correlation_data: Some(Bytes::from_static(b"c")),
                    subscription_identifiers: vec![1, 200_000],
                    topic_alias: Some(2),
                    user_properties: user.clone(),
                    ..Properties::default()
                })
                .into(),
                payload: Bytes::from_static(&[0, 1, 2, 3, 255]),
            }),
        ),
        (
            "publish2",
            Packet::Publish(Publish {
                qos: QoS::ExactlyOnce,
                topic: s("x"),
                packet_id: 65535,
                ..Publish::default()
            }),
        ),
    ];
    let ack_props = props(Properties {
        reason_string: Some(s("why")),
        user_properties: user.clone(),
        ..Properties::default()
    });
    let reason = |r: u8| ReasonCode(if v5 { r } else { 0 });
    for (name, mk) in [
        ("puback", Packet::PubAck as fn(Ack) -> Packet),
        ("pubrec", Packet::PubRec),
        ("pubrel", Packet::PubRel),
        ("pubcomp", Packet::PubComp),
    ] {
        let code = if name == "pubrel" || name == "pubcomp" {
            0x92
        } else {
            0x10
        };
        out.push((
            name,
            mk(Ack {
                packet_id: 7,
                reason: reason(code),
                properties: ack_props.clone().into(),
            }),
        ));
    }
    out.extend([
        (
            "subscribe",
            Packet::Subscribe(Subscribe {
                packet_id: 3,
                properties: props(Properties {
                    subscription_identifiers: vec![42],
                    user_properties: user.clone(),
                    ..Properties::default()
                })
                .into(),
                filters: vec![
                    (
                        s("a/+/c"),
                        SubscriptionOptions {
                            qos: QoS::AtLeastOnce,
                            no_local: v5,
                            retain_as_published: v5,
                            retain_handling: if v5 { 1 } else { 0 },
                        },
                    ),
                    (
                        s("$share/g/x/#"),
                        SubscriptionOptions {
                            qos: QoS::ExactlyOnce,
                            ..Default::default()
                        },
                    ),
                ],
            }),
        ),
        (
            "suback",
            Packet::SubAck(SubAck {
                packet_id: 3,
                properties: ack_props.clone().into(),
                reasons: vec![ReasonCode(1), ReasonCode(0x80)],
            }),
        ),
        (
            "unsubscribe",
            Packet::Unsubscribe(Unsubscribe {
                packet_id: 4,
                properties: props(Properties {
                    user_properties: user.clone(),
                    ..Properties::default()
                })
                .into(),
                filters: vec![s("a/+/c"), s("#")],
            }),
        ),
        (
            "unsuback",
            Packet::UnsubAck(UnsubAck {
                packet_id: 4,
                properties: ack_props.clone().into(),
                reasons: if v5 {
                    vec![ReasonCode(0), ReasonCode(0x11)]
                } else {
                    vec![]
                },
            }),
        ),
        ("pingreq", Packet::PingReq),
        ("pingresp", Packet::PingResp),
        (
            "disconnect",
            Packet::Disconnect(Disconnect {
                reason: reason(0x04),
                properties: props(Properties {
                    session_expiry_interval: Some(0),
                    reason_string: Some(s("bye")),
                    user_properties: user.clone(),
                    server_reference: Some(s("elsewhere")),
                    ..Properties::default()
                })
                .into(),
            }),
        ),
    ]);
    if v5 {
        out.push((
            "auth",
            Packet::Auth(Auth {
                reason: ReasonCode::CONTINUE_AUTHENTICATION,
                properties: Properties {
                    authentication_method: Some(s("SCRAM-SHA-1")),
                    authentication_data: Some(Bytes::from_static(b"nonce")),
                    reason_string: Some(s("more")),
                    user_properties: user,
                    ..Properties::default()
                }
                .into(),
            }),
        ));
    }
    out
}

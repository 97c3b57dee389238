//! Publish at QoS 0, 1 and 2 in simple and expert mode, over MQTT 5 and
//! 3.1.1, against the zerofan binary and mosquitto; the completion resolves
//! with the broker's reason code and the message comes back intact.

mod common;

use bytes::{BufMut, Bytes};
use common::{within, Broker, Kind, BOTH};
use zerofan_client::{Client, ClientOptions, MqttStr, Properties, Protocol, PublishOptions, QoS};

async fn roundtrip(kind: Kind, protocol: Protocol) {
    let b = Broker::start(kind);
    let (c, mut inc) = Client::connect(ClientOptions::new(b.addr()).protocol(protocol))
        .await
        .expect("connect");
    let sub = c
        .subscribe("rt/#", QoS::ExactlyOnce)
        .await
        .expect("subscribe");
    assert_eq!(sub.reasons.len(), 1);
    assert_eq!(sub.reasons[0].0, 2, "granted QoS 2 ({kind:?} {protocol:?})");
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
        let topic = format!("rt/{}/simple", qos as u8);
        let body = Bytes::from(format!("simple at {qos:?}"));
        let ack = within(5, "simple delivery", async {
            c.publish(&topic, qos, body.clone())
                .await
                .expect("publish")
                .await
        })
        .await
        .expect("ack");
        assert!(
            !ack.reason.is_error(),
            "{kind:?} {protocol:?} {qos:?}: {ack:?}"
        );
        assert_eq!(ack.packet_id == 0, qos == QoS::AtMostOnce);
        let m = within(5, "simple message", inc.recv())
            .await
            .expect("message");
        assert_eq!(m.topic(), topic);
        assert_eq!(m.payload, body);
        assert_eq!(m.qos, qos);

        let topic = format!("rt/{}/expert", qos as u8);
        let ack = within(5, "expert delivery", async {
            c.publish_with(&topic, qos, |buf| {
                buf.put_slice(b"expert ");
                buf.put_u32(0xDEAD_BEEF);
            })
            .await
            .expect("publish_with")
            .await
        })
        .await
        .expect("ack");
        assert!(!ack.reason.is_error());
        let m = within(5, "expert message", inc.recv())
            .await
            .expect("message");
        assert_eq!(m.topic(), topic);
        assert_eq!(&m.payload[..], b"expert \xDE\xAD\xBE\xEF");
        assert_eq!(m.qos, qos);
    }
    // A large expert message (several read buffers, remaining length of 4 bytes).
    let big = 3 * 1024 * 1024 + 17;
    let d = c
        .publish_with("rt/big", QoS::AtLeastOnce, |buf| {
            buf.reserve(big);
            for i in 0..big {
                buf.put_u8((i % 251) as u8);
            }
        })
        .await
        .expect("publish big");
    within(20, "big ack", d).await.expect("big ack");
    let m = within(20, "big message", inc.recv()).await.expect("big");
    assert_eq!(m.payload.len(), big);
    assert!(m
        .payload
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i % 251) as u8));
    c.disconnect().await.expect("disconnect");
    assert!(within(5, "stream end", inc.recv()).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_0_1_2_simple_and_expert_mqtt5() {
    for k in BOTH {
        roundtrip(k, Protocol::V5).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_0_1_2_simple_and_expert_mqtt311() {
    for k in BOTH {
        roundtrip(k, Protocol::V311).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retain_and_publish_properties() {
    for k in BOTH {
        let b = Broker::start(k);
        let (c, _inc) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("connect");
        let props = Properties {
            content_type: Some(MqttStr::from_static("text/plain")),
            user_properties: vec![(MqttStr::from_static("k"), MqttStr::from_static("v"))],
            response_topic: Some(MqttStr::from_static("reply/here")),
            correlation_data: Some(Bytes::from_static(b"corr")),
            ..Default::default()
        };
        let opts = PublishOptions {
            retain: true,
            properties: props,
        };
        c.publish_ext("ret/a", QoS::AtLeastOnce, &opts, "kept")
            .await
            .expect("publish")
            .await
            .expect("ack");
        c.publish_with_ext("ret/b", QoS::ExactlyOnce, &opts, |b| {
            b.put_slice(b"kept too")
        })
        .await
        .expect("publish")
        .await
        .expect("ack");
        let (c2, mut inc2) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("connect");
        c2.subscribe("ret/+", QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        let mut got = Vec::new();
        for _ in 0..2 {
            let m = within(5, "retained", inc2.recv()).await.expect("retained");
            assert!(m.retain, "{k:?}: retained flag");
            assert_eq!(
                m.properties.content_type.as_deref(),
                Some("text/plain"),
                "{k:?}"
            );
            assert_eq!(m.properties.response_topic.as_deref(), Some("reply/here"));
            assert_eq!(m.properties.correlation_data.as_deref(), Some(&b"corr"[..]));
            assert_eq!(m.properties.user_properties.len(), 1);
            got.push((m.topic().to_string(), m.payload));
        }
        got.sort();
        assert_eq!(got[0], ("ret/a".to_string(), Bytes::from_static(b"kept")));
        assert_eq!(
            got[1],
            ("ret/b".to_string(), Bytes::from_static(b"kept too"))
        );
        c.disconnect().await.expect("disconnect");
        c2.disconnect().await.expect("disconnect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_qos1_and_qos2_in_flight_nothing_lost() {
    for k in BOTH {
        // The client subscribes to its own 2,000 QoS 1/2 publishes; when it
        // reads more slowly than the broker routes, zerofan's default
        // per-session bound (1,000 queued, `drop_new`) drops and counts the
        // excess, as configured. This test is about the client losing
        // nothing, so give the broker's queue room for the whole burst.
        let b = match k {
            Kind::Zerofan => Broker::zerofan_config("max_queued_messages = 10000\n"),
            Kind::Mosquitto => Broker::start(k),
        };
        let (c, mut inc) = Client::connect(ClientOptions::new(b.addr()).outgoing_capacity(16))
            .await
            .expect("connect");
        c.subscribe("many/#", QoS::ExactlyOnce)
            .await
            .expect("subscribe");
        let n = 2000u32;
        let c2 = c.clone();
        let pubs = tokio::spawn(async move {
            let mut ds = Vec::new();
            for i in 0..n {
                let qos = if i % 2 == 0 {
                    QoS::AtLeastOnce
                } else {
                    QoS::ExactlyOnce
                };
                ds.push(
                    c2.publish("many/x", qos, i.to_be_bytes().to_vec())
                        .await
                        .expect("publish"),
                );
            }
            for d in ds {
                let a = d.await.expect("ack");
                assert!(!a.reason.is_error());
            }
        });
        let mut seen = vec![false; n as usize];
        for _ in 0..n {
            let m = within(30, "many", inc.recv()).await.expect("message");
            let i = u32::from_be_bytes(m.payload[..4].try_into().expect("4 bytes"));
            seen[i as usize] = true;
        }
        within(30, "acks", pubs).await.expect("publisher");
        assert!(seen.iter().all(|&s| s), "{k:?}: every message arrived");
        c.disconnect().await.expect("disconnect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_topics_are_refused_locally() {
    let b = Broker::zerofan();
    let (c, _inc) = Client::connect(ClientOptions::new(b.addr()))
        .await
        .expect("connect");
    assert!(c.publish("a/+", QoS::AtMostOnce, "x").await.is_err());
    assert!(c.publish("", QoS::AtMostOnce, "x").await.is_err());
    assert!(c.subscribe("a/#/b", QoS::AtMostOnce).await.is_err());
    c.disconnect().await.expect("disconnect");
}

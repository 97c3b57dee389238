//! Every MQTT 5 subscription option against real brokers: No Local,
//! Retain As Published, Retain Handling, Subscription Identifier, several
//! filters in one SUBSCRIBE, shared subscriptions, and UNSUBSCRIBE with its
//! reason codes.

mod common;

use common::{within, Broker, BOTH};
use std::time::Duration;
use zerofan_client::{
    Client, ClientOptions, Incoming, Properties, PublishOptions, QoS, RetainHandling, Subscription,
};

/// Publish a marker and return every message received before it.
async fn until_marker(p: &Client, inc: &mut Incoming, marker: &str) -> Vec<(String, bool)> {
    p.publish(marker, QoS::AtLeastOnce, "marker")
        .await
        .expect("marker")
        .await
        .expect("ack");
    let mut got = Vec::new();
    loop {
        let m = within(10, "marker", inc.recv()).await.expect("message");
        if m.topic() == marker {
            return got;
        }
        got.push((m.topic().to_string(), m.retain));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_local_and_retain_as_published() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let (c, mut inc) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("c");
        let (other, _oi) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("other");
        let r = c
            .subscribe_many(
                [
                    Subscription::new("nl/#", QoS::AtLeastOnce).no_local(true),
                    Subscription::new("rap/#", QoS::AtLeastOnce).retain_as_published(true),
                    Subscription::new("norap/#", QoS::AtLeastOnce),
                    Subscription::new("mark/#", QoS::AtLeastOnce),
                ],
                Properties::default(),
            )
            .await
            .expect("subscribe");
        assert_eq!(r.reasons.len(), 4);
        assert!(r.reasons.iter().all(|r| r.0 == 1), "{kind:?}: {r:?}");
        c.publish("nl/own", QoS::AtLeastOnce, "x")
            .await
            .expect("p")
            .await
            .expect("ack");
        other
            .publish("nl/other", QoS::AtLeastOnce, "x")
            .await
            .expect("p")
            .await
            .expect("ack");
        let retained = PublishOptions {
            retain: true,
            ..Default::default()
        };
        other
            .publish_ext("rap/a", QoS::AtLeastOnce, &retained, "r")
            .await
            .expect("p")
            .await
            .expect("ack");
        other
            .publish_ext("norap/a", QoS::AtLeastOnce, &retained, "r")
            .await
            .expect("p")
            .await
            .expect("ack");
        let got = until_marker(&other, &mut inc, "mark/1").await;
        assert_eq!(
            got,
            vec![
                ("nl/other".to_string(), false),
                ("rap/a".to_string(), true),
                ("norap/a".to_string(), false)
            ],
            "{kind:?}"
        );
        c.disconnect().await.expect("disconnect");
        other.disconnect().await.expect("disconnect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retain_handling() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let (p, _pi) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("p");
        let retained = PublishOptions {
            retain: true,
            ..Default::default()
        };
        for t in ["rh0/a", "rh1/a", "rh2/a"] {
            p.publish_ext(t, QoS::AtLeastOnce, &retained, "kept")
                .await
                .expect("p")
                .await
                .expect("ack");
        }
        let (c, mut inc) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("c");
        c.subscribe("mark/#", QoS::AtLeastOnce).await.expect("sub");
        let subs = [
            Subscription::new("rh0/#", QoS::AtLeastOnce)
                .retain_handling(RetainHandling::SendAtSubscribe),
            Subscription::new("rh1/#", QoS::AtLeastOnce).retain_handling(RetainHandling::SendIfNew),
            Subscription::new("rh2/#", QoS::AtLeastOnce).retain_handling(RetainHandling::DoNotSend),
        ];
        c.subscribe_many(subs.clone(), Properties::default())
            .await
            .expect("subscribe");
        let mut got = until_marker(&p, &mut inc, "mark/1").await;
        got.sort();
        assert_eq!(
            got,
            vec![("rh0/a".to_string(), true), ("rh1/a".to_string(), true)],
            "{kind:?}: first subscribe"
        );
        c.subscribe_many(subs, Properties::default())
            .await
            .expect("subscribe again");
        let got = until_marker(&p, &mut inc, "mark/2").await;
        assert_eq!(
            got,
            vec![("rh0/a".to_string(), true)],
            "{kind:?}: resubscribe"
        );
        c.disconnect().await.expect("disconnect");
        p.disconnect().await.expect("disconnect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_identifiers_and_user_properties() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let (c, mut inc) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("c");
        let props = Properties {
            subscription_identifiers: vec![42],
            user_properties: vec![(
                zerofan_client::MqttStr::from_static("who"),
                zerofan_client::MqttStr::from_static("test"),
            )],
            ..Default::default()
        };
        c.subscribe_many([Subscription::new("sid/#", QoS::AtMostOnce)], props)
            .await
            .expect("subscribe");
        let props = Properties {
            subscription_identifiers: vec![7],
            ..Default::default()
        };
        c.subscribe_many([Subscription::new("sid/+", QoS::AtMostOnce)], props)
            .await
            .expect("subscribe");
        c.publish("sid/x", QoS::AtMostOnce, "x").await.expect("p");
        let mut ids = Vec::new();
        // mosquitto sends one copy per subscription, zerofan may send one
        // copy carrying both identifiers.
        while ids.len() < 2 {
            let m = within(10, "message", inc.recv()).await.expect("message");
            ids.extend(m.properties.subscription_identifiers.iter().copied());
        }
        ids.sort();
        assert_eq!(ids, vec![7, 42], "{kind:?}");
        c.disconnect().await.expect("disconnect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsubscribe_reason_codes_and_effect() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let (c, mut inc) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("c");
        c.subscribe("un/#", QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        c.subscribe("mark/#", QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        let r = c
            .unsubscribe_many(["un/#", "never/subscribed"], Properties::default())
            .await
            .expect("unsubscribe");
        assert_eq!(r.reasons.len(), 2, "{kind:?}");
        assert!(!r.reasons[0].is_error(), "{kind:?}: {r:?}");
        c.publish("un/x", QoS::AtLeastOnce, "x")
            .await
            .expect("p")
            .await
            .expect("ack");
        assert!(
            until_marker(&c, &mut inc, "mark/1").await.is_empty(),
            "{kind:?}"
        );
        c.disconnect().await.expect("disconnect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_subscription_splits_messages() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let (a, mut ia) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("a");
        let (bb, mut ib) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("b");
        a.subscribe("$share/g/sh/#", QoS::AtLeastOnce)
            .await
            .expect("sub a");
        bb.subscribe("$share/g/sh/#", QoS::AtLeastOnce)
            .await
            .expect("sub b");
        for i in 0..40u32 {
            a.publish("sh/x", QoS::AtLeastOnce, i.to_be_bytes().to_vec())
                .await
                .expect("p")
                .await
                .expect("ack");
        }
        let (mut na, mut nb) = (0, 0);
        while na + nb < 40 {
            tokio::select! {
                Some(_) = ia.recv() => na += 1,
                Some(_) = ib.recv() => nb += 1,
                _ = tokio::time::sleep(Duration::from_secs(10)) => panic!("{kind:?}: {na}+{nb} of 40"),
            }
        }
        assert_eq!(na + nb, 40, "{kind:?}");
        assert!(na > 0 && nb > 0, "{kind:?}: split {na}/{nb}");
        a.disconnect().await.expect("disconnect");
        bb.disconnect().await.expect("disconnect");
    }
}

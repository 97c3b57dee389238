//! Routing details: wildcards, overlapping subscriptions, No Local, topic
//! aliases, message expiry, queue bounds.

use super::*;

#[test]
fn wildcards_and_dollar_topics() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "+/b/#", opts(QoS::AtMostOnce));
    h.subscribe(sub, "#", opts(QoS::AtMostOnce));
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("a/b/c", "1", QoS::AtMostOnce, 0)),
    );
    h.send(
        publ,
        Packet::Publish(publish("$app/x", "2", QoS::AtMostOnce, 0)),
    );
    h.send(
        publ,
        Packet::Publish(publish("a/b", "3", QoS::AtMostOnce, 0)),
    );
    // Overlapping matches deliver once; `$` topics not matched by `#`.
    assert_eq!(h.out(sub).payloads(), ["1", "3"]);
}

#[test]
fn overlapping_subscriptions_highest_qos_and_all_ids() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe_id(sub, "a/+", opts(QoS::AtMostOnce), Some(1));
    h.subscribe_id(sub, "a/#", opts(QoS::AtLeastOnce), Some(2));
    h.subscribe_id(sub, "a/b", opts(QoS::ExactlyOnce), None);
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("a/b", "x", QoS::AtLeastOnce, 1)),
    );
    let out = h.out(sub);
    let p = out.publishes();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].qos, QoS::AtLeastOnce);
    let mut ids = p[0].properties.subscription_identifiers.clone();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2]);
}

#[test]
fn no_local_skips_own_messages() {
    let mut h = H::new();
    let c = h.client("c");
    h.subscribe(
        c,
        "t",
        SubscriptionOptions {
            no_local: true,
            ..opts(QoS::AtMostOnce)
        },
    );
    let other = h.client("other");
    h.subscribe(other, "t", opts(QoS::AtMostOnce));
    h.send(c, Packet::Publish(publish("t", "mine", QoS::AtMostOnce, 0)));
    assert!(h.out(c).publishes().is_empty());
    assert_eq!(h.out(other).payloads(), ["mine"]);
}

/// A bridge (mosquitto's `try_private`, level 0x84) gets none of its own
/// messages back and sees the retain flag as published, whatever its
/// subscription asked; an ordinary 3.1.1 client gets both as usual.
#[test]
fn bridge_mark_acts_as_no_local_and_retain_as_published() {
    let mut h = H::new();
    let (bridge, out) = h.connect_with("bridge", Protocol::V311, true, |c| c.bridge = true);
    assert_eq!(out.connack().unwrap().reason, ReasonCode::SUCCESS);
    let (plain, _) = h.connect_with("plain", Protocol::V311, true, |_| {});
    h.subscribe(bridge, "t/#", opts(QoS::AtLeastOnce));
    h.subscribe(plain, "t/#", opts(QoS::AtLeastOnce));
    h.out(bridge);
    h.out(plain);
    h.send(
        bridge,
        Packet::Publish(publish("t/1", "from-bridge", QoS::AtMostOnce, 0)),
    );
    assert!(h.out(bridge).publishes().is_empty(), "echoed to the bridge");
    assert_eq!(h.out(plain).payloads(), ["from-bridge"]);
    h.send(
        plain,
        Packet::Publish(publish("t/2", "own", QoS::AtMostOnce, 0)),
    );
    assert_eq!(h.out(plain).payloads(), ["own"]);
    let mut p = publish("t/3", "kept", QoS::AtMostOnce, 0);
    p.retain = true;
    h.send(plain, Packet::Publish(p));
    let to_bridge = h.out(bridge);
    let got = to_bridge.publishes();
    assert_eq!(got.len(), 2);
    assert!(got[1].retain, "a bridge sees the retain flag as published");
    assert!(!h.out(plain).publishes()[0].retain);
}

#[test]
fn inbound_topic_aliases() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "long/topic", opts(QoS::AtMostOnce));
    let publ = h.client("pub");
    let mut p = publish("long/topic", "1", QoS::AtMostOnce, 0);
    p.properties.topic_alias = Some(3);
    h.send(publ, Packet::Publish(p));
    let mut p = publish("", "2", QoS::AtMostOnce, 0);
    p.topic = MqttStr::new();
    p.properties.topic_alias = Some(3);
    h.send(publ, Packet::Publish(p));
    let out = h.out(sub);
    assert_eq!(out.payloads(), ["1", "2"]);
    assert!(out.publishes().iter().all(|p| &*p.topic == "long/topic"));

    // An alias above our maximum: 0x94.
    let mut p = publish("x", "3", QoS::AtMostOnce, 0);
    p.properties.topic_alias = Some(u16::MAX);
    let mut h2 = H::with(Config {
        topic_alias_maximum: 10,
        sys_interval: 0,
        ..Config::default()
    });
    let c = h2.client("c");
    h2.send(c, Packet::Publish(p));
    assert_eq!(
        h2.out(c).disconnect(),
        Some(ReasonCode::TOPIC_ALIAS_INVALID)
    );

    // An unknown alias with an empty topic: protocol error.
    let mut p = publish("x", "4", QoS::AtMostOnce, 0);
    p.topic = MqttStr::new();
    p.properties.topic_alias = Some(9);
    h.send(publ, Packet::Publish(p));
    assert_eq!(h.out(publ).disconnect(), Some(ReasonCode::PROTOCOL_ERROR));
}

#[test]
fn outbound_topic_aliases_up_to_the_client_maximum() {
    let mut h = H::new();
    let (sub, _) = h.connect_with("sub", Protocol::V5, true, |c| {
        c.properties.topic_alias_maximum = Some(1)
    });
    h.subscribe(sub, "#", opts(QoS::AtMostOnce));
    let publ = h.client("pub");
    for t in ["a", "a", "b", "a"] {
        h.send(publ, Packet::Publish(publish(t, t, QoS::AtMostOnce, 0)));
    }
    let out = h.out(sub);
    let p = out.publishes();
    assert_eq!((&*p[0].topic, p[0].properties.topic_alias), ("a", Some(1)));
    assert_eq!((&*p[1].topic, p[1].properties.topic_alias), ("", Some(1)));
    assert_eq!((&*p[2].topic, p[2].properties.topic_alias), ("b", None));
    assert_eq!((&*p[3].topic, p[3].properties.topic_alias), ("", Some(1)));
}

#[test]
fn message_expiry_counts_down_and_drops() {
    let mut h = H::new();
    let (sub, _) = h.connect_with("sub", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(1000)
    });
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    h.b.connection_lost(h.now, sub);
    let publ = h.client("pub");
    for (payload, expiry) in [("short", 5), ("long", 100)] {
        let mut p = publish("t", payload, QoS::AtLeastOnce, 1);
        p.properties.message_expiry_interval = Some(expiry);
        p.properties.content_type = Some(s("text/plain"));
        h.send(publ, Packet::Publish(p));
    }
    h.secs(10);
    let (_, out) = h.connect_with("sub", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(1000)
    });
    assert_eq!(out.payloads(), ["long"]);
    let p = out.publishes()[0];
    assert_eq!(p.properties.message_expiry_interval, Some(90));
    assert_eq!(p.properties.content_type.as_deref(), Some("text/plain"));
    assert_eq!(h.b.metrics().dropped_expired, 1);
}

#[test]
fn properties_pass_through_unchanged() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "t", opts(QoS::AtMostOnce));
    let publ = h.client("pub");
    let mut p = publish("t", "x", QoS::AtMostOnce, 0);
    p.properties.payload_format_indicator = Some(1);
    p.properties.response_topic = Some(s("reply/here"));
    p.properties.correlation_data = Some(Bytes::from_static(b"\x01\x02"));
    p.properties.user_properties.push((s("k"), s("v")));
    p.properties.user_properties.push((s("k"), s("v2")));
    let sent = p.properties.clone();
    h.send(publ, Packet::Publish(p));
    let out = h.out(sub);
    assert_eq!(out.publishes()[0].properties, sent);
}

#[test]
fn queue_bounds_drop_and_count() {
    let mut h = H::with(Config {
        max_queued_messages: 3,
        sys_interval: 0,
        ..Config::default()
    });
    // The message bound is for sessions without a connection (a connected
    // client is bounded by bytes: see `backpressure`).
    let (sub, _) = h.connect_with("sub", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(300)
    });
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    h.b.connection_lost(h.now, sub);
    let publ = h.client("pub");
    for i in 0..5 {
        h.send(
            publ,
            Packet::Publish(publish("t", &format!("q1-{i}"), QoS::AtLeastOnce, i + 1)),
        );
    }
    assert_eq!(h.b.queued_messages("sub"), Some(3));
    assert_eq!(h.b.metrics().dropped_queue_full, 2);
    // The publisher is unaffected: every PUBLISH got its PUBACK.
    assert_eq!(h.out(publ).packets.len(), 5);
    let (_, out) = h.connect_with("sub", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(300)
    });
    assert_eq!(out.payloads(), ["q1-0", "q1-1", "q1-2"]);
}

#[test]
fn qos0_drops_oldest_and_disconnect_policy() {
    let mut h = H::with(Config {
        // Two of the 400-byte messages below fit (each costs its bytes and
        // a queue slot), a third does not.
        max_online_queued_bytes: 1024,
        queue_full: crate::config::QueueFull::Disconnect,
        sys_interval: 0,
        ..Config::default()
    });
    let sub = h.client("sub");
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    let publ = h.client("pub");
    for i in 0..3 {
        h.send(
            publ,
            Packet::Publish(publish("t", &format!("{i:<400}"), QoS::AtMostOnce, 0)),
        );
    }
    assert_eq!(h.b.metrics().dropped_qos0_queue_full, 1);
    h.send(
        publ,
        Packet::Publish(publish("t", "a", QoS::AtLeastOnce, 1)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t", "b", QoS::AtLeastOnce, 2)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t", "c", QoS::AtLeastOnce, 3)),
    );
    let out = h.out(sub);
    assert_eq!(out.disconnect(), Some(ReasonCode::QUOTA_EXCEEDED));
    assert_eq!(h.b.metrics().slow_consumer_disconnects, 1);
}

#[test]
fn unsubscribe_stops_delivery() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "t", opts(QoS::AtMostOnce));
    h.send(
        sub,
        Packet::Unsubscribe(zerofan_codec::Unsubscribe {
            packet_id: 2,
            properties: Default::default(),
            filters: vec![s("t"), s("never")],
        }),
    );
    let out = h.out(sub);
    assert!(matches!(&out.packets[..], [Packet::UnsubAck(u)]
        if u.packet_id == 2 && u.reasons == [ReasonCode::SUCCESS, ReasonCode::NO_SUBSCRIPTION_EXISTED]));
    let publ = h.client("pub");
    h.send(publ, Packet::Publish(publish("t", "x", QoS::AtMostOnce, 0)));
    assert!(h.out(sub).publishes().is_empty());
}

#[test]
fn invalid_filters_fail_in_suback() {
    let mut h = H::new();
    let sub = h.client("sub");
    let out = h.subscribe(sub, "a/#/b", opts(QoS::AtMostOnce));
    assert!(
        matches!(&out.packets[..], [Packet::SubAck(a)] if a.reasons == [ReasonCode::TOPIC_FILTER_INVALID])
    );
}

#[test]
fn sys_tree_is_published() {
    let mut h = H::with(Config {
        sys_interval: 1,
        ..Config::default()
    });
    let sub = h.client("sub");
    h.subscribe(sub, "$SYS/broker/clients/connected", opts(QoS::AtMostOnce));
    let _ = h.out(sub);
    h.secs(1);
    assert_eq!(h.out(sub).payloads(), ["1"]);
    // `#` does not see `$SYS`.
    let other = h.client("other");
    h.subscribe(other, "#", opts(QoS::AtMostOnce));
    h.secs(1);
    assert!(h.out(other).publishes().is_empty());
}

/// A QoS 0 delivery goes out as the packet received only when it is byte
/// for byte that packet (`H::out` checks the bytes of every one that does):
/// not with a topic alias, a subscription identifier, RETAIN, a QoS 1
/// publish, an expiry, or to a client of the other protocol family.
#[test]
fn deliveries_sent_as_received_only_when_identical() {
    let mut h = H::new();
    let plain5 = h.client("plain5");
    let (alias5, _) = h.connect_with("alias5", Protocol::V5, true, |c| {
        c.properties.topic_alias_maximum = Some(4)
    });
    let ids5 = h.client("ids5");
    let (v311, _) = h.connect_with("v311", Protocol::V311, true, |_| {});
    let (v31, _) = h.connect_with("v31", Protocol::V31, true, |_| {});
    for c in [plain5, alias5, v311, v31] {
        h.subscribe(c, "t/#", opts(QoS::AtMostOnce));
    }
    h.subscribe_id(ids5, "t/#", opts(QoS::AtMostOnce), Some(7));

    // From an MQTT 5 publisher, with a user property: the plain MQTT 5
    // subscriber only.
    let pub5 = h.client("pub5");
    let mut p = publish("t/a", "five", QoS::AtMostOnce, 0);
    p.properties.user_properties.push((s("k"), s("v")));
    h.send(pub5, Packet::Publish(p));
    let counts = |h: &mut H| {
        [plain5, alias5, ids5, v311, v31].map(|c| {
            let out = h.out(c);
            assert_eq!(out.publishes().len(), 1);
            out.as_received
        })
    };
    assert_eq!(counts(&mut h), [1, 0, 0, 0, 0]);

    // From an MQTT 3.1.1 publisher: the 3.1.1 and 3.1 subscribers.
    let (pub311, _) = h.connect_with("pub311", Protocol::V311, true, |_| {});
    h.send(
        pub311,
        Packet::Publish(publish("t/b", "four", QoS::AtMostOnce, 0)),
    );
    assert_eq!(counts(&mut h), [0, 0, 0, 1, 1]);

    // QoS 1 (delivered at QoS 0 without its packet id), RETAIN, an expiry:
    // never as received.
    let mut retained = publish("t/c", "r", QoS::AtMostOnce, 0);
    retained.retain = true;
    let mut expiring = publish("t/d", "e", QoS::AtMostOnce, 0);
    expiring.properties.message_expiry_interval = Some(60);
    for p in [publish("t/q", "q", QoS::AtLeastOnce, 1), retained, expiring] {
        h.send(pub5, Packet::Publish(p));
        assert_eq!(counts(&mut h), [0; 5]);
    }
}

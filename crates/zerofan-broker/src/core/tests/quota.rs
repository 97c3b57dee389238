//! Quotas: subscriptions per session, retained messages and their bytes.

use super::*;

fn quota(f: impl FnOnce(&mut Config)) -> H {
    let mut cfg = Config {
        sys_interval: 0,
        ..Config::default()
    };
    f(&mut cfg);
    H::with(cfg)
}

fn suback_reasons(out: &Out) -> Vec<ReasonCode> {
    match &out.packets[0] {
        Packet::SubAck(a) => a.reasons.clone(),
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

fn retained(topic: &str, payload: &str, qos: QoS) -> Packet {
    let mut p = publish(topic, payload, qos, 1);
    p.retain = true;
    Packet::Publish(p)
}

fn puback_reason(out: &Out) -> ReasonCode {
    match out.packets.first() {
        Some(Packet::PubAck(a)) => a.reason,
        other => panic!("expected PUBACK, got {other:?}"),
    }
}

#[test]
fn subscriptions_per_session_are_capped_with_0x97() {
    let mut h = quota(|c| c.max_subscriptions_per_session = 2);
    let c = h.client("c");
    for f in ["a", "b"] {
        let out = h.subscribe(c, f, opts(QoS::AtLeastOnce));
        assert_eq!(suback_reasons(&out), [ReasonCode(1)]);
    }
    let out = h.subscribe(c, "c", opts(QoS::AtLeastOnce));
    assert_eq!(suback_reasons(&out), [ReasonCode::QUOTA_EXCEEDED]);
    // A filter it holds may be subscribed again (it replaces).
    let out = h.subscribe(c, "a", opts(QoS::AtMostOnce));
    assert_eq!(suback_reasons(&out), [ReasonCode(0)]);
    assert_eq!(h.b.metrics().security.refused_subscriptions, 1);
    // The refused filter routes nothing to it.
    let p = h.client("p");
    h.send(p, Packet::Publish(publish("c", "x", QoS::AtMostOnce, 0)));
    assert!(h.out(c).publishes().is_empty());
    // Room again after an UNSUBSCRIBE.
    h.send(
        c,
        Packet::Unsubscribe(zerofan_codec::Unsubscribe {
            packet_id: 2,
            properties: Default::default(),
            filters: vec![s("b")],
        }),
    );
    h.out(c);
    let out = h.subscribe(c, "c", opts(QoS::AtMostOnce));
    assert_eq!(suback_reasons(&out), [ReasonCode(0)]);
}

#[test]
fn a_v311_subscription_over_the_cap_gets_0x80() {
    let mut h = quota(|c| c.max_subscriptions_per_session = 1);
    let (c, _) = h.connect_with("old", Protocol::V311, true, |_| {});
    h.out(c);
    h.send(
        c,
        Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Default::default(),
            filters: vec![
                (s("a"), opts(QoS::AtMostOnce)),
                (s("b"), opts(QoS::AtMostOnce)),
            ],
        }),
    );
    let out = h.out(c);
    assert_eq!(
        suback_reasons(&out),
        [ReasonCode(0), ReasonCode::UNSPECIFIED_ERROR]
    );
    assert_eq!(h.b.metrics().security.refused_subscriptions, 1);
}

#[test]
fn retained_messages_over_the_count_are_delivered_not_kept() {
    let mut h = quota(|c| c.max_retained_messages = 2);
    let sub = h.client("sub");
    h.subscribe(sub, "r/#", opts(QoS::AtLeastOnce));
    let p = h.client("p");
    for t in ["r/a", "r/b"] {
        h.send(p, retained(t, "x", QoS::AtLeastOnce));
        assert_eq!(puback_reason(&h.out(p)), ReasonCode::SUCCESS);
    }
    h.send(p, retained("r/c", "x", QoS::AtLeastOnce));
    assert_eq!(puback_reason(&h.out(p)), ReasonCode::QUOTA_EXCEEDED);
    assert_eq!(h.b.retained_count(), 2);
    assert_eq!(h.b.metrics().security.refused_retained_messages, 1);
    assert_eq!(
        h.out(sub).payloads(),
        ["x", "x", "x"],
        "all three delivered"
    );
    // Replacing a kept topic and clearing one are not new topics.
    h.send(p, retained("r/a", "y", QoS::AtLeastOnce));
    assert_eq!(puback_reason(&h.out(p)), ReasonCode::SUCCESS);
    h.send(p, retained("r/b", "", QoS::AtLeastOnce));
    assert_eq!(puback_reason(&h.out(p)), ReasonCode::SUCCESS);
    h.send(p, retained("r/c", "z", QoS::AtLeastOnce));
    assert_eq!(puback_reason(&h.out(p)), ReasonCode::SUCCESS);
    let late = h.client("late");
    let mut got = h.subscribe(late, "r/#", opts(QoS::AtMostOnce)).payloads();
    got.sort();
    assert_eq!(got, ["y", "z"]);
    // A plain publish after a refused retained one is answered as usual.
    h.send(
        p,
        Packet::Publish(publish("nobody", "x", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(
        puback_reason(&h.out(p)),
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
}

#[test]
fn retained_bytes_are_capped_and_a_v311_publisher_gets_a_plain_ack() {
    // Topic and payload count: "t/1" + 7 bytes = 10.
    let mut h = quota(|c| c.max_retained_bytes = 25);
    let p = h.client("p");
    h.send(p, retained("t/1", "1234567", QoS::AtLeastOnce));
    h.send(p, retained("t/2", "1234567", QoS::AtLeastOnce));
    h.out(p);
    h.send(p, retained("t/3", "1234567", QoS::AtLeastOnce));
    assert_eq!(puback_reason(&h.out(p)), ReasonCode::QUOTA_EXCEEDED);
    // Growing a kept message past the cap is refused too; the old one stays.
    h.send(p, retained("t/1", "1234567890123456", QoS::AtLeastOnce));
    assert_eq!(puback_reason(&h.out(p)), ReasonCode::QUOTA_EXCEEDED);
    assert_eq!(h.b.metrics().security.refused_retained_bytes, 2);
    let sub = h.client("sub");
    let got = h.subscribe(sub, "t/1", opts(QoS::AtMostOnce)).payloads();
    assert_eq!(got, ["1234567"]);
    // MQTT 3.1.1 has no reason code: acknowledged, still not kept.
    let (old, _) = h.connect_with("old", Protocol::V311, true, |_| {});
    h.out(old);
    h.send(old, retained("t/4", "1234567", QoS::AtLeastOnce));
    assert_eq!(puback_reason(&h.out(old)), ReasonCode::SUCCESS);
    assert_eq!(h.b.retained_count(), 2);
    assert_eq!(h.b.metrics().security.refused_retained_bytes, 3);
}

#[test]
fn the_brokers_own_sys_messages_take_no_retained_quota() {
    let mut h = quota(|c| {
        c.max_retained_messages = 1;
        c.sys_interval = 1;
    });
    h.secs(2);
    assert!(h.b.retained_count() > 10, "$SYS topics are retained");
    let p = h.client("p");
    h.send(p, retained("r/1", "x", QoS::AtLeastOnce));
    assert_eq!(
        puback_reason(&h.out(p)),
        ReasonCode::NO_MATCHING_SUBSCRIBERS,
        "kept"
    );
    h.send(p, retained("r/2", "x", QoS::AtLeastOnce));
    assert_eq!(puback_reason(&h.out(p)), ReasonCode::QUOTA_EXCEEDED);
}

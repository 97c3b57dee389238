//! QoS 0/1/2 flows in both directions, flow control, packet ids.

use super::*;

#[test]
fn qos0_qos1_qos2_inbound_acks_and_routing() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "t/#", opts(QoS::ExactlyOnce));
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t/0", "zero", QoS::AtMostOnce, 0)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t/1", "one", QoS::AtLeastOnce, 7)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t/2", "two", QoS::ExactlyOnce, 8)),
    );
    // A resent QoS 2 PUBLISH before PUBREL is not routed again.
    let mut dup = publish("t/2", "two", QoS::ExactlyOnce, 8);
    dup.dup = true;
    h.send(publ, Packet::Publish(dup));
    let out = h.out(publ);
    assert!(
        matches!(&out.packets[0], Packet::PubAck(a) if a.packet_id == 7 && a.reason == ReasonCode::SUCCESS)
    );
    assert!(matches!(&out.packets[1], Packet::PubRec(a) if a.packet_id == 8));
    assert!(matches!(&out.packets[2], Packet::PubRec(a) if a.packet_id == 8));
    h.send(publ, Packet::PubRel(ack(8)));
    assert!(
        matches!(&h.out(publ).packets[..], [Packet::PubComp(a)] if a.packet_id == 8 && a.reason == ReasonCode::SUCCESS)
    );
    // Unknown PUBREL: 0x92.
    h.send(publ, Packet::PubRel(ack(9)));
    assert!(
        matches!(&h.out(publ).packets[..], [Packet::PubComp(a)] if a.reason == ReasonCode::PACKET_IDENTIFIER_NOT_FOUND)
    );

    let got = h.out(sub);
    assert_eq!(got.payloads(), ["zero", "one", "two"]);
    let qos: Vec<QoS> = got.publishes().iter().map(|p| p.qos).collect();
    assert_eq!(qos, [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce]);
}

#[test]
fn puback_reports_no_matching_subscribers_in_v5() {
    let mut h = H::new();
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("nobody", "x", QoS::AtLeastOnce, 1)),
    );
    assert!(
        matches!(&h.out(publ).packets[..], [Packet::PubAck(a)] if a.reason == ReasonCode::NO_MATCHING_SUBSCRIBERS)
    );
}

#[test]
fn qos_is_downgraded_to_the_subscription() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "x", QoS::ExactlyOnce, 1)),
    );
    assert_eq!(h.out(sub).publishes()[0].qos, QoS::AtLeastOnce);
}

#[test]
fn outbound_qos1_and_qos2_flows() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "t", opts(QoS::ExactlyOnce));
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "a", QoS::AtLeastOnce, 1)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t", "b", QoS::ExactlyOnce, 2)),
    );
    let out = h.out(sub);
    let p = out.publishes();
    let (id1, id2) = (p[0].packet_id, p[1].packet_id);
    assert_ne!(id1, id2);
    assert_eq!(h.b.inflight_messages("sub"), Some(2));
    h.send(sub, Packet::PubAck(ack(id1)));
    assert_eq!(h.b.inflight_messages("sub"), Some(1));
    h.send(sub, Packet::PubRec(ack(id2)));
    assert!(matches!(&h.out(sub).packets[..], [Packet::PubRel(a)] if a.packet_id == id2));
    assert_eq!(h.b.inflight_messages("sub"), Some(1));
    h.send(sub, Packet::PubComp(ack(id2)));
    assert_eq!(h.b.inflight_messages("sub"), Some(0));
}

#[test]
fn client_receive_maximum_limits_inflight() {
    let mut h = H::new();
    let (sub, _) = h.connect_with("sub", Protocol::V5, true, |c| {
        c.properties.receive_maximum = Some(2)
    });
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    let publ = h.client("pub");
    for i in 1..=5 {
        h.send(
            publ,
            Packet::Publish(publish("t", &i.to_string(), QoS::AtLeastOnce, i)),
        );
    }
    let out = h.out(sub);
    assert_eq!(out.payloads(), ["1", "2"]);
    h.send(sub, Packet::PubAck(ack(out.publishes()[0].packet_id)));
    assert_eq!(h.out(sub).payloads(), ["3"]);
}

#[test]
fn exceeding_our_receive_maximum_is_0x93() {
    let mut h = H::with(Config {
        receive_maximum: 2,
        sys_interval: 0,
        ..Config::default()
    });
    let c = h.client("c");
    for i in 1..=3 {
        h.send(c, Packet::Publish(publish("t", "x", QoS::ExactlyOnce, i)));
    }
    let out = h.out(c);
    assert_eq!(out.disconnect(), Some(ReasonCode::RECEIVE_MAXIMUM_EXCEEDED));
    assert!(out.closed);
}

#[test]
fn max_inflight_caps_the_window_too() {
    let mut h = H::with(Config {
        max_inflight: 1,
        sys_interval: 0,
        ..Config::default()
    });
    let (sub, _) = h.connect_with("sub", Protocol::V311, true, |_| {});
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "1", QoS::AtLeastOnce, 1)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t", "2", QoS::AtLeastOnce, 2)),
    );
    assert_eq!(h.out(sub).payloads(), ["1"]);
}

#[test]
fn messages_larger_than_the_client_maximum_are_dropped() {
    let mut h = H::new();
    let (sub, _) = h.connect_with("sub", Protocol::V5, true, |c| {
        c.properties.maximum_packet_size = Some(30)
    });
    h.subscribe(sub, "t", opts(QoS::AtMostOnce));
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "small", QoS::AtMostOnce, 0)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t", &"x".repeat(100), QoS::AtMostOnce, 0)),
    );
    assert_eq!(h.out(sub).payloads(), ["small"]);
    assert_eq!(h.b.metrics().dropped_too_large, 1);
}

#[test]
fn qos0_overtakes_a_full_window() {
    let mut h = H::new();
    let (sub, _) = h.connect_with("sub", Protocol::V5, true, |c| {
        c.properties.receive_maximum = Some(1)
    });
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    let publ = h.client("pub");
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
        Packet::Publish(publish("t", "zero", QoS::AtMostOnce, 0)),
    );
    let out = h.out(sub);
    assert_eq!(out.payloads(), ["a", "zero"]);
    h.send(sub, Packet::PubAck(ack(out.publishes()[0].packet_id)));
    assert_eq!(h.out(sub).payloads(), ["b"]);
}

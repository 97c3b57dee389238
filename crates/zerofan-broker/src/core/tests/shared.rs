//! Shared subscriptions: round robin and hand-over of unacknowledged messages.

use super::*;

#[test]
fn round_robin_between_members() {
    let mut h = H::new();
    let a = h.client("a");
    let b = h.client("b");
    h.subscribe(a, "$share/g/t/+", opts(QoS::AtMostOnce));
    h.subscribe(b, "$share/g/t/+", opts(QoS::AtMostOnce));
    let plain = h.client("plain");
    h.subscribe(plain, "t/+", opts(QoS::AtMostOnce));
    let publ = h.client("pub");
    for i in 0..4 {
        h.send(
            publ,
            Packet::Publish(publish("t/x", &i.to_string(), QoS::AtMostOnce, 0)),
        );
    }
    assert_eq!(h.out(a).payloads(), ["0", "2"]);
    assert_eq!(h.out(b).payloads(), ["1", "3"]);
    assert_eq!(h.out(plain).payloads().len(), 4);
}

#[test]
fn unacked_messages_move_to_another_member() {
    let mut h = H::new();
    let a = h.client("a");
    let b = h.client("b");
    h.subscribe(a, "$share/g/t", opts(QoS::AtLeastOnce));
    h.subscribe(b, "$share/g/t", opts(QoS::AtLeastOnce));
    let publ = h.client("pub");
    for i in 0..4 {
        h.send(
            publ,
            Packet::Publish(publish("t", &i.to_string(), QoS::AtLeastOnce, i + 1)),
        );
    }
    let got_a = h.out(a);
    assert_eq!(got_a.payloads(), ["0", "2"]);
    // a acknowledges "0" only, then goes away.
    h.send(a, Packet::PubAck(ack(got_a.publishes()[0].packet_id)));
    let got_b = h.out(b);
    assert_eq!(got_b.payloads(), ["1", "3"]);
    h.b.connection_lost(h.now, a);
    assert_eq!(h.out(b).payloads(), ["2"]);
}

#[test]
fn no_local_on_shared_is_a_protocol_error() {
    let mut h = H::new();
    let a = h.client("a");
    let out = h.subscribe(
        a,
        "$share/g/t",
        SubscriptionOptions {
            no_local: true,
            ..opts(QoS::AtMostOnce)
        },
    );
    assert_eq!(out.disconnect(), Some(ReasonCode::PROTOCOL_ERROR));
}

#[test]
fn shared_subscriptions_get_no_retained_messages() {
    let mut h = H::new();
    let publ = h.client("pub");
    let mut p = publish("t", "r", QoS::AtMostOnce, 0);
    p.retain = true;
    h.send(publ, Packet::Publish(p));
    let a = h.client("a");
    assert!(h
        .subscribe(a, "$share/g/t", opts(QoS::AtMostOnce))
        .publishes()
        .is_empty());
}

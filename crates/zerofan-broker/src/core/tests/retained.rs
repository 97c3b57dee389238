//! Retained messages and Retain Handling / Retain As Published.

use super::*;

fn retained(topic: &str, payload: &str) -> Packet {
    let mut p = publish(topic, payload, QoS::AtLeastOnce, 1);
    p.retain = true;
    Packet::Publish(p)
}

#[test]
fn set_replace_clear() {
    let mut h = H::new();
    let publ = h.client("pub");
    h.send(publ, retained("r/a", "one"));
    h.send(publ, retained("r/a", "two"));
    h.send(publ, retained("r/b", "bee"));
    assert_eq!(h.b.retained_count(), 2);
    let sub = h.client("sub");
    let out = h.subscribe(sub, "r/#", opts(QoS::AtLeastOnce));
    assert!(
        matches!(out.packets[0], Packet::SubAck(_)),
        "SUBACK comes first"
    );
    let mut got = out.payloads();
    got.sort();
    assert_eq!(got, ["bee", "two"]);
    assert!(out.publishes().iter().all(|p| p.retain));

    h.send(publ, retained("r/a", ""));
    assert_eq!(h.b.retained_count(), 1);
    let sub2 = h.client("sub2");
    assert_eq!(
        h.subscribe(sub2, "r/#", opts(QoS::AtMostOnce)).payloads(),
        ["bee"]
    );
}

#[test]
fn live_messages_clear_retain_unless_retain_as_published() {
    let mut h = H::new();
    let a = h.client("a");
    h.subscribe(a, "t", opts(QoS::AtMostOnce));
    let b = h.client("b");
    h.subscribe(
        b,
        "t",
        SubscriptionOptions {
            retain_as_published: true,
            ..opts(QoS::AtMostOnce)
        },
    );
    let publ = h.client("pub");
    h.send(publ, retained("t", "x"));
    assert!(!h.out(a).publishes()[0].retain);
    assert!(h.out(b).publishes()[0].retain);
}

#[test]
fn retain_handling_0_1_2() {
    let mut h = H::new();
    let publ = h.client("pub");
    h.send(publ, retained("t", "x"));
    let sub = h.client("sub");
    let rh = |n| SubscriptionOptions {
        retain_handling: n,
        ..opts(QoS::AtMostOnce)
    };
    assert_eq!(h.subscribe(sub, "t", rh(0)).payloads(), ["x"]);
    assert_eq!(
        h.subscribe(sub, "t", rh(0)).payloads(),
        ["x"],
        "0: on every subscribe"
    );
    assert!(
        h.subscribe(sub, "t", rh(1)).payloads().is_empty(),
        "1: only when new"
    );
    let sub2 = h.client("sub2");
    assert_eq!(h.subscribe(sub2, "t", rh(1)).payloads(), ["x"]);
    let sub3 = h.client("sub3");
    assert!(
        h.subscribe(sub3, "t", rh(2)).payloads().is_empty(),
        "2: never"
    );
}

#[test]
fn small_retained_messages_are_compacted() {
    let mut h = H::new();
    let publ = h.client("pub");
    h.send(publ, retained("t", "small"));
    assert_eq!(h.b.metrics().compactions, 1);
}

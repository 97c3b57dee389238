//! Persistent sessions: resume, DUP redelivery, expiry by jumping the clock.

use super::*;

fn persistent(h: &mut H, id: &str, expiry: u32) -> (ConnId, Out) {
    h.connect_with(id, Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(expiry)
    })
}

#[test]
fn resume_redelivers_unacked_with_dup_then_queued() {
    let mut h = H::new();
    let (sub, out) = persistent(&mut h, "sub", 100);
    assert!(!out.connack().unwrap().session_present);
    h.subscribe(sub, "t", opts(QoS::ExactlyOnce));
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "q1", QoS::AtLeastOnce, 1)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t", "q2", QoS::ExactlyOnce, 2)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t", "q2b", QoS::ExactlyOnce, 3)),
    );
    let first = h.out(sub);
    assert_eq!(first.payloads(), ["q1", "q2", "q2b"]);
    let ids: Vec<u16> = first.publishes().iter().map(|p| p.packet_id).collect();
    // q2b reached PUBREC: after resume it continues with PUBREL, not PUBLISH.
    h.send(sub, Packet::PubRec(ack(ids[2])));
    let _ = h.out(sub);
    h.b.connection_lost(h.now, sub);
    h.send(
        publ,
        Packet::Publish(publish("t", "while-away", QoS::AtLeastOnce, 4)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t", "qos0-lost", QoS::AtMostOnce, 0)),
    );

    let (sub, out) = persistent(&mut h, "sub", 100);
    assert!(out.connack().unwrap().session_present);
    // CONNACK, then DUP PUBLISH q1, q2, then PUBREL for q2b, then the queue.
    let p = out.publishes();
    assert_eq!(out.payloads(), ["q1", "q2", "while-away"]);
    assert!(p[0].dup && p[1].dup && !p[2].dup);
    assert_eq!((p[0].packet_id, p[1].packet_id), (ids[0], ids[1]));
    assert!(out
        .packets
        .iter()
        .any(|p| matches!(p, Packet::PubRel(a) if a.packet_id == ids[2])));
    let _ = sub;
}

#[test]
fn v311_clean_session_false_keeps_subscriptions() {
    let mut h = H::new();
    let (sub, _) = h.connect_with("sub", Protocol::V311, false, |_| {});
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    h.b.connection_lost(h.now, sub);
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "kept", QoS::AtLeastOnce, 1)),
    );
    let (_, out) = h.connect_with("sub", Protocol::V311, false, |_| {});
    assert!(out.connack().unwrap().session_present);
    assert_eq!(out.payloads(), ["kept"]);
}

#[test]
fn clean_start_discards_the_old_session() {
    let mut h = H::new();
    let (sub, _) = persistent(&mut h, "sub", 100);
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    h.b.connection_lost(h.now, sub);
    let (sub, out) = h.connect_with("sub", Protocol::V5, true, |_| {});
    assert!(!out.connack().unwrap().session_present);
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "x", QoS::AtLeastOnce, 1)),
    );
    assert!(h.out(sub).publishes().is_empty());
}

#[test]
fn session_expires_when_the_clock_jumps() {
    let mut h = H::new();
    let (sub, _) = persistent(&mut h, "sub", 60);
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    h.b.connection_lost(h.now, sub);
    assert_eq!(h.b.session_count(), 1);
    h.secs(59);
    assert_eq!(h.b.session_count(), 1);
    h.secs(2);
    assert_eq!(h.b.session_count(), 0);
    assert_eq!(h.b.metrics().sessions_expired, 1);
    let (_, out) = persistent(&mut h, "sub", 60);
    assert!(!out.connack().unwrap().session_present);
}

#[test]
fn expiry_set_on_disconnect() {
    let mut h = H::new();
    let (c, _) = persistent(&mut h, "a", 100);
    let mut d = Disconnect::default();
    d.properties.session_expiry_interval = Some(0);
    h.send(c, Packet::Disconnect(d));
    h.b.connection_lost(h.now, c);
    assert_eq!(
        h.b.session_count(),
        0,
        "expiry 0 on DISCONNECT ends the session now"
    );

    // 0 in CONNECT, non-zero in DISCONNECT: protocol error.
    let c = h.client("b");
    let mut d = Disconnect::default();
    d.properties.session_expiry_interval = Some(10);
    h.send(c, Packet::Disconnect(d));
    assert_eq!(h.out(c).disconnect(), Some(ReasonCode::PROTOCOL_ERROR));
}

#[test]
fn session_expiry_is_capped_by_config() {
    let mut h = H::with(Config {
        max_session_expiry: 10,
        sys_interval: 0,
        ..Config::default()
    });
    let (c, _) = persistent(&mut h, "a", 1000);
    h.b.connection_lost(h.now, c);
    h.secs(11);
    assert_eq!(h.b.session_count(), 0);
}

#[test]
fn resend_after_resume_respects_a_smaller_receive_maximum() {
    let mut h = H::new();
    let (sub, _) = persistent(&mut h, "sub", 100);
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    let publ = h.client("pub");
    for i in 0..3 {
        h.send(
            publ,
            Packet::Publish(publish("t", &i.to_string(), QoS::AtLeastOnce, i + 1)),
        );
    }
    assert_eq!(h.out(sub).payloads(), ["0", "1", "2"]);
    h.b.connection_lost(h.now, sub);
    let (sub, out) = h.connect_with("sub", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(100);
        c.properties.receive_maximum = Some(1);
    });
    assert_eq!(out.payloads(), ["0"]);
    assert!(out.publishes()[0].dup);
    h.send(sub, Packet::PubAck(ack(out.publishes()[0].packet_id)));
    assert_eq!(h.out(sub).payloads(), ["1"]);
}

#[test]
fn going_offline_compacts_small_kept_messages_once() {
    let mut h = H::new();
    let (sub, _) = persistent(&mut h, "sub", 100);
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "inflight", QoS::AtLeastOnce, 1)),
    );
    let _ = h.out(sub);
    h.send(
        publ,
        Packet::Publish(publish("t", "queued", QoS::AtLeastOnce, 2)),
    );
    assert_eq!(
        h.b.metrics().compactions,
        0,
        "online deliveries share the read buffer"
    );
    h.b.connection_lost(h.now, sub);
    assert_eq!(h.b.metrics().compactions, 2);
    h.b.connection_lost(h.now, publ);
    let (_, out) = persistent(&mut h, "sub", 100);
    assert_eq!(out.payloads(), ["inflight", "queued"]);
    let (s2, _) = persistent(&mut h, "sub", 100);
    let _ = s2;
    assert_eq!(
        h.b.metrics().compactions,
        2,
        "already owned: not copied again"
    );
}

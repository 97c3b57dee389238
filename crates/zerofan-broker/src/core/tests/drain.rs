//! A node being removed from its cluster (`core/drain.rs`): connected
//! clients are sent to the named node (MQTT 5: DISCONNECT 0x9D with a
//! Server Reference; 3.1.1: closed), later CONNECTs are refused the same
//! way, and sessions stay until another node takes them over.

use super::*;

fn reference(out: &Out) -> Option<String> {
    out.packets.iter().find_map(|p| match p {
        Packet::Disconnect(d) => d
            .properties
            .server_reference
            .as_ref()
            .map(|r| r.to_string()),
        Packet::ConnAck(c) => c
            .properties
            .server_reference
            .as_ref()
            .map(|r| r.to_string()),
        _ => None,
    })
}

#[test]
fn draining_sends_mqtt5_clients_to_the_named_node_and_closes_311_ones() {
    let mut h = H::new();
    let (v5, _) = h.connect_with("v5", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(3600)
    });
    h.subscribe(v5, "t", opts(QoS::AtLeastOnce));
    let (v3, _) = h.connect_with("v3", Protocol::V311, false, |_| {});
    assert_eq!(h.b.drain(h.now, Some("127.0.0.1:1884")), 2);

    let out = h.out(v5);
    assert_eq!(out.disconnect(), Some(ReasonCode::SERVER_MOVED));
    assert_eq!(reference(&out).as_deref(), Some("127.0.0.1:1884"));
    assert!(out.closed);
    let out = h.out(v3);
    assert!(
        out.packets.is_empty(),
        "3.1.1 has no DISCONNECT from the server"
    );
    assert!(out.closed);
    // The persistent sessions wait here for their clients to connect to
    // another node, which takes them over.
    assert_eq!(h.b.drain_progress(), (2, 0));

    // New CONNECTs are refused and sent to the same node.
    let (c, out) = h.connect_with("late", Protocol::V5, true, |_| {});
    let ack = out.connack().unwrap();
    assert_eq!(ack.reason, ReasonCode::SERVER_MOVED);
    assert_eq!(reference(&out).as_deref(), Some("127.0.0.1:1884"));
    assert!(h.out(c).closed || out.closed);
    let (_, out) = h.connect_with("late3", Protocol::V311, true, |_| {});
    // 3.1.1 return code 3, server unavailable.
    assert_eq!(
        out.connack().unwrap().reason,
        ReasonCode::SERVER_UNAVAILABLE
    );
    assert_eq!(h.b.drain_told(), 4);

    // Another node takes a session over: it is counted as moved.
    h.b.client_taken(h.now, "v5");
    assert_eq!(h.b.drain_progress(), (1, 1));
}

#[test]
fn without_a_node_to_name_clients_are_told_to_use_another_server() {
    let mut h = H::new();
    let (c, _) = h.connect_with("v5", Protocol::V5, true, |_| {});
    h.b.drain(h.now, None);
    let out = h.out(c);
    assert_eq!(out.disconnect(), Some(ReasonCode::USE_ANOTHER_SERVER));
    assert_eq!(reference(&out), None);
    let (_, out) = h.connect_with("late", Protocol::V5, true, |_| {});
    assert_eq!(
        out.connack().unwrap().reason,
        ReasonCode::USE_ANOTHER_SERVER
    );
}

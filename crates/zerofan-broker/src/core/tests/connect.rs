//! CONNECT / CONNACK variants, takeover, keep alive, bad input, shutdown.

use super::*;

#[test]
fn v5_connack_success_and_first_packet_must_be_connect() {
    let mut h = H::new();
    let c = h.client("a");
    assert_eq!(h.b.connected_clients(), 1);
    h.send(c, Packet::PingReq);
    assert!(matches!(h.out(c).packets[..], [Packet::PingResp]));

    let c2 = h.open();
    h.send(c2, Packet::PingReq);
    let out = h.out(c2);
    assert!(out.closed && out.packets.is_empty());
}

#[test]
fn second_connect_is_a_protocol_error() {
    let mut h = H::new();
    let c = h.client("a");
    h.send(
        c,
        Packet::Connect(Box::new(connect_packet("a", Protocol::V5, true))),
    );
    let out = h.out(c);
    assert_eq!(out.disconnect(), Some(ReasonCode::PROTOCOL_ERROR));
    assert!(out.closed);
    assert_eq!(h.b.metrics().protocol_errors, 1);
}

#[test]
fn empty_client_id_v5_is_assigned() {
    let mut h = H::new();
    let (_, out) = h.connect_with("", Protocol::V5, true, |_| {});
    let ack = out.connack().unwrap();
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    assert!(ack
        .properties
        .assigned_client_identifier
        .as_ref()
        .is_some_and(|s| !s.is_empty()));
}

/// Assigned identifiers carry 128 random bits: a client may not guess the
/// identifier assigned to another and take over its session.
#[test]
fn assigned_client_ids_are_unguessable() {
    let mut h = H::new();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..64 {
        let (_, out) = h.connect_with("", Protocol::V5, true, |_| {});
        let ack = out.connack().unwrap();
        let id = ack.properties.assigned_client_identifier.clone().unwrap();
        let hex = id.strip_prefix("zerofan-").unwrap();
        assert_eq!(hex.len(), 32, "{id}");
        assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        assert!(seen.insert(hex.to_string()), "assigned twice: {id}");
    }
    // No two consecutive ids share a long prefix, as a counter's would.
    let ids: Vec<u128> = seen
        .iter()
        .map(|h| u128::from_str_radix(h, 16).unwrap())
        .collect();
    let close = ids
        .iter()
        .flat_map(|a| ids.iter().map(move |b| a.abs_diff(*b)))
        .filter(|d| *d != 0 && *d < 1 << 64)
        .count();
    assert_eq!(close, 0, "assigned ids look sequential");
}

#[test]
fn empty_client_id_v311() {
    let mut h = H::new();
    let (_, out) = h.connect_with("", Protocol::V311, true, |_| {});
    assert_eq!(out.connack().unwrap().reason, ReasonCode::SUCCESS);
    assert!(!out.closed);
    let (_, out) = h.connect_with("", Protocol::V311, false, |_| {});
    // Identifier rejected: return code 2 on the wire.
    assert_eq!(
        out.connack().unwrap().reason,
        ReasonCode::CLIENT_IDENTIFIER_NOT_VALID
    );
    assert!(out.closed);
}

#[test]
fn unsupported_auth_method_is_refused() {
    let mut h = H::new();
    let (_, out) = h.connect_with("a", Protocol::V5, true, |c| {
        c.properties.authentication_method = Some(s("SCRAM-SHA-1"));
    });
    assert_eq!(
        out.connack().unwrap().reason,
        ReasonCode::BAD_AUTHENTICATION_METHOD
    );
    assert!(out.closed);
}

#[test]
fn connack_announces_limits() {
    let mut h = H::with(Config {
        max_keepalive: 30,
        receive_maximum: 10,
        max_packet_size: 1000,
        max_session_expiry: 100,
        topic_alias_maximum: 5,
        retain_available: false,
        sys_interval: 0,
        ..Config::default()
    });
    let (_, out) = h.connect_with("a", Protocol::V5, true, |c| {
        c.keep_alive = 60;
        c.properties.session_expiry_interval = Some(1000);
    });
    let p = &out.connack().unwrap().properties;
    assert_eq!(p.server_keep_alive, Some(30));
    assert_eq!(p.receive_maximum, Some(10));
    assert_eq!(p.maximum_packet_size, Some(1000));
    assert_eq!(p.session_expiry_interval, Some(100));
    assert_eq!(p.topic_alias_maximum, Some(5));
    assert_eq!(p.retain_available, Some(0));
}

#[test]
fn takeover_disconnects_the_old_connection() {
    let mut h = H::new();
    let old = h.client("same");
    let (new, out) = h.connect_with("same", Protocol::V5, true, |_| {});
    assert_eq!(out.connack().unwrap().reason, ReasonCode::SUCCESS);
    let old_out = h.out(old);
    assert_eq!(old_out.disconnect(), Some(ReasonCode::SESSION_TAKEN_OVER));
    assert!(old_out.closed);
    h.b.connection_lost(h.now, old);
    assert_eq!(h.b.connected_clients(), 1);
    h.send(new, Packet::PingReq);
    assert!(matches!(h.out(new).packets[..], [Packet::PingResp]));
    assert_eq!(h.b.metrics().takeovers, 1);
}

#[test]
fn keep_alive_is_enforced_at_one_and_a_half_times() {
    let mut h = H::new();
    let (c, _) = h.connect_with("a", Protocol::V5, true, |c| c.keep_alive = 10);
    h.secs(14);
    assert!(!h.out(c).closed);
    h.send(c, Packet::PingReq);
    let _ = h.out(c);
    h.secs(14);
    assert!(!h.out(c).closed, "activity restarts the keep alive");
    h.secs(2);
    let out = h.out(c);
    assert_eq!(out.disconnect(), Some(ReasonCode::KEEP_ALIVE_TIMEOUT));
    assert!(out.closed);
    assert_eq!(h.b.metrics().keep_alive_timeouts, 1);
}

#[test]
fn keep_alive_v311_closes_without_disconnect() {
    let mut h = H::new();
    let (c, _) = h.connect_with("a", Protocol::V311, true, |c| c.keep_alive = 2);
    h.secs(4);
    let out = h.out(c);
    assert!(out.closed && out.disconnect().is_none());
}

#[test]
fn connect_timeout_closes_silent_connections() {
    let mut h = H::new();
    let c = h.open();
    h.secs(9);
    assert!(!h.b.is_closing(c));
    h.secs(2);
    assert!(h.b.is_closing(c));
    assert_eq!(h.b.metrics().connect_timeouts, 1);
}

#[test]
fn decode_errors_close_with_the_codec_reason() {
    let mut h = H::new();
    let c5 = h.client("v5");
    h.b.handle_decode_error(
        h.now,
        c5,
        zerofan_codec::DecodeError::new(ReasonCode::PACKET_TOO_LARGE, "too big"),
    );
    let out = h.out(c5);
    assert_eq!(out.disconnect(), Some(ReasonCode::PACKET_TOO_LARGE));
    assert!(out.closed);

    let (c3, _) = h.connect_with("v3", Protocol::V311, true, |_| {});
    h.b.handle_decode_error(h.now, c3, zerofan_codec::DecodeError::malformed("junk"));
    let out = h.out(c3);
    assert!(out.closed && out.packets.is_empty());
    assert_eq!(h.b.metrics().malformed_packets, 2);
}

#[test]
fn unsupported_protocol_version_gets_connack_0x84() {
    let mut h = H::new();
    let c = h.open();
    h.b.handle_decode_error(
        h.now,
        c,
        zerofan_codec::DecodeError::new(ReasonCode::UNSUPPORTED_PROTOCOL_VERSION, "level 9"),
    );
    let out = h.out(c);
    assert_eq!(
        out.connack().unwrap().reason,
        ReasonCode::UNSUPPORTED_PROTOCOL_VERSION
    );
    assert!(out.closed);
}

#[test]
fn shutdown_sends_0x8b_to_v5_only() {
    let mut h = H::new();
    let c5 = h.client("v5");
    let (c3, _) = h.connect_with("v3", Protocol::V311, true, |_| {});
    h.b.shutdown(h.now);
    let o5 = h.out(c5);
    assert_eq!(o5.disconnect(), Some(ReasonCode::SERVER_SHUTTING_DOWN));
    assert!(o5.closed);
    let o3 = h.out(c3);
    assert!(o3.closed && o3.packets.is_empty());
}

#[test]
fn problem_information_zero_drops_reason_strings() {
    let mut h = H::new();
    let (c, _) = h.connect_with("a", Protocol::V5, true, |c| {
        c.properties.request_problem_information = Some(0)
    });
    h.send(c, Packet::PingResp);
    let out = h.out(c);
    let Some(Packet::Disconnect(d)) = out.packets.last() else {
        panic!("no disconnect")
    };
    assert_eq!(d.reason, ReasonCode::PROTOCOL_ERROR);
    assert!(d.properties.reason_string.is_none());
}

#[test]
fn disconnect_reason_string_respects_client_maximum_packet_size() {
    let mut h = H::new();
    let (c, _) = h.connect_with("a", Protocol::V5, true, |c| {
        c.properties.maximum_packet_size = Some(8)
    });
    h.b.shutdown(h.now);
    let out = h.out(c);
    let Some(Packet::Disconnect(d)) = out.packets.last() else {
        panic!("no disconnect")
    };
    assert_eq!(d.reason, ReasonCode::SERVER_SHUTTING_DOWN);
    assert!(d.properties.reason_string.is_none());
}

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
    assert!(out.connack().is_none(), "waits for the old input");
    assert!(h.b.drain_requested(old));
    // The shell found nothing more to read on the idle old connection.
    h.b.input_drained(h.now, old);
    assert!(!h.b.drain_requested(old));
    assert_eq!(h.out(new).connack().unwrap().reason, ReasonCode::SUCCESS);
    let old_out = h.out(old);
    assert_eq!(old_out.disconnect(), Some(ReasonCode::SESSION_TAKEN_OVER));
    assert!(old_out.closed);
    h.b.connection_lost(h.now, old);
    assert_eq!(h.b.connected_clients(), 1);
    h.send(new, Packet::PingReq);
    assert!(matches!(h.out(new).packets[..], [Packet::PingResp]));
    assert_eq!(h.b.metrics().takeovers, 1);
}

/// The issue #21 scenario in the core: a device publishes, disconnects
/// normally and reconnects at once; the shell has read the new CONNECT
/// before the old connection's last packets.
fn takeover_after_unread_disconnect(protocol: Protocol) {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "t/#", opts(QoS::AtMostOnce));
    h.subscribe(sub, "will/#", opts(QoS::AtMostOnce));
    let (old, out) = h.connect_with("dev", protocol, false, |c| {
        c.will = Some(will("will/dev", "offline"));
        c.properties.session_expiry_interval = Some(300);
    });
    assert!(!out.connack().unwrap().session_present);

    let new = h.open();
    let reconnect = connect_packet("dev", protocol, false);
    h.send(new, Packet::Connect(Box::new(reconnect)));
    // Only now does the shell feed what the old connection sent before.
    h.send(
        old,
        Packet::Publish(publish("t/1", "data", QoS::AtMostOnce, 0)),
    );
    let mut bye = Disconnect::default();
    if protocol.is_v5() {
        bye.properties.session_expiry_interval = Some(0);
    }
    h.send(old, Packet::Disconnect(bye));
    h.b.connection_lost(h.now, old);

    assert_eq!(h.out(sub).payloads(), ["data"], "QoS 0 kept, no will");
    assert_eq!(h.b.metrics().wills_published, 0);
    let out = h.out(new);
    let ack = out
        .connack()
        .expect("CONNACK once the old input is handled");
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    if protocol.is_v5() {
        assert!(
            !ack.session_present,
            "session expiry 0 on DISCONNECT ended it"
        );
    }
    assert_eq!(h.b.metrics().takeovers, 0, "the old one left by itself");
    h.send(new, Packet::PingReq);
    assert!(matches!(h.out(new).packets[..], [Packet::PingResp]));
}

#[test]
fn takeover_handles_what_the_old_connection_sent_first_v311() {
    takeover_after_unread_disconnect(Protocol::V311);
}

#[test]
fn takeover_handles_what_the_old_connection_sent_first_v5() {
    takeover_after_unread_disconnect(Protocol::V5);
}

#[test]
fn takeover_of_a_connection_that_never_drains_completes_by_deadline() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "will/#", opts(QoS::AtMostOnce));
    let (old, _) = h.connect_with("dev", Protocol::V5, true, |c| {
        c.will = Some(will("will/dev", "offline"));
    });
    let (new, out) = h.connect_with("dev", Protocol::V5, true, |_| {});
    assert!(out.connack().is_none());
    h.advance(Duration::from_millis(100));
    assert!(h.out(new).connack().is_none(), "still within the deadline");
    h.advance(Duration::from_millis(250));
    assert_eq!(h.out(new).connack().unwrap().reason, ReasonCode::SUCCESS);
    let old_out = h.out(old);
    assert_eq!(old_out.disconnect(), Some(ReasonCode::SESSION_TAKEN_OVER));
    assert_eq!(
        h.out(sub).payloads(),
        ["offline"],
        "a real takeover keeps the will"
    );
    let m = h.b.metrics();
    assert_eq!((m.takeovers, m.takeover_drain_timeouts), (1, 1));
}

#[test]
fn a_waiting_connect_that_goes_away_leaves_the_old_connection_alone() {
    let mut h = H::new();
    let old = h.client("dev");
    let (new, _) = h.connect_with("dev", Protocol::V5, true, |_| {});
    h.b.connection_lost(h.now, new);
    assert!(!h.b.drain_requested(old));
    h.b.input_drained(h.now, old);
    h.advance(Duration::from_secs(1));
    h.send(old, Packet::PingReq);
    let out = h.out(old);
    assert!(matches!(out.packets[..], [Packet::PingResp]) && !out.closed);
    assert_eq!(h.b.metrics().takeovers, 0);
}

#[test]
fn a_third_connect_takes_over_from_the_waiting_one() {
    let mut h = H::new();
    let first = h.client("dev");
    let (second, _) = h.connect_with("dev", Protocol::V5, true, |_| {});
    let (third, out) = h.connect_with("dev", Protocol::V5, true, |_| {});
    assert!(out.connack().is_none());
    // The second completed at once: the first is taken over by it, and the
    // second, connected, now drains for the third.
    assert_eq!(
        h.out(first).disconnect(),
        Some(ReasonCode::SESSION_TAKEN_OVER)
    );
    assert!(h.out(second).connack().is_some());
    assert!(h.b.drain_requested(second));
    h.b.input_drained(h.now, second);
    assert!(h.out(third).connack().is_some());
    assert_eq!(
        h.out(second).disconnect(),
        Some(ReasonCode::SESSION_TAKEN_OVER)
    );
    assert_eq!(h.b.metrics().takeovers, 2);
}

#[test]
fn a_packet_on_the_waiting_connection_completes_the_takeover_first() {
    let mut h = H::new();
    let old = h.client("dev");
    let (new, _) = h.connect_with("dev", Protocol::V5, true, |_| {});
    assert_eq!(h.b.input_state(new), crate::core::InputState::Held);
    h.send(new, Packet::PingReq);
    let out = h.out(new);
    assert!(matches!(
        out.packets[..],
        [Packet::ConnAck(_), Packet::PingResp]
    ));
    assert_eq!(
        h.out(old).disconnect(),
        Some(ReasonCode::SESSION_TAKEN_OVER)
    );
    assert_eq!(h.b.input_state(new), crate::core::InputState::Open);
}

#[test]
fn takeover_bookkeeping_is_empty_once_every_takeover_is_over() {
    let mut h = H::new();
    let idle = |h: &H| h.b.takeovers_idle();
    // Drained, deadline, the new one lost, the old one timing out, shutdown.
    let old = h.client("a");
    let (new, _) = h.connect_with("a", Protocol::V5, true, |_| {});
    h.b.input_drained(h.now, old);
    assert!(idle(&h) && h.out(new).connack().is_some());

    let _ = h.client("b");
    let _ = h.connect_with("b", Protocol::V5, true, |_| {});
    h.advance(Duration::from_secs(1));
    assert!(idle(&h));

    let _ = h.client("c");
    let (new, _) = h.connect_with("c", Protocol::V5, true, |_| {});
    h.b.connection_lost(h.now, new);
    assert!(idle(&h));

    let (old, _) = h.connect_with("d", Protocol::V5, true, |c| c.keep_alive = 1);
    h.advance(Duration::from_millis(1400));
    let (new, _) = h.connect_with("d", Protocol::V5, true, |_| {});
    h.advance(Duration::from_millis(200));
    // The old one's keep alive ran out while the CONNECT waited.
    assert_eq!(
        h.out(old).disconnect(),
        Some(ReasonCode::KEEP_ALIVE_TIMEOUT)
    );
    assert!(idle(&h) && h.out(new).connack().is_some());

    let _ = h.client("e");
    let _ = h.connect_with("e", Protocol::V5, true, |_| {});
    h.b.shutdown(h.now);
    assert!(idle(&h));
    assert_eq!(h.b.metrics().takeover_drain_timeouts, 1);
}

#[test]
fn a_refused_connect_does_not_wait_for_a_takeover() {
    let mut h = H::new();
    let old = h.client("dev");
    let (_, out) = h.connect_with("dev", Protocol::V5, true, |c| {
        c.will = Some(will("bad/#", "x"));
    });
    assert_eq!(
        out.connack().unwrap().reason,
        ReasonCode::TOPIC_NAME_INVALID
    );
    assert!(!h.b.drain_requested(old) && !h.b.is_closing(old));
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

/// Keep alive runs out 1.5 x its interval after the last packet, checked
/// on the timer wheel's next 100 ms tick: never a nanosecond early (which
/// a coarser record of that packet's time, one way to make `Connection`
/// smaller, could do), and by that tick.
#[test]
fn keep_alive_runs_out_to_the_nanosecond() {
    let mut h = H::new();
    let (c, _) = h.connect_with("a", Protocol::V5, true, |c| c.keep_alive = 10);
    h.advance(Duration::new(1, 234_567_891));
    h.send(c, Packet::PingReq);
    let _ = h.out(c);
    h.advance(Duration::from_secs(15) - Duration::from_nanos(1));
    assert!(!h.out(c).closed, "closed before 1.5 x keep alive");
    // 16.234567891 s after the start: checked at the tick of 16.3 s.
    h.advance(Duration::from_nanos(1));
    h.advance(Duration::from_millis(65) + Duration::from_nanos(432_108));
    assert!(!h.out(c).closed, "checked before its tick");
    h.advance(Duration::from_nanos(1));
    assert_eq!(h.out(c).disconnect(), Some(ReasonCode::KEEP_ALIVE_TIMEOUT));
}

/// A connection keeps one deadline entry however long it lives, even with
/// a keep alive shorter than the connect timeout (whose entry, armed at
/// open, ends once connected rather than re-arming beside keep alive's).
#[test]
fn a_connection_keeps_one_deadline_entry() {
    let mut h = H::new();
    let before = h.b.timer_entries();
    let (c, _) = h.connect_with("a", Protocol::V5, true, |c| c.keep_alive = 2);
    for _ in 0..60 {
        h.secs(1);
        h.send(c, Packet::PingReq);
        let _ = h.out(c);
    }
    assert!(!h.out(c).closed);
    assert_eq!(h.b.timer_entries(), before + 1);
    h.secs(3);
    assert!(h.out(c).closed);
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

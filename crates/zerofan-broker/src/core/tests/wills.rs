//! Wills: when they are published, when not, and the will delay.

use super::*;

fn with_will(h: &mut H, id: &str, delay: Option<u32>, expiry: u32) -> ConnId {
    let (c, out) = h.connect_with(id, Protocol::V5, true, |c| {
        let mut w = will("wills/x", "gone");
        w.properties.will_delay_interval = delay;
        w.properties.content_type = Some(s("text/plain"));
        c.will = Some(w);
        c.properties.session_expiry_interval = Some(expiry);
    });
    assert_eq!(out.connack().unwrap().reason, ReasonCode::SUCCESS);
    c
}

fn watcher(h: &mut H) -> ConnId {
    let w = h.client("watcher");
    h.subscribe(w, "wills/#", opts(QoS::AtLeastOnce));
    w
}

#[test]
fn published_on_unexpected_close_with_its_properties() {
    let mut h = H::new();
    let w = watcher(&mut h);
    let c = with_will(&mut h, "c", None, 0);
    h.b.connection_lost(h.now, c);
    let out = h.out(w);
    assert_eq!(out.payloads(), ["gone"]);
    let p = out.publishes()[0];
    assert_eq!(p.qos, QoS::AtLeastOnce);
    assert_eq!(p.properties.content_type.as_deref(), Some("text/plain"));
}

#[test]
fn not_published_on_normal_disconnect_but_on_0x04() {
    let mut h = H::new();
    let w = watcher(&mut h);
    let c = with_will(&mut h, "c", None, 0);
    h.send(c, disconnect(ReasonCode::NORMAL_DISCONNECTION));
    h.b.connection_lost(h.now, c);
    assert!(h.out(w).publishes().is_empty());

    let c = with_will(&mut h, "c", None, 0);
    h.send(c, disconnect(ReasonCode::DISCONNECT_WITH_WILL));
    h.b.connection_lost(h.now, c);
    assert_eq!(h.out(w).payloads(), ["gone"]);
}

#[test]
fn published_on_keep_alive_timeout_and_protocol_error() {
    let mut h = H::new();
    let w = watcher(&mut h);
    let c = with_will(&mut h, "c", None, 0);
    h.secs(100);
    assert!(h.out(c).closed);
    let c2 = with_will(&mut h, "c2", None, 0);
    h.send(c2, Packet::PingResp);
    // The watcher missed its own keep alive by now; count the wills instead.
    assert_eq!(h.b.metrics().wills_published, 2);
    let _ = w;
}

#[test]
fn will_delay_waits_and_reconnect_cancels() {
    let mut h = H::new();
    let w = watcher(&mut h);
    let c = with_will(&mut h, "c", Some(10), 100);
    h.b.connection_lost(h.now, c);
    h.secs(5);
    assert!(h.out(w).publishes().is_empty());
    h.secs(6);
    assert_eq!(h.out(w).payloads(), ["gone"]);

    let c = with_will(&mut h, "d", Some(10), 100);
    h.b.connection_lost(h.now, c);
    h.secs(5);
    let (_, out) = h.connect_with("d", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(100)
    });
    assert!(out.connack().unwrap().session_present);
    h.secs(20);
    assert!(
        h.out(w).publishes().is_empty(),
        "reconnecting cancelled the will"
    );
}

/// The delay is over when the client comes back, the timer not run yet
/// (it runs at the shell's next tick): the will is due, and published,
/// not cancelled.
#[test]
fn a_will_due_at_reconnect_is_published() {
    let mut h = H::new();
    let w = watcher(&mut h);
    let c = with_will(&mut h, "d", Some(10), 100);
    h.b.connection_lost(h.now, c);
    h.now += std::time::Duration::from_secs(10);
    let (_, out) = h.connect_with("d", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(100)
    });
    assert!(out.connack().unwrap().session_present);
    assert_eq!(h.out(w).payloads(), ["gone"]);
    h.secs(20);
    assert!(h.out(w).publishes().is_empty(), "once");
}

#[test]
fn will_delay_is_cut_short_by_session_end() {
    let mut h = H::new();
    let w = watcher(&mut h);
    let c = with_will(&mut h, "c", Some(100), 5);
    h.b.connection_lost(h.now, c);
    h.secs(4);
    assert!(h.out(w).publishes().is_empty());
    h.secs(2);
    assert_eq!(h.out(w).payloads(), ["gone"]);
}

//! Online subscribers bounded by bytes, push-back on the publishers feeding
//! a subscriber that falls behind, slow consumers dropped only after a
//! while, and retained replay never dropped.

use super::*;
use crate::config::QueueFull;

/// A 256-byte payload numbered `i` (the number first, padded).
fn payload(i: usize) -> String {
    format!("{i:<256}")
}

fn qos0(topic: &str, i: usize) -> Packet {
    Packet::Publish(publish(topic, &payload(i), QoS::AtMostOnce, 0))
}

/// A config whose online bound is small enough to reach in a test: high
/// water at 32 KiB, low water at 16 KiB.
fn small(policy: QueueFull) -> Config {
    Config {
        sys_interval: 0,
        max_online_queued_bytes: 64 * 1024,
        slow_consumer_timeout_ms: 1000,
        queue_full: policy,
        ..Config::default()
    }
}

fn online_cost(h: &H) -> usize {
    h.b.gauges().queued_bytes_online
}

/// 150 QoS 0 messages on "t" from `publ`: past the online high-water
/// mark of `small`, so a subscriber that does not read falls behind.
fn flood(h: &mut H, publ: ConnId) {
    for i in 0..150 {
        h.send(publ, qos0("t", i));
    }
}

/// A subscriber "sub" on "t" that does not read, and a publisher "pub"
/// that just flooded it (held, under `policy`).
fn behind(policy: QueueFull) -> (H, ConnId, ConnId) {
    let mut h = H::with(small(policy));
    let sub = h.client("sub");
    h.subscribe(sub, "t", opts(QoS::AtMostOnce));
    let publ = h.client("pub");
    flood(&mut h, publ);
    (h, sub, publ)
}

#[test]
fn burst_to_an_online_subscriber_is_kept_whole() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "burst", opts(QoS::AtMostOnce));
    let publ = h.client("pub");
    // The subscriber's writer does not run while the burst arrives (as when
    // one read holds all of it).
    for i in 0..5000 {
        h.send(publ, qos0("burst", i));
    }
    assert_eq!(h.b.metrics().dropped_total(), 0);
    assert_eq!(h.b.queued_messages("sub"), Some(5000));
    // 5,000 x 256 B is far below the default bound: nobody is held.
    assert!(!h.b.held(publ));
    let got = h.out(sub).payloads();
    assert_eq!(got.len(), 5000);
    for (i, p) in got.iter().enumerate() {
        assert_eq!(p, &payload(i), "out of order at {i}");
    }
}

#[test]
fn publisher_held_above_high_water_and_released_below_low_water() {
    let mut h = H::with(small(QueueFull::DropNew));
    let sub = h.client("sub");
    h.subscribe(sub, "t", opts(QoS::AtMostOnce));
    let publ = h.client("pub");
    let other = h.client("other");
    let mut sent = 0;
    while !h.b.held(publ) {
        assert!(online_cost(&h) <= 32 * 1024, "not held past high water");
        assert!(sent < 10_000, "never held");
        h.send(publ, qos0("t", sent));
        sent += 1;
    }
    assert!(online_cost(&h) > 32 * 1024);
    assert!(
        !h.b.held(other),
        "a client that publishes nothing is not held"
    );
    assert!(!h.b.held(sub), "the subscriber itself is read");
    assert_eq!(h.b.metrics().publisher_throttles, 1);
    let mut wakeups = Vec::new();
    h.b.take_wakeups(&mut wakeups);
    // Drain batch by batch, as the writer would: held until below 16 KiB.
    let mut drained = 0;
    while h.b.held(publ) {
        assert!(online_cost(&h) >= 16 * 1024, "held below low water");
        let mut batch = Vec::new();
        h.b.poll_transmit(h.now, sub, &mut batch, 16);
        assert!(!batch.is_empty(), "held with nothing left to send");
        drained += batch.len();
    }
    assert!(online_cost(&h) < 16 * 1024);
    h.b.take_wakeups(&mut wakeups);
    assert!(wakeups.contains(&publ), "the released publisher is woken");
    let rest = h.out(sub).publishes().len();
    assert_eq!(drained + rest, sent, "nothing dropped");
    assert_eq!(h.b.metrics().dropped_total(), 0);
}

#[test]
fn a_publisher_is_not_held_by_its_own_subscription() {
    let mut h = H::with(small(QueueFull::DropNew));
    let me = h.client("me");
    h.subscribe(me, "echo", opts(QoS::AtMostOnce));
    for i in 0..150 {
        h.send(me, qos0("echo", i));
    }
    assert!(online_cost(&h) > 32 * 1024);
    assert!(!h.b.held(me), "held by itself: it could never drain");
    assert_eq!(h.b.metrics().publisher_throttles, 0);
}

#[test]
fn hold_lifts_when_the_subscriber_goes_away() {
    let (mut h, sub, publ) = behind(QueueFull::DropNew);
    assert!(h.b.held(publ));
    h.b.take_wakeups(&mut Vec::new());
    h.b.connection_lost(h.now, sub);
    assert!(!h.b.held(publ));
    assert_eq!(h.b.held_marks(), 0);
    let mut wakeups = Vec::new();
    h.b.take_wakeups(&mut wakeups);
    assert!(wakeups.contains(&publ));
}

/// The push-back mark lives in the broker, not in the connection: it goes
/// when the held publisher's connection does, and the subscriber catching
/// up later wakes nobody.
#[test]
fn a_held_publisher_that_goes_away_leaves_no_mark() {
    let (mut h, sub, publ) = behind(QueueFull::DropNew);
    assert!(h.b.held(publ));
    assert_eq!(h.b.held_marks(), 1);
    h.b.connection_lost(h.now, publ);
    assert_eq!(h.b.held_marks(), 0);
    assert!(!h.b.held(publ));
    h.b.take_wakeups(&mut Vec::new());
    h.out(sub);
    let mut wakeups = Vec::new();
    h.b.take_wakeups(&mut wakeups);
    assert!(!wakeups.contains(&publ), "a closed connection woken");
}

#[test]
fn a_subscriber_that_stays_behind_is_dropped_as_slow() {
    let (mut h, sub, publ) = behind(QueueFull::DropNew);
    assert!(h.b.held(publ));
    h.advance(Duration::from_millis(999));
    assert!(h.b.held(publ), "dropped before its time");
    assert_eq!(h.b.metrics().slow_subscribers_dropped, 0);
    h.advance(Duration::from_millis(1));
    assert!(!h.b.held(publ), "the publisher is read again");
    let m = h.b.metrics();
    assert_eq!(m.slow_subscribers_dropped, 1);
    assert_eq!(m.dropped_qos0_queue_full, 150);
    assert_eq!(h.b.queued_messages("sub"), Some(0));
    // Still connected; until it catches up it keeps at most its high-water
    // mark and holds nobody.
    flood(&mut h, publ);
    assert!(!h.b.held(publ));
    assert!(online_cost(&h) <= 32 * 1024);
    assert!(h.b.metrics().dropped_qos0_queue_full > 150);
    assert_eq!(h.b.metrics().publisher_throttles, 1);
    // Once it drained it is an ordinary subscriber again.
    let out = h.out(sub);
    assert!(!out.closed);
    flood(&mut h, publ);
    assert!(h.b.held(publ));
    assert_eq!(h.b.metrics().publisher_throttles, 2);
}

#[test]
fn slow_consumer_disconnected_under_the_disconnect_policy() {
    let (mut h, sub, publ) = behind(QueueFull::Disconnect);
    h.advance(Duration::from_millis(1000));
    assert!(!h.b.held(publ));
    let out = h.out(sub);
    assert_eq!(out.disconnect(), Some(ReasonCode::QUOTA_EXCEEDED));
    assert!(out.closed);
    assert_eq!(h.b.metrics().slow_consumer_disconnects, 1);
    assert_eq!(h.b.metrics().slow_subscribers_dropped, 1);
}

#[test]
fn the_hard_online_bound_drops_qos0_and_counts() {
    let mut h = H::with(small(QueueFull::DropNew));
    let sub = h.client("sub");
    h.subscribe(sub, "t", opts(QoS::AtMostOnce));
    let publ = h.client("pub");
    // A publisher that is not held (one read holds all of this) meets the
    // hard bound: QoS 0 drops the oldest.
    for i in 0..1000 {
        h.send(publ, qos0("t", i));
    }
    assert!(online_cost(&h) <= 64 * 1024);
    let dropped = h.b.metrics().dropped_qos0_queue_full;
    assert!(dropped > 0);
    let got = h.out(sub).payloads();
    assert_eq!(got.len() as u64 + dropped, 1000);
    assert_eq!(got.last(), Some(&payload(999)), "the newest is kept");
}

/// Connect with a session that outlives the connection; what the CONNACK
/// brought along (a resumed queue) comes with it.
fn persistent(h: &mut H, id: &str) -> (ConnId, Out) {
    let (c, out) = h.connect_with(id, Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(300)
    });
    assert_eq!(out.connack().unwrap().reason, ReasonCode::SUCCESS);
    (c, out)
}

/// A persistent subscriber "sub" to `t` with 10 QoS 1 messages `m0`..`m9`
/// queued and unread, under a message bound of 3; its connection and the
/// publisher's.
fn ten_unread_over_a_bound_of_three() -> (H, ConnId, ConnId) {
    let mut h = H::with(Config {
        max_queued_messages: 3,
        sys_interval: 0,
        ..Config::default()
    });
    let (sub, _) = persistent(&mut h, "sub");
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    let publ = h.client("pub");
    for i in 0..10 {
        h.send(
            publ,
            Packet::Publish(publish("t", &format!("m{i}"), QoS::AtLeastOnce, i + 1)),
        );
    }
    // Online, the message bound does not apply.
    assert_eq!(h.b.queued_messages("sub"), Some(10));
    (h, sub, publ)
}

#[test]
fn offline_bound_applies_when_the_connection_is_lost() {
    let (mut h, sub, publ) = ten_unread_over_a_bound_of_three();
    assert_eq!(h.b.metrics().dropped_queue_full, 0);
    h.b.connection_lost(h.now, sub);
    assert_eq!(h.b.queued_messages("sub"), Some(3));
    assert_eq!(h.b.metrics().dropped_queue_full, 7);
    // And offline it still applies to what comes.
    h.send(
        publ,
        Packet::Publish(publish("t", "late", QoS::AtLeastOnce, 11)),
    );
    assert_eq!(h.b.queued_messages("sub"), Some(3));
    assert_eq!(h.b.metrics().dropped_queue_full, 8);
    let (_, out) = persistent(&mut h, "sub");
    assert_eq!(
        out.payloads(),
        ["m0", "m1", "m2"],
        "drop_new keeps the oldest"
    );
}

#[test]
fn offline_trim_drops_qos0_first_then_by_policy() {
    let mut h = H::with(Config {
        max_queued_messages: 2,
        queue_full: QueueFull::DropOldest,
        sys_interval: 0,
        ..Config::default()
    });
    let (sub, _) = persistent(&mut h, "sub");
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "a", QoS::AtLeastOnce, 1)),
    );
    h.send(publ, Packet::Publish(publish("t", "z", QoS::AtMostOnce, 0)));
    h.send(
        publ,
        Packet::Publish(publish("t", "b", QoS::AtLeastOnce, 2)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t", "c", QoS::AtLeastOnce, 3)),
    );
    h.b.connection_lost(h.now, sub);
    assert_eq!(h.b.metrics().dropped_qos0_queue_full, 1);
    assert_eq!(h.b.metrics().dropped_queue_full, 1);
    let (_, out) = persistent(&mut h, "sub");
    assert_eq!(out.payloads(), ["b", "c"]);
}

fn store_retained(h: &mut H, n: usize) {
    let publ = h.client("device");
    for i in 0..n {
        let mut p = publish(
            &format!("sensors/{i}"),
            &format!("v{i}"),
            QoS::AtLeastOnce,
            1,
        );
        p.retain = true;
        h.send(publ, Packet::Publish(p));
    }
    h.out(publ);
    assert_eq!(h.b.retained_count(), n);
}

#[test]
fn ten_thousand_retained_at_qos1_paced_by_a_small_receive_maximum() {
    let mut h = H::new();
    store_retained(&mut h, 10_000);
    let (dash, _) = h.connect_with("dashboard", Protocol::V5, true, |c| {
        c.properties.receive_maximum = Some(10)
    });
    let first = h.subscribe(dash, "sensors/#", opts(QoS::AtLeastOnce));
    let mut seen = std::collections::HashSet::new();
    let mut batch = first
        .publishes()
        .iter()
        .map(|p| (*p).clone())
        .collect::<Vec<_>>();
    let mut rounds = 0;
    while seen.len() < 10_000 {
        rounds += 1;
        assert!(rounds <= 2000, "stalled at {} of 10000", seen.len());
        assert!(batch.len() <= 10, "window overrun: {}", batch.len());
        assert!(!batch.is_empty(), "stalled at {} of 10000", seen.len());
        for p in &batch {
            assert!(p.retain);
            assert!(
                seen.insert(p.topic.as_str().to_string()),
                "twice: {}",
                p.topic
            );
            h.send(dash, Packet::PubAck(ack(p.packet_id)));
        }
        batch = h
            .out(dash)
            .publishes()
            .iter()
            .map(|p| (*p).clone())
            .collect();
    }
    assert!(batch.is_empty());
    assert_eq!(h.b.metrics().dropped_total(), 0);
}

#[test]
fn ten_thousand_retained_at_qos0_all_delivered() {
    let mut h = H::new();
    store_retained(&mut h, 10_000);
    let dash = h.client("dashboard");
    let out = h.subscribe(dash, "sensors/#", opts(QoS::AtMostOnce));
    let topics: std::collections::HashSet<String> = out
        .publishes()
        .iter()
        .map(|p| p.topic.as_str().to_string())
        .collect();
    assert_eq!(topics.len(), 10_000);
    assert_eq!(h.b.metrics().dropped_total(), 0);
}

#[test]
fn retained_replay_is_not_counted_as_falling_behind() {
    let mut h = H::with(small(QueueFull::DropNew));
    // 1,000 retained of 256 B: well past the 64 KiB online bound.
    let publ = h.client("device");
    for i in 0..1000 {
        let mut p = publish(&format!("sensors/{i}"), &payload(i), QoS::AtMostOnce, 0);
        p.retain = true;
        h.send(publ, Packet::Publish(p));
    }
    let dash = h.client("dashboard");
    h.send(
        dash,
        Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Default::default(),
            filters: vec![(s("sensors/#"), opts(QoS::AtMostOnce))],
        }),
    );
    assert_eq!(h.b.queued_messages("dashboard"), Some(1000));
    assert_eq!(online_cost(&h), 0);
    // Live traffic behind the replay is bounded and pushes back as usual.
    h.send(publ, qos0("sensors/live", 0));
    assert!(!h.b.held(publ));
    h.advance(Duration::from_secs(5));
    assert_eq!(h.b.metrics().slow_subscribers_dropped, 0);
    assert_eq!(h.out(dash).publishes().len(), 1001);
    assert_eq!(h.b.metrics().dropped_total(), 0);
}

#[test]
fn a_held_publisher_is_not_timed_out_for_keep_alive() {
    let mut h = H::with(Config {
        slow_consumer_timeout_ms: 60_000,
        ..small(QueueFull::DropNew)
    });
    let sub = h.client("sub");
    h.subscribe(sub, "t", opts(QoS::AtMostOnce));
    let (publ, _) = h.connect_with("pub", Protocol::V5, true, |c| c.keep_alive = 2);
    flood(&mut h, publ);
    assert!(h.b.held(publ));
    // Far past 1.5 x keep alive: its silence is the broker's doing.
    h.secs(10);
    assert!(!h.b.is_closing(publ));
    assert_eq!(h.b.metrics().keep_alive_timeouts, 0);
    h.out(sub);
    assert!(!h.b.held(publ));
    // Read again: keep alive applies from the release on.
    h.secs(1);
    assert!(!h.b.is_closing(publ));
    h.secs(2);
    assert!(h.b.is_closing(publ));
    assert_eq!(h.b.metrics().keep_alive_timeouts, 1);
}

#[test]
fn the_slow_consumer_clock_restarts_when_the_subscriber_catches_up() {
    let (mut h, sub, publ) = behind(QueueFull::DropNew);
    h.advance(Duration::from_millis(600));
    h.out(sub);
    assert!(!h.b.held(publ));
    flood(&mut h, publ);
    assert!(h.b.held(publ));
    // The first episode's timer fires here: this one is 400 ms old.
    h.advance(Duration::from_millis(400));
    assert!(h.b.held(publ));
    assert_eq!(h.b.metrics().slow_subscribers_dropped, 0);
    h.advance(Duration::from_millis(600));
    assert!(!h.b.held(publ));
    assert_eq!(h.b.metrics().slow_subscribers_dropped, 1);
}

#[test]
fn a_huge_slow_consumer_timeout_never_fires() {
    let mut h = H::with(Config {
        slow_consumer_timeout_ms: u64::MAX,
        ..small(QueueFull::DropNew)
    });
    let sub = h.client("sub");
    h.subscribe(sub, "t", opts(QoS::AtMostOnce));
    let publ = h.client("pub");
    flood(&mut h, publ);
    assert!(h.b.held(publ));
    // Within the subscriber's keep alive (60 s), far past any usual timeout.
    h.secs(80);
    assert!(h.b.held(publ));
    assert_eq!(h.b.metrics().slow_subscribers_dropped, 0);
}

/// A takeover that resumes the session re-attaches it at once: the queue
/// its old connection had not read yet is not cut to the offline bound on
/// the way (it was never offline).
#[test]
fn a_resuming_takeover_keeps_the_online_queue_whole() {
    let (mut h, old, _) = ten_unread_over_a_bound_of_three();
    let (new, _) = h.connect_with("sub", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(300)
    });
    h.b.input_drained(h.now, old);
    let out = h.out(new);
    assert!(out.connack().is_some_and(|a| a.session_present));
    assert_eq!(h.b.metrics().dropped_queue_full, 0);
    let got = out.payloads();
    assert_eq!(got.len(), 10, "{got:?}");
}

//! FailureTracker with injected time: growth, reset, expiry, bounded memory.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use zerofan_auth::{FailureTracker, ThrottleConfig};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn repeated_failures_slow_down_one_pair_only() {
    let mut t = FailureTracker::new(ThrottleConfig::default());
    let t0 = Instant::now();
    let a = ip("192.0.2.1");
    let waits: Vec<u64> = (0..8)
        .map(|i| t.record_failure(a, "u", t0 + secs(i)).as_secs())
        .collect();
    assert_eq!(waits, [0, 0, 0, 1, 2, 4, 8, 16]);
    // The 8th failure was at t0+7s and imposes 16 s.
    assert_eq!(t.delay(a, "u", t0 + secs(7)), secs(16));
    assert_eq!(t.delay(a, "u", t0 + secs(20)), secs(3));
    assert_eq!(t.delay(a, "u", t0 + secs(23)), Duration::ZERO);
    // Another address is not affected, nor another user at this address.
    assert_eq!(t.delay(ip("192.0.2.2"), "u", t0 + secs(7)), Duration::ZERO);
    assert_eq!(t.delay(a, "v", t0 + secs(7)), Duration::ZERO);
    assert_eq!(t.failures(a, "v", t0 + secs(7)), 0);
    assert_eq!(t.failures(a, "u", t0 + secs(7)), 8);
}

#[test]
fn success_forgets() {
    let mut t = FailureTracker::new(ThrottleConfig::default());
    let t0 = Instant::now();
    let a = ip("2001:db8::1");
    for i in 0..6 {
        t.record_failure(a, "u", t0 + secs(i));
    }
    assert!(t.delay(a, "u", t0 + secs(6)) > Duration::ZERO);
    t.record_success(a, "u");
    assert_eq!(t.delay(a, "u", t0 + secs(6)), Duration::ZERO);
    assert_eq!(t.failures(a, "u", t0 + secs(6)), 0);
    assert!(t.is_empty());
}

#[test]
fn quiet_addresses_are_forgotten() {
    let config = ThrottleConfig {
        forget_after: secs(600),
        ..ThrottleConfig::default()
    };
    let mut t = FailureTracker::new(config);
    let t0 = Instant::now();
    let a = ip("198.51.100.7");
    for _ in 0..10 {
        t.record_failure(a, "u", t0);
    }
    assert_eq!(t.delay(a, "u", t0), secs(60)); // 1, 2, 4, ... 32, then capped
    assert_eq!(t.failures(a, "u", t0 + secs(599)), 10);
    assert_eq!(t.failures(a, "u", t0 + secs(600)), 0);
    assert_eq!(t.delay(a, "u", t0 + secs(600)), Duration::ZERO);
    // A failure after the quiet period starts over.
    assert_eq!(t.record_failure(a, "u", t0 + secs(700)), Duration::ZERO);
    assert_eq!(t.failures(a, "u", t0 + secs(700)), 1);
    // purge_expired gives the memory back.
    t.record_failure(ip("198.51.100.8"), "u", t0 + secs(100));
    t.purge_expired(t0 + secs(800));
    assert_eq!(t.len(), 1);
    t.purge_expired(t0 + secs(1300));
    assert!(t.is_empty());
}

#[test]
fn memory_is_bounded_and_evictions_counted() {
    let config = ThrottleConfig {
        capacity: 100,
        ..ThrottleConfig::default()
    };
    let mut t = FailureTracker::new(config);
    let t0 = Instant::now();
    let victim = ip("203.0.113.1");
    for _ in 0..5 {
        t.record_failure(victim, "u", t0);
    }
    for i in 0..1000u32 {
        let a = IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8]);
        t.record_failure(a, "u", t0 + Duration::from_millis(u64::from(i) + 1));
        assert!(t.len() <= 100);
    }
    assert_eq!(t.len(), 100);
    assert_eq!(t.evictions(), 901);
    // The oldest (the victim) went first: evicting forgets, never locks out.
    assert_eq!(t.failures(victim, "u", t0 + secs(2)), 0);
}

#[test]
fn lru_keeps_the_recently_failing() {
    let config = ThrottleConfig {
        capacity: 2,
        ..ThrottleConfig::default()
    };
    let mut t = FailureTracker::new(config);
    let t0 = Instant::now();
    let (a, b, c) = (ip("192.0.2.1"), ip("192.0.2.2"), ip("192.0.2.3"));
    t.record_failure(a, "u", t0);
    t.record_failure(b, "u", t0 + secs(1));
    t.record_failure(a, "u", t0 + secs(2)); // a is now the most recent
    t.record_failure(c, "u", t0 + secs(3)); // evicts b
    assert_eq!(t.failures(a, "u", t0 + secs(3)), 2);
    assert_eq!(t.failures(b, "u", t0 + secs(3)), 0);
    assert_eq!(t.failures(c, "u", t0 + secs(3)), 1);
    assert_eq!(t.evictions(), 1);
}

#[test]
fn zero_capacity_and_huge_counts_are_safe() {
    let mut t = FailureTracker::new(ThrottleConfig {
        capacity: 0,
        base_delay: Duration::MAX,
        ..ThrottleConfig::default()
    });
    let t0 = Instant::now();
    for _ in 0..100 {
        t.record_failure(ip("192.0.2.9"), "u", t0);
    }
    assert_eq!(t.len(), 1);
    assert_eq!(t.delay(ip("192.0.2.9"), "u", t0), secs(60));
    assert_eq!(t.penalty(u32::MAX), secs(60));
}

#[test]
fn long_usernames_cost_a_fixed_size_record() {
    let mut t = FailureTracker::new(ThrottleConfig::default());
    let t0 = Instant::now();
    let a = ip("192.0.2.1");
    let long = "x".repeat(65_535);
    for _ in 0..4 {
        t.record_failure(a, &long, t0);
    }
    assert_eq!(t.failures(a, &long, t0), 4);
    assert_eq!(t.failures(a, &long[1..], t0), 0);
    assert_eq!(t.len(), 1);
}

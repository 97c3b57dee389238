//! Limits decided for the whole process (several shards): the shell's
//! verdict on a new connection, and one login throttle shared by cores.

use super::*;
use crate::core::{Admission, ConnectionMeta, ListenerAuth, SecurityConfig};
use std::sync::{Arc, Mutex};
use zerofan_auth::{FailureTracker, PasswordFile, ThrottleConfig};

fn open(h: &mut H, admission: Admission) -> ConnId {
    let meta = ConnectionMeta {
        admission,
        ..ConnectionMeta::default()
    };
    h.b.connection_opened_with(h.now, "127.0.0.1:1".parse().unwrap(), meta)
}

fn connack(h: &mut H, c: ConnId, id: &str) -> ReasonCode {
    h.send(
        c,
        Packet::Connect(Box::new(connect_packet(id, Protocol::V5, true))),
    );
    h.out(c).connack().unwrap().reason
}

#[test]
fn the_shells_verdict_overrides_the_cores_own_counts() {
    let mut h = H::with(Config {
        sys_interval: 0,
        max_connections: 1,
        max_connection_rate: 1,
        ..Config::default()
    });
    // Over the core's own limits (one open already, rate spent): the shell
    // counted the whole process and admits it.
    let first = open(&mut h, Admission::Core);
    assert_eq!(connack(&mut h, first, "a"), ReasonCode::SUCCESS);
    let c = open(&mut h, Admission::Admitted);
    assert_eq!(connack(&mut h, c, "b"), ReasonCode::SUCCESS);
    // Refused by the shell: answered with its code, counted by reason.
    let c = open(&mut h, Admission::Refused(ReasonCode::QUOTA_EXCEEDED));
    assert!(h.b.is_refused(c));
    assert_eq!(connack(&mut h, c, "c"), ReasonCode::QUOTA_EXCEEDED);
    let c = open(
        &mut h,
        Admission::Refused(ReasonCode::CONNECTION_RATE_EXCEEDED),
    );
    assert_eq!(
        connack(&mut h, c, "d"),
        ReasonCode::CONNECTION_RATE_EXCEEDED
    );
    let m = &h.b.metrics().security;
    assert_eq!(m.refused_max_connections, 1);
    assert_eq!(m.refused_connection_rate, 1);
}

fn secured() -> H {
    let mut p = PasswordFile::new();
    p.set_with_iterations("alice", b"secret", 1).unwrap();
    let mut h = H::with(Config {
        sys_interval: 0,
        ..Config::default()
    });
    h.b.set_security(SecurityConfig {
        listeners: vec![ListenerAuth {
            passwords: Some(Arc::new(p)),
            ..ListenerAuth::default()
        }],
        throttle: ThrottleConfig::default(),
        jwt: None,
        http: None,
    });
    h
}

fn login(h: &mut H, id: &str, pw: &[u8]) -> ReasonCode {
    h.connect_with(id, Protocol::V5, true, |c| {
        c.username = Some(s("alice"));
        c.password = Some(Bytes::copy_from_slice(pw));
    })
    .1
    .connack()
    .unwrap()
    .reason
}

#[test]
fn cores_sharing_a_throttle_count_failures_together() {
    let tracker = Arc::new(Mutex::new(FailureTracker::new(ThrottleConfig::default())));
    let mut shards: Vec<H> = (0..4).map(|_| secured()).collect();
    for h in &mut shards {
        h.b.share_login_throttle(tracker.clone());
    }
    // One failure on each core: four for (address, alice) in all, one past
    // the free ones.
    for (i, h) in shards.iter_mut().enumerate() {
        assert_eq!(
            login(h, &format!("bad{i}"), b"nope"),
            ReasonCode::BAD_USER_NAME_OR_PASSWORD
        );
    }
    for (i, h) in shards.iter_mut().enumerate() {
        assert_eq!(
            login(h, &format!("good{i}"), b"secret"),
            ReasonCode::CONNECTION_RATE_EXCEEDED,
            "core {i}"
        );
    }
    // A reload with the same settings keeps the shared memory.
    let h = &mut shards[1];
    h.b.set_security(SecurityConfig {
        listeners: vec![ListenerAuth::default()],
        throttle: ThrottleConfig::default(),
        jwt: None,
        http: None,
    });
    assert_eq!(
        login(h, "again", b"secret"),
        ReasonCode::CONNECTION_RATE_EXCEEDED
    );
}

#[test]
fn an_own_throttle_counts_only_its_cores_failures() {
    // The contrast: without sharing, each core has seen one failure.
    let mut a = secured();
    let mut b = secured();
    for i in 0..4 {
        assert_eq!(
            login(&mut a, &format!("bad{i}"), b"nope"),
            ReasonCode::BAD_USER_NAME_OR_PASSWORD
        );
    }
    assert_eq!(login(&mut b, "good", b"secret"), ReasonCode::SUCCESS);
    assert_eq!(
        login(&mut a, "good", b"secret"),
        ReasonCode::CONNECTION_RATE_EXCEEDED
    );
}

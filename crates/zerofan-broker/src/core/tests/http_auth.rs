//! Logins decided by an HTTP service (`auth_http`), sans-IO: the CONNECT
//! waits while others are served, the answer comes back through
//! `auth_answered`, answers are cached, failures follow `fail`.

use super::*;
use crate::core::{
    AuthRequest, HttpAnswer, HttpAuthSettings, InputState, ListenerAuth, SecurityConfig,
};
use std::sync::Arc;
use zerofan_auth::{Acl, PasswordFile, ThrottleConfig};

fn with_http(fail_allow: bool, max_pending: usize, acl: Option<Acl>) -> H {
    with_settings(fail_allow, max_pending, acl, None, 100)
}

fn with_settings(
    fail_allow: bool,
    max_pending: usize,
    acl: Option<Acl>,
    acl_url: Option<&str>,
    cache_size: usize,
) -> H {
    let mut h = H::new();
    let mut p = PasswordFile::new();
    p.set_with_iterations("alice", b"secret", 1).unwrap();
    h.b.set_security(SecurityConfig {
        listeners: vec![ListenerAuth {
            allow_anonymous: false,
            passwords: Some(Arc::new(p)),
            acl: acl.map(Arc::new),
            ..ListenerAuth::default()
        }],
        throttle: ThrottleConfig::default(),
        jwt: None,
        http: Some(Arc::new(HttpAuthSettings {
            url: "http://127.0.0.1:1/auth".into(),
            acl_url: acl_url.map(Into::into),
            timeout: Duration::from_secs(1),
            cache_ttl: Duration::from_secs(60),
            cache_size,
            fail_allow,
            max_pending,
        })),
    });
    h
}

fn login(h: &mut H, id: &str, v: Protocol, user: &str, pw: &[u8]) -> (ConnId, Out) {
    h.connect_with(id, v, true, |c| {
        c.username = Some(s(user));
        c.password = Some(Bytes::copy_from_slice(pw));
    })
}

fn requests(h: &mut H) -> Vec<AuthRequest> {
    let mut v = Vec::new();
    h.b.take_auth_requests(&mut v);
    v
}

fn answer(h: &mut H, id: u64, a: HttpAnswer) {
    h.b.auth_answered(h.now, id, a);
}

fn reason(o: &Out) -> ReasonCode {
    o.connack().unwrap().reason
}

#[test]
fn connect_waits_for_the_answer_while_others_are_served() {
    let mut h = with_http(false, 10, None);
    let (c, out) = login(&mut h, "dev1", Protocol::V5, "dev1", b"pw1");
    assert!(out.packets.is_empty(), "no CONNACK before the answer");
    assert_eq!(h.b.input_state(c), InputState::Held);
    assert!(h.b.holds_input(c));
    let reqs = requests(&mut h);
    assert_eq!(reqs.len(), 1);
    let body: serde_json::Value = serde_json::from_slice(&reqs[0].body).unwrap();
    assert_eq!(body["username"], "dev1");
    assert_eq!(body["password"], "pw1");
    assert_eq!(body["clientid"], "dev1");
    assert_eq!(body["address"], "127.0.0.1");
    assert_eq!(body["listener"], "0");
    assert_eq!(&*reqs[0].url, "http://127.0.0.1:1/auth");
    // Meanwhile: a password-file user is not sent to the service, and is
    // served at once.
    let (_, out) = login(&mut h, "a", Protocol::V5, "alice", b"secret");
    assert_eq!(reason(&out), ReasonCode::SUCCESS);
    assert!(requests(&mut h).is_empty());
    // The answer: the waiting CONNECT completes.
    answer(&mut h, reqs[0].id, HttpAnswer::Allow { superuser: false });
    assert_eq!(reason(&h.out(c)), ReasonCode::SUCCESS);
    assert_eq!(h.b.input_state(c), InputState::Open);
    let m = &h.b.metrics().security;
    assert_eq!((m.auth_http_cache_misses, m.auth_http_cache_hits), (1, 0));
}

#[test]
fn answers_are_cached_per_request() {
    let mut h = with_http(false, 10, None);
    let (c, _) = login(&mut h, "dev1", Protocol::V5, "dev1", b"pw1");
    let id = requests(&mut h)[0].id;
    answer(&mut h, id, HttpAnswer::Allow { superuser: false });
    assert_eq!(reason(&h.out(c)), ReasonCode::SUCCESS);
    h.b.connection_lost(h.now, c);
    // Same request: from the cache, at once.
    let (c, out) = login(&mut h, "dev1", Protocol::V5, "dev1", b"pw1");
    assert_eq!(reason(&out), ReasonCode::SUCCESS);
    assert!(requests(&mut h).is_empty());
    h.b.connection_lost(h.now, c);
    // Another password is another request.
    let (c, out) = login(&mut h, "dev1", Protocol::V5, "dev1", b"guess");
    assert!(out.packets.is_empty());
    let id = requests(&mut h)[0].id;
    answer(&mut h, id, HttpAnswer::Deny);
    assert_eq!(reason(&h.out(c)), ReasonCode::BAD_USER_NAME_OR_PASSWORD);
    // The denial is cached too (3.1.1: return code 4).
    let (_, out) = login(&mut h, "dev1", Protocol::V311, "dev1", b"guess");
    assert_eq!(reason(&out), ReasonCode::BAD_USER_NAME_OR_PASSWORD);
    // After the TTL it is asked again.
    h.secs(61);
    let (_, out) = login(&mut h, "dev1", Protocol::V5, "dev1", b"pw1");
    assert!(out.packets.is_empty());
    assert_eq!(requests(&mut h).len(), 1);
    let m = &h.b.metrics().security;
    assert_eq!((m.auth_http_cache_misses, m.auth_http_cache_hits), (3, 2));
}

#[test]
fn failures_follow_the_fail_policy_and_are_not_cached() {
    let mut h = with_http(false, 10, None);
    for i in 0..5 {
        let (c, _) = login(&mut h, "dev1", Protocol::V5, "dev1", b"pw1");
        let id = requests(&mut h)[0].id;
        let a = if i % 2 == 0 {
            HttpAnswer::Failed
        } else {
            HttpAnswer::TimedOut
        };
        answer(&mut h, id, a);
        // 0x88 server unavailable: not the client's fault, so never
        // throttled (five in a row, still asked each time).
        assert_eq!(reason(&h.out(c)), ReasonCode::SERVER_UNAVAILABLE);
    }
    let m = &h.b.metrics().security;
    assert_eq!((m.auth_http_failures, m.auth_http_timeouts), (3, 2));
    assert_eq!(m.auth_http_refused_unavailable, 5);
    assert_eq!(m.auth_throttled, 0);

    let mut h = with_http(true, 10, None);
    let (c, _) = login(&mut h, "dev1", Protocol::V5, "dev1", b"pw1");
    let id = requests(&mut h)[0].id;
    answer(&mut h, id, HttpAnswer::TimedOut);
    assert_eq!(reason(&h.out(c)), ReasonCode::SUCCESS);
}

#[test]
fn ignore_passes_on_and_nobody_decides() {
    let mut h = with_http(true, 10, None);
    let (c, _) = login(&mut h, "dev1", Protocol::V5, "dev1", b"pw1");
    let id = requests(&mut h)[0].id;
    answer(&mut h, id, HttpAnswer::Ignore);
    assert_eq!(reason(&h.out(c)), ReasonCode::BAD_USER_NAME_OR_PASSWORD);
}

#[test]
fn waiting_logins_are_bounded() {
    let mut h = with_http(false, 2, None);
    for i in 0..2 {
        let (_, out) = login(&mut h, &format!("w{i}"), Protocol::V5, "dev", b"x");
        assert!(out.packets.is_empty());
    }
    // A third would wait too: handled as a failure instead (fail = deny).
    let (_, out) = login(&mut h, "w2", Protocol::V5, "dev", b"x");
    assert_eq!(reason(&out), ReasonCode::SERVER_UNAVAILABLE);
    assert_eq!(h.b.metrics().security.auth_http_overflow, 1);
    assert_eq!(requests(&mut h).len(), 2);
    assert_eq!(h.b.auth_waiting(), 2);
}

#[test]
fn connection_gone_before_the_answer() {
    let mut h = with_http(false, 10, None);
    let (c, _) = login(&mut h, "dev1", Protocol::V5, "dev1", b"pw1");
    let id = requests(&mut h)[0].id;
    h.b.connection_lost(h.now, c);
    assert_eq!(h.b.auth_waiting(), 0);
    answer(&mut h, id, HttpAnswer::Allow { superuser: false });
    assert_eq!(h.b.metrics().clients_connected_total, 0);
}

#[test]
fn a_waiting_connect_times_out_like_any_connect() {
    let mut h = with_http(false, 10, None);
    let (c, _) = login(&mut h, "dev1", Protocol::V5, "dev1", b"pw1");
    h.secs(11);
    assert!(h.out(c).closed);
    assert_eq!(h.b.metrics().connect_timeouts, 1);
}

#[test]
fn superuser_is_not_under_the_acl() {
    let acl = Acl::parse("topic read nothing/#\n").unwrap();
    let mut h = with_http(false, 10, Some(acl));
    for (id, superuser, want) in [("su", true, false), ("plain", false, true)] {
        let (c, _) = login(&mut h, id, Protocol::V5, id, b"pw");
        let rid = requests(&mut h)[0].id;
        answer(&mut h, rid, HttpAnswer::Allow { superuser });
        assert_eq!(reason(&h.out(c)), ReasonCode::SUCCESS);
        h.send(c, Packet::Publish(publish("t", "x", QoS::AtLeastOnce, 1)));
        let denied = matches!(&h.out(c).packets[0],
            Packet::PubAck(a) if a.reason == ReasonCode::NOT_AUTHORIZED);
        assert_eq!(denied, want, "{id}");
    }
}

#[test]
fn answer_bodies_follow_emqx() {
    let f = HttpAnswer::from_body;
    assert_eq!(
        f(br#"{"result": "allow"}"#),
        HttpAnswer::Allow { superuser: false }
    );
    assert_eq!(
        f(br#"{"result": "allow", "is_superuser": true}"#),
        HttpAnswer::Allow { superuser: true }
    );
    assert_eq!(f(br#"{"result": "deny"}"#), HttpAnswer::Deny);
    assert_eq!(f(br#"{"result": "ignore"}"#), HttpAnswer::Ignore);
    assert_eq!(f(br#"{"result": "maybe"}"#), HttpAnswer::Failed);
    assert_eq!(f(b"allow"), HttpAnswer::Failed);
}

/// A logged-in client under `acl_url` (its login answered allow).
fn acl_client(h: &mut H, id: &str) -> ConnId {
    let (c, _) = login(h, id, Protocol::V5, id, b"pw");
    let rid = requests(h)[0].id;
    answer(h, rid, HttpAnswer::Allow { superuser: false });
    assert_eq!(reason(&h.out(c)), ReasonCode::SUCCESS);
    c
}

#[test]
fn publish_waits_for_the_acl_answer_and_is_cached() {
    let mut h = with_settings(false, 10, None, Some("http://127.0.0.1:1/acl"), 100);
    let sub = acl_client(&mut h, "sub");
    let out = h.subscribe(sub, "t/#", opts(QoS::AtLeastOnce));
    assert_eq!(h.b.input_state(sub), InputState::Held);
    assert!(out.packets.is_empty(), "SUBACK waits for the answer");
    let r = requests(&mut h);
    let body: serde_json::Value = serde_json::from_slice(&r[0].body).unwrap();
    assert_eq!(body["action"], "subscribe");
    assert_eq!(body["topic"], "t/#");
    answer(&mut h, r[0].id, HttpAnswer::Allow { superuser: false });
    assert!(matches!(&h.out(sub).packets[0], Packet::SubAck(a) if a.reasons == [ReasonCode(1)]));
    assert_eq!(h.b.input_state(sub), InputState::Open);

    let p = acl_client(&mut h, "pub");
    h.send(p, Packet::Publish(publish("t/1", "x", QoS::AtLeastOnce, 1)));
    assert!(h.out(p).packets.is_empty(), "PUBACK waits for the answer");
    assert!(h.b.holds_input(p));
    let r = requests(&mut h);
    let body: serde_json::Value = serde_json::from_slice(&r[0].body).unwrap();
    assert_eq!(body["action"], "publish");
    assert_eq!(body["topic"], "t/1");
    assert_eq!(body["username"], "pub");
    answer(&mut h, r[0].id, HttpAnswer::Allow { superuser: false });
    assert!(matches!(&h.out(p).packets[0], Packet::PubAck(a) if !a.reason.is_error()));
    assert_eq!(h.out(sub).payloads(), ["x"]);
    // Cached: the next one goes through at once.
    h.send(p, Packet::Publish(publish("t/1", "y", QoS::AtLeastOnce, 2)));
    assert!(matches!(&h.out(p).packets[0], Packet::PubAck(a) if !a.reason.is_error()));
    assert!(requests(&mut h).is_empty());
    assert_eq!(h.out(sub).payloads(), ["y"]);
    // Denied: PUBACK 0x87, nothing routed; cached too.
    h.send(p, Packet::Publish(publish("t/2", "z", QoS::AtLeastOnce, 3)));
    let r = requests(&mut h);
    answer(&mut h, r[0].id, HttpAnswer::Deny);
    assert!(
        matches!(&h.out(p).packets[0], Packet::PubAck(a) if a.reason == ReasonCode::NOT_AUTHORIZED)
    );
    h.send(p, Packet::Publish(publish("t/2", "z", QoS::AtLeastOnce, 4)));
    assert!(
        matches!(&h.out(p).packets[0], Packet::PubAck(a) if a.reason == ReasonCode::NOT_AUTHORIZED)
    );
    assert!(h.out(sub).packets.is_empty());
    // Logins: 2 misses; ACL: 3 misses (t/#, t/1, t/2), 2 hits (t/1, t/2
    // again); the replays after an answer are not hits.
    let m = &h.b.metrics().security;
    assert_eq!((m.auth_http_cache_misses, m.auth_http_cache_hits), (5, 2));
}

#[test]
fn subscribe_filters_are_asked_together_even_without_a_cache() {
    let mut h = with_settings(false, 10, None, Some("http://127.0.0.1:1/acl"), 0);
    let (c, _) = login(&mut h, "c1", Protocol::V5, "c1", b"pw");
    let rid = requests(&mut h)[0].id;
    answer(&mut h, rid, HttpAnswer::Allow { superuser: false });
    h.out(c);
    h.send(
        c,
        Packet::Subscribe(Subscribe {
            packet_id: 7,
            properties: Default::default(),
            filters: vec![
                (s("ok/#"), opts(QoS::AtMostOnce)),
                (s("$share/g/no/#"), opts(QoS::AtMostOnce)),
                (s("down/#"), opts(QoS::AtMostOnce)),
            ],
        }),
    );
    let r = requests(&mut h);
    assert_eq!(r.len(), 3);
    let topics: Vec<String> = r
        .iter()
        .map(|q| serde_json::from_slice::<serde_json::Value>(&q.body).unwrap()["topic"].to_string())
        .collect();
    assert_eq!(topics, ["\"ok/#\"", "\"no/#\"", "\"down/#\""]);
    answer(&mut h, r[0].id, HttpAnswer::Allow { superuser: false });
    answer(&mut h, r[1].id, HttpAnswer::Deny);
    assert!(h.out(c).packets.is_empty(), "one answer still missing");
    // The service is down for the third: fail = deny.
    answer(&mut h, r[2].id, HttpAnswer::TimedOut);
    assert!(matches!(&h.out(c).packets[0], Packet::SubAck(a)
        if a.reasons == [ReasonCode(0), ReasonCode::NOT_AUTHORIZED, ReasonCode::NOT_AUTHORIZED]));
    assert_eq!(h.b.auth_waiting(), 0);
}

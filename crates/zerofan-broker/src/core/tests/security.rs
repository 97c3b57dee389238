//! Authentication, ACL and limit decisions of the core.

use super::*;
use crate::core::{ConnectionMeta, ListenerAuth, SecurityConfig};
use std::sync::Arc;
use zerofan_auth::{Acl, PasswordFile, ThrottleConfig};

fn passwords() -> Arc<PasswordFile> {
    let mut p = PasswordFile::new();
    p.set_with_iterations("alice", b"secret", 1).unwrap();
    Arc::new(p)
}

fn secured(l: ListenerAuth, cfg: Config) -> H {
    let mut h = H::with(Config {
        sys_interval: 0,
        ..cfg
    });
    h.b.set_security(SecurityConfig {
        listeners: vec![l],
        throttle: ThrottleConfig::default(),
        jwt: None,
        http: None,
    });
    h
}

fn login(h: &mut H, protocol: Protocol, user: Option<&str>, pw: Option<&[u8]>) -> (ConnId, Out) {
    h.connect_with("c", protocol, true, |c| {
        c.username = user.map(s);
        c.password = pw.map(Bytes::copy_from_slice);
    })
}

fn reason(out: &Out) -> ReasonCode {
    out.connack().unwrap().reason
}

#[test]
fn password_file_decisions_v5_and_v311() {
    let l = ListenerAuth {
        allow_anonymous: false,
        passwords: Some(passwords()),
        ..ListenerAuth::default()
    };
    let mut h = secured(l, Config::default());
    let ok = login(&mut h, Protocol::V5, Some("alice"), Some(b"secret")).1;
    assert_eq!(reason(&ok), ReasonCode::SUCCESS);
    let bad = login(&mut h, Protocol::V5, Some("alice"), Some(b"nope")).1;
    assert_eq!(reason(&bad), ReasonCode::BAD_USER_NAME_OR_PASSWORD);
    assert!(bad.closed);
    let anon = login(&mut h, Protocol::V5, None, None).1;
    assert_eq!(reason(&anon), ReasonCode::NOT_AUTHORIZED);
    // 3.1.1: the codec maps 0x86 to 4 and 0x87 to 5, decoded back here.
    let bad = login(&mut h, Protocol::V311, Some("bob"), Some(b"x")).1;
    assert_eq!(reason(&bad), ReasonCode::BAD_USER_NAME_OR_PASSWORD);
    let m = &h.b.metrics().security;
    assert_eq!(m.auth_bad_credentials, 2);
    assert_eq!(m.auth_not_authorized, 1);
    assert_eq!(m.auth_success, 1);
}

fn two_users() -> Arc<PasswordFile> {
    let mut p = PasswordFile::new();
    p.set_with_iterations("alice", b"secret", 1).unwrap();
    p.set_with_iterations("bob", b"builder", 1).unwrap();
    Arc::new(p)
}

#[test]
fn repeated_failures_are_refused_while_penalised() {
    let l = ListenerAuth {
        passwords: Some(passwords()),
        ..ListenerAuth::default()
    };
    let mut h = secured(l, Config::default());
    for _ in 0..4 {
        let o = login(&mut h, Protocol::V5, Some("alice"), Some(b"bad")).1;
        assert_eq!(reason(&o), ReasonCode::BAD_USER_NAME_OR_PASSWORD);
    }
    // Throttled: 0x9F with a reason string, not "not authorized".
    let o = login(&mut h, Protocol::V5, Some("alice"), Some(b"secret")).1;
    let ack = o.connack().unwrap();
    assert_eq!(ack.reason, ReasonCode::CONNECTION_RATE_EXCEEDED);
    let why = ack.properties.reason_string.clone();
    assert!(why.is_some_and(|w| w.contains("failed logins")));
    // 3.1.1: return code 3 (server unavailable), decoded back as 0x88.
    let o = login(&mut h, Protocol::V311, Some("alice"), Some(b"secret")).1;
    assert_eq!(reason(&o), ReasonCode::SERVER_UNAVAILABLE);
    assert_eq!(h.b.metrics().security.auth_throttled, 2);
    h.secs(2);
    let o = login(&mut h, Protocol::V5, Some("alice"), Some(b"secret")).1;
    assert_eq!(reason(&o), ReasonCode::SUCCESS);
}

/// Failures are counted per (address, username): five failed logins of one
/// account from 127.0.0.1 do not lock out another account's correct
/// password from the same address.
#[test]
fn failures_of_one_user_do_not_lock_out_another() {
    let l = ListenerAuth {
        allow_anonymous: false,
        passwords: Some(two_users()),
        ..ListenerAuth::default()
    };
    let mut h = secured(l, Config::default());
    for _ in 0..5 {
        let o = login(&mut h, Protocol::V5, Some("alice"), Some(b"bad")).1;
        assert!(reason(&o).is_error());
    }
    let o = login(&mut h, Protocol::V5, Some("bob"), Some(b"builder")).1;
    assert_eq!(reason(&o), ReasonCode::SUCCESS);
    let o = h
        .connect_with("c2", Protocol::V311, true, |c| {
            c.username = Some(s("bob"));
            c.password = Some(Bytes::from_static(b"builder"));
        })
        .1;
    assert_eq!(reason(&o), ReasonCode::SUCCESS);
    // alice herself is still penalised.
    let o = login(&mut h, Protocol::V5, Some("alice"), Some(b"secret")).1;
    assert_eq!(reason(&o), ReasonCode::CONNECTION_RATE_EXCEEDED);
}

/// Anonymous refusals are not failures: they are never throttled, and do
/// not count against a username from that address.
#[test]
fn anonymous_refusals_are_not_counted() {
    let l = ListenerAuth {
        allow_anonymous: false,
        passwords: Some(passwords()),
        ..ListenerAuth::default()
    };
    let mut h = secured(l, Config::default());
    for _ in 0..8 {
        let o = login(&mut h, Protocol::V5, None, None).1;
        assert_eq!(reason(&o), ReasonCode::NOT_AUTHORIZED);
    }
    assert_eq!(h.b.metrics().security.auth_throttled, 0);
    assert_eq!(h.b.metrics().security.auth_not_authorized, 8);
    let o = login(&mut h, Protocol::V5, Some("alice"), Some(b"secret")).1;
    assert_eq!(reason(&o), ReasonCode::SUCCESS);
}

#[test]
fn identity_is_the_username() {
    let acl = Acl::parse("user dev1\ntopic write d/#\n").unwrap();
    let l = ListenerAuth {
        allow_anonymous: false,
        acl: Some(Arc::new(acl)),
        use_identity_as_username: true,
        ..ListenerAuth::default()
    };
    let mut h = secured(l, Config::default());
    let peer = "127.0.0.1:1".parse().unwrap();
    let meta = ConnectionMeta {
        listener: 0,
        identity: Some("dev1".into()),
        ..Default::default()
    };
    let c = h.b.connection_opened_with(h.now, peer, meta);
    h.send(
        c,
        Packet::Connect(Box::new(connect_packet("x", Protocol::V5, true))),
    );
    assert_eq!(reason(&h.out(c)), ReasonCode::SUCCESS);
    h.send(c, Packet::Publish(publish("d/1", "p", QoS::AtLeastOnce, 1)));
    let ack = h.out(c);
    assert!(matches!(&ack.packets[0], Packet::PubAck(a) if !a.reason.is_error()));
    // No certificate: not authorized.
    let c2 =
        h.b.connection_opened_with(h.now, peer, ConnectionMeta::default());
    h.send(
        c2,
        Packet::Connect(Box::new(connect_packet("y", Protocol::V5, true))),
    );
    assert_eq!(reason(&h.out(c2)), ReasonCode::NOT_AUTHORIZED);
}

#[test]
fn acl_on_publish_subscribe_delivery_and_retained() {
    let acl =
        Acl::parse("topic read pub/#\ntopic write pub/in\npattern readwrite own/%c/#\n").unwrap();
    let l = ListenerAuth {
        acl: Some(Arc::new(acl)),
        ..ListenerAuth::default()
    };
    let mut h = secured(l, Config::default());
    let sub = h.client("s");
    let out = h.subscribe(sub, "#", opts(QoS::AtLeastOnce));
    assert!(matches!(&out.packets[0], Packet::SubAck(a) if a.reasons == [ReasonCode(1)]));
    let out = h.subscribe(sub, "secret/#", opts(QoS::AtLeastOnce));
    assert!(
        matches!(&out.packets[0], Packet::SubAck(a) if a.reasons == [ReasonCode::NOT_AUTHORIZED])
    );
    let p = h.client("p");
    // Allowed write, allowed read.
    h.send(
        p,
        Packet::Publish(publish("pub/in", "1", QoS::AtLeastOnce, 1)),
    );
    assert!(matches!(&h.out(p).packets[0], Packet::PubAck(a) if !a.reason.is_error()));
    assert_eq!(h.out(sub).payloads(), ["1"]);
    // Refused write: PUBACK / PUBREC 0x87, QoS 0 silently, nothing routed.
    h.send(
        p,
        Packet::Publish(publish("pub/other", "2", QoS::AtLeastOnce, 2)),
    );
    assert!(
        matches!(&h.out(p).packets[0], Packet::PubAck(a) if a.reason == ReasonCode::NOT_AUTHORIZED)
    );
    h.send(
        p,
        Packet::Publish(publish("pub/other", "3", QoS::ExactlyOnce, 3)),
    );
    assert!(
        matches!(&h.out(p).packets[0], Packet::PubRec(a) if a.reason == ReasonCode::NOT_AUTHORIZED)
    );
    h.send(
        p,
        Packet::Publish(publish("pub/other", "4", QoS::AtMostOnce, 0)),
    );
    assert!(h.out(p).packets.is_empty());
    assert!(h.out(sub).packets.is_empty());
    // Own pattern topic: written by p, not readable by s.
    h.send(
        p,
        Packet::Publish(publish("own/p/x", "5", QoS::AtLeastOnce, 4)),
    );
    assert!(matches!(&h.out(p).packets[0], Packet::PubAck(a) if !a.reason.is_error()));
    assert!(h.out(sub).packets.is_empty());
    let m = h.b.metrics().security.clone();
    assert_eq!(m.acl_denied_publish, 3);
    assert_eq!(m.acl_denied_subscribe, 1);
    assert_eq!(m.acl_denied_delivery, 1);
}

#[test]
fn v311_denied_publish_is_acked_and_dropped() {
    let acl = Acl::parse("topic read #\n").unwrap();
    let l = ListenerAuth {
        acl: Some(Arc::new(acl)),
        ..ListenerAuth::default()
    };
    let mut h = secured(l, Config::default());
    let sub = h.client("s");
    h.subscribe(sub, "#", opts(QoS::AtLeastOnce));
    let (p, _) = h.connect_with("p", Protocol::V311, true, |_| {});
    h.send(p, Packet::Publish(publish("a", "x", QoS::AtLeastOnce, 1)));
    assert!(matches!(&h.out(p).packets[0], Packet::PubAck(a) if a.reason == ReasonCode::SUCCESS));
    assert!(h.out(sub).packets.is_empty());
    let out = h.subscribe(p, "#", opts(QoS::AtLeastOnce));
    assert!(matches!(&out.packets[0], Packet::SubAck(a) if a.reasons == [ReasonCode(1)]));
}

fn open_with(h: &mut H, id: &str) -> (ConnId, Out) {
    let peer = "127.0.0.1:1".parse().unwrap();
    let c =
        h.b.connection_opened_with(h.now, peer, ConnectionMeta::default());
    h.send(
        c,
        Packet::Connect(Box::new(connect_packet(id, Protocol::V5, true))),
    );
    (c, h.out(c))
}

#[test]
fn connection_limits_refuse_with_reason_codes() {
    let l = ListenerAuth {
        max_connections: 2,
        ..ListenerAuth::default()
    };
    let mut h = secured(
        l,
        Config {
            max_connection_rate: 3,
            ..Config::default()
        },
    );
    let (a, out) = open_with(&mut h, "a");
    assert_eq!(reason(&out), ReasonCode::SUCCESS);
    let (_, out) = open_with(&mut h, "b");
    assert_eq!(reason(&out), ReasonCode::SUCCESS);
    let (c, out) = open_with(&mut h, "c");
    assert_eq!(reason(&out), ReasonCode::QUOTA_EXCEEDED);
    h.b.connection_lost(h.now, a);
    h.b.connection_lost(h.now, c);
    // Per-address rate: 3 per second (a refused-for-quota one is not
    // counted), the 4th within the second refused.
    let (d, out) = open_with(&mut h, "d");
    assert_eq!(reason(&out), ReasonCode::SUCCESS);
    h.b.connection_lost(h.now, d);
    let (e, out) = open_with(&mut h, "e");
    assert_eq!(reason(&out), ReasonCode::CONNECTION_RATE_EXCEEDED);
    h.b.connection_lost(h.now, e);
    h.secs(1);
    let (_, out) = open_with(&mut h, "f");
    assert_eq!(reason(&out), ReasonCode::SUCCESS);
    let m = &h.b.metrics().security;
    assert_eq!(
        (m.refused_max_connections, m.refused_connection_rate),
        (1, 1)
    );
}

#[test]
fn publish_rate_and_topic_length() {
    let mut h = H::with(Config {
        sys_interval: 0,
        max_publish_rate: 2,
        max_topic_length: 8,
        ..Config::default()
    });
    let p = h.client("p");
    for i in 1..=2 {
        h.send(p, Packet::Publish(publish("t", "x", QoS::AtLeastOnce, i)));
    }
    h.send(p, Packet::Publish(publish("t", "x", QoS::AtLeastOnce, 3)));
    let out = h.out(p);
    assert_eq!(out.disconnect(), Some(ReasonCode::MESSAGE_RATE_TOO_HIGH));
    let q = h.client("q");
    let out = h.subscribe(q, "123456789", opts(QoS::AtMostOnce));
    assert!(
        matches!(&out.packets[0], Packet::SubAck(a) if a.reasons == [ReasonCode::TOPIC_FILTER_INVALID])
    );
    h.send(
        q,
        Packet::Publish(publish("123456789", "x", QoS::AtMostOnce, 0)),
    );
    assert_eq!(h.out(q).disconnect(), Some(ReasonCode::TOPIC_NAME_INVALID));
    let m = &h.b.metrics().security;
    assert_eq!(
        (m.rate_limited_disconnects, m.refused_topic_too_long),
        (1, 2)
    );
}

/// `$SYS/` belongs to the broker: a client's publish into it is refused
/// (PUBACK / PUBREC 0x87 under MQTT 5, a plain ack under 3.1.1 as
/// mosquitto does), never routed, and counted.
#[test]
fn publish_into_sys_is_refused_and_counted() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "$SYS/#", opts(QoS::AtLeastOnce));
    let _ = h.out(sub);
    let p = h.client("p");
    h.send(
        p,
        Packet::Publish(publish("$SYS/broker/fake", "1", QoS::AtLeastOnce, 1)),
    );
    assert!(
        matches!(&h.out(p).packets[..], [Packet::PubAck(a)] if a.reason == ReasonCode::NOT_AUTHORIZED)
    );
    h.send(
        p,
        Packet::Publish(publish("$SYS", "2", QoS::ExactlyOnce, 2)),
    );
    assert!(
        matches!(&h.out(p).packets[..], [Packet::PubRec(a)] if a.reason == ReasonCode::NOT_AUTHORIZED)
    );
    h.send(
        p,
        Packet::Publish(publish("$SYS/x", "3", QoS::AtMostOnce, 0)),
    );
    let (old, _) = h.connect_with("old", Protocol::V311, true, |_| {});
    h.send(
        old,
        Packet::Publish(publish("$SYS/x", "4", QoS::AtLeastOnce, 5)),
    );
    assert!(matches!(&h.out(old).packets[..], [Packet::PubAck(a)] if !a.reason.is_error()));
    assert!(h.out(sub).publishes().is_empty());
    assert_eq!(h.b.metrics().security.refused_sys_publish, 4);
    assert_eq!(h.b.metrics().security.acl_denied_publish, 0);
    assert_eq!(h.b.metrics().messages_received, 0);
}

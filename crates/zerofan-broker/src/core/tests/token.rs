//! Logins with a JSON Web Token (`auth_jwt`) in the chain after the
//! password file: accepted, refused (0x86 forged, 0x87 expired or another
//! user's), the token's ACL claim, and the disconnect at expiry.

use super::*;
use crate::core::{JwtAuth, ListenerAuth, SecurityConfig};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::SystemTime;
use zerofan_auth::{JwtSettings, JwtVerifier, KeyMaterial, PasswordFile, ThrottleConfig};

const SECRET: &[u8] = b"jwt-test-secret";

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn token(claims: Value) -> Vec<u8> {
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET),
    )
    .unwrap()
    .into_bytes()
}

fn with_jwt(disconnect_on_expiry: bool) -> H {
    let mut h = H::new();
    let mut p = PasswordFile::new();
    p.set_with_iterations("alice", b"secret", 1).unwrap();
    let settings = JwtSettings {
        acl_claim: Some("acl".into()),
        ..JwtSettings::default()
    };
    let verifier = JwtVerifier::new(settings, KeyMaterial::Secret(SECRET)).unwrap();
    let jwt = JwtAuth {
        verifier,
        disconnect_on_expiry,
        leeway_s: 0,
        anchor: (h.now, unix_now()),
    };
    h.b.set_security(SecurityConfig {
        listeners: vec![ListenerAuth {
            allow_anonymous: false,
            passwords: Some(Arc::new(p)),
            ..ListenerAuth::default()
        }],
        throttle: ThrottleConfig::default(),
        jwt: Some(Arc::new(jwt)),
        http: None,
    });
    h
}

fn login(h: &mut H, id: &str, v: Protocol, user: &str, pw: &[u8]) -> (ConnId, Out) {
    h.connect_with(id, v, true, |c| {
        c.username = Some(s(user));
        c.password = Some(Bytes::copy_from_slice(pw));
    })
}

fn reason(o: &Out) -> ReasonCode {
    o.connack().unwrap().reason
}

#[test]
fn chain_password_file_then_token() {
    let mut h = with_jwt(true);
    let now = unix_now();
    // The password file decides for its users.
    assert_eq!(
        reason(&login(&mut h, "a", Protocol::V5, "alice", b"secret").1),
        ReasonCode::SUCCESS
    );
    assert_eq!(
        reason(&login(&mut h, "a2", Protocol::V5, "alice", b"wrong").1),
        ReasonCode::BAD_USER_NAME_OR_PASSWORD
    );
    // A token decides for the others.
    let good = token(json!({"sub": "dev1", "exp": now + 3600}));
    assert_eq!(
        reason(&login(&mut h, "d1", Protocol::V5, "dev1", &good).1),
        ReasonCode::SUCCESS
    );
    // Another user's token: not authorized.
    assert_eq!(
        reason(&login(&mut h, "d2", Protocol::V5, "dev2", &good).1),
        ReasonCode::NOT_AUTHORIZED
    );
    // Expired: not authorized (3.1.1: 5).
    let old = token(json!({"sub": "dev1", "exp": now - 10}));
    assert_eq!(
        reason(&login(&mut h, "d3", Protocol::V5, "dev1", &old).1),
        ReasonCode::NOT_AUTHORIZED
    );
    assert_eq!(
        reason(&login(&mut h, "d4", Protocol::V311, "dev1", &old).1),
        ReasonCode::NOT_AUTHORIZED
    );
    // Forged (signed with another secret): bad username or password.
    let forged = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "dev1", "exp": now + 3600}),
        &EncodingKey::from_secret(b"guess"),
    )
    .unwrap();
    assert_eq!(
        reason(&login(&mut h, "d5", Protocol::V5, "dev1", forged.as_bytes()).1),
        ReasonCode::BAD_USER_NAME_OR_PASSWORD
    );
    // Neither in the file nor a token: nobody decided, refused.
    assert_eq!(
        reason(&login(&mut h, "d6", Protocol::V5, "dev9", b"plain").1),
        ReasonCode::BAD_USER_NAME_OR_PASSWORD
    );
    let m = &h.b.metrics().security;
    assert_eq!(m.auth_success, 2);
    assert_eq!(m.auth_bad_credentials, 3);
    assert_eq!(m.auth_not_authorized, 3);
}

#[test]
fn token_acl_claim_replaces_the_listener_acl() {
    let mut h = with_jwt(true);
    let t = token(json!({"sub": "dev1", "exp": unix_now() + 3600,
        "acl": {"pub": ["up/${clientid}"], "sub": ["down/#"]}}));
    let (c, out) = login(&mut h, "d1", Protocol::V5, "dev1", &t);
    assert_eq!(reason(&out), ReasonCode::SUCCESS);
    h.send(
        c,
        Packet::Publish(publish("up/d1", "x", QoS::AtLeastOnce, 1)),
    );
    assert!(matches!(&h.out(c).packets[0], Packet::PubAck(a) if !a.reason.is_error()));
    h.send(
        c,
        Packet::Publish(publish("up/d2", "x", QoS::AtLeastOnce, 2)),
    );
    assert!(
        matches!(&h.out(c).packets[0], Packet::PubAck(a) if a.reason == ReasonCode::NOT_AUTHORIZED)
    );
    let out = h.subscribe(c, "up/#", opts(QoS::AtMostOnce));
    assert!(
        matches!(&out.packets[0], Packet::SubAck(a) if a.reasons == [ReasonCode::NOT_AUTHORIZED])
    );
}

#[test]
fn connection_closed_when_its_token_expires() {
    let mut h = with_jwt(true);
    let t = token(json!({"sub": "dev1", "exp": unix_now() + 5}));
    let (c, out) = login(&mut h, "d1", Protocol::V5, "dev1", &t);
    assert_eq!(reason(&out), ReasonCode::SUCCESS);
    h.secs(2);
    assert!(!h.out(c).closed);
    h.secs(5);
    let out = h.out(c);
    assert_eq!(out.disconnect(), Some(ReasonCode::NOT_AUTHORIZED));
    assert!(out.closed);
    assert_eq!(h.b.metrics().security.auth_token_expired, 1);

    // Configured not to: the connection stays.
    let mut h = with_jwt(false);
    let t = token(json!({"sub": "dev1", "exp": unix_now() + 5}));
    let (c, out) = login(&mut h, "d1", Protocol::V5, "dev1", &t);
    assert_eq!(reason(&out), ReasonCode::SUCCESS);
    h.secs(30);
    assert!(!h.out(c).closed);
    assert_eq!(h.b.metrics().security.auth_token_expired, 0);
}

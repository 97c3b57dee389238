//! MQTT 5 enhanced authentication with SCRAM-SHA-512 against the password
//! file: CONNECT → AUTH 0x18 → AUTH 0x18 → CONNACK with the server's
//! signature; a wrong password is 0x86; another method 0x8C.

use super::*;
use crate::core::{ListenerAuth, SecurityConfig};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha512};
use std::sync::Arc;
use zerofan_auth::{PasswordFile, ThrottleConfig};

fn hmac512(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<Sha512>::new_from_slice(key).unwrap();
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

fn hmac256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// A SCRAM mechanism, as the client computes it.
struct Mech {
    hmac: fn(&[u8], &[u8]) -> Vec<u8>,
    hash: fn(&[u8]) -> Vec<u8>,
    salted: fn(&[u8], &[u8], u32) -> Vec<u8>,
}

const SHA512: Mech = Mech {
    hmac: hmac512,
    hash: |d| Sha512::digest(d).to_vec(),
    salted: |p, s, i| {
        let mut out = [0u8; 64];
        pbkdf2::pbkdf2_hmac::<Sha512>(p, s, i, &mut out);
        out.to_vec()
    },
};

const SHA256: Mech = Mech {
    hmac: hmac256,
    hash: |d| sha2::Sha256::digest(d).to_vec(),
    salted: |p, s, i| {
        let mut out = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<sha2::Sha256>(p, s, i, &mut out);
        out.to_vec()
    },
};

/// The client-final message and the server signature the client expects.
fn client_final(password: &[u8], first_bare: &str, server_first: &str) -> (String, String) {
    client_final_with(&SHA512, password, first_bare, server_first)
}

fn client_final_with(
    m: &Mech,
    password: &[u8],
    first_bare: &str,
    server_first: &str,
) -> (String, String) {
    let mut parts = server_first.split(',');
    let nonce = &parts.next().unwrap()[2..];
    let salt = B64.decode(&parts.next().unwrap()[2..]).unwrap();
    let iterations: u32 = parts.next().unwrap()[2..].parse().unwrap();
    let salted = (m.salted)(password, &salt, iterations);
    let client_key = (m.hmac)(&salted, b"Client Key");
    let stored = (m.hash)(&client_key);
    let without = format!("c=biws,r={nonce}");
    let auth = format!("{first_bare},{server_first},{without}");
    let sig = (m.hmac)(&stored, auth.as_bytes());
    let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
    let server_sig = (m.hmac)(&(m.hmac)(&salted, b"Server Key"), auth.as_bytes());
    (
        format!("{without},p={}", B64.encode(proof)),
        format!("v={}", B64.encode(server_sig)),
    )
}

fn secured() -> H {
    let mut h = H::new();
    let mut p = PasswordFile::new();
    p.set_with_iterations("alice", b"wonderland", 50).unwrap();
    h.b.set_security(SecurityConfig {
        listeners: vec![ListenerAuth {
            allow_anonymous: false,
            passwords: Some(Arc::new(p)),
            ..ListenerAuth::default()
        }],
        throttle: ThrottleConfig::default(),
        jwt: None,
        http: None,
    });
    h
}

fn auth_packet(method: &str, data: &str) -> Packet {
    let props = Properties {
        authentication_method: Some(s(method)),
        authentication_data: Some(Bytes::copy_from_slice(data.as_bytes())),
        ..Default::default()
    };
    Packet::Auth(zerofan_codec::Auth {
        reason: ReasonCode::CONTINUE_AUTHENTICATION,
        properties: props.into(),
    })
}

/// CONNECT with SCRAM; returns the connection and the server-first message.
fn start(h: &mut H, method: &str, user: &str) -> (ConnId, Out) {
    h.connect_with("c1", Protocol::V5, true, |c| {
        c.properties.authentication_method = Some(s(method));
        c.properties.authentication_data = Some(Bytes::from(format!("n,,n={user},r=clientnonce")));
    })
}

fn server_first(out: &Out) -> String {
    match &out.packets[0] {
        Packet::Auth(a) => {
            assert_eq!(a.reason, ReasonCode::CONTINUE_AUTHENTICATION);
            assert_eq!(
                a.properties.authentication_method.as_deref(),
                Some("SCRAM-SHA-512")
            );
            String::from_utf8(a.properties.authentication_data.clone().unwrap().to_vec()).unwrap()
        }
        p => panic!("expected AUTH, got {p:?}"),
    }
}

#[test]
fn scram_sha512_login_against_the_password_file() {
    let mut h = secured();
    let (c, out) = start(&mut h, "SCRAM-SHA-512", "alice");
    let first = server_first(&out);
    assert!(first.starts_with("r=clientnonce"));
    let (fin, want_sig) = client_final(b"wonderland", "n=alice,r=clientnonce", &first);
    h.send(c, auth_packet("SCRAM-SHA-512", &fin));
    let out = h.out(c);
    let ack = out.connack().unwrap();
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    assert_eq!(
        ack.properties.authentication_method.as_deref(),
        Some("SCRAM-SHA-512")
    );
    let sig = ack.properties.authentication_data.clone().unwrap();
    assert_eq!(
        &sig[..],
        want_sig.as_bytes(),
        "the server proves it knows the key"
    );
    assert_eq!(h.b.metrics().security.auth_success, 1);
}

#[test]
fn wrong_password_unknown_user_and_other_methods() {
    let mut h = secured();
    for (user, pw) in [("alice", &b"guess"[..]), ("mallory", &b"x"[..])] {
        let (c, out) = start(&mut h, "SCRAM-SHA-512", user);
        let first = server_first(&out);
        let bare = format!("n={user},r=clientnonce");
        let (fin, _) = client_final(pw, &bare, &first);
        h.send(c, auth_packet("SCRAM-SHA-512", &fin));
        let out = h.out(c);
        assert_eq!(
            out.connack().unwrap().reason,
            ReasonCode::BAD_USER_NAME_OR_PASSWORD
        );
        assert!(out.closed);
    }
    assert_eq!(h.b.metrics().security.auth_bad_credentials, 2);
    let (_, out) = start(&mut h, "PLAIN-TEXT", "alice");
    assert_eq!(
        out.connack().unwrap().reason,
        ReasonCode::BAD_AUTHENTICATION_METHOD
    );
    // An AUTH with another method mid-exchange is a protocol error.
    let (c, _) = start(&mut h, "SCRAM-SHA-512", "alice");
    h.send(c, auth_packet("SCRAM-SHA-256", "c=biws,r=x,p=AA=="));
    let out = h.out(c);
    assert_eq!(out.connack().unwrap().reason, ReasonCode::PROTOCOL_ERROR);
    assert!(out.closed);
}

fn auth_with(reason: ReasonCode, data: &str) -> Packet {
    match auth_packet("SCRAM-SHA-512", data) {
        Packet::Auth(mut a) => {
            a.reason = reason;
            Packet::Auth(a)
        }
        p => p,
    }
}

/// Log alice in with SCRAM; returns the connection.
fn logged_in(h: &mut H) -> ConnId {
    let (c, out) = start(h, "SCRAM-SHA-512", "alice");
    let (fin, _) = client_final(b"wonderland", "n=alice,r=clientnonce", &server_first(&out));
    h.send(c, auth_packet("SCRAM-SHA-512", &fin));
    assert_eq!(h.out(c).connack().unwrap().reason, ReasonCode::SUCCESS);
    c
}

#[test]
fn reauthentication() {
    let mut h = secured();
    let c = logged_in(&mut h);
    h.send(
        c,
        auth_with(ReasonCode::REAUTHENTICATE, "n,,n=alice,r=again"),
    );
    let first = server_first(&h.out(c));
    assert!(first.starts_with("r=again"));
    let (fin, want) = client_final(b"wonderland", "n=alice,r=again", &first);
    h.send(c, auth_with(ReasonCode::CONTINUE_AUTHENTICATION, &fin));
    let out = h.out(c);
    match &out.packets[0] {
        Packet::Auth(a) => {
            assert_eq!(a.reason, ReasonCode::SUCCESS);
            let sig = a.properties.authentication_data.clone().unwrap();
            assert_eq!(&sig[..], want.as_bytes());
        }
        p => panic!("expected AUTH 0x00, got {p:?}"),
    }
    assert!(!out.closed);
    // A failed re-authentication closes the connection.
    h.send(
        c,
        auth_with(ReasonCode::REAUTHENTICATE, "n,,n=alice,r=third"),
    );
    let first = server_first(&h.out(c));
    let (fin, _) = client_final(b"guess", "n=alice,r=third", &first);
    h.send(c, auth_with(ReasonCode::CONTINUE_AUTHENTICATION, &fin));
    let out = h.out(c);
    assert_eq!(out.disconnect(), Some(ReasonCode::NOT_AUTHORIZED));
    assert!(out.closed);
    // Another user is refused at once.
    let c = logged_in(&mut h);
    h.send(c, auth_with(ReasonCode::REAUTHENTICATE, "n,,n=bob,r=x"));
    assert_eq!(h.out(c).disconnect(), Some(ReasonCode::NOT_AUTHORIZED));
    // AUTH from a client that did not log in with SCRAM: protocol error.
    let (c, out) = h.connect_with("plain", Protocol::V5, true, |c| {
        c.username = Some(s("alice"));
        c.password = Some(Bytes::from_static(b"wonderland"));
    });
    assert_eq!(out.connack().unwrap().reason, ReasonCode::SUCCESS);
    h.send(c, auth_with(ReasonCode::REAUTHENTICATE, "n,,n=alice,r=x"));
    assert_eq!(h.out(c).disconnect(), Some(ReasonCode::PROTOCOL_ERROR));
}

/// alice (`$7$`) and carol (`SCRAM-SHA-256$`) in one password file.
fn secured_with_sha256() -> H {
    let mut h = H::new();
    let mut p = PasswordFile::new();
    p.set_with_iterations("alice", b"wonderland", 50).unwrap();
    p.set_scram_sha256("carol", b"looking-glass", 50).unwrap();
    h.b.set_security(SecurityConfig {
        listeners: vec![ListenerAuth {
            allow_anonymous: false,
            passwords: Some(Arc::new(p)),
            ..ListenerAuth::default()
        }],
        throttle: ThrottleConfig::default(),
        jwt: None,
        http: None,
    });
    h
}

fn auth256(reason: ReasonCode, data: &str) -> Packet {
    match auth_packet("SCRAM-SHA-256", data) {
        Packet::Auth(mut a) => {
            a.reason = reason;
            Packet::Auth(a)
        }
        p => p,
    }
}

fn first256(out: &Out) -> String {
    match &out.packets[0] {
        Packet::Auth(a) => {
            assert_eq!(
                a.properties.authentication_method.as_deref(),
                Some("SCRAM-SHA-256")
            );
            String::from_utf8(a.properties.authentication_data.clone().unwrap().to_vec()).unwrap()
        }
        p => panic!("expected AUTH, got {p:?}"),
    }
}

/// SCRAM-SHA-256 against a `SCRAM-SHA-256$` entry: login, the server's
/// signature, re-authentication with the same method; the entry also
/// verifies a plain password; a `$7$` user cannot pass SCRAM-SHA-256.
#[test]
fn scram_sha256_against_a_sha256_entry() {
    let mut h = secured_with_sha256();
    let (c, out) = start(&mut h, "SCRAM-SHA-256", "carol");
    let first = first256(&out);
    let (fin, want_sig) =
        client_final_with(&SHA256, b"looking-glass", "n=carol,r=clientnonce", &first);
    h.send(c, auth_packet("SCRAM-SHA-256", &fin));
    let out = h.out(c);
    let ack = out.connack().unwrap();
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    let sig = ack.properties.authentication_data.clone().unwrap();
    assert_eq!(&sig[..], want_sig.as_bytes());

    // Re-authentication keeps the CONNECT's method.
    h.send(c, auth256(ReasonCode::REAUTHENTICATE, "n,,n=carol,r=again"));
    let first = first256(&h.out(c));
    let (fin, want) = client_final_with(&SHA256, b"looking-glass", "n=carol,r=again", &first);
    h.send(c, auth256(ReasonCode::CONTINUE_AUTHENTICATION, &fin));
    match &h.out(c).packets[0] {
        Packet::Auth(a) => {
            assert_eq!(a.reason, ReasonCode::SUCCESS);
            assert_eq!(
                &a.properties.authentication_data.clone().unwrap()[..],
                want.as_bytes()
            );
        }
        p => panic!("expected AUTH 0x00, got {p:?}"),
    }
    h.send(
        c,
        auth_with(ReasonCode::REAUTHENTICATE, "n,,n=carol,r=third"),
    );
    assert_eq!(h.out(c).disconnect(), Some(ReasonCode::PROTOCOL_ERROR));

    // The same entry verifies a plain CONNECT password.
    let (_, out) = h.connect_with("plain", Protocol::V5, true, |c| {
        c.username = Some(s("carol"));
        c.password = Some(Bytes::from_static(b"looking-glass"));
    });
    assert_eq!(out.connack().unwrap().reason, ReasonCode::SUCCESS);

    // alice has only SHA-512 credentials: SCRAM-SHA-256 fails at the proof.
    let (c, out) = start(&mut h, "SCRAM-SHA-256", "alice");
    let first = first256(&out);
    let (fin, _) = client_final_with(&SHA256, b"wonderland", "n=alice,r=clientnonce", &first);
    h.send(c, auth_packet("SCRAM-SHA-256", &fin));
    assert_eq!(
        h.out(c).connack().unwrap().reason,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD
    );
}

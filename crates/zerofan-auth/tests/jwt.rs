//! Tokens made here with HS256, RS256 (a test-only RSA key in fixtures/:
//! `ring` cannot generate RSA keys) and ES256 (a key generated here), then
//! checked by JwtVerifier: accepted, expired, not yet valid, tampered,
//! wrong algorithm, wrong user, JWKS with key ids, the ACL claim.

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use zerofan_auth::jwt::{acl_from_claim, parse_algorithm, JwtError};
use zerofan_auth::{Access, JwtRefusal, JwtSettings, JwtVerifier, KeyMaterial};

const NOW: u64 = 1_800_000_000;
const RSA_PRIVATE: &[u8] = include_bytes!("fixtures/jwt_rsa_private.pem");
const RSA_PUBLIC: &[u8] = include_bytes!("fixtures/jwt_rsa_public.pem");

fn token(alg: Algorithm, key: &EncodingKey, claims: &Value) -> Vec<u8> {
    encode(&Header::new(alg), claims, key).unwrap().into_bytes()
}

fn claims(sub: &str, exp: u64) -> Value {
    json!({"sub": sub, "exp": exp})
}

fn hs() -> (JwtVerifier, EncodingKey) {
    let v = JwtVerifier::new(JwtSettings::default(), KeyMaterial::Secret(b"s3cret\n")).unwrap();
    (v, EncodingKey::from_secret(b"s3cret"))
}

#[test]
fn hs256_accepted_expired_tampered_and_wrong_user() {
    let (v, key) = hs();
    let good = token(Algorithm::HS256, &key, &claims("dev1", NOW + 60));
    let login = v.verify(&good, Some("dev1"), NOW).unwrap();
    assert_eq!(login.expires_at, Some(NOW + 60));
    assert!(login.acl.is_none());
    // The username claim must equal the CONNECT username.
    assert_eq!(
        v.verify(&good, Some("dev2"), NOW).unwrap_err(),
        JwtRefusal::WrongUser
    );
    assert_eq!(
        v.verify(&good, None, NOW).unwrap_err(),
        JwtRefusal::WrongUser
    );
    // Expired.
    assert_eq!(
        v.verify(&good, Some("dev1"), NOW + 61).unwrap_err(),
        JwtRefusal::Expired
    );
    // Tampered: the payload of another token with this one's signature.
    let other = token(Algorithm::HS256, &key, &claims("admin", NOW + 60));
    let g = String::from_utf8(good.clone()).unwrap();
    let o = String::from_utf8(other).unwrap();
    let gp: Vec<&str> = g.split('.').collect();
    let op: Vec<&str> = o.split('.').collect();
    let forged = format!("{}.{}.{}", gp[0], op[1], gp[2]);
    let r = v.verify(forged.as_bytes(), Some("admin"), NOW).unwrap_err();
    assert_eq!(r, JwtRefusal::BadSignature);
    assert!(r.is_bad_credentials());
    // Signed with another secret.
    let wrong = token(
        Algorithm::HS256,
        &EncodingKey::from_secret(b"guess"),
        &claims("dev1", NOW + 60),
    );
    assert_eq!(
        v.verify(&wrong, Some("dev1"), NOW).unwrap_err(),
        JwtRefusal::BadSignature
    );
    // Not a token at all: passed on, not refused by this source.
    assert_eq!(
        v.verify(b"plain password", Some("dev1"), NOW).unwrap_err(),
        JwtRefusal::NotAToken
    );
}

#[test]
fn leeway_and_not_before() {
    let settings = JwtSettings {
        leeway_s: 30,
        ..JwtSettings::default()
    };
    let v = JwtVerifier::new(settings, KeyMaterial::Secret(b"k")).unwrap();
    let key = EncodingKey::from_secret(b"k");
    let t = token(
        Algorithm::HS256,
        &key,
        &json!({"sub": "u", "exp": NOW, "nbf": NOW - 10}),
    );
    assert!(v.verify(&t, Some("u"), NOW + 30).is_ok());
    assert_eq!(
        v.verify(&t, Some("u"), NOW + 31).unwrap_err(),
        JwtRefusal::Expired
    );
    assert_eq!(
        v.verify(&t, Some("u"), NOW - 41).unwrap_err(),
        JwtRefusal::NotYetValid
    );
    assert!(!JwtRefusal::Expired.is_bad_credentials());
}

#[test]
fn rs256_with_a_pem_public_key() {
    let v = JwtVerifier::new(
        JwtSettings::default(),
        KeyMaterial::PublicKeyPem(RSA_PUBLIC),
    )
    .unwrap();
    let key = EncodingKey::from_rsa_pem(RSA_PRIVATE).unwrap();
    let t = token(Algorithm::RS256, &key, &claims("dev1", NOW + 60));
    assert!(v.verify(&t, Some("dev1"), NOW).is_ok());
    assert_eq!(
        v.verify(&t, Some("dev1"), NOW + 3600).unwrap_err(),
        JwtRefusal::Expired
    );
    // An HS256 token whose secret is the public key (the classic algorithm
    // confusion attack) is refused: HS256 is not an algorithm of this key.
    let confused = token(
        Algorithm::HS256,
        &EncodingKey::from_secret(RSA_PUBLIC),
        &claims("dev1", NOW + 60),
    );
    assert_eq!(
        v.verify(&confused, Some("dev1"), NOW).unwrap_err(),
        JwtRefusal::WrongAlgorithm
    );
}

fn ec_key() -> (Vec<u8>, EncodingKey, rcgen::KeyPair) {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let enc = EncodingKey::from_ec_pem(kp.serialize_pem().as_bytes()).unwrap();
    (kp.public_key_pem().into_bytes(), enc, kp)
}

#[test]
fn es256_with_a_pem_public_key_and_configured_algorithms() {
    let (public, enc, _) = ec_key();
    let v = JwtVerifier::new(
        JwtSettings {
            algorithms: vec![parse_algorithm("ES256").unwrap()],
            ..JwtSettings::default()
        },
        KeyMaterial::PublicKeyPem(&public),
    )
    .unwrap();
    let t = token(Algorithm::ES256, &enc, &claims("dev1", NOW + 60));
    assert!(v.verify(&t, Some("dev1"), NOW).is_ok());
    // Another EC key's token.
    let (_, other, _) = ec_key();
    let t = token(Algorithm::ES256, &other, &claims("dev1", NOW + 60));
    assert_eq!(
        v.verify(&t, Some("dev1"), NOW).unwrap_err(),
        JwtRefusal::BadSignature
    );
    assert_eq!(
        parse_algorithm("XS999").unwrap_err(),
        JwtError::UnknownAlgorithm("XS999".into())
    );
    // Algorithms no key can verify.
    let e = JwtVerifier::new(
        JwtSettings {
            algorithms: vec![Algorithm::RS256],
            ..JwtSettings::default()
        },
        KeyMaterial::PublicKeyPem(&public),
    )
    .unwrap_err();
    assert_eq!(e, JwtError::NoUsableKey);
}

fn b64url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[test]
fn jwks_selects_by_kid() {
    let (_, enc, kp) = ec_key();
    let raw = kp.public_key_raw(); // 0x04 || x || y
    let jwks = json!({"keys": [
        {"kty": "oct", "kid": "h1", "k": b64url(b"shared")},
        {"kty": "EC", "kid": "e1", "crv": "P-256", "x": b64url(&raw[1..33]), "y": b64url(&raw[33..65])},
    ]})
    .to_string();
    let v = JwtVerifier::new(JwtSettings::default(), KeyMaterial::Jwks(&jwks)).unwrap();
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some("e1".into());
    let t = encode(&h, &claims("dev1", NOW + 60), &enc).unwrap();
    assert!(v.verify(t.as_bytes(), Some("dev1"), NOW).is_ok());
    // Unknown kid: no key to verify with.
    h.kid = Some("e2".into());
    let t = encode(&h, &claims("dev1", NOW + 60), &enc).unwrap();
    assert_eq!(
        v.verify(t.as_bytes(), Some("dev1"), NOW).unwrap_err(),
        JwtRefusal::BadSignature
    );
    let mut h = Header::new(Algorithm::HS256);
    h.kid = Some("h1".into());
    let t = encode(
        &h,
        &claims("dev1", NOW + 60),
        &EncodingKey::from_secret(b"shared"),
    )
    .unwrap();
    assert!(v.verify(t.as_bytes(), Some("dev1"), NOW).is_ok());
    // Garbage JWKS is an error, not a panic.
    assert!(matches!(
        JwtVerifier::new(JwtSettings::default(), KeyMaterial::Jwks("{\"keys\": 3}")),
        Err(JwtError::BadKey(_))
    ));
}

#[test]
fn acl_claim_becomes_the_clients_acl() {
    let settings = JwtSettings {
        acl_claim: Some("acl".into()),
        ..JwtSettings::default()
    };
    let v = JwtVerifier::new(settings, KeyMaterial::Secret(b"k")).unwrap();
    let key = EncodingKey::from_secret(b"k");
    let t = token(
        Algorithm::HS256,
        &key,
        &json!({"sub": "dev1", "acl": {"pub": ["up/${username}/#"], "sub": ["down/${clientid}"], "all": ["shared/#"]}}),
    );
    let acl = v.verify(&t, Some("dev1"), NOW).unwrap().acl.unwrap();
    let u = Some("dev1");
    assert!(acl.check("c1", u, "up/dev1/x", Access::Write));
    assert!(!acl.check("c1", u, "up/dev2/x", Access::Write));
    assert!(!acl.check("c1", u, "up/dev1/x", Access::Read));
    assert!(acl.check("c1", u, "down/c1", Access::Read));
    assert!(!acl.check("c1", u, "down/c1", Access::Write));
    assert!(acl.check("c1", u, "shared/a", Access::Write));
    assert!(acl.check_subscribe("c1", u, "shared/#"));
    assert!(!acl.check_subscribe("c1", u, "other/#"));
    assert!(!acl.check("c1", u, "other", Access::Read));
    // Rule injection through a line break, bad filters, wrong shapes.
    for bad in [
        json!({"pub": ["a\ntopic readwrite #"]}),
        json!({"pub": ["a/#/b"]}),
        json!({"pub": "a"}),
        json!(["a"]),
        json!({"sub": ["%u"]}),
    ] {
        assert_eq!(
            acl_from_claim(&bad).unwrap_err(),
            JwtRefusal::BadAcl,
            "{bad}"
        );
    }
    let t = token(
        Algorithm::HS256,
        &key,
        &json!({"sub": "dev1", "acl": {"pub": [1]}}),
    );
    assert_eq!(
        v.verify(&t, Some("dev1"), NOW).unwrap_err(),
        JwtRefusal::BadAcl
    );
}

//! Arbitrary bytes as `auth_jwt` key material and tokens: a JWKS document
//! (before the first NUL) and a token (after it). Loading keys never
//! panics; with keys loaded, checking any token never panics and never
//! accepts one that is not shaped like a JWT; an ACL claim read from the
//! input as JSON never panics either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zerofan_auth::jwt::acl_from_claim;
use zerofan_auth::{JwtRefusal, JwtSettings, JwtVerifier, KeyMaterial};

fuzz_target!(|data: &[u8]| {
    let (keys, token) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(keys) {
        let _ = acl_from_claim(&v);
    }
    let settings = JwtSettings {
        acl_claim: Some("acl".into()),
        ..JwtSettings::default()
    };
    let text = String::from_utf8_lossy(keys);
    let verifiers = [
        JwtVerifier::new(settings.clone(), KeyMaterial::Jwks(&text)),
        JwtVerifier::new(settings.clone(), KeyMaterial::PublicKeyPem(keys)),
        JwtVerifier::new(settings, KeyMaterial::Secret(keys)),
    ];
    for v in verifiers.into_iter().flatten() {
        match v.verify(token, Some("u"), 1_800_000_000) {
            Ok(_) => assert_eq!(token.iter().filter(|&&b| b == b'.').count(), 2),
            Err(JwtRefusal::NotAToken) | Err(_) => {}
        }
    }
});

//! Replays the fuzz seed corpora (`fuzz/corpus/<target>/`) through the
//! parsers in every `cargo test`, so the seeds keep parsing the way they
//! did and any input added there after a fuzz crash stays a regression
//! test.

use std::path::Path;

use zerofan_auth::{parse_mosquitto_conf, Acl, PasswordFile};

fn corpus(target: &str) -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                String::from_utf8_lossy(&bytes).into_owned(),
            )
        })
        .collect()
}

#[test]
fn mosquitto_conf_seeds() {
    let seeds = corpus("mosquitto_conf");
    assert!(seeds.len() >= 3);
    for (name, text) in seeds {
        let main = text.split('\0').next().unwrap_or("");
        match parse_mosquitto_conf(main) {
            Ok((c, _)) => assert!(!c.effective_listeners().is_empty(), "{name}"),
            Err(e) => assert!(name.starts_with("bad-"), "{name}: {e}"),
        }
    }
}

#[test]
fn acl_seeds() {
    let seeds = corpus("acl");
    assert!(seeds.len() >= 2);
    for (name, text) in seeds {
        if let Ok(acl) = Acl::parse(&text) {
            let _ = acl.check_subscribe("c", Some("u"), "#");
        } else {
            assert!(name.starts_with("bad-"), "{name} should parse");
        }
    }
}

#[test]
fn passwd_seeds() {
    let seeds = corpus("passwd");
    assert!(seeds.len() >= 2);
    for (name, text) in seeds {
        match PasswordFile::parse(&text) {
            Ok(f) => {
                let again = PasswordFile::parse(&f.to_string()).unwrap();
                assert_eq!(f.len(), again.len(), "{name}");
            }
            Err(e) => assert!(name.starts_with("bad-"), "{name}: {e}"),
        }
    }
}

/// What the `jwt` fuzz target checks, on one input: keys before the first
/// NUL, a token after it.
fn jwt_input(data: &[u8]) -> usize {
    use zerofan_auth::jwt::acl_from_claim;
    use zerofan_auth::{JwtSettings, JwtVerifier, KeyMaterial};
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
    let mut loaded = 0;
    for v in verifiers.into_iter().flatten() {
        loaded += 1;
        if v.verify(token, Some("u"), 1_800_000_000).is_ok() {
            assert_eq!(token.iter().filter(|&&b| b == b'.').count(), 2);
        }
    }
    loaded
}

#[test]
fn jwt_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/jwt");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        // Every seed loads at least its secret (any non-empty bytes are
        // an HMAC secret); the JWKS and PEM seeds load more.
        assert!(jwt_input(&data) >= 1);
        n += 1;
    }
    assert!(n >= 4);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    #[test]
    fn jwt_inputs_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        jwt_input(&data);
    }

    #[test]
    fn jwt_shaped_garbage_never_panics(
        parts in proptest::collection::vec("[A-Za-z0-9_=-]{0,40}", 3..4),
    ) {
        let token = parts.join(".");
        let mut data = b"secret\0".to_vec();
        data.extend_from_slice(token.as_bytes());
        jwt_input(&data);
    }
}

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

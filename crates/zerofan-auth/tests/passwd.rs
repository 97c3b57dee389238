//! Password files against Debian's mosquitto tools: files written by
//! `mosquitto_passwd` verify here, and files written here are accepted by
//! the `mosquitto` broker and by `mosquitto_passwd`.

mod common;

use std::process::Command;

use common::{scratch_dir, tool, Mosquitto};
use zerofan_auth::passwd::{PasswordHash, DEFAULT_ITERATIONS};
use zerofan_auth::PasswordFile;

/// Written by Debian's mosquitto_passwd 2.0.11 (see the file's header).
const FIXTURE: &str = include_str!("fixtures/mosquitto_passwd_2.0.11.txt");

const USERS: &[(&str, &str)] = &[
    ("alice", "apass"),
    ("bob", "correct horse battery staple"),
    ("carol", "pässwörd✓"),
    ("legacy", "old-style"),
    ("empty", ""),
];

#[test]
fn committed_mosquitto_passwd_file_verifies() {
    let f = PasswordFile::parse(FIXTURE).expect("fixture parses");
    assert_eq!(f.len(), USERS.len());
    for (user, pass) in USERS {
        assert!(
            f.verify(user, pass.as_bytes()),
            "{user} with right password"
        );
        assert!(!f.verify(user, b"wrong"), "{user} with wrong password");
        assert!(
            !f.verify(user, format!("{pass} ").as_bytes()),
            "{user} + space"
        );
    }
    assert!(!f.verify("ALICE", b"apass"), "usernames are case-sensitive");
    assert!(!f.verify("mallory", b"apass"));
    assert!(matches!(f.get("legacy"), Some(PasswordHash::Sha512 { .. })));
    assert!(matches!(
        f.get("alice"),
        Some(PasswordHash::Pbkdf2Sha512 {
            iterations: 101,
            ..
        })
    ));
    // Writing back changes nothing, comments included.
    assert_eq!(f.to_string(), FIXTURE);
}

#[test]
fn file_written_now_by_mosquitto_passwd_verifies() {
    let Some(bin) = tool("mosquitto_passwd") else {
        eprintln!("mosquitto_passwd not installed; covered by the committed fixture only");
        return;
    };
    let dir = scratch_dir("pw");
    let path = dir.join("pw");
    let status = Command::new(&bin)
        .args(["-c", "-b"])
        .arg(&path)
        .args(["user", "pass"])
        .status()
        .expect("run mosquitto_passwd");
    assert!(status.success());
    let status = Command::new(&bin)
        .args(["-H", "sha512", "-b"])
        .arg(&path)
        .args(["old", "oldpass"])
        .status()
        .expect("run mosquitto_passwd");
    assert!(status.success());
    let text = std::fs::read_to_string(&path).unwrap();
    let f = PasswordFile::parse(&text).unwrap();
    assert!(f.verify("user", b"pass"));
    assert!(!f.verify("user", b"pass2"));
    assert!(f.verify("old", b"oldpass"));
    assert!(!f.verify("old", b"pass"));
}

#[test]
fn our_entries_round_trip() {
    let mut f = PasswordFile::parse(FIXTURE).unwrap();
    f.set("alice", b"new alice").unwrap();
    f.set("dave", b"dpass").unwrap();
    f.set_with_iterations("erin", b"epass", 5).unwrap();
    assert!(f.remove("bob"));
    assert!(!f.remove("bob"));
    let text = f.to_string();
    let g = PasswordFile::parse(&text).unwrap();
    assert_eq!(
        g.users().collect::<Vec<_>>(),
        ["alice", "carol", "legacy", "empty", "dave", "erin"]
    );
    assert!(g.verify("alice", b"new alice"));
    assert!(!g.verify("alice", b"apass"));
    assert!(g.verify("dave", b"dpass"));
    assert!(g.verify("erin", b"epass"));
    assert!(g.verify("carol", "pässwörd✓".as_bytes()));
    assert!(!g.verify("bob", b"correct horse battery staple"));
    match g.get("dave") {
        Some(PasswordHash::Pbkdf2Sha512 {
            iterations, salt, ..
        }) => {
            assert_eq!(*iterations, DEFAULT_ITERATIONS);
            assert_eq!(salt.len(), 12);
        }
        other => panic!("dave: {other:?}"),
    }
    // Two sets of the same password use different salts.
    let mut h = PasswordFile::new();
    h.set("x", b"same").unwrap();
    h.set("y", b"same").unwrap();
    assert_ne!(h.get("x"), h.get("y"));
    assert!(text.starts_with("# Written by Debian"), "comments kept");
}

#[test]
fn mosquitto_passwd_accepts_and_keeps_our_file() {
    let Some(bin) = tool("mosquitto_passwd") else {
        eprintln!("mosquitto_passwd not installed; skipped");
        return;
    };
    let dir = scratch_dir("pw-edit");
    let path = dir.join("pw");
    let mut f = PasswordFile::new();
    f.set("ours", b"our password").unwrap();
    std::fs::write(&path, f.to_string()).unwrap();
    // mosquitto_passwd adds a user to a file we wrote...
    let status = Command::new(&bin)
        .arg("-b")
        .arg(&path)
        .args(["theirs", "their password"])
        .status()
        .unwrap();
    assert!(status.success());
    // ...and we read the result, our entry intact.
    let g = PasswordFile::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(g.verify("ours", b"our password"));
    assert!(g.verify("theirs", b"their password"));
}

#[test]
fn mosquitto_broker_accepts_our_file() {
    if tool("mosquitto_pub").is_none() {
        eprintln!("mosquitto_pub not installed; skipped");
        return;
    }
    let dir = scratch_dir("broker-pw");
    let mut f = PasswordFile::new();
    f.set("zed", b"zed's password").unwrap();
    f.set_with_iterations("quick", b"q", 1).unwrap();
    f.set("uni", "ünï✓".as_bytes()).unwrap();
    let pw = dir.join("pw");
    std::fs::write(&pw, f.to_string()).unwrap();
    let Some(broker) = Mosquitto::start(
        &dir,
        &format!("allow_anonymous false\npassword_file {}\n", pw.display()),
    ) else {
        eprintln!("mosquitto not installed; skipped");
        return;
    };
    let ok = |u, p| broker.publish(Some((u, p)), "t");
    assert_eq!(ok("zed", "zed's password"), Ok(()), "{}", broker.log());
    assert_eq!(ok("quick", "q"), Ok(()));
    assert_eq!(ok("uni", "ünï✓"), Ok(()));
    assert!(ok("zed", "wrong").is_err());
    assert!(ok("nobody", "zed's password").is_err());
    assert!(broker.publish(None, "t").is_err(), "anonymous refused");
}

#[test]
fn vectors_from_an_independent_implementation() {
    // Made with Python's hashlib (pbkdf2_hmac('sha512', b'pw', 12 zero
    // bytes, 1, 64) and sha512(b'pw' + salt)), not with this crate.
    let text = "\
cheap:$7$1$AAAAAAAAAAAAAAAA$HnlqzP97t90vV0ZnOqQ9iQGnDanPA5+h4vch90DH/3sqhYCcAGsXuCilxAegMRgv4tnlmKp0A9rSUdz9orclwA==
old:$6$AAAAAAAAAAAAAAAA$hLHSHAxPIHLt12gSKRXtsNwbK/WGiwcbbMqHSWJCED1SPux6SEX7fY3DHcfc8q8xnyqlnaTD5392kLDs/fc6vg==
";
    let f = PasswordFile::parse(text).unwrap();
    assert!(f.verify("cheap", b"pw"));
    assert!(f.verify("old", b"pw"));
    assert!(!f.verify("cheap", b"pW"));
    assert!(!f.verify("old", b"pW"));
    // Unpadded base64 is read too; the file is written back padded.
    let unpadded = text.replace("==", "");
    let g = PasswordFile::parse(&unpadded).unwrap();
    assert!(g.verify("cheap", b"pw"));
    assert_eq!(g.to_string(), text);
}

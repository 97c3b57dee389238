//! The ACL matrix: users × topics × read/write × patterns × deny, checked
//! against expectations derived from mosquitto 2.0's
//! `mosquitto_acl_check_default`, and — where Debian's mosquitto is
//! installed — against the real broker's decisions for the same file.

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{scratch_dir, tool, Mosquitto};
use proptest::prelude::*;
use zerofan_auth::acl::{Access, Acl};
use zerofan_auth::topic::matches;
use zerofan_auth::PasswordFile;

const ACL: &str = "\
# Anonymous clients (no username): the block before any `user` line.
topic read public/#
topic read $SYS/broker/uptime
topic deny public/private

user alice
topic readwrite alice/#
topic deny alice/secret/#
topic write shared/+/in
topic read shared/#

user bob
topic read #
topic write bob/out

# A user line with no rules: carol gets the patterns only.
user carol

user dave
topic $SYS/#

user root
topic readwrite #
topic readwrite $SYS/#

# Patterns apply to every client, whichever block they follow.
pattern readwrite devices/%c/#
pattern read users/%u/inbox
pattern deny devices/%c/locked
pattern write %u/%c/log
";

use Access::{Read as R, Write as W};

/// (client id, username, topic, access, allowed)
const MATRIX: &[(&str, Option<&str>, &str, Access, bool)] = &[
    // ---- anonymous: its own block, then patterns without %u
    ("anon1", None, "public/news", R, true),
    ("anon1", None, "public/news", W, false),
    ("anon1", None, "public", R, true), // public/# matches the parent
    ("anon1", None, "public/private", R, false), // deny in its block
    ("anon1", None, "public/private/x", R, true), // deny is exact
    ("anon1", None, "$SYS/broker/uptime", R, true),
    ("anon1", None, "$SYS/broker/load", R, false),
    ("anon1", None, "devices/anon1/temp", R, true),
    ("anon1", None, "devices/anon1/temp", W, true),
    ("anon1", None, "devices/anon1", W, true),
    ("anon1", None, "devices/other/temp", R, false),
    ("anon1", None, "devices/anon1/locked", R, false), // pattern deny
    ("anon1", None, "devices/anon1/locked", W, false),
    ("anon1", None, "users/anon1/inbox", R, false), // %u needs a username
    ("anon1", None, "alice/x", R, false),
    // ---- alice: her block, then patterns
    ("a1", Some("alice"), "alice/x", R, true),
    ("a1", Some("alice"), "alice/x", W, true),
    ("a1", Some("alice"), "alice", W, true),
    ("a1", Some("alice"), "alice/secret/x", R, false),
    ("a1", Some("alice"), "alice/secret", W, false), // # covers the parent
    ("a1", Some("alice"), "alice/secretive", R, true),
    ("a1", Some("alice"), "shared/room/in", W, true),
    ("a1", Some("alice"), "shared/room/in", R, true),
    ("a1", Some("alice"), "shared/room/out", W, false),
    ("a1", Some("alice"), "shared/room/out", R, true),
    ("a1", Some("alice"), "public/news", R, false), // anonymous rules are not hers
    ("a1", Some("alice"), "devices/a1/x", W, true),
    ("a1", Some("alice"), "devices/a1/locked", W, false),
    ("a1", Some("alice"), "users/alice/inbox", R, true),
    ("a1", Some("alice"), "users/alice/inbox", W, false),
    ("a1", Some("alice"), "users/bob/inbox", R, false),
    ("a1", Some("alice"), "alice/a1/log", W, true),
    ("a2", Some("alice"), "alice/a1/log", W, true), // via alice/#
    ("a1", Some("alice"), "$SYS/broker/uptime", R, false),
    // ---- bob: read everything except $ topics
    ("b1", Some("bob"), "anything/at/all", R, true),
    ("b1", Some("bob"), "anything/at/all", W, false),
    ("b1", Some("bob"), "bob/out", W, true),
    ("b1", Some("bob"), "$SYS/broker/uptime", R, false), // # never matches $
    ("b1", Some("bob"), "public/private", R, true),      // anonymous deny is not his
    ("b1", Some("bob"), "devices/b1/locked", R, true),   // his own allow wins over a pattern deny
    ("b1", Some("bob"), "devices/b1/locked", W, false),  // no own allow: pattern deny
    ("b1", Some("bob"), "devices/b1/x", W, true),
    // ---- carol: `user carol` with no rules: patterns only
    ("c1", Some("carol"), "carol/x", R, false),
    ("c1", Some("carol"), "devices/c1/x", R, true),
    ("c1", Some("carol"), "users/carol/inbox", R, true),
    ("c1", Some("carol"), "public/news", R, false),
    // ---- dave: topic without access word = readwrite
    ("d1", Some("dave"), "$SYS/broker/load", R, true),
    ("d1", Some("dave"), "$SYS/broker/load", W, false), // clients never write $SYS...
    (
        "d1",
        Some("dave"),
        "$SYS/broker/connection/x/state",
        W,
        true,
    ), // ...but bridge status
    ("d1", Some("dave"), "$share/g/t", R, false),
    ("d1", Some("dave"), "broker/load", R, false),
    // ---- erin: no block at all
    ("e1", Some("erin"), "devices/e1/t", R, true),
    ("e1", Some("erin"), "erin/e1/log", W, true),
    ("e1", Some("erin"), "erin/e1/log", R, false),
    // ---- names with + or #: patterns refused, own block still applies
    ("bad+id", Some("alice"), "alice/x", R, true),
    ("bad+id", Some("alice"), "devices/bad+id/x", R, false),
    ("bad#", None, "public/news", R, true),
    ("bad#", None, "devices/bad#/x", R, false),
    ("e2", Some("ev+l"), "devices/e2/x", R, false),
    // ---- a client id with '/' spans levels (allowed, as in mosquitto 2.0)
    ("x/y", None, "devices/x/y/z", R, true),
    // ---- case matters
    ("a1", Some("Alice"), "alice/x", R, false),
];

#[test]
fn matrix() {
    let acl = Acl::parse(ACL).unwrap();
    let mut failures = Vec::new();
    for &(client, user, topic, access, want) in MATRIX {
        if acl.check(client, user, topic, access) != want {
            failures.push(format!("{client} {user:?} {topic} {access:?}: want {want}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// (client id, username, filter, granted)
const SUBSCRIBE: &[(&str, Option<&str>, &str, bool)] = &[
    ("anon1", None, "public/#", true),
    ("anon1", None, "#", true),
    ("anon1", None, "$SYS/#", true), // $SYS/broker/uptime is readable
    ("anon1", None, "$SYS/broker/load", false),
    ("anon1", None, "public/private", false), // covered by deny
    ("anon1", None, "public/+", true),
    ("anon1", None, "alice/#", false),
    ("anon1", None, "devices/anon1/#", true),
    ("anon1", None, "devices/anon1/locked", false),
    ("anon1", None, "users/+/inbox", false),
    ("a1", Some("alice"), "alice/#", true),
    ("a1", Some("alice"), "alice/secret/#", false),
    ("a1", Some("alice"), "alice/secret/+", false),
    ("a1", Some("alice"), "alice/+/x", true),
    ("a1", Some("alice"), "#", true),
    ("a1", Some("alice"), "+/+/in", true),
    ("a1", Some("alice"), "$SYS/#", false),
    ("a1", Some("alice"), "devices/a1/locked", false),
    ("a1", Some("alice"), "devices/a1/+", true),
    ("a1", Some("alice"), "users/alice/inbox", true),
    ("a1", Some("alice"), "bob/#", false),
    ("b1", Some("bob"), "devices/b1/locked", true),
    ("b1", Some("bob"), "$SYS/#", false),
    ("b1", Some("bob"), "#", true),
    ("c1", Some("carol"), "users/+/inbox", true),
    ("c1", Some("carol"), "users/dave/inbox", false),
    ("c1", Some("carol"), "#", true),
    ("e2", Some("ev+l"), "#", false),
];

#[test]
fn subscribe_matrix() {
    let acl = Acl::parse(ACL).unwrap();
    let mut failures = Vec::new();
    for &(client, user, filter, want) in SUBSCRIBE {
        if acl.check_subscribe(client, user, filter) != want {
            failures.push(format!("{client} {user:?} {filter}: want {want}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn no_rules_means_no_access() {
    let acl = Acl::parse("# nothing\n").unwrap();
    assert!(!acl.check("c", None, "a", R));
    assert!(!acl.check("c", Some("u"), "a", W));
    assert!(!acl.check_subscribe("c", None, "#"));
}

#[test]
fn deny_position_does_not_matter() {
    // A deny after the allow it overrides still wins (denies go first).
    let acl = Acl::parse("user u\ntopic read a/#\ntopic deny a/b\n").unwrap();
    assert!(!acl.check("c", Some("u"), "a/b", R));
    let acl = Acl::parse("user u\ntopic deny a/b\ntopic read a/#\n").unwrap();
    assert!(!acl.check("c", Some("u"), "a/b", R));
    // Blocks of the same user merge.
    let acl = Acl::parse("user u\ntopic read a/#\nuser v\ntopic read v\nuser u\ntopic deny a/b\n")
        .unwrap();
    assert!(!acl.check("c", Some("u"), "a/b", R));
    assert!(acl.check("c", Some("u"), "a/c", R));
}

#[test]
fn parsing_details() {
    // Blanks, tabs, CRLF, comments with leading blanks, spaces in topics.
    let acl = Acl::parse("  # c\r\nuser   alice  \r\ntopic\tread   a b/c  \r\n\r\n").unwrap();
    assert!(acl.check("c", Some("alice"), "a b/c", R));
    assert!(!acl.check("c", Some("alice"), "a b/c", W));
    let acl = Acl::parse("pattern read x/y\n").unwrap();
    assert_eq!(acl.warnings().len(), 1);
    assert_eq!(acl.warnings()[0].0, 1);
    let e = Acl::parse("user a\ntopic read x\ntopic write a/+b\n").unwrap_err();
    assert_eq!(e.line, 3);
    assert!(e.to_string().starts_with("line 3: "), "{e}");
}

fn level() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["a", "b", "$SYS", "c1", "alice", "secret", "in", "x"])
}

fn topic() -> impl Strategy<Value = String> {
    prop::collection::vec(level(), 1..4).prop_map(|v| v.join("/"))
}

fn filter() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(prop_oneof![level(), Just("+")], 0..4),
        any::<bool>(),
    )
        .prop_map(|(mut v, hash)| {
            if hash || v.is_empty() {
                v.push("#");
            }
            v.join("/")
        })
}

fn rule() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!["topic", "pattern"]),
        prop::sample::select(vec!["read", "write", "readwrite", "deny"]),
        filter(),
        prop::sample::select(vec!["", "/%c", "/%u"]),
    )
        .prop_map(|(k, a, f, p)| {
            let f = if k == "pattern" && !f.ends_with('#') {
                format!("{f}{p}")
            } else {
                f
            };
            format!("{k} {a} {f}")
        })
}

proptest! {
    /// SUBSCRIBE is never refused for a filter through which a readable
    /// topic would be delivered.
    #[test]
    fn subscribe_check_is_sound(
        anon in prop::collection::vec(rule(), 0..4),
        user in prop::collection::vec(rule(), 0..4),
        client in prop::sample::select(vec!["c1", "x"]),
        username in prop::sample::select(vec![None, Some("alice"), Some("secret")]),
        t in topic(),
        f in filter(),
    ) {
        let text = format!("{}\nuser alice\n{}\n", anon.join("\n"), user.join("\n"));
        let acl = Acl::parse(&text).unwrap();
        if acl.check(client, username, &t, Access::Read) && matches(&f, &t) {
            prop_assert!(acl.check_subscribe(client, username, &f), "{text}\n{t} {f}");
        }
    }
}

/// The same file in the real mosquitto: for every identity and topic of a
/// generated list, whether a PUBLISH gets through (write) and whether a
/// delivery reaches a `#` + `$SYS/#` subscriber (read) must agree with
/// `Acl::check`.
#[test]
fn agrees_with_mosquitto() {
    if tool("mosquitto_sub").is_none() || tool("mosquitto_pub").is_none() {
        eprintln!("mosquitto clients not installed; skipped");
        return;
    }
    let dir = scratch_dir("acl");
    let mut pw = PasswordFile::new();
    for u in ["alice", "bob", "carol", "dave", "erin", "root"] {
        pw.set_with_iterations(u, u.as_bytes(), 1).unwrap();
    }
    std::fs::write(dir.join("pw"), pw.to_string()).unwrap();
    std::fs::write(dir.join("acl"), ACL).unwrap();
    let Some(broker) = Mosquitto::start(
        &dir,
        &format!(
            "allow_anonymous true\nsys_interval 0\nlog_type error\nlog_type subscribe\npassword_file {}\nacl_file {}\n",
            dir.join("pw").display(),
            dir.join("acl").display()
        ),
    ) else {
        eprintln!("mosquitto not installed; skipped");
        return;
    };
    let acl = Acl::parse(ACL).unwrap();
    let users: [Option<&str>; 6] = [
        None,
        Some("alice"),
        Some("bob"),
        Some("carol"),
        Some("dave"),
        Some("erin"),
    ];
    let name = |u: Option<&str>| u.unwrap_or("anon").to_string();
    let mut topics: BTreeSet<String> = [
        "public/news",
        "public/private",
        "public/private/x",
        "$SYS/broker/uptime",
        "$SYS/broker/load",
        "alice/x",
        "alice/secret/x",
        "shared/room/in",
        "shared/room/out",
        "bob/out",
        "anything/else",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for u in users {
        let n = name(u);
        for cid in [format!("s-{n}"), format!("p-{n}")] {
            topics.insert(format!("devices/{cid}/t"));
            topics.insert(format!("devices/{cid}/locked"));
            topics.insert(format!("{n}/{cid}/log"));
        }
        topics.insert(format!("users/{n}/inbox"));
    }

    let port = broker.port.to_string();
    let sub = |cid: &str, user: Option<&str>| {
        let mut c = Command::new(tool("mosquitto_sub").unwrap());
        c.args(["-h", "127.0.0.1", "-p", &port, "-i", cid, "-v"]);
        c.args(["-t", "#", "-t", "$SYS/#"]);
        if let Some(u) = user {
            c.args(["-u", u, "-P", u]);
        }
        c.stdout(Stdio::piped()).stderr(Stdio::null());
        c.spawn().expect("spawn mosquitto_sub")
    };
    let mut root = sub("s-root", Some("root"));
    let mut subs: Vec<_> = users
        .iter()
        .map(|&u| (u, sub(&format!("s-{}", name(u)), u)))
        .collect();
    // Ready when the broker has logged all 7 `$SYS/#` subscriptions.
    let deadline = Instant::now() + Duration::from_secs(20);
    while broker
        .log()
        .lines()
        .filter(|l| l.ends_with(" $SYS/#"))
        .count()
        < 7
    {
        assert!(
            Instant::now() < deadline,
            "subscribers not ready:\n{}",
            broker.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Root's output is read as it comes, to see the end marker.
    let root_out = Arc::new(Mutex::new(String::new()));
    let reader = {
        let mut stdout = root.stdout.take().unwrap();
        let out = Arc::clone(&root_out);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                out.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };

    let publish = |cid: &str, user: Option<&str>, topic: &str, payload: &str| {
        let mut c = Command::new(tool("mosquitto_pub").unwrap());
        c.args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-i",
            cid,
            "-t",
            topic,
            "-m",
            payload,
        ]);
        if let Some(u) = user {
            c.args(["-u", u, "-P", u]);
        }
        assert!(c.status().unwrap().success(), "mosquitto_pub {cid} {topic}");
    };
    // Write: every identity publishes every topic; root sees what got in.
    for &u in &users {
        let n = name(u);
        for t in &topics {
            publish(&format!("p-{n}"), u, t, &format!("w:{n}"));
        }
    }
    // Read: root publishes every topic; each subscriber sees what it may.
    for t in &topics {
        publish("p-root", Some("root"), t, "r");
    }
    // The broker handles these in order: once root has its own last
    // message back, everything before it has been routed.
    publish("p-root", Some("root"), "zz/end", "end");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !root_out.lock().unwrap().lines().any(|l| l == "zz/end end") {
        assert!(Instant::now() < deadline, "end marker never arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));

    let output = |child: &mut std::process::Child| {
        let _ = child.kill();
        let mut s = String::new();
        child.stdout.take().unwrap().read_to_string(&mut s).unwrap();
        let _ = child.wait();
        s
    };
    let _ = root.kill();
    let _ = root.wait();
    reader.join().unwrap();
    let root_out = root_out.lock().unwrap().clone();
    let mut mismatches = Vec::new();
    for &u in &users {
        let n = name(u);
        let cid = format!("p-{n}");
        for t in &topics {
            let got = root_out.lines().any(|l| l == format!("{t} w:{n}"));
            let want = acl.check(&cid, u, t, Access::Write);
            if got != want {
                mismatches.push(format!(
                    "write {cid} {u:?} {t}: mosquitto {got}, ours {want}"
                ));
            }
        }
    }
    for (u, child) in &mut subs {
        let out = output(child);
        let cid = format!("s-{}", name(*u));
        for t in &topics {
            if !acl.check("p-root", Some("root"), t, Access::Write) {
                continue; // root cannot inject it ($SYS): nothing to compare
            }
            let got = out.lines().any(|l| l == format!("{t} r"));
            let want = acl.check(&cid, *u, t, Access::Read);
            if got != want {
                mismatches.push(format!(
                    "read {cid} {u:?} {t}: mosquitto {got}, ours {want}"
                ));
            }
        }
    }
    assert!(
        root_out.lines().count() > 10,
        "root saw too little; broker log:\n{}",
        broker.log()
    );
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}

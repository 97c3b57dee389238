//! Arbitrary bytes as an ACL file: parsing never panics; on an accepted
//! file, checks never panic, and the SUBSCRIBE check never refuses a
//! filter through which a readable topic would be delivered.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zerofan_auth::acl::{Access, Acl};
use zerofan_auth::topic::{matches, validate_filter};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let acl = match Acl::parse(&text) {
        Ok(acl) => acl,
        Err(e) => {
            assert!(e.line >= 1 && e.line <= text.split('\n').count());
            return;
        }
    };
    // Probe with words from the input itself, plus a few fixed ones.
    let mut words: Vec<&str> = text
        .split([' ', '\n', '\t'])
        .filter(|w| !w.is_empty())
        .take(8)
        .collect();
    words.extend(["a/b", "#", "$SYS/x", "+/b", "c1", "u1"]);
    let users: Vec<Option<&str>> = std::iter::once(None)
        .chain(words.iter().take(3).map(|w| Some(*w)))
        .collect();
    for &user in &users {
        for &client in words.iter().take(2) {
            for &topic in &words {
                let topic_ok = validate_filter(topic).is_ok() && !topic.contains(['+', '#']);
                let read = acl.check(client, user, topic, Access::Read);
                let _ = acl.check(client, user, topic, Access::Write);
                if !topic_ok {
                    continue;
                }
                for &filter in &words {
                    if validate_filter(filter).is_err() {
                        continue;
                    }
                    let sub = acl.check_subscribe(client, user, filter);
                    if read && matches(filter, topic) {
                        assert!(sub, "filter {filter:?} refused but topic {topic:?} readable (client {client:?}, user {user:?})");
                    }
                }
            }
        }
    }
});

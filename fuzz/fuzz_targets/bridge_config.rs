//! Arbitrary text as a mosquitto configuration with bridge sections
//! (`connection`, `address`, `topic`, ...) and as `[[bridge]]` TOML. Nothing
//! may panic; a bridge that is accepted maps every topic both ways.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use zerofan_broker::bridge::{map_topic, Way};
use zerofan_broker::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = zerofan_broker::mosquitto_conf::parse_bridges(text);
    let from_mosquitto = zerofan_broker::mosquitto_conf::from_mosquitto(text, Path::new("f.conf"))
        .map(|(c, _, _)| c);
    let from_toml = Config::from_toml(text, "f.toml");
    for c in [from_mosquitto, from_toml].into_iter().flatten() {
        for b in &c.bridge {
            assert!(b.check().is_ok(), "validate() let a bad bridge through");
            let _ = b.socket_addresses();
            for t in &b.topic {
                // A topic name built from the pattern maps out and back.
                let name: String = t.pattern.replace(['+', '#'], "x");
                let local = format!("{}{}", t.local_prefix, name);
                if let Some(remote) = map_topic(&b.topic, Way::Out, &local) {
                    let _ = map_topic(&b.topic, Way::In, &remote);
                }
            }
        }
    }
});

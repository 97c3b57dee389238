//! Arbitrary text as mosquitto bridge sections (`connection`, `address`,
//! `topic`, ...) and as `[[bridge]]` TOML. Nothing may panic; a bridge that
//! passes its checks maps topics both ways. (The mosquitto listener
//! directives, which resolve host names and read `include_dir`s, are left
//! to the unit tests.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use zerofan_broker::bridge::{map_topic, BridgeConfig, Way};
use zerofan_broker::config::Config;

fn exercise(b: &BridgeConfig) {
    let _ = b.socket_addresses();
    for t in &b.topic {
        // A topic name made from the pattern maps out, and back.
        let name: String = t.pattern.replace(['+', '#'], "x");
        let local = format!("{}{}", t.local_prefix, name);
        if let Some(remote) = map_topic(&b.topic, Way::Out, &local) {
            let _ = map_topic(&b.topic, Way::In, &remote);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok((bridges, _)) = zerofan_broker::mosquitto_conf::parse_bridges(text) {
        for b in bridges.iter().filter(|b| b.check().is_ok()) {
            exercise(b);
        }
    }
    if let Ok(c) = Config::from_toml(text, "f.toml") {
        for b in &c.bridge {
            assert!(b.check().is_ok(), "validate() let a bad bridge through");
            exercise(b);
        }
    }
});

//! Arbitrary text as a zerofan TOML configuration (and through the
//! TOML-or-mosquitto detection). Nothing may panic; a configuration that
//! parses resolves its listeners.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use zerofan_broker::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = zerofan_broker::mosquitto_conf::is_mosquitto(Path::new("fuzz.toml"), text);
    if let Ok(c) = Config::from_toml(text, "fuzz.toml") {
        for l in c.listeners() {
            let _ = l.effective_allow_anonymous(c.allow_anonymous);
            let _ = l.kind();
        }
    }
});

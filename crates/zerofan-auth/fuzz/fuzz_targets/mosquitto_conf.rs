//! Arbitrary bytes as a mosquitto.conf: parsing never panics, errors and
//! warnings point at real lines, and `effective_listeners` works on every
//! accepted configuration. A NUL byte splits the input into the main file
//! and the files of any `include_dir`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zerofan_auth::{parse_mosquitto_conf, parse_mosquitto_conf_with};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let main = parts.next().unwrap_or("");
    let included: Vec<(String, String)> = parts
        .enumerate()
        .map(|(i, t)| (format!("f{i}.conf"), t.to_string()))
        .collect();
    let main_lines = main.split('\n').count();

    match parse_mosquitto_conf(main) {
        Ok((config, warnings)) => {
            for w in &warnings {
                assert!(w.line >= 1 && w.line <= main_lines, "warning line {w}");
            }
            let listeners = config.effective_listeners();
            assert!(!listeners.is_empty());
        }
        Err(e) => assert!(e.line >= 1 && e.line <= main_lines, "error line {e}"),
    }

    let mut resolver = |_dir: &str| Ok(included.clone());
    if let Ok((config, _)) = parse_mosquitto_conf_with(main, &mut resolver) {
        let _ = config.effective_listeners();
    }
});

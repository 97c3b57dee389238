//! mosquitto.conf reading: every directive zerofan reads, the listener and
//! per-listener scoping rules, defaults, warnings and errors.

use zerofan_auth::conf::{include_order, parse_mosquitto_conf, parse_mosquitto_conf_with};
use zerofan_auth::{EffectiveListener, Protocol, WarningKind};

const FULL: &str = "\
# A typical mosquitto 2.0 configuration.
per_listener_settings true
max_packet_size 1048576
max_inflight_messages 20
max_queued_messages 1000
max_keepalive 120
persistence true
persistence_location /var/lib/mosquitto/

listener 1883 127.0.0.1
allow_anonymous true

listener 8883
certfile /etc/mosquitto/certs/server.pem
keyfile /etc/mosquitto/certs/server.key
cafile /etc/mosquitto/certs/ca.pem
require_certificate true
use_identity_as_username true
password_file /etc/mosquitto/passwd
acl_file /etc/mosquitto/acl file with spaces

listener 9001 0.0.0.0
protocol websockets
password_file /etc/mosquitto/passwd
log_dest topic
";

#[test]
fn pid_file_and_log_dest() {
    let text = "pid_file /run/mosquitto/mosquitto.pid\nlog_dest stderr\nlog_dest file /var/log/m q.log \nlog_dest syslog\n";
    let (c, w) = parse_mosquitto_conf(text).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.pid_file.as_deref(), Some("/run/mosquitto/mosquitto.pid"));
    assert_eq!(
        c.log_dest,
        vec!["stderr", "file /var/log/m q.log", "syslog"]
    );
    for bad in [
        "log_dest file\n",
        "log_dest stderr now\n",
        "log_dest mail\n",
    ] {
        let e = parse_mosquitto_conf(bad).unwrap_err().to_string();
        assert!(e.contains("line 1"), "{bad}: {e}");
    }
    let twice = "pid_file /a\npid_file /b\n";
    assert!(parse_mosquitto_conf(twice).is_err());
}

#[test]
fn full_configuration() {
    let (c, w) = parse_mosquitto_conf(FULL).unwrap();
    assert!(c.per_listener_settings);
    assert_eq!(c.max_packet_size, Some(1_048_576));
    assert_eq!(c.max_inflight_messages, Some(20));
    assert_eq!(c.max_queued_messages, Some(1000));
    assert_eq!(c.max_keepalive, Some(120));
    assert_eq!(c.persistence, Some(true));
    assert_eq!(
        c.persistence_location.as_deref(),
        Some("/var/lib/mosquitto/")
    );
    assert!(c.default_listener.is_none());
    assert_eq!(c.listeners.len(), 3);
    assert_eq!(c.listeners[1].declared_at, Some((None, 13)));
    // One warning: log_dest topic, a real mosquitto option zerofan ignores.
    assert!(c.log_dest.is_empty());
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!((w[0].line, w[0].kind), (25, WarningKind::Unsupported));
    assert_eq!(w[0].directive, "log_dest");
    assert!(w[0].to_string().starts_with("line 25: "), "{}", w[0]);

    let e = c.effective_listeners();
    assert_eq!(
        e[0],
        EffectiveListener {
            port: 1883,
            bind_address: Some("127.0.0.1".into()),
            protocol: Protocol::Mqtt,
            certfile: None,
            keyfile: None,
            cafile: None,
            require_certificate: false,
            use_identity_as_username: false,
            allow_anonymous: true,
            password_file: None,
            acl_file: None,
            local_only: false,
        }
    );
    assert_eq!(
        e[1],
        EffectiveListener {
            port: 8883,
            bind_address: None,
            protocol: Protocol::Mqtt,
            certfile: Some("/etc/mosquitto/certs/server.pem".into()),
            keyfile: Some("/etc/mosquitto/certs/server.key".into()),
            cafile: Some("/etc/mosquitto/certs/ca.pem".into()),
            require_certificate: true,
            use_identity_as_username: true,
            allow_anonymous: false, // not written: false once listeners exist
            password_file: Some("/etc/mosquitto/passwd".into()),
            acl_file: Some("/etc/mosquitto/acl file with spaces".into()),
            local_only: false,
        }
    );
    assert!(e[1].is_tls());
    assert_eq!(e[2].protocol, Protocol::WebSockets);
    assert_eq!(e[2].bind_address.as_deref(), Some("0.0.0.0"));
    assert!(!e[2].allow_anonymous);
    assert_eq!(
        e[2].acl_file, None,
        "per-listener: the ACL of 8883 is not 9001's"
    );
}

#[test]
fn global_security_without_per_listener_settings() {
    let text =
        "listener 1883\nlistener 1884\nallow_anonymous true\npassword_file /p\nacl_file /a\n";
    let (c, w) = parse_mosquitto_conf(text).unwrap();
    assert!(w.is_empty());
    let e = c.effective_listeners();
    assert_eq!(e.len(), 2);
    for l in &e {
        assert!(l.allow_anonymous);
        assert_eq!(l.password_file.as_deref(), Some("/p"));
        assert_eq!(l.acl_file.as_deref(), Some("/a"));
    }
}

#[test]
fn no_listener_means_local_only() {
    let (c, w) = parse_mosquitto_conf("# empty\n\n").unwrap();
    assert!(w.is_empty());
    let e = c.effective_listeners();
    let addrs: Vec<_> = e.iter().map(|l| l.bind_address.clone().unwrap()).collect();
    assert_eq!(addrs, ["127.0.0.1", "::1"]);
    assert!(e
        .iter()
        .all(|l| l.port == 1883 && l.local_only && l.allow_anonymous));
    // An explicit allow_anonymous false still holds in local-only mode.
    let (c, _) = parse_mosquitto_conf("allow_anonymous false\n").unwrap();
    assert!(c.effective_listeners().iter().all(|l| !l.allow_anonymous));
}

#[test]
fn port_and_bind_address_make_the_default_listener() {
    let text = "port 1999\nbind_address 10.0.0.1\ncertfile /c\nkeyfile /k\nlistener 2000\nprotocol websockets\n";
    let (c, _) = parse_mosquitto_conf(text).unwrap();
    let d = c.default_listener.as_ref().unwrap();
    assert_eq!(d.port, Some(1999));
    assert_eq!(d.bind_address.as_deref(), Some("10.0.0.1"));
    assert_eq!(d.certfile.as_deref(), Some("/c"));
    assert_eq!(d.protocol, Protocol::Mqtt, "protocol went to listener 2000");
    let e = c.effective_listeners();
    assert_eq!((e[0].port, e[1].port), (1999, 2000));
    assert_eq!(e[1].protocol, Protocol::WebSockets);
    assert!(!e[0].allow_anonymous);
    // Listener options alone also make a default listener on 1883.
    let (c, _) = parse_mosquitto_conf("protocol websockets\n").unwrap();
    let e = c.effective_listeners();
    assert_eq!(
        (e.len(), e[0].port, e[0].protocol),
        (1, 1883, Protocol::WebSockets)
    );
}

#[test]
fn per_listener_settings_scoping() {
    // Security before the first listener goes to the default listener.
    let text = "per_listener_settings true\nport 1883\npassword_file /d\nlistener 1884\nallow_anonymous true\n";
    let (c, w) = parse_mosquitto_conf(text).unwrap();
    assert!(w.is_empty(), "{w:?}");
    let e = c.effective_listeners();
    assert_eq!(e[0].password_file.as_deref(), Some("/d"));
    assert!(!e[0].allow_anonymous);
    assert_eq!(e[1].password_file, None);
    assert!(e[1].allow_anonymous);
    // ...and to no listener if there is no default listener: one warning.
    let (_, w) =
        parse_mosquitto_conf("per_listener_settings true\nacl_file /a\nlistener 1\n").unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].line, w[0].kind), (2, WarningKind::Ignored));
    // Too late: after a security option.
    let e = parse_mosquitto_conf("allow_anonymous true\nper_listener_settings true\n").unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.message.contains("line 1"), "{e}");
    // Setting it false late is harmless.
    assert!(parse_mosquitto_conf("allow_anonymous true\nper_listener_settings false\n").is_ok());
}

#[test]
fn unknown_directives_warn_once_each() {
    let text = "listener 1883\nfoo bar\nlog_type all\nlog_type debug\nbridge_cafile /x\nmax_keep_alive 3\n";
    let (c, w) = parse_mosquitto_conf(text).unwrap();
    assert_eq!(c.listeners.len(), 1);
    let got: Vec<_> = w
        .iter()
        .map(|w| (w.line, w.directive.as_str(), w.kind))
        .collect();
    assert_eq!(
        got,
        [
            (2, "foo", WarningKind::Unknown),
            (3, "log_type", WarningKind::Unsupported),
            (4, "log_type", WarningKind::Unsupported),
            (5, "bridge_cafile", WarningKind::Unsupported),
            (6, "max_keep_alive", WarningKind::Unknown),
        ]
    );
}

#[test]
fn errors_say_what_and_where() {
    let cases: &[(&str, usize, &str)] = &[
        ("listener\n", 1, "port"),
        ("\nlistener 70000\n", 2, "port"),
        ("listener x 1.2.3.4\n", 1, "port"),
        ("port -1\n", 1, "0 to 65535"),
        ("allow_anonymous yes\n", 1, "true or false"),
        ("max_keepalive 5\n", 1, "10 to 65535"),
        ("max_packet_size 19\n", 1, "20 to 268435455"),
        ("max_inflight_messages 65536\n", 1, "0 to 65535"),
        ("max_queued_messages -1\n", 1, "0 to"),
        ("persistence 1\n", 1, "true or false"),
        ("listener 1\nprotocol http\n", 2, "mqtt or websockets"),
        ("password_file /a\npassword_file /b\n", 2, "duplicate"),
        ("listener 1\ncertfile /a\ncertfile /b\n", 3, "duplicate"),
        ("acl_file\n", 1, "needs a value"),
        (
            "listener 1883\nlistener 1883\n",
            2,
            "already defined at line 1",
        ),
        ("persistence_location   \n", 1, "needs a value"),
    ];
    for (text, line, needle) in cases {
        let e = parse_mosquitto_conf(text).expect_err(text);
        assert_eq!(e.line, *line, "{text:?}: {e}");
        assert!(e.message.contains(needle), "{text:?}: {e}");
    }
}

#[test]
fn lexical_details() {
    // CRLF, tabs, leading blanks, comments anywhere, trailing text warned.
    let text = "  # comment\r\n\tlistener\t1883  127.0.0.1 \r\n   max_keepalive 60 # sixty\r\n";
    let (c, w) = parse_mosquitto_conf(text).unwrap();
    assert_eq!(c.listeners[0].bind_address.as_deref(), Some("127.0.0.1"));
    assert_eq!(c.max_keepalive, Some(60));
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].line, w[0].kind), (3, WarningKind::Ignored));
    // Same port on different addresses is fine, as is 1883 twice on port 0 sockets.
    assert!(parse_mosquitto_conf("listener 1883 127.0.0.1\nlistener 1883 ::1\n").is_ok());
    assert!(parse_mosquitto_conf("listener 0 /a.sock\nlistener 0 /b.sock\n").is_ok());
}

#[test]
fn include_dir() {
    let main = "listener 1883\ninclude_dir /etc/mosquitto/conf.d\n";
    // Without a resolver: recorded, warned, not followed.
    let (c, w) = parse_mosquitto_conf(main).unwrap();
    assert_eq!(c.include_dirs, ["/etc/mosquitto/conf.d"]);
    assert_eq!(
        (w.len(), w[0].line, w[0].kind),
        (1, 2, WarningKind::Ignored)
    );
    // With a resolver: files in mosquitto's order, continuing the main file.
    let mut asked = Vec::new();
    let mut resolve = |dir: &str| {
        asked.push(dir.to_string());
        Ok(vec![
            ("b.conf".to_string(), "listener 1884\n".to_string()),
            ("B.conf".to_string(), "allow_anonymous true\n".to_string()),
            (
                "a.conf".to_string(),
                "protocol websockets\nbogus 1\n".to_string(),
            ),
        ])
    };
    let (c, w) = parse_mosquitto_conf_with(main, &mut resolve).unwrap();
    assert_eq!(asked, ["/etc/mosquitto/conf.d"]);
    assert_eq!(c.listeners.len(), 2);
    assert_eq!(
        c.listeners[0].protocol,
        Protocol::WebSockets,
        "a.conf continues listener 1883"
    );
    assert_eq!(c.listeners[1].declared_at, Some((Some("b.conf".into()), 1)));
    assert_eq!(c.security.allow_anonymous, Some(true));
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].file.as_deref(), w[0].line), (Some("a.conf"), 2));
    assert_eq!(
        w[0].to_string(),
        "a.conf:2: unknown option \"bogus\"; ignored"
    );
    // Errors in included files name the file.
    let mut bad = |_: &str| {
        Ok(vec![(
            "x.conf".to_string(),
            "\nmax_keepalive 1\n".to_string(),
        )])
    };
    let e = parse_mosquitto_conf_with(main, &mut bad).unwrap_err();
    assert_eq!((e.file.as_deref(), e.line), (Some("x.conf"), 2));
    assert!(e.to_string().starts_with("x.conf:2: "), "{e}");
    // include_dir only in the main file; resolver failures are errors there.
    let mut nested = |_: &str| Ok(vec![("n.conf".to_string(), "include_dir /x\n".to_string())]);
    let e = parse_mosquitto_conf_with(main, &mut nested).unwrap_err();
    assert_eq!((e.file.as_deref(), e.line), (Some("n.conf"), 1));
    let mut failing = |_: &str| Err("permission denied".to_string());
    let e = parse_mosquitto_conf_with(main, &mut failing).unwrap_err();
    assert_eq!((e.file, e.line), (None, 2));
    assert!(e.message.contains("permission denied"));
    assert_eq!(include_order("A.conf", "a.conf"), std::cmp::Ordering::Less);
}

#[test]
fn debians_example_configuration_is_all_defaults() {
    let path = "/usr/share/doc/mosquitto/examples/mosquitto.conf";
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("{path} not installed; skipped");
        return;
    };
    let (c, w) = parse_mosquitto_conf(&text).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c, Default::default());
    // Uncommenting every `#name value` line that zerofan reads still parses.
    let mut seen = 0;
    let uncommented: String = text
        .lines()
        .filter_map(|l| {
            let d = l.strip_prefix('#')?;
            let name = d.split(' ').next()?;
            let ours = [
                "max_inflight_messages",
                "max_keepalive",
                // Not "max_packet_size": the example says 0, which
                // mosquitto 2.0.11 itself refuses ("Invalid
                // max_packet_size value (0)"), and so do we.
                "max_queued_messages",
                "persistence",
                "allow_anonymous",
                "per_listener_settings",
            ];
            (ours.contains(&name) && d.contains(' ')).then(|| {
                seen += 1;
                format!("{d}\n")
            })
        })
        .collect();
    assert!(seen >= 5, "{uncommented}");
    let (c, w) =
        parse_mosquitto_conf(&uncommented).unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.max_keepalive, Some(65535));
    assert!(parse_mosquitto_conf("max_packet_size 0\n").is_err());
}

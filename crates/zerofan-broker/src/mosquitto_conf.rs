//! `zerofan -c mosquitto.conf`: a mosquitto configuration, read by
//! [`zerofan_auth::parse_mosquitto_conf_with`], mapped onto [`Config`].
//!
//! A file is taken as mosquitto's when its name ends in `.conf`, or when it
//! does not parse as TOML but does as a mosquitto configuration.
//!
//! | mosquitto | zerofan |
//! | --- | --- |
//! | `listener PORT [ADDR]`, `port`, `bind_address` | a `[[listener]]` on ADDR:PORT (no address: `0.0.0.0`; a host name is resolved) |
//! | no listener at all | `127.0.0.1:1883` and `[::1]:1883` (when IPv6 loopback exists), anonymous allowed |
//! | `protocol websockets` | `protocol = "websockets"` (path `/mqtt`) |
//! | `certfile`, `keyfile`, `cafile`, `require_certificate`, `use_identity_as_username` | the listener's `tls` table |
//! | `allow_anonymous`, `password_file`, `acl_file`, `per_listener_settings` | each listener's `allow_anonymous`, `password_file`, `acl_file` as mosquitto 2.0 resolves them (anonymous refused by default once a listener is configured) |
//! | `max_packet_size` | `max_packet_size` |
//! | `max_inflight_messages` (0: no limit) | `max_inflight` (0 → 65535) |
//! | `max_queued_messages` (0: no limit) | `max_queued_messages` (0 → no limit; sessions without a connection: a connected client's queue is bounded by `max_online_queued_bytes`) |
//! | `max_keepalive` | `max_keepalive` |
//! | `persistence` (default false), `persistence_location` | `memory = !persistence`, `data_dir` (also in [`MosquittoExtras`]) |
//! | `pid_file` | `pid_file` |
//! | `log_dest` (repeatable; `topic` and `dlt` are warned and ignored) | `log_dest` |
//! | `include_dir` | followed: its `*.conf` files in mosquitto's order |
//! | `connection NAME` and the bridge directives after it | a [`BridgeConfig`] (`[[bridge]]`), see [`parse_bridges`] |
//!
//! Every directive zerofan does not read gets exactly one warning (on
//! stderr) with its line, and is otherwise ignored.

use crate::bridge::{BridgeConfig, BridgeProtocol, BridgeTopic, Direction};
use crate::config::{Config, ConfigError};
use crate::listen_config::{ListenerConfig, ListenerProtocol, TlsConfig};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

/// mosquitto settings with no [`Config`] key of their own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MosquittoExtras {
    /// `persistence`.
    pub persistence: Option<bool>,
    /// `persistence_location`.
    pub persistence_location: Option<PathBuf>,
}

/// Whether `path` / `text` is a mosquitto configuration rather than TOML.
pub fn is_mosquitto(path: &Path, text: &str) -> bool {
    if path.extension().is_some_and(|e| e == "conf") {
        return true;
    }
    if text.parse::<toml::Table>().is_ok() {
        return false;
    }
    // Not TOML: mosquitto if it reads as such and names at least one
    // directive mosquitto knows (not a TOML file with a typo).
    match zerofan_auth::parse_mosquitto_conf(text) {
        Ok((_, warnings)) => {
            let directives = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .count();
            let unknown = warnings
                .iter()
                .filter(|w| w.kind == zerofan_auth::WarningKind::Unknown)
                .count();
            directives > unknown
        }
        Err(_) => false,
    }
}

/// Parse a mosquitto configuration into a [`Config`], printing each warning
/// once on stderr.
pub fn load(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let (config, _extras, warnings) = from_mosquitto(text, path)?;
    for w in warnings {
        eprintln!("zerofan: warning: {w}");
    }
    Ok(config)
}

/// The mapping itself: the configuration, what has no key of its own, and
/// the warnings (`FILE:LINE: ...`).
pub fn from_mosquitto(
    text: &str,
    path: &Path,
) -> Result<(Config, MosquittoExtras, Vec<String>), ConfigError> {
    let shown = path.display().to_string();
    let parse_err = |message: String| ConfigError::Parse {
        path: shown.clone(),
        message,
    };
    // Every file read, for the bridge sections (mosquitto reads them with
    // the rest; the listener parser leaves them to us).
    let mut files: Vec<(String, String)> = Vec::new();
    let mut include = |dir: &str| -> Result<Vec<(String, String)>, String> {
        let rd = std::fs::read_dir(dir).map_err(|e| format!("cannot read {dir}: {e}"))?;
        let mut out = Vec::new();
        for entry in rd.flatten() {
            let p = entry.path();
            if p.extension().is_some_and(|e| e == "conf") {
                let t = std::fs::read_to_string(&p)
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
                out.push((p.display().to_string(), t));
            }
        }
        files.extend(out.iter().cloned());
        Ok(out)
    };
    let (m, warns) = zerofan_auth::parse_mosquitto_conf_with(text, &mut include)
        .map_err(|e| parse_err(e.to_string()))?;
    // mosquitto's include order: alphabetical, `A` before `a`.
    files.sort_by_cached_key(|(name, _)| {
        name.chars()
            .map(|c| (c.to_ascii_lowercase(), c.is_ascii_lowercase()))
            .collect::<Vec<_>>()
    });
    let mut bridges = Vec::new();
    let mut read: Vec<(Option<String>, usize)> = Vec::new();
    for (file, body) in std::iter::once((None, text)).chain(
        files
            .iter()
            .map(|(name, body)| (Some(name.as_str()), body.as_str())),
    ) {
        let (mut b, lines) = parse_bridges(body).map_err(|e| match file {
            Some(f) => parse_err(format!("{f}: {e}")),
            None => parse_err(e),
        })?;
        bridges.append(&mut b);
        read.extend(lines.into_iter().map(|n| (file.map(str::to_string), n)));
    }
    let mut warnings: Vec<String> = warns
        .iter()
        // Bridge directives read here are not "unsupported".
        .filter(|w| !read.contains(&(w.file.clone(), w.line)))
        .map(|w| match &w.file {
            Some(_) => w.to_string(),
            None => format!("{shown}:{}: {}", w.line, w.message),
        })
        .collect();

    let mut c = Config::default();
    for l in m.effective_listeners() {
        let addrs: Vec<SocketAddr> = match &l.bind_address {
            None => vec![SocketAddr::from(([0, 0, 0, 0], l.port))],
            Some(a) => {
                if l.port == 0 {
                    return Err(parse_err(format!(
                        "listener {a}: unix sockets (port 0) are not supported"
                    )));
                }
                match (a.as_str(), l.port).to_socket_addrs() {
                    Ok(mut it) => match it.next() {
                        Some(s) => vec![s],
                        None => return Err(parse_err(format!("cannot resolve {a}"))),
                    },
                    Err(e) => {
                        if l.local_only {
                            // [::1] on a host without IPv6: skip it.
                            warnings.push(format!("{shown}: default listener {a}: {e}"));
                            continue;
                        }
                        return Err(parse_err(format!("bind address {a}: {e}")));
                    }
                }
            }
        };
        let tls = match (&l.certfile, &l.keyfile) {
            (Some(cert), Some(key)) => Some(TlsConfig {
                cert: cert.into(),
                key: key.into(),
                ca: l.cafile.as_ref().map(PathBuf::from),
                require_certificate: l.require_certificate,
                use_identity_as_username: l.use_identity_as_username,
            }),
            (None, None) => None,
            _ => {
                return Err(parse_err(format!(
                    "listener on port {}: certfile and keyfile go together",
                    l.port
                )))
            }
        };
        for bind in addrs {
            if l.local_only && bind.is_ipv6() && !ipv6_loopback_available() {
                continue;
            }
            c.listener.push(ListenerConfig {
                bind,
                protocol: match l.protocol {
                    zerofan_auth::Protocol::Mqtt => ListenerProtocol::Mqtt,
                    zerofan_auth::Protocol::WebSockets => ListenerProtocol::Websockets,
                },
                tls: tls.clone(),
                allow_anonymous: Some(l.allow_anonymous),
                proxy_protocol: false,
                max_connections: 0,
                password_file: l.password_file.as_ref().map(PathBuf::from),
                acl_file: l.acl_file.as_ref().map(PathBuf::from),
            });
        }
    }
    if let Some(v) = m.max_packet_size {
        c.max_packet_size = v;
    }
    if let Some(v) = m.max_inflight_messages {
        c.max_inflight = if v == 0 { u16::MAX } else { v };
    }
    if let Some(v) = m.max_queued_messages {
        c.max_queued_messages = if v == 0 { usize::MAX } else { v as usize };
    }
    if let Some(v) = m.max_keepalive {
        c.max_keepalive = v;
    }
    c.pid_file = m.pid_file.as_ref().map(PathBuf::from);
    if !m.log_dest.is_empty() {
        c.log_dest = m.log_dest.clone();
    }
    let extras = MosquittoExtras {
        persistence: m.persistence,
        persistence_location: m.persistence_location.as_ref().map(PathBuf::from),
    };
    // mosquitto keeps nothing unless `persistence true`; its location is our
    // store's directory.
    match m.persistence {
        Some(true) => {
            c.memory = false;
            c.data_dir = extras.persistence_location.clone().or(c.data_dir);
        }
        _ => c.memory = true,
    }
    c.bridge = bridges;
    c.validate()?;
    Ok((c, extras, warnings))
}

/// The bridge sections of one file, as mosquitto reads them: `connection
/// NAME` starts a bridge and every bridge directive below it (in the same
/// file) applies to it; a bridge directive before any `connection` is an
/// error. Returns the bridges and the line numbers read, so that the
/// listener parser's "unsupported" warnings for them can be dropped.
/// Bridge directives zerofan does not implement (`round_robin`,
/// `start_type` other than `automatic`, `bridge_capath`, ...) keep their
/// warning.
///
/// | mosquitto | [`BridgeConfig`] |
/// | --- | --- |
/// | `connection NAME` | `name` |
/// | `address`/`addresses HOST[:PORT] ...` | `addresses` (failover, in order) |
/// | `topic PATTERN [in\|out\|both] [QOS] [LOCAL_PREFIX] [REMOTE_PREFIX]` (`""`: empty) | `topic` |
/// | `remote_clientid` (`clientid`), `remote_username` (`username`), `remote_password` (`password`), `local_clientid` | the same |
/// | `cleansession`, `keepalive_interval`, `try_private`, `notifications`, `notification_topic` | the same |
/// | `restart_timeout BASE [CAP]` | `restart_timeout`, `restart_timeout_max` (one value: both) |
/// | `bridge_protocol_version mqttv31\|mqttv311\|mqttv50` | `protocol_version` |
/// | `bridge_cafile`, `bridge_certfile`, `bridge_keyfile`, `bridge_insecure` | `cafile`, `certfile`, `keyfile`, `insecure` |
/// | `bridge_max_packet_size` | `max_packet_size` |
/// | `local_username`, `local_password` | read, not needed: the bridge's local side is inside the broker |
/// | `start_type automatic` | read (the only start type) |
pub fn parse_bridges(text: &str) -> Result<(Vec<BridgeConfig>, Vec<usize>), String> {
    let mut out: Vec<BridgeConfig> = Vec::new();
    let mut read = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, args) = match line.split_once(|c: char| c.is_ascii_whitespace()) {
            Some((a, b)) => (a, b.trim()),
            None => (line, ""),
        };
        let err = |m: String| format!("line {n}: {m}");
        let need = |v: &str| -> Result<String, String> {
            if v.is_empty() {
                Err(err(format!("'{name}' needs a value")))
            } else {
                Ok(v.to_string())
            }
        };
        if name == "connection" {
            let v = need(args)?;
            if out.iter().any(|b| b.name == v) {
                return Err(err(format!("duplicate bridge connection {v:?}")));
            }
            out.push(BridgeConfig::new(v));
            read.push(n);
            continue;
        }
        if !is_bridge_directive(name) {
            continue;
        }
        let Some(b) = out.last_mut() else {
            return Err(err(format!(
                "'{name}' outside a bridge (no 'connection' above it)"
            )));
        };
        let boolean = |v: &str| match v {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(err(format!("'{name}' must be true or false"))),
        };
        let number = |v: &str, max: u64| match v.parse::<u64>() {
            Ok(x) if x <= max => Ok(x),
            _ => Err(err(format!("'{name}' must be a whole number up to {max}"))),
        };
        match name {
            "address" | "addresses" => {
                let list: Vec<String> = args.split_ascii_whitespace().map(str::to_string).collect();
                if list.is_empty() {
                    return Err(err(format!("'{name}' needs a value")));
                }
                b.addresses.extend(list);
            }
            "topic" => b.topic.push(parse_topic(args).map_err(err)?),
            "remote_clientid" | "clientid" => b.remote_clientid = Some(need(args)?),
            "remote_username" | "username" => b.remote_username = Some(need(args)?),
            "remote_password" | "password" => b.remote_password = Some(need(args)?),
            "local_clientid" => b.local_clientid = Some(need(args)?),
            "cleansession" => b.cleansession = boolean(args)?,
            "keepalive_interval" => b.keepalive_interval = number(args, 65535)? as u16,
            "restart_timeout" => {
                let mut it = args.split_ascii_whitespace();
                let base = number(it.next().unwrap_or(""), u64::from(u32::MAX))? as u32;
                let cap = match it.next() {
                    Some(c) => number(c, u64::from(u32::MAX))? as u32,
                    None => base,
                };
                b.restart_timeout = base;
                b.restart_timeout_max = cap;
            }
            "bridge_protocol_version" => {
                b.protocol_version = match args {
                    "mqttv31" => BridgeProtocol::V31,
                    "mqttv311" => BridgeProtocol::V311,
                    "mqttv50" => BridgeProtocol::V5,
                    _ => {
                        return Err(err(
                            "'bridge_protocol_version' must be mqttv31, mqttv311 or mqttv50".into(),
                        ))
                    }
                }
            }
            "try_private" => b.try_private = boolean(args)?,
            "notifications" => b.notifications = boolean(args)?,
            "notification_topic" => b.notification_topic = Some(need(args)?),
            "bridge_cafile" => b.cafile = Some(need(args)?.into()),
            "bridge_certfile" => b.certfile = Some(need(args)?.into()),
            "bridge_keyfile" => b.keyfile = Some(need(args)?.into()),
            "bridge_insecure" => b.insecure = boolean(args)?,
            "bridge_max_packet_size" => b.max_packet_size = number(args, 268_435_455)? as u32,
            "local_username" | "local_password" => {}
            "start_type" if args == "automatic" => {}
            // Known to mosquitto, not implemented: keeps its warning.
            _ => continue,
        }
        read.push(n);
    }
    Ok((out, read))
}

/// Directives that belong to the bridge above them.
fn is_bridge_directive(name: &str) -> bool {
    matches!(
        name,
        "address"
            | "addresses"
            | "topic"
            | "remote_clientid"
            | "clientid"
            | "remote_username"
            | "username"
            | "remote_password"
            | "password"
            | "local_clientid"
            | "local_username"
            | "local_password"
            | "cleansession"
            | "keepalive_interval"
            | "restart_timeout"
            | "try_private"
            | "notifications"
            | "notification_topic"
            | "notifications_local_only"
            | "round_robin"
            | "start_type"
            | "idle_timeout"
            | "threshold"
    ) || name.starts_with("bridge_")
}

/// `PATTERN [in|out|both] [QOS] [LOCAL_PREFIX] [REMOTE_PREFIX]`; `""` is
/// the empty string (a pattern that is all prefix, or no prefix).
fn parse_topic(args: &str) -> Result<BridgeTopic, String> {
    let words: Vec<&str> = args
        .split_ascii_whitespace()
        .map(|w| if w == "\"\"" { "" } else { w })
        .collect();
    let Some(&pattern) = words.first() else {
        return Err("'topic' needs a pattern".into());
    };
    if words.len() > 5 {
        return Err("'topic' takes at most 5 values".into());
    }
    let direction = match words.get(1) {
        None | Some(&"out") => Direction::Out,
        Some(&"in") => Direction::In,
        Some(&"both") => Direction::Both,
        Some(d) => {
            return Err(format!(
                "topic direction must be in, out or both, not {d:?}"
            ))
        }
    };
    let qos = match words.get(2) {
        None => 0,
        Some(q) => match q.parse::<u8>() {
            Ok(q) if q <= 2 => q,
            _ => return Err(format!("topic QoS must be 0, 1 or 2, not {q:?}")),
        },
    };
    let local_prefix = words.get(3).copied().unwrap_or("").to_string();
    let remote_prefix = words.get(4).copied().unwrap_or("").to_string();
    if pattern.is_empty() && local_prefix.is_empty() && remote_prefix.is_empty() {
        return Err("an empty topic pattern needs a prefix".into());
    }
    Ok(BridgeTopic {
        pattern: pattern.to_string(),
        direction,
        qos,
        local_prefix,
        remote_prefix,
    })
}

fn ipv6_loopback_available() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL_WORLD: &str = "\
# Place your local configuration in /etc/mosquitto/conf.d/
pid_file /run/mosquitto/mosquitto.pid
persistence true
persistence_location /var/lib/mosquitto/
log_dest file /var/log/mosquitto/mosquitto.log
per_listener_settings false
allow_anonymous false
password_file /etc/mosquitto/passwd
acl_file /etc/mosquitto/acl
max_inflight_messages 0
max_queued_messages 500
max_keepalive 120
max_packet_size 1048576

listener 1883 127.0.0.1

listener 8883
certfile /etc/mosquitto/certs/server.crt
keyfile /etc/mosquitto/certs/server.key
cafile /etc/mosquitto/certs/ca.crt
require_certificate true
use_identity_as_username true

listener 9001 127.0.0.1
protocol websockets
bogus_directive 3
";

    #[test]
    fn real_world_file_maps() {
        let (c, extras, warnings) = from_mosquitto(REAL_WORLD, Path::new("m.conf")).unwrap();
        assert_eq!(c.listener.len(), 3);
        assert_eq!(c.listener[0].bind, "127.0.0.1:1883".parse().unwrap());
        assert_eq!(c.listener[0].allow_anonymous, Some(false));
        assert_eq!(
            c.listener[0].password_file.as_deref(),
            Some(Path::new("/etc/mosquitto/passwd"))
        );
        let tls = c.listener[1].tls.as_ref().unwrap();
        assert!(tls.require_certificate && tls.use_identity_as_username);
        assert_eq!(c.listener[1].bind, "0.0.0.0:8883".parse().unwrap());
        assert_eq!(c.listener[2].protocol, ListenerProtocol::Websockets);
        assert_eq!(c.max_inflight, u16::MAX);
        assert_eq!(c.max_queued_messages, 500);
        assert_eq!(c.max_keepalive, 120);
        assert_eq!(c.max_packet_size, 1_048_576);
        assert_eq!(extras.persistence, Some(true));
        assert!(!c.memory);
        assert_eq!(
            c.data_dir.as_deref(),
            Some(Path::new("/var/lib/mosquitto/"))
        );
        assert_eq!(
            c.pid_file.as_deref(),
            Some(Path::new("/run/mosquitto/mosquitto.pid"))
        );
        assert_eq!(c.log_dest, vec!["file /var/log/mosquitto/mosquitto.log"]);
        // bogus_directive: one warning, with its line.
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings.iter().any(|w| w.contains("m.conf:26")),
            "{warnings:?}"
        );
    }

    #[test]
    fn log_dest_repeats_and_defaults_to_stderr() {
        let (c, _, _) = from_mosquitto("listener 1883\n", Path::new("m.conf")).unwrap();
        assert_eq!(c.log_dest, vec!["stderr"]);
        assert_eq!(c.pid_file, None);
        let text = "log_dest syslog\nlog_dest file /var/log/a b.log\nlog_dest topic\n";
        let (c, _, warnings) = from_mosquitto(text, Path::new("m.conf")).unwrap();
        assert_eq!(c.log_dest, vec!["syslog", "file /var/log/a b.log"]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("m.conf:3"), "{warnings:?}");
        let e = from_mosquitto("log_dest carrier_pigeon\n", Path::new("m.conf"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1") && e.contains("log_dest"), "{e}");
    }

    #[test]
    fn bad_value_names_file_and_line() {
        let e = from_mosquitto("listener 1883\nmax_keepalive lots\n", Path::new("x.conf"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.conf") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn detection() {
        assert!(is_mosquitto(Path::new("a.conf"), "listen = []"));
        assert!(!is_mosquitto(Path::new("a.toml"), "listen = []\n"));
        assert!(is_mosquitto(
            Path::new("a"),
            "listener 1883\nallow_anonymous true\n"
        ));
        assert!(!is_mosquitto(Path::new("a"), "listen = [\n"));
    }

    const BRIDGE: &str = "\
listener 1883 127.0.0.1
allow_anonymous true

connection central
address 10.0.0.1:1884 10.0.0.2
topic sensors/# out 1 \"\" site1/
topic cmd/# in 2
topic \"\" both 0 local/all remote/all
remote_clientid edge-1
remote_username edge
remote_password secret
cleansession false
keepalive_interval 30
restart_timeout 2 60
bridge_protocol_version mqttv50
try_private false
notifications true
notification_topic edge/state
bridge_max_packet_size 65536
round_robin true
";

    #[test]
    fn bridge_section_maps() {
        let (c, _, warnings) = from_mosquitto(BRIDGE, Path::new("m.conf")).unwrap();
        assert_eq!(c.bridge.len(), 1);
        let b = &c.bridge[0];
        assert_eq!(b.name, "central");
        assert_eq!(b.socket_addresses(), vec!["10.0.0.1:1884", "10.0.0.2:1883"]);
        assert_eq!(b.topic.len(), 3);
        assert_eq!(b.topic[0].direction, Direction::Out);
        assert_eq!(b.topic[0].qos, 1);
        assert_eq!(b.topic[0].local_filter(), "sensors/#");
        assert_eq!(b.topic[0].remote_filter(), "site1/sensors/#");
        assert_eq!((b.topic[1].direction, b.topic[1].qos), (Direction::In, 2));
        assert_eq!(b.topic[2].pattern, "");
        assert_eq!(b.topic[2].local_filter(), "local/all");
        assert_eq!(b.topic[2].direction, Direction::Both);
        assert_eq!(b.remote_id(), "edge-1");
        assert_eq!(b.remote_username.as_deref(), Some("edge"));
        assert_eq!(b.remote_password.as_deref(), Some("secret"));
        assert_eq!(b.keepalive_interval, 30);
        assert_eq!((b.restart_timeout, b.restart_timeout_max), (2, 60));
        assert_eq!(b.protocol_version, BridgeProtocol::V5);
        assert!(!b.try_private && b.notifications && !b.cleansession);
        assert_eq!(b.state_topic(), "edge/state");
        assert_eq!(b.max_packet_size, 65536);
        // Only what is not implemented is warned about: round_robin.
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("m.conf:20"), "{warnings:?}");
    }

    #[test]
    fn bridge_errors_name_the_line() {
        for (text, want) in [
            ("topic a/# out\n", "line 1"),
            ("connection a\naddress h\ntopic a/# sideways\n", "line 3"),
            ("connection a\naddress h\ntopic a/# in 3\n", "line 3"),
            ("connection a\naddress h\ntopic \"\" in 0\n", "line 3"),
            ("connection a\nconnection a\n", "line 2"),
            (
                "connection a\naddress h\ntopic a in 0\ncleansession maybe\n",
                "line 4",
            ),
            (
                "connection a\naddress h\nbridge_protocol_version mqttv6\n",
                "line 3",
            ),
            ("connection a\naddress h\nrestart_timeout soon\n", "line 3"),
            // Complete sections are checked as `[[bridge]]` tables are.
            ("connection a\ntopic a/# in 0\n", "address"),
            ("connection a\naddress h\n", "topic"),
        ] {
            let e = from_mosquitto(text, Path::new("m.conf"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn bridge_in_an_included_file() {
        let dir = std::env::temp_dir().join(format!("zf-bridge-inc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("b.conf"),
            "connection up\naddress 127.0.0.1:1\ntopic # both 1\n",
        )
        .unwrap();
        let main = format!("listener 1883\ninclude_dir {}\n", dir.display());
        let (c, _, warnings) = from_mosquitto(&main, Path::new("m.conf")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(c.bridge.len(), 1);
        assert_eq!(c.bridge[0].topic[0].direction, Direction::Both);
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn no_listener_is_local_only() {
        let (c, _, _) = from_mosquitto("allow_anonymous true\n", Path::new("m.conf")).unwrap();
        assert!(c.listener.iter().all(|l| l.bind.ip().is_loopback()));
        assert!(c.listener.iter().all(|l| l.allow_anonymous == Some(true)));
        assert!(c.memory, "mosquitto persists nothing by default");
    }
}

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
//!
//! Every directive zerofan does not read gets exactly one warning (on
//! stderr) with its line, and is otherwise ignored.

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
        Ok(out)
    };
    let (m, warns) = zerofan_auth::parse_mosquitto_conf_with(text, &mut include)
        .map_err(|e| parse_err(e.to_string()))?;
    let mut warnings: Vec<String> = warns
        .iter()
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
    c.validate()?;
    Ok((c, extras, warnings))
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

    #[test]
    fn no_listener_is_local_only() {
        let (c, _, _) = from_mosquitto("allow_anonymous true\n", Path::new("m.conf")).unwrap();
        assert!(c.listener.iter().all(|l| l.bind.ip().is_loopback()));
        assert!(c.listener.iter().all(|l| l.allow_anonymous == Some(true)));
        assert!(c.memory, "mosquitto persists nothing by default");
    }
}

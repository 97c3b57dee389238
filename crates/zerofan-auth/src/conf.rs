//! Reading a mosquitto configuration file (`zerofan -c mosquitto.conf`).
//!
//! [`parse_mosquitto_conf`] turns the text into a neutral [`MosqConfig`]
//! (listeners with their options, plus global settings) that the broker maps
//! onto its own configuration, and a list of [`Warning`]s. It reads no
//! files: `include_dir` is followed only by [`parse_mosquitto_conf_with`],
//! whose caller supplies the directory's files.
//!
//! # Syntax (as mosquitto 2.0)
//!
//! One directive per line, `NAME VALUE...`, separated by blanks. A line
//! whose first non-blank character is `#` is a comment. Values are not
//! quoted: a path is the rest of the line with surrounding blanks removed
//! (it may contain spaces). Booleans are `true` or `false`.
//!
//! A directive zerofan does not read produces exactly one [`Warning`] with
//! its line number and is otherwise ignored: [`WarningKind::Unsupported`]
//! for a real mosquitto directive (`autosave_interval`, bridge
//! settings, ...), [`WarningKind::Unknown`] for anything else. (mosquitto
//! itself refuses unknown names; zerofan lets a configuration that works
//! there start here.) A bad *value* of a directive zerofan does read is an
//! error.
//!
//! # Directives read, and where the broker should put them
//!
//! | directive | scope | field | broker mapping |
//! | --- | --- | --- | --- |
//! | `listener PORT [ADDRESS]` | starts a listener | [`MosqConfig::listeners`] | one listen socket; no address: all interfaces (`0.0.0.0` and `::`) |
//! | `port PORT` | default listener | [`MosqConfig::default_listener`] | listen socket (deprecated in mosquitto) |
//! | `bind_address ADDRESS` | default listener | [`MosqConfig::default_listener`] | its address |
//! | `protocol mqtt\|websockets` | listener | [`Listener::protocol`] | TCP or WebSocket listener (path `/mqtt`) |
//! | `certfile`, `keyfile` | listener | [`Listener::certfile`], [`Listener::keyfile`] | TLS (rustls) with this PEM chain and key |
//! | `cafile` | listener | [`Listener::cafile`] | CA for client certificates |
//! | `require_certificate` | listener | [`Listener::require_certificate`] | mutual TLS |
//! | `use_identity_as_username` | listener | [`Listener::use_identity_as_username`] | certificate CN becomes the username; password file not consulted |
//! | `allow_anonymous` | global, or listener with `per_listener_settings` | [`Security::allow_anonymous`] | refuse CONNECT without username (0x87 / 0x05) |
//! | `password_file` | global, or listener | [`Security::password_file`] | [`crate::PasswordFile`] |
//! | `acl_file` | global, or listener | [`Security::acl_file`] | [`crate::Acl`] |
//! | `per_listener_settings` | global | [`MosqConfig::per_listener_settings`] | where the three above apply |
//! | `max_packet_size` | global | [`MosqConfig::max_packet_size`] | `Config::max_packet_size` |
//! | `max_inflight_messages` | global | [`MosqConfig::max_inflight_messages`] | `Config::max_inflight` (0 = no limit: 65535) |
//! | `max_queued_messages` | global | [`MosqConfig::max_queued_messages`] | `Config::max_queued_messages` (0 = no limit) |
//! | `max_keepalive` | global | [`MosqConfig::max_keepalive`] | `Config::max_keepalive` |
//! | `persistence` | global | [`MosqConfig::persistence`] | store on (true) or memory only |
//! | `persistence_location` | global | [`MosqConfig::persistence_location`] | the store's directory |
//! | `pid_file` | global | [`MosqConfig::pid_file`] | written once listening, removed on exit |
//! | `log_dest stderr\|stdout\|syslog\|none\|file PATH` (repeatable) | global | [`MosqConfig::log_dest`] | where log lines go (`topic`, `dlt`: warned, ignored) |
//! | `include_dir` | main file only | [`MosqConfig::include_dirs`] | see [`parse_mosquitto_conf_with`] |
//!
//! Listener options (`protocol`, `certfile`, ...) apply to the last
//! `listener` line above them; before any `listener` line they configure the
//! default listener, as do `port` and `bind_address`.
//!
//! Security options (`allow_anonymous`, `password_file`, `acl_file`) are
//! global unless `per_listener_settings true` came first; then each applies
//! to the listener it follows (before any `listener` line: the default
//! listener). Setting `per_listener_settings true` after a security option
//! is an error, as in mosquitto.
//!
//! [`MosqConfig::effective_listeners`] resolves all of this, mosquitto 2.0
//! defaults included, into one flat list.

use std::cmp::Ordering;
use std::fmt;

use crate::error::{numbered_lines, shown, split_word, ParseError};

/// The `protocol` of a listener.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// MQTT over TCP (or TLS).
    #[default]
    Mqtt,
    /// MQTT over WebSocket (or secure WebSocket).
    WebSockets,
}

/// Authentication and access settings, as written (unset stays `None`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Security {
    /// `allow_anonymous`.
    pub allow_anonymous: Option<bool>,
    /// `password_file`.
    pub password_file: Option<String>,
    /// `acl_file`.
    pub acl_file: Option<String>,
}

impl Security {
    /// Whether any of the three options is written.
    pub fn is_set(&self) -> bool {
        self.allow_anonymous.is_some() || self.password_file.is_some() || self.acl_file.is_some()
    }
}

/// One listener and the options that followed it, as written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listener {
    /// Where it was declared: `listener` line (file, line); `None` for the
    /// default listener.
    pub declared_at: Option<(Option<String>, usize)>,
    /// Port (`None` on the default listener when `port` was not given:
    /// mosquitto then uses 1883). Port 0 with a path as address is a Unix
    /// socket in mosquitto.
    pub port: Option<u16>,
    /// Address or host name to bind; `None` means every interface.
    pub bind_address: Option<String>,
    /// `protocol`.
    pub protocol: Protocol,
    /// `certfile`: PEM certificate chain; with `keyfile` it makes the
    /// listener TLS.
    pub certfile: Option<String>,
    /// `keyfile`: PEM private key.
    pub keyfile: Option<String>,
    /// `cafile`: PEM CA certificates to verify client certificates.
    pub cafile: Option<String>,
    /// `require_certificate`.
    pub require_certificate: Option<bool>,
    /// `use_identity_as_username`.
    pub use_identity_as_username: Option<bool>,
    /// Security options written after this listener; used only when
    /// [`MosqConfig::per_listener_settings`] is true.
    pub security: Security,
}

/// A mosquitto configuration, neutral: what the file says, unresolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MosqConfig {
    /// `per_listener_settings`.
    pub per_listener_settings: bool,
    /// The listener made by `port`, `bind_address` or listener options
    /// before the first `listener` line.
    pub default_listener: Option<Listener>,
    /// `listener` blocks, in file order.
    pub listeners: Vec<Listener>,
    /// Global security options (with `per_listener_settings`: those of the
    /// default listener).
    pub security: Security,
    /// `max_packet_size` (20..=268435455).
    pub max_packet_size: Option<u32>,
    /// `max_inflight_messages` (0 means no limit).
    pub max_inflight_messages: Option<u16>,
    /// `max_queued_messages` (0 means no limit).
    pub max_queued_messages: Option<u32>,
    /// `max_keepalive` (10..=65535).
    pub max_keepalive: Option<u16>,
    /// `persistence`.
    pub persistence: Option<bool>,
    /// `persistence_location`.
    pub persistence_location: Option<String>,
    /// `pid_file`.
    pub pid_file: Option<String>,
    /// `log_dest` lines in order, each as written (`stderr`, `stdout`,
    /// `syslog`, `none`, or `file PATH`); empty: none given.
    pub log_dest: Vec<String>,
    /// `include_dir` directories, in order.
    pub include_dirs: Vec<String>,
}

/// A listener with every default applied (see
/// [`MosqConfig::effective_listeners`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectiveListener {
    /// Port.
    pub port: u16,
    /// Address to bind; `None`: every interface.
    pub bind_address: Option<String>,
    /// TCP or WebSocket.
    pub protocol: Protocol,
    /// TLS certificate chain (TLS when this and `keyfile` are set).
    pub certfile: Option<String>,
    /// TLS key.
    pub keyfile: Option<String>,
    /// CA for client certificates.
    pub cafile: Option<String>,
    /// Client certificates required.
    pub require_certificate: bool,
    /// Certificate CN is the username.
    pub use_identity_as_username: bool,
    /// Clients without a username may connect.
    pub allow_anonymous: bool,
    /// Password file for this listener.
    pub password_file: Option<String>,
    /// ACL file for this listener.
    pub acl_file: Option<String>,
    /// True for mosquitto's fallback when no listener is configured: port
    /// 1883 on the loopback addresses only.
    pub local_only: bool,
}

impl EffectiveListener {
    /// Whether both a certificate and a key are configured.
    pub fn is_tls(&self) -> bool {
        self.certfile.is_some() && self.keyfile.is_some()
    }
}

impl MosqConfig {
    /// Listeners as mosquitto 2.0 would open them:
    ///
    /// - the default listener (if any) first, port 1883 unless `port` said
    ///   otherwise, then each `listener` in order;
    /// - with no listener at all: `127.0.0.1:1883` and `[::1]:1883`
    ///   (`local_only`), anonymous allowed unless `allow_anonymous false`;
    /// - otherwise `allow_anonymous` defaults to false;
    /// - security options from the listener's own block with
    ///   `per_listener_settings`, else the global ones.
    pub fn effective_listeners(&self) -> Vec<EffectiveListener> {
        let resolve = |l: &Listener, sec: &Security, local_only: bool| EffectiveListener {
            port: l.port.unwrap_or(1883),
            bind_address: l.bind_address.clone(),
            protocol: l.protocol,
            certfile: l.certfile.clone(),
            keyfile: l.keyfile.clone(),
            cafile: l.cafile.clone(),
            require_certificate: l.require_certificate.unwrap_or(false),
            use_identity_as_username: l.use_identity_as_username.unwrap_or(false),
            allow_anonymous: sec.allow_anonymous.unwrap_or(local_only),
            password_file: sec.password_file.clone(),
            acl_file: sec.acl_file.clone(),
            local_only,
        };
        if self.default_listener.is_none() && self.listeners.is_empty() {
            return ["127.0.0.1", "::1"]
                .iter()
                .map(|addr| {
                    let l = Listener {
                        bind_address: Some(addr.to_string()),
                        ..Listener::default()
                    };
                    resolve(&l, &self.security, true)
                })
                .collect();
        }
        let mut out = Vec::new();
        if let Some(d) = &self.default_listener {
            out.push(resolve(d, &self.security, false));
        }
        for l in &self.listeners {
            let sec = if self.per_listener_settings {
                &l.security
            } else {
                &self.security
            };
            out.push(resolve(l, sec, false));
        }
        out
    }
}

/// How serious a [`Warning`] is about being ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WarningKind {
    /// Not a mosquitto directive at all (a typo?).
    Unknown,
    /// A mosquitto directive zerofan does not implement.
    Unsupported,
    /// A directive zerofan read, with something about it ignored (text
    /// after the value, an `include_dir` not followed, options that apply
    /// to no listener).
    Ignored,
}

/// Something in the file that zerofan ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// File name, for lines from an included file.
    pub file: Option<String>,
    /// 1-based line number.
    pub line: usize,
    /// The directive name.
    pub directive: String,
    /// Which kind of warning.
    pub kind: WarningKind,
    /// For a person.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(file) => write!(f, "{file}:{}: {}", self.line, self.message),
            None => write!(f, "line {}: {}", self.line, self.message),
        }
    }
}

/// mosquitto directives zerofan does not implement (warned as
/// [`WarningKind::Unsupported`] rather than [`WarningKind::Unknown`]).
const MOSQUITTO_DIRECTIVES: &[&str] = &[
    "accept_protocol_versions",
    "address",
    "addresses",
    "allow_duplicate_messages",
    "allow_zero_length_clientid",
    "auth_opt_",
    "auth_plugin",
    "auth_plugin_deny_special_chars",
    "auto_id_prefix",
    "autosave_interval",
    "autosave_on_changes",
    "bind_interface",
    "bridge_",
    "capath",
    "check_retain_source",
    "ciphers",
    "ciphers_tls1.3",
    "cleansession",
    "clientid",
    "clientid_prefixes",
    "connection",
    "connection_messages",
    "crlfile",
    "dhparamfile",
    "disable_client_cert_date_checks",
    "enable_control_api",
    "global_plugin",
    "http_dir",
    "idle_timeout",
    "keepalive_interval",
    "listener_allow_anonymous",
    "listener_auto_id_prefix",
    "local_clientid",
    "local_password",
    "local_username",
    "log_facility",
    "log_timeout",
    "log_timestamp",
    "log_timestamp_format",
    "log_type",
    "max_connections",
    "max_inflight_bytes",
    "max_qos",
    "max_queued_bytes",
    "max_topic_alias",
    "memory_limit",
    "message_size_limit",
    "mount_point",
    "notification_topic",
    "notifications",
    "notifications_local_only",
    "password",
    "persistence_file",
    "persistent_client_expiration",
    "plugin",
    "plugin_load",
    "plugin_opt_",
    "plugin_use",
    "psk_file",
    "psk_hint",
    "queue_qos0_messages",
    "remote_clientid",
    "remote_password",
    "remote_username",
    "restart_timeout",
    "retain_available",
    "retain_expiry_interval",
    "retained_persistence",
    "round_robin",
    "set_tcp_nodelay",
    "socket_domain",
    "start_type",
    "sys_interval",
    "threshold",
    "tls_engine",
    "tls_engine_kpass_sha1",
    "tls_keyform",
    "tls_version",
    "topic",
    "try_private",
    "upgrade_outgoing_qos",
    "use_subject_as_username",
    "use_username_as_clientid",
    "user",
    "username",
    "websockets_headers_size",
    "websockets_log_level",
    "websockets_origin",
];

fn is_mosquitto_directive(name: &str) -> bool {
    MOSQUITTO_DIRECTIVES.iter().any(|d| {
        if let Some(prefix) = d.strip_suffix('_') {
            name.len() > d.len()
                && name.starts_with(prefix)
                && name.as_bytes()[prefix.len()] == b'_'
        } else {
            name == *d
        }
    })
}

/// The order mosquitto loads `include_dir` files in: case-sensitive
/// alphabetical, an upper-case letter before the lower case of the same
/// letter (`A.conf`, `a.conf`, `B.conf`, `b.conf`).
pub fn include_order(a: &str, b: &str) -> Ordering {
    let key = |c: char| (c.to_ascii_lowercase(), c.is_ascii_lowercase());
    a.chars().map(key).cmp(b.chars().map(key))
}

/// Parse a mosquitto configuration. `include_dir` lines are recorded in
/// [`MosqConfig::include_dirs`] and get a [`WarningKind::Ignored`] warning;
/// use [`parse_mosquitto_conf_with`] to follow them.
pub fn parse_mosquitto_conf(text: &str) -> Result<(MosqConfig, Vec<Warning>), ParseError> {
    let mut p = Parser::default();
    p.file(text, None, None)?;
    Ok(p.finish())
}

/// What [`parse_mosquitto_conf_with`] asks of its caller for an
/// `include_dir DIR` line: the `.conf` files of `DIR` as (name, contents),
/// or a message saying why they cannot be read. The files are parsed in
/// [`include_order`] of their names whatever order they come in.
pub type IncludeResolver<'a> = dyn FnMut(&str) -> Result<Vec<(String, String)>, String> + 'a;

/// Parse a mosquitto configuration, following `include_dir` through
/// `include`. As in mosquitto, included files continue the main file (a
/// listener opened there takes the options that follow, in the next file
/// too), and `include_dir` inside an included file is an error.
pub fn parse_mosquitto_conf_with(
    text: &str,
    include: &mut IncludeResolver<'_>,
) -> Result<(MosqConfig, Vec<Warning>), ParseError> {
    let mut p = Parser::default();
    p.file(text, None, Some(include))?;
    Ok(p.finish())
}

/// Which listener the listener options currently go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Current {
    Default,
    Listener(usize),
}

#[derive(Default)]
struct Parser {
    config: MosqConfig,
    warnings: Vec<Warning>,
    current: Option<Current>,
    /// Where the first security option was (for per_listener_settings).
    first_security: Option<usize>,
    /// Where per_listener security options before any listener were.
    orphan_security: Option<(Option<String>, usize)>,
    include_depth: usize,
}

struct Line<'a> {
    file: Option<&'a str>,
    n: usize,
    name: &'a str,
    args: &'a str,
}

impl Line<'_> {
    fn err(&self, message: impl Into<String>) -> ParseError {
        let e = ParseError::new(self.n, message);
        match self.file {
            Some(f) => e.in_file(f),
            None => e,
        }
    }

    /// The rest of the line as one value (paths may contain spaces).
    fn string(&self) -> Result<String, ParseError> {
        let v = self.args.trim();
        if v.is_empty() {
            return Err(self.err(format!("'{}' needs a value", self.name)));
        }
        Ok(v.to_string())
    }
}

impl Parser {
    fn warn(&mut self, line: &Line<'_>, kind: WarningKind, message: String) {
        self.warnings.push(Warning {
            file: line.file.map(str::to_string),
            line: line.n,
            directive: line.name.to_string(),
            kind,
            message,
        });
    }

    /// First word of the value; warns once about text after it.
    fn word<'a>(&mut self, line: &Line<'a>) -> Result<&'a str, ParseError> {
        let (w, rest) = split_word(line.args);
        if w.is_empty() {
            return Err(line.err(format!("'{}' needs a value", line.name)));
        }
        if !rest.is_empty() {
            self.warn(
                line,
                WarningKind::Ignored,
                format!(
                    "ignoring text after the value of '{}': {}",
                    line.name,
                    shown(rest)
                ),
            );
        }
        Ok(w)
    }

    fn bool(&mut self, line: &Line<'_>) -> Result<bool, ParseError> {
        match self.word(line)? {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(line.err(format!(
                "'{}' must be true or false, not {}",
                line.name,
                shown(other)
            ))),
        }
    }

    fn int(&mut self, line: &Line<'_>, min: u64, max: u64) -> Result<u64, ParseError> {
        let w = self.word(line)?;
        match w.parse::<u64>() {
            Ok(v) if (min..=max).contains(&v) => Ok(v),
            _ => Err(line.err(format!(
                "'{}' must be a whole number from {min} to {max}, not {}",
                line.name,
                shown(w)
            ))),
        }
    }

    fn listener_mut(&mut self) -> &mut Listener {
        match self.current {
            Some(Current::Listener(i)) => &mut self.config.listeners[i],
            _ => {
                self.current.get_or_insert(Current::Default);
                self.config
                    .default_listener
                    .get_or_insert_with(Listener::default)
            }
        }
    }

    fn default_listener_mut(&mut self) -> &mut Listener {
        self.config
            .default_listener
            .get_or_insert_with(Listener::default)
    }

    fn security_mut(&mut self, line: &Line<'_>) -> &mut Security {
        self.first_security.get_or_insert(line.n);
        if self.config.per_listener_settings {
            match self.current {
                Some(Current::Listener(i)) => return &mut self.config.listeners[i].security,
                _ => {
                    self.orphan_security
                        .get_or_insert((line.file.map(str::to_string), line.n));
                }
            }
        }
        &mut self.config.security
    }

    fn set_string(
        line: &Line<'_>,
        slot: &mut Option<String>,
        value: String,
    ) -> Result<(), ParseError> {
        if slot.is_some() {
            return Err(line.err(format!(
                "duplicate '{}' (it is already set for this scope)",
                line.name
            )));
        }
        *slot = Some(value);
        Ok(())
    }

    fn file(
        &mut self,
        text: &str,
        file: Option<&str>,
        mut include: Option<&mut IncludeResolver<'_>>,
    ) -> Result<(), ParseError> {
        for (n, raw) in numbered_lines(text) {
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let (name, args) = split_word(trimmed);
            let line = Line {
                file,
                n,
                name,
                args,
            };
            self.directive(&line, include.as_deref_mut())?;
        }
        Ok(())
    }

    fn directive(
        &mut self,
        line: &Line<'_>,
        include: Option<&mut IncludeResolver<'_>>,
    ) -> Result<(), ParseError> {
        match line.name {
            "listener" => {
                let (port_s, rest) = split_word(line.args);
                let port: u16 = port_s.parse().map_err(|_| {
                    line.err(format!(
                        "'listener' needs a port from 0 to 65535, not {}",
                        shown(port_s)
                    ))
                })?;
                let (bind, extra) = split_word(rest);
                if !extra.is_empty() {
                    self.warn(
                        line,
                        WarningKind::Ignored,
                        format!("ignoring text after the listener address: {}", shown(extra)),
                    );
                }
                let bind = (!bind.is_empty()).then(|| bind.to_string());
                if let Some(prev) = self
                    .config
                    .listeners
                    .iter()
                    .find(|l| l.port == Some(port) && l.bind_address == bind && port != 0)
                {
                    let at = prev
                        .declared_at
                        .as_ref()
                        .map(|(f, l)| match f {
                            Some(f) => format!("{f}:{l}"),
                            None => format!("line {l}"),
                        })
                        .unwrap_or_default();
                    return Err(line.err(format!(
                        "listener {port} {} is already defined at {at}",
                        bind.as_deref().unwrap_or("(all addresses)")
                    )));
                }
                self.config.listeners.push(Listener {
                    declared_at: Some((line.file.map(str::to_string), line.n)),
                    port: Some(port),
                    bind_address: bind,
                    ..Listener::default()
                });
                self.current = Some(Current::Listener(self.config.listeners.len() - 1));
            }
            "port" => {
                let port = self.int(line, 0, 65535)? as u16;
                self.default_listener_mut().port = Some(port);
            }
            "bind_address" => {
                let addr = self.word(line)?.to_string();
                let l = self.default_listener_mut();
                Self::set_string(line, &mut l.bind_address, addr)?;
            }
            "protocol" => {
                let protocol = match self.word(line)? {
                    "mqtt" => Protocol::Mqtt,
                    "websockets" => Protocol::WebSockets,
                    other => {
                        return Err(line.err(format!(
                            "'protocol' must be mqtt or websockets, not {}",
                            shown(other)
                        )))
                    }
                };
                self.listener_mut().protocol = protocol;
            }
            "certfile" | "keyfile" | "cafile" => {
                let v = line.string()?;
                let l = self.listener_mut();
                let slot = match line.name {
                    "certfile" => &mut l.certfile,
                    "keyfile" => &mut l.keyfile,
                    _ => &mut l.cafile,
                };
                Self::set_string(line, slot, v)?;
            }
            "require_certificate" => {
                let v = self.bool(line)?;
                self.listener_mut().require_certificate = Some(v);
            }
            "use_identity_as_username" => {
                let v = self.bool(line)?;
                self.listener_mut().use_identity_as_username = Some(v);
            }
            "allow_anonymous" => {
                let v = self.bool(line)?;
                self.security_mut(line).allow_anonymous = Some(v);
            }
            "password_file" | "acl_file" => {
                let v = line.string()?;
                let sec = self.security_mut(line);
                let slot = if line.name == "password_file" {
                    &mut sec.password_file
                } else {
                    &mut sec.acl_file
                };
                Self::set_string(line, slot, v)?;
            }
            "per_listener_settings" => {
                let v = self.bool(line)?;
                if v {
                    if let Some(first) = self.first_security {
                        return Err(line.err(format!(
                            "per_listener_settings must be set before any other security setting (one is on line {first})"
                        )));
                    }
                }
                self.config.per_listener_settings = v;
            }
            "max_packet_size" => {
                self.config.max_packet_size = Some(self.int(line, 20, 268_435_455)? as u32);
            }
            "max_inflight_messages" => {
                self.config.max_inflight_messages = Some(self.int(line, 0, 65535)? as u16);
            }
            "max_queued_messages" => {
                self.config.max_queued_messages = Some(self.int(line, 0, i32::MAX as u64)? as u32);
            }
            "max_keepalive" => {
                self.config.max_keepalive = Some(self.int(line, 10, 65535)? as u16);
            }
            "persistence" => {
                self.config.persistence = Some(self.bool(line)?);
            }
            "persistence_location" => {
                let v = line.string()?;
                Self::set_string(line, &mut self.config.persistence_location, v)?;
            }
            "pid_file" => {
                let v = line.string()?;
                Self::set_string(line, &mut self.config.pid_file, v)?;
            }
            "log_dest" => {
                let v = line.string()?;
                let (kind, rest) = split_word(&v);
                match (kind, rest.trim()) {
                    ("stderr" | "stdout" | "syslog" | "none", "") => {
                        self.config.log_dest.push(kind.to_string())
                    }
                    ("file", "") => return Err(line.err("log_dest file needs a path")),
                    ("file", path) => self.config.log_dest.push(format!("file {path}")),
                    ("topic" | "dlt", _) => self.warn(
                        line,
                        WarningKind::Unsupported,
                        format!("log_dest {kind} is not supported by zerofan; ignored"),
                    ),
                    _ => {
                        return Err(line.err(format!(
                            "log_dest {}: must be stderr, stdout, syslog, none, topic, dlt or file PATH",
                            shown(&v)
                        )))
                    }
                }
            }
            "include_dir" => {
                let dir = line.string()?;
                if self.include_depth > 0 {
                    return Err(
                        line.err("include_dir is only allowed in the main configuration file")
                    );
                }
                self.config.include_dirs.push(dir.clone());
                match include {
                    None => self.warn(
                        line,
                        WarningKind::Ignored,
                        format!("include_dir {} was not followed", shown(&dir)),
                    ),
                    Some(resolve) => {
                        let mut files = resolve(&dir).map_err(|e| {
                            line.err(format!("cannot read include_dir {}: {e}", shown(&dir)))
                        })?;
                        files.sort_by(|a, b| include_order(&a.0, &b.0));
                        self.include_depth += 1;
                        for (name, text) in &files {
                            self.file(text, Some(name), None)?;
                        }
                        self.include_depth -= 1;
                    }
                }
            }
            other => {
                let (kind, message) = if is_mosquitto_directive(other) {
                    (
                        WarningKind::Unsupported,
                        format!(
                            "mosquitto option {} is not supported by zerofan; ignored",
                            shown(other)
                        ),
                    )
                } else {
                    (
                        WarningKind::Unknown,
                        format!("unknown option {}; ignored", shown(other)),
                    )
                };
                self.warn(line, kind, message);
            }
        }
        Ok(())
    }

    fn finish(mut self) -> (MosqConfig, Vec<Warning>) {
        if self.config.per_listener_settings
            && self.config.default_listener.is_none()
            && !self.config.listeners.is_empty()
        {
            if let Some((file, n)) = self.orphan_security.take() {
                self.warnings.push(Warning {
                    file,
                    line: n,
                    directive: "per_listener_settings".into(),
                    kind: WarningKind::Ignored,
                    message: "with per_listener_settings true, security options before the first listener apply to no listener; ignored".into(),
                });
            }
        }
        (self.config, self.warnings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_order_is_mosquittos() {
        let mut v = vec!["b.conf", "B.conf", "a.conf", "A.conf", "ab.conf"];
        v.sort_by(|a, b| include_order(a, b));
        assert_eq!(v, ["A.conf", "a.conf", "ab.conf", "B.conf", "b.conf"]);
    }

    #[test]
    fn prefixed_directives_are_known() {
        assert!(is_mosquitto_directive("bridge_cafile"));
        assert!(is_mosquitto_directive("plugin_opt_foo"));
        assert!(is_mosquitto_directive("plugin"));
        assert!(!is_mosquitto_directive("bridge_"));
        assert!(!is_mosquitto_directive("max_keep_alive"));
    }
}

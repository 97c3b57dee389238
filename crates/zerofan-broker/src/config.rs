//! Broker settings: every limit the core enforces, loaded from a flat TOML
//! table whose keys are all optional.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::Path;

/// What a session queue does with a QoS 1/2 message when it is full.
/// (QoS 0 always drops the oldest QoS 0 message.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum QueueFull {
    /// Drop the oldest queued message to make room.
    DropOldest,
    /// Drop the new message.
    #[default]
    DropNew,
    /// Disconnect the slow consumer (DISCONNECT 0x97 under MQTT 5).
    Disconnect,
}

/// One `[[webhook]]` table: events POSTed as JSON arrays to `url`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// `http://HOST:PORT/PATH` to POST to.
    pub url: String,
    /// Event names to send (see `shell::webhook::EVENTS`); all when empty.
    #[serde(default)]
    pub events: Vec<String>,
    /// Topic filters `message.published` is limited to; all when empty.
    #[serde(default)]
    pub topics: Vec<String>,
    /// Send message payloads (base64) with message events.
    #[serde(default)]
    pub include_payload: bool,
    /// Extra request headers (e.g. `Authorization`).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Milliseconds one POST may take.
    #[serde(default = "default_webhook_timeout")]
    pub timeout_ms: u64,
    /// Events waiting to be sent; past it events are dropped (counted).
    #[serde(default = "default_webhook_queue")]
    pub queue_size: usize,
    /// Which event a full queue drops: `drop_new` (the default: what is
    /// queued goes out in order) or `drop_oldest` (the freshest are kept).
    /// `disconnect` is not an option here.
    #[serde(default)]
    pub queue_full: QueueFull,
    /// Most events in one POST.
    #[serde(default = "default_webhook_batch")]
    pub batch_size: usize,
}

fn default_webhook_timeout() -> u64 {
    5000
}
fn default_webhook_queue() -> usize {
    10_000
}
fn default_webhook_batch() -> usize {
    100
}

/// All broker settings. Field names are the TOML keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Addresses to listen on (plain TCP). With neither this nor any
    /// `[[listener]]` table: 127.0.0.1:1883.
    pub listen: Vec<SocketAddr>,
    /// Listeners with their own options (`[[listener]]` tables: TLS,
    /// WebSocket, PROXY protocol, limits), opened besides `listen`.
    pub listener: Vec<crate::listen_config::ListenerConfig>,
    /// mosquitto password file (`user:$7$...`); when set, a client with a
    /// username must give its password.
    pub password_file: Option<std::path::PathBuf>,
    /// mosquitto ACL file; when set, whatever no rule allows is denied.
    pub acl_file: Option<std::path::PathBuf>,
    /// Whether clients without a username may connect (a listener's own
    /// setting wins). Unset: only on listeners bound to a loopback address.
    pub allow_anonymous: Option<bool>,
    /// JSON Web Tokens in the password field, checked after the password
    /// file (`auth_jwt = { public_key_file = "...", ... }`).
    pub auth_jwt: Option<crate::ext_auth::JwtConfig>,
    /// The site's HTTP service decides logins, last in the chain
    /// (`auth_http = { url = "http://...", ... }`).
    pub auth_http: Option<crate::ext_auth::HttpAuthConfig>,
    /// Most simultaneous connections overall; 0: no limit.
    pub max_connections: usize,
    /// Longest topic name or filter, in bytes.
    pub max_topic_length: usize,
    /// PUBLISH packets per second one client may send (token bucket with a
    /// one-second burst); above it: DISCONNECT 0x96. 0: no limit.
    pub max_publish_rate: u32,
    /// PUBLISH payload bytes per second one client may send (token bucket
    /// with a one-second burst); above it: DISCONNECT 0x96. 0: no limit.
    pub max_publish_bytes_rate: u64,
    /// New connections per second from one address (IPv6: per /64); above
    /// it CONNECT is refused with 0x9F (3.1.1: 0x03). 0: no limit.
    pub max_connection_rate: u32,
    /// Largest keep alive (seconds) a client may use; an MQTT 5 client asking
    /// for more (or for 0 while this is below 65535) is told this value as
    /// Server Keep Alive.
    pub max_keepalive: u16,
    /// Largest packet (bytes, fixed header included) accepted from a client.
    pub max_packet_size: u32,
    /// Our Receive Maximum: QoS 2 publications a client may have unfinished
    /// towards us; exceeding it gets DISCONNECT 0x93.
    pub receive_maximum: u16,
    /// Cap on QoS 1/2 messages in flight towards one client (also capped by
    /// the client's own Receive Maximum).
    pub max_inflight: u16,
    /// Messages the queue of a session without a connection holds before
    /// it drops.
    pub max_queued_messages: usize,
    /// Payload bytes the queue of a session without a connection holds
    /// before it drops.
    pub max_queued_bytes: usize,
    /// Bytes (payload, topic and a queue slot per message) the queue of a
    /// connected client holds before it drops; retained messages replayed
    /// for a new subscription are not counted. Past half of it the
    /// publishers feeding that client are not read until it drains below a
    /// quarter of it (push-back).
    pub max_online_queued_bytes: usize,
    /// Milliseconds a connected client may stay over half of
    /// `max_online_queued_bytes` before it is dropped as a slow consumer:
    /// its publishers are read again, and with `queue_full = "disconnect"`
    /// it is disconnected, otherwise its queued QoS 0 messages are dropped
    /// and what goes over the half is dropped until it catches up.
    pub slow_consumer_timeout_ms: u64,
    /// What a full queue does with a QoS 1/2 message.
    pub queue_full: QueueFull,
    /// Cap on the Session Expiry Interval (seconds); 4294967295 means none.
    pub max_session_expiry: u32,
    /// Seconds between `$SYS/` refreshes; 0 turns `$SYS/` off.
    pub sys_interval: u64,
    /// Topic aliases we accept from a client (MQTT 5); 0 turns them off.
    pub topic_alias_maximum: u16,
    /// Whether retained messages are supported.
    pub retain_available: bool,
    /// Seconds a new connection has to send CONNECT.
    pub connect_timeout: u64,
    /// Most levels a topic name or filter may have.
    pub max_topic_levels: usize,
    /// Most bytes of free read buffers the buffer pool keeps for reuse;
    /// beyond it returned buffers are freed.
    pub pool_max_retained_bytes: usize,
    /// Microseconds the broker keeps polling its sockets after the last
    /// connection activity before it sleeps: the next packet of a
    /// conversation is then read without waking an idle CPU (half the
    /// ping-pong latency), at the cost of up to this much CPU time after
    /// each burst. 0 turns it off; nothing is spent while idle. With
    /// several shards it applies only while there are more cores than
    /// shards (a spinning shard would take a busy sibling's CPU). Read at
    /// start, not on reload.
    pub busy_poll_us: u64,
    /// Milliseconds without traffic after which a plain-TCP connection is
    /// parked: its socket moves to one poller shared by all parked
    /// connections and its task ends, so a quiet connection holds neither a
    /// task nor a registration of its own (see `shell/park.rs`). A
    /// connection quiet right after its CONNACK is parked at once. Its next
    /// byte, or anything the broker has for it, wakes it. 0 never parks.
    /// Read at start, not on reload.
    pub park_after_ms: u64,
    /// Subscriptions one session may hold; a SUBSCRIBE for a new filter
    /// beyond it is refused for that filter (SUBACK 0x97 Quota exceeded,
    /// 3.1.1: 0x80). 0: no limit.
    pub max_subscriptions_per_session: usize,
    /// Retained messages the broker keeps; a retained PUBLISH for a topic
    /// that has none is not kept beyond it (still delivered; MQTT 5 QoS 1/2:
    /// PUBACK / PUBREC 0x97). 0: no limit.
    pub max_retained_messages: usize,
    /// Bytes (topic and payload) of all retained messages; a retained
    /// PUBLISH that would go over it is not kept (the topic's earlier
    /// message stays), delivered, and answered as for
    /// `max_retained_messages`. 0: no limit.
    pub max_retained_bytes: usize,
    /// Connections the kernel queues per listener before the broker
    /// accepts them (the `listen()` backlog; the kernel caps it at
    /// `net.core.somaxconn`). Read at start.
    pub listen_backlog: u32,
    /// Shards: threads, each with its own event loop and its own instance
    /// of the core; a client's session lives on the shard its client id
    /// hashes to, and publishes cross between shards as shared buffers.
    /// 0 (the default) means one per available core, and one on a
    /// cluster node. 1 is the single-thread broker, with no cross-thread
    /// cost. Read at start.
    pub threads: usize,
    /// Address of the HTTP listener (`metrics` is an older name for it):
    /// `/metrics` (Prometheus), `/healthz`, `/readyz`, the `/api/v1/` API
    /// and the dashboard at `/`; none (the default) turns it off.
    #[serde(alias = "metrics")]
    pub http: Option<SocketAddr>,
    /// TLS for the HTTP listener, as for MQTT listeners (`cert`, `key`,
    /// and `ca` with `require_certificate` for client certificates).
    pub http_tls: Option<crate::listen_config::TlsConfig>,
    /// Bearer tokens for `/api/`, one a line (`#` starts a comment); read
    /// again on SIGHUP. Without it only anonymous access (below) works.
    pub http_tokens_file: Option<std::path::PathBuf>,
    /// Let `/api/` requests without a token in, only when the HTTP
    /// listener is bound to a loopback address.
    pub http_allow_anonymous: bool,
    /// `[[webhook]]` tables: where to POST which events.
    pub webhook: Vec<WebhookConfig>,
    /// Log line format: `text` (default) or `json`.
    pub log_format: crate::logging::LogFormat,
    /// Where log lines go, one or more of: `stderr`, `stdout`, `syslog`
    /// (the local syslog socket, /dev/log), `file PATH` (appended to, and
    /// reopened on SIGHUP for logrotate), `none`.
    pub log_dest: Vec<String>,
    /// File the `zerofan` binary writes its process id to once its
    /// listeners are bound; removed on a clean exit.
    pub pid_file: Option<std::path::PathBuf>,
    /// Directory of the embedded store. The `zerofan` binary uses
    /// `./zerofan-data` when neither this nor `--data-dir` is given; a
    /// library user without it runs in memory.
    pub data_dir: Option<std::path::PathBuf>,
    /// Keep everything in memory (`--memory`): nothing survives a restart.
    pub memory: bool,
    /// When an acknowledged QoS 1/2 message is on disk: `always` (group
    /// commit: one fsync per round, before the ack), `interval[:MS]`
    /// (written before the ack, fsync at most every MS ms, default 1000),
    /// or `never` (the OS decides).
    pub fsync: String,
    /// Bridges to other brokers (`[[bridge]]` tables; mosquitto's
    /// `connection` sections). Read at start, not on reload.
    pub bridge: Vec<crate::bridge::BridgeConfig>,
    /// `[cluster]`: run as a node of a cluster. Read at start.
    pub cluster: Option<crate::cluster::ClusterSettings>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: Vec::new(),
            listener: Vec::new(),
            password_file: None,
            acl_file: None,
            allow_anonymous: None,
            auth_jwt: None,
            auth_http: None,
            max_connections: 0,
            max_topic_length: 65535,
            max_publish_rate: 0,
            max_publish_bytes_rate: 0,
            max_connection_rate: 0,
            max_keepalive: 65535,
            max_packet_size: 268_435_455,
            receive_maximum: 65535,
            max_inflight: 65535,
            max_queued_messages: 1000,
            max_queued_bytes: 64 * 1024 * 1024,
            max_online_queued_bytes: 64 * 1024 * 1024,
            slow_consumer_timeout_ms: 5000,
            queue_full: QueueFull::DropNew,
            max_session_expiry: u32::MAX,
            sys_interval: 10,
            topic_alias_maximum: 65535,
            retain_available: true,
            connect_timeout: 10,
            max_topic_levels: 128,
            pool_max_retained_bytes: 4 * 1024 * 1024,
            busy_poll_us: 50,
            park_after_ms: 1000,
            max_subscriptions_per_session: 10_000,
            max_retained_messages: 10_000_000,
            max_retained_bytes: 2 << 30,
            listen_backlog: 1024,
            threads: 0,
            http: None,
            http_tls: None,
            http_tokens_file: None,
            http_allow_anonymous: false,
            webhook: Vec::new(),
            log_format: crate::logging::LogFormat::Text,
            log_dest: vec!["stderr".into()],
            pid_file: None,
            data_dir: None,
            memory: false,
            fsync: "always".into(),
            bridge: Vec::new(),
            cluster: None,
        }
    }
}

/// When a changed setting takes effect on SIGHUP (see [`RELOAD_CLASSES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reload {
    /// The reload puts the new value in force.
    Live,
    /// Read once at start: a reload keeps the value in force (so what the
    /// broker reports is what it does) and warns.
    RestartOnly,
    /// `[[listener]]` tables: their options are live, but a change of the
    /// sockets to open (address, protocol, TLS or not) keeps the tables in
    /// force until a restart, like [`Reload::RestartOnly`].
    Listeners,
}

/// Lists every [`Config`] field once with its [`Reload`] class, and derives
/// from that one list both [`RELOAD_CLASSES`] and [`Config::reconcile`].
macro_rules! reload_classes {
    ($($field:ident: $class:ident,)*) => {
        /// Every setting (TOML key) with when a change takes effect.
        pub const RELOAD_CLASSES: &[(&str, Reload)] =
            &[$((stringify!($field), Reload::$class)),*];

        impl Config {

            /// Compare `new` (a reloaded configuration) with `self` (the one
            /// in force) by [`RELOAD_CLASSES`]: restart-only settings that
            /// differ get their value in force back in `new`.
            pub fn reconcile(&self, new: &mut Config) -> Reconciled {
                // Every field by name and no `..`: a field added to Config
                // without a line in the table does not compile.
                let Config { $($field: _),* } = self;
                let sockets = |c: &Config| -> Vec<String> {
                    c.listener
                        .iter()
                        .map(|l| format!("{} {}", l.bind, l.kind()))
                        .collect()
                };
                let new_sockets = sockets(self) != sockets(new);
                let mut out = Reconciled::default();
                $(
                    let (was, is) = (format!("{:?}", self.$field), format!("{:?}", new.$field));
                    if was != is {
                        let keep = match Reload::$class {
                            Reload::Live => false,
                            Reload::RestartOnly => true,
                            Reload::Listeners => new_sockets,
                        };
                        if keep {
                            out.needs_restart.push(stringify!($field));
                            out.kept.push(format!(
                                "{} = {was} (configured: {is})",
                                stringify!($field)
                            ));
                            new.$field = self.$field.clone();
                        } else {
                            out.changed.push(stringify!($field));
                        }
                    }
                )*
                out
            }
        }
    };
}

reload_classes! {
    listen: RestartOnly,
    listener: Listeners,
    password_file: Live,
    acl_file: Live,
    allow_anonymous: Live,
    auth_jwt: Live,
    auth_http: Live,
    max_connections: Live,
    max_topic_length: Live,
    max_publish_rate: Live,
    max_publish_bytes_rate: Live,
    max_connection_rate: Live,
    max_keepalive: Live,
    max_packet_size: Live,
    receive_maximum: Live,
    max_inflight: Live,
    max_queued_messages: Live,
    max_queued_bytes: Live,
    max_online_queued_bytes: Live,
    slow_consumer_timeout_ms: Live,
    queue_full: Live,
    max_session_expiry: Live,
    sys_interval: Live,
    topic_alias_maximum: Live,
    retain_available: Live,
    connect_timeout: Live,
    max_topic_levels: Live,
    pool_max_retained_bytes: RestartOnly,
    busy_poll_us: RestartOnly,
    park_after_ms: RestartOnly,
    max_subscriptions_per_session: Live,
    max_retained_messages: Live,
    max_retained_bytes: Live,
    listen_backlog: RestartOnly,
    threads: RestartOnly,
    http: RestartOnly,
    http_tls: RestartOnly,
    http_tokens_file: Live,
    http_allow_anonymous: Live,
    webhook: RestartOnly,
    log_format: RestartOnly,
    log_dest: RestartOnly,
    pid_file: RestartOnly,
    data_dir: RestartOnly,
    memory: RestartOnly,
    fsync: RestartOnly,
    bridge: RestartOnly,
    cluster: RestartOnly,
}

/// What [`Config::reconcile`] found, in [`RELOAD_CLASSES`] order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Settings whose new value goes in force.
    pub changed: Vec<&'static str>,
    /// Settings that differ but keep their value until a restart.
    pub needs_restart: Vec<&'static str>,
    /// For each of those: `name = value in force (configured: new value)`.
    pub kept: Vec<String>,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown / mistyped keys.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What the TOML parser said.
        message: String,
    },
    /// A `[[bridge]]` (or mosquitto `connection`) is incomplete or wrong.
    #[error("invalid {0}")]
    Bridge(String),
    /// A value is out of range.
    #[error("invalid setting {key}: {why}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// Why.
        why: &'static str,
    },
}

impl Config {
    /// How many shards to run: `threads`, or for 0 one per available core
    /// (one on a cluster node, which does not run shards yet).
    pub fn shard_count(&self) -> usize {
        match self.threads {
            0 if self.cluster.is_some() => 1,
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
    /// Every listener to open: `listen` addresses as plain TCP listeners,
    /// then the `[[listener]]` tables; 127.0.0.1:1883 when there is none.
    pub fn listeners(&self) -> Vec<crate::listen_config::ListenerConfig> {
        use crate::listen_config::ListenerConfig;
        let mut out: Vec<ListenerConfig> = self
            .listen
            .iter()
            .map(|a| ListenerConfig::tcp(*a))
            .collect();
        out.extend(self.listener.iter().cloned());
        if out.is_empty() {
            out.push(ListenerConfig::tcp(SocketAddr::from((
                [127, 0, 0, 1],
                1883,
            ))));
        }
        out
    }

    /// Parse a TOML document.
    pub fn from_toml(text: &str, path: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_string(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Read and parse a configuration file: TOML, or a mosquitto
    /// configuration (name ending in `.conf`, or text that is not TOML but
    /// reads as mosquitto's; see [`crate::mosquitto_conf`]).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: shown.clone(),
            source,
        })?;
        if crate::mosquitto_conf::is_mosquitto(path, &text) {
            return crate::mosquitto_conf::load(&text, path);
        }
        Config::from_toml(&text, &shown)
    }

    /// Check ranges the type system does not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key, why| Err(ConfigError::Invalid { key, why });
        if self.max_packet_size == 0 || self.max_packet_size > 268_435_455 {
            return bad("max_packet_size", "must be 1..=268435455");
        }
        // A connection keeps its listener's index in 16 bits, and the
        // shell's parking marks a connection that never parks with the
        // last value.
        if self.listen.len() + self.listener.len() >= usize::from(u16::MAX) {
            return bad("listener", "at most 65534 listeners");
        }
        if self.receive_maximum == 0 {
            return bad("receive_maximum", "must be at least 1");
        }
        if self.max_inflight == 0 {
            return bad("max_inflight", "must be at least 1");
        }
        if self.max_queued_messages == 0 {
            return bad("max_queued_messages", "must be at least 1");
        }
        if self.max_online_queued_bytes < 1024 {
            return bad("max_online_queued_bytes", "must be at least 1024");
        }
        if self.slow_consumer_timeout_ms == 0 {
            return bad("slow_consumer_timeout_ms", "must be at least 1");
        }
        if self.connect_timeout == 0 {
            return bad("connect_timeout", "must be at least 1 second");
        }
        if self.max_topic_levels == 0 {
            return bad("max_topic_levels", "must be at least 1");
        }
        if self.max_topic_length == 0 || self.max_topic_length > 65535 {
            return bad("max_topic_length", "must be 1..=65535");
        }
        if self.fsync.parse::<zerofan_store::FsyncPolicy>().is_err() {
            return bad(
                "fsync",
                "must be \"always\", \"never\", \"interval\" or \"interval:MS\"",
            );
        }
        if self.log_dest.is_empty() {
            return bad("log_dest", "needs a destination (\"none\" for no log)");
        }
        if self
            .log_dest
            .iter()
            .any(|d| d.parse::<crate::logging::LogDest>().is_err())
        {
            return bad(
                "log_dest",
                "each must be \"stderr\", \"stdout\", \"syslog\", \"none\" or \"file PATH\"",
            );
        }
        if self.http_allow_anonymous && self.http.is_some_and(|a| !a.ip().is_loopback()) {
            return bad(
                "http_allow_anonymous",
                "only on a loopback http address (127.0.0.1, ::1)",
            );
        }
        if let Some(tls) = &self.http_tls {
            if tls.require_certificate && tls.ca.is_none() {
                return bad("http_tls.require_certificate", "needs http_tls.ca");
            }
        }
        for w in &self.webhook {
            if !w.url.starts_with("http://") {
                return bad("webhook.url", "must start with http://");
            }
            if w.events
                .iter()
                .any(|e| crate::core::events::EventKind::from_name(e).is_none())
            {
                return bad("webhook.events", "unknown event name (see the README)");
            }
            if w.queue_full == QueueFull::Disconnect {
                return bad(
                    "webhook.queue_full",
                    "must be \"drop_new\" or \"drop_oldest\"",
                );
            }
            if w.queue_size == 0 || w.batch_size == 0 || w.timeout_ms == 0 {
                return bad(
                    "webhook",
                    "queue_size, batch_size and timeout_ms must be at least 1",
                );
            }
        }
        if let Some(c) = &self.cluster {
            c.check()?;
        }
        if let Some(Err(why)) = self.auth_jwt.as_ref().map(|j| j.validate()) {
            return bad("auth_jwt", why);
        }
        if let Some(Err(why)) = self.auth_http.as_ref().map(|h| h.validate()) {
            return bad("auth_http", why);
        }
        let mut names = std::collections::HashSet::new();
        for b in &self.bridge {
            b.check().map_err(ConfigError::Bridge)?;
            if !names.insert(b.name.as_str()) {
                return Err(ConfigError::Bridge(format!(
                    "bridge {:?}: two bridges with one name",
                    b.name
                )));
            }
        }
        for l in &self.listener {
            if let Some(tls) = &l.tls {
                if tls.require_certificate && tls.ca.is_none() {
                    return bad("listener.tls.require_certificate", "needs tls.ca");
                }
                if tls.use_identity_as_username && !tls.require_certificate {
                    return bad(
                        "listener.tls.use_identity_as_username",
                        "needs tls.require_certificate = true",
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        let c = Config::from_toml("", "x").unwrap();
        assert_eq!(c.max_queued_messages, 1000);
        assert_eq!(c.queue_full, QueueFull::DropNew);
    }

    #[test]
    fn more_listeners_than_a_connection_can_name_are_refused() {
        let addr: SocketAddr = "127.0.0.1:1883".parse().unwrap();
        let mut c = Config {
            listen: vec![addr; 65_534],
            ..Config::default()
        };
        assert!(c.validate().is_ok());
        c.listen.push(addr);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("listener") && err.contains("65534"), "{err}");
    }

    #[test]
    fn threads_default_to_one_shard_per_core_and_to_one_on_a_cluster_node() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let c = Config::from_toml("", "x").unwrap();
        assert_eq!(c.shard_count(), cores);
        assert_eq!(Config::default().shard_count(), cores);
        let c = Config::from_toml("threads = 3", "x").unwrap();
        assert_eq!(c.shard_count(), 3);
        let c = Config::from_toml("threads = 1", "x").unwrap();
        assert_eq!(c.shard_count(), 1, "one thread stays one");
        // A cluster node runs one shard unless told otherwise (and then
        // the server refuses more than one with a clear error).
        let mut c = Config {
            cluster: Some(crate::cluster::ClusterSettings::empty()),
            ..Config::default()
        };
        assert_eq!(c.shard_count(), 1);
        c.threads = 4;
        assert_eq!(c.shard_count(), 4);
    }

    #[test]
    fn bridge_tables_parse_and_are_checked() {
        let text = r##"
[[bridge]]
name = "central"
addresses = ["10.0.0.1:1883", "10.0.0.2"]
remote_clientid = "edge-1"
protocol_version = "mqttv50"
topic = [
  { pattern = "sensors/#", direction = "out", qos = 1, remote_prefix = "site1/" },
  { pattern = "cmd/#", direction = "in", qos = 2 },
]
"##;
        let c = Config::from_toml(text, "x").unwrap();
        let b = &c.bridge[0];
        assert_eq!(b.name, "central");
        assert_eq!(b.socket_addresses(), vec!["10.0.0.1:1883", "10.0.0.2:1883"]);
        assert_eq!(b.protocol_version, crate::bridge::BridgeProtocol::V5);
        assert_eq!(b.topic[0].remote_filter(), "site1/sensors/#");
        assert_eq!(b.topic[1].direction, crate::bridge::Direction::In);
        assert_eq!(b.topic[1].qos, 2);
        assert_eq!(b.local_id(), "local.edge-1");
        // Checked: no address; an unknown key; the same name twice.
        let e = Config::from_toml(
            "[[bridge]]\nname = \"a\"\naddresses = []\ntopic = [{ pattern = \"#\" }]\n",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("address"), "{e}");
        assert!(Config::from_toml("[[bridge]]\nname = \"a\"\nadresses = []\n", "x").is_err());
        let twice = format!("{text}\n{}", &text[text.find("[[bridge]]").unwrap()..]);
        let e = Config::from_toml(&twice, "x").unwrap_err().to_string();
        assert!(e.contains("one name"), "{e}");
    }

    #[test]
    fn keys_parse() {
        let c = Config::from_toml(
            "listen = [\"127.0.0.1:0\"]\nsys_interval = 1\nqueue_full = \"drop_oldest\"\n",
            "x",
        )
        .unwrap();
        assert_eq!(c.sys_interval, 1);
        assert_eq!(c.queue_full, QueueFull::DropOldest);
        assert_eq!(c.listen[0].port(), 0);
    }

    #[test]
    fn unknown_key_is_an_error() {
        let e = Config::from_toml("max_keep_alive = 3\n", "x").unwrap_err();
        assert!(e.to_string().contains("max_keep_alive"), "{e}");
    }

    /// Each field of `Config` as `{:#?}` prints it (top-level names only).
    fn field_names() -> Vec<String> {
        format!("{:#?}", Config::default())
            .lines()
            .filter_map(|l| l.strip_prefix("    "))
            .filter(|l| !l.starts_with(' '))
            .filter_map(|l| l.split_once(':').map(|(name, _)| name.to_string()))
            .collect()
    }

    #[test]
    fn every_setting_has_one_reload_class() {
        let fields = field_names();
        assert!(fields.len() > 20, "{fields:?}");
        let table: Vec<String> = RELOAD_CLASSES.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(
            table, fields,
            "RELOAD_CLASSES must list every field once, in order"
        );
    }

    #[test]
    fn reconcile_keeps_restart_only_values() {
        let old = Config::default();
        let mut new = Config {
            busy_poll_us: 0,
            park_after_ms: 7,
            max_queued_messages: 5,
            ..Config::default()
        };
        let r = old.reconcile(&mut new);
        assert_eq!(r.changed, vec!["max_queued_messages"]);
        assert_eq!(r.needs_restart, vec!["busy_poll_us", "park_after_ms"]);
        assert_eq!(
            r.kept,
            vec![
                "busy_poll_us = 50 (configured: 0)",
                "park_after_ms = 1000 (configured: 7)"
            ]
        );
        assert_eq!((new.busy_poll_us, new.park_after_ms), (50, 1000));
        assert_eq!(new.max_queued_messages, 5);
    }

    #[test]
    fn out_of_range_is_an_error() {
        assert!(Config::from_toml("receive_maximum = 0\n", "x").is_err());
        assert!(Config::from_toml("log_dest = []\n", "x").is_err());
        assert!(Config::from_toml("log_dest = [\"file\"]\n", "x").is_err());
        assert!(Config::from_toml("log_dest = [\"mail\"]\n", "x").is_err());
        let c = Config::from_toml("log_dest = [\"syslog\", \"file /a b\"]\n", "x").unwrap();
        assert_eq!(c.log_dest.len(), 2);
    }
}

#[cfg(test)]
mod example {
    use super::*;

    /// The shipped example documents every key with its default value.
    #[test]
    fn example_file_is_the_defaults() {
        let text = include_str!("../zerofan.example.toml");
        let c = Config::from_toml(text, "zerofan.example.toml").unwrap();
        let d = Config::default();
        assert_eq!(format!("{c:?}"), format!("{d:?}"));
    }
}

//! A bridge's settings: `[[bridge]]` tables in TOML, or mosquitto's bridge
//! directives (`connection`, `address`, `topic`, ...; see
//! [`crate::mosquitto_conf`]), which map one to one onto these fields.

use serde::Deserialize;
use std::path::PathBuf;

/// Which way a `topic` line carries messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Local to remote (mosquitto's default).
    #[default]
    Out,
    /// Remote to local.
    In,
    /// Both ways.
    Both,
}

impl Direction {
    /// Local messages go out.
    pub fn out(self) -> bool {
        matches!(self, Direction::Out | Direction::Both)
    }

    /// Remote messages come in.
    pub fn inward(self) -> bool {
        matches!(self, Direction::In | Direction::Both)
    }
}

/// `bridge_protocol_version`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum BridgeProtocol {
    /// MQTT 3.1 (`MQIsdp`).
    #[serde(rename = "mqttv31")]
    V31,
    /// MQTT 3.1.1 (mosquitto's default).
    #[default]
    #[serde(rename = "mqttv311")]
    V311,
    /// MQTT 5.
    #[serde(rename = "mqttv50")]
    V5,
}

/// One `topic PATTERN [in|out|both] [QOS] [LOCAL_PREFIX] [REMOTE_PREFIX]`.
/// The local topic is `local_prefix + pattern`, the remote one
/// `remote_prefix + pattern`; crossing the bridge swaps the prefixes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeTopic {
    /// Topic filter (may be empty when a prefix is the whole topic).
    pub pattern: String,
    /// Which way.
    #[serde(default)]
    pub direction: Direction,
    /// Highest QoS the bridge subscribes with (0..=2).
    #[serde(default)]
    pub qos: u8,
    /// Prefix on the local broker.
    #[serde(default)]
    pub local_prefix: String,
    /// Prefix on the remote broker.
    #[serde(default)]
    pub remote_prefix: String,
}

impl BridgeTopic {
    /// The filter subscribed to on the local broker.
    pub fn local_filter(&self) -> String {
        format!("{}{}", self.local_prefix, self.pattern)
    }

    /// The filter subscribed to on the remote broker.
    pub fn remote_filter(&self) -> String {
        format!("{}{}", self.remote_prefix, self.pattern)
    }
}

/// One bridge to a remote broker (`[[bridge]]`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeConfig {
    /// `connection NAME`: names the bridge in logs and figures.
    pub name: String,
    /// `address HOST[:PORT] ...`: tried in order, the next one after a
    /// failure (port 1883, or 8883 with TLS, when left out).
    pub addresses: Vec<String>,
    /// `topic` lines.
    #[serde(default)]
    pub topic: Vec<BridgeTopic>,
    /// Client identifier on the remote broker (default `HOSTNAME.NAME`).
    #[serde(default)]
    pub remote_clientid: Option<String>,
    /// Username on the remote broker.
    #[serde(default)]
    pub remote_username: Option<String>,
    /// Password on the remote broker.
    #[serde(default)]
    pub remote_password: Option<String>,
    /// Client identifier of the bridge's session on this broker (default
    /// `local.REMOTE_CLIENTID`).
    #[serde(default)]
    pub local_clientid: Option<String>,
    /// Clean sessions on both sides: what was queued for the bridge is
    /// dropped when it reconnects. Default false, as in mosquitto.
    #[serde(default)]
    pub cleansession: bool,
    /// Keep alive towards the remote broker, seconds.
    #[serde(default = "default_keepalive")]
    pub keepalive_interval: u16,
    /// Seconds before the first reconnect attempt.
    #[serde(default = "default_restart_base")]
    pub restart_timeout: u32,
    /// Longest wait between attempts (the wait doubles from
    /// `restart_timeout` up to this).
    #[serde(default = "default_restart_max")]
    pub restart_timeout_max: u32,
    /// MQTT version towards the remote broker.
    #[serde(default)]
    pub protocol_version: BridgeProtocol,
    /// MQTT 3.1.1: announce a bridge (protocol level 0x84) so the remote
    /// broker does not echo our messages back. Default true, as mosquitto.
    #[serde(default = "yes")]
    pub try_private: bool,
    /// Publish the bridge's state (`1` up, `0` down) to the notification
    /// topic, retained, locally and on the remote broker (there as the
    /// bridge's will too).
    #[serde(default = "yes")]
    pub notifications: bool,
    /// Default `$SYS/broker/connection/REMOTE_CLIENTID/state`.
    #[serde(default)]
    pub notification_topic: Option<String>,
    /// CA certificates (PEM) to verify the remote broker: turns TLS on.
    #[serde(default)]
    pub cafile: Option<PathBuf>,
    /// Client certificate chain (PEM) for the remote broker.
    #[serde(default)]
    pub certfile: Option<PathBuf>,
    /// Its private key (PEM).
    #[serde(default)]
    pub keyfile: Option<PathBuf>,
    /// Accept a remote certificate whose name does not match the address.
    #[serde(default)]
    pub insecure: bool,
    /// Largest packet the bridge accepts from the remote broker; 0: no
    /// limit of its own.
    #[serde(default)]
    pub max_packet_size: u32,
    /// Messages the bridge holds towards each side that the other side has
    /// not acknowledged yet; when full it stops reading, so the rest waits
    /// in its session on the sending broker (bounded and counted there).
    #[serde(default = "default_queue")]
    pub max_queued_messages: usize,
}

fn default_keepalive() -> u16 {
    60
}
fn default_restart_base() -> u32 {
    5
}
fn default_restart_max() -> u32 {
    30
}
fn yes() -> bool {
    true
}
fn default_queue() -> usize {
    1000
}

impl BridgeConfig {
    /// A bridge named `name` with every default and no address yet.
    pub fn new(name: impl Into<String>) -> Self {
        BridgeConfig {
            name: name.into(),
            addresses: Vec::new(),
            topic: Vec::new(),
            remote_clientid: None,
            remote_username: None,
            remote_password: None,
            local_clientid: None,
            cleansession: false,
            keepalive_interval: default_keepalive(),
            restart_timeout: default_restart_base(),
            restart_timeout_max: default_restart_max(),
            protocol_version: BridgeProtocol::V311,
            try_private: true,
            notifications: true,
            notification_topic: None,
            cafile: None,
            certfile: None,
            keyfile: None,
            insecure: false,
            max_packet_size: 0,
            max_queued_messages: default_queue(),
        }
    }

    /// Whether the remote connection uses TLS.
    pub fn tls(&self) -> bool {
        self.cafile.is_some()
    }

    /// The client identifier on the remote broker.
    pub fn remote_id(&self) -> String {
        match &self.remote_clientid {
            Some(id) => id.clone(),
            None => format!("{}.{}", hostname(), self.name),
        }
    }

    /// The client identifier of the bridge's session on this broker.
    pub fn local_id(&self) -> String {
        match &self.local_clientid {
            Some(id) => id.clone(),
            None => format!("local.{}", self.remote_id()),
        }
    }

    /// Where the state goes.
    pub fn state_topic(&self) -> String {
        match &self.notification_topic {
            Some(t) => t.clone(),
            None => format!("$SYS/broker/connection/{}/state", self.remote_id()),
        }
    }

    /// `host:port` of each address, the default port filled in.
    pub fn socket_addresses(&self) -> Vec<String> {
        let port = if self.tls() { 8883 } else { 1883 };
        self.addresses.iter().map(|a| with_port(a, port)).collect()
    }

    /// What `--test-config` and startup refuse.
    pub fn check(&self) -> Result<(), String> {
        let who = format!("bridge {:?}", self.name);
        if self.name.is_empty() || self.name.contains(['/', '+', '#']) {
            return Err(format!("{who}: name must be non-empty, without / + #"));
        }
        if self.addresses.is_empty() {
            return Err(format!("{who}: needs at least one address"));
        }
        for a in self.socket_addresses() {
            let port_ok = a
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !port_ok {
                return Err(format!("{who}: bad address {a:?} (HOST[:PORT])"));
            }
        }
        if self.topic.is_empty() {
            return Err(format!("{who}: needs at least one topic"));
        }
        for t in &self.topic {
            if t.qos > 2 {
                return Err(format!(
                    "{who}: topic {:?}: qos must be 0, 1 or 2",
                    t.pattern
                ));
            }
            for f in [t.local_filter(), t.remote_filter()] {
                if zerofan_codec::topic::validate_topic_filter(&f).is_err() {
                    return Err(format!("{who}: {f:?} is not a valid topic filter"));
                }
            }
            for p in [&t.local_prefix, &t.remote_prefix] {
                if p.contains(['+', '#']) {
                    return Err(format!("{who}: prefix {p:?} may not hold wildcards"));
                }
            }
        }
        if self.remote_password.is_some() && self.remote_username.is_none() {
            return Err(format!("{who}: remote_password needs remote_username"));
        }
        if self.certfile.is_some() != self.keyfile.is_some() {
            return Err(format!("{who}: certfile and keyfile go together"));
        }
        if self.certfile.is_some() && self.cafile.is_none() {
            return Err(format!("{who}: certfile needs cafile (TLS)"));
        }
        if self.restart_timeout == 0 || self.restart_timeout_max < self.restart_timeout {
            return Err(format!(
                "{who}: restart_timeout must be at least 1 and at most restart_timeout_max"
            ));
        }
        if self.max_queued_messages == 0 {
            return Err(format!("{who}: max_queued_messages must be at least 1"));
        }
        if self.remote_id().is_empty() || self.local_id() == self.remote_id() {
            return Err(format!(
                "{who}: local_clientid must differ from remote_clientid"
            ));
        }
        if zerofan_codec::topic::validate_topic_name(&self.state_topic()).is_err() {
            return Err(format!("{who}: bad notification_topic"));
        }
        Ok(())
    }
}

fn with_port(addr: &str, port: u16) -> String {
    let a = addr.trim();
    // `[::1]`, `[::1]:1883`, `host`, `host:1883`; a bare IPv6 address has
    // several colons and no port.
    if a.starts_with('[') {
        if a.ends_with(']') {
            return format!("{a}:{port}");
        }
        return a.to_string();
    }
    match a.matches(':').count() {
        0 => format!("{a}:{port}"),
        1 => a.to_string(),
        _ => format!("[{a}]:{port}"),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "zerofan".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> BridgeConfig {
        let mut b = BridgeConfig::new("edge");
        b.addresses = vec!["127.0.0.1".into()];
        b.topic = vec![BridgeTopic {
            pattern: "#".into(),
            ..BridgeTopic::default()
        }];
        b
    }

    #[test]
    fn defaults_as_mosquitto() {
        let b = valid();
        assert_eq!(b.check(), Ok(()));
        assert_eq!(b.socket_addresses(), vec!["127.0.0.1:1883"]);
        assert!(b.remote_id().ends_with(".edge"));
        assert_eq!(b.local_id(), format!("local.{}", b.remote_id()));
        assert_eq!(
            b.state_topic(),
            format!("$SYS/broker/connection/{}/state", b.remote_id())
        );
        assert!(b.try_private && b.notifications && !b.cleansession);
    }

    #[test]
    fn ports_filled_in() {
        assert_eq!(with_port("h", 1883), "h:1883");
        assert_eq!(with_port("h:2000", 1883), "h:2000");
        assert_eq!(with_port("::1", 1883), "[::1]:1883");
        assert_eq!(with_port("[::1]", 8883), "[::1]:8883");
        assert_eq!(with_port("[::1]:9", 8883), "[::1]:9");
    }

    #[test]
    fn refused() {
        type Change = Box<dyn Fn(&mut BridgeConfig)>;
        let cases: Vec<(&str, Change)> = vec![
            ("address", Box::new(|b| b.addresses.clear())),
            ("topic", Box::new(|b| b.topic.clear())),
            ("qos", Box::new(|b| b.topic[0].qos = 3)),
            ("filter", Box::new(|b| b.topic[0].pattern = "a/#/b".into())),
            (
                "prefix",
                Box::new(|b| b.topic[0].local_prefix = "+/".into()),
            ),
            ("address", Box::new(|b| b.addresses = vec!["h:0".into()])),
            ("address", Box::new(|b| b.addresses = vec!["h:x".into()])),
            (
                "remote_username",
                Box::new(|b| b.remote_password = Some("p".into())),
            ),
            ("keyfile", Box::new(|b| b.certfile = Some("c".into()))),
            ("restart_timeout", Box::new(|b| b.restart_timeout = 0)),
            ("name", Box::new(|b| b.name = "a/b".into())),
            (
                "notification_topic",
                Box::new(|b| b.notification_topic = Some("a/#".into())),
            ),
            (
                "local_clientid",
                Box::new(|b| {
                    b.remote_clientid = Some("x".into());
                    b.local_clientid = Some("x".into());
                }),
            ),
        ];
        for (word, change) in cases {
            let mut b = valid();
            change(&mut b);
            let e = b.check().unwrap_err();
            assert!(e.contains(word), "{word}: {e}");
        }
    }
}

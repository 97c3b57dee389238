//! Listener settings: the `[[listener]]` tables of the TOML configuration
//! (and what `listen = [...]`, `--listen` and a mosquitto configuration
//! turn into).
//!
//! ```toml
//! [[listener]]
//! bind = "0.0.0.0:8883"
//! protocol = "mqtt"              # or "websockets" (path /mqtt, subprotocol mqtt)
//! tls = { cert = "server.pem", key = "server.key", ca = "ca.pem", require_certificate = true }
//! allow_anonymous = false        # default: true only on a loopback address
//! proxy_protocol = false         # PROXY v1/v2 header before MQTT
//! max_connections = 0            # 0: no per-listener limit
//! ```

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// What a listener speaks on top of TCP (or TLS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerProtocol {
    /// MQTT straight over the byte stream.
    #[default]
    Mqtt,
    /// MQTT over WebSocket (binary frames), path `/mqtt`, subprotocol `mqtt`.
    Websockets,
}

impl ListenerProtocol {
    /// `mqtt` or `websockets`.
    pub fn name(self) -> &'static str {
        match self {
            ListenerProtocol::Mqtt => "mqtt",
            ListenerProtocol::Websockets => "websockets",
        }
    }
}

/// TLS options of a listener (rustls).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain, server certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates client certificates are checked against. With
    /// it, a client certificate is verified when presented.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// Refuse clients without a valid certificate (mutual TLS; needs `ca`).
    #[serde(default)]
    pub require_certificate: bool,
    /// The client certificate's Common Name is the username; the password
    /// file is not consulted (needs `require_certificate`).
    #[serde(default)]
    pub use_identity_as_username: bool,
}

/// One listener: address, protocol and options.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Address to bind (port 0: any free port, printed at startup).
    pub bind: SocketAddr,
    /// `mqtt` (default) or `websockets`.
    #[serde(default)]
    pub protocol: ListenerProtocol,
    /// TLS (`mqtts` / `wss`) when set.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Clients without a username may connect. Unset: the global
    /// `allow_anonymous`, and without that, true only when `bind` is a
    /// loopback address.
    #[serde(default)]
    pub allow_anonymous: Option<bool>,
    /// Expect a PROXY protocol v1 or v2 header before anything else; the
    /// address it carries is the client's (for limits, throttling, logs).
    #[serde(default)]
    pub proxy_protocol: bool,
    /// Most simultaneous connections on this listener; 0: no limit.
    #[serde(default)]
    pub max_connections: usize,
    /// Password file for this listener instead of the global one.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// ACL file for this listener instead of the global one.
    #[serde(default)]
    pub acl_file: Option<PathBuf>,
}

impl ListenerConfig {
    /// A plain TCP listener with every option at its default.
    pub fn tcp(bind: SocketAddr) -> Self {
        ListenerConfig {
            bind,
            protocol: ListenerProtocol::Mqtt,
            tls: None,
            allow_anonymous: None,
            proxy_protocol: false,
            max_connections: 0,
            password_file: None,
            acl_file: None,
        }
    }

    /// A short description for logs and the startup line, e.g. `mqtt+tls`.
    pub fn kind(&self) -> String {
        let mut s = String::from(self.protocol.name());
        if self.tls.is_some() {
            s.push_str("+tls");
        }
        if self.proxy_protocol {
            s.push_str("+proxy");
        }
        s
    }

    /// Whether anonymous clients are allowed, given the global setting.
    pub fn effective_allow_anonymous(&self, global: Option<bool>) -> bool {
        self.allow_anonymous
            .or(global)
            .unwrap_or_else(|| self.bind.ip().is_loopback())
    }
}

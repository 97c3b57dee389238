//! Bridges to other brokers, as mosquitto's: each `[[bridge]]` (or
//! mosquitto `connection` section) subscribes on one side and publishes
//! on the other, through two `zerofan-client` connections.
//!
//! - `config`: [`BridgeConfig`], the settings and their checks.
//! - `run`: the bridge at run time (connections, forwarding, QoS flow,
//!   notifications).
//! - `local`: its session on this broker, over `link`: two bounded queues
//!   of packets the shell drives as a connection (`shell/local_conn.rs`),
//!   so payloads cross as `Bytes` both ways, never encoded or parsed.
//! - `stats`: [`BridgeStats`], its figures for `/metrics` and `$SYS`.
//! - `tls`: the remote side's TLS.

mod config;
pub mod link;
pub(crate) mod local;
mod run;
mod stats;
mod tls;

pub use config::{BridgeConfig, BridgeProtocol, BridgeTopic, Direction};
pub use link::LinkEnd;
pub use local::Opener;
pub use run::{map_topic, remote_transport, run, Notify, Way};
pub use stats::{render, BridgeFigures, BridgeStats};

use std::sync::Arc;

/// A bridge with its files read, ready to start.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// Its settings.
    pub config: BridgeConfig,
    /// TLS towards the remote broker.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// Check every bridge and read its files (certificates): what startup and
/// `--test-config` refuse.
pub fn prepare(bridges: &[BridgeConfig]) -> Result<Vec<Prepared>, String> {
    bridges
        .iter()
        .map(|b| {
            b.check()?;
            Ok(Prepared {
                config: b.clone(),
                tls: tls::client_config(b)?,
            })
        })
        .collect()
}

//! zerofan-broker: an MQTT 3.1 / 3.1.1 / 5.0 broker whose data path never
//! copies a payload per subscriber.
//!
//! - [`core`]: the sans-IO protocol core. Sessions, the subscription trie,
//!   retained messages, wills, QoS flows, flow control, keep alive and
//!   expiry, as a deterministic state machine driven by packets and time.
//! - [`shell`]: the thin tokio layer. Accepts connections, reads into pooled
//!   buffers, frames and decodes packets, feeds the core, and writes its
//!   outboxes with vectored writes. One thread, no locks on the publish path.
//! - [`embed`]: the broker on a thread of its own inside another program,
//!   with its figures and a graceful shutdown.
//! - [`config`]: every setting, loaded from a flat TOML table.
//! - [`bridge`]: bridges to other brokers (mosquitto's `connection`
//!   sections, `[[bridge]]` tables), over `zerofan-client`.
//! - [`cli`]: the `zerofan` command line.
//! - [`listen_config`]: `[[listener]]` settings (TCP, TLS, WebSocket,
//!   PROXY protocol, per-listener limits and authentication).
//! - [`mosquitto_conf`]: `zerofan -c mosquitto.conf`, a mosquitto
//!   configuration mapped onto ours.
//! - [`security`]: reading password, ACL and certificate files into what
//!   the core and the listeners use (also `--test-config`).
//! - [`ext_auth`]: `auth_jwt` (tokens in the password field) and its key
//!   files.
//! - [`passwd_cmd`]: `zerofan passwd FILE USER`.
//! - [`logging`]: `tracing` output as text or JSON lines, to stderr,
//!   stdout, files or syslog.
//! - [`sd_notify`]: telling systemd the broker is ready, reloading or
//!   stopping (`Type=notify`), and the pid file.
//! - [`ratelimit`]: the token-bucket limiter every per-client log line
//!   goes through.
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![forbid(unsafe_code)]

pub mod bridge;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod core;
pub mod embed;
pub mod ext_auth;
pub mod listen_config;
pub mod logging;
pub mod mosquitto_conf;
pub mod passwd_cmd;
pub mod ratelimit;
pub mod sd_notify;
pub mod security;
pub mod shell;

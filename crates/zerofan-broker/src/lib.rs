//! zerofan-broker: an MQTT 3.1 / 3.1.1 / 5.0 broker whose data path never
//! copies a payload per subscriber.
//!
//! - [`core`]: the sans-IO protocol core. Sessions, the subscription trie,
//!   retained messages, wills, QoS flows, flow control, keep alive and
//!   expiry, as a deterministic state machine driven by packets and time.
//! - [`shell`]: the thin tokio layer. Accepts connections, reads into pooled
//!   buffers, frames and decodes packets, feeds the core, and writes its
//!   outboxes with vectored writes. One thread, no locks on the publish path.
//! - [`config`]: every setting, loaded from a flat TOML table.
//! - [`cli`]: the `zerofan` command line.
//! - [`logging`]: `tracing` output as text or JSON lines.
//! - [`ratelimit`]: the token-bucket limiter every per-client log line
//!   goes through.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod core;
pub mod logging;
pub mod ratelimit;
pub mod shell;

//! The sans-IO protocol core: sessions, routing, QoS state, keep alive,
//! wills and expiry as a deterministic state machine. Time comes in as an
//! argument; nothing here touches a socket or a clock.
//!
//! - [`Broker`]: the entry points the shell calls.
//! - [`Outgoing`] / [`Delivery`]: what a connection's writer sends; a
//!   delivery references the shared [`Message`], never a copy.
//! - [`store`]: the storage traits and the in-memory store.
//! - [`Metrics`]: every counter, declared once with its `$SYS/` and
//!   Prometheus names (`metrics::counters!`).

pub mod admin;
pub mod admission;
pub mod auth;
mod broker;
mod children;
mod claims;
mod connect;
mod connection;
mod deliver;
pub mod durable;
pub mod events;
mod failover;
mod hash;
pub mod http_auth;
mod ids;
pub mod limits;
mod message;
mod metrics;
mod observe;
mod outbox;
mod peer;
pub mod peer_wire;
mod publish;
mod quota;
mod replica;
mod replica_wire;
mod router;
mod scram_auth;
mod session;
pub mod store;
mod submap;
mod subscribe;
mod sys;
pub use sys::sys_figures;
mod timers;
pub mod token;
mod trie;
mod wire;

#[cfg(test)]
mod tests;

pub use admission::Admission;
pub use auth::{ConnectionMeta, ListenerAuth, SecurityConfig};
pub use broker::{Broker, InputState};
pub use claims::ClaimRequest;
pub use http_auth::{AuthRequest, HttpAnswer, HttpAuthSettings};
pub use ids::{ConnId, SessionId};
pub use message::Message;
pub use metrics::{Counted, CounterDef, Family, Label, Metrics, ShellStats, Sum};
pub use observe::{
    Gauges, LatencyHistogram, ReloadOutcome, ShardFigures, StoreFigures, LATENCY_BUCKETS,
};
pub use outbox::{AckKind, Delivery, Outgoing, Transmit};
pub use peer::{shard_of, PeerBatch, PeerEvent, PeerId};
pub use replica::ReplOp;
pub use token::JwtAuth;
pub use wire::Wire;

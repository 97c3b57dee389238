//! The sans-IO protocol core: sessions, routing, QoS state, keep alive,
//! wills and expiry as a deterministic state machine. Time comes in as an
//! argument; nothing here touches a socket or a clock.
//!
//! [`Broker`] (in `broker.rs`, the only `impl Broker`) holds the entry points
//! the shell calls, in the order its doc gives, and the handlers that touch
//! several parts of the state at once. Every other module is a type that
//! owns one part of the state, or the plain data and functions around it.
//!
//! # The life of a QoS 0 PUBLISH, in 6 files
//!
//! 1. `shell/reader.rs`: the bytes are read into a pooled buffer, framed,
//!    decoded, and handed to `Broker::handle_publish` with their [`Wire`].
//! 2. `core/broker.rs`: `dispatch_packet`, then the PUBLISH section
//!    (`on_publish`: checks, ACL, aliases), then routing (`route`:
//!    retained store, then `deliver`) and delivery (`enqueue_with`,
//!    `fill_batch` behind `poll_transmit`).
//! 3. `core/router.rs`: `Router::route`, the local sessions that match and
//!    the peers (other shards, nodes) that want it.
//! 4. `core/session.rs`: the session's bounded queue and its accounting.
//! 5. `core/deliver.rs`: a queued message becomes a [`Delivery`] (alias,
//!    expiry), sent as the received bytes when it can be.
//! 6. `shell/writer.rs`: `poll_transmit` batches are encoded and written
//!    with vectored writes, payloads shared, never copied.
//!
//! # Modules
//!
//! The state machine:
//! - `broker`: [`Broker`] and [`InputState`]; every handler, in the order
//!   of a packet's life.
//! - `connection`: one network connection's protocol state and outbox.
//! - `session`: one session's subscriptions, queue, inflight window and QoS
//!   2 state.
//! - `ids`: [`ConnId`] / [`SessionId`], never reused.
//! - `sessions`: `Sessions`, every session by id and by client id.
//! - `timers`: the core's deadlines in one min-heap.
//! - `outbox`: [`Outgoing`] / [`Delivery`] / [`Transmit`], what the shell
//!   writes; a delivery references the shared [`Message`], never a copy.
//! - `message`: [`Message`], decoded once and shared by every delivery.
//! - `wire`: [`Wire`], a received PUBLISH's bytes, forwarded as they are.
//!
//! Routing and the routing seam:
//! - `router`: `Router`, local subscriptions and peers' interests;
//!   `route()` gives local deliveries and peer targets.
//! - `trie`, `children`, `submap`: the subscription trie, its nodes'
//!   children, and a session's filters.
//! - `peer`: `Peers`, the other shards and nodes, and the
//!   [`PeerEvent`]s that cross to them (`handle_peer` /
//!   `poll_peer_transmit`).
//! - [`peer_wire`]: the wire form of peer events, for nodes behind a socket.
//! - [`store`]: the retained messages ([`store::MemoryStore`]).
//! - `quota`: limits on subscriptions per session and on retained messages.
//!
//! Protocol helpers of the handlers in `broker.rs`:
//! - `connect`: a CONNECT waiting for a takeover, owned wills, assigned
//!   client ids.
//! - `publish`: buffer compaction threshold, topic depth, acknowledgements.
//! - `deliver`: queue watermarks, packet size fit, building a delivery.
//! - `subscribe`: what a deferred SUBSCRIBE keeps for its retained replay.
//! - `sys`: the `$SYS/` figures ([`sys_figures`]).
//!
//! Security:
//! - [`auth`]: the login and ACL policy, `AuthState`, [`SecurityConfig`].
//! - [`admission`]: connection limits and login throttling shared by
//!   shards ([`Admission`]).
//! - [`limits`]: per-client and per-address limits and refusal counters.
//! - [`token`]: JWT logins ([`JwtAuth`]).
//! - [`http_auth`]: logins and ACL decided by an HTTP service.
//! - `scram_auth`: MQTT 5 SCRAM enhanced authentication.
//!
//! Durability and cluster:
//! - [`durable`]: `Durable`, the durable log, staging and held acks.
//! - `claims`: client ids a cluster must grant before a CONNECT goes on.
//! - `orphans`: the wills of a dead node's clients, published by a node
//!   that holds a copy of their session.
//! - `drain`: a node being removed sends its clients to another node.
//!
//! Observability:
//! - `metrics`: [`Metrics`], every counter, declared once with its `$SYS/`
//!   and Prometheus names (`metrics::counters!`).
//! - `observe`: [`Gauges`], store and shard figures, reload outcomes.
//! - [`events`]: events for webhooks, in a bounded buffer.
//! - [`admin`]: views and actions for the HTTP API.
//! - `hash`: the core's hash maps (foldhash).

pub mod admin;
pub mod admission;
pub mod auth;
mod broker;
mod children;
mod claims;
mod client_id;
mod connect;
mod connection;
mod deliver;
mod drain;
pub mod durable;
pub mod events;
mod hash;
pub mod http_auth;
mod ids;
mod lease;
pub mod limits;
mod message;
mod metrics;
mod moment;
mod moves;
mod observe;
mod orphans;
mod outbox;
mod peer;
pub mod peer_wire;
mod publish;
mod quota;
mod replica;
mod replica_wire;
mod retain_order;
mod router;
mod scram_auth;
mod session;
mod session_queue;
mod sessions;
mod slots;
pub mod store;
mod strand;
mod submap;
mod subscribe;
mod subscribers;
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
pub use claims::{ClaimRequest, Loss};
pub use http_auth::{AuthRequest, HttpAnswer, HttpAuthSettings};
pub use ids::{ConnId, SessionId};
pub use message::Message;
pub use metrics::{Counted, CounterDef, Family, Label, Metrics, ShellStats, Sum};
pub use observe::{
    Gauges, LatencyHistogram, ReloadOutcome, ShardFigures, StoreFigures, LATENCY_BUCKETS,
};
pub use orphans::{OrphanRequest, Orphaned};
pub use outbox::{AckKind, Delivery, Outgoing, Transmit};
pub use peer::{shard_of, PeerBatch, PeerEvent, PeerId, Stranded};
pub use replica::PreviousOwner;
pub use replica::{ReplBatch, ReplOp};
pub(crate) use replica::{MAX_BYTES as REPLICA_MAX_BYTES, MAX_IMAGES as REPLICA_MAX_SESSIONS};
pub use retain_order::Stamp;
pub use slots::ConnTable;
pub use strand::Mark;
pub use token::JwtAuth;
pub use wire::Wire;

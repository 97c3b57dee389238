//! zerofan's cluster: several brokers agree, through openraft, on who is a
//! member and which node owns which MQTT client id.
//!
//! - [`Cluster`]: start, join or rejoin a cluster; claim client ids (with a
//!   fencing epoch); watch membership; hand node-to-node links to the broker.
//! - `types`: the openraft type configuration and the replicated commands.
//! - `log_store`, `state_machine`: the Raft log, vote and snapshot on disk,
//!   fsynced before openraft is told they are persisted.
//! - `network`, `frame`: the single node-to-node listener, its hello frame
//!   (`Raft`, `Admin`, `Link`) and openraft's RPCs over it.
//! - `lease`: ownership leases, so that a node cut off from the majority
//!   stops serving its clients before another node may take them over.
//! - `tls`: mutual TLS for every node-to-node connection, when configured.
//! - [`admin`]: the requests `zerofan cluster status|remove` send.
//! - `drain`: a live node being removed sends its clients elsewhere first.
//!
//! openraft's types stay inside this crate: the broker sees only the types
//! re-exported here.
#![warn(missing_docs)]
// openraft's trait methods return its large `StorageError`; our helpers pass it on.
#![allow(clippy::result_large_err)]

pub mod admin;
mod cluster;
mod disk;
mod drain;
mod frame;
mod lease;
mod log_store;
mod network;
mod state_machine;
mod tls;
mod types;

#[cfg(test)]
mod sim;

pub use admin::{ClusterStatus, MemberStatus};
pub use cluster::{Cluster, ClusterConfig, ClusterError, Member, Members, OrphanClaim, Previous};
pub use drain::{DrainOrder, DrainReport, RemoveReport, DEFAULT_DRAIN, MAX_DRAIN};
pub use lease::{grant_after, DEFAULT_LEASE, MIN_LEASE};
pub use state_machine::{OwnershipLost, MAX_CLIENT_IDS};
pub use tls::{certs as pem_certs, AnyName, ClusterTls, NodeStream};

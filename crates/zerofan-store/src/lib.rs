//! zerofan's embedded store: what must outlive the broker process.
//!
//! It keeps retained messages and persistent sessions (expiry, subscriptions,
//! the offline queue, outbound QoS 1/2 inflight state with packet ids,
//! inbound QoS 2 packet ids awaiting PUBREL, wills waiting out their delay,
//! the caller's epoch number) in one append-only log of checksummed
//! records, with a payload written once however many queues reference it.
//!
//! The parts:
//!
//! - [`Store`] (`store.rs`): the handle the broker owns. Operations stage
//!   records in memory on the caller's thread; [`Store::commit`] hands them to
//!   the writer and returns an [`Lsn`] the broker waits on before it
//!   acknowledges a QoS 1/2 PUBLISH.
//! - The writer thread (`writer.rs`): writes every waiting commit, fsyncs
//!   once per round (group commit, [`FsyncPolicy`]), publishes the durable LSN
//!   and calls [`Options::on_durable`]; runs compactions.
//! - The index (`model.rs`): which records are live and where, message
//!   reference counts; plans compaction as a list of byte ranges to copy.
//! - The format (`format.rs`): manifest, log header, record frames and
//!   bodies, documented at `Record`.
//! - The data types (`types.rs`) the broker hands in and gets back in
//!   [`Recovered`] when it opens the store.
//!
//! ```
//! use zerofan_store::{Options, QueueEntry, SessionMeta, Store, StoredMessage};
//! # let dir = tempfile::tempdir().unwrap();
//! let (mut store, recovered) = Store::open(dir.path(), Options::default())?;
//! assert!(recovered.sessions.is_empty());
//! store.put_session("sensor-1", SessionMeta { expiry_interval: 3600, expires_at_ms: None })?;
//! let msg = store.put_message(&StoredMessage {
//!     topic: "t/1".into(),
//!     payload: "hello".into(),
//!     qos: 1,
//!     ..Default::default()
//! })?;
//! store.enqueue("sensor-1", &QueueEntry { msg, qos: 1, ..Default::default() })?;
//! let lsn = store.commit()?;
//! store.wait_durable(lsn)?; // the broker would rather be notified
//! store.close()?;
//! # Ok::<(), zerofan_store::StoreError>(())
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod clock;
mod error;
mod format;
pub mod hash;
mod model;
mod store;
mod types;
mod writer;

pub use clock::unix_ms;
pub use error::StoreError;
pub use store::Store;
pub use types::{
    DurableNotifier, EntryId, FsyncPolicy, InflightPhase, Lsn, MessageProperties, MsgId, Options,
    QueueEntry, Recovered, RecoveredEntry, RecoveredInflight, RecoveredRetained, RecoveredSession,
    RecoveredSubscription, RecoveryReport, SessionMeta, StoreStats, StoredMessage, StoredWill,
    SubOptions,
};

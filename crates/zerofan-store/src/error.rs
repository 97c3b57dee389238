//! The one error type of the store.

use crate::types::MsgId;
use std::path::PathBuf;

/// Everything that can go wrong when opening or using a [`crate::Store`].
///
/// Opening fails only for reasons an operator must act on (an unreadable
/// directory, a newer format, a damaged manifest); a torn or corrupt log tail
/// is repaired, not reported as an error. Operations fail either because the
/// caller broke the store's contract (an unknown session, message or packet
/// id: a bug in the caller, nothing was staged) or because an earlier write or
/// fsync failed, after which the store refuses everything (`Failed`): nothing
/// it acknowledges after a lost write could be trusted.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O operation on the data directory failed.
    #[error("store i/o error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The data directory was written by a newer, incompatible store format.
    #[error(
        "data directory {dir} uses zerofan store format version {found}, newer than this \
         build supports (up to version {supported}); run a newer zerofan or point the data \
         directory elsewhere"
    )]
    NewerFormat {
        /// The data directory.
        dir: PathBuf,
        /// The version found on disk.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// The manifest or the log header is not what this store writes.
    #[error("data directory {dir} is not a usable zerofan store: {reason}")]
    BadDirectory {
        /// The data directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// An operation named a client id with no session in the store.
    #[error("no stored session for client id {0:?}")]
    UnknownSession(String),
    /// An operation referenced a message that is not (or no longer) stored.
    #[error("message {0:?} is not stored (reference it in the commit that wrote it, or while something still references it)")]
    UnknownMessage(MsgId),
    /// An operation named a queue entry or packet id the session does not have.
    #[error("session {client_id:?} has no {what}")]
    UnknownItem {
        /// The session.
        client_id: String,
        /// What was missing, e.g. "queue entry 7" or "inflight packet id 3".
        what: String,
    },
    /// A value cannot be represented in the record format (e.g. a topic over
    /// 65,535 bytes or a QoS above 2).
    #[error("invalid value for the store: {0}")]
    Invalid(&'static str),
    /// An earlier write, fsync or compaction failed; the store accepts nothing
    /// more. Restart (recovery reopens what was durable).
    #[error("the store failed earlier and accepts no more writes: {0}")]
    Failed(String),
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            path: path.into(),
            source,
        }
    }
}

//! The openraft type configuration and the replicated commands.

use serde::{Deserialize, Serialize};
use std::io::Cursor;

/// What a member is reachable at; kept in the Raft membership so every node
/// learns every other node's addresses from the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Address of the node's cluster listener.
    pub cluster_addr: String,
    /// Address MQTT clients reach the node at (server references).
    pub mqtt_addr: Option<String>,
}

/// A change to the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// `node` takes ownership of `client_id`; the entry's epoch fences the
    /// previous owner.
    Claim {
        /// MQTT client id.
        client_id: String,
        /// Node that now serves the client.
        node: u64,
        /// Its client starts clean: the session ends, and the owner it
        /// is taken from hears so (`OwnershipLost::clean_start`) also
        /// when no fence reached it (its lease ran out). Absent in
        /// entries written before 2026-12-01: false.
        #[serde(default)]
        clean_start: bool,
        /// The owner (node, epoch; 0: any) the leader found out of its
        /// lease when it wrote the claim: if it still owns the id when the
        /// entry applies, it let go by its lease, without a fence, and
        /// hears so (`OwnershipLost::lapsed`). Absent in entries written
        /// before 2026-12-01: none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by_lease: Option<(u64, u64)>,
    },
    /// Forget `client_id` if its epoch is still `epoch` (the session ended
    /// on its owner); a later claim has moved it on otherwise.
    Release {
        /// MQTT client id.
        client_id: String,
        /// Epoch the releasing owner holds.
        epoch: u64,
    },
    /// `node` takes `client_id` as [`Command::Claim`] does, but only if
    /// `owner` still owns it at `epoch` (0: any epoch); else nothing
    /// changes (a later claim or a release moved it on first). A node
    /// holding a copy of a dead owner's session takes it this way, and
    /// never from whoever took it meanwhile.
    ClaimOrphan {
        /// MQTT client id.
        client_id: String,
        /// Node that takes it.
        node: u64,
        /// Node that must still own it.
        owner: u64,
        /// Epoch `owner` must still hold; 0: any.
        epoch: u64,
    },
}

/// What applying a log entry answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// Blank and membership entries answer nothing.
    #[default]
    None,
    /// The claim succeeded: the owner and its new epoch.
    Claimed {
        /// Owning node.
        owner: u64,
        /// Epoch, strictly rising per client id.
        epoch: u64,
        /// The owner before it that is not the claimant, and that owner's
        /// epoch (`None`: none in the table).
        #[serde(default)]
        previous: Option<(u64, u64)>,
    },
    /// The claim was refused (the table of client ids is full).
    Refused(String),
    /// A [`Command::ClaimOrphan`] found the client id no longer held by
    /// the named owner (at that epoch): nothing changed.
    Moved,
}

openraft::declare_raft_types!(
    /// zerofan's Raft types.
    pub TypeConfig:
        D = Command,
        R = Reply,
        NodeId = u64,
        Node = NodeInfo,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Shorthands for the generic openraft types.
pub type Raft = openraft::Raft<TypeConfig>;
/// Storage error of our types.
pub type StorageError = openraft::StorageError<u64>;

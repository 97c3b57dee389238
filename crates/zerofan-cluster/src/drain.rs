//! Removing a live node (`zerofan cluster remove`): before the membership
//! change, the leader asks the node to drain. The node sends its clients to
//! the member that holds the copies of its sessions (the lowest-id other
//! member the leader has heard from), refuses new ones, and answers once
//! every session has been taken over by another node, or at the deadline,
//! saying what it did. A node that does not answer is removed anyway: its
//! sessions are served from their copies when their clients connect
//! elsewhere, as after a crash.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a drain may take unless the command says otherwise.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(30);
/// The longest drain a command may ask for.
pub const MAX_DRAIN: Duration = Duration::from_secs(600);
/// Client ids named in one `Adopt` request (well inside an admin frame).
pub(crate) const ADOPT_BATCH: usize = 256;

/// The broker's order to drain, with where to send the answer.
#[derive(Debug)]
pub struct DrainOrder {
    /// The MQTT address clients are sent to (Server Reference), if any
    /// member can be named.
    pub reference: Option<String>,
    /// When to stop waiting for sessions to move.
    pub deadline: Duration,
    /// The answer, once done.
    pub reply: oneshot::Sender<DrainReport>,
}

/// What a drain did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainReport {
    /// Connections told to go elsewhere (DISCONNECT, or refused CONNECT).
    pub clients_told: u64,
    /// Sessions another node took over.
    pub sessions_moved: u64,
    /// Sessions still on the node at the deadline (their clients find them
    /// on a node holding a copy when they connect there).
    pub sessions_left: u64,
}

/// The answer to `zerofan cluster remove`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveReport {
    /// The node removed.
    pub node_id: u64,
    /// The member its clients were sent to.
    pub target: Option<u64>,
    /// That member's MQTT address, as given to clients.
    pub reference: Option<String>,
    /// What the drain did; `None` when the node was not drained.
    pub drain: Option<DrainReport>,
    /// Sessions left on the node (their clients did not connect elsewhere)
    /// that the leader gave to `target`, which serves them from its copies.
    pub sessions_handed: u64,
    /// Why the node was not drained, when it was not.
    pub note: Option<String>,
}

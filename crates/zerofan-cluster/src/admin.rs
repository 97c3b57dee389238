//! Admin requests over the cluster listener (`Admin` hello): what
//! `zerofan cluster status|remove` send, and how nodes ask the leader to
//! add them or to record a claim.

use crate::cluster::ClusterError;
use crate::drain::{DrainReport, RemoveReport};
use crate::frame::{self, Hello, Kind, LARGE_FRAME};
use crate::tls::{self, ClusterTls};
use crate::types::NodeInfo;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::time::timeout;

/// One member as `cluster status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// Node id.
    pub node_id: u64,
    /// Cluster listener address.
    pub cluster_addr: String,
    /// MQTT address, when the node advertises one.
    pub mqtt_addr: Option<String>,
    /// `leader`, `follower` or `learner`.
    pub role: String,
    /// The answering leader heard from it recently (always true for the
    /// answering node itself).
    pub healthy: bool,
    /// Last log index known replicated to it (leader's view).
    pub matched: Option<u64>,
    /// Entries it is behind the leader's log (leader's view).
    pub lag: Option<u64>,
}

/// The answer to `cluster status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// Node that answered (the leader when it could be reached).
    pub answered_by: u64,
    /// Current leader, if known.
    pub leader_id: Option<u64>,
    /// Raft term.
    pub term: u64,
    /// Last log index applied on the answering node.
    pub last_applied: Option<u64>,
    /// Leader changes the answering node has seen since it started.
    pub leader_changes: u64,
    /// Client ids owned cluster-wide.
    pub client_ids: u64,
    /// Claims applied.
    pub claims: u64,
    /// Claims that moved a client id from one node to another.
    pub fenced_takeovers: u64,
    /// One entry per member.
    pub members: Vec<MemberStatus>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    Status,
    Remove {
        node_id: u64,
        /// How long the node may drain (ms) before it is removed anyway.
        drain_ms: u64,
    },
    /// Sent by the leader to a node it is about to remove: send the
    /// clients to `reference`, answer when the sessions moved or after
    /// `drain_ms`.
    Drain {
        reference: Option<String>,
        drain_ms: u64,
    },
    /// Sent by the leader to the node it just gave these client ids (the
    /// sessions of a node being removed): serve them from its copies.
    Adopt {
        client_ids: Vec<String>,
    },
    Join {
        node_id: u64,
        node: NodeInfo,
    },
    Claim {
        client_id: String,
        node_id: u64,
        /// The claimant's client starts clean (passed on in the fence).
        #[serde(default)]
        clean_start: bool,
    },
    Release {
        client_id: String,
        epoch: u64,
    },
    /// Sent by the leader to a node it removed.
    Removed,
    /// Renew `node_id`'s ownership lease (see `lease`).
    Renew {
        node_id: u64,
    },
    /// Sent by the leader to the owner of `client_id` before a claim takes
    /// it: drop the connection, then answer.
    Fence {
        client_id: String,
        new_owner: u64,
        /// The new owner's client starts clean: the session here ends
        /// with the connection (see [`crate::OwnershipLost::clean_start`]).
        #[serde(default)]
        clean_start: bool,
        /// The owner before the fenced node's claims of the id (see
        /// [`crate::OwnershipLost::before`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before: Option<(u64, u64)>,
    },
    /// `node_id` takes `client_id` only if `owner` still owns it (at
    /// `epoch`; 0: any) and `owner`'s lease has run out: never fenced (see
    /// `Cluster::claim_orphan`).
    ClaimOrphan {
        client_id: String,
        node_id: u64,
        owner: u64,
        epoch: u64,
        /// The connection under `epoch` is known to have ended (see
        /// `Cluster::claim_ended`).
        #[serde(default)]
        ended: bool,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Envelope {
    pub(crate) req: Request,
    /// Already passed on by a follower: not passed on again.
    pub(crate) forwarded: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Reply {
    Status(Box<ClusterStatus>),
    Done,
    Claimed {
        owner: u64,
        epoch: u64,
        #[serde(default)]
        previous: Option<(u64, u64)>,
        /// The owner before let go only because its lease ran out (see
        /// [`crate::Previous::lapsed`]).
        #[serde(default)]
        lapsed: bool,
    },
    Error(String),
    Removed(RemoveReport),
    Drained(DrainReport),
    /// A `ClaimOrphan`'s owner no longer owns the client id.
    Moved,
}

/// How long an admin exchange may take (a join waits for the new node to
/// catch up as a learner).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub(crate) async fn call(
    addr: &str,
    from: u64,
    env: &Envelope,
    tls: Option<&ClusterTls>,
) -> Result<Reply, ClusterError> {
    call_within(addr, from, env, tls, ADMIN_TIMEOUT).await
}

/// [`call`] with its own limit (a remove waits for the node's drain).
pub(crate) async fn call_within(
    addr: &str,
    from: u64,
    env: &Envelope,
    tls: Option<&ClusterTls>,
    limit: Duration,
) -> Result<Reply, ClusterError> {
    let unreachable = |why: String| ClusterError::Unreachable {
        addr: addr.to_string(),
        why,
    };
    let mut conn = match tls::connect(addr, tls, CONNECT_TIMEOUT).await {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            return Err(unreachable("no answer within 3 s".into()))
        }
        Err(e) => return Err(unreachable(e.to_string())),
    };
    let exchange = async {
        frame::write(
            &mut conn,
            &Hello {
                kind: Kind::Admin,
                from,
            },
        )
        .await?;
        frame::write(&mut conn, env).await?;
        frame::read::<_, Reply>(&mut conn, LARGE_FRAME).await
    };
    match timeout(limit, exchange).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(unreachable(e.to_string())),
        Err(_) => Err(unreachable(format!(
            "no answer within {} s",
            limit.as_secs()
        ))),
    }
}

/// The status of the cluster `addr` (a node's cluster listener) is part of;
/// `tls` when the cluster uses it.
pub async fn status(addr: &str, tls: Option<&ClusterTls>) -> Result<ClusterStatus, ClusterError> {
    let env = Envelope {
        req: Request::Status,
        forwarded: false,
    };
    match call(addr, 0, &env, tls).await? {
        Reply::Status(s) => Ok(*s),
        Reply::Error(e) => Err(ClusterError::Refused(e)),
        other => Err(ClusterError::Refused(format!(
            "unexpected answer {other:?}"
        ))),
    }
}

/// How long an admin exchange that drains a node may take: the drain,
/// plus the membership change.
pub(crate) fn remove_timeout(drain: Duration) -> Duration {
    drain + ADMIN_TIMEOUT
}

/// Remove `node_id` from the cluster `addr` is part of; a live node first
/// drains for at most `drain` (see `drain`).
pub async fn remove(
    addr: &str,
    node_id: u64,
    drain: Duration,
    tls: Option<&ClusterTls>,
) -> Result<RemoveReport, ClusterError> {
    let drain = drain.min(crate::drain::MAX_DRAIN);
    let env = Envelope {
        req: Request::Remove {
            node_id,
            drain_ms: drain.as_millis() as u64,
        },
        forwarded: false,
    };
    // The forwarding node waits as long, then some.
    let limit = remove_timeout(drain) + ADMIN_TIMEOUT;
    match call_within(addr, 0, &env, tls, limit).await? {
        Reply::Removed(r) => Ok(r),
        Reply::Error(e) => Err(ClusterError::Refused(e)),
        other => Err(ClusterError::Refused(format!(
            "unexpected answer {other:?}"
        ))),
    }
}

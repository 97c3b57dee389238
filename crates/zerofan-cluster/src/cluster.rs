//! The cluster handle: storage, the Raft node, the node-to-node listener and
//! the admin requests it serves.

use crate::admin::{self, ClusterStatus, Envelope, MemberStatus, Reply};
use crate::disk::{Disk, FsDisk};
use crate::drain::{DrainOrder, DrainReport, RemoveReport};
use crate::frame::{self, Hello, Kind, LARGE_FRAME, SMALL_FRAME};
use crate::lease::{self, Grants, Holder};
use crate::log_store::LogStore;
use crate::network::{self, Heard, RaftRequest, TcpNetworkFactory};
use crate::state_machine::{held_by, OwnershipLost, SmShared, StateMachine};
use crate::tls::{self, ClusterTls, NodeStream};
use crate::types::{Command, NodeInfo, Raft, Reply as SmReply};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState, SnapshotPolicy};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

/// How to run this node.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// This node's id, unique in the cluster, not 0.
    pub node_id: u64,
    /// The node-to-node listener (Raft, admin, links).
    pub listen: SocketAddr,
    /// A member to join through when the data dir is empty.
    pub join: Option<SocketAddr>,
    /// The Raft log, vote and snapshot go in `data_dir/cluster/`.
    pub data_dir: PathBuf,
    /// The node's MQTT address, for server references.
    pub advertise: Option<SocketAddr>,
    /// The address other nodes dial for this node's cluster listener (a
    /// proxy or NAT in between); `listen` when unset. Recorded in the
    /// membership when the node joins.
    pub advertise_cluster: Option<SocketAddr>,
    /// Accept cluster traffic from non-loopback peers without TLS.
    pub insecure: bool,
    /// Mutual TLS for every node-to-node connection: the listener accepts
    /// only peers with a certificate from the cluster CA, and this node
    /// presents its own when it dials.
    pub tls: Option<ClusterTls>,
    /// How long this node serves its clients without hearing from a
    /// majority (see `lease`); at least [`crate::MIN_LEASE`].
    pub lease: Duration,
}

/// Why the cluster could not do something.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Bad settings.
    #[error("cluster config: {0}")]
    Config(String),
    /// Disk or socket trouble.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// A node did not answer.
    #[error("cluster node {addr} does not answer: {why}")]
    Unreachable {
        /// Its cluster address.
        addr: String,
        /// What happened.
        why: String,
    },
    /// The request was refused or failed on the far side.
    #[error("{0}")]
    Refused(String),
    /// Joining failed after every retry.
    #[error("could not join the cluster through {addr}: {why}")]
    Join {
        /// The address given to `--join`.
        addr: SocketAddr,
        /// The last error.
        why: String,
    },
}

/// One member in the [`Members`] view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Member {
    /// Cluster listener address.
    pub cluster_addr: String,
    /// MQTT address, when advertised.
    pub mqtt_addr: Option<String>,
    /// Votes (false: a learner still catching up).
    pub voter: bool,
}

/// Who is in the cluster, as this node last applied it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Members {
    /// Current leader, if known.
    pub leader: Option<u64>,
    /// Members by node id.
    pub nodes: BTreeMap<u64, Member>,
}

/// The owner a claim took a client id from (see [`Cluster::claim_from`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Previous {
    /// Its node id.
    pub node: u64,
    /// The epoch of its claim.
    pub epoch: u64,
    /// It let go only because its lease ran out: it answered no fence,
    /// and dropped its clients when the lease ended, without their wills
    /// (a node out of its lease publishes nothing). The wills its replicas
    /// hold armed are the claimant's to publish, also where that node is
    /// still reachable from the claimant (cut off from the leader only).
    pub lapsed: bool,
}

/// What [`Cluster::claim_orphan`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrphanClaim {
    /// This node owns the client id now: the claim's epoch, and the owner
    /// before it with that owner's epoch (as [`Cluster::claim_from`] gives
    /// it).
    Claimed {
        /// The new epoch.
        epoch: u64,
        /// The owner before this node, and its epoch.
        previous: Option<(u64, u64)>,
    },
    /// The named owner does not own it any more (another claim moved it
    /// on, or it was released): nothing to do.
    Moved,
}

/// What the leader's table says of a conditional claim (see
/// [`Cluster::claim_orphan`]).
#[derive(Debug, PartialEq, Eq)]
enum Orphan {
    /// The owner no longer holds the client id (at that epoch).
    Moved,
    /// The owner is the leader: alive, it is never taken from.
    Leads,
    /// The owner's lease may still run for this long.
    Wait(Duration),
    /// The owner has surely let go: the claim may be written.
    Free,
}

/// How long a leader may take to confirm, with a quorum, that its table
/// is up to date before it answers a conditional claim.
const READ_TIMEOUT: Duration = Duration::from_millis(500);

/// Node-to-node connections served at once; past it new ones are closed
/// (counted).
const MAX_CONNECTIONS: usize = 256;
/// Links accepted and not yet taken by the broker; past it they are closed
/// (counted).
const LINK_QUEUE: usize = 64;
/// Ownership-loss events not yet read by the broker.
const LOST_QUEUE: usize = 4096;
/// A follower heard from within this long is healthy.
const HEALTHY_WITHIN: Duration = Duration::from_secs(2);
/// How long a request forwarded to the leader (status, claim, release)
/// waits for its answer.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a new connection has to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Join attempts and the longest pause between two.
const JOIN_ATTEMPTS: u32 = 20;
const JOIN_MAX_BACKOFF: Duration = Duration::from_secs(2);

pub(crate) const REFUSED_NON_LOOPBACK: &str =
    "cluster traffic from non-loopback address refused: set insecure = true or configure TLS";

/// Raft timing: heartbeats every 100 ms. A follower that heard its leader
/// waits openraft's leader lease (`election_timeout_max`) plus its own
/// timeout before it stands, so a dead leader is replaced 0.9–1.2 s after
/// its last heartbeat (plus a tick, 150 ms), nine or more heartbeats missed:
/// a loaded machine does not see spurious elections. Failover time is this
/// plus `lease::grant_after`.
pub(crate) fn raft_config() -> Result<Arc<openraft::Config>, ClusterError> {
    let config = openraft::Config {
        cluster_name: "zerofan".into(),
        heartbeat_interval: 100,
        election_timeout_min: 300,
        election_timeout_max: 600,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(1000),
        max_in_snapshot_log_to_keep: 100,
        snapshot_max_chunk_size: 1024 * 1024,
        ..Default::default()
    };
    config
        .validate()
        .map(Arc::new)
        .map_err(|e| ClusterError::Config(e.to_string()))
}

#[derive(Default)]
struct Counters {
    leader_changes: AtomicU64,
    refused_peers: AtomicU64,
    links_dropped: AtomicU64,
    connections_refused: AtomicU64,
    bad_frames: AtomicU64,
    tls_refused: AtomicU64,
    lease_expiries: AtomicU64,
    lost_handed: AtomicU64,
}

struct Inner {
    id: u64,
    raft: Raft,
    sm: Arc<SmShared>,
    heard: Heard,
    counters: Counters,
    insecure: bool,
    tls: Option<ClusterTls>,
    /// When a refused TLS handshake was last logged.
    tls_refusal_logged: Mutex<Option<Instant>>,
    removed: AtomicBool,
    lease: Duration,
    /// This node's own lease.
    holder: Mutex<Holder>,
    /// The leases this node answered while leading.
    grants: Mutex<Grants>,
    /// False from when the lease ran out until it is renewed.
    lease_tx: watch::Sender<bool>,
    /// The last renewal confirmed: when it was sent, and when the lease
    /// runs out.
    until_tx: watch::Sender<Option<(std::time::Instant, std::time::Instant)>>,
    fences_tx: mpsc::Sender<OwnershipLost>,
    links_tx: mpsc::Sender<(u64, NodeStream)>,
    members_tx: watch::Sender<Members>,
    /// Orders to drain, for the broker (see `drain`); none until the
    /// broker asks for them.
    drains_tx: Mutex<Option<mpsc::Sender<DrainOrder>>>,
    /// Client ids this node was given from a node being removed, for the
    /// broker to serve from its copies.
    adopts_tx: Mutex<Option<mpsc::Sender<String>>>,
}

/// A running cluster node. Dropping it stops the listener; call
/// [`Cluster::shutdown`] to stop Raft too.
pub struct Cluster {
    inner: Arc<Inner>,
    local_addr: SocketAddr,
    members_rx: watch::Receiver<Members>,
    links_rx: Mutex<Option<mpsc::Receiver<(u64, NodeStream)>>>,
    lost_rx: Mutex<Option<mpsc::Receiver<OwnershipLost>>>,
    fences_rx: Mutex<Option<mpsc::Receiver<OwnershipLost>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let context = context.into();
    move |source| ClusterError::Io { context, source }
}

impl Cluster {
    /// Open (or create) the node's Raft state under `data_dir/cluster/`, bind
    /// the cluster listener, and start, join or rejoin.
    pub async fn start(cfg: ClusterConfig) -> Result<Cluster, ClusterError> {
        if cfg.node_id == 0 {
            return Err(ClusterError::Config("node id 0 is not allowed".into()));
        }
        if cfg.lease < lease::MIN_LEASE {
            return Err(ClusterError::Config(format!(
                "lease of {:?} is shorter than {:?}",
                cfg.lease,
                lease::MIN_LEASE
            )));
        }
        if cfg.listen.ip().is_unspecified() {
            return Err(ClusterError::Config(format!(
                "cluster listen address {} cannot be given to other nodes; use a specific address",
                cfg.listen
            )));
        }
        let dir = cfg.data_dir.join("cluster");
        let disk: Arc<dyn Disk> = Arc::new(
            FsDisk::open(dir.clone()).map_err(io(format!("cannot open {}", dir.display())))?,
        );
        let log = LogStore::open(disk.clone())
            .map_err(io(format!("cannot read the raft log in {}", dir.display())))?;
        let fresh = log.is_empty();
        let listener = TcpListener::bind(cfg.listen).await.map_err(io(format!(
            "cannot listen for cluster traffic on {}",
            cfg.listen
        )))?;
        let local_addr = listener.local_addr().map_err(io("cluster listener"))?;

        let (lost_tx, lost_rx) = mpsc::channel(LOST_QUEUE);
        let sm_shared = SmShared::new(cfg.node_id, lost_tx);
        let sm = StateMachine::open(disk, sm_shared.clone())
            .map_err(|e| ClusterError::Refused(format!("cannot read the raft snapshot: {e}")))?;
        let heard: Heard = Arc::default();
        let factory = TcpNetworkFactory {
            local: cfg.node_id,
            heard: heard.clone(),
            tls: cfg.tls.clone(),
        };
        let raft = Raft::new(cfg.node_id, raft_config()?, factory, log, sm)
            .await
            .map_err(|e| ClusterError::Refused(format!("raft did not start: {e}")))?;

        let (links_tx, links_rx) = mpsc::channel(LINK_QUEUE);
        let (fences_tx, fences_rx) = mpsc::channel(LOST_QUEUE);
        let (members_tx, members_rx) = watch::channel(Members::default());
        let inner = Arc::new(Inner {
            id: cfg.node_id,
            raft,
            sm: sm_shared,
            heard,
            counters: Counters::default(),
            insecure: cfg.insecure,
            tls: cfg.tls.clone(),
            tls_refusal_logged: Mutex::new(None),
            removed: AtomicBool::new(false),
            lease: cfg.lease,
            holder: Mutex::new(Holder::new(cfg.lease)),
            grants: Mutex::new(Grants::new(cfg.lease)),
            lease_tx: watch::channel(true).0,
            until_tx: watch::channel(None).0,
            fences_tx,
            links_tx,
            members_tx,
            drains_tx: Mutex::new(None),
            adopts_tx: Mutex::new(None),
        });
        let tasks = vec![
            tokio::spawn(accept_loop(inner.clone(), listener)),
            tokio::spawn(watch_metrics(inner.clone())),
            tokio::spawn(keep_lease(inner.clone())),
            tokio::spawn(hand_over_lost(inner.clone())),
        ];
        let cluster = Cluster {
            inner,
            local_addr,
            members_rx,
            links_rx: Mutex::new(Some(links_rx)),
            lost_rx: Mutex::new(Some(lost_rx)),
            fences_rx: Mutex::new(Some(fences_rx)),
            tasks,
        };
        let me = NodeInfo {
            cluster_addr: cfg.advertise_cluster.unwrap_or(local_addr).to_string(),
            mqtt_addr: cfg.advertise.map(|a| a.to_string()),
        };
        match (fresh, cfg.join) {
            (true, None) => {
                let nodes = BTreeMap::from([(cfg.node_id, me)]);
                cluster
                    .inner
                    .raft
                    .initialize(nodes)
                    .await
                    .map_err(|e| ClusterError::Refused(format!("cannot initialise: {e}")))?;
                tracing::info!(node_id = cfg.node_id, %local_addr, "started a one-node cluster");
            }
            (true, Some(addr)) => {
                cluster.join(addr, me).await?;
                tracing::info!(node_id = cfg.node_id, %addr, "joined the cluster");
            }
            (false, join) => {
                if join.is_some() {
                    tracing::info!(
                        "the data dir holds cluster state: rejoining from it, --join ignored"
                    );
                }
                tracing::info!(node_id = cfg.node_id, %local_addr, "rejoining the cluster from the data dir");
            }
        }
        Ok(cluster)
    }

    async fn join(&self, addr: SocketAddr, me: NodeInfo) -> Result<(), ClusterError> {
        let env = Envelope {
            req: admin::Request::Join {
                node_id: self.inner.id,
                node: me,
            },
            forwarded: false,
        };
        let mut pause = Duration::from_millis(100);
        let mut why = String::new();
        for attempt in 1..=JOIN_ATTEMPTS {
            match admin::call(
                &addr.to_string(),
                self.inner.id,
                &env,
                self.inner.tls.as_ref(),
            )
            .await
            {
                Ok(Reply::Done) => return Ok(()),
                Ok(Reply::Error(e)) => why = e,
                Ok(other) => why = format!("unexpected answer {other:?}"),
                Err(e) => why = e.to_string(),
            }
            tracing::info!(attempt, %addr, %why, "join not done yet; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(JOIN_MAX_BACKOFF);
        }
        Err(ClusterError::Join { addr, why })
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.inner.id
    }

    /// Where the cluster listener is bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The membership, updated as the log is applied here.
    pub fn members(&self) -> watch::Receiver<Members> {
        self.members_rx.clone()
    }

    /// Links other nodes opened to this one, with their node id. Only the
    /// first call gets the receiver.
    pub fn take_links(&self) -> Option<mpsc::Receiver<(u64, NodeStream)>> {
        self.links_rx.lock().ok()?.take()
    }

    /// Client ids this node served and another node has claimed. Only the
    /// first call gets the receiver.
    pub fn take_ownership_lost(&self) -> Option<mpsc::Receiver<OwnershipLost>> {
        self.lost_rx.lock().ok()?.take()
    }

    /// Client ids the leader is about to give to another node: the local
    /// connection must go now, before the claim commits (see `lease`). The
    /// applied table still names this node; `epoch` is 0. Only the first
    /// call gets the receiver; when full, fences are refused and the leader
    /// waits for this node's lease instead.
    pub fn take_fences(&self) -> Option<mpsc::Receiver<OwnershipLost>> {
        self.fences_rx.lock().ok()?.take()
    }

    /// Orders to drain this node before it is removed (see `drain`): the
    /// broker sends its clients elsewhere and answers. Only the first call
    /// gets the receiver; without one, the node is removed undrained.
    pub fn take_drains(&self) -> Option<mpsc::Receiver<DrainOrder>> {
        let mut tx = self.inner.drains_tx.lock().ok()?;
        if tx.is_some() {
            return None;
        }
        // One drain at a time: a second is refused while one runs.
        let (drains_tx, drains_rx) = mpsc::channel(1);
        *tx = Some(drains_tx);
        Some(drains_rx)
    }

    /// Client ids given to this node from a node being removed (see
    /// `drain`): the broker serves each from its copy. Only the first call
    /// gets the receiver; when full, the rest are refused and their
    /// clients find the copies when they connect.
    pub fn take_adopts(&self) -> Option<mpsc::Receiver<String>> {
        let mut tx = self.inner.adopts_tx.lock().ok()?;
        if tx.is_some() {
            return None;
        }
        let (adopts_tx, adopts_rx) = mpsc::channel(LOST_QUEUE);
        *tx = Some(adopts_tx);
        Some(adopts_rx)
    }

    /// Open a link to member `node_id`: its cluster listener, `Link` hello
    /// sent; what follows is the caller's.
    pub async fn dial_link(&self, node_id: u64) -> Result<NodeStream, ClusterError> {
        let addr = self
            .members_rx
            .borrow()
            .nodes
            .get(&node_id)
            .map(|m| m.cluster_addr.clone())
            .ok_or_else(|| ClusterError::Refused(format!("node {node_id} is not a member")))?;
        let mut s = tls::connect(&addr, self.inner.tls.as_ref(), Duration::from_secs(3))
            .await
            .map_err(|e| ClusterError::Unreachable {
                addr: addr.clone(),
                why: e.to_string(),
            })?;
        let hello = Hello {
            kind: Kind::Link,
            from: self.inner.id,
        };
        frame::write(&mut s, &hello)
            .await
            .map_err(io(format!("link hello to {addr}")))?;
        Ok(s)
    }

    /// Make this node the owner of `client_id`, through the leader's log:
    /// the owner and its epoch, which rises with every claim of that id.
    /// An error (no leader yet, leader changed mid-write) leaves the claim
    /// unknown: retry; a claim that did commit only raises the epoch.
    pub async fn claim(&self, client_id: &str) -> Result<(u64, u64), ClusterError> {
        self.claim_from(client_id)
            .await
            .map(|(owner, epoch, _)| (owner, epoch))
    }

    /// [`Cluster::claim`], with the owner before it that is not this node,
    /// as the log's table had it when the claim applied (`None`: no owner
    /// there).
    pub async fn claim_from(
        &self,
        client_id: &str,
    ) -> Result<(u64, u64, Option<Previous>), ClusterError> {
        self.claim_starting(client_id, false).await
    }

    /// [`Cluster::claim_from`] for a client that connects with
    /// `clean_start`: the owner it is taken from hears so in its fence
    /// ([`OwnershipLost::clean_start`]).
    pub async fn claim_starting(
        &self,
        client_id: &str,
        clean_start: bool,
    ) -> Result<(u64, u64, Option<Previous>), ClusterError> {
        let req = admin::Request::Claim {
            client_id: client_id.to_string(),
            node_id: self.inner.id,
            clean_start,
        };
        match self.ask_claim(req).await {
            Reply::Claimed {
                owner,
                epoch,
                previous,
                lapsed,
            } => Ok((
                owner,
                epoch,
                previous.map(|(node, epoch)| Previous {
                    node,
                    epoch,
                    lapsed,
                }),
            )),
            Reply::Error(e) => Err(ClusterError::Refused(e)),
            other => Err(ClusterError::Refused(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    /// Take `client_id` for this node only if `owner` still owns it (at
    /// `epoch`; 0: any epoch) and `owner` has surely let go of it: its lease
    /// ran out on the leader's view (`grants().takeover(owner, now)` is
    /// Ok). For a node holding a copy of the session of an owner that
    /// died: unlike [`Cluster::claim`], it never fences a live owner, and
    /// never takes the id from a node that took it meanwhile (pass the
    /// epoch seen, so that the owner's own later claim counts as a move).
    /// Err: try again later (the owner's lease may still run, or the owner
    /// is the leader itself; no leader; the write failed).
    pub async fn claim_orphan(
        &self,
        client_id: &str,
        owner: u64,
        epoch: u64,
    ) -> Result<OrphanClaim, ClusterError> {
        self.ask_orphan(client_id, owner, epoch, false).await
    }

    /// [`Cluster::claim_orphan`] of a client id whose connection under
    /// `owner`'s claim `epoch` (not 0) is known to have ended: a run of
    /// `owner` that ended (the caller saw a new run link to it after its
    /// copy was written), or this node's own client dropped when its lease
    /// ran out (`owner` this node, the lease back). No lease needs to run
    /// out: granted as soon as `owner` still holds the id under that very
    /// `epoch` (a client back since has a newer claim, which moves the id
    /// on). For the wills those connections never had published.
    pub async fn claim_ended(
        &self,
        client_id: &str,
        owner: u64,
        epoch: u64,
    ) -> Result<OrphanClaim, ClusterError> {
        if epoch == 0 {
            return Err(ClusterError::Refused(
                "a claim of an ended connection needs its epoch".into(),
            ));
        }
        self.ask_orphan(client_id, owner, epoch, true).await
    }

    async fn ask_orphan(
        &self,
        client_id: &str,
        owner: u64,
        epoch: u64,
        ended: bool,
    ) -> Result<OrphanClaim, ClusterError> {
        let req = admin::Request::ClaimOrphan {
            client_id: client_id.to_string(),
            node_id: self.inner.id,
            owner,
            epoch,
            ended,
        };
        match self.ask_claim(req).await {
            Reply::Claimed {
                owner,
                epoch,
                previous,
                ..
            } if owner == self.inner.id => Ok(OrphanClaim::Claimed { epoch, previous }),
            Reply::Moved => Ok(OrphanClaim::Moved),
            Reply::Error(e) => Err(ClusterError::Refused(e)),
            other => Err(ClusterError::Refused(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    /// Send a claim (`Claim` or `ClaimOrphan`) to the leader. Granted, it
    /// was committed by a quorum after it was sent: as good as a renewal
    /// of this node's lease.
    async fn ask_claim(&self, req: admin::Request) -> Reply {
        let sent = Instant::now();
        let reply = self.inner.on_leader(req, false).await;
        if matches!(reply, Reply::Claimed { owner, .. } if owner == self.inner.id) {
            self.inner.renewed(sent);
        }
        reply
    }

    /// Forget `client_id` unless a later claim has moved it on.
    pub async fn release(&self, client_id: &str, epoch: u64) -> Result<(), ClusterError> {
        let req = admin::Request::Release {
            client_id: client_id.to_string(),
            epoch,
        };
        match self.inner.on_leader(req, false).await {
            Reply::Done => Ok(()),
            Reply::Error(e) => Err(ClusterError::Refused(e)),
            other => Err(ClusterError::Refused(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    /// Owner and epoch of `client_id` as applied on this node (may lag the
    /// leader; use [`Cluster::claim`] to act on it).
    pub fn owner(&self, client_id: &str) -> Option<(u64, u64)> {
        self.inner.sm.owner(client_id)
    }

    /// Status as the leader sees it (this node's view when no leader
    /// answers).
    pub async fn status(&self) -> ClusterStatus {
        match self.inner.on_leader(admin::Request::Status, false).await {
            Reply::Status(s) => *s,
            _ => self.inner.local_status(),
        }
    }

    /// Remove `node_id` from the cluster, after it drained (see `drain`);
    /// it is told to stop its Raft node.
    pub async fn remove(&self, node_id: u64) -> Result<(), ClusterError> {
        let req = admin::Request::Remove {
            node_id,
            drain_ms: crate::drain::DEFAULT_DRAIN.as_millis() as u64,
        };
        match self.inner.on_leader(req, false).await {
            Reply::Removed(_) => Ok(()),
            Reply::Error(e) => Err(ClusterError::Refused(e)),
            other => Err(ClusterError::Refused(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    /// Stop Raft and the listener.
    pub async fn shutdown(&self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.inner.raft.shutdown().await;
    }

    /// Members in the applied membership.
    pub fn member_count(&self) -> usize {
        self.members_rx.borrow().nodes.len()
    }

    /// Leader changes seen since start.
    pub fn leader_changes(&self) -> u64 {
        self.inner.counters.leader_changes.load(Ordering::Relaxed)
    }

    /// Entries each follower is behind (only on the leader; empty elsewhere).
    pub fn replication_lag(&self) -> BTreeMap<u64, u64> {
        self.inner
            .local_status()
            .members
            .iter()
            .filter_map(|m| m.lag.map(|l| (m.node_id, l)))
            .collect()
    }

    /// Claims applied on this node.
    pub fn claims(&self) -> u64 {
        self.inner.sm.lock().claims
    }

    /// Claims that moved a client id between nodes.
    pub fn fenced_takeovers(&self) -> u64 {
        self.inner.sm.lock().fenced_takeovers
    }

    /// Ownership-loss events dropped on a full queue.
    pub fn ownership_events_dropped(&self) -> u64 {
        self.inner.sm.events_dropped()
    }

    /// Connections refused: non-loopback without `insecure`, or over the
    /// connection limit.
    pub fn connections_refused(&self) -> u64 {
        self.inner.counters.refused_peers.load(Ordering::Relaxed)
            + self
                .inner
                .counters
                .connections_refused
                .load(Ordering::Relaxed)
    }

    /// Connections closed for a malformed or oversized frame.
    pub fn bad_frames(&self) -> u64 {
        self.inner.counters.bad_frames.load(Ordering::Relaxed)
    }

    /// Connections whose TLS handshake failed (no certificate, one from
    /// another CA, not TLS at all).
    pub fn tls_refused(&self) -> u64 {
        self.inner.counters.tls_refused.load(Ordering::Relaxed)
    }

    /// Whether this node holds its ownership lease: false from when it ran
    /// out (no majority heard within the lease) until it is renewed. The
    /// broker drops the clients it owns when it turns false.
    pub fn lease(&self) -> watch::Receiver<bool> {
        self.inner.lease_tx.subscribe()
    }

    /// The last renewal of this node's lease confirmed: when it was sent,
    /// and when the lease runs out (`None`: never renewed yet). The broker
    /// stops delivering past it even before [`Cluster::lease`] says so
    /// (after a pause, other tasks may run first), and holds what a
    /// renewal sent later must confirm.
    pub fn lease_until(&self) -> watch::Receiver<Option<(std::time::Instant, std::time::Instant)>> {
        self.inner.until_tx.subscribe()
    }

    /// Times the lease ran out.
    pub fn lease_expiries(&self) -> u64 {
        self.inner.counters.lease_expiries.load(Ordering::Relaxed)
    }

    /// Client ids this node, leading, handed from a member whose lease ran
    /// out to another member.
    pub fn lost_handed(&self) -> u64 {
        self.inner.counters.lost_handed.load(Ordering::Relaxed)
    }

    /// Links closed because the broker was not taking them.
    pub fn links_dropped(&self) -> u64 {
        self.inner.counters.links_dropped.load(Ordering::Relaxed)
    }
}

fn write_error(e: RaftError<u64, ClientWriteError<u64, NodeInfo>>) -> Reply {
    Reply::Error(e.to_string())
}

impl Inner {
    fn leader_info(&self) -> Option<(u64, NodeInfo)> {
        let m = self.raft.metrics().borrow().clone();
        let leader = m.current_leader?;
        let node = m.membership_config.membership().get_node(&leader)?.clone();
        Some((leader, node))
    }

    /// Run `req` here when this node leads, else pass it to the leader once.
    async fn on_leader(&self, req: admin::Request, forwarded: bool) -> Reply {
        match self.leader_info() {
            Some((leader, _)) if leader == self.id => self.as_leader(req).await,
            _ if matches!(
                req,
                admin::Request::Removed
                    | admin::Request::Fence { .. }
                    | admin::Request::Drain { .. }
                    | admin::Request::Adopt { .. }
            ) =>
            {
                self.as_leader(req).await
            }
            Some((leader, node)) if !forwarded => {
                let env = Envelope {
                    req: req.clone(),
                    forwarded: true,
                };
                // A leader that stopped answering (paused, partitioned) is
                // replaced within about a second: give up on it quickly so
                // that a status falls back to this node's view and a claim
                // can be tried again with the next leader.
                let quick = matches!(
                    req,
                    admin::Request::Status
                        | admin::Request::Renew { .. }
                        | admin::Request::Claim { .. }
                        | admin::Request::ClaimOrphan { .. }
                        | admin::Request::Release { .. }
                );
                let answer = if let admin::Request::Remove { drain_ms, .. } = req {
                    let limit = admin::remove_timeout(Duration::from_millis(drain_ms));
                    admin::call_within(&node.cluster_addr, self.id, &env, self.tls.as_ref(), limit)
                        .await
                } else if quick {
                    match timeout(
                        FORWARD_TIMEOUT,
                        admin::call(&node.cluster_addr, self.id, &env, self.tls.as_ref()),
                    )
                    .await
                    {
                        Ok(r) => r,
                        Err(_) => Err(ClusterError::Unreachable {
                            addr: node.cluster_addr.clone(),
                            why: "no answer within 2 s".into(),
                        }),
                    }
                } else {
                    admin::call(&node.cluster_addr, self.id, &env, self.tls.as_ref()).await
                };
                match answer {
                    Ok(r) => r,
                    Err(e) if matches!(req, admin::Request::Status) => {
                        tracing::debug!(leader, %e, "leader did not answer status");
                        Reply::Status(Box::new(self.local_status()))
                    }
                    Err(e) => Reply::Error(format!("leader {leader}: {e}")),
                }
            }
            _ if matches!(req, admin::Request::Status) => {
                Reply::Status(Box::new(self.local_status()))
            }
            _ => Reply::Error("no leader known yet; try again".into()),
        }
    }

    async fn as_leader(&self, req: admin::Request) -> Reply {
        match req {
            admin::Request::Status => Reply::Status(Box::new(self.local_status())),
            admin::Request::Claim {
                client_id,
                node_id,
                clean_start,
            } => {
                let mut gone = self.let_go(&client_id, node_id, clean_start).await;
                if let Err(wait) = gone {
                    if wait <= lease::CLAIM_HOLD {
                        // Due soon: answer when it is due rather than have
                        // the claimant retry, checked again then (this
                        // node may have lost the lead meanwhile).
                        tokio::time::sleep(wait).await;
                        gone = self.let_go(&client_id, node_id, clean_start).await;
                    }
                }
                let by_lease = match gone {
                    Ok(by_lease) => by_lease,
                    Err(wait) => {
                        return Reply::Error(format!(
                            "client id {client_id:?} is owned by a node out of touch: \
                             it may be taken in {} ms, when that node's lease has run out",
                            wait.as_millis()
                        ))
                    }
                };
                let cmd = Command::Claim {
                    client_id,
                    node: node_id,
                    clean_start,
                    by_lease,
                };
                self.write_claim(cmd, node_id, by_lease).await
            }
            admin::Request::ClaimOrphan {
                client_id,
                node_id,
                owner,
                epoch,
                ended,
            } => {
                self.claim_orphan(client_id, node_id, owner, epoch, ended && epoch > 0)
                    .await
            }
            admin::Request::Release { client_id, epoch } => {
                match self
                    .raft
                    .client_write(Command::Release { client_id, epoch })
                    .await
                {
                    Ok(_) => Reply::Done,
                    Err(e) => write_error(e),
                }
            }
            admin::Request::Fence {
                client_id,
                new_owner,
                clean_start,
                before,
            } => {
                let fence = OwnershipLost {
                    client_id,
                    new_owner,
                    epoch: 0,
                    clean_start,
                    // Answered: it lets go itself.
                    lapsed: false,
                    before,
                };
                match self.fences_tx.try_send(fence) {
                    Ok(()) => Reply::Done,
                    Err(_) => Reply::Error("fence queue full".into()),
                }
            }
            admin::Request::Renew { node_id } => {
                let member = self
                    .raft
                    .metrics()
                    .borrow()
                    .membership_config
                    .membership()
                    .get_node(&node_id)
                    .is_some();
                if !member {
                    return Reply::Error(format!("node {node_id} is not a member"));
                }
                if lease::confirm(&self.raft, self.lease / 2).await {
                    self.grants().answered(node_id, Instant::now());
                    Reply::Done
                } else {
                    Reply::Error("leadership not confirmed by a quorum".into())
                }
            }
            admin::Request::Join { node_id, node } => self.add_node(node_id, node).await,
            admin::Request::Remove { node_id, drain_ms } => {
                let drain = Duration::from_millis(drain_ms).min(crate::drain::MAX_DRAIN);
                self.remove_node(node_id, drain).await
            }
            admin::Request::Adopt { client_ids } => {
                let n = client_ids.len();
                let taken = self.adopt_here(client_ids);
                if taken == n {
                    Reply::Done
                } else {
                    Reply::Error(format!("{} of {n} client ids not taken", n - taken))
                }
            }
            admin::Request::Drain {
                reference,
                drain_ms,
            } => {
                let drain = Duration::from_millis(drain_ms).min(crate::drain::MAX_DRAIN);
                match self.drain_here(reference, drain).await {
                    Ok(r) => Reply::Drained(r),
                    Err(e) => Reply::Error(e),
                }
            }
            admin::Request::Removed => {
                if !self.removed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        node_id = self.id,
                        "this node was removed from the cluster; stopping its raft node"
                    );
                    let raft = self.raft.clone();
                    tokio::spawn(async move {
                        let _ = raft.shutdown().await;
                    });
                }
                Reply::Done
            }
        }
    }

    async fn add_node(&self, node_id: u64, node: NodeInfo) -> Reply {
        if node_id == 0 {
            return Reply::Error("node id 0 is not allowed".into());
        }
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        if let Some(known) = membership.get_node(&node_id) {
            if known.cluster_addr != node.cluster_addr {
                return Reply::Error(format!(
                    "node id {node_id} is already a member at {}",
                    known.cluster_addr
                ));
            }
        }
        let is_voter = membership.voter_ids().any(|v| v == node_id);
        if is_voter {
            return Reply::Done;
        }
        // Blocking: returns once the learner has caught up, so promoting it
        // does not stall commits.
        if let Err(e) = self.raft.add_learner(node_id, node, true).await {
            return write_error(e);
        }
        let add = ChangeMembers::AddVoterIds(BTreeSet::from([node_id]));
        match self.raft.change_membership(add, false).await {
            Ok(_) => {
                tracing::info!(node_id, "node added to the cluster");
                Reply::Done
            }
            Err(e) => write_error(e),
        }
    }

    async fn remove_node(&self, node_id: u64, drain: Duration) -> Reply {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let Some(node) = membership.get_node(&node_id).cloned() else {
            return Reply::Error(format!("node {node_id} is not a member"));
        };
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let change = if voters.contains(&node_id) {
            if voters.len() == 1 {
                return Reply::Error(format!(
                    "node {node_id} is the only voter; it cannot be removed"
                ));
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([node_id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([node_id]))
        };
        // Without a quorum the change could not commit: say so before the
        // node's clients are sent away.
        if !lease::confirm(&self.raft, FORWARD_TIMEOUT).await {
            return Reply::Error(format!(
                "no quorum: leader {} could not confirm its leadership with a majority; \
                 node {node_id} was not removed",
                self.id
            ));
        }
        let mut report = self.drain_node(node_id, &node, drain).await;
        report.node_id = node_id;
        if let Err(e) = self.raft.change_membership(change, false).await {
            return write_error(e);
        }
        tracing::info!(node_id, "node removed from the cluster");
        self.grants().forget(node_id);
        // Told after the change is committed; best effort: a node that does
        // not hear it is no longer replicated to and cannot win a vote.
        let from = self.id;
        let tls = self.tls.clone();
        tokio::spawn(async move {
            let env = Envelope {
                req: admin::Request::Removed,
                forwarded: true,
            };
            if let Err(e) = admin::call(&node.cluster_addr, from, &env, tls.as_ref()).await {
                tracing::info!(node_id, %e, "removed node not told");
            }
        });
        Reply::Removed(report)
    }

    /// Before `node_id` is removed: its clients go to the lowest-id other
    /// member heard from lately (it holds copies of the node's sessions,
    /// see the broker's replica sets), and the node answers once they
    /// moved or `drain` is over. A node not heard from lately is removed
    /// undrained, as is one that does not answer.
    async fn drain_node(&self, node_id: u64, node: &NodeInfo, drain: Duration) -> RemoveReport {
        let m = self.raft.metrics().borrow().clone();
        let alive = self.heard_lately(Instant::now());
        let target = m
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, n)| **id != node_id && alive(**id) && n.mqtt_addr.is_some())
            .map(|(id, n)| (*id, n.mqtt_addr.clone()))
            .next();
        let mut report = RemoveReport {
            target: target.as_ref().map(|t| t.0),
            reference: target.and_then(|t| t.1),
            ..Default::default()
        };
        if !alive(node_id) {
            report.note = Some(format!(
                "node {node_id} was not heard from lately: removed without draining; \
                 its sessions are served from their copies"
            ));
            return report;
        }
        let drained = if node_id == self.id {
            self.drain_here(report.reference.clone(), drain).await
        } else {
            let env = Envelope {
                req: admin::Request::Drain {
                    reference: report.reference.clone(),
                    drain_ms: drain.as_millis() as u64,
                },
                forwarded: true,
            };
            let limit = drain + FORWARD_TIMEOUT * 5;
            match admin::call_within(&node.cluster_addr, self.id, &env, self.tls.as_ref(), limit)
                .await
            {
                Ok(Reply::Drained(r)) => Ok(r),
                Ok(Reply::Error(e)) => Err(e),
                Ok(other) => Err(format!("unexpected answer {other:?}")),
                Err(e) => Err(e.to_string()),
            }
        };
        match drained {
            Ok(r) => {
                tracing::info!(
                    node_id,
                    clients_told = r.clients_told,
                    sessions_moved = r.sessions_moved,
                    sessions_left = r.sessions_left,
                    "node drained"
                );
                if let Some(t) = report.target {
                    report.sessions_handed = self.hand_over(node_id, t).await;
                }
                report.drain = Some(r);
            }
            Err(e) => {
                tracing::warn!(node_id, error = %e, "node did not drain; removing it anyway");
                report.note = Some(format!(
                    "node {node_id} did not drain ({e}); removed anyway"
                ));
            }
        }
        report
    }

    /// The client ids `node_id` still owns (after its drain, or once it
    /// is lost) go to `target` (each fenced on `node_id` and claimed for
    /// `target` as a takeover would), which is then told to serve them
    /// from its copies. Returns how many it took.
    async fn hand_over(&self, node_id: u64, target: u64) -> u64 {
        let ids = self.owned_by(node_id);
        self.hand_over_ids(node_id, target, ids).await
    }

    /// The client ids `node_id` owns, as applied here.
    fn owned_by(&self, node_id: u64) -> Vec<String> {
        let sm = self.sm.lock();
        sm.owners
            .iter()
            .filter(|(_, (owner, _))| *owner == node_id)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// [`Inner::hand_over`] of `ids`, a snapshot of those `node_id` owned:
    /// each may have moved on since (its client reconnected to another
    /// node during the drain, or another node took it with
    /// [`Cluster::claim_orphan`]). Such an id is left to its new owner:
    /// skipped before the fence (which would reach that live owner), and
    /// claimed only on the condition that `node_id` still owns it when the
    /// claim is applied (else `Moved`: neither counted nor adopted).
    async fn hand_over_ids(&self, node_id: u64, target: u64, ids: Vec<String>) -> u64 {
        let mut claimed = Vec::new();
        for id in ids {
            if !held_by(self.sm.owner(&id), node_id, 0) {
                continue;
            }
            if self.let_go(&id, target, false).await.is_err() {
                continue;
            }
            let cmd = Command::ClaimOrphan {
                client_id: id.clone(),
                node: target,
                owner: node_id,
                epoch: 0,
            };
            if let Ok(r) = self.raft.client_write(cmd).await {
                if matches!(r.data, SmReply::Claimed { owner, .. } if owner == target) {
                    claimed.push(id);
                }
            }
        }
        let addr = self.member_addr(target);
        let mut taken = 0;
        for batch in claimed.chunks(crate::drain::ADOPT_BATCH) {
            if target == self.id {
                taken += self.adopt_here(batch.to_vec()) as u64;
                continue;
            }
            let Some(addr) = &addr else { break };
            let env = Envelope {
                req: admin::Request::Adopt {
                    client_ids: batch.to_vec(),
                },
                forwarded: true,
            };
            match admin::call(addr, self.id, &env, self.tls.as_ref()).await {
                Ok(Reply::Done) => taken += batch.len() as u64,
                other => tracing::info!(target, ?other, "sessions not all handed over"),
            }
        }
        taken
    }

    /// Client ids given to this node: for the broker to serve.
    fn adopt_here(&self, ids: Vec<String>) -> usize {
        let Ok(tx) = self.adopts_tx.lock() else {
            return 0;
        };
        let Some(tx) = tx.as_ref() else {
            return 0;
        };
        ids.into_iter()
            .take_while(|id| tx.try_send(id.clone()).is_ok())
            .count()
    }

    /// This node is about to be removed: the broker drains it.
    async fn drain_here(
        &self,
        reference: Option<String>,
        drain: Duration,
    ) -> Result<DrainReport, String> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let order = DrainOrder {
            reference,
            deadline: drain,
            reply,
        };
        let sent = self
            .drains_tx
            .lock()
            .map_err(|_| "drain channel poisoned".to_string())?
            .as_ref()
            .map(|tx| tx.try_send(order));
        if !matches!(sent, Some(Ok(()))) {
            return Err("a drain is already running here, or nothing drains this node".into());
        }
        // The broker answers at its deadline; a little more for the reply.
        match timeout(drain + FORWARD_TIMEOUT, answer).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err("the broker stopped before it drained".into()),
            Err(_) => Err(format!("not drained within {} s", drain.as_secs())),
        }
    }

    fn local_status(&self) -> ClusterStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let leading = m.state == ServerState::Leader;
        let last_index = m.last_log_index.unwrap_or(0);
        let heard = self.heard.lock().map(|h| h.clone()).unwrap_or_default();
        let now = Instant::now();
        let members = membership
            .nodes()
            .map(|(&node_id, node)| {
                let role = if m.current_leader == Some(node_id) {
                    "leader"
                } else if voters.contains(&node_id) {
                    "follower"
                } else {
                    "learner"
                };
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&node_id).copied())
                    .map(|l| l.map_or(0, |l| l.index));
                let healthy = if node_id == self.id {
                    m.running_state.is_ok()
                } else if leading {
                    heard
                        .get(&node_id)
                        .is_some_and(|t| now.duration_since(*t) < HEALTHY_WITHIN)
                } else {
                    false
                };
                MemberStatus {
                    node_id,
                    cluster_addr: node.cluster_addr.clone(),
                    mqtt_addr: node.mqtt_addr.clone(),
                    role: role.into(),
                    healthy,
                    matched,
                    lag: matched.map(|i| last_index.saturating_sub(i)),
                }
            })
            .collect();
        let sm = self.sm.lock();
        ClusterStatus {
            answered_by: self.id,
            leader_id: m.current_leader,
            term: m.current_term,
            last_applied: m.last_applied.map(|l| l.index),
            leader_changes: self.counters.leader_changes.load(Ordering::Relaxed),
            client_ids: sm.owners.len() as u64,
            claims: sm.claims,
            fenced_takeovers: sm.fenced_takeovers,
            members,
        }
    }
}

/// Renew this node's lease every `lease / 8`, at once when a new leader
/// is known, and tell the broker the moment it runs out.
async fn keep_lease(inner: Arc<Inner>) {
    let every = lease::renew_every(inner.lease);
    let within = lease::renew_within(inner.lease);
    let mut metrics = inner.raft.metrics();
    let mut leader = metrics.borrow_and_update().current_leader;
    loop {
        let sent = Instant::now();
        let ask = inner.on_leader(admin::Request::Renew { node_id: inner.id }, false);
        if let Ok(Reply::Done) = watch_expiry(&inner, timeout(within, ask)).await {
            inner.renewed(sent);
        }
        let next = new_leader(&mut metrics, &mut leader, sent + every);
        watch_expiry(&inner, next).await;
    }
}

/// On the leader: the client ids of a member whose lease ran out and that
/// has not been heard from for [`lost_after`] (dead, or cut off from the
/// majority that long) go to the lowest-id member heard from lately,
/// which serves their sessions from its copies, as after a drain
/// (`Inner::hand_over`). Messages for them are then queued there, not
/// stranded until each client comes back (see the broker's `strand`). A
/// member that comes back finds them gone, as after any takeover.
///
/// Judged over that whole time, by checks each made while this node led
/// and held its own lease: a leader paused past its lease (SIGSTOP) wakes
/// up having heard from nobody, and must not hand every live node's
/// sessions away on that stale view.
async fn hand_over_lost(inner: Arc<Inner>) {
    let every = inner.lease / 2;
    let after = lost_after(inner.lease);
    // Since when each member has been seen lost, check after check.
    let mut suspect: BTreeMap<u64, Instant> = BTreeMap::new();
    loop {
        tokio::time::sleep(every).await;
        if inner.removed.load(Ordering::Relaxed) {
            return;
        }
        let m = inner.raft.metrics().borrow().clone();
        let now = Instant::now();
        if m.current_leader != Some(inner.id) || !inner.holder().held(now) {
            suspect.clear();
            continue;
        }
        let alive = inner.heard_lately(now);
        // Ascending: the lowest-id live member holds the copies first.
        let members: Vec<u64> = m
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect();
        let owning: BTreeSet<u64> = {
            let sm = inner.sm.lock();
            sm.owners.values().map(|(owner, _)| *owner).collect()
        };
        suspect.retain(|id, _| members.contains(id));
        for &lost in &members {
            if lost == inner.id
                || !owning.contains(&lost)
                || alive(lost)
                || inner.grants().takeover(lost, now).is_err()
            {
                suspect.remove(&lost);
                continue;
            }
            let since = *suspect.entry(lost).or_insert(now);
            if now.duration_since(since) < after {
                continue;
            }
            suspect.remove(&lost);
            let Some(&target) = members.iter().find(|&&t| t != lost && alive(t)) else {
                continue;
            };
            let n = inner.hand_over(lost, target).await;
            inner.counters.lost_handed.fetch_add(n, Ordering::Relaxed);
            tracing::warn!(
                node_id = lost,
                target,
                sessions = n,
                "a node's lease ran out: its client ids were handed to another node"
            );
        }
    }
}

/// How long a member must have been lost (its lease run out, not heard
/// from) before the leader hands its client ids over: four leases, so
/// that a pause, a cut or a restart of a few seconds leaves them where
/// they are (its clients come back to it, or take their sessions
/// elsewhere themselves).
pub(crate) fn lost_after(lease: Duration) -> Duration {
    lease * 4
}

/// Wait until `at`, or until a leader other than `leader` is known (it
/// becomes `leader`).
async fn new_leader(
    metrics: &mut watch::Receiver<openraft::RaftMetrics<u64, NodeInfo>>,
    leader: &mut Option<u64>,
    at: Instant,
) {
    let until = tokio::time::sleep_until(at);
    tokio::pin!(until);
    loop {
        tokio::select! {
            _ = &mut until => return,
            changed = metrics.changed() => {
                if changed.is_err() {
                    return (&mut until).await;
                }
                let now = metrics.borrow_and_update().current_leader;
                if now != *leader {
                    *leader = now;
                    if now.is_some() {
                        return;
                    }
                }
            }
        }
    }
}

/// Run `f`, expiring the lease on time meanwhile.
async fn watch_expiry<F: std::future::Future>(inner: &Inner, f: F) -> F::Output {
    tokio::pin!(f);
    loop {
        let until = inner.holder().until().filter(|_| *inner.lease_tx.borrow());
        let Some(until) = until else {
            return f.await;
        };
        tokio::select! {
            out = &mut f => return out,
            _ = tokio::time::sleep_until(until) => inner.expire_if_due(),
        }
    }
}

/// Follow openraft's metrics: count leader changes, publish and log
/// membership changes, and note when this node starts or stops leading.
async fn watch_metrics(inner: Arc<Inner>) {
    let mut rx = inner.raft.metrics();
    let mut leader = None;
    loop {
        let members = {
            let m = rx.borrow_and_update();
            let leading = (m.state == ServerState::Leader).then_some(m.current_term);
            inner.grants().role(leading, Instant::now());
            if m.current_leader != leader {
                leader = m.current_leader;
                if let Some(l) = leader {
                    inner
                        .counters
                        .leader_changes
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::info!(leader = l, term = m.current_term, "cluster leader");
                }
            }
            let membership = m.membership_config.membership();
            let voters: BTreeSet<u64> = membership.voter_ids().collect();
            Members {
                leader,
                nodes: membership
                    .nodes()
                    .map(|(&id, n)| {
                        let member = Member {
                            cluster_addr: n.cluster_addr.clone(),
                            mqtt_addr: n.mqtt_addr.clone(),
                            voter: voters.contains(&id),
                        };
                        (id, member)
                    })
                    .collect(),
            }
        };
        inner.members_tx.send_if_modified(|old| {
            if *old == members {
                return false;
            }
            if old.nodes != members.nodes {
                let ids: Vec<u64> = members.nodes.keys().copied().collect();
                tracing::info!(members = ?ids, "cluster membership changed");
            }
            *old = members;
            true
        });
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Without TLS only loopback peers are trusted, unless `insecure`; with
/// TLS the certificate decides.
fn peer_allowed(ip: std::net::IpAddr, insecure: bool, tls: bool) -> bool {
    insecure || tls || ip.is_loopback()
}

/// Refusals are logged at most this often (a scanner must not flood the
/// log); the counter has them all.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

async fn accept_loop(inner: Arc<Inner>, listener: TcpListener) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut last_refusal_log: Option<Instant> = None;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: pause instead of spinning.
                tracing::warn!(%e, "cluster accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if !peer_allowed(peer.ip(), inner.insecure, inner.tls.is_some()) {
            let refused = inner.counters.refused_peers.fetch_add(1, Ordering::Relaxed) + 1;
            if last_refusal_log.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY) {
                last_refusal_log = Some(Instant::now());
                tracing::warn!(%peer, refused, "{REFUSED_NON_LOOPBACK}");
            }
            continue;
        }
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            inner
                .counters
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, "too many cluster connections; closed");
            continue;
        };
        let inner = inner.clone();
        tokio::spawn(async move {
            let stream = match tls::accept(stream, inner.tls.as_ref(), HELLO_TIMEOUT).await {
                Ok(s) => s,
                Err(e) => {
                    inner.tls_refused(peer, &e);
                    drop(permit);
                    return;
                }
            };
            if let Err(e) = serve_connection(&inner, stream).await {
                if e.kind() == std::io::ErrorKind::InvalidData {
                    inner.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                }
                tracing::debug!(%peer, %e, "cluster connection closed");
            }
            drop(permit);
        });
    }
}

impl Inner {
    /// Member `node`'s cluster address, as the membership has it.
    fn member_addr(&self, node: u64) -> Option<String> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&node)
            .map(|n| n.cluster_addr.clone())
    }

    fn grants(&self) -> std::sync::MutexGuard<'_, Grants> {
        self.grants.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn holder(&self) -> std::sync::MutexGuard<'_, Holder> {
        self.holder.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a node was heard from within [`HEALTHY_WITHIN`] of `now`
    /// (this one always), as the heard map stands now.
    fn heard_lately(&self, now: Instant) -> impl Fn(u64) -> bool {
        let heard = self.heard.lock().map(|h| h.clone()).unwrap_or_default();
        let me = self.id;
        move |id| {
            id == me
                || heard
                    .get(&id)
                    .is_some_and(|t| now.duration_since(*t) < HEALTHY_WITHIN)
        }
    }

    /// Before a claim by `claimant` takes `client_id` from another node:
    /// that node's lease has run out, or it drops the connection when told
    /// (see `lease`). `Ok(Some(owner))`: by its lease (it dropped the
    /// connection without its will), the owner (node, epoch) then;
    /// `Ok(None)`: nothing to let go of, or it answered the fence;
    /// `Err(wait)` while neither. `clean_start`: the claimant's client
    /// starts clean (the fence says so).
    async fn let_go(
        &self,
        client_id: &str,
        claimant: u64,
        clean_start: bool,
    ) -> Result<Option<(u64, u64)>, Duration> {
        let held = self.sm.owner(client_id);
        if held.is_some_and(|(o, _)| o == self.id && o != claimant)
            && !self.holder().held(Instant::now())
        {
            // This leader owns it and is out of its own lease: it dropped
            // the connection as any node out of its lease does.
            return Ok(held);
        }
        let Some(owner) = lease::must_fence(self.id, held.map(|o| o.0), claimant) else {
            return Ok(None);
        };
        let wait = match self.grants().takeover(owner, Instant::now()) {
            Ok(()) => return Ok(held),
            Err(wait) => wait,
        };
        let addr = self.member_addr(owner);
        let Some(addr) = addr else {
            return Err(wait);
        };
        let env = Envelope {
            req: admin::Request::Fence {
                client_id: client_id.to_string(),
                new_owner: claimant,
                clean_start,
                before: self.sm.previous(client_id),
            },
            forwarded: true,
        };
        let fenced = timeout(
            lease::FENCE_TIMEOUT,
            admin::call(&addr, self.id, &env, self.tls.as_ref()),
        )
        .await;
        match fenced {
            Ok(Ok(Reply::Done)) => Ok(None),
            _ => Err(wait),
        }
    }

    /// Where a conditional claim of `client_id` from `owner` (at `epoch`;
    /// 0: any) stands on this leader's table and leases; `ended`: the
    /// connection under `epoch` is known to have ended (no lease to wait
    /// for, see [`Cluster::claim_ended`]).
    fn orphan(&self, client_id: &str, owner: u64, epoch: u64, ended: bool) -> Orphan {
        if !held_by(self.sm.owner(client_id), owner, epoch) {
            return Orphan::Moved;
        }
        if ended {
            return Orphan::Free;
        }
        if owner == self.id {
            return Orphan::Leads;
        }
        match self.grants().takeover(owner, Instant::now()) {
            Ok(()) => Orphan::Free,
            Err(wait) => Orphan::Wait(wait),
        }
    }

    /// The leader's side of [`Cluster::claim_orphan`]: written only once
    /// the owner's lease has surely run out; no fence is ever sent, so a
    /// live owner, which keeps renewing, keeps its client id.
    async fn claim_orphan(
        &self,
        client_id: String,
        node_id: u64,
        owner: u64,
        epoch: u64,
        ended: bool,
    ) -> Reply {
        // The table must hold every entry committed before the request,
        // or a claim the claimant has already applied could read as moved.
        match timeout(READ_TIMEOUT, self.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Reply::Error(format!("leadership not confirmed: {e}")),
            Err(_) => return Reply::Error("leadership not confirmed by a quorum in time".into()),
        }
        let mut state = self.orphan(&client_id, owner, epoch, ended);
        if let Orphan::Wait(wait) = state {
            if wait <= lease::CLAIM_HOLD {
                // Due soon: answer when it is due (checked again then, as
                // for a claim: this node may have lost the lead meanwhile).
                tokio::time::sleep(wait).await;
                state = self.orphan(&client_id, owner, epoch, ended);
            }
        }
        match state {
            Orphan::Free => {}
            Orphan::Moved => return Reply::Moved,
            Orphan::Leads => {
                return Reply::Error(format!(
                    "client id {client_id:?} is owned by node {owner}, the leader, which is alive"
                ))
            }
            Orphan::Wait(wait) => {
                return Reply::Error(format!(
                    "client id {client_id:?}: node {owner}'s lease may still run: \
                     try again in {} ms",
                    wait.as_millis()
                ))
            }
        }
        // The state machine checks the owner again, in log order: a claim
        // committed since the check above wins, and this one answers Moved.
        let cmd = Command::ClaimOrphan {
            client_id,
            node: node_id,
            owner,
            epoch,
        };
        // Granted only once the owner's lease ran out.
        self.write_claim(cmd, node_id, Some((owner, epoch))).await
    }

    /// Commit a claim for `node_id` (`Claim` or `ClaimOrphan`) and answer
    /// what applying it said; granted, it counts as `node_id`'s renewal.
    /// `by_lease`: the owner (node, epoch; 0: any) that let go only because
    /// its lease ran out (see [`Previous::lapsed`]), as judged before the
    /// write; said only if it is still the owner the claim takes from (an
    /// orphan claim may have moved the id on in between).
    async fn write_claim(&self, cmd: Command, node_id: u64, by_lease: Option<(u64, u64)>) -> Reply {
        match self.raft.client_write(cmd).await {
            Ok(r) => match r.data {
                SmReply::Claimed {
                    owner,
                    epoch,
                    previous,
                } => {
                    self.grants().answered(node_id, Instant::now());
                    Reply::Claimed {
                        owner,
                        epoch,
                        lapsed: crate::state_machine::lapsed(by_lease, previous),
                        previous,
                    }
                }
                // Only a `ClaimOrphan` answers it.
                SmReply::Moved => Reply::Moved,
                SmReply::Refused(why) => Reply::Error(why),
                SmReply::None => Reply::Error("claim answered nothing".into()),
            },
            Err(e) => write_error(e),
        }
    }

    /// A renewal (or claim) sent at `sent` was confirmed by a quorum.
    fn renewed(&self, sent: Instant) {
        let (held, until) = {
            let mut h = self.holder();
            h.renewed(sent);
            (h.held(Instant::now()), h.until())
        };
        self.until_tx
            .send_replace(until.map(|u| (sent.into_std(), u.into_std())));
        if held && !*self.lease_tx.borrow() {
            tracing::info!(
                node_id = self.id,
                "cluster lease renewed: serving clients again"
            );
            self.lease_tx.send_replace(true);
        }
    }

    /// The lease ran out: tell the broker, once.
    fn expire_if_due(&self) {
        if self.holder().held(Instant::now()) || !*self.lease_tx.borrow() {
            return;
        }
        let n = self.counters.lease_expiries.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(node_id = self.id, expiries = n, lease = ?self.lease,
            "cluster lease ran out (no majority heard): dropping the clients this node owns, \
             refusing new ones until it is renewed");
        self.lease_tx.send_replace(false);
    }

    /// A peer's TLS handshake failed: counted, logged at most every
    /// [`REFUSAL_LOG_EVERY`].
    fn tls_refused(&self, peer: SocketAddr, e: &std::io::Error) {
        let refused = self.counters.tls_refused.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self
            .tls_refusal_logged
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY) {
            *last = Some(Instant::now());
            tracing::warn!(%peer, refused, error = %e,
                "cluster connection refused: no valid certificate from the cluster CA (TLS handshake failed)");
        }
    }
}

async fn serve_connection(inner: &Inner, mut stream: NodeStream) -> std::io::Result<()> {
    let hello: Hello = timeout(HELLO_TIMEOUT, frame::read(&mut stream, SMALL_FRAME))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no hello"))??;
    match hello.kind {
        Kind::Raft => loop {
            let req: RaftRequest = frame::read(&mut stream, LARGE_FRAME).await?;
            let reply = network::serve(&inner.raft, req).await;
            frame::write(&mut stream, &reply).await?;
        },
        Kind::Admin => {
            let env: Envelope = frame::read(&mut stream, SMALL_FRAME).await?;
            let reply = inner.on_leader(env.req, env.forwarded).await;
            frame::write(&mut stream, &reply).await
        }
        Kind::Link => {
            if hello.from == 0 || inner.links_tx.try_send((hello.from, stream)).is_err() {
                inner.counters.links_dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(from = hello.from, "node link not taken; closed");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_peers_without_insecure() {
        let lan: std::net::IpAddr = "192.168.1.20".parse().unwrap();
        let v6: std::net::IpAddr = "::1".parse().unwrap();
        assert!(!peer_allowed(lan, false, false));
        assert!(peer_allowed(lan, true, false));
        assert!(
            peer_allowed(lan, false, true),
            "with TLS the certificate decides"
        );
        assert!(peer_allowed("127.0.0.1".parse().unwrap(), false, false));
        assert!(peer_allowed(v6, false, false));
        assert!(REFUSED_NON_LOOPBACK.contains("insecure = true"));
    }

    fn config(id: u64, dir: &tempfile::TempDir, join: Option<SocketAddr>) -> ClusterConfig {
        ClusterConfig {
            node_id: id,
            listen: "127.0.0.1:0".parse().unwrap(),
            join,
            data_dir: dir.path().join(format!("n{id}")),
            advertise: Some(format!("127.0.0.1:{}", 1880 + id).parse().unwrap()),
            insecure: false,
            tls: None,
            lease: lease::DEFAULT_LEASE,
            advertise_cluster: None,
        }
    }

    async fn until(what: &str, mut ok: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ok() {
            assert!(Instant::now() < deadline, "within 10 s: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Nodes 1 to `N`, node 1 the leader, once node `N` sees them all as
    /// voters.
    async fn started<const N: usize>(dir: &tempfile::TempDir) -> [Cluster; N] {
        let first = Cluster::start(config(1, dir, None)).await.unwrap();
        let seed = Some(first.local_addr());
        let mut nodes = vec![first];
        for id in 2..=N as u64 {
            nodes.push(Cluster::start(config(id, dir, seed)).await.unwrap());
        }
        let mut members = nodes[N - 1].members();
        timeout(
            Duration::from_secs(10),
            members.wait_for(|m| m.nodes.len() == N && m.nodes.values().all(|n| n.voter)),
        )
        .await
        .expect("every node a voter, seen by the last")
        .unwrap();
        assert_eq!(nodes[0].members().borrow().leader, Some(1));
        match nodes.try_into() {
            Ok(nodes) => nodes,
            Err(_) => unreachable!("{N} nodes started"),
        }
    }

    /// The leader owns a client id and is out of its own lease: it
    /// dropped the connection without its will, as any node out of its
    /// lease does, so another node's claim takes the id told the owner
    /// before it let go by its lease (`Previous::lapsed`: the will is the
    /// new owner's to publish). With the lease held, the same claim says
    /// the owner let go itself (it drops its client when it applies the
    /// claim, publishing the will).
    #[tokio::test]
    async fn a_leader_out_of_its_own_lease_lets_its_ids_go_as_lapsed() {
        let dir = tempfile::tempdir().unwrap();
        let [n1, n2] = started(&dir).await;
        assert_eq!(n1.claim("held").await.unwrap(), (1, 1));
        assert_eq!(n1.claim("dev").await.unwrap(), (1, 1));

        let fenced = Previous {
            node: 1,
            epoch: 1,
            lapsed: false,
        };
        assert_eq!(
            n2.claim_from("held").await.unwrap(),
            (2, 2, Some(fenced)),
            "the lease held"
        );

        n1.inner.holder().lapse();
        let lapsed = Previous {
            node: 1,
            epoch: 1,
            lapsed: true,
        };
        assert_eq!(n2.claim_from("dev").await.unwrap(), (2, 2, Some(lapsed)));
        n1.shutdown().await;
        n2.shutdown().await;
    }

    /// A hand-over works from a snapshot of the client ids the drained (or
    /// lost) node owned. One that another node took meanwhile (its client
    /// reconnected there during the drain) stays with that node: no fence
    /// reaches it, it loses nothing, the target does not adopt it; the
    /// others go to the target.
    #[tokio::test]
    async fn a_hand_over_leaves_an_id_that_moved_on_with_its_new_owner() {
        let dir = tempfile::tempdir().unwrap();
        let [n1, n2, n3] = started(&dir).await;
        let mut fences3 = n3.take_fences().expect("fences");
        let mut lost3 = n3.take_ownership_lost().expect("losses");
        let mut adopts1 = n1.take_adopts().expect("adopts");
        assert_eq!(n2.claim("a").await.unwrap(), (2, 1));
        assert_eq!(n2.claim("b").await.unwrap(), (2, 1));
        let ids = n1.inner.owned_by(2);
        assert_eq!(ids, ["a", "b"]);

        // After the snapshot, "b"'s client reconnects to node 3.
        assert_eq!(n3.claim("b").await.unwrap(), (3, 2));
        assert_eq!(n1.inner.hand_over_ids(2, 1, ids).await, 1);
        assert_eq!(n1.owner("a"), Some((1, 2)));
        assert_eq!(n1.owner("b"), Some((3, 2)), "taken from its new owner");
        assert_eq!(adopts1.try_recv().ok().as_deref(), Some("a"));
        assert!(adopts1.try_recv().is_err(), "only \"a\" adopted");

        // Once node 3 applied everything the leader wrote: it kept "b",
        // was never fenced, and heard of no loss.
        assert_eq!(n1.claim("sync").await.unwrap(), (1, 1));
        until("node 3 applied the leader's writes", || {
            n3.owner("sync").is_some()
        })
        .await;
        assert_eq!(n3.owner("a"), Some((1, 2)));
        assert_eq!(n3.owner("b"), Some((3, 2)));
        assert!(fences3.try_recv().is_err(), "the new owner was fenced");
        assert!(lost3.try_recv().is_err(), "the new owner lost the id");
        n1.shutdown().await;
        n2.shutdown().await;
        n3.shutdown().await;
    }
}

//! Deterministic simulation: several Raft nodes with this crate's log store
//! and state machine in one current-thread runtime with paused time, over a
//! network that drops, delays, duplicates and partitions by a seeded RNG,
//! with crashes that keep only what was fsynced (and may leave a torn
//! record). Network faults follow the seed; openraft's election jitter uses
//! its own RNG, so runs differ in timing, and the checks hold for any.

use crate::disk::MemDisk;
use crate::lease::{self, Grants, Holder};
use crate::log_store::LogStore;
use crate::state_machine::{SmShared, StateMachine};
use crate::types::{Command, NodeInfo, Raft, Reply, TypeConfig};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::RaftLogStorage;
use openraft::{Config, ServerState, SnapshotPolicy, Vote};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout, Instant};

/// xorshift64*: small, seeded, good enough to pick faults.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

#[derive(Clone, Copy, Default)]
struct Faults {
    drop_pct: u64,
    dup_pct: u64,
    max_delay_ms: u64,
}

struct Net {
    rng: Mutex<Rng>,
    faults: Mutex<Faults>,
    up: Mutex<HashMap<u64, Raft>>,
    /// Nodes cut off from all others (they still reach each other).
    cut: Mutex<BTreeSet<u64>>,
    delivered: Mutex<u64>,
    dropped: Mutex<u64>,
}

impl Net {
    fn new(seed: u64) -> Arc<Net> {
        Arc::new(Net {
            rng: Mutex::new(Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)),
            faults: Mutex::new(Faults::default()),
            up: Mutex::new(HashMap::new()),
            cut: Mutex::new(BTreeSet::new()),
            delivered: Mutex::new(0),
            dropped: Mutex::new(0),
        })
    }

    fn roll(&self, pct: u64) -> bool {
        self.rng.lock().unwrap().percent(pct)
    }

    fn blocked(&self, from: u64, to: u64) -> bool {
        let cut = self.cut.lock().unwrap();
        cut.contains(&from) != cut.contains(&to)
    }

    /// Delay, then the target's handle unless the message is lost.
    async fn route(&self, from: u64, to: u64) -> Result<Raft, Unreachable> {
        let f = *self.faults.lock().unwrap();
        let delay = self.rng.lock().unwrap().below(f.max_delay_ms + 1);
        sleep(Duration::from_millis(delay)).await;
        let lost = self.blocked(from, to) || self.roll(f.drop_pct);
        let target = self.up.lock().unwrap().get(&to).cloned();
        match target {
            Some(raft) if !lost => {
                *self.delivered.lock().unwrap() += 1;
                Ok(raft)
            }
            _ => {
                *self.dropped.lock().unwrap() += 1;
                Err(Unreachable::new(&std::io::Error::other("sim: lost")))
            }
        }
    }

    /// Whether the reply is lost on the way back (the request took effect).
    fn reply_lost(&self, from: u64, to: u64) -> bool {
        let f = *self.faults.lock().unwrap();
        self.blocked(from, to) || self.roll(f.drop_pct)
    }

    fn dup(&self) -> bool {
        let f = *self.faults.lock().unwrap();
        self.roll(f.dup_pct)
    }
}

struct SimFactory {
    net: Arc<Net>,
    from: u64,
}

struct SimClient {
    net: Arc<Net>,
    from: u64,
    to: u64,
}

impl RaftNetworkFactory<TypeConfig> for SimFactory {
    type Network = SimClient;
    async fn new_client(&mut self, target: u64, _node: &NodeInfo) -> SimClient {
        SimClient {
            net: self.net.clone(),
            from: self.from,
            to: target,
        }
    }
}

type Err<E = openraft::error::Infallible> = RPCError<u64, NodeInfo, RaftError<u64, E>>;

fn lost<E: std::error::Error>() -> RPCError<u64, NodeInfo, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other("sim: reply lost")))
}

impl RaftNetwork<TypeConfig> for SimClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _o: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, Err> {
        let raft = self.net.route(self.from, self.to).await?;
        if self.net.dup() {
            let _ = raft.append_entries(rpc.clone()).await;
        }
        let r = raft
            .append_entries(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))?;
        if self.net.reply_lost(self.to, self.from) {
            return Err(lost());
        }
        Ok(r)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _o: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, Err<InstallSnapshotError>> {
        let raft = self.net.route(self.from, self.to).await?;
        if self.net.dup() {
            let _ = raft.install_snapshot(rpc.clone()).await;
        }
        let r = raft
            .install_snapshot(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))?;
        if self.net.reply_lost(self.to, self.from) {
            return Err(lost());
        }
        Ok(r)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        _o: RPCOption,
    ) -> Result<VoteResponse<u64>, Err> {
        let raft = self.net.route(self.from, self.to).await?;
        if self.net.dup() {
            let _ = raft.vote(rpc.clone()).await;
        }
        let r = raft
            .vote(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))?;
        if self.net.reply_lost(self.to, self.from) {
            return Err(lost());
        }
        Ok(r)
    }
}

struct Node {
    raft: Raft,
    disk: MemDisk,
    log: LogStore,
    sm: Arc<SmShared>,
    _lost: mpsc::Receiver<crate::OwnershipLost>,
}

fn sim_config() -> Arc<Config> {
    let c = Config {
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        // Small, so snapshots, purges and snapshot installs happen.
        snapshot_policy: SnapshotPolicy::LogsSinceLast(20),
        max_in_snapshot_log_to_keep: 5,
        ..Default::default()
    };
    Arc::new(c.validate().unwrap())
}

async fn boot(net: &Arc<Net>, id: u64, disk: MemDisk) -> Node {
    let log = LogStore::open(Arc::new(disk.clone())).unwrap();
    let (tx, rx) = mpsc::channel(16);
    let sm = SmShared::new(id, tx);
    let machine = StateMachine::open(Arc::new(disk.clone()), sm.clone()).unwrap();
    let factory = SimFactory {
        net: net.clone(),
        from: id,
    };
    let raft = Raft::new(id, sim_config(), factory, log.clone(), machine)
        .await
        .unwrap();
    net.up.lock().unwrap().insert(id, raft.clone());
    Node {
        raft,
        disk,
        log,
        sm,
        _lost: rx,
    }
}

struct Sim {
    net: Arc<Net>,
    nodes: BTreeMap<u64, Node>,
    /// Acknowledged claims per client id, in acknowledgement order.
    acked: BTreeMap<String, Vec<(u64, u64)>>,
    /// The leader seen in each term: never two.
    leaders: Mutex<BTreeSet<(u64, u64)>>,
    votes: Mutex<BTreeMap<u64, Vote<u64>>>,
}

impl Sim {
    async fn new(seed: u64, n: u64) -> Sim {
        let net = Net::new(seed);
        let mut nodes = BTreeMap::new();
        for id in 1..=n {
            nodes.insert(id, boot(&net, id, MemDisk::default()).await);
        }
        let members: BTreeMap<u64, NodeInfo> =
            (1..=n).map(|id| (id, NodeInfo::default())).collect();
        nodes[&1].raft.initialize(members).await.unwrap();
        Sim {
            net,
            nodes,
            acked: BTreeMap::new(),
            leaders: Mutex::new(BTreeSet::new()),
            votes: Mutex::new(BTreeMap::new()),
        }
    }

    fn rng(&self, n: u64) -> u64 {
        self.net.rng.lock().unwrap().below(n)
    }

    /// Record every leader seen, by openraft's leader id (term, node), and
    /// check that no node's vote ever goes back. In openraft's default
    /// (advanced) mode one term may have several leaders, a later one with
    /// a greater node id: leader ids are totally ordered and a vote is
    /// granted only to a greater one, so "one leader per term" is not what
    /// it promises; a vote that goes back would break it.
    fn check_votes(&self) {
        let mut leaders = self.leaders.lock().unwrap();
        let mut votes = self.votes.lock().unwrap();
        for (&id, n) in &self.nodes {
            let m = n.raft.metrics().borrow().clone();
            if m.state == ServerState::Leader {
                leaders.insert((m.current_term, id));
            }
            if let Some(before) = votes.insert(id, m.vote) {
                assert!(
                    m.vote.partial_cmp(&before) != Some(std::cmp::Ordering::Less),
                    "node {id}'s vote went back from {before:?} to {:?}",
                    m.vote
                );
            }
        }
    }

    /// A node of `among` that leads, within 10 s.
    async fn leader(&self, among: &[u64]) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            self.check_votes();
            for &id in among {
                let m = self.nodes[&id].raft.metrics().borrow().clone();
                if m.state == ServerState::Leader {
                    return id;
                }
            }
            sleep(Duration::from_millis(20)).await;
        }
        panic!("no leader among {among:?} within 10 s");
    }

    /// Claim `client` for node `via` on `leader`; `Some` when committed.
    async fn claim_on(&mut self, leader: u64, client: &str, via: u64) -> Option<(u64, u64)> {
        let raft = self.nodes[&leader].raft.clone();
        let cmd = Command::Claim {
            client_id: client.into(),
            node: via,
            clean_start: false,
            by_lease: None,
        };
        match timeout(Duration::from_secs(2), raft.client_write(cmd)).await {
            Ok(Ok(r)) => match r.data {
                Reply::Claimed { owner, epoch, .. } => {
                    assert_eq!(owner, via);
                    self.acked
                        .entry(client.into())
                        .or_default()
                        .push((owner, epoch));
                    Some((owner, epoch))
                }
                other => panic!("claim answered {other:?}"),
            },
            _ => None,
        }
    }

    /// Claims of random client ids from random nodes through whoever leads.
    async fn claims(&mut self, n: usize, among: &[u64]) -> usize {
        let mut ok = 0;
        for _ in 0..n {
            let leader = self.leader(among).await;
            let client = format!("c{}", self.rng(4));
            let via = among[self.rng(among.len() as u64) as usize];
            if self.claim_on(leader, &client, via).await.is_some() {
                ok += 1;
            }
        }
        ok
    }

    /// Crash `id`: it stops, keeping only what reached its disk; maybe with
    /// a torn record at the end of its log. It restarts from that disk.
    async fn crash_and_restart(&mut self, id: u64, torn: bool) {
        let node = self.nodes.remove(&id).unwrap();
        // Until it has loaded its log, a restarted node's metrics show no
        // vote; the vote it recovers is checked below.
        self.votes.lock().unwrap().remove(&id);
        self.net.up.lock().unwrap().remove(&id);
        node.raft.shutdown().await.unwrap();
        let mut log = node.log.clone();
        let before = (log.last_index(), log.read_vote().await.unwrap());
        if torn {
            node.disk
                .tear("raft-log", &[0x40, 0, 0, 0, 1, 2, 3, 4, b'{']);
        }
        let disk = node.disk.clone();
        drop(node);
        let restarted = boot(&self.net, id, disk).await;
        let mut log = restarted.log.clone();
        let after = (log.last_index(), log.read_vote().await.unwrap());
        assert_eq!(before, after, "node {id} recovers its log and vote");
        self.nodes.insert(id, restarted);
    }

    /// Every node has applied the same entries and holds the same owners.
    async fn converge(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let states: Vec<_> = self
                .nodes
                .values()
                .map(|n| {
                    let d = n.sm.lock();
                    (d.last_applied, d.owners.clone())
                })
                .collect();
            if states.windows(2).all(|w| w[0] == w[1]) && states[0].0.is_some() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nodes disagree after heal: {states:?}"
            );
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// Epochs of acknowledged claims rise strictly per client id (so no two
    /// share one), and no node ever applied an epoch below an acked one.
    fn check_epochs(&self) {
        for (client, acks) in &self.acked {
            for w in acks.windows(2) {
                assert!(w[0].1 < w[1].1, "{client}: epochs {acks:?} do not rise");
            }
            for (id, n) in &self.nodes {
                let (_, epoch) = n.sm.owner(client).expect("owned");
                let last = acks.last().map_or(0, |a| a.1);
                assert!(
                    epoch >= last,
                    "node {id}: {client} at epoch {epoch} below acked {last}"
                );
            }
        }
    }
}

async fn scenario(seed: u64) {
    let mut sim = Sim::new(seed, 3).await;
    let all = [1, 2, 3];
    sim.leader(&all).await;
    *sim.net.faults.lock().unwrap() = Faults {
        drop_pct: 10,
        dup_pct: 10,
        max_delay_ms: 20,
    };
    let ok = sim.claims(30, &all).await;
    assert!(
        ok > 0,
        "seed {seed}: no claim committed on a faulty network"
    );

    // The leader alone on one side: it cannot commit; the majority can.
    let old = sim.leader(&all).await;
    sim.net.cut.lock().unwrap().insert(old);
    for i in 0..3 {
        let client = format!("c{i}");
        assert!(
            sim.claim_on(old, &client, old).await.is_none(),
            "seed {seed}: the partitioned minority committed a claim"
        );
    }
    let rest: Vec<u64> = all.iter().copied().filter(|&i| i != old).collect();
    let ok = sim.claims(10, &rest).await;
    assert!(ok > 0, "seed {seed}: the majority committed nothing");
    sim.net.cut.lock().unwrap().clear();

    // Crashes: a follower with a torn log tail, then whoever leads.
    let victim = rest[sim.rng(2) as usize];
    sim.crash_and_restart(victim, true).await;
    sim.claims(10, &all).await;
    let leader = sim.leader(&all).await;
    sim.crash_and_restart(leader, false).await;
    sim.claims(10, &all).await;

    *sim.net.faults.lock().unwrap() = Faults::default();
    // One claim on a healed network: everything before it is committed too.
    let leader = sim.leader(&all).await;
    assert!(sim.claim_on(leader, "c0", leader).await.is_some());
    sim.converge().await;
    sim.check_epochs();
    assert!(
        sim.leaders.lock().unwrap().len() >= 2,
        "seed {seed}: the leader never changed"
    );
    let delivered = *sim.net.delivered.lock().unwrap();
    let dropped = *sim.net.dropped.lock().unwrap();
    assert!(
        dropped > 0 && delivered > dropped,
        "seed {seed}: faults {dropped}/{delivered}"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn sim_seeds_keep_ownership_safe() {
    // About 0.15 s of real time per seed.
    for seed in 1..=16 {
        scenario(seed).await;
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_torn_log_tail_is_cut_and_appends_continue() {
    let net = Net::new(9);
    let disk = MemDisk::default();
    let node = boot(&net, 1, disk.clone()).await;
    let members = BTreeMap::from([(1, NodeInfo::default())]);
    node.raft.initialize(members).await.unwrap();
    for i in 0..5 {
        let cmd = Command::Claim {
            client_id: format!("c{i}"),
            node: 1,
            clean_start: false,
            by_lease: None,
        };
        node.raft.client_write(cmd).await.unwrap();
    }
    let last = node.log.last_index();
    node.raft.shutdown().await.unwrap();
    disk.tear("raft-log", &[9, 0, 0, 0]);
    drop(node);
    let node = boot(&net, 1, disk.clone()).await;
    assert_eq!(node.log.last_index(), last);
    // It leads again, and what it appends after the cut is read back.
    let cmd = Command::Claim {
        client_id: "c0".into(),
        node: 1,
        clean_start: false,
        by_lease: None,
    };
    let r = timeout(Duration::from_secs(10), node.raft.client_write(cmd))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        r.data,
        Reply::Claimed {
            owner: 1,
            epoch: 2,
            previous: None
        }
    );
    let after = node.log.last_index();
    node.raft.shutdown().await.unwrap();
    drop(node);
    let node = boot(&net, 1, disk).await;
    assert_eq!(node.log.last_index(), after);
    assert!(after > last);
    node.raft.shutdown().await.unwrap();
}

/// Leases over the simulated network: each node renews through whoever it
/// believes leads (the leader confirms with a quorum), and a claim that
/// takes a client id from a node out of touch waits for its lease.
struct Leases {
    holders: BTreeMap<u64, Arc<Mutex<Holder>>>,
    grants: BTreeMap<u64, Arc<Mutex<Grants>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// When each node dropped its client on a fence.
    fenced: Mutex<BTreeMap<u64, Instant>>,
}

impl Drop for Leases {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Leases {
    /// `slow`: the node whose clock runs 10% slow (its lease lasts 10%
    /// longer in real time).
    fn start(sim: &Sim, lease: Duration, slow: u64) -> Leases {
        let mut l = Leases {
            holders: BTreeMap::new(),
            grants: BTreeMap::new(),
            tasks: Vec::new(),
            fenced: Mutex::new(BTreeMap::new()),
        };
        for &id in sim.nodes.keys() {
            let own = if id == slow { lease * 11 / 10 } else { lease };
            l.holders.insert(id, Arc::new(Mutex::new(Holder::new(own))));
            l.grants
                .insert(id, Arc::new(Mutex::new(Grants::new(lease))));
        }
        for (&id, node) in &sim.nodes {
            // Role changes, as `watch_metrics` follows them.
            let mut rx = node.raft.metrics();
            let g = l.grants[&id].clone();
            l.tasks.push(tokio::spawn(async move {
                loop {
                    let leading = {
                        let m = rx.borrow_and_update();
                        (m.state == ServerState::Leader).then_some(m.current_term)
                    };
                    g.lock().unwrap().role(leading, Instant::now());
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            }));
            // Renewals, as `keep_lease` sends them.
            let (net, raft, holder) = (sim.net.clone(), node.raft.clone(), l.holders[&id].clone());
            let grants = l.grants.clone();
            l.tasks.push(tokio::spawn(async move {
                loop {
                    let sent = Instant::now();
                    let leader = raft.metrics().borrow().current_leader;
                    if let Some(leader) = leader {
                        if let Ok(target) = net.route(id, leader).await {
                            if lease::confirm(&target, lease / 2).await {
                                grants[&leader].lock().unwrap().answered(id, Instant::now());
                                if !net.reply_lost(leader, id) {
                                    holder.lock().unwrap().renewed(sent);
                                }
                            }
                        }
                    }
                    tokio::time::sleep_until(sent + lease::renew_every(lease)).await;
                }
            }));
        }
        l
    }

    fn held(&self, id: u64) -> bool {
        self.holders[&id].lock().unwrap().held(Instant::now())
    }

    /// Until when `id` served its client: its lease, or a fence.
    fn served_until(&self, id: u64) -> Option<Instant> {
        let until = self.holders[&id].lock().unwrap().until()?;
        let fenced = self.fenced.lock().unwrap().get(&id).copied();
        Some(fenced.map_or(until, |f| f.min(until)))
    }

    /// Claim `client` for `via` through `leader`, as `Inner::as_leader`
    /// does (`check`: false leaves the lease out, to show what it
    /// prevents). `Some` when granted.
    async fn claim(
        &self,
        sim: &Sim,
        leader: u64,
        client: &str,
        via: u64,
        check: bool,
    ) -> Option<(u64, u64)> {
        let sent = Instant::now();
        let node = &sim.nodes[&leader];
        let owner = node.sm.owner(client).map(|o| o.0);
        match lease::must_fence(leader, owner, via) {
            Some(o) if check => {
                let lease_over = self.grants[&leader]
                    .lock()
                    .unwrap()
                    .takeover(o, Instant::now())
                    .is_ok();
                if !lease_over {
                    // The fence: the owner drops its client if it gets it.
                    if timeout(lease::FENCE_TIMEOUT, sim.net.route(leader, o))
                        .await
                        .is_ok_and(|r| r.is_ok())
                    {
                        self.fenced.lock().unwrap().insert(o, Instant::now());
                        if sim.net.reply_lost(o, leader) {
                            return None;
                        }
                    } else {
                        return None;
                    }
                }
            }
            _ => {}
        }
        let cmd = Command::Claim {
            client_id: client.into(),
            node: via,
            clean_start: false,
            by_lease: None,
        };
        match timeout(Duration::from_secs(2), node.raft.client_write(cmd)).await {
            Ok(Ok(r)) => match r.data {
                Reply::Claimed { owner, epoch, .. } => {
                    self.grants[&leader]
                        .lock()
                        .unwrap()
                        .answered(via, Instant::now());
                    self.holders[&via].lock().unwrap().renewed(sent);
                    Some((owner, epoch))
                }
                _ => None,
            },
            _ => None,
        }
    }
}

/// Cut the owner of a client id off (`leader`: the owner is the leader
/// itself), then claim the id from the other side until it is granted.
/// Returns (when the owner's lease ran out, when the claim was granted,
/// when the cut began).
async fn lease_scenario(seed: u64, owner_leads: bool, check: bool) -> (Instant, Instant, Instant) {
    let mut sim = Sim::new(seed, 3).await;
    let all = [1, 2, 3];
    let leader = sim.leader(&all).await;
    let owner = if owner_leads {
        leader
    } else {
        *all.iter().find(|&&i| i != leader).unwrap()
    };
    let lease = lease::DEFAULT_LEASE;
    let leases = Leases::start(&sim, lease, owner);
    *sim.net.faults.lock().unwrap() = Faults {
        drop_pct: 0,
        dup_pct: 0,
        max_delay_ms: 10,
    };
    assert!(leases
        .claim(&sim, leader, "c", owner, check)
        .await
        .is_some());
    sim.acked.entry("c".into()).or_default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !leases.held(owner) {
        assert!(Instant::now() < deadline, "seed {seed}: no lease");
        sleep(Duration::from_millis(10)).await;
    }
    // Let a few renewals pass, so the cut comes mid-lease.
    sleep(lease / 2 + Duration::from_millis(sim.rng(700))).await;
    sim.net.cut.lock().unwrap().insert(owner);
    let cut_at = Instant::now();
    let rest: Vec<u64> = all.iter().copied().filter(|&i| i != owner).collect();
    let taker = rest[sim.rng(2) as usize];
    let granted_at = loop {
        assert!(
            Instant::now() < cut_at + Duration::from_secs(20),
            "seed {seed}: the majority never got the client id"
        );
        let leader = sim.leader(&rest).await;
        if let Some((who, _)) = leases.claim(&sim, leader, "c", taker, check).await {
            assert_eq!(who, taker);
            break Instant::now();
        }
        sleep(Duration::from_millis(100)).await;
    };
    let ran_out = leases.served_until(owner).expect("the owner held a lease");
    if check {
        // Liveness: at most a renewal period, an election and the wait.
        let bound = lease::renew_every(lease) + Duration::from_secs(2) + lease::grant_after(lease);
        assert!(
            granted_at - cut_at <= bound,
            "seed {seed}: granted {:?} after the cut",
            granted_at - cut_at
        );
        // Healed: the owner renews again and learns it lost the id.
        sim.net.cut.lock().unwrap().clear();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(leases.held(owner) && sim.nodes[&owner].sm.owner("c").map(|o| o.0) == Some(taker)) {
            assert!(
                Instant::now() < deadline,
                "seed {seed}: owner did not rejoin"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }
    drop(leases);
    for n in sim.nodes.values() {
        n.raft.shutdown().await.unwrap();
    }
    (ran_out, granted_at, cut_at)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_cut_off_owner_loses_its_lease_before_another_node_gets_its_client() {
    for seed in 1..=6 {
        for owner_leads in [false, true] {
            let (ran_out, granted, cut) = lease_scenario(seed, owner_leads, true).await;
            assert!(
                ran_out < granted,
                "seed {seed} (owner leads: {owner_leads}): two owners for {:?}",
                ran_out - granted
            );
            assert!(ran_out > cut, "the owner held its lease at the cut");
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_owner_in_touch_lets_go_at_once() {
    let sim = Sim::new(5, 3).await;
    let leader = sim.leader(&[1, 2, 3]).await;
    let leases = Leases::start(&sim, Duration::from_secs(3), 0);
    let (a, b) = if leader == 1 {
        (2, 3)
    } else {
        (1, 6 - leader - 1)
    };
    assert!(leases.claim(&sim, leader, "c", a, true).await.is_some());
    let asked = Instant::now();
    assert!(leases.claim(&sim, leader, "c", b, true).await.is_some());
    let granted = Instant::now();
    let fenced = leases.fenced.lock().unwrap().get(&a).copied();
    assert!(
        fenced.is_some_and(|f| f <= granted),
        "the owner let go first"
    );
    assert!(
        granted - asked < Duration::from_millis(500),
        "no lease wait"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_the_lease_check_two_nodes_own_a_client_at_once() {
    // What the check prevents: the majority gives the id away while the
    // cut-off owner still holds its lease (and would serve the client).
    let (ran_out, granted, _) = lease_scenario(3, false, false).await;
    assert!(
        granted < ran_out,
        "without the check the claim should overlap the old lease"
    );
}

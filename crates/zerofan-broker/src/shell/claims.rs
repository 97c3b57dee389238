//! The broker's side of its cluster node: client-id claims (see
//! `core/claims.rs`) — each claim the core asks for goes to the cluster in
//! a task of its own and its answer back to the core, and a client id
//! another node claimed ends its session here — and the links' view of the
//! node ([`link_setup`]: members, incoming links, dialing).

use super::links::{DialFn, IncomingLink, LinkSetup, LinkStream};
use super::state::Shared;
use crate::core::{Loss, OrphanRequest, Orphaned, PreviousOwner};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;
use zerofan_cluster::{Cluster, Members, NodeStream, OrphanClaim, OwnershipLost, Previous};

/// How long a CONNECT waits for its claim (retried meanwhile while the
/// cluster has no leader) before it is refused with 0x88.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(5);
/// Claims in flight at once; the others wait in the core's queue, which
/// holds at most one per connection.
const CLAIMS_IN_FLIGHT: usize = 256;
/// How long a granted claim waits for the old owner's copy of the session
/// it resumes, when this node keeps no current one (see
/// `Broker::awaits_handover`): a link's round trip on a healthy cluster.
/// Past it the claim goes on with what this node has (a clean session
/// when nothing), as it did before handovers.
const HANDOVER_WAIT: Duration = Duration::from_secs(2);

/// Orphan claims (see `core/orphans.rs`) in flight at once; the others
/// wait their turn, each in a task of its own (at most one per copy kept
/// here).
const ORPHANS_IN_FLIGHT: usize = 64;
/// First pause between tries of an orphan claim that the leader refused
/// for now (the owner's lease may still run, no leader), doubled up to
/// [`ORPHAN_PAUSE_MAX`]: an owner only cut off from this node keeps
/// renewing, and its copies here are tried again this rarely until its
/// link is back.
const ORPHAN_PAUSE: Duration = Duration::from_millis(250);
/// Longest pause between tries of an orphan claim.
const ORPHAN_PAUSE_MAX: Duration = Duration::from_secs(8);

/// Claim what the core asks for, until aborted.
pub(super) async fn claim_loop(shared: Rc<Shared>, cluster: Arc<Cluster>) {
    let slots = Arc::new(Semaphore::new(CLAIMS_IN_FLIGHT));
    let orphan_slots = Arc::new(Semaphore::new(ORPHANS_IN_FLIGHT));
    let mut asked = Vec::new();
    let mut orphans = Vec::new();
    loop {
        shared.claim_wake.notified().await;
        shared.broker.borrow_mut().take_orphans(&mut orphans);
        for req in orphans.drain(..) {
            let (s, c, slots) = (shared.clone(), cluster.clone(), orphan_slots.clone());
            tokio::task::spawn_local(async move {
                let Ok(_slot) = slots.acquire_owned().await else {
                    return;
                };
                claim_orphan(&s, &c, &req).await;
            });
        }
        shared.broker.borrow_mut().take_claims(&mut asked);
        for req in asked.drain(..) {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let (s, c) = (shared.clone(), cluster.clone());
            tokio::task::spawn_local(async move {
                let (got, late) = match claim(&c, &req.client_id, req.clean_start).await {
                    Claimed::Granted(epoch, prev) => (Some((epoch, prev)), None),
                    Claimed::Refused => (None, None),
                    Claimed::Late(attempt) => (None, Some(attempt)),
                };
                drop(slot);
                tracing::debug!(client_id = %req.client_id, ?got, late = late.is_some(),
                    "claim answered");
                let prev = got.and_then(|(_, p)| p).map(|p| previous_owner(&s, p));
                if let Some(prev) = prev {
                    wait_for_handover(&s, req.conn, &prev).await;
                }
                s.broker.borrow_mut().claim_answered_from(
                    Instant::now(),
                    req.conn,
                    got.is_some(),
                    got.map_or(0, |(e, _)| e),
                    prev,
                );
                s.dispatch();
                if let Some(attempt) = late {
                    claim_late(&s, &c, &req.client_id, attempt).await;
                }
            });
        }
    }
}

/// The owner before a claim, as the cluster's log had it, as the core
/// names it: a node never linked to has no peer id (and no copy here).
fn previous_owner(shared: &Shared, p: Previous) -> PreviousOwner {
    PreviousOwner {
        peer: shared.links.as_ref().and_then(|l| l.known_peer(p.node)),
        epoch: p.epoch,
        lapsed: p.lapsed,
    }
}

/// The owner (node, epoch) before a lost client id's claims here, as the
/// core names it (see `Loss::before`).
fn owner_before(shared: &Shared, (node, epoch): (u64, u64)) -> PreviousOwner {
    previous_owner(
        shared,
        Previous {
            node,
            epoch,
            lapsed: false,
        },
    )
}

/// A claim attempt: the owner, its epoch and the owner before.
type Attempt<'a> = Pin<Box<dyn Future<Output = ClaimResult> + 'a>>;
type ClaimResult = Result<(u64, u64, Option<Previous>), zerofan_cluster::ClusterError>;

/// What [`claim`] got.
enum Claimed<'a> {
    /// This node owns the client id: the epoch, and the owner before.
    Granted(u64, Option<Previous>),
    /// Another node's, or no leader to ask in time.
    Refused,
    /// The attempt in flight at the deadline, which may still commit (a
    /// leader waiting out the old owner's lease): see [`claim_late`].
    Late(Attempt<'a>),
}

/// The attempt that was in flight when `client`'s CONNECT was refused for
/// want of an answer (0x88), awaited to its end: when it did commit,
/// this node owns the client id with nothing served under it, and the
/// node the client goes to next would judge its own copy older than this
/// node's epoch and start the session clean (seen in a soak on
/// 2026-11-30: a subscriber lost what its copies held). The session is
/// served here instead, as for a claim whose client left before the
/// answer (its copy here, if any, goes on offline), unless a newer claim
/// took the id on meanwhile.
async fn claim_late(shared: &Shared, cluster: &Cluster, client: &str, attempt: Attempt<'_>) {
    let Ok(Ok((owner, epoch, prev))) = tokio::time::timeout(CLAIM_TIMEOUT, attempt).await else {
        return;
    };
    if owner != cluster.node_id() || cluster.owner(client).is_some_and(|(_, e)| e > epoch) {
        return;
    }
    tracing::info!(
        client_id = client,
        epoch,
        "a claim refused for want of time was granted"
    );
    let prev = prev.map(|p| previous_owner(shared, p));
    shared
        .broker
        .borrow_mut()
        .claim_granted_late(Instant::now(), client, epoch, prev);
    shared.dispatch();
}

/// Until the old owner has handed `conn`'s session over, at most
/// [`HANDOVER_WAIT`] (nothing to wait for in most claims); then, when no
/// copy under the old owner's epoch is here yet (the old owner is dead),
/// until another node sent one, at most [`HANDOVER_WAIT`] again.
async fn wait_for_handover(shared: &Shared, conn: crate::core::ConnId, prev: &PreviousOwner) {
    let waiting = |b: &crate::core::Broker| b.awaits_handover(conn, prev);
    if !wait_until_not(shared, waiting).await {
        tracing::debug!(%conn, "no handover from the old owner in time");
    }
    if !shared.broker.borrow().wants_copy(conn, prev) {
        tracing::debug!(%conn, ?prev, "no copy wanted from the other nodes");
        return;
    }
    tracing::debug!(%conn, ?prev, "asking the other nodes for a copy");
    shared.broker.borrow_mut().ask_for_copy(conn, prev);
    shared.dispatch();
    if !wait_until_not(shared, |b| b.wants_copy(conn, prev)).await {
        tracing::debug!(%conn, "no node sent a copy of the session in time");
    }
}

/// Until `waits` is false (true), or [`HANDOVER_WAIT`] passed (false);
/// checked again at each handover that arrives.
pub(super) async fn wait_until_not(
    shared: &Shared,
    waits: impl Fn(&crate::core::Broker) -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + HANDOVER_WAIT;
    loop {
        // Registered before the check, so a handover between the two is
        // not missed.
        let woken = shared.handover_wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if !waits(&shared.broker.borrow()) {
            return true;
        }
        if tokio::time::timeout_at(deadline, woken).await.is_err() {
            return false;
        }
    }
}

/// Whether this node now owns `client_id`, with the epoch and the owner
/// before it (node, epoch). A claim that fails for want of a leader is
/// tried again until [`CLAIM_TIMEOUT`].
async fn claim<'a>(cluster: &'a Cluster, client_id: &'a str, clean_start: bool) -> Claimed<'a> {
    let deadline = tokio::time::Instant::now() + CLAIM_TIMEOUT;
    let mut pause = Duration::from_millis(20);
    loop {
        let mut attempt: Attempt<'a> = Box::pin(cluster.claim_starting(client_id, clean_start));
        match tokio::time::timeout_at(deadline, &mut attempt).await {
            Ok(Ok((owner, epoch, prev))) if owner == cluster.node_id() => {
                return Claimed::Granted(epoch, prev)
            }
            Ok(Ok(_)) => return Claimed::Refused,
            Ok(Err(e)) => {
                tracing::debug!(client_id, error = %e, "claim failed; retrying");
            }
            Err(_) => return Claimed::Late(attempt),
        }
        if tokio::time::Instant::now() + pause >= deadline {
            return Claimed::Refused;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// Take `req`'s client id from its away owner, once the cluster says
/// that owner let go of it (its lease ran out), and tell the core; tried
/// while the core says it is worth it ([`Broker::orphan_pending`]).
///
/// [`Broker::orphan_pending`]: crate::core::Broker::orphan_pending
async fn claim_orphan(shared: &Shared, cluster: &Cluster, req: &OrphanRequest) {
    if req.why == Orphaned::Fenced {
        return confirm_fenced(shared, cluster, req).await;
    }
    let client = &*req.client_id;
    let node = shared.links.as_ref().and_then(|l| l.node_id(req.owner));
    let mut pause = ORPHAN_PAUSE;
    loop {
        let pending = shared.broker.borrow().orphan_pending(client, req.owner);
        let Some(node) = node.filter(|_| pending) else {
            shared.broker.borrow_mut().orphan_given_up(client);
            return;
        };
        let claim = if req.why == Orphaned::Restarted {
            cluster.claim_ended(client, node, req.epoch).await
        } else {
            cluster.claim_orphan(client, node, req.epoch).await
        };
        match claim {
            Ok(OrphanClaim::Claimed { epoch, previous }) => {
                tracing::debug!(client_id = client, from = node, epoch, "orphan claimed");
                // Granted only once the owner's lease ran out, or its
                // run ended: its connection's will is this node's.
                let prev = previous.map(|(node, epoch)| {
                    let lapsed = true;
                    previous_owner(
                        shared,
                        Previous {
                            node,
                            epoch,
                            lapsed,
                        },
                    )
                });
                shared
                    .broker
                    .borrow_mut()
                    .orphan_claimed(Instant::now(), client, epoch, prev);
                shared.dispatch();
                return;
            }
            Ok(OrphanClaim::Moved) => {
                tracing::debug!(client_id = client, from = node, "orphan moved on");
                shared.broker.borrow_mut().orphan_given_up(client);
                return;
            }
            Err(e) => {
                tracing::debug!(client_id = client, from = node, error = %e,
                    "orphan claim refused for now");
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(ORPHAN_PAUSE_MAX);
    }
}

/// Ask whether the client id of `req`'s fenced will is still this node's
/// (see `Orphaned::Fenced`), and tell the core; tried while the core says
/// it is worth it ([`Broker::fenced_pending`]).
///
/// [`Broker::fenced_pending`]: crate::core::Broker::fenced_pending
async fn confirm_fenced(shared: &Shared, cluster: &Cluster, req: &OrphanRequest) {
    let client = &*req.client_id;
    let mut pause = ORPHAN_PAUSE;
    while shared.broker.borrow().fenced_pending(client) {
        let answer = match cluster
            .claim_ended(client, cluster.node_id(), req.epoch)
            .await
        {
            Ok(OrphanClaim::Claimed { epoch, .. }) => Some(epoch),
            Ok(OrphanClaim::Moved) => None,
            Err(e) => {
                tracing::debug!(client_id = client, error = %e, "fenced will not settled yet");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(ORPHAN_PAUSE_MAX);
                continue;
            }
        };
        tracing::debug!(client_id = client, ?answer, "fenced will settled");
        shared
            .broker
            .borrow_mut()
            .fenced_will_answered(Instant::now(), client, answer);
        shared.dispatch();
        return;
    }
    // Lost the lease again (asked anew when it is back), or settled.
    shared.broker.borrow_mut().orphan_given_up(client);
}

/// End the sessions whose client id another node claimed, until the
/// cluster stops.
pub(super) async fn lost_loop(
    shared: Rc<Shared>,
    cluster: Arc<Cluster>,
    mut lost: mpsc::Receiver<OwnershipLost>,
) {
    while let Some(l) = lost.recv().await {
        // A restarted node re-applies its log and hears of old losses
        // again: the table as applied now says who owns the id.
        if cluster
            .owner(&l.client_id)
            .is_some_and(|(owner, _)| owner == cluster.node_id())
        {
            continue;
        }
        tracing::debug!(client_id = %l.client_id, new_owner = l.new_owner, epoch = l.epoch,
            "client id claimed by another node");
        let to = shared
            .links
            .as_ref()
            .and_then(|k| k.known_peer(l.new_owner));
        // Each claim raises the epoch by one over its owner's. Passed only
        // for the latest claim as applied here; a claim re-applied after a
        // restart may still look the latest mid-replay, and the core then
        // adopts no copy written under a later claim than the one held.
        let latest = cluster.owner(&l.client_id) == Some((l.new_owner, l.epoch));
        let held = if latest { l.epoch.saturating_sub(1) } else { 0 };
        let loss = Loss {
            to,
            held,
            clean_start: l.clean_start,
            lapsed: l.lapsed,
            before: l.before.map(|b| owner_before(&shared, b)),
        };
        shared
            .broker
            .borrow_mut()
            .client_taken_from(Instant::now(), &l.client_id, loss);
        shared.dispatch();
    }
}

/// Drop the connection of a client id the leader is about to give to
/// another node (a fence: see `zerofan_cluster`'s leases), until the
/// cluster stops.
async fn fence_loop(
    shared: Rc<Shared>,
    cluster: Arc<Cluster>,
    mut fences: mpsc::Receiver<OwnershipLost>,
) {
    while let Some(f) = fences.recv().await {
        tracing::debug!(client_id = %f.client_id, new_owner = f.new_owner,
            "client id about to be claimed by another node");
        let to = shared
            .links
            .as_ref()
            .and_then(|k| k.known_peer(f.new_owner));
        // The claim is not applied yet: the table still names this node.
        let held = cluster
            .owner(&f.client_id)
            .filter(|(owner, _)| *owner == cluster.node_id())
            .map_or(0, |(_, epoch)| epoch);
        let loss = Loss {
            to,
            held,
            clean_start: f.clean_start,
            lapsed: false,
            before: f.before.map(|b| owner_before(&shared, b)),
        };
        shared
            .broker
            .borrow_mut()
            .client_fenced(Instant::now(), &f.client_id, loss);
        shared.dispatch();
    }
}

/// Tell the core when this node's ownership lease runs out or is renewed.
async fn lease_loop(
    shared: Rc<Shared>,
    mut lease: watch::Receiver<bool>,
    mut until: watch::Receiver<Option<(Instant, Instant)>>,
) {
    let mut was = true;
    loop {
        let held = *lease.borrow_and_update();
        shared
            .broker
            .borrow_mut()
            .cluster_lease(Instant::now(), held);
        if held && !was {
            if let Some(links) = shared.links.as_ref() {
                links.rejoined();
            }
        }
        was = held;
        shared.dispatch();
        loop {
            tokio::select! {
                changed = lease.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    break;
                }
                changed = until.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if let Some((sent, at)) = *until.borrow_and_update() {
                        shared
                            .broker
                            .borrow_mut()
                            .cluster_lease_until(Instant::now(), sent, at);
                        shared.dispatch();
                    }
                }
            }
        }
    }
}

/// Start the claim and ownership tasks of shard 0: from now on every
/// CONNECT with a client id waits for its claim.
pub(super) fn start(shared: &Rc<Shared>, cluster: Arc<Cluster>) -> Vec<JoinHandle<()>> {
    let unix_ms = zerofan_store::unix_ms();
    {
        let mut b = shared.broker.borrow_mut();
        b.set_claims(true);
        b.set_node_id(cluster.node_id(), Instant::now(), unix_ms);
    }
    let _ = shared.cluster.set(cluster.clone());
    let mut tasks = vec![tokio::task::spawn_local(claim_loop(
        shared.clone(),
        cluster.clone(),
    ))];
    if let Some(drains) = cluster.take_drains() {
        let drain = super::drain::drain_loop(shared.clone(), drains);
        tasks.push(tokio::task::spawn_local(drain));
    }
    if let Some(ids) = cluster.take_adopts() {
        let adopt = super::drain::adopt_loop(shared.clone(), ids);
        tasks.push(tokio::task::spawn_local(adopt));
    }
    if let Some(fences) = cluster.take_fences() {
        tasks.push(tokio::task::spawn_local(fence_loop(
            shared.clone(),
            cluster.clone(),
            fences,
        )));
    }
    tasks.push(tokio::task::spawn_local(lease_loop(
        shared.clone(),
        cluster.lease(),
        cluster.lease_until(),
    )));
    if let Some(lost) = cluster.take_ownership_lost() {
        tasks.push(tokio::task::spawn_local(lost_loop(
            shared.clone(),
            cluster,
            lost,
        )));
    }
    tasks
}

/// The links' view of the cluster node: its members (as they change), the
/// links other nodes opened to this one, and a dialer.
pub(super) fn link_setup(cluster: Arc<Cluster>) -> LinkSetup {
    let me = cluster.node_id();
    let (members_tx, members) = watch::channel(addresses(&cluster.members().borrow()));
    let mut changes = cluster.members();
    // Sent on tasks of the broker's runtime; they end with it.
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let now = addresses(&changes.borrow_and_update());
            if members_tx.send(now).is_err() {
                return;
            }
        }
    });
    let (incoming_tx, incoming) = mpsc::channel(64);
    if let Some(mut links) = cluster.take_links() {
        tokio::spawn(async move {
            while let Some((node, stream)) = links.recv().await {
                // Accepted on the cluster's runtime: a plain socket is
                // handed over as such, registered again where the links
                // run; a TLS one as it is.
                let link = match stream {
                    NodeStream::Plain(s) => match s.into_std() {
                        Ok(s) => IncomingLink::Socket(s),
                        Err(e) => {
                            tracing::debug!(node, error = %e, "link not handed over");
                            continue;
                        }
                    },
                    tls @ NodeStream::Tls(_) => IncomingLink::Io(Box::new(tls)),
                };
                if incoming_tx.send((node, link)).await.is_err() {
                    return;
                }
            }
        });
    }
    let dial: DialFn = Arc::new(move |node| {
        let c = cluster.clone();
        Box::pin(async move {
            match c.dial_link(node).await {
                Ok(NodeStream::Plain(s)) => Ok(LinkStream::Tcp(s)),
                Ok(tls) => Ok(LinkStream::Io(Box::new(tls))),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            }
        })
    });
    LinkSetup {
        me,
        members,
        incoming,
        dial,
        accept: None,
    }
}

/// Every member with its cluster address (a member whose address does not
/// parse is left out: it could not be dialed either).
fn addresses(m: &Members) -> Vec<(u64, SocketAddr)> {
    m.nodes
        .iter()
        .filter_map(|(id, n)| Some((*id, n.cluster_addr.parse().ok()?)))
        .collect()
}

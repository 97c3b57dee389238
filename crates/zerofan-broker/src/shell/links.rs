//! Links between the nodes of a cluster: each remote node is one more peer
//! of the core, behind a socket instead of a shard's inbox.
//!
//! Membership (who the nodes are), accepting links and dialing them belong
//! to the cluster layer; it hands them over as a [`LinkSetup`]. Here: one
//! connection per ordered pair of nodes, written by the node that dialed
//! it (its events for the other) and read by the one that accepted it.
//!
//! Each remote node has a send queue of encoded frames (`peer_wire`):
//! headers in their own small buffers, payloads as the publisher's `Bytes`,
//! written with vectored writes, as many frames per write as are queued.
//! Frames leave the queue only once the node acknowledges them (it does
//! after each read), and each connection starts with a handshake: the
//! writer's incarnation (`Hello`), and the reader's with how many of that
//! incarnation's frames it applied (`Resume`). The same node gets the
//! rest, exactly once and in order, whatever a broken connection lost. A
//! node new to the writer (restarted, or linked for the first time) gets
//! its full state instead: a `Sync` frame, its interests and retained
//! messages, then `Synced`. A node serves clients once every other
//! member's state has arrived (at most [`READY_WAIT`] after start), so
//! that a first subscription replays the cluster's retained messages.
//!
//! Bounded: past [`QUEUE_BYTES`] the node is congested, as a full shard
//! inbox is (QoS 0 for it dropped and counted, QoS 1/2 publishers not read
//! until it drains), unless it is away: nothing drains its queue then and
//! nothing waits for it, so it holds no publisher. Past [`QUEUE_HARD`] (a
//! node that stays away) the queue is shed ([`Queue::shed`]): its
//! messages are dropped, counted, so are its replica operations while it
//! is away, and of several interests in one filter, retained messages of
//! one topic or fences the last stays; the other events stay, so that its
//! routes and the acknowledgements waiting on it stay right.

use super::state::Shared;
use crate::core::peer_wire::{EncodedFrame, FrameDecoder, FrameEncoder, LinkFrame};
use crate::core::{PeerEvent, PeerId};
use bytes::BytesMut;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;

/// Opens the link to a node (its hello already exchanged).
pub type DialFn =
    Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = io::Result<LinkStream>> + Send>> + Send + Sync>;

/// What carries a link's bytes when it is not plain TCP (TLS).
pub trait LinkIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> LinkIo for T {}

/// A link this node dialed.
pub enum LinkStream {
    /// Plain TCP: its halves need no lock between them.
    Tcp(TcpStream),
    /// Anything else (mutual TLS between cluster nodes).
    Io(Box<dyn LinkIo>),
}

impl From<TcpStream> for LinkStream {
    fn from(s: TcpStream) -> LinkStream {
        LinkStream::Tcp(s)
    }
}

type LinkRd = Box<dyn AsyncRead + Unpin>;
type LinkWr = Box<dyn AsyncWrite + Unpin>;

impl LinkStream {
    fn split(self) -> (LinkRd, LinkWr) {
        match self {
            LinkStream::Tcp(s) => {
                let _ = s.set_nodelay(true);
                let (rd, wr) = s.into_split();
                (Box::new(rd), Box::new(wr))
            }
            LinkStream::Io(s) => {
                let (rd, wr) = tokio::io::split(s);
                (Box::new(rd), Box::new(wr))
            }
        }
    }
}

/// A link another node opened, as the cluster layer hands it over.
pub enum IncomingLink {
    /// A plain socket accepted on another runtime: registered again here.
    Socket(std::net::TcpStream),
    /// A stream with state that cannot move (TLS): read where it is; its
    /// socket stays registered with the runtime that accepted it, which
    /// keeps running.
    Io(Box<dyn LinkIo>),
}

/// What the cluster layer gives the broker to link it with the others.
pub struct LinkSetup {
    /// This node's id.
    pub me: u64,
    /// Every node, this one included, with its cluster address.
    pub members: watch::Receiver<Vec<(u64, SocketAddr)>>,
    /// Links other nodes opened to this one, with their node id (hello
    /// done).
    pub incoming: mpsc::Receiver<(u64, IncomingLink)>,
    /// Opens this node's link to a node.
    pub dial: DialFn,
    /// A listener whose links start with the dialer's node id (8 bytes,
    /// big-endian), accepted beside the broker: a static cluster's (see
    /// [`static_links`]), where no cluster layer hands links over.
    pub accept: Option<std::net::TcpListener>,
}

/// Queued bytes past which a node is congested.
pub const QUEUE_BYTES: usize = 8 << 20;
/// Queued memory past which the queue is shed ([`Queue::shed`]): its
/// frames' bytes and [`FRAME_COST`] each.
pub const QUEUE_HARD: usize = 64 << 20;
/// What a queued frame holds beside its bytes: the frame itself, 80 bytes
/// in a queue that grows by doubling, and its list of chunks. A node away
/// queued fences of 14 bytes at 230 bytes of RSS each (10,000 took 2.2 MiB,
/// 2026-11-30), so a bound on bytes alone let 64 MiB of them take 1 GiB.
const FRAME_COST: usize = 208;
/// Most bytes handed to one vectored write.
const WRITE_BATCH: usize = 1 << 20;
/// A node whose link stays down this long is away: SUBACKs and
/// acknowledgements stop waiting for it (see `Broker::set_peer_away`).
const AWAY_AFTER: Duration = Duration::from_secs(2);
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Longest a node waits for the other members' state before it serves
/// clients.
pub const READY_WAIT: Duration = Duration::from_secs(5);
/// Longest a link's handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(5);
/// Room kept free in a read buffer before each read.
const READ_ROOM: usize = 64 * 1024;

/// The links' figures (`/metrics`).
#[derive(Debug, Default)]
pub struct LinkStats {
    /// Messages written to other nodes (one per destination).
    pub forwarded_messages: Cell<u64>,
    /// Bytes written to other nodes.
    pub forwarded_bytes: Cell<u64>,
    /// Bytes read from other nodes.
    pub received_bytes: Cell<u64>,
    /// Frames written to other nodes.
    pub sent_frames: Cell<u64>,
    /// Frames read from other nodes.
    pub received_frames: Cell<u64>,
    /// Messages dropped because a node's queue passed [`QUEUE_HARD`].
    pub dropped_messages: Cell<u64>,
    /// Other frames dropped then (see [`Queue::shed`]).
    pub shed_frames: Cell<u64>,
    /// Links (re)connected.
    pub connects: Cell<u64>,
    /// Failed dials.
    pub dial_failures: Cell<u64>,
    /// Links closed for a frame that could not be read.
    pub bad_frames: Cell<u64>,
    /// Links refused: from a node that is not a member.
    pub refused_links: Cell<u64>,
}

fn bump(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

/// One remote node's send side.
struct Queue {
    node: u64,
    frames: VecDeque<EncodedFrame>,
    bytes: usize,
    /// Shed past this weight ([`Queue::weight`], see [`Queue::overflows`]).
    shed_at: usize,
    /// The number of the frame at the front (frames are numbered per
    /// incarnation of the node, from its first link).
    base: u64,
    /// Frames at the front written (or being written) and not yet
    /// acknowledged: an overflow drop spares them.
    sent: usize,
    /// The node's incarnation, once a link to it came up.
    peer_incarnation: Option<u64>,
    congested: bool,
    wake: Rc<Notify>,
    /// Dial now (see [`Links::redial`]).
    redial: Rc<Notify>,
    writer: Option<JoinHandle<()>>,
}

impl Queue {
    fn new(node: u64, wake: Rc<Notify>, redial: Rc<Notify>) -> Self {
        Queue {
            node,
            frames: VecDeque::new(),
            bytes: 0,
            shed_at: QUEUE_HARD,
            base: 0,
            sent: 0,
            peer_incarnation: None,
            congested: false,
            wake,
            redial,
            writer: None,
        }
    }

    /// The memory the queue holds, as [`QUEUE_HARD`] counts it.
    fn weight(&self) -> usize {
        self.bytes + self.frames.len() * FRAME_COST
    }

    /// Past [`QUEUE_HARD`], or twice what the last shedding kept (which
    /// the node's state alone may pass: shedding again at once would
    /// drop nothing and cost a pass over the queue each time).
    fn overflows(&mut self) -> bool {
        let weight = self.weight();
        self.shed_at = self.shed_at.min(QUEUE_HARD.max(2 * weight));
        weight > self.shed_at
    }

    /// Drop from the frames not yet written what the node can do without:
    /// every message; replica operations while it is `away` (back, it
    /// gets full images); and each frame that sets state a later one sets
    /// anew (an interest, a retained message, a fence: `StateKey`). The
    /// other events stay, so that its routes and the acknowledgements
    /// waiting on it stay right; the state frames kept are bounded by the
    /// filters and retained topics this node has. Returns the messages and
    /// the other frames dropped.
    fn shed(&mut self, away: bool) -> (u64, u64) {
        let mut keep = vec![true; self.frames.len()];
        {
            let mut later = std::collections::HashSet::new();
            for (i, f) in self.frames.iter().enumerate().skip(self.sent).rev() {
                keep[i] = f.publish.is_none()
                    && !(away && f.replica)
                    && f.state.as_ref().is_none_or(|k| later.insert(k));
            }
        }
        let (mut messages, mut other) = (0, 0);
        let mut i = 0;
        self.frames.retain(|f| {
            let kept = keep[i];
            i += 1;
            if !kept {
                if f.publish.is_some() {
                    messages += 1;
                } else {
                    other += 1;
                }
            }
            kept
        });
        self.bytes = self.frames.iter().map(|f| f.len).sum();
        self.shed_at = QUEUE_HARD.max(2 * self.weight());
        (messages, other)
    }
}

/// The links of one node (shard 0 of it: a cluster runs one shard).
pub(super) struct Links {
    me: u64,
    /// Node id to this core's peer id, and back.
    ids: RefCell<HashMap<u64, PeerId>>,
    queues: RefCell<HashMap<PeerId, Queue>>,
    readers: RefCell<HashMap<u64, JoinHandle<()>>>,
    enc: RefCell<FrameEncoder>,
    /// This run of this node (see `LinkFrame::Hello`).
    incarnation: u64,
    /// Per node that links to us: its incarnation, and how many of its
    /// frames we applied (kept across its links).
    applied: RefCell<HashMap<u64, (u64, u64)>>,
    /// Nodes whose whole state has arrived (a `Synced` frame).
    synced: RefCell<std::collections::HashSet<u64>>,
    /// The other members, as last known.
    expected: RefCell<Vec<u64>>,
    /// Every other member's state has arrived (or `READY_WAIT` passed).
    ready: Cell<bool>,
    ready_wake: Notify,
    pub(super) stats: LinkStats,
}

impl Links {
    pub(super) fn new(me: u64) -> Links {
        Links {
            me,
            ids: RefCell::default(),
            queues: RefCell::default(),
            readers: RefCell::default(),
            enc: RefCell::default(),
            incarnation: incarnation(),
            applied: RefCell::default(),
            synced: RefCell::default(),
            expected: RefCell::default(),
            ready: Cell::new(false),
            ready_wake: Notify::new(),
            stats: LinkStats::default(),
        }
    }

    /// Wait until every other member's state (interests, retained
    /// messages) has arrived, so that a client's first subscription
    /// replays the cluster's retained messages; at most `READY_WAIT`, so
    /// that a node whose peers are down still serves.
    pub(super) async fn ready(&self) {
        let wait = async {
            loop {
                let woken = self.ready_wake.notified();
                if self.ready.get() {
                    return;
                }
                woken.await;
            }
        };
        if tokio::time::timeout(READY_WAIT, wait).await.is_err() {
            tracing::warn!("serving before every node's state arrived");
            self.ready.set(true);
        }
    }

    /// Whether the listeners serve (see [`Links::ready`]).
    pub(super) fn is_ready(&self) -> bool {
        self.ready.get()
    }

    /// The members are `now` (this node among them): the others are
    /// waited for. An empty list is a membership not known yet (a
    /// restarted node before its log is read), not a node alone: serving
    /// then would route its first clients' messages past every other
    /// node's subscribers, and acknowledge them.
    fn set_members(&self, now: &[u64]) {
        *self.expected.borrow_mut() = now.iter().copied().filter(|&n| n != self.me).collect();
        if !now.is_empty() {
            self.check_ready();
        }
    }

    fn check_ready(&self) {
        if self.ready.get() {
            return;
        }
        let synced = self.synced.borrow();
        if self.expected.borrow().iter().all(|n| synced.contains(n)) {
            self.ready.set(true);
            self.ready_wake.notify_waiters();
        }
    }

    /// The peer id of `node` (this core is peer 0; nodes from 1 on, in
    /// the order first seen). `None` past the id space.
    fn peer_of(&self, node: u64) -> Option<PeerId> {
        let mut ids = self.ids.borrow_mut();
        if let Some(&p) = ids.get(&node) {
            return Some(p);
        }
        let p = PeerId(u16::try_from(ids.len() + 1).ok()?);
        ids.insert(node, p);
        Some(p)
    }

    /// The peer id of `node` if it has one (no new one given).
    pub(super) fn known_peer(&self, node: u64) -> Option<PeerId> {
        self.ids.borrow().get(&node).copied()
    }

    /// Peer ids are this node's own (in the order first seen): those an
    /// event names cross as node ids, which fit 16 bits
    /// (`cluster::MAX_NODE_ID`, checked at start). Returns false for an
    /// event not to send: a flush naming a node with no id (never linked).
    fn to_wire(&self, e: &mut PeerEvent) -> bool {
        if let PeerEvent::Flushed { to: Some(p), .. } = e {
            match self.node_of(*p) {
                Some(n) => *p = n,
                None => return false,
            }
        }
        self.stranded_to_wire(e);
        true
    }

    /// The nodes a message is stranded for cross as node ids. Should none
    /// be left, the message crosses as a plain publish (an empty list
    /// would mean the receiver's own sessions).
    fn stranded_to_wire(&self, e: &mut PeerEvent) {
        let PeerEvent::Stranded(st) = e else {
            return;
        };
        if st.owners.is_empty() {
            return;
        }
        self.owners_to_nodes(&mut st.owners);
        if st.owners.is_empty() {
            let publish = PeerEvent::Publish {
                msg: st.msg.for_peer(),
                direct: st.direct,
                shares: std::mem::take(&mut st.shares),
                id: None,
            };
            *e = publish;
        }
    }

    fn owners_to_nodes(&self, owners: &mut Vec<PeerId>) {
        owners.retain_mut(|p| match self.node_of(*p) {
            Some(n) => {
                *p = n;
                true
            }
            None => false,
        });
    }

    /// The node id of this node's peer `p`, as it crosses (16 bits).
    fn node_of(&self, p: PeerId) -> Option<PeerId> {
        u16::try_from(self.node_id(p)?).ok().map(PeerId)
    }

    /// The node whose peer id is `p`.
    pub(super) fn node_id(&self, p: PeerId) -> Option<u64> {
        let ids = self.ids.borrow();
        ids.iter().find(|(_, q)| **q == p).map(|(n, _)| *n)
    }

    /// The node ids an event names as this node's peer ids (`None`: an
    /// event to drop, a flush of a move to a node never linked here, which
    /// no move here waits for).
    ///
    /// A stranded message's owners it never linked to hold no copy here:
    /// when none is left, the message is for the subscribers here only (an
    /// empty list would mean the receiver's own sessions, see
    /// `core::strand`).
    fn nodes_to_owners(&self, event: PeerEvent) -> Option<PeerEvent> {
        let mut st = match event {
            PeerEvent::Stranded(st) => st,
            PeerEvent::Flushed {
                client,
                to: Some(n),
            } => {
                let to = if u64::from(n.0) == self.me {
                    PeerId(0)
                } else {
                    self.known_peer(u64::from(n.0))?
                };
                return Some(PeerEvent::Flushed {
                    client,
                    to: Some(to),
                });
            }
            other => return Some(other),
        };
        if st.owners.is_empty() {
            return Some(PeerEvent::Stranded(st));
        }
        st.owners = st
            .owners
            .iter()
            .filter_map(|n| self.known_peer(u64::from(n.0)))
            .collect();
        if st.owners.is_empty() {
            return Some(PeerEvent::Publish {
                msg: st.msg,
                direct: st.direct,
                shares: st.shares,
                id: None,
            });
        }
        Some(PeerEvent::Stranded(st))
    }

    /// Encode what the core has for other nodes into their queues (from
    /// `Shared::dispatch`).
    pub(super) fn send_from(&self, shared: &Shared) {
        let now = Instant::now();
        loop {
            let batch = shared.broker.borrow_mut().poll_peer_transmit();
            let Some(mut batch) = batch else {
                return;
            };
            batch.events.retain_mut(|e| self.to_wire(e));
            let mut congested = false;
            {
                let mut queues = self.queues.borrow_mut();
                let Some(q) = queues.get_mut(&batch.to) else {
                    continue;
                };
                let mut enc = self.enc.borrow_mut();
                for e in &batch.events {
                    match enc.encode(e, now) {
                        Ok(f) => {
                            q.bytes += f.len;
                            q.frames.push_back(f);
                        }
                        Err(err) => {
                            tracing::warn!(node = q.node, error = %err, "event not sent to node")
                        }
                    }
                }
                if q.overflows() {
                    let away = shared.broker.borrow().is_peer_away(batch.to);
                    let (messages, other) = q.shed(away);
                    bump(&self.stats.dropped_messages, messages);
                    bump(&self.stats.shed_frames, other);
                }
                if q.bytes > QUEUE_BYTES && !q.congested {
                    q.congested = true;
                    congested = true;
                }
                q.wake.notify_one();
            }
            if congested {
                shared
                    .broker
                    .borrow_mut()
                    .set_peer_congested(batch.to, true);
            }
        }
    }

    /// Queue a frame of the links' own for `peer`.
    fn push(&self, peer: PeerId, make: impl FnOnce(&mut FrameEncoder) -> Option<EncodedFrame>) {
        if let Some(q) = self.queues.borrow_mut().get_mut(&peer) {
            let Some(f) = make(&mut self.enc.borrow_mut()) else {
                return;
            };
            q.bytes += f.len;
            q.frames.push_back(f);
            q.wake.notify_one();
        }
    }

    /// `node` is most likely reachable again (it linked to us): if our
    /// link to it is down, dial it now rather than after the backoff, and
    /// wait for it again (not away) meanwhile, so that a SUBACK made from
    /// now on waits until it has the subscription; it is away again once
    /// its link has been down [`AWAY_AFTER`] anew.
    pub(super) fn redial(&self, node: u64) {
        for q in self.queues.borrow().values() {
            if q.node == node {
                q.redial.notify_waiters();
            }
        }
    }

    /// This node is back in touch with a majority (its cluster lease was
    /// renewed after it ran out): it serves clients again, and its links,
    /// cut with the rest, may still wait out their backoff. Every node is
    /// dialed now and waited for again (see [`Links::redial`]).
    pub(super) fn rejoined(&self) {
        for q in self.queues.borrow().values() {
            q.redial.notify_waiters();
        }
    }

    /// Figures for `/metrics`.
    pub(super) fn stats_into(&self, st: &mut crate::core::ShellStats) {
        let s = &self.stats;
        st.cluster_forwarded_messages += s.forwarded_messages.get();
        st.cluster_forwarded_bytes += s.forwarded_bytes.get();
        st.cluster_received_bytes += s.received_bytes.get();
        st.cluster_dropped_messages += s.dropped_messages.get();
        st.cluster_shed_frames += s.shed_frames.get();
        st.cluster_link_connects += s.connects.get();
        st.cluster_frames_sent += s.sent_frames.get();
        st.cluster_frames_received += s.received_frames.get();
        st.cluster_dial_failures += s.dial_failures.get();
        st.cluster_bad_frames += s.bad_frames.get() + s.refused_links.get();
    }
}

/// A number no other run of any node is likely to have drawn: the clock,
/// and a count for runs that start in the same nanosecond.
fn incarnation() -> u64 {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ RUNS
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .rotate_left(40)
}

/// Start linking: follow the membership, accept links, dial the others.
pub(super) fn start(shared: &Rc<Shared>, setup: LinkSetup) -> Vec<JoinHandle<()>> {
    let LinkSetup {
        members,
        incoming,
        dial,
        accept,
        ..
    } = setup;
    let mut tasks = vec![
        tokio::task::spawn_local(follow_members(shared.clone(), members, dial)),
        tokio::task::spawn_local(accept_links(shared.clone(), incoming)),
    ];
    if let Some(l) = accept {
        tasks.push(tokio::task::spawn_local(accept_static(shared.clone(), l)));
    }
    tasks
}

/// Add nodes that joined (a queue and a writer each), remove nodes that
/// left.
async fn follow_members(
    shared: Rc<Shared>,
    mut members: watch::Receiver<Vec<(u64, SocketAddr)>>,
    dial: DialFn,
) {
    let Some(links) = shared.links.as_ref() else {
        return;
    };
    loop {
        let now: Vec<u64> = members.borrow_and_update().iter().map(|m| m.0).collect();
        links.set_members(&now);
        let known: Vec<(u64, PeerId)> = links
            .queues
            .borrow()
            .iter()
            .map(|(p, q)| (q.node, *p))
            .collect();
        for (node, peer) in &known {
            if !now.contains(node) {
                if let Some(q) = links.queues.borrow_mut().remove(peer) {
                    if let Some(w) = q.writer {
                        w.abort();
                    }
                }
                if let Some(r) = links.readers.borrow_mut().remove(node) {
                    r.abort();
                }
                shared.broker.borrow_mut().peer_left(*peer);
                tracing::info!(node, "node left");
            }
        }
        for &node in &now {
            if node == links.me || known.iter().any(|k| k.0 == node) {
                continue;
            }
            let Some(peer) = links.peer_of(node) else {
                tracing::warn!(node, "too many nodes: not linked");
                continue;
            };
            let wake = Rc::new(Notify::new());
            let redial = Rc::new(Notify::new());
            links
                .queues
                .borrow_mut()
                .insert(peer, Queue::new(node, wake.clone(), redial.clone()));
            // Its state is queued again when the first link is up.
            shared.broker.borrow_mut().add_peer(peer);
            let w = tokio::task::spawn_local(write_link(
                shared.clone(),
                node,
                peer,
                (wake, redial),
                dial.clone(),
            ));
            if let Some(q) = links.queues.borrow_mut().get_mut(&peer) {
                q.writer = Some(w);
            }
            tracing::info!(node, "node joined");
        }
        shared.dispatch();
        if members.changed().await.is_err() {
            // Nobody changes the membership any more: keep it as it is.
            return;
        }
    }
}

/// Keep the link to `node` up and write its queue.
async fn write_link(
    shared: Rc<Shared>,
    node: u64,
    peer: PeerId,
    (wake, redial): (Rc<Notify>, Rc<Notify>),
    dial: DialFn,
) {
    let Some(links) = shared.links.as_ref() else {
        return;
    };
    let mut backoff = BACKOFF_MIN;
    let mut away = Away {
        since: Some(Instant::now()),
        marked: false,
    };
    loop {
        let stream = match dial(node).await {
            Ok(s) => s,
            Err(e) => {
                bump(&links.stats.dial_failures, 1);
                tracing::debug!(node, error = %e, "cannot reach node");
                away.check(&shared, node, peer);
                backoff = away.pause(&shared, peer, &redial, backoff).await;
                continue;
            }
        };
        let (mut rd, mut wr) = stream.split();
        let mut buf = BytesMut::new();
        let shake = tokio::time::timeout(
            HANDSHAKE,
            handshake(&shared, links, peer, &mut rd, &mut wr, &mut buf),
        )
        .await;
        match shake {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(node, error = %e, "link handshake failed");
                away.check(&shared, node, peer);
                backoff = away.pause(&shared, peer, &redial, backoff).await;
                continue;
            }
            Err(_) => {
                tracing::debug!(node, "link handshake timed out");
                away.check(&shared, node, peer);
                backoff = away.pause(&shared, peer, &redial, backoff).await;
                continue;
            }
        }
        backoff = BACKOFF_MIN;
        away.back(&shared, peer);
        bump(&links.stats.connects, 1);
        tracing::info!(node, "link up");
        let down = tokio::select! {
            r = write_queue(links, peer, &wake, &mut wr) => r,
            r = read_acks(&shared, links, peer, &mut rd, buf) => r,
            r = watch_acks(&shared, links, node, peer, &mut away) => r,
        };
        away.since = Some(Instant::now());
        if let Err(e) = down {
            tracing::info!(node, error = %e, "link down");
        }
    }
}

/// Since when a node's link is down, and whether the core was told.
struct Away {
    since: Option<Instant>,
    marked: bool,
}

impl Away {
    /// Down for [`AWAY_AFTER`]: the core stops waiting for the node.
    fn check(&mut self, shared: &Shared, node: u64, peer: PeerId) {
        if self.since.is_some_and(|t| t.elapsed() >= AWAY_AFTER) {
            self.mark(shared, node, peer);
        }
    }

    fn mark(&mut self, shared: &Shared, node: u64, peer: PeerId) {
        if !self.marked {
            self.marked = true;
            tracing::info!(node, "node unreachable: not waited for");
            // Its link went down at `since`: its clients' connections
            // were lost by then, should it be dead.
            shared
                .broker
                .borrow_mut()
                .set_peer_away_since(peer, true, self.since);
            shared.dispatch();
        }
    }

    /// Wait `backoff` before the next dial; returns the one after it. Cut
    /// short by [`Links::redial`]: then the node is waited for again until
    /// its link has been down [`AWAY_AFTER`] from now.
    async fn pause(
        &mut self,
        shared: &Shared,
        peer: PeerId,
        redial: &Notify,
        backoff: Duration,
    ) -> Duration {
        tokio::select! {
            _ = tokio::time::sleep(backoff) => (backoff * 2).min(BACKOFF_MAX),
            _ = redial.notified() => {
                self.back(shared, peer);
                self.since = Some(Instant::now());
                BACKOFF_MIN
            }
        }
    }

    /// The link is up again.
    fn back(&mut self, shared: &Shared, peer: PeerId) {
        self.since = None;
        if self.marked {
            self.marked = false;
            shared.broker.borrow_mut().set_peer_away(peer, false);
        }
    }
}

/// Say who we are; learn what the node already has of ours. The same
/// node (same incarnation) that applied frames up to `next` gets the rest
/// (those it had not applied, written to the broken link or not), exactly
/// once and in order. A node new to us (restarted, or a first link) gets
/// this core's whole state instead: a `Sync`, every interest and retained
/// message, `Synced`; what was queued for its former self is dropped.
async fn handshake(
    shared: &Shared,
    links: &Links,
    peer: PeerId,
    rd: &mut LinkRd,
    wr: &mut LinkWr,
    buf: &mut BytesMut,
) -> io::Result<()> {
    write_control(links, wr, &LinkFrame::Hello(links.incarnation)).await?;
    let LinkFrame::Resume { incarnation, next } = read_frame(rd, buf).await? else {
        return Err(bad("expected Resume"));
    };
    let resumed = {
        let mut queues = links.queues.borrow_mut();
        let Some(q) = queues.get_mut(&peer) else {
            return Err(io::ErrorKind::NotFound.into());
        };
        let on_wire = q.base..=q.base + q.sent as u64;
        if q.peer_incarnation == Some(incarnation) && on_wire.contains(&next) {
            // Applied there: gone from here.
            let done = usize::try_from(next - q.base).unwrap_or(usize::MAX);
            for f in q.frames.drain(..done.min(q.frames.len())) {
                q.bytes = q.bytes.saturating_sub(f.len);
            }
            q.base = next;
            q.sent = 0;
            Start::Resumed
        } else {
            let first = q.peer_incarnation.is_none();
            q.peer_incarnation = Some(incarnation);
            if first {
                Start::First
            } else {
                Start::Fresh
            }
        }
    };
    match resumed {
        Start::Resumed => shared.broker.borrow_mut().peer_resumed(peer),
        Start::First => first_state(shared, links, peer),
        Start::Fresh => fresh_state(shared, links, peer),
    }
    let first = links.queues.borrow().get(&peer).map_or(0, |q| q.base);
    write_control(links, wr, &LinkFrame::Start(first)).await?;
    release_if_drained(shared, links, peer);
    Ok(())
}

/// How a link starts.
enum Start {
    /// The same node as before: what it had not applied follows.
    Resumed,
    /// This process's first link to the node: its queue holds this core's
    /// whole state, given when the node became a member, and every event
    /// since, none sent yet.
    First,
    /// A node new to us (restarted): its queue starts over.
    Fresh,
}

/// This process's first link to `peer`: what waits in its queue goes,
/// between a `Sync` (the node forgets what an earlier run of this one
/// said) and a `Synced`. A node restarted a moment ago queues events for
/// the others before its links are up (a handover, a relay of a session
/// claimed elsewhere meanwhile). Dropped, as a fresh start drops them,
/// they left the new owner waiting for that handover in vain and
/// dropping the relays, and the messages they carried were lost.
fn first_state(shared: &Shared, links: &Links, peer: PeerId) {
    shared.dispatch();
    if let Some(q) = links.queues.borrow_mut().get_mut(&peer) {
        let f = links.enc.borrow_mut().sync();
        q.bytes += f.len;
        q.frames.push_front(f);
    }
    links.push(peer, |enc| Some(enc.synced()));
}

/// Start `peer`'s queue over with this core's whole state: the queue
/// empties, the core queues its state anew, and the link goes on as a
/// first one does.
fn fresh_state(shared: &Shared, links: &Links, peer: PeerId) {
    // Whatever the core still holds for the node goes with the rest.
    shared.dispatch();
    if let Some(q) = links.queues.borrow_mut().get_mut(&peer) {
        let dropped = q.frames.iter().filter(|f| f.publish.is_some()).count();
        bump(&links.stats.dropped_messages, dropped as u64);
        q.frames.clear();
        q.bytes = 0;
        q.base = 0;
        q.sent = 0;
    }
    shared.broker.borrow_mut().peer_joined(peer);
    first_state(shared, links, peer);
}

/// The node is no longer congested once its queue is half empty.
fn release_if_drained(shared: &Shared, links: &Links, peer: PeerId) {
    let drained = match links.queues.borrow_mut().get_mut(&peer) {
        Some(q) if q.congested && q.bytes <= QUEUE_BYTES / 2 => {
            q.congested = false;
            true
        }
        _ => false,
    };
    if drained {
        shared.broker.borrow_mut().set_peer_congested(peer, false);
        shared.dispatch();
    }
}

fn bad(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

async fn write_control(
    links: &Links,
    wr: &mut (impl tokio::io::AsyncWrite + Unpin),
    frame: &LinkFrame,
) -> io::Result<()> {
    let f = links
        .enc
        .borrow_mut()
        .control(frame)
        .ok_or_else(|| bad("not a control frame"))?;
    let mut chunks = VecDeque::from(f.chunks);
    super::writer::write_chunks(wr, &mut chunks).await?;
    Ok(())
}

/// The next frame from `rd` (control frames only: no time-dependent
/// content).
async fn read_frame(
    rd: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut BytesMut,
) -> io::Result<LinkFrame> {
    let mut dec = FrameDecoder::default();
    loop {
        match dec.decode(buf, Instant::now()) {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => return Err(bad(e.0)),
        }
        buf.reserve(256);
        if rd.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// Write the queue as it fills, until the connection fails. Frames stay
/// queued until the node acknowledges them (`read_acks`).
async fn write_queue(
    links: &Links,
    peer: PeerId,
    wake: &Notify,
    wr: &mut LinkWr,
) -> io::Result<()> {
    let mut chunks = VecDeque::new();
    loop {
        let (n, bytes, messages) = {
            let mut queues = links.queues.borrow_mut();
            let Some(q) = queues.get_mut(&peer) else {
                return Ok(());
            };
            let (mut n, mut bytes, mut messages) = (0, 0, 0);
            for f in q.frames.iter().skip(q.sent) {
                if bytes > 0 && bytes + f.len > WRITE_BATCH {
                    break;
                }
                chunks.extend(f.chunks.iter().cloned());
                n += 1;
                bytes += f.len;
                messages += u64::from(f.publish.is_some());
            }
            // On the wire from now: an overflow drop spares them.
            q.sent += n;
            (n, bytes, messages)
        };
        if n == 0 {
            wake.notified().await;
            continue;
        }
        super::writer::write_chunks(wr, &mut chunks).await?;
        chunks.clear();
        bump(&links.stats.forwarded_bytes, bytes as u64);
        bump(&links.stats.forwarded_messages, messages);
        bump(&links.stats.sent_frames, n as u64);
    }
}

/// Drop the frames the node acknowledges, until the connection fails.
/// While the link is up: a node that acknowledges none of the frames
/// written to it for [`AWAY_AFTER`] (a paused or stuck process: its socket
/// still accepts bytes) is away until it acknowledges again. Time this
/// process itself stood still (paused, starved) does not count: its
/// acknowledgements may be waiting unread, and marking a node away and
/// back costs full images. Never returns on its own.
async fn watch_acks(
    shared: &Shared,
    links: &Links,
    node: u64,
    peer: PeerId,
    away: &mut Away,
) -> io::Result<()> {
    let mut last = None;
    let mut stuck_since = Instant::now();
    loop {
        let slept = Instant::now();
        tokio::time::sleep(AWAY_AFTER / 4).await;
        if slept.elapsed() >= AWAY_AFTER {
            stuck_since = Instant::now();
            continue;
        }
        let state = links
            .queues
            .borrow()
            .get(&peer)
            .map(|q| (q.base, q.sent > 0 || !q.frames.is_empty()));
        let Some((base, waiting)) = state else {
            continue;
        };
        if !waiting || last != Some(base) {
            last = Some(base);
            stuck_since = Instant::now();
            away.back(shared, peer);
        } else if stuck_since.elapsed() >= AWAY_AFTER {
            away.mark(shared, node, peer);
        }
    }
}

async fn read_acks(
    shared: &Shared,
    links: &Links,
    peer: PeerId,
    rd: &mut LinkRd,
    mut buf: BytesMut,
) -> io::Result<()> {
    loop {
        let LinkFrame::Ack(next) = read_frame(rd, &mut buf).await? else {
            return Err(bad("expected Ack"));
        };
        if let Some(q) = links.queues.borrow_mut().get_mut(&peer) {
            let done = usize::try_from(next.saturating_sub(q.base))
                .unwrap_or(usize::MAX)
                .min(q.sent);
            for f in q.frames.drain(..done) {
                q.bytes = q.bytes.saturating_sub(f.len);
            }
            q.base += done as u64;
            q.sent -= done;
        }
        release_if_drained(shared, links, peer);
    }
}

/// Take the links other nodes open to this one.
async fn accept_links(shared: Rc<Shared>, mut incoming: mpsc::Receiver<(u64, IncomingLink)>) {
    let Some(links) = shared.links.as_ref() else {
        return;
    };
    while let Some((node, stream)) = incoming.recv().await {
        let stream: Box<dyn LinkIo> = match stream {
            IncomingLink::Socket(s) => {
                match s
                    .set_nonblocking(true)
                    .and_then(|()| TcpStream::from_std(s))
                {
                    Ok(s) => Box::new(s),
                    Err(e) => {
                        tracing::warn!(node, error = %e, "link not accepted");
                        continue;
                    }
                }
            }
            IncomingLink::Io(s) => s,
        };
        linked(&shared, links, node, stream);
    }
}

/// Read the link `node` opened.
fn linked(shared: &Rc<Shared>, links: &Links, node: u64, stream: Box<dyn LinkIo>) {
    // A node removed (or not yet known) may not route here: it dials
    // again, and is read once the membership has it.
    if !links.expected.borrow().contains(&node) {
        bump(&links.stats.refused_links, 1);
        tracing::info!(node, "link from a node that is not a member refused");
        return;
    }
    let Some(peer) = links.peer_of(node) else {
        return;
    };
    // It reached us: our link to it may come back without waiting.
    links.redial(node);
    let task = tokio::task::spawn_local(read_link(shared.clone(), node, peer, stream));
    // The newest link from a node replaces an older one.
    if let Some(old) = links.readers.borrow_mut().insert(node, task) {
        old.abort();
    }
}

/// Accept links on a static cluster's listener: each starts with the
/// dialer's node id.
async fn accept_static(shared: Rc<Shared>, listener: std::net::TcpListener) {
    let Some(links) = shared.links.as_ref() else {
        return;
    };
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot accept cluster links");
            return;
        }
    };
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            continue;
        };
        let mut id = [0u8; 8];
        // A hello that does not come in time is no link.
        let hello = tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut id)).await;
        if let Ok(Ok(_)) = hello {
            linked(&shared, links, u64::from_be_bytes(id), Box::new(s));
        }
    }
}

/// Read `node`'s events into the core until its link closes.
async fn read_link(shared: Rc<Shared>, node: u64, peer: PeerId, mut stream: Box<dyn LinkIo>) {
    let Some(links) = shared.links.as_ref() else {
        return;
    };
    let mut buf = BytesMut::new();
    let mut next =
        match tokio::time::timeout(HANDSHAKE, answer_hello(links, node, &mut stream, &mut buf))
            .await
        {
            Ok(Ok((n, restarted))) => {
                if restarted {
                    // Before anything of its new run is applied here.
                    shared.broker.borrow_mut().peer_restarted(peer);
                }
                n
            }
            Ok(Err(e)) => {
                tracing::info!(node, error = %e, "link from node refused");
                return;
            }
            Err(_) => return,
        };
    let mut acked = next;
    let mut dec = FrameDecoder::default();
    loop {
        // What the handshake read past its own frames comes first.
        let now = Instant::now();
        shared.broker.borrow_mut().begin_peer_read();
        let failed = loop {
            let frame = dec.decode(&mut buf, now);
            if let Ok(Some(_)) = frame {
                next += 1;
            }
            let mut broker = shared.broker.borrow_mut();
            match frame {
                Ok(Some(LinkFrame::Event(e))) => {
                    if let Some(e) = links.nodes_to_owners(e) {
                        broker.handle_peer(now, peer, e)
                    }
                }
                Ok(Some(LinkFrame::Sync)) => {
                    broker.peer_reset(peer);
                    // Its link to us is new: what we answered it on the
                    // old one may be lost. It asks us the same way.
                    let seq = broker.peer_seq();
                    drop(broker);
                    links.push(peer, |enc| Some(enc.ask(seq)));
                }
                Ok(Some(LinkFrame::Synced)) => {
                    drop(broker);
                    links.synced.borrow_mut().insert(node);
                    links.check_ready();
                }
                Ok(Some(LinkFrame::Ask(seq))) => {
                    // Answered as a `Fence` is: once what this node wrote
                    // so far is durable, behind any earlier answer.
                    broker.handle_peer(now, peer, PeerEvent::Fence { seq });
                }
                Ok(Some(_)) => {
                    break Some(crate::core::peer_wire::WireError(
                        "handshake frame after the handshake",
                    ))
                }
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        shared.broker.borrow_mut().end_peer_read();
        bump(&links.stats.received_frames, dec.frames);
        dec.frames = 0;
        if let Some((_, applied)) = links.applied.borrow_mut().get_mut(&node) {
            *applied = next;
        }
        shared.dispatch();
        if let Some(e) = failed {
            bump(&links.stats.bad_frames, 1);
            tracing::warn!(node, error = %e, "closing link after a bad frame");
            return;
        }
        if next != acked {
            acked = next;
            if write_control(links, &mut stream, &LinkFrame::Ack(next))
                .await
                .is_err()
            {
                return;
            }
        }
        if buf.capacity() - buf.len() < READ_ROOM / 4 {
            buf.reserve(READ_ROOM);
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) => return,
            Ok(n) => bump(&links.stats.received_bytes, n as u64),
            Err(e) => {
                tracing::info!(node, error = %e, "link from node closed");
                return;
            }
        }
    }
}

/// The reader's half of the handshake (see `handshake`): returns the
/// number of the writer's next frame, and whether the writer is a new run
/// of a node an earlier run of which linked here (it restarted).
async fn answer_hello(
    links: &Links,
    node: u64,
    stream: &mut Box<dyn LinkIo>,
    buf: &mut BytesMut,
) -> io::Result<(u64, bool)> {
    let LinkFrame::Hello(inc) = read_frame(stream, buf).await? else {
        return Err(bad("expected Hello"));
    };
    // Recorded once the handshake is through: one cut short is told the
    // same again next time.
    let (next, restarted) = match links.applied.borrow().get(&node) {
        Some(&(known, next)) if known == inc => (next, false),
        Some(_) => (0, true),
        None => (0, false),
    };
    let resume = LinkFrame::Resume {
        incarnation: links.incarnation,
        next,
    };
    write_control(links, stream, &resume).await?;
    let LinkFrame::Start(first) = read_frame(stream, buf).await? else {
        return Err(bad("expected Start"));
    };
    links.applied.borrow_mut().insert(node, (inc, first));
    Ok((first, restarted))
}

/// A static cluster for tests and fixed setups: the membership changes
/// only through the returned sender, links are accepted on `listener`,
/// and a link's hello is the dialer's node id, 8 bytes big-endian.
pub fn static_links(
    me: u64,
    members: Vec<(u64, SocketAddr)>,
    listener: std::net::TcpListener,
) -> (LinkSetup, watch::Sender<Vec<(u64, SocketAddr)>>) {
    let (tx, rx) = watch::channel(members);
    // Nobody hands links over: they come from `listener`.
    let (_, in_rx) = mpsc::channel(1);
    let book = rx.clone();
    let dial: DialFn = Arc::new(move |node| {
        let addr = book.borrow().iter().find(|m| m.0 == node).map(|m| m.1);
        Box::pin(async move {
            use tokio::io::AsyncWriteExt;
            let addr =
                addr.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such node"))?;
            let mut s = TcpStream::connect(addr).await?;
            s.write_all(&me.to_be_bytes()).await?;
            Ok(LinkStream::Tcp(s))
        })
    });
    (
        LinkSetup {
            me,
            members: rx,
            incoming: in_rx,
            dial,
            accept: Some(listener),
        },
        tx,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::core::Broker;
    use bytes::Bytes;
    use zerofan_codec::{Connect, Packet, Protocol, Publish, QoS};

    /// A node serves once every other member's state arrived: not before
    /// its membership is known (empty: a restarted node that has not read
    /// its log yet), at once when it is alone.
    #[test]
    fn a_node_is_ready_once_the_members_it_knows_have_synced() {
        let links = Links::new(2);
        links.set_members(&[]);
        assert!(!links.is_ready(), "membership not known yet");
        links.set_members(&[1, 2, 3]);
        assert!(!links.is_ready());
        links.synced.borrow_mut().insert(1);
        links.check_ready();
        assert!(!links.is_ready(), "node 3 has not synced");
        links.synced.borrow_mut().insert(3);
        links.check_ready();
        assert!(links.is_ready());

        let alone = Links::new(1);
        alone.set_members(&[1]);
        assert!(alone.is_ready());
    }

    /// A core with one remote node (peer 1) subscribed to `t`, its links
    /// with a queue for it and no writer: nothing drains.
    fn linked() -> (Shared, crate::core::ConnId) {
        let now = Instant::now();
        let mut b = Broker::new(
            Config {
                sys_interval: 0,
                ..Config::default()
            },
            now,
        );
        b.set_peers(PeerId(0), &[PeerId(0)]);
        b.add_peer(PeerId(1));
        b.handle_peer(
            now,
            PeerId(1),
            PeerEvent::Interest {
                filter: "t".into(),
                group: None,
                add: true,
                seq: 1,
            },
        );
        let conn = b.connection_opened(now, "127.0.0.1:9".parse().unwrap());
        b.handle_packet(
            now,
            conn,
            Packet::Connect(Box::new(Connect {
                protocol: Protocol::V5,
                clean_start: true,
                keep_alive: 0,
                properties: Default::default(),
                client_id: "p".try_into().unwrap(),
                will: None,
                username: None,
                password: None,
                bridge: false,
            })),
        );
        let (mut shared, _) = Shared::new(b);
        let links = Links::new(1);
        links.queues.borrow_mut().insert(
            PeerId(1),
            Queue::new(2, Rc::new(Notify::new()), Rc::new(Notify::new())),
        );
        shared.links = Some(links);
        (shared, conn)
    }

    fn publish(shared: &Shared, conn: crate::core::ConnId, qos: QoS, pid: u16, payload: &Bytes) {
        shared.broker.borrow_mut().handle_packet(
            Instant::now(),
            conn,
            Packet::Publish(Publish {
                qos,
                packet_id: pid,
                topic: "t".try_into().unwrap(),
                payload: payload.clone(),
                ..Publish::default()
            }),
        );
        shared.dispatch();
    }

    /// Peer ids are each node's own: the nodes a message is stranded for
    /// cross as node ids and come back as the receiver's peer ids; an
    /// owner the receiver never linked to leaves a plain publish, never an
    /// empty list (which means the receiver's own sessions).
    #[test]
    fn stranded_owners_cross_as_node_ids() {
        let links = Links::new(1);
        let (seven, nine) = (links.peer_of(7).unwrap(), links.peer_of(9).unwrap());
        let msg = || {
            crate::core::Message::from_publish(
                Publish {
                    qos: QoS::AtLeastOnce,
                    topic: "t".try_into().unwrap(),
                    ..Publish::default()
                },
                None,
                Instant::now(),
            )
        };
        let mut owners = vec![nine, seven];
        links.owners_to_nodes(&mut owners);
        assert_eq!(owners, [PeerId(9), PeerId(7)]);
        let stranded = |owners: Vec<PeerId>| {
            PeerEvent::Stranded(Box::new(crate::core::Stranded {
                owners,
                msg: msg(),
                direct: true,
                shares: Vec::new(),
            }))
        };
        match links.nodes_to_owners(stranded(owners)) {
            Some(PeerEvent::Stranded(st)) => assert_eq!(st.owners, [nine, seven]),
            other => panic!("{other:?}"),
        }
        match links.nodes_to_owners(stranded(vec![PeerId(5)])) {
            Some(PeerEvent::Publish { direct, .. }) => assert!(direct),
            other => panic!("{other:?}"),
        }
        match links.nodes_to_owners(stranded(Vec::new())) {
            Some(PeerEvent::Stranded(st)) => assert!(st.owners.is_empty()),
            other => panic!("{other:?}"),
        }
    }

    /// A flush said again names the move's new owner: it crosses as its
    /// node id and comes back as the receiver's peer id (this node's own
    /// id as peer 0); one naming a node the receiver never linked to is
    /// dropped, and one naming a node the sender has no id for is not sent.
    #[test]
    fn a_flushed_moves_new_owner_crosses_as_a_node_id() {
        let links = Links::new(1);
        let nine = links.peer_of(9).unwrap();
        let flushed = |to: Option<PeerId>| PeerEvent::Flushed {
            client: "c".into(),
            to,
        };
        let mut e = flushed(Some(nine));
        assert!(links.to_wire(&mut e));
        assert!(
            matches!(
                e,
                PeerEvent::Flushed {
                    to: Some(PeerId(9)),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(!links.to_wire(&mut flushed(Some(PeerId(40)))), "no node");
        let mut plain = flushed(None);
        assert!(links.to_wire(&mut plain));
        assert!(matches!(plain, PeerEvent::Flushed { to: None, .. }));
        let back = |n: u16| links.nodes_to_owners(flushed(Some(PeerId(n))));
        assert!(matches!(back(9), Some(PeerEvent::Flushed { to: Some(p), .. }) if p == nine));
        assert!(matches!(
            back(1),
            Some(PeerEvent::Flushed {
                to: Some(PeerId(0)),
                ..
            })
        ));
        assert!(back(5).is_none(), "never linked");
    }

    /// The frames queued for peer 1, decoded.
    fn frames(shared: &Shared) -> Vec<LinkFrame> {
        let links = shared.links.as_ref().unwrap();
        let q = links.queues.borrow();
        decoded(q.get(&PeerId(1)).unwrap())
    }

    /// The frames `q` holds, as the node reads them.
    fn decoded(q: &Queue) -> Vec<LinkFrame> {
        let mut buf = bytes::BytesMut::new();
        for f in &q.frames {
            for c in &f.chunks {
                buf.extend_from_slice(c);
            }
        }
        let mut dec = crate::core::peer_wire::FrameDecoder::default();
        let mut out = Vec::new();
        while let Some(f) = dec.decode(&mut buf, Instant::now()).unwrap() {
            out.push(f);
        }
        out
    }

    /// A node's first link to another carries what it queued before the
    /// link was up (a restarted node's handover of a session claimed
    /// elsewhere meanwhile), after a `Sync` and before `Synced`; a link to
    /// a node restarted since starts over with the whole state, and what
    /// was queued for its former self goes.
    #[test]
    fn a_first_link_keeps_what_was_queued_and_a_new_incarnation_starts_over() {
        let (shared, _) = linked();
        let links = shared.links.as_ref().unwrap();
        // A handover queued, the link started one way or the other: the
        // frames then, between Sync and Synced, and whether it is there.
        let start = |how: fn(&Shared, &Links, PeerId)| {
            let handover = PeerEvent::Handover { client: "c".into() };
            links.push(PeerId(1), |enc| enc.encode(&handover, Instant::now()).ok());
            how(&shared, links, PeerId(1));
            let got = frames(&shared);
            assert!(matches!(got.first(), Some(LinkFrame::Sync)), "{got:?}");
            assert!(matches!(got.last(), Some(LinkFrame::Synced)), "{got:?}");
            got.iter().any(|f| {
                matches!(f, LinkFrame::Event(PeerEvent::Handover { client }) if &**client == "c")
            })
        };
        assert!(start(first_state), "kept on a first link");
        assert!(!start(fresh_state), "dropped for a restarted node");
    }

    fn queued(shared: &Shared) -> (usize, usize, bool) {
        let links = shared.links.as_ref().unwrap();
        let q = links.queues.borrow();
        let q = q.get(&PeerId(1)).unwrap();
        (q.frames.len(), q.bytes, q.congested)
    }

    /// A node linked to us, or this node rejoined the majority: the
    /// writer to it stops waiting out its backoff, and the node is waited
    /// for again until its link has been down `AWAY_AFTER` anew.
    #[tokio::test]
    async fn a_redial_cuts_the_backoff_short_and_waits_for_the_node_again() {
        let (shared, _) = linked();
        let links = shared.links.as_ref().unwrap();
        let redial = links.queues.borrow()[&PeerId(1)].redial.clone();
        let mut away = Away {
            since: Instant::now().checked_sub(AWAY_AFTER),
            marked: false,
        };
        away.check(&shared, 2, PeerId(1));
        assert!(away.marked, "down for AWAY_AFTER: away");
        let next = away.pause(&shared, PeerId(1), &redial, BACKOFF_MIN).await;
        assert_eq!(next, BACKOFF_MIN * 2, "no redial: the backoff ran out");
        assert!(away.marked);
        // A redial reaches a writer that waits out its backoff; none is
        // stored for later (a stale one would make a node that is really
        // away be waited for again at its next failed dial).
        links.redial(2);
        let next = away.pause(&shared, PeerId(1), &redial, BACKOFF_MIN).await;
        assert_eq!(
            next,
            BACKOFF_MIN * 2,
            "a redial nobody waited for is not kept"
        );
        let (next, ()) = tokio::join!(
            away.pause(&shared, PeerId(1), &redial, BACKOFF_MAX),
            async {
                tokio::task::yield_now().await;
                links.redial(2);
            }
        );
        assert_eq!(next, BACKOFF_MIN, "cut short");
        assert!(!away.marked, "waited for again");
        away.check(&shared, 2, PeerId(1));
        assert!(!away.marked, "away again only AWAY_AFTER later");
        let (next, ()) = tokio::join!(
            away.pause(&shared, PeerId(1), &redial, BACKOFF_MAX),
            async {
                tokio::task::yield_now().await;
                links.rejoined();
            }
        );
        assert_eq!(next, BACKOFF_MIN, "every node is dialed at once");
    }

    /// What `q` holds, one word per frame: its event and sequence number.
    fn described(q: &Queue) -> Vec<String> {
        decoded(q)
            .into_iter()
            .map(|f| match f {
                LinkFrame::Event(PeerEvent::Interest {
                    filter, add, seq, ..
                }) => format!("{}{filter}{seq}", if add { '+' } else { '-' }),
                LinkFrame::Event(PeerEvent::Retain { msg, seq, .. }) => {
                    format!("r{}{seq}", String::from_utf8_lossy(&msg.payload))
                }
                LinkFrame::Event(PeerEvent::Publish { .. }) => "publish".into(),
                LinkFrame::Event(PeerEvent::Replicate { seq, .. }) => format!("replicate{seq}"),
                LinkFrame::Event(PeerEvent::Seen { seq }) => format!("seen{seq}"),
                LinkFrame::Event(PeerEvent::Fence { seq }) => format!("fence{seq}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    /// Shedding an overflowing queue: of the frames not written yet, every
    /// message goes, replica operations while the node is away, and each
    /// interest, retained message or fence that a later frame sets anew;
    /// the rest stays in order. Before, interests, retained messages and
    /// fences (one per loop turn that forwarded a QoS 1/2 message) for a
    /// node that stayed away queued without bound, and so did replica
    /// operations (their frames were never marked droppable).
    #[test]
    fn shedding_keeps_the_last_state_and_what_the_node_needs() {
        let now = Instant::now();
        let interest = |filter: &str, add, seq| PeerEvent::Interest {
            filter: filter.into(),
            group: None,
            add,
            seq,
        };
        let msg = |topic: &str, payload: &'static str| {
            crate::core::Message::from_publish(
                Publish {
                    qos: QoS::AtLeastOnce,
                    retain: true,
                    topic: topic.try_into().unwrap(),
                    payload: Bytes::from_static(payload.as_bytes()),
                    ..Publish::default()
                },
                None,
                now,
            )
        };
        let retain = |topic: &str, payload, seq| PeerEvent::Retain {
            msg: msg(topic, payload),
            seq,
            stamp: crate::core::Stamp { hlc: seq, node: 1 },
        };
        let events = || {
            vec![
                interest("f", true, 1),
                retain("r", "a", 2),
                interest("f", false, 3),
                PeerEvent::Publish {
                    msg: msg("f", "m"),
                    direct: false,
                    shares: Vec::new(),
                    id: None,
                },
                PeerEvent::Replicate {
                    seq: 4,
                    ops: Vec::new().into(),
                },
                PeerEvent::Fence { seq: 4 },
                retain("r", "b", 5),
                retain("q", "c", 6),
                interest("f", true, 7),
                PeerEvent::Seen { seq: 8 },
                interest("g", true, 9),
                PeerEvent::Fence { seq: 9 },
            ]
        };
        let queue = |sent| {
            let mut q = Queue::new(2, Rc::new(Notify::new()), Rc::new(Notify::new()));
            let mut enc = FrameEncoder::default();
            for e in events() {
                let f = enc.encode(&e, now).unwrap();
                q.bytes += f.len;
                q.frames.push_back(f);
            }
            q.sent = sent;
            q
        };

        let mut q = queue(0);
        assert_eq!(q.shed(false), (1, 4));
        assert_eq!(
            described(&q),
            ["replicate4", "rb5", "rc6", "+f7", "seen8", "+g9", "fence9"]
        );
        assert_eq!(q.bytes, q.frames.iter().map(|f| f.len).sum::<usize>());
        let mut q = queue(0);
        assert_eq!(q.shed(true), (1, 5));
        assert_eq!(
            described(&q),
            ["rb5", "rc6", "+f7", "seen8", "+g9", "fence9"]
        );
        // Written frames stay, whatever follows them.
        let mut q = queue(2);
        assert_eq!(q.shed(true), (1, 3));
        assert_eq!(
            described(&q),
            ["+f1", "ra2", "rb5", "rc6", "+f7", "seen8", "+g9", "fence9"]
        );
    }

    /// A fence goes to every node at each loop turn that forwarded a QoS
    /// 1/2 message, so a node away gets many: small frames that hold far
    /// more memory than their bytes. The queue counts that memory, and
    /// keeps the last fence. Before, they were never shed, and a bound on
    /// bytes would have let them take about 1 GiB.
    #[test]
    fn fences_for_a_node_away_are_bounded_by_their_memory() {
        let mut q = Queue::new(2, Rc::new(Notify::new()), Rc::new(Notify::new()));
        let mut enc = FrameEncoder::default();
        let mut seq = 0;
        while !q.overflows() {
            seq += 1;
            let f = enc
                .encode(&PeerEvent::Fence { seq }, Instant::now())
                .unwrap();
            q.bytes += f.len;
            q.frames.push_back(f);
        }
        assert!(q.bytes < QUEUE_HARD / 8, "{} bytes", q.bytes);
        assert_eq!(q.shed(true), (0, seq - 1));
        assert_eq!(described(&q), [format!("fence{seq}")]);
    }

    /// A node away gets a retained message per publish to its topic: past
    /// the hard bound its queue keeps the last one, and sheds again only
    /// once it has doubled, whatever the number of retained publishes.
    #[test]
    fn retained_publishes_for_a_node_away_stay_bounded() {
        let (shared, conn) = linked();
        shared.broker.borrow_mut().set_peer_away(PeerId(1), true);
        shared.dispatch();
        let big = Bytes::from(vec![1u8; 64 * 1024]);
        for i in 0..2_000u32 {
            let topic = format!("r/{}", i % 4);
            shared.broker.borrow_mut().handle_packet(
                Instant::now(),
                conn,
                Packet::Publish(Publish {
                    qos: QoS::AtMostOnce,
                    retain: true,
                    topic: topic.as_str().try_into().unwrap(),
                    payload: big.clone(),
                    ..Publish::default()
                }),
            );
            shared.dispatch();
            assert!(queued(&shared).1 <= QUEUE_HARD, "at {i}");
        }
        let shed = shared.links.as_ref().unwrap().stats.shed_frames.get();
        assert!(shed > 1_000, "{shed}");
        // Each topic's last retained message is there.
        let last: Vec<LinkFrame> = frames(&shared);
        for t in 0..4 {
            let topic = format!("r/{t}");
            let kept = last.iter().filter(|f| {
                matches!(f, LinkFrame::Event(PeerEvent::Retain { msg, .. }) if msg.topic.as_str() == topic)
            });
            assert!(kept.count() >= 1, "{topic}");
        }
    }

    #[test]
    fn a_full_queue_congests_its_node_and_an_overflowing_one_drops_messages() {
        let (shared, conn) = linked();
        let big = Bytes::from(vec![1u8; 64 * 1024]);
        publish(&shared, conn, QoS::AtMostOnce, 0, &big);
        let (frames, bytes, congested) = queued(&shared);
        // The answer to the node's interest, then the message.
        assert_eq!(frames, 2);
        assert!(bytes > big.len() && !congested);
        // The payload is queued as the publisher's bytes, not a copy.
        {
            let links = shared.links.as_ref().unwrap();
            let q = links.queues.borrow();
            let f = &q.get(&PeerId(1)).unwrap().frames[1];
            assert_eq!(f.chunks[1].as_ptr(), big.as_ptr());
        }
        let mut pid = 0u16;
        while !queued(&shared).2 {
            pid += 1;
            assert!(pid < 200, "never congested");
            publish(&shared, conn, QoS::AtLeastOnce, pid, &big);
        }
        assert!(queued(&shared).1 > QUEUE_BYTES);
        // Congested: QoS 0 for the node is dropped by the core...
        let before = shared.broker.borrow().metrics().dropped_qos0_peer_full;
        publish(&shared, conn, QoS::AtMostOnce, 0, &big);
        assert_eq!(
            shared.broker.borrow().metrics().dropped_qos0_peer_full,
            before + 1
        );
        // ...while QoS 1 still crosses, and its publisher is not read.
        pid += 1;
        let (frames, _, _) = queued(&shared);
        publish(&shared, conn, QoS::AtLeastOnce, pid, &big);
        assert_eq!(queued(&shared).0, frames + 1);
        assert!(shared.broker.borrow().held(conn));
        // The two frames at the front are on the wire.
        let front = {
            let links = shared.links.as_ref().unwrap();
            let mut q = links.queues.borrow_mut();
            let q = q.get_mut(&PeerId(1)).unwrap();
            q.sent = 2;
            q.frames[1].chunks[0].as_ptr()
        };
        // Past the hard bound (held publishers still add a read each),
        // its queued messages go, counted; the queue stays bounded.
        for _ in 0..1100 {
            pid = pid % 60_000 + 1;
            publish(&shared, conn, QoS::AtLeastOnce, pid, &big);
            assert!(queued(&shared).1 <= QUEUE_HARD);
        }
        let dropped = shared.links.as_ref().unwrap().stats.dropped_messages.get();
        assert!(dropped > 900, "{dropped}");
        // Not those on the wire: they go once acknowledged.
        let links = shared.links.as_ref().unwrap();
        let q = links.queues.borrow();
        let q = q.get(&PeerId(1)).unwrap();
        assert!(q.frames[1].publish.is_some());
        assert_eq!(q.frames[1].chunks[0].as_ptr(), front);
    }
}

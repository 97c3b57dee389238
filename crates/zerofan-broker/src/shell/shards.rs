//! The queues between shards. Each shard is a thread with its own event
//! loop and core; what one core polls for another
//! ([`Broker::poll_peer_transmit`]) goes into the destination's inbox, a
//! bounded channel, as one envelope per batch. So is a connection whose
//! CONNECT names a client id owned by another shard: its socket and the
//! bytes already read move there once, before the core sees the CONNECT.
//!
//! Bounded: an inbox holds at most [`INBOX`] envelopes. When it is full,
//! the sender keeps the batch in its backlog (in order) and tells its core
//! the peer is congested: QoS 0 for it is then dropped and counted, and the
//! publishers of QoS 1/2 are not read until the backlog drains, so the
//! backlog grows by at most one read per held publisher.
//!
//! [`Broker::poll_peer_transmit`]: crate::core::Broker::poll_peer_transmit

use super::state::Shared;
use crate::core::{PeerBatch, PeerEvent, PeerId, ShardFigures};
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;
use tokio::sync::mpsc::{self, error::TrySendError};

/// Envelopes an inbox holds before its senders keep theirs.
const INBOX: usize = 1024;

/// Emptied batch buffers waiting to go back to their sender, per pair of
/// shards; more are freed.
const RETURNS: usize = 4;

/// Longest a shard's listeners wait at start for every shard to have
/// applied what the others restored (see [`Mesh::started`]); past it they
/// serve anyway, logged and counted. Applying takes milliseconds: only a
/// shard that does not run at all holds the others that long.
const START_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Emptied batches on their way back to the shard that sent them, so that
/// a batch buffer is allocated and freed on one thread only (a buffer
/// freed on another thread costs a lock on its allocator's arena, which
/// the owner contends for) and is reused.
type Returns = std::sync::Arc<Vec<std::sync::Mutex<Vec<Vec<PeerEvent>>>>>;

/// Work for another shard (see [`Envelope::Run`]).
pub(super) type Task = Box<dyn FnOnce(&Rc<Shared>) + Send>;

/// What crosses to a shard.
pub(super) enum Envelope {
    /// Events from a peer's core, in the order it polled them.
    Peer {
        from: PeerId,
        events: Vec<PeerEvent>,
    },
    /// A connection whose session lives on the receiving shard.
    Conn(Handoff),
    /// Shard 0 reloaded this configuration (SIGHUP): put it in force too.
    Reload(Box<crate::config::Config>),
    /// Run this on the receiving shard (a question from another shard,
    /// answered through a channel the closure holds).
    Run(Task),
}

/// A connection moving to the shard that owns its client id.
pub(super) struct Handoff {
    pub(super) stream: Moving,
    pub(super) peer: SocketAddr,
    pub(super) listener: usize,
    /// Its client certificate's identity (TLS).
    pub(super) identity: Option<String>,
    /// What was read from it: the CONNECT, and whatever followed.
    pub(super) input: Bytes,
    /// Keeps it counted in the process-wide limits on the way.
    pub(super) transit: Option<super::limits::Transit>,
}

/// The stream of a moving connection, out of any runtime.
pub(super) enum Moving {
    /// Plain TCP.
    Tcp(std::net::TcpStream),
    /// TLS and/or WebSocket over a detached [`super::movable::Socket`],
    /// with the state of each layer.
    Stack(super::listener::BoxStream),
}

/// One shard's ends of the queues.
pub(super) struct Mesh {
    me: usize,
    /// Every shard's inbox (this one's too, unused).
    to: Vec<mpsc::Sender<Envelope>>,
    /// Per destination: what its full inbox did not take yet, in order.
    backlog: RefCell<Vec<VecDeque<Envelope>>>,
    /// Wakes the task that empties backlogs.
    pending: tokio::sync::Notify,
    /// Wakes the task that sends what the core has for its peers
    /// ([`flush_loop`]); `flush_armed` while it is due.
    flush: tokio::sync::Notify,
    flush_armed: std::cell::Cell<bool>,
    /// Every shard's latest figures (by shard), for the totals shard 0
    /// reports. Written by each shard's timer task, a few times a second.
    figures: std::sync::Arc<std::sync::Mutex<Vec<ShardFigures>>>,
    /// Slot `from * n + to`: batches `from` sent to `to`, emptied by `to`.
    returns: Returns,
    /// Shards some other shard has not yet applied the announcements of
    /// (the subscriptions they restored from the store).
    starting: std::sync::Arc<tokio::sync::watch::Sender<usize>>,
    /// This shard is counted out of `starting`.
    started_here: std::cell::Cell<bool>,
    /// This shard's listeners serve (see [`Mesh::started`]).
    serving: std::cell::Cell<bool>,
    /// Times they began to serve after `START_WAIT` instead.
    start_timeouts: std::cell::Cell<u64>,
}

/// Queues for `n` shards: each shard's [`Mesh`] and inbox.
pub(super) fn wire(n: usize) -> Vec<(Mesh, mpsc::Receiver<Envelope>)> {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel(INBOX)).unzip();
    let figures = std::sync::Arc::new(std::sync::Mutex::new(vec![ShardFigures::default(); n]));
    let returns: Returns = std::sync::Arc::new((0..n * n).map(|_| Default::default()).collect());
    let starting = std::sync::Arc::new(tokio::sync::watch::Sender::new(n));
    receivers
        .into_iter()
        .enumerate()
        .map(|(me, rx)| {
            let mesh = Mesh {
                me,
                to: senders.clone(),
                backlog: RefCell::new((0..n).map(|_| VecDeque::new()).collect()),
                pending: tokio::sync::Notify::new(),
                flush: tokio::sync::Notify::new(),
                flush_armed: std::cell::Cell::new(false),
                figures: figures.clone(),
                returns: returns.clone(),
                starting: starting.clone(),
                started_here: std::cell::Cell::new(false),
                serving: std::cell::Cell::new(false),
                start_timeouts: std::cell::Cell::new(0),
            };
            (mesh, rx)
        })
        .collect()
}

impl Mesh {
    /// This shard's index.
    pub(super) fn me(&self) -> usize {
        self.me
    }

    /// How many shards there are.
    pub(super) fn count(&self) -> usize {
        self.to.len()
    }

    /// Every shard's peer id.
    pub(super) fn peers(&self) -> Vec<PeerId> {
        (0..self.to.len()).map(|i| PeerId(i as u16)).collect()
    }

    /// Record this shard's figures; returns the other shards' together.
    pub(super) fn exchange_figures(&self, mine: ShardFigures) -> ShardFigures {
        let mut all = match self.figures.lock() {
            Ok(g) => g,
            // A shard panicked while holding it: the figures are still
            // plain numbers.
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(slot) = all.get_mut(self.me) {
            *slot = mine;
        }
        let mut others = ShardFigures::default();
        for (i, f) in all.iter().enumerate() {
            if i != self.me {
                others.add(f);
            }
        }
        others
    }

    /// After a reload on this shard: the others put `config` in force too.
    pub(super) fn reload_others(&self, config: crate::config::Config) {
        for to in (0..self.count()).filter(|&i| i != self.me) {
            self.send(to, Envelope::Reload(Box::new(config.clone())));
        }
    }

    /// Every shard's latest figures, by shard.
    pub(super) fn table(&self) -> Vec<ShardFigures> {
        match self.figures.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Run `f` on every other shard; the answers come through whatever
    /// `f` captures.
    pub(super) fn run_on_others<F>(&self, f: F)
    where
        F: Fn(&Rc<Shared>) + Clone + Send + 'static,
    {
        for to in (0..self.count()).filter(|&i| i != self.me) {
            self.send(to, Envelope::Run(Box::new(f.clone())));
        }
    }

    /// Send a batch the core polled. Returns the peer that just became
    /// congested, if any, and an emptied batch of an earlier one for the
    /// core to reuse (the caller hands both to its core, which it may not
    /// borrow here).
    pub(super) fn send_batch(&self, batch: PeerBatch) -> (Option<PeerId>, Option<PeerBatch>) {
        let to = batch.to;
        let env = Envelope::Peer {
            from: PeerId(self.me as u16),
            events: batch.events,
        };
        let congested = self.send(usize::from(to.0), env).then_some(to);
        // Never waits: a slot the receiver holds this instant has nothing
        // for us yet anyway.
        let back = self
            .returns
            .get(self.me * self.count() + usize::from(to.0))
            .and_then(|slot| slot.try_lock().ok()?.pop())
            .map(|events| PeerBatch { to, events });
        (congested, back)
    }

    /// Give the emptied batch `events` back to `from`, which sent it.
    fn give_back(&self, from: PeerId, events: Vec<PeerEvent>) {
        let slot = self
            .returns
            .get(usize::from(from.0) * self.count() + self.me);
        if let Some(mut back) = slot.and_then(|s| s.try_lock().ok()) {
            if back.len() < RETURNS {
                back.push(events);
            }
        }
    }

    /// The core has (or may have) events for its peers: have them sent at
    /// the end of this turn of the event loop, with whatever the other
    /// tasks ready now add (one batch per peer, not one per read).
    pub(super) fn flush_soon(&self) {
        if !self.flush_armed.replace(true) {
            self.flush.notify_one();
        }
    }

    /// Count this shard as started once every other shard has applied
    /// what its core announced (first, the subscriptions it restored).
    fn note_caught_up(&self, shared: &Shared) {
        if self.started_here.get() || !shared.broker.borrow().peers_caught_up() {
            return;
        }
        self.started_here.set(true);
        self.starting.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Wait until every shard routes what every other restored, or
    /// `START_WAIT`. Before, a QoS 1 message published here could miss a
    /// persistent session restored on another shard, and be acknowledged
    /// though nobody queued it.
    pub(super) async fn started(&self) {
        if self.serving.get() {
            return;
        }
        let mut rx = self.starting.subscribe();
        let waited = tokio::time::timeout(START_WAIT, rx.wait_for(|n| *n == 0)).await;
        // Once per shard, not per listener.
        if !self.serving.replace(true) && waited.is_err() {
            self.start_timeouts.set(self.start_timeouts.get() + 1);
            tracing::warn!(
                shard = self.me,
                wait_ms = START_WAIT.as_millis() as u64,
                "serving before every shard applied the others' restored subscriptions"
            );
        }
    }

    /// Whether this shard's listeners serve (see [`Mesh::started`]).
    pub(super) fn serving(&self) -> bool {
        self.serving.get()
    }

    /// Times this shard's listeners began to serve after `START_WAIT`.
    pub(super) fn start_timeouts(&self) -> u64 {
        self.start_timeouts.get()
    }

    /// Move a connection to shard `to`.
    pub(super) fn hand_off(&self, to: usize, h: Handoff) {
        // A full inbox keeps it in the backlog; the connection is not read
        // meanwhile, so nothing is lost.
        self.send(to, Envelope::Conn(h));
    }

    /// True when the destination's inbox was full (the envelope waits in
    /// the backlog).
    fn send(&self, to: usize, env: Envelope) -> bool {
        let Some(tx) = self.to.get(to) else {
            return false;
        };
        let mut backlog = self.backlog.borrow_mut();
        let Some(q) = backlog.get_mut(to) else {
            return false;
        };
        if q.is_empty() {
            match tx.try_send(env) {
                Ok(()) => return false,
                Err(TrySendError::Closed(_)) => return false,
                Err(TrySendError::Full(env)) => q.push_back(env),
            }
            self.pending.notify_one();
            true
        } else {
            q.push_back(env);
            false
        }
    }
}

/// Empty the backlogs as the inboxes make room; a peer whose backlog is
/// empty again is no longer congested.
pub(super) async fn drain_backlogs(shared: Rc<Shared>) {
    let Some(mesh) = shared.mesh.as_ref() else {
        return;
    };
    loop {
        mesh.pending.notified().await;
        for to in 0..mesh.count() {
            loop {
                let has = mesh.backlog.borrow().get(to).is_some_and(|q| !q.is_empty());
                if !has {
                    break;
                }
                let Ok(permit) = mesh.to[to].reserve().await else {
                    // That shard is gone (shutting down).
                    if let Some(q) = mesh.backlog.borrow_mut().get_mut(to) {
                        q.clear();
                    }
                    break;
                };
                let env = mesh
                    .backlog
                    .borrow_mut()
                    .get_mut(to)
                    .and_then(|q| q.pop_front());
                match env {
                    Some(env) => permit.send(env),
                    None => break,
                }
            }
            shared
                .broker
                .borrow_mut()
                .set_peer_congested(PeerId(to as u16), false);
            shared.dispatch();
        }
    }
}

/// Send what the core has for its peers, once per turn of the event loop
/// that produced some (see [`Mesh::flush_soon`]): the tasks ready before
/// this one have run by then, so their events go in the same batches, and
/// a peer is woken once per batch.
pub(super) async fn flush_loop(shared: Rc<Shared>) {
    let Some(mesh) = shared.mesh.as_ref() else {
        return;
    };
    loop {
        mesh.flush.notified().await;
        mesh.flush_armed.set(false);
        shared.send_to_peers(mesh);
    }
}

/// Take what other shards send: peer events for the core, connections
/// moving in. `delay`: test-only (see `Server::delay_peer_start`).
pub(super) async fn inbox_loop(
    shared: Rc<Shared>,
    mut rx: mpsc::Receiver<Envelope>,
    delay: Option<std::time::Duration>,
) {
    if let Some(mesh) = &shared.mesh {
        // What the core restored from the store goes out first; the
        // listeners wait until every shard has applied it.
        shared.send_to_peers(mesh);
        mesh.note_caught_up(&shared);
    }
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    let mut got = Vec::with_capacity(64);
    loop {
        if rx.recv_many(&mut got, 64).await == 0 {
            return;
        }
        let now = Instant::now();
        for env in got.drain(..) {
            match env {
                Envelope::Peer { from, mut events } => {
                    let mut broker = shared.broker.borrow_mut();
                    for e in events.drain(..) {
                        broker.handle_peer(now, from, e);
                    }
                    if let Some(mesh) = &shared.mesh {
                        mesh.give_back(from, events);
                    }
                }
                Envelope::Conn(h) => super::conn::moved_in(&shared, h),
                Envelope::Run(f) => f(&shared),
                Envelope::Reload(config) => {
                    let mut config = *config;
                    // Shard 0 publishes `$SYS` for every shard.
                    config.sys_interval = 0;
                    super::reload::reload_now(&shared, Ok(config));
                }
            }
        }
        shared.dispatch();
        if let Some(mesh) = &shared.mesh {
            mesh.note_caught_up(&shared);
        }
    }
}

/// Record this shard's figures for the others, and take theirs into the
/// core's totals (`$SYS`, `/metrics`).
pub(super) fn exchange_figures(shared: &Shared) {
    let Some(mesh) = &shared.mesh else {
        return;
    };
    let stats = shared.shell_stats();
    let mut broker = shared.broker.borrow_mut();
    broker.set_shell_stats(stats);
    let mut mine = broker.shard_figures();
    mine.listeners = shared
        .ops
        .listeners
        .borrow()
        .iter()
        .map(|l| (l.open, l.opened))
        .collect();
    let others = mesh.exchange_figures(mine);
    broker.set_other_shards(Some(others));
}

/// How long a reader of figures (`/metrics`) waits for the other shards'
/// current ones before it takes their last (at most a timer tick old).
const REFRESH_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Have every other shard record its figures now, then take them: a
/// `/metrics` scrape right after an event on another shard counts it.
pub(super) async fn refresh_figures(shared: &Shared) {
    let Some(mesh) = &shared.mesh else {
        return;
    };
    let others = mesh.count().saturating_sub(1);
    // Bounded: one answer per other shard, with its webhooks' figures.
    type Hooks = (Vec<super::webhook::WebhookFigures>, u64);
    let (tx, mut rx) = mpsc::channel::<Hooks>(others.max(1));
    mesh.run_on_others(move |s: &Rc<Shared>| {
        exchange_figures(s);
        let hooks = s
            .ops
            .webhooks
            .get()
            .map(|w| w.figures())
            .unwrap_or_default();
        let _ = tx.try_send(hooks);
    });
    let mut total: Hooks = Default::default();
    let _ = tokio::time::timeout(REFRESH_WAIT, async {
        for _ in 0..others {
            let Some((hooks, lost)) = rx.recv().await else {
                return;
            };
            if total.0.len() < hooks.len() {
                total.0.resize(hooks.len(), Default::default());
            }
            for (t, h) in total.0.iter_mut().zip(&hooks) {
                t.add(h);
            }
            total.1 += lost;
        }
    })
    .await;
    *shared.ops.webhooks_elsewhere.borrow_mut() = total;
    exchange_figures(shared);
}

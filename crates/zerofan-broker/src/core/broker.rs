//! The broker state machine: the public entry points the shell calls, and
//! the bookkeeping they share. Protocol handling lives in the sibling files
//! (`connect`, `publish`, `subscribe`, `deliver`, `sys`) as further
//! `impl Broker` blocks.

use super::connection::{Connection, Phase};
use super::hash::HashMap;
use super::ids::{ConnId, SessionId};
use super::message::Message;
use super::metrics::{Metrics, ShellStats};
use super::outbox::{Outgoing, Transmit};
use super::peer::{Deferred, PeerBatch, PeerEvent, PeerId, Peers};
use super::router::{Router, Scope};
use super::session::{Queued, Session};
use super::store::{MemoryStore, Store};
use super::timers::{Timer, Timers};
use super::wire::Wire;
use crate::config::Config;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};
use zerofan_codec::{
    DecodeError, Disconnect, MqttStr, Packet, Properties, Protocol, QoS, ReasonCode,
};

/// The whole broker as a deterministic state machine: packets and time go
/// in, outboxes and wake-ups come out. No sockets, no clock, no async.
pub struct Broker {
    pub(crate) config: Config,
    /// Boxed: a map keeps empty slots (up to half of them right after it
    /// grows), and at ~300 bytes inline those slots cost as much as the
    /// live entries; boxed, a slot is 16 bytes.
    pub(crate) conns: HashMap<ConnId, Box<Connection>>,
    /// Boxed for the same reason as `conns`.
    pub(crate) sessions: HashMap<SessionId, Box<Session>>,
    pub(crate) by_client: HashMap<MqttStr, SessionId>,
    /// Where messages go: local subscriptions and the peers' interests.
    pub(crate) router: Router,
    /// The other cores of this broker, and what waits to cross to them.
    pub(crate) peers: Peers,
    pub(crate) store: Box<dyn Store>,
    pub(crate) timers: Timers,
    pub(crate) metrics: Metrics,
    pub(crate) shell_stats: ShellStats,
    pub(crate) started: Instant,
    next_conn: u64,
    pub(crate) next_session: u64,
    wakeups: Vec<ConnId>,
    /// The rate limit every per-client log line goes through.
    pub(crate) log_limit: crate::ratelimit::LogLimiter,
    /// Where a received PUBLISH's plain header is encoded to compare it
    /// with the packet as received (see `Wire::verified`).
    pub(crate) wire_scratch: bytes::BytesMut,
    /// Authentication, ACL and connection limits (see `auth`).
    pub(crate) auth: super::auth::AuthState,
    /// The durable log and the acknowledgements waiting for it (see `durable`).
    pub(crate) durable: super::durable::Durable,
    /// CONNECTs waiting for the input of the connection they take over,
    /// by new connection (see `Broker::input_drained`). At most one per
    /// connection, each for at most `TAKEOVER_DRAIN`.
    pub(crate) takeovers: HashMap<ConnId, super::connect::PendingTakeover>,
    /// The same, by old connection: whose input is drained for which new one.
    pub(crate) draining: HashMap<ConnId, ConnId>,
    /// The change number of the retained message just routed, when it went
    /// to peers: its publisher's acknowledgement waits until they have it.
    pub(crate) ack_fence: Option<u64>,
    /// The last retained message routed was over the retained quota: its
    /// publisher (MQTT 5) is answered 0x97.
    pub(crate) retain_refused: bool,
    /// The other shards' figures, for totals (see `Broker::set_other_shards`).
    pub(crate) others: Option<Box<super::observe::ShardFigures>>,
    /// Events for webhooks, recorded only when asked for (see `events`).
    pub(crate) events: super::events::Events,
    /// CONNECTs waiting for the cluster to give this node their client id
    /// (see `claims`).
    pub(crate) claims: super::claims::Claims,
    /// Persistent sessions copied to other nodes, and their copies of
    /// theirs (see `replica`).
    pub(crate) repl: super::replica::Replication,
}

/// What the shell does with a connection's further input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputState {
    /// Read and hand it over.
    Open,
    /// Keep what was read, read no more: its CONNECT waits for a takeover.
    /// The connection is woken when that is over.
    Held,
    /// The broker closes it (or does not know it): nothing more is read.
    Closed,
}

impl Broker {
    /// A broker with in-memory storage, starting at `now`.
    pub fn new(config: Config, now: Instant) -> Self {
        Broker::with_store(config, Box::new(MemoryStore::default()), now)
    }

    /// A broker over the given store.
    pub fn with_store(config: Config, store: Box<dyn Store>, now: Instant) -> Self {
        let mut timers = Timers::new(now);
        if config.sys_interval > 0 {
            timers.arm(now, Timer::Sys);
        }
        Broker {
            config,
            conns: HashMap::default(),
            sessions: HashMap::default(),
            by_client: HashMap::default(),
            router: Router::default(),
            peers: Peers::default(),
            store,
            timers,
            metrics: Metrics::default(),
            shell_stats: ShellStats::default(),
            started: now,
            next_conn: 1,
            next_session: 1,
            wakeups: Vec::new(),
            log_limit: crate::ratelimit::LogLimiter::default(),
            wire_scratch: bytes::BytesMut::new(),
            auth: super::auth::AuthState::default(),
            durable: super::durable::Durable::memory(now),
            takeovers: HashMap::default(),
            draining: HashMap::default(),
            ack_fence: None,
            retain_refused: false,
            others: None,
            events: Default::default(),
            claims: Default::default(),
            repl: Default::default(),
        }
    }

    /// Make this core `me` among `all` the cores of one broker (its shards).
    /// Call before the first connection. From then on it tells the others
    /// what it subscribes to, forwards what they subscribe to, and keeps
    /// their retained messages (see [`Broker::handle_peer`]).
    pub fn set_peers(&mut self, me: PeerId, all: &[PeerId]) {
        self.peers = Peers::new(me, all.iter().copied());
        self.router.set_peered(self.peers.me());
    }

    /// An event from peer `from`, in the order `from` polled it.
    pub fn handle_peer(&mut self, now: Instant, from: PeerId, event: PeerEvent) {
        match event {
            PeerEvent::Interest {
                filter,
                group,
                add,
                seq,
            } => {
                self.router
                    .peer_interest(from, &filter, group.as_deref(), add);
                // Behind any `Fence` still waiting for the store: `Seen`
                // covers every change up to `seq`.
                self.durable_seen(from, seq);
            }
            PeerEvent::Fence { seq } => self.durable_seen(from, seq),
            PeerEvent::Seen { seq } => {
                let ready = self.peers.seen(from, seq);
                self.release_deferred(ready);
            }
            PeerEvent::Publish {
                mut msg,
                direct,
                shares,
            } => {
                self.metrics.peer_received += 1;
                self.peers.handled(from, msg.size() as u64);
                msg.arrived_from(from);
                let scope = Scope::Forwarded {
                    direct,
                    shares: &shares,
                };
                self.deliver(now, Rc::new(msg), scope);
            }
            PeerEvent::Retain { mut msg, seq } => {
                msg.arrived_from(from);
                self.keep_retained(Rc::new(msg));
                self.durable_seen(from, seq);
            }
            PeerEvent::Consumed { bytes } => {
                for conn in self.peers.confirmed(from, bytes) {
                    self.wake(conn);
                }
            }
            PeerEvent::Replicate { seq, ops } => self.replica_ops(now, from, seq, ops),
            PeerEvent::ReplicaAck { seq } => self.replica_answered(from, Some(seq)),
            PeerEvent::Hold { session, hold } => {
                let conn = self.sessions.get(&session).and_then(|s| s.conn);
                if let Some(conn) = conn {
                    if hold && !self.peers.holds(conn) {
                        self.metrics.peer_throttles += 1;
                    }
                    if self.peers.held_for(from, conn, hold) {
                        self.wake(conn);
                    }
                }
            }
        }
        self.end_event();
    }

    /// Stop reading the connection that published `msg` (if it is a
    /// client here) until the peers let it go again; counted once per hold.
    fn hold_publisher(&mut self, msg: &Message) {
        let publisher = msg
            .origin
            .and_then(|o| self.sessions.get(&o))
            .and_then(|s| s.conn);
        if let Some(pc) = publisher {
            if !self.peers.holds(pc) {
                self.peers.hold(pc);
                self.metrics.peer_throttles += 1;
            }
        }
    }

    pub(crate) fn release_deferred(&mut self, ready: Vec<(ConnId, Deferred)>) {
        for (conn, out) in ready {
            match out {
                // It may still wait for the store.
                Deferred::Ack(out) => self.send_publish_ack(conn, out),
                Deferred::SubAck(out, sid, replays) => self.subscribed(conn, sid, out, replays),
            }
        }
    }

    /// The next batch of events for a peer, if any waits. Call after every
    /// `handle_*` call (or once per turn of the event loop, which batches).
    pub fn poll_peer_transmit(&mut self) -> Option<PeerBatch> {
        self.announce();
        self.peers.poll()
    }

    /// Tell the peers of this core's new and withdrawn filters. Returns the
    /// change number to wait for before a SUBACK, if any was announced.
    pub(crate) fn announce(&mut self) -> Option<u64> {
        let mut last = None;
        for a in self.router.take_announcements() {
            let seq = self.peers.stamp();
            last = Some(seq);
            self.peers.send_all(|| PeerEvent::Interest {
                filter: a.filter.clone(),
                group: a.group.clone(),
                add: a.add,
                seq,
            });
        }
        last
    }

    /// Peer `peer` joined late (a restarted shard, a new node, a link
    /// back up): tell it everything this core subscribes to, and every
    /// retained message. They stand for every change so far: seen, they
    /// release what waited for earlier changes the peer may have missed.
    pub fn peer_joined(&mut self, peer: PeerId) {
        let seq = self.peers.last_seq();
        let mut sent = false;
        for (filter, group) in self.router.interests() {
            sent = true;
            self.peers.send(
                peer,
                PeerEvent::Interest {
                    filter: filter.into(),
                    group,
                    add: true,
                    seq,
                },
            );
        }
        let mut kept = Vec::new();
        self.store.matching("#", &mut kept);
        for m in kept {
            sent = true;
            let msg = m.for_peer();
            self.peers.send(peer, PeerEvent::Retain { msg, seq });
        }
        if !sent {
            // Nothing for it to apply: it has seen everything.
            let ready = self.peers.seen(peer, seq);
            self.release_deferred(ready);
        }
        // A replica (new, restarted, or back) gets the sessions anew.
        if !self.replica_set_changed().contains(&peer) {
            self.send_images(Some(peer), None);
        }
    }

    /// This core's last change number: a peer that answers it with
    /// [`PeerEvent::Seen`] has applied every change (the shell asks again
    /// after a link broke, when answers may have been lost with it).
    pub fn peer_seq(&self) -> u64 {
        self.peers.last_seq()
    }

    /// A node joined after [`Broker::set_peers`]: from now on it is a peer
    /// like the others, and gets this core's state (`peer_joined`).
    pub fn add_peer(&mut self, peer: PeerId) {
        self.peers.add(peer);
        self.router.set_peered(self.peers.me());
        self.peer_joined(peer);
    }

    /// `peer` left (a node removed): its interests are forgotten, what it
    /// held is released, and what waited for it (a SUBACK, a retained
    /// message's acknowledgement) goes.
    pub fn peer_left(&mut self, peer: PeerId) {
        self.router.forget_peer(peer);
        let (wake, ready) = self.peers.remove(peer);
        self.router.set_peered(self.peers.me());
        for conn in wake {
            self.wake(conn);
        }
        self.release_deferred(ready);
        self.replica_answered(peer, None);
        self.replica_set_changed();
        self.end_event();
    }

    /// `peer` cannot be reached (`away`: a node whose link is down), or is
    /// back. While it is away, a SUBACK or an acknowledgement that waits
    /// for every peer does not wait for it; when its link is up again it
    /// gets this core's state anew.
    pub fn set_peer_away(&mut self, peer: PeerId, away: bool) {
        let ready = self.peers.set_away(peer, away);
        self.release_deferred(ready);
        self.replica_answered(peer, None);
        // Back, it gets full images (what it missed may have been dropped
        // from its full queue); away, another peer may take its place.
        self.replica_set_changed();
        self.end_event();
    }

    /// `peer` resends its whole state (its link reconnected): forget what
    /// it said before, its holds on our publishers too (a release may have
    /// been lost with the link).
    pub fn peer_reset(&mut self, peer: PeerId) {
        self.router.forget_peer(peer);
        for conn in self.peers.release_held_by(peer) {
            self.wake(conn);
        }
    }

    /// The shell's queue towards `peer` is full (or has room again). While
    /// it is full, QoS 0 messages for it are dropped (counted) and the
    /// publishers of QoS 1/2 messages for it are not read (push-back).
    pub fn set_peer_congested(&mut self, peer: PeerId, congested: bool) {
        for conn in self.peers.set_congested(peer, congested) {
            self.wake(conn);
        }
    }

    /// Route a message published at this core (by a client, a will,
    /// `$SYS`): the retained store (here and at every peer), then every
    /// matching session here and every peer with subscribers. Returns how
    /// many sessions and peers got it.
    pub(crate) fn route(&mut self, now: Instant, msg: Rc<Message>) -> usize {
        // Over the retained quota: delivered, not kept (see `quota`).
        if msg.retain
            && self.config.retain_available
            && !super::quota::retained_admitted(
                &self.config,
                &*self.store,
                &msg,
                &mut self.metrics.security,
            )
        {
            self.retain_refused = true;
            return self.deliver(now, msg, Scope::Everywhere);
        }
        if msg.retain && self.config.retain_available {
            if self.peers.any() {
                let seq = self.peers.stamp();
                self.ack_fence = Some(seq);
                self.peers.send_all(|| PeerEvent::Retain {
                    msg: msg.for_peer(),
                    seq,
                });
            }
            if !msg.payload.is_empty() {
                self.dur_set_retained(&msg);
            } else {
                self.dur_clear_retained(msg.topic.as_str());
            }
            self.keep_retained(msg.clone());
        }
        let durable_fence = self.durable.on() && msg.qos != QoS::AtMostOnce;
        let forwarded = self.metrics.peer_forwarded;
        let count = self.deliver(now, msg, Scope::Everywhere);
        if durable_fence && self.metrics.peer_forwarded != forwarded {
            // Acknowledged once every peer that may hold it for a
            // persistent session has it on disk (see `PeerEvent::Fence`).
            let seq = self.peers.stamp();
            self.ack_fence = Some(seq);
            self.peers.send_all(|| PeerEvent::Fence { seq });
        }
        count
    }

    /// Set (or, with an empty payload, clear) a retained message.
    fn keep_retained(&mut self, msg: Rc<Message>) {
        if msg.payload.is_empty() {
            self.store.clear(msg.topic.as_str());
        } else {
            let kept = self.keepable(&msg);
            self.store.set(kept);
        }
    }

    /// Queue `msg` for the sessions the router finds in `scope`, and send it
    /// on to the peers it finds.
    fn deliver(&mut self, now: Instant, msg: Rc<Message>, scope: Scope<'_>) -> usize {
        let sessions = &self.sessions;
        let online = |s: SessionId| sessions.get(&s).is_some_and(|x| x.conn.is_some());
        // A peer's session ids are not ours: No Local is for local publishers.
        let origin = msg.origin.filter(|_| msg.origin_peer.is_none());
        let mut routed = self.router.route(
            msg.topic.as_str(),
            origin,
            msg.qos,
            msg.retain,
            scope,
            online,
        );
        let mut count = 0;
        let mut compacted = None;
        for hit in routed.hits.drain(..) {
            if !self.may_deliver(hit.session, msg.topic.as_str()) {
                continue;
            }
            count += 1;
            let item = Queued {
                msg: msg.clone(),
                qos: hit.qos,
                retain: hit.retain,
                sub_ids: hit.sub_ids,
                share: hit.share,
                entry: None,
                replay: false,
            };
            self.enqueue_with(now, hit.session, item, &mut compacted);
        }
        for f in routed.forwards.drain(..) {
            if self.peers.congested(f.peer) {
                if msg.qos == QoS::AtMostOnce {
                    self.metrics.dropped_qos0_peer_full += 1;
                    continue;
                }
                // Sent all the same (an acknowledged message is never
                // dropped); its publisher waits until the peer drains.
                self.hold_publisher(&msg);
            }
            count += 1;
            self.metrics.peer_forwarded += 1;
            if self.peers.crossed(f.peer, msg.size() as u64) {
                // Its window is full: read the publisher again once the
                // peer confirms (see `peer::WINDOW`).
                self.hold_publisher(&msg);
            }
            let event = PeerEvent::Publish {
                msg: msg.for_peer(),
                direct: f.direct,
                shares: f.shares,
            };
            self.peers.send(f.peer, event);
        }
        self.router.recycle(routed);
        count
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A new network connection; it has `connect_timeout` to send CONNECT.
    pub fn connection_opened(&mut self, now: Instant, peer: SocketAddr) -> ConnId {
        let id = ConnId(self.next_conn);
        self.next_conn += 1;
        self.conns.insert(id, Box::new(Connection::new(peer, now)));
        self.metrics.connections_opened += 1;
        self.timers.arm(
            now + Duration::from_secs(self.config.connect_timeout),
            Timer::ConnectTimeout(id),
        );
        id
    }

    /// A decoded packet from a connection.
    pub fn handle_packet(&mut self, now: Instant, conn: ConnId, packet: Packet) {
        self.dispatch_packet(now, conn, packet, None);
        self.end_event();
    }

    /// [`Broker::handle_packet`] for a PUBLISH, with where it lies in its
    /// read buffer ([`Wire::candidate`]): deliveries that are byte for byte
    /// that packet are then written from there.
    pub fn handle_publish(
        &mut self,
        now: Instant,
        conn: ConnId,
        packet: Packet,
        wire: Option<Wire>,
    ) {
        self.dispatch_packet(now, conn, packet, wire);
        self.end_event();
    }

    fn dispatch_packet(&mut self, now: Instant, conn: ConnId, packet: Packet, wire: Option<Wire>) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.last_activity = now;
        let phase = c.phase;
        let sid = match phase {
            Phase::Closing => return,
            Phase::AwaitingTakeover => {
                // The shell holds this input until the takeover is over; a
                // packet handed over anyway completes it first, so that the
                // connection's own packets keep their order.
                self.complete_takeover(now, conn);
                match self.conns.get(&conn).map(|c| c.phase) {
                    Some(Phase::Connected(sid)) => sid,
                    _ => return,
                }
            }
            Phase::AwaitingAuth => {
                // Held by the shell until the answer: a packet handed over
                // anyway cannot be ordered after a login not yet decided.
                self.metrics.protocol_errors += 1;
                self.close(now, conn, None, false);
                return;
            }
            Phase::AwaitingConnect => {
                match packet {
                    Packet::Connect(connect) => self.on_connect(now, conn, *connect),
                    Packet::Auth(a) if self.scram_waiting(conn) => self.on_scram_auth(now, conn, a),
                    _ => {
                        // The first packet must be CONNECT (MQTT-3.1.0-1).
                        self.metrics.protocol_errors += 1;
                        self.close(now, conn, None, false);
                    }
                }
                return;
            }
            Phase::Connected(_) if self.acl_holds(conn) => {
                // Held by the shell while a packet waits for ACL answers.
                self.metrics.protocol_errors += 1;
                self.close(now, conn, None, false);
                return;
            }
            Phase::Connected(sid) => sid,
        };
        match packet {
            Packet::Publish(p) => self.on_publish(now, conn, sid, p, wire),
            Packet::PubAck(a) => self.on_puback(conn, sid, a),
            Packet::PubRec(a) => self.on_pubrec(conn, sid, a),
            Packet::PubRel(a) => self.on_pubrel(conn, sid, a),
            Packet::PubComp(a) => self.on_pubcomp(conn, sid, a),
            Packet::Subscribe(s) => self.on_subscribe(now, conn, sid, s),
            Packet::Unsubscribe(u) => self.on_unsubscribe(now, conn, sid, u),
            Packet::PingReq => self.send(conn, Packet::PingResp),
            Packet::Disconnect(d) => self.on_disconnect(now, conn, sid, d),
            Packet::Connect(_) => self.protocol_error(now, conn, "second CONNECT"),
            Packet::Auth(a) => self.on_auth_connected(now, conn, a),
            Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp => {
                self.protocol_error(now, conn, "server-to-client packet sent by a client")
            }
        }
    }

    /// A frame that could not be framed or decoded: close that connection
    /// with the reason the codec chose (MQTT 5) or silently (3.x).
    pub fn handle_decode_error(&mut self, now: Instant, conn: ConnId, err: DecodeError) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if err.reason == ReasonCode::PROTOCOL_ERROR {
            self.metrics.protocol_errors += 1;
        } else {
            self.metrics.malformed_packets += 1;
        }
        let peer = c.peer;
        self.log_bad_input(now, conn, peer, err.what, err.reason);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        match c.phase {
            Phase::Closing => {}
            Phase::AwaitingTakeover | Phase::AwaitingAuth => self.close(now, conn, None, false),
            Phase::AwaitingConnect => {
                if err.reason == ReasonCode::UNSUPPORTED_PROTOCOL_VERSION {
                    // Answered in 3.1.1 form (return code 1), which every
                    // client version can read (MQTT-3.1.2-2).
                    c.protocol = Protocol::V311;
                    let ack = zerofan_codec::ConnAck {
                        session_present: false,
                        reason: ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
                        properties: Default::default(),
                    };
                    self.send(conn, Packet::ConnAck(ack));
                }
                self.close(now, conn, None, false);
            }
            Phase::Connected(_) => {
                let reason = disconnect_reason(err.reason);
                self.close_with(now, conn, reason, Some(err.what), true);
            }
        }
        self.end_event();
    }

    /// The network connection is gone (EOF, error, or the shell closed it
    /// after a `Transmit::Close`). Publishes the will when the close was not
    /// a normal DISCONNECT. Must be called exactly once per connection.
    pub fn connection_lost(&mut self, now: Instant, conn: ConnId) {
        self.close(now, conn, None, true);
        self.auth_connection_closed(conn);
        self.peers.forget(conn);
        self.claims.forget(conn);
        self.repl.forget(conn);
        self.conns.remove(&conn);
        self.end_event();
    }

    /// In a cluster: every CONNECT with a client id waits, once logged in,
    /// until the shell claimed the id for this node (see
    /// [`Broker::take_claims`]).
    pub fn set_claims(&mut self, on: bool) {
        self.claims.enable(on);
    }

    /// Client ids to claim through the cluster; answer each with
    /// [`Broker::claim_answered`].
    pub fn take_claims(&mut self, out: &mut Vec<super::ClaimRequest>) {
        self.claims.take_requests(out);
    }

    /// Whether [`Broker::take_claims`] has something.
    pub fn has_claims(&self) -> bool {
        self.claims.has_requests()
    }

    /// The cluster's answer to `conn`'s claim: its CONNECT goes on, or,
    /// when the cluster could not agree (no majority reachable), is refused
    /// with 0x88 Server unavailable (3.1.1: return code 3).
    pub fn claim_answered(&mut self, now: Instant, conn: ConnId, granted: bool) {
        let Some(connect) = self.claims.answered(conn, granted) else {
            return;
        };
        match self.conns.get_mut(&conn) {
            Some(c) if c.phase == Phase::AwaitingAuth => c.phase = Phase::AwaitingConnect,
            _ => return,
        }
        if granted {
            // An image kept here becomes the session; the replicas get it.
            self.install_replica(now, &connect);
            let client = connect.client_id.clone();
            self.handle_connect(now, conn, *connect, true);
            self.claimed(&client);
        } else {
            self.metrics.claims_refused += 1;
            self.refuse(now, conn, ReasonCode::SERVER_UNAVAILABLE);
        }
        self.wake(conn);
        self.end_event();
    }

    /// Another node took `client_id` over (a newer claim): its connection
    /// here gets DISCONNECT 0x8E and its session here ends.
    pub fn client_taken(&mut self, now: Instant, client_id: &str) {
        let Ok(id) = MqttStr::try_from(client_id) else {
            return;
        };
        let Some(&sid) = self.by_client.get(&id) else {
            return;
        };
        self.metrics.fenced_takeovers += 1;
        if let Some(conn) = self.sessions.get(&sid).and_then(|s| s.conn) {
            self.close(now, conn, Some(ReasonCode::SESSION_TAKEN_OVER), true);
        }
        self.end_session(now, sid);
        self.end_event();
    }

    /// A connection that has not sent its CONNECT yet leaves this core for
    /// the shard that owns its client id (which opens it anew): forget it
    /// without counting it as opened or closed here. Returns its peer
    /// address; `None` (nothing done) once it has a session.
    pub fn connection_moved(&mut self, conn: ConnId) -> Option<SocketAddr> {
        let c = self.conns.get(&conn)?;
        if c.phase != Phase::AwaitingConnect {
            return None;
        }
        let peer = c.peer;
        self.auth_connection_closed(conn);
        self.conns.remove(&conn);
        self.metrics.connections_opened = self.metrics.connections_opened.saturating_sub(1);
        Some(peer)
    }

    /// When [`Broker::handle_timeout`] next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Run every deadline that is due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(timer) = self.timers.pop_due(now) {
            match timer {
                Timer::ConnectTimeout(conn)
                    if self.conns.get(&conn).is_some_and(|c| {
                        matches!(c.phase, Phase::AwaitingConnect | Phase::AwaitingAuth)
                    }) =>
                {
                    self.metrics.connect_timeouts += 1;
                    self.close(now, conn, None, false);
                }
                // Connected by now: the entry doubles as the first keep-alive
                // check (see `on_connect`).
                Timer::ConnectTimeout(conn) | Timer::KeepAlive(conn) => {
                    let Some(c) = self.conns.get(&conn) else {
                        continue;
                    };
                    if c.session().is_none() {
                        continue;
                    }
                    if self.held(conn) {
                        // Not read because of a slow subscriber: its silence
                        // is ours, so the time held counts as activity.
                        if let Some(c) = self.conns.get_mut(&conn) {
                            c.last_activity = now;
                            if let Some(at) = c.keep_alive_deadline() {
                                self.timers.arm(at, Timer::KeepAlive(conn));
                            }
                        }
                        continue;
                    }
                    let Some(c) = self.conns.get(&conn) else {
                        continue;
                    };
                    match c.keep_alive_deadline() {
                        Some(at) if at <= now => {
                            self.metrics.keep_alive_timeouts += 1;
                            tracing::debug!(%conn, "keep alive timeout");
                            self.close(now, conn, Some(ReasonCode::KEEP_ALIVE_TIMEOUT), true);
                        }
                        Some(at) => self.timers.arm(at, Timer::KeepAlive(conn)),
                        None => {}
                    }
                }
                Timer::Will(sid) => {
                    let due = self
                        .sessions
                        .get(&sid)
                        .and_then(|s| s.pending_will.as_ref())
                        .is_some_and(|w| w.at <= now);
                    if due {
                        if let Some(w) = self
                            .sessions
                            .get_mut(&sid)
                            .and_then(|s| s.pending_will.take())
                        {
                            self.publish_will(now, w.will);
                            self.dur_will_published(sid);
                        }
                    }
                }
                Timer::SessionExpiry(sid) => {
                    let expired = self.sessions.get(&sid).is_some_and(|s| {
                        s.conn.is_none() && s.expires_at.is_some_and(|at| at <= now)
                    });
                    if expired {
                        if self.events.on() {
                            let id = self.sessions.get(&sid).map(|s| &s.client_id);
                            self.events.session_expired(id);
                        }
                        self.metrics.sessions_expired += 1;
                        self.end_session(now, sid);
                    }
                }
                Timer::SlowConsumer(sid) => self.on_slow_timer(now, sid),
                Timer::TokenExpiry(conn) => self.on_token_expiry(now, conn),
                Timer::Takeover(conn) if self.takeovers.contains_key(&conn) => {
                    self.metrics.takeover_drain_timeouts += 1;
                    tracing::debug!(%conn, "takeover completed without the old input drained");
                    self.complete_takeover(now, conn);
                }
                Timer::Takeover(_) => {}
                Timer::Sys => {
                    self.publish_sys(now);
                    self.timers.arm(
                        now + Duration::from_secs(self.config.sys_interval),
                        Timer::Sys,
                    );
                }
            }
        }
        self.end_event();
    }

    /// Server shutdown: every connection gets DISCONNECT 0x8B (MQTT 5) and
    /// is closed after its outbox is flushed.
    pub fn shutdown(&mut self, now: Instant) {
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for conn in ids {
            self.close(now, conn, Some(ReasonCode::SERVER_SHUTTING_DOWN), false);
        }
        self.end_event();
    }

    /// Move up to `max` items for `conn`'s writer into `out`: control
    /// packets first, then queued messages as far as the client's window
    /// allows. Call again after writing them; an empty batch with
    /// [`Transmit::Open`] means nothing to do until the next wake-up.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        conn: ConnId,
        out: &mut Vec<Outgoing>,
        max: usize,
    ) -> Transmit {
        let status = self.fill_batch(now, conn, out, max);
        self.end_event();
        status
    }

    /// Connections whose writer has something new (or must close), since
    /// the last call. Each appears once.
    pub fn take_wakeups(&mut self, out: &mut Vec<ConnId>) {
        out.append(&mut self.wakeups);
    }

    /// The protocol to decode this connection's packets with.
    pub fn protocol(&self, conn: ConnId) -> Protocol {
        self.conns.get(&conn).map_or(Protocol::V311, |c| c.protocol)
    }

    /// The largest packet to accept from this connection.
    pub fn max_packet_size(&self, conn: ConnId) -> u32 {
        let _ = conn; // one limit for all today; per-listener limits later
        self.config.max_packet_size
    }

    /// Whether the shell may read this connection's input (one lookup, on
    /// the path of every packet).
    pub fn input_state(&self, conn: ConnId) -> InputState {
        match self.conns.get(&conn).map(|c| c.phase) {
            None | Some(Phase::Closing) => InputState::Closed,
            Some(Phase::AwaitingTakeover | Phase::AwaitingAuth) => InputState::Held,
            Some(Phase::Connected(_)) if self.acl_holds(conn) => InputState::Held,
            Some(_) => InputState::Open,
        }
    }

    /// The connection's CONNECT waits for a takeover: the shell keeps what
    /// it read and reads no more (cheap when no takeover is pending).
    pub fn holds_input(&self, conn: ConnId) -> bool {
        (!self.takeovers.is_empty() || self.auth_waiting() > 0)
            && (self.acl_holds(conn)
                || self.conns.get(&conn).is_some_and(|c| {
                    matches!(c.phase, Phase::AwaitingTakeover | Phase::AwaitingAuth)
                }))
    }

    /// A new connection with this connection's client id waits: the shell
    /// reads everything its socket holds now, feeds it, and then calls
    /// [`Broker::input_drained`] (or `connection_lost` at EOF).
    pub fn drain_requested(&self, conn: ConnId) -> bool {
        !self.draining.is_empty() && self.draining.contains_key(&conn)
    }

    /// The connection's socket has nothing more to read now: the takeover
    /// waiting for it completes (the connection, if still open, is closed as
    /// taken over, and the new CONNECT handled after what it had sent).
    pub fn input_drained(&mut self, now: Instant, conn: ConnId) {
        if let Some(new) = self.draining.get(&conn).copied() {
            self.complete_takeover(now, new);
        }
        self.end_event();
    }

    /// True once the broker has decided to close the connection (or it is unknown).
    pub fn is_closing(&self, conn: ConnId) -> bool {
        !matches!(self.conns.get(&conn), Some(c) if c.phase != Phase::Closing)
    }

    /// True until the connection's CONNECT is accepted: the shell refuses a
    /// first packet of any other type at its first byte (MQTT-3.1.0-1)
    /// instead of waiting for the rest of it.
    pub fn awaits_connect(&self, conn: ConnId) -> bool {
        self.conns
            .get(&conn)
            .is_some_and(|c| c.phase == Phase::AwaitingConnect)
    }

    /// Whether the shell should not read this connection now: a subscriber
    /// it publishes to is behind, or a shard it publishes to is full
    /// (push-back). A wake-up comes when that ends.
    pub fn held(&self, conn: ConnId) -> bool {
        self.peers.holds(conn)
            || self
                .conns
                .get(&conn)
                .and_then(|c| c.held_by)
                .is_some_and(|sid| self.sessions.get(&sid).is_some_and(|s| s.conn.is_some()))
    }

    /// Control packets waiting for the writer; the shell stops reading from
    /// a client that does not read its answers.
    pub fn outbox_len(&self, conn: ConnId) -> usize {
        self.conns.get(&conn).map_or(0, |c| c.outbox.len())
    }

    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Hand over figures only the shell knows, for `$SYS/`.
    pub fn set_shell_stats(&mut self, stats: ShellStats) {
        self.shell_stats = stats;
    }

    /// Clients currently connected.
    pub fn connected_clients(&self) -> usize {
        self.conns
            .values()
            .filter(|c| c.session().is_some())
            .count()
    }

    /// Sessions that exist (connected or not).
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Messages queued (not yet sent) for `client_id`'s session.
    pub fn queued_messages(&self, client_id: &str) -> Option<usize> {
        let key = MqttStr::try_from(client_id).ok()?;
        let sid = self.by_client.get(&key)?;
        self.sessions.get(sid).map(|s| s.queue_len())
    }

    /// Messages in flight (sent, not acknowledged) to `client_id`.
    pub fn inflight_messages(&self, client_id: &str) -> Option<usize> {
        let key = MqttStr::try_from(client_id).ok()?;
        let sid = self.by_client.get(&key)?;
        self.sessions.get(sid).map(|s| s.flight().inflight.len())
    }

    /// Retained messages stored.
    pub fn retained_count(&self) -> usize {
        self.store.len()
    }

    /// Record the event kinds in `mask` for [`Broker::take_events`].
    pub fn set_event_mask(&mut self, mask: u16) {
        self.events.set_mask(mask);
    }

    /// Move the recorded events into `out`; events dropped (buffer full)
    /// since start.
    pub fn take_events(&mut self, out: &mut Vec<super::events::Event>) -> u64 {
        self.events.take(out)
    }

    /// The sessions the HTTP API lists: how many match `q`, and its page
    /// (see `admin`).
    pub fn admin_clients(
        &self,
        q: &super::admin::ClientQuery,
    ) -> (usize, Vec<super::admin::ClientView>) {
        super::admin::views(&self.sessions, &self.conns, q)
    }

    /// `client_id`'s session with its subscriptions.
    pub fn admin_client(&self, client_id: &str) -> Option<super::admin::ClientView> {
        let sid = super::admin::session_of(&self.by_client, client_id)?;
        let s = self.sessions.get(&sid)?;
        Some(super::admin::view(s, &self.conns, true))
    }

    /// The retained messages whose topics match `filter`.
    pub fn admin_retained(&self, filter: &str, out: &mut Vec<std::rc::Rc<super::Message>>) {
        self.store.matching(filter, out);
    }

    /// Disconnect `client_id` (MQTT 5: DISCONNECT 0x98, will published);
    /// `discard` ends its session too. False when there is no such session.
    pub fn admin_disconnect(&mut self, now: Instant, client_id: &str, discard: bool) -> bool {
        let Some(sid) = super::admin::session_of(&self.by_client, client_id) else {
            return false;
        };
        if let Some(conn) = self.sessions.get(&sid).and_then(|s| s.conn) {
            let why = Some("disconnected by an administrator");
            self.close_with(now, conn, ReasonCode::ADMINISTRATIVE_ACTION, why, true);
        }
        if discard && self.sessions.contains_key(&sid) {
            self.end_session(now, sid);
        }
        self.end_event();
        true
    }

    /// Publish on behalf of no client (the HTTP API); how many sessions
    /// got it.
    pub fn admin_publish(
        &mut self,
        now: Instant,
        publish: zerofan_codec::Publish,
    ) -> Result<usize, super::admin::AdminPublishError> {
        super::admin::check_publish(&self.config, &publish.topic, publish.retain)?;
        let msg = std::rc::Rc::new(super::Message::from_publish(publish, None, now));
        if self.events.on() {
            self.events.published(None, &msg);
        }
        let n = self.route(now, msg);
        self.end_event();
        Ok(n)
    }

    /// Clear the retained message of `topic` (a topic name, no wildcard).
    pub fn admin_clear_retained(&mut self, topic: &str) {
        self.store.clear(topic);
        self.dur_clear_retained(topic);
        self.end_event();
    }

    // ----- shared helpers -------------------------------------------------

    /// Warn about bad input through the log rate limit (a hostile client
    /// must not flood the log), counting what was suppressed; every case at
    /// debug.
    fn log_bad_input(
        &mut self,
        now: Instant,
        conn: ConnId,
        peer: SocketAddr,
        what: &str,
        reason: ReasonCode,
    ) {
        tracing::debug!(%conn, %peer, what, reason = reason.0, "bad input");
        if let Some(suppressed) = self.log_gate(now, what) {
            tracing::warn!(%conn, %peer, what, reason = reason.0, suppressed, "closing connection after bad input");
        }
    }

    /// Queue a control packet for a connection.
    pub(crate) fn send(&mut self, conn: ConnId, packet: Packet) {
        self.send_outgoing(conn, Outgoing::from_packet(packet));
    }

    /// Queue an item for the writer of `conn`.
    pub(crate) fn send_outgoing(&mut self, conn: ConnId, out: Outgoing) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.outbox.push_back(out);
            self.wake(conn);
        }
    }

    /// Tell the shell this connection's writer has work.
    pub(crate) fn wake(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if !c.woken {
                c.woken = true;
                self.wakeups.push(conn);
            }
        }
    }

    /// A protocol violation: DISCONNECT 0x82 (MQTT 5), close, will published.
    pub(crate) fn protocol_error(&mut self, now: Instant, conn: ConnId, what: &'static str) {
        self.metrics.protocol_errors += 1;
        if let Some(peer) = self.conns.get(&conn).map(|c| c.peer) {
            self.log_bad_input(now, conn, peer, what, ReasonCode::PROTOCOL_ERROR);
        }
        self.close_with(now, conn, ReasonCode::PROTOCOL_ERROR, Some(what), true);
    }

    /// Close with a reason code and a reason string for MQTT 5 clients that
    /// asked for problem information.
    pub(crate) fn close_with(
        &mut self,
        now: Instant,
        conn: ConnId,
        reason: ReasonCode,
        what: Option<&'static str>,
        publish_will: bool,
    ) {
        self.close_inner(now, conn, Some(reason), what, publish_will);
    }

    /// Start closing a connection: optional DISCONNECT (MQTT 5 only), the
    /// session detached, the will published or scheduled if asked.
    pub(crate) fn close(
        &mut self,
        now: Instant,
        conn: ConnId,
        reason: Option<ReasonCode>,
        publish_will: bool,
    ) {
        self.close_inner(now, conn, reason, None, publish_will);
    }

    fn close_inner(
        &mut self,
        now: Instant,
        conn: ConnId,
        reason: Option<ReasonCode>,
        what: Option<&'static str>,
        publish_will: bool,
    ) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let prev = std::mem::replace(&mut c.phase, Phase::Closing);
        if prev == Phase::Closing {
            return;
        }
        if let (Some(reason), Phase::Connected(_)) = (reason, prev) {
            if c.protocol.is_v5() {
                let mut properties = Properties::default();
                if c.problem_info {
                    // Always with a reason string: some clients (paho-mqtt)
                    // read the reason code only when properties follow it.
                    let text = what.unwrap_or_else(|| reason_text(reason));
                    properties.reason_string = Some(MqttStr::from_static(text));
                }
                let mut packet = Packet::Disconnect(Disconnect {
                    reason,
                    properties: properties.into(),
                });
                let too_big = zerofan_codec::encoded_len(&packet, Protocol::V5)
                    .map_or(true, |len| len > c.max_packet_out as usize);
                if too_big {
                    // Never exceed the client's Maximum Packet Size: the
                    // reason string is the part that may go (MQTT-3.14.2-3).
                    packet = Packet::Disconnect(Disconnect {
                        reason,
                        properties: Default::default(),
                    });
                }
                c.outbox.push_back(Outgoing::from_packet(packet));
            }
        }
        let will = if publish_will {
            c.will.take().map(|w| {
                let delay = w.properties.will_delay_interval.unwrap_or(0);
                (w, delay)
            })
        } else {
            c.will = None;
            None
        };
        self.wake(conn);
        if let Phase::Connected(sid) = prev {
            if self.events.on() {
                let user = self
                    .conns
                    .get(&conn)
                    .and_then(|c| c.sec.username.as_deref());
                let id = self.sessions.get(&sid).map(|s| &s.client_id);
                self.events.disconnected(id, user, reason.map(|r| r.0));
            }
            self.detach(now, sid, will);
        }
        if prev == Phase::AwaitingTakeover {
            self.cancel_takeover(conn);
        }
        if !self.draining.is_empty() {
            // Closed while a CONNECT waited for its input: that CONNECT now
            // sees the session as this close left it.
            if let Some(new) = self.draining.get(&conn).copied() {
                self.complete_takeover(now, new);
            }
        }
    }
}

/// The DISCONNECT reason for a decode error: the codec's code when it is one
/// DISCONNECT may carry, else 0x81 Malformed Packet.
fn disconnect_reason(code: ReasonCode) -> ReasonCode {
    if code.is_error() && code.valid_in_disconnect() {
        code
    } else {
        ReasonCode::MALFORMED_PACKET
    }
}

/// A human description of a DISCONNECT reason the broker sends.
fn reason_text(reason: ReasonCode) -> &'static str {
    match reason {
        ReasonCode::SERVER_SHUTTING_DOWN => "server shutting down",
        ReasonCode::KEEP_ALIVE_TIMEOUT => "keep alive timeout",
        ReasonCode::SESSION_TAKEN_OVER => "session taken over by another connection",
        ReasonCode::QUOTA_EXCEEDED => "quota exceeded",
        ReasonCode::PROTOCOL_ERROR => "protocol error",
        ReasonCode::MALFORMED_PACKET => "malformed packet",
        ReasonCode::PACKET_TOO_LARGE => "packet too large",
        _ => "disconnected by the server",
    }
}

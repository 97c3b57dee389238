//! The broker state machine, and the only `impl Broker`: the entry points
//! the shell calls and the protocol handlers that touch connections,
//! sessions, the router and the durable log at once, in sections in the
//! order of a packet's life. Logic that needs one part of the state lives
//! with that part's type in the sibling files (`Router`, `Peers`,
//! `AuthState`, `Durable`, `Session`, ...).

use super::auth::{acl_allows, ConnectionMeta, Refusal, SecurityConfig, THROTTLED_REASON};
use super::connect::{own_will, random_client_id, PendingTakeover, TAKEOVER_DRAIN};
use super::connection::{Connection, Phase};
use super::deliver::{
    fits, held_remote, high_water, into_delivery, low_water, make_delivery, HOLD_SLACK, QUEUE_KEEP,
};
use super::durable::{
    armed_will, forget_entries, from_stored, placeholder, stored_will, sub_options, to_stored,
    will_from_stored, EventEnd,
};
use super::durable::{
    DurableLog, EntryId, MsgId, QueueEntry, Recovered, SessionMeta, StoreStats, StoredMessage,
};
use super::hash::{HashMap, HashSet};
use super::http_auth::{login_body, AclAction, AuthRequest, HttpAnswer, Lookup};
use super::ids::{ConnId, SessionId};
use super::limits::PublishLimiter;
use super::message::{copy_str, later, Message};
use super::metrics::{Metrics, ShellStats};
use super::moment::Moment;
use super::moves::{Answer, Hit as MoveHit, MOVE_TIMEOUT};
use super::observe::{Gauges, ReloadOutcome, ShardFigures, StoreFigures};
use super::orphans::{FencedWill, KeptWill};
use super::outbox::{Outgoing, Transmit};
use super::peer::{Deferred, PeerBatch, PeerEvent, PeerId, Peers};
use super::publish::{ack, topic_levels};
use super::router::{Router, Scope};
use super::scram_auth::{made_up, nonce, ScramPending};
use super::session::{
    Behind, Inflight, InflightState, PendingWill, PushOutcome, Queued, Session, SubRecord,
};
use super::sessions::Sessions;
use super::slots::ConnTable;
use super::store::{MemoryStore, RetainedStore};
use super::subscribe::Replay;
use super::sys::sys_figures;
use super::timers::{Timer, Timers};
use super::token::{login_chain, Grant, HttpLink, Stop};
use super::trie::SubEntry;
use super::wire::Wire;
use crate::config::{Config, QueueFull};
use crate::ratelimit::Verdict;
use bytes::Bytes;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerofan_auth::scram::{ScramCredentials, ScramHash, ScramServer};
use zerofan_codec::{
    Ack, ConnAck, Connect, DecodeError, Disconnect, MqttStr, Packet, Properties, Protocol, Publish,
    QoS, ReasonCode, SubAck, Subscribe, SubscriptionOptions, UnsubAck, Unsubscribe, Will,
};

/// The whole broker as a deterministic state machine: packets and time go
/// in, outboxes and wake-ups come out. No sockets, no clock, no async.
///
/// # The order in which the shell calls it
///
/// Each input below is one core event: it ends inside the call, with one
/// commit of what it staged in the durable log (its PUBACKs / PUBRECs are
/// held until that commit is durable, see [`Broker::release_durable`]).
///
/// 1. Inputs, each as it happens:
///    - a socket accepted and set up (TLS, WebSocket, PROXY):
///      [`Broker::connection_opened_with`] (after the shell's admission);
///    - each packet framed from a read buffer: [`Broker::protocol`] to
///      decode it, then [`Broker::handle_publish`] (a PUBLISH, with its
///      received bytes), [`Broker::handle_packet`] or
///      [`Broker::handle_decode_error`]; after each, [`Broker::input_state`]
///      (stop reading at `Held` or `Closed`);
///    - a connection whose input [`Broker::drain_requested`] has read all
///      it had: [`Broker::input_drained`];
///    - the socket closed or failed: [`Broker::connection_lost`];
///    - [`Broker::poll_timeout`]'s deadline passed (or the shell's tick):
///      [`Broker::set_shell_stats`] (or, with shards,
///      [`Broker::set_other_shards`]), then [`Broker::handle_timeout`];
///    - events from another shard or node: [`Broker::handle_peer`], in the
///      order that peer polled them;
///    - the store reported progress: [`Broker::release_durable`];
///    - answers from outside: [`Broker::auth_answered`],
///      [`Broker::claim_answered`], [`Broker::client_taken`].
/// 2. Outputs, after every input above or a batch of them (the shell's
///    `Shared::dispatch`), in this order:
///    1. [`Broker::take_events`] (webhooks);
///    2. [`Broker::poll_peer_transmit`] until `None`, to the other shards
///       and then to the cluster links ([`Broker::set_peer_congested`]
///       when a queue towards a peer is full);
///    3. [`Broker::has_auth_requests`] / [`Broker::has_claims`]: their
///       tasks then [`Broker::take_auth_requests`] / [`Broker::take_claims`];
///    4. [`Broker::take_wakeups`]: each connection named is woken, and its
///       task calls [`Broker::poll_transmit`] and writes the batch, until
///       the outbox is empty; [`Transmit::Close`]: write, then close (and
///       [`Broker::connection_lost`]).
/// 3. Before sleeping: [`Broker::poll_timeout`].
/// 4. At the end: [`Broker::shutdown`], then the outputs once more.
pub struct Broker {
    config: Config,
    /// In slots, not a hash map (see `slots.rs`); they hand out the
    /// connection ids.
    conns: ConnTable<Connection>,
    /// Every session, by id (in slots, like `conns`) and by client id.
    sessions: Sessions,
    /// Connections not read because a subscriber they publish to is behind
    /// (push-back), by the session that holds them. Rare, so kept here
    /// rather than 16 bytes in every `Connection`; an entry goes with its
    /// connection.
    held_by: HashMap<ConnId, SessionId>,
    /// Where messages go: local subscriptions and the peers' interests.
    router: Router,
    /// The other cores of this broker, and what waits to cross to them.
    peers: Peers,
    store: Box<dyn RetainedStore>,
    timers: Timers,
    metrics: Metrics,
    shell_stats: ShellStats,
    /// When the core was made: its uptime, and the base of every session's
    /// expiry moment (`moment::Moment`), so never changed.
    started: Instant,
    /// The last instant a packet was stamped at, as a [`Moment`]: the
    /// shell hands every packet of one read the same instant, and the
    /// conversion (a `Timespec` subtraction) cost ~75 instructions per
    /// message when done for each.
    last_stamp: (Instant, Moment),
    wakeups: Vec<ConnId>,
    /// The rate limit every per-client log line goes through.
    log_limit: crate::ratelimit::LogLimiter,
    /// Where a received PUBLISH's plain header is encoded to compare it
    /// with the packet as received (see `Wire::verified`).
    wire_scratch: bytes::BytesMut,
    /// Authentication, ACL and connection limits (see `auth`).
    auth: super::auth::AuthState,
    /// The durable log and the acknowledgements waiting for it (see `durable`).
    durable: super::durable::Durable,
    /// CONNECTs waiting for the input of the connection they take over,
    /// by new connection (see `Broker::input_drained`). At most one per
    /// connection, each for at most `TAKEOVER_DRAIN`.
    takeovers: HashMap<ConnId, super::connect::PendingTakeover>,
    /// The same, by old connection: whose input is drained for which new one.
    draining: HashMap<ConnId, ConnId>,
    /// The change number of the retained message just routed, when it went
    /// to peers: its publisher's acknowledgement waits until they have it.
    ack_fence: Option<(u64, bool)>,
    /// The last retained message routed was over the retained quota: its
    /// publisher (MQTT 5) is answered 0x97.
    retain_refused: bool,
    /// The other shards' figures, for totals (see `Broker::set_other_shards`).
    others: Option<Box<super::observe::ShardFigures>>,
    /// Events for webhooks, recorded only when asked for (see `events`).
    events: super::events::Events,
    /// CONNECTs waiting for the cluster to give this node their client id
    /// (see `claims`).
    claims: super::claims::Claims,
    orphans: super::orphans::Orphans,
    clean_wills: super::orphans::CleanWills,
    /// The cluster node's ownership lease (see `lease`).
    lease: super::lease::Lease,
    /// The cluster-wide order of retained changes (see `retain_order`).
    retain_order: super::retain_order::RetainOrder,
    /// Persistent sessions copied to other nodes, and their copies of
    /// theirs (see `replica`).
    repl: super::replica::Replication,
    /// A node leaving the cluster sends its clients elsewhere (see `drain`).
    drain: super::drain::Drain,
    /// Persistent sessions moving to or from this node while it and the
    /// other end stay up (see `moves`).
    moves: super::moves::Moves,
    /// Sessions taken from away nodes (see `strand`).
    strands: super::strand::Strands,
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

// Construction, connections and packets in: the inputs of a connection's life.
impl Broker {
    /// A broker with in-memory storage, starting at `now`.
    pub fn new(config: Config, now: Instant) -> Self {
        let mut timers = Timers::new(now);
        if config.sys_interval > 0 {
            timers.arm(now, Timer::Sys);
        }
        Broker {
            config,
            conns: ConnTable::default(),
            held_by: HashMap::default(),
            sessions: Sessions::default(),
            router: Router::default(),
            peers: Peers::default(),
            store: Box::new(MemoryStore::default()),
            timers,
            metrics: Metrics::default(),
            shell_stats: ShellStats::default(),
            started: now,
            last_stamp: (now, Moment::new(now, Some(now))),
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
            orphans: Default::default(),
            clean_wills: Default::default(),
            lease: Default::default(),
            retain_order: Default::default(),
            repl: Default::default(),
            drain: Default::default(),
            moves: Default::default(),
            strands: Default::default(),
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A new network connection; it has `connect_timeout` to send CONNECT.
    pub fn connection_opened(&mut self, now: Instant, peer: SocketAddr) -> ConnId {
        let at = self.stamp(now);
        let Some(id) = self.conns.insert(Connection::new(peer, at)) else {
            // 2^32 - 1 connections held: an id that names no connection,
            // so the shell finds this one gone at once and closes it.
            return ConnTable::<Connection>::NO_SLOT;
        };
        self.metrics.connections_opened += 1;
        self.timers.arm(
            now + Duration::from_secs(self.config.connect_timeout),
            Timer::ConnectTimeout(id),
        );
        id
    }

    /// `now` as a [`Moment`] against the core's start, converted once per
    /// instant (see `last_stamp`).
    #[inline]
    fn stamp(&mut self, now: Instant) -> Moment {
        if self.last_stamp.0 != now {
            self.last_stamp = (now, Moment::new(self.started, Some(now)));
        }
        self.last_stamp.1
    }

    /// A decoded packet from a connection.
    pub fn handle_packet(&mut self, now: Instant, conn: ConnId, packet: Packet) {
        if self.repl.reading() {
            self.client_read_gate(conn, Some(&packet));
        }
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
        if self.repl.reading() {
            self.client_read_gate(conn, Some(&packet));
        }
        self.dispatch_packet(now, conn, packet, wire);
        self.end_event();
    }

    fn dispatch_packet(&mut self, now: Instant, conn: ConnId, packet: Packet, wire: Option<Wire>) {
        self.check_lease(now);
        let at = self.stamp(now);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.touch(at);
        let phase = c.phase();
        let sid = match phase {
            Phase::Closing => return,
            Phase::AwaitingTakeover => {
                // The shell holds this input until the takeover is over; a
                // packet handed over anyway completes it first, so that the
                // connection's own packets keep their order.
                self.complete_takeover(now, conn);
                match self.conns.get(&conn).map(|c| c.phase()) {
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
        if self.repl.reading() {
            self.client_read_gate(conn, None);
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if err.reason == ReasonCode::PROTOCOL_ERROR {
            self.metrics.protocol_errors += 1;
        } else {
            self.metrics.malformed_packets += 1;
        }
        let peer = c.peer.addr();
        self.log_bad_input(now, conn, peer, err.what, err.reason);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        match c.phase() {
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
        self.metrics.claims_left_forgotten = self.claims.left_forgotten;
        self.lease.forget(conn);
        self.repl.forget(conn);
        self.conns.remove(&conn);
        self.held_by.remove(&conn);
        self.end_event();
    }

    /// A connection that has not sent its CONNECT yet leaves this core for
    /// the shard that owns its client id (which opens it anew): forget it
    /// without counting it as opened or closed here. Returns its peer
    /// address; `None` (nothing done) once it has a session.
    pub fn connection_moved(&mut self, conn: ConnId) -> Option<SocketAddr> {
        let c = self.conns.get(&conn)?;
        if c.phase() != Phase::AwaitingConnect {
            return None;
        }
        let peer = c.peer.addr();
        self.auth_connection_closed(conn);
        self.conns.remove(&conn);
        self.held_by.remove(&conn);
        self.metrics.connections_opened = self.metrics.connections_opened.saturating_sub(1);
        Some(peer)
    }

    /// The protocol to decode this connection's packets with.
    #[inline]
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
    #[inline]
    pub fn input_state(&self, conn: ConnId) -> InputState {
        match self.conns.get(&conn).map(|c| c.phase()) {
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
                    matches!(c.phase(), Phase::AwaitingTakeover | Phase::AwaitingAuth)
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

    /// The shell parked the connection (its socket waits in the shared
    /// poller, no task runs for it): an empty outbox and session queue
    /// give back their boxes, kept while it ran to save an allocation per
    /// batch.
    pub fn connection_parked(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.outbox.release();
        if let Some(s) = c.session().and_then(|sid| self.sessions.get_mut(sid)) {
            s.release_queue();
        }
    }

    /// True once the broker has decided to close the connection (or it is unknown).
    pub fn is_closing(&self, conn: ConnId) -> bool {
        !matches!(self.conns.get(&conn), Some(c) if c.phase() != Phase::Closing)
    }

    /// True until the connection's CONNECT is accepted: the shell refuses a
    /// first packet of any other type at its first byte (MQTT-3.1.0-1)
    /// instead of waiting for the rest of it.
    pub fn awaits_connect(&self, conn: ConnId) -> bool {
        self.conns
            .get(&conn)
            .is_some_and(|c| c.phase() == Phase::AwaitingConnect)
    }

    /// Whether the shell should not read this connection now: a subscriber
    /// it publishes to is behind, or a shard it publishes to is full
    /// (push-back). A wake-up comes when that ends.
    pub fn held(&self, conn: ConnId) -> bool {
        self.peers.holds(conn)
            || (!self.held_by.is_empty()
                && self
                    .held_by
                    .get(&conn)
                    .is_some_and(|sid| self.sessions.get(*sid).is_some_and(|s| s.conn.is_some())))
    }

    /// Deadlines armed, due or not.
    #[cfg(test)]
    pub(crate) fn timer_entries(&self) -> usize {
        self.timers.len()
    }

    /// Connections marked as held by a subscriber (see `held_by`).
    #[cfg(test)]
    pub(crate) fn held_marks(&self) -> usize {
        self.held_by.len()
    }
}

// CONNECT: login, session attach and takeover, DISCONNECT, detach, wills.
impl Broker {
    /// CONNECT on a fresh connection. When its client id's session still
    /// has an open connection, that connection may have sent more (a
    /// PUBLISH, a DISCONNECT that cancels its will or ends the session)
    /// that the shell has not handed over yet: the CONNECT waits until it
    /// has (`input_drained`, the old connection closing, or
    /// `TAKEOVER_DRAIN`).
    pub(crate) fn on_connect(&mut self, now: Instant, conn: ConnId, connect: Connect) {
        self.handle_connect(now, conn, connect, false);
    }

    /// The open connection of `client_id`'s session, if any.
    fn open_connection_of(&self, client_id: &MqttStr) -> Option<ConnId> {
        if client_id.is_empty() {
            return None;
        }
        let sid = self.sessions.of_client(client_id)?;
        self.sessions.get(sid)?.conn
    }

    fn defer_connect(&mut self, now: Instant, new: ConnId, mut old: ConnId, connect: Connect) {
        if let Some(earlier) = self.draining.get(&old).copied() {
            // A CONNECT already waits for this connection: that one
            // completes now, and this one waits for it instead.
            self.complete_takeover(now, earlier);
            match self.open_connection_of(&connect.client_id) {
                Some(c) => old = c,
                None => return self.handle_connect(now, new, connect, true),
            }
        }
        let Some(c) = self.conns.get_mut(&new) else {
            return;
        };
        c.set_phase(Phase::AwaitingTakeover);
        c.protocol = connect.protocol;
        self.takeovers.insert(
            new,
            PendingTakeover {
                old,
                connect: Box::new(connect),
            },
        );
        self.draining.insert(old, new);
        self.timers.arm(now + TAKEOVER_DRAIN, Timer::Takeover(new));
        // Its shell task reads what its socket holds, then reports back.
        self.wake(old);
    }

    /// Handle the CONNECT that waited for connection `new`'s takeover.
    pub(crate) fn complete_takeover(&mut self, now: Instant, new: ConnId) {
        let Some(p) = self.takeovers.remove(&new) else {
            return;
        };
        self.draining.remove(&p.old);
        match self.conns.get_mut(&new) {
            Some(c) if c.phase() == Phase::AwaitingTakeover => c.set_phase(Phase::AwaitingConnect),
            _ => return,
        }
        self.handle_connect(now, new, *p.connect, true);
        // Its held input may be read now.
        self.wake(new);
    }

    /// The waiting CONNECT of `new` is dropped (its connection closes).
    pub(crate) fn cancel_takeover(&mut self, new: ConnId) {
        if let Some(p) = self.takeovers.remove(&new) {
            self.draining.remove(&p.old);
        }
    }

    /// `waited`: this CONNECT was authenticated and waited for a takeover;
    /// it is not authenticated (counted) again and does not wait again.
    pub(super) fn handle_connect(
        &mut self,
        now: Instant,
        conn: ConnId,
        connect: Connect,
        waited: bool,
    ) {
        let v5 = connect.protocol.is_v5();
        if let Some(c) = self.conns.get_mut(&conn) {
            c.protocol = connect.protocol;
        }

        if v5 && connect.properties.authentication_method.is_some() && !self.scram_done(conn) {
            // Enhanced authentication (SCRAM); this CONNECT comes back when
            // the exchange succeeded (see `scram_auth`).
            if let Err(code) = self.scram_start(now, conn, Box::new(connect)) {
                self.refuse(now, conn, code);
            }
            return;
        }
        if !waited {
            let login = self.authenticate(
                now,
                conn,
                connect.username.as_deref(),
                connect.password.as_deref(),
                &connect.client_id,
            );
            match login {
                Ok(()) => {}
                Err(Refusal::Code(code)) => {
                    if self.events.on() {
                        self.events.auth_failed(
                            &connect.client_id,
                            connect.username.as_deref(),
                            code.0,
                        );
                    }
                    self.refuse(now, conn, code);
                    return;
                }
                Err(Refusal::AskHttp(key, body)) => {
                    self.wait_for_http(conn, Box::new(connect), key, body);
                    return;
                }
            }
        }
        if self.drain.active() {
            self.refuse_draining(now, conn);
            return;
        }
        if self.claims.must_claim(conn, &connect) {
            if self.lease.lost() {
                // Cut off from the majority: no claim could be granted.
                self.metrics.claims_refused += 1;
                self.refuse(now, conn, ReasonCode::SERVER_UNAVAILABLE);
                return;
            }
            // In a cluster, the client id must be this node's first.
            if let Some(c) = self.conns.get_mut(&conn) {
                c.set_phase(Phase::AwaitingAuth);
            }
            self.claims.ask(conn, Box::new(connect));
            return;
        }
        let Connect {
            protocol,
            clean_start,
            keep_alive,
            properties,
            client_id,
            will,
            username,
            password,
            bridge,
        } = connect;
        if let Some(w) = &will {
            if zerofan_codec::topic::validate_topic_name(&w.topic).is_err() {
                self.refuse(now, conn, ReasonCode::TOPIC_NAME_INVALID);
                return;
            }
            if w.retain && !self.config.retain_available {
                self.refuse(now, conn, ReasonCode::RETAIN_NOT_SUPPORTED);
                return;
            }
        }

        let mut assigned = None;
        let client_id = if client_id.is_empty() {
            if !v5 && !clean_start {
                // 3.1.1: a zero-byte ClientId needs CleanSession=1 (MQTT-3.1.3-8).
                self.refuse(now, conn, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
                return;
            }
            let id = self.assign_client_id();
            assigned = Some(id.clone());
            id
        } else {
            // Copied where it is kept (a new session, a CONNECT that waits
            // for a takeover): it may be the CONNECT's buffer.
            client_id
        };

        let mut keep = keep_alive;
        let mut server_keep_alive = None;
        let max_ka = self.config.max_keepalive;
        if v5 && (keep > max_ka || (keep == 0 && max_ka < u16::MAX)) {
            keep = max_ka;
            server_keep_alive = Some(max_ka);
        }

        let requested_expiry = if v5 {
            properties.session_expiry_interval.unwrap_or(0)
        } else if clean_start {
            0
        } else {
            u32::MAX
        };
        let expiry = requested_expiry.min(self.config.max_session_expiry);

        if !waited {
            if let Some(old) = self.open_connection_of(&client_id) {
                let connect = Connect {
                    protocol,
                    clean_start,
                    keep_alive,
                    properties,
                    // It waits (up to `TAKEOVER_DRAIN`): its own bytes, not
                    // the CONNECT's buffer.
                    client_id: copy_str(&client_id),
                    will,
                    username,
                    password,
                    bridge,
                };
                self.defer_connect(now, conn, old, connect);
                return;
            }
        }
        // Takeover: the old connection is closed with 0x8E (MQTT-3.1.4-3).
        if let Some(old) = self
            .sessions
            .of_client(&client_id)
            .and_then(|sid| self.sessions.get(sid))
            .and_then(|s| s.conn)
        {
            self.metrics.takeovers += 1;
            if !clean_start {
                if let Some(s) = self
                    .sessions
                    .of_client(&client_id)
                    .and_then(|sid| self.sessions.get_mut(sid))
                {
                    s.resuming = true;
                }
            }
            self.close(now, old, Some(ReasonCode::SESSION_TAKEN_OVER), true);
            if let Some(s) = self
                .sessions
                .of_client(&client_id)
                .and_then(|sid| self.sessions.get_mut(sid))
            {
                s.resuming = false;
            }
        }

        let existing = self.sessions.of_client(&client_id);
        if clean_start {
            if let Some(sid) = existing {
                self.end_session(now, sid);
            }
        }
        let resumed = if clean_start { None } else { existing };
        let sid = match resumed {
            Some(sid) => sid,
            None => {
                let id = client_id.as_str().into();
                match self.sessions.insert(Session::new(id, protocol)) {
                    Some(sid) => sid,
                    None => {
                        // 2^32 - 1 sessions held.
                        self.refuse(now, conn, ReasonCode::SERVER_UNAVAILABLE);
                        return;
                    }
                }
            }
        };
        let session_present = resumed.is_some();
        if let Some(s) = self.sessions.get_mut(sid) {
            s.conn = Some(conn);
            s.protocol = protocol;
            s.expiry_interval = expiry;
            s.set_expires_at(self.started, None);
            // Reconnecting before the will delay passed cancels the will
            // (MQTT-3.1.3-9). One due already is published: the copy of a
            // dead node's session, whose connection was lost with its node
            // (see `restore`), its delay 0 or over.
            let pending = s.take_pending_will();
            self.dur_connected(sid, pending.is_some());
            if let Some(w) = pending.filter(|w| w.at <= now) {
                self.publish_will(now, w.will);
            }
        }

        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.set_phase(Phase::Connected(sid));
        c.keep_alive = keep;
        c.bridge = bridge;
        if v5 {
            c.max_packet_out = properties.maximum_packet_size.unwrap_or(u32::MAX);
            c.send_window = properties
                .receive_maximum
                .unwrap_or(u16::MAX)
                .min(self.config.max_inflight);
            c.alias_max_out = properties.topic_alias_maximum.unwrap_or(0);
            c.problem_info = properties.request_problem_information != Some(0);
        } else {
            c.send_window = self.config.max_inflight;
        }
        c.will = will.map(|w| Box::new(own_will(w)));
        self.dur_will_armed(sid);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if let Some(at) = c.keep_alive_deadline(self.started) {
            // Keep alive's own entry, re-armed only when it fires; the
            // connect timeout's ends once connected (see `handle_timeout`).
            // Both re-arming would keep two entries a connection forever.
            self.timers.arm(at, Timer::KeepAlive(conn));
        }
        self.metrics.clients_connected_total += 1;
        if let Some(s) = self.sessions.get(sid).filter(|_| self.events.on()) {
            let user = self
                .conns
                .get(&conn)
                .and_then(|c| c.sec.username.as_deref());
            self.events.connected(&s.client_id, user, session_present);
        }
        self.auth_attach(conn, sid);
        let client_id = self.sessions.get(sid).map_or("", |s| &*s.client_id);
        tracing::debug!(%conn, client_id, ?protocol, session_present, "connected");

        let mut props = Properties::default();
        if v5 {
            let cfg = &self.config;
            if cfg.receive_maximum != u16::MAX {
                props.receive_maximum = Some(cfg.receive_maximum);
            }
            if cfg.max_packet_size < 268_435_455 {
                props.maximum_packet_size = Some(cfg.max_packet_size);
            }
            if cfg.topic_alias_maximum > 0 {
                props.topic_alias_maximum = Some(cfg.topic_alias_maximum);
            }
            if !cfg.retain_available {
                props.retain_available = Some(0);
            }
            if expiry != requested_expiry {
                props.session_expiry_interval = Some(expiry);
            }
            props.server_keep_alive = server_keep_alive;
            props.assigned_client_identifier = assigned;
            if let Some((m, d)) = self.scram_connack(conn) {
                props.authentication_method = Some(m);
                props.authentication_data = Some(d);
            }
        }
        self.send(
            conn,
            Packet::ConnAck(ConnAck {
                session_present,
                reason: ReasonCode::SUCCESS,
                properties: props.into(),
            }),
        );
        if session_present {
            self.redeliver(conn, sid);
        }
        self.wake(conn);
    }

    /// CONNACK with a failure code, then close.
    pub(super) fn refuse(&mut self, now: Instant, conn: ConnId, reason: ReasonCode) {
        let mut properties = Properties::default();
        if let Some(c) = self.conns.get(&conn).filter(|c| c.protocol.is_v5()) {
            properties.reason_string = c
                .sec
                .ext()
                .refuse_reason
                .and_then(|r| MqttStr::try_from(r).ok());
        }
        self.refuse_with(now, conn, reason, properties);
    }

    /// CONNACK with a failure code and `properties`, then close.
    fn refuse_with(
        &mut self,
        now: Instant,
        conn: ConnId,
        reason: ReasonCode,
        properties: Properties,
    ) {
        self.send(
            conn,
            Packet::ConnAck(ConnAck {
                session_present: false,
                reason,
                properties: properties.into(),
            }),
        );
        self.close(now, conn, None, false);
    }

    /// A client identifier nobody uses.
    fn assign_client_id(&mut self) -> MqttStr {
        loop {
            let id = MqttStr::try_from(random_client_id()).unwrap_or_default();
            if !id.is_empty() && !self.sessions.has_client(&id) {
                return id;
            }
        }
    }

    /// Resend what was in flight when the last connection dropped, in the
    /// original order (MQTT-4.4.0-1): PUBREL at once, PUBLISH with DUP as
    /// the client's Receive Maximum allows (see `fill_batch`).
    fn redeliver(&mut self, conn: ConnId, sid: SessionId) {
        let (Some(s), Some(c)) = (self.sessions.get_mut(sid), self.conns.get_mut(&conn)) else {
            return;
        };
        let mut flying: Vec<(u64, u16, InflightState)> = s
            .flight()
            .inflight
            .iter()
            .map(|(pid, f)| (f.seq, *pid, f.state))
            .collect();
        flying.sort_unstable_by_key(|(seq, _, _)| *seq);
        if let Some(f) = s.flight_any() {
            f.resend.clear();
        }
        for (_, pid, state) in flying {
            match state {
                InflightState::AwaitingAck => s.flight_mut().resend.push_back(pid),
                InflightState::AwaitingComp => {
                    c.outbox
                        .push_back(Outgoing::from_packet(Packet::PubRel(zerofan_codec::Ack {
                            packet_id: pid,
                            ..Default::default()
                        })))
                }
            }
        }
        self.wake(conn);
    }

    /// DISCONNECT from the client.
    pub(crate) fn on_disconnect(
        &mut self,
        now: Instant,
        conn: ConnId,
        sid: SessionId,
        d: Disconnect,
    ) {
        if let Some(requested) = d.properties.session_expiry_interval {
            let current = self.sessions.get(sid).map_or(0, |s| s.expiry_interval);
            if current == 0 && requested != 0 {
                // MQTT-3.14.2-2.
                self.protocol_error(
                    now,
                    conn,
                    "session expiry set on DISCONNECT after 0 in CONNECT",
                );
                return;
            }
            let capped = requested.min(self.config.max_session_expiry);
            if let Some(s) = self.sessions.get_mut(sid) {
                s.expiry_interval = capped;
            }
        }
        // A normal DISCONNECT discards the will; 0x04 asks for it (MQTT-3.14.4-3).
        let with_will = d.reason == ReasonCode::DISCONNECT_WITH_WILL;
        self.close(now, conn, None, with_will);
    }

    /// The connection of `sid` is gone: schedule or publish its will, keep
    /// the session for its expiry interval or end it now.
    pub(crate) fn detach(&mut self, now: Instant, sid: SessionId, will: Option<(Box<Will>, u32)>) {
        self.caught_up(sid);
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        s.conn = None;
        let expiry = s.expiry_interval;
        // A resuming takeover re-attaches the session at once: it is never
        // offline, and its queue stays whole.
        let offline = expiry > 0 && !std::mem::take(&mut s.resuming);
        if offline {
            // The offline bounds hold from now on, for what is queued too.
            let cfg = &self.config;
            let (qos0, other) = s.trim_offline(
                cfg.max_queued_messages,
                cfg.max_queued_bytes,
                cfg.queue_full,
            );
            self.metrics.dropped_qos0_queue_full += qos0;
            self.metrics.dropped_queue_full += other;
            if other > 0 {
                self.dur_evicted(sid);
            }
        }
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        if offline {
            // What waits for an absent client may wait long: small messages
            // get their own bytes instead of pinning publishers' buffers.
            self.metrics.compactions += s.compact();
        }
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        s.release_queue();
        let shares: Vec<Box<str>> = s
            .subscriptions
            .keys()
            .filter(|f| f.starts_with("$share/"))
            .cloned()
            .collect();
        for share in shares {
            self.hand_over_shared(now, sid, &share, true);
        }
        if let Some((will, delay)) = will {
            let delay = super::message::will_wait(delay, expiry);
            if delay == 0 {
                self.publish_will(now, *will);
            } else if let Some(at) = later(now, delay) {
                if let Some(s) = self.sessions.get_mut(sid) {
                    s.set_pending_will(Box::new(PendingWill { will: *will, at }));
                }
                self.timers.arm(at, Timer::Will(sid));
            }
        }
        if expiry == 0 {
            self.end_session(now, sid);
        } else if let Some(at) = later(now, expiry).filter(|_| expiry != u32::MAX) {
            if let Some(s) = self.sessions.get_mut(sid) {
                s.set_expires_at(self.started, Some(at));
            }
            self.timers.arm(at, Timer::SessionExpiry(sid));
        }
        if expiry > 0 {
            self.dur_detached(sid);
        }
    }

    /// Remove a session for good: subscriptions out of the trie, shared
    /// messages handed to other members, a pending will published.
    pub(crate) fn end_session(&mut self, now: Instant, sid: SessionId) {
        if let Some(conn) = self.sessions.get(sid).and_then(|s| s.conn) {
            // Only reached for clean-start replacement after a takeover, where
            // the old connection is already closing; make sure it is detached.
            if let Some(c) = self.conns.get_mut(&conn) {
                c.set_phase(Phase::Closing);
            }
        }
        let filters: Vec<Box<str>> = self
            .sessions
            .get(sid)
            .map(|s| s.subscriptions.keys().cloned().collect())
            .unwrap_or_default();
        for filter in &filters {
            if filter.starts_with("$share/") {
                self.hand_over_shared(now, sid, filter, false);
            }
            self.trie_remove(filter, sid);
        }
        self.auth_forget(sid);
        self.caught_up(sid);
        let Some(mut s) = self.sessions.remove(sid) else {
            return;
        };
        self.strands.ended(&s.client_id);
        self.dur_session_ended(&s.client_id, s.stored);
        if !s.stored {
            self.clean_will_ended(&s.client_id);
        }
        if let Some(w) = s.take_pending_will() {
            self.publish_will(now, w.will);
        }
    }

    /// Publish a will message.
    pub(crate) fn publish_will(&mut self, now: Instant, will: Will) {
        self.metrics.wills_published += 1;
        let mut properties = will.properties;
        if let Some(p) = properties.get_mut() {
            p.will_delay_interval = None;
        }
        let publish = Publish {
            dup: false,
            qos: will.qos,
            retain: will.retain,
            topic: will.topic,
            packet_id: 0,
            properties,
            payload: will.payload,
        };
        let msg = Rc::new(Message::from_publish(publish, None, now));
        self.route(now, msg);
    }
}

// Client ids in a cluster: a CONNECT waits for its claim.
impl Broker {
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

    /// Whether [`Broker::take_claims`] or [`Broker::take_orphans`] has
    /// something.
    pub fn has_claims(&self) -> bool {
        self.claims.has_requests() || self.orphans.has_requests()
    }

    /// Copies of an away node's sessions whose wills this node would
    /// publish, should the cluster give it their client ids (see
    /// `orphans`): the shell claims each with `Cluster::claim_orphan`
    /// while [`Broker::orphan_pending`], and answers
    /// [`Broker::orphan_claimed`] or [`Broker::orphan_given_up`].
    pub fn take_orphans(&mut self, out: &mut Vec<super::OrphanRequest>) {
        self.orphans.take_requests(out);
    }

    /// Whether `client`'s claim from `owner` is still worth trying:
    /// `owner` is away and the copy here is still its, with a will.
    pub fn orphan_pending(&self, client: &str, owner: PeerId) -> bool {
        if self.serves(client) {
            return false;
        }
        self.orphans.captured(client, owner)
            || (self.peers.is_away(owner) && self.repl.images.holds_will_of(client, owner))
    }

    /// `peer` restarted: a new run of it links here, and nothing that run
    /// sent is applied yet. The connections of its former run are gone,
    /// and so the wills armed in its copies here were never published; its
    /// new run does not know them (its store keeps no armed will). Each is
    /// claimed (see [`Broker::take_orphans`]) on condition that `peer`
    /// still holds the id under the claim the copy was written under: a
    /// client back on its new run, or anywhere, has a newer one. A node
    /// restarted before a copy holder's claim for its death was granted
    /// (its lease still ran) left such wills unpublished before.
    pub fn peer_restarted(&mut self, peer: PeerId) {
        if !self.repl.on() {
            return;
        }
        self.repl.parts.forget(peer);
        self.metrics.replica_parts_dropped += self.repl.parts.take_dropped();
        let wills = self.repl.images.armed_wills_of(peer);
        if !wills.is_empty() {
            tracing::info!(
                ?peer,
                wills = wills.len(),
                "a node restarted: claiming the wills armed for its former connections"
            );
        }
        self.orphans.restarted(peer, wills);
    }

    /// The cluster gave this node `client`, an orphan, under `epoch`
    /// (`prev`: the owner before): its copy here becomes an offline
    /// session of this node's, whose will is due after its delay.
    ///
    /// The next claim of the id may have committed right after this one,
    /// and its owner's image reached this node before this answer (the
    /// client came back elsewhere at once). That copy is the next owner's,
    /// left as it is; the next owner was told this node held the id, and
    /// publishes nothing. The will this claim was for is the one captured
    /// when it was asked for: published if due at the loss, whatever the
    /// copy became, or if the leader's fence said the client came back
    /// with a clean start (that ends the session, MQTT-3.1.3-9). One with
    /// a delay otherwise is not: the client's return cancelled it.
    pub fn orphan_claimed(
        &mut self,
        now: Instant,
        client: &str,
        epoch: u64,
        prev: Option<super::PreviousOwner>,
    ) {
        // The copy's armed will as it was when asked for: a restarted
        // owner's new run, or the next owner, may have written over it
        // since (or the copy gone).
        let captured = self.orphans.take_captured(client);
        let lost_at = self.orphans.take_lost_at(client);
        let clean_back = self.orphans.came_back_clean(client);
        self.orphans.answered(client);
        // The next owner's copy. (This node's own later claim, answered
        // first, names the dead owner as the one before, whose lease ran
        // out: that claim published the copy's will, see
        // `PreviousOwner::lapsed`, and the session served here makes the
        // adoption below a no-op.)
        if self
            .repl
            .images
            .owner_of(client)
            .is_some_and(|(_, e)| e > epoch)
        {
            let will = captured
                .filter(|c| c.due || clean_back)
                .map(|c| will_from_stored(&c.will, &self.durable));
            if self.publish_copy_will(now, will) {
                self.metrics.orphans_adopted += 1;
                tracing::info!(
                    client_id = client,
                    epoch,
                    "published an orphan's will; the next owner's copy came first"
                );
            }
            self.end_event();
            return;
        }
        if let Some(prev) = prev {
            self.refuse_stale_copy(client, &prev);
        }
        if let Some(will) = captured.filter(|c| c.restarted()).map(|c| c.will) {
            let kept = self.with_copies(|im, d| im.rearm(client, will.clone(), d));
            if !kept {
                self.replica_epoch(client, epoch);
                if self.publish_copy_will(now, Some(will_from_stored(&will, &self.durable))) {
                    self.metrics.orphans_adopted += 1;
                }
                self.end_event();
                return;
            }
        }
        if self.repl.images.is_clean(client) {
            self.clean_orphan_claimed(now, client, epoch);
            return;
        }
        self.orphan_lost_at(client, lost_at);
        if self.adopt_replica_at(now, client, epoch) {
            self.metrics.orphans_adopted += 1;
            tracing::info!(
                client_id = client,
                epoch,
                "adopted a session of a node away or restarted to publish its client's will"
            );
        } else {
            self.end_event();
        }
    }

    /// The copy of `client` is adopted for its will, its owner's link down
    /// here since `lost_at`: the connection its will is armed for was
    /// lost then, and its delay counts from then (MQTT-3.1.3-9), not from
    /// the adoption, which waited for the owner's lease. A clean session's
    /// copy is left as it is: its will is due at once whenever it was lost.
    fn orphan_lost_at(&mut self, client: &str, lost_at: Option<Instant>) {
        if self.repl.images.is_clean(client) {
            return;
        }
        if let Some(at) = lost_at {
            let ms = self.durable.unix_ms(at);
            self.with_copies(|im, d| im.will_lost_at(client, ms, d));
        }
    }

    /// [`Broker::orphan_claimed`] of the copy of a clean session: its
    /// client's connection was lost with its node, and its session with
    /// it (expiry 0), so the will is published now. Nothing is served
    /// here; the other copies go.
    fn clean_orphan_claimed(&mut self, now: Instant, client: &str, epoch: u64) {
        self.replica_epoch(client, epoch);
        let will = self
            .repl
            .images
            .will_of(client)
            .map(|w| will_from_stored(w, &self.durable));
        self.with_copies(|im, d| im.forget(client, d));
        if self.publish_copy_will(now, will) {
            self.metrics.orphans_adopted += 1;
            tracing::info!(
                client_id = client,
                epoch,
                "published the will of a clean session of a node away or restarted"
            );
        }
        self.drop_copies(client, Some(epoch), Vec::new());
        self.repl.keep_epoch_if_claimed(client);
        self.end_event();
    }

    /// Publish the will a copy held (`None`: none; `Some(None)`: its
    /// record could not be read, counted). True when published.
    fn publish_copy_will(&mut self, now: Instant, will: Option<Option<Will>>) -> bool {
        match will {
            Some(Some(w)) => {
                self.publish_will(now, w);
                true
            }
            Some(None) => {
                self.metrics.store_restore_skipped += 1;
                false
            }
            None => false,
        }
    }

    /// `client`'s orphan claim ended without it (moved on, owner back).
    pub fn orphan_given_up(&mut self, client: &str) {
        self.orphans.answered(client);
    }

    /// The cluster's answer to `conn`'s claim: its CONNECT goes on, or,
    /// when the cluster could not agree (no majority reachable), is refused
    /// with 0x88 Server unavailable (3.1.1: return code 3).
    pub fn claim_answered(&mut self, now: Instant, conn: ConnId, granted: bool) {
        self.claim_answered_at(now, conn, granted, 0);
    }

    /// [`Broker::claim_answered`], with the epoch of the granted claim (0:
    /// not known), which fences this node's replicated changes of it.
    pub fn claim_answered_at(&mut self, now: Instant, conn: ConnId, granted: bool, epoch: u64) {
        self.claim_answered_from(now, conn, granted, epoch, None);
    }

    /// [`Broker::claim_answered_at`], with the owner before this claim as
    /// the cluster's log had it (see `replica/previous.rs`): an image kept
    /// here that this owner did not write under that epoch is stale.
    pub fn claim_answered_from(
        &mut self,
        now: Instant,
        conn: ConnId,
        granted: bool,
        epoch: u64,
        prev: Option<super::PreviousOwner>,
    ) {
        // The handover and the asks for a copy are spent (see
        // `Broker::wants_copy`).
        let lapsed = prev.is_some_and(|p| p.lapsed);
        if let Some(client) = self.claims.wants_copies(conn, lapsed).map(Box::<str>::from) {
            self.claims.settle_handover(&client);
            self.repl.images.claim_answered(&client);
        }
        let client: Option<Box<str>> = self.claims.resumes(conn).map(Into::into);
        if let Some(client) = &client {
            // Its client is back before the relay to its new owner ended:
            // the session here is that owner's now (its handover awaited).
            if let Some(sid) = self.moves.leaving_of(client) {
                self.leave_over(now, sid, false);
            }
        }
        if let (true, Some(prev), Some(client)) = (granted, prev, client) {
            self.refuse_stale_copy(&client, &prev);
        }
        let Some(connect) = self.claims.answered(conn, granted) else {
            if let Some(client) = self.claims.left(conn) {
                if granted {
                    self.serve_left(now, &client, epoch, prev);
                }
            }
            return;
        };
        match self.conns.get_mut(&conn) {
            Some(c) if c.phase() == Phase::AwaitingAuth => c.set_phase(Phase::AwaitingConnect),
            // Closed while it waited (a timeout, a takeover of its own).
            _ => {
                if granted {
                    self.serve_left(now, connect.client_id.as_str(), epoch, prev);
                }
                return;
            }
        }
        if granted {
            self.fenced_client_back(now, &connect, prev);
            self.lease.claimed(conn);
            self.replica_epoch(connect.client_id.as_str(), epoch);
            // An image kept here becomes the session; the replicas get it.
            let had = self.install_replica(now, &connect, prev);
            let client = connect.client_id.clone();
            let resumed = !connect.clean_start;
            self.handle_connect(now, conn, *connect, true);
            self.claimed(&client);
            self.arrive(now, client.as_str(), resumed, had);
        } else {
            self.metrics.claims_refused += 1;
            self.refuse(now, conn, ReasonCode::SERVER_UNAVAILABLE);
        }
        self.wake(conn);
        self.end_event();
    }

    /// Whether `conn`'s granted claim, which resumes a session that `prev`
    /// owned, should wait before [`Broker::claim_answered_from`] for
    /// `prev` to hand it over (see [`Broker::client_taken_by`]): `prev` is
    /// a linked node that is not away and has not said so yet. Also with a
    /// current copy here: the changes `prev` made last (a message it
    /// queued for the session, acknowledged once this node answers) may
    /// still be on their way, ahead of the mark on the same link, and a
    /// copy taken before them would lack them. The shell waits a bounded
    /// time, woken by [`Broker::take_handover_news`]. So does a claim
    /// that starts clean after an owner that let go by its lease: the
    /// will of the session it ends is this node's to publish, from a
    /// current copy (see [`Broker::install_replica`]).
    pub fn awaits_handover(&self, conn: ConnId, prev: &super::PreviousOwner) -> bool {
        let Some(client) = self.claims.wants_copies(conn, prev.lapsed) else {
            return false;
        };
        let Some(peer) = prev.peer else {
            return false;
        };
        self.repl.on()
            && !self.serves(client)
            && self.peers.me() != Some(peer)
            && self.peers.is_live(peer)
            && !self.claims.was_handed(client)
    }

    /// Whether `conn`'s granted claim, which resumes a session that `prev`
    /// owned, needs another node's copy once the handover wait is over
    /// (`prev` away, dead, or silent): the shell then asks the other nodes
    /// ([`Broker::ask_for_copy`]) and waits, while this is true, a bounded
    /// time, woken by [`Broker::take_handover_news`]. Asked when no copy
    /// here was written under `prev`'s epoch (a node outside the dead
    /// owner's replica set would otherwise serve a clean session while the
    /// replicas hold the copy), and when the one here was, for a newer one
    /// (`prev`, cut off from this node only, may have gone on with the
    /// others: see `replica::previous`); not when the version of the one
    /// here is not known (read back from disk). A claim that starts clean
    /// (after an owner that let go by its lease, for the will of the
    /// session it ends) asks only when no copy here is current. Once
    /// asked, true until a copy came or every node asked answered.
    pub fn wants_copy(&self, conn: ConnId, prev: &super::PreviousOwner) -> bool {
        let Some(client) = self.claims.wants_copies(conn, prev.lapsed) else {
            return false;
        };
        if !self.repl.on() || self.serves(client) || prev.epoch == 0 || !self.peers.any() {
            return false;
        }
        // The old owner said it handed over what it had (maybe nothing: a
        // clean session there), or a node sent its copy.
        if self.claims.was_handed(client) {
            return false;
        }
        if let Some(waiting) = self.claims.copy_asked(client) {
            return waiting;
        }
        let current = self.repl.images.is_current(client, prev) == Some(true);
        if self.claims.starts_clean(conn) {
            // Only for the will of the session it ends: any copy under
            // `prev`'s epoch has it.
            return !current;
        }
        !current || self.repl.images.version(client) > 0
    }

    /// Ask every reachable node but `prev` (the owner, which keeps no copy
    /// of its own session) for a copy of `conn`'s session written under
    /// `prev`'s epoch, newer than a current one here (see
    /// [`Broker::wants_copy`]).
    pub fn ask_for_copy(&mut self, conn: ConnId, prev: &super::PreviousOwner) {
        let Some(client) = self
            .claims
            .wants_copies(conn, prev.lapsed)
            .map(Box::<str>::from)
        else {
            return;
        };
        self.metrics.copies_asked += 1;
        let have = if self.repl.images.is_current(&client, prev) == Some(true) {
            self.repl.images.version(&client)
        } else {
            0
        };
        if prev.peer.is_some() {
            self.repl.images.asked_for_copy(&client, *prev);
        }
        let mut peers = self.peers.reachable();
        peers.retain(|p| Some(*p) != prev.peer);
        for &p in &peers {
            self.peers.send(
                p,
                PeerEvent::CopyWanted {
                    client: client.clone(),
                    epoch: prev.epoch,
                    have,
                },
            );
        }
        self.claims.asked_copy(&client, peers);
    }

    /// `from` asks for the copy of `client` written under `epoch`, newer
    /// than its own at version `have`: sent when kept here, then the
    /// handover mark; `NoCopy` otherwise.
    fn offer_copy(&mut self, from: PeerId, client: &str, epoch: u64, have: u64) {
        if epoch > 0 {
            self.repl.images.superseded(client, epoch);
        }
        let ops = self.repl.images.copy_ops(client, epoch, have);
        tracing::debug!(
            client,
            ?from,
            epoch,
            have,
            version = self.repl.images.version(client),
            sent = ops.is_some(),
            "copy asked for"
        );
        let Some(ops) = ops else {
            self.peers.send(
                from,
                PeerEvent::NoCopy {
                    client: client.into(),
                },
            );
            return;
        };
        self.metrics.copies_sent += 1;
        self.flush_replication();
        self.send_replicated(&[from], ops);
        self.peers.send(
            from,
            PeerEvent::Handover {
                client: client.into(),
            },
        );
    }

    /// Whether a handover arrived since the last call (see
    /// [`Broker::awaits_handover`]).
    pub fn take_handover_news(&mut self) -> bool {
        self.claims.take_handed_new()
    }

    /// Whether the session of `client` lives here: a reconnect to its
    /// owner, whose claim names as the previous owner the node before this
    /// one's own run of claims, which has nothing newer to give.
    fn serves(&self, client: &str) -> bool {
        // One that moved away and is only relayed from here is not.
        self.sessions.has_client(client) && self.moves.leaving_of(client).is_none()
    }

    /// Whether this node relays `client`'s session to its new owner
    /// (tests).
    #[cfg(test)]
    pub(crate) fn moves_leaving(&self, client: &str) -> bool {
        self.moves.leaving_of(client).is_some()
    }

    /// The packet ids in flight in this node's copy of `client`'s
    /// session, with their phase (tests).
    #[cfg(test)]
    pub(crate) fn copy_inflight(
        &self,
        client: &str,
    ) -> Option<Vec<(u16, zerofan_store::InflightPhase)>> {
        self.repl.images.inflight_phases(client)
    }

    /// Whether `client`'s session lives here (tests).
    #[cfg(test)]
    pub(crate) fn serves_client(&self, client: &str) -> bool {
        self.sessions.has_client(client)
    }

    /// The node whose copy of `client` is kept here, and the claim it was
    /// last written under (tests).
    #[cfg(test)]
    pub(crate) fn copy_owner(&self, client: &str) -> Option<(PeerId, u64)> {
        self.repl.images.owner_of(client)
    }

    /// Whether a copy of `client`'s session is kept here for another node.
    pub fn has_copy(&self, client: &str) -> bool {
        self.repl.images.has(client)
    }

    /// Drop the copy of `client` kept here unless `prev` wrote it under
    /// its epoch. Refused rather than served: an old session given
    /// silently loses or repeats what the client saw acknowledged since; a
    /// clean one says so (session present 0). The shell has asked the
    /// other nodes for a current copy first (see [`Broker::wants_copy`]).
    fn refuse_stale_copy(&mut self, client: &str, prev: &super::PreviousOwner) {
        if self.with_copies(|im, d| im.refuse_stale(client, prev, d)) {
            self.metrics.stale_copies_refused += 1;
            tracing::warn!(client_id = %client, prev_epoch = prev.epoch,
                "session copy here is older than the previous owner's: starting clean");
        }
    }

    /// `f` on the copies kept here, writing through this node's store; the
    /// store errors it met are counted.
    fn with_copies<R>(
        &mut self,
        f: impl FnOnce(&mut super::replica::Images, &mut super::replica::Disk<'_>) -> R,
    ) -> R {
        let mut disk = super::replica::Disk::new(&mut self.durable);
        let r = f(&mut self.repl.images, &mut disk);
        self.metrics.store_errors += disk.errors;
        r
    }

    /// `client`'s claim, which the shell answered as refused for want of
    /// time (its CONNECT got 0x88), was granted after all, under `epoch`
    /// (`prev`: the owner before): served as one whose client left.
    pub fn claim_granted_late(
        &mut self,
        now: Instant,
        client: &str,
        epoch: u64,
        prev: Option<super::PreviousOwner>,
    ) {
        self.serve_left(now, client, epoch, prev);
    }

    /// `client` was granted here, but its client left before the answer.
    /// The claim moved the id all the same (its old owner ended the
    /// session), so the copy kept here, if current, becomes the session,
    /// offline, as a drained node's do (see [`Broker::adopt_replica_at`]):
    /// the next claim, on any node, finds this node's copy under this
    /// epoch rather than none (the copies before it would look stale).
    /// A CONNECT that never completed leaves its session as it was, so a
    /// clean-start one is served the same way.
    fn serve_left(
        &mut self,
        now: Instant,
        client: &str,
        epoch: u64,
        prev: Option<super::PreviousOwner>,
    ) {
        self.metrics.claims_left += 1;
        if let Some(prev) = prev {
            self.refuse_stale_copy(client, &prev);
        }
        self.replica_epoch(client, epoch);
        let Ok(id) = MqttStr::try_from(client) else {
            self.end_event();
            return;
        };
        if self.sessions.has_client(&id) {
            // Served here already: its replicas learn this claim's epoch,
            // which the next claim will name.
            self.claimed(&id);
            self.end_event();
        } else if !self.adopt_replica_at(now, client, epoch) {
            // No copy here; what the stale check dropped is committed.
            self.end_event();
        }
    }

    /// In a cluster: this node's id and the wall clock at `now` (Unix ms),
    /// which order retained changes cluster-wide (see `retain_order`).
    pub fn set_node_id(&mut self, node: u64, now: Instant, unix_ms: u64) {
        self.retain_order.set_node(node, now, unix_ms);
        self.strands.set_node(node);
    }

    /// In a cluster: this node's ownership lease ran out (`held` false) or
    /// was renewed. Losing it drops every connection whose client id was
    /// claimed (see `lease`); CONNECTs are refused until it is back.
    pub fn cluster_lease(&mut self, now: Instant, held: bool) {
        let was_lost = self.lease.lost();
        let conns = self.lease.set(held);
        self.fence_clients(now, conns);
        if held && was_lost {
            self.fenced_clean_wills_expire();
            // Whether each fenced will is still this node's to publish.
            if let Some(me) = self.peers.me() {
                self.orphans.confirm_fenced(me);
            }
        }
    }

    /// The lease is back: the copies of fenced clean clients' wills that
    /// this node cannot settle (no claim known to ask under) go.
    fn fenced_clean_wills_expire(&mut self) {
        let gone: Vec<Box<str>> = self
            .clean_wills
            .iter()
            .filter(|(c, _)| !self.sessions.has_client(c) && !self.orphans.is_fenced(c))
            .map(|(c, _)| c.into())
            .collect();
        for client in gone {
            self.clean_will_ended(&client);
        }
        self.end_event();
    }

    /// Whether `client`'s fenced will waits for the cluster's answer (see
    /// [`Orphaned::Fenced`]): the lease is held and it is not settled.
    ///
    /// [`Orphaned::Fenced`]: super::Orphaned::Fenced
    pub fn fenced_pending(&self, client: &str) -> bool {
        !self.lease.lost() && self.orphans.is_fenced(client)
    }

    /// The cluster's answer for `client`'s fenced will: `Some(epoch)`, the
    /// id was still this node's under the claim it was fenced under, and
    /// is now under `epoch`: the will is published when due (its delay
    /// counted from the fence, and the session's end); `None`, another
    /// node took the id meanwhile, which decided (`PreviousOwner::lapsed`).
    pub fn fenced_will_answered(&mut self, now: Instant, client: &str, epoch: Option<u64>) {
        self.orphans.answered(client);
        let Some((f, clean)) = self.take_fenced_will(client) else {
            return;
        };
        let Some(epoch) = epoch else {
            self.end_event();
            return;
        };
        self.replica_epoch(client, epoch);
        if clean {
            self.drop_copies(client, Some(epoch), Vec::new());
        }
        let sid = self
            .sessions
            .of_client(client)
            .filter(|&sid| self.sessions.get(sid).is_some_and(|s| s.conn.is_none()));
        self.settle_fenced_will(now, sid, f);
        self.end_event();
    }

    /// `connect`'s client is back here, granted anew, while its fenced will
    /// waited for the cluster's answer. With no other owner in between
    /// (`prev` none), the connection it was armed for was this node's, and
    /// its will is settled as any lost connection's: published if due (a
    /// clean start or a clean session ends the session), a delay still
    /// running cancelled by the return.
    fn fenced_client_back(
        &mut self,
        now: Instant,
        connect: &zerofan_codec::Connect,
        prev: Option<super::PreviousOwner>,
    ) {
        let client = connect.client_id.as_str();
        if prev.is_some() {
            self.fenced_will_gone(client);
        } else {
            self.fenced_will_returned(now, client, connect.clean_start);
        }
    }

    /// `client`'s fenced will is settled at its client's return (here, or
    /// elsewhere with this node fenced for it): published if due, as any
    /// lost connection's (`ends`: the return ends the session), dropped
    /// if its delay still runs.
    fn fenced_will_returned(&mut self, now: Instant, client: &str, ends: bool) {
        let Some((f, clean)) = self.take_fenced_will(client) else {
            return;
        };
        let delay = f.will.properties.will_delay_interval.unwrap_or(0);
        let ended = clean || ends || !self.sessions.has_client(client);
        if ended || later(f.at, delay).is_none_or(|at| at <= now) {
            self.metrics.fenced_wills_settled += 1;
            self.publish_will(now, *f.will);
        }
    }

    /// `client`'s fenced will is another node's to settle (it took the id).
    fn fenced_will_gone(&mut self, client: &str) {
        self.take_fenced_will(client);
    }

    /// `client`'s fenced will, taken to be settled: no longer asked for,
    /// and its clean session's entry gone (true when it had one).
    fn take_fenced_will(&mut self, client: &str) -> Option<(FencedWill, bool)> {
        let f = self.orphans.take_fenced(client)?;
        self.orphans.answered(client);
        Some((f, self.clean_wills.disarm(client).is_some()))
    }

    /// [`Broker::client_taken_from`] of a copy held by a claim not yet
    /// answered, the client at the new owner starting clean: the copy's
    /// will (the one captured for an orphan claim, else the copy's own) is
    /// due now, and the copy goes. The captured will is taken, so the
    /// claim's answer publishes nothing more (see `orphan_claimed`).
    fn ended_by_clean_start(&mut self, now: Instant, client_id: &str) {
        let captured = self.orphans.take_captured(client_id).map(|c| c.will);
        let will = captured
            .or_else(|| self.repl.images.will_of(client_id).cloned().map(Box::new))
            .map(|w| will_from_stored(&w, &self.durable));
        self.with_copies(|im, d| im.forget(client_id, d));
        if self.publish_copy_will(now, will) {
            tracing::info!(
                client_id,
                "published a will held here: the client id moved on to a clean start"
            );
        }
    }

    /// A session served here whose client id another node took with a
    /// clean start, with this node's knowledge (a fence, or this leader in
    /// its lease): the session ends rather than moves (MQTT-3.1.3-9), so a
    /// will waiting out its delay is due now. The new owner started clean
    /// and publishes none of its copy (see `install_replica`); the session
    /// still moves as it is, without the will.
    fn ended_by_takeover(&mut self, now: Instant, sid: SessionId) {
        let Some(w) = self
            .sessions
            .get_mut(sid)
            .and_then(|s| s.take_pending_will())
        else {
            return;
        };
        self.publish_will(now, w.will);
        self.dur_will_published(sid);
        if let Some(s) = self.sessions.get(sid) {
            tracing::info!(
                client_id = &*s.client_id,
                "published a will: its client id moved on to a clean start"
            );
        }
    }

    /// The leader is about to give `client_id` to another node (`to`)
    /// and this node let go (it answered the fence), so that node is told
    /// the id was not taken by a lapsed lease and publishes no will of this
    /// node's: a fenced will here is settled now, as at a return (one
    /// with `clean_start` ends the session: the will is due, whatever its
    /// delay). Then as [`Broker::client_taken_from`].
    pub fn client_fenced(&mut self, now: Instant, client_id: &str, loss: super::Loss) {
        self.fenced_will_returned(now, client_id, loss.clean_start);
        if loss.clean_start {
            // An orphan claim of it answered after this finds the copy
            // replaced: the will it was for is due (see `orphan_claimed`).
            self.orphans.back_clean(client_id);
        }
        let loss = super::Loss {
            lapsed: false,
            ..loss
        };
        self.client_taken_from(now, client_id, loss);
    }

    /// `f`'s connection was lost at `f.at`: publish its will now if due
    /// (`sid`, its session, offline here, or gone), or leave it pending
    /// for the rest of its delay.
    fn settle_fenced_will(&mut self, now: Instant, sid: Option<SessionId>, f: FencedWill) {
        self.metrics.fenced_wills_settled += 1;
        let delay = f.will.properties.will_delay_interval.unwrap_or(0);
        let Some((sid, expiry)) =
            sid.and_then(|sid| Some((sid, self.sessions.get(sid)?.expiry_interval)))
        else {
            self.publish_will(now, *f.will);
            return;
        };
        match later(f.at, super::message::will_wait(delay, expiry)).filter(|at| *at > now) {
            Some(at) => {
                if let Some(s) = self.sessions.get_mut(sid) {
                    s.set_pending_will(Box::new(PendingWill { will: *f.will, at }));
                }
                self.timers.arm(at, Timer::Will(sid));
                // The copies' armed will becomes this pending one.
                self.dur_detached(sid);
            }
            None => {
                self.publish_will(now, *f.will);
                // Disarms the copies' will.
                self.dur_will_armed(sid);
            }
        }
    }

    /// The cluster renewed this node's lease until `until`, by a renewal
    /// sent at `sent`: past `until`, the core drops the clients itself at
    /// its next event, whichever task runs first after a pause; what
    /// waited for a renewal since before `sent` goes (see `lease`).
    pub fn cluster_lease_until(&mut self, now: Instant, sent: Instant, until: Instant) {
        let (back, free) = self.lease.renewed(sent, until, now);
        if back {
            self.cluster_lease(now, true);
        }
        self.release_replica_waiters(free);
    }

    /// The lease ran out by the clock: nothing is delivered under it.
    #[inline]
    fn check_lease(&mut self, now: Instant) {
        if self.lease.overdue(now) {
            let conns = self.lease.expire();
            self.fence_clients(now, conns);
        }
    }

    /// The lease is lost: the clients it served go (`conns`), and the
    /// acknowledgements that waited for a renewal are refused, as when a
    /// node they waited for is lost (see `refuse_unconfirmed`).
    fn fence_clients(&mut self, now: Instant, conns: Vec<ConnId>) {
        let mut refused = Vec::new();
        for w in self.lease.take_skipped() {
            match w {
                super::replica::Waiter::Ack(conn, _) => refused.push(conn),
                super::replica::Waiter::Seen(p, s) => self.durable_seen_now(p, s),
            }
        }
        self.refuse_acks(now, refused.into_iter());
        for conn in conns {
            self.metrics.clients_fenced += 1;
            // Past its lease this node publishes no will: the node that
            // takes the client id next does, from its copy (the claim says
            // this node's lease ran out, see `install_replica`), so the
            // replicas keep the will armed.
            let kept = self.keep_armed_will(now, conn);
            // 0x88 is for CONNACK only; 0x9C sends the client to a node
            // that can serve it.
            self.close(now, conn, Some(ReasonCode::USE_ANOTHER_SERVER), false);
            match kept {
                Some(KeptWill::Persistent(sid)) => {
                    if let Some(s) = self.sessions.get_mut(sid) {
                        s.will_armed = true;
                    }
                }
                // The session ended with the connection; its entry stays
                // until the lease is back (see `cluster_lease`).
                Some(KeptWill::Clean(client, epoch)) => self.clean_wills.arm(&client, epoch),
                None => {}
            }
        }
        self.end_event();
    }

    /// Before `conn` closes under a lost lease: its replicas' armed will is
    /// not disarmed by the close (see `fence_clients`), and this node keeps
    /// the will until the lease is back ([`FencedWill`]).
    fn keep_armed_will(&mut self, now: Instant, conn: ConnId) -> Option<KeptWill> {
        let c = self.conns.get(&conn)?;
        let Phase::Connected(sid) = c.phase() else {
            return None;
        };
        let will = c.will.clone();
        let s = self.sessions.get_mut(sid)?;
        let client: Box<str> = (*s.client_id).into();
        let kept = if std::mem::take(&mut s.will_armed) {
            KeptWill::Persistent(sid)
        } else {
            KeptWill::Clean(client.clone(), self.clean_wills.disarm(&client)?)
        };
        let epoch = match &kept {
            KeptWill::Persistent(_) => self.repl.epoch(&client).unwrap_or(0),
            KeptWill::Clean(_, epoch) => *epoch,
        };
        if let Some(will) = will.filter(|_| epoch > 0) {
            self.orphans.fenced(
                client,
                FencedWill {
                    epoch,
                    will,
                    at: now,
                },
            );
        }
        Some(kept)
    }

    /// Another node took `client_id` over (a newer claim): its connection
    /// here gets DISCONNECT 0x8E and its session here ends.
    pub fn client_taken(&mut self, now: Instant, client_id: &str) {
        self.client_taken_by(now, client_id, None);
    }

    /// [`Broker::client_taken`], naming the node the cluster gave the id
    /// to (`None`: not known here). That node gets the session's full
    /// image first unless it is among this node's replicas (it holds the
    /// copy already), then a [`PeerEvent::Handover`] either way: a node
    /// outside the replica set otherwise had no copy to serve, and the
    /// client found a clean session.
    pub fn client_taken_by(&mut self, now: Instant, client_id: &str, to: Option<PeerId>) {
        let loss = super::Loss {
            to,
            ..Default::default()
        };
        self.client_taken_from(now, client_id, loss);
    }

    /// [`Broker::client_taken_by`], as `loss` says: with the epoch this
    /// node held the id under (`held`; 0: not known). Held with no session
    /// here (a claim that committed after its CONNECT gave up, or after an
    /// error answered it), the copy kept here was the session: it is adopted under that
    /// epoch first, and moves on as a session does. Otherwise `to` would
    /// judge its own copy older than this node's epoch and start clean.
    ///
    /// `clean_start`: the client at `to` starts clean, as its claim says.
    /// That ends the session such a copy holds (MQTT-3.1.3-9), so it is
    /// not adopted: its will is published now, as `to` publishes none of
    /// a copy the previous owner (this node) did not write (see
    /// `Broker::install_replica`).
    ///
    /// `lapsed`: taken without a fence (this node's lease ran out), as the
    /// log says; `to` then settles the wills of its copy. Otherwise a
    /// clean start ends the session served here, and its will (the
    /// connection's, closed now, or one waiting out its delay) is
    /// published here, at once; `to` publishes none of its copy.
    ///
    /// `before`: a copy written by an owner before it (this node's claim
    /// took the id from a newer one, which settled that copy's will and
    /// session) is stale: it goes, neither adopted nor its will published.
    /// Before 2026-12-01 it was, and a will came twice: a second
    /// unanswered claim here, taken by a clean start, published again
    /// what the owner in between had published.
    pub fn client_taken_from(&mut self, now: Instant, client_id: &str, loss: super::Loss) {
        let super::Loss {
            to,
            held,
            clean_start,
            lapsed,
            before,
        } = loss;
        let to = to.filter(|p| self.repl.on() && self.peers.ids().any(|q| q == *p));
        // The node that took it decided for a fenced will (see
        // `PreviousOwner::lapsed`).
        self.fenced_will_gone(client_id);
        let Ok(id) = MqttStr::try_from(client_id) else {
            return;
        };
        // Only a copy written under an earlier claim than the one held
        // here (a loss re-applied after a restart names an old one), and
        // not `to`'s own (the session moved there already).
        let older = self
            .repl
            .images
            .owner_of(client_id)
            .is_some_and(|(owner, epoch)| Some(owner) != to && epoch > 0 && epoch < held);
        let stale =
            before.is_some_and(|b| self.repl.images.is_current(client_id, &b) == Some(false));
        if older && stale && !self.sessions.has_client(&id) {
            self.with_copies(|im, d| im.forget(client_id, d));
            tracing::info!(
                client_id,
                "a copy older than the owner before this node's claim: dropped"
            );
        } else if to.is_some() && older && !self.sessions.has_client(&id) {
            if clean_start {
                self.ended_by_clean_start(now, client_id);
            } else {
                // Held by an orphan claim whose answer comes after this (the
                // answer and the log reach this node apart): this adoption is
                // that grant's, its will published (a clean session's ends
                // here) or pending in the session now moving on. The will
                // captured for the claim is not published again (see
                // `Broker::orphan_claimed`); a restarted owner's goes back
                // into the copy first, as the grant would have put it.
                if let Some(c) = self.orphans.take_captured(client_id) {
                    if c.restarted() {
                        self.with_copies(|im, d| im.rearm(client_id, c.will, d));
                    }
                }
                // As the grant would (see `orphan_claimed`).
                let lost_at = self.orphans.take_lost_at(client_id);
                self.orphan_lost_at(client_id, lost_at);
                if self.adopt_replica_at(now, client_id, held) {
                    self.metrics.claims_left += 1;
                    tracing::info!(
                        client_id,
                        epoch = held,
                        "a client id held here with no session: its copy adopted to move on"
                    );
                }
            }
        }
        let mut sid = self.sessions.of_client(&id);
        if let Some(s) = sid.filter(|&s| self.moves.is_arriving(s)) {
            // Moving on before its move here ended: what it holds goes to
            // it first, to be handed over with it.
            self.arrived(now, s);
        }
        if let Some(s) = sid {
            match self.moves.leaving(s) {
                // Told twice (the leader's fence, then the claim applied).
                Some(l) if Some(l.to) == to => return,
                // Moved on again: the relay to the node before ends.
                Some(_) => {
                    self.leave_over(now, s, false);
                    sid = None;
                }
                None => {}
            }
        }
        let Some(sid) = sid else {
            if let Some(to) = to {
                self.peers.send(
                    to,
                    PeerEvent::Handover {
                        client: client_id.into(),
                    },
                );
                self.end_event();
            }
            return;
        };
        self.metrics.fenced_takeovers += 1;
        if self.drain.active() {
            self.drain.moved += 1;
        }
        if let Some(conn) = self.sessions.get(sid).and_then(|s| s.conn) {
            self.close(now, conn, Some(ReasonCode::SESSION_TAKEN_OVER), true);
        }
        if clean_start && !lapsed {
            self.ended_by_takeover(now, sid);
        }
        let relayed = self
            .sessions
            .get(sid)
            .is_some_and(|s| s.stored && s.expiry_interval > 0 && s.subscriptions.len() > 0);
        match to {
            // Kept until every node sends the new owner what matches it.
            Some(to) if relayed => {
                self.leave_relaying(now, sid, client_id, to);
                self.will_moved(sid);
                self.repl.unrecord(client_id);
                self.end_event();
                return;
            }
            Some(to) => {
                self.hand_over(sid, client_id, to);
                self.will_moved(sid);
            }
            None => {}
        }
        self.end_session(now, sid);
        // The session moved, it did not end: the replicas keep their copy
        // (the new owner's full image replaces it).
        self.repl.unrecord(client_id);
        self.end_event();
    }
}

// A persistent session moving between live nodes (see `moves`).
impl Broker {
    /// A will waiting for its delay went with its session to the node
    /// that took it over (in the image it holds or was just sent): that
    /// node publishes it when due, unless a connection there cancelled it
    /// already (MQTT-3.1.3-9). Ending the session here must not publish
    /// it too.
    fn will_moved(&mut self, sid: SessionId) {
        if let Some(s) = self.sessions.get_mut(sid) {
            s.take_pending_will();
        }
    }

    /// At the old owner, instead of ending `sid` at once: hand it over to
    /// `to` and relay its matches there until every node has flushed.
    fn leave_relaying(&mut self, now: Instant, sid: SessionId, client: &str, to: PeerId) {
        // Before the mark, which lets the new owner serve the session.
        self.peers.send(
            to,
            PeerEvent::Relaying {
                client: client.into(),
            },
        );
        self.hand_over(sid, client, to);
        let mut nodes = vec![None];
        nodes.extend(self.peers.reachable().into_iter().map(Some));
        let deadline = now + MOVE_TIMEOUT;
        self.moves.leave(sid, client, to, nodes, deadline);
        self.timers.arm(deadline, Timer::Moves);
        self.metrics.moves_relayed += 1;
    }

    /// The relay of `sid` is over (every node flushed; or timed out, or
    /// its new owner gone): the new owner is told, the session ends here.
    fn leave_over(&mut self, now: Instant, sid: SessionId, timed_out: bool) {
        let Some(l) = self.moves.take_leaving(sid) else {
            return;
        };
        if timed_out {
            self.metrics.moves_timed_out += 1;
        }
        self.peers.send(
            l.to,
            PeerEvent::RelayDone {
                client: l.client.clone(),
            },
        );
        self.end_session(now, sid);
        self.repl.unrecord(&l.client);
    }

    /// `nodes` (`None`: this one) flushed `client`'s move to `to` (`None`:
    /// the latest).
    fn move_flushed(
        &mut self,
        now: Instant,
        client: &str,
        nodes: &[Option<PeerId>],
        to: Option<PeerId>,
    ) {
        if let Some(sid) = self.moves.flushed_leaving(client, nodes, to) {
            self.leave_over(now, sid, false);
        }
    }

    /// Keep what this node said of `client`'s move (see `Moves::told`).
    fn told(&mut self, now: Instant, client: &str, to: Option<PeerId>) {
        if self.moves.told(client, to, now) {
            self.metrics.moves_told_forgotten += 1;
        }
    }

    /// `peer`'s link started over: the moves this node announced or
    /// flushed lately, whose word may have gone with what was queued for
    /// it, are said again.
    fn retell_moves(&mut self, peer: PeerId) {
        let now = self.last_stamp.0;
        let sessions = &self.sessions;
        let moves = &mut self.moves;
        let again = moves.retell(peer, now, |c| sessions.has_client(c));
        for r in again {
            self.metrics.moves_retold += 1;
            tracing::debug!(?peer, said = ?r, "a move said again to a node back");
            let event = match r {
                super::moves::Retell::Moved(client) => PeerEvent::Moved { client },
                super::moves::Retell::Flushed(client, to) => PeerEvent::Flushed {
                    client,
                    to: Some(to),
                },
            };
            self.peers.send(peer, event);
        }
    }

    /// `from`, the old owner of `client`'s session, relays it here.
    fn relaying(&mut self, now: Instant, from: PeerId, client: Box<str>) {
        // Expected already (a drained session served from its copy, see
        // `adopt_drained`).
        if self.moves.relayed_by(&client, from) {
            return;
        }
        // Served here already: a claim that did not wait for the mark (the
        // old owner away then, or slower than the wait). Messages it sent
        // directly since may be relayed too, so none is taken (as before
        // relays); the nodes are told to flush, which ends the relay.
        if self.serves(&client) {
            self.moves.forget_relay(&client, None);
            self.announce_moved(now, &client);
            return;
        }
        let forgot = self.moves.expect_relay(client, from, now + MOVE_TIMEOUT);
        self.metrics.moves_relay_dropped += forgot as u64;
    }

    /// Every node hears that `client`'s session is served here (`Moved`)
    /// and that this node sends its matches here from now on (`Flushed`).
    fn announce_moved(&mut self, now: Instant, client: &str) {
        self.peers.send_all(|| PeerEvent::Moved {
            client: client.into(),
        });
        self.peers.send_all(|| PeerEvent::Flushed {
            client: client.into(),
            to: None,
        });
        self.told(now, client, None);
    }

    /// A message the old owner relayed for `client`'s session.
    fn relayed(&mut self, now: Instant, from: PeerId, client: &str, item: Queued) {
        let arriving = self.moves.arriving_of(client, from);
        tracing::debug!(client, ?from, arriving = arriving.is_some(),
            payload = %payload_head(&item.msg.payload),
            "relayed message received");
        if let Some(sid) = arriving {
            if self.moves.had(sid, &item) {
                self.metrics.moves_relayed_had += 1;
                return;
            }
            self.enqueue(now, sid, item);
        } else if !self
            .moves
            .keep_early(client, from, item, self.config.max_queued_messages)
        {
            self.metrics.moves_relay_dropped += 1;
        }
    }

    /// `client`'s session is served here now (`resumed`: the session the
    /// old owner had). When that owner relays it, every node hears of it
    /// (`Moved`, after the subscriptions), this node flushes, and the
    /// relays that came early are queued first.
    /// `had`: the marks of the messages the copy it was served from held
    /// (see `Moves::arrive`).
    fn arrive(
        &mut self,
        now: Instant,
        client: &str,
        resumed: bool,
        had: HashSet<super::strand::Mark>,
    ) {
        if !self.moves.expects_relay(client) {
            return;
        }
        let sid = MqttStr::try_from(client)
            .ok()
            .and_then(|id| self.sessions.of_client(&id));
        let nodes = self.peers.reachable();
        let early = match sid {
            Some(sid) if resumed => self.moves.arrive(sid, client, nodes, now, had),
            // A clean session: the old one's messages are not for it; the
            // old owner still waits for the nodes to flush.
            _ => self.moves.forget_relay(client, None).then(Vec::new),
        };
        let Some(early) = early else {
            return;
        };
        // The subscriptions reach every node before `Moved`, on the same
        // links.
        self.announce();
        self.announce_moved(now, client);
        self.timers.arm(now + MOVE_TIMEOUT, Timer::Moves);
        if let Some(sid) = sid.filter(|_| resumed) {
            if !early.is_empty() {
                tracing::debug!(client, early = early.len(), "early relays queued");
            }
            for item in early {
                if self.moves.had(sid, &item) {
                    self.metrics.moves_relayed_had += 1;
                    continue;
                }
                self.enqueue(now, sid, item);
            }
        }
    }

    /// The move of `sid` to this node is over: what was held is queued, in
    /// order, and the answers that waited for it go.
    fn arrived(&mut self, now: Instant, sid: SessionId) {
        let Some(a) = self.moves.take_arriving(sid) else {
            return;
        };
        self.metrics.moves_arrived += 1;
        let (held, answers) = a.into_parts();
        if tracing::enabled!(tracing::Level::DEBUG) {
            let client = self.sessions.get(sid).map(|s| s.client_id.to_string());
            let held: Vec<String> = held
                .iter()
                .take(16)
                .map(|q| payload_head(&q.msg.payload).into_owned())
                .collect();
            tracing::debug!(?client, ?held, "a move here ended: what it held queued");
        }
        self.queue_and_answer(now, sid, held, answers);
    }

    /// Queue what a move held for `sid`, then send the answers that waited
    /// for it (through the gates again: other moves may hold them).
    fn queue_and_answer(
        &mut self,
        now: Instant,
        sid: SessionId,
        held: Vec<Queued>,
        answers: Vec<Answer>,
    ) {
        for item in held {
            self.enqueue(now, sid, item);
        }
        for answer in answers {
            match answer {
                Answer::Seen(p, seq) => self.durable_seen(p, seq),
                Answer::Ack(conn, out) => self.send_publish_ack(conn, out),
            }
        }
    }

    /// A match of `sid` while moves are on: the item back when it is to be
    /// queued as usual.
    fn moving_hit(&mut self, now: Instant, sid: SessionId, item: Queued) -> Option<Queued> {
        let node = item.msg.origin_peer;
        let publisher = item
            .msg
            .origin
            .filter(|_| node.is_none())
            .and_then(|o| self.sessions.get(o))
            .and_then(|s| s.conn);
        let bound = self.config.max_queued_messages;
        match self.moves.hit(sid, node, publisher, item, bound) {
            MoveHit::Deliver(item) => Some(item),
            MoveHit::Relay(to, client, item) => {
                self.metrics.moves_relayed_messages += 1;
                self.peers.send(
                    to,
                    PeerEvent::Relayed {
                        client,
                        msg: item.msg.for_peer(),
                        qos: item.qos,
                        retain: item.retain,
                        sub_ids: item.sub_ids,
                    },
                );
                None
            }
            MoveHit::Drop | MoveHit::Held => None,
            MoveHit::Overflow(item) => {
                // Order gives way to the bound: what is held goes now (the
                // relay is still taken).
                self.metrics.moves_hold_overflows += 1;
                let (held, answers) = self.moves.release_held(sid);
                self.queue_and_answer(now, sid, held, answers);
                Some(item)
            }
        }
    }

    /// `answer` when it may go now; kept by the moves otherwise (see
    /// `moves`: held messages of its node, relays not yet confirmed).
    fn move_gate(&mut self, answer: Answer) -> Option<Answer> {
        let answer = self.moves.hold_answer(answer)?;
        let targets = self.moves.relay_targets();
        let seen: Vec<(PeerId, u64)> = targets
            .into_iter()
            .map(|p| (p, self.peers.seen_by(p)))
            .collect();
        let mut fences = Vec::new();
        let peers = &mut self.peers;
        let answer = self.moves.chain(
            answer,
            || peers.stamp(),
            |p| seen.iter().find(|s| s.0 == p).map_or(u64::MAX, |s| s.1),
            &mut fences,
        );
        for (to, seq) in fences {
            self.peers.send(to, PeerEvent::Fence { seq });
        }
        answer
    }

    /// Send the chained answers whose fences were seen (`gone`: a node
    /// not waited for any more).
    fn unchain(&mut self, gone: Option<PeerId>) {
        let peers = &self.peers;
        let free = self.moves.unchain(|p| peers.seen_by(p), gone);
        let mut refused = Vec::new();
        for (answer, refuse) in free {
            match (answer, refuse) {
                (Answer::Seen(p, seq), false) => self.durable_seen_unmoved(p, seq),
                (Answer::Ack(conn, out), false) => self.send_publish_ack_unmoved(conn, out),
                (Answer::Seen(p, seq), true) => self.peers.send(p, PeerEvent::Refused { seq }),
                (Answer::Ack(conn, _), true) => refused.push(conn),
            }
        }
        if !refused.is_empty() {
            let now = self.last_stamp.0;
            self.refuse_acks(now, refused.into_iter());
        }
    }

    /// `peer` is away or left: the moves go on without it.
    fn moves_peer_gone(&mut self, peer: PeerId) {
        if !self.moves.gates() {
            return;
        }
        let now = self.last_stamp.0;
        let (left, arrived) = self.moves.peer_gone(peer);
        for sid in left {
            self.leave_over(now, sid, false);
        }
        for sid in arrived {
            self.arrived(now, sid);
        }
        self.unchain(Some(peer));
    }

    /// End the moves past their deadline.
    fn moves_overdue(&mut self, now: Instant) {
        let (left, arrived) = self.moves.overdue(now);
        for sid in left {
            self.leave_over(now, sid, true);
        }
        for sid in arrived {
            self.metrics.moves_timed_out += 1;
            self.arrived(now, sid);
        }
    }
}

// A cluster node being removed: its clients go elsewhere (see `drain`).
impl Broker {
    /// Send every client to `reference` (the MQTT address of the node
    /// holding this node's session copies; `None`: no node can be named)
    /// and refuse CONNECTs from now on. Returns the connections told.
    pub fn drain(&mut self, now: Instant, reference: Option<&str>) -> u64 {
        self.drain.start(reference);
        let reason = self.drain.reason();
        let conns: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.phase(), Phase::Connected(_)))
            .map(|(id, _)| id)
            .collect();
        let told = conns.len() as u64;
        for conn in conns {
            // As a takeover: a will waits for its delay, and the session
            // (with a pending will) moves to the node the client goes to.
            self.close(now, conn, Some(reason), true);
        }
        self.drain.told += told;
        self.end_event();
        told
    }

    /// Sessions still here (each waits for its client to connect to
    /// another node), and sessions taken over since the drain began.
    pub fn drain_progress(&self) -> (usize, u64) {
        (self.sessions.len(), self.drain.moved)
    }

    /// Connections told to move since the drain began.
    pub fn drain_told(&self) -> u64 {
        self.drain.told
    }

    fn refuse_draining(&mut self, now: Instant, conn: ConnId) {
        let reason = self.drain.reason();
        let mut properties = Properties::default();
        if self.conns.get(&conn).is_some_and(|c| c.protocol.is_v5()) {
            self.drain.refer(reason, &mut properties);
        }
        self.drain.told += 1;
        self.refuse_with(now, conn, reason, properties);
    }
}

// Authentication and access control: logins, ACL checks, SCRAM, HTTP answers.
impl Broker {
    /// Install authentication and access settings: at start, or on reload
    /// (new logins use the new password files; connected clients keep their
    /// login and move to their listener's new ACL, with a fresh cache).
    pub fn set_security(&mut self, config: SecurityConfig) {
        self.auth.reconfigure(config);
        // Connected sessions follow their listener's new ACL (a reload).
        let attached: Vec<(ConnId, SessionId)> = self
            .conns
            .iter()
            .filter_map(|(id, c)| c.session().map(|sid| (id, sid)))
            .collect();
        for (conn, sid) in attached {
            self.auth_attach(conn, sid);
        }
    }

    /// A new network connection with what the shell knows about it: its
    /// listener and certificate identity. Connection limits are decided
    /// here (the CONNECT is then refused with their reason code).
    pub fn connection_opened_with(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        meta: ConnectionMeta,
    ) -> ConnId {
        let total = self.conns.len();
        let listener = meta.listener;
        let on_listener = self.auth.open_on(listener);
        let per_listener_max = self.auth.listener(listener).max_connections;
        let refuse = if let Some(verdict) =
            super::admission::verdict(meta.admission, &mut self.metrics.security)
        {
            verdict
        } else if (self.config.max_connections > 0 && total >= self.config.max_connections)
            || (per_listener_max > 0 && on_listener >= per_listener_max)
        {
            self.metrics.security.refused_max_connections += 1;
            Some(ReasonCode::QUOTA_EXCEEDED)
        } else if !self
            .auth
            .rate_allows(peer.ip(), now, self.config.max_connection_rate)
        {
            self.metrics.security.refused_connection_rate += 1;
            Some(ReasonCode::CONNECTION_RATE_EXCEEDED)
        } else {
            None
        };
        let id = self.connection_opened(now, peer);
        self.auth.opened(listener);
        if let Some(c) = self.conns.get_mut(&id) {
            c.set_listener(listener);
            if let Some(cn) = meta.identity {
                c.sec.ext_mut().identity = Some(cn.into_boxed_str());
            }
            if refuse.is_some() {
                c.sec.ext_mut().refuse = refuse;
            }
        }
        id
    }

    /// The overall and listener `listener`'s `max_connections` (0: none),
    /// for a shell that decides them over several shards.
    pub fn connection_limits(&self, listener: usize) -> (usize, usize) {
        let l = self.auth.listener(listener).max_connections;
        (self.config.max_connections, l)
    }

    /// Whether `conn` was refused by a limit when it opened (its CONNECT
    /// is answered where it is, not moved to another shard).
    pub fn is_refused(&self, conn: ConnId) -> bool {
        self.conns
            .get(&conn)
            .is_some_and(|c| c.sec.ext().refuse.is_some())
    }

    /// The certificate identity `conn` opened with, to open it again on
    /// another shard.
    pub fn identity(&self, conn: ConnId) -> Option<String> {
        let c = self.conns.get(&conn)?;
        c.sec.ext().identity.as_deref().map(str::to_owned)
    }

    /// Share one login-failure memory with the other shards' cores (call
    /// before the first connection; kept across reloads).
    pub fn share_login_throttle(
        &mut self,
        tracker: std::sync::Arc<std::sync::Mutex<zerofan_auth::FailureTracker>>,
    ) {
        self.auth.share_throttle(tracker);
    }

    /// Bookkeeping when a connection is removed.
    pub(crate) fn auth_connection_closed(&mut self, conn: ConnId) {
        let listener = self.conns.get(&conn).map(|c| c.listener());
        self.auth.closed(conn, listener);
    }

    /// Decide a CONNECT (see the module documentation). On success the
    /// username is kept on the connection.
    pub(crate) fn authenticate(
        &mut self,
        now: Instant,
        conn: ConnId,
        username: Option<&str>,
        password: Option<&[u8]>,
        client_id: &str,
    ) -> Result<(), Refusal> {
        let answered = self
            .conns
            .get_mut(&conn)
            .and_then(|c| c.sec.extra.as_mut())
            .and_then(|e| e.http_answer.take());
        let Some(c) = self.conns.get(&conn) else {
            return Err(Refusal::Code(ReasonCode::UNSPECIFIED_ERROR));
        };
        if let Some(code) = c.sec.ext().refuse {
            return Err(Refusal::Code(code));
        }
        let ip = c.peer.ip();
        let l = self.auth.listener(c.listener());
        // Who is trying: failures are counted per (address, this name);
        // an attempt without one is anonymous and never counted.
        let login_name: Option<&str> = if l.use_identity_as_username {
            c.sec.ext().identity.as_deref()
        } else {
            username
        };
        if let Some(name) = login_name {
            if !self.auth.login_delay(ip, name, now).is_zero() {
                self.metrics.security.auth_throttled += 1;
                tracing::debug!(%conn, peer = %ip, user = name, "login throttled");
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.sec.ext_mut().refuse_reason = Some(THROTTLED_REASON);
                }
                return Err(Refusal::Code(ReasonCode::CONNECTION_RATE_EXCEEDED));
            }
        }
        let l = self.auth.listener(c.listener());
        let fail_allow = self.auth.http.as_ref().map(|h| h.settings.fail_allow);
        let link = match (answered, fail_allow) {
            (_, None) => HttpLink::Off,
            (Some(a), Some(allow)) => HttpLink::Answer(a, allow),
            (None, Some(_)) => HttpLink::Ask,
        };
        let chain = |link| -> Result<(Option<Box<str>>, Grant), Stop> {
            if l.use_identity_as_username {
                return match &c.sec.ext().identity {
                    Some(cn) => Ok((Some(cn.clone()), Grant::default())),
                    None => Err(Stop::Refuse(ReasonCode::NOT_AUTHORIZED)),
                };
            }
            match username {
                None if l.allow_anonymous => Ok((None, Grant::default())),
                None => Err(Stop::Refuse(ReasonCode::NOT_AUTHORIZED)),
                Some(u) => login_chain(l, self.auth.jwt(), link, now, u, password)
                    .map(|g| (Some(u.into()), g)),
            }
        };
        let scram_user = c.sec.ext().scram_user.clone();
        let mut decision = match scram_user {
            // Authenticated by the SCRAM exchange (see `scram_auth`).
            Some(u) => Ok((Some(u), Grant::default())),
            None => chain(link),
        };
        if decision.as_ref().err() == Some(&Stop::Ask) {
            let ip_text = ip.to_string();
            let user = username.unwrap_or("");
            let pw = password.unwrap_or(&[]);
            let listener = c.listener();
            let parts: [&[u8]; 5] = [
                user.as_bytes(),
                pw,
                client_id.as_bytes(),
                ip_text.as_bytes(),
                &listener.to_le_bytes(),
            ];
            let allow = fail_allow.unwrap_or(false);
            match self
                .auth
                .http
                .as_ref()
                .map(|h| (h.lookup(now, &parts), h.has_room()))
            {
                Some((Lookup::Hit(a), _)) => {
                    self.metrics.security.auth_http_cache_hits += 1;
                    decision = chain(HttpLink::Answer(a, allow));
                }
                Some((Lookup::Miss(key), true)) => {
                    self.metrics.security.auth_http_cache_misses += 1;
                    let body = login_body(user, pw, client_id, &ip_text, listener);
                    return Err(Refusal::AskHttp(key, body));
                }
                _ => {
                    self.metrics.security.auth_http_overflow += 1;
                    decision = chain(HttpLink::Answer(HttpAnswer::Failed, allow));
                }
            }
        }
        let decision = decision.map_err(|stop| match stop {
            Stop::Refuse(code) => code,
            Stop::Ask => ReasonCode::UNSPECIFIED_ERROR,
        });
        match decision {
            Ok((user, grant)) => {
                if let Some(name) = &user {
                    self.metrics.security.auth_success += 1;
                    self.auth.login_succeeded(ip, name);
                }
                let (rate, bytes) = (
                    self.config.max_publish_rate,
                    self.config.max_publish_bytes_rate,
                );
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.sec.username = user;
                    c.sec.publish = PublishLimiter::new(rate, bytes, now);
                    if grant.acl.is_some() || grant.expires.is_some() || grant.superuser {
                        let e = c.sec.ext_mut();
                        e.login_acl = grant.acl;
                        e.expires = grant.expires;
                        e.superuser = grant.superuser;
                    }
                }
                if let Some(at) = grant.expires {
                    self.timers.arm(at, Timer::TokenExpiry(conn));
                }
                Ok(())
            }
            Err(code) => {
                let failure = match code {
                    ReasonCode::BAD_USER_NAME_OR_PASSWORD => {
                        self.metrics.security.auth_bad_credentials += 1;
                        true
                    }
                    ReasonCode::NOT_AUTHORIZED => {
                        self.metrics.security.auth_not_authorized += 1;
                        true
                    }
                    // The HTTP service failed (fail = "deny"): not the client's fault.
                    _ => {
                        self.metrics.security.auth_http_refused_unavailable += 1;
                        false
                    }
                };
                if let (Some(name), true) = (login_name, failure) {
                    self.auth.login_failed(ip, name, now);
                }
                let peer = self.conns.get(&conn).map(|c| c.peer.addr());
                tracing::debug!(%conn, ?peer, reason = code.0, "login refused");
                Err(Refusal::Code(code))
            }
        }
    }

    /// The connection is attached to session `sid` as `client_id`: put the
    /// session under its listener's ACL (or take it out of any).
    pub(crate) fn auth_attach(&mut self, conn: ConnId, sid: SessionId) {
        let (Some(c), Some(s)) = (self.conns.get(&conn), self.sessions.get(sid)) else {
            return;
        };
        let acl = match c.sec.ext().superuser {
            true => None,
            false => c
                .sec
                .ext()
                .login_acl
                .clone()
                .or_else(|| self.auth.listener(c.listener()).acl.clone()),
        };
        match acl {
            Some(acl) => {
                let username = c.sec.username.clone();
                self.auth.set_session_acl(sid, acl, &s.client_id, username);
            }
            None => self.auth.forget_session(sid),
        }
    }

    /// The CONNECT of `conn` waits for the HTTP service (see
    /// [`super::http_auth`]); its input is held meanwhile.
    pub(crate) fn wait_for_http(
        &mut self,
        conn: ConnId,
        connect: Box<zerofan_codec::Connect>,
        key: [u8; 32],
        body: Vec<u8>,
    ) {
        let (Some(h), Some(c)) = (self.auth.http.as_mut(), self.conns.get_mut(&conn)) else {
            return;
        };
        c.set_phase(super::connection::Phase::AwaitingAuth);
        c.protocol = connect.protocol;
        h.ask(conn, connect, key, body);
    }

    /// Requests for the HTTP service, for the shell to send.
    pub fn take_auth_requests(&mut self, out: &mut Vec<AuthRequest>) {
        if let Some(h) = self.auth.http.as_mut() {
            h.take_requests(out);
        }
    }

    /// Whether [`Broker::take_auth_requests`] has something.
    pub fn has_auth_requests(&self) -> bool {
        self.auth.http.as_ref().is_some_and(|h| h.has_requests())
    }

    /// CONNECTs waiting for the HTTP service.
    pub fn auth_waiting(&self) -> usize {
        self.auth.http.as_ref().map_or(0, |h| h.waiting())
    }

    /// The HTTP service's answer to request `id`: its CONNECT is handled
    /// again with it (nothing happens when its connection is gone).
    pub fn auth_answered(&mut self, now: Instant, id: u64, answer: HttpAnswer) {
        match answer {
            HttpAnswer::Failed => self.metrics.security.auth_http_failures += 1,
            HttpAnswer::TimedOut => self.metrics.security.auth_http_timeouts += 1,
            _ => {}
        }
        if let Some(h) = self.auth.http.as_mut().filter(|h| h.is_acl(id)) {
            let fail_allow = h.settings.fail_allow;
            if let Some((conn, Some(packet))) = h.acl_answered(now, id, answer, fail_allow) {
                // All its answers came: handled now, in order, then the
                // rest of its input.
                self.handle_packet(now, conn, packet);
                self.wake(conn);
            }
            self.end_event();
            return;
        }
        let Some((conn, connect)) = self
            .auth
            .http
            .as_mut()
            .and_then(|h| h.answered(now, id, answer))
        else {
            return;
        };
        match self.conns.get_mut(&conn) {
            Some(c) if c.phase() == super::connection::Phase::AwaitingAuth => {
                c.set_phase(super::connection::Phase::AwaitingConnect);
                c.sec.ext_mut().http_answer = Some(answer);
            }
            _ => return,
        }
        self.on_connect(now, conn, *connect);
        // Its held input may be read now.
        self.wake(conn);
        self.end_event();
    }

    /// The HTTP service's ACL decision on `topic` for `conn` (a lookup:
    /// a replay's answer, the cache); on a miss the requests are sent, the
    /// packet from `held` waits and `None` is returned (unless `wait` is
    /// false: then a miss is a refusal).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn http_acl(
        &mut self,
        now: Instant,
        conn: ConnId,
        sid: SessionId,
        topic: &str,
        action: AclAction,
        wait: bool,
        held: impl FnOnce() -> Packet,
    ) -> Option<bool> {
        let c = self.conns.get(&conn)?;
        if c.sec.ext().superuser {
            return Some(true);
        }
        let user = c.sec.username.as_deref().unwrap_or("").to_string();
        let address = c.peer.ip().to_string();
        let client = self.sessions.get(sid)?.client_id.to_string();
        let h = self.auth.http.as_mut()?;
        let fail_allow = h.settings.fail_allow;
        match h.acl_lookup(now, &user, &client, &address, topic, action, true) {
            Ok((a, cached)) => {
                if cached {
                    self.metrics.security.auth_http_cache_hits += 1;
                }
                Some(acl_allows(a, fail_allow))
            }
            Err(_) if !wait || action == AclAction::Subscribe => Some(false),
            Err(key) => {
                self.metrics.security.auth_http_cache_misses += 1;
                h.ask_acl(conn, key, &user, &client, &address, topic, action);
                h.hold(conn, held(), 1);
                None
            }
        }
    }

    /// Before a SUBSCRIBE is handled: when the HTTP service must be asked
    /// about some of its filters, ask, hold the packet (and the
    /// connection's input) and return true.
    pub(crate) fn subscribe_waits(
        &mut self,
        now: Instant,
        conn: ConnId,
        sid: SessionId,
        sub: &zerofan_codec::Subscribe,
    ) -> bool {
        if !self.auth.http.as_ref().is_some_and(|h| h.checks_acl()) {
            return false;
        }
        let Some(c) = self.conns.get(&conn) else {
            return false;
        };
        if c.sec.ext().superuser {
            return false;
        }
        let user = c.sec.username.as_deref().unwrap_or("").to_string();
        let address = c.peer.ip().to_string();
        let Some(client) = self.sessions.get(sid).map(|s| s.client_id.to_string()) else {
            return false;
        };
        let Some(h) = self.auth.http.as_mut() else {
            return false;
        };
        let mut asked: Vec<[u8; 32]> = Vec::new();
        for (filter, _) in &sub.filters {
            if zerofan_codec::topic::validate_topic_filter(filter).is_err() {
                continue;
            }
            let plain = zerofan_codec::topic::split_shared(filter).map_or(&**filter, |(_, f)| f);
            let a = AclAction::Subscribe;
            if let Err(key) = h.acl_lookup(now, &user, &client, &address, plain, a, false) {
                if !asked.contains(&key) {
                    h.ask_acl(conn, key, &user, &client, &address, plain, a);
                    asked.push(key);
                }
            }
        }
        if asked.is_empty() {
            return false;
        }
        self.metrics.security.auth_http_cache_misses += asked.len() as u64;
        h.hold(conn, Packet::Subscribe(sub.clone()), asked.len());
        true
    }

    /// Whether `conn`'s input is held for ACL answers.
    pub(crate) fn acl_holds(&self, conn: ConnId) -> bool {
        self.auth.http.as_ref().is_some_and(|h| h.holds(conn))
    }

    /// Whether this connection's SCRAM exchange succeeded.
    pub(crate) fn scram_done(&self, conn: ConnId) -> bool {
        self.conns
            .get(&conn)
            .is_some_and(|c| c.sec.ext().scram_user.is_some())
    }

    /// Whether the next packet must be a CONNECT: awaiting one, and not in
    /// a SCRAM exchange (whose AUTH comes before the CONNACK).
    pub fn next_must_be_connect(&self, conn: ConnId) -> bool {
        self.awaits_connect(conn) && !self.scram_waiting(conn)
    }

    /// Whether this connection is in a SCRAM exchange.
    pub(crate) fn scram_waiting(&self, conn: ConnId) -> bool {
        self.auth.in_scram(conn)
    }

    /// The CONNACK's Authentication Method and Data, once.
    pub(crate) fn scram_connack(&mut self, conn: ConnId) -> Option<(MqttStr, bytes::Bytes)> {
        self.conns
            .get_mut(&conn)?
            .sec
            .extra
            .as_mut()?
            .connack_auth
            .take()
    }

    /// A CONNECT with an Authentication Method: start the exchange (AUTH
    /// 0x18 with the server-first message), or the CONNACK code refusing.
    pub(crate) fn scram_start(
        &mut self,
        now: Instant,
        conn: ConnId,
        connect: Box<zerofan_codec::Connect>,
    ) -> Result<(), ReasonCode> {
        let method = connect
            .properties
            .authentication_method
            .clone()
            .unwrap_or_default();
        let Some(c) = self.conns.get(&conn) else {
            return Err(ReasonCode::UNSPECIFIED_ERROR);
        };
        // Offered where there is a password file: SCRAM-SHA-512 works with
        // its `$7$` entries, SCRAM-SHA-256 with its `SCRAM-SHA-256$` ones;
        // a user without credentials for the method fails at the proof.
        let offered = ScramHash::from_method(&method)
            .filter(|_| self.auth.listener(c.listener()).passwords.is_some());
        let Some(hash) = offered else {
            self.metrics.security.auth_not_authorized += 1;
            return Err(ReasonCode::BAD_AUTHENTICATION_METHOD);
        };
        if let Some(code) = c.sec.ext().refuse {
            return Err(code);
        }
        let ip = c.peer.ip();
        let mut server = ScramServer::new(hash);
        let data = connect
            .properties
            .authentication_data
            .clone()
            .unwrap_or_default();
        let Ok(user) = server.client_first(&data).map(str::to_string) else {
            self.metrics.security.auth_bad_credentials += 1;
            return Err(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
        };
        if !self.auth.login_delay(ip, &user, now).is_zero() {
            self.metrics.security.auth_throttled += 1;
            return Err(ReasonCode::CONNECTION_RATE_EXCEEDED);
        }
        let creds = self
            .auth
            .listener(c.listener())
            .passwords
            .as_ref()
            .and_then(|f| f.get(&user))
            .and_then(ScramCredentials::from_password_hash)
            .filter(|cr| cr.hash == hash)
            .unwrap_or_else(|| made_up(hash));
        let Ok(first) = server.server_first(&creds, &nonce()) else {
            return Err(ReasonCode::UNSPECIFIED_ERROR);
        };
        let props = zerofan_codec::Properties {
            authentication_method: Some(method.clone()),
            authentication_data: Some(bytes::Bytes::from(first.into_bytes())),
            ..Default::default()
        };
        self.send(
            conn,
            Packet::Auth(zerofan_codec::Auth {
                reason: ReasonCode::CONTINUE_AUTHENTICATION,
                properties: props.into(),
            }),
        );
        self.auth.start_scram(
            conn,
            ScramPending {
                server,
                connect: Some(connect),
                method,
            },
        );
        self.wake(conn);
        Ok(())
    }

    /// The client's AUTH during a SCRAM exchange.
    pub(crate) fn on_scram_auth(&mut self, now: Instant, conn: ConnId, a: zerofan_codec::Auth) {
        let Some(mut p) = self.auth.take_scram(conn) else {
            return;
        };
        let same_method = a.properties.authentication_method.as_deref() == Some(&*p.method);
        if a.reason != ReasonCode::CONTINUE_AUTHENTICATION || !same_method {
            // Another method or reason mid-exchange (MQTT-4.12.0-5/-6).
            self.metrics.protocol_errors += 1;
            self.scram_refuse(now, conn, ReasonCode::PROTOCOL_ERROR);
            return;
        }
        let data = a.properties.authentication_data.clone().unwrap_or_default();
        let user = p.server.username().to_string();
        let ip = self.conns.get(&conn).map(|c| c.peer.ip());
        match p.server.client_final(&data) {
            Ok(last) => {
                let Some(connect) = p.connect else {
                    return;
                };
                if let Some(c) = self.conns.get_mut(&conn) {
                    let e = c.sec.ext_mut();
                    e.scram_user = Some(user.into());
                    e.scram_hash = Some(p.server.hash());
                    e.connack_auth = Some((p.method, bytes::Bytes::from(last.into_bytes())));
                }
                self.on_connect(now, conn, *connect);
            }
            Err(e) => {
                tracing::debug!(%conn, error = %e, "SCRAM exchange failed");
                self.metrics.security.auth_bad_credentials += 1;
                if let Some(ip) = ip {
                    self.auth.login_failed(ip, &user, now);
                }
                self.scram_refuse(now, conn, ReasonCode::BAD_USER_NAME_OR_PASSWORD);
            }
        }
    }

    /// AUTH from a connected client: re-authentication of a SCRAM login
    /// (see `scram_auth`); anything else is a protocol error.
    pub(crate) fn on_auth_connected(&mut self, now: Instant, conn: ConnId, a: zerofan_codec::Auth) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let Some(user) = c.sec.ext().scram_user.clone() else {
            return self.protocol_error(now, conn, "AUTH without an authentication method");
        };
        let hash = c.sec.ext().scram_hash.unwrap_or(ScramHash::Sha512);
        let method = hash.method();
        if a.properties.authentication_method.as_deref() != Some(method) {
            return self.protocol_error(now, conn, "AUTH with another authentication method");
        }
        let (ip, listener) = (c.peer.ip(), c.listener());
        let data = a.properties.authentication_data.clone().unwrap_or_default();
        let pending = self.auth.take_scram(conn);
        let reply = match (a.reason, pending) {
            (ReasonCode::REAUTHENTICATE, None) => {
                let mut server = ScramServer::new(hash);
                let same_user = server.client_first(&data).is_ok_and(|u| *u == *user);
                let creds = self
                    .auth
                    .listener(listener)
                    .passwords
                    .as_ref()
                    .and_then(|f| f.get(&user))
                    .and_then(ScramCredentials::from_password_hash)
                    .filter(|cr| cr.hash == hash);
                match (same_user, creds) {
                    (true, Some(creds)) => match server.server_first(&creds, &nonce()) {
                        Ok(first) => {
                            self.auth.start_scram(
                                conn,
                                ScramPending {
                                    server,
                                    connect: None,
                                    method: MqttStr::from_static(method),
                                },
                            );
                            Ok((ReasonCode::CONTINUE_AUTHENTICATION, first))
                        }
                        Err(_) => Err(()),
                    },
                    _ => Err(()),
                }
            }
            (ReasonCode::CONTINUE_AUTHENTICATION, Some(mut p)) if p.connect.is_none() => p
                .server
                .client_final(&data)
                .map(|last| (ReasonCode::SUCCESS, last))
                .map_err(|_| ()),
            _ => {
                return self.protocol_error(now, conn, "AUTH out of turn");
            }
        };
        match reply {
            Ok((reason, text)) => {
                let props = zerofan_codec::Properties {
                    authentication_method: Some(MqttStr::from_static(method)),
                    authentication_data: Some(bytes::Bytes::from(text.into_bytes())),
                    ..Default::default()
                };
                self.send(
                    conn,
                    Packet::Auth(zerofan_codec::Auth {
                        reason,
                        properties: props.into(),
                    }),
                );
                self.wake(conn);
            }
            Err(()) => {
                self.metrics.security.auth_bad_credentials += 1;
                self.auth.login_failed(ip, &user, now);
                self.close_with(
                    now,
                    conn,
                    ReasonCode::NOT_AUTHORIZED,
                    Some("re-authentication failed"),
                    true,
                );
            }
        }
    }

    /// CONNACK with a failure code during the exchange, then close.
    fn scram_refuse(&mut self, now: Instant, conn: ConnId, reason: ReasonCode) {
        self.send(
            conn,
            Packet::ConnAck(zerofan_codec::ConnAck {
                session_present: false,
                reason,
                properties: Default::default(),
            }),
        );
        self.close(now, conn, None, false);
    }

    /// A login's token may have expired: close its connection.
    pub(crate) fn on_token_expiry(&mut self, now: Instant, conn: ConnId) {
        let due = self.conns.get(&conn).is_some_and(|c| {
            c.session().is_some() && c.sec.ext().expires.is_some_and(|at| at <= now)
        });
        if due {
            self.metrics.security.auth_token_expired += 1;
            self.close_with(
                now,
                conn,
                ReasonCode::NOT_AUTHORIZED,
                Some("token expired"),
                true,
            );
        }
    }

    /// The session is gone for good.
    pub(crate) fn auth_forget(&mut self, sid: SessionId) {
        self.auth.forget_session(sid);
    }

    /// Whether session `sid` may receive `topic`; counts a refusal.
    #[inline]
    pub(crate) fn may_deliver(&mut self, sid: SessionId, topic: &str) -> bool {
        if !self.auth.any_acl() || self.auth.may_read(sid, topic) {
            return true;
        }
        self.metrics.security.acl_denied_delivery += 1;
        false
    }

    /// Limits and access control for an inbound PUBLISH (topic alias
    /// resolved, topic valid). Returns true when the PUBLISH was handled
    /// here (refused): the caller stops.
    pub(crate) fn publish_refused(
        &mut self,
        now: Instant,
        conn: ConnId,
        sid: SessionId,
        p: &Publish,
    ) -> bool {
        if p.topic.len() > self.config.max_topic_length {
            self.metrics.security.refused_topic_too_long += 1;
            self.close_with(
                now,
                conn,
                ReasonCode::TOPIC_NAME_INVALID,
                Some("topic name too long"),
                true,
            );
            return true;
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return true;
        };
        if let Some(limiter) = c.sec.publish.as_mut() {
            if !limiter.allow(now, p.payload.len()) {
                self.metrics.security.rate_limited_disconnects += 1;
                self.close_with(
                    now,
                    conn,
                    ReasonCode::MESSAGE_RATE_TOO_HIGH,
                    Some("message rate too high"),
                    true,
                );
                return true;
            }
        }
        let sys = p.topic.starts_with("$SYS/") || &*p.topic == "$SYS";
        let allowed = if sys {
            // `$SYS/` belongs to the broker: refused as mosquitto does,
            // never routed (a subscriber would take it for a broker figure).
            false
        } else if !self.auth.any_acl() {
            true
        } else {
            self.auth.may_write(sid, &p.topic)
        };
        let mut allowed = allowed;
        if allowed && self.auth.http.as_ref().is_some_and(|h| h.checks_acl()) {
            let held = || Packet::Publish(p.clone());
            match self.http_acl(now, conn, sid, &p.topic, AclAction::Publish, true, held) {
                Some(ok) => allowed = ok,
                None => return true,
            }
        }
        if allowed {
            return false;
        }
        let v5 = self.conns.get(&conn).is_some_and(|c| c.protocol.is_v5());
        if sys {
            self.metrics.security.refused_sys_publish += 1;
            tracing::debug!(%conn, topic = %p.topic, "publish into $SYS refused");
        } else {
            self.metrics.security.acl_denied_publish += 1;
            tracing::debug!(%conn, topic = %p.topic, "publish denied by the ACL");
        }
        let reason = if v5 {
            ReasonCode::NOT_AUTHORIZED
        } else {
            ReasonCode::SUCCESS
        };
        let ack = Ack {
            packet_id: p.packet_id,
            reason,
            properties: Default::default(),
        };
        match p.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => self.send(conn, Packet::PubAck(ack)),
            QoS::ExactlyOnce => self.send(conn, Packet::PubRec(ack)),
        }
        true
    }

    /// Limits and access control for one SUBSCRIBE filter (valid, possibly
    /// `$share/...`): the failure reason code, or `None` when granted.
    pub(crate) fn subscribe_refused(
        &mut self,
        now: Instant,
        conn: ConnId,
        sid: SessionId,
        filter: &str,
        v5: bool,
    ) -> Option<ReasonCode> {
        if filter.len() > self.config.max_topic_length {
            self.metrics.security.refused_topic_too_long += 1;
            return Some(if v5 {
                ReasonCode::TOPIC_FILTER_INVALID
            } else {
                ReasonCode::UNSPECIFIED_ERROR
            });
        }
        let plain = zerofan_codec::topic::split_shared(filter).map_or(filter, |(_, f)| f);
        let by_file = self.auth.may_subscribe(sid, plain);
        let allowed = by_file
            && (!self.auth.http.as_ref().is_some_and(|h| h.checks_acl())
                // Decided before (see `subscribe_waits`): a lookup, never a wait.
                || self
                    .http_acl(now, conn, sid, plain, AclAction::Subscribe, true, || {
                        Packet::PingResp
                    })
                    .unwrap_or(false));
        if allowed {
            return None;
        }
        self.metrics.security.acl_denied_subscribe += 1;
        Some(if v5 {
            ReasonCode::NOT_AUTHORIZED
        } else {
            ReasonCode::UNSPECIFIED_ERROR
        })
    }
}

// PUBLISH in, and the acknowledgement flows in both directions.
impl Broker {
    /// PUBLISH from a client.
    pub(crate) fn on_publish(
        &mut self,
        now: Instant,
        conn: ConnId,
        sid: SessionId,
        mut p: Publish,
        wire: Option<Wire>,
    ) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if p.retain && !self.config.retain_available {
            self.close_with(
                now,
                conn,
                ReasonCode::RETAIN_NOT_SUPPORTED,
                Some("retain not supported"),
                true,
            );
            return;
        }
        if let Some(alias) = p.properties.topic_alias {
            if alias == 0 || alias > self.config.topic_alias_maximum {
                self.close_with(
                    now,
                    conn,
                    ReasonCode::TOPIC_ALIAS_INVALID,
                    Some("topic alias out of range"),
                    true,
                );
                return;
            }
            if p.topic.is_empty() {
                match c.aliases.as_ref().and_then(|al| al.incoming.get(&alias)) {
                    Some(t) => p.topic = t.clone(),
                    None => {
                        self.protocol_error(now, conn, "unknown topic alias");
                        return;
                    }
                }
            } else {
                // Kept for the connection's life: copied, not a slice pinning
                // this packet's read buffer.
                c.aliases_mut().incoming.insert(alias, copy_str(&p.topic));
            }
        }
        if zerofan_codec::topic::validate_topic_name(&p.topic).is_err()
            || topic_levels(&p.topic) > self.config.max_topic_levels
        {
            self.close_with(
                now,
                conn,
                ReasonCode::TOPIC_NAME_INVALID,
                Some("invalid topic name"),
                true,
            );
            return;
        }
        if self.publish_refused(now, conn, sid, &p) {
            return;
        }
        let protocol = self.conns.get(&conn).map(|c| c.protocol);
        let v5 = protocol.is_some_and(|p| p.is_v5());
        self.metrics.messages_received += 1;
        self.metrics.payload_bytes_received += p.payload.len() as u64;
        self.metrics.messages_received_by_qos[p.qos as usize] += 1;
        self.metrics.payload_bytes_received_by_qos[p.qos as usize] += p.payload.len() as u64;
        let pid = p.packet_id;
        let qos = p.qos;

        if qos == QoS::ExactlyOnce {
            let Some(s) = self.sessions.get_mut(sid) else {
                return;
            };
            if s.flight().incoming_qos2.contains(&pid) {
                // A resent PUBLISH of a message already taken: ack, do not route twice.
                self.send_publish_ack(
                    conn,
                    Outgoing::from_packet(Packet::PubRec(ack(pid, ReasonCode::SUCCESS))),
                );
                return;
            }
            if s.flight().incoming_qos2.len() >= usize::from(self.config.receive_maximum) {
                self.close_with(
                    now,
                    conn,
                    ReasonCode::RECEIVE_MAXIMUM_EXCEEDED,
                    Some("receive maximum exceeded"),
                    true,
                );
                return;
            }
            s.flight_mut().incoming_qos2.insert(pid);
            self.dur_qos2_received(sid, pid);
        }

        // (A publish into `$SYS/` was refused by `publish_refused`.)
        let mut msg = Message::from_publish(p, Some(sid), now);
        if let (Some(w), Some(protocol)) = (wire, protocol) {
            msg.attach_wire(w, protocol, &mut self.wire_scratch);
        }
        let msg = Rc::new(msg);
        if self.events.on() {
            let id = self.sessions.get(sid).map(|s| &*s.client_id);
            self.events.published(id, &msg);
        }
        self.retain_refused = false;
        let matched = self.route(now, msg);
        // A retained message that went to the peers: acknowledged once every
        // shard has it (see `PeerEvent::Seen`).
        let fence = self.ack_fence.take();
        let reason = if std::mem::take(&mut self.retain_refused) && v5 {
            ReasonCode::QUOTA_EXCEEDED
        } else if matched == 0 && v5 {
            ReasonCode::NO_MATCHING_SUBSCRIBERS
        } else {
            ReasonCode::SUCCESS
        };
        // Held until durable when this publish was written (see `durable`).
        let out = match qos {
            QoS::AtMostOnce => return,
            QoS::AtLeastOnce => Outgoing::from_packet(Packet::PubAck(ack(pid, reason))),
            QoS::ExactlyOnce => Outgoing::from_packet(Packet::PubRec(ack(pid, reason))),
        };
        match fence {
            Some((seq, durable)) => {
                self.defer_for_peers(seq, conn, super::peer::Deferred::Ack { out, durable })
            }
            None => self.send_publish_ack(conn, out),
        }
    }

    /// PUBREL from a client: the QoS 2 message is complete.
    pub(crate) fn on_pubrel(&mut self, conn: ConnId, sid: SessionId, a: Ack) {
        let known = self
            .sessions
            .get_mut(sid)
            .and_then(|s| s.flight_any())
            .is_some_and(|f| f.incoming_qos2.remove(&a.packet_id));
        let v5 = self.conns.get(&conn).is_some_and(|c| c.protocol.is_v5());
        let reason = if known || !v5 {
            ReasonCode::SUCCESS
        } else {
            ReasonCode::PACKET_IDENTIFIER_NOT_FOUND
        };
        if known {
            self.dur_qos2_released(sid, a.packet_id);
        }
        // After the release is durable: a restart must not treat the packet
        // id, free again for the client, as still taken.
        self.send_publish_ack(
            conn,
            Outgoing::from_packet(Packet::PubComp(ack(a.packet_id, reason))),
        );
    }

    /// PUBACK from a client: a QoS 1 delivery is done.
    pub(crate) fn on_puback(&mut self, conn: ConnId, sid: SessionId, a: Ack) {
        let done = self.sessions.get(sid).is_some_and(|s| {
            s.flight().inflight.get(&a.packet_id).is_some_and(|f| {
                f.item.qos == QoS::AtLeastOnce && f.state == InflightState::AwaitingAck
            })
        });
        if done {
            self.finish_delivery(conn, sid, a.packet_id);
        }
    }

    /// A delivery left the inflight window (acknowledged, or refused with an
    /// error code): its slot is free for the queue, and a stored one is
    /// done in the log.
    fn finish_delivery(&mut self, conn: ConnId, sid: SessionId, packet_id: u16) {
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        let stored = s
            .flight_mut()
            .inflight
            .remove(&packet_id)
            .is_some_and(|f| f.item.entry.is_some());
        if !s.queue_is_empty() {
            self.wake(conn);
        }
        if stored {
            self.dur_complete(sid, packet_id);
        }
    }

    /// PUBREC from a client: answer PUBREL (or drop the message on an error code).
    pub(crate) fn on_pubrec(&mut self, conn: ConnId, sid: SessionId, a: Ack) {
        let v5 = self.conns.get(&conn).is_some_and(|c| c.protocol.is_v5());
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        match s
            .flight_any()
            .and_then(|f| f.inflight.get_mut(&a.packet_id))
        {
            Some(f) if f.item.qos == QoS::ExactlyOnce => {
                if a.reason.is_error() {
                    self.finish_delivery(conn, sid, a.packet_id);
                    return;
                }
                let stored = f.item.entry.is_some();
                f.state = InflightState::AwaitingComp;
                let rel = Packet::PubRel(ack(a.packet_id, ReasonCode::SUCCESS));
                if stored {
                    self.dur_pubrec(sid, a.packet_id);
                    // Once the replicas have the PUBREC too: the client
                    // forgets the message at PUBREL, and a node serving
                    // the session after a failover must not send it again.
                    self.send_publish_ack_unmoved(conn, Outgoing::from_packet(rel));
                    return;
                }
                // The payload is no longer needed; keep only the id state.
                self.send(conn, rel);
            }
            _ => {
                let reason = if v5 {
                    ReasonCode::PACKET_IDENTIFIER_NOT_FOUND
                } else {
                    ReasonCode::SUCCESS
                };
                self.send(conn, Packet::PubRel(ack(a.packet_id, reason)));
            }
        }
    }

    /// PUBCOMP from a client: a QoS 2 delivery is done.
    pub(crate) fn on_pubcomp(&mut self, conn: ConnId, sid: SessionId, a: Ack) {
        let done = self.sessions.get(sid).is_some_and(|s| {
            s.flight()
                .inflight
                .get(&a.packet_id)
                .is_some_and(|f| f.state == InflightState::AwaitingComp)
        });
        if done {
            self.finish_delivery(conn, sid, a.packet_id);
        }
    }

    /// The message to keep for long: small ones are copied out of their read
    /// buffer (counted), large ones are worth the buffer they hold.
    pub(crate) fn keepable(&mut self, msg: &Rc<Message>) -> Rc<Message> {
        if msg.worth_compacting() {
            self.metrics.compactions += 1;
            Rc::new(msg.compacted())
        } else {
            msg.clone()
        }
    }
}

// Routing: the retained store, then local sessions and peers.
impl Broker {
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
            let stamp = self.retain_order.local(now);
            self.retain_order.admit(msg.topic.as_str(), stamp);
            if self.peers.any() {
                let seq = self.peers.stamp();
                self.ack_fence = Some((seq, false));
                self.peers.send_all(|| PeerEvent::Retain {
                    msg: msg.for_peer(),
                    seq,
                    stamp,
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
            self.ack_fence = Some((seq, true));
            self.peers.fenced_durable(seq);
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
        self.deliver_held(now, msg, scope, None)
    }

    /// [`Broker::deliver`] of a message a peer wrote to its store as `held`
    /// (peer, id): not queued again for a session served here from a copy
    /// of that peer's that held it (see `strand::Strands::held`).
    fn deliver_held(
        &mut self,
        now: Instant,
        msg: Rc<Message>,
        scope: Scope<'_>,
        held: Option<(PeerId, MsgId)>,
    ) -> usize {
        let sessions = &self.sessions;
        let online = |s: SessionId| sessions.get(s).is_some_and(|x| x.conn.is_some());
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
        for hit in routed.by_ref() {
            if !self.may_deliver(hit.session, msg.topic.as_str()) {
                continue;
            }
            if let Some((from, id)) = held {
                let had = self
                    .sessions
                    .get(hit.session)
                    .is_some_and(|s| self.strands.held(&s.client_id, from, id));
                if had {
                    self.metrics.forwarded_had += 1;
                    continue;
                }
                tracing::debug!(
                    client = ?self.sessions.get(hit.session).map(|s| &*s.client_id),
                    ?from,
                    payload = %payload_head(&msg.payload),
                    "an old owner's stored message queued in a session taken from it"
                );
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
            if self.moves.any() {
                if let Some(item) = self.moving_hit(now, hit.session, item) {
                    self.enqueue_with(now, hit.session, item, &mut compacted);
                }
                continue;
            }
            self.enqueue_with(now, hit.session, item, &mut compacted);
        }
        if self.peers.any_away() {
            let owners = self.stranded_for(&msg, &routed.forwards);
            if !owners.is_empty() {
                let forwards = std::mem::take(&mut routed.forwards);
                self.router.recycle(routed);
                return count + self.deliver_stranded(now, &msg, forwards, owners);
            }
        }
        // The last forward takes the message itself when nothing else
        // holds it (fan-in: no subscriber here), rather than a copy.
        let mut last = None;
        let id = msg.stored().get();
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
            let durable = msg.qos != QoS::AtMostOnce;
            if self.peers.crossed(f.peer, msg.size() as u64, durable) {
                // Its window is full: read the publisher again once the
                // peer confirms (see `peer::WINDOW`).
                self.hold_publisher(&msg);
            }
            if let Some((peer, direct, shares)) = last.replace((f.peer, f.direct, f.shares)) {
                let msg = msg.for_peer();
                self.peers.send(
                    peer,
                    PeerEvent::Publish {
                        msg,
                        direct,
                        shares,
                        id,
                    },
                );
            }
        }
        self.router.recycle(routed);
        if let Some((peer, direct, shares)) = last {
            let msg = Rc::try_unwrap(msg).map_or_else(|m| m.for_peer(), Message::into_peer);
            self.peers.send(
                peer,
                PeerEvent::Publish {
                    msg,
                    direct,
                    shares,
                    id,
                },
            );
        }
        count
    }
}

/// The start of a payload, for a debug line.
fn payload_head(p: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(&p[..p.len().min(24)])
}

/// A session served here from its copy, for the debug log: what it holds.
fn log_taken(client: &str, owner: Option<PeerId>, rs: &zerofan_store::RecoveredSession) {
    if tracing::enabled!(tracing::Level::DEBUG) {
        let text = |p: &bytes::Bytes| payload_head(p).into_owned();
        let queued: Vec<String> = rs
            .queue
            .iter()
            .take(64)
            .map(|e| text(&e.message.payload))
            .collect();
        let inflight: Vec<String> = rs
            .inflight
            .iter()
            .take(64)
            .filter_map(|f| f.entry.as_ref().map(|e| text(&e.message.payload)))
            .collect();
        tracing::debug!(
            client,
            ?owner,
            queued = rs.queue.len(),
            inflight = rs.inflight.len(),
            ?queued,
            ?inflight,
            "session taken from its copy"
        );
    }
}

// Messages for an away node's persistent sessions (see `strand`).
impl Broker {
    /// The away nodes whose persistent sessions `msg`, crossing as
    /// `forwards` say, is for too (none: it is not stranded). None when
    /// every other node is away: this one is cut off, what it would strand
    /// reaches nobody now, and would later add stale copies of sessions
    /// served all along elsewhere.
    #[cold]
    #[inline(never)]
    fn stranded_for(&self, msg: &Message, forwards: &[super::router::Forward]) -> Vec<PeerId> {
        if msg.qos == QoS::AtMostOnce || !self.durable.on() || self.peers.reachable().is_empty() {
            return Vec::new();
        }
        forwards
            .iter()
            .filter(|f| f.direct && self.peers.is_away(f.peer))
            .map(|f| f.peer)
            .collect()
    }

    /// [`Broker::deliver`]'s crossing when nodes with subscribers for
    /// `msg` are away (`owners`): the others get it as `Stranded` for
    /// their persistent sessions, the away nodes as usual, and the copies
    /// here of their sessions take it. Returns how many peers it crossed
    /// to for subscribers.
    #[cold]
    #[inline(never)]
    fn deliver_stranded(
        &mut self,
        now: Instant,
        msg: &Rc<Message>,
        forwards: Vec<super::router::Forward>,
        owners: Vec<PeerId>,
    ) -> usize {
        let size = msg.size() as u64;
        let mut count = 0;
        // One identity on every node, the away ones included, so that
        // copies that get the message twice keep it once.
        let mark = self.strands.mark(self.durable.count_ms(now));
        let id = msg.stored().get();
        let peers: Vec<PeerId> = self.peers.ids().collect();
        for peer in peers {
            let f = forwards.iter().find(|f| f.peer == peer);
            if f.is_some() {
                count += 1;
                self.metrics.peer_forwarded += 1;
            }
            // Sent all the same (an acknowledged message is never
            // dropped); its publisher waits until the peer drains. A node
            // not away counts as crossed, congested or not: if it goes away
            // before it confirms, the acknowledgement is refused. An away
            // one does not: what is stranded for it is kept here and in its
            // copies, so a later away marking of it refuses nothing.
            let durable = !self.peers.is_away(peer);
            let congested = self.peers.congested(peer);
            if self.peers.crossed(peer, size, durable) || congested {
                self.hold_publisher(msg);
            }
            let (direct, shares) = f.map_or((false, Vec::new()), |f| (f.direct, f.shares.clone()));
            let mut msg = msg.for_peer();
            msg.set_mark(mark);
            let event = if owners.contains(&peer) {
                PeerEvent::Publish {
                    msg,
                    direct,
                    shares,
                    id,
                }
            } else {
                PeerEvent::Stranded(Box::new(super::peer::Stranded {
                    owners: owners.clone(),
                    msg,
                    direct,
                    shares,
                }))
            };
            self.peers.send(peer, event);
        }
        self.metrics.stranded_sent += 1;
        self.strand_copies(now, &owners, msg, mark);
        let kept = self.keepable(msg);
        for &owner in &owners {
            self.metrics.stranded_forgotten +=
                self.strands.keep(owner, now, kept.clone(), mark) as u64;
        }
        count
    }

    /// A message for `owners`' sessions came from `from`: into the copies
    /// here, into the sessions here taken from them unless the sender sent
    /// it to the subscribers here anyway, and to those as usual.
    fn on_stranded(
        &mut self,
        now: Instant,
        from: PeerId,
        owners: &[PeerId],
        mut msg: Message,
        direct: bool,
        shares: &[Arc<str>],
    ) {
        self.metrics.peer_received += 1;
        self.peers.handled(from, msg.size() as u64);
        msg.arrived_from(from);
        self.strands.read(from, msg.mark());
        let msg = Rc::new(msg);
        self.strand_copies(now, owners, &msg, msg.mark());
        if !direct {
            self.strand_taken(now, owners, &msg);
        }
        if direct || !shares.is_empty() {
            self.deliver(now, msg, Scope::Forwarded { direct, shares });
        }
    }

    /// Queue `msg`, stranded as `mark`, in the copies here of `owners`'
    /// sessions.
    fn strand_copies(
        &mut self,
        now: Instant,
        owners: &[PeerId],
        msg: &Message,
        mark: Option<super::strand::Mark>,
    ) {
        if self.repl.images.len() == 0 {
            return;
        }
        let stored = Arc::new(to_stored(msg, &self.durable));
        let now_ms = self.durable.unix_ms(now);
        let bound = super::replica::QueueBound {
            messages: self.config.max_queued_messages,
            bytes: self.config.max_queued_bytes,
            drop_oldest: self.config.queue_full == QueueFull::DropOldest,
        };
        for &owner in owners {
            let done = self.repl.images.strand(
                owner,
                stored.clone(),
                mark,
                now_ms,
                bound,
                &mut self.durable,
            );
            self.metrics.stranded_kept += done.kept as u64;
            self.metrics.stranded_dropped += done.dropped as u64;
            self.metrics.store_errors += done.errors;
            let kept = done.kept;
            tracing::debug!(?owner, kept, dropped = done.dropped, ?mark,
                payload = %payload_head(&msg.payload),
                "stranded in the copies here");
        }
    }

    /// Queue `msg` for the sessions here taken from one of `owners` whose
    /// subscriptions match it.
    fn strand_taken(&mut self, now: Instant, owners: &[PeerId], msg: &Rc<Message>) {
        if !owners.is_empty() && !self.strands.any() {
            return;
        }
        let sessions = &self.sessions;
        let online = |s: SessionId| sessions.get(s).is_some_and(|x| x.conn.is_some());
        let scope = Scope::Forwarded {
            direct: true,
            shares: &[],
        };
        let mut routed =
            self.router
                .route(msg.topic.as_str(), None, msg.qos, msg.retain, scope, online);
        let mut hits = Vec::new();
        for hit in routed.by_ref() {
            let ours = self
                .sessions
                .get(hit.session)
                .is_some_and(|s| self.strands.is_for(&s.client_id, owners));
            if ours {
                hits.push(hit);
            }
        }
        self.router.recycle(routed);
        for hit in hits {
            if !self.may_deliver(hit.session, msg.topic.as_str()) {
                continue;
            }
            self.metrics.stranded_queued += 1;
            tracing::debug!(
                client = ?self.sessions.get(hit.session).map(|s| &*s.client_id),
                ?owners,
                payload = %payload_head(&msg.payload),
                "stranded queued in a session here"
            );
            let item = Queued {
                msg: msg.clone(),
                qos: hit.qos,
                retain: hit.retain,
                sub_ids: hit.sub_ids,
                share: None,
                entry: None,
                replay: false,
            };
            if self.moves.any() {
                if let Some(item) = self.moving_hit(now, hit.session, item) {
                    self.enqueue(now, hit.session, item);
                }
                continue;
            }
            self.enqueue(now, hit.session, item);
        }
    }

    /// `client`'s session is served here from the copy `owner` wrote: when
    /// that node is away (or gone), what others strand for it is the
    /// session's too.
    fn note_taken(&mut self, client: &str, owner: Option<PeerId>) {
        let away = owner.filter(|&o| !self.peers.is_live(o));
        self.strands.took(client, away);
    }
}

// Delivery: session queues, the inflight window, batches for the writer.
impl Broker {
    /// Put a message in a session's queue, within its bounds.
    pub(crate) fn enqueue(&mut self, now: Instant, sid: SessionId, item: Queued) {
        let mut cache = None;
        self.enqueue_with(now, sid, item, &mut cache);
    }

    /// [`Broker::enqueue`] sharing one compacted copy between every absent
    /// session of the same message.
    pub(crate) fn enqueue_with(
        &mut self,
        now: Instant,
        sid: SessionId,
        mut item: Queued,
        compacted: &mut Option<Rc<Message>>,
    ) {
        // Stored before any compaction copy, which then carries the id.
        self.dur_enqueue(sid, &mut item);
        let entry = item.entry;
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        if s.conn.is_none() {
            if item.qos == QoS::AtMostOnce {
                // QoS 0 is not kept for absent clients.
                return;
            }
            if item.msg.worth_compacting() {
                let copy = compacted.get_or_insert_with(|| {
                    self.metrics.compactions += 1;
                    Rc::new(item.msg.compacted())
                });
                item.msg = copy.clone();
            }
        }
        let cfg = &self.config;
        let origin = (item.msg.origin_peer, item.msg.origin);
        let outcome = if s.conn.is_some() {
            // A slow subscriber keeps no more than its high-water mark.
            let behind = s.behind();
            let bound = if behind.is_some_and(|b| b.slow) {
                high_water(cfg)
            } else if held_remote(behind, origin) {
                cfg.max_online_queued_bytes.saturating_add(HOLD_SLACK)
            } else {
                cfg.max_online_queued_bytes
            };
            s.push_online(item, bound, cfg.queue_full)
        } else {
            s.push(
                item,
                cfg.max_queued_messages,
                cfg.max_queued_bytes,
                cfg.queue_full,
            )
        };
        let conn = s.conn;
        if conn.is_some() && s.online_cost() > high_water(cfg) {
            self.fall_behind(now, sid, origin);
        }
        if entry.is_some() {
            self.dur_evicted(sid);
            if matches!(outcome, PushOutcome::DroppedNew | PushOutcome::Disconnect) {
                self.dur_dequeue(sid, entry);
            }
        }
        match outcome {
            PushOutcome::Queued => {}
            PushOutcome::DroppedOldQos0 | PushOutcome::DroppedNewQos0 => {
                self.metrics.dropped_qos0_queue_full += 1
            }
            PushOutcome::DroppedOldest | PushOutcome::DroppedNew => {
                self.metrics.dropped_queue_full += 1
            }
            PushOutcome::Disconnect => {
                self.metrics.dropped_queue_full += 1;
                self.disconnect_slow(now, conn, "queue full");
                return;
            }
        }
        if let Some(conn) = conn {
            self.wake(conn);
        }
    }

    /// Queue a retained message replayed for a new subscription of an
    /// online session: never dropped (see [`Session::push_replay`]), sent
    /// as the client's window and socket allow.
    ///
    /// [`Session::push_replay`]: super::session::Session::push_replay
    pub(crate) fn enqueue_replay(&mut self, sid: SessionId, mut item: Queued) {
        self.dur_enqueue(sid, &mut item);
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        s.push_replay(item);
        if let Some(conn) = s.conn {
            self.wake(conn);
        }
    }

    /// `sid`'s online queue is over its high-water mark: start its slow
    /// consumer clock, and stop reading the publisher of this message until
    /// it drains (not the subscriber itself: it could then never drain).
    fn fall_behind(
        &mut self,
        now: Instant,
        sid: SessionId,
        origin: (Option<PeerId>, Option<SessionId>),
    ) {
        let timeout = Duration::from_millis(self.config.slow_consumer_timeout_ms);
        let publisher = match origin {
            (None, Some(o)) => self.sessions.get(o).and_then(|p| p.conn),
            _ => None,
        };
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        let own = s.conn;
        let f = s.flight_mut();
        if f.behind.is_none() {
            f.behind = Some(Box::new(Behind {
                since: now,
                holding: Vec::new(),
                holding_remote: Vec::new(),
                slow: false,
            }));
            // A timeout too large for the clock never fires.
            if let Some(at) = now.checked_add(timeout) {
                self.timers.arm(at, Timer::SlowConsumer(sid));
            }
        }
        let Some(b) = f.behind.as_deref_mut() else {
            return;
        };
        if b.slow {
            return;
        }
        if let (Some(peer), Some(session)) = origin {
            // Published at another core: that core holds its publisher.
            if !b.holding_remote.contains(&(peer, session)) {
                b.holding_remote.push((peer, session));
                self.metrics.publisher_throttles += 1;
                self.peers.send(
                    peer,
                    PeerEvent::Hold {
                        session,
                        hold: true,
                    },
                );
            }
            return;
        }
        let Some(pc) = publisher.filter(|&pc| Some(pc) != own) else {
            return;
        };
        if !self.conns.contains_key(&pc) {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.held_by.entry(pc) {
            e.insert(sid);
            b.holding.push(pc);
            self.metrics.publisher_throttles += 1;
        }
    }

    /// `sid` caught up, went away or was dropped as slow: the publishers it
    /// held are read again.
    pub(crate) fn release_publishers(&mut self, sid: SessionId) {
        let (holding, remote) = match self
            .sessions
            .get_mut(sid)
            .and_then(|s| s.flight_any())
            .and_then(|f| f.behind.as_deref_mut())
        {
            Some(b) => (
                std::mem::take(&mut b.holding),
                std::mem::take(&mut b.holding_remote),
            ),
            None => return,
        };
        for (peer, session) in remote {
            self.peers.send(
                peer,
                PeerEvent::Hold {
                    session,
                    hold: false,
                },
            );
        }
        for pc in holding {
            if self.held_by.get(&pc) == Some(&sid) {
                self.held_by.remove(&pc);
                self.wake(pc);
            }
        }
    }

    /// [`Broker::release_publishers`], and the session is no longer behind.
    pub(crate) fn caught_up(&mut self, sid: SessionId) {
        self.release_publishers(sid);
        if let Some(f) = self.sessions.get_mut(sid).and_then(|s| s.flight_any()) {
            f.behind = None;
        }
    }

    /// The slow consumer timer of `sid` fired.
    pub(crate) fn on_slow_timer(&mut self, now: Instant, sid: SessionId) {
        let timeout = Duration::from_millis(self.config.slow_consumer_timeout_ms);
        let Some(s) = self.sessions.get(sid) else {
            return;
        };
        let Some(b) = s.flight().behind.as_deref() else {
            return;
        };
        if b.slow {
            return;
        }
        if b.since.checked_add(timeout).is_none_or(|at| at > now) {
            // Caught up and fell behind again since this timer was armed:
            // that episode armed a timer of its own.
            return;
        }
        let client = s.client_id.clone();
        let queued = s.online_cost();
        let conn = s.conn;
        self.metrics.slow_subscribers_dropped += 1;
        self.release_publishers(sid);
        if let Some(suppressed) = self.log_gate(now, "slow consumer") {
            tracing::warn!(
                client = &*client,
                queued,
                suppressed,
                "dropping a slow consumer"
            );
        }
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        if let Some(b) = s.flight_any().and_then(|f| f.behind.as_deref_mut()) {
            b.slow = true;
        }
        if self.config.queue_full == QueueFull::Disconnect {
            self.disconnect_slow(now, conn, "slow consumer");
        } else {
            let dropped = s.drop_qos0();
            self.metrics.dropped_qos0_queue_full += dropped as u64;
        }
    }

    /// `queue_full = "disconnect"`: close a subscriber that cannot keep up
    /// (0x97), counted.
    fn disconnect_slow(&mut self, now: Instant, conn: Option<ConnId>, what: &'static str) {
        if let Some(conn) = conn {
            self.metrics.slow_consumer_disconnects += 1;
            self.close_with(now, conn, ReasonCode::QUOTA_EXCEEDED, Some(what), true);
        }
    }

    /// The body of [`Broker::poll_transmit`].
    pub(crate) fn fill_batch(
        &mut self,
        now: Instant,
        conn: ConnId,
        out: &mut Vec<Outgoing>,
        max: usize,
    ) -> Transmit {
        let Some(c) = self.conns.get_mut(&conn) else {
            return Transmit::Gone;
        };
        c.woken = false;
        c.outbox.take_into(out, max);
        let sid = match c.phase() {
            Phase::Closing => {
                return if c.outbox.is_empty() {
                    Transmit::Close
                } else {
                    Transmit::Open
                };
            }
            Phase::AwaitingConnect | Phase::AwaitingTakeover | Phase::AwaitingAuth => {
                return Transmit::Open
            }
            Phase::Connected(sid) => sid,
        };
        let Some(s) = self.sessions.get_mut(sid) else {
            return Transmit::Open;
        };
        let window = usize::from(c.send_window);
        while out.len() < max {
            let Some(&pid) = s.flight().resend.front() else {
                break;
            };
            if s.flight()
                .inflight
                .len()
                .saturating_sub(s.flight().resend.len())
                >= window
            {
                break;
            }
            s.flight_mut().resend.pop_front();
            let Some(f) = s.flight().inflight.get(&pid) else {
                continue;
            };
            if f.state != InflightState::AwaitingAck {
                continue;
            }
            let mut d = make_delivery(c, &f.item, pid, now);
            d.dup = true;
            self.metrics.messages_sent += 1;
            self.metrics.messages_sent_by_qos[d.qos as usize] += 1;
            out.push(Outgoing::Publish(d));
        }
        while out.len() < max {
            let Some(front) = s.queue_front() else {
                // A burst is over: give its queue space back.
                s.release_queue_space(QUEUE_KEEP);
                break;
            };
            let next = if front.qos != QoS::AtMostOnce && s.flight().inflight.len() >= window {
                // Flow control: never more than the client's Receive Maximum
                // unacknowledged (MQTT-3.3.4-9). QoS 0 is not counted, so it
                // may go ahead of the waiting QoS 1/2 messages.
                s.pop_qos0()
            } else {
                s.pop()
            };
            let Some(item) = next else {
                break;
            };
            if item.msg.is_expired(now) {
                self.metrics.dropped_expired += 1;
                if let Some(e) = item.entry {
                    let client = &*s.client_id;
                    self.durable
                        .stage(&mut self.metrics.store_errors, |l| l.dequeue(client, e));
                }
                continue;
            }
            if c.protocol.is_v5() && !fits(c, &item, now) {
                // Never send more than the client's Maximum Packet Size; the
                // message is dropped as if delivered (MQTT-3.1.2-25).
                self.metrics.dropped_too_large += 1;
                if let Some(e) = item.entry {
                    let client = &*s.client_id;
                    self.durable
                        .stage(&mut self.metrics.store_errors, |l| l.dequeue(client, e));
                }
                continue;
            }
            // QoS 0 (never stored) has no packet id and nothing to stage or
            // hold: tested once, not three times per delivery.
            let (pid, hold) = if item.qos == QoS::AtMostOnce {
                (0, false)
            } else {
                let pid = s.alloc_packet_id();
                // A stored QoS 2 delivery goes out only once its `send`
                // record is durable: a restart then resends it with DUP and
                // the same packet id (deduplicated by the client), never as
                // a new message.
                if let Some(e) = item.entry {
                    let client = &*s.client_id;
                    self.durable
                        .stage(&mut self.metrics.store_errors, |l| l.send(client, e, pid));
                }
                (pid, item.entry.is_some() && item.qos == QoS::ExactlyOnce)
            };
            let d = if item.qos == QoS::AtMostOnce {
                // Nothing of it is kept: the delivery takes the message's
                // reference instead of one more up and down.
                into_delivery(c, item, now)
            } else {
                let d = make_delivery(c, &item, pid, now);
                let f = s.flight_mut();
                let seq = f.next_seq;
                f.next_seq += 1;
                s.flight_mut().inflight.insert(
                    pid,
                    Inflight {
                        item,
                        state: InflightState::AwaitingAck,
                        seq,
                    },
                );
                d
            };
            self.metrics.messages_sent += 1;
            self.metrics.payload_bytes_sent += d.message.payload.len() as u64;
            self.metrics.messages_sent_by_qos[d.qos as usize] += 1;
            self.metrics.payload_bytes_sent_by_qos[d.qos as usize] +=
                d.message.payload.len() as u64;
            if hold {
                self.durable.hold(conn, Outgoing::Publish(d));
            } else {
                out.push(Outgoing::Publish(d));
            }
        }
        if s.flight().behind.is_some() && s.online_cost() < low_water(&self.config) {
            self.caught_up(sid);
        }
        Transmit::Open
    }

    /// A shared-subscription member `from` leaves `share` (or just lost its
    /// connection, `keep_if_alone`): its queued and unacknowledged messages
    /// of that group go to other members.
    pub(crate) fn hand_over_shared(
        &mut self,
        now: Instant,
        from: SessionId,
        share: &str,
        keep_if_alone: bool,
    ) {
        self.dur_release_shared(from, share);
        let items = match self.sessions.get_mut(from) {
            Some(s) => s.take_shared(share),
            None => return,
        };
        for mut item in items {
            let sessions = &self.sessions;
            let online = |s: SessionId| sessions.get(s).is_some_and(|x| x.conn.is_some());
            let pick = self.router.other_member(share, from, online);
            if pick.is_none() && !keep_if_alone {
                // No member left here: one at another shard takes it.
                if let Some(peer) = self.router.peer_member(share) {
                    self.metrics.peer_forwarded += 1;
                    let event = PeerEvent::Publish {
                        msg: item.msg.for_peer(),
                        direct: false,
                        shares: vec![share.into()],
                        id: None,
                    };
                    self.peers.send(peer, event);
                    continue;
                }
            }
            match pick {
                Some(e) => {
                    item.qos = e.options.qos.min(item.msg.qos);
                    item.sub_ids = e.id.map(NonZeroU32::get).into_iter().collect();
                    self.enqueue(now, e.session, item);
                }
                None if keep_if_alone => {
                    self.dur_enqueue(from, &mut item);
                    let entry = item.entry;
                    if let Some(s) = self.sessions.get_mut(from) {
                        let cfg = &self.config;
                        let outcome = s.push(
                            item,
                            cfg.max_queued_messages,
                            cfg.max_queued_bytes,
                            cfg.queue_full,
                        );
                        if entry.is_some() {
                            self.dur_evicted(from);
                            if matches!(outcome, PushOutcome::DroppedNew | PushOutcome::Disconnect)
                            {
                                self.dur_dequeue(from, entry);
                            }
                        }
                    }
                }
                None => {}
            }
        }
    }

    /// Remove one of `sid`'s subscriptions from the router.
    pub(crate) fn trie_remove(&mut self, filter: &str, sid: SessionId) -> bool {
        self.router.unsubscribe(filter, sid)
    }
}

// Transmit: outboxes and wake-ups, what the shell writes.
impl Broker {
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

    /// Control packets waiting for the writer; the shell stops reading from
    /// a client that does not read its answers.
    pub fn outbox_len(&self, conn: ConnId) -> usize {
        self.conns.get(&conn).map_or(0, |c| c.outbox.len())
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
    #[inline]
    pub(crate) fn wake(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if !c.woken {
                c.woken = true;
                self.wakeups.push(conn);
            }
        }
    }
}

// Acknowledgements and durability: staging in the log, acks held for a commit, restore.
impl Broker {
    /// Attach a durable log (the broker then writes persistent sessions and
    /// retained messages to it). `now_unix_ms` is the wall clock at `now`,
    /// used only to convert deadlines to and from the store's UNIX time.
    pub fn set_durable_log(&mut self, log: Box<dyn DurableLog>, now: Instant, now_unix_ms: u64) {
        // Persistent sessions' operations are also recorded for replicas.
        let from = self.durable.attach(self.repl.wrap(log), now, now_unix_ms);
        self.repl.start_at(from);
        // Peers given first count from the same clock.
        self.peers.start_at(from);
    }

    /// The store's counters (log size, fsyncs, bytes written...), when a
    /// durable log is attached.
    pub fn store_stats(&self) -> Option<StoreStats> {
        self.durable.stats()
    }

    /// Count what opening the store repaired (a torn or corrupt tail cut
    /// off: `truncated_bytes` above 0).
    pub fn note_store_recovery(&mut self, truncated_bytes: u64) {
        if truncated_bytes > 0 {
            self.metrics.store_torn_tails += 1;
            self.metrics.store_truncated_bytes += truncated_bytes;
        }
    }

    /// Acknowledgements held until their commit is durable.
    pub fn held_acks(&self) -> usize {
        self.durable.held_acks()
    }

    /// The store made progress: every held acknowledgement whose commit is
    /// now durable goes to its connection's outbox. Call
    /// [`Broker::take_wakeups`] afterwards.
    pub fn release_durable(&mut self) {
        let Some(durable) = self.durable.durable_lsn() else {
            return;
        };
        while let Some((conn, out)) = self.durable.pop_released_ack(durable) {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.outbox.push_back(out);
                self.wake(conn);
            }
        }
        while let Some((peer, seq)) = self.durable.pop_released_seen(durable) {
            self.peers.send(peer, super::peer::PeerEvent::Seen { seq });
        }
        while let Some((peer, seq)) = self.durable.pop_released_replica_ack(durable) {
            self.peers
                .send(peer, super::peer::PeerEvent::ReplicaAck { seq });
        }
    }

    /// Answer a peer's change `seq` (a `Fence`, an interest, a retained
    /// message) with `Seen` once everything this core wrote so far (for
    /// the peer's earlier messages among it) is durable, in order.
    pub(crate) fn durable_seen(&mut self, from: super::peer::PeerId, seq: u64) {
        if self.moves.gates() {
            if let Some(Answer::Seen(from, seq)) = self.move_gate(Answer::Seen(from, seq)) {
                self.durable_seen_unmoved(from, seq);
            }
            return;
        }
        self.durable_seen_unmoved(from, seq);
    }

    /// [`Broker::durable_seen`], no move in the way.
    fn durable_seen_unmoved(&mut self, from: super::peer::PeerId, seq: u64) {
        // What this link read changed so far (the peer's publishes before
        // its fence, queued in persistent sessions) goes to the replicas
        // now, not at the read's end: `Seen` promises it, so it waits for
        // their answers too.
        if self.repl.reading() && self.repl.has_recorded() {
            self.flush_replication();
        }
        // And once the replicas have what this node replicated so far.
        if self.replica_holds_seen(from, seq) {
            return;
        }
        self.durable_seen_now(from, seq);
    }

    /// [`Broker::durable_seen`], replicas answered.
    fn durable_seen_now(&mut self, from: super::peer::PeerId, seq: u64) {
        if !self.durable.hold_seen(from, seq) {
            self.peers.send(from, super::peer::PeerEvent::Seen { seq });
        }
    }

    /// Send the PUBACK / PUBREC of an inbound PUBLISH: at once when nothing
    /// was written for it, else once its commit is durable.
    pub(crate) fn send_publish_ack(&mut self, conn: ConnId, out: Outgoing) {
        if self.moves.gates() {
            if let Some(Answer::Ack(conn, out)) = self.move_gate(Answer::Ack(conn, out)) {
                self.send_publish_ack_unmoved(conn, out);
            }
            return;
        }
        self.send_publish_ack_unmoved(conn, out);
    }

    /// [`Broker::send_publish_ack`], no move in the way.
    fn send_publish_ack_unmoved(&mut self, conn: ConnId, out: Outgoing) {
        // Behind this connection's answers that wait for the replicas (or
        // a renewal of the lease): with this event's changes, which it may
        // promise too (see `flush_replication`).
        if self.repl.holds(conn) || self.lease.holds(conn) {
            self.durable.hold(conn, out);
            return;
        }
        let Some(out) = self.durable.hold_ack(conn, out) else {
            return;
        };
        if let Some(c) = self.conns.get_mut(&conn) {
            c.outbox.push_back(out);
            self.wake(conn);
        }
    }

    /// The end of a core event: commit what it staged (once) and hold its
    /// acknowledgements until that commit is durable.
    #[inline]
    pub(crate) fn end_event(&mut self) {
        // Once per packet: with no replicas, nothing deferred and nothing
        // staged (a QoS 0 publish on one shard), it costs three tests.
        if !self.repl.on() && !self.peers.has_deferred() && self.durable.idle() {
            return;
        }
        self.end_event_slow();
    }

    fn end_event_slow(&mut self) {
        if self.repl.defer_end() {
            return;
        }
        self.flush_replication();
        // What waited for peers that are all away now goes (see
        // `Broker::set_peer_away`).
        let ready = self.peers.ready();
        self.release_deferred(ready);
        match self.durable.end_event(&mut self.metrics.store_errors) {
            EventEnd::Idle | EventEnd::Committed => {}
            EventEnd::SendNow(pending) => {
                for (conn, out) in pending {
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.outbox.push_back(out);
                        self.wake(conn);
                    }
                }
            }
            EventEnd::Release => self.release_durable(),
        }
    }

    // ----- staging hooks, called from the protocol handlers ---------------

    /// The stored id of `msg`, writing it if it was not yet.
    fn stored_msg(&mut self, msg: &Message) -> Option<MsgId> {
        if let Some(id) = msg.stored().get() {
            return Some(id);
        }
        let stored = to_stored(msg, &self.durable);
        let id = self
            .durable
            .stage(&mut self.metrics.store_errors, |l| l.put_message(&stored))?;
        msg.stored().set(id);
        Some(id)
    }

    /// A retained message was set.
    pub(crate) fn dur_set_retained(&mut self, msg: &Message) {
        if !self.durable.on() {
            return;
        }
        if let Some(id) = self.stored_msg(msg) {
            let topic = msg.topic.as_str();
            self.durable.stage(&mut self.metrics.store_errors, |l| {
                l.set_retained(topic, id)
            });
        }
    }

    /// A retained message was cleared.
    pub(crate) fn dur_clear_retained(&mut self, topic: &str) {
        if self.durable.on() {
            self.durable
                .stage(&mut self.metrics.store_errors, |l| l.clear_retained(topic));
        }
    }

    /// Give `item` a queue entry in `sid`'s stored queue if the session is
    /// persistent and the item is QoS 1/2. Returns the client id used.
    pub(crate) fn dur_enqueue(&mut self, sid: SessionId, item: &mut Queued) {
        if !self.durable.on() || item.qos == QoS::AtMostOnce || item.entry.is_some() {
            return;
        }
        if self
            .sessions
            .get(sid)
            .is_none_or(|s| s.expiry_interval == 0)
        {
            return;
        }
        let Some(msg) = self.stored_msg(&item.msg) else {
            return;
        };
        if self.repl.wants_message(msg) {
            self.repl
                .note_message(msg, to_stored(&item.msg, &self.durable));
        }
        if let Some(mark) = item.msg.mark() {
            self.repl.note_mark(msg, mark);
        }
        let mut entry = QueueEntry {
            msg,
            qos: item.qos as u8,
            retain: item.retain,
            subscription_ids: item.sub_ids.clone(),
            share: item.share.as_deref().map(str::to_owned),
        };
        // The id borrowed, not copied: this runs for every stored message.
        let Some(s) = self.sessions.get(sid) else {
            return;
        };
        let client = &*s.client_id;
        let errors = &mut self.metrics.store_errors;
        let mut id = self
            .durable
            .try_stage(|l| l.enqueue(client, &entry))
            .and_then(Result::ok);
        if id.is_none() {
            // The message id may be stale (a retained message replaced since):
            // write the message again and retry once.
            let stored = to_stored(&item.msg, &self.durable);
            if let Some(m) = self.durable.stage(errors, |l| l.put_message(&stored)) {
                entry.msg = m;
                id = self.durable.stage(errors, |l| l.enqueue(client, &entry));
            }
        }
        item.entry = id;
    }

    /// Queue entries of `sid` evicted to make room: dequeue them.
    pub(crate) fn dur_evicted(&mut self, sid: SessionId) {
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        if s.flight().evicted.is_empty() {
            return;
        }
        let evicted = s
            .flight_any()
            .map(|f| std::mem::take(&mut f.evicted))
            .unwrap_or_default();
        let client = &*s.client_id;
        for e in evicted {
            self.durable
                .stage(&mut self.metrics.store_errors, |l| l.dequeue(client, e));
        }
    }

    /// A queue entry of `sid` was not queued after all, or left unsent.
    pub(crate) fn dur_dequeue(&mut self, sid: SessionId, entry: Option<EntryId>) {
        let Some(e) = entry else { return };
        let Some(s) = self.sessions.get(sid) else {
            return;
        };
        self.durable.stage(&mut self.metrics.store_errors, |l| {
            l.dequeue(&s.client_id, e)
        });
    }

    /// A stored delivery of `sid` ended (PUBACK, PUBCOMP, refused PUBREC,
    /// handed over).
    pub(crate) fn dur_complete(&mut self, sid: SessionId, pid: u16) {
        let Some(s) = self.sessions.get(sid) else {
            return;
        };
        self.durable.stage(&mut self.metrics.store_errors, |l| {
            l.complete(&s.client_id, pid)
        });
    }

    /// PUBREC for a stored QoS 2 delivery.
    pub(crate) fn dur_pubrec(&mut self, sid: SessionId, pid: u16) {
        let Some(s) = self.sessions.get(sid) else {
            return;
        };
        self.durable.stage(&mut self.metrics.store_errors, |l| {
            l.pubrec(&s.client_id, pid)
        });
    }

    /// Stage `f` with the client id of `sid` if the session is persistent
    /// and a log is attached. The id is lent, not copied: some of these run
    /// for every stored message.
    fn stage_persistent(
        &mut self,
        sid: SessionId,
        f: impl FnOnce(&mut dyn DurableLog, &str) -> Result<(), zerofan_store::StoreError>,
    ) {
        if !self.durable.on() {
            return;
        }
        let Some(s) = self.sessions.get(sid).filter(|s| s.expiry_interval > 0) else {
            return;
        };
        self.durable
            .stage(&mut self.metrics.store_errors, |l| f(l, &s.client_id));
    }

    /// An inbound QoS 2 packet id was taken by `sid`.
    pub(crate) fn dur_qos2_received(&mut self, sid: SessionId, pid: u16) {
        self.stage_persistent(sid, |l, client| l.qos2_received(client, pid));
    }

    /// PUBREL for an inbound QoS 2 packet id of `sid`.
    pub(crate) fn dur_qos2_released(&mut self, sid: SessionId, pid: u16) {
        self.stage_persistent(sid, |l, client| l.qos2_released(client, pid));
    }

    /// A connection attached to `sid` (after CONNECT set its expiry): keep
    /// the session (no deadline while connected) or make sure the store has
    /// none. `cancelled_will`: a will waiting for its delay was cancelled.
    pub(crate) fn dur_connected(&mut self, sid: SessionId, cancelled_will: bool) {
        if !self.durable.on() {
            return;
        }
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        let client = s.client_id.clone();
        let errors = &mut self.metrics.store_errors;
        if s.expiry_interval == 0 {
            // Not persistent (any more): the store keeps nothing of it.
            if s.stored {
                s.stored = false;
                forget_entries(s);
                self.durable.stage(errors, |l| l.drop_session(&client));
            }
            return;
        }
        s.stored = true;
        let meta = SessionMeta {
            expiry_interval: s.expiry_interval,
            expires_at_ms: None,
        };
        self.durable.stage(errors, |l| l.put_session(&client, meta));
        if cancelled_will {
            self.durable.stage(errors, |l| l.clear_will(&client));
        }
    }

    /// A persistent session lost its connection: its expiry deadline, and
    /// its will if it waits for a delay.
    pub(crate) fn dur_detached(&mut self, sid: SessionId) {
        if !self.durable.on() {
            return;
        }
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        if s.expiry_interval == 0 {
            return;
        }
        let client = s.client_id.clone();
        let meta = SessionMeta {
            expiry_interval: s.expiry_interval,
            expires_at_ms: s
                .expires_at(self.started)
                .map(|at| self.durable.unix_ms(at)),
        };
        let will = s
            .pending_will()
            .map(|w| stored_will(&w.will, &self.durable, self.durable.unix_ms(w.at), None));
        // The replicas' armed will went with the connection unless it is
        // pending now (replaced below).
        let disarmed = std::mem::take(&mut s.will_armed) && will.is_none();
        let errors = &mut self.metrics.store_errors;
        self.durable.stage(errors, |l| l.put_session(&client, meta));
        if let Some(w) = will {
            self.durable.stage(errors, |l| l.set_will(&client, &w));
        } else if disarmed {
            self.durable.stage(errors, |l| l.clear_will(&client));
        }
    }

    /// In a cluster: the client of persistent session `sid` connected with
    /// a will. Its replicas keep it armed, so that one of them publishes
    /// it should this node die with the client connected (see
    /// `replica::orphans`); this node's own store does not (the `Mirror`
    /// keeps it from the store): after a restart here the session is
    /// another node's or its client's again.
    pub(crate) fn dur_will_armed(&mut self, sid: SessionId) {
        if !self.durable.on() || !self.repl.on() {
            return;
        }
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        if !s.stored || s.expiry_interval == 0 {
            return;
        }
        let will = s
            .conn
            .and_then(|c| self.conns.get(&c))
            .and_then(|c| c.will.as_deref());
        let Some(will) = will else {
            if std::mem::take(&mut s.will_armed) {
                let client = s.client_id.clone();
                self.durable
                    .stage(&mut self.metrics.store_errors, |l| l.clear_will(&client));
            }
            return;
        };
        s.will_armed = true;
        let w = armed_will(will, &self.durable);
        let client = s.client_id.clone();
        self.durable
            .stage(&mut self.metrics.store_errors, |l| l.set_will(&client, &w));
    }

    /// A will waiting for its delay was published.
    pub(crate) fn dur_will_published(&mut self, sid: SessionId) {
        self.stage_persistent(sid, |l, client| l.clear_will(client));
    }

    /// A session ended (clean start, expiry, not persistent any more);
    /// `stored`: the store has a record of it.
    pub(crate) fn dur_session_ended(&mut self, client_id: &str, stored: bool) {
        if stored && self.durable.on() {
            self.durable.stage(&mut self.metrics.store_errors, |l| {
                l.drop_session(client_id)
            });
        }
    }

    /// A subscription of `sid` was added or replaced.
    pub(crate) fn dur_subscribed(&mut self, sid: SessionId, filter: &str, record: SubRecord) {
        let options = sub_options(&record.options);
        let id = record.id.map(NonZeroU32::get);
        self.stage_persistent(sid, |l, client| l.subscribe(client, filter, options, id));
    }

    /// A subscription of `sid` was removed.
    pub(crate) fn dur_unsubscribed(&mut self, sid: SessionId, filter: &str) {
        self.stage_persistent(sid, |l, client| l.unsubscribe(client, filter));
    }

    /// Before `share`'s items leave `from` (hand-over): their stored entries
    /// and inflight deliveries in `from` end; the receiving member stores
    /// its own (in the same commit).
    pub(crate) fn dur_release_shared(&mut self, from: SessionId, share: &str) {
        if !self.durable.on() {
            return;
        }
        let Some(s) = self.sessions.get_mut(from) else {
            return;
        };
        let mut pids = Vec::new();
        let mut entries = Vec::new();
        for (pid, f) in &s.flight().inflight {
            if f.state == InflightState::AwaitingAck
                && f.item.share.as_deref() == Some(share)
                && f.item.entry.is_some()
            {
                pids.push(*pid);
            }
        }
        for q in s.queue_iter_mut() {
            if q.share.as_deref() == Some(share) {
                if let Some(e) = q.entry.take() {
                    entries.push(e);
                }
            }
        }
        for f in s.flight.iter_mut().flat_map(|fl| fl.inflight.values_mut()) {
            if f.state == InflightState::AwaitingAck && f.item.share.as_deref() == Some(share) {
                f.item.entry = None;
            }
        }
        let client = &*s.client_id;
        let errors = &mut self.metrics.store_errors;
        for pid in pids {
            self.durable.stage(errors, |l| l.complete(client, pid));
        }
        for e in entries {
            self.durable.stage(errors, |l| l.dequeue(client, e));
        }
    }

    // ----- recovery ---------------------------------------------------------

    /// Rebuild retained messages and persistent sessions from what the
    /// store held, then run every deadline that passed while the broker was
    /// down (expired sessions go, overdue wills are published).
    pub fn restore(&mut self, mut recovered: Recovered, now: Instant) {
        // A replica's copies of other nodes' sessions are not sessions here.
        self.metrics.store_errors += self
            .repl
            .images
            .restore(&mut recovered.sessions, &mut self.durable);
        let mut messages: HashMap<u64, Rc<Message>> = HashMap::default();
        let mut damaged = 0u64;
        for r in recovered.retained {
            match self.restored_message(&mut messages, r.msg, &r.message) {
                Some(m) => self.store.set(m),
                None => damaged += 1,
            }
        }
        for rs in recovered.sessions {
            let Ok(client_id) = MqttStr::try_from(rs.client_id.as_str()) else {
                damaged += 1;
                continue;
            };
            if self.sessions.has_client(&client_id) {
                continue;
            }
            let protocol = if rs.meta.expiry_interval == u32::MAX {
                Protocol::V311
            } else {
                Protocol::V5
            };
            let mut s = Session::new(client_id.as_str().into(), protocol);
            s.expiry_interval = rs.meta.expiry_interval;
            s.stored = true;
            // Routed once the session has its id (its slot), below.
            let mut routes = Vec::with_capacity(rs.subscriptions.len());
            for sub in &rs.subscriptions {
                let Some(qos) = QoS::from_u8(sub.options.qos) else {
                    damaged += 1;
                    continue;
                };
                let options = SubscriptionOptions {
                    qos,
                    no_local: sub.options.no_local,
                    retain_as_published: sub.options.retain_as_published,
                    retain_handling: sub.options.retain_handling,
                };
                routes.push((&sub.filter, options, sub.id.and_then(NonZeroU32::new)));
                s.subscriptions.insert(
                    sub.filter.as_str().into(),
                    SubRecord {
                        options,
                        id: sub.id.and_then(NonZeroU32::new),
                    },
                );
            }
            for e in &rs.queue {
                let Some(item) = self.restored_item(&mut messages, e) else {
                    damaged += 1;
                    continue;
                };
                let _ = s.push(
                    item,
                    usize::MAX,
                    usize::MAX,
                    crate::config::QueueFull::DropNew,
                );
            }
            for f in &rs.inflight {
                let (item, state) = match (&f.entry, f.phase) {
                    (Some(e), zerofan_store::InflightPhase::PublishSent) => {
                        match self.restored_item(&mut messages, e) {
                            Some(item) => (item, InflightState::AwaitingAck),
                            None => {
                                damaged += 1;
                                continue;
                            }
                        }
                    }
                    _ => (placeholder(), InflightState::AwaitingComp),
                };
                let fl = s.flight_mut();
                let seq = fl.next_seq;
                fl.next_seq += 1;
                s.flight_mut()
                    .inflight
                    .insert(f.packet_id, Inflight { item, state, seq });
            }
            if !rs.incoming_qos2.is_empty() {
                s.flight_mut()
                    .incoming_qos2
                    .extend(rs.incoming_qos2.iter().copied());
            }
            if let Some(w) = &rs.will {
                match will_from_stored(w, &self.durable) {
                    Some(will) => {
                        // Armed (a copy of a dead node's session, its client
                        // connected there): its connection is lost as of now.
                        let at = match w.armed {
                            Some(delay) => {
                                let wait = super::message::will_wait(delay, s.expiry_interval);
                                super::message::later(now, wait).unwrap_or(now)
                            }
                            None => self.durable.instant(w.due_at_ms),
                        };
                        s.set_pending_will(Box::new(PendingWill { will, at }));
                    }
                    None => damaged += 1,
                }
            }
            // No deadline stored: the session was connected when the broker
            // stopped; its expiry counts from now.
            let at = match rs.meta.expires_at_ms {
                Some(ms) => Some(self.durable.instant(ms)),
                None if s.expiry_interval != u32::MAX => {
                    let at = super::message::later(now, s.expiry_interval);
                    if let Some(at) = at {
                        let meta = SessionMeta {
                            expiry_interval: s.expiry_interval,
                            expires_at_ms: Some(self.durable.unix_ms(at)),
                        };
                        let client = rs.client_id.as_str();
                        self.durable.stage(&mut self.metrics.store_errors, |l| {
                            l.put_session(client, meta)
                        });
                    }
                    at
                }
                None => None,
            };
            if let Some(at) = at {
                s.set_expires_at(self.started, Some(at));
            }
            let will_at = s.pending_will().map(|w| w.at);
            let Some(sid) = self.sessions.insert(s) else {
                // 2^32 - 1 sessions held.
                damaged += 1;
                continue;
            };
            for (filter, options, id) in routes {
                let entry = SubEntry {
                    session: sid,
                    options,
                    id,
                };
                self.router.subscribe(filter, entry);
            }
            if let Some(at) = will_at {
                self.timers.arm(at, Timer::Will(sid));
            }
            if let Some(at) = at {
                self.timers.arm(at, Timer::SessionExpiry(sid));
            }
        }
        if damaged > 0 {
            tracing::warn!(
                damaged,
                "store records that could not be restored were skipped"
            );
        }
        self.metrics.store_restore_skipped += damaged;
        self.handle_timeout(now);
        self.end_event();
    }

    fn restored_message(
        &mut self,
        cache: &mut HashMap<u64, Rc<Message>>,
        id: MsgId,
        stored: &StoredMessage,
    ) -> Option<Rc<Message>> {
        if let Some(m) = cache.get(&id.0) {
            return Some(m.clone());
        }
        let m = from_stored(stored, &self.durable)?;
        m.stored().set(id);
        let m = Rc::new(m);
        cache.insert(id.0, m.clone());
        Some(m)
    }

    fn restored_item(
        &mut self,
        cache: &mut HashMap<u64, Rc<Message>>,
        e: &zerofan_store::RecoveredEntry,
    ) -> Option<Queued> {
        let msg = self.restored_message(cache, e.entry.msg, &e.message)?;
        Some(Queued {
            msg,
            qos: QoS::from_u8(e.entry.qos)?,
            retain: e.entry.retain,
            sub_ids: e.entry.subscription_ids.clone(),
            share: e.entry.share.as_deref().map(Arc::from),
            entry: Some(e.id),
            replay: false,
        })
    }
}

// SUBSCRIBE and UNSUBSCRIBE, with retained messages.
impl Broker {
    /// SUBSCRIBE from a client.
    pub(crate) fn on_subscribe(
        &mut self,
        now: Instant,
        conn: ConnId,
        sid: SessionId,
        sub: Subscribe,
    ) {
        if self.subscribe_waits(now, conn, sid, &sub) {
            return;
        }
        let v5 = self.conns.get(&conn).is_some_and(|c| c.protocol.is_v5());
        let bridge = self.conns.get(&conn).is_some_and(|c| c.bridge);
        let sub_id = sub.properties.subscription_identifiers.first().copied();
        let mut reasons = Vec::with_capacity(sub.filters.len());
        let mut replay = Replay {
            now,
            sub_id,
            filters: Vec::new(),
        };
        for (filter, options) in &sub.filters {
            let mut options = *options;
            let valid = zerofan_codec::topic::validate_topic_filter(filter).is_ok()
                && filter.split('/').count() <= self.config.max_topic_levels + 2;
            if !valid {
                reasons.push(if v5 {
                    ReasonCode::TOPIC_FILTER_INVALID
                } else {
                    ReasonCode::UNSPECIFIED_ERROR
                });
                continue;
            }
            if let Some(code) = self.subscribe_refused(now, conn, sid, filter, v5) {
                reasons.push(code);
                continue;
            }
            let (held, is_new) = self.sessions.get(sid).map_or((0, true), |s| {
                let subs = &s.subscriptions;
                (subs.len(), !subs.contains_key(filter.as_str()))
            });
            let q = super::quota::subscription_refused(
                &self.config,
                held,
                is_new,
                v5,
                &mut self.metrics.security,
            );
            if let Some(code) = q {
                reasons.push(code);
                continue;
            }
            let shared = zerofan_codec::topic::split_shared(filter);
            if shared.is_some() && options.no_local {
                // MQTT-3.8.3-4.
                self.protocol_error(now, conn, "No Local on a shared subscription");
                return;
            }
            if bridge && shared.is_none() {
                // What mosquitto does for a bridge: none of its own messages
                // back, and the retain flag as published.
                options.no_local = true;
                options.retain_as_published = true;
            }
            let record = SubRecord {
                options,
                id: sub_id.and_then(NonZeroU32::new),
            };
            let Some(s) = self.sessions.get_mut(sid) else {
                return;
            };
            let is_new = s
                .subscriptions
                .insert(filter.as_str().into(), record)
                .is_none();
            let entry = SubEntry {
                session: sid,
                options,
                // The codec refuses an identifier of 0 (a protocol error):
                // none is lost by keeping it as non-zero.
                id: sub_id.and_then(NonZeroU32::new),
            };
            self.dur_subscribed(sid, filter, record);
            self.router.subscribe(filter, entry);
            match shared {
                Some(_) => {}
                None => {
                    // Retained messages: always (0), only for a new
                    // subscription (1), never (2) (MQTT-3.3.1-9..11). Not for
                    // shared subscriptions (MQTT-3.8.4-? / 4.8.2).
                    let wanted = match options.retain_handling {
                        0 => true,
                        1 => is_new,
                        _ => false,
                    };
                    if wanted && self.config.retain_available {
                        replay.filters.push((filter.as_str().into(), options));
                    }
                }
            }
            reasons.push(ReasonCode(options.qos as u8));
            if self.events.on() {
                let id = self.sessions.get(sid).map(|s| &*s.client_id);
                self.events
                    .subscription(id, filter, Some(options.qos as u8), false);
            }
        }
        let suback = Packet::SubAck(SubAck {
            packet_id: sub.packet_id,
            properties: Default::default(),
            reasons,
        });
        let suback = Outgoing::from_packet(suback);
        match self.announce() {
            // A filter new to this shard: the SUBACK (and the retained
            // messages after it) waits until every shard routes the filter
            // here, so that a publish after it anywhere arrives.
            Some(seq) => self.defer_for_peers(seq, conn, Deferred::SubAck(suback, sid, replay)),
            None => self.subscribed(conn, sid, suback, replay),
        }
    }

    /// Send a SUBACK, then the retained messages the subscription replays.
    /// They are looked up now, not when the SUBSCRIBE arrived: a SUBACK
    /// that waited for the other shards has by now applied every retained
    /// message they routed before they knew of the subscription.
    pub(crate) fn subscribed(
        &mut self,
        conn: ConnId,
        sid: SessionId,
        suback: Outgoing,
        replay: Replay,
    ) {
        self.send_outgoing(conn, suback);
        let mut found = Vec::new();
        for (filter, options) in &replay.filters {
            found.clear();
            self.store.matching(filter, &mut found);
            for msg in found.drain(..) {
                if msg.is_expired(replay.now) || !self.may_deliver(sid, msg.topic.as_str()) {
                    continue;
                }
                let item = Queued {
                    qos: options.qos.min(msg.qos),
                    msg,
                    // A retained message sent because of a subscription
                    // keeps RETAIN=1 (MQTT-3.3.1-8 / 3.3.1-9).
                    retain: true,
                    sub_ids: replay.sub_id.into_iter().collect(),
                    share: None,
                    entry: None,
                    replay: true,
                };
                self.enqueue_replay(sid, item);
            }
        }
    }

    /// UNSUBSCRIBE from a client.
    pub(crate) fn on_unsubscribe(
        &mut self,
        now: Instant,
        conn: ConnId,
        sid: SessionId,
        unsub: Unsubscribe,
    ) {
        let v5 = self.conns.get(&conn).is_some_and(|c| c.protocol.is_v5());
        let mut reasons = Vec::with_capacity(unsub.filters.len());
        for filter in &unsub.filters {
            let existed = self
                .sessions
                .get_mut(sid)
                .is_some_and(|s| s.subscriptions.remove(filter.as_str()).is_some());
            if existed {
                if self.events.on() {
                    let id = self.sessions.get(sid).map(|s| &*s.client_id);
                    self.events.subscription(id, filter, None, true);
                }
                self.dur_unsubscribed(sid, filter);
                if filter.starts_with("$share/") {
                    self.hand_over_shared(now, sid, filter, false);
                }
                self.trie_remove(filter, sid);
            }
            reasons.push(if existed {
                ReasonCode::SUCCESS
            } else {
                ReasonCode::NO_SUBSCRIPTION_EXISTED
            });
        }
        self.send(
            conn,
            Packet::UnsubAck(UnsubAck {
                packet_id: unsub.packet_id,
                properties: Default::default(),
                reasons: if v5 { reasons } else { Vec::new() },
            }),
        );
    }
}

// Time: keep alive, expiry and other deadlines, shutdown.
impl Broker {
    /// When [`Broker::handle_timeout`] next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Run every deadline that is due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.check_lease(now);
        while let Some(timer) = self.timers.pop_due(now) {
            match timer {
                Timer::ConnectTimeout(conn)
                    if self.conns.get(&conn).is_some_and(|c| {
                        matches!(c.phase(), Phase::AwaitingConnect | Phase::AwaitingAuth)
                    }) =>
                {
                    self.metrics.connect_timeouts += 1;
                    self.close(now, conn, None, false);
                }
                // Connected (or gone) by now: keep alive has its own entry.
                Timer::ConnectTimeout(_) => {}
                Timer::KeepAlive(conn) => {
                    let Some(c) = self.conns.get(&conn) else {
                        continue;
                    };
                    if c.session().is_none() {
                        continue;
                    }
                    if self.held(conn) {
                        // Not read because of a slow subscriber: its silence
                        // is ours, so the time held counts as activity.
                        let at = self.stamp(now);
                        if let Some(c) = self.conns.get_mut(&conn) {
                            c.touch(at);
                            if let Some(at) = c.keep_alive_deadline(self.started) {
                                self.timers.arm(at, Timer::KeepAlive(conn));
                            }
                        }
                        continue;
                    }
                    let Some(c) = self.conns.get(&conn) else {
                        continue;
                    };
                    match c.keep_alive_deadline(self.started) {
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
                        .get(sid)
                        .and_then(|s| s.pending_will())
                        .is_some_and(|w| w.at <= now);
                    if due {
                        if let Some(w) = self
                            .sessions
                            .get_mut(sid)
                            .and_then(|s| s.take_pending_will())
                        {
                            self.publish_will(now, w.will);
                            self.dur_will_published(sid);
                        }
                    }
                }
                Timer::SessionExpiry(sid) => {
                    // One that moved away ends when its relay does.
                    let expired = self.moves.leaving(sid).is_none()
                        && self.sessions.get(sid).is_some_and(|s| {
                            s.conn.is_none()
                                && s.expires_at(self.started).is_some_and(|at| at <= now)
                        });
                    if expired {
                        if self.events.on() {
                            let id = self.sessions.get(sid).map(|s| &*s.client_id);
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
                Timer::Moves => self.moves_overdue(now),
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
        let ids: Vec<ConnId> = self.conns.keys().collect();
        for conn in ids {
            self.close(now, conn, Some(ReasonCode::SERVER_SHUTTING_DOWN), false);
        }
        self.end_event();
    }
}

// Time: the $SYS tree.
impl Broker {
    /// Publish every `$SYS/` figure now.
    pub(crate) fn publish_sys(&mut self, now: Instant) {
        let uptime = now.saturating_duration_since(self.started).as_secs();
        let mut connected = self
            .conns
            .values()
            .filter(|c| c.session().is_some())
            .count();
        let mut sessions = self.sessions.len();
        let totals;
        let (m, st) = match &self.others {
            // Several shards: this one reports for all of them.
            Some(o) => {
                let mut all = self.shard_figures();
                all.add(o);
                connected += o.gauges.sessions_online;
                sessions += o.gauges.sessions_online + o.gauges.sessions_offline;
                totals = all;
                (&totals.metrics, &totals.shell)
            }
            None => (&self.metrics, &self.shell_stats),
        };
        let figures = sys_figures(m, st, uptime, connected, sessions, self.store.len());
        for (name, value) in figures {
            let Ok(topic) = MqttStr::try_from(format!("$SYS/broker/{name}")) else {
                continue;
            };
            let msg = Message::owned(
                topic,
                Bytes::from(value),
                QoS::AtMostOnce,
                true,
                Default::default(),
                None,
            );
            self.route_sys(now, Rc::new(msg));
        }
    }

    /// A retained message from the broker itself (a bridge's state or
    /// figures), routed as a `$SYS/` figure is; a topic that is not a
    /// valid topic name is ignored.
    pub fn publish_own(&mut self, now: Instant, topic: &str, payload: Bytes) {
        let Ok(topic) = MqttStr::try_from(topic) else {
            return;
        };
        let msg = Message::owned(
            topic,
            payload,
            QoS::AtMostOnce,
            true,
            Default::default(),
            None,
        );
        // Published once per change (a bridge's state): every shard keeps
        // it, so that a later subscription on any of them sees it.
        let stamp = self.retain_order.local(now);
        self.retain_order.admit(msg.topic.as_str(), stamp);
        if self.peers.any() {
            let seq = self.peers.stamp();
            self.peers.send_all(|| PeerEvent::Retain {
                msg: msg.for_peer(),
                seq,
                stamp,
            });
        }
        self.route_sys(now, Rc::new(msg));
    }

    /// `$SYS/` messages already own their small bytes: store them as they
    /// are (no compaction copy), then route a non-retained twin so the store
    /// is not written twice.
    fn route_sys(&mut self, now: Instant, msg: Rc<Message>) {
        self.store.set(msg.clone());
        let live = Message::owned(
            msg.topic.clone(),
            msg.payload.clone(),
            msg.qos,
            false,
            Default::default(),
            None,
        );
        self.route(now, Rc::new(live));
    }
}

// Errors and closing: protocol errors, bad input, closing a connection.
impl Broker {
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

    /// A protocol violation: DISCONNECT 0x82 (MQTT 5), close, will published.
    pub(crate) fn protocol_error(&mut self, now: Instant, conn: ConnId, what: &'static str) {
        self.metrics.protocol_errors += 1;
        if let Some(peer) = self.conns.get(&conn).map(|c| c.peer.addr()) {
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
        let prev = c.replace_phase(Phase::Closing);
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
                self.drain.refer(reason, &mut properties);
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
                let id = self.sessions.get(sid).map(|s| &*s.client_id);
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

// Peers: the other shards and nodes, through the routing seam.
impl Broker {
    /// Make this core `me` among `all` the cores of one broker (its shards).
    /// Call before the first connection. From then on it tells the others
    /// what it subscribes to, forwards what they subscribe to, and keeps
    /// their retained messages (see [`Broker::handle_peer`]).
    pub fn set_peers(&mut self, me: PeerId, all: &[PeerId]) {
        self.peers = Peers::new(me, all.iter().copied(), self.durable.counts_from_ms());
        self.router.set_peered(self.peers.me());
    }

    /// The events of one link read follow (with replicas kept, they end
    /// as one event at [`Broker::end_peer_read`]).
    pub fn begin_peer_read(&mut self) {
        self.repl.open_read();
    }

    /// The link read's events ended.
    pub fn end_peer_read(&mut self) {
        if self.repl.close_read() {
            self.end_event_slow();
        }
    }

    /// The packets of one client read follow (with replicas kept, its
    /// PUBLISHes and acknowledgements end as one event at
    /// [`Broker::end_client_read`]: one batch to the replicas, one commit).
    pub fn begin_client_read(&mut self) {
        self.repl.open_read();
    }

    /// The client read's packets ended.
    pub fn end_client_read(&mut self) {
        self.end_peer_read();
    }

    /// Before a packet of an open client read (`None`: one that could not
    /// be decoded): one that may change the connection or its session, or
    /// of a connection not (or no longer plainly) connected, ends the
    /// read's event first; the rest of the read goes per packet.
    fn client_read_gate(&mut self, conn: ConnId, packet: Option<&Packet>) {
        let joins = packet.is_some_and(super::replica::joins_read)
            && matches!(
                self.conns.get(&conn).map(|c| c.phase()),
                Some(Phase::Connected(_))
            )
            && !self.acl_holds(conn);
        if !joins {
            self.end_peer_read();
        }
    }

    /// An event from peer `from`, in the order `from` polled it.
    pub fn handle_peer(&mut self, now: Instant, from: PeerId, event: PeerEvent) {
        self.check_lease(now);
        match event {
            PeerEvent::Interest {
                filter,
                group,
                add,
                seq,
            } => {
                tracing::debug!(?from, %filter, ?group, add, seq, "a node's interest");
                self.router
                    .peer_interest(from, &filter, group.as_deref(), add);
                // Behind any `Fence` still waiting for the store: `Seen`
                // covers every change up to `seq`.
                self.durable_seen(from, seq);
            }
            PeerEvent::Fence { seq } => self.durable_seen(from, seq),
            PeerEvent::Refused { seq } => self.refuse_unconfirmed_upto(from, seq),
            PeerEvent::Seen { seq } => {
                let ready = self.peers.seen(from, seq);
                self.release_deferred(ready);
                if self.moves.gates() {
                    self.unchain(None);
                }
            }
            PeerEvent::Publish {
                mut msg,
                direct,
                shares,
                id,
            } => {
                self.metrics.peer_received += 1;
                self.peers.handled(from, msg.size() as u64);
                msg.arrived_from(from);
                self.strands.read(from, msg.mark());
                let scope = Scope::Forwarded {
                    direct,
                    shares: &shares,
                };
                let held = id
                    .filter(|_| self.strands.holds_from(from, now))
                    .map(|id| (from, id));
                self.deliver_held(now, Rc::new(msg), scope, held);
            }
            PeerEvent::Stranded(st) => {
                let super::peer::Stranded {
                    owners,
                    msg,
                    direct,
                    shares,
                } = *st;
                self.on_stranded(now, from, &owners, msg, direct, &shares);
            }
            PeerEvent::Retain {
                mut msg,
                seq,
                stamp,
            } => {
                // Older than what the topic holds (a change from the other
                // side of a partition): every node keeps the newer one.
                if self.retain_order.admit(msg.topic.as_str(), stamp) {
                    msg.arrived_from(from);
                    self.keep_retained(Rc::new(msg));
                }
                self.durable_seen(from, seq);
            }
            PeerEvent::Consumed { bytes } => {
                for conn in self.peers.confirmed(from, bytes) {
                    self.wake(conn);
                }
            }
            PeerEvent::Replicate { seq, ops } => self.replica_ops(now, from, seq, ops.into_ops()),
            PeerEvent::ReplicaAck { seq } => self.replica_answered(from, Some(seq)),
            PeerEvent::ReplicaStale { clients } => self.replica_stale(now, from, clients),
            PeerEvent::Handover { client } => {
                self.claims.copy_answered(&client, from);
                self.claims.handed_over(client);
            }
            PeerEvent::Relaying { client } => self.relaying(now, from, client),
            PeerEvent::Relayed {
                client,
                mut msg,
                qos,
                retain,
                sub_ids,
            } => {
                msg.arrived_from(from);
                let item = Queued {
                    msg: Rc::new(msg),
                    qos,
                    retain,
                    sub_ids,
                    share: None,
                    entry: None,
                    replay: false,
                };
                self.relayed(now, from, &client, item);
            }
            PeerEvent::RelayDone { client } => {
                if let Some(sid) = self.moves.arriving_of(&client, from) {
                    self.arrived(now, sid);
                } else {
                    // Over before the session was served here (its claim
                    // never came, or the relay timed out).
                    self.moves.forget_relay(&client, Some(from));
                }
            }
            PeerEvent::Moved { client } => {
                // What this node sends from now on matches the new owner's
                // subscriptions (announced before, on the same link).
                self.peers.send_all(|| PeerEvent::Flushed {
                    client: client.clone(),
                    to: None,
                });
                self.told(now, &client, Some(from));
                // The new owner flushed too: its own `Flushed` follows its
                // `Moved` at once (a `Moved` said again comes alone).
                self.move_flushed(now, &client, &[None, Some(from)], Some(from));
            }
            PeerEvent::Flushed { client, to } => {
                self.move_flushed(now, &client, &[Some(from)], to);
                if to.is_none() || to == self.peers.me() {
                    self.moves.flushed_arriving(&client, from);
                }
            }
            PeerEvent::CopyWanted {
                client,
                epoch,
                have,
            } => self.offer_copy(from, &client, epoch, have),
            PeerEvent::NoCopy { client } => self.claims.copy_answered(&client, from),
            PeerEvent::Hold { session, hold } => {
                let conn = self.sessions.get(session).and_then(|s| s.conn);
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
            .and_then(|o| self.sessions.get(o))
            .and_then(|s| s.conn);
        if let Some(pc) = publisher {
            if !self.peers.holds(pc) {
                self.peers.hold(pc);
                self.metrics.peer_throttles += 1;
            }
        }
    }

    /// `out` for `conn` once every peer has seen change `seq`; a connection
    /// with too many such outputs is not read meanwhile (counted).
    fn defer_for_peers(&mut self, seq: u64, conn: ConnId, out: Deferred) {
        if self.peers.defer(seq, conn, out) {
            self.metrics.peer_deferred_holds += 1;
        }
    }

    pub(crate) fn release_deferred(&mut self, ready: Vec<(ConnId, Deferred)>) {
        for (conn, out) in ready {
            // Read again if it was held for having too many waiting.
            self.wake(conn);
            match out {
                // It may still wait for the store.
                Deferred::Ack { out, .. } => self.send_publish_ack(conn, out),
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

    /// Give back a batch [`Broker::poll_peer_transmit`] returned, once its
    /// receiver has taken the events out: its buffer carries a next batch
    /// to the same peer, so batches cost no allocation.
    pub fn reuse_peer_batch(&mut self, batch: PeerBatch) {
        self.peers.reuse(batch);
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
    /// Not the acknowledgements that waited for its former self to store
    /// a message: that self is gone (restarted), and so may the message
    /// be. They are refused first, as when it goes away; with nothing to
    /// send it, the peer counts as having seen everything at once, before
    /// its own `Sync` says it restarted.
    pub fn peer_joined(&mut self, peer: PeerId) {
        self.refuse_unconfirmed(peer);
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
            let stamp = self.retain_order.stamp_of(msg.topic.as_str());
            self.peers.send(peer, PeerEvent::Retain { msg, seq, stamp });
        }
        if !sent {
            // Nothing for it to apply: it has seen everything.
            let ready = self.peers.seen(peer, seq);
            self.release_deferred(ready);
        }
        // A replica (new, restarted, or back) gets the sessions anew; what
        // was sent to its former self is never answered.
        self.replica_forget(peer);
        if !self.replica_set_changed().contains(&peer) {
            self.send_images(Some(peer), None);
        }
        self.forget_outside(peer);
        // What was stranded for it while it was away went with what was
        // queued for its former self: again, for the sessions it held all
        // along (see `strand`).
        for (msg, mark) in self.strands.take_kept(peer, self.last_stamp.0) {
            self.metrics.stranded_resent += 1;
            let mut msg = msg.for_peer();
            msg.set_mark(mark);
            let again = super::peer::Stranded {
                owners: Vec::new(),
                msg,
                direct: false,
                shares: Vec::new(),
            };
            self.peers.send(peer, PeerEvent::Stranded(Box::new(again)));
        }
        self.retell_moves(peer);
    }

    /// `peer`'s link is back to the same node (not restarted): it gets
    /// what was queued for it, what was stranded for it included, which
    /// need not be kept any more.
    pub fn peer_resumed(&mut self, peer: PeerId) {
        self.strands.forget_peer(peer);
    }

    /// Every peer has applied what this core announced so far (at start,
    /// the subscriptions it restored from the store). Ask after
    /// [`Broker::poll_peer_transmit`] gave out what was pending.
    pub fn peers_caught_up(&self) -> bool {
        self.peers.caught_up()
    }

    /// Whether output for `conn` (a SUBACK, a retained PUBLISH's
    /// acknowledgement) waits until every peer has seen a change.
    pub fn awaits_peers(&self, conn: ConnId) -> bool {
        self.peers.owes(conn)
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
        // As for a node gone away: what crossed to it for its persistent
        // sessions and is not confirmed may be nowhere else (a removed
        // node's relay of a moving session cut short), so it is refused,
        // not acknowledged.
        self.refuse_unconfirmed(peer);
        self.moves_peer_gone(peer);
        self.strands.peer_left(peer);
        self.repl.parts.forget(peer);
        self.metrics.replica_parts_dropped += self.repl.parts.take_dropped();
        self.router.forget_peer(peer);
        self.router.set_away(peer, false);
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

    /// Whether `peer` is away (see [`Broker::set_peer_away`]).
    pub fn is_peer_away(&self, peer: PeerId) -> bool {
        self.peers.is_away(peer)
    }

    /// `peer` cannot be reached (`away`: a node whose link is down), or is
    /// back. While it is away, a SUBACK or an acknowledgement that waits
    /// for every peer does not wait for it; when its link is up again it
    /// gets this core's state anew.
    pub fn set_peer_away(&mut self, peer: PeerId, away: bool) {
        self.set_peer_away_since(peer, away, None);
    }

    /// [`Broker::set_peer_away`], `since`: when its link went down (`None`:
    /// not known). Should it be dead, the connections of its clients were
    /// lost by then, and the delay of a will adopted for one counts from
    /// then rather than from the adoption (see [`Broker::orphan_claimed`]).
    pub fn set_peer_away_since(&mut self, peer: PeerId, away: bool, since: Option<Instant>) {
        if away {
            self.refuse_unconfirmed(peer);
            self.moves_peer_gone(peer);
            // Its clients' wills, should it be dead (see `orphans`).
            if self.repl.on() {
                let wills = self.repl.images.wills_of(peer);
                let armed = self.repl.images.armed_wills_of(peer);
                self.orphans.found(peer, wills, armed, since);
            }
        }
        let ready = self.peers.set_away(peer, away);
        self.router.set_away(peer, away);
        if away {
            // Its congestion holds no publisher while it is away.
            for conn in self.peers.release() {
                self.wake(conn);
            }
        }
        if away && !ready.is_empty() {
            // Confirmed by every other peer, and `peer` was sent nothing
            // they promise (what it was sent and did not confirm was
            // refused above).
            tracing::debug!(
                ?peer,
                released = ready.len(),
                "answers no longer wait for a node away"
            );
        }
        self.release_deferred(ready);
        self.replica_answered(peer, None);
        // Back, it gets full images (what it missed may have been dropped
        // from its full queue); away, another peer may take its place.
        let added = self.replica_set_changed();
        let images = !away && !added.contains(&peer) && self.repl.current().contains(&peer);
        tracing::debug!(
            ?peer,
            away,
            added = added.len(),
            images,
            "a node away or back"
        );
        if images {
            self.send_images(Some(peer), None);
        }
        self.end_event();
    }

    /// `peer` resends its whole state (its link reconnected): forget what
    /// it said before, its holds on our publishers too (a release may have
    /// been lost with the link).
    pub fn peer_reset(&mut self, peer: PeerId) {
        // What it had not confirmed went with its old state.
        tracing::debug!(?peer, "a node's state reset: its interests forgotten");
        self.refuse_unconfirmed(peer);
        self.router.forget_peer(peer);
        for conn in self.peers.release_held_by(peer) {
            self.wake(conn);
        }
        // Its answers to our replicated changes may be lost the same way:
        // an empty change, answered on its new link, covers them.
        if self.repl.unanswered(peer) {
            self.send_replicated(&[peer], Vec::new());
        }
    }

    /// The publishers whose acknowledgement waited for `peer` to confirm
    /// a message it never confirmed (it went away, or came back with its
    /// state lost): the message may be lost with it, so no acknowledgement
    /// goes. The publisher is disconnected instead (MQTT 5: 0x80), as an
    /// acknowledgement cannot say "not taken" to every client, and
    /// publishes again if its session is persistent (a QoS 2 packet id
    /// stays taken, so a QoS 2 message sent again is not routed twice).
    fn refuse_unconfirmed(&mut self, peer: PeerId) {
        self.refuse_unconfirmed_upto(peer, u64::MAX);
    }

    /// [`Broker::refuse_unconfirmed`] for the messages that crossed to
    /// `peer` up to this core's change `seq`: also what `peer` says it did
    /// not keep (`PeerEvent::Refused`).
    fn refuse_unconfirmed_upto(&mut self, peer: PeerId, seq: u64) {
        let refused = self.peers.take_refused(peer, seq);
        if refused.is_empty() {
            return;
        }
        let now = self.last_stamp.0;
        let closed = self.refuse_acks(now, refused.into_iter().map(|(conn, _)| conn));
        if closed > 0 {
            tracing::warn!(
                publishers = closed,
                "a node did not confirm messages it was sent (gone, restarted, or their \
                 session had moved): their publishers are disconnected, not acknowledged"
            );
        }
        self.end_event();
    }

    /// Acknowledgements not sent (one per item of `conns`, counted): each
    /// of their publishers still here is disconnected once (MQTT 5: 0x80).
    /// Returns how many were.
    fn refuse_acks(&mut self, now: Instant, conns: impl Iterator<Item = ConnId>) -> usize {
        let mut closed = Vec::new();
        for conn in conns {
            self.metrics.acks_refused += 1;
            if !closed.contains(&conn) && self.conns.get(&conn).is_some() {
                closed.push(conn);
                self.close(now, conn, Some(ReasonCode::UNSPECIFIED_ERROR), true);
            }
        }
        closed.len()
    }

    /// The shell's queue towards `peer` is full (or has room again). While
    /// it is full, QoS 0 messages for it are dropped (counted) and the
    /// publishers of QoS 1/2 messages for it are not read (push-back).
    pub fn set_peer_congested(&mut self, peer: PeerId, congested: bool) {
        for conn in self.peers.set_congested(peer, congested) {
            self.wake(conn);
        }
    }
}

// Replicas: persistent sessions copied to other nodes (see `replica`).
impl Broker {
    /// Keep `copies` copies of every persistent session (this node's
    /// included) on the peers (the nodes of a cluster): 1 keeps none
    /// elsewhere. Needs a durable log.
    pub fn set_replicas(&mut self, copies: usize) {
        self.repl.set_copies(copies);
    }

    /// Bound the images this node keeps for other nodes.
    pub fn set_replica_limits(&mut self, images: usize, bytes: usize) {
        self.repl.images.set_limits(images, bytes);
    }

    /// Images of other nodes' sessions kept here, and their message bytes.
    pub fn replica_images(&self) -> (usize, usize) {
        (self.repl.images.len(), self.repl.images.bytes())
    }

    /// Send what this event staged for persistent sessions to the replica
    /// set; this event's acknowledgements wait for their answers.
    pub(crate) fn flush_replication(&mut self) {
        if !self.repl.on() {
            return;
        }
        let ops = self.repl.take_ops();
        let targets = self.repl.current().to_vec();
        if ops.is_empty() || targets.is_empty() {
            self.keep_behind();
            return;
        }
        self.send_replicated(&targets, ops);
        for (conn, out) in self.durable.take_pending() {
            self.repl.hold_ack(conn, out);
        }
    }

    /// Nothing of this event goes to the replicas: its answers wait for the
    /// store alone, but those of a connection whose earlier answers wait
    /// for the replicas (or the lease) wait behind them, in order.
    fn keep_behind(&mut self) {
        let (repl, lease) = (&mut self.repl, &mut self.lease);
        if !self.durable.has_pending() {
            return;
        }
        let now = self.last_stamp.0;
        self.durable.retain_pending(|conn, out| {
            if repl.holds(conn) {
                repl.hold_ack(conn, out);
                None
            } else if lease.holds(conn) {
                lease.hold_behind(now, super::replica::Waiter::Ack(conn, out));
                None
            } else {
                Some(out)
            }
        });
    }

    /// `ops` to `targets` as one batch: in parts when one frame could not
    /// hold it (see `replica::frame_parts`). Returns its change number.
    fn send_replicated(&mut self, targets: &[PeerId], ops: Vec<super::replica::ReplOp>) -> u64 {
        let bytes: usize = ops.iter().map(super::replica::ReplOp::size).sum();
        if bytes <= super::replica::IMAGE_SPLIT {
            return self.send_batch(targets, ops, bytes);
        }
        let mut seq = 0;
        for part in super::replica::frame_parts(ops) {
            let bytes = part.iter().map(super::replica::ReplOp::size).sum();
            seq = self.send_batch(targets, part, bytes);
        }
        seq
    }

    fn send_batch(
        &mut self,
        targets: &[PeerId],
        ops: Vec<super::replica::ReplOp>,
        bytes: usize,
    ) -> u64 {
        let seq = self.repl.stamp(targets);
        // The epochs that name each client id's claim change no session,
        // nor does a part's mark.
        let n = ops
            .iter()
            .filter(|op| {
                !matches!(
                    op,
                    super::replica::ReplOp::Epoch { .. } | super::replica::ReplOp::Part { .. }
                )
            })
            .count() as u64;
        // One batch for every replica, encoded once (see `ReplBatch`).
        let ops = super::replica::ReplBatch::new(ops);
        for p in targets {
            self.metrics.replicated_ops += n;
            self.metrics.replicated_batches += 1;
            self.metrics.replicated_bytes += bytes as u64;
            self.peers.send(
                *p,
                PeerEvent::Replicate {
                    seq,
                    ops: ops.clone(),
                },
            );
        }
        seq
    }

    /// A peer came, left, went away or is back: the replica set is the
    /// first `copies - 1` peers, reachable ones first (an away one is
    /// replaced only by a reachable one). A peer new to it gets full
    /// images; one that leaves it (still a peer) is told to drop its
    /// copies, which no longer follow the sessions. Returns the new ones.
    pub(crate) fn replica_set_changed(&mut self) -> Vec<PeerId> {
        if !self.repl.on() {
            return Vec::new();
        }
        // Reachable peers first; an away one stays while nobody can take
        // its place (its copy keeps following in its link's queue).
        let peers = &self.peers;
        let set = self.repl.targets(
            peers
                .ids()
                .filter(|p| !peers.is_away(*p))
                .chain(peers.ids().filter(|p| peers.is_away(*p))),
        );
        let old = self.repl.set_current(set.clone());
        let added: Vec<PeerId> = set.iter().copied().filter(|p| !old.contains(p)).collect();
        for p in &added {
            self.send_images(Some(*p), None);
        }
        let left: Vec<PeerId> = old
            .into_iter()
            .filter(|p| !set.contains(p) && self.peers.ids().any(|q| q == *p))
            .collect();
        // All of this node's copies there, those of sessions that moved
        // away too (one operation, however many sessions).
        for p in left {
            self.send_replicated(&[p], vec![super::replica::ReplOp::ForgetOwner]);
        }
        added
    }

    /// `peer` (new, restarted or back) is not in the replica set: the
    /// `ForgetOwner` it was sent when it left may have gone with its
    /// link's queue, and its copies would stay (a restarted one's read
    /// back from disk have no owner yet, and wait for a drop or expiry).
    fn forget_outside(&mut self, peer: PeerId) {
        if self.repl.on() && !self.repl.current().contains(&peer) {
            self.send_replicated(&[peer], vec![super::replica::ReplOp::ForgetOwner]);
        }
    }

    /// `peer` starts over (its link's queue was dropped): nothing sent to
    /// it before will be answered, so nothing waits for it.
    fn replica_forget(&mut self, peer: PeerId) {
        let peers = &self.peers;
        let ready = self.repl.answered(peer, 0, true, &|p| peers.is_away(p));
        self.refuse_replica_waiters(ready.refused);
        self.release_replica_waiters(ready.waiters);
    }

    /// What waited on changes a replica called stale: a publisher of this
    /// node's is disconnected (MQTT 5: 0x80), a peer's fence answered
    /// `Refused` (see `PeerEvent::Refused`).
    fn refuse_replica_waiters(&mut self, refused: Vec<super::replica::Waiter>) {
        if refused.is_empty() {
            return;
        }
        let now = self.last_stamp.0;
        let mut conns = Vec::new();
        for w in refused {
            match w {
                super::replica::Waiter::Ack(conn, _) => conns.push(conn),
                super::replica::Waiter::Seen(p, seq) => {
                    self.peers.send(p, PeerEvent::Refused { seq })
                }
            }
        }
        self.refuse_acks(now, conns.into_iter());
    }

    /// What no longer waits for replicas goes on, through the store as any
    /// acknowledgement does: behind what it holds, never back to the
    /// replicas with this event's changes, where what a connection had
    /// waiting behind it would pass it.
    fn release_replica_waiters(&mut self, ready: Vec<super::replica::Waiter>) {
        if ready.is_empty() {
            return;
        }
        for w in ready {
            match w {
                super::replica::Waiter::Ack(conn, out) => {
                    if let Some((conn, out)) = self.durable.hold_committed(conn, out) {
                        self.send_outgoing(conn, out);
                    }
                }
                super::replica::Waiter::Seen(p, s) => self.durable_seen_now(p, s),
            }
        }
        // Their commit may be durable already: the store will not say so
        // again.
        self.end_event();
        self.release_durable();
    }

    /// Whether `Seen { seq }` for `from` must wait for the replicas.
    pub(crate) fn replica_holds_seen(&mut self, from: PeerId, seq: u64) -> bool {
        if !self.repl.on() {
            return false;
        }
        let peers = &self.peers;
        self.repl.wait_seen(from, seq, &|p| peers.is_away(p))
    }

    /// `from`'s operations on its sessions: kept, then answered.
    pub(crate) fn replica_ops(
        &mut self,
        now: Instant,
        from: PeerId,
        seq: u64,
        ops: Vec<super::replica::ReplOp>,
    ) {
        let joined = self.repl.parts.join(from, ops);
        self.metrics.replica_parts_dropped += self.repl.parts.take_dropped();
        let ops = match joined {
            super::replica::Joined::Whole(ops) => ops,
            // Answered with the last part (an answer covers every change
            // up to its own).
            super::replica::Joined::Held => return,
            // Answered all the same, behind what waits for the store.
            super::replica::Joined::Dropped => {
                if !self.durable.hold_replica_ack(from, seq) {
                    self.peers.send(from, PeerEvent::ReplicaAck { seq });
                }
                return;
            }
        };
        let (applied, refused) = (self.repl.images.applied, self.repl.images.refused);
        let had = self.repl.images.batches_had;
        let (stale, forgotten) = (
            self.repl.images.fence.stale,
            self.repl.images.fence.forgotten,
        );
        let now_ms = self.durable.unix_ms(now);
        // On this node's disk before the answer (held for the commit).
        self.metrics.store_errors +=
            self.repl
                .images
                .apply_durable(from, ops, now_ms, &mut self.durable);
        self.metrics.replica_ops_applied += self.repl.images.applied - applied;
        self.metrics.replica_ops_refused += self.repl.images.refused - refused;
        self.metrics.replica_batches_had += self.repl.images.batches_had - had;
        self.metrics.replica_entries_unwritten += self.repl.images.take_unwritten();
        let (replaced, unread) = self.repl.images.take_unstranded();
        self.metrics.stranded_replaced += replaced;
        self.metrics.stranded_unread += unread;
        let fence = &mut self.repl.images.fence;
        self.metrics.replica_stale_ops += fence.stale - stale;
        self.metrics.replica_epochs_forgotten += fence.forgotten - forgotten;
        // Answered all the same (the sender must not wait forever), but
        // told first: its session ends there before this answer releases
        // any acknowledgement made on the strength of ignored changes.
        let clients = fence.take_notices();
        if !clients.is_empty() {
            self.peers.send(from, PeerEvent::ReplicaStale { clients });
        }
        if !self.durable.hold_replica_ack(from, seq) {
            self.peers.send(from, PeerEvent::ReplicaAck { seq });
        }
    }

    /// `peer` answered (`Some(seq)`), left (`None`), or is away or back:
    /// what waited may go.
    pub(crate) fn replica_answered(&mut self, peer: PeerId, seq: Option<u64>) {
        let peers = &self.peers;
        let away = |p| peers.is_away(p);
        let ready = match seq {
            Some(s) => self.repl.answered(peer, s, false, &away),
            None if !peers.ids().any(|p| p == peer) => self.repl.answered(peer, 0, true, &away),
            None => self.repl.ready(&away),
        };
        self.metrics.replica_waits_skipped += ready.without;
        self.refuse_replica_waiters(ready.refused);
        // What no replica has waits for the lease (see `lease`).
        let go = self
            .lease
            .hold_skipped(self.last_stamp.0, ready.waiters, ready.alone);
        self.release_replica_waiters(go);
    }

    /// The full images of the persistent sessions here (of `only`, when
    /// given), for `to` (every replica when `None`).
    pub(crate) fn send_images(&mut self, to: Option<PeerId>, only: Option<SessionId>) {
        if !self.repl.on() || !self.durable.on() {
            return;
        }
        let targets: Vec<PeerId> = self
            .repl
            .current()
            .iter()
            .copied()
            .filter(|p| to.is_none_or(|t| t == *p))
            .collect();
        if targets.is_empty() {
            return;
        }
        // What was staged before belongs before the image.
        self.flush_replication();
        // Only sessions claimed here since start: one restored from this
        // node's store may have moved to another node meanwhile, and its
        // image would replace the new owner's.
        let sids: Vec<SessionId> = match only {
            Some(sid) => vec![sid],
            None => self
                .sessions
                .iter()
                .filter(|(_, s)| self.repl.is_claimed(&s.client_id))
                .map(|(sid, _)| sid)
                .collect(),
        };
        let mut ops = Vec::new();
        if only.is_none() {
            // Clean takeovers' drops first (see `replica::Drops`).
            let seq = self.repl.next_seq();
            self.repl.drops.resend(seq, &mut ops);
        }
        let mut named = std::collections::HashSet::new();
        for sid in sids {
            self.image_ops(sid, &mut ops, &mut named);
        }
        if only.is_none() {
            // Clean sessions' armed wills.
            for (client, epoch) in self.clean_wills.iter() {
                if let Some(sid) = self.sessions.of_client(client) {
                    self.clean_will_ops(sid, epoch, &mut ops);
                }
            }
            self.metrics.replica_images_sent += targets.len() as u64;
        }
        self.send_image_batches(&targets, ops);
    }

    /// Full images for `targets`, in batches that stay far below a link
    /// frame's limit (see `replica::image_batches`).
    fn send_image_batches(&mut self, targets: &[PeerId], ops: Vec<super::replica::ReplOp>) {
        for batch in super::replica::image_batches(ops) {
            self.send_replicated(targets, batch);
        }
    }

    /// `sid`'s client id moves to `to`: its full image goes there unless
    /// `to` keeps this node's copies already, then the handover mark.
    /// (A clean session may be gone already, closed with its connection:
    /// the mark goes all the same.)
    fn hand_over(&mut self, sid: SessionId, client: &str, to: PeerId) {
        // What was staged before belongs before the image and the mark.
        self.flush_replication();
        if self.durable.on() && !self.repl.current().contains(&to) {
            let mut ops = Vec::new();
            self.image_ops(sid, &mut ops, &mut std::collections::HashSet::new());
            if !ops.is_empty() {
                self.metrics.sessions_handed_over += 1;
                self.send_image_batches(&[to], ops);
            }
        }
        self.peers.send(
            to,
            PeerEvent::Handover {
                client: client.into(),
            },
        );
    }

    /// The operations that rebuild `sid` from nothing at a replica.
    fn image_ops(
        &mut self,
        sid: SessionId,
        ops: &mut Vec<super::replica::ReplOp>,
        named: &mut std::collections::HashSet<MsgId>,
    ) {
        let (d, base) = (&self.durable, self.started);
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        if !s.stored || s.expiry_interval == 0 {
            return;
        }
        let client: Box<str> = (*s.client_id).into();
        ops.extend(self.repl.epoch_op(&client));
        ops.push(super::replica::ReplOp::Reset {
            client: client.clone(),
            meta: SessionMeta {
                expiry_interval: s.expiry_interval,
                expires_at_ms: s.expires_at(base).map(|at| d.unix_ms(at)),
            },
            read: Some(self.strands.marks_read()),
        });
        for (filter, rec) in s.subscriptions.iter() {
            ops.push(super::replica::ReplOp::Subscribe {
                client: client.clone(),
                filter: filter.clone(),
                options: sub_options(&rec.options),
                id: rec.id.map(NonZeroU32::get),
            });
        }
        let mut entry_ops =
            |q: &super::session::Queued, ops: &mut Vec<super::replica::ReplOp>| -> bool {
                let (Some(entry), Some(msg)) = (q.entry, q.msg.stored().get()) else {
                    return false;
                };
                if named.insert(msg) {
                    ops.push(super::replica::ReplOp::Message {
                        id: msg,
                        msg: std::sync::Arc::new(to_stored(&q.msg, d)),
                        mark: q.msg.mark(),
                    });
                }
                ops.push(super::replica::ReplOp::Enqueue {
                    client: client.clone(),
                    entry,
                    item: QueueEntry {
                        msg,
                        qos: q.qos as u8,
                        retain: q.retain,
                        subscription_ids: q.sub_ids.clone(),
                        share: q.share.as_deref().map(str::to_owned),
                    },
                });
                true
            };
        let mut inflight: Vec<_> = s.flight().inflight.iter().collect();
        inflight.sort_by_key(|(_, f)| f.seq);
        for (pid, f) in inflight {
            match f.state {
                InflightState::AwaitingAck => {
                    if entry_ops(&f.item, ops) {
                        if let Some(entry) = f.item.entry {
                            ops.push(super::replica::ReplOp::Send {
                                client: client.clone(),
                                entry,
                                pid: *pid,
                            });
                        }
                    }
                }
                _ => ops.push(super::replica::ReplOp::PubRec {
                    client: client.clone(),
                    pid: *pid,
                }),
            }
        }
        let queued: Vec<super::session::Queued> = s
            .queue_iter_mut()
            .filter(|q| q.entry.is_some())
            .map(|q| q.clone())
            .collect();
        for q in &queued {
            entry_ops(q, ops);
        }
        for pid in &s.flight().incoming_qos2 {
            ops.push(super::replica::ReplOp::Qos2Received {
                client: client.clone(),
                pid: *pid,
            });
        }
        let connected = s
            .conn
            .and_then(|c| self.conns.get(&c))
            .and_then(|c| c.will.as_deref());
        let will = match (s.pending_will(), connected) {
            (Some(w), _) => Some(stored_will(&w.will, d, d.unix_ms(w.at), None)),
            (None, Some(w)) if s.will_armed => Some(armed_will(w, d)),
            _ => None,
        };
        if let Some(will) = will {
            ops.push(super::replica::ReplOp::SetWill {
                client: client.clone(),
                will: Box::new(will),
            });
        }
    }

    /// This node was granted `connect`'s client id: an image of its
    /// session kept here becomes the live session (unless the client
    /// starts clean, or a session is here already), written to this
    /// node's store. Returns the marks of the messages it held (see
    /// `Broker::arrive`).
    pub(crate) fn install_replica(
        &mut self,
        now: Instant,
        connect: &zerofan_codec::Connect,
        prev: Option<super::PreviousOwner>,
    ) -> HashSet<super::strand::Mark> {
        let client = connect.client_id.as_str();
        if !self.repl.images.has(client) {
            return HashSet::default();
        }
        let owner = self.repl.images.subscribed_owner(client);
        // A will armed for a connection of the previous owner is this
        // node's to publish only if that owner let go because its lease
        // ran out (dead, cut off, or alive and fenced by its lease: it
        // dropped the connection without the will, see `fence_clients`),
        // as the claim says. One that answered the leader's fence settles
        // the will itself (`client_fenced`), whether it looks live from
        // here or not (a paused node just woken up looks away).
        let lapsed = prev.is_some_and(|p| p.lapsed);
        let ours = |w: &zerofan_store::StoredWill| w.armed.is_none() || lapsed;
        // The copy of a clean session holds only its will: that session
        // ended with its connection, and nothing is resumed.
        let ended = connect.clean_start || self.repl.images.is_clean(client);
        if ended || self.sessions.has_client(&connect.client_id) {
            // A clean start ends the session the copy holds (one served
            // here is ended by `handle_connect`): its will is published
            // (MQTT-3.1.3-9), the connection it was armed for lost with
            // its dead node, or its delay left to run when the session
            // moved here. Only from the copy the previous owner wrote: an
            // older owner's will (a clean start checks no copy's age
            // first) was published by the node that took the id from it.
            // And only from an owner that let go by its lease: one that
            // answered the fence (or led in its lease) published the will
            // itself when the clean start ended the session
            // (`client_taken_from`).
            let current =
                prev.is_some_and(|p| self.repl.images.is_current(client, &p) == Some(true));
            let will = self
                .repl
                .images
                .will_of(client)
                .filter(|_| current && lapsed && !self.sessions.has_client(&connect.client_id))
                .map(|w| will_from_stored(w, &self.durable));
            self.with_copies(|im, d| im.forget(client, d));
            self.publish_copy_will(now, will);
            return HashSet::default();
        }
        let had = self.repl.images.marks_of(client);
        // The copy's ids are the previous owner's when it wrote the copy
        // under its claim, also when another node sent it (see
        // `Images::copy_ops`); not those of an older copy: ids of another
        // store would match other messages.
        let ids = prev
            .filter(|p| self.repl.images.is_current(client, p) == Some(true))
            .and_then(|p| p.peer)
            .map(|p| (p, self.repl.images.ids_of(client)));
        let prev = prev.and_then(|p| p.peer);
        let Some(mut rs) = self.with_copies(|im, d| im.take(client, d)) else {
            return HashSet::default();
        };
        if rs.will.as_ref().is_some_and(|w| !ours(w)) {
            rs.will = None;
        }
        if let Some((from, ids)) = ids {
            self.strands.hold(client, from, ids, now);
        }
        log_taken(client, owner, &rs);
        self.restore(
            Recovered {
                sessions: vec![rs],
                ..Default::default()
            },
            now,
        );
        let Some(sid) = self.sessions.of_client(&connect.client_id) else {
            return HashSet::default();
        };
        // Taken from the previous owner's session, also when another node
        // sent the copy: what is stranded for that owner is this one's.
        self.note_taken(client, prev.or(owner));
        self.metrics.replica_installs += 1;
        self.restage(sid);
        had
    }

    /// This node was given `client_id` without a CONNECT (its old owner is
    /// being removed, see `drain`): an image kept here becomes the live
    /// session, offline, and goes on collecting its messages. False when
    /// there is no image, or a session is here already.
    pub fn adopt_replica(&mut self, now: Instant, client_id: &str) -> bool {
        self.adopt_replica_at(now, client_id, 0)
    }

    /// Whether `client_id`, given here from a node being removed, must
    /// wait for that node's handover mark before its copy is taken: what
    /// the node queued in the session before it learned of the grant is
    /// still on its way here, ahead of the mark on the same link (with the
    /// session's full image, when this node keeps no copy of it). A copy
    /// taken before lacks it, and the relay carries only what reaches that
    /// node later; with no copy at all, nothing was served. Not when the
    /// copy's owner is gone or away: no mark will come. The shell waits a
    /// bounded time, woken by [`Broker::take_handover_news`].
    pub fn awaits_drained_handover(&self, client_id: &str) -> bool {
        let owner_silent = self
            .repl
            .images
            .subscribed_owner(client_id)
            .is_some_and(|o| !self.peers.is_live(o));
        self.repl.on()
            && !self.serves(client_id)
            && !owner_silent
            && !self.claims.was_handed(client_id)
    }

    /// [`Broker::adopt_replica_at`] for a client id the leader gave this
    /// node from a node being removed (drained), once that node handed it
    /// over ([`Broker::awaits_drained_handover`]). It relays what still
    /// reaches it (see `moves`); expected from now on if not already.
    pub fn adopt_drained(&mut self, now: Instant, client_id: &str, epoch: u64) -> bool {
        self.claims.settle_handover(client_id);
        let owner = self.repl.images.subscribed_owner(client_id).filter(|&o| {
            self.peers.is_live(o) && !self.moves.expects_relay(client_id) && !self.serves(client_id)
        });
        if let Some(owner) = owner {
            self.moves
                .expect_relay(client_id.into(), owner, now + MOVE_TIMEOUT);
        }
        let adopted = self.adopt_replica_at(now, client_id, epoch);
        if !adopted && owner.is_some() {
            self.moves.forget_relay(client_id, owner);
        }
        adopted
    }

    /// [`Broker::adopt_replica`], with the epoch of the claim that gave
    /// `client_id` here (0: not applied here yet).
    pub fn adopt_replica_at(&mut self, now: Instant, client_id: &str, epoch: u64) -> bool {
        let Ok(id) = MqttStr::try_from(client_id) else {
            return false;
        };
        if self.sessions.has_client(&id) {
            return false;
        }
        // Not known yet: the claim is at least the one after the copy's.
        let known = self.repl.images.fence.known(client_id);
        let epoch = if epoch == 0 && known > 0 {
            known + 1
        } else {
            epoch
        };
        let owner = self.repl.images.subscribed_owner(client_id);
        let had = self.repl.images.marks_of(client_id);
        let Some(rs) = self.with_copies(|im, d| im.take(client_id, d)) else {
            return false;
        };
        log_taken(client_id, owner, &rs);

        self.replica_epoch(client_id, epoch);
        let recovered = Recovered {
            sessions: vec![rs],
            ..Default::default()
        };
        self.restore(recovered, now);
        let Some(sid) = self.sessions.of_client(&id) else {
            return false;
        };
        self.metrics.replica_installs += 1;
        self.note_taken(client_id, owner);
        self.restage(sid);
        self.claimed(&id);
        self.arrive(now, client_id, true, had);
        self.end_event();
        true
    }

    /// Write an installed session to this node's store: its ids were the
    /// old owner's. Its will is pending here (an armed copy's counts from
    /// now, see `restore`).
    fn restage(&mut self, sid: SessionId) {
        let (d, base) = (&self.durable, self.started);
        // A clean session (a copy of one, its will armed) is never stored.
        let Some(s) = self.sessions.get_mut(sid).filter(|s| s.expiry_interval > 0) else {
            return;
        };
        let client = s.client_id.clone();
        let will = s
            .pending_will()
            .map(|w| stored_will(&w.will, d, d.unix_ms(w.at), None));
        s.stored = true;
        let meta = SessionMeta {
            expiry_interval: s.expiry_interval,
            expires_at_ms: s.expires_at(base).map(|at| d.unix_ms(at)),
        };
        let mut items = Vec::new();
        while let Some(q) = s.pop() {
            items.push(q);
        }
        let subs: Vec<(Box<str>, SubRecord)> = s
            .subscriptions
            .iter()
            .map(|(f, r)| (f.clone(), *r))
            .collect();
        let mut inflight: Vec<_> = s
            .flight_any()
            .map(|f| f.inflight.drain().collect())
            .unwrap_or_default();
        inflight.sort_by_key(|(_, f): &(u16, super::session::Inflight)| f.seq);
        let qos2: Vec<u16> = s.flight().incoming_qos2.iter().copied().collect();
        for q in &items {
            q.msg.stored().clear();
        }
        for (_, f) in &inflight {
            f.item.msg.stored().clear();
        }
        let errors = &mut self.metrics.store_errors;
        self.durable.stage(errors, |l| l.put_session(&client, meta));
        for (filter, rec) in subs {
            self.dur_subscribed(sid, &filter, rec);
        }
        for (pid, mut f) in inflight {
            f.item.entry = None;
            self.dur_enqueue(sid, &mut f.item);
            if let Some(e) = f.item.entry {
                let errors = &mut self.metrics.store_errors;
                self.durable.stage(errors, |l| l.send(&client, e, pid));
                if f.state != InflightState::AwaitingAck {
                    self.durable.stage(errors, |l| l.pubrec(&client, pid));
                }
            }
            if let Some(s) = self.sessions.get_mut(sid) {
                s.flight_mut().inflight.insert(pid, f);
            }
        }
        for mut q in items {
            q.entry = None;
            self.dur_enqueue(sid, &mut q);
            if let Some(s) = self.sessions.get_mut(sid) {
                let _ = s.push(q, usize::MAX, usize::MAX, QueueFull::DropNew);
            }
        }
        let errors = &mut self.metrics.store_errors;
        for pid in qos2 {
            self.durable
                .stage(errors, |l| l.qos2_received(&client, pid));
        }
        if let Some(w) = will {
            self.durable.stage(errors, |l| l.set_will(&client, &w));
        }
    }

    /// After a granted claim: the replicas get the session's full image
    /// from its new owner (a fresh one too: what they kept of another
    /// owner's is stale).
    pub(crate) fn claimed(&mut self, client: &zerofan_codec::MqttStr) {
        if let Some(sid) = self.sessions.of_client(client) {
            if self
                .sessions
                .get(sid)
                .is_some_and(|s| s.stored && s.expiry_interval > 0)
            {
                // Persistent now: its will is armed in its full image.
                self.clean_wills.disarm(client.as_str());
                self.repl.claim(client.as_str());
            } else if self.repl.on() {
                // A clean session ends the one it replaces: copies another
                // owner left must not be resumed later. Its client's will
                // is armed there (see `clean_will_ops`).
                let armed = self.arm_clean_will(sid);
                self.drop_copies(client.as_str(), self.repl.epoch(client.as_str()), armed);
            }
            self.send_images(None, Some(sid));
        }
        self.repl.keep_epoch_if_claimed(client.as_str());
    }

    /// Send the replica set the drops of every copy of `client`, under
    /// the claim of `epoch`, followed by `then` (remembered, see
    /// `replica::Drops`).
    fn drop_copies(&mut self, client: &str, epoch: Option<u64>, then: Vec<super::replica::ReplOp>) {
        if self.repl.current().is_empty() {
            return;
        }
        let epoch = epoch.unwrap_or(0);
        let mut ops = self.repl.drops.push(client, self.repl.next_seq(), epoch);
        ops.extend(then);
        self.metrics.replica_drops_forgotten = self.repl.drops.forgotten;
        let targets = self.repl.current().to_vec();
        self.send_replicated(&targets, ops);
    }

    /// Clean session `sid` (expiry 0): its replicas keep the will of its
    /// connected client armed in a copy of nothing else, so that one of
    /// them publishes it should this node die with the client connected
    /// (see `orphans`); the copy goes when the session ends here (see
    /// `clean_will_ended`). Returns the operations that arm it (none
    /// without a will).
    fn arm_clean_will(&mut self, sid: SessionId) -> Vec<super::replica::ReplOp> {
        let mut ops = Vec::new();
        // The drops before them name the epoch.
        self.clean_will_ops(sid, 0, &mut ops);
        if let Some(s) = self.sessions.get(sid).filter(|_| !ops.is_empty()) {
            let epoch = self.repl.epoch(&s.client_id).unwrap_or(0);
            self.clean_wills.arm(&s.client_id, epoch);
        }
        ops
    }

    /// The operations that make a replica's copy of clean session `sid`,
    /// under the claim of `epoch` (0: named before them, or not known):
    /// its expiry (0) and its client's will, armed.
    fn clean_will_ops(&self, sid: SessionId, epoch: u64, ops: &mut Vec<super::replica::ReplOp>) {
        let Some(s) = self.sessions.get(sid).filter(|s| !s.stored) else {
            return;
        };
        let Some(will) = s
            .conn
            .and_then(|c| self.conns.get(&c))
            .and_then(|c| c.will.as_deref())
        else {
            return;
        };
        let client: Box<str> = (*s.client_id).into();
        if epoch > 0 {
            ops.push(super::replica::ReplOp::Epoch {
                client: client.clone(),
                epoch,
                version: 0,
            });
        }
        ops.push(super::replica::ReplOp::Reset {
            client: client.clone(),
            meta: SessionMeta::default(),
            read: None,
        });
        ops.push(super::replica::ReplOp::SetWill {
            client,
            will: Box::new(armed_will(will, &self.durable)),
        });
    }

    /// `client`'s clean session ends here (its will published or not):
    /// the copies that hold its will armed go.
    fn clean_will_ended(&mut self, client: &str) {
        if let Some(epoch) = self.clean_wills.disarm(client) {
            self.drop_copies(client, Some(epoch), Vec::new());
        }
    }

    /// `client` was granted to this node under the claim of `epoch`: its
    /// changes carry it, and older owners' changes of it are stale here.
    fn replica_epoch(&mut self, client: &str, epoch: u64) {
        if epoch > 0 && self.repl.on() {
            self.repl.set_epoch(client, epoch);
            self.repl.images.claimed(client, epoch);
        }
    }

    /// A replica ignored this node's changes of `clients` under the claims
    /// named: another node owns them now, and this one had not heard. Each
    /// session still held under that claim ends as a takeover does
    /// (DISCONNECT 0x8E), and its acknowledgements waiting for the
    /// replicas never go. Whatever else waited on the changes `from` had
    /// not answered is refused: a message this node queued in such a
    /// session, for a publisher here or a peer's fence, is in no copy the
    /// new owner serves.
    fn replica_stale(&mut self, now: Instant, from: PeerId, clients: Vec<(Box<str>, u64)>) {
        // What this node queued in those sessions since is nowhere else:
        // what waits on those changes is refused (see `Replication::taint`).
        let stale = |b: &Self, client: &str, epoch: u64| match b.repl.epoch(client) {
            Some(e) => e == epoch,
            // Restored from this node's store and not claimed since.
            None => epoch == 0,
        };
        if clients.iter().any(|(c, e)| stale(self, c, *e)) {
            self.repl.taint(from);
        }
        for (client, epoch) in clients {
            // Claimed here again since: that claim is newer.
            if self.repl.epoch(&client) != Some(epoch) {
                continue;
            }
            self.metrics.replica_stale_sessions += 1;
            let conn = MqttStr::try_from(&*client)
                .ok()
                .and_then(|id| self.open_connection_of(&id));
            if let Some(conn) = conn {
                self.repl.forget(conn);
            }
            self.client_taken(now, &client);
        }
    }
}

// Observability: counters, gauges, events, admin views and actions.
impl Broker {
    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The counters the shell bumps itself (handshake failures, setup
    /// timeouts: connections the core never sees).
    pub(crate) fn metrics_mut(&mut self) -> &mut Metrics {
        &mut self.metrics
    }

    /// No CONNECT waits for a takeover, and no connection is drained for one.
    #[cfg(test)]
    pub(crate) fn takeovers_idle(&self) -> bool {
        self.takeovers.is_empty() && self.draining.is_empty()
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
        let sid = self.sessions.of_client(client_id)?;
        self.sessions.get(sid).map(|s| s.queue_len())
    }

    /// Messages in flight (sent, not acknowledged) to `client_id`.
    pub fn inflight_messages(&self, client_id: &str) -> Option<usize> {
        let sid = self.sessions.of_client(client_id)?;
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
        let sid = self.sessions.of_client(client_id)?;
        let s = self.sessions.get(sid)?;
        Some(super::admin::view(s, &self.conns, true))
    }

    /// The retained messages whose topics match `filter`.
    pub fn admin_retained(&self, filter: &str, out: &mut Vec<std::rc::Rc<super::Message>>) {
        self.store.matching(filter, out);
    }

    /// Disconnect `client_id` (MQTT 5: DISCONNECT 0x98, will published);
    /// `discard` ends its session too. False when there is no such session.
    pub fn admin_disconnect(&mut self, now: Instant, client_id: &str, discard: bool) -> bool {
        let Some(sid) = self.sessions.of_client(client_id) else {
            return false;
        };
        if let Some(conn) = self.sessions.get(sid).and_then(|s| s.conn) {
            let why = Some("disconnected by an administrator");
            self.close_with(now, conn, ReasonCode::ADMINISTRATIVE_ACTION, why, true);
        }
        if discard && self.sessions.contains(sid) {
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
}

// Observability: figures, shard totals, reloads.
impl Broker {
    /// Gauges at this instant: walks every session (cheap at scrape rates;
    /// never called on the publish path).
    pub fn gauges(&self) -> Gauges {
        let mut g = self.shard_gauges();
        if let Some(o) = &self.others {
            g.add(&o.gauges);
        }
        g
    }

    /// This core's figures, without the other shards'.
    pub fn shard_figures(&self) -> ShardFigures {
        ShardFigures {
            metrics: self.metrics.clone(),
            gauges: self.shard_gauges(),
            shell: self.shell_stats.clone(),
            listeners: Vec::new(),
        }
    }

    /// The other shards' latest figures, added to this core's in what it
    /// reports (`$SYS`, [`Broker::gauges`], [`Broker::total_metrics`]).
    pub fn set_other_shards(&mut self, others: Option<ShardFigures>) {
        self.others = others.map(Box::new);
    }

    /// The other shards' figures, as last set.
    pub fn other_shards(&self) -> Option<&ShardFigures> {
        self.others.as_deref()
    }

    /// The counters of every shard together.
    pub fn total_metrics(&self) -> super::metrics::Metrics {
        let mut m = self.metrics.clone();
        if let Some(o) = &self.others {
            super::metrics::Counted::add(&mut m, &o.metrics);
        }
        m
    }

    /// This core's gauges, without the other shards'.
    pub fn shard_gauges(&self) -> Gauges {
        let mut g = Gauges {
            connections: self.conns.len(),
            retained: self.store.len(),
            log_suppressed: self.log_limit.suppressed_total(),
            ..Gauges::default()
        };
        for s in self.sessions.values() {
            if s.conn.is_some() {
                g.sessions_online += 1;
                g.queued_bytes_online += s.online_cost();
            } else {
                g.sessions_offline += 1;
            }
            g.queued_messages += s.queue_len();
            g.queued_messages_max = g.queued_messages_max.max(s.queue_len());
            g.queued_bytes += s.queued_bytes();
            g.queued_bytes_max = g.queued_bytes_max.max(s.queued_bytes());
            g.inflight += s.flight().inflight.len();
            g.inflight_max = g.inflight_max.max(s.flight().inflight.len());
            g.subscriptions += s.subscriptions.len();
        }
        g
    }

    /// The store's figures for `/metrics` and `/readyz`.
    pub fn store_figures(&self) -> StoreFigures {
        let mut f = StoreFigures {
            open: true,
            ..StoreFigures::default()
        };
        if let Some(s) = self.store_stats() {
            f.durable = true;
            f.size_bytes = s.log_bytes;
            f.live_bytes = s.live_bytes;
            f.records = s.records;
            f.commits = s.commits;
            f.fsyncs = s.fsyncs;
            f.bytes_written = s.bytes_written;
            f.compactions = s.compactions;
        }
        f
    }

    /// Whether a per-client error of this `kind` may be logged now: the one
    /// rate limit every such log line goes through. `Some(n)`: log it,
    /// mentioning the `n` lines of this kind held back since the last one;
    /// `None`: stay quiet (counted in [`Gauges::log_suppressed`]).
    pub fn log_gate(&mut self, now: Instant, kind: &str) -> Option<u64> {
        match self.log_limit.check(now, kind) {
            Verdict::Log { suppressed } => Some(suppressed),
            Verdict::Suppress => None,
        }
    }

    /// Put a new configuration in force without dropping a connection,
    /// all or nothing: the configuration is validated, the settings that
    /// need a restart ([`crate::config::RELOAD_CLASSES`]) are kept at their
    /// old values,
    /// then `security` reads the password and ACL files the resulting
    /// configuration names. Only when all of that succeeded are the limits,
    /// the password files and the ACLs swapped in, at once; an error
    /// changes nothing. Sessions online now are put under the new ACL.
    ///
    /// Limits apply to what happens from now on: a queue already longer
    /// than a lowered `max_queued_messages` is not trimmed, it drains.
    pub fn reload(
        &mut self,
        now: Instant,
        mut new: Config,
        security: impl FnOnce(&Config) -> Result<Option<SecurityConfig>, String>,
    ) -> Result<ReloadOutcome, String> {
        new.validate().map_err(|e| e.to_string())?;
        // Which settings change now and which keep their value in force is
        // decided by one table, `crate::config::RELOAD_CLASSES`.
        let r = self.config.reconcile(&mut new);
        let out = ReloadOutcome {
            changed: r.changed,
            needs_restart: r.needs_restart,
            kept: r.kept,
        };
        // Everything read and checked: from here on nothing can fail.
        let security = security(&new)?;
        if self.config.sys_interval == 0 && new.sys_interval > 0 {
            self.timers.arm(now, super::timers::Timer::Sys);
        }
        self.config = new;
        if let Some(security) = security {
            // Connected sessions move to their listener's new ACL.
            self.set_security(security);
        }
        Ok(out)
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
        ReasonCode::SERVER_MOVED => "server moved: connect to the server reference",
        ReasonCode::USE_ANOTHER_SERVER => "use another server",
        _ => "disconnected by the server",
    }
}

//! CONNECT, DISCONNECT, session attach / detach / end, and wills.

use super::auth::Refusal;
use super::broker::Broker;
use super::connection::Phase;
use super::ids::{ConnId, SessionId};
use super::message::{copy_str, later, own_properties, Message};
use super::outbox::Outgoing;
use super::session::{InflightState, PendingWill, Session};
use super::timers::Timer;
use std::rc::Rc;
use std::time::{Duration, Instant};
use zerofan_codec::{
    ConnAck, Connect, Disconnect, MqttStr, Packet, Properties, Publish, ReasonCode, Will,
};

/// How long a takeover waits for the old connection's input at most: a
/// connection that does not read (or whose outbox is full) must not hold
/// its successor for long.
const TAKEOVER_DRAIN: Duration = Duration::from_millis(300);

/// A CONNECT waiting for the input of the connection it takes over.
#[derive(Debug)]
pub(crate) struct PendingTakeover {
    old: ConnId,
    connect: Box<Connect>,
}

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
        let sid = self.by_client.get(client_id)?;
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
        c.phase = Phase::AwaitingTakeover;
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
            Some(c) if c.phase == Phase::AwaitingTakeover => c.phase = Phase::AwaitingConnect,
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
        if self.claims.must_claim(conn, &connect) {
            if self.lease.lost() {
                // Cut off from the majority: no claim could be granted.
                self.metrics.claims_refused += 1;
                self.refuse(now, conn, ReasonCode::SERVER_UNAVAILABLE);
                return;
            }
            // In a cluster, the client id must be this node's first.
            if let Some(c) = self.conns.get_mut(&conn) {
                c.phase = Phase::AwaitingAuth;
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
            // Kept for the session's life: must not pin the CONNECT's buffer.
            copy_str(&client_id)
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
                    client_id,
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
            .by_client
            .get(&client_id)
            .and_then(|sid| self.sessions.get(sid))
            .and_then(|s| s.conn)
        {
            self.metrics.takeovers += 1;
            if !clean_start {
                if let Some(s) = self
                    .by_client
                    .get(&client_id)
                    .and_then(|sid| self.sessions.get_mut(sid))
                {
                    s.resuming = true;
                }
            }
            self.close(now, old, Some(ReasonCode::SESSION_TAKEN_OVER), true);
            if let Some(s) = self
                .by_client
                .get(&client_id)
                .and_then(|sid| self.sessions.get_mut(sid))
            {
                s.resuming = false;
            }
        }

        let existing = self.by_client.get(&client_id).copied();
        if clean_start {
            if let Some(sid) = existing {
                self.end_session(now, sid);
            }
        }
        let resumed = if clean_start { None } else { existing };
        let sid = match resumed {
            Some(sid) => sid,
            None => {
                let sid = SessionId(self.next_session);
                self.next_session += 1;
                self.sessions
                    .insert(sid, Box::new(Session::new(client_id.clone(), protocol)));
                self.by_client.insert(client_id.clone(), sid);
                sid
            }
        };
        let session_present = resumed.is_some();
        if let Some(s) = self.sessions.get_mut(&sid) {
            s.conn = Some(conn);
            s.protocol = protocol;
            s.expiry_interval = expiry;
            s.expires_at = None;
            // Reconnecting before the will delay passed cancels the will (MQTT-3.1.3-9).
            let cancelled = s.pending_will.take().is_some();
            self.dur_connected(sid, cancelled);
        }

        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.phase = Phase::Connected(sid);
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
        if let Some(at) = c.keep_alive_deadline() {
            // The connect timeout armed at open (due by now + connect_timeout)
            // checks keep alive when it fires; a second entry is needed only
            // for a deadline before it. One heap entry per connection, not two.
            if at < now + Duration::from_secs(self.config.connect_timeout) {
                self.timers.arm(at, Timer::KeepAlive(conn));
            }
        }
        self.metrics.clients_connected_total += 1;
        if self.events.on() {
            let user = self
                .conns
                .get(&conn)
                .and_then(|c| c.sec.username.as_deref());
            self.events.connected(&client_id, user, session_present);
        }
        self.auth_attach(conn, sid, client_id.as_str());
        tracing::debug!(%conn, client_id = %client_id, ?protocol, session_present, "connected");

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
            if !id.is_empty() && !self.by_client.contains_key(&id) {
                return id;
            }
        }
    }

    /// Resend what was in flight when the last connection dropped, in the
    /// original order (MQTT-4.4.0-1): PUBREL at once, PUBLISH with DUP as
    /// the client's Receive Maximum allows (see `fill_batch`).
    fn redeliver(&mut self, conn: ConnId, sid: SessionId) {
        let (Some(s), Some(c)) = (self.sessions.get_mut(&sid), self.conns.get_mut(&conn)) else {
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
            let current = self.sessions.get(&sid).map_or(0, |s| s.expiry_interval);
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
            if let Some(s) = self.sessions.get_mut(&sid) {
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
        let Some(s) = self.sessions.get_mut(&sid) else {
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
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if offline {
            // What waits for an absent client may wait long: small messages
            // get their own bytes instead of pinning publishers' buffers.
            self.metrics.compactions += s.compact();
        }
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        let shares: Vec<Box<str>> = s
            .flight()
            .subscriptions
            .keys()
            .filter(|f| f.starts_with("$share/"))
            .cloned()
            .collect();
        for share in shares {
            self.hand_over_shared(now, sid, &share, true);
        }
        if let Some((will, delay)) = will {
            // The will waits for its delay or the session's end, whichever
            // comes first (MQTT-3.1.3-9).
            let delay = delay.min(expiry);
            if delay == 0 {
                self.publish_will(now, *will);
            } else if let Some(at) = later(now, delay) {
                if let Some(s) = self.sessions.get_mut(&sid) {
                    s.pending_will = Some(Box::new(PendingWill { will: *will, at }));
                }
                self.timers.arm(at, Timer::Will(sid));
            }
        }
        if expiry == 0 {
            self.end_session(now, sid);
        } else if let Some(at) = later(now, expiry).filter(|_| expiry != u32::MAX) {
            if let Some(s) = self.sessions.get_mut(&sid) {
                s.expires_at = Some(at);
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
        if let Some(conn) = self.sessions.get(&sid).and_then(|s| s.conn) {
            // Only reached for clean-start replacement after a takeover, where
            // the old connection is already closing; make sure it is detached.
            if let Some(c) = self.conns.get_mut(&conn) {
                c.phase = Phase::Closing;
            }
        }
        let filters: Vec<Box<str>> = self
            .sessions
            .get(&sid)
            .map(|s| s.flight().subscriptions.keys().cloned().collect())
            .unwrap_or_default();
        for filter in &filters {
            if filter.starts_with("$share/") {
                self.hand_over_shared(now, sid, filter, false);
            }
            self.trie_remove(filter, sid);
        }
        self.auth_forget(sid);
        self.caught_up(sid);
        let Some(mut s) = self.sessions.remove(&sid) else {
            return;
        };
        if self.by_client.get(&s.client_id) == Some(&sid) {
            self.by_client.remove(&s.client_id);
        }
        self.dur_session_ended(s.client_id.as_str(), s.stored);
        if let Some(w) = s.pending_will.take() {
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

/// A will that owns its bytes: it may wait for hours, and must not pin the
/// CONNECT's read buffer meanwhile.
fn own_will(w: Will) -> Will {
    Will {
        topic: copy_str(&w.topic),
        payload: bytes::Bytes::copy_from_slice(&w.payload),
        qos: w.qos,
        retain: w.retain,
        properties: own_properties(&w.properties).into(),
    }
}

/// A client identifier nobody can guess: 128 random bits from the OS
/// (`zerofan-` and 32 hex digits). Sequential ids would let any client that
/// may connect take over another client's assigned session by guessing.
fn random_client_id() -> String {
    let mut bits = [0u8; 16];
    if getrandom::fill(&mut bits).is_err() {
        // No OS randomness (never seen on Linux): SipHash with the process's
        // random keys over a counter and the time is still unguessable.
        use std::hash::{BuildHasher, Hasher};
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let keys = std::collections::hash_map::RandomState::new();
        for half in bits.chunks_mut(8) {
            let mut h = keys.build_hasher();
            h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    let mut id = String::with_capacity(8 + 32);
    id.push_str("zerofan-");
    for b in bits {
        use std::fmt::Write;
        let _ = write!(id, "{b:02x}");
    }
    id
}

//! Authentication, access control and per-connection limits in the core.
//!
//! The shell reads the files (see [`crate::security`]) and hands the core a
//! [`SecurityConfig`]: per listener, whether anonymous clients may connect,
//! the password file, the ACL, and `use_identity_as_username`. Each
//! connection is opened with a [`ConnectionMeta`] naming its listener and
//! its client certificate's identity.
//!
//! # CONNECT
//!
//! In this order (the first refusal wins; CONNACK, then close):
//!
//! 1. Limits decided when the connection was opened: `max_connections`
//!    (overall or the listener's) → 0x97; `max_connection_rate` → 0x9F.
//! 2. Login throttling: while the peer address is penalised for earlier
//!    failures of the same username ([`zerofan_auth::FailureTracker`]),
//!    the CONNECT is refused at once with 0x9F and a reason string (3.1.1:
//!    0x03, server unavailable) without checking the password, and
//!    counted (`auth_throttled`). We refuse
//!    rather than hold the answer: nothing waits in memory for an attacker,
//!    and a client sees at once that it must wait.
//! 3. `use_identity_as_username`: the certificate's CN is the username (the
//!    password file is not consulted); no CN → 0x87.
//! 4. No username: allowed only with `allow_anonymous` → else 0x87.
//! 5. Username with a password file: the password must match → else 0x86
//!    (3.1.1: 0x04). Username without a password file: allowed only with
//!    `allow_anonymous` (as mosquitto 2.0) → else 0x87.
//!
//! Failures (steps 3-5) are recorded against the (address, username)
//! pair, so one account's failures never lock out another account behind
//! the same address; anonymous refusals are not recorded. A success clears
//! the pair.
//!
//! # Access control
//!
//! With an ACL on the client's listener, [`zerofan_auth::Acl`] decides
//! every PUBLISH (MQTT 5: PUBACK/PUBREC 0x87; 3.1.1: acknowledged as usual
//! and dropped, as mosquitto does; QoS 0 dropped silently), every
//! SUBSCRIBE filter (SUBACK 0x87 / 0x80) and every delivery, retained
//! messages and `$SYS` included (not sent). Read decisions are cached per
//! session and topic. Without an ACL the only cost on the delivery path is
//! one boolean test.

use super::broker::Broker;
use super::hash::HashMap;
use super::http_auth::{
    login_body, AclAction, AuthRequest, HttpAnswer, HttpAuth, HttpAuthSettings, Lookup,
};
use super::ids::{ConnId, SessionId};
use super::limits::{ConnectionRate, PublishLimiter};
use super::scram_auth::{made_up, nonce, ScramPending};
use super::timers::Timer;
use super::token::{login_chain, Grant, HttpLink, JwtAuth, Stop};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use zerofan_auth::scram::{ScramCredentials, ScramHash, ScramServer};
use zerofan_auth::{Access, Acl, PasswordFile, ThrottleConfig};
use zerofan_codec::MqttStr;
use zerofan_codec::{Ack, Packet, Publish, QoS, ReasonCode};

/// Authentication and access settings of one listener.
#[derive(Clone, Debug)]
pub struct ListenerAuth {
    /// Clients without a username may connect.
    pub allow_anonymous: bool,
    /// Usernames and password hashes; `None`: no password file.
    pub passwords: Option<Arc<PasswordFile>>,
    /// Access rules; `None`: everything allowed (except writing `$SYS`).
    pub acl: Option<Arc<Acl>>,
    /// The client certificate's CN is the username.
    pub use_identity_as_username: bool,
    /// Most simultaneous connections on this listener; 0: no limit.
    pub max_connections: usize,
}

impl Default for ListenerAuth {
    /// Anonymous allowed, no files: the broker as it was without security.
    fn default() -> Self {
        ListenerAuth {
            allow_anonymous: true,
            passwords: None,
            acl: None,
            use_identity_as_username: false,
            max_connections: 0,
        }
    }
}

/// Everything the core needs to authenticate and authorize, by listener
/// index (the index in [`crate::config::Config::listeners`]).
#[derive(Clone, Debug, Default)]
pub struct SecurityConfig {
    /// Per listener; a listener index past the end gets the defaults.
    pub listeners: Vec<ListenerAuth>,
    /// How repeated login failures from one address are slowed down.
    pub throttle: ThrottleConfig,
    /// `auth_jwt`: tokens in the password field, after the password file.
    pub jwt: Option<Arc<JwtAuth>>,
    /// `auth_http`: the site's HTTP service, last in the chain.
    pub http: Option<Arc<HttpAuthSettings>>,
}

/// What the shell knows about a new connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectionMeta {
    /// Index of the listener it came in on.
    pub listener: usize,
    /// The verified client certificate's Common Name, if any.
    pub identity: Option<String>,
    /// The connection limits' verdict when the shell decided it for every
    /// shard (see [`super::admission`]).
    pub admission: super::admission::Admission,
}

/// Per-connection security state (inside the core's `Connection`).
#[derive(Debug, Default)]
pub struct ConnSecurity {
    /// Listener index.
    pub listener: usize,
    /// Certificate CN.
    pub identity: Option<Box<str>>,
    /// A limit decided at open: refuse CONNECT with this code.
    pub refuse: Option<ReasonCode>,
    /// The authenticated username.
    pub username: Option<Box<str>>,
    /// Publish rate limits, when configured.
    pub publish: Option<Box<PublishLimiter>>,
    /// What only JWT, HTTP or SCRAM logins and throttled refusals use,
    /// boxed so that a plain connection stays small.
    pub extra: Option<Box<ConnExtra>>,
}

/// The rarely used part of [`ConnSecurity`].
#[derive(Debug, Default)]
pub struct ConnExtra {
    /// Reason string for the refusing CONNACK (MQTT 5).
    pub refuse_reason: Option<&'static str>,
    /// The login's own ACL (a token's ACL claim), replacing the listener's.
    pub login_acl: Option<Arc<Acl>>,
    /// When the login's token expires (the connection is then closed).
    pub expires: Option<Instant>,
    /// No ACL applies to this login.
    pub superuser: bool,
    /// The HTTP service's answer to this connection's waiting CONNECT.
    pub http_answer: Option<HttpAnswer>,
    /// The user a SCRAM exchange authenticated, for its CONNECT.
    pub scram_user: Option<Box<str>>,
    /// The mechanism of that exchange: re-authentication must use it too.
    pub scram_hash: Option<ScramHash>,
    /// Authentication Method and Data for the CONNACK (SCRAM server-final).
    pub connack_auth: Option<(MqttStr, bytes::Bytes)>,
}

static NO_EXTRA: ConnExtra = ConnExtra {
    refuse_reason: None,
    login_acl: None,
    expires: None,
    superuser: false,
    http_answer: None,
    scram_user: None,
    scram_hash: None,
    connack_auth: None,
};

impl ConnSecurity {
    /// The extra part (all unset when never allocated).
    pub fn ext(&self) -> &ConnExtra {
        self.extra.as_deref().unwrap_or(&NO_EXTRA)
    }

    /// The extra part, allocated on first use.
    pub fn ext_mut(&mut self) -> &mut ConnExtra {
        self.extra.get_or_insert_with(Box::default)
    }
}

/// Why `authenticate` did not let a CONNECT in.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// CONNACK with this code.
    Code(ReasonCode),
    /// Wait for the HTTP service: the request's cache key and body.
    AskHttp([u8; 32], Vec<u8>),
}

/// Why a login is refused with 0x9F, so that a client (and its operator)
/// can tell throttling from a wrong password.
const THROTTLED_REASON: &str =
    "too many failed logins from this address for this user; retry later";

/// A session under an ACL: who it is, and cached read decisions.
#[derive(Debug)]
struct SessionAcl {
    acl: Arc<Acl>,
    client_id: Box<str>,
    username: Option<Box<str>>,
    cache: HashMap<Box<str>, bool>,
}

/// Read decisions cached per session before the cache is cleared.
const ACL_CACHE_MAX: usize = 256;

/// The core's security state.
#[derive(Debug)]
pub(crate) struct AuthState {
    listeners: Vec<ListenerAuth>,
    default_listener: ListenerAuth,
    tracker: super::admission::LoginThrottle,
    rate: ConnectionRate,
    /// Live connections per listener.
    open: Vec<usize>,
    jwt: Option<Arc<JwtAuth>>,
    pub(crate) http: Option<HttpAuth>,
    scram: HashMap<ConnId, ScramPending>,
    sessions: HashMap<SessionId, SessionAcl>,
}

impl Default for AuthState {
    fn default() -> Self {
        AuthState::new(SecurityConfig::default())
    }
}

impl AuthState {
    pub(crate) fn new(config: SecurityConfig) -> Self {
        AuthState {
            listeners: config.listeners,
            default_listener: ListenerAuth::default(),
            tracker: super::admission::LoginThrottle::new(config.throttle),
            rate: ConnectionRate::default(),
            open: Vec::new(),
            jwt: config.jwt,
            http: config.http.map(HttpAuth::new),
            scram: HashMap::default(),
            sessions: HashMap::default(),
        }
    }

    fn listener(&self, i: usize) -> &ListenerAuth {
        self.listeners.get(i).unwrap_or(&self.default_listener)
    }

    /// Whether any session is under an ACL (the delivery fast path).
    #[inline]
    pub(crate) fn any_acl(&self) -> bool {
        !self.sessions.is_empty()
    }

    /// May session `sid` receive a message on `topic`? Always true for a
    /// session without an ACL.
    pub(crate) fn may_read(&mut self, sid: SessionId, topic: &str) -> bool {
        let Some(s) = self.sessions.get_mut(&sid) else {
            return true;
        };
        if let Some(&v) = s.cache.get(topic) {
            return v;
        }
        let v = s
            .acl
            .check(&s.client_id, s.username.as_deref(), topic, Access::Read);
        if s.cache.len() >= ACL_CACHE_MAX {
            s.cache.clear();
        }
        s.cache.insert(topic.into(), v);
        v
    }
}

impl Broker {
    /// Install authentication and access settings: at start, or on reload
    /// (new logins use the new password files; connected clients keep their
    /// login and move to their listener's new ACL, with a fresh cache).
    pub fn set_security(&mut self, config: SecurityConfig) {
        let open = std::mem::take(&mut self.auth.open);
        let sessions = std::mem::take(&mut self.auth.sessions);
        let mut old_http = self.auth.http.take();
        let scram = std::mem::take(&mut self.auth.scram);
        let shared_throttle = self.auth.tracker.shared();
        let throttle = config.throttle;
        self.auth = AuthState::new(config);
        if let Some(t) = shared_throttle {
            self.auth.tracker.share(t, throttle);
        }
        if let (Some(new), Some(old)) = (self.auth.http.as_mut(), old_http.as_mut()) {
            new.take_pending_from(old);
        }
        self.auth.scram = scram;
        self.auth.open = open;
        self.auth.sessions = sessions;
        // Connected sessions follow their listener's new ACL (a reload).
        let attached: Vec<(ConnId, SessionId)> = self
            .conns
            .iter()
            .filter_map(|(id, c)| c.session().map(|sid| (*id, sid)))
            .collect();
        for (conn, sid) in attached {
            let client_id = match self.sessions.get(&sid) {
                Some(s) => s.client_id.to_string(),
                None => continue,
            };
            self.auth_attach(conn, sid, &client_id);
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
        let on_listener = self.auth.open.get(listener).copied().unwrap_or(0);
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
            .rate
            .allow(peer.ip(), now, self.config.max_connection_rate)
        {
            self.metrics.security.refused_connection_rate += 1;
            Some(ReasonCode::CONNECTION_RATE_EXCEEDED)
        } else {
            None
        };
        let id = self.connection_opened(now, peer);
        if self.auth.open.len() <= listener {
            self.auth.open.resize(listener + 1, 0);
        }
        self.auth.open[listener] += 1;
        if let Some(c) = self.conns.get_mut(&id) {
            c.sec.listener = listener;
            c.sec.identity = meta.identity.map(String::into_boxed_str);
            c.sec.refuse = refuse;
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
            .is_some_and(|c| c.sec.refuse.is_some())
    }

    /// The certificate identity `conn` opened with, to open it again on
    /// another shard.
    pub fn identity(&self, conn: ConnId) -> Option<String> {
        let c = self.conns.get(&conn)?;
        c.sec.identity.as_deref().map(str::to_owned)
    }

    /// Share one login-failure memory with the other shards' cores (call
    /// before the first connection; kept across reloads).
    pub fn share_login_throttle(
        &mut self,
        tracker: std::sync::Arc<std::sync::Mutex<zerofan_auth::FailureTracker>>,
    ) {
        let config = self.auth.tracker.config();
        self.auth.tracker.share(tracker, config);
    }

    /// Bookkeeping when a connection is removed.
    pub(crate) fn auth_connection_closed(&mut self, conn: ConnId) {
        self.auth.scram.remove(&conn);
        if let Some(h) = self.auth.http.as_mut() {
            h.forget(conn);
        }
        if let Some(c) = self.conns.get(&conn) {
            if let Some(n) = self.auth.open.get_mut(c.sec.listener) {
                *n = n.saturating_sub(1);
            }
        }
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
        if let Some(code) = c.sec.refuse {
            return Err(Refusal::Code(code));
        }
        let ip = c.peer.ip();
        let l = self.auth.listener(c.sec.listener);
        // Who is trying: failures are counted per (address, this name);
        // an attempt without one is anonymous and never counted.
        let login_name: Option<&str> = if l.use_identity_as_username {
            c.sec.identity.as_deref()
        } else {
            username
        };
        if let Some(name) = login_name {
            if !self.auth.tracker.delay(ip, name, now).is_zero() {
                self.metrics.security.auth_throttled += 1;
                tracing::debug!(%conn, peer = %ip, user = name, "login throttled");
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.sec.ext_mut().refuse_reason = Some(THROTTLED_REASON);
                }
                return Err(Refusal::Code(ReasonCode::CONNECTION_RATE_EXCEEDED));
            }
        }
        let l = self.auth.listener(c.sec.listener);
        let fail_allow = self.auth.http.as_ref().map(|h| h.settings.fail_allow);
        let link = match (answered, fail_allow) {
            (_, None) => HttpLink::Off,
            (Some(a), Some(allow)) => HttpLink::Answer(a, allow),
            (None, Some(_)) => HttpLink::Ask,
        };
        let chain = |link| -> Result<(Option<Box<str>>, Grant), Stop> {
            if l.use_identity_as_username {
                return match &c.sec.identity {
                    Some(cn) => Ok((Some(cn.clone()), Grant::default())),
                    None => Err(Stop::Refuse(ReasonCode::NOT_AUTHORIZED)),
                };
            }
            match username {
                None if l.allow_anonymous => Ok((None, Grant::default())),
                None => Err(Stop::Refuse(ReasonCode::NOT_AUTHORIZED)),
                Some(u) => login_chain(l, self.auth.jwt.as_deref(), link, now, u, password)
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
            let listener = c.sec.listener;
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
                    self.auth.tracker.record_success(ip, name);
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
                    self.auth.tracker.record_failure(ip, name, now);
                }
                let peer = self.conns.get(&conn).map(|c| c.peer);
                tracing::debug!(%conn, ?peer, reason = code.0, "login refused");
                Err(Refusal::Code(code))
            }
        }
    }

    /// The connection is attached to session `sid` as `client_id`: put the
    /// session under its listener's ACL (or take it out of any).
    pub(crate) fn auth_attach(&mut self, conn: ConnId, sid: SessionId, client_id: &str) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let acl = match c.sec.ext().superuser {
            true => None,
            false => c
                .sec
                .ext()
                .login_acl
                .clone()
                .or_else(|| self.auth.listener(c.sec.listener).acl.clone()),
        };
        match acl {
            Some(acl) => {
                let username = c.sec.username.clone();
                self.auth.sessions.insert(
                    sid,
                    SessionAcl {
                        acl,
                        client_id: client_id.into(),
                        username,
                        cache: HashMap::default(),
                    },
                );
            }
            None => {
                self.auth.sessions.remove(&sid);
            }
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
        c.phase = super::connection::Phase::AwaitingAuth;
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
            Some(c) if c.phase == super::connection::Phase::AwaitingAuth => {
                c.phase = super::connection::Phase::AwaitingConnect;
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
        let client = self.sessions.get(&sid)?.client_id.to_string();
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
        let Some(client) = self.sessions.get(&sid).map(|s| s.client_id.to_string()) else {
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
        !self.auth.scram.is_empty() && self.auth.scram.contains_key(&conn)
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
            .filter(|_| self.auth.listener(c.sec.listener).passwords.is_some());
        let Some(hash) = offered else {
            self.metrics.security.auth_not_authorized += 1;
            return Err(ReasonCode::BAD_AUTHENTICATION_METHOD);
        };
        if let Some(code) = c.sec.refuse {
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
        if !self.auth.tracker.delay(ip, &user, now).is_zero() {
            self.metrics.security.auth_throttled += 1;
            return Err(ReasonCode::CONNECTION_RATE_EXCEEDED);
        }
        let creds = self
            .auth
            .listener(c.sec.listener)
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
        self.auth.scram.insert(
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
        let Some(mut p) = self.auth.scram.remove(&conn) else {
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
                    self.auth.tracker.record_failure(ip, &user, now);
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
        let (ip, listener) = (c.peer.ip(), c.sec.listener);
        let data = a.properties.authentication_data.clone().unwrap_or_default();
        let pending = self.auth.scram.remove(&conn);
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
                            self.auth.scram.insert(
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
                self.auth.tracker.record_failure(ip, &user, now);
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
        self.auth.sessions.remove(&sid);
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
            match self.auth.sessions.get(&sid) {
                Some(s) => {
                    s.acl
                        .check(&s.client_id, s.username.as_deref(), &p.topic, Access::Write)
                }
                None => true,
            }
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
        let by_file = match self.auth.sessions.get(&sid) {
            Some(s) => s
                .acl
                .check_subscribe(&s.client_id, s.username.as_deref(), plain),
            None => true,
        };
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

/// An HTTP ACL answer as a decision: `ignore` leaves it to the ACL file
/// (which allowed it, or the service would not have been asked).
fn acl_allows(a: HttpAnswer, fail_allow: bool) -> bool {
    match a {
        HttpAnswer::Allow { .. } | HttpAnswer::Ignore => true,
        HttpAnswer::Deny => false,
        HttpAnswer::Failed | HttpAnswer::TimedOut => fail_allow,
    }
}

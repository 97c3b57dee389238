//! Authentication, access control and per-connection limits in the core:
//! the policy below, the state it needs (`AuthState`: listeners, login
//! throttle, connection counts, cached ACL decisions, SCRAM exchanges) and
//! per-connection security. The handlers that apply it to a connection are
//! `broker.rs`'s authentication section.
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

use super::hash::HashMap;
use super::http_auth::{HttpAnswer, HttpAuth, HttpAuthSettings};
use super::ids::{ConnId, SessionId};
use super::limits::{ConnectionRate, PublishLimiter};
use super::scram_auth::ScramPending;
use super::token::JwtAuth;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zerofan_auth::scram::ScramHash;
use zerofan_auth::{Access, Acl, FailureTracker, PasswordFile, ThrottleConfig};
use zerofan_codec::MqttStr;
use zerofan_codec::ReasonCode;

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
    /// Certificate CN (only TLS listeners with client certificates).
    pub identity: Option<Box<str>>,
    /// A limit decided at open: refuse CONNECT with this code. Kept here:
    /// its 2 bytes took [`ConnSecurity`] from 40 to 48, and such a
    /// connection is closed at its CONNECT anyway.
    pub refuse: Option<ReasonCode>,
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
    identity: None,
    refuse: None,
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
pub(super) const THROTTLED_REASON: &str =
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

    /// New settings (at start or on reload): what lives across them (live
    /// connection counts, ACL'd sessions, SCRAM exchanges, HTTP requests
    /// in flight, a login throttle shared with other shards) is kept.
    pub(crate) fn reconfigure(&mut self, config: SecurityConfig) {
        let open = std::mem::take(&mut self.open);
        let sessions = std::mem::take(&mut self.sessions);
        let mut old_http = self.http.take();
        let scram = std::mem::take(&mut self.scram);
        let shared_throttle = self.tracker.shared();
        let throttle = config.throttle;
        *self = AuthState::new(config);
        if let Some(t) = shared_throttle {
            self.tracker.share(t, throttle);
        }
        if let (Some(new), Some(old)) = (self.http.as_mut(), old_http.as_mut()) {
            new.take_pending_from(old);
        }
        self.scram = scram;
        self.open = open;
        self.sessions = sessions;
    }

    /// Share one login-failure memory with other shards (kept across
    /// reloads).
    pub(crate) fn share_throttle(&mut self, tracker: Arc<Mutex<FailureTracker>>) {
        let config = self.tracker.config();
        self.tracker.share(tracker, config);
    }

    pub(super) fn listener(&self, i: usize) -> &ListenerAuth {
        self.listeners.get(i).unwrap_or(&self.default_listener)
    }

    /// How long logins of `username` from `addr` are refused for now.
    pub(crate) fn login_delay(&self, addr: IpAddr, username: &str, now: Instant) -> Duration {
        self.tracker.delay(addr, username, now)
    }

    /// A login of `username` from `addr` succeeded: its failures are
    /// forgotten.
    pub(crate) fn login_succeeded(&mut self, addr: IpAddr, username: &str) {
        self.tracker.record_success(addr, username);
    }

    /// A login of `username` from `addr` failed.
    pub(crate) fn login_failed(&mut self, addr: IpAddr, username: &str, now: Instant) {
        self.tracker.record_failure(addr, username, now);
    }

    /// The JWT settings, when logins may carry a token.
    pub(crate) fn jwt(&self) -> Option<&JwtAuth> {
        self.jwt.as_deref()
    }

    /// Session `sid` is under `acl` from now on, with a fresh cache.
    pub(crate) fn set_session_acl(
        &mut self,
        sid: SessionId,
        acl: Arc<Acl>,
        client_id: &str,
        username: Option<Box<str>>,
    ) {
        self.sessions.insert(
            sid,
            SessionAcl {
                acl,
                client_id: client_id.into(),
                username,
                cache: HashMap::default(),
            },
        );
    }

    /// Session `sid` is under no ACL (or gone).
    pub(crate) fn forget_session(&mut self, sid: SessionId) {
        self.sessions.remove(&sid);
    }

    /// May session `sid` publish to `topic`? True without an ACL.
    pub(crate) fn may_write(&self, sid: SessionId, topic: &str) -> bool {
        match self.sessions.get(&sid) {
            Some(s) => s
                .acl
                .check(&s.client_id, s.username.as_deref(), topic, Access::Write),
            None => true,
        }
    }

    /// May session `sid` subscribe to `filter` (`$share/` stripped)? True
    /// without an ACL.
    pub(crate) fn may_subscribe(&self, sid: SessionId, filter: &str) -> bool {
        match self.sessions.get(&sid) {
            Some(s) => s
                .acl
                .check_subscribe(&s.client_id, s.username.as_deref(), filter),
            None => true,
        }
    }

    /// Whether `conn` is in a SCRAM exchange.
    pub(crate) fn in_scram(&self, conn: ConnId) -> bool {
        !self.scram.is_empty() && self.scram.contains_key(&conn)
    }

    /// `conn`'s SCRAM exchange waits for the client's next AUTH.
    pub(crate) fn start_scram(&mut self, conn: ConnId, pending: ScramPending) {
        self.scram.insert(conn, pending);
    }

    /// `conn`'s SCRAM exchange, taken out to go on with it.
    pub(crate) fn take_scram(&mut self, conn: ConnId) -> Option<ScramPending> {
        self.scram.remove(&conn)
    }

    /// Live connections on `listener`.
    pub(crate) fn open_on(&self, listener: usize) -> usize {
        self.open.get(listener).copied().unwrap_or(0)
    }

    /// Whether `ip` may open one more connection now, under `max_rate`.
    pub(crate) fn rate_allows(&mut self, ip: IpAddr, now: Instant, max_rate: u32) -> bool {
        self.rate.allow(ip, now, max_rate)
    }

    /// A connection opened on `listener`.
    pub(crate) fn opened(&mut self, listener: usize) {
        if self.open.len() <= listener {
            self.open.resize(listener + 1, 0);
        }
        self.open[listener] += 1;
    }

    /// Connection `conn`, on `listener` when the core knew it, is gone.
    pub(crate) fn closed(&mut self, conn: ConnId, listener: Option<usize>) {
        self.scram.remove(&conn);
        if let Some(h) = self.http.as_mut() {
            h.forget(conn);
        }
        if let Some(n) = listener.and_then(|l| self.open.get_mut(l)) {
            *n = n.saturating_sub(1);
        }
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

/// An HTTP ACL answer as a decision: `ignore` leaves it to the ACL file
/// (which allowed it, or the service would not have been asked).
pub(super) fn acl_allows(a: HttpAnswer, fail_allow: bool) -> bool {
    match a {
        HttpAnswer::Allow { .. } | HttpAnswer::Ignore => true,
        HttpAnswer::Deny => false,
        HttpAnswer::Failed | HttpAnswer::TimedOut => fail_allow,
    }
}

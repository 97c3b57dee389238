//! Logins decided by the site's HTTP service (`auth_http`), the last link
//! of the login chain, without blocking: the core stays sans-IO.
//!
//! When the chain reaches this link, the answer is looked up in a bounded
//! cache (key: a SHA-256 of the request, see [`zerofan_auth::cache`]). On
//! a miss the CONNECT waits in [`Phase::AwaitingAuth`](super::connection::Phase)
//! (its further input held by the shell, like a takeover wait) and an
//! [`AuthRequest`] is queued; the shell POSTs it (EMQX's JSON body) and
//! hands the [`HttpAnswer`] back with [`Broker::auth_answered`](super::Broker::auth_answered),
//! and the CONNECT is handled again with the answer. Every other client is
//! served meanwhile. A CONNECT waits at most `connect_timeout` (the shell
//! also gives up after `timeout_ms` and answers [`HttpAnswer::TimedOut`]).
//!
//! With `acl_url`, every PUBLISH and every SUBSCRIBE filter the ACL file
//! allows is also checked there (`{"username", "clientid", "address",
//! "topic", "action"}`; deny refuses as the ACL file would, ignore leaves
//! the decision to it), answers cached the same way. On a miss the
//! packet waits and that connection's further input is held until its
//! answers came; then it is handled again. Deliveries are not checked.
//!
//! Failures (time-outs, other statuses, unreadable answers) follow the
//! `fail` policy: `deny` refuses with 0x88 server unavailable (3.1.1: 3),
//! not a failure of the client's (not counted for throttling); `allow`
//! lets the login in. Failures are not cached.

use super::ids::ConnId;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerofan_auth::cache::{cache_key, DecisionCache};
use zerofan_codec::{Connect, Packet};

/// `auth_http` as the core needs it.
#[derive(Clone, Debug)]
pub struct HttpAuthSettings {
    /// Where logins are POSTed.
    pub url: Arc<str>,
    /// Where PUBLISH and SUBSCRIBE checks are POSTed, if anywhere.
    pub acl_url: Option<Arc<str>>,
    /// The shell gives up on an answer after this long.
    pub timeout: Duration,
    /// How long an answer is reused.
    pub cache_ttl: Duration,
    /// Most answers cached.
    pub cache_size: usize,
    /// On failure (time-out, status other than 200, unreadable answer):
    /// allow the login (true) or refuse it with 0x88 (false).
    pub fail_allow: bool,
    /// Most CONNECTs waiting for an answer at once; more are handled as a
    /// failure (`fail`) and counted (`auth_http_overflow`).
    pub max_pending: usize,
}

/// A request for the shell to send.
#[derive(Clone, Debug)]
pub struct AuthRequest {
    /// Names the answer ([`Broker::auth_answered`](super::Broker::auth_answered)).
    pub id: u64,
    /// POST here.
    pub url: Arc<str>,
    /// The JSON body.
    pub body: Vec<u8>,
    /// Give up after this long.
    pub timeout: Duration,
}

/// What the HTTP service said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpAnswer {
    /// 200 `{"result": "allow"}`, superuser when `"is_superuser": true`.
    Allow {
        /// No ACL applies.
        superuser: bool,
    },
    /// 200 `{"result": "deny"}`.
    Deny,
    /// 200 `{"result": "ignore"}`: not the service's to decide.
    Ignore,
    /// Another status, a connection error, or an unreadable body.
    Failed,
    /// No answer within `timeout`.
    TimedOut,
}

impl HttpAnswer {
    /// Read a 200 response body (EMQX's conventions); `Failed` when it is
    /// not one of the expected answers.
    pub fn from_body(body: &[u8]) -> HttpAnswer {
        #[derive(serde::Deserialize)]
        struct Reply {
            result: String,
            #[serde(default)]
            is_superuser: bool,
        }
        match serde_json::from_slice::<Reply>(body) {
            Ok(r) => match r.result.as_str() {
                "allow" => HttpAnswer::Allow {
                    superuser: r.is_superuser,
                },
                "deny" => HttpAnswer::Deny,
                "ignore" => HttpAnswer::Ignore,
                _ => HttpAnswer::Failed,
            },
            Err(_) => HttpAnswer::Failed,
        }
    }
}

struct Pending {
    conn: ConnId,
    connect: Box<Connect>,
    key: [u8; 32],
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the CONNECT: it holds the password.
        f.debug_struct("Pending").field("conn", &self.conn).finish()
    }
}

/// A connection's packet waiting for ACL answers (its input held).
#[derive(Debug)]
struct Held {
    packet: Packet,
    outstanding: usize,
}

/// The HTTP link's state: settings, cache, waiting CONNECTs and packets,
/// requests for the shell.
#[derive(Debug)]
pub(crate) struct HttpAuth {
    pub(crate) settings: Arc<HttpAuthSettings>,
    cache: DecisionCache<HttpAnswer>,
    pending: super::hash::HashMap<u64, Pending>,
    by_conn: super::hash::HashMap<ConnId, u64>,
    /// ACL request id -> (connection, cache key).
    acl_pending: super::hash::HashMap<u64, (ConnId, [u8; 32])>,
    held: super::hash::HashMap<ConnId, Held>,
    /// Answers for a held packet's replay, used once: failures are not
    /// cached, and the cache may be off (size or TTL 0).
    once: super::hash::HashMap<[u8; 32], HttpAnswer>,
    outgoing: Vec<AuthRequest>,
    next_id: u64,
}

/// An ACL check's action, as EMQX names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AclAction {
    Publish,
    Subscribe,
}

impl AclAction {
    fn name(self) -> &'static str {
        match self {
            AclAction::Publish => "publish",
            AclAction::Subscribe => "subscribe",
        }
    }
}

/// The cache's answer, or why a request is needed.
pub(crate) enum Lookup {
    Hit(HttpAnswer),
    Miss([u8; 32]),
}

impl HttpAuth {
    pub(crate) fn new(settings: Arc<HttpAuthSettings>) -> Self {
        HttpAuth {
            cache: DecisionCache::new(settings.cache_ttl, settings.cache_size),
            settings,
            pending: Default::default(),
            by_conn: Default::default(),
            acl_pending: Default::default(),
            held: Default::default(),
            once: Default::default(),
            outgoing: Vec::new(),
            next_id: 1,
        }
    }

    /// Keep waiting CONNECTs across a reload (their answers still come).
    pub(crate) fn take_pending_from(&mut self, old: &mut HttpAuth) {
        self.pending = std::mem::take(&mut old.pending);
        self.by_conn = std::mem::take(&mut old.by_conn);
        self.acl_pending = std::mem::take(&mut old.acl_pending);
        self.held = std::mem::take(&mut old.held);
        self.once = std::mem::take(&mut old.once);
        self.next_id = old.next_id;
        if Arc::ptr_eq(&self.settings, &old.settings) {
            self.cache = std::mem::replace(&mut old.cache, DecisionCache::new(Duration::ZERO, 0));
        }
    }

    pub(crate) fn lookup(&self, now: Instant, parts: &[&[u8]]) -> Lookup {
        let key = cache_key(parts);
        match self.cache.get(&key, now) {
            Some(a) => Lookup::Hit(a),
            None => Lookup::Miss(key),
        }
    }

    /// Whether another CONNECT may wait.
    pub(crate) fn has_room(&self) -> bool {
        self.pending.len() < self.settings.max_pending
    }

    /// Queue a request; the CONNECT waits for its answer.
    pub(crate) fn ask(
        &mut self,
        conn: ConnId,
        connect: Box<Connect>,
        key: [u8; 32],
        body: Vec<u8>,
    ) {
        let id = self.next_id;
        self.next_id += 1;
        self.outgoing.push(AuthRequest {
            id,
            url: self.settings.url.clone(),
            body,
            timeout: self.settings.timeout,
        });
        self.pending.insert(id, Pending { conn, connect, key });
        self.by_conn.insert(conn, id);
    }

    /// The answer to request `id`: its CONNECT to handle again (cached
    /// when it is a decision).
    pub(crate) fn answered(
        &mut self,
        now: Instant,
        id: u64,
        answer: HttpAnswer,
    ) -> Option<(ConnId, Box<Connect>)> {
        let p = self.pending.remove(&id)?;
        self.by_conn.remove(&p.conn);
        if !matches!(answer, HttpAnswer::Failed | HttpAnswer::TimedOut) {
            self.cache.insert(p.key, answer, now);
        }
        Some((p.conn, p.connect))
    }

    /// The connection is gone: its answers, if they come, are dropped.
    pub(crate) fn forget(&mut self, conn: ConnId) {
        if let Some(id) = self.by_conn.remove(&conn) {
            self.pending.remove(&id);
        }
        self.held.remove(&conn);
    }

    /// Whether ACL checks go to the service.
    pub(crate) fn checks_acl(&self) -> bool {
        self.settings.acl_url.is_some()
    }

    /// The ACL decision for a check, from a replay's answer (used up when
    /// `consume`) or the cache (then with `true`); `Err(key)` when the
    /// service must be asked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn acl_lookup(
        &mut self,
        now: Instant,
        username: &str,
        client_id: &str,
        address: &str,
        topic: &str,
        action: AclAction,
        consume: bool,
    ) -> Result<(HttpAnswer, bool), [u8; 32]> {
        let key = cache_key(&[
            b"acl",
            username.as_bytes(),
            client_id.as_bytes(),
            address.as_bytes(),
            topic.as_bytes(),
            action.name().as_bytes(),
        ]);
        let once = if consume {
            self.once.remove(&key)
        } else {
            self.once.get(&key).copied()
        };
        if let Some(a) = once {
            return Ok((a, false));
        }
        self.cache.get(&key, now).map(|a| (a, true)).ok_or(key)
    }

    /// Ask about one check for `conn`'s held packet.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ask_acl(
        &mut self,
        conn: ConnId,
        key: [u8; 32],
        username: &str,
        client_id: &str,
        address: &str,
        topic: &str,
        action: AclAction,
    ) {
        let Some(url) = self.settings.acl_url.clone() else {
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        let body = serde_json::json!({
            "username": username,
            "clientid": client_id,
            "address": address,
            "topic": topic,
            "action": action.name(),
        })
        .to_string()
        .into_bytes();
        self.outgoing.push(AuthRequest {
            id,
            url,
            body,
            timeout: self.settings.timeout,
        });
        self.acl_pending.insert(id, (conn, key));
    }

    /// Hold `packet` of `conn` until `outstanding` answers came.
    pub(crate) fn hold(&mut self, conn: ConnId, packet: Packet, outstanding: usize) {
        self.held.insert(
            conn,
            Held {
                packet,
                outstanding,
            },
        );
    }

    /// An ACL answer: the held packet to replay once all its answers came.
    pub(crate) fn acl_answered(
        &mut self,
        now: Instant,
        id: u64,
        answer: HttpAnswer,
        fail_allow: bool,
    ) -> Option<(ConnId, Option<Packet>)> {
        let (conn, key) = self.acl_pending.remove(&id)?;
        let decided = match answer {
            HttpAnswer::Failed | HttpAnswer::TimedOut => {
                if fail_allow {
                    HttpAnswer::Allow { superuser: false }
                } else {
                    HttpAnswer::Deny
                }
            }
            a => {
                self.cache.insert(key, a, now);
                a
            }
        };
        let h = self.held.get_mut(&conn)?;
        self.once.insert(key, decided);
        h.outstanding = h.outstanding.saturating_sub(1);
        if h.outstanding > 0 {
            return Some((conn, None));
        }
        Some((conn, self.held.remove(&conn).map(|h| h.packet)))
    }

    /// Whether this is an ACL request's id.
    pub(crate) fn is_acl(&self, id: u64) -> bool {
        self.acl_pending.contains_key(&id)
    }

    pub(crate) fn take_requests(&mut self, out: &mut Vec<AuthRequest>) {
        out.append(&mut self.outgoing);
    }

    pub(crate) fn has_requests(&self) -> bool {
        !self.outgoing.is_empty()
    }

    /// CONNECTs and packets waiting for answers.
    pub(crate) fn waiting(&self) -> usize {
        self.pending.len() + self.held.len()
    }

    /// Whether this connection's input is held for ACL answers.
    pub(crate) fn holds(&self, conn: ConnId) -> bool {
        !self.held.is_empty() && self.held.contains_key(&conn)
    }
}

/// EMQX's login body.
pub(crate) fn login_body(
    username: &str,
    password: &[u8],
    client_id: &str,
    address: &str,
    listener: usize,
) -> Vec<u8> {
    serde_json::json!({
        "username": username,
        "password": String::from_utf8_lossy(password),
        "clientid": client_id,
        "address": address,
        "listener": listener.to_string(),
    })
    .to_string()
    .into_bytes()
}

//! What an operator (the HTTP API) reads from and does to the core: views
//! of sessions and their connections, built on request, and the few
//! administrative actions. The [`Broker`](super::Broker) methods that expose
//! them are one-line hooks in `broker.rs`; the work is here.

use super::connection::Connection;
use super::session::Session;
use super::sessions::Sessions;
use super::slots::ConnTable;
use std::net::SocketAddr;
use zerofan_codec::{Protocol, QoS};

/// A session (and its connection, when connected) as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientView {
    /// The client identifier.
    pub client_id: String,
    /// Whether a connection is attached.
    pub connected: bool,
    /// The authenticated username of the connection, if any.
    pub username: Option<String>,
    /// The connection's peer address.
    pub peer: Option<SocketAddr>,
    /// Index of the listener the connection came in on.
    pub listener: Option<usize>,
    /// `3.1`, `3.1.1` or `5.0`.
    pub protocol: &'static str,
    /// Keep alive in force, seconds.
    pub keep_alive: u16,
    /// Session Expiry Interval, seconds.
    pub expiry_interval: u32,
    /// Messages queued, not yet sent.
    pub queued: usize,
    /// Messages sent, not yet acknowledged.
    pub inflight: usize,
    /// Its subscriptions (filter and options), when asked for.
    pub subscriptions: Vec<SubView>,
    /// How many subscriptions it has.
    pub subscription_count: usize,
}

/// One subscription of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubView {
    /// The topic filter (with its `$share/GROUP/` prefix, if shared).
    pub filter: String,
    /// Maximum QoS granted.
    pub qos: u8,
    /// No Local.
    pub no_local: bool,
    /// Retain As Published.
    pub retain_as_published: bool,
}

/// Why an API publish was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminPublishError {
    /// Not a valid topic name (wildcards, empty, too long, too deep, `$SYS`).
    BadTopic,
    /// Retain asked for while `retain_available` is off.
    RetainUnavailable,
}

fn protocol_name(p: Protocol) -> &'static str {
    match p {
        Protocol::V31 => "3.1",
        Protocol::V311 => "3.1.1",
        Protocol::V5 => "5.0",
    }
}

/// The view of one session; its subscriptions listed when `subs`.
pub(crate) fn view(s: &Session, conns: &ConnTable<Connection>, subs: bool) -> ClientView {
    let conn = s.conn.and_then(|c| conns.get(&c));
    let flight = s.flight();
    let mut subscriptions: Vec<SubView> = if subs {
        s.subscriptions
            .iter()
            .map(|(filter, r)| SubView {
                filter: filter.to_string(),
                qos: r.options.qos as u8,
                no_local: r.options.no_local,
                retain_as_published: r.options.retain_as_published,
            })
            .collect()
    } else {
        Vec::new()
    };
    subscriptions.sort_by(|a, b| a.filter.cmp(&b.filter));
    ClientView {
        client_id: s.client_id.to_string(),
        connected: conn.is_some(),
        username: conn.and_then(|c| c.sec.username.as_deref().map(str::to_string)),
        peer: conn.map(|c| c.peer.addr()),
        listener: conn.map(|c| c.listener()),
        protocol: protocol_name(s.protocol),
        keep_alive: conn.map_or(0, |c| c.keep_alive),
        expiry_interval: s.expiry_interval,
        queued: s.queue_len(),
        inflight: flight.inflight.len(),
        subscription_count: s.subscriptions.len(),
        subscriptions,
    }
}

/// Which sessions a client list shows, and which page of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientQuery {
    /// Client ids starting with this.
    pub prefix: Option<String>,
    /// Connections with this username.
    pub username: Option<String>,
    /// Connections on this listener.
    pub listener: Option<usize>,
    /// Connections from this address (`IP` or `IP:port`).
    pub address: Option<String>,
    /// Only connected (`true`) or offline (`false`) sessions.
    pub connected: Option<bool>,
    /// Matches skipped (by client id order).
    pub offset: usize,
    /// Most views returned.
    pub limit: usize,
    /// List each one's subscriptions.
    pub subscriptions: bool,
}

impl ClientQuery {
    /// Whether `v` (a view another shard made) matches the filters.
    pub fn keeps_view(&self, v: &ClientView) -> bool {
        self.prefix
            .as_ref()
            .is_none_or(|p| v.client_id.starts_with(p.as_str()))
            && self.connected.is_none_or(|want| v.connected == want)
            && self
                .username
                .as_ref()
                .is_none_or(|u| v.username.as_ref() == Some(u))
            && self.listener.is_none_or(|l| v.listener == Some(l))
            && self.address.as_ref().is_none_or(|a| {
                v.peer
                    .is_some_and(|p| p.to_string() == *a || p.ip().to_string() == *a)
            })
    }

    fn keeps(&self, s: &Session, conn: Option<&Connection>) -> bool {
        if let Some(p) = &self.prefix {
            if !s.client_id.starts_with(p.as_str()) {
                return false;
            }
        }
        if let Some(want) = self.connected {
            if conn.is_some() != want {
                return false;
            }
        }
        if let Some(u) = &self.username {
            if conn.and_then(|c| c.sec.username.as_deref()) != Some(u.as_str()) {
                return false;
            }
        }
        if let Some(l) = self.listener {
            if conn.map(|c| c.listener()) != Some(l) {
                return false;
            }
        }
        if let Some(a) = &self.address {
            let hit =
                conn.is_some_and(|c| c.peer.to_string() == *a || c.peer.ip().to_string() == *a);
            if !hit {
                return false;
            }
        }
        true
    }
}

/// The sessions `q` matches: how many, and the views of its page (by
/// client id). Views are built for the page only, so a list of a few
/// clients costs a pass over the sessions, not a copy of them all.
pub(crate) fn views(
    sessions: &Sessions,
    conns: &ConnTable<Connection>,
    q: &ClientQuery,
) -> (usize, Vec<ClientView>) {
    let mut hits: Vec<&Session> = sessions
        .values()
        .filter(|s| q.keeps(s, s.conn.and_then(|c| conns.get(&c))))
        .collect();
    hits.sort_unstable_by(|a, b| a.client_id.cmp(&b.client_id));
    let page = hits
        .iter()
        .skip(q.offset)
        .take(q.limit)
        .map(|s| view(s, conns, q.subscriptions))
        .collect();
    (hits.len(), page)
}

/// Check an API publish's topic and flags against the settings in force.
pub(crate) fn check_publish(
    config: &crate::config::Config,
    topic: &str,
    retain: bool,
) -> Result<(), AdminPublishError> {
    if zerofan_codec::topic::validate_topic_name(topic).is_err()
        || topic.len() > config.max_topic_length
        || topic.split('/').count() > config.max_topic_levels
        || topic.starts_with("$SYS")
    {
        return Err(AdminPublishError::BadTopic);
    }
    if retain && !config.retain_available {
        return Err(AdminPublishError::RetainUnavailable);
    }
    Ok(())
}

/// The QoS of a number 0..=2.
pub fn qos_of(n: u8) -> Option<QoS> {
    match n {
        0 => Some(QoS::AtMostOnce),
        1 => Some(QoS::AtLeastOnce),
        2 => Some(QoS::ExactlyOnce),
        _ => None,
    }
}

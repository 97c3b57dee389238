//! Events for webhooks: what happened to clients, sessions, subscriptions
//! and messages, put in a bounded buffer the shell drains after its calls
//! into the core. Only the kinds a webhook asked for are recorded; with
//! none asked for, each hook costs one test of a zero mask.

use super::message::Message;
use std::rc::Rc;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum EventKind {
    /// A client's CONNECT was accepted.
    ClientConnected,
    /// A connected client's connection ended (any reason).
    ClientDisconnected,
    /// A CONNECT created a new session.
    SessionCreated,
    /// An offline session reached its expiry.
    SessionExpired,
    /// A subscription was made (or replaced).
    SubscriptionCreated,
    /// An UNSUBSCRIBE removed a subscription.
    SubscriptionRemoved,
    /// A client (or the HTTP API) published.
    MessagePublished,
    /// Messages were dropped (the shell reports counts; see `shell::webhook`).
    MessageDropped,
    /// A CONNECT was refused by authentication.
    AuthFailed,
}

impl EventKind {
    /// Every kind, in order.
    pub const ALL: [EventKind; 9] = [
        EventKind::ClientConnected,
        EventKind::ClientDisconnected,
        EventKind::SessionCreated,
        EventKind::SessionExpired,
        EventKind::SubscriptionCreated,
        EventKind::SubscriptionRemoved,
        EventKind::MessagePublished,
        EventKind::MessageDropped,
        EventKind::AuthFailed,
    ];

    /// Its name in webhook payloads and `events` lists.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::ClientConnected => "client.connected",
            EventKind::ClientDisconnected => "client.disconnected",
            EventKind::SessionCreated => "session.created",
            EventKind::SessionExpired => "session.expired",
            EventKind::SubscriptionCreated => "subscription.created",
            EventKind::SubscriptionRemoved => "subscription.removed",
            EventKind::MessagePublished => "message.published",
            EventKind::MessageDropped => "message.dropped",
            EventKind::AuthFailed => "auth.failed",
        }
    }

    /// The kind of a name.
    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Its bit in an [`Events`] mask.
    pub fn bit(self) -> u16 {
        1 << (self as u8)
    }
}

/// One event. Fields that do not apply are `None`.
#[derive(Clone, Debug)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The client identifier: a copy (a session does not share its own,
    /// see `Session::client_id`).
    pub client_id: Option<Box<str>>,
    /// The connection's username.
    pub username: Option<Box<str>>,
    /// Topic filter (subscriptions); a message's topic is in `message`.
    pub topic: Option<Box<str>>,
    /// QoS of a message or subscription.
    pub qos: Option<u8>,
    /// The message (payload, retain), for `message.published`.
    pub message: Option<Rc<Message>>,
    /// An MQTT reason code (disconnect, refused CONNECT).
    pub reason: Option<u8>,
}

impl Event {
    fn new(kind: EventKind, client_id: Option<&str>) -> Event {
        Event {
            kind,
            client_id: client_id.map(Into::into),
            username: None,
            topic: None,
            qos: None,
            message: None,
            reason: None,
        }
    }
}

/// Events held before the shell drains them; past it they are dropped and
/// counted.
pub const MAX_PENDING: usize = 65_536;

/// The core's event buffer.
#[derive(Debug, Default)]
pub struct Events {
    mask: u16,
    pending: Vec<Event>,
    dropped: u64,
}

impl Events {
    /// Record only the kinds in `mask` (see [`EventKind::bit`]).
    pub fn set_mask(&mut self, mask: u16) {
        self.mask = mask;
    }

    /// Whether any kind is recorded.
    #[inline]
    pub fn on(&self) -> bool {
        self.mask != 0
    }

    /// Whether `kind` is recorded.
    #[inline]
    pub fn wants(&self, kind: EventKind) -> bool {
        self.mask & kind.bit() != 0
    }

    fn push(&mut self, e: Event) {
        if self.pending.len() >= MAX_PENDING {
            self.dropped += 1;
        } else {
            self.pending.push(e);
        }
    }

    /// Move the recorded events into `out`; events dropped since start.
    pub fn take(&mut self, out: &mut Vec<Event>) -> u64 {
        out.append(&mut self.pending);
        self.dropped
    }

    /// Events waiting to be taken.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// A CONNECT accepted: `client.connected`, and `session.created` when
    /// no session was resumed.
    pub fn connected(&mut self, client_id: &str, username: Option<&str>, resumed: bool) {
        if !resumed && self.wants(EventKind::SessionCreated) {
            let mut e = Event::new(EventKind::SessionCreated, Some(client_id));
            e.username = username.map(Into::into);
            self.push(e);
        }
        if self.wants(EventKind::ClientConnected) {
            let mut e = Event::new(EventKind::ClientConnected, Some(client_id));
            e.username = username.map(Into::into);
            self.push(e);
        }
    }

    /// A connected client's connection ends, with the DISCONNECT reason the
    /// broker sent, if any.
    pub fn disconnected(
        &mut self,
        client_id: Option<&str>,
        username: Option<&str>,
        reason: Option<u8>,
    ) {
        if self.wants(EventKind::ClientDisconnected) {
            let mut e = Event::new(EventKind::ClientDisconnected, client_id);
            e.username = username.map(Into::into);
            e.reason = reason;
            self.push(e);
        }
    }

    /// A session expired.
    pub fn session_expired(&mut self, client_id: Option<&str>) {
        if self.wants(EventKind::SessionExpired) {
            self.push(Event::new(EventKind::SessionExpired, client_id));
        }
    }

    /// A subscription made (`removed` false) or removed.
    pub fn subscription(
        &mut self,
        client_id: Option<&str>,
        filter: &str,
        qos: Option<u8>,
        removed: bool,
    ) {
        let kind = if removed {
            EventKind::SubscriptionRemoved
        } else {
            EventKind::SubscriptionCreated
        };
        if self.wants(kind) {
            let mut e = Event::new(kind, client_id);
            e.topic = Some(filter.into());
            e.qos = qos;
            self.push(e);
        }
    }

    /// A message published (by `client_id`, or by the API when `None`).
    pub fn published(&mut self, client_id: Option<&str>, msg: &Rc<Message>) {
        if self.wants(EventKind::MessagePublished) {
            // The topic is the message's: no copy per event.
            let mut e = Event::new(EventKind::MessagePublished, client_id);
            e.qos = Some(msg.qos as u8);
            e.message = Some(msg.clone());
            self.push(e);
        }
    }

    /// A CONNECT refused by authentication, with its reason code.
    pub fn auth_failed(&mut self, client_id: &str, username: Option<&str>, reason: u8) {
        if self.wants(EventKind::AuthFailed) {
            let mut e = Event::new(EventKind::AuthFailed, Some(client_id));
            e.username = username.map(Into::into);
            e.reason = Some(reason);
            self.push(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_wanted_kinds_are_kept_and_the_buffer_is_bounded() {
        let id = "c";
        let mut ev = Events::default();
        ev.connected(id, None, false);
        assert_eq!(ev.pending(), 0, "nothing recorded without a mask");
        ev.set_mask(EventKind::ClientConnected.bit());
        ev.connected(id, Some("u"), false);
        let mut out = Vec::new();
        ev.take(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].kind, EventKind::ClientConnected);
        assert_eq!(out[0].username.as_deref(), Some("u"));
        for _ in 0..MAX_PENDING + 3 {
            ev.connected(id, None, true);
        }
        assert_eq!(ev.pending(), MAX_PENDING);
        assert_eq!(ev.take(&mut out), 3);
    }

    #[test]
    fn names_round_trip() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_name(k.name()), Some(k));
        }
        assert_eq!(EventKind::from_name("client.exploded"), None);
    }
}

//! The index: which records of the log are live, where they are, and how
//! many references each stored message has.
//!
//! It holds no payloads and no decoded data, only `(offset, length)` of the
//! records that make up the live state, so it stays small (a few dozen bytes
//! per queue entry) and compaction is a list of byte ranges to copy. The same
//! [`Model::apply`] runs when the broker stages an operation and when
//! recovery replays the log, so both always agree on what is live.

use crate::format::{self, MsgBody, Record};
use crate::hash::{HashMap, HashSet};
use crate::types::{
    EntryId, InflightPhase, MsgId, QueueEntry, RecoveredEntry, RecoveredInflight,
    RecoveredRetained, RecoveredSession, RecoveredSubscription, SessionMeta, StoredMessage,
    StoredWill,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where one record lies in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub off: u64,
    pub len: u32,
}

struct MsgSlot {
    span: Span,
    refs: u32,
}

struct QueueSlot {
    span: Span,
    msg: u64,
}

/// An inflight delivery: while the PUBLISH is unacknowledged, the `Enqueue`
/// record that described it and the `Send` record that moved it; once PUBREC
/// arrived, only the `Pubrec` record.
struct InflightSlot {
    order: u64,
    enqueue: Option<Span>,
    step: Span,
    msg: Option<u64>,
}

pub(crate) struct SessionSlot {
    pub client: String,
    meta: Span,
    subs: HashMap<Box<[u8]>, Span>,
    queue: BTreeMap<u64, QueueSlot>,
    inflight: HashMap<u16, InflightSlot>,
    qos2: HashMap<u16, Span>,
    will: Option<Span>,
    /// The newest `Epoch` record of the session.
    epoch: Option<Span>,
}

impl SessionSlot {
    pub fn has_entry(&self, entry: u64) -> bool {
        self.queue.contains_key(&entry)
    }
    pub fn inflight_phase(&self, pid: u16) -> Option<InflightPhase> {
        self.inflight.get(&pid).map(|f| match f.msg {
            Some(_) => InflightPhase::PublishSent,
            None => InflightPhase::PubrecReceived,
        })
    }
    pub fn has_qos2(&self, pid: u16) -> bool {
        self.qos2.contains_key(&pid)
    }
}

/// The live state of the log, by record position.
#[derive(Default)]
pub(crate) struct Model {
    msgs: HashMap<u64, MsgSlot>,
    sessions: HashMap<u32, SessionSlot>,
    keys: HashMap<String, u32>,
    retained: HashMap<Box<[u8]>, (Span, u64)>,
    /// Bytes of live records.
    pub live: u64,
    order: u64,
    /// Messages whose reference count fell to (or started at) zero since the
    /// last [`Model::sweep`].
    maybe_dead: Vec<u64>,
    /// Messages a writer sharing this store put and has not committed yet
    /// (see [`Model::pin`]): not swept, whoever commits.
    pinned: HashSet<u64>,
    /// Highest ids seen, so new ones are never reused while the log holds them.
    pub max_msg: u64,
    pub max_entry: u64,
    pub max_key: u32,
}

impl Model {
    pub fn key_of(&self, client: &str) -> Option<u32> {
        self.keys.get(client).copied()
    }
    pub fn session(&self, key: u32) -> Option<&SessionSlot> {
        self.sessions.get(&key)
    }
    pub fn has_msg(&self, id: u64) -> bool {
        self.msgs.contains_key(&id)
    }
    pub fn live_messages(&self) -> usize {
        self.msgs.len()
    }

    fn add(&mut self, s: Span) {
        self.live += u64::from(s.len);
    }
    fn sub(&mut self, s: Span) {
        self.live = self.live.saturating_sub(u64::from(s.len));
    }
    fn incref(&mut self, id: u64) -> bool {
        let Some(m) = self.msgs.get_mut(&id) else {
            return false;
        };
        if m.refs == 0 {
            self.live += u64::from(m.span.len);
        }
        m.refs = m.refs.saturating_add(1);
        true
    }
    fn decref(&mut self, id: u64) {
        if let Some(m) = self.msgs.get_mut(&id) {
            if m.refs > 0 {
                m.refs -= 1;
                if m.refs == 0 {
                    self.live = self.live.saturating_sub(u64::from(m.span.len));
                    self.maybe_dead.push(id);
                }
            }
        }
    }

    /// Forget messages nothing references. Runs at commit boundaries only, so
    /// a message may be written and referenced by separate records of one
    /// commit.
    pub fn sweep(&mut self) {
        for id in std::mem::take(&mut self.maybe_dead) {
            if self.pinned.contains(&id) {
                self.maybe_dead.push(id);
            } else if self.msgs.get(&id).is_some_and(|m| m.refs == 0) {
                self.msgs.remove(&id);
            }
        }
    }

    /// Keep message `id` through other writers' commits until
    /// [`Model::unpin`]: with several writers staging into one store, one
    /// writer's commit is not a boundary of another's, whose reference to
    /// the message may still be coming.
    pub fn pin(&mut self, id: u64) {
        self.pinned.insert(id);
    }

    /// Message `id` may go at the next commit if nothing references it.
    pub fn unpin(&mut self, id: u64) {
        self.pinned.remove(&id);
    }

    /// Apply one record found at `span`. Never panics; returns false when the
    /// record referenced something unknown and was ignored (the store's own
    /// operations check first, so this only happens on replay of a log
    /// written by a buggy caller).
    pub fn apply(&mut self, rec: &Record<'_>, span: Span) -> bool {
        match *rec {
            Record::Message { id, .. } => {
                self.max_msg = self.max_msg.max(id);
                if self.msgs.contains_key(&id) {
                    return false;
                }
                self.msgs.insert(id, MsgSlot { span, refs: 0 });
                self.maybe_dead.push(id);
            }
            Record::Retain { msg, topic } => {
                if !self.incref(msg) {
                    return false;
                }
                if let Some((old, old_msg)) = self.retained.insert(topic.into(), (span, msg)) {
                    self.sub(old);
                    self.decref(old_msg);
                }
                self.add(span);
            }
            Record::Unretain { topic } => {
                if let Some((old, old_msg)) = self.retained.remove(topic) {
                    self.sub(old);
                    self.decref(old_msg);
                }
            }
            Record::Session { key, client, .. } => {
                self.max_key = self.max_key.max(key);
                let client = String::from_utf8_lossy(client).into_owned();
                if let Some(s) = self.sessions.get_mut(&key) {
                    let old = std::mem::replace(&mut s.meta, span);
                    if s.client != client {
                        let previous = std::mem::replace(&mut s.client, client.clone());
                        self.keys.remove(&previous);
                        self.keys.insert(client, key);
                    }
                    self.sub(old);
                } else {
                    if let Some(other) = self.keys.get(&client).copied() {
                        // One client id, one session: a new key replaces the old.
                        self.drop_session(other);
                    }
                    self.keys.insert(client.clone(), key);
                    self.sessions.insert(
                        key,
                        SessionSlot {
                            client,
                            meta: span,
                            subs: HashMap::default(),
                            queue: BTreeMap::new(),
                            inflight: HashMap::default(),
                            qos2: HashMap::default(),
                            will: None,
                            epoch: None,
                        },
                    );
                }
                self.add(span);
            }
            Record::DropSession { key } => {
                if !self.drop_session(key) {
                    return false;
                }
            }
            Record::Subscribe { key, filter, .. } => {
                let Some(s) = self.sessions.get_mut(&key) else {
                    return false;
                };
                let old = s.subs.insert(filter.into(), span);
                if let Some(old) = old {
                    self.sub(old);
                }
                self.add(span);
            }
            Record::Unsubscribe { key, filter } => {
                let Some(s) = self.sessions.get_mut(&key) else {
                    return false;
                };
                if let Some(old) = s.subs.remove(filter) {
                    self.sub(old);
                }
            }
            Record::Enqueue {
                key, entry, msg, ..
            } => {
                self.max_entry = self.max_entry.max(entry);
                if !self.sessions.contains_key(&key) || !self.incref(msg) {
                    return false;
                }
                let old = self
                    .sessions
                    .get_mut(&key)
                    .and_then(|s| s.queue.insert(entry, QueueSlot { span, msg }));
                if let Some(old) = old {
                    self.sub(old.span);
                    self.decref(old.msg);
                }
                self.add(span);
            }
            Record::Dequeue { key, entry } => {
                let Some(s) = self.sessions.get_mut(&key) else {
                    return false;
                };
                let Some(q) = s.queue.remove(&entry) else {
                    return false;
                };
                self.sub(q.span);
                self.decref(q.msg);
            }
            Record::Send { key, entry, pid } => {
                self.order += 1;
                let order = self.order;
                let Some(s) = self.sessions.get_mut(&key) else {
                    return false;
                };
                let Some(q) = s.queue.remove(&entry) else {
                    return false;
                };
                let old = s.inflight.insert(
                    pid,
                    InflightSlot {
                        order,
                        enqueue: Some(q.span),
                        step: span,
                        msg: Some(q.msg),
                    },
                );
                if let Some(old) = old {
                    self.drop_inflight(old);
                }
                self.add(span);
            }
            Record::Pubrec { key, pid } => {
                self.order += 1;
                let order = self.order;
                let Some(s) = self.sessions.get_mut(&key) else {
                    return false;
                };
                let old = s.inflight.insert(
                    pid,
                    InflightSlot {
                        order,
                        enqueue: None,
                        step: span,
                        msg: None,
                    },
                );
                if let (Some(old), Some(s)) = (old, self.sessions.get_mut(&key)) {
                    // Keep the send order of the original PUBLISH.
                    if let Some(f) = s.inflight.get_mut(&pid) {
                        f.order = old.order;
                    }
                    self.drop_inflight(old);
                }
                self.add(span);
            }
            Record::Complete { key, pid } => {
                let Some(s) = self.sessions.get_mut(&key) else {
                    return false;
                };
                let Some(old) = s.inflight.remove(&pid) else {
                    return false;
                };
                self.drop_inflight(old);
            }
            Record::Qos2In { key, pid } => {
                let Some(s) = self.sessions.get_mut(&key) else {
                    return false;
                };
                if let Some(old) = s.qos2.insert(pid, span) {
                    self.sub(old);
                }
                self.add(span);
            }
            Record::Qos2Done { key, pid } => {
                let Some(s) = self.sessions.get_mut(&key) else {
                    return false;
                };
                if let Some(old) = s.qos2.remove(&pid) {
                    self.sub(old);
                }
            }
            Record::Will { key, .. } => {
                if !self.replace_span(key, span, |s| &mut s.will) {
                    return false;
                }
            }
            Record::ClearWill { key } => {
                let Some(s) = self.sessions.get_mut(&key) else {
                    return false;
                };
                if let Some(old) = s.will.take() {
                    self.sub(old);
                }
            }
            Record::Epoch { key, .. } => {
                if !self.replace_span(key, span, |s| &mut s.epoch) {
                    return false;
                }
            }
        }
        true
    }

    /// A record of session `key` that replaces the one before it in the
    /// slot `slot` picks (a will, an epoch); false when there is no such
    /// session.
    fn replace_span(
        &mut self,
        key: u32,
        span: Span,
        slot: impl FnOnce(&mut SessionSlot) -> &mut Option<Span>,
    ) -> bool {
        let Some(s) = self.sessions.get_mut(&key) else {
            return false;
        };
        if let Some(old) = slot(s).replace(span) {
            self.sub(old);
        }
        self.add(span);
        true
    }

    fn drop_inflight(&mut self, f: InflightSlot) {
        if let Some(e) = f.enqueue {
            self.sub(e);
        }
        self.sub(f.step);
        if let Some(m) = f.msg {
            self.decref(m);
        }
    }

    fn drop_session(&mut self, key: u32) -> bool {
        let Some(s) = self.sessions.remove(&key) else {
            return false;
        };
        self.keys.remove(&s.client);
        self.sub(s.meta);
        for (_, span) in s.subs {
            self.sub(span);
        }
        for (_, q) in s.queue {
            self.sub(q.span);
            self.decref(q.msg);
        }
        for (_, f) in s.inflight {
            self.drop_inflight(f);
        }
        for (_, span) in s.qos2 {
            self.sub(span);
        }
        if let Some(w) = s.will {
            self.sub(w);
        }
        if let Some(e) = s.epoch {
            self.sub(e);
        }
        true
    }

    /// Plan a compaction: the byte ranges of the current log to copy, in
    /// order, after a header of `header` bytes. Moves every span to where it
    /// will be in the new log and returns (ranges, new log length).
    ///
    /// Order: messages (so every later record finds its message), then each
    /// session with its epoch, subscriptions, queue, inflight (each `Enqueue` right
    /// before its `Send`), inbound QoS 2 ids and will, then retained slots.
    pub fn plan_compaction(&mut self, header: u64) -> (Vec<(u64, u64)>, u64) {
        self.sweep();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut cursor = header;
        let mut place = |span: &mut Span| {
            match ranges.last_mut() {
                Some((start, len)) if *start + *len == span.off => *len += u64::from(span.len),
                _ => ranges.push((span.off, u64::from(span.len))),
            }
            span.off = cursor;
            cursor += u64::from(span.len);
        };
        let mut msgs: Vec<&mut MsgSlot> = self.msgs.values_mut().collect();
        msgs.sort_by_key(|m| m.span.off);
        for m in msgs {
            place(&mut m.span);
        }
        let mut sessions: Vec<(&u32, &mut SessionSlot)> = self.sessions.iter_mut().collect();
        sessions.sort_by_key(|(k, _)| **k);
        for (_, s) in sessions {
            place(&mut s.meta);
            if let Some(e) = s.epoch.as_mut() {
                place(e);
            }
            for span in s.subs.values_mut() {
                place(span);
            }
            for q in s.queue.values_mut() {
                place(&mut q.span);
            }
            let mut flying: Vec<&mut InflightSlot> = s.inflight.values_mut().collect();
            flying.sort_by_key(|f| f.order);
            for f in flying {
                if let Some(e) = f.enqueue.as_mut() {
                    place(e);
                }
                place(&mut f.step);
            }
            let mut ids: Vec<(&u16, &mut Span)> = s.qos2.iter_mut().collect();
            ids.sort_by_key(|(pid, _)| **pid);
            for (_, span) in ids {
                place(span);
            }
            if let Some(w) = s.will.as_mut() {
                place(w);
            }
        }
        for (span, _) in self.retained.values_mut() {
            place(span);
        }
        self.live = cursor - header;
        (ranges, cursor)
    }

    /// Build the recovery snapshot from the log bytes `data` (which the spans
    /// index). Each message is copied out once into its own allocation and
    /// shared by every entry that references it. Records that cannot be read
    /// back are skipped and counted in the returned number.
    pub fn recovered(&self, data: &[u8]) -> (Vec<RecoveredRetained>, Vec<RecoveredSession>, u64) {
        let mut bad = 0u64;
        let body = |span: Span| -> Option<Record<'_>> {
            let start = usize::try_from(span.off).ok()?;
            match format::read_frame(data, start) {
                format::Frame::Valid { body, .. } => format::decode(body).ok(),
                _ => None,
            }
        };
        let mut messages: HashMap<u64, Arc<StoredMessage>> = HashMap::default();
        for (&id, m) in &self.msgs {
            match body(m.span) {
                Some(Record::Message {
                    msg: MsgBody::Raw(raw),
                    ..
                }) => match format::materialize_message(raw) {
                    Ok(msg) => {
                        messages.insert(id, Arc::new(msg));
                    }
                    Err(_) => bad += 1,
                },
                _ => bad += 1,
            }
        }
        let entry_of = |span: Span| -> Option<RecoveredEntry> {
            match body(span)? {
                Record::Enqueue {
                    entry,
                    msg,
                    flags,
                    sub_ids,
                    share,
                    ..
                } => Some(RecoveredEntry {
                    id: EntryId(entry),
                    entry: QueueEntry {
                        msg: MsgId(msg),
                        qos: flags & 3,
                        retain: flags & 4 != 0,
                        subscription_ids: sub_ids.into_owned(),
                        share: share.map(|s| String::from_utf8_lossy(s).into_owned()),
                    },
                    message: messages.get(&msg)?.clone(),
                }),
                _ => None,
            }
        };
        let mut sessions = Vec::new();
        let mut keys: Vec<&u32> = self.sessions.keys().collect();
        keys.sort();
        for key in keys {
            let Some(s) = self.sessions.get(key) else {
                continue;
            };
            let meta = match body(s.meta) {
                Some(Record::Session {
                    expiry_interval,
                    expires_at_ms,
                    ..
                }) => SessionMeta {
                    expiry_interval,
                    expires_at_ms,
                },
                _ => {
                    bad += 1;
                    continue;
                }
            };
            let (epoch, version) = match s.epoch.map(body) {
                None => (0, 0),
                Some(Some(Record::Epoch { epoch, version, .. })) => (epoch, version),
                Some(_) => {
                    bad += 1;
                    (0, 0)
                }
            };
            let mut subscriptions = Vec::new();
            for span in s.subs.values() {
                match body(*span) {
                    Some(Record::Subscribe {
                        options,
                        id,
                        filter,
                        ..
                    }) => subscriptions.push(RecoveredSubscription {
                        filter: String::from_utf8_lossy(filter).into_owned(),
                        options: format::sub_options(options),
                        id,
                    }),
                    _ => bad += 1,
                }
            }
            subscriptions.sort_by(|a, b| a.filter.cmp(&b.filter));
            let mut queue = Vec::new();
            for q in s.queue.values() {
                match entry_of(q.span) {
                    Some(e) => queue.push(e),
                    None => bad += 1,
                }
            }
            let mut flying: Vec<(&u16, &InflightSlot)> = s.inflight.iter().collect();
            flying.sort_by_key(|(_, f)| f.order);
            let mut inflight = Vec::new();
            for (&packet_id, f) in flying {
                match f.enqueue {
                    Some(span) => match entry_of(span) {
                        Some(e) => inflight.push(RecoveredInflight {
                            packet_id,
                            phase: InflightPhase::PublishSent,
                            entry: Some(e),
                        }),
                        None => bad += 1,
                    },
                    None => inflight.push(RecoveredInflight {
                        packet_id,
                        phase: InflightPhase::PubrecReceived,
                        entry: None,
                    }),
                }
            }
            let mut incoming_qos2: Vec<u16> = s.qos2.keys().copied().collect();
            incoming_qos2.sort_unstable();
            let will = match s.will.map(body) {
                None => None,
                Some(Some(Record::Will {
                    due_ms,
                    armed,
                    expiry,
                    msg: MsgBody::Raw(raw),
                    ..
                })) => match format::materialize_message(raw) {
                    Ok(message) => Some(StoredWill {
                        message,
                        due_at_ms: due_ms,
                        armed,
                        message_expiry_interval: expiry,
                    }),
                    Err(_) => {
                        bad += 1;
                        None
                    }
                },
                Some(_) => {
                    bad += 1;
                    None
                }
            };
            sessions.push(RecoveredSession {
                client_id: s.client.clone(),
                meta,
                subscriptions,
                queue,
                inflight,
                incoming_qos2,
                will,
                epoch,
                version,
            });
        }
        let mut retained = Vec::new();
        for (topic, (_, msg)) in &self.retained {
            match messages.get(msg) {
                Some(m) => retained.push(RecoveredRetained {
                    topic: String::from_utf8_lossy(topic).into_owned(),
                    msg: MsgId(*msg),
                    message: m.clone(),
                }),
                None => bad += 1,
            }
        }
        retained.sort_by(|a, b| a.topic.cmp(&b.topic));
        (retained, sessions, bad)
    }
}

//! Storage interfaces for what must outlive a process once persistence
//! exists: retained messages and session records. The broker talks only to
//! these traits; [`MemoryStore`] keeps everything in memory (`--memory`).

use super::hash::HashMap;
use super::message::Message;
use super::session::SubRecord;
use std::rc::Rc;

/// Where retained messages live.
pub trait RetainedStore {
    /// Set (or replace) the retained message of `msg.topic`.
    fn set(&mut self, msg: Rc<Message>);
    /// Clear the retained message of `topic`.
    fn clear(&mut self, topic: &str);
    /// Every retained message whose topic matches `filter` (a plain filter,
    /// `$share/` already stripped).
    fn matching(&self, filter: &str, out: &mut Vec<Rc<Message>>);
    /// How many retained messages there are.
    fn len(&self) -> usize;
    /// True when there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a durable store keeps about a session (queued messages follow with
/// the durable store's own issue).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRecord {
    /// Client identifier.
    pub client_id: String,
    /// Session Expiry Interval.
    pub expiry_interval: u32,
    /// Subscriptions by filter.
    pub subscriptions: Vec<(String, SubRecord)>,
}

/// Where session records live.
pub trait SessionStore {
    /// Save (or replace) a session record.
    fn save(&mut self, record: SessionRecord);
    /// Forget a session.
    fn remove(&mut self, client_id: &str);
    /// Every saved session, for a restart.
    fn load(&self) -> Vec<SessionRecord>;
}

/// Both stores in memory: nothing survives the process.
#[derive(Default, Debug)]
pub struct MemoryStore {
    retained: HashMap<Box<str>, Rc<Message>>,
    sessions: HashMap<String, SessionRecord>,
}

impl RetainedStore for MemoryStore {
    fn set(&mut self, msg: Rc<Message>) {
        self.retained.insert(msg.topic.as_str().into(), msg);
    }

    fn clear(&mut self, topic: &str) {
        self.retained.remove(topic);
    }

    fn matching(&self, filter: &str, out: &mut Vec<Rc<Message>>) {
        if !filter.contains(['+', '#']) {
            // A plain filter names one topic: no scan.
            out.extend(self.retained.get(filter).cloned());
            return;
        }
        for (topic, msg) in &self.retained {
            if zerofan_codec::topic::matches(filter, topic) {
                out.push(msg.clone());
            }
        }
    }

    fn len(&self) -> usize {
        self.retained.len()
    }
}

impl SessionStore for MemoryStore {
    fn save(&mut self, record: SessionRecord) {
        self.sessions.insert(record.client_id.clone(), record);
    }

    fn remove(&mut self, client_id: &str) {
        self.sessions.remove(client_id);
    }

    fn load(&self) -> Vec<SessionRecord> {
        self.sessions.values().cloned().collect()
    }
}

/// The storage the broker needs: retained messages and sessions.
pub trait Store: RetainedStore + SessionStore {}

impl<T: RetainedStore + SessionStore> Store for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use zerofan_codec::{MqttStr, QoS};

    fn msg(topic: &'static str) -> Rc<Message> {
        Rc::new(Message {
            topic: MqttStr::from_static(topic),
            payload: Bytes::from_static(b"x"),
            qos: QoS::AtMostOnce,
            retain: true,
            properties: Default::default(),
            origin: None,
            expires_at: None,
            owns_bytes: true,
            stored: Default::default(),
            wire: None,
        })
    }

    #[test]
    fn retained_set_clear_match() {
        let mut s = MemoryStore::default();
        s.set(msg("a/b"));
        s.set(msg("a/c"));
        s.set(msg("$SYS/x"));
        let mut out = Vec::new();
        s.matching("a/b", &mut out);
        assert_eq!(out.len(), 1);
        out.clear();
        s.matching("#", &mut out);
        assert_eq!(out.len(), 2, "# does not match $SYS");
        s.clear("a/b");
        out.clear();
        s.matching("a/+", &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(RetainedStore::len(&s), 2);
    }

    #[test]
    fn sessions_save_load_remove() {
        let mut s = MemoryStore::default();
        s.save(SessionRecord {
            client_id: "c".into(),
            expiry_interval: 10,
            subscriptions: Vec::new(),
        });
        assert_eq!(s.load().len(), 1);
        s.remove("c");
        assert!(s.load().is_empty());
    }
}

//! Where retained messages live: the broker routes a new subscription's
//! retained messages from a [`RetainedStore`]; [`MemoryStore`] keeps them in
//! memory. Durability (retained messages, sessions and queues across a
//! restart) is the durable log's (`durable`), which restores into this.

use super::hash::HashMap;
use super::message::Message;
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

/// Retained messages in memory: nothing survives the process.
#[derive(Default, Debug)]
pub struct MemoryStore {
    retained: HashMap<Box<str>, Rc<Message>>,
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

/// The storage the broker reads back: retained messages. (What else must
/// survive a restart, sessions and their queues, goes through the durable
/// log, see `durable`.)
pub trait Store: RetainedStore {}

impl<T: RetainedStore> Store for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use zerofan_codec::{MqttStr, QoS};

    fn msg(topic: &'static str) -> Rc<Message> {
        Rc::new(Message::owned(
            MqttStr::from_static(topic),
            Bytes::from_static(b"x"),
            QoS::AtMostOnce,
            true,
            Default::default(),
            None,
        ))
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
}

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
    /// Retained messages and their bytes (as [`retained_bytes`] counts
    /// them) that count against the quotas: the broker's own `$SYS/` ones
    /// do not.
    fn usage(&self) -> (usize, usize);
    /// [`retained_bytes`] of the retained message of `topic`, if it has one.
    fn size_of(&self, topic: &str) -> Option<usize>;
    /// True when there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Retained messages in memory: nothing survives the process. A tree of
/// topic levels, so that a wildcard visits the levels it can match, not
/// every retained message (a scan of a million took seconds, and the
/// broker's one thread with it); a plain filter is one walk down.
#[derive(Default, Debug)]
pub struct MemoryStore {
    root: Level,
    count: usize,
    /// Of clients' messages only (see `usage`), with `counted`.
    bytes: usize,
    counted: usize,
}

/// What a retained message counts for against `max_retained_bytes`: its
/// topic and payload.
pub fn retained_bytes(msg: &Message) -> usize {
    msg.topic.len() + msg.payload.len()
}

/// One topic level: its retained message, if any, and the levels below.
/// Children are boxed (see the trie's `Node`): a map's spare slots then
/// cost 24 bytes, not a whole level.
#[derive(Default, Debug)]
struct Level {
    msg: Option<Rc<Message>>,
    children: HashMap<Box<str>, Box<Level>>,
}

impl Level {
    /// Every message here and below (`#`); `first`: at the filter's first
    /// level, where wildcards do not match topics starting with `$`.
    fn all(&self, first: bool, out: &mut Vec<Rc<Message>>) {
        out.extend(self.msg.clone());
        for (name, child) in &self.children {
            if !(first && name.starts_with('$')) {
                child.all(false, out);
            }
        }
    }

    fn matching(&self, levels: &[&str], first: bool, out: &mut Vec<Rc<Message>>) {
        match levels.split_first() {
            None => out.extend(self.msg.clone()),
            // `a/#` matches `a` itself (this level's message) and below.
            Some((&"#", _)) => self.all(first, out),
            Some((&"+", rest)) => {
                for (name, child) in &self.children {
                    if !(first && name.starts_with('$')) {
                        child.matching(rest, false, out);
                    }
                }
            }
            Some((name, rest)) => {
                if let Some(child) = self.children.get(*name) {
                    child.matching(rest, false, out);
                }
            }
        }
    }

    /// Take the message at `levels` below; prune levels left empty.
    fn clear(&mut self, levels: &mut std::str::Split<'_, char>) -> Option<Rc<Message>> {
        let Some(name) = levels.next() else {
            return self.msg.take();
        };
        let child = self.children.get_mut(name)?;
        let removed = child.clear(levels);
        if child.msg.is_none() && child.children.is_empty() {
            self.children.remove(name);
        }
        removed
    }
}

impl RetainedStore for MemoryStore {
    fn set(&mut self, msg: Rc<Message>) {
        let mut node = &mut self.root;
        for name in msg.topic.as_str().split('/') {
            if !node.children.contains_key(name) {
                node.children.insert(name.into(), Box::default());
            }
            match node.children.get_mut(name) {
                Some(child) => node = child,
                // Inserted just above.
                None => return,
            }
        }
        let counts = !msg.topic.starts_with("$SYS/");
        if counts {
            self.bytes += retained_bytes(&msg);
        }
        match node.msg.replace(msg) {
            Some(old) if counts => self.bytes -= retained_bytes(&old),
            Some(_) => {}
            None => {
                self.count += 1;
                self.counted += usize::from(counts);
            }
        }
    }

    fn clear(&mut self, topic: &str) {
        if let Some(old) = self.root.clear(&mut topic.split('/')) {
            self.count -= 1;
            if !topic.starts_with("$SYS/") {
                self.counted -= 1;
                self.bytes -= retained_bytes(&old);
            }
        }
    }

    fn matching(&self, filter: &str, out: &mut Vec<Rc<Message>>) {
        let levels: Vec<&str> = filter.split('/').collect();
        self.root.matching(&levels, true, out);
    }

    fn len(&self) -> usize {
        self.count
    }

    fn usage(&self) -> (usize, usize) {
        (self.counted, self.bytes)
    }

    fn size_of(&self, topic: &str) -> Option<usize> {
        let mut node = &self.root;
        for name in topic.split('/') {
            node = node.children.get(name)?;
        }
        node.msg.as_deref().map(retained_bytes)
    }
}

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

    /// The tree finds what matching every topic against the filter finds
    /// (`topic::matches`, the codec's reference), for wildcards anywhere,
    /// empty levels, `$` topics, and after clears that prune levels.
    #[test]
    fn retained_tree_agrees_with_a_scan() {
        let topics = [
            "a", "a/b", "a/c", "a/b/c", "a//b", "/a", "/", "b/a/c", "$SYS/x", "$SYS/x/y", "$foo",
            "a/b/c/d", "x/b/c",
        ];
        let filters = [
            "#",
            "+",
            "a/#",
            "a/+",
            "+/b",
            "+/+",
            "/+",
            "/#",
            "+/#",
            "a/+/c",
            "+/b/c",
            "a/+/+/d",
            "$SYS/#",
            "$SYS/+",
            "+/x",
            "a//b",
            "a/+/b",
            "$foo",
            "a/b/c/d/#",
            "nothing/#",
        ];
        let mut s = MemoryStore::default();
        for t in topics {
            s.set(msg(t));
        }
        // Set twice: still one.
        s.set(msg("a/b"));
        assert_eq!(RetainedStore::len(&s), topics.len());
        let check = |s: &MemoryStore, alive: &[&str]| {
            for f in filters {
                let mut out = Vec::new();
                s.matching(f, &mut out);
                let mut got: Vec<&str> = out.iter().map(|m| m.topic.as_str()).collect();
                got.sort_unstable();
                let mut want: Vec<&str> = alive
                    .iter()
                    .copied()
                    .filter(|t| zerofan_codec::topic::matches(f, t))
                    .collect();
                want.sort_unstable();
                assert_eq!(got, want, "filter {f}");
            }
        };
        check(&s, &topics);
        for gone in ["a/b/c", "a", "$SYS/x", "nope/x"] {
            s.clear(gone);
        }
        let alive: Vec<&str> = topics
            .iter()
            .copied()
            .filter(|t| !["a/b/c", "a", "$SYS/x"].contains(t))
            .collect();
        check(&s, &alive);
        assert_eq!(RetainedStore::len(&s), alive.len());
        for t in &alive {
            s.clear(t);
        }
        assert_eq!(RetainedStore::len(&s), 0);
        assert!(s.root.children.is_empty(), "every level pruned");
    }
}

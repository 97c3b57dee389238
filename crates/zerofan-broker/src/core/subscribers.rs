//! A trie node's direct subscribers, ordered by session: most filters of a
//! device fleet have exactly one (`devices/{id}/cmd`), and a `Vec` with one
//! entry is an allocation of its own (32 bytes with the allocator's size
//! class). One subscriber is kept inline instead; a vector is made for the
//! second, boxed: the enum is then 16 bytes, a `SubEntry`'s size (the tag
//! in its options' spare values), not a `Vec`'s 24, and every node is 8
//! bytes smaller. A node with two subscribers or more pays one more hop.

use super::ids::SessionId;
use super::trie::SubEntry;

#[derive(Debug, Default)]
pub(super) enum Subscribers {
    #[default]
    None,
    /// Exactly one.
    One(SubEntry),
    /// Two and more.
    #[allow(clippy::box_collection)] // 8 bytes inline, not 24 (see above)
    Many(Box<Vec<SubEntry>>),
}

impl Subscribers {
    pub(super) fn as_slice(&self) -> &[SubEntry] {
        match self {
            Subscribers::None => &[],
            Subscribers::One(e) => std::slice::from_ref(e),
            Subscribers::Many(v) => v,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Add `entry`, or replace its session's; true when it is new.
    pub(super) fn upsert(&mut self, entry: SubEntry) -> bool {
        let i = match self
            .as_slice()
            .binary_search_by_key(&entry.session, |e| e.session)
        {
            Ok(i) => {
                match self {
                    Subscribers::None => {}
                    Subscribers::One(e) => *e = entry,
                    Subscribers::Many(v) => v[i] = entry,
                }
                return false;
            }
            Err(i) => i,
        };
        match self {
            Subscribers::None => *self = Subscribers::One(entry),
            Subscribers::Many(v) => v.insert(i, entry),
            Subscribers::One(e) => {
                let mut v = Vec::with_capacity(2);
                v.push(*e);
                v.insert(i, entry);
                *self = Subscribers::Many(Box::new(v));
            }
        }
        true
    }

    /// Remove `session`'s entry; true when there was one.
    pub(super) fn remove(&mut self, session: SessionId) -> bool {
        match self {
            Subscribers::One(e) if e.session == session => {
                *self = Subscribers::None;
                true
            }
            Subscribers::None | Subscribers::One(_) => false,
            Subscribers::Many(v) => {
                let Ok(i) = v.binary_search_by_key(&session, |e| e.session) else {
                    return false;
                };
                v.remove(i);
                if let [one] = v[..] {
                    *self = Subscribers::One(one);
                }
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(s: &Subscribers) -> Vec<u64> {
        s.as_slice().iter().map(|e| e.session.0).collect()
    }

    #[test]
    fn one_inline_then_a_vector_in_session_order() {
        assert_eq!(std::mem::size_of::<Subscribers>(), 16);
        let mut s = Subscribers::default();
        assert!(s.is_empty());
        assert!(s.upsert(SubEntry::plain(5)));
        assert!(matches!(s, Subscribers::One(_)));
        assert!(!s.upsert(SubEntry::plain(5)));
        assert!(s.upsert(SubEntry::plain(2)));
        assert!(s.upsert(SubEntry::plain(9)));
        assert_eq!(sessions(&s), [2, 5, 9]);
        assert!(!s.remove(SessionId(7)));
        assert!(s.remove(SessionId(5)));
        assert!(s.remove(SessionId(2)));
        assert!(matches!(s, Subscribers::One(_)));
        assert_eq!(sessions(&s), [9]);
        assert!(s.remove(SessionId(9)));
        assert!(s.is_empty() && matches!(s, Subscribers::None));
        assert!(!s.remove(SessionId(9)));
        assert_eq!(s.len(), 0);
    }
}

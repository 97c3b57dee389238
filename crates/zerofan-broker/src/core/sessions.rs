//! The sessions, by id and by client id: [`Sessions`] owns both tables and
//! changes them only together, so that the index below can be read.
//!
//! The index by client id holds no second copy of the id: the table holds
//! only session ids (8 bytes a slot), hashed by their session's client id,
//! and a lookup compares against the id the session itself keeps. A copy
//! of the id as the key cost an allocation (about 32 bytes with malloc's
//! header) and 16 bytes more per slot, per connected device.
//!
//! The price is that the index is read together with the sessions: every
//! entry must name a session that is in the map while it is looked up by
//! id. `Sessions` keeps that: an entry goes in with its session and out
//! with it. `ClientIds::remove` needs only the id's hash and the session id,
//! so `Sessions::remove` takes the session out of the map first; nothing
//! outside this module sees the moment between.

use super::hash::Seeded;
use super::ids::SessionId;
use super::session::Session;
use super::slots::SlotTable;
use std::hash::BuildHasher;

/// The sessions the index points into, in slots like `Broker::conns`
/// (see `slots.rs`): inline in pages that never move, where a hash map of
/// boxed sessions cost a 16-byte bucket (up to two per session after it
/// grew) and the allocator's rounding of each box. A session's id names
/// its slot.
type ById = SlotTable<SessionId, Session>;

/// Every session here, by its id and by its client id.
///
/// Invariant: every entry of `by_client` names a session in `by_id`, and is
/// hashed by that session's client id. Both tables change only in
/// [`Sessions::insert`] and [`Sessions::remove`].
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    by_id: ById,
    by_client: ClientIds,
}

impl Sessions {
    /// The session `sid`, if it is here.
    #[inline]
    pub(crate) fn get(&self, sid: SessionId) -> Option<&Session> {
        self.by_id.get(&sid)
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, sid: SessionId) -> Option<&mut Session> {
        self.by_id.get_mut(&sid)
    }

    #[inline]
    pub(crate) fn contains(&self, sid: SessionId) -> bool {
        self.by_id.contains_key(&sid)
    }

    /// The session of `client_id`, if any.
    #[inline]
    pub(crate) fn of_client(&self, client_id: &str) -> Option<SessionId> {
        self.by_client.get(&self.by_id, client_id)
    }

    #[inline]
    pub(crate) fn has_client(&self, client_id: &str) -> bool {
        self.of_client(client_id).is_some()
    }

    /// Add `session` under a new id (never one used before), found by its
    /// client id from now on. The caller has ended any session of that
    /// client id before: the index would point at the new one only. `None`
    /// (and the session dropped) only when 2^32 - 1 sessions are held.
    pub(crate) fn insert(&mut self, session: Session) -> Option<SessionId> {
        let sid = self.by_id.insert(session)?;
        // The index reads the session's client id from its slot, the new
        // one included.
        let client_id = self.by_id.get(&sid).map(|s| &*s.client_id)?;
        let displaced = self.by_client.insert(&self.by_id, client_id, sid);
        debug_assert!(displaced.is_none(), "a client id with two sessions");
        Some(sid)
    }

    /// Take `sid` out of both tables.
    pub(crate) fn remove(&mut self, sid: SessionId) -> Option<Session> {
        let s = self.by_id.remove(&sid)?;
        self.by_client.remove(&s.client_id, sid);
        Some(s)
    }

    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Every session, with its id, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SessionId, &Session)> {
        self.by_id.iter()
    }

    /// Every session, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Session> {
        self.by_id.values()
    }
}

/// Client id to session.
#[derive(Debug, Default)]
struct ClientIds(hashbrown::HashTable<SessionId>);

fn hash(client_id: &str) -> u64 {
    Seeded.hash_one(client_id)
}

/// The entry rehashed when the table grows: by its session's id, which is
/// there (see the module comment).
fn rehash(sessions: &ById) -> impl Fn(&SessionId) -> u64 + '_ {
    move |sid| sessions.get(sid).map_or(0, |s| hash(&s.client_id))
}

impl ClientIds {
    fn get(&self, sessions: &ById, key: &str) -> Option<SessionId> {
        self.0
            .find(hash(key), |sid| {
                sessions.get(sid).is_some_and(|s| *s.client_id == *key)
            })
            .copied()
    }

    /// Point `key` at `sid`; the other sessions of `sessions` with that
    /// client id are in the map (`sid`'s own need not be). The session it
    /// pointed at before.
    fn insert(&mut self, sessions: &ById, key: &str, sid: SessionId) -> Option<SessionId> {
        let h = hash(key);
        let same =
            |x: &SessionId| *x != sid && sessions.get(x).is_some_and(|s| *s.client_id == *key);
        if let Some(old) = self.0.find_mut(h, same) {
            return Some(std::mem::replace(old, sid));
        }
        if self.0.find(h, |x| *x == sid).is_none() {
            self.0.insert_unique(h, sid, rehash(sessions));
        }
        None
    }

    /// Forget `sid` as `client_id`'s session, if it is.
    fn remove(&mut self, client_id: &str, sid: SessionId) -> bool {
        match self.0.find_entry(hash(client_id), |x| *x == sid) {
            Ok(e) => {
                e.remove();
                true
            }
            Err(_) => false,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerofan_codec::Protocol;

    fn new_session(id: &str) -> Session {
        Session::new(id.into(), Protocol::V5)
    }

    fn session(sessions: &mut ById, id: &str) -> (SessionId, Box<str>) {
        let sid = sessions.insert(new_session(id)).unwrap();
        (sid, id.into())
    }

    /// The index on its own: a client id's entry replaced, and removed by
    /// id and hash with its session already gone.
    #[test]
    fn keyed_by_the_sessions_own_client_id() {
        let mut s = ById::default();
        let mut c = ClientIds::default();
        let (one, a) = session(&mut s, "a");
        assert_eq!(c.insert(&s, &a, one), None);
        let (two, a2) = session(&mut s, "a");
        assert_eq!(c.insert(&s, &a2, two), Some(one));
        assert_eq!(c.len(), 1);
        assert!(c.get(&s, &a).is_some() && c.get(&s, "b").is_none());
        assert_eq!(c.get(&s, &a), Some(two));
        // Removed by id and hash, with the session already gone.
        s.remove(&two);
        assert!(!c.remove(&a, one));
        assert!(c.remove(&a, two));
        assert_eq!(c.get(&s, &a), None);
        assert_eq!(c.len(), 0);
        assert_eq!(std::mem::size_of::<SessionId>(), 8);
    }

    #[test]
    fn sessions_are_found_by_id_and_client_id_until_removed() {
        let mut s = Sessions::default();
        let one = s.insert(new_session("a")).unwrap();
        let two = s.insert(new_session("b")).unwrap();
        assert_ne!(one, two);
        assert_eq!(s.len(), 2);
        assert_eq!(s.of_client("a"), Some(SessionId(1)));
        assert_eq!(s.of_client("b"), Some(SessionId(2)));
        assert!(s.has_client("a") && !s.has_client("c") && !s.has_client(""));
        assert_eq!(s.get(SessionId(1)).map(|x| &*x.client_id), Some("a"));
        assert!(s.contains(SessionId(2)) && !s.contains(SessionId(3)));
        s.get_mut(SessionId(2)).unwrap().expiry_interval = 7;
        assert_eq!(s.get(SessionId(2)).unwrap().expiry_interval, 7);

        let gone = s.remove(SessionId(1)).unwrap();
        assert_eq!(&*gone.client_id, "a");
        assert!(s.get(SessionId(1)).is_none() && !s.contains(SessionId(1)));
        assert_eq!(s.of_client("a"), None);
        assert!(s.remove(SessionId(1)).is_none());
        assert_eq!(s.of_client("b"), Some(SessionId(2)));
        assert_eq!(s.len(), 1);
        assert_eq!(s.by_client.len(), 1);

        // The client id is free again: a new session takes it.
        let three = s.insert(new_session("a")).unwrap();
        assert!(three != one && three != two, "ids are never reused");
        assert_eq!(s.of_client("a"), Some(three));
        assert!(
            s.get(one).is_none(),
            "the old id misses the slot's new session"
        );
        let mut all: Vec<_> = s.iter().map(|(sid, x)| (sid, &*x.client_id)).collect();
        all.sort_unstable();
        let mut want = [(two, "b"), (three, "a")];
        want.sort_unstable();
        assert_eq!(all, want);
        assert_eq!(s.values().count(), 2);
    }

    #[test]
    fn many_ids_survive_the_table_growing() {
        let mut s = Sessions::default();
        let mut sids = Vec::new();
        for i in 0..1000 {
            sids.push(s.insert(new_session(&format!("dev-{i}"))).unwrap());
        }
        assert_eq!((s.len(), s.by_client.len()), (1000, 1000));
        for (i, &sid) in sids.iter().enumerate() {
            let id = format!("dev-{i}");
            assert_eq!(s.of_client(&id), Some(sid));
            assert_eq!(s.get(sid).map(|x| &*x.client_id), Some(&*id));
        }
        // Half removed, then the tables grow again past their size (the
        // freed slots taken first): the rest are still found, the removed
        // ones not.
        for &sid in sids.iter().step_by(2) {
            assert!(s.remove(sid).is_some());
        }
        for i in 1000..3000 {
            sids.push(s.insert(new_session(&format!("dev-{i}"))).unwrap());
        }
        for (i, &sid) in sids.iter().enumerate() {
            let found = s.of_client(&format!("dev-{i}"));
            let kept = i >= 1000 || i % 2 == 1;
            assert_eq!(found, kept.then_some(sid), "dev-{i}");
            assert_eq!(s.get(sid).is_some(), kept);
        }
        assert_eq!((s.len(), s.by_client.len()), (2500, 2500));
    }
}

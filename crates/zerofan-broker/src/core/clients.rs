//! Sessions by client id, without a second copy of the id: the table holds
//! only session ids (8 bytes a slot), hashed by their session's client id,
//! and a lookup compares against the id the session itself keeps. A copy
//! of the id as the key cost an allocation (about 32 bytes with malloc's
//! header) and 16 bytes more per slot, per connected device.
//!
//! The price is that the table is read together with the sessions: every
//! entry must name a session that is in the map while it is looked up by
//! id. `remove` needs only the id's hash and the session id, so a session
//! may already be out of the map when its entry goes (`Broker::end_session`).

use super::hash::Seeded;
use super::ids::SessionId;
use super::session::Session;
use std::hash::BuildHasher;

/// The sessions the table points into.
pub(crate) type Sessions = super::hash::HashMap<SessionId, Box<Session>>;

/// Client id to session.
#[derive(Debug, Default)]
pub(crate) struct ClientIds(hashbrown::HashTable<SessionId>);

fn hash(client_id: &str) -> u64 {
    Seeded.hash_one(client_id)
}

/// The entry rehashed when the table grows: by its session's id, which is
/// there (see the module comment).
fn rehash(sessions: &Sessions) -> impl Fn(&SessionId) -> u64 + '_ {
    move |sid| sessions.get(sid).map_or(0, |s| hash(&s.client_id))
}

impl ClientIds {
    pub(crate) fn get(&self, sessions: &Sessions, key: &str) -> Option<SessionId> {
        self.0
            .find(hash(key), |sid| {
                sessions.get(sid).is_some_and(|s| *s.client_id == *key)
            })
            .copied()
    }

    pub(crate) fn contains_key(&self, sessions: &Sessions, client_id: &str) -> bool {
        self.get(sessions, client_id).is_some()
    }

    /// Point `client_id` at `sid`, whose session (with that client id) is
    /// in `sessions` already; the session it pointed at before.
    pub(crate) fn insert(
        &mut self,
        sessions: &Sessions,
        key: &str,
        sid: SessionId,
    ) -> Option<SessionId> {
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
    pub(crate) fn remove(&mut self, client_id: &str, sid: SessionId) -> bool {
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

    fn session(sessions: &mut Sessions, sid: u64, id: &str) -> Box<str> {
        sessions.insert(
            SessionId(sid),
            Box::new(Session::new(id.into(), Protocol::V5)),
        );
        id.into()
    }

    #[test]
    fn keyed_by_the_sessions_own_client_id() {
        let mut s = Sessions::default();
        let mut c = ClientIds::default();
        let a = session(&mut s, 1, "a");
        assert_eq!(c.insert(&s, &a, SessionId(1)), None);
        let a2 = session(&mut s, 2, "a");
        assert_eq!(c.insert(&s, &a2, SessionId(2)), Some(SessionId(1)));
        assert_eq!(c.len(), 1);
        assert!(c.contains_key(&s, &a) && !c.contains_key(&s, "b"));
        assert_eq!(c.get(&s, &a), Some(SessionId(2)));
        // Removed by id and hash, with the session already gone.
        s.remove(&SessionId(2));
        assert!(!c.remove(&a, SessionId(1)));
        assert!(c.remove(&a, SessionId(2)));
        assert_eq!(c.get(&s, &a), None);
        assert_eq!(c.len(), 0);
        assert_eq!(std::mem::size_of::<SessionId>(), 8);
    }

    #[test]
    fn many_ids_survive_the_table_growing() {
        let mut s = Sessions::default();
        let mut c = ClientIds::default();
        for i in 0..1000 {
            let id = session(&mut s, i, &format!("dev-{i}"));
            assert_eq!(c.insert(&s, &id, SessionId(i)), None);
        }
        for i in 0..1000 {
            assert_eq!(c.get(&s, &format!("dev-{i}")), Some(SessionId(i)));
        }
        assert_eq!(c.len(), 1000);
    }
}

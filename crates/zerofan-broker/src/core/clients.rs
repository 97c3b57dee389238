//! Sessions by client id. One entry per session, so per connection: the
//! key is a `Box<str>` (16 bytes) rather than the session's own `MqttStr`
//! (32 bytes, and a clone of it allocates a shared header for its bytes),
//! which makes a slot 24 bytes instead of 40. The methods are the hash
//! map's that the broker uses, keyed by `MqttStr` as before.

use super::hash::HashMap;
use super::ids::SessionId;
use zerofan_codec::MqttStr;

/// Client id to session.
#[derive(Debug, Default)]
pub(crate) struct ClientIds(HashMap<Box<str>, SessionId>);

impl ClientIds {
    pub(crate) fn get(&self, client_id: &MqttStr) -> Option<&SessionId> {
        self.0.get(client_id.as_str())
    }

    pub(crate) fn contains_key(&self, client_id: &MqttStr) -> bool {
        self.0.contains_key(client_id.as_str())
    }

    /// Point `client_id` at `sid`; the session it pointed at before.
    pub(crate) fn insert(&mut self, client_id: MqttStr, sid: SessionId) -> Option<SessionId> {
        self.0.insert(client_id.as_str().into(), sid)
    }

    pub(crate) fn remove(&mut self, client_id: &MqttStr) -> Option<SessionId> {
        self.0.remove(client_id.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_by_client_id_with_24_byte_slots() {
        let id = |s: &str| MqttStr::try_from(s).unwrap();
        let mut c = ClientIds::default();
        assert_eq!(c.insert(id("a"), SessionId(1)), None);
        assert_eq!(c.insert(id("a"), SessionId(2)), Some(SessionId(1)));
        assert!(c.contains_key(&id("a")) && !c.contains_key(&id("b")));
        assert_eq!(c.get(&id("a")), Some(&SessionId(2)));
        assert_eq!(c.remove(&id("a")), Some(SessionId(2)));
        assert_eq!(c.get(&id("a")), None);
        assert_eq!(std::mem::size_of::<(Box<str>, SessionId)>(), 24);
    }
}

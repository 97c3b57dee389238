//! Identifiers the core hands out. Never reused, so a stale timer or a late
//! shell call can never hit the wrong connection or session (each id names
//! a slot and its generation: see `slots.rs`).

use std::fmt;
use std::num::NonZeroU64;

/// One network connection, from `connection_opened` to `connection_lost`.
/// Never zero, so that `Option<ConnId>` (a session's connection) takes 8
/// bytes, not 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(NonZeroU64);

impl ConnId {
    /// The id numbered `raw` (what [`ConnId::raw`] gave); none for zero.
    pub fn from_raw(raw: u64) -> Option<ConnId> {
        NonZeroU64::new(raw).map(ConnId)
    }

    /// [`ConnId::from_raw`] where a constant is needed.
    pub(crate) const fn from_raw_const(raw: u64) -> Option<ConnId> {
        match NonZeroU64::new(raw) {
            Some(n) => Some(ConnId(n)),
            None => None,
        }
    }

    /// The id as a number (a poller's token), never zero.
    pub fn raw(self) -> u64 {
        self.0.get()
    }

    /// The core's first id.
    pub(crate) const FIRST: ConnId = ConnId(NonZeroU64::MIN);
}

/// One session (which outlives connections). Like a [`ConnId`], it names a
/// slot of the core's sessions and the slot's generation (never zero); the
/// field is public for the ids other cores send (`peer_wire.rs`), which name
/// their sessions, not ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Slot and generation (see `slots.rs`): `conn#7` for a
        // slot's first connection, `conn#7.2` for its third.
        let raw = self.0.get();
        match raw >> 32 {
            0 => write!(f, "conn#{}", raw as u32),
            generation => write!(f, "conn#{}.{generation}", raw as u32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ConnId;

    #[test]
    fn a_connection_id_shows_its_slot_and_generation() {
        let first = ConnId::from_raw(7).unwrap();
        let third = ConnId::from_raw((2 << 32) | 7).unwrap();
        assert_eq!(
            (first.to_string(), third.to_string()),
            ("conn#7".into(), "conn#7.2".into())
        );
    }
}

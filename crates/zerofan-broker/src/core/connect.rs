//! What CONNECT handling (`broker.rs`'s CONNECT section) keeps and makes:
//! a CONNECT waiting for a takeover, wills that own their bytes, and
//! assigned client identifiers.

use super::ids::ConnId;
use super::message::{copy_str, own_properties};
use std::time::Duration;
use zerofan_codec::{Connect, Will};

/// How long a takeover waits for the old connection's input at most: a
/// connection that does not read (or whose outbox is full) must not hold
/// its successor for long.
pub(super) const TAKEOVER_DRAIN: Duration = Duration::from_millis(300);

/// A CONNECT waiting for the input of the connection it takes over.
#[derive(Debug)]
pub(crate) struct PendingTakeover {
    pub(super) old: ConnId,
    pub(super) connect: Box<Connect>,
}

/// A will that owns its bytes: it may wait for hours, and must not pin the
/// CONNECT's read buffer meanwhile.
pub(super) fn own_will(w: Will) -> Will {
    Will {
        topic: copy_str(&w.topic),
        payload: bytes::Bytes::copy_from_slice(&w.payload),
        qos: w.qos,
        retain: w.retain,
        properties: own_properties(&w.properties).into(),
    }
}

/// A client identifier nobody can guess: 128 random bits from the OS
/// (`zerofan-` and 32 hex digits). Sequential ids would let any client that
/// may connect take over another client's assigned session by guessing.
pub(super) fn random_client_id() -> String {
    let mut bits = [0u8; 16];
    if getrandom::fill(&mut bits).is_err() {
        // No OS randomness (never seen on Linux): SipHash with the process's
        // random keys over a counter and the time is still unguessable.
        use std::hash::{BuildHasher, Hasher};
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let keys = std::collections::hash_map::RandomState::new();
        for half in bits.chunks_mut(8) {
            let mut h = keys.build_hasher();
            h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    let mut id = String::with_capacity(8 + 32);
    id.push_str("zerofan-");
    for b in bits {
        use std::fmt::Write;
        let _ = write!(id, "{b:02x}");
    }
    id
}

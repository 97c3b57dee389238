//! A bounded cache of authentication decisions with a time to live, for
//! answers that are expensive to get (an HTTP call per login).
//!
//! Entries are keyed by [`cache_key`], a SHA-256 over the request's parts,
//! so neither passwords nor other request data are kept in memory, and a
//! different password can never hit another password's entry. At most
//! `capacity` entries are kept; when full, the oldest insertion goes
//! (counted in [`DecisionCache::evictions`]). Sans-IO: time comes in.

use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// The key of a request made of `parts` (each length-prefixed, so
/// `("ab", "c")` and `("a", "bc")` differ).
pub fn cache_key(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    h.finalize().into()
}

/// Bounded, expiring map from [`cache_key`] to a decision.
#[derive(Debug)]
pub struct DecisionCache<V> {
    ttl: Duration,
    capacity: usize,
    map: HashMap<[u8; 32], (Instant, V)>,
    /// Insertion order with each insertion's time (a key re-inserted has
    /// a newer time; the stale order entry is skipped when popped).
    order: VecDeque<([u8; 32], Instant)>,
    evictions: u64,
}

impl<V: Clone> DecisionCache<V> {
    /// Entries live `ttl`; at most `capacity` (0: nothing is cached).
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        DecisionCache {
            ttl,
            capacity,
            map: HashMap::new(),
            order: VecDeque::new(),
            evictions: 0,
        }
    }

    /// The decision for `key` if cached and younger than the TTL.
    pub fn get(&self, key: &[u8; 32], now: Instant) -> Option<V> {
        match self.map.get(key) {
            Some((at, v)) if now.saturating_duration_since(*at) < self.ttl => Some(v.clone()),
            _ => None,
        }
    }

    /// Remember `v` for `key` from `now`.
    pub fn insert(&mut self, key: [u8; 32], v: V, now: Instant) {
        if self.capacity == 0 || self.ttl.is_zero() {
            return;
        }
        while self.map.len() >= self.capacity && !self.map.contains_key(&key) {
            let Some((old, at)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&old).is_some_and(|(t, _)| *t == at) {
                self.map.remove(&old);
                self.evictions += 1;
            }
        }
        self.map.insert(key, (now, v));
        self.order.push_back((key, now));
        // Stale order entries (re-inserted keys) stay bounded too.
        while self.order.len() > 2 * self.capacity.max(1) {
            if let Some((old, at)) = self.order.pop_front() {
                if self.map.get(&old).is_some_and(|(t, _)| *t == at) {
                    self.map.remove(&old);
                    self.evictions += 1;
                }
            }
        }
    }

    /// Drop everything (a reload of the settings).
    pub fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }

    /// Entries held (expired ones included until pushed out).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Entries pushed out to make room, since creation.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_capacity_and_keys() {
        let t0 = Instant::now();
        let mut c = DecisionCache::new(Duration::from_secs(10), 2);
        let (a, b, d) = (
            cache_key(&[b"ab", b"c"]),
            cache_key(&[b"a", b"bc"]),
            cache_key(&[b"x"]),
        );
        assert_ne!(a, b);
        c.insert(a, true, t0);
        c.insert(b, false, t0);
        assert_eq!(c.get(&a, t0 + Duration::from_secs(9)), Some(true));
        assert_eq!(c.get(&a, t0 + Duration::from_secs(10)), None);
        c.insert(d, true, t0);
        assert_eq!(c.len(), 2);
        assert_eq!(c.evictions(), 1);
        assert_eq!(c.get(&a, t0), None);
        assert_eq!(c.get(&b, t0), Some(false));
        // Re-inserting one key many times keeps memory bounded.
        for i in 0..100 {
            c.insert(b, true, t0 + Duration::from_millis(i));
        }
        assert!(c.order.len() <= 4);
        let mut none = DecisionCache::new(Duration::from_secs(10), 0);
        none.insert(a, true, t0);
        assert!(none.is_empty());
    }
}

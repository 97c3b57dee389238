//! Slowing down repeated login failures of one account from one address.
//!
//! [`FailureTracker`] remembers, for a bounded number of (address,
//! username) pairs, how many logins in a row failed and when the last one
//! did. Keying by the pair keeps one account's failures from locking out
//! another account's correct password behind the same address (a NAT, a
//! gateway, 127.0.0.1). Anonymous refusals are not failures: the broker
//! does not record them. After
//! [`ThrottleConfig::free_failures`] failures each further failure doubles
//! the wait imposed on the next attempt, from
//! [`ThrottleConfig::base_delay`] up to [`ThrottleConfig::max_delay`]. A
//! success forgets the pair; so does [`ThrottleConfig::forget_after`]
//! without a failure.
//!
//! Memory is bounded: at most [`ThrottleConfig::capacity`] pairs are
//! tracked, each in a fixed size (the username is kept as a 64-bit keyed
//! hash, so a 64 KiB username costs no more than a short one; the key is
//! random per tracker, so nobody can aim a collision at someone else's
//! account); a new pair evicts the one whose last failure is oldest, and
//! [`FailureTracker::evictions`] counts that. An attacker with many
//! addresses can thus push others out, which only makes the tracker forget
//! (never lock out) — it slows guessing, it is not a ban list.
//!
//! IPv6 addresses are tracked per /64 (one host usually owns a whole /64);
//! IPv4-mapped IPv6 addresses count as the IPv4 address.
//!
//! Sans-IO: time comes in as `now`. How the broker applies the delay is its
//! business (hold the CONNACK, or refuse the CONNECT with 0x87 / 0x05 while
//! [`FailureTracker::delay`] is non-zero).

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

/// Tuning of a [`FailureTracker`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThrottleConfig {
    /// Most addresses remembered at once (at least 1).
    pub capacity: usize,
    /// Failures in a row that cost nothing.
    pub free_failures: u32,
    /// Wait after the first failure past the free ones.
    pub base_delay: Duration,
    /// Largest wait.
    pub max_delay: Duration,
    /// An address with no failure for this long is forgotten.
    pub forget_after: Duration,
}

impl Default for ThrottleConfig {
    /// 10,000 addresses; 3 free failures; then 1 s, 2 s, 4 s, … up to 60 s;
    /// forgotten after 10 minutes without a failure.
    fn default() -> Self {
        ThrottleConfig {
            capacity: 10_000,
            free_failures: 3,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
            forget_after: Duration::from_secs(600),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Record {
    failures: u32,
    last_failure: Instant,
    /// Key in the LRU order.
    stamp: (Instant, u64),
}

/// Bounded per-address login-failure memory (see the module documentation).
#[derive(Clone, Debug)]
pub struct FailureTracker {
    config: ThrottleConfig,
    records: HashMap<Key, Record>,
    /// (last failure, sequence) -> pair, oldest failure first.
    order: BTreeMap<(Instant, u64), Key>,
    hasher: RandomState,
    next_stamp: u64,
    evictions: u64,
}

/// (address key, username hash).
type Key = (IpAddr, u64);

/// The key an address is tracked under.
fn addr_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl FailureTracker {
    /// An empty tracker. A `capacity` of 0 is taken as 1.
    pub fn new(mut config: ThrottleConfig) -> Self {
        config.capacity = config.capacity.max(1);
        FailureTracker {
            config,
            records: HashMap::new(),
            order: BTreeMap::new(),
            hasher: RandomState::new(),
            next_stamp: 0,
            evictions: 0,
        }
    }

    fn key(&self, addr: IpAddr, username: &str) -> Key {
        (addr_key(addr), self.hasher.hash_one(username))
    }

    /// The configuration in force.
    pub fn config(&self) -> &ThrottleConfig {
        &self.config
    }

    /// The wait imposed after `failures` failures in a row.
    pub fn penalty(&self, failures: u32) -> Duration {
        let c = &self.config;
        if failures <= c.free_failures {
            return Duration::ZERO;
        }
        let doublings = (failures - c.free_failures - 1).min(31);
        c.base_delay
            .checked_mul(1u32 << doublings)
            .unwrap_or(c.max_delay)
            .min(c.max_delay)
    }

    /// How long a login as `username` from `addr` at `now` must still wait
    /// (zero if it may go ahead).
    pub fn delay(&self, addr: IpAddr, username: &str, now: Instant) -> Duration {
        match self.records.get(&self.key(addr, username)) {
            Some(r) if !self.expired(r, now) => {
                let ready = r.last_failure + self.penalty(r.failures);
                ready.saturating_duration_since(now)
            }
            _ => Duration::ZERO,
        }
    }

    fn expired(&self, r: &Record, now: Instant) -> bool {
        now.saturating_duration_since(r.last_failure) >= self.config.forget_after
    }

    /// Record a failed login as `username` from `addr` at `now`; returns
    /// the wait imposed on the next attempt of that pair.
    pub fn record_failure(&mut self, addr: IpAddr, username: &str, now: Instant) -> Duration {
        let k = self.key(addr, username);
        let stamp = (now, self.next_stamp);
        self.next_stamp += 1;
        let failures = match self.records.get(&k).copied() {
            Some(r) => {
                self.order.remove(&r.stamp);
                if self.expired(&r, now) {
                    1
                } else {
                    r.failures.saturating_add(1)
                }
            }
            None => {
                if self.records.len() >= self.config.capacity {
                    self.evict_oldest();
                }
                1
            }
        };
        self.records.insert(
            k,
            Record {
                failures,
                last_failure: now,
                stamp,
            },
        );
        self.order.insert(stamp, k);
        self.penalty(failures)
    }

    /// Record a successful login as `username` from `addr`: the pair's
    /// failures are forgotten.
    pub fn record_success(&mut self, addr: IpAddr, username: &str) {
        if let Some(r) = self.records.remove(&self.key(addr, username)) {
            self.order.remove(&r.stamp);
        }
    }

    /// Failures in a row recorded for `username` from `addr` (0 if
    /// forgotten).
    pub fn failures(&self, addr: IpAddr, username: &str, now: Instant) -> u32 {
        match self.records.get(&self.key(addr, username)) {
            Some(r) if !self.expired(r, now) => r.failures,
            _ => 0,
        }
    }

    /// Drop every pair whose last failure is `forget_after` old. Not
    /// needed for correctness (expired records are ignored and recycled);
    /// call it from a timer to give memory back sooner.
    pub fn purge_expired(&mut self, now: Instant) {
        while let Some((&stamp, &k)) = self.order.first_key_value() {
            match self.records.get(&k) {
                Some(r) if self.expired(r, now) => {
                    self.order.remove(&stamp);
                    self.records.remove(&k);
                }
                _ => break,
            }
        }
    }

    fn evict_oldest(&mut self) {
        if let Some((_, addr)) = self.order.pop_first() {
            self.records.remove(&addr);
            self.evictions += 1;
        }
    }

    /// (address, username) pairs currently remembered.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no pair is remembered.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Pairs pushed out to make room for new ones, since creation.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn penalties_double_and_cap() {
        let t = FailureTracker::new(ThrottleConfig::default());
        let secs: Vec<u64> = (0..12).map(|n| t.penalty(n).as_secs()).collect();
        assert_eq!(secs, [0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(t.penalty(u32::MAX).as_secs(), 60);
    }

    #[test]
    fn v6_per_64_and_mapped_v4() {
        let mut t = FailureTracker::new(ThrottleConfig::default());
        let now = Instant::now();
        t.record_failure(ip("2001:db8:1:2::1"), "u", now);
        assert_eq!(t.failures(ip("2001:db8:1:2:ffff::9"), "u", now), 1);
        assert_eq!(t.failures(ip("2001:db8:1:3::1"), "u", now), 0);
        t.record_failure(ip("::ffff:10.0.0.1"), "u", now);
        assert_eq!(t.failures(ip("10.0.0.1"), "u", now), 1);
    }
}

//! One small rate limiter for every per-client log line, so a misbehaving
//! client cannot flood the log: a token bucket per key (an error kind, or a
//! kind and a client id) in a bounded map, and a count of what it held back.
//!
//! Sans-IO like the core: the time comes in as an argument.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use zerofan_broker::ratelimit::{LogLimiter, Verdict};
//!
//! let mut limit = LogLimiter::new(2, Duration::from_secs(1), 16);
//! let t = Instant::now();
//! assert_eq!(limit.check(t, "bad input"), Verdict::Log { suppressed: 0 });
//! assert_eq!(limit.check(t, "bad input"), Verdict::Log { suppressed: 0 });
//! assert_eq!(limit.check(t, "bad input"), Verdict::Suppress);
//! let later = t + Duration::from_secs(1);
//! assert_eq!(limit.check(later, "bad input"), Verdict::Log { suppressed: 1 });
//! assert_eq!(limit.suppressed_total(), 1);
//! ```

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Whether to write a log line now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write it, mentioning how many lines of this key were held back since
    /// the last one written.
    Log {
        /// Lines of this key suppressed since the last one logged.
        suppressed: u64,
    },
    /// Hold it back (counted).
    Suppress,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Tokens available, in units of one line.
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: Instant,
    /// Lines suppressed since the last one logged.
    suppressed: u64,
}

/// Token buckets per key: `burst` lines at once, then one per `every`.
/// At most `max_keys` keys are tracked; past that, new keys share one
/// overflow bucket, so memory stays bounded whatever clients do.
#[derive(Debug)]
pub struct LogLimiter {
    burst: f64,
    every: Duration,
    max_keys: usize,
    buckets: HashMap<Box<str>, Bucket>,
    overflow: Option<Bucket>,
    suppressed_total: u64,
}

/// The broker's limiter for per-client warnings: 5 lines at once, then one
/// a second per kind, for up to 1024 kinds.
impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new(5, Duration::from_secs(1), 1024)
    }
}

impl LogLimiter {
    /// A limiter allowing `burst` lines at once per key, refilled at one
    /// line per `every`, tracking at most `max_keys` keys.
    pub fn new(burst: u32, every: Duration, max_keys: usize) -> Self {
        LogLimiter {
            burst: f64::from(burst.max(1)),
            every: every.max(Duration::from_micros(1)),
            max_keys: max_keys.max(1),
            buckets: HashMap::new(),
            overflow: None,
            suppressed_total: 0,
        }
    }

    /// Take a token for `key` at `now`.
    pub fn check(&mut self, now: Instant, key: &str) -> Verdict {
        if !self.buckets.contains_key(key) && self.buckets.len() >= self.max_keys {
            self.prune(now);
        }
        let (burst, every) = (self.burst, self.every);
        let fresh = Bucket {
            tokens: burst,
            at: now,
            suppressed: 0,
        };
        let bucket = if let Some(b) = self.buckets.get_mut(key) {
            b
        } else if self.buckets.len() < self.max_keys {
            self.buckets.entry(key.into()).or_insert(fresh)
        } else {
            self.overflow.get_or_insert(fresh)
        };
        let elapsed = now.saturating_duration_since(bucket.at);
        bucket.tokens = (bucket.tokens + elapsed.as_secs_f64() / every.as_secs_f64()).min(burst);
        bucket.at = now.max(bucket.at);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Verdict::Log {
                suppressed: std::mem::take(&mut bucket.suppressed),
            }
        } else {
            bucket.suppressed += 1;
            self.suppressed_total += 1;
            Verdict::Suppress
        }
    }

    /// Every line suppressed so far, all keys together.
    pub fn suppressed_total(&self) -> u64 {
        self.suppressed_total
    }

    /// Keys tracked now (the overflow bucket not counted).
    pub fn keys(&self) -> usize {
        self.buckets.len()
    }

    /// Forget buckets that are full again and owe no suppressed count: they
    /// behave exactly like fresh ones.
    fn prune(&mut self, now: Instant) {
        let (burst, every) = (self.burst, self.every);
        self.buckets.retain(|_, b| {
            let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
            let tokens = b.tokens + elapsed / every.as_secs_f64();
            b.suppressed > 0 || tokens < burst
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_one_per_period() {
        let mut l = LogLimiter::new(3, Duration::from_secs(1), 8);
        let t = Instant::now();
        let logged = (0..100)
            .filter(|_| matches!(l.check(t, "k"), Verdict::Log { .. }))
            .count();
        assert_eq!(logged, 3);
        assert_eq!(l.suppressed_total(), 97);
        // Half a period: still nothing.
        assert_eq!(
            l.check(t + Duration::from_millis(500), "k"),
            Verdict::Suppress
        );
        assert_eq!(
            l.check(t + Duration::from_secs(1), "k"),
            Verdict::Log { suppressed: 98 }
        );
        assert_eq!(l.check(t + Duration::from_secs(1), "k"), Verdict::Suppress);
    }

    #[test]
    fn keys_are_independent() {
        let mut l = LogLimiter::new(1, Duration::from_secs(1), 8);
        let t = Instant::now();
        assert_eq!(l.check(t, "a"), Verdict::Log { suppressed: 0 });
        assert_eq!(l.check(t, "a"), Verdict::Suppress);
        assert_eq!(l.check(t, "b"), Verdict::Log { suppressed: 0 });
    }

    #[test]
    fn refill_is_capped_at_burst() {
        let mut l = LogLimiter::new(2, Duration::from_secs(1), 8);
        let t = Instant::now();
        let later = t + Duration::from_secs(3600);
        let logged = (0..10)
            .filter(|_| matches!(l.check(later, "k"), Verdict::Log { .. }))
            .count();
        assert_eq!(logged, 2);
    }

    #[test]
    fn map_stays_bounded() {
        let mut l = LogLimiter::new(1, Duration::from_secs(1), 4);
        let t = Instant::now();
        for i in 0..10_000 {
            l.check(t, &format!("client-{i}"));
        }
        assert!(l.keys() <= 4, "{} keys", l.keys());
        // Past the cap, new keys share the overflow bucket: one line, then quiet.
        assert!(l.suppressed_total() >= 10_000 - 5);
    }

    #[test]
    fn idle_keys_are_pruned_to_make_room() {
        let mut l = LogLimiter::new(1, Duration::from_secs(1), 2);
        let t = Instant::now();
        l.check(t, "a");
        l.check(t, "b");
        let later = t + Duration::from_secs(10);
        assert_eq!(l.check(later, "c"), Verdict::Log { suppressed: 0 });
        assert!(l.keys() <= 2);
    }

    #[test]
    fn time_going_backwards_is_harmless() {
        let mut l = LogLimiter::new(1, Duration::from_secs(1), 2);
        let t = Instant::now() + Duration::from_secs(10);
        assert_eq!(l.check(t, "a"), Verdict::Log { suppressed: 0 });
        assert_eq!(l.check(t - Duration::from_secs(5), "a"), Verdict::Suppress);
    }
}

//! What operators look at, as types: gauges computed on demand (sessions,
//! queue depths, inflight), the durable store's figures, the shards'
//! figures, latency histograms and what a reload changed. The `Broker`
//! methods that compute them, gate per-client error logs and reload the
//! limits are `broker.rs`'s observability section.
//!
//! Nothing here runs on the publish path: gauges walk the sessions when a
//! scrape asks for them, and the counters stay plain integers in
//! [`Metrics`](super::Metrics).

use std::time::Duration;

/// Figures computed from the broker's state at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Network connections the core knows (CONNECT received or not).
    pub connections: usize,
    /// Sessions with a connection attached.
    pub sessions_online: usize,
    /// Sessions without a connection (kept for their expiry interval).
    pub sessions_offline: usize,
    /// Messages waiting in every session queue.
    pub queued_messages: usize,
    /// The longest session queue, in messages.
    pub queued_messages_max: usize,
    /// Payload bytes waiting in every session queue.
    pub queued_bytes: usize,
    /// The largest session queue, in payload bytes.
    pub queued_bytes_max: usize,
    /// What the queues of connected clients hold against
    /// `max_online_queued_bytes` (payload, topic and slot bytes; retained
    /// replay not counted).
    pub queued_bytes_online: usize,
    /// QoS 1/2 messages sent and not yet acknowledged, all sessions.
    pub inflight: usize,
    /// The most in flight to one session.
    pub inflight_max: usize,
    /// Retained messages stored.
    pub retained: usize,
    /// Subscriptions, all sessions.
    pub subscriptions: usize,
    /// Per-client log lines held back by the rate limit.
    pub log_suppressed: u64,
}

/// One shard's figures, for the totals another shard reports (`$SYS`,
/// `/metrics`, an embedder's statistics).
#[derive(Clone, Debug, Default)]
pub struct ShardFigures {
    /// Its counters.
    pub metrics: super::metrics::Metrics,
    /// Its gauges.
    pub gauges: Gauges,
    /// Its shell's figures.
    pub shell: super::metrics::ShellStats,
    /// Its connections per listener: (open now, accepted since start).
    pub listeners: Vec<(u64, u64)>,
}

impl ShardFigures {
    /// Add another shard's.
    pub fn add(&mut self, o: &ShardFigures) {
        super::metrics::Counted::add(&mut self.metrics, &o.metrics);
        self.gauges.add(&o.gauges);
        self.shell.add(&o.shell);
        if self.listeners.len() < o.listeners.len() {
            self.listeners.resize(o.listeners.len(), (0, 0));
        }
        for (a, b) in self.listeners.iter_mut().zip(&o.listeners) {
            a.0 += b.0;
            a.1 += b.1;
        }
    }
}

impl Gauges {
    /// Add another shard's figures: sums, and maxima for the `_max` ones.
    /// Every shard keeps every retained message: that count is not summed.
    pub fn add(&mut self, o: &Gauges) {
        self.connections += o.connections;
        self.sessions_online += o.sessions_online;
        self.sessions_offline += o.sessions_offline;
        self.queued_messages += o.queued_messages;
        self.queued_messages_max = self.queued_messages_max.max(o.queued_messages_max);
        self.queued_bytes += o.queued_bytes;
        self.queued_bytes_max = self.queued_bytes_max.max(o.queued_bytes_max);
        self.queued_bytes_online += o.queued_bytes_online;
        self.inflight += o.inflight;
        self.inflight_max = self.inflight_max.max(o.inflight_max);
        self.retained = self.retained.max(o.retained);
        self.subscriptions += o.subscriptions;
        self.log_suppressed += o.log_suppressed;
    }
}

/// Upper bounds (seconds) of the [`LatencyHistogram`] buckets.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A latency histogram with fixed buckets ([`LATENCY_BUCKETS`]), exposed
/// as a Prometheus histogram. `observe` is a few comparisons and adds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyHistogram {
    /// Observations per bucket (not cumulative); the last slot counts
    /// those above the largest bound.
    pub buckets: [u64; LATENCY_BUCKETS.len() + 1],
    /// Observations.
    pub count: u64,
    /// Sum of the observations, seconds.
    pub sum_seconds: f64,
}

impl LatencyHistogram {
    /// Record one observation.
    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i] += 1;
        self.count += 1;
        self.sum_seconds += s;
    }
}

/// The store's figures for `/metrics` and `/readyz`. In memory: `durable:
/// false`, `open: true` and zeros; a durable store fills what it knows
/// (see [`Broker::store_figures`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreFigures {
    /// A durable store is in use (false with `--memory`).
    pub durable: bool,
    /// The store is open and usable (`/readyz` waits for it).
    pub open: bool,
    /// Bytes of the store's log (committed, written or about to be).
    pub size_bytes: u64,
    /// Estimated bytes of live records (what a compaction would keep).
    pub live_bytes: u64,
    /// Records staged.
    pub records: u64,
    /// Commits (group commits count once).
    pub commits: u64,
    /// fsync calls.
    pub fsyncs: u64,
    /// Bytes written to the store's files, compaction included.
    pub bytes_written: u64,
    /// Compactions (log rewrites) done.
    pub compactions: u64,
    /// Latency of each fsync (or fdatasync), when the store measures it.
    pub fsync: LatencyHistogram,
}

/// What [`Broker::reload`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadOutcome {
    /// Settings whose new value is in force now.
    pub changed: Vec<&'static str>,
    /// Settings that differ in the new configuration but only take effect
    /// on a restart (the old value stays).
    pub needs_restart: Vec<&'static str>,
    /// For each of those: `name = value in force (configured: new value)`.
    pub kept: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::core::Broker;
    use std::net::SocketAddr;
    use std::time::Instant;

    fn broker() -> Broker {
        Broker::new(Config::default(), Instant::now())
    }

    #[test]
    fn reload_swaps_limits_and_keeps_restart_only_settings() {
        let mut b = broker();
        let new = Config {
            max_queued_messages: 5,
            queue_full: crate::config::QueueFull::DropOldest,
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 9999))],
            pool_max_retained_bytes: 1,
            ..Config::default()
        };
        let out = b.reload(Instant::now(), new, |_| Ok(None)).expect("valid");
        assert_eq!(b.config().max_queued_messages, 5);
        assert_eq!(b.config().queue_full, crate::config::QueueFull::DropOldest);
        assert_eq!(out.changed, vec!["max_queued_messages", "queue_full"]);
        assert_eq!(out.needs_restart, vec!["listen", "pool_max_retained_bytes"]);
        assert_eq!(b.config().listeners()[0].bind.port(), 1883);
        assert_eq!(
            b.config().pool_max_retained_bytes,
            Config::default().pool_max_retained_bytes
        );
    }

    #[test]
    fn reload_keeps_busy_poll_and_park_after_in_force() {
        let mut b = broker();
        let new = Config {
            busy_poll_us: 0,
            park_after_ms: 5,
            ..Config::default()
        };
        let out = b.reload(Instant::now(), new, |_| Ok(None)).expect("valid");
        assert_eq!(out.needs_restart, vec!["busy_poll_us", "park_after_ms"]);
        assert!(out.changed.is_empty(), "{:?}", out.changed);
        // What the broker reports is what the shell runs with.
        assert_eq!(b.config().busy_poll_us, 50);
        assert_eq!(b.config().park_after_ms, 1000);
    }

    #[test]
    fn invalid_config_or_files_change_nothing() {
        let mut b = broker();
        let bad = Config {
            max_queued_messages: 0,
            ..Config::default()
        };
        assert!(b.reload(Instant::now(), bad, |_| Ok(None)).is_err());
        let good = Config {
            max_queued_messages: 7,
            ..Config::default()
        };
        let err = b
            .reload(Instant::now(), good, |_| Err("passwd:3: bad line".into()))
            .unwrap_err();
        assert!(err.contains("passwd:3"), "{err}");
        assert_eq!(b.config().max_queued_messages, 1000);
    }

    #[test]
    fn sys_turned_on_by_reload_is_armed() {
        let config = Config {
            sys_interval: 0,
            ..Config::default()
        };
        let now = Instant::now();
        let mut b = Broker::new(config, now);
        assert!(b.poll_timeout().is_none());
        let new = Config {
            sys_interval: 5,
            ..Config::default()
        };
        b.reload(now, new, |_| Ok(None)).expect("valid");
        assert!(b.poll_timeout().is_some());
    }

    #[test]
    fn gauges_of_an_empty_broker() {
        let b = broker();
        let g = b.gauges();
        assert_eq!(g, Gauges::default());
        let s = b.store_figures();
        assert!(s.open && !s.durable);
    }

    #[test]
    fn histogram_buckets() {
        let mut h = LatencyHistogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_secs(10));
        assert_eq!(h.buckets[0], 1);
        assert_eq!(h.buckets[3], 1, "1 ms lands in the le=0.001 bucket");
        assert_eq!(h.buckets[LATENCY_BUCKETS.len()], 1);
        assert_eq!(h.count, 3);
    }

    #[test]
    fn log_gate_limits_per_kind() {
        let mut b = broker();
        let now = Instant::now();
        let logged = (0..100)
            .filter(|_| b.log_gate(now, "bad input").is_some())
            .count();
        assert!(logged <= 5, "{logged}");
        assert!(b.log_gate(now, "other kind").is_some());
        assert_eq!(b.gauges().log_suppressed, 100 - logged as u64);
    }
}

//! Limits the core enforces per client and per address, and the counters
//! of every refusal (authentication, access control, limits).
//!
//! | limit | where | refusal |
//! | --- | --- | --- |
//! | `max_connections` (overall), a listener's `max_connections` | connection opened | CONNACK 0x97 Quota exceeded (3.1.1: 0x03) |
//! | `max_connection_rate` (per address, IPv6 per /64) | connection opened | CONNACK 0x9F Connection rate exceeded (3.1.1: 0x03) |
//! | `max_publish_rate`, `max_publish_bytes_rate` (per client) | PUBLISH | DISCONNECT 0x96 Message rate too high (3.1.1: close) |
//! | `max_topic_length` | PUBLISH / SUBSCRIBE | DISCONNECT 0x90 / SUBACK 0x8F (3.1.1: close / 0x80) |
//! | `max_packet_size` | framing | DISCONNECT 0x95 (3.1.1: close) |
//! | `max_topic_levels` | PUBLISH / SUBSCRIBE | DISCONNECT 0x90 / SUBACK 0x8F |
//! | `max_subscriptions_per_session` | SUBSCRIBE (a new filter) | SUBACK 0x97 Quota exceeded (3.1.1: 0x80) |
//! | `max_retained_messages`, `max_retained_bytes` | retained PUBLISH | not kept, still delivered; PUBACK/PUBREC 0x97 (MQTT 5) |
//!
//! A refused connection is answered when its CONNECT arrives (so it learns
//! the reason), then closed; until then it holds no session.
//!
//! Rates are token buckets holding one second's worth: a client may burst
//! up to the rate, then sustain it. Going over the rate disconnects the
//! client rather than slowing its reads: the decision is the core's (no
//! clock, no socket), deterministic, and visible to the client as a reason
//! code.

use super::hash::HashMap;
use super::metrics::{counters, CounterDef, Family, Sum};
use std::net::{IpAddr, Ipv6Addr};
use std::time::Instant;

const AUTH_REFUSED: Family = Family::new(
    "zerofan_auth_refused_total",
    "CONNECTs refused by authentication, by reason.",
);
const AUTH_HTTP: Family = Family::new(
    "zerofan_auth_http_total",
    "HTTP authentication: cache hits and misses, time-outs, failures, overflow.",
);
const ACL_DENIED: Family = Family::new(
    "zerofan_acl_denied_total",
    "Operations refused by the ACL, by action.",
);
const LIMIT_REFUSED: Family = Family::new(
    "zerofan_limit_refused_total",
    "Connections, clients or topics refused by a limit, by limit.",
);
const HANDSHAKE_FAILURES: Family = Family::new(
    "zerofan_handshake_failures_total",
    "Connections that failed before MQTT, by layer.",
);

counters! {
    /// Counters of refusals, published under `$SYS/broker/security/...` and
    /// `$SYS/broker/limits/...`.
    pub struct SecurityMetrics {
        /// CONNECTs refused for a bad username or password (0x86 / 0x04).
        pub auth_bad_credentials: u64 = CounterDef::NEW
            .sys("security/auth/bad_credentials")
            .prom_as(AUTH_REFUSED, "reason", "bad_credentials")
            .refused(),
        /// CONNECTs refused as not authorized: anonymous where not allowed, no
        /// certificate identity, unknown user without a password file (0x87 / 0x05).
        pub auth_not_authorized: u64 = CounterDef::NEW
            .sys("security/auth/not_authorized")
            .prom_as(AUTH_REFUSED, "reason", "not_authorized")
            .refused(),
        /// CONNECTs refused without a password check because their address is
        /// penalised for earlier failures of that username (0x9F / 0x03).
        pub auth_throttled: u64 = CounterDef::NEW
            .sys("security/auth/throttled")
            .prom_as(AUTH_REFUSED, "reason", "throttled")
            .refused(),
        /// CONNECTs refused with 0x88 because the HTTP service failed and
        /// `fail = "deny"`.
        pub auth_http_refused_unavailable: u64 = CounterDef::NEW
            .sys("security/auth/http/refused_unavailable")
            .prom_as(AUTH_REFUSED, "reason", "auth_service_unavailable")
            .refused(),
        /// Connections closed because their login token expired (DISCONNECT 0x87).
        pub auth_token_expired: u64 = CounterDef::NEW
            .sys("security/auth/token_expired")
            .prom(Family::new(
                "zerofan_auth_token_expired_total",
                "Connections closed because their login token expired.",
            )),
        /// Logins answered from the HTTP authentication cache.
        pub auth_http_cache_hits: u64 = CounterDef::NEW
            .sys("security/auth/http/cache_hits")
            .prom_as(AUTH_HTTP, "event", "cache_hit"),
        /// Logins that asked the HTTP service (not in the cache).
        pub auth_http_cache_misses: u64 = CounterDef::NEW
            .sys("security/auth/http/cache_misses")
            .prom_as(AUTH_HTTP, "event", "cache_miss"),
        /// HTTP authentication requests without an answer in time.
        pub auth_http_timeouts: u64 = CounterDef::NEW
            .sys("security/auth/http/timeouts")
            .prom_as(AUTH_HTTP, "event", "timeout"),
        /// HTTP authentication requests that failed (connection error,
        /// status other than 200, unreadable answer).
        pub auth_http_failures: u64 = CounterDef::NEW
            .sys("security/auth/http/failures")
            .prom_as(AUTH_HTTP, "event", "failure"),
        /// Logins not sent to the HTTP service because too many already
        /// wait (handled as a failure).
        pub auth_http_overflow: u64 = CounterDef::NEW
            .sys("security/auth/http/overflow")
            .prom_as(AUTH_HTTP, "event", "overflow"),
        /// Successful logins with a username (password or certificate).
        pub auth_success: u64 = CounterDef::NEW.sys("security/auth/success").prom(Family::new(
            "zerofan_auth_success_total",
            "Successful logins with a username (password or certificate).",
        )),
        /// PUBLISH packets refused by the ACL (PUBACK/PUBREC 0x87, QoS 0 dropped).
        pub acl_denied_publish: u64 = CounterDef::NEW
            .sys("security/acl/denied_publish")
            .prom_as(ACL_DENIED, "action", "publish")
            .refused(),
        /// Subscriptions refused by the ACL (SUBACK 0x87 / 0x80).
        pub acl_denied_subscribe: u64 = CounterDef::NEW
            .sys("security/acl/denied_subscribe")
            .prom_as(ACL_DENIED, "action", "subscribe")
            .refused(),
        /// Deliveries (retained and `$SYS` included) not sent because the
        /// subscriber may not read the topic.
        pub acl_denied_delivery: u64 = CounterDef::NEW
            .sys("security/acl/denied_delivery")
            .prom_as(ACL_DENIED, "action", "delivery")
            .refused(),
        /// PUBLISH packets into `$SYS/`, which belongs to the broker (MQTT 5
        /// PUBACK/PUBREC 0x87; 3.x acknowledged; never routed).
        pub refused_sys_publish: u64 = CounterDef::NEW
            .sys("security/refused_sys_publish")
            .prom(Family::new(
                "zerofan_sys_publish_refused_total",
                "PUBLISH packets into $SYS/ refused (MQTT 5: 0x87); never routed.",
            ))
            .refused(),
        /// Connections refused because of `max_connections` (overall or a listener's).
        pub refused_max_connections: u64 = CounterDef::NEW
            .sys("limits/refused/max_connections")
            .prom_as(LIMIT_REFUSED, "limit", "max_connections")
            .refused(),
        /// Connections refused because of `max_connection_rate`.
        pub refused_connection_rate: u64 = CounterDef::NEW
            .sys("limits/refused/connection_rate")
            .prom_as(LIMIT_REFUSED, "limit", "max_connection_rate")
            .refused(),
        /// Clients disconnected for going over `max_publish_rate` or
        /// `max_publish_bytes_rate` (0x96).
        pub rate_limited_disconnects: u64 = CounterDef::NEW
            .sys("limits/refused/publish_rate")
            .prom_as(LIMIT_REFUSED, "limit", "max_publish_rate")
            .refused(),
        /// Topic names or filters refused for `max_topic_length`.
        pub refused_topic_too_long: u64 = CounterDef::NEW
            .sys("limits/refused/topic_length")
            .prom_as(LIMIT_REFUSED, "limit", "max_topic_length")
            .refused(),
        /// Subscriptions refused for `max_subscriptions_per_session` (SUBACK
        /// 0x97 / 0x80).
        pub refused_subscriptions: u64 = CounterDef::NEW
            .sys("limits/refused/subscriptions")
            .prom_as(LIMIT_REFUSED, "limit", "max_subscriptions_per_session")
            .refused(),
        /// Retained messages not kept for `max_retained_messages` (delivered
        /// all the same).
        pub refused_retained_messages: u64 = CounterDef::NEW
            .sys("limits/refused/retained_messages")
            .prom_as(LIMIT_REFUSED, "limit", "max_retained_messages")
            .refused(),
        /// Retained messages not kept for `max_retained_bytes` (delivered
        /// all the same).
        pub refused_retained_bytes: u64 = CounterDef::NEW
            .sys("limits/refused/retained_bytes")
            .prom_as(LIMIT_REFUSED, "limit", "max_retained_bytes")
            .refused(),
        /// TLS handshakes that failed (plaintext on a TLS port, bad or missing
        /// client certificate, ...).
        pub tls_handshake_failures: u64 = CounterDef::NEW
            .sys("security/tls_handshake_failures")
            .prom_as(HANDSHAKE_FAILURES, "layer", "tls")
            .refused(),
        /// WebSocket upgrades that failed (wrong path, not a WebSocket request).
        pub ws_handshake_failures: u64 = CounterDef::NEW
            .sys("security/ws_handshake_failures")
            .prom_as(HANDSHAKE_FAILURES, "layer", "websocket")
            .refused(),
        /// PROXY protocol headers missing or invalid.
        pub proxy_header_errors: u64 = CounterDef::NEW
            .sys("security/proxy_header_errors")
            .prom_as(HANDSHAKE_FAILURES, "layer", "proxy")
            .refused(),
    }
}

impl SecurityMetrics {
    /// Every refused connection, login, publish, subscription or delivery.
    pub fn refusals_total(&self) -> u64 {
        let mut total = 0;
        self.each(&mut |def, values| {
            if def.sum == Sum::Refused {
                total += values.iter().sum::<u64>();
            }
        });
        total
    }
}

/// A token bucket holding one second of `rate`. Sans-IO: time comes in.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket refilling `rate` tokens per second.
    pub fn new(rate: u64, now: Instant) -> Self {
        TokenBucket {
            rate: rate as f64,
            tokens: rate as f64,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now.max(self.last);
        self.tokens = (self.tokens + dt * self.rate).min(self.rate);
    }

    /// Take `n` tokens if the bucket allows it. A take larger than the
    /// whole bucket is allowed when the bucket is full, and leaves a debt.
    pub fn take(&mut self, now: Instant, n: u64) -> bool {
        self.refill(now);
        let n = n as f64;
        if self.tokens >= n.min(self.rate) {
            self.tokens -= n;
            true
        } else {
            false
        }
    }

    /// Whether the bucket is full at `now` (nothing to remember).
    pub fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.rate
    }
}

/// Per-client publish limits: messages and payload bytes per second.
#[derive(Clone, Debug)]
pub struct PublishLimiter {
    messages: Option<TokenBucket>,
    bytes: Option<TokenBucket>,
}

impl PublishLimiter {
    /// A limiter for the given rates (0: no limit); `None` when both are 0.
    pub fn new(messages: u32, bytes: u64, now: Instant) -> Option<Box<Self>> {
        if messages == 0 && bytes == 0 {
            return None;
        }
        Some(Box::new(PublishLimiter {
            messages: (messages > 0).then(|| TokenBucket::new(u64::from(messages), now)),
            bytes: (bytes > 0).then(|| TokenBucket::new(bytes, now)),
        }))
    }

    /// Whether a PUBLISH of `payload` bytes at `now` is within the limits.
    pub fn allow(&mut self, now: Instant, payload: usize) -> bool {
        let m = match self.messages.as_mut() {
            Some(b) => b.take(now, 1),
            None => true,
        };
        let b = match self.bytes.as_mut() {
            Some(b) => b.take(now, payload as u64),
            None => true,
        };
        m && b
    }
}

/// Most addresses [`ConnectionRate`] remembers.
const RATE_CAPACITY: usize = 10_000;

/// New connections per second per address (IPv6 per /64, IPv4-mapped as
/// IPv4), bounded in memory: when full, idle addresses are forgotten, and
/// if none is idle everything is (which only makes the limit laxer).
#[derive(Debug, Default)]
pub struct ConnectionRate {
    buckets: HashMap<IpAddr, TokenBucket>,
}

fn rate_key(addr: IpAddr) -> IpAddr {
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

impl ConnectionRate {
    /// Count a new connection from `addr` at `now`; false when it goes
    /// over `rate` per second (0: no limit, always true).
    pub fn allow(&mut self, addr: IpAddr, now: Instant, rate: u32) -> bool {
        if rate == 0 {
            return true;
        }
        let key = rate_key(addr);
        if !self.buckets.contains_key(&key) && self.buckets.len() >= RATE_CAPACITY {
            self.buckets.retain(|_, b| !b.is_full(now));
            if self.buckets.len() >= RATE_CAPACITY {
                self.buckets.clear();
            }
        }
        self.buckets
            .entry(key)
            .or_insert_with(|| TokenBucket::new(u64::from(rate), now))
            .take(now, 1)
    }

    /// Addresses remembered.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no address is remembered.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_bursts_then_refills() {
        let t = Instant::now();
        let mut b = TokenBucket::new(3, t);
        assert!(b.take(t, 1) && b.take(t, 1) && b.take(t, 1));
        assert!(!b.take(t, 1));
        assert!(b.take(t + Duration::from_millis(340), 1));
        assert!(!b.take(t + Duration::from_millis(340), 1));
    }

    #[test]
    fn big_take_allowed_when_full_then_debt() {
        let t = Instant::now();
        let mut b = TokenBucket::new(100, t);
        assert!(b.take(t, 250));
        assert!(!b.take(t + Duration::from_secs(1), 1));
        assert!(b.take(t + Duration::from_secs(3), 1));
    }

    #[test]
    fn publish_limiter_checks_both() {
        let t = Instant::now();
        assert!(PublishLimiter::new(0, 0, t).is_none());
        let mut l = PublishLimiter::new(10, 100, t).unwrap();
        assert!(l.allow(t, 60));
        assert!(l.allow(t, 40));
        assert!(!l.allow(t, 1));
    }

    #[test]
    fn connection_rate_per_address() {
        let t = Instant::now();
        let mut r = ConnectionRate::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        assert!(r.allow(a, t, 2) && r.allow(a, t, 2));
        assert!(!r.allow(a, t, 2));
        assert!(r.allow(b, t, 2));
        assert!(r.allow(a, t + Duration::from_secs(1), 2));
        let v6a: IpAddr = "2001:db8::1".parse().unwrap();
        let v6b: IpAddr = "2001:db8::2".parse().unwrap();
        assert!(r.allow(v6a, t, 1));
        assert!(!r.allow(v6b, t, 1), "same /64");
        assert!(r.allow(a, t, 0));
    }
}

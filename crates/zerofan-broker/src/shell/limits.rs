//! Connection limits over every shard: `max_connections` (overall and per
//! listener) and `max_connection_rate` count the connections of the whole
//! process, not of one shard. One set of counters shared by the shards'
//! threads decides each new connection; the core gets the verdict
//! ([`Admission`]) and answers the CONNECT as it would its own.
//!
//! A connection is counted from its accept until its task lets go of it
//! (parked ones stay counted, as on their listener). One that moves to its
//! owner shard carries its count on the way ([`Transit`]), so that the
//! count neither dips below the connections open nor counts one twice.

use super::state::Shared;
use crate::core::{limits::ConnectionRate, Admission, Broker, ConnectionMeta};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use zerofan_codec::ReasonCode;

/// The counters every shard shares.
#[derive(Debug)]
pub(super) struct Limits {
    /// Connections open over all shards (refused ones too, until closed).
    open: AtomicUsize,
    /// The same per listener (bridges count under the index past them).
    per_listener: Vec<AtomicUsize>,
    /// New connections per address; bounded (see [`ConnectionRate`]).
    rate: Mutex<ConnectionRate>,
}

impl Limits {
    /// Counters for `listeners` listeners and the bridges.
    pub(super) fn new(listeners: usize) -> Arc<Limits> {
        Arc::new(Limits {
            open: AtomicUsize::new(0),
            per_listener: (0..=listeners).map(|_| AtomicUsize::new(0)).collect(),
            rate: Mutex::new(ConnectionRate::default()),
        })
    }

    /// Count a new connection on `listener` and decide its limits. The
    /// count and the check are one atomic step, so two shards cannot both
    /// take the last slot.
    fn admit(&self, broker: &Broker, now: Instant, listener: usize, peer: SocketAddr) -> Admission {
        let (max, listener_max) = broker.connection_limits(listener);
        let total = self.open.fetch_add(1, Ordering::Relaxed);
        let on_listener = self
            .per_listener
            .get(listener)
            .map_or(0, |n| n.fetch_add(1, Ordering::Relaxed));
        if (max > 0 && total >= max) || (listener_max > 0 && on_listener >= listener_max) {
            return Admission::Refused(ReasonCode::QUOTA_EXCEEDED);
        }
        let rate = broker.config().max_connection_rate;
        let allowed = match self.rate.lock() {
            Ok(mut r) => r.allow(peer.ip(), now, rate),
            Err(poisoned) => poisoned.into_inner().allow(peer.ip(), now, rate),
        };
        if allowed {
            Admission::Admitted
        } else {
            Admission::Refused(ReasonCode::CONNECTION_RATE_EXCEEDED)
        }
    }

    /// Count one more on `listener` without deciding.
    fn count(&self, listener: usize) {
        self.open.fetch_add(1, Ordering::Relaxed);
        if let Some(n) = self.per_listener.get(listener) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One fewer on `listener`.
    fn uncount(&self, listener: usize) {
        let dec = |n: &AtomicUsize| {
            let _ = n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        };
        dec(&self.open);
        if let Some(n) = self.per_listener.get(listener) {
            dec(n);
        }
    }
}

/// A new connection on this shard: with several shards, counted over all
/// of them and decided here (a connection moving in was decided where it
/// arrived: only counted).
pub(super) fn admit(shared: &Shared, peer: SocketAddr, mut meta: ConnectionMeta) -> ConnectionMeta {
    let Some(limits) = shared.limits.as_ref() else {
        return meta;
    };
    match meta.admission {
        Admission::Core => {
            let broker = shared.broker.borrow();
            meta.admission = limits.admit(&broker, Instant::now(), meta.listener, peer);
        }
        Admission::Admitted | Admission::Refused(_) => limits.count(meta.listener),
    }
    meta
}

/// A connection on `listener` is gone from this shard.
pub(super) fn closed(shared: &Shared, listener: usize) {
    if let Some(limits) = shared.limits.as_ref() {
        limits.uncount(listener);
    }
}

/// Holds a connection's count between two shards; uncounts when dropped
/// (after the destination counted it, or if it never arrives).
#[derive(Debug)]
pub(super) struct Transit {
    limits: Arc<Limits>,
    listener: usize,
}

impl Transit {
    /// The count of a connection on `listener` leaving this shard, whose
    /// task no longer holds it (`ListenerGuard::limit_moves`).
    pub(super) fn carry(shared: &Shared, listener: usize) -> Option<Transit> {
        let limits = shared.limits.clone()?;
        Some(Transit { limits, listener })
    }
}

impl Drop for Transit {
    fn drop(&mut self) {
        self.limits.uncount(self.listener);
    }
}

//! Limits that hold for the whole process when the broker runs several
//! shards (each with its own core): who decides a new connection's
//! `max_connections` / `max_connection_rate` verdict, and the login
//! throttle's memory of failures, which every shard's core may share.
//!
//! With one shard the core decides from its own counts, as always. With
//! several, the shell counts connections over all shards and passes its
//! verdict in ([`Admission`]); the core still answers the CONNECT and
//! counts the refusal. The login throttle is one [`FailureTracker`] behind
//! a lock that only a CONNECT with a username takes: no clock, no socket,
//! so the core stays sans-IO.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use zerofan_auth::throttle::{FailureTracker, ThrottleConfig};
use zerofan_codec::ReasonCode;

/// Who decided the connection limits of a new connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Admission {
    /// Nobody yet: the core decides from its own counts (one shard).
    #[default]
    Core,
    /// The shell decided for the whole process: within the limits (also a
    /// connection moving in from another shard, decided where it arrived).
    Admitted,
    /// The shell decided for the whole process: refuse the CONNECT with
    /// this code (0x97 Quota exceeded, 0x9F Connection rate exceeded).
    Refused(ReasonCode),
}

/// Login failures per (address, username), this core's own or shared by
/// every shard of the process.
#[derive(Debug)]
pub(crate) enum LoginThrottle {
    Own(FailureTracker),
    Shared(Arc<Mutex<FailureTracker>>),
}

impl LoginThrottle {
    pub(crate) fn new(config: ThrottleConfig) -> Self {
        LoginThrottle::Own(FailureTracker::new(config))
    }

    /// The shared tracker, if this one is.
    pub(crate) fn shared(&self) -> Option<Arc<Mutex<FailureTracker>>> {
        match self {
            LoginThrottle::Own(_) => None,
            LoginThrottle::Shared(s) => Some(s.clone()),
        }
    }

    /// Share `tracker` from now on; a reload with other throttle settings
    /// starts it afresh, as it does an own one (the first shard to reload
    /// does; the others then find the settings equal).
    pub(crate) fn share(&mut self, tracker: Arc<Mutex<FailureTracker>>, config: ThrottleConfig) {
        {
            let mut t = lock(&tracker);
            let mut want = config;
            want.capacity = want.capacity.max(1);
            if *t.config() != want {
                *t = FailureTracker::new(config);
            }
        }
        *self = LoginThrottle::Shared(tracker);
    }

    /// The settings in force.
    pub(crate) fn config(&self) -> ThrottleConfig {
        match self {
            LoginThrottle::Own(t) => *t.config(),
            LoginThrottle::Shared(s) => *lock(s).config(),
        }
    }

    /// How long `username` from `addr` must still wait (zero: may try).
    pub(crate) fn delay(&self, addr: IpAddr, username: &str, now: Instant) -> Duration {
        match self {
            LoginThrottle::Own(t) => t.delay(addr, username, now),
            LoginThrottle::Shared(s) => lock(s).delay(addr, username, now),
        }
    }

    pub(crate) fn record_failure(&mut self, addr: IpAddr, username: &str, now: Instant) {
        match self {
            LoginThrottle::Own(t) => {
                t.record_failure(addr, username, now);
            }
            LoginThrottle::Shared(s) => {
                lock(s).record_failure(addr, username, now);
            }
        }
    }

    pub(crate) fn record_success(&mut self, addr: IpAddr, username: &str) {
        match self {
            LoginThrottle::Own(t) => t.record_success(addr, username),
            LoginThrottle::Shared(s) => lock(s).record_success(addr, username),
        }
    }
}

/// A shard that panicked while holding the lock left plain records behind:
/// use them.
fn lock(m: &Mutex<FailureTracker>) -> MutexGuard<'_, FailureTracker> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The refusal a shell's verdict means, counted; `None` when the core is
/// to decide itself.
pub(crate) fn verdict(
    admission: Admission,
    metrics: &mut super::limits::SecurityMetrics,
) -> Option<Option<ReasonCode>> {
    match admission {
        Admission::Core => None,
        Admission::Admitted => Some(None),
        Admission::Refused(code) => {
            if code == ReasonCode::CONNECTION_RATE_EXCEEDED {
                metrics.refused_connection_rate += 1;
            } else {
                metrics.refused_max_connections += 1;
            }
            Some(Some(code))
        }
    }
}

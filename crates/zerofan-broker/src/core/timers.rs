//! Deadlines of the core in one min-heap. Entries are hints: when one fires
//! the broker checks the real state (a keep alive that was refreshed is
//! simply re-armed), so nothing ever has to be removed from the heap.

use super::ids::{ConnId, SessionId};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// What a deadline is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Timer {
    /// CONNECT not received in time.
    ConnectTimeout(ConnId),
    /// Keep alive check.
    KeepAlive(ConnId),
    /// A takeover waiting for the old connection's input completes anyway
    /// (the connection named is the new one).
    Takeover(ConnId),
    /// A delayed will may be due.
    Will(SessionId),
    /// An absent session may have expired.
    SessionExpiry(SessionId),
    /// A login's token may have expired.
    TokenExpiry(ConnId),
    /// A subscriber behind since then may have stayed behind too long.
    SlowConsumer(SessionId),
    /// Refresh `$SYS/`.
    Sys,
}

/// The heap. Deadlines are kept as nanoseconds after `base` (8 bytes
/// rather than an `Instant`'s 16): every connection has an entry, so each
/// one is 24 bytes instead of 32.
#[derive(Debug)]
pub(super) struct Timers {
    base: Instant,
    heap: BinaryHeap<Reverse<(u64, Timer)>>,
}

impl Timers {
    /// No deadlines; `base` is the earliest instant one may name (earlier
    /// ones count as `base`, i.e. due at once).
    pub(super) fn new(base: Instant) -> Self {
        Timers {
            base,
            heap: BinaryHeap::new(),
        }
    }

    /// Arm a deadline.
    pub(super) fn arm(&mut self, at: Instant, timer: Timer) {
        let nanos = at.saturating_duration_since(self.base).as_nanos();
        self.heap
            .push(Reverse((u64::try_from(nanos).unwrap_or(u64::MAX), timer)));
    }

    /// The earliest deadline.
    pub(super) fn next(&self) -> Option<Instant> {
        self.heap
            .peek()
            .map(|Reverse((at, _))| self.base + Duration::from_nanos(*at))
    }

    /// Take one deadline that is due at `now`.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<Timer> {
        let now =
            u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX);
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now => self.heap.pop().map(|Reverse((_, t))| t),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_come_due_in_order_and_one_entry_is_24_bytes() {
        assert_eq!(std::mem::size_of::<Reverse<(u64, Timer)>>(), 24);
        let t0 = Instant::now();
        let mut t = Timers::new(t0);
        t.arm(t0 + Duration::from_secs(2), Timer::Sys);
        t.arm(
            t0 + Duration::from_millis(1500),
            Timer::KeepAlive(ConnId::from_raw(7).unwrap()),
        );
        // Before `base`: due at once.
        t.arm(
            t0 - Duration::from_secs(1),
            Timer::ConnectTimeout(ConnId::from_raw(1).unwrap()),
        );
        assert_eq!(t.next(), Some(t0));
        assert_eq!(
            t.pop_due(t0),
            Some(Timer::ConnectTimeout(ConnId::from_raw(1).unwrap()))
        );
        assert_eq!(t.pop_due(t0 + Duration::from_secs(1)), None);
        assert_eq!(t.next(), Some(t0 + Duration::from_millis(1500)));
        let late = t0 + Duration::from_secs(3);
        assert_eq!(
            t.pop_due(late),
            Some(Timer::KeepAlive(ConnId::from_raw(7).unwrap()))
        );
        assert_eq!(t.pop_due(late), Some(Timer::Sys));
        assert_eq!(t.pop_due(late), None);
    }
}

//! Deadlines of the core in one min-heap. Entries are hints: when one fires
//! the broker checks the real state (a keep alive that was refreshed is
//! simply re-armed), so nothing ever has to be removed from the heap.

use super::ids::{ConnId, SessionId};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// What a deadline is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Timer {
    /// CONNECT not received in time.
    ConnectTimeout(ConnId),
    /// Keep alive check.
    KeepAlive(ConnId),
    /// A delayed will may be due.
    Will(SessionId),
    /// An absent session may have expired.
    SessionExpiry(SessionId),
    /// Refresh `$SYS/`.
    Sys,
}

/// The heap.
#[derive(Default, Debug)]
pub struct Timers {
    heap: BinaryHeap<Reverse<(Instant, Timer)>>,
}

impl Timers {
    /// Arm a deadline.
    pub fn arm(&mut self, at: Instant, timer: Timer) {
        self.heap.push(Reverse((at, timer)));
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// Take one deadline that is due at `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<Timer> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now => self.heap.pop().map(|Reverse((_, t))| t),
            _ => None,
        }
    }
}

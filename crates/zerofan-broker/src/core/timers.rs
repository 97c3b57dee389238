//! Deadlines of the core. Entries are hints: when one fires the broker
//! checks the real state (a keep alive that was refreshed is simply
//! re-armed), so nothing ever has to be removed.
//!
//! Every connection has a deadline, so those (connect timeout and keep
//! alive) go in a hashed timing wheel of coarse ticks, 8 bytes an entry,
//! whose slots free their buffers when drained; the rarer others (wills,
//! session expiry, takeovers, tokens, slow consumers, `$SYS`) in a
//! min-heap that gives its buffer back as it empties.

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
    /// A session move may be overdue (see `moves`).
    Moves,
    /// Refresh `$SYS/`.
    Sys,
}

/// The wheel's tick. A connection's deadline is rounded up to the next
/// one, so it is checked at most this late and never early; coarser ticks
/// would batch more wake-ups but close a silent client later.
const TICK_NANOS: u64 = 100_000_000;

/// Slots in the wheel (a power of two, whole words of `occupied`): a
/// horizon of 102.4 s, past the default connect timeout (10 s) and 1.5 x
/// the usual keep alives (up to 68 s); a later deadline takes a lap (see
/// [`Wheel::arm`]).
const SLOTS: usize = 1024;

/// The deadlines: the wheel for connections, the heap for the rest.
/// Deadlines are kept as nanoseconds after `base` (8 bytes rather than an
/// `Instant`'s 16), so a heap entry is 24 bytes.
#[derive(Debug)]
pub(super) struct Timers {
    base: Instant,
    heap: BinaryHeap<Reverse<(u64, Timer)>>,
    wheel: Wheel,
}

/// Smallest heap capacity given back: below it shrinking saves too little
/// to be worth the reallocations.
const HEAP_KEEP: usize = 64;

impl Timers {
    /// No deadlines; `base` is the earliest instant one may name (earlier
    /// ones count as `base`, i.e. due at once).
    pub(super) fn new(base: Instant) -> Self {
        Timers {
            base,
            heap: BinaryHeap::new(),
            wheel: Wheel::default(),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Arm a deadline.
    pub(super) fn arm(&mut self, at: Instant, timer: Timer) {
        let nanos = self.nanos(at);
        match timer {
            Timer::ConnectTimeout(conn) | Timer::KeepAlive(conn) => {
                let connect = matches!(timer, Timer::ConnectTimeout(_));
                if !self.wheel.arm(nanos.div_ceil(TICK_NANOS), conn, connect) {
                    self.heap.push(Reverse((nanos, timer)));
                }
            }
            _ => self.heap.push(Reverse((nanos, timer))),
        }
    }

    /// The earliest instant at which a deadline may be due (a wheel slot
    /// holding only deadlines a lap or more away counts: the shell wakes,
    /// the broker re-arms them).
    pub(super) fn next(&self) -> Option<Instant> {
        let heap = self.heap.peek().map(|Reverse((at, _))| *at);
        let wheel = self
            .wheel
            .first()
            .map(|tick| tick.saturating_mul(TICK_NANOS));
        let at = match (heap, wheel) {
            (Some(h), Some(w)) => h.min(w),
            (h, w) => h.or(w)?,
        };
        Some(self.base + Duration::from_nanos(at))
    }

    /// Take one deadline that is due at `now`, earliest first.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<Timer> {
        let now = self.nanos(now);
        self.wheel.advance(now / TICK_NANOS);
        let heap = self
            .heap
            .peek()
            .map(|Reverse((at, _))| *at)
            .filter(|&at| at <= now);
        let wheel = self
            .wheel
            .due_tick()
            .map(|tick| tick.saturating_mul(TICK_NANOS))
            .filter(|&at| at <= now);
        match (heap, wheel) {
            (Some(h), Some(w)) if w < h => self.wheel.pop(),
            (Some(_), _) => self.pop_heap(),
            (None, Some(_)) => self.wheel.pop(),
            (None, None) => None,
        }
    }

    fn pop_heap(&mut self) -> Option<Timer> {
        let timer = self.heap.pop().map(|Reverse((_, t))| t);
        // Give back what a storm of deadlines left (say, 19,000 sessions
        // that expire together): under a quarter full, it shrinks to
        // twice its length, so shrinking and growing back stay amortized
        // over as many pops and pushes.
        let (len, cap) = (self.heap.len(), self.heap.capacity());
        if cap > HEAP_KEEP && len < cap / 4 {
            self.heap.shrink_to((len * 2).max(HEAP_KEEP));
        }
        timer
    }

    /// Deadlines armed.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.heap.len() + self.wheel.len()
    }

    /// Bytes of buffers held (not counting the wheel's fixed slot array).
    #[cfg(test)]
    fn capacity_bytes(&self) -> usize {
        self.heap.capacity() * std::mem::size_of::<Reverse<(u64, Timer)>>()
            + self.wheel.capacity() * std::mem::size_of::<ConnId>()
    }
}

/// One slot of the wheel: the connections due at its tick (or a whole
/// number of laps later), those waiting for CONNECT first, so that a slot
/// keeps which timer each entry is for in 8 bytes an entry.
#[derive(Debug, Default)]
struct Slot {
    conns: Vec<ConnId>,
    /// How many of `conns`, from the front, are connect timeouts.
    connect: usize,
}

impl Slot {
    fn push(&mut self, conn: ConnId, connect: bool) {
        self.conns.push(conn);
        if connect {
            let last = self.conns.len() - 1;
            self.conns.swap(self.connect, last);
            self.connect += 1;
        }
    }

    fn pop(&mut self) -> Option<Timer> {
        let conn = self.conns.pop()?;
        if self.conns.len() < self.connect {
            self.connect -= 1;
            Some(Timer::ConnectTimeout(conn))
        } else {
            Some(Timer::KeepAlive(conn))
        }
    }
}

/// A hashed timing wheel of `SLOTS` slots, tick `TICK_NANOS`; ticks
/// count from `Timers::base`.
///
/// Bounded: each `arm` adds one entry and each entry is handed out once.
/// The broker arms a connect timeout once per connection (at open), a keep
/// alive once at CONNECT and then only when that keep alive entry fires
/// (`Broker::handle_timeout`), so a connection has at most two entries,
/// one once its connect timeout has passed; a closed connection's entries
/// go when they fire, at most one lap later.
#[derive(Debug)]
struct Wheel {
    /// Empty until the first connection (a broker with none pays nothing).
    slots: Box<[Slot]>,
    /// One bit a slot: whether it holds anything, so that finding the next
    /// deadline reads 16 words rather than 1024 slots.
    occupied: [u64; SLOTS / 64],
    /// Ticks before this one have been taken out of the slots.
    next_tick: u64,
    /// Entries taken out and being handed out (a drained slot, and
    /// deadlines armed for a tick already taken), due at `due_tick`.
    due: Slot,
    due_tick: u64,
}

impl Default for Wheel {
    fn default() -> Self {
        Wheel {
            slots: Box::default(),
            occupied: [0; SLOTS / 64],
            next_tick: 0,
            due: Slot::default(),
            due_tick: 0,
        }
    }
}

impl Wheel {
    /// Arm `conn` for `tick`. A deadline a lap or more away goes in the
    /// slot of `tick` modulo `SLOTS` and is handed out early, once a lap,
    /// and re-armed by the broker, which checks the real deadline (a keep
    /// alive of 65535 s costs a wake-up every 102.4 s, not a bigger
    /// wheel). Not so a connect timeout, which the broker does not check
    /// against a time: one past the horizon is refused (false), for the
    /// heap.
    fn arm(&mut self, tick: u64, conn: ConnId, connect: bool) -> bool {
        if connect && tick >= self.next_tick.saturating_add(SLOTS as u64) {
            return false;
        }
        if tick < self.next_tick {
            // Its slot has been taken already: due at once.
            if self.due.conns.is_empty() || tick < self.due_tick {
                self.due_tick = tick;
            }
            self.due.push(conn, connect);
            return true;
        }
        if self.slots.is_empty() {
            self.slots = (0..SLOTS).map(|_| Slot::default()).collect();
        }
        let i = slot_of(tick);
        if let Some(slot) = self.slots.get_mut(i) {
            slot.push(conn, connect);
            self.occupied[i / 64] |= 1 << (i % 64);
        }
        true
    }

    /// The first tick at which something may be due.
    fn first(&self) -> Option<u64> {
        if !self.due.conns.is_empty() {
            return Some(self.due_tick);
        }
        self.distance_to_occupied()
            .map(|d| self.next_tick + d as u64)
    }

    /// The tick of the entries ready to be handed out, if any.
    fn due_tick(&self) -> Option<u64> {
        (!self.due.conns.is_empty()).then_some(self.due_tick)
    }

    /// With nothing being handed out, take out the first slot whose tick
    /// is `now_tick` or earlier, if any.
    fn advance(&mut self, now_tick: u64) {
        if !self.due.conns.is_empty() || now_tick < self.next_tick {
            return;
        }
        match self.distance_to_occupied() {
            Some(d) if self.next_tick + d as u64 <= now_tick => {
                let tick = self.next_tick + d as u64;
                let i = slot_of(tick);
                if let Some(slot) = self.slots.get_mut(i) {
                    // The slot's buffer goes with it and is freed once
                    // handed out: memory follows the live entries, not
                    // the peak.
                    self.due = std::mem::take(slot);
                }
                self.occupied[i / 64] &= !(1 << (i % 64));
                self.due_tick = tick;
                self.next_tick = tick + 1;
            }
            // Nothing up to `now_tick`: every slot for it is empty.
            _ => self.next_tick = now_tick + 1,
        }
    }

    /// Hand out one entry that `advance` took out.
    fn pop(&mut self) -> Option<Timer> {
        let timer = self.due.pop();
        if self.due.conns.is_empty() {
            self.due = Slot::default();
        }
        timer
    }

    /// How many slots after `next_tick`'s the first occupied one is.
    fn distance_to_occupied(&self) -> Option<usize> {
        let from = slot_of(self.next_tick);
        let words = self.occupied.len();
        let (w0, b0) = (from / 64, from % 64);
        // The first word from `from` on, the others, then the first word
        // again (only its bits before `from` can be set by then).
        for k in 0..=words {
            let w = (w0 + k) % words;
            let mut bits = self.occupied[w];
            if k == 0 {
                bits &= !0u64 << b0;
            }
            if bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                return Some((i + SLOTS - from) % SLOTS);
            }
        }
        None
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.iter().map(|s| s.conns.len()).sum::<usize>() + self.due.conns.len()
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.slots.iter().map(|s| s.conns.capacity()).sum::<usize>() + self.due.conns.capacity()
    }
}

fn slot_of(tick: u64) -> usize {
    // SLOTS is a power of two: the cast keeps the bits that matter.
    (tick as usize) & (SLOTS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(n: u64) -> ConnId {
        ConnId::from_raw(n).unwrap()
    }

    fn drain(t: &mut Timers, now: Instant) -> Vec<Timer> {
        std::iter::from_fn(|| t.pop_due(now)).collect()
    }

    #[test]
    fn deadlines_come_due_in_order_and_entries_are_small() {
        assert_eq!(std::mem::size_of::<Reverse<(u64, Timer)>>(), 24);
        assert_eq!(std::mem::size_of::<ConnId>(), 8);
        let t0 = Instant::now();
        let mut t = Timers::new(t0);
        t.arm(t0 + Duration::from_secs(2), Timer::Sys);
        t.arm(t0 + Duration::from_millis(1500), Timer::KeepAlive(conn(7)));
        t.arm(t0 + Duration::from_millis(1700), Timer::Will(SessionId(3)));
        // Before `base`: due at once.
        t.arm(t0 - Duration::from_secs(1), Timer::ConnectTimeout(conn(1)));
        assert_eq!(t.next(), Some(t0));
        assert_eq!(t.pop_due(t0), Some(Timer::ConnectTimeout(conn(1))));
        assert_eq!(t.pop_due(t0 + Duration::from_secs(1)), None);
        assert_eq!(t.next(), Some(t0 + Duration::from_millis(1500)));
        assert_eq!(
            drain(&mut t, t0 + Duration::from_secs(3)),
            [
                Timer::KeepAlive(conn(7)),
                Timer::Will(SessionId(3)),
                Timer::Sys
            ]
        );
        assert_eq!(t.next(), None);
    }

    #[test]
    fn a_connection_deadline_is_rounded_up_never_down() {
        let t0 = Instant::now();
        let mut t = Timers::new(t0);
        let at = t0 + Duration::new(1, 234_567_891);
        t.arm(at, Timer::KeepAlive(conn(1)));
        let tick = t0 + Duration::from_millis(1300);
        assert_eq!(t.next(), Some(tick));
        assert_eq!(t.pop_due(at), None, "fired before its tick");
        assert_eq!(t.pop_due(tick - Duration::from_nanos(1)), None);
        assert_eq!(t.pop_due(tick), Some(Timer::KeepAlive(conn(1))));
        // On a tick exactly: that tick.
        t.arm(t0 + Duration::from_secs(2), Timer::ConnectTimeout(conn(2)));
        assert_eq!(t.next(), Some(t0 + Duration::from_secs(2)));
        assert_eq!(t.pop_due(t0 + Duration::from_millis(1999)), None);
        assert_eq!(
            t.pop_due(t0 + Duration::from_secs(2)),
            Some(Timer::ConnectTimeout(conn(2)))
        );
    }

    /// A keep alive of 65535 s (checked at 1.5 x, past the horizon) comes
    /// back once a lap, never after its deadline's tick, and is due there.
    #[test]
    fn a_far_deadline_laps_and_a_far_connect_timeout_waits_in_the_heap() {
        let t0 = Instant::now();
        let mut t = Timers::new(t0);
        let deadline = t0 + Duration::from_millis(65_535 * 1500);
        t.arm(deadline, Timer::KeepAlive(conn(1)));
        let connect_deadline = t0 + Duration::from_secs(1000);
        t.arm(connect_deadline, Timer::ConnectTimeout(conn(2)));
        let mut now = t0;
        let mut laps = 0;
        loop {
            let at = t.next().unwrap();
            assert!(at > now && at <= deadline, "woken at {:?}", at - t0);
            now = at;
            match drain(&mut t, now).as_slice() {
                [] => panic!("nothing due at {:?}", now - t0),
                [Timer::KeepAlive(_)] if now < deadline => {
                    // The broker checks the real deadline and re-arms.
                    laps += 1;
                    t.arm(deadline, Timer::KeepAlive(conn(1)));
                }
                [Timer::KeepAlive(_)] => break,
                [Timer::ConnectTimeout(c)] => {
                    assert_eq!((*c, now), (conn(2), connect_deadline));
                }
                other => panic!("{other:?}"),
            }
        }
        // 98,302.5 s at a lap of 102.4 s.
        assert_eq!(laps, 959);
        assert_eq!(t.next(), None);
    }

    #[test]
    fn many_entries_in_one_slot_keep_their_kind() {
        let t0 = Instant::now();
        let mut t = Timers::new(t0);
        let at = t0 + Duration::from_secs(10);
        for n in 1..=10_000 {
            let timer = if n % 3 == 0 {
                Timer::ConnectTimeout(conn(n))
            } else {
                Timer::KeepAlive(conn(n))
            };
            t.arm(at - Duration::from_millis(n % 100), timer);
        }
        assert_eq!(t.next(), Some(at));
        assert_eq!(t.pop_due(at - Duration::from_millis(1)), None);
        let mut fired = drain(&mut t, at);
        fired.sort();
        let mut want: Vec<Timer> = (1..=10_000)
            .map(|n| {
                if n % 3 == 0 {
                    Timer::ConnectTimeout(conn(n))
                } else {
                    Timer::KeepAlive(conn(n))
                }
            })
            .collect();
        want.sort();
        assert_eq!(fired, want);
    }

    #[test]
    fn next_is_the_earlier_of_the_heap_and_the_wheel() {
        let t0 = Instant::now();
        let mut t = Timers::new(t0);
        assert_eq!(t.next(), None);
        t.arm(t0 + Duration::from_millis(5250), Timer::KeepAlive(conn(1)));
        t.arm(t0 + Duration::from_millis(5150), Timer::Sys);
        assert_eq!(t.next(), Some(t0 + Duration::from_millis(5150)));
        t.arm(
            t0 + Duration::from_millis(5010),
            Timer::ConnectTimeout(conn(2)),
        );
        assert_eq!(t.next(), Some(t0 + Duration::from_millis(5100)));
        let now = t0 + Duration::from_secs(6);
        assert_eq!(
            drain(&mut t, now),
            [
                Timer::ConnectTimeout(conn(2)),
                Timer::Sys,
                Timer::KeepAlive(conn(1))
            ]
        );
        // Armed in the past while being handed out: due at once.
        t.arm(now - Duration::from_secs(1), Timer::KeepAlive(conn(3)));
        assert_eq!(t.next(), Some(t0 + Duration::from_secs(5)));
        assert_eq!(t.pop_due(now), Some(Timer::KeepAlive(conn(3))));
        assert_eq!(t.next(), None);
    }

    #[test]
    fn memory_follows_the_live_entries_not_the_peak() {
        let t0 = Instant::now();
        let mut t = Timers::new(t0);
        // A storm: 19,000 connections, their deadlines spread over 10 s,
        // and as many session expiries.
        for n in 1..=19_000u64 {
            let at = t0 + Duration::from_millis(n / 2);
            t.arm(at, Timer::ConnectTimeout(conn(n)));
            t.arm(at + Duration::from_secs(90), Timer::KeepAlive(conn(n)));
            t.arm(at, Timer::SessionExpiry(SessionId(n)));
        }
        assert!(t.capacity_bytes() > 19_000 * (8 + 8 + 24));
        let now = t0 + Duration::from_secs(100);
        assert_eq!(drain(&mut t, now).len(), 3 * 19_000);
        assert!(t.capacity_bytes() <= HEAP_KEEP * 24);
        // One left: little kept.
        t.arm(now, Timer::KeepAlive(conn(1)));
        assert!(t.wheel.capacity() <= 4);
        assert_eq!(t.pop_due(now), Some(Timer::KeepAlive(conn(1))));
        assert_eq!(t.wheel.capacity(), 0);
    }
}

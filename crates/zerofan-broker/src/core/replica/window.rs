//! An image's outbound window, in send order and by packet id.
//!
//! Each `Send` asks whether its packet id is still out and each `Complete`
//! where it is: answered by scanning a deque, that was a pass over the
//! window (up to 65,535 deliveries) per operation, 10–20 % of a replica's
//! CPU at 1,024 in flight. Here both are a map lookup.
//!
//! Deliveries sit in a deque of slots by send number, a completed one
//! leaving a hole until the holes before it are gone too: deliveries end
//! about in the order they went out, so the holes stay few. A `BTreeMap`
//! by send number did the same, but moved its 80-byte values around its
//! nodes at every insert and removal (about 10 % of a replica's CPU).

use super::InflightCopy;
use crate::core::hash::HashMap;
use std::collections::VecDeque;

/// Room for holes before they are squeezed out (see `Window::squeeze`).
const SLACK: usize = 64;

/// Deliveries out, oldest first, each packet id at most once.
///
/// Bounded: at most one slot per packet id out, plus as many holes and
/// [`SLACK`] more (a delivery that never ends does not make the holes
/// after it grow without end).
#[derive(Debug, Default)]
pub(super) struct Window {
    /// The delivery sent `first + i`-th in slot `i`; `None` once it ended.
    /// The first slot is never a hole.
    slots: VecDeque<Option<InflightCopy>>,
    first: u64,
    /// The send number of each packet id out.
    order_of: HashMap<u16, u64>,
}

impl Window {
    /// Append a delivery; one already out with its packet id goes.
    pub(super) fn push_back(&mut self, f: InflightCopy) {
        let at = self.first + self.slots.len() as u64;
        let old = self.order_of.insert(f.0, at);
        self.slots.push_back(Some(f));
        if let Some(old) = old {
            self.take(old);
        }
    }

    /// Take the delivery out as `pid`.
    pub(super) fn remove(&mut self, pid: u16) -> Option<InflightCopy> {
        let at = self.order_of.remove(&pid)?;
        self.take(at)
    }

    /// The delivery out as `pid`.
    pub(super) fn get_mut(&mut self, pid: u16) -> Option<&mut InflightCopy> {
        let i = self.index(*self.order_of.get(&pid)?)?;
        self.slots.get_mut(i)?.as_mut()
    }

    /// Oldest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &InflightCopy> {
        self.slots.iter().flatten()
    }

    fn index(&self, at: u64) -> Option<usize> {
        usize::try_from(at.checked_sub(self.first)?).ok()
    }

    /// Empty the slot of send number `at`, then drop the holes at the
    /// front, and squeeze out the others when they outnumber the
    /// deliveries.
    fn take(&mut self, at: u64) -> Option<InflightCopy> {
        let i = self.index(at)?;
        let f = self.slots.get_mut(i)?.take();
        while self.slots.front().is_some_and(Option::is_none) {
            self.slots.pop_front();
            self.first += 1;
        }
        if self.slots.len() > 2 * self.order_of.len() + SLACK {
            self.squeeze();
        }
        f
    }

    /// Renumber the deliveries out without holes (a delivery that stays
    /// out while later ones end keeps the holes from reaching the front).
    fn squeeze(&mut self) {
        self.slots.retain(Option::is_some);
        for (i, f) in self.slots.iter().flatten().enumerate() {
            self.order_of.insert(f.0, self.first + i as u64);
        }
    }

    #[cfg(test)]
    fn slots(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerofan_store::InflightPhase;

    fn out(pid: u16) -> InflightCopy {
        (pid, InflightPhase::PublishSent, None)
    }

    fn pids(w: &Window) -> Vec<u16> {
        w.iter().map(|f| f.0).collect()
    }

    #[test]
    fn deliveries_stay_in_send_order_and_a_resent_id_moves_to_the_back() {
        let mut w = Window::default();
        for pid in [5, 6, 7] {
            w.push_back(out(pid));
        }
        assert_eq!(w.remove(6).map(|f| f.0), Some(6));
        assert!(w.remove(6).is_none(), "once");
        w.push_back(out(5));
        assert_eq!(pids(&w), [7, 5]);
        if let Some(f) = w.get_mut(7) {
            f.1 = InflightPhase::PubrecReceived;
        }
        assert!(w
            .iter()
            .any(|f| f.0 == 7 && f.1 == InflightPhase::PubrecReceived));
        assert!(w.get_mut(6).is_none());
        assert_eq!(w.remove(7).map(|f| f.0), Some(7));
        assert_eq!(w.remove(5).map(|f| f.0), Some(5));
        assert_eq!(w.slots(), 0, "no holes left");
    }

    #[test]
    fn a_delivery_that_never_ends_leaves_the_holes_after_it_bounded() {
        let mut w = Window::default();
        w.push_back(out(1));
        // 100,000 deliveries through 1,024 ids, with id 1 out all along.
        for n in 0..100_000u32 {
            let pid = 2 + (n % 1024) as u16;
            w.push_back(out(pid));
            if n >= 1023 {
                let done = 2 + ((n - 1023) % 1024) as u16;
                assert!(w.remove(done).is_some(), "{done} out");
            }
            assert!(w.slots() <= 2 * 1025 + SLACK + 1, "{} slots", w.slots());
        }
        let got = pids(&w);
        assert_eq!(got.len(), 1024);
        assert_eq!(got.first(), Some(&1), "still the oldest");
        assert!(w.get_mut(1).is_some() && w.remove(1).is_some());
        // Every id still out is found where it is, after the squeezes.
        for pid in got.into_iter().skip(1) {
            assert_eq!(w.remove(pid).map(|f| f.0), Some(pid));
        }
        assert_eq!(w.slots(), 0);
    }
}

//! An image's outbound window, in send order and by packet id.
//!
//! Each `Send` asks whether its packet id is still out and each `Complete`
//! where it is: answered by scanning a deque, that was a pass over the
//! window (up to 65,535 deliveries) per operation, 10–20 % of a replica's
//! CPU at 1,024 in flight. Here both are a map lookup.

use super::InflightCopy;
use crate::core::hash::HashMap;
use std::collections::BTreeMap;

/// Deliveries out, oldest first, each packet id at most once.
#[derive(Debug, Default)]
pub(super) struct Window {
    by_order: BTreeMap<u64, InflightCopy>,
    order_of: HashMap<u16, u64>,
    next: u64,
}

impl Window {
    /// Append a delivery; one already out with its packet id goes.
    pub(super) fn push_back(&mut self, f: InflightCopy) {
        let at = self.next;
        self.next += 1;
        if let Some(old) = self.order_of.insert(f.0, at) {
            self.by_order.remove(&old);
        }
        self.by_order.insert(at, f);
    }

    /// Take the delivery out as `pid`.
    pub(super) fn remove(&mut self, pid: u16) -> Option<InflightCopy> {
        let at = self.order_of.remove(&pid)?;
        self.by_order.remove(&at)
    }

    /// The delivery out as `pid`.
    pub(super) fn get_mut(&mut self, pid: u16) -> Option<&mut InflightCopy> {
        let at = self.order_of.get(&pid)?;
        self.by_order.get_mut(at)
    }

    /// Oldest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &InflightCopy> {
        self.by_order.values()
    }
}

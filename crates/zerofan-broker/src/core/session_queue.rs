//! A session's queue of messages not yet sent, with the counters its
//! bounds read. Its state is boxed, made on the first message and dropped
//! when the connection parks or the session is left without one
//! ([`SessionQueue::release`]): most sessions of a device fleet hold no
//! message most of the time, and the 48 bytes of a `VecDeque` and two
//! counters made each of them a 128-byte `Session` where 8 bytes do.

use super::session::Queued;
use std::collections::VecDeque;
use zerofan_codec::QoS;

/// The queue; the counters always match its items (only this type's
/// methods change either).
#[derive(Debug, Default)]
pub(crate) struct SessionQueue(Option<Box<Items>>);

#[derive(Debug, Default)]
struct Items {
    items: VecDeque<Queued>,
    /// Payload bytes of `items`.
    bytes: usize,
    /// QoS 0 messages in `items`.
    qos0: usize,
}

impl Items {
    #[inline]
    fn forget(&mut self, q: &Queued) {
        self.bytes -= q.msg.size();
        self.qos0 -= usize::from(q.qos == QoS::AtMostOnce);
    }
}

impl SessionQueue {
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.items.len())
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Payload bytes queued.
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.bytes)
    }

    /// QoS 0 messages queued.
    #[inline]
    pub(crate) fn qos0(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.qos0)
    }

    #[inline]
    pub(crate) fn front(&self) -> Option<&Queued> {
        self.0.as_ref().and_then(|q| q.items.front())
    }

    #[inline]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Queued> {
        self.0.iter().flat_map(|q| q.items.iter())
    }

    /// The items, to change what the counters do not count (the message's
    /// bytes after compaction, store entries): an item's QoS and size must
    /// stay as they are.
    #[inline]
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Queued> {
        self.0.iter_mut().flat_map(|q| q.items.iter_mut())
    }

    #[inline]
    pub(crate) fn push_back(&mut self, item: Queued) {
        let q = self.0.get_or_insert_with(Box::default);
        q.bytes += item.msg.size();
        q.qos0 += usize::from(item.qos == QoS::AtMostOnce);
        q.items.push_back(item);
    }

    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<Queued> {
        let q = self.0.as_mut()?;
        let item = q.items.pop_front()?;
        q.forget(&item);
        Some(item)
    }

    #[inline]
    pub(crate) fn remove(&mut self, pos: usize) -> Option<Queued> {
        let q = self.0.as_mut()?;
        let item = q.items.remove(pos)?;
        q.forget(&item);
        Some(item)
    }

    /// Keep only the items `keep` accepts, in order; the others are
    /// handed to `gone` (oldest first).
    pub(crate) fn retain(
        &mut self,
        mut keep: impl FnMut(&Queued) -> bool,
        mut gone: impl FnMut(Queued),
    ) {
        let Some(q) = self.0.as_mut() else {
            return;
        };
        let all = std::mem::take(&mut q.items);
        let mut kept = VecDeque::with_capacity(all.len());
        for item in all {
            if keep(&item) {
                kept.push_back(item);
            } else {
                q.forget(&item);
                gone(item);
            }
        }
        q.items = kept;
    }

    /// An empty queue whose buffer grew past `keep` slots in a burst gives
    /// that buffer back.
    pub(crate) fn release_space(&mut self, keep: usize) {
        if let Some(q) = self.0.as_mut() {
            if q.items.is_empty() && q.items.capacity() > keep {
                q.items = VecDeque::new();
            }
        }
    }

    /// An empty queue gives back all its space, boxed state included.
    pub(crate) fn release(&mut self) {
        if self.is_empty() {
            self.0 = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn q(qos: QoS, n: usize) -> Queued {
        Queued::for_test(qos, Bytes::from(vec![7; n]))
    }

    #[test]
    fn an_idle_queue_is_one_pointer() {
        assert_eq!(std::mem::size_of::<SessionQueue>(), 8);
    }

    #[test]
    fn counters_follow_every_change() {
        let mut s = SessionQueue::default();
        assert!(s.is_empty() && s.front().is_none() && s.pop_front().is_none());
        s.push_back(q(QoS::AtMostOnce, 1));
        s.push_back(q(QoS::AtLeastOnce, 2));
        s.push_back(q(QoS::AtMostOnce, 4));
        s.push_back(q(QoS::ExactlyOnce, 8));
        // A message's size counts its one-byte topic too.
        assert_eq!((s.len(), s.bytes(), s.qos0()), (4, 19, 2));
        assert_eq!(s.remove(2).map(|i| i.msg.size()), Some(5));
        assert_eq!((s.len(), s.bytes(), s.qos0()), (3, 14, 1));
        let mut gone = Vec::new();
        s.retain(|i| i.qos != QoS::AtLeastOnce, |i| gone.push(i.msg.size()));
        assert_eq!(gone, vec![3]);
        assert_eq!((s.len(), s.bytes(), s.qos0()), (2, 11, 1));
        assert_eq!(s.pop_front().map(|i| i.msg.size()), Some(2));
        assert_eq!((s.len(), s.bytes(), s.qos0()), (1, 9, 0));
        assert!(s.remove(5).is_none());
        assert_eq!(s.iter().map(|i| i.msg.size()).sum::<usize>(), 9);
    }

    #[test]
    fn space_is_released_only_when_empty() {
        let mut s = SessionQueue::default();
        for _ in 0..100 {
            s.push_back(q(QoS::AtMostOnce, 1));
        }
        s.release_space(0);
        assert_eq!(s.len(), 100, "a queue with items keeps them");
        while s.pop_front().is_some() {}
        s.release_space(1000);
        assert!(
            s.0.as_ref().is_some_and(|q| q.items.capacity() >= 100),
            "a buffer within `keep` is kept"
        );
        s.release_space(64);
        assert!(s.0.as_ref().is_some_and(|q| q.items.capacity() == 0));
        s.release();
        assert!(s.0.is_none());
    }
}

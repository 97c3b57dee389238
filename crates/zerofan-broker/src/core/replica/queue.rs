//! A copy's queue of entries not yet sent, by the owner's entry id (queue
//! order), with the message bytes they reference counted: a message
//! stranded for an away owner is bounded by them as the session would be
//! (see `stranded`).

use std::collections::BTreeMap;
use std::ops::RangeBounds;
use zerofan_store::{EntryId, QueueEntry};

/// The entries, each with its message's size; `bytes` is always their sum
/// (only this type's methods change either), a message queued twice
/// counted twice, as in a session's queue.
#[derive(Debug, Default)]
pub(super) struct Queue {
    entries: BTreeMap<EntryId, (QueueEntry, usize)>,
    bytes: usize,
}

impl Queue {
    /// Add (or replace) entry `id`, whose message is `size` bytes.
    pub(super) fn insert(&mut self, id: EntryId, item: QueueEntry, size: usize) {
        if let Some((_, old)) = self.entries.insert(id, (item, size)) {
            self.bytes -= old;
        }
        self.bytes += size;
    }

    pub(super) fn remove(&mut self, id: &EntryId) -> Option<QueueEntry> {
        let (item, size) = self.entries.remove(id)?;
        self.bytes -= size;
        Some(item)
    }

    pub(super) fn get(&self, id: &EntryId) -> Option<&QueueEntry> {
        self.entries.get(id).map(|(e, _)| e)
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether one more entry of `size` bytes keeps within `max_len`
    /// entries and `max_bytes` (which one entry alone may pass, as in a
    /// session's queue).
    pub(super) fn fits(&self, max_len: usize, max_bytes: usize, size: usize) -> bool {
        fits(self.len(), self.bytes, size, max_len, max_bytes)
    }

    /// The oldest entries from `from` on whose removal makes one more of
    /// `size` bytes fit (see [`Queue::fits`]); none if even removing them
    /// all would not.
    pub(super) fn room(
        &self,
        from: EntryId,
        max_len: usize,
        max_bytes: usize,
        size: usize,
    ) -> Option<Vec<EntryId>> {
        let (mut len, mut bytes) = (self.len(), self.bytes);
        let mut out = Vec::new();
        for (id, (_, s)) in self.entries.range(from..) {
            if fits(len, bytes, size, max_len, max_bytes) {
                break;
            }
            out.push(*id);
            len -= 1;
            bytes -= s;
        }
        fits(len, bytes, size, max_len, max_bytes).then_some(out)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &QueueEntry> {
        self.entries.values().map(|(e, _)| e)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&EntryId, &QueueEntry)> {
        self.entries.iter().map(|(id, (e, _))| (id, e))
    }

    pub(super) fn range(
        &self,
        r: impl RangeBounds<EntryId>,
    ) -> impl DoubleEndedIterator<Item = (&EntryId, &QueueEntry)> {
        self.entries.range(r).map(|(id, (e, _))| (id, e))
    }
}

fn fits(len: usize, bytes: usize, size: usize, max_len: usize, max_bytes: usize) -> bool {
    len < max_len && (bytes + size <= max_bytes || len == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerofan_store::MsgId;

    fn item(msg: u64) -> QueueEntry {
        QueueEntry {
            msg: MsgId(msg),
            qos: 1,
            retain: false,
            subscription_ids: Vec::new(),
            share: None,
        }
    }

    #[test]
    fn bytes_follow_the_entries() {
        let mut q = Queue::default();
        q.insert(EntryId(1), item(1), 10);
        q.insert(EntryId(2), item(1), 10);
        q.insert(EntryId(3), item(2), 5);
        assert_eq!((q.len(), q.bytes), (3, 25));
        // Replaced: its old size goes.
        q.insert(EntryId(3), item(3), 7);
        assert_eq!((q.len(), q.bytes), (3, 27));
        assert_eq!(q.remove(&EntryId(1)).map(|e| e.msg), Some(MsgId(1)));
        assert!(q.remove(&EntryId(1)).is_none());
        assert_eq!((q.len(), q.bytes), (2, 17));
        let ids: Vec<u64> = q.range(EntryId(3)..).map(|(id, _)| id.0).collect();
        assert_eq!(ids, [3]);
    }

    #[test]
    fn room_is_made_from_the_oldest_entries_past_a_point() {
        let mut q = Queue::default();
        for id in 1..=4 {
            q.insert(EntryId(id), item(id), 10);
        }
        assert!(q.fits(5, 50, 10));
        assert!(!q.fits(4, 50, 10), "4 entries at most");
        assert!(!q.fits(5, 45, 10), "45 bytes at most");
        // One entry alone may pass the bytes, not the count.
        assert!(Queue::default().fits(1, 5, 10));
        assert!(!Queue::default().fits(0, 5, 10));

        // Room from entry 3 on: 3 goes first, then 4.
        assert_eq!(q.room(EntryId(3), 4, 100, 10), Some(vec![EntryId(3)]));
        assert_eq!(
            q.room(EntryId(3), 3, 100, 10),
            Some(vec![EntryId(3), EntryId(4)])
        );
        assert_eq!(
            q.room(EntryId(3), 5, 35, 10),
            Some(vec![EntryId(3), EntryId(4)])
        );
        // Entries 1 and 2 are not to go: no room.
        assert_eq!(q.room(EntryId(3), 2, 100, 10), None);
        assert_eq!(q.room(EntryId(3), 5, 25, 10), None);
        // Fits already: nothing goes.
        assert_eq!(q.room(EntryId(3), 5, 100, 10), Some(vec![]));
    }
}

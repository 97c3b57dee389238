//! Connections and sessions by id, in slots rather than hash maps. Every
//! connection has one entry in the core (its `Connection`) and one in the
//! shell (its `ConnHandle`), and every session one (its `Session`); a hash
//! map keeps up to twice its entries in buckets, and every bucket is
//! touched, so at 19,000 idle connections the three maps cost about 120
//! bytes a connection in slack alone, and a boxed value its allocator's
//! rounding besides.
//!
//! An id ([`ConnId`], [`SessionId`]) names a slot and that slot's
//! generation: the low 32 bits are the slot's index plus one (never zero),
//! the high 32 its generation, which goes up each time the slot is freed.
//! An id therefore still names one value only, ever: a late call with the
//! id of a closed connection finds a newer generation and misses, as it
//! missed the hash map. A slot whose generation would wrap is never used
//! again.
//!
//! Slots live in pages of [`PAGE`]: growing adds a page and never moves the
//! entries already placed (a million connections would otherwise copy
//! their state at every doubling).

use super::ids::{ConnId, SessionId};
use std::marker::PhantomData;

/// An id a [`SlotTable`] hands out: a slot and its generation in 64 bits.
pub trait SlotId: Copy {
    /// The id numbered `raw`; none for zero.
    fn from_raw(raw: u64) -> Option<Self>;
    /// The id as a number, never zero.
    fn raw(self) -> u64;
}

impl SlotId for ConnId {
    fn from_raw(raw: u64) -> Option<Self> {
        ConnId::from_raw(raw)
    }
    fn raw(self) -> u64 {
        ConnId::raw(self)
    }
}

impl SlotId for SessionId {
    fn from_raw(raw: u64) -> Option<Self> {
        (raw != 0).then_some(SessionId(raw))
    }
    fn raw(self) -> u64 {
        self.0
    }
}

/// Connections by id: the core's `Connection`s and the shell's handles,
/// under the same ids.
pub type ConnTable<V> = SlotTable<ConnId, V>;

/// Slots per page.
const PAGE: usize = 256;

#[derive(Debug)]
struct Slot<V> {
    generation: u32,
    value: Option<V>,
}

/// Values by id, in pages of slots with a free list.
#[derive(Debug)]
pub struct SlotTable<K, V> {
    pages: Vec<Box<[Slot<V>]>>,
    /// Free slots, the most recently freed last (reused first, still warm
    /// in the cache).
    free: Vec<u32>,
    /// Slots ever used: the next new slot's index.
    fresh: usize,
    len: usize,
    ids: PhantomData<K>,
}

impl<K, V> Default for SlotTable<K, V> {
    fn default() -> Self {
        SlotTable {
            pages: Vec::new(),
            free: Vec::new(),
            fresh: 0,
            len: 0,
            ids: PhantomData,
        }
    }
}

/// The slot index and generation an id names. The low half is never zero
/// in an id made by `join`; an id where it is (a poller's token, say)
/// names no slot.
fn split(id: impl SlotId) -> Option<(usize, u32)> {
    let raw = id.raw();
    let low = (raw as u32).checked_sub(1)?;
    Some((low as usize, (raw >> 32) as u32))
}

fn join<K: SlotId>(index: usize, generation: u32) -> Option<K> {
    let low = u32::try_from(index).ok()?.checked_add(1)?;
    K::from_raw((u64::from(generation) << 32) | u64::from(low))
}

impl<V> ConnTable<V> {
    /// An id that names no slot of any table.
    pub const NO_SLOT: ConnId = match ConnId::from_raw_const(1 << 32) {
        Some(id) => id,
        None => ConnId::FIRST,
    };
}

impl<K: SlotId, V> SlotTable<K, V> {
    /// Bytes a slot takes: the value and its generation.
    pub const SLOT_BYTES: usize = std::mem::size_of::<Slot<V>>();

    /// Connections held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slot(&self, index: usize) -> Option<&Slot<V>> {
        self.pages.get(index / PAGE)?.get(index % PAGE)
    }

    fn slot_mut(&mut self, index: usize) -> Option<&mut Slot<V>> {
        self.pages.get_mut(index / PAGE)?.get_mut(index % PAGE)
    }

    /// Make room for slot `index` (adding pages of empty slots).
    fn grow_to(&mut self, index: usize) {
        while self.pages.len() <= index / PAGE {
            let page: Box<[Slot<V>]> = (0..PAGE)
                .map(|_| Slot {
                    generation: 0,
                    value: None,
                })
                .collect();
            self.pages.push(page);
        }
    }

    /// Store `value` under a new id: a free slot's next generation, or a
    /// new slot. `None` only when 2^32 - 1 slots are taken.
    pub fn insert(&mut self, value: V) -> Option<K> {
        let index = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                let index = self.fresh;
                join::<K>(index, 0)?;
                self.grow_to(index);
                self.fresh += 1;
                index
            }
        };
        let slot = self.slot_mut(index)?;
        let id = join(index, slot.generation)?;
        slot.value = Some(value);
        self.len += 1;
        Some(id)
    }

    /// Store `value` under `id`, an id another table gave out (the shell
    /// keeps its handles under the core's ids). Returns what the slot held,
    /// or `value` itself for an id that names no slot.
    pub fn insert_at(&mut self, id: K, value: V) -> Option<V> {
        let Some((index, generation)) = split(id) else {
            return Some(value);
        };
        self.grow_to(index);
        self.fresh = self.fresh.max(index + 1);
        let Some(slot) = self.slot_mut(index) else {
            return Some(value);
        };
        slot.generation = generation;
        let old = slot.value.replace(value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// The value under `id`, if `id` is its slot's current generation.
    pub fn get(&self, id: &K) -> Option<&V> {
        let (index, generation) = split(*id)?;
        let slot = self.slot(index)?;
        if slot.generation != generation {
            return None;
        }
        slot.value.as_ref()
    }

    /// The value under `id`, if `id` is its slot's current generation.
    pub fn get_mut(&mut self, id: &K) -> Option<&mut V> {
        let (index, generation) = split(*id)?;
        let slot = self.slot_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        slot.value.as_mut()
    }

    /// Whether `id` names a value held now.
    pub fn contains_key(&self, id: &K) -> bool {
        self.get(id).is_some()
    }

    /// Take the value under `id`; its slot's next id is a new generation.
    pub fn remove(&mut self, id: &K) -> Option<V> {
        let (index, generation) = split(*id)?;
        let slot = self.slot_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        let value = slot.value.take()?;
        // A slot whose generation would wrap is retired: its ids must not
        // come back.
        let reusable = match slot.generation.checked_add(1) {
            Some(next) => {
                slot.generation = next;
                true
            }
            None => false,
        };
        self.len -= 1;
        // `split` gave an index below 2^32 - 1.
        if let (true, Ok(i)) = (reusable, u32::try_from(index)) {
            self.free.push(i);
        }
        Some(value)
    }

    /// Every id with its value, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (K, &V)> + '_ {
        self.pages.iter().enumerate().flat_map(|(p, page)| {
            page.iter().enumerate().filter_map(move |(i, s)| {
                let v = s.value.as_ref()?;
                Some((join(p * PAGE + i, s.generation)?, v))
            })
        })
    }

    /// Every id held.
    pub fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.iter().map(|(id, _)| id)
    }

    /// Every value held.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.pages
            .iter()
            .flat_map(|page| page.iter().filter_map(|s| s.value.as_ref()))
    }

    /// Every value held.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        self.pages
            .iter_mut()
            .flat_map(|page| page.iter_mut().filter_map(|s| s.value.as_mut()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_reused() {
        let mut t: ConnTable<u32> = ConnTable::default();
        let a = t.insert(1).unwrap();
        assert_eq!(a, ConnId::FIRST, "the first id is the core's first");
        let b = t.insert(2).unwrap();
        assert_eq!(t.remove(&a), Some(1));
        assert_eq!(t.remove(&a), None);
        let c = t.insert(3).unwrap();
        assert_ne!(c, a, "the freed slot comes back under a new generation");
        assert_eq!(t.get(&a), None);
        assert_eq!((t.get(&b), t.get(&c)), (Some(&2), Some(&3)));
        assert_eq!(t.len(), 2);
        let mut all: Vec<_> = t.iter().map(|(id, v)| (id, *v)).collect();
        all.sort();
        let mut want = vec![(b, 2), (c, 3)];
        want.sort();
        assert_eq!(all, want);
    }

    #[test]
    fn grows_over_pages_and_mirrors_ids_given_elsewhere() {
        let mut core: ConnTable<usize> = ConnTable::default();
        let mut shell: ConnTable<usize> = ConnTable::default();
        let ids: Vec<ConnId> = (0..3 * PAGE + 7)
            .map(|i| {
                let id = core.insert(i).unwrap();
                assert_eq!(shell.insert_at(id, i), None);
                id
            })
            .collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(core.get(id), Some(&i));
            assert_eq!(shell.get(id), Some(&i));
        }
        for id in &ids[..PAGE] {
            core.remove(id);
            shell.remove(id);
        }
        assert_eq!((core.len(), shell.len()), (2 * PAGE + 7, 2 * PAGE + 7));
        let again = core.insert(9).unwrap();
        assert!(!ids.contains(&again));
        assert_eq!(shell.insert_at(again, 9), None);
        assert_eq!(shell.get(&again), Some(&9));
        assert_eq!(shell.get(&ids[0]), None, "the old generation misses");
        assert_eq!(core.values().count(), 2 * PAGE + 8);
        for v in shell.values_mut() {
            *v += 1;
        }
        assert_eq!(shell.get(&again), Some(&10));
    }

    #[test]
    fn ids_that_name_no_slot_miss() {
        let mut t: ConnTable<u8> = ConnTable::default();
        t.insert(1).unwrap();
        // A token whose low half is zero, and one far past the pages.
        for raw in [1u64 << 32, 5_000_000] {
            let id = ConnId::from_raw(raw).unwrap();
            assert_eq!(t.get(&id), None);
            assert_eq!(t.remove(&id), None);
        }
        assert_eq!(t.len(), 1);
        let zero_low = ConnId::from_raw(7u64 << 32).unwrap();
        assert_eq!(t.insert_at(zero_low, 3), Some(3), "refused, not placed");
        assert_eq!((t.len(), t.pages.len()), (1, 1));
    }

    #[test]
    fn a_slot_whose_generation_would_wrap_is_retired() {
        let mut t: ConnTable<u8> = ConnTable::default();
        let id = join(0, u32::MAX).unwrap();
        t.insert_at(id, 1);
        assert_eq!(t.remove(&id), Some(1));
        let next = t.insert(2).unwrap();
        assert_ne!(
            split(next).map(|s| s.0),
            Some(0),
            "slot 0 is not handed out again"
        );
    }

    #[test]
    fn a_connection_slot_is_its_connection_and_a_generation() {
        // 104-byte `Connection` inline, its generation in the 8 bytes
        // after it: what a boxed one and a hash map slot for its box cost,
        // less the box's pointer and the map's slack.
        assert_eq!(
            ConnTable::<crate::core::connection::Connection>::SLOT_BYTES,
            112
        );
    }
}

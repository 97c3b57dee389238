//! A trie node's literal children, each behind an edge whose key is one or
//! more literal levels joined by `/` (see the trie's module comment). A
//! child is found by the FIRST level of its key: one hash and one compare
//! per topic level, as with one node per level. Most nodes of a device
//! fleet's filters have exactly one child (`devices` has many, a device's
//! own path one), and a table with one entry allocates four slots: one
//! child is kept inline instead; a table is made for the second.

use super::hash::Seeded;
use hashbrown::HashTable;
use std::hash::BuildHasher;

/// A child and the literal levels that lead to it from its parent.
#[derive(Debug)]
pub(super) struct Edge<N> {
    /// One level, or several joined by `/`; never `+` or `#`.
    pub key: Box<[u8]>,
    /// Boxed: a table's spare slots would each hold a whole node.
    pub node: Box<N>,
}

impl<N> Edge<N> {
    /// The key's first level: what the edge is looked up by.
    pub(super) fn first(&self) -> &[u8] {
        first_level(&self.key)
    }

    /// Whether the key's first level is `level` (which has no `/`).
    #[inline]
    pub(super) fn starts(&self, level: &[u8]) -> bool {
        self.key.starts_with(level) && matches!(self.key.get(level.len()), None | Some(b'/'))
    }

    /// The levels after the first (`level`, which `starts`), joined by
    /// `/`; `None` when the key is that one level. `Some(b"")` is one
    /// empty level (the key `a/`).
    #[inline]
    pub(super) fn tail(&self, level: &[u8]) -> Option<&[u8]> {
        self.key.get(level.len() + 1..)
    }
}

fn first_level(key: &[u8]) -> &[u8] {
    key.iter()
        .position(|&b| b == b'/')
        .map_or(key, |i| &key[..i])
}

fn hash(level: &[u8]) -> u64 {
    Seeded.hash_one(level)
}

/// Children by the first level of their edge.
#[derive(Debug)]
pub(super) enum Children<N> {
    /// Exactly one child.
    One(Edge<N>),
    /// None (an empty table allocates nothing), or two and more.
    Many(HashTable<Edge<N>>),
}

impl<N> Default for Children<N> {
    fn default() -> Self {
        Children::Many(HashTable::new())
    }
}

impl<N> Children<N> {
    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Children::Many(m) if m.is_empty())
    }

    /// The edge whose first level is `level`.
    #[inline]
    pub(super) fn get(&self, level: &[u8]) -> Option<&Edge<N>> {
        match self {
            Children::One(e) => e.starts(level).then_some(e),
            // No hash for a node without children (a leaf, a node with
            // only `+`), as std's maps skip it too.
            Children::Many(m) if m.is_empty() => None,
            Children::Many(m) => m.find(hash(level), |e| e.starts(level)),
        }
    }

    /// The edge whose first level is `level`.
    #[inline]
    pub(super) fn get_mut(&mut self, level: &[u8]) -> Option<&mut Edge<N>> {
        match self {
            Children::One(e) => e.starts(level).then_some(e),
            Children::Many(m) if m.is_empty() => None,
            Children::Many(m) => m.find_mut(hash(level), |e| e.starts(level)),
        }
    }

    /// The edge whose first level is `level`; `make` makes it when there
    /// is none (its key must start with `level`).
    pub(super) fn get_or_insert_with(
        &mut self,
        level: &[u8],
        make: impl Fn() -> Edge<N>,
    ) -> &mut Edge<N> {
        let grow = match self {
            Children::One(e) => !e.starts(level),
            Children::Many(m) => m.is_empty(),
        };
        if grow {
            *self = match std::mem::take(self) {
                Children::One(e) => {
                    let mut m = HashTable::new();
                    m.insert_unique(hash(e.first()), e, |e| hash(e.first()));
                    Children::Many(m)
                }
                Children::Many(_) => Children::One(make()),
            };
        }
        match self {
            Children::One(e) => e,
            Children::Many(m) => m
                .entry(hash(level), |e| e.starts(level), |e| hash(e.first()))
                .or_insert_with(make)
                .into_mut(),
        }
    }

    /// Drop the edge whose first level is `level`; the last one left is
    /// kept inline again.
    pub(super) fn remove(&mut self, level: &[u8]) {
        match self {
            Children::One(e) if e.starts(level) => *self = Children::default(),
            Children::One(..) => {}
            Children::Many(m) => {
                if let Ok(e) = m.find_entry(hash(level), |e| e.starts(level)) {
                    e.remove();
                }
                if m.len() == 1 {
                    if let Some(e) = std::mem::take(m).into_iter().next() {
                        *self = Children::One(e);
                    }
                }
            }
        }
    }

    /// Every edge, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Edge<N>> {
        let (one, many) = match self {
            Children::One(e) => (Some(e), None),
            Children::Many(m) => (None, Some(m.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::{Children, Edge};

    fn edge(key: &str, n: u32) -> Edge<u32> {
        Edge {
            key: key.as_bytes().into(),
            node: Box::new(n),
        }
    }

    #[test]
    fn found_by_the_first_level_of_the_key() {
        let e = edge("ab/c//", 0);
        assert!(e.starts(b"ab") && !e.starts(b"a") && !e.starts(b"abc"));
        assert_eq!((e.first(), e.tail(b"ab")), (&b"ab"[..], Some(&b"c//"[..])));
        let e = edge("ab", 0);
        assert_eq!((e.first(), e.tail(b"ab")), (&b"ab"[..], None));
        let e = edge("/", 0);
        assert!(e.starts(b"") && !e.starts(b"x"));
        assert_eq!((e.first(), e.tail(b"")), (&b""[..], Some(&b""[..])));
    }

    #[test]
    fn one_inline_then_a_table_then_one_again() {
        let mut c: Children<u32> = Children::default();
        assert!(c.is_empty() && c.get(b"a").is_none());
        *c.get_or_insert_with(b"a", || edge("a/x", 1)).node += 0;
        assert!(matches!(c, Children::One(..)));
        assert_eq!(c.get(b"a").map(|e| *e.node), Some(1));
        assert!(c.get(b"b").is_none() && c.get(b"x").is_none());
        *c.get_or_insert_with(b"a", || edge("a", 99)).node += 1;
        *c.get_or_insert_with(b"b", || edge("b", 7)).node += 0;
        assert!(matches!(&c, Children::Many(m) if m.len() == 2));
        let got = (c.get(b"a").map(|e| *e.node), c.get(b"b").map(|e| *e.node));
        assert_eq!(got, (Some(2), Some(7)));
        *c.get_mut(b"b").unwrap().node = 8;
        let mut all: Vec<_> = c.iter().map(|e| (e.key.to_vec(), *e.node)).collect();
        all.sort();
        assert_eq!(all, [(b"a/x".to_vec(), 2), (b"b".to_vec(), 8)]);
        c.remove(b"a");
        assert!(matches!(c, Children::One(..)));
        assert!(matches!(&c, Children::One(e) if *e.node == 8));
        c.remove(b"x");
        c.remove(b"b");
        assert!(c.is_empty());
    }
}

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

/// A child and the literal levels that lead to it from its parent. One
/// pointer, the key kept beside the node: a big table's bucket is 8 bytes
/// (24 with the key's 16 inline), and a lookup reads the key where the
/// node it leads to is.
#[derive(Debug)]
pub(super) struct Edge<N>(Box<Keyed<N>>);

#[derive(Debug)]
struct Keyed<N> {
    /// One level, or several joined by `/`; never `+` or `#`.
    key: Box<[u8]>,
    node: N,
}

impl<N> Edge<N> {
    pub(super) fn new(key: &[u8], node: N) -> Self {
        Edge(Box::new(Keyed {
            key: key.into(),
            node,
        }))
    }

    /// One level, or several joined by `/`.
    #[inline]
    pub(super) fn key(&self) -> &[u8] {
        &self.0.key
    }

    /// The child the edge leads to.
    #[inline]
    pub(super) fn node(&self) -> &N {
        &self.0.node
    }

    /// [`Edge::node`], mutably.
    #[inline]
    pub(super) fn node_mut(&mut self) -> &mut N {
        &mut self.0.node
    }

    /// The node, the edge and its key dropped.
    pub(super) fn into_node(self) -> N {
        self.0.node
    }

    /// The key's first level: what the edge is looked up by.
    pub(super) fn first(&self) -> &[u8] {
        first_level(self.key())
    }

    /// Whether the key's first level is `level` (which has no `/`).
    #[inline]
    pub(super) fn starts(&self, level: &[u8]) -> bool {
        let key = self.key();
        key.starts_with(level) && matches!(key.get(level.len()), None | Some(b'/'))
    }

    /// The levels after the first (`level`, which `starts`), joined by
    /// `/`; `None` when the key is that one level. `Some(b"")` is one
    /// empty level (the key `a/`).
    #[inline]
    pub(super) fn tail(&self, level: &[u8]) -> Option<&[u8]> {
        self.key().get(level.len() + 1..)
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
#[derive(Debug, Default)]
pub(super) enum Children<N> {
    /// None: a leaf, or a node with only `+`, `#` or groups.
    #[default]
    None,
    /// Exactly one child.
    One(Edge<N>),
    /// Two and more. Boxed: a table is 32 bytes, inline it made every
    /// node (mostly leaves, one per device filter) 64 bytes, not 40, for
    /// the few that branch; those pay a pointer chase per lookup.
    Many(Box<HashTable<Edge<N>>>),
}

impl<N> Children<N> {
    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Children::None)
    }

    /// The edge whose first level is `level`.
    #[inline]
    pub(super) fn get(&self, level: &[u8]) -> Option<&Edge<N>> {
        match self {
            // No hash for a node without children (a leaf, a node with
            // only `+`), as std's maps skip it too.
            Children::None => None,
            Children::One(e) => e.starts(level).then_some(e),
            Children::Many(m) => m.find(hash(level), |e| e.starts(level)),
        }
    }

    /// The edge whose first level is `level`.
    #[inline]
    pub(super) fn get_mut(&mut self, level: &[u8]) -> Option<&mut Edge<N>> {
        match self {
            Children::None => None,
            Children::One(e) => e.starts(level).then_some(e),
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
        if matches!(self, Children::One(e) if !e.starts(level)) {
            if let Children::One(e) = std::mem::take(self) {
                let mut m = HashTable::with_capacity(2);
                m.insert_unique(hash(e.first()), e, |e| hash(e.first()));
                *self = Children::Many(Box::new(m));
            }
        }
        match self {
            Children::None => {
                *self = Children::One(make());
                // Once: `One` now, with an edge that starts with `level`.
                self.get_or_insert_with(level, make)
            }
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
            Children::None => {}
            Children::One(e) if e.starts(level) => *self = Children::None,
            Children::One(..) => {}
            Children::Many(m) => {
                if let Ok(e) = m.find_entry(hash(level), |e| e.starts(level)) {
                    e.remove();
                }
                if m.len() <= 1 {
                    *self = match std::mem::take(&mut **m).into_iter().next() {
                        Some(e) => Children::One(e),
                        None => Children::None,
                    };
                }
            }
        }
    }

    /// Every edge, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Edge<N>> {
        let (one, many) = match self {
            Children::None => (None, None),
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
        Edge::new(key.as_bytes(), n)
    }

    #[test]
    fn an_edge_is_one_pointer() {
        use std::mem::size_of;
        // A big table's bucket, and `Children` 16 bytes (a node 48).
        assert_eq!(size_of::<Edge<[u64; 6]>>(), 8);
        assert_eq!(size_of::<Children<[u64; 6]>>(), 16);
        let e = Edge::new(b"ab/c", String::from("n"));
        assert_eq!((e.key(), e.node().as_str()), (&b"ab/c"[..], "n"));
        assert_eq!(e.into_node(), "n");
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
        *c.get_or_insert_with(b"a", || edge("a/x", 1)).node_mut() += 0;
        assert!(matches!(c, Children::One(..)));
        assert_eq!(c.get(b"a").map(|e| *e.node()), Some(1));
        assert!(c.get(b"b").is_none() && c.get(b"x").is_none());
        *c.get_or_insert_with(b"a", || edge("a", 99)).node_mut() += 1;
        *c.get_or_insert_with(b"b", || edge("b", 7)).node_mut() += 0;
        assert!(matches!(&c, Children::Many(m) if m.len() == 2));
        let got = (
            c.get(b"a").map(|e| *e.node()),
            c.get(b"b").map(|e| *e.node()),
        );
        assert_eq!(got, (Some(2), Some(7)));
        *c.get_mut(b"b").unwrap().node_mut() = 8;
        let mut all: Vec<_> = c.iter().map(|e| (e.key().to_vec(), *e.node())).collect();
        all.sort();
        assert_eq!(all, [(b"a/x".to_vec(), 2), (b"b".to_vec(), 8)]);
        c.remove(b"a");
        assert!(matches!(c, Children::One(..)));
        assert!(matches!(&c, Children::One(e) if *e.node() == 8));
        c.remove(b"x");
        c.remove(b"b");
        assert!(c.is_empty());
    }
}

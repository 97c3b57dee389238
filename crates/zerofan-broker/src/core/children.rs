//! A trie node's literal children: most nodes of a device fleet's filters
//! have exactly one (`devices/{id}` has `cmd`), and a hash map with one
//! entry allocates a table of four slots (~120 bytes). One child is kept
//! inline instead; a map is made for the second.

use super::hash::HashMap;

/// Children by level, each boxed (see the trie's `Node`).
#[derive(Debug)]
pub(super) enum Children<N> {
    /// Exactly one child.
    One(Box<[u8]>, Box<N>),
    /// None (an empty map allocates nothing), or two and more.
    Many(HashMap<Box<[u8]>, Box<N>>),
}

impl<N> Default for Children<N> {
    fn default() -> Self {
        Children::Many(HashMap::default())
    }
}

impl<N: Default> Children<N> {
    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Children::Many(m) if m.is_empty())
    }

    pub(super) fn get(&self, level: &[u8]) -> Option<&N> {
        match self {
            Children::One(k, n) => (**k == *level).then_some(&**n),
            Children::Many(m) => m.get(level).map(|n| &**n),
        }
    }

    pub(super) fn get_mut(&mut self, level: &[u8]) -> Option<&mut N> {
        match self {
            Children::One(k, n) => (**k == *level).then_some(&mut **n),
            Children::Many(m) => m.get_mut(level).map(|n| &mut **n),
        }
    }

    /// The child for `level`, created when missing.
    pub(super) fn get_or_insert(&mut self, level: &[u8]) -> &mut N {
        let grow = match self {
            Children::One(k, _) => **k != *level,
            Children::Many(m) => m.is_empty(),
        };
        if grow {
            *self = match std::mem::take(self) {
                Children::One(k, n) => {
                    let mut m = HashMap::default();
                    m.insert(k, n);
                    Children::Many(m)
                }
                Children::Many(_) => Children::One(level.into(), Box::default()),
            };
        }
        match self {
            Children::One(_, n) => n,
            Children::Many(m) => m.entry(level.into()).or_default(),
        }
    }

    /// Drop the child for `level`; the last one left is kept inline again.
    pub(super) fn remove(&mut self, level: &[u8]) {
        match self {
            Children::One(k, _) if **k == *level => *self = Children::default(),
            Children::One(..) => {}
            Children::Many(m) => {
                m.remove(level);
                if m.len() == 1 {
                    if let Some((k, n)) = std::mem::take(m).into_iter().next() {
                        *self = Children::One(k, n);
                    }
                }
            }
        }
    }

    /// Every child with its level.
    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = (&[u8], &N)> + '_> {
        match self {
            Children::One(k, n) => Box::new(std::iter::once((&**k, &**n))),
            Children::Many(m) => Box::new(m.iter().map(|(k, n)| (&**k, &**n))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Children;

    #[test]
    fn one_inline_then_a_map_then_one_again() {
        let mut c: Children<u32> = Children::default();
        assert!(c.is_empty() && c.get(b"a").is_none());
        *c.get_or_insert(b"a") = 1;
        assert!(matches!(c, Children::One(..)));
        assert_eq!(c.get(b"a"), Some(&1));
        assert_eq!(c.get(b"b"), None);
        *c.get_or_insert(b"a") += 1;
        *c.get_or_insert(b"b") = 7;
        assert!(matches!(&c, Children::Many(m) if m.len() == 2));
        assert_eq!((c.get(b"a"), c.get(b"b")), (Some(&2), Some(&7)));
        *c.get_mut(b"b").unwrap() = 8;
        let mut all: Vec<_> = c.iter().map(|(k, n)| (k.to_vec(), *n)).collect();
        all.sort();
        assert_eq!(all, [(b"a".to_vec(), 2), (b"b".to_vec(), 8)]);
        c.remove(b"a");
        assert!(matches!(c, Children::One(..)));
        assert_eq!(c.get(b"b"), Some(&8));
        c.remove(b"x");
        c.remove(b"b");
        assert!(c.is_empty());
    }
}

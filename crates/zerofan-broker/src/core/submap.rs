//! A session's subscriptions by filter. Most sessions (a device) hold one,
//! and a hash map with one entry allocates a table of four slots (~150
//! bytes): one is kept inline instead, a map is made for the second. The
//! map is boxed so that the whole is 24 bytes, kept in every `Session`
//! (see `session.rs`). The methods are the hash map's that sessions use.

use super::hash::HashMap;

/// Filters to `V`, one of them without a table.
#[derive(Debug)]
pub(crate) enum SubMap<V> {
    /// Exactly one.
    One(Box<str>, V),
    /// None (`None`: nothing allocated), or two and more. Boxed: inline,
    /// the map's 32 bytes made the enum 40 and every session 8 bytes more.
    Many(Option<Box<HashMap<Box<str>, V>>>),
}

impl<V> Default for SubMap<V> {
    fn default() -> Self {
        SubMap::Many(None)
    }
}

impl<V> SubMap<V> {
    /// How many filters.
    pub(crate) fn len(&self) -> usize {
        match self {
            SubMap::One(..) => 1,
            SubMap::Many(m) => m.as_ref().map_or(0, |m| m.len()),
        }
    }

    /// Whether `filter` is one of them.
    pub(crate) fn contains_key(&self, filter: &str) -> bool {
        match self {
            SubMap::One(k, _) => **k == *filter,
            SubMap::Many(m) => m.as_ref().is_some_and(|m| m.contains_key(filter)),
        }
    }

    /// Add or replace `filter`'s value; the one it replaced.
    pub(crate) fn insert(&mut self, filter: Box<str>, value: V) -> Option<V> {
        match self {
            SubMap::One(k, v) if *k == filter => return Some(std::mem::replace(v, value)),
            SubMap::Many(Some(m)) if !m.is_empty() => return m.insert(filter, value),
            _ => {}
        }
        *self = match std::mem::take(self) {
            SubMap::One(k, v) => {
                let mut m = HashMap::default();
                m.insert(k, v);
                m.insert(filter, value);
                SubMap::Many(Some(Box::new(m)))
            }
            SubMap::Many(_) => SubMap::One(filter, value),
        };
        None
    }

    /// Take `filter`'s value out; the last one left is kept inline again.
    pub(crate) fn remove(&mut self, filter: &str) -> Option<V> {
        match self {
            SubMap::One(k, _) if **k == *filter => match std::mem::take(self) {
                SubMap::One(_, v) => Some(v),
                SubMap::Many(_) => None,
            },
            SubMap::One(..) | SubMap::Many(None) => None,
            SubMap::Many(Some(m)) => {
                let v = m.remove(filter);
                if m.len() == 1 {
                    if let Some((k, v)) = std::mem::take(&mut **m).into_iter().next() {
                        *self = SubMap::One(k, v);
                    }
                }
                v
            }
        }
    }

    /// Every filter with its value.
    pub(crate) fn iter(&self) -> Box<dyn Iterator<Item = (&Box<str>, &V)> + '_> {
        match self {
            SubMap::One(k, v) => Box::new(std::iter::once((k, v))),
            SubMap::Many(m) => Box::new(m.iter().flat_map(|m| m.iter())),
        }
    }

    /// Every filter.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &Box<str>> + '_ {
        self.iter().map(|(k, _)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::SubMap;

    #[test]
    fn one_inline_then_a_map_then_one_again() {
        let mut m: SubMap<u8> = SubMap::default();
        assert!(m.len() == 0 && !m.contains_key("a"));
        assert_eq!(m.insert("a".into(), 1), None);
        assert!(matches!(m, SubMap::One(..)));
        assert_eq!(m.insert("a".into(), 2), Some(1));
        assert_eq!(m.insert("b".into(), 3), None);
        assert!(matches!(m, SubMap::Many(Some(_))) && m.len() == 2);
        assert_eq!(m.insert("b".into(), 4), Some(3));
        let mut all: Vec<_> = m.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        all.sort();
        assert_eq!(all, [("a".to_string(), 2), ("b".to_string(), 4)]);
        assert_eq!(m.remove("x"), None);
        assert_eq!(m.remove("a"), Some(2));
        assert!(matches!(m, SubMap::One(..)) && m.contains_key("b"));
        assert_eq!(m.keys().count(), 1);
        assert_eq!(m.remove("a"), None);
        assert_eq!(m.remove("b"), Some(4));
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn twenty_four_bytes_in_a_session() {
        // Every session holds one (see `session.rs`); 40 with the map
        // inline, 32 with an `Option<u32>` subscription identifier (a
        // 12-byte record where `NonZeroU32` makes it 8).
        assert_eq!(
            std::mem::size_of::<SubMap<super::super::session::SubRecord>>(),
            24
        );
    }
}

//! The subscription trie: one node per topic level, shared groups kept at
//! the node of their filter. `+` and `#` children have slots of their own,
//! so routing a level costs one hash lookup, not three; levels are handled
//! as bytes (`/` is ASCII), which spares a UTF-8 char search per level.

use super::children::Children;
use super::ids::SessionId;
use super::subscribers::Subscribers;
use std::num::NonZeroU32;
use std::sync::Arc;
use zerofan_codec::SubscriptionOptions;

/// One subscription as the router sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SubEntry {
    /// The subscribing session.
    pub session: SessionId,
    /// Its options.
    pub options: SubscriptionOptions,
    /// Its subscription identifier (MQTT 5).
    pub id: Option<NonZeroU32>,
}

/// The members of one `$share/{group}/{filter}`; each message goes to one.
#[derive(Debug)]
pub(super) struct SharedGroup {
    /// Group name.
    pub name: Box<str>,
    /// The full `$share/{group}/{filter}`, as sessions remember it.
    pub key: Arc<str>,
    /// Members in subscription order.
    pub members: Vec<SubEntry>,
    /// Round-robin cursor.
    next: usize,
}

impl SharedGroup {
    /// Pick the next member round robin, preferring one whose client is
    /// connected so messages do not pile up in an absent member's queue.
    pub(super) fn pick(&mut self, online: impl Fn(SessionId) -> bool) -> Option<SubEntry> {
        let n = self.members.len();
        if n == 0 {
            return None;
        }
        let start = self.next % n;
        let chosen = (0..n)
            .map(|i| (start + i) % n)
            .find(|&i| online(self.members[i].session))
            .unwrap_or(start);
        self.next = chosen + 1;
        Some(self.members[chosen])
    }

    /// Pick a member other than `exclude` (one that is leaving), round robin,
    /// preferring connected ones.
    pub(super) fn pick_other(
        &mut self,
        exclude: SessionId,
        online: impl Fn(SessionId) -> bool,
    ) -> Option<SubEntry> {
        if !self.members.iter().any(|m| m.session != exclude) {
            return None;
        }
        if self
            .members
            .iter()
            .any(|m| m.session != exclude && online(m.session))
        {
            self.pick(|s| s != exclude && online(s))
        } else {
            self.pick(|s| s != exclude)
        }
    }
}

/// A match found while routing.
pub(super) enum Hit<'a> {
    /// An ordinary subscription.
    Direct(&'a SubEntry),
    /// A shared group: the caller picks one member.
    Shared(&'a mut SharedGroup),
}

/// What few nodes have: `+` and `#` children and shared groups. Boxed
/// together apart from the node (see `Node::rare`).
#[derive(Default, Debug)]
struct Rare {
    /// The `+` child.
    plus: Option<Box<Node>>,
    /// The `#` child.
    hash: Option<Box<Node>>,
    shared: Vec<SharedGroup>,
}

impl Rare {
    fn is_empty(&self) -> bool {
        self.plus.is_none() && self.hash.is_none() && self.shared.is_empty()
    }
}

#[derive(Default, Debug)]
struct Node {
    /// Children by literal level (never `+` or `#`). Boxed: a map's
    /// buckets hold its spare slots too (a one-child map has four, a big
    /// one up to twice its entries), and an inline 96-byte node made those
    /// cost 112 bytes each (a million device filters: ~750 bytes per
    /// subscription in the trie, ~330 boxed). A single child is kept
    /// without a map (see `children.rs`).
    children: Children<Node>,
    /// Ordered by session (see `Trie::insert`); one kept inline.
    subs: Subscribers,
    /// `+`, `#` and shared groups, allocated on first use and dropped when
    /// empty: a device fleet's nodes have none, and inline they made every
    /// node 96 bytes instead of 64 (two nodes per `devices/{id}/cmd`).
    rare: Option<Box<Rare>>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.subs.is_empty() && self.rare.is_none()
    }

    fn plus_mut(&mut self) -> Option<&mut Node> {
        self.rare.as_deref_mut()?.plus.as_deref_mut()
    }

    fn hash_mut(&mut self) -> Option<&mut Node> {
        self.rare.as_deref_mut()?.hash.as_deref_mut()
    }

    fn shared(&self) -> &[SharedGroup] {
        self.rare.as_deref().map_or(&[], |r| &r.shared)
    }

    /// The rare part, allocated now if missing.
    fn rare_mut(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Drop the rare part once nothing is left in it, so that
    /// `is_empty` stays true to the node and the trie prunes it.
    fn tidy(&mut self) {
        if self.rare.as_deref().is_some_and(Rare::is_empty) {
            self.rare = None;
        }
    }

    /// The child for `level`, if any.
    fn child(&self, level: &[u8]) -> Option<&Node> {
        match level {
            b"+" => self.rare.as_deref()?.plus.as_deref(),
            b"#" => self.rare.as_deref()?.hash.as_deref(),
            _ => self.children.get(level),
        }
    }

    /// The child for `level`, if any.
    fn child_mut(&mut self, level: &[u8]) -> Option<&mut Node> {
        match level {
            b"+" => self.plus_mut(),
            b"#" => self.hash_mut(),
            _ => self.children.get_mut(level),
        }
    }

    /// The child for `level`, created when missing.
    fn child_or_insert(&mut self, level: &[u8]) -> &mut Node {
        match level {
            b"+" => self.rare_mut().plus.get_or_insert_with(Default::default),
            b"#" => self.rare_mut().hash.get_or_insert_with(Default::default),
            _ => self.children.get_or_insert(level),
        }
    }

    /// Drop the child for `level` (it became empty).
    fn remove_child(&mut self, level: &[u8]) {
        match level {
            b"+" | b"#" => {
                if let Some(r) = self.rare.as_deref_mut() {
                    *(if level == b"+" {
                        &mut r.plus
                    } else {
                        &mut r.hash
                    }) = None;
                }
                self.tidy();
            }
            _ => {
                self.children.remove(level);
            }
        }
    }
}

/// A topic or filter's levels.
fn levels(s: &str) -> Levels<'_> {
    Levels {
        rest: Some(s.as_bytes()),
    }
}

/// The levels of a topic or filter, split at `/` as `split` would (an
/// empty string is one empty level). A loop the compiler inlines: `split`
/// with a `fn` pointer called it for every byte of every routed topic.
#[derive(Clone)]
struct Levels<'a> {
    /// What follows the last `/` seen; `None` once the last level is out.
    rest: Option<&'a [u8]>,
}

impl<'a> Iterator for Levels<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        match rest.iter().position(|&b| b == b'/') {
            Some(i) => {
                let (level, tail) = rest.split_at(i);
                self.rest = tail.get(1..);
                Some(level)
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

/// The subscription trie.
#[derive(Default, Debug)]
pub(super) struct Trie {
    root: Node,
}

impl Trie {
    /// Add or replace `entry.session`'s subscription to `filter` (in `group`
    /// when shared). Returns true when it did not exist before.
    pub(super) fn insert(&mut self, filter: &str, group: Option<&str>, entry: SubEntry) -> bool {
        let mut node = &mut self.root;
        for level in levels(filter) {
            node = node.child_or_insert(level);
        }
        let list = match group {
            None => {
                // Kept ordered by session: routing merges a session's
                // overlapping subscriptions by sorting its matches, and one
                // node's are then in order already.
                return node.subs.upsert(entry);
            }
            Some(g) => {
                let shared = &mut node.rare_mut().shared;
                let pos = match shared.iter().position(|s| &*s.name == g) {
                    Some(p) => p,
                    None => {
                        shared.push(SharedGroup {
                            name: g.into(),
                            key: format!("$share/{g}/{filter}").into(),
                            members: Vec::new(),
                            next: 0,
                        });
                        shared.len() - 1
                    }
                };
                &mut shared[pos].members
            }
        };
        match list.iter_mut().find(|e| e.session == entry.session) {
            Some(existing) => {
                *existing = entry;
                false
            }
            None => {
                list.push(entry);
                true
            }
        }
    }

    /// Remove a subscription; true if it existed. Empty nodes are pruned.
    pub(super) fn remove(&mut self, filter: &str, group: Option<&str>, session: SessionId) -> bool {
        let levels: Vec<&[u8]> = levels(filter).collect();
        remove_in(&mut self.root, &levels, group, session)
    }

    /// How many subscriptions `filter` has (the members of `group` when
    /// shared): a router announces a filter to its peers when this goes
    /// from 0 to 1, and withdraws it when it comes back to 0.
    pub(super) fn count(&self, filter: &str, group: Option<&str>) -> usize {
        let mut node = &self.root;
        for level in levels(filter) {
            match node.child(level) {
                Some(n) => node = n,
                None => return 0,
            }
        }
        match group {
            None => node.subs.len(),
            Some(g) => node
                .shared()
                .iter()
                .find(|s| &*s.name == g)
                .map_or(0, |s| s.members.len()),
        }
    }

    /// Every filter with its groups, as `(filter, group)`: what a router
    /// tells a peer that joins late.
    pub(super) fn filters(&self) -> Vec<(String, Option<Box<str>>)> {
        let mut out = Vec::new();
        let mut path = Vec::new();
        collect(&self.root, &mut path, &mut out);
        out
    }

    /// The shared group `group` of `filter`, if it exists.
    pub(super) fn group_mut(&mut self, filter: &str, group: &str) -> Option<&mut SharedGroup> {
        let mut node = &mut self.root;
        for level in levels(filter) {
            node = node.child_mut(level)?;
        }
        node.rare
            .as_deref_mut()?
            .shared
            .iter_mut()
            .find(|g| &*g.name == group)
    }

    /// Call `f` for every subscription matching `topic`. Wildcards at the
    /// first level do not match topics starting with `$`.
    pub(super) fn for_each_match(&mut self, topic: &str, mut f: impl FnMut(Hit<'_>)) {
        let dollar = topic.starts_with('$');
        walk(&mut self.root, levels(topic), dollar, &mut f);
    }
}

/// The filters at and below `node`, whose levels so far are `path`.
fn collect(node: &Node, path: &mut Vec<Vec<u8>>, out: &mut Vec<(String, Option<Box<str>>)>) {
    let filter = || String::from_utf8_lossy(&path.join(&b'/')).into_owned();
    if !node.subs.is_empty() {
        out.push((filter(), None));
    }
    for g in node.shared() {
        out.push((filter(), Some(g.name.clone())));
    }
    let named = node.children.iter().map(|(k, v)| (k.to_vec(), v));
    let wild = [
        (b"+".to_vec(), node.child(b"+")),
        (b"#".to_vec(), node.child(b"#")),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, v)));
    for (level, child) in named.chain(wild) {
        path.push(level);
        collect(child, path, out);
        path.pop();
    }
}

fn emit(node: &mut Node, f: &mut impl FnMut(Hit<'_>)) {
    for e in node.subs.as_slice() {
        f(Hit::Direct(e));
    }
    if let Some(r) = node.rare.as_deref_mut() {
        for g in &mut r.shared {
            f(Hit::Shared(g));
        }
    }
}

/// Walk without allocating: `levels` is the topic's levels, cloned
/// (cheaply) at each branch. A topic name never contains `+` or `#` (the
/// codec refuses them), so a level is looked up among the literal children
/// only. Nodes without `+`, `#` or groups (most: a device's own topic) are
/// descended in a loop; only the others branch.
fn walk<'t>(
    mut node: &mut Node,
    mut levels: impl Iterator<Item = &'t [u8]> + Clone,
    dollar: bool,
    f: &mut impl FnMut(Hit<'_>),
) {
    if node.rare.is_some() {
        return branch(node, levels, dollar, f);
    }
    loop {
        let Some(level) = levels.next() else {
            return emit(node, f);
        };
        let Some(child) = node.children.get_mut(level) else {
            return;
        };
        node = child;
        if node.rare.is_some() {
            return branch(node, levels, false, f);
        }
    }
}

/// [`walk`] at a node with `+`, `#` or groups.
fn branch<'t>(
    node: &mut Node,
    mut levels: impl Iterator<Item = &'t [u8]> + Clone,
    dollar: bool,
    f: &mut impl FnMut(Hit<'_>),
) {
    if !dollar {
        // `a/#` matches `a` itself as well as everything below it.
        if let Some(hash) = node.hash_mut() {
            emit(hash, f);
        }
    }
    match levels.next() {
        None => emit(node, f),
        Some(level) => {
            if let Some(child) = node.children.get_mut(level) {
                walk(child, levels.clone(), false, f);
            }
            if !dollar {
                if let Some(plus) = node.plus_mut() {
                    walk(plus, levels, false, f);
                }
            }
        }
    }
}

fn remove_in(node: &mut Node, levels: &[&[u8]], group: Option<&str>, session: SessionId) -> bool {
    match levels.split_first() {
        None => match group {
            None => node.subs.remove(session),
            Some(g) => {
                let Some(rare) = node.rare.as_deref_mut() else {
                    return false;
                };
                let Some(pos) = rare.shared.iter().position(|s| &*s.name == g) else {
                    return false;
                };
                let members = &mut rare.shared[pos].members;
                let before = members.len();
                members.retain(|e| e.session != session);
                let removed = before != members.len();
                if members.is_empty() {
                    rare.shared.remove(pos);
                }
                node.tidy();
                removed
            }
        },
        Some((level, rest)) => {
            let Some(child) = node.child_mut(level) else {
                return false;
            };
            let removed = remove_in(child, rest, group, session);
            if child.is_empty() {
                node.remove_child(level);
            }
            removed
        }
    }
}

/// A plain subscription of `session` (default options, no identifier).
#[cfg(test)]
impl SubEntry {
    pub(super) fn plain(session: u64) -> SubEntry {
        SubEntry {
            session: SessionId(session),
            options: SubscriptionOptions::default(),
            id: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matched(t: &mut Trie, topic: &str) -> Vec<u64> {
        let mut out = Vec::new();
        t.for_each_match(topic, |h| match h {
            Hit::Direct(e) => out.push(e.session.0),
            Hit::Shared(g) => out.push(1000 + g.pick(|_| true).map_or(0, |e| e.session.0)),
        });
        out.sort_unstable();
        out
    }

    #[test]
    fn wildcards() {
        let mut t = Trie::default();
        t.insert("a/b", None, SubEntry::plain(1));
        t.insert("a/+", None, SubEntry::plain(2));
        t.insert("a/#", None, SubEntry::plain(3));
        t.insert("#", None, SubEntry::plain(4));
        t.insert("+/+/c", None, SubEntry::plain(5));
        assert_eq!(matched(&mut t, "a/b"), vec![1, 2, 3, 4]);
        assert_eq!(matched(&mut t, "a"), vec![3, 4]);
        assert_eq!(matched(&mut t, "a/x/c"), vec![3, 4, 5]);
        assert_eq!(matched(&mut t, "b"), vec![4]);
    }

    #[test]
    fn dollar_topics_skip_first_level_wildcards() {
        let mut t = Trie::default();
        t.insert("#", None, SubEntry::plain(1));
        t.insert("+/x", None, SubEntry::plain(2));
        t.insert("$SYS/#", None, SubEntry::plain(3));
        assert_eq!(matched(&mut t, "$SYS/x"), vec![3]);
        assert_eq!(matched(&mut t, "s/x"), vec![1, 2]);
    }

    #[test]
    fn remove_prunes() {
        let mut t = Trie::default();
        assert!(t.insert("a/b/c", None, SubEntry::plain(1)));
        assert!(!t.insert("a/b/c", None, SubEntry::plain(1)));
        assert!(t.remove("a/b/c", None, SessionId(1)));
        assert!(!t.remove("a/b/c", None, SessionId(1)));
        assert!(t.root.is_empty());
        // Wildcards and shared groups too, down to the rare parts.
        t.insert("a/+/#", None, SubEntry::plain(1));
        t.insert("a/+", Some("g"), SubEntry::plain(2));
        t.insert("#", Some("g"), SubEntry::plain(3));
        assert_eq!(matched(&mut t, "a/b"), vec![1, 1002, 1003]);
        assert!(t.remove("a/+/#", None, SessionId(1)));
        assert!(t.remove("a/+", Some("g"), SessionId(2)));
        assert!(!t.remove("a/+", Some("g"), SessionId(2)));
        assert!(t.remove("#", Some("g"), SessionId(3)));
        assert!(t.root.is_empty() && t.root.rare.is_none());
    }

    #[test]
    fn levels_split_as_split_does() {
        for s in [
            "",
            "/",
            "a",
            "a/b",
            "/a",
            "a/",
            "a//b",
            "//",
            "$SYS/x/+/#",
            "ab/c/de",
        ] {
            let ours: Vec<&[u8]> = levels(s).collect();
            let std: Vec<&[u8]> = s.as_bytes().split(|b| *b == b'/').collect();
            assert_eq!(ours, std, "{s:?}");
        }
    }

    #[test]
    fn literal_paths_meet_wildcards_below_and_above() {
        // The loop over plain nodes hands over to the branching walk
        // wherever a node has `+`, `#` or a group, at any depth.
        let mut t = Trie::default();
        t.insert("a/b/c/d", None, SubEntry::plain(1));
        t.insert("a/b/+/d", None, SubEntry::plain(2));
        t.insert("a/b/c/#", None, SubEntry::plain(3));
        t.insert("a/b/c/d", Some("g"), SubEntry::plain(4));
        t.insert("x/y", None, SubEntry::plain(5));
        assert_eq!(matched(&mut t, "a/b/c/d"), vec![1, 2, 3, 1004]);
        assert_eq!(matched(&mut t, "a/b/c"), vec![3]);
        assert_eq!(matched(&mut t, "a/b/z/d"), vec![2]);
        assert_eq!(matched(&mut t, "a/b"), Vec::<u64>::new());
        assert_eq!(matched(&mut t, "x/y"), vec![5]);
        assert_eq!(matched(&mut t, "x/y/z"), Vec::<u64>::new());
        assert_eq!(matched(&mut t, "x"), Vec::<u64>::new());
        assert_eq!(matched(&mut t, "x//y"), Vec::<u64>::new());
        t.insert("x//y", None, SubEntry::plain(6));
        assert_eq!(matched(&mut t, "x//y"), vec![6]);
        assert_eq!(matched(&mut t, "/"), Vec::<u64>::new());
    }

    #[test]
    fn a_node_is_64_bytes() {
        // Two per device filter (`devices/{id}/cmd`): 96 with `+`, `#`
        // and the shared groups inline.
        assert_eq!(std::mem::size_of::<Node>(), 64);
    }

    #[test]
    fn counts_and_filters() {
        let mut t = Trie::default();
        t.insert("a/+", None, SubEntry::plain(1));
        t.insert("a/+", None, SubEntry::plain(2));
        t.insert("a/+", Some("g"), SubEntry::plain(3));
        t.insert("#", None, SubEntry::plain(4));
        assert_eq!(t.count("a/+", None), 2);
        assert_eq!(t.count("a/+", Some("g")), 1);
        assert_eq!(t.count("a/b", None), 0);
        assert_eq!(t.count("a", None), 0);
        let mut all = t.filters();
        all.sort();
        assert_eq!(
            all,
            vec![
                ("#".to_string(), None),
                ("a/+".to_string(), None),
                ("a/+".to_string(), Some("g".into())),
            ]
        );
    }

    #[test]
    fn shared_round_robin_prefers_online() {
        let mut t = Trie::default();
        t.insert("s", Some("g"), SubEntry::plain(1));
        t.insert("s", Some("g"), SubEntry::plain(2));
        t.insert("s", Some("g"), SubEntry::plain(3));
        let mut got = Vec::new();
        for _ in 0..6 {
            t.for_each_match("s", |h| {
                if let Hit::Shared(g) = h {
                    got.push(g.pick(|s| s.0 != 2).map(|e| e.session.0));
                }
            });
        }
        assert_eq!(got, [1, 3, 1, 3, 1, 3].map(Some).to_vec());
    }
}

//! The subscription trie, shared groups kept at the node of their filter.
//! `+` and `#` children have slots of their own, so routing a level costs
//! one hash lookup, not three; levels are handled as bytes (`/` is ASCII),
//! which spares a UTF-8 char search per level.
//!
//! Literal chains are compressed: a node with no subscribers, no `+`, `#`
//! or group and one literal child is not kept; its parent's edge carries
//! the levels down to the next kept node (`devices` to `{id}/cmd`: one node
//! per device filter, not two). An edge is found by hashing its first
//! level; its other levels are compared with the topic's next ones as
//! bytes. `insert` splits an edge where a filter leaves it and `remove`
//! joins one back, so the shape depends only on the filters held.

use super::children::{Children, Edge};
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
    /// Children by the first level of their edge (never `+` or `#`).
    /// Boxed with their edge's key: a table's buckets hold its spare
    /// slots too (a one-child table has four, a big one up to twice its
    /// entries), and an inline 96-byte node made those cost 112 bytes
    /// each (a million device filters: ~750 bytes per subscription in the
    /// trie, ~330 boxed). A single child is kept without a table, a table
    /// boxed (see `children.rs`).
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

    /// Whether the node only leads to its one literal child: such a node
    /// is not kept, its parent's edge goes on to the child.
    fn is_relay(&self) -> bool {
        self.subs.is_empty() && self.rare.is_none() && matches!(self.children, Children::One(_))
    }

    /// The child that `level` leads to, past the rest of its edge, which
    /// is taken from `levels`; `None` when they leave the edge.
    fn step(&self, level: &[u8], levels: &mut Levels<'_>) -> Option<&Node> {
        match level {
            b"+" => self.rare.as_deref()?.plus.as_deref(),
            b"#" => self.rare.as_deref()?.hash.as_deref(),
            _ => {
                let e = self.children.get(level)?;
                levels.skip_tail(e.tail(level)).then_some(e.node())
            }
        }
    }

    /// [`Node::step`], mutably.
    fn step_mut(&mut self, level: &[u8], levels: &mut Levels<'_>) -> Option<&mut Node> {
        match level {
            b"+" => self.plus_mut(),
            b"#" => self.hash_mut(),
            _ => self.literal_mut(level, levels),
        }
    }

    /// [`Node::step_mut`] for a topic's level, which is never a wildcard.
    #[inline]
    fn literal_mut(&mut self, level: &[u8], levels: &mut Levels<'_>) -> Option<&mut Node> {
        let e = self.children.get_mut(level)?;
        levels.skip_tail(e.tail(level)).then_some(e.node_mut())
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

impl<'a> Levels<'a> {
    /// Take the levels of `tail` (levels joined by `/`, as an edge's key
    /// has them; `None` is none) if they come next; false, and nothing
    /// taken, if not all of them do. Bytes are compared at once: levels
    /// are equal exactly where their `/`-joined bytes are.
    #[inline]
    fn skip_tail(&mut self, tail: Option<&[u8]>) -> bool {
        let Some(tail) = tail else {
            return true;
        };
        let Some(rest) = self.rest else {
            return false;
        };
        match rest.strip_prefix(tail) {
            Some([]) => self.rest = None,
            Some([b'/', more @ ..]) => self.rest = Some(more),
            _ => return false,
        }
        true
    }

    /// The literal levels from here on, up to a `+` or `#` level or the
    /// end, joined by `/`: the key of an edge made for them.
    fn literal_run(self) -> &'a [u8] {
        let Some(start) = self.rest else {
            return &[];
        };
        let mut len = None;
        for l in self {
            if l == b"+" || l == b"#" {
                break;
            }
            len = Some(len.map_or(l.len(), |n| n + 1 + l.len()));
        }
        &start[..len.unwrap_or(0)]
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
        let mut levels = levels(filter);
        loop {
            let from = levels.clone();
            let Some(level) = levels.next() else {
                break;
            };
            node = match level {
                b"+" => node.rare_mut().plus.get_or_insert_with(Default::default),
                b"#" => node.rare_mut().hash.get_or_insert_with(Default::default),
                _ => enter(node, level, from, &mut levels),
            };
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

    /// Remove a subscription; true if it existed. Empty nodes are pruned
    /// and edges joined back (see `remove_in`).
    pub(super) fn remove(&mut self, filter: &str, group: Option<&str>, session: SessionId) -> bool {
        remove_in(&mut self.root, levels(filter), group, session)
    }

    /// How many subscriptions `filter` has (the members of `group` when
    /// shared): a router announces a filter to its peers when this goes
    /// from 0 to 1, and withdraws it when it comes back to 0.
    pub(super) fn count(&self, filter: &str, group: Option<&str>) -> usize {
        let mut node = &self.root;
        let mut levels = levels(filter);
        while let Some(level) = levels.next() {
            match node.step(level, &mut levels) {
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
        let mut levels = levels(filter);
        while let Some(level) = levels.next() {
            node = node.step_mut(level, &mut levels)?;
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

/// The child of `node` that `level`, then the filter's `levels`, lead to,
/// for `insert`: its edge is made when missing (with as many of the
/// filter's literal levels as follow, `from` being the filter from `level`
/// on) and split where the filter leaves it, at a node made there.
fn enter<'n>(
    node: &'n mut Node,
    level: &[u8],
    from: Levels<'_>,
    levels: &mut Levels<'_>,
) -> &'n mut Node {
    let edge = node.children.get_or_insert_with(level, || {
        Edge::new(from.clone().literal_run(), Node::default())
    });
    // The bytes of the key that the filter follows, up to a level where
    // it differs or ends.
    let mut kept = level.len();
    let mut tail = Levels {
        rest: edge.tail(level),
    };
    let split = loop {
        let Some(k) = tail.next() else {
            break false;
        };
        let mut probe = levels.clone();
        if probe.next() != Some(k) {
            break true;
        }
        *levels = probe;
        kept += 1 + k.len();
    };
    if split {
        // The first level stays: so does the edge's place in the table.
        let mut below = Edge::new(&edge.key()[kept + 1..], Node::default());
        let upper = Edge::new(&edge.key()[..kept], Node::default());
        *below.node_mut() = std::mem::replace(edge, upper).into_node();
        edge.node_mut().children = Children::One(below);
    }
    edge.node_mut()
}

/// Join `edge`'s node into the edge if it became a relay (see
/// `Node::is_relay`): the edge then leads on to the node's child. Checked
/// here, before the node's children are taken: a node with subscribers or
/// more children is left as it is.
fn join(edge: &mut Edge<Node>) {
    if !edge.node().is_relay() {
        return;
    }
    let Children::One(below) = std::mem::take(&mut edge.node_mut().children) else {
        return;
    };
    let mut key = Vec::with_capacity(edge.key().len() + 1 + below.key().len());
    key.extend_from_slice(edge.key());
    key.push(b'/');
    key.extend_from_slice(below.key());
    // The relay node, emptied, goes with the edge replaced.
    *edge = Edge::new(&key, below.into_node());
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
    let named = node.children.iter().map(|e| (e.key().to_vec(), e.node()));
    let rare = node.rare.as_deref();
    let wild = [
        (b"+".to_vec(), rare.and_then(|r| r.plus.as_deref())),
        (b"#".to_vec(), rare.and_then(|r| r.hash.as_deref())),
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
/// descended in a loop, an edge at a time; only the others branch.
fn walk(mut node: &mut Node, mut levels: Levels<'_>, dollar: bool, f: &mut impl FnMut(Hit<'_>)) {
    if node.rare.is_some() {
        return branch(node, levels, dollar, f);
    }
    loop {
        let Some(level) = levels.next() else {
            return emit(node, f);
        };
        let Some(child) = node.literal_mut(level, &mut levels) else {
            return;
        };
        node = child;
        if node.rare.is_some() {
            return branch(node, levels, false, f);
        }
    }
}

/// [`walk`] at a node with `+`, `#` or groups.
fn branch(node: &mut Node, mut levels: Levels<'_>, dollar: bool, f: &mut impl FnMut(Hit<'_>)) {
    if !dollar {
        // `a/#` matches `a` itself as well as everything below it.
        if let Some(hash) = node.hash_mut() {
            emit(hash, f);
        }
    }
    match levels.next() {
        None => emit(node, f),
        Some(level) => {
            // `+` takes this one level, the literal edge maybe more.
            let after = levels.clone();
            if let Some(child) = node.literal_mut(level, &mut levels) {
                walk(child, levels, false, f);
            }
            if !dollar {
                if let Some(plus) = node.plus_mut() {
                    walk(plus, after, false, f);
                }
            }
        }
    }
}

/// Remove from `node` down the filter's `levels`. Below, an emptied node
/// is pruned and one left a relay is joined into its edge, as `insert`
/// would have left it had it never held what was removed.
fn remove_in(
    node: &mut Node,
    mut levels: Levels<'_>,
    group: Option<&str>,
    session: SessionId,
) -> bool {
    let Some(level) = levels.next() else {
        return remove_here(node, group, session);
    };
    match level {
        b"+" | b"#" => {
            let Some(rare) = node.rare.as_deref_mut() else {
                return false;
            };
            let slot = if level == b"+" {
                &mut rare.plus
            } else {
                &mut rare.hash
            };
            let Some(child) = slot.as_deref_mut() else {
                return false;
            };
            let removed = remove_in(child, levels, group, session);
            // A wildcard's node is kept even as a relay: wildcards are
            // never inside an edge.
            if child.is_empty() {
                *slot = None;
                node.tidy();
            }
            removed
        }
        _ => {
            let Some(edge) = node.children.get_mut(level) else {
                return false;
            };
            if !levels.skip_tail(edge.tail(level)) {
                return false;
            }
            let removed = remove_in(edge.node_mut(), levels, group, session);
            if edge.node().is_empty() {
                node.children.remove(level);
            } else {
                join(edge);
            }
            removed
        }
    }
}

/// Remove the subscription at its filter's node.
fn remove_here(node: &mut Node, group: Option<&str>, session: SessionId) -> bool {
    match group {
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

/// What tests look at: the trie's shape, independent of history.
#[cfg(test)]
impl Node {
    /// Nodes at and below this one.
    fn nodes(&self) -> usize {
        let rare = self.rare.as_deref();
        let wild = rare.into_iter().flat_map(|r| [&r.plus, &r.hash]);
        1 + self
            .children
            .iter()
            .map(|e| e.node().nodes())
            .sum::<usize>()
            + wild.flatten().map(|n| n.nodes()).sum::<usize>()
    }

    /// A rendering that depends only on what the node holds: children,
    /// groups and members sorted. Panics where a node below should not be
    /// there (a relay or empty node behind an edge, an empty rare part).
    fn shape(&self) -> String {
        let mut kids: Vec<String> = self
            .children
            .iter()
            .map(|e| {
                assert!(
                    !e.node().is_relay() && !e.node().is_empty(),
                    "{:?}",
                    e.key()
                );
                let key = String::from_utf8_lossy(e.key());
                format!("{key:?} => {}", e.node().shape())
            })
            .collect();
        kids.sort();
        assert!(!self.rare.as_deref().is_some_and(Rare::is_empty));
        let subs: Vec<u64> = self.subs.as_slice().iter().map(|e| e.session.0).collect();
        let mut shared: Vec<String> = self
            .shared()
            .iter()
            .map(|g| {
                let mut m: Vec<u64> = g.members.iter().map(|e| e.session.0).collect();
                m.sort_unstable();
                format!("{} {} {m:?}", g.name, g.key)
            })
            .collect();
        shared.sort();
        let rare = self.rare.as_deref();
        let wild = |n: Option<&Node>| {
            n.map(|n| {
                assert!(!n.is_empty());
                n.shape()
            })
        };
        let plus = wild(rare.and_then(|r| r.plus.as_deref()));
        let hash = wild(rare.and_then(|r| r.hash.as_deref()));
        format!(
            "{{subs {subs:?} shared {shared:?} + {plus:?} # {hash:?} [{}]}}",
            kids.join(", ")
        )
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
    fn a_node_is_40_bytes() {
        // One per device filter (`devices/{id}/cmd`): 96 with `+`, `#`
        // and the shared groups inline, 64 with a table inline, 48 with
        // a vector of subscribers inline. 56 with its edge's key.
        assert_eq!(std::mem::size_of::<Node>(), 40);
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

    /// The literal edges below `node` (past wildcards too), by their
    /// keys, sorted.
    fn edges(node: &Node) -> Vec<String> {
        let mut out = Vec::new();
        for e in node.children.iter() {
            out.push(String::from_utf8_lossy(e.key()).into_owned());
            out.extend(edges(e.node()));
        }
        if let Some(r) = node.rare.as_deref() {
            for n in [&r.plus, &r.hash].into_iter().flatten() {
                out.extend(edges(n));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_device_filter_costs_one_node() {
        // `p/{i}/cmd`: `{i}` has no node of its own, its edge from `p`
        // goes on to the leaf `cmd`.
        const N: u64 = 1000;
        let mut t = Trie::default();
        for i in 0..N {
            assert!(t.insert(&format!("p/{i}/cmd"), None, SubEntry::plain(i)));
        }
        // The root, `p` and a leaf per filter.
        assert_eq!(t.root.nodes(), 2 + N as usize);
        assert_eq!(matched(&mut t, "p/42/cmd"), vec![42]);
        assert_eq!(matched(&mut t, "p/42"), Vec::<u64>::new());
        assert_eq!(matched(&mut t, "p/42/cmd/x"), Vec::<u64>::new());
        assert_eq!(matched(&mut t, "p/42/cm"), Vec::<u64>::new());
        assert_eq!(t.count("p/7/cmd", None), 1);
        // Deeper, as a fleet's topics are: still one node per filter.
        let mut t = Trie::default();
        for i in 0..N {
            t.insert(&format!("zfb/run/conn/{i}/cmd"), None, SubEntry::plain(i));
        }
        assert_eq!(t.root.nodes(), 2 + N as usize);
        for i in 0..N {
            assert!(t.remove(&format!("zfb/run/conn/{i}/cmd"), None, SessionId(i)));
        }
        assert!(t.root.is_empty());
    }

    #[test]
    fn edges_split_and_join_back() {
        let mut t = Trie::default();
        t.insert("a/b/c", None, SubEntry::plain(1));
        assert_eq!(edges(&t.root), ["a/b/c"]);
        // Ends inside the edge.
        t.insert("a/b", None, SubEntry::plain(2));
        assert_eq!(edges(&t.root), ["a/b", "c"]);
        // Leaves it.
        t.insert("a/x/y", None, SubEntry::plain(3));
        assert_eq!(edges(&t.root), ["a", "b", "c", "x/y"]);
        // A wildcard keeps its node.
        t.insert("a/x/+/z", Some("g"), SubEntry::plain(4));
        assert_eq!(edges(&t.root), ["a", "b", "c", "x", "y", "z"]);
        assert_eq!(matched(&mut t, "a/x/q/z"), vec![1004]);
        assert_eq!(t.filters().len(), 4);
        t.remove("a/x/+/z", Some("g"), SessionId(4));
        assert_eq!(edges(&t.root), ["a", "b", "c", "x/y"]);
        t.remove("a/b", None, SessionId(2));
        assert_eq!(edges(&t.root), ["a", "b/c", "x/y"]);
        t.remove("a/x/y", None, SessionId(3));
        assert_eq!(edges(&t.root), ["a/b/c"]);
        assert_eq!(matched(&mut t, "a/b/c"), vec![1]);
        // Not there: inside an edge, past it, beside it.
        assert!(!t.remove("a/b", None, SessionId(1)));
        assert!(!t.remove("a/b/c/d", None, SessionId(1)));
        assert!(!t.remove("a/b/d", None, SessionId(1)));
        assert!(!t.remove("a/+/c", None, SessionId(1)));
        assert_eq!(t.count("a/b", None) + t.count("a/+/c", None), 0);
        assert!(t.group_mut("a/b", "g").is_none());
        t.remove("a/b/c", None, SessionId(1));
        assert!(t.root.is_empty());
    }

    #[test]
    fn empty_levels_in_edges() {
        let filters = ["a//b", "a/", "", "/", "//", "a/b/", "/a"];
        let mut t = Trie::default();
        for (i, f) in filters.iter().enumerate() {
            t.insert(f, None, SubEntry::plain(i as u64));
        }
        for (i, f) in filters.iter().enumerate() {
            assert_eq!(matched(&mut t, f), vec![i as u64], "{f:?}");
            assert_eq!(t.count(f, None), 1, "{f:?}");
        }
        for topic in ["a", "a/b", "a//", "///", "a//b/", "b", "/b"] {
            assert_eq!(matched(&mut t, topic), Vec::<u64>::new(), "{topic:?}");
        }
        let mut all: Vec<String> = t.filters().into_iter().map(|(f, _)| f).collect();
        all.sort();
        assert_eq!(all, ["", "/", "//", "/a", "a/", "a//b", "a/b/"]);
    }

    #[test]
    fn the_shape_depends_only_on_the_filters() {
        let filters = ["a/b/c/d", "a/b", "a/b/x", "a/+/c", "a/b/c/#", "q//r", "q/"];
        let render = |order: &[usize], drop: &[usize]| {
            let mut t = Trie::default();
            for &i in order {
                t.insert(filters[i], None, SubEntry::plain(1));
            }
            for &i in drop {
                assert!(t.remove(filters[i], None, SessionId(1)));
            }
            t.root.shape()
        };
        let all: Vec<usize> = (0..filters.len()).collect();
        let reversed: Vec<usize> = all.iter().rev().copied().collect();
        let odd = [1, 3, 5, 0, 2, 4, 6];
        assert_eq!(render(&all, &[]), render(&reversed, &[]));
        assert_eq!(render(&all, &[]), render(&odd, &[]));
        // Removing gives the shape of never having inserted.
        for drop in [&[1][..], &[0, 2], &[2, 1, 4], &[6, 5, 3]] {
            let kept: Vec<usize> = all.iter().copied().filter(|i| !drop.contains(i)).collect();
            assert_eq!(render(&all, drop), render(&kept, &[]), "{drop:?}");
            assert_eq!(render(&reversed, drop), render(&kept, &[]), "{drop:?}");
        }
        let mut t = Trie::default();
        for &i in &odd {
            t.insert(filters[i], None, SubEntry::plain(1));
        }
        for &i in &reversed {
            t.remove(filters[i], None, SessionId(1));
        }
        assert!(t.root.is_empty());
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

/// The trie against a list of subscriptions, matched as MQTT says.
#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(String, Option<&'static str>, u64),
        /// Mostly not there.
        Remove(String, Option<&'static str>, u64),
        /// The model's entry at this index (modulo its length).
        RemoveHeld(usize),
    }

    fn pick(of: &[&'static str]) -> impl Strategy<Value = &'static str> {
        proptest::sample::select(of.to_vec())
    }

    /// 1 to 4 levels; `#` only last.
    fn filter() -> impl Strategy<Value = String> {
        let level = pick(&["", "a", "b", "ab", "+"]);
        let last = pick(&["", "a", "b", "ab", "+", "#"]);
        (proptest::collection::vec(level, 0..4), last).prop_map(|(mut ls, last)| {
            ls.push(last);
            ls.join("/")
        })
    }

    /// 1 to 5 levels, `$a` maybe first.
    fn topic() -> impl Strategy<Value = String> {
        let first = pick(&["", "a", "b", "ab", "$a"]);
        let level = pick(&["", "a", "b", "ab"]);
        (first, proptest::collection::vec(level, 0..5)).prop_map(|(first, mut ls)| {
            ls.insert(0, first);
            ls.join("/")
        })
    }

    fn op() -> impl Strategy<Value = Op> {
        let group = || proptest::option::of(pick(&["g", "h"]));
        prop_oneof![
            3 => (filter(), group(), 0u64..3).prop_map(|(f, g, s)| Op::Insert(f, g, s)),
            1 => (filter(), group(), 0u64..3).prop_map(|(f, g, s)| Op::Remove(f, g, s)),
            2 => any::<usize>().prop_map(Op::RemoveHeld),
        ]
    }

    type Model = Vec<(String, Option<&'static str>, u64)>;

    fn matches(filter: &str, topic: &str) -> bool {
        let f: Vec<&str> = filter.split('/').collect();
        let t: Vec<&str> = topic.split('/').collect();
        if topic.starts_with('$') && matches!(f[0], "+" | "#") {
            return false;
        }
        for (i, level) in f.iter().enumerate() {
            if *level == "#" {
                // The parent level too: `a/#` matches `a`.
                return t.len() >= i;
            }
            match t.get(i) {
                Some(l) if *level == "+" || level == l => {}
                _ => return false,
            }
        }
        t.len() == f.len()
    }

    /// Direct sessions, and each shared group's key with its members.
    type Hits = (Vec<u64>, Vec<(String, Vec<u64>)>);

    fn hits(t: &mut Trie, topic: &str) -> Hits {
        let (mut direct, mut shared) = (Vec::new(), Vec::new());
        t.for_each_match(topic, |h| match h {
            Hit::Direct(e) => direct.push(e.session.0),
            Hit::Shared(g) => {
                let mut m: Vec<u64> = g.members.iter().map(|e| e.session.0).collect();
                m.sort_unstable();
                shared.push((g.key.to_string(), m));
            }
        });
        direct.sort_unstable();
        shared.sort();
        (direct, shared)
    }

    fn expected(model: &Model, topic: &str) -> Hits {
        let mut direct = Vec::new();
        let mut shared: Vec<(String, Vec<u64>)> = Vec::new();
        for (f, g, s) in model.iter().filter(|(f, ..)| matches(f, topic)) {
            match g {
                None => direct.push(*s),
                Some(g) => {
                    let key = format!("$share/{g}/{f}");
                    match shared.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, m)) => m.push(*s),
                        None => shared.push((key, vec![*s])),
                    }
                }
            }
        }
        direct.sort_unstable();
        shared.iter_mut().for_each(|(_, m)| m.sort_unstable());
        shared.sort();
        (direct, shared)
    }

    fn check(t: &mut Trie, model: &Model, topics: &[String]) -> Result<(), TestCaseError> {
        for topic in topics {
            prop_assert_eq!(hits(t, topic), expected(model, topic), "{:?}", topic);
        }
        let mut held: Vec<(String, Option<Box<str>>)> = model
            .iter()
            .map(|(f, g, _)| (f.clone(), g.map(Into::into)))
            .collect();
        held.sort();
        held.dedup();
        for (f, g) in &held {
            let n = model
                .iter()
                .filter(|e| e.0 == *f && e.1 == g.as_deref())
                .count();
            prop_assert_eq!(t.count(f, g.as_deref()), n);
        }
        let mut filters = t.filters();
        filters.sort();
        prop_assert_eq!(filters, held);
        prop_assert_eq!(t.root.is_empty(), model.is_empty());
        // The same shape as a trie that only ever held these.
        let mut fresh = Trie::default();
        for (f, g, s) in model {
            fresh.insert(f, *g, SubEntry::plain(*s));
        }
        prop_assert_eq!(t.root.shape(), fresh.root.shape());
        Ok(())
    }

    proptest! {
        #[test]
        fn the_trie_matches_as_a_list_does(
            ops in proptest::collection::vec(op(), 1..40),
            topics in proptest::collection::vec(topic(), 8),
        ) {
            let mut t = Trie::default();
            let mut model: Model = Vec::new();
            for op in ops {
                let (f, g, s, insert) = match op {
                    Op::Insert(f, g, s) => (f, g, s, true),
                    Op::Remove(f, g, s) => (f, g, s, false),
                    Op::RemoveHeld(_) if model.is_empty() => continue,
                    Op::RemoveHeld(i) => {
                        let (f, g, s) = model[i % model.len()].clone();
                        (f, g, s, false)
                    }
                };
                let at = model.iter().position(|e| e.0 == f && e.1 == g && e.2 == s);
                if insert {
                    prop_assert_eq!(t.insert(&f, g, SubEntry::plain(s)), at.is_none());
                    if at.is_none() {
                        model.push((f.clone(), g, s));
                    }
                } else {
                    prop_assert_eq!(t.remove(&f, g, SessionId(s)), at.is_some());
                    if let Some(i) = at {
                        model.remove(i);
                    }
                }
                prop_assert_eq!(t.count(&f, g), model.iter().filter(|e| e.0 == f && e.1 == g).count());
                check(&mut t, &model, &topics)?;
            }
            for (f, g, s) in model.drain(..) {
                prop_assert!(t.remove(&f, g, SessionId(s)));
            }
            prop_assert!(t.root.is_empty());
        }
    }
}

//! Routing: which local sessions, and which peers, a message goes to.
//!
//! Two tries. `subs` holds this core's own subscriptions, by session.
//! `shards` holds, for each filter, which other cores (and this one, for
//! shared groups) have subscribers on it, by [`PeerId`]: the read-mostly route
//! index that says where a publish must cross to. It changes only when a
//! filter gets its first subscriber or loses its last one on some core,
//! which each core announces to the others ([`PeerEvent::Interest`]).
//!
//! Without peers (`--threads 1`), `shards` stays empty and routing is the
//! single trie walk it always was.
//!
//! [`PeerEvent::Interest`]: super::peer::PeerEvent::Interest

use super::ids::SessionId;
use super::peer::PeerId;
use super::trie::{Hit, SubEntry, Trie};
use std::num::NonZeroU32;
use std::sync::Arc;
use zerofan_codec::{QoS, SubscriptionOptions};

/// Which subscriptions a message is routed to.
#[derive(Clone, Copy)]
pub(crate) enum Scope<'a> {
    /// Published here: local subscribers, and peers with subscribers.
    Everywhere,
    /// Forwarded by a peer: local subscribers only; ordinary ones when
    /// `direct`, and one member of each group in `shares`.
    Forwarded {
        direct: bool,
        shares: &'a [Arc<str>],
    },
}

/// A local session a message goes to, its overlapping subscriptions merged.
pub(crate) struct LocalHit {
    pub(crate) session: SessionId,
    pub(crate) qos: QoS,
    pub(crate) retain: bool,
    pub(crate) sub_ids: Vec<u32>,
    /// The shared group it was picked in, if any.
    pub(crate) share: Option<Arc<str>>,
}

/// A peer a message crosses to.
pub(crate) struct Forward {
    pub(crate) peer: PeerId,
    pub(crate) direct: bool,
    pub(crate) shares: Vec<Arc<str>>,
}

/// Where one message goes: iterated, the local sessions, a session's
/// overlapping subscriptions merged on the way (collecting the merged hits
/// first cost a second buffer and pass, ~85 instructions per delivery);
/// then `forwards`. Hand it back with [`Router::recycle`] so that its
/// buffers are reused.
pub(crate) struct Routed {
    /// Direct matches, ordered by session; `next` is the first not yet
    /// yielded.
    direct: Vec<SubEntry>,
    next: usize,
    /// Some session is in `direct` more than once: hits are merged.
    overlap: bool,
    /// The picked member of each shared group, last first.
    shared: Vec<(SubEntry, Arc<str>)>,
    qos: QoS,
    retain: bool,
    pub(crate) forwards: Vec<Forward>,
}

impl Iterator for Routed {
    type Item = LocalHit;

    // Inlined into `Broker::deliver` whatever else calls it: once per
    // matching session of every message (about 80 instructions per
    // message of fan-out to 1 when it was not).
    #[inline(always)]
    fn next(&mut self) -> Option<LocalHit> {
        // Built from locals once at the end (a hit filled in place was
        // copied out whole), and merging only when some session matched
        // more than once (rare): otherwise each match is a hit of its own.
        if let Some(first) = self.direct.get(self.next) {
            self.next += 1;
            let session = first.session;
            let mut qos = first.options.qos.min(self.qos);
            let mut retain = first.options.retain_as_published && self.retain;
            let mut sub_ids = match first.id {
                Some(id) => vec![id.get()],
                None => Vec::new(),
            };
            if self.overlap {
                for e in self.direct.get(self.next..).unwrap_or_default() {
                    if e.session != session {
                        break;
                    }
                    qos = qos.max(e.options.qos.min(self.qos));
                    retain |= e.options.retain_as_published && self.retain;
                    sub_ids.extend(e.id.map(NonZeroU32::get));
                    self.next += 1;
                }
            }
            return Some(LocalHit {
                session,
                qos,
                retain,
                sub_ids,
                share: None,
            });
        }
        let (e, key) = self.shared.pop()?;
        Some(LocalHit {
            session: e.session,
            qos: e.options.qos.min(self.qos),
            retain: e.options.retain_as_published && self.retain,
            sub_ids: e.id.map(NonZeroU32::get).into_iter().collect(),
            share: Some(key),
        })
    }
}

/// A change of this core's interest in a filter, for its peers.
pub(crate) struct Announcement {
    pub(crate) filter: Box<str>,
    pub(crate) group: Option<Box<str>>,
    pub(crate) add: bool,
}

/// The subscription tries and the scratch space routing reuses (routing
/// allocates nothing per message once these have grown).
#[derive(Default)]
pub(crate) struct Router {
    subs: Trie,
    shards: Trie,
    /// Entries in `shards` of other cores than this one: while there are
    /// none, a publish here goes nowhere else and `shards` is not walked.
    remote: usize,
    /// This core's id when it has peers: then subscription changes are
    /// announced and publishes forwarded.
    me: Option<PeerId>,
    /// Peers away (see `Broker::set_peer_away`): a shared group's turn
    /// skips them while a member elsewhere is left. A few at most.
    away: Vec<SessionId>,
    announcements: Vec<Announcement>,
    direct: Vec<SubEntry>,
    shared: Vec<(SubEntry, Arc<str>)>,
    /// Shared groups whose turn is this core's, for the current message.
    local_shares: Vec<Arc<str>>,
    forwards: Vec<Forward>,
}

impl Router {
    /// Route for core `me` among peers from now on.
    pub(crate) fn set_peered(&mut self, me: Option<PeerId>) {
        if me != self.me {
            // Peered from now on (a first node joined), or no longer: the
            // route index starts from this core's own interests.
            self.shards = Trie::default();
            self.remote = 0;
            if let Some(me) = me {
                for (filter, group) in self.subs.filters() {
                    self.peer_interest(me, &filter, group.as_deref(), true);
                    // Subscriptions from before (restored from the store
                    // at start) are announced as new ones are; a peer
                    // that already knows one takes it again unchanged.
                    self.announcements.push(Announcement {
                        filter: filter.as_str().into(),
                        group,
                        add: true,
                    });
                }
            }
        }
        self.me = me;
    }

    /// `peer` is away (or back): while it is, a shared group's turn goes
    /// to its members only when no other core has one, so that a dead
    /// node's members do not take messages the others would deliver.
    pub(crate) fn set_away(&mut self, peer: PeerId, away: bool) {
        let session = SessionId(u64::from(peer.0));
        self.away.retain(|&s| s != session);
        if away {
            self.away.push(session);
        }
    }

    /// Forget every interest of `peer` (it left, or resends them all).
    pub(crate) fn forget_peer(&mut self, peer: PeerId) {
        let session = SessionId(u64::from(peer.0));
        for (filter, group) in self.shards.filters() {
            if self.shards.remove(&filter, group.as_deref(), session) && Some(peer) != self.me {
                self.remote = self.remote.saturating_sub(1);
            }
        }
    }

    /// Add or replace `entry.session`'s subscription to `filter` (a
    /// `$share/{group}/{filter}` is entered in its group). True when new.
    pub(crate) fn subscribe(&mut self, filter: &str, entry: SubEntry) -> bool {
        let (group, plain) = split(filter);
        let new = self.subs.insert(plain, group, entry);
        if new && self.me.is_some() && self.subs.count(plain, group) == 1 {
            self.announce(plain, group, true);
        }
        new
    }

    /// Remove `session`'s subscription to `filter`; true if it existed.
    pub(crate) fn unsubscribe(&mut self, filter: &str, session: SessionId) -> bool {
        let (group, plain) = split(filter);
        let removed = self.subs.remove(plain, group, session);
        if removed && self.me.is_some() && self.subs.count(plain, group) == 0 {
            self.announce(plain, group, false);
        }
        removed
    }

    fn announce(&mut self, plain: &str, group: Option<&str>, add: bool) {
        if let Some(me) = self.me {
            self.peer_interest(me, plain, group, add);
        }
        self.announcements.push(Announcement {
            filter: plain.into(),
            group: group.map(Into::into),
            add,
        });
    }

    /// Subscription changes to tell the peers, oldest first.
    pub(crate) fn take_announcements(&mut self) -> std::vec::Drain<'_, Announcement> {
        self.announcements.drain(..)
    }

    /// Everything this core subscribes to, for a peer that joins late.
    pub(crate) fn interests(&self) -> Vec<(String, Option<Box<str>>)> {
        self.subs.filters()
    }

    /// `peer` has (or no longer has) subscribers on `filter`.
    pub(crate) fn peer_interest(
        &mut self,
        peer: PeerId,
        filter: &str,
        group: Option<&str>,
        add: bool,
    ) {
        // This core's own plain filters are not kept here: `route_peers`
        // skips them and `subs` has them. Kept, they were a second trie
        // path per subscription on every shard (its shared groups stay:
        // their round robin over cores counts this one).
        if group.is_none() && Some(peer) == self.me {
            return;
        }
        let session = SessionId(u64::from(peer.0));
        if add {
            let entry = SubEntry {
                session,
                options: SubscriptionOptions::default(),
                id: None,
            };
            if self.shards.insert(filter, group, entry) && Some(peer) != self.me {
                self.remote += 1;
            }
        } else if self.shards.remove(filter, group, session) && Some(peer) != self.me {
            self.remote = self.remote.saturating_sub(1);
        }
    }

    /// Another local member of `share` than `from`, preferring online ones
    /// (a leaving member hands its messages over).
    pub(crate) fn other_member(
        &mut self,
        share: &str,
        from: SessionId,
        online: impl Fn(SessionId) -> bool,
    ) -> Option<SubEntry> {
        let (Some(group), plain) = split(share) else {
            return None;
        };
        self.subs
            .group_mut(plain, group)
            .and_then(|g| g.pick_other(from, online))
    }

    /// A peer with members in `share`, when no local member is left.
    pub(crate) fn peer_member(&mut self, share: &str) -> Option<PeerId> {
        let (Some(group), plain) = split(share) else {
            return None;
        };
        let me = self.me?;
        let mine = SessionId(u64::from(me.0));
        let away = &self.away;
        self.shards
            .group_mut(plain, group)
            .and_then(|g| g.pick_other(mine, |s| !away.contains(&s)))
            .and_then(|e| u16::try_from(e.session.0).ok().map(PeerId))
    }

    /// Find where a message goes: every matching local session once (its
    /// overlapping subscriptions merged: highest QoS, every subscription
    /// identifier), one member per shared group (here or at a peer), and
    /// every peer with matching subscribers.
    pub(crate) fn route(
        &mut self,
        topic: &str,
        origin: Option<SessionId>,
        qos: QoS,
        retain: bool,
        scope: Scope<'_>,
        online: impl Fn(SessionId) -> bool,
    ) -> Routed {
        let (direct_wanted, shares) = match scope {
            Scope::Everywhere => (true, None),
            Scope::Forwarded { direct, shares } => (direct, Some(shares)),
        };
        // With no other core interested in anything, every shared group
        // with members has them here only: all its turns are ours.
        let alone = self.remote == 0;
        if let (Some(me), Scope::Everywhere, false) = (self.me, scope, alone) {
            self.route_peers(topic, me);
        }
        let peered = self.me.is_some() && !alone;
        let direct = &mut self.direct;
        let shared = &mut self.shared;
        let local_shares = &self.local_shares;
        self.subs.for_each_match(topic, |hit| match hit {
            Hit::Direct(e) => {
                // No Local: not back to the publisher (MQTT-3.8.3-3).
                if direct_wanted && !(e.options.no_local && origin == Some(e.session)) {
                    direct.push(*e);
                }
            }
            Hit::Shared(g) => {
                let ours = match shares {
                    Some(keys) => keys.contains(&g.key),
                    None => !peered || local_shares.contains(&g.key),
                };
                if ours {
                    if let Some(e) = g.pick(&online) {
                        shared.push((e, g.key.clone()));
                    }
                }
            }
        });
        // Sorted to merge a session's overlapping subscriptions. A trie node
        // keeps its subscriptions ordered by session, so the matches of a
        // single filter need no sorting, and checking costs less.
        // Strictly increasing (the usual case) also says that no session
        // needs merging.
        let overlap = !direct.is_sorted_by(|a, b| a.session < b.session);
        if overlap && !direct.is_sorted_by_key(|e| e.session) {
            direct.sort_unstable_by_key(|e| e.session);
        }
        // Popped from the end: yielded in the order found.
        shared.reverse();
        self.local_shares.clear();
        Routed {
            direct: std::mem::take(direct),
            next: 0,
            overlap,
            shared: std::mem::take(shared),
            qos,
            retain,
            forwards: std::mem::take(&mut self.forwards),
        }
    }

    /// The peers a message published here goes to, and the shared groups
    /// whose turn is this core's.
    fn route_peers(&mut self, topic: &str, me: PeerId) {
        let mine = SessionId(u64::from(me.0));
        let forwards = &mut self.forwards;
        let local_shares = &mut self.local_shares;
        let away = &self.away;
        self.shards.for_each_match(topic, |hit| match hit {
            Hit::Direct(e) => {
                if e.session != mine {
                    if let Some(f) = forward_to(forwards, e.session) {
                        f.direct = true;
                    }
                }
            }
            Hit::Shared(g) => {
                // Round robin over the cores with members, those away
                // skipped while another has one; the chosen core picks
                // one of its own.
                if let Some(e) = g.pick(|s| !away.contains(&s)) {
                    if e.session == mine {
                        local_shares.push(g.key.clone());
                    } else if let Some(f) = forward_to(forwards, e.session) {
                        f.shares.push(g.key.clone());
                    }
                }
            }
        });
    }

    /// Give a route's buffers back for the next message.
    pub(crate) fn recycle(&mut self, mut routed: Routed) {
        routed.direct.clear();
        routed.shared.clear();
        routed.forwards.clear();
        self.direct = routed.direct;
        self.shared = routed.shared;
        self.forwards = routed.forwards;
    }
}

/// The entry of `peer` (a core's id, as the `shards` trie keeps it) in
/// `forwards`, added when missing.
fn forward_to(forwards: &mut Vec<Forward>, peer: SessionId) -> Option<&mut Forward> {
    let peer = PeerId(u16::try_from(peer.0).ok()?);
    let i = match forwards.iter().position(|f| f.peer == peer) {
        Some(i) => i,
        None => {
            forwards.push(Forward {
                peer,
                direct: false,
                shares: Vec::new(),
            });
            forwards.len() - 1
        }
    };
    forwards.get_mut(i)
}

/// `$share/{group}/{filter}` as `(Some(group), filter)`, else `(None, filter)`.
fn split(filter: &str) -> (Option<&str>, &str) {
    match zerofan_codec::topic::split_shared(filter) {
        Some((group, plain)) => (Some(group), plain),
        None => (None, filter),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(session: u64, qos: QoS, id: Option<u32>) -> SubEntry {
        SubEntry {
            session: SessionId(session),
            options: SubscriptionOptions {
                qos,
                ..SubscriptionOptions::default()
            },
            id: id.and_then(NonZeroU32::new),
        }
    }

    /// The local hits of one route, as (session, qos, retain, sorted
    /// subscription ids, group), and the peers it crosses to.
    type Seen = (Vec<(u64, QoS, bool, Vec<u32>, Option<String>)>, Vec<u16>);

    fn route(r: &mut Router, topic: &str, origin: Option<u64>, scope: Scope<'_>) -> Seen {
        let mut routed = r.route(
            topic,
            origin.map(SessionId),
            QoS::ExactlyOnce,
            true,
            scope,
            |_| true,
        );
        let mut hits = Vec::new();
        for h in routed.by_ref() {
            let mut ids = h.sub_ids;
            ids.sort_unstable();
            let share = h.share.as_deref().map(str::to_string);
            hits.push((h.session.0, h.qos, h.retain, ids, share));
        }
        let peers = routed.forwards.iter().map(|f| f.peer.0).collect();
        r.recycle(routed);
        (hits, peers)
    }

    #[test]
    fn one_hit_per_session_then_one_per_group_in_order() {
        let mut r = Router::default();
        r.subscribe("a/b", entry(5, QoS::AtLeastOnce, Some(7)));
        r.subscribe("a/+", entry(5, QoS::ExactlyOnce, Some(9)));
        r.subscribe("#", entry(5, QoS::AtMostOnce, None));
        r.subscribe("a/#", entry(2, QoS::AtMostOnce, None));
        let mut own = entry(3, QoS::AtLeastOnce, None);
        own.options.no_local = true;
        r.subscribe("a/b", own);
        let mut rap = entry(4, QoS::AtLeastOnce, None);
        rap.options.retain_as_published = true;
        r.subscribe("+/b", rap);
        r.subscribe("$share/g/a/b", entry(8, QoS::AtLeastOnce, Some(1)));
        r.subscribe("$share/g/a/b", entry(9, QoS::AtMostOnce, None));
        r.subscribe("$share/h/a/#", entry(6, QoS::ExactlyOnce, None));
        let q0 = QoS::AtMostOnce;
        let q1 = QoS::AtLeastOnce;
        let q2 = QoS::ExactlyOnce;
        let group = |g: &str, f: &str| Some(format!("$share/{g}/{f}"));
        // Session 5's three matches merged (highest QoS, both ids);
        // session 3 publishes it and has No Local; sessions in order; then
        // one member per group in the trie walk's order (`a/#` is met
        // before `a/b`), round robin over two routes.
        let expect = |member: u64, member_qos: QoS, member_ids: Vec<u32>| {
            vec![
                (2, q0, false, vec![], None),
                (4, q1, true, vec![], None),
                (5, q2, false, vec![7, 9], None),
                (6, q2, false, vec![], group("h", "a/#")),
                (member, member_qos, false, member_ids, group("g", "a/b")),
            ]
        };
        let seen = route(&mut r, "a/b", Some(3), Scope::Everywhere);
        assert_eq!(seen, (expect(8, q1, vec![1]), vec![]));
        let seen = route(&mut r, "a/b", Some(3), Scope::Everywhere);
        assert_eq!(seen, (expect(9, q0, vec![]), vec![]));
        // Forwarded here by a peer: only the groups it names, and No Local
        // does not apply to another core's session ids.
        let shares = [Arc::from("$share/h/a/#")];
        let scope = Scope::Forwarded {
            direct: false,
            shares: &shares,
        };
        let seen = route(&mut r, "a/b", None, scope);
        assert_eq!(
            seen,
            (vec![(6, q2, false, vec![], group("h", "a/#"))], vec![])
        );
        // Nothing matches (`#` is not for `$` topics): nothing, and the
        // buffers are reused clean.
        assert_eq!(
            route(&mut r, "$x/y", None, Scope::Everywhere),
            (vec![], vec![])
        );
        assert_eq!(
            route(&mut r, "x", None, Scope::Everywhere),
            (vec![(5, q0, false, vec![], None)], vec![])
        );
    }

    #[test]
    fn matches_merged_only_for_a_session_met_twice() {
        let q0 = QoS::AtMostOnce;
        let q1 = QoS::AtLeastOnce;
        let mut r = Router::default();
        // Session 1 twice, already in order (no sort): merged; session 2
        // after it yielded on its own.
        r.subscribe("x/y", entry(1, q0, Some(3)));
        r.subscribe("x/+", entry(1, q1, Some(4)));
        r.subscribe("x/+", entry(2, q0, None));
        assert_eq!(
            route(&mut r, "x/y", None, Scope::Everywhere),
            (
                vec![
                    (1, q1, false, vec![3, 4], None),
                    (2, q0, false, vec![], None)
                ],
                vec![]
            )
        );
        // Each session once: one hit per match, the last one included.
        assert_eq!(
            route(&mut r, "x/z", None, Scope::Everywhere),
            (
                vec![(1, q1, false, vec![4], None), (2, q0, false, vec![], None)],
                vec![]
            )
        );
        // A session met twice as the last match.
        r.subscribe("#", entry(2, q1, Some(5)));
        assert_eq!(
            route(&mut r, "x/z", None, Scope::Everywhere),
            (
                vec![(1, q1, false, vec![4], None), (2, q1, false, vec![5], None)],
                vec![]
            )
        );
    }

    #[test]
    fn peers_with_matching_subscribers_get_it_once() {
        let mut r = Router::default();
        r.set_peered(Some(PeerId(0)));
        r.subscribe("a/b", entry(5, QoS::AtLeastOnce, None));
        r.peer_interest(PeerId(1), "a/+", None, true);
        r.peer_interest(PeerId(1), "a/b", None, true);
        r.peer_interest(PeerId(2), "#", None, true);
        r.peer_interest(PeerId(3), "x", None, true);
        let (hits, mut peers) = route(&mut r, "a/b", None, Scope::Everywhere);
        peers.sort_unstable();
        assert_eq!(hits, vec![(5, QoS::AtLeastOnce, false, vec![], None)]);
        assert_eq!(peers, vec![1, 2]);
        // A forwarded message is not forwarded again.
        let scope = Scope::Forwarded {
            direct: true,
            shares: &[],
        };
        let (hits, peers) = route(&mut r, "a/b", None, scope);
        assert_eq!((hits.len(), peers), (1, vec![]));
    }
}

//! Several cores as the nodes of a cluster, in one thread: every batch a
//! core polls for another node is encoded into link frames
//! (`peer_wire`), and decoded at the far end from one read buffer. So
//! these prove the wire form carries everything the core needs; node ids
//! map to peer ids of each node's own (`me` is 0, node `j` is `100 + j`),
//! as the shell's link table does.

use super::*;
use crate::core::peer_wire::{FrameDecoder, FrameEncoder, LinkFrame};
use crate::core::PeerId;

fn remote(node: usize) -> PeerId {
    PeerId(100 + node as u16)
}

fn node_of(peer: PeerId) -> usize {
    usize::from(peer.0 - 100)
}

struct Nodes {
    hs: Vec<H>,
    /// Which nodes are linked (both ways): batches to others wait.
    linked: Vec<Vec<bool>>,
    /// Bytes written by `from` for `to`, not yet read.
    wires: Vec<Vec<BytesMut>>,
    enc: FrameEncoder,
    dec: FrameDecoder,
}

#[derive(Clone, Copy)]
struct Cx {
    node: usize,
    conn: ConnId,
}

impl Nodes {
    fn new(n: usize) -> Self {
        let hs = (0..n)
            .map(|_| {
                let mut h = H::with(Config {
                    sys_interval: 0,
                    ..Config::default()
                });
                // Alone until links come up.
                h.b.set_peers(PeerId(0), &[PeerId(0)]);
                h
            })
            .collect();
        Nodes {
            hs,
            linked: vec![vec![false; n]; n],
            wires: (0..n)
                .map(|_| (0..n).map(|_| BytesMut::new()).collect())
                .collect(),
            enc: FrameEncoder::default(),
            dec: FrameDecoder::default(),
        }
    }

    /// Link nodes `a` and `b` (as membership does when one joins).
    fn link(&mut self, a: usize, b: usize) {
        self.linked[a][b] = true;
        self.linked[b][a] = true;
        self.hs[a].b.add_peer(remote(b));
        self.hs[b].b.add_peer(remote(a));
        self.pump();
    }

    /// Encode what every core polled; deliver what crossed a live link.
    fn pump(&mut self) {
        for _ in 0..1000 {
            let mut moved = false;
            for i in 0..self.hs.len() {
                let now = self.hs[i].now;
                while let Some(batch) = self.hs[i].b.poll_peer_transmit() {
                    let to = node_of(batch.to);
                    for e in &batch.events {
                        let f = self.enc.encode(e, now).unwrap();
                        for c in &f.chunks {
                            self.wires[i][to].extend_from_slice(c);
                        }
                    }
                }
            }
            for from in 0..self.hs.len() {
                for to in 0..self.hs.len() {
                    if !self.linked[from][to] || self.wires[from][to].is_empty() {
                        continue;
                    }
                    // One read buffer per delivery, as a socket read gives.
                    let mut buf = self.wires[from][to].split();
                    let h = &mut self.hs[to];
                    while let Some(frame) = self.dec.decode(&mut buf, h.now).unwrap() {
                        moved = true;
                        match frame {
                            LinkFrame::Event(e) => h.b.handle_peer(h.now, remote(from), e),
                            LinkFrame::Sync => h.b.peer_reset(remote(from)),
                            _ => {
                                unreachable!("only the shell sends these")
                            }
                        }
                    }
                    assert!(buf.is_empty());
                }
            }
            if !moved {
                return;
            }
        }
        panic!("nodes never went quiet");
    }

    fn client(&mut self, node: usize, id: &str) -> Cx {
        let conn = self.hs[node].client(id);
        Cx { node, conn }
    }

    fn subscribe(&mut self, c: Cx, filter: &str, qos: QoS) -> Out {
        let mut out = self.hs[c.node].subscribe(c.conn, filter, opts(qos));
        self.pump();
        out.packets.extend(self.out(c).packets);
        out
    }

    fn publish(&mut self, c: Cx, topic: &str, payload: &str, qos: QoS, pid: u16, retain: bool) {
        let mut p = publish(topic, payload, qos, pid);
        p.retain = retain;
        self.hs[c.node].send(c.conn, Packet::Publish(p));
        self.pump();
    }

    fn out(&mut self, c: Cx) -> Out {
        self.hs[c.node].out(c.conn)
    }

    fn full_mesh(n: usize) -> Self {
        let mut nodes = Nodes::new(n);
        for a in 0..n {
            for b in a + 1..n {
                nodes.link(a, b);
            }
        }
        nodes
    }
}

fn subacked(out: &Out) -> bool {
    out.packets.iter().any(|p| matches!(p, Packet::SubAck(_)))
}

#[test]
fn a_publish_crosses_to_every_node_once_and_in_order() {
    let mut n = Nodes::full_mesh(3);
    let subs = [n.client(1, "s1"), n.client(2, "s2")];
    for &s in &subs {
        assert!(subacked(&n.subscribe(s, "t/+", QoS::AtLeastOnce)));
        n.subscribe(s, "t/#", QoS::AtMostOnce);
    }
    let local = n.client(0, "s0");
    n.subscribe(local, "t/#", QoS::AtMostOnce);
    let p = n.client(0, "pub");
    for i in 0..20u16 {
        n.publish(p, "t/x", &i.to_string(), QoS::AtLeastOnce, i + 1, false);
    }
    let want: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    for &s in &subs {
        let out = n.out(s);
        assert_eq!(out.payloads(), want, "node {}", s.node);
        assert!(out.publishes().iter().all(|p| p.qos == QoS::AtLeastOnce));
    }
    assert_eq!(n.out(local).payloads(), want);
    assert_eq!(n.hs[0].b.metrics().peer_forwarded, 2 * 20);
    assert!(n.enc.frames > 40 && n.dec.frames == n.enc.frames);
}

#[test]
fn properties_and_expiry_cross_nodes() {
    let mut n = Nodes::full_mesh(2);
    let s = n.client(1, "s");
    n.subscribe(s, "t", QoS::AtMostOnce);
    let p = n.client(0, "p");
    let mut pkt = publish("t", "x", QoS::AtMostOnce, 0);
    pkt.properties = Properties {
        content_type: Some(s_("json")),
        message_expiry_interval: Some(60),
        user_properties: vec![(s_("k"), s_("v"))],
        ..Properties::default()
    }
    .into();
    n.hs[0].send(p.conn, Packet::Publish(pkt));
    n.pump();
    let out = n.out(s);
    let got = out.publishes();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].properties.content_type.as_deref(), Some("json"));
    assert_eq!(got[0].properties.user_properties.len(), 1);
    assert_eq!(got[0].properties.message_expiry_interval, Some(60));
}

fn s_(v: &str) -> MqttStr {
    s(v)
}

#[test]
fn a_shared_group_across_nodes_gets_each_message_once() {
    let mut n = Nodes::full_mesh(3);
    let members: Vec<Cx> = (0..6).map(|i| n.client(i % 3, &format!("m{i}"))).collect();
    for &m in &members {
        n.subscribe(m, "$share/g/jobs/+", QoS::AtLeastOnce);
    }
    let pubs: Vec<Cx> = (0..3).map(|i| n.client(i, &format!("p{i}"))).collect();
    let mut pid = 0;
    for round in 0..20 {
        for (k, &p) in pubs.iter().enumerate() {
            pid += 1;
            n.publish(
                p,
                "jobs/a",
                &format!("{k}-{round}"),
                QoS::AtLeastOnce,
                pid,
                false,
            );
        }
    }
    let mut all = Vec::new();
    let mut per_node = [0usize; 3];
    for &m in &members {
        let got = n.out(m).payloads();
        per_node[m.node] += got.len();
        all.extend(got);
    }
    all.sort();
    let mut want: Vec<String> = (0..3)
        .flat_map(|k| (0..20).map(move |r| format!("{k}-{r}")))
        .collect();
    want.sort();
    assert_eq!(all, want, "every message once, none twice");
    assert!(per_node.iter().all(|&c| c > 0), "spread: {per_node:?}");
}

#[test]
fn retained_messages_reach_other_nodes_and_nodes_that_join_later() {
    let mut n = Nodes::full_mesh(2);
    let p = n.client(1, "p");
    n.publish(p, "r/1", "kept", QoS::AtLeastOnce, 1, true);
    let late = n.client(0, "late");
    let out = n.subscribe(late, "r/#", QoS::AtLeastOnce);
    assert_eq!(out.payloads(), ["kept"]);
    assert!(out.publishes()[0].retain);

    // A third node joins: it gets every retained message on linking.
    let mut n3 = Nodes::new(3);
    let p = n3.client(1, "p");
    n3.link(0, 1);
    n3.publish(p, "r/1", "kept", QoS::AtLeastOnce, 1, true);
    n3.publish(p, "r/2", "also", QoS::AtMostOnce, 0, true);
    assert_eq!(n3.hs[2].b.retained_count(), 0);
    n3.link(0, 2);
    n3.link(1, 2);
    assert_eq!(n3.hs[2].b.retained_count(), 2);
    let c = n3.client(2, "c");
    let mut got = n3.subscribe(c, "r/#", QoS::AtLeastOnce).payloads();
    got.sort();
    assert_eq!(got, ["also", "kept"]);

    // Cleared on one node: cleared on all.
    n3.publish(p, "r/1", "", QoS::AtLeastOnce, 2, true);
    for h in &n3.hs {
        assert_eq!(h.b.retained_count(), 1);
    }
}

#[test]
fn unsubscribing_stops_forwarding_to_that_node() {
    let mut n = Nodes::full_mesh(2);
    let s = n.client(1, "s");
    n.subscribe(s, "t", QoS::AtMostOnce);
    let p = n.client(0, "p");
    n.publish(p, "t", "one", QoS::AtMostOnce, 0, false);
    n.hs[1].send(
        s.conn,
        Packet::Unsubscribe(zerofan_codec::Unsubscribe {
            packet_id: 2,
            properties: Default::default(),
            filters: vec![s_("t")],
        }),
    );
    n.pump();
    n.publish(p, "t", "two", QoS::AtMostOnce, 0, false);
    assert_eq!(n.out(s).payloads(), ["one"]);
    assert_eq!(n.hs[0].b.metrics().peer_forwarded, 1);
}

#[test]
fn a_node_that_leaves_releases_the_subacks_waiting_for_it() {
    let mut n = Nodes::full_mesh(2);
    // The link to node 1 goes quiet: nothing it is sent arrives.
    n.linked[0][1] = false;
    n.linked[1][0] = false;
    let s = n.client(0, "s");
    let out = n.subscribe(s, "t", QoS::AtMostOnce);
    assert!(!subacked(&out), "waits for node 1 to see it");
    n.hs[0].b.peer_left(remote(1));
    assert!(subacked(&n.out(s)));
    // Nothing is forwarded to it any more.
    let s1 = n.client(1, "s1");
    n.linked[1][0] = true;
    n.subscribe(s1, "t", QoS::AtMostOnce);
    let p = n.client(0, "p");
    n.publish(p, "t", "x", QoS::AtMostOnce, 0, false);
    assert_eq!(n.hs[0].b.metrics().peer_forwarded, 0);
}

#[test]
fn a_reset_forgets_interests_that_the_resent_state_lacks() {
    let mut n = Nodes::full_mesh(2);
    let s = n.client(1, "s");
    n.subscribe(s, "old", QoS::AtMostOnce);
    // Node 1 reconnects: its resent state no longer has "old" (say it was
    // withdrawn while the link was down and that change was lost).
    n.hs[0].b.peer_reset(remote(1));
    n.hs[1].b.peer_joined(remote(0));
    n.pump();
    let p = n.client(0, "p");
    n.publish(p, "old", "x", QoS::AtMostOnce, 0, false);
    assert_eq!(n.out(s).payloads(), ["x"], "resent state has it again");
    n.hs[0].b.peer_reset(remote(1));
    n.publish(p, "old", "y", QoS::AtMostOnce, 0, false);
    assert!(n.out(s).payloads().is_empty());
}

#[test]
fn subscriptions_made_before_a_link_comes_up_take_their_turn_in_groups() {
    let mut n = Nodes::new(2);
    let a = n.client(0, "a");
    let b = n.client(1, "b");
    n.subscribe(a, "$share/g/t", QoS::AtMostOnce);
    n.subscribe(b, "$share/g/t", QoS::AtMostOnce);
    n.link(0, 1);
    let p = n.client(0, "p");
    for i in 0..10u16 {
        n.publish(p, "t", &i.to_string(), QoS::AtMostOnce, 0, false);
    }
    let (ga, gb) = (n.out(a).payloads(), n.out(b).payloads());
    assert_eq!(ga.len() + gb.len(), 10, "each once: {ga:?} {gb:?}");
    assert!(
        !ga.is_empty() && !gb.is_empty(),
        "both take turns: {ga:?} {gb:?}"
    );
}

#[test]
fn a_reset_releases_the_holds_the_peer_put_on_publishers() {
    let mut n = Nodes::full_mesh(2);
    let p = n.client(0, "p");
    let session = crate::core::SessionId(1);
    // Node 2 holds node 1's publisher (a subscriber of it is behind)...
    let now = n.hs[0].now;
    n.hs[0].b.handle_peer(
        now,
        remote(1),
        crate::core::PeerEvent::Hold {
            session,
            hold: true,
        },
    );
    assert!(n.hs[0].b.held(p.conn));
    // ...and its link breaks before the release arrives: the resync
    // frees it.
    n.hs[0].b.peer_reset(remote(1));
    assert!(!n.hs[0].b.held(p.conn));
}

/// A node whose link is down (away) is not waited for, but stays a member:
/// once back, what it is told again counts, and later SUBACKs wait for it.
#[test]
fn an_away_node_is_not_waited_for_until_it_is_back() {
    let mut n = Nodes::full_mesh(2);
    n.linked[0][1] = false;
    n.linked[1][0] = false;
    let s = n.client(0, "s");
    let out = n.subscribe(s, "t", QoS::AtMostOnce);
    assert!(!subacked(&out), "waits for node 1 to see it");
    n.hs[0].b.set_peer_away(remote(1), true);
    assert!(subacked(&n.out(s)), "released while node 1 is away");
    let out = n.subscribe(s, "u", QoS::AtMostOnce);
    assert!(subacked(&out), "not waited for while away");
    n.hs[0].b.set_peer_away(remote(1), false);
    let out = n.subscribe(s, "v", QoS::AtMostOnce);
    assert!(!subacked(&out), "waited for again once back");
}

/// A shared group's turn skips a node that is away while a member is
/// left elsewhere: a node's own members and the other live node's share
/// the messages, and the away node gets none; once back it takes turns
/// again. Before, it kept its turn: with a member on a dead node, a
/// third of the group's messages here went to its link, acknowledged and
/// never delivered. With members only on away nodes, a message still goes
/// to one (it may come back).
#[test]
fn a_shared_group_skips_members_on_a_node_away() {
    let mut n = Nodes::full_mesh(3);
    let members: Vec<Cx> = (0..3).map(|i| n.client(i, &format!("m{i}"))).collect();
    for &m in &members {
        n.subscribe(m, "$share/g/t", QoS::AtLeastOnce);
    }
    let p = n.client(0, "p");
    n.linked[0][2] = false;
    n.linked[2][0] = false;
    n.hs[0].b.set_peer_away(remote(2), true);
    for pid in 1..=6 {
        n.publish(p, "t", &format!("{pid}"), QoS::AtLeastOnce, pid, false);
    }
    let got: Vec<usize> = members.iter().map(|&m| n.out(m).payloads().len()).collect();
    assert_eq!(got, [3, 3, 0], "node 2, away, skipped");

    n.hs[0].b.set_peer_away(remote(2), false);
    n.linked[0][2] = true;
    n.linked[2][0] = true;
    for pid in 7..=12 {
        n.publish(p, "t", &format!("{pid}"), QoS::AtLeastOnce, pid, false);
    }
    let got: Vec<usize> = members.iter().map(|&m| n.out(m).payloads().len()).collect();
    assert_eq!(got, [2, 2, 2], "back: every node takes its turn");

    // Every other member gone (their unacknowledged messages handed to
    // the one left): the away node's member is still chosen.
    for &m in &members[..2] {
        n.hs[m.node].send(
            m.conn,
            Packet::Unsubscribe(zerofan_codec::Unsubscribe {
                packet_id: 2,
                properties: Default::default(),
                filters: vec![s_("$share/g/t")],
            }),
        );
    }
    n.pump();
    n.linked[0][2] = false;
    n.linked[2][0] = false;
    n.hs[0].b.set_peer_away(remote(2), true);
    n.publish(p, "t", "last", QoS::AtLeastOnce, 13, false);
    n.linked[0][2] = true;
    n.linked[2][0] = true;
    n.pump();
    let got = n.out(members[2]).payloads();
    assert_eq!(got.last().map(String::as_str), Some("last"), "{got:?}");
}

/// A node away (dead, cut off) holds no publisher for its link's full
/// queue: nothing drains that queue until it is back, and nothing waits
/// for it meanwhile. Before, QoS 1 publishers whose messages matched a
/// subscription there stopped cluster-wide once 8 MiB had queued for it.
#[test]
fn a_congested_node_holds_publishers_only_while_it_is_not_away() {
    let mut n = Nodes::full_mesh(2);
    let s = n.client(1, "s");
    n.subscribe(s, "t", QoS::AtLeastOnce);
    let p = n.client(0, "p");
    n.hs[0].b.set_peer_congested(remote(1), true);
    n.publish(p, "t", "1", QoS::AtLeastOnce, 1, false);
    assert!(n.hs[0].b.held(p.conn), "held while node 1 drains");
    n.linked[0][1] = false;
    n.linked[1][0] = false;
    n.hs[0].b.set_peer_away(remote(1), true);
    assert!(!n.hs[0].b.held(p.conn), "let go once node 1 is away");
    let mut woken = Vec::new();
    n.hs[0].b.take_wakeups(&mut woken);
    assert!(woken.contains(&p.conn), "and woken");
    n.publish(p, "t", "2", QoS::AtLeastOnce, 2, false);
    assert!(!n.hs[0].b.held(p.conn), "not held again while it is away");
    // Back, its queue still full: held again until it drains.
    n.hs[0].b.set_peer_away(remote(1), false);
    n.publish(p, "t", "3", QoS::AtLeastOnce, 3, false);
    assert!(n.hs[0].b.held(p.conn), "held again once back");
}

#[test]
fn retained_changes_made_on_both_sides_of_a_partition_converge() {
    let mut n = Nodes::full_mesh(2);
    for (i, h) in n.hs.iter_mut().enumerate() {
        let now = h.now;
        h.b.set_node_id(i as u64 + 1, now, 1_700_000_000_000);
    }
    let (a, b) = (n.client(0, "a"), n.client(1, "b"));
    n.publish(a, "r/v", "set before", QoS::AtLeastOnce, 1, true);
    // Cut: what each side writes waits on its link.
    n.linked[0][1] = false;
    n.linked[1][0] = false;
    let ms = Duration::from_millis;
    // r/t: node 1 writes last; r/u: node 0 does; r/v: node 0 clears last.
    n.hs[0].advance(ms(5));
    n.publish(a, "r/t", "node 0 early", QoS::AtLeastOnce, 2, true);
    n.hs[1].advance(ms(5));
    n.publish(b, "r/u", "node 1 early", QoS::AtLeastOnce, 1, true);
    n.hs[1].advance(ms(15));
    n.publish(b, "r/t", "node 1 late", QoS::AtLeastOnce, 2, true);
    n.publish(b, "r/v", "node 1 early", QoS::AtLeastOnce, 3, true);
    n.hs[0].advance(ms(25));
    n.publish(a, "r/u", "node 0 late", QoS::AtLeastOnce, 3, true);
    n.publish(a, "r/v", "", QoS::AtLeastOnce, 4, true);
    // Heal: each side's queued changes reach the other.
    n.linked[0][1] = true;
    n.linked[1][0] = true;
    n.pump();
    for node in 0..2 {
        let c = n.client(node, &format!("reader{node}"));
        let mut got = n.subscribe(c, "r/#", QoS::AtLeastOnce).payloads();
        got.sort();
        assert_eq!(got, ["node 0 late", "node 1 late"], "node {node}");
    }
}

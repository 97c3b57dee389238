//! Several cores as the shards of one broker, in one thread: the queues
//! between them are simulated (`Shards::pump` moves every batch a core
//! polled to its destination, in order), so cross-shard routing, shared
//! subscriptions, retained messages and push-back are tested
//! deterministically, without threads.

use super::*;
use crate::core::{shard_of, PeerId};

/// A connection on one shard.
#[derive(Clone, Copy, Debug)]
struct Cx {
    shard: usize,
    conn: ConnId,
}

struct Shards {
    hs: Vec<H>,
    /// Batches polled but not yet handed over: (from, batch).
    in_flight: std::collections::VecDeque<(usize, crate::core::PeerBatch)>,
}

impl Shards {
    fn new(n: usize) -> Self {
        Shards::with(
            n,
            Config {
                sys_interval: 0,
                ..Config::default()
            },
        )
    }

    fn with(n: usize, cfg: Config) -> Self {
        let ids: Vec<PeerId> = (0..n as u16).map(PeerId).collect();
        let hs = (0..n)
            .map(|i| {
                let mut h = H::with(cfg.clone());
                h.b.set_peers(ids[i], &ids);
                h
            })
            .collect();
        Shards {
            hs,
            in_flight: Default::default(),
        }
    }

    /// Collect what every core has for its peers.
    fn poll(&mut self) {
        for (i, h) in self.hs.iter_mut().enumerate() {
            while let Some(batch) = h.b.poll_peer_transmit() {
                self.in_flight.push_back((i, batch));
            }
        }
    }

    /// Move batches until no core has anything left for another.
    fn pump(&mut self) {
        for _ in 0..1000 {
            self.poll();
            let Some((from, batch)) = self.in_flight.pop_front() else {
                return;
            };
            let h = &mut self.hs[usize::from(batch.to.0)];
            for event in batch.events {
                h.b.handle_peer(h.now, PeerId(from as u16), event);
            }
        }
        panic!("peers never went quiet");
    }

    /// A v5 client on the shard its id hashes to, as the shell places it.
    fn client(&mut self, id: &str) -> Cx {
        let shard = shard_of(id.as_bytes(), self.hs.len());
        self.client_on(shard, id)
    }

    fn client_on(&mut self, shard: usize, id: &str) -> Cx {
        let conn = self.hs[shard].client(id);
        Cx { shard, conn }
    }

    /// Subscribe; returns what the client got (SUBACK, retained messages).
    fn subscribe(&mut self, c: Cx, filter: &str, qos: QoS) -> Out {
        let mut out = self.hs[c.shard].subscribe(c.conn, filter, opts(qos));
        self.pump();
        // A SUBACK (and its retained messages) may wait for the other shards.
        out.packets.extend(self.out(c).packets);
        out
    }

    fn publish(&mut self, c: Cx, topic: &str, payload: &str, qos: QoS, pid: u16) {
        self.publish_only(c, topic, payload, qos, pid);
        self.pump();
    }

    /// Publish without moving the peers' queues.
    fn publish_only(&mut self, c: Cx, topic: &str, payload: &str, qos: QoS, pid: u16) {
        self.hs[c.shard].send(c.conn, Packet::Publish(publish(topic, payload, qos, pid)));
    }

    fn out(&mut self, c: Cx) -> Out {
        self.hs[c.shard].out(c.conn)
    }

    fn forwarded(&self) -> u64 {
        self.hs.iter().map(|h| h.b.metrics().peer_forwarded).sum()
    }
}

#[test]
fn a_publish_reaches_subscribers_on_every_shard_once_and_in_order() {
    let mut sh = Shards::new(4);
    let subs: Vec<Cx> = (0..4)
        .map(|i| sh.client_on(i, &format!("sub{i}")))
        .collect();
    for &c in &subs {
        // Overlapping subscriptions: still one copy per message.
        sh.subscribe(c, "t/+", QoS::AtLeastOnce);
        sh.subscribe(c, "t/#", QoS::AtMostOnce);
    }
    let publ = sh.client("pub");
    for i in 0..20u16 {
        sh.publish(publ, "t/x", &i.to_string(), QoS::AtLeastOnce, i + 1);
    }
    let want: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    for &c in &subs {
        let out = sh.out(c);
        assert_eq!(out.payloads(), want, "subscriber on shard {}", c.shard);
        assert!(out.publishes().iter().all(|p| p.qos == QoS::AtLeastOnce));
    }
    // Each message crossed once to each of the three other shards.
    assert_eq!(sh.forwarded(), 3 * 20);
    // The publisher got its acknowledgements (subscribers elsewhere count
    // as matching: no 0x10).
    let acks: Vec<ReasonCode> = sh
        .out(publ)
        .packets
        .iter()
        .filter_map(|p| match p {
            Packet::PubAck(a) => Some(a.reason),
            _ => None,
        })
        .collect();
    assert_eq!(acks, vec![ReasonCode::SUCCESS; 20]);
}

#[test]
fn a_publish_crosses_only_to_shards_with_matching_subscribers() {
    let mut sh = Shards::new(3);
    let a = sh.client_on(0, "a");
    let b = sh.client_on(2, "b");
    sh.subscribe(a, "x/#", QoS::AtMostOnce);
    sh.subscribe(b, "y/#", QoS::AtMostOnce);
    let publ = sh.client_on(1, "pub");
    sh.publish(publ, "x/1", "to a", QoS::AtMostOnce, 0);
    sh.publish(publ, "y/1", "to b", QoS::AtMostOnce, 0);
    sh.publish(publ, "z/1", "to nobody", QoS::AtMostOnce, 0);
    assert_eq!(sh.out(a).payloads(), ["to a"]);
    assert_eq!(sh.out(b).payloads(), ["to b"]);
    assert_eq!(sh.forwarded(), 2);

    // The last subscriber of a filter leaving withdraws it everywhere.
    sh.hs[2].send(
        b.conn,
        Packet::Unsubscribe(zerofan_codec::Unsubscribe {
            packet_id: 2,
            properties: Default::default(),
            filters: vec![s("y/#")],
        }),
    );
    sh.pump();
    sh.publish(publ, "y/1", "gone", QoS::AtMostOnce, 0);
    assert_eq!(sh.forwarded(), 2);
    assert!(sh.out(b).payloads().is_empty());
}

#[test]
fn a_shared_group_over_shards_gets_each_message_exactly_once() {
    let mut sh = Shards::new(3);
    let members: Vec<Cx> = (0..6)
        .map(|i| sh.client_on(i % 3, &format!("m{i}")))
        .collect();
    for &m in &members {
        sh.subscribe(m, "$share/g/jobs/+", QoS::AtLeastOnce);
    }
    let publishers: Vec<Cx> = (0..3).map(|i| sh.client_on(i, &format!("p{i}"))).collect();
    let mut pid = 0;
    for round in 0..30 {
        for (n, &p) in publishers.iter().enumerate() {
            pid += 1;
            sh.publish(p, "jobs/a", &format!("{n}-{round}"), QoS::AtLeastOnce, pid);
        }
    }
    let mut all = Vec::new();
    let mut per_shard = [0usize; 3];
    for &m in &members {
        let got = sh.out(m).payloads();
        per_shard[m.shard] += got.len();
        all.extend(got);
    }
    all.sort();
    let mut want: Vec<String> = (0..3)
        .flat_map(|n| (0..30).map(move |r| format!("{n}-{r}")))
        .collect();
    want.sort();
    assert_eq!(all, want, "every message once, none twice");
    assert!(per_shard.iter().all(|&n| n > 0), "spread: {per_shard:?}");
}

#[test]
fn retained_messages_are_seen_from_every_shard() {
    let mut sh = Shards::new(3);
    let publ = sh.client_on(0, "pub");
    let mut p = publish("r/1", "kept", QoS::AtLeastOnce, 1);
    p.retain = true;
    sh.hs[0].send(publ.conn, Packet::Publish(p));
    sh.pump();
    for shard in 0..3 {
        let c = sh.client_on(shard, &format!("late{shard}"));
        let out = sh.subscribe(c, "r/#", QoS::AtLeastOnce);
        assert_eq!(out.payloads(), ["kept"], "shard {shard}");
        assert!(out.publishes()[0].retain);
    }
    // Cleared at another shard: cleared everywhere.
    let other = sh.client_on(2, "clearer");
    let mut p = publish("r/1", "", QoS::AtLeastOnce, 1);
    p.retain = true;
    sh.hs[2].send(other.conn, Packet::Publish(p));
    sh.pump();
    for shard in 0..3 {
        assert_eq!(sh.hs[shard].b.retained_count(), 0, "shard {shard}");
    }
}

#[test]
fn a_will_reaches_subscribers_on_other_shards() {
    let mut sh = Shards::new(2);
    let sub = sh.client_on(1, "watcher");
    sh.subscribe(sub, "wills/#", QoS::AtLeastOnce);
    let (c, out) = sh.hs[0].connect_with("dying", Protocol::V5, true, |k| {
        k.will = Some(will("wills/dying", "gone"));
    });
    assert_eq!(out.connack().unwrap().reason, ReasonCode::SUCCESS);
    let now = sh.hs[0].now;
    sh.hs[0].b.connection_lost(now, c);
    sh.pump();
    assert_eq!(sh.out(sub).payloads(), ["gone"]);
}

#[test]
fn a_full_shard_drops_qos0_and_holds_qos1_publishers() {
    let mut sh = Shards::new(2);
    let sub = sh.client_on(1, "sub");
    sh.subscribe(sub, "t", QoS::AtLeastOnce);
    let publ = sh.client_on(0, "pub");
    sh.hs[0].b.set_peer_congested(PeerId(1), true);
    sh.publish(publ, "t", "q0", QoS::AtMostOnce, 0);
    assert_eq!(sh.hs[0].b.metrics().dropped_qos0_peer_full, 1);
    assert!(!sh.hs[0].b.held(publ.conn));
    sh.publish(publ, "t", "q1", QoS::AtLeastOnce, 1);
    // Acknowledged messages are never dropped: it crossed, and its
    // publisher is not read until the shard drains.
    assert!(sh.hs[0].b.held(publ.conn));
    assert_eq!(sh.hs[0].b.metrics().peer_throttles, 1);
    assert_eq!(sh.out(sub).payloads(), ["q1"]);
    sh.hs[0].b.set_peer_congested(PeerId(1), false);
    assert!(!sh.hs[0].b.held(publ.conn));
    let mut woken = Vec::new();
    sh.hs[0].b.take_wakeups(&mut woken);
    assert!(woken.contains(&publ.conn), "the held publisher is woken");
}

#[test]
fn a_subscriber_behind_holds_its_publisher_on_another_shard() {
    let mut sh = Shards::with(
        2,
        Config {
            sys_interval: 0,
            max_online_queued_bytes: 16 * 1024,
            ..Config::default()
        },
    );
    let sub = sh.client_on(1, "slow");
    sh.subscribe(sub, "t", QoS::AtMostOnce);
    let publ = sh.client_on(0, "fast");
    let big = "x".repeat(1000);
    let mut sent = 0;
    while !sh.hs[0].b.held(publ.conn) {
        assert!(sent < 100, "never held");
        sh.publish(publ, "t", &big, QoS::AtMostOnce, 0);
        sent += 1;
    }
    // QoS 0, and nothing dropped: the publisher waits instead.
    assert_eq!(sh.hs[1].b.metrics().publisher_throttles, 1);
    assert_eq!(sh.hs[0].b.metrics().peer_throttles, 1);
    assert_eq!(sh.hs[1].b.metrics().dropped_total(), 0);
    // The subscriber reads: its shard releases the publisher's.
    assert_eq!(sh.out(sub).publishes().len(), sent);
    sh.pump();
    assert!(!sh.hs[0].b.held(publ.conn));
}

#[test]
fn what_crosses_before_the_hold_arrives_is_kept() {
    // The publisher's shard reads on until the Hold reaches it: here 40
    // messages (2.5 times the subscriber's bound) cross in one go.
    let mut sh = Shards::with(
        2,
        Config {
            sys_interval: 0,
            max_online_queued_bytes: 16 * 1024,
            ..Config::default()
        },
    );
    let sub = sh.client_on(1, "slow");
    sh.subscribe(sub, "t", QoS::AtMostOnce);
    let publ = sh.client_on(0, "fast");
    let big = "x".repeat(1000);
    for _ in 0..40 {
        sh.publish_only(publ, "t", &big, QoS::AtMostOnce, 0);
    }
    sh.pump();
    assert!(sh.hs[0].b.held(publ.conn));
    assert_eq!(sh.hs[1].b.metrics().dropped_total(), 0);
    assert_eq!(sh.out(sub).publishes().len(), 40);
}

#[test]
fn a_full_window_holds_the_publisher_until_the_peer_confirms() {
    let mut sh = Shards::with(
        2,
        Config {
            sys_interval: 0,
            max_online_queued_bytes: 64 * 1024 * 1024,
            ..Config::default()
        },
    );
    let sub = sh.client_on(1, "reader");
    sh.subscribe(sub, "t", QoS::AtMostOnce);
    let publ = sh.client_on(0, "writer");
    let big = "x".repeat(1000);
    // The peer confirms nothing until its queue moves: about one window
    // crosses, then the publisher is held.
    let mut sent = 0u64;
    while !sh.hs[0].b.held(publ.conn) {
        assert!(sent < 2000, "never held");
        sh.publish_only(publ, "t", &big, QoS::AtMostOnce, 0);
        sent += 1;
    }
    let per = 1001;
    assert_eq!(sent, crate::core::peer::WINDOW / per + 1);
    assert_eq!(sh.hs[0].b.metrics().peer_throttles, 1);
    // The peer handles them and confirms: read again, nothing dropped.
    sh.pump();
    assert!(!sh.hs[0].b.held(publ.conn));
    assert_eq!(sh.out(sub).publishes().len() as u64, sent);
    assert_eq!(sh.hs[1].b.metrics().dropped_total(), 0);
}

#[test]
fn a_leaving_shared_member_hands_over_to_a_member_on_another_shard() {
    let mut sh = Shards::new(2);
    let a = sh.client_on(0, "a");
    let b = sh.client_on(1, "b");
    sh.subscribe(a, "$share/g/t", QoS::AtLeastOnce);
    sh.subscribe(b, "$share/g/t", QoS::AtLeastOnce);
    let publ = sh.client_on(0, "pub");
    for i in 0..4u16 {
        sh.publish(publ, "t", &i.to_string(), QoS::AtLeastOnce, i + 1);
    }
    let got_a = sh.out(a).payloads();
    let got_b = sh.out(b).payloads();
    assert_eq!(got_a.len() + got_b.len(), 4);
    assert!(!got_a.is_empty() && !got_b.is_empty());
    // a leaves its group without acknowledging: its messages go to b.
    sh.hs[0].send(
        a.conn,
        Packet::Unsubscribe(zerofan_codec::Unsubscribe {
            packet_id: 9,
            properties: Default::default(),
            filters: vec![s("$share/g/t")],
        }),
    );
    sh.pump();
    assert_eq!(sh.out(b).payloads(), got_a);
}

#[test]
fn a_suback_waits_until_every_shard_routes_the_filter() {
    let mut sh = Shards::new(3);
    let sub = sh.client_on(2, "sub");
    let out = sh.hs[2].subscribe(sub.conn, "fresh/#", opts(QoS::AtLeastOnce));
    assert!(
        out.packets.is_empty(),
        "SUBACK before the other shards know: {:?}",
        out.packets
    );
    sh.pump();
    let out = sh.out(sub);
    assert!(
        matches!(out.packets.as_slice(), [Packet::SubAck(_)]),
        "{:?}",
        out.packets
    );
    // Told "subscribed": a publish at any shard now arrives.
    let publ = sh.client_on(0, "pub");
    sh.publish_only(publ, "fresh/1", "after suback", QoS::AtMostOnce, 0);
    sh.pump();
    assert_eq!(sh.out(sub).payloads(), ["after suback"]);
    // A second subscriber of the same filter on that shard waits for nobody.
    let again = sh.client_on(2, "again");
    let out = sh.hs[2].subscribe(again.conn, "fresh/#", opts(QoS::AtMostOnce));
    assert!(matches!(out.packets.as_slice(), [Packet::SubAck(_)]));
}

#[test]
fn a_deferred_suback_replays_what_another_shard_retained_meanwhile() {
    let mut sh = Shards::new(2);
    let sub = sh.client_on(1, "sub");
    let out = sh.hs[1].subscribe(sub.conn, "race/#", opts(QoS::AtLeastOnce));
    assert!(out.packets.is_empty(), "SUBACK waits for shard 0");
    // Shard 0 does not know of the subscription yet: the retained message
    // reaches shard 1 only as its retained copy, not as a live delivery.
    let publ = sh.client_on(0, "pub");
    let mut p = publish("race/x", "kept", QoS::AtMostOnce, 0);
    p.retain = true;
    sh.hs[0].send(publ.conn, Packet::Publish(p));
    sh.pump();
    let out = sh.out(sub);
    assert!(
        matches!(out.packets.first(), Some(Packet::SubAck(_))),
        "{:?}",
        out.packets
    );
    assert_eq!(out.payloads(), ["kept"], "the retained message is replayed");
}

#[test]
fn a_retained_publish_is_acknowledged_once_every_shard_has_it() {
    let mut sh = Shards::new(2);
    let publ = sh.client_on(0, "pub");
    let mut p = publish("r/x", "v", QoS::AtLeastOnce, 7);
    p.retain = true;
    sh.hs[0].send(publ.conn, Packet::Publish(p));
    assert!(
        sh.out(publ).packets.is_empty(),
        "PUBACK before shard 1 has it"
    );
    sh.pump();
    assert!(matches!(sh.out(publ).packets.as_slice(), [Packet::PubAck(a)] if a.packet_id == 7));
    assert_eq!(sh.hs[1].b.retained_count(), 1);
}

#[test]
fn shard_of_is_stable_and_spreads() {
    assert_eq!(shard_of(b"client-1", 4), shard_of(b"client-1", 4));
    let mut per = [0; 4];
    for i in 0..400 {
        per[shard_of(format!("c{i}").as_bytes(), 4)] += 1;
    }
    assert!(per.iter().all(|&n| n > 60), "{per:?}");
    assert_eq!(shard_of(b"anything", 1), 0);
}

#[test]
fn subscriptions_a_core_had_before_it_was_peered_are_announced() {
    // As after a restart: the store restores persistent sessions and their
    // subscriptions into each core before the shell makes them shards.
    let cfg = Config {
        sys_interval: 0,
        ..Config::default()
    };
    let mut far = H::with(cfg.clone());
    let sub = far.client("restored");
    far.subscribe(sub, "r/#", opts(QoS::AtLeastOnce));
    far.out(sub);
    let mut sh = Shards {
        hs: vec![H::with(cfg), far],
        in_flight: Default::default(),
    };
    let ids = [PeerId(0), PeerId(1)];
    for (i, h) in sh.hs.iter_mut().enumerate() {
        h.b.set_peers(ids[i], &ids);
    }
    sh.pump();
    let publ = sh.client_on(0, "pub");
    sh.publish(publ, "r/1", "after restart", QoS::AtLeastOnce, 1);
    let c = Cx {
        shard: 1,
        conn: sub,
    };
    assert_eq!(sh.out(c).payloads(), vec!["after restart"]);
}

#[test]
fn a_retained_message_the_broker_publishes_itself_is_kept_by_every_shard() {
    // A bridge's state (`$SYS/broker/connection/{name}/state`) is published
    // once per change, on shard 0: a subscriber on another shard that
    // subscribes later must still find it.
    let mut sh = Shards::new(2);
    let now = sh.hs[0].now;
    sh.hs[0]
        .b
        .publish_own(now, "$SYS/broker/connection/edge/state", "1".into());
    sh.pump();
    let late = sh.client_on(1, "late");
    let out = sh.subscribe(late, "$SYS/broker/connection/+/state", QoS::AtMostOnce);
    assert_eq!(out.payloads(), vec!["1"]);
}

#[test]
fn a_core_is_caught_up_once_every_shard_applied_what_it_restored() {
    // The shell's listeners serve only once every shard is (see
    // `shards::Mesh::started`): a publish accepted before could miss a
    // session restored on another shard.
    let cfg = Config {
        sys_interval: 0,
        ..Config::default()
    };
    let mut far = H::with(cfg.clone());
    let sub = far.client("restored");
    far.subscribe(sub, "r/#", opts(QoS::AtLeastOnce));
    far.out(sub);
    let mut sh = Shards {
        hs: vec![H::with(cfg), far],
        in_flight: Default::default(),
    };
    let ids = [PeerId(0), PeerId(1)];
    for (i, h) in sh.hs.iter_mut().enumerate() {
        h.b.set_peers(ids[i], &ids);
    }
    sh.poll();
    assert!(sh.hs[0].b.peers_caught_up(), "nothing to announce");
    assert!(
        !sh.hs[1].b.peers_caught_up(),
        "announced, not applied by shard 0 yet"
    );
    sh.pump();
    assert!(sh.hs[1].b.peers_caught_up());
    assert!(sh.hs[0].b.peers_caught_up());
}

#[test]
fn a_connection_awaits_its_peers_until_its_deferred_suback_goes() {
    // The shell does not park a connection meanwhile: its quick park is
    // for after the SUBACK.
    let mut sh = Shards::new(2);
    let sub = sh.client_on(1, "sub");
    let idle = sh.client_on(1, "idle");
    let out = sh.hs[1].subscribe(sub.conn, "w/#", opts(QoS::AtLeastOnce));
    assert!(out.packets.is_empty(), "SUBACK waits for shard 0");
    assert!(sh.hs[1].b.awaits_peers(sub.conn));
    assert!(!sh.hs[1].b.awaits_peers(idle.conn));
    sh.pump();
    assert!(matches!(
        sh.out(sub).packets.as_slice(),
        [Packet::SubAck(_)]
    ));
    assert!(!sh.hs[1].b.awaits_peers(sub.conn));
}

/// A client that pipelines SUBSCRIBEs of new filters while the other
/// shards have not answered cannot grow the queue of SUBACKs waiting for
/// them without bound: at `DEFERRED_PER_CONN` its input is held (counted
/// once), and read again once they go.
#[test]
fn too_many_subacks_waiting_for_the_peers_hold_the_connection() {
    use crate::core::peer::DEFERRED_PER_CONN;
    let mut sh = Shards::new(2);
    let sub = sh.client_on(1, "sub");
    let n = DEFERRED_PER_CONN as usize;
    for i in 0..n - 1 {
        let out = sh.hs[1].subscribe(sub.conn, &format!("f/{i}"), opts(QoS::AtMostOnce));
        assert!(
            out.packets.is_empty(),
            "SUBACK {i} before the other shard knew"
        );
    }
    assert!(!sh.hs[1].b.held(sub.conn), "held below the bound");
    sh.hs[1].subscribe(sub.conn, "f/last", opts(QoS::AtMostOnce));
    assert!(sh.hs[1].b.held(sub.conn), "not held at the bound");
    assert_eq!(sh.hs[1].b.metrics().peer_deferred_holds, 1);
    sh.pump();
    assert!(!sh.hs[1].b.held(sub.conn), "still held once answered");
    let subacks = sh
        .out(sub)
        .packets
        .iter()
        .filter(|p| matches!(p, Packet::SubAck(_)))
        .count();
    assert_eq!(subacks, n, "every SUBACK went");
}

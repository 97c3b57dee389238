//! Messages published while a session's owner is away (`core/strand.rs`):
//! node 0 owns "s", subscribed to "t" at QoS 1, offline, and dies; the
//! others publish before and after "s" is served again elsewhere.

use super::*;

/// "s" on node 0, subscribed to "t", offline; node 0 is then killed (the
/// others mark it away, as their links do after 2 s).
fn owner_lost(cl: &mut Cluster) {
    cl.offline_at(0, "s", 0, "t");
    cl.kill(0);
}

/// Node 0 cut off and marked away by the others (not killed); node 1's
/// clean publisher sends "while-away" to "t", acknowledged.
fn published_while_node_0_away(cl: &mut Cluster) {
    for i in 1..3 {
        cl.hs[i].b.set_peer_away(remote(0), true);
        cl.linked[i][0] = false;
        cl.linked[0][i] = false;
    }
    let (p1, _) = cl.connect(1, "p1", Protocol::V5, true, 0);
    cl.send(
        p1,
        Packet::Publish(publish("t", "while-away", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(acks(&cl.out(p1)), [(1, "puback")]);
}

/// "s"'s client back at `node` (its session there): every payload it
/// gets, acknowledging as it goes.
fn back_at(cl: &mut Cluster, node: usize) -> Vec<String> {
    let (s, out) = cl.persistent(node, "s");
    assert!(present(&out));
    let mut all = out;
    all.packets.extend(cl.out(s).packets);
    drain(cl, s, all)
}

/// Every payload `s` gets, acknowledging as it goes.
fn drain(cl: &mut Cluster, s: Cx, mut out: Out) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..10 {
        let ps = out.publishes();
        if ps.is_empty() {
            break;
        }
        for p in ps {
            got.push(String::from_utf8_lossy(&p.payload).into_owned());
            cl.send(s, Packet::PubAck(ack(p.packet_id)));
        }
        out = cl.out(s);
    }
    got
}

/// Acknowledged while the owner was away, by publishers on both other
/// nodes: the copies took the messages, so the node the client comes back
/// to delivers them. Before, the owner alone was sent them: lost.
#[test]
fn a_message_acknowledged_while_the_owner_is_away_reaches_its_session_elsewhere() {
    let mut cl = Cluster::new(3, 3);
    owner_lost(&mut cl);
    let (p1, _) = cl.connect(1, "p1", Protocol::V5, true, 0);
    cl.send(
        p1,
        Packet::Publish(publish("t", "from-1", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(acks(&cl.out(p1)), [(1, "puback")]);
    let (p2, _) = cl.connect(2, "p2", Protocol::V5, true, 0);
    cl.send(
        p2,
        Packet::Publish(publish("t", "from-2", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(acks(&cl.out(p2)), [(1, "puback")]);
    for h in &cl.hs[1..] {
        assert_eq!(h.b.metrics().stranded_sent, 1);
        // Its own message and the other node's, in its copy of "s".
        assert_eq!(h.b.metrics().stranded_kept, 2);
    }

    let (s, out) = cl.persistent(1, "s");
    assert!(present(&out));
    let mut all = out;
    all.packets.extend(cl.out(s).packets);
    assert_eq!(drain(&mut cl, s, all), ["from-1", "from-2"]);

    // Served on node 1 now: node 2's next message reaches it once.
    cl.send(
        p2,
        Packet::Publish(publish("t", "after", QoS::AtLeastOnce, 2)),
    );
    assert_eq!(acks(&cl.out(p2)), [(2, "puback")]);
    let out = cl.out(s);
    assert_eq!(drain(&mut cl, s, out), ["after"]);
}

/// What is stranded for a dead owner's session stays within the
/// session's queue bound in its copies: acknowledged all the same (the
/// owner would have left it out too), counted, and the session served
/// elsewhere gets the first `max_queued_messages`.
#[test]
fn a_dead_owners_copies_keep_to_the_queue_bound() {
    let mut cl = Cluster::with(3, 3, || Config {
        max_queued_messages: 2,
        ..Config::default()
    });
    owner_lost(&mut cl);
    let (p1, _) = cl.connect(1, "p1", Protocol::V5, true, 0);
    for (pid, text) in (1..).zip(["m1", "m2", "m3", "m4"]) {
        cl.send(
            p1,
            Packet::Publish(publish("t", text, QoS::AtLeastOnce, pid)),
        );
        assert_eq!(acks(&cl.out(p1)), [(pid, "puback")]);
    }
    for h in &cl.hs[1..] {
        assert_eq!(h.b.metrics().stranded_kept, 2);
        assert_eq!(h.b.metrics().stranded_dropped, 2);
    }
    assert_eq!(back_at(&mut cl, 2), ["m1", "m2"]);
}

/// The client is back on node 2 before node 1 learns its subscription is
/// there: node 1 strands its message for node 0's sessions, and node 2
/// queues it for the session it took from node 0, once. The
/// acknowledgement waits for node 2.
#[test]
fn a_session_taken_from_an_away_owner_gets_what_others_strand_for_it_once() {
    let mut cl = Cluster::new(3, 3);
    owner_lost(&mut cl);
    let (p1, _) = cl.connect(1, "p1", Protocol::V5, true, 0);
    // What node 2 writes for node 1 (its subscription, its answers) waits.
    cl.linked[2][1] = false;
    let (s, out) = cl.persistent(2, "s");
    assert!(present(&out));
    cl.send(
        p1,
        Packet::Publish(publish("t", "early", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(acks(&cl.out(p1)), [], "node 2 has not confirmed");
    let out = cl.out(s);
    assert_eq!(drain(&mut cl, s, out), ["early"]);
    assert_eq!(cl.hs[2].b.metrics().stranded_queued, 1);
    cl.linked[2][1] = true;
    cl.pump();
    assert_eq!(acks(&cl.out(p1)), [(1, "puback")]);

    // Node 1 knows the subscription is on node 2 now: sent there directly
    // (and stranded for node 0 still), delivered once.
    cl.send(
        p1,
        Packet::Publish(publish("t", "late", QoS::AtLeastOnce, 2)),
    );
    assert_eq!(acks(&cl.out(p1)), [(2, "puback")]);
    let out = cl.out(s);
    assert_eq!(drain(&mut cl, s, out), ["late"]);
    assert_eq!(cl.hs[2].b.metrics().stranded_queued, 1);
}

/// QoS 0 is not kept for an absent client, nor is a message nobody on the
/// away node subscribed to stranded.
#[test]
fn only_what_the_away_nodes_subscribers_want_is_stranded() {
    let mut cl = Cluster::new(3, 3);
    owner_lost(&mut cl);
    let (p1, _) = cl.connect(1, "p1", Protocol::V5, true, 0);
    cl.send(p1, Packet::Publish(publish("t", "q0", QoS::AtMostOnce, 0)));
    cl.send(
        p1,
        Packet::Publish(publish("u", "other", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(acks(&cl.out(p1)), [(1, "puback")]);
    assert_eq!(cl.hs[1].b.metrics().stranded_sent, 0);
    assert_eq!(cl.hs[2].b.metrics().stranded_kept, 0);
}

/// The owner comes back restarted (its links' queues lost) still owning
/// the session: what was stranded for it meanwhile is sent to it again,
/// and its client finds it there. Before, the owner's full copies then
/// replaced the ones that held it: lost. A session it serves from a copy
/// by then ("x", from node 2) had the message in that copy: not again.
#[test]
fn an_owner_back_restarted_gets_again_what_was_stranded_for_it() {
    let mut cl = Cluster::new(3, 3);
    let (s, _) = cl.persistent(0, "s");
    cl.hs[0].subscribe(s.conn, "t", opts(QoS::AtLeastOnce));
    let (x, _) = cl.persistent(2, "x");
    cl.hs[2].subscribe(x.conn, "t", opts(QoS::AtLeastOnce));
    cl.pump();
    cl.lose(s);
    cl.lose(x);
    published_while_node_0_away(&mut cl);

    // Back restarted: what the links held for it is gone. "x" moves to
    // it first, then the others find it new to their links (its full
    // state from them, `peer_joined`) and read its (`peer_reset`).
    for i in 1..3 {
        cl.wires[i][0].clear();
        cl.linked[i][0] = true;
        cl.linked[0][i] = true;
        cl.hs[i].b.set_peer_away(remote(0), false);
    }
    cl.pump();
    let (x, out) = cl.persistent(0, "x");
    assert!(present(&out));
    let mut all = out;
    all.packets.extend(cl.out(x).packets);
    assert_eq!(drain(&mut cl, x, all), ["while-away"]);
    for i in 1..3 {
        cl.hs[i].b.peer_joined(remote(0));
        cl.hs[i].b.peer_reset(remote(0));
    }
    cl.pump();
    assert_eq!(back_at(&mut cl, 0), ["while-away"]);
    let out = cl.out(x);
    assert_eq!(drain(&mut cl, x, out), Vec::<String>::new(), "had it");
    assert_eq!(cl.hs[1].b.metrics().stranded_resent, 1);
}

/// Node 0 is cut off from both others while its own publisher's message
/// for its own persistent session waits for the replicas; they go away
/// (2 s): the message is on node 0's disk only. Not acknowledged until a
/// renewal of its lease sent after that confirms it is not the one cut
/// off; when the lease is lost instead (its sessions go elsewhere),
/// refused. Before, acknowledged when the replicas went away.
#[test]
fn a_node_cut_off_acknowledges_nothing_its_replicas_lack() {
    for renewed in [true, false] {
        let mut cl = Cluster::new(3, 3);
        let now = cl.hs[0].now;
        cl.hs[0]
            .b
            .cluster_lease_until(now, now, now + Duration::from_millis(2500));
        let (s, _) = cl.persistent(0, "s");
        cl.hs[0].subscribe(s.conn, "t", opts(QoS::AtLeastOnce));
        cl.pump();
        cl.lose(s);
        let (p, _) = cl.connect(0, "p", Protocol::V5, true, 0);
        for i in 1..3 {
            cl.cut(0, i, true);
        }
        cl.send(p, Packet::Publish(publish("t", "m", QoS::AtLeastOnce, 1)));
        assert_eq!(acks(&cl.out(p)), [], "waits for the replicas");
        for i in 1..3 {
            cl.hs[0].b.set_peer_away(remote(i), true);
        }
        assert_eq!(acks(&cl.out(p)), [], "replicas away: waits for the lease");
        assert!(cl.hs[0].b.metrics().replica_waits_skipped > 0);
        let later = now + Duration::from_millis(300);
        if renewed {
            cl.hs[0]
                .b
                .cluster_lease_until(later, later, later + Duration::from_millis(2500));
            assert_eq!(acks(&cl.out(p)), [(1, "puback")]);
        } else {
            cl.hs[0].b.cluster_lease(later, false);
            let out = cl.out(p);
            assert_eq!(acks(&out), []);
            assert_eq!(out.disconnect(), Some(ReasonCode::UNSPECIFIED_ERROR));
            assert_eq!(cl.hs[0].b.metrics().acks_refused, 1);
        }
    }
}

/// Node 2 is away from node 0, so node 0 strands its publisher's message
/// (node 2's "s2" matches) and sends it to node 1 for "s" as well; node 1's
/// link is down (its queue full: congested) but node 1 not yet away. When
/// node 1 goes away without confirming it, the acknowledgement is refused.
/// Before, a congested peer was not counted as crossed on this path, so
/// nothing was refused and the publisher was acknowledged a message that
/// neither node 1 nor any copy of "s" had (the long run's loss around a
/// cut: 6 messages at s3b, 78b5a54 seed 1).
#[test]
fn a_stranded_message_to_a_congested_node_that_goes_away_is_refused() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(1, "s", 1, "t");
    cl.offline_at(2, "s2", 1, "t");
    cl.hs[0].b.set_peer_away(remote(2), true);
    cl.cut(0, 2, true);
    cl.cut(0, 1, true);
    cl.hs[0].b.set_peer_congested(remote(1), true);
    let (p, _) = cl.connect(0, "p", Protocol::V5, true, 0);
    cl.send(p, Packet::Publish(publish("t", "m", QoS::AtLeastOnce, 1)));
    assert_eq!(acks(&cl.out(p)), [], "waits for node 1");
    cl.hs[0].b.set_peer_away(remote(1), true);
    assert_refused(&mut cl, p);
}

/// The other side of the test above: node 2, away (its link down, so
/// congested too), is sent the stranded message for its own "s2", which
/// is kept for it here and in the copies. When its link comes back (it
/// restarted) and it is marked away again before node 1 confirms, nothing
/// is refused: the message was never its to confirm. Counting every
/// stranded crossing as durable (affe526) refused this publisher in the
/// rejoin test of `tests/interop/test_cluster.py`.
#[test]
fn a_stranded_message_to_an_away_node_is_not_refused_for_it_later() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(1, "s", 1, "t");
    cl.offline_at(2, "s2", 1, "t");
    cl.hs[0].b.set_peer_away(remote(2), true);
    cl.cut(0, 2, true);
    cl.hs[0].b.set_peer_congested(remote(2), true);
    let (p, _) = cl.connect(0, "p", Protocol::V5, true, 0);
    cl.cut(0, 1, true);
    cl.send(p, Packet::Publish(publish("t", "m", QoS::AtLeastOnce, 1)));
    assert_eq!(acks(&cl.out(p)), [], "waits for node 1");
    cl.hs[0].b.set_peer_congested(remote(2), false);
    cl.hs[0].b.peer_reset(remote(2));
    cl.hs[0].b.set_peer_away(remote(2), false);
    cl.hs[0].b.set_peer_away(remote(2), true);
    assert_eq!(cl.hs[0].b.metrics().acks_refused, 0);
    cl.cut(0, 1, false);
    cl.pump();
    let out = cl.out(p);
    assert_eq!(acks(&out), [(1, "puback")]);
    assert!(!out.closed);
}

/// The owner comes back without a restart: its link brings it what was
/// stranded for it, which is not kept for later. A restart after that
/// sends it nothing again (its session may have left and come back since:
/// it would get old messages twice).
#[test]
fn an_owner_back_on_the_same_link_is_not_sent_it_again_later() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(0, "s", 0, "t");
    published_while_node_0_away(&mut cl);
    for i in 1..3 {
        cl.linked[i][0] = true;
        cl.linked[0][i] = true;
        cl.hs[i].b.peer_resumed(remote(0));
        cl.hs[i].b.set_peer_away(remote(0), false);
    }
    cl.pump();
    for i in 1..3 {
        cl.hs[i].b.peer_joined(remote(0));
    }
    cl.pump();
    assert_eq!(cl.hs[1].b.metrics().stranded_resent, 0);
    let (s, out) = cl.persistent(0, "s");
    let mut all = out;
    all.packets.extend(cl.out(s).packets);
    assert_eq!(drain(&mut cl, s, all), ["while-away"]);
}

/// Node 0 was paused, not dead: node 1's message was stranded in the
/// copies of "s" while node 0 was away. Node 0 wakes, reads the message
/// from its link, queues it in "s" and replicates that; then it dies. The
/// client comes back on node 2: once. Before, node 2's copy held the
/// message twice, stranded and as node 0's own, and delivered it twice.
#[test]
fn a_message_an_owner_queued_itself_after_waking_is_not_delivered_twice() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(0, "s", 0, "t");
    published_while_node_0_away(&mut cl);
    assert_eq!(cl.hs[2].b.metrics().stranded_kept, 1);
    // Awake: its links bring it what waited; it replicates its entry.
    for i in 1..3 {
        cl.linked[i][0] = true;
        cl.linked[0][i] = true;
    }
    cl.pump();
    cl.kill(0);
    assert_eq!(back_at(&mut cl, 2), ["while-away"]);
    for i in 1..3 {
        assert_eq!(cl.hs[i].b.metrics().stranded_replaced, 1, "node {i}");
    }
}

/// The other order: node 0's entry reaches node 2 before node 1's
/// stranded message does (node 1's link to node 2 is slow). Node 2 does
/// not queue it again in the copy that has it.
#[test]
fn a_message_stranded_after_the_owner_replicated_it_is_not_queued_again() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(0, "s", 0, "t");
    // Node 1 sees node 0 away, though its link still carries.
    cl.hs[1].b.set_peer_away(remote(0), true);
    cl.linked[1][2] = false;
    let (p1, _) = cl.connect(1, "p1", Protocol::V5, true, 0);
    cl.send(
        p1,
        Packet::Publish(publish("t", "while-away", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(acks(&cl.out(p1)), [], "node 2 has not confirmed");
    cl.linked[1][2] = true;
    cl.pump();
    assert_eq!(acks(&cl.out(p1)), [(1, "puback")]);
    cl.kill(0);
    assert_eq!(back_at(&mut cl, 2), ["while-away"]);
    assert_eq!(cl.hs[2].b.metrics().stranded_kept, 0);
}

/// A node that sees every other node away is the one cut off: it strands
/// nothing (its copies would reach the others when the cut heals, stale
/// extras in the copies of sessions served all along).
#[test]
fn a_node_that_sees_everyone_away_strands_nothing() {
    let mut cl = Cluster::new(3, 3);
    let (s, _) = cl.persistent(1, "s");
    cl.hs[1].subscribe(s.conn, "t", opts(QoS::AtLeastOnce));
    cl.pump();
    let (p, _) = cl.connect(0, "p", Protocol::V5, true, 0);
    for i in 1..3 {
        cl.away(0, i, true);
    }
    cl.send(p, Packet::Publish(publish("t", "m", QoS::AtLeastOnce, 1)));
    assert_eq!(cl.hs[0].b.metrics().stranded_sent, 0);
    for i in 1..3 {
        cl.away(0, i, false);
    }
    assert_eq!(cl.hs[2].b.metrics().stranded_kept, 0);
}

/// "s" on node 0 (claimed under epoch 1, subscribed to "t", its client
/// online), node 0's lease running out in 2.5 s, and a clean publisher
/// "p" on node 1.
fn leased_owner(cl: &mut Cluster) -> (Cx, Cx) {
    let now = cl.hs[0].now;
    cl.hs[0]
        .b
        .cluster_lease_until(now, now, now + Duration::from_millis(2500));
    let (s, _) = cl.persistent_at(0, "s", 1);
    cl.hs[0].subscribe(s.conn, "t", opts(QoS::AtLeastOnce));
    cl.pump();
    let (p, _) = cl.connect(1, "p", Protocol::V5, true, 0);
    (s, p)
}

/// Node 0 paused (what it is sent waits on its links; the others mark it
/// away), or awake again (`false`: it reads its links, past its lease).
fn node_0_paused(cl: &mut Cluster, paused: bool) {
    if !paused {
        cl.hs[0].advance(Duration::from_secs(3));
    }
    for i in 1..3 {
        cl.linked[i][0] = !paused;
        cl.linked[0][i] = !paused;
        if paused {
            cl.hs[i].b.set_peer_away(remote(0), true);
        }
    }
    cl.pump();
}

/// The others read node 0 again: back on the same link.
fn node_0_back(cl: &mut Cluster) {
    for i in 1..3 {
        cl.hs[i].b.peer_resumed(remote(0));
        cl.hs[i].b.set_peer_away(remote(0), false);
    }
    cl.pump();
}

/// `p` publishes `payload` to "t" at QoS 1 with packet id `id`,
/// acknowledged.
fn publish_acked(cl: &mut Cluster, p: Cx, payload: &str, id: u16) {
    cl.send(
        p,
        Packet::Publish(publish("t", payload, QoS::AtLeastOnce, id)),
    );
    assert_eq!(acks(&cl.out(p)), [(id, "puback")]);
}

/// "s"'s client back at node 1, whose claim (node 0's at epoch 1 before
/// it) asks the other nodes for a copy.
fn asking_at_node_1(cl: &mut Cluster) -> (ConnId, PreviousOwner) {
    let conn = cl.persistent_waiting(1, "s");
    let prev = prev_owner(0, 1);
    cl.hs[1].b.ask_for_copy(conn, &prev);
    (conn, prev)
}

/// The claim of `conn` at node 1, from node 0 (epoch 1), is granted: the
/// session served there, and what it gets at once.
fn claimed_at_node_1(cl: &mut Cluster, conn: ConnId) -> (Cx, Vec<String>) {
    let s1 = cl.granted(1, conn, 2, prev_owner(0, 1));
    let out = cl.out(s1);
    assert!(present(&out));
    (s1, drain(cl, s1, out))
}

/// Node 0 owns "s" and is paused past its lease: the others mark it away
/// and strand node 1's "m1" for "s". It wakes, drops its client at its
/// first event, reads "m1" from its link and replicates its entry (the
/// copies drop their stranded one); the others mark it back, and node 1's
/// "m2" goes to it plainly. The client reconnects to node 1, which takes
/// the session over from node 0 (alive: its handover mark first) while
/// node 1's publisher goes on: each message once.
#[test]
fn a_session_taken_from_an_owner_woken_from_a_pause_has_everything_once() {
    let mut cl = Cluster::new(3, 3);
    let (s, p) = leased_owner(&mut cl);
    node_0_paused(&mut cl, true);
    publish_acked(&mut cl, p, "m1", 1);
    node_0_paused(&mut cl, false);
    assert!(cl.hs[0].out(s.conn).closed, "dropped past the lease");
    for i in 1..3 {
        assert_eq!(cl.hs[i].b.metrics().stranded_replaced, 1, "node {i}");
    }
    node_0_back(&mut cl);
    publish_acked(&mut cl, p, "m2", 2);

    let conn = cl.persistent_waiting(1, "s");
    publish_acked(&mut cl, p, "m3", 3);
    let now = cl.hs[0].now;
    cl.hs[0].b.client_taken_by(now, "s", Some(remote(1)));
    cl.send(p, Packet::Publish(publish("t", "m4", QoS::AtLeastOnce, 4)));
    assert!(
        !cl.hs[1].b.awaits_handover(conn, &prev_owner(0, 1)),
        "handed over"
    );
    let (s1, mut got) = claimed_at_node_1(&mut cl, conn);
    assert_eq!(acks(&cl.out(p)), [(4, "puback")]);
    let more = cl.out(s1);
    got.extend(drain(&mut cl, s1, more));
    assert_eq!(got, ["m1", "m2", "m3", "m4"]);
}

/// As above, but the client comes back on node 1 while node 0 is still
/// paused: node 1 serves "s" from its copy at once (node 0 away), and node
/// 0 wakes after that, reads what waited on its links and learns it lost
/// the client id. Each message once, those published before, during and
/// after the pause.
#[test]
fn a_session_taken_while_its_owner_is_paused_has_everything_once() {
    let mut cl = Cluster::new(3, 3);
    let (s, p) = leased_owner(&mut cl);
    publish_acked(&mut cl, p, "m0", 1);
    let out = cl.out(s);
    assert_eq!(drain(&mut cl, s, out), ["m0"]);
    node_0_paused(&mut cl, true);
    publish_acked(&mut cl, p, "m1", 2);

    // Its lease ran out; the client is back on node 1, which needs no mark
    // from an away owner and serves its copy.
    let conn = cl.persistent_waiting(1, "s");
    assert!(
        !cl.hs[1].b.awaits_handover(conn, &prev_owner(0, 1)),
        "node 0 is away"
    );
    let (s1, mut got) = claimed_at_node_1(&mut cl, conn);
    publish_acked(&mut cl, p, "m2", 3);

    node_0_paused(&mut cl, false);
    let now = cl.hs[0].now;
    cl.hs[0].b.client_taken_by(now, "s", Some(remote(1)));
    cl.pump();
    node_0_back(&mut cl);
    publish_acked(&mut cl, p, "m3", 4);
    let more = cl.out(s1);
    got.extend(drain(&mut cl, s1, more));
    assert_eq!(got, ["m1", "m2", "m3"]);
}

/// Node 0 owns "s" and is paused past its lease; node 1's "m1" is
/// stranded for "s". Node 0 wakes and, before it reads its links, finds
/// them stuck (nothing acknowledged for the length of the pause, as the
/// shell's `watch_acks` sees it), marks the others away and back, and so
/// sends them its full images, which lack "m1". The client comes back on
/// node 1 while node 0 is still away there: node 1 serves its copy. Node 0
/// learns it lost "s" before it reads "m1", which it has no session for.
#[test]
fn a_full_image_from_a_woken_owner_keeps_what_was_stranded_for_it() {
    let mut cl = Cluster::new(3, 3);
    let (s, p) = leased_owner(&mut cl);
    node_0_paused(&mut cl, true);
    publish_acked(&mut cl, p, "m1", 1);

    // Awake: what node 0 writes flows, what waits for it is not read yet.
    cl.hs[0].advance(Duration::from_secs(3));
    for i in 1..3 {
        cl.linked[0][i] = true;
        cl.hs[0].b.set_peer_away(remote(i), true);
        cl.hs[0].b.set_peer_away(remote(i), false);
    }
    cl.pump();
    let _ = cl.hs[0].out(s.conn);

    let conn = cl.persistent_waiting(1, "s");
    let (s1, mut got) = claimed_at_node_1(&mut cl, conn);
    let now = cl.hs[0].now;
    cl.hs[0].b.client_taken_by(now, "s", Some(remote(1)));
    cl.pump();
    for i in 1..3 {
        cl.linked[i][0] = true;
    }
    cl.pump();
    node_0_back(&mut cl);
    publish_acked(&mut cl, p, "m2", 2);
    let more = cl.out(s1);
    got.extend(drain(&mut cl, s1, more));
    assert_eq!(got, ["m1", "m2"]);
}

const UNBOUNDED: QueueBound = QueueBound {
    messages: usize::MAX,
    bytes: usize::MAX,
    drop_oldest: false,
};

/// Client "c" subscribes to "t" at QoS 1.
fn c_subscribes_to_t() -> ReplOp {
    ReplOp::Subscribe {
        client: "c".into(),
        filter: "t".into(),
        options: SubOptions {
            qos: 1,
            ..SubOptions::default()
        },
        id: None,
    }
}

/// A copy of "c" subscribed to "t" whose owner queued `queued` messages,
/// then each of `stranded` stranded in it within `bound`: what the copy
/// then holds, and what the strands left out or dropped.
fn stranded_within(bound: QueueBound, queued: &[&str], stranded: &[&str]) -> (Vec<String>, usize) {
    let (mut d, _) = counted(Log::default());
    let mut images = Images::default();
    let mut ops = vec![session_op(), c_subscribes_to_t()];
    for (i, text) in (1..).zip(queued) {
        ops.push(op_message(i, text, 1));
        ops.push(op_enqueue(i, i, 1));
    }
    images.apply_durable(OWNER, ops, 0, &mut d);
    let mut dropped = 0;
    for text in stranded {
        let done = images.strand(OWNER, stored(text, 1), None, 0, bound, &mut d);
        assert_eq!(done.errors, 0);
        dropped += done.dropped;
    }
    let mut disk = Disk::new(&mut d);
    let held = shape(&images.take("c", &mut disk).expect("image")).0;
    (held, dropped)
}

/// A copy keeps its stranded entries within the session's queue bounds:
/// past them the new message is left out, or with drop_oldest the oldest
/// stranded entries make room; the owner's own entries stay. Before, a
/// dead owner's copies grew to the images' byte cap (256 MiB) whatever
/// `max_queued_messages` said.
#[test]
fn a_copy_strands_within_the_sessions_queue_bounds() {
    let bound = |messages, bytes, drop_oldest| QueueBound {
        messages,
        bytes,
        drop_oldest,
    };
    // Each message is "t" and its payload: 3 bytes here.
    let (held, dropped) = stranded_within(bound(3, 1000, false), &["o1", "o2"], &["s1", "s2"]);
    assert_eq!(
        (held, dropped),
        (vec!["o1".into(), "o2".into(), "s1".into()], 1)
    );
    let (held, dropped) = stranded_within(bound(3, 1000, true), &["o1", "o2"], &["s1", "s2", "s3"]);
    assert_eq!(
        (held, dropped),
        (vec!["o1".into(), "o2".into(), "s3".into()], 2)
    );
    // The owner's entries fill it: nothing stranded fits, either way.
    for drop_oldest in [false, true] {
        let (held, dropped) = stranded_within(bound(2, 1000, drop_oldest), &["o1", "o2"], &["s1"]);
        assert_eq!((held, dropped), (vec!["o1".into(), "o2".into()], 1));
    }
    // Bytes bound too: 9 bytes hold three messages.
    let (held, dropped) = stranded_within(bound(100, 9, false), &["o1"], &["s1", "s2", "s3"]);
    assert_eq!(
        (held, dropped),
        (vec!["o1".into(), "s1".into(), "s2".into()], 1)
    );
    let (held, dropped) = stranded_within(bound(100, 9, true), &["o1"], &["s1", "s2", "s3"]);
    assert_eq!(
        (held, dropped),
        (vec!["o1".into(), "s2".into(), "s3".into()], 1)
    );
    // One message alone may pass the bytes bound, as in a session.
    let (held, dropped) = stranded_within(bound(100, 1, false), &[], &["s1", "s2"]);
    assert_eq!((held, dropped), (vec!["s1".into()], 1));
}

/// A full image from the owner replaces its copy here, but keeps the
/// stranded entries whose messages the owner had not read when it wrote
/// the image (marks past what it says it read); those it had read go, and
/// so do all of them when it says nothing. A kept entry keeps its mark:
/// the owner's own entry for that message, replicated later, replaces it.
#[test]
fn a_full_image_keeps_only_the_stranded_entries_its_owner_had_not_read() {
    use crate::core::strand::{Mark, MarksRead};
    let copy = |read: Option<MarksRead>| {
        let (mut d, _) = counted(Log::default());
        let mut images = Images::default();
        let subscribe = c_subscribes_to_t();
        images.apply_durable(OWNER, vec![session_op(), subscribe.clone()], 0, &mut d);
        for (seq, text) in [(5, "read"), (9, "unread")] {
            let mark = Some(Mark::new(2, seq));
            let done = images.strand(OWNER, stored(text, 1), mark, 0, UNBOUNDED, &mut d);
            assert_eq!(done.kept, 1);
        }
        let reset = ReplOp::Reset {
            client: "c".into(),
            meta: SessionMeta::default(),
            read,
        };
        images.apply_durable(OWNER, vec![reset, subscribe], 0, &mut d);
        (images, d)
    };
    let queue = |images: &mut Images, d: &mut Durable| {
        let mut disk = Disk::new(d);
        shape(&images.take("c", &mut disk).expect("image")).0
    };

    let (mut images, mut d) = copy(Some(MarksRead::new(vec![(2, 5)])));
    assert_eq!(images.take_unstranded(), (0, 1));
    assert_eq!(queue(&mut images, &mut d), ["unread"]);
    let (mut images, mut d) = copy(None);
    assert_eq!(queue(&mut images, &mut d), Vec::<String>::new());

    // The owner reads both after all and queues them: its entries, with
    // the same marks, replace the stranded ones.
    let (mut images, mut d) = copy(Some(MarksRead::new(vec![(1, 100)])));
    let mut ops = Vec::new();
    for (id, seq, text) in [(3, 5, "read"), (4, 9, "unread")] {
        ops.push(ReplOp::Message {
            id: MsgId(id),
            msg: stored(text, 1),
            mark: Some(Mark::new(2, seq)),
        });
        ops.push(op_enqueue(id + 10, id, 1));
    }
    images.apply_durable(OWNER, ops, 0, &mut d);
    assert_eq!(images.take_unstranded(), (2, 2), "both kept, then replaced");
    assert_eq!(queue(&mut images, &mut d), ["read", "unread"]);
}

/// Node 0 owns "s" and is paused; node 2 marks it away, node 1 does not
/// yet, and sends it node 1's "m" as usual, its PUBACK held for node 0's
/// answer. The client comes back on node 2, which serves its copy at once
/// (node 0 away there): "m" is not in it, nobody stranded it. Node 0
/// wakes, reads "m" into its own, now stale, "s" and replicates it; node
/// 2 calls that stale. Node 0 must then refuse node 1's fence, and node 1
/// its publisher: before, node 0 confirmed it and "m" was acknowledged
/// and lost.
#[test]
fn an_owner_told_stale_confirms_nothing_it_queued_in_that_session() {
    let mut cl = Cluster::new(3, 3);
    let (_s, p) = leased_owner(&mut cl);
    for i in 1..3 {
        cl.linked[i][0] = false;
        cl.linked[0][i] = false;
    }
    cl.hs[2].b.set_peer_away(remote(0), true);
    cl.pump();
    cl.send(p, Packet::Publish(publish("t", "m", QoS::AtLeastOnce, 1)));
    assert!(
        acks(&cl.out(p)).is_empty(),
        "acknowledged before node 0 has it"
    );

    let conn = cl.persistent_waiting(2, "s");
    let s2 = cl.granted(2, conn, 2, prev_owner(0, 1));
    let out = cl.out(s2);
    assert!(present(&out));
    assert!(out.publishes().is_empty(), "\"m\" was nowhere to take");

    node_0_paused(&mut cl, false);
    assert_refused(&mut cl, p);
}

/// Node 0 comes back restarted still owning "s", and hands it over to
/// node 1 (its client back there) before node 2 sends it again what node
/// 2 stranded for it meanwhile: node 0 relays it, as a match of the moving
/// session, and node 1, whose copy had it (the same mark), drops it.
/// Before, the client got it twice.
#[test]
fn a_message_sent_again_to_an_owner_that_handed_over_is_not_delivered_twice() {
    let mut cl = Cluster::new(3, 3);
    let (s0, _) = cl.persistent_at(0, "s", 1);
    cl.hs[0].subscribe(s0.conn, "t", opts(QoS::AtLeastOnce));
    cl.pump();
    cl.lose(s0);
    for i in 1..3 {
        cl.hs[i].b.set_peer_away(remote(0), true);
        cl.linked[i][0] = false;
        cl.linked[0][i] = false;
    }
    let (p2, _) = cl.connect(2, "p2", Protocol::V5, true, 0);
    cl.send(
        p2,
        Packet::Publish(publish("t", "while-away", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(acks(&cl.out(p2)), [(1, "puback")]);

    // Back restarted (what the links held for it gone), node 2's resend
    // not yet sent: "s" moves to node 1, which serves its copy; node 2
    // does not hear of that yet.
    for i in 1..3 {
        cl.wires[i][0].clear();
        cl.linked[i][0] = true;
        cl.linked[0][i] = true;
        cl.hs[i].b.set_peer_away(remote(0), false);
    }
    cl.pump();
    cl.linked[1][2] = false;
    let conn = cl.persistent_waiting(1, "s");
    let now = cl.hs[0].now;
    cl.hs[0].b.client_taken_by(now, "s", Some(remote(1)));
    cl.pump();
    let prev = prev_owner(0, 1);
    assert!(!cl.hs[1].b.awaits_handover(conn, &prev), "handed over");
    let (s1, got) = claimed_at_node_1(&mut cl, conn);
    assert_eq!(got, ["while-away"]);

    // Node 2 finds node 0 new to its link and sends it again, then hears
    // of the move.
    cl.hs[2].b.peer_joined(remote(0));
    cl.hs[2].b.peer_reset(remote(0));
    cl.pump();
    assert_eq!(cl.hs[2].b.metrics().stranded_resent, 1);
    cl.linked[1][2] = true;
    cl.pump();
    let out = cl.out(s1);
    assert_eq!(drain(&mut cl, s1, out), Vec::<String>::new(), "had it");
    assert_eq!(cl.hs[1].b.metrics().moves_relayed_had, 1);
}

/// Node 0 was paused: node 2's message for "s" was stranded in the copies
/// and waits on node 2's link to node 0. The client comes back on node 1,
/// which node 0 hands the session to as it wakes; only then does node 0
/// read the message, and relays it (node 2 has not switched yet). Node
/// 1's copy had it: once. Before, the relay was queued too, and the
/// client got it twice.
#[test]
fn a_message_an_owner_reads_after_it_let_go_is_not_relayed_to_the_copy_that_had_it() {
    let mut cl = Cluster::new(3, 3);
    let (s0, _) = cl.persistent_at(0, "s", 1);
    cl.hs[0].subscribe(s0.conn, "t", opts(QoS::ExactlyOnce));
    cl.pump();
    cl.lose(s0);
    // Paused: what the others write for it waits on their links.
    for i in 1..3 {
        cl.hs[i].b.set_peer_away(remote(0), true);
        cl.linked[i][0] = false;
    }
    let (p2, _) = cl.connect(2, "p2", Protocol::V5, true, 0);
    cl.send(
        p2,
        Packet::Publish(publish("t", "while-paused", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(acks(&cl.out(p2)), [(1, "puback")]);

    // It wakes to the claim first (the leader's word comes on its own
    // link), and hands "s" over to node 1.
    let conn = cl.persistent_waiting(1, "s");
    let now = cl.hs[0].now;
    cl.hs[0].b.client_taken_by(now, "s", Some(remote(1)));
    cl.pump();
    let prev = prev_owner(0, 1);
    let now = cl.hs[1].now;
    cl.hs[1]
        .b
        .claim_answered_from(now, conn, true, 2, Some(prev));
    // Node 2 hears of the move after it reads node 0's link.
    cl.linked[1][2] = false;
    cl.pump();
    let s1 = Cx { node: 1, conn };
    let out = cl.out(s1);
    assert!(present(&out));
    assert_eq!(out.payloads(), ["while-paused"]);

    // Node 0 reads its link now: the message, relayed to node 1.
    cl.linked[2][0] = true;
    cl.pump();
    assert_eq!(cl.hs[0].b.metrics().moves_relayed_messages, 1);
    cl.linked[1][2] = true;
    for i in 1..3 {
        cl.linked[i][0] = true;
        cl.hs[i].b.set_peer_away(remote(0), false);
    }
    cl.pump();
    assert_eq!(cl.out(s1).payloads(), Vec::<String>::new(), "had it");
    assert_eq!(cl.hs[1].b.metrics().moves_relayed_had, 1);
}

/// Node 0 and node 1 cut from each other only (a partial partition);
/// node 2 reaches both. Node 0 goes on without node 1's copy: node 2's
/// message for node 0's "s" is acknowledged with node 2's. The client
/// comes back on node 1, whose copy is current by its epoch but older by
/// its version: node 1 asks the others, and node 2, whose copy is newer,
/// sends it. Before, node 1 served its own, and the message was lost.
#[test]
fn a_node_cut_off_from_the_owner_only_serves_the_newer_copy() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(0, "s", 1, "t");
    cl.away(0, 1, true);
    cl.publish_acked(2, "t", "during-split");

    let conn = cl.persistent_waiting(1, "s");
    let prev = prev_owner(0, 1);
    assert!(!cl.hs[1].b.awaits_handover(conn, &prev), "node 0 is away");
    assert!(cl.hs[1].b.wants_copy(conn, &prev), "its copy may be older");
    cl.hs[1].b.ask_for_copy(conn, &prev);
    cl.pump();
    assert!(!cl.hs[1].b.wants_copy(conn, &prev), "node 2 sent its copy");
    assert_eq!(cl.hs[2].b.metrics().copies_sent, 1);
    let (_, got) = claimed_at_node_1(&mut cl, conn);
    assert_eq!(got, ["during-split"]);
}

/// The owner dies: every node's copy kept up with it alike, so none is
/// sent; each answers at once that it sends none, and the claim goes on
/// with the copy here without waiting out its bound.
#[test]
fn a_failover_from_a_dead_owner_sends_no_copy_and_waits_for_none() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(0, "s", 1, "t");
    cl.publish_acked(2, "t", "queued");
    cl.kill(0);
    let conn = cl.persistent_waiting(1, "s");
    let prev = prev_owner(0, 1);
    assert!(cl.hs[1].b.wants_copy(conn, &prev));
    cl.hs[1].b.ask_for_copy(conn, &prev);
    assert!(
        cl.hs[1].b.wants_copy(conn, &prev),
        "node 2 has not answered"
    );
    cl.pump();
    assert!(cl.hs[1].b.take_handover_news(), "the shell is woken");
    assert!(!cl.hs[1].b.wants_copy(conn, &prev), "answered");
    let (_, got) = claimed_at_node_1(&mut cl, conn);
    assert_eq!(got, ["queued"]);
    assert_eq!(cl.hs[2].b.metrics().copies_sent, 0);
}

/// Node 0, the owner, paused: node 1 finds it away, node 2 not yet. Node
/// 1's publisher's message is stranded in both copies while node 1 asks
/// for a newer one. Node 2's is not newer (node 0 changed nothing since):
/// none is sent, and node 1 serves its own. The default long run lost 49
/// messages (5d86e3a, seed 3) when node 2's copy, which lacked what node
/// 1 stranded, replaced node 1's for having kept up with the owner.
#[test]
fn a_copy_no_newer_than_the_askers_is_not_sent() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(0, "s", 1, "t");
    cl.hs[1].b.set_peer_away(remote(0), true);
    cl.linked[1][0] = false;
    cl.linked[0][1] = false;
    let (conn, prev) = asking_at_node_1(&mut cl);
    cl.publish_acked(1, "t", "stranded");
    assert!(!cl.hs[1].b.wants_copy(conn, &prev), "answered");
    assert_eq!(cl.hs[2].b.metrics().copies_sent, 0);
    let (_, got) = claimed_at_node_1(&mut cl, conn);
    assert_eq!(got, ["stranded"]);
}

/// Node 0 cut off from node 1 only went on with node 2's copy, so node
/// 2's is newer and replaces node 1's. Node 1's publisher's message,
/// stranded after node 1 asked and before node 2's copy arrives, is in
/// node 1's copy and not in the one node 2 sent: node 1 keeps it. Without
/// that, it was lost, acknowledged.
#[test]
fn a_newer_copy_keeps_what_the_askers_copy_had_stranded() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(0, "s", 1, "t");
    cl.away(0, 1, true);
    cl.publish_acked(2, "t", "kept-up");
    let (conn, prev) = asking_at_node_1(&mut cl);
    // Node 2's copy (and its answer to what node 1 strands) wait.
    cl.linked[2][1] = false;
    let (p1, _) = cl.connect(1, "p1", Protocol::V5, true, 0);
    cl.send(
        p1,
        Packet::Publish(publish("t", "stranded", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(cl.hs[2].b.metrics().copies_sent, 1);
    cl.linked[2][1] = true;
    cl.pump();
    assert_eq!(acks(&cl.out(p1)), [(1, "puback")]);
    assert!(!cl.hs[1].b.wants_copy(conn, &prev), "node 2 sent its copy");
    let (_, got) = claimed_at_node_1(&mut cl, conn);
    assert_eq!(got, ["kept-up", "stranded"]);
}

/// As above, but node 1's publisher's message comes after node 2's copy
/// arrived, before the claim takes it: the copy stands for node 0's
/// session, so the message stranded for node 0 is queued in it. Before,
/// the copy counted as node 2's, and the message went nowhere.
#[test]
fn a_newer_copy_takes_what_is_stranded_for_the_owner_until_it_is_served() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(0, "s", 1, "t");
    cl.away(0, 1, true);
    cl.publish_acked(2, "t", "kept-up");
    let (conn, prev) = asking_at_node_1(&mut cl);
    cl.pump();
    assert!(!cl.hs[1].b.wants_copy(conn, &prev), "node 2 sent its copy");
    let (p1, _) = cl.connect(1, "p1", Protocol::V5, true, 0);
    cl.send(
        p1,
        Packet::Publish(publish("t", "stranded", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(acks(&cl.out(p1)), [(1, "puback")]);
    let (_, got) = claimed_at_node_1(&mut cl, conn);
    assert_eq!(got, ["kept-up", "stranded"]);
}

/// Node 0 and node 1 cut from each other only. Node 0's own publisher's
/// message goes into its "s" (and node 2's copy of it), and to node 1 for
/// a subscriber there, on the cut link. The client of "s" comes back on
/// node 1, which serves node 2's copy, message included. The cut heals
/// and node 0's message arrives: node 1's subscriber gets it, "s" not
/// again. Before, "s" got it twice.
#[test]
fn a_message_forwarded_across_a_healed_cut_is_not_queued_again_for_a_taken_session() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(0, "s", 1, "t");
    let (o, _) = cl.connect(1, "o", Protocol::V5, true, 0);
    cl.hs[1].subscribe(o.conn, "t", opts(QoS::AtLeastOnce));
    cl.pump();
    cl.away(0, 1, true);
    let (p0, _) = cl.connect(0, "p0", Protocol::V5, true, 0);
    cl.send(
        p0,
        Packet::Publish(publish("t", "during-split", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(acks(&cl.out(p0)), [(1, "puback")]);

    let (conn, _) = asking_at_node_1(&mut cl);
    cl.pump();
    let (s, got) = claimed_at_node_1(&mut cl, conn);
    assert_eq!(got, ["during-split"]);

    cl.away(0, 1, false);
    assert_eq!(cl.out(o).payloads(), ["during-split"]);
    let out = cl.out(s);
    assert_eq!(drain(&mut cl, s, out), Vec::<String>::new(), "had it");
    assert_eq!(cl.hs[1].b.metrics().forwarded_had, 1);
}

/// Node 0 and node 1 cut from each other only; node 1, granted "s", has
/// node 2's copy. Before node 1 writes its own image to node 2, node 2's
/// publisher sends a message for "s" to node 0, which queues it and
/// replicates it to node 2 under its old claim: node 2 answers that it is
/// stale, so node 0 confirms nothing and node 2 refuses its publisher,
/// which publishes again. Before, node 2 applied it to the copy that node
/// 1's image was to replace, and the publisher waited on (here: was never
/// answered); the long run (seed 12) lost such messages, acknowledged.
#[test]
fn an_owner_cut_off_from_the_new_owner_confirms_nothing_after_the_copy_was_sent() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(0, "s", 1, "t");
    cl.away(0, 1, true);
    let (conn, prev) = asking_at_node_1(&mut cl);
    cl.pump();
    assert!(!cl.hs[1].b.wants_copy(conn, &prev), "node 2 answered");
    // What node 1 writes now waits: its image reaches node 2 only later.
    cl.linked[1][2] = false;
    let (p2, _) = cl.connect(2, "p2", Protocol::V5, true, 0);
    cl.send(
        p2,
        Packet::Publish(publish("t", "in-the-gap", QoS::AtLeastOnce, 1)),
    );
    assert_refused(&mut cl, p2);
}

/// Node 1 serves "s" from the copy node 2 sent (node 0, its owner, cut
/// off from node 1, went on with node 2's). Node 2 then finds node 0 away too, and strands its
/// next message for node 0's sessions: node 1 queues it for "s", taken
/// from node 0, though node 2 sent the copy. Before, node 1 counted "s"
/// as taken from node 2, which is live, and left the message out: lost
/// once acknowledged.
#[test]
fn a_session_served_from_a_copy_another_node_sent_gets_what_is_stranded_for_its_owner() {
    let mut cl = Cluster::new(3, 3);
    cl.offline_at(0, "s", 1, "t");
    cl.away(0, 1, true);
    cl.publish_acked(2, "t", "kept-up");
    let (conn, _) = asking_at_node_1(&mut cl);
    cl.pump();
    assert_eq!(cl.hs[2].b.metrics().copies_sent, 1);
    // Node 2 does not hear yet that "s" is served at node 1.
    cl.linked[1][2] = false;
    let (s, got) = claimed_at_node_1(&mut cl, conn);
    assert_eq!(got, ["kept-up"]);

    cl.hs[2].b.set_peer_away(remote(0), true);
    cl.linked[2][0] = false;
    let (p2, _) = cl.connect(2, "p2", Protocol::V5, true, 0);
    cl.send(
        p2,
        Packet::Publish(publish("t", "stranded", QoS::AtLeastOnce, 1)),
    );
    let out = cl.out(s);
    assert_eq!(drain(&mut cl, s, out), ["stranded"]);
    cl.linked[1][2] = true;
    cl.pump();
    assert_eq!(acks(&cl.out(p2)), [(1, "puback")]);
}

/// Node 2, owner of "s", is killed; a message stranded for it is served
/// from node 1's copy when "s" comes back there. Node 2 then restarts from
/// its disk, where "s" is still its own: node 0 sends it again what it
/// stranded for it. "s" must not get it a second time, neither at node 1
/// (node 2 hands the session over when it hears of the claim) nor where it
/// goes next (node 2's copies of "s").
#[test]
fn a_restarted_owner_sends_nothing_again_to_a_session_taken_meanwhile() {
    let dir = Dir::new("strand-taken-restart");
    let mut cl = Cluster::new(3, 3);
    cl.on_disk(2, &dir);
    cl.offline_at(2, "s", 1, "t");
    cl.kill(2);
    cl.publish_acked(0, "t", "m");
    let (s, out) = cl.persistent_after(1, "s", 2, 2, 1);
    assert!(present(&out));
    let mut all = out;
    all.packets.extend(cl.out(s).packets);
    assert_eq!(drain(&mut cl, s, all), ["m"]);
    cl.restart_on(2, &dir);
    assert_eq!(cl.hs[0].b.metrics().stranded_resent, 1, "not sent again");
    let now = cl.hs[2].now;
    cl.hs[2].b.client_taken_by(now, "s", Some(remote(1)));
    cl.pump();
    let out = cl.out(s);
    assert_eq!(drain(&mut cl, s, out), Vec::<String>::new());
    cl.lose(s);
    let (s0, out) = cl.persistent_after(0, "s", 3, 1, 2);
    assert!(present(&out));
    let mut all = out;
    all.packets.extend(cl.out(s0).packets);
    assert_eq!(drain(&mut cl, s0, all), Vec::<String>::new());
}

/// Node 2, owner of "s" (QoS 2), queues "m" from its own publisher while
/// cut off from both replicas, and is killed before it acknowledges it:
/// only its disk has "m". "s" is served at node 1 from a copy without it.
/// Node 2 restarts from its disk and then hears that node 1 took "s":
/// whatever reaches "s" of node 2's "m" reaches it once, also after the
/// handover's deadline.
#[test]
fn a_restarted_owners_unacknowledged_message_reaches_the_new_owner_once_at_most() {
    for early in [false, true] {
        let dir = Dir::new(&format!("restart-own-queue-{early}"));
        let mut cl = Cluster::new(3, 3);
        cl.on_disk(2, &dir);
        let (s, _) = cl.persistent_at(2, "s", 1);
        cl.hs[2].subscribe(s.conn, "t", opts(QoS::ExactlyOnce));
        cl.pump();
        cl.lose(s);
        cl.cut(2, 0, true);
        cl.cut(2, 1, true);
        let (p, _) = cl.connect(2, "p", Protocol::V5, true, 0);
        cl.send(p, Packet::Publish(publish("t", "m", QoS::ExactlyOnce, 1)));
        assert_eq!(acks(&cl.out(p)), [], "acknowledged without the replicas");
        cl.kill(2);
        let conn = cl.persistent_waiting(1, "s");
        let prev = PreviousOwner {
            peer: Some(remote(2)),
            epoch: 1,
            lapsed: false,
        };
        let mut got = Vec::new();
        let mut s1 = None;
        if !early {
            let c = cl.granted(1, conn, 2, prev);
            let out = cl.out(c);
            got.extend(acked_payloads(&mut cl, c, out));
            s1 = Some(c);
        }
        // Node 2 restarts and hears of the claim before its links are up.
        cl.restart_on(2, &dir);
        let now = cl.hs[2].now;
        assert_eq!(cl.hs[2].b.queued_messages("s"), Some(1), "m not read back");
        cl.hs[2].b.client_taken_by(now, "s", Some(remote(1)));
        assert_eq!(cl.hs[2].b.metrics().moves_relayed, 1);
        for i in 0..2 {
            cl.linked[i][2] = true;
            cl.linked[2][i] = true;
            cl.hs[i].b.peer_joined(remote(2));
            cl.hs[i].b.set_peer_away(remote(2), false);
        }
        cl.pump();
        let s1 = match s1 {
            Some(c) => c,
            None => cl.granted(1, conn, 2, prev),
        };
        let out = cl.out(s1);
        got.extend(acked_payloads(&mut cl, s1, out));
        cl.later(6);
        let out = cl.out(s1);
        got.extend(acked_payloads(&mut cl, s1, out));
        assert!(got.iter().filter(|g| *g == "m").count() <= 1, "{got:?}");
    }
}

/// Node 1, a replica on disk, is killed while node 0, the owner, goes on
/// with node 2's copy; then node 0 dies and node 1 restarts. Its copy,
/// read back from disk, lacks what was acknowledged while it was down;
/// node 2's has it. The client comes back on node 1: it must find it.
#[test]
fn a_copy_read_back_from_disk_that_missed_changes_is_not_served_as_it_is() {
    let dir = Dir::new("stale-disk-copy");
    let mut cl = Cluster::new(3, 3);
    cl.on_disk(1, &dir);
    cl.offline_at(0, "s", 1, "t");
    cl.publish_acked(2, "t", "before");
    assert_eq!(cl.hs[1].b.metrics().store_errors, 0, "its version written");
    cl.kill(1);
    cl.publish_acked(2, "t", "while-down");
    cl.kill(0);
    cl.restart_on(1, &dir);
    assert_eq!(read_back_and_served(&mut cl, 1), ["before", "while-down"]);
}

/// Node 1, restarted with a copy of "s" read back from disk (node 0, the
/// owner, dead), serves it: it asks the other nodes for a newer copy (the
/// version of its own is known), `sent` come. What the client gets.
fn read_back_and_served(cl: &mut Cluster, sent: u64) -> Vec<String> {
    let conn = copy_asked_at_node_1(cl, sent);
    claimed_at_node_1(cl, conn).1
}

/// "s"'s client back at node 1, whose claim (node 0's at epoch 1 before
/// it) wants a copy (its own may be older, or it has none), asks the
/// other nodes and is answered, node 2 sending `sent` copies.
fn copy_asked_at_node_1(cl: &mut Cluster, sent: u64) -> ConnId {
    let conn = cl.persistent_waiting(1, "s");
    let prev = prev_owner(0, 1);
    assert!(cl.hs[1].b.wants_copy(conn, &prev), "a copy wanted");
    cl.hs[1].b.ask_for_copy(conn, &prev);
    cl.pump();
    assert!(!cl.hs[1].b.wants_copy(conn, &prev), "answered");
    assert_eq!(cl.hs[2].b.metrics().copies_sent, sent, "copies sent");
    conn
}

/// The other way round: node 2 was cut off from node 0, the owner, which
/// went on with node 1's copy; node 0 dies, node 1 restarts. Node 1's
/// copy read back from disk is the newer one: node 2's does not replace
/// it, and the client back on node 1 finds everything.
#[test]
fn a_copy_read_back_from_disk_is_kept_over_an_older_one() {
    let dir = Dir::new("newer-disk-copy");
    let mut cl = Cluster::new(3, 3);
    cl.on_disk(1, &dir);
    cl.offline_at(0, "s", 1, "t");
    cl.publish_acked(1, "t", "before");
    cl.away(0, 2, true);
    cl.publish_acked(1, "t", "while-cut");
    cl.kill(0);
    cl.kill(1);
    cl.restart_on(1, &dir);
    // Node 2's is older: none sent.
    assert_eq!(read_back_and_served(&mut cl, 0), ["before", "while-cut"]);
}

/// Node 2, owner of "s", restarts: "s" is read back from its store, not
/// claimed again. A publisher on node 2 sends "m" for it, acknowledged;
/// then "s" is claimed at node 1 (node 2 hands it over): the session at
/// node 1 has "m".
#[test]
fn a_message_for_a_restored_session_acknowledged_is_kept_when_claimed_elsewhere() {
    let dir = Dir::new("restored-owner-ack");
    let mut cl = Cluster::new(3, 3);
    cl.on_disk(2, &dir);
    cl.offline_at(2, "s", 1, "t");
    cl.kill(2);
    cl.restart_on(2, &dir);
    let (p, _) = cl.connect(2, "p", Protocol::V5, true, 0);
    cl.send(p, Packet::Publish(publish("t", "m", QoS::AtLeastOnce, 1)));
    assert_eq!(acks(&cl.out(p)), [(1, "puback")]);
    let got = handed_from_node_2_to_node_1(&mut cl);
    assert_eq!(got, ["m"], "acknowledged, so kept");
}

/// "s", owned by node 2, is claimed at node 1: node 2 hands it over and
/// node 1 serves it. What the client gets.
fn handed_from_node_2_to_node_1(cl: &mut Cluster) -> Vec<String> {
    let conn = cl.persistent_waiting(1, "s");
    let now = cl.hs[2].now;
    cl.hs[2].b.client_taken_by(now, "s", Some(remote(1)));
    cl.pump();
    let prev = prev_owner(2, 1);
    assert!(!cl.hs[1].b.awaits_handover(conn, &prev), "handed over");
    let s1 = cl.granted(1, conn, 2, prev);
    let out = cl.out(s1);
    assert!(present(&out));
    drain(cl, s1, out)
}

/// Node 2, owner of "s", is killed after "old" reached its replicas but
/// before its own disk kept it (its log is cut back here to what it held
/// before). Restarted, it takes "new" for "s", read back from its store,
/// and hands "s" to node 1: each message arrives once, as itself. Before,
/// the restarted store gave "new" the id "old" had had, node 1's copy
/// took it for "old" (held by that id already), and "new" was lost while
/// "old" came twice (a long run's loss and duplicate, 2026-11-30, seed 1).
#[test]
fn a_restarted_owner_gives_no_id_its_former_self_gave() {
    let dir = Dir::new("restarted-owner-ids");
    let mut cl = Cluster::new(3, 3);
    cl.on_disk(2, &dir);
    cl.offline_at(2, "s", 1, "t");
    let (p, _) = cl.connect(2, "p", Protocol::V5, true, 0);
    cl.send(
        p,
        Packet::Publish(publish("t", "first", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(acks(&cl.out(p)), [(1, "puback")], "on node 2's disk");
    let log = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "zlog"))
        .unwrap();
    let kept = std::fs::metadata(&log).unwrap().len();
    cl.send(p, Packet::Publish(publish("t", "old", QoS::AtLeastOnce, 2)));
    assert_eq!(acks(&cl.out(p)), [(2, "puback")]);
    cl.kill(2);
    let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    f.set_len(kept).unwrap();
    drop(f);
    cl.restart_on(2, &dir);
    let (p, _) = cl.connect(2, "p2", Protocol::V5, true, 0);
    cl.send(p, Packet::Publish(publish("t", "new", QoS::AtLeastOnce, 1)));
    assert_eq!(acks(&cl.out(p)), [(1, "puback")]);
    let mut got = handed_from_node_2_to_node_1(&mut cl);
    got.sort();
    assert_eq!(got, ["first", "new", "old"]);
}

/// A copy sent to a claimant (the answer to `CopyWanted`) larger than a
/// link frame: 270 messages of 1 MiB for "s" (its queue limit and the
/// replicas' raised to 1 GiB), acknowledged while node 0 and node 1 are
/// cut from each other, so node 2 alone holds them beside the owner. "s" comes back on node 1,
/// whose copy is older: node 2's goes to it in parts. Node 1 then sends
/// its replicas the session it installed, also past a frame, also in
/// parts: node 1 killed before its client acknowledged anything, node 2
/// serves all 270. Before, each of those batches was one frame, which the
/// link refused ("frame too large"): the claim served node 1's old copy
/// without the messages, and node 2 never got node 1's.
#[test]
fn batches_larger_than_a_link_frame_reach_the_claimant_and_its_replicas() {
    const N: usize = 270;
    const SIZE: usize = 1 << 20;
    const { assert!(N * SIZE > crate::core::peer_wire::MAX_FRAME) };
    let mut cl = Cluster::with(3, 3, || Config {
        max_queued_bytes: 1 << 30,
        ..Config::default()
    });
    for h in &mut cl.hs {
        h.b.set_replica_limits(100_000, 1 << 30);
    }
    cl.offline_at(0, "s", 1, "t");
    cl.away(0, 1, true);
    let (p, _) = cl.connect(2, "p", Protocol::V5, true, 0);
    let filler = vec![b'.'; SIZE - 4];
    for i in 0..N {
        let mut payload = format!("{i:04}").into_bytes();
        payload.extend_from_slice(&filler);
        let mut m = publish("t", "", QoS::AtLeastOnce, i as u16 + 1);
        m.payload = Bytes::from(payload);
        cl.send(p, Packet::Publish(m));
    }
    assert_eq!(acks(&cl.out(p)).len(), N);
    let want: Vec<String> = (0..N).map(|i| format!("{i:04}")).collect();
    let heads = |out: &Out| -> Vec<String> {
        out.publishes()
            .iter()
            .map(|m| String::from_utf8_lossy(&m.payload[..4]).into_owned())
            .collect()
    };

    let conn = copy_asked_at_node_1(&mut cl, 1);
    let s1 = cl.granted(1, conn, 2, prev_owner(0, 1));
    let out = cl.out(s1);
    assert!(present(&out));
    assert_eq!(heads(&out), want, "node 1 serves node 2's copy");
    assert_eq!(cl.hs[1].b.metrics().replica_parts_dropped, 0);

    // Nothing acknowledged: all 270 are still owed, now by node 1's copies.
    cl.lose(s1);
    cl.kill(1);
    let (s2, out) = cl.persistent_after(2, "s", 3, 1, 2);
    assert!(present(&out));
    let mut got = Vec::new();
    let mut out = out;
    for _ in 0..N {
        let ps = out.publishes();
        if ps.is_empty() {
            break;
        }
        for m in ps {
            got.push(String::from_utf8_lossy(&m.payload[..4]).into_owned());
            cl.send(s2, Packet::PubAck(ack(m.packet_id)));
        }
        out = cl.out(s2);
    }
    assert_eq!(got, want, "node 2 has node 1's copy");
    assert_eq!(cl.hs[2].b.metrics().replica_parts_dropped, 0);
}

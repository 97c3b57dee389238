//! Each publisher's order at a persistent QoS 2 subscriber whose session
//! is copied to replicas, under random interleavings of what makes its
//! packets wait: the owner's store syncing late, replica answers coming
//! in pieces, client reads of one packet or several. Node 0 owns "s" (its
//! client online, acknowledging as paho does: a QoS 2 message is the
//! application's at PUBREL) and has a QoS 2 publisher "p0"; node 1 has
//! "p1". Nodes 1 and 2 are node 0's replicas. Checked at every packet
//! the subscriber reads: a PUBLISH goes out once both copies have its send
//! record, a PUBREL once they have its PUBREC; and at the end, each
//! publisher's messages once each, in order.

use super::*;

/// xorshift: the same steps for the same seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A QoS 2 publisher sending `{name}:{i}` one at a time, each once the
/// one before is complete (PUBCOMP).
struct Publisher {
    name: &'static str,
    cx: Cx,
    next: u16,
    /// PUBREC received, PUBREL not yet sent.
    rec: Option<u16>,
    waiting: bool,
}

/// A QoS 1 publisher with up to four messages in flight, `q:{i}` to "t"
/// (the subscriber's) for even `i`, to "u" (nobody's: nothing for the
/// replicas) for odd: its PUBACKs must come in the order it published.
struct Pipelined {
    cx: Cx,
    next: u16,
    in_flight: std::collections::VecDeque<u16>,
    acked: u16,
}

/// The subscriber as paho is: a QoS 2 PUBLISH is kept by packet id and
/// answered PUBREC; the application gets it at PUBREL.
#[derive(Default)]
struct Subscriber {
    kept: HashMap<u16, String>,
    /// Answers not sent yet, in order (several may go in one read).
    answers: Vec<Packet>,
    got: Vec<String>,
    trace: Vec<String>,
}

struct Run {
    cl: Cluster,
    /// Node 0's store (see `Log`).
    sync: Rc<Sync>,
    s: Cx,
    sub: Subscriber,
    pubs: Vec<Publisher>,
    q: Pipelined,
    /// Node 0 marks its replicas away and back at random, and its lease
    /// is renewed now and then (what waits for a renewal goes then).
    faults: bool,
    /// The replicas node 0 has seen away: not waited for, so their copies
    /// may lag behind what the subscriber got.
    were_away: [bool; 3],
    away_now: [bool; 3],
}

const MESSAGES: u16 = 25;

impl Run {
    fn new(faults: bool) -> Self {
        let mut cl = Cluster::new(3, 3);
        let sync = Rc::new(Sync::default());
        sync.fast.set(true);
        let now = cl.hs[0].now;
        cl.hs[0].b.set_durable_log(
            Box::new(Log {
                sync: Some(sync.clone()),
                ..Log::default()
            }),
            now,
            1_000_000,
        );
        let (s, _) = cl.persistent(0, "s");
        cl.hs[0].subscribe(s.conn, "t", opts(QoS::ExactlyOnce));
        cl.pump();
        let mut pubs = Vec::new();
        for (node, name) in [(0, "p0"), (1, "p1")] {
            let (cx, _) = cl.connect(node, name, Protocol::V5, true, 0);
            pubs.push(Publisher {
                name,
                cx,
                next: 0,
                rec: None,
                waiting: false,
            });
        }
        let (qx, _) = cl.connect(0, "q", Protocol::V5, true, 0);
        cl.pump();
        let _ = cl.out(s);
        let _ = cl.out(qx);
        for p in &pubs {
            let _ = cl.out(p.cx);
        }
        sync.durable.set(sync.committed.get());
        sync.fast.set(false);
        let mut run = Run {
            cl,
            sync,
            s,
            sub: Subscriber::default(),
            pubs,
            q: Pipelined {
                cx: qx,
                next: 0,
                in_flight: Default::default(),
                acked: 0,
            },
            faults,
            were_away: [false; 3],
            away_now: [false; 3],
        };
        if faults {
            run.renew_lease();
        }
        run
    }

    /// A renewal of node 0's lease, sent a moment later than the last.
    fn renew_lease(&mut self) {
        let h = &mut self.cl.hs[0];
        h.now += Duration::from_millis(1);
        let now = h.now;
        h.b.cluster_lease_until(now, now, now + Duration::from_secs(3600));
    }

    /// Node 0 sees replica `i` away, or back.
    fn toggle_away(&mut self, i: usize) {
        self.away_now[i] = !self.away_now[i];
        self.were_away[i] |= self.away_now[i];
        self.cl.hs[0].b.set_peer_away(remote(i), self.away_now[i]);
    }

    /// Node 0's store makes what it committed so far durable.
    fn store_syncs(&mut self) {
        self.sync.durable.set(self.sync.committed.get());
        self.cl.hs[0].b.release_durable();
    }

    /// Every node hands its peers' events to its links.
    fn poll_peers(&mut self) {
        for i in 0..self.cl.hs.len() {
            let now = self.cl.hs[i].now;
            if i != 0 {
                self.cl.hs[i].b.release_durable();
            }
            while let Some(batch) = self.cl.hs[i].b.poll_peer_transmit() {
                let to = node_of(batch.to);
                for e in &batch.events {
                    let f = self.cl.enc.encode(e, now).unwrap();
                    for c in &f.chunks {
                        self.cl.wires[i][to].extend_from_slice(c);
                    }
                }
            }
        }
    }

    /// Up to `n` of what `from` wrote for `to` arrives, as one link read.
    fn deliver(&mut self, from: usize, to: usize, n: u64) {
        let mut buf = self.cl.wires[from][to].split();
        let h = &mut self.cl.hs[to];
        h.b.begin_peer_read();
        for _ in 0..n {
            match self.cl.dec.decode(&mut buf, h.now).unwrap() {
                Some(LinkFrame::Event(e)) => h.b.handle_peer(h.now, remote(from), e),
                Some(_) => unreachable!("only the shell sends these"),
                None => break,
            }
        }
        h.b.end_peer_read();
        self.cl.wires[from][to] = buf;
    }

    /// The subscriber reads what node 0 wrote for it.
    fn subscriber_reads(&mut self) {
        let mut batch = Vec::new();
        let h = &mut self.cl.hs[0];
        let _ = h.b.poll_transmit(h.now, self.s.conn, &mut batch, 16);
        for item in &batch {
            match roundtrip(item, Protocol::V5) {
                Packet::Publish(p) if p.qos == QoS::AtLeastOnce => {
                    let body = String::from_utf8_lossy(&p.payload).into_owned();
                    self.sub
                        .trace
                        .push(format!("PUBLISH {} {body} (QoS 1)", p.packet_id));
                    self.sub.got.push(body);
                    self.sub.answers.push(Packet::PubAck(ack(p.packet_id)));
                }
                Packet::Publish(p) => {
                    assert_eq!(p.qos, QoS::ExactlyOnce);
                    let pid = p.packet_id;
                    let body = String::from_utf8_lossy(&p.payload).into_owned();
                    self.sub.trace.push(format!("PUBLISH {pid} {body}"));
                    // Out only once both copies have its send record: a
                    // failover sends it again with the same packet id.
                    for i in (1..3).filter(|i| !self.were_away[*i]) {
                        let copy = self.cl.hs[i].b.copy_inflight("s").unwrap_or_default();
                        assert!(
                            copy.iter().any(|(id, _)| *id == pid),
                            "PUBLISH {pid} ({body}) before node {i}'s copy has it: {copy:?}"
                        );
                    }
                    self.sub.kept.insert(pid, body);
                    self.sub.answers.push(Packet::PubRec(ack(pid)));
                }
                Packet::PubRel(a) => {
                    self.sub.trace.push(format!("PUBREL {}", a.packet_id));
                    // Only once both copies have its PUBREC: the client
                    // forgets the message at PUBREL.
                    for i in (1..3).filter(|i| !self.were_away[*i]) {
                        let copy = self.cl.hs[i].b.copy_inflight("s").unwrap_or_default();
                        assert!(
                            !copy.contains(&(a.packet_id, InflightPhase::PublishSent)),
                            "PUBREL {} before node {i}'s copy has its PUBREC: {copy:?}; saw:\n{}",
                            a.packet_id,
                            self.sub.trace.join("\n")
                        );
                    }
                    if let Some(m) = self.sub.kept.remove(&a.packet_id) {
                        self.sub.got.push(m);
                    }
                    self.sub.answers.push(Packet::PubComp(ack(a.packet_id)));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// The subscriber's first `n` answers arrive, as one read.
    fn subscriber_answers(&mut self, n: u64) {
        let n = (n as usize).min(self.sub.answers.len());
        let sent: Vec<Packet> = self.sub.answers.drain(..n).collect();
        if !sent.is_empty() {
            let names: Vec<String> = sent
                .iter()
                .map(|p| match p {
                    Packet::PubRec(a) => format!("PUBREC {}", a.packet_id),
                    Packet::PubComp(a) => format!("PUBCOMP {}", a.packet_id),
                    Packet::PubAck(a) => format!("PUBACK {}", a.packet_id),
                    _ => "?".into(),
                })
                .collect();
            self.sub.trace.push(format!("  -> {}", names.join(", ")));
        }
        let s = self.s;
        let h = &mut self.cl.hs[0];
        h.b.begin_client_read();
        for p in sent {
            h.send(s.conn, p);
        }
        h.b.end_client_read();
    }

    /// Publisher `i` reads its answers and sends what follows.
    fn publisher_step(&mut self, i: usize) {
        let p = &mut self.pubs[i];
        let h = &mut self.cl.hs[p.cx.node];
        let mut batch = Vec::new();
        let _ = h.b.poll_transmit(h.now, p.cx.conn, &mut batch, 16);
        for item in &batch {
            match roundtrip(item, Protocol::V5) {
                Packet::PubRec(a) => p.rec = Some(a.packet_id),
                Packet::PubComp(_) => {
                    p.waiting = false;
                    p.next += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if let Some(pid) = p.rec.take() {
            h.send(p.cx.conn, Packet::PubRel(ack(pid)));
        } else if !p.waiting && p.next < MESSAGES {
            let body = format!("{}:{}", p.name, p.next);
            let pid = p.next + 1;
            h.send(
                p.cx.conn,
                Packet::Publish(publish("t", &body, QoS::ExactlyOnce, pid)),
            );
            p.waiting = true;
        }
    }

    /// The pipelined publisher reads its PUBACKs and fills its window.
    fn pipelined_step(&mut self) {
        let q = &mut self.q;
        let h = &mut self.cl.hs[0];
        let mut batch = Vec::new();
        let _ = h.b.poll_transmit(h.now, q.cx.conn, &mut batch, 16);
        for item in &batch {
            match roundtrip(item, Protocol::V5) {
                Packet::PubAck(a) => {
                    assert_eq!(
                        Some(a.packet_id),
                        q.in_flight.pop_front(),
                        "q's PUBACKs out of order"
                    );
                    q.acked += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if q.in_flight.len() < 4 && q.next < MESSAGES {
            let topic = if q.next.is_multiple_of(2) { "t" } else { "u" };
            let pid = q.next + 1;
            let body = format!("q:{}", q.next);
            h.send(
                q.cx.conn,
                Packet::Publish(publish(topic, &body, QoS::AtLeastOnce, pid)),
            );
            q.in_flight.push_back(pid);
            q.next += 1;
        }
    }

    fn step(&mut self, rng: &mut Rng) {
        self.poll_peers();
        if self.faults {
            match rng.below(40) {
                0 => return self.toggle_away(1 + rng.below(2) as usize),
                1 | 2 => return self.renew_lease(),
                _ => {}
            }
        }
        match rng.below(8) {
            0 => self.store_syncs(),
            1 => {
                let from = rng.below(3) as usize;
                let to = (from + 1 + rng.below(2) as usize) % 3;
                let n = 1 + rng.below(4);
                self.deliver(from, to, n);
            }
            2 | 3 => self.subscriber_reads(),
            4 => {
                let n = 1 + rng.below(3);
                self.subscriber_answers(n);
            }
            5 => self.pipelined_step(),
            _ => {
                let i = rng.below(self.pubs.len() as u64) as usize;
                self.publisher_step(i);
            }
        }
    }

    fn done(&self) -> bool {
        self.pubs.iter().all(|p| p.next >= MESSAGES)
            && self.q.acked >= MESSAGES
            && self.sub.got.len()
                >= self.pubs.len() * usize::from(MESSAGES) + usize::from(MESSAGES.div_ceil(2))
    }
}

/// Paho's view of one run: each publisher's messages once, in order.
fn check(seed: u64, got: &[String], trace: &[String]) {
    for name in ["p0", "p1", "q"] {
        let seqs: Vec<u16> = got
            .iter()
            .filter_map(|m| m.strip_prefix(&format!("{name}:")))
            .map(|n| n.parse().unwrap())
            .collect();
        // q's odd ones went to "u".
        let step = if name == "q" { 2 } else { 1 };
        let want: Vec<u16> = (0..MESSAGES).step_by(step).collect();
        let last = &trace[trace.len().saturating_sub(60)..];
        assert_eq!(
            seqs,
            want,
            "seed {seed}: {name}'s messages as delivered; the subscriber saw, last:\n{}",
            last.join("\n")
        );
    }
}

/// Before, an answer the replicas released went back to them when the
/// event that released it had changes of its own, behind what its
/// connection had waiting since: a later PUBLISH passed an earlier one
/// (seed 3: p0:16 before p0:15), as `test_a_node_added_and_one_removed_
/// while_traffic_flows` saw about one run in fifteen. And a PUBREL that
/// waited behind earlier answers went with them, before the replicas had
/// its own PUBREC (seed 1).
#[test]
fn a_publishers_qos2_messages_reach_a_replicated_session_in_order() {
    runs(false, 300);
}

/// The same with node 0 seeing its replicas away and back, and its lease
/// renewed now and then: answers then go without an away replica's
/// answer, or wait for a renewal when no replica had them; the order
/// holds all the same.
#[test]
fn the_order_holds_while_replicas_go_away_and_come_back() {
    runs(true, 200);
}

fn runs(faults: bool, seeds: u64) {
    for seed in 1..=seeds {
        let mut run = Run::new(faults);
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut steps = 0;
        while !run.done() && steps < 20_000 {
            run.step(&mut rng);
            steps += 1;
        }
        assert!(
            run.done(),
            "seed {seed}: stuck after {steps} steps; got {:?}",
            run.sub.got
        );
        check(seed, &run.sub.got, &run.sub.trace);
    }
}

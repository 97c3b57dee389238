//! What the core stages in its durable log, and when acknowledgements wait
//! for it: checked with a recording fake log whose durable LSN the test
//! moves by hand.

use super::*;
use crate::core::durable::{
    DurableLog, EntryId, Lsn, MsgId, QueueEntry, SessionMeta, StoreError, StoredMessage,
    StoredWill, SubOptions,
};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// The log's record of calls, and the LSN the test declares durable.
#[derive(Default)]
struct Shared {
    events: RefCell<Vec<String>>,
    durable: Cell<Lsn>,
    lsn: Cell<Lsn>,
}

struct Fake {
    shared: Rc<Shared>,
    next_msg: u64,
    next_entry: u64,
    lsn: Lsn,
    staged: bool,
    /// What the log says a former run's clock was (see `counts_from_ms`).
    counts_from: u64,
}

impl Fake {
    fn log(&mut self, e: String) {
        self.staged = true;
        self.shared.events.borrow_mut().push(e);
    }
}

impl DurableLog for Fake {
    fn put_message(&mut self, msg: &StoredMessage) -> Result<MsgId, StoreError> {
        self.next_msg += 1;
        let payload = String::from_utf8_lossy(&msg.payload).into_owned();
        self.log(format!("put_message {} {payload}", self.next_msg));
        Ok(MsgId(self.next_msg))
    }
    fn set_retained(&mut self, topic: &str, msg: MsgId) -> Result<(), StoreError> {
        self.log(format!("set_retained {topic} {}", msg.0));
        Ok(())
    }
    fn clear_retained(&mut self, topic: &str) -> Result<(), StoreError> {
        self.log(format!("clear_retained {topic}"));
        Ok(())
    }
    fn put_session(&mut self, client_id: &str, meta: SessionMeta) -> Result<(), StoreError> {
        let deadline = if meta.expires_at_ms.is_some() {
            "deadline"
        } else {
            "none"
        };
        self.log(format!(
            "put_session {client_id} {} {deadline}",
            meta.expiry_interval
        ));
        Ok(())
    }
    fn drop_session(&mut self, client_id: &str) -> Result<(), StoreError> {
        self.log(format!("drop_session {client_id}"));
        Ok(())
    }
    fn subscribe(
        &mut self,
        client_id: &str,
        filter: &str,
        options: SubOptions,
        _id: Option<u32>,
    ) -> Result<(), StoreError> {
        self.log(format!("subscribe {client_id} {filter} {}", options.qos));
        Ok(())
    }
    fn unsubscribe(&mut self, client_id: &str, filter: &str) -> Result<(), StoreError> {
        self.log(format!("unsubscribe {client_id} {filter}"));
        Ok(())
    }
    fn enqueue(&mut self, client_id: &str, entry: &QueueEntry) -> Result<EntryId, StoreError> {
        self.next_entry += 1;
        self.log(format!(
            "enqueue {client_id} {} msg {} qos {}",
            self.next_entry, entry.msg.0, entry.qos
        ));
        Ok(EntryId(self.next_entry))
    }
    fn dequeue(&mut self, client_id: &str, entry: EntryId) -> Result<(), StoreError> {
        self.log(format!("dequeue {client_id} {}", entry.0));
        Ok(())
    }
    fn send(&mut self, client_id: &str, entry: EntryId, packet_id: u16) -> Result<(), StoreError> {
        self.log(format!("send {client_id} {} pid {packet_id}", entry.0));
        Ok(())
    }
    fn pubrec(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.log(format!("pubrec {client_id} {packet_id}"));
        Ok(())
    }
    fn complete(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.log(format!("complete {client_id} {packet_id}"));
        Ok(())
    }
    fn qos2_received(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.log(format!("qos2_received {client_id} {packet_id}"));
        Ok(())
    }
    fn qos2_released(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.log(format!("qos2_released {client_id} {packet_id}"));
        Ok(())
    }
    fn set_will(&mut self, client_id: &str, will: &StoredWill) -> Result<(), StoreError> {
        let topic = String::from_utf8_lossy(&will.message.topic).into_owned();
        self.log(format!("set_will {client_id} {topic}"));
        Ok(())
    }
    fn clear_will(&mut self, client_id: &str) -> Result<(), StoreError> {
        self.log(format!("clear_will {client_id}"));
        Ok(())
    }
    fn set_epoch(&mut self, client_id: &str, epoch: u64, version: u64) -> Result<(), StoreError> {
        self.log(format!("set_epoch {client_id} {epoch} {version}"));
        Ok(())
    }
    fn commit(&mut self) -> Result<Lsn, StoreError> {
        if self.staged {
            self.staged = false;
            self.lsn += 1;
            self.shared.lsn.set(self.lsn);
            self.shared.events.borrow_mut().push("commit".into());
        }
        Ok(self.lsn)
    }
    fn copies(&mut self) -> &mut dyn DurableLog {
        self
    }
    fn durable_lsn(&self) -> Lsn {
        self.shared.durable.get()
    }
    fn counts_from_ms(&self) -> u64 {
        self.counts_from
    }
}

fn durable_h() -> (H, Rc<Shared>) {
    let mut h = H::new();
    let shared = Rc::new(Shared::default());
    let fake = Fake {
        shared: shared.clone(),
        next_msg: 0,
        next_entry: 0,
        lsn: 0,
        staged: false,
        counts_from: 0,
    };
    let now = h.now;
    h.b.set_durable_log(Box::new(fake), now, 1_000_000);
    (h, shared)
}

/// A store whose former run saw a later clock than this one (the wall
/// clock stepped back across the restart): the change numbers this run
/// gives its peers start past that clock, not past the wall clock, so
/// none is one the former run gave.
#[test]
fn counts_start_past_the_clock_a_former_run_saved() {
    use crate::core::peer::{count_from_clock, PeerId};
    let wall = 1_000_000;
    for (saved, from) in [(0, wall), (wall + 3_600_000, wall + 3_600_000)] {
        let mut h = H::new();
        let fake = Fake {
            shared: Rc::new(Shared::default()),
            next_msg: 0,
            next_entry: 0,
            lsn: 0,
            staged: false,
            counts_from: saved,
        };
        let now = h.now;
        h.b.set_durable_log(Box::new(fake), now, wall);
        h.b.set_peers(PeerId(0), &[PeerId(0), PeerId(1)]);
        assert_eq!(h.b.peer_seq(), count_from_clock(from), "saved {saved}");
    }
}

fn take(shared: &Shared) -> Vec<String> {
    std::mem::take(&mut *shared.events.borrow_mut())
}

fn persistent(h: &mut H, id: &str) -> ConnId {
    h.connect_with(id, Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(3600)
    })
    .0
}

fn acks(out: &Out) -> Vec<&'static str> {
    out.packets
        .iter()
        .filter_map(|p| match p {
            Packet::PubAck(_) => Some("puback"),
            Packet::PubRec(_) => Some("pubrec"),
            Packet::PubComp(_) => Some("pubcomp"),
            _ => None,
        })
        .collect()
}

#[test]
fn clean_sessions_write_nothing_and_ack_at_once() {
    let (mut h, shared) = durable_h();
    let sub = h.client("sub");
    h.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "m", QoS::AtLeastOnce, 1)),
    );
    h.send(
        publ,
        Packet::Publish(publish("t", "m2", QoS::ExactlyOnce, 2)),
    );
    h.send(publ, Packet::PubRel(ack(2)));
    assert_eq!(acks(&h.out(publ)), ["puback", "pubrec", "pubcomp"]);
    assert_eq!(h.out(sub).payloads(), ["m", "m2"]);
    assert!(take(&shared).is_empty(), "clean sessions touched the store");
}

#[test]
fn publish_to_persistent_session_is_acked_once_durable() {
    let (mut h, shared) = durable_h();
    let sub = persistent(&mut h, "sub");
    h.subscribe(sub, "t", opts(QoS::ExactlyOnce));
    h.send(sub, Packet::Disconnect(Disconnect::default()));
    h.b.connection_lost(h.now, sub);
    let setup = take(&shared);
    assert_eq!(
        setup,
        [
            "put_session sub 3600 none",
            "commit",
            "subscribe sub t 2",
            "commit",
            "put_session sub 3600 deadline",
            "commit"
        ]
    );
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "m", QoS::AtLeastOnce, 1)),
    );
    assert_eq!(
        take(&shared),
        ["put_message 1 m", "enqueue sub 1 msg 1 qos 1", "commit"]
    );
    assert!(
        acks(&h.out(publ)).is_empty(),
        "PUBACK before the commit is durable"
    );
    assert_eq!(h.b.held_acks(), 1);
    shared.durable.set(shared.lsn.get() - 1);
    h.b.release_durable();
    assert!(acks(&h.out(publ)).is_empty());
    shared.durable.set(shared.lsn.get());
    h.b.release_durable();
    assert_eq!(acks(&h.out(publ)), ["puback"]);
    assert_eq!(h.b.held_acks(), 0);

    // Back online: the queued message goes out (send), PUBACK completes it.
    let (sub, mut out) = h.connect_with("sub", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(3600)
    });
    out.packets.extend(h.out(sub).packets);
    assert_eq!(out.payloads(), ["m"]);
    let pid = out.publishes()[0].packet_id;
    let ev = take(&shared);
    assert!(ev.contains(&format!("send sub 1 pid {pid}")), "{ev:?}");
    h.send(sub, Packet::PubAck(ack(pid)));
    assert_eq!(
        take(&shared),
        [format!("complete sub {pid}"), "commit".into()]
    );
}

#[test]
fn stored_qos2_delivery_waits_for_its_send_record() {
    let (mut h, shared) = durable_h();
    let sub = persistent(&mut h, "sub");
    h.subscribe(sub, "t", opts(QoS::ExactlyOnce));
    h.b.connection_lost(h.now, sub);
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t", "once", QoS::ExactlyOnce, 1)),
    );
    shared.durable.set(shared.lsn.get());
    h.b.release_durable();
    take(&shared);
    let (sub, mut out) = h.connect_with("sub", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(3600)
    });
    out.packets.extend(h.out(sub).packets);
    assert!(
        out.payloads().is_empty(),
        "QoS 2 PUBLISH before its send record is durable"
    );
    assert!(take(&shared).iter().any(|e| e.starts_with("send sub")));
    shared.durable.set(shared.lsn.get());
    h.b.release_durable();
    assert_eq!(h.out(sub).payloads(), ["once"]);
}

#[test]
fn fan_out_writes_the_payload_once() {
    let (mut h, shared) = durable_h();
    for id in ["a", "b", "c"] {
        let c = persistent(&mut h, id);
        h.subscribe(c, "t/#", opts(QoS::AtLeastOnce));
        h.b.connection_lost(h.now, c);
    }
    let clean = h.client("clean");
    h.subscribe(clean, "t/#", opts(QoS::AtLeastOnce));
    take(&shared);
    let publ = h.client("pub");
    h.send(
        publ,
        Packet::Publish(publish("t/x", "big", QoS::AtLeastOnce, 7)),
    );
    let ev = take(&shared);
    assert_eq!(
        ev.iter().filter(|e| e.starts_with("put_message")).count(),
        1,
        "{ev:?}"
    );
    assert_eq!(
        ev.iter().filter(|e| e.starts_with("enqueue")).count(),
        3,
        "{ev:?}"
    );
    assert_eq!(
        ev.iter().filter(|e| e.starts_with("commit")).count(),
        1,
        "{ev:?}"
    );
    assert_eq!(h.out(clean).payloads(), ["big"]);
}

#[test]
fn qos2_from_a_persistent_publisher_keeps_its_packet_id() {
    let (mut h, shared) = durable_h();
    let publ = persistent(&mut h, "pub");
    take(&shared);
    h.send(
        publ,
        Packet::Publish(publish("nobody", "m", QoS::ExactlyOnce, 9)),
    );
    assert_eq!(take(&shared), ["qos2_received pub 9", "commit"]);
    assert!(acks(&h.out(publ)).is_empty());
    shared.durable.set(shared.lsn.get());
    h.b.release_durable();
    assert_eq!(acks(&h.out(publ)), ["pubrec"]);
    h.send(publ, Packet::PubRel(ack(9)));
    assert_eq!(take(&shared), ["qos2_released pub 9", "commit"]);
    shared.durable.set(shared.lsn.get());
    h.b.release_durable();
    assert_eq!(acks(&h.out(publ)), ["pubcomp"]);
}

#[test]
fn retained_set_and_clear_are_written() {
    let (mut h, shared) = durable_h();
    let publ = h.client("pub");
    let mut p = publish("r", "keep", QoS::AtMostOnce, 0);
    p.retain = true;
    h.send(publ, Packet::Publish(p));
    assert_eq!(
        take(&shared),
        ["put_message 1 keep", "set_retained r 1", "commit"]
    );
    let mut p = publish("r", "", QoS::AtLeastOnce, 3);
    p.retain = true;
    h.send(publ, Packet::Publish(p));
    assert_eq!(take(&shared), ["clear_retained r", "commit"]);
    assert!(acks(&h.out(publ)).is_empty());
    shared.durable.set(shared.lsn.get());
    h.b.release_durable();
    assert_eq!(acks(&h.out(publ)), ["puback"]);
}

#[test]
fn clean_start_unsubscribe_expiry_and_wills() {
    let (mut h, shared) = durable_h();
    let c = h
        .connect_with("w", Protocol::V5, false, |c| {
            c.properties.session_expiry_interval = Some(60);
            let mut w = will("w/gone", "bye");
            w.properties.will_delay_interval = Some(10);
            c.will = Some(w);
        })
        .0;
    h.subscribe(c, "a", opts(QoS::AtLeastOnce));
    h.send(
        c,
        Packet::Unsubscribe(zerofan_codec::Unsubscribe {
            packet_id: 5,
            properties: Default::default(),
            filters: vec![s("a")],
        }),
    );
    h.b.connection_lost(h.now, c);
    let ev = take(&shared);
    assert!(ev.contains(&"unsubscribe w a".to_string()), "{ev:?}");
    assert!(ev.contains(&"set_will w w/gone".to_string()), "{ev:?}");
    h.secs(11);
    assert_eq!(take(&shared), ["clear_will w", "commit"]);
    h.secs(60);
    assert_eq!(take(&shared), ["drop_session w", "commit"]);
    // Clean start drops what the store had.
    let c = persistent(&mut h, "x");
    h.b.connection_lost(h.now, c);
    take(&shared);
    let _ = h.connect_with("x", Protocol::V5, true, |c| {
        c.properties.session_expiry_interval = Some(60)
    });
    let ev = take(&shared);
    assert_eq!(ev[0], "drop_session x", "{ev:?}");
    assert!(ev.contains(&"put_session x 60 none".to_string()), "{ev:?}");
}

#[test]
fn restore_rebuilds_sessions_queues_inflight_and_retained() {
    use std::sync::Arc;
    use zerofan_store::{
        InflightPhase, Recovered, RecoveredEntry, RecoveredInflight, RecoveredRetained,
        RecoveredSession, RecoveredSubscription,
    };
    let (mut h, shared) = durable_h();
    let msg = |p: &str, qos: u8| {
        Arc::new(StoredMessage {
            topic: Bytes::from_static(b"t"),
            payload: Bytes::copy_from_slice(p.as_bytes()),
            qos,
            ..Default::default()
        })
    };
    let entry = |id: u64, m: &Arc<StoredMessage>, mid: u64| RecoveredEntry {
        id: EntryId(id),
        entry: QueueEntry {
            msg: MsgId(mid),
            qos: m.qos,
            ..Default::default()
        },
        message: m.clone(),
    };
    let (m1, m2, r) = (msg("inflight", 1), msg("queued", 1), msg("ret", 0));
    let recovered = Recovered {
        retained: vec![RecoveredRetained {
            topic: "t".into(),
            msg: MsgId(3),
            message: r,
        }],
        sessions: vec![
            RecoveredSession {
                client_id: "s".into(),
                meta: SessionMeta {
                    expiry_interval: 3600,
                    expires_at_ms: Some(1_000_000 + 3_600_000),
                },
                subscriptions: vec![RecoveredSubscription {
                    filter: "t".into(),
                    options: SubOptions {
                        qos: 1,
                        ..Default::default()
                    },
                    id: None,
                }],
                queue: vec![entry(2, &m2, 2)],
                inflight: vec![
                    RecoveredInflight {
                        packet_id: 7,
                        phase: InflightPhase::PublishSent,
                        entry: Some(entry(1, &m1, 1)),
                    },
                    RecoveredInflight {
                        packet_id: 8,
                        phase: InflightPhase::PubrecReceived,
                        entry: None,
                    },
                ],
                incoming_qos2: vec![4],
                will: None,
                epoch: 0,
                version: 0,
            },
            RecoveredSession {
                client_id: "expired".into(),
                meta: SessionMeta {
                    expiry_interval: 10,
                    expires_at_ms: Some(999_000),
                },
                subscriptions: Vec::new(),
                queue: Vec::new(),
                inflight: Vec::new(),
                incoming_qos2: Vec::new(),
                will: None,
                epoch: 0,
                version: 0,
            },
        ],
        report: Default::default(),
    };
    let now = h.now;
    h.b.restore(recovered, now);
    assert_eq!(take(&shared), ["drop_session expired", "commit"]);
    assert_eq!(h.b.session_count(), 1);
    assert_eq!(h.b.retained_count(), 1);
    let (c, mut out) = h.connect_with("s", Protocol::V5, false, |c| {
        c.properties.session_expiry_interval = Some(3600)
    });
    assert!(out.connack().unwrap().session_present);
    out.packets.extend(h.out(c).packets);
    let pubs = out.publishes();
    assert_eq!(out.payloads(), ["inflight", "queued"]);
    assert!(pubs[0].dup && pubs[0].packet_id == 7);
    assert!(out
        .packets
        .iter()
        .any(|p| matches!(p, Packet::PubRel(a) if a.packet_id == 8)));
    // The inbound QoS 2 id survived: a resend is acknowledged, not routed.
    let publ = h.client("p");
    h.subscribe(publ, "t", opts(QoS::AtMostOnce));
    let _ = h.out(publ);
    h.send(
        c,
        Packet::Publish(publish("t", "again", QoS::ExactlyOnce, 4)),
    );
    assert!(h.out(publ).payloads().is_empty());
}

/// Two cores as shards, each with its own fake log; batches moved by hand.
fn peered() -> ([(H, Rc<Shared>); 2], [crate::core::PeerId; 2]) {
    use crate::core::PeerId;
    let ids = [PeerId(0), PeerId(1)];
    let mut a = durable_h();
    let mut b = durable_h();
    a.0.b.set_peers(ids[0], &ids);
    b.0.b.set_peers(ids[1], &ids);
    ([a, b], ids)
}

fn pump(cores: &mut [(H, Rc<Shared>); 2]) {
    for _ in 0..100 {
        let mut moved = false;
        for i in 0..2 {
            while let Some(batch) = cores[i].0.b.poll_peer_transmit() {
                moved = true;
                let to = &mut cores[usize::from(batch.to.0)].0;
                for e in batch.events {
                    let now = to.now;
                    to.b.handle_peer(now, crate::core::PeerId(i as u16), e);
                }
            }
        }
        if !moved {
            return;
        }
    }
    panic!("peers never went quiet");
}

/// A QoS 1 message that crosses to another shard for a persistent session
/// there is acknowledged to its publisher only once that shard's store
/// has it durable: a kill -9 between the two cannot lose it.
#[test]
fn an_ack_waits_for_the_store_of_the_shard_that_queued_it() {
    let (mut cores, _) = peered();
    let sub = persistent(&mut cores[1].0, "sub");
    cores[1].0.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    pump(&mut cores);
    let durable_now = cores[1].1.lsn.get();
    cores[1].1.durable.set(durable_now);
    cores[1].0.b.release_durable();
    pump(&mut cores);
    assert!(acks(&cores[1].0.out(sub)).is_empty());
    cores[1]
        .0
        .send(sub, Packet::Disconnect(Disconnect::default()));
    cores[1].0.b.connection_lost(cores[1].0.now, sub);
    let durable_now = cores[1].1.lsn.get();
    cores[1].1.durable.set(durable_now);
    cores[1].0.b.release_durable();
    pump(&mut cores);

    let publ = cores[0].0.client("pub");
    cores[0].0.send(
        publ,
        Packet::Publish(publish("t", "m", QoS::AtLeastOnce, 1)),
    );
    pump(&mut cores);
    assert!(take(&cores[0].1).is_empty(), "the publisher's shard wrote");
    assert!(
        take(&cores[1].1)
            .iter()
            .any(|e| e.starts_with("enqueue sub")),
        "the subscriber's shard queued it"
    );
    assert!(
        acks(&cores[0].0.out(publ)).is_empty(),
        "acknowledged before the other shard's store had it"
    );
    let lsn = cores[1].1.lsn.get();
    cores[1].1.durable.set(lsn);
    cores[1].0.b.release_durable();
    pump(&mut cores);
    assert_eq!(acks(&cores[0].0.out(publ)), ["puback"]);

    // QoS 0, and QoS 1 that crosses to no shard, are not held.
    cores[0].0.send(
        publ,
        Packet::Publish(publish("t", "q0", QoS::AtMostOnce, 0)),
    );
    cores[0].0.send(
        publ,
        Packet::Publish(publish("other", "x", QoS::AtLeastOnce, 2)),
    );
    pump(&mut cores);
    assert_eq!(acks(&cores[0].0.out(publ)), ["puback"]);
}

/// A peer's replicated change that writes nothing (the empty change a
/// peer sends to ask for answers lost with a link) is answered at once
/// when everything committed so far is durable: the store, which has
/// nothing new to write, will not report progress again.
#[test]
fn an_empty_replicated_change_is_answered_without_a_new_commit() {
    use crate::core::peer::PeerEvent;
    let (mut cores, ids) = peered();
    // Something committed and durable before.
    let sub = persistent(&mut cores[1].0, "sub");
    cores[1].0.subscribe(sub, "t", opts(QoS::AtLeastOnce));
    pump(&mut cores);
    let lsn = cores[1].1.lsn.get();
    assert!(lsn > 0, "the subscription was committed");
    cores[1].1.durable.set(lsn);
    cores[1].0.b.release_durable();
    pump(&mut cores);

    let now = cores[1].0.now;
    cores[1].0.b.handle_peer(
        now,
        ids[0],
        PeerEvent::Replicate {
            seq: 7,
            ops: Vec::new().into(),
        },
    );
    let mut answered = false;
    while let Some(batch) = cores[1].0.b.poll_peer_transmit() {
        answered |= batch
            .events
            .iter()
            .any(|e| matches!(e, PeerEvent::ReplicaAck { seq: 7 }));
    }
    assert!(
        answered,
        "the answer waits for a store report that never comes"
    );
}

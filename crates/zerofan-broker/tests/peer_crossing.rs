//! What a publish costs when it crosses to another shard: two cores as
//! shards of one broker, driven as the shell drives them (poll one core's
//! batches, hand each event to the other, give the emptied batch back),
//! with a counting allocator. After warm-up, a message crossing costs one
//! allocation more than one delivered on its own shard: the `Rc` the
//! receiving shard's queues share.

use std::net::SocketAddr;
use std::time::Instant;
use zerofan_broker::config::Config;
use zerofan_broker::core::{Broker, ConnId, Outgoing, PeerId};
use zerofan_codec::{Connect, MqttStr, Packet, Protocol, Publish, QoS, Subscribe};

#[path = "common/counting.rs"]
mod counting;

fn shard(me: u16, now: Instant) -> Broker {
    let mut b = Broker::new(
        Config {
            sys_interval: 0,
            ..Config::default()
        },
        now,
    );
    b.set_peers(PeerId(me), &[PeerId(0), PeerId(1)]);
    b
}

fn connect(b: &mut Broker, now: Instant, id: &str) -> ConnId {
    let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
    let c = b.connection_opened(now, peer);
    b.handle_packet(
        now,
        c,
        Packet::Connect(Box::new(Connect {
            protocol: Protocol::V311,
            clean_start: true,
            keep_alive: 60,
            properties: Default::default(),
            client_id: MqttStr::try_from(id).unwrap(),
            will: None,
            username: None,
            password: None,
            bridge: false,
        })),
    );
    drain(b, now, c);
    c
}

/// Take `c`'s output as the writer would; returns the PUBLISH packets.
fn drain(b: &mut Broker, now: Instant, c: ConnId) -> usize {
    let mut n = 0;
    let mut batch = Vec::new();
    for _ in 0..10_000 {
        batch.clear();
        b.poll_transmit(now, c, &mut batch, 64);
        if batch.is_empty() {
            break;
        }
        n += batch
            .iter()
            .filter(|o| matches!(o, Outgoing::Publish(_)))
            .count();
    }
    n
}

/// Move every batch between the two shards, as `shell::shards` does.
fn pump(shards: &mut [Broker; 2], now: Instant) {
    for _ in 0..100 {
        let mut moved = false;
        for from in 0..2 {
            while let Some(mut batch) = shards[from].poll_peer_transmit() {
                moved = true;
                let to = usize::from(batch.to.0);
                for event in batch.events.drain(..) {
                    shards[to].handle_peer(now, PeerId(from as u16), event);
                }
                // The receiver hands the emptied batch back to its sender.
                shards[from].reuse_peer_batch(batch);
            }
        }
        if !moved {
            return;
        }
    }
    panic!("the shards never went quiet");
}

/// `n` QoS 0 PUBLISH packets to `topic`, built before anything is counted.
/// Topic and payload are shared buffers, as a read buffer's slices are
/// (cloning them allocates nothing).
fn packets(topic: &'static str, n: usize) -> Vec<Packet> {
    let payload = bytes::Bytes::from_static(&[7u8; 256]);
    (0..n)
        .map(|_| {
            Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtMostOnce,
                retain: false,
                topic: MqttStr::from_static(topic),
                packet_id: 0,
                payload: payload.clone(),
                properties: Default::default(),
            })
        })
        .collect()
}

fn subscribe(b: &mut Broker, now: Instant, c: ConnId, filter: &'static str) {
    b.handle_packet(
        now,
        c,
        Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Default::default(),
            filters: vec![(MqttStr::from_static(filter), Default::default())],
        }),
    );
}

/// The same messages published on shard 0, once for a subscriber on shard
/// 1 and once for one on shard 0: the crossing may add one allocation per
/// message (the receiving shard's `Rc`), nothing else (no batch buffer, no
/// copy of the message, no box per event).
#[test]
fn a_crossing_allocates_nothing_per_message_but_the_receivers_rc() {
    const N: usize = 256;
    let now = Instant::now();
    let mut shards = [shard(0, now), shard(1, now)];
    let far = connect(&mut shards[1], now, "far");
    subscribe(&mut shards[1], now, far, "c/#");
    let near = connect(&mut shards[0], now, "near");
    subscribe(&mut shards[0], now, near, "l/#");
    pump(&mut shards, now);
    drain(&mut shards[1], now, far);
    drain(&mut shards[0], now, near);
    let publ = connect(&mut shards[0], now, "pub");
    let mut rounds = Vec::new();
    for round in 0..4 {
        let (crossing, local) = (packets("c/x", N), packets("l/x", N));
        let before = counting::allocations_here();
        for p in crossing {
            shards[0].handle_packet(now, publ, p);
        }
        pump(&mut shards, now);
        let crossed = counting::allocations_here() - before;
        let before = counting::allocations_here();
        for p in local {
            shards[0].handle_packet(now, publ, p);
        }
        pump(&mut shards, now);
        let stayed = counting::allocations_here() - before;
        rounds.push((crossed, stayed));
        assert_eq!(drain(&mut shards[1], now, far), N, "round {round}");
        assert_eq!(drain(&mut shards[0], now, near), N, "round {round}");
    }
    // Round 0 grows the buffers that are reused from then on.
    let (crossed, stayed) = rounds[3];
    assert!(
        crossed <= stayed + N as u64,
        "{N} messages: {crossed} allocations crossing, {stayed} staying \
         (by round: {rounds:?})"
    );
    assert!(
        stayed >= N as u64,
        "one Rc per message published: {rounds:?}"
    );
}

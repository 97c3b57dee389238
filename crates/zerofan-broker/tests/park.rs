//! Parked connections (`park_after_ms`, `shell/park.rs`): a quiet
//! connection gives up its task and its socket waits in the broker's shared
//! poller. Whatever a client can see must not change: deliveries reach a
//! parked subscriber, a parked publisher's packets are read, keep alive,
//! wills and shutdown work for parked connections.

mod common;

use bytes::Bytes;
use common::{disconnect_reason, stats_until, Client};
use std::sync::Mutex;
use zerofan_broker::config::Config;
use zerofan_broker::embed::{self, BrokerHandle};
use zerofan_codec::{Packet, Publish, QoS, ReasonCode, Will};

/// One broker at a time: the figures asserted on are per broker, but the
/// machine has two cores and the sweeps are timed.
static SERIAL: Mutex<()> = Mutex::new(());

fn broker() -> (std::sync::MutexGuard<'static, ()>, BrokerHandle) {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let config = Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        sys_interval: 0,
        // The sweep's smallest wait: a connection quiet for one sweep
        // (250 ms) parks.
        park_after_ms: 1,
        ..Config::default()
    };
    (guard, embed::spawn(config).unwrap())
}

/// A client id from `name` whose session lives on shard 0 (of `shards`):
/// `stats()` reads that shard's figures as they are, another shard's as
/// of its last tick (up to 250 ms old), and the counts asserted on must
/// be current.
fn on_shard_0(name: &str, shards: usize) -> String {
    (0..1000)
        .map(|i| format!("{name}-{i}"))
        .find(|id| zerofan_broker::core::shard_of(id.as_bytes(), shards) == 0)
        .expect("an id on shard 0 within 1000 tries")
}

#[test]
fn parked_subscribers_get_deliveries_and_parked_publishers_are_read() {
    let (_g, b) = broker();
    let addr = b.local_addrs()[0];
    let shards = Config::default().shard_count();
    let mut sub = Client::connect(addr, &on_shard_0("sub", shards));
    sub.subscribe("t/#");
    let mut publ = Client::connect(addr, &on_shard_0("pub", shards));
    // Both quiet: the subscriber parks at the next sweep, the publisher at
    // once after its CONNACK.
    stats_until(&b, "both parked", |s| s.connections_parked == 2);
    for i in 0..3u8 {
        // The publisher's bytes wake it through the shared poller; the
        // delivery wakes the subscriber through the core.
        publ.send(&Packet::Publish(Publish {
            qos: QoS::AtLeastOnce,
            packet_id: 1,
            topic: "t/x".try_into().unwrap(),
            payload: Bytes::from(vec![i; 3]),
            ..Publish::default()
        }));
        assert!(matches!(publ.recv(), Some(Packet::PubAck(a)) if a.packet_id == 1));
        let p = sub.expect_publish();
        assert_eq!(&p.payload[..], &[i; 3]);
        stats_until(&b, "parked again", |s| s.connections_parked == 2);
    }
    let s = b.stats();
    assert!(
        s.snapshot.shell.connection_parks >= 8,
        "parks: {}",
        s.snapshot.shell.connection_parks
    );
    assert_eq!(s.clients_connected, 2);
}

#[test]
fn keep_alive_expires_for_a_parked_connection() {
    let (_g, b) = broker();
    let addr = b.local_addrs()[0];
    let mut c = Client::connect_with(addr, "ka", |c| c.keep_alive = 1);
    stats_until(&b, "parked", |s| s.connections_parked == 1);
    // Silent for 1.5 keep-alive intervals: the broker says why and closes.
    assert_eq!(
        disconnect_reason(c.recv()),
        Some(ReasonCode::KEEP_ALIVE_TIMEOUT)
    );
    assert!(c.recv().is_none());
    stats_until(&b, "gone", |s| {
        s.connections_open == 0 && s.connections_parked == 0
    });
}

#[test]
fn a_parked_connection_that_drops_publishes_its_will() {
    let (_g, b) = broker();
    let addr = b.local_addrs()[0];
    let mut watcher = Client::connect(addr, "watcher");
    watcher.subscribe("will/#");
    let dying = Client::connect_with(addr, "dying", |c| {
        c.will = Some(Will {
            topic: "will/dying".try_into().unwrap(),
            payload: Bytes::from_static(b"gone"),
            qos: QoS::AtMostOnce,
            retain: false,
            properties: Default::default(),
        })
    });
    stats_until(&b, "parked", |s| s.connections_parked == 2);
    // The close reaches the broker through the shared poller.
    drop(dying);
    let p = watcher.expect_publish();
    assert_eq!(p.topic.as_str(), "will/dying");
    assert_eq!(&p.payload[..], b"gone");
}

#[test]
fn shutdown_tells_parked_clients() {
    let (_g, b) = broker();
    let addr = b.local_addrs()[0];
    let mut clients: Vec<Client> = (0..5)
        .map(|i| Client::connect(addr, &format!("c{i}")))
        .collect();
    stats_until(&b, "parked", |s| s.connections_parked == 5);
    b.shutdown().unwrap();
    for c in &mut clients {
        assert_eq!(
            disconnect_reason(c.recv()),
            Some(ReasonCode::SERVER_SHUTTING_DOWN)
        );
    }
}

#[test]
fn a_device_parks_again_right_after_its_first_exchange() {
    device_parks_after_connack_and_suback(1);
}

#[test]
fn a_device_parks_again_after_a_suback_that_waited_for_other_shards() {
    // With several shards the SUBACK waits until every shard routes the
    // filter: the connection must not spend its quick park while it waits,
    // or once the SUBACK is out it keeps its task for `park_after_ms`.
    device_parks_after_connack_and_suback(4);
}

#[test]
fn a_device_that_pings_after_a_long_park_parks_again_at_once() {
    // Parked for longer than the sweep waits before parking a quiet
    // connection, a device's PINGREQ wakes it for one exchange: it parks
    // again as soon as that is over, not a sweep's wait later (meanwhile it
    // would hold a task and a tokio registration; at a million devices
    // pinging, a good share of them).
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let wait = std::time::Duration::from_millis(3000);
    let config = Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        sys_interval: 0,
        park_after_ms: wait.as_millis() as u64,
        threads: 1,
        ..Config::default()
    };
    let b = embed::spawn(config).unwrap();
    let addr = b.local_addrs()[0];
    let mut dev = Client::connect(addr, "device");
    dev.subscribe("dev/cmd");
    stats_until(&b, "parked after SUBACK", |s| {
        s.connections_parked == 1 && s.snapshot.shell.connection_parks == 2
    });
    // Parked for the sweep's whole wait (the sweep counts it in ticks).
    std::thread::sleep(wait + std::time::Duration::from_millis(500));
    let pinged = std::time::Instant::now();
    dev.send(&Packet::PingReq);
    assert!(matches!(dev.recv(), Some(Packet::PingResp)));
    stats_until(&b, "parked after the ping", |s| {
        s.connections_parked == 1 && s.snapshot.shell.connection_parks == 3
    });
    // The sweep would have parked it no sooner than `wait` less one tick.
    let took = pinged.elapsed();
    assert!(took < wait / 2, "parked again only after {took:?}");
    drop(guard);
}

fn device_parks_after_connack_and_suback(threads: usize) {
    // The sweep would take a minute: only the quick parks can happen here.
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let config = Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        sys_interval: 0,
        park_after_ms: 60_000,
        threads,
        ..Config::default()
    };
    let b = embed::spawn(config).unwrap();
    let addr = b.local_addrs()[0];
    // CONNECT, CONNACK: parked at once (its SUBSCRIBE is not sent yet).
    let mut dev = Client::connect(addr, &on_shard_0("device", threads));
    stats_until(&b, "parked after CONNACK", |s| s.connections_parked == 1);
    // Its SUBSCRIBE wakes it; once answered and quiet it parks again,
    // rather than hold a task for `park_after_ms` (in a storm, a whole
    // second's worth of connections in tasks).
    dev.subscribe("dev/cmd");
    stats_until(&b, "parked after SUBACK", |s| {
        s.connections_parked == 1 && s.snapshot.shell.connection_parks == 2
    });
    // Not a third time: a client that keeps talking keeps its task until
    // it is quiet for `park_after_ms`.
    dev.send(&Packet::PingReq);
    assert!(matches!(dev.recv(), Some(Packet::PingResp)));
    stats_until(&b, "running", |s| s.connections_parked == 0);
    drop(guard);
}

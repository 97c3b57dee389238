//! Start-up with several shards: each restores its persistent sessions
//! from the store and tells the others what they subscribe to. No listener
//! may serve before every shard has applied what the others restored, or a
//! QoS 1 message published in the first moments is acknowledged while a
//! persistent session on another shard never gets it.

mod common;

use bytes::Bytes;
use common::{http_get, stats_until, Client, Scratch};
use std::time::{Duration, Instant};
use zerofan_broker::config::Config;
use zerofan_broker::embed;
use zerofan_codec::{Packet, Publish, QoS, Subscribe, SubscriptionOptions};

const SHARDS: usize = 4;

fn config(dir: &Scratch) -> Config {
    Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        sys_interval: 0,
        threads: SHARDS,
        data_dir: Some(dir.path("data")),
        ..Config::default()
    }
}

/// A client id whose session lives on shard `shard`.
fn id_on(shard: usize) -> String {
    (0..1000)
        .map(|i| format!("keeper-{i}"))
        .find(|id| zerofan_broker::core::shard_of(id.as_bytes(), SHARDS) == shard)
        .expect("an id for every shard within 1000 tries")
}

/// A session that outlives its connection (by an hour).
fn persistent(addr: std::net::SocketAddr, id: &str) -> Client {
    Client::connect_with(addr, id, |k| {
        k.clean_start = false;
        k.properties.session_expiry_interval = Some(3600);
    })
}

/// Persistent sessions, one per shard, subscribed to `news/#` at QoS 1,
/// in the store under `dir`; returns their client ids.
fn keepers(dir: &Scratch) -> Vec<String> {
    let ids: Vec<String> = (0..SHARDS).map(id_on).collect();
    let b = embed::spawn(config(dir)).unwrap();
    let addr = b.local_addrs()[0];
    for id in &ids {
        let mut c = persistent(addr, id);
        c.send(&Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Default::default(),
            filters: vec![(
                "news/#".try_into().unwrap(),
                SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..SubscriptionOptions::default()
                },
            )],
        }));
        assert!(matches!(c.recv(), Some(Packet::SubAck(_))));
    }
    b.shutdown().unwrap();
    ids
}

#[test]
fn a_publish_right_after_a_restart_reaches_every_restored_session() {
    let dir = Scratch::new("start-gate");
    let ids = keepers(&dir);
    // Every shard is slow to apply what the others restored: for that long
    // a shard that served would route to its own sessions only.
    let b = embed::spawn_with_slow_peers(config(&dir), Duration::from_millis(1500)).unwrap();
    let addr = b.local_addrs()[0];
    // An empty client id stays on the shard that accepted it.
    let mut publisher = Client::connect(addr, "");
    publisher.send(&Packet::Publish(Publish {
        qos: QoS::AtLeastOnce,
        packet_id: 7,
        topic: "news/today".try_into().unwrap(),
        payload: Bytes::from_static(b"first"),
        ..Publish::default()
    }));
    assert!(matches!(publisher.recv(), Some(Packet::PubAck(a)) if a.packet_id == 7));
    // Acknowledged: every persistent session has it queued.
    let mut missed = Vec::new();
    for id in &ids {
        let mut c = persistent(addr, id);
        c.s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        match c.recv() {
            Some(Packet::Publish(p)) if &p.payload[..] == b"first" => {}
            other => missed.push(format!("{id}: {other:?}")),
        }
    }
    assert!(missed.is_empty(), "acknowledged, not delivered: {missed:?}");
    // Served once every shard applied the others' sessions, not after the
    // longest wait.
    assert_eq!(b.stats().snapshot.shell.shard_start_timeouts, 0);
    b.shutdown().unwrap();
}

#[test]
fn a_shard_that_never_catches_up_holds_the_listeners_only_so_long() {
    let dir = Scratch::new("start-gate-wait");
    keepers(&dir);
    // Slower than the 5 s the listeners wait.
    let started = Instant::now();
    let b = embed::spawn_with_slow_peers(config(&dir), Duration::from_secs(7)).unwrap();
    let mut c = Client::connect(b.local_addrs()[0], "");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(4) && waited < Duration::from_secs(7),
        "served after {waited:?}"
    );
    c.ping();
    // Every shard counts its own wait, once for all its listeners.
    stats_until(&b, "the waits counted", |s| {
        s.snapshot.shell.shard_start_timeouts == SHARDS as u64
    });
}

/// The status line of the reply to `GET path` on `addr`.
fn http_status(addr: std::net::SocketAddr, path: &str) -> String {
    let reply = http_get(addr, path);
    reply.lines().next().unwrap_or_default().to_string()
}

#[test]
fn readyz_says_ready_only_once_the_listeners_serve() {
    let dir = Scratch::new("start-gate-readyz");
    keepers(&dir);
    let http = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let http_addr = http.local_addr().unwrap();
    drop(http);
    let b = embed::spawn_with_slow_peers(
        Config {
            http: Some(http_addr),
            ..config(&dir)
        },
        Duration::from_millis(2500),
    )
    .unwrap();
    // The gate is closed for about 2.5 s: an orchestrator must not send
    // clients yet.
    let status = http_status(http_addr, "/readyz");
    assert!(status.contains(" 503 "), "while closed: {status}");
    // Served: ready (every shard opens its gate at the same moment, give
    // or take a turn of its loop).
    let mut c = Client::connect(b.local_addrs()[0], "");
    c.ping();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let status = http_status(http_addr, "/readyz");
        if status.contains(" 200 ") {
            break;
        }
        assert!(Instant::now() < deadline, "once serving: {status}");
        std::thread::sleep(Duration::from_millis(20));
    }
    b.shutdown().unwrap();
}

//! `zerofan_broker::embed`: a broker spawned on its own thread, its figures
//! read from the core (with `$SYS` off, so they cannot come from there), and
//! a graceful shutdown that MQTT 5 clients see as DISCONNECT 0x8B, that
//! flushes the store and that leaves no thread behind.

mod common;

use common::{disconnect_reason, stats_until, Client};
use std::net::TcpStream;
use std::sync::Mutex;
use zerofan_broker::config::Config;
use zerofan_broker::embed;
use zerofan_codec::ReasonCode;

/// The tests count the process's broker threads: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn config() -> Config {
    Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        sys_interval: 0,
        ..Config::default()
    }
}

/// One shard: a shard thread is named by itself once it runs, and until
/// then carries the name of the thread that spawned it, so a count of
/// `zerofan-broker` threads right after spawn would see it too.
fn one_shard() -> Config {
    Config {
        threads: 1,
        ..config()
    }
}

/// Threads of this process named `zerofan-broker` (Linux; elsewhere 0).
fn broker_threads() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim() == "zerofan-broker")
        .count()
}

#[test]
fn spawned_broker_serves_and_its_stats_move() {
    let _g = serial();
    let b = embed::spawn(config()).expect("spawn");
    let addr = b.local_addrs()[0];
    assert_ne!(addr.port(), 0, "the real port of port 0");
    assert_eq!(b.local_listeners()[0].1, "mqtt");
    assert!(b.is_running());
    let s0 = b.stats();
    assert_eq!(s0.clients_connected, 0);
    assert_eq!(s0.messages_received, 0);

    let mut sub = Client::connect(addr, "sub");
    sub.subscribe("t/#");
    let mut publ = Client::connect(addr, "pub");
    for i in 0..3u8 {
        publ.publish("t/a", &[i; 100], false);
    }
    publ.publish("t/keep", b"retained", true);
    for i in 0..3u8 {
        assert_eq!(&sub.expect_publish().payload[..], &[i; 100][..]);
    }
    assert_eq!(&sub.expect_publish().payload[..], b"retained");

    let s = stats_until(&b, "4 in, 4 out", |s| {
        s.messages_received == 4 && s.messages_sent == 4
    });
    assert_eq!(s.clients_connected, 2);
    assert_eq!(s.connections_total, 2);
    assert_eq!(s.subscriptions, 1);
    assert_eq!(s.retained, 1);
    assert_eq!(s.payload_bytes_received, 3 * 100 + 8);
    assert_eq!(s.payload_bytes_sent, 3 * 100 + 8);
    assert!(s.bytes_received > s.payload_bytes_received, "{s:?}");
    assert!(s.bytes_sent > s.payload_bytes_sent, "{s:?}");
    assert!(s.pool_gets > 0, "reads use the pool: {s:?}");
    assert!(s.uptime > s0.uptime);
    assert_eq!(s.snapshot.metrics.messages_received, 4, "the full figures");
    // The cached figures are those of the last answer (or newer).
    assert!(b.latest_stats().messages_received >= 4);

    drop(publ);
    stats_until(&b, "publisher gone", |s| s.clients_connected == 1);
    b.shutdown().expect("shutdown");
}

/// Threads of this process whose name starts with `prefix` (Linux).
fn threads_named(prefix: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim().starts_with(prefix))
        .count()
}

/// Waits (bounded) until `want` threads named `zerofan-shard*` run.
fn shard_threads_until(want: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let n = threads_named("zerofan-shard");
        if n == want || std::time::Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn by_default_one_shard_per_core_and_threads_1_is_one_thread() {
    if !cfg!(target_os = "linux") {
        return;
    }
    let _g = serial();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // `config()` leaves `threads` at its default.
    let b = embed::spawn(config()).expect("spawn");
    let mut c = Client::connect(b.local_addrs()[0], "default-shards");
    c.subscribe("d/#");
    c.publish("d/x", b"hi", false);
    assert_eq!(&c.expect_publish().payload[..], b"hi");
    // Shard 0 runs on the broker thread, the others on threads of theirs.
    assert_eq!(shard_threads_until(cores - 1), cores - 1);
    drop(c);
    b.shutdown().expect("shutdown");
    assert_eq!(shard_threads_until(0), 0);

    let b = embed::spawn(Config {
        threads: 1,
        ..config()
    })
    .expect("spawn");
    let mut c = Client::connect(b.local_addrs()[0], "one-shard");
    c.subscribe("d/#");
    c.publish("d/x", b"hi", false);
    assert_eq!(&c.expect_publish().payload[..], b"hi");
    assert_eq!(threads_named("zerofan-shard"), 0, "no shard thread");
    assert_eq!(broker_threads(), 1);
    drop(c);
    b.shutdown().expect("shutdown");
}

#[test]
fn a_sharded_broker_serves_across_shards_and_counts_them_all() {
    let _g = serial();
    let b = embed::spawn(Config {
        threads: 4,
        ..config()
    })
    .expect("spawn");
    let addr = b.local_addrs()[0];
    // Eight client ids: they hash to several shards.
    let mut subs: Vec<Client> = (0..8)
        .map(|i| {
            let mut c = Client::connect(addr, &format!("shard-sub-{i}"));
            c.subscribe("s/#");
            c
        })
        .collect();
    let mut publ = Client::connect(addr, "shard-pub");
    for i in 0..3u8 {
        publ.publish("s/x", &[i; 10], false);
    }
    for c in &mut subs {
        for i in 0..3u8 {
            assert_eq!(&c.expect_publish().payload[..], &[i; 10][..]);
        }
    }
    let s = stats_until(&b, "every shard's figures", |s| {
        s.messages_sent == 24 && s.clients_connected == 9
    });
    assert_eq!(s.subscriptions, 8);
    assert_eq!(s.messages_received, 3);
    // Per listener and per shard, every shard counted.
    let s = stats_until(&b, "every shard's listener figures", |s| {
        s.snapshot.listeners.first().is_some_and(|l| l.open == 9)
            && s.snapshot.shards.iter().map(|&(c, _)| c).sum::<usize>() == 9
    });
    assert_eq!(s.snapshot.shards.len(), 4);
    assert_eq!(s.snapshot.listeners[0].opened, 9);
    if cfg!(target_os = "linux") {
        assert_eq!(
            threads_named("zerofan-shard"),
            3,
            "shards 1 to 3 (0 is the broker thread)"
        );
    }
    b.shutdown().expect("shutdown");
    assert_eq!(
        threads_named("zerofan-shard"),
        0,
        "the shards stopped with it"
    );
}

#[test]
fn shutdown_sends_0x8b_and_joins_the_thread() {
    let _g = serial();
    let before = broker_threads();
    let b = embed::spawn(one_shard()).expect("spawn");
    if cfg!(target_os = "linux") {
        assert_eq!(broker_threads(), before + 1, "one thread of its own");
    }
    let addr = b.local_addrs()[0];
    let mut c = Client::connect(addr, "c");
    c.ping();
    stats_until(&b, "connected", |s| s.clients_connected == 1);
    b.shutdown().expect("shutdown");
    // shutdown() has returned: the thread is joined, the listener closed.
    assert_eq!(broker_threads(), before, "broker thread gone");
    assert_eq!(
        disconnect_reason(c.recv()),
        Some(ReasonCode::SERVER_SHUTTING_DOWN)
    );
    assert!(c.recv().is_none(), "closed after the DISCONNECT");
    assert!(TcpStream::connect(addr).is_err(), "no longer accepting");
}

#[test]
fn dropping_the_handle_shuts_down_too() {
    let _g = serial();
    let before = broker_threads();
    let b = embed::spawn(one_shard()).expect("spawn");
    let mut c = Client::connect(b.local_addrs()[0], "c");
    c.ping();
    stats_until(&b, "connected", |s| s.clients_connected == 1);
    drop(b);
    assert_eq!(broker_threads(), before, "broker thread gone");
    assert_eq!(
        disconnect_reason(c.recv()),
        Some(ReasonCode::SERVER_SHUTTING_DOWN)
    );
}

#[test]
fn the_store_is_flushed_on_shutdown() {
    let _g = serial();
    let dir = std::env::temp_dir().join(format!("zerofan-embed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let with_store = || Config {
        data_dir: Some(dir.clone()),
        ..config()
    };
    let b = embed::spawn(with_store()).expect("spawn");
    let mut c = Client::connect(b.local_addrs()[0], "c");
    c.publish("kept/a", b"across restarts", true);
    stats_until(&b, "retained", |s| s.retained == 1);
    b.shutdown().expect("shutdown");

    let b = embed::spawn(with_store()).expect("spawn again");
    assert_eq!(b.stats().retained, 1, "restored from the store");
    let mut s = Client::connect(b.local_addrs()[0], "s");
    s.subscribe("kept/#");
    let p = s.expect_publish();
    assert_eq!(&p.payload[..], b"across restarts");
    assert!(p.retain);
    b.shutdown().expect("shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn spawn_fails_on_an_address_in_use_and_leaves_no_thread() {
    let _g = serial();
    let before = broker_threads();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let e = embed::spawn(Config {
        listen: vec![taken.local_addr().unwrap()],
        ..config()
    })
    .expect_err("address in use");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    // A shard thread that was starting carries its spawner's name until it
    // names itself: wait (bounded) for the count to settle.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while broker_threads() != before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(broker_threads(), before);
    assert_eq!(shard_threads_until(0), 0, "no shard thread left");
}

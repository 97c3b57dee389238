//! Heap bytes an idle connection keeps: after CONNECT/CONNACK, a connection
//! is parked and holds no task, no read buffer, no write scratch and no
//! batch, only its state.

use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Duration;
use zerofan_broker::config::Config;

mod common;
#[path = "common/counting.rs"]
mod counting;

use counting::LIVE;

const CLIENTS: usize = 500;

#[test]
fn idle_connections_are_cheap() {
    let broker = zerofan_broker::embed::spawn(Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        sys_interval: 0,
        pool_max_retained_bytes: 0,
        ..Config::default()
    })
    .unwrap();
    let addr = broker.local_addrs()[0];
    // Warm up whatever grows once (maps, the runtime's slabs).
    let warm: Vec<TcpStream> = (0..CLIENTS)
        .map(|i| common::connect_v311(addr, &format!("w{i}")))
        .collect();
    drop(warm);
    std::thread::sleep(Duration::from_millis(300));

    let mut clients = Vec::with_capacity(CLIENTS);
    let before = LIVE.load(Ordering::SeqCst);
    for i in 0..CLIENTS {
        clients.push(common::connect_v311(addr, &format!("c{i}")));
    }
    std::thread::sleep(Duration::from_millis(300));
    let per = (LIVE.load(Ordering::SeqCst) - before) / CLIENTS as i64;
    broker.shutdown().unwrap();
    println!("heap per idle connection: {per} bytes");
    // 146 bytes at 7c97685 (181 with a 24-byte entry in a deadline heap
    // that never shrank, 2026-11-28 at 1144619): the connection is parked
    // (no task, no tokio I/O registration; its socket waits in the shared
    // poller); the core's boxed 128-byte Session (subscriptions and QoS
    // 1/2 state boxed apart until used) with its slots in the session
    // maps, the client id, two 8-byte timer wheel entries (connect
    // timeout and keep alive, for the first 10 s). Not counted here: the
    // connection's two slots, 168 bytes in the core's connection table
    // and 32 in the shell's (asserted in `core/conn_table.rs`), which the
    // warm-up made, as it sized the maps; `bench/scale.sh` counts them in
    // RSS. A connection that does not park (+512), a held read buffer
    // (2 KiB), outbox capacity kept after the CONNACK, or a Session grown
    // past its allocation size class fails this (341 bytes before the
    // connection table, when the boxed Connection was counted).
    assert!(per < 180, "an idle connection keeps {per} heap bytes");
}

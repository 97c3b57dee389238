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
    // 28 bytes, 2026-11-29: the connection is parked (no task, no tokio
    // I/O registration; its socket waits in the shared poller, and the
    // core dropped its empty outbox and session queue when it parked),
    // and what it keeps beyond its slots is its slot in the client-id
    // index and two 8-byte timer wheel entries (connect timeout and keep
    // alive, for the first 10 s). Not counted: the slots the warm-up
    // made, as it sized the tables: the connection's 112 bytes in the
    // core's table and 32 in the shell's, the session's 96 with its client
    // id inline (asserted in `core/slots.rs` and `core/connection.rs`);
    // `tests/scale_state.rs` counts them, and `bench/scale.sh` counts
    // everything in RSS. A connection that does not park (+512), a held
    // read buffer (2 KiB), an outbox kept after parking (+32), or a boxed
    // client id fails this (146 bytes with a boxed Session, 181 with a
    // deadline heap, 341 with a boxed Connection: see git).
    assert!(per < 48, "an idle connection keeps {per} heap bytes");
}

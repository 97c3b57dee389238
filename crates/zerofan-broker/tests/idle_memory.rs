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
    // About 380 bytes: the connection is parked (no task, no tokio I/O
    // registration; its socket waits in the shared poller), the core's
    // boxed Connection (184) and Session (136, subscriptions and QoS 1/2
    // state boxed apart until used), the client id and its shared header,
    // one timer entry; the maps' slots were sized by the warm-up, and hold
    // only 16-byte boxes (which is what keeps them small at 10,000
    // connections). A connection that does not park (+512), a held read
    // buffer (2 KiB), outbox capacity kept after the CONNACK, or a core
    // struct grown past its allocation size class fails this. 456 bytes
    // at 2026-11-25, ab9a8d5 (420 at 1cbdbf5): a Session holds its subscriptions
    // itself (32 bytes, `core/submap.rs`), so that a device's one
    // subscription no longer costs a 184-byte `Flight`. 429 bytes at
    // 2026-11-25 with sessions found by client id without a copy of the id
    // (`core/sessions.rs`), `Connection` 208 -> 192 bytes (the certificate
    // identity among the rare parts) and `Session` 168 -> 160 (a session's
    // `Option<ConnId>` is 8 bytes): each a smaller allocator size class.
    // 405 bytes once the session takes the CONNECT's client id without a
    // clone (a clone gave its bytes a 24-byte shared header). 373 bytes
    // at 2026-11-28 with a 128-byte `Session` (160 before: the client id a
    // `Box<str>`, the expiry an 8-byte stamp, a 24-byte subscription map),
    // and 373 with a 160-byte `Connection` alone (192 before: a compact
    // peer address; the push-back mark and `refuse` kept elsewhere); 341
    // with both. The bound fails if either goes back to its old class.
    assert!(per < 365, "an idle connection keeps {per} heap bytes");
}

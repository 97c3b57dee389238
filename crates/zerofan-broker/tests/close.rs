//! How the broker closes a connection: after its DISCONNECT and FIN it
//! reads on for a moment (`shell/linger.rs`), so a client that writes
//! before it reads the DISCONNECT is not reset and still reads it.

mod common;

use common::{disconnect_reason, stats_until, Client};
use std::io::Write;
use zerofan_broker::config::Config;
use zerofan_broker::embed;
use zerofan_codec::ReasonCode;

const PINGREQ: [u8; 2] = [0xC0, 0x00];

#[test]
fn a_client_writing_after_the_brokers_disconnect_still_reads_it() {
    let b = embed::spawn(Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        sys_interval: 0,
        threads: 1,
        ..Config::default()
    })
    .expect("spawn");
    let mut c = Client::connect(b.local_addrs()[0], "late-reader");
    stats_until(&b, "connected", |s| s.clients_connected == 1);
    // A PUBLISH whose topic length runs past the packet: DISCONNECT 0x81,
    // then the broker closes.
    c.s.write_all(&[0x30, 0x03, 0x00, 0x09, b'a']).unwrap();
    // The broker is done with the connection: without lingering, its
    // socket is closed now.
    stats_until(&b, "connection closed", |s| s.connections_open == 0);
    // The client has not read the DISCONNECT yet and writes. A closed
    // socket answers the first write with a reset (on loopback at once),
    // and the second write fails.
    c.s.write_all(&PINGREQ).expect("first write");
    c.s.write_all(&PINGREQ)
        .expect("second write: the socket was reset, not read on");
    assert_eq!(
        disconnect_reason(c.recv()),
        Some(ReasonCode::MALFORMED_PACKET)
    );
    assert!(c.recv().is_none(), "the FIN after the DISCONNECT");
    b.shutdown().expect("shutdown");
}

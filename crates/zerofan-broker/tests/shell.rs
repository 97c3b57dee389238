//! The real shell over loopback sockets: bad input closes only its own
//! connection with the right reason, and shutdown says 0x8B to MQTT 5
//! clients before the server returns.

mod common;

use bytes::Bytes;
use common::{disconnect_reason, Client};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;
use zerofan_broker::config::Config;
use zerofan_broker::shell::Server;
use zerofan_codec::{Packet, Publish, QoS, ReasonCode};

struct Broker {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Broker {
    fn start(config: Config) -> Broker {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async move {
                let config = Config {
                    listen: vec!["127.0.0.1:0".parse().unwrap()],
                    sys_interval: 0,
                    ..config
                };
                let server = Server::bind(config).await.unwrap();
                addr_tx.send(server.local_addrs()[0]).unwrap();
                server
                    .run(async {
                        let _ = stop_rx.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Broker {
            addr: addr_rx.recv().unwrap(),
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn malformed_and_oversized_packets_close_only_their_connection() {
    let b = Broker::start(Config {
        max_packet_size: 200,
        ..Config::default()
    });
    let mut good = Client::connect(b.addr, "good");

    let mut junk = Client::connect(b.addr, "junk");
    // A PUBLISH whose topic length runs past the packet: malformed.
    junk.s.write_all(&[0x30, 0x03, 0x00, 0x09, b'a']).unwrap();
    assert_eq!(
        disconnect_reason(junk.recv()),
        Some(ReasonCode::MALFORMED_PACKET)
    );
    assert!(junk.recv().is_none(), "closed after the DISCONNECT");

    let mut big = Client::connect(b.addr, "big");
    big.send(&Packet::Publish(Publish {
        qos: QoS::AtMostOnce,
        topic: "t".try_into().unwrap(),
        payload: Bytes::from(vec![0u8; 500]),
        ..Publish::default()
    }));
    assert_eq!(
        disconnect_reason(big.recv()),
        Some(ReasonCode::PACKET_TOO_LARGE)
    );
    assert!(big.recv().is_none());

    good.ping();
}

#[test]
fn a_first_packet_other_than_connect_is_refused_at_its_first_byte() {
    // connect_timeout far beyond the socket's read timeout: the close must
    // come from seeing the wrong packet type, not from the timeout.
    let b = Broker::start(Config {
        connect_timeout: 60,
        ..Config::default()
    });
    // A PUBLISH header announcing 127 bytes that never come.
    let mut s = TcpStream::connect(b.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&[0x30, 0x7f, 0x00]).unwrap();
    let mut buf = [0u8; 16];
    let n = s.read(&mut buf).expect("closed, not timed out");
    assert_eq!(n, 0, "closed without an answer");
    // A CONNECT is still accepted.
    let mut c = Client::connect(b.addr, "after");
    c.ping();
}

#[test]
fn shutdown_sends_server_shutting_down_and_returns() {
    let mut b = Broker::start(Config::default());
    let mut c = Client::connect(b.addr, "c");
    c.ping();
    b.stop();
    assert_eq!(
        disconnect_reason(c.recv()),
        Some(ReasonCode::SERVER_SHUTTING_DOWN)
    );
    assert!(c.recv().is_none());
    assert!(TcpStream::connect(b.addr).is_err(), "no longer accepting");
}

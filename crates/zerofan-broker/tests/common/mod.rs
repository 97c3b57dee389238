//! What the broker's integration tests share: a minimal blocking MQTT 5
//! client, enough to drive the real shell over loopback.
// Each test crate includes this module and uses a part of it.
#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;
use zerofan_codec::{
    Connect, Frame, Packet, Protocol, Publish, QoS, ReasonCode, Subscribe, SubscriptionOptions,
};

/// Poll the embedded broker's `stats()` until `ok` holds (it handles
/// packets on its own thread, a moment after the client wrote them), at
/// most 10 s.
pub fn stats_until(
    b: &zerofan_broker::embed::BrokerHandle,
    what: &str,
    ok: impl Fn(&zerofan_broker::embed::BrokerStats) -> bool,
) -> zerofan_broker::embed::BrokerStats {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = b.stats();
        if ok(&s) {
            return s;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The whole reply to `GET path` (HTTP/1.1, `Connection: close`) from
/// the broker's HTTP listener at `addr`; at most 20 s.
pub fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// A clean-start CONNECT without keep alive, will or credentials.
pub fn connect_packet(protocol: Protocol, id: &str) -> Connect {
    Connect {
        protocol,
        clean_start: true,
        keep_alive: 0,
        properties: Default::default(),
        client_id: id.try_into().unwrap(),
        will: None,
        username: None,
        password: None,
        bridge: false,
    }
}

/// A raw MQTT 3.1.1 connection, connected (CONNACK 0 checked byte for
/// byte), for tests that drive the socket themselves.
pub fn connect_v311(addr: SocketAddr, id: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_nodelay(true).unwrap();
    let mut b = BytesMut::new();
    let connect = Packet::Connect(Box::new(connect_packet(Protocol::V311, id)));
    zerofan_codec::encode(&connect, Protocol::V311, &mut b).unwrap();
    s.write_all(&b).unwrap();
    let mut connack = [0u8; 4];
    s.read_exact(&mut connack).unwrap();
    assert_eq!(connack, [0x20, 2, 0, 0]);
    s
}

/// A minimal MQTT 5 client over a blocking socket.
pub struct Client {
    pub s: TcpStream,
    pub buf: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr, id: &str) -> Client {
        Client::connect_with(addr, id, |_| {})
    }

    /// Connect with a CONNECT that `edit` may change (keep alive, will).
    pub fn connect_with(addr: SocketAddr, id: &str, edit: impl FnOnce(&mut Connect)) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = Client { s, buf: Vec::new() };
        let mut connect = connect_packet(Protocol::V5, id);
        edit(&mut connect);
        c.send(&Packet::Connect(Box::new(connect)));
        assert!(matches!(c.recv(), Some(Packet::ConnAck(a)) if a.reason == ReasonCode::SUCCESS));
        c
    }

    pub fn send(&mut self, p: &Packet) {
        let mut b = BytesMut::new();
        zerofan_codec::encode(p, Protocol::V5, &mut b).unwrap();
        self.s.write_all(&b).unwrap();
    }

    /// The next packet, or `None` at EOF.
    pub fn recv(&mut self) -> Option<Packet> {
        loop {
            if let Frame::Complete(n) = zerofan_codec::frame(&self.buf, u32::MAX) {
                let frame = Bytes::copy_from_slice(&self.buf[..n]);
                self.buf.drain(..n);
                return Some(zerofan_codec::decode(frame, Protocol::V5).unwrap());
            }
            let mut chunk = [0u8; 4096];
            let n = self.s.read(&mut chunk).unwrap_or(0);
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    pub fn subscribe(&mut self, filter: &str) {
        self.send(&Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Default::default(),
            filters: vec![(
                filter.try_into().unwrap(),
                SubscriptionOptions {
                    qos: QoS::AtMostOnce,
                    ..SubscriptionOptions::default()
                },
            )],
        }));
        assert!(matches!(self.recv(), Some(Packet::SubAck(_))));
    }

    pub fn publish(&mut self, topic: &str, payload: &[u8], retain: bool) {
        self.send(&Packet::Publish(Publish {
            qos: QoS::AtMostOnce,
            retain,
            topic: topic.try_into().unwrap(),
            payload: Bytes::copy_from_slice(payload),
            ..Publish::default()
        }));
    }

    pub fn expect_publish(&mut self) -> Publish {
        match self.recv() {
            Some(Packet::Publish(p)) => p,
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    pub fn ping(&mut self) {
        self.send(&Packet::PingReq);
        assert!(matches!(self.recv(), Some(Packet::PingResp)));
    }
}

/// The reason code of a DISCONNECT, `None` for anything else.
pub fn disconnect_reason(p: Option<Packet>) -> Option<ReasonCode> {
    match p {
        Some(Packet::Disconnect(d)) => Some(d.reason),
        _ => None,
    }
}

/// A directory of its own for one test, removed when dropped.
pub struct Scratch(std::path::PathBuf);

impl Scratch {
    /// `zerofan-{name}-{pid}` under the system's temporary directory, empty.
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("zerofan-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    /// `name` inside it.
    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The lines of a child's output, read on a thread of their own.
pub fn lines(stream: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

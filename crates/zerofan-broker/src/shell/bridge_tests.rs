//! A bridge's payloads are not copied on the local side, in either
//! direction: a payload published on this broker reaches the remote
//! socket's write as the very allocation the publisher handed over, and a
//! payload read from the remote socket reaches this broker's subscriber as
//! a slice of the buffer the socket was read into. The remote connection
//! runs over a spy that records the memory each write and read used.

use super::state::Shared;
use crate::bridge::link::LinkWaits;
use crate::bridge::{BridgeConfig, BridgeTopic, Direction, LinkEnd, Prepared};
use crate::config::Config;
use crate::core::{Broker, Outgoing};
use bytes::Bytes;
use std::io::IoSlice;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use zerofan_client::{BoxedIo, Client, ClientOptions, Connector, QoS, Transport};
use zerofan_codec::{Connect, MqttStr, Packet, Protocol, Publish, Subscribe, SubscriptionOptions};

const PAYLOAD: usize = 4096;

/// Memory ranges (address, length) the remote connection wrote from and
/// read into.
#[derive(Default)]
struct Seen {
    writes: Vec<(usize, usize)>,
    reads: Vec<(usize, usize)>,
}

struct Spy {
    inner: TcpStream,
    seen: Arc<Mutex<Seen>>,
}

impl Spy {
    fn note_write(&self, at: &[u8]) {
        if let Ok(mut s) = self.seen.lock() {
            s.writes.push((at.as_ptr() as usize, at.len()));
        }
    }
}

impl AsyncRead for Spy {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let got = &buf.filled()[before..];
        if !got.is_empty() {
            if let Ok(mut s) = self.seen.lock() {
                s.reads.push((got.as_ptr() as usize, got.len()));
            }
        }
        r
    }
}

impl AsyncWrite for Spy {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.note_write(buf);
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        for b in bufs {
            self.note_write(b);
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn spy_transport(addr: std::net::SocketAddr, seen: Arc<Mutex<Seen>>) -> Transport {
    Transport::Custom(Connector::new(move || {
        let seen = seen.clone();
        Box::pin(async move {
            let inner = TcpStream::connect(addr).await?;
            Ok(Box::new(Spy { inner, seen }) as BoxedIo)
        })
    }))
}

fn topic(pattern: &str, direction: Direction) -> BridgeTopic {
    BridgeTopic {
        pattern: pattern.into(),
        direction,
        qos: 1,
        local_prefix: String::new(),
        remote_prefix: String::new(),
    }
}

fn s(v: &str) -> MqttStr {
    MqttStr::try_from(v).unwrap()
}

/// The next item the broker sends on `link`, waiting at most `wait`.
async fn next_item(link: &LinkEnd, wait: Duration) -> Option<Outgoing> {
    tokio::time::timeout(
        wait,
        std::future::poll_fn(|cx| link.from_broker.poll_pop(cx)),
    )
    .await
    .ok()
    .flatten()
}

const SHORT: Duration = Duration::from_millis(50);
const LONG: Duration = Duration::from_secs(10);

/// A plain MQTT 5 session on this broker over a packet link of its own:
/// CONNECT, then SUBSCRIBE to `filter` at `qos` if given.
async fn local_client(
    shared: &Rc<Shared>,
    id: &str,
    filter: Option<(&str, zerofan_codec::QoS)>,
    waits: &LinkWaits,
) -> LinkEnd {
    let link = super::local_conn::open(shared, 0, waits);
    let connect = Connect {
        protocol: Protocol::V5,
        clean_start: true,
        keep_alive: 0,
        properties: Default::default(),
        client_id: s(id),
        will: None,
        username: None,
        password: None,
        bridge: false,
    };
    link.to_broker
        .push_control(Packet::Connect(Box::new(connect)))
        .unwrap();
    let connack = std::future::poll_fn(|cx| link.from_broker.poll_pop(cx)).await;
    assert!(
        matches!(&connack, Some(Outgoing::Packet(p)) if matches!(**p, Packet::ConnAck(_))),
        "{connack:?}"
    );
    if let Some((f, qos)) = filter {
        let sub = Subscribe {
            packet_id: 1,
            properties: Default::default(),
            filters: vec![(
                s(f),
                SubscriptionOptions {
                    qos,
                    ..Default::default()
                },
            )],
        };
        link.to_broker.push_control(Packet::Subscribe(sub)).unwrap();
        let suback = std::future::poll_fn(|cx| link.from_broker.poll_pop(cx)).await;
        assert!(
            matches!(&suback, Some(Outgoing::Packet(p)) if matches!(**p, Packet::SubAck(_))),
            "{suback:?}"
        );
    }
    link
}

#[test]
fn payloads_cross_the_bridge_without_copies_either_way() {
    let remote = crate::embed::spawn(Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        sys_interval: 0,
        ..Config::default()
    })
    .unwrap();
    let raddr = remote.local_addrs()[0];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let config = Config {
            sys_interval: 0,
            ..Config::default()
        };
        let (shared, _poll) = Shared::new(Broker::new(config, Instant::now()));
        let shared = Rc::new(shared);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut cfg = BridgeConfig::new("spy");
        cfg.addresses = vec![raddr.to_string()];
        cfg.protocol_version = crate::bridge::BridgeProtocol::V5;
        cfg.notifications = false;
        cfg.topic = vec![topic("out/#", Direction::Out), topic("in/#", Direction::In)];
        let bridge = super::bridges::start_one(
            &shared,
            Prepared {
                config: cfg,
                tls: None,
            },
            0,
            spy_transport(raddr, seen.clone()),
        );

        // The far side: a subscriber to what goes out, and a publisher of
        // what comes in.
        let opts = |id: &str| {
            ClientOptions::new(raddr.to_string())
                .protocol(Protocol::V5)
                .client_id(id)
        };
        let (far_sub, mut far_rx) = Client::connect(opts("far-sub")).await.unwrap();
        far_sub.subscribe("out/#", QoS::AtLeastOnce).await.unwrap();
        let (far_pub, _far_pub_rx) = Client::connect(opts("far-pub")).await.unwrap();
        let none = LinkWaits::default();
        let near_sub = local_client(
            &shared,
            "near-sub",
            Some(("in/#", zerofan_codec::QoS::AtMostOnce)),
            &none,
        )
        .await;
        let near_pub = local_client(&shared, "near-pub", None, &none).await;
        // The bridge's subscriptions on both sides are in place once a
        // probe crosses each way: one probe per short wait, 200 at most.
        let mut crossed = false;
        for _ in 0..200 {
            let p = Publish {
                qos: zerofan_codec::QoS::AtMostOnce,
                topic: s("out/probe"),
                payload: Bytes::from_static(b"probe"),
                ..Default::default()
            };
            near_pub.to_broker.try_push(Packet::Publish(p), 5).unwrap();
            if let Ok(Some(_)) = tokio::time::timeout(SHORT, far_rx.recv()).await {
                crossed = true;
                break;
            }
        }
        assert!(crossed, "nothing crossed the bridge out");
        let mut crossed = false;
        for _ in 0..200 {
            far_pub
                .publish("in/probe", QoS::AtMostOnce, "probe")
                .await
                .unwrap();
            if let Some(Outgoing::Publish(_)) = next_item(&near_sub, SHORT).await {
                crossed = true;
                break;
            }
        }
        assert!(crossed, "nothing crossed the bridge in");
        // Late probes.
        while far_rx.try_recv().is_some() {}

        // Out: the publisher's own allocation is what the remote socket
        // is handed.
        let payload = Bytes::from(vec![7u8; PAYLOAD]);
        let at = payload.as_ptr() as usize;
        let p = Publish {
            qos: zerofan_codec::QoS::AtLeastOnce,
            packet_id: 9,
            topic: s("out/big"),
            payload: payload.clone(),
            ..Default::default()
        };
        near_pub
            .to_broker
            .try_push(Packet::Publish(p), PAYLOAD)
            .unwrap();
        let got = loop {
            let m = tokio::time::timeout(LONG, far_rx.recv())
                .await
                .expect("the message out")
                .expect("the far subscriber is connected");
            if m.topic() == "out/big" {
                break m;
            }
        };
        assert_eq!(got.payload, payload);
        let written = seen.lock().unwrap().writes.clone();
        assert!(
            written.contains(&(at, PAYLOAD)),
            "the remote write was not handed the published payload's memory \
             (payload at {at:#x}; writes {written:x?})"
        );

        // In: what a local subscriber is delivered lies in the memory the
        // remote socket was read into.
        far_pub
            .publish("in/big", QoS::AtLeastOnce, vec![9u8; PAYLOAD])
            .await
            .unwrap()
            .await
            .unwrap();
        let d = loop {
            match next_item(&near_sub, LONG).await.expect("the message in") {
                Outgoing::Publish(d) if d.message.topic.as_str() == "in/big" => break d,
                _ => {}
            }
        };
        let delivered = &d.message.payload;
        assert_eq!(delivered.len(), PAYLOAD);
        assert!(delivered.iter().all(|&b| b == 9));
        let (start, end) = (
            delivered.as_ptr() as usize,
            delivered.as_ptr() as usize + PAYLOAD,
        );
        let reads = seen.lock().unwrap().reads.clone();
        // Its last bytes at least were read straight into the memory it is
        // delivered from (should TCP split the packet, the client moves a
        // partial head to a buffer sized for the whole: its own copy, not
        // the bridge's). A copy on the local side lies elsewhere entirely.
        let last = end - 1;
        assert!(
            reads.iter().any(|&(p, n)| p <= last && last < p + n),
            "the delivered payload ({start:#x}..{end:#x}) is not in memory the \
             remote socket was read into ({reads:x?})"
        );
        bridge.abort();
    });
    remote.shutdown().unwrap();
}

#[test]
fn a_full_link_holds_qos1_back_and_loses_none() {
    const N: usize = 3000;
    const SIZE: usize = 1024;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let config = Config {
            sys_interval: 0,
            // The link's bounds, not the window, hold deliveries back.
            max_inflight: u16::MAX,
            ..Config::default()
        };
        let (shared, _poll) = Shared::new(Broker::new(config, Instant::now()));
        let shared = Rc::new(shared);
        let waits = LinkWaits::default();
        let sub = local_client(
            &shared,
            "slow",
            Some(("bp/#", zerofan_codec::QoS::AtLeastOnce)),
            &waits,
        )
        .await;
        // The publisher: the bridge's own session type, which waits for
        // its window and for room in its link.
        let s = shared.clone();
        let opener: crate::bridge::Opener =
            Rc::new(move || super::local_conn::open(&s, 0, &Default::default()));
        let publisher = crate::bridge::local::Local::new(
            opener,
            crate::bridge::local::LocalOptions {
                client_id: "fast".into(),
                clean_start: true,
                session_expiry: 0,
                max_inflight: 100,
            },
        );
        publisher.connect().await.unwrap();
        let p = publisher.clone();
        let driver = tokio::task::spawn_local(async move {
            p.drive(&crate::bridge::local::local_backoff()).await
        });
        let p = publisher.clone();
        let sending = tokio::task::spawn_local(async move {
            let mut answers = Vec::new();
            for i in 0..N {
                let mut payload = vec![0u8; SIZE];
                payload[..8].copy_from_slice(&(i as u64).to_be_bytes());
                let a = p
                    .publish(
                        "bp/x",
                        zerofan_codec::QoS::AtLeastOnce,
                        false,
                        Default::default(),
                        Bytes::from(payload),
                    )
                    .await
                    .unwrap();
                answers.push(a.expect("QoS 1 has an answer"));
            }
            let mut ok = 0;
            for a in answers {
                if a.await.is_ok_and(|r| !r.is_error()) {
                    ok += 1;
                }
            }
            ok
        });
        // Nobody reads the subscriber: its link fills up to its bounds and
        // the broker waits (bounded: the other tasks run at each yield).
        for _ in 0..100_000 {
            if waits.from_broker.get() > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(waits.from_broker.get() > 0, "the link never filled");
        // Bounded by its bytes here (1 KiB messages): 1 MiB of topic and
        // payload, under the 1,024 packets.
        let held = sub.from_broker.len();
        let weight = SIZE + "bp/x".len();
        assert!(
            held * weight <= crate::bridge::link::LINK_BYTES && held > 0,
            "{held} items in the link"
        );
        // Now read: every message arrives, in order, none dropped.
        for i in 0..N {
            let d = loop {
                match next_item(&sub, LONG).await.expect("a delivery") {
                    Outgoing::Publish(d) => break d,
                    _ => continue,
                }
            };
            let n = u64::from_be_bytes(d.message.payload[..8].try_into().unwrap());
            assert_eq!(n, i as u64);
            let ack = zerofan_codec::Ack {
                packet_id: d.packet_id,
                ..Default::default()
            };
            sub.to_broker.push_control(Packet::PubAck(ack)).unwrap();
        }
        assert_eq!(sending.await.unwrap(), N);
        assert_eq!(shared.broker.borrow().metrics().dropped_total(), 0);
        driver.abort();
    });
}

#[test]
fn the_session_resumes_after_the_broker_drops_its_link() {
    // The bridge's session on this broker is disconnected (an admin kick,
    // a takeover) with QoS 1 messages in flight both ways: it reconnects,
    // resumes, and every message is answered and delivered.
    const N: usize = 500;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let config = Config {
            sys_interval: 0,
            ..Config::default()
        };
        let (shared, _poll) = Shared::new(Broker::new(config, Instant::now()));
        let shared = Rc::new(shared);
        let sub = local_client(
            &shared,
            "watcher",
            Some(("rs/#", zerofan_codec::QoS::AtLeastOnce)),
            &LinkWaits::default(),
        )
        .await;
        let s = shared.clone();
        let opener: crate::bridge::Opener =
            Rc::new(move || super::local_conn::open(&s, 0, &Default::default()));
        let bridge = crate::bridge::local::Local::new(
            opener,
            crate::bridge::local::LocalOptions {
                client_id: "resumer".into(),
                clean_start: true,
                session_expiry: u32::MAX,
                max_inflight: 50,
            },
        );
        bridge.connect().await.unwrap();
        let b = bridge.clone();
        let driver = tokio::task::spawn_local(async move {
            b.drive(&crate::bridge::local::local_backoff()).await
        });
        let b = bridge.clone();
        let sending = tokio::task::spawn_local(async move {
            let mut answers = Vec::new();
            for i in 0..N {
                let a = b
                    .publish(
                        "rs/x",
                        zerofan_codec::QoS::AtLeastOnce,
                        false,
                        Default::default(),
                        Bytes::from((i as u64).to_be_bytes().to_vec()),
                    )
                    .await
                    .unwrap();
                answers.push(a.expect("QoS 1 has an answer"));
            }
            let mut ok = 0;
            for a in answers {
                if a.await.is_ok_and(|r| !r.is_error()) {
                    ok += 1;
                }
            }
            ok
        });
        // Kicked before the publisher's first turn: what it hands the
        // closing link is lost with it and must be sent again.
        assert!(shared
            .broker
            .borrow_mut()
            .admin_disconnect(Instant::now(), "resumer", false));
        shared.dispatch();
        let mut seen = std::collections::BTreeSet::new();
        while seen.len() < N {
            let d = match next_item(&sub, LONG).await.expect("a delivery") {
                Outgoing::Publish(d) => d,
                _ => continue,
            };
            let n = u64::from_be_bytes(d.message.payload[..].try_into().unwrap());
            seen.insert(n);
            let ack = zerofan_codec::Ack {
                packet_id: d.packet_id,
                ..Default::default()
            };
            sub.to_broker.push_control(Packet::PubAck(ack)).unwrap();
        }
        assert_eq!(sending.await.unwrap(), N);
        assert_eq!(seen.len(), N);
        // The watcher, the bridge, the bridge again.
        assert_eq!(shared.broker.borrow().metrics().connections_opened, 3);
        driver.abort();
    });
}

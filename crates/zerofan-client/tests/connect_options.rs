//! CONNECT options against real brokers: will, credentials, clean start and
//! session expiry, keep alive (and its timeout), receive maximum, maximum
//! packet size both ways, topic alias maximum.

mod common;

use bytes::Bytes;
use common::proxy::Proxy;
use common::{tmpdir, within, Broker, BOTH};
use std::time::Duration;
use zerofan_client::{
    Client, ClientError, ClientOptions, ConnState, LastWill, Protocol, QoS, ReasonCode,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn will_is_published_when_the_connection_drops() {
    for kind in BOTH {
        for protocol in [Protocol::V5, Protocol::V311] {
            let b = Broker::start(kind);
            let proxy = Proxy::start(b.addr()).await;
            let (watcher, mut inc) = Client::connect(ClientOptions::new(b.addr()))
                .await
                .expect("watcher");
            watcher
                .subscribe("will/#", QoS::AtLeastOnce)
                .await
                .expect("subscribe");
            let opts = ClientOptions::new(proxy.addr())
                .protocol(protocol)
                .reconnect(false)
                .will(LastWill::new("will/a", "gone", QoS::AtLeastOnce, false));
            let (c, _i) = Client::connect(opts).await.expect("connect");
            proxy.sever();
            let m = within(10, "will message", inc.recv()).await.expect("will");
            assert_eq!(m.topic(), "will/a", "{kind:?} {protocol:?}");
            assert_eq!(&m.payload[..], b"gone");
            // Without reconnect the client closes for good.
            within(5, "closed", async {
                while c.state() != ConnState::Closed {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await;
            assert!(matches!(
                c.publish("x", QoS::AtMostOnce, "y").await,
                Err(ClientError::Closed)
            ));
            // A clean disconnect does not publish the will.
            let opts = ClientOptions::new(b.addr())
                .protocol(protocol)
                .will(LastWill::new("will/b", "gone", QoS::AtLeastOnce, false));
            let (c, _i) = Client::connect(opts).await.expect("connect");
            c.disconnect().await.expect("disconnect");
            watcher
                .publish("will/marker", QoS::AtLeastOnce, "m")
                .await
                .expect("p")
                .await
                .expect("ack");
            let m = within(10, "marker", inc.recv()).await.expect("marker");
            assert_eq!(
                m.topic(),
                "will/marker",
                "{kind:?}: no will after DISCONNECT"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_checked_by_mosquitto() {
    let dir = tmpdir("passwd");
    let file = dir.join("passwd");
    let st = std::process::Command::new("mosquitto_passwd")
        .args(["-b", "-c"])
        .arg(&file)
        .args(["alice", "s3cret"])
        .status()
        .expect("mosquitto_passwd (package mosquitto)");
    assert!(st.success());
    let b = Broker::mosquitto(&format!(
        "allow_anonymous false\npassword_file {}",
        file.display()
    ));
    for protocol in [Protocol::V5, Protocol::V311] {
        let ok = ClientOptions::new(b.addr())
            .protocol(protocol)
            .credentials("alice", Bytes::from_static(b"s3cret"));
        let (c, _i) = Client::connect(ok).await.expect("good credentials");
        c.disconnect().await.expect("disconnect");
        let bad = ClientOptions::new(b.addr())
            .protocol(protocol)
            .credentials("alice", Bytes::from_static(b"wrong"));
        match Client::connect(bad).await {
            Err(ClientError::Refused(r)) => assert!(r.is_error(), "{r:?}"),
            other => panic!("bad credentials accepted: {other:?}"),
        }
        let none = ClientOptions::new(b.addr()).protocol(protocol);
        assert!(matches!(
            Client::connect(none).await,
            Err(ClientError::Refused(_))
        ));
    }
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_and_clean_start() {
    for kind in BOTH {
        for protocol in [Protocol::V5, Protocol::V311] {
            let b = Broker::start(kind);
            let id = format!("sess-{kind:?}-{protocol:?}");
            let opts = |clean: bool| {
                ClientOptions::new(b.addr())
                    .protocol(protocol)
                    .client_id(id.clone())
                    .clean_start(clean)
                    .session_expiry(60)
            };
            // 3.1.1 has no expiry: Clean Session 1 would end the session
            // with the connection, so the first connection asks for 0.
            let (c, _i) = Client::connect(opts(protocol.is_v5()))
                .await
                .expect("connect");
            assert!(!c.wait_connected().await.expect("info").session_present);
            c.subscribe("se/#", QoS::AtLeastOnce)
                .await
                .expect("subscribe");
            c.disconnect().await.expect("disconnect");
            let (p, _pi) = Client::connect(ClientOptions::new(b.addr()))
                .await
                .expect("publisher");
            for i in 0..5u8 {
                p.publish("se/x", QoS::AtLeastOnce, vec![i])
                    .await
                    .expect("p")
                    .await
                    .expect("ack");
            }
            let (c, mut inc) = Client::connect(opts(false)).await.expect("resume");
            let info = c.wait_connected().await.expect("info");
            assert!(info.session_present, "{kind:?} {protocol:?}: session kept");
            for i in 0..5u8 {
                let m = within(10, "queued message", inc.recv())
                    .await
                    .expect("queued");
                assert_eq!(&m.payload[..], &[i]);
            }
            c.disconnect().await.expect("disconnect");
            // Clean start throws the session away.
            let (c, _i) = Client::connect(opts(true)).await.expect("clean");
            assert!(!c.wait_connected().await.expect("info").session_present);
            c.disconnect().await.expect("disconnect");
            p.disconnect().await.expect("disconnect");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_pings_and_detects_a_dead_broker() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let proxy = Proxy::start(b.addr()).await;
        let (c, _i) = Client::connect(ClientOptions::new(proxy.addr()).keep_alive(1))
            .await
            .expect("connect");
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let s = c.stats();
        assert_eq!(s.connection_losses, 0, "{kind:?}: idle but alive: {s:?}");
        assert!(s.bytes_out >= 2 * 3, "{kind:?}: PINGREQs sent: {s:?}");
        // The broker stops answering: no PINGRESP, the client gives up on
        // the connection within about two keep-alive periods.
        proxy.stall(true);
        within(10, "keep-alive timeout", async {
            while c.stats().connection_losses == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        proxy.stall(false);
        c.wait_connected().await.expect("reconnected");
        c.disconnect().await.expect("disconnect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_maximum_packet_size_and_topic_alias_maximum() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let opts = ClientOptions::new(b.addr())
            .receive_maximum(2)
            .maximum_packet_size(1024)
            .topic_alias_maximum(8)
            .incoming_capacity(1);
        let (c, mut inc) = Client::connect(opts).await.expect("connect");
        c.subscribe("lim/#", QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        let (p, _pi) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("publisher");
        // Over our Maximum Packet Size: the broker must not send it.
        p.publish("lim/big", QoS::AtLeastOnce, vec![0u8; 2000])
            .await
            .expect("p")
            .await
            .expect("ack");
        let mut ds = Vec::new();
        for i in 0..50u32 {
            ds.push(
                p.publish("lim/small", QoS::AtLeastOnce, i.to_be_bytes().to_vec())
                    .await
                    .expect("p"),
            );
        }
        for i in 0..50u32 {
            let m = within(10, "small", inc.recv()).await.expect("small");
            assert_eq!(m.topic(), "lim/small", "{kind:?}: big one skipped");
            assert_eq!(&m.payload[..], &i.to_be_bytes());
            // A slow consumer: the broker keeps at most 2 unacknowledged.
            if i % 10 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        for d in ds {
            d.await.expect("ack");
        }
        c.disconnect().await.expect("disconnect");
        p.disconnect().await.expect("disconnect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_maximum_packet_size_is_enforced_locally() {
    // mosquitto takes max_packet_size as a global option.
    let b = Broker::mosquitto_global("max_packet_size 5000", common::free_port());
    let (c, _i) = Client::connect(ClientOptions::new(b.addr()))
        .await
        .expect("connect");
    let info = c.wait_connected().await.expect("info");
    assert_eq!(info.properties.maximum_packet_size, Some(5000));
    let d = c
        .publish("mps", QoS::AtLeastOnce, vec![0u8; 6000])
        .await
        .expect("queued");
    assert!(matches!(
        d.await,
        Err(ClientError::PacketTooLarge { max: 5000, .. })
    ));
    let a = c
        .publish("mps", QoS::AtLeastOnce, vec![0u8; 4000])
        .await
        .expect("q")
        .await
        .expect("ack");
    assert_ne!(a.reason, ReasonCode::PACKET_TOO_LARGE);
    c.disconnect().await.expect("disconnect");
}

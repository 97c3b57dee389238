//! Automatic reconnect: across a broker restart (kill -9, same port) and
//! across a cut connection with acknowledgements withheld, nothing published
//! at QoS 1/2 is lost; inflight messages are resent with DUP, QoS 2 ones
//! are delivered exactly once when the broker kept the session.

mod common;

use common::proxy::Proxy;
use common::{within, Broker, Kind, BOTH};
use std::collections::HashMap;
use std::time::Duration;
use zerofan_client::{Backoff, Client, ClientOptions, ConnState, Delivery, Incoming, QoS};

fn backoff() -> Backoff {
    Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(300),
        multiplier: 2.0,
    }
}

fn qos_of(i: u32) -> QoS {
    if i % 2 == 0 {
        QoS::AtLeastOnce
    } else {
        QoS::ExactlyOnce
    }
}

async fn publish_range(c: &Client, topic: &str, range: std::ops::Range<u32>) -> Vec<Delivery> {
    let mut ds = Vec::new();
    for i in range {
        ds.push(
            c.publish(topic, qos_of(i), i.to_be_bytes().to_vec())
                .await
                .expect("publish"),
        );
    }
    ds
}

async fn expect_all(inc: &mut Incoming, range: std::ops::Range<u32>) -> HashMap<u32, u32> {
    let mut seen = HashMap::new();
    expect_ids(inc, &mut seen, range.collect()).await;
    seen
}

/// Receive until every id in `ids` was seen, counting deliveries.
async fn expect_ids(inc: &mut Incoming, seen: &mut HashMap<u32, u32>, ids: Vec<u32>) {
    let range = ids.clone();
    while !ids.iter().all(|i| seen.contains_key(i)) {
        let m = match tokio::time::timeout(Duration::from_secs(10), inc.recv()).await {
            Ok(Some(m)) => m,
            other => panic!(
                "missing messages: got {} of {:?} ({})",
                seen.len(),
                range,
                if other.is_ok() {
                    "stream ended"
                } else {
                    "timeout"
                }
            ),
        };
        let i = u32::from_be_bytes(m.payload[..4].try_into().expect("4 bytes"));
        *seen.entry(i).or_default() += 1;
    }
}

async fn restart(kind: Kind) {
    let mut b = Broker::start(kind);
    let opts = ClientOptions::new(b.addr())
        .keep_alive(5)
        .backoff(backoff())
        .outgoing_capacity(512);
    let (c, mut inc) = Client::connect(opts).await.expect("connect");
    c.subscribe("rc/#", QoS::ExactlyOnce)
        .await
        .expect("subscribe");
    for d in publish_range(&c, "rc/a", 0..100).await {
        d.await.expect("ack before restart");
    }
    expect_all(&mut inc, 0..100).await;

    b.kill();
    // Published while the broker is down: queued, then sent after the
    // reconnect, after the subscription has been restored.
    let ds = publish_range(&c, "rc/b", 100..300).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        matches!(c.state(), ConnState::Reconnecting(_)),
        "{:?}",
        c.state()
    );
    b.restart();
    for d in ds {
        let a = within(30, "ack after restart", d).await.expect("ack");
        assert!(!a.reason.is_error(), "{kind:?}: {a:?}");
    }
    expect_all(&mut inc, 100..300).await;
    let s = c.stats();
    assert!(s.connects >= 2, "{kind:?}: {s:?}");
    assert!(s.connection_losses >= 1);
    assert!(
        s.resubscribed >= 1,
        "{kind:?}: subscription restored: {s:?}"
    );
    c.disconnect().await.expect("disconnect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_across_broker_restart_zerofan() {
    restart(Kind::Zerofan).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_across_broker_restart_mosquitto() {
    restart(Kind::Mosquitto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflight_resent_with_dup_after_a_cut_connection() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let proxy = Proxy::start(b.addr()).await;
        let (sub, mut inc) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("subscriber");
        sub.subscribe("dup/#", QoS::ExactlyOnce)
            .await
            .expect("subscribe");
        let opts = ClientOptions::new(proxy.addr())
            .client_id(format!("dup-publisher-{kind:?}"))
            .clean_start(true)
            .session_expiry(60)
            .backoff(backoff());
        let (c, _inc) = Client::connect(opts).await.expect("publisher");
        proxy.stall(true);
        // 20: mosquitto's default Receive Maximum, so all are in flight.
        let ds = publish_range(&c, "dup/x", 0..20).await;
        // Everything reaches the broker but no ack comes back; the QoS 1
        // messages reach the subscriber (brokers may hold QoS 2 ones until
        // PUBREL, which cannot come before PUBREC).
        let mut counts = HashMap::new();
        expect_ids(
            &mut inc,
            &mut counts,
            (0..20u32).filter(|i| i % 2 == 0).collect(),
        )
        .await;
        assert_eq!(c.stats().publishes_sent, 20);
        proxy.sever();
        within(10, "connection loss seen", async {
            while c.stats().connection_losses == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        proxy.stall(false);
        for d in ds {
            let a = within(30, "ack after cut", d).await.expect("ack");
            assert!(!a.reason.is_error(), "{kind:?}: {a:?}");
        }
        let s = c.stats();
        assert!(s.publishes_resent >= 20, "{kind:?}: {s:?}");
        assert_eq!(s.sessions_resumed, 1, "{kind:?}: broker kept the session");
        expect_ids(&mut inc, &mut counts, (0..20).collect()).await;
        // Give duplicates time to show up, then check QoS 2 came once.
        tokio::time::sleep(Duration::from_millis(300)).await;
        while let Some(m) = inc.try_recv() {
            let i = u32::from_be_bytes(m.payload[..4].try_into().expect("4 bytes"));
            *counts.entry(i).or_default() += 1;
        }
        for (i, n) in counts {
            if qos_of(i) == QoS::ExactlyOnce {
                assert_eq!(n, 1, "{kind:?}: QoS 2 message {i} delivered {n} times");
            }
        }
        c.disconnect().await.expect("disconnect");
        sub.disconnect().await.expect("disconnect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubrel_resent_after_a_cut_between_pubrec_and_pubcomp() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let proxy = Proxy::start(b.addr()).await;
        let (sub, mut inc) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("subscriber");
        sub.subscribe("rel/#", QoS::ExactlyOnce)
            .await
            .expect("subscribe");
        let opts = ClientOptions::new(proxy.addr())
            .client_id(format!("rel-publisher-{kind:?}"))
            .session_expiry(60)
            .backoff(backoff());
        let (c, _inc) = Client::connect(opts).await.expect("publisher");
        proxy.stall(true);
        let before = c.stats().bytes_out;
        let d = c
            .publish("rel/x", QoS::ExactlyOnce, "once")
            .await
            .expect("publish");
        // Let the PUBREC through byte by byte until the client answers with
        // PUBREL; the broker's PUBCOMP is then held back.
        // The PUBLISH itself is written first (nothing else is: keep alive
        // is 30 s).
        within(10, "PUBLISH written", async {
            while c.stats().bytes_out == before {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        let out = c.stats().bytes_out;
        within(10, "PUBREL sent", async {
            while c.stats().bytes_out == out {
                proxy.release(1);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        // Brokers deliver QoS 2 on PUBLISH (zerofan) or on PUBREL (mosquitto).
        let m = within(10, "message", inc.recv()).await.expect("message");
        assert_eq!(&m.payload[..], b"once");
        proxy.sever();
        within(10, "connection loss seen", async {
            while c.stats().connection_losses == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        proxy.stall(false);
        let a = within(10, "PUBCOMP after reconnect", d).await.expect("ack");
        assert!(!a.reason.is_error(), "{kind:?}: {a:?}");
        let s = c.stats();
        assert_eq!(s.pubrels_resent, 1, "{kind:?}: {s:?}");
        assert_eq!(s.publishes_resent, 0, "{kind:?}: {s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(inc.try_recv().is_none(), "{kind:?}: delivered once");
        c.disconnect().await.expect("disconnect");
        sub.disconnect().await.expect("disconnect");
    }
}

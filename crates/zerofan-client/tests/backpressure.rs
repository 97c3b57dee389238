//! The outgoing queue is bounded: when the broker stops acknowledging, the
//! inflight window fills, then the queue, and `publish` waits for room
//! instead of buffering without limit; it resumes when acks flow again.

mod common;

use common::proxy::Proxy;
use common::{within, Broker, BOTH};
use std::time::Duration;
use zerofan_client::{Client, ClientOptions, QoS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_waits_when_the_queue_is_full() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let proxy = Proxy::start(b.addr()).await;
        let opts = ClientOptions::new(proxy.addr())
            .max_inflight(4)
            .outgoing_capacity(8);
        let (c, _i) = Client::connect(opts).await.expect("connect");
        proxy.stall(true);
        let mut ds = Vec::new();
        let mut blocked = None;
        for i in 0..100u32 {
            let f = c.publish("bp/x", QoS::AtLeastOnce, i.to_be_bytes().to_vec());
            match tokio::time::timeout(Duration::from_millis(300), f).await {
                Ok(d) => ds.push(d.expect("publish")),
                Err(_) => {
                    blocked = Some(i);
                    break;
                }
            }
        }
        // 4 in flight + 1 taken from the queue and parked + 8 queued.
        assert_eq!(blocked, Some(13), "{kind:?}: publish blocked at the bound");
        proxy.stall(false);
        let late = c.publish("bp/x", QoS::AtLeastOnce, "late");
        let d = within(10, "publish after release", late)
            .await
            .expect("publish");
        ds.push(d);
        for d in ds {
            within(10, "ack", d).await.expect("ack");
        }
        c.disconnect().await.expect("disconnect");
    }
}

/// At shutdown, commands queued behind a publish that waits for the
/// inflight window are not sent ahead of it: they fail with the publish
/// they queued behind, in order (a QoS 0 publish used to overtake it, and a
/// second parked publish replaced the first, which was dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_keeps_order_behind_a_full_window() {
    let b = Broker::zerofan();
    let proxy = Proxy::start(b.addr()).await;
    let opts = ClientOptions::new(proxy.addr()).max_inflight(1);
    let (c, _i) = Client::connect(opts).await.expect("connect");
    // Acks stop reaching the client: the window of 1 stays full.
    proxy.stall(true);
    let first = c
        .publish("sd/x", QoS::AtLeastOnce, "1")
        .await
        .expect("publish 1");
    let second = c
        .publish("sd/x", QoS::AtLeastOnce, "2")
        .await
        .expect("publish 2");
    let third = c
        .publish("sd/x", QoS::AtMostOnce, "3")
        .await
        .expect("publish 3");
    within(10, "disconnect", c.disconnect())
        .await
        .expect("disconnect");
    assert!(
        within(10, "first", first).await.is_err(),
        "never acknowledged"
    );
    assert!(within(10, "second", second).await.is_err(), "never sent");
    assert!(
        within(10, "third", third).await.is_err(),
        "a QoS 0 publish queued behind a waiting one must not be sent ahead of it"
    );
}

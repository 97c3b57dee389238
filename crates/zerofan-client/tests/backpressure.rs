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

//! Received payloads are slices of the pooled read buffer: no copy, the
//! buffer stays out of the pool while a payload lives and returns when the
//! last one is dropped.

mod common;

use common::{within, Broker, BOTH};
use zerofan_client::{Client, ClientOptions, QoS};
use zerofan_pool::{Pool, PoolConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_are_slices_of_pooled_read_buffers() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let pool = Pool::new(PoolConfig::default());
        let (c, mut inc) = Client::connect(ClientOptions::new(b.addr()).pool(pool.clone()))
            .await
            .expect("connect");
        c.subscribe("zc/#", QoS::AtMostOnce)
            .await
            .expect("subscribe");
        // A burst of small messages lands in few reads: their payloads point
        // into the same buffers.
        let (p, _pi) = Client::connect(ClientOptions::new(b.addr()))
            .await
            .expect("p");
        for i in 0..200u32 {
            p.publish("zc/x", QoS::AtMostOnce, i.to_be_bytes().to_vec())
                .await
                .expect("p");
        }
        let mut msgs = Vec::new();
        for _ in 0..200 {
            msgs.push(within(10, "message", inc.recv()).await.expect("message"));
        }
        let m = pool.metrics();
        assert!(m.gets > 0, "{kind:?}: reads use the pool");
        assert!(
            m.gets < 200,
            "{kind:?}: far fewer buffers ({}) than messages",
            m.gets
        );
        let shared = msgs
            .windows(2)
            .filter(|w| {
                let a = w[0].payload.as_ptr() as usize;
                let b = w[1].payload.as_ptr() as usize;
                b > a && b - a < 64 * 1024
            })
            .count();
        assert!(
            shared > 100,
            "{kind:?}: consecutive payloads share a buffer ({shared})"
        );
        // Each message names the read buffer its payload lies in; messages
        // of one read name the same one, so there are as few distinct
        // buffers as reads from the pool.
        let mut buffers: Vec<(usize, usize)> = Vec::new();
        for m in &msgs {
            let (buf, off) = m.read_buffer().expect("payload in a read buffer");
            assert_eq!(&buf[off..off + m.payload.len()], &m.payload[..]);
            assert_eq!(buf.as_ptr().wrapping_add(off), m.payload.as_ptr());
            let id = (buf.as_ptr() as usize, buf.len());
            if buffers.last() != Some(&id) {
                buffers.push(id);
            }
        }
        assert!(
            (buffers.len() as u64) <= m.gets,
            "{kind:?}: {} distinct read buffers, {} pool gets",
            buffers.len(),
            m.gets
        );
        let held = pool.metrics().bytes_outstanding;
        assert!(held > 0);
        drop(msgs);
        c.disconnect().await.expect("disconnect");
        p.disconnect().await.expect("disconnect");
        drop(inc);
        // The event loop has ended: every read buffer went back.
        within(5, "buffers returned", async {
            while pool.metrics().bytes_outstanding != 0 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await;
    }
}

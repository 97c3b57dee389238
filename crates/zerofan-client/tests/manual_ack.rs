//! Manual acknowledgements: a received QoS 1/2 message that the
//! application did not acknowledge is sent again on the resumed session;
//! one it acknowledged is not. The bridge in zerofan-broker relies on this
//! to acknowledge only what the other side has taken.

mod common;

use common::{within, Broker, BOTH};
use std::time::Duration;
use zerofan_client::{Client, ClientOptions, Incoming, Message, QoS};

async fn session(addr: &str, id: &str, manual: bool) -> (Client, Incoming) {
    let o = ClientOptions::new(addr)
        .client_id(id)
        .clean_start(false)
        .session_expiry(600)
        .manual_acks(manual)
        .reconnect(false);
    within(10, "connect", Client::connect(o))
        .await
        .expect("connect")
}

async fn next(inc: &mut Incoming) -> Message {
    within(10, "a message", inc.recv())
        .await
        .expect("a message")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_messages_come_again() {
    for kind in BOTH {
        let b = Broker::start(kind);
        let addr = b.addr();
        let (c, _) = session(&addr, "ma", true).await;
        c.subscribe("m/#", QoS::ExactlyOnce)
            .await
            .expect("subscribe");
        let (p, _) = within(10, "publisher", Client::connect(ClientOptions::new(&addr)))
            .await
            .expect("publisher");
        for (i, q) in [QoS::AtLeastOnce, QoS::ExactlyOnce].into_iter().enumerate() {
            p.publish(&format!("m/{i}"), q, vec![i as u8])
                .await
                .expect("publish")
                .await
                .expect("ack");
        }
        drop(c);
        let (c, mut inc) = session(&addr, "ma", true).await;
        let mut first = [next(&mut inc).await, next(&mut inc).await];
        first.sort_by(|a, b| a.topic().cmp(b.topic()));
        assert!(first.iter().all(|m| m.ack_token().is_some()), "{kind:?}");
        // Not acknowledged: both come again after a reconnect.
        drop((c, inc));
        let (c, mut inc) = session(&addr, "ma", true).await;
        let mut again = [next(&mut inc).await, next(&mut inc).await];
        again.sort_by(|a, b| a.topic().cmp(b.topic()));
        assert_eq!(
            again
                .iter()
                .map(|m| (m.topic(), m.payload.clone()))
                .collect::<Vec<_>>(),
            first
                .iter()
                .map(|m| (m.topic(), m.payload.clone()))
                .collect::<Vec<_>>(),
            "{kind:?}"
        );
        for m in &again {
            let t = m.ack_token().expect("QoS 1/2 token");
            c.ack(t).await.expect("ack");
        }
        // Acknowledged (the QoS 2 one completed): nothing comes again.
        p.publish("m/end", QoS::AtLeastOnce, vec![9])
            .await
            .expect("publish")
            .await
            .expect("ack");
        let end = next(&mut inc).await;
        assert_eq!(end.topic(), "m/end", "{kind:?}");
        c.ack(end.ack_token().expect("token")).await.expect("ack");
        c.disconnect().await.expect("disconnect");
        drop((c, inc));
        let (_c, mut inc) = session(&addr, "ma", true).await;
        let extra = tokio::time::timeout(Duration::from_millis(500), inc.recv()).await;
        assert!(
            extra.is_err(),
            "{kind:?}: acknowledged message sent again: {extra:?}"
        );
    }
}

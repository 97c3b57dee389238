//! What the HTTP API asks of the core (`Broker::admin_*`) and the events
//! it records for webhooks (`core::events`).

use super::*;
use crate::core::admin::ClientQuery;
use crate::core::events::{Event, EventKind};

fn api_publish(topic: &str, payload: &str, retain: bool) -> Publish {
    Publish {
        qos: QoS::AtLeastOnce,
        retain,
        topic: s(topic),
        payload: Bytes::copy_from_slice(payload.as_bytes()),
        ..Publish::default()
    }
}

#[test]
fn views_list_sessions_with_their_subscriptions() {
    let mut h = H::new();
    let a = h.client("alpha");
    h.subscribe(a, "t/#", opts(QoS::AtLeastOnce));
    h.client("beta");
    let q = |f: fn(&mut ClientQuery)| {
        let mut q = ClientQuery {
            limit: 10,
            ..ClientQuery::default()
        };
        f(&mut q);
        q
    };
    let (total, all) = h.b.admin_clients(&q(|_| {}));
    let ids: Vec<&str> = all.iter().map(|c| c.client_id.as_str()).collect();
    assert_eq!((total, ids), (2, vec!["alpha", "beta"]));
    let (total, page) = h.b.admin_clients(&q(|q| {
        q.offset = 1;
        q.limit = 1;
    }));
    assert_eq!((total, page[0].client_id.as_str()), (2, "beta"));
    let (total, hits) = h.b.admin_clients(&q(|q| q.prefix = Some("al".into())));
    assert_eq!((total, hits[0].client_id.as_str()), (1, "alpha"));
    let (total, _) = h.b.admin_clients(&q(|q| q.connected = Some(false)));
    assert_eq!(total, 0);
    let (total, _) =
        h.b.admin_clients(&q(|q| q.address = Some("127.0.0.1".into())));
    assert_eq!(total, 2);
    let (total, _) =
        h.b.admin_clients(&q(|q| q.username = Some("nobody".into())));
    assert_eq!(total, 0);
    assert!(all[0].connected && all[0].subscriptions.is_empty());
    assert_eq!(all[0].subscription_count, 1);
    assert_eq!(all[0].protocol, "5.0");
    let one = h.b.admin_client("alpha").unwrap();
    assert_eq!(one.subscriptions[0].filter, "t/#");
    assert_eq!(one.subscriptions[0].qos, 1);
    assert!(h.b.admin_client("nobody").is_none());
}

#[test]
fn disconnect_sends_0x98_and_discard_ends_the_session() {
    let mut h = H::new();
    let (c, _) = h.connect_with("keep", Protocol::V5, false, |p| {
        p.properties.session_expiry_interval = Some(600);
    });
    assert!(h.b.admin_disconnect(h.now, "keep", false));
    let out = h.out(c);
    assert_eq!(out.disconnect(), Some(ReasonCode::ADMINISTRATIVE_ACTION));
    assert!(out.closed);
    h.b.connection_lost(h.now, c);
    let kept = h.b.admin_client("keep").unwrap();
    assert!(!kept.connected, "the session stays, offline");
    assert!(h.b.admin_disconnect(h.now, "keep", true));
    assert!(h.b.admin_client("keep").is_none(), "discarded");
    assert!(!h.b.admin_disconnect(h.now, "keep", false));
}

#[test]
fn publish_routes_and_retains_and_refuses_bad_topics() {
    let mut h = H::new();
    let sub = h.client("sub");
    h.subscribe(sub, "a/#", opts(QoS::AtLeastOnce));
    assert_eq!(
        h.b.admin_publish(h.now, api_publish("a/b", "hi", true)),
        Ok(1)
    );
    assert_eq!(h.out(sub).payloads(), ["hi"]);
    let mut found = Vec::new();
    h.b.admin_retained("a/b", &mut found);
    assert_eq!(&found[0].payload[..], b"hi");
    h.b.admin_clear_retained("a/b");
    found.clear();
    h.b.admin_retained("a/#", &mut found);
    assert!(found.is_empty());
    use crate::core::admin::AdminPublishError::BadTopic;
    for bad in ["a/#", "a/+", "", "$SYS/x"] {
        assert_eq!(
            h.b.admin_publish(h.now, api_publish(bad, "x", false)),
            Err(BadTopic),
            "{bad:?}"
        );
    }
}

fn kinds(events: &[Event]) -> Vec<EventKind> {
    events.iter().map(|e| e.kind).collect()
}

#[test]
fn events_are_recorded_only_when_asked_for() {
    let mut h = H::new();
    let c = h.client("quiet");
    h.subscribe(c, "x", opts(QoS::AtMostOnce));
    let mut out = Vec::new();
    h.b.take_events(&mut out);
    assert!(out.is_empty(), "no mask, no events");

    h.b.set_event_mask(EventKind::ALL.iter().fold(0, |m, k| m | k.bit()));
    let (c, _) = h.connect_with("ev", Protocol::V5, true, |p| {
        p.properties.session_expiry_interval = Some(5);
    });
    h.subscribe(c, "e/#", opts(QoS::AtLeastOnce));
    h.send(c, Packet::Publish(publish("e/1", "p", QoS::AtMostOnce, 0)));
    h.send(
        c,
        Packet::Unsubscribe(zerofan_codec::Unsubscribe {
            packet_id: 2,
            properties: Default::default(),
            filters: vec![s("e/#")],
        }),
    );
    h.send(c, disconnect(ReasonCode::SUCCESS));
    h.b.connection_lost(h.now, c);
    h.secs(6);
    out.clear();
    h.b.take_events(&mut out);
    assert_eq!(
        kinds(&out),
        [
            EventKind::SessionCreated,
            EventKind::ClientConnected,
            EventKind::SubscriptionCreated,
            EventKind::MessagePublished,
            EventKind::SubscriptionRemoved,
            EventKind::ClientDisconnected,
            EventKind::SessionExpired,
        ]
    );
    assert!(out.iter().all(|e| e.client_id.as_deref() == Some("ev")));
    assert_eq!(out[2].topic.as_deref(), Some("e/#"));
    assert_eq!(
        out[3].message.as_ref().map(|m| m.topic.as_str()),
        Some("e/1")
    );

    // Only what the mask names.
    h.b.set_event_mask(EventKind::ClientConnected.bit());
    let c = h.client("only");
    h.subscribe(c, "y", opts(QoS::AtMostOnce));
    out.clear();
    h.b.take_events(&mut out);
    assert_eq!(kinds(&out), [EventKind::ClientConnected]);
}

//! Zero-copy fan-out, measured: one 1 MiB PUBLISH delivered to 100
//! subscribers through the real shell over loopback sockets raises the
//! bytes allocated (by every thread, cumulatively) by less than 3 MiB. A
//! broker that copied the payload per subscriber would allocate 100 MiB.
//! Both ways a delivery is written are measured: at QoS 0 the packet goes
//! out as it was received (`Wire`), at QoS 1 (delivered at QoS 0) a header
//! is encoded per subscriber in front of the shared payload.

use bytes::{Bytes, BytesMut};
use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use zerofan_broker::config::Config;
use zerofan_codec::{Packet, Protocol, Publish, QoS, Subscribe, SubscriptionOptions};

mod common;
#[path = "common/counting.rs"]
mod counting;

use counting::ALLOCATED;

const SUBSCRIBERS: usize = 100;
const PAYLOAD: usize = 1024 * 1024;

fn encode(p: &Packet) -> Vec<u8> {
    let mut b = BytesMut::new();
    zerofan_codec::encode(p, Protocol::V311, &mut b).unwrap();
    b.to_vec()
}

/// One test for both: the allocation counter is global, so they must not
/// run at the same time.
#[test]
fn one_mib_to_100_subscribers_allocates_under_3_mib() {
    fan_out(QoS::AtMostOnce);
    fan_out(QoS::AtLeastOnce);
}

fn fan_out(qos: QoS) {
    let broker = zerofan_broker::embed::spawn(Config {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        sys_interval: 0,
        ..Config::default()
    })
    .unwrap();
    let addr = broker.local_addrs()[0];

    let mut subs = Vec::new();
    for i in 0..SUBSCRIBERS {
        let mut s = common::connect_v311(addr, &format!("sub{i}"));
        let sub = Subscribe {
            packet_id: 1,
            properties: Default::default(),
            filters: vec![("big".try_into().unwrap(), SubscriptionOptions::default())],
        };
        s.write_all(&encode(&Packet::Subscribe(sub))).unwrap();
        let mut suback = [0u8; 5];
        s.read_exact(&mut suback).unwrap();
        assert_eq!(suback, [0x90, 3, 0, 1, 0]);
        subs.push(s);
    }
    let mut publisher = common::connect_v311(addr, "publisher");
    let publish = |qos, packet_id| {
        encode(&Packet::Publish(Publish {
            qos,
            packet_id,
            topic: "big".try_into().unwrap(),
            payload: Bytes::from(vec![0xAB; PAYLOAD]),
            ..Publish::default()
        }))
    };
    let sent = publish(qos, u16::from(qos != QoS::AtMostOnce));
    // What each subscriber (subscribed at QoS 0) receives.
    let packet = publish(QoS::AtMostOnce, 0);
    let mut sink = vec![0u8; 256 * 1024];

    let before = ALLOCATED.load(Ordering::SeqCst);
    publisher.write_all(&sent).unwrap();
    for s in &mut subs {
        let mut got = 0;
        while got < packet.len() {
            let n = s.read(&mut sink).unwrap();
            assert!(n > 0, "subscriber closed early");
            got += n;
        }
        assert_eq!(got, packet.len(), "exactly one PUBLISH per subscriber");
    }
    if qos == QoS::AtLeastOnce {
        let mut puback = [0u8; 4];
        publisher.read_exact(&mut puback).unwrap();
        assert_eq!(puback, [0x40, 2, 0, 1]);
    }
    let allocated = ALLOCATED.load(Ordering::SeqCst) - before;

    broker.shutdown().unwrap();
    assert_eq!(
        &sink[sink.len() - 16..],
        &[0xAB; 16],
        "payload bytes arrived"
    );
    println!("allocated during fan-out: {allocated} bytes");
    assert!(
        allocated < 3 * 1024 * 1024,
        "fan-out of 1 MiB at {qos:?} to {SUBSCRIBERS} subscribers allocated {allocated} bytes"
    );
}

//! A counting global allocator proves the hot paths allocate nothing:
//! framing and decoding a PUBLISH without properties and encoding a PUBLISH
//! header. A PUBLISH with properties (no user properties, no subscription
//! identifiers) costs exactly one allocation: the box of its `Props`.
//!
//! One test function only: the counter is global, and tests in one binary
//! run on parallel threads.

use bytes::{Bytes, BytesMut};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use zerofan_codec::*;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs_during<R>(f: impl FnOnce() -> R) -> (usize, R) {
    let before = ALLOCS.load(Ordering::SeqCst);
    let r = f();
    (ALLOCS.load(Ordering::SeqCst) - before, r)
}

/// A frame held the way the broker holds one: a buffer owned by something
/// else (the pool) and exposed through `Bytes::from_owner`, whose slices
/// only bump a reference count.
fn owned_frame(packet: &Packet, protocol: Protocol) -> Bytes {
    let mut out = BytesMut::new();
    encode(packet, protocol, &mut out).unwrap();
    Bytes::from_owner(out.to_vec())
}

#[test]
fn hot_paths_do_not_allocate() {
    let props = Properties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(60),
        content_type: Some(MqttStr::from_static("text/plain")),
        topic_alias: Some(3),
        ..Properties::default()
    };
    for (protocol, with_props) in [
        (Protocol::V31, false),
        (Protocol::V311, false),
        (Protocol::V5, false),
        (Protocol::V5, true),
    ] {
        for (qos, pid) in [
            (QoS::AtMostOnce, 0),
            (QoS::AtLeastOnce, 9),
            (QoS::ExactlyOnce, 10),
        ] {
            let packet = Packet::Publish(Publish {
                qos,
                packet_id: pid,
                topic: MqttStr::from_static("sensors/kitchen/temperature"),
                properties: if with_props {
                    props.clone().into()
                } else {
                    Default::default()
                },
                payload: Bytes::from(vec![7u8; 1024]),
                ..Publish::default()
            });
            let wire = owned_frame(&packet, protocol);

            let (n, decoded) = allocs_during(|| {
                let Frame::Complete(len) = frame(&wire, u32::MAX) else {
                    panic!("incomplete")
                };
                decode(wire.slice(..len), protocol).unwrap()
            });
            assert_eq!(
                n,
                usize::from(with_props),
                "frame + decode of a PUBLISH allocated ({protocol:?}, {qos:?}, properties: {with_props})"
            );
            assert_eq!(decoded, packet);
            if let Packet::Publish(p) = &decoded {
                assert_eq!(p.properties.is_allocated(), with_props);
            }
            let (n, ()) = allocs_during(|| drop(decoded));
            assert_eq!(n, 0);

            let mut dst = BytesMut::with_capacity(256);
            let h = PublishHeader {
                dup: false,
                qos,
                retain: false,
                packet_id: pid,
                topic: "sensors/kitchen/temperature",
                topic_alias: Some(4),
                properties: &props,
                message_expiry_interval: Some(30),
                subscription_identifiers: &[1, 2, 70_000],
                payload_len: 65_536,
            };
            let (n, len) = allocs_during(|| {
                encode_publish_header(&h, protocol, &mut dst).unwrap();
                h.packet_len(protocol).unwrap()
            });
            assert_eq!(
                n, 0,
                "publish header encode allocated ({protocol:?}, {qos:?})"
            );
            assert_eq!(len, dst.len() + 65_536);

            // Encoding a whole small packet into a buffer with room is
            // allocation-free too.
            let mut dst = BytesMut::with_capacity(2048);
            let (n, ()) = allocs_during(|| encode(&packet, protocol, &mut dst).unwrap());
            assert_eq!(n, 0, "encode allocated ({protocol:?})");
        }
    }
}

//! Memory policy, measured with a counting global allocator: after one
//! 50 MiB message (published in expert mode, published in simple mode, and
//! received back) followed by 1,000 tiny ones, the client holds less than
//! 1 MiB more than before. (The failure this guards against: a framing
//! library whose single internal builder kept 50 MB after one large
//! message, forever.) One test in this binary, so nothing else allocates.

mod common;

use bytes::{BufMut, Bytes};
use common::{within, Broker, Kind};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use zerofan_client::{Client, ClientOptions, Incoming, QoS};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn grew(n: usize) {
    let now = LIVE.fetch_add(n as isize, Ordering::Relaxed) + n as isize;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; counting is relaxed atomic
// arithmetic, which neither allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract (see the impl).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract (see the impl).
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded contract (see the impl).
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const BIG: usize = 50 * 1024 * 1024;
const MIB: isize = 1024 * 1024;

async fn tiny_round(c: &Client, inc: &mut Incoming, n: usize) {
    let mut last = None;
    for i in 0..n {
        let d = if i % 2 == 0 {
            c.publish(
                "mem/tiny",
                QoS::AtLeastOnce,
                Bytes::from_static(b"0123456789"),
            )
            .await
        } else {
            c.publish_with("mem/tiny", QoS::AtLeastOnce, |b| b.put_slice(b"0123456789"))
                .await
        };
        last = Some(d.expect("publish"));
        // Keep the incoming queue moving.
        while let Some(m) = inc.try_recv() {
            drop(m);
        }
    }
    if let Some(d) = last {
        within(30, "tiny ack", d).await.expect("ack");
    }
    for _ in 0..n * 2 {
        match tokio::time::timeout(std::time::Duration::from_millis(200), inc.recv()).await {
            Ok(Some(_)) => {}
            _ => break,
        }
    }
}

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

#[tokio::test]
async fn a_large_message_does_not_leave_large_buffers_behind() {
    for kind in [Kind::Zerofan, Kind::Mosquitto] {
        large_then_tiny(kind).await;
    }
}

async fn large_then_tiny(kind: Kind) {
    PEAK.store(0, Ordering::Relaxed);
    let b = Broker::start(kind);
    let (c, mut inc) = Client::connect(ClientOptions::new(b.addr()))
        .await
        .expect("connect");
    c.subscribe("mem/#", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    // Warm up: pools, channels, maps reach their steady state.
    tiny_round(&c, &mut inc, 1000).await;
    let before = live();

    // Expert: a 50 MiB payload serialized straight into the frame.
    let d = c
        .publish_with("mem/big", QoS::AtLeastOnce, |buf| {
            buf.reserve(BIG);
            buf.put_bytes(0xAB, BIG);
        })
        .await
        .expect("publish big");
    within(60, "big ack", d).await.expect("ack");
    let m = within(60, "big message back", inc.recv())
        .await
        .expect("big");
    assert_eq!(m.payload.len(), BIG);
    let peak_expert = PEAK.load(Ordering::Relaxed);
    assert!(
        peak_expert - before >= BIG as isize,
        "the counter sees the 50 MiB buffers"
    );
    drop(m);
    assert!(c.frame_buffer_capacity() <= zerofan_client::HIGH_WATER);

    // Simple: a 50 MiB Bytes, sent without a copy, dropped after the ack.
    let payload = Bytes::from(vec![0xCD; BIG]);
    let d = c
        .publish("mem/big", QoS::AtLeastOnce, payload)
        .await
        .expect("publish big");
    within(60, "big ack", d).await.expect("ack");
    let m = within(60, "big message back", inc.recv())
        .await
        .expect("big");
    assert_eq!(m.payload.len(), BIG);
    drop(m);

    tiny_round(&c, &mut inc, 1000).await;
    let after = live();
    let held = after - before;
    eprintln!(
        "{kind:?}: live before {} KiB, peak {} MiB, after {} KiB: held {} KiB",
        before / 1024,
        PEAK.load(Ordering::Relaxed) / MIB,
        after / 1024,
        held / 1024
    );
    assert!(
        held < MIB,
        "{kind:?}: {held} bytes still held after a 50 MiB message and 1,000 tiny ones"
    );
    c.disconnect().await.expect("disconnect");
}

//! Behaviour of the pool: reuse, classes, cross-thread returns, the cap,
//! exact metrics, `freeze`, growth and closing.

use std::sync::mpsc;
use std::thread;

use bytes::{BufMut, Bytes};
use zerofan_pool::{class_for, Pool, PoolConfig, PoolMetrics, CLASS_SIZES, MAX_CLASS_SIZE};

fn pool(cap: usize, depth: usize) -> Pool {
    Pool::new(PoolConfig {
        max_retained_bytes: cap,
        thread_cache_depth: depth,
    })
}

/// The address of a buffer's memory (its filled part starts there).
fn addr(buf: &zerofan_pool::PooledBuf) -> usize {
    buf.as_ptr() as usize
}

#[test]
fn classes_and_capacities() {
    let p = Pool::default();
    for (n, cap) in [
        (0, 2048),
        (1, 2048),
        (2048, 2048),
        (2049, 4096),
        (4096, 4096),
        (5000, 8192),
        (16384, 16384),
        (20000, 32768),
        (65536, 65536),
    ] {
        let b = p.get(n);
        assert_eq!(b.capacity(), cap, "get({n})");
        assert_eq!(b.len(), 0);
        assert_eq!(b.class(), class_for(n));
    }
    let big = p.get(MAX_CLASS_SIZE + 1);
    assert_eq!(big.capacity(), MAX_CLASS_SIZE + 1, "unpooled is exact");
    assert_eq!(big.class(), None);
    drop(big);
    let m = p.metrics();
    assert_eq!(m.unpooled, 1);
    assert_eq!(m.discards, 1, "unpooled buffers are never kept");
}

#[test]
fn reuse_returns_the_same_allocation() {
    let p = Pool::default();
    let a = p.get(1000);
    let ptr = addr(&a);
    drop(a);
    let b = p.get(1500); // same class (2 KiB)
    assert_eq!(addr(&b), ptr, "the returned buffer is handed out again");
    let other = p.get(3000); // different class, different memory
    assert_ne!(addr(&other), ptr);
    let m = p.metrics();
    assert_eq!((m.gets, m.hits, m.misses), (3, 1, 2));
}

#[test]
fn reuse_through_the_shared_list_without_thread_cache() {
    let p = pool(1 << 20, 0);
    let a = p.get(4096);
    let ptr = addr(&a);
    drop(a);
    assert_eq!(p.metrics().bytes_retained, 4096);
    assert_eq!(addr(&p.get(4096)), ptr);
}

#[test]
fn metrics_are_exact_in_a_deterministic_scenario() {
    let p = pool(16 * 1024, 2);
    assert_eq!(p.metrics(), PoolMetrics::default());

    // Warm up two 4 KiB buffers into the shared list.
    assert_eq!(p.warm_up(4096, 2), 2);
    let m = p.metrics();
    assert_eq!(m.preallocated, 2);
    assert_eq!(m.bytes_retained, 8192);

    // Three gets of 4 KiB: two hits (shared list), one miss.
    let a = p.get(4000);
    let b = p.get(4000);
    let c = p.get(4000);
    // One get of 2 KiB (miss) and one unpooled (miss).
    let d = p.get(10);
    let e = p.get(100_000);
    let m = p.metrics();
    assert_eq!(m.gets, 5);
    assert_eq!(m.hits, 2);
    assert_eq!(m.misses, 3);
    assert_eq!(m.unpooled, 1);
    assert_eq!(m.returns, 0);
    assert_eq!(m.bytes_retained, 0);
    assert_eq!(m.bytes_outstanding, 3 * 4096 + 2048 + 100_000);
    assert!((m.hit_rate() - 0.4).abs() < 1e-12);

    // Returns: a, b go to this thread's cache (depth 2, 8 KiB charged),
    // c goes to the shared list (12 KiB charged), d to the 2 KiB cache
    // slot (14 KiB), e is unpooled (discard).
    drop(a);
    drop(b);
    drop(c);
    drop(d);
    drop(e);
    let m = p.metrics();
    assert_eq!(m.returns, 5);
    assert_eq!(m.discards, 1);
    assert_eq!(m.bytes_retained, 3 * 4096 + 2048);
    assert_eq!(m.bytes_outstanding, 0);

    // Two 8 KiB buffers: both misses, and with 14 of 16 KiB charged
    // neither fits on return, so both are discarded.
    let f = p.get(8192);
    let g = p.get(8192);
    drop(f);
    drop(g);
    let m = p.metrics();
    assert_eq!(m.gets, 7);
    assert_eq!(m.misses, 5);
    assert_eq!(m.returns, 7);
    assert_eq!(m.discards, 3, "16 KiB cap: 14 KiB used, no room for 8 KiB");
    assert_eq!(m.bytes_retained, 3 * 4096 + 2048);

    // Everything cached is reused: four hits, no miss.
    let bufs: Vec<_> = (0..3).map(|_| p.get(4096)).collect();
    let h = p.get(1);
    let m = p.metrics();
    assert_eq!((m.gets, m.hits, m.misses), (11, 6, 5));
    assert_eq!(m.bytes_retained, 0);
    drop(bufs);
    drop(h);

    // Flushing the thread cache keeps every byte retained, now shared.
    p.flush_thread_cache();
    let m = p.metrics();
    assert_eq!(m.bytes_retained, 3 * 4096 + 2048);
    assert_eq!(m.gets, m.hits + m.misses);
    assert_eq!(m.returns, m.gets);
    assert_eq!(p.trim(), 3 * 4096 + 2048);
    assert_eq!(p.metrics().bytes_retained, 0);
}

#[test]
fn thread_cache_refills_and_spills_in_batches() {
    // Depth 4: refills and spills move 2 buffers per lock.
    let p = pool(1 << 20, 4);
    assert_eq!(p.warm_up(2048, 5), 5);
    let mut out = vec![p.get(1)]; // 1 for us + 2 refilled into the cache
    let m = p.metrics();
    assert_eq!((m.hits, m.misses), (1, 0));
    assert_eq!(m.bytes_retained, 4 * 2048, "2 cached + 2 shared");
    out.extend((0..4).map(|_| p.get(1))); // 2 cached, then 1 + 1 refilled
    out.push(p.get(1)); // shared list empty: a miss
    let m = p.metrics();
    assert_eq!((m.gets, m.hits, m.misses), (6, 5, 1));
    assert_eq!(m.bytes_retained, 0);
    // Returning 6 fills the cache (4), spills 2 to the shared list, and
    // caches the rest.
    drop(out);
    let m = p.metrics();
    assert_eq!(m.bytes_retained, 6 * 2048);
    assert_eq!(m.discards, 0);
    assert_eq!(
        p.trim(),
        2 * 2048,
        "exactly one spill of 2 reached the shared list"
    );
    assert_eq!(p.metrics().bytes_retained, 4 * 2048);
}

#[test]
fn return_from_another_thread() {
    let p = Pool::default();
    let mut buf = p.get(5000);
    buf.extend_from_slice(b"crossing threads");
    let ptr = addr(&buf);
    thread::spawn(move || {
        assert_eq!(&buf[..], b"crossing threads");
        drop(buf); // into this thread's cache, flushed when it exits
    })
    .join()
    .unwrap();
    let m = p.metrics();
    assert_eq!(m.returns, 1);
    assert_eq!(m.bytes_retained, 8192, "flushed to the shared list on exit");
    assert_eq!(m.bytes_outstanding, 0);
    assert_eq!(addr(&p.get(8192)), ptr, "the buffer came back");
    assert_eq!(p.metrics().hits, 1);
}

#[test]
fn return_from_another_thread_that_keeps_running() {
    // Buffers returned on a long-lived thread are reused there.
    let p = Pool::default();
    let (tx, rx) = mpsc::channel::<zerofan_pool::PooledBuf>();
    let (back_tx, back_rx) = mpsc::channel();
    let p2 = p.clone();
    let worker = thread::spawn(move || {
        let mut reused = 0;
        for buf in rx {
            let ptr = addr(&buf);
            drop(buf);
            let again = p2.get(2048);
            reused += usize::from(addr(&again) == ptr);
            back_tx.send(again).unwrap();
        }
        reused
    });
    for _ in 0..10 {
        tx.send(p.get(100)).unwrap();
        drop(back_rx.recv().unwrap()); // returned on this thread
    }
    drop(tx);
    assert_eq!(worker.join().unwrap(), 10);
    let m = p.metrics();
    assert_eq!(m.gets, 20);
    assert_eq!(m.returns, 20);
    assert_eq!(m.bytes_outstanding, 0);
}

#[test]
fn cap_is_respected_and_discards_counted() {
    // No thread cache: everything goes through the shared list.
    let p = pool(3 * 4096, 0);
    let bufs: Vec<_> = (0..5).map(|_| p.get(4096)).collect();
    drop(bufs);
    let m = p.metrics();
    assert_eq!(m.bytes_retained, 3 * 4096);
    assert_eq!(m.discards, 2);

    // With thread caches the cap covers them too.
    let p = pool(2 * 4096, 4);
    let bufs: Vec<_> = (0..4).map(|_| p.get(4096)).collect();
    drop(bufs);
    let m = p.metrics();
    assert_eq!(m.bytes_retained, 2 * 4096);
    assert_eq!(m.discards, 2);

    // A cap smaller than one buffer keeps nothing.
    let p = pool(1000, 4);
    drop(p.get(10));
    let m = p.metrics();
    assert_eq!(m.bytes_retained, 0);
    assert_eq!(m.discards, 1);
}

#[test]
fn cap_is_respected_under_concurrency() {
    const CAP: usize = 256 * 1024;
    let p = pool(CAP, 3);
    let threads = if cfg!(miri) { 2 } else { 4 };
    let rounds = if cfg!(miri) { 30 } else { 5_000 };
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let p = p.clone();
            thread::spawn(move || {
                let mut held = Vec::new();
                let mut x = 0x9E37_79B9_7F4A_7C15_u64 ^ t as u64;
                for _ in 0..rounds {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let size = CLASS_SIZES[(x % 6) as usize];
                    held.push(p.get(size));
                    if held.len() > (x as usize >> 8) % 16 {
                        // Return from the other end, sometimes frozen.
                        let b = held.swap_remove(0);
                        if x & 1 == 0 {
                            let frozen = b.freeze();
                            drop(frozen.clone());
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let m = p.metrics();
    assert!(m.bytes_retained <= CAP as u64, "{m:?}");
    assert_eq!(m.gets, m.returns);
    assert_eq!(m.gets, m.hits + m.misses);
    assert_eq!(m.bytes_outstanding, 0);
}

#[test]
fn warm_up_fills_shared_lists_within_the_cap() {
    let p = pool(10_000, 4);
    assert_eq!(
        p.warm_up(4096, 10),
        2,
        "only two 4 KiB buffers fit 10 000 B"
    );
    assert_eq!(p.warm_up(1 << 20, 1), 0, "unpooled sizes are not warmed");
    let m = p.metrics();
    assert_eq!(m.preallocated, 2);
    assert_eq!(m.bytes_retained, 8192);
    let a = p.get(4096);
    let b = p.get(4096);
    let c = p.get(4096);
    let m = p.metrics();
    assert_eq!((m.hits, m.misses), (2, 1));
    drop((a, b, c));
    assert!(p.metrics().bytes_retained <= 10_000);
}

#[test]
fn freeze_clones_dropped_on_other_threads_return_the_buffer() {
    let p = Pool::default();
    let mut buf = p.get(10_000);
    buf.extend_from_slice(b"one payload, many subscribers");
    let ptr = addr(&buf);
    let bytes: Bytes = buf.freeze();
    assert_eq!(bytes.as_ptr() as usize, ptr, "freeze does not copy");
    let topic = bytes.slice(0..3);
    let clones: Vec<Bytes> = (0..4).map(|_| bytes.clone()).collect();
    drop(bytes);
    assert_eq!(p.metrics().returns, 0);
    let handles: Vec<_> = clones
        .into_iter()
        .map(|b| {
            thread::spawn(move || {
                assert_eq!(&b[..], b"one payload, many subscribers");
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(p.metrics().returns, 0, "a slice still holds it");
    let m = thread::spawn(move || {
        assert_eq!(&topic[..], b"one");
        drop(topic); // the last reference, on another thread
    })
    .join();
    m.unwrap();
    let m = p.metrics();
    assert_eq!(m.returns, 1);
    assert_eq!(m.bytes_outstanding, 0);
    assert_eq!(m.bytes_retained, 16384);
    assert_eq!(addr(&p.get(16384)), ptr, "and it is reused");
}

#[test]
fn freeze_of_an_empty_buffer_returns_it_at_once() {
    let p = Pool::default();
    let b = p.get(10).freeze();
    assert!(b.is_empty());
    assert_eq!(p.metrics().returns, 1);
}

#[test]
fn buf_mut_and_growth() {
    let p = Pool::default();
    let mut b = p.get(0);
    b.put_u8(0x30);
    b.put_u16(0x1234);
    b.put_slice(b"abc");
    b.put_bytes(b'z', 2);
    assert_eq!(&b[..], &[0x30, 0x12, 0x34, b'a', b'b', b'c', b'z', b'z']);
    assert_eq!(b.remaining_mut(), 2048 - 8);

    // Growth moves the contents to a larger class of the same pool and
    // returns the old buffer.
    let payload = vec![7u8; 3000];
    b.extend_from_slice(&payload);
    assert_eq!(b.capacity(), 4096);
    assert_eq!(b.len(), 3008);
    assert_eq!(&b[..8], &[0x30, 0x12, 0x34, b'a', b'b', b'c', b'z', b'z']);
    assert!(b[8..].iter().all(|&x| x == 7));
    let m = p.metrics();
    assert_eq!((m.gets, m.returns), (2, 1));

    // Growth beyond the largest class is exact, then unpooled.
    b.reserve(MAX_CLASS_SIZE);
    assert_eq!(b.capacity(), 3008 + MAX_CLASS_SIZE);
    assert_eq!(b.class(), None);
    assert_eq!(b.len(), 3008);

    b.truncate(3);
    assert_eq!(&b[..], &[0x30, 0x12, 0x34]);
    b.clear();
    assert!(b.is_empty());
}

#[test]
#[should_panic(expected = "past capacity")]
fn buf_mut_is_fixed_capacity() {
    let p = Pool::default();
    let mut b = p.get(2048);
    b.put_slice(&[0u8; 2049]);
}

#[test]
fn filling_like_tokio_read_buf() {
    // `tokio::io::AsyncReadExt::read_buf` writes into `chunk_mut()` and
    // then calls `advance_mut(n)`: do exactly that.
    let p = Pool::default();
    let mut b = p.get(2048);
    let src = b"\x30\x05\x00\x01tpay";
    let dst = b.chunk_mut();
    assert_eq!(dst.len(), 2048);
    dst[..src.len()].copy_from_slice(src);
    // SAFETY: the first `src.len()` bytes of `chunk_mut()` were written just
    // above (and `PooledBuf` memory is always initialised anyway), and
    // `src.len() <= remaining_mut()`.
    unsafe { b.advance_mut(src.len()) };
    assert_eq!(&b[..], src);

    // The synchronous way, without unsafe.
    let n = std::io::Read::read(&mut &b"more"[..], b.unfilled_mut()).unwrap();
    b.advance(n);
    assert_eq!(&b[..], b"\x30\x05\x00\x01tpaymore");
}

#[test]
fn dropping_the_pool_closes_it() {
    let p = pool(1 << 20, 4);
    p.warm_up(2048, 3);
    let out = p.get(2048);
    let cached = p.get(4096);
    drop(cached); // in this thread's cache
    let clone = p.clone();
    drop(p);
    assert_eq!(
        clone.metrics().bytes_retained,
        2 * 2048 + 4096,
        "still open"
    );
    drop(clone); // closes: shared lists and this thread's cache freed
    drop(out); // returned after close: freed, no panic
}

#[test]
fn many_pools_on_one_thread() {
    // More pools than a thread caches for: the extra ones bypass the thread
    // cache but still work exactly.
    let pools: Vec<Pool> = (0..12).map(|_| pool(1 << 20, 2)).collect();
    for p in &pools {
        let a = p.get(100);
        let ptr = addr(&a);
        drop(a);
        assert_eq!(addr(&p.get(100)), ptr);
        let m = p.metrics();
        assert_eq!((m.gets, m.hits, m.returns), (2, 1, 2));
    }
}

#[test]
fn global_pool() {
    let a = Pool::global().get(100);
    assert_eq!(a.capacity(), 2048);
    drop(a);
    assert!(Pool::global().metrics().returns >= 1);
}

#[test]
fn handles_and_buffers_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Pool>();
    assert_send_sync::<zerofan_pool::PooledBuf>();
    assert_send_sync::<PoolMetrics>();
    assert_send_sync::<PoolConfig>();
}

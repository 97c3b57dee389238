//! The real-time path never allocates: a counting global allocator watches
//! the exact code the audio callback runs (`Packetizer::push`), fed with
//! arbitrary slice sizes, in steady state after warm-up.
//!
//! Allocations are counted per thread (a thread-local switch), so the
//! test harness's own threads do not disturb the count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use zerofan_audio::{packet_channel, SampleFormat, StreamParams};
use zerofan_pool::{Pool, PoolConfig};

struct Counting;

thread_local! {
    /// Whether allocations on this thread are counted. `const` init: reading
    /// it never allocates (no lazy initialisation, no destructor).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}
static ALLOCS: AtomicU64 = AtomicU64::new(0);

fn note() {
    if COUNTING.try_with(|c| c.get()).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are this allocator's; the counting is
// an atomic add and a const thread-local read, neither of which allocates
// (no re-entry).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: `ptr` came from `System` through this allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counted<R>(f: impl FnOnce() -> R) -> (u64, R) {
    let before = ALLOCS.load(Ordering::SeqCst);
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (ALLOCS.load(Ordering::SeqCst) - before, r)
}

fn params(format: SampleFormat, channels: u16) -> StreamParams {
    StreamParams {
        sample_rate: 48_000,
        channels,
        format,
        frames_per_packet: 480,
    }
}

/// Callback sizes as backends deliver them: not multiples of the packet.
const SIZES: [usize; 7] = [441, 17, 1024, 480, 1, 960, 333];

#[test]
fn one_thread_full_cycle_allocates_nothing_per_packet() {
    for (format, channels) in [
        (SampleFormat::I16, 1),
        (SampleFormat::F32, 2),
        (SampleFormat::I16, 2),
    ] {
        let p = params(format, channels);
        let (mut pk, mut rx) = packet_channel(p, Pool::new(PoolConfig::default()), 16);
        let i16s = vec![1000i16; 1024 * usize::from(channels)];
        let f32s = vec![0.25f32; 1024 * usize::from(channels)];
        let mut got = 0u64;
        let mut run = |rounds: usize, got: &mut u64| {
            for (i, n) in SIZES.iter().cycle().take(rounds).enumerate() {
                let len = n * usize::from(channels);
                // Alternate input types: conversion is on the same path.
                if i % 2 == 0 {
                    pk.push(&i16s[..len], i as u64);
                } else {
                    pk.push(&f32s[..len], i as u64);
                }
                while let Some(packet) = rx.try_recv() {
                    assert_eq!(packet.samples().len(), p.packet_bytes());
                    *got += 1;
                    drop(packet); // back to the pool (this thread's cache)
                }
            }
        };
        // Warm-up: the thread cache for the pool is created on first use.
        run(200, &mut got);
        let before = got;
        let (allocs, ()) = counted(|| run(3000, &mut got));
        let packets = got - before;
        assert!(packets > 2500, "{packets} packets");
        assert_eq!(
            allocs, 0,
            "{format:?}x{channels}: {allocs} allocations for {packets} packets"
        );
    }
}

#[test]
fn drop_paths_allocate_nothing() {
    let p = params(SampleFormat::I16, 1);
    let (mut pk, mut rx) = packet_channel(p, Pool::new(PoolConfig::default()), 4);
    let samples = vec![7i16; 4800];
    let mut held = Vec::with_capacity(64);
    let (allocs, ()) = counted(|| {
        // Queue full: 10 packets, nobody reading.
        pk.push(&samples, 0);
        // No empty buffer: take packets without refilling.
        for _ in 0..4 {
            while let Some(p) = rx.drain_one() {
                held.push(p);
            }
            pk.push(&samples[..960], 0);
        }
    });
    assert_eq!(allocs, 0, "{allocs} allocations on the drop paths");
    assert!(!held.is_empty());
}

#[test]
fn callback_thread_allocates_nothing_while_a_consumer_runs() {
    let p = params(SampleFormat::F32, 2);
    let (mut pk, mut rx) = packet_channel(p, Pool::new(PoolConfig::default()), 64);
    let done = Arc::new(AtomicBool::new(false));
    let consumer = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            loop {
                let finished = done.load(Ordering::Acquire);
                while let Some(packet) = rx.try_recv() {
                    n += 1;
                    drop(packet);
                }
                if finished {
                    return n;
                }
                std::thread::park_timeout(std::time::Duration::from_millis(5));
            }
        })
    };
    pk.set_notify(Some(consumer.thread().clone()));
    let samples = vec![0.5f32; 2048];
    let producer = std::thread::spawn(move || {
        // Warm-up outside the count (first unpark, first packets).
        for n in SIZES.iter().cycle().take(100) {
            pk.push(&samples[..n * 2], 0);
        }
        let (allocs, ()) = counted(|| {
            for (i, n) in SIZES.iter().cycle().take(5000).enumerate() {
                pk.push(&samples[..n * 2], i as u64);
                if i % 8 == 0 {
                    // Let the consumer keep up most of the time.
                    std::thread::yield_now();
                }
            }
        });
        (allocs, pk)
    });
    let (allocs, pk) = producer.join().expect("producer thread");
    done.store(true, Ordering::Release);
    consumer.thread().unpark();
    let received = consumer.join().expect("consumer thread");
    drop(pk);
    assert_eq!(allocs, 0, "callback thread allocated {allocs} times");
    assert!(received > 1000, "consumer got {received} packets");
}

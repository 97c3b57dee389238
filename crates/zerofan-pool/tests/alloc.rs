//! Heap allocations, counted by a global allocator.
//!
//! The counts are per thread (a `const` thread-local `Cell`, which itself
//! never allocates), so tests running in parallel do not disturb each other.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::Bytes;
use zerofan_pool::{Pool, PoolConfig, CLASS_SIZES};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static FREES: Cell<u64> = const { Cell::new(0) };
}

fn bump(c: &'static std::thread::LocalKey<Cell<u64>>) {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let _ = c.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; the counting touches only a
// `const`-initialised thread-local `Cell`, which neither allocates nor
// unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump(&ALLOCS);
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump(&ALLOCS);
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump(&ALLOCS);
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        bump(&FREES);
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// (allocations, frees) made by `f` on this thread.
fn count<R>(f: impl FnOnce() -> R) -> (u64, u64, R) {
    let a0 = ALLOCS.with(Cell::get);
    let f0 = FREES.with(Cell::get);
    let r = f();
    let a1 = ALLOCS.with(Cell::get);
    let f1 = FREES.with(Cell::get);
    (a1 - a0, f1 - f0, r)
}

fn iters() -> usize {
    if cfg!(miri) {
        20
    } else {
        10_000
    }
}

#[test]
fn zero_allocations_per_get_and_return_in_steady_state() {
    let pool = Pool::new(PoolConfig::default());
    for size in CLASS_SIZES {
        pool.warm_up(size, 4);
    }
    // First use on this thread: creates the thread's cache entry (a few
    // one-time allocations) and charges the cache slots.
    for size in CLASS_SIZES {
        let held: Vec<_> = (0..4).map(|_| pool.get(size)).collect();
        drop(held);
    }
    let (allocs, frees, ()) = count(|| {
        for i in 0..iters() {
            let size = CLASS_SIZES[i % CLASS_SIZES.len()];
            let mut a = pool.get(size);
            let b = pool.get(size / 2 + 1);
            a.extend_from_slice(b"steady");
            drop(a);
            drop(b);
        }
    });
    assert_eq!((allocs, frees), (0, 0), "per get+return in steady state");
    let m = pool.metrics();
    assert_eq!(m.misses, 0, "all served by warm-up buffers: {m:?}");
}

#[test]
fn zero_allocations_through_the_shared_lists_too() {
    // Thread cache disabled: every get and return takes the shared list.
    let pool = Pool::new(PoolConfig {
        thread_cache_depth: 0,
        ..PoolConfig::default()
    });
    pool.warm_up(4096, 8);
    drop(pool.get(4096)); // first use on this thread
    let (allocs, frees, ()) = count(|| {
        for _ in 0..iters() {
            let held = [pool.get(4096), pool.get(4000), pool.get(3000)];
            drop(held);
        }
    });
    assert_eq!((allocs, frees), (0, 0));
}

#[test]
fn freeze_costs_exactly_one_allocation_and_clones_none() {
    let pool = Pool::new(PoolConfig::default());
    pool.warm_up(2048, 2);
    drop(pool.get(1)); // first use on this thread
    let n = iters() as u64;
    let (allocs, frees, ()) = count(|| {
        for _ in 0..n {
            let mut b = pool.get(100);
            b.extend_from_slice(b"payload");
            let bytes: Bytes = b.freeze();
            let c1 = bytes.clone();
            let c2 = c1.slice(1..4);
            drop(bytes);
            drop(c1);
            drop(c2);
        }
    });
    assert_eq!(allocs, n, "one `Bytes::from_owner` header per freeze");
    assert_eq!(frees, n, "the header is freed with the last clone");

    // Clones and slices alone allocate nothing, and neither does dropping
    // all but the last.
    let mut b = pool.get(100);
    b.extend_from_slice(b"payload");
    let bytes = b.freeze();
    let mut clones: Vec<Bytes> = Vec::with_capacity(100);
    let (allocs, frees, ()) = count(|| {
        for i in 0..100 {
            clones.push(if i % 2 == 0 {
                bytes.clone()
            } else {
                bytes.slice(2..)
            });
        }
        clones.clear();
    });
    assert_eq!((allocs, frees), (0, 0));
    let (allocs, frees, ()) = count(|| drop(bytes));
    assert_eq!((allocs, frees), (0, 1), "last drop frees the header only");
}

#[test]
fn unpooled_gets_allocate_exactly_once() {
    let pool = Pool::new(PoolConfig::default());
    let (allocs, frees, ()) = count(|| drop(pool.get(100_000)));
    assert_eq!((allocs, frees), (1, 1));
}

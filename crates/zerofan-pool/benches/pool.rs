//! Pool get+return (one and two threads) against plain
//! `BytesMut::with_capacity`, and get+freeze+drop, in one run.
//!
//! ```text
//! taskset -c 1 cargo bench -p zerofan-pool --bench pool -- --warm-up-time 1 --measurement-time 3
//! ```
//! (two-thread cases need two cores: run them with `taskset -c 0,1`.)
//!
//! After the timed benchmarks, heap allocations per operation are counted
//! with a counting global allocator and printed as `allocs/op` lines.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use criterion::{criterion_group, BenchmarkId, Criterion};
use zerofan_pool::{Pool, PoolConfig};

// ---- counting allocator (per thread, so the harness does not disturb it) --

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every method forwards to `System` unchanged; the counting touches
// only a `const`-initialised thread-local `Cell`, which neither allocates nor
// unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

// ---- the operations measured -------------------------------------------

const SIZES: [(usize, &str); 2] = [(2048, "2KiB"), (65536, "64KiB")];

fn warmed_pool() -> Pool {
    let pool = Pool::new(PoolConfig::default());
    for (size, _) in SIZES {
        pool.warm_up(size, 8);
    }
    pool
}

#[inline(always)]
fn pooled_get_return(pool: &Pool, size: usize) {
    drop(black_box(pool.get(black_box(size))));
}

#[inline(always)]
fn bytesmut_alloc_drop(size: usize) {
    drop(black_box(BytesMut::with_capacity(black_box(size))));
}

#[inline(always)]
fn pooled_freeze_drop(pool: &Pool) {
    let mut b = pool.get(black_box(2048));
    b.put_slice(&[0x5a; 64]);
    let bytes = b.freeze();
    let clone = black_box(bytes.clone());
    drop(bytes);
    drop(clone);
}

#[inline(always)]
fn bytesmut_freeze_drop() {
    let mut b = BytesMut::with_capacity(black_box(2048));
    b.put_slice(&[0x5a; 64]);
    let bytes = b.freeze();
    let clone = black_box(bytes.clone());
    drop(bytes);
    drop(clone);
}

/// Runs `op` `iters` times on each of two threads at once; returns the wall
/// time of the slower thread (so time/iter is per operation, per thread,
/// with both threads busy).
fn two_threads(iters: u64, op: impl Fn() + Send + Sync + 'static) -> Duration {
    let op = Arc::new(op);
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let op = op.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                // One untimed round so thread-cache set-up is not measured.
                op();
                barrier.wait();
                let start = Instant::now();
                for _ in 0..iters {
                    op();
                }
                start.elapsed()
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .max()
        .unwrap()
}

fn bench_get_return(c: &mut Criterion) {
    let mut g = c.benchmark_group("get_return");
    for (size, name) in SIZES {
        let pool = warmed_pool();
        pooled_get_return(&pool, size); // thread cache set-up
        g.bench_function(BenchmarkId::new("pooled_1thread", name), |b| {
            b.iter(|| pooled_get_return(&pool, size))
        });
        g.bench_function(BenchmarkId::new("bytesmut_1thread", name), |b| {
            b.iter(|| bytesmut_alloc_drop(size))
        });
        let shared = pool.clone();
        g.bench_function(BenchmarkId::new("pooled_2threads", name), |b| {
            b.iter_custom(|iters| {
                let pool = shared.clone();
                two_threads(iters, move || pooled_get_return(&pool, size))
            })
        });
        g.bench_function(BenchmarkId::new("bytesmut_2threads", name), |b| {
            b.iter_custom(|iters| two_threads(iters, move || bytesmut_alloc_drop(size)))
        });
    }
    g.finish();
}

fn bench_freeze(c: &mut Criterion) {
    let mut g = c.benchmark_group("get_fill64_freeze_clone_drop");
    let pool = warmed_pool();
    pooled_freeze_drop(&pool);
    g.bench_function("pooled_2KiB", |b| b.iter(|| pooled_freeze_drop(&pool)));
    g.bench_function("bytesmut_2KiB", |b| b.iter(bytesmut_freeze_drop));
    g.finish();
}

criterion_group!(benches, bench_get_return, bench_freeze);

/// Heap allocations per operation, measured outside the timed loops.
fn report_allocations() {
    const N: u64 = 100_000;
    fn per_op(f: impl Fn()) -> f64 {
        f(); // set-up round
        let before = allocs();
        for _ in 0..N {
            f();
        }
        (allocs() - before) as f64 / N as f64
    }
    let pool = warmed_pool();
    println!();
    for (size, name) in SIZES {
        let p = per_op(|| pooled_get_return(&pool, size));
        let m = per_op(|| bytesmut_alloc_drop(size));
        println!("allocs/op get_return/pooled/{name}: {p}");
        println!("allocs/op get_return/bytesmut/{name}: {m}");
    }
    let p = per_op(|| pooled_freeze_drop(&pool));
    let m = per_op(bytesmut_freeze_drop);
    println!("allocs/op get_fill64_freeze_clone_drop/pooled_2KiB: {p}");
    println!("allocs/op get_fill64_freeze_clone_drop/bytesmut_2KiB: {m}");
    let per_thread: Vec<f64> = (0..2)
        .map(|_| {
            let pool = pool.clone();
            thread::spawn(move || per_op(|| pooled_get_return(&pool, 2048)))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    println!("allocs/op get_return/pooled_2threads/2KiB: {per_thread:?}");
    let m = pool.metrics();
    println!(
        "pool metrics after the allocation runs: gets {} hits {} misses {} hit rate {:.6}",
        m.gets,
        m.hits,
        m.misses,
        m.hit_rate()
    );
}

fn main() {
    benches();
    report_allocations();
    Criterion::default().configure_from_args().final_summary();
}

//! Pool get+return (one and two threads) against plain
//! `BytesMut::with_capacity`, and get+freeze+drop, in one run.
//!
//! ```text
//! taskset -c 1 cargo bench -p zerofan-pool --bench pool -- --warm-up-time 1 --measurement-time 3
//! ```
//! (two-thread cases need two cores: run them with `taskset -c 0,1`.)
//!
//! Every case runs twice: in groups named `…` timed by wall clock (criterion's
//! default), and in groups named `…_cpu` timed by the thread's own CPU clock
//! (`CLOCK_THREAD_CPUTIME_ID`), which leaves out the time the thread spent
//! waiting for a core on a busy machine.
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
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{BenchmarkId, Criterion};
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

// ---- thread CPU time as a criterion measurement ---------------------------

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
}

/// `CLOCK_THREAD_CPUTIME_ID` on Linux.
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

/// CPU time consumed by the calling thread.
fn thread_cpu_time() -> Duration {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` (glibc, x86-64/aarch64 Linux, where `time_t`
    // and `long` are 64-bit so `Timespec` matches `struct timespec`) writes
    // one `struct timespec` through a valid, exclusive pointer and touches
    // nothing else.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Criterion measurement: CPU time of the measuring thread.
struct ThreadCpuTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;
    fn start(&self) -> Duration {
        thread_cpu_time()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu_time() - start
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        static WALL: WallTime = WallTime;
        WALL.formatter() // nanoseconds, same units and scaling
    }
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

/// Runs `op` `iters` times on each of two threads at once; returns the time
/// (wall clock, or the thread's CPU clock if `cpu`) of the slower thread, so
/// time/iter is per operation, per thread, with both threads busy.
fn two_threads(iters: u64, cpu: bool, op: impl Fn() + Send + Sync + 'static) -> Duration {
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
                let (wall, cpu_start) = (Instant::now(), thread_cpu_time());
                for _ in 0..iters {
                    op();
                }
                if cpu {
                    thread_cpu_time() - cpu_start
                } else {
                    wall.elapsed()
                }
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .max()
        .unwrap()
}

/// Gets (or allocates) on this thread and writes 64 bytes, then hands the
/// buffer to a second thread that drops it: the reader/writer pattern of
/// the broker, where the last reference of a read buffer is dropped on
/// another thread. Buffers travel in batches of 256 (recycled `Vec`s over
/// two channels) so that the channel's cost is spread thin. Returns (time,
/// allocations on the producer, allocations on the consumer); with `cpu`
/// the time is the CPU time of both threads added up.
fn handoff<T: Send + 'static>(iters: u64, cpu: bool, make: impl Fn() -> T) -> (Duration, u64, u64) {
    const BATCH: usize = 256;
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Vec<T>>(4);
    let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel::<Vec<T>>(4);
    for _ in 0..4 {
        empty_tx.send(Vec::with_capacity(BATCH)).unwrap();
    }
    let consumer = thread::spawn(move || {
        let (a0, c0) = (allocs(), thread_cpu_time());
        for mut batch in full_rx {
            batch.clear(); // drops every buffer here
            let _ = empty_tx.send(batch);
        }
        (thread_cpu_time() - c0, allocs() - a0)
    });
    let (wall, c0, a0) = (Instant::now(), thread_cpu_time(), allocs());
    let mut left = iters;
    while left > 0 {
        let mut batch = empty_rx.recv().unwrap();
        let n = left.min(BATCH as u64);
        for _ in 0..n {
            batch.push(make());
        }
        left -= n;
        full_tx.send(batch).unwrap();
    }
    drop(full_tx);
    let (producer_cpu, producer_allocs) = (thread_cpu_time() - c0, allocs() - a0);
    let (consumer_cpu, consumer_allocs) = consumer.join().unwrap();
    let time = if cpu {
        producer_cpu + consumer_cpu
    } else {
        wall.elapsed()
    };
    (time, producer_allocs, consumer_allocs)
}

fn pooled_filled(pool: &Pool) -> zerofan_pool::PooledBuf {
    let mut b = pool.get(black_box(2048));
    b.put_slice(&[0x5a; 64]);
    b
}

fn bytesmut_filled() -> BytesMut {
    let mut b = BytesMut::with_capacity(black_box(2048));
    b.put_slice(&[0x5a; 64]);
    b
}

fn bench_handoff<M: Measurement<Value = Duration>>(c: &mut Criterion<M>, cpu: bool) {
    let mut g = c.benchmark_group(if cpu { "handoff_cpu" } else { "handoff" });
    let pool = warmed_pool();
    g.bench_function("pooled_2KiB", |b| {
        b.iter_custom(|iters| handoff(iters, cpu, || pooled_filled(&pool)).0)
    });
    g.bench_function("bytesmut_2KiB", |b| {
        b.iter_custom(|iters| handoff(iters, cpu, bytesmut_filled).0)
    });
    g.finish();
}

fn bench_get_return<M: Measurement<Value = Duration>>(c: &mut Criterion<M>, cpu: bool) {
    let mut g = c.benchmark_group(if cpu { "get_return_cpu" } else { "get_return" });
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
                two_threads(iters, cpu, move || pooled_get_return(&pool, size))
            })
        });
        g.bench_function(BenchmarkId::new("bytesmut_2threads", name), |b| {
            b.iter_custom(|iters| two_threads(iters, cpu, move || bytesmut_alloc_drop(size)))
        });
    }
    g.finish();
}

fn bench_freeze<M: Measurement>(c: &mut Criterion<M>, cpu: bool) {
    let name = "get_fill64_freeze_clone_drop";
    let mut g = c.benchmark_group(if cpu {
        format!("{name}_cpu")
    } else {
        name.into()
    });
    let pool = warmed_pool();
    pooled_freeze_drop(&pool);
    g.bench_function("pooled_2KiB", |b| b.iter(|| pooled_freeze_drop(&pool)));
    g.bench_function("bytesmut_2KiB", |b| b.iter(bytesmut_freeze_drop));
    g.finish();
}

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
    for (name, (_, p, c)) in [
        ("pooled_2KiB", handoff(N, false, || pooled_filled(&pool))),
        ("bytesmut_2KiB", handoff(N, false, bytesmut_filled)),
    ] {
        println!(
            "allocs/op handoff/{name}: producer {} consumer {}",
            p as f64 / N as f64,
            c as f64 / N as f64
        );
    }
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
    let mut wall = Criterion::default().configure_from_args();
    bench_get_return(&mut wall, false);
    bench_freeze(&mut wall, false);
    bench_handoff(&mut wall, false);
    let mut cpu = Criterion::default()
        .with_measurement(ThreadCpuTime)
        .configure_from_args();
    bench_get_return(&mut cpu, true);
    bench_freeze(&mut cpu, true);
    bench_handoff(&mut cpu, true);
    report_allocations();
    wall.final_summary();
}

//! A size-class buffer pool whose buffers become [`bytes::Bytes`] and come
//! back to the pool when the last clone drops, on any thread.
//!
//! This is the memory under zerofan's zero-copy data path: a connection
//! borrows a [`PooledBuf`] from a [`Pool`], reads socket bytes into it (it
//! implements [`BufMut`], so `tokio::io::AsyncReadExt::read_buf` fills it),
//! decodes packets in place and [`freeze`](PooledBuf::freeze)s it into
//! `Bytes` whose slices travel to every subscriber without a copy.
//!
//! # Map of the crate
//!
//! - [`Pool`]: a cheaply cloneable handle. [`Pool::get`] hands out buffers,
//!   [`Pool::warm_up`] pre-allocates, [`Pool::metrics`] takes a snapshot.
//! - [`PoolConfig`]: the retention cap and the per-thread cache depth.
//! - [`PooledBuf`]: an owned buffer of one size class; dropping it or the
//!   last `Bytes` made from it returns the memory.
//! - [`PoolMetrics`]: a plain snapshot of the pool's counters.
//! - [`CLASS_SIZES`] and [`class_for`]: the size classes (2, 4, 8, 16, 32
//!   and 64 KiB). A request above 64 KiB is allocated exactly and never
//!   pooled.
//!
//! # How memory moves
//!
//! ```text
//!           get (hit)                 get (cache empty: 1 + a batch refill)
//!  thread cache ──────▶ PooledBuf ◀──────── shared free list (one per class, Mutex)
//!  (per thread, per pool,  │   ▲                    ▲
//!   per class, `depth`)    │   └── get (miss): allocate
//!        ▲                 │ drop / last Bytes clone dropped (any thread)
//!        └── cache has room┴── cache full ──▶ spill a batch to the shared list,
//!                                          cache this one; over the cap: discard
//! ```
//!
//! The hot path (a get served by the calling thread's cache and a return into
//! it) takes no lock, performs no atomic read-modify-write and allocates
//! nothing: it updates one counter that belongs to the calling thread, with a
//! relaxed load and store, and the buffer finds its pool through a plain
//! `&'static` reference rather than a reference count.
//!
//! Buffers move between a thread cache and the shared list in batches of
//! half the cache depth under one lock: a get that finds its cache empty
//! takes one buffer plus a batch from the shared list, and a return that
//! finds the cache full first spills a batch to it. So a thread that only
//! gets (a connection reader) and one that only returns (a writer dropping
//! the last `Bytes`) touch the shared lists once per batch, not per buffer.
//!
//! # Retention cap
//!
//! The pool keeps a budget of at most [`PoolConfig::max_retained_bytes`]
//! bytes. Buffers in the shared lists are charged to it, and so is every
//! thread-cache slot the moment it is first used (the slot keeps its charge
//! while it is emptied by gets, so that the hot path never touches the
//! shared budget). Hence the bytes the pool retains never exceed the cap; a
//! return that would exceed it frees the buffer and counts a discard. Empty
//! slots give their charges back when the thread next finds its cache empty
//! (refill or miss), exits, or calls [`Pool::flush_thread_cache`]; until
//! then they can make a return be discarded a little before the retained
//! bytes reach the cap (at most `depth` × class size per thread and class).
//!
//! Buffers in one thread's cache are not available to other threads: a
//! thread that finds its cache and the shared list empty allocates (a miss)
//! even if another thread's cache holds buffers. With a cap that leaves
//! room, misses stop after ramp-up; a cap close to the working set trades
//! memory for misses and discards.
//!
//! # Lifetime of a pool
//!
//! Each [`Pool::new`] leaks one small control block (896 bytes on x86-64:
//! six mutex-guarded lists and a block of counters, kept reachable from a
//! static so leak checkers do not report it) for the life of the process, so
//! that a buffer can name its pool with a `&'static` reference instead of an
//! atomic reference count (which would cost two read-modify-writes on a
//! shared cache line per get and return). When the last `Pool` handle drops,
//! the pool closes: the shared lists are freed, buffers returned afterwards
//! are freed, and other threads' caches for it are freed the next time
//! those threads add a pool to their cache table or exit. Create pools once
//! (one per broker), not per connection.
//!
//! Each thread that uses a pool gets, on first use, a cache entry for it
//! (about 200 bytes, a 512-byte counter block and one `Vec` of `depth`
//! slots per class); a thread caches for at most 8 pools at once, and uses
//! the shared lists directly for any further pool.
//!
//! # Example
//!
//! ```
//! use bytes::BufMut;
//! use zerofan_pool::{Pool, PoolConfig};
//!
//! let pool = Pool::new(PoolConfig::default());
//! let mut buf = pool.get(3000); // a 4 KiB buffer
//! assert_eq!(buf.capacity(), 4096);
//! buf.put_slice(b"hello ");
//! buf.extend_from_slice(b"world");
//! let bytes = buf.freeze(); // memory returns when the last clone drops
//! let hello = bytes.slice(0..5);
//! drop(bytes);
//! assert_eq!(&hello[..], b"hello");
//! drop(hello);
//! assert_eq!(pool.metrics().returns, 1);
//! ```

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::cell::RefCell;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes};

/// The pooled size classes, in bytes: 2, 4, 8, 16, 32 and 64 KiB.
pub const CLASS_SIZES: [usize; NUM_CLASSES] = [2048, 4096, 8192, 16384, 32768, 65536];

/// How many size classes there are.
pub const NUM_CLASSES: usize = 6;

/// The largest pooled size (64 KiB). Larger requests are allocated exactly
/// and freed when dropped.
pub const MAX_CLASS_SIZE: usize = CLASS_SIZES[NUM_CLASSES - 1];

/// log2 of the smallest class size.
const MIN_SHIFT: u32 = 11;
/// `PooledBuf::class` of a buffer that belongs to no class.
const UNPOOLED: u8 = u8::MAX;
/// How many pools one thread keeps caches for; further pools bypass the
/// thread cache on that thread (correct, only slower).
const MAX_POOLS_PER_THREAD: usize = 8;
/// Upper bound on [`PoolConfig::thread_cache_depth`].
const MAX_DEPTH: usize = 1024;

/// The index into [`CLASS_SIZES`] of the smallest class that holds
/// `size` bytes, or `None` if `size` is above [`MAX_CLASS_SIZE`].
///
/// ```
/// use zerofan_pool::class_for;
/// assert_eq!(class_for(0), Some(0));
/// assert_eq!(class_for(2048), Some(0));
/// assert_eq!(class_for(2049), Some(1));
/// assert_eq!(class_for(65536), Some(5));
/// assert_eq!(class_for(65537), None);
/// ```
#[inline]
pub fn class_for(size: usize) -> Option<usize> {
    if size <= CLASS_SIZES[0] {
        return Some(0);
    }
    // ceil(log2(size)) for size > 2048.
    let bits = usize::BITS - (size - 1).leading_zeros();
    let class = (bits - MIN_SHIFT) as usize;
    (class < NUM_CLASSES).then_some(class)
}

// ---------------------------------------------------------------------------
// Configuration and metrics
// ---------------------------------------------------------------------------

/// How a [`Pool`] behaves.
///
/// ```
/// use zerofan_pool::PoolConfig;
/// let config = PoolConfig { max_retained_bytes: 8 << 20, ..PoolConfig::default() };
/// assert_eq!(config.thread_cache_depth, PoolConfig::default().thread_cache_depth);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// The most bytes the pool keeps for reuse, over all classes, shared
    /// lists and thread caches together. Returns beyond it are freed and
    /// counted as discards. Default: 64 MiB.
    pub max_retained_bytes: usize,
    /// How many buffers of each class each thread caches for this pool
    /// before returns go to the shared lists. `0` disables thread caches.
    /// Values above 1024 are treated as 1024. Default: 8.
    pub thread_cache_depth: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_retained_bytes: 64 << 20,
            thread_cache_depth: 8,
        }
    }
}

/// A snapshot of a pool's counters, from [`Pool::metrics`].
///
/// Invariants, exact whenever no other thread is using the pool:
/// `gets == hits + misses`, `unpooled <= misses`, and
/// `returns <= gets` (the difference is the number of buffers still out).
/// While other threads work, each counter is read separately with relaxed
/// loads, so a snapshot may mix slightly different instants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolMetrics {
    /// Calls to [`Pool::get`].
    pub gets: u64,
    /// Gets served with a buffer the pool already held.
    pub hits: u64,
    /// Gets that had to allocate (including every unpooled get).
    pub misses: u64,
    /// Gets above [`MAX_CLASS_SIZE`], allocated exactly and never pooled.
    pub unpooled: u64,
    /// Buffers that came back: a [`PooledBuf`] dropped, or the last `Bytes`
    /// made by [`PooledBuf::freeze`] dropped.
    pub returns: u64,
    /// Returned buffers freed instead of kept: over the retention cap,
    /// unpooled, or returned after the pool closed.
    pub discards: u64,
    /// Buffers allocated by [`Pool::warm_up`].
    pub preallocated: u64,
    /// Bytes the pool holds for reuse (shared lists and thread caches).
    pub bytes_retained: u64,
    /// Bytes handed out by [`Pool::get`] and not yet returned (capacities,
    /// unpooled buffers included).
    pub bytes_outstanding: u64,
}

impl PoolMetrics {
    /// `hits / gets`, or `0.0` before the first get.
    pub fn hit_rate(&self) -> f64 {
        if self.gets == 0 {
            0.0
        } else {
            self.hits as f64 / self.gets as f64
        }
    }
}

// Per-class event counters. Every byte figure in `PoolMetrics` is derived
// from these at snapshot time, so a get or return served by the thread
// cache updates exactly one counter.
/// Gets served from the calling thread's cache.
const GET_LOCAL: usize = 0;
/// Gets served from the shared list.
const GET_SHARED: usize = 1;
/// Gets that allocated.
const GET_MISS: usize = 2;
/// Returns kept in the calling thread's cache.
const RET_LOCAL: usize = 3;
/// Returns kept in the shared list.
const RET_SHARED: usize = 4;
/// Returns freed (over the cap, or the pool closed).
const RET_DISCARD: usize = 5;
/// Buffers moved from a thread cache to the shared list (or freed if the
/// pool had closed): spills from a full cache, and retirement.
const FLUSHED: usize = 6;
/// Buffers moved from the shared list into a thread cache (refills).
const REFILLED: usize = 7;
const NUM_KINDS: usize = 8;

// Scalar counters (unpooled buffers, warm-up).
const UNPOOLED_GETS: usize = 0;
const UNPOOLED_RETURNS: usize = 1;
const UNPOOLED_BYTES_OUT: usize = 2;
const UNPOOLED_BYTES_IN: usize = 3;
const PREALLOCATED: usize = 4;
const NUM_SCALARS: usize = 5;

/// A block of counters. A thread's own block is written only by that thread
/// (relaxed load + store, no read-modify-write); the pool's shared block is
/// written with relaxed `fetch_add`. Aligned so that two threads' blocks
/// never share a cache line.
#[repr(align(128))]
#[derive(Default)]
struct Counters {
    per_class: [[AtomicU64; NUM_CLASSES]; NUM_KINDS],
    scalars: [AtomicU64; NUM_SCALARS],
}

impl Counters {
    fn all(&self) -> impl Iterator<Item = &AtomicU64> {
        self.per_class.iter().flatten().chain(&self.scalars)
    }
}

/// Where the counts of one operation go.
#[derive(Clone, Copy)]
enum Tally<'a> {
    /// The calling thread's own block: plain relaxed load + store.
    Local(&'a Counters),
    /// The pool's shared block: relaxed `fetch_add`.
    Shared(&'a Counters),
}

impl Tally<'_> {
    #[inline]
    fn bump(a: &AtomicU64, n: u64, local: bool) {
        if local {
            a.store(a.load(Relaxed).wrapping_add(n), Relaxed);
        } else {
            a.fetch_add(n, Relaxed);
        }
    }

    /// Counts `n` events of `kind` for class `c`.
    #[inline]
    fn class(self, kind: usize, c: usize, n: u64) {
        match self {
            Tally::Local(b) => Self::bump(&b.per_class[kind][c], n, true),
            Tally::Shared(b) => Self::bump(&b.per_class[kind][c], n, false),
        }
    }

    /// Adds `n` to scalar counter `slot`.
    #[inline]
    fn scalar(self, slot: usize, n: u64) {
        match self {
            Tally::Local(b) => Self::bump(&b.scalars[slot], n, true),
            Tally::Shared(b) => Self::bump(&b.scalars[slot], n, false),
        }
    }
}

// ---------------------------------------------------------------------------
// The pool
// ---------------------------------------------------------------------------

/// The shared state of one pool. Leaked on creation (see the crate docs) so
/// that buffers and thread caches can refer to it as `&'static Inner`.
struct Inner {
    cap: usize,
    depth: usize,
    /// Set when the last `Pool` handle drops. Checked under each list's lock
    /// before pushing, so nothing is added to a shared list after `close`
    /// drained it.
    closed: AtomicBool,
    /// Bytes charged against `cap`: shared-list buffers plus every thread
    /// cache slot charge. Invariant: `budget <= cap`.
    budget: AtomicUsize,
    /// Bytes in the shared lists. Invariant: equals the sum of the lengths
    /// of the buffers in `lists` (updated under the list's lock).
    shared_retained: AtomicUsize,
    /// One free list per class; every buffer in `lists[c]` has length
    /// `CLASS_SIZES[c]`.
    lists: [Mutex<Vec<Box<[u8]>>>; NUM_CLASSES],
    /// Counts of operations made without a thread cache entry, plus the
    /// folded counts of threads that have left.
    shared: Counters,
    /// The counter blocks of threads that have a cache entry for this pool.
    threads: Mutex<Vec<Arc<Counters>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while one of our locks is held except an allocation
    // failure (which aborts), but stay usable if a lock was ever poisoned.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[inline]
fn alloc_buf(size: usize) -> Box<[u8]> {
    // Zeroed so that every byte of a pooled buffer is initialised, which is
    // what lets `PooledBuf` implement `BufMut` without `unsafe` blocks.
    // `alloc_zeroed` is usually `calloc`, cheap for fresh pages.
    vec![0u8; size].into_boxed_slice()
}

impl Inner {
    /// Charges `n` bytes to the budget if that keeps it within the cap.
    fn reserve(&self, n: usize) -> bool {
        self.budget
            .fetch_update(Relaxed, Relaxed, |b| {
                b.checked_add(n).filter(|&after| after <= self.cap)
            })
            .is_ok()
    }

    fn unreserve(&self, n: usize) {
        self.budget.fetch_sub(n, Relaxed);
    }

    /// Puts a returned buffer of class `c` on the shared list if the cap
    /// allows and the pool is open, else frees it and counts a discard.
    #[cold]
    fn put_shared(&self, c: usize, buf: Box<[u8]>, t: Tally<'_>) {
        let size = buf.len();
        if self.reserve(size) {
            let mut list = lock(&self.lists[c]);
            if !self.closed.load(Relaxed) {
                list.push(buf);
                self.shared_retained.fetch_add(size, Relaxed);
                t.class(RET_SHARED, c, 1);
                return;
            }
            drop(list);
            self.unreserve(size);
        }
        t.class(RET_DISCARD, c, 1);
        drop(buf);
    }

    /// Get of class `c` given the calling thread's cache (if any).
    #[inline]
    fn get_class(&self, c: usize, local: Option<&mut LocalClass>, t: Tally<'_>) -> Box<[u8]> {
        match local {
            Some(lc) => match lc.bufs.pop() {
                Some(buf) => {
                    t.class(GET_LOCAL, c, 1);
                    buf
                }
                None => self.get_class_slow(c, Some(lc), t),
            },
            None => self.get_class_slow(c, None, t),
        }
    }

    /// How many buffers move between a thread cache and the shared list in
    /// one lock acquisition (refill on an empty cache, spill from a full
    /// one): half the depth, rounded up.
    #[inline]
    fn batch(&self) -> usize {
        self.depth.div_ceil(2)
    }

    /// Get when the thread cache (if any) is empty: one buffer from the
    /// shared list for the caller plus up to `batch()` more to refill the
    /// cache, under one lock; or an allocation (a miss).
    ///
    /// Either way the cache's empty charged slots give their charges back
    /// (refilled buffers bring their own), so a thread that mostly gets and
    /// rarely returns does not sit on budget it does not use.
    #[cold]
    fn get_class_slow(&self, c: usize, local: Option<&mut LocalClass>, t: Tally<'_>) -> Box<[u8]> {
        let size = CLASS_SIZES[c];
        let mut list = lock(&self.lists[c]);
        let popped = list.pop();
        let mut moved = 0;
        // Charges given back, in buffers of this class.
        let mut released = 0;
        if let Some(lc) = local {
            if popped.is_some() {
                let room = self.depth - lc.bufs.len();
                moved = self.batch().min(room).min(list.len());
                let from = list.len() - moved;
                lc.bufs.extend(list.drain(from..));
            }
            // Empty slots' charges go back; refilled buffers keep theirs,
            // now as slot charges.
            let cached_before = lc.bufs.len() - moved;
            released += lc.charged - cached_before;
            lc.charged = lc.bufs.len();
        }
        let Some(buf) = popped else {
            drop(list);
            if released > 0 {
                self.unreserve(released * size);
            }
            t.class(GET_MISS, c, 1);
            return alloc_buf(size);
        };
        self.shared_retained.fetch_sub((1 + moved) * size, Relaxed);
        drop(list);
        // The caller's buffer leaves the budget too.
        self.unreserve((released + 1) * size);
        t.class(GET_SHARED, c, 1);
        if moved > 0 {
            t.class(REFILLED, c, moved as u64);
        }
        buf
    }

    /// Return of a class-`c` buffer given the calling thread's cache.
    #[inline]
    fn put_class(&self, c: usize, buf: Box<[u8]>, local: Option<&mut LocalClass>, t: Tally<'_>) {
        if let Some(lc) = local {
            if lc.bufs.len() < lc.charged {
                lc.bufs.push(buf);
                t.class(RET_LOCAL, c, 1);
                return;
            }
            self.put_class_slow(c, buf, lc, t);
            return;
        }
        self.put_shared(c, buf, t);
    }

    /// Return when every charged slot of the thread cache is full: charge a
    /// new slot if the depth allows, else spill `batch()` cached buffers to
    /// the shared list under one lock (their charges go with them, and the
    /// emptied slots are charged anew if the cap allows); then cache the
    /// buffer, or failing that put it on the shared list or discard it.
    #[cold]
    fn put_class_slow(&self, c: usize, buf: Box<[u8]>, lc: &mut LocalClass, t: Tally<'_>) {
        let size = buf.len();
        if lc.charged < self.depth {
            if self.reserve(size) {
                lc.charged += 1;
                lc.bufs.push(buf);
                t.class(RET_LOCAL, c, 1);
                return;
            }
        } else if !lc.bufs.is_empty() {
            let k = self.batch().min(lc.bufs.len());
            let recharged = self.reserve(k * size);
            let from = lc.bufs.len() - k;
            let mut list = lock(&self.lists[c]);
            if self.closed.load(Relaxed) {
                drop(list);
                lc.bufs.truncate(from);
                self.unreserve(k * size);
            } else {
                list.extend(lc.bufs.drain(from..));
                self.shared_retained.fetch_add(k * size, Relaxed);
                drop(list);
            }
            t.class(FLUSHED, c, k as u64);
            if !recharged {
                lc.charged -= k;
            }
            if lc.bufs.len() < lc.charged {
                lc.bufs.push(buf);
                t.class(RET_LOCAL, c, 1);
                return;
            }
        }
        self.put_shared(c, buf, t);
    }

    /// Frees the shared lists and refuses further returns.
    fn close(&'static self) {
        self.closed.store(true, Relaxed);
        self.trim();
        // The calling thread's cache for this pool goes now; other threads'
        // go when they prune their table or exit.
        let _ = TABLE.try_with(|t| {
            if let Ok(mut t) = t.try_borrow_mut() {
                t.remove(self);
            }
        });
    }

    fn trim(&self) -> usize {
        let mut freed = 0;
        for list in &self.lists {
            let bufs = std::mem::take(&mut *lock(list));
            let bytes: usize = bufs.iter().map(|b| b.len()).sum();
            self.shared_retained.fetch_sub(bytes, Relaxed);
            self.unreserve(bytes);
            freed += bytes;
        }
        freed
    }
}

/// A handle to a size-class buffer pool. Cloning is cheap (one reference
/// count) and every clone is the same pool.
///
/// Invariants:
/// - every buffer handed out has capacity `CLASS_SIZES[class_for(n)]` for a
///   request of `n <= MAX_CLASS_SIZE` bytes, and exactly `n` above that;
/// - the bytes the pool retains for reuse never exceed
///   [`PoolConfig::max_retained_bytes`];
/// - a buffer returns to the pool it came from, whichever thread drops it.
///
/// See the crate documentation for thread caches, the cap and the pool's
/// lifetime.
#[derive(Clone)]
pub struct Pool {
    inner: &'static Inner,
    _handle: Arc<Handle>,
}

/// Every control block ever created (see "Lifetime of a pool").
static ALL_POOLS: Mutex<Vec<&'static Inner>> = Mutex::new(Vec::new());

/// Closes the pool when the last `Pool` clone drops.
struct Handle(&'static Inner);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("max_retained_bytes", &self.inner.cap)
            .field("thread_cache_depth", &self.inner.depth)
            .field("metrics", &self.metrics())
            .finish()
    }
}

impl Default for Pool {
    /// `Pool::new(PoolConfig::default())`.
    fn default() -> Self {
        Pool::new(PoolConfig::default())
    }
}

impl Pool {
    /// Creates a pool. Leaks a small control block for the life of the
    /// process (see the crate docs): create pools once, not per connection.
    pub fn new(config: PoolConfig) -> Pool {
        let inner: &'static Inner = Box::leak(Box::new(Inner {
            cap: config.max_retained_bytes,
            depth: config.thread_cache_depth.min(MAX_DEPTH),
            closed: AtomicBool::new(false),
            budget: AtomicUsize::new(0),
            shared_retained: AtomicUsize::new(0),
            lists: Default::default(),
            shared: Counters::default(),
            threads: Mutex::new(Vec::new()),
        }));
        // Keep every control block reachable from a static, so leak checkers
        // (Miri, Valgrind's "still reachable") see it as intended.
        lock(&ALL_POOLS).push(inner);
        Pool {
            inner,
            _handle: Arc::new(Handle(inner)),
        }
    }

    /// A process-wide pool with [`PoolConfig::default`], created on first use
    /// and never closed.
    pub fn global() -> &'static Pool {
        static GLOBAL: OnceLock<Pool> = OnceLock::new();
        GLOBAL.get_or_init(Pool::default)
    }

    /// The configuration this pool was created with (depth after clamping).
    pub fn config(&self) -> PoolConfig {
        PoolConfig {
            max_retained_bytes: self.inner.cap,
            thread_cache_depth: self.inner.depth,
        }
    }

    /// An empty buffer with capacity at least `min_capacity`: the smallest
    /// class that fits, or exactly `min_capacity` above [`MAX_CLASS_SIZE`]
    /// (allocated, never pooled, counted as a miss and as unpooled).
    ///
    /// Served from the calling thread's cache, else the shared list, else a
    /// fresh allocation (a miss). Never fails except by allocation failure.
    #[inline]
    pub fn get(&self, min_capacity: usize) -> PooledBuf {
        get_from(self.inner, min_capacity)
    }

    /// Pre-allocates up to `count` buffers of the class that holds `size`
    /// bytes into the shared list, stopping early at the retention cap.
    /// Returns how many were added (0 if `size` is above
    /// [`MAX_CLASS_SIZE`]).
    pub fn warm_up(&self, size: usize, count: usize) -> usize {
        let Some(c) = class_for(size) else {
            return 0;
        };
        let inner = self.inner;
        let class_size = CLASS_SIZES[c];
        let mut added = 0;
        // Room for the later returns too, so a steady state does not grow
        // the list.
        lock(&inner.lists[c]).reserve(count);
        while added < count && inner.reserve(class_size) {
            let buf = alloc_buf(class_size);
            let mut list = lock(&inner.lists[c]);
            if inner.closed.load(Relaxed) {
                drop(list);
                inner.unreserve(class_size);
                break;
            }
            list.push(buf);
            inner.shared_retained.fetch_add(class_size, Relaxed);
            added += 1;
        }
        Tally::Shared(&inner.shared).scalar(PREALLOCATED, added as u64);
        added
    }

    /// Moves the calling thread's cached buffers for this pool to the shared
    /// lists (within the cap), gives back its slot charges and folds its
    /// counters into the pool's. Threads do this by themselves when they
    /// exit; call it when a thread stops using the pool for good.
    pub fn flush_thread_cache(&self) {
        let _ = TABLE.try_with(|t| {
            if let Ok(mut t) = t.try_borrow_mut() {
                t.remove(self.inner);
            }
        });
    }

    /// Frees every buffer in the shared lists (thread caches are left
    /// alone). Returns the bytes freed.
    pub fn trim(&self) -> usize {
        self.inner.trim()
    }

    /// A snapshot of the counters. Exact when no other thread is using the
    /// pool; see [`PoolMetrics`].
    pub fn metrics(&self) -> PoolMetrics {
        let inner = self.inner;
        let mut k = [[0u64; NUM_CLASSES]; NUM_KINDS];
        let mut sc = [0u64; NUM_SCALARS];
        {
            let threads = lock(&inner.threads);
            for block in std::iter::once(&inner.shared).chain(threads.iter().map(|a| &**a)) {
                for (kind, row) in k.iter_mut().zip(&block.per_class) {
                    for (s, v) in kind.iter_mut().zip(row) {
                        *s = s.wrapping_add(v.load(Relaxed));
                    }
                }
                for (s, v) in sc.iter_mut().zip(&block.scalars) {
                    *s = s.wrapping_add(v.load(Relaxed));
                }
            }
        }
        let mut m = PoolMetrics {
            gets: sc[UNPOOLED_GETS],
            misses: sc[UNPOOLED_GETS],
            unpooled: sc[UNPOOLED_GETS],
            returns: sc[UNPOOLED_RETURNS],
            discards: sc[UNPOOLED_RETURNS],
            preallocated: sc[PREALLOCATED],
            ..PoolMetrics::default()
        };
        let mut cached = 0u64;
        let mut out = sc[UNPOOLED_BYTES_OUT].wrapping_sub(sc[UNPOOLED_BYTES_IN]);
        for (c, &size) in CLASS_SIZES.iter().enumerate() {
            let size = size as u64;
            let gets = k[GET_LOCAL][c] + k[GET_SHARED][c] + k[GET_MISS][c];
            let rets = k[RET_LOCAL][c] + k[RET_SHARED][c] + k[RET_DISCARD][c];
            m.gets += gets;
            m.hits += k[GET_LOCAL][c] + k[GET_SHARED][c];
            m.misses += k[GET_MISS][c];
            m.returns += rets;
            m.discards += k[RET_DISCARD][c];
            let in_caches = k[RET_LOCAL][c]
                .wrapping_add(k[REFILLED][c])
                .wrapping_sub(k[GET_LOCAL][c])
                .wrapping_sub(k[FLUSHED][c]);
            cached = cached.wrapping_add(in_caches.wrapping_mul(size));
            out = out.wrapping_add(gets.wrapping_sub(rets).wrapping_mul(size));
        }
        // Both are exact at rest; while threads work, reading the counters
        // one by one can see a transient negative, reported as 0.
        let retained = (inner.shared_retained.load(Relaxed) as u64).wrapping_add(cached);
        m.bytes_retained = (retained as i64).max(0) as u64;
        m.bytes_outstanding = (out as i64).max(0) as u64;
        m
    }
}

// ---------------------------------------------------------------------------
// Thread caches
// ---------------------------------------------------------------------------

/// One thread's cache of one class of one pool.
///
/// Invariant: `bufs.len() <= charged <= depth`, and `charged *
/// CLASS_SIZES[c]` bytes of the pool's budget belong to this slot.
struct LocalClass {
    bufs: Vec<Box<[u8]>>,
    charged: usize,
}

/// One thread's cache for one pool.
struct Entry {
    pool: &'static Inner,
    /// This thread's counter block, also listed in `pool.threads`.
    stats: Arc<Counters>,
    classes: [LocalClass; NUM_CLASSES],
}

impl Entry {
    fn new(pool: &'static Inner) -> Entry {
        let stats = Arc::new(Counters::default());
        lock(&pool.threads).push(stats.clone());
        Entry {
            pool,
            stats,
            classes: std::array::from_fn(|_| LocalClass {
                bufs: Vec::with_capacity(pool.depth),
                charged: 0,
            }),
        }
    }

    /// Hands everything back to the pool: cached buffers to the shared lists
    /// (or freed if the pool closed), charges released, counters folded.
    fn retire(self) {
        let pool = self.pool;
        let t = Tally::Local(&self.stats);
        for (c, lc) in self.classes.into_iter().enumerate() {
            let size = CLASS_SIZES[c];
            let cached = lc.bufs.len();
            // Cached buffers keep their charge as they move to the shared
            // list; empty slots give theirs back.
            pool.unreserve((lc.charged - cached) * size);
            t.class(FLUSHED, c, cached as u64);
            if cached == 0 {
                continue;
            }
            let mut list = lock(&pool.lists[c]);
            if pool.closed.load(Relaxed) {
                drop(list);
                pool.unreserve(cached * size);
                drop(lc.bufs);
            } else {
                list.extend(lc.bufs);
                pool.shared_retained.fetch_add(cached * size, Relaxed);
            }
        }
        let mut threads = lock(&pool.threads);
        for (s, v) in pool.shared.all().zip(self.stats.all()) {
            s.fetch_add(v.load(Relaxed), Relaxed);
        }
        threads.retain(|a| !Arc::ptr_eq(a, &self.stats));
    }
}

/// The calling thread's caches, one entry per pool used on this thread.
struct Table {
    entries: Vec<Entry>,
}

impl Table {
    fn remove(&mut self, pool: &'static Inner) {
        if let Some(i) = self.entries.iter().position(|e| std::ptr::eq(e.pool, pool)) {
            self.entries.swap_remove(i).retire();
        }
    }

    #[cold]
    fn insert(&mut self, pool: &'static Inner) -> Option<usize> {
        // Drop the caches of pools that closed since.
        let mut i = 0;
        while i < self.entries.len() {
            if self.entries[i].pool.closed.load(Relaxed) {
                self.entries.swap_remove(i).retire();
            } else {
                i += 1;
            }
        }
        if self.entries.len() >= MAX_POOLS_PER_THREAD || pool.closed.load(Relaxed) {
            return None;
        }
        self.entries.push(Entry::new(pool));
        Some(self.entries.len() - 1)
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        for e in self.entries.drain(..) {
            e.retire();
        }
    }
}

thread_local! {
    static TABLE: RefCell<Table> = const { RefCell::new(Table { entries: Vec::new() }) };
}

/// Runs `f` on the calling thread's cache entry for `pool`, creating it if
/// needed. `None` if there is no usable entry: the thread is exiting, the
/// table is busy (re-entrancy), it is full, or the pool is closed.
#[inline]
fn with_entry<R>(pool: &'static Inner, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
    TABLE
        .try_with(|t| {
            let mut t = t.try_borrow_mut().ok()?;
            let i = match t.entries.iter().position(|e| std::ptr::eq(e.pool, pool)) {
                Some(i) => i,
                None => t.insert(pool)?,
            };
            Some(f(&mut t.entries[i]))
        })
        .ok()
        .flatten()
}

/// [`Pool::get`] on the pool's shared state (also used to grow a buffer,
/// which has no `Pool` handle; a closed pool still serves gets, and frees
/// the buffers when they return).
#[inline]
fn get_from(inner: &'static Inner, min_capacity: usize) -> PooledBuf {
    let Some(c) = class_for(min_capacity) else {
        return get_unpooled(inner, min_capacity);
    };
    let buf = match with_entry(inner, |e| {
        inner.get_class(c, Some(&mut e.classes[c]), Tally::Local(&e.stats))
    }) {
        Some(buf) => buf,
        None => inner.get_class(c, None, Tally::Shared(&inner.shared)),
    };
    PooledBuf {
        buf,
        len: 0,
        class: c as u8,
        pool: inner,
    }
}

#[cold]
fn get_unpooled(inner: &'static Inner, size: usize) -> PooledBuf {
    let t = Tally::Shared(&inner.shared);
    t.scalar(UNPOOLED_GETS, 1);
    t.scalar(UNPOOLED_BYTES_OUT, size as u64);
    PooledBuf {
        buf: alloc_buf(size),
        len: 0,
        class: UNPOOLED,
        pool: inner,
    }
}

// ---------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------

/// A buffer borrowed from a [`Pool`]: an owned, fixed-capacity byte buffer
/// whose filled part is readable through `Deref<Target = [u8]>`.
///
/// Invariants:
/// - `len() <= capacity()`, always; the capacity is its size class (or the
///   exact size of an unpooled buffer) and never changes, except through
///   [`reserve`](Self::reserve) / [`extend_from_slice`](Self::extend_from_slice),
///   which move the contents into a larger buffer from the same pool;
/// - every byte of the capacity is initialised (fresh buffers are zeroed,
///   reused ones hold stale data), so the unfilled part can be handed out
///   as `&mut [u8]` without `unsafe`;
/// - dropping it, or dropping the last `Bytes` clone made by
///   [`freeze`](Self::freeze), returns the memory to its pool, from any
///   thread.
///
/// As a [`BufMut`] it has a fixed capacity: `remaining_mut()` is
/// `capacity() - len()` and writing past it panics, as with `&mut [u8]`.
pub struct PooledBuf {
    buf: Box<[u8]>,
    len: usize,
    class: u8,
    pool: &'static Inner,
}

impl PooledBuf {
    /// Bytes filled so far.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been filled.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Total bytes the buffer can hold.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Bytes that can still be written without growing
    /// (`capacity() - len()`).
    #[inline]
    pub fn remaining_capacity(&self) -> usize {
        self.buf.len() - self.len
    }

    /// Empties the buffer, keeping its capacity.
    #[inline]
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Shortens the filled part to `len` bytes; no effect if it is already
    /// shorter.
    #[inline]
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// The unfilled part, for a synchronous `read(&mut [u8])`; follow with
    /// [`advance`](Self::advance) by the count read.
    #[inline]
    pub fn unfilled_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.len..]
    }

    /// Marks `cnt` more bytes of the unfilled part as filled.
    ///
    /// # Panics
    /// If `cnt > remaining_capacity()`.
    #[inline]
    pub fn advance(&mut self, cnt: usize) {
        assert!(
            cnt <= self.remaining_capacity(),
            "advance({cnt}) past capacity (len {}, capacity {})",
            self.len,
            self.capacity()
        );
        self.len += cnt;
    }

    /// Makes room for at least `additional` more bytes. If the buffer is too
    /// small, its contents move to a buffer of the fitting class from the
    /// same pool (at least double the capacity, or exact above 64 KiB) and
    /// the old one is returned.
    pub fn reserve(&mut self, additional: usize) {
        if additional <= self.remaining_capacity() {
            return;
        }
        self.grow(additional);
    }

    #[cold]
    fn grow(&mut self, additional: usize) {
        let needed = self
            .len
            .checked_add(additional)
            .expect("PooledBuf capacity overflow");
        let target = if needed <= MAX_CLASS_SIZE {
            needed.max(self.capacity().saturating_mul(2).min(MAX_CLASS_SIZE))
        } else {
            needed.max(self.capacity().saturating_mul(2))
        };
        let mut bigger = get_from(self.pool, target);
        bigger.buf[..self.len].copy_from_slice(&self.buf[..self.len]);
        bigger.len = self.len;
        std::mem::swap(self, &mut bigger);
        // `bigger` now holds the old buffer and returns it on drop.
    }

    /// Appends `src`, growing as [`reserve`](Self::reserve) does if needed.
    #[inline]
    pub fn extend_from_slice(&mut self, src: &[u8]) {
        self.reserve(src.len());
        self.buf[self.len..self.len + src.len()].copy_from_slice(src);
        self.len += src.len();
    }

    /// Turns the filled part into `Bytes` without copying. The memory
    /// returns to the pool when the last clone (or slice) of the `Bytes`
    /// drops, on whatever thread. Costs one small heap allocation (the
    /// `Bytes::from_owner` header) unless the buffer is empty, in which case
    /// the buffer returns at once and an empty `Bytes` is returned.
    pub fn freeze(self) -> Bytes {
        if self.len == 0 {
            return Bytes::new();
        }
        Bytes::from_owner(self)
    }

    /// The size class of this buffer, `None` if it is unpooled.
    pub fn class(&self) -> Option<usize> {
        (self.class != UNPOOLED).then_some(self.class as usize)
    }
}

impl Drop for PooledBuf {
    #[inline]
    fn drop(&mut self) {
        // An empty boxed slice does not allocate.
        let buf = std::mem::take(&mut self.buf);
        let pool = self.pool;
        if self.class == UNPOOLED {
            let t = Tally::Shared(&pool.shared);
            t.scalar(UNPOOLED_RETURNS, 1);
            t.scalar(UNPOOLED_BYTES_IN, buf.len() as u64);
            return;
        }
        if pool.closed.load(Relaxed) {
            Tally::Shared(&pool.shared).class(RET_DISCARD, self.class as usize, 1);
            return;
        }
        let c = self.class as usize;
        let mut buf = Some(buf);
        let done = with_entry(pool, |e| {
            let b = buf.take().expect("buffer present");
            pool.put_class(c, b, Some(&mut e.classes[c]), Tally::Local(&e.stats));
        });
        if done.is_none() {
            if let Some(b) = buf {
                pool.put_class(c, b, None, Tally::Shared(&pool.shared));
            }
        }
    }
}

impl Deref for PooledBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl DerefMut for PooledBuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

impl AsRef<[u8]> for PooledBuf {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for PooledBuf {
    #[inline]
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("class", &self.class())
            .finish()
    }
}

// SAFETY: `BufMut` requires that `chunk_mut` return writable memory of at
// most `remaining_mut()` bytes that stays valid until the next call, and that
// after `advance_mut(cnt)` the first `cnt` bytes of that chunk count as
// filled, which the caller promises it initialised. Here:
// - `len <= buf.len()` always holds: `len` only changes through `clear`,
//   `truncate` (shrinks), `advance`/`advance_mut` (assert the bound),
//   `extend_from_slice` (reserves first) and `grow` (copies `len` bytes into
//   a buffer of at least `len + additional`);
// - `chunk_mut` is `UninitSlice::new(&mut buf[len..])`, a safely obtained
//   `&mut [u8]` of exactly `remaining_mut()` bytes;
// - every byte of `buf` is initialised from allocation on (zeroed, see
//   `alloc_buf`), and `UninitSlice` only lets the writer store `u8` values,
//   so advancing over bytes the caller failed to write exposes stale but
//   initialised bytes, never uninitialised memory.
// There is no `unsafe` block in this crate; this `unsafe impl` is required
// by the trait's declaration.
unsafe impl BufMut for PooledBuf {
    #[inline]
    fn remaining_mut(&self) -> usize {
        self.remaining_capacity()
    }

    #[inline]
    unsafe fn advance_mut(&mut self, cnt: usize) {
        self.advance(cnt);
    }

    #[inline]
    fn chunk_mut(&mut self) -> &mut UninitSlice {
        UninitSlice::new(&mut self.buf[self.len..])
    }

    #[inline]
    fn put_slice(&mut self, src: &[u8]) {
        assert!(
            src.len() <= self.remaining_capacity(),
            "put_slice of {} bytes past capacity (len {}, capacity {})",
            src.len(),
            self.len,
            self.capacity()
        );
        self.buf[self.len..self.len + src.len()].copy_from_slice(src);
        self.len += src.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// The budget (the ground truth behind the cap) never exceeds the cap,
    /// sampled while threads churn, and once every thread cache is flushed
    /// it equals exactly the bytes in the shared lists.
    #[test]
    fn budget_never_exceeds_cap_and_balances_at_rest() {
        const CAP: usize = 200 * 1024;
        let pool = Pool::new(PoolConfig {
            max_retained_bytes: CAP,
            thread_cache_depth: 2,
        });
        let inner = pool.inner;
        let rounds = if cfg!(miri) { 20 } else { 20_000 };
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut samples = 0u64;
                while !stop.load(Relaxed) {
                    assert!(inner.budget.load(Relaxed) <= CAP);
                    samples += 1;
                    std::thread::yield_now();
                }
                samples
            })
        };
        let workers: Vec<_> = (0..2)
            .map(|t| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..rounds {
                        let c = (i * 7 + t) % NUM_CLASSES;
                        held.push(pool.get(CLASS_SIZES[c]));
                        if held.len() > 5 {
                            held.swap_remove(i % 5);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Relaxed);
        assert!(watcher.join().unwrap() > 0);
        pool.flush_thread_cache();
        let shared: usize = inner
            .lists
            .iter()
            .map(|l| lock(l).iter().map(|b| b.len()).sum::<usize>())
            .sum();
        assert_eq!(inner.shared_retained.load(Relaxed), shared);
        assert_eq!(inner.budget.load(Relaxed), shared);
        assert!(shared <= CAP);
        let m = pool.metrics();
        assert_eq!(m.bytes_retained, shared as u64);
        assert_eq!(m.bytes_outstanding, 0);
        assert_eq!(m.gets, m.returns);
    }

    /// One thread gets, another returns (the broker's reader/writer
    /// pattern): buffers flow through refills and spills, the budget stays
    /// within the cap throughout and balances once the caches are flushed.
    #[test]
    fn producer_consumer_balances() {
        // A tight cap: buffers are discarded and re-allocated, and the
        // accounting must still balance.
        let tight = producer_consumer(64 * 1024);
        if !cfg!(miri) {
            assert!(tight.discards > 0, "{tight:?}");
        }
        // A roomy cap: after ramp-up the same buffers circulate.
        let roomy = producer_consumer(1 << 20);
        assert_eq!(roomy.discards, 0, "{roomy:?}");
        assert!(roomy.misses <= 64, "{roomy:?}");
    }

    fn producer_consumer(cap: usize) -> PoolMetrics {
        let pool = Pool::new(PoolConfig {
            max_retained_bytes: cap,
            thread_cache_depth: 4,
        });
        let inner = pool.inner;
        let n = if cfg!(miri) { 40 } else { 50_000 };
        let (tx, rx) = std::sync::mpsc::sync_channel::<PooledBuf>(16);
        let producer = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                for i in 0..n {
                    let mut b = pool.get(if i % 3 == 0 { 2048 } else { 4096 });
                    b.extend_from_slice(&[i as u8; 16]);
                    tx.send(b).unwrap();
                    assert!(inner.budget.load(Relaxed) <= cap);
                }
            })
        };
        let consumer = std::thread::spawn(move || {
            let mut count = 0;
            for b in rx {
                assert_eq!(b.len(), 16);
                let bytes = b.freeze();
                drop(bytes.clone());
                drop(bytes);
                assert!(inner.budget.load(Relaxed) <= cap);
                count += 1;
            }
            count
        });
        producer.join().unwrap();
        assert_eq!(consumer.join().unwrap(), n);
        let shared: usize = inner
            .lists
            .iter()
            .map(|l| lock(l).iter().map(|b| b.len()).sum::<usize>())
            .sum();
        assert_eq!(inner.shared_retained.load(Relaxed), shared);
        assert_eq!(inner.budget.load(Relaxed), shared);
        let m = pool.metrics();
        assert_eq!(m.gets, n as u64);
        assert_eq!(m.returns, n as u64);
        assert_eq!(m.gets, m.hits + m.misses);
        assert_eq!(m.bytes_retained, shared as u64);
        assert_eq!(m.bytes_outstanding, 0);
        assert!(m.bytes_retained <= cap as u64);
        m
    }

    /// Every buffer in a shared list has its class's size.
    #[test]
    fn shared_lists_hold_their_class_only() {
        let pool = Pool::new(PoolConfig {
            max_retained_bytes: 1 << 20,
            thread_cache_depth: 0,
        });
        for n in [1, 3000, 5000, 9000, 17000, 40000, 65536] {
            drop(pool.get(n));
        }
        let mut g = pool.get(1);
        g.extend_from_slice(&[1; 70_000]);
        drop(g);
        for (c, l) in pool.inner.lists.iter().enumerate() {
            assert!(lock(l).iter().all(|b| b.len() == CLASS_SIZES[c]));
        }
    }
}

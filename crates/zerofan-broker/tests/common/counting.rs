//! A counting global allocator for the tests that measure memory: bytes
//! allocated in all (`ALLOCATED`, realloc counted at its new size), bytes
//! live now (`LIVE`) and calls that allocated (`ALLOCATIONS`). Included with `#[path]` by the tests that
//! install it, so the other test binaries keep the system allocator as is.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Counts every allocation of the process (every thread).
pub struct Counting;

/// Bytes allocated since start (a realloc counts its new size).
pub static ALLOCATED: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated and not freed.
pub static LIVE: AtomicI64 = AtomicI64::new(0);
thread_local! {
    /// Allocations and reallocations of this thread since it started (a
    /// const thread local: reading or bumping it allocates nothing).
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Allocations and reallocations the calling thread made so far (other
/// threads of the test harness allocate at times of their own).
#[allow(dead_code)] // only some of the tests that include this count calls
pub fn allocations_here() -> u64 {
    ALLOCATIONS.with(|n| n.get())
}

fn count_call() {
    // A thread being torn down has no slot left: not counted.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; counting is relaxed
// atomic adds and a const thread local, which neither allocate nor unwind.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_call();
        ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_call();
        ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_call();
        ALLOCATED.fetch_add(new_size as u64, Ordering::Relaxed);
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

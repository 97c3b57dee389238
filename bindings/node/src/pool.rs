//! The buffer pool the Node.js clients read into, and its statistics.
//!
//! All clients share one pool unless a client asks for its own with the
//! `poolSize` option. The shared pool is created on first use with the
//! configuration given to `configurePool` (or the default: a 64 MiB
//! retention cap).

use napi_derive::napi;
use std::sync::{Mutex, OnceLock};
use zerofan_pool::{Pool, PoolConfig, PoolMetrics};

static SHARED: OnceLock<Pool> = OnceLock::new();
static PENDING: Mutex<Option<PoolConfig>> = Mutex::new(None);

/// The pool shared by every client without a `poolSize` of its own.
pub fn shared() -> &'static Pool {
    SHARED.get_or_init(|| {
        let config = PENDING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default();
        Pool::new(config)
    })
}

/// A pool of its own, for a client with a `poolSize` option.
pub fn dedicated(max_retained_bytes: usize) -> Pool {
    Pool::new(PoolConfig {
        max_retained_bytes,
        ..PoolConfig::default()
    })
}

/// How to size the shared pool.
#[napi(object)]
pub struct PoolOptions {
    /// Most bytes of free buffers the pool keeps for reuse.
    pub max_retained_bytes: Option<f64>,
    /// Buffers per size class each thread caches (0 to 1024).
    pub thread_cache_depth: Option<u32>,
    /// Pre-allocate this many buffers of `warmUpSize` bytes.
    pub warm_up_count: Option<u32>,
    /// Size of the pre-allocated buffers (default 16 KiB, the read size).
    pub warm_up_size: Option<u32>,
}

/// Configure the shared pool. Must come before the first connection;
/// returns false (and changes nothing) once the pool exists, except that
/// a warm-up is still done.
#[napi]
pub fn configure_pool(options: PoolOptions) -> bool {
    let fresh = SHARED.get().is_none();
    if fresh {
        let mut config = PoolConfig::default();
        if let Some(b) = options.max_retained_bytes {
            config.max_retained_bytes = b.max(0.0) as usize;
        }
        if let Some(d) = options.thread_cache_depth {
            config.thread_cache_depth = d as usize;
        }
        *PENDING.lock().unwrap_or_else(|e| e.into_inner()) = Some(config);
    }
    if let Some(n) = options.warm_up_count {
        let size = options.warm_up_size.unwrap_or(16 * 1024) as usize;
        shared().warm_up(size, n as usize);
    } else {
        shared();
    }
    fresh
}

/// A snapshot of a pool's counters.
#[napi(object)]
pub struct PoolStats {
    /// Buffers asked for.
    pub gets: f64,
    /// Gets served from buffers the pool held.
    pub hits: f64,
    /// Gets that had to allocate.
    pub misses: f64,
    /// Buffers allocated: misses plus warm-up.
    pub allocations: f64,
    /// Buffers that came back (last `Buffer` over them collected).
    pub returns: f64,
    /// Returned buffers freed instead of kept (over the cap).
    pub discards: f64,
    /// hits / gets.
    pub hit_rate: f64,
    /// Bytes handed out and not yet returned.
    pub bytes_outstanding: f64,
    /// Bytes the pool keeps for reuse.
    pub bytes_retained: f64,
    /// The retention cap.
    pub max_retained_bytes: f64,
}

/// Statistics of `pool`.
pub fn stats_of(pool: &Pool) -> PoolStats {
    let m: PoolMetrics = pool.metrics();
    PoolStats {
        gets: m.gets as f64,
        hits: m.hits as f64,
        misses: m.misses as f64,
        allocations: (m.misses + m.preallocated) as f64,
        returns: m.returns as f64,
        discards: m.discards as f64,
        hit_rate: m.hit_rate(),
        bytes_outstanding: m.bytes_outstanding as f64,
        bytes_retained: m.bytes_retained as f64,
        max_retained_bytes: pool.config().max_retained_bytes as f64,
    }
}

/// Statistics of the shared pool.
#[napi]
pub fn get_pool_stats() -> PoolStats {
    stats_of(shared())
}

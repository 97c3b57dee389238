//! Read buffers come from the size-class pool: a connection borrows one only
//! while bytes are waiting, and the memory returns to the pool when the last
//! `Bytes` sliced from it (a packet, a payload in some queue) drops.

use bytes::Bytes;
use zerofan_pool::{Pool, PoolConfig, PooledBuf};

/// Smallest read buffer (the smallest pool class): most packets are small,
/// and a thousand idle-ish connections must not each touch 16 KiB.
pub(super) const READ_MIN: usize = 2 * 1024;
/// Largest read buffer a busy connection grows to (the largest pool class).
pub(super) const READ_MAX: usize = 64 * 1024;

/// A connection's read buffer.
pub(super) type ReadBuf = PooledBuf;

/// Where read buffers come from.
#[derive(Debug)]
pub struct Buffers {
    pool: Pool,
}

impl Buffers {
    /// A fresh pool for one broker, keeping at most `max_retained` free bytes.
    pub fn new(max_retained: usize) -> Self {
        Buffers {
            pool: Pool::new(PoolConfig {
                max_retained_bytes: max_retained,
                ..PoolConfig::default()
            }),
        }
    }

    /// An empty buffer with room for at least `min` bytes.
    pub fn get(&self, min: usize) -> ReadBuf {
        self.pool.get(min)
    }

    /// Free space left in `buf`.
    pub fn spare(buf: &ReadBuf) -> usize {
        buf.remaining_capacity()
    }

    /// Turn a filled buffer into shared bytes that packets are sliced from.
    pub fn freeze(buf: ReadBuf) -> Bytes {
        buf.freeze()
    }

    /// Pool figures for `$SYS/`.
    pub fn stats(&self, stats: &mut crate::core::ShellStats) {
        let m = self.pool.metrics();
        stats.pool_gets = m.gets;
        stats.pool_hits = m.hits;
        stats.pool_misses = m.misses;
        stats.pool_returns = m.returns;
        stats.pool_discards = m.discards;
        stats.pool_bytes_retained = m.bytes_retained;
        stats.pool_bytes_outstanding = m.bytes_outstanding;
        stats.pool_hit_rate = m.hit_rate();
    }
}

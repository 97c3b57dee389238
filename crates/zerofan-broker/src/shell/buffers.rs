//! Read buffers. One function to get a buffer, so the pool can replace the
//! plain allocation without touching the reader.

use bytes::{Bytes, BytesMut};

/// Default size of a fresh read buffer.
pub const READ_SIZE: usize = 16 * 1024;

/// A connection's read buffer.
pub type ReadBuf = BytesMut;

/// Where read buffers come from.
#[derive(Debug, Default)]
pub struct Buffers {}

impl Buffers {
    /// A buffers source.
    pub fn new() -> Self {
        Buffers {}
    }

    /// An empty buffer with room for at least `min` bytes.
    pub fn get(&self, min: usize) -> ReadBuf {
        BytesMut::with_capacity(min)
    }

    /// Free space left in `buf`.
    pub fn spare(buf: &ReadBuf) -> usize {
        buf.capacity() - buf.len()
    }

    /// Turn a filled buffer into shared bytes that packets are sliced from.
    pub fn freeze(buf: ReadBuf) -> Bytes {
        buf.freeze()
    }

    /// Pool figures for `$SYS/` (zero until the pool is in use).
    pub fn stats(&self, stats: &mut crate::core::ShellStats) {
        let _ = stats;
    }
}

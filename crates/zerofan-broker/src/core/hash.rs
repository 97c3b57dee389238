//! The core's hash tables: std's maps with foldhash instead of SipHash.
//!
//! Every PUBLISH looks up its connection, its session and each topic level
//! in the trie; with SipHash those lookups were about 16% of the broker's
//! CPU under fan-in. foldhash is several times faster on short keys and is
//! still seeded per process, so clients cannot precompute colliding topics.

use std::hash::BuildHasher;
use std::sync::OnceLock;

/// A `HashMap` hashed with foldhash.
pub(super) type HashMap<K, V> = std::collections::HashMap<K, V, Seeded>;

/// A `HashSet` hashed with foldhash.
pub(super) type HashSet<K> = std::collections::HashSet<K, Seeded>;

/// foldhash seeded once per process. Zero-sized, unlike
/// `foldhash::fast::RandomState` (8 bytes in every map): each connection and
/// session holds several maps, and an idle connection's memory is counted.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Seeded;

impl BuildHasher for Seeded {
    type Hasher = foldhash::fast::FoldHasher<'static>;

    fn build_hasher(&self) -> Self::Hasher {
        static STATE: OnceLock<foldhash::fast::FixedState> = OnceLock::new();
        STATE
            .get_or_init(|| {
                // std's RandomState draws its keys from the OS.
                let seed = std::hash::RandomState::new().hash_one(0x7a65_726f_6661_6e00_u64);
                foldhash::fast::FixedState::with_seed(seed)
            })
            .build_hasher()
    }
}

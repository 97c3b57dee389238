//! The hasher of the store's index and of the broker's core: foldhash,
//! seeded once per process, instead of std's SipHash.
//!
//! Every operation looks up its session by client id and its entry or
//! packet id; with SipHash those lookups were a few per cent of a replica's
//! CPU. foldhash is several times faster on short keys and is still seeded
//! per process, so clients cannot precompute colliding ids or topics.

use std::hash::BuildHasher;
use std::sync::OnceLock;

/// foldhash seeded once per process. Zero-sized, unlike
/// `foldhash::fast::RandomState` (8 bytes in every map): each connection and
/// session holds several maps, and an idle connection's memory is counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seeded;

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

/// A `HashMap` hashed with [`Seeded`].
pub type HashMap<K, V> = std::collections::HashMap<K, V, Seeded>;

/// A `HashSet` hashed with [`Seeded`].
pub type HashSet<K> = std::collections::HashSet<K, Seeded>;

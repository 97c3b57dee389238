//! The core's hash tables: std's maps with foldhash instead of SipHash.
//!
//! Every PUBLISH looks up its connection, its session and each topic level
//! in the trie; with SipHash those lookups were about 16% of the broker's
//! CPU under fan-in. foldhash is several times faster on short keys and is
//! still seeded per process, so clients cannot precompute colliding topics.

/// A `HashMap` hashed with foldhash.
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A `HashSet` hashed with foldhash.
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

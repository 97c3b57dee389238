//! The core's hash tables: std's maps with foldhash instead of SipHash
//! (`zerofan_store::hash` says why).
//!
//! Every PUBLISH looks up its connection, its session and each topic level
//! in the trie; with SipHash those lookups were about 16% of the broker's
//! CPU under fan-in.

pub(crate) use zerofan_store::hash::{HashMap, HashSet, Seeded};

//! The thin tokio shell: listeners, one task per connection, a timer task,
//! signals. Runs on one thread (`current_thread` runtime with a
//! `LocalSet`); the core lives in an `Rc<RefCell<_>>`, so the publish path
//! takes no lock.

pub mod api;
#[cfg(test)]
mod bridge_tests;
mod bridges;
mod buffers;
mod claims;
mod conn;
mod drain;
pub mod http;
mod http_auth;
mod limits;
mod linger;
pub mod links;
pub mod listener;
mod local_conn;
pub mod movable;
pub mod ops;
mod park;
pub mod persist;
pub mod prometheus;
pub mod proxy;
mod reader;
pub mod reload;
mod server;
mod shards;
mod spin;
mod state;
pub mod webhook;
mod writer;
pub mod ws;

pub use server::{run_until_signal, run_until_signal_with, Server, SnapshotFn};
pub use writer::write_chunks;

//! The thin tokio shell: listeners, one task per connection, a timer task,
//! signals. Runs on one thread (`current_thread` runtime with a
//! `LocalSet`); the core lives in an `Rc<RefCell<_>>`, so the publish path
//! takes no lock.

mod bridges;
mod buffers;
mod conn;
pub mod http;
pub mod listener;
pub mod ops;
mod park;
pub mod persist;
pub mod prometheus;
pub mod proxy;
mod reader;
pub mod reload;
mod server;
mod spin;
mod state;
mod writer;
pub mod ws;

pub use server::{run_until_signal, run_until_signal_with, Server, SnapshotFn};
pub use writer::write_chunks;

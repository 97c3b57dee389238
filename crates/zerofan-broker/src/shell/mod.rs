//! The thin tokio shell: listeners, one reader and one writer task per
//! connection, a timer task, signals. Runs on one thread (`current_thread`
//! runtime with a `LocalSet`); the core lives in an `Rc<RefCell<_>>`, so the
//! publish path takes no lock.

mod buffers;
pub mod persist;
pub mod listener;
pub mod proxy;
mod reader;
mod server;
mod state;
pub mod ws;
mod writer;

pub use server::{run_until_signal, Server};
pub use writer::write_chunks;

//! The thin tokio shell: listeners, one reader and one writer task per
//! connection, a timer task, signals. Runs on one thread (`current_thread`
//! runtime with a `LocalSet`); the core lives in an `Rc<RefCell<_>>`, so the
//! publish path takes no lock.

mod buffers;
mod reader;
mod server;
mod state;
mod writer;

pub use server::{run_until_signal, Server};
pub use writer::write_chunks;

//! What the shell's tasks share on their one thread: the core behind a
//! `RefCell` (never borrowed across an await), each connection's waker and
//! the encoder every connection borrows for one batch.

use super::buffers::Buffers;
use crate::core::{Broker, ConnId};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::task::Waker;

/// How the core's wake-ups reach a connection's task: its waker, kept in
/// `Shared::conns` itself (no allocation of its own). The task looks at
/// the core on every wake (output, closing), so no other state is needed.
#[derive(Debug, Default)]
pub struct ConnHandle {
    /// The task's waker, from its last poll.
    pub waker: Option<Waker>,
}

/// Shared by every task of one broker.
pub struct Shared {
    /// The sans-IO core.
    pub broker: RefCell<Broker>,
    /// Live connections.
    pub conns: RefCell<HashMap<ConnId, ConnHandle>>,
    /// The connection whose task is running: `dispatch` does not wake it,
    /// since it looks at its output before it next waits anyway.
    pub current: Cell<Option<ConnId>>,
    /// A connection's task ran since the busy poller last looked.
    pub activity: Cell<bool>,
    /// The busy poller's waker while it sleeps (see `spin.rs`).
    pub spinner: Cell<Option<std::task::Waker>>,
    /// Batch, scratch and chunk space, borrowed by one connection at a time.
    pub encoder: RefCell<super::writer::Encoder>,
    /// Read buffers.
    pub buffers: Buffers,
    /// Bytes read from sockets.
    pub bytes_in: Cell<u64>,
    /// Bytes written to sockets.
    pub bytes_out: Cell<u64>,
    /// Readiness, per-listener figures, reload counts (`/metrics`).
    pub ops: super::ops::Ops,
    wake_scratch: RefCell<Vec<ConnId>>,
}

impl Shared {
    /// Wrap a broker.
    pub fn new(broker: Broker) -> Self {
        let buffers = Buffers::new(broker.config().pool_max_retained_bytes);
        Shared {
            broker: RefCell::new(broker),
            conns: RefCell::new(HashMap::new()),
            current: Cell::new(None),
            activity: Cell::new(false),
            spinner: Cell::new(None),
            encoder: RefCell::default(),
            buffers,
            bytes_in: Cell::new(0),
            bytes_out: Cell::new(0),
            ops: super::ops::Ops::default(),
            wake_scratch: RefCell::new(Vec::new()),
        }
    }

    /// Wake the task of every connection the core touched (new output, or
    /// closing) since the last call.
    pub fn dispatch(&self) {
        let mut ids = std::mem::take(&mut *self.wake_scratch.borrow_mut());
        self.broker.borrow_mut().take_wakeups(&mut ids);
        if ids.is_empty() {
            *self.wake_scratch.borrow_mut() = ids;
            return;
        }
        {
            let conns = self.conns.borrow();
            let current = self.current.get();
            for id in ids.drain(..) {
                if Some(id) == current {
                    continue;
                }
                if let Some(w) = conns.get(&id).and_then(|h| h.waker.as_ref()) {
                    w.wake_by_ref();
                }
            }
        }
        *self.wake_scratch.borrow_mut() = ids;
    }
}

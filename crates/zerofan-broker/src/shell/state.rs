//! What the shell's tasks share on their one thread: the core behind a
//! `RefCell` (never borrowed across an await) and each connection's wake-up
//! handles.

use super::buffers::Buffers;
use crate::core::{Broker, ConnId};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use tokio::sync::Notify;

/// Per-connection signals from the core to the connection's tasks.
#[derive(Debug, Default)]
pub struct ConnHandle {
    /// The writer has work (or must close).
    pub write: Notify,
    /// The core decided to close the connection: the reader stops.
    pub close: Notify,
    /// The writer finished a write: a reader held back by a full outbox may go on.
    pub drained: Notify,
}

/// Shared by every task of one broker.
pub struct Shared {
    /// The sans-IO core.
    pub broker: RefCell<Broker>,
    /// Live connections.
    pub conns: RefCell<HashMap<ConnId, Rc<ConnHandle>>>,
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
            buffers,
            bytes_in: Cell::new(0),
            bytes_out: Cell::new(0),
            ops: super::ops::Ops::default(),
            wake_scratch: RefCell::new(Vec::new()),
        }
    }

    /// Wake the writers (and, for closing connections, the readers) of
    /// every connection the core touched since the last call.
    pub fn dispatch(&self) {
        let mut ids = std::mem::take(&mut *self.wake_scratch.borrow_mut());
        self.broker.borrow_mut().take_wakeups(&mut ids);
        if ids.is_empty() {
            *self.wake_scratch.borrow_mut() = ids;
            return;
        }
        {
            let broker = self.broker.borrow();
            let conns = self.conns.borrow();
            for id in ids.drain(..) {
                if let Some(h) = conns.get(&id) {
                    h.write.notify_one();
                    if broker.is_closing(id) {
                        h.close.notify_one();
                    }
                }
            }
        }
        *self.wake_scratch.borrow_mut() = ids;
    }
}

//! Parked connections: a quiet plain-TCP connection gives its socket to one
//! poller shared by every parked connection (an epoll set of our own, via
//! mio) and its task ends. While parked it holds neither a task (256 bytes)
//! nor tokio's per-socket registration (256 bytes), about half of what an
//! idle connection costs; its state stays in the core, and the socket in
//! its `ConnHandle`.
//!
//! Its next byte (or the peer's close), or anything the core has for it (a
//! delivery, a keep-alive expiry, shutdown), starts a fresh task over the
//! same socket. When to park is the connection task's decision (`conn.rs`):
//! at once when it is quiet right after its CONNACK (the usual device, which
//! connects and then publishes now and then), otherwise after
//! `park_after_ms` without traffic, which the timer task's sweep (`sweep`)
//! notices.

use super::conn;
use super::reader::ReadState;
use super::state::{ConnHandle, Shared};
use crate::core::ConnId;
use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;

/// Readiness events taken from the poller per system call.
const EVENTS: usize = 256;

/// The parking lot: the poller's registry, and the connections the core
/// woke while parked, waiting for the lot's task to start them.
pub struct Lot {
    /// Registers and deregisters parked sockets (a handle to the poller the
    /// lot's task owns). `None` when parking is off or the poller could not
    /// be created.
    registry: Option<mio::Registry>,
    /// Parked connections the core has output for.
    wanted: RefCell<Vec<ConnId>>,
    /// The lot task's waker while it waits.
    waker: Cell<Option<Waker>>,
    /// Connections parked now.
    parked: Cell<u64>,
    /// Parks since start.
    parks: Cell<u64>,
    /// The lot's task stopped on an error: nothing parks any more.
    broken: Cell<bool>,
    /// Quiet time after which a running connection is asked to park.
    after: Duration,
    /// When the sweep last ran.
    last_sweep: Cell<Option<Instant>>,
    /// The time between sweeps.
    every: Cell<Duration>,
}

impl Lot {
    /// A lot for `after` (zero: parking off), and the poller its task runs.
    pub fn new(after: Duration) -> (Lot, Option<mio::Poll>) {
        let poll = if after.is_zero() {
            None
        } else {
            match mio::Poll::new() {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(error = %e, "no poller for parked connections: parking is off");
                    None
                }
            }
        };
        let registry = poll.as_ref().and_then(|p| p.registry().try_clone().ok());
        let poll = if registry.is_some() { poll } else { None };
        let lot = Lot {
            registry,
            wanted: RefCell::new(Vec::new()),
            waker: Cell::new(None),
            parked: Cell::new(0),
            parks: Cell::new(0),
            broken: Cell::new(false),
            after,
            last_sweep: Cell::new(None),
            every: Cell::new(Duration::from_millis(250)),
        };
        (lot, poll)
    }

    /// Sweeps in the lot's `after`: how long a connection is quiet before
    /// the sweep parks it, and parked before it resumes with a quick park.
    fn due(&self) -> u8 {
        (self.after.as_millis() / self.every.get().as_millis().max(1)).clamp(1, 255) as u8
    }

    /// Whether connections may park.
    pub fn enabled(&self) -> bool {
        self.registry.is_some() && !self.broken.get()
    }

    /// Connections parked now, and parks since start.
    pub fn figures(&self) -> (u64, u64) {
        (self.parked.get(), self.parks.get())
    }

    /// Watch `stream` for connection `id`. On success the caller
    /// deregisters it from tokio and keeps it in the connection's handle.
    pub fn register(&self, id: ConnId, stream: &impl AsRawFd) -> io::Result<()> {
        let Some(r) = &self.registry else {
            return Err(io::ErrorKind::Unsupported.into());
        };
        let fd = stream.as_raw_fd();
        r.register(
            &mut mio::unix::SourceFd(&fd),
            mio::Token(id.raw() as usize),
            mio::Interest::READABLE,
        )
    }

    /// Count a parked connection (after `register` and the handover).
    pub fn parked_one(&self) {
        self.parked.set(self.parked.get() + 1);
        self.parks.set(self.parks.get() + 1);
    }

    /// The core has output for parked connection `id`: have the lot's task
    /// start it (not here: `dispatch` runs inside other tasks' borrows).
    pub fn want(&self, id: ConnId) {
        self.wanted.borrow_mut().push(id);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// Start connection `id` again, if it is parked: its socket leaves the
/// lot's poller and gets a task of its own. `readable`: the lot saw input;
/// it is read and handed to the core here, in the lot's turn, in the order
/// the sockets turned readable. The new task would read it a turn later,
/// once the runtime reports the socket readable to its fresh registration:
/// after input that reached other connections later.
fn unpark(shared: &Rc<Shared>, id: ConnId, readable: bool) {
    let parked = shared
        .conns
        .borrow_mut()
        .get_mut(&id)
        .and_then(|h| Some((h.parked.take()?, h.listener, h.parked_for())));
    let Some((stream, listener, (fresh, sweeps))) = parked else {
        return;
    };
    let lot = &shared.lot;
    // Parked for as long as a running connection waits to park: a device
    // that pings or gets a message now and then. It parks again as soon
    // as that exchange is over, rather than hold a task and a registration
    // (512 bytes) until the sweep; a connection that talks more often
    // waits for the sweep as before, so that it is not parked and resumed
    // for every packet.
    let fresh = if sweeps >= lot.due().min(63) {
        fresh.max(1)
    } else {
        fresh
    };
    lot.parked.set(lot.parked.get().saturating_sub(1));
    if let Some(r) = &lot.registry {
        // Failing means it is not registered any more: nothing to undo.
        let _ = r.deregister(&mut mio::unix::SourceFd(&stream.as_raw_fd()));
    }
    let mut input = ReadState::default();
    if readable {
        match input.read_now(shared, &stream) {
            Ok(n) if n > 0 => {
                // A close decided here is seen by the task's first poll.
                let _ = input.feed(shared, id);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // EOF or a socket error: the connection is over.
            _ => {
                drop(stream);
                return conn::resumed_lost(shared, id, listener);
            }
        }
    }
    match tokio::net::TcpStream::from_std(stream) {
        Ok(stream) => {
            let task = conn::resume(shared.clone(), id, stream, listener, input, fresh);
            tokio::task::spawn_local(task);
        }
        Err(e) => {
            // Out of memory for a registration, say: the socket is closed,
            // and the core hears of it like any lost connection.
            tracing::debug!(error = %e, "a parked connection could not resume");
            conn::resumed_lost(shared, id, listener);
        }
    }
}

/// The lot's task: starts parked connections whose socket turns readable
/// or that the core woke. Owns the poller; runs until aborted.
pub(super) async fn lot_loop(shared: Rc<Shared>, poll: mio::Poll) {
    // Deprecated because a `T` whose `as_raw_fd` changes (or whose fd is
    // closed behind tokio's back) would break tokio's registration; the
    // safe alternatives are `unsafe fn`s, which this crate forbids. A
    // `mio::Poll` owns its epoll fd for its whole life and only `poll` is
    // called on it here, so the fd stays the one registered.
    #[allow(deprecated)]
    let mut fd = match AsyncFd::with_interest(poll, tokio::io::Interest::READABLE) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the poller of parked connections");
            return give_up(&shared);
        }
    };
    let mut events = mio::Events::with_capacity(EVENTS);
    // With whether the socket turned readable (else the core woke it).
    let mut ids: Vec<(ConnId, bool)> = Vec::new();
    std::future::poll_fn(|cx| loop {
        // Only a `Pending` from the poller's readiness leaves our waker with
        // the runtime: after a poll that found nothing (the rest of a full
        // batch taken already, events of sockets since resumed), the loop
        // asks again rather than wait, or it would never hear of the poller
        // again until the core happened to want a parked connection.
        let mut listening = false;
        match fd.poll_read_ready_mut(cx) {
            Poll::Ready(Ok(mut guard)) => {
                events.clear();
                let r = guard
                    .get_inner_mut()
                    .poll(&mut events, Some(Duration::ZERO));
                if r.is_err() || events.iter().count() < EVENTS {
                    // Drained: wait for the next edge (tokio keeps the
                    // readiness if one arrived since this guard).
                    guard.clear_ready();
                }
                ids.extend(
                    events
                        .iter()
                        .filter_map(|e| ConnId::from_raw(e.token().0 as u64))
                        .map(|id| (id, true)),
                );
            }
            Poll::Ready(Err(e)) => {
                tracing::warn!(error = %e, "the poller of parked connections failed");
                give_up(&shared);
                return Poll::Ready(());
            }
            Poll::Pending => listening = true,
        }
        ids.extend(
            shared
                .lot
                .wanted
                .borrow_mut()
                .drain(..)
                .map(|id| (id, false)),
        );
        if ids.is_empty() {
            if !listening {
                continue;
            }
            shared.lot.waker.set(Some(cx.waker().clone()));
            return Poll::Pending;
        }
        for (id, readable) in ids.drain(..) {
            unpark(&shared, id, readable);
        }
    })
    .await;
}

/// The lot cannot watch its sockets any more: stop parking and give every
/// parked connection its task back, so that none is left unheard.
fn give_up(shared: &Rc<Shared>) {
    shared.lot.broken.set(true);
    let parked: Vec<ConnId> = shared
        .conns
        .borrow()
        .iter()
        .filter(|(_, h)| h.parked.is_some())
        .map(|(id, _)| id)
        .collect();
    for id in parked {
        unpark(shared, id, false);
    }
}

/// Called by the timer task: ask every running plain-TCP connection that
/// has been quiet for the lot's `after` to park. Quiet is counted in
/// sweeps; a connection's task resets it whenever it runs.
pub(super) fn sweep(shared: &Shared, now: Instant, every: Duration) {
    let lot = &shared.lot;
    if !lot.enabled() {
        return;
    }
    if lot.last_sweep.get().is_some_and(|t| now < t + every) {
        return;
    }
    lot.last_sweep.set(Some(now));
    lot.every.set(every);
    let due = lot.due();
    for h in shared.conns.borrow_mut().values_mut() {
        if h.parked.is_some() {
            h.swept_parked();
            continue;
        }
        if h.listener == ConnHandle::NEVER_PARKS {
            continue;
        }
        h.quiet = h.quiet.saturating_add(1);
        if h.quiet >= due && !h.park {
            h.park = true;
            if let Some(w) = &h.waker {
                w.wake_by_ref();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::core::Broker;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    /// The test's connection `n` (from 0; ids start at 1).
    fn conn_id(n: u64) -> ConnId {
        ConnId::from_raw(n + 1).unwrap()
    }

    /// A connection parked under `id`: the broker's end of a loopback pair
    /// in the lot, and the client's end.
    fn park_one(shared: &Shared, l: &TcpListener, id: u64) -> TcpStream {
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (ours, _) = l.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        shared.lot.register(conn_id(id), &ours).unwrap();
        let handle = ConnHandle {
            parked: Some(ours),
            ..ConnHandle::default()
        };
        shared.conns.borrow_mut().insert_at(conn_id(id), handle);
        shared.lot.parked_one();
        client
    }

    fn is_parked(shared: &Shared, id: u64) -> bool {
        shared
            .conns
            .borrow()
            .get(&conn_id(id))
            .is_some_and(|h| h.parked.is_some())
    }

    /// Let the runtime run (the lot, the tasks it starts) until `done`, for
    /// at most 5 s.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let end = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[test]
    fn the_lot_still_hears_its_sockets_after_a_poll_that_finds_nothing() {
        // A storm's shape: a whole batch of parked sockets turns readable at
        // once, so the lot takes `EVENTS` of them and polls again, finding
        // none. That empty poll must leave the lot listening for the next
        // socket, not deaf until the core happens to wake a parked
        // connection (clients stuck after CONNACK, sockets in CLOSE_WAIT).
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async {
            let broker = Broker::new(Config::default(), Instant::now());
            let (shared, poll) = Shared::new(broker);
            let shared = Rc::new(shared);
            let poll = poll.expect("parking is on by default");
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let last = EVENTS as u64;
            let mut clients: Vec<TcpStream> =
                (0..=last).map(|id| park_one(&shared, &l, id)).collect();
            let lot = tokio::task::spawn_local(lot_loop(shared.clone(), poll));
            tokio::task::yield_now().await;
            // PINGREQ from exactly one batch of them.
            for c in &mut clients[..EVENTS] {
                c.write_all(&[0xC0, 0]).unwrap();
            }
            until("the batch to resume", || {
                (0..last).all(|id| !is_parked(&shared, id))
            })
            .await;
            assert!(is_parked(&shared, last));
            clients[EVENTS].write_all(&[0xC0, 0]).unwrap();
            until("the last one to resume", || !is_parked(&shared, last)).await;
            lot.abort();
        });
    }
}

//! One connection, one task: a hand-written poll loop over socket readiness
//! and the core's wake-ups, so an idle connection costs one small task and
//! no buffers, and a reply to what was just read is written in the same
//! turn, without a hop through the scheduler.
//!
//! Each poll first writes: what the socket did not take last time, then
//! batches from the core, encoded with the thread's shared encoder (only
//! what the socket refuses is kept by the connection). Then it reads, unless
//! the core's outbox for this connection is over `OUTBOX_HIGH` (a client
//! that does not read its acknowledgements is not read either), the core
//! holds it because a subscriber it feeds is behind (push-back), or the
//! connection is closing, and loops back to writing.
//!
//! A quiet plain-TCP connection parks (see `park.rs`): its socket goes to
//! the parking lot and the task ends; `resume` starts a new one.

use super::listener::Transport;
use super::ops::ListenerGuard;
use super::reader::{ReadState, OUTBOX_HIGH};
use super::server::FLUSH_GRACE;
use super::state::{ConnHandle, Shared};
use super::writer::poll_write_chunks;
use crate::core::{ConnId, ConnectionMeta, Transmit};
use bytes::Bytes;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Instant;
use tokio::io::AsyncWrite;
use tokio::time::Sleep;

/// Reads handled per poll before the task lets the others run.
const READS_PER_POLL: u32 = 16;
/// Batches written per poll before the task lets the others run.
const BATCHES_PER_POLL: u32 = 16;
/// A new plain-TCP connection parks as soon as it is quiet after its
/// CONNACK and again after the exchange that follows (a device's
/// SUBSCRIBE), not `park_after_ms` later: in a storm a second's worth of
/// connections would otherwise hold tasks, whose memory the allocator
/// keeps. Later wakes wait for the sweep, so a client that keeps talking
/// is not parked and resumed for every packet, unless it had been parked
/// for the sweep's whole wait (see `park::unpark`).
const QUICK_PARKS: u8 = 2;
// A parked handle keeps the quick parks left in two bits (`ConnHandle::quiet`).
const _: () = assert!(QUICK_PARKS <= 3);

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Reading and writing.
    Open,
    /// The core closes it: no more reading; write what the core still has.
    Closing,
    /// The core's output is all written: shut the stream down, then end.
    ShuttingDown,
    /// The peer is gone and the core told: finish the pending write, end.
    Lost,
}

/// One connection, set up (TLS, WebSocket, PROXY) by the listener: the
/// future runs it until it ends. A plain struct rather than an `async fn`,
/// whose state would keep the arguments beside the connection for its
/// whole life.
pub(super) fn connection(
    shared: Rc<Shared>,
    transport: Transport,
    peer: SocketAddr,
    meta: ConnectionMeta,
) -> Conn {
    let meta = super::limits::admit(&shared, peer, meta);
    let counted = super::ops::Ops::track(&shared, meta.listener);
    let id = shared
        .broker
        .borrow_mut()
        .connection_opened_with(Instant::now(), peer, meta);
    let tcp = matches!(transport, Transport::Tcp(_));
    let handle = ConnHandle {
        listener: if tcp { 0 } else { ConnHandle::NEVER_PARKS },
        ..ConnHandle::default()
    };
    shared.conns.borrow_mut().insert_at(id, handle);
    Conn {
        counted,
        id,
        io: transport,
        input: ReadState::default(),
        out: None,
        unflushed: false,
        phase: Phase::Open,
        grace: None,
        fresh: if tcp { QUICK_PARKS } else { 0 },
        park: false,
    }
}

/// A parked connection's new task, over its socket back from the lot, and
/// what the lot already read from it (a partial packet, held input).
pub(super) fn resume(
    shared: Rc<Shared>,
    id: ConnId,
    stream: tokio::net::TcpStream,
    listener: u16,
    input: ReadState,
    fresh: u8,
) -> Conn {
    Conn {
        counted: ListenerGuard::resume(&shared, listener),
        id,
        io: Transport::Tcp(stream),
        input,
        out: None,
        unflushed: false,
        phase: Phase::Open,
        grace: None,
        fresh,
        park: false,
    }
}

/// A connection moved in from another shard: it goes on here, its CONNECT
/// first.
pub(super) fn moved_in(shared: &Rc<Shared>, h: super::shards::Handoff) {
    let transport = match h.stream {
        super::shards::Moving::Tcp(s) => tokio::net::TcpStream::from_std(s).map(Transport::Tcp),
        super::shards::Moving::Stack(mut s) => match s.socket().map(|k| k.attach()) {
            Some(Ok(())) => Ok(Transport::Boxed(s)),
            Some(Err(e)) => Err(e),
            None => Err(io::ErrorKind::Unsupported.into()),
        },
    };
    let transport = match transport {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(error = %e, "a connection moving between shards was lost");
            return;
        }
    };
    let meta = ConnectionMeta {
        listener: h.listener,
        identity: h.identity,
        admission: crate::core::Admission::Admitted,
    };
    let mut conn = connection(shared.clone(), transport, h.peer, meta);
    conn.input = ReadState::moved_in(shared, &h.input);
    tokio::task::spawn_local(conn);
    // Counted here now: the count it held on the way ends.
    drop(h.transit);
}

/// A parked connection that could not get a task again: it is over.
pub(super) fn resumed_lost(shared: &Rc<Shared>, id: ConnId, listener: u16) {
    shared.conns.borrow_mut().remove(&id);
    drop(ListenerGuard::resume(shared, listener));
    shared
        .broker
        .borrow_mut()
        .connection_lost(Instant::now(), id);
    shared.dispatch();
}

/// The state of one connection's task (kept small: every idle connection
/// holds one).
pub(super) struct Conn {
    /// Counts the connection on its listener; also the handle to the broker.
    counted: ListenerGuard,
    id: ConnId,
    io: Transport,
    input: ReadState,
    /// What the socket did not take of the last batch. Boxed on purpose:
    /// it is rare, and inline every idle connection would carry 24 more
    /// bytes of empty queue.
    #[allow(clippy::box_collection)]
    out: Option<Box<VecDeque<Bytes>>>,
    /// A TLS / WebSocket stream was written to and not flushed yet.
    unflushed: bool,
    phase: Phase,
    /// Started when closing begins: a peer that does not read cannot hold
    /// the connection open for longer.
    grace: Option<Pin<Box<Sleep>>>,
    /// Quick parks left: as soon as it is quiet, once connected, it parks
    /// without waiting for the sweep (see `QUICK_PARKS`).
    fresh: u8,
    /// The parking sweep found it quiet: park if this poll finds no traffic.
    park: bool,
}

impl Future for Conn {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let shared = this.counted.shared().clone();
        if let Some(h) = shared.conns.borrow_mut().get_mut(&this.id) {
            h.set_waker(cx.waker());
            h.quiet = 0;
            if std::mem::take(&mut h.park) {
                this.park = true;
            }
        }
        shared.activity.set(true);
        if let Some(w) = shared.spinner.take() {
            w.wake();
        }
        shared.current.set(Some(this.id));
        let r = this.drive(&shared, cx);
        shared.current.set(None);
        r
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Also when the task is aborted: no waker of a finished task stays.
        // A parked connection's handle holds its socket and stays.
        let mut conns = self.counted.shared().conns.borrow_mut();
        if conns.get(&self.id).is_some_and(|h| h.parked.is_none()) {
            conns.remove(&self.id);
        }
    }
}

impl Conn {
    fn drive(&mut self, shared: &Shared, cx: &mut Context<'_>) -> Poll<()> {
        let mut reads = 0;
        let mut wrote = false;
        loop {
            // Output first: a reply to what was just read leaves in this turn.
            let mut drained = false;
            if self
                .poll_output(shared, cx, &mut drained, &mut wrote)
                .is_ready()
            {
                return Poll::Ready(());
            }
            if self.phase == Phase::Open && shared.broker.borrow().is_closing(self.id) {
                self.phase = Phase::Closing;
                continue;
            }
            if self.phase != Phase::Open {
                return self.poll_grace(shared, cx);
            }
            {
                let broker = shared.broker.borrow();
                if broker.outbox_len(self.id) > OUTBOX_HIGH {
                    // The output is blocked on the socket, which wakes us.
                    return Poll::Pending;
                }
                if broker.held(self.id) {
                    // A subscriber this client feeds is behind (push-back):
                    // the core wakes us when it catches up, goes away or is
                    // dropped as slow.
                    return Poll::Pending;
                }
            }
            if reads == READS_PER_POLL {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if self.input.is_held() {
                if shared.broker.borrow().holds_input(self.id) {
                    // Woken when the takeover this CONNECT waits for is over.
                    return Poll::Pending;
                }
                reads += 1;
                if self.input.feed(shared, self.id) {
                    self.phase = Phase::Closing;
                }
                continue;
            }
            let mut read = match &mut self.io {
                Transport::Tcp(s) => self.input.poll_read_tcp(cx, shared, s),
                Transport::Boxed(s) => self.input.poll_read_boxed(cx, shared, s),
                Transport::Parked => return Poll::Ready(()),
            };
            if read.is_pending() && shared.broker.borrow().drain_requested(self.id) {
                match self.read_now(shared) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        // All it had sent is handled: the takeover goes on.
                        shared
                            .broker
                            .borrow_mut()
                            .input_drained(Instant::now(), self.id);
                        shared.dispatch();
                        continue;
                    }
                    r => read = Poll::Ready(r),
                }
            }
            let Poll::Ready(read) = read else {
                let quiet = reads == 0 && !wrote;
                let asked = std::mem::take(&mut self.park);
                if drained && (self.fresh > 0 || (asked && quiet)) && self.may_park(shared) {
                    self.fresh = self.fresh.saturating_sub(1);
                    return self.park(shared);
                }
                return Poll::Pending;
            };
            match read {
                Ok(0) | Err(_) => self.forget(shared),
                Ok(_) => {
                    reads += 1;
                    if self.move_to_owner(shared) {
                        return Poll::Ready(());
                    }
                    if self.input.feed(shared, self.id) {
                        self.phase = Phase::Closing;
                    }
                }
            }
        }
    }

    /// With several shards: a CONNECT for a client id owned by another
    /// shard moves the connection there: plain TCP, or TLS / WebSocket
    /// with their state. True when it moved: this task ends.
    fn move_to_owner(&mut self, shared: &Shared) -> bool {
        let Some(mesh) = shared.mesh.as_ref() else {
            return false;
        };
        let movable = match &mut self.io {
            Transport::Tcp(_) => true,
            Transport::Boxed(s) => s.socket().is_some(),
            Transport::Parked => false,
        };
        if !movable {
            return false;
        }
        if shared.broker.borrow().is_refused(self.id) {
            // Answered here: a refusal touches no session.
            return false;
        }
        let Some(owner) = self
            .input
            .connect_owner(shared, self.id, mesh.me(), mesh.count())
        else {
            return false;
        };
        let identity = shared.broker.borrow().identity(self.id);
        let Some(peer) = shared.broker.borrow_mut().connection_moved(self.id) else {
            return false;
        };
        let input = self.input.take_input();
        let listener = self.counted.index();
        // Counted as accepted where it goes, as the core counts it opened
        // there (`connection_moved` uncounts it here).
        if let Some(l) = shared.ops.listeners.borrow_mut().get_mut(listener) {
            l.opened = l.opened.saturating_sub(1);
        }
        self.phase = Phase::Lost;
        // On failure tokio has closed the socket: the client reconnects.
        let stream = match std::mem::replace(&mut self.io, Transport::Parked) {
            Transport::Tcp(s) => s.into_std().ok().map(super::shards::Moving::Tcp),
            Transport::Boxed(mut s) => match s.socket().map(|k| k.detach()) {
                Some(Ok(())) => Some(super::shards::Moving::Stack(s)),
                _ => None,
            },
            Transport::Parked => None,
        };
        if let Some(stream) = stream {
            self.counted.limit_moves();
            let h = super::shards::Handoff {
                stream,
                peer,
                listener,
                identity,
                input,
                transit: super::limits::Transit::carry(shared, listener),
            };
            mesh.hand_off(owner, h);
        }
        true
    }

    /// Read what the socket holds now, past tokio's readiness; a TLS or
    /// WebSocket stream has read all it could when it returned `Pending`.
    fn read_now(&mut self, shared: &Shared) -> io::Result<usize> {
        match &self.io {
            Transport::Tcp(s) => self.input.read_now(shared, s),
            Transport::Boxed(_) | Transport::Parked => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Whether a quiet connection may park now: plain TCP, open and
    /// connected, nothing half read or half written.
    fn may_park(&self, shared: &Shared) -> bool {
        matches!(self.io, Transport::Tcp(_))
            && self.counted.index() < usize::from(ConnHandle::NEVER_PARKS)
            && self.phase == Phase::Open
            && self.out.is_none()
            && self.input.is_idle()
            && shared.lot.enabled()
            && {
                // Neither before CONNECT nor while it waits for a takeover,
                // nor for other shards before its SUBACK: its quick park
                // would be spent before the reply it is quiet for.
                let broker = shared.broker.borrow();
                !broker.awaits_connect(self.id)
                    && !broker.holds_input(self.id)
                    && !broker.awaits_peers(self.id)
            }
    }

    /// Hand the socket to the parking lot and end the task (`Ready`); stay
    /// running (`Pending`) when the lot cannot take it.
    fn park(&mut self, shared: &Shared) -> Poll<()> {
        let Transport::Tcp(s) = &self.io else {
            return Poll::Pending;
        };
        if let Err(e) = shared.lot.register(self.id, s) {
            tracing::debug!(error = %e, "cannot park a connection");
            return Poll::Pending;
        }
        let Transport::Tcp(s) = std::mem::replace(&mut self.io, Transport::Parked) else {
            return Poll::Pending;
        };
        match s.into_std() {
            Ok(stream) => {
                let mut conns = shared.conns.borrow_mut();
                let Some(h) = conns.get_mut(&self.id) else {
                    // No handle to keep the socket in (cannot happen: the
                    // task removes it only when it ends): the socket closes.
                    drop(conns);
                    self.forget(shared);
                    return Poll::Ready(());
                };
                h.parked = Some(stream);
                h.listener = self.counted.park();
                h.waker = None;
                // While parked `quiet` carries the quick parks left to the
                // resumed task, and counts the sweeps that find it parked.
                h.quiet = self.fresh.min(QUICK_PARKS);
                h.park = false;
                drop(conns);
                shared.broker.borrow_mut().connection_parked(self.id);
                shared.lot.parked_one();
            }
            // tokio closed the socket when it could not deregister it.
            Err(_) => self.forget(shared),
        }
        Poll::Ready(())
    }

    /// Write until the socket blocks or the core has nothing more; `Ready`
    /// once the connection is over. `drained`: the core had nothing more
    /// (rather than the socket or this poll's budget stopping it); `wrote`:
    /// bytes left.
    fn poll_output(
        &mut self,
        shared: &Shared,
        cx: &mut Context<'_>,
        drained: &mut bool,
        wrote: &mut bool,
    ) -> Poll<()> {
        let vectored = matches!(self.io, Transport::Tcp(_));
        for _ in 0..BATCHES_PER_POLL {
            if self.out.is_some() || self.unflushed {
                let mut n = 0;
                let r = self.poll_write(cx, None, &mut n);
                Self::count(shared, n);
                *wrote |= n > 0;
                match r {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(_)) => return self.write_failed(shared),
                    // Give the space back: the burst is over.
                    Poll::Ready(Ok(())) => self.out = None,
                }
            }
            match self.phase {
                Phase::Lost => return Poll::Ready(()),
                Phase::ShuttingDown => {
                    let _ = ready!(match &mut self.io {
                        Transport::Tcp(s) => Pin::new(s).poll_shutdown(cx),
                        Transport::Boxed(s) => Pin::new(s).poll_shutdown(cx),
                        Transport::Parked => Poll::Ready(Ok(())),
                    });
                    if let Transport::Tcp(s) = std::mem::replace(&mut self.io, Transport::Parked) {
                        super::linger::start(shared, s);
                    }
                    self.forget(shared);
                    return Poll::Ready(());
                }
                Phase::Open | Phase::Closing => {}
            }
            let mut enc = shared.encoder.borrow_mut();
            let status = enc.fill(shared, self.id, vectored);
            // Draining may have caught this subscriber up: the publishers it
            // held are woken to be read again.
            shared.dispatch();
            match status {
                Transmit::Gone => return Poll::Ready(()),
                Transmit::Close => self.phase = Phase::ShuttingDown,
                Transmit::Open => {}
            }
            if enc.chunks.is_empty() {
                if status == Transmit::Close {
                    continue;
                }
                *drained = true;
                return Poll::Pending;
            }
            let mut n = 0;
            let r = self.poll_write(cx, Some(&mut enc.chunks), &mut n);
            Self::count(shared, n);
            *wrote |= n > 0;
            match r {
                Poll::Ready(Ok(())) => {}
                Poll::Pending => {
                    // Only the rest the socket refused stays with the connection.
                    if !enc.chunks.is_empty() {
                        self.out = Some(Box::new(enc.chunks.drain(..).collect()));
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Err(_)) => {
                    enc.chunks.clear();
                    drop(enc);
                    return self.write_failed(shared);
                }
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Write `chunks` (the connection's own `out` if `None`), then flush a
    /// TLS / WebSocket stream.
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        chunks: Option<&mut VecDeque<Bytes>>,
        n: &mut usize,
    ) -> Poll<io::Result<()>> {
        let mut none = VecDeque::new();
        let chunks = match chunks {
            Some(c) => c,
            None => self.out.as_deref_mut().unwrap_or(&mut none),
        };
        match &mut self.io {
            Transport::Tcp(s) => poll_write_chunks(cx, s, chunks, n),
            Transport::Boxed(s) => {
                if !chunks.is_empty() {
                    self.unflushed = true;
                    ready!(poll_write_chunks(cx, &mut **s, chunks, n))?;
                }
                ready!(Pin::new(&mut **s).poll_flush(cx))?;
                self.unflushed = false;
                Poll::Ready(Ok(()))
            }
            Transport::Parked => Poll::Ready(Ok(())),
        }
    }

    fn count(shared: &Shared, n: usize) {
        let out = &shared.bytes_out;
        out.set(out.get() + n as u64);
    }

    /// The peer is gone: nothing more can be written.
    fn write_failed(&mut self, shared: &Shared) -> Poll<()> {
        self.out = None;
        if self.phase != Phase::Lost {
            self.forget(shared);
        }
        Poll::Ready(())
    }

    /// Closing or lost: wait for the output, at most `FLUSH_GRACE`.
    fn poll_grace(&mut self, shared: &Shared, cx: &mut Context<'_>) -> Poll<()> {
        let grace = self
            .grace
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(FLUSH_GRACE)));
        ready!(grace.as_mut().poll(cx));
        if self.phase != Phase::Lost {
            self.forget(shared);
        }
        Poll::Ready(())
    }

    /// Tell the core the connection is over. On EOF or a read error this
    /// happens at once (wills and sessions do not wait for our flush), and
    /// what is being written is finished afterwards.
    fn forget(&mut self, shared: &Shared) {
        self.phase = Phase::Lost;
        shared
            .broker
            .borrow_mut()
            .connection_lost(Instant::now(), self.id);
        shared.dispatch();
    }
}

#[cfg(test)]
mod tests {
    use super::Conn;

    #[test]
    fn the_connection_task_stays_in_the_smallest_task_size() {
        // tokio allocates each task as one 128-byte-aligned cell of about
        // 110 bytes of its own plus the future: up to ~144 bytes of future
        // the cell is 256 bytes, one byte more and it is 384 (every idle
        // connection holds one).
        let size = std::mem::size_of::<Conn>();
        println!("connection future: {size} bytes");
        assert!(size <= 144, "the connection future grew to {size} bytes");
    }
}

//! A connection whose "socket" is a bridge's packet link
//! ([`crate::bridge::LinkEnd`]): driven by the same core calls as a socket
//! connection (`connection_opened_with`, `handle_publish` /
//! `handle_packet`, `poll_transmit`, `connection_lost`), with the same
//! rules for when input is taken (not while the core holds it, not while
//! its outbox is over `OUTBOX_HIGH`), but nothing is framed, decoded or
//! encoded: packets go in as they are and outbox items come out as they
//! are, so payloads cross as references.
//!
//! Back-pressure: when the queue towards the bridge is full, the outbox is
//! not drained (QoS 1/2 wait in the session as for a slow socket); when
//! the bridge's queue towards the broker is full, its publisher waits.

use super::ops::{ListenerGuard, Ops};
use super::reader::OUTBOX_HIGH;
use super::state::{ConnHandle, Shared};
use crate::bridge::link::{outgoing_weight, LinkEnd, LinkWaits};
use crate::core::{ConnId, ConnectionMeta, Outgoing, Transmit};
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;
use zerofan_codec::Packet;

/// Packets fed to the core per poll before the task lets the others run.
const PACKETS_PER_POLL: usize = 64;
/// Items taken from the core's outbox at a time.
const BATCH: usize = 256;

/// Open a connection into the broker on `listener` (an index past the
/// configured listeners: the defaults apply) and start its task; the
/// bridge's end of the link comes back.
pub(super) fn open(shared: &Rc<Shared>, listener: usize, waits: &LinkWaits) -> LinkEnd {
    let (ours, theirs) = LinkEnd::pair(waits);
    let peer = SocketAddr::from(([127, 0, 0, 1], 0));
    let meta = ConnectionMeta {
        listener,
        identity: None,
        ..ConnectionMeta::default()
    };
    let meta = super::limits::admit(shared, peer, meta);
    let counted = Ops::track(shared, listener);
    let id = shared
        .broker
        .borrow_mut()
        .connection_opened_with(Instant::now(), peer, meta);
    shared.conns.borrow_mut().insert_at(
        id,
        ConnHandle {
            listener: ConnHandle::NEVER_PARKS,
            ..ConnHandle::default()
        },
    );
    tokio::task::spawn_local(LocalConn {
        counted,
        id,
        link: theirs,
        batch: Vec::new(),
        pending: VecDeque::new(),
        blocked: false,
        lost: false,
    });
    ours
}

struct LocalConn {
    /// Counts the connection on its listener; also the handle to the broker.
    counted: ListenerGuard,
    id: ConnId,
    link: LinkEnd,
    batch: Vec<Outgoing>,
    /// Taken from the core, not yet in the queue (at most one batch).
    pending: VecDeque<Outgoing>,
    /// The queue towards the bridge was full at the last try (a wait is
    /// counted once, not at every poll).
    blocked: bool,
    /// The core was told the connection is over.
    lost: bool,
}

impl Future for LocalConn {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let shared = this.counted.shared().clone();
        if let Some(h) = shared.conns.borrow_mut().get_mut(&this.id) {
            h.set_waker(cx.waker());
        }
        shared.current.set(Some(this.id));
        let r = this.drive(&shared, cx);
        shared.current.set(None);
        if r.is_ready() {
            this.link.close();
        }
        r
    }
}

impl Drop for LocalConn {
    fn drop(&mut self) {
        // Also when aborted at shutdown: no waker of a finished task stays.
        self.counted.shared().conns.borrow_mut().remove(&self.id);
    }
}

impl LocalConn {
    fn drive(&mut self, shared: &Shared, cx: &mut Context<'_>) -> Poll<()> {
        let mut fed = 0;
        loop {
            // Output first, as a socket connection: answers leave at once.
            match self.output(shared, cx) {
                Some(Transmit::Gone) => return Poll::Ready(()),
                Some(Transmit::Close) => {
                    // The queue is closed behind what the core said last
                    // (a DISCONNECT, a refusal), which the bridge still reads.
                    self.forget(shared);
                    return Poll::Ready(());
                }
                _ => {}
            }
            if self.lost {
                return Poll::Ready(());
            }
            {
                let broker = shared.broker.borrow();
                if broker.is_closing(self.id)
                    || broker.outbox_len(self.id) > OUTBOX_HIGH
                    || broker.held(self.id)
                    || broker.holds_input(self.id)
                {
                    // The core wakes us when that changes.
                    return Poll::Pending;
                }
            }
            if fed >= PACKETS_PER_POLL {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            match self.link.to_broker.poll_pop(cx) {
                Poll::Ready(Some(p)) => {
                    fed += 1;
                    self.feed(shared, p);
                }
                Poll::Ready(None) => {
                    // The bridge hung up: as a socket's EOF.
                    self.forget(shared);
                    return Poll::Ready(());
                }
                Poll::Pending => {
                    if shared.broker.borrow().drain_requested(self.id) {
                        // A takeover waits for what this connection sent:
                        // all of it is handled.
                        shared
                            .broker
                            .borrow_mut()
                            .input_drained(Instant::now(), self.id);
                        shared.dispatch();
                        continue;
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn feed(&mut self, shared: &Shared, p: Packet) {
        {
            let mut broker = shared.broker.borrow_mut();
            let now = Instant::now();
            match p {
                // No `Wire`: there are no received bytes to forward as-is.
                p @ Packet::Publish(_) => broker.handle_publish(now, self.id, p, None),
                p => broker.handle_packet(now, self.id, p),
            }
        }
        shared.dispatch();
    }

    /// Move the core's output into the queue while it has room; `Some`
    /// with the core's last word when it was asked.
    fn output(&mut self, shared: &Shared, cx: &mut Context<'_>) -> Option<Transmit> {
        let q = &self.link.from_broker;
        let mut last = None;
        loop {
            while let Some(item) = self.pending.pop_front() {
                let w = outgoing_weight(&item);
                if let Err(item) = q.try_push(item, w) {
                    if q.is_closed() {
                        self.pending.clear();
                        return Some(Transmit::Gone);
                    }
                    if last == Some(Transmit::Close) || shared.broker.borrow().is_closing(self.id) {
                        // What a closing connection still has (its window's
                        // worth, then the DISCONNECT) goes in whatever the
                        // bounds: a bridge that does not read cannot keep
                        // it open (a takeover waits for it).
                        let _ = q.push_control(item);
                        for rest in self.pending.drain(..) {
                            let _ = q.push_control(rest);
                        }
                        if last == Some(Transmit::Close) {
                            return last;
                        }
                        continue;
                    }
                    self.pending.push_front(item);
                    if !std::mem::replace(&mut self.blocked, true) {
                        q.note_wait();
                    }
                    // Woken when the bridge takes something.
                    let _ = q.poll_room(cx, w);
                    return last;
                }
            }
            self.blocked = false;
            if matches!(last, Some(Transmit::Close | Transmit::Gone)) {
                return last;
            }
            let status = shared.broker.borrow_mut().poll_transmit(
                Instant::now(),
                self.id,
                &mut self.batch,
                BATCH,
            );
            // Draining may have caught this subscriber up: the publishers
            // it held are woken.
            shared.dispatch();
            last = Some(status);
            if self.batch.is_empty() {
                return last.filter(|s| *s != Transmit::Open);
            }
            self.pending.extend(self.batch.drain(..));
        }
    }

    /// Tell the core the connection is over (once).
    fn forget(&mut self, shared: &Shared) {
        if std::mem::replace(&mut self.lost, true) {
            return;
        }
        shared
            .broker
            .borrow_mut()
            .connection_lost(Instant::now(), self.id);
        shared.dispatch();
    }
}

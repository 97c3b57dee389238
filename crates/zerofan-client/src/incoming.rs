//! The stream of messages the broker sends to this client, and the bounded
//! queue behind it.
//!
//! The queue is handed over in runs, not message by message: the event
//! loop moves every decoded message that fits under one lock and wakes the
//! consumer at most once (only if it is waiting), and the consumer takes
//! up to its limit under one lock, which is an exchange of allocations
//! (no copy) when it takes everything into an empty `Vec`. A channel with a permit, a slot and a wakeup per
//! message costs several atomic operations on cache lines both threads
//! write, per message; this costs one lock per run.

use crate::message::Message;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// The queue both ends share.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Most messages queued at once.
    capacity: usize,
}

#[derive(Debug, Default)]
struct State {
    /// Queued messages, oldest first.
    msgs: VecDeque<Message>,
    /// The consumer, when it found the queue empty.
    rx_waker: Option<Waker>,
    /// The event loop, when it found the queue full.
    tx_waker: Option<Waker>,
    /// The event loop is gone: once `msgs` is empty, the stream has ended.
    tx_closed: bool,
    /// The [`Incoming`] was dropped: nobody will take messages.
    rx_closed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held cannot leave `State` half
        // updated in a way that matters here (every field is valid on its
        // own), so a poisoned lock is used as it is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A new queue of `capacity` messages (at least one).
pub(crate) fn queue(capacity: usize) -> (Sender, Incoming) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        capacity: capacity.max(1),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Incoming { shared },
    )
}

/// The event loop's end of the queue.
#[derive(Debug)]
pub(crate) struct Sender {
    shared: Arc<Shared>,
}

/// What [`Sender::push_from`] did.
pub(crate) enum Pushed {
    /// This many messages were moved into the queue (maybe 0: it is full).
    Moved(usize),
    /// Nobody listens (the [`Incoming`] was dropped); nothing was moved.
    Closed,
}

impl Sender {
    /// Move messages from the front of `from` into the queue while it has
    /// room, under one lock, and wake the consumer if it waits. When the
    /// queue is empty and takes all of `from`, the two exchange their
    /// allocations instead of moving messages one by one.
    pub fn push_from(&self, from: &mut VecDeque<Message>) -> Pushed {
        let mut st = self.shared.lock();
        if st.rx_closed {
            return Pushed::Closed;
        }
        let room = self.shared.capacity.saturating_sub(st.msgs.len());
        let n = room.min(from.len());
        if n == 0 {
            return Pushed::Moved(0);
        }
        if st.msgs.is_empty() && n == from.len() {
            std::mem::swap(&mut st.msgs, from);
        } else {
            st.msgs.extend(from.drain(..n));
        }
        let waker = st.rx_waker.take();
        drop(st);
        wake(waker);
        Pushed::Moved(n)
    }

    /// Ready once the queue has room for at least one message, or nobody
    /// listens any more.
    pub fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.shared.lock();
        if st.rx_closed || st.msgs.len() < self.shared.capacity {
            return Poll::Ready(());
        }
        register(&mut st.tx_waker, cx);
        Poll::Pending
    }

    /// See [`Sender::poll_room`].
    pub async fn room(&self) {
        poll_fn(|cx| self.poll_room(cx)).await
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let waker = {
            let mut st = self.shared.lock();
            st.tx_closed = true;
            st.rx_waker.take()
        };
        wake(waker);
    }
}

/// Messages for this client, in arrival order, as an async `recv()` or a
/// [`futures_core::Stream`]. Bounded: when the application does not keep up,
/// the client stops reading the socket (and the broker's flow control takes
/// over) instead of buffering without limit. QoS 1/2 messages are
/// acknowledged when they enter this queue. Ends (`None`) when the client
/// is closed or gives up reconnecting.
#[derive(Debug)]
pub struct Incoming {
    shared: Arc<Shared>,
}

impl Incoming {
    /// The next message; `None` once the client has shut down.
    pub async fn recv(&mut self) -> Option<Message> {
        poll_fn(|cx| self.poll_one(cx)).await
    }

    /// Wait for at least one message, then append to `buf` every message
    /// ready now, up to `limit`; returns how many were added, 0 once the
    /// client has shut down (or when `limit` is 0). Cheaper per message
    /// than `recv` in a loop: one wait, one wakeup, one lock for a whole
    /// run (and no copy at all when `buf` is empty and takes everything).
    pub async fn recv_many(&mut self, buf: &mut Vec<Message>, limit: usize) -> usize {
        if limit == 0 {
            return 0;
        }
        poll_fn(|cx| self.poll_many(cx, buf, limit)).await
    }

    /// Append to `buf` every message ready now, up to `limit`, without
    /// waiting; returns how many were added (0 when none is ready, and
    /// once the client has shut down: [`Incoming::is_closed`] tells the
    /// two apart).
    pub fn try_recv_many(&mut self, buf: &mut Vec<Message>, limit: usize) -> usize {
        let (n, waker) = take(&mut self.shared.lock(), buf, limit);
        wake(waker);
        n
    }

    /// A message if one is ready now.
    pub fn try_recv(&mut self) -> Option<Message> {
        let (m, waker) = take_one(&mut self.shared.lock());
        wake(waker);
        m
    }

    /// Whether the stream has ended: the client shut down and every
    /// message it queued was taken.
    pub fn is_closed(&self) -> bool {
        let st = self.shared.lock();
        st.tx_closed && st.msgs.is_empty()
    }

    fn poll_many(&self, cx: &mut Context<'_>, buf: &mut Vec<Message>, limit: usize) -> Poll<usize> {
        let mut st = self.shared.lock();
        let (n, waker) = take(&mut st, buf, limit);
        if n == 0 && !st.tx_closed {
            register(&mut st.rx_waker, cx);
            return Poll::Pending;
        }
        drop(st);
        wake(waker);
        Poll::Ready(n)
    }

    fn poll_one(&self, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        let mut st = self.shared.lock();
        let (m, waker) = take_one(&mut st);
        if m.is_none() && !st.tx_closed {
            register(&mut st.rx_waker, cx);
            return Poll::Pending;
        }
        drop(st);
        wake(waker);
        Poll::Ready(m)
    }
}

/// Move up to `limit` messages into `buf`; with them, the event loop's
/// waker if it waits for room (to wake once the lock is released).
fn take(st: &mut State, buf: &mut Vec<Message>, limit: usize) -> (usize, Option<Waker>) {
    let n = limit.min(st.msgs.len());
    if n == 0 {
        return (0, None);
    }
    if n == st.msgs.len() && buf.is_empty() {
        // Everything, into an empty buffer: the queue's allocation becomes
        // `buf` (no copy while the queue's ring starts at the start of its
        // allocation, as it does when it was filled from empty) and the
        // queue goes on in `buf`'s.
        let spare = VecDeque::from(std::mem::take(buf));
        *buf = Vec::from(std::mem::replace(&mut st.msgs, spare));
    } else {
        buf.extend(st.msgs.drain(..n));
    }
    (n, st.tx_waker.take())
}

/// The oldest message, as [`take`] does.
fn take_one(st: &mut State) -> (Option<Message>, Option<Waker>) {
    match st.msgs.pop_front() {
        Some(m) => (Some(m), st.tx_waker.take()),
        None => (None, None),
    }
}

/// Remember `cx`'s waker in `slot` (unless it is the one already there).
fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

fn wake(w: Option<Waker>) {
    if let Some(w) = w {
        w.wake();
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        let (msgs, waker) = {
            let mut st = self.shared.lock();
            st.rx_closed = true;
            (std::mem::take(&mut st.msgs), st.tx_waker.take())
        };
        // Dropped outside the lock: the read buffers go back to their pool.
        drop(msgs);
        wake(waker);
    }
}

impl futures_core::Stream for Incoming {
    type Item = Message;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        self.poll_one(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::collections::VecDeque;
    use zerofan_codec::{MqttStr, Publish};

    fn msg(i: u8) -> Message {
        let p = Publish {
            topic: MqttStr::try_from("t").unwrap(),
            payload: Bytes::from(vec![i]),
            ..Default::default()
        };
        Message::from_publish(p, None, Bytes::new())
    }

    fn backlog(range: std::ops::Range<u8>) -> VecDeque<Message> {
        range.map(msg).collect()
    }

    fn moved(p: Pushed) -> usize {
        match p {
            Pushed::Moved(n) => n,
            Pushed::Closed => panic!("closed"),
        }
    }

    #[tokio::test]
    async fn recv_many_takes_what_is_ready_up_to_the_limit_then_ends() {
        let (tx, mut inc) = queue(8);
        let mut b = backlog(0..3);
        assert_eq!(moved(tx.push_from(&mut b)), 3);
        assert!(b.is_empty(), "all taken");
        let mut buf = Vec::new();
        assert_eq!(inc.recv_many(&mut buf, 2).await, 2);
        assert_eq!(inc.recv_many(&mut buf, 10).await, 1, "only what is ready");
        let got: Vec<u8> = buf.iter().map(|m| m.payload[0]).collect();
        assert_eq!(got, [0, 1, 2], "in order, appended");
        assert_eq!(inc.try_recv_many(&mut buf, 10), 0, "nothing ready");
        assert!(!inc.is_closed());
        // Waits for the next one rather than returning empty.
        let late = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.push_from(&mut backlog(9..10));
            tx
        });
        assert_eq!(inc.recv_many(&mut buf, 10).await, 1);
        assert_eq!(buf.last().map(|m| m.payload[0]), Some(9));
        drop(late.await.unwrap());
        assert_eq!(inc.recv_many(&mut buf, 10).await, 0, "closed");
        assert!(inc.is_closed());
        assert!(inc.recv().await.is_none());
    }

    #[tokio::test]
    async fn the_queue_is_bounded_and_the_sender_waits_for_room() {
        let (tx, mut inc) = queue(4);
        let mut b = backlog(0..10);
        assert_eq!(moved(tx.push_from(&mut b)), 4);
        assert_eq!(moved(tx.push_from(&mut b)), 0, "full");
        assert_eq!(b.len(), 6, "the rest stays with the sender");
        let tx = Arc::new(tx);
        let t2 = tx.clone();
        let waiter = tokio::spawn(async move { t2.room().await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "no room yet");
        assert_eq!(inc.try_recv().map(|m| m.payload[0]), Some(0));
        waiter.await.unwrap();
        assert_eq!(moved(tx.push_from(&mut b)), 1);
        let mut all = Vec::new();
        assert_eq!(inc.try_recv_many(&mut all, 100), 4);
        let got: Vec<u8> = all.iter().map(|m| m.payload[0]).collect();
        assert_eq!(got, [1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_dropped_incoming_closes_the_sender_side() {
        let (tx, inc) = queue(2);
        let mut b = backlog(0..5);
        assert_eq!(moved(tx.push_from(&mut b)), 2);
        drop(inc);
        // Waiting for room ends at once, and nothing more is taken.
        tx.room().await;
        assert!(matches!(tx.push_from(&mut b), Pushed::Closed));
        assert_eq!(b.len(), 3);
    }

    #[tokio::test]
    async fn stream_yields_in_order_then_ends() {
        use futures_util::StreamExt;
        let (tx, mut inc) = queue(16);
        tx.push_from(&mut backlog(0..5));
        drop(tx);
        let got: Vec<u8> = (&mut inc).map(|m| m.payload[0]).collect().await;
        assert_eq!(got, [0, 1, 2, 3, 4]);
    }
}

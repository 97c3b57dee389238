//! The bridge's connection into this broker: two bounded queues of decoded
//! packets, one each way, in place of a socket. A PUBLISH crosses as its
//! `Bytes` (a reference, no copy), and what the broker sends crosses as
//! the core's outbox items, whose deliveries reference the shared message:
//! nothing is encoded into bytes and parsed back.
//!
//! Both ends run on the broker's thread (the shell's `LocalSet`), hence
//! `Rc` and `RefCell`, never held across an await.

use crate::core::Outgoing;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use zerofan_codec::Packet;

/// Packets each queue holds at most (acknowledgements excepted, see
/// [`Queue::push_control`]). A PUBLISH weighs its topic and payload.
pub const LINK_PACKETS: usize = 1024;
/// Payload and topic bytes each queue holds at most; one larger packet
/// still passes alone (as a socket passes a packet larger than its buffer).
pub const LINK_BYTES: usize = 1 << 20;
/// What a control packet (acknowledgement, SUBSCRIBE...) weighs.
const CONTROL_WEIGHT: usize = 16;

/// The queue is closed: that end of the link went away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closed;

/// One direction of a link: a bounded FIFO shared by its two ends.
pub struct Queue<T> {
    inner: Rc<RefCell<Inner<T>>>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Queue {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<T> {
    items: VecDeque<(T, usize)>,
    bytes: usize,
    max_items: usize,
    max_bytes: usize,
    closed: bool,
    /// Tasks waiting for an item (the one consumer; a few at most).
    readers: Vec<Waker>,
    /// Tasks waiting for room.
    writers: Vec<Waker>,
    /// Pushes that found the queue full and waited (back-pressure),
    /// shared with the bridge's figures.
    waits: Rc<Cell<u64>>,
}

fn remember(list: &mut Vec<Waker>, w: &Waker) {
    if !list.iter().any(|x| x.will_wake(w)) {
        list.push(w.clone());
    }
}

fn wake_all(list: &mut Vec<Waker>) {
    for w in list.drain(..) {
        w.wake();
    }
}

impl<T> Queue<T> {
    /// An empty queue of at most `max_items` items and `max_bytes` bytes;
    /// each push that has to wait for room adds one to `waits`.
    pub fn new(max_items: usize, max_bytes: usize, waits: Rc<Cell<u64>>) -> Self {
        Queue {
            inner: Rc::new(RefCell::new(Inner {
                items: VecDeque::new(),
                bytes: 0,
                max_items: max_items.max(1),
                max_bytes,
                closed: false,
                readers: Vec::new(),
                writers: Vec::new(),
                waits,
            })),
        }
    }

    fn fits(i: &Inner<T>, weight: usize) -> bool {
        i.items.is_empty() || (i.items.len() < i.max_items && i.bytes + weight <= i.max_bytes)
    }

    /// Room for one more item of `weight` bytes now.
    pub fn has_room(&self, weight: usize) -> bool {
        Self::fits(&self.inner.borrow(), weight)
    }

    /// Add an item if it fits; `Err` gives it back (full or closed).
    pub fn try_push(&self, item: T, weight: usize) -> Result<(), T> {
        let mut i = self.inner.borrow_mut();
        if i.closed || !Self::fits(&i, weight) {
            return Err(item);
        }
        Self::put(&mut i, item, weight);
        Ok(())
    }

    /// Add an item whatever the bounds: for acknowledgements, whose number
    /// the peers' Receive Maximum already bounds, so that an answer never
    /// waits behind messages (which could deadlock two full queues).
    pub fn push_control(&self, item: T) -> Result<(), Closed> {
        let mut i = self.inner.borrow_mut();
        if i.closed {
            return Err(Closed);
        }
        Self::put(&mut i, item, CONTROL_WEIGHT);
        Ok(())
    }

    fn put(i: &mut Inner<T>, item: T, weight: usize) {
        i.items.push_back((item, weight));
        i.bytes += weight;
        wake_all(&mut i.readers);
    }

    /// `Ready` once there is room for `weight` bytes (or the queue closed);
    /// else `cx` is woken when an item leaves. Counts the wait.
    pub fn poll_room(&self, cx: &mut Context<'_>, weight: usize) -> Poll<Result<(), Closed>> {
        let mut i = self.inner.borrow_mut();
        if i.closed {
            return Poll::Ready(Err(Closed));
        }
        if Self::fits(&i, weight) {
            return Poll::Ready(Ok(()));
        }
        remember(&mut i.writers, cx.waker());
        Poll::Pending
    }

    /// Add an item, waiting while the queue is full.
    pub async fn push(&self, item: T, weight: usize) -> Result<(), Closed> {
        let mut counted = false;
        poll_fn(|cx| {
            let r = self.poll_room(cx, weight);
            if r.is_pending() && !counted {
                counted = true;
                self.note_wait();
            }
            r
        })
        .await?;
        self.try_push(item, weight).map_err(|_| Closed)
    }

    /// Take the oldest item, if any.
    pub fn try_pop(&self) -> Option<T> {
        let mut i = self.inner.borrow_mut();
        let (item, weight) = i.items.pop_front()?;
        i.bytes -= weight;
        wake_all(&mut i.writers);
        Some(item)
    }

    /// The oldest item; `Ready(None)` once the queue is closed and empty.
    pub fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(item) = self.try_pop() {
            return Poll::Ready(Some(item));
        }
        let mut i = self.inner.borrow_mut();
        if i.closed {
            return Poll::Ready(None);
        }
        remember(&mut i.readers, cx.waker());
        Poll::Pending
    }

    /// No more items go in; those in it can still be taken.
    pub fn close(&self) {
        let mut i = self.inner.borrow_mut();
        i.closed = true;
        wake_all(&mut i.readers);
        wake_all(&mut i.writers);
    }

    /// Closed (by either end).
    pub fn is_closed(&self) -> bool {
        self.inner.borrow().closed
    }

    /// Items in it now.
    pub fn len(&self) -> usize {
        self.inner.borrow().items.len()
    }

    /// Nothing in it.
    pub fn is_empty(&self) -> bool {
        self.inner.borrow().items.is_empty()
    }

    /// Count a push that has to wait for room (one whose writer polls
    /// [`Queue::poll_room`] itself).
    pub fn note_wait(&self) {
        let i = self.inner.borrow();
        i.waits.set(i.waits.get() + 1);
    }
}

/// What an outbox item towards the bridge weighs.
pub fn outgoing_weight(o: &Outgoing) -> usize {
    match o {
        Outgoing::Publish(d) => d.message.payload.len() + d.message.topic.len(),
        _ => CONTROL_WEIGHT,
    }
}

/// How often each queue of a bridge's links was full (a writer waited),
/// over all its connections.
#[derive(Clone, Debug, Default)]
pub struct LinkWaits {
    /// The bridge waited to hand the broker a message.
    pub to_broker: Rc<Cell<u64>>,
    /// The broker waited to hand the bridge its output.
    pub from_broker: Rc<Cell<u64>>,
}

/// The bridge's end of one connection into the broker.
pub struct LinkEnd {
    /// Packets to the broker.
    pub to_broker: Queue<Packet>,
    /// What the broker sends.
    pub from_broker: Queue<Outgoing>,
}

impl LinkEnd {
    /// A fresh pair of queues: the bridge's end, and the broker's
    /// (`to_broker`, `from_broker`: the same queues, read and written the
    /// other way). `waits`: the counters of full queues, (towards the
    /// broker, towards the bridge).
    pub fn pair(waits: &LinkWaits) -> (LinkEnd, LinkEnd) {
        let a = LinkEnd {
            to_broker: Queue::new(LINK_PACKETS, LINK_BYTES, waits.to_broker.clone()),
            from_broker: Queue::new(LINK_PACKETS, LINK_BYTES, waits.from_broker.clone()),
        };
        let b = LinkEnd {
            to_broker: a.to_broker.clone(),
            from_broker: a.from_broker.clone(),
        };
        (a, b)
    }

    /// Hang up both ways.
    pub fn close(&self) {
        self.to_broker.close();
        self.from_broker.close();
    }
}

impl Drop for LinkEnd {
    fn drop(&mut self) {
        // Either end going away ends the connection, as a closed socket.
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(std::sync::atomic::AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn bounded_in_items_and_bytes_and_a_full_queue_wakes_its_writer() {
        let waits = Rc::new(Cell::new(0));
        let q: Queue<u32> = Queue::new(2, 100, waits.clone());
        assert!(q.try_push(1, 60).is_ok());
        // Over the bytes: refused.
        assert_eq!(q.try_push(2, 60), Err(2));
        assert!(q.try_push(3, 40).is_ok());
        // Over the items: refused.
        assert_eq!(q.try_push(4, 0), Err(4));
        let count = Arc::new(Count(Default::default()));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(q.poll_room(&mut cx, 10).is_pending());
        // A push waits (and is counted) until the reader takes one.
        let mut push = std::pin::pin!(q.push(7, 10));
        assert!(push.as_mut().poll(&mut cx).is_pending());
        assert_eq!(waits.get(), 1);
        assert_eq!(q.try_pop(), Some(1));
        assert_eq!(count.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(push.as_mut().poll(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(waits.get(), 1);
        assert_eq!(q.try_pop(), Some(3));
        assert_eq!(q.try_pop(), Some(7));
        // Control packets pass the bounds.
        assert!(q.try_push(4, 10).is_ok());
        assert!(q.try_push(5, 10).is_ok());
        assert!(q.push_control(6).is_ok());
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn one_large_item_passes_alone_and_close_ends_the_reader() {
        let q: Queue<u32> = Queue::new(4, 100, Rc::default());
        assert!(q.try_push(1, 1000).is_ok());
        assert_eq!(q.try_push(2, 1), Err(2));
        let count = Arc::new(Count(Default::default()));
        let waker = Waker::from(count);
        let mut cx = Context::from_waker(&waker);
        assert_eq!(q.poll_pop(&mut cx), Poll::Ready(Some(1)));
        assert!(q.poll_pop(&mut cx).is_pending());
        q.close();
        assert_eq!(q.poll_pop(&mut cx), Poll::Ready(None));
        assert_eq!(q.try_push(3, 1), Err(3));
        assert_eq!(q.push_control(3), Err(Closed));
    }
}

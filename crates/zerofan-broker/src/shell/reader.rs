//! A connection's input side: waits until the socket is readable before
//! taking a buffer (an idle connection holds none), frames and decodes every
//! complete packet as a slice of the frozen buffer, and carries a partial
//! tail into a fresh buffer sized for the whole packet. Driven by the
//! connection's one task (see `conn.rs`), one read per call.

use super::buffers::{Buffers, ReadBuf, READ_MAX, READ_MIN};
use super::listener::BoxStream;
use super::state::Shared;
use crate::core::{ConnId, InputState, Wire};
use bytes::BufMut;
use std::future::Future;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::task::{ready, Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::TcpStream;
use zerofan_codec::Frame;

/// Control packets waiting in the outbox above which reading pauses: a
/// client that does not read its acknowledgements is not read either.
pub(super) const OUTBOX_HIGH: usize = 1024;
/// Largest buffer allocated in one step for an announced packet size.
const PREALLOC_MAX: usize = 8 * 1024 * 1024;

/// What a connection's input keeps between reads: a partial packet, if
/// any, and the adaptive read size.
pub(super) struct ReadState {
    buf: Option<ReadBuf>,
    /// Adapts to the traffic: doubles while reads fill the buffer, halves
    /// while they use less than a quarter of it.
    read_size: u32,
    /// `buf` holds packets not handed over yet: the core holds this
    /// connection's input while its CONNECT waits for a takeover.
    held: bool,
}

impl Default for ReadState {
    fn default() -> Self {
        ReadState {
            buf: None,
            read_size: READ_MIN as u32,
            held: false,
        }
    }
}

impl ReadState {
    /// Read once from plain TCP, waiting for readability before a buffer is
    /// taken; `Ready(Ok(n))` once `n` bytes (0: EOF) are in the buffer.
    pub(super) fn poll_read_tcp(
        &mut self,
        cx: &mut Context<'_>,
        shared: &Shared,
        stream: &TcpStream,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(stream.poll_read_ready(cx))?;
            let b = self.buffer(shared);
            let room = Buffers::spare(b);
            let mut got = None;
            // A short read means the socket is drained: report WouldBlock to
            // tokio so that it clears the readiness now, which saves the read
            // that would only return EAGAIN (one syscall per packet). Data
            // that arrives later is a new edge and sets readiness again.
            let r = stream.try_io(Interest::READABLE, || {
                let n = stream.try_read_buf(&mut *b)?;
                got = Some(n);
                if n > 0 && n < room {
                    Err(io::ErrorKind::WouldBlock.into())
                } else {
                    Ok(n)
                }
            });
            if let Some(n) = got {
                return Poll::Ready(Ok(self.account(shared, n, room)));
            }
            match r {
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Spurious readiness: give the buffer back rather than
                    // hold it while idle.
                    if self.buf.as_ref().is_some_and(|b| b.is_empty()) {
                        self.buf = None;
                    }
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Input moved in from another shard: handed to the core at the next
    /// poll, before anything more is read.
    pub(super) fn moved_in(shared: &Shared, input: &[u8]) -> ReadState {
        let mut buf = shared.buffers.get(input.len().max(READ_MIN));
        buf.put_slice(input);
        ReadState {
            buf: Some(buf),
            read_size: READ_MIN as u32,
            held: true,
        }
    }

    /// With several shards: the shard that owns the client id of the
    /// CONNECT read so far, once it is complete, if not `me` (an empty
    /// client id stays: the broker assigns one here).
    pub(super) fn connect_owner(
        &self,
        shared: &Shared,
        id: ConnId,
        me: usize,
        shards: usize,
    ) -> Option<usize> {
        let b = self.buf.as_ref()?;
        let broker = shared.broker.borrow();
        if !broker.awaits_connect(id) || broker.holds_input(id) {
            return None;
        }
        let Frame::Complete(len) = zerofan_codec::frame(&b[..], broker.max_packet_size(id)) else {
            return None;
        };
        // One copy of the CONNECT per connection, only when sharded.
        let packet = bytes::Bytes::copy_from_slice(b.get(..len)?);
        let zerofan_codec::Packet::Connect(c) =
            zerofan_codec::decode(packet, broker.protocol(id)).ok()?
        else {
            return None;
        };
        if c.client_id.is_empty() {
            return None;
        }
        let owner = crate::core::shard_of(c.client_id.as_bytes(), shards);
        (owner != me).then_some(owner)
    }

    /// Everything read and not handed over, to move it to another shard.
    pub(super) fn take_input(&mut self) -> bytes::Bytes {
        self.held = false;
        self.buf.take().map(Buffers::freeze).unwrap_or_default()
    }

    /// Nothing half read: no buffer held.
    pub(super) fn is_idle(&self) -> bool {
        self.buf.is_none()
    }

    /// Packets were read and not handed over yet (see `feed`).
    pub(super) fn is_held(&self) -> bool {
        self.held
    }

    /// Read once from `socket` whatever tokio's readiness says: a takeover
    /// must see what the old connection's socket holds now, and readiness
    /// lags (a socket just back from the parking lot has none until the
    /// runtime next polls). `WouldBlock` means the socket is really empty.
    pub(super) fn read_now(&mut self, shared: &Shared, socket: &impl AsFd) -> io::Result<usize> {
        let b = self.buffer(shared);
        let room = Buffers::spare(b);
        let socket = socket2::SockRef::from(socket);
        let mut r = (&*socket).read(b.unfilled_mut());
        for _ in 0..3 {
            if !matches!(&r, Err(e) if e.kind() == io::ErrorKind::Interrupted) {
                break;
            }
            r = (&*socket).read(b.unfilled_mut());
        }
        match r {
            Ok(n) => {
                b.advance(n);
                Ok(self.account(shared, n, room))
            }
            Err(e) => {
                if self.buf.as_ref().is_some_and(|b| b.is_empty()) {
                    self.buf = None;
                }
                Err(e)
            }
        }
    }

    /// Read once from a TLS / WebSocket stream. The buffer is taken before
    /// waiting: these streams keep buffers of their own anyway.
    pub(super) fn poll_read_boxed(
        &mut self,
        cx: &mut Context<'_>,
        shared: &Shared,
        stream: &mut BoxStream,
    ) -> Poll<io::Result<usize>> {
        let b = self.buffer(shared);
        let room = Buffers::spare(b);
        // `read_buf` is cancel safe and its future holds only the two
        // borrows, so polling a fresh one per call loses nothing.
        let n = ready!(std::pin::pin!(stream.read_buf(b)).poll(cx))?;
        Poll::Ready(Ok(self.account(shared, n, room)))
    }

    /// The buffer to read into, with free space.
    fn buffer(&mut self, shared: &Shared) -> &mut ReadBuf {
        let size = self.read_size as usize;
        let b = self.buf.get_or_insert_with(|| shared.buffers.get(size));
        if Buffers::spare(b) == 0 {
            grow(&shared.buffers, b, b.len() * 2);
        }
        b
    }

    fn account(&mut self, shared: &Shared, n: usize, room: usize) -> usize {
        shared.bytes_in.set(shared.bytes_in.get() + n as u64);
        if n == room {
            self.read_size = (self.read_size * 2).min(READ_MAX as u32);
        } else if n < room / 4 {
            self.read_size = (self.read_size / 2).max(READ_MIN as u32);
        }
        n
    }

    /// Hand every complete packet read so far to the core. True when the
    /// core closes the connection (a protocol error, DISCONNECT, a refusal):
    /// its pending output is flushed, nothing more is read.
    pub(super) fn feed(&mut self, shared: &Shared, id: ConnId) -> bool {
        self.held = false;
        let Some(b) = self.buf.as_mut() else {
            return false;
        };
        if shared.broker.borrow().holds_input(id) {
            self.held = true;
            return false;
        }
        // The first packet must be CONNECT (MQTT-3.1.0-1): anything else is
        // refused at its first byte, not after waiting (up to the connect
        // timeout) for the rest of a packet that may never come.
        if b.first().is_some_and(|&t| t >> 4 != 1)
            && shared.broker.borrow().next_must_be_connect(id)
        {
            let e = zerofan_codec::DecodeError::new(
                zerofan_codec::ReasonCode::PROTOCOL_ERROR,
                "first packet is not CONNECT",
            );
            return refuse(shared, id, e);
        }
        let max = shared.broker.borrow().max_packet_size(id);
        match zerofan_codec::frame(&b[..], max) {
            Frame::NeedMore(more) => {
                // Size the buffer for the whole packet now, so a large
                // payload lands in one allocation without further copies.
                // A peer announcing a huge packet gets the buffer in doubling
                // steps past PREALLOC_MAX, so a lie costs it bytes, not us.
                let want = b.len() + more;
                if b.capacity() < want {
                    let target = if want <= PREALLOC_MAX {
                        want
                    } else {
                        want.min(b.capacity() * 2)
                    };
                    grow(&shared.buffers, b, target);
                }
                return false;
            }
            Frame::Invalid(e) => return refuse(shared, id, e),
            Frame::Complete(_) => {}
        }
        let Some(filled) = self.buf.take() else {
            return false;
        };
        let bytes = Buffers::freeze(filled);
        let mut off = 0;
        // One clock read per buffer, not per packet: the packets of one read
        // arrived together.
        let now = Instant::now();
        // With replicas kept, the packets of this read end as one core
        // event (one batch to the replicas, one commit); every way out of
        // the loop below reaches the end of the read.
        shared.broker.borrow_mut().begin_client_read();
        let end = loop {
            match zerofan_codec::frame(&bytes[off..], max) {
                Frame::Complete(len) => {
                    let packet = bytes.slice(off..off + len);
                    // A QoS 0 PUBLISH may be forwarded as these very bytes.
                    let wire = Wire::candidate(&bytes, off, off + len);
                    off += len;
                    let mut broker = shared.broker.borrow_mut();
                    let protocol = broker.protocol(id);
                    match zerofan_codec::decode(packet, protocol) {
                        Ok(p @ zerofan_codec::Packet::Publish(_)) => {
                            broker.handle_publish(now, id, p, wire)
                        }
                        Ok(p) => broker.handle_packet(now, id, p),
                        Err(e) => broker.handle_decode_error(now, id, e),
                    }
                    match broker.input_state(id) {
                        InputState::Open => {}
                        InputState::Closed => break true,
                        InputState::Held => {
                            // Kept as read, handed over once the takeover
                            // is over (the connection is woken then).
                            let rest = &bytes[off..];
                            if !rest.is_empty() {
                                let mut fresh = shared.buffers.get(rest.len());
                                fresh.put_slice(rest);
                                self.buf = Some(fresh);
                                self.held = true;
                            }
                            break false;
                        }
                    }
                }
                Frame::NeedMore(more) => {
                    let tail = &bytes[off..];
                    if !tail.is_empty() {
                        let whole = tail.len() + more;
                        let mut fresh = shared.buffers.get(
                            whole
                                .min(PREALLOC_MAX.max(tail.len() * 2))
                                .max(self.read_size as usize),
                        );
                        fresh.put_slice(tail);
                        self.buf = Some(fresh);
                    }
                    break false;
                }
                Frame::Invalid(e) => {
                    shared
                        .broker
                        .borrow_mut()
                        .handle_decode_error(Instant::now(), id, e);
                    break true;
                }
            }
        };
        shared.broker.borrow_mut().end_client_read();
        shared.dispatch();
        end
    }
}

/// A packet the connection cannot send: the core closes the connection
/// with the error's reason code. Always true (the connection is closing).
fn refuse(shared: &Shared, id: ConnId, e: zerofan_codec::DecodeError) -> bool {
    shared
        .broker
        .borrow_mut()
        .handle_decode_error(Instant::now(), id, e);
    shared.dispatch();
    true
}

/// Replace `b` with a buffer of at least `min` bytes holding the same data.
fn grow(buffers: &Buffers, b: &mut ReadBuf, min: usize) {
    let mut bigger = buffers.get(min.max(READ_MIN));
    bigger.put_slice(&b[..]);
    *b = bigger;
}

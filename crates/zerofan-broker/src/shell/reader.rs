//! A connection's reader: waits until the socket is readable before taking
//! a buffer (an idle connection holds none), frames and decodes every
//! complete packet as a slice of the frozen buffer, and carries a partial
//! tail into a fresh buffer sized for the whole packet.

use super::buffers::{Buffers, ReadBuf, READ_MAX, READ_MIN};
use super::state::{ConnHandle, Shared};
use crate::core::ConnId;
use bytes::BufMut;
use std::time::Instant;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;
use zerofan_codec::Frame;

/// Control packets waiting in the outbox above which the reader pauses: a
/// client that does not read its acknowledgements is not read either.
const OUTBOX_HIGH: usize = 1024;
/// Largest buffer allocated in one step for an announced packet size.
const PREALLOC_MAX: usize = 8 * 1024 * 1024;

/// Why the read loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadEnd {
    /// EOF or a socket error: the connection is lost.
    PeerClosed,
    /// The core closes the connection; the writer flushes first.
    CloseRequested,
}

/// The read half of a connection's transport.
pub enum ReadSide {
    /// Plain TCP: waits for readability before taking a buffer.
    Tcp(OwnedReadHalf),
    /// TLS / WebSocket: reads into a buffer taken before waiting (these
    /// streams keep buffers of their own anyway).
    Boxed(tokio::io::ReadHalf<super::listener::BoxStream>),
}

/// Read and feed packets to the core until the peer or the core ends it.
pub async fn reader_loop(
    shared: &Shared,
    id: ConnId,
    handle: &ConnHandle,
    mut rd: ReadSide,
) -> ReadEnd {
    let mut buf: Option<ReadBuf> = None;
    // Adapts to the traffic: doubles while reads fill the buffer, halves
    // while they use less than a quarter of it.
    let mut read_size = READ_MIN;
    loop {
        while shared.broker.borrow().outbox_len(id) > OUTBOX_HIGH {
            tokio::select! {
                biased;
                _ = handle.close.notified() => return ReadEnd::CloseRequested,
                _ = handle.drained.notified() => {}
            }
        }
        let read = match &mut rd {
            ReadSide::Tcp(rd) => {
                tokio::select! {
                    biased;
                    _ = handle.close.notified() => return ReadEnd::CloseRequested,
                    r = rd.readable() => if r.is_err() { return ReadEnd::PeerClosed },
                }
                let b = buf.get_or_insert_with(|| shared.buffers.get(read_size));
                if Buffers::spare(b) == 0 {
                    grow(&shared.buffers, b, b.len() * 2);
                }
                let room = Buffers::spare(b);
                (rd.try_read_buf(b), room)
            }
            ReadSide::Boxed(rd) => {
                let b = buf.get_or_insert_with(|| shared.buffers.get(read_size));
                if Buffers::spare(b) == 0 {
                    grow(&shared.buffers, b, b.len() * 2);
                }
                let room = Buffers::spare(b);
                // `read_buf` is cancel safe: nothing is lost if close wins.
                let r = tokio::select! {
                    biased;
                    _ = handle.close.notified() => return ReadEnd::CloseRequested,
                    r = rd.read_buf(b) => r,
                };
                (r, room)
            }
        };
        let Some(b) = buf.as_mut() else {
            continue;
        };
        let (read, room) = read;
        match read {
            Ok(0) => return ReadEnd::PeerClosed,
            Ok(n) => {
                shared.bytes_in.set(shared.bytes_in.get() + n as u64);
                if n == room {
                    read_size = (read_size * 2).min(READ_MAX);
                } else if n < room / 4 {
                    read_size = (read_size / 2).max(READ_MIN);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return ReadEnd::PeerClosed,
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
                continue;
            }
            Frame::Invalid(e) => {
                shared
                    .broker
                    .borrow_mut()
                    .handle_decode_error(Instant::now(), id, e);
                shared.dispatch();
                return ReadEnd::CloseRequested;
            }
            Frame::Complete(_) => {}
        }
        let Some(filled) = buf.take() else {
            continue;
        };
        let bytes = Buffers::freeze(filled);
        let mut off = 0;
        let end = loop {
            match zerofan_codec::frame(&bytes[off..], max) {
                Frame::Complete(len) => {
                    let packet = bytes.slice(off..off + len);
                    off += len;
                    let now = Instant::now();
                    let mut broker = shared.broker.borrow_mut();
                    let protocol = broker.protocol(id);
                    match zerofan_codec::decode(packet, protocol) {
                        Ok(p) => broker.handle_packet(now, id, p),
                        Err(e) => broker.handle_decode_error(now, id, e),
                    }
                    if broker.is_closing(id) {
                        break Some(ReadEnd::CloseRequested);
                    }
                }
                Frame::NeedMore(more) => {
                    let tail = &bytes[off..];
                    if !tail.is_empty() {
                        let whole = tail.len() + more;
                        let mut fresh = shared
                            .buffers
                            .get(whole.min(PREALLOC_MAX.max(tail.len() * 2)).max(read_size));
                        fresh.put_slice(tail);
                        buf = Some(fresh);
                    }
                    break None;
                }
                Frame::Invalid(e) => {
                    shared
                        .broker
                        .borrow_mut()
                        .handle_decode_error(Instant::now(), id, e);
                    break Some(ReadEnd::CloseRequested);
                }
            }
        };
        shared.dispatch();
        if let Some(end) = end {
            return end;
        }
    }
}

/// Replace `b` with a buffer of at least `min` bytes holding the same data.
fn grow(buffers: &Buffers, b: &mut ReadBuf, min: usize) {
    let mut bigger = buffers.get(min.max(READ_MIN));
    bigger.put_slice(&b[..]);
    *b = bigger;
}

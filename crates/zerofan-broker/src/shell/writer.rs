//! A connection's output side: drains the core's outbox in batches, encodes
//! control packets and PUBLISH headers into the thread's shared scratch
//! buffer, and sends headers and shared payloads together with vectored
//! writes. A PUBLISH that goes out as it was received (`core::Wire`) is sent
//! from the publisher's read buffer, adjacent ones as one chunk. Driven by
//! the connection's one task (see `conn.rs`).

use super::ops::Ops;
use super::state::Shared;
use crate::core::{ConnId, Outgoing, Transmit, Wire};
use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;
use tokio::io::AsyncWrite;

/// Items taken from the core per batch.
const BATCH: usize = 256;
/// Scratch space the thread's encoder allocates at a time when it runs out.
/// Shared by every connection (each batch takes what it encodes, `split`
/// off), so an idle connection holds none and a 4-byte CONNACK costs 4
/// bytes of it.
const SCRATCH: usize = 4 * 1024;
/// Payloads up to this size are copied into the scratch buffer after their
/// header instead of being sent as an iovec of their own.
const COPY_AT_MOST: usize = 256;
/// Iovecs per `writev` call (well under every IOV_MAX).
const IOVECS: usize = 512;
/// Iovecs of the small array used when a batch has no more chunks.
const FEW_IOVECS: usize = 16;

/// What every connection's writer borrows for the length of one batch:
/// nothing here is held across an await, so one set serves the thread.
#[derive(Default)]
pub struct Encoder {
    batch: Vec<Outgoing>,
    scratch: BytesMut,
    /// Encoded chunks of the batch being written.
    pub chunks: VecDeque<Bytes>,
}

impl Encoder {
    /// Take one batch from the core and encode it into `self.chunks`:
    /// headers and control packets in scratch chunks, payloads shared. With
    /// `vectored` false (TLS, WebSocket) the batch becomes one chunk.
    pub fn fill(&mut self, shared: &Shared, id: ConnId, vectored: bool) -> Transmit {
        let (status, protocol) = {
            let mut broker = shared.broker.borrow_mut();
            let status = broker.poll_transmit(Instant::now(), id, &mut self.batch, BATCH);
            (status, broker.protocol(id))
        };
        if self.batch.is_empty() {
            return status;
        }
        let scratch = &mut self.scratch;
        if scratch.capacity() - scratch.len() < 256 {
            scratch.reserve(SCRATCH);
        }
        // A run of packets sent as received that lay one after the other in
        // one read buffer (see `Wire`): one chunk, however many packets. The
        // scratch holds what comes before it.
        let mut run: Option<Run> = None;
        for item in self.batch.drain(..) {
            if let Outgoing::Publish(d) = &item {
                if let Some(w) = d.wire(protocol) {
                    add_wire(&mut run, w, scratch, &mut self.chunks);
                    continue;
                }
            }
            end_run(&mut run, scratch, &mut self.chunks);
            match item {
                Outgoing::Packet(p) => {
                    if let Err(e) = zerofan_codec::encode(&p, protocol, scratch) {
                        if let Some(suppressed) = Ops::log_gate(shared, "cannot encode packet") {
                            tracing::warn!(%id, error = %e, suppressed, "cannot encode packet");
                        }
                    }
                }
                ack @ Outgoing::Ack { .. } => {
                    if let Some(p) = ack.control_packet() {
                        if let Err(e) = zerofan_codec::encode(&p, protocol, scratch) {
                            if let Some(suppressed) = Ops::log_gate(shared, "cannot encode ack") {
                                tracing::warn!(%id, error = %e, suppressed, "cannot encode ack");
                            }
                        }
                    }
                }
                Outgoing::Publish(d) => {
                    if let Err(e) =
                        zerofan_codec::encode_publish_header(&d.header(), protocol, scratch)
                    {
                        if let Some(suppressed) =
                            Ops::log_gate(shared, "cannot encode publish header")
                        {
                            tracing::warn!(%id, error = %e, suppressed, "cannot encode publish header");
                        }
                        continue;
                    }
                    let payload = &d.message.payload;
                    if payload.len() <= COPY_AT_MOST {
                        // Small: copied next to its header. An iovec of its
                        // own (and a refcount up and down) costs more than
                        // copying a few hundred bytes.
                        scratch.extend_from_slice(payload);
                        continue;
                    }
                    // Headers so far go as one chunk, the payload as its own:
                    // shared with every other subscriber, never copied.
                    self.chunks.push_back(scratch.split().freeze());
                    self.chunks.push_back(payload.clone());
                }
            }
        }
        end_run(&mut run, scratch, &mut self.chunks);
        if !scratch.is_empty() {
            self.chunks.push_back(scratch.split().freeze());
        }
        if !vectored && self.chunks.len() > 1 {
            let total = self.chunks.iter().map(Bytes::len).sum();
            let mut one = BytesMut::with_capacity(total);
            for c in self.chunks.drain(..) {
                one.extend_from_slice(&c);
            }
            self.chunks.push_back(one.freeze());
        }
        status
    }
}

/// Packets sent as received that lay one after the other in one read
/// buffer: `buf[start..end]`, written as one chunk. (Not a [`Wire`]: a
/// run of several packets is no message's plain delivery. Extending it
/// moves `end` and takes no reference count.)
#[derive(Debug)]
struct Run {
    buf: Bytes,
    start: usize,
    end: usize,
}

impl Run {
    /// Whether `w` lies right after the run in the same buffer.
    fn takes(&self, w: &Wire) -> bool {
        let (buf, start, _) = w.span();
        start == self.end && buf.as_ptr() == self.buf.as_ptr()
    }
}

/// Add a packet sent as received to the open run when it lies right after
/// it, else close the run and open one with it.
fn add_wire(run: &mut Option<Run>, w: &Wire, scratch: &mut BytesMut, chunks: &mut VecDeque<Bytes>) {
    match run {
        Some(r) if r.takes(w) => r.end = w.span().2,
        _ => {
            end_run(run, scratch, chunks);
            let (buf, start, end) = w.span();
            *run = Some(Run {
                buf: buf.clone(),
                start,
                end,
            });
        }
    }
}

/// Close the open run, if any: a short one is copied after the scratch's
/// bytes (like a small payload), a longer one goes as a chunk of its own
/// after them, never copied.
fn end_run(run: &mut Option<Run>, scratch: &mut BytesMut, chunks: &mut VecDeque<Bytes>) {
    let Some(r) = run.take() else {
        return;
    };
    if r.end - r.start <= COPY_AT_MOST {
        scratch.extend_from_slice(&r.buf[r.start..r.end]);
        return;
    }
    if !scratch.is_empty() {
        chunks.push_back(scratch.split().freeze());
    }
    chunks.push_back(r.buf.slice(r.start..r.end));
}

/// Write chunks until all are written or the stream would block (the waker
/// is then registered), handling partial writes; adds the bytes written to
/// `written` either way. The iovec array lives only inside this call, so it
/// never becomes part of a (per-connection, long-lived) future.
pub(super) fn poll_write_chunks<W: AsyncWrite + Unpin + ?Sized>(
    cx: &mut Context<'_>,
    wr: &mut W,
    chunks: &mut VecDeque<Bytes>,
    written: &mut usize,
) -> Poll<io::Result<()>> {
    while !chunks.is_empty() {
        // Most batches are a few chunks (runs of packets sent as received
        // are one each): a small array then, rather than filling 8 KiB of
        // iovecs per call.
        let mut n = if chunks.len() <= FEW_IOVECS {
            ready!(poll_writev::<FEW_IOVECS, W>(cx, wr, chunks))?
        } else {
            ready!(poll_writev::<IOVECS, W>(cx, wr, chunks))?
        };
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        *written += n;
        while n > 0 {
            let Some(front) = chunks.front_mut() else {
                break;
            };
            if front.len() <= n {
                n -= front.len();
                chunks.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
    Poll::Ready(Ok(()))
}

/// One `writev` of the first `N` chunks at most.
fn poll_writev<const N: usize, W: AsyncWrite + Unpin + ?Sized>(
    cx: &mut Context<'_>,
    wr: &mut W,
    chunks: &VecDeque<Bytes>,
) -> Poll<io::Result<usize>> {
    let mut slices = [IoSlice::new(&[]); N];
    let mut count = 0;
    for (slot, chunk) in slices.iter_mut().zip(chunks.iter()) {
        *slot = IoSlice::new(chunk);
        count += 1;
    }
    Pin::new(&mut *wr).poll_write_vectored(cx, &slices[..count])
}

/// Write every chunk with as few `writev` calls as the socket allows,
/// handling partial writes. Returns the bytes written.
pub async fn write_chunks<W: AsyncWrite + Unpin>(
    wr: &mut W,
    chunks: &mut VecDeque<Bytes>,
) -> io::Result<usize> {
    let mut total = 0;
    std::future::poll_fn(|cx| poll_write_chunks(cx, wr, chunks, &mut total)).await?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A sink that accepts at most 3 bytes per call, to exercise partial writes.
    struct Trickle(Vec<u8>);

    impl tokio::io::AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(3);
            self.0.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// `n` QoS 0 PUBLISH packets of `size`-byte payloads back to back, as
    /// a read buffer holds them, and where each lies.
    fn packets(n: usize, size: usize) -> (Bytes, Vec<(usize, usize)>) {
        let mut b = BytesMut::new();
        let mut at = Vec::new();
        for i in 0..n {
            let start = b.len();
            let p = zerofan_codec::Publish {
                topic: zerofan_codec::MqttStr::from_static("t"),
                payload: Bytes::from(vec![i as u8; size]),
                ..Default::default()
            };
            zerofan_codec::encode(
                &zerofan_codec::Packet::Publish(p),
                zerofan_codec::Protocol::V311,
                &mut b,
            )
            .unwrap();
            at.push((start, b.len()));
        }
        (b.freeze(), at)
    }

    #[test]
    fn adjacent_packets_leave_as_one_chunk_of_the_read_buffer() {
        let (buf, at) = packets(3, 1024);
        let (other, other_at) = packets(1, 1024);
        let mut run = None;
        let mut scratch = BytesMut::new();
        let mut chunks = VecDeque::new();
        for &(s, e) in &at {
            add_wire(
                &mut run,
                &Wire::candidate(&buf, s, e).unwrap(),
                &mut scratch,
                &mut chunks,
            );
        }
        // Not adjacent: the run of three ends, a new one starts.
        let w = Wire::candidate(&other, other_at[0].0, other_at[0].1).unwrap();
        add_wire(&mut run, &w, &mut scratch, &mut chunks);
        end_run(&mut run, &mut scratch, &mut chunks);
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0], buf);
        // The chunk is the read buffer itself, not a copy.
        assert_eq!(chunks[0].as_ptr(), buf.as_ptr());
        assert_eq!(chunks[1], other);
        assert!(scratch.is_empty());
    }

    #[test]
    fn a_gap_or_a_step_back_in_the_same_buffer_ends_the_run() {
        let (buf, at) = packets(3, 1024);
        let mut run = None;
        let mut scratch = BytesMut::new();
        let mut chunks = VecDeque::new();
        for i in [0, 2, 1] {
            let w = Wire::candidate(&buf, at[i].0, at[i].1).unwrap();
            add_wire(&mut run, &w, &mut scratch, &mut chunks);
        }
        end_run(&mut run, &mut scratch, &mut chunks);
        let want: Vec<Bytes> = [0, 2, 1]
            .iter()
            .map(|&i| buf.slice(at[i].0..at[i].1))
            .collect();
        assert_eq!(chunks, want);
    }

    #[test]
    fn short_runs_are_copied_after_what_precedes_them() {
        let (buf, at) = packets(2, 10);
        let mut run = None;
        let mut scratch = BytesMut::from(&b"ack"[..]);
        let mut chunks = VecDeque::new();
        add_wire(
            &mut run,
            &Wire::candidate(&buf, at[0].0, at[0].1).unwrap(),
            &mut scratch,
            &mut chunks,
        );
        add_wire(
            &mut run,
            &Wire::candidate(&buf, at[1].0, at[1].1).unwrap(),
            &mut scratch,
            &mut chunks,
        );
        end_run(&mut run, &mut scratch, &mut chunks);
        assert!(chunks.is_empty());
        assert_eq!(&scratch[..3], b"ack");
        assert_eq!(&scratch[3..], &buf[..]);
    }

    #[test]
    fn partial_writes_keep_order() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut sink = Trickle(Vec::new());
        let mut chunks: VecDeque<Bytes> = ["ab", "cdefg", "", "h", "ijklmnop"]
            .iter()
            .map(|s| Bytes::from_static(s.as_bytes()))
            .collect();
        let n = rt.block_on(write_chunks(&mut sink, &mut chunks)).unwrap();
        assert_eq!(n, 16);
        assert_eq!(sink.0, b"abcdefghijklmnop");

        // More chunks than one writev takes (the large iovec array).
        let want: Vec<u8> = (0..1500u32).map(|i| i as u8).collect();
        let mut chunks: VecDeque<Bytes> = want.chunks(2).map(Bytes::copy_from_slice).collect();
        let mut sink = Trickle(Vec::new());
        let n = rt.block_on(write_chunks(&mut sink, &mut chunks)).unwrap();
        assert_eq!(n, want.len());
        assert_eq!(sink.0, want);
    }
}

//! A connection's output side: drains the core's outbox in batches, encodes
//! control packets and PUBLISH headers into the thread's shared scratch
//! buffer, and sends headers and shared payloads together with vectored
//! writes. Driven by the connection's one task (see `conn.rs`).

use super::ops::Ops;
use super::state::Shared;
use crate::core::{ConnId, Outgoing, Transmit};
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
        for item in self.batch.drain(..) {
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

/// Write chunks until all are written or the stream would block (the waker
/// is then registered), handling partial writes; adds the bytes written to
/// `written` either way. The iovec array lives only inside this call, so it
/// never becomes part of a (per-connection, long-lived) future.
pub fn poll_write_chunks<W: AsyncWrite + Unpin + ?Sized>(
    cx: &mut Context<'_>,
    wr: &mut W,
    chunks: &mut VecDeque<Bytes>,
    written: &mut usize,
) -> Poll<io::Result<()>> {
    while !chunks.is_empty() {
        let mut slices = [IoSlice::new(&[]); IOVECS];
        let mut count = 0;
        for (slot, chunk) in slices.iter_mut().zip(chunks.iter()) {
            *slot = IoSlice::new(chunk);
            count += 1;
        }
        let mut n = ready!(Pin::new(&mut *wr).poll_write_vectored(cx, &slices[..count]))?;
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
    }
}

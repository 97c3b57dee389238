//! A connection's writer: drains the core's outbox in batches, encodes
//! control packets and PUBLISH headers into one scratch buffer, and sends
//! headers and shared payloads together with vectored writes.

use super::ops::Ops;
use super::state::{ConnHandle, Shared};
use crate::core::{ConnId, Outgoing, Transmit};
use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::rc::Rc;
use std::time::Instant;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Items taken from the core per batch.
const BATCH: usize = 256;
/// Scratch space reserved per batch for headers and control packets; a
/// written batch's space is reclaimed, not reallocated.
const SCRATCH: usize = 4 * 1024;
/// Iovecs per `writev` call (well under every IOV_MAX).
const IOVECS: usize = 64;

/// Run until the core says close (after flushing) or the connection is gone.
/// `vectored`: the stream does real vectored writes (plain TCP); otherwise
/// (TLS, WebSocket) each batch is copied into one buffer, written, flushed.
pub async fn writer_loop<W: AsyncWrite + Unpin>(
    shared: Rc<Shared>,
    id: ConnId,
    handle: Rc<ConnHandle>,
    mut wr: W,
    vectored: bool,
) {
    let mut batch = Vec::new();
    // Grows on first use: an idle connection keeps no scratch space.
    let mut scratch = BytesMut::new();
    let mut chunks: VecDeque<Bytes> = VecDeque::new();
    loop {
        let (status, protocol) = {
            let mut broker = shared.broker.borrow_mut();
            let status = broker.poll_transmit(Instant::now(), id, &mut batch, BATCH);
            (status, broker.protocol(id))
        };
        if status == Transmit::Gone {
            return;
        }
        if batch.is_empty() {
            if status == Transmit::Close {
                let _ = wr.shutdown().await;
                return;
            }
            // Idle: give the scratch space back instead of holding it.
            scratch = BytesMut::new();
            batch = Vec::new();
            handle.write.notified().await;
            continue;
        }
        scratch.reserve(SCRATCH);
        for item in batch.drain(..) {
            match item {
                Outgoing::Packet(p) => {
                    if let Err(e) = zerofan_codec::encode(&p, protocol, &mut scratch) {
                        if let Some(suppressed) = Ops::log_gate(&shared, "cannot encode packet") {
                            tracing::warn!(%id, error = %e, suppressed, "cannot encode packet");
                        }
                    }
                }
                ack @ Outgoing::Ack { .. } => {
                    if let Some(p) = ack.control_packet() {
                        if let Err(e) = zerofan_codec::encode(&p, protocol, &mut scratch) {
                            if let Some(suppressed) = Ops::log_gate(&shared, "cannot encode ack") {
                                tracing::warn!(%id, error = %e, suppressed, "cannot encode ack");
                            }
                        }
                    }
                }
                Outgoing::Publish(d) => {
                    if let Err(e) =
                        zerofan_codec::encode_publish_header(&d.header(), protocol, &mut scratch)
                    {
                        if let Some(suppressed) =
                            Ops::log_gate(&shared, "cannot encode publish header")
                        {
                            tracing::warn!(%id, error = %e, suppressed, "cannot encode publish header");
                        }
                        continue;
                    }
                    // Headers so far go as one chunk, the payload as its own:
                    // shared with every other subscriber, never copied.
                    chunks.push_back(scratch.split().freeze());
                    if !d.message.payload.is_empty() {
                        chunks.push_back(d.message.payload.clone());
                    }
                }
            }
        }
        if !scratch.is_empty() {
            chunks.push_back(scratch.split().freeze());
        }
        if !vectored && chunks.len() > 1 {
            let total = chunks.iter().map(Bytes::len).sum();
            let mut one = BytesMut::with_capacity(total);
            for c in chunks.drain(..) {
                one.extend_from_slice(&c);
            }
            chunks.push_back(one.freeze());
        }
        let written = match write_chunks(&mut wr, &mut chunks).await {
            Ok(n) if !vectored => wr.flush().await.map(|()| n),
            r => r,
        };
        match written {
            Ok(n) => shared.bytes_out.set(shared.bytes_out.get() + n as u64),
            Err(_) => {
                chunks.clear();
                // The peer is gone; let the reader report it.
                handle.close.notify_one();
                return;
            }
        }
        handle.drained.notify_one();
        if status == Transmit::Close {
            let _ = wr.shutdown().await;
            return;
        }
    }
}

/// Write every chunk with as few `writev` calls as the socket allows,
/// handling partial writes. Returns the bytes written.
pub async fn write_chunks<W: AsyncWrite + Unpin>(
    wr: &mut W,
    chunks: &mut VecDeque<Bytes>,
) -> io::Result<usize> {
    let mut total = 0;
    while !chunks.is_empty() {
        // The iovec array is built inside the poll, so it never becomes part
        // of the (per-connection, long-lived) future.
        let mut n = std::future::poll_fn(|cx| {
            let mut slices = [IoSlice::new(&[]); IOVECS];
            let mut count = 0;
            for (slot, chunk) in slices.iter_mut().zip(chunks.iter()) {
                *slot = IoSlice::new(chunk);
                count += 1;
            }
            std::pin::Pin::new(&mut *wr).poll_write_vectored(cx, &slices[..count])
        })
        .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        total += n;
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

//! The write path: queued chunks (small headers, shared payloads) go out
//! with vectored writes, many packets per system call, and nothing is copied
//! on the way (TCP and TLS; WebSocket frames them once).

use bytes::{Buf, Bytes};
use std::collections::VecDeque;
use std::io::IoSlice;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::delivery::PublishAck;
use crate::error::ClientError;

/// Slices handed to one `write_vectored` call.
const MAX_IOV: usize = 128;

type Qos0Done = oneshot::Sender<Result<PublishAck, ClientError>>;

pub(crate) struct Writer {
    chunks: VecDeque<Bytes>,
    /// Bytes queued in `chunks`.
    queued: usize,
    /// Total bytes ever queued / written on this connection.
    queued_total: u64,
    written_total: u64,
    /// QoS 0 completions, fired once `written_total` reaches the offset.
    qos0: VecDeque<(u64, Qos0Done)>,
    needs_flush: bool,
}

impl Writer {
    pub fn new() -> Self {
        Writer {
            chunks: VecDeque::new(),
            queued: 0,
            queued_total: 0,
            written_total: 0,
            qos0: VecDeque::new(),
            needs_flush: false,
        }
    }

    /// Queue a chunk (empty ones are skipped).
    pub fn push(&mut self, b: Bytes) {
        if b.is_empty() {
            return;
        }
        self.queued += b.len();
        self.queued_total += b.len() as u64;
        self.chunks.push_back(b);
    }

    /// Complete `done` once everything queued so far has been written.
    pub fn on_written(&mut self, done: Qos0Done) {
        self.qos0.push_back((self.queued_total, done));
    }

    /// Bytes waiting to be written.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Something to write or flush.
    pub fn has_work(&self) -> bool {
        !self.chunks.is_empty() || self.needs_flush
    }

    /// One step: a vectored write, or a flush when everything is written.
    /// Cancel safe: a write that did not complete wrote nothing.
    pub async fn step<W: AsyncWrite + Unpin>(&mut self, wr: &mut W) -> std::io::Result<usize> {
        if self.chunks.is_empty() {
            wr.flush().await?;
            self.needs_flush = false;
            return Ok(0);
        }
        let n = {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let mut k = 0;
            for c in self.chunks.iter().take(MAX_IOV) {
                iov[k] = IoSlice::new(c);
                k += 1;
            }
            wr.write_vectored(&iov[..k]).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        self.consume(n);
        Ok(n)
    }

    fn consume(&mut self, mut n: usize) {
        self.queued -= n;
        self.written_total += n as u64;
        self.needs_flush = true;
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            if front.len() <= n {
                n -= front.len();
                self.chunks.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
        while let Some((at, _)) = self.qos0.front() {
            if *at > self.written_total {
                break;
            }
            if let Some((_, done)) = self.qos0.pop_front() {
                let _ = done.send(Ok(PublishAck {
                    packet_id: 0,
                    reason: zerofan_codec::ReasonCode::SUCCESS,
                    properties: Default::default(),
                }));
            }
        }
    }

    /// Write and flush everything queued (used before a clean disconnect).
    pub async fn drain<W: AsyncWrite + Unpin>(&mut self, wr: &mut W) -> std::io::Result<()> {
        while self.has_work() {
            self.step(wr).await?;
        }
        Ok(())
    }

    /// The connection is gone: unwritten QoS 0 messages fail.
    pub fn fail_all(&mut self) {
        self.chunks.clear();
        self.queued = 0;
        for (_, done) in self.qos0.drain(..) {
            let _ = done.send(Err(ClientError::ConnectionLost));
        }
    }
}

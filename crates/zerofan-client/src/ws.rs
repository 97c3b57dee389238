//! MQTT over WebSocket: a WebSocket connection seen as a byte stream.
//!
//! Binary messages are read as a stream of bytes (an MQTT packet may span
//! messages, and a message may hold several packets); each vectored write
//! becomes one binary message. The WebSocket path copies bytes once into
//! the message, which the protocol's framing makes unavoidable.

use crate::error::ClientError;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Sink, Stream};
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// A WebSocket connection adapted to `AsyncRead + AsyncWrite`.
pub(crate) struct WsStream<S> {
    inner: WebSocketStream<S>,
    /// Rest of the binary message being read.
    rd: Bytes,
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsStream<S> {
    /// Upgrade `stream` to a WebSocket at `url` with subprotocol `mqtt`.
    pub(crate) async fn handshake(url: &str, stream: S) -> Result<Self, ClientError> {
        let mut req = url
            .into_client_request()
            .map_err(|e| ClientError::WebSocket(e.to_string()))?;
        req.headers_mut()
            .insert("Sec-WebSocket-Protocol", HeaderValue::from_static("mqtt"));
        let (inner, _resp) = tokio_tungstenite::client_async(req, stream)
            .await
            .map_err(|e| ClientError::WebSocket(e.to_string()))?;
        Ok(WsStream {
            inner,
            rd: Bytes::new(),
        })
    }
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.rd.is_empty() {
                let n = self.rd.len().min(buf.remaining());
                buf.put_slice(&self.rd[..n]);
                self.rd.advance(n);
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.inner).poll_next(cx)) {
                None | Some(Ok(Message::Close(_))) => return Poll::Ready(Ok(())),
                Some(Ok(Message::Binary(b))) => self.rd = b,
                Some(Ok(_)) => {} // ping/pong handled by tungstenite; text ignored
                Some(Err(e)) => return Poll::Ready(Err(io_err(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(Pin::new(&mut self.inner).poll_ready(cx)).map_err(io_err)?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut msg = BytesMut::with_capacity(total);
        for b in bufs {
            msg.extend_from_slice(b);
        }
        Pin::new(&mut self.inner)
            .start_send(Message::Binary(msg.freeze()))
            .map_err(io_err)?;
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx).map_err(io_err)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx).map_err(io_err)
    }
}

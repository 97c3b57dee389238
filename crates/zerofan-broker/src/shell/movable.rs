//! A TLS or WebSocket connection that can move to another shard: the TCP
//! socket at the bottom of its stream stack is a [`Socket`], which can
//! leave this thread's runtime and join another's, while everything above
//! it (the TLS session with its buffered records, the WebSocket codec with
//! the frames it read ahead) moves along as it is, untouched.

use super::listener::AsyncStream;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The TCP socket under a TLS / WebSocket stream.
#[derive(Debug)]
pub enum Socket {
    /// Registered with this thread's runtime.
    Live(TcpStream),
    /// Out of any runtime, on its way to another shard.
    Detached(std::net::TcpStream),
    /// Lost while moving (the runtime could not let go of it).
    Gone,
}

impl Socket {
    /// Leave this runtime (the stream is not polled again until
    /// [`Socket::attach`] on the destination's thread).
    pub fn detach(&mut self) -> io::Result<()> {
        match std::mem::replace(self, Socket::Gone) {
            Socket::Live(s) => {
                *self = Socket::Detached(s.into_std()?);
                Ok(())
            }
            other => {
                *self = other;
                Ok(())
            }
        }
    }

    /// Join the runtime of the calling thread.
    pub fn attach(&mut self) -> io::Result<()> {
        match std::mem::replace(self, Socket::Gone) {
            Socket::Detached(s) => {
                *self = Socket::Live(TcpStream::from_std(s)?);
                Ok(())
            }
            other => {
                *self = other;
                Ok(())
            }
        }
    }

    fn live(&mut self) -> io::Result<&mut TcpStream> {
        match self {
            Socket::Live(s) => Ok(s),
            _ => Err(io::ErrorKind::NotConnected.into()),
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut().live() {
            Ok(s) => Pin::new(s).poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().live() {
            Ok(s) => Pin::new(s).poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().live() {
            Ok(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().live() {
            Ok(s) => Pin::new(s).poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().live() {
            Ok(s) => Pin::new(s).poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncStream for Socket {
    fn socket(&mut self) -> Option<&mut Socket> {
        Some(self)
    }
}

impl AsyncStream for tokio_rustls::server::TlsStream<Socket> {
    fn socket(&mut self) -> Option<&mut Socket> {
        Some(self.get_mut().0)
    }
}

impl<S: AsyncStream> AsyncStream for super::ws::WsStream<S> {
    fn socket(&mut self) -> Option<&mut Socket> {
        self.inner_mut().socket()
    }
}

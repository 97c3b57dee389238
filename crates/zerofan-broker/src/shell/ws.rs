//! MQTT over WebSocket: the upgrade (path `/mqtt`, subprotocol `mqtt`) and
//! an adapter that turns the message stream back into a byte stream, so
//! WebSocket connections go through the same framing and decoding as TCP.
//! MQTT packets may span several binary messages or share one; each write
//! of the connection's writer (one coalesced batch) becomes one message.

use bytes::{Buf, Bytes};
use futures_util::{Sink, Stream};
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// The path MQTT clients connect to.
pub const PATH: &str = "/mqtt";

/// Accept the WebSocket upgrade on `stream`: path `/mqtt` (query allowed),
/// subprotocol `mqtt` echoed when offered (`mqttv3.1` too, for old
/// clients). `max_message` bounds one WebSocket message.
pub async fn accept<S>(stream: S, max_message: usize) -> Result<WsStream<S>, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    #[allow(clippy::result_large_err)] // the signature tungstenite asks for
    let callback = |req: &Request, mut resp: Response| -> Result<Response, ErrorResponse> {
        if req.uri().path() != PATH {
            let mut e = ErrorResponse::new(Some(format!("MQTT is served at {PATH}\n")));
            *e.status_mut() = StatusCode::NOT_FOUND;
            return Err(e);
        }
        let offered = req
            .headers()
            .get_all("sec-websocket-protocol")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .find(|p| *p == "mqtt" || *p == "mqttv3.1")
            .map(str::to_owned);
        if let Some(p) = offered {
            if let Ok(v) = HeaderValue::from_str(&p) {
                resp.headers_mut().insert("sec-websocket-protocol", v);
            }
        }
        Ok(resp)
    };
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(max_message);
    config.max_frame_size = Some(max_message);
    let ws = tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config))
        .await
        .map_err(|e| e.to_string())?;
    Ok(WsStream {
        ws,
        pending: Bytes::new(),
    })
}

/// A WebSocket connection as a byte stream (binary messages only).
pub struct WsStream<S> {
    ws: WebSocketStream<S>,
    /// The rest of the last message read.
    pending: Bytes,
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsStream<S> {
    /// The stream under the WebSocket codec.
    pub fn inner_mut(&mut self) -> &mut S {
        self.ws.get_mut()
    }
}

fn io_err(e: tokio_tungstenite::tungstenite::Error) -> io::Error {
    io::Error::other(e)
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                buf.put_slice(&self.pending[..n]);
                self.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(b))) => self.pending = b,
                Some(Ok(Message::Close(_))) | None => return Poll::Ready(Ok(())),
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "MQTT over WebSocket needs binary messages",
                    )))
                }
                Some(Ok(_)) => {} // ping / pong: answered by tungstenite
                Some(Err(e)) => return Poll::Ready(Err(io_err(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(io_err)?;
        Pin::new(&mut self.ws)
            .start_send(Message::Binary(Bytes::copy_from_slice(buf)))
            .map_err(io_err)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_flush(cx).map_err(io_err)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_close(cx).map_err(io_err)
    }
}

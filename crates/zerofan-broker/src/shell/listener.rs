//! One accept loop per listener, and what happens between `accept` and the
//! first MQTT byte: the PROXY protocol header, the TLS handshake (client
//! certificate identity for `use_identity_as_username`), the WebSocket
//! upgrade. Each runs in the connection's own task under
//! `connect_timeout`, so a slow or hostile client holds up nobody else. A
//! failure closes that connection only, is counted, and logged at debug.

use super::conn::connection;
use super::movable::Socket;
use super::proxy;
use super::state::Shared;
use super::ws;
use crate::core::ConnectionMeta;
use crate::listen_config::ListenerProtocol;
use crate::security::{certificate_cn, PreparedListener};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

/// Any byte stream a connection can run over (TLS, WebSocket, a bridge's
/// pipe). `Send`: one over a [`Socket`] moves to its owner shard whole.
pub trait AsyncStream: AsyncRead + AsyncWrite + Unpin + Send {
    /// The TCP socket at the bottom, when the stream can move to another
    /// shard (see `movable.rs`).
    fn socket(&mut self) -> Option<&mut Socket> {
        None
    }
}

/// A boxed byte stream.
pub type BoxStream = Box<dyn AsyncStream>;

/// A connection's transport: plain TCP (split into owned halves, vectored
/// writes, no buffer held while idle) or anything else, boxed.
pub enum Transport {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS and/or WebSocket.
    Boxed(BoxStream),
    /// Handed to the parking lot (see `park.rs`): the task is ending.
    Parked,
}

/// Listen on `addr` with a queue of `backlog` connections not accepted yet
/// (`listen_backlog`): a storm of connections beyond it has its SYNs
/// dropped and retried by the clients' kernels, seconds later.
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted broker rebinds at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog.max(1))
}

/// Which setup step failed.
enum Failure {
    Proxy(proxy::ProxyError),
    Tls(std::io::Error),
    Ws(String),
}

/// Accept connections on `listener` (index `index` in the configuration)
/// until the task is aborted.
pub async fn accept_loop(
    shared: Rc<Shared>,
    listener: TcpListener,
    index: usize,
    prepared: Rc<PreparedListener>,
) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let plain = prepared.tls.is_none()
                    && !prepared.config.proxy_protocol
                    && prepared.config.protocol == ListenerProtocol::Mqtt;
                if plain {
                    let meta = ConnectionMeta {
                        listener: index,
                        identity: None,
                        ..ConnectionMeta::default()
                    };
                    tokio::task::spawn_local(connection(
                        shared.clone(),
                        Transport::Tcp(stream),
                        peer,
                        meta,
                    ));
                } else {
                    tokio::task::spawn_local(setup(
                        shared.clone(),
                        stream,
                        peer,
                        index,
                        prepared.clone(),
                    ));
                }
            }
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn setup(
    shared: Rc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    index: usize,
    prepared: Rc<PreparedListener>,
) {
    let (limit, max_packet) = {
        let b = shared.broker.borrow();
        (
            Duration::from_secs(b.config().connect_timeout),
            b.config().max_packet_size as usize,
        )
    };
    let result = tokio::time::timeout(limit, handshake(stream, peer, &prepared, max_packet)).await;
    let (transport, peer, identity) = match result {
        Ok(Ok(done)) => done,
        Ok(Err(failure)) => {
            let mut b = shared.broker.borrow_mut();
            let m = &mut b.metrics_mut().security;
            match failure {
                Failure::Proxy(e) => {
                    m.proxy_header_errors += 1;
                    tracing::debug!(%peer, error = %e, "PROXY header refused");
                }
                Failure::Tls(e) => {
                    m.tls_handshake_failures += 1;
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                }
                Failure::Ws(e) => {
                    m.ws_handshake_failures += 1;
                    tracing::debug!(%peer, error = %e, "WebSocket upgrade failed");
                }
            }
            return;
        }
        Err(_) => {
            shared.broker.borrow_mut().metrics_mut().connect_timeouts += 1;
            tracing::debug!(%peer, "connection setup timed out");
            return;
        }
    };
    let meta = ConnectionMeta {
        listener: index,
        identity,
        ..ConnectionMeta::default()
    };
    connection(shared, transport, peer, meta).await;
}

async fn handshake(
    mut stream: TcpStream,
    mut peer: SocketAddr,
    prepared: &PreparedListener,
    max_packet: usize,
) -> Result<(Transport, SocketAddr, Option<String>), Failure> {
    if prepared.config.proxy_protocol {
        if let Some(addr) = proxy::read_header(&mut stream)
            .await
            .map_err(Failure::Proxy)?
        {
            peer = addr;
        }
    }
    let ws_max = max_packet.saturating_add(16).max(1024);
    let websockets = prepared.config.protocol == ListenerProtocol::Websockets;
    match &prepared.tls {
        None => {
            if websockets {
                let ws = ws::accept(Socket::Live(stream), ws_max)
                    .await
                    .map_err(Failure::Ws)?;
                Ok((Transport::Boxed(Box::new(ws)), peer, None))
            } else {
                Ok((Transport::Tcp(stream), peer, None))
            }
        }
        Some(cfg) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(cfg.clone());
            let tls = acceptor
                .accept(Socket::Live(stream))
                .await
                .map_err(Failure::Tls)?;
            let identity = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| certificate_cn(c));
            if websockets {
                let ws = ws::accept(tls, ws_max).await.map_err(Failure::Ws)?;
                Ok((Transport::Boxed(Box::new(ws)), peer, identity))
            } else {
                Ok((Transport::Boxed(Box::new(tls)), peer, identity))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn the_listen_backlog_is_the_one_configured() {
        // Linux queues backlog + 1 connections that are not accepted; the
        // SYN of the next is dropped, so it cannot complete its handshake.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let l = super::bind("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let addr = l.local_addr().unwrap();
        let connect = || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300));
        let queued: Vec<_> = (0..3).map(|_| connect().unwrap()).collect();
        assert!(connect().is_err(), "a fourth connection was queued");
        drop(queued);
    }
}

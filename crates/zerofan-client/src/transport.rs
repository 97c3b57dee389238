//! Where the bytes go: TCP, TLS (rustls) or WebSocket, all seen by the rest
//! of the client as one boxed `AsyncRead + AsyncWrite` stream.

use crate::error::ClientError;
use crate::ws::WsStream;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::ServerName;

/// A byte stream the event loop can read and write, whatever the transport.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// A byte stream opened by a [`Connector`].
pub type BoxedIo = Box<dyn Io>;

/// What a [`Connector`] returns: the opened stream, later.
pub type ConnectFuture = Pin<Box<dyn Future<Output = std::io::Result<BoxedIo>> + Send>>;

/// Opens a byte stream for each connection attempt, for transports the
/// client does not know: an in-memory pipe into a broker in the same
/// process, failover over several addresses, a proxy.
#[derive(Clone)]
pub struct Connector(Arc<dyn Fn() -> ConnectFuture + Send + Sync>);

impl Connector {
    /// `open` is called once per attempt (the first connect and every
    /// reconnect).
    pub fn new(open: impl Fn() -> ConnectFuture + Send + Sync + 'static) -> Self {
        Connector(Arc::new(open))
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connector")
    }
}

/// TLS settings shared by the TLS and secure WebSocket transports.
#[derive(Clone, Debug)]
pub struct TlsSettings {
    /// Name the server certificate must carry (SNI and verification).
    pub server_name: String,
    /// rustls configuration; build one with [`TlsSettings::with_roots`] or
    /// bring your own (client certificates, custom verifiers, ...).
    pub config: Arc<rustls::ClientConfig>,
}

impl TlsSettings {
    /// Verify the server against `roots` (the caller chooses the trust
    /// anchors: a private CA, `webpki-roots`, the OS store...), using the
    /// ring crypto provider and no client certificate.
    pub fn with_roots(
        server_name: impl Into<String>,
        roots: rustls::RootCertStore,
    ) -> Result<Self, ClientError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(TlsSettings {
            server_name: server_name.into(),
            config: Arc::new(config),
        })
    }
}

/// How to reach the broker. Cloned into every reconnect attempt.
#[derive(Clone, Debug)]
pub enum Transport {
    /// MQTT over plain TCP to `host:port`.
    Tcp {
        /// `host:port`.
        addr: String,
    },
    /// MQTT over TLS to `host:port`.
    Tls {
        /// `host:port`.
        addr: String,
        /// Server name and rustls configuration.
        tls: TlsSettings,
    },
    /// MQTT over WebSocket (subprotocol `mqtt`), optionally over TLS.
    WebSocket {
        /// `host:port` to open the TCP connection to.
        addr: String,
        /// Request path, e.g. `/mqtt`.
        path: String,
        /// `Some` for `wss://`.
        tls: Option<TlsSettings>,
    },
    /// Whatever the [`Connector`] opens.
    Custom(Connector),
}

impl Transport {
    /// Plain TCP.
    pub fn tcp(addr: impl Into<String>) -> Self {
        Transport::Tcp { addr: addr.into() }
    }

    /// TLS with the given settings.
    pub fn tls(addr: impl Into<String>, tls: TlsSettings) -> Self {
        Transport::Tls {
            addr: addr.into(),
            tls,
        }
    }

    /// WebSocket (`ws://addr/path`).
    pub fn websocket(addr: impl Into<String>, path: impl Into<String>) -> Self {
        Transport::WebSocket {
            addr: addr.into(),
            path: path.into(),
            tls: None,
        }
    }

    /// Secure WebSocket (`wss://addr/path`).
    pub fn websocket_tls(
        addr: impl Into<String>,
        path: impl Into<String>,
        tls: TlsSettings,
    ) -> Self {
        Transport::WebSocket {
            addr: addr.into(),
            path: path.into(),
            tls: Some(tls),
        }
    }

    /// Open the byte stream (TCP connect, TLS and WebSocket handshakes).
    pub(crate) async fn open(&self) -> Result<Box<dyn Io>, ClientError> {
        match self {
            Transport::Tcp { addr } => Ok(Box::new(tcp(addr).await?)),
            Transport::Custom(c) => Ok((c.0)().await?),
            Transport::Tls { addr, tls } => Ok(Box::new(tls_over(tcp(addr).await?, tls).await?)),
            Transport::WebSocket { addr, path, tls } => {
                let scheme = if tls.is_some() { "wss" } else { "ws" };
                let host = match tls {
                    Some(t) => format!("{}:{}", t.server_name, port_of(addr)),
                    None => addr.clone(),
                };
                let path = if path.starts_with('/') {
                    path.clone()
                } else {
                    format!("/{path}")
                };
                let url = format!("{scheme}://{host}{path}");
                let stream = tcp(addr).await?;
                match tls {
                    Some(t) => Ok(Box::new(
                        WsStream::handshake(&url, tls_over(stream, t).await?).await?,
                    )),
                    None => Ok(Box::new(WsStream::handshake(&url, stream).await?)),
                }
            }
        }
    }
}

fn port_of(addr: &str) -> &str {
    addr.rsplit_once(':').map(|(_, p)| p).unwrap_or("443")
}

async fn tcp(addr: &str) -> Result<TcpStream, ClientError> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

async fn tls_over(
    s: TcpStream,
    tls: &TlsSettings,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ClientError> {
    let name = ServerName::try_from(tls.server_name.clone())
        .map_err(|e| ClientError::Tls(format!("bad server name: {e}")))?;
    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
    connector
        .connect(name, s)
        .await
        .map_err(|e| ClientError::Tls(e.to_string()))
}

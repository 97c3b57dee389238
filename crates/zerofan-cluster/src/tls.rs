//! Mutual TLS between nodes (`[cluster] tls = { cert, key, ca }`): every
//! node-to-node connection (Raft, admin, links, the `zerofan cluster` CLI)
//! is TLS, both ends present a certificate, and each verifies the other's
//! against `ca`.
//!
//! The CA is the cluster's own: any certificate it signed is a node. Names
//! in certificates are not matched against addresses (nodes are dialed by
//! whatever address the membership holds, maybe a proxy's), so the trust is
//! in the CA alone; keep it for the cluster and nothing else.

use crate::cluster::ClusterError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The TLS settings of a node (or of the CLI talking to one): its own
/// certificate and key, and the CA every peer's certificate must chain to.
#[derive(Clone)]
pub struct ClusterTls {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterTls")
    }
}

fn read_file(what: &str, path: &Path) -> Result<Vec<u8>, ClusterError> {
    std::fs::read(path).map_err(|e| {
        ClusterError::Config(format!(
            "cannot read cluster TLS {what} {}: {e}",
            path.display()
        ))
    })
}

/// The certificates in PEM text `pem` (at least one); errors start with
/// `what` (a file's name). Also the bridges' loader.
pub fn certs(what: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut &pem[..]).collect();
    let certs = certs.map_err(|e| format!("{what}: bad PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what}: no certificate in it"));
    }
    Ok(certs)
}

impl ClusterTls {
    /// Read the PEM files: errors name the file and what is wrong with it.
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<ClusterTls, ClusterError> {
        let (c, k, a) = (
            read_file("cert", cert)?,
            read_file("key", key)?,
            read_file("ca", ca)?,
        );
        Self::from_pem_named(
            &c,
            &k,
            &a,
            [
                &format!("cluster TLS cert {}", cert.display()),
                &format!("cluster TLS key {}", key.display()),
                &format!("cluster TLS ca {}", ca.display()),
            ],
        )
        .map_err(ClusterError::Config)
    }

    /// From PEM text: certificate chain (the node's first), private key,
    /// CA certificates.
    pub fn from_pem(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<ClusterTls, ClusterError> {
        Self::from_pem_named(
            cert,
            key,
            ca,
            ["cluster TLS cert", "cluster TLS key", "cluster TLS ca"],
        )
        .map_err(ClusterError::Config)
    }

    fn from_pem_named(
        cert: &[u8],
        key: &[u8],
        ca: &[u8],
        [cert_name, key_name, ca_name]: [&str; 3],
    ) -> Result<ClusterTls, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certs(cert_name, cert)?;
        let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key[..])
            .map_err(|e| format!("{key_name}: bad PEM: {e}"))?
            .ok_or_else(|| format!("{key_name}: no private key in it"))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca_name, ca)? {
            roots.add(c).map_err(|e| format!("{ca_name}: {e}"))?;
        }
        let roots = Arc::new(roots);
        let client_verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| format!("{ca_name}: {e}"))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| format!("{cert_name} / {key_name}: {e}"))?;
        let server_verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| format!("{ca_name}: {e}"))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyName(server_verifier)))
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("{cert_name} / {key_name}: {e}"))?;
        Ok(ClusterTls {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }
}

/// The chain is verified against the CA as usual; the name in the
/// certificate need not match the address dialed (see the module doc). Also
/// a bridge's `bridge_insecure`.
#[derive(Debug)]
pub struct AnyName(Arc<rustls::client::WebPkiServerVerifier>);

impl AnyName {
    /// `inner`'s verification, less the name check.
    pub fn new(inner: Arc<rustls::client::WebPkiServerVerifier>) -> AnyName {
        AnyName(inner)
    }
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// A node-to-node connection: plain TCP, or TLS over it.
pub enum NodeStream {
    /// Without TLS.
    Plain(TcpStream),
    /// Mutual TLS, handshake done.
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl std::fmt::Debug for NodeStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodeStream::Plain(_) => "NodeStream::Plain",
            NodeStream::Tls(_) => "NodeStream::Tls",
        })
    }
}

impl AsyncRead for NodeStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for NodeStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            NodeStream::Plain(s) => s.is_write_vectored(),
            NodeStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_flush(cx),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Open a connection to `addr` within `ttl` (TCP and, with `tls`, the
/// handshake).
pub(crate) async fn connect(
    addr: &str,
    tls: Option<&ClusterTls>,
    ttl: Duration,
) -> io::Result<NodeStream> {
    let timed_out =
        |what: &str| io::Error::new(io::ErrorKind::TimedOut, format!("{what} timed out"));
    let tcp = timeout(ttl, TcpStream::connect(addr))
        .await
        .map_err(|_| timed_out("connect"))??;
    tcp.set_nodelay(true)?;
    let Some(tls) = tls else {
        return Ok(NodeStream::Plain(tcp));
    };
    // The name only selects what the peer is told (SNI); it is not checked.
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_string())
        .unwrap_or_else(|_| ServerName::try_from("zerofan-node").expect("a valid DNS name"));
    let s = timeout(
        ttl,
        TlsConnector::from(tls.client.clone()).connect(name, tcp),
    )
    .await
    .map_err(|_| timed_out("TLS handshake"))?
    .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, format!("TLS: {e}")))?;
    Ok(NodeStream::Tls(Box::new(s.into())))
}

/// The server side of the handshake on an accepted connection.
pub(crate) async fn accept(
    tcp: TcpStream,
    tls: Option<&ClusterTls>,
    ttl: Duration,
) -> io::Result<NodeStream> {
    let _ = tcp.set_nodelay(true);
    let Some(tls) = tls else {
        return Ok(NodeStream::Plain(tcp));
    };
    let s = timeout(ttl, TlsAcceptor::from(tls.server.clone()).accept(tcp))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    Ok(NodeStream::Tls(Box::new(s.into())))
}

//! rustls settings from MQTT.js-style TLS options.
//!
//! - `ca`: PEM text of the certificate authorities to trust (one or more
//!   certificates per string). Without it, the Mozilla roots
//!   (`webpki-roots`) are trusted, as Node's own default store does.
//! - `servername`: the name the certificate must carry (default: host).
//! - `rejectUnauthorized: false`: accept any certificate, as in Node.
//!   For tests against self-signed brokers only.

use crate::arg_err;
use napi::Result;
use std::sync::Arc;
use zerofan_client::rustls;
use zerofan_client::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use zerofan_client::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use zerofan_client::rustls::{DigitallySignedStruct, SignatureScheme};
use zerofan_client::TlsSettings;

/// TLS settings for `server_name` from the options.
pub fn settings(
    server_name: &str,
    ca: Option<&[String]>,
    reject_unauthorized: bool,
) -> Result<TlsSettings> {
    if !reject_unauthorized {
        return Ok(insecure(server_name));
    }
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(pems) if !pems.is_empty() => {
            for pem in pems {
                let mut rd = pem.as_bytes();
                let mut n = 0;
                for cert in rustls_pemfile::certs(&mut rd) {
                    let cert = cert.map_err(|e| arg_err(format!("ca: bad PEM: {e}")))?;
                    roots
                        .add(cert)
                        .map_err(|e| arg_err(format!("ca: bad certificate: {e}")))?;
                    n += 1;
                }
                if n == 0 {
                    return Err(arg_err("ca: no certificate in PEM text"));
                }
            }
        }
        _ => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    TlsSettings::with_roots(server_name, roots).map_err(crate::js_err)
}

fn insecure(server_name: &str) -> TlsSettings {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(AcceptAnyCert(provider.clone()));
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map(|b| {
            b.dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth()
        });
    let config = match config {
        Ok(c) => c,
        // The ring provider supports the default versions; this arm only
        // keeps the function total.
        Err(_) => rustls::ClientConfig::builder()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))))
            .with_no_client_auth(),
    };
    TlsSettings {
        server_name: server_name.to_string(),
        config: Arc::new(config),
    }
}

/// `rejectUnauthorized: false`: any certificate chain is accepted, but the
/// handshake signatures are still checked (the peer holds the key of the
/// certificate it sent).
#[derive(Debug)]
struct AcceptAnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

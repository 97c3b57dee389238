//! TLS towards the remote broker: `bridge_cafile`, `bridge_certfile` /
//! `bridge_keyfile`, `bridge_insecure`.

use super::config::BridgeConfig;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use std::path::Path;
use std::sync::Arc;

/// The client configuration for `cfg`, or `None` without TLS. Read at
/// start and by `--test-config`, so a missing file stops the broker there.
pub(super) fn client_config(
    cfg: &BridgeConfig,
) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
    let Some(ca) = &cfg.cafile else {
        return Ok(None);
    };
    let who = format!("bridge {:?}", cfg.name);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certs(ca).map_err(|e| format!("{who}: {e}"))? {
        roots
            .add(c)
            .map_err(|e| format!("{who}: cafile {}: {e}", ca.display()))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if cfg.insecure {
        let inner =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{who}: {e}"))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyName(inner)))
    } else {
        builder.with_root_certificates(roots)
    };
    let config = match (&cfg.certfile, &cfg.keyfile) {
        (Some(cert), Some(key)) => {
            let certs = read_certs(cert).map_err(|e| format!("{who}: {e}"))?;
            let pem = std::fs::read(key)
                .map_err(|e| format!("{who}: cannot read keyfile {}: {e}", key.display()))?;
            let key = rustls_pemfile::private_key(&mut &pem[..])
                .map_err(|e| format!("{who}: keyfile: bad PEM: {e}"))?
                .ok_or_else(|| format!("{who}: keyfile: no private key in it"))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| format!("{who}: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Some(Arc::new(config)))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut &text[..]).collect();
    let certs = certs.map_err(|e| format!("{}: bad PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// `bridge_insecure`: the chain is verified as usual, but the name in the
/// certificate need not match the address.
#[derive(Debug)]
struct AnyName(Arc<rustls::client::WebPkiServerVerifier>);

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

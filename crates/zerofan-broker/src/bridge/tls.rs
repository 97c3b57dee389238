//! TLS towards the remote broker: `bridge_cafile`, `bridge_certfile` /
//! `bridge_keyfile`, `bridge_insecure` (whose verifier, and the PEM
//! reading, the cluster's node-to-node TLS shares).

use super::config::BridgeConfig;
use rustls::pki_types::CertificateDer;
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
            .with_custom_certificate_verifier(Arc::new(zerofan_cluster::AnyName::new(inner)))
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
    zerofan_cluster::pem_certs(&path.display().to_string(), &text)
}

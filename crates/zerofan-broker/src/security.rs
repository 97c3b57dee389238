//! Reading the files security needs (password file, ACL, certificates and
//! keys) into what the core ([`SecurityConfig`]) and the listeners (rustls
//! server configurations) use. Everything a configuration names is read
//! and checked here, so `--test-config` finds every problem the broker
//! would meet at start.

use crate::config::Config;
use crate::core::{ListenerAuth, SecurityConfig};
use crate::listen_config::{ListenerConfig, TlsConfig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zerofan_auth::{Acl, PasswordFile, ThrottleConfig};

/// A file named by the configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// Cannot be read.
    #[error("cannot read {what} {path}: {source}")]
    Io {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Read, but wrong inside.
    #[error("{path}:{line}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// 1-based line (0: the file as a whole).
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// `auth_jwt` keys that cannot be used.
    #[error("{0}")]
    Jwt(String),
    /// TLS settings rustls refuses.
    #[error("listener {bind}: TLS: {message}")]
    Tls {
        /// The listener's address.
        bind: String,
        /// What rustls said.
        message: String,
    },
}

/// One listener ready to bind: its settings and, for TLS, its rustls
/// server configuration.
#[derive(Clone, Debug)]
pub struct PreparedListener {
    /// The settings.
    pub config: ListenerConfig,
    /// TLS server configuration, for a TLS listener.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Everything loaded from the files.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// For the core.
    pub core: SecurityConfig,
    /// For the shell, in [`Config::listeners`] order (the core's listener
    /// indexes).
    pub listeners: Vec<PreparedListener>,
}

/// Read every file the configuration names.
pub fn load(config: &Config) -> Result<Loaded, SecurityError> {
    let mut passwords: HashMap<PathBuf, Arc<PasswordFile>> = HashMap::new();
    let mut acls: HashMap<PathBuf, Arc<Acl>> = HashMap::new();
    let mut core = SecurityConfig {
        listeners: Vec::new(),
        throttle: ThrottleConfig::default(),
        jwt: match &config.auth_jwt {
            Some(j) => Some(Arc::new(j.load().map_err(SecurityError::Jwt)?)),
            None => None,
        },
        http: config.auth_http.as_ref().map(|h| Arc::new(h.settings())),
    };
    let mut listeners = Vec::new();
    for l in config.listeners() {
        let pw_path = l.password_file.as_ref().or(config.password_file.as_ref());
        let acl_path = l.acl_file.as_ref().or(config.acl_file.as_ref());
        let pw = match pw_path {
            Some(p) => Some(match passwords.get(p) {
                Some(f) => f.clone(),
                None => {
                    let f = Arc::new(read_passwords(p)?);
                    passwords.insert(p.clone(), f.clone());
                    f
                }
            }),
            None => None,
        };
        let acl = match acl_path {
            Some(p) => Some(match acls.get(p) {
                Some(a) => a.clone(),
                None => {
                    let a = Arc::new(read_acl(p)?);
                    acls.insert(p.clone(), a.clone());
                    a
                }
            }),
            None => None,
        };
        let tls = match &l.tls {
            Some(t) => Some(server_config(t).map_err(|message| SecurityError::Tls {
                bind: l.bind.to_string(),
                message,
            })?),
            None => None,
        };
        core.listeners.push(ListenerAuth {
            allow_anonymous: l.effective_allow_anonymous(config.allow_anonymous),
            passwords: pw,
            acl,
            use_identity_as_username: l.tls.as_ref().is_some_and(|t| t.use_identity_as_username),
            max_connections: l.max_connections,
        });
        listeners.push(PreparedListener { config: l, tls });
    }
    Ok(Loaded { core, listeners })
}

fn read(what: &'static str, path: &Path) -> Result<String, SecurityError> {
    std::fs::read_to_string(path).map_err(|source| SecurityError::Io {
        what,
        path: path.display().to_string(),
        source,
    })
}

fn parse_error(path: &Path, e: zerofan_auth::ParseError) -> SecurityError {
    SecurityError::Parse {
        path: path.display().to_string(),
        line: e.line,
        message: e.message,
    }
}

/// Read a mosquitto password file.
pub fn read_passwords(path: &Path) -> Result<PasswordFile, SecurityError> {
    let text = read("password_file", path)?;
    PasswordFile::parse(&text).map_err(|e| parse_error(path, e))
}

/// Read a mosquitto ACL file; its warnings are logged.
pub fn read_acl(path: &Path) -> Result<Acl, SecurityError> {
    let text = read("acl_file", path)?;
    let acl = Acl::parse(&text).map_err(|e| parse_error(path, e))?;
    for (line, w) in acl.warnings() {
        tracing::warn!("{}:{line}: {w}", path.display());
    }
    Ok(acl)
}

fn read_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    let text =
        std::fs::read(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut &text[..]).collect();
    let certs = certs.map_err(|e| format!("{what} {}: bad PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{what} {}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// The rustls server configuration for a TLS listener.
pub fn server_config(t: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = read_certs("cert", &t.cert)?;
    let key_pem =
        std::fs::read(&t.key).map_err(|e| format!("cannot read key {}: {e}", t.key.display()))?;
    let key = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| format!("key {}: bad PEM: {e}", t.key.display()))?
        .ok_or_else(|| format!("key {}: no private key in it", t.key.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &t.ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in read_certs("ca", ca)? {
                roots
                    .add(c)
                    .map_err(|e| format!("ca {}: {e}", ca.display()))?;
            }
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            let v = if t.require_certificate {
                v
            } else {
                v.allow_unauthenticated()
            };
            let verifier = v.build().map_err(|e| e.to_string())?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("cert/key: {e}"))?;
    Ok(Arc::new(config))
}

/// The Common Name of a DER X.509 certificate's subject (the last CN when
/// there are several), read with a minimal bounds-checked DER walk.
pub fn certificate_cn(der: &[u8]) -> Option<String> {
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE {...}, ... }
    let (cert, _) = der_take(der, 0x30)?;
    let (tbs, _) = der_take(cert, 0x30)?;
    let mut rest = tbs;
    // [0] EXPLICIT version, optional
    if rest.first() == Some(&0xa0) {
        rest = der_take(rest, 0xa0)?.1;
    }
    rest = der_any(rest)?.1; // serialNumber
    rest = der_any(rest)?.1; // signature AlgorithmIdentifier
    rest = der_any(rest)?.1; // issuer
    rest = der_any(rest)?.1; // validity
    let (mut subject, _) = der_take(rest, 0x30)?;
    let mut cn = None;
    // Name ::= SEQUENCE OF RelativeDistinguishedName (SET OF AttributeTypeAndValue)
    while !subject.is_empty() {
        let (mut set, after) = der_take(subject, 0x31)?;
        subject = after;
        while !set.is_empty() {
            let (atv, after) = der_take(set, 0x30)?;
            set = after;
            let (oid, value) = der_take(atv, 0x06)?;
            if oid == [0x55, 0x04, 0x03] {
                let (tag, content, _) = der_split(value)?;
                // UTF8String, PrintableString, IA5String, T61String
                if matches!(tag, 0x0c | 0x13 | 0x16 | 0x14) {
                    cn = Some(String::from_utf8_lossy(content).into_owned());
                }
            }
        }
    }
    cn
}

/// (tag, content, rest) of the first DER element.
fn der_split(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *b.first()?;
    let first = *b.get(1)?;
    let (len, hdr) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | usize::from(*b.get(2 + i)?);
        }
        (len, 2 + n)
    };
    let end = hdr.checked_add(len)?;
    let content = b.get(hdr..end)?;
    Some((tag, content, &b[end..]))
}

fn der_take(b: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (t, content, rest) = der_split(b)?;
    (t == tag).then_some((content, rest))
}

fn der_any(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (_, content, rest) = der_split(b)?;
    Some((content, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cn_of_generated_certificate() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "zerofan");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "device-17");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(certificate_cn(cert.der()).as_deref(), Some("device-17"));
    }

    #[test]
    fn cn_of_garbage_is_none() {
        assert_eq!(certificate_cn(&[]), None);
        assert_eq!(certificate_cn(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(certificate_cn(&[0x30, 0x03, 0x30, 0x01, 0x00]), None);
    }

    #[test]
    fn missing_files_are_named() {
        let c = Config {
            password_file: Some("/nonexistent/passwd".into()),
            ..Config::default()
        };
        let e = load(&c).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/passwd"), "{e}");
    }
}

//! TLS (rustls, roots from a CA made with rcgen), mutual TLS, WebSocket and
//! secure WebSocket, against both the zerofan binary (`[[listener]]` tables)
//! and mosquitto, plus plain TCP against zerofan for comparison.

mod common;

use bytes::Bytes;
use common::{tmpdir, within, Broker, Kind, BOTH};
use rcgen::{BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair};
use std::sync::Arc;
use zerofan_client::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use zerofan_client::rustls::{self, RootCertStore};
use zerofan_client::{Client, ClientError, ClientOptions, Protocol, QoS, TlsSettings, Transport};

const SIZES: &[usize] = &[10, 70_000, 1_000_000];
/// mosquitto 2.0.11's WebSocket listeners (ws and wss) send large messages
/// to this client at about 20-40 KB/s on loopback, while the same client
/// sends them to mosquitto at full speed; so the WebSocket tests keep their
/// messages small.
const WS_SIZES: &[usize] = &[10, 30_000];

/// The zerofan broker's WebSocket listeners have no such limit.
const ZEROFAN_WS_SIZES: &[usize] = SIZES;

struct Pki {
    roots: RootCertStore,
    /// Server certificate and key files.
    cert: String,
    key: String,
    /// CA certificate file (for verifying client certificates).
    ca_file: String,
    ca: Certificate,
    ca_key: KeyPair,
    dir: std::path::PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "zerofan test CA");
    let ca = ca_params.self_signed(&ca_key).expect("ca cert");
    let key = KeyPair::generate().expect("key");
    let params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    let cert = params.signed_by(&key, &ca, &ca_key).expect("cert");
    let dir = tmpdir("pki");
    let cert_path = dir.join("server.pem");
    let key_path = dir.join("server.key");
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    let ca_path = dir.join("ca.pem");
    std::fs::write(&ca_path, ca.pem()).expect("write ca");
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).expect("add root");
    Pki {
        roots,
        cert: cert_path.display().to_string(),
        key: key_path.display().to_string(),
        ca_file: ca_path.display().to_string(),
        ca,
        ca_key,
        dir,
    }
}

impl Pki {
    /// TLS settings trusting this CA, without a client certificate.
    fn client(&self) -> TlsSettings {
        TlsSettings::with_roots("localhost", self.roots.clone()).expect("tls settings")
    }

    /// TLS settings trusting `server`'s CA and presenting a client
    /// certificate (CN `cn`) signed by this CA.
    fn client_with_cert(&self, server: &Pki, cn: &str) -> TlsSettings {
        let key = KeyPair::generate().expect("client key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("client cert");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(server.roots.clone())
            .with_client_auth_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .expect("client auth cert");
        TlsSettings {
            server_name: "localhost".to_string(),
            config: Arc::new(config),
        }
    }
}

/// TOML path string.
fn toml_str(path: &str) -> String {
    format!("{path:?}")
}

/// `tls = { ... }` for a zerofan `[[listener]]` table; with `mutual`, client
/// certificates from this CA are required.
fn zerofan_tls(p: &Pki, mutual: bool) -> String {
    let mut s = format!(
        "tls = {{ cert = {}, key = {}",
        toml_str(&p.cert),
        toml_str(&p.key)
    );
    if mutual {
        s += &format!(
            ", ca = {}, require_certificate = true",
            toml_str(&p.ca_file)
        );
    }
    s + " }\n"
}

/// mosquitto listener lines for TLS; with `mutual`, client certificates
/// from this CA are required.
fn mosquitto_tls(p: &Pki, mutual: bool) -> String {
    let mut s = format!("certfile {}\nkeyfile {}", p.cert, p.key);
    if mutual {
        s += &format!("\ncafile {}\nrequire_certificate true", p.ca_file);
    }
    s
}

/// A broker with a TLS listener; returns it and the TLS listener's address.
fn tls_broker(kind: Kind, p: &Pki, mutual: bool) -> (Broker, String) {
    match kind {
        Kind::Zerofan => {
            let b = Broker::zerofan_config(&format!(
                "[[listener]]\nbind = \"127.0.0.1:0\"\nallow_anonymous = true\n{}",
                zerofan_tls(p, mutual)
            ));
            let addr = b.listener("mqtt+tls");
            (b, addr)
        }
        Kind::Mosquitto => {
            let b = Broker::mosquitto(&mosquitto_tls(p, mutual));
            let addr = b.addr();
            (b, addr)
        }
    }
}

/// A broker with a WebSocket listener (`wss` with `tls`); returns it and
/// the WebSocket listener's address.
fn ws_broker(kind: Kind, tls: Option<&Pki>) -> (Broker, String) {
    match kind {
        Kind::Zerofan => {
            let t = tls.map(|p| zerofan_tls(p, false)).unwrap_or_default();
            let b = Broker::zerofan_config(&format!(
                "[[listener]]\nbind = \"127.0.0.1:0\"\nprotocol = \"websockets\"\n\
                 allow_anonymous = true\n{t}"
            ));
            let addr = b.listener(if tls.is_some() {
                "websockets+tls"
            } else {
                "websockets"
            });
            (b, addr)
        }
        Kind::Mosquitto => {
            let b = Broker::mosquitto_ws(&tls.map(|p| mosquitto_tls(p, false)).unwrap_or_default());
            let addr = b.ws_addr();
            (b, addr)
        }
    }
}

fn ws_sizes(kind: Kind) -> &'static [usize] {
    match kind {
        Kind::Zerofan => ZEROFAN_WS_SIZES,
        Kind::Mosquitto => WS_SIZES,
    }
}

async fn exercise(transport: Transport, protocol: Protocol, sizes: &[usize]) {
    let (c, mut inc) = Client::connect(ClientOptions::with_transport(transport).protocol(protocol))
        .await
        .expect("connect");
    c.subscribe("tr/#", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    for &size in sizes {
        let body = Bytes::from((0..size).map(|i| (i % 253) as u8).collect::<Vec<u8>>());
        let ack = c
            .publish("tr/x", QoS::AtLeastOnce, body.clone())
            .await
            .expect("publish")
            .await
            .expect("ack");
        assert!(!ack.reason.is_error());
        let m = within(10, "message", inc.recv()).await.expect("message");
        assert_eq!(m.payload, body);
        let ack = c
            .publish_with("tr/y", QoS::ExactlyOnce, |b| b.extend_from_slice(&body))
            .await
            .expect("publish")
            .await
            .expect("ack");
        assert!(!ack.reason.is_error());
        let m = within(10, "message", inc.recv()).await.expect("message");
        assert_eq!(m.payload, body);
    }
    c.disconnect().await.expect("disconnect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_against_both() {
    for kind in BOTH {
        let p = pki();
        let (_b, addr) = tls_broker(kind, &p, false);
        exercise(
            Transport::tls(addr.clone(), p.client()),
            Protocol::V5,
            SIZES,
        )
        .await;
        exercise(Transport::tls(addr, p.client()), Protocol::V311, SIZES).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_refuses_an_unknown_ca() {
    for kind in BOTH {
        let p = pki();
        let other = pki();
        let (_b, addr) = tls_broker(kind, &p, false);
        let r = Client::connect(ClientOptions::with_transport(Transport::tls(
            addr,
            other.client(),
        )))
        .await;
        assert!(matches!(r, Err(ClientError::Tls(_))), "{kind:?}: {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_against_both() {
    for kind in BOTH {
        let p = pki();
        let (_b, addr) = tls_broker(kind, &p, true);
        let tls = p.client_with_cert(&p, "alice");
        exercise(
            Transport::tls(addr.clone(), tls.clone()),
            Protocol::V5,
            SIZES,
        )
        .await;
        exercise(Transport::tls(addr, tls), Protocol::V311, &SIZES[..1]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_a_missing_or_foreign_certificate() {
    for kind in BOTH {
        let p = pki();
        let rogue = pki();
        let (_b, addr) = tls_broker(kind, &p, true);
        // No client certificate; then one from another CA.
        for tls in [p.client(), rogue.client_with_cert(&p, "mallory")] {
            let r = Client::connect(ClientOptions::with_transport(Transport::tls(
                addr.clone(),
                tls,
            )))
            .await;
            assert!(
                r.is_err(),
                "{kind:?}: connected without a valid certificate"
            );
        }
        // The broker still serves a client with a good certificate.
        exercise(
            Transport::tls(addr, p.client_with_cert(&p, "bob")),
            Protocol::V5,
            &SIZES[..1],
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_against_both() {
    for kind in BOTH {
        let (_b, addr) = ws_broker(kind, None);
        exercise(
            Transport::websocket(addr.clone(), "/mqtt"),
            Protocol::V5,
            ws_sizes(kind),
        )
        .await;
        exercise(
            Transport::websocket(addr, "/mqtt"),
            Protocol::V311,
            ws_sizes(kind),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_websocket_against_both() {
    for kind in BOTH {
        let p = pki();
        let (_b, addr) = ws_broker(kind, Some(&p));
        exercise(
            Transport::websocket_tls(addr.clone(), "/mqtt", p.client()),
            Protocol::V5,
            ws_sizes(kind),
        )
        .await;
        if kind == Kind::Zerofan {
            exercise(
                Transport::websocket_tls(addr, "/mqtt", p.client()),
                Protocol::V311,
                ws_sizes(kind),
            )
            .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_against_zerofan() {
    let b = Broker::zerofan();
    exercise(Transport::tcp(b.addr()), Protocol::V5, SIZES).await;
}

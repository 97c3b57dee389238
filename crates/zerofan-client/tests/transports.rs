//! TLS (rustls, roots from a CA made with rcgen), WebSocket and secure
//! WebSocket, against mosquitto (the zerofan broker has no TLS or WebSocket
//! listener yet), plus plain TCP against zerofan for comparison.

mod common;

use bytes::Bytes;
use common::{tmpdir, within, Broker};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use zerofan_client::rustls::RootCertStore;
use zerofan_client::{Client, ClientError, ClientOptions, Protocol, QoS, TlsSettings, Transport};

const SIZES: &[usize] = &[10, 70_000, 1_000_000];
/// mosquitto 2.0.11's WebSocket listeners (ws and wss) send large messages
/// to this client at about 20-40 KB/s on loopback, while the same client
/// sends them to mosquitto at full speed; so the WebSocket tests keep their
/// messages small.
const WS_SIZES: &[usize] = &[10, 30_000];

struct Pki {
    roots: RootCertStore,
    cert: String,
    key: String,
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
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).expect("add root");
    Pki {
        roots,
        cert: cert_path.display().to_string(),
        key: key_path.display().to_string(),
        dir,
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
async fn tls_against_mosquitto() {
    let p = pki();
    let b = Broker::mosquitto(&format!("certfile {}\nkeyfile {}", p.cert, p.key));
    let tls = TlsSettings::with_roots("localhost", p.roots.clone()).expect("tls settings");
    exercise(Transport::tls(b.addr(), tls.clone()), Protocol::V5, SIZES).await;
    exercise(Transport::tls(b.addr(), tls), Protocol::V311, SIZES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_refuses_an_unknown_ca() {
    let p = pki();
    let other = pki();
    let b = Broker::mosquitto(&format!("certfile {}\nkeyfile {}", p.cert, p.key));
    let tls = TlsSettings::with_roots("localhost", other.roots.clone()).expect("tls settings");
    let r = Client::connect(ClientOptions::with_transport(Transport::tls(b.addr(), tls))).await;
    assert!(matches!(r, Err(ClientError::Tls(_))), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_against_mosquitto() {
    let b = Broker::mosquitto_ws("");
    exercise(
        Transport::websocket(b.ws_addr(), "/mqtt"),
        Protocol::V5,
        WS_SIZES,
    )
    .await;
    exercise(
        Transport::websocket(b.ws_addr(), "/mqtt"),
        Protocol::V311,
        WS_SIZES,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_websocket_against_mosquitto() {
    let p = pki();
    let b = Broker::mosquitto_ws(&format!("certfile {}\nkeyfile {}", p.cert, p.key));
    let tls = TlsSettings::with_roots("localhost", p.roots.clone()).expect("tls settings");
    exercise(
        Transport::websocket_tls(b.ws_addr(), "/mqtt", tls),
        Protocol::V5,
        WS_SIZES,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_against_zerofan() {
    let b = Broker::zerofan();
    exercise(Transport::tcp(b.addr()), Protocol::V5, SIZES).await;
}

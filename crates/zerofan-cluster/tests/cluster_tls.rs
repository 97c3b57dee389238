//! Mutual TLS between nodes, with certificates made in the test: two nodes
//! of one CA form a cluster and link; a node whose certificate comes from
//! another CA, and a node without TLS, can neither join nor connect.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{sleep, timeout, Instant};
use zerofan_cluster::{Cluster, ClusterConfig, ClusterTls};

struct Ca {
    cert: Certificate,
    key: KeyPair,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let cert = p.self_signed(&key).unwrap();
    Ca { cert, key }
}

/// A node's TLS settings: a certificate `ca` signed, trusting `trust`.
fn node_tls(ca: &Ca, trust: &Ca, name: &str) -> ClusterTls {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec![name.to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = p.signed_by(&key, &ca.cert, &ca.key).unwrap();
    ClusterTls::from_pem(
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
        trust.cert.pem().as_bytes(),
    )
    .unwrap()
}

fn config(
    id: u64,
    dir: &tempfile::TempDir,
    join: Option<std::net::SocketAddr>,
    tls: Option<ClusterTls>,
) -> ClusterConfig {
    ClusterConfig {
        node_id: id,
        listen: "127.0.0.1:0".parse().unwrap(),
        join,
        data_dir: dir.path().join(format!("n{id}")),
        advertise: None,
        insecure: false,
        tls,
        lease: zerofan_cluster::DEFAULT_LEASE,
        advertise_cluster: None,
    }
}

async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "within 20 s: {what}");
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn two_nodes_over_mutual_tls_claim_and_link() {
    let dir = tempfile::tempdir().unwrap();
    let good = ca("cluster ca");
    let n1 = Cluster::start(config(1, &dir, None, Some(node_tls(&good, &good, "n1"))))
        .await
        .unwrap();
    let n2 = Cluster::start(config(
        2,
        &dir,
        Some(n1.local_addr()),
        Some(node_tls(&good, &good, "n2")),
    ))
    .await
    .unwrap();
    let mut members = n2.members();
    timeout(
        Duration::from_secs(20),
        members.wait_for(|m| m.nodes.len() == 2 && m.nodes.values().all(|n| n.voter)),
    )
    .await
    .expect("2 voters")
    .unwrap();
    // A claim forwarded to the leader and a Raft round trip, over TLS.
    assert_eq!(n2.claim("tls-client").await.unwrap().0, 2);
    until("node 1 applied the claim", || {
        n1.owner("tls-client").map(|o| o.0) == Some(2)
    })
    .await;

    // A link carries its bytes through TLS.
    let mut links = n2.take_links().unwrap();
    let mut out = n1.dial_link(2).await.unwrap();
    out.write_all(b"over tls").await.unwrap();
    out.flush().await.unwrap();
    let (from, mut inbound) = timeout(Duration::from_secs(5), links.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(from, 1);
    assert!(matches!(inbound, zerofan_cluster::NodeStream::Tls(_)));
    let mut buf = [0u8; 8];
    inbound.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"over tls");

    // The CLI's side: status needs a certificate too.
    let addr = n1.local_addr().to_string();
    let cli = node_tls(&good, &good, "cli");
    let s = zerofan_cluster::admin::status(&addr, Some(&cli))
        .await
        .unwrap();
    assert_eq!(s.members.len(), 2);
    assert_eq!(n1.tls_refused(), 0);
    let plain = zerofan_cluster::admin::status(&addr, None).await;
    assert!(plain.is_err(), "a plain status is refused: {plain:?}");
    until("the plain connection is counted", || n1.tls_refused() == 1).await;
    n1.shutdown().await;
    n2.shutdown().await;
}

#[tokio::test]
async fn a_node_of_another_ca_or_without_tls_cannot_join() {
    let dir = tempfile::tempdir().unwrap();
    let good = ca("cluster ca");
    let other = ca("someone else's ca");
    let n1 = Cluster::start(config(1, &dir, None, Some(node_tls(&good, &good, "n1"))))
        .await
        .unwrap();
    let seed = n1.local_addr();

    // Its own CA trusted, but its certificate is from another: refused by
    // node 1 (and node 1's is refused by it).
    let stranger = config(2, &dir, Some(seed), Some(node_tls(&other, &other, "n2")));
    // Trusting the cluster CA does not help a certificate it did not sign.
    let forged = config(3, &dir, Some(seed), Some(node_tls(&other, &good, "n3")));
    let plain = config(4, &dir, Some(seed), None);
    tokio::time::pause();
    for cfg in [stranger, forged, plain] {
        let id = cfg.node_id;
        let e = match timeout(Duration::from_secs(120), Cluster::start(cfg)).await {
            Ok(Err(e)) => e.to_string(),
            Ok(Ok(_)) => panic!("node {id} joined"),
            Err(_) => panic!("node {id}: join retries are not bounded"),
        };
        assert!(e.contains("could not join"), "node {id}: {e}");
    }
    tokio::time::resume();
    assert!(
        n1.tls_refused() >= 3,
        "refusals counted: {}",
        n1.tls_refused()
    );
    assert_eq!(n1.member_count(), 1);
    let cli = node_tls(&good, &good, "cli");
    let s = zerofan_cluster::admin::status(&seed.to_string(), Some(&cli))
        .await
        .unwrap();
    assert_eq!(s.members.len(), 1, "nobody joined");
    n1.shutdown().await;
}

#[test]
fn config_errors_name_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let good = ca("cluster ca");
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, good.cert.pem()).unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let e = ClusterTls::load(&missing, &junk, &ca_path)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot read cluster TLS cert") && e.contains("missing.pem"),
        "{e}"
    );
    let e = ClusterTls::load(&ca_path, &junk, &ca_path)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("key") && e.contains("junk.pem") && e.contains("no private key"),
        "{e}"
    );
    let e = ClusterTls::load(&junk, &junk, &ca_path)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cert") && e.contains("no certificate"), "{e}");
}

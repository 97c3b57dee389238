//! Three cluster nodes in one process over real loopback TCP: join,
//! claims forwarded to the leader, ownership-loss events, links, status.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{sleep, timeout, Instant};
use zerofan_cluster::{Cluster, ClusterConfig, OrphanClaim, OwnershipLost, Previous};

fn config(id: u64, dir: &tempfile::TempDir, join: Option<std::net::SocketAddr>) -> ClusterConfig {
    ClusterConfig {
        node_id: id,
        listen: "127.0.0.1:0".parse().unwrap(),
        join,
        data_dir: dir.path().join(format!("n{id}")),
        advertise: Some(format!("127.0.0.1:{}", 1880 + id).parse().unwrap()),
        insecure: false,
        tls: None,
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

/// Nodes 1 (the first leader), 2 and 3, once node 3 sees all three as
/// voters.
async fn three(dir: &tempfile::TempDir) -> (Cluster, Cluster, Cluster) {
    let n1 = Cluster::start(config(1, dir, None)).await.unwrap();
    let seed = Some(n1.local_addr());
    let n2 = Cluster::start(config(2, dir, seed)).await.unwrap();
    let n3 = Cluster::start(config(3, dir, seed)).await.unwrap();
    let mut members = n3.members();
    timeout(
        Duration::from_secs(20),
        members.wait_for(|m| m.nodes.len() == 3 && m.nodes.values().all(|n| n.voter)),
    )
    .await
    .expect("3 voters seen by node 3")
    .unwrap();
    (n1, n2, n3)
}

#[tokio::test]
async fn claims_fence_links_flow_and_status_names_everyone() {
    let dir = tempfile::tempdir().unwrap();
    let (n1, n2, n3) = three(&dir).await;
    assert_eq!(
        n3.members().borrow().nodes[&2].mqtt_addr.as_deref(),
        Some("127.0.0.1:1882")
    );

    // Node 2 claims (through the leader), then node 3 takes over: the epoch
    // rises and node 2 hears it lost the client id.
    let mut lost2 = n2.take_ownership_lost().expect("receiver");
    let mut fences2 = n2.take_fences().expect("fences");
    assert_eq!(n2.claim("sensor-7").await.unwrap(), (2, 1));
    // Taken from a live owner, which let go when fenced: not by its lease.
    let fenced = Previous {
        node: 2,
        epoch: 1,
        lapsed: false,
    };
    assert_eq!(
        n3.claim_starting("sensor-7", true).await.unwrap(),
        (3, 2, Some(fenced))
    );
    // The fence came first, saying the new client starts clean.
    let fence = OwnershipLost {
        client_id: "sensor-7".into(),
        new_owner: 3,
        epoch: 0,
        clean_start: true,
        lapsed: false,
        before: None,
    };
    assert_eq!(fences2.try_recv().ok(), Some(fence));
    // The log says so too, for an owner no fence reached (its lease ran
    // out).
    let ev = timeout(Duration::from_secs(10), lost2.recv())
        .await
        .unwrap();
    assert_eq!(
        ev,
        Some(OwnershipLost {
            client_id: "sensor-7".into(),
            new_owner: 3,
            epoch: 2,
            clean_start: true,
            lapsed: false,
            before: None,
        })
    );
    until("every node applied the takeover", || {
        [&n1, &n2, &n3]
            .iter()
            .all(|n| n.owner("sensor-7") == Some((3, 2)))
    })
    .await;
    assert_eq!(n1.fenced_takeovers(), 1);

    // A release with a stale epoch changes nothing; the owner's does, and a
    // later claim still rises above the released epoch.
    n1.release("sensor-7", 1).await.unwrap();
    assert_eq!(n3.claim("sensor-7").await.unwrap(), (3, 3));
    n3.release("sensor-7", 3).await.unwrap();
    assert_eq!(n1.claim("sensor-7").await.unwrap(), (1, 4));

    // A link from node 1 reaches node 2's broker side with its bytes.
    let mut links = n2.take_links().expect("links");
    let mut out = n1.dial_link(2).await.unwrap();
    out.write_all(b"batch").await.unwrap();
    let (from, mut inbound) = timeout(Duration::from_secs(5), links.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(from, 1);
    let mut buf = [0u8; 5];
    inbound.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"batch");

    // Status from any node is the leader's view, with every member healthy.
    let s = n3.status().await;
    assert_eq!(s.members.len(), 3);
    assert_eq!(s.members.iter().filter(|m| m.role == "leader").count(), 1);
    assert!(s.members.iter().all(|m| m.healthy), "{s:?}");
    assert_eq!(s.leader_id, Some(s.answered_by));
    assert!(s.claims >= 4);

    // Removing node 3 leaves two members everywhere.
    n1.remove(3).await.unwrap();
    let mut m1 = n1.members();
    timeout(Duration::from_secs(10), m1.wait_for(|m| m.nodes.len() == 2))
        .await
        .expect("2 members")
        .unwrap();
    n1.shutdown().await;
    n2.shutdown().await;
    n3.shutdown().await;
}

#[tokio::test]
async fn a_restarted_node_keeps_its_state_without_join() {
    let dir = tempfile::tempdir().unwrap();
    let n1 = Cluster::start(config(1, &dir, None)).await.unwrap();
    assert_eq!(n1.claim("a").await.unwrap(), (1, 1));
    assert_eq!(n1.claim("a").await.unwrap(), (1, 2));
    let addr = n1.local_addr();
    n1.shutdown().await;
    drop(n1);
    let mut cfg = config(1, &dir, None);
    cfg.listen = addr;
    let n1 = Cluster::start(cfg).await.unwrap();
    until("the log is re-applied", || n1.owner("a") == Some((1, 2))).await;
    assert_eq!(n1.claim("a").await.unwrap(), (1, 3));
    n1.shutdown().await;
}

// Paused time: the backoff between join attempts passes at once.
#[tokio::test(start_paused = true)]
async fn a_join_to_nowhere_fails_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let cfg = config(2, &dir, Some(nowhere));
    // Bounded retries: under a minute of backoff in all.
    let e = match timeout(Duration::from_secs(60), Cluster::start(cfg)).await {
        Ok(Err(e)) => e.to_string(),
        Ok(Ok(_)) => panic!("joined nothing"),
        Err(_) => panic!("join retries are not bounded"),
    };
    assert!(
        e.contains("could not join") && e.contains(&nowhere.to_string()),
        "{e}"
    );
    let zero = Cluster::start(config(0, &dir, None)).await.err().unwrap();
    assert!(zero.to_string().contains("node id 0"), "{zero}");
}

#[tokio::test]
async fn bad_frames_close_only_their_connection() {
    let dir = tempfile::tempdir().unwrap();
    let n1 = Cluster::start(config(1, &dir, None)).await.unwrap();
    // An oversized length, then a hello that is not JSON.
    let mut huge = tokio::net::TcpStream::connect(n1.local_addr())
        .await
        .unwrap();
    huge.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    let mut junk = tokio::net::TcpStream::connect(n1.local_addr())
        .await
        .unwrap();
    junk.write_all(&[0, 0, 0, 3, b'{', b'{', b'{'])
        .await
        .unwrap();
    for s in [&mut huge, &mut junk] {
        let mut buf = [0u8; 1];
        let n = timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap();
        assert!(matches!(n, Ok(0) | Err(_)), "closed: {n:?}");
    }
    until("both counted", || n1.bad_frames() == 2).await;
    let s = zerofan_cluster::admin::status(&n1.local_addr().to_string(), None)
        .await
        .unwrap();
    assert_eq!(s.members.len(), 1, "the node still answers");
    n1.shutdown().await;
}

/// Failover (issue #16): the leader, which owns a client id, dies; a
/// survivor's claim of that id is granted under 5 s after the death (an
/// election, then the wait for the dead node's lease), and the survivors
/// keep their own leases meanwhile (a new leader renews them in time). The
/// claim is retried every 500 ms, as the broker's backoff does at most:
/// the leader answers when the takeover is due rather than refusing.
#[tokio::test]
async fn a_dead_leaders_client_id_moves_within_five_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let (n1, n2, n3) = three(&dir).await;
    assert_eq!(n1.claim("dev").await.unwrap(), (1, 1));
    assert_eq!(n3.members().borrow().leader, Some(1));
    // Let every node renew a few times, so the death comes mid-lease.
    sleep(zerofan_cluster::DEFAULT_LEASE / 2).await;
    assert!([&n1, &n2, &n3].iter().all(|n| *n.lease().borrow()));

    n1.shutdown().await;
    drop(n1);
    let died = Instant::now();
    let mut m3 = n3.members();
    let elected = tokio::spawn(async move {
        let _ = m3.wait_for(|m| m.leader.is_some_and(|l| l != 1)).await;
        died.elapsed()
    });
    let mut tries = 0;
    let granted = loop {
        tries += 1;
        assert!(tries < 40, "not granted within 20 s");
        match n3.claim_from("dev").await {
            Ok((3, _, prev)) => {
                // Taken because the dead owner's lease ran out.
                let lapsed = Previous {
                    node: 1,
                    epoch: 1,
                    lapsed: true,
                };
                assert_eq!(prev, Some(lapsed));
                break died.elapsed();
            }
            Ok(other) => panic!("claimed for {other:?}"),
            Err(_) => sleep(Duration::from_millis(500)).await,
        }
    };
    let elected = elected.await.unwrap();
    eprintln!("failover: leader elected after {elected:?}, client id moved after {granted:?}");
    assert!(
        granted < Duration::from_secs(5),
        "client id moved {granted:?} after its owner died"
    );
    assert_eq!(
        n2.lease_expiries() + n3.lease_expiries(),
        0,
        "survivors kept their leases"
    );
    n2.shutdown().await;
    n3.shutdown().await;
}

/// A node holding a copy of a dead owner's session takes its client id
/// with `claim_orphan`: never while the owner lives (it keeps renewing its
/// lease: no fence reaches it, it keeps the id, also past the time its
/// lease would have run out), only once the owner's lease has run out
/// after its death; a second taker naming the same owner finds it moved.
#[tokio::test]
async fn an_orphan_claim_never_fences_a_live_owner_and_takes_a_dead_ones_id() {
    let dir = tempfile::tempdir().unwrap();
    let (n1, n2, n3) = three(&dir).await;
    let mut fences2 = n2.take_fences().expect("fences");
    let mut lost2 = n2.take_ownership_lost().expect("losses");
    assert_eq!(n2.claim("dev").await.unwrap(), (2, 1));
    assert_eq!(n1.claim("led").await.unwrap(), (1, 1));
    assert_eq!(n3.members().borrow().leader, Some(1));

    // Another owner or epoch than the table's: moved, answered at once.
    assert_eq!(
        n3.claim_orphan("dev", 3, 0).await.unwrap(),
        OrphanClaim::Moved
    );
    assert_eq!(
        n3.claim_orphan("dev", 2, 7).await.unwrap(),
        OrphanClaim::Moved
    );
    assert_eq!(
        n3.claim_orphan("nobody", 2, 0).await.unwrap(),
        OrphanClaim::Moved
    );
    // The leader owns it: alive, never taken.
    assert!(n3.claim_orphan("led", 1, 1).await.is_err());

    // Node 2 lives and renews: refused, try after try, for longer than its
    // lease could run after a last renewal.
    let live = Instant::now() + zerofan_cluster::grant_after(zerofan_cluster::DEFAULT_LEASE);
    while Instant::now() < live + Duration::from_millis(300) {
        let r = n3.claim_orphan("dev", 2, 1).await;
        assert!(r.is_err(), "taken from a live owner: {r:?}");
        sleep(Duration::from_millis(300)).await;
    }
    assert!(fences2.try_recv().is_err(), "the live owner was fenced");
    assert!(lost2.try_recv().is_err(), "the live owner lost the id");
    assert!(*n2.lease().borrow(), "the owner kept its lease");
    for n in [&n1, &n2, &n3] {
        assert_eq!(n.owner("dev"), Some((2, 1)));
        assert_eq!(n.owner("led"), Some((1, 1)));
    }

    // Node 2 dies: taken once its lease has surely run out.
    let lease2 = n2.lease_until();
    n2.shutdown().await;
    drop(n2);
    let ran_out = lease2.borrow().expect("node 2 held a lease").1;
    let deadline = Instant::now() + Duration::from_secs(10);
    let taken = loop {
        assert!(Instant::now() < deadline, "not taken within 10 s");
        match n3.claim_orphan("dev", 2, 1).await {
            Ok(r) => break r,
            Err(_) => sleep(Duration::from_millis(200)).await,
        }
    };
    assert!(
        std::time::Instant::now() > ran_out,
        "taken before the dead owner's lease ran out"
    );
    assert_eq!(
        taken,
        OrphanClaim::Claimed {
            epoch: 2,
            previous: Some((2, 1))
        }
    );
    // A second taker of the dead owner's session: already moved on.
    assert_eq!(
        n1.claim_orphan("dev", 2, 0).await.unwrap(),
        OrphanClaim::Moved
    );
    until("both survivors applied the orphan claim", || {
        [&n1, &n3].iter().all(|n| n.owner("dev") == Some((3, 2)))
    })
    .await;
    n1.shutdown().await;
    n3.shutdown().await;
}

/// A copy holder that saw a new run of the owner link to it takes a client
/// id that owner's former run held (`claim_ended`): under that
/// very epoch only, at once (no lease to wait for: that run ended); a newer
/// claim, or another taker first, moves it on.
#[tokio::test]
async fn a_restarted_owners_former_claim_is_taken_under_its_epoch_only() {
    let dir = tempfile::tempdir().unwrap();
    let (n1, n2, n3) = three(&dir).await;
    assert_eq!(n2.claim("dev").await.unwrap(), (2, 1));
    assert!(n3.claim_ended("dev", 2, 0).await.is_err());
    assert_eq!(
        n3.claim_ended("dev", 2, 7).await.unwrap(),
        OrphanClaim::Moved
    );
    let asked = Instant::now();
    assert_eq!(
        n3.claim_ended("dev", 2, 1).await.unwrap(),
        OrphanClaim::Claimed {
            epoch: 2,
            previous: Some((2, 1))
        }
    );
    assert!(
        asked.elapsed() < zerofan_cluster::DEFAULT_LEASE,
        "waited for a lease"
    );
    assert_eq!(
        n1.claim_ended("dev", 2, 1).await.unwrap(),
        OrphanClaim::Moved
    );
    for n in [n1, n2, n3] {
        n.shutdown().await;
    }
}

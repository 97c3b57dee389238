//! Three real `zerofan` processes form a cluster on loopback: join, lose
//! the leader to kill -9, rejoin from the data dir, remove a node.

mod common;

use common::{lines, Scratch};
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_zerofan");

/// A running node, killed when dropped.
struct Node {
    id: u64,
    child: Child,
    cluster_addr: String,
    _stdout: Receiver<String>,
    stderr: Receiver<String>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start node `id` with its data in `dir`; `cluster` is `127.0.0.1:0` for a
/// first start (the bound address is read from its output).
fn start(id: u64, dir: &Path, cluster: &str, join: Option<&str>) -> Node {
    let mut cmd = Command::new(BIN);
    cmd.args(["--node-id", &id.to_string(), "--cluster-listen", cluster])
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(j) = join {
        cmd.args(["--join", j]);
    }
    let mut child = cmd.spawn().expect("spawn zerofan");
    let stdout = lines(child.stdout.take().expect("stdout"));
    let stderr = lines(child.stderr.take().expect("stderr"));
    let prefix = format!("zerofan cluster node {id} on ");
    let deadline = Instant::now() + Duration::from_secs(60);
    let cluster_addr = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match stdout.recv_timeout(left) {
            Ok(l) if l.starts_with(&prefix) => break l[prefix.len()..].to_string(),
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                panic!("node {id} did not start its cluster node");
            }
        }
    };
    Node {
        id,
        child,
        cluster_addr,
        _stdout: stdout,
        stderr,
    }
}

fn cli(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run zerofan")
}

fn status(addr: &str) -> Option<Value> {
    let out = cli(&["cluster", "status", "--connect", addr, "--json"]);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// Poll `status` at `addr` until `ok` holds, within `limit`.
fn wait_status(addr: &str, limit: Duration, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + limit;
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(s) = status(addr) {
            if ok(&s) {
                return s;
            }
            last = Some(s);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("within {limit:?}: {what}; last status {last:?}");
}

fn members(s: &Value) -> Vec<&Value> {
    s["members"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn ids(s: &Value) -> Vec<u64> {
    members(s)
        .iter()
        .filter_map(|m| m["node_id"].as_u64())
        .collect()
}

fn all_voting_and_healthy(s: &Value, n: usize) -> bool {
    let m = members(s);
    m.len() == n
        && s["leader_id"].as_u64().is_some()
        && m.iter()
            .all(|m| m["role"] != "learner" && m["healthy"] == true)
        && m.iter().filter(|m| m["role"] == "leader").count() == 1
}

#[test]
fn three_nodes_survive_leader_kill_rejoin_and_remove() {
    let dir = Scratch::new("cluster-membership");
    let mut nodes = vec![start(1, &dir.path("d1"), "127.0.0.1:0", None)];
    let seed = nodes[0].cluster_addr.clone();
    nodes.push(start(2, &dir.path("d2"), "127.0.0.1:0", Some(&seed)));
    nodes.push(start(3, &dir.path("d3"), "127.0.0.1:0", Some(&seed)));

    let s = wait_status(&seed, Duration::from_secs(30), "3 healthy voters", |s| {
        all_voting_and_healthy(s, 3)
    });
    assert_eq!(ids(&s), vec![1, 2, 3]);
    let leader = s["leader_id"].as_u64().expect("leader");

    // kill -9 the leader: one of the others takes over within 10 s.
    let pos = nodes
        .iter()
        .position(|n| n.id == leader)
        .expect("leader node");
    let killed = nodes.remove(pos);
    let killed_addr = killed.cluster_addr.clone();
    let killed_at = Instant::now();
    drop(killed);
    let other = nodes[0].cluster_addr.clone();
    let s = wait_status(&other, Duration::from_secs(10), "a new leader", |s| {
        s["leader_id"].as_u64().is_some_and(|l| l != leader)
    });
    let new_leader = s["leader_id"].as_u64().expect("leader");
    eprintln!("new leader {new_leader} after {:?}", killed_at.elapsed());

    // Restarted without --join, on its old address: rejoins from its data.
    let d = dir.path(&format!("d{leader}"));
    nodes.push(start(leader, &d, &killed_addr, None));
    let s = wait_status(
        &other,
        Duration::from_secs(30),
        "the killed node back",
        |s| all_voting_and_healthy(s, 3),
    );
    assert_eq!(ids(&s), vec![1, 2, 3]);

    // Remove a follower through the CLI.
    let gone = nodes
        .iter()
        .map(|n| n.id)
        .find(|&id| Some(id) != s["leader_id"].as_u64())
        .expect("a follower");
    let out = cli(&["cluster", "remove", "--connect", &other, &gone.to_string()]);
    assert!(
        out.status.success(),
        "remove: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left = nodes
        .iter()
        .find(|n| n.id != gone)
        .map(|n| n.cluster_addr.clone())
        .expect("a remaining node");
    let s = wait_status(&left, Duration::from_secs(10), "2 members", |s| {
        members(s).len() == 2
    });
    assert!(!ids(&s).contains(&gone), "{s}");

    // The table form names every member.
    let out = cli(&["cluster", "status", "--connect", &left]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && table.contains("NODE") && table.contains("leader"),
        "{table}"
    );

    // A peer was down for a while: at the default level that is not a
    // flood of openraft's per-heartbeat warnings.
    for n in &nodes {
        let noisy: Vec<String> = n
            .stderr
            .try_iter()
            .filter(|l| l.contains("openraft"))
            .collect();
        assert!(noisy.is_empty(), "node {}: {noisy:?}", n.id);
    }
}

#[test]
fn cluster_cli_says_when_nothing_answers() {
    // A port just bound and released: nothing listens there.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .to_string();
    let out = cli(&["cluster", "status", "--connect", &addr]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&addr) && err.contains("does not answer"),
        "{err}"
    );
}

#[test]
fn bad_cluster_flags_are_refused_readably() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--node-id", "0", "--cluster-listen", "127.0.0.1:7101"],
            "cluster.node_id",
        ),
        (
            &["--node-id", "2", "--join", "127.0.0.1:7101"],
            "needs cluster.listen",
        ),
        (&["--cluster-listen", "127.0.0.1:7101"], "--node-id"),
        (
            &[
                "--node-id",
                "1",
                "--cluster-listen",
                "127.0.0.1:7101",
                "--memory",
            ],
            "--memory",
        ),
        (
            &["--node-id", "1", "--cluster-listen", "0.0.0.0:7101"],
            "specific address",
        ),
    ];
    for (args, want) in cases {
        let out = cli(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

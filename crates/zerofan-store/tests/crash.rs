//! A real `kill -9` in the middle of appending with `fsync = always`: every
//! commit whose durability notification the child observed (and reported)
//! before it died must be there after reopening.
//!
//! The test binary re-runs itself as the child (`crash_child`, selected by
//! name and switched on by an environment variable), so the child is a
//! separate process killed with SIGKILL, not a simulated crash.

use bytes::Bytes;
use std::collections::{BTreeSet, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use zerofan_store::*;

const CHILD_DIR: &str = "ZEROFAN_STORE_CRASH_CHILD_DIR";

/// The child: append forever, one commit per message, printing
/// `durable N` once the notifier reported message N durable.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return; // only meaningful when started by `kill_9_loses_nothing_acknowledged`
    };
    let (tx, rx) = mpsc::channel::<Lsn>();
    let tx = Mutex::new(tx);
    let options = Options {
        on_durable: Some(Arc::new(move |lsn| {
            let _ = tx.lock().map(|t| t.send(lsn));
        })),
        ..Options::default()
    };
    let (mut store, rec) = Store::open(&dir, options).expect("child open");
    let mut next = rec
        .sessions
        .first()
        .and_then(|s| s.queue.last())
        .map_or(0, |q| number(&q.message.payload) + 1);
    if rec.sessions.is_empty() {
        store
            .put_session(
                "subscriber",
                SessionMeta {
                    expiry_interval: u32::MAX,
                    expires_at_ms: None,
                },
            )
            .unwrap();
    }
    let mut pending: VecDeque<(Lsn, u64)> = VecDeque::new();
    let mut out = std::io::stdout().lock();
    loop {
        let mut payload = vec![0u8; 200];
        payload[..8].copy_from_slice(&next.to_le_bytes());
        let m = store
            .put_message(&StoredMessage {
                topic: Bytes::from_static(b"crash/test"),
                payload: payload.into(),
                qos: 1,
                ..Default::default()
            })
            .unwrap();
        store
            .enqueue(
                "subscriber",
                &QueueEntry {
                    msg: m,
                    qos: 1,
                    ..Default::default()
                },
            )
            .unwrap();
        let lsn = store.commit().unwrap();
        pending.push_back((lsn, next));
        next += 1;
        let mut durable = 0;
        while let Ok(d) = rx.try_recv() {
            durable = d;
        }
        while pending.front().is_some_and(|(l, _)| *l <= durable) {
            let (_, n) = pending.pop_front().unwrap_or_default();
            writeln!(out, "durable {n}").unwrap();
        }
        out.flush().unwrap();
    }
}

fn number(payload: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&payload[..8]);
    u64::from_le_bytes(a)
}

#[test]
fn kill_9_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut acknowledged = BTreeSet::new();
    // Several runs on the same directory: each recovers what the previous
    // killed one left, appends, and is killed at another point.
    for kill_after in [150usize, 700, 2000] {
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut seen = 0;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(n) = line.strip_prefix("durable ") {
                acknowledged.insert(n.parse::<u64>().unwrap());
                seen += 1;
                if seen == kill_after {
                    break;
                }
            }
        }
        assert_eq!(seen, kill_after, "the child stopped early");
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert!(!status.success());

        let (store, rec) = Store::open(dir.path(), Options::default()).unwrap();
        let got: Vec<u64> = rec.sessions[0]
            .queue
            .iter()
            .map(|q| number(&q.message.payload))
            .collect();
        // In order, no duplicates, and a superset of what was acknowledged.
        assert!(got.windows(2).all(|w| w[0] < w[1]));
        let got: BTreeSet<u64> = got.into_iter().collect();
        let missing: Vec<&u64> = acknowledged.difference(&got).collect();
        assert!(
            missing.is_empty(),
            "lost acknowledged messages: {missing:?}"
        );
        eprintln!(
            "killed after {kill_after} acks: {} acknowledged, {} recovered, tail cut {} bytes",
            acknowledged.len(),
            got.len(),
            rec.report.truncated_bytes
        );
        drop(store);
    }
}

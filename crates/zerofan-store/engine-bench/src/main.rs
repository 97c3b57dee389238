//! Store engine comparison on the workload that matters to zerofan: QoS 1
//! messages appended with fsync group commit, each payload written once and
//! referenced by F offline queues.
//!
//! Three engines store the same data model (a message table keyed by id, a
//! queue table keyed by (session, entry) holding the message id):
//!
//! - `zerofan-store`: this crate's own append-only log.
//! - `redb`: one write transaction (fsync on commit) per group.
//! - `fjall`: one write batch per group, then `persist(SyncData)`.
//!
//! redb and fjall get the same group commit zerofan-store has built in: a
//! writer thread takes every operation waiting, applies them in one
//! transaction/batch, syncs once and publishes the durable sequence number.
//! The producer (the broker core) keeps at most `WINDOW` messages waiting for
//! durability, like publishers waiting for their PUBACK.
//!
//! Run: `cargo run --release --manifest-path
//! crates/zerofan-store/engine-bench/Cargo.toml` (env `N` = messages
//! per run, default 20000; `WINDOW` = messages awaiting durability, default
//! 256; `FANOUT` = comma-separated fan-outs, default 1,10,100; `FSYNC=never` runs zerofan-store without fsync, to
//! see its CPU cost alone).

use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;
use zerofan_store::{Options, QueueEntry, SessionMeta, Store, StoredMessage};

const PAYLOAD: usize = 256;

struct Outcome {
    msgs_per_s: f64,
    cpu_us_per_msg: f64,
    syncs: u64,
    disk_bytes: u64,
}

/// CPU time (user + system, all threads) this process used so far, in
/// seconds: less sensitive than wall time to other load on a shared machine.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which is in parentheses).
    let Some(rest) = stat.rsplit(')').next() else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 (1-based), 11 and 12 here.
    (ticks(11) + ticks(12)) / 100.0
}

fn dir_size(p: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            total += if m.is_dir() {
                dir_size(&e.path())
            } else {
                m.len()
            };
        }
    }
    total
}

fn payload(i: u64) -> Bytes {
    let mut p = vec![0xA5u8; PAYLOAD];
    p[..8].copy_from_slice(&i.to_le_bytes());
    Bytes::from(p)
}

fn window() -> u64 {
    std::env::var("WINDOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn run_zerofan(n: u64, fanout: u32) -> Outcome {
    let window = window();
    let dir = tempfile::tempdir().unwrap();
    let fsync = if std::env::var("FSYNC").as_deref() == Ok("never") {
        zerofan_store::FsyncPolicy::Never
    } else {
        zerofan_store::FsyncPolicy::Always
    };
    let (mut store, _) = Store::open(
        dir.path(),
        Options {
            fsync,
            ..Options::default()
        },
    )
    .unwrap();
    for s in 0..fanout {
        store
            .put_session(
                &format!("client-{s}"),
                SessionMeta {
                    expiry_interval: 3600,
                    expires_at_ms: None,
                },
            )
            .unwrap();
    }
    let names: Vec<String> = (0..fanout).map(|s| format!("client-{s}")).collect();
    let lsn = store.commit().unwrap();
    store.wait_durable(lsn).unwrap();
    let fsyncs0 = store.stats().fsyncs;
    let start = Instant::now();
    let mut last = 0;
    for i in 0..n {
        let m = store
            .put_message(&StoredMessage {
                topic: Bytes::from_static(b"sensors/room-1/temperature"),
                payload: payload(i),
                qos: 1,
                ..Default::default()
            })
            .unwrap();
        for name in &names {
            store
                .enqueue(
                    name,
                    &QueueEntry {
                        msg: m,
                        qos: 1,
                        ..Default::default()
                    },
                )
                .unwrap();
        }
        last = store.commit().unwrap();
        if last > window && store.durable_lsn() < last - window {
            store.wait_durable(last - window).unwrap();
        }
    }
    store.wait_durable(last).unwrap();
    let secs = start.elapsed().as_secs_f64();
    let syncs = store.stats().fsyncs - fsyncs0;
    store.close().unwrap();
    Outcome {
        msgs_per_s: n as f64 / secs,
        cpu_us_per_msg: 0.0,
        syncs,
        disk_bytes: dir_size(dir.path()),
    }
}

/// One message for the engines driven through a writer thread.
struct Op {
    seq: u64,
    payload: Bytes,
}

/// Durable sequence number shared by the writer thread and the producer.
#[derive(Default)]
struct Durable {
    seq: Mutex<u64>,
    cv: Condvar,
}

impl Durable {
    fn set(&self, v: u64) {
        *self.seq.lock().unwrap() = v;
        self.cv.notify_all();
    }
    fn wait(&self, v: u64) {
        let mut g = self.seq.lock().unwrap();
        while *g < v {
            g = self.cv.wait(g).unwrap();
        }
    }
    fn get(&self) -> u64 {
        *self.seq.lock().unwrap()
    }
}

/// Drive a group-committing writer thread: `apply` stores one group and
/// syncs once.
fn run_threaded<F>(n: u64, mut apply: F) -> (f64, u64)
where
    F: FnMut(&[Op]) + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Op>();
    let durable = Arc::new(Durable::default());
    let syncs = Arc::new(AtomicU64::new(0));
    let writer = {
        let durable = durable.clone();
        let syncs = syncs.clone();
        std::thread::spawn(move || {
            let mut group = Vec::new();
            while let Ok(op) = rx.recv() {
                group.push(op);
                while let Ok(op) = rx.try_recv() {
                    group.push(op);
                }
                apply(&group);
                syncs.fetch_add(1, Ordering::Relaxed);
                let top = group.last().map_or(0, |o| o.seq);
                group.clear();
                durable.set(top);
            }
        })
    };
    let window = window();
    let start = Instant::now();
    for seq in 1..=n {
        tx.send(Op {
            seq,
            payload: payload(seq),
        })
        .unwrap();
        if seq > window && durable.get() < seq - window {
            durable.wait(seq - window);
        }
    }
    durable.wait(n);
    let secs = start.elapsed().as_secs_f64();
    drop(tx);
    writer.join().unwrap();
    (n as f64 / secs, syncs.load(Ordering::Relaxed))
}

fn run_redb(n: u64, fanout: u32) -> Outcome {
    use redb::{Database, TableDefinition};
    const MSGS: TableDefinition<u64, &[u8]> = TableDefinition::new("messages");
    const QUEUE: TableDefinition<(u32, u64), u64> = TableDefinition::new("queue");
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(dir.path().join("store.redb")).unwrap();
    let mut entry = 0u64;
    let (rate, syncs) = run_threaded(n, move |group| {
        let txn = db.begin_write().unwrap();
        {
            let mut msgs = txn.open_table(MSGS).unwrap();
            let mut queue = txn.open_table(QUEUE).unwrap();
            for op in group {
                let mut value = Vec::with_capacity(op.payload.len() + 32);
                value.extend_from_slice(b"sensors/room-1/temperature");
                value.extend_from_slice(&op.payload);
                msgs.insert(op.seq, value.as_slice()).unwrap();
                for s in 0..fanout {
                    entry += 1;
                    queue.insert((s, entry), op.seq).unwrap();
                }
            }
        }
        txn.commit().unwrap(); // Durability::Immediate: fsync
    });
    Outcome {
        msgs_per_s: rate,
        cpu_us_per_msg: 0.0,
        syncs,
        disk_bytes: dir_size(dir.path()),
    }
}

fn run_fjall(n: u64, fanout: u32) -> Outcome {
    use fjall::{Database, KeyspaceCreateOptions, PersistMode};
    let dir = tempfile::tempdir().unwrap();
    let db = Database::builder(dir.path()).open().unwrap();
    let msgs = db
        .keyspace("messages", KeyspaceCreateOptions::default)
        .unwrap();
    let queue = db
        .keyspace("queue", KeyspaceCreateOptions::default)
        .unwrap();
    let mut entry = 0u64;
    let db2 = db.clone();
    let (rate, syncs) = run_threaded(n, move |group| {
        let mut batch = db2.batch();
        for op in group {
            let mut value = Vec::with_capacity(op.payload.len() + 32);
            value.extend_from_slice(b"sensors/room-1/temperature");
            value.extend_from_slice(&op.payload);
            batch.insert(&msgs, op.seq.to_be_bytes(), value);
            for s in 0..fanout {
                entry += 1;
                let mut key = [0u8; 12];
                key[..4].copy_from_slice(&s.to_be_bytes());
                key[4..].copy_from_slice(&entry.to_be_bytes());
                batch.insert(&queue, key, op.seq.to_be_bytes());
            }
        }
        batch.commit().unwrap();
        db2.persist(PersistMode::SyncData).unwrap();
    });
    let disk = dir_size(dir.path());
    drop(db);
    Outcome {
        msgs_per_s: rate,
        cpu_us_per_msg: 0.0,
        syncs,
        disk_bytes: disk,
    }
}

fn main() {
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    println!(
        "QoS 1 append, {PAYLOAD} B payload, fsync group commit, window {}, {n} messages per run",
        window()
    );
    println!();
    println!(
        "| fan-out | engine | msgs/s | CPU µs/msg | fsyncs | msgs/fsync | disk bytes | bytes/msg |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let fanouts: Vec<u32> = std::env::var("FANOUT")
        .unwrap_or_else(|_| "1,10,100".into())
        .split(',')
        .filter_map(|f| f.trim().parse().ok())
        .collect();
    for fanout in fanouts {
        let timed = |run: &dyn Fn() -> Outcome| {
            let cpu = cpu_seconds();
            let mut o = run();
            o.cpu_us_per_msg = (cpu_seconds() - cpu) * 1e6 / n as f64;
            o
        };
        let runs = [
            ("zerofan-store log", timed(&|| run_zerofan(n, fanout))),
            ("redb 4.5", timed(&|| run_redb(n, fanout))),
            ("fjall 3.1", timed(&|| run_fjall(n, fanout))),
        ];
        for (name, o) in runs {
            println!(
                "| {fanout} | {name} | {:.0} | {:.1} | {} | {:.1} | {} | {:.0} |",
                o.msgs_per_s,
                o.cpu_us_per_msg,
                o.syncs,
                n as f64 / o.syncs.max(1) as f64,
                o.disk_bytes,
                o.disk_bytes as f64 / n as f64
            );
        }
    }
}

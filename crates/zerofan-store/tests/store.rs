//! The store's behaviour through its public API: round trips through
//! close/reopen, group commit, torn and corrupt tails, format versions,
//! compaction and write-once payloads.

use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zerofan_store::*;

fn msg(topic: &str, payload: &[u8]) -> StoredMessage {
    StoredMessage {
        topic: Bytes::copy_from_slice(topic.as_bytes()),
        payload: Bytes::copy_from_slice(payload),
        qos: 1,
        ..Default::default()
    }
}

fn full_msg() -> StoredMessage {
    StoredMessage {
        topic: Bytes::from_static(b"a/b/c"),
        payload: Bytes::from_static(b"\x00\x01binary payload\xff"),
        qos: 2,
        retain: true,
        expires_at_ms: Some(1_900_000_000_123),
        properties: MessageProperties {
            payload_format_indicator: Some(1),
            content_type: Some(Bytes::from_static(b"text/plain")),
            response_topic: Some(Bytes::from_static(b"reply/here")),
            correlation_data: Some(Bytes::from_static(b"\x01\x02\x03")),
            user_properties: vec![
                (Bytes::from_static(b"k1"), Bytes::from_static(b"v1")),
                (Bytes::from_static(b"k1"), Bytes::from_static(b"v2")),
            ],
        },
    }
}

fn manual() -> Options {
    Options {
        compact_min_bytes: u64::MAX,
        ..Options::default()
    }
}

fn meta(expiry: u32) -> SessionMeta {
    SessionMeta {
        expiry_interval: expiry,
        expires_at_ms: None,
    }
}

fn entry(msg: MsgId) -> QueueEntry {
    QueueEntry {
        msg,
        qos: 1,
        ..Default::default()
    }
}

fn log_file(dir: &Path) -> PathBuf {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "zlog"))
        .collect();
    assert_eq!(logs.len(), 1, "exactly one log in {logs:?}");
    logs.pop().unwrap()
}

fn reopen(dir: &Path) -> (Store, Recovered) {
    Store::open(dir, manual()).expect("reopen")
}

/// State without the report, for comparisons.
fn state(r: &Recovered) -> (Vec<RecoveredRetained>, Vec<RecoveredSession>) {
    (r.retained.clone(), r.sessions.clone())
}

/// Build a state that uses every record kind; returns the expected message.
fn build_everything(store: &mut Store) -> StoredMessage {
    let full = full_msg();
    // A session that is dropped again, and one whose meta is updated.
    store.put_session("gone", meta(10)).unwrap();
    store.put_session("c1", meta(60)).unwrap();
    store.put_session("c2", meta(5)).unwrap();
    // Epochs: the newest is kept; one goes with its session.
    store.set_epoch("gone", 5).unwrap();
    store.set_epoch("c1", 3).unwrap();
    store.commit().unwrap();
    store.set_epoch("c1", 7).unwrap();
    store.drop_session("gone").unwrap();
    store
        .put_session(
            "c1",
            SessionMeta {
                expiry_interval: 3600,
                expires_at_ms: Some(1_800_000_000_000),
            },
        )
        .unwrap();
    // Subscriptions: one replaced, one removed.
    let opts = SubOptions {
        qos: 2,
        no_local: true,
        retain_as_published: true,
        retain_handling: 2,
    };
    store
        .subscribe("c1", "a/#", SubOptions::default(), None)
        .unwrap();
    store.subscribe("c1", "a/#", opts, Some(42)).unwrap();
    store
        .subscribe("c1", "$share/g/x/+", SubOptions::default(), None)
        .unwrap();
    store.subscribe("c1", "drop/me", opts, None).unwrap();
    store.unsubscribe("c1", "drop/me").unwrap();
    // One message with every property, referenced by two queues and retained.
    let m = store.put_message(&full).unwrap();
    store.set_retained("a/b/c", m).unwrap();
    let e_full = QueueEntry {
        msg: m,
        qos: 2,
        retain: true,
        subscription_ids: vec![42, 7],
        share: Some("$share/g/x/+".into()),
    };
    store.enqueue("c1", &e_full).unwrap();
    store.enqueue("c2", &entry(m)).unwrap();
    store.commit().unwrap();
    // Queue churn: sent and acked, sent and PUBREC, dequeued, kept.
    let mut ids = Vec::new();
    for i in 0..5u8 {
        let id = store.put_message(&msg("q", &[i])).unwrap();
        ids.push(store.enqueue("c1", &entry(id)).unwrap());
    }
    store.send("c1", ids[0], 1).unwrap();
    store.complete("c1", 1).unwrap(); // PUBACK
    store.send("c1", ids[1], 2).unwrap();
    store.pubrec("c1", 2).unwrap(); // PUBREC: payload no longer needed
    store.send("c1", ids[2], 3).unwrap(); // stays PUBLISH sent
    store.dequeue("c1", ids[3]).unwrap(); // expired
                                          // ids[4] stays queued.
                                          // Inbound QoS 2.
    store.qos2_received("c1", 5).unwrap();
    store.qos2_received("c1", 9).unwrap();
    store.qos2_received("c1", 11).unwrap();
    store.qos2_released("c1", 11).unwrap();
    // Wills: one replaced, one cleared.
    let will = StoredWill {
        message: full.clone(),
        due_at_ms: 1_700_000_000_999,
        armed: None,
        message_expiry_interval: Some(30),
    };
    store
        .set_will(
            "c1",
            &StoredWill {
                message: msg("old", b"old"),
                ..Default::default()
            },
        )
        .unwrap();
    store.set_will("c1", &will).unwrap();
    store.set_will("c2", &will).unwrap();
    store.clear_will("c2").unwrap();
    // Armed (a replica's copy of a connected client's will), then set
    // again as a pending will, then armed again: the last one counts.
    let armed = StoredWill {
        message: msg("w/c3", b"gone"),
        due_at_ms: 0,
        armed: Some(45),
        message_expiry_interval: None,
    };
    store.put_session("c3", meta(60)).unwrap();
    store.set_will("c3", &armed).unwrap();
    store.set_will("c3", &will).unwrap();
    store.set_will("c3", &armed).unwrap();
    // Retained: one replaced, one cleared.
    let r1 = store.put_message(&msg("r/1", b"first")).unwrap();
    store.set_retained("r/1", r1).unwrap();
    let r2 = store.put_message(&msg("r/1", b"second")).unwrap();
    store.set_retained("r/1", r2).unwrap();
    let r3 = store.put_message(&msg("r/3", b"cleared")).unwrap();
    store.set_retained("r/3", r3).unwrap();
    store.clear_retained("r/3").unwrap();
    // A message nobody references is garbage at once.
    store.put_message(&msg("orphan", b"nobody")).unwrap();
    let lsn = store.commit().unwrap();
    store.wait_durable(lsn).unwrap();
    full
}

fn check_everything(r: &Recovered, full: &StoredMessage) {
    assert_eq!(r.report.ignored_records, 0);
    let topics: Vec<&str> = r.retained.iter().map(|x| x.topic.as_str()).collect();
    assert_eq!(topics, ["a/b/c", "r/1"]);
    assert_eq!(*r.retained[0].message, *full);
    assert_eq!(&r.retained[1].message.payload[..], b"second");
    // Messages: full (shared by 2 queues + retained), r2, and queue messages
    // 2 (inflight, PUBLISH sent) and 4 (queued).
    assert_eq!(r.report.live_messages, 4);

    let names: Vec<&str> = r.sessions.iter().map(|s| s.client_id.as_str()).collect();
    assert_eq!(names, ["c1", "c2", "c3"]);
    let c1 = &r.sessions[0];
    assert_eq!(c1.epoch, 7);
    assert_eq!(r.sessions[1].epoch, 0);
    assert_eq!(
        c1.meta,
        SessionMeta {
            expiry_interval: 3600,
            expires_at_ms: Some(1_800_000_000_000)
        }
    );
    let subs: Vec<(&str, Option<u32>)> = c1
        .subscriptions
        .iter()
        .map(|s| (s.filter.as_str(), s.id))
        .collect();
    assert_eq!(subs, [("$share/g/x/+", None), ("a/#", Some(42))]);
    assert_eq!(
        c1.subscriptions[1].options,
        SubOptions {
            qos: 2,
            no_local: true,
            retain_as_published: true,
            retain_handling: 2
        }
    );
    assert_eq!(c1.queue.len(), 2);
    assert_eq!(*c1.queue[0].message, *full);
    assert_eq!(c1.queue[0].entry.subscription_ids, vec![42, 7]);
    assert_eq!(c1.queue[0].entry.share.as_deref(), Some("$share/g/x/+"));
    assert_eq!(c1.queue[0].entry.qos, 2);
    assert!(c1.queue[0].entry.retain);
    assert_eq!(&c1.queue[1].message.payload[..], &[4]);
    let flying: Vec<(u16, InflightPhase)> =
        c1.inflight.iter().map(|f| (f.packet_id, f.phase)).collect();
    assert_eq!(
        flying,
        [
            (2, InflightPhase::PubrecReceived),
            (3, InflightPhase::PublishSent)
        ]
    );
    assert!(c1.inflight[0].entry.is_none());
    let sent = c1.inflight[1].entry.as_ref().unwrap();
    assert_eq!(&sent.message.payload[..], &[2]);
    assert_eq!(c1.incoming_qos2, vec![5, 9]);
    let will = c1.will.as_ref().unwrap();
    assert_eq!(will.message, *full);
    assert_eq!(will.due_at_ms, 1_700_000_000_999);
    assert_eq!(will.message_expiry_interval, Some(30));

    let c2 = &r.sessions[1];
    assert_eq!(c2.meta, meta(5));
    assert!(c2.will.is_none());
    let c3 = r.sessions.iter().find(|s| s.client_id.as_str() == "c3");
    let w3 = c3.and_then(|s| s.will.as_ref()).expect("c3's armed will");
    assert_eq!(w3.armed, Some(45));
    assert_eq!(&w3.message.payload[..], b"gone");
    assert_eq!(c2.queue.len(), 1);
    // One message, one allocation, shared by every reference.
    assert!(Arc::ptr_eq(&c2.queue[0].message, &c1.queue[0].message));
    assert!(Arc::ptr_eq(&c2.queue[0].message, &r.retained[0].message));
}

#[test]
fn every_record_kind_round_trips_through_reopen_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, rec) = Store::open(dir.path(), manual()).unwrap();
    assert!(rec.sessions.is_empty() && rec.retained.is_empty());
    let full = build_everything(&mut store);
    store.close().unwrap();

    let (mut store, rec) = reopen(dir.path());
    check_everything(&rec, &full);
    assert_eq!(rec.report.truncated_bytes, 0);
    // Compaction keeps exactly the same state.
    let lsn = store.compact().unwrap();
    store.wait_compacted().unwrap();
    store.wait_durable(lsn).unwrap();
    store.close().unwrap();
    let (store, rec2) = reopen(dir.path());
    check_everything(&rec2, &full);
    assert_eq!(state(&rec), state(&rec2));
    drop(store);
}

#[test]
fn recovered_ids_keep_working_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), manual()).unwrap();
    store.put_session("c", meta(60)).unwrap();
    let m = store.put_message(&msg("t", b"x")).unwrap();
    store.set_retained("t", m).unwrap();
    let e = store.enqueue("c", &entry(m)).unwrap();
    store.close().unwrap();

    let (mut store, rec) = reopen(dir.path());
    let q = &rec.sessions[0].queue[0];
    assert_eq!(q.id, e);
    // Referencing a recovered message (still retained) and entry works; new
    // ids do not collide with recovered ones.
    let e2 = store.enqueue("c", &entry(rec.retained[0].msg)).unwrap();
    assert!(e2.0 > e.0);
    store.send("c", q.id, 7).unwrap();
    let m2 = store.put_message(&msg("t2", b"y")).unwrap();
    assert!(m2.0 > m.0);
    store.close().unwrap();
    let (_, rec) = reopen(dir.path());
    assert_eq!(rec.sessions[0].queue.len(), 1);
    assert_eq!(rec.sessions[0].inflight[0].packet_id, 7);
}

#[test]
fn contract_violations_are_errors_and_stage_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), manual()).unwrap();
    let m = store.put_message(&msg("t", b"x")).unwrap();
    assert!(matches!(
        store.enqueue("nobody", &entry(m)),
        Err(StoreError::UnknownSession(_))
    ));
    assert!(matches!(
        store.set_epoch("nobody", 1),
        Err(StoreError::UnknownSession(_))
    ));
    store.put_session("c", meta(1)).unwrap();
    assert!(matches!(
        store.enqueue("c", &entry(MsgId(999))),
        Err(StoreError::UnknownMessage(_))
    ));
    assert!(matches!(
        store.send("c", EntryId(999), 1),
        Err(StoreError::UnknownItem { .. })
    ));
    assert!(matches!(
        store.complete("c", 1),
        Err(StoreError::UnknownItem { .. })
    ));
    let bad = QueueEntry {
        msg: m,
        qos: 3,
        ..Default::default()
    };
    assert!(matches!(
        store.enqueue("c", &bad),
        Err(StoreError::Invalid(_))
    ));
    let long = "x".repeat(70_000);
    assert!(matches!(
        store.put_message(&msg(&long, b"")),
        Err(StoreError::Invalid(_))
    ));
    // The message was never referenced in its commit: gone after it.
    store.commit().unwrap();
    assert!(matches!(
        store.enqueue("c", &entry(m)),
        Err(StoreError::UnknownMessage(_))
    ));
    store.close().unwrap();
    let (_, rec) = reopen(dir.path());
    assert_eq!(rec.report.ignored_records, 0);
    assert_eq!(rec.report.live_messages, 0);
    assert!(rec.sessions[0].queue.is_empty());
}

#[test]
fn group_commit_one_fsync_covers_everything_that_arrived_meanwhile() {
    // The notifier runs on the writer thread right after an fsync. Holding
    // the first call makes every later commit arrive "during" that fsync
    // round; the writer must then take them all with a single fsync.
    let (seen_tx, seen_rx) = mpsc::channel::<Lsn>();
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let gate = Mutex::new(Some(gate_rx));
    let seen_tx = Mutex::new(seen_tx);
    let notifier: DurableNotifier = Arc::new(move |lsn| {
        let _ = seen_tx.lock().unwrap().send(lsn);
        if let Some(rx) = gate.lock().unwrap().take() {
            let _ = rx.recv();
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(
        dir.path(),
        Options {
            on_durable: Some(notifier),
            ..manual()
        },
    )
    .unwrap();
    store.put_session("c", meta(60)).unwrap();
    let first = store.commit().unwrap();
    assert_eq!(seen_rx.recv().unwrap(), first);
    let n = 1000;
    let mut last = 0;
    for i in 0..n {
        let m = store.put_message(&msg("t", &[i as u8; 100])).unwrap();
        store.enqueue("c", &entry(m)).unwrap();
        last = store.commit().unwrap();
    }
    assert_eq!(store.stats().fsyncs, 1);
    gate_tx.send(()).unwrap();
    store.wait_durable(last).unwrap();
    assert_eq!(seen_rx.recv().unwrap(), last);
    let stats = store.stats();
    assert_eq!(stats.commits, n + 1);
    assert_eq!(stats.fsyncs, 2, "{stats:?}");
    store.close().unwrap();
    let (_, rec) = reopen(dir.path());
    assert_eq!(rec.sessions[0].queue.len(), n as usize);
}

#[test]
fn group_commit_free_running_takes_fewer_fsyncs_than_commits() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), manual()).unwrap();
    store.put_session("c", meta(60)).unwrap();
    let n = 5000u64;
    let mut last = 0;
    for i in 0..n {
        let m = store.put_message(&msg("t", &i.to_le_bytes())).unwrap();
        store.enqueue("c", &entry(m)).unwrap();
        last = store.commit().unwrap();
    }
    store.wait_durable(last).unwrap();
    let stats = store.stats();
    eprintln!("{n} commits -> {} fsyncs", stats.fsyncs);
    assert!(stats.fsyncs < n / 2, "{stats:?}");
    assert_eq!(stats.durable_lsn, last);
}

#[test]
fn interval_and_never_report_durable_after_the_write() {
    for policy in [
        FsyncPolicy::Interval(Duration::from_secs(3600)),
        FsyncPolicy::Never,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let (mut store, _) = Store::open(
            dir.path(),
            Options {
                fsync: policy,
                on_durable: Some(Arc::new(move |lsn| {
                    let _ = tx.lock().unwrap().send(lsn);
                })),
                ..manual()
            },
        )
        .unwrap();
        store.put_session("c", meta(1)).unwrap();
        let lsn = store.commit().unwrap();
        assert_eq!(rx.recv().unwrap(), lsn);
        // Reported durable (written) without an fsync yet.
        assert_eq!(store.stats().fsyncs, 0, "{policy:?}");
        store.close().unwrap();
        let (_, rec) = reopen(dir.path());
        assert_eq!(rec.sessions.len(), 1);
    }
}

/// A store whose last commit is one message + one queue entry. Returns the
/// log length before and after that commit, and the state before it.
fn store_with_last_commit(dir: &Path) -> (u64, u64, Recovered) {
    let (mut store, _) = Store::open(dir, manual()).unwrap();
    store.put_session("c", meta(60)).unwrap();
    store
        .subscribe("c", "t/#", SubOptions::default(), Some(3))
        .unwrap();
    for i in 0..3u8 {
        let m = store.put_message(&msg("t/x", &[i; 10])).unwrap();
        store.enqueue("c", &entry(m)).unwrap();
        store.commit().unwrap();
    }
    let before = store.stats().log_bytes;
    let m = store.put_message(&msg("t/last", b"the last one")).unwrap();
    store.enqueue("c", &entry(m)).unwrap();
    store.commit().unwrap();
    let after = store.stats().log_bytes;
    store.close().unwrap();
    assert_eq!(std::fs::metadata(log_file(dir)).unwrap().len(), after);

    // The state before the last commit, from a copy cut exactly there.
    let copy = tempfile::tempdir().unwrap();
    copy_store(dir, copy.path());
    cut(&log_file(copy.path()), before);
    let (_, rec) = reopen(copy.path());
    assert_eq!(rec.report.truncated_bytes, 0);
    assert_eq!(rec.sessions[0].queue.len(), 3);
    (before, after, rec)
}

fn copy_store(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn cut(file: &Path, len: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.set_len(len).unwrap();
}

#[test]
fn torn_tail_at_every_byte_offset_recovers_the_previous_state() {
    let dir = tempfile::tempdir().unwrap();
    let (before, after, expected) = store_with_last_commit(dir.path());
    assert!(after - before > 40);
    for len in before..after {
        let copy = tempfile::tempdir().unwrap();
        copy_store(dir.path(), copy.path());
        cut(&log_file(copy.path()), len);
        let (mut store, rec) = reopen(copy.path());
        // A cut inside the queue entry leaves the message record whole but
        // unreferenced: garbage, so the state is the same.
        assert_eq!(state(&rec), state(&expected), "cut at {len}");
        let (mreclen, tail) = (len, rec.report.truncated_bytes);
        assert!(tail <= mreclen - before, "cut at {len}: {tail}");
        assert_eq!(
            std::fs::metadata(log_file(copy.path())).unwrap().len(),
            len - tail
        );
        // The repaired log takes new records and reopens cleanly.
        let m = store.put_message(&msg("t/new", b"new")).unwrap();
        store.enqueue("c", &entry(m)).unwrap();
        store.close().unwrap();
        let (_, rec) = reopen(copy.path());
        assert_eq!(rec.report.truncated_bytes, 0);
        assert_eq!(rec.sessions[0].queue.len(), 4);
        assert_eq!(&rec.sessions[0].queue[3].message.payload[..], b"new");
    }
}

#[test]
fn bit_flips_in_the_tail_recover_the_previous_state() {
    let dir = tempfile::tempdir().unwrap();
    let (before, after, expected) = store_with_last_commit(dir.path());
    let original = std::fs::read(log_file(dir.path())).unwrap();
    for pos in before..after {
        let copy = tempfile::tempdir().unwrap();
        copy_store(dir.path(), copy.path());
        let mut data = original.clone();
        data[pos as usize] ^= 1 << (pos % 8);
        std::fs::write(log_file(copy.path()), &data).unwrap();
        let (_, rec) = reopen(copy.path());
        assert_eq!(state(&rec), state(&expected), "flip at {pos}");
        assert!(rec.report.truncated_bytes > 0, "flip at {pos}");
    }
}

#[test]
fn a_commit_is_all_or_nothing() {
    // Hand a queued message from one session to another in one commit; a
    // log cut between the two records must not lose it from both.
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), manual()).unwrap();
    store.put_session("a", meta(60)).unwrap();
    store.put_session("b", meta(60)).unwrap();
    let m = store.put_message(&msg("t", b"precious")).unwrap();
    let e = store.enqueue("a", &entry(m)).unwrap();
    store.commit().unwrap();
    let before = store.stats().log_bytes;
    store.dequeue("a", e).unwrap();
    let mid = store.stats().log_bytes;
    store.enqueue("b", &entry(m)).unwrap();
    store.close().unwrap();
    assert!(mid == before); // staged records are not counted until committed
                            // Cut right after the dequeue record: find it by cutting progressively.
    let full = std::fs::metadata(log_file(dir.path())).unwrap().len();
    for len in before + 1..full {
        let copy = tempfile::tempdir().unwrap();
        copy_store(dir.path(), copy.path());
        cut(&log_file(copy.path()), len);
        let (_, rec) = reopen(copy.path());
        assert_eq!(rec.sessions[0].queue.len(), 1, "cut at {len}");
        assert!(rec.sessions[1].queue.is_empty(), "cut at {len}");
    }
    let (_, rec) = reopen(dir.path());
    assert!(rec.sessions[0].queue.is_empty());
    assert_eq!(&rec.sessions[1].queue[0].message.payload[..], b"precious");
}

#[test]
fn garbage_appended_to_the_log_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (_, after, _) = store_with_last_commit(dir.path());
    let file = log_file(dir.path());
    let mut data = std::fs::read(&file).unwrap();
    data.extend_from_slice(&[0xAB; 37]);
    std::fs::write(&file, &data).unwrap();
    let (_, rec) = reopen(dir.path());
    assert_eq!(rec.report.truncated_bytes, 37);
    assert_eq!(rec.sessions[0].queue.len(), 4);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), after);
}

#[test]
fn newer_format_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), manual()).unwrap();
    store.close().unwrap();
    let manifest = dir.path().join("MANIFEST");
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("format=4"), "{text}");
    std::fs::write(&manifest, text.replace("format=4", "format=7")).unwrap();
    let err = Store::open(dir.path(), manual()).unwrap_err();
    assert!(matches!(
        err,
        StoreError::NewerFormat {
            found: 7,
            supported: 4,
            ..
        }
    ));
    let shown = err.to_string();
    assert!(shown.contains("newer"), "{shown}");
    assert!(shown.contains("version 7"), "{shown}");
    // The directory is left untouched.
    assert!(std::fs::read_to_string(&manifest)
        .unwrap()
        .contains("format=7"));

    // A log header of a newer version is refused the same way.
    std::fs::write(&manifest, text).unwrap();
    let file = log_file(dir.path());
    let mut data = std::fs::read(&file).unwrap();
    data[8] = 9;
    std::fs::write(&file, &data).unwrap();
    let err = Store::open(dir.path(), manual()).unwrap_err();
    assert!(
        matches!(err, StoreError::NewerFormat { found: 9, .. }),
        "{err}"
    );
}

/// The log of a store whose format version is set back to 1 (whose layout
/// is version 4's without `Epoch` records and armed wills).
fn as_version_1(dir: &Path) {
    let manifest = dir.join("MANIFEST");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("format=4", "format=1")).unwrap();
    let file = log_file(dir);
    let mut data = std::fs::read(&file).unwrap();
    assert_eq!(data[8..12], 4u32.to_le_bytes());
    data[8..12].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&file, &data).unwrap();
}

#[test]
fn a_version_1_store_is_read_and_marked_as_version_4() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), manual()).unwrap();
    store.put_session("c", meta(60)).unwrap();
    let m = store.put_message(&msg("t", b"x")).unwrap();
    store.enqueue("c", &entry(m)).unwrap();
    store.close().unwrap();
    as_version_1(dir.path());

    let (mut store, rec) = reopen(dir.path());
    assert_eq!(rec.report.truncated_bytes, 0);
    assert_eq!(rec.sessions.len(), 1);
    assert_eq!(rec.sessions[0].queue.len(), 1);
    assert_eq!(rec.sessions[0].epoch, 0);
    // Marked as version 4 before anything of version 4 is written: an
    // older build refuses it rather than cut the log at an `Epoch`.
    let text = std::fs::read_to_string(dir.path().join("MANIFEST")).unwrap();
    assert!(text.contains("format=4"), "{text}");
    let data = std::fs::read(log_file(dir.path())).unwrap();
    assert_eq!(data[8..12], 4u32.to_le_bytes());
    store.set_epoch("c", 4).unwrap();
    store.close().unwrap();
    let (_, rec) = reopen(dir.path());
    assert_eq!(rec.sessions[0].epoch, 4);
    assert_eq!(rec.sessions[0].queue.len(), 1);
}

/// A version goes with the epoch, replaced with it, kept by compaction,
/// and 0 where none was given.
#[test]
fn a_version_is_kept_with_its_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), manual()).unwrap();
    store.put_session("a", meta(60)).unwrap();
    store.put_session("b", meta(60)).unwrap();
    store.set_epoch_at("a", 2, 10).unwrap();
    store.set_epoch_at("a", 2, 11).unwrap();
    store.set_epoch("b", 3).unwrap();
    store.commit().unwrap();
    store.close().unwrap();
    let versions = |r: &Recovered| -> Vec<(String, u64, u64)> {
        let mut v: Vec<_> = r
            .sessions
            .iter()
            .map(|s| (s.client_id.clone(), s.epoch, s.version))
            .collect();
        v.sort();
        v
    };
    let want = vec![("a".to_string(), 2, 11), ("b".to_string(), 3, 0)];
    let (mut store, rec) = reopen(dir.path());
    assert_eq!(versions(&rec), want);
    store.compact().unwrap();
    store.close().unwrap();
    let (_, rec) = reopen(dir.path());
    assert_eq!(versions(&rec), want);
}

#[test]
fn an_epoch_is_kept_newest_only_and_goes_with_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), manual()).unwrap();
    store.put_session("kept", meta(60)).unwrap();
    store.put_session("dropped", meta(60)).unwrap();
    store.put_session("none", meta(60)).unwrap();
    for e in 1..=50 {
        store.set_epoch("kept", e).unwrap();
        store.set_epoch("dropped", e).unwrap();
        store.commit().unwrap();
    }
    // An expiry update keeps the epoch; a drop ends it, and the same name
    // starts again without one.
    store.put_session("kept", meta(30)).unwrap();
    store.drop_session("dropped").unwrap();
    store.put_session("dropped", meta(60)).unwrap();
    store.close().unwrap();
    let epochs = |r: &Recovered| -> Vec<(String, u64)> {
        r.sessions
            .iter()
            .map(|s| (s.client_id.clone(), s.epoch))
            .collect()
    };
    let want = [
        ("kept".to_string(), 50),
        ("none".to_string(), 0),
        // A new session (a new key: listed last).
        ("dropped".to_string(), 0),
    ];
    let (mut store, rec) = reopen(dir.path());
    assert_eq!(epochs(&rec), want);
    assert_eq!(rec.report.ignored_records, 0);
    // Compaction keeps the newest epoch only: one record of it.
    let before = store.stats().live_bytes;
    let lsn = store.compact().unwrap();
    store.wait_compacted().unwrap();
    store.wait_durable(lsn).unwrap();
    store.close().unwrap();
    let (_, rec) = reopen(dir.path());
    assert_eq!(epochs(&rec), want);
    // Three sessions and one epoch.
    assert_eq!(rec.report.records, 4);
    assert_eq!(rec.report.log_bytes - 32, before);
}

#[test]
fn a_damaged_manifest_is_refused_not_guessed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), manual()).unwrap();
    store.close().unwrap();
    std::fs::write(dir.path().join("MANIFEST"), b"\x00\x01garbage").unwrap();
    let err = Store::open(dir.path(), manual()).unwrap_err();
    assert!(matches!(err, StoreError::BadDirectory { .. }), "{err}");
}

#[test]
fn leftovers_of_an_interrupted_compaction_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), manual()).unwrap();
    store.put_session("c", meta(1)).unwrap();
    store.close().unwrap();
    // A half-written next generation and a temporary manifest.
    std::fs::write(dir.path().join("log-000002.zlog"), b"ZFSTORE\0partial").unwrap();
    std::fs::write(
        dir.path().join("MANIFEST.tmp"),
        b"zerofan-store format=1 generation=2",
    )
    .unwrap();
    let (_, rec) = reopen(dir.path());
    assert_eq!(rec.sessions.len(), 1);
    assert!(log_file(dir.path()).ends_with("log-000001.zlog"));
    assert!(!dir.path().join("MANIFEST.tmp").exists());
}

fn disk_usage(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

#[test]
fn compaction_shrinks_disk_use_and_preserves_live_data() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), manual()).unwrap();
    store.put_session("c", meta(60)).unwrap();
    store.put_session("d", meta(60)).unwrap();
    let payload = vec![7u8; 1024];
    let mut entries = Vec::new();
    for i in 0..2000u32 {
        let mut p = payload.clone();
        p[..4].copy_from_slice(&i.to_le_bytes());
        let m = store.put_message(&msg("t", &p)).unwrap();
        entries.push(store.enqueue("c", &entry(m)).unwrap());
        store.commit().unwrap();
    }
    // Deliver all but every 20th: sent and acknowledged.
    for (i, e) in entries.iter().enumerate() {
        if i % 20 != 0 {
            store.send("c", *e, 1).unwrap();
            store.complete("c", 1).unwrap();
        }
    }
    let lsn = store.commit().unwrap();
    store.wait_durable(lsn).unwrap();
    let big = disk_usage(dir.path());
    assert!(big > 2000 * 1024, "{big}");
    let stats = store.stats();
    assert!(stats.live_bytes < stats.log_bytes / 10, "{stats:?}");

    store.compact().unwrap();
    store.wait_compacted().unwrap();
    let small = disk_usage(dir.path());
    eprintln!("disk use {big} -> {small} bytes");
    assert!(small < big / 10, "{big} -> {small}");
    assert_eq!(store.stats().compactions, 1);
    // Appends after the switch land in the new log.
    let m = store.put_message(&msg("t", b"after")).unwrap();
    store.enqueue("d", &entry(m)).unwrap();
    store.close().unwrap();

    let (_, rec) = reopen(dir.path());
    let c = &rec.sessions[0];
    assert_eq!(c.queue.len(), 100);
    for (k, q) in c.queue.iter().enumerate() {
        let n = u32::from_le_bytes(q.message.payload[..4].try_into().unwrap());
        assert_eq!(n as usize, k * 20);
        assert_eq!(q.message.payload.len(), 1024);
    }
    assert_eq!(&rec.sessions[1].queue[0].message.payload[..], b"after");
}

#[test]
fn compaction_triggers_itself_and_keeps_disk_use_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(
        dir.path(),
        Options {
            compact_min_bytes: 256 << 10,
            compact_garbage_ratio: 0.5,
            ..Options::default()
        },
    )
    .unwrap();
    store.put_session("c", meta(60)).unwrap();
    let mut kept = Vec::new();
    // A steady stream: each message queued, sent and acknowledged; every
    // 100th stays queued.
    for i in 0..5000u32 {
        let m = store
            .put_message(&msg("t", &[(i % 251) as u8; 500]))
            .unwrap();
        let e = store.enqueue("c", &entry(m)).unwrap();
        if i % 100 == 0 {
            kept.push(i);
        } else {
            store.send("c", e, 1).unwrap();
            store.complete("c", 1).unwrap();
        }
        store.commit().unwrap();
    }
    // One compaction runs at a time, so how many ran depends on how fast the
    // writer kept up; once it is idle, the next commit compacts whatever
    // garbage is left over the threshold.
    store.wait_compacted().unwrap();
    store.clear_retained("nothing").unwrap();
    let lsn = store.commit().unwrap();
    store.wait_compacted().unwrap();
    store.wait_durable(lsn).unwrap();
    let stats = store.stats();
    assert!(stats.compactions >= 1, "{stats:?}");
    let used = disk_usage(dir.path());
    // ~2.6 MB went through the log; it stays within a few times the
    // compaction threshold.
    assert!(used < 1024 << 10, "{used} {stats:?}");
    store.close().unwrap();
    let (_, rec) = reopen(dir.path());
    let got: Vec<u8> = rec.sessions[0]
        .queue
        .iter()
        .map(|q| q.message.payload[0])
        .collect();
    let want: Vec<u8> = kept.iter().map(|i| (i % 251) as u8).collect();
    assert_eq!(got, want);
}

#[test]
fn a_payload_fanned_out_to_many_queues_is_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), manual()).unwrap();
    let n = 100;
    for i in 0..n {
        store.put_session(&format!("client-{i}"), meta(60)).unwrap();
    }
    let lsn = store.commit().unwrap();
    store.wait_durable(lsn).unwrap();
    let before = std::fs::metadata(log_file(dir.path())).unwrap().len();
    let payload = vec![0x5A; 64 * 1024];
    let m = store.put_message(&msg("fan/out", &payload)).unwrap();
    for i in 0..n {
        store.enqueue(&format!("client-{i}"), &entry(m)).unwrap();
    }
    let lsn = store.commit().unwrap();
    store.wait_durable(lsn).unwrap();
    let grew = std::fs::metadata(log_file(dir.path())).unwrap().len() - before;
    eprintln!("64 KiB to {n} queues: log grew {grew} bytes");
    // One payload plus ~30 bytes per queue entry; N copies would be 6.4 MB.
    assert!(grew < 64 * 1024 + n * 40, "{grew}");
    store.close().unwrap();

    let (_, rec) = reopen(dir.path());
    assert_eq!(rec.sessions.len(), n as usize);
    let first = &rec.sessions[0].queue[0].message;
    assert_eq!(first.payload.len(), 64 * 1024);
    for s in &rec.sessions {
        let m = &s.queue[0].message;
        assert!(Arc::ptr_eq(m, first));
        assert_eq!(m.payload.as_ptr(), first.payload.as_ptr());
    }
}

#[test]
fn recovered_messages_do_not_pin_the_log() {
    // Each live message is copied into its own allocation: a small message
    // recovered from a large log holds only itself.
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), manual()).unwrap();
    store.put_session("c", meta(60)).unwrap();
    for _ in 0..100 {
        let m = store.put_message(&msg("big", &[1; 10_000])).unwrap();
        let e = store.enqueue("c", &entry(m)).unwrap();
        store.dequeue("c", e).unwrap();
    }
    let m = store.put_message(&msg("small", b"tiny")).unwrap();
    store.enqueue("c", &entry(m)).unwrap();
    store.close().unwrap();
    let (_, rec) = reopen(dir.path());
    let q = &rec.sessions[0].queue[0].message;
    assert_eq!(&q.payload[..], b"tiny");
    // Topic and payload are slices of one small allocation.
    let t = q.topic.as_ptr() as usize;
    let p = q.payload.as_ptr() as usize;
    assert!(p.abs_diff(t) < 64);
}

#[test]
fn random_damage_anywhere_never_panics_and_never_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let (_, after, _) = store_with_last_commit(dir.path());
    let original = std::fs::read(log_file(dir.path())).unwrap();
    let mut s: u64 = 0x1234_5678_9ABC_DEF1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for round in 0..300 {
        let copy = tempfile::tempdir().unwrap();
        copy_store(dir.path(), copy.path());
        let mut data = original.clone();
        // Damage 1-4 bytes past the header, anywhere (not only the tail),
        // and sometimes cut the file too.
        for _ in 0..1 + next() % 4 {
            let pos = 32 + (next() % (after - 32)) as usize;
            data[pos] = next() as u8;
        }
        if round % 3 == 0 {
            data.truncate(32 + (next() % (after - 32)) as usize);
        }
        std::fs::write(log_file(copy.path()), &data).unwrap();
        let (store, rec) = reopen(copy.path());
        assert!(rec.report.log_bytes <= data.len() as u64);
        store.close().unwrap();
        // What was cut stays cut: a second open finds a clean log.
        let (_, again) = reopen(copy.path());
        assert_eq!(again.report.truncated_bytes, 0);
        assert_eq!(state(&again), state(&rec));
    }
}

#[test]
fn fsync_policy_parses_as_configured_and_prints_back() {
    for (text, want) in [
        ("always", FsyncPolicy::Always),
        ("Never", FsyncPolicy::Never),
        (
            "interval",
            FsyncPolicy::Interval(Duration::from_millis(1000)),
        ),
        (
            "interval:250",
            FsyncPolicy::Interval(Duration::from_millis(250)),
        ),
    ] {
        let got: FsyncPolicy = text.parse().unwrap();
        assert_eq!(got, want);
        assert_eq!(got.to_string().parse::<FsyncPolicy>().unwrap(), want);
    }
    assert!("sometimes".parse::<FsyncPolicy>().is_err());
    assert!("interval:0".parse::<FsyncPolicy>().is_err());
    assert_eq!(FsyncPolicy::default(), FsyncPolicy::Always);
}

#[test]
fn a_panicking_notifier_fails_the_store_instead_of_hanging_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(
        dir.path(),
        Options {
            on_durable: Some(Arc::new(|_| panic!("notifier bug"))),
            ..manual()
        },
    )
    .unwrap();
    store.put_session("c", meta(1)).unwrap();
    let lsn = store.commit().unwrap();
    // Written and fsynced before the notifier ran, so durable; then failed.
    store.wait_durable(lsn).unwrap();
    store.put_session("d", meta(1)).unwrap();
    let later = store.commit();
    let waited = later.and_then(|l| store.wait_durable(l));
    assert!(matches!(waited, Err(StoreError::Failed(_))), "{waited:?}");
}

/// A run that handed out ids and was killed before their records reached
/// the disk: the next run, opened later, gives none of them again (a
/// cluster's replicas may hold a message or an entry by such an id).
#[test]
fn ids_a_killed_run_gave_are_not_given_again() {
    let dir = tempfile::tempdir().unwrap();
    let opened = |ms| Options {
        opened_ms: Some(ms),
        ..manual()
    };
    let (mut store, _) = Store::open(dir.path(), opened(1_000)).unwrap();
    store.put_session("c", meta(60)).unwrap();
    let kept = store.put_message(&msg("t", b"kept")).unwrap();
    store.enqueue("c", &entry(kept)).unwrap();
    store.close().unwrap();
    // Staged, never committed: gone with the run.
    let (mut store, _) = Store::open(dir.path(), opened(1_001)).unwrap();
    let lost = store.put_message(&msg("t", b"lost")).unwrap();
    let lost_entry = store.enqueue("c", &entry(lost)).unwrap();
    drop(store);
    let (mut store, rec) = Store::open(dir.path(), opened(1_002)).unwrap();
    assert_eq!(rec.sessions[0].queue.len(), 1, "only what was committed");
    let again = store.put_message(&msg("t", b"again")).unwrap();
    let again_entry = store.enqueue("c", &entry(again)).unwrap();
    assert!(
        again.0 > lost.0 && lost.0 > kept.0,
        "{kept:?} {lost:?} {again:?}"
    );
    assert!(again_entry.0 > lost_entry.0);
}

/// A run whose wall clock was ahead of the next one's (a machine that
/// booted before its clock was set, a clock NTP stepped back): the next
/// run still gives none of the ids the former one gave, committed or not,
/// counting past the clock that run saved in the dir.
#[test]
fn ids_stay_past_a_run_whose_clock_was_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let now = unix_ms();
    let opened = |ms| Options {
        opened_ms: Some(ms),
        ..manual()
    };
    let (mut store, _) = Store::open(dir.path(), opened(now)).unwrap();
    store.put_session("c", meta(60)).unwrap();
    let kept = store.put_message(&msg("t", b"kept")).unwrap();
    store.enqueue("c", &entry(kept)).unwrap();
    store.close().unwrap();
    let (mut store, _) = Store::open(dir.path(), opened(now + 1)).unwrap();
    let lost = store.put_message(&msg("t", b"lost")).unwrap();
    let lost_entry = store.enqueue("c", &entry(lost)).unwrap();
    drop(store);
    // An hour behind: counting from this clock would give `lost` again.
    let (mut store, rec) = Store::open(dir.path(), opened(now - 3_600_000)).unwrap();
    assert_eq!(rec.sessions[0].queue.len(), 1, "only what was committed");
    assert!(store.counts_from_ms() > now, "{}", store.counts_from_ms());
    let again = store.put_message(&msg("t", b"again")).unwrap();
    let again_entry = store.enqueue("c", &entry(again)).unwrap();
    assert!(again.0 > lost.0, "{kept:?} {lost:?} {again:?}");
    assert!(again_entry.0 > lost_entry.0);
}

/// The writer thread saves the clock while the store is open, idle or not.
#[test]
fn an_open_store_saves_its_clock() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), manual()).unwrap();
    let saved = || {
        std::fs::read_to_string(dir.path().join("CLOCK"))
            .ok()
            .and_then(|t| {
                t.trim_end()
                    .strip_prefix("zerofan-store clock=")?
                    .parse::<u64>()
                    .ok()
            })
    };
    let first = saved().expect("saved at open");
    assert_eq!(first, store.counts_from_ms());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while saved().is_none_or(|ms| ms <= first) {
        assert!(std::time::Instant::now() < deadline, "not saved again");
        std::thread::sleep(Duration::from_millis(20));
    }
    store.close().unwrap();
}

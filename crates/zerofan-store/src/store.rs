//! [`Store`]: the handle the broker owns. Operations are staged in memory on
//! the caller's thread (no I/O, no locks); [`Store::commit`] hands them to the
//! writer thread as one unit and returns its [`Lsn`].

use crate::clock::{self, unix_ms};
use crate::error::StoreError;
use crate::format::{self, MsgBody, Record, HEADER_LEN};
use crate::model::{Model, Span};
use crate::types::{
    EntryId, InflightPhase, Lsn, MsgId, Options, QueueEntry, Recovered, RecoveryReport,
    SessionMeta, StoreStats, StoredMessage, StoredWill, SubOptions,
};
use crate::writer::{self, Chunk, Shared, Writer};
use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The embedded store: retained messages, persistent sessions and their QoS
/// 1/2 state, in one append-only log with group commit.
///
/// Single owner, used from one thread (the broker core): every operation takes
/// `&mut self`, only stages a record in memory and updates the index, so it
/// never blocks on I/O. [`Store::commit`] hands the staged records to the
/// writer thread and returns an [`Lsn`]; the commit is durable once
/// [`Store::durable_lsn`] reaches it, which the writer also announces through
/// [`crate::Options::on_durable`]. Operations that name a client id need a
/// session created by [`Store::put_session`] (in this or an earlier commit).
///
/// Messages are written once ([`Store::put_message`]) and referenced by id
/// from queue entries, inflight entries and retained slots. A message must be
/// referenced in the same commit that wrote it, or while something still
/// references it: at each commit, messages nothing references are forgotten
/// (their bytes become garbage for compaction).
pub struct Store {
    dir: PathBuf,
    model: Model,
    staged: Vec<u8>,
    staged_records: u64,
    /// Where the last staged frame starts (marked as a commit's end).
    last_frame: usize,
    /// Log length once everything committed so far is written.
    committed_end: u64,
    generation: u64,
    last_lsn: Lsn,
    next_msg: u64,
    next_entry: u64,
    next_key: u32,
    commits: u64,
    records: u64,
    compactions_started: u64,
    compact_min_bytes: u64,
    compact_garbage_ratio: f64,
    truncated_bytes: u64,
    /// UNIX milliseconds this run counts from (see `clock`).
    counts_from_ms: u64,
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .field("generation", &self.generation)
            .field("last_lsn", &self.last_lsn)
            .field("log_bytes", &self.committed_end)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Open (or create) the store in `dir` and rebuild everything it holds.
    ///
    /// A torn or corrupt tail is cut back to the last valid record, logged
    /// once and reported in [`RecoveryReport::truncated_bytes`]; that is never
    /// an error. A directory written by a newer format version is refused
    /// ([`StoreError::NewerFormat`]); one of an older version is read and
    /// marked as this version's (so the older build refuses it from then).
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<(Store, Recovered), StoreError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
        let bad = |reason: String| StoreError::BadDirectory {
            dir: dir.clone(),
            reason,
        };
        let manifest_path = dir.join(format::MANIFEST);
        let mut manifest_version = format::FORMAT_VERSION;
        let mut fresh = false;
        let generation = match std::fs::read(&manifest_path) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let (version, generation) =
                    format::parse_manifest(&text).map_err(|r| bad(r.into()))?;
                if version > format::FORMAT_VERSION {
                    return Err(StoreError::NewerFormat {
                        dir,
                        found: version,
                        supported: format::FORMAT_VERSION,
                    });
                }
                manifest_version = version;
                generation.ok_or_else(|| bad("MANIFEST has no generation".into()))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // A fresh store: the log first, then the manifest naming it.
                let path = dir.join(format::log_name(1));
                let mut f = File::create(&path).map_err(|e| StoreError::io(&path, e))?;
                f.write_all(&format::header(1, 0))
                    .and_then(|()| f.sync_all())
                    .map_err(|e| StoreError::io(&path, e))?;
                writer::write_manifest(&dir, 1).map_err(|e| StoreError::io(&dir, e))?;
                fresh = true;
                1
            }
            Err(e) => return Err(StoreError::io(&manifest_path, e)),
        };
        remove_leftovers(&dir, generation);

        let path = dir.join(format::log_name(generation));
        let data = std::fs::read(&path).map_err(|e| StoreError::io(&path, e))?;
        let (version, snapshot_len) =
            format::parse_header(&data).map_err(|r| bad(format!("{}: {r}", path.display())))?;
        if version > format::FORMAT_VERSION {
            return Err(StoreError::NewerFormat {
                dir,
                found: version,
                supported: format::FORMAT_VERSION,
            });
        }

        let mut model = Model::default();
        let mut report = RecoveryReport::default();
        let (pos, why_cut) = replay(&data, snapshot_len, &mut model, &mut report);
        model.sweep();
        if let Some(reason) = why_cut {
            report.truncated_bytes = (data.len() - pos) as u64;
            tracing::warn!(
                path = %path.display(),
                offset = pos,
                cut_bytes = report.truncated_bytes,
                reason,
                "zerofan store: cut the log back to its last complete commit"
            );
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| StoreError::io(&path, e))?;
            f.set_len(pos as u64)
                .and_then(|()| f.sync_all())
                .map_err(|e| StoreError::io(&path, e))?;
        }
        let (retained, sessions, unreadable) = model.recovered(&data[..pos]);
        report.ignored_records += unreadable;
        report.live_messages = model.live_messages() as u64;
        report.log_bytes = pos as u64;
        drop(data);
        if manifest_version < format::FORMAT_VERSION || version < format::FORMAT_VERSION {
            upgrade(&dir, &path, generation)?;
            tracing::info!(dir = %dir.display(), from = manifest_version.min(version),
                to = format::FORMAT_VERSION, "zerofan store: marked as the newer format");
        }

        // New ids count from the clock, past any of the last run: that run
        // may have handed out ids whose records never reached the disk
        // (staged, or written and not yet synced when it was killed), and a
        // cluster's replicas hold its messages and entries by those ids;
        // one given again would stand for another message there. Past the
        // last run's saved clock too, should the wall clock be behind it.
        let read_ms = options.opened_ms.unwrap_or_else(unix_ms);
        let floor = clock::floor(&dir, &path, fresh);
        if floor > read_ms.saturating_add(clock::AHEAD.as_millis() as u64) {
            tracing::warn!(
                dir = %dir.display(),
                behind_ms = floor - read_ms,
                "zerofan store: the wall clock is behind what an earlier run saw; counting from that instead"
            );
        }
        let counts_from_ms = read_ms.max(floor);
        clock::save(&dir, counts_from_ms).map_err(|e| StoreError::io(&dir, e))?;

        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        let shared = Arc::new(Shared::new(0));
        let writer = Writer {
            shared: shared.clone(),
            dir: dir.clone(),
            path: path.clone(),
            file,
            policy: options.fsync,
            notify: options.on_durable.clone(),
            counts_from_ms,
        };
        let handle = std::thread::Builder::new()
            .name("zerofan-store-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| StoreError::io(&dir, e))?;
        let first = ids_from_clock(counts_from_ms);
        let store = Store {
            dir,
            next_msg: (model.max_msg + 1).max(first),
            next_entry: (model.max_entry + 1).max(first),
            next_key: model.max_key.saturating_add(1),
            model,
            staged: Vec::with_capacity(64 << 10),
            staged_records: 0,
            last_frame: 0,
            committed_end: pos as u64,
            generation,
            last_lsn: 0,
            commits: 0,
            records: 0,
            compactions_started: 0,
            compact_min_bytes: options.compact_min_bytes,
            compact_garbage_ratio: options.compact_garbage_ratio,
            truncated_bytes: report.truncated_bytes,
            counts_from_ms,
            shared,
            writer: Some(handle),
        };
        let recovered = Recovered {
            retained,
            sessions,
            report,
        };
        Ok((store, recovered))
    }

    /// Encode `rec` into the staging buffer and apply it to the index.
    fn stage(&mut self, rec: &Record<'_>) -> Result<(), StoreError> {
        let start = self.staged.len();
        format::encode(rec, &mut self.staged).map_err(StoreError::Invalid)?;
        let span = Span {
            off: self.committed_end + start as u64,
            len: (self.staged.len() - start) as u32,
        };
        self.model.apply(rec, span);
        self.staged_records += 1;
        self.last_frame = start;
        Ok(())
    }

    fn key(&self, client_id: &str) -> Result<u32, StoreError> {
        self.model
            .key_of(client_id)
            .ok_or_else(|| StoreError::UnknownSession(client_id.to_owned()))
    }

    fn check_failed(&self) -> Result<(), StoreError> {
        match &self.shared.lock().failed {
            Some(msg) => Err(StoreError::Failed(msg.clone())),
            None => Ok(()),
        }
    }

    /// Write a message once; reference it from queues, inflight entries and
    /// the retained slot by the returned id (in this same commit).
    pub fn put_message(&mut self, msg: &StoredMessage) -> Result<MsgId, StoreError> {
        let id = self.next_msg;
        self.stage(&Record::Message {
            id,
            msg: MsgBody::Msg(msg),
        })?;
        self.next_msg += 1;
        Ok(MsgId(id))
    }

    /// Keep message `id` (unreferenced yet) through commits until
    /// [`Store::unpin_message`]. For writers that share one store: another
    /// writer's [`Store::commit`] forgets unreferenced messages, and this
    /// writer's reference to `id` may come after it.
    pub fn pin_message(&mut self, id: MsgId) {
        self.model.pin(id.0);
    }

    /// Message `id` may be forgotten at the next commit if nothing
    /// references it by then.
    pub fn unpin_message(&mut self, id: MsgId) {
        self.model.unpin(id.0);
    }

    /// Make `msg` the retained message of `topic` (replacing any other).
    pub fn set_retained(&mut self, topic: &str, msg: MsgId) -> Result<(), StoreError> {
        if !self.model.has_msg(msg.0) {
            return Err(StoreError::UnknownMessage(msg));
        }
        self.stage(&Record::Retain {
            msg: msg.0,
            topic: topic.as_bytes(),
        })
    }

    /// Clear the retained message of `topic` (nothing happens if it has none).
    pub fn clear_retained(&mut self, topic: &str) -> Result<(), StoreError> {
        self.stage(&Record::Unretain {
            topic: topic.as_bytes(),
        })
    }

    /// Create a persistent session, or update the expiry of an existing one
    /// (its subscriptions, queue and packet ids stay).
    pub fn put_session(&mut self, client_id: &str, meta: SessionMeta) -> Result<(), StoreError> {
        let key = match self.model.key_of(client_id) {
            Some(k) => k,
            None => {
                let k = self.next_key;
                self.next_key = self
                    .next_key
                    .checked_add(1)
                    .ok_or(StoreError::Invalid("session keys exhausted"))?;
                k
            }
        };
        self.stage(&Record::Session {
            key,
            expiry_interval: meta.expiry_interval,
            expires_at_ms: meta.expires_at_ms,
            client: client_id.as_bytes(),
        })
    }

    /// Forget a session and everything it holds (clean start, expiry, or a
    /// session that is no longer persistent). Nothing happens if unknown.
    pub fn drop_session(&mut self, client_id: &str) -> Result<(), StoreError> {
        match self.model.key_of(client_id) {
            Some(key) => self.stage(&Record::DropSession { key }),
            None => Ok(()),
        }
    }

    /// Add or replace a subscription.
    pub fn subscribe(
        &mut self,
        client_id: &str,
        filter: &str,
        options: SubOptions,
        id: Option<u32>,
    ) -> Result<(), StoreError> {
        let key = self.key(client_id)?;
        if options.qos > 2 || options.retain_handling > 2 {
            return Err(StoreError::Invalid("subscription options out of range"));
        }
        self.stage(&Record::Subscribe {
            key,
            options: options.to_byte(),
            id,
            filter: filter.as_bytes(),
        })
    }

    /// Remove a subscription (nothing happens if absent).
    pub fn unsubscribe(&mut self, client_id: &str, filter: &str) -> Result<(), StoreError> {
        let key = self.key(client_id)?;
        self.stage(&Record::Unsubscribe {
            key,
            filter: filter.as_bytes(),
        })
    }

    /// Append an entry to a session's queue.
    pub fn enqueue(&mut self, client_id: &str, entry: &QueueEntry) -> Result<EntryId, StoreError> {
        let key = self.key(client_id)?;
        if !self.model.has_msg(entry.msg.0) {
            return Err(StoreError::UnknownMessage(entry.msg));
        }
        if entry.qos > 2 {
            return Err(StoreError::Invalid("QoS above 2"));
        }
        let id = self.next_entry;
        self.stage(&Record::Enqueue {
            key,
            entry: id,
            msg: entry.msg.0,
            flags: entry.qos | (u8::from(entry.retain) << 2),
            sub_ids: Cow::Borrowed(&entry.subscription_ids),
            share: entry.share.as_deref().map(str::as_bytes),
        })?;
        self.next_entry += 1;
        Ok(EntryId(id))
    }

    /// Remove a queue entry that will not be sent (expired, too large,
    /// dropped for room, handed to another shared-subscription member).
    pub fn dequeue(&mut self, client_id: &str, entry: EntryId) -> Result<(), StoreError> {
        let key = self.entry_key(client_id, entry)?;
        self.stage(&Record::Dequeue {
            key,
            entry: entry.0,
        })
    }

    /// A queue entry was sent as a QoS 1/2 PUBLISH with `packet_id`: it moves
    /// to the inflight window (phase [`InflightPhase::PublishSent`]).
    pub fn send(
        &mut self,
        client_id: &str,
        entry: EntryId,
        packet_id: u16,
    ) -> Result<(), StoreError> {
        let key = self.entry_key(client_id, entry)?;
        self.stage(&Record::Send {
            key,
            entry: entry.0,
            pid: packet_id,
        })
    }

    fn entry_key(&self, client_id: &str, entry: EntryId) -> Result<u32, StoreError> {
        let key = self.key(client_id)?;
        if !self
            .model
            .session(key)
            .is_some_and(|s| s.has_entry(entry.0))
        {
            return Err(StoreError::UnknownItem {
                client_id: client_id.to_owned(),
                what: format!("queue entry {}", entry.0),
            });
        }
        Ok(key)
    }

    fn inflight_key(
        &self,
        client_id: &str,
        packet_id: u16,
    ) -> Result<(u32, InflightPhase), StoreError> {
        let key = self.key(client_id)?;
        match self
            .model
            .session(key)
            .and_then(|s| s.inflight_phase(packet_id))
        {
            Some(phase) => Ok((key, phase)),
            None => Err(StoreError::UnknownItem {
                client_id: client_id.to_owned(),
                what: format!("inflight packet id {packet_id}"),
            }),
        }
    }

    /// PUBREC arrived for an outbound QoS 2 delivery: it moves to phase
    /// [`InflightPhase::PubrecReceived`] and no longer holds its message.
    /// Repeating it is harmless.
    pub fn pubrec(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        let (key, phase) = self.inflight_key(client_id, packet_id)?;
        if phase == InflightPhase::PubrecReceived {
            return Ok(());
        }
        self.stage(&Record::Pubrec {
            key,
            pid: packet_id,
        })
    }

    /// An outbound delivery is finished (PUBACK, PUBCOMP) or abandoned.
    pub fn complete(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        let (key, _) = self.inflight_key(client_id, packet_id)?;
        self.stage(&Record::Complete {
            key,
            pid: packet_id,
        })
    }

    /// An inbound QoS 2 PUBLISH was taken (PUBREC sent): remember its packet
    /// id until PUBREL, so a resend is not routed twice, across restarts too.
    pub fn qos2_received(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        let key = self.key(client_id)?;
        if self
            .model
            .session(key)
            .is_some_and(|s| s.has_qos2(packet_id))
        {
            return Ok(());
        }
        self.stage(&Record::Qos2In {
            key,
            pid: packet_id,
        })
    }

    /// PUBREL arrived for an inbound QoS 2 packet id.
    pub fn qos2_released(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        let key = self.key(client_id)?;
        if !self
            .model
            .session(key)
            .is_some_and(|s| s.has_qos2(packet_id))
        {
            return Ok(());
        }
        self.stage(&Record::Qos2Done {
            key,
            pid: packet_id,
        })
    }

    /// Keep a will waiting for its delay (replacing any other of the session).
    pub fn set_will(&mut self, client_id: &str, will: &StoredWill) -> Result<(), StoreError> {
        let key = self.key(client_id)?;
        self.stage(&Record::Will {
            key,
            due_ms: will.due_at_ms,
            armed: will.armed,
            expiry: will.message_expiry_interval,
            msg: MsgBody::Msg(&will.message),
        })
    }

    /// The will was published or cancelled.
    pub fn clear_will(&mut self, client_id: &str) -> Result<(), StoreError> {
        let key = self.key(client_id)?;
        self.stage(&Record::ClearWill { key })
    }

    /// Record a number that goes with the session, such as the ownership
    /// epoch it is held under in a cluster. It replaces the one recorded
    /// before, goes when the session does, and comes back as
    /// [`crate::RecoveredSession::epoch`].
    pub fn set_epoch(&mut self, client_id: &str, epoch: u64) -> Result<(), StoreError> {
        self.set_epoch_at(client_id, epoch, 0)
    }

    /// [`Store::set_epoch`] with a version of the session under that
    /// epoch (a cluster replica's: how far its copy follows the owner),
    /// read back as [`crate::RecoveredSession::version`].
    pub fn set_epoch_at(
        &mut self,
        client_id: &str,
        epoch: u64,
        version: u64,
    ) -> Result<(), StoreError> {
        let key = self.key(client_id)?;
        self.stage(&Record::Epoch {
            key,
            epoch,
            version,
        })
    }

    /// Hand everything staged since the last commit to the writer thread, as
    /// one unit, and return its LSN. Never blocks on I/O. With nothing staged
    /// it returns the previous LSN (so "wait until durable" still works).
    ///
    /// May also schedule a compaction (see [`Options`]); it runs on the
    /// writer thread.
    pub fn commit(&mut self) -> Result<Lsn, StoreError> {
        if self.staged.is_empty() {
            self.check_failed()?;
            return Ok(self.last_lsn);
        }
        self.model.sweep();
        format::mark_commit_end(&mut self.staged, self.last_frame);
        let lsn = self.last_lsn + 1;
        let len = self.staged.len() as u64;
        let wake = {
            let mut inbox = self.shared.lock();
            if let Some(msg) = &inbox.failed {
                return Err(StoreError::Failed(msg.clone()));
            }
            // The writer waits only on an empty inbox; if it was not empty,
            // it was woken already and will take this commit too.
            let wake = inbox.chunks.is_empty();
            match inbox.chunks.back_mut() {
                Some(Chunk::Data { buf, lsn: last }) => {
                    buf.extend_from_slice(&self.staged);
                    *last = lsn;
                    self.staged.clear();
                }
                _ => {
                    let spare = inbox.spare.pop().unwrap_or_default();
                    let buf = std::mem::replace(&mut self.staged, spare);
                    inbox.chunks.push_back(Chunk::Data { buf, lsn });
                }
            }
            wake
        };
        if wake {
            self.shared.work.notify_one();
        }
        self.last_lsn = lsn;
        self.committed_end += len;
        self.commits += 1;
        self.records += self.staged_records;
        self.staged_records = 0;
        if self.garbage_over_threshold() {
            self.schedule_compaction();
        }
        Ok(lsn)
    }

    fn garbage_over_threshold(&self) -> bool {
        let size = self.committed_end;
        if size < self.compact_min_bytes || self.compaction_running() {
            return false;
        }
        let garbage = size.saturating_sub(HEADER_LEN + self.model.live);
        garbage as f64 >= self.compact_garbage_ratio * size as f64
    }

    fn compaction_running(&self) -> bool {
        self.shared.compactions.load(Ordering::Acquire) < self.compactions_started
    }

    /// Rewrite the live records into a new log, now (on the writer thread,
    /// after every commit made so far). Commits staged but not yet committed
    /// are committed first. Returns the LSN after which the compacted log is
    /// in place; [`Store::wait_durable`] on it waits for the switch.
    pub fn compact(&mut self) -> Result<Lsn, StoreError> {
        self.commit()?;
        self.schedule_compaction();
        Ok(self.last_lsn)
    }

    fn schedule_compaction(&mut self) {
        let (ranges, new_len) = self.model.plan_compaction(HEADER_LEN);
        self.generation += 1;
        self.compactions_started += 1;
        self.committed_end = new_len;
        {
            let mut inbox = self.shared.lock();
            inbox.chunks.push_back(Chunk::Compact {
                generation: self.generation,
                ranges,
            });
        }
        self.shared.work.notify_one();
    }

    /// The highest LSN that is durable under the fsync policy. Cheap (one
    /// atomic load): poll it from an event loop when notified.
    pub fn durable_lsn(&self) -> Lsn {
        self.shared.durable.load(Ordering::Acquire)
    }

    /// Block until `lsn` is durable (for tests, tools and shutdown; the
    /// broker's event loop should use the notifier instead). Fails if the
    /// writer failed first.
    pub fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError> {
        let mut inbox = self.shared.lock();
        loop {
            if self.shared.durable.load(Ordering::Acquire) >= lsn {
                return Ok(());
            }
            if let Some(msg) = &inbox.failed {
                return Err(StoreError::Failed(msg.clone()));
            }
            inbox = self
                .shared
                .progress
                .wait(inbox)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wait until every compaction scheduled so far has finished.
    pub fn wait_compacted(&self) -> Result<(), StoreError> {
        let mut inbox = self.shared.lock();
        loop {
            if !self.compaction_running() {
                return Ok(());
            }
            if let Some(msg) = &inbox.failed {
                return Err(StoreError::Failed(msg.clone()));
            }
            inbox = self
                .shared
                .progress
                .wait(inbox)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// UNIX milliseconds this run's counts start from: the clock when the
    /// store was opened, or the clock an earlier run saved in the dir if
    /// that is later (see the `CLOCK` file in the format). The broker's
    /// cluster counts start there too, as the store's ids do.
    pub fn counts_from_ms(&self) -> u64 {
        self.counts_from_ms
    }

    /// Counters, for metrics and tests.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            commits: self.commits,
            records: self.records,
            write_rounds: self.shared.rounds.load(Ordering::Relaxed),
            fsyncs: self.shared.fsyncs.load(Ordering::Relaxed),
            bytes_written: self.shared.bytes_written.load(Ordering::Relaxed),
            compactions: self.shared.compactions.load(Ordering::Relaxed),
            log_bytes: self.committed_end,
            live_bytes: self.model.live,
            truncated_bytes: self.truncated_bytes,
            durable_lsn: self.durable_lsn(),
        }
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Commit what is staged, write and fsync everything, and stop the writer
    /// thread. Dropping the store does the same but discards uncommitted
    /// operations and cannot report an error.
    pub fn close(mut self) -> Result<(), StoreError> {
        self.commit()?;
        self.shutdown();
        self.check_failed()
    }

    fn shutdown(&mut self) {
        if let Some(handle) = self.writer.take() {
            self.shared.lock().shutdown = true;
            self.shared.work.notify_one();
            if handle.join().is_err() {
                tracing::error!("zerofan store: the writer thread panicked");
            }
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Replay the log `data` into `model`: the compacted snapshot (the first
/// `snapshot_len` bytes after the header) frame by frame, then every complete
/// commit. Returns where the valid log ends and, if it had a bad tail, why.
fn replay(
    data: &[u8],
    snapshot_len: u64,
    model: &mut Model,
    report: &mut RecoveryReport,
) -> (usize, Option<&'static str>) {
    let snapshot_end = HEADER_LEN.saturating_add(snapshot_len);
    let mut pos = HEADER_LEN as usize;
    // End of the last complete commit, and the frames read since.
    let mut valid_end = pos;
    let mut pending: Vec<(Record<'_>, Span)> = Vec::new();
    let mut why_cut = None;
    while pos < data.len() {
        let (body, len, end) = match format::read_frame(data, pos) {
            format::Frame::Valid { body, len, end } => (body, len, end),
            format::Frame::Torn => {
                why_cut = Some("torn record (partial write)");
                break;
            }
            format::Frame::Corrupt => {
                why_cut = Some("checksum mismatch");
                break;
            }
        };
        let rec = match format::decode(body) {
            Ok(rec) => rec,
            Err(reason) => {
                why_cut = Some(reason);
                break;
            }
        };
        let span = Span {
            off: pos as u64,
            len: len as u32,
        };
        pos += len;
        pending.push((rec, span));
        if end || pos as u64 <= snapshot_end {
            for (rec, span) in pending.drain(..) {
                if !model.apply(&rec, span) {
                    report.ignored_records += 1;
                }
                report.records += 1;
            }
            valid_end = pos;
        }
    }
    if why_cut.is_none() && !pending.is_empty() {
        why_cut = Some("unfinished commit");
    }
    model.sweep();
    (valid_end, why_cut)
}

/// Mark a store of an older format (whose layout this build reads as it
/// is) as this build's, before anything of this format is written to it:
/// an older build then refuses it ([`StoreError::NewerFormat`]) instead of
/// taking the first newer record for a damaged tail and cutting the log
/// there. The log header first, then the manifest: either one refuses.
fn upgrade(dir: &Path, path: &Path, generation: u64) -> Result<(), StoreError> {
    let mut f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| StoreError::io(path, e))?;
    f.seek(SeekFrom::Start(format::HEADER_VERSION_AT))
        .and_then(|_| f.write_all(&format::FORMAT_VERSION.to_le_bytes()))
        .and_then(|()| f.sync_all())
        .map_err(|e| StoreError::io(path, e))?;
    writer::write_manifest(dir, generation).map_err(|e| StoreError::io(dir, e))
}

/// Delete what an interrupted compaction or manifest switch left behind:
/// logs of other generations and a temporary manifest.
fn remove_leftovers(dir: &Path, generation: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let stale = name == "MANIFEST.tmp"
            || clock::is_leftover(&name)
            || format::parse_log_name(&name).is_some_and(|g| g != generation);
        if stale {
            if let Err(err) = std::fs::remove_file(e.path()) {
                tracing::warn!(path = %e.path().display(), error = %err, "zerofan store: could not delete a leftover file");
            }
        }
    }
}

/// The first id a store opened at UNIX milliseconds `ms` gives: the
/// milliseconds times 2²⁰, so a later run starts past every id an earlier
/// one could give (over a million a millisecond), and below the ids a
/// cluster replica keeps for its own entries (2⁶², reached in 2109).
fn ids_from_clock(ms: u64) -> u64 {
    ms.min((1 << 42) - 1) << 20
}

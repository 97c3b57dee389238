//! The writer thread: the only code that writes the log.
//!
//! Commits arrive as byte chunks in an inbox guarded by a mutex. Each round
//! the writer takes *everything* waiting, writes it with one `write_all` per
//! chunk, and (under [`FsyncPolicy::Always`]) calls fsync once: that is the
//! group commit, one fsync for every commit that arrived while the previous
//! fsync ran. Then it publishes the highest durable LSN and calls the
//! notifier. Compaction plans travel through the same inbox, so they run
//! exactly between the commits before and after them. Once a second, busy
//! or idle, it also saves the store's clock (see `clock`).

use crate::clock;
use crate::format::{self, HEADER_LEN};
use crate::types::{DurableNotifier, FsyncPolicy, Lsn};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Work for the writer, in commit order.
pub(crate) enum Chunk {
    /// Encoded records of one or more commits, up to `lsn`.
    Data { buf: Vec<u8>, lsn: Lsn },
    /// Rewrite the live records into generation `generation`: copy these
    /// `(offset, length)` ranges of the current log, in order.
    Compact {
        generation: u64,
        ranges: Vec<(u64, u64)>,
    },
}

/// What the store and its writer thread share.
pub(crate) struct Shared {
    pub inbox: Mutex<Inbox>,
    /// Wakes the writer when work arrives.
    pub work: Condvar,
    /// Wakes callers of `wait_durable` when the durable LSN moves (or the
    /// writer fails).
    pub progress: Condvar,
    pub durable: AtomicU64,
    pub fsyncs: AtomicU64,
    pub rounds: AtomicU64,
    pub bytes_written: AtomicU64,
    pub compactions: AtomicU64,
}

#[derive(Default)]
pub(crate) struct Inbox {
    pub chunks: VecDeque<Chunk>,
    /// Emptied buffers coming back for reuse, so steady-state commits do not
    /// allocate.
    pub spare: Vec<Vec<u8>>,
    pub shutdown: bool,
    /// Set once by the writer when a write, fsync or compaction failed.
    pub failed: Option<String>,
}

impl Shared {
    pub fn new(durable: Lsn) -> Self {
        Shared {
            inbox: Mutex::new(Inbox::default()),
            work: Condvar::new(),
            progress: Condvar::new(),
            durable: AtomicU64::new(durable),
            fsyncs: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            compactions: AtomicU64::new(0),
        }
    }

    /// Lock the inbox. A poisoned lock only means another thread panicked
    /// while holding it; the data is plain buffers, still usable.
    pub fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The writer thread's own state.
pub(crate) struct Writer {
    pub shared: std::sync::Arc<Shared>,
    pub dir: PathBuf,
    pub path: PathBuf,
    pub file: File,
    pub policy: FsyncPolicy,
    pub notify: Option<DurableNotifier>,
    /// The store's counts start here; the clock saved is never below it
    /// (see `clock`).
    pub counts_from_ms: u64,
}

impl Writer {
    /// Run until shutdown (or a failure), then fsync what was written.
    pub fn run(mut self) {
        // A panic (say, in the notifier) must fail the store loudly, not leave
        // callers waiting for a durable LSN that never comes.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.main_loop()))
            .unwrap_or_else(|_| Err(io::Error::other("the writer thread panicked")));
        if let Err(e) = outcome {
            let msg = e.to_string();
            tracing::error!(error = %msg, "zerofan store: write failed; the store accepts no more writes");
            let mut inbox = self.shared.lock();
            inbox.failed = Some(msg);
            drop(inbox);
            self.shared.progress.notify_all();
        }
    }

    fn main_loop(&mut self) -> io::Result<()> {
        let mut written: Lsn = self.shared.durable.load(Ordering::Acquire);
        let mut synced: Lsn = written;
        let mut last_sync = Instant::now();
        // Saved at open already.
        let mut clock_due = Instant::now() + clock::SAVE_EVERY;
        let mut clock_failed = false;
        loop {
            let (chunks, shutdown) = {
                let mut inbox = self.shared.lock();
                loop {
                    if !inbox.chunks.is_empty() || inbox.shutdown {
                        break;
                    }
                    let now = Instant::now();
                    let mut until = clock_due;
                    if let FsyncPolicy::Interval(every) = self.policy {
                        if synced < written {
                            until = until.min(last_sync + every);
                        }
                    }
                    if now >= until {
                        break;
                    }
                    inbox = self
                        .shared
                        .work
                        .wait_timeout(inbox, until - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                (std::mem::take(&mut inbox.chunks), inbox.shutdown)
            };
            if Instant::now() >= clock_due {
                let ms = clock::unix_ms().max(self.counts_from_ms);
                if let Err(e) = clock::save(&self.dir, ms) {
                    // Only the guard against a clock stepping back is
                    // weaker; the log goes on.
                    if !clock_failed {
                        tracing::warn!(dir = %self.dir.display(), error = %e, "zerofan store: could not save the clock");
                        clock_failed = true;
                    }
                }
                clock_due = Instant::now() + clock::SAVE_EVERY;
            }
            let mut spare = Vec::new();
            let mut compacted = false;
            let idle = chunks.is_empty() && !shutdown;
            for chunk in chunks {
                match chunk {
                    Chunk::Data { mut buf, lsn } => {
                        self.file.write_all(&buf)?;
                        self.shared
                            .bytes_written
                            .fetch_add(buf.len() as u64, Ordering::Relaxed);
                        written = lsn;
                        buf.clear();
                        spare.push(buf);
                    }
                    Chunk::Compact { generation, ranges } => {
                        self.compact(generation, &ranges)?;
                        // The new log was fsynced whole: everything so far is on disk.
                        synced = written;
                        last_sync = Instant::now();
                        compacted = true;
                    }
                }
            }
            if !spare.is_empty() {
                let mut inbox = self.shared.lock();
                inbox.spare.append(&mut spare);
            }
            let sync_now = synced < written
                && match self.policy {
                    FsyncPolicy::Always => true,
                    FsyncPolicy::Interval(every) => last_sync.elapsed() >= every || shutdown,
                    FsyncPolicy::Never => shutdown,
                };
            if sync_now {
                self.file.sync_data()?;
                self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
                synced = written;
                last_sync = Instant::now();
            }
            let durable = match self.policy {
                FsyncPolicy::Always => synced,
                // Written to the operating system: survives the process.
                FsyncPolicy::Interval(_) | FsyncPolicy::Never => written,
            };
            if !idle || sync_now {
                self.shared.rounds.fetch_add(1, Ordering::Relaxed);
            }
            let advanced = durable > self.shared.durable.load(Ordering::Acquire);
            if advanced {
                self.shared.durable.store(durable, Ordering::Release);
            }
            if advanced || compacted {
                {
                    // Take the lock so a waiter cannot miss the wake-up between
                    // its check and its wait.
                    let _inbox = self.shared.lock();
                }
                self.shared.progress.notify_all();
            }
            if advanced {
                if let Some(notify) = &self.notify {
                    notify(durable);
                }
            }
            if shutdown && self.shared.lock().chunks.is_empty() {
                if synced < written {
                    self.file.sync_data()?;
                    self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(());
            }
        }
    }

    /// Copy the live ranges into a new log, make it durable, switch the
    /// manifest to it atomically, then delete the old log. A crash at any
    /// point leaves either the old or the new log named by the manifest.
    fn compact(&mut self, generation: u64, ranges: &[(u64, u64)]) -> io::Result<()> {
        let started = Instant::now();
        let new_path = self.dir.join(format::log_name(generation));
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&new_path)?);
        let snapshot: u64 = ranges.iter().map(|(_, len)| len).sum();
        out.write_all(&format::header(generation, snapshot))?;
        let mut src = File::open(&self.path)?;
        let mut copied = HEADER_LEN;
        for &(off, len) in ranges {
            src.seek(SeekFrom::Start(off))?;
            let n = io::copy(&mut (&mut src).take(len), &mut out)?;
            if n != len {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "compaction: log shorter than its index",
                ));
            }
            copied += len;
        }
        let new_file = out.into_inner().map_err(|e| e.into_error())?;
        new_file.sync_all()?;
        write_manifest(&self.dir, generation)?;
        drop(new_file);
        let file = OpenOptions::new().append(true).open(&new_path)?;
        let old = std::mem::replace(&mut self.path, new_path);
        self.file = file;
        if let Err(e) = std::fs::remove_file(&old) {
            tracing::warn!(path = %old.display(), error = %e, "zerofan store: could not delete the old log");
        }
        self.shared.compactions.fetch_add(1, Ordering::Relaxed);
        self.shared
            .bytes_written
            .fetch_add(copied, Ordering::Relaxed);
        self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            generation,
            bytes = copied,
            ms = started.elapsed().as_millis() as u64,
            "zerofan store: compacted the log"
        );
        Ok(())
    }
}

/// Replace the manifest atomically (write a temporary file, fsync, rename,
/// fsync the directory).
pub(crate) fn write_manifest(dir: &Path, generation: u64) -> io::Result<()> {
    let tmp = dir.join("MANIFEST.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(format::manifest_text(generation).as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(format::MANIFEST))?;
    sync_dir(dir)
}

/// fsync a directory, so a rename or a new file in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

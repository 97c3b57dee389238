//! The Raft log and vote, durable on a [`Disk`]: an append-only file of
//! checksummed records, replayed at start; a torn last record (a crash
//! before fsync) is cut off.

use crate::disk::Disk;
use crate::types::{StorageError, TypeConfig};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    Entry, ErrorSubject, ErrorVerb, LogId, LogState, OptionalSend, RaftLogId, RaftLogReader, Vote,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard};

const LOG: &str = "raft-log";
const VOTE: &str = "raft-vote";
/// A record larger than this is corruption, not data.
const MAX_RECORD: usize = 64 * 1024 * 1024;

#[derive(Serialize, Deserialize)]
enum Record {
    Entry(Entry<TypeConfig>),
    /// Entries from this index on are gone.
    Truncate(u64),
    /// Entries up to this log id are gone (in a snapshot).
    Purge(LogId<u64>),
}

/// Header: payload length and CRC32 of the payload, little endian.
fn encode(record: &Record, out: &mut Vec<u8>) -> io::Result<()> {
    let body = serde_json::to_vec(record).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("record too large"))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(())
}

/// The records of `buf` up to the first incomplete or damaged one, and
/// where that one starts.
fn decode_all(buf: &[u8]) -> (Vec<Record>, usize) {
    let mut at = 0;
    let mut records = Vec::new();
    while buf.len() - at >= 8 {
        let len = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
        let crc = u32::from_le_bytes([buf[at + 4], buf[at + 5], buf[at + 6], buf[at + 7]]);
        if len > MAX_RECORD || buf.len() - at - 8 < len {
            break;
        }
        let body = &buf[at + 8..at + 8 + len];
        if crc32fast::hash(body) != crc {
            break;
        }
        match serde_json::from_slice(body) {
            Ok(r) => records.push(r),
            Err(_) => break,
        }
        at += 8 + len;
    }
    (records, at)
}

struct Inner {
    disk: Arc<dyn Disk>,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    vote: Option<Vote<u64>>,
    purged: Option<LogId<u64>>,
    /// Records in the file, to know when rewriting it pays.
    records: usize,
}

impl Inner {
    fn rewrite(&mut self) -> io::Result<()> {
        let mut buf = Vec::new();
        if let Some(p) = self.purged {
            encode(&Record::Purge(p), &mut buf)?;
        }
        for e in self.entries.values() {
            encode(&Record::Entry(e.clone()), &mut buf)?;
        }
        self.disk.replace(LOG, &buf)?;
        self.records = self.entries.len() + 1;
        Ok(())
    }
}

/// The log store; clones share it (one is openraft's log reader).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
}

fn io_error(subject: ErrorSubject<u64>, verb: ErrorVerb, e: io::Error) -> StorageError {
    StorageError::from_io_error(subject, verb, e)
}

impl LogStore {
    /// Replay what `disk` holds.
    pub fn open(disk: Arc<dyn Disk>) -> io::Result<LogStore> {
        let vote = match disk.read(VOTE)? {
            Some(b) => Some(serde_json::from_slice(&b).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("raft vote file: {e}"))
            })?),
            None => None,
        };
        let bytes = disk.read(LOG)?.unwrap_or_default();
        let (records, good) = decode_all(&bytes);
        let mut inner = Inner {
            disk,
            entries: BTreeMap::new(),
            vote,
            purged: None,
            records: records.len(),
        };
        for r in records {
            match r {
                Record::Entry(e) => {
                    inner.entries.insert(e.log_id.index, e);
                }
                Record::Truncate(i) => {
                    inner.entries.split_off(&i);
                }
                Record::Purge(id) => {
                    inner.entries = inner.entries.split_off(&(id.index + 1));
                    inner.purged = Some(id);
                }
            }
        }
        if good < bytes.len() {
            // Appends must not land behind a torn record.
            tracing::warn!(
                bytes = bytes.len() - good,
                "raft log ends in an incomplete record (crash before fsync); cut off"
            );
            inner.rewrite()?;
        }
        Ok(LogStore {
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner>, StorageError> {
        self.inner.lock().map_err(|_| {
            io_error(
                ErrorSubject::Logs,
                ErrorVerb::Read,
                io::Error::other("log store lock poisoned"),
            )
        })
    }

    /// Whether nothing was ever stored: a fresh node.
    pub fn is_empty(&self) -> bool {
        self.lock()
            .map(|i| i.vote.is_none() && i.entries.is_empty() && i.purged.is_none())
            .unwrap_or(false)
    }

    /// Index of the last entry held (tests).
    #[cfg(test)]
    pub fn last_index(&self) -> Option<u64> {
        let i = self.lock().ok()?;
        i.entries
            .keys()
            .next_back()
            .copied()
            .or(i.purged.map(|p| p.index))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let inner = self.lock()?;
        Ok(inner.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let inner = self.lock()?;
        let last = inner
            .entries
            .values()
            .next_back()
            .map(|e| *e.get_log_id())
            .or(inner.purged);
        Ok(LogState {
            last_purged_log_id: inner.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError> {
        let mut inner = self.lock()?;
        let bytes = serde_json::to_vec(vote)
            .map_err(|e| io_error(ErrorSubject::Vote, ErrorVerb::Write, io::Error::other(e)))?;
        inner
            .disk
            .replace(VOTE, &bytes)
            .map_err(|e| io_error(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        Ok(self.lock()?.vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock()?;
        let entries: Vec<_> = entries.into_iter().collect();
        let mut buf = Vec::new();
        let written = (|| {
            for e in &entries {
                encode(&Record::Entry(e.clone()), &mut buf)?;
            }
            // Written and fsynced before openraft hears it is persisted.
            inner.disk.append(LOG, &buf)
        })();
        match written {
            Ok(()) => {
                inner.records += entries.len();
                for e in entries {
                    inner.entries.insert(e.log_id.index, e);
                }
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(io_error(ErrorSubject::Logs, ErrorVerb::Write, e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        let mut inner = self.lock()?;
        let mut buf = Vec::new();
        encode(&Record::Truncate(log_id.index), &mut buf)
            .and_then(|_| inner.disk.append(LOG, &buf))
            .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Delete, e))?;
        inner.records += 1;
        inner.entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError> {
        let mut inner = self.lock()?;
        inner.entries = inner.entries.split_off(&(log_id.index + 1));
        inner.purged = Some(log_id);
        let result = if inner.records > 2 * inner.entries.len() + 256 {
            inner.rewrite()
        } else {
            let mut buf = Vec::new();
            encode(&Record::Purge(log_id), &mut buf).and_then(|_| inner.disk.append(LOG, &buf))
        };
        result.map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Delete, e))?;
        inner.records += 1;
        Ok(())
    }
}

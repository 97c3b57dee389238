//! Where the Raft log, vote and snapshot live: a directory on disk, or memory
//! (simulation, where a "crash" may leave a torn record at the end of a log).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
#[cfg(test)]
use std::sync::Arc;
use std::sync::Mutex;

/// Durable named files. Every write has reached stable storage (fsync) when
/// the call returns: openraft is told "persisted" only after it.
pub trait Disk: Send + Sync + 'static {
    /// Whole contents of `name`, or `None` when it does not exist.
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>>;
    /// Append `data` to `name` and fsync.
    fn append(&self, name: &str, data: &[u8]) -> io::Result<()>;
    /// Replace `name` atomically (all old or all new after a crash).
    fn replace(&self, name: &str, data: &[u8]) -> io::Result<()>;
}

/// Files in one directory.
pub struct FsDisk {
    dir: PathBuf,
    // The log is appended to constantly; keep its handle open.
    appenders: Mutex<HashMap<String, File>>,
}

impl FsDisk {
    /// Use (and create) `dir`.
    pub fn open(dir: PathBuf) -> io::Result<FsDisk> {
        fs::create_dir_all(&dir)?;
        Ok(FsDisk {
            dir,
            appenders: Mutex::new(HashMap::new()),
        })
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

impl Disk for FsDisk {
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        match fs::read(self.dir.join(name)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn append(&self, name: &str, data: &[u8]) -> io::Result<()> {
        let mut files = self
            .appenders
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        if !files.contains_key(name) {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(name))?;
            self.sync_dir()?;
            files.insert(name.to_string(), f);
        }
        let f = files
            .get_mut(name)
            .ok_or_else(|| io::Error::other("appender vanished"))?;
        f.write_all(data)?;
        f.sync_data()
    }

    fn replace(&self, name: &str, data: &[u8]) -> io::Result<()> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        {
            let mut f = File::create(&tmp)?;
            f.write_all(data)?;
            f.sync_all()?;
        }
        // A handle opened for append would keep writing to the old inode.
        if let Ok(mut files) = self.appenders.lock() {
            files.remove(name);
        }
        fs::rename(&tmp, self.dir.join(name))?;
        self.sync_dir()
    }
}

#[cfg(test)]
/// Memory that outlives a simulated node: what a crashed node finds again.
#[derive(Clone, Default)]
pub struct MemDisk {
    files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
}

#[cfg(test)]
impl MemDisk {
    /// A crash in the middle of an append that never reached fsync: the
    /// start of a record is on disk, the rest is not.
    pub fn tear(&self, name: &str, garbage: &[u8]) {
        if let Ok(mut files) = self.files.lock() {
            files
                .entry(name.to_string())
                .or_default()
                .extend_from_slice(garbage);
        }
    }
}

#[cfg(test)]
impl Disk for MemDisk {
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let files = self
            .files
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        Ok(files.get(name).cloned())
    }

    fn append(&self, name: &str, data: &[u8]) -> io::Result<()> {
        let mut files = self
            .files
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        files
            .entry(name.to_string())
            .or_default()
            .extend_from_slice(data);
        Ok(())
    }

    fn replace(&self, name: &str, data: &[u8]) -> io::Result<()> {
        let mut files = self
            .files
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        files.insert(name.to_string(), data.to_vec());
        Ok(())
    }
}

//! The store's clock: how far a run may have counted, saved in the data
//! dir, so that the next run counts past it even if the wall clock stepped
//! back in between (a machine that boots before its clock is set, a clock
//! corrected by NTP).
//!
//! Store ids count from the time of opening (`ids_from_clock`), and so do
//! the broker's cluster counts (change numbers, strand marks): a run gives
//! none that a former run gave, which a cluster's replicas may still hold.
//! That holds only while the clock moves forward across a restart. So the
//! writer thread saves the wall clock (never less than the floor it was
//! opened with) in `CLOCK` every [`SAVE_EVERY`], and the next run counts
//! from at least that time plus [`AHEAD`]: what the former run may have
//! counted after its last save.
//!
//! A dir without a readable `CLOCK` (written by an older build, or torn by
//! a crash of the machine) takes the time the log was last written,
//! plus [`AHEAD`], instead.

use std::io::{self, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The file that holds the saved clock.
pub(crate) const CLOCK: &str = "CLOCK";
const CLOCK_TMP: &str = "CLOCK.tmp";

/// How often the writer thread saves the clock.
pub(crate) const SAVE_EVERY: Duration = Duration::from_secs(1);

/// How far past its last save a run may have counted: the time to its
/// next save, with room for a writer thread held up by a slow fsync or a
/// compaction while the broker goes on.
pub(crate) const AHEAD: Duration = Duration::from_secs(60);

/// The least UNIX milliseconds a run opening `dir`, whose log is
/// `log_path`, must count from; 0 for a dir no run wrote to.
pub(crate) fn floor(dir: &Path, log_path: &Path, fresh: bool) -> u64 {
    if fresh {
        return 0;
    }
    let ahead = AHEAD.as_millis() as u64;
    let saved = match std::fs::read_to_string(dir.join(CLOCK)) {
        Ok(text) => match parse(&text) {
            Some(ms) => Some(ms),
            None => {
                tracing::warn!(dir = %dir.display(), "zerofan store: CLOCK unreadable; counting from the log's time instead");
                None
            }
        },
        Err(_) => None,
    };
    let saved = saved.or_else(|| {
        let written = std::fs::metadata(log_path)
            .and_then(|m| m.modified())
            .ok()?;
        Some(unix_ms_of(written))
    });
    saved.map_or(0, |ms| ms.saturating_add(ahead))
}

/// Save `ms` as the clock: written aside, then renamed over `CLOCK`, so a
/// reader sees the old value or the new one. Not fsynced: a crash of the
/// machine that loses it leaves the log's time (see the module doc).
pub(crate) fn save(dir: &Path, ms: u64) -> io::Result<()> {
    let tmp = dir.join(CLOCK_TMP);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text(ms).as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, dir.join(CLOCK))
}

/// Whether `name` is a leftover of an interrupted [`save`].
pub(crate) fn is_leftover(name: &str) -> bool {
    name == CLOCK_TMP
}

fn text(ms: u64) -> String {
    format!("zerofan-store clock={ms}\n")
}

fn parse(text: &str) -> Option<u64> {
    text.strip_prefix("zerofan-store clock=")?
        .trim_end()
        .parse()
        .ok()
}

/// The wall clock in UNIX milliseconds (0 before 1970), what store ids and
/// the broker's cluster counts are taken from.
pub fn unix_ms() -> u64 {
    unix_ms_of(SystemTime::now())
}

fn unix_ms_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_saved_clock_reads_back() {
        assert_eq!(parse(&text(1_764_000_000_123)), Some(1_764_000_000_123));
        assert_eq!(parse(""), None);
        assert_eq!(parse("zerofan-store clock=\n"), None);
        assert_eq!(parse("zerofan-store clock=12x\n"), None);
    }

    #[test]
    fn a_dir_counts_past_its_saved_clock_or_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        std::fs::write(&log, b"x").unwrap();
        let ahead = AHEAD.as_millis() as u64;
        assert_eq!(floor(dir.path(), &log, true), 0, "a fresh dir");
        // No CLOCK: the log's time.
        let written = unix_ms_of(std::fs::metadata(&log).unwrap().modified().unwrap());
        assert_eq!(floor(dir.path(), &log, false), written + ahead);
        // A CLOCK far ahead of the wall clock (the clock stepped back since).
        let later = unix_ms() + 3_600_000;
        save(dir.path(), later).unwrap();
        assert_eq!(floor(dir.path(), &log, false), later + ahead);
        assert!(!dir.path().join(CLOCK_TMP).exists());
        // A torn CLOCK: the log's time again.
        std::fs::write(dir.path().join(CLOCK), b"zerofan-store clo").unwrap();
        assert_eq!(floor(dir.path(), &log, false), written + ahead);
    }
}

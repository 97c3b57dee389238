//! Logging through `tracing`: readable text by default, one JSON object per
//! line with `--log-format json` (or `log_format = "json"`), written to the
//! `log_dest` destinations: stderr (the default), stdout, files (reopened on
//! SIGHUP, see [`reopen`]), the local syslog socket, or nowhere.

use serde::Deserialize;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use tracing::{Level, Metadata};

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

/// One `log_dest` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogDest {
    /// Standard error.
    Stderr,
    /// Standard output.
    Stdout,
    /// Appended to this file.
    File(PathBuf),
    /// The local syslog socket (facility daemon).
    Syslog,
    /// Nowhere.
    None,
}

impl std::str::FromStr for LogDest {
    type Err = ();
    fn from_str(s: &str) -> Result<LogDest, ()> {
        let s = s.trim();
        let (kind, rest) = s.split_once([' ', '\t']).unwrap_or((s, ""));
        match (kind, rest.trim()) {
            ("stderr", "") => Ok(LogDest::Stderr),
            ("stdout", "") => Ok(LogDest::Stdout),
            ("syslog", "") => Ok(LogDest::Syslog),
            ("none", "") => Ok(LogDest::None),
            ("file", path) if !path.is_empty() => Ok(LogDest::File(path.into())),
            _ => Err(()),
        }
    }
}

/// Where syslog lines go. An environment variable (for tests) may move it.
fn syslog_path() -> PathBuf {
    std::env::var_os("ZEROFAN_SYSLOG_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/log"))
}

/// A file destination; the handle is swapped by [`reopen`].
struct LogFile {
    path: PathBuf,
    file: Mutex<File>,
}

fn open_append(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// The destinations in force.
#[derive(Default)]
struct Sinks {
    stderr: bool,
    stdout: bool,
    files: Vec<LogFile>,
    syslog: Option<(PathBuf, UnixDatagram)>,
}

impl Sinks {
    fn open(dests: &[LogDest]) -> Result<Sinks, String> {
        let mut s = Sinks::default();
        for d in dests {
            match d {
                LogDest::Stderr => s.stderr = true,
                LogDest::Stdout => s.stdout = true,
                LogDest::None => {}
                LogDest::File(path) => {
                    let file = open_append(path)
                        .map_err(|e| format!("cannot open log file {}: {e}", path.display()))?;
                    s.files.push(LogFile {
                        path: path.clone(),
                        file: Mutex::new(file),
                    });
                }
                LogDest::Syslog => {
                    let path = syslog_path();
                    match UnixDatagram::unbound().and_then(|u| u.connect(&path).map(|()| u)) {
                        Ok(sock) => s.syslog = Some((path, sock)),
                        Err(e) => {
                            // A container without a syslog daemon: keep
                            // logging somewhere visible.
                            eprintln!(
                                "zerofan: warning: log_dest syslog: cannot reach {}: {e}; logging to stderr",
                                path.display()
                            );
                            s.stderr = true;
                        }
                    }
                }
            }
        }
        Ok(s)
    }

    /// One formatted event (one line, newline included) to every sink.
    /// Write errors are dropped: there is nowhere left to report them.
    fn emit(&self, level: Level, line: &[u8]) {
        if self.stderr {
            let _ = io::stderr().lock().write_all(line);
        }
        if self.stdout {
            let mut out = io::stdout().lock();
            let _ = out.write_all(line).and_then(|()| out.flush());
        }
        for f in &self.files {
            let mut file = f.file.lock().unwrap_or_else(|e| e.into_inner());
            let _ = file.write_all(line);
        }
        if let Some((path, sock)) = &self.syslog {
            let msg = syslog_message(level, std::process::id(), line);
            // The syslog daemon may have restarted: connect again once.
            if sock.send(&msg).is_err() {
                if let Ok(()) = sock.connect(path) {
                    let _ = sock.send(&msg);
                }
            }
        }
    }
}

/// An RFC 3164 message for the local socket, as glibc's syslog() sends it
/// but without the timestamp, which the receiver adds (journald and rsyslog
/// both stamp local messages on arrival): `<PRI>zerofan[PID]: TEXT`.
fn syslog_message(level: Level, pid: u32, line: &[u8]) -> Vec<u8> {
    const DAEMON: u8 = 3;
    let severity = match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    };
    let text = line.strip_suffix(b"\n").unwrap_or(line);
    let mut msg = format!("<{}>zerofan[{pid}]: ", DAEMON * 8 + severity).into_bytes();
    msg.extend_from_slice(text);
    msg
}

static SINKS: OnceLock<Arc<Sinks>> = OnceLock::new();

/// Makes one [`EventWriter`] per event.
struct MakeSink(Arc<Sinks>);

/// Collects one formatted event and hands it to the sinks when dropped,
/// so that each event is one write per file and one syslog datagram.
struct EventWriter {
    sinks: Arc<Sinks>,
    level: Level,
    buf: Vec<u8>,
}

impl Write for EventWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.sinks.emit(self.level, &self.buf);
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for MakeSink {
    type Writer = EventWriter;
    fn make_writer(&'a self) -> EventWriter {
        EventWriter {
            sinks: self.0.clone(),
            level: Level::INFO,
            buf: Vec::new(),
        }
    }
    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> EventWriter {
        EventWriter {
            sinks: self.0.clone(),
            level: *meta.level(),
            buf: Vec::new(),
        }
    }
}

/// Install the global subscriber: `verbose` picks the level (0 warn, 1 info,
/// 2 debug, 3+ trace); `RUST_LOG` overrides. Lines go to `dests` (stderr
/// when empty). A file that cannot be opened is an error; a second call
/// does nothing.
pub fn init(verbose: u8, format: LogFormat, dests: &[LogDest]) -> Result<(), String> {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    // openraft logs each failed heartbeat to a down peer as WARN and ERROR,
    // twice a second; the cluster crate logs what an operator needs. Its
    // own lines come back from -vv on.
    let level = match verbose {
        0 | 1 => format!("{level},openraft=off"),
        _ => level.to_string(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let sinks = if dests.is_empty() {
        Sinks::open(&[LogDest::Stderr])?
    } else {
        Sinks::open(dests)?
    };
    // Colours only when a terminal is the one destination.
    let ansi = sinks.stderr
        && !sinks.stdout
        && sinks.files.is_empty()
        && sinks.syslog.is_none()
        && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let sinks = Arc::new(sinks);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(MakeSink(sinks.clone()));
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
    if installed.is_ok() {
        let _ = SINKS.set(sinks);
    }
    Ok(())
}

/// Open every log file again (SIGHUP, after logrotate moved them away): the
/// new handle replaces the old one only once it is open, so a file that
/// cannot be reopened keeps receiving lines. Returns one error per file that
/// could not be reopened.
pub fn reopen() -> Vec<String> {
    let mut errors = Vec::new();
    let Some(sinks) = SINKS.get() else {
        return errors;
    };
    for f in &sinks.files {
        match open_append(&f.path) {
            Ok(file) => *f.file.lock().unwrap_or_else(|e| e.into_inner()) = file,
            Err(e) => errors.push(format!("cannot reopen log file {}: {e}", f.path.display())),
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_parse() {
        assert_eq!("stderr".parse(), Ok(LogDest::Stderr));
        assert_eq!(" none ".parse(), Ok(LogDest::None));
        assert_eq!(
            "file /var/log/a b.log".parse(),
            Ok(LogDest::File("/var/log/a b.log".into()))
        );
        assert_eq!("file".parse::<LogDest>(), Err(()));
        assert_eq!("syslog now".parse::<LogDest>(), Err(()));
        assert_eq!("mail".parse::<LogDest>(), Err(()));
    }

    #[test]
    fn syslog_message_has_priority_tag_and_no_newline() {
        let m = syslog_message(Level::WARN, 42, b"a line\n");
        assert_eq!(m, b"<28>zerofan[42]: a line");
        let m = syslog_message(Level::ERROR, 7, b"x");
        assert_eq!(m, b"<27>zerofan[7]: x");
        let m = syslog_message(Level::TRACE, 7, b"x");
        assert_eq!(m, b"<31>zerofan[7]: x");
    }
}

//! The `zerofan` binary as an operator runs it: SIGHUP reloads that keep
//! restart-only settings, the pid file, log destinations, and the systemd
//! readiness protocol. Each test starts the real binary on 127.0.0.1:0.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

/// A scratch directory removed at the end of the test.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("zerofan-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running broker; killed if the test ends without stopping it.
struct Broker {
    child: Child,
    port: u16,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines(stream: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The first line from `rx` that satisfies `want`, waiting at most `WAIT`.
fn wait_line(rx: &Receiver<String>, what: &str, want: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if want(&line) => return line,
            Ok(line) => seen.push(line),
            Err(e) => panic!("no line {what} ({e}); saw: {seen:#?}"),
        }
    }
}

fn spawn(config: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Broker {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zerofan"));
    cmd.args(["--listen", "127.0.0.1:0", "--memory", "--config"])
        .arg(config)
        .args(extra)
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start zerofan");
    let stdout = lines(child.stdout.take().expect("piped"));
    let stderr = lines(child.stderr.take().expect("piped"));
    let mut b = Broker {
        child,
        port: 0,
        stdout,
        stderr,
    };
    let line = wait_line(&b.stdout, "zerofan listening on", |l| {
        l.starts_with("zerofan listening on ")
    });
    let addr = line.split_whitespace().nth(3).expect("address");
    b.port = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    b
}

fn signal(b: &Broker, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &b.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// SIGTERM and the exit status, waiting at most `WAIT`.
fn stop(b: &mut Broker) -> std::process::ExitStatus {
    signal(b, "-TERM");
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = b.child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "zerofan did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_keeps_restart_only_settings_and_says_so() {
    let dir = Scratch::new("reload-restart-only");
    let conf = dir.path("zerofan.toml");
    std::fs::write(&conf, "busy_poll_us = 50\npark_after_ms = 1000\n").expect("write");
    let mut b = spawn(&conf, &[], &[]);
    std::fs::write(
        &conf,
        "busy_poll_us = 0\npark_after_ms = 5\nmax_queued_messages = 7\n",
    )
    .expect("write");
    signal(&b, "-HUP");
    let warning = wait_line(&b.stderr, "warning of restart-only settings", |l| {
        l.contains("only after a restart")
    });
    assert!(warning.contains("WARN"), "{warning}");
    // The warning reports the values in force, not the file's.
    assert!(
        warning.contains("busy_poll_us = 50 (configured: 0)"),
        "{warning}"
    );
    assert!(
        warning.contains("park_after_ms = 1000 (configured: 5)"),
        "{warning}"
    );
    assert!(!warning.contains("max_queued_messages"), "{warning}");
    assert!(stop(&mut b).success());
}

//! The `zerofan` binary as an operator runs it: SIGHUP reloads that keep
//! restart-only settings, the pid file, log destinations, and the systemd
//! readiness protocol. Each test starts the real binary on 127.0.0.1:0.
#![cfg(unix)]

mod common;

use common::{lines, Scratch};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

/// A scratch directory removed at the end of the test.
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
    wait_exit(b)
}

fn wait_exit(b: &mut Broker) -> std::process::ExitStatus {
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

/// A datagram socket bound where the broker is told to send, reading with
/// a deadline.
fn datagrams(path: &Path) -> std::os::unix::net::UnixDatagram {
    let sock = std::os::unix::net::UnixDatagram::bind(path).expect("bind datagram socket");
    sock.set_read_timeout(Some(WAIT)).expect("timeout");
    sock
}

fn recv(sock: &std::os::unix::net::UnixDatagram, what: &str) -> String {
    let mut buf = [0u8; 8192];
    match sock.recv(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        Err(e) => panic!("no datagram {what}: {e}"),
    }
}

#[test]
fn pid_file_holds_the_pid_and_goes_on_sigterm() {
    let dir = Scratch::new("pid-file");
    let pid = dir.path("zerofan.pid");
    let conf = dir.path("zerofan.toml");
    std::fs::write(
        &conf,
        format!("pid_file = {:?}\n", pid.display().to_string()),
    )
    .expect("w");
    let mut b = spawn(&conf, &[], &[]);
    // Written before the listening line is printed.
    let text = std::fs::read_to_string(&pid).expect("pid file exists once listening");
    assert_eq!(text.trim(), b.child.id().to_string());
    assert!(stop(&mut b).success());
    assert!(!pid.exists(), "pid file removed on a clean exit");
}

#[test]
fn unwritable_pid_file_is_a_clear_error() {
    let dir = Scratch::new("pid-file-bad");
    let pid = dir.path("no-such-dir/zerofan.pid");
    let conf = dir.path("zerofan.toml");
    std::fs::write(
        &conf,
        format!("pid_file = {:?}\n", pid.display().to_string()),
    )
    .expect("w");
    let out = Command::new(env!("CARGO_BIN_EXE_zerofan"))
        .args(["--listen", "127.0.0.1:0", "--memory", "--config"])
        .arg(&conf)
        .stdin(Stdio::null())
        .output()
        .expect("run zerofan");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pid file") && err.contains(&pid.display().to_string()),
        "{err}"
    );
}

#[test]
fn log_dest_file_gets_the_log_and_is_reopened_on_sighup() {
    let dir = Scratch::new("log-file");
    let log = dir.path("zerofan.log");
    let conf = dir.path("zerofan.toml");
    std::fs::write(&conf, format!("log_dest = [\"file {}\"]\n", log.display())).expect("w");
    let mut b = spawn(&conf, &["-v"], &[]);
    // logrotate moves the file away, then sends SIGHUP.
    let rotated = dir.path("zerofan.log.1");
    std::fs::rename(&log, &rotated).expect("rotate");
    signal(&b, "-HUP");
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains("configuration reloaded")) {
        assert!(
            Instant::now() < deadline,
            "no reload line in the reopened log"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(stop(&mut b).success());
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("shutting down"), "{text}");
    assert!(!text.contains("\x1b["), "no colours in a file: {text}");
    // Nothing went to stderr: the file is the only destination.
    let stderr: Vec<String> = b.stderr.try_iter().collect();
    assert!(
        !stderr.iter().any(|l| l.contains("shutting down")),
        "{stderr:?}"
    );
}

#[test]
fn syslog_datagrams_carry_priority_and_pid() {
    let dir = Scratch::new("syslog");
    let sock_path = dir.path("log.sock");
    let sock = datagrams(&sock_path);
    let conf = dir.path("zerofan.toml");
    std::fs::write(&conf, "log_dest = [\"syslog\"]\n").expect("w");
    let mut b = spawn(&conf, &["-v"], &[("ZEROFAN_SYSLOG_SOCKET", &sock_path)]);
    signal(&b, "-HUP");
    let deadline = Instant::now() + WAIT;
    let want = format!("<30>zerofan[{}]: ", b.child.id());
    loop {
        let d = recv(&sock, "from syslog");
        if d.contains("configuration reloaded") {
            // daemon facility (3) * 8 + info (6); one event per datagram.
            assert!(d.starts_with(&want), "{d:?}");
            assert!(!d.ends_with('\n'), "{d:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no reload line over syslog");
    }
    assert!(stop(&mut b).success());
}

#[test]
fn sd_notify_ready_after_bind_and_stopping_on_sigterm() {
    let dir = Scratch::new("notify");
    let sock_path = dir.path("notify.sock");
    let sock = datagrams(&sock_path);
    let conf = dir.path("zerofan.toml");
    std::fs::write(&conf, "").expect("w");
    let mut b = spawn(&conf, &[], &[("NOTIFY_SOCKET", &sock_path)]);
    let ready = recv(&sock, "READY=1");
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    std::net::TcpStream::connect(("127.0.0.1", b.port)).expect("accepts once ready");
    signal(&b, "-HUP");
    assert!(recv(&sock, "RELOADING=1")
        .lines()
        .any(|l| l == "RELOADING=1"));
    assert!(recv(&sock, "READY=1 after reload")
        .lines()
        .any(|l| l == "READY=1"));
    signal(&b, "-TERM");
    let stopping = recv(&sock, "STOPPING=1");
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    assert!(wait_exit(&mut b).success());
}

#[cfg(target_os = "linux")]
#[test]
fn sd_notify_abstract_socket() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("zerofan-notify-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
    let sock = std::os::unix::net::UnixDatagram::bind_addr(&addr).expect("bind abstract");
    sock.set_read_timeout(Some(WAIT)).expect("timeout");
    let dir = Scratch::new("notify-abstract");
    let conf = dir.path("zerofan.toml");
    std::fs::write(&conf, "").expect("w");
    let at = PathBuf::from(format!("@{name}"));
    let mut b = spawn(&conf, &[], &[("NOTIFY_SOCKET", &at)]);
    assert!(recv(&sock, "READY=1").lines().any(|l| l == "READY=1"));
    assert!(stop(&mut b).success());
}

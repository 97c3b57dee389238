//! Helpers shared by the PulseAudio test binaries: helper processes tied
//! to the test process's lifetime, and a throwaway PulseAudio server.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(tool).is_file()))
}

/// Starts `script` (with `args` as $1...) under `sh`, stdin held open by
/// the test process, stderr piped to the caller.
pub fn lifeline(script: &str, args: &[&str]) -> Result<(Child, ChildStdin), String> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning sh: {e}"))?;
    let stdin = child.stdin.take().ok_or("no stdin")?;
    Ok((child, stdin))
}

/// Waits for a line containing `needle` on `child`'s stderr, at most
/// `within`. Later lines keep being read (and dropped) so the pipe never
/// fills.
pub fn await_stderr_line(child: &mut Child, needle: &str, within: Duration) -> Result<(), String> {
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let (tx, rx) = mpsc::channel();
    let wanted = needle.to_owned();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent {
                if line.contains(&wanted) {
                    let _ = tx.send(Ok(()));
                    sent = true;
                } else {
                    seen.push(line);
                }
            }
        }
        if !sent {
            let _ = tx.send(Err(seen.join("\n")));
        }
    });
    match rx.recv_timeout(within) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(log)) => Err(format!("exited before {needle:?}:\n{log}")),
        Err(_) => Err(format!("no {needle:?} within {within:?}")),
    }
}

/// Starts `pulseaudio` (see the pulse.rs module docs for the flags) with a
/// unix socket at `sock` and a 48 kHz mono null sink named `sink`, tied to
/// this process; waits for "Daemon startup complete". The wrapper removes
/// `dir` when it ends. The caller sets `HOME` / `XDG_RUNTIME_DIR` (inherited).
pub fn start_pulse(dir: &Path, sock: &Path, sink: &str) -> Result<(Child, ChildStdin), String> {
    let mut pulse = lifeline(
        r#"dir=$1; sock=$2; sink=$3
pulseaudio --daemonize=no --exit-idle-time=-1 --disallow-exit=yes --system=no \
  --use-pid-file=no -n --log-target=stderr --log-level=info \
  -L "module-native-protocol-unix socket=$sock auth-anonymous=1" \
  -L "module-null-sink sink_name=$sink rate=48000 channels=1" &
pa=$!
read _ignored
kill "$pa" 2>/dev/null; wait "$pa" 2>/dev/null; rm -rf "$dir""#,
        &[&dir.to_string_lossy(), &sock.to_string_lossy(), sink],
    )?;
    await_stderr_line(
        &mut pulse.0,
        "Daemon startup complete",
        Duration::from_secs(20),
    )
    .map_err(|e| format!("pulseaudio did not start: {e}"))?;
    Ok(pulse)
}

/// For a test binary of one test (nothing else reads the environment):
/// points this process's PulseAudio environment (`HOME`,
/// `XDG_RUNTIME_DIR`, `PULSE_SERVER`) at a throwaway server of its own
/// in a fresh temp dir named after `tag`, and starts it (see
/// [`start_pulse`]) with a null sink `sink`. Returns the server's socket
/// and its lifeline (closing the stdin kills it).
pub fn own_pulse(tag: &str, sink: &str) -> (PathBuf, (Child, ChildStdin)) {
    assert!(
        which("pulseaudio"),
        "pulseaudio is missing: run scripts/install-audio-deps.sh (scripts/test.sh does)"
    );
    let dir = std::env::temp_dir().join(format!("zerofan-audio-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["home", "run"] {
        std::fs::create_dir_all(dir.join(sub)).expect("temp dir");
    }
    let sock = dir.join("native");
    std::env::set_var("HOME", dir.join("home"));
    std::env::set_var("XDG_RUNTIME_DIR", dir.join("run"));
    std::env::set_var("PULSE_SERVER", format!("unix:{}", sock.display()));
    let server = start_pulse(&dir, &sock, sink).expect("pulseaudio");
    (sock, server)
}

//! Helpers for tests that use Debian's mosquitto tools when installed
//! (`apt-get install mosquitto mosquitto-clients`); such tests print a note
//! and pass vacuously where the tools are missing.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Path of `name` if it is an executable on PATH or in /usr/sbin.
pub fn tool(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push("/usr/sbin".into());
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// A scratch directory, removed on drop.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh scratch directory under the system temp dir.
pub fn scratch_dir(tag: &str) -> Scratch {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "zerofan-auth-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    Scratch(dir)
}

/// A mosquitto broker on a free loopback port, killed on drop.
pub struct Mosquitto {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl Mosquitto {
    /// Start mosquitto with `extra` config lines after a loopback listener.
    /// None if mosquitto is not installed.
    pub fn start(dir: &Path, extra: &str) -> Option<Mosquitto> {
        let bin = tool("mosquitto")?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let conf = dir.join("mosquitto.conf");
        std::fs::write(&conf, format!("listener {port} 127.0.0.1\n{extra}"))
            .expect("write mosquitto.conf");
        let log = std::fs::File::create(dir.join("mosquitto.log")).expect("log file");
        let child = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn mosquitto");
        let m = Mosquitto {
            child,
            port,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "mosquitto did not start: {}",
                std::fs::read_to_string(dir.join("mosquitto.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(m)
    }

    /// `mosquitto_pub` one message; Ok(()) when the broker accepted the
    /// connection, Err(stderr) otherwise.
    pub fn publish(&self, user: Option<(&str, &str)>, topic: &str) -> Result<(), String> {
        let mut cmd = Command::new(tool("mosquitto_pub").expect("mosquitto_pub"));
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-t",
            topic,
            "-m",
            "x",
        ]);
        if let Some((u, p)) = user {
            cmd.args(["-u", u, "-P", p]);
        }
        let out = cmd.output().expect("run mosquitto_pub");
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("mosquitto.log")).unwrap_or_default()
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

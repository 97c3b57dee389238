//! Test harness: real brokers (the zerofan binary, Debian's mosquitto)
//! started per test on loopback ports, and a TCP proxy that can cut or
//! stall connections.
//!
//! The zerofan binary comes from `ZEROFAN_BIN`, else from the target
//! directory this test runs from (`target/debug/zerofan`, built by
//! `cargo test --workspace` or `cargo build --workspace --bins`). mosquitto
//! must be installed (`scripts/test.sh` installs it).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub mod proxy;

/// Which broker a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Zerofan,
    Mosquitto,
}

pub const BOTH: [Kind; 2] = [Kind::Zerofan, Kind::Mosquitto];

pub struct Broker {
    pub kind: Kind,
    child: Option<Child>,
    pub port: u16,
    pub dir: PathBuf,
    /// mosquitto listener lines after `listener PORT 127.0.0.1`.
    extra: String,
    /// Port of a second mosquitto listener (WebSocket), 0 if none.
    pub ws_port: u16,
    /// Lines of that second listener block.
    ws_extra: String,
    /// mosquitto lines before the listener block.
    global: String,
    /// zerofan TOML config (`[[listener]]` tables...), empty for none.
    config: String,
    /// zerofan: every listener as printed (`ADDR`, `KIND`), e.g.
    /// (`127.0.0.1:4321`, `websockets+tls`).
    pub listeners: Vec<(String, String)>,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

pub fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "zerofan-client-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

pub fn zerofan_bin() -> PathBuf {
    if let Ok(p) = std::env::var("ZEROFAN_BIN") {
        return PathBuf::from(p);
    }
    // target/debug/deps/<test exe> -> target/debug/zerofan
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf();
    let bin = dir.join("zerofan");
    assert!(
        bin.exists(),
        "zerofan binary not found at {}: build it first (`cargo build --workspace --bins`, \
         which scripts/test.sh and `cargo test --workspace` do) or set ZEROFAN_BIN",
        bin.display()
    );
    bin
}

pub fn mosquitto_bin() -> PathBuf {
    for p in [
        "/usr/sbin/mosquitto",
        "/usr/bin/mosquitto",
        "/usr/local/sbin/mosquitto",
    ] {
        if std::path::Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!(
        "mosquitto is not installed: these tests need Debian's mosquitto \
         (scripts/test.sh installs it; or `apt-get install -y mosquitto`)"
    );
}

impl Broker {
    pub fn start(kind: Kind) -> Broker {
        match kind {
            Kind::Zerofan => Broker::zerofan(),
            Kind::Mosquitto => Broker::mosquitto(""),
        }
    }

    pub fn zerofan() -> Broker {
        let mut b = Broker {
            kind: Kind::Zerofan,
            child: None,
            port: 0,
            dir: tmpdir("zerofan"),
            extra: String::new(),
            ws_port: 0,
            ws_extra: String::new(),
            global: String::new(),
            config: String::new(),
            listeners: Vec::new(),
        };
        b.spawn();
        b
    }

    /// mosquitto with `extra` lines in its listener block (e.g.
    /// `protocol websockets`, `certfile ...`).
    pub fn mosquitto(extra: &str) -> Broker {
        let mut b = Broker {
            kind: Kind::Mosquitto,
            child: None,
            port: free_port(),
            dir: tmpdir("mosquitto"),
            extra: extra.to_string(),
            ws_port: 0,
            ws_extra: String::new(),
            global: String::new(),
            config: String::new(),
            listeners: Vec::new(),
        };
        b.spawn();
        b
    }

    /// mosquitto with `global` lines before the listener block.
    pub fn mosquitto_global(global: &str, port: u16) -> Broker {
        let mut b = Broker {
            kind: Kind::Mosquitto,
            child: None,
            port,
            dir: tmpdir("mosquitto-global"),
            extra: String::new(),
            ws_port: 0,
            ws_extra: String::new(),
            global: String::new(),
            config: String::new(),
            listeners: Vec::new(),
        };
        b.global = global.to_string();
        b.spawn();
        b
    }

    /// mosquitto with a plain TCP listener and a WebSocket listener
    /// (`ws_addr()`) carrying `ws_extra` lines (e.g. certfile/keyfile).
    /// mosquitto 2.0.11 with libwebsockets 4 refuses to start with a
    /// WebSocket listener alone, hence the TCP one.
    pub fn mosquitto_ws(ws_extra: &str) -> Broker {
        let mut b = Broker {
            kind: Kind::Mosquitto,
            child: None,
            port: free_port(),
            dir: tmpdir("mosquitto-ws"),
            extra: String::new(),
            ws_port: free_port(),
            ws_extra: ws_extra.to_string(),
            global: String::new(),
            config: String::new(),
            listeners: Vec::new(),
        };
        b.spawn();
        b
    }

    /// zerofan with a plain TCP listener (`addr()`) plus the `[[listener]]`
    /// tables (or other settings) of the TOML `config`; `listener(kind)`
    /// gives each listener's address.
    pub fn zerofan_config(config: &str) -> Broker {
        let mut b = Broker {
            kind: Kind::Zerofan,
            child: None,
            port: 0,
            dir: tmpdir("zerofan-config"),
            extra: String::new(),
            ws_port: 0,
            ws_extra: String::new(),
            global: String::new(),
            config: config.to_string(),
            listeners: Vec::new(),
        };
        b.spawn();
        b
    }

    /// Address of the zerofan listener of this kind (`mqtt`, `mqtt+tls`,
    /// `websockets`, `websockets+tls`).
    pub fn listener(&self, kind: &str) -> String {
        self.listeners
            .iter()
            .find(|(_, k)| k == kind)
            .map(|(a, _)| a.clone())
            .unwrap_or_else(|| panic!("no {kind} listener in {:?}", self.listeners))
    }

    pub fn ws_addr(&self) -> String {
        format!("127.0.0.1:{}", self.ws_port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        match self.kind {
            Kind::Zerofan => {
                let listen = format!("127.0.0.1:{}", self.port);
                let mut cmd = Command::new(zerofan_bin());
                cmd.args(["--listen", &listen, "--memory"]);
                // One banner line for --listen, one per [[listener]] table.
                let expected = 1 + self
                    .config
                    .lines()
                    .filter(|l| l.trim() == "[[listener]]")
                    .count();
                if !self.config.is_empty() {
                    let conf = self.dir.join("zerofan.toml");
                    std::fs::write(&conf, &self.config).expect("write zerofan.toml");
                    cmd.arg("--config").arg(conf);
                }
                let mut child = cmd
                    .current_dir(&self.dir)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("spawn zerofan");
                let mut out = BufReader::new(child.stdout.take().expect("stdout"));
                // `zerofan listening on ADDR KIND`, one line per listener.
                let mut listeners = Vec::new();
                while listeners.len() < expected {
                    let mut line = String::new();
                    let n = out.read_line(&mut line).expect("read zerofan banner");
                    assert!(n > 0, "zerofan exited before listening");
                    let Some(rest) = line.trim().strip_prefix("zerofan listening on ") else {
                        continue;
                    };
                    let mut words = rest.split_whitespace();
                    let addr = words.next().expect("listener address").to_string();
                    let kind = words.next().unwrap_or("mqtt").to_string();
                    listeners.push((addr, kind));
                }
                let port = listeners[0]
                    .0
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or_else(|| panic!("unexpected zerofan banner {listeners:?}"));
                self.port = port;
                self.listeners = listeners;
                self.child = Some(child);
            }
            Kind::Mosquitto => {
                let conf = self.dir.join("mosquitto.conf");
                let text = format!(
                    "per_listener_settings false\nallow_anonymous true\npersistence false\n\
                     log_type error\nlog_dest stderr\nuser root\n{}\n\
                     listener {} 127.0.0.1\n{}\n",
                    self.global, self.port, self.extra
                );
                let text = if self.ws_port == 0 {
                    text
                } else {
                    format!(
                        "{text}listener {} 127.0.0.1\nprotocol websockets\n{}\n",
                        self.ws_port, self.ws_extra
                    )
                };
                std::fs::write(&conf, text).expect("write mosquitto.conf");
                let log = std::fs::File::create(self.dir.join("mosquitto.log"))
                    .expect("create mosquitto.log");
                let child = Command::new(mosquitto_bin())
                    .arg("-c")
                    .arg(&conf)
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .expect("spawn mosquitto");
                self.child = Some(child);
            }
        }
        self.wait_listening();
    }

    fn wait_listening(&self) {
        wait_port(self.kind, &self.addr());
        if self.ws_port != 0 {
            wait_port(self.kind, &self.ws_addr());
        }
    }

    /// kill -9 (nothing saved, connections reset).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status();
        }
    }

    /// SIGSTOP: connections stay open but nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.resume();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_port(kind: Kind, addr: &str) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if std::net::TcpStream::connect(addr).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{kind:?} did not listen on {addr}");
}

/// Await `f` or panic after `secs` seconds with `what`.
pub async fn within<T>(secs: u64, what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs}s: {what}"),
    }
}

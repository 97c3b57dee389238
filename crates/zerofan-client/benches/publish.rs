//! Publishing throughput against a real broker: zerofan-client simple mode,
//! expert mode, and rumqttc, for 100 B, 1 KiB, 64 KiB and 10 MiB payloads
//! and for 10 MiB / 10 B alternating.
//!
//! Each run publishes N messages at QoS 0 and then one QoS 1 message whose
//! PUBACK ends the run (the broker handles a connection's packets in order,
//! so every message has been read and parsed by then). Nobody subscribes:
//! this measures the client and the broker's read path. MQTT 3.1.1 for all
//! three clients (rumqttc's default). Each figure is the median of 3 runs.
//!
//! Modes:
//! - `simple (copy)`: the payload is built from the source bytes into a fresh
//!   `Bytes` per message (what a caller serializing into a Vec does), then
//!   `publish`;
//! - `simple (shared)`: one `Bytes` cloned per message (refcount, no copy);
//! - `expert`: `publish_with` writes the source bytes straight into the frame;
//! - `rumqttc`: `AsyncClient::publish` with a `Vec` copy of the source.
//!
//! Broker: `BENCH_ADDR=host:port` to use a running one; otherwise
//! `BENCH_BROKER=mosquitto` starts mosquitto, and the default starts the
//! zerofan binary (`ZEROFAN_BIN`, else `target/release/zerofan`, else
//! `target/debug/zerofan`).
//!
//! Run: `cargo bench -p zerofan-client --bench publish`

use bytes::{BufMut, Bytes};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zerofan_client::{Client, ClientOptions, Protocol, QoS};

struct Case {
    name: &'static str,
    sizes: &'static [usize],
    count: usize,
}

const MIB: usize = 1024 * 1024;
const CASES: &[Case] = &[
    Case {
        name: "100 B",
        sizes: &[100],
        count: 500_000,
    },
    Case {
        name: "1 KiB",
        sizes: &[1024],
        count: 300_000,
    },
    Case {
        name: "64 KiB",
        sizes: &[64 * 1024],
        count: 10_000,
    },
    Case {
        name: "10 MiB",
        sizes: &[10 * MIB],
        count: 50,
    },
    Case {
        name: "10 MiB / 10 B alternating",
        sizes: &[10 * MIB, 10],
        count: 100,
    },
];

#[derive(Clone, Copy, Debug)]
enum Mode {
    SimpleCopy,
    SimpleShared,
    Expert,
    Rumqttc,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::SimpleCopy => "simple (copy)",
            Mode::SimpleShared => "simple (shared)",
            Mode::Expert => "expert",
            Mode::Rumqttc => "rumqttc",
        }
    }
}

/// CPU time this process's threads have used so far: the client's cost,
/// without the broker's, which runs in another process. Read from
/// `/proc/self/task/*/schedstat` (nanoseconds on CPU per thread; the
/// runtime's worker threads live for the whole run).
fn cpu_time() -> Duration {
    let mut ns = 0u64;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            ns += s
                .split_whitespace()
                .next()
                .and_then(|x| x.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Duration::from_nanos(ns)
}

/// One measurement: wall time and client CPU time.
#[derive(Clone, Copy)]
struct Run {
    wall: Duration,
    cpu: Duration,
}

struct Broker {
    child: Option<Child>,
    addr: String,
    name: String,
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn target_dir() -> std::path::PathBuf {
    // target/release/deps/<bench exe> -> target
    let exe = std::env::current_exe().expect("current exe");
    exe.ancestors().nth(3).expect("target dir").to_path_buf()
}

fn start_broker() -> Broker {
    if let Ok(addr) = std::env::var("BENCH_ADDR") {
        return Broker {
            child: None,
            name: format!("broker at {addr}"),
            addr,
        };
    }
    if std::env::var("BENCH_BROKER").as_deref() == Ok("mosquitto") {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let dir = std::env::temp_dir().join(format!("zerofan-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let conf = dir.join("m.conf");
        std::fs::write(
            &conf,
            format!("allow_anonymous true\npersistence false\nlog_type none\nlistener {port} 127.0.0.1\n"),
        )
        .expect("conf");
        let child = Command::new("mosquitto")
            .arg("-c")
            .arg(&conf)
            .spawn()
            .expect("mosquitto");
        let addr = format!("127.0.0.1:{port}");
        for _ in 0..500 {
            if std::net::TcpStream::connect(&addr).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        return Broker {
            child: Some(child),
            addr,
            name: "mosquitto 2.0.11".into(),
        };
    }
    let bin = std::env::var("ZEROFAN_BIN")
        .map(Into::into)
        .unwrap_or_else(|_| {
            let t = target_dir();
            let r = t.join("release/zerofan");
            if r.exists() {
                r
            } else {
                t.join("debug/zerofan")
            }
        });
    let mut child = Command::new(&bin)
        .args(["--listen", "127.0.0.1:0", "--memory"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("banner");
    let addr = line.trim().rsplit(' ').next().expect("addr").to_string();
    Broker {
        child: Some(child),
        addr,
        name: format!("zerofan ({})", bin.display()),
    }
}

async fn run_ours(addr: &str, mode: Mode, case: &Case, src: &[Bytes]) -> Duration {
    let (c, _inc) = Client::connect(ClientOptions::new(addr).protocol(Protocol::V311))
        .await
        .expect("connect");
    let start = Instant::now();
    for i in 0..case.count {
        let s = &src[i % src.len()];
        let d = match mode {
            Mode::SimpleCopy => {
                c.publish("bench/x", QoS::AtMostOnce, Bytes::copy_from_slice(s))
                    .await
            }
            Mode::SimpleShared => c.publish("bench/x", QoS::AtMostOnce, s.clone()).await,
            Mode::Expert => {
                c.publish_with("bench/x", QoS::AtMostOnce, |b| {
                    b.reserve(s.len());
                    b.put_slice(s)
                })
                .await
            }
            Mode::Rumqttc => unreachable!(),
        };
        drop(d.expect("publish"));
    }
    let fence = c
        .publish("bench/fence", QoS::AtLeastOnce, "f")
        .await
        .expect("fence");
    fence.await.expect("fence ack");
    let t = start.elapsed();
    c.disconnect().await.expect("disconnect");
    t
}

async fn run_rumqttc(addr: &str, case: &Case, src: &[Bytes]) -> Duration {
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet};
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let mut o = MqttOptions::new(
        format!("rumqttc-bench-{}", std::process::id()),
        host,
        port.parse().expect("port"),
    );
    o.set_max_packet_size(64 * MIB, 64 * MIB);
    o.set_keep_alive(Duration::from_secs(30));
    let (c, mut ev) = AsyncClient::new(o, 256);
    let (acked_tx, mut acked) = tokio::sync::mpsc::channel(1);
    let (conn_tx, mut connected) = tokio::sync::mpsc::channel(1);
    let poller = tokio::spawn(async move {
        loop {
            match ev.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = conn_tx.send(()).await;
                }
                Ok(Event::Incoming(Packet::PubAck(_))) => {
                    let _ = acked_tx.send(()).await;
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    connected.recv().await.expect("rumqttc connack");
    let start = Instant::now();
    for i in 0..case.count {
        let s = &src[i % src.len()];
        c.publish("bench/x", rumqttc::QoS::AtMostOnce, false, s.to_vec())
            .await
            .expect("rumqttc publish");
    }
    c.publish(
        "bench/fence",
        rumqttc::QoS::AtLeastOnce,
        false,
        b"f".to_vec(),
    )
    .await
    .expect("fence");
    acked.recv().await.expect("fence ack");
    let t = start.elapsed();
    let _ = c.disconnect().await;
    let _ = tokio::time::timeout(Duration::from_secs(2), poller).await;
    t
}

fn main() {
    let broker = start_broker();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let quick = std::env::var("BENCH_QUICK").is_ok();
    println!(
        "broker: {}; QoS 0 then a QoS 1 fence; median of 3 runs (by wall time)",
        broker.name
    );
    println!("| payload | client | messages | msg/s | MiB/s | client CPU per message |");
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    let mut summary = Vec::new();
    for case in CASES {
        let count = if quick {
            (case.count / 10).max(4)
        } else {
            case.count
        };
        let case = &Case {
            name: case.name,
            sizes: case.sizes,
            count,
        };
        let src: Vec<Bytes> = case
            .sizes
            .iter()
            .map(|&n| Bytes::from((0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>()))
            .collect();
        let bytes: usize = (0..case.count).map(|i| src[i % src.len()].len()).sum();
        let mut results = Vec::new();
        for mode in [
            Mode::SimpleCopy,
            Mode::SimpleShared,
            Mode::Expert,
            Mode::Rumqttc,
        ] {
            let mut runs: Vec<Run> = (0..3)
                .map(|_| {
                    let cpu0 = cpu_time();
                    let wall = rt.block_on(async {
                        match mode {
                            Mode::Rumqttc => run_rumqttc(&broker.addr, case, &src).await,
                            m => run_ours(&broker.addr, m, case, &src).await,
                        }
                    });
                    Run {
                        wall,
                        cpu: cpu_time().saturating_sub(cpu0),
                    }
                })
                .collect();
            runs.sort_by_key(|r| r.wall);
            let r = runs[1];
            let t = r.wall.as_secs_f64();
            println!(
                "| {} | {} | {} | {:.0} | {:.0} | {:.2} µs |",
                case.name,
                mode.label(),
                case.count,
                case.count as f64 / t,
                bytes as f64 / t / MIB as f64,
                r.cpu.as_secs_f64() * 1e6 / case.count as f64
            );
            results.push(r);
        }
        summary.push((case.name, results));
    }
    println!();
    println!(
        "| payload | simple (copy) / expert, wall | simple (copy) / expert, client CPU \
         | rumqttc / expert, wall | rumqttc / expert, client CPU |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (name, r) in summary {
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
        println!(
            "| {name} | {:.2}x | {:.2}x | {:.2}x | {:.2}x |",
            ratio(r[0].wall, r[2].wall),
            ratio(r[0].cpu, r[2].cpu),
            ratio(r[3].wall, r[2].wall),
            ratio(r[3].cpu, r[2].cpu)
        );
    }
}

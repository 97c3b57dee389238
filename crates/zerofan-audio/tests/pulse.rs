//! Live capture end to end on Linux, against a real PulseAudio server that
//! the tests start in a throwaway session:
//!
//! - a null sink `zf_null` (48 kHz mono) with a 440 Hz tone from sox played
//!   into it (`sox ... | pacat`);
//! - capture of its monitor source through the PulseAudio host (by device
//!   id, as loopback) and through ALSA's `pulse` PCM (`PULSE_SOURCE`);
//! - checks: dominant frequency, packet size for the format, packet rate
//!   (~100/s at 10 ms), consecutive `seq`, no drops;
//! - the same stream published through the zerofan broker to 10
//!   subscribers, complete and in order.
//!
//! Needs `pulseaudio`, `pacat` (pulseaudio-utils), `sox` and ALSA's pulse
//! plugin (libasound2-plugins): `scripts/install-audio-deps.sh` installs
//! them. The broker binary comes from `ZEROFAN_BIN` or the target dir next
//! to this test (`cargo build -p zerofan-broker --bin zerofan`).
//!
//! The server runs as root here: `pulseaudio --system=no` only warns. It
//! gets its own `HOME` / `XDG_RUNTIME_DIR` under a temp dir, loads nothing
//! but a unix socket (anonymous auth) and the null sink (`-n -L ...`), and
//! never exits on idle. The test process holds the stdin of a small `sh`
//! wrapper around each helper; when the process ends, for any reason, the
//! wrapper reads EOF and kills its helper and removes the temp dir.

mod common;

use common::{lifeline, start_pulse, which};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::Receiver;
use zerofan_audio::publish::{publish_capture, PublishConfig, PublishMode, SeqCheck};
use zerofan_audio::{
    decode_packet, list_devices, Capture, CaptureConfig, CaptureEvent, DeviceSelector, Packet,
    PacketInfo, SampleFormat,
};
use zerofan_client::{Client, ClientOptions, QoS};

const SINK: &str = "zf_null";
const MONITOR: &str = "zf_null.monitor";
const TONE_HZ: f64 = 440.0;

// ------------------------------------------------------------------ fixture

/// Helpers that live as long as the test process (see the module docs).
struct Session {
    _helpers: Vec<(Child, ChildStdin)>,
}

static SESSION: OnceLock<Result<Mutex<Session>, String>> = OnceLock::new();

fn start_session() -> Result<Session, String> {
    let missing: Vec<&str> = ["pulseaudio", "pacat", "sox"]
        .into_iter()
        .filter(|t| !which(t))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "missing {missing:?}: these tests need a PulseAudio server, pacat and sox; run \
             scripts/install-audio-deps.sh (apt: pulseaudio pulseaudio-utils sox \
             libasound2-plugins), which scripts/test.sh does first"
        ));
    }
    let dir = std::env::temp_dir().join(format!("zerofan-audio-pulse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["home", "run"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| format!("temp dir: {e}"))?;
    }
    let sock = dir.join("native");
    let sock_s = sock.to_string_lossy().into_owned();
    // Environment for the server, the helpers and this process's clients
    // (cpal's PulseAudio host and ALSA's pulse plugin read these).
    // Set once, inside OnceLock initialisation, before any test talks to a
    // sound server.
    std::env::set_var("HOME", dir.join("home"));
    std::env::set_var("XDG_RUNTIME_DIR", dir.join("run"));
    std::env::set_var("PULSE_SERVER", format!("unix:{sock_s}"));
    std::env::set_var("PULSE_SOURCE", MONITOR);
    std::env::set_var("PULSE_SINK", SINK);

    let pulse = start_pulse(&dir, &sock, SINK)?;

    // The tone, for as long as the tests run (capped at 10 minutes).
    let tone = lifeline(
        r#"sox -q -n -t raw -r 48000 -e signed -b 16 -c 1 - synth 600 sine 440 vol 0.5 2>/dev/null \
  | pacat --device=zf_null --format=s16le --rate=48000 --channels=1 --raw &
p=$!
read _ignored
kill "$p" 2>/dev/null; wait "$p" 2>/dev/null"#,
        &[],
    )?;
    Ok(Session {
        _helpers: vec![pulse, tone],
    })
}

/// The shared PulseAudio session; panics with the reason (and what to
/// install) if it cannot start.
fn session() {
    let s = SESSION.get_or_init(|| start_session().map(Mutex::new));
    if let Err(e) = s {
        panic!("PulseAudio test session unavailable: {e}");
    }
}

// ------------------------------------------------------------------ analysis

/// Power of `freq` in `x` (Goertzel).
fn goertzel(x: &[f64], rate: f64, freq: f64) -> f64 {
    let coeff = 2.0 * (2.0 * std::f64::consts::PI * freq / rate).cos();
    let (mut s1, mut s2) = (0.0, 0.0);
    for &v in x {
        let s = v + coeff * s1 - s2;
        s2 = s1;
        s1 = s;
    }
    s1 * s1 + s2 * s2 - coeff * s1 * s2
}

/// The strongest frequency between 100 Hz and 2 kHz, to 0.5 Hz.
fn dominant_frequency(x: &[f64], rate: f64) -> f64 {
    let best = |lo: f64, hi: f64, step: f64| {
        let mut f = lo;
        let (mut best_f, mut best_p) = (lo, f64::MIN);
        while f <= hi {
            let p = goertzel(x, rate, f);
            if p > best_p {
                (best_f, best_p) = (f, p);
            }
            f += step;
        }
        best_f
    };
    let coarse = best(100.0, 2000.0, 5.0);
    best(coarse - 5.0, coarse + 5.0, 0.5)
}

/// First channel of a packet as floats in [-1, 1].
fn first_channel(p: &Packet) -> Vec<f64> {
    let info = p.info();
    let ch = usize::from(info.channels);
    match info.format {
        SampleFormat::I16 => p
            .samples()
            .chunks_exact(2 * ch)
            .map(|c| f64::from(i16::from_le_bytes([c[0], c[1]])) / 32768.0)
            .collect(),
        SampleFormat::F32 => p
            .samples()
            .chunks_exact(4 * ch)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
    }
}

fn is_loud(p: &Packet) -> bool {
    first_channel(p).iter().any(|v| v.abs() > 0.1)
}

/// What the checks keep of a packet; the packet itself is dropped at once
/// (back to the pool), as a real consumer would.
struct Seen {
    info: PacketInfo,
    bytes: usize,
    wire_ok: bool,
    signal: Vec<f64>,
    at: Instant,
}

impl Seen {
    fn of(p: Packet) -> Seen {
        let wire_ok = decode_packet(p.wire())
            .is_ok_and(|(i, s)| i == *p.info() && s.len() == p.samples().len());
        Seen {
            info: *p.info(),
            bytes: p.samples().len(),
            wire_ok,
            signal: first_channel(&p),
            at: Instant::now(),
        }
    }
}

/// Receives `n` packets once the tone is audible (silent packets before it
/// are skipped, and so are the first 50 after it: a start-up burst is no
/// measure of the rate), with their arrival times. Fails on an error event, on the
/// capture ending, or after `within`.
async fn collect(rx: &mut Receiver<CaptureEvent>, n: usize, within: Duration) -> Vec<Seen> {
    let deadline = tokio::time::Instant::now() + within;
    let mut out = Vec::with_capacity(n);
    let mut loud = 0;
    while out.len() < n {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} packets within {within:?}", out.len()));
        match ev {
            Some(CaptureEvent::Packet(p)) => {
                if loud == 0 && !is_loud(&p) {
                    continue;
                }
                loud += 1;
                if loud <= 50 {
                    continue;
                }
                out.push(Seen::of(p));
            }
            Some(CaptureEvent::Error(e)) => panic!("capture error: {e}"),
            Some(CaptureEvent::Ended(r)) => panic!("capture ended early: {r:?}"),
            None => panic!("capture channel closed"),
        }
    }
    out
}

struct Expect {
    channels: u16,
    format: SampleFormat,
    bytes: usize,
    /// Allowed packets per second by arrival: cpal's PulseAudio host may
    /// deliver in bursts of up to 0.7 s, which a few seconds of arrivals
    /// cannot average out.
    arrival_rate: std::ops::RangeInclusive<f64>,
}

fn check_stream(packets: &[Seen], capture: &Capture, e: &Expect) {
    let first = packets[0].info.seq;
    for (i, p) in packets.iter().enumerate() {
        assert_eq!(p.info.seq, first + i as u64, "seq must be consecutive");
        assert_eq!(p.bytes, e.bytes, "packet size");
        assert_eq!(p.info.sample_rate, 48_000);
        assert_eq!(p.info.channels, e.channels);
        assert_eq!(p.info.format, e.format);
        assert!(p.wire_ok, "wire form decodes to the same info and length");
    }
    // Frequency over the first second of tone.
    let signal: Vec<f64> = packets
        .iter()
        .take(100)
        .flat_map(|p| p.signal.iter().copied())
        .collect();
    let f = dominant_frequency(&signal, 48_000.0);
    // Packet rate: by the stream clock (cpal's capture timestamps) and by
    // arrival in this task.
    let n = packets.len() as f64;
    let last = &packets[packets.len() - 1];
    let (t0, a0) = (packets[0].info.timestamp_ns, packets[0].at);
    let (t1, a1) = (last.info.timestamp_ns, last.at);
    let clock_rate = (n - 1.0) / ((t1 - t0) as f64 / 1e9);
    // Per-packet steps of the capture timestamps: the median is robust to
    // a backend whose first callbacks report an unsettled delay.
    let mut steps: Vec<i128> = packets
        .windows(2)
        .map(|w| i128::from(w[1].info.timestamp_ns) - i128::from(w[0].info.timestamp_ns))
        .collect();
    steps.sort_unstable();
    let median_step_ms = steps[steps.len() / 2] as f64 / 1e6;
    let arrival_rate = (n - 1.0) / (a1 - a0).as_secs_f64();
    let stats = capture.stats();
    eprintln!(
        "{} {:?} x{}: dominant {f:.1} Hz; {} packets of {} bytes; median timestamp step \
         {median_step_ms:.3} ms (rate {clock_rate:.2}/s first to last), {arrival_rate:.2}/s by \
         arrival; stats {stats:?}",
        capture.device().id,
        e.format,
        e.channels,
        packets.len(),
        e.bytes
    );
    assert!(
        (f - TONE_HZ).abs() <= 2.0,
        "dominant frequency {f} Hz, want {TONE_HZ}"
    );
    // Timestamps step by exactly one packet unless the backend reports a
    // jump (see PacketInfo::timestamp_ns).
    assert!(
        (9.9..=10.1).contains(&median_step_ms),
        "median capture-timestamp step {median_step_ms} ms, want 10"
    );
    assert!(steps[0] >= 0, "timestamps must not go backwards");
    assert!(
        e.arrival_rate.contains(&arrival_rate),
        "packets per second by arrival: {arrival_rate}, want {:?}",
        e.arrival_rate
    );
    assert_eq!(stats.drops, 0, "no packet may be dropped: {stats:?}");
    assert_eq!(stats.errors, 0, "no backend errors: {stats:?}");
    assert!(stats.pool_hit_rate > 0.9, "pool hit rate: {stats:?}");
}

fn config(device: &str, channels: u16, format: SampleFormat) -> CaptureConfig {
    CaptureConfig {
        buffer_frames: std::env::var("ZF_TEST_BUFFER_FRAMES")
            .ok()
            .and_then(|v| v.parse().ok()),
        device: DeviceSelector::Named(device.into()),
        sample_rate: Some(48_000),
        channels: Some(channels),
        format,
        ..CaptureConfig::default()
    }
}

// ------------------------------------------------------------------ tests

#[test]
fn the_null_sink_monitor_is_listed_as_loopback() {
    session();
    let devices = list_devices();
    let monitor = devices
        .iter()
        .find(|d| d.id.ends_with(MONITOR))
        .unwrap_or_else(|| panic!("no {MONITOR} in {devices:#?}"));
    assert!(monitor.is_loopback, "{monitor:?}");
    assert_eq!(monitor.host, "PulseAudio");
    let cfg = monitor.default_config.as_ref().expect("default config");
    assert_eq!((cfg.sample_rate, cfg.channels), (48_000, 1), "{cfg:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captures_the_tone_through_the_pulseaudio_host() {
    session();
    let (mut capture, mut rx) =
        Capture::start_channel(config(MONITOR, 1, SampleFormat::I16), 1024).expect("start");
    assert_eq!(capture.params().frames_per_packet, 480);
    assert!(capture.device().is_loopback);
    let packets = collect(&mut rx, 500, Duration::from_secs(30)).await;
    check_stream(
        &packets,
        &capture,
        &Expect {
            channels: 1,
            format: SampleFormat::I16,
            bytes: 960,
            arrival_rate: 80.0..=120.0,
        },
    );
    drop(packets);
    capture.request_stop(); // returns at once; the events follow

    // Every event after: remaining packets, then Ended(Stopped), then close.
    let mut ended = None;
    while let Some(ev) = rx.recv().await {
        if let CaptureEvent::Ended(r) = ev {
            ended = Some(r);
        }
    }
    assert_eq!(ended, Some(zerofan_audio::EndReason::Stopped));
    assert!(capture.is_ended());
    capture.stop(); // joins a thread that has already ended
    assert_eq!(capture.stats().drops, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captures_the_tone_through_alsa_pulse_plugin_as_f32_stereo() {
    session();
    // ALSA's `pulse` PCM records PULSE_SOURCE (the monitor), as cpal's
    // default ALSA host would on a desktop.
    let (mut capture, mut rx) =
        Capture::start_channel(config("alsa:pulse", 2, SampleFormat::F32), 1024).expect("start");
    let packets = collect(&mut rx, 300, Duration::from_secs(20)).await;
    check_stream(
        &packets,
        &capture,
        &Expect {
            channels: 2,
            format: SampleFormat::F32,
            bytes: 3840,
            arrival_rate: 95.0..=105.0,
        },
    );
    capture.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_and_loopback_selectors_resolve() {
    session();
    // "loopback": the default sink's monitor. Default: the default source,
    // which on this server is that same monitor.
    for (selector, name) in [
        (DeviceSelector::Named("loopback".into()), "loopback"),
        (DeviceSelector::Default, "default"),
    ] {
        let config = CaptureConfig {
            device: selector,
            ..CaptureConfig::default()
        };
        let (mut capture, mut rx) = Capture::start_channel(config, 1024).expect(name);
        assert!(
            capture.device().id.ends_with(MONITOR),
            "{name}: {:?}",
            capture.device()
        );
        // Defaults come from the device: 48 kHz mono, i16, 10 ms.
        assert_eq!(capture.params().sample_rate, 48_000, "{name}");
        assert_eq!(capture.params().channels, 1, "{name}");
        let ev = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{name}: no packet within 20 s"));
        assert!(
            matches!(ev, Some(CaptureEvent::Packet(_))),
            "{name}: {ev:?}"
        );
        capture.stop();
    }
}

#[test]
fn a_missing_device_is_an_error_not_a_panic() {
    session();
    let err = Capture::start(config("no-such-device", 1, SampleFormat::I16), |_| true)
        .expect_err("must fail");
    assert!(err.to_string().contains("no-such-device"), "{err}");
}

// ------------------------------------------------------------------ broker

struct Broker {
    child: Child,
    port: u16,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn zerofan_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ZEROFAN_BIN") {
        return PathBuf::from(p);
    }
    // target/debug/deps/<test exe> -> target/debug/zerofan
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("zerofan"))
        .expect("target dir");
    assert!(
        bin.exists(),
        "zerofan broker binary not found at {}: build it first (`cargo build -p zerofan-broker \
         --bin zerofan`, which `cargo test --workspace` does) or set ZEROFAN_BIN",
        bin.display()
    );
    bin
}

fn start_broker() -> Broker {
    let mut child = Command::new(zerofan_bin())
        .args(["--listen", "127.0.0.1:0", "--memory"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn zerofan");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // The line is `zerofan listening on ADDR KIND`; keep ADDR.
            if let Some(rest) = line.strip_prefix("zerofan listening on ") {
                let addr = rest.split_whitespace().next().unwrap_or_default();
                let _ = tx.send(addr.to_owned());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("zerofan printed no `zerofan listening on` line within 20 s");
    let port = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    Broker { child, port }
}

/// One fan-out at a time: each runs a broker and 11 clients, and this
/// machine has few cores.
static FAN_OUT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn fan_out(mode: PublishMode, qos: QoS) {
    session();
    let _one_at_a_time = FAN_OUT.lock().await;
    let broker = start_broker();
    let addr = format!("127.0.0.1:{}", broker.port);
    let topic = format!("audio/{mode:?}/{qos:?}");
    const SUBSCRIBERS: usize = 10;
    const PACKETS: usize = 200;
    let mut subs = Vec::new();
    for i in 0..SUBSCRIBERS {
        let (client, mut incoming) =
            Client::connect(ClientOptions::new(addr.clone()).client_id(format!("sub{i}")))
                .await
                .expect("subscriber connects");
        client.subscribe(&topic, qos).await.expect("subscribe");
        subs.push(tokio::spawn(async move {
            let mut check = SeqCheck::default();
            let mut first = None;
            while (check.received as usize) < PACKETS {
                let Some(msg) = incoming.recv().await else {
                    break;
                };
                let (info, samples) = decode_packet(&msg.payload).expect("valid audio message");
                assert_eq!(samples.len(), 960);
                first.get_or_insert(info.seq);
                check.observe(&msg.payload).expect("header");
            }
            drop(client);
            (check, first)
        }));
    }
    let (publisher_client, _incoming) =
        Client::connect(ClientOptions::new(addr.clone()).client_id("pub"))
            .await
            .expect("publisher connects");
    let (mut capture, publisher, task) = publish_capture(
        config(MONITOR, 1, SampleFormat::I16),
        publisher_client.clone(),
        topic.clone(),
        PublishConfig {
            qos,
            mode,
            ..PublishConfig::default()
        },
    )
    .expect("capture + publish");
    let mut results = Vec::new();
    for s in subs {
        let r = tokio::time::timeout(Duration::from_secs(30), s)
            .await
            .expect("subscribers got their packets within 30 s")
            .expect("subscriber task");
        results.push(r);
    }
    capture.stop();
    drop(publisher);
    let pub_stats = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("publisher finishes")
        .expect("publisher task");
    let stats = capture.stats();
    eprintln!("{mode:?} {qos:?}: capture {stats:?}; publisher {pub_stats:?}");
    for (i, (check, first)) in results.iter().enumerate() {
        assert_eq!(
            check.received as usize, PACKETS,
            "subscriber {i}: {check:?}"
        );
        assert!(check.is_clean(), "subscriber {i} saw gaps: {check:?}");
        assert_eq!(*first, Some(0), "subscriber {i} missed the first packets");
    }
    assert_eq!(stats.drops, 0, "{stats:?}");
    assert_eq!(pub_stats.dropped, 0, "{pub_stats:?}");
    assert_eq!(pub_stats.failed, 0, "{pub_stats:?}");
    drop(broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_subscribers_get_every_packet_in_order_expert_qos1() {
    fan_out(PublishMode::Expert, QoS::AtLeastOnce).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_subscribers_get_every_packet_in_order_zero_copy_qos0() {
    fan_out(PublishMode::ZeroCopy, QoS::AtMostOnce).await;
}

// ------------------------------------------------------------------ unplug

/// Runs `pactl` against the test server; its stdout.
fn pactl(args: &[&str]) -> String {
    let out = Command::new("pactl")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("pactl {args:?}: {e}"));
    assert!(
        out.status.success(),
        "pactl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_stops_delivering_is_reported_as_an_error_event() {
    session();
    // A sink of its own, so that removing it disturbs no other test.
    let module = pactl(&[
        "load-module",
        "module-null-sink",
        "sink_name=zf_unplug",
        "rate=48000",
        "channels=1",
    ]);
    let (capture, mut rx) =
        Capture::start_channel(config("zf_unplug.monitor", 1, SampleFormat::I16), 1024)
            .expect("start");
    // Wait for audio to flow, then pull the plug.
    let first = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("a first event within 20 s");
    assert!(matches!(first, Some(CaptureEvent::Packet(_))), "{first:?}");
    // A real unplug cannot be staged here: PulseAudio (14+) moves the
    // streams of a vanished source to the default one, and this pactl has
    // no way to kill a stream. Suspending the sink stops its monitor's data
    // the way a dead device does.
    pactl(&["suspend-sink", "zf_unplug", "1"]);
    // cpal reports nothing: the data stops, and the stall watchdog says so
    // (2 s by default), after the packets already queued.
    let error = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(ev) = rx.recv().await {
            match ev {
                CaptureEvent::Packet(_) => {}
                CaptureEvent::Error(e) => return Ok(e),
                CaptureEvent::Ended(r) => return Err(r),
            }
        }
        Err(zerofan_audio::EndReason::Stopped)
    })
    .await
    .expect("an error event within 20 s of the suspend");
    eprintln!("stall: {error:?}; stats {:?}", capture.stats());
    match error {
        Ok(e) => assert!(e.kind == "Stalled" && !e.fatal, "{e:?}"),
        Err(end) => panic!("ended without an error event: {end:?}"),
    }
    assert!(capture.stats().errors >= 1);
    let mut capture = capture;
    capture.stop();
    assert!(capture.is_ended());
    pactl(&["unload-module", &module]);
}

//! The scale-of-state scenarios: many idle connections with keep alive,
//! a million subscriptions, a million retained messages, connection
//! storms, and persistent sessions resumed after a broker restart. Each
//! reports time per unit and, given `--broker-pid`, broker memory per unit
//! (RSS before and after, so allocator and kernel overheads are in).

use crate::conn::{self, Conn, ConnError, ConnectOpts};
use crate::flow::{self, FlowSpec, PubSpec, SubSpec, Target};
use crate::payload::SizeDist;
use crate::report::{latency_of, new_histogram, CaseResult, Metric};
use crate::scenarios::Knobs;
use crate::sys;
use bytes::Bytes;
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use zerofan_codec::{Packet, QoS};

/// Descriptors kept free for everything that is not a counted client
/// (publishers, pingers, stdio, the runtime).
const FD_SPARE: u64 = 64;

/// Filters per SUBSCRIBE / UNSUBSCRIBE packet when subscribing in bulk.
const PER_PACKET: usize = 100;

/// Upper bound on any one wait of these scenarios (a bulk SUBSCRIBE's
/// SUBACK, the last retained message, a resumed client's message).
const LONG_WAIT: Duration = Duration::from_secs(120);

/// How many of `wanted` clients this process can hold open next to `extra`
/// other sockets: the soft RLIMIT_NOFILE is raised up to the hard one;
/// when even that is too low, fewer, with a note that says what is needed.
pub fn fd_budget(wanted: usize, extra: usize, notes: &mut Vec<String>) -> usize {
    let need = (wanted + extra) as u64 + FD_SPARE;
    let (n, note) = match sys::raise_nofile(need) {
        Ok(limit) if limit >= need => return wanted,
        Ok(limit) => {
            let n = limit.saturating_sub(FD_SPARE + extra as u64) as usize;
            (
                n,
                format!(
                    "fd limit {limit}: {n} of {wanted} clients; {need} open files needed \
                     (raise the hard limit: `ulimit -Hn {need}` as root, or LimitNOFILE)"
                ),
            )
        }
        Err(e) => (
            wanted.min(900),
            format!("could not raise the fd limit ({e}); {need} open files needed"),
        ),
    };
    eprintln!("zerofan-bench: {note}");
    notes.push(note);
    n
}

fn rss(k: &Knobs) -> Option<sys::Mem> {
    k.broker_pid.and_then(|p| sys::read_mem(p).ok())
}

/// Let the broker finish what it was sent (and its allocator settle)
/// before its memory is read.
async fn settle(k: &Knobs) {
    tokio::time::sleep(Duration::from_millis(if k.smoke { 200 } else { 1500 })).await;
}

/// Bytes each of `n` units took, from KiB `before` and `after`.
fn bytes_each(before_kib: u64, after_kib: u64, n: usize) -> f64 {
    (after_kib as f64 - before_kib as f64) * 1024.0 / n.max(1) as f64
}

/// Add "broker RSS a -> b MiB, X bytes per `unit`" and the metric `B/unit`.
fn memory_per(
    r: &mut CaseResult,
    before: Option<sys::Mem>,
    after: Option<sys::Mem>,
    n: usize,
    unit: &str,
) {
    if let (Some(b), Some(a)) = (before, after) {
        let per = bytes_each(b.rss_kib, a.rss_kib, n);
        r.notes.push(format!(
            "broker RSS {:.1} -> {:.1} MiB: {per:.0} bytes per {unit}",
            b.rss_kib as f64 / 1024.0,
            a.rss_kib as f64 / 1024.0
        ));
        r.metrics.push(Metric::lower(&format!("B/{unit}"), per));
    }
}

/// Add "settled after S s: X bytes per conn" and the metrics
/// `B/conn settled` and, where the kernel tells, `B/conn settled anon`
/// (without the program's code paged in as it ran: see [`sys::Mem`]).
fn settled_per(
    r: &mut CaseResult,
    before: Option<sys::Mem>,
    now: Option<sys::Mem>,
    n: usize,
    at: f64,
) {
    if let (Some(b), Some(a)) = (before, now) {
        let per = bytes_each(b.rss_kib, a.rss_kib, n);
        r.notes.push(format!(
            "settled after {at:.0} s: broker RSS {:.1} MiB, {per:.0} bytes per conn",
            a.rss_kib as f64 / 1024.0
        ));
        r.metrics.push(Metric::lower("B/conn settled", per));
        if let (Some(b), Some(a)) = (b.anon_kib, a.anon_kib) {
            let per = bytes_each(b, a, n);
            r.notes.push(format!(
                "settled, anonymous memory only: {per:.0} bytes per conn"
            ));
            r.metrics.push(Metric::lower("B/conn settled anon", per));
        }
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// The topic a device `i` of this run listens on.
fn device_topic(t: &Target, role: &str, i: usize) -> String {
    format!("zfb/{}/{role}/{i}/cmd", t.run_id)
}

/// What opening many clients gave.
struct Opened {
    /// The clients that got their SUBACK, in order.
    conns: Vec<Conn>,
    /// Each one's time from the start to its SUBACK (ns).
    hist: Histogram<u64>,
    /// Clients that did not get there (refused, timed out, closed).
    failed: usize,
    first_error: Option<String>,
}

/// Open `n` clients, at most `concurrency` handshakes at a time, each with
/// keep alive `keep_alive` and one subscription to its own device topic.
/// A client that fails is counted, not fatal: how many of a storm fail is
/// a figure too.
async fn open_devices(
    t: &Target,
    role: &str,
    n: usize,
    keep_alive: u16,
    concurrency: usize,
    limit: Duration,
) -> Opened {
    let sem = Arc::new(Semaphore::new(concurrency.max(1)));
    let start = Instant::now();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let sem = sem.clone();
        let id = format!("{}-{role}{i}", t.run_id);
        let topic = vec![device_topic(t, role, i)];
        let opts = ConnectOpts {
            keep_alive,
            ..t.opts(i)
        };
        let (addr, protocol) = (t.addr, t.protocol);
        handles.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await;
            let mut c = conn::connect_with(addr, &id, protocol, limit, &opts).await?;
            c.subscribe(&topic, QoS::AtMostOnce, limit).await?;
            Ok::<_, ConnError>((c, start.elapsed()))
        }));
    }
    let mut out = Opened {
        conns: Vec::with_capacity(n),
        hist: new_histogram(),
        failed: 0,
        first_error: None,
    };
    for h in handles {
        let res = match h.await {
            Ok(r) => r,
            Err(e) => Err(ConnError::Protocol(format!("connect task failed: {e}"))),
        };
        match res {
            Ok((c, d)) => {
                let _ = out.hist.record(ns(d));
                out.conns.push(c);
            }
            Err(e) => {
                out.failed += 1;
                out.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    out
}

/// Idle connections: N clients (CONNECT with keep alive, one SUBSCRIBE
/// each, 100 handshakes at a time), the broker's memory per connection,
/// and keep alive: every client but a sample sends PINGREQ every half
/// keep alive from its SUBACK on (a slow broker's connect phase must not
/// count as silence); the sample, connected last, goes silent after one
/// PINGREQ and must be disconnected at 1.5 times keep alive, the others
/// not at all.
pub async fn connections(t: &Target, k: &Knobs) -> CaseResult {
    let mut notes = Vec::new();
    let wanted = k.clients.unwrap_or(if k.smoke { 50 } else { 10_000 });
    let n = fd_budget(wanted, 0, &mut notes);
    let ka = k.keep_alive.unwrap_or(if k.smoke { 1 } else { 10 }).max(1);
    let sample = k.sample.unwrap_or(if k.smoke { 5 } else { 100 }).min(n);
    let case = format!("{n} clients, keep alive {ka} s");
    let before = rss(k);
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (pingers, failed) = open_pinging(t, n - sample, ka, stop.clone()).await;
    let silent = open_devices(
        t,
        "silent",
        sample,
        ka,
        t.connect_concurrency,
        t.handshake_timeout,
    )
    .await;
    let secs = start.elapsed().as_secs_f64();
    if let Some(e) = failed.or(silent.first_error) {
        stop.store(true, Ordering::Relaxed);
        return CaseResult::failed("connections", &case, format!("a client failed: {e}"));
    }
    settle(k).await;
    let after = rss(k);
    let mut r = CaseResult {
        scenario: "connections".into(),
        case,
        seconds: secs,
        metrics: vec![Metric::higher("conn+sub/s", n as f64 / secs.max(1e-9))],
        notes,
        ..Default::default()
    };
    memory_per(&mut r, before, after, n, "conn");
    let res = keep_alive_check(silent.conns, ka).await;
    // Again once the allocator has returned what the connect phase freed
    // (jemalloc gives back freed pages over ~10 s): the state alone. The
    // silent sample is closed by now.
    settled_per(
        &mut r,
        before,
        rss(k),
        n - sample,
        start.elapsed().as_secs_f64(),
    );
    stop.store(true, Ordering::Relaxed);
    let mut pingers_lost = 0;
    for h in pingers {
        if !matches!(h.await, Ok(Ok(()))) {
            pingers_lost += 1;
        }
    }
    match res {
        Ok(mut rep) => {
            rep.pingers = n - sample;
            rep.pingers_lost = pingers_lost;
            r.notes.push(rep.note(ka));
            r.metrics
                .push(Metric::lower("silent closed max s", rep.closed_max_s));
            if rep.kept < sample || rep.pingers_lost > 0 {
                r.error = Some(rep.note(ka));
            }
        }
        Err(e) => r.error = Some(format!("keep alive check: {e}")),
    }
    r
}

/// Open `n` clients (100 handshakes at a time) that ping every half keep
/// alive from their SUBACK until `stop` (or half an hour). Returns once
/// all are subscribed (or failed): their tasks, and the first failure.
async fn open_pinging(
    t: &Target,
    n: usize,
    ka: u16,
    stop: Arc<AtomicBool>,
) -> (
    Vec<tokio::task::JoinHandle<Result<(), ConnError>>>,
    Option<String>,
) {
    let period = Duration::from_millis(u64::from(ka) * 500);
    let sem = Arc::new(Semaphore::new(t.connect_concurrency.max(1)));
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<(), String>>(n.max(1));
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let (sem, tx, stop) = (sem.clone(), tx.clone(), stop.clone());
        let id = format!("{}-conn{i}", t.run_id);
        let topic = vec![device_topic(t, "conn", i)];
        let opts = ConnectOpts {
            keep_alive: ka,
            ..t.opts(i)
        };
        let (addr, protocol, limit) = (t.addr, t.protocol, t.handshake_timeout);
        handles.push(tokio::spawn(async move {
            let permit = sem.acquire_owned().await;
            let opened = async {
                let mut c = conn::connect_with(addr, &id, protocol, limit, &opts).await?;
                c.subscribe(&topic, QoS::AtMostOnce, limit).await?;
                Ok::<_, ConnError>(c)
            }
            .await;
            drop(permit);
            let mut c = match opened {
                Ok(c) => {
                    let _ = tx.send(Ok(())).await;
                    c
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string())).await;
                    return Err(e);
                }
            };
            // Spread the pings over the period rather than all at once.
            tokio::time::sleep(period.mul_f64((i % 97) as f64 / 97.0)).await;
            let end = Instant::now() + Duration::from_secs(1800);
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                c.writer.push(&Packet::PingReq)?;
                c.writer.flush().await?;
                loop {
                    match c
                        .reader
                        .next_within(Duration::from_secs(10), "PINGRESP")
                        .await?
                    {
                        Packet::PingResp => break,
                        Packet::Disconnect(_) => return Err(ConnError::Closed),
                        _ => continue,
                    }
                }
                tokio::time::sleep(period).await;
            }
            Ok(())
        }));
    }
    drop(tx);
    let mut first = None;
    for _ in 0..n {
        match rx.recv().await {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                first.get_or_insert(e);
            }
            None => break,
        }
    }
    (handles, first)
}

/// What the keep alive check saw.
struct KeepAliveReport {
    /// Silent clients disconnected within [1.5 x keep alive, + 1 s].
    kept: usize,
    sample: usize,
    /// Earliest and latest disconnection of a silent client, seconds
    /// after its last packet.
    closed_min_s: f64,
    closed_max_s: f64,
    /// How long the silent ones were watched.
    watch_s: f64,
    /// Pinging clients that the broker disconnected anyway.
    pingers_lost: usize,
    pingers: usize,
}

impl KeepAliveReport {
    fn note(&self, ka: u16) -> String {
        format!(
            "keep alive: {}/{} silent clients closed within 1.5 x {ka} s + 1 s \
             (after {:.2}-{:.2} s, watched for {:.0} s); {} of {} pinging clients closed",
            self.kept,
            self.sample,
            self.closed_min_s,
            self.closed_max_s,
            self.watch_s,
            self.pingers_lost,
            self.pingers
        )
    }
}

/// Each of `silent` sends one PINGREQ, then nothing: when does the broker
/// close it?
async fn keep_alive_check(silent: Vec<Conn>, ka: u16) -> Result<KeepAliveReport, ConnError> {
    let due = Duration::from_millis(u64::from(ka) * 1500);
    // Long enough to see how late a late close is.
    let watch = Duration::from_millis(u64::from(ka) * 2500) + Duration::from_secs(3);
    let sample = silent.len();
    let mut tasks = Vec::with_capacity(sample);
    for mut c in silent {
        tasks.push(tokio::spawn(async move {
            // One last packet, then silence: the clock starts here.
            c.writer.push(&Packet::PingReq)?;
            c.writer.flush().await?;
            let t0 = Instant::now();
            loop {
                match c.reader.next_within(watch, "keep alive close").await {
                    Ok(Packet::Disconnect(_)) | Err(ConnError::Closed | ConnError::Io(_)) => {
                        return Ok::<_, ConnError>(Some(t0.elapsed()))
                    }
                    Ok(_) => continue,
                    Err(ConnError::Timeout(_)) => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
        }));
    }
    let mut rep = KeepAliveReport {
        kept: 0,
        sample,
        closed_min_s: f64::INFINITY,
        closed_max_s: 0.0,
        watch_s: watch.as_secs_f64(),
        pingers_lost: 0,
        pingers: 0,
    };
    let on_time = due + Duration::from_secs(1);
    for h in tasks {
        match h.await {
            Ok(Ok(Some(d))) => {
                let s = d.as_secs_f64();
                rep.closed_min_s = rep.closed_min_s.min(s);
                rep.closed_max_s = rep.closed_max_s.max(s);
                // A little early is a broker rounding down its check, not
                // a keep alive broken.
                if d + Duration::from_millis(100) >= due && d <= on_time {
                    rep.kept += 1;
                }
            }
            // Not closed while watched: as late as the watch (a finite
            // figure, so the JSON report keeps a number).
            Ok(Ok(None)) => rep.closed_max_s = watch.as_secs_f64(),
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(ConnError::Protocol(format!("keep alive task failed: {e}"))),
        }
    }
    if !rep.closed_min_s.is_finite() {
        rep.closed_min_s = rep.closed_max_s;
    }
    Ok(rep)
}

/// A storm: every client connects at once, or `--at-once` of them at a
/// time (CONNECT, CONNACK, SUBSCRIBE, SUBACK); the rate, each client's time
/// to its SUBACK, how many failed within a minute, and the memory.
pub async fn storm(t: &Target, k: &Knobs) -> CaseResult {
    let mut notes = Vec::new();
    let wanted = k.clients.unwrap_or(if k.smoke { 50 } else { 100_000 });
    let n = fd_budget(wanted, 0, &mut notes);
    let at_once = k.at_once.unwrap_or(n).clamp(1, n.max(1));
    let case = if at_once < n {
        format!("{n} clients, {at_once} at a time")
    } else {
        format!("{n} clients at once")
    };
    let before = rss(k);
    let start = Instant::now();
    // SYNs beyond the listen backlog are retried by the kernel after 1 s,
    // 3 s, 7 s, ...: allow for that, it is part of a storm.
    let opened = open_devices(t, "storm", n, 600, at_once, Duration::from_secs(60)).await;
    let secs = start.elapsed().as_secs_f64();
    settle(k).await;
    let after = rss(k);
    let ok = opened.conns.len();
    let mut r = CaseResult {
        scenario: "storm".into(),
        case,
        seconds: secs,
        sent: n as u64,
        expected: n as u64,
        received: ok as u64,
        metrics: vec![Metric::higher("conn+sub/s", ok as f64 / secs.max(1e-9))],
        latency: latency_of(&opened.hist),
        notes,
        ..Default::default()
    };
    if let Some(l) = r.latency {
        r.metrics.push(Metric::lower("p50 ms", l.p50_us / 1000.0));
        r.metrics.push(Metric::lower("p99 ms", l.p99_us / 1000.0));
        r.notes.push(format!(
            "time to SUBACK: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            l.p50_us / 1000.0,
            l.p99_us / 1000.0,
            l.max_us / 1000.0
        ));
    }
    if let Some(e) = &opened.first_error {
        r.metrics
            .push(Metric::lower("failed", opened.failed as f64));
        r.notes.push(format!(
            "{} of {n} clients failed within 60 s; the first: {e}",
            opened.failed
        ));
    }
    memory_per(&mut r, before, after, ok, "conn");
    drop(opened.conns);
    r
}

/// Subscription `j` of the mix: 70 % `devices/{j}/cmd`, 20 %
/// `site/{j}/+/status`, 5 % `fleet/{j}/#`, 5 % the site filter in one of
/// 50 `$share` groups. None matches the throughput topic.
fn filter_mix(run: &str, j: usize) -> String {
    match j % 20 {
        0 => format!("$share/g{}/zfb/{run}/site/{j}/+/status", (j / 20) % 50),
        1 => format!("zfb/{run}/fleet/{j}/#"),
        2..=5 => format!("zfb/{run}/site/{j}/+/status"),
        _ => format!("zfb/{run}/devices/{j}/cmd"),
    }
}

/// Publish throughput to one subscriber of one topic (QoS 0, 256 B).
async fn one_to_one(t: &Target, k: &Knobs, case: String) -> CaseResult {
    let tp = format!("zfb/{}/devices/target/cmd", t.run_id);
    let f = FlowSpec {
        scenario: "subscriptions".into(),
        case,
        publishers: vec![PubSpec {
            topic: tp.clone(),
            sizes: SizeDist::Fixed(k.size.unwrap_or(256)),
            fanout: 1,
        }],
        subscribers: vec![SubSpec { filters: vec![tp] }],
        qos: QoS::AtMostOnce,
        window: k.window.unwrap_or(64),
        duration: k.duration,
        max_messages: k.max_messages,
        drain: k.drain,
        shared: false,
    };
    let mut r = flow::run(t, &f).await;
    if r.error.is_none() {
        r.metrics.push(Metric::higher("msg/s", r.msgs_per_s));
    }
    r
}

/// Send `total` filters of the mix (or their UNSUBSCRIBE) over `conns`,
/// [`PER_PACKET`] a packet, one packet in flight per client. Returns the
/// connections and how many filters were refused.
async fn bulk(
    t: &Target,
    conns: Vec<Conn>,
    total: usize,
    unsubscribe: bool,
) -> Result<(Vec<Conn>, usize), ConnError> {
    let clients = conns.len().max(1);
    let mut handles = Vec::with_capacity(clients);
    for (c_i, mut c) in conns.into_iter().enumerate() {
        let run = t.run_id.clone();
        handles.push(tokio::spawn(async move {
            let mut refused = 0;
            let mut pid: u16 = 0;
            let mine: Vec<usize> = (c_i..total).step_by(clients).collect();
            for chunk in mine.chunks(PER_PACKET) {
                let filters: Vec<String> = chunk.iter().map(|&j| filter_mix(&run, j)).collect();
                pid = pid % u16::MAX + 1;
                if unsubscribe {
                    c.unsubscribe(&filters, pid, LONG_WAIT).await?;
                } else {
                    refused += c
                        .subscribe_counted(&filters, QoS::AtMostOnce, pid, LONG_WAIT)
                        .await?;
                }
            }
            Ok::<_, ConnError>((c, refused))
        }));
    }
    let mut out = Vec::with_capacity(clients);
    let mut refused = 0;
    for h in handles {
        match h.await {
            Ok(Ok((c, n))) => {
                out.push(c);
                refused += n;
            }
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(ConnError::Protocol(format!("subscribe task failed: {e}"))),
        }
    }
    Ok((out, refused))
}

/// A million subscriptions: publish throughput to one subscriber with no
/// other subscription, the subscribe rate and memory per subscription,
/// throughput again with all of them in place, then the unsubscribe rate.
pub async fn subscriptions(t: &Target, k: &Knobs) -> Vec<CaseResult> {
    let total = k
        .subscriptions
        .unwrap_or(if k.smoke { 2_000 } else { 1_000_000 });
    let clients = k.clients.unwrap_or(if k.smoke { 4 } else { 100 }).max(1);
    let mut out = vec![one_to_one(t, k, "1:1 with 1 subscription".into()).await];
    let case = format!("{total} subscriptions over {clients} clients");
    let conns =
        match flow::connect_many(t, "subs", vec![Vec::new(); clients], QoS::AtMostOnce).await {
            Ok(c) => c,
            Err(e) => {
                out.push(CaseResult::failed("subscriptions", &case, e.to_string()));
                return out;
            }
        };
    let before = rss(k);
    let start = Instant::now();
    let (conns, refused) = match bulk(t, conns, total, false).await {
        Ok(r) => r,
        Err(e) => {
            out.push(CaseResult::failed("subscriptions", &case, e.to_string()));
            return out;
        }
    };
    let sub_secs = start.elapsed().as_secs_f64();
    settle(k).await;
    let after = rss(k);
    let mut r = CaseResult {
        scenario: "subscriptions".into(),
        case: case.clone(),
        seconds: sub_secs,
        metrics: vec![Metric::higher("sub/s", total as f64 / sub_secs.max(1e-9))],
        ..Default::default()
    };
    r.notes.push(format!(
        "mix: 70% devices/ID/cmd, 20% site/ID/+/status, 5% fleet/ID/#, 5% $share (50 groups); \
         {PER_PACKET} filters per SUBSCRIBE"
    ));
    if refused > 0 {
        r.notes.push(format!("{refused} filters refused"));
    }
    memory_per(&mut r, before, after, total, "sub");
    let mut loaded = one_to_one(t, k, format!("1:1 with {total} subscriptions")).await;
    if let (Some(base), None) = (out.first().filter(|b| b.error.is_none()), &loaded.error) {
        let ratio = loaded.msgs_per_s / base.msgs_per_s.max(1e-9);
        loaded.notes.push(format!(
            "{:.0} % of the 1-subscription figure",
            ratio * 100.0
        ));
        loaded.metrics.push(Metric::higher("ratio", ratio));
    }
    let start = Instant::now();
    match bulk(t, conns, total, true).await {
        Ok((conns, _)) => {
            let secs = start.elapsed().as_secs_f64();
            r.metrics
                .push(Metric::higher("unsub/s", total as f64 / secs.max(1e-9)));
            settle(k).await;
            if let (Some(b), Some(a)) = (before, rss(k)) {
                r.notes.push(format!(
                    "after UNSUBSCRIBE of all: RSS {:.1} MiB ({:+.1} MiB from before)",
                    a.rss_kib as f64 / 1024.0,
                    (a.rss_kib as f64 - b.rss_kib as f64) / 1024.0
                ));
            }
            drop(conns);
        }
        Err(e) => r.error = Some(format!("unsubscribe: {e}")),
    }
    out.push(r);
    out.push(loaded);
    out
}

/// Publish `count` retained messages `zfb/{run}/ret/{j / matching}/{j % matching}`
/// for the `j` of `range`, then a QoS 1 message: its PUBACK says the broker
/// has handled everything before it.
async fn publish_retained(
    t: &Target,
    c_i: usize,
    range: std::ops::Range<usize>,
    matching: usize,
) -> Result<(), ConnError> {
    let mut c = conn::connect_with(
        t.addr,
        &format!("{}-retpub{c_i}", t.run_id),
        t.protocol,
        t.handshake_timeout,
        &t.opts(c_i),
    )
    .await?;
    let body = Bytes::from_static(&[b'r'; 32]);
    for (n, j) in range.enumerate() {
        let topic = format!("zfb/{}/ret/{}/{}", t.run_id, j / matching, j % matching);
        c.writer
            .publish_flagged(&topic, QoS::AtMostOnce, true, 0, &[], &body)
            .await?;
        if n % 64 == 63 {
            c.writer.flush().await?;
        }
    }
    let barrier = format!("zfb/{}/barrier", t.run_id);
    c.writer
        .publish(&barrier, QoS::AtLeastOnce, 1, &[], &body)
        .await?;
    c.writer.flush().await?;
    loop {
        match c
            .reader
            .next_within(LONG_WAIT, "PUBACK after the retained messages")
            .await?
        {
            Packet::PubAck(a) if a.packet_id == 1 => break,
            _ => continue,
        }
    }
    c.writer.disconnect().await;
    Ok(())
}

/// Round trips of one client publishing to itself until `stop`: (start,
/// in seconds after `epoch`, and the round trip in ns) of each.
async fn pinger(
    t: Target,
    epoch: Instant,
    stop: Arc<AtomicBool>,
) -> Result<Vec<(f64, u64)>, ConnError> {
    let topic = format!("zfb/{}/ping", t.run_id);
    let mut c = conn::connect(
        t.addr,
        &format!("{}-ping", t.run_id),
        t.protocol,
        t.handshake_timeout,
    )
    .await?;
    c.subscribe(
        std::slice::from_ref(&topic),
        QoS::AtMostOnce,
        t.handshake_timeout,
    )
    .await?;
    let body = Bytes::from_static(&[b'p'; 64]);
    let mut out = Vec::new();
    let end = Instant::now() + LONG_WAIT * 3;
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        let t0 = Instant::now();
        c.writer
            .publish(&topic, QoS::AtMostOnce, 0, &[], &body)
            .await?;
        c.writer.flush().await?;
        loop {
            match c
                .reader
                .next_within(Duration::from_secs(30), "ping")
                .await?
            {
                Packet::Publish(p) if p.topic.as_str() == topic => break,
                _ => continue,
            }
        }
        out.push(((t0 - epoch).as_secs_f64(), ns(t0.elapsed())));
        // Back to back (one message in flight): a timer's millisecond
        // granularity would leave a 20 ms window with a sample or two.
        tokio::task::yield_now().await;
    }
    c.writer.disconnect().await;
    Ok(out)
}

/// A million retained messages: the rate they are stored at and the
/// memory per message; then a new subscriber's wildcard that matches
/// `matching` of them, the time until it has them all, and the round-trip
/// p99 of another client before and during that.
pub async fn retained(t: &Target, k: &Knobs) -> Vec<CaseResult> {
    let total = k
        .retained
        .unwrap_or(if k.smoke { 2_000 } else { 1_000_000 });
    let matching = k
        .matching
        .unwrap_or(if k.smoke { 100 } else { 10_000 })
        .clamp(1, total.max(1));
    let publishers = 4.min(total.max(1));
    let case = format!("{total} retained");
    let before = rss(k);
    let start = Instant::now();
    let mut handles = Vec::new();
    for p in 0..publishers {
        let range = (total * p / publishers)..(total * (p + 1) / publishers);
        let t = t.clone();
        handles.push(tokio::spawn(async move {
            publish_retained(&t, p, range, matching).await
        }));
    }
    for h in handles {
        let res = match h.await {
            Ok(r) => r,
            Err(e) => Err(ConnError::Protocol(format!("publisher failed: {e}"))),
        };
        if let Err(e) = res {
            return vec![CaseResult::failed("retained", &case, e.to_string())];
        }
    }
    let secs = start.elapsed().as_secs_f64();
    settle(k).await;
    let after = rss(k);
    let mut stored = CaseResult {
        scenario: "retained".into(),
        case,
        seconds: secs,
        metrics: vec![Metric::higher("retained/s", total as f64 / secs.max(1e-9))],
        ..Default::default()
    };
    memory_per(&mut stored, before, after, total, "retained");

    let case = format!("wildcard matching {matching} of {total}");
    let epoch = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let ping = tokio::spawn(pinger(t.clone(), epoch, stop.clone()));
    tokio::time::sleep(Duration::from_millis(if k.smoke { 200 } else { 1000 })).await;
    let filter = format!("zfb/{}/ret/{}/+", t.run_id, total / matching / 2);
    let got = wildcard_receive(t, &filter, matching).await;
    tokio::time::sleep(Duration::from_millis(if k.smoke { 100 } else { 500 })).await;
    stop.store(true, Ordering::Relaxed);
    let samples = match ping.await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return vec![
                stored,
                CaseResult::failed("retained", &case, format!("pinger: {e}")),
            ]
        }
        Err(e) => {
            return vec![
                stored,
                CaseResult::failed("retained", &case, format!("pinger: {e}")),
            ]
        }
    };
    let (from, to, received) = match got {
        Ok(g) => g,
        Err(e) => return vec![stored, CaseResult::failed("retained", &case, e.to_string())],
    };
    let (from_s, to_s) = ((from - epoch).as_secs_f64(), (to - epoch).as_secs_f64());
    let mut idle = new_histogram();
    let mut during = new_histogram();
    for &(at, lat) in &samples {
        if at < from_s {
            let _ = idle.record(lat);
        } else if at <= to_s {
            let _ = during.record(lat);
        }
    }
    let secs = (to - from).as_secs_f64();
    let mut r = CaseResult {
        scenario: "retained".into(),
        case,
        sent: matching as u64,
        expected: matching as u64,
        received: received as u64,
        lost: (matching - received.min(matching)) as u64,
        seconds: secs,
        msgs_per_s: received as f64 / secs.max(1e-9),
        latency: latency_of(&during),
        ..Default::default()
    };
    r.metrics.push(Metric::lower("seconds", secs));
    if let (Some(i), Some(d)) = (latency_of(&idle), latency_of(&during)) {
        r.metrics.push(Metric::lower("other p99 us", d.p99_us));
        r.notes.push(format!(
            "another client's round trip: p99 {:.0} us before, {:.0} us during ({} samples, max {:.0} us)",
            i.p99_us, d.p99_us, d.count, d.max_us
        ));
    } else {
        r.notes
            .push("too few round trips of another client during it to report".into());
    }
    if received < matching {
        r.error = Some(format!(
            "{received} of {matching} retained messages arrived"
        ));
    }
    vec![stored, r]
}

/// Subscribe to `filter` on a new connection and count retained messages
/// until `want` arrived: when the SUBSCRIBE went out, when the last one
/// came, and how many came.
async fn wildcard_receive(
    t: &Target,
    filter: &str,
    want: usize,
) -> Result<(Instant, Instant, usize), ConnError> {
    let mut c = conn::connect(
        t.addr,
        &format!("{}-wild", t.run_id),
        t.protocol,
        t.handshake_timeout,
    )
    .await?;
    let from = Instant::now();
    c.writer.push(&Packet::Subscribe(zerofan_codec::Subscribe {
        packet_id: 1,
        properties: Default::default(),
        filters: vec![(
            zerofan_codec::MqttStr::try_from(filter)
                .map_err(|e| ConnError::Protocol(format!("bad filter: {e}")))?,
            Default::default(),
        )],
    }))?;
    c.writer.flush().await?;
    let mut got = 0;
    let mut last = from;
    let end = from + LONG_WAIT;
    while got < want {
        let left = end.saturating_duration_since(Instant::now());
        match c.reader.next_within(left, "retained messages").await {
            Ok(Packet::Publish(p)) if p.retain => {
                got += 1;
                last = Instant::now();
            }
            Ok(Packet::SubAck(a)) if a.reasons.iter().any(|r| r.is_error()) => {
                return Err(ConnError::Protocol("wildcard SUBSCRIBE refused".into()))
            }
            Ok(_) => continue,
            Err(ConnError::Timeout(_)) => break,
            Err(e) => return Err(e),
        }
    }
    c.writer.disconnect().await;
    Ok((from, last, got))
}

/// Client `i` of the resume scenario: fixed ids, so a second invocation
/// (after a broker restart) finds the sessions of the first.
fn resume_id(i: usize) -> (String, String) {
    (format!("zfbres-{i}"), format!("zfbres/{i}/cmd"))
}

fn resume_opts(t: &Target, i: usize) -> ConnectOpts {
    ConnectOpts {
        clean_start: false,
        session_expiry: Some(86_400),
        ..t.opts(i)
    }
}

/// Persistent sessions resumed: `--phase setup` creates N sessions
/// (clean start off, one QoS 1 subscription each), disconnects them and
/// queues one QoS 1 message for each; the broker is restarted from its
/// store; `--phase resume` reconnects all at once and times until every
/// client has CONNACK with the session present and its message. Without
/// `--phase`, both in a row (no restart: what smoke runs).
pub async fn resume(t: &Target, k: &Knobs) -> Vec<CaseResult> {
    let mut notes = Vec::new();
    let n = k.clients.unwrap_or(if k.smoke { 50 } else { 100_000 });
    // Sessions are not connections: only those open at once need a
    // descriptor, so more sessions than the fd limit resume in waves.
    let mut out = Vec::new();
    let phase = k.phase.as_deref().unwrap_or("both");
    let at_once = if phase == "setup" {
        n
    } else {
        fd_budget(k.at_once.unwrap_or(n).min(n), 1, &mut notes).max(1)
    };
    if phase == "setup" || phase == "both" {
        let case = format!("set up {n} sessions");
        let before = rss(k);
        let start = Instant::now();
        match resume_setup(t, n).await {
            Ok(()) => {
                let secs = start.elapsed().as_secs_f64();
                settle(k).await;
                let mut r = CaseResult {
                    scenario: "resume".into(),
                    case,
                    seconds: secs,
                    notes: notes.clone(),
                    ..Default::default()
                };
                r.notes
                    .push("each: 1 QoS 1 subscription, 1 queued QoS 1 message (32 B)".into());
                memory_per(&mut r, before, rss(k), n, "session");
                out.push(r);
            }
            Err(e) => {
                out.push(CaseResult::failed("resume", &case, e.to_string()));
                return out;
            }
        }
    }
    if phase == "resume" || phase == "both" {
        let case = if at_once < n {
            format!("resume {n} sessions, {at_once} at a time")
        } else {
            format!("resume {n} sessions at once")
        };
        let start = Instant::now();
        match resume_all(t, n, at_once).await {
            Ok(Resumed {
                present,
                served,
                failed,
                first_error,
                hist,
            }) => {
                let secs = start.elapsed().as_secs_f64();
                let mut r = CaseResult {
                    scenario: "resume".into(),
                    case,
                    seconds: secs,
                    sent: n as u64,
                    expected: n as u64,
                    received: served as u64,
                    lost: (n - served) as u64,
                    msgs_per_s: served as f64 / start.elapsed().as_secs_f64().max(1e-9),
                    latency: latency_of(&hist),
                    notes,
                    ..Default::default()
                };
                r.metrics
                    .push(Metric::higher("resumed/s", served as f64 / secs.max(1e-9)));
                r.notes.push(format!(
                    "{present} of {n} with the session present, {served} got their queued message"
                ));
                if let Some(l) = r.latency {
                    r.metrics.push(Metric::lower("p99 ms", l.p99_us / 1000.0));
                    r.notes.push(format!(
                        "time to the queued message: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                        l.p50_us / 1000.0,
                        l.p99_us / 1000.0,
                        l.max_us / 1000.0
                    ));
                }
                if let Some(e) = first_error {
                    r.notes
                        .push(format!("{failed} clients failed; the first: {e}"));
                }
                if present < n || served < n {
                    r.error = Some(format!(
                        "{present} of {n} sessions present, {served} of {n} served"
                    ));
                }
                out.push(r);
            }
            Err(e) => out.push(CaseResult::failed("resume", &case, e.to_string())),
        }
    }
    out
}

async fn resume_setup(t: &Target, n: usize) -> Result<(), ConnError> {
    let sem = Arc::new(Semaphore::new(t.connect_concurrency.max(1)));
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let sem = sem.clone();
        let (id, topic) = resume_id(i);
        let opts = resume_opts(t, i);
        let (addr, protocol, limit) = (t.addr, t.protocol, t.handshake_timeout);
        handles.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await;
            let mut c = conn::connect_with(addr, &id, protocol, limit, &opts).await?;
            c.subscribe(&[topic], QoS::AtLeastOnce, limit).await?;
            c.writer.disconnect().await;
            Ok::<_, ConnError>(())
        }));
    }
    for h in handles {
        match h.await {
            Ok(r) => r?,
            Err(e) => return Err(ConnError::Protocol(format!("setup task failed: {e}"))),
        }
    }
    // One QoS 1 message for each absent session, 1,000 PUBACKs at a time.
    let mut p = conn::connect(
        t.addr,
        &format!("{}-respub", t.run_id),
        t.protocol,
        t.handshake_timeout,
    )
    .await?;
    let body = Bytes::from_static(&[b'q'; 32]);
    let indices: Vec<usize> = (0..n).collect();
    for chunk in indices.chunks(1000) {
        for (k, &i) in chunk.iter().enumerate() {
            p.writer
                .publish(&resume_id(i).1, QoS::AtLeastOnce, k as u16 + 1, &[], &body)
                .await?;
        }
        p.writer.flush().await?;
        let mut acked = 0;
        while acked < chunk.len() {
            if let Packet::PubAck(_) = p.reader.next_within(LONG_WAIT, "PUBACK").await? {
                acked += 1;
            }
        }
    }
    p.writer.disconnect().await;
    Ok(())
}

/// Reconnect every session at once; how many had the session present,
/// how many got their queued message, and each one's time to it (ns).
async fn resume_all(t: &Target, n: usize, at_once: usize) -> Result<Resumed, ConnError> {
    let sem = Arc::new(Semaphore::new(at_once));
    let start = Instant::now();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let (id, topic) = resume_id(i);
        let opts = resume_opts(t, i);
        let (addr, protocol) = (t.addr, t.protocol);
        let sem = sem.clone();
        handles.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await;
            let limit = Duration::from_secs(60);
            let mut c = conn::connect_with(addr, &id, protocol, limit, &opts).await?;
            let present = c.connack.session_present;
            if !present {
                // No session, no queued message to wait for.
                c.writer.disconnect().await;
                return Ok((false, None));
            }
            let end = Instant::now() + limit;
            loop {
                let left = end.saturating_duration_since(Instant::now());
                match c.reader.next_within(left, "queued message").await {
                    Ok(Packet::Publish(p)) => {
                        if p.qos != QoS::AtMostOnce {
                            c.writer.push_ack(conn::AckKind::Ack, p.packet_id)?;
                            c.writer.flush().await?;
                        }
                        if p.topic.as_str() == topic {
                            let at = start.elapsed();
                            c.writer.disconnect().await;
                            return Ok::<_, ConnError>((present, Some(at)));
                        }
                    }
                    Ok(_) => continue,
                    Err(ConnError::Timeout(_)) => return Ok((present, None)),
                    Err(e) => return Err(e),
                }
            }
        }));
    }
    let mut rep = Resumed {
        present: 0,
        served: 0,
        failed: 0,
        first_error: None,
        hist: new_histogram(),
    };
    for h in handles {
        match h.await {
            Ok(Ok((p, at))) => {
                rep.present += usize::from(p);
                if let Some(at) = at {
                    rep.served += 1;
                    let _ = rep.hist.record(ns(at));
                }
            }
            // Counted, not fatal: how many of a storm fail is a figure too.
            Ok(Err(e)) => {
                rep.failed += 1;
                rep.first_error.get_or_insert_with(|| e.to_string());
            }
            Err(e) => return Err(ConnError::Protocol(format!("resume task failed: {e}"))),
        }
    }
    Ok(rep)
}

/// What resuming every session found.
struct Resumed {
    /// CONNACKs with the session present.
    present: usize,
    /// Clients that got their queued message.
    served: usize,
    /// Clients whose connection failed (refused, timed out, closed).
    failed: usize,
    first_error: Option<String>,
    /// Each served client's time to its message (ns).
    hist: Histogram<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_has_its_shares() {
        let all: Vec<String> = (0..1000).map(|j| filter_mix("r", j)).collect();
        let count = |p: &str| all.iter().filter(|f| f.contains(p)).count();
        assert_eq!(count("/devices/"), 700);
        assert_eq!(count("/site/"), 250);
        assert_eq!(count("$share/"), 50);
        assert_eq!(count("/fleet/"), 50);
        // Distinct filters, none matching the throughput topic's levels.
        let set: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(set.len(), all.len());
        assert!(!all.iter().any(|f| f.contains("/target/")));
    }
}

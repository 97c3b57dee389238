//! zerofan-bench: a load generator that drives any MQTT broker over the
//! network and prints comparable tables.
//!
//! - [`conn`]: a minimal async MQTT 3.1.1 / 5 client connection on
//!   `zerofan-codec` (frame, decode, encode over a `TcpStream`).
//! - [`flow`]: the flow-controlled publish/subscribe engine every
//!   throughput and latency scenario runs on.
//! - [`scenarios`]: fan-in, fan-out, shared, topics, mixed, qos1, qos2,
//!   ping-pong, first-delivery, large.
//! - [`scale`]: connections, subscriptions, retained, storm, resume: the
//!   scale of state (idle connections, a million subscriptions or retained
//!   messages, storms, resumed sessions) with memory per unit.
//! - [`payload`]: the sequence/timestamp prefix of every payload, message sizes.
//! - [`report`]: results, percentiles, the table and the JSON document.
//! - [`summarize`]: many JSON reports into one Markdown comparison.
//! - [`sys`]: the loopback guard, the fd limit, broker memory from /proc.

mod conn;
mod flow;
mod payload;
mod report;
mod scale;
mod scenarios;
mod summarize;
mod sys;

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zerofan_codec::Protocol;

/// Load generator for MQTT brokers: sustained delivered throughput, latency
/// percentiles, large messages and connection cost.
#[derive(Parser, Debug)]
#[command(name = "zerofan-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// N publishers -> one wildcard subscriber (default 10 publishers, QoS 0, 256 B).
    FanIn(RunOpts),
    /// One publisher (or `--publishers`) -> N subscribers of one topic (N = 1, 10, 100, 1000; 1 KiB).
    FanOut(RunOpts),
    /// Publishers -> a $share group of 2, 5 and 10 members.
    Shared(RunOpts),
    /// 5 topics with 5 subscribers each, 512 B.
    Topics(RunOpts),
    /// One publisher -> 10 subscribers, 70% 100-500 B, 20% 1-5 KiB, 10% 10-64 KiB.
    Mixed(RunOpts),
    /// QoS 1 throughput, one publisher -> one subscriber, bounded window.
    Qos1(RunOpts),
    /// QoS 2 throughput, one publisher -> one subscriber, bounded window.
    Qos2(RunOpts),
    /// Publish-to-delivery latency with one message in flight, 64 B.
    PingPong(RunOpts),
    /// A new client's first request, one client at a time: connect,
    /// SUBSCRIBE, SUBACK, first delivery (p50 / p99; 1,000 clients, 64 B).
    FirstDelivery(RunOpts),
    /// 10 MiB messages; one 50 MiB message then 1,000 tiny ones (broker RSS with --broker-pid).
    Large(RunOpts),
    /// 10,000 clients (keep alive, one subscription each): connect rate,
    /// broker memory per idle connection, keep alive of a silent sample.
    Connections(RunOpts),
    /// 1,000,000 subscriptions (a mix with wildcards and $share): memory
    /// per subscription, (un)subscribe rates, 1:1 throughput with 1 vs all.
    Subscriptions(RunOpts),
    /// 1,000,000 retained messages: memory each, a wildcard matching 10,000
    /// (time, another client's p99 meanwhile).
    Retained(RunOpts),
    /// 100,000 clients (or as many as the fd limit allows) connecting and
    /// subscribing at once: the rate, time to SUBACK.
    Storm(RunOpts),
    /// Persistent sessions: `--phase setup`, restart the broker, `--phase
    /// resume` (time until every session has its queued message).
    Resume(RunOpts),
    /// Every scenario (or those named by --only), one after the other.
    All(RunOpts),
    /// Every scenario with tiny counts, in a few seconds; exits non-zero on
    /// any error or lost message. For CI.
    Smoke(RunOpts),
    /// Merge JSON reports (from --json runs) into a Markdown comparison.
    Summarize(SummarizeOpts),
}

/// Options shared by every scenario.
#[derive(Args, Debug, Clone)]
struct RunOpts {
    /// Broker host (must resolve to loopback unless --allow-remote).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Broker port.
    #[arg(long, default_value_t = 1883)]
    port: u16,
    /// MQTT protocol level: 4 (3.1.1) or 5.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(4..=5))]
    protocol: u8,
    /// Allow a broker that is not on this machine.
    #[arg(long)]
    allow_remote: bool,
    /// Seconds of publishing per case.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// At most this many messages per publisher per case.
    #[arg(long, default_value_t = 50_000_000)]
    max_messages: u64,
    /// Seconds to wait for late deliveries before counting them lost.
    #[arg(long, default_value_t = 2.0)]
    drain: f64,
    /// Messages in flight per publisher (default: per scenario).
    #[arg(long)]
    window: Option<u64>,
    /// Message size in bytes (default: per scenario).
    #[arg(long)]
    size: Option<usize>,
    /// Publishers (fan-in, shared).
    #[arg(long)]
    publishers: Option<usize>,
    /// Subscribers connect to this port of the same host instead (a second
    /// cluster node, for cross-node fan-out); publishers use --port.
    #[arg(long)]
    sub_port: Option<u16>,
    /// Subscriber counts for fan-out, comma-separated.
    #[arg(long, value_delimiter = ',')]
    subscribers: Option<Vec<usize>>,
    /// Shared group sizes, comma-separated.
    #[arg(long, value_delimiter = ',')]
    groups: Option<Vec<usize>>,
    /// Clients for the connections, storm and resume scenarios; for
    /// subscriptions, the clients that hold them.
    #[arg(long)]
    clients: Option<usize>,
    /// Subscriptions (subscriptions scenario).
    #[arg(long)]
    subscriptions: Option<usize>,
    /// Retained messages (retained scenario).
    #[arg(long)]
    retained: Option<usize>,
    /// Retained messages the wildcard matches (retained scenario).
    #[arg(long)]
    matching: Option<usize>,
    /// Keep alive in seconds (connections scenario).
    #[arg(long)]
    keep_alive: Option<u16>,
    /// Silent clients whose keep alive disconnection is timed (connections).
    #[arg(long)]
    sample: Option<usize>,
    /// Resume scenario: `setup` (create sessions) or `resume` (after a
    /// broker restart); both in a row when absent.
    #[arg(long, value_parser = ["setup", "resume"])]
    phase: Option<String>,
    /// Clients connecting at a time in storm and resume (default: all of
    /// them, as far as the fd limit allows).
    #[arg(long)]
    at_once: Option<usize>,
    /// Loopback source addresses to spread connections over (127.1.0.1
    /// and up; 0: one, picked by the kernel). Each has its own ~28,000
    /// ephemeral ports.
    #[arg(long, default_value_t = 64)]
    sources: usize,
    /// Connections opened at once during setup.
    #[arg(long, default_value_t = 100)]
    connect_concurrency: usize,
    /// PID of the broker, to read its memory from /proc/PID/status.
    #[arg(long)]
    broker_pid: Option<u32>,
    /// Name of the broker under test, for the report.
    #[arg(long, default_value = "broker")]
    label: String,
    /// Scenarios to run with `all`, comma-separated.
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Tiny counts and short runs (implied by `smoke`).
    #[arg(long)]
    smoke: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Worker threads of the runtime (default: the CPUs this process may use).
    #[arg(long)]
    threads: Option<usize>,
}

/// Options of `summarize`.
#[derive(Args, Debug)]
struct SummarizeOpts {
    /// JSON report files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Broker columns left to right, comma-separated.
    #[arg(long, value_delimiter = ',')]
    order: Option<Vec<String>>,
    /// The broker whose ratio to the best peer is shown.
    #[arg(long, default_value = "zerofan")]
    subject: String,
    /// Lines printed above the table (date, machine, versions, command).
    #[arg(long)]
    meta: Vec<String>,
    /// Write the result into the comparison section of this Markdown file
    /// instead of printing it.
    #[arg(long)]
    write_section: Option<PathBuf>,
    /// With --write-section: the `### ` subsection of the comparison
    /// section to replace or add (other subsections are kept).
    #[arg(long, default_value = "All scenarios")]
    title: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (name, mut opts) = match cli.cmd {
        Cmd::Summarize(s) => return summarize_cmd(s),
        Cmd::FanIn(o) => ("fan-in", o),
        Cmd::FanOut(o) => ("fan-out", o),
        Cmd::Shared(o) => ("shared", o),
        Cmd::Topics(o) => ("topics", o),
        Cmd::Mixed(o) => ("mixed", o),
        Cmd::Qos1(o) => ("qos1", o),
        Cmd::Qos2(o) => ("qos2", o),
        Cmd::PingPong(o) => ("ping-pong", o),
        Cmd::FirstDelivery(o) => ("first-delivery", o),
        Cmd::Large(o) => ("large", o),
        Cmd::Connections(o) => ("connections", o),
        Cmd::Subscriptions(o) => ("subscriptions", o),
        Cmd::Retained(o) => ("retained", o),
        Cmd::Storm(o) => ("storm", o),
        Cmd::Resume(o) => ("resume", o),
        Cmd::All(o) => ("all", o),
        Cmd::Smoke(o) => ("smoke", o),
    };
    if name == "smoke" {
        opts.smoke = true;
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(t) = opts.threads {
        builder.worker_threads(t.max(1));
    }
    let rt = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("zerofan-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(run_cmd(name, opts))
}

async fn run_cmd(name: &str, mut o: RunOpts) -> ExitCode {
    if o.smoke {
        // Tiny, but every scenario still runs end to end.
        o.duration = o.duration.min(0.3);
        o.drain = o.drain.min(2.0);
        o.max_messages = o.max_messages.min(2_000);
    }
    let addrs: Vec<_> = match tokio::net::lookup_host((o.host.as_str(), o.port)).await {
        Ok(a) => a.collect(),
        Err(e) => {
            eprintln!("zerofan-bench: cannot resolve {}: {e}", o.host);
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = sys::check_target(&addrs, o.allow_remote) {
        eprintln!("zerofan-bench: {e}");
        return ExitCode::FAILURE;
    }
    let addr = addrs[0];
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let run_id = format!(
        "zfb{:x}",
        (now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)) & 0xff_ffff
    );
    let target = flow::Target {
        addr,
        protocol: if o.protocol == 5 {
            Protocol::V5
        } else {
            Protocol::V311
        },
        run_id,
        handshake_timeout: Duration::from_secs(10),
        connect_concurrency: o.connect_concurrency.max(1),
        sources: o.sources,
        sub_addr: o.sub_port.map(|p| SocketAddr::new(addr.ip(), p)),
    };
    let knobs = scenarios::Knobs {
        duration: Duration::from_secs_f64(o.duration.clamp(0.01, 3600.0)),
        max_messages: o.max_messages.max(1),
        drain: Duration::from_secs_f64(o.drain.clamp(0.0, 600.0)),
        window: o.window,
        size: o.size,
        publishers: o.publishers,
        subscribers: o.subscribers.clone(),
        groups: o.groups.clone(),
        clients: o.clients,
        subscriptions: o.subscriptions,
        retained: o.retained,
        matching: o.matching,
        keep_alive: o.keep_alive,
        sample: o.sample,
        phase: o.phase.clone(),
        at_once: o.at_once,
        broker_pid: o.broker_pid,
        smoke: o.smoke,
    };
    let list: Vec<String> = match name {
        "all" | "smoke" => o
            .only
            .clone()
            .unwrap_or_else(|| scenarios::ALL.iter().map(|s| s.to_string()).collect()),
        one => vec![one.to_string()],
    };
    let mut report = report::RunReport {
        label: o.label.clone(),
        target: format!("{}:{}", o.host, o.port),
        protocol: o.protocol,
        started_unix: now.as_secs(),
        results: Vec::new(),
    };
    // Whatever happens, a case ends: its own bounds plus a generous margin.
    let case_limit = knobs.duration + knobs.drain + Duration::from_secs(180);
    for s in &list {
        // Two throughput runs and a million (un)subscriptions, or a million
        // retained messages, take longer on a slow broker.
        let case_limit = if scenarios::SCALE.contains(&s.as_str()) {
            2 * knobs.duration + 2 * knobs.drain + Duration::from_secs(900)
        } else {
            case_limit
        };
        if !o.json {
            eprintln!("zerofan-bench: running {s} against {}", report.target);
        }
        match tokio::time::timeout(case_limit, scenarios::run(s, &target, &knobs)).await {
            Ok(Ok(results)) => report.results.extend(results),
            Ok(Err(e)) => {
                eprintln!("zerofan-bench: {e}");
                return ExitCode::FAILURE;
            }
            Err(_) => report.results.push(report::CaseResult::failed(
                s,
                "-",
                format!("scenario did not finish within {case_limit:?}"),
            )),
        }
    }
    if o.json {
        match serde_json::to_string_pretty(&report) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("zerofan-bench: cannot serialise the report: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", report::table(&report));
    }
    let failed = report.results.iter().any(|r| r.error.is_some());
    let lost = report
        .results
        .iter()
        .any(|r| r.lost > 0 || r.duplicates > 0);
    if failed || (o.smoke && lost) {
        eprintln!(
            "zerofan-bench: {}",
            if failed {
                "some cases failed"
            } else {
                "messages were lost or duplicated"
            }
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn summarize_cmd(s: SummarizeOpts) -> ExitCode {
    let mut reports = Vec::new();
    for f in &s.files {
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("zerofan-bench: cannot read {}: {e}", f.display());
                return ExitCode::FAILURE;
            }
        };
        match serde_json::from_str::<report::RunReport>(&text) {
            Ok(r) => reports.push(r),
            Err(e) => {
                eprintln!("zerofan-bench: {} is not a report: {e}", f.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let mut body = String::new();
    for m in &s.meta {
        body.push_str(&format!("- {m}\n"));
    }
    if !s.meta.is_empty() {
        body.push('\n');
    }
    body.push_str(&summarize::markdown(
        &reports,
        &s.order.unwrap_or_default(),
        &s.subject,
    ));
    match s.write_section {
        None => print!("{body}"),
        Some(path) => {
            let doc = std::fs::read_to_string(&path).unwrap_or_default();
            let new = summarize::replace_subsection(&doc, &s.title, &body);
            if let Err(e) = std::fs::write(&path, new) {
                eprintln!("zerofan-bench: cannot write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

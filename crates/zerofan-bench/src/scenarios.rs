//! The scenarios of the comparison, each a function from options to case results.

use crate::conn::ConnError;
use crate::flow::{self, FlowSpec, PubSpec, SubSpec, Target};
use crate::payload::SizeDist;
use crate::report::{CaseResult, Metric};
use crate::sys;
use std::time::{Duration, Instant};
use zerofan_codec::QoS;

/// Every scenario, in the order `all` runs them.
pub const ALL: &[&str] = &[
    "fan-in",
    "fan-out",
    "shared",
    "topics",
    "mixed",
    "qos1",
    "qos2",
    "ping-pong",
    "first-delivery",
    "large",
    "connections",
    "subscriptions",
    "retained",
    "storm",
    "resume",
];

/// The scale-of-state scenarios (see [`crate::scale`]): slower, and given
/// a longer bound in `all`.
pub const SCALE: &[&str] = &[
    "connections",
    "subscriptions",
    "retained",
    "storm",
    "resume",
];

/// Knobs shared by the scenarios; `None` means "the scenario's default".
#[derive(Clone, Debug)]
pub struct Knobs {
    /// Publishing time per case.
    pub duration: Duration,
    /// Cap on messages per publisher per case.
    pub max_messages: u64,
    /// Grace period for late deliveries.
    pub drain: Duration,
    /// Messages in flight per publisher.
    pub window: Option<u64>,
    /// Message size in bytes.
    pub size: Option<usize>,
    /// Publishers (fan-in, shared).
    pub publishers: Option<usize>,
    /// Subscriber counts (fan-out).
    pub subscribers: Option<Vec<usize>>,
    /// Shared group sizes.
    pub groups: Option<Vec<usize>>,
    /// Clients for the connections, storm and resume scenarios (for
    /// subscriptions: the clients that hold them).
    pub clients: Option<usize>,
    /// Subscriptions for the subscriptions scenario.
    pub subscriptions: Option<usize>,
    /// Retained messages for the retained scenario.
    pub retained: Option<usize>,
    /// Retained messages the retained scenario's wildcard matches.
    pub matching: Option<usize>,
    /// Keep alive of the connections scenario, in seconds.
    pub keep_alive: Option<u16>,
    /// Silent clients whose keep alive disconnection is checked.
    pub sample: Option<usize>,
    /// Phase of the resume scenario: `setup`, `resume`, or both.
    pub phase: Option<String>,
    /// Clients connecting at a time in storm and resume (default: all).
    pub at_once: Option<usize>,
    /// Broker process to read memory from.
    pub broker_pid: Option<u32>,
    /// Tiny counts for CI.
    pub smoke: bool,
}

impl Knobs {
    fn flow(&self, scenario: &str, case: String, qos: QoS, window: u64) -> FlowSpec {
        FlowSpec {
            scenario: scenario.into(),
            case,
            publishers: Vec::new(),
            subscribers: Vec::new(),
            qos,
            window: self.window.unwrap_or(window),
            duration: self.duration,
            max_messages: self.max_messages,
            drain: self.drain,
            shared: false,
        }
    }
}

/// Human-readable size: 256B, 1KiB, 10MiB.
pub fn size_label(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}MiB", n >> 20)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}KiB", n >> 10)
    } else {
        format!("{n}B")
    }
}

fn with_rate(mut r: CaseResult) -> CaseResult {
    if r.error.is_none() {
        r.metrics.push(Metric::higher("msg/s", r.msgs_per_s));
    }
    r
}

/// Run one scenario by name; unknown names are an error.
pub async fn run(name: &str, t: &Target, k: &Knobs) -> Result<Vec<CaseResult>, String> {
    let topic = |s: &str| format!("zfb/{}/{s}", t.run_id);
    let mut out = Vec::new();
    match name {
        "fan-in" => {
            let n = k.publishers.unwrap_or(10);
            let size = k.size.unwrap_or(256);
            let mut f = k.flow(
                name,
                format!("pubs={n} {}", size_label(size)),
                QoS::AtMostOnce,
                64,
            );
            f.publishers = (0..n)
                .map(|i| PubSpec {
                    topic: topic(&format!("in/{i}")),
                    sizes: SizeDist::Fixed(size),
                    fanout: 1,
                })
                .collect();
            f.subscribers = vec![SubSpec {
                filters: vec![topic("in/+")],
            }];
            out.push(with_rate(flow::run(t, &f).await));
        }
        "fan-out" => {
            let default = if k.smoke {
                vec![1, 10]
            } else {
                vec![1, 10, 100, 1000]
            };
            let size = k.size.unwrap_or(1024);
            // More than one publisher (`--publishers`): all on the one
            // topic, so that every shard of a broker has publishers.
            let pubs = k.publishers.unwrap_or(1).max(1);
            for n in k.subscribers.clone().unwrap_or(default) {
                let window = (4096 / n.max(1) as u64).clamp(16, 256);
                let case = if pubs == 1 {
                    format!("subs={n} {}", size_label(size))
                } else {
                    format!("subs={n} pubs={pubs} {}", size_label(size))
                };
                let mut f = k.flow(name, case, QoS::AtMostOnce, window);
                let tp = topic(&format!("out{n}"));
                f.publishers = (0..pubs)
                    .map(|_| PubSpec {
                        topic: tp.clone(),
                        sizes: SizeDist::Fixed(size),
                        fanout: n as u64,
                    })
                    .collect();
                f.subscribers = (0..n)
                    .map(|_| SubSpec {
                        filters: vec![tp.clone()],
                    })
                    .collect();
                out.push(with_rate(flow::run(t, &f).await));
            }
        }
        "shared" => {
            let default = if k.smoke { vec![2] } else { vec![2, 5, 10] };
            let pubs = k.publishers.unwrap_or(2);
            let size = k.size.unwrap_or(256);
            for g in k.groups.clone().unwrap_or(default) {
                let mut f = k.flow(
                    name,
                    format!("group={g} pubs={pubs} {}", size_label(size)),
                    QoS::AtMostOnce,
                    64,
                );
                f.shared = true;
                f.publishers = (0..pubs)
                    .map(|i| PubSpec {
                        topic: topic(&format!("sh{g}/{i}")),
                        sizes: SizeDist::Fixed(size),
                        fanout: 1,
                    })
                    .collect();
                let filter = format!("$share/zfb{g}/{}", topic(&format!("sh{g}/+")));
                f.subscribers = (0..g)
                    .map(|_| SubSpec {
                        filters: vec![filter.clone()],
                    })
                    .collect();
                out.push(with_rate(flow::run(t, &f).await));
            }
        }
        "topics" => {
            let size = k.size.unwrap_or(512);
            let mut f = k.flow(
                name,
                format!("5x5 {}", size_label(size)),
                QoS::AtMostOnce,
                64,
            );
            f.publishers = (0..5)
                .map(|i| PubSpec {
                    topic: topic(&format!("t/{i}")),
                    sizes: SizeDist::Fixed(size),
                    fanout: 5,
                })
                .collect();
            f.subscribers = (0..25)
                .map(|j| SubSpec {
                    filters: vec![topic(&format!("t/{}", j % 5))],
                })
                .collect();
            out.push(with_rate(flow::run(t, &f).await));
        }
        "mixed" => {
            let mut f = k.flow(name, "subs=10 100B-64KiB".into(), QoS::AtMostOnce, 32);
            let tp = topic("mixed");
            f.publishers = vec![PubSpec {
                topic: tp.clone(),
                sizes: SizeDist::Mixed,
                fanout: 10,
            }];
            f.subscribers = (0..10)
                .map(|_| SubSpec {
                    filters: vec![tp.clone()],
                })
                .collect();
            let mut r = flow::run(t, &f).await;
            if r.error.is_none() {
                r.metrics.push(Metric::higher("msg/s", r.msgs_per_s));
                r.metrics.push(Metric::higher("MiB/s", r.mib_per_s));
            }
            out.push(r);
        }
        "qos1" | "qos2" => {
            let qos = if name == "qos1" {
                QoS::AtLeastOnce
            } else {
                QoS::ExactlyOnce
            };
            let size = k.size.unwrap_or(256);
            let window = k.window.unwrap_or(64);
            let mut f = k.flow(
                name,
                format!("1:1 window={window} {}", size_label(size)),
                qos,
                window,
            );
            let tp = topic(name);
            f.publishers = vec![PubSpec {
                topic: tp.clone(),
                sizes: SizeDist::Fixed(size),
                fanout: 1,
            }];
            f.subscribers = vec![SubSpec { filters: vec![tp] }];
            out.push(with_rate(flow::run(t, &f).await));
        }
        "ping-pong" => {
            let size = k.size.unwrap_or(64);
            let mut f = k.flow(
                name,
                format!("1:1 {}", size_label(size)),
                QoS::AtMostOnce,
                1,
            );
            f.window = 1;
            let tp = topic("ping");
            f.publishers = vec![PubSpec {
                topic: tp.clone(),
                sizes: SizeDist::Fixed(size),
                fanout: 1,
            }];
            f.subscribers = vec![SubSpec { filters: vec![tp] }];
            let mut r = flow::run(t, &f).await;
            if let (None, Some(l)) = (&r.error, r.latency) {
                r.metrics.push(Metric::lower("p50 us", l.p50_us));
                r.metrics.push(Metric::lower("p99 us", l.p99_us));
                r.metrics.push(Metric::lower("p99.9 us", l.p999_us));
            }
            out.push(r);
        }
        "first-delivery" => {
            out.push(first_delivery(t, k).await);
        }
        "large" => {
            out.extend(large(t, k).await);
        }
        "connections" => out.push(crate::scale::connections(t, k).await),
        "storm" => out.push(crate::scale::storm(t, k).await),
        "subscriptions" => out.extend(crate::scale::subscriptions(t, k).await),
        "retained" => out.extend(crate::scale::retained(t, k).await),
        "resume" => out.extend(crate::scale::resume(t, k).await),
        other => {
            return Err(format!(
                "unknown scenario {other:?}; known: {}",
                ALL.join(", ")
            ))
        }
    }
    Ok(out)
}

fn mem_note(pid: Option<u32>) -> Option<sys::Mem> {
    pid.and_then(|p| sys::read_mem(p).ok())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// 10 MiB messages, then one 50 MiB message followed by 1,000 tiny ones,
/// with the broker's memory before and after when its pid is known.
async fn large(t: &Target, k: &Knobs) -> Vec<CaseResult> {
    let mut out = Vec::new();
    let (big, huge, tiny_count) = if k.smoke {
        (1 << 20, 5 << 20, 100)
    } else {
        (10 << 20, 50 << 20, 1000)
    };
    let tp = format!("zfb/{}/large", t.run_id);
    let size = k.size.unwrap_or(big);
    let mut f = k.flow(
        "large",
        format!("1:1 {}", size_label(size)),
        QoS::AtMostOnce,
        2,
    );
    f.publishers = vec![PubSpec {
        topic: tp.clone(),
        sizes: SizeDist::Fixed(size),
        fanout: 1,
    }];
    f.subscribers = vec![SubSpec {
        filters: vec![tp.clone()],
    }];
    let mut r = flow::run(t, &f).await;
    if r.error.is_none() {
        r.metrics.push(Metric::higher("MiB/s", r.mib_per_s));
    }
    out.push(r);

    let before = mem_note(k.broker_pid);
    let mut f = k.flow(
        "large",
        format!("1x{} then {tiny_count}x64B", size_label(huge)),
        QoS::AtMostOnce,
        256,
    );
    // The tiny messages queue up behind the big one, but no more than 256 at
    // a time: brokers' default per-session queues (1,000 messages for
    // several) must not turn this case into a queue-limit test.
    f.window = (tiny_count + 1).min(256);
    f.max_messages = tiny_count + 1;
    // Count-bounded: give it time even when --duration is short.
    f.duration = f
        .duration
        .max(Duration::from_secs(if k.smoke { 10 } else { 60 }));
    f.publishers = vec![PubSpec {
        topic: tp.clone(),
        sizes: SizeDist::FirstThen {
            first: huge,
            rest: 64,
        },
        fanout: 1,
    }];
    f.subscribers = vec![SubSpec { filters: vec![tp] }];
    let mut r = flow::run(t, &f).await;
    if r.error.is_none() {
        r.metrics.push(Metric::lower("seconds", r.seconds));
    }
    tokio::time::sleep(Duration::from_millis(if k.smoke { 100 } else { 1000 })).await;
    let after = mem_note(k.broker_pid);
    if let (Some(b), Some(a)) = (before, after) {
        r.notes.push(format!(
            "broker RSS {:.1} -> {:.1} MiB (peak {:.1} MiB)",
            mib(b.rss_kib),
            mib(a.rss_kib),
            mib(a.hwm_kib)
        ));
        if r.error.is_none() {
            r.metrics
                .push(Metric::lower("RSS after MiB", mib(a.rss_kib)));
        }
    } else if k.broker_pid.is_some() {
        r.notes.push("broker memory unreadable".into());
    }
    out.push(r);
    out
}

/// A freshly connected client's first request, one client at a time:
/// connect, SUBSCRIBE, SUBACK, then the first message that an already
/// connected publisher sends on its topic. Brokers that set a quiet new
/// connection aside (zerofan parks it right after its CONNACK) pay for
/// waking it here.
async fn first_delivery(t: &Target, k: &Knobs) -> CaseResult {
    let rounds = k.clients.unwrap_or(if k.smoke { 20 } else { 1000 });
    let size = k.size.unwrap_or(64);
    let case = format!("{rounds} clients {}", size_label(size));
    match first_delivery_rounds(t, rounds, size).await {
        Ok((total, suback, seconds)) => {
            let mut r = CaseResult {
                scenario: "first-delivery".into(),
                case,
                sent: rounds as u64,
                expected: rounds as u64,
                received: rounds as u64,
                seconds,
                latency: crate::report::latency_of(&total),
                ..Default::default()
            };
            if let Some(l) = r.latency {
                r.metrics.push(Metric::lower("p50 us", l.p50_us));
                r.metrics.push(Metric::lower("p99 us", l.p99_us));
            }
            r.notes.push("latency: connect to first delivery".into());
            if let Some(l) = crate::report::latency_of(&suback) {
                r.metrics.push(Metric::lower("SUBACK p50 us", l.p50_us));
                r.metrics.push(Metric::lower("SUBACK p99 us", l.p99_us));
                r.notes.push(format!(
                    "SUBSCRIBE to SUBACK p50 {:.0} us, p99 {:.0} us",
                    l.p50_us, l.p99_us
                ));
            }
            r
        }
        Err(e) => CaseResult::failed("first-delivery", &case, e.to_string()),
    }
}

/// The rounds of `first_delivery`: histograms (ns) of connect-to-delivery
/// and of SUBSCRIBE-to-SUBACK, and the seconds it all took.
async fn first_delivery_rounds(
    t: &Target,
    rounds: usize,
    size: usize,
) -> Result<
    (
        hdrhistogram::Histogram<u64>,
        hdrhistogram::Histogram<u64>,
        f64,
    ),
    ConnError,
> {
    let limit = t.handshake_timeout;
    let mut publisher =
        crate::conn::connect(t.addr, &format!("{}-fdpub", t.run_id), t.protocol, limit).await?;
    let body = bytes::Bytes::from(vec![b'x'; size]);
    let mut total = crate::report::new_histogram();
    let mut suback = crate::report::new_histogram();
    let start = Instant::now();
    for i in 0..rounds {
        let topic = format!("zfb/{}/first/{i}", t.run_id);
        let t0 = Instant::now();
        let mut c =
            crate::conn::connect(t.addr, &format!("{}-fd{i}", t.run_id), t.protocol, limit).await?;
        let t1 = Instant::now();
        c.subscribe(std::slice::from_ref(&topic), QoS::AtMostOnce, limit)
            .await?;
        let t2 = Instant::now();
        publisher
            .writer
            .publish(&topic, QoS::AtMostOnce, 0, &[], &body)
            .await?;
        publisher.writer.flush().await?;
        loop {
            match c.reader.next_within(limit, "first delivery").await? {
                zerofan_codec::Packet::Publish(p) if p.topic.as_str() == topic => break,
                _ => continue,
            }
        }
        let t3 = Instant::now();
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        let _ = total.record(ns(t3 - t0));
        let _ = suback.record(ns(t2 - t1));
        c.writer.disconnect().await;
    }
    publisher.writer.disconnect().await;
    Ok((total, suback, start.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels() {
        assert_eq!(size_label(256), "256B");
        assert_eq!(size_label(1024), "1KiB");
        assert_eq!(size_label(1500), "1500B");
        assert_eq!(size_label(10 << 20), "10MiB");
    }
}

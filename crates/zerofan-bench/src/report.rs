//! Results of a run: the data, the latency percentiles, the readable table
//! and the JSON document.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One figure worth comparing between brokers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// Short name, e.g. `msg/s` or `p99 us`.
    pub name: String,
    /// The value.
    pub value: f64,
    /// True when a larger value is better (throughput), false for latency
    /// and memory.
    pub higher_is_better: bool,
}

impl Metric {
    /// A metric where more is better.
    pub fn higher(name: &str, value: f64) -> Self {
        Metric {
            name: name.into(),
            value,
            higher_is_better: true,
        }
    }
    /// A metric where less is better.
    pub fn lower(name: &str, value: f64) -> Self {
        Metric {
            name: name.into(),
            value,
            higher_is_better: false,
        }
    }
}

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Number of samples.
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

/// A histogram of latencies in nanoseconds (1 ns to 10 minutes, 3
/// significant digits).
pub fn new_histogram() -> Histogram<u64> {
    // Constant, valid bounds: this cannot fail.
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("constant histogram bounds")
}

/// Percentiles of a histogram of nanoseconds, in microseconds.
pub fn latency_of(h: &Histogram<u64>) -> Option<Latency> {
    if h.is_empty() {
        return None;
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    Some(Latency {
        count: h.len(),
        p50_us: us(h.value_at_quantile(0.5)),
        p99_us: us(h.value_at_quantile(0.99)),
        p999_us: us(h.value_at_quantile(0.999)),
        max_us: us(h.max()),
    })
}

/// The outcome of one case (one scenario with one parameter set).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    /// Scenario name, e.g. `fan-out`.
    pub scenario: String,
    /// Parameters of this case, e.g. `subs=100 1KiB`.
    pub case: String,
    /// Messages published.
    pub sent: u64,
    /// Deliveries expected at the receivers (sent times fan-out).
    pub expected: u64,
    /// Deliveries counted at the receivers.
    pub received: u64,
    /// Expected deliveries that did not arrive by the end of the drain period.
    pub lost: u64,
    /// Deliveries seen twice or out of order.
    pub duplicates: u64,
    /// Seconds from the first publish to the last delivery.
    pub seconds: f64,
    /// Deliveries per second counted at the receivers.
    pub msgs_per_s: f64,
    /// Payload MiB per second counted at the receivers.
    pub mib_per_s: f64,
    /// Publish-to-delivery latency.
    pub latency: Option<Latency>,
    /// The figures to compare between brokers.
    pub metrics: Vec<Metric>,
    /// Anything else worth saying (memory, limits hit).
    pub notes: Vec<String>,
    /// Why the case failed, if it did.
    pub error: Option<String>,
}

impl CaseResult {
    /// A failed case.
    pub fn failed(scenario: &str, case: &str, error: String) -> Self {
        CaseResult {
            scenario: scenario.into(),
            case: case.into(),
            error: Some(error),
            ..Default::default()
        }
    }
}

/// Everything one invocation measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// Name of the broker under test (`--label`).
    pub label: String,
    /// host:port driven.
    pub target: String,
    /// MQTT protocol level (4 or 5).
    pub protocol: u8,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix: u64,
    /// One entry per case.
    pub results: Vec<CaseResult>,
}

/// Format a count or rate compactly: 1234 -> `1.23k`, 5_600_000 -> `5.60M`.
pub fn si(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a == 0.0 {
        "0".into()
    } else {
        format!("{v:.3}")
    }
}

fn opt_us(l: &Option<Latency>, f: impl Fn(&Latency) -> f64) -> String {
    match l {
        Some(l) => format!("{:.0}", f(l)),
        None => "-".into(),
    }
}

/// The readable table printed by default.
pub fn table(report: &RunReport) -> String {
    let headers = [
        "scenario", "case", "msg/s", "MiB/s", "sent", "recv", "lost", "p50 us", "p99 us",
        "p99.9 us", "notes",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for r in &report.results {
        let mut notes = r.notes.join("; ");
        if let Some(e) = &r.error {
            notes = format!("ERROR: {e}");
        }
        let no_messages = r.sent == 0 && r.received == 0;
        rows.push(vec![
            r.scenario.clone(),
            r.case.clone(),
            if no_messages {
                "-".into()
            } else {
                si(r.msgs_per_s)
            },
            if no_messages {
                "-".into()
            } else {
                format!("{:.1}", r.mib_per_s)
            },
            r.sent.to_string(),
            r.received.to_string(),
            if r.duplicates > 0 {
                format!("{} (+{} dup)", r.lost, r.duplicates)
            } else {
                r.lost.to_string()
            },
            opt_us(&r.latency, |l| l.p50_us),
            opt_us(&r.latency, |l| l.p99_us),
            opt_us(&r.latency, |l| l.p999_us),
            notes,
        ]);
    }
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# zerofan-bench against {} ({}), MQTT protocol level {}",
        report.label, report.target, report.protocol
    );
    let line = |out: &mut String, cells: &[String]| {
        let last = cells.len() - 1;
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                let _ = write!(out, "{c}");
            } else if (2..=9).contains(&i) {
                let _ = write!(out, "{c:>w$}  ");
            } else {
                let _ = write!(out, "{c:<w$}  ");
            }
        }
        out.push('\n');
    };
    let hs: Vec<String> = headers.iter().map(|s| s.to_string()).collect();
    line(&mut out, &hs);
    for row in &rows {
        line(&mut out, row);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_histogram() {
        let mut h = new_histogram();
        for v in 1..=10_000u64 {
            h.record(v * 1000).unwrap();
        }
        let l = latency_of(&h).unwrap();
        assert_eq!(l.count, 10_000);
        assert!((l.p50_us - 5000.0).abs() / 5000.0 < 0.01, "{}", l.p50_us);
        assert!((l.p99_us - 9900.0).abs() / 9900.0 < 0.01, "{}", l.p99_us);
        assert!((l.p999_us - 9990.0).abs() / 9990.0 < 0.01, "{}", l.p999_us);
        assert!((l.max_us - 10_000.0).abs() / 10_000.0 < 0.01);
        assert!(latency_of(&new_histogram()).is_none());
    }

    #[test]
    fn histograms_merge() {
        let mut a = new_histogram();
        let mut b = new_histogram();
        a.record(1_000).unwrap();
        b.record(3_000_000).unwrap();
        a.add(&b).unwrap();
        let l = latency_of(&a).unwrap();
        assert_eq!(l.count, 2);
        assert!(l.max_us > 2_990.0);
    }

    #[test]
    fn si_formats() {
        assert_eq!(si(0.0), "0");
        assert_eq!(si(12.345), "12.35");
        assert_eq!(si(999.0), "999");
        assert_eq!(si(12_345.0), "12.3k");
        assert_eq!(si(5_600_000.0), "5.60M");
    }

    #[test]
    fn table_lists_every_case() {
        let report = RunReport {
            label: "mosquitto".into(),
            target: "127.0.0.1:1883".into(),
            protocol: 4,
            started_unix: 0,
            results: vec![
                CaseResult {
                    scenario: "fan-in".into(),
                    case: "pubs=10 256B".into(),
                    sent: 10,
                    received: 10,
                    msgs_per_s: 123_456.0,
                    ..Default::default()
                },
                CaseResult::failed("qos2", "x", "boom".into()),
            ],
        };
        let t = table(&report);
        assert!(t.contains("fan-in"));
        assert!(t.contains("123.5k"));
        assert!(t.contains("ERROR: boom"));
        let json = serde_json::to_string(&report).unwrap();
        let back: RunReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report);
    }
}

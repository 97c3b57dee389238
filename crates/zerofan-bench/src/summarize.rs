//! Turn the JSON reports of several runs (brokers x repeats) into one
//! Markdown comparison: medians with min-max, and the ratio of the subject
//! broker (zerofan) to the best peer for every metric.

use crate::report::{si, RunReport};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The heading of the section `summarize` writes into BENCHMARKS.md.
pub const SECTION: &str = "## End-to-end comparison (zerofan-bench)";

/// The values one broker produced for one metric over the repeats.
#[derive(Clone, Debug, Default)]
struct Cell {
    values: Vec<f64>,
    lost: u64,
    errors: usize,
}

/// Median of a non-empty slice (mean of the middle two for even lengths).
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    })
}

fn fmt_value(v: f64) -> String {
    if v.abs() < 100.0 && v.fract() != 0.0 {
        format!("{v:.1}")
    } else {
        si(v)
    }
}

/// Build the Markdown tables. `order` lists broker labels left to right
/// (labels not in it follow in order of appearance); `subject` is the label
/// whose ratio to the best other broker is shown.
pub fn markdown(reports: &[RunReport], order: &[String], subject: &str) -> String {
    // (scenario, case, metric) -> (higher_is_better, label -> cell)
    // Rows follow the scenario order of `all`, then first appearance.
    type Key = (usize, usize, String, String, String);
    let mut rows: BTreeMap<Key, (bool, BTreeMap<String, Cell>)> = BTreeMap::new();
    let mut first_seen: Vec<(String, String, String)> = Vec::new();
    let mut labels: Vec<String> = order.to_vec();
    let mut failures: Vec<String> = Vec::new();
    for rep in reports {
        if !labels.contains(&rep.label) {
            labels.push(rep.label.clone());
        }
        for r in &rep.results {
            if let Some(e) = &r.error {
                failures.push(format!("{} {} {}: {e}", rep.label, r.scenario, r.case));
            }
            for m in &r.metrics {
                let id = (r.scenario.clone(), r.case.clone(), m.name.clone());
                let pos = match first_seen.iter().position(|x| *x == id) {
                    Some(p) => p,
                    None => {
                        first_seen.push(id.clone());
                        first_seen.len() - 1
                    }
                };
                let rank = crate::scenarios::ALL
                    .iter()
                    .position(|s| *s == id.0)
                    .unwrap_or(usize::MAX);
                let key = (rank, pos, id.0, id.1, id.2);
                let entry = rows
                    .entry(key)
                    .or_insert_with(|| (m.higher_is_better, BTreeMap::new()));
                let cell = entry.1.entry(rep.label.clone()).or_default();
                cell.values.push(m.value);
                cell.lost = cell.lost.max(r.lost);
            }
            if r.error.is_some() {
                // Make the failure visible in every row of that case.
                for ((_, _, s, c, _), (_, cells)) in rows.iter_mut() {
                    if *s == r.scenario && *c == r.case {
                        cells.entry(rep.label.clone()).or_default().errors += 1;
                    }
                }
            }
        }
    }
    let mut out = String::new();
    let _ = write!(out, "| scenario | case | metric |");
    for l in &labels {
        let _ = write!(out, " {l} |");
    }
    let _ = writeln!(out, " {subject} / best peer |");
    let _ = write!(out, "| --- | --- | --- |");
    for _ in &labels {
        let _ = write!(out, " ---: |");
    }
    let _ = writeln!(out, " ---: |");
    for ((_, _, scenario, case, metric), (higher, cells)) in &rows {
        let arrow = if *higher { "↑" } else { "↓" };
        let _ = write!(out, "| {scenario} | {case} | {metric} {arrow} |");
        let mut subject_median = None;
        let mut best_peer: Option<f64> = None;
        for l in &labels {
            match cells.get(l) {
                Some(c) if !c.values.is_empty() => {
                    let med = median(&c.values).unwrap_or(0.0);
                    let lo = c.values.iter().cloned().fold(f64::INFINITY, f64::min);
                    let hi = c.values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let mut s = if c.values.len() > 1 {
                        format!("{} ({}–{})", fmt_value(med), fmt_value(lo), fmt_value(hi))
                    } else {
                        fmt_value(med)
                    };
                    if c.lost > 0 {
                        let _ = write!(s, " **lost {}**", c.lost);
                    }
                    if c.errors > 0 {
                        let _ = write!(s, " **{} failed**", c.errors);
                    }
                    let _ = write!(out, " {s} |");
                    if l == subject {
                        subject_median = Some(med);
                    } else {
                        best_peer = Some(match best_peer {
                            None => med,
                            Some(b) if *higher => b.max(med),
                            Some(b) => b.min(med),
                        });
                    }
                }
                Some(c) if c.errors > 0 => {
                    let _ = write!(out, " failed |");
                }
                _ => {
                    let _ = write!(out, " - |");
                }
            }
        }
        match (subject_median, best_peer) {
            // A ratio to zero or a negative figure (memory shrinking) says nothing.
            (Some(s), Some(b)) if b > 0.0 && s >= 0.0 => {
                let _ = writeln!(out, " {:.2}x |", s / b);
            }
            _ => {
                let _ = writeln!(out, " - |");
            }
        }
    }
    if !failures.is_empty() {
        let _ = writeln!(out, "\nFailed cases:\n");
        for f in &failures {
            let _ = writeln!(out, "- {f}");
        }
    }
    out
}

/// Replace the section headed [`SECTION`] in `doc` (up to the next `## `
/// heading) with `body`, or append it if absent.
pub fn replace_section(doc: &str, body: &str) -> String {
    let section = format!("{SECTION}\n\n{}\n", body.trim_end());
    let Some(start) = doc.find(SECTION) else {
        let mut out = doc.trim_end().to_string();
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(&section);
        return out;
    };
    let after = start + SECTION.len();
    let end = doc[after..]
        .find("\n## ")
        .map(|i| after + i + 1)
        .unwrap_or(doc.len());
    let mut out = String::with_capacity(doc.len() + body.len());
    out.push_str(&doc[..start]);
    out.push_str(&section);
    if end < doc.len() {
        out.push('\n');
        out.push_str(&doc[end..]);
    }
    out
}

/// Text placed under [`SECTION`] when the section is first created.
pub const PREAMBLE: &str = "Written by `bench/compare.sh` (see `bench/README.md`): each broker \
runs fresh on one core, zerofan-bench on the other, the same scenarios against each. One \
subsection per scenario set; a new run of the same set replaces its subsection.";

/// Replace (or add) the subsection `### {title}` inside the section headed
/// [`SECTION`], creating the section (with [`PREAMBLE`]) if absent. Other
/// sections and other subsections are kept as they are.
pub fn replace_subsection(doc: &str, title: &str, body: &str) -> String {
    let heading = format!("### {title}");
    let block = format!("{heading}\n\n{}\n", body.trim_end());
    let Some(start) = doc.find(SECTION) else {
        return replace_section(doc, &format!("{PREAMBLE}\n\n{block}"));
    };
    let after = start + SECTION.len();
    let end = doc[after..]
        .find("\n## ")
        .map(|i| after + i + 1)
        .unwrap_or(doc.len());
    let sec = &doc[after..end];
    let needle = format!("\n{heading}\n");
    let new_sec = match sec.find(&needle) {
        Some(i) => {
            let bstart = i + 1;
            let rest = bstart + heading.len();
            let bend = sec[rest..]
                .find("\n### ")
                .map(|j| rest + j + 1)
                .unwrap_or(sec.len());
            let mut s = sec[..bstart].to_string();
            s.push_str(&block);
            if bend < sec.len() {
                s.push('\n');
                s.push_str(&sec[bend..]);
            }
            s
        }
        None => format!("{}\n\n{block}", sec.trim_end()),
    };
    let mut out = String::with_capacity(doc.len() + block.len());
    out.push_str(&doc[..after]);
    out.push_str(&new_sec);
    if end < doc.len() {
        out.push('\n');
        out.push_str(&doc[end..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{CaseResult, Metric};

    fn rep(label: &str, rate: f64, p50: f64, lost: u64) -> RunReport {
        RunReport {
            label: label.into(),
            target: "127.0.0.1:1".into(),
            protocol: 4,
            started_unix: 0,
            results: vec![
                CaseResult {
                    scenario: "fan-in".into(),
                    case: "pubs=10".into(),
                    lost,
                    metrics: vec![Metric::higher("msg/s", rate)],
                    ..Default::default()
                },
                CaseResult {
                    scenario: "ping-pong".into(),
                    case: "64B".into(),
                    metrics: vec![Metric::lower("p50 us", p50)],
                    ..Default::default()
                },
            ],
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn ratio_against_best_peer() {
        let reports = vec![
            rep("mosquitto", 100_000.0, 40.0, 0),
            rep("mosquitto", 120_000.0, 50.0, 0),
            rep("mosquitto", 110_000.0, 45.0, 0),
            rep("mochi", 200_000.0, 30.0, 3),
            rep("zerofan", 600_000.0, 15.0, 0),
        ];
        let mut reports = reports;
        reports[0].results.reverse();
        let md = markdown(&reports, &["mosquitto".into()], "zerofan");
        let fan_in_at = md.find("| fan-in").unwrap();
        assert!(fan_in_at < md.find("| ping-pong").unwrap());
        let lines: Vec<&str> = md.lines().collect();
        assert!(lines[0].starts_with("| scenario | case | metric | mosquitto | mochi | zerofan |"));
        let fan_in = lines.iter().find(|l| l.starts_with("| fan-in")).unwrap();
        assert!(fan_in.contains("110.0k (100.0k–120.0k)"), "{fan_in}");
        assert!(fan_in.contains("**lost 3**"), "{fan_in}");
        assert!(fan_in.ends_with(" 3.00x |"), "{fan_in}");
        let ping = lines.iter().find(|l| l.starts_with("| ping-pong")).unwrap();
        // Lower is better: best peer is mochi's 30, 15 / 30 = 0.5.
        assert!(ping.ends_with(" 0.50x |"), "{ping}");
    }

    #[test]
    fn subsections_are_replaced_or_added() {
        let doc = "# Benchmarks\n\n## Codec\n\nfast\n";
        let one = replace_subsection(doc, "All scenarios", "table A1");
        assert!(one.contains(&format!(
            "{SECTION}\n\n{PREAMBLE}\n\n### All scenarios\n\ntable A1\n"
        )));
        let doc2 = format!("{one}\n## Pool\n\npool figures\n");
        let two = replace_subsection(&doc2, "Core", "table C1");
        assert!(two.contains("### All scenarios\n\ntable A1\n\n### Core\n\ntable C1\n\n## Pool"));
        let three = replace_subsection(&two, "All scenarios", "table A2");
        assert!(three.contains("### All scenarios\n\ntable A2\n\n### Core\n\ntable C1\n"));
        assert!(!three.contains("table A1"));
        let four = replace_subsection(&three, "Core", "table C2");
        assert!(four.contains("### Core\n\ntable C2\n\n## Pool\n\npool figures\n"));
        assert!(four.starts_with("# Benchmarks\n\n## Codec\n\nfast\n\n"));
        assert_eq!(four.matches(SECTION).count(), 1);
        assert_eq!(four.matches(PREAMBLE).count(), 1);
    }

    #[test]
    fn sections_are_replaced_or_appended() {
        let doc = "# Benchmarks\n\n## Codec\n\nfast\n";
        let appended = replace_section(doc, "table 1");
        assert!(appended.ends_with(&format!("{SECTION}\n\ntable 1\n")));
        assert!(appended.starts_with("# Benchmarks\n\n## Codec\n\nfast\n\n"));
        let doc2 = format!("{appended}\n## Pool\n\npool figures\n");
        let replaced = replace_section(&doc2, "table 2");
        assert!(replaced.contains("table 2"));
        assert!(!replaced.contains("table 1"));
        assert!(replaced.contains("## Codec\n\nfast"));
        assert!(replaced.contains("## Pool\n\npool figures"));
        assert_eq!(replace_section("", "x"), format!("{SECTION}\n\nx\n"));
    }
}

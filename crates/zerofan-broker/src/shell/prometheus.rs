//! The Prometheus text exposition format (version 0.0.4), written by hand:
//! `# HELP` and `# TYPE` once per family, counters ending in `_total`,
//! labels for qos, reason and listener.

use crate::core::{Gauges, Label, Metrics, ShellStats, StoreFigures, LATENCY_BUCKETS};
use std::fmt::Write;

/// The `Content-Type` of [`render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One listener's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenerFigures {
    /// The bound address, e.g. `127.0.0.1:1883`.
    pub addr: String,
    /// Its kind (`mqtt`, `mqtt+tls`, `ws`, ...).
    pub kind: String,
    /// Connections open now.
    pub open: u64,
    /// Connections accepted since start.
    pub opened: u64,
}

/// Everything one scrape shows, gathered in one short borrow of the core.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Seconds since start.
    pub uptime_seconds: f64,
    /// The core's counters.
    pub metrics: Metrics,
    /// The core's gauges.
    pub gauges: Gauges,
    /// Socket bytes and buffer pool figures.
    pub shell: ShellStats,
    /// The store.
    pub store: StoreFigures,
    /// Per listener.
    pub listeners: Vec<ListenerFigures>,
    /// Per shard (with several): connections open, sessions online.
    pub shards: Vec<(usize, usize)>,
    /// Reloads that took effect.
    pub reloads_ok: u64,
    /// Reloads refused (the old configuration stayed).
    pub reloads_failed: u64,
    /// Scrapes turned away because too many were in progress.
    pub http_refused: u64,
    /// `/api/` requests refused by token checks.
    pub api_auth: super::api::auth::AuthFigures,
    /// Each webhook's counters, and events lost before any queue (the
    /// core's event buffer was full).
    pub webhooks: (Vec<super::webhook::WebhookFigures>, u64),
    /// Per bridge.
    pub bridges: Vec<crate::bridge::BridgeFigures>,
}

/// Writes families and samples.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (name ends in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Buckets, sum and count.
    Histogram,
}

impl Exposition {
    /// `# HELP` and `# TYPE` lines of a family.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One sample.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        self.out.push(' ');
        self.out.push_str(&format_value(value));
        self.out.push('\n');
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A family with one sample per value of one label.
    pub fn labelled(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        label: &str,
        values: &[(&str, f64)],
    ) {
        self.family(name, kind, help);
        for (l, v) in values {
            self.sample(name, &[(label, l)], *v);
        }
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.out
    }
}

/// A sample value: integers without a fraction, `+Inf`, `-Inf`, `NaN`.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Label values escape `\`, `"` and newlines.
fn escape_label(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Help text escapes `\` and newlines.
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

const QOS: [&str; 3] = ["0", "1", "2"];

/// The whole `/metrics` page.
pub fn render(s: &Snapshot) -> String {
    use Kind::{Counter, Gauge, Histogram};
    let mut e = Exposition::default();
    let m = &s.metrics;
    let g = &s.gauges;
    let st = &s.shell;

    e.family(
        "zerofan_build_info",
        Gauge,
        "Version of the running broker (always 1).",
    );
    e.sample(
        "zerofan_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    e.single(
        "zerofan_uptime_seconds",
        Gauge,
        "Seconds since the broker started.",
        s.uptime_seconds,
    );

    // Connections and sessions.
    e.single(
        "zerofan_connections",
        Gauge,
        "Network connections open now (CONNECT received or not).",
        g.connections as f64,
    );
    e.family(
        "zerofan_listener_connections",
        Gauge,
        "Network connections open now, by listener.",
    );
    for l in &s.listeners {
        e.sample(
            "zerofan_listener_connections",
            &[("listener", &l.addr), ("kind", &l.kind)],
            l.open as f64,
        );
    }
    e.family(
        "zerofan_listener_connections_opened_total",
        Counter,
        "Network connections accepted since start, by listener.",
    );
    for l in &s.listeners {
        e.sample(
            "zerofan_listener_connections_opened_total",
            &[("listener", &l.addr), ("kind", &l.kind)],
            l.opened as f64,
        );
    }
    if !s.shards.is_empty() {
        e.family(
            "zerofan_shard_connections",
            Gauge,
            "Network connections open now, by shard (thread).",
        );
        for (i, (conns, _)) in s.shards.iter().enumerate() {
            e.sample(
                "zerofan_shard_connections",
                &[("shard", &i.to_string())],
                *conns as f64,
            );
        }
        e.family(
            "zerofan_shard_sessions_online",
            Gauge,
            "Sessions with a connection attached, by shard (thread).",
        );
        for (i, (_, online)) in s.shards.iter().enumerate() {
            e.sample(
                "zerofan_shard_sessions_online",
                &[("shard", &i.to_string())],
                *online as f64,
            );
        }
    }
    e.labelled("zerofan_sessions", Gauge, "Sessions, by state: online (a connection attached) or offline (kept for their expiry interval).", "state",
        &[("online", g.sessions_online as f64), ("offline", g.sessions_offline as f64)]);
    e.single(
        "zerofan_subscriptions",
        Gauge,
        "Subscriptions, all sessions.",
        g.subscriptions as f64,
    );

    // Messages and bytes.
    e.single(
        "zerofan_network_bytes_received_total",
        Counter,
        "Bytes read from client sockets.",
        st.bytes_received as f64,
    );
    e.single(
        "zerofan_network_bytes_sent_total",
        Counter,
        "Bytes written to client sockets.",
        st.bytes_sent as f64,
    );

    // Cluster.
    e.single(
        "zerofan_cluster_members",
        Gauge,
        "Members of this node's cluster (0: not a cluster node).",
        st.cluster_members as f64,
    );
    e.single(
        "zerofan_cluster_leader_changes_total",
        Counter,
        "Raft leader changes this node saw.",
        st.cluster_leader_changes as f64,
    );
    e.single(
        "zerofan_cluster_replication_lag",
        Gauge,
        "Log entries the furthest follower is behind (reported by the leader; 0 elsewhere).",
        st.cluster_replication_lag as f64,
    );
    e.single(
        "zerofan_cluster_claims_total",
        Counter,
        "Client-id claims applied by the cluster's log.",
        st.cluster_claims as f64,
    );
    e.single(
        "zerofan_cluster_tls_refused_total",
        Counter,
        "Node-to-node connections refused: no valid certificate from the cluster CA.",
        st.cluster_tls_refused as f64,
    );
    e.single(
        "zerofan_cluster_lease_expiries_total",
        Counter,
        "Times this node's cluster lease ran out (no majority heard within the lease).",
        st.cluster_lease_expiries as f64,
    );
    e.single(
        "zerofan_cluster_lost_handed_total",
        Counter,
        "Client ids this node, leading, handed from a member whose lease ran out to a live member, which serves their sessions from its copies.",
        st.cluster_lost_handed as f64,
    );
    e.single(
        "zerofan_cluster_replica_images",
        Gauge,
        "Images of other nodes' persistent sessions kept here (replicas).",
        st.cluster_replica_images as f64,
    );
    e.single(
        "zerofan_cluster_replica_bytes",
        Gauge,
        "Message bytes (topic and payload) held by those images.",
        st.cluster_replica_bytes as f64,
    );
    e.single(
        "zerofan_cluster_forwarded_messages_total",
        Counter,
        "Messages written to other cluster nodes (one per destination node).",
        st.cluster_forwarded_messages as f64,
    );
    e.single(
        "zerofan_cluster_forwarded_bytes_total",
        Counter,
        "Bytes written to other cluster nodes.",
        st.cluster_forwarded_bytes as f64,
    );
    e.single(
        "zerofan_cluster_received_bytes_total",
        Counter,
        "Bytes read from other cluster nodes.",
        st.cluster_received_bytes as f64,
    );
    e.single(
        "zerofan_cluster_dropped_messages_total",
        Counter,
        "Messages for another node dropped because its link's queue overflowed.",
        st.cluster_dropped_messages as f64,
    );
    e.single(
        "zerofan_cluster_shed_frames_total",
        Counter,
        "Frames other than messages dropped from an overflowing link queue: replica operations for a node away (it gets full images when back), and interests or retained messages that a later frame in the queue sets anew.",
        st.cluster_shed_frames as f64,
    );
    e.single(
        "zerofan_cluster_link_connects_total",
        Counter,
        "Links to other cluster nodes connected or reconnected.",
        st.cluster_link_connects as f64,
    );
    e.single(
        "zerofan_cluster_frames_sent_total",
        Counter,
        "Frames (events, one message each at most) written to other cluster nodes.",
        st.cluster_frames_sent as f64,
    );
    e.single(
        "zerofan_cluster_frames_received_total",
        Counter,
        "Frames read from other cluster nodes.",
        st.cluster_frames_received as f64,
    );
    e.single(
        "zerofan_cluster_dial_failures_total",
        Counter,
        "Attempts to open a link to another node that failed.",
        st.cluster_dial_failures as f64,
    );
    e.single(
        "zerofan_cluster_bad_frames_total",
        Counter,
        "Links from other nodes closed for a frame that could not be read, or refused (not a member).",
        st.cluster_bad_frames as f64,
    );

    // Queues.
    e.single(
        "zerofan_queued_messages",
        Gauge,
        "Messages waiting in session queues, all sessions.",
        g.queued_messages as f64,
    );
    e.single(
        "zerofan_queued_messages_max",
        Gauge,
        "The longest session queue, in messages.",
        g.queued_messages_max as f64,
    );
    e.single(
        "zerofan_queued_bytes",
        Gauge,
        "Payload bytes waiting in session queues, all sessions.",
        g.queued_bytes as f64,
    );
    e.single(
        "zerofan_queued_bytes_max",
        Gauge,
        "The largest session queue, in payload bytes.",
        g.queued_bytes_max as f64,
    );
    e.single(
        "zerofan_queued_bytes_online",
        Gauge,
        "Bytes queued for connected clients, counted against max_online_queued_bytes.",
        g.queued_bytes_online as f64,
    );
    e.single(
        "zerofan_inflight_messages",
        Gauge,
        "QoS 1/2 messages sent and not yet acknowledged, all sessions.",
        g.inflight as f64,
    );
    e.single(
        "zerofan_inflight_messages_max",
        Gauge,
        "The most QoS 1/2 messages in flight to one session.",
        g.inflight_max as f64,
    );
    e.single(
        "zerofan_retained_messages",
        Gauge,
        "Retained messages stored.",
        g.retained as f64,
    );

    // Store.
    let store = &s.store;
    e.single(
        "zerofan_store_durable",
        Gauge,
        "1 when a durable store is in use, 0 in memory.",
        f64::from(u8::from(store.durable)),
    );
    e.single(
        "zerofan_store_open",
        Gauge,
        "1 when the store is open.",
        f64::from(u8::from(store.open)),
    );
    e.single(
        "zerofan_store_size_bytes",
        Gauge,
        "Bytes the store occupies on disk.",
        store.size_bytes as f64,
    );
    e.single(
        "zerofan_store_live_bytes",
        Gauge,
        "Estimated bytes of live records in the store (what a compaction would keep).",
        store.live_bytes as f64,
    );
    e.single(
        "zerofan_store_records_total",
        Counter,
        "Records staged in the store.",
        store.records as f64,
    );
    e.single(
        "zerofan_store_commits_total",
        Counter,
        "Store commits (a group commit counts once).",
        store.commits as f64,
    );
    e.single(
        "zerofan_store_fsyncs_total",
        Counter,
        "fsync calls made by the store.",
        store.fsyncs as f64,
    );
    e.single(
        "zerofan_store_written_bytes_total",
        Counter,
        "Bytes written to the store's files.",
        store.bytes_written as f64,
    );
    e.single(
        "zerofan_store_compactions_total",
        Counter,
        "Store compactions (log rewrites).",
        store.compactions as f64,
    );
    e.family(
        "zerofan_store_fsync_seconds",
        Histogram,
        "Latency of the store's fsyncs.",
    );
    let mut cumulative = 0u64;
    for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
        cumulative += store.fsync.buckets[i];
        e.sample(
            "zerofan_store_fsync_seconds_bucket",
            &[("le", &format_value(*bound))],
            cumulative as f64,
        );
    }
    e.sample(
        "zerofan_store_fsync_seconds_bucket",
        &[("le", "+Inf")],
        store.fsync.count as f64,
    );
    e.sample(
        "zerofan_store_fsync_seconds_sum",
        &[],
        store.fsync.sum_seconds,
    );
    e.sample(
        "zerofan_store_fsync_seconds_count",
        &[],
        store.fsync.count as f64,
    );

    // Buffer pool.
    e.single(
        "zerofan_pool_gets_total",
        Counter,
        "Buffer pool: buffers requested.",
        st.pool_gets as f64,
    );
    e.single(
        "zerofan_pool_hits_total",
        Counter,
        "Buffer pool: requests served with a pooled buffer.",
        st.pool_hits as f64,
    );
    e.single(
        "zerofan_pool_misses_total",
        Counter,
        "Buffer pool: requests that allocated.",
        st.pool_misses as f64,
    );
    e.single(
        "zerofan_pool_returns_total",
        Counter,
        "Buffer pool: buffers returned.",
        st.pool_returns as f64,
    );
    e.single(
        "zerofan_pool_discards_total",
        Counter,
        "Buffer pool: returned buffers freed instead of kept.",
        st.pool_discards as f64,
    );
    e.single(
        "zerofan_pool_hit_ratio",
        Gauge,
        "Buffer pool: hits / gets since start.",
        st.pool_hit_rate,
    );
    e.single(
        "zerofan_pool_outstanding_bytes",
        Gauge,
        "Buffer pool: bytes handed out and not yet returned.",
        st.pool_bytes_outstanding as f64,
    );
    e.single(
        "zerofan_pool_retained_bytes",
        Gauge,
        "Buffer pool: free bytes kept for reuse.",
        st.pool_bytes_retained as f64,
    );
    e.single(
        "zerofan_connections_parked",
        Gauge,
        "Quiet connections parked: no task of their own until traffic wakes them.",
        st.connections_parked as f64,
    );
    e.single(
        "zerofan_connection_parks_total",
        Counter,
        "Times a quiet connection was parked.",
        st.connection_parks as f64,
    );
    e.single(
        "zerofan_shard_start_timeouts_total",
        Counter,
        "Shards that served before every shard applied the others' restored subscriptions.",
        st.shard_start_timeouts as f64,
    );

    // Operations.
    e.single(
        "zerofan_log_lines_suppressed_total",
        Counter,
        "Per-client log lines held back by the log rate limit.",
        g.log_suppressed as f64,
    );
    e.labelled(
        "zerofan_reloads_total",
        Counter,
        "Configuration reloads (SIGHUP), by result; a failed one keeps the configuration in force.",
        "result",
        &[
            ("ok", s.reloads_ok as f64),
            ("error", s.reloads_failed as f64),
        ],
    );
    e.single(
        "zerofan_http_refused_total",
        Counter,
        "Metrics/health requests turned away because too many were in progress.",
        s.http_refused as f64,
    );
    e.labelled(
        "zerofan_http_api_refused_total",
        Counter,
        "/api/ requests refused: no or wrong token (401), or throttled after failures (429).",
        "reason",
        &[
            ("unauthorized", s.api_auth.failures as f64),
            ("throttled", s.api_auth.throttled as f64),
        ],
    );
    webhooks(&mut e, &s.webhooks.0, s.webhooks.1);
    crate::bridge::render(&mut e, &s.bridges);
    counters(&mut e, m);
    e.finish()
}

/// One family per webhook counter, one sample per webhook (by URL).
fn webhooks(e: &mut Exposition, hooks: &[super::webhook::WebhookFigures], lost: u64) {
    if hooks.is_empty() {
        return;
    }
    use Kind::{Counter, Gauge};
    type Get = fn(&super::webhook::WebhookFigures) -> f64;
    type Row<'a> = (&'a str, Kind, &'a str, &'a [(&'a str, &'a str)], Get);
    let families: [Row; 8] = [
        (
            "zerofan_webhook_posts_total",
            Counter,
            "Webhook batches POSTed, by result (failed: after its retries).",
            &[("result", "ok")],
            |f| f.posts_ok as f64,
        ),
        (
            "zerofan_webhook_posts_total",
            Counter,
            "",
            &[("result", "failed")],
            |f| f.posts_failed as f64,
        ),
        (
            "zerofan_webhook_retries_total",
            Counter,
            "Webhook POSTs repeated after a failure.",
            &[],
            |f| f.retries as f64,
        ),
        (
            "zerofan_webhook_events_sent_total",
            Counter,
            "Events a webhook receiver took.",
            &[],
            |f| f.events_sent as f64,
        ),
        (
            "zerofan_webhook_events_dropped_total",
            Counter,
            "Webhook events dropped: queue full, or their batch failed.",
            &[("reason", "queue_full")],
            |f| f.dropped_queue_full as f64,
        ),
        (
            "zerofan_webhook_events_dropped_total",
            Counter,
            "",
            &[("reason", "send_failed")],
            |f| f.dropped_failed as f64,
        ),
        (
            "zerofan_webhook_circuit_opens_total",
            Counter,
            "Times a webhook's circuit opened (endpoint unreachable).",
            &[],
            |f| f.circuit_opens as f64,
        ),
        (
            "zerofan_webhook_queued",
            Gauge,
            "Events waiting in a webhook's queue.",
            &[],
            |f| f.queued as f64,
        ),
    ];
    for (name, kind, help, labels, get) in families {
        if !help.is_empty() {
            e.family(name, kind, help);
        }
        for f in hooks {
            let mut l: Vec<(&str, &str)> = vec![("webhook", f.url.as_str())];
            l.extend_from_slice(labels);
            e.sample(name, &l, get(f));
        }
    }
    e.single(
        "zerofan_webhook_events_lost_total",
        Counter,
        "Events lost before any webhook queue (the core's event buffer was full).",
        lost as f64,
    );
}

/// Every core counter as `core::metrics` declares it: one family per run
/// of counters that share it.
fn counters(e: &mut Exposition, m: &Metrics) {
    let mut current = None;
    m.each(&mut |def, values| {
        let Some((family, label)) = def.prom else {
            return;
        };
        if current != Some(family.name) {
            e.family(family.name, Kind::Counter, family.help);
            current = Some(family.name);
        }
        match label {
            Label::None => {
                for v in values {
                    e.sample(family.name, &[], *v as f64);
                }
            }
            Label::One(k, l) => {
                for v in values {
                    e.sample(family.name, &[(k, l)], *v as f64);
                }
            }
            Label::Qos => {
                for (q, v) in QOS.iter().zip(values) {
                    e.sample(family.name, &[("qos", q)], *v as f64);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(format_value(3.0), "3");
        assert_eq!(format_value(0.25), "0.25");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(0.0001), "0.0001");
    }

    /// A counter is declared once (`core::metrics::counters!`) and shows
    /// on the page and in `$SYS` from that alone; the derived totals add
    /// exactly the counters declared to count in them.
    #[test]
    fn every_declared_counter_is_on_the_page_and_in_sys() {
        let mut s = Snapshot::default();
        s.metrics.dropped_expired = 2;
        s.metrics.dropped_qos0_queue_full = 3;
        s.metrics.security.refused_sys_publish = 5;
        s.metrics.security.acl_denied_delivery = 7;
        s.metrics.security.auth_success = 100;
        let text = render(&s);
        let sys = crate::core::sys_figures(&s.metrics, &s.shell, 0, 0, 0, 0);
        let mut counters = 0;
        s.metrics.each(&mut |def, values| {
            counters += 1;
            assert!(
                def.sys.is_some() || def.prom.is_some(),
                "{def:?} shows nowhere"
            );
            if let Some(name) = def.sys {
                let value = values[0].to_string();
                assert!(sys.iter().any(|(k, v)| *k == name && *v == value), "{name}");
            }
            if let Some((family, label)) = def.prom {
                let sample = match label {
                    Label::None => format!("{} {}\n", family.name, values[0]),
                    Label::One(k, v) => format!("{}{{{k}=\"{v}\"}} {}\n", family.name, values[0]),
                    Label::Qos => format!("{}{{qos=\"2\"}} {}\n", family.name, values[2]),
                };
                assert!(text.contains(&sample), "{sample}");
            }
        });
        assert!(counters >= 40, "{counters}");
        assert_eq!(s.metrics.dropped_total(), 5);
        assert_eq!(s.metrics.security.refusals_total(), 12);
        assert!(sys.contains(&("messages/dropped", "5".to_string())));
    }

    /// What a node keeps for others' persistent sessions shows in both.
    #[test]
    fn replica_figures_are_on_the_page_and_in_sys() {
        let mut s = Snapshot::default();
        s.shell.cluster_members = 3;
        s.shell.cluster_replica_images = 4;
        s.shell.cluster_replica_bytes = 1234;
        let text = render(&s);
        assert!(
            text.contains("zerofan_cluster_replica_images 4\n"),
            "{text}"
        );
        assert!(text.contains("zerofan_cluster_replica_bytes 1234\n"));
        let sys = crate::core::sys_figures(&s.metrics, &s.shell, 0, 0, 0, 0);
        assert!(sys.contains(&("cluster/replica_images", "4".to_string())));
        assert!(sys.contains(&("cluster/replica_bytes", "1234".to_string())));
    }

    #[test]
    fn labels_and_help_are_escaped() {
        let mut e = Exposition::default();
        e.family("x_total", Kind::Counter, "a \\ b\nc");
        e.sample(
            "x_total",
            &[("listener", "a\"b\\c\nd"), ("kind", "mqtt")],
            2.0,
        );
        assert_eq!(
            e.finish(),
            "# HELP x_total a \\\\ b\\nc\n# TYPE x_total counter\nx_total{listener=\"a\\\"b\\\\c\\nd\",kind=\"mqtt\"} 2\n"
        );
    }

    /// Every family has HELP then TYPE before its samples, every sample
    /// belongs to the family declared last, counters end in `_total`, no
    /// family is declared twice, and every line parses.
    #[test]
    fn page_is_well_formed() {
        let mut s = Snapshot::default();
        s.metrics.messages_received_by_qos = [1, 2, 3];
        s.shards = vec![(3, 2), (1, 1)];
        s.gauges.sessions_online = 4;
        s.store.fsync.observe(std::time::Duration::from_micros(300));
        s.store.fsync.observe(std::time::Duration::from_secs(9));
        s.listeners.push(ListenerFigures {
            addr: "127.0.0.1:1883".into(),
            kind: "mqtt".into(),
            open: 1,
            opened: 2,
        });
        let text = render(&s);
        let mut declared = std::collections::HashSet::new();
        let mut current: Option<(String, String)> = None;
        let mut pending_help: Option<String> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(declared.insert(name.clone()), "{name} declared twice");
                pending_help = Some(name);
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                let name = it.next().unwrap().to_string();
                let kind = it.next().unwrap().to_string();
                assert_eq!(
                    pending_help.take().as_deref(),
                    Some(name.as_str()),
                    "{line}"
                );
                if kind == "counter" {
                    assert!(name.ends_with("_total"), "{name}");
                } else {
                    assert!(!name.ends_with("_total"), "{name}");
                }
                current = Some((name, kind));
            } else {
                let (family, kind) = current.clone().expect("sample before any TYPE");
                let name_end = line.find(['{', ' ']).unwrap();
                let name = &line[..name_end];
                let ok = name == family
                    || (kind == "histogram"
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|s| name == format!("{family}{s}")));
                assert!(ok, "{line} outside its family {family}");
                let value = line.rsplit(' ').next().unwrap();
                assert!(
                    value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
                    "{line}"
                );
            }
        }
        assert!(text.contains("zerofan_messages_received_total{qos=\"2\"} 3\n"));
        assert!(text.contains("zerofan_sessions{state=\"online\"} 4\n"));
        assert!(text.contains("zerofan_store_fsync_seconds_bucket{le=\"0.0005\"} 1\n"));
        assert!(text.contains("zerofan_store_fsync_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("zerofan_store_fsync_seconds_count 2\n"));
        assert!(text.contains(
            "zerofan_listener_connections_opened_total{listener=\"127.0.0.1:1883\",kind=\"mqtt\"} 2\n"
        ));
    }
}

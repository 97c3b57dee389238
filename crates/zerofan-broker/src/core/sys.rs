//! The `$SYS/` tree's figures: what the broker publishes as retained
//! messages every `sys_interval` seconds (`broker.rs`'s time section), and
//! what an embedding reports under the same names.

use super::metrics::{Metrics, ShellStats};

/// Every `$SYS/broker/` figure as (name under `$SYS/broker/`, value): what
/// the broker publishes, and what an embedding (the Node.js package's
/// `stats().sys`) reports under the same names.
pub fn sys_figures(
    m: &Metrics,
    st: &ShellStats,
    uptime_secs: u64,
    connected: usize,
    total: usize,
    retained: usize,
) -> Vec<(&'static str, String)> {
    let mut figures: Vec<(&'static str, String)> = vec![
        ("version", format!("zerofan {}", env!("CARGO_PKG_VERSION"))),
        ("uptime", uptime_secs.to_string()),
        ("clients/connected", connected.to_string()),
        ("clients/total", total.to_string()),
        (
            "clients/disconnected",
            total.saturating_sub(connected).to_string(),
        ),
        ("messages/dropped", m.dropped_total().to_string()),
        ("messages/retained/count", retained.to_string()),
        ("load/bytes/received", st.bytes_received.to_string()),
        ("load/bytes/sent", st.bytes_sent.to_string()),
        ("bytes/received", st.bytes_received.to_string()),
        ("bytes/sent", st.bytes_sent.to_string()),
        ("pool/gets", st.pool_gets.to_string()),
        ("pool/hits", st.pool_hits.to_string()),
        ("pool/misses", st.pool_misses.to_string()),
        ("pool/returns", st.pool_returns.to_string()),
        ("pool/discards", st.pool_discards.to_string()),
        ("pool/bytes_retained", st.pool_bytes_retained.to_string()),
        (
            "pool/bytes_outstanding",
            st.pool_bytes_outstanding.to_string(),
        ),
        ("pool/hit_rate", format!("{:.4}", st.pool_hit_rate)),
        ("clients/parked", st.connections_parked.to_string()),
        ("clients/parks", st.connection_parks.to_string()),
    ];
    if st.cluster_members > 0 {
        figures.extend([
            ("cluster/members", st.cluster_members.to_string()),
            (
                "cluster/leader_changes",
                st.cluster_leader_changes.to_string(),
            ),
            (
                "cluster/replication_lag",
                st.cluster_replication_lag.to_string(),
            ),
            ("cluster/claims", st.cluster_claims.to_string()),
            ("cluster/tls_refused", st.cluster_tls_refused.to_string()),
            (
                "cluster/lease_expiries",
                st.cluster_lease_expiries.to_string(),
            ),
            ("cluster/lost_handed", st.cluster_lost_handed.to_string()),
            (
                "cluster/replica_images",
                st.cluster_replica_images.to_string(),
            ),
            (
                "cluster/replica_bytes",
                st.cluster_replica_bytes.to_string(),
            ),
            (
                "cluster/forwarded/messages",
                st.cluster_forwarded_messages.to_string(),
            ),
            (
                "cluster/forwarded/bytes",
                st.cluster_forwarded_bytes.to_string(),
            ),
        ]);
    }
    // Every counter that has a `$SYS` name (see `metrics::counters!`).
    m.each(&mut |def, values| {
        if let (Some(name), [value]) = (def.sys, values) {
            figures.push((name, value.to_string()));
        }
    });
    figures
}

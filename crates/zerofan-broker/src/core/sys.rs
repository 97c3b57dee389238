//! The `$SYS/` tree: broker figures published as retained messages every
//! `sys_interval` seconds.

use super::broker::Broker;
use super::message::Message;
use super::metrics::{Metrics, ShellStats};
use bytes::Bytes;
use std::rc::Rc;
use std::time::Instant;
use zerofan_codec::{MqttStr, QoS};

impl Broker {
    /// Publish every `$SYS/` figure now.
    pub(crate) fn publish_sys(&mut self, now: Instant) {
        let m = &self.metrics;
        let st = &self.shell_stats;
        let uptime = now.saturating_duration_since(self.started).as_secs();
        let connected = self
            .conns
            .values()
            .filter(|c| c.session().is_some())
            .count();
        let figures = sys_figures(
            m,
            st,
            uptime,
            connected,
            self.sessions.len(),
            self.store.len(),
        );
        for (name, value) in figures {
            let Ok(topic) = MqttStr::try_from(format!("$SYS/broker/{name}")) else {
                continue;
            };
            let msg = Message {
                topic,
                payload: Bytes::from(value),
                qos: QoS::AtMostOnce,
                retain: true,
                properties: Default::default(),
                origin: None,
                expires_at: None,
                owns_bytes: true,
                stored: Default::default(),
                wire: None,
            };
            self.route_sys(now, Rc::new(msg));
        }
    }

    /// `$SYS/` messages already own their small bytes: store them as they
    /// are (no compaction copy), then route a non-retained twin so the store
    /// is not written twice.
    fn route_sys(&mut self, now: Instant, msg: Rc<Message>) {
        self.store.set(msg.clone());
        let live = Message {
            topic: msg.topic.clone(),
            payload: msg.payload.clone(),
            qos: msg.qos,
            retain: false,
            properties: Default::default(),
            origin: None,
            expires_at: None,
            owns_bytes: true,
            stored: Default::default(),
            wire: None,
        };
        self.route(now, Rc::new(live));
    }
}

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
        ("clients/connections", m.connections_opened.to_string()),
        ("messages/received", m.messages_received.to_string()),
        ("messages/sent", m.messages_sent.to_string()),
        ("messages/dropped", m.dropped_total().to_string()),
        (
            "messages/dropped/qos0_queue_full",
            m.dropped_qos0_queue_full.to_string(),
        ),
        (
            "messages/dropped/queue_full",
            m.dropped_queue_full.to_string(),
        ),
        ("messages/dropped/expired", m.dropped_expired.to_string()),
        (
            "messages/dropped/too_large",
            m.dropped_too_large.to_string(),
        ),
        ("messages/retained/count", retained.to_string()),
        ("messages/compactions", m.compactions.to_string()),
        ("load/bytes/received", st.bytes_received.to_string()),
        ("load/bytes/sent", st.bytes_sent.to_string()),
        ("bytes/received", st.bytes_received.to_string()),
        ("bytes/sent", st.bytes_sent.to_string()),
        (
            "payload/bytes/received",
            m.payload_bytes_received.to_string(),
        ),
        ("payload/bytes/sent", m.payload_bytes_sent.to_string()),
        ("errors/malformed", m.malformed_packets.to_string()),
        ("errors/protocol", m.protocol_errors.to_string()),
        (
            "errors/keepalive_timeouts",
            m.keep_alive_timeouts.to_string(),
        ),
        (
            "errors/slow_consumer_disconnects",
            m.slow_consumer_disconnects.to_string(),
        ),
        ("sessions/expired", m.sessions_expired.to_string()),
        ("sessions/takeovers", m.takeovers.to_string()),
        (
            "sessions/takeover_drain_timeouts",
            m.takeover_drain_timeouts.to_string(),
        ),
        ("wills/published", m.wills_published.to_string()),
        ("store/torn_tails", m.store_torn_tails.to_string()),
        ("store/truncated_bytes", m.store_truncated_bytes.to_string()),
        ("store/errors", m.store_errors.to_string()),
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
    figures.extend(m.security.sys_figures());
    figures
}

//! Broker counters, published under `$SYS/` and readable by tests.

/// Counters the core keeps. Every dropped message has a counter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Connections ever opened.
    pub connections_opened: u64,
    /// CONNECTs accepted.
    pub clients_connected_total: u64,
    /// PUBLISH packets received from clients.
    pub messages_received: u64,
    /// PUBLISH packets sent to clients.
    pub messages_sent: u64,
    /// Payload bytes received in PUBLISH packets.
    pub payload_bytes_received: u64,
    /// Payload bytes sent in PUBLISH packets.
    pub payload_bytes_sent: u64,
    /// PUBLISH packets received, by QoS (index 0, 1, 2).
    pub messages_received_by_qos: [u64; 3],
    /// PUBLISH packets sent, by QoS (index 0, 1, 2; resends included).
    pub messages_sent_by_qos: [u64; 3],
    /// Payload bytes received, by QoS.
    pub payload_bytes_received_by_qos: [u64; 3],
    /// Payload bytes sent, by QoS (resends not counted, as in `payload_bytes_sent`).
    pub payload_bytes_sent_by_qos: [u64; 3],
    /// QoS 0 messages dropped because a session queue was full.
    pub dropped_qos0_queue_full: u64,
    /// QoS 1/2 messages dropped because a session queue was full.
    pub dropped_queue_full: u64,
    /// Messages dropped because they expired before delivery.
    pub dropped_expired: u64,
    /// Messages dropped because they exceed the client's Maximum Packet Size.
    pub dropped_too_large: u64,
    /// Clients disconnected because their queue was full (`queue_full = "disconnect"`).
    pub slow_consumer_disconnects: u64,
    /// Malformed packets received.
    pub malformed_packets: u64,
    /// Protocol violations (connections closed by the broker for them).
    pub protocol_errors: u64,
    /// Keep alive timeouts.
    pub keep_alive_timeouts: u64,
    /// Connections that never sent CONNECT in time.
    pub connect_timeouts: u64,
    /// Sessions taken over by a new connection with the same client id.
    pub takeovers: u64,
    /// Takeovers completed by their deadline because the old connection's
    /// input was not drained in time (it did not read, its outbox was full).
    pub takeover_drain_timeouts: u64,
    /// Sessions removed because their expiry interval passed.
    pub sessions_expired: u64,
    /// Wills published.
    pub wills_published: u64,
    /// Messages copied out of their read buffer before being kept for long
    /// (retained, offline queues), so they do not pin a large buffer.
    pub compactions: u64,
    /// Durable store operations or commits that failed.
    pub store_errors: u64,
    /// Store records skipped at restart because they could not be restored.
    pub store_restore_skipped: u64,
    /// Torn or corrupt log tails cut back at startup (0 or 1 per start).
    pub store_torn_tails: u64,
    /// Bytes cut off the log at startup.
    pub store_truncated_bytes: u64,
    /// Refusals by authentication, access control and limits.
    pub security: super::limits::SecurityMetrics,
}

impl Metrics {
    /// Every message dropped for any reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped_qos0_queue_full
            + self.dropped_queue_full
            + self.dropped_expired
            + self.dropped_too_large
    }
}

/// Figures only the shell knows (bytes on sockets, pool), handed to the core
/// for `$SYS/`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShellStats {
    /// Bytes read from sockets.
    pub bytes_received: u64,
    /// Bytes written to sockets.
    pub bytes_sent: u64,
    /// Pool: buffer requests.
    pub pool_gets: u64,
    /// Pool: requests served from the pool.
    pub pool_hits: u64,
    /// Pool: requests that allocated.
    pub pool_misses: u64,
    /// Pool: buffers returned.
    pub pool_returns: u64,
    /// Pool: buffers freed instead of kept.
    pub pool_discards: u64,
    /// Pool: bytes held for reuse.
    pub pool_bytes_retained: u64,
    /// Pool: bytes handed out and not yet back.
    pub pool_bytes_outstanding: u64,
    /// Pool: hits / gets.
    pub pool_hit_rate: f64,
    /// Connections parked now (quiet, no task of their own).
    pub connections_parked: u64,
    /// Times a connection was parked since start.
    pub connection_parks: u64,
}

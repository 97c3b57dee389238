//! Counters that tell what the client did, for tests, metrics and debugging
//! reconnect behaviour.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of the client's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Successful connections (CONNACK accepted), the first one included.
    pub connects: u64,
    /// Connections lost (socket error, keep-alive timeout, server DISCONNECT).
    pub connection_losses: u64,
    /// Connections where the broker still had the session (Session Present).
    pub sessions_resumed: u64,
    /// PUBLISH packets resent with DUP after a reconnect.
    pub publishes_resent: u64,
    /// PUBREL packets resent after a reconnect.
    pub pubrels_resent: u64,
    /// Subscriptions sent again because the broker had lost the session.
    pub resubscribed: u64,
    /// PUBLISH packets sent (first sends, not resends).
    pub publishes_sent: u64,
    /// Messages received and queued for the application.
    pub messages_received: u64,
    /// Bytes written to the transport.
    pub bytes_out: u64,
    /// Bytes read from the transport.
    pub bytes_in: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub connects: AtomicU64,
    pub connection_losses: AtomicU64,
    pub sessions_resumed: AtomicU64,
    pub publishes_resent: AtomicU64,
    pub pubrels_resent: AtomicU64,
    pub resubscribed: AtomicU64,
    pub publishes_sent: AtomicU64,
    pub messages_received: AtomicU64,
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
}

impl Stats {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub fn snapshot(&self) -> ClientStats {
        ClientStats {
            connects: self.connects.load(Relaxed),
            connection_losses: self.connection_losses.load(Relaxed),
            sessions_resumed: self.sessions_resumed.load(Relaxed),
            publishes_resent: self.publishes_resent.load(Relaxed),
            pubrels_resent: self.pubrels_resent.load(Relaxed),
            resubscribed: self.resubscribed.load(Relaxed),
            publishes_sent: self.publishes_sent.load(Relaxed),
            messages_received: self.messages_received.load(Relaxed),
            bytes_out: self.bytes_out.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
        }
    }
}

impl Stats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Relaxed)
    }
}

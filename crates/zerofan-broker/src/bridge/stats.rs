//! A bridge's figures: kept by its tasks (one thread, so plain cells),
//! read for `/metrics` and `$SYS/broker/bridge/NAME/...`.

use crate::shell::prometheus::{Exposition, Kind};
use std::cell::Cell;

/// Live counters of one bridge.
#[derive(Debug, Default)]
pub struct BridgeStats {
    /// The bridge's name.
    pub name: String,
    /// Connected to the remote broker now.
    pub connected: Cell<bool>,
    /// Connections to the remote broker made.
    pub connects: Cell<u64>,
    /// First connection attempts that failed (later ones are the client's).
    pub connect_failures: Cell<u64>,
    messages_out: Cell<u64>,
    bytes_out: Cell<u64>,
    messages_in: Cell<u64>,
    bytes_in: Cell<u64>,
    dropped_out: Cell<u64>,
    dropped_in: Cell<u64>,
    queued_out: Cell<usize>,
    queued_in: Cell<usize>,
    /// Full-queue waits on its links into this broker.
    pub link_waits: crate::bridge::link::LinkWaits,
}

/// A copy of [`BridgeStats`] at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BridgeFigures {
    /// The bridge's name.
    pub name: String,
    /// Connected to the remote broker.
    pub connected: bool,
    /// Connections made.
    pub connects: u64,
    /// Messages handed to the remote broker's connection.
    pub messages_out: u64,
    /// Their payload bytes.
    pub bytes_out: u64,
    /// Messages handed to this broker.
    pub messages_in: u64,
    /// Their payload bytes.
    pub bytes_in: u64,
    /// Messages towards the remote broker that were lost: refused there,
    /// too large, or matching no `topic` line.
    pub dropped_out: u64,
    /// The same towards this broker.
    pub dropped_in: u64,
    /// QoS 1/2 messages sent to the remote broker and not acknowledged yet.
    pub queued_out: usize,
    /// The same towards this broker.
    pub queued_in: usize,
    /// Times this broker waited for the bridge to take its output (the
    /// link's queue towards the bridge was full).
    pub link_waits_out: u64,
    /// Times the bridge waited to hand this broker a message.
    pub link_waits_in: u64,
}

impl BridgeStats {
    /// Counters for bridge `name`, all zero.
    pub fn new(name: &str) -> Self {
        BridgeStats {
            name: name.to_string(),
            ..BridgeStats::default()
        }
    }

    pub(super) fn sent(&self, out: bool, bytes: u64) {
        let (m, b) = if out {
            (&self.messages_out, &self.bytes_out)
        } else {
            (&self.messages_in, &self.bytes_in)
        };
        m.set(m.get() + 1);
        b.set(b.get() + bytes);
    }

    pub(super) fn dropped(&self, out: bool) {
        let d = if out {
            &self.dropped_out
        } else {
            &self.dropped_in
        };
        d.set(d.get() + 1);
    }

    pub(super) fn set_queued(&self, out: bool, n: usize) {
        if out {
            self.queued_out.set(n)
        } else {
            self.queued_in.set(n)
        }
    }

    /// The figures now.
    pub fn figures(&self) -> BridgeFigures {
        BridgeFigures {
            name: self.name.clone(),
            connected: self.connected.get(),
            connects: self.connects.get(),
            messages_out: self.messages_out.get(),
            bytes_out: self.bytes_out.get(),
            messages_in: self.messages_in.get(),
            bytes_in: self.bytes_in.get(),
            dropped_out: self.dropped_out.get(),
            dropped_in: self.dropped_in.get(),
            queued_out: self.queued_out.get(),
            queued_in: self.queued_in.get(),
            link_waits_out: self.link_waits.from_broker.get(),
            link_waits_in: self.link_waits.to_broker.get(),
        }
    }
}

impl BridgeFigures {
    /// `(name under $SYS/broker/bridge/NAME/, value)`.
    pub fn sys(&self) -> Vec<(&'static str, String)> {
        vec![
            ("connected", u8::from(self.connected).to_string()),
            ("connects", self.connects.to_string()),
            ("messages/sent", self.messages_out.to_string()),
            ("bytes/sent", self.bytes_out.to_string()),
            ("messages/received", self.messages_in.to_string()),
            ("bytes/received", self.bytes_in.to_string()),
            ("messages/dropped/sent", self.dropped_out.to_string()),
            ("messages/dropped/received", self.dropped_in.to_string()),
            ("queue/sent", self.queued_out.to_string()),
            ("queue/received", self.queued_in.to_string()),
            ("link/waits/sent", self.link_waits_out.to_string()),
            ("link/waits/received", self.link_waits_in.to_string()),
        ]
    }
}

/// The bridges' `/metrics` families (nothing without bridges).
pub fn render(e: &mut Exposition, bridges: &[BridgeFigures]) {
    if bridges.is_empty() {
        return;
    }
    type Values = fn(&BridgeFigures) -> [(&'static str, f64); 2];
    let families: [(&str, Kind, &str, Values); 6] = [
        ("zerofan_bridge_connected", Kind::Gauge, "1 while the bridge is connected to its remote broker.",
            |b| [("", f64::from(u8::from(b.connected))), ("", f64::NAN)]),
        ("zerofan_bridge_messages_total", Kind::Counter, "Messages across the bridge, by direction (out: to the remote broker).",
            |b| [("out", b.messages_out as f64), ("in", b.messages_in as f64)]),
        ("zerofan_bridge_bytes_total", Kind::Counter, "Payload bytes across the bridge, by direction.",
            |b| [("out", b.bytes_out as f64), ("in", b.bytes_in as f64)]),
        ("zerofan_bridge_dropped_total", Kind::Counter, "Messages the bridge lost (refused by the other side, too large, matching no topic line), by direction.",
            |b| [("out", b.dropped_out as f64), ("in", b.dropped_in as f64)]),
        ("zerofan_bridge_queued", Kind::Gauge, "QoS 1/2 messages the bridge sent and the other side has not acknowledged yet, by direction.",
            |b| [("out", b.queued_out as f64), ("in", b.queued_in as f64)]),
        ("zerofan_bridge_link_waits_total", Kind::Counter, "Times a bounded queue between the bridge and this broker was full and its writer waited (out: this broker's output to the bridge; in: the bridge's messages to this broker).",
            |b| [("out", b.link_waits_out as f64), ("in", b.link_waits_in as f64)]),
    ];
    for (name, kind, help, values) in families {
        e.family(name, kind, help);
        for b in bridges {
            for (dir, v) in values(b) {
                if v.is_nan() {
                    continue;
                }
                if dir.is_empty() {
                    e.sample(name, &[("bridge", &b.name)], v);
                } else {
                    e.sample(name, &[("bridge", &b.name), ("direction", dir)], v);
                }
            }
        }
    }
    e.family(
        "zerofan_bridge_connects_total",
        Kind::Counter,
        "Connections the bridge made to its remote broker.",
    );
    for b in bridges {
        e.sample(
            "zerofan_bridge_connects_total",
            &[("bridge", &b.name)],
            b.connects as f64,
        );
    }
}

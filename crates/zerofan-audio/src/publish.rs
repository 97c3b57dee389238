//! Streaming packets to an MQTT topic with zerofan-client.
//!
//! A [`Publisher`] is a tokio task with a bounded queue in front of it. The
//! capture's sink (which runs on the capture thread and must not wait on
//! the network) [`offer`](Publisher::offer)s each packet: a full queue
//! drops the packet and counts it, so a slow broker never backs up into
//! the audio callback. The task publishes each packet as one MQTT message,
//! [`header`](crate::header) then samples, in one of two ways:
//!
//! - [`PublishMode::Expert`] (default): `Client::publish_with` writes header
//!   and samples straight into the outgoing frame (one copy, into the frame
//!   the socket write takes), and the pooled buffer goes back to the pool
//!   at once;
//! - [`PublishMode::ZeroCopy`]: the pooled buffer itself, already laid out
//!   as header + samples, becomes the payload `Bytes` (no copy, one small
//!   allocation for the `Bytes` owner), and returns to the pool when the
//!   client has written it. Use it (or offer `Bytes` directly) when the
//!   same packet also goes elsewhere, e.g. to JavaScript.
//!
//! The broker fans the one message out to every subscriber without copies.
//! At QoS 1 and 2 the task keeps up to [`PublishConfig::ack_window`]
//! acknowledgements outstanding before it waits for the oldest.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::{BufMut, Bytes};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zerofan_client::{Client, ClientError, Delivery, QoS};

use crate::capture::{Capture, CaptureEvent};
use crate::error::AudioError;
use crate::format::{CaptureConfig, PacketInfo};
use crate::header::{decode_header, HeaderError};
use crate::packetizer::Packet;

/// How packets are written into MQTT messages (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PublishMode {
    /// Header and samples written into the outgoing frame by
    /// `Client::publish_with`.
    #[default]
    Expert,
    /// The pooled buffer sent as the payload `Bytes`, without a copy.
    ZeroCopy,
}

/// Settings of a [`Publisher`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishConfig {
    /// QoS of every message. Default: at most once (live audio: a late
    /// packet is worth less than the next one).
    pub qos: QoS,
    /// How packets go into messages.
    pub mode: PublishMode,
    /// Packets that may wait for the publishing task; beyond, offers are
    /// refused and counted as drops. Default 256 (2.56 s of 10 ms packets).
    pub queue: usize,
    /// QoS 1/2 acknowledgements awaited at once. Default 64.
    pub ack_window: usize,
}

impl Default for PublishConfig {
    fn default() -> Self {
        PublishConfig {
            qos: QoS::AtMostOnce,
            mode: PublishMode::Expert,
            queue: 256,
            ack_window: 64,
        }
    }
}

/// What a [`Publisher`] is given: a packet (published per
/// [`PublishMode`]) or a finished wire message (header + samples, from
/// [`Packet::into_wire_bytes`]), published as it is.
#[derive(Debug)]
pub enum Outgoing {
    /// A captured packet.
    Packet(Packet),
    /// A wire message, shared without copying.
    Wire(Bytes),
}

impl From<Packet> for Outgoing {
    fn from(p: Packet) -> Self {
        Outgoing::Packet(p)
    }
}

impl From<Bytes> for Outgoing {
    fn from(b: Bytes) -> Self {
        Outgoing::Wire(b)
    }
}

/// Counters of a [`Publisher`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublishStats {
    /// Packets offered.
    pub offered: u64,
    /// Refused at the queue (full or publisher gone).
    pub dropped: u64,
    /// Handed to the MQTT client.
    pub published: u64,
    /// Acknowledged (QoS 1/2) or written (QoS 0) as far as awaited.
    pub acked: u64,
    /// Failed in the client (connection closed, refused by the broker).
    pub failed: u64,
}

#[derive(Debug, Default)]
struct PubCounters {
    offered: AtomicU64,
    dropped: AtomicU64,
    published: AtomicU64,
    acked: AtomicU64,
    failed: AtomicU64,
}

impl PubCounters {
    fn snapshot(&self) -> PublishStats {
        PublishStats {
            offered: self.offered.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            published: self.published.load(Relaxed),
            acked: self.acked.load(Relaxed),
            failed: self.failed.load(Relaxed),
        }
    }
}

/// The sending side of a publishing task. Cheap to clone; the task ends
/// when every clone is dropped (or [`close`](Self::close)d) and the queue
/// is drained, or when the client closes.
#[derive(Clone, Debug)]
pub struct Publisher {
    tx: mpsc::Sender<Outgoing>,
    counters: Arc<PubCounters>,
}

impl Publisher {
    /// Spawns the publishing task on the current tokio runtime (panics
    /// outside one, as `tokio::spawn` does; see [`spawn_on`](Self::spawn_on)).
    /// The handle resolves to the final counters.
    pub fn spawn(
        client: Client,
        topic: impl Into<String>,
        config: PublishConfig,
    ) -> (Publisher, JoinHandle<PublishStats>) {
        Publisher::spawn_on(&tokio::runtime::Handle::current(), client, topic, config)
    }

    /// Spawns the publishing task on `runtime` (callable from any thread,
    /// e.g. a Node binding's own runtime).
    pub fn spawn_on(
        runtime: &tokio::runtime::Handle,
        client: Client,
        topic: impl Into<String>,
        config: PublishConfig,
    ) -> (Publisher, JoinHandle<PublishStats>) {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let counters = Arc::new(PubCounters::default());
        let task = runtime.spawn(run(client, topic.into(), config, rx, counters.clone()));
        (Publisher { tx, counters }, task)
    }

    /// Queues `item` without waiting. `false` (and a counted drop) when the
    /// queue is full or the task has ended. Callable from any thread.
    pub fn offer(&self, item: impl Into<Outgoing>) -> bool {
        self.counters.offered.fetch_add(1, Relaxed);
        let ok = self.tx.try_send(item.into()).is_ok();
        if !ok {
            self.counters.dropped.fetch_add(1, Relaxed);
        }
        ok
    }

    /// Counters so far.
    pub fn stats(&self) -> PublishStats {
        self.counters.snapshot()
    }

    /// Drops this handle: once every clone is gone the task publishes what
    /// is queued, awaits outstanding acknowledgements and ends.
    pub fn close(self) {}
}

async fn run(
    client: Client,
    topic: String,
    config: PublishConfig,
    mut rx: mpsc::Receiver<Outgoing>,
    counters: Arc<PubCounters>,
) -> PublishStats {
    let mut pending: VecDeque<Delivery> = VecDeque::new();
    let window = config.ack_window.max(1);
    while let Some(item) = rx.recv().await {
        let sent = match item {
            Outgoing::Packet(p) if config.mode == PublishMode::Expert => {
                let wire = p.wire();
                client
                    .publish_with(&topic, config.qos, |buf| {
                        buf.reserve(wire.len());
                        buf.put_slice(wire);
                    })
                    .await
                // `p` drops here: its buffer is back in the pool.
            }
            Outgoing::Packet(p) => {
                client
                    .publish(&topic, config.qos, p.into_wire_bytes())
                    .await
            }
            Outgoing::Wire(b) => client.publish(&topic, config.qos, b).await,
        };
        match sent {
            Ok(delivery) => {
                counters.published.fetch_add(1, Relaxed);
                pending.push_back(delivery);
                if pending.len() >= window {
                    if let Some(d) = pending.pop_front() {
                        settle(d, &counters).await;
                    }
                }
            }
            Err(ClientError::Closed) => {
                counters.failed.fetch_add(1, Relaxed);
                break;
            }
            Err(_) => {
                counters.failed.fetch_add(1, Relaxed);
            }
        }
    }
    for d in pending {
        settle(d, &counters).await;
    }
    counters.snapshot()
}

async fn settle(d: Delivery, counters: &PubCounters) {
    match d.await {
        Ok(ack) if !ack.reason.is_error() => counters.acked.fetch_add(1, Relaxed),
        _ => counters.failed.fetch_add(1, Relaxed),
    };
}

/// Starts a capture whose packets all go to `topic` (nothing else sees
/// them): the capture's sink offers each packet to a [`Publisher`] spawned
/// on the current runtime. Stop the capture, then await the handle for the
/// publisher's final counters. For packets that go both to the topic and
/// elsewhere, write your own sink: freeze each packet
/// ([`Packet::into_wire_bytes`]) and offer a clone of the `Bytes`.
pub fn publish_capture(
    config: CaptureConfig,
    client: Client,
    topic: impl Into<String>,
    publish: PublishConfig,
) -> Result<(Capture, Publisher, JoinHandle<PublishStats>), AudioError> {
    let (publisher, task) = Publisher::spawn(client, topic, publish);
    let p = publisher.clone();
    let mut p = Some(p);
    let capture = Capture::start(config, move |ev| match ev {
        CaptureEvent::Packet(packet) => p.as_ref().is_some_and(|p| p.offer(packet)),
        CaptureEvent::Error(_) => true,
        CaptureEvent::Ended(_) => {
            // Let the task finish once the caller's handles are gone too.
            p = None;
            true
        }
    })?;
    Ok((capture, publisher, task))
}

/// A listener's view of one stream: checks each received message's header
/// and counts gaps (missing `seq`), duplicates and reordering.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqCheck {
    /// The `seq` expected next (`None` before the first packet).
    pub next: Option<u64>,
    /// Packets received.
    pub received: u64,
    /// Packets missing (sum of the gaps).
    pub missing: u64,
    /// Packets with a `seq` below the expected one (duplicates, reordering).
    pub out_of_order: u64,
}

impl SeqCheck {
    /// Checks one received message (header + samples). Returns its info.
    pub fn observe(&mut self, message: &[u8]) -> Result<PacketInfo, HeaderError> {
        let (info, _) = decode_header(message)?;
        self.received += 1;
        match self.next {
            Some(next) if info.seq < next => self.out_of_order += 1,
            Some(next) => {
                self.missing += info.seq - next;
                self.next = Some(info.seq + 1);
            }
            None => self.next = Some(info.seq + 1),
        }
        Ok(info)
    }

    /// No gap and nothing out of order so far.
    pub fn is_clean(&self) -> bool {
        self.missing == 0 && self.out_of_order == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::SampleFormat;
    use crate::header::header_bytes;

    fn msg(seq: u64) -> [u8; 32] {
        header_bytes(
            &PacketInfo {
                seq,
                timestamp_ns: 0,
                sample_rate: 48_000,
                channels: 1,
                format: SampleFormat::I16,
            },
            0,
        )
    }

    #[test]
    fn seq_check_counts_gaps_and_reordering() {
        let mut c = SeqCheck::default();
        for s in [5, 6, 7] {
            c.observe(&msg(s)).expect("valid");
        }
        assert!(c.is_clean());
        c.observe(&msg(10)).expect("valid");
        assert_eq!(c.missing, 2);
        c.observe(&msg(9)).expect("valid");
        assert_eq!(c.out_of_order, 1);
        assert_eq!(c.received, 5);
        assert_eq!(c.next, Some(11));
        assert!(c.observe(b"junk").is_err());
    }
}

//! The data the store keeps, as the broker hands it in and gets it back.
//!
//! These types are deliberately independent of the broker's and the codec's:
//! the store is a byte store with a schema, so it can be tested on its own and
//! its format does not change when an in-memory type does. Strings that end up
//! in an MQTT packet (topics, properties) are `Bytes`, so a recovered message
//! hands them to the broker without a copy; names the broker only looks up
//! (client ids, filters) are `String`s.

use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

/// A commit sequence number: [`crate::Store::commit`] returns one, and the
/// store reports the highest one that is durable. Numbers start at 1 each time
/// the store is opened; 0 means "nothing committed yet", and everything
/// recovered at open is durable already.
pub type Lsn = u64;

/// Identifies one stored message (a payload written once). Queue entries,
/// inflight entries and retained slots reference it; it is garbage once none
/// does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MsgId(pub u64);

/// Identifies one entry of a session's offline queue, so the broker can say
/// which one was sent or dropped (queues lose entries from the middle:
/// expired messages, shared-subscription hand-over, drop-oldest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryId(pub u64);

/// An application message as stored: written once, shared by every queue
/// entry, inflight entry and retained slot that references it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StoredMessage {
    /// Topic name.
    pub topic: Bytes,
    /// Application payload.
    pub payload: Bytes,
    /// QoS the publisher used (0, 1 or 2).
    pub qos: u8,
    /// RETAIN flag the publisher used.
    pub retain: bool,
    /// When the message expires, in milliseconds since the UNIX epoch
    /// (wall-clock, because an `Instant` does not survive a restart).
    pub expires_at_ms: Option<u64>,
    /// The PUBLISH properties that travel with the message.
    pub properties: MessageProperties,
}

/// The MQTT 5 properties that belong to an application message and must be
/// forwarded with it. Per-hop properties (topic alias, subscription
/// identifiers) are not stored; the message expiry is kept as a deadline in
/// [`StoredMessage::expires_at_ms`].
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MessageProperties {
    /// Payload Format Indicator.
    pub payload_format_indicator: Option<u8>,
    /// Content Type.
    pub content_type: Option<Bytes>,
    /// Response Topic.
    pub response_topic: Option<Bytes>,
    /// Correlation Data.
    pub correlation_data: Option<Bytes>,
    /// User Properties, in order.
    pub user_properties: Vec<(Bytes, Bytes)>,
}

/// Subscription options as the session remembers them (MQTT 5 §3.8.3.1),
/// stored as the one options byte of the SUBSCRIBE packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SubOptions {
    /// Maximum QoS (0..=2).
    pub qos: u8,
    /// No Local.
    pub no_local: bool,
    /// Retain As Published.
    pub retain_as_published: bool,
    /// Retain Handling (0..=2).
    pub retain_handling: u8,
}

impl SubOptions {
    /// The options byte as in SUBSCRIBE.
    pub fn to_byte(self) -> u8 {
        (self.qos & 3)
            | (u8::from(self.no_local) << 2)
            | (u8::from(self.retain_as_published) << 3)
            | ((self.retain_handling & 3) << 4)
    }

    /// The options from their byte.
    pub fn from_byte(b: u8) -> Self {
        SubOptions {
            qos: b & 3,
            no_local: b & 4 != 0,
            retain_as_published: b & 8 != 0,
            retain_handling: (b >> 4) & 3,
        }
    }
}

/// One message waiting in a session's queue, with its per-subscriber options.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct QueueEntry {
    /// The stored message.
    pub msg: MsgId,
    /// QoS of this delivery (already downgraded to the subscription's).
    pub qos: u8,
    /// RETAIN flag to send.
    pub retain: bool,
    /// Matching subscription identifiers.
    pub subscription_ids: Vec<u32>,
    /// The shared subscription (full `$share/...` filter) it came through.
    pub share: Option<String>,
}

/// What the store keeps about a session besides its collections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SessionMeta {
    /// Session Expiry Interval in seconds (`u32::MAX`: never).
    pub expiry_interval: u32,
    /// When the (absent) session expires, milliseconds since the UNIX epoch;
    /// `None` while a client is connected.
    pub expires_at_ms: Option<u64>,
}

/// A will waiting out its delay (or its session's end), or, armed, the
/// will of a client still connected.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StoredWill {
    /// The will message. Its `expires_at_ms` is not used: a will's expiry
    /// starts when it is published, see `message_expiry_interval`.
    pub message: StoredMessage,
    /// When the will is due, milliseconds since the UNIX epoch (0 when
    /// armed).
    pub due_at_ms: u64,
    /// Armed: its client is still connected (to another node, whose
    /// replica this is), and this is its Will Delay Interval in seconds;
    /// it is due that long after the connection is known to be lost.
    pub armed: Option<u32>,
    /// The will's Message Expiry Interval in seconds, counted from publication.
    pub message_expiry_interval: Option<u32>,
}

/// Where an outbound QoS 1/2 delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InflightPhase {
    /// PUBLISH sent, waiting for PUBACK (QoS 1) or PUBREC (QoS 2): resend the
    /// PUBLISH with DUP on reconnect.
    PublishSent,
    /// PUBREC received, PUBREL sent, waiting for PUBCOMP: resend PUBREL. The
    /// message itself is no longer needed.
    PubrecReceived,
}

/// How often the store calls fsync, and so when a commit counts as durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// Group commit: a dedicated writer thread writes everything committed
    /// meanwhile and fsyncs once; a commit is durable (and reported) only
    /// after that fsync. Survives power loss.
    #[default]
    Always,
    /// A commit is reported durable once written to the operating system
    /// (survives `kill -9`); fsync runs at most this often, so a power loss
    /// can lose up to this much acknowledged data.
    Interval(Duration),
    /// A commit is reported durable once written to the operating system;
    /// the operating system decides when it reaches the disk.
    Never,
}

impl std::str::FromStr for FsyncPolicy {
    type Err = String;

    /// `"always"`, `"never"`, `"interval"` (1000 ms) or `"interval:MS"`, as
    /// configuration files spell it.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "always" => Ok(FsyncPolicy::Always),
            "never" => Ok(FsyncPolicy::Never),
            "interval" => Ok(FsyncPolicy::Interval(Duration::from_millis(1000))),
            other => other
                .strip_prefix("interval:")
                .and_then(|ms| ms.trim().parse::<u64>().ok())
                .filter(|ms| *ms > 0)
                .map(|ms| FsyncPolicy::Interval(Duration::from_millis(ms)))
                .ok_or_else(|| {
                    format!(
                        "unknown fsync policy {s:?}: expected \"always\", \"never\", \"interval\" or \"interval:MS\""
                    )
                }),
        }
    }
}

impl std::fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsyncPolicy::Always => f.write_str("always"),
            FsyncPolicy::Never => f.write_str("never"),
            FsyncPolicy::Interval(d) => write!(f, "interval:{}", d.as_millis()),
        }
    }
}

/// Called by the writer thread with the highest durable [`Lsn`] after each
/// write round. Must be cheap and must not block (for example, store the value
/// and wake a tokio `Notify`).
pub type DurableNotifier = Arc<dyn Fn(Lsn) + Send + Sync>;

/// How to open a store.
#[derive(Clone)]
pub struct Options {
    /// When commits become durable; see [`FsyncPolicy`].
    pub fsync: FsyncPolicy,
    /// Optional callback with each new durable LSN (see [`DurableNotifier`]).
    pub on_durable: Option<DurableNotifier>,
    /// Compact only once the log is at least this large.
    pub compact_min_bytes: u64,
    /// Compact once at least this fraction of the log is garbage.
    pub compact_garbage_ratio: f64,
    /// The time of opening, in UNIX milliseconds (`None`: the clock's):
    /// the first new message and entry ids count from it (see
    /// [`crate::Store::open`]).
    pub opened_ms: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            fsync: FsyncPolicy::Always,
            on_durable: None,
            compact_min_bytes: 64 << 20,
            compact_garbage_ratio: 0.5,
            opened_ms: None,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("fsync", &self.fsync)
            .field("on_durable", &self.on_durable.as_ref().map(|_| "Fn(Lsn)"))
            .field("compact_min_bytes", &self.compact_min_bytes)
            .field("compact_garbage_ratio", &self.compact_garbage_ratio)
            .field("opened_ms", &self.opened_ms)
            .finish()
    }
}

/// Everything the store held when it was opened: what the broker rebuilds
/// its sessions and retained messages from.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Retained messages.
    pub retained: Vec<RecoveredRetained>,
    /// Persistent sessions.
    pub sessions: Vec<RecoveredSession>,
    /// What recovery found and repaired.
    pub report: RecoveryReport,
}

/// One retained message after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredRetained {
    /// Its topic.
    pub topic: String,
    /// The stored message (to reference it again, e.g. when queueing it).
    pub msg: MsgId,
    /// The message; shared with every queue entry of the same [`MsgId`].
    pub message: Arc<StoredMessage>,
}

/// One persistent session after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredSession {
    /// Client identifier.
    pub client_id: String,
    /// Expiry interval and deadline.
    pub meta: SessionMeta,
    /// Subscriptions, sorted by filter.
    pub subscriptions: Vec<RecoveredSubscription>,
    /// The offline queue, oldest first.
    pub queue: Vec<RecoveredEntry>,
    /// Outbound QoS 1/2 deliveries in flight, in send order.
    pub inflight: Vec<RecoveredInflight>,
    /// Inbound QoS 2 packet ids awaiting PUBREL, ascending.
    pub incoming_qos2: Vec<u16>,
    /// The will waiting out its delay, if any.
    pub will: Option<StoredWill>,
    /// The epoch last recorded with [`crate::Store::set_epoch`] (0: none).
    pub epoch: u64,
    /// The version recorded with it ([`crate::Store::set_epoch_at`]; 0:
    /// none).
    pub version: u64,
}

/// One subscription after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredSubscription {
    /// Topic filter (including `$share/...`).
    pub filter: String,
    /// Options.
    pub options: SubOptions,
    /// Subscription identifier.
    pub id: Option<u32>,
}

/// One queue entry after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredEntry {
    /// Its id, for later [`crate::Store::send`] / [`crate::Store::dequeue`].
    pub id: EntryId,
    /// The entry.
    pub entry: QueueEntry,
    /// The message: one allocation shared by every entry of the same message.
    pub message: Arc<StoredMessage>,
}

/// One inflight delivery after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredInflight {
    /// Packet identifier it was sent with.
    pub packet_id: u16,
    /// Where it stands.
    pub phase: InflightPhase,
    /// What was sent (`None` once PUBREC arrived: only PUBREL is resent).
    pub entry: Option<RecoveredEntry>,
}

/// What recovery found: kept so the broker can log and count it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Valid records replayed.
    pub records: u64,
    /// Bytes of torn or corrupt tail cut off (0 when the log was clean).
    pub truncated_bytes: u64,
    /// Records that referenced something unknown and were ignored (0 unless
    /// the log was written by a buggy caller).
    pub ignored_records: u64,
    /// Stored messages still referenced.
    pub live_messages: u64,
    /// Size of the log after recovery.
    pub log_bytes: u64,
}

/// Counters for metrics and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Commits handed to the writer.
    pub commits: u64,
    /// Records staged.
    pub records: u64,
    /// Write rounds of the writer thread (each takes every commit waiting).
    pub write_rounds: u64,
    /// fsync calls made by the writer thread.
    pub fsyncs: u64,
    /// Bytes written to the log, compaction included.
    pub bytes_written: u64,
    /// Compactions finished.
    pub compactions: u64,
    /// Size of the log (including what is committed but not yet written).
    pub log_bytes: u64,
    /// Estimated bytes of live records (what a compaction would keep).
    pub live_bytes: u64,
    /// Bytes of torn or corrupt tail cut off when the store was opened.
    pub truncated_bytes: u64,
    /// Highest durable LSN.
    pub durable_lsn: Lsn,
}

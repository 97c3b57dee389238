//! Small pieces of inbound PUBLISH handling (`broker.rs`'s PUBLISH section):
//! when a message is copied out of its read buffer, topic depth, and the
//! acknowledgement packet.

use zerofan_codec::{Ack, ReasonCode};

/// Messages at most this large are copied out of their read buffer before
/// being kept for long (retained, offline queues): a small slice must not
/// pin a large pooled buffer.
pub(crate) const COMPACT_AT_MOST: usize = 8 * 1024;

/// How many levels a topic has (one more than its `/` separators).
pub(super) fn topic_levels(topic: &str) -> usize {
    1 + topic.bytes().filter(|&b| b == b'/').count()
}

/// An acknowledgement packet body.
pub(crate) fn ack(packet_id: u16, reason: ReasonCode) -> Ack {
    Ack {
        packet_id,
        reason,
        properties: Default::default(),
    }
}

//! Inbound PUBLISH and the acknowledgement flows in both directions, and
//! routing a message to every matching session.

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

//! Outbound delivery's pure parts: the queue watermarks, whether a queued
//! message fits the client's Maximum Packet Size, and turning a queued
//! message into the [`Delivery`] the writer sends (topic alias, packet id,
//! remaining expiry). The queueing and batching that touch sessions and
//! connections at once are `broker.rs`'s delivery section.

use super::connection::Connection;
use super::ids::SessionId;
use super::message::{copy_str, Message};
use super::outbox::Delivery;
use super::peer::PeerId;
use super::session::{Behind, Queued};
use crate::config::Config;
use std::rc::Rc;
use std::time::Instant;
use zerofan_codec::QoS;

/// Queue capacity (entries) a session keeps once its queue is empty; more
/// is released, so a subscriber that once took a burst does not hold its
/// peak forever.
pub(super) const QUEUE_KEEP: usize = 64;

/// What a subscriber behind may queue past its bound from a publisher on
/// another shard that it already asked to stop: that shard goes on reading
/// until the Hold reaches it (a few reads of at most 64 KiB each, the
/// batches in its queue), and those messages are kept, not dropped; past
/// this, they are dropped and counted as any other.
pub(crate) const HOLD_SLACK: usize = 4 * 1024 * 1024;

/// Whether `behind` already holds the remote publisher `origin`.
pub(super) fn held_remote(
    behind: Option<&Behind>,
    origin: (Option<PeerId>, Option<SessionId>),
) -> bool {
    match (behind, origin) {
        (Some(b), (Some(peer), Some(session))) => b.holding_remote.contains(&(peer, session)),
        _ => false,
    }
}

/// Online queue cost past which a subscriber is behind: its publishers are
/// held, and its slow consumer clock runs.
pub(crate) fn high_water(cfg: &Config) -> usize {
    cfg.max_online_queued_bytes / 2
}

/// Online queue cost below which a subscriber behind has caught up.
pub(crate) fn low_water(cfg: &Config) -> usize {
    cfg.max_online_queued_bytes / 4
}

/// Whether the delivery fits the client's Maximum Packet Size, counted with
/// the full topic (an alias could only make it smaller).
pub(super) fn fits(c: &Connection, item: &Queued, now: Instant) -> bool {
    if c.max_packet_out == u32::MAX {
        return true;
    }
    let header = zerofan_codec::PublishHeader {
        dup: false,
        qos: item.qos,
        retain: item.retain,
        packet_id: 1,
        topic: item.msg.topic.as_str(),
        topic_alias: None,
        properties: &item.msg.properties,
        message_expiry_interval: item.msg.remaining_expiry(now),
        subscription_identifiers: &item.sub_ids,
        payload_len: item.msg.payload.len(),
    };
    header
        .packet_len(c.protocol)
        .is_ok_and(|len| len <= c.max_packet_out as usize)
}

/// Build the per-subscriber PUBLISH of a message that stays queued or in
/// flight (see [`delivery`]).
pub(crate) fn make_delivery(
    c: &mut Connection,
    item: &Queued,
    packet_id: u16,
    now: Instant,
) -> Delivery {
    let ids = item.sub_ids.clone();
    delivery(
        c,
        item.msg.clone(),
        item.qos,
        item.retain,
        ids,
        packet_id,
        now,
    )
}

/// The QoS 0 PUBLISH of a queued item that nothing keeps afterwards: it
/// moves into the delivery.
pub(super) fn into_delivery(c: &mut Connection, item: Queued, now: Instant) -> Delivery {
    delivery(c, item.msg, item.qos, item.retain, item.sub_ids, 0, now)
}

/// Build the per-subscriber PUBLISH, choosing a topic alias when the client
/// allows them: the first message on a topic establishes one, later ones
/// send only the alias.
fn delivery(
    c: &mut Connection,
    message: Rc<Message>,
    qos: QoS,
    retain: bool,
    subscription_identifiers: Vec<u32>,
    packet_id: u16,
    now: Instant,
) -> Delivery {
    let (topic_alias, send_topic) = if c.alias_max_out == 0 {
        (None, true)
    } else if let Some(&a) = c
        .aliases
        .as_ref()
        .and_then(|al| al.outgoing.get(&message.topic))
    {
        (Some(a), false)
    } else if c.aliases.as_ref().map_or(0, |al| al.outgoing.len()) < usize::from(c.alias_max_out) {
        let out = &mut c.aliases_mut().outgoing;
        let a = out.len() as u16 + 1;
        out.insert(copy_str(&message.topic), a);
        (Some(a), true)
    } else {
        (None, true)
    };
    // Subscription identifiers and the expiry interval exist in MQTT 5 only.
    let (subscription_identifiers, message_expiry_interval) = if c.protocol.is_v5() {
        (subscription_identifiers, message.remaining_expiry(now))
    } else {
        (Vec::new(), None)
    };
    Delivery {
        message,
        qos,
        packet_id,
        dup: false,
        retain,
        topic_alias,
        send_topic,
        subscription_identifiers,
        message_expiry_interval,
    }
}

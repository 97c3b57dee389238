//! What a deferred SUBSCRIBE keeps for its retained messages. SUBSCRIBE and
//! UNSUBSCRIBE handling is `broker.rs`'s SUBSCRIBE section.

use std::time::Instant;
use zerofan_codec::SubscriptionOptions;

/// The retained messages a SUBSCRIBE asked for, looked up when its SUBACK
/// goes out (see `Broker::subscribed`).
#[derive(Debug)]
pub(crate) struct Replay {
    /// When the SUBSCRIBE arrived: what had expired by then is not sent.
    pub(super) now: Instant,
    pub(super) sub_id: Option<u32>,
    /// The non-shared filters that replay, with their options.
    pub(super) filters: Vec<(Box<str>, SubscriptionOptions)>,
}

//! Quotas on state that clients grow: subscriptions per session
//! (`max_subscriptions_per_session`) and the retained store
//! (`max_retained_messages`, `max_retained_bytes`). Each refusal is counted
//! in [`SecurityMetrics`] (`zerofan_limit_refused_total{limit=...}`).

use super::limits::SecurityMetrics;
use super::message::Message;
use super::store::{retained_bytes, RetainedStore};
use crate::config::Config;
use zerofan_codec::ReasonCode;

/// The SUBACK reason for a filter a session may not add: `None` when it
/// may. `held`: the session's subscriptions now; `is_new`: the filter is
/// not one of them (a repeated filter replaces its subscription and is
/// always allowed).
pub(crate) fn subscription_refused(
    config: &Config,
    held: usize,
    is_new: bool,
    v5: bool,
    metrics: &mut SecurityMetrics,
) -> Option<ReasonCode> {
    let max = config.max_subscriptions_per_session;
    if max == 0 || !is_new || held < max {
        return None;
    }
    metrics.refused_subscriptions += 1;
    Some(if v5 {
        ReasonCode::QUOTA_EXCEEDED
    } else {
        ReasonCode::UNSPECIFIED_ERROR
    })
}

/// Whether the retained message `msg` may be kept. Clearing (an empty
/// payload) always may; a topic that has a retained message may replace it
/// within the bytes limit; a new topic needs room under both limits. The
/// broker's own `$SYS/` messages never come here and do not count.
pub(crate) fn retained_admitted(
    config: &Config,
    store: &dyn RetainedStore,
    msg: &Message,
    metrics: &mut SecurityMetrics,
) -> bool {
    if msg.payload.is_empty() {
        return true;
    }
    let old = store.size_of(msg.topic.as_str());
    let (count, bytes) = store.usage();
    if old.is_none() && config.max_retained_messages > 0 && count >= config.max_retained_messages {
        metrics.refused_retained_messages += 1;
        return false;
    }
    let after = bytes
        .saturating_sub(old.unwrap_or(0))
        .saturating_add(retained_bytes(msg));
    if config.max_retained_bytes > 0 && after > config.max_retained_bytes {
        metrics.refused_retained_bytes += 1;
        return false;
    }
    true
}

//! Topic names and topic filters (§4.7): validation, matching, shared groups.

use crate::error::DecodeError;

/// Check a topic name: non-empty, no `+` or `#` (0x90 topic name invalid).
pub fn validate_topic_name(topic: &str) -> Result<(), DecodeError> {
    let _ = topic;
    todo!("codec helper")
}

/// Check a topic filter: non-empty; `#` only alone as the last level; `+`
/// only as a whole level; a `$share/{group}/{filter}` needs a group without
/// wildcards and a non-empty filter (0x8F topic filter invalid).
pub fn validate_topic_filter(filter: &str) -> Result<(), DecodeError> {
    let _ = filter;
    todo!("codec helper")
}

/// Does `filter` (already valid, not a `$share` one) match `topic` (a valid
/// name)? Wildcards in the first level do not match topics starting with `$`.
pub fn matches(filter: &str, topic: &str) -> bool {
    let _ = (filter, topic);
    todo!("codec helper")
}

/// Split `$share/{group}/{filter}` into `(group, filter)`; `None` for any
/// other filter.
pub fn split_shared(filter: &str) -> Option<(&str, &str)> {
    let _ = filter;
    todo!("codec helper")
}

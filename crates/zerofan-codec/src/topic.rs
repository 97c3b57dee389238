//! Topic names and topic filters (§4.7): validation, matching, shared groups.
//!
//! [`crate::decode()`] validates PUBLISH and will topic names itself, but it
//! does **not** validate SUBSCRIBE / UNSUBSCRIBE topic filters beyond the
//! UTF-8 string rules: the broker calls [`validate_topic_filter`] on each
//! filter so it can answer 0x8F Topic Filter Invalid per filter in SUBACK
//! (or 0x80 under 3.1.1) instead of dropping the connection.

use crate::error::DecodeError;
use crate::reason::ReasonCode;

const NAME_INVALID: DecodeError =
    DecodeError::new(ReasonCode::TOPIC_NAME_INVALID, "invalid topic name");
const FILTER_INVALID: DecodeError =
    DecodeError::new(ReasonCode::TOPIC_FILTER_INVALID, "invalid topic filter");

/// Check a topic name: non-empty, no `+` or `#` (0x90 topic name invalid).
pub fn validate_topic_name(topic: &str) -> Result<(), DecodeError> {
    if topic.is_empty() || topic.bytes().any(|b| b == b'+' || b == b'#') {
        return Err(NAME_INVALID);
    }
    Ok(())
}

/// Check a topic filter: non-empty; `#` only alone as the last level; `+`
/// only as a whole level; a `$share/{group}/{filter}` needs a group without
/// wildcards and a non-empty filter (0x8F topic filter invalid).
pub fn validate_topic_filter(filter: &str) -> Result<(), DecodeError> {
    if filter.is_empty() {
        return Err(FILTER_INVALID);
    }
    let levels = if let Some(rest) = filter.strip_prefix("$share/") {
        let Some((group, f)) = rest.split_once('/') else {
            return Err(FILTER_INVALID);
        };
        if group.is_empty() || group.bytes().any(|b| b == b'+' || b == b'#') || f.is_empty() {
            return Err(FILTER_INVALID);
        }
        f
    } else {
        filter
    };
    let mut it = levels.split('/').peekable();
    while let Some(level) = it.next() {
        if level.contains('#') {
            if level != "#" || it.peek().is_some() {
                return Err(FILTER_INVALID);
            }
        } else if level.contains('+') && level != "+" {
            return Err(FILTER_INVALID);
        }
    }
    Ok(())
}

/// Does `filter` (already valid, not a `$share` one) match `topic` (a valid
/// name)? Wildcards in the first level do not match topics starting with `$`.
///
/// `#` also matches the parent level (`a/#` matches `a`); `+` matches one
/// level, empty ones included (`a/+/b` matches `a//b`). Never allocates.
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(fl), Some(tl)) => {
                if fl != tl {
                    return false;
                }
            }
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Split `$share/{group}/{filter}` into `(group, filter)`; `None` for any
/// other filter.
///
/// Only the shape is looked at (the prefix and a `/` after the group):
/// `$share/g/` gives `Some(("g", ""))`; call [`validate_topic_filter`] first
/// to refuse empty groups and filters.
pub fn split_shared(filter: &str) -> Option<(&str, &str)> {
    filter.strip_prefix("$share/")?.split_once('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in [
            "a",
            "a/b",
            "/",
            "a//b",
            "$SYS/x",
            " ",
            "sport/tennis/player1",
        ] {
            assert!(validate_topic_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/+", "#", "a/#/b", "a+b"] {
            let e = validate_topic_name(bad).unwrap_err();
            assert_eq!(e.reason, ReasonCode::TOPIC_NAME_INVALID, "{bad}");
        }
    }

    #[test]
    fn filters() {
        for ok in [
            "#",
            "+",
            "a/#",
            "a/+/b",
            "+/+",
            "/+",
            "a//b",
            "sport/tennis/#",
            "$SYS/#",
            "$share/g/a/b",
            "$share/g/#",
            "$share/g/+/x",
            "$share",
            "$sharex/y",
        ] {
            assert!(validate_topic_filter(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a#",
            "a/#/b",
            "#/a",
            "a+",
            "a/b+/c",
            "++",
            "$share/",
            "$share/g",
            "$share/g/",
            "$share//a",
            "$share/g+/a",
            "$share/#/a",
        ] {
            let e = validate_topic_filter(bad).unwrap_err();
            assert_eq!(e.reason, ReasonCode::TOPIC_FILTER_INVALID, "{bad}");
        }
    }

    #[test]
    fn matching() {
        let yes = [
            ("a/b", "a/b"),
            ("a/+", "a/b"),
            ("a/#", "a"),
            ("a/#", "a/b/c"),
            ("#", "a/b"),
            ("+/+", "/a"),
            ("a/+/b", "a//b"),
            ("+", ""),
            ("/#", "/a"),
            ("$SYS/#", "$SYS/load"),
            ("$SYS/+", "$SYS/x"),
            ("sport/tennis/player1/#", "sport/tennis/player1"),
        ];
        for (f, t) in yes {
            assert!(matches(f, t), "{f} should match {t}");
        }
        let no = [
            ("a/b", "a/c"),
            ("a/+", "a/b/c"),
            ("a/+", "a"),
            ("a/b", "a/b/c"),
            ("a/b/c", "a/b"),
            ("#", "$SYS/x"),
            ("+/x", "$SYS/x"),
            ("+", "$x"),
            ("sport/+", "sport"),
        ];
        for (f, t) in no {
            assert!(!matches(f, t), "{f} should not match {t}");
        }
    }

    #[test]
    fn shared() {
        assert_eq!(split_shared("$share/g/a/b"), Some(("g", "a/b")));
        assert_eq!(split_shared("$share/g/#"), Some(("g", "#")));
        assert_eq!(split_shared("$share/g"), None);
        assert_eq!(split_shared("a/b"), None);
        assert_eq!(split_shared("$sharex/g/a"), None);
    }
}

//! Topic-filter helpers with mosquitto's rules: matching a topic name against
//! a filter, and the set relations (`overlaps`, `covers`) that the ACL's
//! SUBSCRIBE check needs.
//!
//! The `$` rule (MQTT 3.1.1 §4.7.2, and `mosquitto_topic_matches_sub`): a
//! filter whose first level is a wildcard (`#`, `+`) never matches a topic
//! whose first level starts with `$`. A filter matches a `$` topic only if
//! it spells out the `$` level itself (`$SYS/#`).

/// Why a topic filter is not valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterError {
    /// The filter is the empty string.
    Empty,
    /// The filter is longer than 65535 bytes.
    TooLong,
    /// A `+` or `#` shares its level with other characters (`a+/b`).
    WildcardNotAlone,
    /// `#` is not the last level.
    HashNotLast,
    /// The filter contains a NUL character.
    Nul,
}

impl std::fmt::Display for FilterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FilterError::Empty => "empty topic filter",
            FilterError::TooLong => "topic filter longer than 65535 bytes",
            FilterError::WildcardNotAlone => "'+' and '#' must occupy a whole topic level",
            FilterError::HashNotLast => "'#' must be the last topic level",
            FilterError::Nul => "topic filter contains a NUL character",
        })
    }
}

/// Check a topic filter the way `mosquitto_sub_topic_check` does.
pub fn validate_filter(filter: &str) -> Result<(), FilterError> {
    if filter.is_empty() {
        return Err(FilterError::Empty);
    }
    if filter.len() > 65535 {
        return Err(FilterError::TooLong);
    }
    if filter.contains('\0') {
        return Err(FilterError::Nul);
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        if level.contains(['+', '#']) && level.len() != 1 {
            return Err(FilterError::WildcardNotAlone);
        }
        if level == "#" && levels.peek().is_some() {
            return Err(FilterError::HashNotLast);
        }
    }
    Ok(())
}

fn is_wild(level: &str) -> bool {
    level == "+" || level == "#"
}

/// Whether `topic` (a topic name, no wildcards) matches `filter`.
///
/// `a/#` matches `a` as well as `a/b`; `+` matches an empty level; a filter
/// starting with a wildcard does not match a topic starting with `$`.
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') != filter.starts_with('$') {
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
            // The filter has one more level: only "#" matches the parent.
            (Some(fl), None) => return fl == "#" && f.next().is_none(),
            (None, Some(_)) => return false,
        }
    }
}

/// Whether some topic name matches both filters.
pub fn overlaps(a: &str, b: &str) -> bool {
    let a_levels: Vec<&str> = a.split('/').collect();
    let b_levels: Vec<&str> = b.split('/').collect();
    // The `$` rule on the first level.
    let (a0, b0) = (a_levels[0], b_levels[0]);
    if (is_wild(a0) && b0.starts_with('$')) || (is_wild(b0) && a0.starts_with('$')) {
        return false;
    }
    let mut i = 0;
    loop {
        match (a_levels.get(i), b_levels.get(i)) {
            (Some(&"#"), _) | (_, Some(&"#")) => return true,
            (Some(&x), Some(&y)) => {
                if x != "+" && y != "+" && x != y {
                    return false;
                }
            }
            (None, None) => return true,
            // One filter ended: the other must continue with exactly "#".
            (None, Some(_)) => return b_levels.len() == i + 1 && b_levels[i] == "#",
            (Some(_), None) => return a_levels.len() == i + 1 && a_levels[i] == "#",
        }
        i += 1;
    }
}

/// Whether every topic name matched by `inner` is also matched by `outer`.
pub fn covers(outer: &str, inner: &str) -> bool {
    let o: Vec<&str> = outer.split('/').collect();
    let n: Vec<&str> = inner.split('/').collect();
    // A wildcard first level in `outer` cannot match `$` topics that a
    // literal `$` first level in `inner` names.
    if is_wild(o[0]) && n[0].starts_with('$') {
        return false;
    }
    for (i, &nl) in n.iter().enumerate() {
        match o.get(i) {
            Some(&"#") => return true,
            Some(&"+") => {
                if nl == "#" {
                    return false;
                }
            }
            Some(&ol) => {
                if ol != nl {
                    return false;
                }
            }
            None => return false,
        }
    }
    // `inner` ended; `outer` must end too, or add exactly "#" (parent match).
    o.len() == n.len() || (o.len() == n.len() + 1 && o[n.len()] == "#")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching() {
        assert!(matches("a/b", "a/b"));
        assert!(matches("a/+", "a/b"));
        assert!(matches("a/+", "a/"));
        assert!(!matches("a/+", "a"));
        assert!(matches("a/#", "a"));
        assert!(matches("a/#", "a/b/c"));
        assert!(matches("#", "a"));
        assert!(!matches("#", "$SYS/x"));
        assert!(!matches("+/x", "$SYS/x"));
        assert!(matches("$SYS/#", "$SYS/x"));
        assert!(!matches("a/b", "a/b/c"));
        assert!(!matches("a/b/c", "a/b"));
        assert!(matches("+/+", "/"));
    }

    #[test]
    fn validation() {
        assert!(validate_filter("a/+/#").is_ok());
        assert!(validate_filter("#").is_ok());
        assert_eq!(validate_filter("a/#/b"), Err(FilterError::HashNotLast));
        assert_eq!(validate_filter("a+"), Err(FilterError::WildcardNotAlone));
        assert_eq!(validate_filter(""), Err(FilterError::Empty));
    }

    #[test]
    fn overlap() {
        assert!(overlaps("#", "foo/#"));
        assert!(overlaps("foo/+", "+/bar"));
        assert!(overlaps("foo", "foo/#"));
        assert!(!overlaps("foo", "foo/+"));
        assert!(!overlaps("#", "$SYS/#"));
        assert!(overlaps("$SYS/#", "$SYS/broker/+"));
        assert!(!overlaps("a/b", "a/c"));
        assert!(!overlaps("a/b/c", "a/b"));
    }

    #[test]
    fn cover() {
        assert!(covers("#", "foo/#"));
        assert!(covers("foo/#", "foo"));
        assert!(covers("foo/#", "foo/+/x"));
        assert!(!covers("foo/+", "foo/#"));
        assert!(covers("foo/+", "foo/+"));
        assert!(!covers("foo/bar", "foo/+"));
        assert!(!covers("#", "$SYS/#"));
        assert!(covers("$SYS/#", "$SYS/#"));
        assert!(!covers("a", "a/b"));
    }
}

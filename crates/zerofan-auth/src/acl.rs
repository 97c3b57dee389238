//! mosquitto `acl_file` access control.
//!
//! # File format
//!
//! ```text
//! # Comment (a line whose first non-blank character is '#')
//! topic read $SYS/#               <- before any `user` line: anonymous clients
//! user alice                      <- following `topic` lines are alice's
//! topic readwrite alice/#
//! topic deny alice/secret
//! topic sensors/+                 <- no access word: readwrite
//! pattern write devices/%c/state  <- every client; %c client id, %u username
//! ```
//!
//! - `topic [read|write|readwrite|deny] FILTER` adds a rule to the current
//!   block: the anonymous block until the first `user NAME` line, then that
//!   user's block. With a single word after `topic` that word is the filter
//!   and the access is readwrite (so `topic read` alone grants readwrite on
//!   the topic `read`, as in mosquitto). The filter is the rest of the line
//!   and may contain spaces; `+` and `#` must occupy whole levels.
//! - `user NAME` starts a user's block (the name is the rest of the line).
//!   Two blocks for the same name are merged.
//! - `pattern [read|write|readwrite|deny] FILTER` applies to every client,
//!   wherever it appears in the file. `%c` is replaced by the client id and
//!   `%u` by the username; a rule with `%u` does not apply to a client
//!   without a username. A pattern without either gets a warning
//!   ([`Acl::warnings`]), as in mosquitto.
//! - Anything else is an error naming the line.
//!
//! # Decision (mosquitto 2.0 `mosquitto_acl_check_default`, exactly)
//!
//! For a PUBLISH (write) or a delivery (read) of topic `T` by a client:
//!
//! 1. The client's own block — the block of its username, or the anonymous
//!    block when it has no username; none if the file has no such block:
//!    a `deny` rule matching `T` refuses; else a rule matching `T` that
//!    grants the access allows.
//! 2. If the file has `pattern` rules: a client whose username or client id
//!    contains `+` or `#` is refused (it could otherwise widen a pattern).
//!    Then a `deny` pattern matching `T` refuses; else a pattern matching
//!    `T` that grants the access allows.
//! 3. Otherwise refused: when an ACL is configured, whatever no rule allows
//!    is denied.
//!
//! So `deny` beats an allow *at the same level*; a user's `topic deny`
//! also beats every `pattern`, but a `pattern deny` does not take away what
//! the user's own `topic` lines grant.
//!
//! # `$` topics
//!
//! A rule whose filter starts with a wildcard never matches a topic starting
//! with `$`: `topic read #` does not grant `$SYS/...`; `topic read $SYS/#`
//! does. This is how mosquitto keeps `$SYS` private under an ACL.
//!
//! Before any ACL, mosquitto refuses every client PUBLISH to a topic
//! starting with `$SYS` (bridge status topics `$SYS/broker/connection/+/state`
//! excepted) and any read or write of a `$share...` topic, even when the ACL
//! file says `topic readwrite $SYS/#`: [`check_dollar`], which
//! [`Acl::check`] applies first. The broker should call [`check_dollar`]
//! itself when no ACL file is configured.
//!
//! # SUBSCRIBE
//!
//! mosquitto 2.0's `acl_file` grants every SUBSCRIBE (its subscribe hook is
//! a `FIXME` that returns success) and checks read access for each message
//! as it is delivered, retained messages included. zerofan does the same
//! per-delivery check ([`Acl::check`] with [`Access::Read`]) and, in
//! addition, [`Acl::check_subscribe`] refuses (SUBACK 0x87 / 0x80) a filter
//! that could never deliver anything to this client:
//!
//! - a `deny` rule of the client's block covers every topic of the filter; or
//! - no rule of the client's block grants read on a topic the filter also
//!   matches, and then (with patterns) the client has a dangerous name, or
//!   a `deny` pattern covers the filter, or no pattern grants read on a
//!   topic the filter also matches.
//!
//! A granted filter may still match topics the client cannot read (`#`
//! under `topic read foo/#`): those messages are dropped at delivery, as in
//! mosquitto. The check never refuses a filter through which some message
//! would have been delivered. For a shared subscription pass the filter
//! without its `$share/GROUP/` prefix.

use std::collections::HashMap;

use crate::error::{numbered_lines, shown, split_word, ParseError};
use crate::topic::{covers, matches, overlaps, validate_filter};

/// What a client wants to do with a topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Receive messages on the topic (deliveries, retained messages).
    Read,
    /// Publish to the topic.
    Write,
}

/// The access word of a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuleAccess {
    /// `read`
    Read,
    /// `write`
    Write,
    /// `readwrite`, or no access word
    ReadWrite,
    /// `deny`: refuses both, before any allow of the same level.
    Deny,
}

impl RuleAccess {
    fn grants(self, access: Access) -> bool {
        matches!(
            (self, access),
            (RuleAccess::ReadWrite, _)
                | (RuleAccess::Read, Access::Read)
                | (RuleAccess::Write, Access::Write)
        )
    }

    fn parse(word: &str) -> Option<RuleAccess> {
        Some(match word {
            "read" => RuleAccess::Read,
            "write" => RuleAccess::Write,
            "readwrite" => RuleAccess::ReadWrite,
            "deny" => RuleAccess::Deny,
            _ => return None,
        })
    }
}

/// One `topic` or `pattern` rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The access it grants, or deny.
    pub access: RuleAccess,
    /// The topic filter (for a pattern, before substitution).
    pub filter: String,
    /// Line of the ACL file it came from.
    pub line: usize,
}

/// The rules of one block, denies kept apart so they are tried first.
#[derive(Clone, Debug, Default)]
struct RuleList {
    deny: Vec<Rule>,
    allow: Vec<Rule>,
}

impl RuleList {
    fn push(&mut self, rule: Rule) {
        if rule.access == RuleAccess::Deny {
            self.deny.push(rule);
        } else {
            self.allow.push(rule);
        }
    }

    fn is_empty(&self) -> bool {
        self.deny.is_empty() && self.allow.is_empty()
    }
}

/// A parsed ACL file.
#[derive(Clone, Debug, Default)]
pub struct Acl {
    anonymous: Option<RuleList>,
    users: HashMap<String, RuleList>,
    patterns: RuleList,
    warnings: Vec<(usize, String)>,
}

impl Acl {
    /// Parse an ACL file (see the module documentation for the format).
    pub fn parse(text: &str) -> Result<Acl, ParseError> {
        let mut acl = Acl::default();
        let mut user: Option<String> = None;
        for (n, raw) in numbered_lines(text) {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (keyword, rest) = split_word(line);
            match keyword {
                "topic" | "pattern" => {
                    let (first, after) = split_word(rest);
                    if first.is_empty() {
                        return Err(ParseError::new(
                            n,
                            format!("'{keyword}' needs a topic filter"),
                        ));
                    }
                    let (access, filter) = if after.is_empty() {
                        (RuleAccess::ReadWrite, first)
                    } else {
                        let access = RuleAccess::parse(first).ok_or_else(|| {
                            ParseError::new(
                                n,
                                format!(
                                    "invalid access type {} (expected read, write, readwrite or deny)",
                                    shown(first)
                                ),
                            )
                        })?;
                        (access, after.trim())
                    };
                    validate_filter(filter).map_err(|e| {
                        ParseError::new(n, format!("invalid topic filter {}: {e}", shown(filter)))
                    })?;
                    let rule = Rule {
                        access,
                        filter: filter.to_string(),
                        line: n,
                    };
                    if keyword == "pattern" {
                        if !filter.contains("%c") && !filter.contains("%u") {
                            acl.warnings.push((
                                n,
                                format!("pattern {} contains neither %c nor %u", shown(filter)),
                            ));
                        }
                        acl.patterns.push(rule);
                    } else {
                        match &user {
                            Some(u) => acl.users.entry(u.clone()).or_default().push(rule),
                            None => acl
                                .anonymous
                                .get_or_insert_with(RuleList::default)
                                .push(rule),
                        }
                    }
                }
                "user" => {
                    let name = rest.trim();
                    if name.is_empty() {
                        return Err(ParseError::new(n, "'user' needs a username"));
                    }
                    user = Some(name.to_string());
                }
                other => {
                    return Err(ParseError::new(
                        n,
                        format!(
                            "unknown keyword {} (expected topic, pattern or user)",
                            shown(other)
                        ),
                    ))
                }
            }
        }
        Ok(acl)
    }

    /// Non-fatal remarks from parsing, with their line numbers.
    pub fn warnings(&self) -> &[(usize, String)] {
        &self.warnings
    }

    /// The block that applies to a client: its user's, or the anonymous one.
    fn block(&self, username: Option<&str>) -> Option<&RuleList> {
        match username {
            Some(u) => self.users.get(u),
            None => self.anonymous.as_ref(),
        }
    }

    /// Whether the client may `access` the topic name `topic` (PUBLISH for
    /// [`Access::Write`]; each delivery, retained ones included, for
    /// [`Access::Read`]). `client_id` is the client identifier in use (the
    /// assigned one if the broker assigned it). [`check_dollar`] is applied
    /// first, as mosquitto does.
    pub fn check(
        &self,
        client_id: &str,
        username: Option<&str>,
        topic: &str,
        access: Access,
    ) -> bool {
        if !check_dollar(topic, access) {
            return false;
        }
        if let Some(block) = self.block(username) {
            if block.deny.iter().any(|r| matches(&r.filter, topic)) {
                return false;
            }
            if block
                .allow
                .iter()
                .any(|r| r.access.grants(access) && matches(&r.filter, topic))
            {
                return true;
            }
        }
        if self.patterns.is_empty() || dangerous(client_id, username) {
            return false;
        }
        let mut buf = String::new();
        for r in &self.patterns.deny {
            if substitute(&r.filter, client_id, username, &mut buf) && matches(&buf, topic) {
                return false;
            }
        }
        for r in &self.patterns.allow {
            if r.access.grants(access)
                && substitute(&r.filter, client_id, username, &mut buf)
                && matches(&buf, topic)
            {
                return true;
            }
        }
        false
    }

    /// Whether a SUBSCRIBE to `filter` is granted (see the module
    /// documentation: refuses only filters that could deliver nothing).
    /// `filter` must be a valid topic filter without a `$share/` prefix.
    pub fn check_subscribe(&self, client_id: &str, username: Option<&str>, filter: &str) -> bool {
        if let Some(block) = self.block(username) {
            if block.deny.iter().any(|r| covers(&r.filter, filter)) {
                return false;
            }
            if block
                .allow
                .iter()
                .any(|r| r.access.grants(Access::Read) && overlaps(&r.filter, filter))
            {
                return true;
            }
        }
        if self.patterns.is_empty() || dangerous(client_id, username) {
            return false;
        }
        let mut buf = String::new();
        for r in &self.patterns.deny {
            if substitute(&r.filter, client_id, username, &mut buf) && covers(&buf, filter) {
                return false;
            }
        }
        for r in &self.patterns.allow {
            if r.access.grants(Access::Read)
                && substitute(&r.filter, client_id, username, &mut buf)
                && overlaps(&buf, filter)
            {
                return true;
            }
        }
        false
    }

    /// The rules of the anonymous block (before the first `user` line).
    pub fn anonymous_rules(&self) -> impl Iterator<Item = &Rule> {
        self.anonymous
            .iter()
            .flat_map(|b| b.deny.iter().chain(b.allow.iter()))
    }

    /// The rules of `user`'s block.
    pub fn user_rules(&self, user: &str) -> impl Iterator<Item = &Rule> {
        self.users
            .get(user)
            .into_iter()
            .flat_map(|b| b.deny.iter().chain(b.allow.iter()))
    }

    /// The `pattern` rules.
    pub fn patterns(&self) -> impl Iterator<Item = &Rule> {
        self.patterns.deny.iter().chain(self.patterns.allow.iter())
    }
}

/// mosquitto's rules for `$` topics, applied to every client before (and
/// without) any ACL file (`acl__check_dollar` in mosquitto 2.0):
///
/// - a topic starting with `$SYS` may be read (subject to the ACL) but not
///   written, except `$SYS/broker/connection/+/state` (bridge status);
/// - a topic starting with `$share` can be neither read nor written (it is
///   only a subscription prefix);
/// - other topics, `$` or not, are left to the ACL.
///
/// Returns false when the access is refused outright.
pub fn check_dollar(topic: &str, access: Access) -> bool {
    if topic.starts_with("$SYS") {
        access == Access::Read || matches("$SYS/broker/connection/+/state", topic)
    } else {
        !topic.starts_with("$share")
    }
}

/// mosquitto refuses clients whose name could widen a pattern.
fn dangerous(client_id: &str, username: Option<&str>) -> bool {
    client_id.contains(['+', '#']) || username.is_some_and(|u| u.contains(['+', '#']))
}

/// Expand `%c` and `%u` in one pass into `out`; false if the pattern needs
/// a username the client does not have.
fn substitute(pattern: &str, client_id: &str, username: Option<&str>, out: &mut String) -> bool {
    out.clear();
    let mut rest = pattern;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('c') {
            out.push_str(client_id);
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('u') {
            match username {
                Some(u) => out.push_str(u),
                None => return false,
            }
            rest = tail;
        } else {
            out.push('%');
            rest = after;
        }
    }
    out.push_str(rest);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitution_is_single_pass() {
        let mut s = String::new();
        assert!(substitute("a/%c/%u", "x%u", Some("bob"), &mut s));
        assert_eq!(s, "a/x%u/bob");
        assert!(!substitute("a/%u", "c", None, &mut s));
        assert!(substitute("100%/%c", "c", None, &mut s));
        assert_eq!(s, "100%/c");
    }

    #[test]
    fn parse_errors_have_lines() {
        let e = Acl::parse("user a\ntopic bogus a/b\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("access type"), "{e}");
        let e = Acl::parse("\n\nuser\n").unwrap_err();
        assert_eq!(e.line, 3);
        let e = Acl::parse("topic read a/#/b\n").unwrap_err();
        assert!(e.message.contains("last"), "{e}");
        let e = Acl::parse("topics read a\n").unwrap_err();
        assert!(e.message.contains("unknown keyword"), "{e}");
        let e = Acl::parse("topic\n").unwrap_err();
        assert_eq!(e.line, 1);
    }

    #[test]
    fn single_word_is_the_topic() {
        let acl = Acl::parse("topic read\n").unwrap();
        assert!(acl.check("c", None, "read", Access::Write));
    }
}

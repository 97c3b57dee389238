//! The one error type of every parser in this crate.

use std::fmt;

/// A file that could not be parsed: where, and what went wrong.
///
/// Displays as `FILE:LINE: MESSAGE` (or `line LINE: MESSAGE` when the text
/// had no file name), the form `zerofan --test-config` should print.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ParseError {
    /// The file the line is in, when known (included configuration files
    /// carry their name; text passed straight to a parser has none).
    pub file: Option<String>,
    /// 1-based line number.
    pub line: usize,
    /// What went wrong, for a person.
    pub message: String,
}

impl ParseError {
    /// An error on `line` of text without a file name.
    pub fn new(line: usize, message: impl Into<String>) -> Self {
        ParseError {
            file: None,
            line,
            message: message.into(),
        }
    }

    /// The same error, attributed to `file`.
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        self.file = Some(file.into());
        self
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(file) => write!(f, "{file}:{}: {}", self.line, self.message),
            None => write!(f, "line {}: {}", self.line, self.message),
        }
    }
}

/// Lines of `text` with 1-based numbers, a trailing `\r` removed from each.
pub(crate) fn numbered_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split('\n').enumerate().map(|(i, line)| {
        let line = line.strip_suffix('\r').unwrap_or(line);
        (i + 1, line)
    })
}

/// Split off the first word of `s` (words separated by spaces or tabs);
/// returns the word and the rest with leading blanks removed.
pub(crate) fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim_start_matches([' ', '\t']);
    match s.find([' ', '\t']) {
        Some(i) => (&s[..i], s[i..].trim_start_matches([' ', '\t'])),
        None => (s, ""),
    }
}

/// Shorten user-supplied text for an error message.
pub(crate) fn shown(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        format!("{s:?}")
    } else {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut:?}...")
    }
}

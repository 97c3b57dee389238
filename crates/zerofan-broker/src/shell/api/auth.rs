//! Bearer tokens for `/api/`: read from `http_tokens_file` at start and on
//! every reload, compared in constant time; anonymous access only on a
//! loopback listener with `http_allow_anonymous`. Wrong tokens are counted
//! per peer address, and a peer past [`FREE_FAILURES`] in [`WINDOW`] gets
//! 429 until its window ends, whatever it sends.

use crate::config::Config;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Failed attempts a peer may make in a window before it is throttled.
pub const FREE_FAILURES: u32 = 5;
/// How long failures are remembered.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Peer addresses whose failures are tracked; past it, the oldest windows
/// are forgotten first, and if all are young every newcomer shares one
/// entry (so a flood of addresses is throttled together).
pub const MAX_TRACKED: usize = 4096;
/// Longest token accepted in a file, bytes.
pub const MAX_TOKEN: usize = 1024;
/// Most tokens in a file.
pub const MAX_TOKENS: usize = 10_000;

/// What an `/api/` request is allowed to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead.
    Allowed,
    /// 401: no token, or a wrong one.
    Unauthorized,
    /// 429: too many failures from this peer lately.
    Throttled,
}

/// Auth counters for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuthFigures {
    /// Requests refused with 401.
    pub failures: u64,
    /// Requests refused with 429.
    pub throttled: u64,
    /// Peer addresses forgotten (or pooled) because the table was full.
    pub evictions: u64,
}

/// Tokens, the anonymous rule and the failure table.
#[derive(Debug, Default)]
pub struct ApiAuth {
    tokens: Vec<Box<[u8]>>,
    anonymous: bool,
    failures: HashMap<IpAddr, (u32, Instant)>,
    /// Counters.
    pub figures: AuthFigures,
}

/// Read a tokens file: one token a line, blank lines and `#` comments
/// skipped; errors name the file and line.
pub fn read_tokens(path: &Path) -> Result<Vec<Box<[u8]>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read http_tokens_file {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if t.len() > MAX_TOKEN || t.contains(char::is_whitespace) {
            return Err(format!(
                "{}:{}: a token is one word of at most {MAX_TOKEN} bytes",
                path.display(),
                n + 1
            ));
        }
        if out.len() >= MAX_TOKENS {
            return Err(format!("{}: more than {MAX_TOKENS} tokens", path.display()));
        }
        out.push(t.as_bytes().into());
    }
    Ok(out)
}

/// Equal without an early exit on the first differing byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl ApiAuth {
    /// The rules of `config` for a listener bound to `bound`.
    pub fn load(config: &Config, loopback: bool) -> Result<ApiAuth, String> {
        let mut a = ApiAuth::default();
        a.apply(config, loopback)?;
        Ok(a)
    }

    /// Put `config`'s tokens and anonymous rule in force; on error the
    /// ones in force stay.
    pub fn apply(&mut self, config: &Config, loopback: bool) -> Result<(), String> {
        let tokens = match &config.http_tokens_file {
            Some(p) => read_tokens(p)?,
            None => Vec::new(),
        };
        self.tokens = tokens;
        self.anonymous = config.http_allow_anonymous && loopback;
        Ok(())
    }

    /// How many tokens are in force.
    pub fn token_count(&self) -> usize {
        self.tokens.len()
    }

    /// Judge a request from `peer` with this `Authorization` header value.
    pub fn check(&mut self, now: Instant, peer: IpAddr, authorization: Option<&[u8]>) -> Verdict {
        if let Some((count, since)) = self.failures.get(&peer).copied() {
            if now.duration_since(since) >= WINDOW {
                self.failures.remove(&peer);
            } else if count >= FREE_FAILURES {
                self.figures.throttled += 1;
                return Verdict::Throttled;
            }
        }
        let token = authorization.and_then(|h| {
            let rest = h.strip_prefix(b"Bearer ")?;
            Some(rest.trim_ascii())
        });
        let ok = match token {
            Some(t) => {
                // Every token compared, so the time taken says nothing
                // about which one came close.
                let mut hit = false;
                for known in &self.tokens {
                    hit |= same(known, t);
                }
                hit
            }
            None => self.anonymous,
        };
        if ok {
            return Verdict::Allowed;
        }
        self.figures.failures += 1;
        self.fail(now, peer);
        Verdict::Unauthorized
    }

    fn fail(&mut self, now: Instant, peer: IpAddr) {
        let key = if self.failures.contains_key(&peer) || self.failures.len() < MAX_TRACKED {
            peer
        } else {
            self.failures
                .retain(|_, (_, since)| now.duration_since(*since) < WINDOW);
            self.figures.evictions += 1;
            if self.failures.len() < MAX_TRACKED {
                peer
            } else {
                IpAddr::from([0u8; 16])
            }
        };
        let e = self.failures.entry(key).or_insert((0, now));
        e.0 = e.0.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(tokens: &[&str], anonymous: bool) -> ApiAuth {
        ApiAuth {
            tokens: tokens.iter().map(|t| t.as_bytes().into()).collect(),
            anonymous,
            ..ApiAuth::default()
        }
    }

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn bearer_token_must_match() {
        let mut a = auth(&["s3cret", "other"], false);
        let now = Instant::now();
        assert_eq!(a.check(now, PEER, Some(b"Bearer s3cret")), Verdict::Allowed);
        assert_eq!(a.check(now, PEER, Some(b"Bearer other")), Verdict::Allowed);
        assert_eq!(
            a.check(now, PEER, Some(b"Bearer s3cre")),
            Verdict::Unauthorized
        );
        assert_eq!(
            a.check(now, PEER, Some(b"Basic s3cret")),
            Verdict::Unauthorized
        );
        assert_eq!(a.check(now, PEER, None), Verdict::Unauthorized);
        assert_eq!(a.figures.failures, 3);
    }

    #[test]
    fn anonymous_only_when_allowed() {
        let now = Instant::now();
        assert_eq!(auth(&[], true).check(now, PEER, None), Verdict::Allowed);
        assert_eq!(
            auth(&[], false).check(now, PEER, None),
            Verdict::Unauthorized
        );
        // A wrong token is wrong even where anonymous access is allowed.
        assert_eq!(
            auth(&["t"], true).check(now, PEER, Some(b"Bearer x")),
            Verdict::Unauthorized
        );
    }

    #[test]
    fn failures_throttle_then_expire() {
        let mut a = auth(&["good"], false);
        let t0 = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert_eq!(
                a.check(t0, PEER, Some(b"Bearer bad")),
                Verdict::Unauthorized
            );
        }
        // Throttled even with the right token until the window ends.
        assert_eq!(a.check(t0, PEER, Some(b"Bearer good")), Verdict::Throttled);
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(a.check(t0, other, Some(b"Bearer good")), Verdict::Allowed);
        assert_eq!(
            a.check(t0 + WINDOW, PEER, Some(b"Bearer good")),
            Verdict::Allowed
        );
        assert_eq!(a.figures.throttled, 1);
    }

    #[test]
    fn failure_table_is_bounded() {
        let mut a = auth(&["good"], false);
        let now = Instant::now();
        for i in 0..(MAX_TRACKED as u32 + 100) {
            let ip = IpAddr::from((i + 1).to_be_bytes());
            a.check(now, ip, None);
        }
        assert!(a.failures.len() <= MAX_TRACKED + 1);
        assert!(a.figures.evictions >= 100);
    }

    #[test]
    fn tokens_file_lines_and_errors() {
        let dir = std::env::temp_dir().join(format!("zerofan-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t");
        std::fs::write(&p, "# ops\n\n  abc  \ndef\n").unwrap();
        let t = read_tokens(&p).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(&*t[0], b"abc");
        std::fs::write(&p, "abc\ntwo words\n").unwrap();
        let e = read_tokens(&p).unwrap_err();
        assert!(e.contains(":2:"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

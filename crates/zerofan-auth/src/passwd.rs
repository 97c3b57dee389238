//! mosquitto password files: parse, verify, edit, write back.
//!
//! # Format (as mosquitto 2.x reads and `mosquitto_passwd` writes it)
//!
//! One entry per line, `USERNAME:HASH`. Lines starting with `#` and blank
//! lines are kept as they are. `HASH` is one of:
//!
//! - `$7$ITERATIONS$SALT$DIGEST` — PBKDF2-HMAC-SHA512 over the password
//!   bytes with `ITERATIONS` rounds, 64-byte output. This is what
//!   `mosquitto_passwd` writes by default since 2.0 (2.0.x: 101 iterations,
//!   12-byte salt; 2.1: 1000 iterations, 64-byte salt).
//! - `$6$SALT$DIGEST` — the pre-2.0 format: SHA-512 of the password bytes
//!   followed by the salt bytes.
//!
//! `SALT` and `DIGEST` are standard base64 (`+/` alphabet, `=` padding, no
//! line breaks). The salt decodes to 12 or 64 bytes, the digest to 64 bytes
//! — the same checks as mosquitto's `pw__decode_sha512*`.
//!
//! # Differences from mosquitto, on purpose
//!
//! mosquitto logs and drops an entry it cannot decode and keeps going; here
//! [`PasswordFile::parse`] refuses the whole file and says which line, so
//! `zerofan --test-config` catches a broken file before clients do. The same
//! goes for a plaintext password (mosquitto built with TLS, as Debian's is,
//! refuses those too), an unknown hash type (`$argon2id$` from mosquitto
//! 2.1 built with argon2 is not supported) and a user listed twice.
//!
//! mosquitto hashes the password as a C string (up to the first NUL byte);
//! [`PasswordFile::verify`] hashes all the bytes the client sent.
//!
//! # Entries written here
//!
//! [`PasswordFile::set`] writes `$7$` with [`DEFAULT_ITERATIONS`] rounds and
//! a 12-byte salt from the operating system's random source: the salt length
//! every mosquitto 2.x accepts, the iteration count mosquitto 2.1 uses.

use std::collections::HashMap;
use std::fmt;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

use crate::error::{numbered_lines, shown, ParseError};

/// PBKDF2 rounds used by [`PasswordFile::set`] (mosquitto 2.1's default).
pub const DEFAULT_ITERATIONS: u32 = 1000;

/// PBKDF2 rounds of a new `SCRAM-SHA-256$` entry (RFC 7677's example and
/// PostgreSQL's default).
pub const SCRAM_SHA256_ITERATIONS: u32 = 4096;

/// Salt length used by [`PasswordFile::set`] (mosquitto 2.0's, which only
/// accepts 12; 2.1 accepts 12 and 64).
pub const SALT_LEN: usize = 12;

/// Length of a SHA-512 / PBKDF2-SHA512 digest.
pub const DIGEST_LEN: usize = 64;

/// Largest PBKDF2 iteration count accepted. mosquitto has no limit, but an
/// entry far above what `mosquitto_passwd` writes (101 or 1000) would make
/// every login of that user hold the broker for seconds (10,000,000 rounds
/// took about 19 s in the measurement quoted at
/// [`PasswordFile::verify`]); it is almost certainly a typo or an attack on
/// the broker, so parsing refuses it.
pub const MAX_ITERATIONS: u32 = 10_000_000;

/// Standard alphabet, writes padding, reads with or without it.
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// One stored password hash.
#[derive(Clone, PartialEq, Eq)]
pub enum PasswordHash {
    /// `$6$`: SHA-512(password ‖ salt).
    Sha512 {
        /// The salt (12 or 64 bytes).
        salt: Vec<u8>,
        /// The digest.
        digest: [u8; DIGEST_LEN],
    },
    /// `$7$`: PBKDF2-HMAC-SHA512(password, salt, iterations).
    Pbkdf2Sha512 {
        /// PBKDF2 rounds (at least 1).
        iterations: u32,
        /// The salt (12 or 64 bytes).
        salt: Vec<u8>,
        /// The derived key.
        digest: [u8; DIGEST_LEN],
    },
    /// `SCRAM-SHA-256$ITERATIONS:SALT$STOREDKEY:SERVERKEY`, the form
    /// PostgreSQL stores: SCRAM-SHA-256 credentials (RFC 7677), which a
    /// SHA-512 entry cannot provide. zerofan's own; mosquitto does not read
    /// such entries.
    ScramSha256 {
        /// PBKDF2 rounds (at least 1).
        iterations: u32,
        /// The salt (8 to 64 bytes).
        salt: Vec<u8>,
        /// H(HMAC(SaltedPassword, "Client Key")).
        stored_key: [u8; 32],
        /// HMAC(SaltedPassword, "Server Key").
        server_key: [u8; 32],
    },
}

impl fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print digests into logs.
        match self {
            PasswordHash::Sha512 { salt, .. } => f
                .debug_struct("Sha512")
                .field("salt_len", &salt.len())
                .finish_non_exhaustive(),
            PasswordHash::Pbkdf2Sha512 {
                iterations, salt, ..
            } => f
                .debug_struct("Pbkdf2Sha512")
                .field("iterations", iterations)
                .field("salt_len", &salt.len())
                .finish_non_exhaustive(),
            PasswordHash::ScramSha256 {
                iterations, salt, ..
            } => f
                .debug_struct("ScramSha256")
                .field("iterations", iterations)
                .field("salt_len", &salt.len())
                .finish_non_exhaustive(),
        }
    }
}

impl PasswordHash {
    /// Parse the part after `USERNAME:` (`$7$…`, `$6$…` or
    /// `SCRAM-SHA-256$…`).
    pub fn parse(s: &str) -> Result<PasswordHash, String> {
        let s = s.trim_matches([' ', '\t']);
        if s.is_empty() {
            return Err("empty password hash".into());
        }
        if let Some(rest) = s.strip_prefix("SCRAM-SHA-256$") {
            return parse_scram_sha256(rest);
        }
        if !s.starts_with('$') {
            return Err(
                "password is not hashed (plaintext entries are not accepted; run `mosquitto_passwd -U FILE` or `zerofan passwd`)"
                    .into(),
            );
        }
        if s.starts_with("$argon2") {
            return Err("argon2 password hashes are not supported; use $7$ (PBKDF2-SHA512)".into());
        }
        let mut parts = s[1..].split('$');
        let kind = parts.next().unwrap_or("");
        match kind {
            "7" => {
                let (Some(iter), Some(salt), Some(digest), None) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    return Err("a $7$ hash has the form $7$ITERATIONS$SALT$HASH".into());
                };
                let iterations = parse_iterations(iter)?;
                let salt = decode_salt(salt)?;
                let digest = decode_digest(digest)?;
                Ok(PasswordHash::Pbkdf2Sha512 {
                    iterations,
                    salt,
                    digest,
                })
            }
            "6" => {
                let (Some(salt), Some(digest), None) = (parts.next(), parts.next(), parts.next())
                else {
                    return Err("a $6$ hash has the form $6$SALT$HASH".into());
                };
                let salt = decode_salt(salt)?;
                let digest = decode_digest(digest)?;
                Ok(PasswordHash::Sha512 { salt, digest })
            }
            other => Err(format!(
                "unknown password hash type {} (expected $6$, $7$ or SCRAM-SHA-256$)",
                shown(&format!("${other}$"))
            )),
        }
    }

    /// A new `$7$` hash of `password` with a fresh random salt.
    pub fn new_pbkdf2(password: &[u8], iterations: u32) -> Result<PasswordHash, PasswdError> {
        if iterations == 0 || iterations > MAX_ITERATIONS {
            return Err(PasswdError::InvalidIterations);
        }
        let mut salt = vec![0u8; SALT_LEN];
        getrandom::fill(&mut salt).map_err(|e| PasswdError::Random(e.to_string()))?;
        let digest = pbkdf2_sha512(password, &salt, iterations);
        Ok(PasswordHash::Pbkdf2Sha512 {
            iterations,
            salt,
            digest,
        })
    }

    /// A new `SCRAM-SHA-256$` entry for `password` with a fresh random
    /// 16-byte salt (PostgreSQL's length).
    pub fn new_scram_sha256(password: &[u8], iterations: u32) -> Result<PasswordHash, PasswdError> {
        if iterations == 0 || iterations > MAX_ITERATIONS {
            return Err(PasswdError::InvalidIterations);
        }
        let mut salt = vec![0u8; 16];
        getrandom::fill(&mut salt).map_err(|e| PasswdError::Random(e.to_string()))?;
        let (stored_key, server_key) = scram_sha256_keys(password, &salt, iterations);
        Ok(PasswordHash::ScramSha256 {
            iterations,
            salt,
            stored_key,
            server_key,
        })
    }

    /// Whether `password` hashes to this digest (constant-time comparison).
    pub fn verify(&self, password: &[u8]) -> bool {
        match self {
            PasswordHash::Sha512 { salt, digest } => {
                sha512_salted(password, salt).ct_eq(digest).into()
            }
            PasswordHash::Pbkdf2Sha512 {
                iterations,
                salt,
                digest,
            } => pbkdf2_sha512(password, salt, *iterations)
                .ct_eq(digest)
                .into(),
            PasswordHash::ScramSha256 {
                iterations,
                salt,
                stored_key,
                ..
            } => scram_sha256_keys(password, salt, *iterations)
                .0
                .ct_eq(stored_key)
                .into(),
        }
    }
}

impl fmt::Display for PasswordHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PasswordHash::Sha512 { salt, digest } => {
                write!(f, "$6${}${}", B64.encode(salt), B64.encode(digest))
            }
            PasswordHash::Pbkdf2Sha512 {
                iterations,
                salt,
                digest,
            } => write!(
                f,
                "$7${iterations}${}${}",
                B64.encode(salt),
                B64.encode(digest)
            ),
            PasswordHash::ScramSha256 {
                iterations,
                salt,
                stored_key,
                server_key,
            } => write!(
                f,
                "SCRAM-SHA-256${iterations}:{}${}:{}",
                B64.encode(salt),
                B64.encode(stored_key),
                B64.encode(server_key)
            ),
        }
    }
}

fn decode_salt(s: &str) -> Result<Vec<u8>, String> {
    let salt = B64
        .decode(s)
        .map_err(|e| format!("salt is not valid base64 ({e})"))?;
    if salt.len() != 12 && salt.len() != 64 {
        return Err(format!(
            "salt decodes to {} bytes, expected 12 or 64",
            salt.len()
        ));
    }
    Ok(salt)
}

fn decode_digest(s: &str) -> Result<[u8; DIGEST_LEN], String> {
    let digest = B64
        .decode(s)
        .map_err(|e| format!("hash is not valid base64 ({e})"))?;
    digest
        .as_slice()
        .try_into()
        .map_err(|_| format!("hash decodes to {} bytes, expected 64", digest.len()))
}

/// PBKDF2 rounds: at least 1, at most [`MAX_ITERATIONS`].
fn parse_iterations(iter: &str) -> Result<u32, String> {
    let iterations: u32 = iter
        .parse()
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| format!("invalid iteration count {}", shown(iter)))?;
    if iterations > MAX_ITERATIONS {
        return Err(format!(
            "iteration count {iterations} is above the limit of {MAX_ITERATIONS}"
        ));
    }
    Ok(iterations)
}

/// `ITERATIONS:SALT$STOREDKEY:SERVERKEY`, after `SCRAM-SHA-256$`.
fn parse_scram_sha256(s: &str) -> Result<PasswordHash, String> {
    const FORM: &str =
        "a SCRAM-SHA-256 entry has the form SCRAM-SHA-256$ITERATIONS:SALT$STOREDKEY:SERVERKEY";
    let Some((params, keys)) = s.split_once('$') else {
        return Err(FORM.into());
    };
    let (Some((iter, salt)), Some((stored, server))) =
        (params.split_once(':'), keys.split_once(':'))
    else {
        return Err(FORM.into());
    };
    let iterations = parse_iterations(iter)?;
    let salt = B64
        .decode(salt)
        .map_err(|e| format!("salt is not valid base64 ({e})"))?;
    if !(8..=64).contains(&salt.len()) {
        return Err(format!(
            "salt decodes to {} bytes, expected 8 to 64",
            salt.len()
        ));
    }
    let key = |k: &str, what: &str| -> Result<[u8; 32], String> {
        let v = B64
            .decode(k)
            .map_err(|e| format!("{what} is not valid base64 ({e})"))?;
        v.as_slice()
            .try_into()
            .map_err(|_| format!("{what} decodes to {} bytes, expected 32", v.len()))
    };
    Ok(PasswordHash::ScramSha256 {
        iterations,
        salt,
        stored_key: key(stored, "StoredKey")?,
        server_key: key(server, "ServerKey")?,
    })
}

/// SCRAM-SHA-256's StoredKey and ServerKey for a password (RFC 5802 §3).
fn scram_sha256_keys(password: &[u8], salt: &[u8], iterations: u32) -> ([u8; 32], [u8; 32]) {
    use hmac::{Hmac, Mac};
    let mut salted = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut salted);
    let mac = |data: &[u8]| -> [u8; 32] {
        // HMAC takes keys of any length: this cannot fail.
        let Ok(mut m) = Hmac::<Sha256>::new_from_slice(&salted) else {
            return [0; 32];
        };
        m.update(data);
        m.finalize().into_bytes().into()
    };
    let client_key = mac(b"Client Key");
    (Sha256::digest(client_key).into(), mac(b"Server Key"))
}

fn pbkdf2_sha512(password: &[u8], salt: &[u8], iterations: u32) -> [u8; DIGEST_LEN] {
    let mut out = [0u8; DIGEST_LEN];
    pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
    out
}

fn sha512_salted(password: &[u8], salt: &[u8]) -> [u8; DIGEST_LEN] {
    let mut h = Sha512::new();
    h.update(password);
    h.update(salt);
    h.finalize().into()
}

/// Why an edit of a password file was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PasswdError {
    /// The username cannot be written to a password file.
    #[error("invalid username {0:?}: it must be non-empty, contain no ':' and no line break, not start with '#', and have no leading or trailing blanks")]
    InvalidUsername(String),
    /// Iterations must be from 1 to [`MAX_ITERATIONS`].
    #[error("PBKDF2 iterations must be from 1 to 10000000")]
    InvalidIterations,
    /// The operating system's random source failed.
    #[error("cannot get random bytes for a salt: {0}")]
    Random(String),
}

#[derive(Clone, Debug)]
enum Line {
    /// A comment or blank line, kept verbatim.
    Other(String),
    /// An entry: index into `entries`.
    Entry(usize),
}

#[derive(Clone, Debug)]
struct Entry {
    username: String,
    hash: PasswordHash,
    removed: bool,
}

/// A parsed password file.
///
/// Lookups are by exact (case-sensitive) username, as in mosquitto.
#[derive(Clone, Debug, Default)]
pub struct PasswordFile {
    lines: Vec<Line>,
    entries: Vec<Entry>,
    index: HashMap<String, usize>,
}

impl PasswordFile {
    /// An empty password file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parse a password file. Errors name the line and what is wrong with
    /// it; see the module documentation for what is refused.
    pub fn parse(text: &str) -> Result<PasswordFile, ParseError> {
        let mut file = PasswordFile::new();
        let mut first_line: HashMap<String, usize> = HashMap::new();
        let mut lines: Vec<(usize, &str)> = numbered_lines(text).collect();
        // A final newline does not make an extra (empty) line.
        if text.ends_with('\n') || text.is_empty() {
            lines.pop();
        }
        for (n, line) in lines {
            let trimmed = line.trim_matches([' ', '\t']);
            if trimmed.is_empty() || trimmed.starts_with('#') {
                file.lines.push(Line::Other(line.to_string()));
                continue;
            }
            let Some((user, rest)) = line.split_once(':') else {
                return Err(ParseError::new(
                    n,
                    "expected USERNAME:HASH (no ':' on this line)",
                ));
            };
            let user = user.trim_matches([' ', '\t']);
            if user.is_empty() {
                return Err(ParseError::new(n, "empty username"));
            }
            if user.len() > 65535 {
                return Err(ParseError::new(n, "username longer than 65535 bytes"));
            }
            if let Some(prev) = first_line.get(user) {
                return Err(ParseError::new(
                    n,
                    format!("user {} is already defined on line {prev}", shown(user)),
                ));
            }
            let hash = PasswordHash::parse(rest)
                .map_err(|e| ParseError::new(n, format!("user {}: {e}", shown(user))))?;
            first_line.insert(user.to_string(), n);
            file.push_entry(user.to_string(), hash);
        }
        Ok(file)
    }

    fn push_entry(&mut self, username: String, hash: PasswordHash) {
        let i = self.entries.len();
        self.index.insert(username.clone(), i);
        self.entries.push(Entry {
            username,
            hash,
            removed: false,
        });
        self.lines.push(Line::Entry(i));
    }

    /// Whether `user` may log in with `password`.
    ///
    /// The digest comparison is constant-time. For an unknown user a hash is
    /// still computed (with the first entry's parameters), so the answer
    /// takes about as long as for a known user.
    ///
    /// Cost: one PBKDF2 run of the entry's iteration count; measured in a
    /// release build on the 2-core development machine while it was busy:
    /// 0.25 ms for mosquitto 2.0's 101 iterations, 1.9 ms for 1000. A
    /// broker with many logins per second may want to run it off the
    /// event loop (and keep [`crate::FailureTracker`] in front of it).
    pub fn verify(&self, user: &str, password: &[u8]) -> bool {
        match self.get(user) {
            Some(hash) => hash.verify(password),
            None => {
                // Spend the time a real entry would, so response time does
                // not tell which usernames exist: hash against the first
                // entry's parameters (files are usually homogeneous).
                match self.entries.iter().find(|e| !e.removed) {
                    Some(e) => {
                        let _ = e.hash.verify(password);
                    }
                    None => {
                        let _ = pbkdf2_sha512(password, &[0u8; SALT_LEN], DEFAULT_ITERATIONS);
                    }
                }
                false
            }
        }
    }

    /// The stored hash of `user`.
    pub fn get(&self, user: &str) -> Option<&PasswordHash> {
        let &i = self.index.get(user)?;
        Some(&self.entries[i].hash)
    }

    /// Whether `user` has an entry.
    pub fn contains(&self, user: &str) -> bool {
        self.index.contains_key(user)
    }

    /// The usernames, in file order.
    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.entries
            .iter()
            .filter(|e| !e.removed)
            .map(|e| e.username.as_str())
    }

    /// Number of users.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether there are no users.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Add `user` or change its password: a new `$7$` entry with
    /// [`DEFAULT_ITERATIONS`] rounds and a random salt. An existing entry
    /// keeps its place in the file.
    pub fn set(&mut self, user: &str, password: &[u8]) -> Result<(), PasswdError> {
        self.set_with_iterations(user, password, DEFAULT_ITERATIONS)
    }

    /// [`set`](Self::set) with a chosen PBKDF2 iteration count. Every login
    /// costs this many HMAC-SHA512 rounds on the broker.
    pub fn set_with_iterations(
        &mut self,
        user: &str,
        password: &[u8],
        iterations: u32,
    ) -> Result<(), PasswdError> {
        validate_username(user)?;
        let hash = PasswordHash::new_pbkdf2(password, iterations)?;
        self.set_hash(user, hash)
    }

    /// Set `user`'s password as a `SCRAM-SHA-256$` entry (for SCRAM-SHA-256
    /// logins; mosquitto cannot read such an entry).
    pub fn set_scram_sha256(
        &mut self,
        user: &str,
        password: &[u8],
        iterations: u32,
    ) -> Result<(), PasswdError> {
        validate_username(user)?;
        let hash = PasswordHash::new_scram_sha256(password, iterations)?;
        self.set_hash(user, hash)
    }

    /// Store a ready-made hash for `user` (add or replace).
    pub fn set_hash(&mut self, user: &str, hash: PasswordHash) -> Result<(), PasswdError> {
        validate_username(user)?;
        match self.index.get(user) {
            Some(&i) => self.entries[i].hash = hash,
            None => self.push_entry(user.to_string(), hash),
        }
        Ok(())
    }

    /// Delete `user`; returns whether it was there.
    pub fn remove(&mut self, user: &str) -> bool {
        match self.index.remove(user) {
            Some(i) => {
                self.entries[i].removed = true;
                true
            }
            None => false,
        }
    }
}

/// Whether `user` can be stored in a password file (see [`PasswdError`]).
pub fn validate_username(user: &str) -> Result<(), PasswdError> {
    let ok = !user.is_empty()
        && user.len() <= 65535
        && !user.contains([':', '\n', '\r', '\0'])
        && !user.starts_with('#')
        && user.trim_matches([' ', '\t']) == user;
    if ok {
        Ok(())
    } else {
        Err(PasswdError::InvalidUsername(user.to_string()))
    }
}

impl fmt::Display for PasswordFile {
    /// The file as text: comments and blank lines where they were, one
    /// `USERNAME:HASH` line per user, every line ending in `\n`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            match line {
                Line::Other(s) => writeln!(f, "{s}")?,
                Line::Entry(i) => {
                    let e = &self.entries[*i];
                    if !e.removed {
                        writeln!(f, "{}:{}", e.username, e.hash)?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Produced by Debian's mosquitto_passwd 2.0.11: `mosquitto_passwd -c -b FILE user pass`.
    const DEBIAN_LINE: &str = "user:$7$101$1Y7bkjmp8UoRAVp3$OXbIJeQDqAy0gTZYcyUEpSX6O/siR9jdItbctxSWLrszY6qdIpoNp/JOVcBLrhKXap8a8mZflhOohoWBe2vHDA==";

    #[test]
    fn debian_fixture_verifies() {
        let f = PasswordFile::parse(DEBIAN_LINE).unwrap();
        assert!(f.verify("user", b"pass"));
        assert!(!f.verify("user", b"Pass"));
        assert!(!f.verify("user", b""));
        assert!(!f.verify("nobody", b"pass"));
        assert_eq!(format!("{f}"), format!("{DEBIAN_LINE}\n"));
    }

    #[test]
    fn errors_name_the_line() {
        let e = PasswordFile::parse("# c\n\nbob\n").unwrap_err();
        assert_eq!(e.line, 3);
        let e = PasswordFile::parse("a:$7$0$AAAAAAAAAAAAAAAA$x\n").unwrap_err();
        assert!(e.message.contains("iteration"), "{e}");
        let e = PasswordFile::parse(&DEBIAN_LINE.replace("$101$", "$10000001$")).unwrap_err();
        assert!(e.message.contains("limit"), "{e}");
        let e = PasswordFile::parse("a:plain\n").unwrap_err();
        assert!(e.message.contains("not hashed"), "{e}");
        let e = PasswordFile::parse(&format!("{DEBIAN_LINE}\n{DEBIAN_LINE}\n")).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("line 1"), "{e}");
    }

    #[test]
    fn set_roundtrips() {
        let mut f = PasswordFile::new();
        f.set("alice", b"s3cret").unwrap();
        let text = f.to_string();
        assert!(text.starts_with("alice:$7$1000$"), "{text}");
        let g = PasswordFile::parse(&text).unwrap();
        assert!(g.verify("alice", b"s3cret"));
        assert!(!g.verify("alice", b"s3cre"));
        assert!(f.set("bad:name", b"x").is_err());
        assert!(f.set("#x", b"x").is_err());
    }
}

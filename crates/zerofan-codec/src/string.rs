//! `MqttStr`: a validated MQTT UTF-8 string that shares the buffer it was decoded from.

use bytes::Bytes;
use bytestring::ByteString;
use std::fmt;

/// A UTF-8 string as MQTT defines it (§1.5.4): valid UTF-8, no U+0000, at most
/// 65,535 bytes. (Rust's `str` cannot hold surrogates, so that rule is kept by
/// UTF-8 validation itself.)
///
/// Invariant: the bytes are always valid UTF-8 without U+0000. Decoding slices
/// the input `Bytes`, so a topic name costs a refcount, never a copy.
///
/// Held as a [`ByteString`] (`Bytes` known to be UTF-8), so reading the
/// `&str` is free: the broker reads a topic many times per message (routing,
/// ACL checks, one header per subscriber), and re-validating UTF-8 on each
/// read cost about 5% of its CPU. The one `unsafe` conversion lives in
/// `bytestring`; this crate stays free of it.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MqttStr(ByteString);

/// Why bytes were refused as an MQTT string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StrError {
    /// Not valid UTF-8 (this includes encoded surrogates).
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    /// Contains the null character U+0000, which MQTT forbids.
    #[error("string contains U+0000")]
    NullChar,
    /// Longer than the 65,535 bytes a two-byte length prefix can say.
    #[error("string longer than 65535 bytes")]
    TooLong,
}

impl MqttStr {
    /// The empty string.
    pub const fn new() -> Self {
        Self(ByteString::new())
    }

    /// A string from a static literal. Panics at compile-time-like speed on a
    /// literal that breaks the rules; only for constants the program owns.
    pub fn from_static(s: &'static str) -> Self {
        assert!(
            s.len() <= 65535 && !s.contains('\0'),
            "invalid static MQTT string"
        );
        Self(ByteString::from_static(s))
    }

    /// Validate `bytes` and wrap them without copying.
    pub fn from_bytes(bytes: Bytes) -> Result<Self, StrError> {
        validate(&bytes)?;
        ByteString::try_from(bytes)
            .map(Self)
            .map_err(|_| StrError::InvalidUtf8)
    }

    /// Wrap bytes the caller has already checked with [`validate`] (or
    /// found to be plain ASCII). `ByteString` checks UTF-8 once more, which
    /// cannot fail here and costs little next to the decode.
    pub(crate) fn from_validated(bytes: Bytes) -> Self {
        debug_assert!(validate(&bytes).is_ok());
        Self(ByteString::try_from(bytes).unwrap_or_default())
    }

    /// The string: free, the bytes were checked once at construction.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The underlying shared bytes.
    pub fn as_bytes(&self) -> &Bytes {
        self.0.as_bytes()
    }

    /// Give up the wrapper, keeping the shared bytes.
    pub fn into_bytes(self) -> Bytes {
        self.0.into_bytes()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for the empty string.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Check MQTT string rules on raw bytes.
pub fn validate(b: &[u8]) -> Result<(), StrError> {
    if b.len() > 65535 {
        return Err(StrError::TooLong);
    }
    // Fast path: ASCII without NUL (every byte in 1..=0x7F), checked
    // without early exit so it vectorises.
    let mut bad = 0u8;
    let mut chunks = b.chunks_exact(16);
    for chunk in &mut chunks {
        for &c in chunk {
            bad |= u8::from(c.wrapping_sub(1) >= 0x7F);
        }
    }
    for &c in chunks.remainder() {
        bad |= u8::from(c.wrapping_sub(1) >= 0x7F);
    }
    if bad != 0 {
        return validate_slow(b);
    }
    Ok(())
}

#[cold]
fn validate_slow(b: &[u8]) -> Result<(), StrError> {
    if b.contains(&0) {
        return Err(StrError::NullChar);
    }
    std::str::from_utf8(b).map_err(|_| StrError::InvalidUtf8)?;
    Ok(())
}

impl TryFrom<String> for MqttStr {
    type Error = StrError;
    fn try_from(s: String) -> Result<Self, StrError> {
        Self::from_bytes(Bytes::from(s))
    }
}

impl TryFrom<&str> for MqttStr {
    type Error = StrError;
    fn try_from(s: &str) -> Result<Self, StrError> {
        Self::from_bytes(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl std::ops::Deref for MqttStr {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for MqttStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for MqttStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

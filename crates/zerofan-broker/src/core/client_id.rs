//! A session's client id, kept inside the session when it is short. Every
//! session holds one, and a `Box<str>` cost 16 bytes plus an allocation of
//! 16 or 32 (most ids are 8 to 23 bytes: MQTT 3.1.1 promises clients 23);
//! inline, an id of up to [`INLINE`] bytes costs 24 bytes and nothing
//! besides. A longer one is boxed as before.

use std::fmt;
use std::ops::Deref;

/// Bytes kept inline: what fits beside the enum's tag and a length byte in
/// 24 bytes, what the boxed form takes with its tag.
const INLINE: usize = 22;

#[derive(Clone)]
pub(crate) enum ClientId {
    /// `len` bytes of `bytes` (the rest zero), valid UTF-8: copied from a
    /// `str` and never changed.
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    Boxed(Box<str>),
}

impl From<&str> for ClientId {
    fn from(id: &str) -> Self {
        let Some(len) = u8::try_from(id.len())
            .ok()
            .filter(|&n| usize::from(n) <= INLINE)
        else {
            return ClientId::Boxed(id.into());
        };
        let mut bytes = [0; INLINE];
        bytes[..id.len()].copy_from_slice(id.as_bytes());
        ClientId::Inline { len, bytes }
    }
}

impl Deref for ClientId {
    type Target = str;

    #[inline]
    fn deref(&self) -> &str {
        match self {
            ClientId::Inline { len, bytes } => {
                let bytes = bytes.get(..usize::from(*len)).unwrap_or_default();
                // Copied whole from a `str`, so it is UTF-8; the check costs
                // a few nanoseconds on at most 22 bytes and needs no
                // `unsafe`.
                std::str::from_utf8(bytes).unwrap_or_default()
            }
            ClientId::Boxed(s) => s,
        }
    }
}

impl PartialEq for ClientId {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for ClientId {}

impl fmt::Debug for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_comes_back_as_given_inline_or_boxed() {
        let long = "x".repeat(INLINE + 1);
        let ids = [
            "",
            "a",
            "dev-42",
            "zfb1a2b3c-conn12345",
            "ünïcödé-id",
            &long,
        ];
        for id in ids {
            let c = ClientId::from(id);
            assert_eq!(&*c, id);
            assert_eq!(c.to_string(), id);
            assert_eq!(format!("{c:?}"), format!("{id:?}"));
            assert_eq!(c, ClientId::from(id));
            assert_eq!(
                matches!(c, ClientId::Inline { .. }),
                id.len() <= INLINE,
                "{id}"
            );
        }
        assert_ne!(ClientId::from("a"), ClientId::from("b"));
        assert_eq!(
            &*ClientId::from("x".repeat(INLINE).as_str()),
            "x".repeat(INLINE)
        );
    }

    #[test]
    fn it_takes_what_a_boxed_id_took_inline() {
        assert_eq!(std::mem::size_of::<ClientId>(), 24);
    }
}

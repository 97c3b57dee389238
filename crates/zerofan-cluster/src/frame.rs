//! Node-to-node framing: a 4-byte big-endian length, then a JSON body. Every
//! connection opens with a [`Hello`] naming what it carries.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest hello or admin request accepted.
pub const SMALL_FRAME: usize = 64 * 1024;
/// Largest Raft RPC or admin reply (snapshot chunks are 1 MiB raw, a few
/// MiB as JSON).
pub const LARGE_FRAME: usize = 16 * 1024 * 1024;

/// What a node-to-node connection carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// openraft RPCs, request/response.
    Raft,
    /// Status and membership requests (CLI, join, forwarding to the leader).
    Admin,
    /// The broker's own node-to-node link, handed over untouched.
    Link,
}

/// First frame of every connection.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Hello {
    /// What follows.
    pub kind: Kind,
    /// Node id of the dialer (0: not a node, e.g. the CLI).
    #[serde(default)]
    pub from: u64,
}

/// Write one frame.
pub async fn write<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if body.len() > LARGE_FRAME {
        return Err(io::Error::other(format!(
            "cluster frame of {} bytes is over the {LARGE_FRAME}-byte limit",
            body.len()
        )));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf).await?;
    w.flush().await
}

/// Read one frame of at most `limit` bytes. Reads exactly the frame, so what
/// follows on the stream (a link's own bytes) stays unread.
pub async fn read<R: AsyncRead + Unpin, T: DeserializeOwned>(
    r: &mut R,
    limit: usize,
) -> io::Result<T> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("cluster frame of {len} bytes is over the {limit}-byte limit"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    serde_json::from_slice(&body).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad cluster frame: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_bad_ones_are_errors() {
        let mut buf = Vec::new();
        write(
            &mut buf,
            &Hello {
                kind: Kind::Link,
                from: 7,
            },
        )
        .await
        .unwrap();
        buf.extend_from_slice(b"rest");
        let mut r = &buf[..];
        let h: Hello = read(&mut r, SMALL_FRAME).await.unwrap();
        assert_eq!((h.kind, h.from), (Kind::Link, 7));
        assert_eq!(r, b"rest", "the bytes after the hello stay unread");

        let mut huge = Vec::new();
        huge.extend_from_slice(&(SMALL_FRAME as u32 + 1).to_be_bytes());
        let e = read::<_, Hello>(&mut &huge[..], SMALL_FRAME)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("over the"), "{e}");

        let mut junk = Vec::new();
        junk.extend_from_slice(&3u32.to_be_bytes());
        junk.extend_from_slice(b"{{{");
        let e = read::<_, Hello>(&mut &junk[..], SMALL_FRAME)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("bad cluster frame"), "{e}");
    }
}

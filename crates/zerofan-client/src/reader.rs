//! The read path: socket bytes land in a pooled buffer, complete packets are
//! cut out of it as `Bytes` slices (no copy) and decoded in place.
//!
//! When a packet is only partly in, the buffer is resized for the whole
//! packet at once (so a 50 MiB message is read into one exact allocation
//! that is freed when the application drops its payload), and a partial
//! tail left after the complete packets moves to a fresh buffer.

use bytes::Bytes;
use std::collections::VecDeque;
use tokio::io::{AsyncRead, AsyncReadExt};
use zerofan_codec::{frame, DecodeError, Frame, Packet, Protocol};
use zerofan_pool::{Pool, PooledBuf};

/// Size of a read buffer when no larger packet is expected.
pub(crate) const READ_SIZE: usize = 16 * 1024;
/// Size of a read buffer while the stream is busy: after a read that
/// filled its buffer (more was waiting than it could take), the next one
/// takes four times as much, until a read leaves room again. Fewer reads,
/// and fewer buffers (so fewer `ArrayBuffer`s in the Node.js binding) for
/// the same bytes; a quiet connection keeps reading into small buffers,
/// so that a message kept for long pins little memory.
pub(crate) const BUSY_READ_SIZE: usize = 64 * 1024;

pub(crate) struct Reader {
    pool: Pool,
    buf: Option<PooledBuf>,
    /// Size of the next read buffer: [`READ_SIZE`] or [`BUSY_READ_SIZE`].
    read_size: usize,
    /// Largest packet accepted (our Maximum Packet Size).
    max_packet: u32,
    /// The frozen read buffer the frames in `frames` were cut from (see
    /// [`crate::Message::read_buffer`]).
    frozen: Bytes,
    /// Complete frames in `frozen` not decoded yet, as byte ranges: one
    /// reference to the buffer for all of them, and each frame becomes a
    /// `Bytes` only when it is decoded.
    frames: VecDeque<(usize, usize)>,
}

impl Reader {
    pub fn new(pool: Pool, max_packet: u32) -> Self {
        Reader {
            pool,
            buf: None,
            read_size: READ_SIZE,
            max_packet,
            frozen: Bytes::new(),
            frames: VecDeque::new(),
        }
    }

    /// Forget everything buffered (a new connection starts clean).
    pub fn reset(&mut self) {
        self.buf = None;
        self.read_size = READ_SIZE;
        self.frozen = Bytes::new();
        self.frames.clear();
    }

    /// Read once from `rd`; `Ok(0)` is end of stream.
    pub async fn read<R: AsyncRead + Unpin>(&mut self, rd: &mut R) -> std::io::Result<usize> {
        let pool = &self.pool;
        let size = self.read_size;
        let b = self.buf.get_or_insert_with(|| pool.get(size));
        if b.remaining_capacity() == 0 {
            let want = b.len() * 2;
            grow(pool, b, want);
        }
        let n = rd.read_buf(b).await?;
        self.read_size = if n > 0 && b.remaining_capacity() == 0 {
            BUSY_READ_SIZE
        } else {
            READ_SIZE
        };
        Ok(n)
    }

    /// Cut every complete packet out of the buffer; whether any was cut.
    /// Cuts nothing while frames of the previous cut are not all decoded
    /// (decode them with [`Reader::next_packet`] first). Errors are fatal
    /// for the connection (bad framing, packet over our maximum size).
    pub fn split_frames(&mut self) -> Result<bool, DecodeError> {
        let Some(b) = self.buf.as_mut() else {
            return Ok(false);
        };
        match frame(&b[..], self.max_packet) {
            Frame::NeedMore(more) => {
                let want = b.len() + more;
                if b.capacity() < want {
                    grow(&self.pool, b, want);
                }
                return Ok(false);
            }
            Frame::Invalid(e) => return Err(e),
            Frame::Complete(_) => {}
        }
        if !self.frames.is_empty() {
            return Ok(false);
        }
        let Some(filled) = self.buf.take() else {
            return Ok(false);
        };
        let all = filled.freeze();
        let mut pos = 0;
        while pos < all.len() {
            match frame(&all[pos..], self.max_packet) {
                Frame::Complete(n) => {
                    self.frames.push_back((pos, pos + n));
                    pos += n;
                }
                Frame::NeedMore(more) => {
                    let tail = &all[pos..];
                    let mut nb = self.pool.get((tail.len() + more).max(self.read_size));
                    nb.extend_from_slice(tail);
                    self.buf = Some(nb);
                    break;
                }
                Frame::Invalid(e) => return Err(e),
            }
        }
        self.frozen = all;
        Ok(!self.frames.is_empty())
    }

    /// Decode the next complete packet, if any, with the frozen read buffer
    /// its frame (and so every slice decoded from it) lies in.
    pub fn next_packet(
        &mut self,
        protocol: Protocol,
    ) -> Option<Result<(Packet, Bytes), DecodeError>> {
        let Some((start, end)) = self.frames.pop_front() else {
            // Every frame decoded: let go of the buffer.
            self.frozen = Bytes::new();
            return None;
        };
        let f = self.frozen.slice(start..end);
        let src = if self.frames.is_empty() {
            // The last frame of the buffer: hand over our reference.
            std::mem::take(&mut self.frozen)
        } else {
            self.frozen.clone()
        };
        Some(zerofan_codec::decode(f, protocol).map(|p| (p, src)))
    }
}

/// Move `b`'s contents into a buffer of at least `want` bytes.
fn grow(pool: &Pool, b: &mut PooledBuf, want: usize) {
    let mut nb = pool.get(want);
    nb.extend_from_slice(b);
    *b = nb;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_split_across_reads_are_reassembled_without_copies() {
        let mut wire = Vec::new();
        for i in 0..50u32 {
            let p = Packet::Publish(zerofan_codec::Publish {
                topic: zerofan_codec::MqttStr::try_from("t").unwrap(),
                payload: Bytes::from(vec![i as u8; (i as usize) * 997]),
                ..Default::default()
            });
            let mut v = bytes::BytesMut::new();
            v.resize(zerofan_codec::encoded_len(&p, Protocol::V5).unwrap(), 0);
            let mut s: &mut [u8] = &mut v[..];
            zerofan_codec::encode(&p, Protocol::V5, &mut s).unwrap();
            wire.extend_from_slice(&v);
        }
        let (mut a, mut b) = tokio::io::duplex(1000);
        let w = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            a.write_all(&wire).await.unwrap();
        });
        let mut r = Reader::new(Pool::global().clone(), u32::MAX);
        let mut got = 0u32;
        while got < 50 {
            assert!(r.read(&mut b).await.unwrap() > 0);
            r.split_frames().unwrap();
            while let Some(p) = r.next_packet(Protocol::V5) {
                let (p, src) = p.unwrap();
                match p {
                    Packet::Publish(p) => {
                        // A payload is a slice of the buffer named with it.
                        if !p.payload.is_empty() {
                            let off = p.payload.as_ptr() as usize - src.as_ptr() as usize;
                            assert!(off + p.payload.len() <= src.len());
                            assert_eq!(&src[off..off + p.payload.len()], &p.payload[..]);
                        }
                        assert_eq!(p.payload.len(), got as usize * 997);
                        assert!(p.payload.iter().all(|&x| x == got as u8));
                        got += 1;
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        w.await.unwrap();
    }

    fn publish_bytes(topic: &str, body: &[u8]) -> Vec<u8> {
        let p = Packet::Publish(zerofan_codec::Publish {
            topic: zerofan_codec::MqttStr::try_from(topic).unwrap(),
            payload: Bytes::copy_from_slice(body),
            ..Default::default()
        });
        let mut v = vec![0u8; zerofan_codec::encoded_len(&p, Protocol::V5).unwrap()];
        let mut s: &mut [u8] = &mut v[..];
        zerofan_codec::encode(&p, Protocol::V5, &mut s).unwrap();
        v
    }

    #[tokio::test]
    async fn frames_left_undecoded_are_decoded_before_the_next_cut() {
        let mut wire = publish_bytes("a", b"one");
        wire.extend(publish_bytes("b", b"two"));
        let third = publish_bytes("c", b"three");
        let mut r = Reader::new(Pool::global().clone(), u32::MAX);
        let mut rd: &[u8] = &wire;
        r.read(&mut rd).await.unwrap();
        assert!(r.split_frames().unwrap(), "two frames cut");
        let (first, src) = r.next_packet(Protocol::V5).unwrap().unwrap();
        assert!(matches!(first, Packet::Publish(ref p) if p.payload == "one"));
        assert_eq!(src.len(), wire.len(), "the whole read buffer comes along");
        // A new read while one frame is pending: nothing is cut until it
        // is decoded, and nothing is lost.
        let mut rd: &[u8] = &third;
        r.read(&mut rd).await.unwrap();
        assert!(!r.split_frames().unwrap());
        let (second, _) = r.next_packet(Protocol::V5).unwrap().unwrap();
        assert!(matches!(second, Packet::Publish(ref p) if p.payload == "two"));
        assert!(r.next_packet(Protocol::V5).is_none());
        assert!(r.split_frames().unwrap());
        let (p3, src3) = r.next_packet(Protocol::V5).unwrap().unwrap();
        assert!(matches!(p3, Packet::Publish(ref p) if p.payload == "three"));
        assert_eq!(src3.len(), third.len());
        assert!(r.next_packet(Protocol::V5).is_none());
    }

    #[tokio::test]
    async fn a_read_that_fills_its_buffer_makes_the_next_one_bigger() {
        let wire = vec![0u8; READ_SIZE + BUSY_READ_SIZE + 100];
        let mut rd: &[u8] = &wire;
        let mut r = Reader::new(Pool::global().clone(), u32::MAX);
        let cap = |r: &Reader| r.buf.as_ref().map_or(0, |b| b.capacity());
        // The bytes are not frames; only the buffer sizes matter here, so
        // each filled buffer is dropped before the next read.
        let first = r.read(&mut rd).await.unwrap();
        assert!(
            first >= READ_SIZE && cap(&r) < BUSY_READ_SIZE,
            "a small buffer first"
        );
        r.buf = None;
        let second = r.read(&mut rd).await.unwrap();
        assert!(
            second >= BUSY_READ_SIZE,
            "it was full: a busy-size read ({second} B)"
        );
        r.buf = None;
        let third = r.read(&mut rd).await.unwrap();
        assert!(third < BUSY_READ_SIZE, "what was left");
        r.buf = None;
        let mut rest: &[u8] = &wire[..10];
        r.read(&mut rest).await.unwrap();
        assert!(cap(&r) < BUSY_READ_SIZE, "room left last time: small again");
    }
}

//! Building outgoing PUBLISH frames on the caller's side, and the memory
//! policy of the buffer they are built in.
//!
//! Simple mode encodes only the header; the payload `Bytes` travels as its
//! own iovec. Expert mode reserves room for the largest possible header,
//! lets the caller write the payload right after it, then writes the real
//! header (whose remaining length is now known) flush against the payload
//! and drops the unused prefix with an O(1) `advance`: the payload is
//! written once, where it is sent from.
//!
//! Frames are split off one shared `BytesMut`, so small publishes share an
//! allocation instead of paying one each. High-watermark policy: when the
//! allocation the builder writes into is larger than [`HIGH_WATER`] (a large
//! message went through), the builder lets go of it as soon as the frame is
//! split off, so the memory is freed when that frame has been sent (and, at
//! QoS 1/2, acknowledged), never kept for the next tiny message.

use crate::error::ClientError;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use zerofan_codec::{encode_publish_header, framing, Properties, Protocol, PublishHeader, QoS};

/// Capacity a fresh builder allocation starts with.
pub const INITIAL_CAPACITY: usize = 8 * 1024;
/// Allocations above this size are dropped by the builder after one frame.
pub const HIGH_WATER: usize = 256 * 1024;

/// Per-message options of a publish beyond topic, QoS and payload.
#[derive(Clone, Debug, Default)]
pub struct PublishOptions {
    /// RETAIN flag.
    pub retain: bool,
    /// PUBLISH properties (MQTT 5): message expiry, content type, response
    /// topic, correlation data, user properties, payload format. A topic
    /// alias or subscription identifiers set here are ignored.
    pub properties: Properties,
}

/// A PUBLISH ready to hand to the event loop. The packet identifier is a
/// placeholder patched in by the event loop at `pid_offset` (QoS 1/2).
#[derive(Debug)]
pub(crate) struct OutFrame {
    /// Fixed and variable header; in expert mode the payload too.
    pub head: BytesMut,
    /// The payload when it travels separately (simple mode), else empty.
    pub payload: Bytes,
    /// QoS of the message.
    pub qos: QoS,
    /// Offset of the two packet identifier bytes in `head` (QoS 1/2).
    pub pid_offset: usize,
}

impl OutFrame {
    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }
}

/// The shared buffer frames are built in (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct FrameBuilder {
    buf: BytesMut,
}

impl FrameBuilder {
    /// Capacity currently held by the builder (for tests and metrics).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    fn header<'a>(
        topic: &'a str,
        qos: QoS,
        opts: &'a PublishOptions,
        payload_len: usize,
    ) -> PublishHeader<'a> {
        PublishHeader {
            dup: false,
            qos,
            retain: opts.retain,
            packet_id: 1,
            topic,
            topic_alias: None,
            properties: &opts.properties,
            message_expiry_interval: opts.properties.message_expiry_interval,
            subscription_identifiers: &[],
            payload_len,
        }
    }

    fn ensure(&mut self, n: usize) {
        if self.buf.capacity() - self.buf.len() < n {
            self.buf.reserve(n.max(INITIAL_CAPACITY));
        }
    }

    /// Split the finished frame off and apply the high-watermark policy.
    fn take(&mut self, skip: usize) -> BytesMut {
        let big = self.buf.capacity() > HIGH_WATER;
        let mut frame = self.buf.split();
        frame.advance(skip);
        if big {
            self.buf = BytesMut::new();
        }
        frame
    }

    /// Simple mode: the header alone; `payload` is sent as it is.
    pub fn simple(
        &mut self,
        protocol: Protocol,
        topic: &str,
        qos: QoS,
        opts: &PublishOptions,
        payload: Bytes,
    ) -> Result<OutFrame, ClientError> {
        check_topic(topic)?;
        let h = Self::header(topic, qos, opts, payload.len());
        let hl = h.header_len(protocol)?;
        self.buf.clear();
        self.ensure(hl);
        encode_publish_header(&h, protocol, &mut self.buf)?;
        let head = self.take(0);
        Ok(OutFrame {
            pid_offset: pid_offset(&head, topic),
            head,
            payload,
            qos,
        })
    }

    /// Expert mode: `write` appends the payload straight into the frame.
    pub fn expert<F: FnOnce(&mut BytesMut)>(
        &mut self,
        protocol: Protocol,
        topic: &str,
        qos: QoS,
        opts: &PublishOptions,
        write: F,
    ) -> Result<OutFrame, ClientError> {
        check_topic(topic)?;
        // Header with an empty payload has a 1-byte remaining length; the
        // real one needs at most 3 more.
        let reserve = Self::header(topic, qos, opts, 0).header_len(protocol)? + 3;
        self.buf.clear();
        self.ensure(reserve);
        self.buf.put_bytes(0, reserve);
        write(&mut self.buf);
        let Some(payload_len) = self.buf.len().checked_sub(reserve) else {
            self.buf.clear();
            return Err(ClientError::Payload(
                "publish_with closure removed bytes it did not write",
            ));
        };
        let h = Self::header(topic, qos, opts, payload_len);
        let hl = h.header_len(protocol)?;
        let skip = reserve - hl;
        let mut dst: &mut [u8] = &mut self.buf[skip..reserve];
        encode_publish_header(&h, protocol, &mut dst)?;
        let head = self.take(skip);
        Ok(OutFrame {
            pid_offset: pid_offset(&head, topic),
            head,
            payload: Bytes::new(),
            qos,
        })
    }
}

fn check_topic(topic: &str) -> Result<(), ClientError> {
    zerofan_codec::topic::validate_topic_name(topic)
        .map_err(|e| ClientError::InvalidTopic(format!("{topic:?}: {e}")))
}

/// Offset of the packet identifier: fixed header, topic length, topic.
fn pid_offset(head: &[u8], topic: &str) -> usize {
    let n = match framing::read_varint(head.get(1..).unwrap_or(&[])) {
        Ok(Some((_, n))) => n,
        _ => 1,
    };
    1 + n + 2 + topic.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerofan_codec::{decode, Packet};

    fn roundtrip(f: OutFrame) -> zerofan_codec::Publish {
        let mut all = BytesMut::from(&f.head[..]);
        all.extend_from_slice(&f.payload);
        match decode(all.freeze(), Protocol::V5) {
            Ok(Packet::Publish(p)) => p,
            other => panic!("not a publish: {other:?}"),
        }
    }

    #[test]
    fn simple_and_expert_encode_the_same_packet() {
        let mut b = FrameBuilder::default();
        let opts = PublishOptions::default();
        for len in [0usize, 10, 127, 128, 16_383, 16_384, 300_000] {
            let payload = Bytes::from(vec![7u8; len]);
            let s = b
                .simple(
                    Protocol::V5,
                    "a/b",
                    QoS::AtLeastOnce,
                    &opts,
                    payload.clone(),
                )
                .unwrap();
            let e = b
                .expert(Protocol::V5, "a/b", QoS::AtLeastOnce, &opts, |buf| {
                    buf.put_slice(&payload)
                })
                .unwrap();
            assert_eq!(s.len(), e.len());
            assert_eq!(&e.head[e.pid_offset..e.pid_offset + 2], &[0, 1]);
            assert_eq!(&s.head[s.pid_offset..s.pid_offset + 2], &[0, 1]);
            let (ps, pe) = (roundtrip(s), roundtrip(e));
            assert_eq!(ps, pe);
            assert_eq!(pe.payload, payload);
        }
    }

    #[test]
    fn builder_lets_go_of_large_allocations() {
        let mut b = FrameBuilder::default();
        let opts = PublishOptions::default();
        let f = b
            .expert(Protocol::V311, "t", QoS::AtMostOnce, &opts, |buf| {
                buf.put_bytes(1, 5 << 20)
            })
            .unwrap();
        assert_eq!(f.head.len(), 1 + 4 + 3 + (5 << 20));
        assert!(b.capacity() < HIGH_WATER);
        for _ in 0..100 {
            b.expert(Protocol::V311, "t", QoS::AtMostOnce, &opts, |buf| {
                buf.put_slice(b"tiny")
            })
            .unwrap();
        }
        assert!(b.capacity() <= INITIAL_CAPACITY);
    }

    #[test]
    fn a_closure_that_truncates_the_buffer_is_an_error_not_a_panic() {
        let mut b = FrameBuilder::default();
        let r = b.expert(
            Protocol::V5,
            "t",
            QoS::AtLeastOnce,
            &PublishOptions::default(),
            |buf| buf.clear(),
        );
        assert!(matches!(r, Err(ClientError::Payload(_))));
        // The builder is still usable.
        let f = b
            .expert(
                Protocol::V5,
                "t",
                QoS::AtMostOnce,
                &PublishOptions::default(),
                |buf| buf.put_slice(b"ok"),
            )
            .unwrap();
        assert_eq!(roundtrip(f).payload, Bytes::from_static(b"ok"));
    }

    #[test]
    fn wildcards_are_refused() {
        let mut b = FrameBuilder::default();
        let r = b.simple(
            Protocol::V5,
            "a/+",
            QoS::AtMostOnce,
            &PublishOptions::default(),
            Bytes::new(),
        );
        assert!(matches!(r, Err(ClientError::InvalidTopic(_))));
    }
}

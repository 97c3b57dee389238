//! A received PUBLISH exactly as it arrived, for deliveries that can be
//! sent as those very bytes.

use super::message::Message;
use bytes::Bytes;
use zerofan_codec::{Protocol, PublishHeader, QoS};

/// Where a received PUBLISH sits in its read buffer.
///
/// Most deliveries of a QoS 0 message are byte for byte the packet the
/// publisher sent: QoS 0, no RETAIN, no DUP, the full topic, the same
/// properties. The writer then sends that part of the read buffer instead
/// of encoding a header and pointing at the payload, and packets that lay
/// one after the other in one read buffer, and go to the same subscriber,
/// leave as one iovec (see `shell/writer.rs`).
///
/// Invariant: `start < end <= buf.len()`, and once in a message,
/// `buf[start..end]` is, byte for byte, its plain delivery (see
/// [`Wire::verified`]): header followed by the payload, in
/// the encoding of MQTT 5 when `v5`, else of MQTT 3.1.1 (3.1 encodes a
/// PUBLISH alike). [`Wire::verified`] is the only way to get one into a
/// message.
#[derive(Clone, Debug)]
pub struct Wire {
    /// The whole frozen read buffer (the message's payload is a slice of
    /// the same allocation, so this pins nothing more).
    buf: Bytes,
    /// Where the packet starts in `buf`.
    start: u32,
    /// Where it ends.
    end: u32,
    /// Encoded for MQTT 5 (else for 3.1.1).
    v5: bool,
}

impl Wire {
    /// A candidate: the packet at `start..end` of `buf`. Only a QoS 0
    /// PUBLISH without RETAIN or DUP (first byte 0x30) can ever be sent as
    /// received, so the reader offers no other.
    pub fn candidate(buf: &Bytes, start: usize, end: usize) -> Option<Wire> {
        if buf.get(start) != Some(&0x30) || end > buf.len() || end <= start {
            return None;
        }
        Some(Wire {
            buf: buf.clone(),
            start: u32::try_from(start).ok()?,
            end: u32::try_from(end).ok()?,
            v5: false,
        })
    }

    /// The candidate, kept for `msg` only if its bytes are exactly the
    /// header of a plain delivery of `msg` (QoS 0, no RETAIN, no DUP, the
    /// full topic, no alias, no subscription identifier, no expiry; encoded
    /// into `scratch`, cleared first) followed by the payload. Whatever
    /// differs (a topic alias, an expiry, properties in another order, a
    /// longer length encoding) leaves the message without one: its
    /// deliveries are encoded as usual.
    pub fn verified(
        mut self,
        msg: &Message,
        protocol: Protocol,
        scratch: &mut bytes::BytesMut,
    ) -> Option<Wire> {
        let header = PublishHeader {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            packet_id: 0,
            topic: &msg.topic,
            topic_alias: None,
            properties: &msg.properties,
            message_expiry_interval: None,
            subscription_identifiers: &[],
            payload_len: msg.payload.len(),
        };
        scratch.clear();
        zerofan_codec::encode_publish_header(&header, protocol, scratch).ok()?;
        let packet = self.bytes();
        if packet.len() != scratch.len() + msg.payload.len() || !packet.starts_with(scratch) {
            return None;
        }
        self.v5 = protocol.is_v5();
        Some(self)
    }

    /// Encoded for MQTT 5 (else for 3.1.1 / 3.1).
    pub fn is_v5(&self) -> bool {
        self.v5
    }

    /// The read buffer and the packet's place in it, for a writer that
    /// joins packets lying one after the other into one chunk.
    pub fn span(&self) -> (&Bytes, usize, usize) {
        (&self.buf, self.start as usize, self.end as usize)
    }

    /// The packet's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start as usize..self.end as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerofan_codec::{Packet, Properties, Publish};

    fn encoded(p: Publish, protocol: Protocol) -> Bytes {
        let mut b = bytes::BytesMut::new();
        zerofan_codec::encode(&Packet::Publish(p), protocol, &mut b).unwrap();
        b.freeze()
    }

    /// The candidate of the whole of `buf`, verified for the message
    /// "a/b" = "hello" with `props` (as routed: per-hop ones cleared).
    fn check(buf: &Bytes, protocol: Protocol, props: &Properties) -> Option<Wire> {
        let p = Publish {
            topic: zerofan_codec::MqttStr::from_static("a/b"),
            payload: Bytes::from_static(b"hello"),
            properties: props.clone().into(),
            ..Publish::default()
        };
        let msg = Message::from_publish(p, None, std::time::Instant::now());
        let mut scratch = bytes::BytesMut::new();
        Wire::candidate(buf, 0, buf.len())?.verified(&msg, protocol, &mut scratch)
    }

    #[test]
    fn a_plain_qos0_publish_is_kept_for_both_encodings() {
        for protocol in [Protocol::V311, Protocol::V5] {
            let p = Publish {
                topic: zerofan_codec::MqttStr::from_static("a/b"),
                payload: Bytes::from_static(b"hello"),
                ..Publish::default()
            };
            let buf = encoded(p, protocol);
            let w = check(&buf, protocol, &Properties::default()).unwrap();
            assert_eq!(w.bytes(), &buf[..]);
            assert_eq!(w.is_v5(), protocol.is_v5());
        }
    }

    #[test]
    fn anything_per_hop_leaves_it_out() {
        let base = Publish {
            topic: zerofan_codec::MqttStr::from_static("a/b"),
            payload: Bytes::from_static(b"hello"),
            ..Publish::default()
        };
        // RETAIN, QoS 1: not even a candidate.
        for p in [
            Publish {
                retain: true,
                ..base.clone()
            },
            Publish {
                qos: QoS::AtLeastOnce,
                packet_id: 1,
                ..base.clone()
            },
        ] {
            let buf = encoded(p, Protocol::V5);
            assert!(Wire::candidate(&buf, 0, buf.len()).is_none());
        }
        // A topic alias or an expiry on the wire: the plain header differs.
        for props in [
            Properties {
                topic_alias: Some(1),
                ..Properties::default()
            },
            Properties {
                message_expiry_interval: Some(9),
                ..Properties::default()
            },
        ] {
            let buf = encoded(
                Publish {
                    properties: props.into(),
                    ..base.clone()
                },
                Protocol::V5,
            );
            assert!(check(&buf, Protocol::V5, &Properties::default()).is_none());
        }
        // A non-minimal remaining length (0x85 0x00 for 5 + ...): differs.
        let buf = encoded(base.clone(), Protocol::V311);
        let mut long = vec![buf[0], (buf[1] & 0x7f) | 0x80, 0x00];
        long.extend_from_slice(&buf[2..]);
        assert!(check(&Bytes::from(long), Protocol::V311, &Properties::default()).is_none());
    }

    #[test]
    fn empty_or_reversed_ranges_are_no_packet() {
        let buf = Bytes::from_static(&[0x30, 0, 0x30, 0]);
        assert_eq!(Wire::candidate(&buf, 2, 4).unwrap().span().1, 2);
        assert!(Wire::candidate(&buf, 2, 2).is_none());
        assert!(Wire::candidate(&buf, 2, 1).is_none());
        assert!(Wire::candidate(&buf, 1, 2).is_none(), "not a PUBLISH 0x30");
    }
}

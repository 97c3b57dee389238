//! An application message received from the broker.

use bytes::Bytes;
use zerofan_codec::{MqttStr, Props, Publish, QoS};

/// A PUBLISH delivered to this client. `topic` and `payload` are slices of
/// the pooled read buffer the packet arrived in: nothing was copied, and the
/// buffer returns to its pool when the last slice is dropped. Keep a small
/// payload for long? Copy it (`Bytes::copy_from_slice`) so that it does not
/// pin a whole read buffer.
///
/// [`Message::read_buffer`] names that read buffer, so that a consumer can
/// hand out one handle per buffer instead of one per payload (the Node.js
/// binding makes one `ArrayBuffer` per read buffer and batch, and each
/// payload a view into it). Equality and `Debug` ignore it: two messages
/// are equal when what the broker sent is equal.
#[derive(Clone)]
pub struct Message {
    /// Topic name (resolved when the broker used a topic alias).
    pub topic: MqttStr,
    /// Application payload.
    pub payload: Bytes,
    /// QoS the message was delivered with.
    pub qos: QoS,
    /// RETAIN flag: set for a retained message sent at subscribe time.
    pub retain: bool,
    /// DUP flag: the broker may have sent it before.
    pub dup: bool,
    /// PUBLISH properties (MQTT 5): subscription identifiers, user
    /// properties, content type, response topic, correlation data... One
    /// pointer, null when the broker sent none, so a `Message` stays small.
    pub properties: Props,
    /// The whole frozen read buffer the packet was cut from (a clone of the
    /// `Bytes` every slice of this packet shares: no copy, one reference).
    source: Option<Bytes>,
    /// With manual acknowledgements, what acknowledges this message.
    ack: Option<AckToken>,
}

/// Acknowledges one received QoS 1/2 message when handed to
/// [`crate::Client::ack`] (with [`crate::ClientOptions::manual_acks`]).
/// A token from an earlier connection is ignored: the broker sends an
/// unacknowledged message again on a resumed session, with a new token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckToken {
    pub(crate) connection: u32,
    pub(crate) packet_id: u16,
    pub(crate) qos: QoS,
}

impl Message {
    /// The topic as `&str`.
    pub fn topic(&self) -> &str {
        self.topic.as_str()
    }

    /// The pooled read buffer the payload was cut from, and the payload's
    /// offset in it: `payload == buffer[offset..offset + payload.len()]`,
    /// the same memory (`buffer.as_ptr() + offset == payload.as_ptr()`),
    /// not a copy. The buffer is the whole frozen read buffer: it also
    /// holds this packet's header and topic and the other packets that
    /// arrived with it (at most one read's worth: 16 KiB, 64 KiB while a
    /// busy stream fills every read, more only for a larger packet), so
    /// keeping it keeps all of them.
    ///
    /// `None` for an empty payload, and when `payload` no longer lies in
    /// the buffer (the field was replaced): the invariant is checked on
    /// each call, so it holds whenever `Some` is returned. Buffers are
    /// told apart by their address (`buffer.as_ptr()`, `buffer.len()`):
    /// messages that arrived in the same read share it.
    pub fn read_buffer(&self) -> Option<(&Bytes, usize)> {
        let src = self.source.as_ref()?;
        if self.payload.is_empty() {
            return None;
        }
        let start = src.as_ptr() as usize;
        let p = self.payload.as_ptr() as usize;
        let offset = p.checked_sub(start)?;
        let end = offset.checked_add(self.payload.len())?;
        (end <= src.len()).then_some((src, offset))
    }

    /// `topic`: the topic when it is not `p`'s own (resolved from a topic
    /// alias); `None` moves `p.topic` in.
    pub(crate) fn from_publish(p: Publish, topic: Option<MqttStr>, source: Bytes) -> Self {
        Message {
            topic: topic.unwrap_or(p.topic),
            payload: p.payload,
            qos: p.qos,
            retain: p.retain,
            dup: p.dup,
            properties: p.properties,
            source: Some(source),
            ack: None,
        }
    }

    /// What acknowledges this message, with manual acknowledgements on and
    /// QoS 1 or 2; `None` otherwise.
    pub fn ack_token(&self) -> Option<AckToken> {
        self.ack
    }

    pub(crate) fn set_ack(&mut self, token: AckToken) {
        self.ack = Some(token);
    }
}

impl PartialEq for Message {
    fn eq(&self, o: &Self) -> bool {
        self.topic == o.topic
            && self.payload == o.payload
            && self.qos == o.qos
            && self.retain == o.retain
            && self.dup == o.dup
            && self.properties == o.properties
    }
}

impl Eq for Message {}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("topic", &self.topic)
            .field("payload", &self.payload)
            .field("qos", &self.qos)
            .field("retain", &self.retain)
            .field("dup", &self.dup)
            .field("properties", &self.properties)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerofan_codec::{Packet, Protocol};

    /// Two PUBLISH packets back to back in one frozen buffer, decoded in
    /// place as the reader does.
    fn two_in_one_buffer() -> (Bytes, Vec<Message>) {
        let mut wire = Vec::new();
        for (t, body) in [("a/b", &b"first payload"[..]), ("c", &b"2nd"[..])] {
            let p = Packet::Publish(Publish {
                topic: MqttStr::try_from(t).unwrap(),
                payload: Bytes::copy_from_slice(body),
                ..Default::default()
            });
            let mut v = vec![0u8; zerofan_codec::encoded_len(&p, Protocol::V5).unwrap()];
            let mut s: &mut [u8] = &mut v[..];
            zerofan_codec::encode(&p, Protocol::V5, &mut s).unwrap();
            wire.extend_from_slice(&v);
        }
        let all = Bytes::from(wire);
        let mut pos = 0;
        let mut out = Vec::new();
        while pos < all.len() {
            let zerofan_codec::Frame::Complete(n) = zerofan_codec::frame(&all[pos..], u32::MAX)
            else {
                panic!("incomplete frame")
            };
            let Packet::Publish(p) =
                zerofan_codec::decode(all.slice(pos..pos + n), Protocol::V5).unwrap()
            else {
                panic!("not a PUBLISH")
            };
            out.push(Message::from_publish(p, None, all.clone()));
            pos += n;
        }
        (all, out)
    }

    #[test]
    fn read_buffer_names_the_memory_the_payload_is_in() {
        let (all, msgs) = two_in_one_buffer();
        assert_eq!(msgs.len(), 2);
        let mut last_end = 0;
        for m in &msgs {
            let (buf, off) = m.read_buffer().expect("a payload cut from a buffer");
            // The same buffer for both, the whole of it.
            assert_eq!(buf.as_ptr(), all.as_ptr());
            assert_eq!(buf.len(), all.len());
            // payload == buffer[off..off+len], and the same memory.
            assert_eq!(&buf[off..off + m.payload.len()], &m.payload[..]);
            assert_eq!(buf.as_ptr().wrapping_add(off), m.payload.as_ptr());
            // In arrival order, after the packet's header and topic.
            assert!(off > last_end);
            last_end = off + m.payload.len();
        }
        assert_eq!(last_end, all.len());
    }

    #[test]
    fn read_buffer_is_none_when_the_payload_is_not_in_it() {
        let (_, mut msgs) = two_in_one_buffer();
        let mut m = msgs.remove(0);
        let clone = m.clone();
        assert!(clone.read_buffer().is_some(), "a clone keeps the source");
        m.payload = Bytes::from_static(b"replaced");
        assert_eq!(m.read_buffer(), None);
        m.payload = Bytes::new();
        assert_eq!(m.read_buffer(), None, "empty payload");
        // Equality ignores where the bytes live.
        let mut other = clone.clone();
        other.source = None;
        assert_eq!(other, clone);
        assert!(!format!("{clone:?}").contains("source"));
    }

    /// A received message is moved several times between the socket and
    /// the application (decode, backlog, channel, batch): it stays small
    /// because its properties are one pointer, null when there are none.
    #[test]
    fn message_is_small_and_properties_are_not_allocated_when_absent() {
        assert!(
            std::mem::size_of::<Message>() <= 128,
            "Message is {} bytes",
            std::mem::size_of::<Message>()
        );
        let (_, msgs) = two_in_one_buffer();
        assert!(msgs.iter().all(|m| !m.properties.is_allocated()));
    }
}

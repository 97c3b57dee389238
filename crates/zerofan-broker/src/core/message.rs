//! The shared message: decoded once, referenced by every delivery.

use super::ids::SessionId;
use super::wire::Wire;
use bytes::Bytes;
use std::time::{Duration, Instant};
use zerofan_codec::{MqttStr, Properties, Props, Publish, QoS};

/// One application message as the broker routes it. Wrapped in an `Rc` and
/// shared by every subscriber queue, inflight window and the retained store
/// (all on the broker's one thread: an atomic count, up and down once per
/// delivery, cost 3% of the broker's time in fan-out to 100):
/// its `payload` is a slice of the publisher's read buffer, never copied per
/// subscriber.
#[derive(Debug)]
pub struct Message {
    /// Topic name (aliases already resolved).
    pub topic: MqttStr,
    /// Application payload.
    pub payload: Bytes,
    /// QoS the publisher used.
    pub qos: QoS,
    /// RETAIN flag the publisher used.
    pub retain: bool,
    /// The publisher's properties, with the per-hop ones (topic alias,
    /// subscription identifiers, message expiry) cleared; a null pointer
    /// when there are none (every MQTT 3.x message, most MQTT 5 ones).
    pub properties: Props,
    /// The publishing session, for No Local; `None` for wills and `$SYS`.
    /// With `origin_peer` set, a session of that peer (for push-back only).
    pub origin: Option<SessionId>,
    /// The peer the message was published at, when not this core.
    pub origin_peer: Option<super::peer::PeerId>,
    /// When the message expires (Message Expiry Interval), if ever.
    pub expires_at: Option<Instant>,
    /// True when topic, payload and properties are its own allocations (not
    /// slices of a read buffer), so compacting it again would only copy.
    /// Private: only the constructors know.
    owns_bytes: bool,
    /// Its id in the durable store once written (written once, however
    /// many queues reference it).
    stored: super::durable::StoredId,
    /// The packet as received, when a plain delivery of the message is
    /// byte for byte that packet (see [`Wire`]). Private: only
    /// [`Message::attach_wire`] sets it, after checking exactly that.
    wire: Option<Wire>,
    /// Stranded for an away node's sessions, the same on every node (see
    /// `strand`). Boxed: rare, and every message would carry its size.
    mark: Option<Box<super::strand::Mark>>,
}

impl Message {
    /// Turn a received PUBLISH into a routable message.
    pub fn from_publish(mut publish: Publish, origin: Option<SessionId>, now: Instant) -> Self {
        // Only a PUBLISH that carries properties has any to clear: writing
        // through `DerefMut` would allocate them for every message.
        let mut expires_at = None;
        if let Some(p) = publish.properties.get_mut() {
            expires_at = p
                .message_expiry_interval
                .take()
                .and_then(|secs| later(now, secs));
            p.topic_alias = None;
            p.subscription_identifiers.clear();
        }
        // Only a topic alias (say) left nothing: back to a null pointer.
        publish.properties.shrink();
        Message {
            topic: publish.topic,
            payload: publish.payload,
            qos: publish.qos,
            retain: publish.retain,
            properties: publish.properties,
            origin,
            origin_peer: None,
            expires_at,
            owns_bytes: false,
            stored: Default::default(),
            wire: None,
            mark: None,
        }
    }

    /// A message built by the broker from bytes it owns (`$SYS` figures,
    /// messages restored from the store): nothing to compact, no packet as
    /// received, no publishing session.
    pub fn owned(
        topic: MqttStr,
        payload: Bytes,
        qos: QoS,
        retain: bool,
        properties: Props,
        expires_at: Option<Instant>,
    ) -> Self {
        Message {
            topic,
            payload,
            qos,
            retain,
            properties,
            origin: None,
            origin_peer: None,
            expires_at,
            owns_bytes: true,
            stored: Default::default(),
            wire: None,
            mark: None,
        }
    }

    /// The same message for another core (shard or node): the same bytes,
    /// shared; not yet stored there. Its origin stays as it is: the
    /// receiver names the peer it came from (see [`Message::arrived_from`]).
    pub fn for_peer(&self) -> Message {
        Message {
            topic: self.topic.clone(),
            payload: self.payload.clone(),
            qos: self.qos,
            retain: self.retain,
            properties: self.properties.clone(),
            origin: self.origin,
            origin_peer: self.origin_peer,
            expires_at: self.expires_at,
            owns_bytes: self.owns_bytes,
            stored: Default::default(),
            wire: self.wire.clone(),
            mark: self.mark.clone(),
        }
    }

    /// [`Message::for_peer`] without the copy, for the last holder of
    /// the message: no reference count of its buffers moves.
    pub fn into_peer(self) -> Message {
        Message {
            stored: Default::default(),
            ..self
        }
    }

    /// The message was received from peer `from`: a publishing session, if
    /// any, is one of that peer's (unless an earlier peer was named).
    pub fn arrived_from(&mut self, from: super::peer::PeerId) {
        if self.origin.is_some() && self.origin_peer.is_none() {
            self.origin_peer = Some(from);
        }
    }

    /// Keep the packet as received (`candidate`, in `protocol`'s encoding)
    /// for this message's plain deliveries, if it is byte for byte one of
    /// them (see [`Wire::verified`]); else deliveries are encoded.
    pub fn attach_wire(
        &mut self,
        candidate: Wire,
        protocol: zerofan_codec::Protocol,
        scratch: &mut bytes::BytesMut,
    ) {
        self.wire = candidate.verified(self, protocol, scratch);
    }

    /// The packet as received, when a plain delivery is exactly that.
    pub fn wire(&self) -> Option<&Wire> {
        self.wire.as_ref()
    }

    /// Its mark, when stranded (see `strand`).
    pub(crate) fn mark(&self) -> Option<super::strand::Mark> {
        self.mark.as_deref().copied()
    }

    /// Stranded as `mark`.
    pub(crate) fn set_mark(&mut self, mark: Option<super::strand::Mark>) {
        self.mark = mark.map(Box::new);
    }

    /// Its id in the durable store, once written.
    pub fn stored(&self) -> &super::durable::StoredId {
        &self.stored
    }

    /// True once the message expiry interval has passed.
    pub fn is_expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// The Message Expiry Interval to send on: whole seconds left, rounded
    /// up so a message is never forwarded with 0 while it is still alive.
    pub fn remaining_expiry(&self, now: Instant) -> Option<u32> {
        self.expires_at.map(|at| {
            let left = at.saturating_duration_since(now);
            let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            u32::try_from(secs).unwrap_or(u32::MAX)
        })
    }

    /// Bytes this message accounts for in a queue.
    pub fn size(&self) -> usize {
        self.payload.len() + self.topic.len()
    }

    /// Whether keeping this message for long is worth a copy: small, and
    /// still a slice of some read buffer.
    pub fn worth_compacting(&self) -> bool {
        !self.owns_bytes && self.size() <= crate::core::publish::COMPACT_AT_MOST
    }

    /// A copy that owns its own allocations, so keeping it for long does not
    /// pin the (possibly much larger) read buffer it was decoded from.
    pub fn compacted(&self) -> Message {
        let properties = if self.properties.is_allocated() {
            own_properties(&self.properties).into()
        } else {
            Props::new()
        };
        Message {
            topic: copy_str(&self.topic),
            payload: Bytes::copy_from_slice(&self.payload),
            qos: self.qos,
            retain: self.retain,
            properties,
            origin: self.origin,
            origin_peer: self.origin_peer,
            expires_at: self.expires_at,
            owns_bytes: true,
            stored: self.stored.copy(),
            wire: None,
            mark: self.mark.clone(),
        }
    }
}

/// Copy an MQTT string into its own allocation, so keeping it does not pin
/// the read buffer it was sliced from.
pub(crate) fn copy_str(s: &MqttStr) -> MqttStr {
    // Already valid, so this cannot fail; the fallback is unreachable.
    MqttStr::from_bytes(Bytes::copy_from_slice(s.as_bytes())).unwrap_or_default()
}

/// `now` plus `secs` seconds; `None` (never) if the clock cannot represent it.
pub(crate) fn later(now: Instant, secs: u32) -> Option<Instant> {
    now.checked_add(Duration::from_secs(u64::from(secs)))
}

/// Seconds from the loss of a will's connection to its publication: its
/// delay, or the end of its session (`expiry`) if that comes first
/// (MQTT-3.1.3-9). Every place that makes a will pending counts with this.
pub(crate) fn will_wait(delay: u32, expiry: u32) -> u32 {
    delay.min(expiry)
}

/// Properties that own their bytes (see [`copy_str`]).
pub(crate) fn own_properties(p: &Properties) -> Properties {
    let mut properties = p.clone();
    properties.content_type = properties.content_type.as_ref().map(copy_str);
    properties.response_topic = properties.response_topic.as_ref().map(copy_str);
    properties.correlation_data = properties
        .correlation_data
        .as_ref()
        .map(|b| Bytes::copy_from_slice(b));
    for (k, v) in &mut properties.user_properties {
        *k = copy_str(k);
        *v = copy_str(v);
    }
    properties
}

// A message crosses threads to reach another shard.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Message>();
};

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(properties: Properties) -> Publish {
        Publish {
            topic: MqttStr::from_static("a/b"),
            payload: Bytes::from_static(b"x"),
            properties: properties.into(),
            ..Publish::default()
        }
    }

    /// The routing hot path must not allocate properties for a message
    /// that has none (writing through `DerefMut` would).
    #[test]
    fn from_publish_leaves_absent_properties_unallocated() {
        let now = Instant::now();
        let m = Message::from_publish(publish(Properties::default()), None, now);
        assert!(!m.properties.is_allocated());
        assert_eq!(m.expires_at, None);
        assert!(!m.compacted().properties.is_allocated());
    }

    /// Per-hop properties are cleared; if nothing else was set, the box goes.
    #[test]
    fn from_publish_clears_per_hop_properties() {
        let now = Instant::now();
        let hop_only = Properties {
            topic_alias: Some(3),
            message_expiry_interval: Some(10),
            subscription_identifiers: vec![7],
            ..Properties::default()
        };
        let m = Message::from_publish(publish(hop_only.clone()), None, now);
        assert!(!m.properties.is_allocated());
        assert_eq!(m.expires_at, later(now, 10));

        let kept = Properties {
            content_type: Some(MqttStr::from_static("text/plain")),
            ..hop_only
        };
        let m = Message::from_publish(publish(kept), None, now);
        assert_eq!(m.properties.topic_alias, None);
        assert_eq!(m.properties.message_expiry_interval, None);
        assert!(m.properties.subscription_identifiers.is_empty());
        assert_eq!(m.properties.content_type.as_deref(), Some("text/plain"));
    }
}

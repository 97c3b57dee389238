//! The shared message: decoded once, referenced by every delivery.

use super::ids::SessionId;
use bytes::Bytes;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use zerofan_codec::{MqttStr, Properties, Publish, QoS};

/// One application message as the broker routes it. Wrapped in an `Arc` and
/// shared by every subscriber queue, inflight window and the retained store:
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
    /// subscription identifiers, message expiry) cleared.
    pub properties: PublishProperties,
    /// The publishing session, for No Local; `None` for wills and `$SYS`.
    pub origin: Option<SessionId>,
    /// When the message expires (Message Expiry Interval), if ever.
    pub expires_at: Option<Instant>,
    /// True when topic, payload and properties are its own allocations (not
    /// slices of a read buffer), so compacting it again would only copy.
    pub owns_bytes: bool,
    /// Its id in the durable store once written (written once, however
    /// many queues reference it).
    pub stored: super::durable::StoredId,
}

impl Message {
    /// Turn a received PUBLISH into a routable message.
    pub fn from_publish(mut publish: Publish, origin: Option<SessionId>, now: Instant) -> Self {
        let expires_at = publish
            .properties
            .message_expiry_interval
            .take()
            .and_then(|secs| later(now, secs));
        publish.properties.topic_alias = None;
        publish.properties.subscription_identifiers.clear();
        Message {
            topic: publish.topic,
            payload: publish.payload,
            qos: publish.qos,
            retain: publish.retain,
            properties: PublishProperties::new(publish.properties),
            origin,
            expires_at,
            owns_bytes: false,
            stored: Default::default(),
        }
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
        let properties = PublishProperties::new(own_properties(&self.properties));
        Message {
            topic: copy_str(&self.topic),
            payload: Bytes::copy_from_slice(&self.payload),
            qos: self.qos,
            retain: self.retain,
            properties,
            origin: self.origin,
            expires_at: self.expires_at,
            owns_bytes: true,
            stored: self.stored.copy(),
        }
    }
}

/// A message's PUBLISH properties: nothing but a null pointer when there are
/// none (every MQTT 3.1.1 message, most MQTT 5 ones). `Properties` holds
/// every property of every packet (about 500 bytes); inline, it made each
/// `Message` that large, and moving it into its `Arc` showed in profiles.
#[derive(Clone, Debug, Default)]
pub struct PublishProperties(Option<Box<Properties>>);

impl PublishProperties {
    /// Keep `p`, boxed only when it holds something.
    pub fn new(p: Properties) -> Self {
        if p.is_empty() {
            PublishProperties(None)
        } else {
            PublishProperties(Some(Box::new(p)))
        }
    }

    /// The properties, by value.
    pub fn into_inner(self) -> Properties {
        self.0.map(|b| *b).unwrap_or_default()
    }
}

impl std::ops::Deref for PublishProperties {
    type Target = Properties;
    fn deref(&self) -> &Properties {
        static EMPTY: OnceLock<Properties> = OnceLock::new();
        match &self.0 {
            Some(p) => p,
            None => EMPTY.get_or_init(Properties::default),
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

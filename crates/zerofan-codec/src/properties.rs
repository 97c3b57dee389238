//! MQTT 5 properties (§2.2.2): one struct that holds any packet's properties
//! ([`Properties`]), and the one-pointer box packets keep it in ([`Props`]).

use crate::string::MqttStr;
use bytes::Bytes;

/// Every MQTT 5 property. Each packet type allows a subset; the decoder
/// refuses a property the packet may not carry (0x81 malformed packet, or
/// 0x82 protocol error where the spec says so), and the encoder writes only
/// the fields that are set. Under MQTT 3.x this is always empty.
///
/// Packets hold it through [`Props`]: decoding allocates nothing for a
/// packet without properties, and for one with properties the box, plus
/// the `Vec`s of user properties or subscription identifiers if it has any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Properties {
    /// 0x01 Payload Format Indicator (PUBLISH, will): 0 bytes, 1 UTF-8.
    pub payload_format_indicator: Option<u8>,
    /// 0x02 Message Expiry Interval in seconds (PUBLISH, will).
    pub message_expiry_interval: Option<u32>,
    /// 0x03 Content Type (PUBLISH, will).
    pub content_type: Option<MqttStr>,
    /// 0x08 Response Topic (PUBLISH, will).
    pub response_topic: Option<MqttStr>,
    /// 0x09 Correlation Data (PUBLISH, will).
    pub correlation_data: Option<Bytes>,
    /// 0x0B Subscription Identifier: one in SUBSCRIBE (1..=268,435,455),
    /// any number in a server-to-client PUBLISH.
    pub subscription_identifiers: Vec<u32>,
    /// 0x11 Session Expiry Interval in seconds (CONNECT, CONNACK, DISCONNECT).
    pub session_expiry_interval: Option<u32>,
    /// 0x12 Assigned Client Identifier (CONNACK).
    pub assigned_client_identifier: Option<MqttStr>,
    /// 0x13 Server Keep Alive (CONNACK).
    pub server_keep_alive: Option<u16>,
    /// 0x15 Authentication Method (CONNECT, CONNACK, AUTH).
    pub authentication_method: Option<MqttStr>,
    /// 0x16 Authentication Data (CONNECT, CONNACK, AUTH).
    pub authentication_data: Option<Bytes>,
    /// 0x17 Request Problem Information (CONNECT).
    pub request_problem_information: Option<u8>,
    /// 0x18 Will Delay Interval in seconds (will properties).
    pub will_delay_interval: Option<u32>,
    /// 0x19 Request Response Information (CONNECT).
    pub request_response_information: Option<u8>,
    /// 0x1A Response Information (CONNACK).
    pub response_information: Option<MqttStr>,
    /// 0x1C Server Reference (CONNACK, DISCONNECT).
    pub server_reference: Option<MqttStr>,
    /// 0x1F Reason String (acks, CONNACK, DISCONNECT, AUTH).
    pub reason_string: Option<MqttStr>,
    /// 0x21 Receive Maximum (CONNECT, CONNACK); 0 is a protocol error.
    pub receive_maximum: Option<u16>,
    /// 0x22 Topic Alias Maximum (CONNECT, CONNACK).
    pub topic_alias_maximum: Option<u16>,
    /// 0x23 Topic Alias (PUBLISH); 0 is a protocol error.
    pub topic_alias: Option<u16>,
    /// 0x24 Maximum QoS (CONNACK): 0 or 1.
    pub maximum_qos: Option<u8>,
    /// 0x25 Retain Available (CONNACK).
    pub retain_available: Option<u8>,
    /// 0x26 User Property: name/value pairs, in order, repeats allowed.
    pub user_properties: Vec<(MqttStr, MqttStr)>,
    /// 0x27 Maximum Packet Size (CONNECT, CONNACK); 0 is a protocol error.
    pub maximum_packet_size: Option<u32>,
    /// 0x28 Wildcard Subscription Available (CONNACK).
    pub wildcard_subscription_available: Option<u8>,
    /// 0x29 Subscription Identifier Available (CONNACK).
    pub subscription_identifier_available: Option<u8>,
    /// 0x2A Shared Subscription Available (CONNACK).
    pub shared_subscription_available: Option<u8>,
}

impl Properties {
    /// True when no property is set (the encoder then writes a zero length).
    pub fn is_empty(&self) -> bool {
        *self == Properties::default()
    }
}

/// The all-unset `Properties` an empty [`Props`] dereferences to. A plain
/// `static` (everything in it is `const`-constructible), so reading it costs
/// no initialisation check.
static EMPTY: Properties = Properties {
    payload_format_indicator: None,
    message_expiry_interval: None,
    content_type: None,
    response_topic: None,
    correlation_data: None,
    subscription_identifiers: Vec::new(),
    session_expiry_interval: None,
    assigned_client_identifier: None,
    server_keep_alive: None,
    authentication_method: None,
    authentication_data: None,
    request_problem_information: None,
    will_delay_interval: None,
    request_response_information: None,
    response_information: None,
    server_reference: None,
    reason_string: None,
    receive_maximum: None,
    topic_alias_maximum: None,
    topic_alias: None,
    maximum_qos: None,
    retain_available: None,
    user_properties: Vec::new(),
    maximum_packet_size: None,
    wildcard_subscription_available: None,
    subscription_identifier_available: None,
    shared_subscription_available: None,
};

/// One packet's properties, boxed, and nothing but a null pointer when there
/// are none (every MQTT 3.x packet, most MQTT 5 ones).
///
/// Why: [`Properties`] holds every property of every packet type, about 450
/// bytes. Stored inline it made `Publish` and `Packet` over 500 bytes, and
/// every decode, match and move of a PUBLISH copied them (5–20% of CPU in
/// the broker and the client). This is one pointer wide.
///
/// It dereferences to [`Properties`] (to a shared all-unset value when
/// empty), so `p.properties.topic_alias` reads as before. Writing through
/// [`DerefMut`](std::ops::DerefMut) allocates the box on first use, even to
/// write `None`: hot paths that only clear fields should go through
/// [`Props::get_mut`], which never allocates. Equality compares the
/// properties, so an allocated but empty value equals an unallocated one.
#[derive(Clone, Default)]
pub struct Props(Option<Box<Properties>>);

impl Props {
    /// No properties, nothing allocated (the same as `Props::default()`,
    /// usable in `const` contexts).
    pub const fn new() -> Self {
        Props(None)
    }

    /// The properties for writing, only if they are already allocated:
    /// `None` when empty. Never allocates, so clearing per-hop fields on a
    /// hot path costs nothing when there is nothing to clear.
    pub fn get_mut(&mut self) -> Option<&mut Properties> {
        self.0.as_deref_mut()
    }

    /// True when no property is set. Shadows [`Properties::is_empty`] so
    /// that the common case, a null pointer, answers without comparing
    /// ~400 bytes against an all-unset value (the Node.js binding asks for
    /// every message it receives).
    #[inline]
    pub fn is_empty(&self) -> bool {
        match &self.0 {
            None => true,
            Some(p) => p.is_empty(),
        }
    }

    /// True when the properties are allocated (they may still all be unset
    /// after writes through `DerefMut`; [`Props::shrink`] drops such a box).
    pub fn is_allocated(&self) -> bool {
        self.0.is_some()
    }

    /// Drop the box if every property is unset, so a value that was
    /// written and then cleared is a null pointer again.
    pub fn shrink(&mut self) {
        if self.0.as_deref().is_some_and(Properties::is_empty) {
            self.0 = None;
        }
    }

    /// The properties by value (all unset when empty).
    pub fn into_inner(self) -> Properties {
        self.0.map(|b| *b).unwrap_or_default()
    }
}

impl From<Properties> for Props {
    /// Box `p` only when it holds something.
    fn from(p: Properties) -> Self {
        if p.is_empty() {
            Props(None)
        } else {
            Props(Some(Box::new(p)))
        }
    }
}

impl From<Props> for Properties {
    fn from(p: Props) -> Self {
        p.into_inner()
    }
}

impl std::ops::Deref for Props {
    type Target = Properties;
    #[inline]
    fn deref(&self) -> &Properties {
        match &self.0 {
            Some(p) => p,
            None => &EMPTY,
        }
    }
}

impl std::ops::DerefMut for Props {
    /// Allocates an all-unset box on the first mutable access.
    #[inline]
    fn deref_mut(&mut self) -> &mut Properties {
        self.0.get_or_insert_with(Box::default)
    }
}

impl std::fmt::Debug for Props {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl PartialEq for Props {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Props {}

impl PartialEq<Properties> for Props {
    fn eq(&self, other: &Properties) -> bool {
        **self == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_a_null_pointer_and_reads_as_unset() {
        assert_eq!(std::mem::size_of::<Props>(), std::mem::size_of::<usize>());
        let p = Props::default();
        assert!(!p.is_allocated());
        assert_eq!(p.topic_alias, None);
        assert!(p.is_empty());
        assert!(!Props::from(Properties::default()).is_allocated());
        let mut q = Props::new();
        q.topic_alias = None; // allocates an all-unset box
        assert!(q.is_allocated() && q.is_empty());
    }

    #[test]
    fn boxes_only_what_holds_something() {
        let p = Props::from(Properties {
            topic_alias: Some(3),
            ..Properties::default()
        });
        assert!(p.is_allocated());
        assert_eq!(p.topic_alias, Some(3));
        assert_eq!(p.clone().into_inner().topic_alias, Some(3));
        assert_eq!(Props::new().into_inner(), Properties::default());
    }

    #[test]
    fn get_mut_never_allocates_deref_mut_does() {
        let mut p = Props::default();
        assert!(p.get_mut().is_none());
        assert!(!p.is_allocated());
        p.topic_alias = Some(1);
        assert!(p.is_allocated());
        if let Some(q) = p.get_mut() {
            q.topic_alias = None;
        }
        // Allocated but empty: equal to an empty value, and shrinks back.
        assert!(p.is_allocated());
        assert_eq!(p, Props::default());
        p.shrink();
        assert!(!p.is_allocated());
    }

    #[test]
    fn debug_shows_the_properties() {
        let p = Props::from(Properties {
            receive_maximum: Some(7),
            ..Properties::default()
        });
        assert_eq!(format!("{p:?}"), format!("{:?}", *p));
    }
}

//! MQTT 5 reason codes, and their MQTT 3.1.1 CONNACK / SUBACK equivalents.

/// An MQTT 5 reason code (MQTT 5.0 §2.4).
///
/// A newtype over `u8` rather than an enum because several names share one
/// value (`SUCCESS`, `NORMAL_DISCONNECTION` and `GRANTED_QOS_0` are all 0x00)
/// and a decoder must be able to carry a code it does not know yet to the
/// place that decides whether it is allowed in that packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReasonCode(pub u8);

#[allow(missing_docs)]
impl ReasonCode {
    pub const SUCCESS: Self = Self(0x00);
    pub const NORMAL_DISCONNECTION: Self = Self(0x00);
    pub const GRANTED_QOS_0: Self = Self(0x00);
    pub const GRANTED_QOS_1: Self = Self(0x01);
    pub const GRANTED_QOS_2: Self = Self(0x02);
    pub const DISCONNECT_WITH_WILL: Self = Self(0x04);
    pub const NO_MATCHING_SUBSCRIBERS: Self = Self(0x10);
    pub const NO_SUBSCRIPTION_EXISTED: Self = Self(0x11);
    pub const CONTINUE_AUTHENTICATION: Self = Self(0x18);
    pub const REAUTHENTICATE: Self = Self(0x19);
    pub const UNSPECIFIED_ERROR: Self = Self(0x80);
    pub const MALFORMED_PACKET: Self = Self(0x81);
    pub const PROTOCOL_ERROR: Self = Self(0x82);
    pub const IMPLEMENTATION_SPECIFIC_ERROR: Self = Self(0x83);
    pub const UNSUPPORTED_PROTOCOL_VERSION: Self = Self(0x84);
    pub const CLIENT_IDENTIFIER_NOT_VALID: Self = Self(0x85);
    pub const BAD_USER_NAME_OR_PASSWORD: Self = Self(0x86);
    pub const NOT_AUTHORIZED: Self = Self(0x87);
    pub const SERVER_UNAVAILABLE: Self = Self(0x88);
    pub const SERVER_BUSY: Self = Self(0x89);
    pub const BANNED: Self = Self(0x8A);
    pub const SERVER_SHUTTING_DOWN: Self = Self(0x8B);
    pub const BAD_AUTHENTICATION_METHOD: Self = Self(0x8C);
    pub const KEEP_ALIVE_TIMEOUT: Self = Self(0x8D);
    pub const SESSION_TAKEN_OVER: Self = Self(0x8E);
    pub const TOPIC_FILTER_INVALID: Self = Self(0x8F);
    pub const TOPIC_NAME_INVALID: Self = Self(0x90);
    pub const PACKET_IDENTIFIER_IN_USE: Self = Self(0x91);
    pub const PACKET_IDENTIFIER_NOT_FOUND: Self = Self(0x92);
    pub const RECEIVE_MAXIMUM_EXCEEDED: Self = Self(0x93);
    pub const TOPIC_ALIAS_INVALID: Self = Self(0x94);
    pub const PACKET_TOO_LARGE: Self = Self(0x95);
    pub const MESSAGE_RATE_TOO_HIGH: Self = Self(0x96);
    pub const QUOTA_EXCEEDED: Self = Self(0x97);
    pub const ADMINISTRATIVE_ACTION: Self = Self(0x98);
    pub const PAYLOAD_FORMAT_INVALID: Self = Self(0x99);
    pub const RETAIN_NOT_SUPPORTED: Self = Self(0x9A);
    pub const QOS_NOT_SUPPORTED: Self = Self(0x9B);
    pub const USE_ANOTHER_SERVER: Self = Self(0x9C);
    pub const SERVER_MOVED: Self = Self(0x9D);
    pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: Self = Self(0x9E);
    pub const CONNECTION_RATE_EXCEEDED: Self = Self(0x9F);
    pub const MAXIMUM_CONNECT_TIME: Self = Self(0xA0);
    pub const SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: Self = Self(0xA1);
    pub const WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: Self = Self(0xA2);
}

impl ReasonCode {
    /// True for codes of 0x80 and above, which report a failure.
    pub fn is_error(self) -> bool {
        self.0 >= 0x80
    }
}

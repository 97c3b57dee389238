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

/// The MQTT 3.1 / 3.1.1 CONNACK return code for an MQTT 5 reason code.
///
/// 0x00 → 0 accepted; 0x84 → 1 unacceptable protocol version; 0x85 → 2
/// identifier rejected; 0x88 → 3 server unavailable; 0x86 and 0x8C → 4 bad
/// user name or password; 0x87 and 0x8A → 5 not authorized. Every other
/// code is mapped to 3 (server unavailable), the closest 3.x has to "try
/// again later / not now" (0x89 server busy, 0x9F connection rate exceeded,
/// 0x80 unspecified error, ...).
pub const fn v3_connack_code(reason: ReasonCode) -> u8 {
    match reason.0 {
        0x00 => 0,
        0x84 => 1,
        0x85 => 2,
        0x86 | 0x8C => 4,
        0x87 | 0x8A => 5,
        _ => 3,
    }
}

/// The MQTT 5 reason code for a 3.1 / 3.1.1 CONNACK return code 0..=5
/// (the inverse of [`v3_connack_code`] on its canonical codes); `None` for
/// the reserved values 6..=255.
pub const fn connack_reason_from_v3(code: u8) -> Option<ReasonCode> {
    match code {
        0 => Some(ReasonCode::SUCCESS),
        1 => Some(ReasonCode::UNSUPPORTED_PROTOCOL_VERSION),
        2 => Some(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID),
        3 => Some(ReasonCode::SERVER_UNAVAILABLE),
        4 => Some(ReasonCode::BAD_USER_NAME_OR_PASSWORD),
        5 => Some(ReasonCode::NOT_AUTHORIZED),
        _ => None,
    }
}

/// The MQTT 3.1.1 SUBACK return code for an MQTT 5 SUBACK reason code:
/// granted QoS 0..=2 unchanged, every failure 0x80.
pub const fn v3_suback_code(reason: ReasonCode) -> u8 {
    if reason.0 <= 2 {
        reason.0
    } else {
        0x80
    }
}

impl ReasonCode {
    /// Valid in an MQTT 5 CONNACK (§3.2.2.2).
    pub const fn valid_in_connack(self) -> bool {
        matches!(
            self.0,
            0x00 | 0x80..=0x8A | 0x8C | 0x90 | 0x95 | 0x97 | 0x99..=0x9D | 0x9F
        )
    }
    /// Valid in an MQTT 5 PUBACK or PUBREC (§3.4.2.1, §3.5.2.1).
    pub const fn valid_in_puback(self) -> bool {
        matches!(
            self.0,
            0x00 | 0x10 | 0x80 | 0x83 | 0x87 | 0x90 | 0x91 | 0x97 | 0x99
        )
    }
    /// Valid in an MQTT 5 PUBREL or PUBCOMP (§3.6.2.1, §3.7.2.1).
    pub const fn valid_in_pubrel(self) -> bool {
        matches!(self.0, 0x00 | 0x92)
    }
    /// Valid in an MQTT 5 SUBACK (§3.9.3).
    pub const fn valid_in_suback(self) -> bool {
        matches!(
            self.0,
            0x00..=0x02 | 0x80 | 0x83 | 0x87 | 0x8F | 0x91 | 0x97 | 0x9E | 0xA1 | 0xA2
        )
    }
    /// Valid in an MQTT 5 UNSUBACK (§3.11.3).
    pub const fn valid_in_unsuback(self) -> bool {
        matches!(self.0, 0x00 | 0x11 | 0x80 | 0x83 | 0x87 | 0x8F | 0x91)
    }
    /// Valid in an MQTT 5 DISCONNECT (§3.14.2.1).
    pub const fn valid_in_disconnect(self) -> bool {
        matches!(
            self.0,
            0x00 | 0x04
                | 0x80..=0x83
                | 0x87
                | 0x89
                | 0x8B
                | 0x8D..=0x90
                | 0x93..=0xA2
        )
    }
    /// Valid in an MQTT 5 AUTH (§3.15.2.1).
    pub const fn valid_in_auth(self) -> bool {
        matches!(self.0, 0x00 | 0x18 | 0x19)
    }
}

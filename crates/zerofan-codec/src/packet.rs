//! The MQTT control packets as plain data, shared by every protocol version.

use crate::properties::Props;
use crate::reason::ReasonCode;
use crate::string::MqttStr;
use bytes::Bytes;

/// The protocol level a connection speaks, fixed by its CONNECT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// MQTT 3.1: protocol name "MQIsdp", level 3.
    V31,
    /// MQTT 3.1.1: protocol name "MQTT", level 4.
    V311,
    /// MQTT 5.0: protocol name "MQTT", level 5.
    V5,
}

impl Protocol {
    /// True for MQTT 5, the only version with properties and reason codes.
    pub fn is_v5(self) -> bool {
        self == Protocol::V5
    }
}

/// Quality of service of a PUBLISH or a subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum QoS {
    /// At most once.
    #[default]
    AtMostOnce = 0,
    /// At least once.
    AtLeastOnce = 1,
    /// Exactly once.
    ExactlyOnce = 2,
}

impl QoS {
    /// The QoS for a wire value 0, 1 or 2; `None` for 3 (malformed).
    pub fn from_u8(v: u8) -> Option<QoS> {
        match v {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
}

/// Any MQTT control packet.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Packet {
    Connect(Box<Connect>),
    ConnAck(ConnAck),
    Publish(Publish),
    PubAck(Ack),
    PubRec(Ack),
    PubRel(Ack),
    PubComp(Ack),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(UnsubAck),
    PingReq,
    PingResp,
    Disconnect(Disconnect),
    Auth(Auth),
}

/// CONNECT (§3.1). Boxed inside `Packet` because it is large and rare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connect {
    /// Protocol name and level on the wire.
    pub protocol: Protocol,
    /// Clean Session (3.x) / Clean Start (5).
    pub clean_start: bool,
    /// Keep alive in seconds; 0 turns it off.
    pub keep_alive: u16,
    /// CONNECT properties (MQTT 5).
    pub properties: Props,
    /// Client identifier; may be empty.
    pub client_id: MqttStr,
    /// The will message, if the will flag is set.
    pub will: Option<Will>,
    /// User name, if the flag is set.
    pub username: Option<MqttStr>,
    /// Password (binary data), if the flag is set.
    pub password: Option<Bytes>,
    /// The client is a bridge: the top bit of the protocol level is set
    /// (0x83, 0x84, 0x85), as mosquitto's `try_private` sends it. A broker
    /// that knows the mark does not send a bridge its own messages back.
    pub bridge: bool,
}

/// The will message carried by CONNECT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Will {
    /// Will topic (a topic name: no wildcards).
    pub topic: MqttStr,
    /// Will payload.
    pub payload: Bytes,
    /// Will QoS.
    pub qos: QoS,
    /// Will retain flag.
    pub retain: bool,
    /// Will properties (MQTT 5).
    pub properties: Props,
}

/// CONNACK (§3.2).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ConnAck {
    /// Session Present flag.
    pub session_present: bool,
    /// Reason code. Under 3.x it is mapped to and from the return codes
    /// 0..=5 (see [`crate::v3_connack_code`]).
    pub reason: ReasonCode,
    /// CONNACK properties (MQTT 5).
    pub properties: Props,
}

/// PUBLISH (§3.3). `topic` and `payload` are slices of the decoded frame.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Publish {
    /// DUP flag.
    pub dup: bool,
    /// QoS level.
    pub qos: QoS,
    /// RETAIN flag.
    pub retain: bool,
    /// Topic name; empty when an MQTT 5 sender uses an established topic alias.
    pub topic: MqttStr,
    /// Packet identifier; 0 at QoS 0 (never on the wire then), non-zero otherwise.
    pub packet_id: u16,
    /// PUBLISH properties (MQTT 5).
    pub properties: Props,
    /// Application payload.
    pub payload: Bytes,
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP (§3.4-3.7): a packet id, a reason code
/// and properties. Under 3.x the reason is always success on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Ack {
    /// Packet identifier being acknowledged.
    pub packet_id: u16,
    /// Reason code (MQTT 5); `SUCCESS` under 3.x.
    pub reason: ReasonCode,
    /// Properties (MQTT 5).
    pub properties: Props,
}

/// Subscription options of one filter in SUBSCRIBE (§3.8.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SubscriptionOptions {
    /// Maximum QoS the subscriber accepts.
    pub qos: QoS,
    /// No Local (MQTT 5): do not send my own publications back to me.
    pub no_local: bool,
    /// Retain As Published (MQTT 5).
    pub retain_as_published: bool,
    /// Retain Handling 0, 1 or 2 (MQTT 5).
    pub retain_handling: u8,
}

/// SUBSCRIBE (§3.8).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Subscribe {
    /// Packet identifier (non-zero).
    pub packet_id: u16,
    /// Properties (MQTT 5): subscription identifier, user properties.
    pub properties: Props,
    /// At least one topic filter with its options.
    pub filters: Vec<(MqttStr, SubscriptionOptions)>,
}

/// SUBACK (§3.9).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SubAck {
    /// Packet identifier of the SUBSCRIBE.
    pub packet_id: u16,
    /// Properties (MQTT 5).
    pub properties: Props,
    /// One code per filter: granted QoS 0..=2, or a failure (3.x: 0x80).
    pub reasons: Vec<ReasonCode>,
}

/// UNSUBSCRIBE (§3.10).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Unsubscribe {
    /// Packet identifier (non-zero).
    pub packet_id: u16,
    /// Properties (MQTT 5).
    pub properties: Props,
    /// At least one topic filter.
    pub filters: Vec<MqttStr>,
}

/// UNSUBACK (§3.11).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct UnsubAck {
    /// Packet identifier of the UNSUBSCRIBE.
    pub packet_id: u16,
    /// Properties (MQTT 5).
    pub properties: Props,
    /// One code per filter (MQTT 5 only; empty under 3.x).
    pub reasons: Vec<ReasonCode>,
}

/// DISCONNECT (§3.14). Under 3.x it has no body.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Disconnect {
    /// Reason code (MQTT 5).
    pub reason: ReasonCode,
    /// Properties (MQTT 5).
    pub properties: Props,
}

/// AUTH (§3.15), MQTT 5 only.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Auth {
    /// 0x00 success, 0x18 continue authentication, 0x19 re-authenticate.
    pub reason: ReasonCode,
    /// Properties: authentication method and data, reason string, user properties.
    pub properties: Props,
}

impl Default for ReasonCode {
    fn default() -> Self {
        ReasonCode::SUCCESS
    }
}

//! MQTT 5 properties (§2.2.2): one struct that holds any packet's properties.

use crate::string::MqttStr;
use bytes::Bytes;

/// Every MQTT 5 property. Each packet type allows a subset; the decoder
/// refuses a property the packet may not carry (0x81 malformed packet, or
/// 0x82 protocol error where the spec says so), and the encoder writes only
/// the fields that are set. Under MQTT 3.x this is always empty.
///
/// Decoding allocates only when the packet carries user properties or
/// subscription identifiers (empty `Vec`s do not allocate).
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

//! An application message received from the broker.

use bytes::Bytes;
use zerofan_codec::{MqttStr, Properties, Publish, QoS};

/// A PUBLISH delivered to this client. `topic` and `payload` are slices of
/// the pooled read buffer the packet arrived in: nothing was copied, and the
/// buffer returns to its pool when the last slice is dropped. Keep a small
/// payload for long? Copy it (`Bytes::copy_from_slice`) so that it does not
/// pin a whole read buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// properties, content type, response topic, correlation data...
    pub properties: Properties,
}

impl Message {
    /// The topic as `&str`.
    pub fn topic(&self) -> &str {
        self.topic.as_str()
    }

    pub(crate) fn from_publish(p: Publish, topic: MqttStr) -> Self {
        Message {
            topic,
            payload: p.payload,
            qos: p.qos,
            retain: p.retain,
            dup: p.dup,
            properties: p.properties,
        }
    }
}

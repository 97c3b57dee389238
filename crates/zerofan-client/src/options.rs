//! Connect options: what the client asks of the broker and how it behaves
//! when the connection drops.

use crate::transport::Transport;
use bytes::Bytes;
use std::time::Duration;
use zerofan_codec::{MqttStr, Properties, Protocol, QoS};
use zerofan_pool::Pool;

/// The will message the broker publishes if this client vanishes without a
/// DISCONNECT. Kept as plain owned values so options can be cloned and reused
/// on every reconnect.
#[derive(Clone, Debug)]
pub struct LastWill {
    /// Topic the will is published to.
    pub topic: String,
    /// Will payload.
    pub payload: Bytes,
    /// QoS of the will message.
    pub qos: QoS,
    /// Retain flag of the will message.
    pub retain: bool,
    /// Will properties (MQTT 5): will delay interval, message expiry, ...
    pub properties: Properties,
}

impl LastWill {
    /// A will with no properties; set [`LastWill::properties`] for more.
    pub fn new(
        topic: impl Into<String>,
        payload: impl Into<Bytes>,
        qos: QoS,
        retain: bool,
    ) -> Self {
        LastWill {
            topic: topic.into(),
            payload: payload.into(),
            qos,
            retain,
            properties: Default::default(),
        }
    }
}

/// Exponential backoff between reconnect attempts, so a broker that is down
/// is not hammered and a broker that restarts is found again quickly.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Upper bound of the delay.
    pub max: Duration,
    /// Factor applied after each failed attempt.
    pub multiplier: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(5),
            multiplier: 2.0,
        }
    }
}

impl Backoff {
    /// The delay after `attempt` failed attempts (0 = first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let f = self.multiplier.max(1.0).powi(attempt.min(64) as i32);
        let d = self.initial.as_secs_f64() * f;
        Duration::from_secs_f64(d.min(self.max.as_secs_f64()))
    }
}

/// Everything [`crate::Client::connect`] needs: where to connect, what to
/// put in CONNECT, and the client-side limits (queue depth, reconnect).
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Where and how to connect (TCP, TLS, WebSocket).
    pub transport: Transport,
    /// MQTT version: [`Protocol::V5`] (default) or [`Protocol::V311`].
    pub protocol: Protocol,
    /// Client identifier. Empty: the client makes up a unique one (so that
    /// session resume after a reconnect works under 3.1.1 too).
    pub client_id: String,
    /// Clean Start (5) / Clean Session (3.1.1) of the first connection.
    /// Reconnects always ask to resume the session.
    pub clean_start: bool,
    /// Session Expiry Interval in seconds (MQTT 5). 0 ends the session when
    /// the connection ends; the client still resends its inflight messages.
    pub session_expiry: u32,
    /// Keep alive in seconds; 0 turns it off.
    pub keep_alive: u16,
    /// Will message.
    pub will: Option<LastWill>,
    /// User name.
    pub username: Option<String>,
    /// Password.
    pub password: Option<Bytes>,
    /// Receive Maximum (MQTT 5): QoS 1/2 messages the broker may have
    /// unacknowledged towards this client.
    pub receive_maximum: Option<u16>,
    /// Maximum Packet Size (MQTT 5) the client accepts; also enforced on
    /// receive for every protocol version.
    pub maximum_packet_size: Option<u32>,
    /// Topic Alias Maximum (MQTT 5): how many topic aliases the broker may
    /// use towards this client (the client resolves them).
    pub topic_alias_maximum: Option<u16>,
    /// Extra CONNECT properties (user properties, request problem info...).
    pub user_properties: Vec<(String, String)>,
    /// Capacity of the outgoing queue in commands: when full, `publish`
    /// waits for room (backpressure instead of unbounded memory).
    pub outgoing_capacity: usize,
    /// Capacity of the incoming message queue; when full the client stops
    /// reading the socket until the application catches up.
    pub incoming_capacity: usize,
    /// Most QoS 1/2 publishes in flight; the broker's Receive Maximum
    /// lowers it further.
    pub max_inflight: u16,
    /// Reconnect automatically after the first successful connection.
    pub reconnect: bool,
    /// Delays between reconnect attempts.
    pub backoff: Backoff,
    /// Subscribe again after a reconnect when the broker lost the session.
    pub resubscribe: bool,
    /// How long to wait for CONNACK (and for a TCP/TLS/WS handshake).
    pub connect_timeout: Duration,
    /// Announce a bridge, as mosquitto's `try_private` does: the top bit of
    /// the CONNECT protocol level is set (MQTT 3.1.1: 0x84), and a broker
    /// that understands it does not send the bridge's own messages back.
    pub bridge: bool,
    /// Acknowledge a received QoS 1/2 message only when the application
    /// says so ([`crate::Client::ack`] with [`crate::Message::ack_token`]),
    /// not when it enters the incoming queue: what the broker still holds
    /// unacknowledged is bounded by [`ClientOptions::receive_maximum`].
    pub manual_acks: bool,
    /// Buffer pool for the read path. Default: [`Pool::global`].
    pub pool: Option<Pool>,
}

impl ClientOptions {
    /// Options for a plain TCP connection to `addr` ("host:port") with MQTT 5
    /// and sensible defaults.
    pub fn new(addr: impl Into<String>) -> Self {
        Self::with_transport(Transport::tcp(addr))
    }

    /// Options for any transport, with the defaults of [`ClientOptions::new`].
    pub fn with_transport(transport: Transport) -> Self {
        ClientOptions {
            transport,
            protocol: Protocol::V5,
            client_id: String::new(),
            clean_start: true,
            session_expiry: 0,
            keep_alive: 30,
            will: None,
            username: None,
            password: None,
            receive_maximum: None,
            maximum_packet_size: None,
            topic_alias_maximum: None,
            user_properties: Vec::new(),
            outgoing_capacity: 256,
            incoming_capacity: 1024,
            max_inflight: 1024,
            reconnect: true,
            backoff: Backoff::default(),
            resubscribe: true,
            connect_timeout: Duration::from_secs(10),
            bridge: false,
            manual_acks: false,
            pool: None,
        }
    }

    /// Sets the client identifier.
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }

    /// Sets the protocol version.
    pub fn protocol(mut self, p: Protocol) -> Self {
        self.protocol = p;
        self
    }

    /// Sets Clean Start for the first connection.
    pub fn clean_start(mut self, clean: bool) -> Self {
        self.clean_start = clean;
        self
    }

    /// Sets the Session Expiry Interval (seconds, MQTT 5).
    pub fn session_expiry(mut self, secs: u32) -> Self {
        self.session_expiry = secs;
        self
    }

    /// Sets the keep alive (seconds).
    pub fn keep_alive(mut self, secs: u16) -> Self {
        self.keep_alive = secs;
        self
    }

    /// Sets the will message.
    pub fn will(mut self, will: LastWill) -> Self {
        self.will = Some(will);
        self
    }

    /// Sets user name and password.
    pub fn credentials(mut self, username: impl Into<String>, password: impl Into<Bytes>) -> Self {
        self.username = Some(username.into());
        self.password = Some(password.into());
        self
    }

    /// Sets Receive Maximum (MQTT 5).
    pub fn receive_maximum(mut self, n: u16) -> Self {
        self.receive_maximum = Some(n);
        self
    }

    /// Sets Maximum Packet Size.
    pub fn maximum_packet_size(mut self, n: u32) -> Self {
        self.maximum_packet_size = Some(n);
        self
    }

    /// Sets Topic Alias Maximum (MQTT 5).
    pub fn topic_alias_maximum(mut self, n: u16) -> Self {
        self.topic_alias_maximum = Some(n);
        self
    }

    /// Sets the outgoing queue capacity (at least 1).
    pub fn outgoing_capacity(mut self, n: usize) -> Self {
        self.outgoing_capacity = n.max(1);
        self
    }

    /// Sets the incoming queue capacity (at least 1).
    pub fn incoming_capacity(mut self, n: usize) -> Self {
        self.incoming_capacity = n.max(1);
        self
    }

    /// Sets the most QoS 1/2 publishes in flight (at least 1).
    pub fn max_inflight(mut self, n: u16) -> Self {
        self.max_inflight = n.max(1);
        self
    }

    /// Turns automatic reconnect on or off.
    pub fn reconnect(mut self, on: bool) -> Self {
        self.reconnect = on;
        self
    }

    /// Sets the reconnect backoff.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// Announces a bridge (see [`ClientOptions::bridge`]).
    pub fn bridge(mut self, on: bool) -> Self {
        self.bridge = on;
        self
    }

    /// Acknowledges received messages only on [`crate::Client::ack`] (see
    /// [`ClientOptions::manual_acks`]).
    pub fn manual_acks(mut self, on: bool) -> Self {
        self.manual_acks = on;
        self
    }

    /// Uses this buffer pool for reads.
    pub fn pool(mut self, pool: Pool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The CONNECT packet for an attempt; `clean` is the Clean Start flag.
    pub(crate) fn connect_packet(
        &self,
        client_id: &str,
        clean: bool,
    ) -> Result<zerofan_codec::Connect, crate::ClientError> {
        let s = |v: &str| {
            MqttStr::try_from(v).map_err(|e| crate::ClientError::InvalidTopic(e.to_string()))
        };
        let mut properties = Properties::default();
        if self.protocol.is_v5() {
            if self.session_expiry > 0 {
                properties.session_expiry_interval = Some(self.session_expiry);
            }
            properties.receive_maximum = self.receive_maximum.filter(|&n| n > 0);
            properties.maximum_packet_size = self.maximum_packet_size.filter(|&n| n > 0);
            properties.topic_alias_maximum = self.topic_alias_maximum.filter(|&n| n > 0);
            for (k, v) in &self.user_properties {
                properties.user_properties.push((s(k)?, s(v)?));
            }
        }
        let will = match &self.will {
            None => None,
            Some(w) => {
                zerofan_codec::topic::validate_topic_name(&w.topic)
                    .map_err(|e| crate::ClientError::InvalidTopic(e.to_string()))?;
                Some(zerofan_codec::Will {
                    topic: s(&w.topic)?,
                    payload: w.payload.clone(),
                    qos: w.qos,
                    retain: w.retain,
                    properties: w.properties.clone().into(),
                })
            }
        };
        Ok(zerofan_codec::Connect {
            protocol: self.protocol,
            clean_start: clean,
            keep_alive: self.keep_alive,
            properties: properties.into(),
            client_id: s(client_id)?,
            will,
            username: self.username.as_deref().map(s).transpose()?,
            password: self.password.clone(),
            bridge: self.bridge,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            multiplier: 2.0,
        };
        assert_eq!(b.delay(0), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(400));
        assert_eq!(b.delay(10), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn connect_packet_carries_every_option() {
        let o = ClientOptions::new("127.0.0.1:1")
            .session_expiry(60)
            .receive_maximum(10)
            .maximum_packet_size(1000)
            .topic_alias_maximum(5)
            .keep_alive(7)
            .credentials("u", "p")
            .will(LastWill::new("w/t", "bye", QoS::AtLeastOnce, true));
        let c = o.connect_packet("id", false).unwrap();
        assert!(!c.clean_start);
        assert_eq!(c.keep_alive, 7);
        assert_eq!(c.properties.session_expiry_interval, Some(60));
        assert_eq!(c.properties.receive_maximum, Some(10));
        assert_eq!(c.properties.maximum_packet_size, Some(1000));
        assert_eq!(c.properties.topic_alias_maximum, Some(5));
        assert_eq!(c.username.as_deref(), Some("u"));
        assert_eq!(c.password.as_deref(), Some(&b"p"[..]));
        let w = c.will.unwrap();
        assert_eq!(
            (w.topic.as_str(), w.qos, w.retain),
            ("w/t", QoS::AtLeastOnce, true)
        );
        // 3.1.1 has no properties.
        let c = o
            .protocol(Protocol::V311)
            .connect_packet("id", true)
            .unwrap();
        assert!(c.properties.is_empty());
        assert!(ClientOptions::new("x")
            .will(LastWill::new("w/#", "", QoS::AtMostOnce, false))
            .connect_packet("id", true)
            .is_err());
    }
}

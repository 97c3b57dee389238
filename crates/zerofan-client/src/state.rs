//! Connection state as the application sees it.

use zerofan_codec::Props;

/// What the broker said when the current connection was accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnInfo {
    /// The broker still had this client's session.
    pub session_present: bool,
    /// CONNACK properties (MQTT 5): limits the broker imposes (receive
    /// maximum, maximum packet size, maximum QoS, topic alias maximum...).
    pub properties: Props,
    /// The client identifier in use (possibly assigned by the broker).
    pub client_id: String,
}

/// Where the client is, so callers can wait for a (re)connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Connecting for the first time.
    Connecting,
    /// The connection was lost (the error says why); reconnecting.
    Reconnecting(String),
    /// Connected.
    Connected(Box<ConnInfo>),
    /// Shut down for good.
    Closed,
}

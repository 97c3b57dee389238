//! A cluster node being removed (`zerofan cluster remove`) drains before it
//! leaves: its connected clients are told to go elsewhere (MQTT 5:
//! DISCONNECT 0x9D Server moved with a Server Reference naming the node that
//! holds the copies of this node's sessions, or 0x9C Use another server when
//! no node can be named; 3.1.1: closed), and every later CONNECT is refused
//! the same way (CONNACK 0x9D / 0x9C with the reference; 3.1.1: return code
//! 3). The sessions stay here, replicated, until their clients connect to
//! another node: that node's claim takes each one over with everything
//! queued and in flight, as any takeover does.

use zerofan_codec::{MqttStr, Properties, ReasonCode};

#[derive(Debug, Default)]
pub(crate) struct Drain {
    on: bool,
    /// The MQTT address clients are sent to, when one could be named.
    reference: Option<MqttStr>,
    /// Connections told to move (DISCONNECT or CONNACK).
    pub(crate) told: u64,
    /// Sessions another node took over since the drain began.
    pub(crate) moved: u64,
}

impl Drain {
    pub(crate) fn start(&mut self, reference: Option<&str>) {
        self.on = true;
        // A reference that is not a valid MQTT string cannot be sent: the
        // clients then get 0x9C without one.
        self.reference = reference.and_then(|r| MqttStr::try_from(r).ok());
    }

    pub(crate) fn active(&self) -> bool {
        self.on
    }

    /// 0x9D when a node can be named, 0x9C otherwise.
    pub(crate) fn reason(&self) -> ReasonCode {
        if self.reference.is_some() {
            ReasonCode::SERVER_MOVED
        } else {
            ReasonCode::USE_ANOTHER_SERVER
        }
    }

    /// Adds the Server Reference to an MQTT 5 DISCONNECT or CONNACK with
    /// `reason`, when it is this drain's.
    pub(crate) fn refer(&self, reason: ReasonCode, properties: &mut Properties) {
        if self.on && reason == ReasonCode::SERVER_MOVED {
            properties.server_reference = self.reference.clone();
        }
    }
}

//! Subscribe and unsubscribe requests and what the broker answered.

use zerofan_codec::{Props, QoS, ReasonCode, SubscriptionOptions};

/// When the broker sends retained messages for a new subscription (MQTT 5
/// Retain Handling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RetainHandling {
    /// Send retained messages at every subscribe (0, the default).
    #[default]
    SendAtSubscribe,
    /// Send them only if the subscription did not exist yet (1).
    SendIfNew,
    /// Never send them (2).
    DoNotSend,
}

/// One topic filter with every MQTT 5 subscription option. Under 3.1.1 only
/// the QoS goes on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    /// Topic filter, wildcards and `$share/group/...` allowed.
    pub filter: String,
    /// Options: maximum QoS, No Local, Retain As Published, Retain Handling.
    pub options: SubscriptionOptions,
}

impl Subscription {
    /// A subscription with maximum QoS `qos` and default options.
    pub fn new(filter: impl Into<String>, qos: QoS) -> Self {
        Subscription {
            filter: filter.into(),
            options: SubscriptionOptions {
                qos,
                ..Default::default()
            },
        }
    }

    /// No Local: do not receive this client's own publications.
    pub fn no_local(mut self, on: bool) -> Self {
        self.options.no_local = on;
        self
    }

    /// Retain As Published: keep the RETAIN flag of forwarded messages.
    pub fn retain_as_published(mut self, on: bool) -> Self {
        self.options.retain_as_published = on;
        self
    }

    /// Retain Handling.
    pub fn retain_handling(mut self, rh: RetainHandling) -> Self {
        self.options.retain_handling = match rh {
            RetainHandling::SendAtSubscribe => 0,
            RetainHandling::SendIfNew => 1,
            RetainHandling::DoNotSend => 2,
        };
        self
    }
}

/// The broker's SUBACK: one reason code per filter (granted QoS 0..=2 or a
/// failure code), so a caller can see which filters were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubAckInfo {
    /// One code per requested filter, in order.
    pub reasons: Vec<ReasonCode>,
    /// SUBACK properties (reason string, user properties).
    pub properties: Props,
}

/// The broker's UNSUBACK: one reason code per filter under MQTT 5 (empty
/// under 3.1.1, where UNSUBACK carries none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsubAckInfo {
    /// One code per filter (MQTT 5).
    pub reasons: Vec<ReasonCode>,
    /// UNSUBACK properties.
    pub properties: Props,
}

//! SUBSCRIBE and UNSUBSCRIBE, with retained messages delivered as Retain
//! Handling says.

use super::broker::Broker;
use super::ids::{ConnId, SessionId};
use super::outbox::Outgoing;
use super::peer::Deferred;
use super::session::{Queued, SubRecord};
use super::trie::SubEntry;
use std::time::Instant;
use zerofan_codec::{
    Packet, ReasonCode, SubAck, Subscribe, SubscriptionOptions, UnsubAck, Unsubscribe,
};

impl Broker {
    /// SUBSCRIBE from a client.
    pub(crate) fn on_subscribe(
        &mut self,
        now: Instant,
        conn: ConnId,
        sid: SessionId,
        sub: Subscribe,
    ) {
        if self.subscribe_waits(now, conn, sid, &sub) {
            return;
        }
        let v5 = self.conns.get(&conn).is_some_and(|c| c.protocol.is_v5());
        let bridge = self.conns.get(&conn).is_some_and(|c| c.bridge);
        let sub_id = sub.properties.subscription_identifiers.first().copied();
        let mut reasons = Vec::with_capacity(sub.filters.len());
        let mut replay = Replay {
            now,
            sub_id,
            filters: Vec::new(),
        };
        for (filter, options) in &sub.filters {
            let mut options = *options;
            let valid = zerofan_codec::topic::validate_topic_filter(filter).is_ok()
                && filter.split('/').count() <= self.config.max_topic_levels + 2;
            if !valid {
                reasons.push(if v5 {
                    ReasonCode::TOPIC_FILTER_INVALID
                } else {
                    ReasonCode::UNSPECIFIED_ERROR
                });
                continue;
            }
            if let Some(code) = self.subscribe_refused(now, conn, sid, filter, v5) {
                reasons.push(code);
                continue;
            }
            let (held, is_new) = self.sessions.get(&sid).map_or((0, true), |s| {
                let subs = &s.flight().subscriptions;
                (subs.len(), !subs.contains_key(filter.as_str()))
            });
            let q = super::quota::subscription_refused(
                &self.config,
                held,
                is_new,
                v5,
                &mut self.metrics.security,
            );
            if let Some(code) = q {
                reasons.push(code);
                continue;
            }
            let shared = zerofan_codec::topic::split_shared(filter);
            if shared.is_some() && options.no_local {
                // MQTT-3.8.3-4.
                self.protocol_error(now, conn, "No Local on a shared subscription");
                return;
            }
            if bridge && shared.is_none() {
                // What mosquitto does for a bridge: none of its own messages
                // back, and the retain flag as published.
                options.no_local = true;
                options.retain_as_published = true;
            }
            let record = SubRecord {
                options,
                id: sub_id,
            };
            let Some(s) = self.sessions.get_mut(&sid) else {
                return;
            };
            let is_new = s
                .flight_mut()
                .subscriptions
                .insert(filter.as_str().into(), record)
                .is_none();
            let entry = SubEntry {
                session: sid,
                options,
                id: sub_id,
            };
            self.dur_subscribed(sid, filter, record);
            self.router.subscribe(filter, entry);
            match shared {
                Some(_) => {}
                None => {
                    // Retained messages: always (0), only for a new
                    // subscription (1), never (2) (MQTT-3.3.1-9..11). Not for
                    // shared subscriptions (MQTT-3.8.4-? / 4.8.2).
                    let wanted = match options.retain_handling {
                        0 => true,
                        1 => is_new,
                        _ => false,
                    };
                    if wanted && self.config.retain_available {
                        replay.filters.push((filter.as_str().into(), options));
                    }
                }
            }
            reasons.push(ReasonCode(options.qos as u8));
            if self.events.on() {
                let id = self.sessions.get(&sid).map(|s| &s.client_id);
                self.events
                    .subscription(id, filter, Some(options.qos as u8), false);
            }
        }
        let suback = Packet::SubAck(SubAck {
            packet_id: sub.packet_id,
            properties: Default::default(),
            reasons,
        });
        let suback = Outgoing::from_packet(suback);
        match self.announce() {
            // A filter new to this shard: the SUBACK (and the retained
            // messages after it) waits until every shard routes the filter
            // here, so that a publish after it anywhere arrives.
            Some(seq) => self
                .peers
                .defer(seq, conn, Deferred::SubAck(suback, sid, replay)),
            None => self.subscribed(conn, sid, suback, replay),
        }
    }

    /// Send a SUBACK, then the retained messages the subscription replays.
    /// They are looked up now, not when the SUBSCRIBE arrived: a SUBACK
    /// that waited for the other shards has by now applied every retained
    /// message they routed before they knew of the subscription.
    pub(crate) fn subscribed(
        &mut self,
        conn: ConnId,
        sid: SessionId,
        suback: Outgoing,
        replay: Replay,
    ) {
        self.send_outgoing(conn, suback);
        let mut found = Vec::new();
        for (filter, options) in &replay.filters {
            found.clear();
            self.store.matching(filter, &mut found);
            for msg in found.drain(..) {
                if msg.is_expired(replay.now) || !self.may_deliver(sid, msg.topic.as_str()) {
                    continue;
                }
                let item = Queued {
                    qos: options.qos.min(msg.qos),
                    msg,
                    // A retained message sent because of a subscription
                    // keeps RETAIN=1 (MQTT-3.3.1-8 / 3.3.1-9).
                    retain: true,
                    sub_ids: replay.sub_id.into_iter().collect(),
                    share: None,
                    entry: None,
                    replay: true,
                };
                self.enqueue_replay(sid, item);
            }
        }
    }

    /// UNSUBSCRIBE from a client.
    pub(crate) fn on_unsubscribe(
        &mut self,
        now: Instant,
        conn: ConnId,
        sid: SessionId,
        unsub: Unsubscribe,
    ) {
        let v5 = self.conns.get(&conn).is_some_and(|c| c.protocol.is_v5());
        let mut reasons = Vec::with_capacity(unsub.filters.len());
        for filter in &unsub.filters {
            let existed = self
                .sessions
                .get_mut(&sid)
                .and_then(|s| s.flight_any())
                .is_some_and(|f| f.subscriptions.remove(filter.as_str()).is_some());
            if existed {
                if self.events.on() {
                    let id = self.sessions.get(&sid).map(|s| &s.client_id);
                    self.events.subscription(id, filter, None, true);
                }
                self.dur_unsubscribed(sid, filter);
                if filter.starts_with("$share/") {
                    self.hand_over_shared(now, sid, filter, false);
                }
                self.trie_remove(filter, sid);
            }
            reasons.push(if existed {
                ReasonCode::SUCCESS
            } else {
                ReasonCode::NO_SUBSCRIPTION_EXISTED
            });
        }
        self.send(
            conn,
            Packet::UnsubAck(UnsubAck {
                packet_id: unsub.packet_id,
                properties: Default::default(),
                reasons: if v5 { reasons } else { Vec::new() },
            }),
        );
    }
}

/// The retained messages a SUBSCRIBE asked for, looked up when its SUBACK
/// goes out (see `Broker::subscribed`).
#[derive(Debug)]
pub(crate) struct Replay {
    /// When the SUBSCRIBE arrived: what had expired by then is not sent.
    now: Instant,
    sub_id: Option<u32>,
    /// The non-shared filters that replay, with their options.
    filters: Vec<(Box<str>, SubscriptionOptions)>,
}

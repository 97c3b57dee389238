//! The bridge's MQTT 5 session on this broker, spoken over a packet link
//! ([`LinkEnd`]) instead of a socket: the client side of the QoS flows
//! (packet identifiers, the inflight window, PUBREL / PUBCOMP), session
//! resume after the broker closed the connection (a takeover, an admin
//! disconnect), and nothing else. What it sends is the remote message's
//! `Bytes`; what it receives is the core's delivery, which references the
//! shared message: no payload is copied, encoded or parsed on this side.

use super::link::LinkEnd;
use crate::core::{AckKind, Delivery, Outgoing};
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use zerofan_client::Backoff;
use zerofan_codec::{
    Ack, Connect, MqttStr, Packet, Properties, Props, Protocol, Publish, PublishHeader, QoS,
    ReasonCode, Subscribe, SubscriptionOptions,
};

/// Opens a new connection into the broker (the shell starts its task).
pub type Opener = Rc<dyn Fn() -> LinkEnd>;

/// How the session connects.
#[derive(Clone, Debug)]
pub(crate) struct LocalOptions {
    /// Client identifier.
    pub(crate) client_id: String,
    /// Clean Start on the first connection (later ones resume).
    pub(crate) clean_start: bool,
    /// Session Expiry Interval.
    pub(crate) session_expiry: u32,
    /// Receive Maximum announced, our inflight limit, and the bound of the
    /// deliveries waiting for the forwarding loop.
    pub(crate) max_inflight: u16,
}

/// A delivery handed to the bridge, with what acknowledges it.
pub(crate) struct Delivered {
    /// The core's delivery (the shared message and this delivery's flags).
    pub(crate) delivery: Delivery,
    /// `None` at QoS 0.
    pub(crate) token: Option<LocalToken>,
}

/// Acknowledges one QoS 1/2 delivery ([`Local::ack`]); a token from an
/// earlier connection is ignored (the broker sends the message again).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LocalToken {
    generation: u32,
    packet_id: u16,
    qos: QoS,
}

/// Why a publish into the broker was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Over the broker's Maximum Packet Size.
    TooLarge,
    /// Not a valid topic name here.
    BadTopic,
}

/// The answer to a QoS 1/2 publish: the reason code of PUBACK / PUBREC /
/// PUBCOMP; `Err` when the session ended first.
pub(crate) type Answer = oneshot::Receiver<ReasonCode>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// QoS 1, waiting for PUBACK.
    Ack,
    /// QoS 2, waiting for PUBREC.
    Rec,
    /// QoS 2, PUBREL sent, waiting for PUBCOMP.
    Comp,
}

struct Out {
    publish: Publish,
    stage: Stage,
    /// Sending order, for a resend after a reconnect.
    seq: u64,
    done: Option<oneshot::Sender<ReasonCode>>,
}

struct State {
    opts: LocalOptions,
    link: Option<Rc<LinkEnd>>,
    /// Connections made; tells a token's connection.
    generation: u32,
    connected_once: bool,
    window: usize,
    max_packet: u32,
    next_pid: u16,
    seq: u64,
    inflight: HashMap<u16, Out>,
    /// Granted subscriptions, restored if a reconnect finds no session.
    subscriptions: Vec<(MqttStr, SubscriptionOptions)>,
    subacks: HashMap<u16, oneshot::Sender<Vec<ReasonCode>>>,
    deliveries: VecDeque<Delivered>,
    cap: usize,
}

/// The bridge's session on this broker. Cheap to clone: every clone is
/// the same session.
#[derive(Clone)]
pub(crate) struct Local {
    st: Rc<RefCell<State>>,
    /// Any change a waiting call may look for: connected, window opened,
    /// deliveries added or taken.
    changed: Rc<Notify>,
    opener: Opener,
}

/// The session ended, or a connection attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Down(pub(crate) Option<ReasonCode>);

impl Local {
    /// A session not connected yet.
    pub(crate) fn new(opener: Opener, opts: LocalOptions) -> Local {
        let cap = usize::from(opts.max_inflight.max(1)).clamp(64, super::link::LINK_PACKETS);
        Local {
            st: Rc::new(RefCell::new(State {
                opts,
                link: None,
                generation: 0,
                connected_once: false,
                window: 1,
                max_packet: u32::MAX,
                next_pid: 1,
                seq: 0,
                inflight: HashMap::new(),
                subscriptions: Vec::new(),
                subacks: HashMap::new(),
                deliveries: VecDeque::new(),
                cap,
            })),
            changed: Rc::new(Notify::new()),
            opener,
        }
    }

    /// One connection attempt: CONNECT, CONNACK, then what the session
    /// needs resent (unacknowledged publishes, PUBREL, subscriptions the
    /// broker lost).
    pub(crate) async fn connect(&self) -> Result<(), Down> {
        let link = Rc::new((self.opener)());
        let connect = {
            let st = self.st.borrow();
            let o = &st.opts;
            let mut props = Properties::default();
            if o.session_expiry > 0 {
                props.session_expiry_interval = Some(o.session_expiry);
            }
            props.receive_maximum = Some(o.max_inflight.max(1));
            let client_id = MqttStr::try_from(o.client_id.as_str()).map_err(|_| Down(None))?;
            Connect {
                protocol: Protocol::V5,
                clean_start: if st.connected_once {
                    false
                } else {
                    o.clean_start
                },
                keep_alive: 0,
                properties: props.into(),
                client_id,
                will: None,
                username: None,
                password: None,
                bridge: false,
            }
        };
        link.to_broker
            .push_control(Packet::Connect(Box::new(connect)))
            .map_err(|_| Down(None))?;
        let first = std::future::poll_fn(|cx| link.from_broker.poll_pop(cx)).await;
        let ack = match first {
            Some(Outgoing::Packet(p)) => match *p {
                Packet::ConnAck(a) => a,
                _ => return Err(Down(None)),
            },
            _ => return Err(Down(None)),
        };
        if ack.reason.is_error() {
            return Err(Down(Some(ack.reason)));
        }
        let mut st = self.st.borrow_mut();
        st.window = usize::from(
            ack.properties
                .receive_maximum
                .unwrap_or(u16::MAX)
                .min(st.opts.max_inflight)
                .max(1),
        );
        st.max_packet = ack.properties.maximum_packet_size.unwrap_or(u32::MAX);
        st.generation = st.generation.wrapping_add(1);
        st.connected_once = true;
        // In sending order; control packets pass the queue's bounds, and
        // the window bounds how many there are.
        let mut again: Vec<(u64, u16)> = st.inflight.iter().map(|(p, o)| (o.seq, *p)).collect();
        again.sort_unstable();
        for (_, pid) in again {
            let Some(o) = st.inflight.get(&pid) else {
                continue;
            };
            let p = if o.stage == Stage::Comp {
                Packet::PubRel(ack_of(pid))
            } else {
                let mut p = o.publish.clone();
                p.dup = true;
                Packet::Publish(p)
            };
            let _ = link.to_broker.push_control(p);
        }
        if !ack.session_present && !st.subscriptions.is_empty() {
            let filters = st.subscriptions.clone();
            let pid = st.alloc_pid();
            let _ = link.to_broker.push_control(Packet::Subscribe(Subscribe {
                packet_id: pid,
                properties: Props::default(),
                filters,
            }));
        }
        // QoS 1/2 deliveries of the old connection come again.
        st.deliveries.retain(|d| d.token.is_none());
        // A SUBSCRIBE the old connection did not see answered: its caller
        // is told (the filters were resent above if the session is new).
        st.subacks.clear();
        st.link = Some(link);
        drop(st);
        self.changed.notify_waiters();
        Ok(())
    }

    /// Connect, retrying with `backoff` until it works.
    pub(crate) async fn connect_retrying(&self, backoff: &Backoff) {
        let mut attempt = 0u32;
        loop {
            match self.connect().await {
                Ok(()) => return,
                Err(e) => tracing::warn!(reason = ?e.0, "bridge: local connection refused"),
            }
            tokio::time::sleep(backoff.delay(attempt)).await;
            attempt = attempt.saturating_add(1);
        }
    }

    /// Read what the broker sends, for as long as the session lives:
    /// answers complete publishes, deliveries queue for [`Local::recv_many`]
    /// (while that queue is full nothing more is read: back-pressure into
    /// the broker), and a lost connection is made again.
    pub(crate) async fn drive(&self, backoff: &Backoff) {
        loop {
            let link = self.st.borrow().link.clone();
            let Some(link) = link else {
                self.connect_retrying(backoff).await;
                continue;
            };
            loop {
                self.wait_for(|st| st.deliveries.len() < st.cap).await;
                let item = std::future::poll_fn(|cx| link.from_broker.poll_pop(cx)).await;
                let Some(item) = item else {
                    break;
                };
                self.on_item(&link, item);
                // What else is there now, then the waiters are told once.
                while self.st.borrow().deliveries.len() < self.st.borrow().cap {
                    let Some(item) = link.from_broker.try_pop() else {
                        break;
                    };
                    self.on_item(&link, item);
                }
                self.changed.notify_waiters();
            }
            tracing::info!("bridge: local connection closed; reconnecting");
            self.st.borrow_mut().link = None;
            self.changed.notify_waiters();
            tokio::time::sleep(backoff.delay(0)).await;
        }
    }

    /// One item from the broker (the caller tells the waiters).
    fn on_item(&self, link: &LinkEnd, item: Outgoing) {
        let mut st = self.st.borrow_mut();
        match item {
            Outgoing::Publish(d) => {
                let token = (d.qos != QoS::AtMostOnce).then_some(LocalToken {
                    generation: st.generation,
                    packet_id: d.packet_id,
                    qos: d.qos,
                });
                st.deliveries.push_back(Delivered { delivery: d, token });
            }
            Outgoing::Ack {
                kind,
                packet_id,
                reason,
            } => st.on_ack(link, kind, packet_id, reason),
            Outgoing::Packet(p) => match *p {
                Packet::PubAck(a) => st.on_ack(link, AckKind::PubAck, a.packet_id, a.reason),
                Packet::PubRec(a) => st.on_ack(link, AckKind::PubRec, a.packet_id, a.reason),
                Packet::PubRel(a) => st.on_ack(link, AckKind::PubRel, a.packet_id, a.reason),
                Packet::PubComp(a) => st.on_ack(link, AckKind::PubComp, a.packet_id, a.reason),
                Packet::SubAck(s) => {
                    if let Some(tx) = st.subacks.remove(&s.packet_id) {
                        let _ = tx.send(s.reasons);
                    }
                }
                Packet::Disconnect(d) => {
                    tracing::warn!(
                        reason = d.reason.0,
                        "bridge: the broker closes the local connection"
                    );
                }
                _ => {}
            },
        }
    }

    /// Wait until `ready` holds (checked at each change).
    async fn wait_for(&self, ready: impl Fn(&State) -> bool) {
        loop {
            if ready(&self.st.borrow()) {
                return;
            }
            // Registered before anything else runs (one thread, no await
            // in between), so no change is missed.
            self.changed.notified().await;
        }
    }

    /// Subscribe (QoS, No Local, Retain As Published per filter); the
    /// reason codes come back. Kept for a reconnect that finds no session.
    pub(crate) async fn subscribe(
        &self,
        filters: Vec<(MqttStr, SubscriptionOptions)>,
    ) -> Result<Vec<ReasonCode>, Down> {
        self.wait_for(|st| st.link.is_some()).await;
        let rx = {
            let mut st = self.st.borrow_mut();
            let pid = st.alloc_pid();
            let (tx, rx) = oneshot::channel();
            st.subacks.insert(pid, tx);
            st.subscriptions.extend(filters.iter().cloned());
            let link = st.link.clone().ok_or(Down(None))?;
            link.to_broker
                .push_control(Packet::Subscribe(Subscribe {
                    packet_id: pid,
                    properties: Props::default(),
                    filters,
                }))
                .map_err(|_| Down(None))?;
            rx
        };
        rx.await.map_err(|_| Down(None))
    }

    /// Up to `max` deliveries, waiting for the first; 0 never (the session
    /// lives as long as the bridge).
    pub(crate) async fn recv_many(&self, out: &mut Vec<Delivered>, max: usize) -> usize {
        self.wait_for(|st| !st.deliveries.is_empty()).await;
        let n = {
            let mut st = self.st.borrow_mut();
            let n = max.max(1).min(st.deliveries.len());
            out.extend(st.deliveries.drain(..n));
            n
        };
        self.changed.notify_waiters();
        n
    }

    /// Acknowledge a delivery: PUBACK, or PUBREC (PUBCOMP follows the
    /// broker's PUBREL by itself).
    pub(crate) fn ack(&self, token: LocalToken) {
        let st = self.st.borrow();
        if token.generation != st.generation {
            return;
        }
        let Some(link) = &st.link else {
            return;
        };
        let a = ack_of(token.packet_id);
        let p = match token.qos {
            QoS::AtMostOnce => return,
            QoS::AtLeastOnce => Packet::PubAck(a),
            QoS::ExactlyOnce => Packet::PubRec(a),
        };
        // Fails only when the connection is gone: the message comes again.
        let _ = link.to_broker.push_control(p);
    }

    /// Publish into the broker: waits for the connection, the inflight
    /// window and room in the link. QoS 0: `None` once handed over; QoS
    /// 1/2: the broker's answer to come (the message is resent after a
    /// reconnect until then).
    pub(crate) async fn publish(
        &self,
        topic: &str,
        qos: QoS,
        retain: bool,
        properties: Props,
        payload: Bytes,
    ) -> Result<Option<Answer>, Refused> {
        if zerofan_codec::topic::validate_topic_name(topic).is_err() {
            return Err(Refused::BadTopic);
        }
        let topic = MqttStr::try_from(topic).map_err(|_| Refused::BadTopic)?;
        let mut publish = Publish {
            dup: false,
            qos,
            retain,
            topic,
            packet_id: 0,
            properties,
            payload,
        };
        let max_packet = self.st.borrow().max_packet;
        if max_packet < u32::MAX {
            // The test the broker makes of a framed packet (the size is
            // computed, nothing is encoded).
            let h = PublishHeader {
                dup: false,
                qos,
                retain,
                packet_id: 1,
                topic: publish.topic.as_str(),
                topic_alias: None,
                properties: &publish.properties,
                message_expiry_interval: publish.properties.message_expiry_interval,
                subscription_identifiers: &[],
                payload_len: publish.payload.len(),
            };
            let len = h.packet_len(Protocol::V5).unwrap_or(usize::MAX);
            if len as u64 > u64::from(max_packet) {
                return Err(Refused::TooLarge);
            }
        }
        let weight = publish.payload.len() + publish.topic.len();
        if qos == QoS::AtMostOnce {
            self.wait_for(|st| st.link.is_some()).await;
            let link = self.st.borrow().link.clone();
            if let Some(link) = link {
                // Lost if the connection goes meanwhile, as QoS 0 over a
                // socket.
                let _ = link.to_broker.push(Packet::Publish(publish), weight).await;
            }
            return Ok(None);
        }
        self.wait_for(|st| st.link.is_some() && st.inflight.len() < st.window)
            .await;
        let (tx, rx) = oneshot::channel();
        let (link, generation, pid) = {
            let mut st = self.st.borrow_mut();
            let pid = st.alloc_pid();
            publish.packet_id = pid;
            let seq = st.seq;
            st.seq += 1;
            st.inflight.insert(
                pid,
                Out {
                    publish: publish.clone(),
                    stage: if qos == QoS::AtLeastOnce {
                        Stage::Ack
                    } else {
                        Stage::Rec
                    },
                    seq,
                    done: Some(tx),
                },
            );
            (st.link.clone(), st.generation, pid)
        };
        if let Some(link) = link {
            let room = std::future::poll_fn(|cx| link.to_broker.poll_room(cx, weight)).await;
            let st = self.st.borrow();
            // A reconnect meanwhile resent it (it is in the window).
            if room.is_ok() && st.generation == generation && st.inflight.contains_key(&pid) {
                let _ = link.to_broker.try_push(Packet::Publish(publish), weight);
            }
        }
        Ok(Some(rx))
    }
}

impl State {
    fn alloc_pid(&mut self) -> u16 {
        // The window (at most 65,535) keeps a free identifier.
        for _ in 0..=u16::MAX {
            let pid = self.next_pid;
            self.next_pid = self.next_pid.checked_add(1).unwrap_or(1);
            if !self.inflight.contains_key(&pid) && !self.subacks.contains_key(&pid) {
                return pid;
            }
        }
        self.next_pid
    }

    fn on_ack(&mut self, link: &LinkEnd, kind: AckKind, pid: u16, reason: ReasonCode) {
        let stage = self.inflight.get(&pid).map(|o| o.stage);
        let finish = |st: &mut State, reason| {
            if let Some(o) = st.inflight.remove(&pid) {
                if let Some(d) = o.done {
                    let _ = d.send(reason);
                }
            }
        };
        match (kind, stage) {
            (AckKind::PubAck, Some(Stage::Ack)) | (AckKind::PubComp, Some(Stage::Comp)) => {
                finish(self, reason)
            }
            (AckKind::PubRec, Some(Stage::Rec)) if reason.is_error() => finish(self, reason),
            (AckKind::PubRec, Some(Stage::Rec | Stage::Comp)) => {
                if let Some(o) = self.inflight.get_mut(&pid) {
                    o.stage = Stage::Comp;
                    // Accepted: the broker has it; nothing to resend but PUBREL.
                    o.publish.payload = Bytes::new();
                }
                let _ = link.to_broker.push_control(Packet::PubRel(ack_of(pid)));
            }
            (AckKind::PubRel, _) => {
                // For a QoS 2 delivery we answered with PUBREC.
                let _ = link.to_broker.push_control(Packet::PubComp(ack_of(pid)));
            }
            _ => {}
        }
    }
}

fn ack_of(packet_id: u16) -> Ack {
    Ack {
        packet_id,
        ..Default::default()
    }
}

/// Reconnect quickly: the broker is in this process.
pub(crate) fn local_backoff() -> Backoff {
    Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(2),
        multiplier: 2.0,
    }
}

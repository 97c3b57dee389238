//! One bridge at run time: its session on this broker, spoken over a
//! packet link the shell gives (`local.rs`, `shell/local_conn.rs`: payloads
//! cross as `Bytes`, nothing is encoded or parsed on this side), a
//! `zerofan-client` connection to the remote broker (failover over its
//! addresses, TLS when configured), and a forwarding loop each way.
//!
//! QoS 1/2 end to end: both sides acknowledge by hand, and a message is
//! acknowledged to the side it came from only once the other side
//! acknowledged the bridge's copy. At most `max_queued_messages` are
//! unacknowledged each way (the bridge's Receive Maximum, and the
//! forwarding loop's limit). So when the remote broker is down, the rest
//! waits in the bridge's session on this broker (bounded by
//! `max_queued_messages`, counted, and durable with persistence), and what
//! was in flight is sent again after a reconnect, by the bridge's client
//! or, after a restart, by this broker.
//!
//! Loops: the bridge's subscriptions carry No Local (MQTT 5), so a broker
//! does not send the bridge what the bridge itself published there; a
//! 3.1.1 remote gets mosquitto's `try_private` mark instead.

use super::config::{BridgeConfig, BridgeProtocol, BridgeTopic};
use super::local::{Delivered, Local, LocalOptions, Opener};
use super::stats::BridgeStats;
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zerofan_client::{
    AckToken, Backoff, Client, ClientError, ClientOptions, ConnState, Connector, Incoming,
    LastWill, Message, Protocol, PublishAck, PublishOptions, QoS, ReasonCode, Subscription,
    Transport,
};
use zerofan_codec::{MqttStr, SubscriptionOptions};

/// Publishes a retained message on this broker as the broker itself (the
/// notification topic may be under `$SYS/`, which clients may not write).
pub type Notify = Rc<dyn Fn(&str, Bytes)>;

/// Which way messages cross.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Local to remote.
    Out,
    /// Remote to local.
    In,
}

/// Run the bridge until the task is aborted. `local` opens connections
/// into this broker.
pub async fn run(
    cfg: BridgeConfig,
    local: Opener,
    remote: Transport,
    notify: Notify,
    stats: Rc<BridgeStats>,
) {
    let state_topic = cfg.state_topic();
    if cfg.notifications {
        notify(&state_topic, Bytes::from_static(b"0"));
    }
    let backoff = Backoff {
        initial: Duration::from_secs(u64::from(cfg.restart_timeout)),
        max: Duration::from_secs(u64::from(cfg.restart_timeout_max)),
        multiplier: 2.0,
    };
    let lc = Local::new(local, local_options(&cfg));
    let local_backoff = super::local::local_backoff();
    lc.connect_retrying(&local_backoff).await;
    let Some((rc, rrx)) =
        connect_retrying(remote_options(&cfg, remote, backoff), &backoff, &stats).await
    else {
        return;
    };
    let out: Vec<BridgeTopic> = cfg
        .topic
        .iter()
        .filter(|t| t.direction.out())
        .cloned()
        .collect();
    let inward: Vec<BridgeTopic> = cfg
        .topic
        .iter()
        .filter(|t| t.direction.inward())
        .cloned()
        .collect();
    let v5 = cfg.protocol_version == BridgeProtocol::V5;
    let max = cfg.max_queued_messages;
    let watch = watch_state(
        rc.clone(),
        cfg.notifications.then_some((state_topic, notify)),
        stats.clone(),
    );
    tokio::join!(
        lc.drive(&local_backoff),
        async {
            subscribe_local(&lc, &out, &cfg.name).await;
            forward_out(&lc, &rc, &out, max, &stats).await;
        },
        async {
            subscribe(&rc, &inward, Way::In, v5, &cfg.name).await;
            forward_in(rrx, &rc, &lc, &inward, max, &stats).await;
        },
        watch,
    );
}

/// The bridge's session on this broker: always MQTT 5 (No Local), kept
/// across restarts unless `cleansession`.
fn local_options(cfg: &BridgeConfig) -> LocalOptions {
    LocalOptions {
        client_id: cfg.local_id(),
        clean_start: cfg.cleansession,
        session_expiry: if cfg.cleansession { 0 } else { u32::MAX },
        max_inflight: clamp_u16(cfg.max_queued_messages),
    }
}

fn remote_options(cfg: &BridgeConfig, remote: Transport, backoff: Backoff) -> ClientOptions {
    let protocol = match cfg.protocol_version {
        BridgeProtocol::V31 => Protocol::V31,
        BridgeProtocol::V311 => Protocol::V311,
        BridgeProtocol::V5 => Protocol::V5,
    };
    let mut o = ClientOptions::with_transport(remote)
        .protocol(protocol)
        .client_id(cfg.remote_id())
        .clean_start(cfg.cleansession)
        .keep_alive(cfg.keepalive_interval)
        .incoming_capacity(cfg.max_queued_messages)
        .max_inflight(clamp_u16(cfg.max_queued_messages))
        .receive_maximum(clamp_u16(cfg.max_queued_messages))
        .manual_acks(true)
        .backoff(backoff)
        .bridge(cfg.try_private && protocol != Protocol::V5);
    if protocol == Protocol::V5 && !cfg.cleansession {
        o = o.session_expiry(u32::MAX);
    }
    if cfg.max_packet_size > 0 {
        o = o.maximum_packet_size(cfg.max_packet_size);
    }
    if let Some(u) = &cfg.remote_username {
        o.username = Some(u.clone());
        o.password = cfg.remote_password.clone().map(Bytes::from);
    }
    if cfg.notifications {
        // The remote broker says `0` for us when we vanish.
        o = o.will(LastWill::new(
            cfg.state_topic(),
            Bytes::from_static(b"0"),
            QoS::AtLeastOnce,
            true,
        ));
    }
    o
}

fn clamp_u16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX).max(1)
}

/// `Client::connect` gives up after a failed first attempt; a bridge keeps
/// trying, with its backoff.
async fn connect_retrying(
    mut opts: ClientOptions,
    backoff: &Backoff,
    stats: &BridgeStats,
) -> Option<(Client, Incoming)> {
    let mut attempt = 0u32;
    loop {
        match Client::connect(opts.clone()).await {
            Ok(c) => return Some(c),
            Err(e) => {
                stats.connect_failures.set(stats.connect_failures.get() + 1);
                tracing::warn!(client_id = %opts.client_id, error = %e, "bridge connect failed");
                if matches!(e, ClientError::InvalidTopic(_)) {
                    return None;
                }
                if opts.bridge
                    && matches!(e, ClientError::Refused(r) if r == ReasonCode::UNSUPPORTED_PROTOCOL_VERSION)
                {
                    // mosquitto gives up here; a broker that refuses the
                    // mark (zerofan itself) still gets a working bridge.
                    tracing::warn!(
                        client_id = %opts.client_id,
                        "remote broker refuses try_private; bridging without it (use \
                         bridge_protocol_version mqttv50 for loop prevention)"
                    );
                    opts.bridge = false;
                    continue;
                }
            }
        }
        tokio::time::sleep(backoff.delay(attempt)).await;
        attempt = attempt.saturating_add(1);
    }
}

async fn subscribe(c: &Client, topics: &[BridgeTopic], way: Way, no_local: bool, name: &str) {
    if topics.is_empty() {
        return;
    }
    let subs: Vec<Subscription> = topics
        .iter()
        .map(|t| {
            let filter = match way {
                Way::Out => t.local_filter(),
                Way::In => t.remote_filter(),
            };
            Subscription::new(filter, qos_of(t.qos))
                .no_local(no_local)
                .retain_as_published(no_local)
        })
        .collect();
    match c.subscribe_many(subs, Default::default()).await {
        Ok(ack) => {
            for (t, r) in topics.iter().zip(&ack.reasons) {
                if r.is_error() {
                    tracing::warn!(bridge = name, topic = %t.pattern, reason = r.0, "bridge subscription refused");
                }
            }
        }
        Err(e) => tracing::warn!(bridge = name, error = %e, "bridge subscribe failed"),
    }
}

async fn subscribe_local(lc: &Local, topics: &[BridgeTopic], name: &str) {
    let mut filters = Vec::new();
    for t in topics {
        let Ok(f) = MqttStr::try_from(t.local_filter()) else {
            tracing::warn!(bridge = name, topic = %t.pattern, "bridge subscription refused");
            continue;
        };
        let options = SubscriptionOptions {
            qos: qos_of(t.qos),
            no_local: true,
            retain_as_published: true,
            retain_handling: 0,
        };
        filters.push((f, options));
    }
    if filters.is_empty() {
        return;
    }
    match lc.subscribe(filters).await {
        Ok(reasons) => {
            for (t, r) in topics.iter().zip(&reasons) {
                if r.is_error() {
                    tracing::warn!(bridge = name, topic = %t.pattern, reason = r.0, "bridge subscription refused");
                }
            }
        }
        Err(e) => tracing::warn!(bridge = name, reason = ?e.0, "bridge subscribe failed"),
    }
}

fn qos_of(q: u8) -> QoS {
    match q {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

/// The topic on the other side: the first `topic` line whose filter on
/// this side matches, with this side's prefix swapped for the other's.
pub fn map_topic(topics: &[BridgeTopic], way: Way, topic: &str) -> Option<String> {
    topics.iter().find_map(|t| {
        let (here, there, filter) = match way {
            Way::Out => (&t.local_prefix, &t.remote_prefix, t.local_filter()),
            Way::In => (&t.remote_prefix, &t.local_prefix, t.remote_filter()),
        };
        if !zerofan_codec::topic::matches(&filter, topic) {
            return None;
        }
        let rest = topic.strip_prefix(here.as_str())?;
        Some(format!("{there}{rest}"))
    })
}

/// This broker to the remote one: each delivery's payload (the shared
/// message's `Bytes`) goes to the remote client as it is.
async fn forward_out(
    from: &Local,
    to: &Client,
    topics: &[BridgeTopic],
    max: usize,
    stats: &BridgeStats,
) {
    let mut pending = FuturesUnordered::new();
    let mut batch: Vec<Delivered> = Vec::new();
    loop {
        let room = max.saturating_sub(pending.len());
        tokio::select! {
            biased;
            Some((r, token)) = pending.next(), if !pending.is_empty() => {
                let outcome = match r {
                    Ok(PublishAck { reason, .. }) if !reason.is_error() => Outcome::Taken,
                    Err(ClientError::Closed) => Outcome::Closed,
                    _ => Outcome::Refused,
                };
                if settle(outcome, true, stats) {
                    if let Some(t) = token {
                        from.ack(t);
                    }
                }
            }
            _ = from.recv_many(&mut batch, room.max(1)), if room > 0 => {
                for Delivered { delivery: d, token } in batch.drain(..) {
                    let m = &d.message;
                    let Some(topic) = map_topic(topics, Way::Out, m.topic.as_str()) else {
                        // Nothing to send it to: taken (and counted) as lost.
                        stats.dropped(true);
                        if let Some(t) = token {
                            from.ack(t);
                        }
                        continue;
                    };
                    let len = m.payload.len() as u64;
                    // MQTT 5 properties cross with the message, with the
                    // expiry left; nothing is allocated when there are none.
                    let mut properties = if m.properties.is_allocated() {
                        (*m.properties).clone()
                    } else {
                        Default::default()
                    };
                    if d.message_expiry_interval.is_some() {
                        properties.message_expiry_interval = d.message_expiry_interval;
                    }
                    let opts = PublishOptions {
                        retain: d.retain,
                        properties,
                    };
                    match to.publish_ext(&topic, d.qos, &opts, m.payload.clone()).await {
                        Ok(done) => {
                            stats.sent(true, len);
                            if d.qos != QoS::AtMostOnce {
                                pending.push(async move { (done.await, token) });
                            }
                        }
                        Err(e) => {
                            stats.dropped(true);
                            tracing::debug!(error = %e, %topic, "bridge publish failed");
                            if let Some(t) = token {
                                from.ack(t);
                            }
                        }
                    }
                }
            }
        }
        stats.set_queued(true, pending.len());
    }
}

/// The remote broker to this one: each message's payload (a slice of the
/// client's read buffer) goes into this broker as it is.
async fn forward_in(
    mut rx: Incoming,
    from: &Client,
    to: &Local,
    topics: &[BridgeTopic],
    max: usize,
    stats: &BridgeStats,
) {
    let mut pending = FuturesUnordered::<LocalWait>::new();
    let mut batch: Vec<Message> = Vec::new();
    loop {
        let room = max.saturating_sub(pending.len());
        tokio::select! {
            biased;
            Some((r, token)) = pending.next(), if !pending.is_empty() => {
                let outcome = match r {
                    Some(reason) if !reason.is_error() => Outcome::Taken,
                    Some(_) => Outcome::Refused,
                    None => Outcome::Closed,
                };
                if settle(outcome, false, stats) {
                    ack(from, token).await;
                }
            }
            n = rx.recv_many(&mut batch, room.max(1)), if room > 0 => {
                if n == 0 {
                    return;
                }
                for m in batch.drain(..) {
                    let token = m.ack_token();
                    let Some(topic) = map_topic(topics, Way::In, m.topic()) else {
                        stats.dropped(false);
                        ack(from, token).await;
                        continue;
                    };
                    let len = m.payload.len() as u64;
                    // The client dropped subscription identifiers and topic
                    // aliases; a 3.1.1 remote sends none.
                    match to.publish(&topic, m.qos, m.retain, m.properties, m.payload).await {
                        Ok(answer) => {
                            stats.sent(false, len);
                            match answer {
                                Some(answer) => pending.push(LocalWait { answer, token }),
                                None => ack(from, token).await,
                            }
                        }
                        Err(e) => {
                            stats.dropped(false);
                            tracing::debug!(error = ?e, %topic, "bridge publish failed");
                            ack(from, token).await;
                        }
                    }
                }
            }
        }
        stats.set_queued(false, pending.len());
    }
}

/// The broker's answer to come (`None`: the session ended), and what
/// acknowledges the message to the remote broker.
/// (A named future: no allocation of its own per message.)
struct LocalWait {
    answer: super::local::Answer,
    token: Option<AckToken>,
}

impl std::future::Future for LocalWait {
    type Output = (Option<ReasonCode>, Option<AckToken>);

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let r = std::task::ready!(std::pin::Pin::new(&mut self.answer).poll(cx));
        std::task::Poll::Ready((r.ok(), self.token))
    }
}

/// How the other side answered for a message.
enum Outcome {
    Taken,
    /// Refused there (its ACL, its limits): gone.
    Refused,
    /// The bridge is shutting down.
    Closed,
}

/// Whether to acknowledge the message where it came from: not when the
/// bridge is shutting down (then the sending broker keeps it for the next
/// start).
fn settle(outcome: Outcome, out: bool, stats: &BridgeStats) -> bool {
    match outcome {
        Outcome::Taken => true,
        Outcome::Refused => {
            stats.dropped(out);
            true
        }
        Outcome::Closed => false,
    }
}

async fn ack(from: &Client, token: Option<AckToken>) {
    if let Some(t) = token {
        // Fails only when the client is closed: the message comes again.
        let _ = from.ack(t).await;
    }
}

/// Follow the remote connection: figures, and `1`/`0` on the
/// notification topic here and `1` there (the will says `0` there).
async fn watch_state(remote: Client, notify: Option<(String, Notify)>, stats: Rc<BridgeStats>) {
    let mut w = remote.state_watch();
    let mut was = false;
    loop {
        let up = matches!(*w.borrow_and_update(), ConnState::Connected(_));
        if up != was {
            was = up;
            stats.connected.set(up);
            if up {
                stats.connects.set(stats.connects.get() + 1);
            }
            if let Some((topic, notify)) = &notify {
                let v: &'static [u8] = if up { b"1" } else { b"0" };
                notify(topic, Bytes::from_static(v));
                if up {
                    let opts = PublishOptions {
                        retain: true,
                        ..PublishOptions::default()
                    };
                    // Not awaited: the state is best effort on that side.
                    let _ = remote
                        .publish_ext(topic, QoS::AtLeastOnce, &opts, Bytes::from_static(b"1"))
                        .await;
                }
            }
            tracing::info!(up, "bridge connection state");
        }
        if w.changed().await.is_err() {
            return;
        }
    }
}

/// The remote side's transport: TCP or TLS, one address per attempt,
/// moving to the next after a failure (mosquitto's failover order).
pub fn remote_transport(
    addresses: Vec<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Transport {
    let addrs: Arc<[String]> = addresses.into();
    let next = Arc::new(AtomicUsize::new(0));
    Transport::Custom(Connector::new(move || {
        let addrs = addrs.clone();
        let next = next.clone();
        let tls = tls.clone();
        Box::pin(async move {
            let i = next.load(Ordering::Relaxed) % addrs.len().max(1);
            let addr = addrs.get(i).cloned().unwrap_or_default();
            let attempt = async {
                let s = tokio::net::TcpStream::connect(addr.as_str()).await?;
                s.set_nodelay(true)?;
                match &tls {
                    None => Ok::<zerofan_client::BoxedIo, std::io::Error>(Box::new(s)),
                    Some(config) => {
                        let host = host_of(&addr);
                        let name = rustls::pki_types::ServerName::try_from(host).map_err(|e| {
                            std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
                        })?;
                        let c = tokio_rustls::TlsConnector::from(config.clone());
                        Ok(Box::new(c.connect(name, s).await?) as zerofan_client::BoxedIo)
                    }
                }
            };
            let r = attempt.await;
            if r.is_err() {
                next.store((i + 1) % addrs.len().max(1), Ordering::Relaxed);
            }
            r
        })
    }))
}

fn host_of(addr: &str) -> String {
    let h = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    h.trim_start_matches('[').trim_end_matches(']').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::Direction;

    fn t(pattern: &str, local: &str, remote: &str) -> BridgeTopic {
        BridgeTopic {
            pattern: pattern.into(),
            direction: Direction::Both,
            qos: 1,
            local_prefix: local.into(),
            remote_prefix: remote.into(),
        }
    }

    #[test]
    fn prefixes_swap() {
        let topics = [t("sensors/#", "", "site1/"), t("", "here/all", "there/all")];
        assert_eq!(
            map_topic(&topics, Way::Out, "sensors/a").as_deref(),
            Some("site1/sensors/a")
        );
        assert_eq!(
            map_topic(&topics, Way::In, "site1/sensors/a").as_deref(),
            Some("sensors/a")
        );
        assert_eq!(
            map_topic(&topics, Way::Out, "here/all").as_deref(),
            Some("there/all")
        );
        assert_eq!(map_topic(&topics, Way::Out, "other"), None);
        assert_eq!(map_topic(&topics, Way::In, "sensors/a"), None);
    }

    #[test]
    fn hosts_of_addresses() {
        assert_eq!(host_of("broker.example:8883"), "broker.example");
        assert_eq!(host_of("[::1]:8883"), "::1");
    }
}

//! One bridge at run time: two `zerofan-client` connections, one into this
//! broker (over whatever [`Transport`] the shell gives: an in-memory pipe
//! accepted like a socket), one to the remote broker (failover over its
//! addresses, TLS when configured), and a forwarding loop each way.
//!
//! QoS 1/2 end to end: both clients acknowledge by hand
//! (`manual_acks`), and a message is acknowledged to the side it came
//! from only once the other side acknowledged the bridge's copy. At most
//! `max_queued_messages` are unacknowledged each way (the bridge's
//! Receive Maximum, and the forwarding loop's limit). So when the remote
//! broker is down, the rest waits in the bridge's session on this broker
//! (bounded by `max_queued_messages`, counted, and durable with
//! persistence), and what was in flight is sent again after a reconnect,
//! by the bridge's client or, after a restart, by this broker.
//!
//! Loops: the bridge's subscriptions carry No Local (MQTT 5), so a broker
//! does not send the bridge what the bridge itself published there; a
//! 3.1.1 remote gets mosquitto's `try_private` mark instead.

use super::config::{BridgeConfig, BridgeProtocol, BridgeTopic};
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

/// Run the bridge until the task is aborted. `local` reaches this broker.
pub async fn run(
    cfg: BridgeConfig,
    local: Transport,
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
    let Some((lc, lrx)) = connect_retrying(local_options(&cfg, local), &backoff, &stats).await
    else {
        return;
    };
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
    subscribe(&lc, &out, Way::Out, true, &cfg.name).await;
    subscribe(&rc, &inward, Way::In, v5, &cfg.name).await;
    let max = cfg.max_queued_messages;
    let watch = watch_state(
        rc.clone(),
        cfg.notifications.then_some((state_topic, notify)),
        stats.clone(),
    );
    tokio::join!(
        forward(lrx, &lc, &rc, &out, Way::Out, max, &stats),
        forward(rrx, &rc, &lc, &inward, Way::In, max, &stats),
        watch,
    );
}

/// The bridge's session on this broker: always MQTT 5 (No Local), kept
/// across restarts unless `cleansession`.
fn local_options(cfg: &BridgeConfig, local: Transport) -> ClientOptions {
    ClientOptions::with_transport(local)
        .protocol(Protocol::V5)
        .client_id(cfg.local_id())
        .clean_start(cfg.cleansession)
        .session_expiry(if cfg.cleansession { 0 } else { u32::MAX })
        .keep_alive(0)
        .incoming_capacity(cfg.max_queued_messages)
        .max_inflight(clamp_u16(cfg.max_queued_messages))
        .receive_maximum(clamp_u16(cfg.max_queued_messages))
        .manual_acks(true)
        .backoff(Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
            multiplier: 2.0,
        })
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

async fn forward(
    mut rx: Incoming,
    from: &Client,
    to: &Client,
    topics: &[BridgeTopic],
    way: Way,
    max: usize,
    stats: &BridgeStats,
) {
    let out = way == Way::Out;
    let mut pending = FuturesUnordered::new();
    let mut batch: Vec<Message> = Vec::new();
    loop {
        let room = max.saturating_sub(pending.len());
        tokio::select! {
            biased;
            Some((r, token)) = pending.next(), if !pending.is_empty() => {
                settle(r, token, from, out, stats).await;
            }
            n = rx.recv_many(&mut batch, room.max(1)), if room > 0 => {
                if n == 0 {
                    return;
                }
                for m in batch.drain(..) {
                    let token = m.ack_token();
                    let Some(topic) = map_topic(topics, way, m.topic()) else {
                        // Nothing to send it to: taken (and counted) as lost.
                        stats.dropped(out);
                        ack(from, token).await;
                        continue;
                    };
                    let len = m.payload.len() as u64;
                    // MQTT 5 properties cross with the message (the
                    // client drops subscription identifiers and topic
                    // aliases, and a 3.1.1 side has none); nothing is
                    // allocated when there are none.
                    let opts = PublishOptions {
                        retain: m.retain,
                        properties: if m.properties.is_allocated() {
                            (*m.properties).clone()
                        } else {
                            Default::default()
                        },
                    };
                    match to.publish_ext(&topic, m.qos, &opts, m.payload).await {
                        Ok(d) => {
                            stats.sent(out, len);
                            if m.qos != QoS::AtMostOnce {
                                pending.push(async move { (d.await, token) });
                            }
                        }
                        Err(e) => {
                            stats.dropped(out);
                            tracing::debug!(error = %e, %topic, "bridge publish failed");
                            ack(from, token).await;
                        }
                    }
                }
            }
        }
        stats.set_queued(out, pending.len());
    }
}

/// The other side answered for a message: acknowledge it where it came
/// from, unless the bridge is shutting down (then the sending broker keeps
/// it for the next start).
async fn settle(
    r: Result<PublishAck, ClientError>,
    token: Option<AckToken>,
    from: &Client,
    out: bool,
    stats: &BridgeStats,
) {
    match r {
        Ok(a) if !a.reason.is_error() => {}
        Err(ClientError::Closed) => return,
        // Refused by the other side (its ACL, its limits): gone.
        _ => stats.dropped(out),
    }
    ack(from, token).await;
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

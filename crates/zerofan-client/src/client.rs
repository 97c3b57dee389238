//! The handle applications hold: publish (simple and expert), subscribe,
//! unsubscribe, watch the connection, disconnect.

use crate::delivery::Delivery;
use crate::error::ClientError;
use crate::event_loop::{Channels, Command, EventLoop};
use crate::frame_builder::{FrameBuilder, OutFrame, PublishOptions};
use crate::incoming::Incoming;
use crate::message::AckToken;
use crate::options::ClientOptions;
use crate::state::{ConnInfo, ConnState};
use crate::stats::{ClientStats, Stats};
use crate::subscription::{SubAckInfo, Subscription, UnsubAckInfo};
use bytes::{Bytes, BytesMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot, watch};
use zerofan_codec::{MqttStr, Properties, Protocol, QoS, Subscribe, Unsubscribe};

/// A connected MQTT client. Cheap to clone; every clone talks to the same
/// connection. Dropping the last clone disconnects cleanly.
///
/// Two ways to publish:
/// - simple, [`Client::publish`]: any `impl Into<Bytes>`; the payload is
///   not copied (only a small header is encoded, and the two go out in one
///   vectored write);
/// - expert, [`Client::publish_with`]: a closure writes the payload
///   straight into the outgoing frame (a protobuf `encode`, a finished
///   FlatBuffer, ...), so a message built from your own data structures is
///   written once.
///
/// Both return once the message is in the bounded outgoing queue (waiting
/// for room if it is full) with a [`Delivery`] that resolves on PUBACK /
/// PUBCOMP.
#[derive(Clone, Debug)]
pub struct Client {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    tx: mpsc::Sender<Command>,
    shutdown: watch::Sender<bool>,
    state: watch::Receiver<ConnState>,
    stats: Arc<Stats>,
    builder: Mutex<FrameBuilder>,
    protocol: Protocol,
}

impl Client {
    /// Connect with `options`, waiting for the broker's CONNACK. Fails if the
    /// first attempt fails; after that the client reconnects by itself
    /// (unless [`ClientOptions::reconnect`] is off). Must be called inside a
    /// tokio runtime: the event loop is spawned on it.
    pub async fn connect(mut options: ClientOptions) -> Result<(Client, Incoming), ClientError> {
        let (tx, cmd_rx) = mpsc::channel(options.outgoing_capacity.max(1));
        let (in_tx, incoming) = crate::incoming::queue(options.incoming_capacity);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (state_tx, state) = watch::channel(ConnState::Connecting);
        let stats = Arc::new(Stats::default());
        let client_id = if options.client_id.is_empty() {
            unique_client_id()
        } else {
            std::mem::take(&mut options.client_id)
        };
        let protocol = options.protocol;
        let ev = EventLoop::new(
            options,
            client_id,
            Channels {
                cmd_rx,
                in_tx,
                state_tx,
                shutdown: shutdown_rx,
                stats: stats.clone(),
            },
        );
        let (first_tx, first_rx) = oneshot::channel();
        tokio::spawn(ev.run(first_tx));
        first_rx.await.map_err(|_| ClientError::Closed)??;
        let client = Client {
            shared: Arc::new(Shared {
                tx,
                shutdown,
                state,
                stats,
                builder: Mutex::new(FrameBuilder::default()),
                protocol,
            }),
        };
        Ok((client, incoming))
    }

    /// Simple publish: `payload` is sent as it is, without a copy.
    pub async fn publish(
        &self,
        topic: &str,
        qos: QoS,
        payload: impl Into<Bytes>,
    ) -> Result<Delivery, ClientError> {
        self.publish_ext(topic, qos, &PublishOptions::default(), payload)
            .await
    }

    /// Simple publish with RETAIN and MQTT 5 properties.
    pub async fn publish_ext(
        &self,
        topic: &str,
        qos: QoS,
        options: &PublishOptions,
        payload: impl Into<Bytes>,
    ) -> Result<Delivery, ClientError> {
        let payload = payload.into();
        let frame =
            self.with_builder(|b| b.simple(self.shared.protocol, topic, qos, options, payload))?;
        self.enqueue(frame).await
    }

    /// Expert publish: `write` appends the payload to the buffer, which
    /// already holds room for the header; the header is written in front of
    /// it afterwards. Only append (the bytes already in `buf` belong to the
    /// header); call `buf.reserve(n)` first when the size is known, so a
    /// large payload does not regrow. The buffer is the client's shared
    /// frame buffer, whose memory policy keeps it small after large
    /// messages; callers keep their own builders (prost messages,
    /// FlatBufferBuilders) and reuse them as they like.
    pub async fn publish_with<F>(
        &self,
        topic: &str,
        qos: QoS,
        write: F,
    ) -> Result<Delivery, ClientError>
    where
        F: FnOnce(&mut BytesMut),
    {
        self.publish_with_ext(topic, qos, &PublishOptions::default(), write)
            .await
    }

    /// Expert publish with RETAIN and MQTT 5 properties.
    pub async fn publish_with_ext<F>(
        &self,
        topic: &str,
        qos: QoS,
        options: &PublishOptions,
        write: F,
    ) -> Result<Delivery, ClientError>
    where
        F: FnOnce(&mut BytesMut),
    {
        let frame =
            self.with_builder(|b| b.expert(self.shared.protocol, topic, qos, options, write))?;
        self.enqueue(frame).await
    }

    fn with_builder<R>(&self, f: impl FnOnce(&mut FrameBuilder) -> R) -> R {
        // Take the builder out so user code never runs under the lock; a
        // concurrent publisher meanwhile starts from an empty builder.
        let mut b = std::mem::take(
            &mut *self
                .shared
                .builder
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let r = f(&mut b);
        let mut slot = self
            .shared
            .builder
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if slot.capacity() < b.capacity() {
            *slot = b;
        }
        r
    }

    async fn enqueue(&self, frame: OutFrame) -> Result<Delivery, ClientError> {
        let (done, rx) = oneshot::channel();
        self.shared
            .tx
            .send(Command::Publish { frame, done })
            .await
            .map_err(|_| ClientError::Closed)?;
        Ok(Delivery::new(rx))
    }

    /// Acknowledge a received message (with
    /// [`crate::ClientOptions::manual_acks`]): PUBACK for QoS 1, PUBREC for
    /// QoS 2. A token from an earlier connection is ignored.
    pub async fn ack(&self, token: AckToken) -> Result<(), ClientError> {
        self.shared
            .tx
            .send(Command::Ack(token))
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// Subscribe to one filter with default options; resolves on SUBACK.
    pub async fn subscribe(&self, filter: &str, qos: QoS) -> Result<SubAckInfo, ClientError> {
        self.subscribe_many([Subscription::new(filter, qos)], Properties::default())
            .await
    }

    /// Subscribe to several filters with any options in one SUBSCRIBE.
    /// `properties` may carry a Subscription Identifier and user properties
    /// (MQTT 5). Granted subscriptions are restored automatically if a
    /// reconnect finds the broker lost the session.
    pub async fn subscribe_many(
        &self,
        subscriptions: impl IntoIterator<Item = Subscription>,
        properties: Properties,
    ) -> Result<SubAckInfo, ClientError> {
        let mut filters = Vec::new();
        for s in subscriptions {
            filters.push((filter_str(&s.filter)?, s.options));
        }
        let packet = Subscribe {
            packet_id: 0,
            properties: properties.into(),
            filters,
        };
        let (done, rx) = oneshot::channel();
        self.shared
            .tx
            .send(Command::Subscribe { packet, done })
            .await
            .map_err(|_| ClientError::Closed)?;
        rx.await.map_err(|_| ClientError::Closed)?
    }

    /// Unsubscribe from one filter; resolves on UNSUBACK.
    pub async fn unsubscribe(&self, filter: &str) -> Result<UnsubAckInfo, ClientError> {
        self.unsubscribe_many([filter], Properties::default()).await
    }

    /// Unsubscribe from several filters in one UNSUBSCRIBE (with MQTT 5
    /// user properties in `properties`).
    pub async fn unsubscribe_many<S: AsRef<str>>(
        &self,
        filters: impl IntoIterator<Item = S>,
        properties: Properties,
    ) -> Result<UnsubAckInfo, ClientError> {
        let mut fs = Vec::new();
        for f in filters {
            fs.push(filter_str(f.as_ref())?);
        }
        let packet = Unsubscribe {
            packet_id: 0,
            properties: properties.into(),
            filters: fs,
        };
        let (done, rx) = oneshot::channel();
        self.shared
            .tx
            .send(Command::Unsubscribe { packet, done })
            .await
            .map_err(|_| ClientError::Closed)?;
        rx.await.map_err(|_| ClientError::Closed)?
    }

    /// Write everything already queued, send DISCONNECT and stop. QoS 1/2
    /// publishes not acknowledged by then fail with [`ClientError::Closed`]:
    /// await their [`Delivery`] first if they matter. The [`Incoming`]
    /// stream ends.
    pub async fn disconnect(&self) -> Result<(), ClientError> {
        self.shared.shutdown.send_replace(true);
        let mut st = self.shared.state.clone();
        let _ = st.wait_for(|s| *s == ConnState::Closed).await;
        Ok(())
    }

    /// Wait until the client is connected (returns at once if it is).
    pub async fn wait_connected(&self) -> Result<ConnInfo, ClientError> {
        let mut st = self.shared.state.clone();
        let r = st
            .wait_for(|s| matches!(s, ConnState::Connected(_) | ConnState::Closed))
            .await
            .map_err(|_| ClientError::Closed)?;
        match &*r {
            ConnState::Connected(info) => Ok((**info).clone()),
            _ => Err(ClientError::Closed),
        }
    }

    /// The current connection state.
    pub fn state(&self) -> ConnState {
        self.shared.state.borrow().clone()
    }

    /// A watch on the connection state, to react to reconnects.
    pub fn state_watch(&self) -> watch::Receiver<ConnState> {
        self.shared.state.clone()
    }

    /// Counters: connects, losses, resends, bytes...
    pub fn stats(&self) -> ClientStats {
        self.shared.stats.snapshot()
    }

    /// Bytes of capacity the shared frame buffer holds right now (the
    /// memory policy keeps this small after large messages).
    pub fn frame_buffer_capacity(&self) -> usize {
        self.shared
            .builder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .capacity()
    }
}

fn filter_str(f: &str) -> Result<MqttStr, ClientError> {
    zerofan_codec::topic::validate_topic_filter(f)
        .map_err(|e| ClientError::InvalidTopic(format!("{f:?}: {e}")))?;
    MqttStr::try_from(f).map_err(|e| ClientError::InvalidTopic(e.to_string()))
}

/// A client identifier unique to this process and moment, 23 characters at
/// most as MQTT 3.1.1 servers must accept.
fn unique_client_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mix = t ^ (u64::from(std::process::id()) << 40) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    format!("zf{:016x}", mix)
}

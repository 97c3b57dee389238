//! zerofan-client: an async (tokio) MQTT 5 / 3.1.1 client whose received
//! payloads are slices of pooled read buffers and whose expert mode writes a
//! payload straight into the outgoing frame.
//!
//! # Map of the crate
//!
//! - [`Client`] (`client`): the handle. [`Client::connect`] returns it with
//!   the [`Incoming`] message stream. Simple [`Client::publish`], expert
//!   [`Client::publish_with`], subscribe / unsubscribe with every MQTT 5
//!   option ([`Subscription`]), [`Client::disconnect`].
//! - [`ClientOptions`] (`options`): CONNECT fields (clean start, session
//!   expiry, [`LastWill`], credentials, keep alive, receive maximum, maximum
//!   packet size, topic alias maximum), queue sizes and [`Backoff`].
//! - [`Transport`] (`transport`, `ws`): TCP, TLS ([`TlsSettings`], rustls
//!   with roots chosen by the caller), WebSocket (subprotocol `mqtt`) and
//!   any stream a [`Connector`] opens.
//! - `event_loop`: the task that runs the connection, the QoS flows,
//!   keep alive, reconnect with backoff and session resume.
//! - `session`: state kept across reconnects (inflight, pending acks).
//! - `frame_builder`: how frames are built and the high-watermark memory
//!   policy of the buffer they are built in.
//! - `reader` / `writer`: pooled zero-copy reads, vectored writes.
//! - [`Delivery`] / [`PublishAck`]: the awaitable completion of a publish.
//! - [`Message`]: a received PUBLISH.
//! - [`ClientStats`], [`ConnState`]: what the client did and where it is.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), zerofan_client::ClientError> {
//! use bytes::BufMut;
//! use zerofan_client::{Client, ClientOptions, QoS};
//!
//! let (client, mut incoming) = Client::connect(ClientOptions::new("127.0.0.1:1883")).await?;
//! client.subscribe("sensors/#", QoS::AtLeastOnce).await?;
//! // Simple: any Into<Bytes>, not copied.
//! client.publish("sensors/a", QoS::AtLeastOnce, "21.5").await?.await?;
//! // Expert: serialize straight into the frame.
//! let ack = client
//!     .publish_with("sensors/b", QoS::ExactlyOnce, |buf| buf.put_slice(b"22.0"))
//!     .await?
//!     .await?;
//! assert!(!ack.reason.is_error());
//! while let Some(msg) = incoming.recv().await {
//!     println!("{}: {:?}", msg.topic(), msg.payload);
//! }
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod client;
mod delivery;
mod error;
mod event_loop;
mod frame_builder;
mod incoming;
mod message;
mod options;
mod reader;
mod session;
mod state;
mod stats;
mod subscription;
mod transport;
mod writer;
mod ws;

pub use client::Client;
pub use delivery::{Delivery, PublishAck};
pub use error::{ClientError, Result};
pub use frame_builder::{PublishOptions, HIGH_WATER, INITIAL_CAPACITY};
pub use incoming::Incoming;
pub use message::{AckToken, Message};
pub use options::{Backoff, ClientOptions, LastWill};
pub use state::{ConnInfo, ConnState};
pub use stats::ClientStats;
pub use subscription::{RetainHandling, SubAckInfo, Subscription, UnsubAckInfo};
pub use transport::{BoxedIo, ConnectFuture, Connector, Io, TlsSettings, Transport};

/// Re-exported so callers build [`TlsSettings`] with the same rustls version.
pub use tokio_rustls::rustls;
/// Re-exported codec types that appear in this crate's API.
pub use zerofan_codec::{
    MqttStr, Properties, Props, Protocol, QoS, ReasonCode, SubscriptionOptions,
};

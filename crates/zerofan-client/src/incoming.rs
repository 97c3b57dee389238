//! The stream of messages the broker sends to this client.

use crate::message::Message;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Messages for this client, in arrival order, as an async `recv()` or a
/// [`futures_core::Stream`]. Bounded: when the application does not keep up,
/// the client stops reading the socket (and the broker's flow control takes
/// over) instead of buffering without limit. QoS 1/2 messages are
/// acknowledged when they enter this queue. Ends (`None`) when the client
/// is closed or gives up reconnecting.
#[derive(Debug)]
pub struct Incoming {
    rx: mpsc::Receiver<Message>,
}

impl Incoming {
    pub(crate) fn new(rx: mpsc::Receiver<Message>) -> Self {
        Incoming { rx }
    }

    /// The next message; `None` once the client has shut down.
    pub async fn recv(&mut self) -> Option<Message> {
        self.rx.recv().await
    }

    /// A message if one is ready now.
    pub fn try_recv(&mut self) -> Option<Message> {
        self.rx.try_recv().ok()
    }
}

impl futures_core::Stream for Incoming {
    type Item = Message;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        self.rx.poll_recv(cx)
    }
}

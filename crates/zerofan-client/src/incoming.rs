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

    /// Wait for at least one message, then append to `buf` every message
    /// ready now, up to `limit`; returns how many were added, 0 once the
    /// client has shut down (or when `limit` is 0). Cheaper per message
    /// than `recv` in a loop: one wait, one wakeup, for a whole run.
    pub async fn recv_many(&mut self, buf: &mut Vec<Message>, limit: usize) -> usize {
        self.rx.recv_many(buf, limit).await
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use zerofan_codec::{MqttStr, Publish};

    fn msg(i: u8) -> Message {
        let p = Publish {
            topic: MqttStr::try_from("t").unwrap(),
            payload: Bytes::from(vec![i]),
            ..Default::default()
        };
        let topic = p.topic.clone();
        Message::from_publish(p, topic, Bytes::new())
    }

    #[tokio::test]
    async fn recv_many_takes_what_is_ready_up_to_the_limit_then_ends() {
        let (tx, rx) = mpsc::channel(8);
        let mut inc = Incoming::new(rx);
        for i in 0..3 {
            tx.send(msg(i)).await.unwrap();
        }
        let mut buf = Vec::new();
        assert_eq!(inc.recv_many(&mut buf, 2).await, 2);
        assert_eq!(inc.recv_many(&mut buf, 10).await, 1, "only what is ready");
        let got: Vec<u8> = buf.iter().map(|m| m.payload[0]).collect();
        assert_eq!(got, [0, 1, 2], "in order, appended");
        // Waits for the next one rather than returning empty.
        let late = tokio::spawn(async move {
            tx.send(msg(9)).await.unwrap();
            tx
        });
        assert_eq!(inc.recv_many(&mut buf, 10).await, 1);
        drop(late.await.unwrap());
        assert_eq!(inc.recv_many(&mut buf, 10).await, 0, "closed");
    }
}

//! The awaitable completion of one publish.

use crate::error::ClientError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::oneshot;
use zerofan_codec::{Props, ReasonCode};

/// How a publish ended: at QoS 0 when it was written to the transport, at
/// QoS 1 on PUBACK, at QoS 2 on PUBCOMP (or on a PUBREC with an error code,
/// which ends the flow). `reason` is the broker's code; `0x10 No matching
/// subscribers` is a success, codes of 0x80 and above are refusals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishAck {
    /// Packet identifier used (0 at QoS 0).
    pub packet_id: u16,
    /// Reason code of the final acknowledgement (always success at QoS 0
    /// and under MQTT 3.1.1).
    pub reason: ReasonCode,
    /// Properties of that acknowledgement (reason string, user properties).
    pub properties: Props,
}

/// A future that resolves when the broker has acknowledged the publish (see
/// [`PublishAck`]). Dropping it does not cancel the publish: a caller that
/// does not care about completion just drops it.
#[derive(Debug)]
pub struct Delivery {
    rx: oneshot::Receiver<Result<PublishAck, ClientError>>,
}

impl Delivery {
    pub(crate) fn new(rx: oneshot::Receiver<Result<PublishAck, ClientError>>) -> Self {
        Delivery { rx }
    }
}

impl Future for Delivery {
    type Output = Result<PublishAck, ClientError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(r)) => Poll::Ready(r),
            Poll::Ready(Err(_)) => Poll::Ready(Err(ClientError::Closed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

//! Client-side session state, kept across reconnects: messages in flight,
//! subscribe/unsubscribe requests awaiting their ack, QoS 2 messages
//! received but not released, and the subscriptions to restore when the
//! broker lost the session. Plain data, no I/O.

use crate::delivery::PublishAck;
use crate::error::ClientError;
use crate::subscription::{SubAckInfo, UnsubAckInfo};
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use tokio::sync::oneshot;
use zerofan_codec::{Props, ReasonCode, Subscribe, SubscriptionOptions, Unsubscribe};

/// Where a QoS 1/2 publish is in its flow, named by what it waits to be
/// (acked: PUBACK, received: PUBREC, completed: PUBCOMP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// QoS 1, PUBLISH sent.
    Acked,
    /// QoS 2, PUBLISH sent.
    Received,
    /// QoS 2, PUBREC received and PUBREL sent.
    Completed,
}

pub(crate) type PubDone = oneshot::Sender<Result<PublishAck, ClientError>>;
pub(crate) type SubDone = oneshot::Sender<Result<SubAckInfo, ClientError>>;
pub(crate) type UnsubDone = oneshot::Sender<Result<UnsubAckInfo, ClientError>>;

/// A QoS 1/2 publish not yet completed.
pub(crate) struct Inflight {
    /// Header (the whole frame in expert mode), packet id patched in.
    pub head: Bytes,
    /// Separate payload (simple mode) or empty.
    pub payload: Bytes,
    pub stage: Stage,
    pub done: Option<PubDone>,
    /// Send order, to resend in the same order.
    pub seq: u64,
    /// Reason of the PUBREC (QoS 2), reported if PUBCOMP says the broker
    /// forgot the id after a session loss.
    pub rec_reason: ReasonCode,
}

/// A SUBSCRIBE awaiting SUBACK; `done` is `None` for a resubscribe.
pub(crate) struct PendingSub {
    pub packet: Subscribe,
    pub done: Option<SubDone>,
}

/// An UNSUBSCRIBE awaiting UNSUBACK.
pub(crate) struct PendingUnsub {
    pub packet: Unsubscribe,
    pub done: Option<UnsubDone>,
}

#[derive(Default)]
pub(crate) struct Session {
    pub inflight: HashMap<u16, Inflight>,
    pub subs: HashMap<u16, PendingSub>,
    pub unsubs: HashMap<u16, PendingUnsub>,
    /// QoS 2 packet ids received (PUBREC sent) and not yet released.
    pub incoming_qos2: HashSet<u16>,
    /// Granted subscriptions: filter -> options and SUBSCRIBE properties.
    pub subscriptions: HashMap<String, (SubscriptionOptions, Props)>,
    next_pid: u16,
    seq: u64,
}

impl Session {
    /// A free packet identifier, `None` if all 65,535 are in use.
    pub fn alloc_pid(&mut self) -> Option<u16> {
        for _ in 0..u16::MAX {
            self.next_pid = self.next_pid.wrapping_add(1);
            if self.next_pid == 0 {
                self.next_pid = 1;
            }
            let id = self.next_pid;
            if !self.inflight.contains_key(&id)
                && !self.subs.contains_key(&id)
                && !self.unsubs.contains_key(&id)
            {
                return Some(id);
            }
        }
        None
    }

    /// The next send sequence number.
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Inflight packet ids in send order.
    pub fn inflight_in_order(&self) -> Vec<u16> {
        let mut v: Vec<(u64, u16)> = self.inflight.iter().map(|(k, i)| (i.seq, *k)).collect();
        v.sort_unstable();
        v.into_iter().map(|(_, k)| k).collect()
    }

    /// Fail everything pending with `err()` (the client is closing).
    pub fn fail_all(&mut self, err: impl Fn() -> ClientError) {
        for (_, i) in self.inflight.drain() {
            if let Some(d) = i.done {
                let _ = d.send(Err(err()));
            }
        }
        for (_, s) in self.subs.drain() {
            if let Some(d) = s.done {
                let _ = d.send(Err(err()));
            }
        }
        for (_, u) in self.unsubs.drain() {
            if let Some(d) = u.done {
                let _ = d.send(Err(err()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_ids_skip_those_in_use_and_wrap() {
        let mut s = Session::default();
        assert_eq!(s.alloc_pid(), Some(1));
        s.inflight.insert(
            2,
            Inflight {
                head: Bytes::new(),
                payload: Bytes::new(),
                stage: Stage::Acked,
                done: None,
                seq: 0,
                rec_reason: ReasonCode::SUCCESS,
            },
        );
        assert_eq!(s.alloc_pid(), Some(3));
        s.next_pid = u16::MAX;
        assert_eq!(s.alloc_pid(), Some(1));
    }
}

//! One core event per link read, not per peer event, while replicas are
//! kept: the owner then sends one batch for every publish a read forwarded
//! to it, and a replica commits once for every batch a read brought (each
//! peer event was its own batch and its own commit: two commits per
//! message on every replica).
//!
//! The same for a client read on the owner: its PUBLISHes and
//! acknowledgements go to the replicas as one batch, one commit, their
//! PUBACKs all waiting for it (each packet was its own batch and commit).
//! A packet that may change the connection or its session (CONNECT,
//! SUBSCRIBE, DISCONNECT, ...) ends the read's event before it is handled,
//! and the rest of the read goes per packet, as before.

use super::Replication;
use zerofan_codec::Packet;

/// Whether a read is open, and whether an event's end waited for it.
#[derive(Debug, Default)]
pub(super) struct LinkRead {
    open: bool,
    end_waits: bool,
}

impl Replication {
    /// A link read starts: events end with it.
    pub(crate) fn open_read(&mut self) {
        self.read.open = self.on();
    }

    /// Whether a read is open (its events end with it).
    #[inline]
    pub(crate) fn reading(&self) -> bool {
        self.read.open
    }

    /// Whether an event's end waits for the read's (noted).
    pub(crate) fn defer_end(&mut self) -> bool {
        if self.read.open {
            self.read.end_waits = true;
        }
        self.read.open
    }

    /// The read ended: whether an event's end waited for it.
    pub(crate) fn close_read(&mut self) -> bool {
        std::mem::take(&mut self.read).end_waits
    }
}

/// Whether a client's packet may end with its read's event: the data path
/// only (publishes, their acknowledgements, pings), nothing that changes
/// the connection or the session.
pub(crate) fn joins_read(p: &Packet) -> bool {
    matches!(
        p,
        Packet::Publish(_)
            | Packet::PubAck(_)
            | Packet::PubRec(_)
            | Packet::PubRel(_)
            | Packet::PubComp(_)
            | Packet::PingReq
    )
}

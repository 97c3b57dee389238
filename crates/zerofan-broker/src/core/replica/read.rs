//! One core event per link read, not per peer event, while replicas are
//! kept: the owner then sends one batch for every publish a read forwarded
//! to it, and a replica commits once for every batch a read brought (each
//! peer event was its own batch and its own commit: two commits per
//! message on every replica).

use super::Replication;

/// Whether a link read is open, and whether an event's end waited for it.
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

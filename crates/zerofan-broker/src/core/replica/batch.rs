//! Store records a replica can leave out of one applied batch.
//!
//! A batch is applied and committed as one (its answer waits for that
//! commit), so only what is live at its end needs to reach the store: a
//! queue entry enqueued and then dequeued, or sent and completed, within
//! the same batch needs no record at all, and its message none unless a
//! written entry references it. The image in memory still goes through
//! every step, so it ends the same.
//!
//! This is decided before the batch is applied ([`ends_within`]); while
//! applying, a delivery left out of the store is known by its packet id
//! (`Image::unwritten`), and [`Images::write_left_out`] writes whatever the
//! batch did not end after all (a refused operation can make the image
//! differ from what the owner's operations foretell).

use super::{Image, Images, ReplOp};
use crate::core::hash::{HashMap, HashSet};
use crate::core::peer::PeerId;
use zerofan_store::{EntryId, InflightPhase};

/// For each operation of `ops`: true for an `Enqueue` whose entry the same
/// batch ends (dequeued, or sent and then completed). A session that the
/// batch starts over, drops or renews is left alone (its entries are
/// written as before).
pub(super) fn ends_within(ops: &[ReplOp]) -> Vec<bool> {
    let mut quiet = vec![false; ops.len()];
    // Entries enqueued in this batch and not yet sent: where.
    let mut queued: HashMap<(&str, EntryId), usize> = HashMap::default();
    // Packet ids out with such an entry: where it was enqueued.
    let mut sent: HashMap<(&str, u16), usize> = HashMap::default();
    let mut renewed: HashSet<&str> = HashSet::default();
    let mut any = false;
    for (i, op) in ops.iter().enumerate() {
        match op {
            ReplOp::Enqueue { client, entry, .. } => {
                queued.insert((client, *entry), i);
            }
            ReplOp::Send { client, entry, pid } => {
                // A packet id sent again while out replaces the older
                // delivery: that one stays written.
                match queued.remove(&(&**client, *entry)) {
                    Some(at) => sent.insert((client, *pid), at),
                    None => sent.remove(&(&**client, *pid)),
                };
            }
            ReplOp::Dequeue { client, entry } => {
                if let Some(at) = queued.remove(&(&**client, *entry)) {
                    quiet[at] = true;
                    any = true;
                }
            }
            ReplOp::Complete { client, pid } => {
                if let Some(at) = sent.remove(&(&**client, *pid)) {
                    quiet[at] = true;
                    any = true;
                }
            }
            ReplOp::Session { client, .. }
            | ReplOp::Reset { client, .. }
            | ReplOp::Drop { client } => {
                renewed.insert(client);
            }
            _ => {}
        }
    }
    if any && !renewed.is_empty() {
        for (q, op) in quiet.iter_mut().zip(ops) {
            if *q && op.client().is_some_and(|c| renewed.contains(c)) {
                *q = false;
            }
        }
    }
    quiet
}

impl Image {
    /// A delivery sent without a store record went out as `pid`.
    pub(super) fn sent_unwritten(&mut self, pid: u16) {
        self.unwritten.insert(pid);
    }

    /// The delivery out as `pid` ended: whether it went out without a
    /// store record (then it has none to complete).
    pub(super) fn end_unwritten(&mut self, pid: u16) -> bool {
        self.unwritten.remove(&pid)
    }
}

impl Images {
    /// Entries left out of the store since the last call (a counter).
    pub(crate) fn take_unwritten(&mut self) -> u64 {
        std::mem::take(&mut self.unwritten)
    }

    /// After a batch: write to the store what it left out but did not end
    /// (entries of `clients` still queued or out). Normally nothing.
    pub(super) fn write_left_out(
        &mut self,
        from: PeerId,
        clients: HashSet<Box<str>>,
        disk: &mut super::Disk<'_>,
    ) {
        for client in clients {
            let Some(img) = self.by_client.get_mut(&*client) else {
                continue;
            };
            if img.owner != Some(from) {
                continue;
            }
            let quiet = std::mem::take(&mut img.quiet);
            let unwritten = std::mem::take(&mut img.unwritten);
            let mut queued = Vec::new();
            for e in quiet {
                if !img.local.contains_key(&e) {
                    if let Some(item) = img.queue.get(&e) {
                        queued.push((e, item.clone()));
                    }
                }
            }
            let mut out = Vec::new();
            for (pid, phase, e) in img.inflight.iter() {
                if unwritten.contains(pid) {
                    out.push((*pid, *phase, e.clone()));
                }
            }
            // Counted as left out, but written after all.
            self.unwritten = self
                .unwritten
                .saturating_sub((queued.len() + out.len()) as u64);
            for (e, item) in queued {
                let key = (from, item.msg);
                if let Some(l) = self.enqueue_on_disk(key, &client, &item, disk) {
                    if let Some(img) = self.by_client.get_mut(&*client) {
                        img.local.insert(e, l);
                    }
                }
            }
            for (pid, phase, e) in out {
                match e {
                    Some((_, item)) => {
                        let key = (from, item.msg);
                        if let Some(l) = self.enqueue_on_disk(key, &client, &item, disk) {
                            disk.send(&client, l, pid);
                            if phase == InflightPhase::PubrecReceived {
                                disk.pubrec(&client, pid);
                            }
                        }
                    }
                    None => disk.past_pubrec(&client, pid),
                }
            }
        }
    }
}

//! A message for the sessions of an owner that is away (see `strand`):
//! the copies here of its sessions whose subscriptions match queue it, as
//! if the owner had replicated it, so that whichever node serves them next
//! has it. Entry and message ids are this node's, above any id an owner
//! gives ([`STRANDED_BASE`]), so they sort after the owner's entries.

use super::{Images, PeerId, ReplOp};
use std::sync::Arc;
use zerofan_store::{EntryId, MsgId, QueueEntry, StoredMessage};

/// Ids of stranded entries and messages start here: an owner's store
/// counts from 1 and never gets near.
const STRANDED_BASE: u64 = 1 << 62;

impl Images {
    /// Queue `msg` in every copy of `owner`'s sessions here that a
    /// subscription matches, written to the store before the answer as a
    /// replicated change is. Returns how many copies took it, and the
    /// store's errors.
    pub(crate) fn strand(
        &mut self,
        owner: PeerId,
        msg: Arc<StoredMessage>,
        now_ms: u64,
        durable: &mut crate::core::durable::Durable,
    ) -> (usize, u64) {
        if self.per_owner.get(&owner).is_none_or(|n| *n == 0) {
            return (0, 0);
        }
        let Ok(topic) = std::str::from_utf8(&msg.topic) else {
            return (0, 0);
        };
        let mut hits = Vec::new();
        for (client, img) in &self.by_client {
            if img.owner != Some(owner) {
                continue;
            }
            let mut qos = 0u8;
            let mut retain = false;
            let mut ids = Vec::new();
            for (filter, (opts, id)) in &img.subs {
                // A shared group's message goes to one member, chosen by
                // the publisher's node among the nodes it knows.
                if filter.starts_with("$share/") || !zerofan_codec::topic::matches(filter, topic) {
                    continue;
                }
                qos = qos.max(opts.qos.min(msg.qos));
                retain |= opts.retain_as_published && msg.retain;
                ids.extend(*id);
            }
            // QoS 0 is not kept for absent clients.
            if qos > 0 {
                hits.push(ReplOp::Enqueue {
                    client: client.clone(),
                    entry: EntryId(0),
                    item: QueueEntry {
                        msg: MsgId(0),
                        qos,
                        retain,
                        subscription_ids: ids,
                        share: None,
                    },
                });
            }
        }
        if hits.is_empty() {
            return (0, 0);
        }
        let taken = hits.len();
        let id = MsgId(self.next_stranded(now_ms));
        let mut ops = Vec::with_capacity(taken + 1);
        ops.push(ReplOp::Message { id, msg });
        for mut op in hits {
            if let ReplOp::Enqueue { entry, item, .. } = &mut op {
                *entry = EntryId(self.next_stranded(now_ms));
                item.msg = id;
            }
            ops.push(op);
        }
        let errors = self.apply_durable(owner, ops, now_ms, durable);
        (taken, errors)
    }

    /// A fresh id for a stranded entry or message: above the owners' ids,
    /// rising, and rising across restarts too (it starts from the clock),
    /// so that one read back from the store is never given again.
    fn next_stranded(&mut self, now_ms: u64) -> u64 {
        let floor = STRANDED_BASE | (now_ms.min((1 << 41) - 1) << 20);
        self.stranded_next = self.stranded_next.saturating_add(1).max(floor);
        self.stranded_next
    }
}

//! A message for the sessions of an owner that is away (see `strand`):
//! the copies here of its sessions whose subscriptions match queue it, as
//! if the owner had replicated it, so that whichever node serves them next
//! has it. Entry and message ids are this node's, above any id an owner
//! gives ([`STRANDED_BASE`]), so they sort after the owner's entries.
//!
//! An owner that was only paused may queue the same message itself when
//! it wakes, and replicate it with the mark the publisher's node gave it
//! ([`Marks`]): the copy keeps the owner's entry, in its place among the
//! owner's, and drops the stranded one; a stranded message whose mark the
//! owner's copies hold already is not queued again.

use super::super::hash::{HashMap, HashSet};
use super::{Disk, Image, Images, Mark, MarksRead, PeerId, ReplOp};
use std::sync::Arc;
use zerofan_store::{EntryId, MsgId, QueueEntry, StoredMessage};

/// A stranded entry kept past a full image: its id, the entry, its
/// message and mark.
#[derive(Debug)]
pub(super) struct Unread {
    entry: EntryId,
    item: QueueEntry,
    msg: Arc<StoredMessage>,
    mark: Mark,
}

/// Ids of stranded entries and messages start here: an owner's store
/// counts from 1 and never gets near.
pub(super) const STRANDED_BASE: u64 = 1 << 62;

/// The marks of the messages held that have one, found both ways: each
/// held message's mark, and per owner and mark the owner's message and the
/// one stranded here. Bounded by the messages held; each goes with its
/// message.
#[derive(Debug, Default)]
pub(super) struct Marks {
    of: HashMap<(PeerId, MsgId), Mark>,
    owners: HashMap<(PeerId, Mark), MsgId>,
    stranded: HashMap<(PeerId, Mark), MsgId>,
}

impl Marks {
    /// The owner's message `key` was stranded elsewhere as `mark`.
    fn owners(&mut self, key: (PeerId, MsgId), mark: Mark) {
        self.of.insert(key, mark);
        self.owners.insert((key.0, mark), key.1);
    }

    /// The mark of the message `key`, if it has one.
    pub(super) fn mark_of(&self, key: (PeerId, MsgId)) -> Option<Mark> {
        self.of.get(&key).copied()
    }

    /// The message `key`, named by its sender with `mark`: the owner's
    /// own, or one stranded (by this node, or by the node that sent its
    /// copy: see `Images::copy_ops`).
    pub(super) fn named(&mut self, key: (PeerId, MsgId), mark: Mark) {
        if key.1 .0 >= STRANDED_BASE {
            self.stranded(key, mark);
        } else {
            self.owners(key, mark);
        }
    }

    /// The message `key` held here was stranded as `mark`.
    fn stranded(&mut self, key: (PeerId, MsgId), mark: Mark) {
        self.of.insert(key, mark);
        self.stranded.insert((key.0, mark), key.1);
    }

    /// The message `key` is gone.
    pub(super) fn forget(&mut self, key: (PeerId, MsgId)) {
        if self.of.is_empty() {
            return;
        }
        let Some(mark) = self.of.remove(&key) else {
            return;
        };
        let by = if key.1 .0 >= STRANDED_BASE {
            &mut self.stranded
        } else {
            &mut self.owners
        };
        if by.get(&(key.0, mark)) == Some(&key.1) {
            by.remove(&(key.0, mark));
        }
    }
}

/// The bounds of a session's offline queue (the config's), which a copy
/// keeps to when it queues a stranded message: past them the new message
/// is left out of that copy, or with `drop_oldest` the oldest stranded
/// entries make room. The owner's own entries are never dropped here: the
/// copy holds them as the owner wrote them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueueBound {
    pub(crate) messages: usize,
    pub(crate) bytes: usize,
    pub(crate) drop_oldest: bool,
}

/// What [`Images::strand`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stranded {
    /// Copies that queued the message.
    pub(crate) kept: usize,
    /// Entries a full copy left out: the new message, or older stranded
    /// ones that made room for it.
    pub(crate) dropped: usize,
    /// The store's errors.
    pub(crate) errors: u64,
}

impl Images {
    /// Queue `msg`, stranded as `mark`, in every copy of `owner`'s
    /// sessions here that a subscription matches, within `bound`, written
    /// to the store before the answer as a replicated change is; not when
    /// the owner's copies have it already.
    pub(crate) fn strand(
        &mut self,
        owner: PeerId,
        msg: Arc<StoredMessage>,
        mark: Option<Mark>,
        now_ms: u64,
        bound: QueueBound,
        durable: &mut crate::core::durable::Durable,
    ) -> Stranded {
        let mut done = Stranded::default();
        if self.per_owner.get(&owner).is_none_or(|n| *n == 0) {
            return done;
        }
        if mark.is_some_and(|m| self.marks.owners.contains_key(&(owner, m))) {
            return done;
        }
        let Ok(topic) = std::str::from_utf8(&msg.topic) else {
            return done;
        };
        let size = super::msg_size(&msg);
        let mut hits = Vec::new();
        let mut room = Vec::new();
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
            if qos == 0 {
                continue;
            }
            if !img.queue.fits(bound.messages, bound.bytes, size) {
                let made = bound
                    .drop_oldest
                    .then(|| {
                        img.queue
                            .room(EntryId(STRANDED_BASE), bound.messages, bound.bytes, size)
                    })
                    .flatten();
                match made {
                    Some(old) => {
                        done.dropped += old.len();
                        room.extend(old.into_iter().map(|e| (client.clone(), e)));
                    }
                    None => {
                        done.dropped += 1;
                        continue;
                    }
                }
            }
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
        let mut disk = Disk::new(durable);
        for (client, entry) in room {
            self.dequeue(owner, &client, entry, &mut disk);
        }
        if hits.is_empty() {
            done.errors = disk.errors;
            return done;
        }
        let taken = hits.len();
        let id = MsgId(self.next_stranded(now_ms));
        let mut ops = Vec::with_capacity(taken + 1);
        ops.push(ReplOp::Message {
            id,
            msg,
            mark: None,
        });
        for mut op in hits {
            if let ReplOp::Enqueue { entry, item, .. } = &mut op {
                *entry = EntryId(self.next_stranded(now_ms));
                item.msg = id;
            }
            ops.push(op);
        }
        self.apply_batch(owner, ops, super::Batch::Stranded, now_ms, &mut disk);
        if let Some(m) = mark {
            if self.messages.contains_key(&(owner, id)) {
                self.marks.stranded((owner, id), m);
            }
        }
        done.kept = taken;
        done.errors = disk.errors;
        done
    }

    /// The owner queued its message `key` for `client`: if it was
    /// stranded here for the same session too, that entry goes.
    pub(super) fn unstrand(&mut self, key: (PeerId, MsgId), client: &str, disk: &mut Disk<'_>) {
        if self.marks.stranded.is_empty() {
            return;
        }
        let Some(mark) = self.marks.of.get(&key) else {
            return;
        };
        let Some(&stranded) = self.marks.stranded.get(&(key.0, *mark)) else {
            return;
        };
        let Some(img) = self.by_client.get(client) else {
            return;
        };
        let twice: Vec<EntryId> = img
            .queue
            .range(EntryId(STRANDED_BASE)..)
            .filter(|(_, e)| e.msg == stranded)
            .map(|(id, _)| *id)
            .collect();
        for entry in twice {
            self.dequeue(key.0, client, entry, disk);
            self.unstranded += 1;
        }
    }

    /// The stranded entries of `from`'s copy of `client` whose messages
    /// `from` had not read (`read`) when it wrote the full image that
    /// replaces the copy: it may never queue them (see `strand`).
    pub(super) fn unread_stranded(
        &self,
        from: PeerId,
        client: &str,
        read: &MarksRead,
    ) -> Vec<Unread> {
        match self.by_client.get(client) {
            Some(img) if img.owner == Some(from) => {
                self.stranded_entries(img, from, |m| !read.covers(m))
            }
            _ => Vec::new(),
        }
    }

    /// Every stranded entry of the copy of `client`, which another node's
    /// newer copy replaces (see `previous`): that copy may lack some.
    pub(super) fn all_stranded(&self, client: &str) -> Vec<Unread> {
        match self.by_client.get(client) {
            Some(img) => match img.owner {
                Some(owner) => self.stranded_entries(img, owner, |_| true),
                None => Vec::new(),
            },
            None => Vec::new(),
        }
    }

    fn stranded_entries(
        &self,
        img: &Image,
        owner: PeerId,
        keep: impl Fn(Mark) -> bool,
    ) -> Vec<Unread> {
        img.queue
            .range(EntryId(STRANDED_BASE)..)
            .filter_map(|(&entry, item)| {
                let key = (owner, item.msg);
                let mark = *self.marks.of.get(&key)?;
                let msg = self.messages.get(&key)?.0.clone();
                keep(mark).then(|| Unread {
                    entry,
                    item: item.clone(),
                    msg,
                    mark,
                })
            })
            .collect()
    }

    /// Queue again, in the copy of `client` that another node's newer one
    /// replaced (applied now, as `owner`'s), the stranded entries of the
    /// one here whose marks it lacks.
    pub(super) fn merge_stranded(
        &mut self,
        owner: PeerId,
        client: &str,
        kept: Vec<Unread>,
        fresh: &mut Vec<MsgId>,
        now_ms: u64,
        disk: &mut Disk<'_>,
    ) {
        let held = self.marks_of(client);
        for k in kept {
            if !held.contains(&k.mark) {
                self.restrand(owner, client, k, fresh, now_ms, disk);
            }
        }
    }

    /// Queue again, in the copy of `client` started over, a stranded
    /// entry its owner's full image lacked (`unread_stranded`).
    pub(super) fn restrand(
        &mut self,
        from: PeerId,
        client: &str,
        kept: Unread,
        fresh: &mut Vec<MsgId>,
        now_ms: u64,
        disk: &mut Disk<'_>,
    ) {
        let id = kept.item.msg;
        let message = ReplOp::Message {
            id,
            msg: kept.msg,
            mark: None,
        };
        let enqueue = ReplOp::Enqueue {
            client: client.into(),
            entry: kept.entry,
            item: kept.item,
        };
        if self.apply_one(from, message, fresh, now_ms, false, disk)
            && self.apply_one(from, enqueue, fresh, now_ms, false, disk)
        {
            self.marks.stranded((from, id), kept.mark);
            self.restranded += 1;
        }
    }

    /// The marks of the messages the copy of `client` holds (queued or in
    /// flight): the node that serves it from this copy has them, should
    /// the old owner relay them too (see `moves`).
    pub(crate) fn marks_of(&self, client: &str) -> HashSet<Mark> {
        let Some((img, owner)) = self
            .by_client
            .get(client)
            .and_then(|i| Some((i, i.owner?)))
            .filter(|_| !self.marks.of.is_empty())
        else {
            return HashSet::default();
        };
        held_msgs(img)
            .filter_map(|m| self.marks.of.get(&(owner, m)).copied())
            .collect()
    }

    /// The store ids, in its owner's store, of the messages the copy of
    /// `client` holds (queued or in flight): see `strand::Strands::held`.
    pub(crate) fn ids_of(&self, client: &str) -> HashSet<MsgId> {
        let Some(img) = self.by_client.get(client) else {
            return HashSet::default();
        };
        held_msgs(img).filter(|m| m.0 < STRANDED_BASE).collect()
    }

    /// Stranded entries the owners' own replaced, and those kept past a
    /// full image, since the last call.
    pub(crate) fn take_unstranded(&mut self) -> (u64, u64) {
        (
            std::mem::take(&mut self.unstranded),
            std::mem::take(&mut self.restranded),
        )
    }

    /// A fresh id for a stranded entry or message: above the owners' ids,
    /// rising, and rising across restarts too (it starts from the clock),
    /// so that one read back from the store is never given again.
    pub(super) fn next_stranded(&mut self, now_ms: u64) -> u64 {
        let floor = STRANDED_BASE | (now_ms.min((1 << 41) - 1) << 20);
        self.stranded_next = self.stranded_next.saturating_add(1).max(floor);
        self.stranded_next
    }
}

/// The messages a copy references, queued or in flight (repeats included).
fn held_msgs(img: &Image) -> impl Iterator<Item = MsgId> + '_ {
    let inflight = img
        .inflight
        .iter()
        .filter_map(|(_, _, e)| e.as_ref().map(|(_, e)| e.msg));
    img.queue.values().map(|e| e.msg).chain(inflight)
}

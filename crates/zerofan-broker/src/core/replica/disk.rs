//! A replica's copies on its own disk, so that an owner's acknowledgement
//! means "on disk on the replicas" and a replica that restarts still has
//! them.
//!
//! Each copy is a session of this node's store under a name no client id
//! can take (`\0r` + client id: MQTT forbids U+0000), written with the
//! same records as the node's own sessions. A message is written once per
//! owner and referenced by every copy that queues it (the store keeps it
//! while something references it). The replica answers `ReplicaAck` once
//! the commit that holds the batch is durable (`Durable::hold_replica_ack`).
//!
//! Each copy also stores the newest claim epoch known for its client id
//! (`Store::set_epoch`, written when it rises, in the same commit as the
//! changes it fences), and its version under it: the owner's last batch
//! it holds (written with each batch that raises it).
//!
//! At start the copies are read back as images owned by [`RESTORED`]: the
//! node numbering of the run that wrote them is gone. Their epochs are read
//! back into the fence (`fence`), so a change under an older claim is
//! still stale, and kept on the image, so a claim judges the copy against
//! the previous owner's epoch (`previous`). A live owner replaces them
//! with a full image when its link comes up; otherwise they wait for a
//! failover (`Images::take`), their expiry, or a drop at their epoch, a
//! newer one, or none (an owner restarted from its own store names none).

use super::{msg_size, Image, Images, ReplOp};
use crate::core::durable::{Durable, DurableLog};
use crate::core::peer::PeerId;
use std::collections::VecDeque;
use zerofan_store::{
    EntryId, MsgId, QueueEntry, RecoveredSession, SessionMeta, StoreError, StoredMessage,
    StoredWill, SubOptions,
};

/// What a copy's name starts with in the store.
const TAG: &str = "\u{0}r";

/// The owner of a copy read back from disk, until a live owner sends a
/// full image.
pub(crate) const RESTORED: PeerId = PeerId(u16::MAX);

/// Whether a store session name is a replica's copy.
pub(crate) fn is_copy(name: &str) -> bool {
    name.starts_with(TAG)
}

/// The node's store as the images write to it (none with `--memory`).
/// Failures are counted, not fatal: the copy in memory goes on.
pub(crate) struct Disk<'a> {
    log: Option<&'a mut dyn DurableLog>,
    /// The store name of the copy last written (`TAG` + client id), kept
    /// so that a batch's operations do not allocate one each.
    name: String,
    /// Store operations that failed.
    pub(crate) errors: u64,
}

impl<'a> Disk<'a> {
    pub(crate) fn new(durable: &'a mut Durable) -> Self {
        Disk {
            log: durable.log_mut().map(DurableLog::copies),
            name: String::new(),
            errors: 0,
        }
    }

    /// Whether a store is written.
    pub(super) fn on(&self) -> bool {
        self.log.is_some()
    }

    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut dyn DurableLog) -> Result<T, StoreError>,
    ) -> Option<T> {
        let log = self.log.as_deref_mut()?;
        let r = f(log);
        self.count(r)
    }

    /// `f` on the store with the copy's name of `client`.
    fn run_on<T>(
        &mut self,
        client: &str,
        f: impl FnOnce(&mut dyn DurableLog, &str) -> Result<T, StoreError>,
    ) -> Option<T> {
        let log = self.log.as_deref_mut()?;
        if self.name.get(TAG.len()..) != Some(client) {
            self.name.clear();
            self.name.push_str(TAG);
            self.name.push_str(client);
        }
        let r = f(log, &self.name);
        self.count(r)
    }

    fn count<T>(&mut self, r: Result<T, StoreError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.errors += 1;
                if self.errors == 1 {
                    tracing::warn!(error = %e, "replica copy not written");
                }
                None
            }
        }
    }

    pub(super) fn put_session(&mut self, client: &str, meta: SessionMeta) {
        self.run_on(client, |l, n| l.put_session(n, meta));
    }
    pub(super) fn drop_session(&mut self, client: &str) {
        self.run_on(client, |l, n| l.drop_session(n));
    }
    pub(super) fn subscribe(&mut self, client: &str, f: &str, o: SubOptions, id: Option<u32>) {
        self.run_on(client, |l, n| l.subscribe(n, f, o, id));
    }
    pub(super) fn unsubscribe(&mut self, client: &str, filter: &str) {
        self.run_on(client, |l, n| l.unsubscribe(n, filter));
    }
    pub(super) fn dequeue(&mut self, client: &str, entry: EntryId) {
        self.run_on(client, |l, n| l.dequeue(n, entry));
    }
    pub(super) fn send(&mut self, client: &str, entry: EntryId, pid: u16) {
        self.run_on(client, |l, n| l.send(n, entry, pid));
    }
    pub(super) fn pubrec(&mut self, client: &str, pid: u16) {
        self.run_on(client, |l, n| l.pubrec(n, pid));
    }
    /// A delivery past PUBREC named by a full image: the store keeps such
    /// a packet id only as an inflight entry, so it gets an empty one.
    pub(super) fn past_pubrec(&mut self, client: &str, pid: u16) {
        let empty = StoredMessage {
            qos: 2,
            ..StoredMessage::default()
        };
        self.run_on(client, |l, n| {
            let msg = l.put_message(&empty)?;
            let entry = QueueEntry {
                msg,
                qos: 2,
                ..QueueEntry::default()
            };
            let e = l.enqueue(n, &entry)?;
            l.send(n, e, pid)?;
            l.pubrec(n, pid)
        });
    }
    pub(super) fn complete(&mut self, client: &str, pid: u16) {
        self.run_on(client, |l, n| l.complete(n, pid));
    }
    pub(super) fn qos2_received(&mut self, client: &str, pid: u16) {
        self.run_on(client, |l, n| l.qos2_received(n, pid));
    }
    pub(super) fn qos2_released(&mut self, client: &str, pid: u16) {
        self.run_on(client, |l, n| l.qos2_released(n, pid));
    }
    /// An armed will stays in memory: one read back after a restart may
    /// be stale (its client's clean DISCONNECT missed while this node was
    /// down), and published when the owner dies would be a will of a
    /// normal disconnect; the replicas that stayed up hold the current
    /// one.
    pub(super) fn set_will(&mut self, client: &str, will: &StoredWill) {
        if will.armed.is_some() {
            return;
        }
        self.run_on(client, |l, n| l.set_will(n, will));
    }
    pub(super) fn clear_will(&mut self, client: &str) {
        self.run_on(client, |l, n| l.clear_will(n));
    }
    pub(super) fn set_epoch(&mut self, client: &str, epoch: u64, version: u64) {
        self.run_on(client, |l, n| l.set_epoch(n, epoch, version));
    }
}

impl Images {
    /// Apply `from`'s batch and write it to this node's store (the
    /// caller holds the answer for the commit). Returns the store
    /// failures.
    pub(crate) fn apply_durable(
        &mut self,
        from: PeerId,
        ops: Vec<ReplOp>,
        now_ms: u64,
        durable: &mut Durable,
    ) -> u64 {
        let mut disk = Disk::new(durable);
        self.apply(from, ops, now_ms, &mut disk);
        disk.errors
    }

    /// Write the entry's message (once per owner) and the entry; returns
    /// the store's id of the entry.
    pub(super) fn enqueue_on_disk(
        &mut self,
        key: (PeerId, MsgId),
        client: &str,
        item: &QueueEntry,
        disk: &mut Disk<'_>,
    ) -> Option<EntryId> {
        disk.log.as_ref()?;
        let msg = match self.local_msg.get(&key) {
            Some(m) => *m,
            None => {
                let body = self.messages.get(&key)?.0.clone();
                let m = disk.run(|l| l.put_message(&body))?;
                self.local_msg.insert(key, m);
                m
            }
        };
        let entry = QueueEntry {
            msg,
            ..item.clone()
        };
        disk.run_on(client, |l, n| l.enqueue(n, &entry))
    }

    /// Take the copies out of what the store read back (`sessions` keeps
    /// the node's own) and hold them again, within the bounds: what does
    /// not fit is refused (counted) and dropped from the store.
    pub(crate) fn restore(
        &mut self,
        sessions: &mut Vec<RecoveredSession>,
        durable: &mut Durable,
    ) -> u64 {
        if !sessions.iter().any(|s| is_copy(&s.client_id)) {
            return 0;
        }
        let mut disk = Disk::new(durable);
        let (copies, own): (Vec<_>, Vec<_>) = std::mem::take(sessions)
            .into_iter()
            .partition(|s| is_copy(&s.client_id));
        *sessions = own;
        for rs in copies {
            let Some(client) = rs.client_id.strip_prefix(TAG) else {
                continue;
            };
            let client: Box<str> = client.into();
            // A clean session's copy holds its client's will armed for a
            // connection of the run before (see `orphans`): its owner, if
            // alive, sends it again; read back, nobody would ever drop it.
            // (Builds since 2026-11-30 write none, see `Image::on_disk`.)
            if rs.meta.expiry_interval == 0 {
                disk.drop_session(&client);
                continue;
            }
            let owner = RESTORED;
            let mut fresh = 0usize;
            let mut seen = std::collections::HashSet::new();
            let entries = rs
                .queue
                .iter()
                .chain(rs.inflight.iter().filter_map(|f| f.entry.as_ref()));
            for e in entries {
                let key = (owner, e.entry.msg);
                if !self.messages.contains_key(&key) && seen.insert(key) {
                    fresh += msg_size(&e.message);
                }
            }
            if self.by_client.contains_key(&client)
                || self.by_client.len() >= self.max_images
                || self.bytes + fresh > self.max_bytes
            {
                self.refused += 1;
                disk.drop_session(&client);
                continue;
            }
            let mut img = Image {
                owner: Some(owner),
                epoch: rs.epoch,
                meta: rs.meta,
                subs: rs
                    .subscriptions
                    .into_iter()
                    .map(|s| (s.filter.into_boxed_str(), (s.options, s.id)))
                    .collect(),
                qos2: rs.incoming_qos2.into_iter().collect(),
                will: rs.will.map(Box::new),
                version: rs.version,
                ..Image::default()
            };
            let mut hold = |id: MsgId, m: &std::sync::Arc<StoredMessage>| {
                let key = (owner, id);
                let held = self.messages.entry(key).or_insert_with(|| {
                    self.bytes += msg_size(m);
                    (m.clone(), 0)
                });
                held.1 += 1;
                self.local_msg.insert(key, id);
            };
            for e in rs.queue {
                hold(e.entry.msg, &e.message);
                img.local.insert(e.id, e.id);
                img.queue.insert(e.id, e.entry, msg_size(&e.message));
            }
            for f in rs.inflight {
                let entry = f.entry.map(|e| {
                    hold(e.entry.msg, &e.message);
                    (e.id, e.entry)
                });
                img.inflight.push_back((f.packet_id, f.phase, entry));
            }
            let epoch = img.epoch;
            if self.by_client.insert(client.clone(), img).is_none() {
                *self.per_owner.entry(owner).or_default() += 1;
            }
            // Older claims' changes stay stale across the restart.
            let by_client = &self.by_client;
            self.fence
                .read_back(&client, epoch, &|c| by_client.contains_key(c));
        }
        disk.errors
    }
}

/// Most clean takeovers whose drops are remembered until every replica
/// answered them.
const MAX_DROPS: usize = 10_000;

/// Clean takeovers' drops (a clean session took a client id whose copies
/// the replicas may hold) not yet answered by every replica. A replica
/// that restarts loses what waited in its link's queue, and would read the
/// copy back from its disk: it gets these again, before any image.
#[derive(Debug, Default)]
pub(crate) struct Drops {
    /// Client id, the change number that last carried its drop, and the
    /// epoch of the clean claim (0: not known), which fences it as any
    /// change (see `fence`).
    list: VecDeque<(Box<str>, u64, u64)>,
    /// Drops forgotten unanswered because the list was full.
    pub(crate) forgotten: u64,
}

impl Drops {
    /// The operations that end any copy of `client` at a replica, whoever
    /// owned it: a `Reset` makes the sender the owner, `Drop` ends it.
    fn ops(client: &str, epoch: u64, out: &mut Vec<ReplOp>) {
        if epoch > 0 {
            out.push(ReplOp::Epoch {
                client: client.into(),
                epoch,
                version: 0,
            });
        }
        out.push(ReplOp::Reset {
            client: client.into(),
            meta: SessionMeta::default(),
            read: None,
        });
        out.push(ReplOp::Drop {
            client: client.into(),
        });
    }

    /// Remember `client`'s drop, sent as change `seq`; its operations.
    pub(crate) fn push(&mut self, client: &str, seq: u64, epoch: u64) -> Vec<ReplOp> {
        self.list.retain(|(c, _, _)| &**c != client);
        if self.list.len() >= MAX_DROPS {
            self.list.pop_front();
            self.forgotten += 1;
        }
        self.list.push_back((client.into(), seq, epoch));
        let mut ops = Vec::new();
        Drops::ops(client, epoch, &mut ops);
        ops
    }

    /// Every drop not yet answered, to be sent as change `seq`.
    pub(crate) fn resend(&mut self, seq: u64, out: &mut Vec<ReplOp>) {
        for (c, s, e) in &mut self.list {
            *s = seq;
            Drops::ops(c, *e, out);
        }
    }

    /// Forget the drops that `answered(seq)` says every replica has.
    pub(crate) fn settle(&mut self, answered: impl Fn(u64) -> bool) {
        self.list.retain(|(_, s, _)| !answered(*s));
    }
}

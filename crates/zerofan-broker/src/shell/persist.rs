//! The embedded store in the shell: opening it (refusing a newer format),
//! handing it to the core as its [`DurableLog`], and releasing held
//! acknowledgements when the store's writer thread reports durable LSNs.
//!
//! The writer thread calls the store's `on_durable` notifier; that wakes a
//! tokio [`Notify`] (`Send + Sync`) per shard, and [`release_loop`] on each
//! shard's thread asks its core to release what is now durable.
//!
//! Shards share one store ([`Opened::split`]): each core writes its own
//! records through a lock, and the store's writer thread makes every
//! shard's commits durable with one fsync (group commit). One log rather
//! than one per shard, because a restart may use another number of shards:
//! recovery hands each shard the sessions whose client ids it owns under
//! the new count (`shard_of`), and every shard all retained messages.

use super::state::Shared;
use crate::config::Config;
use crate::core::durable::DurableLog;
use crate::core::Broker;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Notify;
use zerofan_store::{
    EntryId, FsyncPolicy, Lsn, MsgId, Options, QueueEntry, Recovered, SessionMeta, Store,
    StoreError, StoreStats, StoredMessage, StoredWill, SubOptions,
};

/// An opened store, not yet attached to a broker.
pub struct Opened {
    store: Store,
    recovered: Recovered,
    /// One per shard, woken when the store made progress.
    notify: Vec<Arc<Notify>>,
}

/// One shard's part of an opened store: what it writes to, what it
/// restores, and what wakes its release loop.
pub struct ShardStore {
    log: ShardLog,
    recovered: Recovered,
    notify: Arc<Notify>,
}

enum ShardLog {
    /// The only shard: the store itself, no lock.
    Own(Box<Store>),
    /// One of several shards writing to the same store.
    Shared(Arc<Mutex<Store>>),
}

/// Open the store `config` asks for: `None` when the broker runs in
/// memory (`memory = true`, or no `data_dir`).
pub fn open(config: &Config) -> Result<Option<Opened>, String> {
    if config.memory {
        return Ok(None);
    }
    let Some(dir) = &config.data_dir else {
        return Ok(None);
    };
    let fsync: FsyncPolicy = config.fsync.parse()?;
    let notify: Vec<Arc<Notify>> = (0..config.shard_count().max(1))
        .map(|_| Arc::new(Notify::new()))
        .collect();
    let wakers = notify.clone();
    let options = Options {
        fsync,
        on_durable: Some(Arc::new(move |_| {
            for w in &wakers {
                w.notify_one();
            }
        })),
        ..Options::default()
    };
    let started = Instant::now();
    let (store, recovered) = Store::open(dir, options).map_err(|e| e.to_string())?;
    let r = &recovered.report;
    tracing::info!(
        dir = %dir.display(),
        %fsync,
        sessions = recovered.sessions.len(),
        retained = recovered.retained.len(),
        messages = r.live_messages,
        log_bytes = r.log_bytes,
        truncated_bytes = r.truncated_bytes,
        ms = started.elapsed().as_millis() as u64,
        "store opened"
    );
    Ok(Some(Opened {
        store,
        recovered,
        notify,
    }))
}

impl Opened {
    /// One part per shard (as many as `open` was configured for). Shard 0
    /// gets the recovery report; each shard the sessions it owns; every
    /// shard every retained message (each core keeps them all, and only the
    /// core that sets or clears one writes it). The sessions named in
    /// `on_first` go to shard 0 whatever their hash: the bridges' (a
    /// bridge runs on shard 0, and its in-memory connection never moves).
    pub fn split(self, on_first: &[String]) -> Vec<ShardStore> {
        let Opened {
            store,
            recovered,
            notify,
        } = self;
        let n = notify.len();
        if n <= 1 {
            let notify = notify
                .into_iter()
                .next()
                .unwrap_or_else(|| Arc::new(Notify::new()));
            return vec![ShardStore {
                log: ShardLog::Own(Box::new(store)),
                recovered,
                notify,
            }];
        }
        let shared = Arc::new(Mutex::new(store));
        let mut parts: Vec<Recovered> = (0..n)
            .map(|i| Recovered {
                retained: recovered.retained.clone(),
                sessions: Vec::new(),
                report: if i == 0 {
                    recovered.report.clone()
                } else {
                    Default::default()
                },
            })
            .collect();
        for s in recovered.sessions {
            let owner = if on_first.contains(&s.client_id) {
                0
            } else {
                crate::core::shard_of(s.client_id.as_bytes(), n)
            };
            parts[owner].sessions.push(s);
        }
        parts
            .into_iter()
            .zip(notify)
            .map(|(recovered, notify)| ShardStore {
                log: ShardLog::Shared(shared.clone()),
                recovered,
                notify,
            })
            .collect()
    }
}

/// Give a shard's part of the store to its broker and rebuild its state;
/// returns what the release loop waits on.
pub fn attach(broker: &mut Broker, part: ShardStore) -> Arc<Notify> {
    let now = Instant::now();
    let unix_ms = zerofan_store::unix_ms();
    let truncated = part.recovered.report.truncated_bytes;
    let log: Box<dyn DurableLog> = match part.log {
        ShardLog::Own(store) => store,
        ShardLog::Shared(store) => Box::new(SharedStore {
            store,
            pinned: Vec::new(),
        }),
    };
    broker.set_durable_log(log, now, unix_ms);
    broker.note_store_recovery(truncated);
    broker.restore(part.recovered, now);
    part.notify
}

/// The store as one of several shards sees it. Each call holds the lock
/// for one record; the commit hands the batch to the writer thread, which
/// covers every shard's commits since its last fsync with the next one.
struct SharedStore {
    store: Arc<Mutex<Store>>,
    /// Messages this shard put since its last commit: pinned in the store
    /// until then, because another shard's commit in between would forget
    /// a message this shard has not referenced yet (its queue entry comes
    /// in a later call), and the entry would then be refused.
    pinned: Vec<MsgId>,
}

impl SharedStore {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // A shard that panicked while holding the lock left the store as
        // the records it wrote say; the log's own checks cover a torn
        // batch, so the others go on writing.
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut store)
    }
}

impl DurableLog for SharedStore {
    fn put_message(&mut self, msg: &StoredMessage) -> Result<MsgId, StoreError> {
        let id = self.with(|s| {
            let id = s.put_message(msg)?;
            s.pin_message(id);
            Ok(id)
        })?;
        self.pinned.push(id);
        Ok(id)
    }
    fn set_retained(&mut self, topic: &str, msg: MsgId) -> Result<(), StoreError> {
        self.with(|s| s.set_retained(topic, msg))
    }
    fn clear_retained(&mut self, topic: &str) -> Result<(), StoreError> {
        self.with(|s| s.clear_retained(topic))
    }
    fn put_session(&mut self, client_id: &str, meta: SessionMeta) -> Result<(), StoreError> {
        self.with(|s| s.put_session(client_id, meta))
    }
    fn drop_session(&mut self, client_id: &str) -> Result<(), StoreError> {
        self.with(|s| s.drop_session(client_id))
    }
    fn subscribe(
        &mut self,
        client_id: &str,
        filter: &str,
        options: SubOptions,
        id: Option<u32>,
    ) -> Result<(), StoreError> {
        self.with(|s| s.subscribe(client_id, filter, options, id))
    }
    fn unsubscribe(&mut self, client_id: &str, filter: &str) -> Result<(), StoreError> {
        self.with(|s| s.unsubscribe(client_id, filter))
    }
    fn enqueue(&mut self, client_id: &str, entry: &QueueEntry) -> Result<EntryId, StoreError> {
        self.with(|s| s.enqueue(client_id, entry))
    }
    fn dequeue(&mut self, client_id: &str, entry: EntryId) -> Result<(), StoreError> {
        self.with(|s| s.dequeue(client_id, entry))
    }
    fn send(&mut self, client_id: &str, entry: EntryId, packet_id: u16) -> Result<(), StoreError> {
        self.with(|s| s.send(client_id, entry, packet_id))
    }
    fn pubrec(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.with(|s| s.pubrec(client_id, packet_id))
    }
    fn complete(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.with(|s| s.complete(client_id, packet_id))
    }
    fn qos2_received(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.with(|s| s.qos2_received(client_id, packet_id))
    }
    fn qos2_released(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        self.with(|s| s.qos2_released(client_id, packet_id))
    }
    fn set_will(&mut self, client_id: &str, will: &StoredWill) -> Result<(), StoreError> {
        self.with(|s| s.set_will(client_id, will))
    }
    fn clear_will(&mut self, client_id: &str) -> Result<(), StoreError> {
        self.with(|s| s.clear_will(client_id))
    }
    fn set_epoch(&mut self, client_id: &str, epoch: u64, version: u64) -> Result<(), StoreError> {
        self.with(|s| s.set_epoch_at(client_id, epoch, version))
    }
    fn commit(&mut self) -> Result<Lsn, StoreError> {
        let pinned = std::mem::take(&mut self.pinned);
        self.with(|s| {
            // This shard's references are all staged by now.
            for id in pinned {
                s.unpin_message(id);
            }
            s.commit()
        })
    }
    fn copies(&mut self) -> &mut dyn DurableLog {
        self
    }
    fn durable_lsn(&self) -> Lsn {
        match self.store.lock() {
            Ok(s) => s.durable_lsn(),
            Err(p) => p.into_inner().durable_lsn(),
        }
    }
    fn stats(&self) -> Option<StoreStats> {
        match self.store.lock() {
            Ok(s) => Some(s.stats()),
            Err(p) => Some(p.into_inner().stats()),
        }
    }
    fn counts_from_ms(&self) -> u64 {
        match self.store.lock() {
            Ok(s) => s.counts_from_ms(),
            Err(p) => p.into_inner().counts_from_ms(),
        }
    }
}

/// Release held acknowledgements whenever the store reports progress.
/// Runs until aborted.
pub async fn release_loop(shared: Rc<Shared>, notify: Arc<Notify>) {
    loop {
        notify.notified().await;
        shared.broker.borrow_mut().release_durable();
        shared.dispatch();
    }
}

impl DurableLog for Store {
    fn put_message(&mut self, msg: &StoredMessage) -> Result<MsgId, StoreError> {
        Store::put_message(self, msg)
    }
    fn set_retained(&mut self, topic: &str, msg: MsgId) -> Result<(), StoreError> {
        Store::set_retained(self, topic, msg)
    }
    fn clear_retained(&mut self, topic: &str) -> Result<(), StoreError> {
        Store::clear_retained(self, topic)
    }
    fn put_session(&mut self, client_id: &str, meta: SessionMeta) -> Result<(), StoreError> {
        Store::put_session(self, client_id, meta)
    }
    fn drop_session(&mut self, client_id: &str) -> Result<(), StoreError> {
        Store::drop_session(self, client_id)
    }
    fn subscribe(
        &mut self,
        client_id: &str,
        filter: &str,
        options: SubOptions,
        id: Option<u32>,
    ) -> Result<(), StoreError> {
        Store::subscribe(self, client_id, filter, options, id)
    }
    fn unsubscribe(&mut self, client_id: &str, filter: &str) -> Result<(), StoreError> {
        Store::unsubscribe(self, client_id, filter)
    }
    fn enqueue(&mut self, client_id: &str, entry: &QueueEntry) -> Result<EntryId, StoreError> {
        Store::enqueue(self, client_id, entry)
    }
    fn dequeue(&mut self, client_id: &str, entry: EntryId) -> Result<(), StoreError> {
        Store::dequeue(self, client_id, entry)
    }
    fn send(&mut self, client_id: &str, entry: EntryId, packet_id: u16) -> Result<(), StoreError> {
        Store::send(self, client_id, entry, packet_id)
    }
    fn pubrec(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        Store::pubrec(self, client_id, packet_id)
    }
    fn complete(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        Store::complete(self, client_id, packet_id)
    }
    fn qos2_received(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        Store::qos2_received(self, client_id, packet_id)
    }
    fn qos2_released(&mut self, client_id: &str, packet_id: u16) -> Result<(), StoreError> {
        Store::qos2_released(self, client_id, packet_id)
    }
    fn set_will(&mut self, client_id: &str, will: &StoredWill) -> Result<(), StoreError> {
        Store::set_will(self, client_id, will)
    }
    fn clear_will(&mut self, client_id: &str) -> Result<(), StoreError> {
        Store::clear_will(self, client_id)
    }
    fn set_epoch(&mut self, client_id: &str, epoch: u64, version: u64) -> Result<(), StoreError> {
        Store::set_epoch_at(self, client_id, epoch, version)
    }
    fn commit(&mut self) -> Result<Lsn, StoreError> {
        Store::commit(self)
    }
    fn copies(&mut self) -> &mut dyn DurableLog {
        self
    }
    fn durable_lsn(&self) -> Lsn {
        Store::durable_lsn(self)
    }
    fn stats(&self) -> Option<StoreStats> {
        Some(Store::stats(self))
    }
    fn counts_from_ms(&self) -> u64 {
        Store::counts_from_ms(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerofan_store::{Options, QueueEntry, SessionMeta};

    fn meta() -> SessionMeta {
        SessionMeta {
            expiry_interval: 3600,
            expires_at_ms: None,
        }
    }

    /// Two shards write to one store: shard 1 puts a message, shard 2
    /// commits before shard 1 has staged the queue entry that references
    /// it. The entry must still be taken and survive a restart (the commit
    /// in between used to forget the unreferenced message, so the entry was
    /// refused and an acknowledged message was lost).
    #[test]
    fn another_shards_commit_does_not_forget_a_message_not_referenced_yet() {
        let dir = std::env::temp_dir().join(format!("zerofan-pin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (store, _) = Store::open(&dir, Options::default()).expect("open");
        let store = Arc::new(Mutex::new(store));
        let mut one = SharedStore {
            store: store.clone(),
            pinned: Vec::new(),
        };
        let mut two = SharedStore {
            store: store.clone(),
            pinned: Vec::new(),
        };
        one.put_session("sub-one", meta()).expect("session");
        one.commit().expect("commit");
        two.put_session("sub-two", meta()).expect("session");
        let msg = StoredMessage {
            topic: bytes::Bytes::from_static(b"t"),
            payload: bytes::Bytes::from_static(b"kept"),
            qos: 1,
            ..Default::default()
        };
        let id = one.put_message(&msg).expect("message");
        two.commit().expect("the other shard commits in between");
        let entry = QueueEntry {
            msg: id,
            qos: 1,
            ..Default::default()
        };
        one.enqueue("sub-one", &entry).expect("the entry is taken");
        one.commit().expect("commit");
        // The last handle closes the store.
        drop((one, two, store));
        let (_, recovered) = Store::open(&dir, Options::default()).expect("reopen");
        let s = recovered
            .sessions
            .iter()
            .find(|s| s.client_id == "sub-one")
            .expect("session back");
        assert_eq!(s.queue.len(), 1, "the queued message survives");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

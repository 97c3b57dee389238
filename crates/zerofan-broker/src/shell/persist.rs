//! The embedded store in the shell: opening it (refusing a newer format),
//! handing it to the core as its [`DurableLog`], and releasing held
//! acknowledgements when the store's writer thread reports durable LSNs.
//!
//! The writer thread calls the store's `on_durable` notifier; that wakes a
//! tokio [`Notify`] (`Send + Sync`), and [`release_loop`] on the broker's
//! thread asks the core to release what is now durable.

use super::state::Shared;
use crate::config::Config;
use crate::core::durable::DurableLog;
use crate::core::Broker;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;
use zerofan_store::{
    EntryId, FsyncPolicy, Lsn, MsgId, Options, QueueEntry, Recovered, SessionMeta, Store,
    StoreError, StoreStats, StoredMessage, StoredWill, SubOptions,
};

/// An opened store, not yet attached to a broker.
pub struct Opened {
    store: Store,
    recovered: Recovered,
    notify: Arc<Notify>,
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
    let notify = Arc::new(Notify::new());
    let waker = notify.clone();
    let options = Options {
        fsync,
        on_durable: Some(Arc::new(move |_| waker.notify_one())),
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

/// Give the store to the broker and rebuild its state; returns what the
/// release loop waits on.
pub fn attach(broker: &mut Broker, opened: Opened) -> Arc<Notify> {
    let now = Instant::now();
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let truncated = opened.recovered.report.truncated_bytes;
    broker.set_durable_log(Box::new(opened.store), now, unix_ms);
    broker.note_store_recovery(truncated);
    broker.restore(opened.recovered, now);
    opened.notify
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
    fn commit(&mut self) -> Result<Lsn, StoreError> {
        Store::commit(self)
    }
    fn durable_lsn(&self) -> Lsn {
        Store::durable_lsn(self)
    }
    fn stats(&self) -> Option<StoreStats> {
        Some(Store::stats(self))
    }
}

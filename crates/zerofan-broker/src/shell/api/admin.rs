//! The one interface the HTTP API uses to read and act on the broker. Today
//! it borrows the single core; when the broker runs as several cores it
//! asks each and merges, and no handler changes.

use super::super::ops::Ops;
use super::super::prometheus::Snapshot;
use super::super::reload::Reloader;
use super::super::state::Shared;
use crate::core::admin::{AdminPublishError, ClientQuery, ClientView};
use bytes::Bytes;
use std::rc::Rc;
use std::time::Instant;
use zerofan_codec::{Publish, QoS};

/// A retained message as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetainedView {
    /// Its topic.
    pub topic: String,
    /// Its payload (shared with the store, not copied).
    pub payload: Bytes,
    /// Its QoS.
    pub qos: u8,
}

/// What the API may ask of the broker.
pub struct Admin {
    shared: Rc<Shared>,
    reloader: Option<Rc<Reloader>>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

impl Admin {
    /// An interface over `shared`; `reloader` is what `POST reload` uses.
    pub fn new(shared: Rc<Shared>, reloader: Option<Rc<Reloader>>) -> Admin {
        Admin { shared, reloader }
    }

    /// The sessions `q` matches: how many, and its page by client id.
    pub fn clients(&self, q: &ClientQuery) -> (usize, Vec<ClientView>) {
        self.shared.broker.borrow().admin_clients(q)
    }

    /// One session with its subscriptions.
    pub fn client(&self, client_id: &str) -> Option<ClientView> {
        self.shared.broker.borrow().admin_client(client_id)
    }

    /// Disconnect a client (0x98), optionally ending its session; false
    /// when there is no such session.
    pub fn disconnect(&self, client_id: &str, discard: bool) -> bool {
        let found =
            self.shared
                .broker
                .borrow_mut()
                .admin_disconnect(Instant::now(), client_id, discard);
        self.shared.dispatch();
        found
    }

    /// Retained messages matching `filter`, by topic, at most `limit`.
    pub fn retained(&self, filter: &str, limit: usize) -> Vec<RetainedView> {
        let mut found = Vec::new();
        self.shared
            .broker
            .borrow()
            .admin_retained(filter, &mut found);
        let mut out: Vec<RetainedView> = found
            .iter()
            .map(|m| RetainedView {
                topic: m.topic.to_string(),
                payload: m.payload.clone(),
                qos: m.qos as u8,
            })
            .collect();
        out.sort_by(|a, b| a.topic.cmp(&b.topic));
        out.truncate(limit);
        out
    }

    /// Clear `topic`'s retained message; false when there was none.
    pub fn clear_retained(&self, topic: &str) -> bool {
        let mut found = Vec::new();
        let mut b = self.shared.broker.borrow_mut();
        b.admin_retained(topic, &mut found);
        if found.is_empty() {
            return false;
        }
        b.admin_clear_retained(topic);
        true
    }

    /// Publish as the broker; how many sessions it reached.
    pub fn publish(&self, publish: Publish) -> Result<usize, AdminPublishError> {
        let r = self
            .shared
            .broker
            .borrow_mut()
            .admin_publish(Instant::now(), publish);
        self.shared.dispatch();
        r
    }

    /// The figures `/metrics` shows.
    pub fn stats(&self) -> Snapshot {
        Ops::snapshot(&self.shared)
    }

    /// Reload the configuration as SIGHUP does.
    pub fn reload(&self) -> Result<(), String> {
        let Some(r) = &self.reloader else {
            return Err("no configuration source to reload from".into());
        };
        if super::super::reload::reload_all(&self.shared, r.as_ref()()) {
            Ok(())
        } else {
            Err("reload failed: the configuration in force is kept (see the log)".into())
        }
    }
}

/// A PUBLISH built by the API.
pub fn publish(topic: &str, payload: Bytes, qos: QoS, retain: bool) -> Option<Publish> {
    Some(Publish {
        dup: false,
        qos,
        retain,
        topic: zerofan_codec::MqttStr::try_from(topic).ok()?,
        packet_id: 0,
        properties: Default::default(),
        payload,
    })
}

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

/// How long a client call waits for the other shards' sessions.
const GATHER_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// What the API may ask of the broker.
pub struct Admin {
    shared: Rc<Shared>,
    reloader: Option<Rc<Reloader>>,
    /// With several shards: the other shards' sessions, as gathered for
    /// the request being answered (see [`Admin::gather`]).
    others: std::cell::RefCell<Vec<ClientView>>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

impl Admin {
    /// An interface over `shared`; `reloader` is what `POST reload` uses.
    pub fn new(shared: Rc<Shared>, reloader: Option<Rc<Reloader>>) -> Admin {
        Admin {
            shared,
            reloader,
            others: Default::default(),
        }
    }

    /// With several shards: ask every other shard for its sessions (with
    /// their subscriptions), for the client calls of this request. One
    /// answer per shard, each bounded by its sessions; a shard that does
    /// not answer in time is left out.
    pub async fn gather(&self) {
        let Some(mesh) = self.shared.mesh.as_ref() else {
            return;
        };
        let n = mesh.count().saturating_sub(1);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<ClientView>>(n.max(1));
        mesh.run_on_others(move |s: &Rc<Shared>| {
            let all = ClientQuery {
                limit: usize::MAX,
                subscriptions: true,
                ..ClientQuery::default()
            };
            let _ = tx.try_send(s.broker.borrow().admin_clients(&all).1);
        });
        let mut views = Vec::new();
        let _ = tokio::time::timeout(GATHER_WAIT, async {
            for _ in 0..n {
                match rx.recv().await {
                    Some(v) => views.extend(v),
                    None => return,
                }
            }
        })
        .await;
        *self.others.borrow_mut() = views;
    }

    /// The sessions `q` matches: how many, and its page by client id
    /// (every shard's, after [`Admin::gather`]).
    pub fn clients(&self, q: &ClientQuery) -> (usize, Vec<ClientView>) {
        let others = self.others.borrow();
        if others.is_empty() {
            return self.shared.broker.borrow().admin_clients(q);
        }
        // This shard's first `offset + limit`, merged with the others'.
        let mine = ClientQuery {
            offset: 0,
            limit: q.offset.saturating_add(q.limit),
            ..q.clone()
        };
        let (mut total, mut views) = self.shared.broker.borrow().admin_clients(&mine);
        for v in others.iter().filter(|v| q.keeps_view(v)) {
            total += 1;
            let mut v = v.clone();
            if !q.subscriptions {
                v.subscriptions = Vec::new();
            }
            views.push(v);
        }
        views.sort_unstable_by(|a, b| a.client_id.cmp(&b.client_id));
        let page = views.into_iter().skip(q.offset).take(q.limit).collect();
        (total, page)
    }

    /// One session with its subscriptions.
    pub fn client(&self, client_id: &str) -> Option<ClientView> {
        let here = self.shared.broker.borrow().admin_client(client_id);
        here.or_else(|| {
            let others = self.others.borrow();
            others.iter().find(|v| v.client_id == client_id).cloned()
        })
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
        if found {
            return true;
        }
        let elsewhere = self
            .others
            .borrow()
            .iter()
            .any(|v| v.client_id == client_id);
        if let (true, Some(mesh)) = (elsewhere, self.shared.mesh.as_ref()) {
            // Its shard disconnects it; the others find no such session.
            let id = client_id.to_string();
            mesh.run_on_others(move |s: &Rc<Shared>| {
                let done = s
                    .broker
                    .borrow_mut()
                    .admin_disconnect(Instant::now(), &id, discard);
                if done {
                    s.dispatch();
                }
            });
        }
        elsewhere
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

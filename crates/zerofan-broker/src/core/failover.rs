//! Where the broker meets its replicas (see `replica`): sending what a
//! core event staged for persistent sessions, answering and counting the
//! replicas' answers, sending full images, and installing an image as the
//! live session when this node is granted its client id.

use super::broker::Broker;
use super::durable::{to_stored, SessionMeta, StoredWill};
use super::ids::SessionId;
use super::peer::{PeerEvent, PeerId};
use super::replica::{ReplOp, Waiter};
use super::session::{InflightState, SubRecord};
use std::collections::HashSet;
use std::time::Instant;
use zerofan_codec::Connect;
use zerofan_store::{QueueEntry, Recovered};

impl Broker {
    /// Keep `copies` copies of every persistent session (this node's
    /// included) on the peers (the nodes of a cluster): 1 keeps none
    /// elsewhere. Needs a durable log.
    pub fn set_replicas(&mut self, copies: usize) {
        self.repl.set_copies(copies);
    }

    /// Bound the images this node keeps for other nodes.
    pub fn set_replica_limits(&mut self, images: usize, bytes: usize) {
        self.repl.images.set_limits(images, bytes);
    }

    /// Images of other nodes' sessions kept here, and their message bytes.
    pub fn replica_images(&self) -> (usize, usize) {
        (self.repl.images.len(), self.repl.images.bytes())
    }

    /// Send what this event staged for persistent sessions to the replica
    /// set; this event's acknowledgements wait for their answers.
    pub(crate) fn flush_replication(&mut self) {
        if !self.repl.on() {
            return;
        }
        let ops = self.repl.take_ops();
        if ops.is_empty() {
            return;
        }
        let targets = self.repl.current().to_vec();
        if targets.is_empty() {
            return;
        }
        self.send_replicated(&targets, ops);
        for (conn, out) in self.durable.take_pending() {
            self.repl.hold_ack(conn, out);
        }
    }

    fn send_replicated(&mut self, targets: &[PeerId], ops: Vec<ReplOp>) {
        let seq = self.repl.stamp(targets);
        let n = ops.len() as u64;
        let bytes: usize = ops.iter().map(ReplOp::size).sum();
        let mut ops = Some(ops);
        for (i, p) in targets.iter().enumerate() {
            self.metrics.replicated_ops += n;
            self.metrics.replicated_bytes += bytes as u64;
            // The last replica gets the operations themselves.
            let ops = if i + 1 == targets.len() {
                ops.take()
            } else {
                ops.clone()
            };
            self.peers.send(
                *p,
                PeerEvent::Replicate {
                    seq,
                    ops: ops.unwrap_or_default(),
                },
            );
        }
    }

    /// A peer came, left, went away or is back: the replica set is the
    /// first `copies - 1` reachable peers. A peer new to it gets full
    /// images; one that leaves it (still a peer) is told to drop its
    /// copies, which no longer follow the sessions. Returns the new ones.
    pub(crate) fn replica_set_changed(&mut self) -> Vec<PeerId> {
        if !self.repl.on() {
            return Vec::new();
        }
        let peers = &self.peers;
        let set = self
            .repl
            .targets(peers.ids().filter(|p| !peers.is_away(*p)));
        let old = self.repl.set_current(set.clone());
        let added: Vec<PeerId> = set.iter().copied().filter(|p| !old.contains(p)).collect();
        for p in &added {
            self.send_images(Some(*p), None);
        }
        let left: Vec<PeerId> = old
            .into_iter()
            .filter(|p| !set.contains(p) && self.peers.ids().any(|q| q == *p))
            .collect();
        if !left.is_empty() {
            let drops: Vec<ReplOp> = self
                .sessions
                .values()
                .filter(|s| s.stored && s.expiry_interval > 0)
                .map(|s| ReplOp::Drop {
                    client: s.client_id.as_str().into(),
                })
                .collect();
            if !drops.is_empty() {
                for p in left {
                    self.send_replicated(&[p], drops.clone());
                }
            }
        }
        added
    }

    /// Whether `Seen { seq }` for `from` must wait for the replicas.
    pub(crate) fn replica_holds_seen(&mut self, from: PeerId, seq: u64) -> bool {
        if !self.repl.on() {
            return false;
        }
        let peers = &self.peers;
        self.repl.wait_seen(from, seq, &|p| peers.is_away(p))
    }

    /// `from`'s operations on its sessions: kept, then answered.
    pub(crate) fn replica_ops(&mut self, now: Instant, from: PeerId, seq: u64, ops: Vec<ReplOp>) {
        let (applied, refused) = (self.repl.images.applied, self.repl.images.refused);
        let now_ms = self.durable.unix_ms(now);
        self.repl.images.apply(from, ops, now_ms);
        self.metrics.replica_ops_applied += self.repl.images.applied - applied;
        self.metrics.replica_ops_refused += self.repl.images.refused - refused;
        self.peers.send(from, PeerEvent::ReplicaAck { seq });
    }

    /// `peer` answered (`Some(seq)`), left (`None`), or is away or back:
    /// what waited may go.
    pub(crate) fn replica_answered(&mut self, peer: PeerId, seq: Option<u64>) {
        let peers = &self.peers;
        let away = |p| peers.is_away(p);
        let (ready, without) = match seq {
            Some(s) => self.repl.answered(peer, s, false, &away),
            None if !peers.ids().any(|p| p == peer) => self.repl.answered(peer, 0, true, &away),
            None => self.repl.ready(&away),
        };
        self.metrics.replica_waits_skipped += without;
        if ready.is_empty() {
            return;
        }
        for w in ready {
            match w {
                // The store first, as any acknowledgement.
                Waiter::Ack(conn, out) => self.durable.hold(conn, out),
                Waiter::Seen(p, s) => self.durable_seen_now(p, s),
            }
        }
        // Their commit may be durable already: the store will not say so
        // again.
        self.end_event();
        self.release_durable();
    }

    /// The full images of the persistent sessions here (of `only`, when
    /// given), for `to` (every replica when `None`).
    pub(crate) fn send_images(&mut self, to: Option<PeerId>, only: Option<SessionId>) {
        if !self.repl.on() || !self.durable.on() {
            return;
        }
        let targets: Vec<PeerId> = self
            .repl
            .current()
            .iter()
            .copied()
            .filter(|p| to.is_none_or(|t| t == *p))
            .collect();
        if targets.is_empty() {
            return;
        }
        // What was staged before belongs before the image.
        self.flush_replication();
        // Only sessions claimed here since start: one restored from this
        // node's store may have moved to another node meanwhile, and its
        // image would replace the new owner's.
        let sids: Vec<SessionId> = match only {
            Some(sid) => vec![sid],
            None => self
                .sessions
                .iter()
                .filter(|(_, s)| self.repl.is_claimed(s.client_id.as_str()))
                .map(|(sid, _)| *sid)
                .collect(),
        };
        let mut ops = Vec::new();
        let mut named = HashSet::new();
        for sid in sids {
            self.image_ops(sid, &mut ops, &mut named);
        }
        if !ops.is_empty() {
            self.send_replicated(&targets, ops);
        }
    }

    /// The operations that rebuild `sid` from nothing at a replica.
    fn image_ops(
        &mut self,
        sid: SessionId,
        ops: &mut Vec<ReplOp>,
        named: &mut HashSet<zerofan_store::MsgId>,
    ) {
        let d = &self.durable;
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if !s.stored || s.expiry_interval == 0 {
            return;
        }
        let client: Box<str> = s.client_id.as_str().into();
        ops.push(ReplOp::Reset {
            client: client.clone(),
            meta: SessionMeta {
                expiry_interval: s.expiry_interval,
                expires_at_ms: s.expires_at.map(|at| d.unix_ms(at)),
            },
        });
        for (filter, rec) in s.flight().subscriptions.iter() {
            ops.push(ReplOp::Subscribe {
                client: client.clone(),
                filter: filter.clone(),
                options: sub_options(rec),
                id: rec.id,
            });
        }
        let mut entry_ops = |q: &super::session::Queued, ops: &mut Vec<ReplOp>| -> bool {
            let (Some(entry), Some(msg)) = (q.entry, q.msg.stored().get()) else {
                return false;
            };
            if named.insert(msg) {
                ops.push(ReplOp::Message {
                    id: msg,
                    msg: std::sync::Arc::new(to_stored(&q.msg, d)),
                });
            }
            ops.push(ReplOp::Enqueue {
                client: client.clone(),
                entry,
                item: QueueEntry {
                    msg,
                    qos: q.qos as u8,
                    retain: q.retain,
                    subscription_ids: q.sub_ids.clone(),
                    share: q.share.as_deref().map(str::to_owned),
                },
            });
            true
        };
        let mut inflight: Vec<_> = s.flight().inflight.iter().collect();
        inflight.sort_by_key(|(_, f)| f.seq);
        for (pid, f) in inflight {
            match f.state {
                InflightState::AwaitingAck => {
                    if entry_ops(&f.item, ops) {
                        if let Some(entry) = f.item.entry {
                            ops.push(ReplOp::Send {
                                client: client.clone(),
                                entry,
                                pid: *pid,
                            });
                        }
                    }
                }
                _ => ops.push(ReplOp::PubRec {
                    client: client.clone(),
                    pid: *pid,
                }),
            }
        }
        let queued: Vec<super::session::Queued> = s
            .queue_iter_mut()
            .filter(|q| q.entry.is_some())
            .map(|q| q.clone())
            .collect();
        for q in &queued {
            entry_ops(q, ops);
        }
        for pid in &s.flight().incoming_qos2 {
            ops.push(ReplOp::Qos2Received {
                client: client.clone(),
                pid: *pid,
            });
        }
        if let Some(w) = &s.pending_will {
            let will = &w.will;
            let mut message = to_stored(
                &super::message::Message::owned(
                    will.topic.clone(),
                    will.payload.clone(),
                    will.qos,
                    will.retain,
                    will.properties.clone(),
                    None,
                ),
                d,
            );
            message.expires_at_ms = None;
            ops.push(ReplOp::SetWill {
                client: client.clone(),
                will: Box::new(StoredWill {
                    message,
                    due_at_ms: d.unix_ms(w.at),
                    message_expiry_interval: will.properties.message_expiry_interval,
                }),
            });
        }
    }

    /// This node was granted `connect`'s client id: an image of its
    /// session kept here becomes the live session (unless the client
    /// starts clean, or a session is here already), written to this
    /// node's store.
    pub(crate) fn install_replica(&mut self, now: Instant, connect: &Connect) {
        let client = connect.client_id.as_str();
        if !self.repl.images.has(client) {
            return;
        }
        if connect.clean_start || self.by_client.contains_key(&connect.client_id) {
            self.repl.images.forget(client);
            return;
        }
        let Some(rs) = self.repl.images.take(client) else {
            return;
        };
        let will = rs.will.clone();
        self.restore(
            Recovered {
                sessions: vec![rs],
                ..Default::default()
            },
            now,
        );
        let Some(&sid) = self.by_client.get(&connect.client_id) else {
            return;
        };
        self.metrics.replica_installs += 1;
        self.restage(sid, will);
    }

    /// Write an installed session to this node's store: its ids were the
    /// old owner's.
    fn restage(&mut self, sid: SessionId, will: Option<StoredWill>) {
        let d = &self.durable;
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        let client = s.client_id.clone();
        s.stored = true;
        let meta = SessionMeta {
            expiry_interval: s.expiry_interval,
            expires_at_ms: s.expires_at.map(|at| d.unix_ms(at)),
        };
        let mut items = Vec::new();
        while let Some(q) = s.pop() {
            items.push(q);
        }
        let subs: Vec<(Box<str>, SubRecord)> = s
            .flight()
            .subscriptions
            .iter()
            .map(|(f, r)| (f.clone(), *r))
            .collect();
        let mut inflight: Vec<_> = s
            .flight_any()
            .map(|f| f.inflight.drain().collect())
            .unwrap_or_default();
        inflight.sort_by_key(|(_, f): &(u16, super::session::Inflight)| f.seq);
        let qos2: Vec<u16> = s.flight().incoming_qos2.iter().copied().collect();
        for q in &items {
            q.msg.stored().clear();
        }
        for (_, f) in &inflight {
            f.item.msg.stored().clear();
        }
        let errors = &mut self.metrics.store_errors;
        self.durable.stage(errors, |l| l.put_session(&client, meta));
        for (filter, rec) in subs {
            self.dur_subscribed(sid, &filter, rec);
        }
        for (pid, mut f) in inflight {
            f.item.entry = None;
            self.dur_enqueue(sid, &mut f.item);
            if let Some(e) = f.item.entry {
                let errors = &mut self.metrics.store_errors;
                self.durable.stage(errors, |l| l.send(&client, e, pid));
                if f.state != InflightState::AwaitingAck {
                    self.durable.stage(errors, |l| l.pubrec(&client, pid));
                }
            }
            if let Some(s) = self.sessions.get_mut(&sid) {
                s.flight_mut().inflight.insert(pid, f);
            }
        }
        for mut q in items {
            q.entry = None;
            self.dur_enqueue(sid, &mut q);
            if let Some(s) = self.sessions.get_mut(&sid) {
                let _ = s.push(q, usize::MAX, usize::MAX, crate::config::QueueFull::DropNew);
            }
        }
        let errors = &mut self.metrics.store_errors;
        for pid in qos2 {
            self.durable
                .stage(errors, |l| l.qos2_received(&client, pid));
        }
        if let Some(w) = will {
            self.durable.stage(errors, |l| l.set_will(&client, &w));
        }
    }

    /// After a granted claim: the replicas get the session's full image
    /// from its new owner (a fresh one too: what they kept of another
    /// owner's is stale).
    pub(crate) fn claimed(&mut self, client: &zerofan_codec::MqttStr) {
        if let Some(&sid) = self.by_client.get(client) {
            if self
                .sessions
                .get(&sid)
                .is_some_and(|s| s.stored && s.expiry_interval > 0)
            {
                self.repl.claim(client.as_str());
            }
            self.send_images(None, Some(sid));
        }
    }
}

fn sub_options(r: &SubRecord) -> zerofan_store::SubOptions {
    zerofan_store::SubOptions {
        qos: r.options.qos as u8,
        no_local: r.options.no_local,
        retain_as_published: r.options.retain_as_published,
        retain_handling: r.options.retain_handling,
    }
}

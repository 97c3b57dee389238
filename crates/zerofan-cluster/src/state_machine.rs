//! The replicated state: membership (kept by openraft) and client-id
//! ownership with its fencing epochs. Snapshots are whole JSON documents,
//! replaced atomically on the disk.

use crate::disk::Disk;
use crate::types::{Command, NodeInfo, Reply, StorageError, TypeConfig};
use openraft::storage::RaftStateMachine;
use openraft::{
    Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftSnapshotBuilder,
    Snapshot, SnapshotMeta, StoredMembership,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Cursor};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;

const SNAPSHOT: &str = "raft-snapshot";
/// Client ids the ownership table holds; a claim of a new one past it is
/// refused. The same on every node: it decides what the log answers.
pub const MAX_CLIENT_IDS: usize = 1_000_000;

/// A client id this node served has been claimed by another node: the local
/// connection must go (DISCONNECT 0x8E). A restarted node re-applies its log
/// and may hear of old losses again: act only when `epoch` is above the
/// epoch the local session holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnershipLost {
    /// MQTT client id.
    pub client_id: String,
    /// Node that owns it now.
    pub new_owner: u64,
    /// The new owner's epoch.
    pub epoch: u64,
    /// The client at the new owner starts clean (a fence's, or a claim's
    /// as the log has it): the session ends here rather than moving, and
    /// a will left waiting for its delay is then due.
    pub clean_start: bool,
    /// It was taken without a fence (this node's lease ran out, or a
    /// will's claim after its connection ended): the node that took it
    /// settles the wills of its copy (see `Previous::lapsed`). False when
    /// this node answered a fence, or led and held its lease: then the
    /// wills are this node's to settle.
    pub lapsed: bool,
    /// The owner (node, epoch) before this node's claims of the id, as the
    /// log's table had it (`None`: none, or not known): a copy this node
    /// keeps is the session's only if that owner wrote it under that
    /// epoch. One of an owner before that (whose will another node
    /// published when it took the id) is stale.
    pub before: Option<(u64, u64)>,
}

/// The state the log builds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SmData {
    pub(crate) last_applied: Option<LogId<u64>>,
    pub(crate) last_membership: StoredMembership<u64, NodeInfo>,
    /// Client id → (owner node, epoch).
    pub(crate) owners: BTreeMap<String, (u64, u64)>,
    /// Epoch of a released client id, so a later claim still rises above it.
    pub(crate) released: BTreeMap<String, u64>,
    /// Client id -> the owner before the current one (another node) and
    /// its epoch: a claim's answer names it, so the claimant can tell
    /// whether a copy of the session it holds is the newest. Keys are a
    /// subset of `owners`'.
    #[serde(default)]
    pub(crate) previous: BTreeMap<String, (u64, u64)>,
    pub(crate) claims: u64,
    pub(crate) fenced_takeovers: u64,
    pub(crate) refused: u64,
}

/// What the state machine shares with the cluster handle.
pub struct SmShared {
    data: Mutex<SmData>,
    local: u64,
    events: mpsc::Sender<OwnershipLost>,
    events_dropped: AtomicU64,
}

/// Whether `entry`, a client id's owner and epoch, is `owner`'s (at
/// `epoch`; 0: any): the condition of a [`Command::ClaimOrphan`].
pub(crate) fn held_by(entry: Option<(u64, u64)>, owner: u64, epoch: u64) -> bool {
    entry.is_some_and(|(o, e)| o == owner && (epoch == 0 || e == epoch))
}

impl SmShared {
    /// For node `local`; ownership losses go to `events` (bounded: when full
    /// they are dropped and counted; the epoch still fences the old owner).
    pub fn new(local: u64, events: mpsc::Sender<OwnershipLost>) -> Arc<SmShared> {
        Arc::new(SmShared {
            data: Mutex::new(SmData::default()),
            local,
            events,
            events_dropped: AtomicU64::new(0),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, SmData> {
        // The data is plain values; a panic elsewhere cannot leave it torn.
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Owner and epoch of `client_id` as applied here.
    pub fn owner(&self, client_id: &str) -> Option<(u64, u64)> {
        self.lock().owners.get(client_id).copied()
    }

    /// The owner (node, epoch) before the current owner's claims of
    /// `client_id`, when another node.
    pub fn previous(&self, client_id: &str) -> Option<(u64, u64)> {
        self.lock().previous.get(client_id).copied()
    }

    /// Ownership-loss events dropped because the queue was full.
    pub fn events_dropped(&self) -> u64 {
        self.events_dropped.load(Ordering::Relaxed)
    }

    fn apply_command(&self, data: &mut SmData, cmd: Command) -> Reply {
        match cmd {
            Command::Claim {
                client_id,
                node,
                clean_start,
                by_lease,
            } => self.claim(data, client_id, node, clean_start, by_lease),
            Command::ClaimOrphan {
                client_id,
                node,
                owner,
                epoch,
            } => {
                // Decided here, in log order, not on the leader's view
                // before the write: a claim or release committed in between
                // wins, and this one changes nothing.
                if held_by(data.owners.get(&client_id).copied(), owner, epoch) {
                    // A will's claim: no client of its own, and taken
                    // without a fence.
                    self.claim(data, client_id, node, false, Some((owner, epoch)))
                } else {
                    Reply::Moved
                }
            }
            Command::Release { client_id, epoch } => {
                if let Some(&(_, held)) = data.owners.get(&client_id) {
                    if held == epoch {
                        data.owners.remove(&client_id);
                        data.previous.remove(&client_id);
                        // Bounded by MAX_CLIENT_IDS as the owners table is.
                        if data.released.len() < MAX_CLIENT_IDS {
                            data.released.insert(client_id, epoch);
                        }
                    }
                }
                Reply::None
            }
        }
    }

    /// `node` takes `client_id` (a [`Command::Claim`], or a
    /// [`Command::ClaimOrphan`] whose owner matched): the epoch rises above
    /// the last one, the owner before is named, and the local node hears
    /// when it lost the id: whether its client starts clean, and whether
    /// it is the owner the leader found out of its lease (`by_lease`).
    fn claim(
        &self,
        data: &mut SmData,
        client_id: String,
        node: u64,
        clean_start: bool,
        by_lease: Option<(u64, u64)>,
    ) -> Reply {
        let prev = data.owners.get(&client_id).copied();
        if prev.is_none() && data.owners.len() >= MAX_CLIENT_IDS {
            data.refused += 1;
            return Reply::Refused("client id table full".into());
        }
        let base = prev
            .map(|(_, e)| e)
            .or_else(|| data.released.get(&client_id).copied())
            .unwrap_or(0);
        let epoch = base + 1;
        data.released.remove(&client_id);
        // The owner before the one this claim takes from, for its loss.
        let before = data.previous.get(&client_id).copied();
        // The claimant's own earlier claims (retries that committed, clients
        // that left before the answer) wrote nothing another node could
        // hold: name the owner before.
        let previous = match prev {
            Some((old, _)) if old == node => data.previous.get(&client_id).copied(),
            Some(p) => {
                data.previous.insert(client_id.clone(), p);
                Some(p)
            }
            None => {
                data.previous.remove(&client_id);
                None
            }
        };
        data.owners.insert(client_id.clone(), (node, epoch));
        data.claims += 1;
        if let Some((old, _)) = prev {
            if old != node {
                data.fenced_takeovers += 1;
                if old == self.local {
                    let lost = OwnershipLost {
                        client_id,
                        new_owner: node,
                        epoch,
                        clean_start,
                        lapsed: lapsed(by_lease, prev),
                        before,
                    };
                    if self.events.try_send(lost).is_err() {
                        self.events_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        Reply::Claimed {
            owner: node,
            epoch,
            previous,
        }
    }
}

/// Whether `owner` (node, epoch), the owner when a claim applies, is the
/// one the leader found out of its lease (`by_lease`; epoch 0: any of
/// that node's): the claim's answer and the loss judge it alike.
pub(crate) fn lapsed(by_lease: Option<(u64, u64)>, owner: Option<(u64, u64)>) -> bool {
    by_lease
        .zip(owner)
        .is_some_and(|((n, e), (pn, pe))| n == pn && (e == 0 || e == pe))
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<u64, NodeInfo>,
    data: Vec<u8>,
}

fn sm_error(verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    StorageError::from_io_error(
        ErrorSubject::StateMachine,
        verb,
        io::Error::other(e.to_string()),
    )
}

fn read_snapshot(disk: &dyn Disk) -> Result<Option<StoredSnapshot>, StorageError> {
    match disk.read(SNAPSHOT) {
        Ok(Some(b)) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| sm_error(ErrorVerb::Read, format!("raft snapshot file: {e}"))),
        Ok(None) => Ok(None),
        Err(e) => Err(sm_error(ErrorVerb::Read, e)),
    }
}

/// openraft's state machine.
pub struct StateMachine {
    shared: Arc<SmShared>,
    disk: Arc<dyn Disk>,
    built: u64,
}

impl StateMachine {
    /// Start from the last snapshot on `disk`; openraft re-applies the log
    /// after it.
    pub fn open(disk: Arc<dyn Disk>, shared: Arc<SmShared>) -> Result<StateMachine, StorageError> {
        if let Some(s) = read_snapshot(disk.as_ref())? {
            let data: SmData = serde_json::from_slice(&s.data)
                .map_err(|e| sm_error(ErrorVerb::Read, format!("raft snapshot data: {e}")))?;
            *shared.lock() = data;
        }
        Ok(StateMachine {
            shared,
            disk,
            built: 0,
        })
    }
}

/// Builds snapshots from the shared state.
pub struct SnapshotBuilder {
    shared: Arc<SmShared>,
    disk: Arc<dyn Disk>,
    seq: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let (data, last_applied, last_membership) = {
            let d = self.shared.lock();
            let bytes = serde_json::to_vec(&*d).map_err(|e| sm_error(ErrorVerb::Read, e))?;
            (bytes, d.last_applied, d.last_membership.clone())
        };
        let snapshot_id = match last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, self.seq),
            None => format!("0-0-{}", self.seq),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership,
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        let bytes = serde_json::to_vec(&stored).map_err(|e| sm_error(ErrorVerb::Write, e))?;
        self.disk
            .replace(SNAPSHOT, &bytes)
            .map_err(|e| sm_error(ErrorVerb::Write, e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, NodeInfo>), StorageError> {
        let d = self.shared.lock();
        Ok((d.last_applied, d.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut data = self.shared.lock();
        let mut replies = Vec::new();
        for e in entries {
            data.last_applied = Some(e.log_id);
            let reply = match e.payload {
                EntryPayload::Blank => Reply::None,
                EntryPayload::Normal(cmd) => self.shared.apply_command(&mut data, cmd),
                EntryPayload::Membership(m) => {
                    data.last_membership = StoredMembership::new(Some(e.log_id), m);
                    Reply::None
                }
            };
            replies.push(reply);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.built += 1;
        SnapshotBuilder {
            shared: self.shared.clone(),
            disk: self.disk.clone(),
            seq: self.built,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, NodeInfo>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let mut data: SmData = serde_json::from_slice(&bytes)
            .map_err(|e| sm_error(ErrorVerb::Read, format!("received snapshot: {e}")))?;
        data.last_applied = meta.last_log_id;
        data.last_membership = meta.last_membership.clone();
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: bytes,
        };
        let file = serde_json::to_vec(&stored).map_err(|e| sm_error(ErrorVerb::Write, e))?;
        self.disk
            .replace(SNAPSHOT, &file)
            .map_err(|e| sm_error(ErrorVerb::Write, e))?;
        *self.shared.lock() = data;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(read_snapshot(self.disk.as_ref())?.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(sm: &SmShared, data: &mut SmData, node: u64) -> Reply {
        let cmd = Command::Claim {
            client_id: "c".into(),
            node,
            clean_start: false,
            by_lease: None,
        };
        sm.apply_command(data, cmd)
    }

    fn claimed(epoch: u64, owner: u64, previous: Option<(u64, u64)>) -> Reply {
        Reply::Claimed {
            owner,
            epoch,
            previous,
        }
    }

    /// A claim names the owner before it that is not the claimant: a retry
    /// that committed twice, or a claim whose client left, does not hide
    /// the node whose copies the claimant may hold.
    #[test]
    fn a_claim_names_the_previous_other_owner() {
        let (tx, _rx) = mpsc::channel(8);
        let sm = SmShared::new(9, tx);
        let mut d = SmData::default();
        assert_eq!(claim(&sm, &mut d, 1), claimed(1, 1, None));
        assert_eq!(claim(&sm, &mut d, 2), claimed(2, 2, Some((1, 1))));
        assert_eq!(claim(&sm, &mut d, 2), claimed(3, 2, Some((1, 1))));
        assert_eq!(claim(&sm, &mut d, 3), claimed(4, 3, Some((2, 3))));
        assert_eq!(claim(&sm, &mut d, 3), claimed(5, 3, Some((2, 3))));
        assert_eq!(claim(&sm, &mut d, 2), claimed(6, 2, Some((3, 5))));
        // Released: no owner before the next claim.
        let release = Command::Release {
            client_id: "c".into(),
            epoch: 6,
        };
        sm.apply_command(&mut d, release);
        assert!(d.previous.is_empty());
        assert_eq!(claim(&sm, &mut d, 1), claimed(7, 1, None));
    }

    /// The node a claim takes the client id from hears whether the
    /// claimant's client starts clean, from the log: a node whose lease
    /// ran out gets no fence that would say so. An entry written before
    /// the field existed reads as not clean.
    #[test]
    fn the_owner_a_claim_takes_from_hears_of_a_clean_start() {
        let (tx, mut rx) = mpsc::channel(8);
        let sm = SmShared::new(1, tx);
        let mut d = SmData::default();
        assert_eq!(claim(&sm, &mut d, 1), claimed(1, 1, None));
        let clean = Command::Claim {
            client_id: "c".into(),
            node: 2,
            clean_start: true,
            by_lease: None,
        };
        assert_eq!(sm.apply_command(&mut d, clean), claimed(2, 2, Some((1, 1))));
        let lost = rx.try_recv().ok();
        assert_eq!(
            lost.map(|l| (l.new_owner, l.epoch, l.clean_start, l.lapsed)),
            Some((2, 2, true, false))
        );
        let old: Command =
            serde_json::from_str(r#"{"Claim":{"client_id":"c","node":1}}"#).expect("old entry");
        assert_eq!(
            old,
            Command::Claim {
                client_id: "c".into(),
                node: 1,
                clean_start: false,
                by_lease: None,
            }
        );
        assert_eq!(sm.apply_command(&mut d, old), claimed(3, 1, Some((2, 2))));
        let back = rx.try_recv();
        assert!(back.is_err(), "node 1 took it: no loss here");
    }

    /// The node a claim takes the client id from hears whether it lost it
    /// by its lease (no fence reached it), from the log: only when it
    /// still owns the id under the epoch the leader found out of its lease
    /// when the entry applies. Then the claimant settles the wills; else
    /// that node does.
    #[test]
    fn the_owner_a_claim_takes_from_hears_whether_by_its_lease() {
        let (tx, mut rx) = mpsc::channel(8);
        let sm = SmShared::new(1, tx);
        let mut d = SmData::default();
        let mut take = |d: &mut SmData, node, by_lease| {
            let cmd = Command::Claim {
                client_id: "c".into(),
                node,
                clean_start: true,
                by_lease,
            };
            sm.apply_command(d, cmd);
            rx.try_recv().ok().map(|l| l.lapsed)
        };
        assert_eq!(take(&mut d, 1, None), None);
        assert_eq!(take(&mut d, 2, Some((1, 1))), Some(true));
        assert_eq!(take(&mut d, 1, None), None);
        // Any epoch of that node's.
        assert_eq!(take(&mut d, 2, Some((1, 0))), Some(true));
        assert_eq!(take(&mut d, 1, None), None);
        // Found out of its lease under an older claim: it took the id
        // again since, and holds it under a newer lease.
        assert_eq!(take(&mut d, 2, Some((1, 3))), Some(false));
        assert_eq!(take(&mut d, 1, None), None);
        assert_eq!(take(&mut d, 2, Some((3, 0))), Some(false), "another node");
    }

    /// The node a claim takes the client id from hears which owner came
    /// before its own claims: its copy is the session's only if that owner
    /// wrote it (see `OwnershipLost::before`).
    #[test]
    fn the_owner_a_claim_takes_from_hears_the_owner_before_it() {
        let (tx, mut rx) = mpsc::channel(8);
        let sm = SmShared::new(1, tx);
        let mut d = SmData::default();
        let mut take = |d: &mut SmData, node| {
            claim(&sm, d, node);
            rx.try_recv().ok().map(|l| l.before)
        };
        assert_eq!(take(&mut d, 3), None);
        assert_eq!(take(&mut d, 1), None, "no loss here");
        assert_eq!(take(&mut d, 1), None, "its own claim again");
        assert_eq!(take(&mut d, 2), Some(Some((3, 1))));
        assert_eq!(take(&mut d, 1), None);
        assert_eq!(take(&mut d, 2), Some(Some((2, 4))));
        assert_eq!(d.previous.get("c"), Some(&(1, 5)));
    }

    fn orphan(sm: &SmShared, data: &mut SmData, node: u64, owner: u64, epoch: u64) -> Reply {
        let cmd = Command::ClaimOrphan {
            client_id: "c".into(),
            node,
            owner,
            epoch,
        };
        sm.apply_command(data, cmd)
    }

    /// A conditional claim takes the client id only from the owner (and
    /// epoch) it names; one that lost the race to another claim changes
    /// nothing, so a node taking a dead owner's session never takes it from
    /// whoever took it first.
    #[test]
    fn an_orphan_claim_takes_only_from_the_named_owner() {
        let (tx, mut rx) = mpsc::channel(8);
        let sm = SmShared::new(1, tx);
        let mut d = SmData::default();
        assert_eq!(orphan(&sm, &mut d, 2, 1, 0), Reply::Moved, "no owner");
        assert!(d.owners.is_empty());
        assert_eq!(claim(&sm, &mut d, 1), claimed(1, 1, None));
        assert_eq!(claim(&sm, &mut d, 1), claimed(2, 1, None));
        let before = (d.owners.clone(), d.previous.clone(), d.claims);
        // Wrong owner, wrong epoch (older or newer): nothing changes, and a
        // refusal is not a full table.
        for (owner, epoch) in [(3, 0), (3, 2), (1, 1), (1, 3)] {
            assert_eq!(orphan(&sm, &mut d, 2, owner, epoch), Reply::Moved);
        }
        assert_eq!((d.owners.clone(), d.previous.clone(), d.claims), before);
        assert_eq!((d.refused, d.fenced_takeovers), (0, 0));
        assert!(rx.try_recv().is_err(), "no loss heard");
        // Owner and epoch match: taken as a claim would, and node 1 (this
        // node) hears it lost the id.
        assert_eq!(orphan(&sm, &mut d, 2, 1, 2), claimed(3, 2, Some((1, 2))));
        assert_eq!(d.owners.get("c"), Some(&(2, 3)));
        assert_eq!((d.claims, d.fenced_takeovers), (3, 1));
        assert_eq!(
            rx.try_recv().ok(),
            Some(OwnershipLost {
                client_id: "c".into(),
                new_owner: 2,
                epoch: 3,
                clean_start: false,
                lapsed: true,
                before: None,
            })
        );
        // A second taker naming the same dead owner finds it moved.
        assert_eq!(orphan(&sm, &mut d, 3, 1, 2), Reply::Moved);
        assert_eq!(orphan(&sm, &mut d, 3, 1, 0), Reply::Moved);
        assert_eq!(d.owners.get("c"), Some(&(2, 3)));
        // Epoch 0 matches whatever epoch the owner holds.
        assert_eq!(orphan(&sm, &mut d, 3, 2, 0), claimed(4, 3, Some((2, 3))));
        // Released: there is no owner to take it from.
        let release = Command::Release {
            client_id: "c".into(),
            epoch: 4,
        };
        sm.apply_command(&mut d, release);
        assert_eq!(orphan(&sm, &mut d, 2, 3, 0), Reply::Moved);
        assert!(d.owners.is_empty());
        assert_eq!(d.released.get("c"), Some(&4));
    }
}

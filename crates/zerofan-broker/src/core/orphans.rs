//! Wills of a dead node's clients. A client connected to a node that dies
//! sends no DISCONNECT, and that node cannot publish its will any more.
//!
//! - The owner: the replicas of a persistent session keep the will of its
//!   connected client armed (see `Broker::dur_will_armed`), and drop it
//!   when the connection ends without one to publish.
//! - A replica: when a node is away, every copy of its sessions kept here
//!   that holds a will (armed, or pending: its client left before the node
//!   died, the will waiting for its delay) is an orphan. The shell asks
//!   the cluster for its client id on condition that the away node still
//!   owns it and its lease ran out (`Cluster::claim_orphan`: never taken
//!   from a live owner, so a node only cut off from this one keeps its
//!   clients). Of the nodes holding copies, the one granted adopts its copy
//!   as an offline session of its own whose will is due after its delay,
//!   counted from when this node's link to the away node went down (see
//!   `Broker::set_peer_away_since`), published as any lost connection's;
//!   the other nodes find the id moved on.
//!
//! - A clean session (expiry 0) has no copies, but its client's will has
//!   one: the owner sends its replicas a copy holding only that will,
//!   armed ([`CleanWills`]), and drops it when the session ends here.
//! - A node restarted (a new run of it links here, see
//!   `Broker::peer_restarted`) lost its former run's connections, and its
//!   new run knows nothing of their wills: the wills armed in its copies
//!   here are orphans too, claimed under the very claim each copy names
//!   (`Cluster::claim_ended`: no lease to wait for, and a client
//!   back since has a newer claim). Before, a node restarted before a
//!   copy holder's claim was granted was not away any more, and its
//!   clients' wills were never published.
//! - A node whose lease ran out drops its clients and publishes no will:
//!   its copies keep them armed ([`KeptWill`]), for the node that takes a
//!   client id because that lease ran out (the claim says so,
//!   `PreviousOwner::lapsed`), also one that still reaches this node. The
//!   node keeps them as well ([`FencedWill`]): once its lease is back it
//!   claims each id under the claim it held it under
//!   ([`Orphaned::Fenced`]); still its own, the will is its to publish.
//!   The log orders that claim and any other node's, so one of them
//!   publishes, once.
//!
//! Bounded by the copies: at most one request per copy kept here, and one
//! more while its owner's restart is claimed; and by this node's clients
//! (one fenced will each).

use super::hash::{HashMap, HashSet};
use super::ids::SessionId;
use super::peer::PeerId;
use std::time::Instant;
use zerofan_codec::Will;
use zerofan_store::StoredWill;

/// The owner's side: a will its replicas keep armed while its connection
/// closes, because this node's lease ran out (`Broker::fence_clients`):
/// the node that takes the client id next publishes it.
#[derive(Debug)]
pub(crate) enum KeptWill {
    /// Of a persistent session, which stays (its copies' will stays armed).
    Persistent(SessionId),
    /// Of a clean session, which ends: its entry in [`CleanWills`], and the
    /// epoch it was armed under.
    Clean(Box<str>, u64),
}

/// The owner's side: the will of a connection this node dropped when its
/// lease ran out, kept until the cluster says whether the client id is
/// still this node's once the lease is back ([`Orphaned::Fenced`]): then
/// this node publishes it; otherwise the node that took the id did, or
/// not (see `PreviousOwner::lapsed`).
#[derive(Debug)]
pub(crate) struct FencedWill {
    /// The claim the id was held under.
    pub(crate) epoch: u64,
    pub(crate) will: Box<Will>,
    /// When the connection was dropped: the will's delay counts from then.
    pub(crate) at: Instant,
}

/// The owner's side: clean sessions here whose replicas hold their
/// client's will armed, with the claim epoch it was sent under (the drop
/// at the session's end names it; a newer claim of the same id, here,
/// may have replaced the epoch the replication layer knows by then).
/// Bounded by the sessions here: one entry per connected clean client
/// with a will.
#[derive(Debug, Default)]
pub(crate) struct CleanWills {
    armed: HashMap<Box<str>, u64>,
}

impl CleanWills {
    pub(crate) fn arm(&mut self, client: &str, epoch: u64) {
        self.armed.insert(client.into(), epoch);
    }

    /// `client`'s session ended: the epoch its will was armed under, if
    /// it was.
    pub(crate) fn disarm(&mut self, client: &str) -> Option<u64> {
        self.armed.remove(client)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.armed.iter().map(|(c, e)| (&**c, *e))
    }
}

/// A copy's client id the shell must claim from its away owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrphanRequest {
    /// The client id.
    pub client_id: Box<str>,
    /// The node that owned it and is away (or restarted).
    pub owner: PeerId,
    /// The claim of `owner` the copy was written under (0: any).
    pub epoch: u64,
    /// Why the will is unpublished.
    pub why: Orphaned,
}

/// Why an [`OrphanRequest`]'s will was never published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Orphaned {
    /// Its owner is away (dead, or cut off): claimed once its lease ran
    /// out (`Cluster::claim_orphan`).
    Away,
    /// Its owner restarted since it wrote the copy (see
    /// [`Orphans::restarted`]): the connection ended with that run, so no
    /// lease needs to run out, only the owner to hold the id under `epoch`
    /// still (`Cluster::claim_ended`).
    Restarted,
    /// This node's own client, dropped when its lease ran out ([`FencedWill`]);
    /// `owner` is this node. The lease is back: the id is claimed under
    /// `epoch` as for `Restarted`, and granted, the will is this node's.
    Fenced,
}

/// A copy's armed will, as `Images::armed_wills_of` finds it.
#[derive(Debug)]
pub(crate) struct ArmedWill {
    pub(crate) client_id: Box<str>,
    /// The claim the copy was written under.
    pub(crate) epoch: u64,
    pub(crate) will: Box<StoredWill>,
    /// Due at once when its connection is lost: its session ends with it
    /// (expiry 0), or its delay is 0.
    pub(crate) due: bool,
}

/// A copy's armed will taken when its claim was asked for, kept until the
/// claim is answered: the copy may be written over meanwhile (see
/// `Broker::orphan_claimed`).
#[derive(Debug)]
pub(crate) struct Captured {
    owner: PeerId,
    /// Its owner restarted, rather than went away: its new run may write
    /// over the copy.
    restarted: bool,
    pub(crate) will: Box<StoredWill>,
    /// See [`ArmedWill::due`].
    pub(crate) due: bool,
}

impl Captured {
    pub(crate) fn restarted(&self) -> bool {
        self.restarted
    }
}

/// Orphans found and not answered yet.
#[derive(Debug, Default)]
pub(crate) struct Orphans {
    requests: Vec<OrphanRequest>,
    /// Asked for and not answered: not asked again meanwhile.
    asked: HashSet<Box<str>>,
    /// The armed wills of the copies asked for, as they were when asked,
    /// until their claim is answered. Bounded by the copies: one per copy.
    captured: HashMap<Box<str>, Captured>,
    /// Asked for, and the leader fenced this node for a client back
    /// elsewhere with a clean start before the answer came (see
    /// `Broker::orphan_claimed`). Bounded by `asked`.
    clean_back: HashSet<Box<str>>,
    /// This node's own fenced wills. Bounded by the connections: one per
    /// client connected when the lease ran out.
    fenced: HashMap<Box<str>, FencedWill>,
    /// When the away owner of a copy asked for lost its link here, until
    /// the claim is answered. Bounded by the copies: one per copy.
    lost_at: HashMap<Box<str>, Instant>,
}

impl Orphans {
    /// `owner` is away: these copies of its sessions hold wills (client
    /// id, the claim the copy was written under, 0 if not known). Each is
    /// claimed only from that claim: a copy that missed a later one (its
    /// client back on `owner` since) is not the will to publish. `armed`:
    /// those armed (see [`Orphans::restarted`]), kept as they are now,
    /// should a later owner's copy replace them before the grant is
    /// applied here (see `Broker::orphan_claimed`).
    pub(crate) fn found(
        &mut self,
        owner: PeerId,
        clients: Vec<(Box<str>, u64)>,
        armed: Vec<ArmedWill>,
        since: Option<Instant>,
    ) {
        for (client_id, epoch) in clients {
            if self.asked.insert(client_id.clone()) {
                if let Some(at) = since {
                    self.lost_at.insert(client_id.clone(), at);
                }
                self.requests.push(OrphanRequest {
                    client_id,
                    owner,
                    epoch,
                    why: Orphaned::Away,
                });
            }
        }
        for a in armed {
            if self.asked.contains(&a.client_id) {
                self.captured.entry(a.client_id).or_insert(Captured {
                    owner,
                    restarted: false,
                    will: a.will,
                    due: a.due,
                });
            }
        }
    }

    /// `owner` restarted: its former run's connections are gone, and with
    /// them these copies' armed wills (client id, the claim it held the id
    /// under, the will), which it never published and its new run does
    /// not know. Each is claimed under that very claim (see
    /// `Broker::peer_restarted`); one asked for already (its owner away
    /// before) is asked again so.
    pub(crate) fn restarted(&mut self, owner: PeerId, wills: Vec<ArmedWill>) {
        for a in wills {
            self.asked.insert(a.client_id.clone());
            self.captured.insert(
                a.client_id.clone(),
                Captured {
                    owner,
                    restarted: true,
                    will: a.will,
                    due: a.due,
                },
            );
            self.requests.push(OrphanRequest {
                client_id: a.client_id,
                owner,
                epoch: a.epoch,
                why: Orphaned::Restarted,
            });
        }
    }

    /// Whether `client`'s will was captured from a restarted `owner`.
    pub(crate) fn captured(&self, client: &str, owner: PeerId) -> bool {
        self.captured
            .get(client)
            .is_some_and(|c| c.restarted && c.owner == owner)
    }

    /// `client`'s connection here was dropped when the lease ran out.
    pub(crate) fn fenced(&mut self, client: Box<str>, will: FencedWill) {
        self.fenced.insert(client, will);
    }

    /// The lease is back: ask for each fenced will's client id, this
    /// node's (`me`) under the claim it was held under.
    pub(crate) fn confirm_fenced(&mut self, me: PeerId) {
        for (client, f) in &self.fenced {
            if self.asked.insert(client.clone()) {
                self.requests.push(OrphanRequest {
                    client_id: client.clone(),
                    owner: me,
                    epoch: f.epoch,
                    why: Orphaned::Fenced,
                });
            }
        }
    }

    pub(crate) fn is_fenced(&self, client: &str) -> bool {
        self.fenced.contains_key(client)
    }

    /// The fenced will of `client`, taken (it is settled).
    pub(crate) fn take_fenced(&mut self, client: &str) -> Option<FencedWill> {
        self.fenced.remove(client)
    }

    /// The leader gave `client`, asked for here, to a client that starts
    /// clean (its fence said so): its session ends with that, and the
    /// will captured for it is due whatever its delay.
    pub(crate) fn back_clean(&mut self, client: &str) {
        if self.asked.contains(client) {
            self.clean_back.insert(client.into());
        }
    }

    /// Whether `client` came back with a clean start ([`Orphans::back_clean`]).
    pub(crate) fn came_back_clean(&self, client: &str) -> bool {
        self.clean_back.contains(client)
    }

    /// The will captured for `client`, taken.
    pub(crate) fn take_captured(&mut self, client: &str) -> Option<Captured> {
        self.captured.remove(client)
    }

    /// When `client`'s away owner lost its link here, taken.
    pub(crate) fn take_lost_at(&mut self, client: &str) -> Option<Instant> {
        self.lost_at.remove(client)
    }

    pub(crate) fn take_requests(&mut self, out: &mut Vec<OrphanRequest>) {
        out.append(&mut self.requests);
    }

    pub(crate) fn has_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    /// `client`'s claim ended (granted, moved on, or given up): it may be
    /// asked for again.
    pub(crate) fn answered(&mut self, client: &str) {
        self.asked.remove(client);
        self.captured.remove(client);
        self.lost_at.remove(client);
        self.clean_back.remove(client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_asked_for_once_until_answered() {
        let mut o = Orphans::default();
        o.found(
            PeerId(1),
            vec![("a".into(), 1), ("b".into(), 0)],
            Vec::new(),
            None,
        );
        o.found(PeerId(1), vec![("a".into(), 1)], Vec::new(), None);
        let mut out = Vec::new();
        o.take_requests(&mut out);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(!o.has_requests());
        o.answered("a");
        o.found(
            PeerId(1),
            vec![("a".into(), 1), ("b".into(), 0)],
            Vec::new(),
            None,
        );
        out.clear();
        o.take_requests(&mut out);
        let names: Vec<&str> = out.iter().map(|r| &*r.client_id).collect();
        assert_eq!(names, ["a"]);
    }
}

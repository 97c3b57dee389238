//! Client ids in a cluster: a CONNECT goes on only once the cluster agreed
//! that this node owns its client id. The claim goes through the cluster's
//! consensus log and carries a rising epoch, so of two nodes that both see
//! the same client id connect, one wins and the other's connection is told
//! 0x8E (session taken over) when it learns of the newer claim.
//!
//! The core asks and the shell answers ([`Broker::take_claims`],
//! [`Broker::claim_answered`], [`Broker::client_taken`]); without a cluster
//! none of this runs. A claim is made after authentication, so a client
//! that cannot log in cannot take a client id away from another node.
//!
//! [`Broker::take_claims`]: super::Broker::take_claims
//! [`Broker::claim_answered`]: super::Broker::claim_answered
//! [`Broker::client_taken`]: super::Broker::client_taken

use super::ids::ConnId;
use super::peer::PeerId;
use std::collections::{HashMap, HashSet, VecDeque};
use zerofan_codec::Connect;

/// Most claims remembered after their client left, awaiting the answer.
/// The shell answers every claim within its timeout and has at most a few
/// hundred in flight, so this is reached only if answers stop coming.
const MAX_LEFT: usize = 4096;

/// How this node lost a client id to another node's claim, as the
/// leader's fence or the log says (see `Broker::client_taken_from`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Loss {
    /// The node that took it (`None`: not known here).
    pub to: Option<PeerId>,
    /// The epoch this node held it under (0: not known).
    pub held: u64,
    /// The client at `to` starts clean: the session here ends.
    pub clean_start: bool,
    /// Taken without a fence (this node's lease ran out): `to` settles
    /// the wills.
    pub lapsed: bool,
    /// The owner before this node's claims of the id (`None`: none, or
    /// not known): a copy kept here is the session only if that owner
    /// wrote it under its epoch.
    pub before: Option<super::PreviousOwner>,
}

/// A client id the shell must claim for a waiting connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The connection whose CONNECT waits.
    pub conn: ConnId,
    /// Its client id.
    pub client_id: Box<str>,
    /// Its CONNECT starts clean (the owner it is taken from is told so).
    pub clean_start: bool,
}

/// The claims this core waits on. Bounded by the connections: each has at
/// most one CONNECT waiting.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    on: bool,
    requests: Vec<ClaimRequest>,
    waiting: HashMap<ConnId, Box<Connect>>,
    /// Claimed, its CONNECT going on (checked once, then forgotten).
    granted: HashSet<ConnId>,
    /// Claims whose client left before the answer, with their client id:
    /// a granted one still moved the id here (the old owner ended its
    /// session), so the session must go on here (see
    /// `Broker::claim_answered_at`). Oldest first, at most [`MAX_LEFT`].
    left: VecDeque<(ConnId, Box<str>)>,
    /// Claims of clients that left, forgotten unanswered (`left` full).
    pub(crate) left_forgotten: u64,
    /// Client ids whose old owner said it handed its copy over (see
    /// `PeerEvent::Handover`), until their claim is answered here. Oldest
    /// first, at most [`MAX_HANDED`]: one that arrives after its claim was
    /// answered stays until pushed out, and one pushed out early only
    /// makes its claim wait the bounded time it waited before.
    handed: VecDeque<Box<str>>,
    /// A handover arrived since the shell last looked.
    handed_new: bool,
    /// Client ids whose claim asked the other nodes for a copy
    /// (`PeerEvent::CopyWanted`), with the nodes yet to answer. Oldest
    /// first, at most [`MAX_HANDED`], like `handed`.
    asked: VecDeque<(Box<str>, Vec<PeerId>)>,
}

/// Most handovers remembered (see [`Claims::handed`]).
const MAX_HANDED: usize = 1024;

impl Claims {
    pub(crate) fn enable(&mut self, on: bool) {
        self.on = on;
    }

    /// Whether `connect` must wait for a claim first. An empty client id
    /// gets a fresh random one, which no other node holds.
    pub(crate) fn must_claim(&mut self, conn: ConnId, connect: &Connect) -> bool {
        self.on && !connect.client_id.is_empty() && !self.granted.remove(&conn)
    }

    pub(crate) fn ask(&mut self, conn: ConnId, connect: Box<Connect>) {
        // A mark from before this claim (an old owner that re-applied an
        // old loss) is not this claim's.
        self.settle_handover(connect.client_id.as_str());
        self.requests.push(ClaimRequest {
            conn,
            client_id: connect.client_id.as_str().into(),
            clean_start: connect.clean_start,
        });
        self.waiting.insert(conn, connect);
    }

    pub(crate) fn take_requests(&mut self, out: &mut Vec<ClaimRequest>) {
        out.append(&mut self.requests);
    }

    pub(crate) fn has_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    /// The CONNECT that waited on `conn`'s claim; when `granted`, it will
    /// pass [`Claims::must_claim`] once.
    pub(crate) fn answered(&mut self, conn: ConnId, granted: bool) -> Option<Box<Connect>> {
        let connect = self.waiting.remove(&conn)?;
        if granted {
            self.granted.insert(conn);
        }
        Some(connect)
    }

    /// The client id `conn`'s claim is for, while it waits, unless its
    /// CONNECT starts clean (a copy here goes anyway).
    pub(crate) fn resumes(&self, conn: ConnId) -> Option<&str> {
        self.waiting
            .get(&conn)
            .filter(|c| !c.clean_start)
            .map(|c| c.client_id.as_str())
    }

    /// The client id `conn`'s claim is for, while it waits, when the copy
    /// of its session matters: it resumes the session, or it starts clean
    /// after an owner that let go by its lease (`lapsed`), whose wills
    /// this node then settles from that copy (see
    /// `Broker::install_replica`).
    pub(crate) fn wants_copies(&self, conn: ConnId, lapsed: bool) -> Option<&str> {
        self.waiting
            .get(&conn)
            .filter(|c| !c.clean_start || lapsed)
            .map(|c| c.client_id.as_str())
    }

    /// Whether `conn`'s claim, while it waits, is for a CONNECT that
    /// starts clean.
    pub(crate) fn starts_clean(&self, conn: ConnId) -> bool {
        self.waiting.get(&conn).is_some_and(|c| c.clean_start)
    }

    /// `conn` closed: forget what it waited for; a claim still unanswered
    /// is remembered with its client id until it is (see [`Claims::left`]).
    pub(crate) fn forget(&mut self, conn: ConnId) {
        if let Some(connect) = self.waiting.remove(&conn) {
            if self.left.len() >= MAX_LEFT {
                self.left.pop_front();
                self.left_forgotten += 1;
            }
            self.left
                .push_back((conn, connect.client_id.as_str().into()));
        }
        self.granted.remove(&conn);
    }

    /// `client`'s old owner handed its copy over.
    pub(crate) fn handed_over(&mut self, client: Box<str>) {
        if self.handed.len() >= MAX_HANDED {
            self.handed.pop_front();
        }
        self.handed.push_back(client);
        self.handed_new = true;
    }

    /// Whether `client`'s old owner handed its copy over.
    pub(crate) fn was_handed(&self, client: &str) -> bool {
        self.handed.iter().any(|c| &**c == client)
    }

    /// Whether a handover arrived since the last call.
    pub(crate) fn take_handed_new(&mut self) -> bool {
        std::mem::take(&mut self.handed_new)
    }

    /// `client`'s claim was answered: its handover is spent.
    pub(crate) fn settle_handover(&mut self, client: &str) {
        if !self.handed.is_empty() {
            self.handed.retain(|c| &**c != client);
        }
        if !self.asked.is_empty() {
            self.asked.retain(|(c, _)| &**c != client);
        }
    }

    /// `client`'s claim asked `peers` for a copy.
    pub(crate) fn asked_copy(&mut self, client: &str, peers: Vec<PeerId>) {
        self.asked.retain(|(c, _)| &**c != client);
        if self.asked.len() >= MAX_HANDED {
            self.asked.pop_front();
        }
        self.asked.push_back((client.into(), peers));
    }

    /// `from` answered the ask for `client`'s copy (a copy and its mark,
    /// or none).
    pub(crate) fn copy_answered(&mut self, client: &str, from: PeerId) {
        if let Some((_, peers)) = self.asked.iter_mut().find(|(c, _)| &**c == client) {
            peers.retain(|p| *p != from);
            if peers.is_empty() {
                self.handed_new = true;
            }
        }
    }

    /// Whether `client`'s claim asked for a copy: `Some(true)` while a
    /// node asked has not answered.
    pub(crate) fn copy_asked(&self, client: &str) -> Option<bool> {
        self.asked
            .iter()
            .find(|(c, _)| &**c == client)
            .map(|(_, peers)| !peers.is_empty())
    }

    /// The client id of `conn`'s claim, answered now, if its client left
    /// before the answer.
    pub(crate) fn left(&mut self, conn: ConnId) -> Option<Box<str>> {
        let at = self.left.iter().position(|(c, _)| *c == conn)?;
        self.left.remove(at).map(|(_, client)| client)
    }
}

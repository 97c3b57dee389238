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
use std::collections::{HashMap, HashSet};
use zerofan_codec::Connect;

/// A client id the shell must claim for a waiting connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The connection whose CONNECT waits.
    pub conn: ConnId,
    /// Its client id.
    pub client_id: Box<str>,
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
}

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
        self.requests.push(ClaimRequest {
            conn,
            client_id: connect.client_id.as_str().into(),
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

    /// `conn` closed: forget what it waited for.
    pub(crate) fn forget(&mut self, conn: ConnId) {
        self.waiting.remove(&conn);
        self.granted.remove(&conn);
    }
}

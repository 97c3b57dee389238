//! A cluster node's ownership lease, as the core sees it: the node serves
//! the client ids it claimed through the cluster only while it holds the
//! lease (see `zerofan_cluster`'s `lease` module for why that keeps one
//! owner per client id across a partition). When the lease runs out, every
//! connection whose client id was claimed is dropped (MQTT 5: DISCONNECT
//! 0x9C Use another server, as 0x88 Server unavailable is not allowed in a
//! DISCONNECT; 3.1.1: closed), and CONNECTs are refused with 0x88 (3.1.1:
//! return code 3) until it is renewed.

use super::ids::ConnId;
use std::collections::HashSet;

#[derive(Debug, Default)]
pub(crate) struct Lease {
    lost: bool,
    /// Connections whose client id the cluster gave this node. Bounded by
    /// the connections: each is forgotten when it closes.
    claimed: HashSet<ConnId>,
}

impl Lease {
    pub(crate) fn lost(&self) -> bool {
        self.lost
    }

    pub(crate) fn claimed(&mut self, conn: ConnId) {
        self.claimed.insert(conn);
    }

    pub(crate) fn forget(&mut self, conn: ConnId) {
        self.claimed.remove(&conn);
    }

    /// The lease is `held` or not: the connections to drop now (those
    /// claimed, when it was just lost), in a stable order.
    pub(crate) fn set(&mut self, held: bool) -> Vec<ConnId> {
        let was_lost = std::mem::replace(&mut self.lost, !held);
        if held || was_lost {
            return Vec::new();
        }
        let mut conns: Vec<ConnId> = self.claimed.drain().collect();
        conns.sort_unstable();
        conns
    }
}

//! openraft's RPCs over TCP: one connection per peer, opened with a `Raft`
//! hello, one request and one reply at a time.

use crate::frame::{self, Hello, Kind, LARGE_FRAME};
use crate::tls::{self, ClusterTls, NodeStream};
use crate::types::{NodeInfo, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{timeout, Instant};

/// A Raft request on the wire.
#[derive(Serialize, Deserialize)]
pub enum RaftRequest {
    /// Replication and heartbeats.
    Append(AppendEntriesRequest<TypeConfig>),
    /// Elections.
    Vote(VoteRequest<u64>),
    /// A snapshot chunk.
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

/// A Raft reply on the wire.
#[derive(Serialize, Deserialize)]
pub enum RaftReply {
    /// To `Append`.
    Append(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    /// To `Vote`.
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    /// To `Snapshot`.
    Snapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
}

/// When each peer last answered a Raft RPC: the leader's view of health.
pub type Heard = Arc<Mutex<HashMap<u64, Instant>>>;

/// Makes one [`TcpNetwork`] per peer.
pub struct TcpNetworkFactory {
    pub(crate) local: u64,
    pub(crate) heard: Heard,
    pub(crate) tls: Option<ClusterTls>,
}

impl RaftNetworkFactory<TypeConfig> for TcpNetworkFactory {
    type Network = TcpNetwork;

    async fn new_client(&mut self, target: u64, node: &NodeInfo) -> TcpNetwork {
        TcpNetwork {
            local: self.local,
            target,
            addr: node.cluster_addr.clone(),
            conn: None,
            heard: self.heard.clone(),
            tls: self.tls.clone(),
        }
    }
}

/// The connection to one peer, re-opened after any error.
pub struct TcpNetwork {
    local: u64,
    target: u64,
    addr: String,
    conn: Option<NodeStream>,
    heard: Heard,
    tls: Option<ClusterTls>,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<u64, NodeInfo, RaftError<u64, E>>;

impl TcpNetwork {
    async fn call(&mut self, req: &RaftRequest, ttl: Duration) -> Result<RaftReply, io::Error> {
        let local = self.local;
        let addr = self.addr.clone();
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => {
                let mut c = tls::connect(&addr, self.tls.as_ref(), ttl).await?;
                frame::write(
                    &mut c,
                    &Hello {
                        kind: Kind::Raft,
                        from: local,
                    },
                )
                .await?;
                c
            }
        };
        let reply = timeout(ttl, async {
            frame::write(&mut conn, req).await?;
            frame::read::<_, RaftReply>(&mut conn, LARGE_FRAME).await
        })
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "raft rpc timed out"))??;
        // Only a connection that answered in full is reused.
        self.conn = Some(conn);
        // A stopped Raft node answers with errors: that is not health.
        let ok = match &reply {
            RaftReply::Append(r) => r.is_ok(),
            RaftReply::Vote(r) => r.is_ok(),
            RaftReply::Snapshot(r) => r.is_ok(),
        };
        if ok {
            if let Ok(mut h) = self.heard.lock() {
                h.insert(self.target, Instant::now());
            }
        }
        Ok(reply)
    }

    fn io_error<E: std::error::Error>(&self, e: io::Error) -> RPCError<u64, NodeInfo, E> {
        if e.kind() == io::ErrorKind::ConnectionRefused || e.kind() == io::ErrorKind::TimedOut {
            RPCError::Unreachable(Unreachable::new(&e))
        } else {
            RPCError::Network(NetworkError::new(&e))
        }
    }
}

fn mismatch<E: std::error::Error>() -> RPCError<u64, NodeInfo, E> {
    let e = io::Error::new(io::ErrorKind::InvalidData, "raft reply of the wrong kind");
    RPCError::Network(NetworkError::new(&e))
}

impl RaftNetwork<TypeConfig> for TcpNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcErr> {
        match self
            .call(&RaftRequest::Append(rpc), option.hard_ttl())
            .await
        {
            Ok(RaftReply::Append(Ok(r))) => Ok(r),
            Ok(RaftReply::Append(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(mismatch()),
            Err(e) => Err(self.io_error(e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RpcErr<InstallSnapshotError>> {
        match self
            .call(&RaftRequest::Snapshot(rpc), option.hard_ttl())
            .await
        {
            Ok(RaftReply::Snapshot(Ok(r))) => Ok(r),
            Ok(RaftReply::Snapshot(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(mismatch()),
            Err(e) => Err(self.io_error(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RpcErr> {
        match self.call(&RaftRequest::Vote(rpc), option.hard_ttl()).await {
            Ok(RaftReply::Vote(Ok(r))) => Ok(r),
            Ok(RaftReply::Vote(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(mismatch()),
            Err(e) => Err(self.io_error(e)),
        }
    }
}

/// Answer one Raft request with the local node.
pub async fn serve(raft: &crate::types::Raft, req: RaftRequest) -> RaftReply {
    match req {
        RaftRequest::Append(r) => RaftReply::Append(raft.append_entries(r).await),
        RaftRequest::Vote(r) => RaftReply::Vote(raft.vote(r).await),
        RaftRequest::Snapshot(r) => RaftReply::Snapshot(raft.install_snapshot(r).await),
    }
}

//! Cluster settings (`[cluster]`, `--node-id`, `--cluster-listen`,
//! `--join`), the cluster node started beside the broker, and the
//! `zerofan cluster status|remove` commands.

use crate::config::{Config, ConfigError};
use clap::Subcommand;
use serde::Deserialize;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use zerofan_cluster::{Cluster, ClusterConfig, ClusterStatus, ClusterTls};

/// `[cluster] tls = { cert, key, ca }`: PEM files of this node's
/// certificate chain and key, and of the cluster's CA.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterTlsFiles {
    /// This node's certificate chain, its own first.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The cluster CA: every peer's certificate must chain to it.
    pub ca: PathBuf,
}

impl ClusterTlsFiles {
    /// Read and check the files (a readable error names the file).
    pub fn load(&self) -> Result<ClusterTls, String> {
        ClusterTls::load(&self.cert, &self.key, &self.ca).map_err(|e| e.to_string())
    }
}

/// The `[cluster]` table.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// This node's id: unique in the cluster, from 1 to [`MAX_NODE_ID`].
    #[serde(default)]
    pub node_id: u64,
    /// Address of the node-to-node listener (Raft, admin, links).
    pub listen: Option<SocketAddr>,
    /// A member to join through when the data dir holds no cluster state
    /// yet; a node restarted with its data dir rejoins without it.
    pub join: Option<SocketAddr>,
    /// Accept cluster traffic from non-loopback peers without TLS.
    #[serde(default)]
    pub insecure: bool,
    /// Copies of replicated session state (used by session replication).
    #[serde(default = "default_replicas")]
    pub replicas: usize,
    /// MQTT address other nodes give clients in server references; the
    /// first `listen` address when unset.
    pub advertise: Option<SocketAddr>,
    /// Mutual TLS for all node-to-node traffic.
    pub tls: Option<ClusterTlsFiles>,
    /// The address other nodes dial for this node's cluster listener, when
    /// it is not `listen` (a proxy or NAT in between).
    pub advertise_cluster: Option<SocketAddr>,
    /// Milliseconds this node serves the client ids it owns without
    /// hearing from a majority; then it drops them (see `zerofan_cluster`'s
    /// leases). Another node may take them over `lease_ms · 9/8 + 100` ms
    /// after this node was last heard from.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// Most copies of other nodes' persistent sessions this node keeps;
    /// a new one past it is refused (counted). Raise it with the number
    /// of persistent sessions the cluster holds.
    #[serde(default = "default_max_replica_sessions")]
    pub max_replica_sessions: usize,
    /// Most message bytes (topic and payload) those copies hold; a
    /// message past it is refused (counted), so that copy lacks it. Raise
    /// it with the offline backlog the cluster's sessions may hold.
    #[serde(default = "default_max_replica_bytes")]
    pub max_replica_bytes: usize,
}

fn default_max_replica_sessions() -> usize {
    crate::core::REPLICA_MAX_SESSIONS
}

fn default_max_replica_bytes() -> usize {
    crate::core::REPLICA_MAX_BYTES
}

fn default_lease_ms() -> u64 {
    zerofan_cluster::DEFAULT_LEASE.as_millis() as u64
}

fn default_replicas() -> usize {
    3
}

impl ClusterSettings {
    /// Settings with only a node id; flags fill in the rest.
    pub fn empty() -> ClusterSettings {
        ClusterSettings {
            node_id: 0,
            listen: None,
            join: None,
            insecure: false,
            replicas: default_replicas(),
            advertise: None,
            tls: None,
            lease_ms: default_lease_ms(),
            advertise_cluster: None,
            max_replica_sessions: default_max_replica_sessions(),
            max_replica_bytes: default_max_replica_bytes(),
        }
    }

    /// Check the settings (the data dir is checked once flags are merged).
    pub fn check(&self) -> Result<(), ConfigError> {
        let bad = |key, why| Err(ConfigError::Invalid { key, why });
        // Links name nodes in 16 bits where a message lists them (the
        // away nodes it is stranded for, see `core::strand`).
        if self.node_id == 0 || self.node_id > MAX_NODE_ID {
            return bad("cluster.node_id", "must be from 1 to 65535 (--node-id N)");
        }
        if self.listen.is_none() {
            if self.join.is_some() {
                return bad(
                    "cluster.join",
                    "needs cluster.listen (--cluster-listen ADDR): the cluster must reach this node",
                );
            }
            return bad("cluster.listen", "is needed (--cluster-listen ADDR)");
        }
        if self.listen.is_some_and(|a| a.ip().is_unspecified()) {
            return bad(
                "cluster.listen",
                "must be a specific address other nodes can reach, not 0.0.0.0 or ::",
            );
        }
        if self.replicas == 0 {
            return bad("cluster.replicas", "must be at least 1");
        }
        if self.max_replica_sessions == 0 {
            return bad("cluster.max_replica_sessions", "must be at least 1");
        }
        if self.max_replica_bytes < 1 << 20 {
            return bad(
                "cluster.max_replica_bytes",
                "must be at least 1048576 (1 MiB)",
            );
        }
        if Duration::from_millis(self.lease_ms) < zerofan_cluster::MIN_LEASE {
            return bad(
                "cluster.lease_ms",
                "must be at least 1000 (above the Raft election timeout)",
            );
        }
        Ok(())
    }
}

/// The highest node id.
pub const MAX_NODE_ID: u64 = 65_535;

/// Check the `[cluster]` table of a fully merged `config` (flags and
/// defaults applied).
pub fn check(config: &Config) -> Result<(), ConfigError> {
    let Some(c) = &config.cluster else {
        return Ok(());
    };
    c.check()?;
    if config.memory || config.data_dir.is_none() {
        return Err(ConfigError::Invalid {
            key: "cluster",
            why: "needs a data dir (--data-dir), not --memory: the node's Raft log is kept on disk",
        });
    }
    Ok(())
}

/// Start the cluster node on a thread of its own (its fsyncs must not stall
/// the broker's event loop) and wait until it has started, joined or
/// rejoined.
pub async fn start(config: &Config) -> io::Result<Option<Arc<Cluster>>> {
    let Some(s) = &config.cluster else {
        return Ok(None);
    };
    let (Some(listen), Some(data_dir)) = (s.listen, config.data_dir.clone()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cluster needs a listen address and a data dir",
        ));
    };
    let cfg = ClusterConfig {
        node_id: s.node_id,
        listen,
        join: s.join,
        data_dir,
        advertise: s
            .advertise
            .or_else(|| config.listen.first().copied().filter(|a| a.port() != 0)),
        insecure: s.insecure,
        tls: match &s.tls {
            Some(files) => Some(
                files
                    .load()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            ),
            None => None,
        },
        lease: Duration::from_millis(s.lease_ms),
        advertise_cluster: s.advertise_cluster,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("zerofan-cluster".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            rt.block_on(async move {
                match Cluster::start(cfg).await {
                    Ok(c) => {
                        let c = Arc::new(c);
                        let _ = tx.send(Ok(c.clone()));
                        // The runtime serves the node for the life of the
                        // process.
                        std::future::pending::<()>().await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                    }
                }
            });
        })?;
    match rx.await {
        Ok(Ok(c)) => {
            println!("zerofan cluster node {} on {}", c.node_id(), c.local_addr());
            Ok(Some(c))
        }
        Ok(Err(e)) => Err(io::Error::other(e)),
        Err(_) => Err(io::Error::other("the cluster thread stopped")),
    }
}

/// The CLI's certificate for a cluster with mutual TLS: the three flags
/// name the same kind of files as `[cluster] tls` (a node's own will do).
#[derive(clap::Args, Debug, Default)]
pub struct TlsFlags {
    /// PEM certificate signed by the cluster CA.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// Its PEM private key.
    #[arg(long, value_name = "FILE", requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<PathBuf>,
    /// The cluster CA (PEM).
    #[arg(long, value_name = "FILE", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
}

impl TlsFlags {
    fn load(&self) -> Result<Option<ClusterTls>, zerofan_cluster::ClusterError> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => ClusterTls::load(cert, key, ca).map(Some),
            (None, None, None) => Ok(None),
            _ => Err(zerofan_cluster::ClusterError::Config(
                "--tls-cert, --tls-key and --tls-ca go together".into(),
            )),
        }
    }
}

/// `zerofan cluster ...`
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Members, their roles and health, the leader and its term.
    Status {
        /// Cluster listener of any member, e.g. 127.0.0.1:7101.
        #[arg(long, value_name = "ADDR")]
        connect: String,
        /// One JSON object (`members` holds one object per node).
        #[arg(long)]
        json: bool,
        /// This command's certificate, for a cluster with mutual TLS.
        #[command(flatten)]
        tls: TlsFlags,
    },
    /// Remove a node from the cluster. A live node first sends its clients
    /// to another member (MQTT 5: DISCONNECT 0x9D Server moved with a
    /// Server Reference) and waits until their sessions moved there, at
    /// most --drain-timeout.
    Remove {
        /// Cluster listener of any member, e.g. 127.0.0.1:7101.
        #[arg(long, value_name = "ADDR")]
        connect: String,
        /// Node id to remove.
        node_id: u64,
        /// Seconds the node may take to hand its sessions over before it
        /// is removed anyway (at most 600).
        #[arg(long, value_name = "SECS", default_value_t = 30)]
        drain_timeout: u64,
        /// This command's certificate, for a cluster with mutual TLS.
        #[command(flatten)]
        tls: TlsFlags,
    },
}

fn print_table(s: &ClusterStatus) {
    let leader = s.leader_id.map_or("none".to_string(), |l| l.to_string());
    println!(
        "leader {leader}, term {}, last applied {}, leader changes {}, answered by node {}",
        s.term,
        s.last_applied.map_or("-".into(), |i| i.to_string()),
        s.leader_changes,
        s.answered_by
    );
    println!(
        "{:<6} {:<9} {:<8} {:<22} {:<22} LAG",
        "NODE", "ROLE", "HEALTHY", "CLUSTER ADDR", "MQTT ADDR"
    );
    for m in &s.members {
        println!(
            "{:<6} {:<9} {:<8} {:<22} {:<22} {}",
            m.node_id,
            m.role,
            if m.healthy { "yes" } else { "no" },
            m.cluster_addr,
            m.mqtt_addr.as_deref().unwrap_or("-"),
            m.lag.map_or("-".into(), |l| l.to_string())
        );
    }
}

fn print_removed(r: &zerofan_cluster::RemoveReport) {
    let to = match (r.target, &r.reference) {
        (Some(t), Some(a)) => format!("node {t} ({a})"),
        (Some(t), None) => format!("node {t}"),
        _ => "no member".into(),
    };
    match &r.drain {
        Some(d) => {
            println!(
                "node {} drained: {} clients sent to {to}, {} sessions moved",
                r.node_id, d.clients_told, d.sessions_moved
            );
            if d.sessions_left > 0 {
                println!(
                    "{} sessions without a client: {} client ids handed to {to}, which \
                     serves them from its copies",
                    d.sessions_left, r.sessions_handed
                );
            }
        }
        None => println!("node {} not drained", r.node_id),
    }
    if let Some(note) = &r.note {
        println!("{note}");
    }
    println!("node {} removed", r.node_id);
}

/// Run a `zerofan cluster` subcommand.
pub fn run(cmd: &ClusterCommand) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("zerofan: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match cmd {
            ClusterCommand::Status { connect, json, tls } => {
                let tls = tls.load()?;
                let s = zerofan_cluster::admin::status(connect, tls.as_ref()).await?;
                if *json {
                    match serde_json::to_string_pretty(&s) {
                        Ok(j) => println!("{j}"),
                        Err(e) => {
                            return Err(zerofan_cluster::ClusterError::Refused(e.to_string()))
                        }
                    }
                } else {
                    print_table(&s);
                }
                Ok(())
            }
            ClusterCommand::Remove {
                connect,
                node_id,
                drain_timeout,
                tls,
            } => {
                let tls = tls.load()?;
                let drain = Duration::from_secs(*drain_timeout);
                let r =
                    zerofan_cluster::admin::remove(connect, *node_id, drain, tls.as_ref()).await?;
                print_removed(&r);
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zerofan: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_table_is_read_and_checked() {
        let text = "data_dir = \"d1\"\n[cluster]\nnode_id = 2\nlisten = \"127.0.0.1:7102\"\n\
                    join = \"127.0.0.1:7101\"\ninsecure = true\n";
        let c = Config::from_toml(text, "t.toml").unwrap();
        let s = c.cluster.clone().unwrap();
        assert_eq!(s.node_id, 2);
        assert_eq!(s.join, Some("127.0.0.1:7101".parse().unwrap()));
        assert!(s.insecure);
        assert_eq!(s.replicas, 3, "three copies unless told");
        assert!(check(&c).is_ok());

        let bad = |text: &str| Config::from_toml(text, "t.toml").unwrap_err().to_string();
        let e = bad("[cluster]\nnode_id = 0\nlisten = \"127.0.0.1:7101\"\n");
        assert!(e.contains("cluster.node_id"), "{e}");
        let e = bad("[cluster]\nnode_id = 65536\nlisten = \"127.0.0.1:7101\"\n");
        assert!(e.contains("from 1 to 65535"), "{e}");
        assert!(Config::from_toml(
            "[cluster]\nnode_id = 65535\nlisten = \"127.0.0.1:7101\"\n",
            "t"
        )
        .is_ok());
        let e = bad("[cluster]\nnode_id = 1\njoin = \"127.0.0.1:7101\"\n");
        assert!(
            e.contains("cluster.join") && e.contains("cluster.listen"),
            "{e}"
        );
        let e = bad("[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:7101\"\nreplicas = 0\n");
        assert!(e.contains("cluster.replicas"), "{e}");
        let e = bad("[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:7101\"\nlease_ms = 500\n");
        assert!(e.contains("cluster.lease_ms"), "{e}");
        assert_eq!(s.lease_ms, 2500, "a 2.5 s lease unless told");
        assert_eq!(s.max_replica_sessions, 100_000);
        assert_eq!(s.max_replica_bytes, 256 << 20);
        let c = Config::from_toml(
            "[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:7101\"\n\
             max_replica_sessions = 7\nmax_replica_bytes = 1073741824\n",
            "t",
        )
        .unwrap();
        let s2 = c.cluster.unwrap();
        assert_eq!(
            (s2.max_replica_sessions, s2.max_replica_bytes),
            (7, 1 << 30)
        );
        let e =
            bad("[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:7101\"\nmax_replica_sessions = 0\n");
        assert!(e.contains("cluster.max_replica_sessions"), "{e}");
        let e =
            bad("[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:7101\"\nmax_replica_bytes = 1000\n");
        assert!(
            e.contains("cluster.max_replica_bytes") && e.contains("1 MiB"),
            "{e}"
        );
        let e = bad("[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:7101\"\nleader = 1\n");
        assert!(e.contains("unknown field"), "{e}");

        let mut memory =
            Config::from_toml("[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:7101\"\n", "t")
                .unwrap();
        memory.memory = true;
        let e = check(&memory).unwrap_err().to_string();
        assert!(e.contains("--memory"), "{e}");
    }
}

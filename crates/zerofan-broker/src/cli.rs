//! The `zerofan` command line.

use crate::config::Config;
use clap::{ArgAction, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// zerofan: an MQTT 3.1 / 3.1.1 / 5.0 broker whose data path never copies a
/// payload per subscriber.
///
/// Start it with no arguments to serve MQTT over TCP on 127.0.0.1:1883.
/// Every setting can also go in a TOML file (--config); command-line flags
/// win over the file. The broker prints `zerofan listening on ADDR` for each
/// listener once it accepts connections, and stops cleanly on Ctrl-C or
/// SIGTERM (MQTT 5 clients are told "server shutting down").
#[derive(Parser, Debug)]
#[command(name = "zerofan", version, verbatim_doc_comment)]
#[command(
    after_help = "Config file keys (all optional): listen, max_keepalive, max_packet_size, \
receive_maximum, max_inflight, max_queued_messages, max_queued_bytes \
(offline sessions), max_online_queued_bytes, slow_consumer_timeout_ms, queue_full \
(drop_oldest | drop_new | disconnect), max_session_expiry, sys_interval, topic_alias_maximum, \
retain_available, connect_timeout, max_topic_levels, pool_max_retained_bytes, busy_poll_us, \
park_after_ms, max_subscriptions_per_session, max_retained_messages, max_retained_bytes, \
listen_backlog, threads, http (alias metrics), http_tls, http_tokens_file, http_allow_anonymous, \
[[webhook]] tables (url, events, topics, include_payload, headers, timeout_ms, queue_size, \
queue_full, batch_size), log_format, log_dest (stderr | stdout | syslog | none | \"file PATH\"), pid_file, data_dir, memory, fsync (always | interval[:MS] | never), password_file, acl_file, \
allow_anonymous, max_connections, max_topic_length, max_publish_rate, max_publish_bytes_rate, \
max_connection_rate, and [[listener]] tables (bind, protocol = mqtt | websockets, tls = { cert, key, \
ca, require_certificate, use_identity_as_username }, allow_anonymous, proxy_protocol, \
max_connections, password_file, acl_file). A mosquitto.conf is read too (-c mosquitto.conf).\n\n\
User management: zerofan passwd [-c] [-D] [-b PASSWORD] [--scram-sha-256] FILE USER.\n\nSIGHUP reloads the config file (limits), password files and ACLs without dropping \
connections, and reopens log files; a bad file keeps the settings in force and logs why; \
settings read only at start keep their value and are named in a warning.\n\nExample:\n  zerofan --listen 0.0.0.0:1883 --config zerofan.toml -v"
)]
pub struct Args {
    /// Address to accept MQTT connections on, e.g. 0.0.0.0:1883. Repeat for
    /// several; port 0 picks a free port (printed at startup).
    /// [default: 127.0.0.1:1883]
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<SocketAddr>,
    /// Settings file: TOML (see the keys below), or a mosquitto
    /// configuration (name ending in .conf, or not TOML).
    #[arg(short = 'c', long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Check the configuration (and every file it names: password file,
    /// ACL, certificates) and exit: 0 with "configuration OK", or 1 with
    /// what is wrong, naming the file and line.
    #[arg(long)]
    pub test_config: bool,
    /// A subcommand instead of running the broker.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Keep sessions, queues and retained messages in memory only: nothing
    /// survives a restart (the default keeps them in ./zerofan-data).
    #[arg(long, conflicts_with = "data_dir")]
    pub memory: bool,
    /// Directory of the embedded store (sessions, queues, retained
    /// messages). [default: ./zerofan-data; `data_dir` in the config file]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Shards (threads) to run, each with its own event loop; 1 is the
    /// single-thread broker. [default: 0 = one per available core (one on
    /// a cluster node); `threads` in the config file]
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// More logging on stderr: -v info, -vv debug, -vvv trace. RUST_LOG
    /// overrides.
    #[arg(short, long, action = ArgAction::Count)]
    pub verbose: u8,
    /// Serve HTTP on ADDR, e.g. 127.0.0.1:9234: Prometheus /metrics,
    /// /healthz, /readyz, the /api/v1/ API and the dashboard at /.
    /// --metrics is the same. Off by default.
    #[arg(long = "http", alias = "metrics", value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// This node's id in a cluster (1 to 65535). [`cluster.node_id`]
    #[arg(long, value_name = "N")]
    pub node_id: Option<u64>,
    /// Listen for other cluster nodes (and `zerofan cluster`) on ADDR, e.g.
    /// 127.0.0.1:7101. [`cluster.listen`]
    #[arg(long, value_name = "ADDR")]
    pub cluster_listen: Option<SocketAddr>,
    /// Join the cluster of the node whose cluster listener is ADDR (only
    /// when the data dir holds no cluster state yet). [`cluster.join`]
    #[arg(long, value_name = "ADDR")]
    pub join: Option<SocketAddr>,
    /// The address other nodes dial to reach this node's cluster listener,
    /// when not the listener's own (a proxy in between).
    /// [`cluster.advertise_cluster`]
    #[arg(long, value_name = "ADDR")]
    pub cluster_advertise: Option<SocketAddr>,
    /// Log format on stderr: text (readable) or json (one object a line).
    /// [default: text]
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<crate::logging::LogFormat>,
}

/// Subcommands of `zerofan`.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Add, change (-b PASSWORD, or prompted) or delete (-D) a user in a
    /// mosquitto password file; -c creates the file.
    Passwd(crate::passwd_cmd::PasswdArgs),
    /// Ask a running cluster: `status --connect ADDR [--json]`,
    /// `remove --connect ADDR NODE_ID`.
    #[command(subcommand)]
    Cluster(crate::cluster::ClusterCommand),
}

impl Args {
    /// The configuration these arguments describe.
    pub fn config(&self) -> Result<Config, crate::config::ConfigError> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        if !self.listen.is_empty() {
            config.listen = self.listen.clone();
        }
        if self.http.is_some() {
            config.http = self.http;
        }
        if let Some(n) = self.threads {
            config.threads = n;
        }
        if let Some(format) = self.log_format {
            config.log_format = format;
        }
        if self.memory {
            config.memory = true;
        }
        if let Some(dir) = &self.data_dir {
            config.data_dir = Some(dir.clone());
            config.memory = false;
        }
        // Durable by default.
        if !config.memory && config.data_dir.is_none() {
            config.data_dir = Some(PathBuf::from("zerofan-data"));
        }
        if self.node_id.is_some()
            || self.cluster_listen.is_some()
            || self.join.is_some()
            || self.cluster_advertise.is_some()
        {
            let c = config
                .cluster
                .get_or_insert_with(crate::cluster::ClusterSettings::empty);
            if let Some(n) = self.node_id {
                c.node_id = n;
            }
            if self.cluster_listen.is_some() {
                c.listen = self.cluster_listen;
            }
            if self.join.is_some() {
                c.join = self.join;
            }
            if self.cluster_advertise.is_some() {
                c.advertise_cluster = self.cluster_advertise;
            }
        }
        crate::cluster::check(&config)?;
        Ok(config)
    }
}

/// `--test-config`: load the configuration and every file it names.
fn test_config(args: &Args) -> ExitCode {
    let result = args.config().map_err(|e| e.to_string()).and_then(|c| {
        crate::bridge::prepare(&c.bridge)?;
        if let Some(tls) = c.cluster.as_ref().and_then(|c| c.tls.as_ref()) {
            tls.load()?;
        }
        crate::security::load(&c).map_err(|e| e.to_string())
    });
    match result {
        Ok(_) => {
            println!("configuration OK");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("zerofan: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Entry point of the `zerofan` binary.
pub fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Passwd(p)) = &args.command {
        return crate::passwd_cmd::run(p);
    }
    if let Some(Command::Cluster(c)) = &args.command {
        return crate::cluster::run(c);
    }
    if args.test_config {
        return test_config(&args);
    }
    let config = match args.config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("zerofan: {e}");
            return ExitCode::from(2);
        }
    };
    // validate() has parsed every entry already; none is skipped here.
    let dests: Vec<crate::logging::LogDest> = config
        .log_dest
        .iter()
        .filter_map(|d| d.parse().ok())
        .collect();
    if let Err(e) = crate::logging::init(args.verbose, config.log_format, &dests) {
        eprintln!("zerofan: {e}");
        return ExitCode::from(2);
    }
    // SIGHUP reads the file and the flags again.
    let reloader = Box::new(move || args.config().map_err(|e| e.to_string()));
    match crate::shell::run_until_signal_with(config, Some(reloader)) {
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
    use clap::CommandFactory;

    #[test]
    fn threads_default_to_the_cores_and_to_one_on_a_cluster_node() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let plain = Args::try_parse_from(["zerofan", "--memory"]).unwrap();
        assert_eq!(plain.config().unwrap().shard_count(), cores);
        let one = Args::try_parse_from(["zerofan", "--memory", "--threads", "1"]).unwrap();
        assert_eq!(one.config().unwrap().shard_count(), 1);
        let dir = std::env::temp_dir().join(format!("zerofan-cli-{}", std::process::id()));
        let node = Args::try_parse_from([
            "zerofan",
            "--data-dir",
            dir.to_str().unwrap(),
            "--node-id",
            "1",
            "--cluster-listen",
            "127.0.0.1:0",
        ])
        .unwrap();
        assert_eq!(node.config().unwrap().shard_count(), 1);
    }

    #[test]
    fn help_names_the_threads_default() {
        let help = Args::command().render_long_help().to_string();
        let at = help.find("--threads").unwrap();
        let text: String = help[at..].chars().take(400).collect();
        assert!(text.contains("one per available core"), "{text}");
        assert!(!text.contains("default: 1"), "{text}");
    }
}

//! The `zerofan` command line.

use crate::config::Config;
use clap::{ArgAction, Parser};
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
receive_maximum, max_inflight, max_queued_messages, max_queued_bytes, queue_full \
(drop_oldest | drop_new | disconnect), max_session_expiry, sys_interval, topic_alias_maximum, \
retain_available, connect_timeout, max_topic_levels, pool_max_retained_bytes, metrics, \
log_format.\n\nSIGHUP reloads the config file (limits) without dropping connections; a bad \
file keeps the settings in force and logs why.\n\nExample:\n  zerofan --listen 0.0.0.0:1883 --config zerofan.toml -v"
)]
pub struct Args {
    /// Address to accept MQTT connections on, e.g. 0.0.0.0:1883. Repeat for
    /// several; port 0 picks a free port (printed at startup).
    /// [default: 127.0.0.1:1883]
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<SocketAddr>,
    /// TOML file with settings (see the keys below).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Keep sessions and retained messages in memory only (the only mode
    /// for now: nothing survives a restart).
    #[arg(long)]
    pub memory: bool,
    /// Directory for persistent data. Not implemented yet: accepted and
    /// ignored (the broker runs in memory).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// More logging on stderr: -v info, -vv debug, -vvv trace. RUST_LOG
    /// overrides.
    #[arg(short, long, action = ArgAction::Count)]
    pub verbose: u8,
    /// Serve Prometheus metrics on http://ADDR/metrics (and /healthz,
    /// /readyz), e.g. 127.0.0.1:9234. Off by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Log format on stderr: text (readable) or json (one object a line).
    /// [default: text]
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<crate::logging::LogFormat>,
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
        if self.metrics.is_some() {
            config.metrics = self.metrics;
        }
        if let Some(format) = self.log_format {
            config.log_format = format;
        }
        Ok(config)
    }
}

/// Entry point of the `zerofan` binary.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let config = match args.config() {
        Ok(c) => c,
        Err(e) => {
            crate::logging::init(args.verbose, args.log_format.unwrap_or_default());
            eprintln!("zerofan: {e}");
            return ExitCode::from(2);
        }
    };
    crate::logging::init(args.verbose, config.log_format);
    if let Some(dir) = &args.data_dir {
        eprintln!(
            "zerofan: note: --data-dir {} ignored: persistence is not implemented yet, running in memory",
            dir.display()
        );
    }
    match crate::shell::run_until_signal(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zerofan: {e}");
            ExitCode::FAILURE
        }
    }
}

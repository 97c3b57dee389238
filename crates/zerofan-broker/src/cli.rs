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
retain_available, connect_timeout, max_topic_levels, pool_max_retained_bytes.\n\nExample:\n  zerofan --listen 0.0.0.0:1883 --config zerofan.toml -v"
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
        Ok(config)
    }
}

/// Entry point of the `zerofan` binary.
pub fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.verbose);
    let config = match args.config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("zerofan: {e}");
            return ExitCode::from(2);
        }
    };
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

fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

//! Logging through `tracing`: readable text by default, one JSON object per
//! line with `--log-format json` (or `log_format = "json"`), on stderr.

use serde::Deserialize;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

/// Install the global subscriber: `verbose` picks the level (0 warn, 1 info,
/// 2 debug, 3+ trace); `RUST_LOG` overrides. A second call does nothing.
pub fn init(verbose: u8, format: LogFormat) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // Colours only for a terminal: a log file gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
}

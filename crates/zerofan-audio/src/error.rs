//! Errors of this crate.

/// What went wrong opening or running a capture, or publishing it.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    /// No device matched the selector.
    #[error("audio device {wanted:?} not found; available: {available:?}")]
    DeviceNotFound {
        /// The selector.
        wanted: String,
        /// `id (name)` of every capture source found.
        available: Vec<String>,
    },
    /// The device does not offer the requested rate / channels / format.
    #[error("unsupported capture configuration: {0}")]
    Unsupported(String),
    /// A configuration value out of range (packet duration, channels...).
    #[error("invalid capture configuration: {0}")]
    InvalidConfig(String),
    /// The audio backend refused (cpal's error: its kind and message).
    #[error("audio backend error: {0}")]
    Backend(#[from] cpal::Error),
    /// Starting took too long (a hung sound server).
    #[error("audio device did not start within {0:?}")]
    StartTimeout(std::time::Duration),
    /// The capture thread could not be started or went away.
    #[error("capture thread failed: {0}")]
    Thread(String),
    /// Publishing through the MQTT client failed.
    #[cfg(feature = "mqtt")]
    #[error("publish failed: {0}")]
    Publish(#[from] zerofan_client::ClientError),
}

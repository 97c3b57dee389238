//! SIGHUP: read the configuration, the password files and the ACLs again
//! and put them in force without dropping a connection. Everything is read and validated first; only a
//! wholly valid configuration reaches the core, through one
//! [`Broker::reload`](crate::core::Broker::reload) call. A bad file keeps
//! the configuration in force and the error (file and line) is logged.

use super::state::Shared;
use crate::config::Config;
use std::time::Instant;

/// Produces the configuration to reload: the CLI re-reads `--config` and
/// applies its flags again.
pub type Reloader = Box<dyn Fn() -> Result<Config, String>>;

/// Reload on every SIGHUP.
#[cfg(unix)]
pub async fn sighup_loop(
    shared: std::rc::Rc<Shared>,
    mut hangup: tokio::signal::unix::Signal,
    reloader: Option<std::rc::Rc<Reloader>>,
) {
    while hangup.recv().await.is_some() {
        crate::sd_notify::notify("RELOADING=1");
        // logrotate moved the log files away before sending SIGHUP.
        for error in crate::logging::reopen() {
            tracing::error!(%error, "log file kept");
        }
        match &reloader {
            Some(r) => {
                reload_all(&shared, r.as_ref()());
            }
            None => tracing::warn!("SIGHUP: no configuration source to reload from"),
        }
        // A failed reload leaves the broker serving as before: ready too.
        crate::sd_notify::notify("READY=1");
    }
}

/// Put `config` in force here, and when it took effect, on every other
/// shard too (SIGHUP, `POST /api/v1/reload`). True when it took effect.
pub fn reload_all(shared: &Shared, config: Result<Config, String>) -> bool {
    let copy = config.as_ref().ok().cloned();
    let done = reload_now(shared, config);
    if done {
        if let (Some(mesh), Some(config)) = (&shared.mesh, copy) {
            mesh.reload_others(config);
        }
    }
    done
}

/// Put `config` in force (or log why not); true when it took effect.
pub fn reload_now(shared: &Shared, config: Result<Config, String>) -> bool {
    let result = config.and_then(|config| {
        shared
            .broker
            .borrow_mut()
            .reload(Instant::now(), config, |effective| {
                // The password files and ACLs, read and parsed in full
                // before anything changes (errors name the file and line).
                if let Some(p) = &effective.http_tokens_file {
                    super::api::auth::read_tokens(p)?;
                }
                crate::security::load(effective)
                    .map(|loaded| Some(loaded.core))
                    .map_err(|e| e.to_string())
            })
    });
    shared.dispatch();
    match result {
        Ok(outcome) => {
            super::api::reload_auth(shared);
            shared.ops.reloads_ok.set(shared.ops.reloads_ok.get() + 1);
            tracing::info!(
                changed = ?outcome.changed,
                "configuration reloaded"
            );
            if !outcome.needs_restart.is_empty() {
                // Names each setting with the value still in force, which
                // is also what the broker keeps reporting.
                tracing::warn!(
                    settings = ?outcome.needs_restart,
                    "reload: these settings changed but take effect only after a restart; in force: {}",
                    outcome.kept.join(", ")
                );
            }
            true
        }
        Err(error) => {
            shared
                .ops
                .reloads_failed
                .set(shared.ops.reloads_failed.get() + 1);
            tracing::error!(%error, "reload failed: the configuration in force is kept");
            false
        }
    }
}

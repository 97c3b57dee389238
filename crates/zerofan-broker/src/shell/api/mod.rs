//! The HTTP API (`/api/v1/`), its bearer-token auth, and the dashboard
//! page, served by `shell::http`.

pub mod admin;
pub mod auth;
pub mod routes;

/// The dashboard page, served at `/` (no other file, no CDN).
pub const DASHBOARD: &str = include_str!("dashboard.html");

use super::state::Shared;

/// After a reload took effect: the tokens and anonymous rule in force
/// follow the configuration now in force. (A tokens file that cannot be
/// read refused the reload before, see `reload::reload_now`; should it
/// change in between, the tokens in force stay and the error is logged.)
pub fn reload_auth(shared: &Shared) {
    let loopback = shared.ops.http_loopback.get();
    let b = shared.broker.borrow();
    if let Err(e) = shared.ops.api_auth.borrow_mut().apply(b.config(), loopback) {
        tracing::error!(error = %e, "http tokens kept");
    }
}

//! zerofan-auth: authentication and access control for the zerofan broker,
//! compatible with mosquitto's files, in sans-IO style.
//!
//! Pure functions and data: no sockets, no async, no clock, no file reads.
//! The broker reads files, passes their text in, and passes the time in.
//!
//! - [`passwd`]: mosquitto password files ([`PasswordFile`]): `$7$`
//!   PBKDF2-SHA512 and `$6$` SHA-512 entries as `mosquitto_passwd` writes
//!   them; verify a login in constant time; add, change and remove users
//!   and write the file back.
//! - [`acl`]: mosquitto `acl_file` rules ([`Acl`]): `user`, `topic`,
//!   `pattern` with `%c` / `%u`, `deny`, the anonymous block, `$SYS`;
//!   decisions for PUBLISH, delivery and SUBSCRIBE.
//! - [`cache`]: [`cache::DecisionCache`], a bounded, expiring cache of
//!   decisions keyed by a hash of the request (HTTP authentication).
//! - [`conf`]: read a `mosquitto.conf` into a neutral [`MosqConfig`]
//!   (listeners with their options, global settings, warnings for what
//!   zerofan ignores) for the broker to map onto its own configuration.
//! - [`jwt`]: [`JwtVerifier`], tokens in the password field: HMAC, RSA,
//!   EC or Ed25519 keys (one PEM or a JWKS), expiry, username claim, ACL
//!   claim.
//! - [`scram`]: SCRAM-SHA-256/512 server exchanges (MQTT 5 enhanced
//!   authentication), SHA-512 straight from mosquitto `$7$` entries.
//! - [`throttle`]: [`FailureTracker`], bounded per-(address, username)
//!   memory of failed logins that tells how long the next attempt must wait.
//! - [`topic`]: topic-filter validation and matching with mosquitto's rules.
//! - [`ParseError`]: every parser's error, with its line number.
//!
//! # Wiring into the broker
//!
//! At start (and on reload): read the files, parse, keep the results.
//! `zerofan -c mosquitto.conf` goes through [`parse_mosquitto_conf_with`]
//! and [`MosqConfig::effective_listeners`]; each warning is logged once, and
//! a [`ParseError`] is what `--test-config` prints.
//!
//! Per CONNECT, in this order:
//!
//! 1. [`FailureTracker::delay`] for the peer address and username: non-zero
//!    means refuse (or hold) the attempt without checking the password.
//! 2. No username: allowed only if the listener's `allow_anonymous`.
//!    Username: [`PasswordFile::verify`]. A refusal is CONNACK 0x86 (bad
//!    username or password) / 0x87 (not authorized: anonymous refused) under
//!    MQTT 5, 0x04 / 0x05 under 3.1.1; then
//!    [`FailureTracker::record_failure`] (not for an anonymous refusal).
//!    Success:
//!    [`FailureTracker::record_success`].
//! 3. With `use_identity_as_username` the certificate's CN is the username
//!    and the password file is not consulted.
//!
//! Per message, with the client's id (the assigned one if assigned) and
//! username:
//!
//! - PUBLISH: [`Acl::check`] with [`Access::Write`]; refused means PUBACK /
//!   PUBREC 0x87 under MQTT 5, and the message is dropped (QoS 0 silently).
//!   Without an ACL file call [`check_dollar`] alone.
//! - SUBSCRIBE: [`Acl::check_subscribe`] per filter (without `$share/G/`);
//!   refused means SUBACK 0x87 (MQTT 5) / 0x80 (3.1.1) for that filter.
//! - Every delivery, retained messages and `$SYS` included:
//!   [`Acl::check`] with [`Access::Read`]; refused means not sent.
//!
//! ```
//! use std::time::Instant;
//! use zerofan_auth::{Access, Acl, FailureTracker, PasswordFile, ThrottleConfig};
//!
//! let mut passwd = PasswordFile::new();
//! passwd.set_with_iterations("alice", b"secret", 10).unwrap();
//! let passwd = PasswordFile::parse(&passwd.to_string()).unwrap();
//! let acl = Acl::parse("user alice\ntopic readwrite alice/#\n").unwrap();
//! let mut throttle = FailureTracker::new(ThrottleConfig::default());
//!
//! let peer = "192.0.2.1".parse().unwrap();
//! let now = Instant::now();
//! assert!(throttle.delay(peer, "alice", now).is_zero());
//! if passwd.verify("alice", b"secret") {
//!     throttle.record_success(peer, "alice");
//! } else {
//!     throttle.record_failure(peer, "alice", now);
//! }
//! assert!(acl.check("client-1", Some("alice"), "alice/temp", Access::Write));
//! assert!(acl.check_subscribe("client-1", Some("alice"), "#"));
//! assert!(!acl.check("client-1", Some("alice"), "bob/temp", Access::Read));
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod acl;
pub mod cache;
pub mod conf;
mod error;
pub mod jwt;
pub mod passwd;
pub mod scram;
pub mod throttle;
pub mod topic;

pub use acl::{check_dollar, Access, Acl};
pub use conf::{
    parse_mosquitto_conf, parse_mosquitto_conf_with, EffectiveListener, Listener, MosqConfig,
    Protocol, Security, Warning, WarningKind,
};
pub use error::ParseError;
pub use jwt::{JwtError, JwtLogin, JwtRefusal, JwtSettings, JwtVerifier, KeyMaterial};
pub use passwd::{PasswdError, PasswordFile, PasswordHash};
pub use throttle::{FailureTracker, ThrottleConfig};

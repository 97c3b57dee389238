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
//! - [`conf`]: read a `mosquitto.conf` into a neutral [`MosqConfig`]
//!   (listeners with their options, global settings, warnings for what
//!   zerofan ignores) for the broker to map onto its own configuration.
//! - [`throttle`]: [`FailureTracker`], bounded per-address memory of
//!   failed logins that tells how long the next attempt must wait.
//! - [`topic`]: topic-filter validation and matching with mosquitto's rules.
//! - [`ParseError`]: every parser's error, with its line number.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod acl;
pub mod conf;
mod error;
pub mod passwd;
pub mod throttle;
pub mod topic;

pub use acl::{check_dollar, Access, Acl};
pub use conf::{
    parse_mosquitto_conf, parse_mosquitto_conf_with, EffectiveListener, Listener, MosqConfig,
    Protocol, Security, Warning, WarningKind,
};
pub use error::ParseError;
pub use passwd::{PasswdError, PasswordFile, PasswordHash};
pub use throttle::{FailureTracker, ThrottleConfig};

//! zerofan-node: the Node.js face of zerofan, built with napi-rs.
//!
//! - [`client`]: `NativeClient`, the zerofan Rust client driven from
//!   JavaScript. Messages reach JavaScript in batches through an async pull
//!   (`nextBatch`); a batch's payloads are views into one external
//!   `ArrayBuffer` per pooled read buffer they arrived in (see [`payload`]).
//! - [`payload`]: turning a `Bytes` into an `ArrayBuffer` or `Buffer`
//!   without a copy, and the finalizer that gives the memory back to the
//!   pool.
//! - [`pool`]: the buffer pool the Node clients read into, its size and its
//!   statistics.
//! - [`audio`]: live audio capture (zerofan-audio) into external Buffers,
//!   and onto MQTT topics through a `NativeClient`.
//! - [`broker`]: the zerofan broker run inside the Node process
//!   (`zerofan_broker::embed`: its own thread and current-thread runtime).
//! - [`tls`]: rustls settings from MQTT.js-style options (`ca`,
//!   `servername`, `rejectUnauthorized`).
//! - [`loadgen`]: a native publisher for tests and benchmarks, so a load
//!   generator does not compete with the client under test for the
//!   JavaScript thread.
//!
//! The JavaScript layer (`index.js`) wraps these in an MQTT.js-shaped API.
#![deny(clippy::all)]

pub mod audio;
pub mod broker;
pub mod client;
pub mod loadgen;
pub mod payload;
pub mod pool;
pub mod tls;

use napi::{Error, Status};

/// A napi error from anything displayable.
pub(crate) fn js_err(e: impl std::fmt::Display) -> Error {
    Error::new(Status::GenericFailure, e.to_string())
}

/// A napi error for a bad argument.
pub(crate) fn arg_err(e: impl std::fmt::Display) -> Error {
    Error::new(Status::InvalidArg, e.to_string())
}

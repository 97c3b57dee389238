//! zerofan-node: placeholder while the binding is built.
#![deny(clippy::all)]

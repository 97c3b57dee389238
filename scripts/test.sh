#!/usr/bin/env bash
# The one test command: installs what the tests need (idempotent), then runs
# every test: formatting, clippy, the Rust unit and integration tests, and
# the interop tests that drive the real binary with third-party clients.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "== cargo test"
cargo test --workspace

#!/usr/bin/env bash
# CI smoke test of the load generator: builds zerofan and zerofan-bench,
# starts zerofan on a free loopback port, runs every scenario with tiny
# counts (`zerofan-bench smoke`, a few seconds) and fails on any error or
# lost message. Uses the caller's CARGO_TARGET_DIR and profile (debug by
# default; PROFILE=release for release builds).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-debug}
TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
flag=()
if [ "$PROFILE" = release ]; then flag=(--release); fi
cargo build -q "${flag[@]}" -p zerofan-bench -p zerofan-broker --bin zerofan-bench --bin zerofan
BIN=$TARGET_DIR/$PROFILE

# A free port: ask the kernel for one, then hand it to the broker.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 18999)
LOG=$(mktemp)
"$BIN/zerofan" --listen "127.0.0.1:$PORT" --memory >"$LOG" 2>&1 &
PID=$!
cleanup() {
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    rm -f "$LOG"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
    grep -q "zerofan listening on" "$LOG" && break
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "smoke.sh: zerofan exited at start:" >&2
        cat "$LOG" >&2
        exit 1
    fi
    sleep 0.1
done
timeout 300 "$BIN/zerofan-bench" smoke --port "$PORT" --broker-pid "$PID" --label zerofan
timeout 300 "$BIN/zerofan-bench" smoke --port "$PORT" --broker-pid "$PID" --label zerofan --protocol 5 \
    --only fan-in,fan-out,shared,qos1,qos2,ping-pong

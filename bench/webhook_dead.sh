#!/usr/bin/env bash
# Publishing with a dead webhook receiver against no webhook: zerofan-bench
# fan-in (10 publishers, QoS 0, 256 B) against a fresh release broker each
# run, alternating the two configurations REPEATS times. The webhook wants
# message.published (one event per message: the most work the event path
# can get) and points at a port where nothing listens. Prints msg/s per run
# and the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${REPEATS:-5}
DURATION=${DURATION:-3}
TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build -q --release -p zerofan-bench -p zerofan-broker --bin zerofan-bench --bin zerofan
BIN=$TARGET_DIR/release
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
DEAD=$(free_port)
printf '[[webhook]]\nurl = "http://127.0.0.1:%s/"\nevents = ["message.published"]\n' "$DEAD" >"$DIR/dead.toml"
: >"$DIR/none.toml"
run() {
    local conf=$1 port
    port=$(free_port)
    taskset -c 0 "$BIN/zerofan" --listen "127.0.0.1:$port" --memory --config "$conf" >/dev/null 2>&1 &
    local pid=$!
    for _ in $(seq 1 100); do
        (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.05
    done
    taskset -c 1 "$BIN/zerofan-bench" fan-in --port "$port" --duration "$DURATION" 2>/dev/null \
        | awk '$1 == "fan-in" { print $4 }'
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}
none=() dead=()
for i in $(seq 1 "$REPEATS"); do
    none+=("$(run "$DIR/none.toml")")
    dead+=("$(run "$DIR/dead.toml")")
    echo "run $i: no webhook ${none[-1]} msg/s, dead webhook ${dead[-1]} msg/s"
done
median() { printf '%s\n' "$@" | sort -h | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "median: no webhook $(median "${none[@]}") msg/s, dead webhook $(median "${dead[@]}") msg/s"

#!/usr/bin/env bash
# Publishing with a dead webhook receiver against no webhook: zerofan-bench
# fan-in (10 publishers, QoS 0, 256 B) against a fresh release broker each
# run, alternating the two configurations REPEATS times. The webhook wants
# message.published (one event per message: the most work the event path
# can get) and points at a port where nothing listens. Prints, per run and
# as medians, msg/s and the broker's CPU time per delivered message (from
# /proc/PID/stat: less sensitive than msg/s to other load on the machine).
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
# busy_poll_us = 0: the CPU time counted is work, not polling while idle.
printf 'busy_poll_us = 0\n' >"$DIR/none.toml"
printf 'busy_poll_us = 0\n[[webhook]]\nurl = "http://127.0.0.1:%s/"\nevents = ["message.published"]\n' "$DEAD" >"$DIR/dead.toml"
run() {
    local conf=$1 port
    port=$(free_port)
    taskset -c 0 "$BIN/zerofan" --listen "127.0.0.1:$port" --memory --config "$conf" >/dev/null 2>&1 &
    local pid=$!
    for _ in $(seq 1 100); do
        (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.05
    done
    local out ticks
    out=$(taskset -c 1 "$BIN/zerofan-bench" fan-in --port "$port" --duration "$DURATION" 2>/dev/null \
        | awk '$1 == "fan-in" { print $4, $7 }')
    # utime + stime, in clock ticks.
    ticks=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    set -- $out
    echo "$1 $(awk -v t="$ticks" -v n="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz * 1e6 / n }')"
}
none=() dead=() none_cpu=() dead_cpu=()
for i in $(seq 1 "$REPEATS"); do
    set -- $(run "$DIR/none.toml"); none+=("$1"); none_cpu+=("$2")
    set -- $(run "$DIR/dead.toml"); dead+=("$1"); dead_cpu+=("$2")
    echo "run $i: no webhook ${none[-1]} msg/s ${none_cpu[-1]} us CPU/msg, dead webhook ${dead[-1]} msg/s ${dead_cpu[-1]} us CPU/msg"
done
median() { printf '%s\n' "$@" | sort -h | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "median: no webhook $(median "${none[@]}") msg/s $(median "${none_cpu[@]}") us CPU/msg, dead webhook $(median "${dead[@]}") msg/s $(median "${dead_cpu[@]}") us CPU/msg"

#!/usr/bin/env bash
# Bridge throughput, zerofan's bridge against mosquitto's, in one run: a
# publisher on the edge broker, a subscriber on the far broker (mosquitto
# for both), the edge bridging `bench/#` out with the same mosquitto.conf
# bridge section (zerofan reads it unchanged). Prints one line per
# (QoS, edge): messages received, msg/s, MB/s, the edge's CPU seconds.
#
#   bench/bridge.sh                 COUNT=100000 SIZE=64 by default
#   COUNT=200000 SIZE=1024 ROUNDS=5 bench/bridge.sh   (ROUNDS=3 by default)
#   BASE_BIN=/path/to/older/zerofan bench/bridge.sh   (adds that build's
#                                   bridge as a third edge, "base")
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${COUNT:-100000}
SIZE=${SIZE:-64}
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release -q --bin zerofan -p zerofan-broker --example bridge_bench
ZEROFAN=${ZEROFAN_BIN:-$TARGET/release/zerofan}
BENCH=$TARGET/release/examples/bridge_bench
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 1 500); do
        (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
        sleep 0.02
    done
    echo "nothing listens on $1" >&2; return 1
}

far=$(port)
# The far side queues without limit, so what is measured is the bridges.
printf 'listener %s 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\n' "$far" > "$work/far.conf"
"$MOSQUITTO" -c "$work/far.conf" > "$work/far.log" 2>&1 &
pids+=($!)
wait_port "$far"

echo "bridge throughput: $COUNT messages of $SIZE bytes, edge -> far (mosquitto $("$MOSQUITTO" -h | head -1 | awk '{print $3}'))"
for round in $(seq 1 "${ROUNDS:-3}"); do
for qos in 0 1; do
    for edge in zerofan ${BASE_BIN:+base} mosquitto; do
        p=$(port)
        conf="$work/edge-$edge-$qos.conf"
        cat > "$conf" <<CONF
listener $p 127.0.0.1
allow_anonymous true
max_queued_messages 100000

connection bench-$edge-$qos
address 127.0.0.1:$far
topic bench/# out $qos
cleansession true
CONF
        if [ "$edge" = zerofan ]; then
            "$ZEROFAN" -c "$conf" > "$work/edge.log" 2>&1 &
        elif [ "$edge" = base ]; then
            "$BASE_BIN" -c "$conf" > "$work/edge.log" 2>&1 &
        else
            "$MOSQUITTO" -c "$conf" > "$work/edge.log" 2>&1 &
        fi
        epid=$!
        pids+=($epid)
        wait_port "$p"
        printf 'QoS %s  %-9s  ' "$qos" "$edge"
        "$BENCH" "127.0.0.1:$p" "127.0.0.1:$far" "$qos" "$COUNT" "$SIZE" | tr -d '\n'
        # The edge's own CPU time (its bridge included), start to end: less
        # swayed by the machine's load than the rate.
        printf ', edge CPU %s s\n' "$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$epid/stat")"
        kill "$epid"; wait "$epid" 2>/dev/null || true
    done
done
done

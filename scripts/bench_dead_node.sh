#!/usr/bin/env bash
# What a dead node costs the others (BENCHMARKS.md, the section of that
# name): a 3-node cluster (replicas = 3), node 3 killed (-9) and not
# removed, then RUNS runs of zerofan-bench qos1 (window 1024) of SECONDS
# each; after each, node 1's RSS and its link figures.
#
#   scripts/bench_dead_node.sh [TARGET_DIR] [RUNS] [SECONDS]
#
# MODE=replicated (default): publisher and subscriber on node 1, both
# persistent: node 1 replicates every message to nodes 2 and 3, and node 3,
# dead, stays in its replica set (no other node can stand in).
# MODE=stranded: a persistent '#' session owned by node 3, offline, before
# the kill; clean publisher on node 1, clean subscriber on node 2: each
# message is stranded for node 3's session in the copies on nodes 1 and 2.
# MODE=forwarded: clean publisher on node 1, clean subscriber on node 2,
# nothing on node 3: what queues for it is the rest (fences).
set -euo pipefail
T=${1:-target}
RUNS=${2:-8}
S=${3:-5}
MODE=${MODE:-replicated}
case "$MODE" in replicated | stranded | forwarded) ;; *)
    echo "MODE must be replicated, stranded or forwarded" >&2
    exit 2
    ;;
esac
BIN=$T/release/zerofan
BENCH=$T/release/zerofan-bench
DIR=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT
read -r P1 P2 P3 C1 C2 C3 H1 <<<"$(python3 -c '
import socket
ss = [socket.socket() for _ in range(7)]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))
')"
MQTT=("" "$P1" "$P2" "$P3")
LINK=("" "$C1" "$C2" "$C3")
for i in 1 2 3; do
    printf '[cluster]\nnode_id = %s\nlisten = "127.0.0.1:%s"\nreplicas = 3\n' "$i" "${LINK[$i]}" >"$DIR/c$i.toml"
    [ "$i" != 1 ] && printf 'join = "127.0.0.1:%s"\n' "$C1" >>"$DIR/c$i.toml"
    extra=()
    [ "$i" = 1 ] && extra=(--http "127.0.0.1:$H1")
    "$BIN" --listen "127.0.0.1:${MQTT[$i]}" --data-dir "$DIR/n$i" --config "$DIR/c$i.toml" \
        "${extra[@]}" >"$DIR/log$i" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do
        if "$BIN" cluster status --connect "127.0.0.1:$C1" --json 2>/dev/null | python3 -c '
import json, sys
try:
    m = json.load(sys.stdin)["members"]
except (ValueError, KeyError):
    sys.exit(1)
sys.exit(0 if len(m) == '"$i"' and all(x["healthy"] for x in m) else 1)'; then
            break
        fi
        sleep 0.2
    done
done
if [ "$MODE" = stranded ]; then
    timeout 3 mosquitto_sub -h 127.0.0.1 -p "$P3" -V mqttv5 -c -i dead-sub -x 86400 -q 1 \
        -t 'zfb/#' -W 1 >/dev/null 2>&1 || true
fi
kill -9 "${PIDS[2]}"
# Past the 2 s after which the others stop waiting for it.
sleep 4
for r in $(seq 1 "$RUNS"); do
    if [ "$MODE" != replicated ]; then
        sub=(--sub-port "$P2")
        expiry=0
    else
        sub=()
        expiry=300
    fi
    got=$(ZEROFAN_BENCH_SESSION_EXPIRY=$expiry "$BENCH" qos1 --port "$P1" "${sub[@]}" \
        --protocol 5 --duration "$S" --window 1024 2>/dev/null | awk '$1 == "qos1" { print $7 }')
    rss=$(awk '/VmRSS/ { print $2 }' "/proc/${PIDS[0]}/status")
    figures=$(curl -s "127.0.0.1:$H1/metrics" |
        awk '/^zerofan_cluster_(dropped_messages|shed_frames|stranded_kept|stranded_dropped)_total/ {
            sub("zerofan_cluster_", "", $1); sub("_total", "", $1); printf " %s=%s", $1, $2 }')
    echo "run $r: received $got; node 1 RSS $((rss / 1024)) MiB;$figures"
done

#!/usr/bin/env bash
# bench/cpu_per_delivery.sh BIN THREADS SCENARIO [zerofan-bench args...]
# The broker's CPU time (all its threads, from /proc) per message delivered, for one
# zerofan-bench run of 4 s against a fresh in-memory broker with --threads THREADS, unpinned.
# Used for the shards section of BENCHMARKS.md.
# BROKER_ARGS="..." adds broker arguments (e.g. --config FILE); THREADS "-" passes no
# --threads (for a build before shards).
set -euo pipefail
BIN=$1; T=$2; S=$3; shift 3
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
read -r -a EXTRA <<<"${BROKER_ARGS:-}"
TARGS=(--threads "$T")
[ "$T" = - ] && TARGS=()
$BIN --memory --listen 127.0.0.1:$PORT "${TARGS[@]}" "${EXTRA[@]}" >/dev/null 2>&1 &
PID=$!
sleep 0.5
ticks() { awk '{print $14+$15}' /proc/$PID/stat; }
# per-thread CPU of all threads: /proc/PID/stat covers the whole process
a=$(ticks)
out=$("${CARGO_TARGET_DIR:-target}/release/zerofan-bench" $S --port $PORT --protocol 4 --duration 4 --json "$@")
b=$(ticks)
kill -INT $PID; wait $PID 2>/dev/null || true
hz=$(getconf CLK_TCK)
python3 - "$a" "$b" "$hz" <<PY "$out"
import json,sys
a,b,hz=int(sys.argv[1]),int(sys.argv[2]),int(sys.argv[3])
j=json.loads(sys.argv[4])
r=j["results"][0]
cpu=(b-a)/hz
print(f'{r["case"]}: {r["msgs_per_s"]/1e6:.2f}M msg/s received {r["received"]} cpu {cpu:.2f}s -> {cpu/r["received"]*1e9:.0f} ns/delivery')
PY

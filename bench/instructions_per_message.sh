#!/usr/bin/env bash
# bench/instructions_per_message.sh BIN THREADS "SCENARIO [zerofan-bench args]" [broker args...]
# Instructions the broker executes per message received (callgrind's total over a 10 s
# zerofan-bench run against a fresh in-memory broker under valgrind, which makes the broker
# the bottleneck, so builds compare at full batches). Load hardly changes the count, so it
# compares builds on a noisy machine; used for "`--threads 1` against the broker before
# shards" in BENCHMARKS.md. THREADS "-" passes no --threads (a build before shards).
# Needs valgrind. Prints: scenario, messages received, instructions per message.
set -euo pipefail
BIN=$1; T=$2; S=$3; shift 3
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
TARGS=(--threads "$T")
[ "$T" = - ] && TARGS=()
valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.out" \
    "$BIN" --memory --listen 127.0.0.1:$PORT "${TARGS[@]}" "$@" >"$OUT/broker.log" 2>&1 &
PID=$!
# Under valgrind the broker takes seconds to start: wait for its port (bounded).
for _ in $(seq 1 300); do
    (echo >/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break
    sleep 0.1
done
read -r -a SC <<<"$S"
"${CARGO_TARGET_DIR:-target}/release/zerofan-bench" "${SC[@]}" --port $PORT --protocol 4 \
    --duration 10 --json >"$OUT/bench.json"
kill -INT $PID; wait $PID 2>/dev/null || true
IR=$(callgrind_annotate "$OUT/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
python3 - "$IR" "$OUT/bench.json" "$S" <<'PY'
import json, sys
ir = int(sys.argv[1])
r = json.load(open(sys.argv[2]))["results"][0]
n = r["received"]
print(f"{sys.argv[3]}: received {n}, {ir / max(n, 1):.0f} instructions per message")
PY

#!/usr/bin/env bash
# Replicated persistent QoS 1 against single-node persistent QoS 1
# (BENCHMARKS.md, the section of that name).
#
#   scripts/bench_replicas.sh [TARGET_DIR] [WINDOW] [SECONDS]
#
# REPLICAS=1 runs the cluster without copies (the cost of the hop alone).
# SUB_NODE=1 puts the subscriber on node 1 with the publisher (the cost of
# the copies alone: no message crosses to another node but as a copy).
#
# One zerofan alone, then a 3-node cluster (replicas = 3): zerofan-bench
# qos1 with persistent sessions (ZEROFAN_BENCH_SESSION_EXPIRY), the
# publisher on node 1 and the subscriber on node SUB_NODE (2 unless set;
# its replicas are the two others). Same config for both: fsync = "always".
#
# After each run it prints the CPU time each broker spent during it (all
# its threads, from /proc), in microseconds per message received: on a
# machine whose cores the brokers share, the figure that says what each
# node would need on cores of its own.
#
# CPUS="0-3 4-7 8-11 12-15" pins node 1 (and the single node), node 2,
# node 3 and the load generator to those cores (taskset lists); unset,
# nothing is pinned. BY_THREAD=1 also prints each broker thread's CPU per
# message, by thread name (a cluster node's core runs on its `zerofan`
# thread). SINGLE_ARGS: more options for the single node only
# (e.g. "--threads 1": a cluster node runs one thread).
set -euo pipefail
T=${1:-target}
W=${2:-1024}
S=${3:-5}
BIN=$T/release/zerofan
BENCH=$T/release/zerofan-bench
DIR=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT
R=${REPLICAS:-3}
SUB=${SUB_NODE:-2}
case "$SUB" in 1 | 2 | 3) ;; *)
    echo "SUB_NODE must be 1, 2 or 3" >&2
    exit 2
    ;;
esac
read -r -a CPU <<<"${CPUS:-}"
if [ -n "${CPUS:-}" ] && [ "${#CPU[@]}" != 4 ]; then
    echo "CPUS must name four core lists: node 1, node 2, node 3, load generator" >&2
    exit 2
fi
pin() { # node (1-3, 4: the load generator), command...
    local n=$1
    shift
    # exec: a broker started in the background is then the process $! names.
    if [ -n "${CPUS:-}" ]; then exec taskset -c "${CPU[$((n - 1))]}" "$@"; else exec "$@"; fi
}
read -r -a SINGLE <<<"${SINGLE_ARGS:-}"
printf 'max_queued_messages = 100000\nfsync = "always"\n' >"$DIR/bench.toml"

# Free ports, all taken at once (so they differ) and let go just before
# the brokers bind them, so that runs beside others do not collide.
read -r PS P1 P2 P3 C1 C2 C3 <<<"$(python3 -c '
import socket
ss = [socket.socket() for _ in range(7)]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))
')"
MQTT=("" "$P1" "$P2" "$P3")
LINK=("" "$C1" "$C2" "$C3")

cpu_ticks() { # CPU time of every broker, in clock ticks, one per line
    for p in "${PIDS[@]}"; do awk '{print $14 + $15}' "/proc/$p/stat"; done
}

thread_ticks() { # "node thread ticks" for every thread of every broker, by name
    local i=0
    for p in "${PIDS[@]}"; do
        i=$((i + 1))
        for t in /proc/"$p"/task/*; do
            # The name is in parentheses and may hold spaces: fields after it.
            printf '%s %s %s\n' "$i" "$(tr ' ' _ <"$t/comm")" \
                "$(sed 's/.*) //' "$t/stat" | awk '{print $12 + $13}')"
        done
    done | awk '{ s[$1 " " $2] += $3 } END { for (k in s) print k, s[k] }' | sort
}

run_bench() { # label port [sub_port]
    local extra=()
    [ -n "${3:-}" ] && extra=(--sub-port "$3")
    echo "== $1 (window $W, ${S}s)"
    local before out threads_before
    before=$(cpu_ticks)
    threads_before=$(thread_ticks)
    out=$(ZEROFAN_BENCH_SESSION_EXPIRY=300 pin 4 "$BENCH" qos1 --port "$2" --protocol 5 \
        --duration "$S" --window "$W" "${extra[@]}")
    echo "$out"
    # The bench's row: "qos1  1:1 window=… 256B  rate  MiB/s  sent  recv …".
    local recv
    recv=$(echo "$out" | awk '$1 == "qos1" { print $7 }')
    paste <(echo "$before") <(cpu_ticks) | awk -v n="$recv" -v hz="$(getconf CLK_TCK)" '
        n > 0 { printf "node %d: %.2f us of CPU per message\n", NR, ($2 - $1) / hz * 1e6 / n }'
    # By thread (BY_THREAD=1): which thread of a node bounds it on cores of
    # its own (a cluster node runs its core on one thread).
    if [ -n "${BY_THREAD:-}" ]; then
        join <(echo "$threads_before" | awk '{print $1 "/" $2, $3}' | sort) \
            <(thread_ticks | awk '{print $1 "/" $2, $3}' | sort) |
            awk -v n="$recv" -v hz="$(getconf CLK_TCK)" '
                n > 0 && $3 > $2 { printf "  node/thread %s: %.2f us per message\n", $1, ($3 - $2) / hz * 1e6 / n }'
    fi
}

wait_members() { # cluster addr, count
    for _ in $(seq 1 100); do
        if "$BIN" cluster status --connect "$1" --json 2>/dev/null |
            python3 -c '
import json, sys
try:  # no answer yet while the cluster forms: try again
    m = json.load(sys.stdin)["members"]
except (ValueError, KeyError):
    sys.exit(1)
sys.exit(0 if len(m) == '"$2"' and all(x["healthy"] for x in m) else 1)'; then
            return 0
        fi
        sleep 0.2
    done
    echo "cluster did not form" >&2
    return 1
}

# Single node.
pin 1 "$BIN" --listen "127.0.0.1:$PS" --data-dir "$DIR/single" --config "$DIR/bench.toml" \
    "${SINGLE[@]}" >/dev/null &
PIDS+=($!)
sleep 1
run_bench "single node, persistent" "$PS"
kill "${PIDS[0]}"
wait "${PIDS[0]}" 2>/dev/null || true
PIDS=()

# Three nodes.
for i in 1 2 3; do
    cp "$DIR/bench.toml" "$DIR/c$i.toml"
    printf '[cluster]\nnode_id = %s\nlisten = "127.0.0.1:%s"\nreplicas = %s\n' $i "${LINK[$i]}" "$R" >>"$DIR/c$i.toml"
    [ "$i" != 1 ] && printf 'join = "127.0.0.1:%s"\n' "$C1" >>"$DIR/c$i.toml"
    pin "$i" "$BIN" --listen "127.0.0.1:${MQTT[$i]}" \
        --data-dir "$DIR/n$i" --config "$DIR/c$i.toml" >/dev/null &
    PIDS+=($!)
    if [ "$i" = 1 ]; then wait_members "127.0.0.1:$C1" 1; fi
done
wait_members "127.0.0.1:$C1" 3
sleep 1
run_bench "3 nodes, replicas $R, publisher on node 1, subscriber on node $SUB" "$P1" "${MQTT[$SUB]}"

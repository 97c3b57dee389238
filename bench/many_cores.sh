#!/usr/bin/env bash
# What the 2-core machine cannot show, on a machine with 16 cores
# (BENCHMARKS.md: "Scaling table on 16 cores" and the replicated QoS 1
# section's "each node on cores of its own"):
#
#   bench/many_cores.sh [DIR]
#
#   1. the shards' scaling table: zerofan at each of THREADS, then mosquitto
#      and rumqttd, brokers on BROKER_CPU, zerofan-bench on BENCH_CPU, through
#      bench/compare.sh (WRITE=0: the tables are printed, not written);
#   2. at each of THREADS again, the broker's and the load generator's CPU
#      time during fan-out to 100 and fan-in (from /proc): which side is busy;
#   3. replicated persistent QoS 1 with each node and the load generator on 4
#      cores of its own (scripts/bench_replicas.sh with CPUS), REP_RUNS runs,
#      then one with the subscriber on node 1.
#
# DIR (default target) holds release/zerofan and release/zerofan-bench;
# mosquitto on PATH and rumqttd in bench/.cache/rumqttd/bin (bench/compare.sh
# installs both). Environment: PARTS="scale pubs cpu replicas" THREADS="1 2 4 8"
# BROKER_CPU=0-7 BENCH_CPU=8-15 REPEATS=3 DURATION=3 REP_RUNS=3
# REP_WINDOW=1024; PUBLISHERS=8 adds fan-out to 100 from 8 publishers
# (part pubs: zerofan at each of THREADS and rumqttd; and to the CPU
# readings).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
DIR=$(cd "${1:-target}" && pwd)
TH=${THREADS:-"1 2 4 8"}
BC=${BROKER_CPU:-0-7}
GC=${BENCH_CPU:-8-15}
export CARGO_TARGET_DIR=$DIR
echo "# $(nproc) cores, $(date -u '+%F %H:%M UTC'), zerofan $(git rev-parse --short HEAD 2>/dev/null)"

PARTS=${PARTS:-"scale pubs cpu replicas"}
PUBS=${PUBLISHERS:-}
part() { [[ " $PARTS " == *" $1 "* ]]; }

if part scale; then
for T in $TH; do
    echo "## zerofan --threads $T"
    env PIN=1 BROKER_CPU="$BC" BENCH_CPU="$GC" REPEATS="${REPEATS:-3}" DURATION="${DURATION:-3}" \
        SCENARIOS=fan-in,fan-out SUBSCRIBERS=100 PROTOCOL=4 WRITE=0 BROKERS=zerofan \
        ZEROFAN_BIN="$DIR/release/zerofan" ZEROFAN_ARGS="--threads $T" \
        ZEROFAN_VERSION="zerofan --threads $T" bench/compare.sh
done
echo "## mosquitto and rumqttd"
env PIN=1 BROKER_CPU="$BC" BENCH_CPU="$GC" REPEATS="${REPEATS:-3}" DURATION="${DURATION:-3}" \
    SCENARIOS=fan-in,fan-out SUBSCRIBERS=100 PROTOCOL=4 WRITE=0 BROKERS="mosquitto rumqttd" \
    bench/compare.sh
fi

if part pubs && [ -n "$PUBS" ]; then
    for b in $TH rumqttd; do
        echo "## fan-out to 100 from $PUBS publishers: $b"
        if [ "$b" = rumqttd ]; then args=(BROKERS=rumqttd); else
            args=(BROKERS=zerofan ZEROFAN_BIN="$DIR/release/zerofan" ZEROFAN_ARGS="--threads $b"
                ZEROFAN_VERSION="zerofan --threads $b")
        fi
        env PIN=1 BROKER_CPU="$BC" BENCH_CPU="$GC" REPEATS="${REPEATS:-3}" DURATION="${DURATION:-3}" \
            SCENARIOS=fan-out SUBSCRIBERS=100 PROTOCOL=4 WRITE=0 EXTRA_ARGS="--publishers $PUBS" \
            "${args[@]}" bench/compare.sh
    done
fi

if part cpu; then
echo "## CPU time during the runs"
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null; }
port=19000
for T in $TH; do
    port=$((port + 1))
    taskset -c "$BC" "$DIR/release/zerofan" --listen "127.0.0.1:$port" --memory --threads "$T" \
        >/dev/null 2>&1 &
    bp=$!
    sleep 0.5
    scenarios=("fan-out --subscribers 100" "fan-in")
    [ -n "$PUBS" ] && scenarios+=("fan-out --subscribers 100 --publishers $PUBS")
    for s in "${scenarios[@]}"; do
        b0=$(ticks $bp)
        t0=$(date +%s.%N)
        # shellcheck disable=SC2086 # $s is the scenario and its options
        taskset -c "$GC" "$DIR/release/zerofan-bench" $s --port "$port" --protocol 4 \
            --duration 3 >"$DIR/many_cores.out" 2>&1 &
        gp=$!
        g=0 # the generator's CPU, read until it exits
        while kill -0 $gp 2>/dev/null; do
            g=$(ticks $gp || echo "$g")
            sleep 0.2
        done
        b1=$(ticks $bp)
        t1=$(date +%s.%N)
        # The rate: the field after the case's size ("1KiB", "256B").
        rate=$(awk '$1 == "fan-out" || $1 == "fan-in" {
            for (i = 3; i <= NF; i++) if ($(i - 1) ~ /B$/) { print $i; exit } }' "$DIR/many_cores.out")
        awk -v a="$b0" -v b="$b1" -v g="$g" -v hz="$hz" -v t0="$t0" -v t1="$t1" \
            -v what="threads $T, $s: $rate msg/s" \
            'BEGIN { printf "%s; broker %.2f s of CPU, generator %.2f s, in %.2f s\n", what, (b - a) / hz, g / hz, t1 - t0 }'
    done
    kill $bp
    wait $bp 2>/dev/null
done

fi

part replicas || exit 0
echo "## replicated persistent QoS 1, each node on 4 cores of its own"
for _ in $(seq 1 "${REP_RUNS:-3}"); do
    BY_THREAD=1 CPUS="0-3 4-7 8-11 12-15" SINGLE_ARGS="--threads 1" \
        scripts/bench_replicas.sh "$DIR" "${REP_WINDOW:-1024}" 5
done
BY_THREAD=1 SUB_NODE=1 CPUS="0-3 4-7 8-11 12-15" SINGLE_ARGS="--threads 1" \
    scripts/bench_replicas.sh "$DIR" "${REP_WINDOW:-1024}" 5

#!/usr/bin/env bash
# Side-by-side comparison of zerofan with mosquitto, rumqttd and Mochi, driven
# by zerofan-bench. Not part of CI (it takes minutes); CI runs
# `zerofan-bench smoke` instead.
#
# What it does:
#   1. installs the peers when absent: mosquitto from apt, rumqttd with
#      `cargo install --locked` into bench/.cache/rumqttd, Mochi through our
#      Go main in bench/mochi (Go module proxy) into bench/.cache/mochi;
#   2. builds zerofan and zerofan-bench in release mode;
#   3. for each repeat, for each broker (order rotated between repeats), for
#      each scenario: starts a fresh broker pinned to core $BROKER_CPU, runs
#      the scenario with zerofan-bench pinned to core $BENCH_CPU, stops it;
#   4. writes medians (min-max) and zerofan / best peer into BENCHMARKS.md,
#      section "## End-to-end comparison (zerofan-bench)".
#
# Environment (all optional):
#   REPEATS=3            runs per broker (at least 3 for a recorded table)
#   DURATION=3           seconds of publishing per case
#   SCENARIOS=all        comma-separated subset, e.g. fan-in,fan-out,qos1,ping-pong
#   SUBSCRIBERS=         fan-out subscriber counts, e.g. 1,10,100 (default 1,10,100,1000)
#   BROKERS="mosquitto rumqttd mochi zerofan"
#   PROTOCOL=4           MQTT protocol level, 4 or 5
#   BASE_PORT=           brokers listen on 127.0.0.1:BASE_PORT (+1 for rumqttd's v5
#                        listener); default: a free pair of ports picked at start
#   BROKER_CPU=0 BENCH_CPU=1
#   PIN=1                0: pin nothing (brokers and zerofan-bench use any core;
#                        for the scaling table)
#   ZEROFAN_ARGS=        more zerofan options (e.g. "--threads 2")
#   ZEROFAN_BIN=         use this zerofan binary instead of building one
#   ZEROFAN_VERSION=     how to name that binary in the table (e.g. a commit)
#   WRITE=1              0: print the Markdown instead of editing BENCHMARKS.md
#   EXTRA_ARGS=          more zerofan-bench options (e.g. "--window 128")
#   NOTE=                a remark recorded with the table (e.g. about machine load)
#   RESULTS=             summarize this earlier results directory again (no install, no run)
#   TITLE=               subsection of the comparison section to (re)write; default
#                        "All scenarios" or "Scenarios: $SCENARIOS"
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=$ROOT/bench/.cache
REPEATS=${REPEATS:-3}
DURATION=${DURATION:-3}
SCENARIOS=${SCENARIOS:-all}
SUBSCRIBERS=${SUBSCRIBERS:-}
BROKERS=${BROKERS:-"mosquitto rumqttd mochi zerofan"}
PROTOCOL=${PROTOCOL:-4}
free_pair() {
    # Two consecutive free loopback ports (rumqttd needs one per protocol).
    python3 - <<'PY'
import socket
for _ in range(200):
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    try:
        b = socket.socket(); b.bind(("127.0.0.1", p + 1)); b.close(); a.close(); print(p); break
    except OSError:
        a.close()
PY
}
BASE_PORT=${BASE_PORT:-$(free_pair)}
BROKER_CPU=${BROKER_CPU:-0}
BENCH_CPU=${BENCH_CPU:-1}
PIN=${PIN:-1}
ZEROFAN_ARGS=${ZEROFAN_ARGS:-}
read -r -a ZF_ARGS <<<"$ZEROFAN_ARGS"
if [ "$PIN" = 0 ]; then
    BROKER_CPU=0-$(($(nproc) - 1))
    BENCH_CPU=$BROKER_CPU
fi
WRITE=${WRITE:-1}
EXTRA_ARGS=${EXTRA_ARGS:-}
NOTE=${NOTE:-}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -n "${RESULTS:-}" ]; then
    OUT=$(cd "$RESULTS" && pwd)
    STAMP=$(basename "$OUT")
else
    STAMP=$(date -u +%Y%m%dT%H%M%SZ)
    OUT=$CACHE/results/$STAMP
    mkdir -p "$OUT"
fi

log() { echo "compare.sh: $*" >&2; }

# 10,000 client connections need descriptors on both sides.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" -lt 10500 ] 2>/dev/null; then
    log "warning: ulimit -n is $(ulimit -n); the connections scenario wants 10,000 clients per side"
fi

# ---------------------------------------------------------------- installs
install_mosquitto() {
    if ! command -v mosquitto >/dev/null; then
        log "installing mosquitto (apt)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto >/dev/null
    fi
}
install_rumqttd() {
    if [ ! -x "$CACHE/rumqttd/bin/rumqttd" ]; then
        log "installing rumqttd (cargo install --locked, a few minutes)"
        if ! cargo install --locked rumqttd --root "$CACHE/rumqttd"; then
            # rumqttd 0.20.0's lock file pins metrics 0.22.1, which newer
            # compilers reject (E0521); the semver-compatible 0.22.4 builds.
            log "the locked build failed; retrying with up-to-date compatible dependencies"
            cargo install rumqttd --root "$CACHE/rumqttd"
        fi
    fi
}
install_mochi() {
    if [ ! -x "$CACHE/mochi/mochi-bench" ] || [ bench/mochi/main.go -nt "$CACHE/mochi/mochi-bench" ]; then
        log "building Mochi (Go module proxy)"
        mkdir -p "$CACHE/mochi"
        (cd bench/mochi && go build -o "$CACHE/mochi/mochi-bench" .)
    fi
}
for b in $BROKERS; do
    [ -n "${RESULTS:-}" ] && break
    case $b in
        mosquitto) install_mosquitto ;;
        rumqttd) install_rumqttd ;;
        mochi) install_mochi ;;
        zerofan) ;;
        *) log "unknown broker $b"; exit 2 ;;
    esac
done

log "building zerofan and zerofan-bench (release, target dir $TARGET_DIR)"
BENCH=$TARGET_DIR/release/zerofan-bench
if ! CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -q -p zerofan-bench; then
    if [ -x "$BENCH" ]; then
        log "warning: the workspace does not build right now; using the existing $BENCH"
    else
        exit 1
    fi
fi
ZEROFAN=${ZEROFAN_BIN:-$TARGET_DIR/release/zerofan}
if [[ " $BROKERS " == *" zerofan "* ]] && [ -z "${ZEROFAN_BIN:-}" ] && [ -z "${RESULTS:-}" ]; then
    if ! CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -q -p zerofan-broker --bin zerofan; then
        log "zerofan does not build: leaving it out"
        BROKERS=${BROKERS//zerofan/}
    fi
fi

# ------------------------------------------------------------ broker control
CONF=$OUT/conf
mkdir -p "$CONF"
cat >"$CONF/mosquitto.conf" <<EOF
listener $BASE_PORT 127.0.0.1
allow_anonymous true
persistence false
# Queue limits high enough that the bench's bounded windows never hit them.
max_queued_messages 100000
max_inflight_messages 0
log_dest none
EOF
cat >"$CONF/rumqttd.toml" <<EOF
id = 0

[router]
id = 0
max_connections = 20010
max_outgoing_packet_count = 200
max_segment_size = 104857600
max_segment_count = 10

[v4.1]
name = "v4-1"
listen = "127.0.0.1:$BASE_PORT"
next_connection_delay_ms = 0
    [v4.1.connections]
    connection_timeout_ms = 60000
    max_payload_size = 104857600
    max_inflight_count = 100
    dynamic_filters = true

[v5.1]
name = "v5-1"
listen = "127.0.0.1:$((BASE_PORT + 1))"
next_connection_delay_ms = 0
    [v5.1.connections]
    connection_timeout_ms = 60000
    max_payload_size = 104857600
    max_inflight_count = 100
EOF

BROKER_PID=
port_of() {
    if [ "$1" = rumqttd ] && [ "$PROTOCOL" = 5 ]; then echo $((BASE_PORT + 1)); else echo "$BASE_PORT"; fi
}
start_broker() {
    local b=$1 logf=$OUT/$1.log port
    port=$(port_of "$b")
    # Other programs on this machine may hold ports too: never measure them.
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        log "port $port is already taken by another program; set BASE_PORT"
        return 1
    fi
    case $b in
        mosquitto) taskset -c "$BROKER_CPU" mosquitto -c "$CONF/mosquitto.conf" >>"$logf" 2>&1 & ;;
        rumqttd) taskset -c "$BROKER_CPU" "$CACHE/rumqttd/bin/rumqttd" -c "$CONF/rumqttd.toml" >>"$logf" 2>&1 & ;;
        mochi) taskset -c "$BROKER_CPU" "$CACHE/mochi/mochi-bench" --listen "127.0.0.1:$BASE_PORT" >>"$logf" 2>&1 & ;;
        zerofan) taskset -c "$BROKER_CPU" "$ZEROFAN" --listen "127.0.0.1:$BASE_PORT" --memory \
            "${ZF_ARGS[@]}" >>"$logf" 2>&1 & ;;
    esac
    BROKER_PID=$!
    for _ in $(seq 1 100); do
        if command -v ss >/dev/null; then
            # Listening, and the listener is the process we started.
            if ss -ltnpH "sport = :$port" 2>/dev/null | grep -q "pid=$BROKER_PID,"; then
                return 0
            fi
        elif (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        if ! kill -0 "$BROKER_PID" 2>/dev/null; then
            log "$b exited at start (see $logf)"
            return 1
        fi
        sleep 0.1
    done
    log "$b did not listen on $port within 10 s"
    stop_broker
    return 1
}
stop_broker() {
    if [ -n "$BROKER_PID" ] && kill -0 "$BROKER_PID" 2>/dev/null; then
        kill "$BROKER_PID" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$BROKER_PID" 2>/dev/null || true
        wait "$BROKER_PID" 2>/dev/null || true
    fi
    BROKER_PID=
}
trap stop_broker EXIT

version_of() {
    case $1 in
        mosquitto) mosquitto -h 2>/dev/null | head -1 | sed 's/ version / /' || true ;;
        rumqttd) "$CACHE/rumqttd/bin/rumqttd" --version 2>/dev/null | head -1 || echo "rumqttd (cargo install)" ;;
        mochi) echo "mochi $(sed -n 's|.*mochi-mqtt/server/v2 \(v[^ ]*\).*|\1|p' bench/mochi/go.mod) ($(go version | awk '{print $3}'))" ;;
        zerofan)
            if [ -n "${ZEROFAN_VERSION:-}" ]; then
                echo "zerofan $ZEROFAN_VERSION"
            elif [ -n "${ZEROFAN_BIN:-}" ]; then
                echo "zerofan ($ZEROFAN_BIN)"
            else
                echo "zerofan $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates 2>/dev/null || echo '+dirty')"
            fi ;;
    esac
}

# ------------------------------------------------------------------- runs
# Every scenario gets a freshly started broker, so memory figures (large,
# connections) do not carry what earlier scenarios left behind.
if [ "$SCENARIOS" = all ]; then
    LIST="fan-in fan-out shared topics mixed qos1 qos2 ping-pong first-delivery large connections"
else
    LIST=${SCENARIOS//,/ }
fi
COMMON=()
if [ -n "$SUBSCRIBERS" ]; then COMMON+=(--subscribers "$SUBSCRIBERS"); fi
read -r -a EXTRA <<<"$EXTRA_ARGS"

read -r -a ORDER <<<"$BROKERS"
n=${#ORDER[@]}
runs=$REPEATS
[ -n "${RESULTS:-}" ] && runs=0
for rep in $(seq 1 "$runs"); do
    for i in $(seq 0 $((n - 1))); do
        b=${ORDER[$(((i + rep - 1) % n))]}
        log "repeat $rep/$REPEATS: $b"
        for s in $LIST; do
            f=$OUT/$b-$rep-$s
            if ! start_broker "$b"; then
                continue
            fi
            sleep 0.3
            taskset -c "$BENCH_CPU" "$BENCH" "$s" \
                --port "$(port_of "$b")" --protocol "$PROTOCOL" --duration "$DURATION" \
                --label "$b" --broker-pid "$BROKER_PID" --json "${COMMON[@]}" "${EXTRA[@]}" \
                >"$f.json" 2>"$f.err" || log "$b $s (repeat $rep) reported failures (see $f.err)"
            if ! kill -0 "$BROKER_PID" 2>/dev/null; then
                log "$b died during $s"
            fi
            stop_broker
            [ -s "$f.json" ] || rm -f "$f.json"
        done
    done
done

# ---------------------------------------------------------------- report
shopt -s nullglob
files=("$OUT"/*.json)
if [ ${#files[@]} -eq 0 ]; then
    log "no results"
    exit 1
fi
if [ ! -s "$OUT/meta.txt" ]; then
    versions=()
    for b in $BROKERS; do versions+=("$(version_of "$b")"); done
    versions_line=$(IFS=';'; echo "${versions[*]}" | sed 's/;/, /g')
    model=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
    cmd="REPEATS=$REPEATS DURATION=$DURATION SCENARIOS=$SCENARIOS${SUBSCRIBERS:+ SUBSCRIBERS=$SUBSCRIBERS} PROTOCOL=$PROTOCOL bench/compare.sh"
    meta=(
        --meta "Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
        --meta "Machine: $(nproc) cores, ${model:-unknown CPU}, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); broker on core(s) $BROKER_CPU, zerofan-bench on core(s) $BENCH_CPU (taskset)${ZEROFAN_ARGS:+; zerofan $ZEROFAN_ARGS}; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
        --meta "Versions: $versions_line"
        --meta "Command: \`$cmd\` (MQTT protocol level $PROTOCOL, $DURATION s of publishing per case; raw JSON in bench/.cache/results/$STAMP)"
        --meta "Cells: median (min–max) over $REPEATS repeats; ↑ higher is better, ↓ lower is better; the last column is zerofan's median over the best peer's median. Throughput is counted at the receivers with a bounded window of messages in flight per publisher; **lost N** marks deliveries that never arrived."
    )
    for ((k = 1; k < ${#meta[@]}; k += 2)); do printf '%s\n' "${meta[$k]}"; done >"$OUT/meta.txt"
fi
if [ ! -s "$OUT/title.txt" ]; then
    if [ "$SCENARIOS" = all ]; then
        echo "All scenarios"
    else
        echo "Scenarios: ${SCENARIOS//,/, }${SUBSCRIBERS:+ (fan-out subscribers $SUBSCRIBERS)}"
    fi >"$OUT/title.txt"
fi
default_title=$(cat "$OUT/title.txt")
meta=()
while IFS= read -r line; do meta+=(--meta "$line"); done <"$OUT/meta.txt"
if [ -n "$NOTE" ]; then meta+=(--meta "Note: $NOTE"); fi
# shellcheck disable=SC2086 # word splitting collapses the spaces on purpose
order_csv=$(echo $BROKERS | tr ' ' ',')
if [ "$WRITE" = 1 ]; then
    "$BENCH" summarize "${files[@]}" --order "$order_csv" --subject zerofan "${meta[@]}" \
        --write-section BENCHMARKS.md --title "${TITLE:-$default_title}"
    log "wrote the comparison into BENCHMARKS.md (raw results in $OUT)"
else
    "$BENCH" summarize "${files[@]}" --order "$order_csv" --subject zerofan "${meta[@]}"
fi

#!/usr/bin/env bash
# Scale of state (issue #20): zerofan-bench's connections, subscriptions,
# retained, storm and resume scenarios against zerofan, mosquitto and
# rumqttd, each scenario on a freshly started broker (memory figures are
# RSS deltas of the broker process, read from /proc with --broker-pid).
# Not part of CI (minutes per broker); CI runs the scenarios with tiny
# counts in `zerofan-bench smoke` and asserts per-unit memory in
# crates/zerofan-broker/tests/scale_state.rs.
#
# resume: the broker runs with persistence (zerofan --data-dir, mosquitto
# `persistence true`), `--phase setup` creates the sessions and queues a
# message for each, the broker is stopped (SIGTERM) and started again from
# its store, and `--phase resume` reconnects them all. rumqttd keeps no
# sessions across a restart: its resume row shows that.
#
# Environment (all optional):
#   BROKERS="zerofan mosquitto rumqttd"
#   SCENARIOS="connections subscriptions retained storm resume"
#   CLIENTS=19000        connections and storm (a process may hold 20,000
#                        files here; both sides need one per connection)
#   SESSIONS=100000      resume (sessions; at most CLIENTS connected at once)
#   SUBSCRIPTIONS=1000000  RETAINED=1000000  MATCHING=10000
#   KEEP_ALIVE=10        connections scenario keep alive (silent sample closed at 1.5x)
#   AT_ONCE=1000         handshakes in flight in the bounded storm and in resume
#                        (the storm also runs with all at once)
#   DURATION=3           seconds of each throughput run
#   PORT=                listen port (default: a free one)
#   ZEROFAN_BIN=         zerofan binary (default: release build in the target dir)
#   ZEROFAN_ARGS=        more zerofan arguments, e.g. "--threads 1"
#   OUT=                 results directory (default bench/.cache/scale/STAMP)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=$ROOT/bench/.cache
BROKERS=${BROKERS:-"zerofan mosquitto rumqttd"}
SCENARIOS=${SCENARIOS:-"connections subscriptions retained storm resume"}
CLIENTS=${CLIENTS:-19000}
ZEROFAN_ARGS=${ZEROFAN_ARGS:-}
SESSIONS=${SESSIONS:-100000}
SUBSCRIPTIONS=${SUBSCRIPTIONS:-1000000}
RETAINED=${RETAINED:-1000000}
MATCHING=${MATCHING:-10000}
KEEP_ALIVE=${KEEP_ALIVE:-10}
AT_ONCE=${AT_ONCE:-1000}
DURATION=${DURATION:-3}
PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
ZEROFAN=${ZEROFAN_BIN:-$TARGET_DIR/release/zerofan}
BENCH=$TARGET_DIR/release/zerofan-bench
RUMQTTD=$CACHE/rumqttd/bin/rumqttd
OUT=${OUT:-$CACHE/scale/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
log() { echo "scale.sh: $*" >&2; }

# Both sides hold one descriptor per connection.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
log "open files per process: $(ulimit -n) (hard $(ulimit -Hn)); results in $OUT"

if [ -z "${ZEROFAN_BIN:-}" ]; then
    CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -q --bin zerofan -p zerofan-broker
fi
CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -q -p zerofan-bench
if [[ " $BROKERS " == *" rumqttd "* ]] && [ ! -x "$RUMQTTD" ]; then
    log "installing rumqttd (cargo install, as bench/compare.sh does)"
    cargo install --locked rumqttd --root "$CACHE/rumqttd" || cargo install rumqttd --root "$CACHE/rumqttd"
fi

CONF=$OUT/conf
mkdir -p "$CONF"
write_confs() {
    local data=$1
    cat >"$CONF/mosquitto.conf" <<EOF
listener $PORT 127.0.0.1
allow_anonymous true
max_queued_messages 100000
max_inflight_messages 0
log_dest none
EOF
    if [ -n "$data" ]; then
        printf 'persistence true\npersistence_location %s/\nautosave_interval 0\n# Run as root here: keep root so the store directory stays writable.\nuser root\n' "$data" \
            >>"$CONF/mosquitto.conf"
    fi
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
listen = "127.0.0.1:$PORT"
next_connection_delay_ms = 0
    [v4.1.connections]
    connection_timeout_ms = 60000
    max_payload_size = 104857600
    max_inflight_count = 100
    dynamic_filters = true
EOF
}

BROKER_PID=
start_broker() {
    local b=$1 data=$2 logf=$OUT/$1.log
    write_confs "$data"
    case $b in
        mosquitto) mosquitto -c "$CONF/mosquitto.conf" >>"$logf" 2>&1 & ;;
        rumqttd) "$RUMQTTD" -c "$CONF/rumqttd.toml" >>"$logf" 2>&1 & ;;
        zerofan)
            if [ -n "$data" ]; then
                "$ZEROFAN" --listen "127.0.0.1:$PORT" --data-dir "$data" $ZEROFAN_ARGS >>"$logf" 2>&1 &
            else
                "$ZEROFAN" --listen "127.0.0.1:$PORT" --memory $ZEROFAN_ARGS >>"$logf" 2>&1 &
            fi ;;
    esac
    BROKER_PID=$!
    for _ in $(seq 1 300); do
        if ss -ltnpH "sport = :$PORT" 2>/dev/null | grep -q "pid=$BROKER_PID,"; then
            return 0
        fi
        kill -0 "$BROKER_PID" 2>/dev/null || { log "$b exited at start (see $logf)"; return 1; }
        sleep 0.1
    done
    log "$b did not listen within 30 s"
    return 1
}
stop_broker() {
    if [ -n "$BROKER_PID" ] && kill -0 "$BROKER_PID" 2>/dev/null; then
        kill "$BROKER_PID" 2>/dev/null || true
        # Persistence is written at shutdown: give it time (bounded).
        for _ in $(seq 1 600); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$BROKER_PID" 2>/dev/null || true
        wait "$BROKER_PID" 2>/dev/null || true
    fi
    BROKER_PID=
}
trap stop_broker EXIT

bench() {
    local f=$1
    shift
    timeout 1200 "$BENCH" "$@" --port "$PORT" --broker-pid "$BROKER_PID" --duration "$DURATION" \
        --json >"$f.json" 2>"$f.err" || log "$(basename "$f") reported failures (see $f.err)"
    kill -0 "$BROKER_PID" 2>/dev/null || log "the broker died during $(basename "$f")"
}

for b in $BROKERS; do
    for s in $SCENARIOS; do
        f=$OUT/$b-$s
        # Persistence only where the scenario is about it.
        data=
        if [ "$s" = resume ]; then
            data=$OUT/data-$b
            rm -rf "$data"
            mkdir -p "$data"
        fi
        log "$b: $s"
        start_broker "$b" "$data" || continue
        sleep 0.3
        case $s in
            connections) bench "$f" connections --label "$b" --clients "$CLIENTS" --keep-alive "$KEEP_ALIVE" ;;
            storm)
                bench "$f" storm --label "$b" --clients "$CLIENTS"
                # Again with a bounded number in flight: the broker's own
                # rate, without the kernel's SYN retries of an overflowing
                # listen backlog.
                stop_broker
                start_broker "$b" "" || continue
                bench "$f-bounded" storm --label "$b" --clients "$CLIENTS" --at-once "$AT_ONCE"
                ;;
            subscriptions) bench "$f" subscriptions --label "$b" --subscriptions "$SUBSCRIPTIONS" ;;
            retained) bench "$f" retained --label "$b" --retained "$RETAINED" --matching "$MATCHING" ;;
            resume)
                bench "$f-setup" resume --label "$b" --clients "$SESSIONS" --phase setup
                stop_broker
                log "$b: restarted from its store"
                start_broker "$b" "$data" || continue
                bench "$f" resume --label "$b" --clients "$SESSIONS" --phase resume --at-once "$AT_ONCE"
                ;;
            *) log "unknown scenario $s" ;;
        esac
        stop_broker
        [ -z "$data" ] || rm -rf "$data"
    done
done
{
    echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC'); zerofan $(git rev-parse --short HEAD)"
    echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "Versions: $(mosquitto -h 2>/dev/null | head -1 || true); $("$RUMQTTD" --version 2>/dev/null | head -1 || echo rumqttd)"
} >"$OUT/meta.txt"
cat "$OUT/meta.txt" >&2
shopt -s nullglob
files=("$OUT"/*.json)
[ ${#files[@]} -gt 0 ] && "$BENCH" summarize "${files[@]}" --order "${BROKERS// /,}" --subject zerofan

# shellcheck shell=bash
# Shared helpers for the bash load scripts (sourced, not run). Starts and stops one
# isoboxd for a benchmark and checks that it leaves nothing behind.
#
# The daemon runs with the per-client /execute rate limit raised out of the way (every
# request comes from 127.0.0.1) and a 2 s shutdown grace.
# Settings (environment): ISOBOXD (binary), BENCH_PORT (isoboxd port, loopback only),
# BENCH_INSTANCE (cgroup slice / runsc root name), BENCH_DATA_DIR.

BENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ISOBOXD=${ISOBOXD:-$BENCH_ROOT/target/release/isoboxd}
BENCH_PORT=${BENCH_PORT:-18099}
BENCH_INSTANCE=${BENCH_INSTANCE:-isobox-bench}
BENCH_DATA_DIR=${BENCH_DATA_DIR:-/tmp/bench-data}
ISOBOXD_PID=""
ISOBOXD_LOG=""

die() { echo "error: $*" >&2; exit 1; }

# port_free PORT: nothing listens on 127.0.0.1:PORT.
port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# start_isoboxd [PREFIX...]: starts isoboxd (optionally under e.g. `taskset -c 0`, which
# execs, so $! is isoboxd itself) and waits up to 60 s for GET /readyz to answer 200.
start_isoboxd() {
    [[ -x $ISOBOXD ]] || die "$ISOBOXD missing: run cargo build --release"
    port_free "$BENCH_PORT" || die "127.0.0.1:$BENCH_PORT is already in use"
    mkdir -p "$BENCH_DATA_DIR"
    ISOBOXD_LOG=$(mktemp /tmp/isobox-bench-isoboxd.XXXXXX.log)
    ISOBOX_DATA_DIR=$BENCH_DATA_DIR ISOBOX_INSTANCE=$BENCH_INSTANCE \
        ISOBOX_LISTEN=127.0.0.1:$BENCH_PORT ISOBOX_LOG=warn ISOBOX_MAX_CONCURRENT=16 ISOBOX_WBX_WARM_POOL=off \
        ISOBOX_SHUTDOWN_GRACE_MS=2000 ISOBOX_RATE_PER_MIN=1000000 ISOBOX_RATE_BURST=100000 \
        "$@" "$ISOBOXD" >"$ISOBOXD_LOG" 2>&1 &
    ISOBOXD_PID=$!
    local code="" i
    for ((i = 0; i < 600; i++)); do
        kill -0 "$ISOBOXD_PID" 2>/dev/null || { cat "$ISOBOXD_LOG" >&2; ISOBOXD_PID=""; die "isoboxd exited during startup"; }
        code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$BENCH_PORT/readyz" || true)
        [[ $code == 200 ]] && return 0
        sleep 0.1
    done
    cat "$ISOBOXD_LOG" >&2
    die "isoboxd not ready after 60 s (last /readyz status: ${code:-none})"
}

# stop_isoboxd: SIGTERM, up to 20 s to exit, then SIGKILL; then checks that the cgroup
# slice it created is gone. Safe to call twice.
stop_isoboxd() {
    [[ -n $ISOBOXD_PID ]] || return 0
    local pid=$ISOBOXD_PID i
    ISOBOXD_PID=""
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "warning: isoboxd ($pid) ignored SIGTERM for 20 s; sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
    for ((i = 0; i < 20; i++)); do
        compgen -G "/sys/fs/cgroup/*/$BENCH_INSTANCE" >/dev/null || break
        sleep 0.1
    done
    if compgen -G "/sys/fs/cgroup/*/$BENCH_INSTANCE" >/dev/null; then
        echo "warning: cgroup slice left behind:" /sys/fs/cgroup/*/"$BENCH_INSTANCE" >&2
    fi
    [[ -n $ISOBOXD_LOG ]] && rm -f "$ISOBOXD_LOG"
    return 0
}

# rss_kib PID FIELD: VmRSS / VmHWM of PID in KiB.
rss_kib() {
    awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"
}

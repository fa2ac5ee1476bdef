#!/usr/bin/env bash
# GET /healthz on isoboxd vs nginx serving a static file of the same size, side by side
# in one run: wrk, 64 connections, 10 s per round, 3 alternating rounds (median reported).
# Each server is pinned to one core (SERVER_CPU, default 0) and wrk to the other
# (WRK_CPU, default 1). Also reports isoboxd's idle RSS after startup and after the load.
#
# Usage (root): bash bench/load/http.sh
# Settings: DURATION (s per round, 10), CONNS (64), ROUNDS (3), BENCH_PORT (isoboxd,
# 18099), NGINX_PORT (18098), SERVER_CPU (0), WRK_CPU (1).
set -euo pipefail
# shellcheck source=bench/load/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
ROUNDS=${ROUNDS:-3}
NGINX_PORT=${NGINX_PORT:-18098}
SERVER_CPU=${SERVER_CPU:-0}
WRK_CPU=${WRK_CPU:-1}
NGINX_PID=""
NGX_DIR=""

[[ $(id -u) == 0 ]] || die "run as root (isoboxd needs cgroups and runsc)"
for c in wrk nginx taskset curl; do command -v "$c" >/dev/null || die "$c not found (bench/run.sh installs it)"; done

stop_nginx() {
    [[ -n $NGINX_PID ]] || return 0
    local pid=$NGINX_PID i
    NGINX_PID=""
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    stop_nginx
    stop_isoboxd
    [[ -n $NGX_DIR ]] && rm -rf "$NGX_DIR"
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- isoboxd -----------------------------------------------------------------------
start_isoboxd taskset -c "$SERVER_CPU"
sleep 1
RSS_START=$(rss_kib "$ISOBOXD_PID" VmRSS)
HEALTHZ_BODY=$(curl -sf "http://127.0.0.1:$BENCH_PORT/healthz")
BODY_BYTES=${#HEALTHZ_BODY}

# --- nginx: same-size static file, one worker, loopback only, no access log ---------
port_free "$NGINX_PORT" || die "127.0.0.1:$NGINX_PORT is already in use"
NGX_DIR=$(mktemp -d /tmp/isobox-bench-nginx.XXXXXX)
chmod 755 "$NGX_DIR"
mkdir -p "$NGX_DIR/www" "$NGX_DIR/tmp"
# The body isoboxd just served, so both send the same payload.
printf '%s' "$HEALTHZ_BODY" >"$NGX_DIR/www/healthz"
chmod 644 "$NGX_DIR/www/healthz"
cat >"$NGX_DIR/nginx.conf" <<NGX
worker_processes 1;
daemon off;
pid $NGX_DIR/nginx.pid;
error_log $NGX_DIR/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $NGX_DIR/tmp/body;
    proxy_temp_path $NGX_DIR/tmp/proxy;
    fastcgi_temp_path $NGX_DIR/tmp/fastcgi;
    # isoboxd never closes a busy keep-alive connection; nginx by default does after 1000
    # requests, which would make wrk reconnect and measure connection setup too.
    keepalive_requests 100000000;
    keepalive_timeout 65s;
    server {
        listen 127.0.0.1:$NGINX_PORT;
        root $NGX_DIR/www;
        location = /healthz { default_type application/json; }
    }
}
NGX
nginx -t -q -e "$NGX_DIR/error.log" -p "$NGX_DIR" -c "$NGX_DIR/nginx.conf" || die "nginx config test failed: $(cat "$NGX_DIR/error.log")"
taskset -c "$SERVER_CPU" nginx -e "$NGX_DIR/error.log" -p "$NGX_DIR" -c "$NGX_DIR/nginx.conf" &
NGINX_PID=$!
for ((i = 0; i < 100; i++)); do
    [[ $(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$NGINX_PORT/healthz" || true) == 200 ]] && break
    kill -0 "$NGINX_PID" 2>/dev/null || die "nginx exited: $(cat "$NGX_DIR/error.log")"
    sleep 0.1
done
ISOBOXD_URL="http://127.0.0.1:$BENCH_PORT/healthz"
NGINX_URL="http://127.0.0.1:$NGINX_PORT/healthz"
resp_bytes() { curl -s -i "$1" | wc -c; }
ISO_RESP=$(resp_bytes "$ISOBOXD_URL")
NGX_RESP=$(resp_bytes "$NGINX_URL")

# wrk_run URL SECONDS -> "req/s p50_ms p99_ms errors"
wrk_run() {
    local out
    out=$(timeout $(($2 + 30)) taskset -c "$WRK_CPU" wrk -t1 -c"$CONNS" -d"$2s" --timeout 5s --latency "$1")
    # Other sessions on a shared host may stop our servers; say so instead of printing zeros.
    kill -0 "$ISOBOXD_PID" 2>/dev/null || die "isoboxd exited during the run (signalled from outside?)"
    kill -0 "$NGINX_PID" 2>/dev/null || die "nginx exited during the run: $(cat "$NGX_DIR/error.log")"
    awk '
        function ms(v) {
            if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
            if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
            if (v ~ /s$/) return substr(v, 1, length(v) - 1) * 1000
            return v + 0
        }
        $1 == "50%" { p50 = ms($2) }
        $1 == "99%" { p99 = ms($2) }
        $1 == "Requests/sec:" { rps = $2 }
        /Socket errors:/ { gsub(/,/, ""); err += $4 + $6 + $8 + $10 }
        /Non-2xx or 3xx responses:/ { err += $NF }
        END { printf "%.0f %.3f %.3f %d\n", rps, p50, p99, err + 0 }
    ' <<<"$out"
}

echo "== HTTP: GET /healthz, isoboxd vs nginx (${CONNS} connections, ${DURATION} s x ${ROUNDS} rounds, servers on CPU $SERVER_CPU, wrk on CPU $WRK_CPU)"
echo "   load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# Short warm-up for both, not counted.
wrk_run "$ISOBOXD_URL" 2 >/dev/null
wrk_run "$NGINX_URL" 2 >/dev/null

declare -a ISO_RPS ISO_P50 ISO_P99 NGX_RPS NGX_P50 NGX_P99
ERRORS=0
printf '%-8s %5s %10s %9s %9s %7s\n' server round 'req/s' 'p50 ms' 'p99 ms' errors
for ((r = 1; r <= ROUNDS; r++)); do
    res=$(wrk_run "$ISOBOXD_URL" "$DURATION")
    read -r rps p50 p99 err <<<"$res"
    ISO_RPS+=("$rps"); ISO_P50+=("$p50"); ISO_P99+=("$p99"); ERRORS=$((ERRORS + err))
    printf '%-8s %5d %10d %9.3f %9.3f %7d\n' isoboxd "$r" "$rps" "$p50" "$p99" "$err"
    res=$(wrk_run "$NGINX_URL" "$DURATION")
    read -r rps p50 p99 err <<<"$res"
    NGX_RPS+=("$rps"); NGX_P50+=("$p50"); NGX_P99+=("$p99"); ERRORS=$((ERRORS + err))
    printf '%-8s %5d %10d %9.3f %9.3f %7d\n' nginx "$r" "$rps" "$p50" "$p99" "$err"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
I_RPS=$(median "${ISO_RPS[@]}"); I_P50=$(median "${ISO_P50[@]}"); I_P99=$(median "${ISO_P99[@]}")
N_RPS=$(median "${NGX_RPS[@]}"); N_P50=$(median "${NGX_P50[@]}"); N_P99=$(median "${NGX_P99[@]}")
printf '%-8s %5s %10d %9.3f %9.3f\n' isoboxd median "$I_RPS" "$I_P50" "$I_P99"
printf '%-8s %5s %10d %9.3f %9.3f\n' nginx median "$N_RPS" "$N_P50" "$N_P99"
awk -v a="$I_RPS" -v b="$N_RPS" -v c="$I_P50" -v d="$N_P50" -v e="$I_P99" -v f="$N_P99" \
    'BEGIN { printf "ratio isoboxd/nginx: req/s %.2f  p50 %.2f  p99 %.2f\n", a / b, c / d, e / f }'
echo "response size (headers + body): isoboxd $ISO_RESP B, nginx $NGX_RESP B (body $BODY_BYTES B each)"

sleep 2
RSS_AFTER=$(rss_kib "$ISOBOXD_PID" VmRSS)
HWM=$(rss_kib "$ISOBOXD_PID" VmHWM)
NGX_WORKER=$(pgrep -P "$NGINX_PID" | head -1 || true)
NGX_RSS=$(( $(rss_kib "$NGINX_PID" VmRSS) + ${NGX_WORKER:+$(rss_kib "$NGX_WORKER" VmRSS)}+0 ))
echo "isoboxd RSS: idle after startup $RSS_START KiB, idle after load $RSS_AFTER KiB (peak VmHWM $HWM KiB); nginx master+worker $NGX_RSS KiB"

verdict() { if awk "BEGIN { exit !($2) }"; then echo "goal $1: met"; else echo "goal $1: NOT met"; fi; }
verdict "req/s >= nginx on one core ($I_RPS vs $N_RPS)" "$I_RPS >= $N_RPS"
verdict "p99 < 1 ms at $CONNS connections ($I_P99 ms)" "$I_P99 < 1"
verdict "idle RSS < 10 MiB ($RSS_AFTER KiB after load)" "$RSS_AFTER < 10240 && $RSS_START < 10240"
[[ $ERRORS == 0 ]] || echo "warning: $ERRORS socket errors / non-2xx responses during the runs"

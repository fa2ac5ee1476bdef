#!/usr/bin/env bash
# `make bench`: builds isoboxd (release), installs the load tools when missing (wrk and
# nginx-light from Debian), then runs each load benchmark in bench/load/ side by side
# with its reference and prints one table per benchmark. Every server and sandbox it
# starts is stopped again; the run fails if anything is left behind.
#
# Usage (root): bash bench/run.sh   (or: make bench)
# Knobs are passed through to the scripts: DURATION, ROUNDS, CONNS (http.sh),
# RUNS1, RUNS4 (execute.py), BENCH_PORT, NGINX_PORT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"

[[ $(id -u) == 0 ]] || { echo "bench: run as root (cgroups, chroot and runsc need it)" >&2; exit 1; }
command -v runsc >/dev/null || { echo "bench: runsc not found; run \`make deps\` first" >&2; exit 1; }

POLICY_RC=""
cleanup() {
    [[ -n $POLICY_RC ]] && rm -f "$POLICY_RC"
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || need+=(nginx-light)
if ((${#need[@]})); then
    echo "bench: installing ${need[*]}"
    # Keep the nginx package from starting its system service (on :80) on install:
    # the benchmark runs its own instance on loopback and nothing may stay running.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        POLICY_RC=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' >"$POLICY_RC"
        chmod 755 "$POLICY_RC"
    fi
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi

cargo build --release

echo "== host: $(nproc) CPUs, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), kernel $(uname -r)"
echo "   $(runsc --version | head -1), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2), $(nginx -v 2>&1 | sed 's/.*: //')"
echo "   isoboxd $(git describe --always --dirty 2>/dev/null || echo '?'), $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo

rc=0
bash bench/load/http.sh || rc=1
echo
python3 bench/load/execute.py || rc=1
echo
python3 bench/load/sessions.py || rc=1
echo
python3 bench/load/kv.py || rc=1; echo
python3 bench/load/metrics.py || rc=1; echo
python3 bench/load/batch.py || rc=1; echo
python3 bench/load/egress.py || rc=1; echo
python3 bench/load/kernel.py || rc=1; echo
python3 bench/load/warm.py || rc=1; echo
python3 bench/load/wbx.py || rc=1; echo
cargo bench --bench store || rc=1

# Nothing of ours may be left running.
port=${BENCH_PORT:-18099}
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "bench: something still listens on 127.0.0.1:$port" >&2
    rc=1
fi
if compgen -G "/sys/fs/cgroup/*/${BENCH_INSTANCE:-isobox-bench}" >/dev/null; then
    echo "bench: cgroup slice ${BENCH_INSTANCE:-isobox-bench} left behind" >&2
    rc=1
fi
if [[ -n $(runsc --root /tmp/bench-runsc list -quiet 2>/dev/null) ]]; then
    echo "bench: bare runsc containers left in /tmp/bench-runsc" >&2
    rc=1
fi
exit $rc

#!/usr/bin/env bash
# Builds every fuzz target and runs each for SECONDS (default 60) with libFuzzer.
# Exits non-zero when any target crashes, times out, runs out of memory or fails a
# property, or when a saved regression input (fuzz/regressions/<target>/) still fails.
#
#   fuzz/run.sh [seconds-per-target]
#
# Environment:
#   FUZZ_TARGETS  targets to run (default: all)
#   FUZZ_BUILD    cargo-fuzz (default when `cargo fuzz` is installed) or plain
#                 (libfuzzer-sys + `cargo build`, no sanitizer; needs nothing installed)
#   FUZZ_ARGS     extra libFuzzer flags, e.g. "-max_len=8192"
#   FUZZ_KEEP_GOING=1  fuzz on past a crash (libFuzzer -fork=1 -ignore_crashes=1), so
#                 one known bug does not hide the next; every crash is saved and
#                 listed by its panic location. Still exits non-zero if any was found.
#
# Works on the stable toolchain: cargo-fuzz passes -Zsanitizer=address, which stable
# rustc accepts only with RUSTC_BOOTSTRAP=1 (set here, for this build only).
set -uo pipefail

SECS="${1:-60}"
case "$SECS" in '' | *[!0-9]* | 0) echo "usage: $0 [seconds-per-target > 0]" >&2; exit 2 ;; esac
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE" || exit 2
export PATH="$HOME/.cargo/bin:$PATH"
# Stable only: never pick up a nightly that happens to be installed (or a toolchain
# file): the point is that this works on the toolchain the project uses.
export RUSTUP_TOOLCHAIN="${RUSTUP_TOOLCHAIN:-stable}"
TARGETS=(${FUZZ_TARGETS:-http_request http_chunked http_conn http_relay wire_frames ndjson_stream execute_decode eryx_execute eryx_form job_log wbx_job wbx_batch ws_frames terminal_msg sse_utf8 build_frame fs_normalize kv_cursor search_html egress_sniff route_paths})
TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"

if [ -z "${FUZZ_BUILD:-}" ]; then
    if cargo fuzz --version >/dev/null 2>&1; then FUZZ_BUILD=cargo-fuzz; else FUZZ_BUILD=plain; fi
fi

echo "== building (${FUZZ_BUILD}, $(rustc -V))"
case "$FUZZ_BUILD" in
cargo-fuzz)
    # Release + debug assertions + overflow checks + AddressSanitizer + SanitizerCoverage.
    RUSTC_BOOTSTRAP=1 cargo fuzz build || exit 2
    BIN_DIR="target/$TRIPLE/release"
    ;;
plain)
    # The flags cargo-fuzz would pass, minus the sanitizer (-Z): stable accepts them
    # all. --target keeps them off build scripts and proc macros.
    RUSTFLAGS="--cfg fuzzing -Cdebug-assertions -Coverflow-checks -Cforce-frame-pointers \
-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-sanitizer-coverage-stack-depth \
${RUSTFLAGS:-}" cargo build --release --bins --target "$TRIPLE" --target-dir target/plain || exit 2
    BIN_DIR="target/plain/$TRIPLE/release"
    ;;
*) echo "FUZZ_BUILD must be cargo-fuzz or plain" >&2; exit 2 ;;
esac

failed=()
summary=()
for t in "${TARGETS[@]}"; do
    bin="$BIN_DIR/$t"
    [ -x "$bin" ] || { echo "no binary $bin" >&2; failed+=("$t(missing)"); continue; }
    mkdir -p "target/corpus/$t" "artifacts/$t" "corpus/$t"
    # Saved crashes must not crash any more (each file is run once).
    if compgen -G "regressions/$t/*" >/dev/null; then
        echo "== $t: replaying regressions/$t/"
        if ! "$bin" -runs=0 regressions/"$t"/* >"target/$t.regressions.log" 2>&1; then
            echo "!! $t: a saved regression input still fails (see fuzz/target/$t.regressions.log)"
            grep -m3 -E "panicked at|^thread" "target/$t.regressions.log" | sed 's/^/   /'
            failed+=("$t(regression)")
        fi
    fi
    dict=()
    [ -f "dict/$t.dict" ] && dict=("-dict=dict/$t.dict")
    echo "== $t: fuzzing for ${SECS}s"
    before=$(find "artifacts/$t" -type f | wc -l)
    mode=()
    [ "${FUZZ_KEEP_GOING:-0}" = 1 ] && mode=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
    # New inputs go to target/corpus/ (ignored); corpus/ holds the committed seeds.
    # shellcheck disable=SC2086
    "$bin" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="artifacts/$t/" "${mode[@]}" "${dict[@]}" ${FUZZ_ARGS:-} \
        "target/corpus/$t" "corpus/$t" >"target/$t.log" 2>&1
    rc=$?
    found=$(( $(find "artifacts/$t" -type f | wc -l) - before ))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "target/$t.log" | tail -1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "target/$t.log" | tail -1)
    if [ -z "$speed" ]; then # fork mode: "#N: cov: .. exec/s: N oom/timeout/crash: ..."
        last=$(grep -E '^#[0-9]+: cov:' "target/$t.log" | tail -1)
        execs=$(sed -nE 's/^#([0-9]+):.*/\1/p' <<<"$last")
        speed=$(sed -nE 's/.* exec\/s: ([0-9]+).*/\1/p' <<<"$last")
    fi
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "target/$t.log" | tail -1)
    if [ "$rc" -eq 0 ] && [ "$found" -le 0 ]; then
        result="ok"
    else
        failed+=("$t")
        art=$(grep -oE "artifacts/$t/[a-z-]+-[0-9a-f]+" "target/$t.log" | tail -1)
        result="FOUND (exit $rc, $found new in fuzz/artifacts/$t/) ${art:-}"
        echo "!! $t: $result"
        if [ "${FUZZ_KEEP_GOING:-0}" = 1 ]; then
            # Distinct panic sites among everything saved for this target.
            for a in artifacts/"$t"/*; do
                "$bin" "$a" 2>&1 | grep -m1 -A1 "panicked at" | sed -E 's/^thread .* panicked at //; s/\(.*/(/; s/ at [0-9]+.*//' | paste -sd' '
            done | sort | uniq -c | sed 's/^/   /'
        else
            grep -m3 -E "panicked at|^thread|ERROR: (libFuzzer|AddressSanitizer)" "target/$t.log" | sed 's/^/   /'
        fi
    fi
    summary+=("$(printf '%-15s execs=%-10s exec/s=%-8s %-32s %s' "$t" "${execs:-?}" "${speed:-?}" "${cov:-}" "$result")")
done

echo
echo "== summary (${SECS}s per target; logs in fuzz/target/<target>.log)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED: ${failed[*]}"
    echo "Crashing inputs are in fuzz/artifacts/<target>/; replay one with"
    echo "  $BIN_DIR/<target> fuzz/artifacts/<target>/crash-..."
    exit 1
fi
echo "no crashes"

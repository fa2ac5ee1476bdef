#!/usr/bin/env python3
"""gVisor's platforms side by side: bare `runsc run` on ptrace and on systrap, alternating.

Which platform isoboxd uses by default (`ISOBOX_PLATFORM`) is chosen by this
measurement, not assumed (issue 21): on a many-core host systrap is gVisor's own
default; on a small VM ptrace may be faster. For each runtime whose root filesystem is
built (python-slim always; javascript when the `node` tree exists) and for a
syscall-heavy Python program (3,000 file operations), the same bundle as
bench/load/execute.py's bare runsc is run on each platform in turn, one run at a time,
alternating (each first every other time), so both see the same host. Reports wall latency p50/p90/mean and host
CPU-seconds per run (the whole host's busy time across the run, from /proc/stat), and
the ratio systrap/ptrace.

Usage (root): python3 bench/load/runsc_platforms.py [--runs 20]   (ISOBOX_RUNSC picks the binary)
Python 3.11 standard library only.
"""

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("execute", os.path.join(HERE, "execute.py"))
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)

PLATFORMS = ("ptrace", "systrap")
FILE_OPS = (
    "import os\n"
    "for i in range(1000):\n"
    "    p = f'/tmp/f{i}'\n"
    "    with open(p, 'w') as f: f.write('x')\n"
    "    os.stat(p)\n"
    "    os.remove(p)\n"
    "print(1)\n"
)


def run(rt, platform):
    cid = "isobox-benchplat-" + uuid.uuid4().hex[:12]
    bundle = ex.write_bundle(rt)
    try:
        argv = [ex.RUNSC, "--root", ex.RUNSC_ROOT, f"--platform={platform}", "--network=none", "run", "--bundle", bundle, cid]
        c0 = ex.busy_seconds()
        t0 = time.perf_counter()
        p = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=ex.TIMEOUT_S)
        dt = time.perf_counter() - t0
        # The sandbox's processes have exited with `runsc run`; a short settle lets the
        # host account their last ticks to this run.
        time.sleep(0.05)
        cpu = ex.busy_seconds() - c0
        if p.returncode != 0 or p.stdout.decode() != ex.EXPECTED:
            raise ex.Failure(f"{platform}: exit {p.returncode} stdout {p.stdout[:80]!r} stderr {p.stderr[-300:]!r}")
        return dt * 1000, cpu
    finally:
        shutil.rmtree(bundle, ignore_errors=True)


def pct(xs, p):
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, -(-len(s) * p // 100) - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=int(os.environ.get("RUNS", "20")), help="runs per platform and program")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (runsc needs it)")
    os.makedirs(ex.RUNSC_ROOT, exist_ok=True)
    version = (subprocess.run([ex.RUNSC, "--version"], capture_output=True, text=True).stdout.splitlines() or ["(no version)"])[0]
    print(f"{ex.RUNSC}: {version}; {os.cpu_count()} CPUs; {args.runs} runs per platform, alternating")
    cases = []
    for rt in ex.runtimes_to_bench():
        cases.append((f"{rt['language']} hello", rt))
        if rt["language"] == "python-slim":
            cases.append(("python-slim 3,000 file ops", dict(rt, code=FILE_OPS)))
    print(f"{'program':<28} {'platform':<8} {'p50 ms':>8} {'p90 ms':>8} {'mean ms':>8} {'CPU-s/run':>10}")
    failed = 0
    for name, rt in cases:
        got = {p: ([], []) for p in PLATFORMS}
        for i in range(args.runs):
            # Each goes first every other time: neither always follows the other.
            for p in PLATFORMS if i % 2 == 0 else PLATFORMS[::-1]:
                try:
                    ms, cpu = run(rt, p)
                    got[p][0].append(ms)
                    got[p][1].append(cpu)
                except (ex.Failure, subprocess.TimeoutExpired) as e:
                    failed += 1
                    print(f"  failure: {e}", file=sys.stderr)
        for p in PLATFORMS:
            lat, cpu = got[p]
            if lat:
                print(f"{name:<28} {p:<8} {pct(lat, 50):>8.1f} {pct(lat, 90):>8.1f} {sum(lat) / len(lat):>8.1f} {sum(cpu) / len(cpu):>10.3f}")
        (a, ac), (b, bc) = got["ptrace"], got["systrap"]
        if a and b:
            print(f"{'':<28} systrap/ptrace: p50 {pct(b, 50) / pct(a, 50):.2f}x, CPU {sum(bc) / len(bc) / (sum(ac) / len(ac)):.2f}x")
    left = subprocess.run([ex.RUNSC, "--root", ex.RUNSC_ROOT, "list", "-quiet"], capture_output=True, text=True).stdout.split()
    for cid in left:
        subprocess.run([ex.RUNSC, "--root", ex.RUNSC_ROOT, "delete", "--force", cid], capture_output=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

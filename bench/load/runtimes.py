#!/usr/bin/env python3
"""The runtimes before and after issue 21 (Debian 12's against Debian 13's, TypeScript 7,
Go's prebuilt build cache, matplotlib's prebuilt font list), side by side in one run, on
ptrace and on systrap.

"before" is the runtimes of a reference commit (--before, default 98bbe09: Debian 12
trees, tsc 4.8, Go 1.19): its own runtimes/rootfs/build.sh and package lists (taken with
`git archive`) build its trees into /var/lib/isobox/bench-rootfs/bookworm (stamped, so a
second run builds nothing), and its descriptors are given to isoboxd with
ISOBOX_RUNTIMES_DIR. "after" is this checkout's descriptors (embedded in the binary) and
the trees in /var/lib/isobox/rootfs (`make runtimes`). Both sides run the SAME isoboxd
binary (--binary, default target/release/isoboxd), so the table shows what the runtimes
changed, nothing else.

For each platform (ptrace, systrap), four daemons run at once: before-cold and
after-cold (ISOBOX_WARM_POOL=off) and before-warm and after-warm
(ISOBOX_WARM_POOL=python-slim=1), each with its own ISOBOX_INSTANCE, data dir and
loopback port, ISOBOX_EGRESS=off, ISOBOX_PLATFORM set (bench/load/compare.py's Daemon).
Then, one request at a time, before and after alternate (each first every other time),
--runs times per program (after 1 untimed warm-up each):

  python-slim print(1)      cold
  python-slim print(1)      warm: a pooled sandbox; before each run (untimed) the pool is
                            waited for until it is full again (bench/load/warm.py's
                            "warm idle"), and every timed run must be a hit
  javascript console.log(1) cold
  typescript hello world    cold (build + run)
  go hello world            cold (build + run)
  rust hello world          cold (build + run)
  matplotlib plot           cold: python, `plt.plot` and `savefig` of a PNG

Every run must exit 0 with the expected stdout. Columns: p50 of the request's wall time
(connect to last byte, ms), p50 of the build (`compile.durationMs`) where there is one,
and after/before of the wall p50. The versions each side ran are printed above the
table.

Usage (root, from the repository, after `make build runtimes`):

    python3 bench/load/runtimes.py [--runs 7] [--before 98bbe09] [--platforms ptrace,systrap]

Python 3.11 standard library only.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as cmp  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BEFORE_TREES = "/var/lib/isobox/bench-rootfs/bookworm"
BEFORE_NAMES = ("python-slim", "python", "node", "go", "rust")

PROGRAMS = [
    # (row, language, code, expected stdout, warm)
    ("python-slim print(1)", "python-slim", "print(1)", "1\n", False),
    ("python-slim print(1), warm", "python-slim", "print(1)", "1\n", True),
    ("javascript console.log(1)", "javascript", "console.log(1)", "1\n", False),
    ("typescript hello", "typescript", "const s: string = 'hello';\nconsole.log(s);", "hello\n", False),
    ("go hello", "go", 'package main\nimport "fmt"\nfunc main() { fmt.Println("hello") }\n', "hello\n", False),
    ("rust hello", "rust", 'fn main() { println!("hello"); }\n', "hello\n", False),
    (
        "matplotlib plot",
        "python",
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.savefig('/tmp/p.png')\nprint('png')",
        "png\n",
        False,
    ),
]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def prepare_before(rev):
    """The reference commit's runtimes directory, its trees built; returns the descriptors' dir."""
    src = tempfile.mkdtemp(prefix="isobox-bench-before-")
    archive = subprocess.run(["git", "-C", REPO, "archive", rev, "runtimes"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    for name in BEFORE_NAMES:
        log(f"before ({rev}): tree {name}")
        subprocess.run([os.path.join(src, "runtimes/rootfs/build.sh"), name, os.path.join(BEFORE_TREES, name)], check=True)
    return os.path.join(src, "runtimes")


def once(d, language, code, expected):
    body = json.dumps({"language": language, "code": code, "network": False}).encode()
    t0 = time.perf_counter()
    st, data = d.request("POST", "/execute", body=body, headers={"Content-Type": "application/json"})
    dt = (time.perf_counter() - t0) * 1000
    if st != 200:
        raise cmp.Failure(f"{d.side}: {language}: POST /execute {st}: {data[:300]!r}")
    r = json.loads(data)
    if r["run"].get("exitCode") != 0 or r["run"].get("stdout") != expected:
        raise cmp.Failure(f"{d.side}: {language}: {json.dumps(r)[:600]}")
    return dt, (r.get("compile") or {}).get("durationMs"), r["version"]


def pool_full(d):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        w = (d.health().get("warmPool") or {}).get("runtimes", {}).get("python-slim") or {}
        if w.get("ready", 0) >= w.get("target", 1):
            time.sleep(0.2)  # the previous run's teardown
            return
        time.sleep(0.05)
    raise cmp.Failure(f"{d.side}: the python-slim pool did not refill in 120 s")


def hits(d):
    return (d.health().get("warmPool") or {}).get("hits", 0)


def measure(platform, daemons, runs):
    rows = []
    versions = {}
    for row, lang, code, expected, warm in PROGRAMS:
        pair = [daemons[("before", warm)], daemons[("after", warm)]]
        samples = {"before": [], "after": []}
        for d in pair:
            if warm:
                pool_full(d)
            once(d, lang, code, expected)  # warm-up, untimed
        for i in range(runs):
            for d in pair if i % 2 == 0 else reversed(pair):
                side = d.side.split("-")[0]
                if warm:
                    pool_full(d)
                    h = hits(d)
                dt, compile_ms, version = once(d, lang, code, expected)
                if warm and hits(d) != h + 1:
                    raise cmp.Failure(f"{d.side}: a warm run missed the pool")
                samples[side].append((dt, compile_ms))
                versions[(side, lang)] = version
        p50 = {}
        for side in ("before", "after"):
            wall = cmp.percentile([s[0] for s in samples[side]], 50)
            builds = [s[1] for s in samples[side] if s[1] is not None]
            p50[side] = (wall, cmp.percentile(builds, 50) if builds else None)
        rows.append((platform, row, p50))
        log(f"{platform} {row}: before {p50['before'][0]:.0f} ms, after {p50['after'][0]:.0f} ms")
    return rows, versions


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--before", default="98bbe09")
    ap.add_argument("--binary", default=os.path.join(REPO, "target/release/isoboxd"))
    ap.add_argument("--platforms", default="ptrace,systrap")
    a = ap.parse_args()
    before_runtimes = prepare_before(a.before)
    try:
        return bench(a, before_runtimes)
    finally:
        shutil.rmtree(os.path.dirname(before_runtimes), ignore_errors=True)


def bench(a, before_runtimes):
    all_rows, versions = [], {}
    port = 18700
    problems = []
    for platform in a.platforms.split(","):
        daemons = {}
        try:
            for side in ("before", "after"):
                env = {"ISOBOX_PLATFORM": platform}
                if side == "before":
                    env.update(ISOBOX_RUNTIMES_DIR=before_runtimes, ISOBOX_ROOTFS_DIR=BEFORE_TREES)
                for warm in (False, True):
                    port += 1
                    name = f"{side}-{'warm' if warm else 'cold'}"
                    d = cmp.Daemon(name, a.binary, f"isobox-rt-{name}", port, "python-slim=1" if warm else "off", env=env)
                    daemons[(side, warm)] = d.start()
            rows, v = measure(platform, daemons, a.runs)
            all_rows += rows
            versions.update(v)
        finally:
            for d in daemons.values():
                problems += d.stop()
    print(f"runtimes before ({a.before}) and after, {a.runs} runs each, p50 ms; load average {cmp.loadavg()}")
    for side in ("before", "after"):
        print(f"  {side}: " + ", ".join(f"{lang} {v}" for (s, lang), v in sorted(versions.items()) if s == side))
    print()
    print("| platform | program | before wall | before build | after wall | after build | after/before |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for platform, row, p50 in all_rows:
        (bw, bb), (aw, ab) = p50["before"], p50["after"]
        fmt = lambda v: "–" if v is None else f"{v:.0f}"  # noqa: E731
        print(f"| {platform} | {row} | {bw:.0f} | {fmt(bb)} | {aw:.0f} | {fmt(ab)} | {aw / bw:.2f}× |")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cmp.Failure as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)

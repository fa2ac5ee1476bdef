#!/usr/bin/env python3
"""Fast starts: /execute warm (pooled sandbox) and cold, beside native and bare runsc.

One table. For `python-slim` `print(1)` (and `javascript` `console.log(1)` when the node
tree is built), at concurrency 1, 4 and 16, each of:

  native       chroot ROOTFS INTERPRETER -c/-e PROGRAM      (bench/load/execute.py)
  bare runsc   runsc run of the same bundle isoboxd writes  (bench/load/execute.py)
  cold         POST /execute on an isoboxd with ISOBOX_WARM_POOL=off
  warm         POST /execute on an isoboxd with ISOBOX_WARM_POOL=python-slim=POOL,javascript=POOL,
               back to back (sustained: the pool drains when refills cannot keep up)
  warm idle    the same at concurrency 1, waiting (untimed) before each run until the
               pool is full again: what a request sees after a pause

Both daemons run at once (instances isobox-bench-warm and isobox-bench-cold, ephemeral
loopback ports); before each warm block the pool is waited for until full, and after it
until it has refilled, so the refill's CPU is inside the block's CPU figure. Columns:
p50 and p99 latency (ms, connect to last byte), sustained runs/s (runs / wall time of
the block), CPU seconds per execution (the whole host's, from /proc/stat, over the
block, refill included), and for warm the pool's hits in the block. Ratios to native
and to bare runsc follow.

With --compiled N, a second table: go, rust and typescript programs printing 1, N runs
each at concurrency 1, cold against "warm idle" on a third isoboxd with
ISOBOX_WARM_POOL=go=1,rust=1,typescript=1 (the pooled sandbox saves the boot; the
compile still runs per request).

Usage (root): python3 bench/load/warm.py [--runs 40] [--pool 2] [--compiled 8]
(--runs 0: only the compiled table)
"""

import argparse
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import execute as ex  # noqa: E402
import sessions as base  # noqa: E402


def cpu_seconds():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal: all but idle and iowait
    busy = sum(v[:8]) - v[3] - v[4]
    return busy / os.sysconf("SC_CLK_TCK")


def start(instance, pool):
    base.INSTANCE = instance
    data_dir = f"/tmp/{instance}-{os.getpid()}"
    os.environ["ISOBOX_WARM_POOL"] = pool
    os.environ["ISOBOX_MAX_CONCURRENT"] = "16"
    proc, log, url = base.start_isoboxd(data_dir)
    return {"proc": proc, "log": log, "url": url, "data_dir": data_dir, "instance": instance}


def health(d):
    with urllib.request.urlopen(d["url"] + "/healthz", timeout=10) as r:
        return json.load(r)


def wait_pool(d, n, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        w = health(d).get("warmPool", {})
        if all(r.get("ready") == n for r in w.get("runtimes", {}).values()):
            return w
        time.sleep(0.05)
    raise ex.Failure(f"pool did not reach {n}: {health(d).get('warmPool')}")


def wait_ready(d):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(d["url"] + "/readyz", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise ex.Failure("isoboxd never became ready")


def via(d):
    host, port = d["url"].rsplit("//", 1)[1].split(":")

    def run(rt):
        ex.PORT = int(port)
        return ex.run_isoboxd(rt)

    return run


def block(fn, rt, runs, conc, before=None, after=None):
    if before:
        before()
    c0 = cpu_seconds()
    r = ex.measure(fn, rt, runs, conc)
    extra = after() if after else None
    r["cpu"] = (cpu_seconds() - c0) / max(1, len(r["lat"]))
    r["extra"] = extra
    return r


def row(lang, mode, conc, r):
    lat = r["lat"]
    if not lat:
        return f"{lang:<12} {mode:<11} {conc:>3}   all {r['runs']} runs failed: {r['errors'][:1]}"
    extra = f"  {r['extra']}" if r.get("extra") else ""
    return (
        f"{lang:<12} {mode:<11} {conc:>3} {len(lat):>4} {ex.percentile(lat, 50):>8.1f} {ex.percentile(lat, 99):>8.1f} "
        f"{r['rps']:>7.2f} {r['cpu']:>7.3f}{extra}"
    )


COMPILED = {
    "go": 'package main\nimport "fmt"\nfunc main() { fmt.Println(1) }',
    "rust": 'fn main() { println!("1"); }',
    "typescript": "const x: number = 1;\nconsole.log(x);",
}


def compiled(runs, cold, daemons, problems):
    """Compiled runtimes, c=1: cold against a full pool of one per runtime."""
    # Offline runs only: no networked pools to wait for (and no second firewall).
    os.environ["ISOBOX_EGRESS"] = "off"
    try:
        warm = start("isobox-bench-wcomp", "go=1,rust=1,typescript=1")
    finally:
        del os.environ["ISOBOX_EGRESS"]
    daemons.append(warm)
    wait_ready(warm)
    wait_pool(warm, 1)
    print(f"== compiled runtimes: {runs} runs each at c=1; load average before: {ex.loadavg()}")
    print(f"{'runtime':<12} {'mode':<11} {'c':>3} {'ok':>4} {'p50 ms':>8} {'p99 ms':>8} {'runs/s':>7} {'cpu s':>7}")
    run_warm = via(warm)

    def idle(rt):
        wait_pool(warm, 1)
        return run_warm(rt)

    for lang, code in COMPILED.items():
        rt = {"language": lang, "code": code}
        p50 = {}
        for mode, fn in (("cold", via(cold)), ("warm idle", idle)):
            r = block(fn, rt, runs, 1)
            print(row(lang, mode, 1, r), flush=True)
            problems += [f"{lang} {mode}: {e}" for e in r["errors"][:3]]
            if r["lat"]:
                p50[mode] = ex.percentile(r["lat"], 50)
        if len(p50) == 2:
            print(f"   {lang:<12} warm idle /cold {p50['warm idle'] / p50['cold']:.2f}x (saves {p50['cold'] - p50['warm idle']:.0f} ms at p50)")
    print(f"compiled pool at the end: {health(warm).get('warmPool')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=int(os.environ.get("WARM_RUNS", "40")))
    ap.add_argument("--pool", type=int, default=int(os.environ.get("WARM_POOL", "2")))
    ap.add_argument("--compiled", type=int, default=0, help="runs per compiled runtime (0: skip)")
    args = ap.parse_args()
    daemons, problems, results = [], [], {}
    os.makedirs(ex.RUNSC_ROOT, exist_ok=True)
    try:
        # The native and bare runs join cgroups of the bench's own (execute.py's exact
        # CPU per mode needs them since 9ac6cc4; without them those modes failed).
        for mode in ("native", "bare runsc"):
            ex.MODE_CG[mode] = ex.BenchCgroup(f"isobox-bench-{mode.replace(' ', '-')}-{os.getpid()}")
        warm = start("isobox-bench-warm", f"python-slim={args.pool},javascript={args.pool}")
        daemons.append(warm)
        cold = start("isobox-bench-cold", "off")
        daemons.append(cold)
        for d in daemons:
            wait_ready(d)
        wait_pool(warm, args.pool)
        rts = ex.runtimes_to_bench()
        print(
            f"== warm pool: /execute hello world, {args.runs} runs per block, pools python-slim={args.pool} and javascript={args.pool}; "
            f"load average before: {ex.loadavg()}"
        )
        print(f"{'runtime':<12} {'mode':<11} {'c':>3} {'ok':>4} {'p50 ms':>8} {'p99 ms':>8} {'runs/s':>7} {'cpu s':>7}")
        for rt in rts if args.runs > 0 else []:
            for conc in (1, 4, 16):
                runs = max(args.runs, conc * 2)
                modes = [("native", ex.run_native, None, None), ("bare runsc", ex.run_bare_runsc, None, None), ("cold", via(cold), None, None)]
                if rt["language"] in ("python-slim", "javascript"):
                    hits0 = {}

                    def before(hits0=hits0):
                        hits0["h"] = wait_pool(warm, args.pool)["hits"]

                    def after(hits0=hits0):
                        w = wait_pool(warm, args.pool)
                        return f"hits {w['hits'] - hits0['h']}/{runs}"

                    modes.append(("warm", via(warm), before, after))
                    if conc == 1:
                        # The latency a request sees when the pool had time to refill:
                        # before each run, wait (not timed) until it is full.
                        run_warm = via(warm)

                        def idle(rt, run_warm=run_warm):
                            wait_pool(warm, args.pool)
                            return run_warm(rt)

                        def idle_before(hits0=hits0):
                            hits0["h"] = wait_pool(warm, args.pool)["hits"]

                        modes.append(("warm idle", idle, idle_before, after))
                for mode, fn, b, a in modes:
                    r = block(fn, rt, runs, conc, b, a)
                    results[(rt["language"], mode, conc)] = r
                    print(row(rt["language"], mode, conc, r), flush=True)
                    for e in r["errors"][:3]:
                        problems.append(f"{rt['language']} {mode} c={conc}: {e}")
        print("ratios (p50 latency):")
        for (lang, mode, conc), r in sorted(results.items()):
            if mode not in ("warm", "warm idle", "cold") or not r["lat"]:
                continue
            nat = results.get((lang, "native", conc))
            bare = results.get((lang, "bare runsc", conc))
            p = ex.percentile(r["lat"], 50)
            parts = []
            if nat and nat["lat"]:
                parts.append(f"/native {p / ex.percentile(nat['lat'], 50):.2f}x")
            if bare and bare["lat"]:
                parts.append(f"/bare runsc {p / ex.percentile(bare['lat'], 50):.2f}x")
            cold_r = results.get((lang, "cold", conc))
            if mode.startswith("warm") and cold_r and cold_r["lat"]:
                parts.append(f"/cold {p / ex.percentile(cold_r['lat'], 50):.2f}x")
            print(f"   {lang:<12} {mode:<9} c={conc:<3} " + "  ".join(parts))
        print(f"warm pool at the end: {health(warm).get('warmPool')}")
        if args.compiled:
            compiled(args.compiled, cold, daemons, problems)
        print(f"load average after: {ex.loadavg()}")
    except ex.Failure as e:
        problems.append(str(e))
    finally:
        for d in daemons:
            base.INSTANCE = d["instance"]
            problems += base.stop_isoboxd(d["proc"], d["data_dir"])
        ex.delete_bare_containers()
        for cg in ex.MODE_CG.values():
            cg.remove()
    for p in problems:
        print(f"   FAIL: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

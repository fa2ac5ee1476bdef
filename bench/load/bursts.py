#!/usr/bin/env python3
"""Bursts against the warm pool: a pool of fixed size beside one sized from its bursts.

An agent-like load: BURST python-slim `print(1)` at once, a pause of GAP seconds, again,
ROUNDS times. Two isoboxd run side by side (own instances, ephemeral loopback ports),
each with `ISOBOX_WARM_POOL=python-slim=POOL`:

  fixed      ISOBOX_WARM_POOL_CPU=0: the pool never grows (what isoboxd did before
             pool sizes followed bursts)
  adaptive   ISOBOX_WARM_POOL_MAX=python-slim=MAX and the default CPU budget: the pool
             grows to the bursts it saw in the last minute (`sandbox/pool_size.rs`)

Each round sends the burst to one daemon, then to the other (the order alternates), so
both see the same host. Columns: runs, pool hits and misses, latency p50 / p90 / max
(ms, connect to last byte), the pool's refill CPU per run (`refillCpuSeconds` from
/healthz over the rounds), and all the CPU per run: every sandbox of the daemon's
instance (cold starts, refills, the runs; its cgroup's usage, which keeps what removed
sandboxes used) plus isoboxd's own process. The first round is the adaptive pool's
lesson; the table also shows the rounds after it alone.

Usage (root): python3 bench/load/bursts.py [--rounds 12] [--burst 4] [--gap 3] [--pool 1] [--max 4]
"""

import argparse
import concurrent.futures as cf
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import execute as ex  # noqa: E402
import sessions as base  # noqa: E402
import warm as w  # noqa: E402

RT = {"language": "python-slim", "code": "print(1)"}


def start(instance, pool, extra):
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        return w.start(instance, pool)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cpu(d):
    """CPU-seconds so far of the daemon's sandboxes (its instance's cgroup, v1 cpuacct or
    v2 cpu.stat) and of its own process."""
    v1 = f"/sys/fs/cgroup/cpuacct/{d['instance']}/cpuacct.usage"
    if os.path.exists(v1):
        with open(v1) as f:
            boxes = int(f.read()) / 1e9
    else:
        with open(f"/sys/fs/cgroup/{d['instance']}/cpu.stat") as f:
            boxes = int(dict(l.split() for l in f)["usage_usec"]) / 1e6
    with open(f"/proc/{d['proc'].pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return boxes + own


def fire(d, n):
    run = w.via(d)
    with cf.ThreadPoolExecutor(max_workers=n) as pool:
        futs = [pool.submit(run, RT) for _ in range(n)]
        return [f.result()[0] * 1000 for f in futs]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--burst", type=int, default=4)
    ap.add_argument("--gap", type=float, default=3.0, help="seconds between one daemon's bursts and the next's")
    ap.add_argument("--pool", type=int, default=1)
    ap.add_argument("--max", type=int, default=4)
    a = ap.parse_args()
    daemons, problems = [], []
    try:
        pool = f"python-slim={a.pool}"
        fixed = start("isobox-bench-fixed", pool, {"ISOBOX_WARM_POOL_CPU": "0"})
        daemons.append(fixed)
        adaptive = start("isobox-bench-adapt", pool, {"ISOBOX_WARM_POOL_MAX": f"python-slim={a.max}"})
        daemons.append(adaptive)
        for d in daemons:
            w.wait_ready(d)
            w.wait_pool(d, a.pool)
        named = {"fixed": fixed, "adaptive": adaptive}
        lat = {k: [] for k in named}
        first = {k: 0 for k in named}
        h0 = {k: w.health(d)["warmPool"] for k, d in named.items()}
        c0 = {k: cpu(d) for k, d in named.items()}
        print(f"== bursts: {a.rounds} rounds of {a.burst} python-slim print(1) at once, {a.gap} s apart, "
              f"pool python-slim={a.pool} (adaptive: max {a.max}); load average before: {ex.loadavg()}")
        for i in range(a.rounds):
            order = ["fixed", "adaptive"] if i % 2 == 0 else ["adaptive", "fixed"]
            for k in order:
                lat[k] += fire(named[k], a.burst)
                if i == 0:
                    first[k] = len(lat[k])
                time.sleep(a.gap)
        print(f"{'pool':<9} {'rounds':<7} {'runs':>5} {'hits':>5} {'misses':>6} {'p50 ms':>8} {'p90 ms':>8} "
              f"{'max ms':>8} {'refill cpu s/run':>17} {'all cpu s/run':>14}")
        time.sleep(5)  # the last refills end inside the figures
        h1 = {k: w.health(d)["warmPool"] for k, d in named.items()}
        c1 = {k: cpu(d) for k, d in named.items()}
        p50 = {}
        for k in named:
            hits = h1[k]["hits"] - h0[k]["hits"]
            misses = h1[k]["misses"] - h0[k]["misses"]
            refill = (h1[k]["refillCpuSeconds"] - h0[k]["refillCpuSeconds"]) / max(1, len(lat[k]))
            total = (c1[k] - c0[k]) / max(1, len(lat[k]))
            xs = lat[k]
            print(f"{k:<9} {'all':<7} {len(xs):>5} {hits:>5} {misses:>6} {ex.percentile(xs, 50):>8.1f} "
                  f"{ex.percentile(xs, 90):>8.1f} {max(xs):>8.1f} {refill:>17.3f} {total:>14.3f}")
            later = xs[first[k]:]
            p50[k] = ex.percentile(later, 50)
            print(f"{k:<9} {'2nd on':<7} {len(later):>5} {'':>5} {'':>6} {p50[k]:>8.1f} "
                  f"{ex.percentile(later, 90):>8.1f} {max(later):>8.1f}")
        print(f"adaptive / fixed, rounds 2 on: p50 {p50['adaptive'] / p50['fixed']:.2f}x")
        print(f"adaptive pool at the end: {h1['adaptive']['runtimes']}, growth {h1['adaptive']['growth']}, "
              f"budget {h1['adaptive']['refillCpuBudget']} CPU-s/s, refill CPU in the window "
              f"{h1['adaptive']['refillCpuLastMinute']} s")
        print(f"load average after: {ex.loadavg()}")
    except ex.Failure as e:
        problems.append(str(e))
    finally:
        for d in daemons:
            base.INSTANCE = d["instance"]
            problems += base.stop_isoboxd(d["proc"], d["data_dir"])
    for p in problems:
        print(f"   FAIL: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

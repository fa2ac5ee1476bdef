#!/usr/bin/env python3
"""Memory KV: two (or more) isoboxd binaries against each other, alternating.

The server half of `kv.py` (its `start_isoboxd`, `populate`, `wrk_run` and
`store_figures`, so the same settings, checks and CPU accounting): for each round and
each binary in turn, a fresh daemon on SERVER_CPU, 1000 keys of 100 B PUT and checked,
a 1 s warm-up, then a DURATION-second wrk run per operation (every response checked as
in `kv.py`), PUT runs with the writer's writes per commit from `/healthz`. Prints
every run, then the median of the rounds per binary and operation. No Redis: for the
ratio to Redis run `kv.py` itself; this is for telling two builds apart on a host
whose disk flushes vary from minute to minute (alternating puts both under the same
minutes).

Usage (root): python3 bench/load/kv_ab.py BINARY_A BINARY_B [...]
Settings (environment): OPS ("GET,PUT"), ROUNDS (3), DURATION (5), KV_SIZE (100), and
kv.py's KV_KEYS, KV_CONNS, SERVER_CPU, WRK_CPU.
Python 3.11 standard library only.
"""

import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv  # noqa: E402

OPS = os.environ.get("OPS", "GET,PUT").split(",")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
DURATION = int(os.environ.get("DURATION", "5"))
SIZE = int(os.environ.get("KV_SIZE", "100"))


def main():
    bins = sys.argv[1:]
    if not bins or any(not os.access(b, os.X_OK) for b in bins):
        sys.exit("usage: python3 bench/load/kv_ab.py BINARY_A BINARY_B [...] (executables)")
    kv.ensure_tools()
    with tempfile.NamedTemporaryFile("w", prefix="isobox-bench-kv-", suffix=".lua", delete=False) as f:
        f.write(kv.WRK_LUA)
        lua = f.name
    res = {(b, o): [] for b in bins for o in OPS}
    try:
        for r in range(1, ROUNDS + 1):
            for b in bins:
                kv.ISOBOXD = b
                data_dir = f"/tmp/isobox-bench-kvab-{os.getpid()}"
                proc, _log, host, port = kv.start_isoboxd(data_dir)
                try:
                    url = f"http://{host}:{port}"
                    kv.populate(host, port, "ab", SIZE)
                    for op in OPS:
                        kv.wrk_run(lua, url, op, "ab", SIZE, 1, proc.pid, 0)
                        before = kv.store_figures(host, port)
                        x = kv.wrk_run(lua, url, op, "ab", SIZE, DURATION, proc.pid, r)
                        after = kv.store_figures(host, port)
                        commits = after["commits"] - before["commits"]
                        x["wpc"] = (after["writes"] - before["writes"]) / max(commits, 1)
                        res[(b, op)].append(x)
                        wpc = f"  {x['wpc']:.1f} writes/commit" if op == "PUT" else ""
                        print(f"{r} {b} {op}: {x['rps']:.0f} req/s, p50 {x['p50']:.3f} ms, p99 {x['p99']:.3f} ms, "
                              f"{x['cpu_us']:.1f} us CPU/req, client {x['client']:.0f} %{wpc}", flush=True)
                finally:
                    kv.stop(proc, "isoboxd")
                    shutil.rmtree(data_dir, ignore_errors=True)
    finally:
        os.unlink(lua)
    print(f"== median of {ROUNDS} rounds")
    for (b, op), xs in res.items():
        med = lambda k: statistics.median(x[k] for x in xs)  # noqa: E731
        print(f"{b} {op}: {med('rps'):.0f} req/s, p99 {med('p99'):.3f} ms, {med('cpu_us'):.1f} us CPU/req"
              + (f", {med('wpc'):.1f} writes/commit" if op == "PUT" else ""))


if __name__ == "__main__":
    main()

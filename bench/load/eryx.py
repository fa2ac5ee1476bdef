#!/usr/bin/env python3
"""The eryx face (`/eryx`): Python in WebAssembly over HTTP, beside eryx in-process.

One table, side by side in one run, for `print(1 + 1)`, a loop of 10 000 steps, and a
session step (`n += 1` in a session: its state restored before the code and saved
after it, each run):

  in-process   `isobox-wasm bench`: the same snapshot, wrapper and limits on one
               executor in one process, run after run (no socket, no jail, no daemon):
               the engine's own cost, the floor the face is measured against
  over HTTP    POST /eryx/v1/execute on an isoboxd (instance isobox-bench-eryx),
               one keep-alive connection, run after run: what a client sees
  HTTP, c=N    N keep-alive clients at once (N = ISOBOX_WASM_THREADS), runs/s

Columns: p50 and p99 latency (ms), runs/s, compute units of one run, and the HTTP
p50 as a ratio of the in-process p50. The first HTTP run (the worker's start) is not
counted; WARMUP runs of each are discarded.

Usage (root, after `cargo build --release` and `make wasm-snapshot`):
  python3 bench/load/eryx.py [--runs 200] [--threads 2]
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sessions as base  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "..", "target", "release", "isobox-wasm")
CACHE = os.environ.get("ISOBOX_WASM_CACHE_DIR", "/var/cache/isobox/wasm")
WARMUP = 5
CODES = {
    "print(1 + 1)": "print(1 + 1)",
    "loop 10k": "s = 0\nfor i in range(10000):\n    s += i\nprint(s)",
}
# Run in a session (one per client), whose state carries from run to run.
SESSION_CODE = "n = n + 1 if 'n' in globals() else 1\nrows = [{'i': i, 'sq': i * i} for i in range(50)]"
SESSION = "session step"


def in_process(code, runs, session=False):
    out = subprocess.run(
        [WORKER, "bench", "--cache", CACHE, "--runs", str(runs), "--code", code]
        + (["--session"] if session else []),
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def client(url):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=60)


def new_session(conn):
    conn.request("POST", "/eryx/v1/sessions", "", {})
    r = conn.getresponse()
    data = r.read()
    if r.status != 201:
        sys.exit(f"error: {r.status} {data[:300]!r}")
    return f"/eryx/v1/sessions/{json.loads(data)['id']}/execute"


def one(conn, code, path="/eryx/v1/execute"):
    body = json.dumps({"code": code})
    t0 = time.perf_counter()
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    dt = time.perf_counter() - t0
    if r.status != 200:
        sys.exit(f"error: {r.status} {data[:300]!r}")
    v = json.loads(data)
    if v["status"] != "success":
        sys.exit(f"error: {v}")
    return dt, v["compute_units"]


def over_http(url, code, runs, session=False):
    conn = client(url)
    path = new_session(conn) if session else "/eryx/v1/execute"
    for _ in range(WARMUP):
        one(conn, code, path)
    times, units = [], 0
    t0 = time.perf_counter()
    for _ in range(runs):
        dt, units = one(conn, code, path)
        times.append(dt)
    wall = time.perf_counter() - t0
    conn.close()
    ms = [t * 1000 for t in times]
    return base.percentile(ms, 50), base.percentile(ms, 99), runs / wall, units


def concurrent(url, code, runs, n, session=False):
    per = max(1, runs // n)
    times, lock = [], threading.Lock()

    def worker():
        conn = client(url)
        path = new_session(conn) if session else "/eryx/v1/execute"
        for _ in range(WARMUP):
            one(conn, code, path)
        mine = []
        for _ in range(per):
            mine.append(one(conn, code, path)[0])
        conn.close()
        with lock:
            times.extend(mine)

    ts = [threading.Thread(target=worker) for _ in range(n)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    ms = [t * 1000 for t in times]
    return base.percentile(ms, 50), base.percentile(ms, 99), len(times) / wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if not os.access(WORKER, os.X_OK):
        sys.exit(f"error: {WORKER} missing: run cargo build --release")
    base.INSTANCE = "isobox-bench-eryx"
    data_dir = f"/tmp/isobox-bench-eryx-{os.getpid()}"
    os.environ["ISOBOX_WASM_THREADS"] = str(a.threads)
    os.environ["ISOBOX_ERYX_CONCURRENCY"] = str(max(5, a.threads))
    os.environ["ISOBOX_WARM_POOL"] = "off"
    os.environ["ISOBOX_WBX_WARM_POOL"] = "off"
    os.environ["ISOBOX_EGRESS"] = "off"
    proc, log, url = base.start_isoboxd(data_dir)
    problems = []
    try:
        conn = client(url)
        one(conn, "print(0)")  # the worker starts here, uncounted
        conn.close()
        print(f"eryx face, {a.runs} runs each, {a.threads} worker threads ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
        print(f"{'code':<14} {'path':<14} {'p50 ms':>8} {'p99 ms':>8} {'runs/s':>8} {'units':>12} {'p50 ratio':>10}")
        for name, code in list(CODES.items()) + [(SESSION, SESSION_CODE)]:
            sess = name == SESSION
            ip = in_process(code, a.runs + WARMUP, sess)
            p50, p99, rps, units = over_http(url, code, a.runs, sess)
            cp50, cp99, crps = concurrent(url, code, a.runs, a.threads, sess)
            ip_rps = 1000.0 / ip["p50_ms"]
            print(f"{name:<14} {'in-process':<14} {ip['p50_ms']:>8.1f} {ip['p99_ms']:>8.1f} {ip_rps:>8.1f} {ip['compute_units']:>12} {'1.00x':>10}")
            print(f"{'':<14} {'over HTTP':<14} {p50:>8.1f} {p99:>8.1f} {rps:>8.1f} {units:>12} {p50 / ip['p50_ms']:>9.2f}x")
            print(f"{'':<14} {f'HTTP, c={a.threads}':<14} {cp50:>8.1f} {cp99:>8.1f} {crps:>8.1f} {'':>12} {cp50 / ip['p50_ms']:>9.2f}x")
            if units != ip["compute_units"]:
                problems.append(f"{name}: {units} units over HTTP, {ip['compute_units']} in-process")
    finally:
        problems += base.stop_isoboxd(proc, data_dir)
    for p in problems:
        print(f"PROBLEM: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

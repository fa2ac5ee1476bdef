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

Then, when `make test-wheels` has fetched them, an uploaded environment (the
document's: jinja2 and markupsafe, `imports=jinja2`): its build time, and runs in it
over HTTP beside the same code in the standard environment (`python`), alternating
in rounds, with the ratio of their p50s.

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


def one(conn, code, path="/eryx/v1/execute", environment=None):
    body = {"code": code}
    if environment:
        body["environment"] = environment
    body = json.dumps(body)
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


WHEELS = "/var/cache/isobox-tools/wheels"
ENV_FILES = ["jinja2-3.1.4-py3-none-any.whl", "markupsafe-3.0.2-py3-none-any.whl"]
ENV_CODES = {
    "print(1 + 1)": "print(1 + 1)",
    "render": "import jinja2\nprint(jinja2.Template('Hello {{ n }}!').render(n='Ada'))",
}


def upload_env(url, name):
    """Uploads the document's environment and waits for its build: seconds taken."""
    b = "isoboxBenchBoundary"
    parts = [("name", None, name.encode()), ("imports", None, b"jinja2")]
    for f in ENV_FILES:
        with open(os.path.join(WHEELS, f), "rb") as fh:
            parts.append(("package", f, fh.read()))
    body = b""
    for field, fname, data in parts:
        disp = f'form-data; name="{field}"' + (f'; filename="{fname}"' if fname else "")
        body += f"--{b}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + data + b"\r\n"
    body += f"--{b}--\r\n".encode()
    conn = client(url)
    t0 = time.perf_counter()
    conn.request("POST", "/eryx/v1/environments", body, {"Content-Type": f"multipart/form-data; boundary={b}"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 202:
        sys.exit(f"error: upload {r.status} {data[:300]!r}")
    while True:
        conn.request("GET", f"/eryx/v1/environments/{name}")
        r = conn.getresponse()
        v = json.loads(r.read())
        if v["status"] == "ready":
            break
        if v["status"] != "building":
            sys.exit(f"error: build {v}")
        time.sleep(0.1)
    conn.close()
    return time.perf_counter() - t0


def env_rows(url, runs, rounds=4):
    """Runs in the environment beside the standard one, alternating in rounds."""
    build_s = upload_env(url, "bench-env")
    print(f"\nuploaded environment (jinja2 + markupsafe, imports=jinja2): built in {build_s:.1f} s")
    print(f"{'code':<14} {'environment':<14} {'p50 ms':>8} {'p99 ms':>8} {'units':>12} {'p50 ratio':>10}")
    conn = client(url)
    for name, code in ENV_CODES.items():
        t = {"python": [], "bench-env": []}
        units = {}
        for env in t:
            for _ in range(WARMUP):
                if name != "render" or env != "python":
                    one(conn, code, environment=env)
        for _ in range(rounds):
            for env in t:
                if name == "render" and env == "python":
                    continue  # jinja2 is only in the environment
                for _ in range(max(1, runs // rounds)):
                    dt, units[env] = one(conn, code, environment=env)
                    t[env].append(dt * 1000)
        ref = base.percentile(t["python"], 50) if t["python"] else None
        for env, ms in t.items():
            if not ms:
                continue
            p50 = base.percentile(ms, 50)
            ratio = f"{p50 / ref:>9.2f}x" if ref else f"{'-':>10}"
            print(f"{name:<14} {env:<14} {p50:>8.1f} {base.percentile(ms, 99):>8.1f} {units[env]:>12} {ratio}")
    conn.close()


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
        if all(os.path.exists(os.path.join(WHEELS, f)) for f in ENV_FILES):
            env_rows(url, a.runs)
        else:
            print(f"\n(no uploaded environment: {WHEELS} lacks the wheels; make test-wheels)")
    finally:
        problems += base.stop_isoboxd(proc, data_dir)
    for p in problems:
        print(f"PROBLEM: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

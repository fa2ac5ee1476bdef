#!/usr/bin/env python3
"""What a Prometheus scrape of GET /metrics costs, idle and under load, beside /healthz.

isoboxd is started by the script (ISOBOX_LISTEN=127.0.0.1:0, instance isobox-bench-metrics,
data dir /tmp/isobox-bench-metrics-PID, egress and warm pools off, rate limit lifted), on
`taskset -c SERVER_CPU`. First RUNS executions of python-slim `print(1)` fill the run
series and histograms (and 404s on both faces add HTTP series), so the exposition has the
size it has on a daemon in use. Then, alternating /metrics and /healthz (the reference: the
JSON liveness document every monitor already polls) over one keep-alive connection,
SCRAPES requests each, in two phases:

  idle        nothing else runs
  under load  wrk -t1 -c16 (`taskset -c WRK_CPU`) PUTs 100 B values to the memory KV for
              the whole phase: the busiest reactor the daemon has

Reported per endpoint and phase: p50 and p99 latency of the request (client side, the
whole response read), and the body size; the ratio /metrics / /healthz; and, for the load
phase, wrk's PUT rate with and without the scrapes running (a scrape every INTERVAL_MS).
Every /metrics body must parse (each sample line `name{labels} value`, HELP and TYPE before
a family's samples) and hold isobox_runs_total with RUNS ok runs.

Usage (root): python3 bench/load/metrics.py
Settings (environment): RUNS (20), SCRAPES (200), INTERVAL_MS (100: a scrape every 0.1 s
during the load phase, 150x Prometheus's usual 15 s), DURATION (s of load per measurement,
5), ROUNDS (5 alternating rounds of PUTs alone and PUTs with scrapes; medians reported),
SERVER_CPU (0), WRK_CPU (1), ISOBOXD (binary). Python 3.11 standard library only;
wrk is installed with apt-get when missing.
"""

import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ISOBOXD = os.environ.get("ISOBOXD", os.path.join(ROOT, "target/release/isoboxd"))
RUNS = int(os.environ.get("RUNS", "20"))
SCRAPES = int(os.environ.get("SCRAPES", "200"))
INTERVAL_MS = int(os.environ.get("INTERVAL_MS", "100"))
DURATION = int(os.environ.get("DURATION", "5"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
SERVER_CPU = os.environ.get("SERVER_CPU", "0")
WRK_CPU = os.environ.get("WRK_CPU", "1")

PUT_LUA = r"""
counter = 0
request = function()
  counter = counter + 1
  return wrk.format("PUT", "/v1/memory/bench/k" .. (counter % 1000), nil, string.rep("x", 100))
end
"""

# name, then labels whose quoted values may hold anything escaped (route patterns hold braces)
SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? [0-9.eE+\-]+$')


def start():
    data = f"/tmp/isobox-bench-metrics-{os.getpid()}"
    env = dict(os.environ, ISOBOX_LISTEN="127.0.0.1:0", ISOBOX_DATA_DIR=data,
               ISOBOX_INSTANCE="isobox-bench-metrics", ISOBOX_EGRESS="off",
               ISOBOX_WARM_POOL="off", ISOBOX_WBX_WARM_POOL="off",
               ISOBOX_RATE_PER_MIN="1000000", ISOBOX_RATE_BURST="100000")
    env.pop("ISOBOX_LOG", None)
    log = tempfile.NamedTemporaryFile(prefix="isobox-bench-metrics-", suffix=".log")  # noqa: SIM115
    proc = subprocess.Popen(["taskset", "-c", SERVER_CPU, ISOBOXD], env=env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(log.name, "rb") as f:
            m = re.search(rb"listening on http://([0-9.]+):([0-9]+)", f.read())
        if m:
            return proc, log, data, m.group(1).decode(), int(m.group(2))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    with open(log.name, "rb") as f:
        sys.exit(f"isoboxd did not start:\n{f.read().decode(errors='replace')[-3000:]}")


def ready(host, port):
    for _ in range(600):
        c = http.client.HTTPConnection(host, port, timeout=5)
        c.request("GET", "/readyz")
        if c.getresponse().status == 200:
            return
        time.sleep(0.1)
    sys.exit("isoboxd never became ready")


def check_exposition(text):
    typed = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line.startswith("#") or not line:
            continue
        else:
            if not SAMPLE.match(line):
                sys.exit(f"bad sample line: {line!r}")
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in typed and base not in typed:
                sys.exit(f"sample before its TYPE: {line!r}")
    m = re.search(r'^isobox_runs_total\{runtime="python-slim",outcome="ok"\} (\d+)$', text, re.M)
    if not m or int(m.group(1)) < RUNS:
        sys.exit("isobox_runs_total lacks the runs")


def scrape_pair(host, port, n, stop_at=None):
    """Alternating /metrics and /healthz, n of each; latencies in ms and body sizes."""
    c = http.client.HTTPConnection(host, port, timeout=30)
    lat = {"/metrics": [], "/healthz": []}
    size = {}
    for i in range(n):
        for path in ("/metrics", "/healthz"):
            t0 = time.perf_counter()
            c.request("GET", path)
            r = c.getresponse()
            body = r.read()
            lat[path].append((time.perf_counter() - t0) * 1000)
            if r.status != 200:
                sys.exit(f"{path}: {r.status}")
            size[path] = len(body)
            if path == "/metrics" and i % 50 == 0:
                check_exposition(body.decode())
        if stop_at and time.monotonic() >= stop_at:
            break
    return lat, size


def wrk(url, seconds, lua):
    out = subprocess.run(["taskset", "-c", WRK_CPU, "wrk", "-t1", "-c16", f"-d{seconds}s",
                          "-s", lua, url], capture_output=True, text=True, check=True).stdout
    return float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def main():
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "wrk"], check=True)
    proc, log, data, host, port = start()
    lua = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)  # noqa: SIM115
    lua.write(PUT_LUA)
    lua.close()
    try:
        ready(host, port)
        for _ in range(RUNS):
            c = http.client.HTTPConnection(host, port, timeout=60)
            c.request("POST", "/execute", json.dumps(
                {"language": "python-slim", "code": "print(1)", "network": False}),
                {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200 or json.loads(r.read())["run"]["exitCode"] != 0:
                sys.exit("a run failed")
        for path in ("/nope", "/wbx/v1/nope"):
            c = http.client.HTTPConnection(host, port, timeout=5)
            c.request("GET", path)
            c.getresponse().read()
        url = f"http://{host}:{port}"
        print(f"== /metrics scrape cost: isoboxd {url}, server on CPU {SERVER_CPU}, wrk on CPU "
              f"{WRK_CPU}; {RUNS} runs done first; {SCRAPES} scrapes of each endpoint per phase")
        idle, size = scrape_pair(host, port, SCRAPES)
        # Under load: the PUT rate alone and with scrapes every INTERVAL_MS, alternating
        # over ROUNDS rounds (the rate swings ~10 % between runs of a few seconds).
        under = {"/metrics": [], "/healthz": []}
        failed = []
        alone, with_scr = [], []
        for _ in range(ROUNDS):
            alone.append(wrk(url, DURATION, lua.name))
            stop = threading.Event()

            def scraper(stop=stop):
                try:
                    while not stop.is_set():
                        lat, _ = scrape_pair(host, port, 1)
                        for k, v in lat.items():
                            under[k].extend(v)
                        time.sleep(INTERVAL_MS / 1000)
                except BaseException as e:  # noqa: BLE001 - reported by the main thread
                    failed.append(repr(e))

            t = threading.Thread(target=scraper)
            t.start()
            with_scr.append(wrk(url, DURATION, lua.name))
            stop.set()
            t.join()
            if failed:
                sys.exit(f"the scraper failed under load: {failed[0]}")
        alone_m, with_m = statistics.median(alone), statistics.median(with_scr)
        print(f"{'phase':<12} {'endpoint':<10} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'bytes':>7}")
        for phase, lat in (("idle", idle), ("under load", under)):
            for path in ("/metrics", "/healthz"):
                print(f"{phase:<12} {path:<10} {len(lat[path]):>5} {pct(lat[path], 50):>8.3f} "
                      f"{pct(lat[path], 99):>8.3f} {size[path]:>7}")
            r50 = pct(lat["/metrics"], 50) / pct(lat["/healthz"], 50)
            r99 = pct(lat["/metrics"], 99) / pct(lat["/healthz"], 99)
            print(f"{phase:<12} ratio /metrics / /healthz: p50 {r50:.2f}, p99 {r99:.2f}")
        print(f"KV PUT req/s at c=16, median of {ROUNDS} alternating rounds: {alone_m:.0f} alone "
              f"({', '.join(f'{x:.0f}' for x in alone)}), {with_m:.0f} with a scrape of each every "
              f"{INTERVAL_MS} ms ({', '.join(f'{x:.0f}' for x in with_scr)}): {with_m / alone_m:.3f}x")
    finally:
        os.unlink(lua.name)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(data, ignore_errors=True)
        log.close()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Two isoboxd binaries side by side: GET /healthz req/s and latency, cold and warm
POST /execute, one kernel step and SSE forwarding latency, for a reference binary A
and a new binary B, alternating A and B in rounds in one invocation; one Markdown table.

Reproduce (root, from the repository; A = the build of the reference commit):

    ISOBOXD_A=/path/to/reference/isoboxd python3 bench/load/compare.py --b target/release/isoboxd

What each round measures, for each binary (p50/p99 are nearest-rank, in ms):

  healthz      `taskset -c 1 wrk -t1 -c16 -d5s --timeout 5s --latency` on GET /healthz,
               keep-alive, against a daemon started under `taskset -c 0` with the warm
               pool off (as bench/load/http.sh); 1 s of wrk warm-up first, not counted.
               req/s, p50, p99 as wrk reports them.
  cold         POST /execute {"language":"python-slim","network":false,"code":"print(1)"},
               --runs runs at concurrency 1, one new connection each, timed from connect
               to the last byte (bench/load/execute.py), ISOBOX_WARM_POOL=off; 2 warm-up
               runs first. Every run must print exactly "1\\n".
  kernel step  one kernel session (POST /v1/sessions {"runtime":"python","type":"kernel",
               "network":false}), then --steps steps POST /v1/sessions/{id}/exec
               {"code":"x = 1"} with X-Session-Token on one keep-alive connection, round
               trip per step (bench/load/kernel.py); 10 warm-up steps first. Same daemon
               as cold.
  sse          one streamed POST /execute (Accept: text/event-stream) of a python-slim
               program printing time.time() every 20 ms, --sse-samples lines; latency =
               the arrival of the chunk that completes a line - its stamp (the method of
               bench/load/sse_latency.py, with the chunked encoding decoded and lines
               split across chunks joined); the first 5 samples are dropped. Same daemon
               as cold.
  warm         the cold request on a daemon with ISOBOX_WARM_POOL=python-slim=1: before
               each run (untimed) wait until /healthz's warmPool says python-slim is
               ready again, then 0.2 s more for the previous run's teardown
               (bench/load/warm.py's "warm idle"); every timed run must be a pool hit.

Scheduling: ONE daemon at a time, never two. Each round runs the three daemon setups
(healthz, cold+kernel+sse, warm) in turn, and for each setup starts A's daemon, measures,
stops it, then does the same for B (rounds 1, 3, ... A first; 2, 4, ... B first), so A's and
B's samples of a metric are taken seconds apart and drift in background load hits both.
Every daemon is fresh: its own temp ISOBOX_DATA_DIR, ISOBOX_INSTANCE isobox-cmp-a or
isobox-cmp-b, its own loopback port (127.0.0.1 only), ISOBOX_EGRESS=off (no firewall is
programmed on the host), ISOBOX_LOG=warn, ISOBOX_RATE_PER_MIN=1000000 and
ISOBOX_RATE_BURST=100000 (every request comes from 127.0.0.1), ISOBOX_MAX_CONCURRENT=16,
ISOBOX_SHUTDOWN_GRACE_MS=2000; any other ISOBOX_* in the caller's environment reaches
both alike. Measuring starts only once /readyz answers 200. Each daemon is stopped with
SIGTERM (SIGKILL after 20 s); the script then fails if its cgroup slice
(/sys/fs/cgroup/*/INSTANCE), its runsc state (/run/isobox/INSTANCE) or a mount under its
data dir is left, and removes the data dir.

Table: for each metric, A and B are the median over rounds of the per-round figure,
B/A their ratio, and each side's spread is the min-max of the per-round figures;
"overlap" says whether the two spreads overlap (a reader's aid, not a test; "-" with one
round). Progress and per-round figures go to stderr, the table to stdout. The script
exits 1 if any request failed, a warm run missed the pool, wrk saw errors, or a daemon
left something behind.

Default run: 3 rounds, 20 cold and 20 warm runs, 100 kernel steps, 150 SSE samples and
5 s of wrk per daemon per round: about 80 s a round, 4 minutes in all on the 2-core
host (most of it the cold runs and the pool's refills). `wrk` (Debian package) is
installed with apt when missing.
Knobs (argv, or the environment named in --help): binaries, rounds, runs, steps, samples,
wrk duration and connections, ports, CPUs, instance names.
Python 3.11 standard library only.
"""

import argparse
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 120
EXECUTE_BODY = json.dumps({"language": "python-slim", "network": False, "code": "print(1)"}).encode()
EXPECTED = "1\n"
SSE_SKIP = 5
WARM_SETTLE_S = 0.2
WRK_WARMUP_S = 1


class Failure(Exception):
    pass


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def percentile(xs, q):
    """Nearest-rank percentile (with 20 samples, p99 is the maximum)."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# --- one daemon -------------------------------------------------------------------------


class Daemon:
    """One isoboxd: started fresh, measured, stopped and checked."""

    def __init__(self, side, binary, instance, port, pool, cpu=None, env=None):
        self.side, self.binary, self.instance, self.port = side, binary, instance, port
        self.pool, self.cpu = pool, cpu
        # More ISOBOX_* settings for this daemon only (bench/load/runtimes.py: its trees).
        self.extra_env = dict(env or {})
        self.proc = None
        self.data_dir = None
        self.log = None

    def request(self, method, path, body=None, headers=None, timeout=TIMEOUT_S):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def health(self):
        st, data = self.request("GET", "/healthz", timeout=10)
        if st != 200:
            raise Failure(f"{self.side}: GET /healthz {st}")
        return json.loads(data)

    def log_tail(self):
        if self.log is None:
            return ""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def start(self):
        state = f"/run/isobox/{self.instance}"
        if os.path.exists(state):
            raise Failure(f"{state} exists: another isoboxd with instance {self.instance} runs, or one was killed; remove it first")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", self.port)) == 0:
                raise Failure(f"127.0.0.1:{self.port} is already in use")
        self.data_dir = tempfile.mkdtemp(prefix=f"{self.instance}-")
        env = dict(os.environ)
        env.update(
            ISOBOX_INSTANCE=self.instance,
            ISOBOX_DATA_DIR=self.data_dir,
            ISOBOX_LISTEN=f"127.0.0.1:{self.port}",
            ISOBOX_LOG="warn",
            ISOBOX_EGRESS="off",
            ISOBOX_WARM_POOL=self.pool,
            ISOBOX_WBX_WARM_POOL="off",
            ISOBOX_MAX_CONCURRENT="16",
            ISOBOX_SHUTDOWN_GRACE_MS="2000",
            ISOBOX_RATE_PER_MIN="1000000",
            ISOBOX_RATE_BURST="100000",
        )
        env.update(self.extra_env)
        # taskset execs the daemon, so the pid is isoboxd's own (SIGTERM reaches it).
        argv = ([shutil.which("taskset"), "-c", str(self.cpu)] if self.cpu is not None else []) + [self.binary]
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the daemon
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Failure(f"{self.side} ({self.binary}) exited during startup:\n{self.log_tail()}")
            try:
                status, _ = self.request("GET", "/readyz", timeout=2)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise Failure(f"{self.side}: not ready after 60 s (last /readyz {status}):\n{self.log_tail()}")

    def alive(self):
        if self.proc.poll() is not None:
            raise Failure(f"{self.side}: isoboxd exited (status {self.proc.returncode}) during the run:\n{self.log_tail()}")

    def stop(self):
        """SIGTERM, 20 s, SIGKILL; then the leftover checks. Returns the problems found."""
        problems = []
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                problems.append(f"{self.side}: isoboxd ignored SIGTERM for 20 s; sent SIGKILL")
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            left = []
            for _ in range(30):
                left = [f"/sys/fs/cgroup/{d}/{self.instance}" for d in os.listdir("/sys/fs/cgroup")]
                left = [p for p in left if os.path.isdir(p)]
                state = f"/run/isobox/{self.instance}"
                if os.path.exists(state):
                    left.append(state)
                if not left:
                    break
                time.sleep(0.1)
            if left:
                problems.append(f"{self.side}: left behind after shutdown: {left}")
        if self.data_dir is not None:
            prefix = self.data_dir.rstrip("/") + "/"
            with open("/proc/self/mounts") as f:
                mounted = [m for m in (line.split()[1] for line in f) if m.startswith(prefix)]
            for m in reversed(mounted):
                subprocess.run(["umount", "-l", m], check=False)
            if mounted:
                problems.append(f"{self.side}: still mounted after shutdown: {mounted}")
            shutil.rmtree(self.data_dir, ignore_errors=True)
            if os.path.exists(self.data_dir):
                problems.append(f"{self.side}: {self.data_dir} could not be removed")
        if self.log is not None:
            self.log.close()
        self.proc = self.data_dir = self.log = None
        return problems


# --- what is measured -------------------------------------------------------------------


def wrk(d, args, seconds):
    """{"rps", "p50", "p99"} of one wrk run on GET /healthz, pinned to args.wrk_cpu."""
    url = f"http://127.0.0.1:{d.port}/healthz"
    argv = ["taskset", "-c", str(args.wrk_cpu), "wrk", "-t1", f"-c{args.conns}", f"-d{seconds}s", "--timeout", "5s", "--latency", url]
    p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=seconds + 30)
    d.alive()
    if p.returncode != 0:
        raise Failure(f"{d.side}: wrk exit {p.returncode}: {p.stderr[-300:]}")
    out = p.stdout

    def ms(v):
        m = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", v)
        if not m:
            raise Failure(f"{d.side}: wrk latency {v!r} not understood")
        return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[m.group(2)]

    lat = dict(re.findall(r"^\s+(50|99)\.000%\s+(\S+)$", out, re.M)) or dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.M))
    rps = re.search(r"^Requests/sec:\s+([0-9.]+)", out, re.M)
    if not rps or "50" not in lat or "99" not in lat:
        raise Failure(f"{d.side}: wrk output not understood:\n{out}")
    sock = re.search(r"Socket errors:(.*)$", out, re.M)
    errors = sum(int(x) for x in re.findall(r"\d+", sock.group(1))) if sock else 0
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors += int(bad.group(1)) if bad else 0
    if errors:
        raise Failure(f"{d.side}: wrk saw {errors} socket errors or non-2xx responses:\n{out}")
    return {"rps": float(rps.group(1)), "p50": ms(lat["50"]), "p99": ms(lat["99"])}


def execute_once(d):
    """Seconds from connect to the last byte of one POST /execute of print(1)."""
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=TIMEOUT_S)
    try:
        c.request("POST", "/execute", body=EXECUTE_BODY, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
    finally:
        c.close()
    dt = time.perf_counter() - t0
    if r.status != 200:
        raise Failure(f"{d.side}: POST /execute {r.status}: {data[:300]!r}")
    run = json.loads(data)["run"]
    if run.get("exitCode") != 0 or run.get("stdout") != EXPECTED:
        raise Failure(f"{d.side}: POST /execute run {run}")
    return dt


def lat_stats(seconds):
    ms = [x * 1000 for x in seconds]
    return {"p50": percentile(ms, 50), "p99": percentile(ms, 99), "n": len(ms)}


def cold(d, runs):
    for _ in range(2):
        execute_once(d)
    lat = [execute_once(d) for _ in range(runs)]
    d.alive()
    return lat_stats(lat)


def pool_state(d):
    w = d.health().get("warmPool") or {}
    return w.get("runtimes", {}).get("python-slim", {}).get("ready"), w.get("hits")


def wait_pool(d, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, hits = pool_state(d)
        if ready == 1:
            return hits
        time.sleep(0.05)
    raise Failure(f"{d.side}: the python-slim pool did not refill in {timeout} s: {d.health().get('warmPool')}")


def warm(d, runs):
    lat, misses = [], 0
    for i in range(runs + 2):  # 2 warm-up runs
        wait_pool(d)
        time.sleep(WARM_SETTLE_S)
        hits = wait_pool(d)
        dt = execute_once(d)
        if i >= 2:
            lat.append(dt)
            _, after = pool_state(d)
            misses += after != hits + 1
    d.alive()
    if misses:
        raise Failure(f"{d.side}: {misses} of {runs} warm runs were not served from the pool")
    return lat_stats(lat)


def kernel(d, steps):
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=TIMEOUT_S)

    def post(path, obj, token=None):
        h = {"Content-Type": "application/json"}
        if token:
            h["X-Session-Token"] = token
        t0 = time.perf_counter()
        c.request("POST", path, body=json.dumps(obj).encode(), headers=h)
        r = c.getresponse()
        data = r.read()
        return r.status, data, time.perf_counter() - t0

    try:
        st, data, _ = post("/v1/sessions", {"runtime": "python", "type": "kernel", "network": False})
        if st != 201:
            raise Failure(f"{d.side}: kernel create {st}: {data[:300]!r}")
        s = json.loads(data)
        path = f"/v1/sessions/{s['id']}/exec"
        lat = []
        for i in range(steps + 10):  # 10 warm-up steps
            st, data, dt = post(path, {"code": "x = 1"}, s["token"])
            if st != 200 or json.loads(data)["run"].get("exitCode") != 0:
                raise Failure(f"{d.side}: kernel step {st}: {data[:300]!r}")
            if i >= 10:
                lat.append(dt)
        c.request("DELETE", f"/v1/sessions/{s['id']}", headers={"X-Session-Token": s["token"]})
        r = c.getresponse()
        r.read()
        if r.status != 204:
            raise Failure(f"{d.side}: kernel session delete {r.status}")
    finally:
        c.close()
    d.alive()
    return lat_stats(lat)


def sse(d, samples):
    """Latency from a program's print to the client's receipt of the completed line."""
    code = f"import time\nfor i in range({samples}):\n print(repr(time.time()), flush=True)\n time.sleep(0.02)"
    body = json.dumps({"language": "python-slim", "network": False, "code": code, "limits": {"wallTimeMs": 20000}}).encode()
    s = socket.create_connection(("127.0.0.1", d.port), timeout=TIMEOUT_S)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(
        b"POST /execute HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    raw, head, events = b"", None, b""
    event, line, lat, done = None, "", [], None
    try:
        while done is None:
            data = s.recv(65536)
            now = time.time()
            if not data:
                break
            raw += data
            if head is None:
                if b"\r\n\r\n" not in raw:
                    continue
                head, raw = raw.split(b"\r\n\r\n", 1)
                if not head.startswith(b"HTTP/1.1 200") or b"chunked" not in head.lower():
                    raise Failure(f"{d.side}: SSE response head {head[:300]!r}")
            # Chunked transfer coding (RFC 9112 §7.1): size line, data, CRLF.
            while b"\r\n" in raw:
                size_line, rest = raw.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                if len(rest) < size + 2:
                    break
                events += rest[:size]
                raw = rest[size + 2 :]
                if size == 0:
                    break
            while b"\n" in events:
                ev_line, events = events.split(b"\n", 1)
                ev_line = ev_line.rstrip(b"\r")
                if ev_line.startswith(b"event: "):
                    event = ev_line[7:].decode()
                elif ev_line.startswith(b"data: ") and event == "stdout":
                    line += json.loads(ev_line[6:])["chunk"]
                    while "\n" in line:
                        stamp, line = line.split("\n", 1)
                        lat.append(now - float(stamp))
                elif ev_line.startswith(b"data: ") and event == "done":
                    done = json.loads(ev_line[6:])
                elif ev_line.startswith(b"data: ") and event == "error":
                    raise Failure(f"{d.side}: SSE error event {ev_line[:300]!r}")
    finally:
        s.close()
    d.alive()
    if done is None or done["run"].get("exitCode") != 0:
        raise Failure(f"{d.side}: SSE run did not end well: {done}")
    if len(lat) != samples:
        raise Failure(f"{d.side}: SSE gave {len(lat)} lines of {samples}")
    return lat_stats(lat[SSE_SKIP:])


# --- the rounds -------------------------------------------------------------------------

# (metric key, table label, higher is better)
METRICS = [
    ("healthz.rps", "GET /healthz req/s", True),
    ("healthz.p50", "GET /healthz p50 ms", False),
    ("healthz.p99", "GET /healthz p99 ms", False),
    ("cold.p50", "cold /execute p50 ms", False),
    ("cold.p99", "cold /execute p99 ms", False),
    ("warm.p50", "warm /execute p50 ms", False),
    ("warm.p99", "warm /execute p99 ms", False),
    ("kernel.p50", "kernel step p50 ms", False),
    ("kernel.p99", "kernel step p99 ms", False),
    ("sse.p50", "SSE latency p50 ms", False),
    ("sse.p99", "SSE latency p99 ms", False),
]


def setups(args):
    """(name, pool, cpu, measure(daemon) -> {metric: value}) for each daemon of a round."""

    def http_setup(d):
        wrk(d, args, WRK_WARMUP_S)
        r = wrk(d, args, args.duration)
        return {f"healthz.{k}": v for k, v in r.items()}

    def run_setup(d):
        out = {}
        for name, fn, n in (("cold", cold, args.runs), ("kernel", kernel, args.steps), ("sse", sse, args.sse_samples)):
            r = fn(d, n)
            out[f"{name}.p50"], out[f"{name}.p99"] = r["p50"], r["p99"]
        return out

    def warm_setup(d):
        r = warm(d, args.runs)
        return {"warm.p50": r["p50"], "warm.p99": r["p99"]}

    return [
        ("healthz", "off", args.server_cpu, http_setup),
        ("cold+kernel+sse", "off", None, run_setup),
        ("warm", "python-slim=1", None, warm_setup),
    ]


def fmt(v):
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


def ensure_wrk():
    if shutil.which("wrk"):
        return
    log("installing wrk (Debian package)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # apt's output goes to stderr with the progress: stdout is only the table.
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=sys.stderr)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "wrk"], check=True, env=env, stdout=sys.stderr)


def main():
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", default=env("ISOBOXD_A"), help="reference isoboxd binary (env ISOBOXD_A; required)")
    ap.add_argument("--b", default=env("ISOBOXD_B", os.path.join(ROOT, "target/release/isoboxd")), help="new isoboxd binary (env ISOBOXD_B; default target/release/isoboxd)")
    ap.add_argument("--rounds", type=int, default=int(env("CMP_ROUNDS", "3")), help="rounds (env CMP_ROUNDS; 3)")
    ap.add_argument("--runs", type=int, default=int(env("CMP_RUNS", "20")), help="cold and warm /execute runs per daemon per round (env CMP_RUNS; 20)")
    ap.add_argument("--steps", type=int, default=int(env("CMP_STEPS", "100")), help="kernel steps per round (env CMP_STEPS; 100)")
    ap.add_argument("--sse-samples", type=int, default=int(env("CMP_SSE_SAMPLES", "150")), help="SSE lines per round, 20 ms apart (env CMP_SSE_SAMPLES; 150; at most 800)")
    ap.add_argument("--duration", type=int, default=int(env("CMP_DURATION", "5")), help="s of wrk per round (env CMP_DURATION; 5)")
    ap.add_argument("--conns", type=int, default=int(env("CMP_CONNS", "16")), help="wrk keep-alive connections (env CMP_CONNS; 16)")
    ap.add_argument("--port-a", type=int, default=int(env("CMP_PORT_A", "18121")), help="A's port on 127.0.0.1 (env CMP_PORT_A; 18121)")
    ap.add_argument("--port-b", type=int, default=int(env("CMP_PORT_B", "18122")), help="B's port on 127.0.0.1 (env CMP_PORT_B; 18122)")
    ap.add_argument("--instance-a", default=env("CMP_INSTANCE_A", "isobox-cmp-a"), help="A's ISOBOX_INSTANCE (isobox-cmp-a)")
    ap.add_argument("--instance-b", default=env("CMP_INSTANCE_B", "isobox-cmp-b"), help="B's ISOBOX_INSTANCE (isobox-cmp-b)")
    ap.add_argument("--server-cpu", type=int, default=int(env("CMP_SERVER_CPU", "0")), help="CPU the /healthz daemon is pinned to (0)")
    ap.add_argument("--wrk-cpu", type=int, default=int(env("CMP_WRK_CPU", "1")), help="CPU wrk is pinned to (1)")
    args = ap.parse_args()

    if os.geteuid() != 0:
        sys.exit("error: run as root (isoboxd needs cgroups and runsc)")
    if not args.a:
        sys.exit("error: no reference binary: pass --a PATH or set ISOBOXD_A")
    for name in ("a", "b"):
        p = os.path.abspath(getattr(args, name))
        if not os.access(p, os.X_OK):
            sys.exit(f"error: --{name} {p} is not an executable file")
        setattr(args, name, p)
    if args.port_a == args.port_b or args.instance_a == args.instance_b:
        sys.exit("error: A and B need their own port and instance")
    if not 5 < args.sse_samples <= 800:
        sys.exit("error: --sse-samples must be 6..800 (the run's wall time is capped at 20 s)")
    if min(args.rounds, args.runs, args.steps, args.duration, args.conns) < 1:
        sys.exit("error: rounds, runs, steps, duration and conns must be >= 1")
    if not {args.server_cpu, args.wrk_cpu} <= os.sched_getaffinity(0) or args.server_cpu == args.wrk_cpu:
        sys.exit(f"error: need two distinct CPUs for the daemon and wrk, have {sorted(os.sched_getaffinity(0))}")
    rootfs = env("ISOBOX_ROOTFS_DIR", "/var/lib/isobox/rootfs")
    for rt in ("python-slim", "python"):
        if not os.path.isdir(os.path.join(rootfs, rt)):
            sys.exit(f"error: {rootfs}/{rt} is not built (make runtimes)")
    ensure_wrk()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    sides = {
        "A": (args.a, args.instance_a, args.port_a),
        "B": (args.b, args.instance_b, args.port_b),
    }
    results = {"A": {}, "B": {}}  # side -> metric -> [per-round values]
    versions = {}
    problems = []
    t_start = time.monotonic()
    load_before = loadavg()
    log(f"A = {args.a}\nB = {args.b}\n{args.rounds} rounds; load average before: {load_before}")
    try:
        for rnd in range(args.rounds):
            order = ("A", "B") if rnd % 2 == 0 else ("B", "A")
            for setup, pool, cpu, measure in setups(args):
                for side in order:
                    binary, instance, port = sides[side]
                    d = Daemon(side, binary, instance, port, pool, cpu)
                    t0 = time.monotonic()
                    try:
                        d.start()
                        versions.setdefault(side, d.health().get("version", "?"))
                        r = measure(d)
                    finally:
                        problems += d.stop()
                    for k, v in r.items():
                        results[side].setdefault(k, []).append(v)
                    figures = "  ".join(f"{k} {fmt(v)}" for k, v in r.items())
                    log(f"round {rnd + 1} {side} {setup:<15} ({time.monotonic() - t0:5.1f} s, load {loadavg()}): {figures}")
    except Failure as e:
        problems.append(str(e))
    except KeyboardInterrupt:
        problems.append("interrupted")
    elapsed = time.monotonic() - t_start

    print(f"A: `{args.a}` (sha256 {sha(args.a)}, version {versions.get('A', '?')})  ")
    print(f"B: `{args.b}` (sha256 {sha(args.b)}, version {versions.get('B', '?')})  ")
    print(
        f"{args.rounds} rounds alternating A and B, one daemon at a time; per daemon per round: wrk {args.duration} s x "
        f"{args.conns} connections (daemon on CPU {args.server_cpu}, wrk on CPU {args.wrk_cpu}), {args.runs} cold and "
        f"{args.runs} warm runs, {args.steps} kernel steps, {args.sse_samples} SSE lines.  "
    )
    print(
        f"Host: {os.cpu_count()} CPUs, kernel {os.uname().release}; load average {load_before} before, {loadavg()} after; "
        f"{elapsed:.0f} s; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."
    )
    print()
    print("| metric | A | B | B/A | A spread (rounds) | B spread (rounds) | overlap |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | :---: |")
    for key, label, _ in METRICS:
        a, b = results["A"].get(key), results["B"].get(key)
        if not a or not b:
            print(f"| {label} | {fmt(median(a)) if a else '-'} | {fmt(median(b)) if b else '-'} | - | | | - |")
            continue
        ma, mb = median(a), median(b)
        ratio = f"{mb / ma:.2f}" if ma else "-"
        overlap = "-" if min(len(a), len(b)) < 2 else ("yes" if min(b) <= max(a) and min(a) <= max(b) else "no")
        print(
            f"| {label} | {fmt(ma)} | {fmt(mb)} | {ratio} | {fmt(min(a))}–{fmt(max(a))} | {fmt(min(b))}–{fmt(max(b))} | {overlap} |"
        )
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

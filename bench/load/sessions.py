#!/usr/bin/env python3
"""Filesystem sessions over HTTP: create + one exec step + delete, against plain /execute.

N iterations (default 30) at concurrency 1 of the session life cycle

  POST   /v1/sessions            {"runtime": "python-slim"}                  -> 201 {id, token}
  POST   /v1/sessions/{id}/exec  {"code": "print(1)", "network": false}      -> 200, stdout "1\\n"
  DELETE /v1/sessions/{id}                                                  -> 204

(the last two with `X-Session-Token`), alternating in the same run with the reference,
a plain `POST /execute {"language": "python-slim", "code": "print(1)", "network": false}`.
Reports p50/p90/p99/mean of each phase, of the session total and of /execute, and the
ratio session total / execute (the headline figure). Every request is a new connection;
latency is from connect to the last byte of the response. Both exec kinds also report
latency minus isoboxd's own `run.durationMs` (time outside the sandbox's lifetime), so
what a session step adds (the LMDB authorisation, mounting the workspace on first use,
the read-write workspace bind) is visible.

Then the file API, in one fresh session: the first `PUT /v1/sessions/{id}/fs?path=` of a
1 MiB file (it mounts the workspace), then R rounds (default 10) of PUT and GET of the
same file, every GET checked byte for byte: p50 and MiB/s (1 MiB / p50).

With no URL, the script starts its own isoboxd on an ephemeral loopback port
(ISOBOX_LISTEN=127.0.0.1:0, data dir /tmp/isobox-bench-sess-PID, instance
isobox-bench-sess, per-client rate limit lifted), reads the bound address from its
`listening on http://ADDR` line, and at the end stops it with SIGTERM, checks that no
workspace stayed mounted and its cgroup slice is gone, and removes the data dir. Given a
URL, it uses that daemon and leaves it running (its rate limit must allow ~4 N requests).

Usage (root, to start the daemon): python3 bench/load/sessions.py [URL] [--iterations 30] [--file-rounds 10]
Python 3.11 standard library only.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ISOBOXD = os.environ.get("ISOBOXD", os.path.join(ROOT, "target/release/isoboxd"))
INSTANCE = "isobox-bench-sess"
RUNTIME = "python-slim"
CODE = "print(1)"
EXPECTED = "1\n"
TIMEOUT_S = 120
MIB = 1 << 20


class Failure(Exception):
    pass


# --- HTTP -------------------------------------------------------------------------------


class Client:
    def __init__(self, url):
        u = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if u.scheme != "http" or not u.hostname:
            sys.exit(f"error: {url}: want http://HOST:PORT")
        self.host, self.port = u.hostname, u.port or 80

    def request(self, method, path, body=b"", headers=None):
        """One request on a new connection: (status, body bytes, seconds)."""
        hdrs = dict(headers or {})
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        return resp.status, data, time.perf_counter() - t0

    def json(self, method, path, obj, token=None):
        h = {"Content-Type": "application/json"}
        if token is not None:
            h["X-Session-Token"] = token
        return self.request(method, path, json.dumps(obj).encode(), h)


def expect(status, want, data, what):
    if status != want:
        raise Failure(f"{what}: HTTP {status} (want {want}): {data[:300]!r}")


def check_run(data, what):
    run = json.loads(data)["run"]
    if run.get("exitCode") != 0 or run.get("stdout") != EXPECTED:
        raise Failure(f"{what}: run {run}")
    return run["durationMs"]


# --- the two things measured ---------------------------------------------------------


def plain_execute(c):
    st, data, dt = c.json("POST", "/execute", {"language": RUNTIME, "code": CODE, "network": False})
    expect(st, 200, data, "POST /execute")
    return {"execute": dt, "execute_dur": check_run(data, "POST /execute") / 1000}


def session_cycle(c):
    st, data, t_create = c.json("POST", "/v1/sessions", {"runtime": RUNTIME})
    expect(st, 201, data, "POST /v1/sessions")
    s = json.loads(data)
    sid, token = s["id"], s["token"]
    try:
        st, data, t_exec = c.json("POST", f"/v1/sessions/{sid}/exec", {"code": CODE, "network": False}, token)
        expect(st, 200, data, "POST /v1/sessions/{id}/exec")
        dur = check_run(data, "POST /v1/sessions/{id}/exec") / 1000
    except Exception:
        c.request("DELETE", f"/v1/sessions/{sid}", headers={"X-Session-Token": token})
        raise
    st, data, t_delete = c.request("DELETE", f"/v1/sessions/{sid}", headers={"X-Session-Token": token})
    expect(st, 204, data, "DELETE /v1/sessions/{id}")
    return {
        "create": t_create,
        "exec": t_exec,
        "exec_dur": dur,
        "delete": t_delete,
        "total": t_create + t_exec + t_delete,
    }


def file_api(c, rounds, size):
    """First PUT (mounts), then `rounds` x (PUT, GET) of the same file in one session."""
    payload = os.urandom(size)
    st, data, _ = c.json("POST", "/v1/sessions", {"runtime": RUNTIME})
    expect(st, 201, data, "POST /v1/sessions")
    s = json.loads(data)
    sid, token = s["id"], s["token"]
    path = f"/v1/sessions/{sid}/fs?path=bench.bin"
    h = {"X-Session-Token": token, "Content-Type": "application/octet-stream"}
    puts, gets = [], []
    try:
        st, data, first = c.request("PUT", path, payload, h)
        expect(st, 200, data, "first PUT")
        for _ in range(rounds):
            st, data, dt = c.request("PUT", path, payload, h)
            expect(st, 200, data, "PUT")
            if json.loads(data).get("bytes") != size:
                raise Failure(f"PUT: {data[:200]!r}")
            puts.append(dt)
            st, data, dt = c.request("GET", path, headers={"X-Session-Token": token})
            expect(st, 200, data, "GET")
            if data != payload:
                raise Failure(f"GET: {len(data)} bytes back, not the {size} uploaded")
            gets.append(dt)
    finally:
        st, data, _ = c.request("DELETE", f"/v1/sessions/{sid}", headers={"X-Session-Token": token})
        expect(st, 204, data, "DELETE /v1/sessions/{id}")
    return first, puts, gets


# --- statistics and output --------------------------------------------------------------


def percentile(xs, q):
    """Nearest-rank percentile (with 30 samples, p99 is the maximum)."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


def row(name, xs):
    ms = [x * 1000 for x in xs]
    return (
        f"{name:<38} {percentile(ms, 50):>8.1f} {percentile(ms, 90):>8.1f} "
        f"{percentile(ms, 99):>8.1f} {sum(ms) / len(ms):>8.1f}"
    )


def ratio(a, b):
    return " ".join(f"p{q} {percentile(a, q) / percentile(b, q):.2f}x" for q in (50, 90, 99))


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# --- our own daemon ---------------------------------------------------------------------


def start_isoboxd(data_dir):
    if not os.access(ISOBOXD, os.X_OK):
        sys.exit(f"error: {ISOBOXD} missing: run cargo build --release")
    env = dict(os.environ)
    env.update(
        ISOBOX_LISTEN="127.0.0.1:0",
        ISOBOX_DATA_DIR=data_dir,
        ISOBOX_INSTANCE=INSTANCE,
        ISOBOX_RATE_PER_MIN="1000000",
        ISOBOX_RATE_BURST="100000",
        # The eryx face's bucket per tenant (bench/load/eryx*.py start through here).
        ISOBOX_ERYX_RATE_PER_MIN="1000000",
        ISOBOX_ERYX_RATE_BURST="100000",
        ISOBOX_SHUTDOWN_GRACE_MS="2000",
    )
    env.pop("ISOBOX_LOG", None)  # the ready line is logged at info
    log = tempfile.NamedTemporaryFile(prefix="isobox-bench-sess-", suffix=".log")  # noqa: SIM115
    proc = subprocess.Popen([ISOBOXD], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(log.name, "rb") as f:
            m = re.search(rb"listening on (http://[0-9.]+:[0-9]+)", f.read())
        if m:
            return proc, log, m.group(1).decode()
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop_isoboxd(proc, data_dir)
    with open(log.name, "rb") as f:
        sys.exit(f"error: isoboxd did not start:\n{f.read().decode(errors='replace')[-3000:]}")


def mounts_under(prefix):
    with open("/proc/self/mounts") as f:
        return [p for p in (line.split()[1] for line in f) if p.startswith(prefix.rstrip("/") + "/")]


def stop_isoboxd(proc, data_dir):
    """SIGTERM, 20 s, SIGKILL; then the checks and the data dir. Returns problems found."""
    problems = []
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            problems.append("isoboxd ignored SIGTERM for 20 s; sent SIGKILL")
            proc.kill()
            proc.wait()
    left = []
    for _ in range(20):
        left = [d for d in os.listdir("/sys/fs/cgroup") if os.path.isdir(f"/sys/fs/cgroup/{d}/{INSTANCE}")]
        if not left:
            break
        time.sleep(0.1)
    if left:
        problems.append(f"cgroup slice {INSTANCE} left behind in {left}")
    mounted = mounts_under(data_dir)
    for m in reversed(mounted):
        subprocess.run(["umount", "-l", m], check=False)
    if mounted:
        problems.append(f"workspaces still mounted after shutdown: {mounted}")
    shutil.rmtree(data_dir, ignore_errors=True)
    if os.path.exists(data_dir):
        problems.append(f"{data_dir} could not be removed")
    return problems


# --- main -------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url", nargs="?", help="a running isoboxd (http://HOST:PORT); default: start one")
    ap.add_argument("--iterations", type=int, default=int(os.environ.get("SESS_ITER", "30")))
    ap.add_argument("--file-rounds", type=int, default=int(os.environ.get("SESS_FILE_ROUNDS", "10")))
    ap.add_argument("--file-mib", type=int, default=1)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    proc, data_dir, problems, failures = None, None, [], 0
    try:
        url = args.url
        if url is None:
            if os.geteuid() != 0:
                sys.exit("error: run as root to start isoboxd (cgroups, loop mounts, runsc)")
            data_dir = f"/tmp/isobox-bench-sess-{os.getpid()}"
            proc, _log, url = start_isoboxd(data_dir)
        c = Client(url)
        print(
            f"== sessions: {RUNTIME} `{CODE}` (network false), {args.iterations} iterations at c=1, "
            f"alternating with POST /execute; isoboxd {url}; load average before: {loadavg()}"
        )
        # Warm-up (page cache, runsc binary, first mkfs): not counted.
        for _ in range(2):
            plain_execute(c)
            session_cycle(c)
        samples = {}
        for i in range(args.iterations):
            # Alternate which goes first so drift in background load hits both.
            order = (plain_execute, session_cycle) if i % 2 == 0 else (session_cycle, plain_execute)
            for fn in order:
                try:
                    for k, v in fn(c).items():
                        samples.setdefault(k, []).append(v)
                except Failure as e:
                    failures += 1
                    print(f"   failure: {e}")
            if proc is not None and proc.poll() is not None:
                sys.exit(f"error: isoboxd exited (status {proc.returncode}) during the benchmark")
        need = ("create", "exec", "delete", "total", "execute")
        if any(k not in samples for k in need):
            sys.exit("error: no complete iteration")
        outside_exec = [a - b for a, b in zip(samples["exec"], samples["exec_dur"])]
        outside_execute = [a - b for a, b in zip(samples["execute"], samples["execute_dur"])]
        print(f"{'phase':<38} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
        print(row("POST /v1/sessions (create)", samples["create"]))
        print(row("POST /v1/sessions/{id}/exec", samples["exec"]))
        print(row("  of which run.durationMs", samples["exec_dur"]))
        print(row("  outside the sandbox", outside_exec))
        print(row("DELETE /v1/sessions/{id}", samples["delete"]))
        print(row("session total (create+exec+delete)", samples["total"]))
        print(row("POST /execute (reference)", samples["execute"]))
        print(row("  of which run.durationMs", samples["execute_dur"]))
        print(row("  outside the sandbox", outside_execute))
        print(f"ratio session total / execute: {ratio(samples['total'], samples['execute'])}")
        print(f"ratio session exec step / execute: {ratio(samples['exec'], samples['execute'])}")
        print(
            f"outside the sandbox, session exec minus execute: p50 "
            f"{(percentile(outside_exec, 50) - percentile(outside_execute, 50)) * 1000:.1f} ms"
        )
        print()

        size = args.file_mib * MIB
        first, puts, gets = file_api(c, args.file_rounds, size)
        mib = size / MIB
        print(f"== file API: {args.file_mib} MiB file, one session, {args.file_rounds} rounds of PUT + GET (c=1)")
        print(f"{'op':<38} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'MiB/s':>8}")
        print(f"{'first PUT (mounts the workspace)':<38} {first * 1000:>8.1f} {'':>8} {'':>8} {mib / first:>8.1f}")
        for name, xs in (("PUT /v1/sessions/{id}/fs", puts), ("GET /v1/sessions/{id}/fs", gets)):
            print(
                f"{name:<38} {percentile(xs, 50) * 1000:>8.1f} {percentile(xs, 90) * 1000:>8.1f} "
                f"{percentile(xs, 99) * 1000:>8.1f} {mib / percentile(xs, 50):>8.1f}"
            )
        print(f"load average after: {loadavg()}")
    finally:
        if data_dir is not None:
            problems = stop_isoboxd(proc, data_dir)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if failures:
        print(f"error: {failures} iterations failed", file=sys.stderr)
    return 1 if problems or failures else 0


if __name__ == "__main__":
    sys.exit(main())

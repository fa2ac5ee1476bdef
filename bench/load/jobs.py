#!/usr/bin/env python3
"""WBX background jobs (`/wbx/v1/jobs`), beside the same command run through a
sandbox directly, in one run; one table.

  submit          POST /wbx/v1/jobs {"command": "true"}: the 202, which comes once the
                  job is committed to LMDB (one fsync: the durability a job costs)
  submit→running  from the submit to the job's command running (its sandbox booted,
                  init's hello, the spawn): polled by POST /wbx/v1/jobs/wait with
                  timeout_s 0 every 5 ms; the job's own started_at is not used
                  (whole seconds)
  … warm pool     the same with network full (what the pool holds,
                  ISOBOX_WBX_WARM_POOL=base=1), once /healthz says the pool's sandbox
                  is ready: the job takes it instead of booting one (the other rows use
                  network none, which is never pooled, and wait for the pool to be full
                  first, so no refill runs beside them; the pool's refill after a warm
                  job's claim does run beside that job, as it would in service)
  job end to end  submit → `completed` seen by a held POST /wbx/v1/jobs/wait
  wait wake-up    a held wait on a running `sleep 60` job, woken by its end: the
                  job is cancelled (POST …/cancel answers once the end is written),
                  and the time from the cancel's answer to the held wait's answer is
                  what the wake-up adds
  sandbox direct  the same `true` through the sandboxes the job uses: POST
                  /wbx/v1/sandboxes (network none), POST …/exec {"cmd": "true"},
                  DELETE: what a client doing it by hand pays
  jobs/s          N jobs of `true` submitted at once and waited for (all), at the
                  server's ISOBOX_WBX_JOBS_RUNNING, beside N create+exec+delete cycles
                  run ISOBOX_WBX_JOBS_RUNNING at a time
  webhook         with webhook_url on a loopback receiver (ISOBOX_WBX_WEBHOOK_LOOPBACK=1):
                  from the wait's answer (the end written) to the delivery's arrival

Usage (root, after `cargo build --release --bins` and `make runtimes`):
  python3 bench/load/jobs.py [--runs 20] [--burst 20]
"""

import argparse
import http.server
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sessions as base  # noqa: E402

NONE = {"mode": "none"}


def call(c, method, path, obj=None, want=200):
    body = json.dumps(obj).encode() if obj is not None else b""
    st, data, dt = c.request(method, path, body, {"Content-Type": "application/json"})
    base.expect(st, want, data, f"{method} {path}")
    return (json.loads(data) if data else None), dt


def wait(c, ids, timeout=60, until="all"):
    v, dt = call(c, "POST", "/wbx/v1/jobs/wait", {"job_ids": ids, "until": until, "timeout_s": timeout})
    return v, dt


def pool_ready(c):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        h, _ = call(c, "GET", "/healthz")
        # Absent until the daemon's start-up probe has passed and the pool began.
        pool = h.get("wbxWarmPool") or {}
        if pool.get("templates", {}).get("base", {}).get("ready", 0) >= 1:
            return pool
        time.sleep(0.01)
    raise base.Failure("the warm pool did not fill within 60 s")


def one_job(c, network=NONE):
    pool_ready(c)
    t0 = time.perf_counter()
    job, submit = call(c, "POST", "/wbx/v1/jobs", {"command": "true", "network": network}, 202)
    jid = job["id"]
    running = None
    while running is None:
        v, _ = wait(c, [jid], 0)
        st = v["items"][0]["status"]
        if st in ("running", "uploading_artifacts", "completed"):
            running = time.perf_counter() - t0
            break
        time.sleep(0.005)
    v, _ = wait(c, [jid])
    end = time.perf_counter() - t0
    if not v["done"] or v["items"][0]["status"] != "completed":
        raise base.Failure(f"job {jid}: {v}")
    return submit, running, end


def direct(c, wait_pool=True):
    if wait_pool:
        pool_ready(c)
    t0 = time.perf_counter()
    sb, _ = call(c, "POST", "/wbx/v1/sandboxes", {"network": NONE}, 201)
    r, _ = call(c, "POST", f"/wbx/v1/sandboxes/{sb['id']}/exec", {"cmd": "true"})
    if r["exit_code"] != 0:
        raise base.Failure(f"exec: {r}")
    call(c, "DELETE", f"/wbx/v1/sandboxes/{sb['id']}", want=204)
    return time.perf_counter() - t0


def wake_up(c):
    job, _ = call(c, "POST", "/wbx/v1/jobs", {"command": "sleep 60", "network": NONE}, 202)
    jid = job["id"]
    while wait(c, [jid], 0)[0]["items"][0]["status"] != "running":
        time.sleep(0.01)
    out = {}

    def held():
        v, _ = wait(c, [jid], 60, "any")
        out["at"] = time.perf_counter()
        out["v"] = v

    th = threading.Thread(target=held)
    th.start()
    time.sleep(0.2)
    call(c, "POST", f"/wbx/v1/jobs/{jid}/cancel")
    cancelled = time.perf_counter()
    th.join()
    if not out["v"]["done"]:
        raise base.Failure(f"wait: {out['v']}")
    return max(0.0, out["at"] - cancelled)


class Hook(http.server.BaseHTTPRequestHandler):
    arrived = []

    def do_POST(self):  # noqa: N802
        n = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(n)
        Hook.arrived.append((time.perf_counter(), json.loads(body)["id"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def webhook(c, port):
    job, _ = call(c, "POST", "/wbx/v1/jobs",
                  {"command": "true", "network": NONE, "webhook_url": f"http://127.0.0.1:{port}/h"}, 202)
    jid = job["id"]
    wait(c, [jid])
    ended = time.perf_counter()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        hit = [t for t, i in Hook.arrived if i == jid]
        if hit:
            return max(0.0, hit[0] - ended)
        time.sleep(0.002)
    raise base.Failure(f"no webhook for {jid}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--burst", type=int, default=20)
    a = p.parse_args()
    base.INSTANCE = "isobox-bench-jobs"
    for k, v in {
        "ISOBOX_WARM_POOL": "off", "ISOBOX_WBX_WARM_POOL": "base=1", "ISOBOX_EGRESS": "off",
        "ISOBOX_WBX_WEBHOOK_LOOPBACK": "1", "ISOBOX_WBX_JOBS_RUNNING": "2",
        "ISOBOX_WASM_WORKER": "off",
    }.items():
        os.environ[k] = v
    running = int(os.environ["ISOBOX_WBX_JOBS_RUNNING"])
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    data_dir = tempfile.mkdtemp(prefix="isobox-bench-jobs-")
    proc, log, url = base.start_isoboxd(data_dir)
    problems = []
    try:
        c = base.Client(url)
        for _ in range(2):
            one_job(c)
            direct(c)
        t = {"submit": [], "running": [], "end": [], "direct": [], "wake": [], "hook": [],
             "warm": [], "warm_end": []}
        hits0 = pool_ready(c)["hits"]
        for i in range(a.runs):
            # Alternate, so drift hits both alike. A job's sandbox is removed ~1.5 s
            # after its end (and it keeps its slot until then): a direct cycle after
            # each job outlasts that, so no measured job runs beside a teardown or
            # waits for a slot.
            for warm in (False, True) if i % 2 == 0 else (True, False):
                if warm:
                    _, r, e = one_job(c, {"mode": "full"})
                    t["warm"].append(r)
                    t["warm_end"].append(e)
                else:
                    s, r, e = one_job(c)
                    t["submit"].append(s)
                    t["running"].append(r)
                    t["end"].append(e)
                t["direct"].append(direct(c))
        for i in range(max(5, a.runs // 4)):
            t["wake"].append(wake_up(c))
            t["hook"].append(webhook(c, srv.server_address[1]))
            direct(c)
        # Throughput: a burst of jobs, then the same number of direct cycles at the
        # same width.
        t0 = time.perf_counter()
        ids = [call(c, "POST", "/wbx/v1/jobs", {"command": "true", "network": NONE}, 202)[0]["id"]
               for _ in range(a.burst)]
        while True:
            v, _ = wait(c, ids)
            if v["done"]:
                break
        jobs_rate = a.burst / (time.perf_counter() - t0)
        pool_ready(c)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(running) as ex:
            list(ex.map(lambda _: direct(c, False), range(a.burst)))
        direct_rate = a.burst / (time.perf_counter() - t0)
        print(f"# jobs bench: {a.runs} runs, burst {a.burst}, ISOBOX_WBX_JOBS_RUNNING={running}, load {base.loadavg()}")
        print(f"{'':<38} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'mean':>8}")
        print(base.row("submit (202, committed)", t["submit"]))
        print(base.row("job: submit -> running", t["running"]))
        print(base.row("job: submit -> completed (wait)", t["end"]))
        print(base.row("job, warm pool: submit -> running", t["warm"]))
        print(base.row("job, warm pool: submit -> completed", t["warm_end"]))
        print(base.row("direct: create + exec true + delete", t["direct"]))
        print(base.row("wait wake-up after the end", t["wake"]))
        print(base.row("webhook: end -> delivery arrives", t["hook"]))
        print(f"job end-to-end / direct: {base.ratio(t['end'], t['direct'])}")
        print(f"submit -> running, warm / cold: {base.ratio(t['warm'], t['running'])}")
        hits = pool_ready(c)["hits"] - hits0
        print(f"warm pool hits: {hits} of {a.runs} warm-row jobs")
        if hits != a.runs:
            raise base.Failure(f"only {hits} of {a.runs} warm-row jobs took the pooled sandbox")
        print(f"throughput: jobs {jobs_rate:.2f}/s, direct cycles {direct_rate:.2f}/s (ratio {jobs_rate / direct_rate:.2f}x)")
    except base.Failure as e:
        problems.append(str(e))
    finally:
        problems += base.stop_isoboxd(proc, data_dir)
        srv.shutdown()
    if problems:
        print("\n".join(f"FAIL {p}" for p in problems))
        sys.exit(1)


if __name__ == "__main__":
    main()

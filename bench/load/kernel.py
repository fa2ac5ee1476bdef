#!/usr/bin/env python3
"""Kernel sessions: the latency of one warm step, beside a local Jupyter kernel.

In one kernel session (python, network off) isoboxd runs `x = 0`, then N steps
(default 300) of `x = x + 1`, each a `POST /v1/sessions/{id}/exec` on one keep-alive
connection, at concurrency 1; at the end `print(x)` must say N. Reported: p50/p90/p99
of the client's round trip (connect is not counted: the connection is reused) and of
isoboxd's own `run.durationMs` (the step inside the sandbox).

The reference, in the same run and on the same machine: a local IPython kernel
(ipykernel and jupyter_client from PyPI, installed into /tmp/isobox-bench-jupyter when
missing), driven by jupyter_client: `kc.execute("x = x + 1")`, then wait for the
kernel's `status: idle` on IOPub (the point a notebook knows the cell ended). Same N,
alternating in blocks of 10 so background load hits both. The headline is the ratio
isobox round trip / Jupyter round trip. For scale, the cold path (`POST /execute` of
the same line, a fresh sandbox) is measured too (default 10 runs).

With no URL the script starts its own isoboxd on an ephemeral loopback port
(instance isobox-bench-kern, data dir /tmp/isobox-bench-kern-PID) and stops it at the
end, checking that the slice is gone and nothing stayed mounted.

Usage (root): python3 bench/load/kernel.py [URL] [--steps 300] [--cold 10]
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sessions as base  # noqa: E402  (Client, statistics, start/stop of isoboxd)

base.INSTANCE = "isobox-bench-kern"
JUPYTER_VENV = os.environ.get("JUPYTER_VENV", "/tmp/isobox-bench-jupyter")


class Keep:
    """One keep-alive connection."""

    def __init__(self, url):
        c = base.Client(url)
        self.conn = http.client.HTTPConnection(c.host, c.port, timeout=120)

    def post(self, path, obj, token=None):
        hdrs = {"Content-Type": "application/json"}
        if token:
            hdrs["X-Session-Token"] = token
        t0 = time.perf_counter()
        self.conn.request("POST", path, body=json.dumps(obj).encode(), headers=hdrs)
        r = self.conn.getresponse()
        data = r.read()
        return r.status, data, time.perf_counter() - t0

    def delete(self, path, token):
        self.conn.request("DELETE", path, headers={"X-Session-Token": token})
        r = self.conn.getresponse()
        r.read()
        return r.status


def jupyter_python():
    py = os.path.join(JUPYTER_VENV, "bin/python")
    if not os.access(py, os.X_OK):
        subprocess.run([sys.executable, "-m", "venv", JUPYTER_VENV], check=True)
    ok = subprocess.run([py, "-c", "import ipykernel, jupyter_client"], capture_output=True).returncode == 0
    if not ok:
        print("   installing ipykernel and jupyter_client from PyPI into", JUPYTER_VENV)
        subprocess.run([py, "-m", "pip", "install", "-q", "ipykernel", "jupyter_client"], check=True)
    return py


JUPYTER_DRIVER = r"""
import json, sys, time
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3")
def run(code):
    t0 = time.perf_counter()
    mid = kc.execute(code, store_history=False)
    while True:
        m = kc.get_iopub_msg(timeout=30)
        if m["parent_header"].get("msg_id") == mid and m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            break
    kc.get_shell_msg(timeout=30)
    return time.perf_counter() - t0
run("x = 0")
for _ in range(20):
    run("pass")
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    print(json.dumps([run("x = x + 1") for _ in range(n)]), flush=True)
mid = kc.execute("print(x)")
out = ""
while True:
    m = kc.get_iopub_msg(timeout=30)
    if m["msg_type"] == "stream":
        out += m["content"]["text"]
    if m["parent_header"].get("msg_id") == mid and m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
        break
print(json.dumps({"x": out.strip()}), flush=True)
kc.stop_channels()
km.shutdown_kernel(now=True)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url", nargs="?")
    ap.add_argument("--steps", type=int, default=int(os.environ.get("KERNEL_STEPS", "300")))
    ap.add_argument("--cold", type=int, default=int(os.environ.get("KERNEL_COLD", "10")))
    args = ap.parse_args()
    proc, data_dir, problems = None, None, []
    jup = None
    try:
        url = args.url
        if url is None:
            data_dir = f"/tmp/isobox-bench-kern-{os.getpid()}"
            proc, _log, url = base.start_isoboxd(data_dir)
        k = Keep(url)
        # Ready (the startup probe passed) before the first create.
        for _ in range(600):
            k.conn.request("GET", "/readyz")
            r = k.conn.getresponse()
            r.read()
            if r.status == 200:
                break
            time.sleep(0.1)
        st, data, boot = k.post("/v1/sessions", {"runtime": "python", "type": "kernel", "network": False})
        base.expect(st, 201, data, "kernel create")
        s = json.loads(data)
        path = f"/v1/sessions/{s['id']}/exec"
        jup = subprocess.Popen(
            [jupyter_python(), "-c", JUPYTER_DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        if jup.stdout.readline().strip() != "ready":
            raise base.Failure("the Jupyter kernel did not start")
        print(
            f"== kernel steps: `x = x + 1` x {args.steps} at c=1 on one keep-alive connection, "
            f"beside a local IPython kernel (jupyter_client); isoboxd {url}; load average before: {base.loadavg()}"
        )
        st, data, _ = k.post(path, {"code": "x = 0"}, s["token"])
        base.expect(st, 200, data, "x = 0")
        for _ in range(20):
            k.post(path, {"code": "pass"}, s["token"])
        rt, inside, jt = [], [], []
        done = 0
        while done < args.steps:
            n = min(10, args.steps - done)
            for _ in range(n):
                st, data, t = k.post(path, {"code": "x = x + 1"}, s["token"])
                base.expect(st, 200, data, "step")
                v = json.loads(data)
                if v["run"]["exitCode"] != 0:
                    raise base.Failure(f"step failed: {v}")
                rt.append(t)
                inside.append(v["run"]["durationMs"] / 1000)
            jup.stdin.write(f"{n}\n")
            jup.stdin.flush()
            jt.extend(json.loads(jup.stdout.readline()))
            done += n
        st, data, _ = k.post(path, {"code": "print(x)"}, s["token"])
        got = json.loads(data)["run"]["stdout"]
        if got != f"{args.steps}\n":
            raise base.Failure(f"isobox kernel: x is {got!r}, want {args.steps}")
        jup.stdin.close()
        jx = json.loads(jup.stdout.readline())["x"]
        if jx != str(args.steps):
            raise base.Failure(f"Jupyter: x is {jx!r}, want {args.steps}")
        jup.wait(timeout=30)
        cold = []
        for _ in range(args.cold):
            st, data, t = k.post("/execute", {"language": "python", "code": "x = 1", "network": False})
            base.expect(st, 200, data, "cold /execute")
            cold.append(t)
        if k.delete(f"/v1/sessions/{s['id']}", s["token"]) != 204:
            raise base.Failure("delete failed")
        print(f"   kernel create (boot to ready): {boot * 1000:.0f} ms")
        print(f"   {'ms':<38} {'p50':>8} {'p90':>8} {'p99':>8} {'mean':>8}")
        print("   " + base.row("isobox kernel step (round trip)", rt))
        print("   " + base.row("isobox kernel step (run.durationMs)", inside))
        print("   " + base.row("IPython kernel via jupyter_client", jt))
        print("   " + base.row(f"cold POST /execute ({args.cold} runs)", cold))
        print(f"   ratio isobox / Jupyter: {base.ratio(rt, jt)}")
        print(f"   load average after: {base.loadavg()}")
    except base.Failure as e:
        problems.append(str(e))
    finally:
        if jup is not None and jup.poll() is None:
            jup.kill()
        if proc is not None:
            problems += base.stop_isoboxd(proc, data_dir)
    for p in problems:
        print(f"   FAIL: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

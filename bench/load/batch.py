#!/usr/bin/env python3
"""Many inputs in one request beside as many separate requests at the same concurrency.

isoboxd is started by the script (ISOBOX_LISTEN=127.0.0.1:PORT, instance
isobox-bench-batch, data dir /tmp/isobox-bench-batch-PID, egress and warm pools off, rate
limit lifted, ISOBOX_MAX_CONCURRENT=SLOTS). The program is python-slim
`print(input())`. In alternating rounds:

  batch     one POST /execute with `inputs`: N inputs (stdin "i"), each in its own
            sandbox; a batch runs at most half of the slots at once (SLOTS/2)
  shared    the same request with "sharedSandbox": true: one sandbox, the inputs one
            after another
  separate  N POST /execute, each with one stdin, from SLOTS/2 client threads (the
            batch's concurrency)

Then the same for go (GO_N inputs, `fmt.Println` of a line read from stdin), where an
isolated input builds the program each time and the shared sandbox builds it once
(separate requests are left out: they are the isolated batch, as python shows).

Reported per mode: runs/s (inputs / wall time of the round) and host CPU-seconds per
input (the whole machine's busy time from /proc/stat over the round, divided by the
inputs: run it on a quiet host), medians over ROUNDS, and the ratios to the isolated
batch; every result is checked (stdout "i\\n", exit 0).

Usage (root): python3 bench/load/batch.py
Settings (environment): N (64), GO_N (8; 0 skips go), ROUNDS (3), SLOTS (4), PORT
(18097), ISOBOXD (binary).
Python 3.11 standard library only.
"""

import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ISOBOXD = os.environ.get("ISOBOXD", os.path.join(ROOT, "target/release/isoboxd"))
N = int(os.environ.get("N", "64"))
GO_N = int(os.environ.get("GO_N", "8"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SLOTS = int(os.environ.get("SLOTS", "4"))
PORT = int(os.environ.get("PORT", "18097"))
CODE = "print(input())"
GO_CODE = ('package main\nimport ("bufio"; "fmt"; "os")\n'
           'func main() { s, _ := bufio.NewReader(os.Stdin).ReadString(\'\\n\'); fmt.Println(s) }\n')


def busy_seconds() -> float:
    """The host's busy CPU time so far (all CPUs; idle and iowait excluded)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def post(body: dict, timeout: float = 600) -> dict:
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    c.request("POST", "/execute", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {data[:300]!r}")
    return json.loads(data)


def batch_round(shared: bool, lang: str = "python-slim", n: int = N) -> tuple[float, float]:
    """(runs/s, host CPU-s per input) of one many-input request."""
    code, want = (GO_CODE, "{i}\n\n") if lang == "go" else (CODE, "{i}\n")
    body = {"language": lang, "network": False, "code": code,
            "inputs": [{"stdin": f"{i}\n"} for i in range(n)]}
    if shared:
        body["sharedSandbox"] = True
    c0, t0 = busy_seconds(), time.monotonic()
    v = post(body)
    wall, cpu = time.monotonic() - t0, busy_seconds() - c0
    res = v["results"]
    assert len(res) == n, len(res)
    for i, r in enumerate(res):
        assert r.get("stdout") == want.format(i=i) and r["exitCode"] == 0, (i, r)
    if shared:
        assert v["shared"]["sandboxes"] == 1, v["shared"]
    return n / wall, cpu / n


def separate_round(conc: int) -> tuple[float, float]:
    todo = list(range(N))
    lock = threading.Lock()
    errors = []

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            try:
                v = post({"language": "python-slim", "network": False, "code": CODE, "stdin": str(i)})
                assert v["run"]["stdout"] == f"{i}\n" and v["run"]["exitCode"] == 0, v
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return

    c0, t0 = busy_seconds(), time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.monotonic() - t0, busy_seconds() - c0
    if errors:
        raise errors[0]
    return N / wall, cpu / N


def table(title: str, rows: dict) -> None:
    """Medians of each mode, and each one's ratios to the first row."""
    print(f"\n{title}")
    print("| mode | runs/s (median) | host CPU-s per input (median) | runs/s ratio | CPU ratio | rounds (runs/s) |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    base = None
    for name, v in rows.items():
        rate = statistics.median(x[0] for x in v)
        cpu = statistics.median(x[1] for x in v)
        base = base or (rate, cpu)
        print(f"| {name} | {rate:.2f} | {cpu:.3f} | {rate / base[0]:.2f} | {cpu / base[1]:.2f} | "
              f"{', '.join(f'{x[0]:.2f}' for x in v)} |")


def main() -> int:
    if not os.path.exists(ISOBOXD):
        print(f"{ISOBOXD} missing: cargo build --release", file=sys.stderr)
        return 2
    data = f"/tmp/isobox-bench-batch-{os.getpid()}"
    os.makedirs(data, exist_ok=True)
    env = dict(os.environ, ISOBOX_INSTANCE="isobox-bench-batch", ISOBOX_DATA_DIR=data,
               ISOBOX_LISTEN=f"127.0.0.1:{PORT}", ISOBOX_EGRESS="off", ISOBOX_WARM_POOL="off",
               ISOBOX_WBX_WARM_POOL="off", ISOBOX_MAX_CONCURRENT=str(SLOTS),
               ISOBOX_RATE_PER_MIN="1000000", ISOBOX_RATE_BURST="100000", ISOBOX_LOG="warn")
    log = open(f"{data}.log", "w")
    d = subprocess.Popen([ISOBOXD], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=2)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            print("isoboxd not ready", file=sys.stderr)
            return 1
        conc = max(1, SLOTS // 2)
        for i in range(4):
            post({"language": "python-slim", "network": False, "code": CODE, "stdin": "w"})
        modes = {"batch": [], "shared": [], "separate": []}
        for r in range(ROUNDS):
            modes["batch"].append(batch_round(False))
            modes["shared"].append(batch_round(True))
            modes["separate"].append(separate_round(conc))
            print(f"round {r + 1}: " + ", ".join(
                f"{k} {v[-1][0]:.2f} runs/s {v[-1][1]:.3f} CPU-s" for k, v in modes.items()), flush=True)
        table(f"{N} inputs of python-slim print(input()), {SLOTS} slots, concurrency {conc}", {
            f"one request, {N} inputs, a sandbox each": modes["batch"],
            f"one request, {N} inputs, one shared sandbox": modes["shared"],
            f"{N} requests, {conc} at a time": modes["separate"],
        })
        if GO_N > 0:
            post({"language": "go", "network": False, "code": GO_CODE, "stdin": "w\n"})
            go = {"batch": [], "shared": []}
            for r in range(ROUNDS):
                go["batch"].append(batch_round(False, "go", GO_N))
                go["shared"].append(batch_round(True, "go", GO_N))
                print(f"go round {r + 1}: " + ", ".join(
                    f"{k} {v[-1][0]:.2f} runs/s {v[-1][1]:.3f} CPU-s" for k, v in go.items()), flush=True)
            table(f"{GO_N} inputs of go (read a line, print it), {SLOTS} slots", {
                f"one request, {GO_N} inputs, a sandbox and a build each": go["batch"],
                f"one request, {GO_N} inputs, one shared sandbox, one build": go["shared"],
            })
        return 0
    finally:
        d.terminate()
        try:
            d.wait(30)
        except subprocess.TimeoutExpired:
            d.kill()
        log.close()
        shutil.rmtree(data, ignore_errors=True)
        try:
            os.remove(f"{data}.log")
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())

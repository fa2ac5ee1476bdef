#!/usr/bin/env python3
"""Many inputs in one request beside as many separate requests at the same concurrency.

isoboxd is started by the script (ISOBOX_LISTEN=127.0.0.1:PORT, instance
isobox-bench-batch, data dir /tmp/isobox-bench-batch-PID, egress and warm pools off, rate
limit lifted, ISOBOX_MAX_CONCURRENT=SLOTS). The program is python-slim
`print(input())`. In alternating rounds:

  batch     one POST /execute with `inputs`: N inputs (stdin "i"); a batch runs at most
            half of the slots at once (SLOTS/2)
  separate  N POST /execute, each with one stdin, from SLOTS/2 client threads (the
            batch's concurrency)

Reported per mode: runs/s (N / wall time of the round), median over ROUNDS, and the
ratio batch / separate; every result is checked (stdout "i\\n", exit 0).

Usage (root): python3 bench/load/batch.py
Settings (environment): N (64), ROUNDS (3), SLOTS (4), PORT (18097), ISOBOXD (binary).
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
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SLOTS = int(os.environ.get("SLOTS", "4"))
PORT = int(os.environ.get("PORT", "18097"))
CODE = "print(input())"


def post(body: dict, timeout: float = 600) -> dict:
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    c.request("POST", "/execute", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {data[:300]!r}")
    return json.loads(data)


def batch_round() -> float:
    t0 = time.monotonic()
    v = post({"language": "python-slim", "network": False, "code": CODE,
              "inputs": [{"stdin": str(i)} for i in range(N)]})
    wall = time.monotonic() - t0
    res = v["results"]
    assert len(res) == N, len(res)
    for i, r in enumerate(res):
        assert r["stdout"] == f"{i}\n" and r["exitCode"] == 0, (i, r)
    return N / wall


def separate_round(conc: int) -> float:
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

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    if errors:
        raise errors[0]
    return N / wall


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
        b, s = [], []
        for r in range(ROUNDS):
            b.append(batch_round())
            s.append(separate_round(conc))
            print(f"round {r + 1}: batch {b[-1]:.2f} runs/s, separate {s[-1]:.2f} runs/s", flush=True)
        mb, ms = statistics.median(b), statistics.median(s)
        print(f"\n{N} inputs of python-slim print(input()), {SLOTS} slots, concurrency {conc}")
        print("| mode | runs/s (median) | rounds |")
        print("| --- | ---: | --- |")
        print(f"| one request, {N} inputs | {mb:.2f} | {', '.join(f'{x:.2f}' for x in b)} |")
        print(f"| {N} requests, {conc} at a time | {ms:.2f} | {', '.join(f'{x:.2f}' for x in s)} |")
        print(f"\nratio batch / separate: {mb / ms:.2f}")
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

#!/usr/bin/env python3
"""The eryx face's WebSocket (`/eryx/v1/stream`): a callback's round trip, beside a
plain WebSocket echo, side by side in one run, with the same client library.

  echo         a `websockets` echo server on 127.0.0.1 in a process of its own: the
               client sends a small JSON message and waits for it back. The floor:
               two WebSocket messages over loopback, nothing else.
  callback     one run on an isoboxd (instance isobox-bench-eryx-ws) whose code awaits
               a callback CALLS times in a row; the client answers each at once. A
               round trip is from the client sending its `callback_response` to the
               next `callback` arriving: daemon → supervisor → worker → Python resumes,
               calls again → worker → supervisor → daemon → client.
  run          a whole execute → completed of `print(1 + 1)` over the WebSocket, beside
               the same over HTTP (POST /eryx/v1/execute): what the stream costs a run.

Columns: p50 and p99 (ms), and the callback's p50 as a ratio of the echo's. Compute
units of the callback run, and of the same run answered after a pause (they must be
equal: waiting costs none).

Usage (root, after `cargo build --release` and `make wasm-snapshot`; the tests' venv
has `websockets`):
  /tmp/isobox-test-venv/bin/python bench/load/eryx_ws.py [--rounds 5]
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eryx as http_bench  # noqa: E402
import sessions as base  # noqa: E402

import websockets  # noqa: E402

CALLS = 100
RUNS = 100
ECHO_PORT = 18097
ECHO = f"""
import asyncio, websockets
async def echo(ws):
    async for m in ws:
        await ws.send(m)
async def main():
    async with websockets.serve(echo, "127.0.0.1", {ECHO_PORT}):
        await asyncio.Future()
asyncio.run(main())
"""


async def echo_rtts(n):
    async with websockets.connect(f"ws://127.0.0.1:{ECHO_PORT}") as ws:
        out = []
        msg = json.dumps({"type": "callback_response", "call_id": "0" * 32, "result": 1})
        for _ in range(n + 5):
            t0 = time.perf_counter()
            await ws.send(msg)
            await ws.recv()
            out.append(time.perf_counter() - t0)
        return out[5:]


async def callback_rtts(url, pause=0.0):
    """One run of CALLS sequential calls: the round trips, and the run's units."""
    code = f"for i in range({CALLS}):\n    assert await f(i=i) == i\nprint('ok')\n"
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "execute", "code": code, "callbacks": [{"name": "f"}]}))
        out, sent = [], None
        async for raw in ws:
            m = json.loads(raw)
            if m["type"] == "callback":
                if sent is not None:
                    out.append(time.perf_counter() - sent)
                if pause:
                    await asyncio.sleep(pause)
                sent = time.perf_counter()
                await ws.send(json.dumps({"type": "callback_response", "call_id": m["call_id"],
                                          "result": m["args"]["i"]}))
            else:
                if m.get("status") != "success":
                    sys.exit(f"error: {m}")
                return out, m["compute_units"]


async def stream_runs(url, n):
    async with websockets.connect(url) as ws:
        out = []
        for i in range(n + 5):
            t0 = time.perf_counter()
            await ws.send(json.dumps({"type": "execute", "code": "print(1 + 1)"}))
            m = json.loads(await ws.recv())
            out.append(time.perf_counter() - t0)
            if m.get("status") != "success":
                sys.exit(f"error: {m}")
        return out[5:]


def ms(xs):
    ys = [x * 1000 for x in xs]
    return base.percentile(ys, 50), base.percentile(ys, 99)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    base.INSTANCE = "isobox-bench-eryx-ws"
    data_dir = f"/tmp/isobox-bench-eryx-ws-{os.getpid()}"
    for k, v in {"ISOBOX_WARM_POOL": "off", "ISOBOX_WBX_WARM_POOL": "off",
                 "ISOBOX_EGRESS": "off"}.items():
        os.environ[k] = v
    echo = subprocess.Popen([sys.executable, "-c", ECHO])
    proc, log, url = base.start_isoboxd(data_dir)
    ws_url = url.replace("http://", "ws://") + "/eryx/v1/stream"
    problems = []
    try:
        time.sleep(0.5)
        conn = http_bench.client(url)
        http_bench.one(conn, "print(0)")  # the worker starts here, uncounted
        echo_t, cb_t, units = [], [], None
        for _ in range(a.rounds):
            echo_t += asyncio.run(echo_rtts(CALLS))
            t, units = asyncio.run(callback_rtts(ws_url))
            cb_t += t
        _, paused_units = asyncio.run(callback_rtts(ws_url, pause=0.01))
        if paused_units != units:
            problems.append(f"{units} units answered at once, {paused_units} after a pause")
        run_ws = asyncio.run(stream_runs(ws_url, RUNS))
        run_http = []
        for _ in range(5):
            http_bench.one(conn, "print(1 + 1)")
        for _ in range(RUNS):
            run_http.append(http_bench.one(conn, "print(1 + 1)")[0])
        conn.close()
        e50, e99 = ms(echo_t)
        c50, c99 = ms(cb_t)
        w50, w99 = ms(run_ws)
        h50, h99 = ms(run_http)
        print(f"eryx WebSocket, {a.rounds} runs of {CALLS} calls ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
        print(f"{'what':<34} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>8}")
        print(f"{'WebSocket echo (reference)':<34} {e50:>8.3f} {e99:>8.3f} {'1.00x':>8}")
        print(f"{'callback round trip':<34} {c50:>8.3f} {c99:>8.3f} {c50 / e50:>7.2f}x")
        print(f"{'print(1 + 1) over HTTP (reference)':<34} {h50:>8.2f} {h99:>8.2f} {'1.00x':>8}")
        print(f"{'print(1 + 1) over the WebSocket':<34} {w50:>8.2f} {w99:>8.2f} {w50 / h50:>7.2f}x")
        print(f"compute units of the {CALLS}-call run: {units} (answered after 10 ms pauses: {paused_units})")
    finally:
        echo.kill()
        echo.wait()
        problems += base.stop_isoboxd(proc, data_dir)
    for p in problems:
        print(f"PROBLEM: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

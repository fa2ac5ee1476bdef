"""Drives the eryx face's `/v1/stream` WebSocket the way a client does (the
`websockets` package, as the document's example client), for tests/eryx_stream.rs.

    python eryx_ws.py URL SCENARIO [KEY]

Prints one JSON object: what the scenario saw. The Rust test asserts on it.
"""

import asyncio
import json
import sys
import time

import websockets

URL, SCENARIO = sys.argv[1], sys.argv[2]
KEY = sys.argv[3] if len(sys.argv) > 3 else None
HEADERS = {"Authorization": f"Bearer {KEY}"} if KEY else {}


def connect():
    return websockets.connect(URL, additional_headers=HEADERS, max_size=8 << 20)


async def run(ws, msg, answer=None, seen=None):
    """Sends `msg`, answers callbacks with `answer(m)` (None: no answer), and returns
    the `completed` or `error` that ends it; `seen` collects every callback."""
    await ws.send(json.dumps(msg))
    async for raw in ws:
        m = json.loads(raw)
        if m["type"] == "callback":
            if seen is not None:
                seen.append(m)
            if answer is not None:
                reply = await answer(m)
                if reply is not None:
                    await ws.send(json.dumps(reply))
        elif m["type"] in ("completed", "error"):
            return m
    raise RuntimeError("connection ended")


def result(m, value):
    return {"type": "callback_response", "call_id": m["call_id"], "result": value}


async def callbacks():
    out = {}
    async with connect() as ws:
        # Five calls gathered, answered in reverse order once all five are in.
        pending = []
        code = (
            "import asyncio\n"
            "r = await asyncio.gather(*[double(x=i) for i in range(5)])\n"
            "print(r)\n"
        )
        await ws.send(json.dumps({"type": "execute", "code": code,
                                  "callbacks": [{"name": "double", "description": "2x"}]}))
        async for raw in ws:
            m = json.loads(raw)
            if m["type"] == "callback":
                pending.append(m)
                if len(pending) == 5:
                    for p in reversed(pending):
                        await ws.send(json.dumps(result(p, p["args"]["x"] * 2)))
            else:
                out["gather"] = m
                out["gather_calls"] = [p["args"] for p in pending]
                out["gather_ids_unique"] = len({p["call_id"] for p in pending}) == 5
                break

        # The same code answered at once and after a second: the same units.
        code = "v = await get(k='a')\nprint(v)\n"
        listed = [{"name": "get", "description": "a value"}]

        async def now(m):
            return result(m, {"k": m["args"]["k"], "n": [1, 2.5, None, True]})

        async def later(m):
            await asyncio.sleep(1.0)
            return await now(m)

        out["fast"] = await run(ws, {"type": "execute", "code": code, "callbacks": listed}, now)
        t0 = time.monotonic()
        out["slow"] = await run(ws, {"type": "execute", "code": code, "callbacks": listed}, later)
        out["slow_wall_s"] = time.monotonic() - t0

        # 100 calls answered, the 101st raises RuntimeError without reaching us.
        seen = []
        code = (
            "for i in range(100):\n"
            "    assert await f(i=i) == i\n"
            "try:\n"
            "    await f(i=100)\n"
            "except RuntimeError as e:\n"
            "    print('101st:', e)\n"
        )
        out["hundred"] = await run(ws, {"type": "execute", "code": code,
                                        "callbacks": [{"name": "f"}]},
                                   lambda m: asyncio.sleep(0, result(m, m["args"]["i"])), seen)
        out["hundred_calls"] = len(seen)

        # Positional arguments: TypeError, and no callback.
        seen = []
        out["positional"] = await run(ws, {"type": "execute", "code": "await get_user(123)",
                                           "callbacks": [{"name": "get_user"}]}, now, seen)
        out["positional_calls"] = len(seen)

        # A name not listed: NameError.
        out["unlisted"] = await run(ws, {"type": "execute", "code": "await send_email(to='x')",
                                         "callbacks": [{"name": "get_user"}]}, now)

        # An error answer: RuntimeError in Python, with its message.
        async def fail(m):
            return {"type": "callback_response", "call_id": m["call_id"], "error": "No such user"}
        code = "try:\n    await get_user(id=1)\nexcept RuntimeError as e:\n    print('caught', e)\nawait get_user(id=2)\n"
        out["error_answer"] = await run(ws, {"type": "execute", "code": code,
                                             "callbacks": [{"name": "get_user"}]}, fail)

        # No answer: the call fails after the callback timeout.
        t0 = time.monotonic()
        out["unanswered"] = await run(ws, {"type": "execute", "code": "await get_user(id=1)",
                                           "callbacks": [{"name": "get_user"}]}, None)
        out["unanswered_wall_s"] = time.monotonic() - t0

        # Mid-run, anything but a callback_response is ignored; an unknown call_id
        # too; the run then ends once, and the connection runs the next one.
        async def noisy(m):
            await ws.send(json.dumps({"type": "execute", "code": "print('second')"}))
            await ws.send("not json")
            await ws.send(json.dumps({"type": "callback_response", "call_id": "nope", "result": 1}))
            return result(m, 7)
        out["noisy"] = await run(ws, {"type": "execute", "code": "print(await g())",
                                      "callbacks": [{"name": "g"}]}, noisy)
        out["after_noisy"] = await run(ws, {"type": "execute", "code": "print('next')"})
        # Nothing else arrives: the ignored execute did not run.
        try:
            extra = await asyncio.wait_for(ws.recv(), 1.0)
        except asyncio.TimeoutError:
            extra = None
        out["extra"] = extra

        # Bad messages while idle: an error each, and the connection stays open.
        errors = []
        for bad in ["nope", "[1]", json.dumps({"type": "dance"}), json.dumps({"code": "x"}),
                    json.dumps({"type": "execute"}),
                    json.dumps({"type": "execute", "code": "x", "callbacks": "f"}),
                    json.dumps({"type": "execute", "code": "x", "callbacks": [{"name": "not valid"}]}),
                    json.dumps({"type": "execute", "code": "x", "callbacks": [{"name": "class"}]}),
                    json.dumps({"type": "execute", "code": "x", "callbacks": [{"name": "f"}, {"name": "f"}]}),
                    json.dumps({"type": "execute", "code": "x",
                                "callbacks": [{"name": f"f{i}"} for i in range(101)]}),
                    json.dumps({"type": "execute", "code": "x", "session_id": "s1"}),
                    json.dumps({"type": "execute", "code": "x", "timeout_secs": 0}),
                    json.dumps({"type": "execute", "code": "x", "environment": "nope"})]:
            await ws.send(bad)
            errors.append(json.loads(await ws.recv()))
        await ws.send(b"\x00binary")
        errors.append(json.loads(await ws.recv()))
        out["errors"] = errors
        listed = [{"name": f"f{i}"} for i in range(100)]
        out["hundred_listed"] = await run(ws, {"type": "execute", "code": "print(await f99())",
                                               "callbacks": listed},
                                          lambda m: asyncio.sleep(0, result(m, m["name"])))
    return out


async def disconnect():
    """A client that leaves when its run calls: the run ends soon after (its call
    fails at once), not at the callback timeout."""
    out = {}
    async with connect() as ws:
        await ws.send(json.dumps({
            "type": "execute",
            "code": "try:\n    await f(x=1)\nexcept RuntimeError as e:\n    print(e)\nawait f(x=2)\n",
            "callbacks": [{"name": "f"}],
        }))
        m = json.loads(await ws.recv())
        out["first"] = m["type"]
    t0 = time.monotonic()
    # With a concurrency limit of one, the next run starts once that run has ended.
    async with connect() as ws:
        while True:
            m = await run(ws, {"type": "execute", "code": "print('after')"})
            if m["type"] == "completed" or m.get("code") != "concurrency_limit":
                break
            await asyncio.sleep(0.1)
        out["after"] = m
        out["waited_s"] = time.monotonic() - t0
    return out


async def concurrency():
    """Limit one: a second connection's execute while the first waits on a call."""
    out = {}
    async with connect() as a, connect() as b:
        await a.send(json.dumps({"type": "execute", "code": "print(await f())",
                                 "callbacks": [{"name": "f"}]}))
        call = json.loads(await a.recv())
        out["b"] = await run(b, {"type": "execute", "code": "print(1)"})
        await a.send(json.dumps(result(call, "done")))
        out["a"] = json.loads(await a.recv())
        out["b_after"] = await run(b, {"type": "execute", "code": "print(2)"})
    return out


async def rate():
    """Each execute counts against the rate, as the upgrade did."""
    out = []
    async with connect() as ws:
        for i in range(4):
            out.append(await run(ws, {"type": "execute", "code": f"print({i})"}))
    return out


async def session():
    """A session's state over the WebSocket, callbacks included; an unknown session_id
    is an `error` on a connection that stays open; the same state over HTTP."""
    import urllib.request

    base = URL.replace("ws://", "http://", 1).rsplit("/stream", 1)[0]

    def post(path, body):
        req = urllib.request.Request(
            base + path,
            method="POST",
            headers={**HEADERS, "Content-Type": "application/json"},
            data=json.dumps(body).encode() if body is not None else b"",
        )
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())

    sid = post("/sessions", None)["id"]
    out = {}

    async def answer(m):
        return result(m, {"name": "Ada", "id": m["args"]["id"]})

    async with connect() as ws:
        out["first"] = await run(
            ws,
            {
                "type": "execute",
                "session_id": sid,
                "code": "user = await get_user(id=7)",
                "callbacks": [{"name": "get_user", "description": "Look up a user"}],
            },
            answer,
        )
        out["second"] = await run(
            ws,
            {
                "type": "execute",
                "session_id": sid,
                "code": "print(user['name'], user['id'], 'get_user' in globals())",
            },
        )
        out["unknown"] = await run(
            ws, {"type": "execute", "session_id": "no-such-session", "code": "print(1)"}
        )
        out["other_env"] = await run(
            ws,
            {"type": "execute", "session_id": sid, "environment": "other", "code": "print(1)"},
        )
        out["after"] = await run(ws, {"type": "execute", "code": "print(3)"})
    out["http"] = post(f"/sessions/{sid}/execute", {"code": "print(user['name'])"})
    return out


async def main():
    print(json.dumps(await globals()[SCENARIO]()))


asyncio.run(main())

"""Drives a process's terminal WebSocket (`GET /wbx/v1/sandboxes/{id}/process/{pid}/ws`,
an isobox extension) the way a client does, with the `websockets` package, for
tests/wbx_terminal.rs.

    python terminal_ws.py BASE SANDBOX PID SCENARIO KEY

BASE is `http://HOST:PORT/wbx`. Prints one JSON object: what the scenario saw (the
Rust test asserts on it). Output messages are binary, their first byte the stream
(1 stdout, 2 stderr); events are JSON text.
"""

import asyncio
import base64
import json
import sys

import httpx
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

BASE, SANDBOX, PID, SCENARIO, KEY = sys.argv[1:6]
WS_URL = BASE.replace("http://", "ws://", 1) + f"/v1/sandboxes/{SANDBOX}/process/{PID}/ws"
AUTH = {"Authorization": f"Bearer {KEY}"}


def bearer(key):
    return "isobox.bearer." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def browser_like(url=WS_URL, key=KEY, **kw):
    """As a browser must: the key as a subprotocol, beside the terminal's own."""
    return websockets.connect(url, subprotocols=["isobox.terminal", bearer(key)], **kw)


class Term:
    """Reads a terminal connection: output bytes per stream, and events."""

    def __init__(self, ws):
        self.ws = ws
        self.out = {1: b"", 2: b""}
        self.events = []
        self.taken = 0  # events handed out by event()
        self.streams = set()

    async def next(self, timeout=20):
        m = await asyncio.wait_for(self.ws.recv(), timeout)
        if isinstance(m, bytes):
            self.streams.add(m[0])
            self.out[m[0]] += m[1:]
        else:
            self.events.append(json.loads(m))
        return m

    async def until(self, needle, stream=1, timeout=20):
        """Reads until stream's output holds `needle` after what was read before;
        returns the output up to and including it."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while needle not in self.out[stream]:
            await self.next(max(0.1, end - loop.time()))
        head, _, tail = self.out[stream].partition(needle)
        self.out[stream] = tail
        return (head + needle).decode(errors="replace")

    async def event(self, timeout=20):
        """The next event not handed out yet, in order (output before it is kept)."""
        while len(self.events) == self.taken:
            await self.next(timeout)
        self.taken += 1
        return self.events[self.taken - 1]

    async def closed(self, timeout=20):
        """Reads to the end: the close code."""
        try:
            while True:
                await self.next(timeout)
        except ConnectionClosed as e:
            return e.rcvd.code if e.rcvd else None


async def shell():
    out = {}
    async with browser_like() as ws:
        t = Term(ws)
        out["subprotocol"] = ws.subprotocol
        await t.until(b"ready> ")
        await ws.send(b"echo hi\n")
        out["echo"] = await t.until(b"ready> ")
        # Text input and a resize, as JSON.
        await ws.send(json.dumps({"type": "resize", "cols": 100, "rows": 30}))
        await ws.send(json.dumps({"type": "stdin", "data": "stty size\n"}))
        out["size"] = await t.until(b"ready> ")
        # Bad messages: an error event each, and the connection stays.
        await ws.send("nope")
        out["bad_json"] = await t.event()
        await ws.send(json.dumps({"type": "resize", "cols": 0, "rows": 5}))
        out["bad_resize"] = await t.event()
        await ws.send(json.dumps({"type": "launch"}))
        out["bad_type"] = await t.event()
        await ws.send(json.dumps({"type": "signal", "signal": "SIGSTOP"}))
        out["bad_signal"] = await t.event()
        await ws.send(json.dumps({"type": "ping"}))
        out["pong"] = await t.event()
        pong = await ws.ping(b"x")
        await asyncio.wait_for(pong, 10)
        out["ping_frame_answered"] = True
        # Ctrl-C through the terminal interrupts the foreground job.
        await ws.send(b"sleep 60\n")
        await asyncio.sleep(0.5)
        await ws.send(b"\x03")
        await t.until(b"ready> ", timeout=10)
        # UTF-8 split across messages is the terminal's to join: bytes pass as they are.
        await ws.send("echo \u00e9t\u00e9\n".encode())
        out["utf8"] = await t.until(b"ready> ")
        # A second client attaching gets the output so far, then live output.
        async with browser_like() as ws2:
            t2 = Term(ws2)
            out["replay"] = await t2.until(b"stty size")
            await ws.send(b"echo both\n")
            out["live_first"] = await t.until(b"both\r\n")
            out["live_second"] = await t2.until(b"both\r\n")
            # Ctrl-D at the prompt (bash reads it there; a Ctrl-D typed while a
            # command runs belongs to that command).
            await t.until(b"ready> ")
            # End of input: Ctrl-D, the shell exits 0; both hear the exit, then 1000.
            await ws.send(json.dumps({"type": "eof"}))
            out["exit"] = await t.event()
            out["close"] = await t.closed()
            out["exit_second"] = await t2.event()
            out["close_second"] = await t2.closed()
        out["streams"] = sorted(t.streams)
    # Attaching after the end: the output kept, the exit, the close.
    async with browser_like() as ws:
        t = Term(ws)
        out["after_exit"] = await t.event()
        out["after_exit_close"] = await t.closed()
        out["after_exit_output_has_hi"] = b"hi\r\n" in t.out[1]
    return out


async def pipes():
    """A process without a terminal: stdout and stderr apart, resize refused."""
    out = {}
    async with websockets.connect(WS_URL, additional_headers=AUTH) as ws:
        out["subprotocol"] = ws.subprotocol
        t = Term(ws)
        await ws.send(json.dumps({"type": "resize", "cols": 80, "rows": 24}))
        out["resize"] = await t.event()
        await ws.send(b"abc\n")
        out["stdout"] = await t.until(b"out:abc\n", 1)
        out["stderr"] = await t.until(b"err:abc\n", 2)
        # It ends after its one line.
        out["exit"] = await t.event()
        out["close"] = await t.closed()
        out["streams"] = sorted(t.streams)
    return out


async def refusals():
    """Keys, and the limits of a message and of clients per process."""
    out = {}
    for name, kw in [
        ("no_key", {}),
        ("wrong_key", {"subprotocols": ["isobox.terminal", bearer("nope")]}),
        ("wrong_header", {"additional_headers": {"Authorization": "Bearer nope"}}),
    ]:
        try:
            async with websockets.connect(WS_URL, **kw):
                out[name] = "connected"
        except InvalidStatus as e:
            out[name] = e.response.status_code
    # The largest message passes, one byte more closes the connection with 1009.
    async with browser_like(max_size=None) as ws:
        t = Term(ws)
        await ws.send(b"x" * 65536)
        await ws.send(json.dumps({"type": "ping"}))
        out["at_bound"] = await t.event()
        await ws.send(b"x" * 65537)
        out["above_bound_close"] = await t.closed()
    # Eight clients at once; the ninth is refused.
    conns = []
    try:
        for _ in range(8):
            conns.append(await browser_like().__aenter__())
        try:
            async with browser_like():
                out["ninth"] = "connected"
        except InvalidStatus as e:
            out["ninth"] = e.response.status_code
            out["ninth_body"] = json.loads(e.response.body)
    finally:
        for c in conns:
            await c.close()
    out["eight"] = len(conns)
    return out


async def quiet():
    """Says nothing for QUIET_SECONDS (the library answers the server's pings), then
    checks the connection still works."""
    out = {}
    async with browser_like() as ws:
        t = Term(ws)
        await asyncio.sleep(float(__import__("os").environ.get("QUIET_SECONDS", "5")))
        await ws.send(json.dumps({"type": "ping"}))
        out["after_quiet"] = await t.event()
    return out


async def lifecycle():
    """A paused sandbox takes no input; a deleted one ends its terminals."""
    out = {}
    async with httpx.AsyncClient(base_url=BASE, headers=AUTH, timeout=30) as http:
        async with browser_like() as ws:
            t = Term(ws)
            await t.until(b"ready> ")
            r = await http.post(f"/v1/sandboxes/{SANDBOX}/pause")
            out["pause"] = r.status_code
            await ws.send(b"echo paused\n")
            out["paused_input"] = await t.event()
            r = await http.post(f"/v1/sandboxes/{SANDBOX}/resume")
            out["resume"] = r.status_code
            await ws.send(b"echo resumed\n")
            # (bash switches bracketed paste on before each prompt: ESC [?2004h.)
            await t.until(b"echo resumed\r\n")
            out["resumed"] = await t.until(b"resumed\r\n")
            await t.until(b"ready> ")
            r = await http.delete(f"/v1/sandboxes/{SANDBOX}")
            out["delete"] = r.status_code
            out["deleted_event"] = await t.event()
            out["deleted_close"] = await t.closed()
    return out


print(json.dumps(asyncio.run(globals()[SCENARIO]())))

#!/usr/bin/env python3
"""Soak test for an already running isoboxd (catalogue case S1).

Starts nothing: it talks to the daemon at --url for --minutes at low concurrency with
a mix of runs (normal, exception, timeout, OOM, output flood, fork bomb, SSE), session
round trips (create, upload, exec, download, delete) and KV round trips, all with
"network": false. Every result is checked the way a user would check it (exit code,
timedOut, oomKilled, truncated, stdout). Every minute it samples the daemon's
/healthz (rssBytes, openFds, inFlight). At the end it prints a summary and exits
non-zero if an invariant failed:

  * any unexpected result or transport error;
  * RSS after the load > RSS at minute 1 (post warm-up) + 10 %;
  * with --pid and a run of at least --warmup + 21 minutes: the daemon's anonymous
    memory not flat, i.e. the mean of the last 10 per-minute samples more than
    --anon-band % (default 5) away from the mean of the 10 right after --warmup
    (default 10) minutes;
  * open fds after the load not back to the pre-load baseline;
  * leftovers (with --instance: child cgroups under /sys/fs/cgroup/memory/<instance>,
    runsc containers under /run/isobox/<instance>/runsc; with --data-dir: mounts under
    it; with --pid: zombie children of the daemon).

Standard library only.
"""

import argparse
import base64
import hashlib
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

WALL_GRACE_MS = 1000  # gVisor boot grace added to wallTimeMs (llms.txt)
SLACK_S = 5.0  # a killed run must answer within its wall time + grace + this


class Client:
    def __init__(self, url, key, timeout):
        u = urllib.parse.urlsplit(url)
        self.host = u.hostname
        self.port = u.port or 80
        self.key = key
        self.timeout = timeout

    def _conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def _headers(self, extra):
        h = {"Connection": "close"}
        if self.key:
            h["X-API-Key"] = self.key
        h.update(extra or {})
        return h

    def request(self, method, path, body=None, headers=None):
        """Returns (status, headers dict lower-cased, body bytes)."""
        c = self._conn()
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
                headers = dict(headers or {}, **{"Content-Type": "application/json"})
            c.request(method, path, body=body, headers=self._headers(headers))
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def sse(self, path, body):
        """POSTs an SSE request; returns (status, [(event, data-json)])."""
        c = self._conn()
        try:
            h = self._headers({"Accept": "text/event-stream", "Content-Type": "application/json"})
            c.request("POST", path, body=json.dumps(body).encode(), headers=h)
            r = c.getresponse()
            if r.status != 200:
                return r.status, [("http", r.read().decode(errors="replace"))]
            events, ev, data = [], None, []
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.decode().rstrip("\r\n")
                if line == "":
                    if ev is not None or data:
                        events.append((ev or "message", json.loads("\n".join(data))))
                        if ev in ("done", "error"):
                            break
                    ev, data = None, []
                elif line.startswith(":"):
                    continue
                elif line.startswith("event:"):
                    ev = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
            return 200, events
        finally:
            c.close()


class Unexpected(Exception):
    pass


class Notes:
    """Counted oddities that are not errors."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}

    def add(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1


NOTES = Notes()


def need(cond, what):
    if not cond:
        raise Unexpected(what)


def execute(cl, body):
    body = dict(body, network=False)
    st, _, data = cl.request("POST", "/execute", body)
    need(st == 200, f"/execute status {st}: {data[:300]!r}")
    j = json.loads(data)
    need(j.get("run", {}).get("network") is False, f"run.network not false: {j.get('run')}")
    need("warning" not in j, f"warning with network false: {j.get('warning')}")
    return j["run"]


def short(run):
    r = dict(run)
    for k in ("stdout", "stderr"):
        if len(r.get(k, "")) > 200:
            r[k] = r[k][:200] + f"...({len(run[k])} chars)"
    return r


def plain(run):
    need(not run["timedOut"] and not run["oomKilled"] and not run["truncated"],
         f"flags set: {short(run)}")


# ---- kinds -------------------------------------------------------------------------


def k_normal(cl, wid, n):
    if n % 3 == 2:
        run = execute(cl, {"language": "javascript", "code": "console.log([1,2,3].map(x=>x*x).join(','))"})
        need(run["exitCode"] == 0 and run["stdout"] == "1,4,9\n", f"js normal: {short(run)}")
    else:
        a = random.randrange(10**6)
        run = execute(cl, {"language": "python-slim", "code": "import sys\nprint(sum(range(int(sys.argv[1]))))",
                           "args": [str(a)]})
        need(run["exitCode"] == 0 and run["stdout"] == f"{a * (a - 1) // 2}\n" and run["stderr"] == "",
             f"normal: {short(run)}")
    plain(run)


def k_exception(cl, wid, n):
    run = execute(cl, {"language": "python-slim", "code": "print('before')\nraise ValueError('boom')"})
    need(run["exitCode"] == 1 and run["stdout"] == "before\n" and "ValueError: boom" in run["stderr"],
         f"exception: {short(run)}")
    plain(run)


def k_timeout(cl, wid, n):
    t = time.monotonic()
    run = execute(cl, {"language": "python-slim", "code": "print('spin', flush=True)\nwhile True: pass",
                       "limits": {"wallTimeMs": 500}})
    el = time.monotonic() - t
    # "spin" is flushed before the loop and must not be lost (catalogue R11); on a
    # loaded host the interpreter may not get that far within 0.5 s + the boot grace,
    # which is counted as a note, not an error.
    need(run["timedOut"] and run["exitCode"] == 137 and not run["oomKilled"] and run["stdout"] in ("spin\n", ""),
         f"timeout: {short(run)}")
    if run["stdout"] == "":
        NOTES.add("timeout runs killed before the program printed (host too busy for 0.5 s)")
    need(el <= 0.5 + WALL_GRACE_MS / 1000 + SLACK_S, f"timeout answered after {el:.1f}s")


def k_oom(cl, wid, n):
    run = execute(cl, {"language": "python-slim",
                       "code": "b=[]\nwhile True: b.append(bytearray(8<<20))",
                       "limits": {"memoryBytes": 64 << 20, "wallTimeMs": 10000}})
    need(run["oomKilled"] and run["exitCode"] == 137 and not run["timedOut"], f"oom: {short(run)}")


def k_flood(cl, wid, n):
    if n % 2 == 0:
        # finite: 200 kB, the stream keeps the first outputBytes
        run = execute(cl, {"language": "python-slim",
                           "code": "import sys\nsys.stdout.write('y'*200000)\nprint('tail', file=sys.stderr)",
                           "limits": {"outputBytes": 65536}})
        need(run["exitCode"] == 0 and run["truncated"] and run["stdout"] == "y" * 65536
             and run["stderr"] == "tail\n" and not run["timedOut"], f"flood: {short(run)}")
    else:
        # endless (catalogue R8, in 64 KiB writes): killed 16 MiB past the cap
        run = execute(cl, {"language": "python-slim",
                           "code": "import sys\nwhile True: sys.stdout.write('Piston is secure\\n'*4096)",
                           "limits": {"outputBytes": 65536, "wallTimeMs": 15000}})
        need(run["truncated"] and run["exitCode"] == 137 and not run["timedOut"]
             and run["stdout"] == ("Piston is secure\n" * 4096)[:65536],
             f"endless flood: {short(run)}")


def k_forkbomb(cl, wid, n):
    t = time.monotonic()
    if n % 2 == 0:
        # classic bomb (catalogue R1): ends by the wall time, bounded by pids
        run = execute(cl, {"language": "python-slim",
                           "code": "import os\nwhile True:\n try: os.fork()\n except OSError: pass",
                           "limits": {"pids": 32, "wallTimeMs": 2000}})
        need(run["timedOut"] and run["exitCode"] == 137, f"fork bomb: {short(run)}")
        need(time.monotonic() - t <= 2 + WALL_GRACE_MS / 1000 + SLACK_S,
             f"fork bomb answered after {time.monotonic() - t:.1f}s")
    else:
        # count how far fork gets: the pids cap must stop it
        code = ("import os,time\nk=[]\nwhile True:\n try: p=os.fork()\n except OSError: break\n"
                " if p==0:\n  time.sleep(60); os._exit(0)\n k.append(p)\n"
                "print(len(k))\nfor p in k: os.kill(p,9)\n")
        run = execute(cl, {"language": "python-slim", "code": code, "limits": {"pids": 16, "wallTimeMs": 8000}})
        need(run["exitCode"] == 0 and not run["timedOut"], f"fork count: {short(run)}")
        forked = int(run["stdout"].strip() or "-1")
        need(1 <= forked < 16, f"fork count {forked} with pids 16")


def k_sse(cl, wid, n):
    st, evs = cl.sse("/execute", {"language": "python-slim", "network": False,
                                  "code": "import time\nfor i in range(3):\n print(i, flush=True); time.sleep(0.1)"})
    need(st == 200, f"sse status {st}: {evs}")
    out = "".join(d["chunk"] for e, d in evs if e == "stdout")
    need(evs and evs[-1][0] == "done", f"sse: last event {evs[-1:] if evs else None}")
    run = evs[-1][1]["run"]
    need(out == "0\n1\n2\n" and run["stdout"] == out and run["exitCode"] == 0, f"sse: {out!r} {short(run)}")
    plain(run)


def k_session(cl, wid, n):
    st, _, data = cl.request("POST", "/v1/sessions", {"runtime": "python-slim", "ttlSec": 600})
    need(st == 201, f"session create {st}: {data[:300]!r}")
    s = json.loads(data)
    sid, tok = s["id"], {"X-Session-Token": s["token"]}
    base = f"/v1/sessions/{sid}"
    try:
        blob = os.urandom(random.randrange(1 << 14, 1 << 18))
        sha = hashlib.sha256(blob).hexdigest()
        st, _, data = cl.request("PUT", base + "/fs?path=data/in.bin", blob, tok)
        need(st == 200 and json.loads(data) == {"path": "/data/in.bin", "bytes": len(blob)},
             f"upload {st}: {data[:300]!r}")
        code = ("import hashlib,os\nh=hashlib.sha256(open('data/in.bin','rb').read()).hexdigest()\n"
                "os.makedirs('out',exist_ok=True)\nopen('out/sha.txt','w').write(h)\nprint(h)")
        st, _, data = cl.request("POST", base + "/exec", {"code": code, "network": False}, tok)
        need(st == 200, f"exec {st}: {data[:300]!r}")
        run = json.loads(data)["run"]
        need(run["exitCode"] == 0 and run["stdout"] == sha + "\n", f"session exec: {short(run)}")
        plain(run)
        st, _, data = cl.request("GET", base + "/fs?path=out/sha.txt", None, tok)
        need(st == 200 and data == sha.encode(), f"download out/sha.txt {st}: {data[:100]!r}")
        st, _, data = cl.request("GET", base + "/fs?path=data/in.bin", None, tok)
        need(st == 200 and data == blob, f"download data/in.bin {st}: {len(data)} bytes")
        st, _, data = cl.request("GET", base + "/fs?path=", None, tok)
        names = [e["name"] for e in json.loads(data).get("entries", [])] if st == 200 else None
        need(names == ["data", "main.py", "out"], f"listing {st}: {names}")
    finally:
        st, _, data = cl.request("DELETE", base, None, tok)
    need(st == 204, f"session delete {st}: {data[:300]!r}")
    st, _, _ = cl.request("GET", base + "/fs?path=", None, tok)
    need(st == 404, f"deleted session answers {st}")


def k_kv(cl, wid, n):
    path = f"/v1/memory/soak/w{wid}/k{n}"
    val = os.urandom(random.randrange(1, 4096))
    st, h, data = cl.request("PUT", path, val)
    need(st == 204 and h.get("etag", "").startswith('"'), f"kv put {st} {h.get('etag')}: {data[:200]!r}")
    etag = h["etag"]
    st, h, data = cl.request("GET", path)
    need(st == 200 and data == val and h.get("etag") == etag, f"kv get {st} etag {h.get('etag')} vs {etag}")
    st, h, _ = cl.request("PUT", path, b"x", {"If-Match": '"0000000000000000"'})
    need(st == 412, f"kv conditional put with a stale tag: {st}")
    st, _, data = cl.request("DELETE", path)
    need(st == 204, f"kv delete {st}: {data[:200]!r}")
    st, _, _ = cl.request("GET", path)
    need(st == 404, f"kv get after delete {st}")


KINDS = {
    "normal": k_normal,
    "exception": k_exception,
    "timeout": k_timeout,
    "oom": k_oom,
    "flood": k_flood,
    "forkbomb": k_forkbomb,
    "sse": k_sse,
    "session": k_session,
    "kv": k_kv,
}
# one cycle of the mix; each worker walks it from its own offset
CYCLE = ["normal", "kv", "exception", "normal", "timeout", "sse", "normal", "session", "kv",
         "oom", "normal", "flood", "exception", "forkbomb", "sse", "normal", "session", "kv"]


# ---- driver ------------------------------------------------------------------------


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.lat = {k: [] for k in KINDS}
        self.bad = {k: 0 for k in KINDS}
        self.examples = []
        # (minute, seconds, rss, fds, inFlight, (anon, file) or None, heap allocated or None)
        self.samples = []
        # minute -> (operations started in that minute, run records, their bytes)
        self.load = {}

    def record(self, kind, secs, err):
        with self.lock:
            self.lat[kind].append(secs)
            if err is not None:
                self.bad[kind] += 1
                if len(self.examples) < 20:
                    self.examples.append(f"{kind}: {err}")


CONCURRENCY = [1]


def health(cl):
    st, _, data = cl.request("GET", "/healthz")
    if st != 200:
        raise Unexpected(f"/healthz {st}")
    return json.loads(data)


def worker(cl, wid, deadline, stats, stop, interval=0.0):
    """Walk the mix. With an interval (--rate), start an operation every `interval`
    seconds and never faster (a late one resets the schedule rather than bursting), so
    the load per minute does not depend on how busy the host is."""
    i = wid * 7
    counts = {k: 0 for k in KINDS}
    nxt = time.monotonic() + interval * wid / max(1, CONCURRENCY[0])
    while time.monotonic() < deadline and not stop.is_set():
        if interval:
            if stop.wait(max(0.0, nxt - time.monotonic())) or time.monotonic() >= deadline:
                break
            nxt = max(nxt + interval, time.monotonic())
        kind = CYCLE[i % len(CYCLE)]
        i += 1
        n = counts[kind]
        counts[kind] += 1
        t = time.monotonic()
        err = None
        try:
            KINDS[kind](cl, wid, n)
        except Unexpected as e:
            err = str(e)
        except Exception as e:  # transport errors, bad JSON, missing fields
            err = f"{type(e).__name__}: {e}"
        stats.record(kind, time.monotonic() - t, err)
        if err:
            print(f"[{time.strftime('%H:%M:%S')}] UNEXPECTED {err}", file=sys.stderr, flush=True)


def rss_split(pid):
    """(RssAnon, RssFile) in bytes from /proc/<pid>/status, or None."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            kv = dict(l.split(":", 1) for l in f if ":" in l)
        return tuple(int(kv[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile"))
    except (OSError, KeyError, ValueError):
        return None


def run_records(cl):
    """(run records kept, their bytes) from /metrics: streamed runs are kept for
    reconnecting clients for ISOBOX_RUN_RETAIN_S, so they follow the load's rate."""
    st, _, data = cl.request("GET", "/metrics")
    if st != 200:
        return None, None
    got = {}
    for line in data.decode(errors="replace").splitlines():
        name, _, value = line.partition(" ")
        if name in ("isobox_run_records", "isobox_run_record_bytes"):
            got[name] = int(float(value))
    return got.get("isobox_run_records"), got.get("isobox_run_record_bytes")


def sampler(cl, start, stats, stop, minutes, pid):
    m = 1
    prev = 0
    while not stop.wait(max(0.0, start + 60 * m - time.monotonic())):
        try:
            h = health(cl)
            split = rss_split(pid)
            heap = (h.get("heap") or {}).get("allocatedBytes")
            recs, rec_bytes = run_records(cl)
            with stats.lock:
                stats.samples.append((m, time.monotonic() - start, h["rssBytes"], h["openFds"], h["inFlight"], split,
                                      heap))
                done = sum(len(v) for v in stats.lat.values())
                bad = sum(stats.bad.values())
                stats.load[m] = (done - prev, recs, rec_bytes)
            prev = done
            extra = f" (anon {split[0] / 2**20:.2f} + file {split[1] / 2**20:.2f})" if split else ""
            extra += f", heap allocated {heap / 2**20:.2f} MiB" if heap is not None else ""
            extra += f", run records {recs} ({(rec_bytes or 0) / 2**10:.0f} KiB)" if recs is not None else ""
            print(f"[{time.strftime('%H:%M:%S')}] minute {m}: rss {h['rssBytes'] / 2**20:.2f} MiB{extra}, "
                  f"fds {h['openFds']}, inFlight {h['inFlight']}, ops {done} (+{stats.load[m][0]}), "
                  f"unexpected {bad}, load {os.getloadavg()[0]:.2f}", flush=True)
        except Exception as e:
            stats.record("normal", 0, f"healthz sample failed: {e}")
        m += 1
        if m > minutes:
            return


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))]


def pool_target(h):
    """How many pooled sandboxes the daemon may hold at once: its warm pool's targets and
    the WBX face's (`wbxWarmPool`, long-lived sandboxes booted ahead)."""
    pools = (h.get("warmPool") or {}).get("runtimes") or {}
    wbx = (h.get("wbxWarmPool") or {}).get("templates") or {}
    # A pool that grew with bursts (`max`) holds up to that until it has been idle.
    return sum(int(p.get("max", p.get("target", 0))) for p in list(pools.values()) + list(wbx.values()))


def leftovers(instance, data_dir, pid, pooled=0):
    """What is left once the load has stopped. The warm pools' own sandboxes (ids ending
    in `-w<N>` or `-b<N>`) are live, not left over, as long as there are no more of them
    than the pools' targets."""
    out = []
    if instance:
        d = f"/sys/fs/cgroup/memory/{instance}"
        if os.path.isdir(d):
            out += [f"cgroup {d}/{e}" for e in os.listdir(d) if os.path.isdir(os.path.join(d, e))]
        root = f"/run/isobox/{instance}/runsc"
        try:
            r = subprocess.run(["runsc", "--root", root, "list", "-quiet"], capture_output=True, text=True,
                               timeout=30)
            out += [f"runsc container {l}" for l in r.stdout.split() if l.strip()]
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append(f"runsc list failed: {e}")
    if data_dir:
        prefix = os.path.realpath(data_dir).rstrip("/") + "/"
        with open("/proc/self/mountinfo") as f:
            out += [f"mount {l.split()[4]}" for l in f if l.split()[4].startswith(prefix)]
    if pid:
        r = subprocess.run(["ps", "--ppid", str(pid), "-o", "pid=,stat=,args="], capture_output=True, text=True)
        out += [f"child {l.strip()}" for l in r.stdout.splitlines() if l.split()[1].startswith("Z")]
    # Pooled sandboxes: `…-w<N>` (runs) and `…-b<N>` (WBX), with the ids' trailing dot;
    # each also has its root overlay mounted at <data dir>/runs/<id>/root.
    pool = re.compile(r"^(cgroup .*/|runsc container |mount .*/runs/)(.*-[wb][0-9]+\.?)(/root)?$")
    pool_ids = {m.group(2) for m in map(pool.match, out) if m}
    if len(pool_ids) <= pooled:
        out = [l for l in out if not pool.match(l)]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8090")
    ap.add_argument("--key", default=None, help="API key (sent as X-API-Key)")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0,
                    help="operations per minute for all workers together (default 0: as fast as they go); a "
                         "fixed rate keeps the daemon's own tables (e.g. run records) at one size, so memory "
                         "figures compare minute to minute even on a busy host")
    ap.add_argument("--instance", default=None, help="ISOBOX_INSTANCE, to check cgroups and runsc containers")
    ap.add_argument("--data-dir", default=None, help="ISOBOX_DATA_DIR, to check for leftover mounts")
    ap.add_argument("--pid", type=int, default=None, help="daemon pid, to check for zombie children")
    ap.add_argument("--json", default=None, help="also write the summary as JSON to this file")
    ap.add_argument("--warmup", type=int, default=10, help="minutes before the anonymous-memory check's first window")
    ap.add_argument("--anon-band", type=float, default=5.0,
                    help="%% the last 10 minutes' mean anonymous memory may differ from the first 10 after warm-up")
    ap.add_argument("--kinds", default=None,
                    help=f"comma-separated subset of the mix (default all: {','.join(KINDS)})")
    a = ap.parse_args()
    if a.kinds:
        wanted = [k.strip() for k in a.kinds.split(",") if k.strip()]
        unknown = [k for k in wanted if k not in KINDS]
        if unknown or not wanted:
            ap.error(f"unknown kinds {unknown}; known: {', '.join(KINDS)}")
        CYCLE[:] = [k for k in CYCLE if k in wanted]

    cl = Client(a.url, a.key, timeout=120)
    stats = Stats()
    failures = []

    h0 = health(cl)
    st, _, data = cl.request("GET", "/readyz")
    if st != 200:
        print(f"daemon not ready: {st} {data!r}", file=sys.stderr)
        return 2
    base_fds, base_rss = h0["openFds"], h0["rssBytes"]
    print(f"[{time.strftime('%H:%M:%S')}] start: {a.url} version {h0['version']}, rss {base_rss / 2**20:.2f} MiB, "
          f"fds {base_fds}, {a.concurrency} workers for {a.minutes} min", flush=True)

    start = time.monotonic()
    deadline = start + a.minutes * 60
    stop = threading.Event()
    CONCURRENCY[0] = a.concurrency
    interval = a.concurrency * 60 / a.rate if a.rate > 0 else 0.0
    ws = [threading.Thread(target=worker, args=(cl, w, deadline, stats, stop, interval), daemon=True)
          for w in range(a.concurrency)]
    sm = threading.Thread(target=sampler, args=(cl, start, stats, stop, int(a.minutes), a.pid), daemon=True)

    def interrupted(signum, _frame):
        # SIGINT is ignored in background jobs unless handled explicitly: handle both.
        if not stop.is_set():
            print(f"signal {signum}: stopping after the operations in flight", file=sys.stderr, flush=True)
        stop.set()

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    for t in ws:
        t.start()
    sm.start()
    for t in ws:
        while t.is_alive():
            t.join(timeout=0.5)
    load_secs = time.monotonic() - start
    stop.set()
    sm.join(timeout=5)

    # After the load: everything must drain. Idle session workspaces unmount after 30 s;
    # allow 45 s for fds and leftovers to settle.
    settle = time.monotonic() + 45
    while True:
        h1 = health(cl)
        left = leftovers(a.instance, a.data_dir, a.pid, pool_target(h1))
        if (h1["inFlight"] == 0 and h1["openFds"] <= base_fds and not left) or time.monotonic() > settle:
            break
        time.sleep(1)
    settled_after = time.monotonic() - start - load_secs
    # canary (I1)
    t = time.monotonic()
    try:
        run = execute(cl, {"language": "python-slim", "code": "print(1)"})
        canary = (run["stdout"] == "1\n" and run["exitCode"] == 0, time.monotonic() - t)
    except Exception as e:
        canary = (False, f"{e}")

    samples = stats.samples
    warm = samples[0] if samples else None
    rss_end, fds_end = h1["rssBytes"], h1["openFds"]
    rss_max = max([s[2] for s in samples] + [rss_end])
    fds_max = max([s[3] for s in samples] + [fds_end])
    total = sum(len(v) for v in stats.lat.values())
    bad = sum(stats.bad.values())

    print()
    print(f"== soak summary: {load_secs / 60:.1f} min of load, {a.concurrency} workers, {total} operations ==")
    print(f"{'kind':<10} {'runs':>6} {'unexpected':>10} {'p50 s':>8} {'p99 s':>8} {'max s':>8}")
    for k in KINDS:
        xs = stats.lat[k]
        print(f"{k:<10} {len(xs):>6} {stats.bad[k]:>10} {pct(xs, 50):>8.2f} {pct(xs, 99):>8.2f} "
              f"{(max(xs) if xs else float('nan')):>8.2f}")
    print(f"{'total':<10} {total:>6} {bad:>10}")
    mib = lambda b: f"{b / 2**20:.2f} MiB"
    print()
    print(f"rss: before {mib(base_rss)}, minute 1 {mib(warm[2]) if warm else '-'}, end {mib(rss_end)}, "
          f"max {mib(rss_max)}")
    print(f"fds: before {base_fds}, minute 1 {warm[3] if warm else '-'}, end {fds_end}, max {fds_max}")
    print(f"inFlight at end: {h1['inFlight']}; drained {settled_after:.1f} s after the load stopped")
    print(f"counters: {json.dumps(h1['counters'])}")
    print(f"per-minute samples (minute:rss MiB/fds/inFlight): "
          + ", ".join(f"{m}:{r / 2**20:.2f}/{f}/{i}" for m, _, r, f, i, _, _ in samples))
    if stats.load:
        print("per-minute operations / run records: "
              + ", ".join(f"{m}:{n}/{r if r is not None else '-'}" for m, (n, r, _) in sorted(stats.load.items())))
    anon = [(m, sp[0]) for m, _, _, _, _, sp, _ in samples if sp]
    if anon:
        print("per-minute anonymous MiB (heap allocated MiB): "
              + ", ".join(f"{m}:{sp[0] / 2**20:.2f}" + (f" ({hp / 2**20:.2f})" if hp is not None else "")
                          for m, _, _, _, _, sp, hp in samples if sp))
    flat = None
    after = [v for m, v in anon if m > a.warmup]
    if len(after) < 20:
        print(f"anonymous memory: flatness not checked ({len(after)} samples after {a.warmup} minutes of "
              f"warm-up; it needs 20{'' if a.pid else ', and --pid'})")
    else:
        first, last = sum(after[:10]) / 10, sum(after[-10:]) / 10
        flat = (first, last, (last - first) / first * 100)
        print(f"anonymous memory: mean of minutes {a.warmup + 1}-{a.warmup + 10} {mib(first)}, of the last 10 "
              f"{mib(last)} ({flat[2]:+.1f} %, band ±{a.anon_band:g} %); after warm-up min {mib(min(after))}, "
              f"max {mib(max(after))}")
    split_end = rss_split(a.pid)
    if warm and warm[5] and split_end:
        print(f"rss split (anon + file-backed, from /proc/{a.pid}/status): minute 1 {mib(warm[5][0])} + "
              f"{mib(warm[5][1])}, end {mib(split_end[0])} + {mib(split_end[1])}")
    print(f"canary print(1) after the load: {canary}")
    print(f"leftovers: {left if (a.instance or a.data_dir or a.pid) else 'not checked (no --instance/--data-dir/--pid)'}")
    print(f"host load average: {os.getloadavg()}")
    for what, n in NOTES.counts.items():
        print(f"note: {n} x {what}")

    if bad:
        failures.append(f"{bad} unexpected results")
        for e in stats.examples:
            print(f"  e.g. {e}")
    if warm and rss_end > warm[2] * 1.10:
        failures.append(f"RSS end {mib(rss_end)} > minute-1 {mib(warm[2])} + 10 %")
    if not warm:
        failures.append("no minute-1 sample (run at least 1 minute)")
    if a.pid and a.minutes >= a.warmup + 21 and flat is None:
        failures.append(f"anonymous memory not checked: {len(after)} samples after warm-up")
    if flat and abs(flat[2]) > a.anon_band:
        failures.append(f"anonymous memory not flat: last 10 minutes {mib(flat[1])} vs {mib(flat[0])} "
                        f"after warm-up ({flat[2]:+.1f} %)")
    if fds_end > base_fds:
        failures.append(f"fds end {fds_end} > baseline {base_fds}")
    if h1["inFlight"] != 0:
        failures.append(f"inFlight {h1['inFlight']} after the load")
    if left:
        failures.append(f"leftovers: {left}")
    if not canary[0]:
        failures.append(f"canary failed: {canary}")

    if a.json:
        with open(a.json, "w") as f:
            json.dump({
                "minutes": load_secs / 60, "concurrency": a.concurrency, "total": total, "unexpected": bad,
                "kinds": {k: {"runs": len(v), "unexpected": stats.bad[k], "p50": pct(v, 50), "p99": pct(v, 99),
                              "max": max(v) if v else None} for k, v in stats.lat.items()},
                "rss": {"before": base_rss, "minute1": warm[2] if warm else None, "end": rss_end, "max": rss_max},
                "fds": {"before": base_fds, "minute1": warm[3] if warm else None, "end": fds_end, "max": fds_max},
                "samples": samples, "load": stats.load, "rate": a.rate, "rss_split_end": split_end, "anon_flat": flat, "counters": h1["counters"], "leftovers": left, "failures": failures,
                "examples": stats.examples, "notes": NOTES.counts,
            }, f, indent=1)

    print()
    if failures:
        print("VERDICT: FAIL")
        for f in failures:
            print(f"  - {f}")
        return 1
    print("VERDICT: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())

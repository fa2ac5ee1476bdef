#!/usr/bin/env python3
"""WBX public URLs: HTTP requests to an app in a long-lived sandbox through isoboxd's
proxy, beside the same requests sent straight to the sandbox's own address, in the same
invocation; one table.

Reproduce (root, from the repository, after `cargo build --release --bins` and
`make deps runtimes`):

    python3 bench/load/wbx_url.py

Set-up: a network namespace of its own (ibburl<pid>, only `lo` up; nothing leaves the
machine) and one isoboxd in it (`nsenter --net`), egress on (ISOBOX_EGRESS default, so
the sandbox gets a veth link and an address), ISOBOX_WARM_POOL=off,
ISOBOX_WBX_WARM_POOL=off (a pooled sandbox would add a link), ISOBOX_LOG=warn,
ISOBOX_NET_DNS=192.0.2.53 (never asked), its own ISOBOX_INSTANCE isobox-bench-url, data
dir and 127.0.0.1 port (BENCH_PORT, 18097). It must answer GET /readyz 200 with
egress.state "verified". One sandbox (POST /wbx/v1/sandboxes {"timeout_s":600}) gets
the app below (PUT …/files?path=/tmp/app.py) and starts it (POST …/exec `nohup python3
/tmp/app.py … &`): a keep-alive HTTP/1.1 server on asyncio streams, 0.0.0.0:8000, that
answers `GET /` with `ok` (Content-Length: 2) and `GET /big` with 64 KiB. Everything
that talks to the network runs inside the namespace: the script runs itself again with
--client under `nsenter --net`.

What it measures: C keep-alive connections (C = 1 and 8), each sending `GET` after
`GET` back to back (a new one as soon as the last answer is whole) for --seconds (5),
driven by one Python process (epoll) on the same 2 cores:

  proxy    to isoboxd's own address 127.0.0.1:PORT with `Host: 8000-sb-<hex>.localhost:
           PORT` and `X-WBX-Token: <token>` from GET …/url?port=8000: the proxy relays
           each request to port 8000 on the sandbox's address.
  direct   the same requests to <sandbox address>:8000 (over the sandbox's veth, the
           way the proxy itself reaches it), `Host: <address>:8000`, no token.

Every answer is checked: status 200, a Content-Length, the whole body byte for byte, no
`Connection: close`, nothing after it; a failed check, a closed connection or 10 s
without any answer fails the run. Each connection sends one untimed request before the
clock starts (the proxy's connection to the app is made then). Latency is from the
request's send to the last byte of its answer; req/s counts answers completed within
the window. --rounds (3) rounds of each mode per row, alternating, the order swapped
every round (proxy direct, direct proxy, ...) so drift hits both; after an untimed
0.5 s of each. req/s is the total over rounds / total time (min–max of the rounds
beside it); p50/p99 (nearest-rank) and the mean over every request of the row, and
how many answers took over 100 ms. Around every round: isoboxd's CPU time (utime +
stime of /proc/PID/stat), the sandbox's (GET …/metrics cpu_used_ms: its cgroup), the
generator's own (process_time), each per request; how many of the host's CPUs were
busy (/proc/stat: user, nice, system, irq, softirq; steal beside it); and the
namespace's TCP retransmission timeouts (TcpExt TCPTimeouts in /proc/net/netstat: its
Linux sockets, the generator's and the proxy's). The app counts the connections it
accepted: one per client connection means the proxy kept its upstream connection.

At the end the sandbox is deleted (204), isoboxd is stopped (SIGTERM, 20 s), and the
script exits 1 if its cgroups (/sys/fs/cgroup/*/isobox-bench-url*), runsc state, links
in the namespace, mounts of the data dir or processes naming it are left; then the
namespace and data dir are removed. Default: ~2.5 minutes on the 2-core host. Python 3.11
standard library only.
"""

import argparse
import glob
import http.client
import ipaddress
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PORT = int(os.environ.get("BENCH_PORT", "18097"))
INSTANCE = os.environ.get("BENCH_INSTANCE", "isobox-bench-url")
ISOBOXD = os.environ.get("ISOBOXD", os.path.join(ROOT, "target/release/isoboxd"))
APP_PORT = 8000
TIMEOUT_S = 60
STALL_S = 10
BIG = bytes(range(256)) * 256  # 64 KiB
BODIES = {"2 B": ("/", b"ok"), "64 KiB": ("/big", BIG)}

APP = r'''
import asyncio

BIG = bytes(range(256)) * 256
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
BIGR = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG) + BIG
conns = 0


async def serve(r, w):
    global conns
    conns += 1
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            if path == b"/conns":
                n = str(conns).encode()
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(n), n))
            else:
                w.write(BIGR if path.startswith(b"/big") else OK)
            await w.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, IndexError):
        pass
    finally:
        w.close()


async def main():
    server = await asyncio.start_server(serve, "0.0.0.0", 8000, backlog=128)
    async with server:
        await server.serve_forever()


asyncio.run(main())
'''


class Failure(Exception):
    pass


def percentile(xs, q):
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


# --- client: runs inside the namespace ----------------------------------------------------


def request(method, path, body=None, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=TIMEOUT_S)
    try:
        if raw is not None:
            conn.request(method, path, body=raw)
        else:
            data = None if body is None else json.dumps(body)
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tcp_timeouts():
    """The namespace's TCP retransmission timeouts so far (TcpExt TCPTimeouts)."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for keys, vals in zip(lines[::2], lines[1::2]):
        if keys.startswith("TcpExt:"):
            return int(dict(zip(keys.split()[1:], vals.split()[1:]))["TCPTimeouts"])
    raise Failure("no TcpExt in /proc/net/netstat")


def host_cpu():
    """(busy, steal, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = v
    return user + nice + system + irq + softirq, steal, sum(v)


def sandbox_cpu_s(sid):
    status, data = request("GET", f"/wbx/v1/sandboxes/{sid}/metrics")
    if status != 200:
        raise Failure(f"metrics: HTTP {status} {data[:300]!r}")
    return json.loads(data)["cpu_used_ms"] / 1000


def wait_ready(pid):
    deadline = time.monotonic() + 60
    last = None
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                raise Failure("isoboxd exited during startup")
        try:
            status, data = request("GET", "/readyz")
            last = (status, data[:300])
            if status == 200:
                state = json.loads(data).get("egress", {}).get("state")
                if state != "verified":
                    raise Failure(f"readyz 200 but egress.state {state!r}: {data[:300]!r}")
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise Failure(f"isoboxd not ready after 60 s: {last}")


def sandbox_addr():
    """The sandbox's address: the peer of the one `ib…` link's X.1/30."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    nets = []
    for line in out.splitlines():
        f = line.split()
        if f[1].startswith("ib") and f[2] == "inet":
            nets.append(ipaddress.ip_interface(f[3]))
    if len(nets) != 1:
        raise Failure(f"expected one sandbox link in the namespace, found: {out!r}")
    net = nets[0].network
    if net.prefixlen != 30:
        raise Failure(f"sandbox link address {nets[0]} is not a /30")
    return str(list(net.hosts())[1])


def fetch(addr, req):
    """One request on a new connection; (status, headers text, body)."""
    with socket.create_connection(addr, timeout=TIMEOUT_S) as s:
        s.sendall(req)
        c = Reader(s, None)
        while True:
            data = s.recv(262144)
            if not data:
                raise Failure(f"{addr}: closed before a whole answer")
            if c.feed(data, check=False):
                return c.status, c.head, bytes(c.buf[c.body_at :])


class Reader:
    """One keep-alive connection of the generator and its answer in progress."""

    __slots__ = ("sock", "want", "buf", "need", "body_at", "t0", "status", "head")

    def __init__(self, sock, want):
        self.sock, self.want = sock, want
        self.reset()

    def reset(self):
        self.buf = bytearray()
        self.need = None
        self.body_at = 0

    def feed(self, data, check=True):
        """True once the answer is whole (checked when `check`)."""
        self.buf += data
        if self.need is None:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                if len(self.buf) > 65536:
                    raise Failure(f"an answer head over 64 KiB: {bytes(self.buf[:200])!r}")
                return False
            head = bytes(self.buf[:i]).decode("latin-1")
            lines = head.split("\r\n")
            self.head = head
            parts = lines[0].split(" ", 2)
            self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            length = None
            for line in lines[1:]:
                k, _, v = line.partition(":")
                k, v = k.strip().lower(), v.strip()
                if k == "content-length":
                    length = int(v)
                elif check and k == "transfer-encoding":
                    raise Failure(f"unexpected Transfer-Encoding: {head!r}")
                elif check and k == "connection" and "close" in v.lower():
                    raise Failure(f"Connection: close on a keep-alive request: {head!r}")
            if length is None:
                raise Failure(f"an answer without Content-Length: {head!r}")
            if check and (not lines[0].startswith("HTTP/1.1 ") or self.status != 200):
                raise Failure(f"answer {lines[0]!r}, not HTTP/1.1 200: {head!r}")
            self.body_at = i + 4
            self.need = self.body_at + length
        if len(self.buf) < self.need:
            return False
        if len(self.buf) > self.need:
            raise Failure(f"{len(self.buf) - self.need} bytes after a whole answer: {bytes(self.buf[self.need : self.need + 100])!r}")
        if check and self.buf[self.body_at :] != self.want:
            raise Failure(f"wrong body: {len(self.buf) - self.body_at} bytes, {bytes(self.buf[self.body_at : self.body_at + 60])!r}…")
        return True


def load(addr, req, want, conns, seconds):
    """`conns` keep-alive connections to `addr`, each sending `req` back to back for
    `seconds` after one untimed request; (answers within the window, [latency s])."""
    readers = []
    sel = selectors.DefaultSelector()
    try:
        for _ in range(conns):
            s = socket.create_connection(addr, timeout=TIMEOUT_S)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            readers.append(Reader(s, want))
        for r in readers:  # untimed: the connection (and the proxy's upstream one) made
            r.sock.sendall(req)
            while True:
                data = r.sock.recv(262144)
                if not data:
                    raise Failure(f"{addr}: closed before answering the first request")
                if r.feed(data):
                    break
            r.reset()
        for r in readers:
            r.sock.setblocking(False)
            sel.register(r.sock, selectors.EVENT_READ, r)
        lat = []
        start = time.perf_counter()
        end = start + seconds
        for r in readers:
            r.t0 = time.perf_counter()
            if r.sock.send(req) != len(req):  # a few hundred bytes into an empty socket buffer
                raise Failure("a short send of a request")
        active, progress = conns, start
        while active:
            events = sel.select(timeout=1)
            now = time.perf_counter()
            if not events and now - progress > STALL_S:
                raise Failure(f"{addr}: no answer for {STALL_S} s on {active} of {conns} connections (a hang)")
            for key, _ in events:
                r = key.data
                try:
                    data = r.sock.recv(262144)
                except BlockingIOError:
                    continue
                if not data:
                    raise Failure(f"{addr}: a connection closed in the middle ({len(r.buf)} bytes of an answer)")
                if not r.feed(data):
                    continue
                now = progress = time.perf_counter()
                if now <= end:
                    lat.append(now - r.t0)
                r.reset()
                if now < end:
                    r.t0 = time.perf_counter()
                    if r.sock.send(req) != len(req):
                        raise Failure("a short send of a request")
                else:
                    sel.unregister(r.sock)
                    active -= 1
        return len(lat), lat
    finally:
        sel.close()
        for r in readers:
            r.sock.close()


def client_main(args):
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    wait_ready(args.pid)
    status, data = request("POST", "/wbx/v1/sandboxes", {"timeout_s": 600})
    if status != 201:
        raise Failure(f"create: HTTP {status} {data[:300]!r}")
    sid = json.loads(data)["id"]
    try:
        status, data = request("PUT", f"/wbx/v1/sandboxes/{sid}/files?path=/tmp/app.py", raw=APP.encode())
        if status != 200:
            raise Failure(f"upload: HTTP {status} {data[:300]!r}")
        status, data = request("POST", f"/wbx/v1/sandboxes/{sid}/exec", {"cmd": "nohup python3 /tmp/app.py >/tmp/app.log 2>&1 &"})
        if status != 200 or json.loads(data).get("exit_code") != 0:
            raise Failure(f"starting the app: HTTP {status} {data[:300]!r}")
        addr = sandbox_addr()
        direct = (addr, APP_PORT)
        deadline = time.monotonic() + 30
        while True:
            try:
                st, _, body = fetch(direct, f"GET / HTTP/1.1\r\nHost: {addr}:{APP_PORT}\r\n\r\n".encode())
                if st == 200 and body == b"ok":
                    break
                raise Failure(f"the app answered {st} {body[:100]!r}")
            except OSError as e:
                if time.monotonic() > deadline:
                    _, out = request("POST", f"/wbx/v1/sandboxes/{sid}/exec", {"cmd": "cat /tmp/app.log"})
                    raise Failure(f"the app does not answer at {addr}:{APP_PORT} after 30 s ({e}); its log: {out[:600]!r}") from None
                time.sleep(0.2)
        status, data = request("GET", f"/wbx/v1/sandboxes/{sid}/url?port={APP_PORT}")
        if status != 200:
            raise Failure(f"url: HTTP {status} {data[:300]!r}")
        u = json.loads(data)
        host = urllib.parse.urlsplit(u["url"]).netloc
        proxy = ("127.0.0.1", PORT)
        st, head, body = fetch(proxy, f"GET / HTTP/1.1\r\nHost: {host}\r\nX-WBX-Token: {u['token']}\r\n\r\n".encode())
        if st != 200 or body != b"ok":
            raise Failure(f"through the proxy: {st} {head!r} {body[:100]!r}")
        log(f"sandbox {sid} at {addr}; public URL {u['url']}; the proxy's answer head: {head!r}")

        def reqs(path):
            return {
                "proxy": (proxy, f"GET {path} HTTP/1.1\r\nHost: {host}\r\nX-WBX-Token: {u['token']}\r\n\r\n".encode()),
                "direct": (direct, f"GET {path} HTTP/1.1\r\nHost: {addr}:{APP_PORT}\r\n\r\n".encode()),
            }

        rows = []
        client_conns = 2  # the two checks above
        for body_name, (path, want) in BODIES.items():
            targets = reqs(path)
            for conns in args.conns:
                for mode in ("proxy", "direct"):  # warm-up, untimed
                    load(*targets[mode], want, conns, 0.5)
                    client_conns += conns
                zero = dict(n=0, secs=0.0, cpu=0.0, sbx=0.0, gen=0.0, rtos=0, busy=0, steal=0, jiffies=0)
                res = {m: dict(zero, rounds=[], lat=[]) for m in targets}
                for i in range(args.rounds):
                    for mode in ("proxy", "direct") if i % 2 == 0 else ("direct", "proxy"):
                        log(f"{body_name} c={conns} round {i + 1}/{args.rounds} {mode} ...")
                        s0 = sandbox_cpu_s(sid)
                        c0, g0, o0, h0 = cpu_s(args.pid), time.process_time(), tcp_timeouts(), host_cpu()
                        n, lat = load(*targets[mode], want, conns, args.seconds)
                        h1, o1, g1, c1 = host_cpu(), tcp_timeouts(), time.process_time(), cpu_s(args.pid)
                        s1 = sandbox_cpu_s(sid)
                        client_conns += conns
                        r = res[mode]
                        r["n"] += n
                        r["secs"] += args.seconds
                        r["cpu"] += c1 - c0
                        r["sbx"] += s1 - s0
                        r["gen"] += g1 - g0
                        r["rtos"] += o1 - o0
                        r["busy"] += h1[0] - h0[0]
                        r["steal"] += h1[1] - h0[1]
                        r["jiffies"] += h1[2] - h0[2]
                        r["rounds"].append(n / args.seconds)
                        r["lat"] += lat
                for mode, r in res.items():
                    lat = r.pop("lat")
                    rows.append(
                        dict(
                            r,
                            body=body_name,
                            conns=conns,
                            mode=mode,
                            p50=percentile(lat, 50) * 1000,
                            p99=percentile(lat, 99) * 1000,
                            mean=sum(lat) / len(lat) * 1000,
                            slow=sum(1 for x in lat if x > 0.1),
                        )
                    )
        st, _, body = fetch(direct, f"GET /conns HTTP/1.1\r\nHost: {addr}:{APP_PORT}\r\n\r\n".encode())
        app_conns = int(body) - 1  # not this one
    finally:
        status, data = request("DELETE", f"/wbx/v1/sandboxes/{sid}")
        if status != 204:
            raise Failure(f"delete {sid}: HTTP {status} {data[:300]!r}")
    print(json.dumps({"rows": rows, "app_conns": app_conns, "client_conns": client_conns, "addr": addr, "url": u["url"]}))
    return 0


# --- host side --------------------------------------------------------------------------


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def leftovers(ns, data_dir):
    left = [p for p in glob.glob(f"/sys/fs/cgroup/*/{INSTANCE}*") if os.path.isdir(p)]
    state = f"/run/isobox/{INSTANCE}"
    if os.path.isdir(state) and os.listdir(state):
        left.append(f"{state}: {os.listdir(state)}")
    with open("/proc/self/mountinfo") as f:
        left += [f"mount {line.split()[4]}" for line in f if data_dir in line]
    links = sh("ip", "-n", ns, "-br", "link", check=False).stdout
    left += [f"link {line.split()[0]}" for line in links.splitlines() if line.startswith("ib")]
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if data_dir.encode() in f.read():
                        left.append(f"process {pid}")
            except OSError:
                pass
    return left


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5, help="length of one round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each mode per row")
    ap.add_argument("--conns", type=int, nargs="+", default=[1, 8], help="keep-alive connections")
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        try:
            return client_main(args)
        except Failure as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if os.geteuid() != 0:
        sys.exit("error: run as root (network namespaces, nftables and isoboxd need it)")
    if not os.access(ISOBOXD, os.X_OK):
        sys.exit(f"error: {ISOBOXD} missing: run cargo build --release --bins")
    ns = f"ibburl{os.getpid() % 100000}"
    early = [p for p in glob.glob(f"/sys/fs/cgroup/*/{INSTANCE}*") if os.path.isdir(p)]
    if early or os.path.exists(f"/run/netns/{ns}"):
        sys.exit(f"error: left by an earlier run: {early or ns}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    data_dir = tempfile.mkdtemp(prefix="isobox-bench-url-data-")
    log = tempfile.TemporaryFile()  # noqa: SIM115 - isoboxd's stdout and stderr
    failures, left = [], []
    proc, result = None, None
    load0 = open("/proc/loadavg").read().split()[:3]
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        env = dict(os.environ)
        env.update(
            ISOBOX_INSTANCE=INSTANCE,
            ISOBOX_DATA_DIR=data_dir,
            ISOBOX_LISTEN=f"127.0.0.1:{PORT}",
            ISOBOX_WARM_POOL="off",
            ISOBOX_WBX_WARM_POOL="off",
            ISOBOX_LOG="warn",
            ISOBOX_NET_DNS="192.0.2.53",
            ISOBOX_SHUTDOWN_GRACE_MS="2000",
        )
        env.pop("ISOBOX_EGRESS", None)
        env.pop("ISOBOX_PUBLIC_DOMAIN", None)
        # nsenter execs isoboxd (no --fork for a network namespace): proc.pid is the daemon.
        proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", ISOBOXD], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        time.sleep(0.2)
        cmd = ["nsenter", f"--net=/run/netns/{ns}", sys.executable, os.path.abspath(__file__), "--client", "--pid", str(proc.pid)]
        cmd += ["--seconds", str(args.seconds), "--rounds", str(args.rounds), "--conns", *map(str, args.conns)]
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, check=False, text=True)
        if p.returncode != 0:
            failures.append(f"the client (in the namespace) exited {p.returncode}")
        else:
            result = json.loads(p.stdout)
    except (subprocess.CalledProcessError, OSError, ValueError) as e:
        failures.append(f"{e} {getattr(e, 'stderr', '') or ''}")
    finally:
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    failures.append("isoboxd ignored SIGTERM for 20 s; sent SIGKILL")
                    proc.kill()
                    proc.wait()
            if proc.returncode != 0:
                failures.append(f"isoboxd exited {proc.returncode}")
        for _ in range(30):
            left = leftovers(ns, data_dir)
            if not left:
                break
            time.sleep(0.1)
        sh("ip", "netns", "del", ns, check=False)
        if os.path.exists(f"/run/netns/{ns}"):
            left.append(f"/run/netns/{ns}")
        shutil.rmtree(data_dir, ignore_errors=True)
        if os.path.exists(data_dir):
            left.append(data_dir)
    log.seek(0)
    daemon_log = log.read().decode(errors="replace").strip()
    if failures:
        for f in failures:
            print(f"error: {f}", file=sys.stderr)
        if daemon_log:
            print(f"isoboxd's log (last 3000 bytes):\n{daemon_log[-3000:]}", file=sys.stderr)
    if left:
        print(f"error: left behind: {left}", file=sys.stderr)
    if failures or left:
        return 1
    if daemon_log:
        print(f"isoboxd logged:\n{daemon_log[-2000:]}", file=sys.stderr)

    rows = result["rows"]
    print(
        f"host: {os.cpu_count()} CPUs, load average {' '.join(load0)} before, "
        f"{' '.join(open('/proc/loadavg').read().split()[:3])} after; {args.rounds} rounds of {args.seconds:g} s per mode and row"
    )
    print(f"public URL {result['url']}, sandbox address {result['addr']}")
    print()
    print("| body | conns | mode | requests | req/s (rounds min–max) | p50 ms | p99 ms | mean ms | answers > 100 ms | host TCP RTOs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    by = {(r["body"], r["conns"], r["mode"]): r for r in rows}
    for r in rows:
        print(
            f"| {r['body']} | {r['conns']} | {r['mode']} | {r['n']} | {r['n'] / r['secs']:.0f} ({min(r['rounds']):.0f}–{max(r['rounds']):.0f}) "
            f"| {r['p50']:.2f} | {r['p99']:.2f} | {r['mean']:.2f} | {r['slow']} | {r['rtos']} |"
        )
    print()
    print(
        "| body | conns | req/s proxy/direct | p50 proxy/direct | p99 proxy/direct "
        "| proxy: CPU µs/request isoboxd, sandbox, generator; host CPUs busy | direct: the same |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    ncpu = os.cpu_count()

    def cpu(r):
        busy = f"{r['busy'] / r['jiffies'] * ncpu:.2f} of {ncpu}" + (f" (steal {r['steal'] / r['jiffies'] * ncpu:.2f})" if r["steal"] else "")
        return ", ".join(f"{r[k] / r['n'] * 1e6:.0f}" for k in ("cpu", "sbx", "gen")) + f"; {busy}"

    for body_name in BODIES:
        for conns in args.conns:
            p, d = by[(body_name, conns, "proxy")], by[(body_name, conns, "direct")]
            print(
                f"| {body_name} | {conns} | {p['n'] / d['n']:.2f}× | {p['p50'] / d['p50']:.2f}× ({p['p50'] - d['p50']:+.2f} ms) "
                f"| {p['p99'] / d['p99']:.2f}× | {cpu(p)} | {cpu(d)} |"
            )
    print()
    print(f"the app accepted {result['app_conns']} connections for the {result['client_conns']} the generator opened (proxy and direct)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Filtered egress: what a network-on run costs over a network-off run.

Builds its own two network namespaces (nothing leaves the machine):

  ibbh<pid>  "harness": isoboxd runs here (ISOBOX_EGRESS=on); its only uplink is a veth
             to the fake internet, with the default route through it
  ibbf<pid>  "fakenet": 198.51.100.7 on its loopback, a TCP listener on port 80

and starts isoboxd inside the harness namespace (nsenter --net). Then, alternating in
the same run, N times each (default 20) at concurrency 1:

  off:      POST /execute {"language":"python-slim","network":false,"code":"print(1)"}
  on:       the same with "network": true            (netns + veth + NAT per run)
  on+conn:  network on, code opens a TCP connection to 198.51.100.7:80 and prints ok

checking every result (stdout, run.network, no warning). Reports p50/p90/mean of the
client-side latency (connect to last byte) per kind, and the headline figure: p50(on) -
p50(off) and the ratio p50(on) / p50(off). At the end isoboxd is stopped with SIGTERM
and the script checks that its nftables table, links, namespaces and bind mount are
gone, then deletes both namespaces.

Usage (root): python3 bench/load/egress.py [--iterations 20]
Python 3.11 standard library only (ctypes for setns).
"""

import argparse
import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "target", "release", "isoboxd")
CLONE_NEWNET = 0x40000000


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def setns(name):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
    finally:
        os.close(fd)


class Topology:
    def __init__(self):
        p = os.getpid() % 100000
        self.h, self.f = f"ibbh{p}", f"ibbf{p}"
        self.vh, self.vf = f"ibbu{p}", f"ibbd{p}"

    def up(self):
        sh("ip", "netns", "add", self.h)
        sh("ip", "netns", "add", self.f)
        sh("ip", "link", "add", self.vh, "netns", self.h, "type", "veth", "peer", "name", self.vf, "netns", self.f)
        H = ["ip", "-n", self.h]
        F = ["ip", "-n", self.f]
        sh(*H, "addr", "add", "192.0.2.2/24", "dev", self.vh)
        sh(*H, "link", "set", self.vh, "up")
        sh(*H, "link", "set", "lo", "up")
        sh(*H, "route", "add", "default", "via", "192.0.2.1")
        sh(*F, "addr", "add", "192.0.2.1/24", "dev", self.vf)
        sh(*F, "link", "set", self.vf, "up")
        sh(*F, "link", "set", "lo", "up")
        sh(*F, "addr", "add", "198.51.100.7/32", "dev", "lo")

    def down(self):
        for ns in (self.h, self.f):
            sh("ip", "netns", "del", ns, check=False)


def fake_host(topo, stop):
    """Accepts on 198.51.100.7:80 inside fakenet and answers each connection."""
    def run():
        setns(topo.f)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("198.51.100.7", 80))
        s.listen(64)
        s.settimeout(0.5)
        while not stop.is_set():
            try:
                c, _ = s.accept()
            except socket.timeout:
                continue
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
            c.close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=20)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("egress bench: run as root")
    topo = Topology()
    topo.up()
    stop = threading.Event()
    data = f"/tmp/isobox-bench-egress-{os.getpid()}"
    instance = "isobox-bench-egress"
    os.makedirs(data, exist_ok=True)
    env = dict(os.environ, ISOBOX_LISTEN="127.0.0.1:0", ISOBOX_DATA_DIR=data,
               ISOBOX_INSTANCE=instance, ISOBOX_EGRESS="on", ISOBOX_WBX_WARM_POOL="off", ISOBOX_NET_DNS="198.51.100.53",
               ISOBOX_RATE_PER_MIN="1000000", ISOBOX_RATE_BURST="100000")
    proc = None
    failed = False
    try:
        fake_host(topo, stop)
        proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{topo.h}", BIN], env=env,
                                stderr=subprocess.PIPE, text=True)
        addr = None
        for line in proc.stderr:
            m = re.search(r"listening on http://(\S+)", line)
            if m:
                addr = m.group(1)
                break
        if not addr:
            sys.exit("isoboxd did not start")
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
        host, port = addr.rsplit(":", 1)
        # This (main) thread now lives in the harness namespace, where isoboxd listens.
        setns(topo.h)

        def call(body):
            t0 = time.perf_counter()
            c = http.client.HTTPConnection(host, int(port), timeout=60)
            c.request("POST", "/execute", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            c.close()
            return time.perf_counter() - t0, r.status, json.loads(data)

        deadline = time.time() + 60
        while True:
            c = http.client.HTTPConnection(host, int(port), timeout=5)
            c.request("GET", "/readyz")
            r = json.loads(c.getresponse().read())
            if r.get("ready") and r.get("egress", {}).get("state") == "verified":
                break
            if time.time() > deadline:
                sys.exit(f"never ready with verified egress: {r}")
            time.sleep(0.1)

        kinds = {
            "off": ({"language": "python-slim", "network": False, "code": "print(1)"}, "1\n", False),
            "on": ({"language": "python-slim", "network": True, "code": "print(1)"}, "1\n", True),
            "on+conn": ({"language": "python-slim", "network": True,
                         "code": "import socket\nsocket.create_connection(('198.51.100.7',80),5).close()\nprint('ok')"},
                        "ok\n", True),
        }
        for body, _, _ in kinds.values():  # warm-up
            call(body)
        lat = {k: [] for k in kinds}
        for _ in range(a.iterations):
            for k, (body, want, net) in kinds.items():
                dt, status, j = call(body)
                run = j.get("run", {})
                if status != 200 or run.get("stdout") != want or run.get("network") != net or "warning" in j:
                    print(f"UNEXPECTED {k}: {status} {j}", file=sys.stderr)
                    failed = True
                lat[k].append(dt * 1000)

        def q(v, p):
            v = sorted(v)
            return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]

        print(f"\nfiltered egress, {a.iterations} runs each, concurrency 1 (ms, client-side)")
        print(f"{'kind':<10}{'p50':>8}{'p90':>8}{'mean':>8}")
        for k, v in lat.items():
            print(f"{k:<10}{q(v, 50):8.0f}{q(v, 90):8.0f}{statistics.mean(v):8.0f}")
        d = q(lat["on"], 50) - q(lat["off"], 50)
        print(f"\nadded by network on (p50): {d:.0f} ms; ratio on/off p50: {q(lat['on'], 50) / q(lat['off'], 50):.2f}")
    finally:
        stop.set()
        if proc:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "killed"
            if rc != 0:
                print(f"isoboxd exited {rc}", file=sys.stderr)
                failed = True
            tables = sh("ip", "netns", "exec", topo.h, "nft", "list", "tables", check=False).stdout
            links = sh("ip", "-n", topo.h, "-br", "link", check=False).stdout
            mounted = data in open("/proc/self/mountinfo").read()
            left = [t for t in tables.splitlines() if "isobox_bench_egress" in t]
            left += [l for l in links.splitlines() if l.startswith("ib") and not l.startswith("ibbu")]
            if mounted:
                left.append(f"{data} still mounted")
            if os.path.exists(os.path.join(data, "net")):
                left.append(f"{data}/net left")
            if left:
                print(f"LEFT BEHIND: {left}", file=sys.stderr)
                failed = True
        topo.down()
        shutil.rmtree(data, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

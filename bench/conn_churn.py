#!/usr/bin/env python3
"""What connection churn leaves in a running isoboxd's memory (issue 26 item 11).

Starts nothing: drives the daemon at --url with rounds of short connections (connect,
one `GET /healthz`, close; --per-burst of them, --bursts per round, 6 s apart), then
waits --idle seconds (past the 60 s idle deadline every connection left in the timer
wheel) and reads the daemon's anonymous memory (RssAnon of --pid). Memory that only
holds live state comes back to the same value round after round; memory that keeps a
high-water mark, or leaks, climbs. Prints one line per round and the growth per
connection. Standard library only.

Usage: python3 bench/conn_churn.py --url http://127.0.0.1:18093 --pid PID [--rounds 3]
"""

import argparse
import json
import socket
import time
import urllib.parse


def anon_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon")


def heap_kib(host, port):
    """(allocated, resident) KiB from /healthz's `heap`, or None on a daemon without it."""
    s = socket.create_connection((host, port))
    s.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    heap = json.loads(data.split(b"\r\n\r\n", 1)[1]).get("heap")
    return (heap["allocatedBytes"] // 1024, heap["residentBytes"] // 1024) if heap else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--per-burst", type=int, default=3000)
    ap.add_argument("--idle", type=float, default=70.0)
    a = ap.parse_args()
    u = urllib.parse.urlsplit(a.url)
    req = f"GET /healthz HTTP/1.1\r\nHost: {u.hostname}\r\n\r\n".encode()
    start = anon_kib(a.pid)
    heap0 = heap_kib(u.hostname, u.port)
    print(f"start: anon {start} KiB, heap allocated/resident {heap0} KiB", flush=True)
    prev = start
    for r in range(a.rounds):
        for _ in range(a.bursts):
            for _ in range(a.per_burst):
                s = socket.create_connection((u.hostname, u.port))
                s.sendall(req)
                s.recv(65536)
                s.close()
            time.sleep(6)
        peak = anon_kib(a.pid)
        time.sleep(a.idle)
        now = anon_kib(a.pid)
        heap = heap_kib(u.hostname, u.port)
        n = a.bursts * a.per_burst
        print(f"round {r + 1}: {n} connections, anon {peak} KiB after the bursts, {now} KiB after "
              f"{a.idle:.0f} s idle ({now - prev:+d} KiB, {(now - prev) * 1024 / n:+.1f} B per connection); heap allocated/resident {heap} KiB",
              flush=True)
        prev = now
    total = a.rounds * a.bursts * a.per_burst
    print(f"total: {prev - start:+d} KiB over {total} connections "
          f"({(prev - start) * 1024 / total:+.1f} B per connection)")


if __name__ == "__main__":
    main()

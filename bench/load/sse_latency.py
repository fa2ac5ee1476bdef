"""SSE forwarding latency: time from the program's write to the client's receipt.

A python-slim program prints time.time() every 20 ms; the client (stdlib, raw socket,
SSE over chunked HTTP) stamps each stdout event on arrival and takes the difference.
The sandbox and the client read the same host clock (gVisor derives its clock from the
host's), so the difference is the write -> pipe -> reactor -> socket -> client path.

usage: sse_latency.py HOST:PORT [samples]
"""
import json
import socket
import statistics
import sys
import time


def main() -> int:
    host, port = sys.argv[1].rsplit(":", 1)
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    code = f"import time\nfor i in range({n}):\n print(repr(time.time()), flush=True)\n time.sleep(0.02)"
    body = json.dumps({"language": "python-slim", "network": False, "code": code,
                       "limits": {"wallTimeMs": 20000}}).encode()
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"POST /execute HTTP/1.1\r\nHost: b\r\nAccept: text/event-stream\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    lat = []
    buf = b""
    while True:
        data = s.recv(65536)
        now = time.time()
        if not data:
            break
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b'data: {"chunk":'):
                for v in json.loads(line[6:])["chunk"].split():
                    lat.append((now - float(v)) * 1000.0)
    lat = lat[5:]  # skip warm-up
    if not lat:
        print("no samples", file=sys.stderr)
        return 1
    lat.sort()
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
    print(f"samples={len(lat)} p50_ms={p(0.5):.3f} p99_ms={p(0.99):.3f} max_ms={lat[-1]:.3f} mean_ms={statistics.mean(lat):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A streaming client that stops reading: tiny receive buffer, sleeps, then drains.

usage: slow_client.py HOST PORT BODY SLEEP_SECONDS
Prints one JSON line: {"chunkBytes": total bytes of stdout/stderr chunk payloads,
"doneRun": the done event's run object without its stdout/stderr}.
"""
import json
import socket
import sys
import time

host, port, body, pause = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect((host, port))
s.sendall(b"POST /execute HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
time.sleep(pause)
data = b""
s.settimeout(30)
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
text = data.decode("utf-8", "replace")
chunk_bytes, done = 0, None
for line in text.split("\n"):
    if line.startswith('data: {"chunk":'):
        chunk_bytes += len(json.loads(line[6:])["chunk"])
    elif line.startswith('data: {"language"'):
        done = json.loads(line[6:])
run = dict(done["run"]) if done else None
if run:
    run.pop("stdout"); run.pop("stderr")
print(json.dumps({"chunkBytes": chunk_bytes, "doneRun": run}))

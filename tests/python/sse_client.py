"""SSE client for the integration tests: POSTs a JSON body and prints every event as one
JSON line {"t": seconds since request, "event": name, "data": parsed data}.

usage: sse_client.py URL BODY [first]
  first: close the connection right after the first event (a client that goes away).
"""
import json
import sys
import time

import httpx
from httpx_sse import connect_sse


def main() -> int:
    url, body = sys.argv[1], sys.argv[2]
    first_only = len(sys.argv) > 3 and sys.argv[3] == "first"
    t0 = time.monotonic()
    with httpx.Client(timeout=httpx.Timeout(60.0)) as client:
        with connect_sse(client, "POST", url, content=body.encode(), headers={"Content-Type": "application/json"}) as es:
            print(json.dumps({"status": es.response.status_code, "contentType": es.response.headers.get("content-type")}), flush=True)
            for ev in es.iter_sse():
                print(json.dumps({"t": time.monotonic() - t0, "event": ev.event, "data": json.loads(ev.data)}), flush=True)
                if first_only:
                    break
    return 0


if __name__ == "__main__":
    sys.exit(main())

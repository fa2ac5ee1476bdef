#!/usr/bin/env python3
"""What one durable flush costs on this disk, by what it carries.

The shapes a durable write can take, each ROUNDS times in a 64 MiB file written and
synced first (so no flush has to allocate blocks or update the file's size):

  append 2K + fdatasync                 the write-ahead log's flush (state/wal-N)
  15 scattered + sync + meta + sync     LMDB's synced commit of a small KV batch (~15
                                        dirty 4 KiB pages, then its meta page)
  15 scattered + sync                   the same without the meta page's flush
  1 page + sync                         one page rewritten in place

Prints the mean time per round of each, twice (the second pass shows how much the
disk drifts). Writes only the scratch file `isobox-flushtest` in DIR, and removes it.

Usage: python3 bench/load/flush.py [DIR (default /var/tmp, the data directory's disk)]
Settings (environment): ROUNDS (600).
Python 3.11 standard library only.
"""

import os
import random
import sys
import time

ROUNDS = int(os.environ.get("ROUNDS", "600"))
SIZE = 64 << 20


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/var/tmp"
    path = os.path.join(d, "isobox-flushtest")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for off in range(0, SIZE, 1 << 20):
            os.pwrite(fd, os.urandom(1 << 20), off)
        os.fsync(fd)
        page = os.urandom(4096)
        pos = [SIZE // 2]

        def append(_):
            os.pwrite(fd, page[:2048], pos[0])
            pos[0] += 2048
            os.fdatasync(fd)

        def scattered(n, meta):
            def f(_):
                for _ in range(n):
                    os.pwrite(fd, page, random.randrange(1, (SIZE // 2) // 4096) * 4096)
                os.fdatasync(fd)
                if meta:
                    os.pwrite(fd, page, 0)
                    os.fdatasync(fd)

            return f

        shapes = [
            ("append 2K + fdatasync", append),
            ("15 scattered + sync + meta + sync", scattered(15, True)),
            ("15 scattered + sync", scattered(15, False)),
            ("1 page + sync", scattered(1, False)),
        ]
        for _ in range(2):
            for name, f in shapes:
                t = time.perf_counter()
                for i in range(ROUNDS):
                    f(i)
                dt = (time.perf_counter() - t) / ROUNDS
                print(f"{name:40s} {dt * 1e6:8.0f} us", flush=True)
            pos[0] = SIZE // 2
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main()

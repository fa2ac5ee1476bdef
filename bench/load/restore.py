#!/usr/bin/env python3
"""A ready sandbox two ways, side by side: booted (`runsc create` + `start`) against
restored from a checkpoint (`runsc restore`) — issue 28, item 3.

A warm pool refills by booting a sandbox and starting its interpreter; under load a
refill costs what a cold run costs, so the pool drains. A checkpoint of a sandbox whose
interpreter is already up could be restored instead, if restoring costs less CPU than
booting. This measures both on the installed runsc, alternating one at a time (each
first every other time), with python-slim running

    while True: print('t', flush=True); time.sleep(0.01)

so "ready" is the same for both: the first line read from the sandbox's stdout (for a
boot, the interpreter has started; for a restore, the restored interpreter runs again).
CPU is read at that line and again 1 s later ("+1 s"): the second also holds whatever a
restore still does once the sandbox runs (the loop's own CPU is alike in both).

CPU is counted exactly, not host-wide: each trial's runsc and everything it starts
(sandbox, gofer) run in a cgroup of their own (cpuacct on cgroup v1, cpu.stat on v2),
read at the first line. The checkpoint image is made once, from a sandbox booted the
same way. The bundle is bench/load/execute.py's bare-runsc bundle.

Usage (root): python3 bench/load/restore.py [--runs 20]    (ISOBOX_RUNSC, ISOBOX_PLATFORM)
Python 3.11 standard library only.
"""

import argparse
import importlib.util
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("execute", os.path.join(HERE, "execute.py"))
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)

TICKS = "import time\nwhile True:\n    print('t', flush=True)\n    time.sleep(0.01)\n"
MODES = ("boot", "restore")


def first_line(fd, what):
    r, _, _ = select.select([fd], [], [], ex.TIMEOUT_S)
    if not r:
        raise ex.Failure(f"{what}: no output within {ex.TIMEOUT_S} s")
    data = os.read(fd, 4096)
    if not data.startswith(b"t"):
        raise ex.Failure(f"{what}: read {data[:80]!r}")


def gone(cid):
    subprocess.run(ex.runsc_base() + ["kill", cid, "KILL"], capture_output=True, check=False)
    subprocess.run(ex.runsc_base() + ["delete", "--force", cid], capture_output=True, check=False)


def trial(mode, rt, image):
    """(wall ms, CPU s, CPU s 1 s later) from the command's start to the sandbox's first
    line; the second CPU figure also holds whatever a restore still does after it
    resumed (the ticking loop's own CPU is the same for both modes)."""
    cid = "isobox-benchrst-" + uuid.uuid4().hex[:12]
    rfd, wfd = os.pipe()
    cg, bundle = None, None
    try:
        # The sandbox's own processes (sentry, gofer, ptrace stubs) go where the spec's
        # cgroupsPath says (as isoboxd's do); the runsc commands join it before they run.
        bundle = ex.write_bundle(rt)
        cg = ex.BenchCgroup("isobox-bench-restore-" + uuid.uuid4().hex[:8])
        conf = os.path.join(bundle, "config.json")
        with open(conf) as f:
            spec = json.load(f)
        spec["linux"]["cgroupsPath"] = "/" + os.path.basename(cg.path)
        with open(conf, "w") as f:
            json.dump(spec, f)
        if mode == "boot":
            steps = [["create", "--bundle", bundle, cid], ["start", cid]]
        else:
            steps = [["restore", "--detach", "--bundle", bundle, "--image-path", image, cid]]
        t0 = time.perf_counter()
        for step in steps:
            # stderr to a file, not a pipe: the sandbox keeps what it inherits open,
            # and a pipe would be waited on until it ends.
            with tempfile.TemporaryFile() as err:
                p = subprocess.run(ex.runsc_base() + step, stdin=subprocess.DEVNULL, stdout=wfd,
                                   stderr=err, preexec_fn=cg.enter, timeout=ex.TIMEOUT_S, check=False)
                if p.returncode != 0:
                    err.seek(0)
                    raise ex.Failure(f"{mode}: runsc {step[0]} exit {p.returncode}: {err.read()[-400:]!r}")
        first_line(rfd, mode)
        dt = time.perf_counter() - t0
        cpu = cg.seconds()
        time.sleep(1)  # ~100 lines of 2 bytes: the pipe never fills
        return dt * 1000, cpu, cg.seconds()
    finally:
        os.close(wfd)
        os.close(rfd)
        gone(cid)
        try:
            if cg:
                cg.remove()
        except OSError as e:
            print(f"  warning: cgroup {cg.path} not removed: {e}", file=sys.stderr)
        if bundle:
            shutil.rmtree(bundle, ignore_errors=True)


def checkpoint(bundle, image):
    """Boots a sandbox like `trial`'s, then checkpoints it into `image` (it stops)."""
    cid = "isobox-benchrst-" + uuid.uuid4().hex[:12]
    rfd, wfd = os.pipe()
    try:
        for step in (["create", "--bundle", bundle, cid], ["start", cid]):
            subprocess.run(ex.runsc_base() + step, stdin=subprocess.DEVNULL, stdout=wfd, check=True,
                           capture_output=False, timeout=ex.TIMEOUT_S)
        first_line(rfd, "checkpoint's sandbox")
        t0 = time.perf_counter()
        subprocess.run(ex.runsc_base() + ["checkpoint", "--image-path", image, cid], check=True,
                       capture_output=True, timeout=ex.TIMEOUT_S)
        ms = (time.perf_counter() - t0) * 1000
        size = sum(os.path.getsize(os.path.join(image, f)) for f in os.listdir(image))
        return ms, size
    finally:
        os.close(wfd)
        os.close(rfd)
        gone(cid)


def pct(xs, p):
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, -(-len(s) * p // 100) - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="trials per mode")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (runsc needs it)")
    rts = [rt for rt in ex.runtimes_to_bench() if rt["language"] == "python-slim"]
    if not rts:
        sys.exit("python-slim's root filesystem is not built (make runtimes)")
    rt = dict(rts[0], code=TICKS)
    os.makedirs(ex.RUNSC_ROOT, exist_ok=True)
    version = (subprocess.run([ex.RUNSC, "--version"], capture_output=True, text=True).stdout.splitlines() or ["?"])[0]
    bundle = ex.write_bundle(rt)
    image = tempfile.mkdtemp(prefix="isobox-bench-image-")
    failed = 0
    try:
        ck_ms, size = checkpoint(bundle, image)
        print(f"{ex.RUNSC}: {version}; platform {ex.PLATFORM}; {os.cpu_count()} CPUs; load {ex.loadavg()}")
        print(f"checkpoint of a ready python-slim sandbox: {ck_ms:.0f} ms, image {size / 1e6:.1f} MB")
        got = {m: ([], [], []) for m in MODES}
        for i in range(args.runs):
            for m in MODES if i % 2 == 0 else MODES[::-1]:
                try:
                    ms, cpu, later = trial(m, rt, image)
                    got[m][0].append(ms)
                    got[m][1].append(cpu)
                    got[m][2].append(later)
                except (ex.Failure, subprocess.TimeoutExpired) as e:
                    failed += 1
                    print(f"  failure: {e}", file=sys.stderr)
        print(f"{'to ready':<10} {'p50 ms':>8} {'p90 ms':>8} {'mean ms':>8} {'CPU-s p50':>10} {'CPU-s mean':>11} {'+1 s p50':>9}")
        for m in MODES:
            lat, cpu, later = got[m]
            if lat:
                print(f"{m:<10} {pct(lat, 50):8.1f} {pct(lat, 90):8.1f} {sum(lat) / len(lat):8.1f} "
                      f"{pct(cpu, 50):10.3f} {sum(cpu) / len(cpu):11.3f} {pct(later, 50):9.3f}")
        if all(got[m][0] for m in MODES):
            (bl, bc, bx), (rl, rc, rx) = got["boot"], got["restore"]
            print(f"restore / boot: wall p50 {pct(rl, 50) / pct(bl, 50):.2f}x, CPU p50 {pct(rc, 50) / pct(bc, 50):.2f}x, "
                  f"CPU 1 s after ready p50 {pct(rx, 50) / pct(bx, 50):.2f}x")
    finally:
        shutil.rmtree(bundle, ignore_errors=True)
        shutil.rmtree(image, ignore_errors=True)
    if failed:
        sys.exit(f"{failed} trials failed")


if __name__ == "__main__":
    main()

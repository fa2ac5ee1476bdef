#!/usr/bin/env python3
"""Cold /execute: isoboxd binaries against each other and against bare runsc, alternating.

The same program, bundle and CPU accounting as `execute.py` (its `run_bare_runsc`,
`BenchCgroup` and daemon start), but every mode takes its turn within each round, in
blocks of BLOCK runs at concurrency CONC: bare runsc, bare runsc under isoboxd's host
limits for the runtime (CPU quota, memory and task caps in the spec, which runsc
applies: what a sandbox costs with the limits every isoboxd run has), then each binary (all daemons
run at once, each with its own instance, port and data directory, idle while another
block runs). A host whose speed drifts from minute to minute then drifts under every
mode alike, which one `execute.py` run after another cannot give. For each mode and
round: the exact CPU-seconds per run (bare runsc: its cgroup; a daemon: its own cgroup
plus its sandboxes' slice) and runs/s; at the end the median over the rounds, and each
binary's ratios to both bare references (CPU: lower is better; runs/s: higher is better).
When the runtime's tree has a root image (made by an isoboxd's first offline cold run,
`src/sandbox/image.rs`), a third reference runs too, "bare image": bare runsc of the same
program on that image with no gofer, as isoboxd runs it (its ratios are isoboxd's own
overhead on the same sandbox).

Usage (root): python3 bench/load/execute_ab.py NAME=BINARY [NAME=BINARY ...]
Settings (environment): ROUNDS (8), BLOCK (24), CONC (4), MIX (1: the modes' runs
interleaved request by request within one block per round, so all share the host's
same minutes; then mean latency instead of runs/s), EQUAL_WEIGHT (1: each daemon's
sandbox slice at the default CPU weight rather than the half isoboxd gives it, so its
sandboxes and the bare ones compete as equals), BENCH_LANGUAGES
("python-slim"), NETWORK (1: the daemons' runs ask for a network, each daemon with a
pool of addresses of its own; the bare references stay offline, so compare the daemons
with each other), and `execute.py`'s ISOBOX_PLATFORM / ISOBOX_RUNSC.
A binary may be a wrapper script that execs isoboxd (it must keep the process).
Python 3.11 standard library only.
"""

import concurrent.futures as cf
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("BENCH_LANGUAGES", "python-slim")
import execute as ex  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "8"))
BLOCK = int(os.environ.get("BLOCK", "24"))
CONC = int(os.environ.get("CONC", "4"))
# MIX=1: each round is one block in which the modes' runs are interleaved request by
# request (run k is mode k mod n), so every mode runs under the same minutes of the
# host; CPU per run comes from each mode's own cgroup, latency instead of runs/s.
MIX = os.environ.get("MIX", "") == "1"
# EQUAL_WEIGHT=1: each daemon's sandbox slice gets the default CPU weight (cpu.shares
# 1024 on v1, cpu.weight 100 on v2) instead of the half it sets itself, so its sandboxes
# compete with the bare ones as equals (the slice is the daemon's own, removed with it).
EQUAL_WEIGHT = os.environ.get("EQUAL_WEIGHT", "") == "1"


def equal_weight(instance):
    v1 = f"/sys/fs/cgroup/cpu/{instance}/cpu.shares"
    path, value = (v1, "1024") if os.path.exists(v1) else (f"/sys/fs/cgroup/{instance}/cpu.weight", "100")
    with open(path, "w") as f:
        f.write(value)


# Bare runsc under the limits has a cgroup of its own (MIX needs them apart); made in main.
LIMITED_CG = None


# isoboxd's host limits for the runtime's defaults (python-slim: 1 CPU, 256 MiB, 128
# tasks): src/sandbox/runsc.rs, GVISOR_OVERHEAD_BYTES and host_pids_for.
LIMITS = {
    "cpu": {"quota": 100000, "period": 100000},
    "memory": {"limit": (256 << 20) + (32 << 20)},
    "pids": {"limit": 128 + 40 * 128},
}


def run_bare_limited(rt):
    """Bare `runsc run` as `execute.run_bare_runsc`, its container under isoboxd's limits
    (the spec's `linux.resources`, which runsc applies to its cgroup)."""
    cid = "isobox-benchref-" + uuid.uuid4().hex[:12]
    cg = LIMITED_CG
    bundle = ex.write_bundle(rt, f"/{os.path.basename(cg.path)}/{cid}")
    try:
        path = os.path.join(bundle, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["linux"]["resources"] = LIMITS
        with open(path, "w") as f:
            json.dump(cfg, f)
        p = subprocess.run(ex.runsc_base() + ["run", "--bundle", bundle, cid], check=False, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=ex.TIMEOUT_S, preexec_fn=cg.enter)
        if p.returncode != 0 or p.stdout.decode() != ex.EXPECTED:
            raise ex.Failure(f"runsc exit {p.returncode} stdout {p.stdout[:80]!r} stderr {p.stderr[-300:]!r}")
        return 0.0, None
    finally:
        shutil.rmtree(bundle, ignore_errors=True)


class Daemon:
    """One isoboxd of the comparison, started through `execute.start_isoboxd`."""

    def __init__(self, name, binary, n):
        self.name = name
        ex.ISOBOXD = binary
        ex.PORT = 18099 + 10 + n
        ex.INSTANCE = f"isobox-benchab{n}"
        ex.DATA_DIR = f"/tmp/bench-ab-data-{n}"
        # Networked runs: each daemon numbers its links from a range of its own.
        os.environ["ISOBOX_NET_POOL"] = f"10.{210 + n}.0.0/16"
        shutil.rmtree(ex.DATA_DIR, ignore_errors=True)
        self.port, self.instance, self.data_dir = ex.PORT, ex.INSTANCE, ex.DATA_DIR
        self.proc, self.log = ex.start_isoboxd()
        self.own, self.slice = ex.DAEMON_CG, ex.SLICE_CG
        if EQUAL_WEIGHT:
            equal_weight(self.instance)

    def seconds(self):
        return self.own.seconds() + self.slice.seconds()

    def run_one(self, rt):
        ex.PORT = self.port
        return ex.run_isoboxd(rt)

    def stop(self):
        ex.INSTANCE, ex.DAEMON_CG = self.instance, self.own
        ex.stop_isoboxd(self.proc)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def block(fn, rt, seconds):
    """BLOCK runs of `fn` at CONC: (exact CPU-s per run, runs/s)."""
    c0 = seconds()
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=CONC) as pool:
        for f in [pool.submit(fn, rt) for _ in range(BLOCK)]:
            f.result()
    wall = time.perf_counter() - t0
    time.sleep(1)  # what a run leaves to do after its answer counts too
    return (seconds() - c0) / BLOCK, BLOCK / wall


def mixed(modes, rt):
    """BLOCK runs of every mode, interleaved at CONC: {mode: (CPU-s per run, mean ms)}."""
    c0 = {name: secs() for name, _, secs in modes}
    lat = {name: [] for name, _, _ in modes}

    def timed(name, fn):
        t0 = time.perf_counter()
        fn(rt)
        lat[name].append((time.perf_counter() - t0) * 1000)

    with cf.ThreadPoolExecutor(max_workers=CONC) as pool:
        order = [modes[k % len(modes)] for k in range(BLOCK * len(modes))]
        for f in [pool.submit(timed, name, fn) for name, fn, _ in order]:
            f.result()
    time.sleep(1)
    return {name: ((secs() - c0[name]) / BLOCK, statistics.mean(lat[name])) for name, _, secs in modes}


# Bare `runsc run` of the same program on the runtime's root image, with no gofer, as
# isoboxd starts an offline cold run once the tree's image is ready (src/sandbox/image.rs):
# `isobox-start --unpack` (compiled here from src/sandbox/start.c with build.rs's flags)
# from --exec-fd, the program's file in a workspace archive on --pass-fd 3. Made in main
# when the image and a C compiler are there.
IMAGE = None
IMAGE_CG = None
LOADER = None
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_image(rt):
    import glob
    tree = os.path.basename(rt["rootfs_path"])
    d = os.environ.get("ISOBOX_IMAGE_DIR", "/var/lib/isobox/images")
    for img in sorted(glob.glob(os.path.join(d, f"{tree}.*.erofs")), key=os.path.getmtime, reverse=True):
        if glob.glob(img + ".*.ok"):
            return img
    return None


def build_loader(out):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    p = subprocess.run([cc, "-Os", "-static", "-nostdlib", "-ffreestanding", "-fno-pie", "-no-pie",
                        "-fno-stack-protector", "-fno-asynchronous-unwind-tables",
                        "-fno-tree-loop-distribute-patterns", "-s", "-o", out,
                        os.path.join(REPO, "src/sandbox/start.c")], capture_output=True)
    return out if p.returncode == 0 else None


def run_bare_image(rt):
    """`execute.run_bare_runsc`'s program on the tree's root image, goferless."""
    import struct
    cid = "isobox-benchref-" + uuid.uuid4().hex[:12]
    cg = IMAGE_CG
    bundle = ex.write_bundle(rt, f"/{os.path.basename(cg.path)}/{cid}")
    archive, loader = None, None
    try:
        path = os.path.join(bundle, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        os.mkdir(os.path.join(bundle, "root"))
        cfg["root"]["path"] = os.path.join(bundle, "root")
        cfg["annotations"] = {"dev.gvisor.spec.rootfs.source": IMAGE, "dev.gvisor.spec.rootfs.type": "erofs"}
        for m in cfg["mounts"]:
            if m["destination"] == "/workspace":
                m.clear()
                m.update({"destination": "/workspace", "type": "tmpfs", "source": "tmpfs",
                          "options": ["nosuid", "nodev", "mode=1777", f"size={256 << 20}"]})
        caps = ["CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID"]
        cfg["process"]["user"] = {"uid": 0, "gid": 0}
        cfg["process"]["capabilities"] = {"bounding": caps, "effective": caps, "permitted": caps,
                                          "inheritable": [], "ambient": []}
        cfg["process"]["args"] = ["/opt/isobox/start", "--unpack", "65534"] + cfg["process"]["args"]
        with open(path, "w") as f:
            json.dump(cfg, f)
        name, code = rt["source_file"].encode(), rt["code"].encode()
        blob = b"ISOBOXW1" + b"f" + struct.pack("<H", len(name)) + name + struct.pack("<Q", len(code)) + code + b"\0"
        archive = os.memfd_create("isobox-workspace")
        os.write(archive, blob)
        os.lseek(archive, 0, os.SEEK_SET)
        loader = os.open(LOADER, os.O_RDONLY)
        p = subprocess.run(ex.runsc_base() + ["run", f"--exec-fd={loader}", f"--pass-fd={archive}:3", "--bundle", bundle, cid],
                           check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=ex.TIMEOUT_S,
                           preexec_fn=cg.enter, pass_fds=(loader, archive))
        if p.returncode != 0 or p.stdout.decode() != ex.EXPECTED:
            raise ex.Failure(f"runsc exit {p.returncode} stdout {p.stdout[:80]!r} stderr {p.stderr[-300:]!r}")
        return 0.0, None
    finally:
        for fd in (archive, loader):
            if fd is not None:
                os.close(fd)
        shutil.rmtree(bundle, ignore_errors=True)


def main():
    specs = [a.split("=", 1) for a in sys.argv[1:]]
    if not specs or any(len(s) != 2 or not os.access(s[1], os.X_OK) for s in specs):
        sys.exit("usage: python3 bench/load/execute_ab.py NAME=BINARY [NAME=BINARY ...]")
    if os.geteuid() != 0:
        sys.exit("error: run as root (runsc and isoboxd need it)")
    os.makedirs(ex.RUNSC_ROOT, exist_ok=True)
    rt = ex.runtimes_to_bench()[0]
    global LIMITED_CG
    bare = ex.BenchCgroup(f"isobox-bench-bare-runsc-{os.getpid()}")
    ex.MODE_CG["bare runsc"] = bare
    LIMITED_CG = ex.BenchCgroup(f"isobox-bench-bare-limits-{os.getpid()}")
    daemons = []
    try:
        for n, (name, binary) in enumerate(specs):
            daemons.append(Daemon(name, binary, n))
        global IMAGE, IMAGE_CG, LOADER
        IMAGE = find_image(rt)
        LOADER = IMAGE and build_loader(os.path.join(ex.RUNSC_ROOT, "isobox-start"))
        image_mode = []
        if IMAGE and LOADER:
            IMAGE_CG = ex.BenchCgroup(f"isobox-bench-bare-image-{os.getpid()}")
            image_mode = [("bare image", run_bare_image, IMAGE_CG.seconds)]
        else:
            print(f"(no bare image mode: image {IMAGE}, loader {LOADER}; an isoboxd makes the image on its first offline cold run)")
        modes = [("bare runsc", ex.run_bare_runsc, bare.seconds), ("bare+limits", run_bare_limited, LIMITED_CG.seconds)] + image_mode + [
            (d.name, d.run_one, d.seconds) for d in daemons
        ]
        for _, fn, _ in modes:  # warm the page cache and each daemon; not counted
            for _ in range(2):
                fn(rt)
        how = ("interleaved request by request" if MIX else "per mode") + (
            ", the daemons' runs networked (bare runsc offline)" if ex.NETWORK else "") + (
            ", isoboxd's slices at the default CPU weight" if EQUAL_WEIGHT else "")
        print(f"== {rt['language']} `{rt['code']}`: {ROUNDS} rounds of {BLOCK} runs at c={CONC} {how}; "
              f"load average before: {ex.loadavg()}")
        res = {name: [] for name, _, _ in modes}
        unit = "ms" if MIX else "/s"
        for r in range(ROUNDS):
            line = [f"round {r + 1:>2}"]
            if MIX:
                for name, v in mixed(modes, rt).items():
                    res[name].append(v)
            else:
                for name, fn, secs in modes:
                    res[name].append(block(fn, rt, secs))
            for name, _, _ in modes:
                cpu, x = res[name][-1]
                line.append(f"{name} {cpu:.4f} s {x:6.1f}{unit}")
            print("  ".join(line), flush=True)
        print(f"load average after: {ex.loadavg()}")
        second = "mean ms" if MIX else "runs/s"
        print(f"{'mode':<12} {'CPU-s/run':>10} {second:>7}   (medians of {ROUNDS} rounds)")
        med = {n: (statistics.median(c for c, _ in v), statistics.median(s for _, s in v)) for n, v in res.items()}
        for n, (c, s) in med.items():
            print(f"{n:<12} {c:>10.4f} {s:>7.2f}")
        refs = ("bare runsc", "bare+limits") + (("bare image",) if "bare image" in med else ())
        for ref in refs:
            b_cpu, b_rps = med[ref]
            extra = ["bare+limits"] + (["bare image"] if "bare image" in med else []) if ref == "bare runsc" else []
            for name in [d.name for d in daemons] + extra:
                c, s = med[name]
                # Per round too: the spread of the ratio says what the medians can tell apart.
                per = [(x[0] / y[0], x[1] / y[1]) for x, y in zip(res[name], res[ref])]
                print(f"{name} / {ref}: CPU {c / b_cpu:.3f}x, {second} {s / b_rps:.3f}x; per round CPU "
                      f"{min(p[0] for p in per):.2f}-{max(p[0] for p in per):.2f}x (median "
                      f"{statistics.median(p[0] for p in per):.3f}x), {second} "
                      f"{min(p[1] for p in per):.2f}-{max(p[1] for p in per):.2f}x")
    finally:
        for d in daemons:
            d.stop()
        left = ex.delete_bare_containers()
        bare.remove()
        LIMITED_CG.remove()
        if IMAGE_CG:
            IMAGE_CG.remove()
        if LOADER:
            os.unlink(LOADER)
        if left:
            sys.exit(f"error: bare runsc containers left: {left}")


if __name__ == "__main__":
    main()

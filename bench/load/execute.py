#!/usr/bin/env python3
"""POST /execute latency and throughput, side by side with its two references.

For each runtime whose root filesystem is built (python-slim always; javascript when the
`node` tree exists), one hello-world program is run three ways, at concurrency 1, 4 and 16:

  native      chroot ROOTFS INTERPRETER -c/-e PROGRAM       (the interpreter alone)
  bare runsc  runsc --root /tmp/bench-runsc --platform=$ISOBOX_PLATFORM --network=none
              run --bundle B ID                              (gVisor alone, no daemon)
  isoboxd     POST /execute {"language", "code", "network": false}, one connection each

The bare-runsc bundle mirrors what isoboxd writes (src/sandbox/bundle.rs): read-only
root = the runtime's rootfs, uid/gid 65534, no capabilities, noNewPrivileges, tmpfs /tmp
and /workspace, the program bound read-only at /workspace/<source_file>, the
descriptor's argv and env, pid/net/ipc/uts/mount namespaces. Its cgroupsPath is a
child of a cgroup of the bench's own and sets no limits (runsc makes a cgroup for the
container either way; there, its CPU can be read): isoboxd's limits, its own cgroup
setup/teardown and `runsc delete` are part of what it adds.

Reports p50/p99/mean latency, runs/s and host CPU-seconds per run for each mode, the
ratios isoboxd/bare runsc and isoboxd/native, and isoboxd's own run.durationMs (program
start to exit) so the daemon's share is visible. CPU per run is the whole host's busy
time (/proc/stat, all CPUs, idle and iowait excluded) from the first request to 1 s
after the last answer (so the daemon's cleanup after its answers counts), divided by the
runs that succeeded: run it on a quiet host. Every bare runsc container is deleted afterwards; the script
fails if `runsc --root /tmp/bench-runsc list` is not empty at the end.

"own s" is exact and not host-wide: the CPU-seconds per run of isoboxd's own cgroup (the
daemon is started in a cgroup of the bench's own; each run's sandbox has a cgroup of its
own, so this is the daemon and the helper processes it starts outside the sandboxes:
what it adds around a run, whatever else the host is doing).

"exact s" is each mode's whole CPU-seconds per run, exactly, whatever else the host is
doing: native's chroot and interpreter and bare runsc's `runsc run` (with the sandbox and
gofer it starts) each run in a cgroup of the bench's own; for isoboxd it is its own
cgroup plus its sandboxes' slice (the `ISOBOX_INSTANCE` cgroup under the cpu hierarchy,
whose usage keeps what its removed children used). This is the column issue 28 item 2's
"CPU per cold run" compares; "cpu s" (host-wide) also counts whatever else ran.

Usage (root): python3 bench/load/execute.py [--runs1 30] [--runs4 40] [--runs16 48] (0 skips a concurrency)
BENCH_LANGUAGES="python-slim" limits it to those runtimes; ISOBOXD=path benches another build.
Python 3.11 standard library only.
"""

import argparse
import concurrent.futures as cf
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNSC = os.environ.get("ISOBOX_RUNSC", "/usr/bin/runsc")
# The platform isoboxd uses (its default unless ISOBOX_PLATFORM says otherwise).
PLATFORM = os.environ.get("ISOBOX_PLATFORM", "ptrace")
RUNSC_ROOT = "/tmp/bench-runsc"
ROOTFS_DIR = os.environ.get("ISOBOX_ROOTFS_DIR", "/var/lib/isobox/rootfs")
PORT = int(os.environ.get("BENCH_PORT", "18099"))
INSTANCE = os.environ.get("BENCH_INSTANCE", "isobox-bench")
DATA_DIR = os.environ.get("BENCH_DATA_DIR", "/tmp/bench-data")
ISOBOXD = os.environ.get("ISOBOXD", os.path.join(ROOT, "target/release/isoboxd"))
TIMEOUT_S = 60
CHROOT = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/chroot"

# language -> (program, native argv flag); each prints "1\n".
PROGRAMS = {
    "python-slim": ("print(1)", "-c"),
    "javascript": ("console.log(1)", "-e"),
}
EXPECTED = "1\n"


def descriptor(language):
    with open(os.path.join(ROOT, "runtimes", f"{language}.toml"), "rb") as f:
        return tomllib.load(f)


class Failure(Exception):
    pass


# --- the three ways to run a program ------------------------------------------------


def run_native(rt):
    argv = [CHROOT, rt["rootfs_path"], rt["run"][0], rt["flag"], rt["code"]]
    t0 = time.perf_counter()
    p = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL, capture_output=True, env=rt["env_dict"], timeout=TIMEOUT_S,
                       preexec_fn=MODE_CG["native"].enter)
    dt = time.perf_counter() - t0
    if p.returncode != 0 or p.stdout.decode() != EXPECTED:
        raise Failure(f"native exit {p.returncode} stdout {p.stdout[:80]!r} stderr {p.stderr[:200]!r}")
    return dt, None


def bundle_config(rt, src_file, cgroups_path=None):
    mem = 256 << 20

    def tmpfs(dest):
        return {
            "destination": dest,
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", f"size={mem}"],
        }

    return {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": 65534, "gid": 65534},
            "args": rt["run"],
            "env": rt["env"],
            "cwd": "/workspace",
            "capabilities": {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")},
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024},
                {"type": "RLIMIT_NPROC", "hard": 128, "soft": 128},
                {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
            ],
            "noNewPrivileges": True,
        },
        "root": {"path": rt["rootfs_path"], "readonly": True},
        "hostname": "isobox",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            tmpfs("/tmp"),
            # The program's directory over /workspace, as isoboxd binds its workspace (a
            # file bound at /workspace/main.py would make its mount point in the shared
            # tree itself: runsc makes missing mount points inside the root it is given).
            {"destination": "/workspace", "type": "bind", "source": os.path.dirname(src_file), "options": ["rbind", "ro"]},
        ],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]}
        | ({"cgroupsPath": cgroups_path} if cgroups_path else {}),
    }


def runsc_base():
    return [RUNSC, "--root", RUNSC_ROOT, f"--platform={PLATFORM}", "--network=none"]


def write_bundle(rt, cgroups_path=None):
    """A bundle directory for `rt`'s program, as isoboxd would write it (the caller
    removes it)."""
    bundle = tempfile.mkdtemp(prefix="isobox-bench-bundle-")
    os.mkdir(os.path.join(bundle, "workspace"), 0o755)
    src = os.path.join(bundle, "workspace", rt["source_file"])
    with open(src, "w") as f:
        f.write(rt["code"])
    os.chmod(src, 0o644)
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(bundle_config(rt, src, cgroups_path), f)
    return bundle


def run_bare_runsc(rt):
    cid = "isobox-benchref-" + uuid.uuid4().hex[:12]
    # Without a cgroupsPath runsc makes a cgroup named after the container at the top
    # of each hierarchy (and removes it, with what its sandbox used): under the bench's
    # own, the sandbox's CPU stays counted there. runsc makes one either way.
    bundle = write_bundle(rt, f"/{os.path.basename(MODE_CG['bare runsc'].path)}/{cid}")
    try:
        t0 = time.perf_counter()
        p = subprocess.run(
            runsc_base() + ["run", "--bundle", bundle, cid],
            check=False,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT_S,
            preexec_fn=MODE_CG["bare runsc"].enter,
        )
        dt = time.perf_counter() - t0
        if p.returncode != 0 or p.stdout.decode() != EXPECTED:
            raise Failure(f"runsc exit {p.returncode} stdout {p.stdout[:80]!r} stderr {p.stderr[-300:]!r}")
        return dt, None
    finally:
        shutil.rmtree(bundle, ignore_errors=True)


# NETWORK=1: isoboxd's runs ask for a network (`"network": true`, each its own namespace,
# link and resolv.conf); a run that comes back offline (egress not verified) fails.
NETWORK = os.environ.get("NETWORK", "") == "1"


def run_isoboxd(rt):
    body = json.dumps({"language": rt["language"], "code": rt["code"], "network": NETWORK})
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=TIMEOUT_S)
    try:
        conn.request("POST", "/execute", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    dt = time.perf_counter() - t0
    if resp.status != 200:
        raise Failure(f"isoboxd HTTP {resp.status}: {data[:300]!r}")
    run = json.loads(data)["run"]
    if run["exitCode"] != 0 or run["stdout"] != EXPECTED or run["network"] != NETWORK:
        raise Failure(f"isoboxd run {run}")
    return dt, run["durationMs"]


MODES = [("native", run_native), ("bare runsc", run_bare_runsc), ("isoboxd", run_isoboxd)]


# --- measurement ----------------------------------------------------------------------


def percentile(xs, q):
    """Nearest-rank percentile (with 30 samples, p99 is the maximum)."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


def busy_seconds():
    """The host's busy CPU time so far (all CPUs; idle and iowait excluded)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


class BenchCgroup:
    """A cgroup of the bench's own (cpuacct on cgroup v1, cpu.stat on v2): processes
    started with `preexec_fn=cg.enter` and their children run in it; `seconds()` is
    their CPU so far, exactly."""

    def __init__(self, name, make=True):
        v1 = "/sys/fs/cgroup/cpuacct"
        self.v1 = os.path.exists(os.path.join(v1, "cpuacct.usage"))
        if not self.v1 and not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            raise Failure("no cgroup v1 cpuacct and no cgroup v2 at /sys/fs/cgroup")
        self.path = os.path.join(v1 if self.v1 else "/sys/fs/cgroup", name)
        if make:
            os.makedirs(self.path, exist_ok=True)

    def enter(self):
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def seconds(self):
        if self.v1:
            with open(os.path.join(self.path, "cpuacct.usage")) as f:
                return int(f.read()) / 1e9
        with open(os.path.join(self.path, "cpu.stat")) as f:
            return next(int(v) for k, v in (line.split() for line in f) if k == "usage_usec") / 1e6

    def remove(self):
        """Removes it, from every v1 hierarchy too (runsc makes a spec's cgroupsPath in
        each it uses), waiting up to 10 s for its processes to be gone."""
        name = os.path.basename(self.path)
        roots = [os.path.join("/sys/fs/cgroup", d) for d in os.listdir("/sys/fs/cgroup")] if self.v1 else []
        for path in [os.path.join(r, name) for r in roots] or [self.path]:
            deadline = time.monotonic() + 10
            while os.path.isdir(path):
                try:
                    os.rmdir(path)
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


DAEMON_CG = None
# Where each reference mode's processes run ("native", "bare runsc"); made in main.
MODE_CG = {}
# isoboxd's sandboxes' slice (the daemon makes it; read only).
SLICE_CG = None


def mode_seconds(fn):
    """The exact CPU so far of everything `fn`'s runs use (None: not measurable)."""
    if fn is run_isoboxd:
        if DAEMON_CG is None or SLICE_CG is None or not os.path.isdir(SLICE_CG.path):
            return None
        return DAEMON_CG.seconds() + SLICE_CG.seconds()
    cg = MODE_CG.get("native" if fn is run_native else "bare runsc")
    return cg.seconds() if cg else None


def measure(fn, rt, runs, conc):
    lat, durs, errors = [], [], []
    own0 = DAEMON_CG.seconds() if fn is run_isoboxd and DAEMON_CG else None
    exact0 = mode_seconds(fn)
    c0 = busy_seconds()
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=conc) as ex:
        for fut in [ex.submit(fn, rt) for _ in range(runs)]:
            try:
                dt, dur = fut.result()
                lat.append(dt * 1000)
                if dur is not None:
                    durs.append(dur)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                errors.append(str(e))
    wall = time.perf_counter() - t0
    # What a run leaves to do after its answer (cleanup, a pool refill) is its cost too.
    time.sleep(1)
    cpu = (busy_seconds() - c0) / len(lat) if lat else 0.0
    own = (DAEMON_CG.seconds() - own0) / len(lat) if own0 is not None and lat else None
    exact1 = mode_seconds(fn)
    exact = (exact1 - exact0) / len(lat) if exact0 is not None and exact1 is not None and lat else None
    return {"lat": lat, "durs": durs, "errors": errors, "rps": len(lat) / wall if wall > 0 else 0.0, "runs": runs,
            "cpu": cpu, "own": own, "exact": exact}


# --- isoboxd and runsc state ----------------------------------------------------------


def port_in_use(port):
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_isoboxd():
    if not os.access(ISOBOXD, os.X_OK):
        sys.exit(f"error: {ISOBOXD} missing: run cargo build --release")
    if port_in_use(PORT):
        sys.exit(f"error: 127.0.0.1:{PORT} is already in use")
    os.makedirs(DATA_DIR, exist_ok=True)
    env = dict(os.environ)
    env.update(
        ISOBOX_DATA_DIR=DATA_DIR,
        ISOBOX_INSTANCE=INSTANCE,
        ISOBOX_LISTEN=f"127.0.0.1:{PORT}",
        ISOBOX_LOG="warn",
        ISOBOX_MAX_CONCURRENT="16",
        ISOBOX_SHUTDOWN_GRACE_MS="2000",
        # Every request comes from 127.0.0.1: lift the per-client /execute rate limit.
        ISOBOX_RATE_PER_MIN="1000000",
        ISOBOX_RATE_BURST="100000",
        # Cold starts are what this compares with a bare `runsc run`; the warm pool
        # (on by default) has its own benchmark, bench/load/warm.py.
        ISOBOX_WARM_POOL="off",
        ISOBOX_WBX_WARM_POOL="off",
    )
    log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the daemon
    global DAEMON_CG, SLICE_CG
    DAEMON_CG = BenchCgroup(f"isobox-bench-daemon-{INSTANCE}-{os.getpid()}")
    # cgroup v1: the slice is under the cpu hierarchy (with cpuacct mounted beside it).
    # On cgroup v1 runsc makes each sandbox's cgroupsPath (INSTANCE/<run>) in every
    # hierarchy it knows, cpuacct too, under the instance's directory.
    SLICE_CG = BenchCgroup(INSTANCE, make=False)
    proc = subprocess.Popen([ISOBOXD], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            preexec_fn=DAEMON_CG.enter)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            sys.exit(f"error: isoboxd exited during startup:\n{log.read().decode(errors='replace')}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=2)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                c.close()
                return proc, log
            c.close()
        except OSError:
            pass
        time.sleep(0.1)
    stop_isoboxd(proc)
    log.seek(0)
    sys.exit(f"error: isoboxd not ready after 60 s:\n{log.read().decode(errors='replace')}")


def stop_isoboxd(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        print("warning: isoboxd ignored SIGTERM for 20 s; sending SIGKILL", file=sys.stderr)
        proc.kill()
        proc.wait()
    if DAEMON_CG:
        DAEMON_CG.remove()
    for _ in range(20):
        left = [d for d in os.listdir("/sys/fs/cgroup") if os.path.isdir(f"/sys/fs/cgroup/{d}/{INSTANCE}")]
        if not left:
            return
        time.sleep(0.1)
    print(f"warning: cgroup slice {INSTANCE} left behind in {left}", file=sys.stderr)


def runsc_list():
    p = subprocess.run(runsc_base() + ["list", "-quiet"], check=False, capture_output=True, text=True, timeout=30)
    return [line for line in p.stdout.split() if line]


def delete_bare_containers():
    for cid in runsc_list():
        subprocess.run(runsc_base() + ["delete", "--force", cid], check=False, capture_output=True, timeout=30)
    return runsc_list()


def time_runsc_delete(n=10):
    """What `runsc delete --force` of an already-gone container costs (what isoboxd paid per
    execution until it ran one only for a container that `runsc run` left behind)."""
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(runsc_base() + ["delete", "--force", "isobox-benchref-gone"], check=False, capture_output=True, timeout=30)
        lat.append((time.perf_counter() - t0) * 1000)
    return percentile(lat, 50)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# --- main -----------------------------------------------------------------------------


def runtimes_to_bench():
    out = []
    only = os.environ.get("BENCH_LANGUAGES", "").split()
    for language, (code, flag) in PROGRAMS.items():
        if only and language not in only:
            continue
        d = descriptor(language)
        path = os.path.join(ROOTFS_DIR, d["rootfs"])
        if not os.path.isdir(path):
            print(f"(skipping {language}: {path} not built)")
            continue
        env = list(d["env"])
        out.append(
            {
                "language": language,
                "code": code,
                "flag": flag,
                "rootfs_path": path,
                "run": list(d["run"]),
                "source_file": d["source_file"],
                "env": env,
                "env_dict": dict(e.split("=", 1) for e in env),
            }
        )
    return out


def fmt_row(name, conc, r):
    lat = r["lat"]
    ok = len(lat)
    if ok == 0:
        return f"{name:<11} {conc:>2} {r['runs']:>5} {ok:>4}   (all runs failed)"
    mean = sum(lat) / ok
    extra = ""
    if r["durs"]:
        extra = f"   durationMs p50 {percentile(r['durs'], 50)}"
    own = f"{r['own']:>8.4f}" if r.get("own") is not None else f"{'-':>8}"
    exact = f"{r['exact']:>8.4f}" if r.get("exact") is not None else f"{'-':>8}"
    return (f"{name:<11} {conc:>2} {r['runs']:>5} {ok:>4} {percentile(lat, 50):>9.1f} {percentile(lat, 99):>9.1f} "
            f"{mean:>9.1f} {r['rps']:>7.2f} {r['cpu']:>8.3f} {own} {exact}{extra}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs1", type=int, default=int(os.environ.get("RUNS1", "30")), help="runs at concurrency 1")
    ap.add_argument("--runs4", type=int, default=int(os.environ.get("RUNS4", "40")), help="runs at concurrency 4")
    ap.add_argument("--runs16", type=int, default=int(os.environ.get("RUNS16", "48")), help="runs at concurrency 16")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("error: run as root (chroot, runsc and isoboxd need it)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(RUNSC_ROOT, exist_ok=True)
    rts = runtimes_to_bench()
    if not rts:
        sys.exit("error: no runtime root filesystem is built (make runtimes)")
    proc = None
    failures = 0
    leftover = []
    try:
        for mode in ("native", "bare runsc"):
            MODE_CG[mode] = BenchCgroup(f"isobox-bench-{mode.replace(' ', '-')}-{os.getpid()}")
        proc, _log = start_isoboxd()
        rss_start = rss_kib(proc.pid)
        for rt in rts:
            print(
                f"== /execute: {rt['language']} `{rt['code']}` (network false), isoboxd vs bare runsc vs native; "
                f"load average before: {loadavg()}"
            )
            # Warm the page cache and runsc's binary for every mode; not counted.
            for _, fn in MODES:
                for _ in range(2):
                    fn(rt)
            print(f"{'mode':<11} {'c':>2} {'runs':>5} {'ok':>4} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9} {'runs/s':>7} {'cpu s':>8} {'own s':>8} {'exact s':>8}")
            results = {}
            plan = [(c, n) for c, n in ((1, args.runs1), (4, args.runs4), (16, args.runs16)) if n > 0]
            for conc, runs in plan:
                for name, fn in MODES:
                    r = measure(fn, rt, runs, conc)
                    if proc.poll() is not None:
                        sys.exit(
                            f"error: isoboxd exited (status {proc.returncode}) during the benchmark; was it signalled from outside?"
                        )
                    results[(name, conc)] = r
                    print(fmt_row(name, conc, r), flush=True)
                    failures += len(r["errors"])
                    for e in r["errors"][:3]:
                        print(f"   failure: {e}")
            for conc, _ in plan:
                iso = results[("isoboxd", conc)]
                parts = []
                for ref in ("bare runsc", "native"):
                    r = results[(ref, conc)]
                    if iso["lat"] and r["lat"]:
                        parts.append(
                            f"isoboxd/{ref}: p50 {percentile(iso['lat'], 50) / percentile(r['lat'], 50):.2f}x "
                            f"p99 {percentile(iso['lat'], 99) / percentile(r['lat'], 99):.2f}x "
                            f"runs/s {iso['rps'] / r['rps']:.2f}x "
                            f"cpu/run {iso['cpu'] / r['cpu']:.2f}x"
                            + (f" exact cpu/run {iso['exact'] / r['exact']:.2f}x" if iso.get("exact") and r.get("exact") else "")
                        )
                print(f"ratios c={conc}: " + "; ".join(parts))
                if iso["durs"] and len(iso["durs"]) == len(iso["lat"]):
                    outside = [lat - dur for lat, dur in zip(iso["lat"], iso["durs"])]
                    print(
                        f"   isoboxd time outside run.durationMs (HTTP, bundle, cgroups, cleanup, waits) c={conc}: "
                        f"p50 {percentile(outside, 50):.0f} ms"
                    )
            print()
        print(f"isoboxd RSS: {rss_start} KiB after startup, {rss_kib(proc.pid)} KiB after the runs")
        print(
            f"`runsc delete --force` of a finished container (isoboxd runs one only when runsc left its state): p50 {time_runsc_delete():.1f} ms"
        )
    finally:
        stop_isoboxd(proc)
        leftover = delete_bare_containers()
        for cg in MODE_CG.values():
            cg.remove()
    if leftover:
        print(f"error: bare runsc containers left in {RUNSC_ROOT}: {leftover}", file=sys.stderr)
        return 1
    print(f"bare runsc containers left in {RUNSC_ROOT}: none")
    # What this run made and left empty goes too (isoboxd removed what it held in them).
    for d in (DATA_DIR, RUNSC_ROOT):
        subprocess.run(["find", d, "-depth", "-type", "d", "-empty", "-delete"], check=False)
    if failures:
        print(f"error: {failures} runs failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

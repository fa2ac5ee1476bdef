#!/usr/bin/env python3
"""WBX long-lived sandboxes: create, one command, idle memory, beside bare gVisor and
native execution in the same invocation; one table.

Reproduce (root, from the repository, after `cargo build --release --bins` and
`make deps runtimes`):

    python3 bench/load/wbx.py

What it measures (p50/p99 nearest-rank, ms; every request a new connection, timed from
connect to the last byte):

  create   isoboxd: POST /wbx/v1/sandboxes {"template":"base","timeout_s":600,
           "network":{"mode":"none"}}; the answer (201) comes once the sandbox's init
           has said hello, so the sandbox can run a command. Then DELETE (untimed, but
           it must answer 204).
           isoboxd pooled: the same create without "network" (full: the default the
           warm pool serves), answered from ISOBOX_WBX_WARM_POOL=base=1 ("warm": true
           checked); before each, the pool's refill is awaited (untimed).
           bare runsc: `runsc --root /tmp/bench-runsc --platform=$ISOBOX_PLATFORM --network=none
           --overlay2=root:memory run --detach --bundle B ID` of a bundle shaped like
           isoboxd's long-lived one (the `python` root filesystem, writable in memory,
           pid 1 = `/bin/sleep infinity` as root with isoboxd's six capabilities, tmpfs
           /tmp), timed until `run --detach` returns; then `runsc delete --force`
           (untimed). No cgroupsPath: the cgroup isoboxd creates and limits per sandbox,
           its bundle and its init's hello are part of what it adds.
  exec     isoboxd: POST /wbx/v1/sandboxes/{id}/exec {"cmd":"true"} in one sandbox;
           the answer must say exit_code 0. The init starts `/bin/sh -c true` as uid
           1000 in its own process group and reports its exit.
           bare runsc: `runsc exec --user 1000:1000 ID /bin/sh -c true` in one bare
           container (runsc's own way to start a process in a running sandbox).
           native: `chroot ROOTFS /bin/sh -c true` on the host.
           in-sandbox: one command whose shell starts `/bin/sh -c true` 200 times in a
           loop and times it with `date +%s%N` inside: what starting a process costs
           gVisor itself, the floor under every isoboxd exec.
  keystroke  a terminal's echo: isoboxd: `exec cat` started on a terminal (POST …/process
           with "pty"), its NDJSON stream open; one character sent with POST …/stdin
           (a kept-alive connection, as a web terminal would), timed until the stream
           carries its echo (gVisor's line discipline echoes it). native: `cat` on a
           host pty (pty.fork), one character written to the controller, timed until
           its echo is read back.
  files    --mib MiB of bytes into /tmp (tmpfs in both) and back out, 5 times each:
           isoboxd: PUT then GET …/files?path=/tmp/bench.bin (one connection each,
           the answer and every byte read); bare runsc: `runsc exec --user 1000:1000 ID
           sh -c 'cat > /tmp/bench.bin'` with the bytes on stdin, and `runsc exec ID cat
           /tmp/bench.bin` read to the end (runsc's own way to move a file in or out of
           a running sandbox). Reported as MB/s at the p50 time.
  memory   --idle sandboxes of each kind created and left idle for 2 s: the PSS
           (/proc/PID/smaps_rollup) summed over every host process of each kind's
           sandboxes (the runsc sandbox, gofer and their children, found by the runsc
           --root in their command line), per sandbox; and isoboxd's own RSS before and
           with them. For isoboxd also the mean of GET …/metrics' mem_used_mb (the
           sandbox's memory cgroup: its page cache and in-memory root included).

Scheduling: one isoboxd (ISOBOX_WARM_POOL=off, ISOBOX_WBX_WARM_POOL=base=1,
ISOBOX_EGRESS=off, ISOBOX_LOG=warn, its
own ISOBOX_INSTANCE isobox-bench-wbx, data dir and 127.0.0.1 port). create and exec
alternate the modes in blocks of 5 so drift hits all alike; 2 warm-up runs of each
mode first. The script exits 1 if any request or command failed, and fails if a bare
container, the daemon's cgroup slice or its runsc state is left behind.

Default: 30 creates and 150 commands per mode, 4 idle sandboxes: ~2 minutes on the
2-core host. Python 3.11 standard library only.
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNSC = os.environ.get("ISOBOX_RUNSC", "/usr/bin/runsc")
# The platform isoboxd uses (its default unless ISOBOX_PLATFORM says otherwise).
PLATFORM = os.environ.get("ISOBOX_PLATFORM", "ptrace")
RUNSC_ROOT = "/tmp/bench-runsc"
ROOTFS = os.path.join(os.environ.get("ISOBOX_ROOTFS_DIR", "/var/lib/isobox/rootfs"), "python")
PORT = int(os.environ.get("BENCH_PORT", "18099"))
INSTANCE = os.environ.get("BENCH_INSTANCE", "isobox-bench-wbx")
ISOBOXD = os.environ.get("ISOBOXD", os.path.join(ROOT, "target/release/isoboxd"))
CHROOT = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/chroot"
TIMEOUT_S = 60
CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"]


class Failure(Exception):
    pass


def percentile(xs, q):
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


# --- isoboxd ----------------------------------------------------------------------------


def request(method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=TIMEOUT_S)
    try:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def iso_create(pooled=False):
    """A create booted for the request (network none: never from the pool; the daemon
    runs without egress, so network full would get no link either), or, `pooled`, one
    taken from the warm pool (template base, network full), which must say so."""
    body = {"template": "base", "timeout_s": 600}
    if not pooled:
        body["network"] = {"mode": "none"}
    t0 = time.perf_counter()
    status, data = request("POST", "/wbx/v1/sandboxes", body)
    dt = time.perf_counter() - t0
    if status != 201:
        raise Failure(f"create: HTTP {status} {data[:300]!r}")
    sb = json.loads(data)
    if sb.get("state") != "running" or sb["info"]["warm"] != pooled:
        raise Failure(f"create (pooled={pooled}): {sb}")
    return dt, sb["id"]


def pool_ready():
    status, data = request("GET", "/healthz")
    if status != 200:
        raise Failure(f"healthz: HTTP {status}")
    return json.loads(data)["wbxWarmPool"]["templates"]["base"]["ready"]


def wait_pool():
    """Until the pool's sandbox is booted again (untimed: the refill is not the create's)."""
    deadline = time.monotonic() + 60
    while pool_ready() < 1:
        if time.monotonic() > deadline:
            raise Failure("the warm pool did not refill within 60 s")
        time.sleep(0.02)


def iso_delete(sid):
    status, data = request("DELETE", f"/wbx/v1/sandboxes/{sid}")
    if status != 204:
        raise Failure(f"delete {sid}: HTTP {status} {data[:300]!r}")


def iso_exec(sid):
    t0 = time.perf_counter()
    status, data = request("POST", f"/wbx/v1/sandboxes/{sid}/exec", {"cmd": "true"})
    dt = time.perf_counter() - t0
    if status != 200:
        raise Failure(f"exec: HTTP {status} {data[:300]!r}")
    v = json.loads(data)
    if v.get("exit_code") != 0 or v.get("timed_out"):
        raise Failure(f"exec: {v}")
    return dt


class IsoTerm:
    """`exec cat` on a terminal in sandbox `sid`, its NDJSON stream read raw."""

    def __init__(self, sid):
        status, data = request(
            "POST", f"/wbx/v1/sandboxes/{sid}/process", {"cmd": "exec cat", "pty": {"cols": 80, "rows": 24}}
        )
        if status != 200:
            raise Failure(f"process: HTTP {status} {data[:300]!r}")
        self.sid, self.pid = sid, json.loads(data)["pid"]
        self.sock = socket.create_connection(("127.0.0.1", PORT), timeout=TIMEOUT_S)
        self.sock.sendall(f"GET /wbx/v1/sandboxes/{sid}/process/{self.pid}/stream HTTP/1.1\r\nHost: b\r\n\r\n".encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 200"):
            raise Failure(f"stream: {head[:200]!r}")
        self.stdin = http.client.HTTPConnection("127.0.0.1", PORT, timeout=TIMEOUT_S)

    def key(self, ch):
        t0 = time.perf_counter()
        self.stdin.request(
            "POST",
            f"/wbx/v1/sandboxes/{self.sid}/process/{self.pid}/stdin",
            body=json.dumps({"data": ch}),
            headers={"Content-Type": "application/json"},
        )
        r = self.stdin.getresponse()
        r.read()
        if r.status != 204:
            raise Failure(f"stdin: HTTP {r.status}")
        want = json.dumps({"data": ch}, separators=(",", ":"))[1:-1].encode()
        while want not in self.buf:
            more = self.sock.recv(65536)
            if not more:
                raise Failure("the terminal's stream ended")
            self.buf += more
        dt = time.perf_counter() - t0
        self.buf = self.buf.split(want, 1)[1]
        return dt

    def close(self):
        self.stdin.close()
        self.sock.close()


class NativeTerm:
    """`cat` on a host pty."""

    def __init__(self):
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvp("cat", ["cat"])

    def key(self, ch):
        t0 = time.perf_counter()
        os.write(self.fd, ch.encode())
        got = b""
        while ch.encode() not in got:
            got += os.read(self.fd, 4096)
        return time.perf_counter() - t0

    def close(self):
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.fd)


def iso_upload(sid, data):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=TIMEOUT_S)
    try:
        t0 = time.perf_counter()
        conn.request("PUT", f"/wbx/v1/sandboxes/{sid}/files?path=/tmp/bench.bin", body=data)
        r = conn.getresponse()
        body = r.read()
        dt = time.perf_counter() - t0
    finally:
        conn.close()
    if r.status != 200 or json.loads(body)["size"] != len(data):
        raise Failure(f"upload: HTTP {r.status} {body[:300]!r}")
    return dt


def iso_download(sid, n):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=TIMEOUT_S)
    try:
        t0 = time.perf_counter()
        conn.request("GET", f"/wbx/v1/sandboxes/{sid}/files?path=/tmp/bench.bin")
        r = conn.getresponse()
        got = len(r.read())
        dt = time.perf_counter() - t0
    finally:
        conn.close()
    if r.status != 200 or got != n:
        raise Failure(f"download: HTTP {r.status}, {got} of {n} bytes")
    return dt


def bare_upload(cid, data):
    t0 = time.perf_counter()
    p = subprocess.run(
        runsc_base() + ["exec", "--user", "1000:1000", cid, "/bin/sh", "-c", "cat > /tmp/bench.bin"],
        input=data,
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise Failure(f"runsc exec cat >: exit {p.returncode} {p.stderr[-300:]!r}")
    return dt


def bare_download(cid, n):
    t0 = time.perf_counter()
    p = subprocess.run(
        runsc_base() + ["exec", "--user", "1000:1000", cid, "/bin/cat", "/tmp/bench.bin"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    dt = time.perf_counter() - t0
    if p.returncode != 0 or len(p.stdout) != n:
        raise Failure(f"runsc exec cat: exit {p.returncode}, {len(p.stdout)} of {n} bytes")
    return dt


def start_isoboxd(data_dir):
    if not os.access(ISOBOXD, os.X_OK):
        sys.exit(f"error: {ISOBOXD} missing: run cargo build --release --bins")
    with socket.socket() as s:
        s.settimeout(0.5)
        if s.connect_ex(("127.0.0.1", PORT)) == 0:
            sys.exit(f"error: 127.0.0.1:{PORT} is already in use")
    env = dict(os.environ)
    env.update(
        ISOBOX_DATA_DIR=data_dir,
        ISOBOX_INSTANCE=INSTANCE,
        ISOBOX_LISTEN=f"127.0.0.1:{PORT}",
        ISOBOX_LOG="warn",
        ISOBOX_WARM_POOL="off",
        ISOBOX_WBX_WARM_POOL="base=1",
        ISOBOX_EGRESS="off",
        ISOBOX_SHUTDOWN_GRACE_MS="2000",
    )
    log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the daemon
    proc = subprocess.Popen([ISOBOXD], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            sys.exit(f"error: isoboxd exited during startup:\n{log.read().decode(errors='replace')}")
        try:
            if request("GET", "/readyz")[0] == 200:
                return proc, log
        except OSError:
            pass
        time.sleep(0.1)
    stop_isoboxd(proc)
    sys.exit("error: isoboxd not ready after 60 s")


def stop_isoboxd(proc):
    """Stops the daemon; the names it left behind (empty when none)."""
    if proc is None:
        return []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            print("warning: isoboxd ignored SIGTERM for 20 s; sending SIGKILL", file=sys.stderr)
            proc.kill()
            proc.wait()
    left = []
    for _ in range(20):
        left = [f"/sys/fs/cgroup/{d}/{INSTANCE}" for d in os.listdir("/sys/fs/cgroup") if os.path.isdir(f"/sys/fs/cgroup/{d}/{INSTANCE}")]
        state = f"/run/isobox/{INSTANCE}"
        if os.path.isdir(state) and os.listdir(state):
            left.append(state)
        if not left:
            break
        time.sleep(0.1)
    return left


# --- bare runsc and native --------------------------------------------------------------


def runsc_base():
    return [RUNSC, "--root", RUNSC_ROOT, f"--platform={PLATFORM}", "--network=none"]


def bundle_config():
    return {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/bin/sleep", "infinity"],
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/tmp"],
            "cwd": "/",
            "capabilities": {"bounding": CAPS, "effective": CAPS, "inheritable": [], "permitted": CAPS, "ambient": []},
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536},
                {"type": "RLIMIT_NPROC", "hard": 128, "soft": 128},
                {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
            ],
            "noNewPrivileges": True,
        },
        "root": {"path": ROOTFS, "readonly": False},
        "hostname": "isobox",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", f"size={512 << 20}"]},
        ],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
    }


class Bare:
    def __init__(self):
        self.bundle = tempfile.mkdtemp(prefix="isobox-bench-wbx-bundle-")
        with open(os.path.join(self.bundle, "config.json"), "w") as f:
            json.dump(bundle_config(), f)

    def create(self):
        cid = "isobox-benchref-" + uuid.uuid4().hex[:12]
        # Not pipes: the detached sandbox keeps its stdio, and a pipe would never end.
        with tempfile.TemporaryFile() as err:
            t0 = time.perf_counter()
            p = subprocess.run(
                runsc_base() + ["--overlay2=root:memory", "run", "--detach", "--bundle", self.bundle, cid],
                check=False,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                timeout=TIMEOUT_S,
            )
            dt = time.perf_counter() - t0
            if p.returncode != 0:
                err.seek(0)
                raise Failure(f"runsc run --detach: exit {p.returncode} {err.read()[-300:]!r}")
        return dt, cid

    @staticmethod
    def delete(cid):
        subprocess.run(runsc_base() + ["delete", "--force", cid], check=False, capture_output=True, timeout=TIMEOUT_S)

    @staticmethod
    def exec(cid):
        t0 = time.perf_counter()
        p = subprocess.run(
            runsc_base() + ["exec", "--user", "1000:1000", cid, "/bin/sh", "-c", "true"],
            check=False,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT_S,
        )
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            raise Failure(f"runsc exec: exit {p.returncode} {p.stderr[-300:]!r}")
        return dt

    def close(self):
        shutil.rmtree(self.bundle, ignore_errors=True)


def in_sandbox_spawn(sid, n=200):
    """gVisor's own cost of starting a process: the sandbox's shell starts `/bin/sh -c
    true` n times in a loop, timed inside; ms per start."""
    loop = f"a=$(date +%s%N); for i in $(seq {n}); do /bin/sh -c true; done; b=$(date +%s%N); echo $((b - a))"
    status, data = request("POST", f"/wbx/v1/sandboxes/{sid}/exec", {"cmd": loop})
    v = json.loads(data)
    if status != 200 or v.get("exit_code") != 0:
        raise Failure(f"in-sandbox loop: HTTP {status} {data[:300]!r}")
    return int(v["stdout"]) / n / 1e6


def native_exec():
    t0 = time.perf_counter()
    p = subprocess.run([CHROOT, ROOTFS, "/bin/sh", "-c", "true"], check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT_S)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise Failure(f"native: exit {p.returncode} {p.stderr[-300:]!r}")
    return dt


def runsc_list():
    p = subprocess.run(runsc_base() + ["list", "-quiet"], check=False, capture_output=True, text=True, timeout=30)
    return [line for line in p.stdout.split() if line]


# --- memory -----------------------------------------------------------------------------


def pss_of_root(runsc_root):
    """Summed PSS (KiB) of every process whose command line names runsc_root."""
    total, n = 0, 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if runsc_root.encode() not in argv and f"--root={runsc_root}".encode() not in argv:
                continue
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        n += 1
                        break
        except OSError:
            continue
    return total, n


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# --- main -------------------------------------------------------------------------------


def blocks(modes, runs, block=5):
    """Runs each mode's fn `runs` times, alternating modes in blocks; {name: [ms]}."""
    out = {name: [] for name, _ in modes}
    done = 0
    while done < runs:
        n = min(block, runs - done)
        for name, fn in modes:
            for _ in range(n):
                out[name].append(fn() * 1000)
        done += n
    return out


def row(metric, name, xs):
    return f"| {metric} | {name} | {len(xs)} | {percentile(xs, 50):.1f} | {percentile(xs, 99):.1f} | {sum(xs) / len(xs):.1f} |"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--creates", type=int, default=30)
    ap.add_argument("--execs", type=int, default=150)
    ap.add_argument("--block", type=int, default=5, help="runs of one mode before the next mode's")
    ap.add_argument("--idle", type=int, default=4, help="idle sandboxes of each kind for the memory figures (at most 8)")
    ap.add_argument("--keys", type=int, default=200, help="keystrokes per terminal")
    ap.add_argument("--mib", type=int, default=32, help="MiB per file transfer")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("error: run as root (chroot, runsc and isoboxd need it)")
    if not os.path.isdir(ROOTFS):
        sys.exit(f"error: {ROOTFS} is not built (make runtimes)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(RUNSC_ROOT, exist_ok=True)
    data_dir = tempfile.mkdtemp(prefix="isobox-bench-wbx-data-")
    bare = Bare()
    proc = None
    failures = []
    left = []
    try:
        proc, _log = start_isoboxd(data_dir)
        rss0 = rss_kib(proc.pid)

        def iso_cycle():
            dt, sid = iso_create()
            iso_delete(sid)
            return dt

        def pooled_cycle():
            wait_pool()
            dt, sid = iso_create(pooled=True)
            iso_delete(sid)
            return dt

        def bare_cycle():
            dt, cid = bare.create()
            bare.delete(cid)
            return dt

        for fn in (iso_cycle, pooled_cycle, bare_cycle, iso_cycle, pooled_cycle, bare_cycle):
            fn()
        print("create ...", file=sys.stderr, flush=True)
        creates = blocks(
            [("isoboxd", iso_cycle), ("isoboxd pooled", pooled_cycle), ("bare runsc", bare_cycle)],
            args.creates,
            args.block,
        )

        _, sid = iso_create()
        _, cid = bare.create()
        try:
            for fn in (lambda: iso_exec(sid), lambda: bare.exec(cid), native_exec):
                fn()
                fn()
            print("exec ...", file=sys.stderr, flush=True)
            execs = blocks(
                [("isoboxd", lambda: iso_exec(sid)), ("bare runsc", lambda: bare.exec(cid)), ("native", native_exec)],
                args.execs,
                args.block,
            )
            inside = in_sandbox_spawn(sid)

            print("keystrokes ...", file=sys.stderr, flush=True)
            iso_term, native_term = IsoTerm(sid), NativeTerm()
            try:
                letters = "abcdefghijklmnopqrstuvwxyz"
                for i in range(10):
                    iso_term.key(letters[i % 26])
                    native_term.key(letters[i % 26])
                count = [0]

                def stroke(term):
                    count[0] += 1
                    return term.key(letters[count[0] % 26])

                keys = blocks(
                    [("isoboxd", lambda: stroke(iso_term)), ("native pty", lambda: stroke(native_term))],
                    args.keys,
                    args.block,
                )
            finally:
                iso_term.close()
                native_term.close()

            print("files ...", file=sys.stderr, flush=True)
            payload = os.urandom(args.mib << 20)
            files = blocks(
                [
                    ("isoboxd upload", lambda: iso_upload(sid, payload)),
                    ("bare runsc upload", lambda: bare_upload(cid, payload)),
                ],
                5,
                1,
            )
            files.update(
                blocks(
                    [
                        ("isoboxd download", lambda: iso_download(sid, len(payload))),
                        ("bare runsc download", lambda: bare_download(cid, len(payload))),
                    ],
                    5,
                    1,
                )
            )
        finally:
            iso_delete(sid)
            bare.delete(cid)

        print("memory ...", file=sys.stderr, flush=True)
        n = max(1, min(args.idle, 8))
        isos = [iso_create()[1] for _ in range(n)]
        bares = [bare.create()[1] for _ in range(n)]
        time.sleep(2)
        # The pool's waiting sandbox is one of the instance's too.
        pooled_idle = pool_ready()
        iso_pss, iso_procs = pss_of_root(f"/run/isobox/{INSTANCE}/runsc")
        bare_pss, bare_procs = pss_of_root(RUNSC_ROOT)
        mets = []
        for s in isos:
            status, data = request("GET", f"/wbx/v1/sandboxes/{s}/metrics")
            if status != 200:
                raise Failure(f"metrics: HTTP {status} {data[:300]!r}")
            mets.append(json.loads(data)["mem_used_mb"])
        rss_with = rss_kib(proc.pid)
        for s in isos:
            iso_delete(s)
        for c in bares:
            bare.delete(c)
    except Failure as e:
        failures.append(str(e))
    finally:
        left = stop_isoboxd(proc)
        for c in runsc_list():
            bare.delete(c)
        bare_left = runsc_list()
        bare.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    if failures:
        for f in failures:
            print(f"error: {f}", file=sys.stderr)
        return 1
    if left or bare_left:
        print(f"error: left behind: {left} {bare_left}", file=sys.stderr)
        return 1

    print(f"host: {os.cpu_count()} CPUs, load average {open('/proc/loadavg').read().split()[:3]}, runsc {RUNSC} --platform={PLATFORM}")
    print()
    print("| metric | mode | n | p50 ms | p99 ms | mean ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, xs in creates.items():
        print(row("create (ready to run)", name, xs))
    for name, xs in execs.items():
        print(row("exec `true`", name, xs))
    for name, xs in keys.items():
        print(row("keystroke to echo", name, xs))
    for name, xs in files.items():
        print(row(f"file {args.mib} MiB", name, xs))
    print()
    c = {k: percentile(v, 50) for k, v in creates.items()}
    e = {k: percentile(v, 50) for k, v in execs.items()}
    print(
        f"create p50 isoboxd/bare runsc: {c['isoboxd'] / c['bare runsc']:.2f}x; "
        f"pooled/bare runsc: {c['isoboxd pooled'] / c['bare runsc']:.3f}x ({c['isoboxd pooled']:.1f} ms)"
    )
    print(f"exec p50 isoboxd/bare runsc: {e['isoboxd'] / e['bare runsc']:.2f}x; isoboxd/native: {e['isoboxd'] / e['native']:.2f}x")
    print(
        f"gVisor's own start of `/bin/sh -c true` inside the sandbox (its shell, in a loop): {inside:.1f} ms; "
        f"isoboxd's exec p50 minus that: {e['isoboxd'] - inside:.1f} ms"
    )
    k = {k: percentile(v, 50) for k, v in keys.items()}
    print(f"keystroke p50 isoboxd/native pty: {k['isoboxd'] / k['native pty']:.1f}x ({k['isoboxd']:.2f} ms against {k['native pty']:.3f} ms)")
    f = {k: args.mib * 1.048576 / (percentile(v, 50) / 1000) for k, v in files.items()}
    print(
        f"files at p50, MB/s: upload isoboxd {f['isoboxd upload']:.0f}, bare runsc exec {f['bare runsc upload']:.0f} "
        f"({f['isoboxd upload'] / f['bare runsc upload']:.2f}x); download isoboxd {f['isoboxd download']:.0f}, "
        f"bare runsc exec {f['bare runsc download']:.0f} ({f['isoboxd download'] / f['bare runsc download']:.2f}x)"
    )
    print()
    print(f"idle memory, {n} sandboxes of each kind (isoboxd: and {pooled_idle} waiting in its pool):")
    print(
        f"  isoboxd sandboxes: PSS {iso_pss / (n + pooled_idle) / 1024:.1f} MiB per sandbox ({iso_procs} host processes); "
        f"metrics mem_used_mb mean {sum(mets) / n:.1f}"
    )
    print(f"  bare runsc:        PSS {bare_pss / n / 1024:.1f} MiB per sandbox ({bare_procs} host processes)")
    print(f"  isoboxd RSS: {rss0} KiB idle, {rss_with} KiB with {n} sandboxes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

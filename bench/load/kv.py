#!/usr/bin/env python3
"""Memory KV over HTTP: GET and PUT /v1/memory/{namespace}/{key}, side by side with Redis.

For each value size (100 B and 4 KiB), over a key space of 1000 keys (pre-populated and
checked before anything is timed), in ROUNDS alternating rounds:

  isoboxd               wrk -t1 -c16 -dDURATION, keep-alive, a Lua script that sends
                        PUT (204) or GET (200) of a random key and checks every response:
                        the status, and for GET that the body is byte for byte the value
                        of the key it names (values are "kNNNN:" + a per-key fill byte)
  redis (no fsync)      redis-benchmark -c 16 -P 1 -n REDIS_N -r 1000 -d SIZE -t set,get,
                        private redis-server --save '' --appendonly no
  redis (fsync always)  the same against a second private redis-server with
                        --save '' --appendonly yes --appendfsync always

Every isoboxd PUT is one LMDB write transaction, committed with fsync before the 204; the
second Redis is the durability-matched reference for PUT (it fsyncs its AOF before it
replies, once per event-loop pass, so concurrent SETs share an fsync).

Servers run under `taskset -c SERVER_CPU` (default 0), wrk and redis-benchmark under
`taskset -c WRK_CPU` (default 1): one core each side, as in http.sh. Reports the median of
the rounds for req/s, p50 and p99 (per metric), the server's CPU time per request
(utime + stime of all its threads over the run, from /proc/PID/stat; for Redis split
between SET and GET by their wall times), the load generator's CPU use (% of one core;
for redis-benchmark over SET and GET together: 100 % means the client, not the server,
was the limit), and the ratios
isoboxd / redis. Both Redis key spaces (key:000000000000 .. key:000000000999, the keys
redis-benchmark -r 1000 uses) are SET in full before the runs; after each run they must
still hold exactly 1000 keys of SIZE bytes. After the runs every isoboxd key is read back
once more and checked.

isoboxd is started by the script (ISOBOX_LISTEN=127.0.0.1:0, data dir
/tmp/isobox-bench-kv-PID, instance isobox-bench-kv, rate limit lifted), its address read
from its `listening on http://ADDR` line; it is stopped with SIGTERM and the data dir
removed at the end. Both redis-servers listen on free loopback ports, keep their files in
a temporary directory next to it (same filesystem) and are stopped with SIGTERM.
Missing tools (redis-server, redis-tools, wrk) are installed with apt-get; a temporary
/usr/sbin/policy-rc.d keeps the redis-server package from starting its system service.

Usage (root): python3 bench/load/kv.py
Settings (environment): DURATION (s per wrk run, 5), ROUNDS (3), KV_SIZES ("100,4096"),
KV_KEYS (1000), KV_CONNS (16), REDIS_N (requests per redis-benchmark test, 100000),
REDIS_FSYNC_N (the same for the appendfsync-always server, 20000), SERVER_CPU (0),
WRK_CPU (1), ISOBOXD (binary).
Python 3.11 standard library only.
"""

import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ISOBOXD = os.environ.get("ISOBOXD", os.path.join(ROOT, "target/release/isoboxd"))
INSTANCE = "isobox-bench-kv"
DURATION = int(os.environ.get("DURATION", "5"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SIZES = [int(s) for s in os.environ.get("KV_SIZES", "100,4096").split(",")]
KEYS = int(os.environ.get("KV_KEYS", "1000"))
CONNS = int(os.environ.get("KV_CONNS", "16"))
REDIS_N = int(os.environ.get("REDIS_N", "100000"))
REDIS_FSYNC_N = int(os.environ.get("REDIS_FSYNC_N", "20000"))
SERVER_CPU = os.environ.get("SERVER_CPU", "0")
WRK_CPU = os.environ.get("WRK_CPU", "1")
CLK_TCK = os.sysconf("SC_CLK_TCK")

# wrk script. Arguments after `--`: METHOD NAMESPACE SIZE KEYS SEED. One request string
# per key is built up front; request() picks a random one. response() checks each reply;
# done() prints one machine-readable `KV ...` line for this script to parse.
WRK_LUA = r"""
local method, ns, size, nkeys
local reqs, want = {}, {}
bad = 0
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end

function init(args)
  method, ns, size, nkeys = args[1], args[2], tonumber(args[3]), tonumber(args[4])
  math.randomseed(tonumber(args[5]) * 1000 + id)
  for i = 0, nkeys - 1 do
    local key = string.format("k%04d", i)
    local value = key .. ":" .. string.rep(string.char(97 + i % 26), size - 6)
    want[key] = value
    local path = "/v1/memory/" .. ns .. "/" .. key
    if method == "PUT" then
      reqs[i + 1] = wrk.format("PUT", path, {["Content-Type"] = "application/octet-stream"}, value)
    else
      reqs[i + 1] = wrk.format("GET", path, {})
    end
  end
end

function request()
  return reqs[math.random(nkeys)]
end

function response(status, headers, body)
  if method == "PUT" then
    if status ~= 204 then bad = bad + 1 end
  elseif status ~= 200 or body ~= want[string.sub(body, 1, 5)] then
    bad = bad + 1
  end
end

function done(summary, latency, requests)
  local b = 0
  for _, t in ipairs(threads) do b = b + t:get("bad") end
  local e = summary.errors
  io.write(string.format("KV %d %d %.1f %.1f %d %d %d %d %d %d\n", summary.requests,
    summary.duration, latency:percentile(50), latency:percentile(99), e.connect, e.read,
    e.write, e.status, e.timeout, b))
end
"""


class Failure(Exception):
    pass


def value(i, size):
    """The value of key i: its name, ':', then a per-key fill byte (same as the Lua)."""
    return f"k{i:04d}:".encode() + bytes([97 + i % 26]) * (size - 6)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_seconds(pid):
    """utime + stime of all threads of pid."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- tools ------------------------------------------------------------------------------


def ensure_tools():
    need = []
    for cmd, pkg in (("redis-server", "redis-server"), ("redis-benchmark", "redis-tools"),
                     ("redis-cli", "redis-tools"), ("wrk", "wrk")):
        if shutil.which(cmd) is None and pkg not in need:
            need.append(pkg)
    if shutil.which("taskset") is None:
        sys.exit("error: taskset not found (util-linux)")
    if not need:
        return
    print(f"kv: installing {' '.join(need)}")
    # Keep the redis-server package from starting its system service on :6379.
    policy = None
    if not os.path.exists("/usr/sbin/policy-rc.d"):
        policy = "/usr/sbin/policy-rc.d"
        with open(policy, "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(policy, 0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *need]
        if subprocess.run(cmd, env=env, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, check=True)
            subprocess.run(cmd, env=env, check=True)
    finally:
        if policy:
            os.unlink(policy)


# --- servers ----------------------------------------------------------------------------


def start_isoboxd(data_dir):
    if not os.access(ISOBOXD, os.X_OK):
        sys.exit(f"error: {ISOBOXD} missing: run cargo build --release")
    env = dict(os.environ)
    env.update(
        ISOBOX_LISTEN="127.0.0.1:0",
        ISOBOX_DATA_DIR=data_dir,
        ISOBOX_INSTANCE=INSTANCE,
        ISOBOX_RATE_PER_MIN="1000000",
        ISOBOX_RATE_BURST="100000",
        ISOBOX_SHUTDOWN_GRACE_MS="2000",
        # Nothing but the KV path on the server's core: no sandboxes booted ahead and
        # no WebAssembly workers (they would share SERVER_CPU, as Redis shares nothing).
        ISOBOX_WARM_POOL=os.environ.get("ISOBOX_WARM_POOL", "off"),
        ISOBOX_WBX_WARM_POOL=os.environ.get("ISOBOX_WBX_WARM_POOL", "off"),
        ISOBOX_WASM_WORKER=os.environ.get("ISOBOX_WASM_WORKER", "off"),
    )
    env.pop("ISOBOX_LOG", None)  # the ready line is logged at info (no per-request logs)
    log = tempfile.NamedTemporaryFile(prefix="isobox-bench-kv-", suffix=".log")  # noqa: SIM115
    proc = subprocess.Popen(["taskset", "-c", SERVER_CPU, ISOBOXD], env=env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(log.name, "rb") as f:
            m = re.search(rb"listening on http://([0-9.]+):([0-9]+)", f.read())
        if m:
            return proc, log, m.group(1).decode(), int(m.group(2))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop(proc, "isoboxd")
    with open(log.name, "rb") as f:
        sys.exit(f"error: isoboxd did not start:\n{f.read().decode(errors='replace')[-3000:]}")


def start_redis(d, fsync):
    os.makedirs(d)
    port = free_port()
    args = ["taskset", "-c", SERVER_CPU, "redis-server", "--port", str(port), "--bind", "127.0.0.1",
            "--dir", d, "--logfile", os.path.join(d, "redis.log"), "--daemonize", "no", "--save", ""]
    args += ["--appendonly", "yes", "--appendfsync", "always"] if fsync else ["--appendonly", "no"]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        r = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, check=False)
        if r.stdout.strip() == "PONG":
            return proc, port
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop(proc, "redis-server")
    with open(os.path.join(d, "redis.log"), errors="replace") as f:
        sys.exit(f"error: redis-server did not start:\n{f.read()[-2000:]}")


def stop(proc, name):
    """SIGTERM, 20 s, SIGKILL. Returns a problem string or None."""
    if proc is None or proc.poll() is not None:
        return None
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return f"{name} ignored SIGTERM for 20 s; sent SIGKILL"
    return None


# --- isoboxd: populate / verify (Python, one keep-alive connection) and wrk runs --------


def populate(host, port, ns, size, check_only=False):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        for i in range(KEYS):
            path = f"/v1/memory/{ns}/k{i:04d}"
            if not check_only:
                conn.request("PUT", path, body=value(i, size), headers={"Content-Type": "application/octet-stream"})
                r = conn.getresponse()
                data = r.read()
                if r.status != 204:
                    raise Failure(f"PUT {path}: HTTP {r.status} {data[:300]!r}")
            conn.request("GET", path)
            r = conn.getresponse()
            data = r.read()
            if r.status != 200 or data != value(i, size):
                raise Failure(f"GET {path}: HTTP {r.status}, {len(data)} bytes, not the value written")
    finally:
        conn.close()


def wrk_run(lua, url, method, ns, size, seconds, pid, seed):
    cpu0, ccpu0 = cpu_seconds(pid), children_cpu()
    cmd = ["taskset", "-c", WRK_CPU, "wrk", "-t1", f"-c{CONNS}", f"-d{seconds}s", "--timeout", "5s",
           "-s", lua, url, "--", method, ns, str(size), str(KEYS), str(seed)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=False)
    cpu, ccpu = cpu_seconds(pid) - cpu0, children_cpu() - ccpu0
    m = re.search(r"^KV (.*)$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        raise Failure(f"wrk failed ({p.returncode}): {p.stdout[-1000:]} {p.stderr[-1000:]}")
    n, dur_us, p50, p99, e_conn, e_read, e_write, e_status, e_timeout, bad = m.group(1).split()
    errors = int(e_conn) + int(e_read) + int(e_write) + int(e_timeout)
    if errors or int(bad) or int(e_status):
        raise Failure(f"isoboxd {method} {size} B: {bad} wrong responses, {e_status} non-2xx, "
                      f"socket errors connect/read/write/timeout {e_conn}/{e_read}/{e_write}/{e_timeout}")
    n = int(n)
    return {"rps": n / (int(dur_us) / 1e6), "p50": float(p50) / 1000, "p99": float(p99) / 1000,
            "cpu_us": cpu / n * 1e6, "client": ccpu / (int(dur_us) / 1e6) * 100, "n": n}


def store_figures(host, port):
    """The store writer's counters from /healthz (commits, writes, largestBatch)."""
    c = http.client.HTTPConnection(host, port, timeout=10)
    try:
        c.request("GET", "/healthz")
        return json.loads(c.getresponse().read())["store"]
    finally:
        c.close()


def redis_run(port, size, n, pid):
    cpu0, ccpu0, t0 = cpu_seconds(pid), children_cpu(), time.monotonic()
    cmd = ["taskset", "-c", WRK_CPU, "redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(CONNS),
           "-P", "1", "-n", str(n), "-r", str(KEYS), "-d", str(size), "-t", "set,get", "--csv"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    cpu, ccpu, wall = cpu_seconds(pid) - cpu0, children_cpu() - ccpu0, time.monotonic() - t0
    out = {}
    for line in p.stdout.splitlines():
        f = [x.strip('"') for x in line.split(",")]
        if f[0] in ("SET", "GET"):
            out["PUT" if f[0] == "SET" else "GET"] = {"rps": float(f[1]), "p50": float(f[4]), "p99": float(f[6]), "n": n}
    if p.returncode != 0 or len(out) != 2:
        raise Failure(f"redis-benchmark failed ({p.returncode}): {p.stdout[-1000:]} {p.stderr[-1000:]}")
    # One process serves both tests; split its CPU time by the tests' wall times.
    t_set, t_get = n / out["PUT"]["rps"], n / out["GET"]["rps"]
    for op, t in (("PUT", t_set), ("GET", t_get)):
        out[op]["cpu_us"] = cpu * t / (t_set + t_get) / n * 1e6
        out[op]["client"] = ccpu / wall * 100  # both tests together
    return out


def resp(*args):
    """One command in the Redis protocol."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def redis_pipeline(port, cmds):
    """Sends the commands in one pipeline; returns the replies (+simple or :integer lines)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"".join(cmds))
        buf, replies = b"", []
        while len(replies) < len(cmds):
            data = s.recv(1 << 16)
            if not data:
                raise Failure(f"redis :{port} closed the connection")
            buf += data
            *lines, buf = buf.split(b"\r\n")
            replies += lines
        return [r.decode() for r in replies]


def redis_key(i):
    return f"key:{i:012d}"  # redis-benchmark -r: __rand_int__ as 12 digits


def redis_populate(port, size, check_only=False):
    """SETs every key redis-benchmark -r KEYS can touch (unless check_only), then checks
    that there are exactly KEYS keys, each SIZE bytes long."""
    if not check_only:
        r = redis_pipeline(port, [resp("SET", redis_key(i), b"x" * size) for i in range(KEYS)])
        if r != ["+OK"] * KEYS:
            raise Failure(f"redis :{port}: SET replies {sorted(set(r))[:5]}")
    r = redis_pipeline(port, [resp("DBSIZE")] + [resp("STRLEN", redis_key(i)) for i in range(KEYS)])
    if r[0] != f":{KEYS}" or r[1:] != [f":{size}"] * KEYS:
        raise Failure(f"redis :{port}: DBSIZE {r[0]} (want :{KEYS}), value lengths {sorted(set(r[1:]))[:5]} (want :{size})")


# --- main -------------------------------------------------------------------------------

SERVERS = ("isoboxd", "redis", "redis-fsync")
LABEL = {"isoboxd": "isoboxd", "redis": "redis (no fsync)", "redis-fsync": "redis (fsync always)"}


def main():
    if min(SIZES) < 6 or KEYS > 10000:
        sys.exit("error: KV_SIZES must be >= 6 bytes (the value starts with its key) and KV_KEYS <= 10000")
    if os.geteuid() != 0:
        sys.exit("error: run as root (isoboxd needs cgroups; missing tools are installed with apt-get)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ensure_tools()
    data_dir = f"/tmp/isobox-bench-kv-{os.getpid()}"
    redis_dir = tempfile.mkdtemp(prefix="isobox-bench-kv-redis-", dir="/tmp")
    iso = red = redf = lua = None
    problems, failed = [], False
    try:
        with tempfile.NamedTemporaryFile("w", prefix="isobox-bench-kv-", suffix=".lua", delete=False) as f:
            f.write(WRK_LUA)
            lua = f.name
        iso, _log, host, port = start_isoboxd(data_dir)
        red, red_port = start_redis(os.path.join(redis_dir, "plain"), fsync=False)
        redf, redf_port = start_redis(os.path.join(redis_dir, "fsync"), fsync=True)
        url = f"http://{host}:{port}"
        rv = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout.split()
        print(f"== Memory KV: isoboxd {url} vs {' '.join(rv[:3])} (:{red_port} no fsync, :{redf_port} "
              f"appendfsync always); {KEYS} keys, {CONNS} keep-alive connections, servers on CPU {SERVER_CPU}, "
              f"clients on CPU {WRK_CPU}; wrk {DURATION} s per run, redis-benchmark -n {REDIS_N} / {REDIS_FSYNC_N} "
              f"(fsync); {ROUNDS} rounds")
        print(f"   load average before: {loadavg()}")
        results = {}
        for size in SIZES:
            ns = f"bench{size}"
            # Populate and check every key, then warm up (not counted).
            populate(host, port, ns, size)
            redis_populate(red_port, size)
            redis_populate(redf_port, size)
            wrk_run(lua, url, "PUT", ns, size, 1, iso.pid, 0)
            wrk_run(lua, url, "GET", ns, size, 1, iso.pid, 0)
            redis_run(red_port, size, min(REDIS_N, 20000), red.pid)
            redis_run(redf_port, size, min(REDIS_FSYNC_N, 5000), redf.pid)
            print(f"-- {size} B values")
            print(f"{'op':<4} {'server':<21} {'round':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>10} {'client %':>8}")
            for r in range(1, ROUNDS + 1):
                rows = {}
                before = store_figures(host, port)
                rows[("isoboxd", "PUT")] = wrk_run(lua, url, "PUT", ns, size, DURATION, iso.pid, r)
                after = store_figures(host, port)
                commits = after["commits"] - before["commits"]
                batch = (after["writes"] - before["writes"]) / max(commits, 1)
                rows[("isoboxd", "GET")] = wrk_run(lua, url, "GET", ns, size, DURATION, iso.pid, r)
                for name, p, pid, n in (("redis", red_port, red.pid, REDIS_N), ("redis-fsync", redf_port, redf.pid, REDIS_FSYNC_N)):
                    for op, v in redis_run(p, size, n, pid).items():
                        rows[(name, op)] = v
                    redis_populate(p, size, check_only=True)
                for (name, op), v in sorted(rows.items(), key=lambda kv: (kv[0][1] != "PUT", SERVERS.index(kv[0][0]))):
                    results.setdefault((size, op, name), []).append(v)
                    print(f"{op:<4} {LABEL[name]:<21} {r:>5} {v['rps']:>9.0f} {v['p50']:>8.3f} {v['p99']:>8.3f} {v['cpu_us']:>10.1f} {v['client']:>8.0f}")
                print(f"     isoboxd PUT: {batch:.1f} writes per commit ({commits} commits; the largest so far {after['largestBatch']})")
                if iso.poll() is not None:
                    raise Failure(f"isoboxd exited (status {iso.returncode}) during the benchmark")
            populate(host, port, ns, size, check_only=True)
        print()
        print(f"== Memory KV summary (median of {ROUNDS} rounds per metric); load average after: {loadavg()}")
        print(f"{'size':>5} {'op':<4} {'server':<21} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>10} {'client %':>8}")
        med = {}
        for size in SIZES:
            for op in ("GET", "PUT"):
                for name in SERVERS:
                    vs = results[(size, op, name)]
                    m = {k: statistics.median(v[k] for v in vs) for k in ("rps", "p50", "p99", "cpu_us", "client")}
                    med[(size, op, name)] = m
                    print(f"{size:>5} {op:<4} {LABEL[name]:<21} {m['rps']:>9.0f} {m['p50']:>8.3f} {m['p99']:>8.3f} {m['cpu_us']:>10.1f} {m['client']:>8.0f}")
        print("ratios isoboxd / redis (req/s, p50, p99):")
        for size in SIZES:
            for op in ("GET", "PUT"):
                a = med[(size, op, "isoboxd")]
                parts = []
                for name in ("redis", "redis-fsync"):
                    b = med[(size, op, name)]
                    parts.append(f"vs {LABEL[name]}: {a['rps'] / b['rps']:.2f} / {a['p50'] / b['p50']:.2f} / {a['p99'] / b['p99']:.2f}")
                print(f"  {size:>5} B {op}: " + "; ".join(parts))
        print("all responses checked (status; GET bodies byte for byte); every key read back after the runs")
    except Failure as e:
        print(f"error: {e}", file=sys.stderr)
        failed = True
    finally:
        for proc, name in ((iso, "isoboxd"), (red, "redis-server"), (redf, "redis-server (fsync)")):
            p = stop(proc, name)
            if p:
                problems.append(p)
        left = [d for d in os.listdir("/sys/fs/cgroup") if os.path.isdir(f"/sys/fs/cgroup/{d}/{INSTANCE}")]
        if left:
            problems.append(f"cgroup slice {INSTANCE} left behind in {left}")
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(redis_dir, ignore_errors=True)
        if lua:
            os.unlink(lua)
        for d in (data_dir, redis_dir):
            if os.path.exists(d):
                problems.append(f"{d} could not be removed")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems or failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What isoboxd adds around a cold sandbox, step by step, beside a bare `runsc run`.

One isoboxd and bare runsc, their cold runs of the same program interleaved request by
request (`execute_ab.py`'s MIX mode: both share the host's same minutes). Per round,
isoboxd's `/metrics` is read before and after, so for every run it gives:
- each step of its own (`isobox_sandbox_step_*`: bundle write, cgroup create, network,
  spawn of `runsc run`, reap, `runsc delete`, state files, bundle and cgroup removal):
  how often it ran, its wall time and its thread's CPU time;
- the daemon process's whole CPU (HTTP, the event loop, the steps) and the rest of it
  (the whole less the steps), and the CPU of the `runsc run` processes it starts (they
  stay in the daemon's cgroup; runsc moves only its sandbox and gofer into the run's);
- everything the run cost (the daemon's cgroup plus its sandboxes' slice) against bare
  runsc's (its own cgroup), and the mean latency of each.

Usage (root): python3 bench/load/steps.py [BINARY]   (default target/release/isoboxd)
Settings (environment): ROUNDS (6), BLOCK (12), CONC (1), BENCH_LANGUAGES ("python-slim"),
and `execute.py`'s ISOBOX_PLATFORM / ISOBOX_RUNSC. Python 3.11 standard library only.
"""

import http.client
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("BENCH_LANGUAGES", "python-slim")
os.environ.setdefault("CONC", "1")
os.environ.setdefault("BLOCK", "12")
import execute as ex  # noqa: E402
import execute_ab as ab  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "6"))
STEPS = ["bundle_write", "cgroup_create", "network", "spawn", "reap", "runsc_delete", "state_files",
         "bundle_remove", "cgroup_remove"]
FAMILIES = {"n": "isobox_sandbox_steps_total", "wall": "isobox_sandbox_step_seconds_total",
            "cpu": "isobox_sandbox_step_cpu_seconds_total"}


def scrape(port):
    """{(field, step): value} from the daemon's /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out = {}
    for line in text.splitlines():
        for field, fam in FAMILIES.items():
            if line.startswith(fam + '{step="'):
                step = line[len(fam) + 7:].split('"', 1)[0]
                out[(field, step)] = float(line.rsplit(" ", 1)[1])
    missing = [s for s in STEPS if ("n", s) not in out]
    if missing:
        raise ex.Failure(f"/metrics has no isobox_sandbox_steps_total for {missing}: an older isoboxd?")
    return out


def process_seconds(pid):
    """The CPU time of process `pid` so far, all its threads (also ended ones), not its
    children: /proc/PID/stat's utime + stime, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.getcwd(), "target/release/isoboxd")
    if not os.access(binary, os.X_OK):
        sys.exit(f"usage: python3 bench/load/steps.py [BINARY] ({binary} is not executable)")
    if os.geteuid() != 0:
        sys.exit("error: run as root (runsc and isoboxd need it)")
    os.makedirs(ex.RUNSC_ROOT, exist_ok=True)
    rt = ex.runtimes_to_bench()[0]
    bare = ex.BenchCgroup(f"isobox-bench-bare-runsc-{os.getpid()}")
    ex.MODE_CG["bare runsc"] = bare
    d = None
    try:
        d = ab.Daemon("isoboxd", binary, 0)
        modes = [("bare runsc", ex.run_bare_runsc, bare.seconds), ("isoboxd", d.run_one, d.seconds)]
        for _, fn, _ in modes:  # warm the page cache and the daemon; not counted
            for _ in range(2):
                fn(rt)
        print(f"== {rt['language']} `{rt['code']}`: {ROUNDS} rounds of {ab.BLOCK} runs per mode at c={ab.CONC}, "
              f"interleaved request by request; load average before: {ex.loadavg()}")
        rounds = []
        for r in range(ROUNDS):
            m0, own0, p0 = scrape(d.port), d.own.seconds(), process_seconds(d.proc.pid)
            res = ab.mixed(modes, rt)
            m1, own1, p1 = scrape(d.port), d.own.seconds(), process_seconds(d.proc.pid)
            delta = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in m1}
            rounds.append({"bare": res["bare runsc"], "isoboxd": res["isoboxd"], "own": (own1 - own0) / ab.BLOCK,
                           "process": p1 - p0, "steps": {k: v / ab.BLOCK for k, v in delta.items()}})
            b, i = res["bare runsc"], res["isoboxd"]
            print(f"round {r + 1:>2}  bare {b[0]:.4f} s {b[1]:6.1f} ms  isoboxd {i[0]:.4f} s {i[1]:6.1f} ms  "
                  f"daemon {rounds[-1]['own'] * 1000:5.1f} ms CPU", flush=True)
        print(f"load average after: {ex.loadavg()}")
        med = statistics.median
        print(f"\nper cold run, medians of {ROUNDS} rounds:")
        print(f"{'step':<14} {'count':>6} {'wall ms':>8} {'CPU ms':>7}")
        total_cpu = 0.0
        for s in STEPS:
            n = med(x["steps"].get(("n", s), 0.0) for x in rounds)
            wall = med(x["steps"].get(("wall", s), 0.0) for x in rounds) * 1000
            cpu = med(x["steps"].get(("cpu", s), 0.0) for x in rounds) * 1000
            total_cpu += cpu
            print(f"{s:<14} {n:>6.2f} {wall:>8.2f} {cpu:>7.2f}")
        own = med(x["own"] for x in rounds) * 1000
        # Clock ticks are coarse: the daemon process's share over all rounds at once.
        process = sum(x["process"] for x in rounds) / (ROUNDS * ab.BLOCK) * 1000
        bare_cpu = med(x["bare"][0] for x in rounds) * 1000
        iso_cpu = med(x["isoboxd"][0] for x in rounds) * 1000
        print(f"{'all steps':<14} {'':>6} {'':>8} {total_cpu:>7.2f}")
        print(f"{'daemon, rest':<14} {'':>6} {'':>8} {process - total_cpu:>7.2f}   (HTTP, event loop, pipes, result)")
        print(f"{'daemon, all':<14} {'':>6} {'':>8} {process:>7.2f}   ({process / bare_cpu * 100:.1f} % of a bare run; "
              f"all rounds, in clock ticks)")
        print(f"{'runsc run':<14} {'':>6} {'':>8} {own - process:>7.2f}   (the `runsc run` process isoboxd starts, "
              f"outside the sandbox's cgroup)")
        print(f"\nCPU per run: isoboxd {iso_cpu:.1f} ms (daemon and sandbox), bare runsc {bare_cpu:.1f} ms: "
              f"{iso_cpu / bare_cpu:.3f}x; per round "
              f"{min(x['isoboxd'][0] / x['bare'][0] for x in rounds):.2f}-"
              f"{max(x['isoboxd'][0] / x['bare'][0] for x in rounds):.2f}x")
        print(f"mean latency: isoboxd {med(x['isoboxd'][1] for x in rounds):.1f} ms, bare runsc "
              f"{med(x['bare'][1] for x in rounds):.1f} ms")
    finally:
        if d is not None:
            d.stop()
        left = ex.delete_bare_containers()
        bare.remove()
        if left:
            sys.exit(f"error: bare runsc containers left: {left}")


if __name__ == "__main__":
    main()

//! R: resource exhaustion and process control (tests/ADVERSARIAL.md, section R).

use crate::harness::{run_of, Adv, PY};
use crate::host::{fd_count, proc_stat, run_cgroups};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Cores the whole host keeps busy over `window` (from /proc/stat).
fn host_busy_cores(window: Duration) -> f64 {
    let read = || -> (u64, u64) {
        let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let f: Vec<u64> = s
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        let total: u64 = f.iter().take(8).sum();
        let idle = f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
        (total - idle, total)
    };
    let (b0, _) = read();
    std::thread::sleep(window);
    let (b1, _) = read();
    (b1 - b0) as f64 / 100.0 / window.as_secs_f64()
}

/// Every host process below `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() {
            if let Some((ppid, ..)) = proc_stat(p) {
                all.push((p, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &all {
            if pp == p {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// The state of a process seen earlier, if that very process still runs (or is stopped).
/// A zombie has already died: runsc's processes are reparented to this VM's init, which
/// reaps them lazily (seconds), so Z is "gone" for these checks; zombies of the daemon
/// itself are I2's business.
fn still_alive(p: (u32, u64)) -> Option<char> {
    proc_stat(p.0)
        .filter(|s| s.2 == p.1 && s.1 != 'Z' && s.1 != 'X')
        .map(|s| s.1)
}

/// The kernel log from the moment it is opened (/dev/kmsg, root only). Each read()
/// returns one record (`prio,seq,usec,flags;message`, then ` KEY=value` lines); EAGAIN
/// when none is left; EPIPE once when records were overwritten before being read, after
/// which reading goes on with the oldest record still there.
struct Kmsg(std::fs::File);

impl Kmsg {
    /// Opens non-blocking and skips the history (`lseek(fd, 0, SEEK_END)`).
    fn open_at_end() -> Kmsg {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .expect("open /dev/kmsg (needs root)");
        f.seek(SeekFrom::End(0))
            .expect("lseek /dev/kmsg to its end");
        Kmsg(f)
    }

    /// The first line of every record logged since the last call (or the open).
    fn drain(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 16 << 10];
        loop {
            match self.0.read(&mut buf) {
                Ok(0) => return out,
                Ok(n) => out.push(
                    String::from_utf8_lossy(&buf[..n])
                        .lines()
                        .next()
                        .unwrap_or("")
                        .to_string(),
                ),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return out,
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => panic!("read /dev/kmsg: {e}"),
            }
        }
    }
}

/// The memory cgroup an `oom-kill:` record says ran out (`oom_memcg=`; absent for a
/// global OOM).
fn oom_memcg(record: &str) -> Option<&str> {
    let msg = record.split_once(';').map_or(record, |(_, m)| m);
    msg.strip_prefix("oom-kill:")?
        .split(',')
        .find_map(|f| f.strip_prefix("oom_memcg="))
}

/// Whether the memory cgroup `memcg` is above `own` (an ancestor, the root included):
/// an OOM there is one the sandboxes under `own` could have caused outside their limits.
fn memcg_above(memcg: &str, own: &str) -> bool {
    let m = memcg.trim_end_matches('/');
    m.is_empty() || own.starts_with(&format!("{m}/"))
}

/// R1 + R2: a fork bomb and a thread bomb (with a bash fork bomb under it) at once, and
/// a canary started 1 s into them. Both end at a limit (wall time, pids or memory); the
/// canary is served; the daemon's host process tree is back to its baseline.
#[test]
fn test_r1_r2_fork_and_thread_bombs_bounded() {
    let a = Adv::start("r2", &[]);
    let base_procs = descendants(a.pid()).len();
    let r1 = "import os\nwhile True:\n try: os.fork()\n except OSError: pass";
    let r2 = "import subprocess,threading,time; subprocess.Popen([\"bash\",\"-c\",\":(){ :|:& };:\"]); [threading.Thread(target=time.sleep,args=(60,)).start() for _ in range(100000)]";
    let wall = 5000u64;
    std::thread::scope(|s| {
        let bombs: Vec<_> = [("R1", r1), ("R2", r2)]
            .into_iter()
            .map(|(id, code)| {
                let a = &a;
                s.spawn(move || {
                    let t0 = Instant::now();
                    let r = a.exec(code, json!({"wallTimeMs": wall}));
                    (id, r, t0.elapsed())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(1));
        let canary = a.exec("print('canary')", json!({}));
        a.expect(run_of(&canary)["stdout"] == "canary\n", || {
            format!("canary during the bombs: {canary}")
        });
        for b in bombs {
            let (id, r, took) = b.join().unwrap();
            let run = run_of(&r);
            // status ∈ {timeout, resource_limit}: killed at the wall time, or stopped
            // by the pids limit with a non-zero exit.
            a.expect(
                run["timedOut"] == true || run["exitCode"].as_i64().unwrap_or(0) != 0,
                || format!("{id}: neither timed out nor stopped by the limit: {r}"),
            );
            // An OOM kill is a resource limit too: 128 forked interpreters outgrow the
            // default 256 MiB before the pids limit or the wall time stops them.
            a.expect(
                took <= Duration::from_millis(wall) + Duration::from_secs(6),
                || format!("{id}: answered after {took:?}, past WALL + 5 s"),
            );
        }
    });
    // Host pids (sentry, gofer, ptrace stubs) back to the baseline within 5 s.
    a.settle_clean(Duration::from_secs(20));
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut procs = descendants(a.pid()).len();
    while procs > base_procs && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        procs = descendants(a.pid()).len();
    }
    a.expect(procs <= base_procs, || {
        format!("{procs} host processes under the daemon, baseline {base_procs}")
    });
    // The bombs' "Resource temporarily unavailable" belong inside the sandbox (stderr),
    // never to the daemon's own forks.
    let log = a.d.log();
    a.expect(!log.contains("Resource temporarily unavailable"), || {
        "the daemon itself hit EAGAIN on fork".into()
    });
    a.finish();
}

/// R3 + R4: a growing heap, and 4 GiB written to /dev/shm and /tmp under a 64 MiB
/// limit. Heap: OOM from the cgroup while a concurrent canary is served. tmpfs: counted
/// as the sandbox's memory (ENOSPC inside, or an OOM kill), under a cap read back from
/// the run's memory cgroup while it writes.
#[test]
fn test_r3_r4_memory_bombs_and_tmpfs_count_as_memory() {
    let a = Adv::start("r4", &[]);
    let mib64 = 64u64 << 20;
    // The record parser on the kernel's two forms (memcg OOM, global OOM) and a memcg
    // outside isobox (this machine's own process cgroup).
    let memcg_oom = "6,171739,53055630129,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=isobox-t1-9-2190-7,mems_allowed=0,oom_memcg=/isobox-t1-9/isobox-t1-9-2190-7,task_memcg=/isobox-t1-9/isobox-t1-9-2190-7,task=exe,pid=9889,uid=65534";
    let global_oom = "6,5,9,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=python3,pid=7,uid=0";
    let host_oom = "6,6,9,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/process_api/x,task_memcg=/process_api/x,task=cargo,pid=8,uid=0";
    assert_eq!(
        oom_memcg(memcg_oom),
        Some("/isobox-t1-9/isobox-t1-9-2190-7")
    );
    let outside_ours = |r: &str, own: &str| oom_memcg(r).is_none_or(|m| memcg_above(m, own));
    assert!(!outside_ours(memcg_oom, "/isobox-t1-9"));
    assert!(outside_ours(global_oom, "/isobox-t1-9"));
    assert!(
        !outside_ours(host_oom, "/isobox-t1-9"),
        "a sibling's OOM is not ours"
    );
    assert!(memcg_above("/", "/isobox-t1-9") && memcg_above("/a", "/a/isobox-t1-9"));
    assert!(!memcg_above("/isobox-t1", "/isobox-t1-9"));
    let mut kmsg = Kmsg::open_at_end();
    std::thread::scope(|s| {
        let a2 = &a;
        let bomb = s.spawn(move || {
            a2.exec(
                "b=[]\nwhile True: b.append(bytearray(64<<20))",
                json!({"memoryBytes": mib64}),
            )
        });
        let canary = a.exec("print('canary')", json!({}));
        a.expect(run_of(&canary)["stdout"] == "canary\n", || {
            format!("R3 canary: {canary}")
        });
        let r = bomb.join().unwrap();
        a.expect(
            run_of(&r)["oomKilled"] == true && run_of(&r)["exitCode"] == 137,
            || format!("R3: not an OOM kill: {r}"),
        );
    });
    // The kernel's OOM killer acted on this instance's own cgroup tree: the record is
    // written when the victim is chosen, before the response; polled briefly anyway.
    let instance = a.d.instance.clone();
    let own = |memcg: &str| {
        memcg == format!("/{instance}") || memcg.starts_with(&format!("/{instance}/"))
    };
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        records.extend(kmsg.drain());
        if records.iter().any(|r| oom_memcg(r).is_some_and(own)) || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The kernel rate-limits the OOM report (10 per 5 s): when parallel tests' OOMs
    // used it up, it says so ("callbacks suppressed") and ours may be missing.
    let suppressed = records.iter().any(|r| r.contains("callbacks suppressed"));
    a.expect(suppressed || records.iter().any(|r| oom_memcg(r).is_some_and(own)), || {
        format!(
            "R3: no oom-kill record for a cgroup under /{instance} in the kernel log; OOM records seen: {:?}",
            records.iter().filter(|r| r.contains("oom")).collect::<Vec<_>>()
        )
    });
    // R4, written in 1 MiB steps so the tmpfs (not Python's heap) is what fills up.
    let code = "import os\nfor d in ['/dev/shm', '/tmp']:\n n = 0\n try:\n  f = open(d + '/x', 'wb')\n  for _ in range(4096):\n   f.write(b'\\0' * (1 << 20)); f.flush(); n += 1\n  print(d, 'wrote', n, flush=True)\n except OSError as e:\n  print(d, 'errno', e.errno, n, flush=True)";
    // Earlier runs' cgroups may still be there for a moment (they are removed on the
    // pool after their responses): only this run's cgroup counts.
    let earlier: HashSet<PathBuf> = run_cgroups("memory", &instance).into_iter().collect();
    let (r, caps) = std::thread::scope(|s| {
        let a2 = &a;
        let h = s.spawn(move || a2.exec(code, json!({"memoryBytes": mib64})));
        let mut caps = HashSet::new();
        while !h.is_finished() {
            for dir in run_cgroups("memory", &instance)
                .into_iter()
                .filter(|d| !earlier.contains(d))
            {
                if let Ok(v) = std::fs::read_to_string(dir.join("memory.limit_in_bytes")) {
                    caps.insert(v.trim().parse::<u64>().unwrap_or(0));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (h.join().unwrap(), caps)
    });
    let run = run_of(&r);
    let out = run["stdout"].as_str().unwrap_or("");
    // /dev/shm is not writable for uid 65534 (EACCES) in our sandboxes; either way no
    // write of 4 GiB may succeed anywhere.
    a.expect(!out.contains("wrote 4096"), || {
        format!("R4: 4 GiB written: {r}")
    });
    a.expect(
        run["oomKilled"] == true || out.contains("/tmp errno 28"),
        || format!("R4: /tmp neither ENOSPC nor OOM-killed: {r}"),
    );
    a.expect(
        caps.iter().all(|&c| c == mib64 + (32 << 20)) && !caps.is_empty(),
        || format!("R4: run memory cgroup caps seen {caps:?}, want memoryBytes + 32 MiB"),
    );
    // The catalogue's one-line form: a 4 GiB bytes object under 64 MiB.
    let r = a.exec(
        "open('/tmp/y','wb').write(b'\\0'*(4<<30))",
        json!({"memoryBytes": mib64}),
    );
    a.expect(
        run_of(&r)["oomKilled"] == true || run_of(&r)["exitCode"] != 0,
        || format!("R4 one-liner: {r}"),
    );
    // R3's host half, over every record since before the bomb: no OOM kill that the
    // sandboxes' memory could have caused outside their own cgroups, i.e. none in a
    // cgroup above this instance's (the root included), and no global "Out of memory"
    // (the memcg form says "Memory cgroup out of memory"). An OOM in an unrelated
    // cgroup of this shared host (a sibling, such as a build's) is not ours to judge.
    records.extend(kmsg.drain());
    let own_path = format!("/{instance}");
    let mut ooms = 0;
    for r in &records {
        if r.contains("oom-kill:") {
            ooms += 1;
            a.expect(!outside_ours(r, &own_path), || {
                format!("R3: an OOM kill outside the sandbox cgroups, above them: {r}")
            });
        }
        a.expect(!r.contains("Out of memory"), || {
            format!("R3: a global OOM in the kernel log: {r}")
        });
    }
    eprintln!(
        "R3: {} kernel records while the test ran, {ooms} oom-kill",
        records.len()
    );
    a.finish();
}

/// R6 (the in-sandbox half; the FILES listing waits for issue 7): ten million empty
/// files in the workspace end at a limit (ENOSPC, OOM or the wall time), not on the host.
#[test]
fn test_r6_many_files_bounded() {
    let a = Adv::start("r6", &[]);
    let t0 = Instant::now();
    let r = a.exec(
        "import os; os.makedirs('/workspace/d',exist_ok=True)\nfor i in range(10**7): open(f'/workspace/d/{i}','w').close()",
        json!({"memoryBytes": 33554432, "wallTimeMs": 3000}),
    );
    let took = t0.elapsed();
    let run = run_of(&r);
    a.expect(
        run["timedOut"] == true
            || run["oomKilled"] == true
            || run["stderr"]
                .as_str()
                .unwrap_or("")
                .contains("No space left"),
        || format!("R6: not stopped by a limit: {r}"),
    );
    a.expect(took < Duration::from_secs(10), || {
        format!("R6: answered after {took:?}")
    });
    a.finish();
}

/// R7 with one-shot runs: what one run leaves in /dev/shm, /tmp, /var/tmp, /run/lock or
/// its workspace is not there for the next run.
#[test]
fn test_r7_nothing_persists_between_runs() {
    let a = Adv::start("r7", &[]);
    let dirs = "['/dev/shm','/tmp','/var/tmp','/run/lock','/workspace']";
    let r = a.exec(
        &format!("for d in {dirs}:\n try: open(d+'/bean','w').write('x'); print('wrote', d)\n except OSError as e: print('no', d, e.errno)"),
        json!({}),
    );
    let out = run_of(&r)["stdout"].as_str().unwrap_or("").to_string();
    a.expect(out.contains("wrote /tmp"), || {
        format!("R7: /tmp not writable? {r}")
    });
    let r = a.exec(
        &format!("import os; print([d for d in {dirs} if os.path.exists(d+'/bean')])"),
        json!({}),
    );
    a.expect(run_of(&r)["stdout"] == "[]\n", || {
        format!("R7: a file persisted across runs: {r}")
    });
    a.finish();
}

/// R9: 30 MB of invalid UTF-8 and NULs with a 4 KiB cap: valid JSON with U+FFFD, the
/// cap counted in raw bytes (one character per byte here), the run stopped as a flood.
#[test]
fn test_r9_invalid_utf8_flood_is_valid_json() {
    let a = Adv::start("r9", &[]);
    let t0 = Instant::now();
    let r = a.exec(
        "import sys; sys.stdout.buffer.write(b'\\xff\\xfe\\x00'*10**7)",
        json!({"outputBytes": 4096}),
    );
    let run = run_of(&r);
    let out = run["stdout"].as_str().unwrap_or("");
    a.expect(out.chars().count() == 4096, || {
        format!("R9: {} characters kept, want 4096", out.chars().count())
    });
    a.expect(out.chars().all(|c| c == '\u{FFFD}' || c == '\0'), || {
        "R9: unexpected characters in the kept stdout".into()
    });
    a.expect(run["truncated"] == true && run["timedOut"] == false, || {
        format!("R9: {run}")
    });
    a.expect(t0.elapsed() < Duration::from_secs(10), || {
        format!("R9: took {:?}", t0.elapsed())
    });
    a.finish();
}

/// R13: a group that ignores SIGTERM and SIGSTOPs itself dies at the wall time (+ the
/// boot, which is not charged to it: up to 1 s here), and none of its host processes
/// survives, stopped or not.
#[test]
fn test_r13_stopped_group_killed_at_wall_time() {
    let a = Adv::start("r13", &[]);
    let wall = 2000u64;
    let (r, seen, took) = a.exec_watched(
        "import os,signal; signal.signal(signal.SIGTERM,signal.SIG_IGN); os.kill(0,signal.SIGSTOP)",
        json!({"wallTimeMs": wall}),
    );
    let run = run_of(&r);
    a.expect(
        run["timedOut"] == true && run["exitCode"] == 137 && run["oomKilled"] == false,
        || format!("R13: {r}"),
    );
    // WALL here is wallTimeMs + the boot (not charged to the program, ≤ 1 s on this
    // host); the catalogue allows ± 1 s.
    let lo = Duration::from_millis(wall);
    let hi = Duration::from_millis(wall) + Duration::from_secs(1 + 1);
    a.expect(
        took >= lo && took <= hi + Duration::from_millis(500),
        || format!("R13: answered after {took:?}, want WALL ± 1 s"),
    );
    a.expect(!seen.is_empty(), || {
        "R13: never saw the sandbox's processes".into()
    });
    a.settle_clean(Duration::from_secs(20));
    let left: Vec<_> = seen
        .iter()
        .filter_map(|&p| still_alive(p).map(|st| (p.0, st)))
        .collect();
    a.expect(left.is_empty(), || {
        format!("R13: sandbox processes still exist (pid, state): {left:?}")
    });
    a.finish();
}

/// R14 (values the other suites do not try): null, -1 and -0 wall times, 2^64 and null
/// for the other limits. Clamped or refused, never unlimited: `time.sleep(60)` ends by
/// the default (10 s) or the maximum.
#[test]
fn test_r14_limits_never_unlimited() {
    let a = Adv::start("r14", &[("ISOBOX_MAX_CONCURRENT", "8")]);
    let sleep = "import time\ntime.sleep(60)\nprint('not reached')";
    let cases: Vec<(Value, u64)> = vec![
        (json!({"wallTimeMs": null}), 10_000),
        (json!({"wallTimeMs": -1}), 100),
        (json!({"wallTimeMs": -0.0}), 100),
        (
            json!({"memoryBytes": 18446744073709551616.0, "pids": 18446744073709551616.0, "outputBytes": 18446744073709551616.0, "cpus": 18446744073709551616.0}),
            10_000,
        ),
        (
            json!({"memoryBytes": null, "pids": null, "outputBytes": null, "cpus": null}),
            10_000,
        ),
    ];
    std::thread::scope(|s| {
        let hs: Vec<_> = cases
            .into_iter()
            .map(|(limits, wall)| {
                let a = &a;
                s.spawn(move || {
                    let body =
                        json!({"language": PY, "network": false, "code": sleep, "limits": limits});
                    let t0 = Instant::now();
                    let r = a.req("POST", "/execute", &[], body.to_string().as_bytes());
                    (limits, wall, r, t0.elapsed())
                })
            })
            .collect();
        for h in hs {
            let (limits, wall, r, took) = h.join().unwrap();
            if r.status == 400 {
                a.expect(r.json()["error"] == "invalid_json", || {
                    format!("R14 {limits}: {}", r.text())
                });
                continue;
            }
            a.expect(r.status == 200, || format!("R14 {limits}: {}", r.text()));
            let j = r.json();
            a.expect(run_of(&j)["timedOut"] == true, || {
                format!("R14 {limits}: not killed: {j}")
            });
            let bound = Duration::from_millis(wall) + Duration::from_secs(1 + 3);
            a.expect(took <= bound, || {
                format!("R14 {limits}: ran {took:?}, want about {wall} ms + 1 s grace")
            });
        }
    });
    a.finish();
}

/// R14, the other branch: a limit the daemon refuses gets a 400 that names the field.
#[test]
fn test_r14_invalid_limit_400_names_the_field() {
    let a = Adv::start("r14b", &[]);
    for (field, v) in [
        ("wallTimeMs", json!("5")),
        ("wallTimeMs", json!("NaN")),
        ("memoryBytes", json!(true)),
        ("pids", json!([1])),
        ("cpus", json!({"x": 1})),
    ] {
        let mut limits = serde_json::Map::new();
        limits.insert(field.to_string(), v.clone());
        let body = json!({"language": PY, "network": false, "code": "print(1)", "limits": limits});
        let r = a.req("POST", "/execute", &[], body.to_string().as_bytes());
        a.expect(r.status == 400, || format!("R14 {field}={v}: {}", r.text()));
        let detail = r.json()["detail"].as_str().unwrap_or("").to_string();
        a.expect(detail.contains(field), || {
            format!("R14: 400 for {field}={v} does not name the field: {detail:?}")
        });
    }
    a.expect(a.counter("runsTotal") == 1, || {
        "R14: a refused limit started a run".into()
    });
    a.finish();
}

/// R15: 500 children forked and never waited for, then `print('ok')`. No init reaps
/// them inside the sandbox (the program is PID 1, and un-waited children are zombies of
/// their parent on any Linux), so the run either prints ok or is stopped by the pids
/// limit: the catalogue's "bounded by pids" branch. Either way it ends long before its
/// wall time, children that are waited for free their slots, and no zombie is left on
/// the host under the daemon.
#[test]
fn test_r15_orphan_children_reaped_or_bounded() {
    let a = Adv::start("r15", &[]);
    let base_procs = descendants(a.pid()).len();
    let t0 = Instant::now();
    let r = a.exec(
        "import os,time\nfor _ in range(500):\n if os.fork()==0: os._exit(0)\ntime.sleep(2); print('ok')",
        json!({"wallTimeMs": 20000}),
    );
    let took = t0.elapsed();
    let run = run_of(&r);
    let bounded = run["exitCode"] != 0
        && run["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("Resource temporarily unavailable");
    a.expect(run["stdout"] == "ok\n" || bounded, || {
        format!("R15: neither ok nor bounded by pids: {r}")
    });
    a.expect(run["timedOut"] == false, || {
        format!("R15: ran to the wall time: {r}")
    });
    eprintln!(
        "R15: {} in {took:?}",
        if bounded { "bounded by pids" } else { "ok" }
    );
    // Control: more children than `pids` allows at once, each waited for, all fit.
    let r = a.exec(
        "import os\nfor _ in range(150):\n pid = os.fork()\n if pid == 0: os._exit(0)\n os.waitpid(pid, 0)\nprint('ok')",
        json!({"wallTimeMs": 20000}),
    );
    a.expect(run_of(&r)["stdout"] == "ok\n", || {
        format!("R15: reaped children did not free their pids: {r}")
    });
    a.settle_clean(Duration::from_secs(20));
    let procs = descendants(a.pid()).len();
    a.expect(procs <= base_procs, || {
        format!("R15: {procs} host processes under the daemon, baseline {base_procs}")
    });
    a.finish();
}

/// R16: a setsid'd grandchild looping forever. The result comes back when the program
/// exits; afterwards none of the run's host processes exists and its cgroups are gone.
#[test]
fn test_r16_setsid_grandchild_gone_after_run() {
    let a = Adv::start("r16", &[]);
    let (r, seen, took) = a.exec_watched(
        "import os,time\nif os.fork()==0:\n os.setsid()\n if os.fork()==0:\n  while True: time.sleep(.1)\nprint('parent exits')",
        json!({}),
    );
    let run = run_of(&r);
    a.expect(
        run["stdout"]
            .as_str()
            .unwrap_or("")
            .contains("parent exits")
            && run["timedOut"] == false,
        || format!("R16: {r}"),
    );
    a.expect(took < Duration::from_secs(8), || {
        format!("R16: took {took:?}")
    });
    a.expect(!seen.is_empty(), || {
        "R16: never saw the sandbox's processes".into()
    });
    a.settle_clean(Duration::from_secs(20));
    let left: Vec<_> = seen
        .iter()
        .filter_map(|&p| still_alive(p).map(|st| (p.0, st)))
        .collect();
    a.expect(left.is_empty(), || {
        format!("R16: processes of the run survive it (pid, state): {left:?}")
    });
    for c in ["pids", "memory", "cpu"] {
        let dirs = run_cgroups(c, &a.d.instance);
        a.expect(dirs.is_empty(), || {
            format!("R16: run cgroups left: {dirs:?}")
        });
    }
    a.finish();
}

/// R18: a million sockets, then a million open files: EMFILE inside the sandbox; the
/// daemon's own fd count does not move.
#[test]
fn test_r18_fd_exhaustion_inside_daemon_fds_unchanged() {
    let a = Adv::start("r18", &[]);
    let before = fd_count(a.pid());
    let r = a.exec(
        "import socket\ns = []\ntry:\n for _ in range(10**6): s.append(socket.socket())\nexcept OSError as e: print('socket', e.errno, flush=True)\nfor x in s: x.close()\nf = []\ntry:\n for _ in range(10**6): f.append(open('/dev/null'))\nexcept OSError as e: print('file', e.errno, flush=True)",
        json!({}),
    );
    let out = run_of(&r)["stdout"].as_str().unwrap_or("").to_string();
    for what in ["socket", "file"] {
        a.expect(
            out.contains(&format!("{what} 24")) || out.contains(&format!("{what} 23")),
            || format!("R18: {what}s not stopped by EMFILE/ENFILE: {r}"),
        );
    }
    a.settle_clean(Duration::from_secs(20));
    let deadline = Instant::now() + Duration::from_secs(5);
    while fd_count(a.pid()) > before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = fd_count(a.pid());
    a.expect(after <= before, || {
        format!("R18: daemon fds {before} before, {after} after")
    });
    a.finish();
}

/// R19: four busy loops next to a canary `sum(range(10**7))`. Each hog is held to its
/// `cpu.max` share (quota read back, throttling seen, CPU time measured over 2 s) and
/// the canary's wall time stays within 2× its idle value. The hogs get 0.25 CPU each,
/// 1 CPU in all: on this 2-core host, 4 hogs at 1.0 CPU would ask for 4 cores, and no
/// per-run quota could then leave the canary its idle speed (measured: 3–5× slower), so
/// that would test the host's size rather than the daemon's limits.
///
/// The 2× comparison also needs the host's second core to be free of anything else: the
/// daemon's slice competes with every other busy process on the host at equal weight.
/// The CPU the host spends outside this daemon is measured while the daemon is idle
/// (before and after); above 0.25 of a core (a parallel test, another build on a shared
/// machine) the 2× check is reported as inconclusive instead of judged.
#[test]
fn test_r19_busy_neighbours_do_not_starve_canary() {
    let a = Adv::start("r19", &[("ISOBOX_MAX_CONCURRENT", "5")]);
    let canary =
        "import time\nt = time.time()\nsum(range(10**7))\nprint(round(time.time() - t, 3))";
    let sample = |a: &Adv| {
        let t0 = Instant::now();
        let r = a.exec(canary, json!({}));
        assert_eq!(run_of(&r)["exitCode"], 0, "{r}");
        t0.elapsed()
    };
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let external_before = host_busy_cores(Duration::from_secs(1));
    let mut idle: Vec<Duration> = (0..3).map(|_| sample(&a)).collect();
    let instance = a.d.instance.clone();
    let (loaded, quotas, throttled) = std::thread::scope(|s| {
        let hogs: Vec<_> = (0..4)
            .map(|_| {
                let a = &a;
                s.spawn(move || {
                    a.exec(
                        "while True: pass",
                        json!({"cpus": 0.25, "wallTimeMs": 15000}),
                    )
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(15);
        while a.health()["inFlight"] != 4 {
            assert!(Instant::now() < deadline, "hogs never all started");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_secs(1));
        // What each hog really gets: its cgroup's CPU time over 2 s (cpuacct).
        let usage = |dir: &std::path::Path| {
            let acct = PathBuf::from("/sys/fs/cgroup/cpuacct")
                .join(&instance)
                .join(dir.file_name().unwrap());
            std::fs::read_to_string(acct.join("cpuacct.usage"))
                .ok()?
                .trim()
                .parse::<u64>()
                .ok()
        };
        let dirs = run_cgroups("cpu", &instance);
        let u0: Vec<Option<u64>> = dirs.iter().map(|d| usage(d)).collect();
        std::thread::sleep(Duration::from_secs(2));
        let shares: Vec<f64> = dirs
            .iter()
            .zip(u0)
            .filter_map(|(d, u0)| Some((usage(d)? - u0?) as f64 / 2e9))
            .collect();
        eprintln!("R19: hog CPU shares over 2 s: {shares:?}");
        a.expect(
            shares.len() == 4 && shares.iter().all(|&c| c <= 0.25 * 1.2),
            || format!("R19: hogs used {shares:?} of a CPU each, quota 0.25"),
        );
        // Read while the hogs surely run, before the canary samples (on a loaded host
        // those can outlast the hogs' 15 s wall time; an earlier canary's cgroup, being
        // removed, may be here too: only the 25000 quotas count).
        let mut quotas = Vec::new();
        let mut throttled = Vec::new();
        for dir in run_cgroups("cpu", &instance) {
            let q = std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).unwrap_or_default();
            let st = std::fs::read_to_string(dir.join("cpu.stat")).unwrap_or_default();
            let n = st
                .lines()
                .find_map(|l| l.strip_prefix("nr_throttled "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let q = q.trim().parse::<i64>().unwrap_or(-1);
            if q == 25_000 {
                throttled.push(n);
            }
            quotas.push(q);
        }
        let loaded: Vec<Duration> = (0..3).map(|_| sample(&a)).collect();
        for h in hogs {
            let r = h.join().unwrap();
            a.expect(run_of(&r)["timedOut"] == true, || format!("R19 hog: {r}"));
        }
        eprintln!("R19: loaded samples {loaded:?}");
        (median(loaded), quotas, throttled)
    });
    // Idle again after the hogs: the host is shared, so idle is the median of before
    // and after.
    idle.extend((0..3).map(|_| sample(&a)));
    eprintln!("R19: idle samples {idle:?}");
    let idle = median(idle);
    let external = external_before.max(host_busy_cores(Duration::from_secs(1)));
    eprintln!("R19: canary idle {idle:?}, next to 4 hogs {loaded:?}; hog quotas {quotas:?}, throttled {throttled:?}");
    if external <= 0.25 {
        a.expect(loaded <= idle * 2, || {
            format!("R19: canary took {loaded:?} next to the hogs, idle {idle:?} (> 2×)")
        });
    } else {
        eprintln!("R19: INCONCLUSIVE: the host spent {external:.2} cores outside this daemon; the 2× canary check needs a free core");
    }
    a.expect(throttled.len() == 4, || {
        format!("R19: hog cgroups' cpu.cfs_quota_us {quotas:?}, want 25000 each")
    });
    a.expect(throttled.iter().all(|&n| n > 0), || {
        format!("R19: hogs not throttled by their quota: {throttled:?}")
    });
    a.finish();
}

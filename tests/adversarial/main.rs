//! Adversarial cases from the shared catalogue (/work/shared/adversarial-cases.md) that
//! the other suites do not already cover; tests/ADVERSARIAL.md maps every catalogue ID
//! to its test, to the issue it waits for, or says why it does not apply.
//!
//! Each test runs its case against the real daemon (real runsc, real cgroups) and then
//! checks the catalogue's global invariants, as far as they apply to this build:
//! - I1: `GET /healthz` is 200 within 1 s and a canary `print(1)` returns "1\n" within
//!   2× the warm-up run's latency (+1 s: the suite runs two tests at once on 2 cores).
//! - I2: nothing is left (runsc containers, cgroups, bundles: `Daemon::assert_clean`'s
//!   list) and the daemon has no zombie children.
//! - I3: the daemon's fd count and RSS, read from /proc, are within the post-warm-up
//!   baseline + 10 %, plus a fixed slack of 2 fds (a run's pipes while its teardown
//!   finishes) and 4 MiB of RSS (glibc gives each worker thread its own malloc arena on
//!   first use and keeps freed high-water pages; a 10 % margin of a ~4 MiB daemon would
//!   be under one arena's first allocation).
//! - I4: a host canary (/tmp/hostcanary-<pid>-<test>/secret, random content) has the
//!   same sha256 afterwards and its content never appears in a response body.
//! - I6: the daemon's log contains none of the configured API keys nor the canary.
//!
//! I5, the nftables hash, waits for network egress (issue 6).
//!
//! A test records what the catalogue calls a failure as a finding and keeps going, so
//! the invariants are still checked; it fails at the end listing every finding.

#[path = "../common/mod.rs"]
mod common;
use common::session::Session;
use common::{merged, read_response, sha256_hex, Daemon, Resp};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::io::{BufReader, Cursor, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const PY: &str = "python-slim";

// ---------------------------------------------------------------------------------------
// Host-side probes: /proc, cgroups, random bytes, digests.
// ---------------------------------------------------------------------------------------

fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The file's SHA-256 as hex; empty if it cannot be read.
fn sha256_file(path: &std::path::Path) -> String {
    std::fs::read(path)
        .map(|b| sha256_hex(&b))
        .unwrap_or_default()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// (ppid, state, starttime, utime+stime in ticks) of a host process.
fn proc_stat(pid: u32) -> Option<(u32, char, u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((
        f.get(1)?.parse().ok()?,
        f.first()?.chars().next()?,
        f.get(19)?.parse().ok()?,
        f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?,
    ))
}

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

/// CPU seconds the process has used (USER_HZ is 100 on Linux).
fn cpu_secs(pid: u32) -> f64 {
    proc_stat(pid).map_or(0.0, |s| s.3 as f64 / 100.0)
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

/// Zombie children of `pid`, as `ps --ppid <pid> -o stat=` sees them.
fn zombie_children(pid: u32) -> usize {
    let out = Command::new("ps")
        .args(["--ppid", &pid.to_string(), "-o", "stat="])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with('Z'))
        .count()
}

/// Run cgroups of an instance in one v1 controller.
fn run_cgroups(controller: &str, instance: &str) -> Vec<PathBuf> {
    std::fs::read_dir(
        PathBuf::from("/sys/fs/cgroup")
            .join(controller)
            .join(instance),
    )
    .into_iter()
    .flatten()
    .flatten()
    .map(|e| e.path())
    .filter(|p| p.is_dir())
    .collect()
}

/// Host processes in any run cgroup of the instance: (pid, starttime).
fn run_cgroup_procs(instance: &str) -> HashSet<(u32, u64)> {
    let mut out = HashSet::new();
    for c in ["pids", "memory", "cpu"] {
        for dir in run_cgroups(c, instance) {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for p in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                if let Some(st) = proc_stat(p) {
                    out.insert((p, st.2));
                }
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

// ---------------------------------------------------------------------------------------
// Raw sockets.
// ---------------------------------------------------------------------------------------

/// Reads until the peer closes (true) or `wait` passes (false).
fn read_until_close(s: &mut TcpStream, wait: Duration) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + wait;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (buf, false);
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut chunk) {
            Ok(0) => return (buf, true),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (buf, true),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return (buf, false),
        }
    }
}

fn parse_all(buf: Vec<u8>) -> Vec<Resp> {
    let mut r = BufReader::new(Cursor::new(buf));
    let mut out = Vec::new();
    while let Some(resp) = read_response(&mut r, false) {
        out.push(resp);
    }
    out
}

/// Writes `bytes` from a second thread (errors ignored: the daemon may close early) and
/// reads until the daemon closes or `wait` passes. Returns the responses and whether the
/// daemon closed the connection.
fn raw_send(addr: SocketAddr, bytes: &[u8], wait: Duration) -> (Vec<Resp>, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut w = s.try_clone().unwrap();
    let data = bytes.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&data);
    });
    let (buf, closed) = read_until_close(&mut s, wait);
    let _ = s.shutdown(std::net::Shutdown::Both);
    let _ = writer.join();
    (parse_all(buf), closed)
}

/// HTTP status of one request sent by curl from another loopback source address.
fn curl_from(source: &str, url: &str, extra: &[&str]) -> u16 {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5"])
        .args(["--interface", source])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Error bodies must be plain JSON: no stack trace, host path or secret.
fn leaky(text: &str, secrets: &[&str], data_dir: &str) -> Option<String> {
    let markers = [
        "panicked",
        "backtrace",
        "RUST_BACKTRACE",
        "/work/",
        "/root",
        "src/",
        ".rs:",
        "/var/lib/isobox",
        "/run/isobox",
        data_dir,
    ];
    markers
        .iter()
        .chain(secrets.iter())
        .find(|m| !m.is_empty() && text.contains(**m))
        .map(|m| format!("{m:?} in {text:?}"))
}

// ---------------------------------------------------------------------------------------
// The per-test harness: daemon, API key, host canary, baselines, findings.
// ---------------------------------------------------------------------------------------

/// Removes a directory the test made (host canary, runsc wrapper) however it ends.
struct CanaryDir(PathBuf);

impl Drop for CanaryDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Adv {
    d: Daemon,
    /// The key every helper sends.
    key: String,
    /// Strings that must never reach the log (I6): keys, canary, planted secrets.
    secrets: Mutex<Vec<String>>,
    canary: String,
    canary_file: PathBuf,
    canary_sha: String,
    _canary_dir: CanaryDir,
    base_fds: usize,
    base_rss: u64,
    warm: Duration,
    findings: Mutex<Vec<String>>,
}

impl Adv {
    /// Starts a daemon with `env` (plus a random API key unless `env` sets keys), waits
    /// for readiness, makes the host canary, runs one warm-up and takes the baselines.
    fn start(tag: &str, env: &[(&str, &str)]) -> Adv {
        let dir = PathBuf::from(format!("/tmp/hostcanary-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let canary = format!("hostcanary-{}", random_hex(24));
        let canary_file = dir.join("secret");
        std::fs::write(&canary_file, &canary).unwrap();
        let canary_sha = sha256_file(&canary_file);
        let configured = env
            .iter()
            .find(|(k, _)| *k == "ISOBOX_API_KEYS")
            .map(|(_, v)| v.to_string());
        let key = format!("adv-key-{}", random_hex(16));
        let mut env2: Vec<(&str, &str)> = env.to_vec();
        let (key, mut secrets) = match &configured {
            Some(list) => (
                list.split(',').next().unwrap().to_string(),
                list.split(',').map(str::to_string).collect::<Vec<_>>(),
            ),
            None => {
                env2.push(("ISOBOX_API_KEYS", key.as_str()));
                (key.clone(), vec![key.clone()])
            }
        };
        // Keys are optional unless required (the spec); these cases test required keys.
        if !env2.iter().any(|(k, _)| *k == "ISOBOX_REQUIRE_AUTH") {
            env2.push(("ISOBOX_REQUIRE_AUTH", "1"));
        }
        secrets.push(canary.clone());
        let d = Daemon::start_with(&env2);
        d.wait_ready();
        let mut a = Adv {
            d,
            key,
            secrets: Mutex::new(secrets),
            canary,
            canary_file,
            canary_sha,
            _canary_dir: CanaryDir(dir),
            base_fds: 0,
            base_rss: 0,
            warm: Duration::ZERO,
            findings: Mutex::new(Vec::new()),
        };
        let t0 = Instant::now();
        let r = a.exec("print(1)", json!({}));
        a.warm = t0.elapsed();
        assert_eq!(r["run"]["stdout"], "1\n", "warm-up: {r}");
        a.d.assert_clean();
        a.base_fds = fd_count(a.pid());
        a.base_rss = rss_bytes(a.pid());
        a
    }

    fn pid(&self) -> u32 {
        self.d.pid()
    }

    fn addr(&self) -> SocketAddr {
        self.d.addr
    }

    fn finding(&self, s: String) {
        eprintln!("FINDING: {s}");
        self.findings.lock().unwrap().push(s);
    }

    /// A soft assertion: a failure is recorded and the test goes on to the invariants.
    fn expect(&self, cond: bool, msg: impl FnOnce() -> String) {
        if !cond {
            self.finding(msg());
        }
    }

    fn add_secret(&self, s: &str) {
        self.secrets.lock().unwrap().push(s.to_string());
    }

    fn scan(&self, bytes: &[u8], what: &str) {
        if contains(bytes, self.canary.as_bytes()) {
            self.finding(format!(
                "I4: host canary content appeared in the response to {what}"
            ));
        }
    }

    /// A request with this test's key (unless `headers` bring their own credentials).
    fn req(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        let has_cred = headers.iter().any(|(k, _)| {
            k.eq_ignore_ascii_case("x-api-key") || k.eq_ignore_ascii_case("authorization")
        });
        let mut h = headers.to_vec();
        if !has_cred {
            h.push(("X-API-Key", self.key.as_str()));
        }
        self.req_raw(method, path, &h, body)
    }

    /// A request with exactly these headers.
    fn req_raw(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        let r = self.d.request(method, path, headers, body);
        self.scan(&r.body, &format!("{method} {path}"));
        r
    }

    fn health(&self) -> Value {
        self.d.get("/healthz").json()
    }

    fn counter(&self, name: &str) -> u64 {
        self.health()["counters"][name].as_u64().unwrap()
    }

    /// POST /execute; retries 429s (rate limit or capacity) for up to 30 s.
    fn exec_body(&self, body: &Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = self.req(
                "POST",
                "/execute",
                &[("Content-Type", "application/json")],
                body.to_string().as_bytes(),
            );
            if r.status == 429 && Instant::now() < deadline {
                let wait = r
                    .header("retry-after")
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(1)
                    .min(5);
                std::thread::sleep(Duration::from_millis(100 + wait * 1000 / 4));
                continue;
            }
            assert_eq!(r.status, 200, "execute {body}: {}", r.text());
            return r.json();
        }
    }

    fn exec(&self, code: &str, limits: Value) -> Value {
        self.exec_body(&json!({"language": PY, "network": false, "code": code, "limits": limits}))
    }

    /// Runs `code` while polling the run cgroups; returns the result, every host process
    /// seen in them, and the request's wall time.
    fn exec_watched(&self, code: &str, limits: Value) -> (Value, HashSet<(u32, u64)>, Duration) {
        let instance = self.d.instance.clone();
        std::thread::scope(|s| {
            let t0 = Instant::now();
            let h = s.spawn(|| self.exec(code, limits));
            let mut seen = HashSet::new();
            while !h.is_finished() {
                seen.extend(run_cgroup_procs(&instance));
                std::thread::sleep(Duration::from_millis(20));
            }
            let r = h.join().unwrap();
            (r, seen, t0.elapsed())
        })
    }

    /// Waits until nothing of any run is left; a finding (not a panic) otherwise.
    fn settle_clean(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let h = self.health();
            let left = self.d.leftovers();
            if h["inFlight"] == 0 && left.is_empty() {
                return true;
            }
            if Instant::now() > deadline {
                self.finding(format!("I2: left behind: {left:?}; health {h}"));
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// I1–I4 and I6, then SIGTERM; panics with every finding of the test.
    fn finish(self) {
        self.finish_with(4 << 20);
    }

    /// As `finish`, with the RSS slack a case's own criterion allows.
    fn finish_with(self, rss_slack: u64) {
        let pid = self.pid();
        // I1: liveness and a canary run.
        let t0 = Instant::now();
        let h = self.d.get("/healthz");
        let took = t0.elapsed();
        self.expect(h.status == 200 && took < Duration::from_secs(1), || {
            format!("I1: /healthz {} in {took:?}", h.status)
        });
        let t0 = Instant::now();
        let r = self.exec("print(1)", json!({}));
        let took = t0.elapsed();
        self.expect(r["run"]["stdout"] == "1\n", || {
            format!("I1: canary run {r}")
        });
        let bound = self.warm * 2 + Duration::from_secs(1);
        self.expect(took <= bound, || {
            format!(
                "I1: canary took {took:?}, over 2 × warm-up ({:?}) + 1 s",
                self.warm
            )
        });
        // I2: nothing left, no zombies.
        self.settle_clean(Duration::from_secs(20));
        let z = zombie_children(pid);
        self.expect(z == 0, || format!("I2: {z} zombie children of the daemon"));
        // I3: fds and RSS back within the baseline (polled: teardown is asynchronous).
        let fd_max = self.base_fds + self.base_fds / 10 + 2;
        let rss_max = self.base_rss + self.base_rss / 10 + rss_slack;
        let deadline = Instant::now() + Duration::from_secs(5);
        let (fds, rss) = loop {
            let (f, r) = (fd_count(pid), rss_bytes(pid));
            if (f <= fd_max && r <= rss_max) || Instant::now() > deadline {
                break (f, r);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        self.expect(fds <= fd_max, || {
            format!("I3: daemon has {fds} fds, baseline {}", self.base_fds)
        });
        self.expect(rss <= rss_max, || {
            format!(
                "I3: daemon RSS {} KiB, baseline {} KiB (+10 % + {} KiB slack)",
                rss / 1024,
                self.base_rss / 1024,
                rss_slack / 1024
            )
        });
        // I4: the host canary is untouched.
        let sha = sha256_file(&self.canary_file);
        self.expect(sha == self.canary_sha, || {
            "I4: host canary file changed".to_string()
        });
        // I6: no key or canary in the log.
        let log = self.d.log();
        for s in self.secrets.lock().unwrap().iter() {
            self.expect(!log.contains(s.as_str()), || {
                format!("I6: the daemon log contains the secret {s:?}")
            });
        }
        let Adv { d, findings, .. } = self;
        d.stop();
        let findings = findings.into_inner().unwrap();
        assert!(
            findings.is_empty(),
            "{} finding(s):\n- {}",
            findings.len(),
            findings.join("\n- ")
        );
    }
}

fn run_of(r: &Value) -> &Value {
    &r["run"]
}

// ---------------------------------------------------------------------------------------
// R: resource exhaustion and process control
// ---------------------------------------------------------------------------------------

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
/// documented 1 s boot grace), and none of its host processes survives, stopped or not.
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
    // WALL here is wallTimeMs + the 1 s boot grace; the catalogue allows ± 1 s.
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

// ---------------------------------------------------------------------------------------
// H: the HTTP server
// ---------------------------------------------------------------------------------------

/// H2, H3, H4, H5, H7: the framing variants the conformance suite does not send. Each
/// gets exactly one error response (400, or 501 for an unknown coding), JSON, with
/// `Connection: close`, and the connection is closed.
#[test]
fn test_h2_h3_h4_h5_h7_framing_edge_cases() {
    let a = Adv::start("hframe", &[]);
    let p = format!(
        "POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {}\r\n",
        a.key
    );
    let mut cases: Vec<(&str, Vec<u8>, &[u16])> = vec![
        (
            "H2 identical repeated CL",
            format!("{p}Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello").into_bytes(),
            &[400],
        ),
        (
            "H2 CL list 5, 5",
            format!("{p}Content-Length: 5, 5\r\n\r\nhello").into_bytes(),
            &[400],
        ),
    ];
    for v in ["-1", "0x10", "5a", "1_0", "foo", ""] {
        cases.push((
            "H3 Content-Length",
            format!("{p}Content-Length: {v}\r\n\r\nhello").into_bytes(),
            &[400],
        ));
    }
    for v in [
        &b"xchunked"[..],
        b"chunked\x0b",
        b"identity",
        b"chunked, chunked",
    ] {
        let mut req = format!("{p}Transfer-Encoding: ").into_bytes();
        req.extend_from_slice(v);
        req.extend_from_slice(b"\r\n\r\n0\r\n\r\n");
        cases.push(("H4 Transfer-Encoding", req, &[400, 501]));
    }
    let te = format!("{p}Transfer-Encoding: chunked\r\n\r\n");
    cases.push((
        "H5 missing final chunk",
        format!("{te}1\r\nZ\r\n\r\n\r\nGET /sneaky HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes(),
        &[400],
    ));
    cases.push((
        "H5 1 MiB extension",
        format!("{te}1;{}\r\nZ\r\n0\r\n\r\n", "a".repeat(1 << 20)).into_bytes(),
        &[400],
    ));
    cases.push((
        "H5 LF in extension",
        format!("{te}1;a\nb\r\nZ\r\n0\r\n\r\n").into_bytes(),
        &[400],
    ));
    let trailers: String = (0..10_000).map(|i| format!("T{i}: 1\r\n")).collect();
    cases.push((
        "H5 10000 trailers",
        format!("{te}1\r\nZ\r\n0\r\n{trailers}\r\n").into_bytes(),
        &[400, 431],
    ));
    cases.push((
        "H7 CR in a value",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n".to_vec(),
        &[400],
    ));
    for (label, bytes, want) in cases {
        let (rs, closed) = raw_send(a.addr(), &bytes, Duration::from_secs(5));
        for r in &rs {
            a.scan(&r.body, label);
        }
        a.expect(rs.len() == 1, || {
            format!(
                "{label}: {} responses, want exactly one: {:?}",
                rs.len(),
                rs.iter().map(|r| r.status).collect::<Vec<_>>()
            )
        });
        if let Some(r) = rs.first() {
            a.expect(want.contains(&r.status), || {
                format!("{label}: {} {}", r.status, r.text())
            });
            a.expect(r.header("connection") == Some("close"), || {
                format!("{label}: not Connection: close")
            });
            let j: Option<Value> = serde_json::from_slice(&r.body).ok();
            a.expect(j.as_ref().is_some_and(|j| j["error"].is_string()), || {
                format!("{label}: body {}", r.text())
            });
        }
        a.expect(closed, || format!("{label}: connection left open"));
        a.expect(a.d.get("/healthz").status == 200, || {
            format!("{label}: daemon unhealthy after")
        });
    }
    a.expect(a.counter("runsTotal") == 1, || {
        "a malformed request started a run".into()
    });
    a.finish();
}

/// H8: a 1 MiB header line and 10,000 headers: 431 and closed; 100 connections each
/// holding 15 KiB of an unfinished head: the daemon buffers about the head cap each.
#[test]
fn test_h8_oversized_heads_431_and_close() {
    let a = Adv::start("h8", &[]);
    let big = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let mut many = String::from("GET /healthz HTTP/1.1\r\nHost: x\r\n");
    for i in 0..10_000 {
        many.push_str(&format!("X-{i}: 1\r\n"));
    }
    many.push_str("\r\n");
    for (label, req) in [("1 MiB header", big), ("10000 headers", many)] {
        let (rs, closed) = raw_send(a.addr(), req.as_bytes(), Duration::from_secs(10));
        a.expect(rs.len() == 1 && rs[0].status == 431, || {
            format!(
                "H8 {label}: {:?}",
                rs.iter().map(|r| r.status).collect::<Vec<_>>()
            )
        });
        a.expect(closed, || format!("H8 {label}: connection not closed"));
    }
    let rss0 = rss_bytes(a.pid());
    let n = 100;
    let mut held = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(a.addr()).unwrap();
        s.write_all(
            format!(
                "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {}",
                "a".repeat(15 * 1024)
            )
            .as_bytes(),
        )
        .unwrap();
        held.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let grown = rss_bytes(a.pid()).saturating_sub(rss0);
    // Per connection: the 16 KiB head cap, rounded up to the 64 KiB read-ahead buffer.
    let bound = n as u64 * (64 << 10) + (2 << 20);
    a.expect(grown <= bound, || {
        format!(
            "H8: {n} unfinished heads grew the daemon by {} KiB (bound {} KiB)",
            grown / 1024,
            bound / 1024
        )
    });
    drop(held);
    a.finish();
}

/// H8, the URI: a 100 KiB request target is 414 (catalogue and RFC 9112 §3.2), then
/// closed.
#[test]
fn test_h8_100kib_uri_is_414() {
    let a = Adv::start("h8uri", &[]);
    let req = format!(
        "GET /{} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let (rs, closed) = raw_send(a.addr(), req.as_bytes(), Duration::from_secs(10));
    let statuses: Vec<u16> = rs.iter().map(|r| r.status).collect();
    a.expect(statuses == [414], || {
        format!(
            "H8: 100 KiB URI answered {statuses:?} {:?}, want [414]",
            rs.first().map(|r| r.text())
        )
    });
    a.expect(closed, || "H8: connection not closed".into());
    a.finish();
}

/// H11, the body half: the catalogue's `Content-Length: 1000000` is refused at once (over
/// the 256 KiB /execute cap); a body within the cap trickled at 1 byte/s gets 408 at the
/// body deadline (ISOBOX_HEAD_TIMEOUT_MS), the connection closes, no run was started.
/// The body deadline is an idle timeout re-armed by progress, so it is set to 800 ms:
/// with exactly 1000 ms against one byte a second, each byte races the timer (measured:
/// a 408 after 1 s, after 7 s, or none in 8 s).
#[test]
fn test_h11_slow_body_gets_408() {
    let a = Adv::start("h11body", &[("ISOBOX_HEAD_TIMEOUT_MS", "800")]);
    let key = a.key.clone();
    let t0 = Instant::now();
    let (rs, closed) = raw_send(
        a.addr(),
        format!("POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Length: 1000000\r\n\r\n{{").as_bytes(),
        Duration::from_secs(5),
    );
    a.expect(
        rs.len() == 1 && rs[0].status == 400 && closed && t0.elapsed() < Duration::from_secs(2),
        || {
            format!(
                "H11 CL 1000000: {:?} closed={closed}",
                rs.iter().map(|r| (r.status, r.text())).collect::<Vec<_>>()
            )
        },
    );
    let mut s = TcpStream::connect(a.addr()).unwrap();
    s.write_all(format!("POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Length: 100000\r\n\r\n").as_bytes()).unwrap();
    let mut w = s.try_clone().unwrap();
    let t0 = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let trickle = std::thread::spawn(move || {
        while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
            if w.write_all(b"{").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let (buf, closed) = read_until_close(&mut s, Duration::from_secs(8));
    let took = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = s.shutdown(std::net::Shutdown::Both);
    let _ = trickle.join();
    let rs = parse_all(buf);
    a.expect(rs.len() == 1 && rs[0].status == 408, || {
        format!(
            "H11: trickled body answered {:?} after {took:?}",
            rs.iter().map(|r| r.status).collect::<Vec<_>>()
        )
    });
    a.expect(closed && took < Duration::from_secs(2), || {
        format!("H11: closed={closed} after {took:?}, want about 0.8 s")
    });
    let h = a.health();
    a.expect(
        h["inFlight"] == 0 && h["counters"]["runsTotal"] == 1,
        || format!("H11: {h}"),
    );
    a.finish();
}

/// H11, the head half: one address holding the whole connection cap with trickled heads
/// must not lock out other clients (the catalogue's per-IP cap; "requests from 127.0.0.2
/// served normally"); each trickled head is cut at the total head deadline.
#[test]
fn test_h11_slowloris_from_one_ip_does_not_lock_out_others() {
    let a = Adv::start(
        "h11loris",
        &[
            ("ISOBOX_MAX_CONNECTIONS", "100"),
            ("ISOBOX_MAX_CONNECTIONS_PER_IP", "50"),
            ("ISOBOX_HEAD_TIMEOUT_MS", "4000"),
        ],
    );
    let n = 100;
    let mut socks: Vec<TcpStream> = (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(a.addr()).unwrap();
            let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a");
            s
        })
        .collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let other = curl_from("127.0.0.2", &format!("http://{}/healthz", a.addr()), &[]);
    a.expect(other == 200, || {
        format!("H11: with {n} slow heads from 127.0.0.1 open, 127.0.0.2 got {other} (no per-IP connection cap)")
    });
    // Trickle a byte per second on every socket; each must still close by the 4 s total.
    let mut open = n;
    let deadline = t0 + Duration::from_secs(8);
    while open > 0 && Instant::now() < deadline {
        open = 0;
        for s in socks.iter_mut() {
            if s.write_all(b"a").is_err() {
                continue;
            }
            s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            let mut b = [0u8; 512];
            match s.read(&mut b) {
                Ok(0) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                _ => open += 1,
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let took = t0.elapsed();
    a.expect(open == 0, || {
        format!("H11: {open} trickled heads still open after {took:?}")
    });
    a.expect(took < Duration::from_secs(7), || {
        format!("H11: heads cut after {took:?}, deadline 4 s")
    });
    drop(socks);
    std::thread::sleep(Duration::from_millis(300));
    let other = curl_from("127.0.0.2", &format!("http://{}/healthz", a.addr()), &[]);
    a.expect(other == 200, || {
        format!("H11: 127.0.0.2 got {other} after the heads closed")
    });
    a.finish();
}

/// A helper in Python (the tests' stdlib client): `n` sockets with a 4 KiB receive
/// buffer post BODY with KEY (as SSE or JSON), print "sent", never read, and close after
/// HOLD s.
const NON_READER: &str = r#"
import socket, sys, time
host, port, mode, n, hold, body, key = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6].encode(), sys.argv[7].encode()
socks = []
for _ in range(n):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, port))
    acc = b"Accept: text/event-stream\r\n" if mode == "sse" else b""
    s.sendall(b"POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: " + key + b"\r\n" + acc + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    socks.append(s)
print("sent", flush=True)
time.sleep(hold)
"#;

/// H12: clients that never read. SSE: the daemon queues a bounded amount, drops each
/// stalled stream after the write timeout (ISOBOX_IDLE_TIMEOUT_MS) and cancels its run;
/// RSS stays flat. JSON: a response is at most ~3 MB (2 × 256 KiB of control bytes,
/// escaped ×6); the catalogue bounds what the daemon buffers per connection at ~1 MiB.
#[test]
fn test_h12_non_reading_clients_bounded_memory() {
    let a = Adv::start(
        "h12",
        &[
            ("ISOBOX_IDLE_TIMEOUT_MS", "3000"),
            ("ISOBOX_HEAD_TIMEOUT_MS", "2000"),
        ],
    );
    let pid = a.pid();
    let n = 4usize;
    let phase = |mode: &str, code: &str| -> (u64, bool) {
        let body = json!({"language": PY, "network": false, "code": code, "limits": {"outputBytes": 262144, "wallTimeMs": 20000}});
        let rss0 = rss_bytes(pid);
        let fds0 = fd_count(pid);
        let mut child = Command::new("/usr/bin/python3")
            .args([
                "-c",
                NON_READER,
                &a.addr().ip().to_string(),
                &a.addr().port().to_string(),
                mode,
                &n.to_string(),
                "11",
                &body.to_string(),
                &a.key,
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut BufReader::new(child.stdout.take().unwrap()), &mut line)
            .unwrap();
        let t0 = Instant::now();
        let mut peak = 0u64;
        let mut dropped = false;
        while t0.elapsed() < Duration::from_secs(10) {
            peak = peak.max(rss_bytes(pid).saturating_sub(rss0));
            if t0.elapsed() > Duration::from_secs(1)
                && fd_count(pid) <= fds0
                && a.health()["inFlight"] == 0
            {
                dropped = true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.wait();
        a.settle_clean(Duration::from_secs(20));
        (peak, dropped)
    };
    // SSE: 240 KiB per stream (under the cap, so it is all streamed), then silence.
    let sse_code = "import sys,time\nfor _ in range(60):\n sys.stdout.write('\\x01'*4096); sys.stderr.write('\\x01'*4096)\nsys.stdout.flush(); sys.stderr.flush(); time.sleep(30)";
    let cancelled0 = a.counter("runsCancelled");
    let (sse_peak, sse_dropped) = phase("sse", sse_code);
    let cancelled = a.counter("runsCancelled") - cancelled0;
    eprintln!("H12: SSE non-readers grew RSS by {} KiB", sse_peak / 1024);
    let sse_bound = n as u64 * (320 << 10) + (4 << 20);
    a.expect(sse_peak <= sse_bound, || {
        format!(
            "H12 SSE: {n} stalled streams grew RSS by {} KiB (bound {} KiB)",
            sse_peak / 1024,
            sse_bound / 1024
        )
    });
    a.expect(sse_dropped && cancelled == n as u64, || {
        format!("H12 SSE: stalled streams not dropped at the write timeout (dropped={sse_dropped}, runs cancelled {cancelled})")
    });
    // JSON: 2 × 256 KiB of \x01 per run.
    let json_code = "import sys\nfor _ in range(64):\n sys.stdout.write('\\x01'*4096); sys.stderr.write('\\x01'*4096)";
    let runs0 = a.counter("runsTotal");
    let (json_peak, json_dropped) = phase("json", json_code);
    let ran = a.counter("runsTotal") - runs0;
    a.expect(ran == n as u64, || {
        format!("H12 JSON: {ran} of {n} runs ran")
    });
    eprintln!("H12: JSON non-readers grew RSS by {} KiB", json_peak / 1024);
    // Each response is ~3 MB once escaped; it is encoded as the socket drains, so a
    // connection holds the raw outputs (2 × 256 KiB) and one 128 KiB window: the
    // catalogue's ~1 MiB per connection. (Buffered whole, these 4 took 16-17 MiB.)
    let json_bound = n as u64 * (1 << 20) + (4 << 20);
    a.expect(json_peak <= json_bound, || {
        format!("H12 JSON: {n} clients not reading ~3 MB responses grew the daemon's RSS by {} KiB (bound {n} × 1 MiB + 4 MiB = {} KiB)", json_peak / 1024, json_bound / 1024)
    });
    a.expect(json_dropped, || {
        "H12 JSON: stalled connections not dropped at the write timeout".into()
    });
    a.finish_with(8 << 20);
}

/// H13 beyond the small case: a pipelined request behind a response larger than the
/// 256 KiB write buffer, and 1000 pipelined health checks, are all answered in order.
#[test]
fn test_h13_pipelined_requests_behind_large_responses_answered() {
    let a = Adv::start("h13", &[("ISOBOX_IDLE_TIMEOUT_MS", "3000")]);
    let key = a.key.clone();
    let body = json!({"language": PY, "network": false, "code": "import sys\nsys.stdout.write('x'*262144); sys.stderr.write('y'*262144)", "limits": {"outputBytes": 262144}}).to_string();
    let req = format!(
        "POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Length: {}\r\n\r\n{body}GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let (rs, _) = raw_send(a.addr(), req.as_bytes(), Duration::from_secs(10));
    let statuses: Vec<u16> = rs.iter().map(|r| r.status).collect();
    a.expect(statuses == [200, 200], || {
        format!("H13: /execute (~530 KB response) then GET /healthz pipelined: answered {statuses:?}, want [200, 200]")
    });
    let mut many = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".repeat(999);
    many.push_str("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let (rs, _) = raw_send(a.addr(), many.as_bytes(), Duration::from_secs(8));
    a.expect(
        rs.len() == 1000 && rs.iter().all(|r| r.status == 200),
        || format!("H13: 1000 pipelined GET /healthz: {} answered", rs.len()),
    );
    std::thread::sleep(Duration::from_secs(3)); // stalled connections time out
    a.finish();
}

/// H14: idle connections up to the cap (the next one gets 503 and is closed), then past
/// the daemon's fd limit (EMFILE in accept): the daemon does not spin meanwhile, and
/// serves /healthz within 1 s once they are closed.
#[test]
fn test_h14_idle_connections_at_cap_and_emfile() {
    let a = Adv::start("h14", &[("ISOBOX_MAX_CONNECTIONS", "200")]);
    let pid = a.pid();
    let healthz_after_release = |a: &Adv| {
        let t0 = Instant::now();
        loop {
            let ok = TcpStream::connect(a.addr()).ok().and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .ok()?;
                read_response(&mut BufReader::new(s), false)
            });
            if ok.is_some_and(|r| r.status == 200) || t0.elapsed() > Duration::from_secs(5) {
                return t0.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Up to the cap.
    let held: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(a.addr()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (rs, closed) = raw_send(a.addr(), b"", Duration::from_secs(3));
    a.expect(rs.len() == 1 && rs[0].status == 503 && closed, || {
        format!(
            "H14: connection 201 got {:?} closed={closed}",
            rs.iter().map(|r| r.status).collect::<Vec<_>>()
        )
    });
    let c0 = cpu_secs(pid);
    std::thread::sleep(Duration::from_secs(3));
    let spent = cpu_secs(pid) - c0;
    a.expect(spent < 0.3, || {
        format!("H14: daemon used {spent:.2} s CPU holding 200 idle connections for 3 s")
    });
    drop(held);
    let took = healthz_after_release(&a);
    a.expect(took < Duration::from_secs(1), || {
        format!("H14: /healthz {took:?} after release")
    });
    // Past the fd limit: lower the daemon's soft RLIMIT_NOFILE to 64, open 164.
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    let (soft, hard) = (f[3].to_string(), f[4].to_string());
    let set = |s: &str| {
        let ok = Command::new("prlimit")
            .args(["--pid", &pid.to_string(), &format!("--nofile={s}:{hard}")])
            .status()
            .unwrap()
            .success();
        assert!(ok, "prlimit");
    };
    set("64");
    let held: Vec<TcpStream> = (0..164)
        .map(|_| TcpStream::connect(a.addr()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let c0 = cpu_secs(pid);
    std::thread::sleep(Duration::from_secs(3));
    let spent = cpu_secs(pid) - c0;
    a.expect(spent < 0.5, || {
        format!("H14: daemon used {spent:.2} s CPU in 3 s at EMFILE (accept loop spinning?)")
    });
    drop(held);
    let took = healthz_after_release(&a);
    set(&soft);
    a.expect(took < Duration::from_secs(1), || {
        format!("H14: /healthz {took:?} after the EMFILE flood was released")
    });
    a.finish();
}

// ---------------------------------------------------------------------------------------
// A: auth, rate limits, secrets
// ---------------------------------------------------------------------------------------

/// A1: missing and malformed credentials are 401 with `WWW-Authenticate: Bearer` on
/// both protected routes, and spawn no sandbox. (Documented acceptances, not failures:
/// `bearer <key>` — the scheme is case-insensitive, RFC 6750 — and a key followed by
/// optional whitespace, which RFC 9110 §5.5 strips; a NUL inside is a 400.)
#[test]
fn test_a1_bad_credentials_401_and_no_sandbox() {
    let a = Adv::start("a1", &[]);
    let key = a.key.clone();
    let runs0 = a.counter("runsTotal");
    let body = json!({"language": PY, "network": false, "code": "print(7)"}).to_string();
    let cases: Vec<Vec<(String, String)>> = vec![
        vec![],
        vec![("Authorization".into(), "Bearer ".into())],
        vec![("Authorization".into(), format!("Bearer {key} x"))],
        vec![("Authorization".into(), format!("Bearer  {key}"))],
        vec![("Authorization".into(), key.clone())],
        vec![("Authorization".into(), format!("Basic {key}"))],
        vec![("Authorization".into(), format!("Token {key}"))],
        vec![("X-API-Key".into(), String::new())],
        vec![("X-API-Key".into(), key[..key.len() - 1].to_string())],
        vec![("X-API-Key".into(), format!("{key}x"))],
        vec![("X-API-Key".into(), key.to_uppercase())],
        vec![("X-API-Key".into(), format!("Bearer {key}"))],
    ];
    for h in &cases {
        let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        for (m, p, b) in [
            ("POST", "/execute", body.as_bytes()),
            ("GET", "/runtimes", &b""[..]),
        ] {
            let r = a.req_raw(m, p, &hs, b);
            a.expect(
                r.status == 401
                    && r.header("www-authenticate") == Some("Bearer")
                    && r.json() == json!({"error": "unauthorized"}),
                || {
                    format!(
                        "A1 {m} {p} with {h:?}: {} {:?} {}",
                        r.status,
                        r.header("www-authenticate"),
                        r.text()
                    )
                },
            );
        }
    }
    let nul = format!("{key}\0");
    let r = a.req_raw(
        "POST",
        "/execute",
        &[("X-API-Key", nul.as_str())],
        body.as_bytes(),
    );
    a.expect(r.status == 400 || r.status == 401, || {
        format!("A1 key+NUL: {}", r.status)
    });
    // The documented acceptances.
    for (h, v) in [
        ("Authorization", format!("bearer {key}")),
        ("X-API-Key", format!("{key} ")),
    ] {
        let r = a.req_raw("GET", "/runtimes", &[(h, v.as_str())], b"");
        a.expect(r.status == 200, || {
            format!("A1 {h}: {v:?} refused: {}", r.status)
        });
    }
    a.expect(a.counter("runsTotal") == runs0, || {
        "A1: a refused request spawned a sandbox".into()
    });
    a.finish();
}

// ---------------------------------------------------------------------------------------
// A2's statistics: a seeded generator, Spearman's rank correlation.
// ---------------------------------------------------------------------------------------

/// splitmix64: the test's random numbers (seeded from /dev/urandom, the seed printed).
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        Rng(u64::from_str_radix(&random_hex(8), 16).unwrap())
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (the modulo bias of a 64-bit draw is far below anything here).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// Ranks from 1; tied values share the mean of the ranks they span.
fn average_ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut ranks = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let mean = (i + j) as f64 / 2.0 + 1.0;
        for &t in &idx[i..=j] {
            ranks[t] = mean;
        }
        i = j + 1;
    }
    ranks
}

/// Pearson's correlation; NaN when either series is constant (so `|ρ| < x` fails).
fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    sxy / (sxx * syy).sqrt()
}

/// Spearman's ρ: Pearson's correlation of the average ranks (the tie-corrected form).
fn spearman(x: &[f64], y: &[f64]) -> f64 {
    assert_eq!(x.len(), y.len());
    pearson(&average_ranks(x), &average_ranks(y))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The statistic must be able to fail: exact values (one with ties, checked against
/// scipy.stats.spearmanr), ±1 for monotone series, ≈ 0 for a shuffled one.
fn check_spearman(rng: &mut Rng) {
    let r = spearman(&[1.0, 2.0, 2.0, 3.0], &[1.0, 3.0, 2.0, 4.0]);
    assert!((r - 0.948_683_298_050_513_8).abs() < 1e-12, "ties: {r}");
    let x: Vec<f64> = (0..10_000).map(f64::from).collect();
    let cubes: Vec<f64> = x.iter().map(|v| v * v * v).collect();
    let back: Vec<f64> = x.iter().rev().copied().collect();
    assert!((spearman(&x, &cubes) - 1.0).abs() < 1e-9, "monotone");
    assert!((spearman(&x, &back) + 1.0).abs() < 1e-9, "reversed");
    // 41 tied groups (as many as A2's prefix lengths) against a monotone series.
    let grouped: Vec<f64> = x.iter().map(|v| (v / 244.0).floor()).collect();
    assert!(spearman(&grouped, &x) > 0.99, "tied groups");
    let mut shuffled = x.clone();
    rng.shuffle(&mut shuffled);
    let r = spearman(&x, &shuffled);
    // Under independence ρ is ~N(0, 1/√9999): |ρ| ≥ 0.05 is a 5σ event.
    assert!(r.abs() < 0.05, "shuffled: {r}");
    assert!(spearman(&x, &[1.0; 10_000]).is_nan(), "constant");
}

/// A2's wrong keys for `key`: for each, `k` leading bytes shared with the key, then a
/// differing byte, then random bytes to a total length `len`. Half have the key's own
/// length (where a length-first comparison would go on to compare bytes), the others a
/// length uniform in 1..=2·len(key); `k` is uniform in 0..=min(len, len(key)), never
/// the key itself. Returns (key, k, len).
fn prefix_keys(key: &str, n: usize, rng: &mut Rng) -> Vec<(String, usize, usize)> {
    let alphabet = b"0123456789abcdefghijklmnopqrstuvwxyz-";
    let real = key.as_bytes();
    let kl = real.len();
    (0..n)
        .map(|_| {
            let len = if rng.below(2) == 0 {
                kl
            } else {
                1 + rng.below(2 * kl)
            };
            let k = rng.below(len.min(kl) + 1 - usize::from(len == kl));
            let mut b = real[..k].to_vec();
            while b.len() < len {
                let c = alphabet[rng.below(alphabet.len())];
                if b.len() == k && b.len() < kl && c == real[k] {
                    continue;
                }
                b.push(c);
            }
            (String::from_utf8(b).unwrap(), k, len)
        })
        .collect()
}

/// Latency with the length's own cost taken out: each sample minus the median of every
/// sample of the same key length. The attacker picks the length, so a length-dependent
/// cost (SHA-256 blocks, bytes parsed) is no leak — and `k` depends on the length (a
/// key cannot share more bytes than it has), so without this a length cost would show
/// as a trend in `k`.
fn length_residuals(lat: &[f64], lens: &[usize]) -> Vec<f64> {
    let mut by_len: std::collections::HashMap<usize, Vec<f64>> = Default::default();
    for (&t, &l) in lat.iter().zip(lens) {
        by_len.entry(l).or_default().push(t);
    }
    let med: std::collections::HashMap<usize, f64> = by_len
        .into_iter()
        .map(|(l, mut v)| (l, median(&mut v)))
        .collect();
    lat.iter().zip(lens).map(|(t, l)| t - med[l]).collect()
}

/// What the design can see: the smallest injected leak of `d` ns per shared byte (added
/// to the measured latencies) that pushes ρ to 0.05 — the test's sensitivity.
fn detectable_leak_ns(ks: &[f64], resid: &[f64]) -> f64 {
    let mut d = 0.001;
    while d < 1e7 {
        let y: Vec<f64> = resid.iter().zip(ks).map(|(t, k)| t + d * k).collect();
        if spearman(ks, &y) >= 0.05 {
            return d;
        }
        d *= 1.25;
    }
    f64::INFINITY
}

/// Times `f` on every key in-process: 16 calls a sample, `reps` samples a key, each
/// round in a fresh random order; returns each key's median time per call (ns). Every
/// key must be refused.
fn time_calls(keys: &[&str], reps: usize, rng: &mut Rng, f: impl Fn(&str) -> bool) -> Vec<f64> {
    let mut samples: Vec<Vec<f64>> = keys.iter().map(|_| Vec::with_capacity(reps)).collect();
    for _ in 0..reps {
        let mut order: Vec<usize> = (0..keys.len()).collect();
        rng.shuffle(&mut order);
        for i in order {
            let k = std::hint::black_box(keys[i]);
            let t = Instant::now();
            for _ in 0..16 {
                assert!(!std::hint::black_box(f(k)), "a wrong key was accepted: {k}");
            }
            samples[i].push(t.elapsed().as_nanos() as f64 / 16.0);
        }
    }
    samples.iter_mut().map(|v| median(v)).collect()
}

/// A2: 10,000 wrong keys sharing 0…len(key) leading bytes with the configured key, at
/// varied lengths, on `/runtimes` (key-checked, not rate limited) over one keep-alive
/// loopback connection. Every key is sent 5 times, each round in a fresh random order
/// (so drift and neighbours' load cannot line up with `k`); a key's latency is the
/// median of its 5 (request written → whole response read). Every answer is 401; the
/// Spearman correlation between `k` and the latency (less its length's median, see
/// `length_residuals`) is |ρ| < 0.05. The same criterion holds for
/// `isobox::admission::keys::find` timed in-process. The statistic is checked to be
/// able to fail: exact values, ±1 for monotone series, a leak the size of the measured
/// jitter injected into the measured data is detected, and an early-exit byte-by-byte
/// comparison timed in-process the same way fails the criterion.
#[test]
fn test_a2_key_check_latency_has_no_prefix_trend() {
    const N: usize = 10_000;
    const REPS: usize = 5;
    let mut rng = Rng::seeded();
    eprintln!("A2: seed {:#x}", rng.0);
    check_spearman(&mut rng);
    let a = Adv::start("a2", &[]);
    let runs0 = a.counter("runsTotal");
    let keys = prefix_keys(&a.key, N, &mut rng);
    for (k, ..) in keys.iter().filter(|(k, ..)| k.len() >= 16).take(20) {
        a.add_secret(k);
    }
    let ks: Vec<f64> = keys.iter().map(|&(_, k, _)| k as f64).collect();
    let lens: Vec<usize> = keys.iter().map(|&(_, _, l)| l).collect();
    let reqs: Vec<Vec<u8>> = keys
        .iter()
        .map(|(k, ..)| {
            format!("GET /runtimes HTTP/1.1\r\nHost: x\r\nX-API-Key: {k}\r\n\r\n").into_bytes()
        })
        .collect();
    let s = TcpStream::connect(a.addr()).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut send = |req: &[u8]| -> (Duration, Resp) {
        let t0 = Instant::now();
        w.write_all(req).unwrap();
        let resp = read_response(&mut r, false).expect("A2: no response");
        (t0.elapsed(), resp)
    };
    for req in reqs.iter().take(2000) {
        send(req); // warm-up: connection, caches, the CPU's frequency
    }
    let t0 = Instant::now();
    let mut samples: Vec<Vec<f64>> = (0..N).map(|_| Vec::with_capacity(REPS)).collect();
    let mut bad = Vec::new();
    for _ in 0..REPS {
        let mut order: Vec<usize> = (0..N).collect();
        rng.shuffle(&mut order);
        for i in order {
            let (took, resp) = send(&reqs[i]);
            samples[i].push(took.as_nanos() as f64);
            if resp.status != 401 || resp.header("www-authenticate").is_none() {
                bad.push(format!("{} {}", resp.status, resp.text()));
            }
            a.scan(&resp.body, "A2 request");
        }
    }
    let wire_took = t0.elapsed();
    a.expect(bad.is_empty(), || {
        format!(
            "A2: {} of {} answers not 401 + WWW-Authenticate, e.g. {:?}",
            bad.len(),
            N * REPS,
            bad.first()
        )
    });
    let lat: Vec<f64> = samples.iter_mut().map(|v| median(v)).collect();
    let resid = length_residuals(&lat, &lens);
    let rho = spearman(&ks, &resid);
    let raw = spearman(&ks, &lat);
    let same: Vec<usize> = (0..N).filter(|&i| lens[i] == a.key.len()).collect();
    let rho_same = spearman(
        &same.iter().map(|&i| ks[i]).collect::<Vec<_>>(),
        &same.iter().map(|&i| lat[i]).collect::<Vec<_>>(),
    );
    let mut sorted = lat.clone();
    let med = median(&mut sorted);
    let (p25, p75) = (sorted[N / 4], sorted[3 * N / 4]);
    let leak = detectable_leak_ns(&ks, &resid);
    eprintln!(
        "A2 HTTP: {} requests in {wire_took:?}; latency median {:.1} µs (IQR {:.1}–{:.1}); \
         ρ(k, latency − length median) = {rho:+.4}, raw ρ(k, latency) = {raw:+.4}, \
         ρ among the {} same-length keys = {rho_same:+.4}; detectable: {leak:.1} ns per byte",
        N * REPS,
        med / 1e3,
        p25 / 1e3,
        p75 / 1e3,
        same.len()
    );
    a.expect(rho.abs() < 0.05, || {
        format!("A2: latency trends with the shared prefix over HTTP: Spearman ρ = {rho:+.4}")
    });
    // Power: a leak whose whole range (0 → len(key) bytes) is one interquartile range
    // of the measured jitter must be seen by this very pipeline.
    let d = (p75 - p25) / a.key.len() as f64;
    let injected: Vec<f64> = resid.iter().zip(&ks).map(|(t, k)| t + d * k).collect();
    let seen = spearman(&ks, &injected);
    a.expect(seen >= 0.05, || {
        format!("A2: an injected leak of {d:.0} ns per byte gave only ρ = {seen:+.4}")
    });
    // In-process: `find` itself, with the configured key list the daemon builds.
    let configured = isobox::admission::keys::parse_list(&a.key);
    assert_eq!(configured.len(), 1);
    assert!(isobox::admission::keys::find(&configured, &a.key).is_some());
    let wrong: Vec<&str> = keys.iter().map(|(k, ..)| k.as_str()).collect();
    let t0 = Instant::now();
    let lat = time_calls(&wrong, REPS, &mut rng, |k| {
        isobox::admission::keys::find(std::hint::black_box(&configured), k).is_some()
    });
    let resid = length_residuals(&lat, &lens);
    let rho_fn = spearman(&ks, &resid);
    eprintln!(
        "A2 find: {} samples of 16 calls in {:?}; {:.0} ns a call; ρ(k, time − length \
         median) = {rho_fn:+.4}, raw ρ = {:+.4}; detectable: {:.3} ns per byte",
        N * REPS,
        t0.elapsed(),
        median(&mut lat.clone()),
        spearman(&ks, &lat),
        detectable_leak_ns(&ks, &resid)
    );
    a.expect(rho_fn.abs() < 0.05, || {
        format!("A2: keys::find's time trends with the shared prefix: Spearman ρ = {rho_fn:+.4}")
    });
    // Positive control, timed the same way: an early-exit byte-by-byte comparison of the
    // raw key (the leak A2 is about) must fail the same criterion.
    let real = a.key.as_bytes().to_vec();
    let lat = time_calls(&wrong, REPS, &mut rng, |k| {
        let (x, y) = (std::hint::black_box(real.as_slice()), k.as_bytes());
        for i in 0..x.len().min(y.len()) {
            if std::hint::black_box(x[i]) != y[i] {
                return false;
            }
        }
        x.len() == y.len()
    });
    let rho_leaky = spearman(&ks, &length_residuals(&lat, &lens));
    eprintln!("A2 positive control (early-exit comparison): ρ = {rho_leaky:+.4}");
    a.expect(rho_leaky >= 0.05, || {
        format!("A2: the timing cannot see an early-exit comparison: ρ = {rho_leaky:+.4}")
    });
    a.expect(a.counter("runsTotal") == runs0, || {
        "A2: a sandbox was started".into()
    });
    a.finish();
}

/// A3: two credentials in one request are refused as ambiguous in either order, never
/// "any valid one wins"; a key in the query string counts for nothing.
#[test]
fn test_a3_duplicate_credentials_are_ambiguous() {
    let a = Adv::start("a3", &[]);
    let key = a.key.clone();
    let runs0 = a.counter("runsTotal");
    let body = json!({"language": PY, "network": false, "code": "print(7)"}).to_string();
    let good_bearer = format!("Bearer {key}");
    let pairs: Vec<[(&str, &str); 2]> = vec![
        [
            ("Authorization", good_bearer.as_str()),
            ("Authorization", "Bearer wrong"),
        ],
        [
            ("Authorization", "Bearer wrong"),
            ("Authorization", good_bearer.as_str()),
        ],
        [("X-API-Key", key.as_str()), ("X-API-Key", "wrong")],
        [("X-API-Key", "wrong"), ("X-API-Key", key.as_str())],
        [
            ("X-API-Key", key.as_str()),
            ("Authorization", "Bearer wrong"),
        ],
        [
            ("Authorization", "Bearer wrong"),
            ("X-API-Key", key.as_str()),
        ],
    ];
    for hs in &pairs {
        for (m, p, b) in [
            ("POST", "/execute", body.as_bytes()),
            ("GET", "/runtimes", &b""[..]),
        ] {
            let r = a.req_raw(m, p, hs, b);
            a.expect(
                r.status == 400 && r.json()["error"] == "ambiguous_credentials",
                || format!("A3 {m} {p} with {hs:?}: {} {}", r.status, r.text()),
            );
        }
    }
    // Query-string keys are ignored: alone they are no credential, next to a valid
    // header they change nothing.
    for p in [
        format!("/runtimes?api_key={key}"),
        format!("/runtimes?key={key}&token={key}"),
    ] {
        let r = a.req_raw("GET", &p, &[], b"");
        a.expect(r.status == 401, || format!("A3 {p}: {}", r.status));
    }
    let r = a.req("GET", "/runtimes?api_key=wrong", &[], b"");
    a.expect(r.status == 200, || {
        format!("A3 valid header + wrong query key: {}", r.status)
    });
    a.expect(a.counter("runsTotal") == runs0, || {
        "A3: an ambiguous request spawned a sandbox".into()
    });
    a.finish();
}

/// Pipelines `reqs` on one keep-alive connection (in batches small enough for the
/// daemon's write buffer) and returns every response.
fn pipelined(a: &Adv, reqs: &[String], batch: usize) -> Vec<Resp> {
    let s = TcpStream::connect(a.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut out = Vec::new();
    for chunk in reqs.chunks(batch) {
        w.write_all(chunk.concat().as_bytes()).unwrap();
        for _ in chunk {
            let resp = read_response(&mut r, false).expect("pipelined response");
            a.scan(&resp.body, "pipelined request");
            out.push(resp);
        }
    }
    out
}

/// A5: 10,000 random keys are all 401 (on /runtimes, which is not rate limited); on
/// /execute the limiter answers 429 + Retry-After once the burst is spent, before any
/// key is even compared. No sandbox starts; no tried key reaches the log.
#[test]
fn test_a5_random_keys_all_401_then_rate_limited() {
    let a = Adv::start(
        "a5",
        &[("ISOBOX_RATE_PER_MIN", "600"), ("ISOBOX_RATE_BURST", "50")],
    );
    let runs0 = a.counter("runsTotal");
    let keys: Vec<String> = (0..10_000).map(|_| random_hex(16)).collect();
    for k in keys.iter().take(20) {
        a.add_secret(k);
    }
    let reqs: Vec<String> = keys
        .iter()
        .map(|k| format!("GET /runtimes HTTP/1.1\r\nHost: x\r\nX-API-Key: {k}\r\n\r\n"))
        .collect();
    let rs = pipelined(&a, &reqs, 200);
    let not401 = rs
        .iter()
        .filter(|r| r.status != 401 || r.header("www-authenticate").is_none())
        .count();
    a.expect(rs.len() == 10_000 && not401 == 0, || {
        format!(
            "A5: {} answers, {not401} not 401 + WWW-Authenticate",
            rs.len()
        )
    });
    let reqs: Vec<String> = keys[..300]
        .iter()
        .map(|k| format!("POST /execute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {k}\r\n\r\n"))
        .collect();
    let rs = pipelined(&a, &reqs, 100);
    let s401 = rs.iter().filter(|r| r.status == 401).count();
    let s429: Vec<&Resp> = rs.iter().filter(|r| r.status == 429).collect();
    a.expect(s401 + s429.len() == rs.len(), || {
        "A5: a status other than 401/429".into()
    });
    a.expect((50..=60).contains(&s401) && rs[0].status == 401, || {
        format!("A5: {s401} requests reached the key check, burst is 50")
    });
    a.expect(
        s429.iter()
            .all(|r| r.json()["error"] == "rate_limited" && r.header("retry-after").is_some()),
        || "A5: a 429 without rate_limited/Retry-After".into(),
    );
    a.expect(a.counter("runsTotal") == runs0, || {
        "A5: a sandbox was started".into()
    });
    a.finish();
}

/// A6: without a trusted proxy, X-Forwarded-For is ignored: 1000 requests naming 1000
/// different clients are one client (429 after the burst), naming 127.0.0.2 changes
/// nothing, and the real 127.0.0.2 has its own, untouched bucket.
#[test]
fn test_a6_forwarded_for_untrusted_is_one_client() {
    let a = Adv::start(
        "a6",
        &[("ISOBOX_RATE_PER_MIN", "60"), ("ISOBOX_RATE_BURST", "10")],
    );
    std::thread::sleep(Duration::from_secs(2)); // the warm-up's token comes back
    let key = a.key.clone();
    let reqs: Vec<String> = (0..1000u32)
        .map(|i| format!("POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nX-Forwarded-For: 1.2.{}.{}\r\n\r\n", i / 256, i % 256))
        .collect();
    let rs = pipelined(&a, &reqs, 200);
    let passed = rs.iter().filter(|r| r.status == 400).count();
    let limited = rs.iter().filter(|r| r.status == 429).count();
    a.expect(passed <= 12 && passed + limited == 1000, || {
        format!("A6: {passed} passed, {limited} limited of 1000 spoofed clients (burst 10)")
    });
    let r = a.req(
        "POST",
        "/execute",
        &[("X-Forwarded-For", "127.0.0.2")],
        b"{}",
    );
    a.expect(r.status == 429, || {
        format!(
            "A6: X-Forwarded-For: 127.0.0.2 from 127.0.0.1: {}",
            r.status
        )
    });
    let url = format!("http://{}/execute", a.addr());
    let kh = format!("X-API-Key: {key}");
    for i in 0..5 {
        let st = curl_from(
            "127.0.0.2",
            &url,
            &["-X", "POST", "-d", "{}", "-H", kh.as_str()],
        );
        a.expect(st == 400, || {
            format!("A6: request {i} from 127.0.0.2 got {st}, want 400 (own bucket)")
        });
    }
    std::thread::sleep(Duration::from_millis(1500)); // a token for I1's canary
    a.finish();
}

/// A7: 70,000 distinct clients through a trusted proxy (X-Forwarded-For), past the
/// limiter's 65,536-entry table: RSS grows by less than 50 MB (the case's own bound,
/// which replaces I3's 10 %), one IPv6 /64 is one bucket, and meanwhile the daemon still
/// answers /healthz within I1's 1 s.
#[test]
fn test_a7_forwarded_for_flood_bounded() {
    let a = Adv::start(
        "a7",
        &[
            ("ISOBOX_TRUSTED_PROXIES", "127.0.0.0/8"),
            ("ISOBOX_RATE_PER_MIN", "1"),
            ("ISOBOX_RATE_BURST", "3"),
        ],
    );
    let key = a.key.clone();
    let rss0 = rss_bytes(a.pid());
    let n = 70_000u32;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (rs, worst) = std::thread::scope(|s| {
        let probe = s.spawn(|| {
            let mut worst = Duration::ZERO;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let t0 = Instant::now();
                let r = a.d.get("/healthz");
                assert_eq!(r.status, 200);
                worst = worst.max(t0.elapsed());
                std::thread::sleep(Duration::from_millis(50));
            }
            worst
        });
        let reqs: Vec<String> = (0..n)
            .map(|i| format!("POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nX-Forwarded-For: 10.{}.{}.{}\r\n\r\n", (i >> 16) & 255, (i >> 8) & 255, i & 255))
            .collect();
        let rs = pipelined(&a, &reqs, 800);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (rs, probe.join().unwrap())
    });
    let fresh = rs.iter().filter(|r| r.status == 400).count();
    a.expect(fresh == n as usize, || {
        format!("A7: {fresh} of {n} fresh clients admitted")
    });
    let grown = rss_bytes(a.pid()).saturating_sub(rss0);
    eprintln!(
        "A7: RSS +{} KiB for {n} clients; worst /healthz meanwhile {worst:?}",
        grown / 1024
    );
    a.expect(grown < 50 << 20, || {
        format!("A7: RSS grew {} KiB", grown / 1024)
    });
    let st = |xff: &str| {
        a.req("POST", "/execute", &[("X-Forwarded-For", xff)], b"")
            .status
    };
    let v6: Vec<u16> = [
        "2001:db8:0:1::1",
        "2001:db8:0:1::2",
        "2001:db8:0:1:ffff::3",
        "2001:db8:0:1::4",
    ]
    .iter()
    .map(|x| st(x))
    .collect();
    a.expect(v6 == [400, 400, 400, 429], || {
        format!("A7: one /64 (burst 3): {v6:?}")
    });
    a.expect(st("2001:db8:0:2::1") == 400, || {
        "A7: another /64 shares the bucket".into()
    });
    a.expect(worst < Duration::from_secs(1), || {
        format!("A7: /healthz took {worst:?} while the limiter table was full (each new client past 65,536 costs a full-table sweep on the event loop)")
    });
    a.finish_with(50 << 20);
}

/// A10: the sandbox's environment holds only the documented variables (PATH, LANG,
/// HOME) and the runtime's own; none of the daemon's variable names or values (keys,
/// planted secrets, host paths); the host canary is not reachable by path.
#[test]
fn test_a10_sandbox_environment_has_only_documented_variables() {
    let planted = format!("planted-{}", random_hex(12));
    let a = Adv::start(
        "a10",
        &[
            ("AWS_SECRET_ACCESS_KEY", planted.as_str()),
            ("ISOBOX_WORKERS", "3"),
        ],
    );
    a.add_secret(&planted);
    let canary_path = a.canary_file.display().to_string();
    let r = a.exec(
        &format!("import os, json\nprint(json.dumps(dict(os.environ)))\nprint(open('/proc/self/environ','rb').read())\nprint(open('/proc/1/environ','rb').read())\nprint(os.getcwd(), os.listdir('/'))\ntry: print(open({canary_path:?}).read())\nexcept OSError as e: print('canary', type(e).__name__)"),
        json!({}),
    );
    let out = run_of(&r)["stdout"].as_str().unwrap_or("").to_string();
    let env: serde_json::Map<String, Value> = out
        .lines()
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_default();
    // The runtime's own variables, from its descriptor.
    let desc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/runtimes/python-slim.toml"
    ))
    .unwrap();
    let mut allowed: HashSet<String> = ["PATH", "LANG", "HOME"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let env_block = desc
        .split("env = [")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .unwrap_or("");
    for item in env_block.split('"').skip(1).step_by(2) {
        if let Some((k, _)) = item.split_once('=') {
            allowed.insert(k.to_string());
        }
    }
    for k in env.keys() {
        a.expect(allowed.contains(k), || {
            format!("A10: undocumented variable {k} in the sandbox")
        });
    }
    a.expect(!env.is_empty(), || {
        format!("A10: no environment parsed from {r}")
    });
    let daemon_env = std::fs::read(format!("/proc/{}/environ", a.pid())).unwrap();
    for pair in daemon_env.split(|&b| b == 0).filter(|p| !p.is_empty()) {
        let pair = String::from_utf8_lossy(pair);
        let Some((k, v)) = pair.split_once('=') else {
            continue;
        };
        if allowed.contains(k) {
            continue;
        }
        a.expect(
            !out.contains(&format!("{k}=")) && !env.contains_key(k),
            || format!("A10: the daemon's variable {k} is visible in the sandbox"),
        );
        // Values: skip the documented ones (in the descriptor) and cargo's CARGO_* (set
        // by the test runner, e.g. CARGO_PKG_NAME=isobox, which names the rootfs's
        // own /.isobox directory too).
        if v.len() >= 6 && !desc.contains(v) && !k.starts_with("CARGO_") {
            a.expect(!out.contains(v), || {
                let at = out.find(v).unwrap_or(0);
                let mut lo = at.saturating_sub(60);
                while !out.is_char_boundary(lo) {
                    lo -= 1;
                }
                let mut hi = (at + v.len() + 60).min(out.len());
                while !out.is_char_boundary(hi) {
                    hi += 1;
                }
                let ctx = &out[lo..hi];
                format!("A10: the value of the daemon's {k} ({v:?}) is visible: ...{ctx}...")
            });
        }
    }
    let data_dir = a.d.data_dir.display().to_string();
    for host in [
        data_dir.as_str(),
        "/work/",
        "/root",
        env!("CARGO_MANIFEST_DIR"),
        "/run/isobox",
        "/var/lib/isobox",
    ] {
        a.expect(!out.contains(host), || {
            format!("A10: host path {host} visible in the sandbox")
        });
    }
    a.expect(
        out.contains("canary FileNotFoundError") || out.contains("canary PermissionError"),
        || format!("A10: the host canary path was readable: {r}"),
    );
    a.finish();
}

/// A11: invalid JSON, wrong types, 10 MB bodies (length-delimited and chunked), deep
/// nesting: 400/413 JSON errors with no stack trace, host path or secret; no stack
/// overflow (the daemon keeps serving); no sandbox.
#[test]
fn test_a11_malformed_bodies_get_clean_errors() {
    let a = Adv::start("a11", &[]);
    let key = a.key.clone();
    let canary = a.canary.clone();
    let data_dir = a.d.data_dir.display().to_string();
    let secrets = [key.as_str(), canary.as_str()];
    let runs0 = a.counter("runsTotal");
    let mut bodies: Vec<(String, Vec<u8>)> = vec![
        ("truncated".into(), b"{\"language\":".to_vec()),
        (
            "invalid UTF-8".into(),
            b"{\"language\":\"\xff\xfe\"}".to_vec(),
        ),
        ("NUL".into(), b"{\"language\":\"py\0\"}".to_vec()),
        ("array".into(), b"[]".to_vec()),
        (
            "huge number".into(),
            b"{\"language\":\"python-slim\",\"code\":\"1\",\"limits\":{\"pids\":1e999}}".to_vec(),
        ),
        (
            "deep objects".into(),
            format!("{}1{}", "{\"a\":".repeat(100_000), "}".repeat(100_000)).into_bytes(),
        ),
        ("deep arrays".into(), "[".repeat(100_000).into_bytes()),
        (
            "deep limits".into(),
            format!(
                "{{\"language\":\"python-slim\",\"code\":\"1\",\"limits\":{}1{}}}",
                "[".repeat(50_000),
                "]".repeat(50_000)
            )
            .into_bytes(),
        ),
    ];
    for (field, v) in [
        ("language", json!(5)),
        ("code", json!([])),
        ("files", json!("x")),
        ("files", json!([{"name": 5, "content": ""}])),
        ("args", json!("x")),
        ("stdin", json!(5)),
        ("limits", json!([])),
        ("network", json!("yes")),
        ("version", json!({})),
    ] {
        let mut b = json!({"language": PY, "code": "print(1)"});
        b[field] = v.clone();
        bodies.push((
            format!("wrong type {field}={v}"),
            b.to_string().into_bytes(),
        ));
    }
    for (label, body) in &bodies {
        // Raw: the daemon may refuse an oversized body before reading it.
        let mut req = format!(
            "POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        let (rs, _) = raw_send(a.addr(), &req, Duration::from_secs(10));
        let Some(r) = rs.into_iter().next() else {
            a.finding(format!("A11 {label}: no response"));
            continue;
        };
        a.scan(&r.body, label);
        a.expect(r.status == 400, || {
            format!("A11 {label}: {} {}", r.status, r.text())
        });
        let j: Option<Value> = serde_json::from_slice(&r.body).ok();
        a.expect(j.as_ref().is_some_and(|j| j["error"].is_string()), || {
            format!("A11 {label}: not a JSON error: {}", r.text())
        });
        if let Some(leak) = leaky(&r.text(), &secrets, &data_dir) {
            a.finding(format!("A11 {label}: {leak}"));
        }
    }
    // 10 MB: length-delimited and chunked on /execute, length-delimited elsewhere.
    let ten = vec![b'x'; 10 << 20];
    let mut cl = format!(
        "POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Length: {}\r\n\r\n",
        ten.len()
    )
    .into_bytes();
    cl.extend_from_slice(&ten);
    let mut chunked = format!("POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
    for c in ten.chunks(1 << 20) {
        chunked.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        chunked.extend_from_slice(c);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let mut other = format!(
        "GET /runtimes HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Length: {}\r\n\r\n",
        ten.len()
    )
    .into_bytes();
    other.extend_from_slice(&ten);
    for (label, bytes, want) in [
        ("10 MB /execute", cl, 400u16),
        ("10 MB chunked /execute", chunked, 400),
        ("10 MB /runtimes", other, 413),
    ] {
        let (rs, closed) = raw_send(a.addr(), &bytes, Duration::from_secs(10));
        let text = rs.first().map(|r| r.text()).unwrap_or_default();
        a.expect(rs.len() == 1 && rs[0].status == want && closed, || {
            format!(
                "A11 {label}: {:?} closed={closed} {text}",
                rs.iter().map(|r| r.status).collect::<Vec<_>>()
            )
        });
        if let Some(leak) = leaky(&text, &secrets, &data_dir) {
            a.finding(format!("A11 {label}: {leak}"));
        }
    }
    a.expect(a.counter("runsTotal") == runs0, || {
        "A11: a malformed body started a run".into()
    });
    a.finish();
}

// ---------------------------------------------------------------------------------------
// S: soak and failure injection
// ---------------------------------------------------------------------------------------

/// S1, short: 40 sequential runs cycling through normal, fork bomb (R1), OOM (R3),
/// output flood (R8), busy loop (R12), sleep past the wall time, non-zero exit and
/// stdin/args; then one batch of 2 × the slot count at once (the excess gets 429
/// capacity at once and succeeds on retry). Then every invariant, RSS against the
/// post-warm-up baseline.
#[test]
fn test_s1_short_soak_mixed_runs() {
    let a = Adv::start("s1", &[]);
    let t0 = Instant::now();
    for i in 0..40 {
        let (code, limits, extra): (&str, Value, Value) = match i % 8 {
            0 => ("print('ok')", json!({}), json!({})),
            1 => (
                "import os\nwhile True:\n try: os.fork()\n except OSError: pass",
                json!({"pids": 16, "wallTimeMs": 1500}),
                json!({}),
            ),
            2 => (
                "b=[]\nwhile True: b.append(bytearray(8<<20))",
                json!({"memoryBytes": 67108864}),
                json!({}),
            ),
            3 => (
                "import sys\nsys.stdout.write('x' * (20 << 20))",
                json!({"outputBytes": 1024}),
                json!({}),
            ),
            4 => ("while True: pass", json!({"wallTimeMs": 300}), json!({})),
            5 => (
                "import time\ntime.sleep(60)",
                json!({"wallTimeMs": 300}),
                json!({}),
            ),
            6 => (
                "import sys\nprint('bad', file=sys.stderr)\nsys.exit(3)",
                json!({}),
                json!({}),
            ),
            _ => (
                "import sys\nprint(sys.argv[1:], sys.stdin.read())",
                json!({}),
                json!({"stdin": "in", "args": ["a b"]}),
            ),
        };
        let body = merged(
            json!({"language": PY, "network": false, "code": code, "limits": limits}),
            extra,
        );
        let r = a.exec_body(&body);
        let run = run_of(&r);
        let ok = match i % 8 {
            0 => run["stdout"] == "ok\n",
            1 => run["timedOut"] == true,
            2 => run["oomKilled"] == true,
            3 => run["truncated"] == true && run["stdout"].as_str().unwrap_or("").len() == 1024,
            4 | 5 => run["timedOut"] == true && run["exitCode"] == 137,
            6 => run["exitCode"] == 3 && run["stderr"] == "bad\n",
            _ => run["stdout"] == "['a b'] in\n",
        };
        a.expect(ok, || format!("S1 run {i} (kind {}): {r}", i % 8));
    }
    eprintln!("S1: 40 runs in {:?}", t0.elapsed());
    let slots = a.health()["maxConcurrent"].as_u64().unwrap() as usize;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2 * slots)
            .map(|i| {
                let a = &a;
                s.spawn(move || {
                    let body = json!({"language": PY, "network": false, "code": format!("import time\ntime.sleep(1)\nprint({i})")});
                    let t0 = Instant::now();
                    let first = a.req("POST", "/execute", &[], body.to_string().as_bytes());
                    let first_took = t0.elapsed();
                    let r = if first.status == 429 {
                        a.expect(first.json()["error"] == "capacity" && first.header("retry-after").is_some() && first_took < Duration::from_secs(1), || {
                            format!("S1 batch: refusal {} after {first_took:?}", first.text())
                        });
                        a.exec_body(&body)
                    } else {
                        assert_eq!(first.status, 200, "{}", first.text());
                        first.json()
                    };
                    (i, first.status, r)
                })
            })
            .collect();
        let mut admitted = 0;
        for h in hs {
            let (i, first, r) = h.join().unwrap();
            admitted += usize::from(first == 200);
            a.expect(run_of(&r)["stdout"] == format!("{i}\n"), || {
                format!("S1 batch {i}: {r}")
            });
        }
        a.expect(admitted <= slots, || {
            format!("S1: {admitted} admitted at once, {slots} slots")
        });
    });
    a.finish();
}

/// A runsc stand-in: passes everything through to the real runsc until `armed` exists;
/// then `runsc ... run ...` fails (exit 1) or hangs, as `mode` says.
fn runsc_wrapper(tag: &str, mode: &str) -> (PathBuf, PathBuf, CanaryDir) {
    let dir = PathBuf::from(format!("/tmp/isobox-s3-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let armed = dir.join("armed");
    let action = match mode {
        "fail" => "echo 'runsc: creating container: injected failure' >&2; exit 1",
        _ => "exec sleep 3600",
    };
    let script = format!(
        "#!/bin/sh\nif [ -e {armed} ]; then\n  for a in \"$@\"; do\n    if [ \"$a\" = run ]; then {action}; fi\n  done\nfi\nexec /usr/bin/runsc \"$@\"\n",
        armed = armed.display()
    );
    let path = dir.join("runsc");
    std::fs::write(&path, script).unwrap();
    Command::new("chmod").arg("+x").arg(&path).status().unwrap();
    (path, armed, CanaryDir(dir))
}

/// S3, failing start: `runsc run` exits 1 before the program exists. /execute answers
/// 5xx `sandbox_start_failed` (not a program exit code), promptly; the slot is released
/// and nothing is left. Then with no runsc binary at all: the same 500, naming no host
/// path.
#[test]
fn test_s3_runsc_start_failure_is_sandbox_start_failed() {
    let (runsc, armed, _dir) = runsc_wrapper("fail", "fail");
    let a = Adv::start("s3fail", &[("ISOBOX_RUNSC", runsc.to_str().unwrap())]);
    std::fs::write(&armed, "").unwrap();
    let body = json!({"language": PY, "network": false, "code": "print(1)"});
    let t0 = Instant::now();
    let r = a.req("POST", "/execute", &[], body.to_string().as_bytes());
    let took = t0.elapsed();
    // No start frame came from inside the sandbox: a start failure, not a program
    // result; runsc's words go to the log only.
    a.expect(
        r.status == 500 && r.json()["error"] == "sandbox_start_failed",
        || format!("S3: runsc run exiting 1 answered {} {}", r.status, r.text()),
    );
    a.expect(!r.text().contains("injected failure"), || {
        format!("S3: runsc's own message reached the client: {}", r.text())
    });
    a.expect(took < Duration::from_secs(10), || {
        format!("S3: answered after {took:?}")
    });
    // The same over SSE: an `error` event naming sandbox_start_failed, no `done`.
    let sse = a.req(
        "POST",
        "/execute",
        &[("Accept", "text/event-stream")],
        body.to_string().as_bytes(),
    );
    a.expect(
        sse.status == 200
            && sse.text().contains("event: error")
            && sse.text().contains("sandbox_start_failed")
            && !sse.text().contains("event: done"),
        || format!("S3 (SSE): {} {}", sse.status, sse.text()),
    );
    a.expect(a.d.log().contains("injected failure"), || {
        "S3: runsc's message is not in the daemon log".into()
    });
    let h = a.health();
    a.expect(h["inFlight"] == 0, || format!("S3: slot held: {h}"));
    a.settle_clean(Duration::from_secs(10));
    // runsc missing altogether: 500 sandbox_start_failed, and the error names no host
    // path (the catalogue's error hygiene).
    std::fs::rename(&runsc, runsc.with_extension("moved")).unwrap();
    let r = a.req("POST", "/execute", &[], body.to_string().as_bytes());
    a.expect(
        r.status == 500 && r.json()["error"] == "sandbox_start_failed",
        || format!("S3: runsc missing: {} {}", r.status, r.text()),
    );
    let data_dir = a.d.data_dir.display().to_string();
    let dir = runsc.parent().unwrap().display().to_string();
    if let Some(leak) = leaky(&r.text(), &[dir.as_str()], &data_dir) {
        a.finding(format!(
            "S3: runsc missing: the 500 shows a host path: {leak}"
        ));
    }
    std::fs::rename(runsc.with_extension("moved"), &runsc).unwrap();
    a.settle_clean(Duration::from_secs(10));
    std::fs::remove_file(&armed).unwrap();
    a.finish();
}

/// S3, hanging start: `runsc run` never starts the sandbox (and is not in the run's
/// cgroup). /execute must still answer 5xx `sandbox_start_failed` in bounded time
/// (here: wall time + boot grace + 10 s), release the slot, and the daemon must still
/// stop on SIGTERM within its grace period.
#[test]
fn test_s3_runsc_hang_is_bounded() {
    let (runsc, armed, _dir) = runsc_wrapper("hang", "hang");
    let a = Adv::start(
        "s3hang",
        &[
            ("ISOBOX_RUNSC", runsc.to_str().unwrap()),
            ("ISOBOX_SHUTDOWN_GRACE_MS", "2000"),
        ],
    );
    std::fs::write(&armed, "").unwrap();
    let body = json!({"language": PY, "network": false, "code": "print(1)", "limits": {"wallTimeMs": 1000}}).to_string();
    let key = a.key.clone();
    let mut s = TcpStream::connect(a.addr()).unwrap();
    write!(
        s,
        "POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let t0 = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(12))).unwrap();
    let resp = read_response(&mut BufReader::new(s.try_clone().unwrap()), false);
    let took = t0.elapsed();
    match &resp {
        // No start frame by the start deadline (boot grace 1 s + wall time 1 s): runsc is
        // killed with the sandbox and the run is a start failure.
        Some(r) => a.expect(
            r.status == 500
                && r.text().contains("sandbox_start_failed")
                && took < Duration::from_secs(6),
            || format!("S3 hang: answered {} {} after {took:?}", r.status, r.text()),
        ),
        None => a.finding(format!(
            "S3 hang: no answer within {took:?} (wall time 1 s + 1 s boot grace)"
        )),
    }
    drop(s); // the client gives up: the run must not hold its slot forever
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.health()["inFlight"] != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let h = a.health();
    a.expect(h["inFlight"] == 0, || {
        format!("S3 hang: slot still held 5 s after the client left: {h}")
    });
    std::fs::remove_file(&armed).unwrap();
    if h["inFlight"] == 0 {
        a.finish();
        let _ = std::fs::remove_dir_all(runsc.parent().unwrap());
        return;
    }
    // The stuck run would keep the daemon (and `finish`) waiting: check SIGTERM within
    // the grace period by hand, then kill -9 and let a fresh instance sweep the rest.
    let Adv {
        mut d, findings, ..
    } = a;
    let mut child = d.child.take().unwrap();
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let t0 = Instant::now();
    let mut exited = false;
    while t0.elapsed() < Duration::from_secs(10) {
        if let Ok(Some(_)) = child.try_wait() {
            exited = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut findings = findings.into_inner().unwrap();
    if !exited {
        findings.push("S3 hang: isoboxd still running 10 s after SIGTERM (grace 2 s)".into());
        let _ = child.kill();
    }
    let _ = child.wait();
    let instance = d.instance.clone();
    drop(d);
    let sweeper = Daemon::start_with(&[("ISOBOX_INSTANCE", instance.as_str())]);
    sweeper.wait_ready();
    let left = sweeper.leftovers();
    sweeper.stop();
    let _ = std::fs::remove_dir_all(runsc.parent().unwrap());
    assert!(left.is_empty(), "the sweep left {left:?}");
    panic!(
        "{} finding(s):\n- {}",
        findings.len(),
        findings.join("\n- ")
    );
}

/// Sends `reqs` one at a time over keep-alive connections, opening a new one whenever
/// the daemon answers `Connection: close` (it does after refusing a request whose body
/// it did not read, e.g. a 429), and returns every response.
fn one_by_one(a: &Adv, reqs: &[String]) -> Vec<Resp> {
    let mut out = Vec::new();
    let mut conn: Option<(TcpStream, BufReader<TcpStream>)> = None;
    for req in reqs {
        let (w, r) = conn.get_or_insert_with(|| {
            let s = TcpStream::connect(a.addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            (s.try_clone().unwrap(), BufReader::new(s))
        });
        w.write_all(req.as_bytes()).unwrap();
        let resp = read_response(r, false).expect("one-by-one response");
        a.scan(&resp.body, "one-by-one request");
        if resp
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        {
            conn = None;
        }
        out.push(resp);
    }
    out
}

/// Creates a filesystem session with the harness's key (its answer scanned for the
/// canary like every other).
fn a5_session(a: &Adv) -> Session {
    let r = a.req(
        "POST",
        "/v1/sessions",
        &[("Content-Type", "application/json")],
        json!({"runtime": PY}).to_string().as_bytes(),
    );
    assert_eq!(r.status, 201, "create a session: {}", r.text());
    Session::from_created(r.json())
}

/// Every `n`-character window of every run of base64url characters in `text`: the
/// strings a token could appear as (a token is a whole run, or part of a longer one).
fn base64url_windows(text: &str, n: usize) -> HashSet<&str> {
    let b = text.as_bytes();
    let is_b64 = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_';
    let mut out = HashSet::new();
    let mut i = 0;
    while i < b.len() {
        if !is_b64(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && is_b64(b[i]) {
            i += 1;
        }
        if i - start >= n {
            for s in start..=i - n {
                out.insert(&text[s..s + n]);
            }
        }
    }
    out
}

/// A5 with capability tokens: 10,000 random tokens (43 base64url characters, like the
/// real ones) against one real session. On the file API (not rate limited) every one
/// is 401 `invalid_session_token` and no file content comes back; on the session's
/// exec route (rate limited) the burst gets 401 and the rest 429 `rate_limited` +
/// Retry-After; no sandbox starts; the real token still works and the session is
/// unchanged; no tried token and no real token reaches the log. The entropy audit: two
/// sessions' tokens are distinct and decode to 32 bytes (256 bits), and the state store
/// holds the token's SHA-256, never the token.
#[test]
fn test_a5_random_session_tokens_all_401_then_rate_limited() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let a = Adv::start(
        "a5tok",
        &[("ISOBOX_RATE_PER_MIN", "600"), ("ISOBOX_RATE_BURST", "50")],
    );
    let key = a.key.clone();
    let data_dir = a.d.data_dir.display().to_string();
    // Two sessions; the first gets a file.
    let Session { id, token, .. } = a5_session(&a);
    let Session {
        id: id2,
        token: token2,
        ..
    } = a5_session(&a);
    let created = Instant::now();
    a.add_secret(&token);
    a.add_secret(&token2);
    let content = format!("a5-session-file-{}", random_hex(16));
    a.add_secret(&content);
    let file = format!("/v1/sessions/{id}/fs?path=notes/secret.txt");
    let listing = format!("/v1/sessions/{id}/fs?path=notes");
    let r = a.req(
        "PUT",
        &file,
        &[("X-Session-Token", token.as_str())],
        content.as_bytes(),
    );
    assert_eq!(r.status, 200, "upload: {}", r.text());
    let list0 = a.req("GET", &listing, &[("X-Session-Token", token.as_str())], b"");
    assert_eq!(list0.status, 200, "listing: {}", list0.text());
    let list0 = list0.json();

    // (5) The entropy audit, as far as a client can see it.
    for (i, t) in [(&id, &token), (&id2, &token2)] {
        let raw = b64.decode(t.as_bytes());
        a.expect(
            t.len() == 43
                && t.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
                && raw.as_ref().is_ok_and(|r| r.len() == 32),
            || format!("A5: session {i}'s token {t:?} is not 43 base64url chars of 32 bytes"),
        );
        a.expect(
            i.len() == 32
                && i.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
            || format!("A5: session id {i:?} is not 32 lowercase hex chars"),
        );
    }
    a.expect(token != token2 && id != id2, || {
        "A5: two sessions share a token or an id".into()
    });
    // Stored only as its SHA-256: the state store has the digest, never the token.
    let digest = sha256_hex(token.as_bytes());
    let mut state = Vec::new();
    for e in std::fs::read_dir(a.d.data_dir.join("state"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.metadata()
            .is_ok_and(|m| m.is_file() && m.len() < 256 << 20)
        {
            state.extend(std::fs::read(e.path()).unwrap_or_default());
        }
    }
    a.expect(
        !state.is_empty() && contains(&state, digest.as_bytes()),
        || "A5: the state store does not hold the token's SHA-256".into(),
    );
    a.expect(!contains(&state, token.as_bytes()), || {
        "A5: the state store holds the raw capability token".into()
    });

    // Random tokens, the real ones' format.
    let mut bytes = vec![0u8; 10_000 * 32];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    let tokens: Vec<String> = bytes
        .chunks(32)
        .map(|c| b64.encode(c))
        .filter(|t| *t != token && *t != token2)
        .collect();
    assert!(tokens.iter().all(|t| t.len() == 43));
    for t in tokens.iter().take(20) {
        a.add_secret(t);
    }
    let runs0 = a.counter("runsTotal");

    // (1) The file API, not rate limited: every random token is 401.
    let want =
        json!({"error": "invalid_session_token", "detail": "missing or wrong X-Session-Token"});
    let reqs: Vec<String> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let path = if i % 2 == 0 { &file } else { &listing };
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nX-Session-Token: {t}\r\n\r\n")
        })
        .collect();
    let t0 = Instant::now();
    let rs = pipelined(&a, &reqs, 200);
    let fs_took = t0.elapsed();
    let bad: Vec<String> = rs
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            let text = r.text();
            r.status != 401
                || serde_json::from_slice::<Value>(&r.body).ok().as_ref() != Some(&want)
                || text.contains(&content)
                || leaky(&text, &[&token, &token2, &key], &data_dir).is_some()
        })
        .map(|(i, r)| format!("#{i}: {} {}", r.status, r.text()))
        .collect();
    a.expect(rs.len() == tokens.len() && bad.is_empty(), || {
        format!(
            "A5: {} answers to {} random tokens on the file API, {} not a plain 401 invalid_session_token; e.g. {:?}",
            rs.len(),
            tokens.len(),
            bad.len(),
            &bad[..bad.len().min(5)]
        )
    });
    eprintln!(
        "A5: {} random tokens on the file API in {fs_took:?}",
        rs.len()
    );

    // (2) The exec route, rate limited: the burst reaches the token check, then 429.
    // Three bucket tokens went to the warm-up and the creates; at 10/s they are back.
    std::thread::sleep(Duration::from_millis(500).saturating_sub(created.elapsed()));
    let body = json!({"code": format!("print({:?})", content), "network": false}).to_string();
    let exec = format!("/v1/sessions/{id}/exec");
    let reqs: Vec<String> = tokens[..300]
        .iter()
        .map(|t| {
            format!(
                "POST {exec} HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nX-Session-Token: {t}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        })
        .collect();
    let t0 = Instant::now();
    let rs = one_by_one(&a, &reqs);
    let exec_took = t0.elapsed();
    // The bucket refills at 10/s while the requests go out.
    let max401 = 50 + (exec_took.as_secs_f64() * 10.0).ceil() as usize + 1;
    let s401: Vec<&Resp> = rs.iter().filter(|r| r.status == 401).collect();
    let s429: Vec<&Resp> = rs.iter().filter(|r| r.status == 429).collect();
    eprintln!(
        "A5: {} random tokens on exec in {exec_took:?}: {} × 401, {} × 429",
        rs.len(),
        s401.len(),
        s429.len()
    );
    a.expect(
        rs.len() == 300 && s401.len() + s429.len() == rs.len(),
        || {
            let other: Vec<String> = rs
                .iter()
                .filter(|r| r.status != 401 && r.status != 429)
                .take(5)
                .map(|r| format!("{} {}", r.status, r.text()))
                .collect();
            format!(
                "A5 exec: {} answers, statuses other than 401/429: {other:?}",
                rs.len()
            )
        },
    );
    a.expect(
        (50..=max401).contains(&s401.len()) && rs.iter().take(50).all(|r| r.status == 401),
        || {
            format!(
                "A5 exec: {} random tokens reached the token check (burst 50, at most {max401} with the refill), first 50: {:?}",
                s401.len(),
                rs.iter().take(50).map(|r| r.status).collect::<Vec<_>>()
            )
        },
    );
    a.expect(s401.iter().all(|r| r.json() == want), || {
        "A5 exec: a 401 that is not invalid_session_token".into()
    });
    a.expect(
        s429.iter().all(|r| {
            r.json()["error"] == "rate_limited"
                && r.header("retry-after")
                    .is_some_and(|v| v.parse::<u64>().is_ok_and(|s| s >= 1))
        }),
        || "A5 exec: a 429 without rate_limited / Retry-After".into(),
    );
    a.expect(
        rs.iter().all(|r| !contains(&r.body, content.as_bytes())),
        || "A5 exec: the file's content came back".into(),
    );
    a.expect(a.counter("runsTotal") == runs0, || {
        "A5: a random session token started a sandbox".into()
    });

    // (3) The real token still works, and the session is as it was.
    let r = a.req("GET", &file, &[("X-Session-Token", token.as_str())], b"");
    a.expect(r.status == 200 && r.body == content.as_bytes(), || {
        format!(
            "A5: the real token after the attack: {} {}",
            r.status,
            r.text()
        )
    });
    let r = a.req("GET", &listing, &[("X-Session-Token", token.as_str())], b"");
    a.expect(r.status == 200 && r.json() == list0, || {
        format!(
            "A5: the listing changed: {} {} (was {list0})",
            r.status,
            r.text()
        )
    });
    let r = a.req(
        "GET",
        &format!("/v1/sessions/{id2}/fs?path="),
        &[("X-Session-Token", token2.as_str())],
        b"",
    );
    a.expect(r.status == 200, || {
        format!(
            "A5: the second session after the attack: {} {}",
            r.status,
            r.text()
        )
    });

    // (4) No tried token in the log (the real ones and 20 tried are `finish`'s secrets).
    let log = a.d.log();
    let seen = base64url_windows(&log, 43);
    let logged = tokens.iter().filter(|t| seen.contains(t.as_str())).count();
    a.expect(logged == 0, || {
        format!("I6: {logged} of the tried session tokens are in the daemon log")
    });
    a.finish();
}

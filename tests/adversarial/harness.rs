//! The per-test harness: daemon, API key, host canary, baselines, findings; `finish`
//! checks the global invariants (I1–I4, I6) every case ends with.

use crate::common::{Daemon, Resp};
use crate::host::{
    contains, fd_count, random_hex, rss_bytes, run_cgroup_procs, sha256_file, zombie_children,
};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const PY: &str = "python-slim";

/// Error bodies must be plain JSON: no stack trace, host path or secret.
pub fn leaky(text: &str, secrets: &[&str], data_dir: &str) -> Option<String> {
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

/// Removes a directory the test made (host canary, runsc wrapper) however it ends.
pub struct CanaryDir(pub PathBuf);

impl Drop for CanaryDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Adv {
    pub d: Daemon,
    /// The key every helper sends.
    pub key: String,
    /// Strings that must never reach the log (I6): keys, canary, planted secrets.
    secrets: Mutex<Vec<String>>,
    pub canary: String,
    pub canary_file: PathBuf,
    canary_sha: String,
    _canary_dir: CanaryDir,
    base_fds: usize,
    base_rss: u64,
    warm: Duration,
    pub findings: Mutex<Vec<String>>,
}

impl Adv {
    /// Starts a daemon with `env` (plus a random API key unless `env` sets keys), waits
    /// for readiness, makes the host canary, runs one warm-up and takes the baselines.
    pub fn start(tag: &str, env: &[(&str, &str)]) -> Adv {
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

    pub fn pid(&self) -> u32 {
        self.d.pid()
    }

    pub fn addr(&self) -> SocketAddr {
        self.d.addr
    }

    pub fn finding(&self, s: String) {
        eprintln!("FINDING: {s}");
        self.findings.lock().unwrap().push(s);
    }

    /// A soft assertion: a failure is recorded and the test goes on to the invariants.
    pub fn expect(&self, cond: bool, msg: impl FnOnce() -> String) {
        if !cond {
            self.finding(msg());
        }
    }

    pub fn add_secret(&self, s: &str) {
        self.secrets.lock().unwrap().push(s.to_string());
    }

    pub fn scan(&self, bytes: &[u8], what: &str) {
        if contains(bytes, self.canary.as_bytes()) {
            self.finding(format!(
                "I4: host canary content appeared in the response to {what}"
            ));
        }
    }

    /// A request with this test's key (unless `headers` bring their own credentials).
    pub fn req(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
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
    pub fn req_raw(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        let r = self.d.request(method, path, headers, body);
        self.scan(&r.body, &format!("{method} {path}"));
        r
    }

    pub fn health(&self) -> Value {
        self.d.get("/healthz").json()
    }

    pub fn counter(&self, name: &str) -> u64 {
        self.health()["counters"][name].as_u64().unwrap()
    }

    /// POST /execute; retries 429s (rate limit or capacity) for up to 30 s.
    pub fn exec_body(&self, body: &Value) -> Value {
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

    pub fn exec(&self, code: &str, limits: Value) -> Value {
        self.exec_body(&json!({"language": PY, "network": false, "code": code, "limits": limits}))
    }

    /// Runs `code` while polling the run cgroups; returns the result, every host process
    /// seen in them, and the request's wall time.
    pub fn exec_watched(
        &self,
        code: &str,
        limits: Value,
    ) -> (Value, HashSet<(u32, u64)>, Duration) {
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

    /// Takes the fd and RSS baselines again, after a case's own warm-up (the eryx
    /// workers' sockets open at the first WebAssembly run).
    pub fn rebaseline(&mut self) {
        self.base_fds = fd_count(self.pid());
        self.base_rss = rss_bytes(self.pid());
    }

    /// Waits until nothing of any run is left; a finding (not a panic) otherwise.
    pub fn settle_clean(&self, within: Duration) -> bool {
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
    pub fn finish(self) {
        self.finish_with(4 << 20);
    }

    /// As `finish`, with the RSS slack a case's own criterion allows.
    pub fn finish_with(self, rss_slack: u64) {
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

pub fn run_of(r: &Value) -> &Value {
    &r["run"]
}

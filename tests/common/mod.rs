//! Test harness: starts the real `isoboxd` (real runsc, real cgroups) on an ephemeral
//! loopback port with its own data dir and instance name, talks raw HTTP to it, and
//! checks on shutdown that nothing it created is left behind.
#![allow(dead_code)]

pub mod session;
pub mod sse;
pub mod wbx;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A running daemon.
pub struct Daemon {
    pub child: Option<Child>,
    pub addr: SocketAddr,
    pub instance: String,
    pub data_dir: PathBuf,
    pub log: Arc<Mutex<String>>,
    /// The network namespace (a name under /run/netns) the daemon runs in, if not the
    /// test's own; `connect()` then connects from inside it.
    pub netns: Option<String>,
}

/// Runs `f` on a fresh thread that has joined the network namespace
/// `/run/netns/<netns>` (sockets it creates stay in that namespace).
pub fn in_netns<T: Send + 'static>(netns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{netns}");
    let h = std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        // SAFETY: setns on a valid open fd; it changes only this thread's network namespace.
        let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    });
    match h.join() {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e),
    }
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with(&[])
    }

    /// Starts with extra environment variables. Egress is off unless `env` turns it on:
    /// these daemons run in the test's own network namespace.
    pub fn start_with(env: &[(&str, &str)]) -> Daemon {
        Self::spawn(None, env)
    }

    /// Starts inside the network namespace `/run/netns/<netns>` (via `nsenter`, which
    /// execs isoboxd, so `pid()` is still the daemon's), listening on 0.0.0.0 there.
    /// Egress keeps the daemon's default unless `env` sets `ISOBOX_EGRESS`.
    pub fn start_in_netns(netns: &str, env: &[(&str, &str)]) -> Daemon {
        Self::spawn(Some(netns), env)
    }

    /// Starts as `wrapper… isoboxd` (a wrapper that execs it, e.g. `setpriv
    /// --no-new-privs`, so `pid()` is still the daemon's).
    pub fn start_wrapped(wrapper: &[&str], env: &[(&str, &str)]) -> Daemon {
        Self::spawn_as(None, wrapper, env)
    }

    fn spawn(netns: Option<&str>, env: &[(&str, &str)]) -> Daemon {
        Self::spawn_as(netns, &[], env)
    }

    fn spawn_as(netns: Option<&str>, wrapper: &[&str], env: &[(&str, &str)]) -> Daemon {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        // A test may restart an instance (same name and data dir) to check what survives.
        let reused = env
            .iter()
            .find(|(k, _)| *k == "ISOBOX_INSTANCE")
            .map(|(_, v)| v.to_string());
        let instance = reused
            .clone()
            .unwrap_or_else(|| format!("isobox-t{}-{n}", std::process::id()));
        let data_dir = std::env::temp_dir().join(&instance);
        if reused.is_none() {
            let _ = std::fs::remove_dir_all(&data_dir);
        }
        std::fs::create_dir_all(&data_dir).unwrap();
        let mut cmd = match netns {
            None => {
                let mut c = match wrapper.split_first() {
                    None => Command::new(env!("CARGO_BIN_EXE_isoboxd")),
                    Some((w, args)) => {
                        let mut c = Command::new(w);
                        c.args(args).arg(env!("CARGO_BIN_EXE_isoboxd"));
                        c
                    }
                };
                c.env("ISOBOX_LISTEN", "127.0.0.1:0")
                    .env("ISOBOX_EGRESS", "off");
                c
            }
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}"))
                    .arg(env!("CARGO_BIN_EXE_isoboxd"))
                    .env("ISOBOX_LISTEN", "0.0.0.0:0");
                c
            }
        };
        // The warm pools have their own tests (warm.rs, wbx.rs); elsewhere their
        // background boots would only load the machine.
        cmd.env("ISOBOX_WARM_POOL", "off")
            .env("ISOBOX_WBX_WARM_POOL", "off")
            .env("ISOBOX_DATA_DIR", &data_dir)
            .env("ISOBOX_INSTANCE", &instance)
            .env("ISOBOX_LOG", "info")
            .env("ISOBOX_SLICE_MEMORY_BYTES", (4u64 << 30).to_string())
            // Rate limits get their own tests; elsewhere they would only throttle the suite.
            .env("ISOBOX_RATE_PER_MIN", "1000000")
            .env("ISOBOX_RATE_BURST", "100000")
            .env("ISOBOX_ERYX_RATE_PER_MIN", "1000000")
            .env("ISOBOX_ERYX_RATE_BURST", "100000")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn isoboxd");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                // The ready line, as text or as a JSON object's `msg` (ISOBOX_LOG_FORMAT).
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    if let Some(tx) = tx.take() {
                        let end = rest.find(['"', ' ']).unwrap_or(rest.len());
                        let _ = tx.send(rest[..end].trim().to_string());
                    }
                }
                let mut l = log2.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut addr: SocketAddr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().unwrap(),
            Err(_) => {
                let _ = child.kill();
                panic!("isoboxd did not start; log:\n{}", log.lock().unwrap());
            }
        };
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        Daemon {
            child: Some(child),
            addr,
            instance,
            data_dir,
            log,
            netns: netns.map(str::to_string),
        }
    }

    /// Waits until /readyz says ready (the backend probe ran).
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = self.get("/readyz");
            if r.status == 200 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "never ready: {}\nlog:\n{}",
                r.text(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The log's last lines, for a failure message: what the daemon said last is what
    /// explains a failure, and CI shows only the start of a long message.
    pub fn log_tail(&self) -> String {
        const LINES: usize = 80;
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        if lines.len() <= LINES {
            return log;
        }
        format!(
            "[the first {} of {} lines left out]\n{}",
            lines.len() - LINES,
            lines.len(),
            lines[lines.len() - LINES..].join("\n")
        )
    }

    pub fn connect(&self) -> TcpStream {
        let addr = self.addr;
        let s = match &self.netns {
            None => TcpStream::connect(addr).unwrap(),
            Some(ns) => in_netns(ns, move || TcpStream::connect(addr)).unwrap(),
        };
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    pub fn get(&self, path: &str) -> Resp {
        self.request("GET", path, &[], b"")
    }

    /// One request on a fresh connection (`Connection: close`), its response read.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        let s = self.write_request("Connection: close\r\n", method, path, headers, body);
        read_response(&mut BufReader::new(s), method == "HEAD").expect("response")
    }

    /// Writes a request on a fresh connection (kept alive) and leaves the response
    /// unread: the caller watches the connection.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> TcpStream {
        self.write_request("", method, path, headers, body)
    }

    /// Connects and writes `method path`, Host, the `fixed` header lines, the length,
    /// then `headers` and `body`.
    fn write_request(
        &self,
        fixed: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> TcpStream {
        let mut s = self.connect();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: t\r\n{fixed}Content-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        s
    }

    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> Resp {
        self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    }

    /// POST /execute and return the parsed 200 body (panics on another status).
    pub fn execute(&self, body: serde_json::Value) -> serde_json::Value {
        let r = self.post_json("/execute", &body);
        assert_eq!(r.status, 200, "execute {body}: {}", r.text());
        r.json()
    }

    /// Creates a `base` WBX sandbox without network (201, or a panic); its id.
    pub fn wbx_sandbox(&self) -> String {
        let body = serde_json::json!({"template": "base", "network": {"mode": "none"}});
        let r = self.post_json("/wbx/v1/sandboxes", &body);
        assert_eq!(r.status, 201, "{}", r.text());
        r.json()["id"].as_str().unwrap().to_string()
    }

    /// `POST /wbx/v1/sandboxes/{id}/exec` of `cmd` (200, or a panic); its body.
    pub fn wbx_exec(&self, id: &str, cmd: &str) -> serde_json::Value {
        let body = serde_json::json!({ "cmd": cmd });
        let r = self.post_json(&format!("/wbx/v1/sandboxes/{id}/exec"), &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// What the daemon created that exists now: cgroups under its slice, bundles, runsc
    /// containers.
    pub fn leftovers(&self) -> Vec<String> {
        let mut out = Vec::new();
        for c in [
            "memory", "cpu", "pids", "freezer", "blkio", "cpuset", "devices", "cpuacct", "systemd",
            "unified",
        ] {
            let d = PathBuf::from("/sys/fs/cgroup").join(c).join(&self.instance);
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    // The eryx workers' cgroups live as long as the daemon (`stop`
                    // checks that they go with it); a run's are what is looked for.
                    if e.path().is_dir()
                        && !e.file_name().to_string_lossy().starts_with("wasm-worker-")
                    {
                        out.push(e.path().display().to_string());
                    }
                }
            }
        }
        if let Ok(rd) = std::fs::read_dir(self.data_dir.join("runs")) {
            out.extend(rd.flatten().map(|e| e.path().display().to_string()));
        }
        let root = format!("/run/isobox/{}/runsc", self.instance);
        if let Ok(rd) = std::fs::read_dir(&root) {
            out.extend(
                rd.flatten()
                    .map(|e| format!("runsc state file {}", e.path().display())),
            );
        }
        if let Ok(o) = Command::new("runsc")
            .args(["--root", &root, "list", "-quiet"])
            .output()
        {
            out.extend(
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| format!("container {l}")),
            );
        }
        out
    }

    /// Container ids of this daemon's warm pool (`<instance>-<pid>-w<n>`).
    pub fn pool_containers(&self) -> Vec<String> {
        let root = format!("/run/isobox/{}/runsc", self.instance);
        Command::new("runsc")
            .args(["--root", &root, "list", "-quiet"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(str::trim)
                    .filter(|l| is_pool_id(l))
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// [`assert_clean`](Self::assert_clean), except for the warm pool's own sandboxes.
    pub fn assert_clean_except_pool(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let h = self.get("/healthz").json();
            let left: Vec<String> = self
                .leftovers()
                .into_iter()
                .filter(|l| {
                    !l.split(['/', ' ', ':', '_']).any(|t| {
                        // A pooled sandbox's control socket (2024 runsc):
                        // `runsc-<id>.sock`.
                        is_pool_id(t)
                            || t.strip_prefix("runsc-")
                                .and_then(|t| t.strip_suffix(".sock"))
                                .is_some_and(is_pool_id)
                    })
                })
                .collect();
            if h["inFlight"] == 0 && left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "left behind: {left:?} health {h}\nlog:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (bounded) for every run to be cleaned up, then asserts nothing is left.
    pub fn assert_clean(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let h = self.get("/healthz").json();
            let left = self.leftovers();
            if h["inFlight"] == 0 && left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "left behind: {left:?} health {h}\nlog:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, wait for exit, and check the slice and state dirs are gone too.
    pub fn stop(mut self) {
        let data_dir = self.data_dir.clone();
        self.stop_inner();
        let left = mounts_under(&data_dir);
        assert!(left.is_empty(), "mounts left after shutdown: {left:?}");
        for c in ["memory", "cpu", "pids"] {
            let d = PathBuf::from("/sys/fs/cgroup").join(c).join(&self.instance);
            assert!(!d.exists(), "slice {} left after shutdown", d.display());
        }
        let root = PathBuf::from("/run/isobox").join(&self.instance);
        assert!(
            !root.exists(),
            "runsc root left after shutdown: {:?}",
            walk(&root)
        );
    }

    /// SIGTERM and wait for a clean exit, keeping the data dir (for a restart with the
    /// same `ISOBOX_INSTANCE`).
    pub fn stop_keep_data(&mut self) {
        if let Some(child) = self.child.take() {
            let status = terminate(child, Duration::from_secs(30));
            assert!(
                status.is_some_and(|s| s.success()),
                "isoboxd did not stop cleanly ({status:?}); log:\n{}",
                self.log_tail()
            );
        }
        let left = mounts_under(&self.data_dir);
        assert!(left.is_empty(), "mounts left after shutdown: {left:?}");
    }

    fn stop_inner(&mut self) {
        if let Some(child) = self.child.take() {
            match terminate(child, Duration::from_secs(30)) {
                Some(status) => assert!(
                    status.success(),
                    "isoboxd exited with {status}; log:\n{}",
                    self.log_tail()
                ),
                None => panic!("isoboxd did not stop on SIGTERM; log:\n{}", self.log_tail()),
            }
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// Every path under `dir` (for failure messages).
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(e.path().display().to_string());
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}

/// Whether a container id is a warm pool's (`...-w<digits>.`).
fn is_pool_id(id: &str) -> bool {
    id.starts_with("isobox")
        && id
            .strip_suffix('.')
            .and_then(|id| id.rsplit_once("-w"))
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Mount points under `dir` (from /proc/self/mountinfo).
pub fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// SIGTERM, then wait up to `grace` for the exit status; SIGKILL (and `None`) past it.
fn terminate(mut child: Child, grace: Duration) -> Option<std::process::ExitStatus> {
    // The kill command: the tests do not link libc.
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = terminate(child, Duration::from_secs(20));
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// Reads one response (Content-Length, chunked, or until close).
pub fn read_response<R: BufRead>(r: &mut R, head_only: bool) -> Option<Resp> {
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let status: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            r.read_line(&mut h).ok()?;
            let h = h.trim_end_matches(['\r', '\n']);
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':')?;
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        if status == 100 {
            continue;
        }
        let mut resp = Resp {
            status,
            headers,
            body: Vec::new(),
        };
        if head_only || status == 204 || status == 304 {
            return Some(resp);
        }
        if resp
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            loop {
                let mut size = String::new();
                r.read_line(&mut size).ok()?;
                let n = usize::from_str_radix(size.trim(), 16).ok()?;
                let mut chunk = vec![0; n + 2];
                r.read_exact(&mut chunk).ok()?;
                if n == 0 {
                    break;
                }
                resp.body.extend_from_slice(&chunk[..n]);
            }
        } else if let Some(n) = resp
            .header("content-length")
            .and_then(|v| v.parse::<usize>().ok())
        {
            resp.body = vec![0; n];
            r.read_exact(&mut resp.body).ok()?;
        } else {
            r.read_to_end(&mut resp.body).ok()?;
        }
        return Some(resp);
    }
}

/// Sends raw bytes on a fresh connection and reads every response until close.
pub fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<Resp> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(bytes).unwrap();
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut r = BufReader::new(s);
    let mut out = Vec::new();
    while let Some(resp) = read_response(&mut r, false) {
        out.push(resp);
    }
    out
}

/// Whether the peer closed the connection (read returns 0) within `wait`.
pub fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// `base` (a JSON object) with every field of `extra` (an object, or nothing) set on
/// it, replacing what was there.
pub fn merged(mut base: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let serde_json::Value::Object(m) = extra {
        for (k, v) in m {
            base[k] = v;
        }
    }
    base
}

/// SHA-256 of `data`, as lowercase hex.
pub fn sha256_hex(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The Python of the tests' venv (`make test-venv`; `ISOBOX_TEST_PYTHON` overrides).
pub fn test_python() -> String {
    std::env::var("ISOBOX_TEST_PYTHON")
        .unwrap_or_else(|_| "/tmp/isobox-test-venv/bin/python".into())
}

/// Runs the client `tests/python/<script>` with `args` (and `env`) in the tests' venv
/// and reads what it printed as JSON; a failure shows `name` (the scenario), the
/// output and `d`'s log.
#[allow(dead_code)]
pub fn python_client(
    d: &Daemon,
    script: &str,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> serde_json::Value {
    let path = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(test_python())
        .envs(env.iter().copied())
        .arg(&path)
        .args(args)
        .output()
        .expect("the tests' python");
    assert!(
        out.status.success(),
        "{script} {name}: {}\n{}\nlog:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{script} {name}: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A WebSocket upgrade request for `path`, as a client sends it, with `headers`
/// (each ending in CRLF) before the upgrade's own.
#[allow(dead_code)]
pub fn ws_upgrade(path: &str, headers: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
}

/// A raw WebSocket client: the handshake done, frames by hand (the tests of frames a
/// library would never send).
#[allow(dead_code)]
pub struct RawWs {
    pub s: TcpStream,
}

#[allow(dead_code)]
impl RawWs {
    /// Upgrades `path` at `addr` with `headers` (each ending in CRLF): the 101 must
    /// carry the answer to RFC 6455's example key.
    pub fn open(addr: SocketAddr, path: &str, headers: &str) -> RawWs {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(ws_upgrade(path, headers).as_bytes()).unwrap();
        let head = read_head(&mut s);
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        // RFC 6455's own example key and answer.
        assert!(
            head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
            "{head}"
        );
        RawWs { s }
    }

    /// Sends a frame: `first` byte (FIN, opcode), masked unless `unmasked`.
    pub fn send(&mut self, first: u8, payload: &[u8], unmasked: bool) {
        // The server may close before taking it all (a refused size).
        let _ = self.s.write_all(&RawWs::frame(first, payload, unmasked));
    }

    /// A client frame: `first` byte (FIN, opcode), the length in its shortest form,
    /// the payload masked unless `unmasked`.
    pub fn frame(first: u8, payload: &[u8], unmasked: bool) -> Vec<u8> {
        let mask = [1u8, 2, 3, 4];
        let bit = if unmasked { 0 } else { 0x80 };
        let mut f = vec![first];
        match payload.len() {
            n if n < 126 => f.push(bit | n as u8),
            n if n <= 0xffff => {
                f.push(bit | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(bit | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        if unmasked {
            f.extend_from_slice(payload);
        } else {
            f.extend_from_slice(&mask);
            f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        }
        f
    }

    /// The next frame: (opcode, payload); `None` at the connection's end.
    pub fn recv(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut h = [0u8; 2];
        self.s.read_exact(&mut h).ok()?;
        assert_eq!(h[1] & 0x80, 0, "server frames are not masked");
        assert_eq!(h[0] & 0x80, 0x80, "server frames are final");
        let len = match h[1] & 0x7f {
            126 => {
                let mut l = [0u8; 2];
                self.s.read_exact(&mut l).ok()?;
                u64::from(u16::from_be_bytes(l))
            }
            127 => {
                let mut l = [0u8; 8];
                self.s.read_exact(&mut l).ok()?;
                u64::from_be_bytes(l)
            }
            n => u64::from(n),
        };
        let mut p = vec![0u8; len as usize];
        self.s.read_exact(&mut p).ok()?;
        Some((h[0] & 0x0f, p))
    }

    /// Reads frames until a close: its code (1005 when it has none); `None` when the
    /// connection ended (or stayed silent past the read timeout) without one.
    pub fn close_code(&mut self) -> Option<u16> {
        loop {
            match self.recv()? {
                (8, p) if p.len() >= 2 => return Some(u16::from_be_bytes([p[0], p[1]])),
                (8, _) => return Some(1005),
                _ => {}
            }
        }
    }

    /// After a close, the server ends the connection.
    pub fn ends(&mut self) {
        let mut rest = Vec::new();
        let _ = self.s.read_to_end(&mut rest);
    }
}

/// Reads a response head byte by byte to its blank line (so nothing past it is read,
/// such as a WebSocket's first frame).
#[allow(dead_code)]
pub fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    String::from_utf8(head).unwrap()
}

/// The first word of the command line of each host process whose command line names
/// `bundle` (runsc's front, sandbox and gofer processes name their bundle).
pub fn processes_naming(bundle: &std::path::Path) -> Vec<String> {
    let b = bundle.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(b.as_str())
                .then(|| cmd.split(' ').next().unwrap_or("").to_string())
        })
        .collect()
}

/// A host process of a sandbox ([`sandbox_host_processes`]).
#[derive(Debug, Clone)]
pub struct HostProc {
    pub pid: u32,
    /// Its command line, NULs as spaces (empty for a platform stub).
    pub cmd: String,
    /// Its `Uid:`, `Gid:`, `Groups:`, `CapInh:`, `CapPrm:`, `CapEff:` and `CapAmb:`
    /// lines of `/proc/PID/status`, trailing blanks trimmed.
    pub ids_and_caps: Vec<String>,
    /// Its `/proc/PID/uid_map` and `gid_map`, spaces squeezed.
    pub id_maps: [String; 2],
    /// Its user namespace (`/proc/PID/ns/user`).
    pub userns: String,
}

/// Each `runsc-sandbox` process whose command line names `bundle`, and every live
/// process under it: runsc's helpers and the platform's stubs, which run the sandbox's
/// code (a zombie, such as runsc's exited set-up helper not yet reaped, runs nothing).
pub fn sandbox_host_processes(bundle: &std::path::Path) -> Vec<HostProc> {
    let b = bundle.to_string_lossy().into_owned();
    let procs: Vec<(u32, u32, String)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let mut fields = stat.rsplit(')').next()?.split_whitespace();
            if fields.next()? == "Z" {
                return None;
            }
            let ppid = fields.next()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((pid, ppid, String::from_utf8_lossy(&cmd).replace('\0', " ")))
        })
        .collect();
    let mut tree: Vec<&(u32, u32, String)> = procs
        .iter()
        .filter(|(_, _, c)| c.starts_with("runsc-sandbox ") && c.contains(b.as_str()))
        .collect();
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i].0;
        tree.extend(procs.iter().filter(|(_, pp, _)| *pp == parent));
        i += 1;
    }
    tree.into_iter()
        .filter_map(|(pid, _, cmd)| {
            let st = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            // A process that has its status but not its maps is not skipped: only one
            // that is gone is.
            let map = |f: &str| match std::fs::read_to_string(format!("/proc/{pid}/{f}")) {
                Ok(m) => m.split_whitespace().collect::<Vec<_>>().join(" "),
                Err(e) => format!("unreadable: {e}"),
            };
            let id_maps = [map("uid_map"), map("gid_map")];
            std::path::Path::new(&format!("/proc/{pid}"))
                .exists()
                .then_some(())?;
            Some(HostProc {
                pid: *pid,
                cmd: cmd.trim_end().to_string(),
                ids_and_caps: [
                    "Uid:", "Gid:", "Groups:", "CapInh:", "CapPrm:", "CapEff:", "CapAmb:",
                ]
                .iter()
                .map(|k| {
                    let l = st.lines().find(|l| l.starts_with(k)).unwrap_or("");
                    l.trim_end().to_string()
                })
                .collect(),
                id_maps,
                userns: std::fs::read_link(format!("/proc/{pid}/ns/user"))
                    .map(|l| l.display().to_string())
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// Asserts a running sandbox's host processes ([`sandbox_host_processes`], taken once
/// its program runs: the sandbox process and at least one stub) are all nobody, with
/// no capability, in a user namespace of their own that maps nobody alone.
pub fn assert_no_host_privilege(procs: &[HostProc]) {
    let host_userns = std::fs::read_link("/proc/self/ns/user").unwrap();
    assert!(
        procs.iter().any(|p| p.cmd.starts_with("runsc-sandbox "))
            && procs.iter().any(|p| p.cmd.is_empty()),
        "the sandbox process and its stubs: {procs:#?}"
    );
    let nobody = "65534\t65534\t65534\t65534";
    let none = "0000000000000000";
    for p in procs {
        assert_eq!(
            p.ids_and_caps,
            [
                format!("Uid:\t{nobody}"),
                format!("Gid:\t{nobody}"),
                "Groups:".to_string(),
                format!("CapInh:\t{none}"),
                format!("CapPrm:\t{none}"),
                format!("CapEff:\t{none}"),
                format!("CapAmb:\t{none}"),
            ],
            "{procs:#?}"
        );
        assert_eq!(p.id_maps, ["65534 65534 1", "65534 65534 1"], "{procs:#?}");
        assert_ne!(p.userns, host_userns.display().to_string(), "{procs:#?}");
    }
}

/// What [`watched_run`] saw of a run.
pub struct Watched {
    /// The response.
    pub result: serde_json::Value,
    /// Its `config.json`.
    pub config: serde_json::Value,
    /// The first word of each host process's command line that names its bundle.
    pub procs: Vec<String>,
    /// [`sandbox_host_processes`] of its bundle once its program runs.
    pub host_procs: Vec<HostProc>,
}

/// Runs `body` (a program that sleeps a little while) on `d`, which runs nothing else,
/// and looks at its sandbox while it runs.
pub fn watched_run(d: &Daemon, body: &serde_json::Value) -> Watched {
    let runs = d.data_dir.join("runs");
    std::thread::scope(|sc| {
        let sleeper = sc.spawn(|| d.post_json("/execute", body));
        let t = Instant::now();
        // The run's bundle (`…-r…`), and its processes once its sandbox runs.
        let (config, procs, host_procs) = loop {
            let bundle = std::fs::read_dir(&runs)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .find(|b| {
                    b.file_name().is_some_and(|n| {
                        n.to_string_lossy()
                            .rsplit('-')
                            .next()
                            .is_some_and(|k| k.starts_with('r'))
                    })
                });
            let procs = bundle.as_deref().map_or_else(Vec::new, processes_naming);
            if let Some(b) = bundle.filter(|_| procs.iter().any(|p| p == "runsc-sandbox")) {
                let config: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
                if config["annotations"].is_object() {
                    assert_eq!(
                        std::fs::read_dir(b.join("root")).unwrap().count(),
                        0,
                        "an image run's root path stays empty"
                    );
                }
                // Its host processes once its program runs: a platform stub is there
                // and runsc's set-up helper (`/proc/self/exe umount`) gone.
                let host = loop {
                    let h = sandbox_host_processes(&b);
                    let running = h.iter().any(|p| p.cmd.is_empty())
                        && !h.iter().any(|p| p.cmd.contains(" umount "));
                    if running || t.elapsed() > Duration::from_secs(20) {
                        break h;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                break (config, procs, host);
            }
            assert!(t.elapsed() < Duration::from_secs(20), "{}", d.log());
            std::thread::sleep(Duration::from_millis(20));
        };
        Watched {
            result: sleeper.join().unwrap().json(),
            config,
            procs,
            host_procs,
        }
    })
}

/// A spec's mounts as (destination, type), in order.
pub fn spec_mounts(config: &serde_json::Value) -> Vec<(&str, &str)> {
    config["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["destination"].as_str().unwrap(),
                m["type"].as_str().unwrap(),
            )
        })
        .collect()
}

/// One mount of a process's mount namespace.
pub struct Mount {
    pub point: String,
    /// Its per-mount flags among `ro`, `rw`, `nosuid`, `nodev` and `noexec`
    /// ([`mount_flags`]'s order).
    pub flags: Vec<String>,
    pub fstype: String,
    pub super_options: String,
}

/// A process's mounts as its own mount namespace has them, sorted by mount point.
pub fn mounts_of(pid: u32) -> Vec<Mount> {
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let mut mounts: Vec<Mount> = mountinfo
        .lines()
        .map(|l| {
            let (ours, fs) = l.split_once(" - ").unwrap();
            let f: Vec<&str> = ours.split_whitespace().collect();
            let s: Vec<&str> = fs.split_whitespace().collect();
            let kept: Vec<&str> = f[5]
                .split(',')
                .filter(|o| ["ro", "rw", "nosuid", "nodev", "noexec"].contains(o))
                .collect();
            Mount {
                point: f[4].to_string(),
                flags: mount_flags(&kept.join(",")),
                fstype: s[0].to_string(),
                super_options: s[2].to_string(),
            }
        })
        .collect();
    mounts.sort_by(|a, b| (&a.point, &a.flags).cmp(&(&b.point, &b.flags)));
    mounts
}

/// Comma-separated mount flags, sorted, for comparing with [`mounts_of`].
pub fn mount_flags(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s.split(',').map(str::to_string).collect();
    v.sort();
    v
}

/// The pids of the processes in cgroups of daemon `instance` whose command line
/// (NULs as spaces) contains `needle`.
pub fn instance_processes_with(instance: &str, needle: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cg = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cg.contains(instance) && cmd.contains(needle)).then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// What a jailed `isobox-wasm` (`pid`) must see, beside `given` (mount point,
/// flags): a mount namespace of its own whose root is a read-only tmpfs holding only
/// the mount points' first components (and the host's top-level links into `/usr`),
/// `/usr`, the binary itself and a `/proc` of its own showing only its user's
/// processes. And its `/proc/PID` entries are root's: it is not dumpable, so no other
/// process of its uid can open its memory.
pub fn assert_jailed_mounts(pid: u32, given: &[(String, &str)]) {
    use std::os::unix::fs::MetadataExt;
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).unwrap();
    assert_ne!(ns(&pid.to_string()), ns("self"), "its own mount namespace");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(exe.file_name().unwrap(), "isobox-wasm");
    let mut want: Vec<(String, Vec<String>)> = vec![
        ("/".into(), mount_flags("ro,nosuid,nodev,noexec")),
        ("/usr".into(), mount_flags("ro,nosuid,nodev")),
        ("/proc".into(), mount_flags("rw,nosuid,nodev,noexec")),
        (exe.display().to_string(), mount_flags("ro,nosuid,nodev")),
    ];
    want.extend(given.iter().map(|(p, f)| (p.clone(), mount_flags(f))));
    want.sort();
    let mounts = mounts_of(pid);
    let points: Vec<(String, Vec<String>)> = mounts
        .iter()
        .map(|m| (m.point.clone(), m.flags.clone()))
        .collect();
    assert_eq!(points, want, "pid {pid}");
    let at = |p: &str| mounts.iter().find(|m| m.point == p).unwrap();
    assert_eq!(at("/").fstype, "tmpfs");
    assert_eq!(at("/proc").fstype, "proc");
    let proc_opts = &at("/proc").super_options;
    assert!(
        proc_opts.contains("hidepid=invisible") || proc_opts.contains("hidepid=2"),
        "{proc_opts}"
    );
    let mut top: Vec<String> = want
        .iter()
        .filter(|(p, _)| p != "/")
        .map(|(p, _)| p.split('/').nth(1).unwrap().to_string())
        .collect();
    top.extend(
        ["bin", "sbin", "lib", "lib32", "lib64", "libx32"]
            .into_iter()
            .filter(|n| {
                std::path::Path::new("/")
                    .join(n)
                    .symlink_metadata()
                    .is_ok_and(|m| m.file_type().is_symlink())
            })
            .map(String::from),
    );
    top.sort();
    top.dedup();
    let mut root: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/root"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    root.sort();
    assert_eq!(root, top, "pid {pid}");
    // Set by the process itself first thing: a process just started may not be there
    // yet.
    let t0 = std::time::Instant::now();
    let owner = || std::fs::metadata(format!("/proc/{pid}/mem")).unwrap().uid();
    while owner() != 0 && t0.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(owner(), 0, "pid {pid} is dumpable");
}

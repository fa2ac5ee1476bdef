//! Daemon lifecycle: graceful shutdown (running work finishes within the grace period,
//! the rest is killed, nothing is left) and the startup sweep after a crash.

mod common;
use common::{read_response, Daemon};
use serde_json::json;
use std::io::BufReader;
use std::time::{Duration, Instant};

fn start_run(d: &Daemon, code: &str) -> std::net::TcpStream {
    let body = json!({"language": "python-slim", "network": false, "code": code}).to_string();
    d.send("POST", "/execute", &[], body.as_bytes())
}

fn wait_in_flight(d: &Daemon, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while d.get("/healthz").json()["inFlight"] != n {
        assert!(Instant::now() < deadline, "inFlight never reached {n}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn test_sigterm_lets_runs_finish_within_grace_then_kills() {
    let d = Daemon::start_with(&[("ISOBOX_SHUTDOWN_GRACE_MS", "4000")]);
    d.wait_ready();
    let short = start_run(&d, "import time\ntime.sleep(1.5)\nprint('finished')");
    let long = start_run(&d, "import time\ntime.sleep(60)\nprint('never')");
    wait_in_flight(&d, 2);
    let t0 = Instant::now();
    let pid = d.pid();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    // The short run completes normally and is answered.
    let r = read_response(&mut BufReader::new(short), false).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["run"]["stdout"], "finished\n");
    assert_eq!(r.header("connection"), Some("close"));
    // No new connections are accepted meanwhile.
    assert!(
        std::net::TcpStream::connect(d.addr).is_err(),
        "listener closed on SIGTERM"
    );
    // The long run is killed at the end of the grace period and still answered.
    let r = read_response(&mut BufReader::new(long), false).unwrap();
    assert_eq!(r.json()["run"]["exitCode"], 137);
    assert_eq!(r.json()["run"]["stdout"], "");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(3500) && took < Duration::from_secs(12),
        "{took:?}"
    );
    // The killed run's sandbox is torn down on the pool after its response; on a
    // loaded machine that can take a few seconds, so poll rather than sleep once.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left = d.leftovers();
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        left = d.leftovers();
    }
    assert!(left.is_empty(), "left after the grace: {left:?}");
    // `stop` waits for a clean exit and checks the slice and runsc root are gone.
    d.stop();
}

#[test]
fn test_json_log_lines_are_one_object_each() {
    let mut d = Daemon::start_with(&[("ISOBOX_LOG_FORMAT", "json")]);
    d.wait_ready();
    let r = d.execute(json!({"language": "python-slim", "network": false, "code": "print(1)"}));
    assert_eq!(r["run"]["stdout"], "1\n");
    d.stop_keep_data();
    // The reader thread takes the last lines after the exit.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log().contains("isoboxd stopped") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = d.log();
    let mut msgs = Vec::new();
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let o = v.as_object().unwrap();
        let keys: Vec<&str> = o.keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 4, "{line}");
        for k in ["ts", "level", "target", "msg"] {
            assert!(o[k].is_string(), "{k} in {line}");
        }
        let ts = o["ts"].as_str().unwrap();
        // RFC 3339 in UTC with milliseconds: 2026-12-03T07:00:00.123Z
        assert!(
            ts.len() == 24 && ts.ends_with('Z') && &ts[10..11] == "T",
            "{ts}"
        );
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&o["level"].as_str().unwrap()),
            "{line}"
        );
        assert!(
            o["target"].as_str().unwrap().starts_with("isobox"),
            "{line}"
        );
        msgs.push(o["msg"].as_str().unwrap().to_string());
    }
    assert!(
        msgs.iter().any(|m| m.contains("listening on http://")),
        "{log}"
    );
    assert!(msgs.iter().any(|m| m == "isoboxd stopped"), "{log}");
    d.stop();
}

#[test]
fn test_crash_leftovers_are_swept_at_startup() {
    let d = Daemon::start();
    d.wait_ready();
    let _held = start_run(&d, "import time\ntime.sleep(60)");
    wait_in_flight(&d, 1);
    let instance = d.instance.clone();
    let data_dir = d.data_dir.clone();
    // kill -9: the run's cgroups, bundle and runsc state stay behind.
    // In flight is counted from admission; wait until the sandbox really exists.
    let slice = std::path::Path::new("/sys/fs/cgroup/memory").join(&d.instance);
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::fs::read_dir(&slice)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .count()
        == 0
    {
        assert!(Instant::now() < deadline, "the run's cgroup never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut d = d;
    let old_pid = d.pid();
    let mut child = d.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let stale: Vec<_> = std::fs::read_dir(&slice)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    assert_eq!(stale.len(), 1, "the crashed run's cgroup is still there");
    assert_eq!(
        std::fs::read_dir(data_dir.join("runs")).unwrap().count(),
        1,
        "and its bundle"
    );
    // A new daemon with the same instance name and data dir sweeps them before serving.
    let d2 = Daemon::start_with(&[("ISOBOX_INSTANCE", instance.as_str())]);
    d2.wait_ready();
    assert!(
        d2.leftovers().is_empty(),
        "swept at startup: {:?}",
        d2.leftovers()
    );
    assert!(d2.log().contains("startup sweep removed"), "{}", d2.log());
    assert_eq!(
        d2.execute(json!({"language": "python-slim", "network": false, "code": "print(1)"}))["run"]
            ["stdout"],
        "1\n"
    );
    // No process of the crashed instance survives (container ids carry the daemon's
    // pid: `<instance>-<pid hex>-<serial>`).
    let ps = std::process::Command::new("pgrep")
        .args(["-f", &format!("{instance}-{old_pid:x}-")])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ps.stdout).trim().is_empty(),
        "processes of the old instance remain"
    );
    d2.stop();
}

#[test]
fn test_reactor_thread_runs_under_its_seccomp_filter() {
    let d = Daemon::start();
    d.wait_ready();
    let pid = d.pid();
    // The main thread is the reactor: filtered (mode 2). Workers, which spawn runsc,
    // are not.
    let main = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/status")).unwrap();
    assert!(main.lines().any(|l| l == "Seccomp:\t2"), "{main}");
    let workers: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|t| *t != pid.to_string())
        .collect();
    assert!(!workers.is_empty());
    for t in workers {
        let st = std::fs::read_to_string(format!("/proc/{pid}/task/{t}/status")).unwrap();
        assert!(
            st.lines().any(|l| l == "Seccomp:\t0"),
            "worker {t} unfiltered"
        );
    }
    // Still serving everything under the filter, including a run and a clean shutdown.
    assert_eq!(
        d.execute(json!({"language": "python-slim", "network": false, "code": "print(2)"}))["run"]
            ["stdout"],
        "2\n"
    );
    assert!(d.log().contains("seccomp: reactor thread limited to"));
    d.stop();
}

#[test]
fn test_a_daemon_that_cannot_bind_creates_nothing() {
    let d = Daemon::start();
    let instance = format!("isobox-t{}-nobind", std::process::id());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_isoboxd"))
        .env("ISOBOX_LISTEN", d.addr.to_string())
        .env("ISOBOX_INSTANCE", &instance)
        .env("ISOBOX_DATA_DIR", std::env::temp_dir().join(&instance))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("binding"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !std::path::Path::new("/sys/fs/cgroup/memory")
            .join(&instance)
            .exists(),
        "no slice"
    );
    assert!(
        !std::path::Path::new("/run/isobox").join(&instance).exists(),
        "no runsc root"
    );
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&instance));
    d.stop();
}

/// Issue 26, item 7: two daemons of one instance would remove each other's sandboxes
/// at startup; the second refuses to start, naming the first, and touches nothing.
#[test]
fn test_a_second_daemon_of_one_instance_refuses_to_start() {
    let a = Daemon::start();
    a.wait_ready();
    // A run in flight in the first while the second tries.
    let s = start_run(&a, "import time; time.sleep(3); print('survived')");
    wait_in_flight(&a, 1);
    let data_dir = std::env::temp_dir().join(format!("{}-second", a.instance));
    let mut b = std::process::Command::new(env!("CARGO_BIN_EXE_isoboxd"))
        .env("ISOBOX_INSTANCE", &a.instance)
        .env("ISOBOX_LISTEN", "127.0.0.1:0")
        .env("ISOBOX_DATA_DIR", &data_dir)
        .env("ISOBOX_EGRESS", "off")
        .env("ISOBOX_WARM_POOL", "off")
        .env("ISOBOX_WBX_WARM_POOL", "off")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = b.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = b.kill();
            panic!("a second daemon of instance {} started", a.instance);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut b.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "another isoboxd of instance {:?} is running (pid {})",
            a.instance,
            a.pid()
        )) && err.contains("ISOBOX_INSTANCE"),
        "{err}"
    );
    assert!(!data_dir.exists(), "the second daemon made nothing: {err}");
    // The first goes on: its run ends normally, and it serves new ones.
    let r = read_response(&mut BufReader::new(s), false).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["run"]["stdout"], "survived\n", "{}", r.text());
    let v = a.execute(json!({"language": "python-slim", "network": false, "code": "print(1)"}));
    assert_eq!(v["run"]["stdout"], "1\n", "{v}");
    // Its lock file is its own, with its pid, and goes with it.
    let lock = format!("/run/isobox/{}.lock", a.instance);
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap().trim(),
        a.pid().to_string()
    );
    let instance = a.instance.clone();
    drop(a);
    assert!(
        !std::path::Path::new(&format!("/run/isobox/{instance}.lock")).exists(),
        "the lock file is removed at a clean exit"
    );
}

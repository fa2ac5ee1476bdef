//! `GET /metrics`: Prometheus's own checker (`promtool check metrics`, from Debian's
//! prometheus package, see `make test-promtool`) accepts every scrape, the counters move
//! exactly as runs and requests happen, and off-host scrapes need the metrics key.

mod common;

use common::Daemon;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

const PROMTOOL: &str = "/var/cache/isobox-tools/promtool";
const METRICS_KEY: &str = "scrape-0123456789abcdef";

/// Runs `promtool check metrics` on `text`; panics with its output when it objects.
fn promtool_accepts(text: &str) {
    let mut child = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{PROMTOOL}: {e} (make test-promtool installs it)"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every sample of a scrape: `name{labels}` as written → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

fn scrape(d: &Daemon) -> BTreeMap<String, f64> {
    let r = d.get("/metrics");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    promtool_accepts(&r.text());
    samples(&r.text())
}

fn get(m: &BTreeMap<String, f64>, k: &str) -> f64 {
    m.get(k).copied().unwrap_or(0.0)
}

#[test]
fn test_metrics_parse_and_move_with_runs_and_requests() {
    let d = Daemon::start_with(&[
        ("ISOBOX_METRICS_KEY", METRICS_KEY),
        ("ISOBOX_TRUSTED_PROXIES", "127.0.0.1/32"),
    ]);
    d.wait_ready();
    let before = scrape(&d);
    assert_eq!(
        get(&before, "isobox_build_info{version=\"dev\"}").max(1.0),
        1.0
    );
    assert_eq!(get(&before, "isobox_egress_state{state=\"off\"}"), 1.0);
    assert_eq!(get(&before, "isobox_egress_state{state=\"verified\"}"), 0.0);
    assert_eq!(get(&before, "isobox_slots_in_use"), 0.0);
    assert!(get(&before, "isobox_slots") >= 1.0);
    assert!(get(&before, "process_open_fds") > 0.0);

    // One run of each outcome a client causes: ok, error, timeout, truncated.
    let py = "python-slim";
    let run = |code: &str, limits: serde_json::Value| {
        d.execute(json!({"language": py, "code": code, "network": false, "limits": limits}))
    };
    assert_eq!(run("print(1)", json!({}))["run"]["exitCode"], 0);
    assert_eq!(
        run("import sys; sys.exit(3)", json!({}))["run"]["exitCode"],
        3
    );
    assert_eq!(
        run("import time; time.sleep(30)", json!({"wallTimeMs": 300}))["run"]["timedOut"],
        true
    );
    assert_eq!(
        run("print('x' * 5000)", json!({"outputBytes": 1024}))["run"]["truncated"],
        true
    );
    // Requests no route takes, on each face, and a malformed one.
    assert_eq!(d.get("/no/such/path").status, 404);
    assert_eq!(d.get("/wbx/v1/nothing").status, 404);
    assert_eq!(d.request("DELETE", "/healthz", &[], b"").status, 405);
    // A head too large after a routed one on the same connection: unrouted, not /healthz.
    let mut raw =
        b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /healthz HTTP/1.1\r\nX-Big: ".to_vec();
    raw.extend(std::iter::repeat_n(b'a', 17 * 1024));
    raw.extend_from_slice(b"\r\n\r\n");
    let got: Vec<u16> = common::raw_exchange(d.addr, &raw)
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(got, vec![200, 431]);

    let after = scrape(&d);
    let delta = |k: &str| get(&after, k) - get(&before, k);
    let runtime = after
        .keys()
        .find_map(|k| {
            k.strip_prefix("isobox_runs_total{runtime=\"")
                .and_then(|r| r.split_once('"'))
                .map(|(r, _)| r.to_string())
        })
        .expect("a runs_total sample");
    assert!(py.starts_with(&runtime) || runtime == py, "{runtime}");
    for outcome in ["ok", "error", "timeout", "truncated"] {
        assert_eq!(
            delta(&format!(
                "isobox_runs_total{{runtime=\"{runtime}\",outcome=\"{outcome}\"}}"
            )),
            1.0,
            "{outcome}"
        );
    }
    for outcome in ["oom", "cancelled", "failed"] {
        assert_eq!(
            delta(&format!(
                "isobox_runs_total{{runtime=\"{runtime}\",outcome=\"{outcome}\"}}"
            )),
            0.0,
            "{outcome}"
        );
    }
    // Every run is in both histograms; the timed-out one took at least its 0.3 s.
    let rt = format!("runtime=\"{runtime}\"");
    assert_eq!(
        delta(&format!("isobox_run_duration_seconds_count{{{rt}}}")),
        4.0
    );
    assert_eq!(
        delta(&format!("isobox_run_start_seconds_count{{{rt}}}")),
        4.0
    );
    assert_eq!(
        delta(&format!(
            "isobox_run_duration_seconds_bucket{{{rt},le=\"+Inf\"}}"
        )),
        4.0
    );
    assert!(delta(&format!("isobox_run_duration_seconds_sum{{{rt}}}")) >= 0.3);
    assert!(
        delta(&format!(
            "isobox_run_duration_seconds_bucket{{{rt},le=\"0.25\"}}"
        )) <= 3.0,
        "the 300 ms run is above 0.25 s"
    );
    // HTTP: by face, method, route pattern and status.
    assert_eq!(
        delta("isobox_http_requests_total{face=\"isobox\",method=\"POST\",route=\"/execute\",status=\"200\"}"),
        4.0
    );
    assert_eq!(
        delta("isobox_http_requests_total{face=\"isobox\",method=\"GET\",route=\"unmatched\",status=\"404\"}"),
        1.0
    );
    assert_eq!(
        delta("isobox_http_requests_total{face=\"wbx\",method=\"GET\",route=\"unmatched\",status=\"404\"}"),
        1.0
    );
    assert_eq!(
        delta("isobox_http_requests_total{face=\"isobox\",method=\"DELETE\",route=\"unmatched\",status=\"405\"}"),
        1.0
    );
    assert_eq!(
        delta("isobox_http_requests_total{face=\"isobox\",method=\"GET\",route=\"/healthz\",status=\"200\"}"),
        1.0
    );
    assert_eq!(
        delta("isobox_http_requests_total{face=\"isobox\",method=\"other\",route=\"unmatched\",status=\"431\"}"),
        1.0
    );
    // The first scrape itself is counted once it was written.
    assert_eq!(
        delta("isobox_http_requests_total{face=\"isobox\",method=\"GET\",route=\"/metrics\",status=\"200\"}"),
        1.0
    );
    assert!(delta("isobox_http_received_bytes_total") > 4.0 * 60.0);
    assert!(delta("isobox_http_sent_bytes_total") > 4.0 * 100.0);
    assert_eq!(get(&after, "isobox_slots_in_use"), 0.0);
    // isoboxd's own steps around each of the four cold sandboxes (no network asked).
    // A sandbox is removed after its result is sent: its last steps are counted once
    // the removal is done.
    let t = std::time::Instant::now();
    let settled = loop {
        let m = scrape(&d);
        let k = "isobox_sandbox_steps_total{step=\"cgroup_remove\"}";
        if get(&m, k) - get(&before, k) >= 4.0 || t.elapsed() > std::time::Duration::from_secs(20) {
            break m;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let step = |family: &str, s: &str| {
        let k = format!("{family}{{step=\"{s}\"}}");
        get(&settled, &k) - get(&before, &k)
    };
    for s in [
        "bundle_write",
        "cgroup_create",
        "spawn",
        "reap",
        "state_files",
        "bundle_remove",
        "cgroup_remove",
    ] {
        assert_eq!(step("isobox_sandbox_steps_total", s), 4.0, "{s}");
        let (wall, cpu) = (
            step("isobox_sandbox_step_seconds_total", s),
            step("isobox_sandbox_step_cpu_seconds_total", s),
        );
        assert!(wall > 0.0 && cpu > 0.0, "{s}: {wall} s, {cpu} CPU-s");
        // A thread's CPU time within a step is at most the step's wall time.
        assert!(cpu <= wall + 0.001, "{s}: {wall} s, {cpu} CPU-s");
    }
    assert_eq!(step("isobox_sandbox_steps_total", "network"), 0.0);
    // Only a killed runsc leaves its container for `runsc delete`: the timed-out run.
    assert_eq!(step("isobox_sandbox_steps_total", "runsc_delete"), 1.0);

    // Off this host (a trusted proxy says who): only with the metrics key.
    let remote = [("X-Forwarded-For", "192.0.2.9")];
    assert_eq!(d.request("GET", "/metrics", &remote, b"").status, 401);
    let bearer = format!("Bearer {METRICS_KEY}");
    let r = d.request(
        "GET",
        "/metrics",
        &[remote[0], ("Authorization", bearer.as_str())],
        b"",
    );
    assert_eq!(r.status, 200);
    promtool_accepts(&r.text());
    let wrong = format!("Bearer {}x", METRICS_KEY);
    assert_eq!(
        d.request(
            "GET",
            "/metrics",
            &[remote[0], ("Authorization", wrong.as_str())],
            b""
        )
        .status,
        401
    );
    assert!(!d.log().contains(METRICS_KEY), "the key is never logged");
    d.assert_clean();
    d.stop();
}

#[test]
fn test_a_short_metrics_key_is_refused_at_startup() {
    let out = Command::new(env!("CARGO_BIN_EXE_isoboxd"))
        .env("ISOBOX_METRICS_KEY", "short-secret")
        .env("ISOBOX_INSTANCE", "isobox-metrics-shortkey")
        .env("ISOBOX_EGRESS", "off")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ISOBOX_METRICS_KEY") && err.contains("at least 16 characters"),
        "{err}"
    );
    assert!(
        !err.contains("short-secret"),
        "the refused key is not echoed: {err}"
    );
}

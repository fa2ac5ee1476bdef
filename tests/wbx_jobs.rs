//! The WBX face's background jobs (`/wbx/v1/jobs`), against the real daemon with real
//! runsc, cgroups, LMDB and sockets, as a client of `wbx-sandbox-api.txt` with base URL
//! `http://HOST:PORT/wbx` would use them: submit, wait, read the summary, the log, the
//! result files and the signed receipt; failures, time limits, cancels, retries, limits
//! at their bounds, and a kill -9 of the daemon in the middle of jobs.

mod common;
use common::wbx::*;
use common::{sha256_hex, Daemon, Resp};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[test]
fn test_a_job_runs_saves_its_files_and_says_what_happened() {
    let d = Daemon::start_with(&[("ISOBOX_API_KEYS", "jobs-key-one,jobs-key-two")]);
    d.wait_ready();
    let k1 = Some("jobs-key-one");
    let secret = "s3cr3t-value-42";
    let command = "mkdir -p output/sub && printf 'a,b\\n1,2\\n' > output/report.csv \
        && echo deep > output/sub/deep.txt && echo top > top.csv && echo nope > other.txt \
        && echo \"token is $API_TOKEN\" && for i in 1 2 3; do echo line $i; done && echo to-stderr >&2";
    let body = json!({
        "command": command,
        "timeout_s": 120,
        "artifacts": ["output/", "*.csv"],
        "required_artifacts": ["output/report.csv"],
        "env": {"API_TOKEN": secret},
        "network": {"mode": "none"},
    });
    let r = wbx_h(
        &d,
        "POST",
        "/v1/jobs",
        k1,
        Some(&body),
        &[("Idempotency-Key", "report-2026-11")],
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let job = r.json();
    let id = job["id"].as_str().unwrap().to_string();
    assert!(
        ["queued", "starting"].contains(&job["status"].as_str().unwrap()),
        "{job}"
    );
    assert_eq!(job["env"], json!(["API_TOKEN"]));
    assert_eq!(job["timeout_s"], 120);
    assert_eq!(job["network"], "none");
    assert!(
        !r.text().contains(secret),
        "env values never come back: {}",
        r.text()
    );
    // The same key is the same job, also as a body field.
    for _ in 0..2 {
        let again = wbx_h(
            &d,
            "POST",
            "/v1/jobs",
            k1,
            Some(&body),
            &[("Idempotency-Key", "report-2026-11")],
        );
        assert_eq!(
            (again.status, again.json()["id"].as_str()),
            (202, Some(id.as_str()))
        );
    }
    let mut b2 = body.clone();
    b2["idempotency_key"] = json!("report-2026-11");
    assert_eq!(submit(&d, k1, &b2)["id"], id.as_str());
    // Another tenant's key of the same name is its own job; it cannot see this one.
    let other = submit(&d, Some("jobs-key-two"), &b2);
    assert_ne!(other["id"], id.as_str());
    for path in [
        "",
        "/summary",
        "/logs",
        "/receipt",
        "/artifacts",
        "/artifacts/output/report.csv",
    ] {
        let r = wbx(
            &d,
            "GET",
            &format!("/v1/jobs/{id}{path}"),
            Some("jobs-key-two"),
            None,
        );
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert_eq!(err(&r), "job not found");
    }
    let r = wbx(
        &d,
        "POST",
        &format!("/v1/jobs/{id}/cancel"),
        Some("jobs-key-two"),
        None,
    );
    assert_eq!(r.status, 404);

    let v = finished(&d, k1, &id, Duration::from_secs(120));
    assert_eq!(v["status"], "completed", "{v}\n{}", d.log());
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["error"], Value::Null);
    assert_eq!(v["attempt"], 1);
    assert!(
        v["duration_s"]
            .as_f64()
            .is_some_and(|s| s > 0.0 && s < 60.0),
        "{v}"
    );
    assert_eq!(v["cost"], "0.000000 EUR");
    assert_eq!(
        names(&v["result_files"]),
        ["output/report.csv", "output/sub/deep.txt", "top.csv"]
    );
    let report = b"a,b\n1,2\n";
    let f0 = &v["result_files"][0];
    assert_eq!(
        (f0["size"].as_u64(), f0["sha256"].as_str()),
        (Some(8), Some(sha256_hex(report).as_str()))
    );
    for t in ["created_at", "started_at", "finished_at"] {
        assert!(v[t].as_str().is_some_and(|s| s.ends_with('Z')), "{t}: {v}");
    }

    // The raw log: both streams, the secret redacted.
    let r = wbx(&d, "GET", &format!("/v1/jobs/{id}/logs"), k1, None);
    assert_eq!(r.status, 200);
    let log = r.text();
    assert!(log.contains("token is [REDACTED]\n"), "{log}");
    assert!(!log.contains(secret), "{log}");
    assert!(
        log.contains("line 3\n") && log.contains("to-stderr\n"),
        "{log}"
    );
    let size: u64 = r.header("x-log-size").unwrap().parse().unwrap();
    assert_eq!(size, log.len() as u64);
    // A part of it, and its end.
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{id}/logs?offset=6&limit=5"),
        k1,
        None,
    );
    assert_eq!(r.text(), &log[6..11]);
    assert_eq!(r.header("x-log-next-offset"), Some("11"));
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{id}/logs?offset=-10"),
        k1,
        None,
    );
    assert_eq!(r.text(), &log[log.len() - 10..]);
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{id}/logs?offset=-100000"),
        k1,
        None,
    );
    assert_eq!(r.text(), log);
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{id}/logs?offset=100000"),
        k1,
        None,
    );
    assert_eq!((r.status, r.text().len()), (200, 0));
    let t = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{id}/logs?mode=tail&max_chars=100"),
        k1,
        None,
    )
    .json();
    assert_eq!(
        (
            t["mode"].as_str(),
            t["status"].as_str(),
            t["exit_code"].as_i64()
        ),
        (Some("tail"), Some("completed"), Some(0))
    );
    assert_eq!(t["size"].as_u64(), Some(size));
    assert_eq!(t["lines"].as_u64(), Some(log.lines().count() as u64));
    assert!(log.ends_with(t["text"].as_str().unwrap()), "{t}");
    for (q, want) in [
        ("mode=nope", "mode: one of"),
        ("limit=0", "limit: 1 to"),
        ("offset=x", "offset:"),
        ("mode=tail&max_chars=5", "max_chars: 100 to 100000"),
    ] {
        let r = wbx(&d, "GET", &format!("/v1/jobs/{id}/logs?{q}"), k1, None);
        assert_eq!(r.status, 400, "{q}");
        assert!(err(&r).contains(want), "{q}: {}", r.text());
    }

    // The summary, for an agent.
    let s = wbx(&d, "GET", &format!("/v1/jobs/{id}/summary"), k1, None).json();
    assert_eq!(s["status"], "completed");
    assert_eq!(s["exit_code"], 0);
    assert_eq!(
        s["files"],
        json!(["output/report.csv", "output/sub/deep.txt", "top.csv"])
    );
    let last: Vec<&str> = s["last_log_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        last.contains(&"line 3") && last.contains(&"token is [REDACTED]"),
        "{s}"
    );
    assert!(
        s["next_step"]
            .as_str()
            .unwrap()
            .contains(&format!("/v1/jobs/{id}/artifacts/")),
        "{s}"
    );

    // Result files: listed, and downloaded byte for byte.
    let a = wbx(&d, "GET", &format!("/v1/jobs/{id}/artifacts"), k1, None).json();
    assert_eq!(
        names(&a["files"]),
        ["output/report.csv", "output/sub/deep.txt", "top.csv"]
    );
    assert_eq!(a["skipped"], json!([]));
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{id}/artifacts/output/report.csv"),
        k1,
        None,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body, report);
    assert_eq!(
        r.header("x-content-sha256"),
        Some(sha256_hex(report).as_str())
    );
    assert!(
        r.header("content-disposition")
            .is_some_and(|c| c.contains("report.csv")),
        "{:?}",
        r.headers
    );
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{id}/artifacts/output%2Fsub%2Fdeep.txt"),
        k1,
        None,
    );
    assert_eq!(r.body, b"deep\n");
    for missing in ["other.txt", "output/nope.csv", "..%2F..%2Fetc%2Fpasswd"] {
        let r = wbx(
            &d,
            "GET",
            &format!("/v1/jobs/{id}/artifacts/{missing}"),
            k1,
            None,
        );
        assert_eq!(r.status, 404, "{missing}");
        assert!(err(&r).starts_with("no such result file"), "{}", r.text());
    }

    // The receipt, signed by the daemon with the key it publishes.
    let key = wbx(&d, "GET", "/v1/receipts/key", k1, None).json();
    assert_eq!(key["algorithm"], "Ed25519");
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let public = b64.decode(key["public_key"].as_str().unwrap()).unwrap();
    let rc = wbx(&d, "GET", &format!("/v1/jobs/{id}/receipt"), k1, None).json();
    let sig = rc["signature"].clone();
    let signed = sig["signed"].as_str().unwrap();
    let pk = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &public);
    pk.verify(
        signed.as_bytes(),
        &b64.decode(sig["value"].as_str().unwrap()).unwrap(),
    )
    .expect("the receipt's signature verifies with the published key");
    // An edited receipt does not.
    let edited = signed.replace("\"completed\"", "\"failed\"");
    assert!(pk
        .verify(
            edited.as_bytes(),
            &b64.decode(sig["value"].as_str().unwrap()).unwrap()
        )
        .is_err());
    let mut unsigned = rc.clone();
    unsigned.as_object_mut().unwrap().remove("signature");
    assert_eq!(serde_json::from_str::<Value>(signed).unwrap(), unsigned);
    assert_eq!(
        rc["inputs"]["command_sha256"],
        sha256_hex(command.as_bytes())
    );
    assert_eq!(
        rc["inputs"]["env_sha256"],
        sha256_hex(json!({"API_TOKEN": secret}).to_string().as_bytes())
    );
    assert_eq!(rc["inputs"]["env"], json!(["API_TOKEN"]));
    assert_eq!(rc["log"]["sha256"], sha256_hex(log.as_bytes()));
    assert_eq!(rc["log"]["size"].as_u64(), Some(size));
    assert_eq!(rc["exit_code"], 0);
    assert!(rc["cpu_time_ms"].as_u64().is_some_and(|c| c > 0), "{rc}");
    assert!(
        rc["peak_memory_bytes"]
            .as_u64()
            .is_some_and(|m| m > 1 << 20),
        "{rc}"
    );
    assert_eq!(rc["result_files"][0]["sha256"], sha256_hex(report));
    assert!(
        rc["runtime"]["isolation"]
            .as_str()
            .unwrap()
            .contains("gVisor"),
        "{rc}"
    );
    assert!(!rc.to_string().contains(secret));

    // The list: newest first, by status, in pages.
    let second = submit(
        &d,
        k1,
        &json!({"command": "true", "network": {"mode": "none"}}),
    );
    let sid = second["id"].as_str().unwrap();
    finished(&d, k1, sid, Duration::from_secs(120));
    let l = wbx(&d, "GET", "/v1/jobs", k1, None).json();
    let ids: Vec<&str> = l["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [sid, id.as_str()]);
    assert_eq!(l["next_cursor"], Value::Null);
    let p1 = wbx(&d, "GET", "/v1/jobs?limit=1", k1, None).json();
    assert_eq!(p1["jobs"][0]["id"], sid);
    let cursor = p1["next_cursor"].as_str().unwrap();
    let p2 = wbx(
        &d,
        "GET",
        &format!("/v1/jobs?limit=1&cursor={cursor}"),
        k1,
        None,
    )
    .json();
    assert_eq!(
        (p2["jobs"][0]["id"].as_str(), &p2["next_cursor"]),
        (Some(id.as_str()), &Value::Null)
    );
    let c = wbx(&d, "GET", "/v1/jobs?status=failed", k1, None).json();
    assert_eq!(c["jobs"], json!([]));
    let st = wbx(&d, "GET", "/v1/jobs/stats?days=30", k1, None).json();
    assert_eq!(st["by_template"][0]["template"], "base");
    assert_eq!(st["by_template"][0]["completed"], 2);
    assert_eq!(st["by_template"][0]["success_rate"], 1.0);
    // Nothing of the jobs' sandboxes is left.
    d.assert_clean();
    d.stop();
}

#[test]
fn test_failures_time_limits_cancels_retries_and_bad_input() {
    let d = Daemon::start_with(&[
        ("ISOBOX_WBX_JOB_MAX_TIMEOUT_S", "600"),
        ("ISOBOX_WBX_ARTIFACT_FILES", "3"),
        ("ISOBOX_WBX_ARTIFACT_FILE_MB", "1"),
        ("ISOBOX_WBX_ARTIFACT_JOB_MB", "2"),
        ("ISOBOX_WBX_JOBS_RUNNING", "3"),
    ]);
    d.wait_ready();
    let none = json!({"mode": "none"});
    let failing = submit(
        &d,
        None,
        &json!({"command": "echo about to fail; exit 3", "network": none}),
    );
    let missing = submit(
        &d,
        None,
        &json!({"command": "mkdir -p out && echo x > out/a.txt", "artifacts": ["out/"],
                "required_artifacts": ["out/a.txt", "out/b.txt"], "network": none}),
    );
    let expiring = submit(
        &d,
        None,
        &json!({"command": "mkdir -p output && echo partial > output/p.txt && echo started && sleep 60",
                "timeout_s": 2, "artifacts": ["output/"], "network": none}),
    );
    let f = finished(
        &d,
        None,
        failing["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    assert_eq!(
        (f["status"].as_str(), f["exit_code"].as_i64()),
        (Some("failed"), Some(3)),
        "{f}"
    );
    assert_eq!(f["error"]["code"], "nonzero_exit");
    assert_eq!(f["error"]["kind"], "job");
    let s = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{}/summary", failing["id"].as_str().unwrap()),
        None,
        None,
    )
    .json();
    assert!(s["next_step"].as_str().unwrap().contains("log"), "{s}");
    assert_eq!(s["last_log_lines"], json!(["about to fail"]));
    let m = finished(
        &d,
        None,
        missing["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    assert_eq!(
        (m["status"].as_str(), m["exit_code"].as_i64()),
        (Some("failed"), Some(0)),
        "{m}"
    );
    assert_eq!(m["error"]["code"], "missing_artifacts");
    assert!(
        m["error"]["message"]
            .as_str()
            .unwrap()
            .contains("out/b.txt"),
        "{m}"
    );
    assert_eq!(names(&m["result_files"]), ["out/a.txt"]);
    let e = finished(
        &d,
        None,
        expiring["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    assert_eq!(e["status"], "expired", "{e}");
    assert_eq!(e["error"]["code"], "timeout");
    assert!(
        e["duration_s"]
            .as_f64()
            .is_some_and(|s| (2.0..15.0).contains(&s)),
        "{e}"
    );
    // Files written before the time limit are kept.
    assert_eq!(names(&e["result_files"]), ["output/p.txt"]);
    let log = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{}/logs", expiring["id"].as_str().unwrap()),
        None,
        None,
    )
    .text();
    assert!(
        log.contains("started\n") && log.contains("the time limit of 2 s was reached"),
        "{log}"
    );

    // The log digest: real pytest output (tests/fixtures/logs) printed by a job.
    let pytest_out = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/logs/pytest-fail.txt"
    ))
    .unwrap();
    let cmd = format!(
        "for i in $(seq 300); do echo 'warning: cache miss'; done; cat <<'PYTEST_EOF'\n{pytest_out}PYTEST_EOF\nexit 1"
    );
    let t = submit(&d, None, &json!({"command": cmd, "network": none}));
    let tid = t["id"].as_str().unwrap();
    let tj = finished(&d, None, tid, Duration::from_secs(120));
    assert_eq!(
        (tj["status"].as_str(), tj["exit_code"].as_i64()),
        (Some("failed"), Some(1)),
        "{tj}"
    );
    let expected_results = json!([{"framework": "pytest", "passed": 4, "failed": 1, "skipped": 0, "total": 5,
        "failures": [{"name": "tests/test_api.py::test_refund", "file": "tests/test_api.py", "message": "assert 400 == 200"}]}]);
    let dg = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{tid}/logs?mode=summary&max_chars=2000"),
        None,
        None,
    )
    .json();
    assert_eq!(
        (
            dg["mode"].as_str(),
            dg["status"].as_str(),
            dg["exit_code"].as_i64()
        ),
        (Some("summary"), Some("failed"), Some(1)),
        "{dg}"
    );
    let text = dg["text"].as_str().unwrap();
    assert!(text.chars().count() <= 2000, "{text}");
    assert!(text.starts_with("[wbx] tests (pytest): 4 passed, 1 failed, 5 total\n  FAILED tests/test_api.py::test_refund – assert 400 == 200\n"), "{text}");
    assert!(
        text.contains("[wbx] errors:\n") && text.contains("[wbx] end of log:\n"),
        "{text}"
    );
    assert!(
        text.ends_with(
            "========================= 1 failed, 4 passed in 0.02s ==========================\n"
        ),
        "{text}"
    );
    assert_eq!(dg["test_results"], expected_results);
    assert_eq!(
        dg["lines"].as_u64(),
        Some(300 + pytest_out.lines().count() as u64)
    );
    let er = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{tid}/logs?mode=errors"),
        None,
        None,
    )
    .json();
    let etext = er["text"].as_str().unwrap();
    assert!(
        etext.contains("E       assert 400 == 200") && !etext.contains("[wbx] end of log"),
        "{etext}"
    );
    assert!(
        !etext.contains("warning: cache miss\nwarning: cache miss"),
        "repeats are collapsed: {etext}"
    );
    let sm = wbx(&d, "GET", &format!("/v1/jobs/{tid}/summary"), None, None).json();
    assert_eq!(sm["test_results"], expected_results);
    let rc = wbx(&d, "GET", &format!("/v1/jobs/{tid}/receipt"), None, None).json();
    assert_eq!(rc["test_results"], expected_results);

    // Result-file limits at, below and above each bound: 3 files, 1 MB each, 2 MB in all.
    let lim = submit(
        &d,
        None,
        &json!({"command": "mkdir -p r && head -c 1000000 /dev/zero > r/a && head -c 1000001 /dev/zero > r/b \
                 && head -c 999999 /dev/zero > r/c && head -c 2 /dev/zero > r/e && head -c 1 /dev/zero > r/f \
                 && head -c 1 /dev/zero > r/g && ln -s a r/h",
                "artifacts": ["r/"], "network": none}),
    );
    let l = finished(
        &d,
        None,
        lim["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    assert_eq!(l["status"], "completed", "{l}");
    let saved: Vec<(String, u64)> = l["result_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        saved,
        [
            ("r/a".into(), 1_000_000),
            ("r/c".into(), 999_999),
            ("r/f".into(), 1)
        ]
    );
    let skipped: Vec<(String, String)> = l["skipped_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let reason = |n: &str| {
        skipped
            .iter()
            .find(|(x, _)| x == n)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    };
    assert!(
        reason("r/b").contains("larger than the limit of 1000000 bytes per result file"),
        "{skipped:?}"
    );
    assert!(
        reason("r/e").contains("over the limit of 2000000 bytes of result files per job"),
        "{skipped:?}"
    );
    assert!(
        reason("r/g").contains("over the limit of 3 result files per job"),
        "{skipped:?}"
    );
    assert!(reason("r/h").contains("not a regular file"), "{skipped:?}");
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{}/artifacts/r/a", lim["id"].as_str().unwrap()),
        None,
        None,
    );
    assert_eq!(
        (r.body.len(), r.body.iter().all(|b| *b == 0)),
        (1_000_000, true)
    );

    // A cancel of a running job: it ends cancelled, its sandbox removed.
    let long = submit(
        &d,
        None,
        &json!({"command": "echo going; sleep 120", "network": none}),
    );
    let lid = long["id"].as_str().unwrap();
    until_status(&d, None, lid, "running");
    let r = wbx(&d, "POST", &format!("/v1/jobs/{lid}/cancel"), None, None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "cancelled");
    assert_eq!(r.json()["error"]["code"], "cancelled");
    let r = wbx(&d, "POST", &format!("/v1/jobs/{lid}/cancel"), None, None);
    assert_eq!(r.status, 409);
    assert_eq!(err(&r), "the job has already finished (cancelled)");
    let r = wbx(&d, "GET", &format!("/v1/jobs/{}/receipt", lid), None, None);
    assert_eq!(r.json()["status"], "cancelled");

    // A retry: env values must be sent again.
    let with_env = submit(
        &d,
        None,
        &json!({"command": "test \"$V\" = yes", "env": {"V": "yes"}, "network": none}),
    );
    let wid = with_env["id"].as_str().unwrap();
    assert_eq!(
        finished(&d, None, wid, Duration::from_secs(120))["status"],
        "completed"
    );
    let r = wbx(&d, "POST", &format!("/v1/jobs/{wid}/retry"), None, None);
    assert_eq!(r.status, 400);
    assert!(
        err(&r).contains("send them again") && err(&r).contains('V'),
        "{}",
        r.text()
    );
    let r = wbx(
        &d,
        "POST",
        &format!("/v1/jobs/{wid}/retry"),
        None,
        Some(&json!({"env": {"V": "no"}})),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let again = r.json();
    assert_ne!(again["id"], wid);
    assert_eq!(again["retry_of"], wid);
    let a = finished(
        &d,
        None,
        again["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    assert_eq!(
        (a["status"].as_str(), a["exit_code"].as_i64()),
        (Some("failed"), Some(1)),
        "{a}"
    );

    // The README's receipt check, as written there, passes on a real receipt.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let block = readme
        .split("To check one later:")
        .nth(1)
        .and_then(|r| r.split("```python\n").nth(1))
        .and_then(|r| r.split("```").next())
        .expect("README's receipt check");
    let script: String = block
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("http://127.0.0.1:8090", &format!("http://{}", d.addr))
        .replace("JOB_ID", wid);
    let out = std::process::Command::new(common::test_python())
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Bad input: a clear 400 naming the field, in the face's shape.
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "command: required"),
        (json!({"command": " "}), "command: 1 to"),
        (
            json!({"command": "true", "timeout_s": 0}),
            "timeout_s: 1 to 600 seconds",
        ),
        (
            json!({"command": "true", "timeout_s": 601}),
            "timeout_s: 1 to 600 seconds",
        ),
        (
            json!({"command": "true", "timeout_s": 5, "max_duration_seconds": 6}),
            "disagree",
        ),
        (
            json!({"command": "true", "artifacts": ["/etc/passwd"]}),
            "relative to the working directory",
        ),
        (
            json!({"command": "true", "artifacts": ["../x"]}),
            "climb out",
        ),
        (
            json!({"command": "true", "artifacts": "output/"}),
            "artifacts: must be a list",
        ),
        (
            json!({"command": "true", "retry": {"max_attempts": 9}}),
            "retry.max_attempts: a whole number from 1 to 5",
        ),
        (
            json!({"command": "true", "retry": {"on": "any"}}),
            "retry.on",
        ),
        (
            json!({"command": "true", "template": "nope"}),
            "template: unknown template",
        ),
        (
            json!({"command": "true", "compute_class": "turbo"}),
            "compute_class: unknown compute class \"turbo\"",
        ),
        (
            json!({"command": "true", "inputs": [{"job_id": "job_x", "name": "a"}]}),
            "inputs[0]: job_id: a job id",
        ),
        (
            json!({"command": "true", "inputs": [{"from_index": 0, "name": "a"}]}),
            "inputs[0]: unknown field `from_index`; it takes job_id, name, as",
        ),
        (
            json!({"command": "true", "inputs": {"job_id": "job_x"}}),
            "inputs: must be a list of objects",
        ),
        (
            json!({"command": "true", "inputs": (0..33).map(|i| json!({"job_id": "job_000000000000000000000000", "name": format!("f{i}")})).collect::<Vec<_>>()}),
            "inputs: at most 32 files",
        ),
        (
            // 32 pass the count; the first names no job of the caller's.
            json!({"command": "true", "inputs": (0..32).map(|i| json!({"job_id": "job_000000000000000000000000", "name": format!("f{i}")})).collect::<Vec<_>>()}),
            "inputs[0]: no job job_000000000000000000000000 of yours",
        ),
        (
            json!({"command": "true", "webhook_url": "http://example.com/"}),
            "webhook_url: only https://",
        ),
        (
            json!({"command": "true", "colour": 1}),
            "unknown field `colour`",
        ),
        (
            json!({"command": "true", "network": {"mode": "sometimes"}}),
            "network.mode",
        ),
        (
            json!({"command": "true", "optimize_for": "cheapest"}),
            "optimize_for: one of price, balanced, performance",
        ),
        (json!({"command": "true", "env": {"1X": "y"}}), "env:"),
        (
            json!({"command": "true", "idempotency_key": "has space"}),
            "idempotency_key: 1 to 256",
        ),
    ];
    for (body, want) in cases {
        let r = wbx(&d, "POST", "/v1/jobs", None, Some(&body));
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(err(&r).contains(want), "{body}: {}", r.text());
    }
    let r = wbx_h(
        &d,
        "POST",
        "/v1/jobs",
        None,
        Some(&json!({"command": "true", "idempotency_key": "a"})),
        &[("Idempotency-Key", "b")],
    );
    assert!(
        r.status == 400 && err(&r).contains("disagree"),
        "{}",
        r.text()
    );
    for q in ["status=nope", "limit=0", "limit=101", "cursor=x"] {
        let r = wbx(&d, "GET", &format!("/v1/jobs?{q}"), None, None);
        assert_eq!(r.status, 400, "{q}");
    }
    let r = wbx(&d, "GET", "/v1/jobs/stats?days=0", None, None);
    assert_eq!(r.status, 400);
    for id in ["job_000000000000000000000000", "job_x", "nope"] {
        let r = wbx(&d, "GET", &format!("/v1/jobs/{id}"), None, None);
        assert_eq!((r.status, err(&r).as_str()), (404, "job not found"), "{id}");
    }
    let r = wbx(&d, "DELETE", "/v1/jobs", None, None);
    assert_eq!(r.status, 405);
    // The daemon kept serving through all of it, and left nothing behind.
    d.assert_clean();
    d.stop();
}

/// A client that reads a job the moment it says it ended finds everything its end says:
/// its test results, and a signed receipt with its log's size and digest. (They come
/// from the log, synced and read as the end is written; a read in between used to get
/// `test_results: []` and a receipt signed with `"sha256": null`.)
#[test]
fn test_a_job_read_the_moment_it_ends_has_its_test_results_and_log_digest() {
    let d = Daemon::start();
    d.wait_ready();
    let pytest_out = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/logs/pytest-fail.txt"
    ))
    .unwrap();
    let noise = "warning: cache miss\n".repeat(3000);
    let log = format!("{noise}{pytest_out}");
    let cmd = format!(
        "for i in $(seq 3000); do echo 'warning: cache miss'; done; cat <<'PYTEST_EOF'\n{pytest_out}PYTEST_EOF\nexit 1"
    );
    let expected_results = json!([{"framework": "pytest", "passed": 4, "failed": 1, "skipped": 0, "total": 5,
        "failures": [{"name": "tests/test_api.py::test_refund", "file": "tests/test_api.py", "message": "assert 400 == 200"}]}]);
    for round in 0..4 {
        let id = submit(
            &d,
            None,
            &json!({"command": cmd, "network": {"mode": "none"}}),
        )["id"]
            .as_str()
            .unwrap()
            .to_string();
        // Polled with no pause, so the first read that sees its end comes as early as
        // a client's can.
        let t = Instant::now();
        let job = loop {
            let v = wbx(&d, "GET", &format!("/v1/jobs/{id}"), None, None).json();
            if FINISHED.contains(&v["status"].as_str().unwrap_or("")) {
                break v;
            }
            assert!(t.elapsed() < Duration::from_secs(120), "{v}\n{}", d.log());
        };
        assert_eq!(
            (job["status"].as_str(), job["exit_code"].as_i64()),
            (Some("failed"), Some(1)),
            "round {round}: {job}"
        );
        let sm = wbx(&d, "GET", &format!("/v1/jobs/{id}/summary"), None, None).json();
        assert_eq!(sm["status"], "failed", "round {round}: {sm}");
        assert_eq!(sm["test_results"], expected_results, "round {round}: {sm}");
        let rc = wbx(&d, "GET", &format!("/v1/jobs/{id}/receipt"), None, None).json();
        assert_eq!(
            rc["log"],
            json!({"size": log.len(), "sha256": sha256_hex(log.as_bytes()), "dropped_bytes": 0}),
            "round {round}: {rc}"
        );
        assert_eq!(rc["test_results"], expected_results, "round {round}: {rc}");
    }
}

#[test]
fn test_unfinished_jobs_per_tenant_at_and_above_the_bound_and_waiting_on_jobs() {
    let d = Daemon::start_with(&[
        ("ISOBOX_WBX_JOBS_PER_TENANT", "2"),
        ("ISOBOX_WBX_JOBS_RUNNING", "1"),
    ]);
    d.wait_ready();
    let body = json!({"command": "sleep 30", "network": {"mode": "none"}});
    let a = submit(&d, None, &body);
    let keyed = json!({"command": "sleep 30", "network": {"mode": "none"}, "idempotency_key": "b"});
    let b = submit(&d, None, &keyed);
    let r = wbx(&d, "POST", "/v1/jobs", None, Some(&body));
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(
        err(&r).contains("at most 2 unfinished jobs"),
        "{}",
        r.text()
    );
    // At the bound, a resend of an accepted job (its first answer lost) is that job,
    // not a 429 for a job that runs; by header as by field.
    for h in [&[][..], &[("Idempotency-Key", "b")][..]] {
        let again = wbx_h(
            &d,
            "POST",
            "/v1/jobs",
            None,
            Some(if h.is_empty() { &keyed } else { &body }),
            h,
        );
        assert_eq!(
            (again.status, again.json()["id"].as_str()),
            (202, b["id"].as_str()),
            "{}",
            again.text()
        );
    }
    // One at a time: the second waits in the queue.
    until_status(&d, None, a["id"].as_str().unwrap(), "running");
    assert_eq!(
        wbx(
            &d,
            "GET",
            &format!("/v1/jobs/{}", b["id"].as_str().unwrap()),
            None,
            None
        )
        .json()["status"],
        "queued"
    );
    let (aid, bid) = (
        a["id"].as_str().unwrap().to_string(),
        b["id"].as_str().unwrap().to_string(),
    );
    // Waiting on the server: at its time limit, `done: false` with each job's state.
    let t = Instant::now();
    let w = wbx(
        &d,
        "POST",
        "/v1/jobs/wait",
        None,
        Some(&json!({"job_ids": [aid, bid], "timeout_s": 1})),
    );
    assert_eq!(w.status, 200, "{}", w.text());
    let elapsed = t.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
    assert_eq!(
        w.json(),
        json!({"done": false, "finished": 0, "total": 2, "items": [
            {"id": aid, "kind": "job", "status": "running", "done": false},
            {"id": bid, "kind": "job", "status": "queued", "done": false}]})
    );
    for (body, status, want) in [
        (
            json!({"job_ids": [aid], "timeout_s": 61}),
            400,
            "timeout_s: at most 60",
        ),
        (
            json!({"job_ids": []}),
            400,
            "job_ids, batch_ids: at least one id",
        ),
        (
            json!({"job_ids": [aid], "batch_ids": ["bat_1"]}),
            404,
            "batch not found: bat_1",
        ),
        (json!({"job_ids": [aid], "until": "some"}), 400, "until:"),
        // 1 to 100 ids in all: 100 pass the count (then the first unknown is 404); 101,
        // in one list or across both, do not.
        (
            json!({"job_ids": (0..100).map(|i| format!("job_{i:024x}")).collect::<Vec<_>>()}),
            404,
            "job not found: job_000000000000000000000000",
        ),
        (
            json!({"job_ids": (0..101).map(|i| format!("job_{i:024x}")).collect::<Vec<_>>()}),
            400,
            "job_ids, batch_ids: at most 100 ids in one wait",
        ),
        (
            json!({"job_ids": (0..50).map(|i| format!("job_{i:024x}")).collect::<Vec<_>>(),
                   "batch_ids": (0..51).map(|i| format!("bat_{i:024x}")).collect::<Vec<_>>()}),
            400,
            "job_ids, batch_ids: at most 100 ids in one wait",
        ),
        (
            json!({"job_ids": ["job_000000000000000000000000"]}),
            404,
            "job not found: job_000000000000000000000000",
        ),
        (json!({"job_ids": [""]}), 404, "job not found: "),
    ] {
        let r = wbx(&d, "POST", "/v1/jobs/wait", None, Some(&body));
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert!(err(&r).contains(want), "{body}: {}", r.text());
    }
    // A wait held on the server wakes when a job ends (here: b, cancelled while queued).
    let waiter = {
        let addr = d.addr;
        let ids = json!({"job_ids": [aid.clone(), bid.clone()], "until": "any", "timeout_s": 60});
        std::thread::spawn(move || {
            let t = Instant::now();
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            let body = ids.to_string();
            let req = format!(
                "POST /wbx/v1/jobs/wait HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            std::io::Write::write_all(&mut s, req.as_bytes()).unwrap();
            let r = common::read_response(&mut std::io::BufReader::new(s), false).unwrap();
            (r, t.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // A queued job cancels at once; then there is room again (below the bound).
    let r = wbx(&d, "POST", &format!("/v1/jobs/{bid}/cancel"), None, None);
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (200, Some("cancelled"))
    );
    let (w, took) = waiter.join().unwrap();
    assert_eq!(w.status, 200);
    assert!(took < Duration::from_secs(10), "{took:?}");
    let w = w.json();
    assert_eq!(
        (w["done"].as_bool(), w["finished"].as_u64()),
        (Some(true), Some(1)),
        "{w}"
    );
    assert_eq!(
        w["items"][1],
        json!({"id": bid, "kind": "job", "status": "cancelled", "done": true})
    );
    let c = submit(
        &d,
        None,
        &json!({"command": "echo c", "network": {"mode": "none"}}),
    );
    let cid = c["id"].as_str().unwrap();
    let r = wbx(&d, "POST", &format!("/v1/jobs/{aid}/cancel"), None, None);
    assert_eq!(r.status, 200);
    // `all`: answered once every job named has ended.
    let w = wbx(
        &d,
        "POST",
        "/v1/jobs/wait",
        None,
        Some(&json!({"job_ids": [aid, cid], "until": "all", "timeout_s": 60})),
    )
    .json();
    assert_eq!(
        (w["done"].as_bool(), w["finished"].as_u64()),
        (Some(true), Some(2)),
        "{w}"
    );
    assert_eq!(w["items"][1]["status"], "completed");
    // Finished jobs answer at once.
    let t = Instant::now();
    let w = wbx(
        &d,
        "POST",
        "/v1/jobs/wait",
        None,
        Some(&json!({"job_ids": [cid], "timeout_s": 60})),
    )
    .json();
    assert!(
        w["done"] == true && t.elapsed() < Duration::from_secs(2),
        "{w}"
    );
    d.assert_clean();
    d.stop();
}

#[test]
fn test_a_kill_9_mid_job_loses_no_job_and_runs_none_twice_at_once() {
    let instance = format!("isobox-jobs{}", std::process::id());
    let data_dir = std::env::temp_dir().join(&instance);
    let _ = std::fs::remove_dir_all(&data_dir);
    let env = [
        ("ISOBOX_INSTANCE", instance.as_str()),
        ("ISOBOX_WBX_JOBS_RUNNING", "2"),
        // Priced, so what is charged and what is credited can be told apart.
        ("ISOBOX_WBX_PRICE_VCPU_S", "0.001"),
    ];
    let mut d = Daemon::start_with(&env);
    d.wait_ready();
    let none = json!({"mode": "none"});
    let amount = |v: &Value| -> f64 {
        let s = v.as_str().unwrap_or_else(|| panic!("not an amount: {v}"));
        s.strip_suffix(" EUR").unwrap().parse().unwrap()
    };

    // A sandbox lost while the daemon runs (everything in its cgroup killed from
    // outside): the job runs again in a fresh one, and its log says so, in order.
    let again = submit(
        &d,
        None,
        &json!({"command": "echo started; sleep 3; echo finished", "retry": {"max_attempts": 2}, "network": none}),
    );
    let aid = again["id"].as_str().unwrap().to_string();
    until_status(&d, None, &aid, "running");
    let t = Instant::now();
    while !wbx(&d, "GET", &format!("/v1/jobs/{aid}/logs"), None, None)
        .text()
        .contains("started")
    {
        assert!(t.elapsed() < Duration::from_secs(30), "no output");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut killed = 0;
    for c in ["memory", "pids", "cpu"] {
        let slice = std::path::PathBuf::from("/sys/fs/cgroup")
            .join(c)
            .join(&instance);
        for e in std::fs::read_dir(&slice).into_iter().flatten().flatten() {
            let procs = std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2) on a pid read from the test daemon's own cgroup.
                if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                    killed += 1;
                }
            }
        }
    }
    assert!(killed > 0, "no sandbox process found to kill");
    let a = finished(&d, None, &aid, Duration::from_secs(120));
    assert_eq!(
        (a["status"].as_str(), a["attempt"].as_u64()),
        (Some("completed"), Some(2)),
        "{a}\n{}",
        d.log()
    );
    // The lost attempt's run time is credited as the refund, never charged: the cost
    // is the second attempt's (3 s at least, at 0.001 a vCPU-second).
    assert!(amount(&a["refund"]) > 0.0, "{a}");
    assert!(amount(&a["cost"]) >= 0.003, "{a}");
    let log = wbx(&d, "GET", &format!("/v1/jobs/{aid}/logs"), None, None).text();
    let (first, rest) = log
        .split_once("[wbx] its sandbox was lost")
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        first.starts_with("started\n") && !first.contains("finished"),
        "{log}"
    );
    assert!(
        rest.contains("[wbx] attempt 2 of 2") && rest.ends_with("started\nfinished\n"),
        "{log}"
    );
    let rc = wbx(&d, "GET", &format!("/v1/jobs/{aid}/receipt"), None, None).json();
    assert_eq!(rc["log"]["sha256"], sha256_hex(log.as_bytes()), "{rc}");
    assert_eq!(rc["log"]["size"].as_u64(), Some(log.len() as u64));

    // Retried after the crash; failed after it (no retry asked); queued through it.
    let retried = submit(
        &d,
        None,
        &json!({"command": "echo attempt; sleep 6; echo finished", "retry": {"max_attempts": 2, "on": "system"}, "network": none}),
    );
    let lost = submit(&d, None, &json!({"command": "sleep 600", "network": none}));
    let queued = submit(&d, None, &json!({"command": "echo third", "network": none}));
    let (rid, lid, qid) = (
        retried["id"].as_str().unwrap().to_string(),
        lost["id"].as_str().unwrap().to_string(),
        queued["id"].as_str().unwrap().to_string(),
    );
    until_status(&d, None, &rid, "running");
    until_status(&d, None, &lid, "running");
    assert_eq!(
        wbx(&d, "GET", &format!("/v1/jobs/{qid}"), None, None).json()["status"],
        "queued"
    );
    // The crash comes while the first attempt still runs (its 6 s give a loaded host
    // room to boot the second job's sandbox).
    assert_eq!(
        wbx(&d, "GET", &format!("/v1/jobs/{rid}"), None, None).json()["status"],
        "running"
    );
    let mut child = d.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();

    let d2 = Daemon::start_with(&env);
    d2.wait_ready();
    let r = finished(&d2, None, &rid, Duration::from_secs(120));
    assert_eq!(r["status"], "completed", "{r}\n{}", d2.log());
    assert_eq!(r["attempt"], 2);
    let log = wbx(&d2, "GET", &format!("/v1/jobs/{rid}/logs"), None, None).text();
    assert!(
        log.contains("[wbx] attempt 2 of 2") && log.ends_with("finished\n"),
        "{log}"
    );
    let rc = wbx(&d2, "GET", &format!("/v1/jobs/{rid}/receipt"), None, None).json();
    assert_eq!(rc["log"]["sha256"], sha256_hex(log.as_bytes()), "{rc}");
    let l = finished(&d2, None, &lid, Duration::from_secs(60));
    assert_eq!(l["status"], "failed", "{l}");
    assert_eq!(
        (l["error"]["code"].as_str(), l["error"]["kind"].as_str()),
        (Some("sandbox_lost"), Some("system"))
    );
    let q = finished(&d2, None, &qid, Duration::from_secs(120));
    assert_eq!(q["status"], "completed");
    assert_eq!(amount(&q["refund"]), 0.0, "{q}");
    assert_eq!(
        wbx(&d2, "GET", &format!("/v1/jobs/{qid}/logs"), None, None).text(),
        "third\n"
    );
    // The crashed daemon's sandboxes were swept; the new one's are gone too.
    d2.assert_clean();
    d2.stop();
    drop(d);
}

#[test]
fn test_webhooks_are_signed_survive_a_kill_9_and_never_reach_a_private_address() {
    let (port, got) = receiver(true);
    let instance = format!("isobox-hooks{}", std::process::id());
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&instance));
    let env = [
        ("ISOBOX_INSTANCE", instance.as_str()),
        ("ISOBOX_WBX_WEBHOOK_LOOPBACK", "1"),
    ];
    let mut d = Daemon::start_with(&env);
    d.wait_ready();
    let none = json!({"mode": "none"});
    // Refused at submit: not https, or not a public address.
    for (url, want) in [
        ("http://10.1.2.3/hook", "only https://"),
        (
            "https://169.254.169.254/latest/meta-data",
            "not a public address",
        ),
        ("https://10.0.0.1/hook", "not a public address"),
        ("https://user:pw@example.com/", "user name or password"),
        ("ftp://example.com/", "scheme ftp://"),
    ] {
        let r = wbx(
            &d,
            "POST",
            "/v1/jobs",
            None,
            Some(&json!({"command": "true", "webhook_url": url})),
        );
        assert_eq!(r.status, 400, "{url}");
        assert!(
            err(&r).starts_with("webhook_url: ") && err(&r).contains(want),
            "{url}: {}",
            r.text()
        );
    }
    let url = format!("http://127.0.0.1:{port}/hook");
    let job = submit(
        &d,
        None,
        &json!({"command": "echo hi", "webhook_url": url, "network": none}),
    );
    let id = job["id"].as_str().unwrap().to_string();
    assert_eq!(job["webhook_url"], url.as_str());
    // The first delivery arrives and is held: the daemon dies before it is answered.
    until_delivered(&d, &got, 1);
    let mut child = d.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let d2 = Daemon::start_with(&env);
    d2.wait_ready();
    // Delivered again after the restart (at least once), with the same event id.
    until_delivered(&d2, &got, 2);
    let deliveries = got.lock().unwrap().clone();
    let secret = wbx(&d2, "GET", "/v1/webhooks/secret", None, None).json()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        secret.starts_with("whsec_") && secret.len() == 54,
        "{secret}"
    );
    for (head, body) in &deliveries {
        assert!(head[0].starts_with("POST /hook "), "{head:?}");
        assert_eq!(header(head, "X-WBX-Event"), "job.finished");
        assert!(header(head, "X-WBX-Delivery").starts_with("dlv_"));
        let ev: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(
            (ev["event"].as_str(), ev["id"].as_str()),
            (Some("job.finished"), Some(id.as_str()))
        );
        assert_eq!(
            (
                ev["data"]["status"].as_str(),
                ev["data"]["exit_code"].as_i64()
            ),
            (Some("completed"), Some(0)),
            "{ev}"
        );
        assert_eq!(ev["data"]["cost"], "0.000000 EUR");
        // The document's snippet accepts it with the tenant's secret; an edited body
        // or another secret does not pass.
        let sig = header(head, "X-WBX-Signature");
        assert!(verifies(&secret, body, sig), "{sig}");
        let mut edited = body.clone();
        edited[0] = b' ';
        assert!(!verifies(&secret, &edited, sig));
        assert!(!verifies("whsec_other", body, sig));
    }
    assert_eq!(deliveries[0].1, deliveries[1].1, "one event, one body");
    assert_ne!(
        header(&deliveries[0].0, "X-WBX-Delivery"),
        header(&deliveries[1].0, "X-WBX-Delivery")
    );
    // The job says how its delivery went.
    let t = Instant::now();
    loop {
        let j = wbx(&d2, "GET", &format!("/v1/jobs/{id}"), None, None).json();
        if j["webhook"]["state"] == "delivered" {
            assert!(
                j["webhook"]["attempts"].as_u64().is_some_and(|a| a >= 1),
                "{j}"
            );
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{j}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A rotation gives a new secret; the old one no longer signs.
    let rotated = wbx(&d2, "POST", "/v1/webhooks/secret/rotate", None, None).json()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(rotated, secret);
    assert_eq!(
        wbx(&d2, "GET", "/v1/webhooks/secret", None, None).json()["secret"],
        rotated.as_str()
    );
    d2.assert_clean();
    d2.stop();
    drop(d);
}

#[test]
fn test_a_webhook_name_that_resolves_to_loopback_gets_no_connection() {
    // Without the loopback setting, `localhost` passes the submit (a name), and its
    // delivery is refused once the name resolves: nothing connects.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let port = l.local_addr().unwrap().port();
    let d = Daemon::start();
    d.wait_ready();
    let job = submit(
        &d,
        None,
        &json!({"command": "true", "webhook_url": format!("https://localhost:{port}/hook"), "network": {"mode": "none"}}),
    );
    let id = job["id"].as_str().unwrap();
    finished(&d, None, id, Duration::from_secs(120));
    let t = Instant::now();
    let j = loop {
        let j = wbx(&d, "GET", &format!("/v1/jobs/{id}"), None, None).json();
        if j["webhook"]["attempts"].as_u64().is_some_and(|a| a >= 1) {
            break j;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{j}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(j["webhook"]["state"], "pending", "{j}");
    let why = j["webhook"]["last_error"].as_str().unwrap();
    assert!(
        why.contains("resolves only to addresses deliveries may not reach")
            && why.contains("nothing was sent"),
        "{why}"
    );
    assert!(j["webhook"]["next_attempt_at"].is_string(), "{j}");
    assert!(
        l.accept().is_err(),
        "the daemon connected to a loopback address"
    );
    d.assert_clean();
    d.stop();
}

#[test]
fn test_max_cost_and_the_budget_hold_under_concurrent_submits() {
    // 0.001 EUR per vCPU-second: a job's sandbox (2 vCPU) costs 0.002 EUR a second;
    // a job of timeout_s 60 (and the 60 s reserve) has a worst case of 0.24 EUR.
    let d = Daemon::start_with(&[
        ("ISOBOX_WBX_PRICE_VCPU_S", "0.001"),
        ("ISOBOX_WBX_JOBS_RUNNING", "1"),
    ]);
    d.wait_ready();
    let none = json!({"mode": "none"});
    // max_cost below, at and above the worst case.
    let r = wbx(
        &d,
        "POST",
        "/v1/jobs",
        None,
        Some(&json!({"command": "true", "timeout_s": 60, "max_cost": "0.23", "network": none})),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        err(&r).contains("up to 0.240000 EUR")
            && err(&r).contains("the longest time limit that fits is timeout_s 55"),
        "{}",
        r.text()
    );
    let at = submit(
        &d,
        None,
        &json!({"command": "true", "timeout_s": 60, "max_cost": "0.24", "network": none}),
    );
    let above = submit(
        &d,
        None,
        &json!({"command": "true", "timeout_s": 60, "max_cost_eur": 0.25, "network": none}),
    );
    for (body, want) in [
        (
            json!({"command": "true", "max_cost": "0.10", "max_cost_eur": "0.20"}),
            "disagree",
        ),
        (json!({"command": "true", "max_cost": "ten"}), "max_cost:"),
        (json!({"command": "true", "max_cost": "-1"}), "max_cost:"),
    ] {
        let r = wbx(&d, "POST", "/v1/jobs", None, Some(&body));
        assert_eq!(r.status, 400, "{body}");
        assert!(err(&r).contains(want), "{body}: {}", r.text());
    }
    for j in [&at, &above] {
        assert_eq!(
            finished(
                &d,
                None,
                j["id"].as_str().unwrap(),
                Duration::from_secs(120)
            )["status"],
            "completed"
        );
    }
    // A monthly limit of 1.00: four such jobs fit (0.96), whatever order 20 concurrent
    // submits arrive in; the rest are 402 and spending never passes the limit.
    let b = wbx(
        &d,
        "PUT",
        "/v1/budget",
        None,
        Some(&json!({"monthly_limit": "1.00", "daily_limit": "", "alert_pct": 80})),
    );
    assert_eq!(b.status, 200, "{}", b.text());
    let b = b.json();
    assert_eq!(
        (
            b["monthly_limit"].as_str(),
            &b["daily_limit"],
            b["alert_pct"].as_u64()
        ),
        (Some("1.000000"), &Value::Null, Some(80)),
        "{b}"
    );
    assert_eq!(b["reserved"], "0.000000 EUR");
    let spent_before = b["spent_this_month"].as_str().unwrap().to_string();
    assert_ne!(
        spent_before, "0.000000 EUR",
        "the two jobs' run time is billed: {b}"
    );
    let addr = d.addr;
    let handles: Vec<_> = (0..20)
        .map(|_| {
            std::thread::spawn(move || {
                let body = json!({"command": "sleep 30", "timeout_s": 60, "network": {"mode": "none"}}).to_string();
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                let req = format!("POST /wbx/v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                std::io::Write::write_all(&mut s, req.as_bytes()).unwrap();
                common::read_response(&mut std::io::BufReader::new(s), false).unwrap()
            })
        })
        .collect();
    let answers: Vec<Resp> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let accepted: Vec<String> = answers
        .iter()
        .filter(|r| r.status == 202)
        .map(|r| r.json()["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        accepted.len(),
        4,
        "{:?}",
        answers
            .iter()
            .map(|r| (r.status, r.text()))
            .collect::<Vec<_>>()
    );
    for r in answers.iter().filter(|r| r.status != 202) {
        assert_eq!(r.status, 402, "{}", r.text());
        assert!(err(r).starts_with("budget_exceeded: this job could cost up to 0.240000 EUR; the monthly limit is 1.000000 EUR"), "{}", r.text());
    }
    let b = wbx(&d, "GET", "/v1/budget", None, None).json();
    assert_eq!(b["reserved"], "0.960000 EUR", "{b}");
    assert_eq!(b["alert"], true, "{b}");
    // Ended jobs give their reservation back; what they ran is spent.
    for id in &accepted {
        let r = wbx(&d, "POST", &format!("/v1/jobs/{id}/cancel"), None, None);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let b = wbx(&d, "GET", "/v1/budget", None, None).json();
    assert_eq!(b["reserved"], "0.000000 EUR", "{b}");
    let spent: f64 = b["spent_this_month"]
        .as_str()
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(spent <= 1.0, "{b}");
    assert_eq!(b["spent_today"], b["spent_this_month"]);
    // Removing the limit; bad input.
    let b = wbx(
        &d,
        "PUT",
        "/v1/budget",
        None,
        Some(&json!({"monthly_limit": ""})),
    )
    .json();
    assert_eq!(
        (&b["monthly_limit"], &b["left_this_month"]),
        (&Value::Null, &Value::Null),
        "{b}"
    );
    for (body, want) in [
        (json!({"monthly_limit": "-1"}), "monthly_limit:"),
        (json!({"daily_limit": []}), "daily_limit:"),
        (json!({"alert_pct": 0}), "alert_pct:"),
        (json!({"alert_pct": 101}), "alert_pct:"),
        (json!({"limit": "1"}), "unknown field `limit`"),
    ] {
        let r = wbx(&d, "PUT", "/v1/budget", None, Some(&body));
        assert_eq!(r.status, 400, "{body}");
        assert!(err(&r).contains(want), "{body}: {}", r.text());
    }
    // Changes sent at once each keep what the others set (each was merged into the
    // budget as it was when it arrived, and the last written won).
    for round in 1..=5 {
        let puts: Vec<std::net::TcpStream> = [
            json!({"monthly_limit": format!("{round}0.00")}),
            json!({"daily_limit": format!("{round}.00")}),
            json!({"alert_pct": 10 + round}),
        ]
        .iter()
        .map(|body| {
            d.send(
                "PUT",
                "/wbx/v1/budget",
                &[("Content-Type", "application/json")],
                body.to_string().as_bytes(),
            )
        })
        .collect();
        for s in puts {
            let r = common::read_response(&mut std::io::BufReader::new(s), false).unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
        }
        let b = wbx(&d, "GET", "/v1/budget", None, None).json();
        assert_eq!(
            (&b["monthly_limit"], &b["daily_limit"], &b["alert_pct"]),
            (
                &json!(format!("{round}0.000000")),
                &json!(format!("{round}.000000")),
                &json!(10 + round)
            ),
            "round {round}: {b}"
        );
    }
    d.assert_clean();
    d.stop();
}

#[test]
fn test_a_job_that_asks_for_what_the_warm_pool_holds_runs_in_a_pooled_sandbox() {
    // A job holds its slot until its sandbox is gone (~1 s after its end): with
    // room for 8, the jobs below never wait for one another's teardown.
    let d = Daemon::start_with(&[
        ("ISOBOX_WBX_WARM_POOL", "base=1"),
        ("ISOBOX_WBX_JOBS_RUNNING", "8"),
    ]);
    d.wait_ready();
    let pool = || d.get("/healthz").json()["wbxWarmPool"].clone();
    let counts = || {
        let p = pool();
        (p["hits"].as_u64().unwrap(), p["misses"].as_u64().unwrap())
    };
    let wait_full = || {
        let t0 = Instant::now();
        while pool()["templates"]["base"]["ready"] != 1 {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the pool never filled: {}\nlog:\n{}",
                pool(),
                d.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_full();
    assert_eq!(counts(), (0, 0));

    // The default job (template base, network full, economy, no inputs) takes the
    // pooled sandbox, and finds it as a cold job would: its env, user, an empty home.
    let job = submit(
        &d,
        None,
        &json!({"command": "echo \"token ${#TOKEN}\"; id -un; pwd; ls -A | wc -l; echo kept > out.txt",
                "env": {"TOKEN": "t-123456"}, "timeout_s": 60, "required_artifacts": ["out.txt"]}),
    );
    let id = job["id"].as_str().unwrap().to_string();
    let v = finished(&d, None, &id, Duration::from_secs(60));
    assert_eq!(
        (v["status"].as_str(), v["exit_code"].as_i64()),
        (Some("completed"), Some(0)),
        "{v}\nlog:\n{}",
        d.log()
    );
    assert_eq!(counts(), (1, 0), "{}", pool());
    let log = wbx(&d, "GET", &format!("/v1/jobs/{id}/logs"), None, None);
    assert_eq!(log.status, 200);
    assert!(
        log.text().contains("token 8\nuser\n/home/user\n0\n"),
        "{}",
        log.text()
    );
    assert_eq!(names(&v["result_files"]), ["out.txt"]);
    let r = wbx(&d, "GET", &format!("/v1/jobs/{id}/receipt"), None, None).json();
    assert!(r["cpu_time_ms"].as_u64().is_some(), "{r}");
    assert!(
        d.log().contains("taken from the warm pool"),
        "the pool served it: {}",
        d.log()
    );

    // The job's own time limit holds on a pooled sandbox.
    wait_full();
    let slow = submit(
        &d,
        None,
        &json!({"command": "echo started; sleep 60", "timeout_s": 2}),
    );
    let e = finished(
        &d,
        None,
        slow["id"].as_str().unwrap(),
        Duration::from_secs(60),
    );
    assert_eq!(
        (e["status"].as_str(), e["error"]["code"].as_str()),
        (Some("expired"), Some("timeout")),
        "{e}"
    );
    assert_eq!(counts(), (2, 0), "{}", pool());

    // What the pool does not hold boots cold and is no miss: network none, another
    // class, and inputs (bound into the sandbox at its boot).
    wait_full();
    for body in [
        json!({"command": "true", "network": {"mode": "none"}}),
        json!({"command": "true", "compute_class": "balanced"}),
        json!({"command": "cat input/out.txt", "inputs": [{"job_id": id, "name": "out.txt"}]}),
    ] {
        let j = submit(&d, None, &body);
        let v = finished(&d, None, j["id"].as_str().unwrap(), Duration::from_secs(60));
        assert_eq!(v["status"], "completed", "{body}: {v}");
    }
    assert_eq!(counts(), (2, 0), "{}", pool());
    assert_eq!(pool()["templates"]["base"]["ready"], 1);

    // Every job's sandbox is removed after its end: only the pool's is left.
    let only_the_pool = || {
        let t0 = Instant::now();
        loop {
            let boxes: Vec<String> = d
                .leftovers()
                .into_iter()
                .filter(|l| l.starts_with("/sys/fs/cgroup/memory/"))
                .collect();
            if boxes.len() == 1 && pool()["templates"]["base"]["ready"] == 1 {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "sandboxes: {boxes:?}, pool {}",
                pool()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    only_the_pool();
    // Two at once: one takes the pooled sandbox, the other finds the pool refilling
    // (a boot takes far longer than a submit) and counts a miss.
    let a = submit(&d, None, &json!({"command": "true"}));
    let b = submit(&d, None, &json!({"command": "true"}));
    for j in [&a, &b] {
        let v = finished(&d, None, j["id"].as_str().unwrap(), Duration::from_secs(60));
        assert_eq!(v["status"], "completed", "{v}");
    }
    assert_eq!(counts(), (3, 1), "{}\n{}", pool(), d.log());
    only_the_pool();
    // The pooled one ends with the daemon (`stop` checks that nothing is left).
    d.stop();
}

/// Without its init binary a long-lived sandbox cannot boot. The daemon says so once in
/// its log (with the path), refuses creates and shared-sandbox requests with a clear 503
/// in each face's shape, fails jobs "on our side" with the same words, and tries no
/// boot meanwhile (the pool stays empty); one-off runs go on. Putting the binary in
/// place needs no restart.
#[test]
fn test_without_its_init_binary_sandboxes_and_jobs_say_so_and_runs_go_on() {
    const WHY: &str = "long-lived sandboxes are unavailable on this server: its sandbox init \
        (isobox-init) is not installed; its operator's `isoboxd check` says more";
    let dir = std::env::temp_dir().join(format!("isobox-noinit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let init = dir.join("isobox-init");
    let d = Daemon::start_with(&[
        ("ISOBOX_INIT", init.to_str().unwrap()),
        ("ISOBOX_WBX_WARM_POOL", "base=1"),
    ]);
    d.wait_ready();

    let r = wbx(
        &d,
        "POST",
        "/v1/sandboxes",
        None,
        Some(&json!({"template": "base"})),
    );
    assert_eq!(
        (r.status, r.json()),
        (503, json!({"error": WHY})),
        "{}",
        r.text()
    );

    let job = submit(&d, None, &json!({"command": "echo hi", "timeout_s": 60}));
    let id = job["id"].as_str().unwrap().to_string();
    let v = finished(&d, None, &id, Duration::from_secs(60));
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(
        v["error"],
        json!({"code": "sandbox_lost", "message": WHY, "kind": "system"}),
        "{v}"
    );
    assert_eq!(
        v["cost"], "0.000000 EUR",
        "nothing ran, nothing is charged: {v}"
    );

    let shared = d.post_json(
        "/execute",
        &json!({"language": "python-slim", "code": "print(input())",
                "inputs": [{"stdin": "a"}, {"stdin": "b"}], "sharedSandbox": true}),
    );
    assert_eq!(
        (shared.status, shared.json()),
        (503, json!({"error": "unavailable", "detail": WHY})),
        "{}",
        shared.text()
    );
    // A one-off run needs no init.
    let run = d.post_json(
        "/execute",
        &json!({"language": "python-slim", "code": "print(6*7)"}),
    );
    assert_eq!(run.status, 200, "{}", run.text());
    assert_eq!(run.json()["run"]["stdout"], "42\n");

    // No boot was tried, and the log named the path once.
    std::thread::sleep(Duration::from_millis(2500));
    let pool = d.get("/healthz").json()["wbxWarmPool"].clone();
    assert_eq!(pool["templates"]["base"]["ready"], 0, "{pool}");
    assert_eq!(pool["failures"], 0, "{pool}");
    let log = d.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("is missing or not executable"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(said[0].contains(init.to_str().unwrap()), "{}", said[0]);
    assert!(
        !r.text().contains(init.to_str().unwrap()),
        "the client is not told host paths"
    );

    // The binary put in place: sandboxes boot, without a restart.
    std::fs::copy(env!("CARGO_BIN_EXE_isobox-init"), &init).unwrap();
    let r = wbx(
        &d,
        "POST",
        "/v1/sandboxes",
        None,
        Some(&json!({"template": "base"})),
    );
    assert_eq!(r.status, 201, "{}\nlog:\n{}", r.text(), d.log_tail());
    let sid = r.json()["id"].as_str().unwrap().to_string();
    let e = wbx(
        &d,
        "POST",
        &format!("/v1/sandboxes/{sid}/exec"),
        None,
        Some(&json!({"cmd": "echo up"})),
    );
    assert_eq!(
        (e.status, e.json()["stdout"].as_str()),
        (200, Some("up\n")),
        "{}",
        e.text()
    );
    assert_eq!(
        wbx(&d, "DELETE", &format!("/v1/sandboxes/{sid}"), None, None).status,
        204
    );
    drop(d);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tenant's finished jobs' records in the store are bounded
/// (`ISOBOX_WBX_JOB_RECORDS_TENANT_MB`): below it a submit is taken, at or past it
/// refused with 429 saying what fills it. (Without a bound one tenant's records could
/// fill the store that every write of every tenant needs.) On the way, the command's
/// own bound: the longest runs, one byte more is refused.
#[test]
fn test_a_tenants_job_records_are_bounded_in_the_store() {
    let d = Daemon::start_with(&[("ISOBOX_WBX_JOB_RECORDS_TENANT_MB", "1")]);
    d.wait_ready();
    let longest = 128 * 1024 - 1;
    let job = |len: usize| {
        json!({"command": format!("true #{}", "x".repeat(len - 6)),
               "network": {"mode": "none"}, "timeout_s": 60})
    };
    let r = wbx(&d, "POST", "/v1/jobs", None, Some(&job(longest + 1)));
    assert_eq!(
        (r.status, err(&r)),
        (
            400,
            format!("command: 1 to {longest} bytes, not blank, without NUL")
        )
    );
    // Each record ~132 kB (its command): seven stay below 1 MB until the eighth ends.
    let mut taken = 0;
    let refusal = loop {
        let r = wbx(&d, "POST", "/v1/jobs", None, Some(&job(longest)));
        if r.status == 429 {
            break err(&r);
        }
        assert_eq!(r.status, 202, "{}", r.text());
        taken += 1;
        assert!(taken <= 8, "a ninth job was taken");
        let id = r.json()["id"].as_str().unwrap().to_string();
        let v = finished(&d, None, &id, Duration::from_secs(120));
        assert_eq!(
            (&v["status"], &v["exit_code"]),
            (&json!("completed"), &json!(0)),
            "{}",
            v["error"]
        );
    };
    assert_eq!(taken, 8, "{refusal}");
    let used: u64 = refusal
        .strip_prefix("limit reached: this tenant's finished jobs' records (")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{refusal}"));
    // At the eighth's end it passed the bound; before it, seven were below.
    assert!(
        used >= 1_000_000 && used / 8 * 7 < 1_000_000,
        "{used}: {refusal}"
    );
    assert!(
        refusal.ends_with("fill its 1000000 bytes (ISOBOX_WBX_JOB_RECORDS_TENANT_MB); they are removed 604800 s after their jobs end"),
        "{refusal}"
    );
    // Refused again (past it), and a batch too; reads still answer.
    let r = wbx(
        &d,
        "POST",
        "/v1/jobs",
        None,
        Some(&json!({"command": "true"})),
    );
    assert_eq!((r.status, err(&r)), (429, refusal.clone()));
    let r = wbx(
        &d,
        "POST",
        "/v1/batches",
        None,
        Some(&json!({"jobs": [{"command": "true"}]})),
    );
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(wbx(&d, "GET", "/v1/jobs", None, None).status, 200);
    d.assert_clean();
    d.stop();
}

/// A tenant whose webhook target never answers (each attempt takes the 10 s timeout)
/// does not hold up another tenant's: it has at most two deliveries in flight, and the
/// other's event goes out on a free sender while the first's still wait. (Before, one
/// sender took the due events in order: the other tenant's came after every attempt of
/// the first's.)
#[test]
fn test_a_tenants_unanswered_webhooks_do_not_hold_up_anothers() {
    // A target that takes connections and never answers; it counts them.
    let tarpit = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let slow_port = tarpit.local_addr().unwrap().port();
    let held: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>> = Default::default();
    {
        let held = std::sync::Arc::clone(&held);
        std::thread::spawn(move || {
            for s in tarpit.incoming().flatten() {
                held.lock().unwrap().push(s);
            }
        });
    }
    let (port, got) = receiver(false);
    let d = Daemon::start_with(&[
        ("ISOBOX_API_KEYS", "hooks-key-one,hooks-key-two"),
        ("ISOBOX_WBX_WEBHOOK_LOOPBACK", "1"),
        ("ISOBOX_WBX_JOBS_RUNNING", "4"),
    ]);
    d.wait_ready();
    let none = json!({"mode": "none"});
    let slow = format!("http://127.0.0.1:{slow_port}/hook");
    let ids: Vec<String> = (0..6)
        .map(|_| {
            submit(
                &d,
                Some("hooks-key-one"),
                &json!({"command": "true", "network": none, "webhook_url": slow}),
            )["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    for id in &ids {
        finished(&d, Some("hooks-key-one"), id, Duration::from_secs(120));
    }
    // The first tenant's first attempt is under way.
    let t = Instant::now();
    while held.lock().unwrap().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no attempt\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let fast = format!("http://127.0.0.1:{port}/hook");
    let job = submit(
        &d,
        Some("hooks-key-two"),
        &json!({"command": "true", "network": none, "webhook_url": fast}),
    );
    let id = job["id"].as_str().unwrap().to_string();
    finished(&d, Some("hooks-key-two"), &id, Duration::from_secs(120));
    until_delivered(&d, &got, 1);
    // Delivered while the first tenant's six were still being tried (two at a time,
    // 10 s each: at most four begun unless the host stalled for 10 s).
    let attempts = held.lock().unwrap().len();
    assert!(
        attempts <= 4,
        "{attempts} of the first tenant's attempts came first"
    );
    let (_, body) = got.lock().unwrap()[0].clone();
    let ev: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(ev["id"].as_str(), Some(id.as_str()), "{ev}");
    drop(held);
    d.assert_clean();
    d.stop();
}

/// Result-file patterns cost bounded work on the daemon's loop: `**` alternating with a
/// name 100 times against a tree 120 levels deep (the matcher tried every split of
/// every `**` again and again: hours, with every face stopped) is matched by a table,
/// and its one file is saved; 50 patterns whose stars backtrack against 300 names of
/// 255 bytes use up the saving's budget, and the job says what was not looked through.
#[test]
fn test_hostile_result_patterns_cost_bounded_work() {
    let d = Daemon::start();
    d.wait_ready();
    let none = json!({"mode": "none"});
    let deep = vec!["a"; 120].join("/");
    let alt = format!("{}zz", "**/a/".repeat(100));
    let j1 = submit(
        &d,
        None,
        &json!({"command": format!("mkdir -p {deep} && echo found > {deep}/zz"), "artifacts": [alt], "network": none}),
    );
    let stars: Vec<String> = (0..50)
        .map(|i| format!("*{}b{i}", "a".repeat(127)))
        .collect();
    let j2 = submit(
        &d,
        None,
        &json!({"command": "python3 -c \"[open('a' * 252 + '%03d' % i, 'w').close() for i in range(300)]\"", "artifacts": stars, "network": none}),
    );
    let v = finished(
        &d,
        None,
        j1["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    assert_eq!(v["status"], "completed", "{v}\n{}", d.log());
    assert_eq!(names(&v["result_files"]), [format!("{deep}/zz")], "{v}");
    assert_eq!(v["skipped_files"], json!([]), "{v}");
    let v = finished(
        &d,
        None,
        j2["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    assert_eq!(v["status"], "completed", "{v}\n{}", d.log());
    assert_eq!(v["result_files"], json!([]), "{v}");
    let skipped = v["skipped_files"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{v}");
    assert!(
        skipped[0]["reason"]
            .as_str()
            .unwrap()
            .contains("matching the result-file patterns took more than 20000000 steps"),
        "{v}"
    );
    assert_eq!(
        wbx(&d, "GET", "/v1/jobs", None, None).status,
        200,
        "the daemon answers"
    );
    d.assert_clean();
    d.stop();
}

/// A job's command and env travel to its sandbox in one call of at most 1 MiB (as
/// JSON: a control character takes six bytes): at the bound the job is accepted and
/// its command starts with every variable; one byte past it is refused at submit
/// (such a job was accepted, booted a sandbox, then failed `command_too_large`).
#[test]
fn test_a_job_accepted_can_start_its_command() {
    const CMD: &str = "echo ${#C0} ${#X} ${#Y}";
    let d = Daemon::start();
    d.wait_ready();
    let spawn_len = |env: &[(String, String)]| -> usize {
        let e: Vec<String> = env
            .iter()
            .map(|(k, v)| {
                format!(
                    "[{},{}]",
                    serde_json::to_string(k).unwrap(),
                    serde_json::to_string(v).unwrap()
                )
            })
            .collect();
        format!(
            r#"{{"op":"spawn","cmd":{},"cwd":"/home/user","env":[{}],"stdin":false,"background":false}}"#,
            serde_json::to_string(CMD).unwrap(),
            e.join(",")
        )
        .len()
    };
    let ctl = "\u{1}".repeat(32768);
    let mut env: Vec<(String, String)> = (0..5).map(|i| (format!("C{i}"), ctl.clone())).collect();
    env.push(("X".into(), "x".repeat(32768)));
    env.push(("Y".into(), String::new()));
    let fill = (1 << 20) - spawn_len(&env);
    assert!(fill <= 32768, "{fill}");
    let body = |y: usize| {
        let mut m = serde_json::Map::new();
        for (k, v) in &env[..6] {
            m.insert(k.clone(), Value::from(v.clone()));
        }
        m.insert("Y".into(), Value::from("y".repeat(y)));
        json!({"command": CMD, "env": m, "network": {"mode": "none"}})
    };
    let r = wbx(&d, "POST", "/v1/jobs", None, Some(&body(fill + 1)));
    assert_eq!(
        (r.status, err(&r).as_str()),
        (
            400,
            "command and env: together 1048582 bytes in the call that starts the command (as JSON, control characters escaped); at most 1048581"
        )
    );
    let j = submit(&d, None, &body(fill));
    let v = finished(
        &d,
        None,
        j["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    assert_eq!(v["status"], "completed", "{v}\n{}", d.log());
    let log = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{}/logs", j["id"].as_str().unwrap()),
        None,
        None,
    )
    .text();
    assert_eq!(log, format!("32768 32768 {fill}\n"));
    d.assert_clean();
    d.stop();
}

//! The WBX face's batches (`/wbx/v1/batches`) and files passed between jobs (`inputs`),
//! against the real daemon with real runsc, cgroups, LMDB and sockets, as a client of
//! `wbx-sandbox-api.txt` would use them: the document's own fan-out example, waiting on
//! a batch, its summary, report and CSV, `batch.finished` checked with the document's
//! snippet, a failed dependency cancelling what depends on it, cancel, bad batches,
//! bounds, and a kill -9 in the middle of a batch.

mod common;
use common::wbx::*;
use common::{sha256_hex, Daemon};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn submit_batch(d: &Daemon, key: Option<&str>, body: &Value, extra: &[(&str, &str)]) -> Value {
    let r = wbx_h(d, "POST", "/v1/batches", key, Some(body), extra);
    assert_eq!(r.status, 202, "{}\nlog:\n{}", r.text(), d.log());
    let v = r.json();
    assert!(
        v["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("bat_") && i.len() == 28),
        "{v}"
    );
    v
}

/// Waits on the server (`POST /v1/jobs/wait`) until the batch has finished; its summary.
fn batch_done(d: &Daemon, key: Option<&str>, id: &str, within: Duration) -> Value {
    let t = Instant::now();
    loop {
        let r = wbx(
            d,
            "POST",
            "/v1/jobs/wait",
            key,
            Some(&json!({"batch_ids": [id], "until": "all", "timeout_s": 10})),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let w = r.json();
        assert_eq!(w["items"][0]["kind"], "batch", "{w}");
        if w["done"] == true {
            let s = wbx(d, "GET", &format!("/v1/batches/{id}"), key, None);
            assert_eq!(s.status, 200, "{}", s.text());
            let s = s.json();
            assert_eq!(w["items"][0]["status"], s["status"], "{w} {s}");
            return s;
        }
        assert!(
            t.elapsed() < within,
            "batch {id} did not finish within {within:?}: {w}\nlog:\n{}",
            d.log()
        );
    }
}

/// An env of `n` values of 32 KiB each.
fn big_env(n: usize) -> Value {
    (0..n)
        .map(|i| (format!("V{i}"), json!("x".repeat(32 << 10))))
        .collect::<serde_json::Map<String, Value>>()
        .into()
}

fn job(d: &Daemon, key: Option<&str>, id: &str) -> Value {
    let r = wbx(d, "GET", &format!("/v1/jobs/{id}"), key, None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn ids(summary: &Value) -> Vec<String> {
    summary["job_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn ms(ts: &Value) -> i64 {
    // RFC 3339 UTC with milliseconds, as the face writes it: compare as text is enough
    // for order within one day, but turn it into milliseconds of the day to subtract.
    let s = ts.as_str().unwrap_or_else(|| panic!("no time: {ts}"));
    let t = &s[11..];
    let h: i64 = t[0..2].parse().unwrap();
    let m: i64 = t[3..5].parse().unwrap();
    let sec: f64 = t[6..].trim_end_matches('Z').parse().unwrap();
    (h * 3600 + m * 60) * 1000 + (sec * 1000.0) as i64
}

#[test]
fn test_the_documents_fan_out_passes_files_reports_and_signs_its_end() {
    let (port, got) = receiver(false);
    let d = Daemon::start_with(&[
        ("ISOBOX_API_KEYS", "batch-key-one,batch-key-two"),
        ("ISOBOX_WBX_WEBHOOK_LOOPBACK", "1"),
        ("ISOBOX_WBX_JOBS_RUNNING", "2"),
    ]);
    d.wait_ready();
    let k1 = Some("batch-key-one");
    let k2 = Some("batch-key-two");
    let secret = wbx(&d, "GET", "/v1/webhooks/secret", k1, None).json()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let url = format!("http://127.0.0.1:{port}/hook");
    // The document's example, with real workers: two write output/part.csv, the third
    // merges them from ./input/ (read-only there) once both completed. One at a time.
    let worker = |n: u32| {
        format!("mkdir -p output && printf 'part,{n}\\n' > output/part.csv && echo worker {n}")
    };
    let merge = "find input -type f | sort && cat input/p1.csv input/p2.csv > merged.tmp \
                 && mkdir -p output && mv merged.tmp output/merged.csv \
                 && (echo x > input/p1.csv && echo WRITABLE || echo read-only) \
                 && python3 -c \"import os; s = os.stat('input/p1.csv'); print(s.st_uid, oct(s.st_mode & 0o777))\"";
    let body = json!({
        "defaults": {"template": "base", "timeout_s": 600, "artifacts": ["output/"], "network": {"mode": "none"}},
        "jobs": [
            {"command": worker(1)},
            {"command": worker(2)},
            {"command": merge, "depends_on": [0, 1],
             "inputs": [{"from_index": 0, "name": "output/part.csv", "as": "p1.csv"},
                        {"from_index": 1, "name": "output/part.csv", "as": "p2.csv"}]}
        ],
        "max_concurrency": 1,
        "max_total_cost": "2.00",
        "name": "nightly",
        "webhook_url": url,
    });
    let b = submit_batch(&d, k1, &body, &[("Idempotency-Key", "nightly-2026-11-08")]);
    let bid = b["id"].as_str().unwrap().to_string();
    assert_eq!(
        (b["status"].as_str(), b["total"].as_u64()),
        (Some("running"), Some(3)),
        "{b}"
    );
    assert_eq!(b["name"], "nightly");
    assert_eq!(b["max_concurrency"], 1);
    let jobs = ids(&b);
    assert_eq!(jobs.len(), 3);
    // The same key in the same tenant: the same batch, no new jobs. Another tenant's
    // key of the same text is its own; it cannot see the first batch.
    let again = submit_batch(&d, k1, &body, &[("Idempotency-Key", "nightly-2026-11-08")]);
    assert_eq!(again["id"], bid.as_str());
    assert_eq!(ids(&again), jobs);
    let r = wbx(&d, "GET", &format!("/v1/batches/{bid}"), k2, None);
    assert_eq!((r.status, err(&r).as_str()), (404, "batch not found"));
    let r = wbx(&d, "GET", &format!("/v1/jobs/{}", jobs[0]), k2, None);
    assert_eq!(r.status, 404);
    // The merge job waits for both workers: queued while they run.
    let m = job(&d, k1, &jobs[2]);
    assert_eq!(m["batch_id"], bid.as_str());
    assert_eq!(m["depends_on"], json!([jobs[0], jobs[1]]));
    assert_eq!(m["inputs"][0]["job_id"], jobs[0].as_str());
    assert_eq!(m["inputs"][0]["from_index"], 0);
    assert_eq!(m["inputs"][1]["as"], "p2.csv");

    let s = batch_done(&d, k1, &bid, Duration::from_secs(240));
    let logs: Vec<String> = jobs
        .iter()
        .map(|j| wbx(&d, "GET", &format!("/v1/jobs/{j}/logs"), k1, None).text())
        .collect();
    assert_eq!(s["status"], "completed", "{s}\n{logs:?}\n{}", d.log());
    assert_eq!(s["counts"]["completed"], 3, "{s}");
    assert_eq!(s["counts"]["failed"], 0);
    assert_eq!(s["errors"], json!({}));
    assert_eq!(s["first_failed"], json!([]));
    assert!(s["cost"].as_str().unwrap().ends_with(" EUR"), "{s}");
    assert!(s["cost_per_completed_job"].is_string(), "{s}");
    assert!(s["duration_s"]["p50"].as_f64().unwrap() > 0.0, "{s}");
    assert!(s["duration_s"]["p95"].as_f64().unwrap() >= s["duration_s"]["p50"].as_f64().unwrap());
    assert!(s["next_step"].as_str().unwrap().starts_with("done"), "{s}");
    assert!(s["finished_at"].is_string());
    // max_concurrency 1: no two of its jobs ran at once; the merge ran after both.
    let recs: Vec<Value> = jobs.iter().map(|j| job(&d, k1, j)).collect();
    let mut spans: Vec<(i64, i64)> = recs
        .iter()
        .map(|r| (ms(&r["started_at"]), ms(&r["finished_at"])))
        .collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[1].0 >= w[0].1,
            "two jobs of the batch overlapped: {spans:?}"
        );
    }
    assert!(
        ms(&recs[2]["started_at"]) >= ms(&recs[0]["finished_at"]).max(ms(&recs[1]["finished_at"]))
    );
    // The merged file is the two parts; the inputs were read-only and the user's to read.
    let merged = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{}/artifacts/output/merged.csv", jobs[2]),
        k1,
        None,
    );
    assert_eq!(merged.status, 200, "{}", merged.text());
    assert_eq!(merged.text(), "part,1\npart,2\n");
    let log = wbx(&d, "GET", &format!("/v1/jobs/{}/logs", jobs[2]), k1, None).text();
    assert!(log.starts_with("input/p1.csv\ninput/p2.csv\n"), "{log}");
    assert!(
        log.contains("read-only") && !log.contains("WRITABLE"),
        "{log}"
    );
    assert!(log.ends_with("0 0o644\n"), "{log}");
    // Each input's SHA-256 is the file's, and the receipt names them.
    let part1 = sha256_hex(b"part,1\n");
    let m = job(&d, k1, &jobs[2]);
    assert_eq!(m["inputs"][0]["sha256"], part1.as_str(), "{m}");
    assert_eq!(m["inputs"][0]["size"], 7);
    let rc = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{}/receipt", jobs[2]),
        k1,
        None,
    )
    .json();
    assert_eq!(rc["inputs"]["files"][0]["sha256"], part1.as_str(), "{rc}");

    // The report: the summary and one row per job; as CSV, one line per job.
    let r = wbx(&d, "GET", &format!("/v1/batches/{bid}/report"), k1, None);
    assert_eq!(r.status, 200);
    let rep = r.json();
    assert_eq!(rep["status"], "completed");
    let rows = rep["jobs"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[2]["depends_on"], json!([0, 1]));
    assert_eq!(rows[2]["result_files"], 1);
    assert_eq!(rows[0]["exit_code"], 0);
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/batches/{bid}/report?format=csv"),
        k1,
        None,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/csv; charset=utf-8"));
    let csv = r.text();
    let lines: Vec<&str> = csv.split("\r\n").filter(|l| !l.is_empty()).collect();
    assert_eq!(
        lines[0],
        "index,id,status,exit_code,duration_s,cost,error_code,error,depends_on,result_files,attempts,command"
    );
    assert_eq!(lines.len(), 4, "{csv}");
    assert!(
        lines[3].starts_with(&format!("2,{},completed,0,", jobs[2])),
        "{csv}"
    );
    assert!(lines[3].contains(",0;1,1,1,"), "{csv}");
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/batches/{bid}/report?format=xml"),
        k1,
        None,
    );
    assert_eq!((r.status, err(&r).as_str()), (400, "format: json or csv"));

    // Listed, newest first, for its tenant only.
    let l = wbx(&d, "GET", "/v1/batches", k1, None).json();
    assert_eq!(l["batches"][0]["id"], bid.as_str(), "{l}");
    assert_eq!(l["batches"][0]["status"], "completed");
    assert_eq!(
        wbx(&d, "GET", "/v1/batches", k2, None).json()["batches"],
        json!([])
    );

    // batch.finished: counts and cost, signed, checked with the document's snippet.
    let t = Instant::now();
    let ev = loop {
        let found = got.lock().unwrap().iter().find_map(|(h, body)| {
            let v: Value = serde_json::from_slice(body).ok()?;
            (v["event"] == "batch.finished").then(|| (h.clone(), body.clone(), v))
        });
        if let Some(e) = found {
            break e;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no batch.finished\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let (head, raw, v) = ev;
    assert_eq!(v["id"], bid.as_str());
    assert_eq!(v["data"]["status"], "completed");
    assert_eq!(v["data"]["counts"]["completed"], 3);
    assert_eq!(v["data"]["cost"], s["cost"]);
    assert_eq!(header(&head, "X-WBX-Event"), "batch.finished");
    assert!(verifies(&secret, &raw, header(&head, "X-WBX-Signature")));

    // A job alone takes a finished job's file by id (its `as` defaults to the name's
    // last part); a job not yet finished, another tenant's, or a missing file is 400.
    let alone = submit(
        &d,
        k1,
        &json!({"command": "cat input/merged.csv", "network": {"mode": "none"},
                "inputs": [{"job_id": jobs[2], "name": "output/merged.csv"}]}),
    );
    let a = finished(
        &d,
        k1,
        alone["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    assert_eq!(a["status"], "completed", "{a}");
    let out = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{}/logs", a["id"].as_str().unwrap()),
        k1,
        None,
    );
    assert_eq!(out.text(), "part,1\npart,2\n");
    let slow = submit(
        &d,
        k1,
        &json!({"command": "sleep 20", "network": {"mode": "none"}}),
    );
    let sid = slow["id"].as_str().unwrap().to_string();
    for (inputs, want, key) in [
        (
            json!([{"job_id": sid, "name": "x"}]),
            "has not finished",
            k1,
        ),
        (
            json!([{"job_id": jobs[0], "name": "output/part.csv"}]),
            "no job",
            k2,
        ),
        (
            json!([{"job_id": jobs[0], "name": "output/nope.csv"}]),
            "has no result file \"output/nope.csv\"",
            k1,
        ),
        (
            json!([{"job_id": "job_000000000000000000000000", "name": "a"}]),
            "no job job_000000000000000000000000 of yours",
            k1,
        ),
    ] {
        let r = wbx(
            &d,
            "POST",
            "/v1/jobs",
            key,
            Some(&json!({"command": "true", "inputs": inputs})),
        );
        assert_eq!(r.status, 400, "{inputs}: {}", r.text());
        assert!(
            err(&r).starts_with("inputs[0]: ") && err(&r).contains(want),
            "{}",
            r.text()
        );
    }
    let r = wbx(&d, "POST", &format!("/v1/jobs/{sid}/cancel"), k1, None);
    assert_eq!(r.status, 200, "{}", r.text());
    // 64 MiB of inputs in all: at the bound it runs (each file arrives whole), over it
    // the job is refused.
    let big = submit(
        &d,
        k1,
        &json!({"command": "head -c 33554432 /dev/urandom > a && head -c 33554432 /dev/urandom > b && echo -n c > c",
                "artifacts": ["a", "b", "c"], "network": {"mode": "none"}}),
    );
    let bj = finished(
        &d,
        k1,
        big["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    assert_eq!(bj["status"], "completed", "{bj}");
    let src = bj["id"].as_str().unwrap();
    let sums: Vec<String> = bj["result_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["sha256"].as_str().unwrap().to_string())
        .collect();
    let at = submit(
        &d,
        k1,
        &json!({"command": "sha256sum input/a input/b | cut -d' ' -f1", "network": {"mode": "none"},
                "inputs": [{"job_id": src, "name": "a"}, {"job_id": src, "name": "b"}]}),
    );
    let aj = finished(&d, k1, at["id"].as_str().unwrap(), Duration::from_secs(120));
    assert_eq!(aj["status"], "completed", "{aj}");
    let out = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{}/logs", aj["id"].as_str().unwrap()),
        k1,
        None,
    )
    .text();
    assert_eq!(out, format!("{}\n{}\n", sums[0], sums[1]));
    let r = wbx(
        &d,
        "POST",
        "/v1/jobs",
        k1,
        Some(
            &json!({"command": "true", "inputs": [{"job_id": src, "name": "a"}, {"job_id": src, "name": "b"}, {"job_id": src, "name": "c"}]}),
        ),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        err(&r),
        "inputs: 67108865 bytes in all; at most 67108864 bytes (64 MiB)"
    );
    // Nothing of the jobs' inputs is left on the host.
    let t = Instant::now();
    loop {
        let left: Vec<String> = std::fs::read_dir(d.data_dir.join("jobs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join("input").exists())
            .map(|e| e.path().display().to_string())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "staged inputs left: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    d.assert_clean();
    d.stop();
}

#[test]
fn test_a_failed_dependency_cancels_its_dependants_cancel_and_bad_batches() {
    let d = Daemon::start_with(&[
        ("ISOBOX_WBX_JOBS_PER_TENANT", "6"),
        ("ISOBOX_WBX_JOBS_RUNNING", "2"),
        ("ISOBOX_WBX_PRICE_VCPU_S", "0.001"),
    ]);
    d.wait_ready();
    let none = json!({"mode": "none"});
    // 0 fails; 1 waits for 0, 2 for 1 (so both are cancelled, down the graph); 3 runs.
    let b = submit_batch(
        &d,
        None,
        &json!({"defaults": {"network": none},
                "jobs": [{"command": "echo boom >&2; exit 3"},
                         {"command": "echo never", "depends_on": [0]},
                         {"command": "echo never", "depends_on": [1]},
                         {"command": "echo fine"}]}),
        &[],
    );
    let bid = b["id"].as_str().unwrap().to_string();
    let jobs = ids(&b);
    let s = batch_done(&d, None, &bid, Duration::from_secs(180));
    assert_eq!(s["status"], "partial", "{s}\n{}", d.log());
    assert_eq!(
        (
            s["counts"]["completed"].as_u64(),
            s["counts"]["failed"].as_u64(),
            s["counts"]["cancelled"].as_u64()
        ),
        (Some(1), Some(1), Some(2)),
        "{s}"
    );
    assert_eq!(
        s["errors"],
        json!({"dependency_failed": 2, "nonzero_exit": 1}),
        "{s}"
    );
    assert_eq!(s["first_failed"][0]["id"], jobs[0].as_str());
    assert_eq!(s["first_failed"][0]["exit_code"], 3);
    assert!(s["next_step"].as_str().unwrap().contains(&jobs[0]), "{s}");
    for (i, dep) in [(1, &jobs[0]), (2, &jobs[1])] {
        let j = job(&d, None, &jobs[i]);
        assert_eq!(j["status"], "cancelled", "{j}");
        assert_eq!(j["error"]["code"], "dependency_failed");
        assert!(
            j["error"]["message"]
                .as_str()
                .unwrap()
                .contains(dep.as_str()),
            "{j}"
        );
        assert_eq!(
            j["started_at"],
            Value::Null,
            "a cancelled dependant never started: {j}"
        );
    }
    // A batch where every job fails is `failed`.
    let f = submit_batch(
        &d,
        None,
        &json!({"jobs": [{"command": "exit 1", "network": none}]}),
        &[],
    );
    let fs = batch_done(
        &d,
        None,
        f["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    assert_eq!(fs["status"], "failed", "{fs}");

    // Cancel: the running job stops, the queued one never runs; a second cancel is 409.
    let c = submit_batch(
        &d,
        None,
        &json!({"defaults": {"network": none},
                "jobs": [{"command": "sleep 60"}, {"command": "echo never", "depends_on": [0]}]}),
        &[],
    );
    let cid = c["id"].as_str().unwrap().to_string();
    let cj = ids(&c);
    until_status(&d, None, &cj[0], "running");
    let r = wbx(&d, "POST", &format!("/v1/batches/{cid}/cancel"), None, None);
    assert_eq!(r.status, 200, "{}", r.text());
    let cs = batch_done(&d, None, &cid, Duration::from_secs(60));
    assert_eq!(cs["status"], "cancelled", "{cs}");
    assert_eq!(cs["counts"]["cancelled"], 2, "{cs}");
    let j0 = job(&d, None, &cj[0]);
    assert!(
        j0["error"]["message"].as_str().unwrap().contains(&cid),
        "{j0}"
    );
    let r = wbx(&d, "POST", &format!("/v1/batches/{cid}/cancel"), None, None);
    assert_eq!(
        (r.status, err(&r).as_str()),
        (409, "the batch has already finished (cancelled)")
    );

    // A job cancelled while its files are being saved ends `cancelled`, not `failed`.
    let up = submit(
        &d,
        None,
        &json!({"command": "for i in 1 2 3 4; do head -c 60000000 /dev/zero > f$i; done",
                "artifacts": ["f*"], "network": none}),
    );
    let uid = up["id"].as_str().unwrap().to_string();
    until_status(&d, None, &uid, "uploading_artifacts");
    let r = wbx(&d, "POST", &format!("/v1/jobs/{uid}/cancel"), None, None);
    assert_eq!(r.status, 200, "{}", r.text());
    let u = r.json();
    assert_eq!(
        (u["status"].as_str(), u["error"]["code"].as_str()),
        (Some("cancelled"), Some("cancelled")),
        "{u}"
    );
    // Bad batches: each refused whole, with where and why; no job of them exists.
    let before = wbx(&d, "GET", "/v1/jobs?limit=100", None, None).json()["jobs"]
        .as_array()
        .unwrap()
        .len();
    let many: Vec<Value> = (0..1001).map(|_| json!({"command": "true"})).collect();
    let at_cap: Vec<Value> = (0..1000).map(|_| json!({"command": "true"})).collect();
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({}), 400, "jobs: required, a list of 1 to 1000 jobs"),
        (
            json!({"jobs": []}),
            400,
            "jobs: required, a list of 1 to 1000 jobs",
        ),
        (
            json!({"jobs": many}),
            400,
            "jobs: required, a list of 1 to 1000 jobs",
        ),
        // 1000 jobs parse; this server's tenant cap (6 here) refuses them whole.
        (
            json!({"jobs": at_cap}),
            429,
            "limit reached: at most 6 unfinished jobs at once",
        ),
        (
            json!({"jobs": [{"command": "true", "depends_on": [1]}, {"command": "true", "depends_on": [0]}]}),
            400,
            "jobs: depends_on (with from_index) makes a cycle: 0 → 1 → 0",
        ),
        (
            json!({"jobs": [{"command": "true", "depends_on": [0]}]}),
            400,
            "jobs[0].depends_on: indexes of other jobs of this batch, 0 to 0",
        ),
        (
            json!({"jobs": [{"command": "true"}, {"command": "true", "depends_on": [2]}]}),
            400,
            "jobs[1].depends_on: indexes of other jobs of this batch, 0 to 1",
        ),
        (
            json!({"jobs": [{"command": "true", "inputs": [{"from_index": 0, "name": "a"}]}]}),
            400,
            "jobs[0].inputs[0]: from_index: the index of another job of this batch, not its own (0)",
        ),
        (
            json!({"jobs": [{"command": "true"}, {"command": "true", "inputs": [{"from_index": 0, "job_id": "job_000000000000000000000000", "name": "a"}]}]}),
            400,
            "jobs[1].inputs[0]: job_id or from_index, not both",
        ),
        (
            json!({"jobs": [{"command": "true"}, {"command": "true", "inputs": [{"from_index": 0, "name": "../etc/passwd"}]}]}),
            400,
            "jobs[1].inputs[0]: name: a result file's name",
        ),
        (
            json!({"jobs": [{"command": "true"}, {"command": "true", "inputs": [{"from_index": 0, "name": "a", "as": "x"}, {"from_index": 0, "name": "b", "as": "x/y"}]}]}),
            400,
            "jobs[1].inputs[1]: input/x/y collides with input/x",
        ),
        (
            json!({"jobs": [{"command": ""}]}),
            400,
            "jobs[0].command: 1 to",
        ),
        (
            json!({"jobs": [{"command": "true", "idempotency_key": "k"}]}),
            400,
            "jobs[0].idempotency_key: a job of a batch has none of its own",
        ),
        (
            json!({"jobs": [{"command": "true", "sandbox": 1}]}),
            400,
            "jobs[0]: unknown field `sandbox`",
        ),
        (
            json!({"jobs": [{"command": "true"}], "defaults": {"depends_on": [0]}}),
            400,
            "defaults: unknown field `depends_on`",
        ),
        (
            json!({"jobs": [{"command": "true"}], "defaults": {"template": "nope"}}),
            400,
            "jobs[0].template: unknown template",
        ),
        (
            json!({"jobs": [{"command": "true"}], "max_concurrency": 0}),
            400,
            "max_concurrency: a whole number from 1 to 100",
        ),
        (
            json!({"jobs": [{"command": "true"}], "max_concurrency": 101}),
            400,
            "max_concurrency: a whole number from 1 to 100",
        ),
        (
            json!({"jobs": [{"command": "true", "timeout_s": 3600}], "max_total_cost": "0.000001"}),
            400,
            "max_total_cost: the batch's 1 jobs could cost up to",
        ),
        (
            json!({"jobs": [{"command": "true", "max_cost": "0.000001"}]}),
            400,
            "jobs[0].max_cost: this job could cost up to",
        ),
        (
            json!({"jobs": [{"command": "true"}], "max_total_cost_eur": "x"}),
            400,
            "max_total_cost_eur: ",
        ),
        (
            json!({"jobs": [{"command": "true"}], "name": "a\nb"}),
            400,
            "name: at most 200 bytes",
        ),
        (
            json!({"jobs": [{"command": "true"}], "webhook_url": "http://10.0.0.1/"}),
            400,
            "webhook_url: ",
        ),
        (json!({"jobs": {"command": "true"}}), 400, "jobs: required"),
        (
            json!({"jobs": [{"command": "true"}], "extra": 1}),
            400,
            "invalid request body: unknown field `extra`",
        ),
        // Defaults are copied into each job: bounded per job (2 MiB, as POST /v1/jobs)
        // and for the batch (8 MiB), before anything is copied.
        (json!({"jobs": [{}], "defaults": {"command": "true", "env": big_env(70)}}), 413, "jobs[0]: with its defaults, "),
        // (24 values of 32 KiB: each job still fits the call that starts its command.)
        (json!({"jobs": vec![json!({}); 12], "defaults": {"command": "true", "env": big_env(24)}}), 413, "jobs: with their defaults, more than 8388608 bytes together"),
        (json!({"jobs": [{"command": "true"}, {"command": "true", "depends_on": [0, 0, 0]}]}), 400, "jobs[1].depends_on: at most 2 indexes"),
        (json!({"jobs": (0..1000).map(|i| json!({"command": "true", "depends_on": (0..21).map(|k| (i + 1 + k) % 1000).collect::<Vec<_>>()})).collect::<Vec<_>>()}), 400, "jobs: more than 20000 dependencies"),
    ];
    for (body, status, want) in cases {
        let r = wbx(&d, "POST", "/v1/batches", None, Some(&body));
        let shown: String = body.to_string().chars().take(160).collect();
        assert_eq!(r.status, status, "{shown}: {}", r.text());
        assert!(err(&r).starts_with(want), "{shown}: {}", r.text());
    }
    // At the concurrency bound, accepted.
    let ok = submit_batch(
        &d,
        None,
        &json!({"jobs": [{"command": "true", "network": none}], "max_concurrency": 100}),
        &[],
    );
    batch_done(
        &d,
        None,
        ok["id"].as_str().unwrap(),
        Duration::from_secs(120),
    );
    let after = wbx(&d, "GET", "/v1/jobs?limit=100", None, None).json()["jobs"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(after, before + 1, "a refused batch left jobs behind");
    // Ids that are no batch, and waits on them.
    for id in [
        "bat_000000000000000000000000",
        "bat_x",
        "job_000000000000000000000000",
    ] {
        let r = wbx(&d, "GET", &format!("/v1/batches/{id}"), None, None);
        assert_eq!(
            (r.status, err(&r).as_str()),
            (404, "batch not found"),
            "{id}"
        );
    }
    let r = wbx(
        &d,
        "POST",
        "/v1/jobs/wait",
        None,
        Some(&json!({"batch_ids": ["bat_000000000000000000000000"]})),
    );
    assert_eq!(
        (r.status, err(&r).as_str()),
        (404, "batch not found: bat_000000000000000000000000")
    );
    let r = wbx(
        &d,
        "POST",
        "/v1/jobs/wait",
        None,
        Some(&json!({"batch_ids": ["nope"]})),
    );
    assert_eq!(r.status, 404);
    // The budget covers a batch's whole worst case.
    let keyed = json!({"jobs": [{"command": "true", "network": {"mode": "none"}}],
                       "idempotency_key": "before-the-budget"});
    let accepted = submit_batch(&d, None, &keyed, &[]);
    let r = wbx(
        &d,
        "PUT",
        "/v1/budget",
        None,
        Some(&json!({"daily_limit": "0.000001"})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = wbx(
        &d,
        "POST",
        "/v1/batches",
        None,
        Some(&json!({"jobs": [{"command": "true"}, {"command": "true"}]})),
    );
    assert_eq!(r.status, 402, "{}", r.text());
    // A resend of a batch accepted before is that batch, not a refusal: the client
    // whose first answer was lost must not read "not accepted" for a batch that runs.
    let again = wbx(&d, "POST", "/v1/batches", None, Some(&keyed));
    assert_eq!(
        (again.status, again.json()["id"].as_str()),
        (202, accepted["id"].as_str()),
        "{}",
        again.text()
    );
    batch_done(
        &d,
        None,
        accepted["id"].as_str().unwrap(),
        Duration::from_secs(60),
    );
    d.assert_clean();
    d.stop();
}

#[test]
fn test_a_batch_goes_on_after_a_kill_9() {
    let instance = format!("isobox-bkill{}", std::process::id());
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&instance));
    let env = [
        ("ISOBOX_INSTANCE", instance.as_str()),
        ("ISOBOX_WBX_JOBS_RUNNING", "2"),
    ];
    let mut d = Daemon::start_with(&env);
    d.wait_ready();
    // A chain 0 → 1 → 2; 0 runs when the daemon dies. Its retry brings it back, and the
    // rest follows in order after the restart.
    let b = submit_batch(
        &d,
        None,
        &json!({"defaults": {"network": {"mode": "none"}, "retry": {"max_attempts": 2}, "artifacts": ["out.txt"]},
                "jobs": [{"command": "sleep 2; echo a > out.txt"},
                         {"command": "cat input/out.txt > out.txt; echo b >> out.txt", "depends_on": [0],
                          "inputs": [{"from_index": 0, "name": "out.txt"}]},
                         {"command": "cat input/out.txt > out.txt; echo c >> out.txt",
                          "inputs": [{"from_index": 1, "name": "out.txt"}]}]}),
        &[],
    );
    let bid = b["id"].as_str().unwrap().to_string();
    let jobs = ids(&b);
    until_status(&d, None, &jobs[0], "running");
    assert_eq!(job(&d, None, &jobs[1])["status"], "queued");
    let mut child = d.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let d2 = Daemon::start_with(&env);
    d2.wait_ready();
    let s = batch_done(&d2, None, &bid, Duration::from_secs(240));
    assert_eq!(s["status"], "completed", "{s}\n{}", d2.log());
    let j0 = job(&d2, None, &jobs[0]);
    assert_eq!(j0["attempt"], 2, "{j0}");
    assert_eq!(j0["error"], Value::Null);
    let out = wbx(
        &d2,
        "GET",
        &format!("/v1/jobs/{}/artifacts/out.txt", jobs[2]),
        None,
        None,
    );
    assert_eq!(out.text(), "a\nb\nc\n");

    // A batch cancelled just before a kill -9: after the restart, none of its jobs
    // runs again (the one that was running had an attempt left), and it ends
    // `cancelled`.
    let b = submit_batch(
        &d2,
        None,
        &json!({"defaults": {"network": {"mode": "none"}, "retry": {"max_attempts": 3}},
                "jobs": [{"command": "sleep 30"}, {"command": "echo never", "depends_on": [0]}]}),
        &[],
    );
    let cid = b["id"].as_str().unwrap().to_string();
    let cj = ids(&b);
    until_status(&d2, None, &cj[0], "running");
    let r = wbx(
        &d2,
        "POST",
        &format!("/v1/batches/{cid}/cancel"),
        None,
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut d2 = d2;
    let mut child = d2.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let d3 = Daemon::start_with(&env);
    d3.wait_ready();
    let s = batch_done(&d3, None, &cid, Duration::from_secs(120));
    assert_eq!(s["status"], "cancelled", "{s}\n{}", d3.log());
    assert_eq!(s["counts"]["cancelled"], 2, "{s}");
    let j0 = job(&d3, None, &cj[0]);
    assert_eq!(j0["attempt"], 1, "it ran once only: {j0}");
    assert_eq!(job(&d3, None, &cj[1])["started_at"], Value::Null);
    d3.assert_clean();
    d3.stop();
    drop(d2);
    drop(d);
}

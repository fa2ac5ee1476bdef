//! `POST /wbx/v1/batches` bodies (parsed on the daemon's event loop): `batches::submit`
//! never panics, and what it accepts is a batch the queue can order.
//!
//! On `Ok`: 1 to 1000 jobs, `max_concurrency` within 1–100, each job's dependencies
//! sorted, unique, other jobs of the batch, every `from_index` input among them, at
//! most `MAX_EDGES` in all and no cycle (a topological order exists); each job's inputs
//! at most 32, with relative names and destinations of which none is another's or
//! inside another's; every job within its byte bound once its defaults are in. Then the
//! batch's report as CSV, with each job's command as its error message too: one line
//! per job and a header, 12 cells each (RFC 4180), and no text cell a spreadsheet
//! would run as a formula. On `Err`: 400 or 413 and the WBX error shape, exactly
//! `{"error": "…"}`.
#![no_main]

use isobox::http::{Params, Request};
use isobox::store::jobs::{JobError, JobRecord};
use isobox::wbx::batches::{report_csv, submit, CSV_COLUMNS, MAX_EDGES, MAX_JOB_BYTES};
use isobox::wbx::compute::Rate;
use isobox::wbx::jobs::{JobOp, Prices};
use isobox_fuzz::runtimes;
use libfuzzer_sys::fuzz_target;

/// A relative path as inputs take it: no empty, `.` or `..` part, no NUL.
fn relative(p: &str) -> bool {
    !p.is_empty()
        && !p.contains('\0')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// RFC 4180 lines and cells (quoted cells may hold commas, quotes and line breaks).
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let (mut row, mut cell) = (Vec::new(), String::new());
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cell.push(c),
            (false, '"') if cell.is_empty() => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut cell)),
            (false, '\r') if chars.peek() == Some(&'\n') => {
                chars.next();
                row.push(std::mem::take(&mut cell));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => cell.push(c),
        }
    }
    assert!(!quoted, "a quoted cell never closed");
    assert!(
        cell.is_empty() && row.is_empty(),
        "the CSV does not end with CRLF"
    );
    rows
}

fuzz_target!(|data: &[u8]| {
    let req = Request {
        head: isobox::http::parse::parse_head(b"POST /wbx/v1/batches HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("a fixed head"),
        body: data.to_vec(),
        tenant: "t".into(),
        params: Params::default(),
    };
    let b = match submit(&req, runtimes(), &isobox_fuzz::wbx_jobs()) {
        Ok(JobOp::SubmitBatch(b)) => b,
        Ok(other) => panic!("a batch parsed as {other:?}"),
        Err(resp) => {
            assert!(
                resp.status == 400 || resp.status == 413,
                "status {}",
                resp.status
            );
            let v: serde_json::Value = serde_json::from_slice(&resp.body).expect("JSON error");
            assert!(
                v.as_object().is_some_and(|o| o.len() == 1) && v["error"].is_string(),
                "not the WBX error shape: {v}"
            );
            return;
        }
    };
    let n = b.jobs.len();
    assert!((1..=1000).contains(&n));
    assert!((1..=100).contains(&b.max_concurrency));
    let mut edges = 0;
    let mut indegree = vec![0usize; n];
    let mut dependants: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, (s, deps)) in b.jobs.iter().enumerate() {
        assert!(
            deps.windows(2).all(|w| w[0] < w[1]),
            "deps not sorted and unique"
        );
        for &d in deps {
            assert!(d < n && d != i, "job {i} depends on {d}");
            dependants[d].push(i);
        }
        indegree[i] = deps.len();
        edges += deps.len();
        let spec = &s.spec;
        assert!(!spec.command.trim().is_empty() && !spec.command.contains('\0'));
        assert!(spec.command.len() <= MAX_JOB_BYTES);
        assert!(
            spec.idempotency_key.is_none(),
            "a job of a batch has no key"
        );
        assert!(spec.inputs.len() <= 32);
        for (k, a) in spec.inputs.iter().enumerate() {
            assert!(relative(&a.name) && relative(&a.dest), "{a:?}");
            if let Some(x) = a.from_index {
                assert!(
                    deps.contains(&(x as usize)),
                    "from_index {x} not waited for"
                );
                assert!(a.job_id.is_empty());
            } else {
                assert!(a.job_id.starts_with("job_") && a.job_id.len() == 28);
            }
            for o in &spec.inputs[..k] {
                assert!(
                    o.dest != a.dest
                        && !a.dest.starts_with(&format!("{}/", o.dest))
                        && !o.dest.starts_with(&format!("{}/", a.dest)),
                    "{} and {} collide",
                    o.dest,
                    a.dest
                );
            }
        }
    }
    assert!(edges <= MAX_EDGES);
    // Kahn: every job can be ordered.
    let mut ready: Vec<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut ordered = 0;
    while let Some(i) = ready.pop() {
        ordered += 1;
        for &j in &dependants[i] {
            indegree[j] -= 1;
            if indegree[j] == 0 {
                ready.push(j);
            }
        }
    }
    assert_eq!(ordered, n, "a cycle was accepted");
    // The report of such a batch, each command also its error message.
    let jobs: Vec<(String, Option<JobRecord>)> = b
        .jobs
        .iter()
        .enumerate()
        .map(|(i, (s, _))| {
            let rec = JobRecord {
                status: "failed".into(),
                spec: s.spec.clone(),
                error: Some(JobError {
                    code: s.spec.command.clone(),
                    message: s.spec.command.clone(),
                    kind: "job".into(),
                }),
                exit_code: Some(-(i as i32)),
                ..JobRecord::default()
            };
            (format!("job_{i:024x}"), (i % 7 != 3).then_some(rec))
        })
        .collect();
    let prices = Prices {
        currency: "EUR".into(),
        base: Rate {
            vcpu_s: 1_000_000,
            gb_s: 0,
        },
        own: Vec::new(),
    };
    let csv = report_csv(&jobs, &prices, 1);
    let rows = parse_csv(&csv);
    assert_eq!(rows.len(), n + 1);
    assert_eq!(rows[0], CSV_COLUMNS);
    for row in &rows[1..] {
        assert_eq!(row.len(), CSV_COLUMNS.len(), "{row:?}");
        for (col, cell) in CSV_COLUMNS.iter().zip(row) {
            if matches!(
                *col,
                "index" | "exit_code" | "duration_s" | "result_files" | "attempts" | "depends_on"
            ) {
                continue;
            }
            assert!(
                !cell.starts_with(['=', '+', '-', '@', '\t', '\r']),
                "{col} cell a spreadsheet would run: {cell:?}"
            );
        }
    }
});

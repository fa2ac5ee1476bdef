//! Batches (`/v1/batches…`): many jobs accepted in one call, run at most
//! `max_concurrency` at a time, in the order `depends_on` (and each `from_index`
//! input) allows; a job whose dependency did not complete is cancelled with
//! `dependency_failed`. Requests parse into [`JobOp`]s the daemon's job queue carries
//! out (`daemon::job_batches`); a batch and its jobs are shaped here as the document
//! shows them (the summary, the report, its CSV).

use super::error;
use super::jobs::{self as wj, job_fields, JobOp, Prices, Submit};
use super::sandboxes::Fields;
use crate::config::WbxJobs;
use crate::http::{Request, Response};
use crate::runtimes::Runtimes;
use crate::store::batches::BatchRecord;
use crate::store::jobs::JobRecord;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};

/// Most jobs in one batch.
pub const MAX_BATCH_JOBS: usize = 1000;
/// Largest `max_concurrency`.
pub const MAX_CONCURRENCY: u32 = 100;
/// `max_concurrency` when not given.
pub const DEFAULT_CONCURRENCY: u32 = 10;
/// Longest `name`.
pub const MAX_NAME_BYTES: usize = 200;
/// Failed jobs a summary names.
pub const FIRST_FAILED: usize = 5;
/// Largest job of a batch, its defaults in (as `POST /v1/jobs` takes one).
pub const MAX_JOB_BYTES: usize = crate::wbx::routes::EXEC_BODY_BYTES;
/// Largest batch, every job's defaults in (as its body may be).
pub const MAX_MERGED_BYTES: usize = crate::wbx::routes::BATCH_BODY_BYTES;
/// Most dependencies (`depends_on` and `from_index`) of one batch, all jobs together.
pub const MAX_EDGES: usize = 20_000;
/// Characters of a command a report row shows.
pub const REPORT_COMMAND_CHARS: usize = 200;

/// A batch to accept.
#[derive(Debug, Clone)]
pub struct BatchSubmit {
    /// `name`.
    pub name: Option<String>,
    /// Each job (its defaults merged in) and the indexes it waits for (its
    /// `depends_on` and the jobs its `from_index` inputs name).
    pub jobs: Vec<(Submit, Vec<usize>)>,
    /// Jobs of it running at once, at most.
    pub max_concurrency: u32,
    /// `max_total_cost`, billionths of the currency.
    pub max_total_cost: Option<i128>,
    /// The body's or the header's key.
    pub idempotency_key: Option<String>,
    /// Where `batch.finished` goes.
    pub webhook_url: Option<String>,
}

const FIELDS: &[&str] = &[
    "jobs",
    "defaults",
    "max_concurrency",
    "max_total_cost",
    "max_total_cost_eur",
    "name",
    "idempotency_key",
    "webhook_url",
];

/// A batch id: `bat_` and 24 hex digits.
pub fn valid_id(id: &str) -> bool {
    id.strip_prefix("bat_")
        .is_some_and(|h| h.len() == 24 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The 404 for a batch that is not the caller's (or not at all).
pub fn not_found() -> Response {
    error(404, "batch not found")
}

/// An error about one job of the batch, its message prefixed with where (`jobs[3].`).
fn within(prefix: &str, resp: Response) -> Response {
    match serde_json::from_slice::<Value>(&resp.body) {
        Ok(v) if v["error"].is_string() => error(
            resp.status,
            &format!("{prefix}{}", v["error"].as_str().unwrap_or_default()),
        ),
        _ => resp,
    }
}

/// `POST /v1/batches`.
pub fn submit(req: &Request, runtimes: &Runtimes, limits: &WbxJobs) -> Result<JobOp, Response> {
    let f = Fields::of(req, FIELDS)?;
    let what = format!("jobs: required, a list of 1 to {MAX_BATCH_JOBS} jobs");
    let Some(Value::Array(items)) = f.0.get("jobs") else {
        return Err(error(400, &what));
    };
    if items.is_empty() || items.len() > MAX_BATCH_JOBS {
        return Err(error(400, &what));
    }
    let n = items.len();
    // Every job field may have a default but the ones that are a job's own.
    let job_fields_known: Vec<&str> = wj::FIELDS
        .iter()
        .copied()
        .filter(|k| *k != "idempotency_key")
        .collect();
    let defaults = match f.0.get("defaults").filter(|v| !v.is_null()) {
        None => serde_json::Map::new(),
        Some(Value::Object(m)) => {
            if let Some(k) = m.keys().find(|k| !job_fields_known.contains(&k.as_str())) {
                return Err(error(
                    400,
                    &format!(
                        "defaults: unknown field `{k}`; defaults take {}",
                        job_fields_known.join(", ")
                    ),
                ));
            }
            m.clone()
        }
        Some(_) => return Err(error(400, "defaults: must be an object of job fields")),
    };
    // A job's defaults are copied into it: what that makes is bounded before it is
    // made, per job and for the whole batch, as if each job had been sent whole.
    let defaults_bytes = serde_json::to_vec(&defaults).map_or(0, |v| v.len());
    let mut merged_bytes = 0usize;
    let mut edges = 0usize;
    let mut jobs = Vec::with_capacity(n);
    for (i, item) in items.iter().enumerate() {
        let Value::Object(m) = item else {
            return Err(error(400, &format!("jobs[{i}]: must be an object")));
        };
        if let Some(k) = m
            .keys()
            .find(|k| *k != "depends_on" && !wj::FIELDS.contains(&k.as_str()))
        {
            return Err(error(
                400,
                &format!(
                    "jobs[{i}]: unknown field `{k}`; a job takes the fields of POST /v1/jobs and depends_on"
                ),
            ));
        }
        let own = serde_json::to_vec(item).map_or(0, |v| v.len());
        if defaults_bytes + own > MAX_JOB_BYTES {
            return Err(error(
                413,
                &format!(
                    "jobs[{i}]: with its defaults, {} bytes; a job may be at most {MAX_JOB_BYTES} bytes",
                    defaults_bytes + own
                ),
            ));
        }
        merged_bytes += defaults_bytes + own;
        if merged_bytes > MAX_MERGED_BYTES {
            return Err(error(
                413,
                &format!(
                    "jobs: with their defaults, more than {MAX_MERGED_BYTES} bytes together; send fewer jobs, or smaller defaults"
                ),
            ));
        }
        let mut merged = defaults.clone();
        for (k, v) in m.iter().filter(|(k, _)| *k != "depends_on") {
            merged.insert(k.clone(), v.clone());
        }
        let prefix = format!("jobs[{i}].");
        let submit = job_fields(&Fields(merged), None, runtimes, limits, Some(n))
            .map_err(|r| within(&prefix, r))?;
        let mut deps: Vec<usize> = Vec::new();
        match m.get("depends_on").filter(|v| !v.is_null()) {
            None => {}
            Some(Value::Array(d)) => {
                if d.len() > n {
                    return Err(error(
                        400,
                        &format!("{prefix}depends_on: at most {n} indexes (the batch's jobs)"),
                    ));
                }
                let mut seen = vec![false; n];
                for v in d {
                    let x = v.as_u64().filter(|&x| (x as usize) < n && x as usize != i);
                    let Some(x) = x else {
                        return Err(error(
                            400,
                            &format!(
                                "{prefix}depends_on: indexes of other jobs of this batch, 0 to {}",
                                n - 1
                            ),
                        ));
                    };
                    if !std::mem::replace(&mut seen[x as usize], true) {
                        deps.push(x as usize);
                    }
                }
            }
            Some(_) => {
                return Err(error(
                    400,
                    &format!("{prefix}depends_on: must be a list of job indexes"),
                ))
            }
        }
        for (k, input) in submit.spec.inputs.iter().enumerate() {
            if let Some(x) = input.from_index.map(|x| x as usize) {
                if x == i {
                    return Err(error(
                        400,
                        &format!("{prefix}inputs[{k}]: from_index: the index of another job of this batch, not its own ({x})"),
                    ));
                }
                if !deps.contains(&x) {
                    deps.push(x);
                }
            }
        }
        deps.sort_unstable();
        edges += deps.len();
        if edges > MAX_EDGES {
            return Err(error(
                400,
                &format!("jobs: more than {MAX_EDGES} dependencies (depends_on and from_index) in one batch"),
            ));
        }
        jobs.push((submit, deps));
    }
    if let Some(cycle) = find_cycle(&jobs.iter().map(|(_, d)| d.clone()).collect::<Vec<_>>()) {
        let path: Vec<String> = cycle.iter().map(ToString::to_string).collect();
        return Err(error(
            400,
            &format!(
                "jobs: depends_on (with from_index) makes a cycle: {}; no job of it could start",
                path.join(" → ")
            ),
        ));
    }
    let max_concurrency = match f.whole(
        "max_concurrency",
        &format!("a whole number from 1 to {MAX_CONCURRENCY}"),
    )? {
        None => DEFAULT_CONCURRENCY,
        Some(c) if (1..=u64::from(MAX_CONCURRENCY)).contains(&c) => c as u32,
        Some(_) => {
            return Err(error(
                400,
                &format!("max_concurrency: a whole number from 1 to {MAX_CONCURRENCY}"),
            ))
        }
    };
    let name = f.string("name")?;
    if name
        .as_ref()
        .is_some_and(|s| s.len() > MAX_NAME_BYTES || s.chars().any(char::is_control))
    {
        return Err(error(
            400,
            &format!("name: at most {MAX_NAME_BYTES} bytes, no control characters"),
        ));
    }
    let header_key = req.head.header("idempotency-key").map(str::to_string);
    let idempotency_key = wj::idempotency(f.string("idempotency_key")?, header_key)?;
    let webhook_url = wj::webhook(&f, limits)?;
    let max_total_cost = wj::money(&f, "max_total_cost", limits)?.map(|m| m.0);
    Ok(JobOp::SubmitBatch(Box::new(BatchSubmit {
        name,
        jobs,
        max_concurrency,
        max_total_cost,
        idempotency_key,
        webhook_url,
    })))
}

/// A cycle of `deps` (each job's prerequisites), as indexes from a job back to it.
fn find_cycle(deps: &[Vec<usize>]) -> Option<Vec<usize>> {
    // Iterative depth-first search: 0 unseen, 1 on the path, 2 done.
    let mut state = vec![0u8; deps.len()];
    for start in 0..deps.len() {
        if state[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        state[start] = 1;
        while let Some(&mut (node, ref mut next)) = path.last_mut() {
            if let Some(&d) = deps[node].get(*next) {
                *next += 1;
                match state[d] {
                    0 => {
                        state[d] = 1;
                        path.push((d, 0));
                    }
                    1 => {
                        let from = path.iter().position(|&(p, _)| p == d).unwrap_or(0);
                        let mut cycle: Vec<usize> = path[from..].iter().map(|&(p, _)| p).collect();
                        cycle.push(d);
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                state[node] = 2;
                path.pop();
            }
        }
    }
    None
}

/// `GET /v1/batches?limit=&cursor=`.
pub fn list(req: &Request) -> Result<JobOp, Response> {
    match wj::list(req)? {
        JobOp::List {
            status: Some(_), ..
        } => Err(error(
            400,
            "status: batches are listed without a status filter",
        )),
        JobOp::List { limit, cursor, .. } => Ok(JobOp::BatchList { limit, cursor }),
        _ => Err(error(400, "invalid listing")),
    }
}

/// `GET /v1/batches/{id}/report?format=json|csv`.
pub fn report(req: &Request, id: String) -> Result<JobOp, Response> {
    let csv = match req.head.query_param("format").as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(_) => return Err(error(400, "format: json or csv")),
    };
    Ok(JobOp::BatchReport { id, csv })
}

/// How a finished batch went: `cancelled` if it was, `completed` if every job did,
/// `failed` if none did, else `partial`.
pub fn final_status(rec: &BatchRecord, jobs: &[&str]) -> &'static str {
    let completed = jobs.iter().filter(|s| **s == "completed").count();
    if rec.cancelled {
        "cancelled"
    } else if completed == jobs.len() {
        "completed"
    } else if completed == 0 {
        "failed"
    } else {
        "partial"
    }
}

fn ts(ms: Option<u64>) -> Value {
    ms.map_or(Value::Null, |m| json!(super::timestamp(m)))
}

fn percentile(sorted: &[u64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0)
}

/// A batch's summary: counts by state, cost, cost per completed job, durations (p50,
/// p95), errors by code, the first failed jobs, the next step. `jobs` are its jobs in
/// order, each as it is now (`None`: its record is gone, past its retention).
pub fn summary_json(
    id: &str,
    rec: &BatchRecord,
    jobs: &[(String, Option<JobRecord>)],
    prices: &Prices,
    now_ms: u64,
) -> Value {
    let mut counts: BTreeMap<&str, u64> = wj::STATES
        .iter()
        .filter(|s| !s.ends_with("_pending"))
        .map(|s| (*s, 0))
        .collect();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut billed = 0i128;
    let mut durations: Vec<u64> = Vec::new();
    let mut first_failed = Vec::new();
    let mut gone = 0u64;
    for (i, (jid, r)) in jobs.iter().enumerate() {
        let Some(r) = r else {
            gone += 1;
            continue;
        };
        *counts.entry(r.status.as_str()).or_default() += 1;
        billed += prices.cost(&r.spec, r.billed_ms).0;
        if r.finished() {
            if let Some(d) = wj::duration_ms(r, now_ms) {
                durations.push(d);
            }
            if let Some(e) = &r.error {
                *errors.entry(e.code.clone()).or_default() += 1;
            }
        }
        if matches!(r.status.as_str(), "failed" | "expired") && first_failed.len() < FIRST_FAILED {
            first_failed.push(json!({
                "index": i,
                "id": jid,
                "status": r.status,
                "exit_code": r.exit_code,
                "error": r.error,
            }));
        }
    }
    durations.sort_unstable();
    let completed = counts.get("completed").copied().unwrap_or(0);
    let per_completed =
        (completed > 0).then(|| prices.show(crate::jobs::Money(billed / i128::from(completed))));
    let next = next_step(rec, first_failed.first().and_then(|f| f["id"].as_str()));
    json!({
        "id": id,
        "name": rec.name,
        "status": rec.status,
        "total": jobs.len(),
        "counts": counts,
        "removed": gone,
        "cost": prices.show(crate::jobs::Money(billed)),
        "cost_per_completed_job": per_completed,
        "duration_s": {"p50": percentile(&durations, 50.0), "p95": percentile(&durations, 95.0)},
        "errors": errors,
        "first_failed": first_failed,
        "next_step": next,
        "max_concurrency": rec.max_concurrency,
        "max_total_cost": rec.max_total_cost.map(|m| prices.show(crate::jobs::Money(m))),
        "idempotency_key": rec.idempotency_key,
        "webhook_url": rec.webhook_url,
        "created_at": super::timestamp(rec.created_ms),
        "finished_at": ts(rec.ended_ms),
        "job_ids": jobs.iter().map(|(j, _)| j).collect::<Vec<_>>(),
    })
}

fn next_step(rec: &BatchRecord, failed: Option<&str>) -> String {
    match (rec.status.as_str(), failed) {
        ("running", _) if rec.cancelled => {
            "it is being cancelled: its running jobs are stopping".into()
        }
        ("running", _) => "wait: POST /v1/jobs/wait with {\"batch_ids\": [this id]}, or GET /v1/batches/{id} again in a few seconds".into(),
        ("completed", _) => "done: each job's result files are at GET /v1/jobs/{job_id}/artifacts; GET /v1/batches/{id}/report?format=csv has one row per job".into(),
        ("cancelled", _) => "it was cancelled; jobs that had finished keep their results".into(),
        (_, Some(j)) => format!("GET /v1/jobs/{j}/logs?mode=summary shows why {j} failed; POST /v1/jobs/{{job_id}}/retry runs one job again"),
        _ => "GET /v1/batches/{id}/report lists each job's error".into(),
    }
}

/// One row per job of the report.
fn rows(jobs: &[(String, Option<JobRecord>)], prices: &Prices, now_ms: u64) -> Vec<Value> {
    let index: HashMap<&str, usize> = jobs
        .iter()
        .enumerate()
        .map(|(i, (j, _))| (j.as_str(), i))
        .collect();
    jobs.iter()
        .enumerate()
        .map(|(i, (jid, r))| match r {
            None => json!({"index": i, "id": jid, "status": "removed"}),
            Some(r) => json!({
                "index": i,
                "id": jid,
                "status": r.status,
                "exit_code": r.exit_code,
                "duration_s": wj::duration_ms(r, now_ms).map(|ms| ms as f64 / 1000.0),
                "cost": prices.show(prices.cost(&r.spec, r.billed_ms)),
                "error_code": r.error.as_ref().map(|e| &e.code),
                "error": r.error.as_ref().map(|e| &e.message),
                "depends_on": r.depends_on.iter().filter_map(|d| index.get(d.as_str())).collect::<Vec<_>>(),
                "result_files": r.artifacts.len(),
                "attempts": r.attempt,
                "command": short(&r.spec.command),
            }),
        })
        .collect()
}

/// A command as a report row shows it: its first [`REPORT_COMMAND_CHARS`] characters
/// (and `…` when there is more).
fn short(command: &str) -> String {
    match command.char_indices().nth(REPORT_COMMAND_CHARS) {
        Some((at, _)) => format!("{}…", &command[..at]),
        None => command.to_string(),
    }
}

/// `GET /v1/batches/{id}/report`: the summary plus one row per job.
pub fn report_json(
    id: &str,
    rec: &BatchRecord,
    jobs: &[(String, Option<JobRecord>)],
    prices: &Prices,
    now_ms: u64,
) -> Value {
    let mut v = summary_json(id, rec, jobs, prices, now_ms);
    v["jobs"] = Value::Array(rows(jobs, prices, now_ms));
    v
}

/// The CSV columns of a report.
pub const CSV_COLUMNS: &[&str] = &[
    "index",
    "id",
    "status",
    "exit_code",
    "duration_s",
    "cost",
    "error_code",
    "error",
    "depends_on",
    "result_files",
    "attempts",
    "command",
];

/// One CSV cell (RFC 4180): quoted when it holds a comma, quote or line break; text a
/// spreadsheet would run as a formula (`=`, `+`, `-`, `@`, tab, CR first) gets a `'`
/// in front, since commands and error messages are the user's text.
fn cell(v: &Value) -> String {
    let raw = match v {
        Value::Null => return String::new(),
        Value::String(s) => {
            if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
                format!("'{s}")
            } else {
                s.clone()
            }
        }
        Value::Array(a) => a
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(";"),
        other => other.to_string(),
    };
    if raw.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", raw.replace('"', "\"\""))
    } else {
        raw
    }
}

/// The report as CSV: a header, then one line per job.
pub fn report_csv(jobs: &[(String, Option<JobRecord>)], prices: &Prices, now_ms: u64) -> String {
    let mut out = CSV_COLUMNS.join(",");
    out.push_str("\r\n");
    for row in rows(jobs, prices, now_ms) {
        let line: Vec<String> = CSV_COLUMNS.iter().map(|c| cell(&row[*c])).collect();
        out.push_str(&line.join(","));
        out.push_str("\r\n");
    }
    out
}

/// A batch as a list shows it (no per-job figures).
pub fn list_item(id: &str, rec: &BatchRecord) -> Value {
    json!({
        "id": id,
        "name": rec.name,
        "status": rec.status,
        "total": rec.jobs.len(),
        "created_at": super::timestamp(rec.created_ms),
        "finished_at": ts(rec.ended_ms),
    })
}

/// The `batch.finished` event's body: counts and cost of the whole batch.
pub fn finished_event(
    id: &str,
    rec: &BatchRecord,
    jobs: &[(String, Option<JobRecord>)],
    prices: &Prices,
    now_ms: u64,
) -> String {
    let s = summary_json(id, rec, jobs, prices, now_ms);
    json!({
        "event": "batch.finished",
        "id": id,
        "created_at": super::timestamp(now_ms),
        "data": {
            "id": id,
            "name": rec.name,
            "status": rec.status,
            "total": s["total"],
            "counts": s["counts"],
            "cost": s["cost"],
            "cost_per_completed_job": s["cost_per_completed_job"],
            "errors": s["errors"],
        },
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_cycles_are_found_and_named() {
        assert_eq!(find_cycle(&[vec![], vec![0], vec![0, 1]]), None);
        assert_eq!(find_cycle(&[vec![1], vec![0]]), Some(vec![0, 1, 0]));
        let c = find_cycle(&[vec![], vec![3], vec![1], vec![2]]).unwrap();
        assert_eq!(c.first(), c.last());
        assert_eq!(c.len(), 4);
        // A long chain is no cycle, and the search does not recurse.
        let chain: Vec<Vec<usize>> = (0..1000)
            .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
            .collect();
        assert_eq!(find_cycle(&chain), None);
    }

    #[test]
    fn test_csv_cells_are_quoted_and_formulas_defused() {
        assert_eq!(cell(&json!("plain")), "plain");
        assert_eq!(cell(&json!("a,b")), "\"a,b\"");
        assert_eq!(cell(&json!("say \"hi\"")), "\"say \"\"hi\"\"\"");
        assert_eq!(cell(&json!("=HYPERLINK(1)")), "'=HYPERLINK(1)");
        assert_eq!(cell(&json!("-1+2")), "'-1+2");
        assert_eq!(cell(&json!(-1)), "-1");
        assert_eq!(cell(&json!([0, 2])), "0;2");
        assert_eq!(cell(&Value::Null), "");
        assert_eq!(cell(&json!("two\nlines")), "\"two\nlines\"");
    }

    #[test]
    fn test_percentiles_by_nearest_rank() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1000], 95.0), Some(1.0));
        let v: Vec<u64> = (1..=20).map(|s| s * 1000).collect();
        assert_eq!(percentile(&v, 50.0), Some(10.0));
        assert_eq!(percentile(&v, 95.0), Some(19.0));
    }
}

//! Background jobs (`/v1/jobs…`): requests parsed into [`JobOp`]s the daemon's job
//! queue carries out (`daemon::jobs`), and a job's record shaped as the document
//! shows it (the job, its summary, its receipt, its result files).
//!
//! `"runtime": "wasi"` with `wasm` is a WebAssembly job ([`wasm_fields`]), run by
//! `isobox-wasm` rather than in a sandbox. `compute_class` is
//! a set of local terms (`compute`). `optimize_for` and `placement` choose a server
//! inside a class: this daemon is one server, so they are checked and kept but
//! choose nothing. `dependency_cache` is checked and kept: this
//! server has no package cache, so there is nothing to turn on or off.

use super::compute::{self, Class, Rate};
use super::error;
use super::sandboxes::{self, env_vars, Fields};
use crate::config::WbxJobs;
use crate::http::{Request, Response};
use crate::jobs::{Money, Pattern};
use crate::runtimes::Runtimes;
use crate::store::jobs::{InputFile, JobRecord, JobSpec, RetryPolicy, MAX_INPUTS};
use serde_json::{json, Value};

/// A job's default time limit, seconds.
pub const DEFAULT_TIMEOUT_S: u64 = 3600;
/// Longest command: as a sandbox's command line, one argument of `/bin/sh -c`.
pub const MAX_COMMAND_BYTES: usize = crate::wbx::sandboxes::MAX_CMD_BYTES;
/// Where a job's command runs (its working directory).
pub const JOB_HOME: &str = "/home/user";
/// Patterns in `artifacts` (and paths in `required_artifacts`).
pub const MAX_PATTERNS: usize = 100;
/// Most attempts `retry` may ask for.
pub const MAX_ATTEMPTS: u32 = 5;
/// Longest idempotency key.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 256;
/// Most jobs one list page holds (and its default).
pub const MAX_LIST: usize = 100;
/// Default page.
pub const DEFAULT_LIST: usize = 20;
/// Most bytes one `logs` read returns (and its default).
pub const MAX_LOG_READ: u64 = 1 << 20;
/// Log lines in a summary.
pub const SUMMARY_LINES: usize = 20;

/// Every state the document names.
pub const STATES: &[&str] = &[
    "queued",
    "starting",
    "running",
    "uploading_artifacts",
    "completed",
    "failed",
    "cancelled",
    "expired",
    "cleanup_pending",
    "recovery_pending",
];

/// A job to accept.
#[derive(Debug, Clone)]
pub struct Submit {
    /// What is stored (env values not among it).
    pub spec: JobSpec,
    /// The env values (sealed before they are stored).
    pub env: Vec<(String, String)>,
    /// A WebAssembly job's module and stdin (kept as files of the job).
    pub wasm_bytes: Option<WasmBytes>,
    /// A retried WebAssembly job: the job whose module and stdin files it copies.
    pub wasm_from: Option<String>,
}

/// The runtime of jobs in a sandbox (the default).
pub const RUNTIME_SANDBOX: &str = "sandbox";
/// The runtime of WebAssembly jobs.
pub const RUNTIME_WASI: &str = "wasi";

/// What a jobs request asks.
#[derive(Debug, Clone)]
pub enum JobOp {
    /// `POST /v1/jobs`.
    Submit(Box<Submit>),
    /// `GET /v1/jobs`.
    List {
        /// Only this state.
        status: Option<String>,
        /// Page size.
        limit: usize,
        /// Before this sequence number.
        cursor: Option<u64>,
    },
    /// `GET /v1/jobs/{id}`.
    Get(String),
    /// `GET /v1/jobs/{id}/summary`.
    Summary(String),
    /// `GET /v1/jobs/{id}/logs`.
    Logs {
        /// The job.
        id: String,
        /// From this byte (negative: from the end).
        offset: i64,
        /// At most this many bytes.
        limit: u64,
        /// A digest as JSON instead of the bytes, of at most this many characters.
        mode: Option<(LogMode, usize)>,
    },
    /// `GET /v1/jobs/{id}/receipt`.
    Receipt(String),
    /// `GET /v1/jobs/{id}/artifacts`.
    Artifacts(String),
    /// `GET /v1/jobs/{id}/artifacts/{name}`.
    Artifact {
        /// The job.
        id: String,
        /// The file's name (its path).
        name: String,
        /// `HEAD`.
        head_only: bool,
    },
    /// `POST /v1/jobs/{id}/cancel`.
    Cancel(String),
    /// `POST /v1/jobs/{id}/retry` with the env values sent again.
    Retry(String, Vec<(String, String)>),
    /// `GET /v1/jobs/stats?days=`.
    Stats(u64),
    /// `POST /v1/jobs/wait`: until one (or, with `all`, every one) of `ids` has
    /// finished, or `timeout_s` passed.
    Wait {
        /// The jobs, then the batches, in the order asked, each once.
        ids: Vec<String>,
        /// `until: "all"`.
        all: bool,
        /// Seconds at most (0: answer at once).
        timeout_s: u64,
    },
    /// `GET /v1/receipts/key`.
    ReceiptKey,
    /// `POST /v1/batches`.
    SubmitBatch(Box<super::batches::BatchSubmit>),
    /// `GET /v1/batches`.
    BatchList {
        /// Page size.
        limit: usize,
        /// Before this sequence number.
        cursor: Option<u64>,
    },
    /// `GET /v1/batches/{id}`.
    BatchGet(String),
    /// `GET /v1/batches/{id}/report`.
    BatchReport {
        /// The batch.
        id: String,
        /// `format=csv`.
        csv: bool,
    },
    /// `POST /v1/batches/{id}/cancel`.
    BatchCancel(String),
    /// `GET /v1/webhooks/secret` (`false`), `POST /v1/webhooks/secret/rotate` (`true`).
    WebhookSecret(bool),
    /// `GET /v1/budget` (`None`), `PUT /v1/budget`.
    Budget(Option<BudgetChange>),
    /// `GET /v1/compute/preferences` (`None`), `PUT` (the new default; `Some(None)`:
    /// back to the server's).
    ComputePrefs(Option<Option<&'static Class>>),
}

/// A query number as the document's schema has it: decimal digits only (with a
/// leading `-` where `signed`), so `+5` or ` 5` is refused as the schema says.
fn plain<T: std::str::FromStr>(s: &str, signed: bool) -> Option<T> {
    let digits = if signed {
        s.strip_prefix('-').unwrap_or(s)
    } else {
        s
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// What `mode=` asks of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogMode {
    /// Test results, error blocks and the end.
    Summary,
    /// Error blocks only.
    Errors,
    /// The end only.
    Tail,
}

/// `PUT /v1/budget`: each field absent (unchanged), a limit, or removed (`""`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetChange {
    /// Per UTC month.
    pub monthly: Option<Option<i128>>,
    /// Per UTC day.
    pub daily: Option<Option<i128>>,
    /// Alert percentage.
    pub alert_pct: Option<Option<u32>>,
}

/// An amount as the document writes one: a decimal string (`"0.10"`), or a JSON
/// number written the same way.
fn amount(v: &Value) -> Result<Money, String> {
    match v {
        Value::String(s) => Money::parse(s),
        Value::Number(n) => Money::parse(&n.to_string()),
        _ => Err("an amount like \"0.10\"".into()),
    }
}

/// `PUT /v1/budget` `{"monthly_limit": "50.00", "daily_limit": "5.00", "alert_pct": 80}`.
pub fn budget_put(req: &Request) -> Result<JobOp, Response> {
    let f = Fields::of(req, &["monthly_limit", "daily_limit", "alert_pct"])?;
    let limit = |name: &str| -> Result<Option<Option<i128>>, Response> {
        match f.0.get(name) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(Some(None)),
            Some(Value::Null) => Ok(Some(None)),
            Some(Value::String(s)) => Money::parse(s)
                .map(|m| Some(Some(m.0)))
                .map_err(|why| error(400, &format!("{name}: {why}, or \"\" to remove the limit"))),
            Some(_) => Err(error(
                400,
                &format!("{name}: a decimal string like \"50.00\", or \"\" to remove the limit"),
            )),
        }
    };
    let monthly = limit("monthly_limit")?;
    let daily = limit("daily_limit")?;
    let alert_pct = match f.0.get("alert_pct") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(Value::String(s)) if s.is_empty() => Some(None),
        Some(v) => Some(Some(
            v.as_u64()
                .filter(|p| (1..=100).contains(p))
                .map(|p| p as u32)
                .ok_or_else(|| {
                    error(
                        400,
                        "alert_pct: a whole percentage from 1 to 100, or \"\" to remove it",
                    )
                })?,
        )),
    };
    Ok(JobOp::Budget(Some(BudgetChange {
        monthly,
        daily,
        alert_pct,
    })))
}

/// A job id: `job_` and 24 hex digits.
pub fn valid_id(id: &str) -> bool {
    id.strip_prefix("job_")
        .is_some_and(|h| h.len() == 24 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The 404 for a job that is not the caller's (or not at all).
pub fn not_found() -> Response {
    error(404, "job not found")
}

fn patterns(f: &Fields, name: &str) -> Result<Vec<String>, Response> {
    if f.absent(name) {
        return Ok(Vec::new());
    }
    let Value::Array(items) = &f.0[name] else {
        return Err(error(400, &format!("{name}: must be a list of strings")));
    };
    if items.len() > MAX_PATTERNS {
        return Err(error(
            400,
            &format!("{name}: at most {MAX_PATTERNS} entries"),
        ));
    }
    items
        .iter()
        .map(|v| {
            let s = v
                .as_str()
                .ok_or_else(|| error(400, &format!("{name}: must be a list of strings")))?;
            Pattern::parse(s).map_err(|e| error(400, &format!("{name}: {e}")))?;
            Ok(s.to_string())
        })
        .collect()
}

/// A WebAssembly job's inline module, most bytes (the document's "8 MB").
pub const MAX_WASM_MODULE_BYTES: u64 = 8_000_000;
/// A module named by an input, most bytes.
pub const MAX_WASM_INPUT_MODULE_BYTES: u64 = 32_000_000;
/// A WebAssembly job's stdin, most bytes.
pub const MAX_WASM_STDIN_BYTES: u64 = 4_000_000;
/// A WebAssembly job's memory limit, MiB.
pub const WASM_MEMORY_MB: std::ops::RangeInclusive<u64> = 16..=1024;
/// Its default.
pub const DEFAULT_WASM_MEMORY_MB: u64 = 128;
/// A WebAssembly job's longest time limit, seconds (and its default).
pub const MAX_WASM_TIMEOUT_S: u64 = 600;
/// Arguments of a WebAssembly job, at most, and bytes of them together.
pub const MAX_WASM_ARGS: usize = 1024;
/// Bytes of a WebAssembly job's arguments together.
pub const MAX_WASM_ARGS_BYTES: usize = 64 << 10;
/// Bytes of a WebAssembly job's env, names and values together.
pub const MAX_WASM_ENV_BYTES: usize = 256 << 10;
/// Result files of a WebAssembly job, at most.
pub const MAX_WASM_OUTPUT_FILES: usize = 64;
/// Bytes of a WebAssembly job's result files together.
pub const MAX_WASM_OUTPUT_BYTES: u64 = 64_000_000;

/// A WebAssembly job's bytes, which are kept as files beside its record.
#[derive(Debug, Clone, Default)]
pub struct WasmBytes {
    /// The inline module (empty when an input is the module).
    pub module: Vec<u8>,
    /// Its stdin.
    pub stdin: Vec<u8>,
}

/// Fields a WebAssembly job does not take (it runs a module, not a sandbox).
const NOT_WASI: &[(&str, &str)] = &[
    ("command", "a WebAssembly job runs its module (wasm.module_b64 or wasm.module); it takes no command"),
    ("template", "a WebAssembly job runs in no sandbox template"),
    ("compute_class", "a WebAssembly job runs on 1 vCPU with the memory of wasm.memory_mb; it takes no compute class"),
    ("dependency_cache", "a WebAssembly job has no network and no package cache"),
];

/// A standard base64 field (padding optional), at most `max` bytes decoded.
fn b64_field(v: &Value, name: &str, max: u64) -> Result<Vec<u8>, Response> {
    use base64::Engine as _;
    let s = v
        .as_str()
        .ok_or_else(|| error(400, &format!("{name}: a base64 string")))?;
    // Decoded bytes are 3/4 of the text: refuse what could not fit before decoding.
    if s.len() as u64 > max.div_ceil(3) * 4 + 4 {
        return Err(error(400, &format!("{name}: at most {max} bytes")));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s.trim_end_matches('='))
        .or_else(|_| {
            base64::engine::general_purpose::STANDARD_NO_PAD.decode(s.trim_end_matches('='))
        })
        .map_err(|_| {
            error(
                400,
                &format!("{name}: not valid base64 (the standard alphabet, padding optional)"),
            )
        })?;
    if bytes.len() as u64 > max {
        return Err(error(400, &format!("{name}: at most {max} bytes")));
    }
    Ok(bytes)
}

/// `wasm`: `{"module_b64" | "module", "args", "memory_mb", "stdin_b64"}` for
/// `"runtime": "wasi"`. `input_names` are the job's inputs' paths under `/input`.
fn wasm_fields(
    v: Option<&Value>,
    input_names: &[String],
) -> Result<(crate::store::jobs::WasmSpec, WasmBytes), Response> {
    const KEYS: &[&str] = &["module_b64", "module", "args", "memory_mb", "stdin_b64"];
    let Some(Value::Object(m)) = v.filter(|v| !v.is_null()) else {
        return Err(error(
            400,
            "wasm: required with \"runtime\": \"wasi\", an object like {\"module_b64\": \"…\", \"args\": [], \"memory_mb\": 128}",
        ));
    };
    if let Some(k) = m.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(error(
            400,
            &format!("wasm: unknown field `{k}`; it takes {}", KEYS.join(", ")),
        ));
    }
    let mut spec = crate::store::jobs::WasmSpec::default();
    let mut bytes = WasmBytes::default();
    match (m.get("module_b64"), m.get("module")) {
        (Some(b), None) => {
            let module = b64_field(b, "wasm.module_b64", MAX_WASM_MODULE_BYTES)?;
            check_module(&module, "wasm.module_b64")?;
            spec.module_sha256 = Some(crate::jobs::sha256_hex(&module));
            spec.module_bytes = module.len() as u64;
            bytes.module = module;
        }
        (None, Some(Value::String(name))) => {
            if !input_names.iter().any(|n| n == name) {
                return Err(error(
                    400,
                    &format!(
                        "wasm.module: {name:?} is not one of this job's inputs; name an input by its path under /input ({})",
                        if input_names.is_empty() { "it has none".to_string() } else { input_names.join(", ") }
                    ),
                ));
            }
            spec.module_input = Some(name.clone());
        }
        (None, Some(_)) => return Err(error(400, "wasm.module: the path under /input of one of the job's inputs")),
        (Some(_), Some(_)) => return Err(error(400, "wasm: module_b64 or module, not both")),
        (None, None) => {
            return Err(error(
                400,
                "wasm: module_b64 (the module, base64) or module (an input that is the module) is required",
            ))
        }
    }
    if let Some(a) = m.get("args").filter(|v| !v.is_null()) {
        let Value::Array(items) = a else {
            return Err(error(400, "wasm.args: must be a list of strings"));
        };
        let mut total = 0usize;
        for it in items {
            let s = it
                .as_str()
                .filter(|s| !s.contains('\0'))
                .ok_or_else(|| error(400, "wasm.args: must be a list of strings without NUL"))?;
            total += s.len() + 1;
            spec.args.push(s.to_string());
        }
        if items.len() > MAX_WASM_ARGS || total > MAX_WASM_ARGS_BYTES {
            return Err(error(
                400,
                &format!("wasm.args: at most {MAX_WASM_ARGS} arguments and {MAX_WASM_ARGS_BYTES} bytes together"),
            ));
        }
    }
    spec.memory_mb = match m.get("memory_mb").filter(|v| !v.is_null()) {
        None => DEFAULT_WASM_MEMORY_MB,
        Some(v) => v
            .as_u64()
            .filter(|n| WASM_MEMORY_MB.contains(n))
            .ok_or_else(|| {
                error(
                    400,
                    &format!(
                        "wasm.memory_mb: a whole number from {} to {}",
                        WASM_MEMORY_MB.start(),
                        WASM_MEMORY_MB.end()
                    ),
                )
            })?,
    };
    if let Some(v) = m.get("stdin_b64").filter(|v| !v.is_null()) {
        bytes.stdin = b64_field(v, "wasm.stdin_b64", MAX_WASM_STDIN_BYTES)?;
        spec.stdin_bytes = bytes.stdin.len() as u64;
    }
    Ok((spec, bytes))
}

/// `GET /v1/runtimes`: what jobs can run on, with isolation and capabilities.
pub fn runtimes_json(runtimes: &Runtimes, limits: &sandboxes::Limits) -> Response {
    let templates: Vec<String> = sandboxes::templates(runtimes)
        .into_iter()
        .map(|(n, _, _)| n.to_string())
        .collect();
    Response::json(
        200,
        &json!({"runtimes": [
            {
                "name": RUNTIME_SANDBOX,
                "default": true,
                "available": true,
                "isolation": "vm",
                "isolation_detail": "a gVisor sandbox (runsc): a user-space kernel between the job and the host",
                "capabilities": {
                    "command": "/bin/sh -c in /home/user",
                    "network": ["full", "allowlist", "none"],
                    "filesystem": "a full Linux root filesystem of its template, writable, in memory",
                    "templates": templates,
                    "max_timeout_s": limits.jobs.max_timeout_s,
                    "deterministic": false,
                },
            },
            {
                "name": RUNTIME_WASI,
                "default": false,
                "available": limits.jobs.wasi,
                "isolation": "wasm-process",
                "isolation_detail": "a WebAssembly module (WASI preview 1) on wasmtime, in a jailed process of its own (own cgroup, no network, its own files only, seccomp filter); weaker than a virtual machine",
                "capabilities": {
                    "module": "wasm.module_b64, or wasm.module naming an input",
                    "network": ["none"],
                    "filesystem": ["/input (read-only)", "/output", "/tmp"],
                    "max_module_bytes": MAX_WASM_MODULE_BYTES,
                    "max_input_module_bytes": MAX_WASM_INPUT_MODULE_BYTES,
                    "memory_mb": {"min": WASM_MEMORY_MB.start(), "max": WASM_MEMORY_MB.end(), "default": DEFAULT_WASM_MEMORY_MB},
                    "max_timeout_s": MAX_WASM_TIMEOUT_S.min(limits.jobs.max_timeout_s),
                    "max_stdin_bytes": MAX_WASM_STDIN_BYTES,
                    "max_output_files": MAX_WASM_OUTPUT_FILES,
                    "max_output_bytes": MAX_WASM_OUTPUT_BYTES,
                    "deterministic": true,
                },
            },
        ]}),
    )
}

/// A core WebAssembly module (magic and version 1), as WASI preview 1 needs; a
/// component or anything else is refused at once rather than at its start.
pub fn check_module(b: &[u8], name: &str) -> Result<(), Response> {
    if b.len() < 8 || &b[..4] != b"\0asm" {
        return Err(error(
            400,
            &format!("{name}: not a WebAssembly module (no \\0asm header)"),
        ));
    }
    if b[4..8] != [1, 0, 0, 0] {
        return Err(error(
            400,
            &format!("{name}: a WebAssembly component or another version; a WASI preview 1 core module (version 1) is needed"),
        ));
    }
    Ok(())
}

pub(super) const FIELDS: &[&str] = &[
    "command",
    "template",
    "timeout_s",
    "max_duration_seconds",
    "artifacts",
    "required_artifacts",
    "env",
    "network",
    "retry",
    "idempotency_key",
    "optimize_for",
    "placement",
    "dependency_cache",
    "max_cost",
    "max_cost_eur",
    "compute_class",
    "inputs",
    "runtime",
    "wasm",
    "webhook_url",
];

/// Longest result-file name or `as` path in `inputs`.
pub const MAX_INPUT_PATH_BYTES: usize = 1024;

/// A relative path inside a directory: not empty, no `/` at either end, no empty, `.`
/// or `..` part, no NUL, parts of at most 255 bytes.
fn relative_path(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= MAX_INPUT_PATH_BYTES
        && !p.contains('\0')
        && p.split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && c.len() <= 255)
}

/// `inputs`: `{"job_id": …, "name": …, "as": …}`, or in a batch of `batch` jobs
/// `{"from_index": i, …}` instead of `job_id`. Each `as` (by default the name's last
/// part) is one path under `input/`, none inside another.
fn inputs(f: &Fields, batch: Option<usize>) -> Result<Vec<InputFile>, Response> {
    if f.absent("inputs") {
        return Ok(Vec::new());
    }
    let Value::Array(items) = &f.0["inputs"] else {
        return Err(error(400, "inputs: must be a list of objects like {\"job_id\": \"job_…\", \"name\": \"output/data.csv\", \"as\": \"data.csv\"}"));
    };
    if items.len() > MAX_INPUTS {
        return Err(error(400, &format!("inputs: at most {MAX_INPUTS} files")));
    }
    let mut out: Vec<InputFile> = Vec::with_capacity(items.len());
    for (i, v) in items.iter().enumerate() {
        let bad = |why: &str| error(400, &format!("inputs[{i}]: {why}"));
        let Value::Object(m) = v else {
            return Err(bad("must be an object"));
        };
        let keys: &[&str] = if batch.is_some() {
            &["job_id", "from_index", "name", "as"]
        } else {
            &["job_id", "name", "as"]
        };
        if let Some(k) = m.keys().find(|k| !keys.contains(&k.as_str())) {
            return Err(bad(&format!(
                "unknown field `{k}`; it takes {}",
                keys.join(", ")
            )));
        }
        let (job_id, from_index) = match (m.get("job_id"), m.get("from_index"), batch) {
            (Some(Value::String(id)), None, _) if valid_id(id) => (id.clone(), None),
            (Some(_), None, _) => return Err(bad("job_id: a job id (job_ and 24 hex digits)")),
            (None, Some(v), Some(n)) => match v.as_u64().filter(|&x| (x as usize) < n) {
                Some(x) => (String::new(), Some(x as u32)),
                None => {
                    return Err(bad(&format!(
                        "from_index: the index of another job of this batch, 0 to {}",
                        n.saturating_sub(1)
                    )))
                }
            },
            (Some(_), Some(_), _) => return Err(bad("job_id or from_index, not both")),
            (None, _, Some(_)) => return Err(bad("job_id or from_index: required")),
            (None, _, None) => return Err(bad("job_id: required")),
        };
        let name = match m.get("name") {
            Some(Value::String(n)) if relative_path(n) => n.clone(),
            Some(_) => {
                return Err(bad(&format!(
                    "name: a result file's name, a relative path of at most {MAX_INPUT_PATH_BYTES} bytes"
                )))
            }
            None => return Err(bad("name: required")),
        };
        let dest = match m.get("as").filter(|v| !v.is_null()) {
            None => name.rsplit('/').next().unwrap_or(&name).to_string(),
            Some(Value::String(a)) if relative_path(a) => a.clone(),
            Some(_) => {
                return Err(bad(&format!(
                "as: a relative path under input/ (no `..`), at most {MAX_INPUT_PATH_BYTES} bytes"
            )))
            }
        };
        if let Some(o) = out.iter().find(|o| {
            o.dest == dest
                || dest.starts_with(&format!("{}/", o.dest))
                || o.dest.starts_with(&format!("{dest}/"))
        }) {
            return Err(bad(&format!(
                "input/{dest} collides with input/{} of another input; give one an `as`",
                o.dest
            )));
        }
        out.push(InputFile {
            job_id,
            from_index,
            name,
            dest,
            size: None,
            sha256: None,
        });
    }
    Ok(out)
}

/// The idempotency key of the body or of the `Idempotency-Key` header (both: the same).
pub(super) fn idempotency(
    body_key: Option<String>,
    header_key: Option<String>,
) -> Result<Option<String>, Response> {
    let idempotency_key = match (body_key, header_key) {
        (Some(a), Some(b)) if a != b => {
            return Err(error(
                400,
                "idempotency_key and the Idempotency-Key header disagree; send one",
            ))
        }
        (Some(k), _) | (None, Some(k)) => Some(k),
        (None, None) => None,
    };
    if let Some(k) = &idempotency_key {
        if k.is_empty()
            || k.len() > MAX_IDEMPOTENCY_KEY_BYTES
            || !k.bytes().all(|b| (0x21..0x7f).contains(&b))
        {
            return Err(error(
                400,
                &format!("idempotency_key: 1 to {MAX_IDEMPOTENCY_KEY_BYTES} printable ASCII characters without spaces"),
            ));
        }
    }
    Ok(idempotency_key)
}

/// `webhook_url`, checked against the server's policy.
pub(super) fn webhook(f: &Fields, limits: &WbxJobs) -> Result<Option<String>, Response> {
    let webhook_url = match f.string("webhook_url")? {
        None => None,
        Some(_) if !limits.webhooks => {
            return Err(error(
                400,
                "webhook_url: webhooks are off on this server (ISOBOX_WBX_WEBHOOKS=off)",
            ))
        }
        Some(u) => {
            let policy = crate::webhooks::Policy {
                loopback: limits.webhook_loopback,
                deny: limits.webhook_deny.clone(),
            };
            crate::webhooks::check_url(&u, &policy)
                .map_err(|why| error(400, &format!("webhook_url: {why}")))?;
            Some(u)
        }
    };
    Ok(webhook_url)
}

/// An amount field (`max_cost`, `max_total_cost`) or its `_eur` twin (for a server
/// billing in EUR).
pub(super) fn money(f: &Fields, name: &str, limits: &WbxJobs) -> Result<Option<Money>, Response> {
    let eur = format!("{name}_eur");
    let mut max_cost = None;
    for field in [name, eur.as_str()] {
        let Some(v) = f.0.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        if field == eur && limits.currency != "EUR" {
            return Err(error(
                400,
                &format!(
                    "{eur}: this server bills in {}; use {name}",
                    limits.currency
                ),
            ));
        }
        let m = amount(v).map_err(|why| error(400, &format!("{field}: {why}")))?;
        if max_cost.is_some_and(|o| o != m) {
            return Err(error(400, &format!("{name} and {eur} disagree; send one")));
        }
        max_cost = Some(m);
    }
    Ok(max_cost)
}

/// `POST /v1/jobs`.
pub fn submit(req: &Request, runtimes: &Runtimes, limits: &WbxJobs) -> Result<JobOp, Response> {
    let f = Fields::of(req, FIELDS)?;
    let header_key = req.head.header("idempotency-key").map(str::to_string);
    job_fields(&f, header_key, runtimes, limits, None).map(|s| JobOp::Submit(Box::new(s)))
}

/// One job's fields (of `POST /v1/jobs`, or of a batch of `batch` jobs, with its
/// defaults in).
pub(super) fn job_fields(
    f: &Fields,
    header_key: Option<String>,
    runtimes: &Runtimes,
    limits: &WbxJobs,
    batch: Option<usize>,
) -> Result<Submit, Response> {
    let wasi = match f.string("runtime")?.as_deref() {
        None | Some(RUNTIME_SANDBOX) => false,
        Some(RUNTIME_WASI) if batch.is_some() => {
            return Err(error(
                400,
                "runtime: a batch's jobs run in sandboxes on this server; submit a WebAssembly job on its own (POST /v1/jobs)",
            ))
        }
        Some(RUNTIME_WASI) => true,
        Some(other) => {
            return Err(error(
                400,
                &format!("runtime: {other:?} is not a runtime of this server; \"{RUNTIME_SANDBOX}\" (the default) or \"{RUNTIME_WASI}\" (GET /v1/runtimes lists them)"),
            ))
        }
    };
    if !wasi && !f.absent("wasm") {
        return Err(error(400, "wasm: only with \"runtime\": \"wasi\""));
    }
    if wasi {
        if let Some((name, why)) = NOT_WASI.iter().find(|(n, _)| !f.absent(n)) {
            return Err(error(400, &format!("{name}: {why}")));
        }
        match f.0.get("network").filter(|v| !v.is_null()) {
            None => {}
            Some(v) if v == &json!({"mode": "none"}) => {}
            Some(_) => {
                return Err(error(
                    400,
                    "network: a WebAssembly job has no network (only {\"mode\": \"none\"})",
                ))
            }
        }
    }
    let (command, template) = if wasi {
        (String::new(), String::new())
    } else {
        let command = f
            .string("command")?
            .ok_or_else(|| error(400, "command: required"))?;
        if command.trim().is_empty() || command.len() > MAX_COMMAND_BYTES || command.contains('\0')
        {
            return Err(error(
                400,
                &format!("command: 1 to {MAX_COMMAND_BYTES} bytes, not blank, without NUL"),
            ));
        }
        let template = f
            .string("template")?
            .unwrap_or_else(|| sandboxes::DEFAULT_TEMPLATE.to_string());
        if !sandboxes::templates(runtimes)
            .iter()
            .any(|(n, _, _)| *n == template)
        {
            return Err(error(
                400,
                &format!("template: unknown template {template:?}; GET /v1/templates lists them"),
            ));
        }
        (command, template)
    };
    let max_timeout_s = if wasi {
        MAX_WASM_TIMEOUT_S.min(limits.max_timeout_s)
    } else {
        limits.max_timeout_s
    };
    let what = "a whole number of seconds, at least 1";
    let timeout_s = match (
        f.whole("timeout_s", what)?,
        f.whole("max_duration_seconds", what)?,
    ) {
        (Some(a), Some(b)) if a != b => {
            return Err(error(
                400,
                "timeout_s and max_duration_seconds (its alias) disagree; send one",
            ))
        }
        (Some(t), _) | (None, Some(t)) => t,
        (None, None) => DEFAULT_TIMEOUT_S.min(max_timeout_s),
    };
    if timeout_s == 0 || timeout_s > max_timeout_s {
        return Err(error(
            400,
            &format!(
                "timeout_s: 1 to {max_timeout_s} seconds{}",
                if wasi {
                    " for a WebAssembly job"
                } else {
                    " on this server"
                }
            ),
        ));
    }
    let artifacts = patterns(f, "artifacts")?;
    let required_artifacts = patterns(f, "required_artifacts")?;
    let env = env_vars(f.strings("env")?)?;
    if !wasi {
        // The call that starts the command carries it and its env in one frame: a job
        // that could not be started is refused now, not after its sandbox booted.
        let call = crate::sandbox::wire::Call::Spawn {
            cmd: command.clone(),
            cwd: Some(JOB_HOME.to_string()),
            env: env.clone(),
            stdin: false,
            pty: None,
            background: false,
        };
        let n = serde_json::to_vec(&call).map_or(usize::MAX, |v| v.len()) + 5;
        if n > crate::sandbox::wire::MAX_FRAME_BYTES {
            return Err(error(
                400,
                &format!(
                    "command and env: together {n} bytes in the call that starts the command (as JSON, control characters escaped); at most {}",
                    crate::sandbox::wire::MAX_FRAME_BYTES
                ),
            ));
        }
    }
    let network = match f.0.get("network").filter(|v| !v.is_null()) {
        None if wasi => json!({"mode": "none"}),
        None => json!({"mode": "full"}),
        Some(v) => {
            sandboxes::network(Some(v))?;
            v.clone()
        }
    };
    let retry = match f.0.get("retry").filter(|v| !v.is_null()) {
        None => RetryPolicy { max_attempts: 1 },
        Some(Value::Object(r)) => {
            if let Some(k) = r.keys().find(|k| *k != "max_attempts" && *k != "on") {
                return Err(error(
                    400,
                    &format!("retry: unknown field `{k}`; it takes max_attempts, on"),
                ));
            }
            match r.get("on").map(|v| v.as_str()) {
                None | Some(Some("system")) => {}
                _ => {
                    return Err(error(
                        400,
                        "retry.on: \"system\" is the one choice: failures on our side are retried; a job's own failure (exit code, timeout, missing files) is not",
                    ))
                }
            }
            let n = match r.get("max_attempts") {
                None => 2,
                Some(v) => v
                    .as_u64()
                    .filter(|n| (1..=u64::from(MAX_ATTEMPTS)).contains(n))
                    .ok_or_else(|| {
                        error(
                            400,
                            &format!("retry.max_attempts: a whole number from 1 to {MAX_ATTEMPTS}"),
                        )
                    })?,
            };
            RetryPolicy {
                max_attempts: n as u32,
            }
        }
        Some(_) => {
            return Err(error(
                400,
                "retry: must be an object like {\"max_attempts\": 2, \"on\": \"system\"}",
            ))
        }
    };
    let body_key = f.string("idempotency_key")?;
    if batch.is_some() && body_key.is_some() {
        return Err(error(
            400,
            "idempotency_key: a job of a batch has none of its own; the batch's idempotency_key covers all its jobs",
        ));
    }
    let idempotency_key = idempotency(body_key, header_key)?;
    let mut optimize_for = None;
    for name in ["placement", "optimize_for"] {
        let allowed: &[&str] = if name == "placement" {
            &["auto", "fast", "spread"]
        } else {
            &["price", "balanced", "performance"]
        };
        if let Some(v) = f.string(name)? {
            if !allowed.contains(&v.as_str()) {
                return Err(error(
                    400,
                    &format!("{name}: one of {}", allowed.join(", ")),
                ));
            }
            optimize_for = Some(v);
        }
    }
    if !f.absent("dependency_cache") && !f.0["dependency_cache"].is_boolean() {
        return Err(error(400, "dependency_cache: must be true or false"));
    }
    let webhook_url = webhook(f, limits)?;
    let max_cost = money(f, "max_cost", limits)?;
    let inputs = inputs(f, batch)?;
    let (wasm, wasm_bytes) = if wasi {
        let names: Vec<String> = inputs.iter().map(|i| i.dest.clone()).collect();
        let (spec, bytes) = wasm_fields(f.0.get("wasm"), &names)?;
        // The runtime gets its env in its own environment and its args on its command
        // line: together well under what a process may be started with.
        let env_bytes: usize = env.iter().map(|(k, v)| k.len() + v.len() + 16).sum();
        if env_bytes > MAX_WASM_ENV_BYTES {
            return Err(error(
                400,
                &format!("env: a WebAssembly job's env may be {MAX_WASM_ENV_BYTES} bytes in all"),
            ));
        }
        (Some(spec), Some(bytes))
    } else {
        (None, None)
    };
    // Whether the class is offered, and the tenant's default, are the daemon's.
    let compute_class =
        compute::field(f.0.get("compute_class"))?.map_or(String::new(), |c| c.name.to_string());
    let env_names = env.iter().map(|(k, _)| k.clone()).collect();
    let env_sha256 = (!env.is_empty()).then(|| crate::jobs::env_sha256(&env));
    Ok(Submit {
        spec: JobSpec {
            command,
            template,
            timeout_s,
            artifacts,
            required_artifacts,
            env_names,
            env_sha256,
            network,
            retry,
            idempotency_key,
            optimize_for,
            webhook_url,
            max_cost: max_cost.map(|m| m.0),
            inputs,
            compute_class,
            class_rate: None,
            wasm,
        },
        env,
        wasm_bytes,
        wasm_from: None,
    })
}

/// `GET /v1/jobs?status=&limit=&cursor=`.
pub fn list(req: &Request) -> Result<JobOp, Response> {
    let status = req.head.query_param("status");
    if let Some(s) = &status {
        if !STATES.contains(&s.as_str()) {
            return Err(error(400, &format!("status: one of {}", STATES.join(", "))));
        }
    }
    let limit = match req.head.query_param("limit") {
        None => DEFAULT_LIST,
        Some(l) => plain::<usize>(&l, false)
            .filter(|n| (1..=MAX_LIST).contains(n))
            .ok_or_else(|| error(400, &format!("limit: 1 to {MAX_LIST}")))?,
    };
    let cursor = match req.head.query_param("cursor") {
        None => None,
        Some(c) => Some(
            plain::<u64>(&c, false)
                .filter(|_| c.len() <= 19)
                .ok_or_else(|| error(400, "cursor: the next_cursor of the previous page"))?,
        ),
    };
    Ok(JobOp::List {
        status,
        limit,
        cursor,
    })
}

/// `GET /v1/jobs/{id}/logs?offset=&limit=&mode=&max_chars=`.
pub fn logs(req: &Request, id: String) -> Result<JobOp, Response> {
    let offset = match req.head.query_param("offset") {
        None => 0,
        Some(o) => plain::<i64>(&o, true).ok_or_else(|| {
            error(
                400,
                "offset: a whole number of bytes (negative: from the end)",
            )
        })?,
    };
    let limit = match req.head.query_param("limit") {
        None => MAX_LOG_READ,
        Some(l) => plain::<u64>(&l, false)
            .filter(|n| (1..=MAX_LOG_READ).contains(n))
            .ok_or_else(|| error(400, &format!("limit: 1 to {MAX_LOG_READ} bytes")))?,
    };
    let max_chars = match req.head.query_param("max_chars") {
        None => 6000,
        Some(m) => plain::<usize>(&m, false)
            .filter(|n| (100..=100_000).contains(n))
            .ok_or_else(|| error(400, "max_chars: 100 to 100000"))?,
    };
    let mode = match req.head.query_param("mode").as_deref() {
        None => None,
        Some("summary") => Some((LogMode::Summary, max_chars)),
        Some("errors") => Some((LogMode::Errors, max_chars)),
        Some("tail") => Some((LogMode::Tail, max_chars)),
        Some(_) => return Err(error(400, "mode: one of summary, errors, tail")),
    };
    Ok(JobOp::Logs {
        id,
        offset,
        limit,
        mode,
    })
}

/// `POST /v1/jobs/{id}/retry`: `{"env": {…}}` or nothing.
pub fn retry(req: &Request, id: String) -> Result<JobOp, Response> {
    let f = Fields::of(req, &["env"])?;
    Ok(JobOp::Retry(id, env_vars(f.strings("env")?)?))
}

/// Jobs one wait may name.
pub const MAX_WAIT_IDS: usize = 100;
/// Longest wait, seconds.
pub const MAX_WAIT_S: u64 = 60;
/// A wait's default, seconds.
pub const DEFAULT_WAIT_S: u64 = 30;

/// `POST /v1/jobs/wait` `{"job_ids": [...], "batch_ids": [...], "until": "any"|"all",
/// "timeout_s": N}`.
pub fn wait(req: &Request) -> Result<JobOp, Response> {
    let f = Fields::of(req, &["job_ids", "batch_ids", "until", "timeout_s"])?;
    let list = |name: &str| -> Result<Vec<String>, Response> {
        if f.absent(name) {
            return Ok(Vec::new());
        }
        let bad = || error(400, &format!("{name}: must be a list of ids"));
        let Value::Array(items) = &f.0[name] else {
            return Err(bad());
        };
        items
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
            .collect()
    };
    let asked = list("job_ids")?;
    let batches = list("batch_ids")?;
    if asked.len() + batches.len() > MAX_WAIT_IDS {
        return Err(error(
            400,
            &format!("job_ids, batch_ids: at most {MAX_WAIT_IDS} ids in one wait"),
        ));
    }
    let mut ids: Vec<String> = Vec::new();
    if let Some(bad) = asked.iter().find(|id| !valid_id(id)) {
        let shown: String = bad.chars().take(64).collect();
        return Err(error(404, &format!("job not found: {shown}")));
    }
    if let Some(bad) = batches.iter().find(|id| !super::batches::valid_id(id)) {
        let shown: String = bad.chars().take(64).collect();
        return Err(error(404, &format!("batch not found: {shown}")));
    }
    for id in asked.into_iter().chain(batches) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    if ids.is_empty() {
        return Err(error(400, "job_ids, batch_ids: at least one id"));
    }
    let all = match f.string("until")?.as_deref() {
        None | Some("any") => false,
        Some("all") => true,
        Some(_) => return Err(error(400, "until: \"any\" or \"all\"")),
    };
    let timeout_s = match f.whole("timeout_s", "a whole number of seconds from 0 to 60")? {
        None => DEFAULT_WAIT_S,
        Some(t) if t <= MAX_WAIT_S => t,
        Some(_) => {
            return Err(error(
                400,
                &format!("timeout_s: at most {MAX_WAIT_S} seconds; call again to wait longer"),
            ))
        }
    };
    Ok(JobOp::Wait {
        ids,
        all,
        timeout_s,
    })
}

/// The answer of a wait: each job's state, and whether the condition holds.
pub fn wait_json(items: &[(String, String, bool)], all: bool) -> Value {
    let finished = items.iter().filter(|(_, _, d)| *d).count();
    let done = if all {
        finished == items.len()
    } else {
        finished > 0
    };
    json!({
        "done": done,
        "finished": finished,
        "total": items.len(),
        "items": items.iter().map(|(id, status, d)| {
            let kind = if id.starts_with("bat_") { "batch" } else { "job" };
            json!({"id": id, "kind": kind, "status": status, "done": d})
        }).collect::<Vec<_>>(),
    })
}

/// `GET /v1/jobs/stats?days=`.
pub fn stats(req: &Request) -> Result<JobOp, Response> {
    match req.head.query_param("days") {
        None => Ok(JobOp::Stats(30)),
        Some(d) => plain::<u64>(&d, false)
            .filter(|n| (1..=365).contains(n))
            .map(JobOp::Stats)
            .ok_or_else(|| error(400, "days: 1 to 365")),
    }
}

/// What prices a job's cost: the price list now (an accepted job keeps the rate of
/// its class as it was when it was accepted).
#[derive(Debug, Clone)]
pub struct Prices {
    /// Currency.
    pub currency: String,
    /// A class's rate when it has none of its own.
    pub base: Rate,
    /// Classes with rates of their own.
    pub own: Vec<(&'static str, Rate)>,
}

impl Prices {
    /// Class `c`'s rate now.
    pub fn rate(&self, c: &Class) -> Rate {
        self.own
            .iter()
            .find(|(n, _)| *n == c.name)
            .map_or(self.base, |(_, r)| *r)
    }

    /// A job's class and its rate, as fixed when the job was accepted (a job from
    /// before classes existed: economy at the price list now).
    pub fn of(&self, spec: &JobSpec) -> (&'static Class, Rate) {
        let c = compute::of_job(spec);
        (c, spec.class_rate.unwrap_or_else(|| self.rate(c)))
    }

    /// The cost of `ms` of a job sandbox's run time (its class's vCPUs and memory at
    /// its rate).
    pub fn cost(&self, spec: &JobSpec, ms: u64) -> Money {
        let (c, r) = self.of(spec);
        match &spec.wasm {
            // A WebAssembly job: 1 vCPU and its memory limit, at its class's rate.
            Some(w) => compute::cost(
                &Class {
                    vcpu: 1,
                    mem_mb: w.memory_mb,
                    ..*c
                },
                r,
                ms,
            ),
            None => compute::cost(c, r, ms),
        }
    }

    /// A job's rate as its answers show it.
    fn class_price(&self, spec: &JobSpec) -> Value {
        compute::price_json(self.of(spec).1, &self.currency)
    }

    /// An amount as the document writes one: `"0.000312 EUR"`.
    pub fn show(&self, m: Money) -> String {
        format!("{} {}", m.display(), self.currency)
    }
}

/// A job's saved result files as the document lists them: name, size, SHA-256.
fn files_json(rec: &JobRecord) -> Vec<Value> {
    rec.artifacts
        .iter()
        .map(|a| json!({"name": a.name, "size": a.size, "sha256": a.sha256}))
        .collect()
}

fn ts(ms: Option<u64>) -> Value {
    ms.map_or(Value::Null, |m| Value::String(super::timestamp(m)))
}

/// Milliseconds of the current attempt (to now while it runs).
pub fn duration_ms(rec: &JobRecord, now_ms: u64) -> Option<u64> {
    let start = rec.started_ms?;
    Some(rec.ended_ms.unwrap_or(now_ms).saturating_sub(start))
}

/// The file names of its saved results.
fn file_names(rec: &JobRecord) -> Vec<&str> {
    rec.artifacts.iter().map(|a| a.name.as_str()).collect()
}

/// `GET /v1/jobs/{id}`: status, inputs (without env values), timing, error, result
/// files and cost.
pub fn job_json(id: &str, rec: &JobRecord, prices: &Prices, now_ms: u64) -> Value {
    let s = &rec.spec;
    let mut v = json!({
        "id": id,
        "status": rec.status,
        "command": s.command,
        "template": s.template,
        "timeout_s": s.timeout_s,
        "artifacts": s.artifacts,
        "required_artifacts": s.required_artifacts,
        "env": s.env_names,
        "network": s.network.get("mode").cloned().unwrap_or(Value::Null),
        "retry": {"max_attempts": s.retry.max_attempts, "on": "system"},
        "idempotency_key": s.idempotency_key,
        "optimize_for": s.optimize_for,
        "compute_class": prices.of(s).0.name,
        "class_price": prices.class_price(s),
        "retry_of": rec.retry_of,
        "inputs": s.inputs,
        "batch_id": rec.batch,
        "depends_on": rec.depends_on,
        "webhook_url": s.webhook_url,
        "webhook": Value::Null,
        "attempt": rec.attempt,
        "created_at": super::timestamp(rec.created_ms),
        "started_at": ts(rec.started_ms),
        "finished_at": ts(rec.ended_ms),
        "duration_s": duration_s(rec, now_ms),
        "exit_code": rec.exit_code,
        "error": rec.error,
        "result_files": files_json(rec),
        "skipped_files": rec.skipped,
        "cost": prices.show(prices.cost(&rec.spec, rec.billed_ms)),
        // Attempts that failed on our side, credited (never charged).
        "refund": prices.show(prices.cost(&rec.spec, rec.refunded_ms)),
    });
    if let Some(w) = &s.wasm {
        // A WebAssembly job says so; a job in a sandbox keeps the document's shape.
        v["runtime"] = json!(RUNTIME_WASI);
        v["wasm"] = wasm_json(w);
    }
    v
}

/// How a job went, as its summary and its `job.finished` event both say it: state,
/// exit code, duration, cost, error, file names, test results.
fn outcome_json(id: &str, rec: &JobRecord, prices: &Prices, now_ms: u64) -> Value {
    json!({
        "id": id,
        "status": rec.status,
        "exit_code": rec.exit_code,
        "duration_s": duration_s(rec, now_ms),
        "cost": prices.show(prices.cost(&rec.spec, rec.billed_ms)),
        "error": rec.error,
        "files": file_names(rec),
        "test_results": rec.test_results,
    })
}

/// [`duration_ms`] in seconds.
fn duration_s(rec: &JobRecord, now_ms: u64) -> Option<f64> {
    duration_ms(rec, now_ms).map(|ms| ms as f64 / 1000.0)
}

/// The `job.finished` event's body, as every delivery of it sends it.
pub fn finished_event(id: &str, rec: &JobRecord, prices: &Prices, now_ms: u64) -> String {
    json!({
        "event": "job.finished",
        "id": id,
        "created_at": super::timestamp(now_ms),
        "data": outcome_json(id, rec, prices, now_ms),
    })
    .to_string()
}

/// A job's webhook delivery as `GET /v1/jobs/{id}` shows it.
pub fn webhook_json(ev: &crate::store::webhooks::OutboxEvent) -> Value {
    json!({
        "state": ev.state,
        "attempts": ev.attempts,
        "last_error": ev.last_error,
        "delivered_at": ev.delivered_ms.map(super::timestamp),
        "next_attempt_at": (ev.state == "pending").then(|| super::timestamp(ev.next_ms)),
    })
}

/// What an agent should do next, in words.
fn next_step(rec: &JobRecord) -> String {
    match rec.status.as_str() {
        "queued" | "starting" | "cleanup_pending" | "recovery_pending" => {
            "wait: POST /v1/jobs/wait, or GET /v1/jobs/{id}/summary again in a few seconds".into()
        }
        "running" | "uploading_artifacts" => {
            "wait for it to finish; GET /v1/jobs/{id}/logs?offset=-4000 shows its latest output".into()
        }
        "completed" if rec.artifacts.is_empty() => "done; it saved no result files".into(),
        "completed" => "done: download its result files from GET /v1/jobs/{id}/artifacts/{name}".into(),
        "expired" => format!(
            "it reached its time limit of {} s: files written so far are saved; retry with a larger timeout_s",
            rec.spec.timeout_s
        ),
        "cancelled" => "it was cancelled; POST /v1/jobs/{id}/retry runs it again".into(),
        _ => match rec.error.as_ref().map(|e| e.code.as_str()) {
            Some("nonzero_exit") => {
                "read the end of its log (below, or GET /v1/jobs/{id}/logs?offset=-4000), fix the command, then POST /v1/jobs/{id}/retry".into()
            }
            Some("missing_artifacts") => {
                "the command did not write every required file: check the paths in required_artifacts against what it writes".into()
            }
            Some("out_of_memory") => {
                "it ran out of memory: use less, split the work, or retry it with a compute_class that has more (GET /v1/compute/preferences lists them)".into()
            }
            _ => "a failure on our side: POST /v1/jobs/{id}/retry".into(),
        },
    }
}

/// `GET /v1/jobs/{id}/summary`, with the log's last lines.
pub fn summary_json(
    id: &str,
    rec: &JobRecord,
    prices: &Prices,
    now_ms: u64,
    last_lines: &[String],
) -> Value {
    let mut v = outcome_json(id, rec, prices, now_ms);
    v["last_log_lines"] = json!(last_lines);
    v["next_step"] = json!(next_step(rec).replace("{id}", id));
    v
}

/// The execution receipt's body (signed by the daemon as it is sent).
pub fn receipt_json(id: &str, rec: &JobRecord, prices: &Prices, isolation: &str) -> Value {
    let s = &rec.spec;
    let (class, _) = prices.of(s);
    let mut v = json!({
        "job_id": id,
        "status": rec.status,
        "inputs": {
            "command": s.command,
            "command_sha256": crate::jobs::sha256_hex(s.command.as_bytes()),
            "template": s.template,
            "timeout_s": s.timeout_s,
            "env": s.env_names,
            "env_sha256": s.env_sha256,
            "files": s.inputs,
        },
        "runtime": match &s.wasm {
            Some(w) => json!({"kind": RUNTIME_WASI, "isolation": "wasm-process", "vcpu": 1, "mem_mb": w.memory_mb}),
            None => json!({"kind": "vm", "isolation": isolation, "compute_class": class.name, "vcpu": class.vcpu, "mem_mb": class.mem_mb}),
        },
        "network": s.network,
        "timing": {
            "created_at": super::timestamp(rec.created_ms),
            "started_at": ts(rec.started_ms),
            "finished_at": ts(rec.ended_ms),
            "duration_ms": duration_ms(rec, rec.ended_ms.unwrap_or(0)),
            "attempts": rec.attempt,
        },
        "exit_code": rec.exit_code,
        "error": rec.error,
        "cpu_time_ms": rec.cpu_ms,
        "peak_memory_bytes": rec.peak_memory_bytes,
        "result_files": files_json(rec),
        "log": {"size": rec.log_bytes, "sha256": rec.log_sha256, "dropped_bytes": rec.log_dropped},
        "test_results": rec.test_results,
        "cost": prices.show(prices.cost(&rec.spec, rec.billed_ms)),
    });
    if let Some(w) = &s.wasm {
        v["inputs"]["wasm"] = wasm_json(w);
    }
    v
}

/// A WebAssembly job's `wasm`, as its answers show it.
fn wasm_json(w: &crate::store::jobs::WasmSpec) -> Value {
    json!({
        "module_sha256": w.module_sha256,
        "module_bytes": (w.module_input.is_none()).then_some(w.module_bytes),
        "module": w.module_input,
        "args": w.args,
        "memory_mb": w.memory_mb,
        "stdin_bytes": w.stdin_bytes,
    })
}

/// `GET /v1/jobs/{id}/artifacts`.
pub fn artifacts_json(id: &str, rec: &JobRecord) -> Value {
    json!({
        "job_id": id,
        "status": rec.status,
        "files": files_json(rec),
        "skipped": rec.skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ids() {
        assert!(valid_id("job_0123456789abcdef01234567"));
        assert!(!valid_id("job_0123"));
        assert!(!valid_id("sb_0123456789abcdef01234567"));
    }

    #[test]
    fn test_a_job_stored_before_classes_reads_as_economy_at_today_s_list() {
        // A record as the version before compute classes wrote it: no `compute_class`,
        // no `class_rate`.
        let old = r#"{"command":"true","template":"base","timeout_s":60,"artifacts":[],"required_artifacts":[],"env_names":[],"env_sha256":null,"network":{"mode":"none"},"retry":{"max_attempts":1},"idempotency_key":null,"optimize_for":null,"webhook_url":null,"max_cost":null,"inputs":[]}"#;
        let spec: JobSpec = serde_json::from_str(old).unwrap();
        assert_eq!((spec.compute_class.as_str(), spec.class_rate), ("", None));
        let p = Prices {
            currency: "EUR".into(),
            base: Rate {
                vcpu_s: 10_000,
                gb_s: 2_000,
            },
            own: vec![("economy", Rate { vcpu_s: 1, gb_s: 0 })],
        };
        let (class, rate) = p.of(&spec);
        assert_eq!((class.name, rate), ("economy", Rate { vcpu_s: 1, gb_s: 0 }));
        assert_eq!(p.class_price(&spec)["vcpu_s"], "0.000000001 EUR");
    }

    #[test]
    fn test_cost_is_run_time_times_the_class_terms_at_the_rate_fixed_at_accept() {
        let rate = |v: &str, g: &str| Rate {
            vcpu_s: Money::parse(v).unwrap().0,
            gb_s: Money::parse(g).unwrap().0,
        };
        let p = Prices {
            currency: "EUR".into(),
            base: rate("0.00001", "0.000002"),
            own: vec![("memory", rate("0.00002", "0.000004"))],
        };
        // Before classes: economy at the price list now.
        // 10 s × (2 vCPU × 0.00001 + 0.536870 GB × 0.000002) = 0.0002 + 0.0000107374
        let mut spec = JobSpec::default();
        assert_eq!(p.show(p.cost(&spec, 10_000)), "0.000211 EUR");
        assert_eq!(p.show(p.cost(&spec, 0)), "0.000000 EUR");
        // The memory class at its own rate: 10 s × (2 × 0.00002 + 8.589 GB × 0.000004).
        spec.compute_class = "memory".into();
        assert_eq!(p.cost(&spec, 10_000).0, 400_000 + 343_560);
        // A rate fixed at accept wins over the list now.
        spec.class_rate = Some(rate("0.00001", "0"));
        assert_eq!(p.cost(&spec, 10_000).0, 200_000);
        assert_eq!(
            p.class_price(&spec),
            json!({"vcpu_s": "0.000010 EUR", "gb_s": "0.000000 EUR"})
        );
    }
}

//! The WBX face's route table (paths relative to [`super::BASE`]): pattern, methods,
//! route, body cap and admission class in one row, resolved with `router::resolve`.

use super::batches;
use super::files;
use super::jobs::{self, JobOp};
use super::processes::{self, ProcOp};
use super::sandboxes::{self, Limits, Op};
use crate::admission::Class;
use crate::http::limits::DEFAULT_BODY_BYTES;
use crate::http::{Request, Response};
use crate::router::{RouteError, Row};
use crate::runtimes::Runtimes;

/// Which route a request is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /v1/templates`
    Templates,
    /// `GET /v1/runtimes`
    Runtimes,
    /// `GET /v1/sandboxes`
    SandboxList,
    /// `POST /v1/sandboxes`
    SandboxCreate,
    /// `GET`, `DELETE /v1/sandboxes/{id}`
    Sandbox,
    /// `POST /v1/sandboxes/{id}/timeout`
    Timeout,
    /// `POST /v1/sandboxes/{id}/exec`
    Exec,
    /// `POST /v1/sandboxes/{id}/exec/stream`
    ExecStream,
    /// `POST /v1/sandboxes/{id}/pause`
    Pause,
    /// `POST /v1/sandboxes/{id}/resume`
    Resume,
    /// `GET /v1/sandboxes/{id}/metrics`
    Metrics,
    /// `POST /v1/sandboxes/{id}/env`
    Env,
    /// `GET`, `POST /v1/sandboxes/{id}/process`
    Processes,
    /// `GET`, `DELETE /v1/sandboxes/{id}/process/{pid}`
    Process,
    /// `GET /v1/sandboxes/{id}/process/{pid}/stream`
    ProcStream,
    /// `POST /v1/sandboxes/{id}/process/{pid}/stdin`
    ProcStdin,
    /// `POST /v1/sandboxes/{id}/process/{pid}/signal`
    ProcSignal,
    /// `POST /v1/sandboxes/{id}/process/{pid}/resize`
    ProcResize,
    /// `GET /v1/sandboxes/{id}/process/{pid}/ws`: a WebSocket (an isobox extension)
    ProcWs,
    /// `GET /v1/sandboxes/{id}/fs/list`
    FsList,
    /// `GET /v1/sandboxes/{id}/fs/stat`
    FsStat,
    /// `POST /v1/sandboxes/{id}/fs/mkdir`
    FsMkdir,
    /// `POST /v1/sandboxes/{id}/fs/move`
    FsMove,
    /// `POST /v1/sandboxes/{id}/fs/remove`
    FsRemove,
    /// `GET /v1/sandboxes/{id}/fs/watch`
    FsWatch,
    /// `GET /v1/sandboxes/{id}/url?port=`
    Url,
    /// `GET`, `HEAD`, `PUT`, `DELETE /v1/sandboxes/{id}/files` (a `PUT` is taken over
    /// at its head, its body streamed: see `daemon::box_transfer`)
    Files,
    /// `GET`, `POST /v1/jobs`
    Jobs,
    /// `GET /v1/jobs/stats`
    JobStats,
    /// `POST /v1/jobs/wait`
    JobWait,
    /// `GET /v1/jobs/{id}`
    Job,
    /// `GET /v1/jobs/{id}/summary`
    JobSummary,
    /// `GET /v1/jobs/{id}/logs`
    JobLogs,
    /// `GET /v1/jobs/{id}/receipt`
    JobReceipt,
    /// `GET /v1/jobs/{id}/artifacts`
    JobArtifacts,
    /// `GET /v1/jobs/{id}/artifacts/{name*}`
    JobArtifact,
    /// `POST /v1/jobs/{id}/cancel`
    JobCancel,
    /// `POST /v1/jobs/{id}/retry`
    JobRetry,
    /// `GET /v1/receipts/key`: the key receipts are signed with
    ReceiptKey,
    /// `GET /v1/webhooks/secret`
    WebhookSecret,
    /// `POST /v1/webhooks/secret/rotate`
    WebhookRotate,
    /// `GET`, `PUT /v1/budget`
    Budget,
    /// `GET`, `PUT /v1/compute/preferences`
    ComputePrefs,
    /// `GET`, `POST /v1/batches`
    Batches,
    /// `GET /v1/batches/{id}`
    Batch,
    /// `GET /v1/batches/{id}/report`
    BatchReport,
    /// `POST /v1/batches/{id}/cancel`
    BatchCancel,
}

/// Everything the face says about one route.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Which route.
    pub id: Route,
    /// Its path pattern after `/wbx` (the `route` label of `/metrics`).
    pub pattern: &'static str,
    /// Largest body accepted.
    pub body_cap: usize,
    /// How admission treats it.
    pub class: Class,
}

impl Spec {
    /// The answer to a body over the cap.
    pub fn over_cap(&self) -> Response {
        super::error(
            413,
            &format!("request body exceeds {} KiB", self.body_cap / 1024),
        )
    }
}

/// A command's body: the command line and its whole stdin.
pub const EXEC_BODY_BYTES: usize = 2 << 20;
/// A job's body: a WebAssembly job's module (8 MB) and stdin (4 MB) in base64, and
/// the rest.
pub const JOB_BODY_BYTES: usize = 17 << 20;
/// A batch's body: up to 1000 jobs.
pub const BATCH_BODY_BYTES: usize = 8 << 20;

const fn row(
    pattern: &'static str,
    methods: &'static [&'static str],
    id: Route,
    class: Class,
    body_cap: usize,
) -> Row<Spec> {
    Row {
        pattern,
        methods,
        route: Spec {
            id,
            pattern,
            body_cap,
            class,
        },
    }
}

const GET: &[&str] = &["GET", "HEAD"];
const POST: &[&str] = &["POST"];

/// Every route of the face. A sandbox holds its tenant's secrets (its `env`) and
/// files: like memory and volumes, these routes need a key whenever keys are
/// configured, the open-demo setup (`ISOBOX_MEMORY_REQUIRE_KEY=1`) included. With no
/// keys configured at all, every client is the one `public` tenant (a single-user box).
#[rustfmt::skip]
pub static ROUTES: &[Row<Spec>] = &[
    row("/v1/templates", GET, Route::Templates, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/runtimes", GET, Route::Runtimes, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes", GET, Route::SandboxList, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes", POST, Route::SandboxCreate, Class::MemoryStarts, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}", &["GET", "HEAD", "DELETE"], Route::Sandbox, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/timeout", POST, Route::Timeout, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/exec", POST, Route::Exec, Class::Memory, EXEC_BODY_BYTES),
    row("/v1/sandboxes/{id}/exec/stream", POST, Route::ExecStream, Class::Memory, EXEC_BODY_BYTES),
    row("/v1/sandboxes/{id}/pause", POST, Route::Pause, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/resume", POST, Route::Resume, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/metrics", GET, Route::Metrics, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/url", GET, Route::Url, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/env", POST, Route::Env, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/process", &["GET", "HEAD", "POST"], Route::Processes, Class::Memory, EXEC_BODY_BYTES),
    row("/v1/sandboxes/{id}/process/{pid}", &["GET", "HEAD", "DELETE"], Route::Process, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/process/{pid}/stream", GET, Route::ProcStream, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/process/{pid}/stdin", POST, Route::ProcStdin, Class::Memory, EXEC_BODY_BYTES),
    row("/v1/sandboxes/{id}/process/{pid}/signal", POST, Route::ProcSignal, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/process/{pid}/resize", POST, Route::ProcResize, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/process/{pid}/ws", GET, Route::ProcWs, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/fs/list", GET, Route::FsList, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/fs/stat", GET, Route::FsStat, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/fs/mkdir", POST, Route::FsMkdir, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/fs/move", POST, Route::FsMove, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/fs/remove", POST, Route::FsRemove, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/fs/watch", GET, Route::FsWatch, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/sandboxes/{id}/files", &["GET", "HEAD", "PUT", "DELETE"], Route::Files, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/jobs", GET, Route::Jobs, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/jobs", POST, Route::Jobs, Class::MemoryStarts, JOB_BODY_BYTES),
    row("/v1/jobs/stats", GET, Route::JobStats, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/jobs/wait", POST, Route::JobWait, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/jobs/{id}", GET, Route::Job, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/jobs/{id}/summary", GET, Route::JobSummary, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/jobs/{id}/logs", GET, Route::JobLogs, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/jobs/{id}/receipt", GET, Route::JobReceipt, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/jobs/{id}/artifacts", GET, Route::JobArtifacts, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/jobs/{id}/artifacts/{name*}", GET, Route::JobArtifact, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/jobs/{id}/cancel", POST, Route::JobCancel, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/jobs/{id}/retry", POST, Route::JobRetry, Class::MemoryStarts, EXEC_BODY_BYTES),
    row("/v1/receipts/key", GET, Route::ReceiptKey, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/webhooks/secret", GET, Route::WebhookSecret, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/webhooks/secret/rotate", POST, Route::WebhookRotate, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/budget", &["GET", "HEAD", "PUT"], Route::Budget, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/compute/preferences", &["GET", "HEAD", "PUT"], Route::ComputePrefs, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/batches", GET, Route::Batches, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/batches", POST, Route::Batches, Class::MemoryStarts, BATCH_BODY_BYTES),
    row("/v1/batches/{id}", GET, Route::Batch, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/batches/{id}/report", GET, Route::BatchReport, Class::Memory, DEFAULT_BODY_BYTES),
    row("/v1/batches/{id}/cancel", POST, Route::BatchCancel, Class::Memory, DEFAULT_BODY_BYTES),
];

/// The row for `method` and `path` (the path without the base), and its parameters.
///
/// # Errors
/// 404 or 405 in the face's shape.
pub fn resolve(method: &str, path: &str) -> Result<(&'static Spec, crate::http::Params), Response> {
    crate::router::resolve(ROUTES, method, path)
        .map(|(row, params)| (&row.route, params))
        .map_err(|e| match e {
            RouteError::NotFound => super::error(404, "no such endpoint"),
            RouteError::MethodNotAllowed(allow) => super::error(
                405,
                &format!("method not allowed; this endpoint answers {allow}"),
            )
            .with_header("Allow", allow),
        })
}

/// What a request on `spec` asks: an answer now, or an operation on the sandboxes.
pub enum Asked {
    /// Answer this.
    Respond(Response),
    /// Do this.
    Op(Op),
    /// Do this with the jobs.
    Job(JobOp),
}

/// A jobs (or batches) request, parsed.
fn job_request(spec: &Spec, req: &Request, runtimes: &Runtimes, limits: &Limits) -> Asked {
    let batch = spec.pattern.starts_with("/v1/batches");
    let id = req
        .params
        .get("id")
        .filter(|i| {
            if batch {
                batches::valid_id(i)
            } else {
                jobs::valid_id(i)
            }
        })
        .map(str::to_string);
    // The route table says which routes name a job (or a batch).
    if spec.pattern.contains("{id}") && id.is_none() {
        return Asked::Respond(if batch {
            batches::not_found()
        } else {
            jobs::not_found()
        });
    }
    let id = id.unwrap_or_default();
    let head_only = req.head.method == "HEAD";
    let r = match spec.id {
        Route::Jobs if req.head.method == "POST" => jobs::submit(req, runtimes, &limits.jobs),
        Route::Jobs => jobs::list(req),
        Route::JobStats => jobs::stats(req),
        Route::JobWait => jobs::wait(req),
        Route::Job => Ok(JobOp::Get(id)),
        Route::JobSummary => Ok(JobOp::Summary(id)),
        Route::JobLogs => jobs::logs(req, id),
        Route::JobReceipt => Ok(JobOp::Receipt(id)),
        Route::JobArtifacts => Ok(JobOp::Artifacts(id)),
        Route::JobArtifact => {
            match req
                .params
                .get("name")
                .and_then(crate::http::parse::percent_decode)
            {
                Some(name) => Ok(JobOp::Artifact {
                    id,
                    name,
                    head_only,
                }),
                None => Err(super::error(404, "no such result file")),
            }
        }
        Route::JobCancel => sandboxes::Fields::of(req, &[]).map(|_| JobOp::Cancel(id)),
        Route::JobRetry => jobs::retry(req, id),
        Route::WebhookSecret => Ok(JobOp::WebhookSecret(false)),
        Route::WebhookRotate => sandboxes::Fields::of(req, &[]).map(|_| JobOp::WebhookSecret(true)),
        Route::Budget if req.head.method == "PUT" => jobs::budget_put(req),
        Route::Budget => Ok(JobOp::Budget(None)),
        Route::ComputePrefs if req.head.method == "PUT" => {
            super::compute::preferences_put(req).map(|c| JobOp::ComputePrefs(Some(c)))
        }
        Route::ComputePrefs => Ok(JobOp::ComputePrefs(None)),
        Route::Batches if req.head.method == "POST" => batches::submit(req, runtimes, &limits.jobs),
        Route::Batches => batches::list(req),
        Route::Batch => Ok(JobOp::BatchGet(id)),
        Route::BatchReport => batches::report(req, id),
        Route::BatchCancel => sandboxes::Fields::of(req, &[]).map(|_| JobOp::BatchCancel(id)),
        _ => Ok(JobOp::ReceiptKey),
    };
    match r {
        Ok(op) => Asked::Job(op),
        Err(resp) => Asked::Respond(resp),
    }
}

/// Parses and checks a complete request.
pub fn handle(spec: &Spec, req: &Request, runtimes: &Runtimes, limits: &Limits) -> Asked {
    if matches!(
        spec.id,
        Route::Jobs
            | Route::JobStats
            | Route::JobWait
            | Route::Job
            | Route::JobSummary
            | Route::JobLogs
            | Route::JobReceipt
            | Route::JobArtifacts
            | Route::JobArtifact
            | Route::JobCancel
            | Route::JobRetry
            | Route::ReceiptKey
            | Route::WebhookSecret
            | Route::WebhookRotate
            | Route::Budget
            | Route::ComputePrefs
            | Route::Batches
            | Route::Batch
            | Route::BatchReport
            | Route::BatchCancel
    ) {
        return job_request(spec, req, runtimes, limits);
    }
    let id = || {
        req.params
            .get("id")
            .filter(|i| sandboxes::valid_id(i))
            .map(str::to_string)
    };
    // The route table says which routes name a sandbox.
    let needs_id = spec.pattern.contains("{id}");
    let sid = match (needs_id, id()) {
        (true, None) => return Asked::Respond(sandboxes::not_found()),
        (_, s) => s.unwrap_or_default(),
    };
    // A process's id: anything but a pid is no process.
    let pid = req.params.get("pid").map(processes::parse_pid);
    if let Some(None) = pid {
        let raw: String = req
            .params
            .get("pid")
            .unwrap_or_default()
            .chars()
            .take(24)
            .collect();
        return Asked::Respond(super::error(404, &format!("no such process: {raw}")));
    }
    let pid = pid.flatten().unwrap_or(0);
    let method = req.head.method.as_str();
    let r = match spec.id {
        Route::Templates => return Asked::Respond(sandboxes::templates_json(runtimes)),
        Route::Runtimes => return Asked::Respond(jobs::runtimes_json(runtimes, limits)),
        Route::SandboxList => Ok(Op::List),
        Route::SandboxCreate => sandboxes::create(req, runtimes, limits),
        Route::Sandbox if req.head.method == "DELETE" => Ok(Op::Delete(sid)),
        Route::Sandbox => Ok(Op::Get(sid)),
        Route::Timeout => sandboxes::timeout(req, sid, limits),
        Route::Exec => sandboxes::exec(req, sid, false),
        Route::ExecStream => sandboxes::exec(req, sid, true),
        Route::Pause => sandboxes::no_fields(req, Op::Pause(sid)),
        Route::Resume => sandboxes::no_fields(req, Op::Resume(sid)),
        Route::Metrics => Ok(Op::Metrics(sid)),
        Route::Url => sandboxes::url(req, sid),
        Route::Env => processes::env(req, sid),
        Route::Processes if method == "POST" => processes::start(req, sid),
        Route::Processes => Ok(Op::Proc(sid, ProcOp::List)),
        Route::Process if method == "DELETE" => Ok(Op::Proc(sid, ProcOp::Kill(pid))),
        Route::Process => Ok(Op::Proc(sid, ProcOp::Get(pid))),
        Route::ProcStream => {
            processes::stream_offsets(req).map(|from| Op::Proc(sid, ProcOp::Stream(pid, from)))
        }
        Route::ProcStdin => processes::stdin(req, sid, pid),
        Route::ProcSignal => processes::signal(req, sid, pid),
        Route::ProcResize => processes::resize(req, sid, pid),
        Route::ProcWs => super::terminal::attach(req, sid, pid),
        Route::FsList => files::list(req, sid),
        Route::FsStat => files::stat(req, sid),
        Route::FsMkdir => files::mkdir(req, sid),
        Route::FsMove => files::mv(req, sid),
        Route::FsRemove => files::remove(req, sid),
        Route::FsWatch => files::watch(req, sid),
        Route::Files if method == "DELETE" => files::delete(req, sid),
        Route::Files if method == "PUT" => {
            // Taken over at its head; never here.
            Err(super::error(500, "an upload reached the wrong handler"))
        }
        Route::Files => files::get(req, sid, method == "HEAD"),
        _ => Err(super::error(
            500,
            "a jobs request reached the sandboxes' handler",
        )),
    };
    match r {
        Ok(op) => Asked::Op(op),
        Err(resp) => Asked::Respond(resp),
    }
}

/// Every path of the face as OpenAPI writes it (with the base; `{name}`, not
/// `{name*}`), with its methods.
pub fn paths() -> Vec<(String, String)> {
    crate::router::paths(ROUTES)
        .into_iter()
        .map(|(p, m)| {
            (
                format!("{}{}", super::BASE, p.replace("*}", "}")),
                m.join(", "),
            )
        })
        .collect()
}

//! Request handlers, one module per resource, and the state they read.
//!
//! Handlers run on the reactor thread and never block: they answer at once or hand an
//! execution plan back to the reactor, which runs it on the worker pool.

pub mod agent;
pub mod docs;
pub mod error;
pub mod execute;
pub mod health;
pub mod memory;
pub mod metrics;
pub mod routes;
pub mod runs;
pub mod sessions;
pub mod volumes;

use crate::config::Config;
use crate::http::Params;
use crate::http::Response;
use crate::router::{self, RouteError};
use crate::runtimes::Runtimes;
use std::sync::Arc;

/// State of the backend self-probe run at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeState {
    /// Not finished yet.
    Pending,
    /// A real sandbox ran and printed what it should.
    Passed,
    /// It failed; the reason says how.
    Failed(String),
}

/// Counters exposed on `/healthz`.
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    /// Executions finished since start.
    pub runs_total: u64,
    /// Of which ended by the wall-time cap.
    pub runs_timed_out: u64,
    /// Of which ended by the memory cap.
    pub runs_oom_killed: u64,
    /// Of which cancelled because the client went away.
    pub runs_cancelled: u64,
    /// Of which failed inside isobox.
    pub runs_failed: u64,
}

/// What the handlers read and the reactor updates.
pub struct App {
    /// Configuration.
    pub cfg: Arc<Config>,
    /// Loaded runtimes.
    pub runtimes: Arc<Runtimes>,
    /// The cgroup hierarchy, when one was usable.
    pub cgroups: Option<crate::cgroup::Hierarchy>,
    /// Why cgroups are unusable, when they are.
    pub cgroup_error: Option<String>,
    /// Backend self-probe.
    pub probe: ProbeState,
    /// Execution slots: held by every run and kernel step.
    pub runs: crate::admission::Slots,
    /// Counters.
    pub counters: Counters,
    /// Set once SIGTERM/SIGINT arrived.
    pub shutting_down: bool,
    /// (open fds, RSS bytes, the allocator's heap figures) of this process, refreshed by
    /// the reactor once a second rather than per request (reading /proc per /healthz
    /// dominated its cost).
    pub process_figures: (usize, u64, Option<(u64, u64)>),
    /// Filesystem sessions.
    pub sessions: Arc<crate::workspace::Sessions>,
    /// Filtered egress.
    pub egress: Arc<crate::netfilter::Egress>,
    /// Kernel slots: held by every kernel running, starting, or reserved by a create
    /// in progress.
    pub kernels: crate::admission::KernelSlots,
    /// The warm pool's figures (`None`: no pool), kept current by the reactor.
    pub warm: Option<WarmFigures>,
    /// The WBX face's pool of ready long-lived sandboxes (`None`: none configured).
    pub wbx_warm: Option<WbxWarmFigures>,
    /// What only `/metrics` reads (runs by outcome, latencies, HTTP, bytes).
    pub metrics: crate::metrics::Metrics,
    /// The runtimes' root images (`sandbox::image`), when cold runs may use them.
    pub root_images: Option<std::sync::Arc<crate::sandbox::image::RootImages>>,
}

/// The WBX face's pool of ready sandboxes on `/healthz`.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WbxWarmFigures {
    /// Per template: sandboxes ready and the target.
    pub templates: std::collections::BTreeMap<String, WarmRuntime>,
    /// Creates served by a pooled sandbox.
    pub hits: u64,
    /// Creates of a pooled template with network `full` that found it empty.
    pub misses: u64,
    /// Pooled boots that failed.
    pub failures: u64,
    /// CPU-seconds the pool's boots took, each read from its cgroup once ready.
    pub refill_cpu_seconds: f64,
}

/// Nanoseconds of CPU as seconds for `/healthz` and `/metrics` (to the microsecond).
pub fn cpu_seconds(ns: u64) -> f64 {
    (ns / 1000) as f64 / 1e6
}

/// The warm pool on `/healthz`.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmFigures {
    /// Per pool: sandboxes ready, the size now, its bounds, the runs of the last minute.
    pub runtimes: std::collections::BTreeMap<String, WarmPoolRuntime>,
    /// Runs served by a pooled sandbox.
    pub hits: u64,
    /// Runs of a pooled runtime that found its pool empty (they started cold).
    pub misses: u64,
    /// Sandboxes booted into the pool.
    pub refills: u64,
    /// CPU-seconds those boots took (sentry, gofer and interpreter, from each one's
    /// cgroup once ready): a refill's cost, which a cold run pays too.
    pub refill_cpu_seconds: f64,
    /// Boots that failed.
    pub failures: u64,
    /// Pooled runs answered on the harness's exit report, before the sandbox's
    /// teardown (the others ended the cold way, at `runsc run`'s exit).
    pub exit_reports: u64,
    /// Pooled sandboxes given back when their pool shrank and sat idle for a minute.
    pub shrunk: u64,
    /// CPU-seconds per second the refills may average (over a minute) for pools to
    /// grow past their floors (`ISOBOX_WARM_POOL_CPU`).
    pub refill_cpu_budget: f64,
    /// CPU-seconds the refills took in the last minute.
    pub refill_cpu_last_minute: f64,
    /// Whether pools may grow now (a budget is set and the last minute kept to it).
    pub growth: bool,
}

/// One pool of the warm pool.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct WarmPoolRuntime {
    /// Booted and waiting.
    pub ready: usize,
    /// What it refills to now: the largest burst of the last minute, between `min`
    /// and `max` (`min` while growth is not allowed).
    pub target: usize,
    /// `ISOBOX_WARM_POOL`'s size for the runtime.
    pub min: usize,
    /// `ISOBOX_WARM_POOL_MAX`'s size for the runtime (never below `min`).
    pub max: usize,
    /// Runs this pool could serve that arrived in the last minute (hits and misses).
    pub arrivals: usize,
}

/// One runtime's pool.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct WarmRuntime {
    /// Booted and waiting.
    pub ready: usize,
    /// Configured size.
    pub target: usize,
}

/// What the reactor must do for a request.
pub enum Action {
    /// Send this response.
    Respond(Response),
    /// Run this plan, answering as JSON, as an SSE stream, or at once with its id.
    Execute {
        /// The validated plan.
        plan: Box<crate::sandbox::plan::ExecPlan>,
        /// How its result reaches the client.
        delivery: Delivery,
        /// Who asked (a recorded run is theirs only).
        tenant: String,
    },
    /// Run this plan once per input, answering with every result in input order (as
    /// JSON, or as an SSE stream whose events carry the input's index).
    ExecuteMany {
        /// The validated plan (its stdin and args are the inputs').
        plan: Box<crate::sandbox::plan::ExecPlan>,
        /// Each run's stdin and args, in order.
        inputs: Vec<execute::Input>,
        /// Stream as SSE.
        stream: bool,
        /// Every input in one sandbox, one after another (`"sharedSandbox": true`).
        shared: bool,
    },
    /// Read, follow or cancel a recorded run (`/v1/runs/{id}`).
    Run(runs::RunOp),
    /// Run this on the worker pool and act on its outcome.
    Job(Job),
    /// Hand this work on without blocking (a write for the store's writer): it is given
    /// the way to answer and answers exactly once, from any thread.
    Deferred(Deferred),
    /// Start this agent loop, streaming SSE.
    Agent(Box<agent::AgentStart>),
}

/// How a run's result reaches the client that started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// One JSON body when it ends.
    Json,
    /// SSE as output comes, each event with an id; the run is recorded, so a client
    /// that lost the stream reads the rest at `/v1/runs/{id}/events`.
    Stream,
    /// `202` with the run's id at once; the run is recorded and read later. Leaving
    /// does not cancel it.
    Detach,
}

impl Delivery {
    /// A request's delivery: `detach` in its body wins over `Accept`.
    pub fn of(detach: bool, req: &crate::http::Request) -> Delivery {
        Delivery::of_parts(detach, execute::wants_stream(req))
    }

    /// From `detach` and whether the client asked for SSE.
    pub fn of_parts(detach: bool, stream: bool) -> Delivery {
        match (detach, stream) {
            (true, _) => Delivery::Detach,
            (false, true) => Delivery::Stream,
            (false, false) => Delivery::Json,
        }
    }
}

/// Blocking work of a request (LMDB, mounts, files), run on the pool.
pub type Job = Box<dyn FnOnce() -> Outcome + Send + 'static>;

/// Work that answers on its own: called on the reactor thread with a [`Reply`], it
/// must not block; it passes the reply on to whoever finishes the work.
pub type Deferred = Box<dyn FnOnce(Reply) + Send + 'static>;

/// How [`Deferred`] work answers: once, from any thread.
pub type Reply = Box<dyn FnOnce(Outcome) + Send + 'static>;

/// What a [`Job`] found.
pub enum Outcome {
    /// Send this response.
    Respond(Response),
    /// Send this response and close (a request body may be left unread).
    RespondClose(Response),
    /// Run this plan (a session step).
    Execute {
        /// The validated plan, holding its session lease.
        plan: Box<crate::sandbox::plan::ExecPlan>,
        /// How its result reaches the client.
        delivery: Delivery,
        /// Who asked (a recorded run is theirs only).
        tenant: String,
    },
    /// Send this head, then the bytes a transfer thread writes into `rx`.
    Download(Box<Download>),
    /// A kernel session's record and workspace exist (start its kernel), or the
    /// refusal (the kernel slot, checked at the request, is taken only once the kernel
    /// starts).
    KernelCreated(Result<Box<KernelCreated>, Response>),
    /// Run code in the session's kernel.
    KernelStep {
        /// Session id.
        session: String,
        /// The step's plan (its limits: wall time and output).
        plan: Box<crate::sandbox::plan::ExecPlan>,
        /// The code.
        code: String,
        /// JSON, SSE (recorded) or detached (recorded, `202` at once).
        delivery: Delivery,
        /// Who asked (a recorded step's record is theirs).
        tenant: String,
    },
    /// End the session's kernel, then delete the session.
    KernelDelete {
        /// Session id.
        session: String,
    },
}

/// A kernel session ready for its kernel.
pub struct KernelCreated {
    /// Session id.
    pub session: String,
    /// The 201 to send once the kernel is ready.
    pub response: Response,
    /// Runtime, the kernel's limits, the network asked for, and the workspace lease
    /// (held for the kernel's life).
    pub plan: Box<crate::sandbox::plan::ExecPlan>,
    /// The session's TTL: a kernel idle that long ends sooner than the kernel idle limit.
    pub ttl_sec: u64,
    /// The tenant that made it (its kernel counts against the tenant's share).
    pub tenant: String,
}

/// A response body streamed from a transfer thread.
pub struct Download {
    /// Status and headers (its body is ignored).
    pub head: Response,
    /// `Some(n)`: exactly n bytes, with `Content-Length`; `None`: chunked.
    pub length: Option<u64>,
    /// Read end of the pipe (`None` for HEAD).
    pub rx: Option<std::os::fd::OwnedFd>,
    /// `sessions::XFER_*`, set by the thread before it closes the pipe.
    pub status: Arc<std::sync::atomic::AtomicU8>,
}

/// An upload ready to receive its body.
pub struct UploadTarget {
    /// The temporary file and its final name.
    pub upload: crate::workspace::fs::Upload,
    /// Keeps the workspace mounted.
    pub lease: crate::workspace::Lease,
    /// The normalised path, for the response.
    pub path: String,
    /// Free bytes in the workspace when the upload began.
    pub avail_bytes: u64,
}

/// The head-time job of an upload.
pub type UploadJob = Box<dyn FnOnce() -> Result<Box<UploadTarget>, Response> + Send + 'static>;

/// Decodes a JSON body that must be an object (`http::json`): the 400 `invalid_json`
/// says in words what is wrong and names the field by its path (`limits.wallTimeMs
/// must be a number of milliseconds, not a string`), using `hints` for fields whose
/// type alone says too little.
///
/// # Errors
/// The 400 response.
pub fn decode_json<T: serde::de::DeserializeOwned>(
    body: &[u8],
    hints: crate::http::json::Hints,
) -> Result<T, Response> {
    crate::http::json::decode(body, hints, false)
        .map_err(|why| Response::error(400, "invalid_json", Some(&why)))
}

/// The row of [`routes::ROUTES`] for a head, and the path's parameters (resolved
/// before the body is read: the row names the body cap and the admission class).
///
/// # Errors
/// The 404 or 405 to answer, as a [`RouteError`] (see [`error::route_error`]).
pub fn resolve(method: &str, path: &str) -> Result<(&'static routes::Spec, Params), RouteError> {
    router::resolve(routes::ROUTES, method, path).map(|(row, params)| (&row.route, params))
}

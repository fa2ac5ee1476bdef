//! The server-side agent (`POST /v1/agent`): the chat's tool-calling loop, run against
//! the operator's OpenAI-compatible upstream so the browser never holds the model key.
//!
//! It stays one file: one loop's life on its thread (the conversation, the tool calls,
//! and the bounds on what it holds and sends back).
//!
//! Each loop runs on a thread of its own from [`AgentThreads`], started with the daemon
//! (the upstream call blocks for as long as the model writes, so the worker pool, for
//! short jobs, is no place for it; and the reactor's seccomp filter rightly forbids it
//! to start threads). The thread talks to the reactor only by
//! messages: SSE frames for the client, and tool steps, which the reactor runs in the
//! session's kernel exactly like `POST /v1/sessions/{id}/exec` and answers on a
//! channel. The thread owns no sandbox, fd or file: when the client leaves it is told
//! to stop and simply ends.

pub mod search;
pub mod upstream;

use crate::api::execute::ExecuteResponse;
use crate::config::AiConfig;
use crate::http::{sse, Response};
use crate::sandbox::plan::ExecPlan;
use crossbeam_channel::{Receiver, Sender};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A tool result fed back to the model (stdout and stderr together) is cut to this.
pub const RESULT_CUT_BYTES: usize = 16 * 1024;
/// The conversation a loop holds (and sends the model) at most.
pub const MAX_CONVERSATION_BYTES: usize = 16 << 20;
/// What `run_shell` gets on top of its own wall time before the kernel's step is
/// killed from outside (the in-place kill at the wall comes first).
const SHELL_BACKSTOP: Duration = Duration::from_secs(10);

pub use crate::api::agent::{AgentStart, SessionRef};

/// What a loop's thread asks of the reactor.
pub enum AgentMsg {
    /// Send these SSE frames.
    Event(Vec<u8>),
    /// Run `code` in the session's kernel and answer on `reply`.
    Step {
        /// Session id.
        session: String,
        /// The step's plan (its wall time and output caps).
        plan: Box<ExecPlan>,
        /// The code.
        code: String,
        /// Where the result goes.
        reply: Sender<StepReply>,
    },
    /// The loop ended: send this last frame and end the stream.
    End(Vec<u8>),
}

/// How a tool step ended.
pub enum StepReply {
    /// It ran; `kernel_alive` is false when the kernel ended with it (wall time, OOM).
    Ran {
        /// The result object, as `/exec` would answer it.
        result: Box<ExecuteResponse>,
        /// The kernel can take another step.
        kernel_alive: bool,
    },
    /// It was refused (the kernel is dead, busy, or the daemon is full or stopping).
    Refused(Response),
}

/// What every loop shares: settings and the daemon's state it reads.
pub struct Shared {
    /// Settings.
    pub cfg: AiConfig,
    /// Sessions (the loop checks its session's token).
    pub sessions: Arc<crate::workspace::Sessions>,
    /// Runtimes (a step's plan).
    pub runtimes: Arc<crate::runtimes::Runtimes>,
    /// Loops running now.
    pub running: AtomicUsize,
}

/// The way back to the reactor: a loop's messages, each delivered to the reactor
/// (which is woken) for the loop's connection. Made by the daemon; `false` once the
/// reactor is gone.
pub type Deliver = Box<dyn Fn(AgentMsg) -> bool + Send>;

/// What a loop's thread sends its messages through.
pub struct Outbox {
    /// Delivers one message.
    pub deliver: Deliver,
    /// The client's connection (key, serial), for the log.
    pub conn: (usize, u64),
}

impl Outbox {
    fn send(&self, msg: AgentMsg) -> bool {
        (self.deliver)(msg)
    }

    fn event(&self, name: &str, data: &Value) {
        let mut frame = Vec::new();
        sse::write_event(&mut frame, name, &data.to_string());
        self.send(AgentMsg::Event(frame));
    }

    fn end(&self, finish: &str, iterations: u32) {
        let mut frame = Vec::new();
        sse::write_event(
            &mut frame,
            "done",
            &json!({"finishReason": finish, "iterations": iterations}).to_string(),
        );
        self.send(AgentMsg::End(frame));
    }

    /// An `error` event, then `done` with `finishReason: error`.
    fn fail(&self, code: &str, message: &str, iterations: u32) {
        self.send(AgentMsg::End(fail_frames(code, message, iterations)));
    }
}

/// An `error` event and the `done` (`finishReason: error`) that follows it.
pub fn fail_frames(code: &str, message: &str, iterations: u32) -> Vec<u8> {
    let mut frame = Vec::new();
    sse::write_event(
        &mut frame,
        "error",
        &json!({"code": code, "message": message}).to_string(),
    );
    sse::write_event(
        &mut frame,
        "done",
        &json!({"finishReason": "error", "iterations": iterations}).to_string(),
    );
    frame
}

/// The tools offered to the model.
pub fn tools(search: bool) -> Value {
    let mut t = vec![
        json!({"type": "function", "function": {
            "name": "run_python",
            "description": "Run Python code in a persistent kernel: variables, imports and \
                definitions survive across calls. The working directory is /workspace. \
                Print what you want to see; a trailing expression is echoed.",
            "parameters": {"type": "object",
                "properties": {"code": {"type": "string", "description": "Python source"}},
                "required": ["code"]}}}),
        json!({"type": "function", "function": {
            "name": "run_shell",
            "description": "Run a bash command in the same sandbox and working directory \
                (curl, wget, jq, git, ripgrep, unzip, file are installed). Returns its \
                output and bash's exit status.",
            "parameters": {"type": "object",
                "properties": {"command": {"type": "string", "description": "bash command"}},
                "required": ["command"]}}}),
    ];
    if search {
        t.push(json!({"type": "function", "function": {
            "name": "web_search",
            "description": "Search the web (DuckDuckGo). Returns titles, URLs and snippets; \
                fetch a page with run_shell or run_python if the sandbox has network.",
            "parameters": {"type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
                "required": ["query"]}}}));
    }
    Value::Array(t)
}

fn system_prompt(search: bool) -> String {
    let mut s = String::from(
        "You are a coding assistant with a sandboxed Linux machine. Use run_python for \
         Python (a persistent kernel: state survives between calls) and run_shell for \
         shell commands; both run in /workspace of the same sandbox. Tool results are \
         cut to 16 KiB: print summaries, not whole datasets.",
    );
    if search {
        s.push_str(" Use web_search to find pages on the web.");
    }
    s
}

/// A tool's result.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ToolResult {
    /// Standard output (cut).
    pub stdout: String,
    /// Standard error (cut).
    pub stderr: String,
    /// Exit status.
    pub exit_code: i32,
    /// Something was cut (here, or by the run's own output cap or artifact caps).
    pub truncated: bool,
    /// Wall time.
    pub duration_ms: u64,
}

impl ToolResult {
    fn error(msg: String, started: Instant) -> ToolResult {
        let mut r = ToolResult {
            stderr: msg,
            exit_code: 1,
            duration_ms: millis(started.elapsed()),
            ..Default::default()
        };
        r.cut();
        r
    }

    /// Cuts stdout and stderr to [`RESULT_CUT_BYTES`] together: each keeps its head;
    /// stderr (where errors are) is given at least half when both are long.
    pub fn cut(&mut self) {
        let (o, e) = (self.stdout.len(), self.stderr.len());
        if o + e <= RESULT_CUT_BYTES {
            return;
        }
        let half = RESULT_CUT_BYTES / 2;
        let keep_err = e.min(half.max(RESULT_CUT_BYTES.saturating_sub(o)));
        let keep_out = o.min(RESULT_CUT_BYTES - keep_err);
        truncate_utf8(&mut self.stdout, keep_out);
        truncate_utf8(&mut self.stderr, keep_err);
        self.truncated = true;
    }

    fn for_model(&self) -> String {
        json!({
            "exitCode": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "truncated": self.truncated,
        })
        .to_string()
    }
}

fn truncate_utf8(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.truncate(at);
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Decrements the running count however the thread ends.
struct RunningGuard(Arc<Shared>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One loop: its request, where it answers, and its stop flag.
pub struct Loop {
    /// Shared settings and state.
    pub shared: Arc<Shared>,
    /// The checked request.
    pub start: Box<AgentStart>,
    /// The way back.
    pub out: Outbox,
    /// Set by the reactor when the client left (or the daemon is stopping).
    pub cancel: Arc<AtomicBool>,
    /// Model calls made so far, read by the reactor when it ends the stream itself.
    pub iterations: Arc<AtomicU32>,
}

/// How a tool call went, for the loop.
enum Ran {
    /// A result for the model.
    Result(ToolResult, Vec<crate::sandbox::plan::Artifact>),
    /// The kernel is gone (after this result, if any): the loop stops.
    KernelDead(Option<ToolResult>, String),
    /// The step could not run for another reason: the loop stops with this error.
    Stop(String, String),
}

/// The threads that run loops: one per loop that may run at once, idle until given one.
pub struct AgentThreads {
    tx: Sender<Loop>,
}

impl AgentThreads {
    /// Starts `n` threads.
    ///
    /// # Errors
    /// When a thread cannot be started.
    pub fn start(n: usize) -> std::io::Result<AgentThreads> {
        let (tx, rx) = crossbeam_channel::bounded::<Loop>(n);
        for i in 0..n {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("isobox-agent-{i}"))
                .spawn(move || {
                    for lp in rx.iter() {
                        let _guard = RunningGuard(Arc::clone(&lp.shared));
                        lp.run();
                    }
                })?;
        }
        Ok(AgentThreads { tx })
    }

    /// Hands a loop (already counted in `running`) to a free thread; gives it back when
    /// none is free.
    pub fn submit(&self, lp: Loop) -> Result<(), Box<Loop>> {
        self.tx.try_send(lp).map_err(|e| Box::new(e.into_inner()))
    }
}

impl Loop {
    fn run(self) {
        let cfg = &self.shared.cfg;
        let Some(sref) = self.start.session.clone() else {
            self.out.fail(
                "session_required",
                "create a kernel session (POST /v1/sessions with \"type\":\"kernel\") and \
                 pass its id and token as \"session\"",
                0,
            );
            return;
        };
        let rec =
            match self
                .shared
                .sessions
                .authorize(&self.start.tenant, &sref.id, Some(&sref.token))
            {
                Ok(r) => r,
                Err(e) => {
                    let resp = crate::api::error::session_error(&e);
                    self.out
                        .fail("session_invalid", &response_message(&resp), 0);
                    return;
                }
            };
        if rec.kind != "kernel" {
            self.out.fail(
                "session_invalid",
                "the agent needs a kernel session (created with \"type\":\"kernel\"); this \
                 is a filesystem session",
                0,
            );
            return;
        }
        let Some(base) = cfg.base.as_deref() else {
            self.out
                .fail("agent_disabled", "the server-side agent is off", 0);
            return;
        };
        let up = upstream::Upstream::new(
            base,
            cfg.key.as_ref().map(crate::secret::Secret::expose),
            &cfg.model,
            Duration::from_secs(cfg.timeout_sec),
        );
        let tools = tools(cfg.search);
        let mut messages = vec![json!({"role": "system", "content": system_prompt(cfg.search)})];
        messages.extend(self.start.messages.iter().cloned());
        // Grows by at most a completion (bounded) and its results per iteration.
        let mut size: usize = messages.iter().map(|m| m.to_string().len()).sum();
        let mut iterations = 0;
        while iterations < self.start.max_iters {
            if self.cancelled() {
                return;
            }
            iterations += 1;
            self.iterations.store(iterations, Ordering::Relaxed);
            let mut on_text = |t: &str| self.out.event("token", &json!({ "text": t }));
            let completion = match up.complete(&messages, &tools, &self.cancel, &mut on_text) {
                Ok(c) => c,
                Err(e) => {
                    if !self.cancelled() {
                        crate::warn_limited!("agent conn={} upstream: {}", self.out.conn.0, e.0);
                        self.out.fail("upstream_error", &e.0, iterations);
                    }
                    return;
                }
            };
            if completion.tool_calls.is_empty() {
                self.out.end("stop", iterations);
                return;
            }
            let calls: Vec<Value> = completion
                .tool_calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
            let assistant = json!({
                "role": "assistant",
                "content": if completion.text.is_empty() { Value::Null } else { Value::String(completion.text.clone()) },
                "tool_calls": calls,
            });
            size += assistant.to_string().len();
            messages.push(assistant);
            for call in &completion.tool_calls {
                if self.cancelled() {
                    return;
                }
                self.out.event(
                    "tool_call",
                    &json!({"id": call.id, "name": call.name, "arguments": call.arguments}),
                );
                let (result, artifacts) = match self.tool(&sref.id, call) {
                    Ran::Result(r, a) => (r, a),
                    Ran::KernelDead(r, why) => {
                        if let Some(r) = r {
                            self.emit_result(&call.id, &r, &[]);
                        }
                        self.out.fail("kernel_dead", &why, iterations);
                        return;
                    }
                    Ran::Stop(code, msg) => {
                        self.out.fail(&code, &msg, iterations);
                        return;
                    }
                };
                self.emit_result(&call.id, &result, &artifacts);
                let tool = json!({
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": result.for_model(),
                });
                size += tool.to_string().len();
                messages.push(tool);
            }
            if size > MAX_CONVERSATION_BYTES && iterations < self.start.max_iters {
                self.out.fail(
                    "upstream_error",
                    "the conversation exceeds 16 MiB; start a new one",
                    iterations,
                );
                return;
            }
        }
        self.out.end("max_iterations", iterations);
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    fn emit_result(&self, id: &str, r: &ToolResult, artifacts: &[crate::sandbox::plan::Artifact]) {
        let mut v = json!({
            "id": id,
            "stdout": r.stdout,
            "stderr": r.stderr,
            "exitCode": r.exit_code,
            "truncated": r.truncated,
            "durationMs": r.duration_ms,
        });
        if !artifacts.is_empty() {
            v["artifacts"] = serde_json::to_value(artifacts).unwrap_or_default();
        }
        self.out.event("tool_result", &v);
    }

    /// Runs one tool call.
    fn tool(&self, session: &str, call: &upstream::ToolCall) -> Ran {
        let started = Instant::now();
        let cfg = &self.shared.cfg;
        let args: Value = match serde_json::from_str(&call.arguments) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return Ran::Result(
                    ToolResult::error(
                        format!("{}: the arguments are not a JSON object", call.name),
                        started,
                    ),
                    Vec::new(),
                )
            }
        };
        let text = |k: &str| args[k].as_str().map(str::to_string);
        match call.name.as_str() {
            "run_python" => match text("code") {
                Some(code) => self.step(session, code, Duration::from_secs(cfg.python_wall_sec)),
                None => Ran::Result(
                    ToolResult::error(
                        "run_python: \"code\" (a string) is required".into(),
                        started,
                    ),
                    Vec::new(),
                ),
            },
            "run_shell" => match text("command") {
                Some(cmd) => {
                    let code = format!(
                        "__import__(\"_isobox\").shell({}, {})",
                        Value::String(cmd),
                        cfg.shell_wall_sec
                    );
                    let wall = Duration::from_secs(cfg.shell_wall_sec) + SHELL_BACKSTOP;
                    self.step(session, code, wall)
                }
                None => Ran::Result(
                    ToolResult::error(
                        "run_shell: \"command\" (a string) is required".into(),
                        started,
                    ),
                    Vec::new(),
                ),
            },
            "web_search" if cfg.search => {
                let Some(q) = text("query").filter(|q| !q.trim().is_empty()) else {
                    return Ran::Result(
                        ToolResult::error(
                            "web_search: \"query\" (a string) is required".into(),
                            started,
                        ),
                        Vec::new(),
                    );
                };
                let max = args["max_results"]
                    .as_u64()
                    .and_then(|m| usize::try_from(m).ok())
                    .unwrap_or(search::DEFAULT_RESULTS);
                let mut r = match search::search(&cfg.search_url, &q, max) {
                    Ok(hits) => ToolResult {
                        stdout: search::format_hits(&hits),
                        ..Default::default()
                    },
                    Err(e) => ToolResult {
                        stderr: format!("web_search: {e}"),
                        exit_code: 1,
                        ..Default::default()
                    },
                };
                r.duration_ms = millis(started.elapsed());
                r.cut();
                Ran::Result(r, Vec::new())
            }
            other => Ran::Result(
                ToolResult::error(format!("{other}: no such tool"), started),
                Vec::new(),
            ),
        }
    }

    /// Runs `code` as a step of the session's kernel, through the reactor.
    fn step(&self, session: &str, code: String, wall: Duration) -> Ran {
        let (rec_runtime, rec_version) = match self.shared.sessions.authorize(
            &self.start.tenant,
            session,
            self.start.session.as_ref().map(|s| s.token.as_str()),
        ) {
            Ok(r) => (r.runtime, r.version),
            Err(e) => {
                // Deleted or expired since the loop began.
                let resp = crate::api::error::session_error(&e);
                return Ran::Stop("session_invalid".into(), response_message(&resp));
            }
        };
        // As for `/exec`: no step while the disk is below its reserve.
        if let Err(e) = self.shared.sessions.check_reserve() {
            let resp = crate::api::error::session_error(&e);
            let v: Value = serde_json::from_slice(&resp.body).unwrap_or_default();
            let code = v["error"].as_str().unwrap_or("storage_full").to_string();
            return Ran::Stop(code, response_message(&resp));
        }
        let (mut plan, _) = match crate::api::execute::decode_for_session(
            &self.shared.runtimes,
            br#"{"code":""}"#,
            &rec_runtime,
            rec_version.as_deref(),
            true,
            // A kernel's network is its own, fixed at create (`kernel_steps`).
            true,
        ) {
            Ok(p) => p,
            Err(resp) => return Ran::Stop("internal".into(), response_message(&resp)),
        };
        plan.files.clear();
        plan.limits.wall_time_ms = millis(wall);
        let (tx, rx): (Sender<StepReply>, Receiver<StepReply>) = crossbeam_channel::bounded(1);
        if !self.out.send(AgentMsg::Step {
            session: session.to_string(),
            plan: Box::new(plan),
            code,
            reply: tx,
        }) {
            return Ran::Stop("shutting_down".into(), "isoboxd is shutting down".into());
        }
        // The reactor always answers (or drops the sender when it stops); a client that
        // left stops the wait (the step itself ends in the kernel, bounded by its wall).
        let reply = loop {
            match rx.recv_timeout(Duration::from_millis(250)) {
                Ok(r) => break r,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) if !self.cancelled() => {}
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    return Ran::Stop("cancelled".into(), "the client left".into())
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Ran::Stop("shutting_down".into(), "isoboxd is shutting down".into())
                }
            }
        };
        match reply {
            StepReply::Ran {
                result,
                kernel_alive,
            } => {
                let run = &result.run;
                let mut r = ToolResult {
                    stdout: run.stdout.clone(),
                    stderr: run.stderr.clone(),
                    exit_code: run.exit_code,
                    truncated: run.truncated,
                    duration_ms: run.duration_ms,
                };
                r.cut();
                if kernel_alive {
                    Ran::Result(r, result.artifacts)
                } else {
                    let why = if run.timed_out {
                        format!(
                            "the step ran past its {} s wall time, which ends the kernel",
                            wall.as_secs()
                        )
                    } else if run.oom_killed {
                        "the kernel ran out of memory".to_string()
                    } else {
                        "the kernel ended during the step".to_string()
                    };
                    Ran::KernelDead(Some(r), why)
                }
            }
            StepReply::Refused(resp) => {
                let v: Value = serde_json::from_slice(&resp.body).unwrap_or_default();
                let code = v["error"].as_str().unwrap_or("error").to_string();
                let msg = response_message(&resp);
                if code == "kernel_dead" {
                    Ran::KernelDead(None, msg)
                } else {
                    Ran::Stop(code, msg)
                }
            }
        }
    }
}

/// `detail` (or else `error`) of an error response.
fn response_message(resp: &Response) -> String {
    let v: Value = serde_json::from_slice(&resp.body).unwrap_or_default();
    v["detail"]
        .as_str()
        .or_else(|| v["error"].as_str())
        .unwrap_or("refused")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_cut_at_below_and_above_the_bound() {
        let mut r = ToolResult {
            stdout: "a".repeat(RESULT_CUT_BYTES - 10),
            stderr: "b".repeat(10),
            ..Default::default()
        };
        r.cut();
        assert!(!r.truncated, "exactly 16 KiB is kept whole");
        assert_eq!(r.stdout.len() + r.stderr.len(), RESULT_CUT_BYTES);
        r.stderr.push('c');
        r.cut();
        assert!(r.truncated);
        assert_eq!(r.stdout.len() + r.stderr.len(), RESULT_CUT_BYTES);
        assert_eq!(r.stderr.len(), 11, "a short stderr is kept whole");
        // Both long: stderr keeps half.
        let mut r = ToolResult {
            stdout: "o".repeat(100_000),
            stderr: "e".repeat(100_000),
            ..Default::default()
        };
        r.cut();
        assert_eq!((r.stdout.len(), r.stderr.len()), (8192, 8192));
        // Only stderr long: it takes what stdout leaves.
        let mut r = ToolResult {
            stdout: "o".repeat(100),
            stderr: "e".repeat(100_000),
            ..Default::default()
        };
        r.cut();
        assert_eq!(
            (r.stdout.len(), r.stderr.len()),
            (100, RESULT_CUT_BYTES - 100)
        );
        // Never inside a character.
        let mut r = ToolResult {
            stdout: "é".repeat(RESULT_CUT_BYTES),
            ..Default::default()
        };
        r.cut();
        assert!(r.stdout.len() <= RESULT_CUT_BYTES && r.stdout.len() >= RESULT_CUT_BYTES - 1);
    }

    #[test]
    fn test_tools_offered() {
        let names = |v: Value| -> Vec<String> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            names(tools(true)),
            ["run_python", "run_shell", "web_search"]
        );
        assert_eq!(names(tools(false)), ["run_python", "run_shell"]);
    }
}

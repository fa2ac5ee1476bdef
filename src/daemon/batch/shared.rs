//! Many inputs in one shared sandbox (`"sharedSandbox": true`): one gVisor boot for
//! the whole request instead of one per input. The sandbox is a long-lived one's
//! (`boxes.rs`: `isobox-init` as its pid 1, found by nobody else) with the request's
//! limits and the program's files at `/workspace`; a compiled runtime's build runs in
//! it once, then every input, one after another, as a fresh process of the sandbox's
//! user with its own stdin, args, pipes and time limit.
//!
//! One after another, so each input has the whole memory cap and CPU limit, and a
//! memory kill names one input: the host OOM killer takes the whole sandbox (its
//! sentry is the largest process of its cgroup), that input's result says
//! `oomKilled`, and the rest go on in a fresh sandbox (built again). Each input's
//! command starts with `kill -9 -1` as the user: whatever an earlier input left
//! running (a daemon that left its process group) is gone before it starts. Files an
//! input writes to `/tmp` or `/workspace` stay for the next: the inputs share a
//! filesystem, which is what the request opted into.
//!
//! Admission: the request holds one execution slot from its admission until it is
//! answered (or its client leaves), its sandboxes one after another. Reactor thread
//! only.

use super::Batch;
use crate::api::execute::NETWORK_WARNING;
use crate::daemon::boxes::{BoxOwner, InternalBoot, State, BOXES};
use crate::daemon::runs::MAX_DRAIN_PAST_CAP_BYTES;
use crate::daemon::sink::Stream;
use crate::daemon::Daemon;
use crate::http::sse::take_utf8;
use crate::http::Response;
use crate::metrics::RunOutcome;
use crate::reactor::Addr;
use crate::sandbox::plan::{CompileResult, RunResult};
use crate::sandbox::wire::{self, Call, Exited, Kind, Reply};
use crate::wbx::sandboxes::{Create, Net};
use std::time::{Duration, Instant};

/// Timers of the sandbox's component: the running step's deadline (the generation
/// names the step).
pub(in crate::daemon) const STEP_DEADLINE: u16 = 6;
/// How long init may take to answer a spawn, or to report the exit of a process it
/// was told to kill.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A shared-sandbox batch's progress.
#[derive(Default)]
pub(in crate::daemon) struct Shared {
    /// The sandbox in use (key, serial); `None` between sandboxes and at the end.
    sbx: Option<(usize, u64)>,
    /// The build in the current sandbox, once it ended (compiled runtimes).
    compile: Option<CompileResult>,
    /// The command running in it.
    step: Option<Step>,
    /// Sandboxes booted.
    pub(super) sandboxes: u32,
    /// Builds run.
    pub(super) builds: u32,
    /// The current sandbox has the network it asked for (filtered egress applied).
    network: bool,
}

/// One command in the shared sandbox: the build, or an input.
struct Step {
    /// The input (`None`: the build).
    input: Option<usize>,
    /// The spawn call.
    call: u32,
    /// Its pid in the sandbox, once init answered.
    pid: Option<u32>,
    /// What to write to its stdin once it runs.
    stdin: Option<Vec<u8>>,
    out: [Out; 2],
    /// The spawn (until init answers), then the process's start.
    started: Instant,
    spawned: Instant,
    timed_out: bool,
    /// Its deadline's timer generation.
    gen: u64,
    /// Its output is held by init (the SSE client is behind).
    held: bool,
    /// Killed for flooding its output far past the cap.
    flooded: bool,
    /// Killed because the daemon stopped (the shutdown grace ended).
    cancelled: bool,
}

/// When an input's step began and ended, for `/metrics`.
struct Took {
    /// The spawn was asked for.
    spawned: Instant,
    /// Its process started (init answered the spawn).
    began: Option<Instant>,
    /// Killed because the daemon stopped.
    cancelled: bool,
}

/// One output stream of a step, as kept.
#[derive(Default)]
struct Out {
    kept: Vec<u8>,
    truncated: bool,
    past_cap: u64,
    /// An incomplete UTF-8 character held back from the stream.
    pending: Vec<u8>,
}

/// `argv` as one `/bin/sh` command line, every word single-quoted.
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|w| format!("'{}'", w.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

impl Daemon {
    fn shared_batch(&mut self, bk: usize, bs: u64) -> Option<&mut Batch> {
        self.batches
            .get_mut(bk)
            .filter(|b| b.serial == bs && b.shared.is_some())
    }

    fn shared(&mut self, bk: usize, bs: u64) -> Option<&mut Shared> {
        self.shared_batch(bk, bs)?.shared.as_deref_mut()
    }

    /// Starts a shared-sandbox batch (admitted, its slot taken): boots its sandbox.
    pub(super) fn shared_start(&mut self, bk: usize, bs: u64) {
        self.app.runs.take();
        self.shared_boot(bk, bs);
    }

    /// Boots a sandbox for the inputs not yet run.
    fn shared_boot(&mut self, bk: usize, bs: u64) {
        if self.app.shutting_down {
            if let Some(resp) = self.admit_refusal() {
                self.shared_fail_rest(bk, bs, &resp);
            }
            return;
        }
        if self.box_init_missing() {
            let resp = Response::error(503, "unavailable", Some(super::super::boxes::INIT_MISSING));
            self.shared_fail_rest(bk, bs, &resp);
            return;
        }
        let compile_ms = self.cfg.compile_timeout_ms;
        let Some(b) = self.shared_batch(bk, bs) else {
            return;
        };
        let plan = &b.plan;
        let network = match (&plan.allowlist, plan.network_requested) {
            (_, false) => Net::None,
            (Some(a), true) => Net::Allowlist(std::sync::Arc::clone(a)),
            (None, true) => Net::Full,
        };
        // Its lifetime covers the build and every input left at its time limit (each
        // with the time a kill may take): the batch ends it long before, unless its
        // init stops answering.
        let left = (b.inputs.len() - b.next) as u64;
        let per_input = plan.limits.wall_time_ms + 2 * CALL_TIMEOUT.as_millis() as u64;
        let lifetime_ms = compile_ms + left * per_input + 60_000;
        let create = Create {
            template: plan.runtime.desc.language.clone(),
            runtime: plan.runtime.clone(),
            timeout_s: lifetime_ms.div_ceil(1000),
            env: Vec::new(),
            metadata: Default::default(),
            network,
            compute_class: None,
        };
        let boot = InternalBoot {
            owner: BoxOwner::Batch(bk, bs),
            limits: plan.limits,
            files: plan.files.clone(),
            ro_binds: Vec::new(),
        };
        match self.box_boot(None, String::new(), create, Some(boot)) {
            Ok(key) => {
                let serial = self.boxes.boxes[key].serial;
                if let Some(sh) = self.shared(bk, bs) {
                    sh.sbx = Some((key, serial));
                    sh.compile = None;
                    sh.sandboxes += 1;
                }
            }
            Err(_) => {
                let resp = Response::error(503, "overloaded", Some("worker queue full"))
                    .with_header("Retry-After", "1");
                self.shared_fail_rest(bk, bs, &resp);
            }
        }
    }

    /// The next input not yet run, taken (`None`: none is left, or the batch is over).
    fn shared_take_next(&mut self, bk: usize, bs: u64) -> Option<usize> {
        let b = self.shared_batch(bk, bs)?;
        let index = b.next;
        (index < b.inputs.len()).then(|| {
            b.next += 1;
            index
        })
    }

    /// Every input not yet run gets `resp` as its entry.
    fn shared_fail_rest(&mut self, bk: usize, bs: u64, resp: &Response) {
        while let Some(index) = self.shared_take_next(bk, bs) {
            self.batch_refused(bk, bs, index, resp, false);
        }
    }

    /// The batch's sandbox `key` said hello: the build, or the first input.
    pub(in crate::daemon) fn shared_ready(&mut self, bk: usize, bs: u64, key: usize) {
        let Some(b) = self.shared_batch(bk, bs) else {
            return;
        };
        let current = b.shared.as_ref().and_then(|s| s.sbx).map(|s| s.0);
        if current != Some(key) {
            return;
        }
        let network = self
            .boxes
            .boxes
            .get(key)
            .is_some_and(|s| s.net_addr().is_some());
        let Some(b) = self.shared_batch(bk, bs) else {
            return;
        };
        if let Some(sh) = b.shared.as_deref_mut() {
            sh.network = network;
        }
        if b.plan.runtime.desc.compiled {
            self.shared_spawn(bk, bs, None);
        } else {
            self.shared_next(bk, bs);
        }
    }

    /// Starts the next input, or answers when none is left.
    fn shared_next(&mut self, bk: usize, bs: u64) {
        let Some(b) = self.shared_batch(bk, bs) else {
            return;
        };
        if b.next >= b.inputs.len() {
            self.batch_check_done(bk, bs);
            return;
        }
        if b.shared.as_ref().is_none_or(|s| s.sbx.is_none()) {
            // Its sandbox is gone: the next one starts the input once it is ready.
            return;
        }
        if let Some(index) = self.shared_take_next(bk, bs) {
            self.shared_spawn(bk, bs, Some(index));
        }
    }

    /// Asks the sandbox's init to start the build (`None`) or input `input`.
    fn shared_spawn(&mut self, bk: usize, bs: u64, input: Option<usize>) {
        let Some(b) = self.shared_batch(bk, bs) else {
            return;
        };
        let Some((key, _)) = b.shared.as_ref().and_then(|s| s.sbx) else {
            return;
        };
        let desc = &b.plan.runtime.desc;
        let (cmd, stdin) = match input {
            None => {
                let argv = crate::sandbox::bundle::substitute(
                    &desc.build,
                    &desc.source_file,
                    &b.plan.entry,
                );
                (format!("exec {}", shell_words(&argv)), None)
            }
            Some(i) => {
                let mut argv =
                    crate::sandbox::bundle::substitute(&desc.run, &desc.source_file, &b.plan.entry);
                argv.extend(b.inputs[i].args.iter().cloned());
                // As the user, `kill -1` reaches every process of the user but this
                // shell (and init, which is root): what earlier inputs left.
                let cmd = format!("kill -9 -1 2>/dev/null; exec {}", shell_words(&argv));
                (cmd, Some(b.inputs[i].stdin.clone()))
            }
        };
        let call = Call::Spawn {
            cmd,
            cwd: Some("/workspace".to_string()),
            // As a one-shot run has it.
            env: vec![("HOME".to_string(), "/tmp".to_string())],
            stdin: stdin.is_some(),
            pty: None,
            background: false,
        };
        let Some(sbx) = self
            .boxes
            .boxes
            .get_mut(key)
            .filter(|s| s.state == State::Running)
        else {
            // Ending already: this input has no sandbox (the end gives the rest theirs).
            if let Some(i) = input {
                let resp = Response::error(
                    500,
                    "sandbox_failed",
                    Some("the shared sandbox ended before this input started"),
                );
                self.batch_refused(bk, bs, i, &resp, false);
            }
            return;
        };
        let call_id = sbx.take_call_id();
        if wire::encode_json(&mut sbx.wbuf, Kind::Call, call_id, &call).is_err() {
            let resp = Response::error(
                400,
                "invalid_json",
                Some("inputs[].args: the command line is too large for a shared sandbox (at most 1 MiB)"),
            );
            match input {
                Some(i) => {
                    self.batch_refused(bk, bs, i, &resp, false);
                    self.shared_next(bk, bs);
                }
                None => self.shared_fail_rest(bk, bs, &resp),
            }
            return;
        }
        let now = Instant::now();
        let gen = self
            .reactor
            .arm_new(now + CALL_TIMEOUT, Addr::new(BOXES, key, STEP_DEADLINE));
        if let Some(sh) = self.shared(bk, bs) {
            sh.step = Some(Step {
                input,
                call: call_id,
                pid: None,
                stdin,
                out: Default::default(),
                started: now,
                spawned: now,
                timed_out: false,
                gen,
                held: false,
                flooded: false,
                cancelled: false,
            });
        }
        self.box_flush(key);
    }

    /// A frame of the batch's sandbox's init: the step's spawn answer, output or exit.
    pub(in crate::daemon) fn shared_frame(
        &mut self,
        bk: usize,
        bs: u64,
        key: usize,
        f: &wire::Frame,
    ) {
        let Some(sh) = self.shared(bk, bs) else {
            return;
        };
        if sh.sbx.map(|s| s.0) != Some(key) {
            return;
        }
        let Some(step) = sh.step.as_mut() else {
            return;
        };
        match f.kind {
            Kind::Reply if f.channel == step.call && step.pid.is_none() => {
                self.shared_spawned(bk, bs, key, &f.payload)
            }
            Kind::Output if Some(f.channel) == step.pid => {
                self.shared_output(bk, bs, key, &f.payload)
            }
            Kind::Exit if Some(f.channel) == step.pid => {
                let exited: Exited = serde_json::from_slice(&f.payload).unwrap_or(Exited {
                    code: 128 + libc::SIGKILL,
                    signal: Some(libc::SIGKILL),
                });
                self.shared_step_ended(bk, bs, exited.code, false);
            }
            // Answers to signals, holds and releases: nothing waits on them.
            _ => {}
        }
    }

    /// init answered the step's spawn.
    fn shared_spawned(&mut self, bk: usize, bs: u64, key: usize, payload: &[u8]) {
        let pid = match serde_json::from_slice::<Reply>(payload) {
            Ok(Reply::Ok(v)) => v["pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
            Ok(Reply::Error(e)) => {
                // The shell could not be started (out of processes, say).
                self.shared_step_failed(bk, bs, &format!("could not start: {e}"));
                return;
            }
            Ok(Reply::Refused { .. }) | Err(_) => None,
        };
        let Some(pid) = pid else {
            self.box_end(key, "its init broke the protocol");
            return;
        };
        if self.box_init_missing() {
            let resp = Response::error(503, "unavailable", Some(super::super::boxes::INIT_MISSING));
            self.shared_fail_rest(bk, bs, &resp);
            return;
        }
        let compile_ms = self.cfg.compile_timeout_ms;
        let Some(b) = self.shared_batch(bk, bs) else {
            return;
        };
        let wall_ms = b.plan.limits.wall_time_ms;
        let Some(step) = b.shared.as_deref_mut().and_then(|s| s.step.as_mut()) else {
            return;
        };
        let now = Instant::now();
        step.pid = Some(pid);
        step.started = now;
        let limit = if step.input.is_some() {
            wall_ms
        } else {
            compile_ms
        };
        let stdin = step.stdin.take();
        let gen = self.reactor.arm_new(
            now + Duration::from_millis(limit),
            Addr::new(BOXES, key, STEP_DEADLINE),
        );
        if let Some(step) = self.shared(bk, bs).and_then(|s| s.step.as_mut()) {
            step.gen = gen;
        }
        if let (Some(input), Some(sbx)) = (stdin, self.boxes.boxes.get_mut(key)) {
            for part in input.chunks(wire::MAX_DATA_BYTES) {
                // A part is at most MAX_DATA_BYTES: always within a frame.
                let _ = wire::encode(&mut sbx.wbuf, Kind::Input, pid, part);
            }
            let _ = wire::encode(&mut sbx.wbuf, Kind::Input, pid, &[]);
        }
        self.box_flush(key);
    }

    /// The step's output: kept up to the request's `outputBytes` per stream (a flood
    /// far past it kills the step, as it kills a run), streamed with the input's index.
    fn shared_output(&mut self, bk: usize, bs: u64, key: usize, payload: &[u8]) {
        let Some((stream, _, data)) = wire::parse_output(payload) else {
            return;
        };
        let idx = usize::from(stream == wire::Stream::Stderr);
        let Some(b) = self.shared_batch(bk, bs) else {
            return;
        };
        let (cap, live) = (b.plan.limits.output_bytes as usize, b.stream);
        let Some(step) = b.shared.as_deref_mut().and_then(|s| s.step.as_mut()) else {
            return;
        };
        let out = &mut step.out[idx];
        let keep = cap.saturating_sub(out.kept.len()).min(data.len());
        out.kept.extend_from_slice(&data[..keep]);
        if keep < data.len() {
            out.truncated = true;
            out.past_cap += (data.len() - keep) as u64;
        }
        let flood = out.past_cap > MAX_DRAIN_PAST_CAP_BYTES && !step.flooded;
        step.flooded |= flood;
        let (input, pid) = (step.input, step.pid.unwrap_or(0));
        let mut text = String::new();
        if let (Some(_), true, true) = (input, live, keep > 0) {
            out.pending.extend_from_slice(&data[..keep]);
            text = take_utf8(&mut out.pending, false);
        }
        if let (Some(index), false) = (input, text.is_empty()) {
            let behind = self.batch_output(bk, bs, index, Stream::of(idx), &text);
            let hold = behind
                && self
                    .shared(bk, bs)
                    .and_then(|s| s.step.as_mut())
                    .is_some_and(|s| !std::mem::replace(&mut s.held, true));
            if hold {
                self.box_call(key, &Call::Hold { pid });
            }
        }
        if flood {
            let held = self
                .shared(bk, bs)
                .and_then(|s| s.step.as_mut())
                .is_some_and(|s| std::mem::replace(&mut s.held, false));
            self.box_kill(key, pid, held);
        }
    }

    /// The SSE client took most of what was queued: a held step's output flows again.
    pub(super) fn shared_release(&mut self, bk: usize, bs: u64) {
        let Some(sh) = self.shared(bk, bs) else {
            return;
        };
        let Some((key, _)) = sh.sbx else {
            return;
        };
        let Some(step) = sh.step.as_mut().filter(|s| s.held) else {
            return;
        };
        step.held = false;
        if let Some(pid) = step.pid {
            self.box_call(key, &Call::Release { pid });
        }
    }

    /// The step's deadline: no answer to the spawn (init is wedged: the sandbox ends),
    /// the time limit (its process group is killed), or no exit after that kill.
    pub(in crate::daemon) fn shared_deadline(&mut self, key: usize, gen: u64) {
        let Some(BoxOwner::Batch(bk, bs)) = self.boxes.boxes.get(key).and_then(|s| s.owner) else {
            return;
        };
        let Some(step) = self
            .shared(bk, bs)
            .filter(|s| s.sbx.map(|x| x.0) == Some(key))
            .and_then(|s| s.step.as_mut())
            .filter(|s| s.gen == gen)
        else {
            return;
        };
        let Some(pid) = step.pid.filter(|_| !step.timed_out) else {
            self.box_end(key, "its init did not answer");
            return;
        };
        step.timed_out = true;
        let held = std::mem::replace(&mut step.held, false);
        let gen = self.reactor.arm_new(
            Instant::now() + CALL_TIMEOUT,
            Addr::new(BOXES, key, STEP_DEADLINE),
        );
        if let Some(step) = self.shared(bk, bs).and_then(|s| s.step.as_mut()) {
            step.gen = gen;
        }
        self.box_kill(key, pid, held);
    }

    /// The step ended with `code` (`oom`: its sandbox was OOM-killed under it).
    fn shared_step_ended(&mut self, bk: usize, bs: u64, code: i32, oom: bool) {
        let Some(b) = self.shared_batch(bk, bs) else {
            return;
        };
        let (live, limits) = (b.stream, b.plan.limits);
        let lang = b.plan.runtime.desc.language.clone();
        let Some(sh) = b.shared.as_deref_mut() else {
            return;
        };
        let Some(mut step) = sh.step.take() else {
            return;
        };
        let (compile, network) = (sh.compile.clone(), sh.network);
        let duration = step.pid.map_or(Duration::ZERO, |_| step.started.elapsed());
        let duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let exit_code = if step.timed_out || oom {
            128 + libc::SIGKILL
        } else {
            code
        };
        let oom = oom && !step.timed_out;
        let truncated = step.out.iter().any(|o| o.truncated);
        let [o, e] = std::mem::take(&mut step.out);
        let Some(index) = step.input else {
            // The build.
            let c = CompileResult {
                stdout: String::from_utf8_lossy(&o.kept).into_owned(),
                stderr: String::from_utf8_lossy(&e.kept).into_owned(),
                exit_code,
                timed_out: step.timed_out,
                oom_killed: oom,
                duration_ms,
            };
            let failed = c.exit_code != 0;
            if let Some(sh) = self.shared(bk, bs) {
                sh.builds += 1;
                sh.compile = Some(c.clone());
            }
            if !failed {
                self.shared_next(bk, bs);
                return;
            }
            // The program never runs: every input gets the build's outcome, as each
            // would in a sandbox of its own.
            while let Some(index) = self.shared_take_next(bk, bs) {
                let run = RunResult {
                    stdout: String::new(),
                    stderr: c.stderr.clone(),
                    exit_code: c.exit_code,
                    timed_out: false,
                    oom_killed: false,
                    truncated,
                    duration_ms: 0,
                    network,
                    limits,
                };
                let took = Took {
                    spawned: step.spawned,
                    began: None,
                    cancelled: false,
                };
                self.shared_input_ended(bk, bs, index, &lang, run, Some(c.clone()), &took);
            }
            return;
        };
        if live {
            for (idx, out) in [(0, &o), (1, &e)] {
                let mut pending = out.pending.clone();
                let text = take_utf8(&mut pending, true);
                if !text.is_empty() {
                    self.batch_output(bk, bs, index, Stream::of(idx), &text);
                }
            }
        }
        let run = RunResult {
            stdout: String::from_utf8_lossy(&o.kept).into_owned(),
            stderr: String::from_utf8_lossy(&e.kept).into_owned(),
            exit_code,
            timed_out: step.timed_out,
            oom_killed: oom,
            truncated,
            duration_ms,
            network,
            limits,
        };
        let took = Took {
            spawned: step.spawned,
            began: step.pid.map(|_| step.started),
            cancelled: step.cancelled,
        };
        self.shared_input_ended(bk, bs, index, &lang, run, compile, &took);
        if !oom {
            self.shared_next(bk, bs);
        }
    }

    /// Input `index` has its result: counted as a run, and its entry recorded.
    #[allow(clippy::too_many_arguments)]
    fn shared_input_ended(
        &mut self,
        bk: usize,
        bs: u64,
        index: usize,
        lang: &str,
        run: RunResult,
        compile: Option<CompileResult>,
        took: &Took,
    ) {
        let c = &mut self.app.counters;
        c.runs_total += 1;
        c.runs_timed_out += u64::from(run.timed_out);
        c.runs_oom_killed += u64::from(run.oom_killed);
        c.runs_cancelled += u64::from(took.cancelled);
        let outcome = RunOutcome::of(
            took.cancelled,
            run.timed_out,
            run.oom_killed,
            run.truncated,
            run.exit_code,
        );
        // Its start: from the spawn asked for to its process running.
        let start = took
            .began
            .map(|b| b.saturating_duration_since(took.spawned));
        self.app
            .metrics
            .run(lang, outcome, took.spawned.elapsed(), start);
        log::info!(
            "batch={bs} input={index} exit={} timed_out={} oom={} truncated={} ms={} (shared sandbox)",
            run.exit_code,
            run.timed_out,
            run.oom_killed,
            run.truncated,
            run.duration_ms
        );
        let requested = self
            .shared_batch(bk, bs)
            .is_some_and(|b| b.plan.network_requested);
        let warning = (requested && !run.network).then_some(NETWORK_WARNING);
        let mut item = serde_json::to_value(&run).unwrap_or_default();
        if let Some(c) = &compile {
            item["compile"] = serde_json::to_value(c).unwrap_or_default();
        }
        self.batch_ended(bk, bs, index, item, warning, false);
    }

    /// The step could not run at all: an input gets `detail` as its error and the
    /// next goes on; a build's failure leaves every input without a result.
    fn shared_step_failed(&mut self, bk: usize, bs: u64, detail: &str) {
        let Some(step) = self.shared(bk, bs).and_then(|s| s.step.take()) else {
            return;
        };
        let resp = Response::error(500, "sandbox_failed", Some(detail));
        match step.input {
            Some(index) => {
                self.batch_refused(bk, bs, index, &resp, false);
                self.shared_next(bk, bs);
            }
            None => self.shared_fail_rest(bk, bs, &resp),
        }
    }

    /// The batch's sandbox (`key`, `serial`) is gone: its processes, cgroup and memory.
    /// Unless the batch is over, the step it ran ends (an OOM kill is that input's
    /// result), and the inputs left go on in a fresh sandbox.
    pub(in crate::daemon) fn shared_box_gone(
        &mut self,
        (bk, bs): (usize, u64),
        sbx: (usize, u64),
        ready: bool,
        oom: bool,
        why: &str,
    ) {
        let Some(sh) = self.shared(bk, bs) else {
            // The batch answered (or its client left) and ended it.
            return;
        };
        if sh.sbx != Some(sbx) {
            return;
        }
        sh.sbx = None;
        let step = sh.step.as_ref().map(|s| s.input);
        match step {
            Some(input) if oom => {
                self.shared_step_ended(bk, bs, 128 + libc::SIGKILL, true);
                if input.is_none() {
                    // The build was OOM-killed: every input has the build's outcome.
                    return;
                }
            }
            // The shutdown grace is over: the input was killed, as a run is then.
            Some(Some(_)) if self.app.shutting_down => {
                if let Some(step) = self.shared(bk, bs).and_then(|s| s.step.as_mut()) {
                    step.cancelled = true;
                }
                self.shared_step_ended(bk, bs, 128 + libc::SIGKILL, false);
            }
            Some(_) => self.shared_step_failed(
                bk,
                bs,
                &format!("the shared sandbox ended while this ran: {why}"),
            ),
            None => {
                let resp = if ready {
                    Response::error(
                        500,
                        "sandbox_failed",
                        Some(&format!("the shared sandbox ended: {why}")),
                    )
                } else {
                    Response::error(
                        500,
                        "sandbox_start_failed",
                        Some(&format!("the shared sandbox did not start: {why}")),
                    )
                };
                self.shared_fail_rest(bk, bs, &resp);
            }
        }
        // Inputs left (after an OOM kill or a sandbox lost mid-input): a fresh sandbox.
        if self
            .shared_batch(bk, bs)
            .is_some_and(|b| b.next < b.inputs.len())
        {
            self.shared_boot(bk, bs);
        }
    }

    /// The batch is over (answered, or its client left): its slot is free and its
    /// sandbox ends (killed now, removed on the pool), as a one-shot run's slot is
    /// free once its sandbox is killed.
    pub(super) fn shared_finish(&mut self, sh: &Shared, lang: &str) {
        if let Some(step) = sh.step.as_ref().filter(|s| s.input.is_some()) {
            // Its client left while an input ran: that input is a cancelled run.
            self.app.counters.runs_total += 1;
            self.app.counters.runs_cancelled += 1;
            let spent = step.spawned.elapsed();
            self.app
                .metrics
                .run(lang, RunOutcome::Cancelled, spent, None);
        }
        self.app.runs.give_back();
        if let Some((key, serial)) = sh.sbx {
            if self
                .boxes
                .boxes
                .get(key)
                .is_some_and(|s| s.serial == serial)
            {
                self.box_end(key, "its many-input request is over");
            }
        }
    }
}

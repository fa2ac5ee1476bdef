//! A run on the event loop: its pipes and pidfd, wall-time deadline, output capture,
//! SSE forwarding with backpressure, cancellation, and the final result.
//!
//! Reactor thread only; everything blocking (spawn, kill, cleanup) is a pool job whose
//! continuation comes back to the loop.

use super::sink::{HttpSink, Sink};
use super::Daemon;
use crate::api::Delivery;
use crate::cgroup::RunCgroup;
use crate::http::Response;
use crate::reactor::{Addr, Component, ComponentId, Done, Readiness};
use crate::sandbox::build::{self, FrameParser};
use crate::sandbox::plan::{Artifact, CompileResult, ExecPlan};
use crate::sandbox::SandboxError;
use crate::sandbox::Spawned;
use mio::unix::pipe;
use mio::unix::SourceFd;
use mio::{Interest, Token};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Child;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The runs component (key: the run).
pub(crate) const RUNS: ComponentId = ComponentId(3);
/// A run's stdout pipe.
pub(crate) const STDOUT: u16 = 0;
/// A run's stderr pipe.
pub(crate) const STDERR: u16 = 1;
/// A run's stdin pipe.
pub(crate) const STDIN: u16 = 2;
/// A run's pidfd (of `runsc run`).
pub(crate) const PID: u16 = 3;
/// A claimed pooled sandbox's exit channel.
pub(crate) const CTL: u16 = 4;
/// A cold run's start signal: the FIFO its poststart hook writes (`sandbox::start`).
pub(crate) const STARTED: u16 = 5;
/// Timers: the run's deadline (wall time, or the drain grace after exit).
pub(crate) const DEADLINE: u16 = 0;
/// Timers: an SSE keep-alive comment (the generation is the run's serial).
pub(crate) const KEEPALIVE: u16 = 1;

/// Runs on the loop.
pub(crate) struct Runs;

impl Component<Daemon> for Runs {
    fn name(&self) -> &'static str {
        "runs"
    }

    fn ready(&self, d: &mut Daemon, rk: usize, what: u16, _: Readiness) {
        match what {
            STDOUT => d.run_pipe_event(rk, false),
            STDERR => d.run_pipe_event(rk, true),
            STDIN => d.run_stdin_event(rk),
            PID => d.run_exited(rk),
            CTL => d.run_ctl_event(rk),
            STARTED => d.run_start_signal_event(rk),
            _ => {}
        }
    }

    fn timer(&self, d: &mut Daemon, rk: usize, what: u16, gen: u64) {
        match what {
            DEADLINE => d.run_timer(rk, gen),
            KEEPALIVE => d.run_keepalive(rk, gen),
            _ => {}
        }
    }
}

/// A recorded run's id and its record's sink.
type Recorded = (String, Rc<super::records::RecordSink>);

/// The `202` of a detached run: its id and where to read it.
pub(super) fn detached_response(id: &str) -> Response {
    let url = format!("/v1/runs/{id}");
    Response::json(
        202,
        &serde_json::json!({
            "id": id,
            "status": "running",
            "url": url,
            "eventsUrl": format!("{url}/events"),
        }),
    )
    .with_header("Location", url)
}

/// Extra time allowed for gVisor to boot before the program's own wall time counts (the
/// deadline for the start frame is this + the wall time). A boot takes 0.2–0.4 s on an
/// idle host; 1 s failed good runs as `sandbox_start_failed` on a busy one (a 2-hour
/// soak beside a build, 2026-12-06), so it only has to catch a runsc that hangs.
pub const BOOT_GRACE: Duration = Duration::from_secs(5);
/// After `runsc run` exits, how long the pipes get to reach EOF.
pub const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// A stream that keeps writing this much past its cap gets its sandbox killed.
pub const MAX_DRAIN_PAST_CAP_BYTES: u64 = 16 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Starting,
    Running,
    Cleaning,
}

/// Captured output of one stream.
#[derive(Default)]
pub struct Capture {
    pub(super) pipe: Option<(pipe::Receiver, Token)>,
    pub(super) kept: Vec<u8>,
    pub(super) cap: usize,
    pub(super) truncated: bool,
    pub(super) drained_past_cap: u64,
    pub(super) eof: bool,
    /// Bytes of an incomplete UTF-8 character held back from the stream.
    pub(super) pending_utf8: Vec<u8>,
}

/// The compile stage of a compiled runtime, while and after it runs.
pub(super) struct CompileState {
    pub(super) parser: FrameParser,
    pub(super) done: bool,
    pub(super) result: Option<CompileResult>,
}

/// A run's reactor-side state.
pub struct Run {
    /// Whether the sandbox has said it started (cold runs: `start.rs`).
    pub(super) gate: crate::sandbox::start::StartGate,
    pub(super) compile: Option<CompileState>,
    /// When the program itself started (after a build, when the frame arrived).
    pub(super) program_started: Option<Instant>,
    /// When the run was admitted (its slot taken): where `/metrics` latencies start.
    pub(super) admitted: Instant,
    pub(super) serial: u64,
    pub(super) id: String,
    /// Where its output and result go; `None` once its consumer left (cancelled).
    pub(super) sink: Option<Rc<dyn Sink>>,
    pub(super) plan: Box<ExecPlan>,
    pub(super) state: State,
    pub(super) out: [Capture; 2],
    pub(super) stdin: Option<(pipe::Sender, Token)>,
    pub(super) stdin_pos: usize,
    pub(super) pid: Option<(OwnedFd, Token)>,
    pub(super) child: Option<Child>,
    pub(super) cgroup: Option<RunCgroup>,
    pub(super) dir: Option<PathBuf>,
    /// The run's network namespace and link, when it got filtered egress.
    pub(super) net: Option<crate::netfilter::NetLease>,
    pub(super) started: Option<Instant>,
    pub(super) exited_at: Option<Instant>,
    pub(super) timed_out: bool,
    pub(super) cancelled: bool,
    pub(super) killing: bool,
    pub(super) paused: bool,
    pub(super) timer_gen: u64,
    /// Last time an SSE event went to the client (keep-alives fill only silences).
    pub(super) last_event: Instant,
    /// A kernel session's step: the kernel (key, serial) whose pipes it borrows.
    pub(super) kernel: Option<(usize, u64)>,
    /// A kernel step's network (the kernel's, fixed at create).
    pub(super) kernel_network: bool,
    /// A kernel step's rich outputs.
    pub(super) artifacts: Vec<Artifact>,
    /// Artifacts were dropped (over the count or size cap).
    pub(super) artifacts_truncated: bool,
    /// A claimed pooled sandbox's exit channel, and what it has said so far.
    pub(super) exit_ctl: Option<(mio::net::UnixStream, Token)>,
    pub(super) exit_buf: Vec<u8>,
    /// A cold run's start signal, until it comes: the hook's FIFO (`sandbox::start`).
    pub(super) start_signal: Option<(std::fs::File, Token)>,
    /// The harness reported the program's exit status: the pipes hold all its output,
    /// and the result need not wait for the sandbox's teardown.
    pub(super) early_exit: Option<i32>,
}

impl Daemon {
    /// Whether a run (or a kernel step) may start now; answers 503 or 429 when not.
    pub(super) fn run_admit(&mut self, ck: usize) -> bool {
        match self.admit_refusal() {
            Some(resp) => {
                self.respond(ck, resp);
                false
            }
            None => true,
        }
    }

    /// The 503 or 429 a run (or a kernel step) gets now, if any.
    pub(super) fn admit_refusal(&mut self) -> Option<Response> {
        self.app.runs.refusal(self.app.shutting_down)
    }

    /// Starts a run for connection `ck`, which gets its result as `delivery` says: a
    /// streamed or detached run is recorded (`records`) under `tenant`.
    pub(crate) fn start_run(
        &mut self,
        ck: usize,
        plan: Box<ExecPlan>,
        delivery: Delivery,
        tenant: &str,
    ) {
        if !self.run_admit(ck) {
            return;
        }
        let Some(conn_serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        let lang = &plan.runtime.desc.language;
        let Some((sink, record)) = self.delivery_sink(ck, conn_serial, delivery, tenant, lang)
        else {
            return;
        };
        if self.launch_run(plan, sink).is_none() {
            if let Some((_, rec)) = &record {
                self.record_discard(rec);
            }
            self.respond(
                ck,
                Response::error(503, "overloaded", Some("worker queue full"))
                    .with_header("Retry-After", "1"),
            );
            return;
        }
        if let (Delivery::Detach, Some((id, _))) = (delivery, record) {
            self.respond(ck, detached_response(&id));
        }
    }

    /// Where the result of connection `ck`'s run or kernel step goes, as `delivery`
    /// says: a streamed or detached one is recorded (`records`) under `tenant`, and its
    /// record (id and sink) comes back too. `None` when the system's random source
    /// failed (answered `503`: a record's id must be unguessable).
    pub(super) fn delivery_sink(
        &mut self,
        ck: usize,
        serial: u64,
        delivery: Delivery,
        tenant: &str,
        lang: &str,
    ) -> Option<(Rc<dyn Sink>, Option<Recorded>)> {
        if delivery == Delivery::Json {
            let sink = HttpSink {
                conn: ck,
                serial,
                stream: false,
            };
            return Some((Rc::new(sink), None));
        }
        let detached = delivery == Delivery::Detach;
        let client = (!detached).then_some((ck, serial));
        let Some((id, sink)) = self.record_open(tenant, lang, detached, client) else {
            self.respond(
                ck,
                Response::error(
                    503,
                    "overloaded",
                    Some("the system's random source failed; retry"),
                )
                .with_header("Retry-After", "1"),
            );
            return None;
        };
        let sink = Rc::new(sink);
        Some((Rc::clone(&sink) as Rc<dyn Sink>, Some((id, sink))))
    }

    /// Starts `plan` with `sink` taking its output and end: takes a slot (the caller
    /// checked one is free) and hands the sandbox's start to the pool. `None` when the
    /// worker queue is full (nothing was started, no slot taken).
    pub(crate) fn launch_run(&mut self, plan: Box<ExecPlan>, sink: Rc<dyn Sink>) -> Option<usize> {
        self.run_serial += 1;
        let serial = self.run_serial;
        let id = self.container_id("r", serial);
        let cap = usize::try_from(plan.limits.output_bytes).unwrap_or(usize::MAX);
        let compiled = plan.runtime.desc.compiled;
        let run = Run {
            gate: crate::sandbox::start::StartGate::default(),
            compile: compiled.then(|| CompileState {
                parser: FrameParser::default(),
                done: false,
                result: None,
            }),
            program_started: None,
            admitted: Instant::now(),
            serial,
            id: id.clone(),
            sink: Some(sink),
            plan,
            state: State::Starting,
            out: [
                Capture {
                    cap,
                    ..Default::default()
                },
                Capture {
                    cap,
                    ..Default::default()
                },
            ],
            stdin: None,
            stdin_pos: 0,
            pid: None,
            child: None,
            cgroup: None,
            dir: None,
            net: None,
            started: None,
            exited_at: None,
            timed_out: false,
            cancelled: false,
            killing: false,
            paused: false,
            timer_gen: 0,
            last_event: Instant::now(),
            kernel: None,
            kernel_network: false,
            artifacts: Vec::new(),
            artifacts_truncated: false,
            exit_ctl: None,
            exit_buf: Vec::new(),
            start_signal: None,
            early_exit: None,
        };
        let mut plan_for_job = run.plan.clone();
        // A cold interpreted run's start is heard (the compiled runtimes' build script
        // writes the frame itself).
        plan_for_job.signal_start = !plan_for_job.runtime.desc.compiled;
        let rk = self.runs.insert(run);
        let backend = Arc::clone(&self.backend);
        let desc = &plan_for_job.runtime.desc;
        let mut argv =
            crate::sandbox::bundle::substitute(&desc.run, &desc.source_file, &plan_for_job.entry);
        argv.extend(plan_for_job.args.iter().cloned());
        if desc.compiled {
            let build_argv = crate::sandbox::bundle::substitute(
                &desc.build,
                &desc.source_file,
                &plan_for_job.entry,
            );
            argv = build::wrap(
                build_argv,
                argv,
                self.cfg.compile_timeout_ms,
                plan_for_job.limits.output_bytes,
            );
        }
        let env = desc.env.clone();
        // A pooled sandbox, when one may serve this run; the cold start otherwise (and
        // when the claim fails).
        let handoff: crate::sandbox::warm::Handoff =
            Arc::new(std::sync::Mutex::new(self.warm_take(&plan_for_job)));
        let job_handoff = Arc::clone(&handoff);
        let job = Box::new(move || -> Done<Daemon> {
            let warm = job_handoff.lock().unwrap_or_else(|p| p.into_inner()).take();
            // An interpreter's harness gets the program's argv from its source file on;
            // a compiled runtime's gets the whole build wrapper, which it execs.
            let at = if plan_for_job.runtime.desc.compiled {
                0
            } else {
                plan_for_job.runtime.desc.run.len().saturating_sub(1)
            };
            let claimed = warm.and_then(|w| {
                match crate::sandbox::warm::claim(&*backend, *w, &plan_for_job, &argv[at..]) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        crate::warn_limited!("run={id} op=warm-claim err={e}; starting cold");
                        None
                    }
                }
            });
            let result = match claimed {
                Some(s) => Ok(Box::new(s)),
                None => backend
                    .run(&id, &plan_for_job, argv, &env, crate::sandbox::Stdin::Pipe)
                    .map(Box::new),
            };
            Box::new(move |d: &mut Daemon| d.run_spawned(rk, serial, result))
        });
        let submitted = self.reactor.submit(job).is_ok();
        if submitted {
            self.warm_fill();
        } else {
            // The job was dropped unrun: a sandbox it was given goes back to the pool.
            let unused = handoff.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(w) = unused {
                let lang = self
                    .runs
                    .get(rk)
                    .map(|r| r.plan.runtime.desc.language.clone())
                    .unwrap_or_default();
                self.warm_put_back(w, &lang);
            }
            self.runs.remove(rk);
            return None;
        }
        self.app.runs.take();
        self.run_attach(rk);
        Some(rk)
    }

    /// The run's sink waits for it (an HTTP client: plain, or with the SSE head sent
    /// at once); a live one gets keep-alives while the run is quiet.
    pub(super) fn run_attach(&mut self, rk: usize) {
        let Some(sink) = self.runs.get(rk).and_then(|r| r.sink.clone()) else {
            return;
        };
        sink.attach(self, rk);
        if sink.live() {
            self.arm_keepalive(rk);
        }
    }

    pub(super) fn run_spawned(
        &mut self,
        rk: usize,
        serial: u64,
        result: Result<Box<Spawned>, SandboxError>,
    ) {
        let Some(run) = self.runs.get(rk).filter(|r| r.serial == serial) else {
            return;
        };
        let _ = run;
        let s = match result {
            Ok(s) => s,
            Err(e) => {
                crate::error_limited!("run={rk} op=spawn err={e}");
                self.app.counters.runs_failed += 1;
                if let Some(run) = self.runs.get(rk) {
                    let (lang, since) = (run.plan.runtime.desc.language.clone(), run.admitted);
                    let outcome = crate::metrics::RunOutcome::Failed;
                    self.app.metrics.run(&lang, outcome, since.elapsed(), None);
                }
                // The detail stays generic: the error names host paths; the log has it.
                self.run_fail(
                    rk,
                    "sandbox_start_failed",
                    "the sandbox could not be started; see the daemon log",
                );
                return;
            }
        };
        let s = *s;
        let mut tokens = Vec::new();
        let stdout = pipe::Receiver::from(s.stdout);
        let stderr = pipe::Receiver::from(s.stderr);
        let t_out = self.reactor.token(Addr::new(RUNS, rk, STDOUT));
        let t_err = self.reactor.token(Addr::new(RUNS, rk, STDERR));
        let t_pid = self.reactor.token(Addr::new(RUNS, rk, PID));
        tokens.extend([t_out, t_err, t_pid]);
        let t_in = self.reactor.token(Addr::new(RUNS, rk, STDIN));
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        let mut reg_ok = true;
        for (i, (mut rx, t)) in [(stdout, t_out), (stderr, t_err)].into_iter().enumerate() {
            reg_ok &= rx.set_nonblocking(true).is_ok()
                && self
                    .reactor
                    .registry()
                    .register(&mut rx, t, Interest::READABLE)
                    .is_ok();
            run.out[i].pipe = Some((rx, t));
        }
        reg_ok &= self
            .reactor
            .registry()
            .register(
                &mut SourceFd(&s.pidfd.as_raw_fd()),
                t_pid,
                Interest::READABLE,
            )
            .is_ok();
        run.pid = Some((s.pidfd, t_pid));
        match s.stdin {
            Some(stdin) if !run.plan.stdin.is_empty() => {
                let mut tx = pipe::Sender::from(stdin);
                reg_ok &= tx.set_nonblocking(true).is_ok()
                    && self
                        .reactor
                        .registry()
                        .register(&mut tx, t_in, Interest::WRITABLE)
                        .is_ok();
                run.stdin = Some((tx, t_in));
            }
            Some(stdin) => {
                // No stdin: EOF at once (a pooled sandbox's stdin is a socket whose
                // reading half stays open for the exit frame, so it is shut, not closed).
                crate::sys::shutdown_write(stdin.as_fd());
                self.reactor.release(t_in);
            }
            None => self.reactor.release(t_in),
        }
        if let Some(ctl) = s.exit_ctl {
            let t_ctl = self.reactor.token(Addr::new(RUNS, rk, CTL));
            let nonblocking = ctl.set_nonblocking(true).is_ok();
            let mut ctl = mio::net::UnixStream::from_std(ctl);
            let ok = nonblocking
                && self
                    .reactor
                    .registry()
                    .register(&mut ctl, t_ctl, Interest::READABLE)
                    .is_ok();
            if ok {
                if let Some(run) = self.runs.get_mut(rk) {
                    run.exit_ctl = Some((ctl, t_ctl));
                }
            } else {
                // Not fatal: the run ends when runsc exits, as a cold one does.
                self.reactor.release(t_ctl);
            }
        }
        if let Some(fd) = s.start_signal {
            let t = self.reactor.token(Addr::new(RUNS, rk, STARTED));
            reg_ok &= self
                .reactor
                .registry()
                .register(&mut SourceFd(&fd.as_raw_fd()), t, Interest::READABLE)
                .is_ok();
            if let Some(run) = self.runs.get_mut(rk) {
                run.gate = crate::sandbox::start::StartGate::hooked();
                run.start_signal = Some((std::fs::File::from(fd), t));
            }
        }
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        // A claimed pooled sandbox keeps its own container id; removal needs it.
        run.id = s.id;
        run.child = Some(s.child);
        run.cgroup = Some(s.cgroup);
        run.dir = Some(s.dir);
        run.net = s.net;
        run.started = Some(s.started);
        run.state = State::Running;
        if s.warm && run.compile.is_none() {
            // The pooled sandbox's harness said `ready` before the claim. (A compiled
            // runtime's harness execs the cold path's build wrapper, which says it.)
            run.gate = crate::sandbox::start::StartGate::open();
            run.program_started = Some(s.started);
        }
        // Until the start signal (cold) or the build frame arrives, this is the deadline
        // for getting there; the program's own wall time is armed when it starts.
        let wall = if run.compile.is_some() {
            Duration::from_millis(self.cfg.compile_timeout_ms) + Duration::from_secs(2)
        } else {
            Duration::from_millis(run.plan.limits.wall_time_ms)
        };
        // A claimed pooled sandbox has booted already: its wall time starts at hand-over.
        let grace = if s.warm { Duration::ZERO } else { BOOT_GRACE };
        self.arm_run(rk, s.started + grace + wall);
        if !reg_ok {
            crate::error_limited!("run={rk} op=register err=could not watch sandbox fds");
            self.run_kill(rk);
        }
        if self.runs.get(rk).is_some_and(|r| r.cancelled) {
            self.run_kill(rk);
        }
    }
}

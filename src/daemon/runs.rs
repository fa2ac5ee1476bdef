//! A run on the event loop: its pipes and pidfd, wall-time deadline, output capture,
//! SSE forwarding with backpressure, cancellation, and the final result.
//!
//! Reactor thread only; everything blocking (spawn, kill, cleanup) is a pool job whose
//! completion comes back as a [`Completion`].

use super::completion::Completion;
use super::conn::{start_sse, Phase};
use super::{Daemon, Source, TimerKey};
use crate::api::execute;
use crate::api::ProbeState;
use crate::cgroup::RunCgroup;
use crate::http::limits::MAX_WRITE_BUFFER_BYTES;
use crate::http::sse::take_utf8;
use crate::http::{sse, Response};
use crate::sandbox::build::{self, Feed, FrameParser};
use crate::sandbox::plan::{Artifact, CompileResult, ExecPlan, RunResult};
use crate::sandbox::runsc::{Cleanup, Spawned};
use crate::sandbox::SandboxError;
use mio::unix::pipe;
use mio::unix::SourceFd;
use mio::{Interest, Token};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Extra wall time allowed for gVisor to boot before the program's own wall time counts.
pub const BOOT_GRACE: Duration = Duration::from_millis(1000);
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
    parser: FrameParser,
    done: bool,
    result: Option<CompileResult>,
}

/// A run's reactor-side state.
pub struct Run {
    /// Whether the sandbox has said it started (cold runs: `start.rs`).
    pub(super) gate: crate::sandbox::start::StartGate,
    pub(super) compile: Option<CompileState>,
    /// When the program itself started (after a build, when the frame arrived).
    pub(super) program_started: Option<Instant>,
    pub(super) serial: u64,
    pub(super) id: String,
    pub(super) conn: Option<(usize, u64)>,
    pub(super) stream: bool,
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
    /// An agent's tool step: its result goes to the loop's thread, not a connection.
    pub(super) agent: Option<crossbeam_channel::Sender<crate::agent::StepReply>>,
    /// A claimed pooled sandbox's exit channel, and what it has said so far.
    pub(super) exit_ctl: Option<(mio::net::UnixStream, Token)>,
    pub(super) exit_buf: Vec<u8>,
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

    pub(crate) fn start_run(&mut self, ck: usize, plan: Box<ExecPlan>, stream: bool) {
        if !self.run_admit(ck) {
            return;
        }
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let conn_ref = (ck, c.serial);
        self.run_serial += 1;
        let serial = self.run_serial;
        let id = format!("{}-{:x}-{serial}", self.cfg.instance, std::process::id());
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
            serial,
            id: id.clone(),
            conn: Some(conn_ref),
            stream,
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
            agent: None,
            exit_ctl: None,
            exit_buf: Vec::new(),
            early_exit: None,
        };
        let plan_for_job = run.plan.clone();
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
        let job = Box::new(move || {
            let warm = job_handoff.lock().unwrap_or_else(|p| p.into_inner()).take();
            // An interpreter's harness gets the program's argv from its source file on;
            // a compiled runtime's gets the whole build wrapper, which it execs.
            let at = if plan_for_job.runtime.desc.compiled {
                0
            } else {
                plan_for_job.runtime.desc.run.len().saturating_sub(1)
            };
            let claimed =
                warm.and_then(
                    |w| match backend.claim_warm(*w, &plan_for_job, &argv[at..]) {
                        Ok(s) => Some(s),
                        Err(e) => {
                            crate::warn_limited!("run={id} op=warm-claim err={e}; starting cold");
                            None
                        }
                    },
                );
            let result = match claimed {
                Some(s) => Ok(Box::new(s)),
                None => {
                    // The build script prints the start frame itself.
                    let argv = if plan_for_job.runtime.desc.compiled {
                        argv
                    } else {
                        crate::sandbox::start::wrap(argv)
                    };
                    backend
                        .spawn(
                            &id,
                            &plan_for_job,
                            argv,
                            &env,
                            crate::sandbox::runsc::Stdin::Pipe,
                        )
                        .map(Box::new)
                }
            };
            Completion::Spawned {
                run: rk,
                serial,
                result,
            }
        });
        let submitted = self.pool.submit(job).is_ok();
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
            self.respond(
                ck,
                Response::error(503, "overloaded", Some("worker queue full"))
                    .with_header("Retry-After", "1"),
            );
            return;
        }
        self.app.runs.take();
        self.run_attach(ck, rk, stream);
    }

    /// The connection waits for run `rk`: plain, or with the SSE head sent at once.
    pub(super) fn run_attach(&mut self, ck: usize, rk: usize, stream: bool) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        if stream {
            c.phase = Phase::Stream { run: rk };
            start_sse(c, self.app.shutting_down);
            self.arm_keepalive(rk);
        } else {
            c.phase = Phase::Busy { run: rk };
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
        let t_out = self.token_for(Source::Stdout(rk));
        let t_err = self.token_for(Source::Stderr(rk));
        let t_pid = self.token_for(Source::Pid(rk));
        tokens.extend([t_out, t_err, t_pid]);
        let t_in = self.token_for(Source::Stdin(rk));
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        let mut reg_ok = true;
        for (i, (mut rx, t)) in [(stdout, t_out), (stderr, t_err)].into_iter().enumerate() {
            reg_ok &= rx.set_nonblocking(true).is_ok()
                && self
                    .poll
                    .registry()
                    .register(&mut rx, t, Interest::READABLE)
                    .is_ok();
            run.out[i].pipe = Some((rx, t));
        }
        reg_ok &= self
            .poll
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
                        .poll
                        .registry()
                        .register(&mut tx, t_in, Interest::WRITABLE)
                        .is_ok();
                run.stdin = Some((tx, t_in));
            }
            Some(stdin) => {
                // No stdin: EOF at once (a pooled sandbox's stdin is a socket whose
                // reading half stays open for the exit frame, so it is shut, not closed).
                crate::sys::shutdown_write(stdin.as_fd());
                self.release_token(t_in);
            }
            None => self.release_token(t_in),
        }
        if let Some(ctl) = s.exit_ctl {
            let t_ctl = self.token_for(Source::RunCtl(rk));
            let nonblocking = ctl.set_nonblocking(true).is_ok();
            let mut ctl = mio::net::UnixStream::from_std(ctl);
            let ok = nonblocking
                && self
                    .poll
                    .registry()
                    .register(&mut ctl, t_ctl, Interest::READABLE)
                    .is_ok();
            if ok {
                if let Some(run) = self.runs.get_mut(rk) {
                    run.exit_ctl = Some((ctl, t_ctl));
                }
            } else {
                // Not fatal: the run ends when runsc exits, as a cold one does.
                self.release_token(t_ctl);
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
        // Until the start frame (cold) or the build frame arrives, this is the deadline
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

    /// Reads a pipe until WouldBlock/EOF (or until paused by backpressure).
    pub(crate) fn run_pipe_event(&mut self, rk: usize, is_err: bool) {
        let idx = usize::from(is_err);
        let mut buf = [0u8; 32 * 1024];
        loop {
            let Some(run) = self.runs.get_mut(rk) else {
                return;
            };
            // Backpressure pauses reading, except stderr before the start frame (a
            // bounded read: the gate keeps at most 4 KiB), which must not stay unseen.
            if run.paused && (idx != 1 || run.gate.began()) {
                return;
            }
            let Some((rx, _)) = run.out[idx].pipe.as_mut() else {
                return;
            };
            match rx.read(&mut buf) {
                Ok(0) => {
                    self.run_pipe_eof(rk, idx);
                    break;
                }
                Ok(n) => self.run_output(rk, idx, &buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // After the harness's exit frame, an empty pipe is a drained one:
                    // the program flushed everything before it sent the frame.
                    if self.runs.get(rk).is_some_and(|r| r.early_exit.is_some()) {
                        self.run_pipe_eof(rk, idx);
                    }
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.run_pipe_eof(rk, idx);
                    break;
                }
            }
        }
        self.run_check_done(rk);
    }

    fn run_pipe_eof(&mut self, rk: usize, idx: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if let Some((mut rx, t)) = run.out[idx].pipe.take() {
            let _ = self.poll.registry().deregister(&mut rx);
            self.release_token(t);
        }
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        run.out[idx].eof = true;
        if run.stream && !run.out[idx].pending_utf8.is_empty() {
            let text = take_utf8(&mut run.out[idx].pending_utf8, true);
            self.run_send_chunk(rk, idx, &text);
        }
    }

    fn run_output(&mut self, rk: usize, idx: usize, data: &[u8]) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if idx == 1 && !run.gate.began() {
            let Some(rest) = run.gate.feed(data) else {
                return;
            };
            if run.compile.is_none() {
                // The program starts now: its wall time counts from here (unless it has
                // already exited and the drain grace runs).
                let now = Instant::now();
                run.program_started = Some(now);
                if run.exited_at.is_none() {
                    let wall = Duration::from_millis(run.plan.limits.wall_time_ms);
                    self.arm_run(rk, now + wall);
                }
            }
            if !rest.is_empty() {
                self.run_output(rk, idx, &rest);
            }
            return;
        }
        if idx == 1 {
            if let Some(cs) = run.compile.as_mut().filter(|c| !c.done) {
                match cs.parser.feed(data, self.cfg.compile_timeout_ms) {
                    Feed::More => return,
                    Feed::Done(result, rest) => {
                        cs.done = true;
                        let built = result.exit_code == 0;
                        cs.result = Some(result);
                        if !built {
                            return; // The script exits with the build's code; no program.
                        }
                        // The program starts now: its own wall time counts from here
                        // (unless it has exited already and the drain grace runs).
                        run.program_started = Some(Instant::now());
                        if run.exited_at.is_none() {
                            let wall = Duration::from_millis(run.plan.limits.wall_time_ms);
                            self.arm_run(rk, Instant::now() + wall);
                        }
                        if !rest.is_empty() {
                            self.run_output(rk, idx, &rest);
                        }
                        return;
                    }
                    Feed::Invalid(bytes) => {
                        cs.done = true;
                        self.run_output(rk, idx, &bytes);
                        return;
                    }
                }
            }
        }
        let cap = &mut run.out[idx];
        let room = cap.cap.saturating_sub(cap.kept.len());
        let keep = room.min(data.len());
        cap.kept.extend_from_slice(&data[..keep]);
        if keep < data.len() {
            cap.truncated = true;
            cap.drained_past_cap += (data.len() - keep) as u64;
        }
        let flood = cap.drained_past_cap > MAX_DRAIN_PAST_CAP_BYTES;
        if run.stream && keep > 0 {
            cap.pending_utf8.extend_from_slice(&data[..keep]);
            let text = take_utf8(&mut cap.pending_utf8, false);
            if !text.is_empty() {
                self.run_send_chunk(rk, idx, &text);
            }
        }
        if flood {
            self.run_kill(rk);
        }
    }

    fn run_send_chunk(&mut self, rk: usize, idx: usize, text: &str) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        run.last_event = Instant::now();
        let event = if idx == 0 { "stdout" } else { "stderr" };
        let data = serde_json::json!({ "chunk": text }).to_string();
        let mut frame = Vec::new();
        sse::write_event(&mut frame, event, &data);
        if let Some((ck, _)) = run.conn {
            self.conn_send_chunked(ck, &frame);
            let over = self
                .conns
                .get(ck)
                .is_some_and(|c| c.pending_write() >= MAX_WRITE_BUFFER_BYTES);
            if over {
                if let Some(run) = self.runs.get_mut(rk) {
                    // Backpressure: stop reading the sandbox; its writes block in the pipe.
                    run.paused = true;
                }
            }
        }
    }

    /// Queues one chunk of a chunked (SSE) response and tries to write it.
    pub(crate) fn conn_send_chunked(&mut self, ck: usize, payload: &[u8]) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let _ = write!(c.wbuf, "{:x}\r\n", payload.len());
        c.wbuf.extend_from_slice(payload);
        c.wbuf.extend_from_slice(b"\r\n");
        self.conn_flush(ck);
    }

    /// Called when a streaming client's buffer drained: read the sandbox again.
    pub(crate) fn run_resume(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if !run.paused {
            return;
        }
        run.paused = false;
        // Edge-triggered: data may be waiting with no new edge coming, so read now.
        self.run_pipe_event(rk, false);
        self.run_pipe_event(rk, true);
    }

    pub(crate) fn run_stdin_event(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        let Some((tx, _)) = run.stdin.as_mut() else {
            return;
        };
        let mut done = false;
        while run.stdin_pos < run.plan.stdin.len() {
            match tx.write(&run.plan.stdin[run.stdin_pos..]) {
                Ok(n) => run.stdin_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    done = true; // The program closed stdin (EPIPE): fine.
                    break;
                }
            }
        }
        if done || run.stdin_pos >= run.plan.stdin.len() {
            if let Some((mut tx, t)) = run.stdin.take() {
                crate::sys::shutdown_write(tx.as_fd());
                let _ = self.poll.registry().deregister(&mut tx);
                self.release_token(t);
            }
        }
    }

    /// Reads a claimed pooled sandbox's exit channel (`warm.rs`).
    pub(crate) fn run_ctl_event(&mut self, rk: usize) {
        let mut buf = [0u8; 128];
        loop {
            let Some(run) = self.runs.get_mut(rk) else {
                return;
            };
            let Some((ctl, _)) = run.exit_ctl.as_mut() else {
                return;
            };
            match ctl.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    run.exit_buf.extend_from_slice(&buf[..n]);
                    match crate::sandbox::warm::exit_frame(&run.exit_buf) {
                        crate::sandbox::warm::ExitFrame::More => continue,
                        crate::sandbox::warm::ExitFrame::Exit(code) => {
                            self.run_close_ctl(rk);
                            self.run_exited_early(rk, code);
                            return;
                        }
                        crate::sandbox::warm::ExitFrame::Invalid => break,
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        // Closed, or not the harness's frame: the run ends when runsc exits.
        self.run_close_ctl(rk);
    }

    fn run_close_ctl(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        run.exit_buf = Vec::new();
        if let Some((mut ctl, t)) = run.exit_ctl.take() {
            let _ = self.poll.registry().deregister(&mut ctl);
            self.release_token(t);
        }
    }

    /// The harness said the program ended with `code`: finish as at runsc's exit, with
    /// an empty pipe counting as a drained one; the sandbox is torn down after the
    /// response.
    fn run_exited_early(&mut self, rk: usize, code: i32) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if run.state != State::Running || run.killing || run.exited_at.is_some() {
            return;
        }
        run.early_exit = Some(code);
        self.warm.exit_reports += 1;
        self.warm_publish();
        self.run_exited(rk);
    }

    pub(crate) fn run_exited(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if run.exited_at.is_some() {
            return;
        }
        run.exited_at = Some(Instant::now());
        if let Some((fd, t)) = run.pid.take() {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&fd.as_raw_fd()));
            self.release_token(t);
        }
        self.arm_run(rk, Instant::now() + DRAIN_GRACE);
        // Output may still sit in the pipes: read it before deciding. When both pipes
        // closed before the exit was seen (the usual order), nothing else would notice
        // that the run is complete, so check here.
        self.run_pipe_event(rk, false);
        self.run_pipe_event(rk, true);
        self.run_check_done(rk);
    }

    fn run_check_done(&mut self, rk: usize) {
        let Some(run) = self.runs.get(rk) else { return };
        if run.state == State::Running && run.exited_at.is_some() && run.out.iter().all(|c| c.eof) {
            self.run_cleanup(rk);
        }
    }

    /// Replaces the run's deadline (wall time, or the drain grace after exit).
    pub(super) fn arm_run(&mut self, rk: usize, at: Instant) {
        let gen = self.next_timer_gen();
        if let Some(run) = self.runs.get_mut(rk) {
            run.timer_gen = gen;
            self.timers.insert(at, TimerKey::Run(rk, gen));
        }
    }

    pub(crate) fn run_timer(&mut self, rk: usize, gen: u64) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if run.timer_gen != gen || run.state != State::Running {
            return;
        }
        if run.exited_at.is_some() {
            // Drain grace over: whatever holds the pipes open is killed with the cgroup.
            self.run_cleanup(rk);
        } else {
            run.timed_out = true;
            log::debug!("run={rk} wall time reached; killing sandbox");
            self.run_kill(rk);
        }
    }

    pub(super) fn run_kill(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if run.killing || run.state != State::Running {
            return;
        }
        if let Some((kk, ks)) = run.kernel {
            // A kernel step is ended by ending its kernel (the whole sandbox).
            let why = if run.timed_out {
                format!(
                    "a step ran past its wall time ({} ms)",
                    run.plan.limits.wall_time_ms
                )
            } else if self.app.shutting_down {
                "the daemon is shutting down".to_string()
            } else {
                "a step wrote far past its output cap".to_string()
            };
            run.killing = true;
            self.kernel_kill(kk, ks, &why);
            return;
        }
        run.killing = true;
        let Some(cg) = run.cgroup.clone() else { return };
        // runsc itself is not in the run's cgroup; a runsc that hangs must die too. Its
        // pid cannot be reused meanwhile: we hold the unreaped Child.
        let runsc_pid = run.child.as_ref().and_then(|c| i32::try_from(c.id()).ok());
        let backend = Arc::clone(&self.backend);
        let job = Box::new(move || {
            backend.kill(&cg, runsc_pid);
            Completion::Done
        });
        self.submit_must(job);
    }

    /// The client went away: detach and kill.
    pub(crate) fn run_cancel(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if run.conn.is_none() {
            return;
        }
        run.conn = None;
        run.cancelled = true;
        if run.kernel.is_some() {
            // The step finishes (its wall time bounds it); the kernel and its state live on.
            // Nobody reads the stream now: keep draining the pipes, or a paused step
            // would block on a full pipe until its wall time ended the kernel.
            run.paused = false;
            self.run_pipe_event(rk, false);
            self.run_pipe_event(rk, true);
            return;
        }
        if run.state == State::Running {
            self.run_kill(rk);
        }
    }

    fn run_cleanup(&mut self, rk: usize) {
        // Final read of anything left, then stop watching.
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if run.state != State::Running {
            return;
        }
        run.paused = false;
        self.run_pipe_event_final(rk);
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        run.state = State::Cleaning;
        let mut release = Vec::new();
        for cap in run.out.iter_mut() {
            if let Some((mut rx, t)) = cap.pipe.take() {
                let _ = self.poll.registry().deregister(&mut rx);
                release.push(t);
            }
        }
        if let Some((mut tx, t)) = run.stdin.take() {
            let _ = self.poll.registry().deregister(&mut tx);
            release.push(t);
        }
        if let Some((mut ctl, t)) = run.exit_ctl.take() {
            let _ = self.poll.registry().deregister(&mut ctl);
            release.push(t);
        }
        if let Some((fd, t)) = run.pid.take() {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&fd.as_raw_fd()));
            release.push(t);
        }
        // After an exit frame, runsc is still tearing the sandbox down: it stays with the
        // run, and is killed and reaped after the response (`run_cleaned`).
        let early = run.early_exit;
        let child = if early.is_none() {
            run.child.take()
        } else {
            None
        };
        let cg = run.cgroup.clone();
        let serial = run.serial;
        for t in release {
            self.release_token(t);
        }
        let Some(cg) = cg else {
            return;
        };
        enum End {
            Reported(i32),
            Reap(Child),
        }
        let end = match (early, child) {
            (Some(code), _) => End::Reported(code),
            (None, Some(child)) => End::Reap(child),
            (None, None) => return,
        };
        let backend = Arc::clone(&self.backend);
        let job = Box::new(move || {
            let cleanup = match end {
                End::Reap(child) => backend.reap(child, &cg),
                End::Reported(exit_code) => {
                    let oom_killed = cg.oom_kills() > 0;
                    // The slot is freed with the response: nothing may run on in it (a
                    // program that forged the frame); the reap comes after.
                    cg.kill_now();
                    crate::sandbox::runsc::Cleanup {
                        oom_killed,
                        exit_code,
                    }
                }
            };
            Completion::Reaped {
                run: rk,
                serial,
                cleanup,
            }
        });
        self.submit_must(job);
    }

    pub(super) fn run_pipe_event_final(&mut self, rk: usize) {
        for idx in [0, 1] {
            self.run_pipe_event(rk, idx == 1);
            if let Some(run) = self.runs.get_mut(rk) {
                if run.stream && !run.out[idx].pending_utf8.is_empty() {
                    let text = take_utf8(&mut run.out[idx].pending_utf8, true);
                    self.run_send_chunk(rk, idx, &text);
                }
            }
        }
    }

    pub(super) fn run_cleaned(&mut self, rk: usize, serial: u64, cleanup: Cleanup) {
        if self.runs.get(rk).is_none_or(|r| r.serial != serial) {
            return;
        }
        let mut run = self.runs.remove(rk);
        // The sandbox is dead: its slot is free and the response goes out now, while the
        // container state, cgroups and bundle are removed on the pool.
        self.app.runs.give_back();
        // A session step's lease (its workspace and volume mounts) lasts until runsc has
        // deleted the container and every gVisor process is gone: only then may the
        // volume be mounted for another session.
        let lease = run.plan.workspace.take();
        if let Some(l) = &lease {
            l.end_step();
        }
        // Likewise the network: its namespace and link go once the container is gone.
        let network = run.net.is_some();
        let net = run.net.take();
        // After an exit frame, runsc has not been reaped: the sandbox's processes were
        // sent SIGKILL before the response (a program that forged the frame must not
        // run on past its slot); here they are killed until none is left, and `runsc
        // run` then tears down as after any exit. Killing runsc itself would leave its
        // state for `runsc delete`, which then takes over a second.
        let child = run.child.take();
        if let (Some(cg), Some(dir)) = (run.cgroup.take(), run.dir.take()) {
            let backend = Arc::clone(&self.backend);
            let id = run.id.clone();
            let job = Box::new(move || {
                if let Some(child) = child {
                    cg.kill_all();
                    backend.reap(child, &cg);
                }
                backend.remove(&id, &cg, &dir);
                drop(lease);
                drop(net);
                Completion::Done
            });
            self.submit_must(job);
        }
        if !run.gate.began() {
            // No start frame: runsc failed (or hung) before the program existed. What
            // it said goes to the log; the client gets no host detail.
            if run.cancelled {
                // The client left (or the daemon is stopping) while it booted.
                self.app.counters.runs_total += 1;
                self.app.counters.runs_cancelled += 1;
                log::debug!("run={} cancelled before it started", run.id);
                return;
            }
            self.app.counters.runs_failed += 1;
            let said = String::from_utf8_lossy(&run.gate.noise()).into_owned();
            let (why, detail) = if run.timed_out {
                (
                    "no start signal by the deadline",
                    "the sandbox did not start in time; see the daemon log",
                )
            } else {
                (
                    "exited without a start signal",
                    "the sandbox could not be started; see the daemon log",
                )
            };
            crate::error_limited!(
                "run={} op=start err={why} exit={} runsc={said:?}",
                run.id,
                cleanup.exit_code
            );
            self.refuse_removed(
                run,
                Response::error(500, "sandbox_start_failed", Some(detail)),
            );
            return;
        }
        let oom = cleanup.oom_killed && !run.timed_out;
        let exit_code = if run.timed_out || oom {
            128 + libc::SIGKILL
        } else {
            cleanup.exit_code
        };
        let mut stderr = String::from_utf8_lossy(&run.out[1].kept).into_owned();
        let compile = run.compile.take().map(|mut cs| match cs.result.take() {
            Some(r) => r,
            // The build never reported: killed by the compile deadline, OOM or a crash.
            None => CompileResult {
                stdout: String::new(),
                stderr: String::from_utf8_lossy(&cs.parser.take_partial()).into_owned(),
                exit_code,
                timed_out: run.timed_out,
                oom_killed: oom,
                duration_ms: run.started.map_or(0, |s| {
                    u64::try_from(s.elapsed().as_millis()).unwrap_or(u64::MAX)
                }),
            },
        });
        let build_failed = compile.as_ref().is_some_and(|c| c.exit_code != 0);
        if build_failed {
            // The program never ran: report the build's outcome in `run` too.
            if let Some(c) = &compile {
                stderr = c.stderr.clone();
            }
        }
        let (timed_out, oom) = if build_failed {
            (false, false)
        } else {
            (run.timed_out, oom)
        };
        let exit_code = match &compile {
            Some(c) if c.exit_code != 0 => c.exit_code,
            _ => exit_code,
        };
        let duration = match (run.program_started, run.exited_at) {
            (Some(s), Some(e)) => e.duration_since(s),
            (Some(s), None) => s.elapsed(),
            (None, _) if build_failed => Duration::ZERO,
            _ => Duration::ZERO,
        };
        let result = RunResult {
            stdout: String::from_utf8_lossy(&run.out[0].kept).into_owned(),
            stderr,
            exit_code,
            timed_out,
            oom_killed: oom,
            truncated: run.out.iter().any(|c| c.truncated),
            duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            network,
        };
        self.run_deliver(run, result, compile);
    }

    /// Counts a finished run and sends its result (JSON, or the SSE `done` event).
    pub(super) fn run_deliver(
        &mut self,
        mut run: Run,
        result: RunResult,
        compile: Option<CompileResult>,
    ) {
        let c = &mut self.app.counters;
        c.runs_total += 1;
        if result.timed_out {
            c.runs_timed_out += 1;
        }
        if result.oom_killed {
            c.runs_oom_killed += 1;
        }
        if run.cancelled {
            c.runs_cancelled += 1;
        }
        log::info!(
            "run={} lang={} exit={} timed_out={} oom={} truncated={} ms={} cancelled={}",
            run.id,
            run.plan.runtime.desc.language,
            result.exit_code,
            result.timed_out,
            result.oom_killed,
            result.truncated,
            result.duration_ms,
            run.cancelled
        );
        let mut body = execute::response(&run.plan, result, compile);
        body.artifacts = std::mem::take(&mut run.artifacts);
        if let Some(reply) = run.agent.take() {
            // The kernel lives on unless this step ended it (it is being reaped then).
            let kernel_alive = run.kernel.is_some_and(|(kk, ks)| self.kernel_alive(kk, ks));
            let _ = reply.send(crate::agent::StepReply::Ran {
                result: Box::new(body),
                kernel_alive,
            });
            return;
        }
        let Some((ck, cserial)) = run.conn else {
            return;
        };
        if self.conns.get(ck).is_none_or(|c| c.serial != cserial) {
            return;
        }
        if run.stream {
            // One `data:` line: serialised JSON holds no raw line breaks.
            self.finish_stream_lazy(ck, body.into_lazy());
        } else {
            self.respond_lazy(ck, body.into_lazy());
        }
        self.conn_resume(ck);
    }

    /// Fails a run before it produced a result: a 500 (or an SSE `error` event).
    fn run_fail(&mut self, rk: usize, code: &str, detail: &str) {
        self.run_refuse(rk, Response::error(500, code, Some(detail)));
    }

    /// Ends a run that produced no result with `resp`: as is, or, on a stream whose
    /// head already said 200, as an SSE `error` event `{"error": "<code>: <detail>"}`.
    pub(super) fn run_refuse(&mut self, rk: usize, resp: Response) {
        let Some(run) = self.runs.try_remove(rk) else {
            return;
        };
        self.app.runs.give_back();
        self.refuse_removed(run, resp);
    }

    /// [`Reactor::run_refuse`] for a run already out of the table (its slot freed).
    fn refuse_removed(&mut self, run: Run, resp: Response) {
        if let Some(reply) = run.agent {
            let _ = reply.send(crate::agent::StepReply::Refused(resp));
            return;
        }
        let Some((ck, cserial)) = run.conn else {
            return;
        };
        if self.conns.get(ck).is_none_or(|c| c.serial != cserial) {
            return;
        }
        if run.stream {
            let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap_or_default();
            let code = v["error"].as_str().unwrap_or("error");
            let msg = match v["detail"].as_str() {
                Some(d) => format!("{code}: {d}"),
                None => code.to_string(),
            };
            let mut frame = Vec::new();
            sse::write_event(
                &mut frame,
                "error",
                &serde_json::json!({ "error": msg }).to_string(),
            );
            self.finish_stream(ck, &frame);
        } else {
            self.respond(ck, resp);
        }
        self.conn_resume(ck);
    }

    /// Sends the last event and the terminating chunk; the connection reads heads again.
    pub(crate) fn finish_stream(&mut self, ck: usize, frame: &[u8]) {
        self.conn_send_chunked(ck, frame);
        let idle = Duration::from_millis(self.cfg.idle_timeout_ms);
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.wbuf.extend_from_slice(b"0\r\n\r\n");
        c.phase = Phase::Head;
        if !c.keep_alive || self.app.shutting_down {
            c.close_after_flush = true;
        }
        self.arm_conn(ck, idle);
    }

    /// A connection whose run ended serves its next (pipelined) request.
    pub(crate) fn conn_resume(&mut self, ck: usize) {
        self.conn_pump(ck);
    }

    fn arm_keepalive(&mut self, rk: usize) {
        let every = Duration::from_millis(self.cfg.sse_keepalive_ms);
        let Some(run) = self.runs.get(rk) else { return };
        self.timers
            .insert(run.last_event + every, TimerKey::Keepalive(rk, run.serial));
    }

    /// Sends a comment when the stream has been silent for a whole interval.
    pub(crate) fn run_keepalive(&mut self, rk: usize, serial: u64) {
        let every = Duration::from_millis(self.cfg.sse_keepalive_ms);
        let Some(run) = self.runs.get_mut(rk).filter(|r| r.serial == serial) else {
            return;
        };
        let Some((ck, _)) = run.conn else { return };
        if run.last_event.elapsed() + Duration::from_millis(5) >= every {
            run.last_event = Instant::now();
            let mut frame = Vec::new();
            sse::write_comment(&mut frame, "keep-alive");
            self.conn_send_chunked(ck, &frame);
        }
        self.arm_keepalive(rk);
    }

    pub(crate) fn kill_all_runs(&mut self) {
        let keys: Vec<usize> = self.runs.iter().map(|(k, _)| k).collect();
        for rk in keys {
            if let Some(run) = self.runs.get_mut(rk) {
                run.cancelled = true;
            }
            self.run_kill(rk);
        }
        self.kill_all_kernels("the daemon is shutting down");
    }

    /// Runs one real sandbox at startup; `/readyz` waits for it.
    pub(crate) fn start_probe(&mut self) {
        let Some(rt) = self.app.runtimes.installed().next().cloned() else {
            self.app.probe =
                ProbeState::Failed("no runtime is installed (run `make runtimes`)".into());
            return;
        };
        let backend = Arc::clone(&self.backend);
        let id = format!("{}-{:x}-probe", self.cfg.instance, std::process::id());
        let job = Box::new(move || Completion::Probe(backend.probe(&id, rt)));
        if self.pool.submit(job).is_err() {
            self.app.probe = ProbeState::Failed("worker queue full".into());
        }
    }
}

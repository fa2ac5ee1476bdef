//! A kernel step on the event loop: checking the session's kernel can take one, writing
//! the step's files into its workspace (a pool job), lending the kernel's pipes to a
//! [`Run`](super::runs::Run) so output, caps, SSE and the result are `/execute`'s, and
//! taking them back when the harness's `done` frame arrives.

use super::kernels::{KState, STALE_DISCARD_BYTES};
use super::kernels::{KERNELS, OUT};
use super::runs::{Capture, Run, State};
use super::runs::{RUNS, STDERR, STDOUT};
use super::sink::Sink;
use super::Daemon;
use crate::http::Response;
use crate::reactor::{Addr, Done};
use crate::sandbox::kernel::kernel_dead;
use crate::sandbox::plan::{ExecPlan, RunResult};
use std::io::{self, Read};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Daemon {
    /// Starts a step of `session`'s kernel for connection `ck`, which gets its result as
    /// `delivery` says: a streamed or detached step is recorded (`records`) under
    /// `tenant`, as a run is — a step the kernel cannot take now is refused before any
    /// record exists.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_kernel_step(
        &mut self,
        ck: usize,
        serial: u64,
        session: &str,
        plan: Box<ExecPlan>,
        code: String,
        delivery: crate::api::Delivery,
        tenant: &str,
    ) {
        use crate::api::Delivery;
        if delivery != Delivery::Json {
            if let Err(resp) = self.kernel_step_check(session) {
                self.respond(ck, resp);
                return;
            }
        }
        let lang = &plan.runtime.desc.language;
        let Some((sink, record)) = self.delivery_sink(ck, serial, delivery, tenant, lang) else {
            return;
        };
        if let (Delivery::Detach, Some((id, _))) = (delivery, record) {
            self.respond(ck, super::runs::detached_response(&id));
        }
        self.kernel_step(sink, session, plan, code);
    }

    /// Why a step of `session`'s kernel cannot start now, if it cannot; else its key.
    pub(super) fn kernel_step_check(&mut self, session: &str) -> Result<usize, Response> {
        if let Some(resp) = self.admit_refusal() {
            return Err(resp);
        }
        let Some(&kk) = self.kernel_of.get(session) else {
            let why = self.kernel_dead.get(session).cloned().unwrap_or_else(|| {
                "the kernel is not running (isoboxd restarted since it started)".into()
            });
            return Err(kernel_dead(&why));
        };
        let Some(k) = self.kernels.get(kk) else {
            return Err(kernel_dead("the kernel is not running"));
        };
        if k.killing || k.exited {
            let why = k
                .why
                .clone()
                .unwrap_or_else(|| "the kernel is ending".into());
            return Err(kernel_dead(&why));
        }
        match k.state {
            KState::Idle => Ok(kk),
            KState::Busy(_) => Err(crate::api::error::session_error(
                &crate::workspace::SessionError::Busy,
            )),
            KState::Spawning | KState::Booting => Err(Response::error(
                409,
                "session_busy",
                Some("the kernel is still starting"),
            )),
        }
    }

    /// Runs `code` in the session's kernel; the result goes to `sink`.
    pub(crate) fn kernel_step(
        &mut self,
        sink: Rc<dyn Sink>,
        session: &str,
        mut plan: Box<ExecPlan>,
        code: String,
    ) {
        let kk = match self.kernel_step_check(session) {
            Ok(kk) => kk,
            Err(resp) => {
                sink.refused(self, resp);
                return;
            }
        };
        let Some(k) = self.kernels.get_mut(kk) else {
            return;
        };
        // Whatever background output sat in the pipes since the last step is not this
        // step's: read it away (bounded; a writer that never stops has the rest counted).
        let mut buf = [0u8; 64 * 1024];
        for (rx, _) in k.pipes.iter_mut().flatten() {
            let mut dropped = 0;
            while dropped < STALE_DISCARD_BYTES {
                match rx.read(&mut buf) {
                    Ok(n) if n > 0 => dropped += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    _ => break,
                }
            }
        }
        plan.network_requested = k.plan.network_requested;
        // The kernel's cgroup caps the step: say so in `run.limits`.
        plan.limits.memory_bytes = k.plan.limits.memory_bytes;
        plan.limits.cpus = k.plan.limits.cpus;
        plan.limits.pids = k.plan.limits.pids;
        k.step_artifacts = 0;
        if let Some(l) = &k.plan.workspace {
            l.touch();
        }
        let cap = usize::try_from(plan.limits.output_bytes).unwrap_or(usize::MAX);
        let now = Instant::now();
        let mut out = [
            Capture {
                cap,
                ..Default::default()
            },
            Capture {
                cap,
                ..Default::default()
            },
        ];
        let mut moved = Vec::new();
        for (i, slot) in k.pipes.iter_mut().enumerate() {
            match slot.take() {
                Some((rx, t)) => {
                    moved.push((t, i));
                    out[i].pipe = Some((rx, t));
                }
                None => out[i].eof = true,
            }
        }
        let frame = serde_json::json!({"op": "exec", "code": code}).to_string();
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        let mut bytes = len.to_be_bytes().to_vec();
        bytes.extend_from_slice(frame.as_bytes());
        let files = std::mem::take(&mut plan.files);
        if files.is_empty() {
            k.wbuf.extend_from_slice(&bytes);
        } else {
            k.pending = Some(bytes);
        }
        // Its link went with any failed egress check since it was made; it runs
        // offline then, and the step says so.
        let network = k.net.is_some()
            && self
                .backend
                .egress()
                .is_some_and(|e| e.cuts() == k.net_cuts);
        let kserial = k.serial;
        let wall = Duration::from_millis(plan.limits.wall_time_ms);
        self.run_serial += 1;
        let serial = self.run_serial;
        let id = k.id.clone();
        let rk = self.runs.insert(Run {
            compile: None,
            program_started: Some(now),
            admitted: now,
            gate: crate::sandbox::start::StartGate::open(),
            serial,
            id,
            sink: Some(sink),
            plan,
            state: State::Running,
            out,
            stdin: None,
            stdin_pos: 0,
            pid: None,
            child: None,
            cgroup: None,
            dir: None,
            net: None,
            started: Some(now),
            exited_at: None,
            timed_out: false,
            cancelled: false,
            killing: false,
            paused: false,
            timer_gen: 0,
            last_event: now,
            kernel: Some((kk, kserial)),
            kernel_network: network,
            artifacts: Vec::new(),
            artifacts_truncated: false,
            exit_ctl: None,
            start_signal: None,
            exit_buf: Vec::new(),
            early_exit: None,
        });
        for (t, i) in moved {
            let what = if i == 0 { STDOUT } else { STDERR };
            self.reactor.retarget(t, Addr::new(RUNS, rk, what));
        }
        if let Some(k) = self.kernels.get_mut(kk) {
            k.state = KState::Busy(rk);
            self.app.kernels.busy(k.serial);
        }
        self.app.runs.take();
        self.run_attach(rk);
        if files.is_empty() {
            self.arm_run(rk, now + wall);
            self.kernel_flush(kk);
        } else {
            let sessions = Arc::clone(&self.app.sessions);
            let session = session.to_string();
            self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
                let result = crate::api::sessions::write_step_files(&sessions, &session, &files);
                Box::new(move |d: &mut Daemon| d.kernel_files_written(kk, kserial, rk, result))
            }));
        }
        // Output may already wait in the pipes with no edge to come.
        self.run_pipe_event(rk, false);
        self.run_pipe_event(rk, true);
    }

    /// A step's files are in place: hand its code to the kernel (or refuse the step).
    pub(crate) fn kernel_files_written(
        &mut self,
        kk: usize,
        serial: u64,
        rk: usize,
        result: Result<(), Response>,
    ) {
        let Some(k) = self.kernels.get_mut(kk).filter(|k| k.serial == serial) else {
            return;
        };
        if k.state != KState::Busy(rk) || k.killing {
            return;
        }
        let Some(frame) = k.pending.take() else {
            return;
        };
        match result {
            Ok(()) => {
                k.wbuf.extend_from_slice(&frame);
                let wall = self.runs.get(rk).map_or(0, |r| r.plan.limits.wall_time_ms);
                if let Some(run) = self.runs.get_mut(rk) {
                    run.program_started = Some(Instant::now());
                }
                self.arm_run(rk, Instant::now() + Duration::from_millis(wall));
                self.kernel_flush(kk);
            }
            Err(resp) => {
                // Nothing ran: the kernel is free again, and the client hears why.
                self.kernel_take_pipes(kk, rk);
                if let Some(k) = self.kernels.get_mut(kk) {
                    k.state = KState::Idle;
                    self.app.kernels.idle(k.serial, k.last_used);
                }
                self.run_refuse(rk, resp);
            }
        }
    }

    /// Gives a step's pipes back to its kernel.
    pub(super) fn kernel_take_pipes(&mut self, kk: usize, rk: usize) {
        let mut back = Vec::new();
        if let Some(run) = self.runs.get_mut(rk) {
            for (i, cap) in run.out.iter_mut().enumerate() {
                if let Some(p) = cap.pipe.take() {
                    back.push((i, p));
                }
            }
        }
        for (i, (rx, t)) in back {
            self.reactor.retarget(t, Addr::new(KERNELS, kk, OUT));
            match self.kernels.get_mut(kk) {
                Some(k) => k.pipes[i] = Some((rx, t)),
                None => {
                    let mut rx = rx;
                    let _ = self.reactor.registry().deregister(&mut rx);
                    self.reactor.release(t);
                }
            }
        }
    }

    pub(super) fn kernel_step_done(&mut self, kk: usize, rk: usize, exit: i64, truncated: bool) {
        // Every byte of the step is in the pipes now: read them dry, then flush held
        // back partial characters.
        if let Some(run) = self.runs.get_mut(rk) {
            run.paused = false;
        }
        self.run_pipe_event_final(rk);
        self.kernel_take_pipes(kk, rk);
        let Some(k) = self.kernels.get_mut(kk) else {
            return;
        };
        if k.killing {
            // Ended while draining (an output flood): the exit decides the result.
            return;
        }
        k.state = KState::Idle;
        k.last_used = Instant::now();
        self.app.kernels.idle(k.serial, k.last_used);
        if let Some(l) = &k.plan.workspace {
            l.touch();
        }
        // The idle timer armed at ready re-arms itself from `last_used`: one pending
        // timer per kernel, however many steps it runs.
        let serial = k.serial;
        let Some(run) = self.runs.try_remove(rk) else {
            return;
        };
        self.app.runs.give_back();
        let exit_code = i32::try_from(exit.clamp(0, 255)).unwrap_or(1);
        self.kernel_deliver(run, exit_code, false, false, truncated);
        if self.app.shutting_down {
            // Its step was what the shutdown waited for.
            self.kernel_kill(kk, serial, "the daemon is shutting down");
        }
    }

    /// Sends a finished step's result.
    pub(super) fn kernel_deliver(
        &mut self,
        run: Run,
        exit_code: i32,
        timed_out: bool,
        oom: bool,
        truncated: bool,
    ) {
        let duration = run.program_started.map_or(Duration::ZERO, |s| s.elapsed());
        let result = RunResult {
            stdout: String::from_utf8_lossy(&run.out[0].kept).into_owned(),
            stderr: String::from_utf8_lossy(&run.out[1].kept).into_owned(),
            exit_code,
            timed_out,
            oom_killed: oom,
            truncated: truncated || run.artifacts_truncated || run.out.iter().any(|c| c.truncated),
            duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            network: run.kernel_network,
            limits: run.plan.limits,
        };
        self.run_deliver(run, result, None);
    }
}

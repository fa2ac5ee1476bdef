//! How a run ends: the exit of `runsc run` (or the harness's exit report), the wall-time
//! and drain deadlines, kill and cancel, the cleanup job, and the result delivered to
//! its connection (JSON or the SSE `done`), its kernel or its agent loop; and the
//! startup self-probe, a run like any other.

use super::runs::{Run, State, DRAIN_GRACE};
use super::runs::{DEADLINE, RUNS};
use super::Daemon;
use crate::api::execute;
use crate::api::ProbeState;
use crate::http::sse::take_utf8;
use crate::http::Response;
use crate::metrics::RunOutcome;
use crate::reactor::{Addr, Done};
use crate::sandbox::plan::{CompileResult, RunResult};
use crate::sandbox::Cleanup;
use mio::unix::SourceFd;
use std::os::fd::AsRawFd;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Daemon {
    /// The harness said the program ended with `code`: finish as at runsc's exit, with
    /// an empty pipe counting as a drained one; the sandbox is torn down after the
    /// response.
    pub(super) fn run_exited_early(&mut self, rk: usize, code: i32) {
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
                .reactor
                .registry()
                .deregister(&mut SourceFd(&fd.as_raw_fd()));
            self.reactor.release(t);
        }
        self.arm_run(rk, Instant::now() + DRAIN_GRACE);
        // Output may still sit in the pipes: read it before deciding. When both pipes
        // closed before the exit was seen (the usual order), nothing else would notice
        // that the run is complete, so check here.
        self.run_pipe_event(rk, false);
        self.run_pipe_event(rk, true);
        self.run_check_done(rk);
    }

    pub(super) fn run_check_done(&mut self, rk: usize) {
        let Some(run) = self.runs.get(rk) else { return };
        if run.state == State::Running && run.exited_at.is_some() && run.out.iter().all(|c| c.eof) {
            self.run_cleanup(rk);
        }
    }

    /// Replaces the run's deadline (wall time, or the drain grace after exit).
    pub(super) fn arm_run(&mut self, rk: usize, at: Instant) {
        if let Some(run) = self.runs.get_mut(rk) {
            run.timer_gen = self.reactor.arm_new(at, Addr::new(RUNS, rk, DEADLINE));
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
            super::nothing()
        });
        self.reactor.submit_must(job);
    }

    /// Cancelled by request (`POST /v1/runs/{id}/cancel`): killed, and its sink (the
    /// record, a client still streaming) gets the cancelled result as usual.
    pub(crate) fn run_stop(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        // A run already ending (its program exited, or it is being cleaned up) ends as
        // it would: it is not reported cancelled.
        if run.cancelled || run.kernel.is_some() || run.exited_at.is_some() {
            return;
        }
        if run.state == State::Cleaning {
            return;
        }
        run.cancelled = true;
        // Starting: `run_spawned` kills it once it exists.
        if run.state == State::Running {
            self.run_kill(rk);
        }
    }

    /// The client went away: detach and kill. A recorded run's record still takes its
    /// end (what happened stays readable at `/v1/runs/{id}`).
    pub(crate) fn run_cancel(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        let Some(sink) = run.sink.as_ref() else {
            return;
        };
        let recorded = sink.client_left();
        if !recorded {
            run.sink = None;
        } else if run.cancelled {
            return;
        }
        if run.kernel.is_some() {
            // The step finishes (its wall time bounds it); the kernel and its state live on.
            // A recorded step's record takes its real end (it was not cancelled); an
            // unrecorded one is counted cancelled: nobody has its result. Nobody reads
            // the stream now: keep draining the pipes, or a paused step would block on a
            // full pipe until its wall time ended the kernel.
            run.cancelled = !recorded;
            run.paused = false;
            self.run_pipe_event(rk, false);
            self.run_pipe_event(rk, true);
            return;
        }
        run.cancelled = true;
        if run.state == State::Running {
            self.run_kill(rk);
        }
    }

    pub(super) fn run_cleanup(&mut self, rk: usize) {
        // Final read of anything left, then stop watching.
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if run.state != State::Running {
            return;
        }
        run.paused = false;
        // A signal that came with the exit (runsc runs the hook before it waits for the
        // program) is read before the gate's verdict.
        self.run_take_start_signal(rk);
        self.run_pipe_event_final(rk);
        if self.runs.get(rk).is_some_and(|r| !r.gate.began()) {
            self.run_start_unheard(rk);
            // What stderr held back past its bound is read now.
            self.run_pipe_event_final(rk);
        }
        self.run_close_start_signal(rk);
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        run.state = State::Cleaning;
        let mut release = Vec::new();
        for cap in run.out.iter_mut() {
            if let Some((mut rx, t)) = cap.pipe.take() {
                let _ = self.reactor.registry().deregister(&mut rx);
                release.push(t);
            }
        }
        if let Some((mut tx, t)) = run.stdin.take() {
            let _ = self.reactor.registry().deregister(&mut tx);
            release.push(t);
        }
        if let Some((mut ctl, t)) = run.exit_ctl.take() {
            let _ = self.reactor.registry().deregister(&mut ctl);
            release.push(t);
        }
        if let Some((fd, t)) = run.pid.take() {
            let _ = self
                .reactor
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
            self.reactor.release(t);
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
        let job = Box::new(move || -> Done<Daemon> {
            let cleanup = match end {
                End::Reap(child) => backend.wait(child, &cg),
                End::Reported(exit_code) => {
                    let oom_killed = cg.oom_kills() > 0;
                    // The slot is freed with the response: nothing may run on in it (a
                    // program that forged the frame); the reap comes after.
                    cg.kill_now();
                    crate::sandbox::Cleanup {
                        oom_killed,
                        exit_code,
                    }
                }
            };
            Box::new(move |d: &mut Daemon| d.run_cleaned(rk, serial, cleanup))
        });
        self.reactor.submit_must(job);
    }

    pub(super) fn run_pipe_event_final(&mut self, rk: usize) {
        for idx in [0, 1] {
            self.run_pipe_event(rk, idx == 1);
            if let Some(run) = self.runs.get_mut(rk) {
                let live = run.sink.as_ref().is_some_and(|s| s.live());
                if live && !run.out[idx].pending_utf8.is_empty() {
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
                    backend.wait(child, &cg);
                }
                backend.delete(&id, &cg, &dir);
                drop(lease);
                drop(net);
                super::nothing()
            });
            self.reactor.submit_must(job);
        }
        if !run.gate.began() {
            // No start frame: runsc failed (or hung) before the program existed. What
            // it said goes to the log; the client gets no host detail.
            if run.cancelled {
                // The client left, or the daemon is stopping (a second signal kills
                // every run), while it booted. A client still waiting hears why; one
                // that left has no sink.
                self.app.counters.runs_total += 1;
                self.app.counters.runs_cancelled += 1;
                self.count_run(&run, RunOutcome::Cancelled);
                log::debug!("run={} cancelled before it started", run.id);
                let resp = if self.app.shutting_down {
                    Response::error(503, "shutting_down", Some("isoboxd is shutting down"))
                        .with_header("Retry-After", "5")
                } else {
                    // Its client left or cancelled it: only a record still hears this.
                    Response::error(
                        409,
                        "cancelled",
                        Some("the run was cancelled before it started"),
                    )
                };
                self.refuse_removed(run, resp);
                return;
            }
            self.app.counters.runs_failed += 1;
            self.count_run(&run, RunOutcome::Failed);
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
            limits: run.plan.limits,
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
        let outcome = RunOutcome::of(
            run.cancelled,
            result.timed_out,
            result.oom_killed,
            result.truncated,
            result.exit_code,
        );
        self.count_run(&run, outcome);
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
        let Some(sink) = run.sink.take() else { return };
        // A kernel lives on unless this step ended it (it is being reaped then).
        let kernel_alive = run.kernel.is_some_and(|(kk, ks)| self.kernel_alive(kk, ks));
        let ended = super::sink::Ended {
            kernel_alive,
            cancelled: run.cancelled,
        };
        sink.result(self, body, ended);
    }

    /// Counts a run that ended with `outcome` in `/metrics`: by runtime, with its
    /// latency from admission and its start latency (admission to the program's start).
    fn count_run(&mut self, run: &Run, outcome: RunOutcome) {
        let start = run
            .program_started
            .map(|p| p.saturating_duration_since(run.admitted));
        self.app.metrics.run(
            &run.plan.runtime.desc.language,
            outcome,
            run.admitted.elapsed(),
            start,
        );
    }

    /// Fails a run before it produced a result: a 500 (or an SSE `error` event).
    pub(super) fn run_fail(&mut self, rk: usize, code: &str, detail: &str) {
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

    /// [`Daemon::run_refuse`] for a run already out of the table (its slot freed).
    pub(super) fn refuse_removed(&mut self, run: Run, resp: Response) {
        if let Some(sink) = run.sink {
            sink.refused(self, resp);
        }
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
        self.box_end_batches("the daemon is shutting down");
    }

    /// The startup self-probe ended: `/readyz` says so, and the warm pool may fill.
    fn probed(&mut self, res: Result<(), String>) {
        self.app.probe = match res {
            Ok(()) => {
                log::info!("backend self-probe passed");
                self.app.probe = ProbeState::Passed;
                self.warm_fill();
                ProbeState::Passed
            }
            Err(why) => {
                log::error!("backend self-probe failed: {why}");
                ProbeState::Failed(why)
            }
        }
    }

    /// Runs one real sandbox at startup; `/readyz` waits for it.
    pub(crate) fn start_probe(&mut self) {
        let Some(rt) = self.app.runtimes.installed().next().cloned() else {
            self.app.probe =
                ProbeState::Failed("no runtime is installed (run `make runtimes`)".into());
            return;
        };
        let backend = Arc::clone(&self.backend);
        let id = self.container_id("probe", 0);
        let job = Box::new(move || -> Done<Daemon> {
            let res = crate::sandbox::probe::probe(&*backend, &id, rt);
            Box::new(move |d: &mut Daemon| d.probed(res))
        });
        if self.reactor.submit(job).is_err() {
            self.app.probe = ProbeState::Failed("worker queue full".into());
        }
    }
}

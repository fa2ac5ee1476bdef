//! Live-kernel sessions on the event loop: one long-lived sandbox per kernel session,
//! running our harness (`runtimes/kernel/harness.py`) in one persistent interpreter.
//!
//! The kernel's life (create, boot, control frames, end) stays one file: every path that
//! ends a kernel takes the same kill, reap and remove sequence. Its steps are
//! `kernel_steps.rs`.
//!
//! The sandbox's stdin is one end of a socket pair, the harness's framed control
//! channel (a 4-byte big-endian length, then JSON); its stdout and stderr are plain
//! pipes, so nothing user code prints can be read as a frame. Between steps nobody
//! reads the pipes (a chatty background thread blocks on a full pipe). A step borrows
//! them: it becomes a [`Run`] whose captures own the pipes until the harness's `done`
//! frame, so capping, SSE streaming, backpressure, keep-alives and the result object
//! are the ones of `/execute`. Every byte the step wrote is in the pipes before the
//! harness sends `done` (it flushes first), so reading them dry then loses nothing.
//!
//! A step past its wall time, an output flood, a protocol violation, an idle timeout,
//! a delete and shutdown all end the kernel the same way: its whole cgroup is killed,
//! `runsc run` is reaped, and the session's next step is told why (410 `kernel_dead`).

use super::Daemon;
use crate::api::{KernelCreated, Outcome};
use crate::cgroup::RunCgroup;
use crate::http::Response;
use crate::reactor::{Addr, Component, ComponentId, Done, Readiness};
use crate::sandbox::kernel::{
    is_base64, kernel_env, next_said, Phase as Protocol, Said, BOOT_TIMEOUT, HARNESS,
    MAX_ARTIFACTS, MAX_ARTIFACT_BYTES,
};
use crate::sandbox::plan::{Artifact, ExecPlan};
use crate::sandbox::SandboxError;
use crate::sandbox::{Cleanup, Spawned, Stdin};
use mio::unix::pipe;
use mio::unix::SourceFd;
use mio::{Interest, Token};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The kernels component (key: the kernel).
pub(crate) const KERNELS: ComponentId = ComponentId(4);
/// A kernel's control socket.
pub(crate) const CTL: u16 = 0;
/// A kernel's stdout or stderr between steps (nothing reads it then).
pub(crate) const OUT: u16 = 1;
/// A kernel's pidfd (of `runsc run`).
pub(crate) const PID: u16 = 2;
/// Timers: the boot deadline or the idle check.
const DEADLINE: u16 = 0;

/// Kernels on the loop.
pub(crate) struct Kernels;

impl Component<Daemon> for Kernels {
    fn name(&self) -> &'static str {
        "kernels"
    }

    fn ready(&self, d: &mut Daemon, kk: usize, what: u16, _: Readiness) {
        match what {
            CTL => d.kernel_ctl_event(kk),
            PID => d.kernel_exited(kk),
            _ => {}
        }
    }

    fn timer(&self, d: &mut Daemon, kk: usize, what: u16, gen: u64) {
        if what == DEADLINE {
            d.kernel_timer(kk, gen);
        }
    }
}

/// Output left in the pipes from between steps that is thrown away before a step.
pub(super) const STALE_DISCARD_BYTES: usize = 1 << 20;
/// Most reasons for ended kernels remembered.
pub(super) const MAX_DEAD_REASONS: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KState {
    /// `runsc run` is being started on the pool.
    Spawning,
    /// Started; waiting for the harness's `ready`.
    Booting,
    /// Waiting for a step.
    Idle,
    /// Running the step in `runs[key]`.
    Busy(usize),
}

/// A kernel's reactor-side state.
pub struct Kernel {
    pub(super) serial: u64,
    pub(super) session: String,
    pub(super) id: String,
    pub(super) state: KState,
    /// Runtime, limits, the network asked for, and the workspace lease.
    pub(super) plan: Box<ExecPlan>,
    pub(super) ctl: Option<(mio::net::UnixStream, Token)>,
    pub(super) rbuf: Vec<u8>,
    pub(super) wbuf: Vec<u8>,
    pub(super) pipes: [Option<(pipe::Receiver, Token)>; 2],
    pub(super) pid: Option<(OwnedFd, Token)>,
    pub(super) child: Option<Child>,
    pub(super) cgroup: Option<RunCgroup>,
    pub(super) dir: Option<PathBuf>,
    pub(super) net: Option<crate::netfilter::NetLease>,
    /// The create request waiting for `ready`, and its 201.
    pub(super) create: Option<(usize, u64, Response)>,
    /// Delete the session once the kernel is gone; `Some(conn)` gets the answer.
    pub(super) delete: Option<Option<(usize, u64)>>,
    /// Why it is being ended (the first reason given).
    pub(super) why: Option<String>,
    pub(super) killing: bool,
    /// `runsc run` has exited (its pidfd fired).
    pub(super) exited: bool,
    /// The harness closed the control channel.
    pub(super) ctl_closed: bool,
    /// Egress cuts when its network was made: a later cut took its link.
    pub(super) net_cuts: u64,
    /// A step's exec frame, held while its files are written.
    pub(super) pending: Option<Vec<u8>>,
    /// Artifact frames in the current step (the harness sends at most 8: more is a
    /// broken protocol, and would only cost the event loop parsing time).
    pub(super) step_artifacts: usize,
    pub(super) idle_limit: Duration,
    pub(super) last_used: Instant,
    pub(super) timer_gen: u64,
}

impl Daemon {
    /// A kernel session exists: start its kernel (or answer the refusal).
    pub(crate) fn kernel_create(
        &mut self,
        ck: usize,
        cserial: u64,
        created: Result<Box<KernelCreated>, Response>,
    ) {
        let created = match created {
            Ok(c) => *c,
            Err(resp) => {
                if self.conn_waiting(ck, cserial, false) {
                    self.respond(ck, resp);
                    self.conn_after_io(ck);
                }
                return;
            }
        };
        let client = self.conns.get(ck).map(|c| c.client);
        let admission = self.app.kernels.admit(
            &created.tenant,
            client,
            self.app.shutting_down,
            Instant::now(),
        );
        let (refusal, evict) = match admission {
            crate::admission::KernelAdmission::Refused(r) => (Some(r), None),
            crate::admission::KernelAdmission::Evict(old) => (None, Some(old)),
            crate::admission::KernelAdmission::Free => (None, None),
        };
        // The creator left: nobody has the token, so no kernel; the session goes.
        let refusal = refusal.or_else(|| {
            (!self.conn_waiting(ck, cserial, false))
                .then(|| Response::error(503, "client_closed", None))
        });
        if let Some(resp) = refusal {
            // Nobody got the token: the session goes again, then the answer.
            let KernelCreated { session, plan, .. } = created;
            self.delete_session_job(&session, plan, Some((ck, cserial)), Some(resp));
            return;
        }
        if let Some(old) = evict {
            self.kernel_evict(old);
        }
        self.kernel_serial += 1;
        let serial = self.kernel_serial;
        self.app.kernels.take(serial, &created.tenant, client);
        let id = self.container_id("k", serial);
        let idle = Duration::from_secs(self.cfg.kernel_idle_sec.min(created.ttl_sec.max(1)));
        let plan_for_job = created.plan.clone();
        let kk = self.kernels.insert(Kernel {
            serial,
            session: created.session.clone(),
            id: id.clone(),
            state: KState::Spawning,
            plan: created.plan,
            ctl: None,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            pipes: [None, None],
            pid: None,
            child: None,
            cgroup: None,
            dir: None,
            net: None,
            create: Some((ck, cserial, created.response)),
            delete: None,
            why: None,
            killing: false,
            exited: false,
            ctl_closed: false,
            net_cuts: self.backend.egress().map_or(0, |e| e.cuts()),
            pending: None,
            step_artifacts: 0,
            idle_limit: idle,
            last_used: Instant::now(),
            timer_gen: 0,
        });
        self.kernel_of.insert(created.session, kk);
        let backend = Arc::clone(&self.backend);
        let desc = &plan_for_job.runtime.desc;
        let python = desc
            .run
            .first()
            .cloned()
            .unwrap_or_else(|| "/usr/bin/python3".into());
        let argv = vec![python, "-c".into(), HARNESS.into()];
        let env = kernel_env(&desc.env);
        let job = Box::new(move || -> Done<Daemon> {
            let result = backend
                .run(&id, &plan_for_job, argv, &env, Stdin::Control)
                .map(Box::new);
            Box::new(move |d: &mut Daemon| d.kernel_spawned(kk, serial, result))
        });
        self.reactor.submit_must(job);
    }

    pub(crate) fn kernel_spawned(
        &mut self,
        kk: usize,
        serial: u64,
        result: Result<Box<Spawned>, SandboxError>,
    ) {
        if self.kernels.get(kk).is_none_or(|k| k.serial != serial) {
            return;
        }
        let s = match result {
            Ok(s) => *s,
            Err(e) => {
                crate::error_limited!("kernel={kk} op=spawn err={e}");
                self.app.counters.runs_failed += 1;
                self.kernel_remove(kk, "the kernel could not be started".into());
                return;
            }
        };
        let mut s = s;
        let Some(ctl) = s.ctl.take() else {
            let backend = Arc::clone(&self.backend);
            self.reactor.submit_must(Box::new(move || {
                crate::sandbox::warm::discard(&*backend, s);
                super::nothing()
            }));
            self.kernel_remove(kk, "the kernel could not be started".into());
            return;
        };
        let t_ctl = self.reactor.token(Addr::new(KERNELS, kk, CTL));
        let t_out = self.reactor.token(Addr::new(KERNELS, kk, OUT));
        let t_err = self.reactor.token(Addr::new(KERNELS, kk, OUT));
        let t_pid = self.reactor.token(Addr::new(KERNELS, kk, PID));
        let mut ok = ctl.set_nonblocking(true).is_ok();
        let mut ctl = mio::net::UnixStream::from_std(ctl);
        ok &= self
            .reactor
            .registry()
            .register(&mut ctl, t_ctl, Interest::READABLE | Interest::WRITABLE)
            .is_ok();
        let mut pipes: [Option<(pipe::Receiver, Token)>; 2] = [None, None];
        for (i, (fd, t)) in [
            (OwnedFd::from(s.stdout), t_out),
            (OwnedFd::from(s.stderr), t_err),
        ]
        .into_iter()
        .enumerate()
        {
            let mut rx = pipe::Receiver::from(fd);
            ok &= rx.set_nonblocking(true).is_ok()
                && self
                    .reactor
                    .registry()
                    .register(&mut rx, t, Interest::READABLE)
                    .is_ok();
            pipes[i] = Some((rx, t));
        }
        ok &= self
            .reactor
            .registry()
            .register(
                &mut SourceFd(&s.pidfd.as_raw_fd()),
                t_pid,
                Interest::READABLE,
            )
            .is_ok();
        let gen = self.reactor.next_gen();
        let Some(k) = self.kernels.get_mut(kk) else {
            return;
        };
        k.ctl = Some((ctl, t_ctl));
        k.pipes = pipes;
        k.pid = Some((s.pidfd, t_pid));
        k.child = Some(s.child);
        k.cgroup = Some(s.cgroup);
        k.dir = Some(s.dir);
        k.net = s.net;
        k.state = KState::Booting;
        k.timer_gen = gen;
        let killing = k.killing;
        self.reactor.arm(
            Instant::now() + BOOT_TIMEOUT,
            Addr::new(KERNELS, kk, DEADLINE),
            gen,
        );
        if !ok {
            crate::error_limited!("kernel={kk} op=register err=could not watch kernel fds");
            self.kernel_kill(kk, serial, "the kernel could not be started");
            // Its exit may never be seen: reap it now (the reap waits for the kill).
            self.kernel_exited(kk);
            return;
        } else if killing {
            // Ended while it was being started.
            if let Some(k) = self.kernels.get_mut(kk) {
                k.killing = false;
            }
            self.kernel_kill(kk, serial, "");
        }
        // The harness may have written already: edge-triggered, so look now.
        self.kernel_ctl_event(kk);
    }

    /// The control socket is readable or writable.
    pub(crate) fn kernel_ctl_event(&mut self, kk: usize) {
        self.kernel_flush(kk);
        let mut buf = [0u8; 64 * 1024];
        loop {
            let Some(k) = self.kernels.get_mut(kk) else {
                return;
            };
            let Some((ctl, _)) = k.ctl.as_mut() else {
                return;
            };
            match ctl.read(&mut buf) {
                Ok(0) => {
                    // The harness closed its end (it exited, or was killed: the exit
                    // then says why): the kernel can take no more steps.
                    let s = k.serial;
                    k.ctl_closed = true;
                    self.kernel_close_ctl(kk);
                    self.kernel_kill(kk, s, "");
                    return;
                }
                Ok(n) => {
                    k.rbuf.extend_from_slice(&buf[..n]);
                    if !self.kernel_frames(kk) {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    let s = k.serial;
                    self.kernel_close_ctl(kk);
                    self.kernel_kill(kk, s, "the kernel's control channel failed");
                    return;
                }
            }
        }
    }

    pub(super) fn kernel_close_ctl(&mut self, kk: usize) {
        let Some(k) = self.kernels.get_mut(kk) else {
            return;
        };
        if let Some((mut ctl, t)) = k.ctl.take() {
            let _ = self.reactor.registry().deregister(&mut ctl);
            self.reactor.release(t);
        }
    }

    pub(super) fn kernel_flush(&mut self, kk: usize) {
        let Some(k) = self.kernels.get_mut(kk) else {
            return;
        };
        let Some((ctl, _)) = k.ctl.as_mut() else {
            return;
        };
        while !k.wbuf.is_empty() {
            match ctl.write(&k.wbuf) {
                Ok(0) => break,
                Ok(n) => {
                    k.wbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock: the writable edge brings us back; errors show as EOF.
                Err(_) => break,
            }
        }
    }

    /// Handles every complete frame in the read buffer. False once the kernel is
    /// being ended (stop reading).
    pub(super) fn kernel_frames(&mut self, kk: usize) -> bool {
        loop {
            let Some(k) = self.kernels.get_mut(kk) else {
                return false;
            };
            if k.killing {
                // Being ended: what it still says changes nothing.
                k.rbuf = Vec::new();
                return false;
            }
            let phase = match k.state {
                KState::Booting => Protocol::Booting,
                // No control socket yet while spawning: nothing may be said.
                KState::Spawning | KState::Idle => Protocol::Idle,
                KState::Busy(_) => Protocol::Busy,
            };
            let (state, serial) = (k.state, k.serial);
            let said = next_said(&mut k.rbuf, phase, &mut k.step_artifacts);
            match (said, state) {
                (Said::NeedMore, _) => {
                    if k.rbuf.len() < 4 && k.rbuf.capacity() > 1 << 20 {
                        k.rbuf.shrink_to(64 << 10);
                    }
                    return true;
                }
                (Said::Ready, _) => self.kernel_ready(kk),
                (
                    Said::Artifact {
                        kind,
                        data_b64,
                        data,
                    },
                    KState::Busy(rk),
                ) => self.kernel_artifact(rk, &kind, data_b64, data),
                (Said::Done { exit, truncated }, KState::Busy(rk)) => {
                    self.kernel_step_done(kk, rk, exit, truncated)
                }
                (Said::Broken(why), _) => {
                    self.kernel_close_ctl(kk);
                    self.kernel_kill(kk, serial, why);
                    return false;
                }
                // next_said answers an artifact or a done only for a busy kernel.
                (Said::Artifact { .. } | Said::Done { .. }, _) => {
                    self.kernel_close_ctl(kk);
                    self.kernel_kill(kk, serial, "the kernel broke its protocol");
                    return false;
                }
            }
        }
    }

    pub(super) fn kernel_ready(&mut self, kk: usize) {
        let gen = self.reactor.next_gen();
        let Some(k) = self.kernels.get_mut(kk) else {
            return;
        };
        k.state = KState::Idle;
        k.last_used = Instant::now();
        self.app.kernels.idle(k.serial, k.last_used);
        k.timer_gen = gen;
        let at = k.last_used + k.idle_limit;
        let (serial, create) = (k.serial, k.create.take());
        self.reactor.arm(at, Addr::new(KERNELS, kk, DEADLINE), gen);
        log::info!("kernel={} session={} ready", k.id, k.session);
        match create {
            Some((ck, cserial, resp)) if self.conn_waiting(ck, cserial, false) => {
                self.respond(ck, resp);
                self.conn_pump(ck);
            }
            _ => {
                // The creator left without the token: nobody can use this session.
                if let Some(k) = self.kernels.get_mut(kk) {
                    k.delete = Some(None);
                }
                self.kernel_kill(kk, serial, "the creating client went away");
            }
        }
    }

    pub(super) fn kernel_artifact(
        &mut self,
        rk: usize,
        kind: &str,
        data_b64: Option<String>,
        data: Option<String>,
    ) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        let art = match (kind, data_b64, data) {
            ("image/png", Some(b), None) if b.len() <= MAX_ARTIFACT_BYTES && is_base64(&b) => {
                Some(Artifact::Png { data_b64: b })
            }
            ("text/html", None, Some(h)) if h.len() <= MAX_ARTIFACT_BYTES => {
                Some(Artifact::Html { data: h })
            }
            _ => None,
        };
        match art {
            Some(a) if run.artifacts.len() < MAX_ARTIFACTS => run.artifacts.push(a),
            _ => run.artifacts_truncated = true,
        }
    }

    /// Whether kernel `kk` (of serial `serial`) can still take steps.
    pub(super) fn kernel_alive(&self, kk: usize, serial: u64) -> bool {
        self.kernels
            .get(kk)
            .is_some_and(|k| k.serial == serial && !k.killing && !k.exited)
    }

    /// Ends a kernel (its whole sandbox); `why` is what its session's next call hears.
    pub(crate) fn kernel_kill(&mut self, kk: usize, serial: u64, why: &str) {
        let Some(k) = self.kernels.get_mut(kk).filter(|k| k.serial == serial) else {
            return;
        };
        if k.why.is_none() && !why.is_empty() {
            k.why = Some(why.to_string());
        }
        if k.killing {
            return;
        }
        k.killing = true;
        let Some(cg) = k.cgroup.clone() else {
            // Still being spawned: killed once it is (kernel_spawned).
            return;
        };
        log::debug!("kernel={} session={} ending: {}", k.id, k.session, why);
        let runsc_pid = k.child.as_ref().and_then(|c| i32::try_from(c.id()).ok());
        let backend = Arc::clone(&self.backend);
        self.reactor.submit_must(Box::new(move || {
            backend.kill(&cg, runsc_pid);
            super::nothing()
        }));
    }

    /// `runsc run` of a kernel exited: reap it.
    pub(crate) fn kernel_exited(&mut self, kk: usize) {
        let Some(k) = self.kernels.get_mut(kk) else {
            return;
        };
        if k.exited {
            return;
        }
        k.exited = true;
        if let Some((fd, t)) = k.pid.take() {
            let _ = self
                .reactor
                .registry()
                .deregister(&mut SourceFd(&fd.as_raw_fd()));
            self.reactor.release(t);
        }
        let Some(k) = self.kernels.get_mut(kk) else {
            return;
        };
        let (Some(child), Some(cg)) = (k.child.take(), k.cgroup.clone()) else {
            return;
        };
        let serial = k.serial;
        let backend = Arc::clone(&self.backend);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let cleanup = backend.wait(child, &cg);
            Box::new(move |d: &mut Daemon| d.kernel_reaped(kk, serial, cleanup))
        }));
    }

    pub(crate) fn kernel_reaped(&mut self, kk: usize, serial: u64, cleanup: Cleanup) {
        let Some(k) = self.kernels.get_mut(kk).filter(|k| k.serial == serial) else {
            return;
        };
        let why = k.why.clone().unwrap_or_else(|| {
            if cleanup.oom_killed {
                "the kernel ran out of memory (its memory cap covers its whole life)".into()
            } else if k.ctl_closed && k.killing && cleanup.exit_code == 128 + libc::SIGKILL {
                // Alive but deaf: the step closed the harness's channel.
                "the kernel's control channel was closed".into()
            } else {
                format!("the kernel exited with code {}", cleanup.exit_code)
            }
        });
        if let KState::Busy(rk) = k.state {
            if let Some(run) = self.runs.get_mut(rk) {
                run.paused = false;
            }
            self.run_pipe_event_final(rk);
            self.kernel_take_pipes(kk, rk);
            if let Some(run) = self.runs.try_remove(rk) {
                self.app.runs.give_back();
                let oom = cleanup.oom_killed && !run.timed_out;
                let exit = if run.timed_out || oom {
                    128 + libc::SIGKILL
                } else {
                    cleanup.exit_code
                };
                let timed_out = run.timed_out;
                self.kernel_deliver(run, exit, timed_out, oom, false);
            }
        }
        self.kernel_remove(kk, why);
    }

    /// Forgets a kernel whose process is gone (or never started): its fds, its slot,
    /// then, on the pool, its container state, cgroup, bundle, network and lease.
    pub(super) fn kernel_remove(&mut self, kk: usize, why: String) {
        if let Some(KState::Busy(rk)) = self.kernels.get(kk).map(|k| k.state) {
            self.kernel_take_pipes(kk, rk);
        }
        let Some(mut k) = self.kernels.try_remove(kk) else {
            return;
        };
        self.app.kernels.give_back(k.serial);
        let mut release = Vec::new();
        if let Some((mut ctl, t)) = k.ctl.take() {
            let _ = self.reactor.registry().deregister(&mut ctl);
            release.push(t);
        }
        for (mut rx, t) in k.pipes.iter_mut().filter_map(Option::take) {
            let _ = self.reactor.registry().deregister(&mut rx);
            release.push(t);
        }
        if let Some((fd, t)) = k.pid.take() {
            let _ = self
                .reactor
                .registry()
                .deregister(&mut SourceFd(&fd.as_raw_fd()));
            release.push(t);
        }
        for t in release {
            self.reactor.release(t);
        }
        if self.kernel_of.get(&k.session) == Some(&kk) {
            self.kernel_of.remove(&k.session);
        }
        log::info!("kernel={} session={} ended: {why}", k.id, k.session);
        let mut answer = None;
        if let Some((ck, cserial, _)) = k.create.take() {
            // It never became ready: the create fails, and the session goes with it.
            k.delete = Some(Some((ck, cserial)));
            answer = Some(Response::error(
                500,
                "kernel_start_failed",
                Some("the kernel did not start; see the daemon log"),
            ));
        }
        if k.delete.is_none() {
            if self.kernel_dead.len() >= MAX_DEAD_REASONS {
                let first = self.kernel_dead.keys().next().cloned();
                if let Some(s) = first {
                    self.kernel_dead.remove(&s);
                }
            }
            self.kernel_dead.insert(k.session.clone(), why);
        }
        // Like a step's: the session is free for the next call (a delete) now, while
        // its mounts stay until the container is gone.
        if let Some(l) = &k.plan.workspace {
            l.end_step();
        }
        let backend = Arc::clone(&self.backend);
        let (id, cg, dir, net, plan) = (k.id, k.cgroup.take(), k.dir.take(), k.net.take(), k.plan);
        let sessions = Arc::clone(&self.app.sessions);
        let session = k.session;
        let delete = k.delete;
        // runsc is reaped (or never ran): the container, cgroup and bundle go, then the
        // network and the workspace lease, and only then may the session be deleted.
        let job = Box::new(move || {
            if let (Some(cg), Some(dir)) = (cg, dir) {
                backend.delete(&id, &cg, &dir);
            }
            drop(net);
            drop(plan);
            match delete {
                None => super::nothing(),
                Some(conn) => delete_and_answer(&sessions, &session, conn, answer),
            }
        });
        self.reactor.submit_must(job);
    }

    /// Deletes `plan`'s session on the pool (dropping its lease first), then answers
    /// `conn` with `resp` (or with the delete's own outcome).
    pub(super) fn delete_session_job(
        &mut self,
        session: &str,
        plan: Box<ExecPlan>,
        conn: Option<(usize, u64)>,
        resp: Option<Response>,
    ) {
        let sessions = Arc::clone(&self.app.sessions);
        let session = session.to_string();
        self.reactor.submit_must(Box::new(move || {
            if let Some(l) = &plan.workspace {
                l.end_step();
            }
            drop(plan);
            delete_and_answer(&sessions, &session, conn, resp)
        }));
    }

    /// `DELETE /v1/sessions/{id}` of a kernel session: end the kernel, then delete.
    pub(crate) fn kernel_delete(&mut self, ck: usize, cserial: u64, session: &str) {
        self.kernel_dead.remove(session);
        let Some(&kk) = self.kernel_of.get(session) else {
            // No kernel (ended, or the daemon restarted): delete like any session.
            let sessions = Arc::clone(&self.app.sessions);
            let session = session.to_string();
            self.reactor.submit_must(Box::new(move || {
                delete_and_answer(&sessions, &session, Some((ck, cserial)), None)
            }));
            return;
        };
        let Some(k) = self.kernels.get_mut(kk) else {
            return;
        };
        match k.state {
            KState::Busy(_) | KState::Spawning | KState::Booting if !k.killing => {
                self.respond(
                    ck,
                    crate::api::error::session_error(&crate::workspace::SessionError::Busy),
                );
            }
            _ if k.delete.is_some() => {
                self.respond(
                    ck,
                    Response::error(
                        409,
                        "session_busy",
                        Some("the session is being deleted already"),
                    ),
                );
            }
            _ => {
                k.delete = Some(Some((ck, cserial)));
                let serial = k.serial;
                self.kernel_kill(kk, serial, "the session was deleted");
            }
        }
    }

    /// A kernel's boot deadline or idle check.
    pub(crate) fn kernel_timer(&mut self, kk: usize, gen: u64) {
        let Some(k) = self
            .kernels
            .get(kk)
            .filter(|k| k.timer_gen == gen && gen != 0)
        else {
            return;
        };
        let serial = k.serial;
        match k.state {
            KState::Booting => {
                self.kernel_kill(kk, serial, "the kernel did not start in time");
            }
            KState::Idle if k.last_used.elapsed() >= k.idle_limit => {
                let why = format!("reaped after {} s idle", k.idle_limit.as_secs());
                self.kernel_kill(kk, serial, &why);
            }
            KState::Idle => {
                let at = k.last_used + k.idle_limit;
                self.reactor.arm(at, Addr::new(KERNELS, kk, DEADLINE), gen);
            }
            KState::Busy(_) => {
                // A step runs: look again one idle limit after it could have ended.
                let at = Instant::now() + k.idle_limit;
                self.reactor.arm(at, Addr::new(KERNELS, kk, DEADLINE), gen);
            }
            KState::Spawning => {}
        }
    }

    /// Ends the idle kernel `serial` to make room in a full pool: its slot is free at
    /// once (its cgroup is being killed), and its session's next step is told why.
    fn kernel_evict(&mut self, serial: u64) {
        // Given back first, whatever follows: the create about to take a slot counts on it.
        self.app.kernels.give_back(serial);
        let Some(kk) = self
            .kernels
            .iter()
            .find(|(_, k)| k.serial == serial)
            .map(|(kk, _)| kk)
        else {
            return;
        };
        let idle = self.kernels[kk].last_used.elapsed().as_secs();
        log::info!("kernel={kk} evicted after {idle} s idle: the kernel pool was full");
        self.kernel_kill(
            kk,
            serial,
            &format!("ended after {idle} s idle to make room: every kernel slot was taken and this kernel had been idle longest"),
        );
    }

    /// Ends every kernel not running a step.
    pub(crate) fn kill_idle_kernels(&mut self, why: &str) {
        let idle: Vec<(usize, u64)> = self
            .kernels
            .iter()
            .filter(|(_, k)| !matches!(k.state, KState::Busy(_)))
            .map(|(kk, k)| (kk, k.serial))
            .collect();
        for (kk, s) in idle {
            self.kernel_kill(kk, s, why);
        }
    }

    /// Ends every kernel.
    pub(crate) fn kill_all_kernels(&mut self, why: &str) {
        let all: Vec<(usize, u64)> = self.kernels.iter().map(|(kk, k)| (kk, k.serial)).collect();
        for (kk, s) in all {
            self.kernel_kill(kk, s, why);
        }
    }
}

/// Deletes `session` (on the pool) and says what `conn` gets: `answer` if given, else
/// the delete's own outcome (204, or the session error).
fn delete_and_answer(
    sessions: &crate::workspace::Sessions,
    session: &str,
    conn: Option<(usize, u64)>,
    answer: Option<Response>,
) -> Done<Daemon> {
    let r = sessions.delete(session);
    if let Err(e) = &r {
        if !matches!(e, crate::workspace::SessionError::NotFound) {
            log::warn!("session {session}: delete: {e}");
        }
    }
    match conn {
        Some((conn, serial)) => {
            let outcome = Outcome::Respond(answer.unwrap_or_else(|| match r {
                Ok(()) => Response::no_content(),
                Err(e) => crate::api::error::session_error(&e),
            }));
            Box::new(move |d: &mut Daemon| d.on_outcome(conn, serial, outcome))
        }
        None => super::nothing(),
    }
}

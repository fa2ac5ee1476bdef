//! The daemon: the one thread that owns a `mio::Poll`, the listener, every connection,
//! every sandbox pipe and pidfd, and the timers, and wires the features to them.
//! Blocking work goes to the worker pool; its completions come back through a channel
//! and the `mio::Waker`.
//!
//! This is the top of the import graph: it uses the faces (`api`), the core
//! (`sandbox`, `workspace`, `admission`, `netfilter`, `agent`) and the feature-free loop
//! pieces (`reactor`), and nothing imports it but `main`. One file per thing on the
//! loop: `conn` (client connections), `transfer` (pool-job requests, uploads,
//! downloads), `runs` (a sandbox run: its state and start), `output` (its pipes, SSE and
//! backpressure), `finish` (its exit, deadlines, cleanup and result),
//! `completion` (what a finished pool job does), `kernels` (a kernel's life) and
//! `kernel_steps` (its steps), `warm`, `agent`, and
//! `startup` (`Daemon::new`).

pub mod agent;
pub mod completion;
pub mod conn;
mod finish;
mod kernel_steps;
pub mod kernels;
mod output;
pub mod runs;
mod startup;
pub mod transfer;
pub mod warm;

use crate::api::App;
use crate::config::Config;
use crate::reactor::{pool, timer, Tokens};
use crate::sandbox::Backend;
use completion::Completion;
use conn::Conn;
use crossbeam_channel::Receiver;
use mio::net::TcpListener;
use mio::{Events, Poll, Token, Waker};
use runs::Run;
use slab::Slab;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The listening socket.
pub const LISTENER: Token = Token(0);
/// The pool's completion waker.
pub const WAKER: Token = Token(1);
/// The signal pipe (SIGTERM, SIGINT).
pub const SIGNALS: Token = Token(2);
/// The reload pipe (SIGHUP).
pub const RELOAD: Token = Token(3);
/// The netlink socket announcing nftables changes (egress re-verification).
pub const EGRESS: Token = Token(4);
pub(crate) const FIRST_SOURCE: usize = 5;

/// What a registered fd belongs to.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// A client connection (key in `conns`).
    Conn(usize),
    /// A run's stdout.
    Stdout(usize),
    /// A run's stderr.
    Stderr(usize),
    /// A run's stdin.
    Stdin(usize),
    /// A run's pidfd.
    Pid(usize),
    /// A download's pipe (key in `conns`).
    Transfer(usize),
    /// A kernel's control socket (key in `kernels`).
    KernelCtl(usize),
    /// A kernel's stdout or stderr between steps (nothing reads it then).
    KernelOut(usize),
    /// A kernel's pidfd.
    KernelPid(usize),
    /// A claimed pooled sandbox's exit channel (key in `runs`).
    RunCtl(usize),
}

/// What a timer is for; `gen` must match the owner's current generation to count.
#[derive(Debug, Clone, Copy)]
pub enum TimerKey {
    /// Connection deadline (head, idle or write stall), key and generation.
    Conn(usize, u64),
    /// Run deadline (wall time, output drain grace, keep-alive comment).
    Run(usize, u64),
    /// SSE keep-alive comment of a streaming run (key, serial).
    Keepalive(usize, u64),
    /// Retry accepting after EMFILE.
    Accept,
    /// Shutdown grace expired.
    ShutdownGrace,
    /// Once a second: refresh process figures, sweep rate-limit buckets.
    Housekeeping,
    /// A kernel's boot deadline or idle check (key, generation).
    Kernel(usize, u64),
    /// SSE keep-alive comment of an agent loop's stream (connection key, loop id).
    AgentKeepalive(usize, u64),
}

/// The daemon: all state owned by the reactor thread.
pub struct Daemon {
    pub(crate) cfg: Arc<Config>,
    pub(crate) poll: Poll,
    pub(crate) listener: Option<TcpListener>,
    pub(crate) local_addr: SocketAddr,
    pub(crate) conns: Slab<Conn>,
    pub(crate) runs: Slab<Run>,
    pub(crate) tokens: Tokens<Source>,
    pub(crate) timers: timer::TimerWheel<TimerKey>,
    pub(crate) pool: pool::WorkerPool<Completion>,
    pub(crate) completions: Receiver<Completion>,
    pub(crate) app: App,
    pub(crate) backend: Arc<Backend>,
    pub(crate) conn_serial: u64,
    pub(crate) run_serial: u64,
    /// Source of timer generations: one counter for every owner, so a timer armed for
    /// a connection or run whose slab key was later reused can never match the new one.
    pub(crate) timer_seq: u64,
    /// Open connections per client address (IPv6 by /64).
    pub(crate) conns_per_ip: std::collections::HashMap<std::net::IpAddr, usize>,
    /// Jobs that must run (kills, cleanups) but found the pool queue full; retried
    /// every turn of the loop, so nothing is ever dropped or run on this thread.
    overflow: std::collections::VecDeque<pool::Job<Completion>>,
    signal_rx: mio::net::UnixStream,
    reload_rx: mio::net::UnixStream,
    pub(crate) admission: crate::admission::Admission,
    shutdown_deadline: Option<Instant>,
    /// A session upkeep job is queued or running.
    pub(crate) upkeep_running: bool,
    /// When the next session upkeep is due.
    next_upkeep: Instant,
    /// An egress check is queued or running.
    pub(crate) egress_running: bool,
    /// A ruleset change was announced while a check ran: check again after it.
    pub(crate) egress_dirty: bool,
    /// A SIGHUP repair came while a check ran: program again after it.
    pub(crate) egress_repair: bool,
    /// When the next periodic egress check (and repair) is due.
    next_egress: Instant,
    /// Subscribed to nftables changes.
    egress_monitor: Option<crate::sys::netlink::NlSocket>,
    /// Live kernels.
    pub(crate) kernels: Slab<kernels::Kernel>,
    /// Session id -> its kernel's key.
    pub(crate) kernel_of: std::collections::HashMap<String, usize>,
    pub(crate) kernel_serial: u64,
    /// Why a session's kernel ended (bounded), for the next call's error.
    pub(crate) kernel_dead: std::collections::HashMap<String, String>,
    /// Sandboxes booted ahead of time.
    pub(crate) warm: crate::sandbox::warm::WarmPool,
    /// What agent loops share (settings, sessions, runtimes, how many run).
    pub(crate) agent: Arc<crate::agent::Shared>,
    /// Where agent threads send their messages (the pool's completion channel).
    pub(crate) agent_tx: crossbeam_channel::Sender<Completion>,
    /// Wakes the reactor (agent threads use it after sending).
    pub(crate) waker: Arc<Waker>,
    /// The threads agent loops run on (`None`: the agent is off).
    pub(crate) agent_threads: Option<crate::agent::AgentThreads>,
    /// Source of agent loop ids.
    pub(crate) agent_serial: u64,
}

/// Startup failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Binding or polling failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Cause.
        source: io::Error,
    },
    /// Runtime descriptors are broken.
    #[error(transparent)]
    Runtimes(#[from] crate::runtimes::RuntimeError),
    /// Keys or proxies are misconfigured.
    #[error(transparent)]
    Admission(#[from] crate::admission::AdmissionError),
}

impl Daemon {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub(crate) fn token_for(&mut self, s: Source) -> Token {
        self.tokens.insert(s)
    }

    /// Queues a job that must not be lost: into the pool, or the overflow when full.
    pub(crate) fn submit_must(&mut self, job: pool::Job<Completion>) {
        if let Err(job) = self.pool.submit(job) {
            crate::warn_limited!(
                "op=submit worker queue full; {} jobs waiting",
                self.overflow.len() + 1
            );
            self.overflow.push_back(job);
        }
    }

    fn flush_overflow(&mut self) {
        while let Some(job) = self.overflow.pop_front() {
            if let Err(job) = self.pool.submit(job) {
                self.overflow.push_front(job);
                break;
            }
        }
    }

    /// A fresh, never reused timer generation.
    pub(crate) fn next_timer_gen(&mut self) -> u64 {
        self.timer_seq += 1;
        self.timer_seq
    }

    /// Points a registered fd's token at a new owner (a kernel's pipes, lent to a step).
    pub(crate) fn retarget(&mut self, t: Token, s: Source) {
        self.tokens.retarget(t, s);
    }

    pub(crate) fn release_token(&mut self, t: Token) {
        self.tokens.release(t);
    }

    /// Serves until SIGTERM/SIGINT and every run has ended.
    ///
    /// # Errors
    /// When polling itself fails.
    pub fn run(&mut self) -> io::Result<()> {
        let teardown = Some(self.spawn_teardown()?);
        self.warm_publish();
        self.start_probe();
        self.timers.insert(
            Instant::now() + Duration::from_secs(1),
            TimerKey::Housekeeping,
        );
        if self.cfg.seccomp {
            // From here on this thread only polls, reads, writes and allocates.
            let nrs = crate::sys::seccomp::parse_allowlist(crate::sys::seccomp::REACTOR_ALLOWLIST)
                .map_err(io::Error::other)?;
            crate::sys::seccomp::install_thread_filter(&nrs)?;
            log::info!("seccomp: reactor thread limited to {} syscalls", nrs.len());
        } else {
            log::warn!("seccomp: the reactor thread's allowlist is OFF (ISOBOX_SECCOMP=0)");
        }
        let mut events = Events::with_capacity(1024);
        let mut fired = Vec::new();
        loop {
            let timeout = self.timers.next_timeout(Instant::now());
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    WAKER => self.drain_completions(),
                    SIGNALS => self.on_signal(),
                    RELOAD => {
                        drain(&mut self.reload_rx);
                        self.admission.reload();
                        // An operator's repair: program the table again and check it.
                        self.start_egress_check(true);
                    }
                    EGRESS => {
                        if let Some(m) = &self.egress_monitor {
                            let mut buf = [0u8; 8192];
                            while m.recv(&mut buf).is_ok() {}
                        }
                        self.egress_dirty = true;
                        self.start_egress_check(false);
                    }
                    t => {
                        let Some(src) = self.tokens.get(t) else {
                            continue;
                        };
                        match src {
                            Source::Conn(ck) => self.conn_event(
                                ck,
                                ev.is_readable() || ev.is_read_closed() || ev.is_error(),
                                ev.is_writable(),
                            ),
                            Source::Stdout(rk) => self.run_pipe_event(rk, false),
                            Source::Stderr(rk) => self.run_pipe_event(rk, true),
                            Source::Stdin(rk) => self.run_stdin_event(rk),
                            Source::Pid(rk) => self.run_exited(rk),
                            Source::Transfer(ck) => self.transfer_event(ck),
                            Source::KernelCtl(kk) => self.kernel_ctl_event(kk),
                            Source::KernelOut(_) => {}
                            Source::KernelPid(kk) => self.kernel_exited(kk),
                            Source::RunCtl(rk) => self.run_ctl_event(rk),
                        }
                    }
                }
            }
            // Completions can arrive between wakes; drain them every turn.
            self.drain_completions();
            self.flush_overflow();
            self.timers.advance(Instant::now(), &mut fired);
            for key in fired.drain(..) {
                match key {
                    TimerKey::Conn(ck, gen) => self.conn_timer(ck, gen),
                    TimerKey::Run(rk, gen) => self.run_timer(rk, gen),
                    TimerKey::Keepalive(rk, serial) => self.run_keepalive(rk, serial),
                    TimerKey::AgentKeepalive(ck, serial) => self.agent_keepalive(ck, serial),
                    TimerKey::Accept => self.accept(),
                    TimerKey::ShutdownGrace => {
                        self.kill_all_runs();
                        // Uploads, downloads and jobs still going get no more time.
                        self.close_unfinished_conns();
                    }
                    TimerKey::Housekeeping => self.housekeeping(),
                    TimerKey::Kernel(kk, gen) => self.kernel_timer(kk, gen),
                }
            }
            if self.shutdown_deadline.is_some()
                && self.runs.is_empty()
                && self.kernels.is_empty()
                && self.warm.idle()
                && self.overflow.is_empty()
                && self.conns_all_flushed()
            {
                break;
            }
        }
        // Nothing queued may be lost: wait for the pool to take every overflowed job
        // (yielding: this thread may not sleep), then for every job to finish.
        while !self.overflow.is_empty() {
            self.flush_overflow();
            std::thread::yield_now();
        }
        self.pool.join();
        // Only now is the slice empty. Its removal runs on the teardown thread, made
        // before the seccomp filter, since this thread may not rmdir.
        if let Some((go, handle)) = teardown {
            let _ = go.send(());
            let _ = handle.join();
        }
        log::info!("isoboxd stopped");
        Ok(())
    }

    /// A thread, unfiltered because it exists before the reactor's seccomp filter, that
    /// removes the slice and the runsc root once told to (at the very end).
    fn spawn_teardown(
        &self,
    ) -> io::Result<(crossbeam_channel::Sender<()>, std::thread::JoinHandle<()>)> {
        let (go, wait) = crossbeam_channel::bounded::<()>(1);
        let (cgroups, instance, state_root, sessions, egress) = (
            self.app.cgroups.clone(),
            self.cfg.instance.clone(),
            self.backend.state_root.clone(),
            Arc::clone(&self.app.sessions),
            Arc::clone(&self.app.egress),
        );
        let handle = std::thread::Builder::new()
            .name("isobox-teardown".into())
            .spawn(move || {
                if wait.recv().is_err() {
                    return;
                }
                sessions.unmount_all();
                egress.stop();
                if let Some(h) = &cgroups {
                    h.remove_slice(&instance);
                }
                let _ = std::fs::remove_dir(&state_root);
                if let Some(parent) = state_root.parent() {
                    let _ = std::fs::remove_dir(parent);
                }
            })?;
        Ok((go, handle))
    }

    fn housekeeping(&mut self) {
        let now = Instant::now();
        self.app.process_figures = (crate::sys::open_fd_count(), crate::sys::rss_bytes());
        self.admission.tick(now);
        // Session upkeep (last-use times, idle unmounts, TTL reaping) every 5 s, or at
        // once when the earliest expiry has passed.
        let expired = self.app.sessions.next_expiry_ms() <= crate::workspace::now_ms();
        if !self.upkeep_running && (now >= self.next_upkeep || expired) {
            let sessions = Arc::clone(&self.app.sessions);
            let job = Box::new(move || {
                match sessions.upkeep() {
                    Ok(0) => {}
                    Ok(n) => log::info!("sessions: reaped {n} idle past their ttl"),
                    Err(e) => log::error!("session upkeep: {e}"),
                }
                // Freed memory (a burst of connections, a large response) goes back to
                // the kernel rather than staying in glibc's arenas.
                crate::sys::malloc_trim();
                Completion::Upkeep
            });
            if self.pool.submit(job).is_ok() {
                self.upkeep_running = true;
                self.next_upkeep = now + Duration::from_secs(5);
            }
        }
        // Refills after a failed boot wait out their pause; retried from here.
        self.warm_fill();
        if now >= self.next_egress || self.egress_dirty {
            self.start_egress_check(false);
        }
        self.timers
            .insert(now + Duration::from_secs(1), TimerKey::Housekeeping);
    }

    /// Queues an egress check on the pool: `repair` programs the table first (SIGHUP);
    /// the periodic check re-programs only a table found wrong; a netlink change only
    /// reads it back. One at a time; a change seen meanwhile is checked after.
    pub(crate) fn start_egress_check(&mut self, repair: bool) {
        if !self.app.egress.enabled() || self.app.shutting_down {
            return;
        }
        if self.egress_running {
            self.egress_repair |= repair;
            self.egress_dirty = true;
            return;
        }
        let repair = repair || std::mem::take(&mut self.egress_repair);
        let now = Instant::now();
        let periodic = now >= self.next_egress;
        let egress = Arc::clone(&self.app.egress);
        let job = Box::new(move || {
            if repair {
                egress.program_and_verify();
            } else if periodic {
                egress.tick();
            } else {
                egress.verify();
            }
            Completion::EgressChecked
        });
        if self.pool.submit(job).is_ok() {
            self.egress_running = true;
            self.egress_dirty = false;
            if periodic || repair {
                self.next_egress = now + Duration::from_secs(self.cfg.egress.verify_sec);
            }
        }
    }

    fn drain_completions(&mut self) {
        while let Ok(c) = self.completions.try_recv() {
            self.on_completion(c);
        }
    }

    fn accept(&mut self) {
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            match listener.accept() {
                Ok((stream, peer)) => self.add_conn(stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE/ENFILE: the pending connection stays queued; retry shortly
                    // instead of spinning on an edge that will not re-fire.
                    crate::error_limited!("op=accept err={e}");
                    self.timers
                        .insert(Instant::now() + Duration::from_millis(50), TimerKey::Accept);
                    return;
                }
            }
        }
    }

    fn on_signal(&mut self) {
        drain(&mut self.signal_rx);
        if self.shutdown_deadline.is_some() {
            log::warn!("second signal: killing running executions now");
            self.kill_all_runs();
            return;
        }
        log::info!(
            "shutting down: no new connections, {} running executions get {} ms",
            self.runs.len(),
            self.cfg.shutdown_grace_ms
        );
        self.app.shutting_down = true;
        // Idle kernels have nothing to finish; busy ones get the grace with the runs.
        self.kill_idle_kernels("the daemon is shutting down");
        self.agent_stop_all();
        self.warm_drain();
        let deadline = Instant::now() + Duration::from_millis(self.cfg.shutdown_grace_ms);
        self.shutdown_deadline = Some(deadline);
        self.timers.insert(deadline, TimerKey::ShutdownGrace);
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        self.close_idle_conns();
    }
}

/// Reads a signal pipe empty.
fn drain(rx: &mut mio::net::UnixStream) {
    let mut buf = [0u8; 64];
    loop {
        match io::Read::read(rx, &mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}

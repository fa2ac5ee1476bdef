//! The event loop: one thread owning a `mio::Poll`, the listener, every connection,
//! every sandbox pipe and pidfd, and a timer wheel. Blocking work goes to the worker
//! pool; its completions come back through a channel and the `mio::Waker`.
//!
//! This module knows sockets, tokens and timers; HTTP framing lives in `http`, the
//! connection state machine in `conn`, the run state machine in `sandbox::events`.

pub mod conn;
pub mod pool;
pub mod timer;
pub mod transfer;

use crate::api::{App, Counters, ProbeState};
use crate::config::Config;
use crate::runtimes::Runtimes;
use crate::sandbox::events::{Completion, Run};
use crate::sandbox::Backend;
use conn::Conn;
use crossbeam_channel::Receiver;
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};
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
const FIRST_SOURCE: usize = 5;

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
    pub(crate) sources: Slab<Source>,
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
    pub(crate) kernels: Slab<crate::sandbox::kernel::Kernel>,
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

/// A pipe the handlers of `signals` write a byte to, registered on `poll` as `token`.
fn signal_pipe(signals: &[i32], poll: &Poll, token: Token) -> io::Result<mio::net::UnixStream> {
    let (tx, rx) = std::os::unix::net::UnixStream::pair()?;
    tx.set_nonblocking(true)?;
    rx.set_nonblocking(true)?;
    for &sig in signals {
        signal_hook::low_level::pipe::register(sig, tx.try_clone()?)?;
    }
    let mut rx = mio::net::UnixStream::from_std(rx);
    poll.registry()
        .register(&mut rx, token, Interest::READABLE)?;
    Ok(rx)
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

impl Daemon {
    /// Sets everything up: sweep, slice, listener, pool, signals. Does not serve yet.
    ///
    /// # Errors
    /// [`DaemonError`] when the port cannot be bound or descriptors are broken.
    pub fn new(cfg: Config) -> Result<Daemon, DaemonError> {
        let cfg = Arc::new(cfg);
        let admission = crate::admission::Admission::new(cfg.admission.clone())?;
        if !admission.keys_configured() {
            log::info!("api keys: none configured; the API is open (one public tenant)");
        } else if cfg.admission.memory_require_key && !cfg.admission.require_auth {
            log::warn!(
                "api keys: required on /v1/memory and /v1/volumes only (ISOBOX_MEMORY_REQUIRE_KEY=1): every other route is open to the shared public tenant; set ISOBOX_REQUIRE_AUTH=1 to require keys everywhere"
            );
        } else {
            log::info!("api keys: required on every route but health and docs");
        }
        let runtimes = Arc::new(Runtimes::load(
            cfg.runtimes_dir.as_deref(),
            &cfg.rootfs_dir,
        )?);
        for r in runtimes.all() {
            match &r.missing {
                None => log::info!(
                    "runtime={} version={} rootfs={}",
                    r.desc.language,
                    r.version.as_deref().unwrap_or("?"),
                    r.rootfs_path.display()
                ),
                Some(why) => log::warn!("runtime={} not installed: {why}", r.desc.language),
            }
        }
        // Bind first: a daemon that cannot have its port must not create (or sweep)
        // anything.
        let std_listener = std::net::TcpListener::bind(cfg.listen)
            .map_err(io_err(format!("binding {}", cfg.listen)))?;
        let (cgroups, cgroup_error) =
            match crate::cgroup::Hierarchy::detect(std::path::Path::new("/sys/fs/cgroup")) {
                Ok(h) => (Some(h), None),
                Err(e) => (None, Some(e.to_string())),
            };
        let runs_dir = cfg.data_dir.join("runs");
        let state_root = std::path::Path::new("/run/isobox")
            .join(&cfg.instance)
            .join("runsc");
        for d in [&cfg.data_dir, &runs_dir, &state_root] {
            std::fs::create_dir_all(d).map_err(io_err(format!("creating {}", d.display())))?;
        }
        let backend = Arc::new(Backend {
            runsc: cfg.runsc.clone(),
            platform: cfg.platform.clone(),
            state_root,
            runs_dir,
            instance: cfg.instance.clone(),
            cgroups: cgroups.clone(),
            egress: None,
        });
        let swept = backend.sweep();
        if swept > 0 {
            log::warn!(
                "startup sweep removed {swept} leftovers of a previous instance={}",
                cfg.instance
            );
        }
        let mut cgroup_error = cgroup_error;
        if let Some(h) = &cgroups {
            match h.ensure_slice(&cfg.instance, cfg.slice_memory_bytes) {
                Ok(()) => log::info!(
                    "cgroup={} slice={} memory_cap={}",
                    h.version(),
                    cfg.instance,
                    cfg.slice_memory_bytes
                ),
                Err(e) => {
                    log::error!("protective slice: {e}");
                    cgroup_error = Some(e.to_string());
                }
            }
        }
        let sessions = Arc::new(
            crate::workspace::Sessions::open(&cfg.data_dir, cfg.sessions.clone())
                .map_err(|e| io_err("opening sessions")(io::Error::other(e.to_string())))?,
        );
        // After the sessions' sweep: egress makes the data dir a shared mount, which
        // would hide mounts a crash left below it.
        let egress = crate::netfilter::Egress::new(&cfg);
        egress.start();
        let poll = Poll::new().map_err(io_err("creating poll"))?;
        let egress_monitor = if egress.enabled() {
            match egress.monitor() {
                Ok(s) => {
                    poll.registry()
                        .register(
                            &mut mio::unix::SourceFd(&std::os::fd::AsRawFd::as_raw_fd(s.fd())),
                            EGRESS,
                            Interest::READABLE,
                        )
                        .map_err(io_err("register egress monitor"))?;
                    Some(s)
                }
                Err(e) => {
                    // Periodic checks still run; changes are only seen later.
                    log::warn!("egress: cannot subscribe to nftables changes: {e}");
                    None
                }
            }
        } else {
            log::info!("egress: off (ISOBOX_EGRESS=off); every run is offline");
            None
        };
        std_listener
            .set_nonblocking(true)
            .map_err(io_err("listener nonblocking"))?;
        let local_addr = std_listener.local_addr().map_err(io_err("local_addr"))?;
        let mut listener = TcpListener::from_std(std_listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(io_err("register listener"))?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(io_err("creating waker"))?);
        let (tx, rx) = pool::completion_channel();
        let agent_tx = tx.clone();
        let pool = pool::WorkerPool::start(cfg.workers, tx, Arc::clone(&waker))
            .map_err(io_err("starting workers"))?;
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let signal_rx =
            signal_pipe(&[SIGTERM, SIGINT], &poll, SIGNALS).map_err(io_err("signal pipe"))?;
        let reload_rx = signal_pipe(&[SIGHUP], &poll, RELOAD).map_err(io_err("reload pipe"))?;
        let app = App {
            cfg: Arc::clone(&cfg),
            runtimes,
            cgroups,
            cgroup_error,
            probe: ProbeState::Pending,
            in_flight: 0,
            counters: Counters::default(),
            shutting_down: false,
            process_figures: (crate::sys::open_fd_count(), crate::sys::rss_bytes()),
            sessions,
            egress: Arc::clone(&egress),
            kernels_used: 0,
            warm: None,
        };
        // Runs lease their networks through the backend.
        let backend = Arc::new(Backend {
            egress: egress.enabled().then_some(egress),
            ..(*backend).clone()
        });
        let egress_verify_sec = cfg.egress.verify_sec;
        // Pools by canonical runtime name; a name that is not an installed Python
        // runtime is refused at startup rather than ignored.
        let mut targets = Vec::new();
        for (name, n) in &cfg.warm_pool {
            let Some(rt) = app.runtimes.resolve(name) else {
                log::warn!("warm pool: {name} is not an installed runtime; no pool for it");
                continue;
            };
            if crate::sandbox::warm::kind(&rt.desc).is_none() {
                return Err(io_err("ISOBOX_WARM_POOL")(io::Error::other(format!(
                    "{name}: warm pools exist for Python, JavaScript (node), Ruby and compiled runtimes only"
                ))));
            }
            targets.push((rt.desc.language.clone(), *n));
        }
        let warm = crate::sandbox::warm::WarmPool::new(targets, cfg.egress.enabled);
        let agent = Arc::new(crate::agent::Shared {
            cfg: cfg.ai.clone(),
            sessions: Arc::clone(&app.sessions),
            runtimes: Arc::clone(&app.runtimes),
            running: std::sync::atomic::AtomicUsize::new(0),
        });
        let agent_threads = if cfg.ai.enabled() {
            if let Some(base) = cfg
                .ai
                .base
                .as_deref()
                .and_then(|b| b.strip_prefix("http://"))
            {
                let host = base.split(['/', '@']).next().unwrap_or("");
                if !(host.starts_with("127.")
                    || host.starts_with("localhost")
                    || host.starts_with("[::1]"))
                {
                    log::warn!("agent: ISOBOX_AI_BASE is plain http to another host: the model key travels unencrypted");
                }
            }
            // Twice the loops that may run: a loop whose client left may still be
            // finishing its current upstream read (bounded by ISOBOX_AI_TIMEOUT_SEC).
            Some(
                crate::agent::AgentThreads::start(2 * Daemon::agents_max(&cfg))
                    .map_err(io_err("starting agent threads"))?,
            )
        } else {
            None
        };
        Ok(Daemon {
            cfg,
            poll,
            listener: Some(listener),
            local_addr,
            conns: Slab::new(),
            runs: Slab::new(),
            sources: Slab::new(),
            timers: timer::TimerWheel::new(Instant::now()),
            pool,
            completions: rx,
            app,
            backend,
            conn_serial: 0,
            run_serial: 0,
            timer_seq: 0,
            conns_per_ip: std::collections::HashMap::new(),
            overflow: std::collections::VecDeque::new(),
            signal_rx,
            reload_rx,
            admission,
            shutdown_deadline: None,
            upkeep_running: false,
            next_upkeep: Instant::now(),
            egress_running: false,
            egress_dirty: false,
            egress_repair: false,
            next_egress: Instant::now() + Duration::from_secs(egress_verify_sec),
            egress_monitor,
            kernels: Slab::new(),
            kernel_of: std::collections::HashMap::new(),
            kernel_serial: 0,
            kernel_dead: std::collections::HashMap::new(),
            warm,
            agent,
            agent_tx,
            waker,
            agent_threads,
            agent_serial: 0,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub(crate) fn token_for(&mut self, s: Source) -> Token {
        Token(self.sources.insert(s) + FIRST_SOURCE)
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
        if let Some(slot) =
            t.0.checked_sub(FIRST_SOURCE)
                .and_then(|i| self.sources.get_mut(i))
        {
            *slot = s;
        }
    }

    pub(crate) fn release_token(&mut self, t: Token) {
        if t.0 >= FIRST_SOURCE && self.sources.contains(t.0 - FIRST_SOURCE) {
            self.sources.remove(t.0 - FIRST_SOURCE);
        }
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
                        let Some(&src) = self.sources.get(t.0 - FIRST_SOURCE) else {
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
                crate::sandbox::events::Completion::Upkeep
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
            crate::sandbox::events::Completion::EgressChecked
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

//! `Daemon::new`: everything the daemon sets up before it serves, in order: runtimes,
//! the listener (bound first, so a daemon that cannot have its port creates nothing),
//! cgroups and the startup sweep, sessions, egress, the poll and its fixed tokens, the
//! worker pool, signals, the warm pool's targets and the agent's threads.

use super::{
    pool, timer, Daemon, DaemonError, Tokens, EGRESS, FIRST_SOURCE, LISTENER, RELOAD, SIGNALS,
    WAKER,
};
use crate::admission::slots::{SlotKind, Slots};
use crate::api::{App, Counters, ProbeState};
use crate::config::Config;
use crate::runtimes::Runtimes;
use crate::sandbox::Backend;
use mio::net::TcpListener;
use mio::{Interest, Poll, Token, Waker};
use slab::Slab;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
        let egress = crate::netfilter::Egress::new(&cfg.egress, &cfg.instance, &cfg.data_dir);
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
            runs: Slots::new(SlotKind::Execution, cfg.max_concurrent),
            counters: Counters::default(),
            shutting_down: false,
            process_figures: (crate::sys::open_fd_count(), crate::sys::rss_bytes()),
            sessions,
            egress: Arc::clone(&egress),
            kernels: Slots::new(SlotKind::Kernel, cfg.kernels_max),
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
            tokens: Tokens::new(FIRST_SOURCE),
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
}

//! `Daemon::new`: everything the daemon sets up before it serves, in order: runtimes,
//! the listener (bound first, so a daemon that cannot have its port creates nothing),
//! cgroups and the startup sweep, sessions, egress, the poll and its fixed tokens, the
//! worker pool, signals, the warm pool's targets and the agent's threads.

use super::{Daemon, DaemonError, LIFECYCLE, RELOAD, SIGNALS};
use crate::admission::slots::{SlotKind, Slots};
use crate::api::{App, Counters, ProbeState};
use crate::config::Config;
use crate::reactor::{Addr, Reactor};
use crate::runtimes::Runtimes;
use crate::sandbox::{Backend, Gvisor};
use mio::net::TcpListener;
use mio::Interest;
use slab::Slab;
use std::io;
use std::sync::Arc;
use std::time::Instant;

/// A pipe the handlers of `signals` write a byte to, registered as `what` of the
/// daemon's own component.
fn signal_pipe(
    signals: &[i32],
    reactor: &mut Reactor<Daemon>,
    what: u16,
) -> io::Result<mio::net::UnixStream> {
    let (tx, rx) = std::os::unix::net::UnixStream::pair()?;
    tx.set_nonblocking(true)?;
    rx.set_nonblocking(true)?;
    for &sig in signals {
        signal_hook::low_level::pipe::register(sig, tx.try_clone()?)?;
    }
    let mut rx = mio::net::UnixStream::from_std(rx);
    reactor.register(&mut rx, Addr::new(LIFECYCLE, 0, what), Interest::READABLE)?;
    Ok(rx)
}

/// The backend: given (the tests' seam), or gVisor, finished once egress exists.
enum Made {
    Given(Arc<dyn Backend>),
    Gvisor(Box<Gvisor>),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

/// Where the lock of `instance` lives (holding the pid of the daemon that has it).
pub fn lock_path(instance: &str) -> std::path::PathBuf {
    std::path::Path::new("/run/isobox").join(format!("{instance}.lock"))
}

/// Takes the lock of `instance` (an exclusive `flock` on `/run/isobox/<instance>.lock`,
/// holding our pid), or says which daemon has it. A lock dies with its holder, so a
/// crashed daemon never blocks the next; the file is removed at a clean exit, and
/// the lock is taken again if it was removed between our open and our lock.
fn lock_instance(instance: &str) -> Result<(std::fs::File, std::path::PathBuf), DaemonError> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::MetadataExt;
    let path = lock_path(instance);
    let what = || format!("taking the instance lock {}", path.display());
    std::fs::create_dir_all("/run/isobox").map_err(io_err(what()))?;
    // A lock whose recorded holder is gone is waited for a little: a process it was
    // starting when it died may still hold a copy of the descriptor until its exec.
    let mut orphan_waits = 0;
    // 8 tries for a file removed under us, and the waits above.
    for _ in 0..58 {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(what()))?;
        if !crate::sys::try_lock_exclusive(&f).map_err(io_err(what()))? {
            let mut pid = String::new();
            let _ = f.read_to_string(&mut pid);
            let pid = pid.trim().to_string();
            let alive = !pid.is_empty() && std::path::Path::new("/proc").join(&pid).exists();
            if !alive && orphan_waits < 50 {
                orphan_waits += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            let who = if alive {
                format!("is running (pid {pid})")
            } else {
                format!(
                    "left it held (pid {pid} is gone; a process it started still holds the lock)"
                )
            };
            return Err(DaemonError::Io {
                what: format!(
                    "another isoboxd of instance {instance:?} {who}; two daemons of one instance would remove each other's sandboxes: give this one its own ISOBOX_INSTANCE"
                ),
                source: io::Error::other("the instance lock is held"),
            });
        }
        let same = match (f.metadata(), std::fs::metadata(&path)) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
            _ => false,
        };
        if !same {
            // A daemon that was exiting removed it after our open: lock the new one.
            continue;
        }
        f.set_len(0).map_err(io_err(what()))?;
        f.rewind().map_err(io_err(what()))?;
        f.write_all(format!("{}\n", std::process::id()).as_bytes())
            .map_err(io_err(what()))?;
        return Ok((f, path));
    }
    Err(DaemonError::Io {
        what: what(),
        source: io::Error::other("the lock file kept changing"),
    })
}

impl Daemon {
    /// Sets everything up: sweep, slice, listener, pool, signals. Does not serve yet.
    ///
    /// # Errors
    /// [`DaemonError`] when the port cannot be bound or descriptors are broken.
    pub fn new(cfg: Config) -> Result<Daemon, DaemonError> {
        Self::build(cfg, None, None)
    }

    /// [`Daemon::new`] with the host's parts given instead (the seam of the loop's own
    /// tests): `backend` instead of gVisor, cgroups and the startup sweep, and
    /// `signals`, the read ends of the shutdown and reload pipes, instead of the
    /// process's SIGTERM, SIGINT and SIGHUP handlers.
    pub(crate) fn build(
        cfg: Config,
        given: Option<Arc<dyn Backend>>,
        signals: Option<(
            std::os::unix::net::UnixStream,
            std::os::unix::net::UnixStream,
        )>,
    ) -> Result<Daemon, DaemonError> {
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
                // A further version is built only when the operator asks for it.
                Some(why) if !r.default => log::info!(
                    "runtime={} further version not installed: {why}",
                    r.desc.language
                ),
                Some(why) => log::warn!("runtime={} not installed: {why}", r.desc.language),
            }
        }
        // Bind first: a daemon that cannot have its port must not create (or sweep)
        // anything.
        let std_listener = std::net::TcpListener::bind(cfg.listen)
            .map_err(io_err(format!("binding {}", cfg.listen)))?;
        // Then the instance's lock: a second daemon of one instance would sweep the
        // first one's live sandboxes (the loop's own tests, on their fake backend,
        // sweep nothing and take none).
        let fake = given.is_some();
        let instance_lock = match given {
            Some(_) => None,
            None => Some(lock_instance(&cfg.instance)?),
        };
        std::fs::create_dir_all(&cfg.data_dir)
            .map_err(io_err(format!("creating {}", cfg.data_dir.display())))?;
        let mut root_images = None;
        let (cgroups, mut cgroup_error, made) = match given {
            Some(b) => (
                None,
                Some(format!("not used by the {} backend", b.name())),
                Made::Given(b),
            ),
            None => {
                let (cgroups, cgroup_error) = match crate::cgroup::Hierarchy::detect(
                    std::path::Path::new("/sys/fs/cgroup"),
                ) {
                    Ok(h) => (Some(h), None),
                    Err(e) => (None, Some(e.to_string())),
                };
                let runs_dir = cfg.data_dir.join("runs");
                let state_root = std::path::Path::new("/run/isobox")
                    .join(&cfg.instance)
                    .join("runsc");
                for d in [&runs_dir, &state_root] {
                    std::fs::create_dir_all(d)
                        .map_err(io_err(format!("creating {}", d.display())))?;
                }
                // isobox-start for image runs, and the images, when both can be had.
                let start_exec = crate::sandbox::start::BINARY.and_then(|bin| {
                    crate::sys::sealed_memfd(c"isobox-start", bin)
                        .map_err(|e| {
                            log::warn!(
                                "isobox-start memfd: {e}; cold runs use their runtime's tree"
                            )
                        })
                        .ok()
                        .map(Arc::new)
                });
                root_images = match (cfg.root_images, crate::sandbox::start::BINARY) {
                    (true, Some(loader)) if start_exec.is_some() => {
                        crate::sandbox::image::RootImages::new(
                            cfg.image_dir.clone(),
                            std::path::PathBuf::from("/usr/bin/mkfs.erofs"),
                            &cfg.runsc,
                            loader,
                        )
                        .map(Arc::new)
                    }
                    _ => None,
                };
                let gvisor = Gvisor {
                    runsc: cfg.runsc.clone(),
                    platform: cfg.platform.clone(),
                    state_root,
                    runs_dir,
                    instance: cfg.instance.clone(),
                    cgroups: cgroups.clone(),
                    egress: None,
                    start_hook: crate::sandbox::start::install_hook(&cfg.data_dir),
                    images: root_images.clone(),
                    start_exec,
                };
                (cgroups, cgroup_error, Made::Gvisor(Box::new(gvisor)))
            }
        };
        let swept = match &made {
            Made::Given(b) => b.sweep(),
            Made::Gvisor(g) => g.sweep(),
        };
        if swept > 0 {
            log::warn!(
                "startup sweep removed {swept} leftovers of a previous instance={}",
                cfg.instance
            );
        }
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
        // The gate (allowlisted sandboxes' web traffic) listens on every address, on a
        // port of the kernel's choosing that the table's rules name; the table lets
        // only redirected sandbox connections reach it.
        let gate_listener = if cfg.egress.enabled {
            let l = std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))
                .map_err(io_err("binding the egress gate"))?;
            l.set_nonblocking(true)
                .map_err(io_err("egress gate nonblocking"))?;
            Some(l)
        } else {
            None
        };
        let gate_port = gate_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map_or(0, |a| a.port());
        let egress =
            crate::netfilter::Egress::new(&cfg.egress, &cfg.instance, &cfg.data_dir, gate_port);
        egress.start();
        let mut reactor: Reactor<Daemon> =
            Reactor::new(cfg.workers).map_err(io_err("starting the reactor"))?;
        for (id, c) in super::components() {
            reactor.add(id, c);
        }
        let egress_checks =
            super::egress::Checks::new(&egress, cfg.egress.verify_sec, &mut reactor)
                .map_err(io_err("register egress monitor"))?;
        std_listener
            .set_nonblocking(true)
            .map_err(io_err("listener nonblocking"))?;
        let local_addr = std_listener.local_addr().map_err(io_err("local_addr"))?;
        let mut gate = super::gate::Gate::default();
        if let Some(l) = gate_listener {
            let mut l = TcpListener::from_std(l);
            let t = reactor
                .register(
                    &mut l,
                    Addr::new(super::gate::GATE, 0, super::gate::LISTENER),
                    Interest::READABLE,
                )
                .map_err(io_err("register the egress gate"))?;
            gate.listener = Some((l, t));
        }
        let mut listener = TcpListener::from_std(std_listener);
        let listener_token = reactor
            .register(
                &mut listener,
                Addr::new(super::conn::HTTP, 0, super::conn::LISTENER),
                Interest::READABLE,
            )
            .map_err(io_err("register listener"))?;
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let (signal_rx, reload_rx) = match signals {
            None => (
                signal_pipe(&[SIGTERM, SIGINT], &mut reactor, SIGNALS)
                    .map_err(io_err("signal pipe"))?,
                signal_pipe(&[SIGHUP], &mut reactor, RELOAD).map_err(io_err("reload pipe"))?,
            ),
            Some((term, reload)) => {
                let mut pipes = [term, reload].map(mio::net::UnixStream::from_std);
                for (rx, what) in pipes.iter_mut().zip([SIGNALS, RELOAD]) {
                    reactor
                        .register(rx, Addr::new(LIFECYCLE, 0, what), Interest::READABLE)
                        .map_err(io_err("signal pipe"))?;
                }
                let [term, reload] = pipes;
                (term, reload)
            }
        };
        let app = App {
            cfg: Arc::clone(&cfg),
            runtimes,
            cgroups,
            cgroup_error,
            probe: ProbeState::Pending,
            runs: Slots::new(SlotKind::Execution, cfg.max_concurrent),
            counters: Counters::default(),
            shutting_down: false,
            process_figures: (
                crate::sys::open_fd_count(),
                crate::sys::rss_bytes(),
                crate::sys::alloc::heap_figures(),
            ),
            sessions,
            egress: Arc::clone(&egress),
            kernels: crate::admission::KernelSlots::new(
                cfg.kernels_max,
                cfg.kernels_per_client,
                cfg.kernels_per_tenant,
                std::time::Duration::from_secs(cfg.kernel_evict_idle_sec),
            ),
            warm: None,
            wbx_warm: None,
            metrics: crate::metrics::Metrics::default(),
            root_images,
        };
        // Runs lease their networks through the backend.
        let backend: Arc<dyn Backend> = match made {
            Made::Given(b) => b,
            Made::Gvisor(g) => Arc::new(Gvisor {
                egress: egress.enabled().then_some(egress),
                ..*g
            }),
        };
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
        // Ceilings by canonical name too; a runtime without a pool has none.
        let ceilings = cfg
            .warm_pool_max
            .iter()
            .filter_map(|(name, n)| {
                let Some(rt) = app.runtimes.resolve(name) else {
                    log::warn!(
                        "warm pool: {name} in ISOBOX_WARM_POOL_MAX is not an installed runtime"
                    );
                    return None;
                };
                Some((rt.desc.language.clone(), *n))
            })
            .collect();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let warm = crate::sandbox::warm::WarmPool::new(
            targets,
            ceilings,
            f64::from(cfg.warm_pool_cpu) / 100.0 * cpus as f64,
            std::time::Duration::from_secs(cfg.warm_pool_window_sec),
            cfg.egress.enabled,
        );
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
        // The eryx face's engine, out of process (never on the loop's fake backend).
        let wasm = match (&cfg.eryx.worker, fake) {
            (Some(worker), false) => Some(
                crate::wasm::Engine::start(
                    cfg.eryx.clone(),
                    worker.clone(),
                    cfg.data_dir.join(super::eryx_envs::ENVS_DIR),
                    app.cgroups.clone(),
                    cfg.instance.clone(),
                )
                .map_err(io_err("starting the WebAssembly supervisor"))?,
            ),
            _ => None,
        };
        let cfg_public = cfg.public.clone();
        // Without its thread no job's event would be written (they would be lost
        // while submits still took webhook URLs): no daemon rather.
        let webhooks = cfg
            .wbx
            .jobs
            .webhooks
            .then(|| {
                crate::webhooks::Deliveries::start(
                    Arc::clone(&app.sessions),
                    crate::webhooks::Policy {
                        loopback: cfg.wbx.jobs.webhook_loopback,
                        deny: cfg.egress.deny.clone(),
                    },
                )
            })
            .transpose()
            .map_err(io_err("starting the webhook delivery thread"))?;
        let d = Daemon {
            wasm,
            eryx_running: std::collections::HashMap::new(),
            eryx_sessions: super::eryx_sessions::load(app.sessions.store()),
            eryx_envs: super::eryx_envs::load(app.sessions.store(), &cfg.data_dir),
            eryx_env_pending: std::sync::Arc::default(),
            jobs: super::jobs::load(
                app.sessions.store(),
                &cfg.data_dir,
                &super::jobs::prices_of(&cfg.wbx.jobs),
                cfg.wbx.jobs.webhooks,
            ),
            webhooks,
            cfg,
            reactor,
            listener: Some((listener, listener_token)),
            local_addr,
            conns: Slab::new(),
            runs: Slab::new(),
            records: super::records::Table::default(),
            batches: Slab::new(),
            batch_serial: 0,
            app,
            backend,
            conn_serial: 0,
            run_serial: 0,
            conns_per_ip: std::collections::HashMap::new(),
            signal_rx,
            reload_rx,
            admission,
            shutdown_deadline: None,
            upkeep_running: false,
            next_upkeep: Instant::now(),
            egress: egress_checks,
            kernels: Slab::new(),
            kernel_of: std::collections::HashMap::new(),
            kernel_serial: 0,
            kernel_dead: std::collections::HashMap::new(),
            warm,
            agent,
            agent_threads,
            boxes: Default::default(),
            agent_serial: 0,
            proxies: Slab::new(),
            proxy_serial: 0,
            proxy_buf: Vec::new(),
            gate,
            url_key: {
                use ring::rand::SecureRandom;
                let mut k = [0u8; 32];
                ring::rand::SystemRandom::new()
                    .fill(&mut k)
                    .map_err(|_| DaemonError::Io {
                        what: "drawing the public-URL key".into(),
                        source: io::Error::other("the system's random source failed"),
                    })?;
                ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &k)
            },
            instance_lock,
            public: {
                let mut p = cfg_public;
                if p.port == Some(0) {
                    p.port = Some(local_addr.port());
                }
                p
            },
        };
        // The recovery above may have written jobs' ends and their events.
        if let Some(w) = &d.webhooks {
            w.nudge();
        }
        Ok(d)
    }
}

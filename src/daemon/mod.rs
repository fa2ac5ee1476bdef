//! The daemon: the host of the reactor (`reactor::Reactor`), holding the state of every
//! component on the loop, and the components themselves. Each component is a unit
//! struct implementing `reactor::Component` with its id and its own source and timer
//! numbers, beside the state it acts on: `conn::Http` (the listener and client
//! connections), `transfer::Transfers` (download pipes), `runs::Runs` (a sandbox run's
//! pipes, pidfd and deadlines; `output` and `finish` hold the rest of a run's life),
//! `kernels::Kernels` (a kernel's control socket, pidfd and deadline; its steps are
//! `kernel_steps`), `records::Records` (streamed and detached runs' records and the
//! clients reading them), `agent::Agents` (agent loops' keep-alives), `egress::EgressChecks`
//! (the nftables monitor) and `Lifecycle` here (signals, reload, housekeeping, the
//! shutdown grace). Blocking work goes to the pool as a job whose continuation the loop
//! applies to the daemon; `warm` (the pool of pre-booted sandboxes) lives on those.
//!
//! This is the top of the import graph: it uses the faces (`api`), the core
//! (`sandbox`, `workspace`, `admission`, `netfilter`, `agent`) and the feature-free loop
//! (`reactor`), and nothing imports it but `main`. `startup` is `Daemon::new`.

pub mod agent;
mod batch;
mod box_exec;
mod box_files;
mod box_procs;
mod box_term;
mod box_transfer;
mod box_verbs;
mod box_watch;
pub mod boxes;
pub mod conn;
pub mod egress;
mod eryx;
mod eryx_envs;
mod eryx_sessions;
mod faces;
mod finish;
mod gate;
mod jobs;
mod kernel_steps;
pub mod kernels;
mod output;
mod proxy;
mod records;
pub mod runs;
mod sink;
mod startup;
pub use startup::lock_path;
pub mod transfer;
pub mod warm;

#[cfg(test)]
mod tests;

use crate::api::App;
use crate::config::Config;
use crate::reactor::{Addr, Component, ComponentId, Done, Host, Reactor, Readiness};
use crate::sandbox::Backend;
use conn::Client;
use mio::net::TcpListener;
use runs::Run;
use slab::Slab;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The daemon's own component: signals, reload, housekeeping and the shutdown grace.
pub(crate) const LIFECYCLE: ComponentId = ComponentId(0);
/// `LIFECYCLE`'s sources and timers.
const SIGNALS: u16 = 0;
const RELOAD: u16 = 1;
const HOUSEKEEPING: u16 = 2;
const SHUTDOWN_GRACE: u16 = 3;

/// Every component, in the order of their ids (checked by `Reactor::add` at startup).
fn components() -> [(ComponentId, &'static dyn Component<Daemon>); 12] {
    [
        (LIFECYCLE, &Lifecycle),
        (conn::HTTP, &conn::Http),
        (transfer::TRANSFER, &transfer::Transfers),
        (runs::RUNS, &runs::Runs),
        (kernels::KERNELS, &kernels::Kernels),
        (agent::AGENT, &agent::Agents),
        (egress::EGRESS, &egress::EgressChecks),
        (boxes::BOXES, &boxes::Boxes),
        (proxy::PROXY, &proxy::Proxies),
        (gate::GATE, &gate::Gates),
        (records::RECORDS, &records::Records),
        (jobs::JOBS, &jobs::Jobs),
    ]
}

/// A continuation that does nothing (a kill, a removal: jobs with nothing to report).
/// See [`Daemon::container_id`].
fn container_id(instance: &str, pid: u32, kind: &str, serial: u64) -> String {
    format!("{instance}-{pid:x}-{kind}{serial}.")
}

pub(crate) fn nothing() -> Done<Daemon> {
    Box::new(|_| {})
}

/// The daemon: all state owned by the reactor thread.
pub struct Daemon {
    pub(crate) cfg: Arc<Config>,
    pub(crate) reactor: Reactor<Daemon>,
    pub(crate) listener: Option<(TcpListener, mio::Token)>,
    pub(crate) local_addr: SocketAddr,
    pub(crate) conns: Slab<Client>,
    pub(crate) runs: Slab<Run>,
    /// Many-input requests on their way.
    pub(crate) batches: Slab<batch::Batch>,
    pub(crate) batch_serial: u64,
    /// Streamed and detached runs' records, for clients that reconnect.
    pub(crate) records: records::Table,
    pub(crate) app: App,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) conn_serial: u64,
    pub(crate) run_serial: u64,
    /// Open connections per client address (IPv6 by /64).
    pub(crate) conns_per_ip: std::collections::HashMap<std::net::IpAddr, usize>,
    signal_rx: mio::net::UnixStream,
    reload_rx: mio::net::UnixStream,
    pub(crate) admission: crate::admission::Admission,
    shutdown_deadline: Option<Instant>,
    /// A session upkeep job is queued or running.
    pub(crate) upkeep_running: bool,
    /// When the next session upkeep is due.
    next_upkeep: Instant,
    /// Egress checks: one at a time, periodic, on change and on SIGHUP.
    pub(crate) egress: egress::Checks,
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
    /// The threads agent loops run on (`None`: the agent is off).
    pub(crate) agent_threads: Option<crate::agent::AgentThreads>,
    /// Source of agent loop ids.
    pub(crate) agent_serial: u64,
    /// Long-lived sandboxes (the WBX face's).
    pub(crate) boxes: boxes::Table,
    /// Connections to sandboxes' public URLs.
    pub(crate) proxies: Slab<proxy::ProxyConn>,
    pub(crate) proxy_serial: u64,
    /// The proxy's read buffer, shared by every connection (64 KiB once used).
    pub(crate) proxy_buf: Vec<u8>,
    /// Allowlisted sandboxes' web connections.
    pub(crate) gate: gate::Gate,
    /// The key public-URL tokens are derived with (drawn at start, never stored).
    pub(crate) url_key: ring::hmac::Key,
    /// Where public URLs live (the listening port filled in).
    pub(crate) public: crate::config::PublicUrls,
    /// The eryx face's WebAssembly engine (`None`: the face is off).
    pub(crate) wasm: Option<crate::wasm::Engine>,
    /// eryx runs going, per tenant.
    pub(crate) eryx_running: std::collections::HashMap<String, usize>,
    /// The eryx face's sessions (their state is in the store).
    pub(crate) eryx_sessions: eryx_sessions::Registry,
    /// The eryx face's uploaded environments.
    pub(crate) eryx_envs: eryx_envs::EnvRegistry,
    /// Environment uploads going, per tenant.
    pub(crate) eryx_env_pending: eryx_envs::Pending,
    /// The WBX face's background jobs.
    pub(crate) jobs: jobs::Table,
    /// The webhook delivery threads (`None`: webhooks are off, `ISOBOX_WBX_WEBHOOKS`).
    pub(crate) webhooks: Option<crate::webhooks::Deliveries>,
    /// The instance's lock and its file (held until the daemon is dropped; the file is
    /// removed by the teardown, before the lock goes).
    pub(crate) instance_lock: Option<(std::fs::File, std::path::PathBuf)>,
}

impl Host for Daemon {
    fn reactor(&mut self) -> &mut Reactor<Daemon> {
        &mut self.reactor
    }
}

/// Signals, reload, housekeeping and the shutdown grace.
struct Lifecycle;

impl Component<Daemon> for Lifecycle {
    fn name(&self) -> &'static str {
        "lifecycle"
    }

    fn ready(&self, d: &mut Daemon, _: usize, what: u16, _: Readiness) {
        match what {
            SIGNALS => d.on_signal(),
            RELOAD => {
                drain(&mut d.reload_rx);
                d.admission.reload();
                // An operator's repair: program the table again and check it.
                d.start_egress_check(true);
            }
            _ => {}
        }
    }

    fn timer(&self, d: &mut Daemon, _: usize, what: u16, _: u64) {
        match what {
            HOUSEKEEPING => d.housekeeping(),
            SHUTDOWN_GRACE => {
                d.kill_all_runs();
                // Uploads, downloads and jobs still going get no more time.
                d.close_unfinished_conns();
            }
            _ => {}
        }
    }
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
    /// A container id of this daemon: `<instance>-<pid>-<kind><serial>.`. runsc finds a
    /// container by id PREFIX, so without the final dot `…-b1` would be ambiguous (and
    /// every verb on it, delete too, would fail) while `…-b10` exists; no id here can
    /// be a prefix of another, since a dot appears only at the end.
    pub(crate) fn container_id(&self, kind: &str, serial: u64) -> String {
        container_id(&self.cfg.instance, std::process::id(), kind, serial)
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until SIGTERM/SIGINT and every run has ended.
    ///
    /// # Errors
    /// When polling itself fails.
    pub fn run(&mut self) -> io::Result<()> {
        let teardown = Some(self.spawn_teardown()?);
        // Named in the log at once when missing, not at the first create.
        self.box_init_missing();
        self.warm_publish();
        self.start_probe();
        self.eryx_envs_resume();
        self.job_batches_resume();
        self.job_pump();
        self.reactor.arm(
            Instant::now() + Duration::from_secs(1),
            Addr::new(LIFECYCLE, 0, HOUSEKEEPING),
            0,
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
        let mut scratch = crate::reactor::Turn::default();
        loop {
            crate::reactor::turn(self, &mut scratch)?;
            if self.shutdown_deadline.is_some()
                && self.runs.is_empty()
                && self.kernels.is_empty()
                && self.boxes.is_empty()
                && self.warm.idle()
                && self.root_images_idle()
                && self.jobs.wasi_running == 0
                && self.reactor.overflow_empty()
                && self.conns_all_flushed()
            {
                break;
            }
        }
        // Nothing queued may be lost: every overflowed job goes to the pool, and every
        // job finishes.
        self.reactor.join();
        // The WebAssembly worker and its cgroup go before the slice does.
        if let Some(mut engine) = self.wasm.take() {
            engine.stop();
        }
        // Only now is the slice empty. Its removal runs on the teardown thread, made
        // before the seccomp filter, since this thread may not rmdir.
        if let Some((go, handle)) = teardown {
            let _ = go.send(());
            let _ = handle.join();
        }
        log::info!("isoboxd stopped");
        Ok(())
    }

    /// Stops the root images' builds (`sandbox::image`) and says whether none is still
    /// running: a probe sandbox in flight ends and is removed before the daemon does.
    fn root_images_idle(&self) -> bool {
        self.app.root_images.as_ref().is_none_or(|i| {
            i.stop();
            i.idle()
        })
    }

    /// A thread, unfiltered because it exists before the reactor's seccomp filter, that
    /// removes the slice and the runsc root once told to (at the very end).
    fn spawn_teardown(
        &self,
    ) -> io::Result<(crossbeam_channel::Sender<()>, std::thread::JoinHandle<()>)> {
        let (go, wait) = crossbeam_channel::bounded::<()>(1);
        let (cgroups, instance, backend, sessions, egress) = (
            self.app.cgroups.clone(),
            self.cfg.instance.clone(),
            Arc::clone(&self.backend),
            Arc::clone(&self.app.sessions),
            Arc::clone(&self.app.egress),
        );
        let lock_file = self.instance_lock.as_ref().map(|(_, p)| p.clone());
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
                backend.teardown();
                // Removed while still locked: a daemon starting now locks the file it
                // finds afterwards (startup checks it locked the file at the path).
                if let Some(p) = lock_file {
                    let _ = std::fs::remove_file(p);
                }
            })?;
        Ok((go, handle))
    }

    fn housekeeping(&mut self) {
        let now = Instant::now();
        // Freed pages past their decay go back to the kernel, also while idle.
        crate::sys::alloc::purge_decayed();
        self.app.process_figures = (
            crate::sys::open_fd_count(),
            crate::sys::rss_bytes(),
            crate::sys::alloc::heap_figures(),
        );
        self.admission.tick(now);
        // Session upkeep (last-use times, idle unmounts, TTL reaping) every 5 s, or at
        // once when the earliest expiry has passed.
        let expired = self.app.sessions.next_expiry_ms() <= crate::workspace::now_ms();
        if !self.upkeep_running && (now >= self.next_upkeep || expired) {
            let sessions = Arc::clone(&self.app.sessions);
            let job = Box::new(move || -> Done<Daemon> {
                match sessions.upkeep() {
                    Ok(0) => {}
                    Ok(n) => log::info!("sessions: reaped {n} idle past their ttl"),
                    Err(e) => log::error!("session upkeep: {e}"),
                }
                // What C code (LMDB) freed with glibc's malloc goes back to the kernel
                // rather than staying in glibc's arenas (the daemon's own allocations
                // are jemalloc's, which returns them itself: `sys::alloc`).
                crate::sys::malloc_trim();
                Box::new(|d: &mut Daemon| d.upkeep_running = false)
            });
            if self.reactor.submit(job).is_ok() {
                self.upkeep_running = true;
                self.next_upkeep = now + Duration::from_secs(5);
            }
        }
        // Ended runs' records past their retention go.
        self.records_trim();
        self.eryx_sessions_sweep();
        self.jobs_sweep();
        // Room may have come free (a sandbox ended, a pause passed).
        self.job_pump();
        // Pools follow their demand; refills after a failed boot wait out their
        // pause; both retried from here.
        self.warm_upkeep(now);
        self.warm_fill();
        self.box_warm_fill();
        if self.egress.due(now) {
            self.start_egress_check(false);
        }
        self.reactor.arm(
            now + Duration::from_secs(1),
            Addr::new(LIFECYCLE, 0, HOUSEKEEPING),
            0,
        );
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
        // A long-lived sandbox has no end to wait for: it ends now (a restart loses
        // them, as documented).
        self.box_end_all("the daemon is shutting down");
        self.job_wasi_stop_all();
        self.job_waits_end();
        self.proxy_close_all();
        self.gate_close_all();
        self.agent_stop_all();
        self.warm_drain();
        let deadline = Instant::now() + Duration::from_millis(self.cfg.shutdown_grace_ms);
        self.shutdown_deadline = Some(deadline);
        // No root image build starts from now on; a running mkfs ends at once.
        if let Some(i) = &self.app.root_images {
            i.stop();
        }
        self.reactor
            .arm(deadline, Addr::new(LIFECYCLE, 0, SHUTDOWN_GRACE), 0);
        if let Some((mut l, t)) = self.listener.take() {
            self.reactor.deregister(&mut l, t);
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

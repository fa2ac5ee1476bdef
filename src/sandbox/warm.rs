//! The warm pool: sandboxes booted ahead of time with the interpreter already started
//! (`runtimes/warm/python.py`), each serving exactly one `/execute` and destroyed after.
//!
//! A pooled sandbox is an ordinary `runsc run` whose stdin is a socket pair (like a
//! kernel's), booted in the background on the worker pool with the lowest CPU weight
//! (so refills yield to running executions), one boot at a time. A request that a pooled
//! sandbox can honour exactly as a cold one would — a Python runtime with a pool, the
//! runtime's default memory and pids (the boot fixed the tmpfs sizes and
//! `RLIMIT_NPROC`), offline (the run would be offline anyway when egress is not
//! verified), not a session step — claims one: the claim job writes the request's host
//! limits and the normal CPU weight into its cgroup, then hands over the files and argv;
//! the socket then carries the request's stdin. From there it is a [`Run`] like any
//! other, so output caps, SSE, timeouts, OOM and the result object are the cold path's;
//! only `durationMs` differs (it counts from the hand-over, not from `runsc run`).

use super::backend::{wait_and_delete, Backend, Spawned, Stdin};
use super::pool_size::{self, Budget, Demand, MIN_SPAN};
use super::{host_pids_for, SandboxError, GVISOR_OVERHEAD_BYTES};
use crate::cgroup::{HostLimits, CPU_PERIOD_US};
use crate::sandbox::plan::ExecPlan;
use base64::Engine;
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The Python harness, run as `python3 -c`.
pub const PYTHON_HARNESS: &str = include_str!("../../runtimes/warm/python.py");
/// The compiled runtimes' harness, run as `perl -e`: it writes the files and execs the
/// cold path's build wrapper.
pub const BUILD_HARNESS: &str = include_str!("../../runtimes/warm/build.pl");
/// A harness a pooled sandbox's interpreter loads before the runtime's own launcher,
/// bound read-only at `/opt/isobox-warm/<file>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preload {
    /// Its file name (the interpreter needs the right extension).
    pub file: &'static str,
    /// Its code.
    pub code: &'static str,
}

/// The node harness, preloaded with `node -r`.
pub const NODE_PRELOAD: Preload = Preload {
    file: "warm.js",
    code: include_str!("../../runtimes/warm/node.js"),
};
/// The ruby harness, preloaded with `ruby -r`.
pub const RUBY_PRELOAD: Preload = Preload {
    file: "warm.rb",
    code: include_str!("../../runtimes/warm/ruby.rb"),
};
/// Where pooled sandboxes find their preload.
const PRELOAD_DIR: &str = "/opt/isobox-warm";

/// How a runtime's pooled sandboxes hold their interpreter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `python3 -c HARNESS`: the program runs in the harness's interpreter.
    Python,
    /// `node -r PRELOAD <the runtime's argv>`: the launcher runs after the claim.
    Node,
    /// `ruby -r PRELOAD <the runtime's argv>`: likewise.
    Ruby,
    /// A compiled runtime: `perl -e BUILD_HARNESS`, which execs the build wrapper.
    Build,
}

/// Whether (and how) `desc` can have a warm pool: a compiled runtime, or an interpreted
/// one whose argv ends with its source file, run by `python3`, `node` or `ruby`.
pub fn kind(desc: &crate::runtimes::Descriptor) -> Option<Kind> {
    if desc.compiled {
        return Some(Kind::Build);
    }
    if desc.run.last() != Some(&desc.source_file) {
        return None;
    }
    match desc.run.first().and_then(|p| p.rsplit('/').next()) {
        Some("python3") if desc.run.len() == 2 => Some(Kind::Python),
        Some("node") => Some(Kind::Node),
        Some("ruby") => Some(Kind::Ruby),
        _ => None,
    }
}
/// A pooled sandbox must say it is ready within this.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(30);
/// Suffix of a runtime's networked pool.
pub(crate) const NET_SUFFIX: &str = "+net";

/// The pool a sandbox belongs to.
pub(crate) fn pool_of(s: &Spawned, runtime: &str) -> String {
    if s.net.is_some() {
        format!("{runtime}{NET_SUFFIX}")
    } else {
        runtime.to_string()
    }
}

/// After a failed boot, refills of that runtime pause this long.
pub(crate) const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// One pool's figures: its sandboxes ready, its size now and its bounds, the runs that
/// arrived for it in the last minute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occupancy {
    /// `<runtime>` or `<runtime>+net`.
    pub pool: String,
    /// Sandboxes booted and waiting.
    pub ready: usize,
    /// What it refills to now (between `min` and `max`, see `pool_size`).
    pub target: usize,
    /// Its floor (`ISOBOX_WARM_POOL`).
    pub min: usize,
    /// Its ceiling (`ISOBOX_WARM_POOL_MAX`, never below the floor).
    pub max: usize,
    /// Runs it could serve that arrived in the last minute.
    pub arrivals: usize,
}

/// Pool state, owned by the reactor.
pub struct WarmPool {
    /// Floor per runtime language (for each of its pools): `ISOBOX_WARM_POOL`.
    pub(crate) targets: Vec<(String, usize)>,
    /// Ceiling per runtime language: `ISOBOX_WARM_POOL_MAX` (never below the floor).
    pub(crate) ceilings: HashMap<String, usize>,
    /// Egress is on: each runtime also has a pool of networked sandboxes (`<name>+net`).
    pub(crate) net: bool,
    pub(crate) ready: HashMap<String, VecDeque<Box<Spawned>>>,
    /// The runtime whose sandbox is booting (one at a time), and since when.
    pub(crate) booting: Option<String>,
    pub(crate) boot_started: Option<Instant>,
    /// How long a refill takes, to ready (a moving average): a burst is what arrives
    /// within one.
    pub(crate) boot_wall: Duration,
    /// Runs per pool in the last window.
    pub(crate) demand: HashMap<String, Demand>,
    /// The refills' CPU against `ISOBOX_WARM_POOL_CPU`.
    pub(crate) budget: Budget,
    pub(crate) retry_at: HashMap<String, Instant>,
    pub(crate) serial: u64,
    /// Figures for `/healthz`.
    pub hits: u64,
    /// Requests of a pooled runtime that found the pool empty.
    pub misses: u64,
    /// Sandboxes booted into the pool.
    pub refills: u64,
    /// CPU those boots took, each read from its cgroup once ready (nanoseconds).
    pub refill_cpu_ns: u64,
    /// Boots that failed.
    pub failures: u64,
    /// Claimed runs that ended on the harness's exit frame.
    pub exit_reports: u64,
    /// Pooled sandboxes given back because their pool had shrunk and sat idle.
    pub shrunk: u64,
}

impl Default for WarmPool {
    fn default() -> WarmPool {
        WarmPool::new(
            Vec::new(),
            Vec::new(),
            0.0,
            pool_size::DEFAULT_WINDOW,
            false,
        )
    }
}

impl WarmPool {
    /// A pool with these floors and ceilings (runtime languages), refills allowed
    /// `cpu_per_sec` CPU-seconds per second on average over `window` to grow past the
    /// floors; `net`: networked pools too.
    pub fn new(
        targets: Vec<(String, usize)>,
        ceilings: Vec<(String, usize)>,
        cpu_per_sec: f64,
        window: Duration,
        net: bool,
    ) -> WarmPool {
        WarmPool {
            targets: targets.into_iter().filter(|(_, n)| *n > 0).collect(),
            ceilings: ceilings.into_iter().collect(),
            net,
            ready: HashMap::new(),
            booting: None,
            boot_started: None,
            boot_wall: MIN_SPAN,
            demand: HashMap::new(),
            budget: Budget::new(cpu_per_sec, window),
            retry_at: HashMap::new(),
            serial: 0,
            hits: 0,
            misses: 0,
            refills: 0,
            refill_cpu_ns: 0,
            failures: 0,
            exit_reports: 0,
            shrunk: 0,
        }
    }

    /// Whether any runtime has a pool.
    pub fn enabled(&self) -> bool {
        !self.targets.is_empty()
    }

    /// Every pool: `<runtime>` (offline) and, with egress on, `<runtime>+net`.
    pub fn occupancy(&self) -> Vec<Occupancy> {
        let mut out = Vec::new();
        for (r, _) in &self.targets {
            let mut pools = vec![r.clone()];
            if self.net {
                pools.push(format!("{r}{NET_SUFFIX}"));
            }
            for pool in pools {
                out.push(Occupancy {
                    ready: self.ready.get(&pool).map_or(0, VecDeque::len),
                    target: self.target(&pool),
                    min: self.floor(&pool),
                    max: self.ceiling(&pool),
                    arrivals: self.demand.get(&pool).map_or(0, Demand::recent),
                    pool,
                });
            }
        }
        out
    }

    /// No boot is in flight.
    pub fn idle(&self) -> bool {
        self.booting.is_none()
    }

    /// The configured size of `pool` (0: no such pool).
    pub(crate) fn floor(&self, pool: &str) -> usize {
        let runtime = pool.strip_suffix(NET_SUFFIX).unwrap_or(pool);
        if runtime != pool && !self.net {
            return 0;
        }
        self.targets
            .iter()
            .find(|(r, _)| r == runtime)
            .map_or(0, |(_, n)| *n)
    }

    /// The most `pool` may grow to.
    pub(crate) fn ceiling(&self, pool: &str) -> usize {
        let runtime = pool.strip_suffix(NET_SUFFIX).unwrap_or(pool);
        let floor = self.floor(pool);
        if floor == 0 {
            return 0;
        }
        self.ceilings.get(runtime).copied().unwrap_or(0).max(floor)
    }

    /// What `pool` refills to now (0: no such pool).
    pub(crate) fn target(&self, pool: &str) -> usize {
        let peak = self.demand.get(pool).map_or(0, Demand::peak);
        pool_size::size(
            self.floor(pool),
            self.ceiling(pool),
            peak,
            self.budget.allows_growth(),
        )
    }

    /// A run that a sandbox of `pool` could serve arrived.
    pub(crate) fn arrive(&mut self, pool: &str, now: Instant) {
        let (span, window) = (self.boot_wall, self.budget.window());
        self.demand
            .entry(pool.to_string())
            .or_default()
            .arrive(now, span, window);
    }

    /// A boot that started at `boot_started` has ended: when it made a sandbox
    /// (`cpu_ns`), its time joins the average and its CPU the budget's window (a boot
    /// that failed, perhaps after hanging, says nothing of how long refills take).
    pub(crate) fn boot_ended(&mut self, now: Instant, cpu_ns: Option<u64>) {
        let started = self.boot_started.take();
        let Some(ns) = cpu_ns else {
            return;
        };
        if let Some(t) = started {
            let took = now.saturating_duration_since(t);
            // A moving average, a quarter for the newest boot.
            self.boot_wall = (self.boot_wall * 3 + took) / 4;
        }
        self.budget.spend(now, ns);
    }

    /// Once a second: the window moves on (bursts a minute old no longer count).
    pub(crate) fn tick(&mut self, now: Instant) {
        let (span, window) = (self.boot_wall, self.budget.window());
        self.demand.retain(|_, d| {
            d.refresh(now, span, window);
            d.recent() > 0
        });
        self.budget.refresh(now);
    }

    /// Sandboxes of pools that hold more than their size now and saw no run for a
    /// window: given back, so an idle daemon holds only its floors.
    pub(crate) fn take_excess(&mut self, now: Instant) -> Vec<Spawned> {
        let mut out = Vec::new();
        let pools: Vec<String> = self.ready.keys().cloned().collect();
        for pool in pools {
            let quiet = self
                .demand
                .get(&pool)
                .and_then(Demand::last)
                .is_none_or(|t| now.saturating_duration_since(t) > self.budget.window());
            let target = self.target(&pool);
            if let Some(q) = self.ready.get_mut(&pool) {
                while quiet && q.len() > target {
                    out.extend(q.pop_front().map(|s| *s));
                }
            }
        }
        self.shrunk += out.len() as u64;
        out
    }
}

/// Whether `plan` runs exactly as it would cold in a sandbox booted by [`boot_plan`].
pub(crate) fn eligible(plan: &ExecPlan) -> bool {
    let desc = &plan.runtime.desc;
    // The limits a pooled sandbox was booted with: the runtime's defaults.
    let d = crate::sandbox::limits::RequestedLimits::default().resolve(&desc.limits);
    kind(desc).is_some()
        && plan.workspace.is_none()
        && plan.limits.memory_bytes == d.memory_bytes
        && plan.limits.pids == d.pids
}

/// What a pooled sandbox of `runtime` is booted with: the runtime's defaults, offline or
/// with filtered egress.
pub(crate) fn boot_plan(runtime: crate::runtimes::Runtime, network: bool) -> ExecPlan {
    let limits = crate::sandbox::limits::RequestedLimits::default().resolve(&runtime.desc.limits);
    let preload = match kind(&runtime.desc) {
        Some(Kind::Node) => Some(NODE_PRELOAD),
        Some(Kind::Ruby) => Some(RUBY_PRELOAD),
        _ => None,
    };
    ExecPlan {
        runtime,
        files: Vec::new(),
        entry: String::new(),
        stdin: Vec::new(),
        args: Vec::new(),
        limits,
        network_requested: network,
        allowlist: None,
        code_given: false,
        preload,
        workspace: None,
        long_lived: None,
        ro_binds: Vec::new(),
        signal_start: false,
        cpu_weight: None,
    }
}

/// Largest frame a pooled sandbox's harness may send before its claim (`ready`).
const MAX_READY_FRAME_BYTES: usize = 4096;

/// Why a pooled sandbox could not be booted or claimed. The sandbox is removed either
/// way; a failed claim starts the run cold, a failed boot pauses that pool's refills.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    /// The sandbox itself could not be started.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// A networked pool's sandbox got no network (egress not verified now).
    #[error("egress is not verified: no networked sandbox now")]
    NoNetwork,
    /// Its cgroup could not be given the pool's (or the claim's) settings.
    #[error("cgroup of pooled sandbox {id}: {source}")]
    Cgroup {
        /// Container id.
        id: String,
        /// Cause.
        source: crate::cgroup::CgroupError,
    },
    /// It has no control socket (a bug: every pooled sandbox is spawned with one).
    #[error("pooled sandbox {id} has no control socket")]
    NoControl {
        /// Container id.
        id: String,
    },
    /// Talking to its harness failed: `what` was being done.
    #[error("pooled sandbox {id}: {what}: {source}")]
    Harness {
        /// Container id.
        id: String,
        /// Reading `ready`, writing the claim.
        what: &'static str,
        /// Cause (a timeout included).
        source: std::io::Error,
    },
    /// Its harness said something other than `ready`, or too much.
    #[error("pooled sandbox {id}: unexpected frame {frame}")]
    Frame {
        /// Container id.
        id: String,
        /// What it sent, escaped and cut to 256 bytes.
        frame: String,
    },
    /// The boot failed (`error`), and the sandbox had written `stderr` (runsc's,
    /// `isobox-start`'s and the harness's words, escaped and cut) before it was removed.
    #[error("{error}; its stderr: {stderr}")]
    Boot {
        /// Why it failed.
        error: Box<WarmError>,
        /// What it had written on stderr, escaped and cut to 1 KiB.
        stderr: String,
    },
    /// The claim (the request's files and argv) does not fit one frame.
    #[error("claim of pooled sandbox {id} does not fit a frame: {why}")]
    ClaimTooLarge {
        /// Container id.
        id: String,
        /// Which part.
        why: String,
    },
}

fn read_frame(s: &mut std::os::unix::net::UnixStream, id: &str) -> Result<Vec<u8>, WarmError> {
    let harness = |source| WarmError::Harness {
        id: id.to_string(),
        what: "reading its ready frame",
        source,
    };
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(harness)?;
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_READY_FRAME_BYTES {
        return Err(WarmError::Frame {
            id: id.to_string(),
            frame: format!("of {n} bytes"),
        });
    }
    let mut buf = vec![0; n];
    s.read_exact(&mut buf).map_err(harness)?;
    Ok(buf)
}

/// Boots a pooled sandbox and waits for its harness to say it is ready.
///
/// # Errors
/// When it cannot be started or does not become ready (it is removed again).
pub fn boot(
    b: &dyn Backend,
    id: &str,
    runtime: crate::runtimes::Runtime,
    network: bool,
) -> Result<Spawned, WarmError> {
    let plan = boot_plan(runtime, network);
    // Read before the lease is made: a cut after it makes this sandbox stale.
    let cuts = b.egress().map_or(0, |e| e.cuts());
    let desc = &plan.runtime.desc;
    let argv = match kind(desc) {
        Some(k @ (Kind::Node | Kind::Ruby)) => {
            let file = if k == Kind::Node {
                NODE_PRELOAD.file
            } else {
                RUBY_PRELOAD.file
            };
            let mut a = vec![
                desc.run[0].clone(),
                "-r".into(),
                format!("{PRELOAD_DIR}/{file}"),
            ];
            a.extend(desc.run[1..].iter().cloned());
            a
        }
        Some(Kind::Build) => vec!["/usr/bin/perl".into(), "-e".into(), BUILD_HARNESS.into()],
        _ => vec![desc.run[0].clone(), "-c".into(), PYTHON_HARNESS.into()],
    };
    let mut s = b.run(id, &plan, argv, &desc.env, Stdin::Control)?;
    s.net_cuts = cuts;
    let ready = (|| {
        if network && s.net.is_none() {
            return Err(WarmError::NoNetwork);
        }
        let sid = s.id.clone();
        b.update(&s.cgroup, None, true)
            .map_err(|source| WarmError::Cgroup {
                id: sid.clone(),
                source,
            })?;
        let ctl = s
            .ctl
            .as_mut()
            .ok_or_else(|| WarmError::NoControl { id: sid.clone() })?;
        let harness = |what, source| WarmError::Harness {
            id: sid.clone(),
            what,
            source,
        };
        ctl.set_read_timeout(Some(BOOT_TIMEOUT))
            .map_err(|e| harness("setting the boot timeout", e))?;
        let f = read_frame(ctl, &sid)?;
        let ok = serde_json::from_slice::<serde_json::Value>(&f).is_ok_and(|v| v["ev"] == "ready");
        if !ok {
            return Err(WarmError::Frame {
                id: sid.clone(),
                frame: escaped_cut(&f, 256),
            });
        }
        ctl.set_read_timeout(None)
            .map_err(|e| harness("clearing the boot timeout", e))
    })();
    match ready {
        Ok(()) => Ok(s),
        Err(error) => {
            // What it said is the only account of why (a `--boot` that fails exits
            // before any frame): kept across the removal, read once all are dead.
            let stderr = s.stderr.as_fd().try_clone_to_owned();
            discard(b, s);
            let stderr = match stderr {
                Ok(fd) => stderr_tail(fd),
                Err(e) => format!("(not kept: {e})"),
            };
            Err(WarmError::Boot {
                error: Box::new(error),
                stderr,
            })
        }
    }
}

/// Most of a pooled sandbox's stderr kept for a boot's failure: its end (runsc says
/// why it failed last, after any warnings).
const BOOT_STDERR_BYTES: usize = 1024;
/// Most of it read to find that end (a pipe's buffer).
const BOOT_STDERR_READ_BYTES: u64 = 64 << 10;

/// The end of what is in the pipe `fd` (its writers gone, or not: it never waits),
/// escaped, its last [`BOOT_STDERR_BYTES`] (`...` before them when cut).
fn stderr_tail(fd: std::os::fd::OwnedFd) -> String {
    if let Err(e) = crate::sys::set_nonblocking(fd.as_fd()) {
        return format!("(not read: {e})");
    }
    let mut buf = Vec::new();
    let read = std::fs::File::from(fd)
        .take(BOOT_STDERR_READ_BYTES)
        .read_to_end(&mut buf);
    match read {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Err(e) => return format!("(not read: {e})"),
    }
    if buf.is_empty() {
        return "(nothing)".into();
    }
    let tail = &buf[buf.len().saturating_sub(BOOT_STDERR_BYTES)..];
    let s = escaped_cut(tail, usize::MAX);
    if tail.len() < buf.len() {
        format!("...{s}")
    } else {
        s
    }
}

/// `bytes` as one log line: escaped (any bytes), cut to `max` bytes with `...`.
fn escaped_cut(bytes: &[u8], max: usize) -> String {
    let mut s: String = String::from_utf8_lossy(bytes).escape_debug().collect();
    if s.len() > max {
        let cut = (0..=max)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// Hands a pooled sandbox to `plan`: its limits, then its files and argv. The
/// control socket becomes the program's stdin.
///
/// # Errors
/// When the sandbox cannot take it (it is removed; the caller runs cold).
pub fn claim(
    b: &dyn Backend,
    mut s: Spawned,
    plan: &ExecPlan,
    argv: &[String],
) -> Result<Spawned, WarmError> {
    let limits = HostLimits {
        memory_bytes: plan.limits.memory_bytes + GVISOR_OVERHEAD_BYTES,
        cpu_quota_us: ((plan.limits.cpus * CPU_PERIOD_US as f64) as u64).max(1000),
        pids: host_pids_for(plan.limits.pids),
        cpu_weight: None,
    };
    // Binary for the harnesses that have no JSON at hand: perl-base has none, and
    // Python's json (with base64) would cost a sixth of the pooled sandbox's boot.
    let frame = if matches!(kind(&plan.runtime.desc), Some(Kind::Build | Kind::Python)) {
        binary_claim(&plan.files, argv)
    } else {
        let b64 = base64::engine::general_purpose::STANDARD;
        let files: Vec<(&str, String)> = plan
            .files
            .iter()
            .map(|(n, b)| (n.as_str(), b64.encode(b)))
            .collect();
        Ok(serde_json::json!({"files": files, "argv": argv})
            .to_string()
            .into_bytes())
    };
    let sent = (|| {
        let sid = s.id.clone();
        b.update(&s.cgroup, Some(limits), false)
            .map_err(|source| WarmError::Cgroup {
                id: sid.clone(),
                source,
            })?;
        let too_large = |why: String| WarmError::ClaimTooLarge {
            id: sid.clone(),
            why,
        };
        let frame = frame.map_err(|e| too_large(e.to_string()))?;
        let len = u32::try_from(frame.len()).map_err(|e| too_large(e.to_string()))?;
        let ctl = s
            .ctl
            .as_mut()
            .ok_or_else(|| WarmError::NoControl { id: sid.clone() })?;
        let harness = |source| WarmError::Harness {
            id: sid.clone(),
            what: "writing the claim",
            source,
        };
        ctl.set_write_timeout(Some(Duration::from_secs(10)))
            .map_err(harness)?;
        ctl.write_all(&len.to_be_bytes()).map_err(harness)?;
        ctl.write_all(&frame).map_err(harness)?;
        ctl.set_write_timeout(None).map_err(harness)
    })();
    if let Err(e) = sent {
        discard(b, s);
        return Err(e);
    }
    let ctl = s.ctl.take();
    // Without the exit channel the run just ends the cold way, at runsc's exit. A
    // compiled runtime's harness never reports (it execs the build): no channel, so
    // nothing the program writes on fd 0 can end its run.
    s.exit_ctl = if plan.runtime.desc.compiled {
        None
    } else {
        ctl.as_ref().and_then(|c| c.try_clone().ok())
    };
    s.stdin = ctl.map(|c| std::process::ChildStdin::from(std::os::fd::OwnedFd::from(c)));
    s.started = Instant::now();
    s.warm = true;
    Ok(s)
}

/// Kills and removes a pooled sandbox that will not be used.
pub fn discard(b: &dyn Backend, s: Spawned) {
    let Spawned {
        id,
        child,
        cgroup,
        dir,
        net,
        ..
    } = s;
    b.kill(&cgroup, i32::try_from(child.id()).ok());
    wait_and_delete(b, &id, child, &cgroup, &dir);
    drop(net);
}

/// The claim of the compiled runtimes (`runtimes/warm/build.pl`) and Python
/// (`runtimes/warm/python.py`): the files, then the argv, each a 4-byte big-endian count,
/// each item a 4-byte length and its bytes.
fn binary_claim(files: &[(String, Vec<u8>)], argv: &[String]) -> std::io::Result<Vec<u8>> {
    fn len(n: usize) -> std::io::Result<[u8; 4]> {
        u32::try_from(n)
            .map(u32::to_be_bytes)
            .map_err(std::io::Error::other)
    }
    let mut out = Vec::new();
    out.extend_from_slice(&len(files.len())?);
    let items = files
        .iter()
        .flat_map(|(name, data)| [name.as_bytes(), data.as_slice()]);
    for b in items {
        out.extend_from_slice(&len(b.len())?);
        out.extend_from_slice(b);
    }
    out.extend_from_slice(&len(argv.len())?);
    for a in argv {
        out.extend_from_slice(&len(a.len())?);
        out.extend_from_slice(a.as_bytes());
    }
    Ok(out)
}

/// What the bytes read so far from a claimed sandbox's exit channel say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitFrame {
    /// Not a whole frame yet.
    More,
    /// The harness's `{"ev": "exit", "code": N}`: the program ended with status N.
    Exit(i32),
    /// Anything else (the program wrote on its stdin socket): the channel is ignored
    /// and the run ends the cold way, when `runsc run` exits.
    Invalid,
}

/// The largest exit frame's JSON.
const MAX_EXIT_FRAME: usize = 64;

/// Reads the harness's exit frame from `buf` (all the channel has given so far):
/// exactly one frame and nothing else, with a status in 0..=255.
pub fn exit_frame(buf: &[u8]) -> ExitFrame {
    let Some(head) = buf.first_chunk::<4>() else {
        return ExitFrame::More;
    };
    let n = u32::from_be_bytes(*head) as usize;
    if n > MAX_EXIT_FRAME || buf.len() > 4 + n {
        return ExitFrame::Invalid;
    }
    if buf.len() < 4 + n {
        return ExitFrame::More;
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Msg {
        ev: String,
        code: u8,
    }
    match serde_json::from_slice::<Msg>(&buf[4..]) {
        Ok(m) if m.ev == "exit" => ExitFrame::Exit(i32::from(m.code)),
        _ => ExitFrame::Invalid,
    }
}

/// The claim's hand-off cell: the job takes the sandbox; if the job never runs, the
/// reactor takes it back.
pub type Handoff = Arc<Mutex<Option<Box<Spawned>>>>;

#[cfg(test)]
mod tests {
    use super::{
        binary_claim, escaped_cut, exit_frame, read_frame, stderr_tail, ExitFrame, WarmError,
        BOOT_STDERR_BYTES,
    };
    use std::io::Write;

    #[test]
    fn test_a_failed_boots_stderr_is_kept_escaped_cut_and_never_waited_for() {
        // Its writers gone: everything, escaped into one line.
        let (r, mut w) = std::io::pipe().unwrap();
        w.write_all(b"isobox-start: exec python3: No such file\n\x1b[2J\xff")
            .unwrap();
        drop(w);
        assert_eq!(
            stderr_tail(r.into()),
            "isobox-start: exec python3: No such file\\n\\u{1b}[2J\u{fffd}"
        );
        // A writer still alive (a process that outlived the kill): what is there, at once.
        let (r, mut w) = std::io::pipe().unwrap();
        w.write_all(b"runsc: boom").unwrap();
        let t = std::time::Instant::now();
        assert_eq!(stderr_tail(r.into()), "runsc: boom");
        let (r, _w) = std::io::pipe().unwrap();
        assert_eq!(stderr_tail(r.into()), "(nothing)");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        // Under, at and over the bound (a pipe holds 64 KiB: written whole first): the
        // end is kept, where runsc says why.
        for n in [
            BOOT_STDERR_BYTES - 1,
            BOOT_STDERR_BYTES,
            BOOT_STDERR_BYTES + 1,
            60_000,
        ] {
            let (r, mut w) = std::io::pipe().unwrap();
            let mut text = vec![b'w'; n - 1];
            text.push(b'E');
            w.write_all(&text).unwrap();
            drop(w);
            let want = if n <= BOOT_STDERR_BYTES {
                format!("{}E", "w".repeat(n - 1))
            } else {
                format!("...{}E", "w".repeat(BOOT_STDERR_BYTES - 1))
            };
            assert_eq!(stderr_tail(r.into()), want, "{n} bytes");
        }
        // A cut never splits a character.
        assert_eq!(escaped_cut("ééé".as_bytes(), 3), "é...");
        assert_eq!(escaped_cut("ééé".as_bytes(), 6), "ééé");
    }

    #[test]
    fn test_binary_claim_lays_out_counts_then_length_prefixed_items() {
        let files = [
            ("main.py".to_string(), b"print(1)".to_vec()),
            ("d/\u{e9}".to_string(), Vec::new()),
        ];
        let argv = ["main.py".to_string(), "-x".to_string()];
        let mut want = vec![0, 0, 0, 2];
        for item in [&b"main.py"[..], b"print(1)", "d/\u{e9}".as_bytes(), b""] {
            want.extend_from_slice(&u32::try_from(item.len()).unwrap().to_be_bytes());
            want.extend_from_slice(item);
        }
        want.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 7]);
        want.extend_from_slice(b"main.py\0\0\0\x02-x");
        assert_eq!(binary_claim(&files, &argv).unwrap(), want);
        assert_eq!(binary_claim(&[], &[]).unwrap(), [0; 8]);
    }

    #[test]
    fn test_warm_errors_name_the_sandbox_and_the_step() {
        let e = WarmError::Harness {
            id: "ib-1".into(),
            what: "writing the claim",
            source: std::io::Error::from(std::io::ErrorKind::TimedOut),
        };
        assert!(
            e.to_string()
                .starts_with("pooled sandbox ib-1: writing the claim: "),
            "{e}"
        );
        assert_eq!(
            WarmError::NoNetwork.to_string(),
            "egress is not verified: no networked sandbox now"
        );
        // A ready frame is read whole and bounded.
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        b.write_all(&5000u32.to_be_bytes()).unwrap();
        assert!(matches!(
            read_frame(&mut a, "ib-2"),
            Err(WarmError::Frame { id, .. }) if id == "ib-2"
        ));
        b.write_all(&2u32.to_be_bytes()).unwrap();
        b.write_all(b"{}").unwrap();
        assert_eq!(read_frame(&mut a, "ib-2").unwrap(), b"{}");
    }

    fn frame(json: &str) -> Vec<u8> {
        let mut v = u32::try_from(json.len()).unwrap().to_be_bytes().to_vec();
        v.extend_from_slice(json.as_bytes());
        v
    }

    #[test]
    fn exit_frame_is_read_whole_and_strictly() {
        let f = frame(r#"{"ev": "exit", "code": 3}"#);
        for cut in 0..f.len() {
            assert_eq!(exit_frame(&f[..cut]), ExitFrame::More, "cut at {cut}");
        }
        assert_eq!(exit_frame(&f), ExitFrame::Exit(3));
        assert_eq!(
            exit_frame(&frame(r#"{"ev":"exit","code":0}"#)),
            ExitFrame::Exit(0)
        );
        assert_eq!(
            exit_frame(&frame(r#"{"ev":"exit","code":255}"#)),
            ExitFrame::Exit(255)
        );
        // Out of range, wrong type, other events, extra fields, junk after the frame, a
        // frame over the size bound: the channel is ignored.
        for bad in [
            r#"{"ev":"exit","code":256}"#,
            r#"{"ev":"exit","code":-1}"#,
            r#"{"ev":"exit","code":"0"}"#,
            r#"{"ev":"exit"}"#,
            r#"{"ev":"ready","code":0}"#,
            r#"{"ev":"exit","code":0,"x":1}"#,
            "not json",
        ] {
            assert_eq!(exit_frame(&frame(bad)), ExitFrame::Invalid, "{bad}");
        }
        let mut trailing = f.clone();
        trailing.push(b'x');
        assert_eq!(exit_frame(&trailing), ExitFrame::Invalid);
        // Padded with JSON whitespace to exactly the bound, and one byte over it.
        let padded = |len: usize| format!(r#"{{"ev":"exit","code":1{}}}"#, " ".repeat(len - 22));
        assert_eq!(padded(64).len(), 64);
        assert_eq!(exit_frame(&frame(&padded(64))), ExitFrame::Exit(1));
        assert_eq!(exit_frame(&frame(&padded(65))[..4]), ExitFrame::Invalid);
    }
}

//! Building eryx environments: a thread of the daemon (started with the engine, before
//! the reactor's seccomp filter, since it forks) that runs one `isobox-wasm build` at a
//! time, jailed as a worker is (its own cgroup with `ISOBOX_ERYX_BUILD_MEMORY_MB` and
//! two cores, no network, no new privileges, the worker's seccomp filter once its
//! runtime exists), but as a user of its own (`sys::BUILDER`, not the workers'
//! `sys::WASM_WORKER`), stopped past `ISOBOX_ERYX_BUILD_TIMEOUT_S`.
//!
//! The build writes into a directory the daemon made for it and handed to that user;
//! once it ends, everything in it becomes root's and read-only, so neither a worker nor
//! a later build can change a snapshot that runs load.

use crate::cgroup::{Hierarchy, HostLimits};
use crate::sys::jail::Access;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One environment to build.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    /// The uploaded packages (`NN.whl`, `NN.tar.gz`, `NN.tgz`), unpacked in name order.
    pub packages: PathBuf,
    /// Their names as uploaded (for errors).
    pub names: Vec<String>,
    /// The build's output directory (`site-packages/` and the snapshot), made anew.
    pub out: PathBuf,
    /// Modules to import into the snapshot.
    pub imports: Vec<String>,
    /// Set when the environment is deleted: a queued build is skipped, a build going is
    /// killed.
    pub cancel: Arc<AtomicBool>,
}

/// How a build ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildOutcome {
    /// Built: the snapshot's file name in `out`, whose files are root's and read-only.
    Ready(String),
    /// The packages' fault (shown to the tenant as the environment's `error`); `out`
    /// is removed.
    Failed(String),
    /// The server's fault (logged): the environment stays to be built again.
    Retry,
    /// Its environment was deleted: nothing was (or is any longer) built.
    Cancelled,
}

/// Where a build's outcome goes (called on the builder thread: it must not block).
pub type BuildReply = Box<dyn FnOnce(BuildOutcome) + Send>;

/// The builder's settings.
pub(super) struct Builder {
    pub worker: PathBuf,
    pub cache_dir: PathBuf,
    pub cgroups: Option<Hierarchy>,
    pub slice: String,
    pub timeout: Duration,
    pub memory_bytes: u64,
    /// Set when the daemon stops: a build going is killed (its cgroup removed) and no
    /// other starts.
    pub stop: Arc<AtomicBool>,
    /// The standard snapshot's file name, once the supervisor has prepared it: builds
    /// wait for it (the standard library they read is extracted with it), and a build's
    /// snapshot must have that name.
    pub snapshot: Arc<Mutex<Option<String>>>,
}

/// The cores a build may use (its cgroup's quota and its thread pools).
const BUILD_CORES: u32 = 2;

/// Bytes of the build's answer read (one JSON line; its error is at most 64 KiB).
const ANSWER_BYTES: u64 = 1 << 20;

impl Builder {
    /// Builds until the channel closes.
    pub(super) fn main(self, rx: &crossbeam_channel::Receiver<(BuildRequest, BuildReply)>) {
        let mut n = 0u64;
        for (req, reply) in rx {
            let Some(expected) = self.wait_prepared() else {
                // Stopping: nothing is answered, so the environment stays `building` in
                // its record and is built again at the next start.
                drop(reply);
                continue;
            };
            if req.cancel.load(Ordering::Relaxed) {
                reply(BuildOutcome::Cancelled);
                continue;
            }
            n += 1;
            let t0 = Instant::now();
            let outcome = self.build(n, &req, &expected);
            if self.stopping() {
                log::info!("wasm: a build was stopped with the daemon");
                drop(reply);
                continue;
            }
            let outcome = match outcome {
                _ if req.cancel.load(Ordering::Relaxed) => BuildOutcome::Cancelled,
                BuildOutcome::Ready(name) => match seal(&req.out) {
                    Ok(()) => BuildOutcome::Ready(name),
                    Err(e) => {
                        log::error!("wasm: sealing {}: {e}", req.out.display());
                        BuildOutcome::Retry
                    }
                },
                other => other,
            };
            if !matches!(outcome, BuildOutcome::Ready(_)) {
                // What a failed build unpacked is of no use, and counts on disk.
                let _ = std::fs::remove_dir_all(&req.out);
            }
            log::info!(
                "wasm: environment build {} in {} ms: {}",
                req.out.display(),
                t0.elapsed().as_millis(),
                match &outcome {
                    BuildOutcome::Ready(s) => format!("ready ({s})"),
                    BuildOutcome::Failed(e) =>
                        format!("failed: {}", e.lines().next().unwrap_or_default()),
                    BuildOutcome::Retry => "the server failed; built again later".into(),
                    BuildOutcome::Cancelled => "cancelled (deleted)".into(),
                }
            );
            reply(outcome);
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Waits until the standard snapshot is prepared: its name, or `None` when the
    /// daemon stops first.
    fn wait_prepared(&self) -> Option<String> {
        loop {
            if self.stopping() {
                return None;
            }
            if let Some(name) = self.snapshot.lock().ok().and_then(|s| s.clone()) {
                return Some(name);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn build(&self, n: u64, req: &BuildRequest, expected: &str) -> BuildOutcome {
        let internal = |e: String| {
            log::error!("wasm: environment build {}: {e}", req.out.display());
            BuildOutcome::Retry
        };
        // A fresh directory (what an earlier build left goes), which the build writes
        // as the builder user; it writes nowhere else.
        match std::fs::remove_dir_all(&req.out) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return internal(e.to_string()),
        }
        if let Err(e) =
            std::fs::create_dir(&req.out).and_then(|()| chown(&req.out, crate::sys::BUILDER))
        {
            return internal(e.to_string());
        }
        let cgroup = match &self.cgroups {
            Some(h) => match h.create_run(
                &self.slice,
                &format!("wasm-build-{n}"),
                HostLimits {
                    memory_bytes: self.memory_bytes,
                    cpu_quota_us: u64::from(BUILD_CORES) * crate::cgroup::CPU_PERIOD_US,
                    pids: 64,
                    cpu_weight: None,
                },
            ) {
                Ok(cg) => Some(cg),
                Err(e) => return internal(e.to_string()),
            },
            None => None,
        };
        let result = self.run(req, cgroup.as_ref());
        if let Some(cg) = cgroup {
            cg.kill_all();
            if let Err(e) = cg.destroy() {
                log::warn!("wasm: removing a build's cgroup: {e}");
            }
        }
        match result {
            // Only the name this engine's snapshot has (never a path).
            Ok(name) if name == expected => BuildOutcome::Ready(name),
            Ok(name) => internal(format!(
                "the build answered snapshot {name:?}, not {expected:?}"
            )),
            Err(Why::User(e)) => BuildOutcome::Failed(e),
            Err(Why::Internal(e)) => internal(e),
        }
    }

    fn run(
        &self,
        req: &BuildRequest,
        cgroup: Option<&crate::cgroup::RunCgroup>,
    ) -> Result<String, Why> {
        let mut cmd = Command::new(&self.worker);
        cmd.arg("build")
            .arg("--cache")
            .arg(&self.cache_dir)
            .arg("--packages")
            .arg(&req.packages)
            .arg("--out")
            .arg(&req.out);
        for name in &req.names {
            cmd.arg("--name").arg(name);
        }
        for m in &req.imports {
            cmd.arg("--import").arg(m);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        // Its fd 3 (`_ours`'s other end) is not used by a build.
        // It reads the standard library and the packages, and writes only `out`.
        let view = super::view_of(
            &self.worker,
            &[
                (&self.cache_dir, Access::Read),
                (&req.packages, Access::Read),
                (&req.out, Access::Write),
            ],
        )
        .map_err(Why::Internal)?;
        let (mut child, _ours) =
            super::spawn_jailed(cmd, cgroup, BUILD_CORES, crate::sys::BUILDER, view)
                .map_err(Why::Internal)?;
        // Read on a thread of its own, so a long answer never fills the pipe while the
        // build is waited for.
        let stdout = child.stdout.take();
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(out) = stdout {
                let _ = out.take(ANSWER_BYTES).read_to_string(&mut s);
            }
            s
        });
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None)
                    if Instant::now() >= deadline
                        || self.stopping()
                        || req.cancel.load(Ordering::Relaxed) =>
                {
                    break None
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(Why::Internal(e.to_string())),
            }
        };
        if status.is_none() {
            super::kill_jailed(&mut child, cgroup);
            let _ = reader.join();
            return Err(Why::User(format!(
                "The build took longer than {} s and was stopped",
                self.timeout.as_secs()
            )));
        }
        let answer = reader.join().unwrap_or_default();
        let v: serde_json::Value = match serde_json::from_str(answer.trim()) {
            Ok(v) => v,
            Err(_) => {
                let oom = cgroup.is_some_and(|cg| cg.oom_kills() > 0);
                return Err(Why::User(if oom {
                    format!(
                        "The build ran out of memory (it may use {} MiB)",
                        self.memory_bytes >> 20
                    )
                } else {
                    format!(
                        "The build ended without an answer ({})",
                        status.map(|s| s.to_string()).unwrap_or_default()
                    )
                }));
            }
        };
        if let Some(name) = v["snapshot"].as_str() {
            return Ok(name.to_string());
        }
        Err(Why::User(
            v["error"]
                .as_str()
                .unwrap_or("The build failed without saying why")
                .to_string(),
        ))
    }
}

/// Why a build failed: the user's packages (shown to them), or the server (logged; the
/// user is told only that).
enum Why {
    User(String),
    Internal(String),
}

fn chown(path: &Path, id: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(id), Some(id))
}

/// Makes everything under `dir` root's and read-only (links are not followed: a build
/// cannot make any).
pub fn seal(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(dir)?;
    chown(dir, 0)?;
    if meta.is_dir() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))?;
        for entry in std::fs::read_dir(dir)? {
            seal(&entry?.path())?;
        }
    } else if meta.is_file() && std::os::unix::fs::MetadataExt::nlink(&meta) == 1 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o444))?;
    } else {
        // A hard link (a build makes none: it could name a file outside) or anything
        // but a file or a directory: removed, never followed.
        std::fs::remove_file(dir)?;
    }
    Ok(())
}

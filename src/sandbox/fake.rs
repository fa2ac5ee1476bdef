//! The tests' backend: each "sandbox" is the run's argv as a plain host process in its
//! own process group, in a directory holding the plan's files, with pipes and a pidfd
//! like `runsc run`'s. It isolates nothing; it lets the loop's run lifecycle (start
//! signal, output, caps, deadlines, kills, cancellation, SSE) be tested without root,
//! runsc or cgroups. Test builds only.

use super::backend::{wait_bounded, Backend, Cleanup, Spawned, Stdin};
use super::plan::ExecPlan;
use super::SandboxError;
use crate::cgroup::{CgroupError, HostLimits, RunCgroup, Usage};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Host processes standing in for sandboxes, under `root`.
pub struct Fake {
    /// Where each run's directory (and its cgroup fixture) goes.
    pub root: PathBuf,
    /// Refuse every `run` (a sandbox that cannot start).
    pub fail_runs: AtomicBool,
    /// Sandboxes created and not yet deleted.
    pub live: AtomicUsize,
    /// Kills asked for.
    pub kills: AtomicUsize,
    /// The program starts this long after its sandbox (a slow boot).
    pub delay_start_ms: AtomicU64,
    /// Cold runs write the start frame (gVisor without its hook) rather than being
    /// signalled through a FIFO, as `runsc run`'s poststart hook does.
    pub frame_start: AtomicBool,
    /// The hook's signal comes this long after the program started (`u64::MAX`: never,
    /// as when runsc fails before the program exists).
    pub signal_delay_ms: AtomicU64,
    /// Process groups started and not reaped.
    groups: std::sync::Mutex<Vec<i32>>,
    /// Each sandbox's process group, by container id (pause and resume stop and
    /// continue it).
    by_id: std::sync::Mutex<std::collections::HashMap<String, i32>>,
}

impl Fake {
    /// A fake whose runs live under `root`.
    pub fn new(root: &Path) -> Arc<Fake> {
        Arc::new(Fake {
            root: root.to_path_buf(),
            fail_runs: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            kills: AtomicUsize::new(0),
            delay_start_ms: AtomicU64::new(0),
            frame_start: AtomicBool::new(false),
            signal_delay_ms: AtomicU64::new(0),
            groups: std::sync::Mutex::new(Vec::new()),
            by_id: std::sync::Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// Kills every process group still running (a failed test's leftovers).
    pub fn kill_all(&self) {
        let groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        for &g in groups.iter() {
            let _ = crate::sys::kill_group(g, libc::SIGKILL);
        }
    }

    fn signal_id(&self, verb: &'static str, id: &str, sig: i32) -> Result<(), SandboxError> {
        let g = self
            .by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied();
        let err = |detail: String| SandboxError::Verb {
            verb,
            id: id.to_string(),
            detail,
        };
        let g = g.ok_or_else(|| err("no such sandbox".into()))?;
        crate::sys::kill_group(g, sig).map_err(|e| err(e.to_string()))
    }

    fn spawn_err(source: std::io::Error) -> SandboxError {
        SandboxError::Spawn {
            runsc: PathBuf::from("fake"),
            source,
        }
    }
}

/// What `isobox-started` does (`start.c`'s sibling): the clock into the FIFO, when
/// its reader is still there.
fn signal(fifo: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo)
    {
        let _ = std::io::Write::write_all(&mut f, &crate::sys::monotonic_ns().to_le_bytes());
    }
}

impl Backend for Fake {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn run(
        &self,
        id: &str,
        plan: &ExecPlan,
        argv: Vec<String>,
        env: &[String],
        stdin: Stdin,
    ) -> Result<Spawned, SandboxError> {
        if self.fail_runs.load(Ordering::SeqCst) {
            return Err(Self::spawn_err(std::io::Error::other(
                "refused by the test",
            )));
        }
        let dir = self.root.join(id);
        std::fs::create_dir_all(&dir).map_err(Self::spawn_err)?;
        for (name, bytes) in &plan.files {
            std::fs::write(dir.join(name), bytes).map_err(Self::spawn_err)?;
        }
        let cgroup =
            RunCgroup::fixture(&self.root.join("cgroup").join(id)).map_err(Self::spawn_err)?;
        // The start signal, as the gVisor backend gives it: a FIFO its hook signals, or
        // the frame before the program's argv.
        let hooked = plan.signal_start && !self.frame_start.load(Ordering::SeqCst);
        let argv = if plan.signal_start && !hooked {
            super::start::wrap(argv)
        } else {
            argv
        };
        let fifo = dir.join(super::bundle::STARTED_FIFO);
        let start_signal = if hooked {
            Some(crate::sys::fifo_reader(&fifo, 0o600).map_err(Self::spawn_err)?)
        } else {
            None
        };
        // A slow boot: nothing (no start signal either) for a while.
        let delay = self.delay_start_ms.load(Ordering::SeqCst);
        let argv = if delay > 0 {
            let mut a = vec![
                "/bin/sh".to_string(),
                "-c".to_string(),
                format!("sleep {}; exec \"$@\"", delay as f64 / 1000.0),
                "fake-boot".to_string(),
            ];
            a.extend(argv);
            a
        } else {
            argv
        };
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| Self::spawn_err(std::io::Error::other("empty argv")))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(&dir)
            .env_clear()
            .envs(env.iter().filter_map(|kv| kv.split_once('=')))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let ctl = match stdin {
            Stdin::Pipe => {
                cmd.stdin(Stdio::piped());
                None
            }
            Stdin::Control => {
                let (host, sandbox) =
                    std::os::unix::net::UnixStream::pair().map_err(Self::spawn_err)?;
                cmd.stdin(Stdio::from(OwnedFd::from(sandbox)));
                Some(host)
            }
        };
        let mut child = cmd.spawn().map_err(Self::spawn_err)?;
        drop(cmd);
        let pgid = i32::try_from(child.id()).unwrap_or(0);
        self.groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(pgid);
        self.by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), pgid);
        let pidfd = match crate::sys::pidfd_open(child.id()) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = crate::sys::kill_group(pgid, libc::SIGKILL);
                let _ = child.wait();
                return Err(Self::spawn_err(e));
            }
        };
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(Self::spawn_err(std::io::Error::other("no pipes")));
        };
        self.live.fetch_add(1, Ordering::SeqCst);
        if hooked {
            let after = self.signal_delay_ms.load(Ordering::SeqCst);
            if after == 0 && delay == 0 {
                // runsc runs the hook before it waits for the program.
                signal(&fifo);
            } else if after != u64::MAX {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(delay.saturating_add(after)));
                    signal(&fifo);
                });
            }
        }
        Ok(Spawned {
            id: id.to_string(),
            stdin: child.stdin.take(),
            child,
            stdout,
            stderr,
            pidfd,
            cgroup,
            dir,
            started: Instant::now(),
            net: None,
            ctl,
            warm: false,
            exit_ctl: None,
            start_signal,
            net_cuts: 0,
        })
    }

    fn update(&self, _: &RunCgroup, _: Option<HostLimits>, _: bool) -> Result<(), CgroupError> {
        Ok(())
    }

    fn kill(&self, _: &RunCgroup, init: Option<i32>) {
        self.kills.fetch_add(1, Ordering::SeqCst);
        if let Some(pid) = init {
            // The whole process group: the wrapper's shell and what it started.
            let _ = crate::sys::kill_group(pid, libc::SIGKILL);
        }
    }

    fn wait(&self, mut child: Child, _: &RunCgroup) -> Cleanup {
        let pgid = i32::try_from(child.id()).unwrap_or(0);
        let exit_code = wait_bounded(&mut child, Duration::from_secs(5), || {});
        self.groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|&g| g != pgid);
        Cleanup {
            oom_killed: false,
            exit_code,
        }
    }

    fn delete(&self, _: &str, cgroup: &RunCgroup, dir: &Path) {
        for d in cgroup.dirs() {
            let _ = std::fs::remove_dir_all(d);
        }
        if std::fs::remove_dir_all(dir).is_ok() {
            self.live.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn pause(&self, id: &str) -> Result<(), SandboxError> {
        self.signal_id("pause", id, libc::SIGSTOP)
    }

    fn resume(&self, id: &str) -> Result<(), SandboxError> {
        self.signal_id("resume", id, libc::SIGCONT)
    }

    fn stats(&self, _: &RunCgroup) -> Usage {
        Usage::default()
    }

    fn sweep(&self) -> usize {
        0
    }

    fn teardown(&self) {}

    fn egress(&self) -> Option<&Arc<crate::netfilter::Egress>> {
        None
    }
}

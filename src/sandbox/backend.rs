//! The sandbox backend seam: one trait whose verbs are runsc's, what a started sandbox
//! hands the loop ([`Spawned`]), and what its end says ([`Cleanup`]).
//!
//! The gVisor backend (`runsc.rs`, [`Gvisor`](super::runsc::Gvisor)) implements it;
//! the WebAssembly worker will be the second implementation, and the tests' fake the
//! third. Every verb blocks: they run on the worker pool, never on the reactor thread.
//! What is built on the verbs and holds for every backend (the startup probe, the
//! warm pool's boot, claim and discard) lives beside it (`probe.rs`, `warm.rs`).
//!
//! runsc's `exec` has no verb here: a long-lived sandbox's own init starts its
//! processes (`runsc exec` costs 100-200 ms a process and forwards no signal without a
//! terminal; a call to the init costs well under a millisecond).

use super::plan::ExecPlan;
use super::SandboxError;
use crate::cgroup::{CgroupError, HostLimits, RunCgroup, Usage};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout};
use std::sync::Arc;
use std::time::Instant;

/// A sandbox backend. Each verb is runsc's of the same name, or the OCI runtime
/// specification's where runsc has none (`update`).
pub trait Backend: Send + Sync {
    /// Names the backend in logs (`gvisor`).
    fn name(&self) -> &'static str;

    /// `runsc run`: creates sandbox `id` for `plan` (its limits, files and network) and
    /// starts `argv` in it with `env`, in one step (`create`, `start` and `wait` as
    /// three invocations cost ~1.8 s more: `wait` polls). The program's stdio and the
    /// process that ends with the sandbox come back in [`Spawned`]. A plan that asks for
    /// its start to be heard (`signal_start`) gets the backend's start signal
    /// (`sandbox::start`): the hook's FIFO in [`Spawned::start_signal`], or the frame
    /// program before `argv`.
    ///
    /// # Errors
    /// [`SandboxError`] when any step fails; whatever was created is removed again.
    fn run(
        &self,
        id: &str,
        plan: &ExecPlan,
        argv: Vec<String>,
        env: &[String],
        stdin: Stdin,
    ) -> Result<Spawned, SandboxError>;

    /// [`run`](Self::run) on the runtime's tree whatever else the backend could use (a
    /// root image, `sandbox::image`): what the startup probe checks.
    ///
    /// # Errors
    /// As [`run`](Self::run).
    fn run_on_tree(
        &self,
        id: &str,
        plan: &ExecPlan,
        argv: Vec<String>,
        env: &[String],
        stdin: Stdin,
    ) -> Result<Spawned, SandboxError> {
        self.run(id, plan, argv, env, stdin)
    }

    /// Cold runs stop using the backend's start hook and write the start frame instead
    /// (the probe found that runsc does not run it).
    fn give_up_start_hook(&self) {}

    /// OCI `update`: a live sandbox's host limits (when given) and whether it runs at
    /// the lowest CPU weight (a pooled sandbox waiting for its claim).
    ///
    /// # Errors
    /// When a limit cannot be written.
    fn update(
        &self,
        cgroup: &RunCgroup,
        limits: Option<HostLimits>,
        low_priority: bool,
    ) -> Result<(), CgroupError>;

    /// `runsc kill --all KILL`: ends every process of the sandbox at once (stopped ones
    /// too), and `init`, the host process that stands for it, with them.
    fn kill(&self, cgroup: &RunCgroup, init: Option<i32>);

    /// `runsc wait`: reaps the sandbox's host process (it has exited or is about to) and
    /// reads what a result needs: its exit status and whether anything was OOM-killed.
    fn wait(&self, child: Child, cgroup: &RunCgroup) -> Cleanup;

    /// `runsc delete --force` (only while runsc still records the container: one that
    /// ended by itself deleted it already): removes the container state, the cgroups
    /// (killing anything left in them) and the bundle `dir`. Idempotent.
    fn delete(&self, id: &str, cgroup: &RunCgroup, dir: &Path);

    /// `runsc pause`: stops every process of a live sandbox; its memory stays.
    ///
    /// # Errors
    /// [`SandboxError::Verb`] with what runsc said.
    fn pause(&self, id: &str) -> Result<(), SandboxError>;

    /// `runsc resume`: continues a paused sandbox.
    ///
    /// # Errors
    /// [`SandboxError::Verb`] with what runsc said.
    fn resume(&self, id: &str) -> Result<(), SandboxError>;

    /// `runsc events --stats`: what the sandbox uses now, as its host cgroup counts it
    /// (gVisor's own processes included).
    fn stats(&self, cgroup: &RunCgroup) -> Usage;

    /// Removes what a crashed daemon of this instance left (only names of this
    /// instance); returns how many things it removed.
    fn sweep(&self) -> usize;

    /// Removes this instance's own backend state once every sandbox is gone.
    fn teardown(&self);

    /// The filtered egress sandboxes lease their network from, when it is on.
    fn egress(&self) -> Option<&Arc<crate::netfilter::Egress>>;
}

/// Reaps `child`, waiting at most `within` (then `kill`, and `child` itself, are
/// SIGKILLed first); its exit code, 128 + the signal when one ended it.
pub fn wait_bounded(child: &mut Child, within: std::time::Duration, kill: impl FnOnce()) -> i32 {
    let deadline = Instant::now() + within;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            Ok(None) => {
                kill();
                let _ = child.kill();
                break child.wait().ok();
            }
            Err(_) => break None,
        }
    };
    status.map_or(128 + libc::SIGKILL, |s| {
        use std::os::unix::process::ExitStatusExt;
        s.code()
            .unwrap_or_else(|| 128 + s.signal().unwrap_or(libc::SIGKILL))
    })
}

/// [`Backend::wait`], then [`Backend::delete`].
pub fn wait_and_delete(
    b: &dyn Backend,
    id: &str,
    child: Child,
    cgroup: &RunCgroup,
    dir: &Path,
) -> Cleanup {
    let c = b.wait(child, cgroup);
    b.delete(id, cgroup, dir);
    c
}

/// A started sandbox, handed to the reactor.
pub struct Spawned {
    /// Container id.
    pub id: String,
    /// The `runsc run` process (its stdio taken out).
    pub child: Child,
    /// Program stdin.
    pub stdin: Option<ChildStdin>,
    /// Program stdout.
    pub stdout: ChildStdout,
    /// Program stderr.
    pub stderr: ChildStderr,
    /// Becomes readable when `runsc run` exits.
    pub pidfd: OwnedFd,
    /// The run's cgroup.
    pub cgroup: RunCgroup,
    /// The bundle directory.
    pub dir: PathBuf,
    /// When runsc was started.
    pub started: Instant,
    /// The run's network, when it has one (released after the container is deleted).
    pub net: Option<crate::netfilter::NetLease>,
    /// Host end of the control socket that is the sandbox's stdin (kernels only).
    pub ctl: Option<std::os::unix::net::UnixStream>,
    /// A pooled sandbox claimed for this run: `started` is the hand-over, the
    /// interpreter was already running.
    pub warm: bool,
    /// A claimed pooled sandbox: a second handle on its control socket, on which the
    /// harness reports the program's exit status (`warm.rs`).
    pub exit_ctl: Option<std::os::unix::net::UnixStream>,
    /// The reading end of the FIFO the poststart hook signals when the program has
    /// started (`sandbox::start`); `None`: no hook (the frame says it, or nothing).
    pub start_signal: Option<OwnedFd>,
    /// Egress cuts when its network was made (a pooled networked sandbox whose link a
    /// later failed check cut is not handed out).
    pub net_cuts: u64,
}

/// What the sandbox's stdin is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdin {
    /// A pipe the reactor feeds the request's `stdin` into.
    Pipe,
    /// One end of a socket pair: a kernel harness's framed control channel.
    Control,
}

/// What cleanup found.
#[derive(Debug, Clone, Copy)]
pub struct Cleanup {
    /// The kernel OOM-killed something in the run's cgroup.
    pub oom_killed: bool,
    /// Exit code of `runsc run` (128+signal when signalled).
    pub exit_code: i32,
}

//! Sandboxes: what a run is (`plan`), the backend seam whose verbs are runsc's
//! (`backend`), the gVisor backend (`runsc`: the OCI bundle from `bundle`, the cgroup,
//! `runsc run` with pipes and a pidfd, and at the end kill, wait and delete), and what
//! is built on the verbs for every backend: the startup probe (`probe`) and the warm
//! pool (`warm`). The harnesses' protocols are here too, sans-IO: the start signal
//! (`start`), the build stage's frames (`build`) and the kernel's (`kernel`). `limits`
//! holds the spec's bounds. Everything here blocks or is pure: it runs on the worker
//! pool, and knows no connection, face or loop.

pub mod backend;
pub mod build;
pub mod bundle;
#[cfg(test)]
pub mod fake;
pub mod image;
pub mod kernel;
pub mod limits;
pub mod plan;
pub mod pool_size;
pub mod probe;
pub mod runsc;
pub mod start;
pub mod steps;
pub mod warm;
pub mod wire;

pub use backend::{Backend, Cleanup, Spawned, Stdin};
pub use runsc::Gvisor;

/// A sandbox operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Cgroup setup failed.
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
    /// Writing the bundle failed.
    #[error("bundle {path}: {source}")]
    Bundle {
        /// Where.
        path: std::path::PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Spawning runsc failed.
    #[error("spawning {runsc}: {source}")]
    Spawn {
        /// The runsc path.
        runsc: std::path::PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// No cgroup hierarchy is usable.
    #[error("cgroups unavailable: {0}")]
    NoCgroups(String),
    /// A runsc verb on a live sandbox failed.
    #[error("runsc {verb} {id}: {detail}")]
    Verb {
        /// Which verb.
        verb: &'static str,
        /// The container.
        id: String,
        /// What runsc said (or why it could not run).
        detail: String,
    },
}

/// Host memory added to the program's `memoryBytes` for gVisor itself (sentry, gofer,
/// ptrace stubs). Measured at 15-17 MiB for a python `print(1)`; this leaves headroom.
pub const GVISOR_OVERHEAD_BYTES: u64 = 32 << 20;

/// Host tasks (threads count in v1 pids) allowed per sandbox: gVisor needs ~25 to boot
/// and ~15 per guest process on ptrace, and more when the host is loaded (the sentry's
/// Go runtime adds threads for blocked syscalls). At 64 + 20 per guest process a fork
/// bomb on a busy host made the sentry fail to create a thread and exit 2 (1 in 8 runs
/// under 4 busy loops; 0 in 14 at this value). The guest's own process count is capped
/// inside by RLIMIT_NPROC, so this is only a backstop.
pub fn host_pids_for(guest_pids: u64) -> u64 {
    128 + 40 * guest_pids
}

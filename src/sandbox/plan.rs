//! What a run is and what it gave: the validated plan a face hands the sandbox
//! ([`ExecPlan`]) and the facts a run produces ([`RunResult`], [`CompileResult`],
//! [`Artifact`]). Faces shape these into their own responses; the sandbox never
//! imports a face.

use crate::runtimes::Runtime;
use crate::sandbox::limits::Limits;
use serde::Serialize;

/// A validated execution, ready for the sandbox.
#[derive(Debug, Clone)]
pub struct ExecPlan {
    /// The resolved runtime.
    pub runtime: Runtime,
    /// Files to place in the working directory: (relative path, bytes).
    pub files: Vec<(String, Vec<u8>)>,
    /// Which file is the entry point (replaces `source_file` in build/run argv).
    pub entry: String,
    /// Fed to stdin.
    pub stdin: Vec<u8>,
    /// Appended to the run argv.
    pub args: Vec<String>,
    /// Effective limits.
    pub limits: Limits,
    /// Whether the client asked for network (explicitly or by default).
    pub network_requested: bool,
    /// With `network_requested`: reach only what this allows (`None`: the whole
    /// public internet).
    pub allowlist: Option<std::sync::Arc<crate::netfilter::policy::Allowlist>>,
    /// `files[0]` is the request's `code` (not one of its `files`).
    pub code_given: bool,
    /// A warm-pool harness to bind read-only under `/opt/isobox-warm/` (node and ruby
    /// pooled sandboxes preload it); `None` for every ordinary run.
    pub preload: Option<crate::sandbox::warm::Preload>,
    /// A session step: the session's mounted workspace, bound read-write at
    /// `/workspace` (the files are already in it). Dropping the last clone ends the lease.
    pub workspace: Option<std::sync::Arc<crate::workspace::Lease>>,
    /// A long-lived sandbox: the host path of `isobox-init`, bound read-only at
    /// [`INIT_PATH`] and run as the sandbox's pid 1 (as root inside it, with a small
    /// capability set), over a root filesystem the sandbox may write (a memory overlay,
    /// inside its memory cap). `None` for every one-shot run.
    pub long_lived: Option<std::path::PathBuf>,
    /// Host directories bound read-only (no devices, no set-id) into a long-lived
    /// sandbox: (host path, absolute path inside). A job's `input/` is one.
    pub ro_binds: Vec<(std::path::PathBuf, String)>,
    /// A cold one-shot run whose start the daemon waits to hear (`sandbox::start`):
    /// the backend makes it heard (gVisor: the poststart hook, or the frame program
    /// before argv). `false` for pooled boots, kernels, long-lived sandboxes, compiled
    /// runs (their build script writes the frame) and the startup probe.
    pub signal_start: bool,
    /// CPU weight of its host cgroup (cgroup v2 `cpu.weight` scale, 100 the default):
    /// a WBX sandbox's compute class. `None`: the kernel's default.
    pub cpu_weight: Option<u32>,
}

/// Where a long-lived sandbox's init is, inside it.
pub const INIT_PATH: &str = "/opt/isobox/init";

/// Compile stage of a compiled runtime (present only for those).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CompileResult {
    /// Compiler stdout.
    pub stdout: String,
    /// Compiler stderr.
    pub stderr: String,
    /// Compiler exit code (137 when killed at the compile time limit).
    pub exit_code: i32,
    /// Killed by the compile time limit.
    pub timed_out: bool,
    /// Killed by the memory cap while compiling.
    pub oom_killed: bool,
    /// Compile wall time.
    pub duration_ms: u64,
}

/// The `run` object of the response.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    /// Captured stdout (at most `outputBytes` bytes of it).
    pub stdout: String,
    /// Captured stderr (at most `outputBytes` bytes of it).
    pub stderr: String,
    /// Exit code; 137 for a wall-time or memory kill.
    pub exit_code: i32,
    /// Killed by the wall-time cap.
    pub timed_out: bool,
    /// Killed by the memory cap (read from the cgroup's OOM events).
    pub oom_killed: bool,
    /// Output hit the cap.
    pub truncated: bool,
    /// Program wall time.
    pub duration_ms: u64,
    /// Whether filtered egress was actually applied.
    pub network: bool,
    /// The limits the run actually had, after clamping the request's into their
    /// bounds (a kernel step: the kernel's memory, CPUs and processes).
    pub limits: Limits,
}

/// One rich output of a kernel step.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type")]
pub enum Artifact {
    /// A PNG image, base64.
    #[serde(rename = "image/png")]
    Png {
        /// The image, standard base64.
        #[serde(rename = "dataB64")]
        data_b64: String,
    },
    /// An HTML fragment.
    #[serde(rename = "text/html")]
    Html {
        /// The HTML.
        data: String,
    },
}

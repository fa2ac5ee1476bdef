//! The kernel protocol: the harness a kernel session runs (`runtimes/kernel/harness.py`,
//! one persistent interpreter), the frames it sends on its control channel, the
//! environment it runs with, and the bounds on what it may send. The kernel's life on
//! the event loop is `daemon::kernels`.

use crate::http::Response;
use serde::Deserialize;
use std::time::Duration;

/// The harness, run as `python3 -c`.
pub const HARNESS: &str = include_str!("../../runtimes/kernel/harness.py");
/// Largest frame the harness may send: one artifact (2 MiB of payload, JSON-escaped:
/// at worst 6 bytes for a control byte) and a little framing.
pub const MAX_FRAME_BYTES: usize = (12 << 20) + (64 << 10);
/// Most artifacts one step returns.
pub const MAX_ARTIFACTS: usize = 8;
/// Largest artifact payload (base64 length for PNG, byte length for HTML).
pub const MAX_ARTIFACT_BYTES: usize = 2 << 20;
/// A kernel must say it is ready within this.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(30);
/// A frame from the harness.
#[derive(Deserialize)]
#[serde(tag = "ev", rename_all = "lowercase")]
pub enum Frame {
    /// The interpreter is up and waits for steps.
    Ready {},
    /// A rich output of the current step.
    Artifact {
        /// `image/png` or `text/html`.
        #[serde(rename = "type")]
        kind: String,
        /// A PNG's standard base64.
        #[serde(rename = "dataB64")]
        data_b64: Option<String>,
        /// An HTML fragment.
        data: Option<String>,
    },
    /// The step ended; its output is all in the pipes.
    Done {
        /// Exit status the harness reports for the step.
        exit: i64,
        /// The harness cut the step's output.
        #[serde(default)]
        truncated: bool,
    },
}

/// The kernel's environment: the runtime's, with `HOME` and the user site under
/// `/workspace` so `pip install --user` works and lasts the session.
pub fn kernel_env(runtime_env: &[String]) -> Vec<String> {
    let mut env: Vec<String> = runtime_env
        .iter()
        .filter(|e| !e.starts_with("HOME=") && !e.starts_with("PATH="))
        .cloned()
        .collect();
    env.extend(
        [
            "HOME=/workspace",
            "PATH=/workspace/.local/bin:/usr/local/bin:/usr/bin:/bin",
            "PYTHONUSERBASE=/workspace/.local",
            // Debian marks its Python externally managed; --user installs are ours.
            "PIP_BREAK_SYSTEM_PACKAGES=1",
            "PIP_DISABLE_PIP_VERSION_CHECK=1",
            "PIP_NO_CACHE_DIR=1",
            // Caches stay out of the user's workspace.
            "MPLCONFIGDIR=/tmp/.matplotlib",
            "XDG_CACHE_HOME=/tmp/.cache",
        ]
        .map(String::from),
    );
    env
}

/// Whether `s` is made of base64 characters only.
pub fn is_base64(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
}

/// 410 for a step in a session whose kernel has ended.
pub fn kernel_dead(why: &str) -> Response {
    Response::error(
        410,
        "kernel_dead",
        Some(&format!(
            "this session's kernel has ended: {why}; its files are still readable; delete the session and create a new one"
        )),
    )
}

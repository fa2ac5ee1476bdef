//! What a finished pool job (or an agent thread's message) says, and where the daemon
//! takes it: one enum, one match. Each variant is answered by the file that owns its
//! subject (`runs`, `transfer`, `kernels`, `warm`, `agent`).

use crate::api::ProbeState;
use crate::http::Response;
use crate::sandbox::runsc::{Cleanup, Spawned};
use crate::sandbox::SandboxError;

use super::Daemon;

/// A finished pool job.
pub enum Completion {
    /// The sandbox started (or failed to).
    Spawned {
        /// Run key.
        run: usize,
        /// Run serial (guards against a reused key).
        serial: u64,
        /// Outcome.
        result: Result<Box<Spawned>, SandboxError>,
    },
    /// A job with nothing to report (a kill, a removal) ended.
    Done,
    /// `runsc run` was reaped and the result's facts read.
    Reaped {
        /// Run key.
        run: usize,
        /// Run serial.
        serial: u64,
        /// What was found.
        cleanup: Cleanup,
    },

    /// The startup self-probe ended.
    Probe(Result<(), String>),
    /// A request's pool job finished.
    Outcome {
        /// Connection key.
        conn: usize,
        /// Connection serial (guards against a reused key).
        serial: u64,
        /// What it found.
        outcome: crate::api::Outcome,
    },
    /// An upload's file is open, or it was refused.
    UploadReady {
        /// Connection key.
        conn: usize,
        /// Connection serial.
        serial: u64,
        /// The target, or the refusal.
        result: Result<Box<crate::api::UploadTarget>, Response>,
    },
    /// A chunk of an upload was written to its file (the target comes back).
    UploadWrote {
        /// Connection key.
        conn: usize,
        /// Connection serial.
        serial: u64,
        /// The upload, returned to the connection.
        target: Box<crate::api::UploadTarget>,
        /// The write's outcome (an error response: quota, I/O).
        result: Result<(), Response>,
    },
    /// Session upkeep ended.
    Upkeep,
    /// An egress check (and maybe repair) finished.
    EgressChecked,
    /// A kernel's sandbox started (or failed to).
    KernelSpawned {
        /// Kernel key.
        kernel: usize,
        /// Kernel serial.
        serial: u64,
        /// Outcome.
        result: Result<Box<Spawned>, SandboxError>,
    },
    /// A pooled sandbox booted (or failed to).
    WarmBooted {
        /// Its runtime.
        runtime: String,
        /// The sandbox, ready for a claim.
        result: Result<Box<Spawned>, crate::sandbox::warm::WarmError>,
    },
    /// A kernel step's files were written (or could not be).
    KernelFiles {
        /// Kernel key.
        kernel: usize,
        /// Kernel serial.
        serial: u64,
        /// The step's run key.
        run: usize,
        /// The refusal, when a file could not be placed.
        result: Result<(), Response>,
    },
    /// A kernel's `runsc run` was reaped.
    KernelReaped {
        /// Kernel key.
        kernel: usize,
        /// Kernel serial.
        serial: u64,
        /// What was found.
        cleanup: Cleanup,
    },
    /// An agent loop's thread asks something of the reactor.
    Agent {
        /// The loop's connection key.
        conn: usize,
        /// Its serial.
        serial: u64,
        /// What it asks.
        msg: crate::agent::AgentMsg,
    },
}

impl Daemon {
    /// Acts on one completion.
    pub(crate) fn on_completion(&mut self, c: Completion) {
        match c {
            Completion::Spawned {
                run,
                serial,
                result,
            } => self.run_spawned(run, serial, result),
            Completion::Done => {}
            Completion::Outcome {
                conn,
                serial,
                outcome,
            } => self.on_outcome(conn, serial, outcome),
            Completion::UploadReady {
                conn,
                serial,
                result,
            } => self.on_upload_ready(conn, serial, result),
            Completion::Upkeep => self.upkeep_running = false,
            Completion::WarmBooted { runtime, result } => self.warm_booted(runtime, result),
            Completion::KernelSpawned {
                kernel,
                serial,
                result,
            } => self.kernel_spawned(kernel, serial, result),
            Completion::KernelReaped {
                kernel,
                serial,
                cleanup,
            } => self.kernel_reaped(kernel, serial, cleanup),
            Completion::Agent { conn, serial, msg } => self.agent_msg(conn, serial, msg),
            Completion::KernelFiles {
                kernel,
                serial,
                run,
                result,
            } => self.kernel_files_written(kernel, serial, run, result),
            Completion::EgressChecked => {
                self.egress_running = false;
                self.warm_purge_stale();
                if self.egress_dirty {
                    self.start_egress_check(false);
                }
            }
            Completion::UploadWrote {
                conn,
                serial,
                target,
                result,
            } => self.on_upload_wrote(conn, serial, target, result),
            Completion::Reaped {
                run,
                serial,
                cleanup,
            } => self.run_cleaned(run, serial, cleanup),
            Completion::Probe(res) => {
                self.app.probe = match res {
                    Ok(()) => {
                        log::info!("backend self-probe passed");
                        self.app.probe = ProbeState::Passed;
                        self.warm_fill();
                        ProbeState::Passed
                    }
                    Err(why) => {
                        log::error!("backend self-probe failed: {why}");
                        ProbeState::Failed(why)
                    }
                }
            }
        }
    }
}

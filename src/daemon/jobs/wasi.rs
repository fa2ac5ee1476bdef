//! WebAssembly jobs (`"runtime": "wasi"`) on the job queue: instead of a sandbox, one
//! `isobox-wasm wasi` process per attempt (`wasm::wasi_job`), run on a thread of its
//! own; its output goes into the job's log through the same redactor, its `/output`
//! files become the job's result files, and its end decides the job's state as a
//! command's exit does (`job_saved`).
//!
//! The module and stdin are files of the job's directory, written before its record
//! (`write_wasm_files`); a module named by an input is read from the staged input.
//! A daemon that stops kills the process (its thread ends it at once) and leaves the
//! record `running`, so the next start recovers it as it does a job whose sandbox
//! died: retried if `retry` allows, else `sandbox_lost`.

use super::*;
use crate::store::jobs::{WASM_MODULE_FILE, WASM_STDIN_FILE};
use crate::wasm::wasi_job::{self, Ended, OutputLimits, Place, Spec, Stream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The first of the uids WebAssembly jobs run as (each attempt its own, by its
/// serial); [`WASI_UID_COUNT`] of them. Debian leaves 65000–65533 to local use; the
/// eryx builds use 65533.
const WASI_UID_BASE: u32 = 65000;
const WASI_UID_COUNT: u32 = 500;

/// Why WebAssembly jobs cannot run on this server (`None`: they can).
pub(crate) fn wasi_refusal(d: &Daemon) -> Option<&'static str> {
    d.cfg.eryx.worker.is_none().then_some(
        "WebAssembly jobs are unavailable on this server: its WebAssembly worker is off (ISOBOX_WASM_WORKER)",
    )
}

impl Daemon {
    /// The daemon stops: every WebAssembly job's process is killed (their records
    /// stay `running`; the next start recovers them).
    pub(crate) fn job_wasi_stop_all(&mut self) {
        for (_, j) in self.jobs.live.iter() {
            if let Some(stop) = &j.wasi_stop {
                stop.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Its `starting` record is durable and its inputs are staged: run its module.
    pub(super) fn job_boot_wasi(
        &mut self,
        jk: usize,
        js: u64,
        staged: Result<Option<Staged>, JobError>,
    ) {
        if self.app.shutting_down {
            return;
        }
        let Some(worker) = self.cfg.eryx.worker.clone() else {
            let why = wasi_refusal(self).unwrap_or_default();
            self.job_lost(jk, js, why);
            return;
        };
        let cap = self.cfg.wbx.jobs.log_bytes;
        let runs = self.cfg.data_dir.join("runs");
        let (cgroups, slice) = (self.app.cgroups.clone(), self.cfg.instance.clone());
        let dest = self.jobs.dir.clone();
        let mailbox = self.reactor.mailbox();
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if j.cancelled {
            self.job_end(jk, js);
            return;
        }
        let input = match staged {
            Ok(None) => None,
            Ok(Some((dir, files))) => {
                for (input, (size, sha)) in j.rec.spec.inputs.iter_mut().zip(files) {
                    input.size = Some(size);
                    input.sha256 = Some(sha);
                }
                Some(dir)
            }
            Err(e) => {
                let note = format!("[wbx] {}\n", e.message);
                if e.kind == "system" {
                    self.job_lost(jk, js, &e.message);
                } else {
                    j.rec.error = Some(e);
                    j.rec.status = "failed".into();
                    self.job_note(jk, js, &note);
                    self.job_end(jk, js);
                }
                return;
            }
        };
        let Some(w) = j.rec.spec.wasm.clone() else {
            return;
        };
        let stop = Arc::new(AtomicBool::new(false));
        j.wasi_stop = Some(Arc::clone(&stop));
        j.phase = Phase::Running;
        j.ran = Some(Instant::now());
        j.rec.status = "running".into();
        let job_dir = dest.join(&j.id);
        let run_dir = runs.join(format!("wasi-{}-{}", j.id, j.rec.attempt));
        let uid = WASI_UID_BASE + (j.serial % u64::from(WASI_UID_COUNT)) as u32;
        let patterns: Vec<Pattern> = j
            .rec
            .spec
            .artifacts
            .iter()
            .filter_map(|p| Pattern::parse(p).ok())
            .collect();
        let env = j.env.clone();
        let timeout = Duration::from_secs(j.rec.spec.timeout_s);
        // The first free result-file number (a retry's files are numbered on).
        let prefix = format!("w{}-", j.rec.attempt);
        self.jobs.wasi_running += 1;
        self.job_store(jk, js, false);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let thread_mailbox = mailbox.clone();
            let spawned = std::thread::Builder::new()
                .name("isobox-wasi".into())
                .spawn(move || {
                    let mailbox = thread_mailbox;
                    // Ok(bytes); Err(Ok(why)): ours; Err(Err(why)): the job's input.
                    let module: Result<Vec<u8>, Result<String, String>> = match &w.module_input {
                        None => std::fs::read(job_dir.join(WASM_MODULE_FILE))
                            .map_err(|e| Ok(format!("its module could not be read: {e}"))),
                        Some(name) => read_module_input(input.as_deref(), name)
                            .map_err(|e| Err(format!("wasm.module: input/{name}: {e}"))),
                    };
                    let stdin = if w.stdin_bytes > 0 {
                        std::fs::read(job_dir.join(WASM_STDIN_FILE))
                    } else {
                        Ok(Vec::new())
                    };
                    let r = match (module, stdin) {
                        (Ok(module), Ok(stdin)) => {
                            if let Err(resp) = wj::check_module(&module, "wasm.module") {
                                Err(Err(String::from_utf8_lossy(&resp.body).into_owned()))
                            } else {
                                let spec = Spec {
                                    module,
                                    args: w.args.clone(),
                                    env,
                                    stdin,
                                    input: input.clone(),
                                    memory_mb: w.memory_mb,
                                    timeout,
                                };
                                let place = Place {
                                    worker: &worker,
                                    cgroups: cgroups.as_ref(),
                                    slice: &slice,
                                    dir: &run_dir,
                                    uid,
                                    dest: &job_dir,
                                    prefix: &prefix,
                                };
                                let wanted = |name: &str| {
                                    patterns.is_empty() || patterns.iter().any(|p| p.matches(name))
                                };
                                let limits = OutputLimits {
                                    files: wj::MAX_WASM_OUTPUT_FILES,
                                    bytes: wj::MAX_WASM_OUTPUT_BYTES,
                                    wanted: &wanted,
                                };
                                // The log keeps `cap` bytes: no more is sent to the
                                // loop (what is past it is only counted).
                                let sent = AtomicU64::new(0);
                                let dropped = Arc::new(AtomicU64::new(0));
                                let past_cap = Arc::clone(&dropped);
                                let out_box = mailbox.clone();
                                let out = move |_: Stream, b: Vec<u8>| {
                                    let n = b.len() as u64;
                                    if sent.fetch_add(n, Ordering::Relaxed) >= cap {
                                        past_cap.fetch_add(n, Ordering::Relaxed);
                                        return;
                                    }
                                    out_box.send(Box::new(move |d: &mut Daemon| {
                                        d.job_wasi_output(jk, js, &b)
                                    }));
                                };
                                let r = wasi_job::run(&place, &spec, limits, &stop, &out);
                                r.map(|e| (e, dropped.load(Ordering::Relaxed))).map_err(Ok)
                            }
                        }
                        (Err(e), _) => Err(e),
                        (_, Err(e)) => Err(Ok(format!("its stdin could not be read: {e}"))),
                    };
                    mailbox.send(Box::new(move |d: &mut Daemon| d.job_wasi_ended(jk, js, r)));
                });
            Box::new(move |d: &mut Daemon| {
                if let Err(e) = spawned {
                    d.job_wasi_ended(jk, js, Err(Ok(format!("no thread for it: {e}"))));
                }
            })
        }));
    }

    /// Output of the module: into the log as a command's is.
    fn job_wasi_output(&mut self, jk: usize, js: u64, data: &[u8]) {
        let cap = self.cfg.wbx.jobs.log_bytes;
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if j.logged >= cap {
            j.rec.log_dropped += data.len() as u64;
            return;
        }
        let out = j.redact.push(data);
        j.log(out, cap);
    }

    /// The module's run is over: `Ok` how it ended (and output bytes not sent for the
    /// log's cap); `Err(Ok(why))` the server's failure (retried as a lost sandbox is),
    /// `Err(Err(why))` the job's own (its module input cannot be a module).
    fn job_wasi_ended(
        &mut self,
        jk: usize,
        js: u64,
        r: Result<(Ended, u64), Result<String, String>>,
    ) {
        self.jobs.wasi_running = self.jobs.wasi_running.saturating_sub(1);
        let cap = self.cfg.wbx.jobs.log_bytes;
        let stopping = self.app.shutting_down;
        let Some(j) = self.job(jk, js) else {
            return;
        };
        j.wasi_stop = None;
        if stopping && !j.cancelled {
            // Killed by the daemon's stop: its record stays `running`, and the next
            // start recovers it.
            return;
        }
        let (ended, dropped) = match r {
            Ok(x) => x,
            Err(Ok(why)) => {
                log::error!("jobs: {}: its WebAssembly run: {why}", j.id);
                self.job_lost(
                    jk,
                    js,
                    "its WebAssembly run could not be started on our side",
                );
                return;
            }
            Err(Err(why)) => {
                j.rec.error = Some(JobError {
                    code: "start_failed".into(),
                    message: why.clone(),
                    kind: "job".into(),
                });
                self.job_note(jk, js, &format!("[wbx] {why}\n"));
                self.job_saved(jk, js);
                return;
            }
        };
        j.rec.log_dropped += dropped;
        j.exit = ended.exit_code;
        j.rec.exit_code = ended.exit_code;
        j.timed_out = ended.timed_out;
        j.run_ms = ended.module_run_ms.unwrap_or(ended.wall_ms);
        j.rec.cpu_ms = ended.cpu_ms;
        j.rec.peak_memory_bytes = ended.module_peak_bytes;
        let rest = j.redact.finish();
        j.log(rest, cap);
        let mut notes = String::new();
        if j.rec.log_dropped > 0 {
            notes.push_str(&format!(
                "\n[wbx] the log keeps {cap} bytes of output; {} more were dropped\n",
                j.rec.log_dropped
            ));
        }
        let own = !j.cancelled && !ended.timed_out;
        if let Some(e) = ended.setup_error.as_ref().filter(|_| own) {
            notes.push_str(&format!("[wbx] the module could not start: {e}\n"));
            j.rec.error = Some(JobError {
                code: "start_failed".into(),
                message: format!("the module could not start: {e}"),
                kind: "job".into(),
            });
        } else if ended.oom && own {
            let msg = format!(
                "the run needed more memory than it may use (the module's {} MiB, /output and /tmp, and the runtime)",
                j.rec.spec.wasm.as_ref().map_or(0, |w| w.memory_mb)
            );
            notes.push_str(&format!("[wbx] {msg}\n"));
            j.rec.error = Some(JobError {
                code: "out_of_memory".into(),
                message: msg,
                kind: "job".into(),
            });
        } else if let Some(t) = ended.trap.as_ref().filter(|_| own) {
            notes.push_str(&format!("[wbx] the module trapped: {t}\n"));
            j.rec.error = Some(JobError {
                code: "nonzero_exit".into(),
                message: format!(
                    "the module trapped (exit code {}): {t}",
                    wasi_job::TRAP_EXIT
                ),
                kind: "job".into(),
            });
        } else if ended.exit_code.is_none() && own {
            // Neither its end nor a limit: the worker died on our side.
            self.job_lost(jk, js, "its WebAssembly runtime ended without an outcome");
            return;
        }
        if !notes.is_empty() {
            self.job_note(jk, js, &notes);
        }
        let Some(j) = self.job(jk, js) else {
            return;
        };
        let mut save = Save::default();
        for s in ended.saved {
            save.saved.push(Artifact {
                name: s.name,
                size: s.size,
                sha256: s.sha256,
                file: s.file,
            });
        }
        for (name, reason) in ended.skipped {
            save.skip(Skipped { name, reason });
        }
        j.save = Some(save);
        self.job_saved(jk, js);
    }
}

/// The staged input `name` (a path under `/input`), at most
/// `MAX_WASM_INPUT_MODULE_BYTES`, not through a link.
fn read_module_input(input: Option<&Path>, name: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let Some(dir) = input else {
        return Err(std::io::Error::other("the job has no inputs"));
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(name))?;
    let mut buf = Vec::new();
    f.take(wj::MAX_WASM_INPUT_MODULE_BYTES + 1)
        .read_to_end(&mut buf)?;
    if buf.len() as u64 > wj::MAX_WASM_INPUT_MODULE_BYTES {
        return Err(std::io::Error::other(format!(
            "the module input {name} is larger than {} bytes",
            wj::MAX_WASM_INPUT_MODULE_BYTES
        )));
    }
    Ok(buf)
}

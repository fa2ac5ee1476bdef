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
    (!d.cfg.wbx.jobs.wasi).then_some(
        "WebAssembly jobs are unavailable on this server: its WebAssembly worker (isobox-wasm) is off or not installed",
    )
}

impl Daemon {
    /// Removes result files no record names (on the pool).
    fn drop_files(&mut self, files: Vec<PathBuf>) {
        if files.is_empty() {
            return;
        }
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            for f in files {
                let _ = std::fs::remove_file(f);
            }
            Box::new(|_: &mut Daemon| {})
        }));
    }

    /// Whether `tenant` may store `adding` more bytes of WebAssembly modules and stdin
    /// for a new job: with its stored results and its unfinished WebAssembly jobs'
    /// files, under `ISOBOX_WBX_ARTIFACT_TENANT_MB`. The 429, else `None`.
    pub(super) fn wasi_bytes_refusal(&self, tenant: &str, adding: u64) -> Option<Response> {
        let c = &self.cfg.wbx.jobs;
        let stored = self.jobs.tenant_bytes.get(tenant).copied().unwrap_or(0);
        let queued: u64 = self
            .jobs
            .live
            .iter()
            .filter(|(_, j)| j.rec.tenant == tenant)
            .filter_map(|(_, j)| j.rec.spec.wasm.as_ref())
            .map(|w| w.module_bytes + w.stdin_bytes)
            .sum();
        (stored + queued + adding > c.artifact_tenant_bytes).then(|| {
            crate::wbx::error(
                429,
                &format!(
                    "limit reached: this tenant's stored job results and logs ({stored} bytes) and its unfinished WebAssembly jobs' modules and stdin ({queued} bytes), with this job's {adding}, exceed its {} bytes (ISOBOX_WBX_ARTIFACT_TENANT_MB)",
                    c.artifact_tenant_bytes
                ),
            )
        })
    }

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
        let Some(input) = self.job_staged(jk, js, staged) else {
            return;
        };
        let Some(j) = self.job(jk, js) else {
            return;
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
        // A uid no other running WebAssembly job has.
        let Some(uid) = (WASI_UID_BASE..WASI_UID_BASE + WASI_UID_COUNT)
            .find(|u| !self.jobs.wasi_uids.contains(u))
        else {
            self.job_lost(
                jk,
                js,
                "no free user id for another WebAssembly job right now",
            );
            return;
        };
        let c = self.cfg.wbx.jobs.clone();
        let tenant_used = self
            .job(jk, js)
            .map(|j| j.rec.tenant.clone())
            .and_then(|t| self.jobs.tenant_bytes.get(&t).copied())
            .unwrap_or(0);
        let Some(j) = self.job(jk, js) else {
            return;
        };
        j.wasi_uid = Some(uid);
        // `artifacts` picks among /output's files (with `required_artifacts`, as for
        // any job); none given: all of them.
        let patterns: Vec<Pattern> = if j.rec.spec.artifacts.is_empty() {
            Vec::new()
        } else {
            j.rec
                .spec
                .artifacts
                .iter()
                .chain(&j.rec.spec.required_artifacts)
                .filter_map(|p| Pattern::parse(p).ok())
                .collect()
        };
        let (max_files, max_bytes, file_bytes) = (
            wj::MAX_WASM_OUTPUT_FILES.min(c.artifact_files),
            wj::MAX_WASM_OUTPUT_BYTES
                .min(c.artifact_job_bytes)
                .min(c.artifact_tenant_bytes.saturating_sub(tenant_used)),
            c.artifact_file_bytes,
        );
        let env = j.env.clone();
        let timeout = Duration::from_secs(j.rec.spec.timeout_s);
        // The first free result-file number (a retry's files are numbered on).
        let prefix = format!("w{}-", j.rec.attempt);
        self.jobs.wasi_running += 1;
        self.jobs.wasi_uids.insert(uid);
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
                                let v: serde_json::Value =
                                    serde_json::from_slice(&resp.body).unwrap_or_default();
                                Err(Err(v["error"]
                                    .as_str()
                                    .unwrap_or("wasm.module: not a WebAssembly module")
                                    .to_string()))
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
                                // Bounded as a sandbox job's saving is: past the
                                // budget, no more files are wanted.
                                let budget = std::cell::Cell::new(crate::jobs::MATCH_BUDGET);
                                let wanted = |name: &str| {
                                    patterns.is_empty()
                                        || patterns.iter().any(|p| {
                                            let mut b = budget.get();
                                            let r = p.matches_within(name, &mut b);
                                            budget.set(b);
                                            r == Some(true)
                                        })
                                };
                                let limits = OutputLimits {
                                    files: max_files,
                                    bytes: max_bytes,
                                    file_bytes,
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
        if let Some(uid) = j.wasi_uid.take() {
            self.jobs.wasi_uids.remove(&uid);
        }
        let jobs_dir = self.jobs.dir.clone();
        let Some(j) = self.job(jk, js) else {
            return;
        };
        // Files it saved that no record will name (on the paths below that keep none).
        let orphans: Vec<PathBuf> = match &r {
            Ok((e, _)) => e
                .saved
                .iter()
                .map(|s| jobs_dir.join(&j.id).join(&s.file))
                .collect(),
            Err(_) => Vec::new(),
        };
        if stopping && !j.cancelled {
            // Killed by the daemon's stop: its record stays `running`, and the next
            // start recovers it.
            self.drop_files(orphans);
            return;
        }
        if j.cancelled && r.is_err() {
            // Cancelled meanwhile: that is how it ends, whatever else went wrong.
            self.job_end(jk, js);
            return;
        }
        if j.writer.is_none() {
            // Its log could not be written: lost on our side, as a sandbox job's is.
            self.drop_files(orphans);
            self.job_lost(jk, js, "its job's log could not be written");
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
        // Billed: the process's whole run (compiling the module included), which its
        // time limit counts too.
        j.run_ms = ended.wall_ms;
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
            self.drop_files(orphans);
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

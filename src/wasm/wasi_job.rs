//! One WebAssembly job (`"runtime": "wasi"`): `isobox-wasm wasi` started for it alone,
//! jailed as an eryx worker is (`super::spawn_jailed`: its own cgroup, an empty network
//! namespace, no new privileges, the worker's seccomp filter before the module is
//! parsed), as a user of the job's own, with the job's time limit; then its `/output`
//! saved as result files.
//!
//! The module's files live in a tmpfs of [`SCRATCH_BYTES`] mounted for the job under
//! the daemon's runs directory (so the startup sweep removes what a crash leaves):
//! `/output` and `/tmp` share it, and its pages are charged to the job's cgroup, so a
//! module can fill neither the host's disk nor its memory. `/input` is a directory the
//! caller staged, bound read-only. The module's bytes and its stdin are files the
//! runner writes root-owned and read-only beside the tmpfs.
//!
//! Blocking: call on a thread of its own (it forks and waits; never the reactor).

use crate::cgroup::{Hierarchy, HostLimits};
use crate::sys::jail::Access;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The tmpfs that holds `/output` and `/tmp` together.
pub const SCRATCH_BYTES: u64 = 128 << 20;

/// Memory the worker needs beside the module's own (wasmtime, the compiled code).
const RUNTIME_BYTES: u64 = 256 << 20;

/// Exit code of a module that trapped (`isobox-wasm`'s `TRAP_EXIT`).
pub const TRAP_EXIT: i32 = 134;

/// Deepest directory under `/output` that is looked through.
const MAX_DEPTH: usize = 32;

/// Entries looked at under `/output` at most (files past the limits are listed as
/// skipped up to this, so a module cannot make the listing itself unbounded).
const MAX_SEEN: usize = 4096;

/// What to run.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The module's bytes.
    pub module: Vec<u8>,
    /// Its arguments after `argv[0]`.
    pub args: Vec<String>,
    /// Its environment (values may be secrets: never on a command line).
    pub env: Vec<(String, String)>,
    /// Its stdin (empty: an empty stdin).
    pub stdin: Vec<u8>,
    /// A directory to show it read-only as `/input`.
    pub input: Option<PathBuf>,
    /// Its linear memory and tables may hold this much.
    pub memory_mb: u64,
    /// Wall time from the worker's start, compiling the module included.
    pub timeout: Duration,
}

/// How many result files, and how many bytes together, are saved, and which.
#[derive(Clone, Copy)]
pub struct OutputLimits<'a> {
    /// Files.
    pub files: usize,
    /// Bytes, all files together.
    pub bytes: u64,
    /// Bytes of one file.
    pub file_bytes: u64,
    /// Whether a file (`output/…`) is wanted at all (one that is not is left out,
    /// not listed as skipped).
    pub wanted: &'a dyn Fn(&str) -> bool,
}

/// A saved result file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// `output/…`.
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// Hex SHA-256.
    pub sha256: String,
    /// Its file's name in the destination directory.
    pub file: String,
}

/// How the job ended.
#[derive(Debug, Clone, Default)]
pub struct Ended {
    /// The module's exit code (a trap: [`TRAP_EXIT`]); `None` when it did not end by
    /// itself (killed at the time limit, cancelled, out of memory) or never started.
    pub exit_code: Option<i32>,
    /// A trap's message.
    pub trap: Option<String>,
    /// The module could not start (does not parse, is not a WASI command, asks for
    /// more memory than allowed at instantiation): the worker's words.
    pub setup_error: Option<String>,
    /// Killed at the time limit.
    pub timed_out: bool,
    /// Killed because `cancel` was set.
    pub cancelled: bool,
    /// Killed by its cgroup's memory limit.
    pub oom: bool,
    /// From the worker's start to its end.
    pub wall_ms: u64,
    /// The module's own run time, from its first instruction (as the worker measured
    /// it), when it ended by itself.
    pub module_run_ms: Option<u64>,
    /// The most its linear memories held at once (as the worker measured it).
    pub module_peak_bytes: Option<u64>,
    /// CPU time of the worker (compiling included), when the cgroup says.
    pub cpu_ms: Option<u64>,
    /// Its cgroup's peak memory, when the cgroup says.
    pub peak_memory_bytes: Option<u64>,
    /// Result files saved, in name order.
    pub saved: Vec<Saved>,
    /// Result files not saved, and why.
    pub skipped: Vec<(String, String)>,
}

/// Which stream output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// fd 1 and fd 2, in the order written (one pipe).
    Output,
}

/// Where the job runs.
pub struct Place<'a> {
    /// `isobox-wasm`.
    pub worker: &'a Path,
    /// The cgroup hierarchy (`None`: no cgroup; tests without one only).
    pub cgroups: Option<&'a Hierarchy>,
    /// The daemon's slice.
    pub slice: &'a str,
    /// A fresh directory's path under the runs directory (made here, removed here).
    pub dir: &'a Path,
    /// The uid and gid the module runs as.
    pub uid: u32,
    /// Where result files are saved (it exists), as `prefix` + a number.
    pub dest: &'a Path,
    /// The saved files' name prefix in `dest`.
    pub prefix: &'a str,
}

/// Runs `spec` in `place`, passing its output to `out` as it comes, and saves its
/// `/output` into `place.dest` within `limits`. Removes everything it made (the
/// directory, its mount, the cgroup) before it returns, whatever happened.
///
/// # Errors
/// The server's failures (a directory, the mount, the cgroup or the process could not
/// be made): the job did not run, through no fault of its own.
pub fn run(
    place: &Place<'_>,
    spec: &Spec,
    limits: OutputLimits<'_>,
    cancel: &AtomicBool,
    out: &(dyn Fn(Stream, Vec<u8>) + Sync),
) -> Result<Ended, String> {
    let scratch = place.dir.join("fs");
    let r = prepare(place, spec, &scratch).and_then(|()| {
        let name = place
            .dir
            .file_name()
            .map_or_else(|| "wasi".into(), |n| n.to_string_lossy().into_owned());
        let cgroup = match place.cgroups {
            Some(h) => Some(
                h.create_run(
                    place.slice,
                    &name,
                    HostLimits {
                        memory_bytes: (spec.memory_mb << 20) + SCRATCH_BYTES + RUNTIME_BYTES,
                        cpu_quota_us: crate::cgroup::CPU_PERIOD_US,
                        pids: 32,
                        cpu_weight: None,
                    },
                )
                .map_err(|e| format!("its cgroup: {e}"))?,
            ),
            None => None,
        };
        let r = execute(place, spec, cgroup.as_ref(), cancel, out);
        // Nothing of it may still run while its files are read.
        let emptied = cgroup.as_ref().is_none_or(|cg| cg.kill_all());
        let r = r.map(|mut ended| {
            if let Some(cg) = &cgroup {
                let u = cg.usage();
                ended.cpu_ms = (u.cpu_ns > 0).then_some(u.cpu_ns / 1_000_000);
                ended.peak_memory_bytes = cg.peak_memory_bytes();
                if ended.exit_code.is_none() && !ended.timed_out && !ended.cancelled {
                    ended.oom = cg.oom_kills() > 0;
                }
            }
            if emptied {
                let (saved, skipped) = save_outputs(&scratch.join("output"), place, limits);
                ended.saved = saved;
                ended.skipped = skipped;
            } else {
                log::error!("wasi: a job's processes would not die; its /output is not read");
                ended.skipped.push((
                    "output/".into(),
                    "not saved: the run's processes could not be stopped".into(),
                ));
            }
            ended
        });
        if let Some(cg) = cgroup {
            if let Err(e) = cg.destroy() {
                log::warn!("wasi: removing a job's cgroup: {e}");
            }
        }
        r
    });
    if let Err(e) = remove(place.dir) {
        log::error!("wasi: removing {}: {e}", place.dir.display());
    }
    r
}

/// Unmounts the scratch tmpfs and the inputs' bind (where mounted) and removes the
/// directory.
pub fn remove(dir: &Path) -> std::io::Result<()> {
    for m in ["fs", "input"] {
        if let Err(e) = crate::sys::loopdev::umount2(&dir.join(m), libc::MNT_DETACH) {
            if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) {
                return Err(e);
            }
        }
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// The directory: `module.wasm` and `stdin` (root's, read-only), and `fs`, a tmpfs
/// with `output/` and `tmp/` of the job's user.
fn prepare(place: &Place<'_>, spec: &Spec, scratch: &Path) -> Result<(), String> {
    let err = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
    // Only the job's own group may pass through (its user opens its files by name);
    // no other user, another job's included, may enter.
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(place.dir)
        .map_err(|e| err(place.dir, e))?;
    std::os::unix::fs::lchown(place.dir, Some(0), Some(place.uid))
        .map_err(|e| err(place.dir, e))?;
    std::fs::set_permissions(place.dir, std::fs::Permissions::from_mode(0o710))
        .map_err(|e| err(place.dir, e))?;
    for (name, bytes) in [("module.wasm", &spec.module), ("stdin", &spec.stdin)] {
        let p = place.dir.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&p)
            .map_err(|e| err(&p, e))?;
        f.write_all(bytes).map_err(|e| err(&p, e))?;
        std::os::unix::fs::lchown(&p, Some(0), Some(place.uid)).map_err(|e| err(&p, e))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o440))
            .map_err(|e| err(&p, e))?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(scratch)
        .map_err(|e| err(scratch, e))?;
    let opts = format!("size={SCRATCH_BYTES},nr_inodes=16384,mode=0711,uid=0,gid=0");
    crate::sys::loopdev::mount(
        Path::new("tmpfs"),
        scratch,
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        &opts,
    )
    .map_err(|e| err(scratch, e))?;
    if let Some(input) = &spec.input {
        // The staged inputs sit in the job's directory, which only root may enter:
        // bound read-only here, where the job's user may pass.
        let at = place.dir.join("input");
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&at)
            .map_err(|e| err(&at, e))?;
        let bind = libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        crate::sys::loopdev::mount(input, &at, "", bind, "").map_err(|e| err(&at, e))?;
        crate::sys::loopdev::mount(
            Path::new(""),
            &at,
            "",
            bind | libc::MS_REMOUNT | libc::MS_RDONLY,
            "",
        )
        .map_err(|e| err(&at, e))?;
    }
    for d in ["output", "tmp"] {
        let p = scratch.join(d);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&p)
            .map_err(|e| err(&p, e))?;
        std::os::unix::fs::lchown(&p, Some(place.uid), Some(place.uid)).map_err(|e| err(&p, e))?;
    }
    Ok(())
}

/// Starts the worker and waits for its end, its output streamed to `out`.
fn execute(
    place: &Place<'_>,
    spec: &Spec,
    cgroup: Option<&crate::cgroup::RunCgroup>,
    cancel: &AtomicBool,
    out: &(dyn Fn(Stream, Vec<u8>) + Sync),
) -> Result<Ended, String> {
    let scratch = place.dir.join("fs");
    let mut cmd = Command::new(place.worker);
    cmd.arg("wasi")
        .arg("--module")
        .arg(place.dir.join("module.wasm"))
        .arg("--stdin")
        .arg(place.dir.join("stdin"))
        .arg("--memory-mb")
        .arg(spec.memory_mb.to_string())
        .arg("--environ")
        .arg("--dir")
        .arg(format!("/output={}", scratch.join("output").display()))
        .arg("--dir")
        .arg(format!("/tmp={}", scratch.join("tmp").display()));
    if spec.input.is_some() {
        cmd.arg("--ro-dir")
            .arg(format!("/input={}", place.dir.join("input").display()));
    }
    for a in &spec.args {
        cmd.arg("--arg").arg(a);
    }
    // stdout and stderr share one pipe, so the log has them in the order the module
    // wrote them (two pipes read by two threads would interleave them by chance).
    let (output, output_w) = std::io::pipe().map_err(|e| format!("its output pipe: {e}"))?;
    let output_w2 = output_w
        .try_clone()
        .map_err(|e| format!("its output pipe: {e}"))?;
    cmd.stdout(Stdio::from(output_w))
        .stderr(Stdio::from(output_w2));
    // `spawn_jailed` clears the environment; these are set after it, on the command.
    // It sees its module, its stdin, its input, and writes only its two directories.
    let mut given_paths = vec![
        (place.dir.join("module.wasm"), Access::Read),
        (place.dir.join("stdin"), Access::Read),
        (scratch.join("output"), Access::Write),
        (scratch.join("tmp"), Access::Write),
    ];
    if spec.input.is_some() {
        given_paths.push((place.dir.join("input"), Access::Read));
    }
    let given: Vec<(&Path, Access)> = given_paths.iter().map(|(p, a)| (p.as_path(), *a)).collect();
    let view = super::view_of(place.worker, &given)?;
    let (mut child, sock) = super::spawn_jailed_with(cmd, cgroup, 1, place.uid, view, |c| {
        for (k, v) in &spec.env {
            c.env(format!("{}{k}", ENVIRON_PREFIX), v);
        }
    })?;
    let started = Instant::now();
    // (The command, with the pipe's writing ends, was dropped by the spawn: the
    // reader sees the end once the process is gone.)
    let ended = std::thread::scope(|sc| {
        // A thread the system refuses is an error, not a panic (which would abort
        // the daemon): the process is killed and the run fails on our side.
        let mut threads = Vec::new();
        let mut refused = None;
        let jobs: Vec<Box<dyn FnOnce() -> String + Send + '_>> = vec![
            Box::new(move || {
                forward(output, Stream::Output, out);
                String::new()
            }),
            // The outcome line on fd 3.
            Box::new(move || {
                let mut s = String::new();
                let _ = (&sock).take(64 << 10).read_to_string(&mut s);
                s
            }),
        ];
        for f in jobs {
            match std::thread::Builder::new()
                .name("isobox-wasi-io".into())
                .spawn_scoped(sc, f)
            {
                Ok(t) => threads.push(t),
                Err(e) => {
                    refused = Some(e.to_string());
                    break;
                }
            }
        }
        if let Some(e) = refused {
            super::kill_jailed(&mut child, cgroup);
            for t in threads {
                let _ = t.join();
            }
            return Err(format!("no thread for its output: {e}"));
        }
        let deadline = started + spec.timeout;
        let mut ended = Ended::default();
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if cancel.load(Ordering::Relaxed) => {
                    ended.cancelled = true;
                    break None;
                }
                Ok(None) if Instant::now() >= deadline => {
                    ended.timed_out = true;
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break None,
            }
        };
        if status.is_none() {
            super::kill_jailed(&mut child, cgroup);
        }
        ended.wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let line = threads
            .into_iter()
            .map(|t| t.join().unwrap_or_default())
            .collect::<String>();
        if status.is_some() {
            let v: serde_json::Value =
                serde_json::from_str(line.trim()).unwrap_or(serde_json::Value::Null);
            if let Some(e) = v["error"].as_str() {
                ended.setup_error = Some(e.to_string());
            } else if let Some(code) = v["exit_code"].as_i64() {
                ended.exit_code = i32::try_from(code).ok();
                ended.trap = v["trap"].as_str().map(str::to_string);
                ended.module_run_ms = v["run_ms"].as_u64();
                ended.module_peak_bytes = v["peak_memory_bytes"].as_u64();
            }
        }
        Ok(ended)
    });
    ended
}

/// The prefix under which the worker finds the module's environment
/// (`isobox-wasm wasi --environ`).
pub const ENVIRON_PREFIX: &str = "WASI_ENV_";

/// Copies a pipe to `out` in pieces of at most 64 KiB until it ends.
fn forward<R: Read>(mut pipe: R, s: Stream, out: &(dyn Fn(Stream, Vec<u8>) + Sync)) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => out(s, buf[..n].to_vec()),
        }
    }
}

/// Saves the regular files under `root` (the job's `/output`, nothing of it running
/// any more) into `place.dest`, in name order, within `limits`; the rest is skipped
/// with the reason. Links are never followed (a module cannot make one; they are
/// skipped all the same), and a file's apparent size counts, so a sparse file cannot
/// pass for a small one.
fn save_outputs(
    root: &Path,
    place: &Place<'_>,
    limits: OutputLimits<'_>,
) -> (Vec<Saved>, Vec<(String, String)>) {
    let mut found: Vec<(String, PathBuf, u64)> = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();
    let mut stack: Vec<(PathBuf, String, usize)> = vec![(root.to_path_buf(), "output".into(), 0)];
    let mut seen = 0usize;
    while let Some((dir, name, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > MAX_SEEN {
                break;
            }
            let Some(part) = e.file_name().to_str().map(str::to_string) else {
                skipped.push((
                    format!("{name}/{}", e.file_name().to_string_lossy()),
                    "its name is not UTF-8".into(),
                ));
                continue;
            };
            let rel = format!("{name}/{part}");
            let Ok(md) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if md.is_dir() {
                if depth + 1 >= MAX_DEPTH {
                    skipped.push((rel, format!("deeper than {MAX_DEPTH} directories")));
                } else {
                    stack.push((e.path(), rel, depth + 1));
                }
            } else if md.is_file() {
                if (limits.wanted)(&rel) {
                    found.push((rel, e.path(), md.size()));
                }
            } else {
                skipped.push((rel, "not a regular file".into()));
            }
        }
    }
    if seen > MAX_SEEN {
        skipped.push((
            String::new(),
            format!("more than {MAX_SEEN} entries under output/: the rest were not looked at"),
        ));
    }
    found.sort();
    if !found.is_empty() {
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(place.dest);
    }
    let mut saved = Vec::new();
    let mut bytes = 0u64;
    for (rel, path, size) in found {
        if saved.len() >= limits.files {
            skipped.push((
                rel,
                format!("over the limit of {} result files", limits.files),
            ));
            continue;
        }
        if size > limits.file_bytes {
            skipped.push((
                rel,
                format!(
                    "larger than the limit of {} MB for one result file",
                    limits.file_bytes / 1_000_000
                ),
            ));
            continue;
        }
        if bytes + size > limits.bytes {
            skipped.push((
                rel,
                format!(
                    "over the limit of {} MB of result files together",
                    limits.bytes / 1_000_000
                ),
            ));
            continue;
        }
        let file = format!("{}{}", place.prefix, saved.len());
        match copy_hashed(&path, &place.dest.join(&file), size) {
            Ok(sha256) => {
                bytes += size;
                saved.push(Saved {
                    name: rel,
                    size,
                    sha256,
                    file,
                });
            }
            Err(e) => skipped.push((rel, format!("could not be saved: {e}"))),
        }
    }
    (saved, skipped)
}

/// Copies `from` (exactly `size` bytes, not following a link) to a new file `to`,
/// synced; its SHA-256.
fn copy_hashed(from: &Path, to: &Path, size: u64) -> std::io::Result<String> {
    let mut src = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(from)?;
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 64 << 10];
    let mut left = size;
    let r = (|| {
        while left > 0 {
            let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
            let n = src.read(&mut buf[..want])?;
            if n == 0 {
                return Err(std::io::Error::other("it got shorter while it was read"));
            }
            digest.update(&buf[..n]);
            dst.write_all(&buf[..n])?;
            left -= n as u64;
        }
        dst.sync_all()
    })();
    if let Err(e) = r {
        let _ = std::fs::remove_file(to);
        return Err(e);
    }
    let _ = std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o600));
    Ok(digest
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

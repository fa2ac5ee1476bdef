//! `isobox-wasm`: the WebAssembly worker of isoboxd. Python (CPython 3.14 compiled to
//! WebAssembly, run by eryx on wasmtime) runs here, never inside the daemon: an engine
//! escape lands in this process, which the daemon starts jailed (its own cgroup with a
//! memory cap, its own empty network namespace, no new privileges, an unprivileged
//! user) and which holds no keys.
//!
//! Two commands:
//! - `isobox-wasm prepare --cache DIR`: makes the pre-initialised, pre-compiled Python
//!   snapshot (`DIR/python-eryx<version>-<cpu>.cwasm`, ~60 MB, ~20 s) and the standard
//!   library it reads (`DIR/eryx-embedded/python-stdlib`) unless they are there.
//! - `isobox-wasm serve --cache DIR --threads N`: loads them, installs its seccomp
//!   filter (`seccomp.rs`) and serves runs on fd 3, a Unix stream socket to the
//!   daemon, in frames of a 4-byte big-endian length and a JSON object ([`Request`]
//!   in, [`Answer`] out; `{"ready": …}` first).
//! - `isobox-wasm build --cache DIR --packages DIR --out DIR [--name N]… [--import M]…`:
//!   an eryx environment's snapshot (`build.rs`); one JSON line on stdout says how it
//!   went.
//! - `isobox-wasm selftest`: installs the filter and prints what it refuses.
//! - `isobox-wasm wasi --module FILE …`: one WebAssembly job, a WASI preview 1 command
//!   (`wasi.rs`).
//! - `isobox-wasm bench --cache DIR`: the in-process reference of `bench/load/eryx.py`.

// The frames' format, one file shared with the daemon (`src/wasm/frame.rs`).
mod build;
#[path = "../../src/wasm/frame.rs"]
mod frame;
// Module names as the daemon checks them (`src/wasm/modname.rs`).
#[path = "../../src/wasm/modname.rs"]
mod modname;
mod seccomp;
mod wasi;

use frame::{read_frame, write_frame};

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The eryx version this worker is built with (pinned in Cargo.toml).
const ERYX_VERSION: &str = "0.5.0";

/// Modules imported into the snapshot, so runs do not pay for them.
const PREIMPORTS: &[&str] = &[
    "asyncio",
    "json",
    "re",
    "math",
    "datetime",
    "decimal",
    "collections",
    "itertools",
    "functools",
    "traceback",
    "ast",
    "types",
    // Sessions save and restore their state with these.
    "dill",
    "base64",
];

/// One run the daemon asks for.
#[derive(Debug, Deserialize)]
struct Request {
    id: u64,
    code: String,
    timeout_ms: u64,
    fuel: u64,
    memory_bytes: u64,
    /// Functions the code may `await`, answered by the daemon's client (the eryx
    /// WebSocket): each call goes out as a `{"callback": …}` frame and comes back as an
    /// `{"answer": …}` frame.
    #[serde(default)]
    callbacks: Vec<String>,
    /// How long one call may wait for its answer.
    #[serde(default = "default_callback_timeout_ms")]
    callback_timeout_ms: u64,
    /// Calls one run may make.
    #[serde(default = "default_max_callbacks")]
    max_callbacks: u32,
    /// Present when the run is a session's: its state is restored before the code
    /// and saved after it.
    #[serde(default)]
    session: Option<SessionIn>,
    /// Present when the run is in an uploaded environment: its snapshot and the
    /// site-packages it was built with (made by `isobox-wasm build`).
    #[serde(default)]
    env: Option<EnvIn>,
}

/// An uploaded environment a run uses.
#[derive(Debug, Deserialize)]
struct EnvIn {
    /// Its snapshot (`.cwasm`).
    snapshot: PathBuf,
    /// Its unpacked packages, mounted read-only at `/site-packages`.
    site: PathBuf,
}

/// A session run's state going in.
#[derive(Debug, Deserialize)]
struct SessionIn {
    /// The state the session's last kept run left (dill's bytes, base64); absent for
    /// a session's first run.
    #[serde(default)]
    state: Option<String>,
}

fn default_callback_timeout_ms() -> u64 {
    30_000
}

fn default_max_callbacks() -> u32 {
    100
}

/// The daemon's answer to one callback call.
#[derive(Debug, Deserialize)]
struct CallAnswer {
    /// The run.
    id: u64,
    /// The call, as the worker numbered it.
    call: u64,
    /// What `await` returns (JSON), unless `error` is set.
    #[serde(default)]
    result: serde_json::Value,
    /// Raised in Python as `RuntimeError(error)`.
    error: Option<String>,
}

/// How a run ended, as the eryx face reports it.
#[derive(Debug, Serialize)]
struct Answer {
    id: u64,
    status: &'static str,
    stdout: String,
    stderr: String,
    compute_units: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// A session run whose changes are kept: the state to keep (base64 of dill's
    /// bytes). Absent when the session's state stays as it was (a limit was hit, the
    /// state could not be restored or saved), and for runs outside a session.
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<String>,
    /// A session run: the names whose values could not be saved (open files,
    /// generators, …); later runs will not see them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unsaved_variables: Vec<String>,
}

fn main() {
    if let Err(e) = seccomp::not_dumpable() {
        eprintln!("isobox-wasm: {e}");
        std::process::exit(2);
    }
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if args.get(1).map(String::as_str) == Some("wasi") {
        std::process::exit(wasi_main(&args[2..]));
    }
    if args.get(1).map(String::as_str) == Some("selftest") {
        let code = match seccomp::selftest() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("isobox-wasm selftest: {e}");
                1
            }
        };
        std::process::exit(code);
    }
    let Some(cache) = flag("--cache").map(PathBuf::from) else {
        eprintln!("usage: isobox-wasm prepare|serve|bench --cache DIR [--threads N] [--runs N --code CODE]");
        std::process::exit(2);
    };
    let code = match args.get(1).map(String::as_str) {
        Some("build") => {
            let many = |name: &str| -> Vec<String> {
                args.windows(2)
                    .filter(|w| w[0] == name)
                    .map(|w| w[1].clone())
                    .collect()
            };
            let (Some(packages), Some(out)) = (flag("--packages"), flag("--out")) else {
                eprintln!("usage: isobox-wasm build --cache DIR --packages DIR --out DIR [--name N]... [--import M]...");
                std::process::exit(2);
            };
            let (packages, out) = (PathBuf::from(packages), PathBuf::from(out));
            let result = stdlib(&cache).and_then(|lib| {
                // The runtime first: its signal driver makes a socket pair.
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                // Unpacking and importing packages is running what a tenant sent: from
                // here on no socket, exec or new process (as a serving worker).
                seccomp::install()?;
                let name = snapshot_path(&out)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_string();
                build::build(
                    &rt,
                    &lib,
                    &packages,
                    &many("--name"),
                    &out,
                    &many("--import"),
                    &name,
                )
            });
            let line = match &result {
                Ok(name) => serde_json::json!({ "snapshot": name }),
                Err(e) => serde_json::json!({ "error": e }),
            };
            println!("{line}");
            i32::from(result.is_err())
        }
        Some("prepare") => match prepare(&cache) {
            Ok(p) => {
                println!("{}", p.display());
                0
            }
            Err(e) => {
                eprintln!("isobox-wasm prepare: {e}");
                1
            }
        },
        Some("bench") => {
            let runs = flag("--runs").and_then(|t| t.parse().ok()).unwrap_or(100);
            let code = flag("--code").unwrap_or_else(|| "print(1 + 1)".into());
            let session = args.iter().any(|a| a == "--session");
            match bench(&cache, runs, &code, session) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("isobox-wasm bench: {e}");
                    1
                }
            }
        }
        Some("serve") => {
            let threads = flag("--threads")
                .and_then(|t| t.parse::<usize>().ok())
                .unwrap_or(2)
                .clamp(1, 64);
            match serve(&cache, threads) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("isobox-wasm serve: {e}");
                    1
                }
            }
        }
        _ => {
            eprintln!("usage: isobox-wasm prepare|serve|bench --cache DIR [--threads N] [--runs N --code CODE]");
            2
        }
    };
    std::process::exit(code);
}

/// The snapshot's path for this eryx version and this CPU (wasmtime compiles for the
/// host's features; a snapshot from another CPU would be refused on load).
fn snapshot_path(cache: &Path) -> PathBuf {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default();
    // What the snapshot holds is part of its name: a build that imports other modules
    // into it makes a new one rather than using one without them.
    let key = fnv1a(
        format!(
            "{}|{flags}|{}",
            std::env::consts::ARCH,
            PREIMPORTS.join(",")
        )
        .as_bytes(),
    );
    cache.join(format!("python-eryx{ERYX_VERSION}-{key:016x}.cwasm"))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The standard library, extracted from the binary into `cache` (eryx extracts it
/// under the temporary directory: pointed at the cache here).
fn stdlib(cache: &Path) -> Result<PathBuf, String> {
    std::env::set_var("TMPDIR", cache);
    eryx::embedded_stdlib::EmbeddedStdlib::get()
        .map(|s| s.path().to_path_buf())
        .map_err(|e| format!("extracting the Python standard library: {e}"))
}

/// Makes the snapshot unless it is there; its path.
fn prepare(cache: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    // One preparer at a time (daemons starting together wait for the first).
    let lock = std::fs::File::create(cache.join(".prepare.lock"))
        .map_err(|e| format!("{}: {e}", cache.display()))?;
    lock.lock().map_err(|e| format!("locking the cache: {e}"))?;
    let lib = stdlib(cache)?;
    let path = snapshot_path(cache);
    if path.exists() {
        return Ok(path);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let component = rt
        .block_on(eryx::preinit::pre_initialize(&lib, None, PREIMPORTS, &[]))
        .map_err(|e| format!("pre-initialising Python: {e}"))?;
    let compiled = eryx::PythonExecutor::precompile(&component)
        .map_err(|e| format!("compiling the snapshot: {e}"))?;
    // Written aside and renamed: a concurrent preparer or a reader never sees half.
    let tmp = cache.join(format!(".prepare-{}.tmp", std::process::id()));
    std::fs::write(&tmp, &compiled).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("{}: {e}", path.display())
    })?;
    Ok(path)
}

/// Serves runs on fd 3 until the daemon closes it; a failure to start is told there
/// (`{"fatal": why}`), since stdout and stderr lead nowhere.
fn serve(cache: &Path, threads: usize) -> Result<(), String> {
    let sock = fd3()?;
    let mut told = sock.try_clone().map_err(|e| e.to_string())?;
    serve_on(cache, threads, sock).inspect_err(|e| {
        let _ = write_frame(
            &mut told,
            serde_json::json!({"fatal": e}).to_string().as_bytes(),
        );
    })
}

fn serve_on(
    cache: &Path,
    threads: usize,
    sock: std::os::unix::net::UnixStream,
) -> Result<(), String> {
    let lib = stdlib(cache)?;
    let path = snapshot_path(cache);
    if !path.exists() {
        return Err(format!(
            "{} is missing: run isobox-wasm prepare first",
            path.display()
        ));
    }
    // SAFETY: the snapshot was compiled by `prepare` of this same binary (same eryx,
    // same wasmtime, same engine settings) into a cache only root may write; wasmtime
    // checks its version and settings on load and refuses a mismatch.
    let executor = unsafe { eryx::PythonExecutor::from_precompiled_file(&path) }
        .map_err(|e| format!("loading {}: {e}", path.display()))?
        .with_python_stdlib(&lib)
        .with_result_variable(OUTCOME_VAR);
    let executor = Arc::new(executor);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let mut out = sock.try_clone().map_err(|e| e.to_string())?;
    let writer = std::thread::spawn(move || {
        for frame in rx {
            // Every frame is bounded below MAX_FRAME (outputs, errors and call
            // arguments are cut or refused first); one that is not is dropped, never
            // half-written, so the stream stays in step.
            if frame.len() > frame::MAX_FRAME {
                continue;
            }
            if write_frame(&mut out, &frame).is_err() {
                break;
            }
        }
    });
    // From here on no thread of this process may open a socket, exec, fork or reach
    // outside (the engine is loaded, its threads exist).
    seccomp::install()?;
    let hello = serde_json::json!({"ready": true, "eryx": ERYX_VERSION, "threads": threads});
    let _ = tx.send(hello.to_string().into_bytes());
    let calls = Arc::new(Calls {
        out: Mutex::new(tx.clone()),
        waiting: Mutex::new(HashMap::new()),
        next: AtomicU64::new(0),
    });
    let mut envs = Envs::default();
    let mut input = sock;
    loop {
        let frame = match read_frame(&mut input) {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(format!("reading a request: {e}")),
        };
        let v: serde_json::Value = match serde_json::from_slice(&frame) {
            Ok(v) => v,
            Err(e) => return Err(format!("a frame that is not JSON: {e}")),
        };
        if let Some(a) = v.get("answer") {
            let a: CallAnswer = serde_json::from_value(a.clone())
                .map_err(|e| format!("an answer that is not one: {e}"))?;
            calls.answer(a);
            continue;
        }
        let req: Request = match serde_json::from_value(v) {
            Ok(r) => r,
            Err(e) => return Err(format!("a request that is not one: {e}")),
        };
        let executor = match req.env.as_ref() {
            None => Arc::clone(&executor),
            Some(env) => match envs.get(env, &lib) {
                Ok(e) => e,
                Err(e) => {
                    let _ = tx.send(answer_frame(&Answer {
                        id: req.id,
                        status: "error",
                        stdout: String::new(),
                        stderr: String::new(),
                        compute_units: 0,
                        error: Some(format!("The environment could not be loaded: {e}")),
                        state: None,
                        unsaved_variables: Vec::new(),
                    }));
                    continue;
                }
            },
        };
        let (tx, calls) = (tx.clone(), Arc::clone(&calls));
        rt.spawn(async move {
            let answer = run(&executor, req, Some(&calls)).await;
            let _ = tx.send(answer_frame(&answer));
        });
    }
    drop(tx);
    rt.shutdown_timeout(Duration::from_millis(100));
    let _ = writer.join();
    Ok(())
}

/// Uploaded environments' executors, loaded at their first run and kept for the next
/// (at most [`ENVS_KEPT`]; the least recently used goes first).
#[derive(Default)]
struct Envs {
    loaded: Vec<(PathBuf, Arc<eryx::PythonExecutor>)>,
}

/// Environments' executors one worker keeps loaded.
const ENVS_KEPT: usize = 8;

impl Envs {
    fn get(&mut self, env: &EnvIn, lib: &Path) -> Result<Arc<eryx::PythonExecutor>, String> {
        if let Some(i) = self.loaded.iter().position(|(p, _)| *p == env.snapshot) {
            let kept = self.loaded.remove(i);
            let e = Arc::clone(&kept.1);
            self.loaded.push(kept);
            return Ok(e);
        }
        // SAFETY: an environment's snapshot is compiled by `isobox-wasm build` of this
        // same binary (same eryx, wasmtime and settings), then made root's and
        // read-only by the daemon before any run uses it; wasmtime checks its version
        // and settings on load and refuses a mismatch.
        let executor = unsafe { eryx::PythonExecutor::from_precompiled_file(&env.snapshot) }
            // Without the host's path (the error reaches the tenant).
            .map_err(|e| {
                let e = e.to_string();
                let shown = env.snapshot.display().to_string();
                format!("its snapshot: {}", e.replace(&shown, "snapshot"))
            })?
            .with_python_stdlib(lib)
            .with_site_packages(&env.site)
            .with_result_variable(OUTCOME_VAR);
        let executor = Arc::new(executor);
        if self.loaded.len() >= ENVS_KEPT {
            self.loaded.remove(0);
        }
        self.loaded
            .push((env.snapshot.clone(), Arc::clone(&executor)));
        Ok(executor)
    }
}

/// An answer as its frame; one too large to send (never expected: every part is
/// bounded) becomes an error answer for its run, so the daemon is never left waiting.
fn answer_frame(a: &Answer) -> Vec<u8> {
    let frame = serde_json::to_vec(a).unwrap_or_default();
    if frame.len() <= frame::MAX_FRAME && !frame.is_empty() {
        return frame;
    }
    let small = Answer {
        id: a.id,
        status: "error",
        stdout: String::new(),
        stderr: String::new(),
        compute_units: a.compute_units,
        error: Some(format!(
            "The run's answer was {} bytes, more than the worker sends",
            frame.len()
        )),
        state: None,
        unsaved_variables: Vec::new(),
    };
    serde_json::to_vec(&small).unwrap_or_default()
}

/// Where one call's answer goes: its JSON result, or the error to raise.
type AnswerSlot = tokio::sync::oneshot::Sender<Result<serde_json::Value, String>>;

/// Callback calls waiting for the daemon's answer, over all runs.
struct Calls {
    /// Frames to the daemon.
    out: Mutex<std::sync::mpsc::Sender<Vec<u8>>>,
    /// (run, call) → where its answer goes.
    waiting: Mutex<HashMap<(u64, u64), AnswerSlot>>,
    next: AtomicU64,
}

impl Calls {
    fn answer(&self, a: CallAnswer) {
        let slot = self
            .waiting
            .lock()
            .ok()
            .and_then(|mut w| w.remove(&(a.id, a.call)));
        // An answer to a call that already timed out, or to a run that ended: dropped.
        if let Some(slot) = slot {
            let _ = slot.send(match a.error {
                Some(e) => Err(e),
                None => Ok(a.result),
            });
        }
    }

    /// A run ended: its calls still waiting end at once (they fail in a run that is
    /// gone anyway).
    fn forget_run(&self, run: u64) {
        if let Ok(mut w) = self.waiting.lock() {
            w.retain(|(r, _), _| *r != run);
        }
    }
}

/// Largest arguments of one call, as JSON: with the `callback` message around them
/// (type, call id, a name of at most 64 bytes) a message within the 1 MiB that a
/// WebSocket client takes by default (the `websockets` package the document's client
/// uses), so that a call never closes its connection.
const MAX_CALL_ARGS: usize = (1 << 20) - 4096;

/// One callback of a run: a call is a frame to the daemon, which asks its client and
/// sends the client's answer back.
struct Remote {
    name: String,
    run: u64,
    timeout: Duration,
    calls: Arc<Calls>,
}

impl eryx::Callback for Remote {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        ""
    }

    fn parameters_schema(&self) -> eryx::Schema {
        eryx::empty_schema()
    }

    fn invoke(
        &self,
        args: serde_json::Value,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<serde_json::Value, eryx::CallbackError>>
                + Send
                + '_,
        >,
    > {
        Box::pin(async move {
            let size = args.to_string().len();
            if size > MAX_CALL_ARGS {
                return Err(eryx::CallbackError::Replayed(format!(
                    "the arguments of {}() are {size} bytes as JSON; at most {MAX_CALL_ARGS}",
                    self.name
                )));
            }
            let call = self.calls.next.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = tokio::sync::oneshot::channel();
            if let Ok(mut w) = self.calls.waiting.lock() {
                w.insert((self.run, call), tx);
            }
            let frame = serde_json::json!({"callback": {
                "id": self.run, "call": call, "name": self.name, "args": args,
            }});
            let sent = self
                .calls
                .out
                .lock()
                .is_ok_and(|o| o.send(frame.to_string().into_bytes()).is_ok());
            if !sent {
                self.calls.forget_run(self.run);
                return Err(eryx::CallbackError::Replayed("the daemon is gone".into()));
            }
            match tokio::time::timeout(self.timeout, rx).await {
                Ok(Ok(Ok(v))) => Ok(v),
                Ok(Ok(Err(e))) => Err(eryx::CallbackError::Replayed(e)),
                Ok(Err(_)) => Err(eryx::CallbackError::Replayed(format!(
                    "{}() got no answer: the run ended",
                    self.name
                ))),
                Err(_) => {
                    if let Ok(mut w) = self.calls.waiting.lock() {
                        w.remove(&(self.run, call));
                    }
                    Err(eryx::CallbackError::Replayed(format!(
                        "{}() got no answer within {} s",
                        self.name,
                        self.timeout.as_secs_f64()
                    )))
                }
            }
        })
    }
}

/// The variable the wrapper leaves its verdict in (eryx's result capture).
const OUTCOME_VAR: &str = "_isobox_outcome_7f3a";

/// Characters kept per stream (past them, the rest is dropped and a line says so).
const OUTPUT_CHARS: usize = 1 << 20;

/// What runs: tracing off (eryx traces every line, which would make compute units
/// measure the tracer); stdout and stderr captured here, exactly (eryx's own capture
/// trims trailing newlines) and bounded; sockets refused with `PermissionError`, as
/// the document says (eryx's shim raises a plain `OSError` at connect); then the
/// user's code, compiled from its own text (so its line numbers are its own), in the
/// user's namespace. An exception is caught here, so the run ends normally and its
/// compute units are known; it is reported as a traceback without this wrapper's
/// frame. The wrapper is one function that removes its own name before the code
/// runs: the code sees a namespace with nothing of it.
fn wrap(code: &str, callbacks: &[String]) -> String {
    let lit = serde_json::to_string(code).unwrap_or_else(|_| "\"\"".into());
    let names = serde_json::to_string(callbacks).unwrap_or_else(|_| "[]".into());
    format!(
        r#"async def _isobox_main():
    import sys, types
    sys.settrace(None)
    sys._getframe().f_trace = None
    sys._getframe(1).f_trace = None
    g = globals()
    del g["_isobox_main"]
    inv = g.pop("invoke", None)
    for n in ("list_callbacks", "_EryxNamespace", "_EryxCallbackLeaf"):
        g.pop(n, None)
    def make(name):
        async def callback(**kwargs):
            try:
                return await inv(name, **kwargs)
            except Exception as e:
                raise RuntimeError(str(e)) from None
        callback.__name__ = callback.__qualname__ = name
        return callback
    made = {{n: make(n) for n in {names}}}
    cbcode = make("_").__code__
    g.update(made)
    import socket
    class Capture:
        encoding = "utf-8"
        errors = "strict"
        newlines = None
        closed = False
        def __init__(self):
            self.parts, self.n, self.cut = [], 0, False
        def write(self, s):
            if not isinstance(s, str):
                raise TypeError("write() argument must be str, not " + type(s).__name__)
            room = {OUTPUT_CHARS} - self.n
            if len(s) > room:
                self.cut = True
                s = s[:max(room, 0)]
            if s:
                self.parts.append(s)
                self.n += len(s)
            return len(s)
        def writelines(self, lines):
            for l in lines:
                self.write(l)
        def flush(self):
            pass
        def writable(self):
            return True
        def readable(self):
            return False
        def seekable(self):
            return False
        def isatty(self):
            return False
        def value(self):
            v = "".join(self.parts)
            return v + "\n[output truncated at {OUTPUT_CHARS} characters]\n" if self.cut else v
    def denied(*a, **k):
        raise PermissionError(1, "Operation not permitted: this sandbox has no network")
    socket.socket.__init__ = denied
    out, err = Capture(), Capture()
    sys.stdout, sys.stderr = out, err
    outcome = None
    try:
        import ast, types
        code = compile({lit}, "<user>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        if code.co_flags & 0x80:
            await types.FunctionType(code, g)()
        else:
            exec(code, g)
    except BaseException as e:
        if not (isinstance(e, SystemExit) and e.code in (None, 0)):
            import traceback
            tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
            # Without the callbacks' own frames: the code called get_user(), and
            # that is where its error is.
            kept = []
            while tb is not None:
                if tb.tb_frame.f_code is not cbcode:
                    kept.append(tb)
                tb = tb.tb_next
            for t in reversed(kept):
                tb = types.TracebackType(tb, t.tb_frame, t.tb_lasti, t.tb_lineno)
            kind = "memory" if isinstance(e, MemoryError) else "error"
            outcome = {{"kind": kind, "error": "".join(traceback.format_exception(type(e), e, tb))}}
    for n, f in made.items():
        if g.get(n) is f:
            del g[n]
    if outcome is None:
        outcome = {{"stdout": out.value(), "stderr": err.value()}}
    # Lone surrogates (surrogateescape'd bytes, "\\udcff") cannot cross into JSON or
    # the component's strings: shown escaped, never losing the rest.
    g["{OUTCOME_VAR}"] = {{k: v.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(v, str) else v for k, v in outcome.items()}}
await _isobox_main()
"#
    )
}

/// Instructions between a run's yields to the worker's scheduler (see `run`): the
/// precision of a timed-out run's compute units.
const FUEL_YIELD: u64 = 1_000_000;

/// Forwards wakes to the task's waker, noting a wake that came while the run was
/// being polled: that is a yield (a fuel yield wakes its task before it returns).
struct WakeNote {
    woke: std::sync::atomic::AtomicBool,
    to: Mutex<Option<std::task::Waker>>,
}

impl std::task::Wake for WakeNote {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woke.store(true, Ordering::Relaxed);
        if let Some(w) = self.to.lock().ok().and_then(|g| g.clone()) {
            w.wake();
        }
    }
}

/// A run's future, counting its fuel yields: a run the worker stops at its time
/// limit takes its store with it, so its units are these yields' instructions (to
/// within one yield's worth, as the document allows: "within a few million"). A wake
/// from another thread that lands during a poll (a callback's answer) counts as one
/// too: a million more for each such coincidence, never fewer than were used.
struct Yields<F> {
    inner: std::pin::Pin<Box<F>>,
    note: Arc<WakeNote>,
    count: Arc<AtomicU64>,
}

impl<F: std::future::Future> std::future::Future for Yields<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.get_mut();
        if let Ok(mut to) = this.note.to.lock() {
            *to = Some(cx.waker().clone());
        }
        this.note.woke.store(false, Ordering::Relaxed);
        let waker = std::task::Waker::from(Arc::clone(&this.note));
        let polled = this
            .inner
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker));
        if polled.is_pending() && this.note.woke.load(Ordering::Relaxed) {
            this.count.fetch_add(1, Ordering::Relaxed);
        }
        polled
    }
}

/// The memory a run's WebAssembly may grow to. Every run a worker gets carries the
/// daemon's one setting (`ISOBOX_ERYX_MEMORY_MB`); it is stored here before each run
/// because a store's limiter cannot hold state of its own beside eryx's.
static MEMORY_CAP: AtomicU64 = AtomicU64::new(64 << 20);

/// The memory cap of a run's store: growing past [`MEMORY_CAP`] fails, which Python
/// reports as `MemoryError`. (eryx's session executor, which every run goes through,
/// sets no memory limit of its own.)
struct Cap;

impl wasmtime::ResourceLimiter for Cap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired as u64 <= MEMORY_CAP.load(Ordering::Relaxed)
            && maximum.is_none_or(|m| desired <= m))
    }

    /// Tables grow within [`build::MAX_TABLE_ELEMENTS`] too: an extension module's
    /// code may grow the shared function table, and entries are host memory.
    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired as u64 <= build::MAX_TABLE_ELEMENTS && maximum.is_none_or(|m| desired <= m))
    }
}

/// One run. Every run goes through eryx's session executor, a session's or not: its
/// store outlives a timeout, so a run that times out still reports the compute units
/// it used (the document: "accurate to within a few million"), and a session's state
/// is restored before the code and saved after it in the same instance, in phases of
/// their own whose instructions are not charged.
async fn run(
    executor: &Arc<eryx::PythonExecutor>,
    req: Request,
    calls: Option<&Arc<Calls>>,
) -> Answer {
    let mut answer = Answer {
        id: req.id,
        status: "success",
        stdout: String::new(),
        stderr: String::new(),
        compute_units: 0,
        error: None,
        state: None,
        unsaved_variables: Vec::new(),
    };
    if req.code.contains('\0') {
        answer.status = "error";
        answer.error = Some("SyntaxError: source code cannot contain null bytes\n".into());
        return answer;
    }
    MEMORY_CAP.store(req.memory_bytes, Ordering::Relaxed);
    let remotes: Vec<Arc<dyn eryx::Callback>> = match calls {
        Some(calls) => req
            .callbacks
            .iter()
            .map(|name| {
                Arc::new(Remote {
                    name: name.clone(),
                    run: req.id,
                    timeout: Duration::from_millis(req.callback_timeout_ms.max(1)),
                    calls: Arc::clone(calls),
                }) as Arc<dyn eryx::Callback>
            })
            .collect(),
        None => Vec::new(),
    };
    let mut session = match eryx::SessionExecutor::new(Arc::clone(executor), &remotes).await {
        Ok(s) => s,
        Err(e) => {
            answer.status = "error";
            answer.error = Some(format!("The engine could not start the run: {e}"));
            return answer;
        }
    };
    if let Some(store) = session.store_mut() {
        // `Cap` has no size: leaking a box of it allocates nothing.
        store.limiter(|_| Box::leak(Box::new(Cap)));
        // Compiled code keeps its fuel count in a register and writes it back only at
        // calls; a run interrupted at its time limit inside a loop that calls nothing
        // would lose the count since. Yielding every FUEL_YIELD instructions writes it
        // back, so a timed-out run's units are exact to within that many.
        if let Err(e) = store.fuel_async_yield_interval(Some(FUEL_YIELD)) {
            answer.status = "error";
            answer.error = Some(format!("The engine could not start the run: {e}"));
            return answer;
        }
    }
    if let Some(state) = req.session.as_ref().and_then(|s| s.state.as_deref()) {
        if let Err(e) = restore(&mut session, state, phase_fuel(req.fuel)).await {
            answer.status = "error";
            answer.error = Some(cut(
                format!("Failed to restore session state: {e}"),
                ERROR_CHARS,
            ));
            return answer;
        }
    }
    // The time limit is the worker's own, in real time: eryx's counts ticks of the
    // engine's one epoch, which every run's ticker thread advances, so with k runs on
    // a worker each would end after a k-th of its limit.
    session.set_execution_timeout(None);
    let limit = Duration::from_millis(req.timeout_ms.max(1));
    let mut exec = session
        .execute(wrap(&req.code, &req.callbacks))
        .with_fuel_limit(req.fuel);
    let mut handler = None;
    if !remotes.is_empty() {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        exec = exec.with_callbacks(&remotes, tx);
        let map: HashMap<String, Arc<dyn eryx::Callback>> = remotes
            .iter()
            .map(|r| (r.name().to_string(), Arc::clone(r)))
            .collect();
        let limits = eryx::ResourceLimits {
            // Each call's own wait is bounded by `Remote` (with a message that names it).
            callback_timeout: None,
            max_callback_invocations: Some(req.max_callbacks),
            ..eryx::ResourceLimits::default()
        };
        handler = Some(tokio::spawn(eryx::callback_handler::run_callback_handler(
            rx,
            Arc::new(map),
            limits,
            Arc::new(HashMap::new()),
        )));
    }
    // The run yields every FUEL_YIELD instructions, so even a loop that calls nothing
    // is stopped here within about a millisecond of its limit.
    let yields = Arc::new(AtomicU64::new(0));
    let counted = Yields {
        inner: Box::pin(exec.run()),
        note: Arc::new(WakeNote {
            woke: std::sync::atomic::AtomicBool::new(false),
            to: Mutex::new(None),
        }),
        count: Arc::clone(&yields),
    };
    let result = match tokio::time::timeout(limit, counted).await {
        Ok(r) => r,
        Err(_) => Err(eryx::Error::Timeout(limit)),
    };
    if let Some(calls) = calls {
        calls.forget_run(req.id);
    }
    // Calls still being made as the run ended have nobody to answer them.
    if let Some(h) = handler {
        h.abort();
    }
    // Whether the code ran to its end or to an exception the wrapper caught: only
    // then are a session's changes kept (the document: a run stopped by a limit keeps
    // none; an instance that trapped is not entered again).
    let mut finished = false;
    // What the store's fuel says was used: for a run that did not end on its own (its
    // units count whatever stopped it).
    let used = |session: &mut eryx::SessionExecutor| {
        let left = session.store_mut().and_then(|s| s.get_fuel().ok());
        left.map_or(0, |l| req.fuel.saturating_sub(l))
    };
    match result {
        Ok(out) => {
            answer.compute_units = out.fuel_consumed.unwrap_or(0);
            let verdict = verdict(out.result.as_deref());
            match verdict["kind"].as_str() {
                // No verdict that could be read: never a success with nothing to show.
                None if verdict.is_null() => {
                    answer.status = "error";
                    answer.error =
                        Some("The run's result could not be read back from the engine".into());
                }
                None => {
                    // Bounded here too: the code can reach the capture's own list.
                    let text = |k: &str| bounded(verdict[k].as_str().unwrap_or_default());
                    answer.stdout = text("stdout");
                    answer.stderr = text("stderr");
                    finished = true;
                }
                Some(kind) => {
                    answer.status = if kind == "memory" {
                        "resource_limit"
                    } else {
                        finished = true;
                        "error"
                    };
                    answer.error = verdict["error"].as_str().map(str::to_string);
                }
            }
        }
        Err(eryx::Error::FuelExhausted { consumed, limit }) => {
            answer.status = "resource_limit";
            answer.compute_units = consumed;
            answer.error = Some(format!(
                "The run used up its compute units (limit: {limit})"
            ));
        }
        Err(eryx::Error::Timeout(t)) => {
            answer.status = "timeout";
            // Stopped here, its store went with it: the instructions of its yields.
            answer.compute_units = yields
                .load(Ordering::Relaxed)
                .saturating_mul(FUEL_YIELD)
                .min(req.fuel);
            answer.error = Some(format!(
                "The run took longer than its time limit ({} s)",
                t.as_secs_f64()
            ));
        }
        Err(eryx::Error::ResourceLimit(m)) => {
            answer.status = "resource_limit";
            answer.compute_units = used(&mut session);
            answer.error = Some(format!("The run used up its memory: {m}"));
        }
        Err(eryx::Error::PythonException(tb)) => {
            answer.status = "error";
            answer.compute_units = used(&mut session);
            answer.error = Some(tb);
        }
        Err(e) => {
            // A trap the wrapper could not catch (a stack overflow in the engine, or
            // the WASI exit of `os._exit`).
            answer.status = "error";
            answer.compute_units = used(&mut session);
            answer.error = Some(format!("The run failed in the engine: {e}"));
        }
    }
    if finished && req.session.is_some() {
        keep(
            &mut session,
            &req.callbacks,
            phase_fuel(req.fuel),
            &mut answer,
        )
        .await;
    }
    if let Some(e) = answer.error.take() {
        answer.error = Some(cut(e, ERROR_CHARS));
    }
    answer
}

/// The wrapper's verdict, left in [`OUTCOME_VAR`] (null when there is none).
fn verdict(result: Option<&str>) -> serde_json::Value {
    result
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Names of `unsaved_variables` kept in an answer, and the characters kept of each.
const MAX_UNSAVED: usize = 100;
const MAX_NAME_CHARS: usize = 256;

/// The least a bookkeeping phase may use, whatever the run's own `fuel_limit` (a
/// state of 1 MB takes far fewer to load or save; a lower cap could make good state
/// look unrestorable).
const PHASE_FUEL_FLOOR: u64 = 2_000_000_000;

/// The instructions each bookkeeping phase of a run may use: the run's own limit (so
/// the code of objects saved or loaded cannot buy more than the run itself could),
/// with a floor, and never above [`frame::STATE_PHASE_FUEL`].
fn phase_fuel(run_fuel: u64) -> u64 {
    run_fuel.clamp(PHASE_FUEL_FLOOR, frame::STATE_PHASE_FUEL)
}

/// The variable a session's saved state is handed in by.
const STATE_VAR: &str = "_isobox_state_7f3a";

/// What eryx's `restore_state` takes (an 8-byte time, then a pickle of a dict that it
/// merges into the code's globals) for `{STATE_VAR: state}`: a pickle written here,
/// of protocol 4, so the state itself is only ever decoded by [`RESTORE`].
fn handover(state: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(state.len() + 48);
    p.extend_from_slice(&0u64.to_le_bytes());
    p.extend_from_slice(b"\x80\x04}\x8c");
    p.push(STATE_VAR.len() as u8);
    p.extend_from_slice(STATE_VAR.as_bytes());
    p.push(b'X');
    p.extend_from_slice(&(state.len() as u32).to_le_bytes());
    p.extend_from_slice(state.as_bytes());
    p.extend_from_slice(b"s.");
    p
}

/// Restores a session's state: dill's bytes loaded into the code's globals, with the
/// session's own top-level functions (and its classes' methods) bound to those globals
/// again, since dill gives each its own; imported ones are left as they are. Its
/// verdict: `{"ok": true}` or `{"error": why}`.
const RESTORE: &str = r#"def _isobox_restore():
    import sys, types, traceback
    sys.settrace(None)
    sys._getframe().f_trace = None
    g = globals()
    del g["_isobox_restore"]
    blob = g.pop("STATE_VAR", "")
    own = g.get("__name__")
    def rebind(f):
        n = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
        n.__kwdefaults__ = f.__kwdefaults__
        n.__qualname__ = f.__qualname__
        n.__doc__ = f.__doc__
        n.__module__ = f.__module__
        n.__dict__.update(f.__dict__)
        return n
    try:
        import dill, base64
        d = dill.loads(base64.b64decode(blob, validate=True))
        if not isinstance(d, dict):
            raise TypeError("the saved state is not a namespace")
        # Only what the session defined: an imported function or class (saved by
        # reference) keeps its module's globals.
        for k, v in list(d.items()):
            if isinstance(v, types.FunctionType) and v.__module__ == own:
                d[k] = rebind(v)
            elif isinstance(v, type) and v.__module__ == own:
                for a, m in list(vars(v).items()):
                    if isinstance(m, types.FunctionType) and m.__module__ == own:
                        setattr(v, a, rebind(m))
        g.update(d)
        verdict = {"ok": True}
    except BaseException as e:
        verdict = {"error": "".join(traceback.format_exception_only(type(e), e)).strip()}
    g["OUTCOME_VAR"] = verdict
_isobox_restore()
"#;

/// Saves a session's state: every name of the code's globals whose value dill can
/// write (checked one by one, so one that cannot is named, not silently dropped as
/// eryx's own snapshot does), then all of them in one pickle (so objects shared
/// between names stay shared). Its verdict: `{"state", "unsaved"}`, `{"too_big",
/// "unsaved"}`, `{"memory": true}` or `{"error"}`.
const SAVE: &str = r#"def _isobox_save():
    import sys, traceback
    sys.settrace(None)
    sys._getframe().f_trace = None
    g = globals()
    del g["_isobox_save"]
    skip = {"invoke", "list_callbacks", "_EryxNamespace", "_EryxCallbackLeaf"} | set(CALLBACKS)
    kept, unsaved = {}, []
    try:
        import dill, base64
        for k in list(g):
            if k in skip or k.startswith(("_eryx_", "_isobox_")) or (k.startswith("__") and k.endswith("__")):
                continue
            v = g[k]
            try:
                dill.dumps(v, recurse=True)
            except MemoryError:
                raise
            except BaseException:
                unsaved.append(k)
                continue
            kept[k] = v
        blob = dill.dumps(kept, recurse=True)
        if len(blob) > STATE_BYTES:
            verdict = {"too_big": len(blob), "unsaved": unsaved}
        else:
            verdict = {"state": base64.b64encode(blob).decode("ascii"), "unsaved": unsaved}
    except MemoryError:
        verdict = {"memory": True}
    except BaseException as e:
        verdict = {"error": "".join(traceback.format_exception_only(type(e), e)).strip()}
    g["OUTCOME_VAR"] = verdict
_isobox_save()
"#;

/// One of a session run's bookkeeping phases: `code` run in the session's instance,
/// bounded by its own time and `fuel` (see [`phase_fuel`]), not charged to the run;
/// its verdict.
async fn phase(
    session: &mut eryx::SessionExecutor,
    code: String,
    fuel: u64,
) -> Result<serde_json::Value, String> {
    // In real time, as a run's (see `run`).
    session.set_execution_timeout(None);
    let limit = Duration::from_millis(frame::STATE_PHASE_MS);
    let ran = tokio::time::timeout(limit, session.execute(code).with_fuel_limit(fuel).run())
        .await
        .unwrap_or(Err(eryx::Error::Timeout(limit)));
    match ran {
        Ok(out) => match verdict(out.result.as_deref()) {
            serde_json::Value::Null => Err("it left no verdict".into()),
            v => Ok(v),
        },
        Err(eryx::Error::Timeout(_)) => Err(format!(
            "it took longer than {} s",
            frame::STATE_PHASE_MS / 1000
        )),
        Err(eryx::Error::FuelExhausted { limit, .. }) => {
            Err(format!("it used more than {limit} compute units"))
        }
        Err(eryx::Error::PythonException(tb)) => Err(tb),
        Err(e) => Err(e.to_string()),
    }
}

/// Loads a session's saved state into the run's instance before its code.
async fn restore(
    session: &mut eryx::SessionExecutor,
    state: &str,
    fuel: u64,
) -> Result<(), String> {
    let snapshot =
        eryx::PythonStateSnapshot::from_bytes(&handover(state)).map_err(|e| e.to_string())?;
    session
        .restore_state(&snapshot)
        .await
        .map_err(|e| e.to_string())?;
    let code = RESTORE
        .replace("STATE_VAR", STATE_VAR)
        .replace("OUTCOME_VAR", OUTCOME_VAR);
    let v = phase(session, code, fuel).await?;
    match v["error"].as_str() {
        Some(e) => Err(e.to_string()),
        None => Ok(()),
    }
}

/// Saves a session's state after code that ran to its end (or to an exception): the
/// answer then carries the state to keep and the names that could not be saved; or,
/// when the state cannot be kept, the run keeps none of its changes and says why.
async fn keep(
    session: &mut eryx::SessionExecutor,
    callbacks: &[String],
    fuel: u64,
    answer: &mut Answer,
) {
    let names = serde_json::to_string(callbacks).unwrap_or_else(|_| "[]".into());
    let code = SAVE
        .replace("OUTCOME_VAR", OUTCOME_VAR)
        .replace("STATE_BYTES", &frame::STATE_BYTES.to_string())
        .replace("CALLBACKS", &names);
    // Bounded whatever the code did to the names or to the saver's own helpers.
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["unsaved"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n.as_str().map(|n| cut(n.to_string(), MAX_NAME_CHARS)))
                    .take(MAX_UNSAVED)
                    .collect()
            })
            .unwrap_or_default()
    };
    // The state as base64 is 4 bytes for every 3; a saver the code tampered with may
    // still say a larger one fits.
    let state_cap = frame::STATE_BYTES.div_ceil(3) * 4;
    let refused = match phase(session, code, fuel).await {
        Ok(v) => {
            let too_big = v["too_big"].as_u64().or_else(|| {
                v["state"]
                    .as_str()
                    .filter(|s| s.len() > state_cap)
                    .map(|s| (s.len() / 4 * 3) as u64)
            });
            if let (Some(state), None) = (v["state"].as_str(), too_big) {
                answer.state = Some(state.to_string());
                answer.unsaved_variables = names(&v);
                return;
            }
            if let Some(n) = too_big {
                answer.unsaved_variables = names(&v);
                Some((
                    "resource_limit",
                    format!(
                        "The session's state after this run would be {n} bytes; at most {} are kept",
                        frame::STATE_BYTES
                    ),
                ))
            } else if v["memory"].as_bool() == Some(true) {
                Some((
                    "resource_limit",
                    "Saving the session's state used up the run's memory".to_string(),
                ))
            } else {
                Some((
                    "error",
                    format!(
                        "The session's state could not be saved: {}",
                        v["error"].as_str().unwrap_or("no reason given")
                    ),
                ))
            }
        }
        Err(e) => Some((
            "error",
            format!("The session's state could not be saved: {e}"),
        )),
    };
    if let Some((status, why)) = refused {
        answer.status = status;
        answer.stdout.clear();
        answer.stderr.clear();
        let before = answer
            .error
            .take()
            .map(|e| format!("\n\nThe run itself ended with:\n{e}"))
            .unwrap_or_default();
        answer.error = Some(format!(
            "{why}. None of this run's changes were kept.{before}"
        ));
    }
}

/// A stream's text as the wrapper bounds it: past [`OUTPUT_CHARS`] characters the
/// rest is dropped and a line says so.
fn bounded(s: &str) -> String {
    match s.char_indices().nth(OUTPUT_CHARS + 64) {
        None => s.to_string(),
        Some(_) => {
            let end = s
                .char_indices()
                .nth(OUTPUT_CHARS)
                .map_or(s.len(), |(i, _)| i);
            format!(
                "{}\n[output truncated at {OUTPUT_CHARS} characters]\n",
                &s[..end]
            )
        }
    }
}

/// Characters of an error kept (its head and its tail, where a traceback's last line
/// is).
const ERROR_CHARS: usize = 64 << 10;

/// `s` cut to `max` characters: the head, a line saying how much was left out, the
/// tail.
fn cut(s: String, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s;
    }
    let half = max / 2;
    let head: String = s.chars().take(half).collect();
    let tail: String = s.chars().skip(n - half).collect();
    format!("{head}\n[… {} characters left out …]\n{tail}", n - 2 * half)
}

/// The in-process reference of `bench/load/eryx.py`: `runs` runs of `code` on one
/// executor in this process, one after another, exactly as `serve` runs them (the
/// same snapshot, wrapper and limits) but with no socket, no jail and no daemon;
/// `session`: as a session's runs, each restoring the state the last one saved.
/// Prints `{"runs", "p50_ms", "p99_ms", "compute_units", "status"}`.
fn bench(cache: &Path, runs: usize, code: &str, session: bool) -> Result<(), String> {
    let lib = stdlib(cache)?;
    let path = snapshot_path(cache);
    // SAFETY: as in `serve_on`: our own snapshot, checked by wasmtime on load.
    let executor = unsafe { eryx::PythonExecutor::from_precompiled_file(&path) }
        .map_err(|e| format!("loading {}: {e}", path.display()))?
        .with_python_stdlib(&lib)
        .with_result_variable(OUTCOME_VAR);
    let executor = Arc::new(executor);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut ms = Vec::with_capacity(runs);
    let mut last: Option<Answer> = None;
    let mut state: Option<String> = None;
    for i in 0..runs.max(1) as u64 {
        let req = Request {
            id: i,
            code: code.to_string(),
            timeout_ms: 30_000,
            fuel: 20_000_000_000,
            memory_bytes: 64 << 20,
            callbacks: Vec::new(),
            callback_timeout_ms: default_callback_timeout_ms(),
            max_callbacks: default_max_callbacks(),
            session: session.then(|| SessionIn {
                state: state.clone(),
            }),
            env: None,
        };
        let t0 = std::time::Instant::now();
        let a = rt.block_on(run(&executor, req, None));
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        if a.state.is_some() {
            state.clone_from(&a.state);
        }
        last = Some(a);
    }
    ms.sort_by(f64::total_cmp);
    let pct = |q: usize| {
        ms[((ms.len() * q).div_ceil(100))
            .saturating_sub(1)
            .min(ms.len() - 1)]
    };
    let a = last.ok_or("no run")?;
    println!(
        "{}",
        serde_json::json!({"runs": ms.len(), "p50_ms": pct(50), "p99_ms": pct(99),
            "compute_units": a.compute_units, "status": a.status})
    );
    Ok(())
}

/// `isobox-wasm wasi …` (`wasi.rs`): runs the module and says how it ended on fd 3
/// (or stderr, run by hand); exits with its exit code, or 2 if it could not start.
fn wasi_main(args: &[String]) -> i32 {
    let out = fd3().ok();
    let say = |line: serde_json::Value| {
        let text = format!("{line}\n");
        let written = out
            .as_ref()
            .is_some_and(|mut s| std::io::Write::write_all(&mut s, text.as_bytes()).is_ok());
        if !written {
            eprint!("{text}");
        }
    };
    let ended = wasi::parse(args).and_then(|job| wasi::run(&job, seccomp::install));
    match ended {
        Ok(e) => {
            say(serde_json::to_value(&e).unwrap_or_default());
            e.exit_code
        }
        Err(e) => {
            say(serde_json::json!({ "error": e }));
            2
        }
    }
}

/// fd 3, the socket the daemon gave us.
fn fd3() -> Result<std::os::unix::net::UnixStream, String> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: fd 3 is the socket the daemon passes at spawn, and nothing else in this
    // process opens or owns it; fstat checks it is open and a socket before we take it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid, writable stat buffer.
    if unsafe { libc::fstat(3, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err("fd 3 is not the daemon's socket".into());
    }
    // SAFETY: see above: fd 3 is open, a socket, and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(3) };
    Ok(std::os::unix::net::UnixStream::from(fd))
}

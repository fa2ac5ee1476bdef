//! The WebAssembly engine, out of process: a supervisor thread of the daemon that
//! prepares, starts, feeds and restarts `isobox-wasm` (the worker binary of this
//! repository, `wasm-worker/`), which runs Python in WebAssembly with eryx on wasmtime.
//!
//! The worker is jailed (`sys::jail_on_spawn`): its own cgroup under the isobox slice
//! with a memory and a process cap, its own empty network namespace, its own mount
//! namespace seeing only the system's libraries, itself, the snapshot cache and the
//! environments (`sys::jail`), uid 65532 (`sys::WASM_WORKER`), no new privileges. It holds no keys and sees no API: only the runs it is
//! sent, over a socket pair, in frames of a 4-byte big-endian length and a JSON
//! object. A worker that dies or stops answering fails only the runs it had (each
//! gets [`Failure::Crashed`]); the next is started at once, or after a second when
//! they die in a row.

// Shared with the worker, which includes the same file (`wasm-worker/src/main.rs`).
pub mod build;
pub mod frame;
pub mod modname;
pub mod wasi_job;

use crate::cgroup::{Hierarchy, HostLimits};
use crate::config::EryxConfig;
use crate::sys::jail::{Access, View};
use frame::{read_frame, write_frame};
use serde::Deserialize;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Time past a run's own limit before a worker that has not answered is presumed
/// stuck and replaced.
const STUCK_GRACE: Duration = Duration::from_secs(10);

/// The engine's own memory in a worker process beside its runs' (the bound the
/// configuration checks each worker's share against).
pub const WORKER_ENGINE_BYTES: u64 = 128 << 20;

/// How long a run waits for room on a worker while they are all full (then 503,
/// "at capacity"), and while none is ready yet (the first start).
const CAPACITY_WAIT: Duration = Duration::from_secs(10);
const START_WAIT: Duration = Duration::from_secs(60);

/// Runs one worker process holds at once: as many as its share of the memory cap
/// holds at a run's memory each beside the engine's own, at least one. More at once
/// would have the worker's cgroup kill it, and every run on it with it.
pub fn runs_per_worker(share_bytes: u64, run_bytes: u64) -> usize {
    let n = share_bytes.saturating_sub(WORKER_ENGINE_BYTES) / run_bytes.max(1);
    usize::try_from(n).unwrap_or(usize::MAX).max(1)
}

/// One run.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// Python source.
    pub code: String,
    /// Wall-time limit.
    pub timeout_ms: u64,
    /// Compute units (WebAssembly instructions) allowed.
    pub fuel: u64,
    /// Memory allowed.
    pub memory_bytes: u64,
    /// Functions the code may `await` (the eryx WebSocket's callbacks): each call
    /// reaches the run's [`CallSink`], and [`Engine::answer`] answers it.
    pub callbacks: Vec<String>,
    /// How long one call waits for its answer before it fails in Python.
    pub callback_timeout_ms: u64,
    /// Set for a run in an eryx session: the state its last kept run left (dill's
    /// bytes; `None` before the first). The worker restores it before the code and
    /// answers the state to keep in [`RunAnswer::state`].
    pub session: Option<Option<Vec<u8>>>,
    /// Set for a run in an uploaded environment: its snapshot and site-packages.
    pub env: Option<EnvPaths>,
}

/// An uploaded environment's build, as a run uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvPaths {
    /// Its snapshot.
    pub snapshot: std::path::PathBuf,
    /// Its unpacked packages.
    pub site: std::path::PathBuf,
}

/// Calls one run may make to its callbacks.
pub const MAX_CALLBACKS: u32 = 100;

/// A run's call to one of its callbacks.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The run that calls.
    pub run: u64,
    /// The call's number (unique in the engine; answered with [`Engine::answer`]).
    pub call: u64,
    /// The callback's name (one the run listed).
    pub name: String,
    /// Its keyword arguments.
    pub args: serde_json::Value,
}

/// Where a run's calls go (called on the supervisor thread: it must not block).
pub type CallSink = Box<dyn Fn(Call) + Send>;

/// How a run ended (the worker's answer).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct RunAnswer {
    /// `success`, `error`, `timeout` or `resource_limit`.
    pub status: String,
    /// What it printed (empty unless success).
    pub stdout: String,
    /// What it wrote to stderr (empty unless success).
    pub stderr: String,
    /// WebAssembly instructions executed.
    pub compute_units: u64,
    /// Why it did not succeed.
    pub error: Option<String>,
    /// A session run whose changes are kept: the state to keep, dill's bytes (at most
    /// [`frame::STATE_BYTES`]; base64 in the frame, decoded here with the frame, on the
    /// supervisor thread). `None`: the session's state stays as it was.
    #[serde(default, deserialize_with = "state_bytes")]
    pub state: Option<Vec<u8>>,
    /// A session run: names whose values could not be saved.
    #[serde(default)]
    pub unsaved_variables: Vec<String>,
}

/// A frame's `state`: base64 of at most [`frame::STATE_BYTES`]; anything else breaks
/// the protocol (the worker bounds it).
fn state_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    use base64::Engine as _;
    let Some(b64) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| serde::de::Error::custom(format!("state not base64: {e}")))?;
    if bytes.len() > frame::STATE_BYTES {
        return Err(serde::de::Error::custom(format!(
            "state of {} bytes, over {}",
            bytes.len(),
            frame::STATE_BYTES
        )));
    }
    Ok(Some(bytes))
}

/// Why a run got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The engine is not there (no worker binary, preparation failed, shutting down).
    #[error("{0}")]
    Unavailable(String),
    /// The worker died or stopped answering while the run was on it.
    #[error("the WebAssembly worker ended during the run ({0})")]
    Crashed(String),
    /// The run ended, but what it left could not be kept (a session's state that the
    /// store refused).
    #[error("{0}")]
    Lost(String),
}

/// Where an answer goes (called on the supervisor thread: it must not block).
pub type Reply = Box<dyn FnOnce(Result<RunAnswer, Failure>) + Send>;

enum Msg {
    Run(u64, RunRequest, Reply, Option<CallSink>),
    /// The answer to call `.1` of run `.0`: its result, or the error to raise.
    Answer(u64, u64, Result<serde_json::Value, String>),
    /// A frame from worker `gen`.
    Frame(u64, Vec<u8>),
    /// Worker `gen`'s socket ended (it exited, or broke the protocol).
    Gone(u64, String),
    Stop,
}

/// What the engine is doing, for health and errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Preparing the snapshot or starting the worker.
    Starting,
    /// Serving.
    Ready,
    /// Not available, and why.
    Down(String),
}

/// The daemon's handle on the engine.
pub struct Engine {
    tx: crossbeam_channel::Sender<Msg>,
    builds: Option<crossbeam_channel::Sender<(build::BuildRequest, build::BuildReply)>>,
    build_stop: Arc<std::sync::atomic::AtomicBool>,
    builder: Option<std::thread::JoinHandle<()>>,
    /// The standard snapshot's file name once it is made (an environment built for
    /// another one is out of date).
    snapshot: Arc<Mutex<Option<String>>>,
    next_run: std::sync::atomic::AtomicU64,
    state: Arc<Mutex<State>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Engine {
    /// Starts the supervisor (call before the reactor's seccomp filter: the supervisor
    /// forks and waits, which the reactor thread may not). `envs_dir` holds the uploaded
    /// environments' builds, which the workers read: made here (passable, not
    /// listable) unless it is there, since a worker sees only what was there when it
    /// started.
    ///
    /// # Errors
    /// When the thread or the directory cannot be made.
    pub fn start(
        cfg: EryxConfig,
        worker: std::path::PathBuf,
        envs_dir: std::path::PathBuf,
        cgroups: Option<Hierarchy>,
        slice: String,
    ) -> std::io::Result<Engine> {
        {
            use std::os::unix::fs::DirBuilderExt;
            match std::fs::DirBuilder::new()
                .mode(0o711)
                .recursive(true)
                .create(&envs_dir)
            {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let state = Arc::new(Mutex::new(State::Starting));
        let snapshot = Arc::new(Mutex::new(None));
        let build_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let builder = build::Builder {
            stop: Arc::clone(&build_stop),
            snapshot: Arc::clone(&snapshot),
            worker: worker.clone(),
            cache_dir: cfg.cache_dir.clone(),
            cgroups: cgroups.clone(),
            slice: slice.clone(),
            timeout: Duration::from_millis(cfg.build_timeout_ms),
            memory_bytes: cfg.build_memory_bytes,
        };
        let (builds, build_rx) = crossbeam_channel::unbounded();
        let builder = std::thread::Builder::new()
            .name("isobox-wasm-build".into())
            .spawn(move || builder.main(&build_rx))?;
        let cfg_threads = cfg.threads.max(1);
        let sup = Supervisor {
            cfg,
            worker,
            envs_dir,
            cgroups,
            slice,
            tx: tx.clone(),
            rx,
            state: Arc::clone(&state),
            slots: (0..cfg_threads).map(|_| Slot::default()).collect(),
            gen: 0,
            pending: HashMap::new(),
            queued: Vec::new(),
            prepared_failed: false,
            snapshot: Arc::clone(&snapshot),
        };
        let thread = std::thread::Builder::new()
            .name("isobox-wasm-sup".into())
            .spawn(move || sup.main())?;
        Ok(Engine {
            tx,
            build_stop,
            builds: Some(builds),
            builder: Some(builder),
            snapshot,
            next_run: std::sync::atomic::AtomicU64::new(1),
            state,
            thread: Some(thread),
        })
    }

    /// Sends a run; `reply` gets its answer (or why there is none), `calls` its calls
    /// to its callbacks. Returns the run's id (what [`Engine::answer`] names).
    pub fn run(&self, req: RunRequest, reply: Reply, calls: Option<CallSink>) -> u64 {
        let id = self
            .next_run
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(crossbeam_channel::SendError(Msg::Run(_, _, reply, _))) =
            self.tx.send(Msg::Run(id, req, reply, calls))
        {
            reply(Err(Failure::Unavailable("the engine has stopped".into())));
        }
        id
    }

    /// Answers call `call` of run `run` (dropped if the run has ended or the call
    /// already timed out).
    pub fn answer(&self, run: u64, call: u64, result: Result<serde_json::Value, String>) {
        let _ = self.tx.send(Msg::Answer(run, call, result));
    }

    /// Queues an environment's build (one at a time, in order, once the standard
    /// snapshot is prepared); `reply` gets how it went.
    pub fn build(&self, req: build::BuildRequest, reply: build::BuildReply) {
        // Once the engine has stopped nothing is built or answered: the environment
        // stays `building` in its record and is built at the next start.
        if let Some(tx) = &self.builds {
            let _ = tx.send((req, reply));
        }
    }

    /// The standard snapshot's file name, once it is made: an environment's build is
    /// current when its snapshot has this name.
    pub fn snapshot_name(&self) -> Option<String> {
        self.snapshot.lock().ok().and_then(|s| s.clone())
    }

    /// What the engine is doing.
    pub fn state(&self) -> State {
        self.state
            .lock()
            .map(|s| s.clone())
            .unwrap_or(State::Starting)
    }

    /// Stops the worker (its runs fail) and the supervisor, and waits for them.
    pub fn stop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // A build going is killed and its cgroup removed (its environment is built
        // again at the next start); builds queued are not started.
        self.build_stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.builds = None;
        if let Some(t) = self.builder.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Spawns `cmd` (its arguments, stdout and stderr set) jailed as `uid`
/// (`sys::jail_on_spawn`) in `cgroup`, seeing only `view` of the host's files, with an
/// empty environment but `PATH`, `/` as its directory, no stdin, and one end of a new
/// socket pair as its fd 3: the child, and the daemon's end.
fn spawn_jailed(
    cmd: Command,
    cgroup: Option<&crate::cgroup::RunCgroup>,
    cores: u32,
    uid: u32,
    view: View,
) -> Result<(Child, UnixStream), String> {
    spawn_jailed_with(cmd, cgroup, cores, uid, view, |_| {})
}

/// What a jailed `isobox-wasm` (`worker`) sees: the system's libraries, itself, and
/// `given`.
fn view_of(worker: &std::path::Path, given: &[(&std::path::Path, Access)]) -> Result<View, String> {
    let mut view = View::new(worker).map_err(|e| format!("the worker's view: {e}"))?;
    for (path, access) in given {
        view.give(path, *access)
            .map_err(|e| format!("the worker's view: {e}"))?;
    }
    Ok(view)
}

/// Kills a jailed child, its process group and whatever is left in its cgroup, and
/// reaps it.
fn kill_jailed(child: &mut Child, cgroup: Option<&crate::cgroup::RunCgroup>) {
    let _ = crate::sys::kill_group(child.id() as i32, libc::SIGKILL);
    let _ = child.kill();
    let _ = child.wait();
    if let Some(cg) = cgroup {
        cg.kill_all();
    }
}

/// [`spawn_jailed`], with `env` adding to the environment once it is cleared.
fn spawn_jailed_with(
    mut cmd: Command,
    cgroup: Option<&crate::cgroup::RunCgroup>,
    cores: u32,
    uid: u32,
    view: View,
    env: impl FnOnce(&mut Command),
) -> Result<(Child, UnixStream), String> {
    let procs: Vec<OwnedFd> = match cgroup {
        Some(cg) => cg.open_procs().map_err(|e| e.to_string())?,
        None => Vec::new(),
    };
    let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
    let theirs = OwnedFd::from(theirs);
    // Its thread pools (wasmtime's parallel compiling, wasmtime-wasi's runtime) sized
    // to its cgroup's cores: with no /sys in its view, the standard library's count
    // would be every core of the host, past the cgroup's process cap on a large one.
    let cores = cores.max(1).to_string();
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("RAYON_NUM_THREADS", &cores)
        .env("TOKIO_WORKER_THREADS", &cores)
        .current_dir("/")
        .stdin(Stdio::null());
    env(&mut cmd);
    crate::sys::jail_on_spawn(&mut cmd, &procs, &theirs, uid, view);
    let child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", cmd.get_program().to_string_lossy()))?;
    Ok((child, ours))
}

/// A running worker process.
struct Live {
    gen: u64,
    child: Child,
    sock: UnixStream,
    cgroup: Option<crate::cgroup::RunCgroup>,
    ready: bool,
}

/// One worker process's place: the process, if one runs, and when it last started.
#[derive(Default)]
struct Slot {
    live: Option<Live>,
    last_start: Option<Instant>,
}

/// A run on a worker.
struct Pending {
    /// The worker it is on.
    gen: u64,
    /// Past it, the worker is presumed stuck.
    deadline: Instant,
    reply: Reply,
    calls: Option<CallSink>,
}

/// A run waiting for a worker with room.
struct Queued {
    /// Past it, it is answered 503: [`START_WAIT`] after it came while no worker is
    /// ready, [`CAPACITY_WAIT`] after a worker is (or was, when it came).
    deadline: Instant,
    id: u64,
    req: RunRequest,
    reply: Reply,
    calls: Option<CallSink>,
}

/// Runs `ISOBOX_WASM_THREADS` worker processes of one engine thread each: two runs in
/// one process do not execute in parallel (measured: the second waits for the
/// first), two processes do. Each run goes to the ready worker with the fewest runs;
/// a worker that fails takes only its own runs with it.
struct Supervisor {
    cfg: EryxConfig,
    worker: std::path::PathBuf,
    /// The uploaded environments' builds (`Engine::start`).
    envs_dir: std::path::PathBuf,
    cgroups: Option<Hierarchy>,
    slice: String,
    tx: crossbeam_channel::Sender<Msg>,
    rx: crossbeam_channel::Receiver<Msg>,
    state: Arc<Mutex<State>>,
    slots: Vec<Slot>,
    gen: u64,
    /// Runs on the workers, by id.
    pending: HashMap<u64, Pending>,
    /// Runs that came while no worker was ready.
    queued: Vec<Queued>,
    /// The snapshot could not be made: nothing can run until a restart.
    prepared_failed: bool,
    /// The snapshot's file name, once made.
    snapshot: Arc<Mutex<Option<String>>>,
}

impl Supervisor {
    fn set_state(&self, s: State) {
        if let Ok(mut g) = self.state.lock() {
            *g = s;
        }
    }

    fn state(&self) -> State {
        self.state
            .lock()
            .map(|s| s.clone())
            .unwrap_or(State::Starting)
    }

    /// The slot whose live worker is `gen`.
    fn slot_of(&self, gen: u64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.live.as_ref().is_some_and(|l| l.gen == gen))
    }

    fn main(mut self) {
        // The snapshot now (the first start on a host takes ~20 s); the workers at the
        // first run, so a daemon nobody asks for Python in WebAssembly runs none.
        if let Err(e) = self.prepare() {
            log::error!("wasm: {e}");
            self.prepared_failed = true;
            self.set_state(State::Down(e));
        }
        loop {
            let next = self
                .pending
                .values()
                .map(|p| p.deadline)
                .chain(self.queued.iter().map(|q| q.deadline))
                .min();
            let msg = match next {
                Some(at) => match self.rx.recv_deadline(at) {
                    Ok(m) => m,
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        self.check_deadlines();
                        continue;
                    }
                    Err(_) => break,
                },
                None => match self.rx.recv() {
                    Ok(m) => m,
                    Err(_) => break,
                },
            };
            match msg {
                Msg::Run(id, req, reply, calls) => self.on_run(Queued {
                    deadline: Instant::now() + self.queue_wait(),
                    id,
                    req,
                    reply,
                    calls,
                }),
                Msg::Answer(run, call, result) => self.on_answer(run, call, result),
                Msg::Frame(gen, f) if self.slot_of(gen).is_some() => self.on_frame(gen, &f),
                Msg::Gone(gen, why) if self.slot_of(gen).is_some() => self.worker_failed(gen, why),
                Msg::Frame(..) | Msg::Gone(..) => {}
                Msg::Stop => break,
            }
            // Also while messages keep coming (a run making calls): no deadline waits
            // for a quiet moment.
            self.check_deadlines();
        }
        self.set_state(State::Down("the daemon is shutting down".into()));
        for i in 0..self.slots.len() {
            self.kill_slot(i);
        }
        for (_, p) in self.pending.drain() {
            (p.reply)(Err(Failure::Unavailable(
                "the daemon is shutting down".into(),
            )));
        }
        for q in self.queued.drain(..) {
            (q.reply)(Err(Failure::Unavailable(
                "the daemon is shutting down".into(),
            )));
        }
    }

    /// Makes the snapshot unless it is there (`isobox-wasm prepare`, as root: it writes
    /// the cache, which only root may write).
    fn prepare(&self) -> Result<(), String> {
        if !self.worker.exists() {
            return Err(format!(
                "the WebAssembly worker {} is not installed",
                self.worker.display()
            ));
        }
        let t0 = Instant::now();
        let out = Command::new(&self.worker)
            .arg("prepare")
            .arg("--cache")
            .arg(&self.cfg.cache_dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {} prepare: {e}", self.worker.display()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "preparing the Python snapshot failed: {}",
                err.trim().chars().take(2000).collect::<String>()
            ));
        }
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        log::info!(
            "wasm: Python snapshot {path} ready in {} ms",
            t0.elapsed().as_millis()
        );
        let name = std::path::Path::new(&path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        if let Ok(mut s) = self.snapshot.lock() {
            *s = name;
        }
        Ok(())
    }

    /// Starts slot `i`'s worker (after a pause when it died within a second of its
    /// last start).
    fn start_slot(&mut self, i: usize) {
        if let Some(t) = self.slots[i].last_start {
            let since = t.elapsed();
            if since < Duration::from_secs(1) {
                std::thread::sleep(Duration::from_secs(1) - since);
            }
        }
        self.slots[i].last_start = Some(Instant::now());
        self.gen += 1;
        let gen = self.gen;
        match self.spawn(gen) {
            Ok(live) => {
                self.slots[i].live = Some(live);
                if self.state() != State::Ready {
                    self.set_state(State::Starting);
                }
            }
            Err(e) => {
                log::error!("wasm: starting a worker: {e}");
                if self.slots.iter().all(|s| s.live.is_none()) {
                    let why = format!("the WebAssembly worker could not start: {e}");
                    self.set_state(State::Down(why.clone()));
                    for q in self.queued.drain(..) {
                        (q.reply)(Err(Failure::Unavailable(why.clone())));
                    }
                }
            }
        }
    }

    /// Starts worker process `gen` in a cgroup of its own (its share of the memory
    /// cap, one core, a process cap).
    fn spawn(&mut self, gen: u64) -> Result<Live, String> {
        let cgroup = match &self.cgroups {
            Some(h) => Some(
                h.create_run(
                    &self.slice,
                    &format!("wasm-worker-{gen}"),
                    HostLimits {
                        memory_bytes: self.cfg.worker_memory_bytes / self.cfg.threads as u64,
                        // One engine thread: at most one core.
                        cpu_quota_us: crate::cgroup::CPU_PERIOD_US,
                        pids: 64,
                        cpu_weight: None,
                    },
                )
                .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        let mut cmd = Command::new(&self.worker);
        cmd.arg("serve")
            .arg("--cache")
            .arg(&self.cfg.cache_dir)
            .arg("--threads")
            .arg("1")
            // The guest's raw fd 1 and 2 are the worker's: never the daemon's log.
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // The snapshots are compiled code, mapped executable: not `noexec`.
        let view = view_of(
            &self.worker,
            &[
                (&self.cfg.cache_dir, Access::Exec),
                (&self.envs_dir, Access::Exec),
            ],
        );
        let spawned =
            view.and_then(|v| spawn_jailed(cmd, cgroup.as_ref(), 1, crate::sys::WASM_WORKER, v));
        let (child, ours) = match spawned {
            Ok(spawned) => spawned,
            Err(e) => {
                if let Some(cg) = cgroup {
                    let _ = cg.destroy();
                }
                return Err(e);
            }
        };
        let mut reader = ours.try_clone().map_err(|e| e.to_string())?;
        let tx = self.tx.clone();
        std::thread::Builder::new()
            .name("isobox-wasm-read".into())
            .spawn(move || loop {
                match read_frame(&mut reader) {
                    Ok(Some(f)) => {
                        if tx.send(Msg::Frame(gen, f)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        let _ = tx.send(Msg::Gone(gen, "it exited".into()));
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Msg::Gone(gen, e.to_string()));
                        return;
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        log::info!("wasm: worker {gen} started (pid {})", child.id());
        Ok(Live {
            gen,
            child,
            sock: ours,
            cgroup,
            ready: false,
        })
    }

    fn on_run(&mut self, q: Queued) {
        if self.prepared_failed {
            let why = match self.state() {
                State::Down(why) => why,
                _ => "the Python snapshot could not be made".into(),
            };
            (q.reply)(Err(Failure::Unavailable(why)));
            return;
        }
        // The first run starts every worker; a worker that could not start is tried
        // again at the next run.
        for i in 0..self.slots.len() {
            if self.slots[i].live.is_none() {
                self.start_slot(i);
            }
        }
        let first = self.queued.is_empty();
        if let Some(gen) = self.pick().filter(|_| first) {
            self.send(q, gen);
        } else if self.slots.iter().any(|s| s.live.is_some()) {
            // Behind those already waiting.
            self.queued.push(q);
        } else {
            let why = match self.state() {
                State::Down(why) => why,
                _ => "the WebAssembly worker could not start".into(),
            };
            (q.reply)(Err(Failure::Unavailable(why)));
        }
    }

    /// The ready worker with the fewest runs, if it has room for one more.
    fn pick(&self) -> Option<u64> {
        let cap = runs_per_worker(
            self.cfg.worker_memory_bytes / self.cfg.threads.max(1) as u64,
            self.cfg.memory_bytes,
        );
        self.slots
            .iter()
            .filter_map(|s| s.live.as_ref().filter(|l| l.ready))
            .map(|l| {
                (
                    self.pending.values().filter(|p| p.gen == l.gen).count(),
                    l.gen,
                )
            })
            .min()
            .filter(|(runs, _)| *runs < cap)
            .map(|(_, gen)| gen)
    }

    /// How long a queued run may wait: for room while a worker is ready, else for
    /// the first to start.
    fn queue_wait(&self) -> Duration {
        let ready = self
            .slots
            .iter()
            .any(|s| s.live.as_ref().is_some_and(|l| l.ready));
        if ready {
            CAPACITY_WAIT
        } else {
            START_WAIT
        }
    }

    /// Hands queued runs, oldest first, to workers with room.
    fn dispatch_queued(&mut self) {
        while !self.queued.is_empty() {
            let Some(gen) = self.pick() else {
                return;
            };
            let q = self.queued.remove(0);
            self.send(q, gen);
        }
    }

    /// Workers past a run's deadline have failed; queued runs past theirs are 503.
    fn check_deadlines(&mut self) {
        let now = Instant::now();
        let stuck: Vec<u64> = self
            .pending
            .values()
            .filter(|p| p.deadline <= now)
            .map(|p| p.gen)
            .collect();
        for gen in stuck {
            self.worker_failed(gen, "it stopped answering".into());
        }
        self.expire_queued(now);
    }

    /// Queued runs that waited their bound: 503, at capacity (or not started).
    fn expire_queued(&mut self, now: Instant) {
        if self.queued.iter().all(|q| q.deadline > now) {
            return;
        }
        let wait = self.queue_wait();
        let (expired, kept): (Vec<Queued>, Vec<Queued>) = std::mem::take(&mut self.queued)
            .into_iter()
            .partition(|q| now >= q.deadline);
        self.queued = kept;
        for q in expired {
            let why = if wait == CAPACITY_WAIT {
                format!(
                    "at capacity: every WebAssembly worker has its most runs going (waited {} s); retry after a short wait",
                    wait.as_secs()
                )
            } else {
                format!(
                    "the WebAssembly workers did not start within {} s; retry after a short wait",
                    wait.as_secs()
                )
            };
            (q.reply)(Err(Failure::Unavailable(why)));
        }
    }

    /// A client's answer to a call: to the worker its run is on, if it still is.
    fn on_answer(&mut self, run: u64, call: u64, result: Result<serde_json::Value, String>) {
        let Some(gen) = self.pending.get(&run).map(|p| p.gen) else {
            return;
        };
        let answer = match result {
            Ok(v) => serde_json::json!({"id": run, "call": call, "result": v}),
            Err(e) => serde_json::json!({"id": run, "call": call, "error": e}),
        };
        let frame = serde_json::json!({ "answer": answer }).to_string();
        self.write_to(gen, frame.as_bytes(), "an answer");
    }

    /// Writes a frame to worker `gen`; a worker that refuses it has failed.
    fn write_to(&mut self, gen: u64, frame: &[u8], what: &str) {
        let ok = self.slot_of(gen).is_some_and(|i| {
            self.slots[i]
                .live
                .as_mut()
                .is_some_and(|l| write_frame(&mut l.sock, frame).is_ok())
        });
        if !ok {
            self.worker_failed(gen, format!("its socket refused {what}"));
        }
    }

    fn send(&mut self, q: Queued, gen: u64) {
        let Queued {
            deadline: _,
            id,
            req,
            reply,
            calls,
        } = q;
        let mut frame = serde_json::json!({
            "id": id,
            "code": req.code,
            "timeout_ms": req.timeout_ms,
            "fuel": req.fuel,
            "memory_bytes": req.memory_bytes,
            "callbacks": req.callbacks,
            "callback_timeout_ms": req.callback_timeout_ms,
            "max_callbacks": MAX_CALLBACKS,
        });
        // A session run has two bookkeeping phases beside the code, each with its
        // own bound (restoring its state, saving it).
        if let Some(env) = &req.env {
            frame["env"] = serde_json::json!({"snapshot": env.snapshot, "site": env.site});
        }
        let mut allowed = Duration::from_millis(req.timeout_ms) + STUCK_GRACE;
        if let Some(state) = &req.session {
            use base64::Engine as _;
            let state = state
                .as_ref()
                .map(|s| base64::engine::general_purpose::STANDARD.encode(s));
            frame["session"] = serde_json::json!({ "state": state });
            allowed += 2 * Duration::from_millis(frame::STATE_PHASE_MS);
        }
        let frame = frame.to_string();
        let deadline = Instant::now() + allowed;
        self.pending.insert(
            id,
            Pending {
                gen,
                deadline,
                reply,
                calls,
            },
        );
        self.write_to(gen, frame.as_bytes(), "a run");
    }

    fn on_frame(&mut self, gen: u64, f: &[u8]) {
        #[derive(Deserialize)]
        struct CallFrame {
            id: u64,
            call: u64,
            name: String,
            #[serde(default)]
            args: serde_json::Value,
        }
        #[derive(Deserialize)]
        struct Frame {
            id: Option<u64>,
            ready: Option<bool>,
            fatal: Option<String>,
            callback: Option<CallFrame>,
            #[serde(flatten)]
            answer: Option<RunAnswer>,
        }
        let Ok(frame) = serde_json::from_slice::<Frame>(f) else {
            self.worker_failed(gen, "it sent a frame that is not one".into());
            return;
        };
        if let Some(why) = frame.fatal {
            let why: String = why.chars().take(2000).collect();
            log::error!("wasm: worker {gen} failed to serve: {why}");
            self.worker_failed(gen, why);
            return;
        }
        if frame.ready == Some(true) {
            if let Some(l) = self.slot_of(gen).and_then(|i| self.slots[i].live.as_mut()) {
                l.ready = true;
            }
            self.set_state(State::Ready);
            self.dispatch_queued();
            // Those that waited for a start wait for room from now on, as a run that
            // came now would.
            let room = Instant::now() + CAPACITY_WAIT;
            for q in &mut self.queued {
                q.deadline = room;
            }
            return;
        }
        if let Some(c) = frame.callback {
            // A call of a run that is not on this worker is its confusion, or a race
            // with a crash: nobody can answer it.
            match self
                .pending
                .get(&c.id)
                .filter(|p| p.gen == gen)
                .map(|p| &p.calls)
            {
                Some(Some(sink)) => sink(Call {
                    run: c.id,
                    call: c.call,
                    name: c.name,
                    args: c.args,
                }),
                Some(None) => self.on_answer(c.id, c.call, Err("this run has no callbacks".into())),
                None => {}
            }
            return;
        }
        let mine = frame
            .id
            .filter(|id| self.pending.get(id).is_some_and(|p| p.gen == gen));
        match (mine.and_then(|id| self.pending.remove(&id)), frame.answer) {
            (Some(p), Some(a)) => {
                (p.reply)(Ok(a));
                // Its room goes to the run that waited longest.
                self.dispatch_queued();
            }
            _ => self.worker_failed(gen, "it answered a run it was not given".into()),
        }
    }

    /// Worker `gen` is dead or untrustworthy: its runs fail, it is removed, and its
    /// slot starts a new one.
    fn worker_failed(&mut self, gen: u64, why: String) {
        let Some(i) = self.slot_of(gen) else {
            return;
        };
        let lost: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.gen == gen)
            .map(|(id, _)| *id)
            .collect();
        log::warn!(
            "wasm: worker {gen} failed ({why}); {} runs on it fail",
            lost.len()
        );
        self.kill_slot(i);
        for id in lost {
            if let Some(p) = self.pending.remove(&id) {
                (p.reply)(Err(Failure::Crashed(why.clone())));
            }
        }
        if !self
            .slots
            .iter()
            .any(|s| s.live.as_ref().is_some_and(|l| l.ready))
        {
            self.set_state(State::Starting);
        }
        self.start_slot(i);
    }

    fn kill_slot(&mut self, i: usize) {
        let Some(mut l) = self.slots[i].live.take() else {
            return;
        };
        let _ = l.sock.shutdown(std::net::Shutdown::Both);
        // Its process group: the worker and anything it started.
        let _ = crate::sys::kill_group(l.child.id() as i32, libc::SIGKILL);
        let _ = l.child.kill();
        let _ = l.child.wait();
        if let Some(cg) = l.cgroup.take() {
            cg.kill_all();
            let _ = cg.destroy();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_worker_holds_as_many_runs_as_its_share_holds() {
        let mib = 1u64 << 20;
        // The defaults: 1024 MiB for two workers, 64 MiB a run.
        assert_eq!(runs_per_worker(512 * mib, 64 * mib), 6);
        // At, below and above a bound: one run's worth more or less.
        assert_eq!(runs_per_worker(128 * mib + 128 * mib, 64 * mib), 2);
        assert_eq!(runs_per_worker(128 * mib + 128 * mib - 1, 64 * mib), 1);
        assert_eq!(runs_per_worker(128 * mib + 192 * mib, 64 * mib), 3);
        // Never none, whatever the figures.
        assert_eq!(runs_per_worker(0, 64 * mib), 1);
        assert_eq!(runs_per_worker(512 * mib, 0), 4 * 96 * 1024 * 1024);
    }
}

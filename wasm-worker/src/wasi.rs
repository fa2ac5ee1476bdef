//! `isobox-wasm wasi`: one WebAssembly job (a WASI preview 1 command module), run once
//! in this process, which the daemon starts jailed for that job alone.
//!
//! ```text
//! isobox-wasm wasi --module FILE [--arg A]... [--env K=V]... [--environ] [--stdin FILE]
//!                  [--dir GUEST=HOST]... [--ro-dir GUEST=HOST]... --memory-mb N
//! ```
//!
//! `--environ` adds every variable of this process's own environment named
//! `WASI_ENV_<NAME>` to the module's as `NAME`: the daemon passes a job's env values
//! that way, never on the command line, which every local user can read in `/proc`.
//!
//! The module sees its arguments (`argv[0]` is `main.wasm`), the environment given, the
//! stdin file (or an empty stdin), this process's stdout and stderr, and only the
//! directories given (`--ro-dir`: read only); it may not make symbolic links in them.
//! No network, no other file. Its clocks run on its own time ([`VirtualTime`]: 1 µs per
//! reading, and a sleep moves time to its deadline at once) and its random numbers come
//! from [`SplitMix`] with a fixed seed (the same for every job: never for secrets), so
//! the same module with the same input prints the same on every run. Not hidden from
//! it: the times, inode numbers and listing order of the files in its directories,
//! which come from the host. One 32-bit memory and its tables may hold `--memory-mb`
//! together; a `memory.grow` past that fails, as it does in any WebAssembly runtime at
//! its limit. Time and output are bounded by whoever runs it (the daemon).
//!
//! The worker's seccomp filter (`seccomp.rs`) is installed before the module's bytes are
//! even parsed: an escape from wasmtime lands in a process that can make no socket,
//! start nothing and signal no other process. When the module ends, one JSON line goes
//! to fd 3 (the daemon's socket) or, without it, to stderr:
//! `{"exit_code": N, "trap": null | "...", "peak_memory_bytes": N, "run_ms": N}`, and
//! the process exits with the module's exit code (a trap: 128 + 6, as an abort).
//! Setup errors (a module that does not parse or is not a WASI command, a memory over
//! the cap at instantiation, a directory that cannot be opened) exit 2 with
//! `{"error": "..."}` instead.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{DirPerms, FilePerms, WasiCtxBuilder};

/// The prefix of this process's variables that `--environ` gives the module.
pub const ENVIRON_PREFIX: &str = "WASI_ENV_";

/// Exit code of a module that trapped (as a process that aborted: 128 + SIGABRT).
pub const TRAP_EXIT: i32 = 134;

/// What the daemon asked for.
#[derive(Debug, Default)]
pub struct Job {
    pub module: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<PathBuf>,
    /// (guest path, host path, writable)
    pub dirs: Vec<(String, PathBuf, bool)>,
    pub memory_bytes: u64,
}

/// Parses the command line after `wasi`.
pub fn parse(args: &[String]) -> Result<Job, String> {
    let mut job = Job::default();
    let mut module = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--module" => module = Some(PathBuf::from(value()?)),
            "--arg" => job.args.push(value()?),
            "--env" => {
                let v = value()?;
                let (k, v) = v.split_once('=').ok_or("--env takes K=V")?;
                job.env.push((k.to_string(), v.to_string()));
            }
            "--stdin" => job.stdin = Some(PathBuf::from(value()?)),
            "--dir" | "--ro-dir" => {
                let v = value()?;
                let (guest, host) = v.split_once('=').ok_or("--dir takes GUEST=HOST")?;
                job.dirs
                    .push((guest.to_string(), PathBuf::from(host), flag == "--dir"));
            }
            "--environ" => {
                for (k, v) in std::env::vars_os() {
                    let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
                        continue;
                    };
                    if let Some(name) = k.strip_prefix(ENVIRON_PREFIX).filter(|n| !n.is_empty()) {
                        job.env.push((name.to_string(), v.to_string()));
                    }
                }
            }
            "--memory-mb" => {
                let mb: u64 = value()?.parse().map_err(|_| "--memory-mb takes a number")?;
                if !(1..=4096).contains(&mb) {
                    return Err("--memory-mb must be 1..4096".into());
                }
                job.memory_bytes = mb << 20;
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    job.module = module.ok_or("--module is required")?;
    if job.memory_bytes == 0 {
        return Err("--memory-mb is required".into());
    }
    Ok(job)
}

/// How the module ended.
#[derive(Debug, serde::Serialize)]
pub struct Ended {
    pub exit_code: i32,
    /// The trap's message, when it trapped.
    pub trap: Option<String>,
    /// The most its linear memories held at once.
    pub peak_memory_bytes: u64,
    /// From its first instruction to its end.
    pub run_ms: u64,
}

/// The module's time: nanoseconds since the run began, moved on by [`CLOCK_STEP_NS`] at
/// every reading and to the deadline at every sleep (`poll_oneoff`), never by the
/// host's clock. Time passes for the module (a loop that waits for a deadline ends, a
/// sleep returns at once) and every run sees the same times.
#[derive(Default)]
pub struct VirtualTime {
    elapsed: AtomicU64,
}

impl VirtualTime {
    /// A reading: the time, then one step on.
    fn read(&self) -> u64 {
        self.elapsed.fetch_add(CLOCK_STEP_NS, Ordering::Relaxed)
    }

    fn now(&self) -> u64 {
        self.elapsed.load(Ordering::Relaxed)
    }

    /// Moves time on to `t` (never back).
    fn advance_to(&self, t: u64) {
        self.elapsed.fetch_max(t, Ordering::Relaxed);
    }
}

/// The wall clock: [`WALL_START`] plus the module's time.
struct Wall(Arc<VirtualTime>);
/// The monotonic clock: the module's time.
struct Mono(Arc<VirtualTime>);

impl wasmtime_wasi::HostWallClock for Wall {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(CLOCK_STEP_NS)
    }
    fn now(&self) -> Duration {
        WALL_START + Duration::from_nanos(self.0.read())
    }
}

impl wasmtime_wasi::HostMonotonicClock for Mono {
    fn resolution(&self) -> u64 {
        CLOCK_STEP_NS
    }
    fn now(&self) -> u64 {
        self.0.read()
    }
}

/// The wall clock's first reading: 2000-01-01T00:00:00Z.
const WALL_START: Duration = Duration::from_secs(946_684_800);
/// How far each reading moves the clocks on: 1 µs.
const CLOCK_STEP_NS: u64 = 1000;

/// SplitMix64 from a fixed seed: the module's "random" numbers, the same on every run.
pub struct SplitMix(u64);

impl wasmtime_wasi::RngCore for SplitMix {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), cap_rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// The store's data: WASI's context, the memory cap and the module's time.
struct State {
    wasi: WasiP1Ctx,
    cap: MemoryCap,
    time: Arc<VirtualTime>,
}

/// Bytes a table element counts for against the cap (a reference).
const TABLE_ELEMENT_BYTES: u64 = 8;

/// The module's memory and tables may grow to `max` bytes together; the most they held
/// is kept.
struct MemoryCap {
    max: u64,
    /// Bytes of the memory and the tables now (each growth replaces its own part).
    total: u64,
    /// The total before the growth in flight, to go back to if it fails.
    before: Option<u64>,
    peak: Arc<AtomicU64>,
}

impl MemoryCap {
    /// One memory or table going from `current` to `desired` bytes: allowed if the new
    /// total fits. All arithmetic is checked: no request may wrap the count.
    fn grow(&mut self, current: u64, desired: u64) -> bool {
        let total = self
            .total
            .checked_sub(current)
            .and_then(|t| t.checked_add(desired))
            .filter(|t| *t <= self.max);
        match total {
            Some(t) => {
                self.before = Some(self.total);
                self.total = t;
                self.peak.fetch_max(t, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// The growth just allowed did not happen after all.
    fn failed(&mut self) {
        if let Some(t) = self.before.take() {
            self.total = t;
        }
    }
}

impl wasmtime::ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(maximum.is_none_or(|m| desired <= m) && self.grow(current as u64, desired as u64))
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.failed();
        Ok(())
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let bytes = |n: usize| (n as u64).checked_mul(TABLE_ELEMENT_BYTES);
        Ok(maximum.is_none_or(|m| desired <= m)
            && matches!((bytes(current), bytes(desired)), (Some(c), Some(d)) if self.grow(c, d)))
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.failed();
        Ok(())
    }

    fn instances(&self) -> usize {
        1
    }
    fn tables(&self) -> usize {
        4
    }
    fn memories(&self) -> usize {
        1
    }
}

/// WASI preview 1's errno values used here.
const ERRNO_SUCCESS: u16 = 0;
const ERRNO_FAULT: u16 = 21;
const ERRNO_INVAL: u16 = 28;
const ERRNO_PERM: u16 = 63;

/// `poll_oneoff` on the module's time. A clock subscription is due when the module's
/// time reaches it; fd subscriptions are ready at once (stdin is a file, stdout and
/// stderr never block). If nothing is ready, time moves on to the earliest deadline:
/// a sleep returns at once, having slept.
fn poll_oneoff(
    mut caller: wasmtime::Caller<'_, State>,
    subs: i32,
    events: i32,
    n: i32,
    nevents: i32,
) -> i32 {
    const SUB: usize = 48;
    const EVENT: usize = 32;
    let Some(memory) = caller
        .get_export("memory")
        .and_then(wasmtime::Extern::into_memory)
    else {
        return i32::from(ERRNO_INVAL);
    };
    // Pointers and counts are the guest's u32s.
    let (subs, events, nevents, n) = (subs as u32, events as u32, nevents as u32, n as u32);
    if n == 0 || n > 4096 {
        return i32::from(ERRNO_INVAL);
    }
    let mut input = vec![0u8; n as usize * SUB];
    if memory.read(&caller, subs as usize, &mut input).is_err() {
        return i32::from(ERRNO_FAULT);
    }
    let time = Arc::clone(&caller.data().time);
    let now = time.now();
    let wall_start = u64::try_from(WALL_START.as_nanos()).unwrap_or(0);
    // (userdata, event type, errno, due at on the module's time; None: ready now)
    let mut asked = Vec::with_capacity(n as usize);
    for s in input.chunks_exact(SUB) {
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&s[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let userdata = u64_at(0);
        match s[8] {
            0 => {
                let id = u32::from_le_bytes([s[16], s[17], s[18], s[19]]);
                let (timeout, absolute) = (u64_at(24), s[40] & 1 == 1);
                let due = match (id, absolute) {
                    (0 | 1, false) => Some(now.saturating_add(timeout)),
                    (0, true) => Some(timeout.saturating_sub(wall_start)),
                    (1, true) => Some(timeout),
                    _ => None,
                };
                match due {
                    Some(due) => asked.push((userdata, 0u8, ERRNO_SUCCESS, Some(due))),
                    // A CPU-time clock: not one the module has.
                    None => asked.push((userdata, 0u8, ERRNO_INVAL, None)),
                }
            }
            kind @ (1 | 2) => asked.push((userdata, kind, ERRNO_SUCCESS, None)),
            _ => return i32::from(ERRNO_INVAL),
        }
    }
    let ready_now = asked.iter().any(|a| a.3.is_none_or(|d| d <= now));
    let until = if ready_now {
        now
    } else {
        let earliest = asked.iter().filter_map(|a| a.3).min().unwrap_or(now);
        time.advance_to(earliest);
        earliest
    };
    let mut out = Vec::with_capacity(asked.len() * EVENT);
    for (userdata, kind, errno, due) in asked {
        if due.is_some_and(|d| d > until) {
            continue;
        }
        let mut e = [0u8; EVENT];
        e[0..8].copy_from_slice(&userdata.to_le_bytes());
        e[8..10].copy_from_slice(&errno.to_le_bytes());
        e[10] = kind;
        out.extend_from_slice(&e);
    }
    let count = u32::try_from(out.len() / EVENT).unwrap_or(0);
    if memory.write(&mut caller, events as usize, &out).is_err()
        || memory
            .write(&mut caller, nevents as usize, &count.to_le_bytes())
            .is_err()
    {
        return i32::from(ERRNO_FAULT);
    }
    i32::from(ERRNO_SUCCESS)
}

/// Runs the job: `Ok` however the module ended, `Err` when it could not start.
pub fn run(job: &Job, filter: impl FnOnce() -> Result<(), String>) -> Result<Ended, String> {
    let mut config = wasmtime::Config::new();
    // WASI preview 1 toolchains make one 32-bit memory and no threads: nothing else is
    // accepted (fewer ways around the cap).
    config
        .max_wasm_stack(1 << 20)
        .wasm_memory64(false)
        .wasm_multi_memory(false)
        .wasm_threads(false);
    let engine = wasmtime::Engine::new(&config).map_err(|e| e.to_string())?;
    // WASI's calls run on a tokio runtime that wasmtime-wasi makes on first use; its
    // signal driver makes a socket pair, which the filter refuses: make it now.
    wasmtime_wasi::runtime::in_tokio(async {});
    // From here on the module's bytes are looked at: parsed, compiled, then run.
    filter()?;
    let bytes = std::fs::read(&job.module).map_err(|e| format!("the module: {e}"))?;
    let module = wasmtime::Module::from_binary(&engine, &bytes)
        .map_err(|e| format!("not a WebAssembly module this runtime takes: {e:#}"))?;
    drop(bytes);
    if module.get_export("_start").is_none() {
        return Err("the module exports no _start (a WASI command has one)".into());
    }
    let mut linker: wasmtime::Linker<State> = wasmtime::Linker::new(&engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut State| &mut s.wasi)
        .map_err(|e| e.to_string())?;
    // Sleeping is on the module's time; symbolic links are not made (one in /output
    // could point anywhere for whoever reads the files afterwards).
    linker.allow_shadowing(true);
    let p1 = "wasi_snapshot_preview1";
    linker
        .func_wrap(p1, "poll_oneoff", poll_oneoff)
        .and_then(|l| {
            l.func_wrap(
                p1,
                "path_symlink",
                |_: i32, _: i32, _: i32, _: i32, _: i32| i32::from(ERRNO_PERM),
            )
        })
        .map_err(|e| e.to_string())?;
    let pre = linker
        .instantiate_pre(&module)
        .map_err(|e| format!("the module needs what WASI preview 1 does not give: {e:#}"))?;

    let time = Arc::new(VirtualTime::default());
    let mut b = WasiCtxBuilder::new();
    b.arg("main.wasm").args(&job.args);
    for (k, v) in &job.env {
        b.env(k, v);
    }
    match &job.stdin {
        Some(p) => {
            let f = std::fs::File::open(p).map_err(|e| format!("stdin: {e}"))?;
            b.stdin(wasmtime_wasi::cli::InputFile::new(f));
        }
        None => {
            b.stdin(std::io::empty());
        }
    }
    b.stdout(std::io::stdout()).stderr(std::io::stderr());
    for (guest, host, writable) in &job.dirs {
        let (d, f) = if *writable {
            (DirPerms::all(), FilePerms::all())
        } else {
            (DirPerms::READ, FilePerms::READ)
        };
        b.preopened_dir(host, guest, d, f)
            .map_err(|e| format!("{guest}: {e:#}"))?;
    }
    b.wall_clock(Wall(Arc::clone(&time)))
        .monotonic_clock(Mono(Arc::clone(&time)))
        .secure_random(SplitMix(0x1505_b0c5_eed0_0001))
        .insecure_random(SplitMix(0x1505_b0c5_eed0_0002))
        .insecure_random_seed(0x1505_b0c5);
    let peak = Arc::new(AtomicU64::new(0));
    let state = State {
        wasi: b.build_p1(),
        cap: MemoryCap {
            max: job.memory_bytes,
            total: 0,
            before: None,
            peak: Arc::clone(&peak),
        },
        time,
    };
    let mut store = wasmtime::Store::new(&engine, state);
    store.limiter(|s| &mut s.cap);

    let started = Instant::now();
    // Instantiating runs the module's start function, if it has one: a trap there is
    // the module's; anything else (a memory over the cap, a bad _start) is a setup
    // error.
    let instance = match pre.instantiate(&mut store) {
        Ok(i) => i,
        Err(e) if e.downcast_ref::<wasmtime::Trap>().is_some() => {
            return Ok(ended(Err(e), &peak, started));
        }
        Err(e) => return Err(format!("the module could not be instantiated: {e:#}")),
    };
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(|e| format!("_start: {e:#}"))?;
    let result = start.call(&mut store, ());
    Ok(ended(result, &peak, started))
}

/// How `_start` (or the start function) ended.
fn ended(result: wasmtime::Result<()>, peak: &AtomicU64, started: Instant) -> Ended {
    let run_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let _ = std::io::stdout().flush();
    let (exit_code, trap) = match result {
        Ok(()) => (0, None),
        Err(e) => match e.downcast_ref::<wasmtime_wasi::I32Exit>() {
            Some(exit) => (exit.0, None),
            None => (TRAP_EXIT, Some(trap_message(&e))),
        },
    };
    Ended {
        exit_code,
        trap,
        peak_memory_bytes: peak.load(Ordering::Relaxed),
        run_ms,
    }
}

/// A trap in one line: what trapped, without wasmtime's backtrace.
fn trap_message(e: &wasmtime::Error) -> String {
    let msg = match e.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => format!("wasm trap: {trap}"),
        None => e.root_cause().to_string(),
    };
    msg.lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(4096)
        .collect()
}

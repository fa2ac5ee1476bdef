//! `isobox-wasm wasi`: one WebAssembly job (a WASI preview 1 command module), run once
//! in this process, which the daemon starts jailed for that job alone.
//!
//! ```text
//! isobox-wasm wasi --module FILE [--arg A]... [--env K=V]... [--stdin FILE]
//!                  [--dir GUEST=HOST]... [--ro-dir GUEST=HOST]... --memory-mb N
//! ```
//!
//! The module sees its arguments (`argv[0]` is `main.wasm`), the environment given, the
//! stdin file (or an empty stdin), this process's stdout and stderr, and only the
//! directories given (`--ro-dir`: read only). No network, no other file. Its clocks
//! and random numbers are deterministic ([`SteppedClock`], [`SplitMix`]): the same
//! module with the same input behaves the same on every run. Its linear memories may
//! grow to `--memory-mb` in all; a `memory.grow` past that fails, as it does in any
//! WebAssembly runtime at its limit.
//!
//! Before the module's first instruction the worker's seccomp filter is installed
//! (`seccomp.rs`): an escape from wasmtime lands in a process that can make no socket
//! and start nothing. When the module ends, one JSON line goes to fd 3 (the daemon's
//! socket) or, without it, to stderr:
//! `{"exit_code": N, "trap": null | "...", "peak_memory_bytes": N, "run_ms": N}`, and
//! the process exits with the module's exit code (a trap: 128 + 6, as an abort).
//! Setup errors (a module that does not parse, a directory that cannot be opened)
//! exit 2 with `{"error": "..."}` instead.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{DirPerms, FilePerms, WasiCtxBuilder};

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

/// A clock that starts at `start` and moves on by `step` each time it is read: time
/// passes for the module (a loop that waits for a deadline ends) and every run sees the
/// same times.
pub struct SteppedClock {
    now: AtomicU64,
    start: u64,
    step: u64,
}

impl SteppedClock {
    fn new(start: Duration, step: Duration) -> SteppedClock {
        SteppedClock {
            now: AtomicU64::new(0),
            start: u64::try_from(start.as_nanos()).unwrap_or(0),
            step: u64::try_from(step.as_nanos()).unwrap_or(1).max(1),
        }
    }

    fn tick(&self) -> u64 {
        let n = self.now.fetch_add(1, Ordering::Relaxed);
        self.start.saturating_add(n.saturating_mul(self.step))
    }
}

impl wasmtime_wasi::HostWallClock for SteppedClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(self.step)
    }
    fn now(&self) -> Duration {
        Duration::from_nanos(self.tick())
    }
}

impl wasmtime_wasi::HostMonotonicClock for SteppedClock {
    fn resolution(&self) -> u64 {
        self.step
    }
    fn now(&self) -> u64 {
        self.tick()
    }
}

/// The wall clock's first reading: 2000-01-01T00:00:00Z.
const WALL_START: Duration = Duration::from_secs(946_684_800);
/// How far each reading moves the clocks on.
const CLOCK_STEP: Duration = Duration::from_micros(1);

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

/// The store's data: WASI's context and the memory cap.
struct State {
    wasi: WasiP1Ctx,
    cap: MemoryCap,
}

/// Linear memories may grow to `max` bytes in all; the most they held is kept.
struct MemoryCap {
    max: u64,
    /// Bytes of every memory but the one growing, and that one's, by memory: wasmtime
    /// gives only the growing memory's size, so each is tracked by its current size.
    total: u64,
    peak: Arc<AtomicU64>,
}

impl wasmtime::ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let (current, desired) = (current as u64, desired as u64);
        let total = self.total - current.min(self.total) + desired;
        let ok = total <= self.max && maximum.is_none_or(|m| desired <= m as u64);
        if ok {
            self.total = total;
            self.peak.fetch_max(total, Ordering::Relaxed);
        }
        Ok(ok)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold references, not data: bounded like wasmtime's own default.
        Ok(desired <= 1 << 20 && maximum.is_none_or(|m| desired <= m))
    }

    fn instances(&self) -> usize {
        1
    }
    fn tables(&self) -> usize {
        16
    }
    fn memories(&self) -> usize {
        16
    }
}

/// Runs the job: `Ok` however the module ended, `Err` when it could not start.
pub fn run(job: &Job, filter: impl FnOnce() -> Result<(), String>) -> Result<Ended, String> {
    let mut config = wasmtime::Config::new();
    // The store's limiter bounds memory; a module's own maximum may be lower.
    config.max_wasm_stack(1 << 20);
    let engine = wasmtime::Engine::new(&config).map_err(|e| e.to_string())?;
    let bytes = std::fs::read(&job.module).map_err(|e| format!("the module: {e}"))?;
    let module = wasmtime::Module::from_binary(&engine, &bytes)
        .map_err(|e| format!("not a WebAssembly module: {e:#}"))?;
    drop(bytes);
    let mut linker: wasmtime::Linker<State> = wasmtime::Linker::new(&engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut State| &mut s.wasi)
        .map_err(|e| e.to_string())?;
    let pre = linker
        .instantiate_pre(&module)
        .map_err(|e| format!("the module needs what WASI preview 1 does not give: {e:#}"))?;
    if module.get_export("_start").is_none() {
        return Err("the module exports no _start (a WASI command has one)".into());
    }

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
    b.wall_clock(SteppedClock::new(WALL_START, CLOCK_STEP))
        .monotonic_clock(SteppedClock::new(Duration::ZERO, CLOCK_STEP))
        .secure_random(SplitMix(0x1505_b0c5_eed0_0001))
        .insecure_random(SplitMix(0x1505_b0c5_eed0_0002))
        .insecure_random_seed(0x1505_b0c5);
    let peak = Arc::new(AtomicU64::new(0));
    let state = State {
        wasi: b.build_p1(),
        cap: MemoryCap {
            max: job.memory_bytes,
            total: 0,
            peak: Arc::clone(&peak),
        },
    };
    let mut store = wasmtime::Store::new(&engine, state);
    store.limiter(|s| &mut s.cap);

    // WASI's calls run on a tokio runtime that wasmtime-wasi makes on first use; its
    // signal driver makes a socket pair, which the filter refuses: make it now.
    wasmtime_wasi::runtime::in_tokio(async {});
    // Everything is open: from here on the module's code runs.
    filter()?;
    let started = Instant::now();
    let result = pre
        .instantiate(&mut store)
        .and_then(|i| i.get_typed_func::<(), ()>(&mut store, "_start"))
        .and_then(|start| start.call(&mut store, ()));
    let run_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let _ = std::io::stdout().flush();
    let (exit_code, trap) = match result {
        Ok(()) => (0, None),
        Err(e) => match e.downcast_ref::<wasmtime_wasi::I32Exit>() {
            Some(exit) => (exit.0, None),
            None => (TRAP_EXIT, Some(trap_message(&e))),
        },
    };
    Ok(Ended {
        exit_code,
        trap,
        peak_memory_bytes: peak.load(Ordering::Relaxed),
        run_ms,
    })
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

//! What isoboxd's own work around each sandbox costs, step by step: writing its
//! bundle, making its cgroup, leasing its network, spawning `runsc`, reaping it,
//! `runsc delete` (only after a kill), and removing runsc's state files, the bundle and
//! the cgroup. Each step counts how often it ran, the wall time it took and the CPU
//! time of the thread that ran it (`CLOCK_THREAD_CPUTIME_ID`: a spawn's own share is
//! the parent's side of `clone`, not the child's exec), in atomics any thread adds to
//! and `/metrics` reads (`isobox_sandbox_step_*`). `bench/load/steps.py` sets them
//! beside the daemon's whole CPU and a bare `runsc run`'s.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// A step of a sandbox's life that isoboxd does itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The bundle: files, root mount, mount points, FIFO, `config.json`.
    BundleWrite,
    /// The cgroup made and its limits written.
    CgroupCreate,
    /// A network run's namespace, veth and filter (its lease).
    Network,
    /// `runsc run` forked and exec'd.
    Spawn,
    /// `runsc run` reaped (and its cgroup's OOM count read).
    Reap,
    /// `runsc delete --force`, for a sandbox that was killed.
    RunscDelete,
    /// runsc's lock and state files removed.
    StateFiles,
    /// The bundle's mounts and directory removed.
    BundleRemove,
    /// The cgroup (and, on v1, runsc's copies in other hierarchies) removed.
    CgroupRemove,
}

impl Step {
    /// Every step, in the order of a sandbox's life.
    pub const ALL: [Step; 9] = [
        Step::BundleWrite,
        Step::CgroupCreate,
        Step::Network,
        Step::Spawn,
        Step::Reap,
        Step::RunscDelete,
        Step::StateFiles,
        Step::BundleRemove,
        Step::CgroupRemove,
    ];

    /// Its label value in `/metrics`.
    pub fn label(self) -> &'static str {
        match self {
            Step::BundleWrite => "bundle_write",
            Step::CgroupCreate => "cgroup_create",
            Step::Network => "network",
            Step::Spawn => "spawn",
            Step::Reap => "reap",
            Step::RunscDelete => "runsc_delete",
            Step::StateFiles => "state_files",
            Step::BundleRemove => "bundle_remove",
            Step::CgroupRemove => "cgroup_remove",
        }
    }
}

/// One step's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Times it ran.
    pub count: u64,
    /// Wall time, nanoseconds.
    pub wall_ns: u64,
    /// The running thread's CPU time, nanoseconds.
    pub cpu_ns: u64,
}

/// Totals per step, added to by any thread.
#[derive(Debug)]
pub struct Steps {
    count: [AtomicU64; 9],
    wall_ns: [AtomicU64; 9],
    cpu_ns: [AtomicU64; 9],
}

/// The daemon's own (sandboxes are made on several threads, read by `/metrics`).
pub static STEPS: Steps = Steps::new();

thread_local! {
    /// Set on a thread whose sandboxes are the daemon's own checks, not runs (a root
    /// image's probe, `sandbox::image`): their steps are not counted.
    static UNCOUNTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Leaves the steps of every sandbox this thread makes from now on uncounted.
pub fn uncounted_on_this_thread() {
    UNCOUNTED.with(|c| c.set(true));
}

impl Default for Steps {
    fn default() -> Self {
        Self::new()
    }
}

impl Steps {
    /// All zero.
    pub const fn new() -> Self {
        Steps {
            count: [const { AtomicU64::new(0) }; 9],
            wall_ns: [const { AtomicU64::new(0) }; 9],
            cpu_ns: [const { AtomicU64::new(0) }; 9],
        }
    }

    /// Runs `f` as `step`, adding its wall and thread CPU time.
    pub fn time<T>(&self, step: Step, f: impl FnOnce() -> T) -> T {
        self.measure(step, 1, f)
    }

    /// Runs `f` as more of `step`'s current run: its time is added, its count is not
    /// (a step done in two parts).
    pub fn time_more<T>(&self, step: Step, f: impl FnOnce() -> T) -> T {
        self.measure(step, 0, f)
    }

    fn measure<T>(&self, step: Step, runs: u64, f: impl FnOnce() -> T) -> T {
        if UNCOUNTED.with(std::cell::Cell::get) {
            return f();
        }
        let (w0, c0) = (Instant::now(), crate::sys::thread_cpu_ns());
        let r = f();
        let cpu = crate::sys::thread_cpu_ns().saturating_sub(c0);
        let wall = u64::try_from(w0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let i = step as usize;
        self.count[i].fetch_add(runs, Relaxed);
        self.wall_ns[i].fetch_add(wall, Relaxed);
        self.cpu_ns[i].fetch_add(cpu, Relaxed);
        r
    }

    /// `step`'s totals so far.
    pub fn totals(&self, step: Step) -> Totals {
        let i = step as usize;
        Totals {
            count: self.count[i].load(Relaxed),
            wall_ns: self.wall_ns[i].load(Relaxed),
            cpu_ns: self.cpu_ns[i].load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn test_a_step_counts_its_runs_its_wall_time_and_only_its_own_cpu() {
        let s = Steps::new();
        assert_eq!(s.totals(Step::Spawn), Totals::default());
        // Asleep: wall time, next to no CPU.
        let v = s.time(Step::Spawn, || {
            std::thread::sleep(Duration::from_millis(30));
            7
        });
        assert_eq!(v, 7);
        let t = s.totals(Step::Spawn);
        assert_eq!(t.count, 1);
        assert!(t.wall_ns >= 30_000_000, "{t:?}");
        assert!(t.cpu_ns < 10_000_000, "{t:?}");
        // Busy: CPU time of this thread, close to its wall time.
        s.time(Step::Spawn, || {
            let c0 = crate::sys::thread_cpu_ns();
            let mut x = 0u64;
            while crate::sys::thread_cpu_ns() - c0 < 20_000_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        });
        let t2 = s.totals(Step::Spawn);
        assert_eq!(t2.count, 2);
        assert!(t2.cpu_ns - t.cpu_ns >= 20_000_000, "{t2:?}");
        assert!(t2.wall_ns - t.wall_ns >= t2.cpu_ns - t.cpu_ns, "{t2:?}");
        // Another thread's work is not this step's CPU.
        let busy = std::thread::spawn(|| {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(60) {
                std::hint::black_box(0u8);
            }
        });
        s.time(Step::Reap, || busy.join().unwrap());
        let r = s.totals(Step::Reap);
        assert_eq!(r.count, 1);
        assert!(r.wall_ns >= 60_000_000, "{r:?}");
        assert!(r.cpu_ns < 30_000_000, "{r:?}");
        // A second part adds its time, not a run.
        s.time_more(Step::Reap, || std::thread::sleep(Duration::from_millis(5)));
        let r2 = s.totals(Step::Reap);
        assert_eq!(r2.count, 1);
        assert!(r2.wall_ns >= r.wall_ns + 5_000_000, "{r2:?}");
        // The others are untouched.
        for step in Step::ALL {
            if step != Step::Spawn && step != Step::Reap {
                assert_eq!(s.totals(step), Totals::default(), "{}", step.label());
            }
        }
    }

    #[test]
    fn test_every_step_has_its_own_slot_and_label() {
        let labels: std::collections::BTreeSet<&str> =
            Step::ALL.iter().map(|s| s.label()).collect();
        assert_eq!(labels.len(), Step::ALL.len());
        for (i, s) in Step::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
        }
    }
}

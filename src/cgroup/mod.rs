//! The protective slice and per-sandbox cgroups, on cgroup v1 and v2.
//!
//! The version is detected once at startup. The slice (`<instance>` under each
//! controller) bounds all sandboxes together in memory and weights their CPU; each
//! execution gets a child cgroup `<instance>/<run>` with its memory, CPU and pids caps,
//! and runsc (with every gVisor process it forks) is born inside it. The root path is
//! injectable so unit tests run on a temp-dir fixture without root.
//! Blocking file I/O: called from the worker pool only.

use std::fs;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// A cgroup operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No usable hierarchy found.
    #[error("no usable cgroup hierarchy under {0}: need v2 with memory, cpu, pids or v1 with memory, cpu, pids mounted")]
    NoHierarchy(PathBuf),
    /// A write failed.
    #[error("failed to write {value} to {path}: {source}")]
    Write {
        /// File.
        path: PathBuf,
        /// What was written.
        value: String,
        /// Cause.
        source: io::Error,
    },
    /// A read, mkdir or rmdir failed.
    #[error("cgroup {op} {path}: {source}")]
    Io {
        /// What was done.
        op: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
}

/// Which cgroup version and where its controllers live.
#[derive(Debug, Clone)]
pub enum Hierarchy {
    /// Legacy: one mount per controller.
    V1 {
        /// memory controller mount.
        memory: PathBuf,
        /// cpu controller mount.
        cpu: PathBuf,
        /// pids controller mount.
        pids: PathBuf,
    },
    /// Unified.
    V2 {
        /// The cgroup2 mount.
        root: PathBuf,
    },
}

/// What a sandbox's cgroup says it uses now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time, all its tasks together, since they started.
    pub cpu_ns: u64,
    /// Memory charged to it.
    pub memory_bytes: u64,
    /// Tasks (threads count on v1).
    pub tasks: u64,
}

/// Host-side limits of one sandbox cgroup.
#[derive(Debug, Clone, Copy)]
pub struct HostLimits {
    /// Memory cap, bytes (program memory plus gVisor's own overhead).
    pub memory_bytes: u64,
    /// CFS quota per 100 ms period, in µs.
    pub cpu_quota_us: u64,
    /// Host processes (gVisor's sentry, gofer and ptrace stubs), not the program's.
    pub pids: u64,
    /// CPU weight among its siblings on the v2 scale (100 the default; v1 `cpu.shares`
    /// is 10.24 times it). `None`: left as it is.
    pub cpu_weight: Option<u32>,
}

/// v1 `cpu.shares` for a weight on the v2 scale (100 → 1024, the defaults of each).
fn shares(weight: u32) -> u64 {
    (u64::from(weight.clamp(1, 10_000)) * 1024 / 100).max(2)
}

/// CFS period used for every sandbox.
pub const CPU_PERIOD_US: u64 = 100_000;

/// One sandbox's cgroup (a directory per controller on v1, one on v2).
#[derive(Debug, Clone)]
pub struct RunCgroup {
    hier: Hierarchy,
    dirs: Vec<PathBuf>,
}

fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    let wrap = |source| CgroupError::Write {
        path: path.into(),
        value: value.into(),
        source,
    };
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(wrap)?;
    f.write_all(value.as_bytes()).map_err(wrap)
}

fn read_file(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Io {
        op: "read",
        path: path.into(),
        source,
    })
}

fn mkdir(path: &Path) -> Result<(), CgroupError> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(CgroupError::Io {
            op: "mkdir",
            path: path.into(),
            source,
        }),
    }
}

impl Hierarchy {
    /// Detects the hierarchy mounted under `root` (normally `/sys/fs/cgroup`).
    ///
    /// # Errors
    /// [`CgroupError::NoHierarchy`] when neither a usable v2 nor v1 is there.
    pub fn detect(root: &Path) -> Result<Hierarchy, CgroupError> {
        if let Ok(ctrls) = fs::read_to_string(root.join("cgroup.controllers")) {
            let has = |c: &str| ctrls.split_whitespace().any(|x| x == c);
            if has("memory") && has("cpu") && has("pids") {
                return Ok(Hierarchy::V2 { root: root.into() });
            }
        }
        let (memory, cpu, pids) = (root.join("memory"), root.join("cpu"), root.join("pids"));
        if memory.join("cgroup.procs").exists()
            && cpu.join("cgroup.procs").exists()
            && pids.join("cgroup.procs").exists()
        {
            return Ok(Hierarchy::V1 { memory, cpu, pids });
        }
        Err(CgroupError::NoHierarchy(root.into()))
    }

    /// `v1` or `v2`.
    pub fn version(&self) -> &'static str {
        match self {
            Hierarchy::V1 { .. } => "v1",
            Hierarchy::V2 { .. } => "v2",
        }
    }

    fn slice_dirs(&self, slice: &str) -> Vec<PathBuf> {
        match self {
            Hierarchy::V1 { memory, cpu, pids } => {
                vec![memory.join(slice), cpu.join(slice), pids.join(slice)]
            }
            Hierarchy::V2 { root } => vec![root.join(slice)],
        }
    }

    fn memory_dir(&self, slice: &str) -> PathBuf {
        self.slice_dirs(slice).remove(0)
    }

    /// Creates (or updates) the protective slice with its memory cap and CPU weight.
    ///
    /// # Errors
    /// When a directory or control file cannot be written.
    pub fn ensure_slice(&self, slice: &str, memory_bytes: u64) -> Result<(), CgroupError> {
        for d in self.slice_dirs(slice) {
            mkdir(&d)?;
        }
        match self {
            Hierarchy::V1 { memory, cpu, .. } => {
                let m = memory.join(slice);
                // Without hierarchy the slice's cap would not bound its children.
                if read_file(&m.join("memory.use_hierarchy"))?.trim() != "1" {
                    write_file(&m.join("memory.use_hierarchy"), "1")?;
                }
                write_file(&m.join("memory.limit_in_bytes"), &memory_bytes.to_string())?;
                write_file(&cpu.join(slice).join("cpu.shares"), "512")?;
            }
            Hierarchy::V2 { root } => {
                write_file(&root.join("cgroup.subtree_control"), "+memory +cpu +pids")?;
                let s = root.join(slice);
                write_file(&s.join("cgroup.subtree_control"), "+memory +cpu +pids")?;
                write_file(&s.join("memory.max"), &memory_bytes.to_string())?;
                write_file(&s.join("cpu.weight"), "50")?;
            }
        }
        Ok(())
    }

    /// The slice's memory cap as the kernel reports it now (`None`: no cap, or no slice).
    pub fn slice_memory_limit(&self, slice: &str) -> Option<u64> {
        let dir = self.memory_dir(slice);
        let file = match self {
            Hierarchy::V1 { .. } => "memory.limit_in_bytes",
            Hierarchy::V2 { .. } => "memory.max",
        };
        let v = fs::read_to_string(dir.join(file)).ok()?;
        let n: u64 = v.trim().parse().ok()?;
        // v1 reports "no limit" as a huge page-rounded number.
        (n < (1u64 << 62)).then_some(n)
    }

    /// Creates the cgroup of one sandbox under the slice and applies `limits`.
    ///
    /// # Errors
    /// When creating or writing fails; what was created is removed again.
    pub fn create_run(
        &self,
        slice: &str,
        name: &str,
        limits: HostLimits,
    ) -> Result<RunCgroup, CgroupError> {
        let dirs: Vec<PathBuf> = self
            .slice_dirs(slice)
            .into_iter()
            .map(|d| d.join(name))
            .collect();
        let cg = RunCgroup {
            hier: self.clone(),
            dirs,
        };
        let res = (|| {
            for d in &cg.dirs {
                mkdir(d)?;
            }
            cg.apply(limits)
        })();
        if let Err(e) = res {
            let _ = cg.destroy();
            return Err(e);
        }
        Ok(cg)
    }

    /// Removes the slice itself (at shutdown, once every run is gone). On v1 this includes
    /// the copies runsc made in hierarchies we do not manage.
    pub fn remove_slice(&self, slice: &str) {
        self.sweep(slice);
        let mut dirs = self.slice_dirs(slice);
        if let Hierarchy::V1 { memory, .. } = self {
            if let Some(root) = memory.parent() {
                dirs.extend(
                    fs::read_dir(root)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.path().join(slice)),
                );
            }
        }
        for d in dirs {
            if d.is_dir() {
                if let Ok(rd) = fs::read_dir(&d) {
                    for c in rd.flatten() {
                        if c.path().is_dir() {
                            let _ = fs::remove_dir(c.path());
                        }
                    }
                }
                let _ = fs::remove_dir(&d);
            }
        }
    }

    /// Removes every child cgroup of the slice: what a crashed daemon left behind.
    /// Processes still inside are killed first. Returns how many were removed.
    pub fn sweep(&self, slice: &str) -> usize {
        let mut names = std::collections::BTreeSet::new();
        for d in self.slice_dirs(slice) {
            if let Ok(rd) = fs::read_dir(&d) {
                for e in rd.flatten() {
                    if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        names.insert(e.file_name().to_string_lossy().to_string());
                    }
                }
            }
        }
        let mut n = 0;
        for name in names {
            let cg = RunCgroup {
                hier: self.clone(),
                dirs: self
                    .slice_dirs(slice)
                    .into_iter()
                    .map(|d| d.join(&name))
                    .collect(),
            };
            if cg.destroy().is_ok() {
                n += 1;
            }
        }
        n
    }
}

impl RunCgroup {
    fn apply(&self, l: HostLimits) -> Result<(), CgroupError> {
        match &self.hier {
            Hierarchy::V1 { .. } => {
                let (m, c, p) = (&self.dirs[0], &self.dirs[1], &self.dirs[2]);
                write_file(
                    &m.join("memory.limit_in_bytes"),
                    &l.memory_bytes.to_string(),
                )?;
                // No swap escape hatch where swap accounting exists.
                let memsw = m.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write_file(&memsw, &l.memory_bytes.to_string())?;
                }
                write_file(&c.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                write_file(&c.join("cpu.cfs_quota_us"), &l.cpu_quota_us.to_string())?;
                if let Some(w) = l.cpu_weight {
                    write_file(&c.join("cpu.shares"), &shares(w).to_string())?;
                }
                write_file(&p.join("pids.max"), &l.pids.to_string())?;
            }
            Hierarchy::V2 { .. } => {
                let d = &self.dirs[0];
                write_file(&d.join("memory.max"), &l.memory_bytes.to_string())?;
                let swap = d.join("memory.swap.max");
                if swap.exists() {
                    write_file(&swap, "0")?;
                }
                write_file(
                    &d.join("cpu.max"),
                    &format!("{} {}", l.cpu_quota_us, CPU_PERIOD_US),
                )?;
                if let Some(w) = l.cpu_weight {
                    write_file(&d.join("cpu.weight"), &w.clamp(1, 10_000).to_string())?;
                }
                write_file(&d.join("pids.max"), &l.pids.to_string())?;
            }
        }
        Ok(())
    }

    /// Opens every `cgroup.procs` file, for a child to join with `sys::join_cgroup_in_child`.
    ///
    /// # Errors
    /// When a file cannot be opened.
    pub fn open_procs(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        self.dirs
            .iter()
            .map(|d| {
                let p = d.join("cgroup.procs");
                fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .map(OwnedFd::from)
                    .map_err(|source| CgroupError::Io {
                        op: "open",
                        path: p,
                        source,
                    })
            })
            .collect()
    }

    /// Writes new limits (used when a pooled sandbox is claimed).
    ///
    /// # Errors
    /// When a control file cannot be written.
    pub fn set_limits(&self, limits: HostLimits) -> Result<(), CgroupError> {
        self.apply(limits)
    }

    /// The run's CPU weight among its siblings: the lowest (a pooled sandbox booting in
    /// the background yields to every running execution) or the default.
    ///
    /// # Errors
    /// When the control file cannot be written.
    pub fn set_cpu_low(&self, low: bool) -> Result<(), CgroupError> {
        match &self.hier {
            Hierarchy::V1 { .. } => write_file(
                &self.dirs[1].join("cpu.shares"),
                if low { "2" } else { "1024" },
            ),
            Hierarchy::V2 { .. } => write_file(
                &self.dirs[0].join("cpu.weight"),
                if low { "1" } else { "100" },
            ),
        }
    }

    /// Pids of every process in the cgroup.
    pub fn procs(&self) -> Vec<i32> {
        fs::read_to_string(self.dirs[0].join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// How many times the kernel's OOM killer fired in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let file = match self.hier {
            Hierarchy::V1 { .. } => "memory.oom_control",
            Hierarchy::V2 { .. } => "memory.events",
        };
        let text = fs::read_to_string(self.dirs[0].join(file)).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Peak memory use in bytes, where the kernel reports it.
    pub fn peak_memory_bytes(&self) -> Option<u64> {
        let file = match self.hier {
            Hierarchy::V1 { .. } => "memory.max_usage_in_bytes",
            Hierarchy::V2 { .. } => "memory.peak",
        };
        fs::read_to_string(self.dirs[0].join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// What the sandbox uses now: CPU time since it started, memory (its processes,
    /// gVisor's own and, for a long-lived sandbox, its in-memory root) and tasks.
    /// Figures the kernel does not give read as 0.
    pub fn usage(&self) -> Usage {
        let num = |p: PathBuf| -> u64 {
            fs::read_to_string(p)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0)
        };
        match &self.hier {
            Hierarchy::V1 { cpu, .. } => {
                // cpuacct is its own hierarchy here, or mounted with cpu: runsc makes the
                // run's cgroup in every hierarchy, at the same relative path.
                let rel = self.dirs[1].strip_prefix(cpu).unwrap_or(&self.dirs[1]);
                let acct = cpu
                    .parent()
                    .map(|root| root.join("cpuacct").join(rel).join("cpuacct.usage"));
                let cpu_ns = match fs::metadata(self.dirs[1].join("cpuacct.usage")) {
                    Ok(_) => num(self.dirs[1].join("cpuacct.usage")),
                    Err(_) => acct.map(num).unwrap_or(0),
                };
                Usage {
                    cpu_ns,
                    memory_bytes: num(self.dirs[0].join("memory.usage_in_bytes")),
                    tasks: num(self.dirs[2].join("pids.current")),
                }
            }
            Hierarchy::V2 { .. } => {
                let d = &self.dirs[0];
                let usec = fs::read_to_string(d.join("cpu.stat"))
                    .unwrap_or_default()
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                Usage {
                    cpu_ns: usec.saturating_mul(1000),
                    memory_bytes: num(d.join("memory.current")),
                    tasks: num(d.join("pids.current")),
                }
            }
        }
    }

    /// One SIGKILL for every process in the cgroup now (`cgroup.kill` on v2), without
    /// waiting for them to go: fast enough for a response path; [`kill_all`]
    /// (Self::kill_all) finishes the job later.
    pub fn kill_now(&self) {
        self.kill_v2();
        self.kill_listed();
    }

    /// `cgroup.kill` on v2 (the kernel kills the whole subtree); nothing on v1.
    fn kill_v2(&self) {
        if let Hierarchy::V2 { .. } = self.hier {
            let _ = write_file(&self.dirs[0].join("cgroup.kill"), "1");
        }
    }

    /// SIGKILLs each process the cgroup lists now; false when it listed none.
    fn kill_listed(&self) -> bool {
        let pids = self.procs();
        for &pid in &pids {
            let _ = crate::sys::kill(pid, libc::SIGKILL);
        }
        !pids.is_empty()
    }

    /// SIGKILLs every process in the cgroup until it is empty (stopped ones die too:
    /// SIGKILL needs no SIGCONT). Returns whether it is empty at the end.
    pub fn kill_all(&self) -> bool {
        self.kill_v2();
        for attempt in 0..200 {
            if !self.kill_listed() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(if attempt < 10 {
                2
            } else {
                10
            }));
        }
        self.procs().is_empty()
    }

    /// Kills what is left and removes the directories.
    ///
    /// # Errors
    /// When a directory cannot be removed (a process would not die).
    pub fn destroy(&self) -> Result<(), CgroupError> {
        self.kill_all();
        let mut first_err = None;
        for d in &self.dirs {
            if !d.exists() {
                continue;
            }
            // rmdir can race with the last process's exit being accounted; retry briefly.
            let mut res = fs::remove_dir(d);
            for _ in 0..50 {
                if res.is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
                res = fs::remove_dir(d);
            }
            if let Err(source) = res {
                first_err.get_or_insert(CgroupError::Io {
                    op: "rmdir",
                    path: d.clone(),
                    source,
                });
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The directories (for tests and leak checks).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// A cgroup of plain files in `dir`, for the loop's tests (the fake backend): it
    /// limits nothing, lists no process (so its kills kill nothing) and counts no OOM.
    #[cfg(test)]
    pub fn fixture(dir: &Path) -> std::io::Result<RunCgroup> {
        fs::create_dir_all(dir)?;
        fs::write(dir.join("cgroup.procs"), "")?;
        fs::write(dir.join("memory.events"), "oom_kill 0\n")?;
        Ok(RunCgroup {
            hier: Hierarchy::V2 {
                root: dir.parent().unwrap_or(dir).to_path_buf(),
            },
            dirs: vec![dir.to_path_buf()],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_weight_maps_into_both_hierarchies_ranges() {
        // v1 cpu.shares is 2..=262144 and 1024 the default; v2 cpu.weight 1..=10000,
        // 100 the default.
        for (w, sh) in [
            (100, 1024),
            (200, 2048),
            (400, 4096),
            (1000, 10240),
            (1, 10),
            (0, 10),
            (10_000, 102_400),
            (u32::MAX, 102_400),
        ] {
            assert_eq!(shares(w), sh, "{w}");
            assert!((2..=262_144).contains(&shares(w)));
        }
        for c in crate::jobs::compute::CLASSES {
            assert!((1..=10_000).contains(&c.cpu_weight), "{}", c.name);
        }
    }

    fn v1_fixture() -> (tempdir::Dir, Hierarchy) {
        let t = tempdir::Dir::new();
        for c in ["memory", "cpu", "pids"] {
            fs::create_dir_all(t.0.join(c)).unwrap();
            fs::write(t.0.join(c).join("cgroup.procs"), "").unwrap();
        }
        let h = Hierarchy::detect(&t.0).unwrap();
        (t, h)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!(
                    "isobox-cgtest-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                let _ = std::fs::remove_dir_all(&p);
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn test_detects_v1_and_writes_slice_cap() {
        let (t, h) = v1_fixture();
        assert_eq!(h.version(), "v1");
        // A fixture is plain files: the kernel would create the control files itself.
        let m = t.0.join("memory/isobox-t");
        fs::create_dir_all(&m).unwrap();
        fs::write(m.join("memory.use_hierarchy"), "0").unwrap();
        fs::write(m.join("memory.limit_in_bytes"), "9223372036854771712").unwrap();
        fs::create_dir_all(t.0.join("cpu/isobox-t")).unwrap();
        fs::write(t.0.join("cpu/isobox-t/cpu.shares"), "1024").unwrap();
        assert_eq!(
            h.slice_memory_limit("isobox-t"),
            None,
            "an unlimited slice has no cap"
        );
        h.ensure_slice("isobox-t", 1 << 30).unwrap();
        assert_eq!(h.slice_memory_limit("isobox-t"), Some(1 << 30));
        assert_eq!(
            fs::read_to_string(m.join("memory.use_hierarchy")).unwrap(),
            "1"
        );
    }

    #[test]
    fn test_detects_v2_only_with_controllers() {
        let t = tempdir::Dir::new();
        fs::write(t.0.join("cgroup.controllers"), "cpuset io").unwrap();
        assert!(Hierarchy::detect(&t.0).is_err());
        fs::write(t.0.join("cgroup.controllers"), "cpuset cpu io memory pids").unwrap();
        assert_eq!(Hierarchy::detect(&t.0).unwrap().version(), "v2");
    }

    #[test]
    fn test_usage_read_on_v1_and_v2() {
        let (t, h) = v1_fixture();
        fs::create_dir_all(t.0.join("cpuacct")).unwrap();
        let cg = RunCgroup {
            hier: h,
            dirs: ["memory", "cpu", "pids"]
                .iter()
                .map(|c| t.0.join(c).join("s").join("r"))
                .collect(),
        };
        for d in &cg.dirs {
            fs::create_dir_all(d).unwrap();
        }
        fs::create_dir_all(t.0.join("cpuacct/s/r")).unwrap();
        fs::write(t.0.join("cpuacct/s/r/cpuacct.usage"), "1500000000\n").unwrap();
        fs::write(cg.dirs[0].join("memory.usage_in_bytes"), "1048576\n").unwrap();
        fs::write(cg.dirs[2].join("pids.current"), "7\n").unwrap();
        assert_eq!(
            cg.usage(),
            Usage {
                cpu_ns: 1_500_000_000,
                memory_bytes: 1 << 20,
                tasks: 7
            }
        );
        let t2 = tempdir::Dir::new();
        let d = t2.0.join("r");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("cpu.stat"), "usage_usec 2500\nuser_usec 2000\n").unwrap();
        fs::write(d.join("memory.current"), "4096").unwrap();
        let cg = RunCgroup {
            hier: Hierarchy::V2 { root: t2.0.clone() },
            dirs: vec![d],
        };
        assert_eq!(
            cg.usage(),
            Usage {
                cpu_ns: 2_500_000,
                memory_bytes: 4096,
                tasks: 0
            }
        );
    }

    #[test]
    fn test_oom_counter_parsed() {
        let t = tempdir::Dir::new();
        let cg = RunCgroup {
            hier: Hierarchy::V2 { root: t.0.clone() },
            dirs: vec![t.0.clone()],
        };
        fs::write(
            t.0.join("memory.events"),
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        )
        .unwrap();
        assert_eq!(cg.oom_kills(), 1);
    }
}

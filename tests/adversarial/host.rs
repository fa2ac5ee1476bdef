//! Host-side probes the cases share: /proc, cgroups, random bytes, digests.

use crate::common::sha256_hex;
use std::collections::HashSet;
use std::io::Read;
use std::path::PathBuf;
use std::process::Command;

pub fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The file's SHA-256 as hex; empty if it cannot be read.
pub fn sha256_file(path: &std::path::Path) -> String {
    std::fs::read(path)
        .map(|b| sha256_hex(&b))
        .unwrap_or_default()
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

pub fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// (ppid, state, starttime, utime+stime in ticks) of a host process.
pub fn proc_stat(pid: u32) -> Option<(u32, char, u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((
        f.get(1)?.parse().ok()?,
        f.first()?.chars().next()?,
        f.get(19)?.parse().ok()?,
        f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?,
    ))
}

/// Zombie children of `pid`, as `ps --ppid <pid> -o stat=` sees them.
pub fn zombie_children(pid: u32) -> usize {
    let out = Command::new("ps")
        .args(["--ppid", &pid.to_string(), "-o", "stat="])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with('Z'))
        .count()
}

/// Run cgroups of an instance in one v1 controller.
pub fn run_cgroups(controller: &str, instance: &str) -> Vec<PathBuf> {
    std::fs::read_dir(
        PathBuf::from("/sys/fs/cgroup")
            .join(controller)
            .join(instance),
    )
    .into_iter()
    .flatten()
    .flatten()
    .map(|e| e.path())
    .filter(|p| p.is_dir())
    .collect()
}

/// Host processes in any run cgroup of the instance: (pid, starttime).
pub fn run_cgroup_procs(instance: &str) -> HashSet<(u32, u64)> {
    let mut out = HashSet::new();
    for c in ["pids", "memory", "cpu"] {
        for dir in run_cgroups(c, instance) {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for p in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                if let Some(st) = proc_stat(p) {
                    out.insert((p, st.2));
                }
            }
        }
    }
    out
}

//! `isoboxd check`: what is missing or wrong on this host, before the daemon starts.
//!
//! Each check looks at one thing the daemon needs, with the settings it would run with,
//! and changes nothing on the host: nftables is asked to delete a table that does not
//! exist, the listening address is bound and let go, the data directory is only
//! written to when it exists (one file, removed at once). A `FAIL` is what keeps the
//! daemon from serving (it would not start, or `/readyz` would stay 503); a `warn` is
//! a part that would not work (networked runs, sessions, a runtime) or a risk worth
//! knowing (an old gVisor, forwarding left to the host's firewall).

use crate::config::Config;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// As it should be.
    Ok,
    /// Works, with a part missing or a risk.
    Warn,
    /// The daemon could not serve.
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// How bad.
    pub level: Level,
    /// What was looked at (`runsc`, `cgroups`, …).
    pub what: &'static str,
    /// What was found, and what to do about it.
    pub detail: String,
}

fn found(level: Level, what: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        level,
        what,
        detail: detail.into(),
    }
}

/// The runsc package version isobox is tested with (`vendor-runsc/VERSION`).
const TESTED_RUNSC: &str = include_str!("../vendor-runsc/VERSION");

/// gVisor releases before this date lack the fixes of 2023 and later.
const OLD_RUNSC_BEFORE: u32 = 20_240_101;

/// Runs every check with `cfg`'s settings.
pub fn run(cfg: &Config) -> Vec<Finding> {
    let mut out = Vec::new();
    out.push(root());
    out.extend(runsc(&cfg.runsc, &cfg.platform));
    out.push(cgroups(Path::new("/sys/fs/cgroup")));
    out.extend(runtimes(cfg));
    out.push(init(&cfg.init));
    out.push(wasm(cfg.eryx.worker.as_deref(), &cfg.eryx.cache_dir));
    out.push(overlay(Path::new("/proc/filesystems"), &kernel_modules()));
    out.push(mkfs());
    out.push(root_images(
        cfg.root_images,
        &cfg.image_dir,
        Path::new("/usr/bin/mkfs.erofs"),
    ));
    out.extend(egress(cfg));
    out.extend(data_dir(cfg));
    out.push(listen(cfg));
    out
}

/// The report as text, and whether the daemon could serve (no `FAIL`).
pub fn render(findings: &[Finding]) -> (String, bool) {
    let mut s = String::new();
    for f in findings {
        let tag = match f.level {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        let _ = writeln!(s, "{tag:<5} {:<10} {}", f.what, f.detail);
    }
    let fails = findings.iter().filter(|f| f.level == Level::Fail).count();
    let warns = findings.iter().filter(|f| f.level == Level::Warn).count();
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    if fails == 0 {
        let _ = writeln!(
            s,
            "result: isoboxd can serve on this host ({})",
            plural(warns, "warning", "warnings")
        );
    } else {
        let _ = writeln!(
            s,
            "result: isoboxd could not serve on this host ({}, {})",
            plural(fails, "failure", "failures"),
            plural(warns, "warning", "warnings")
        );
    }
    (s, fails == 0)
}

fn root() -> Finding {
    match crate::sys::euid() {
        0 => found(Level::Ok, "root", "running as root"),
        uid => found(
            Level::Fail,
            "root",
            format!("running as uid {uid}: isoboxd needs root for runsc, cgroups and nftables"),
        ),
    }
}

/// The release date in a runsc version string (`0.0~20221219.0`, `release-20240729.0`).
fn runsc_date(version: &str) -> Option<u32> {
    let b = version.as_bytes();
    (0..b.len().saturating_sub(7)).find_map(|i| {
        let w = &b[i..i + 8];
        let before_ok = i == 0 || !b[i - 1].is_ascii_digit();
        let after_ok = b.get(i + 8).is_none_or(|c| !c.is_ascii_digit());
        (before_ok && after_ok && w.starts_with(b"20") && w.iter().all(u8::is_ascii_digit))
            .then(|| std::str::from_utf8(w).ok()?.parse().ok())
            .flatten()
    })
}

fn runsc(path: &Path, platform: &str) -> Vec<Finding> {
    let what = "runsc";
    let mut out = Vec::new();
    let first_line = match run_for(path, &["--version"], Duration::from_secs(10)) {
        Err(e) => {
            return vec![found(
                Level::Fail,
                what,
                format!(
                    "{}: {e} (install gVisor: apt-get install runsc, or set ISOBOX_RUNSC)",
                    path.display()
                ),
            )]
        }
        Ok((status, text)) if !status => {
            return vec![found(
                Level::Fail,
                what,
                format!("{} --version failed: {}", path.display(), text.trim()),
            )]
        }
        Ok((_, text)) => text.lines().next().unwrap_or("").trim().to_string(),
    };
    out.push(found(
        Level::Ok,
        what,
        format!("{}: {first_line}, platform {platform}", path.display()),
    ));
    let tested = TESTED_RUNSC.trim();
    match (runsc_date(&first_line), runsc_date(tested)) {
        (Some(d), _) if d < OLD_RUNSC_BEFORE => out.push(found(
            Level::Warn,
            what,
            format!(
                "gVisor of {}-{:02}-{:02} lacks every security fix since; Debian 12 hosts get a 2024 release from bookworm-backports",
                d / 10000,
                d / 100 % 100,
                d % 100
            ),
        )),
        (Some(d), Some(t)) if d != t => out.push(found(
            Level::Warn,
            what,
            format!("isobox is tested with runsc {tested}; this one is {first_line}"),
        )),
        (None, _) => out.push(found(
            Level::Warn,
            what,
            format!("no release date in {first_line:?}: cannot tell its age"),
        )),
        _ => {}
    }
    if platform == "kvm" && !Path::new("/dev/kvm").exists() {
        out.push(found(
            Level::Fail,
            what,
            "ISOBOX_PLATFORM=kvm needs /dev/kvm, which this host does not have (use ptrace or systrap)",
        ));
    }
    out
}

/// Runs `prog args` with nothing inherited but PATH, for at most `limit`: whether it
/// exited 0, and its stdout and stderr together.
fn run_for(prog: &Path, args: &[&str], limit: Duration) -> std::io::Result<(bool, String)> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(prog)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let timed_out = std::cell::Cell::new(false);
    let code = crate::sandbox::backend::wait_bounded(&mut child, limit, || timed_out.set(true));
    if timed_out.get() {
        return Err(std::io::Error::other(format!(
            "did not answer within {} s",
            limit.as_secs()
        )));
    }
    let mut text = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut text);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut text);
    }
    text.truncate(text.floor_char_boundary(2000));
    Ok((code == 0, text))
}

fn cgroups(root: &Path) -> Finding {
    match crate::cgroup::Hierarchy::detect(root) {
        Ok(h) => found(
            Level::Ok,
            "cgroups",
            format!("{} with memory, cpu and pids", h.version()),
        ),
        Err(e) => found(Level::Fail, "cgroups", e.to_string()),
    }
}

fn runtimes(cfg: &Config) -> Vec<Finding> {
    let what = "runtime";
    let rts = match crate::runtimes::Runtimes::load(cfg.runtimes_dir.as_deref(), &cfg.rootfs_dir) {
        Ok(r) => r,
        Err(e) => return vec![found(Level::Fail, what, e.to_string())],
    };
    let mut out: Vec<Finding> = rts
        .all()
        .iter()
        .map(|r| match &r.missing {
            None => found(
                Level::Ok,
                what,
                format!(
                    "{} {} ({})",
                    r.desc.language,
                    r.version.as_deref().unwrap_or("?"),
                    r.rootfs_path.display()
                ),
            ),
            // A further version is built only when the operator asks for it.
            Some(why) if !r.default => found(
                Level::Ok,
                what,
                format!(
                    "{} further version {} not built (optional): {why}",
                    r.desc.language,
                    r.rootfs_path.display()
                ),
            ),
            Some(why) => found(
                Level::Warn,
                what,
                format!("{} not installed: {why}", r.desc.language),
            ),
        })
        .collect();
    if rts.installed().next().is_none() {
        out.push(found(
            Level::Fail,
            what,
            format!(
                "no runtime is installed under {}: build them with `make runtimes` (or isobox-runtimes from the package)",
                cfg.rootfs_dir.display()
            ),
        ));
    }
    out
}

fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn init(path: &Path) -> Finding {
    if executable(path) {
        found(Level::Ok, "init", path.display().to_string())
    } else {
        found(
            Level::Warn,
            "init",
            format!(
                "{} is missing: long-lived sandboxes (/wbx) cannot start (set ISOBOX_INIT)",
                path.display()
            ),
        )
    }
}

/// The eryx face's worker, and whether its Python snapshot is made already.
fn wasm(worker: Option<&Path>, cache: &Path) -> Finding {
    let Some(worker) = worker else {
        return found(
            Level::Ok,
            "wasm",
            "off (ISOBOX_WASM_WORKER=off): /eryx answers 503",
        );
    };
    if !executable(worker) {
        return found(
            Level::Warn,
            "wasm",
            format!(
                "{} is missing: Python in WebAssembly (/eryx) answers 503 (set ISOBOX_WASM_WORKER)",
                worker.display()
            ),
        );
    }
    let made = std::fs::read_dir(cache).is_ok_and(|rd| {
        rd.flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
    });
    let snapshot = if made {
        format!("snapshot in {}", cache.display())
    } else {
        format!(
            "no snapshot in {} yet: made at the first start (~20 s)",
            cache.display()
        )
    };
    found(
        Level::Ok,
        "wasm",
        format!("{}, {snapshot}", worker.display()),
    )
}

/// Where this kernel's modules are (`/lib/modules/<release>`).
fn kernel_modules() -> PathBuf {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    Path::new("/lib/modules").join(release.trim())
}

/// A sandbox whose mount points are not all in its runtime's tree (pooled, long-lived,
/// framed) has an overlay of the tree as its root (`sandbox::bundle::mount_root`).
fn overlay(filesystems: &Path, modules: &Path) -> Finding {
    let listed = std::fs::read_to_string(filesystems).is_ok_and(|s| {
        s.lines()
            .any(|l| l.split_whitespace().last() == Some("overlay"))
    });
    if listed {
        return found(Level::Ok, "overlay", "overlayfs (a sandbox's own root)");
    }
    let module = modules.join("kernel/fs/overlayfs");
    if module.is_dir() {
        found(
            Level::Ok,
            "overlay",
            "overlayfs as a module, loaded at the first run",
        )
    } else {
        found(
            Level::Fail,
            "overlay",
            "this kernel has no overlayfs: pooled and long-lived sandboxes' roots are overlays of their runtime's tree",
        )
    }
}

/// The runtimes' root images (`sandbox::image`): cold runs without network on an EROFS
/// image with no gofer, which needs `mkfs_erofs` (erofs-utils).
fn root_images(enabled: bool, image_dir: &Path, mkfs_erofs: &Path) -> Finding {
    if !enabled {
        return found(
            Level::Ok,
            "images",
            "off (ISOBOX_ROOT_IMAGES=off): cold runs use their runtime's tree, with a gofer",
        );
    }
    if mkfs_erofs.is_file() {
        found(
            Level::Ok,
            "images",
            format!(
                "{} makes the runtimes' root images in {}",
                mkfs_erofs.display(),
                image_dir.display()
            ),
        )
    } else {
        found(
            Level::Warn,
            "images",
            format!(
                "{} is missing: cold runs use their runtime's tree, with a gofer (~15 % more CPU a cold start; apt-get install erofs-utils)",
                mkfs_erofs.display()
            ),
        )
    }
}

fn mkfs() -> Finding {
    match crate::workspace::image::find_mkfs() {
        Some(p) => found(Level::Ok, "mkfs", p),
        None => found(
            Level::Warn,
            "mkfs",
            "mkfs.ext4 is missing: sessions and volumes cannot be created (apt-get install e2fsprogs)",
        ),
    }
}

fn egress(cfg: &Config) -> Vec<Finding> {
    if !cfg.egress.enabled {
        return vec![found(
            Level::Ok,
            "egress",
            "off (ISOBOX_EGRESS=off): every run is offline",
        )];
    }
    let mut out = Vec::new();
    // A name no isobox table can have (instances are [a-z0-9-]).
    let probe = format!("isobox_check_{}", std::process::id());
    out.push(match crate::netfilter::nftables_usable(&probe) {
        Ok(()) => found(Level::Ok, "egress", "nftables answers over netlink"),
        Err(e) => found(
            Level::Warn,
            "egress",
            format!("nftables is not usable ({e}): runs asking for network would be refused (apt-get install nftables; needs CAP_NET_ADMIN)"),
        ),
    });
    out.push(match crate::netfilter::forwarding_now() {
        None => found(Level::Warn, "forwarding", "net.ipv4.ip_forward is unreadable"),
        Some((false, _)) => found(
            Level::Ok,
            "forwarding",
            "off now: isoboxd turns IPv4 forwarding on at start and drops forwarded traffic that is not its sandboxes' (ISOBOX_EGRESS_FORWARD_OTHERS=auto)",
        ),
        Some((true, true)) => found(
            Level::Ok,
            "forwarding",
            "on, turned on by isoboxd, which drops forwarded traffic that is not its sandboxes' (ISOBOX_EGRESS_FORWARD_OTHERS=auto)",
        ),
        Some((true, false)) => found(
            Level::Warn,
            "forwarding",
            "already on, not by isoboxd: others' forwarded traffic is left to the host's firewall (check its FORWARD policy, or set ISOBOX_EGRESS_FORWARD_OTHERS=drop)",
        ),
    });
    out
}

/// `path` or the nearest of its ancestors that exists.
fn existing_ancestor(path: &Path) -> Option<PathBuf> {
    path.ancestors().find(|p| p.exists()).map(Path::to_path_buf)
}

fn data_dir(cfg: &Config) -> Vec<Finding> {
    let what = "data dir";
    let dir = &cfg.data_dir;
    let mut out = Vec::new();
    let Some(base) = existing_ancestor(dir) else {
        return vec![found(
            Level::Fail,
            what,
            format!("{}: no ancestor exists", dir.display()),
        )];
    };
    if base == *dir {
        if !dir.is_dir() {
            return vec![found(
                Level::Fail,
                what,
                format!("{} is not a directory", dir.display()),
            )];
        }
        // One file, removed at once: a read-only filesystem says so here.
        let probe = dir.join(format!(".isobox-check-{}", std::process::id()));
        match std::fs::File::create(&probe) {
            Ok(_) => {
                let _ = std::fs::remove_file(&probe);
                out.push(found(
                    Level::Ok,
                    what,
                    format!("{} is writable", dir.display()),
                ));
            }
            Err(e) => {
                return vec![found(
                    Level::Fail,
                    what,
                    format!("{} is not writable: {e}", dir.display()),
                )]
            }
        }
    } else if base.is_dir() {
        out.push(found(
            Level::Ok,
            what,
            format!("{} does not exist yet; isoboxd creates it", dir.display()),
        ));
    } else {
        return vec![found(
            Level::Fail,
            what,
            format!(
                "{} cannot be created: {} is not a directory",
                dir.display(),
                base.display()
            ),
        )];
    }
    let reserve = cfg.sessions.storage_reserve_bytes;
    match crate::workspace::image::free_bytes(&base) {
        Ok(free) if free < reserve => out.push(found(
            Level::Warn,
            "disk",
            format!(
                "{} free under {}, below ISOBOX_STORAGE_RESERVE_BYTES ({}): new sessions and volumes are refused",
                human(free),
                base.display(),
                human(reserve)
            ),
        )),
        Ok(free) => out.push(found(
            Level::Ok,
            "disk",
            format!("{} free under {} (reserve {})", human(free), base.display(), human(reserve)),
        )),
        Err(e) => out.push(found(Level::Warn, "disk", e.to_string())),
    }
    out
}

/// Bytes for a person: `1.5 GiB`.
fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The pid of the running isoboxd of `instance`, from its lock file (read, not locked:
/// a check never holds a daemon's lock).
fn running_daemon(instance: &str) -> Option<u32> {
    let path = crate::daemon::lock_path(instance);
    let pid: u32 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim() == "isoboxd").then_some(pid)
}

fn listen(cfg: &Config) -> Finding {
    let what = "listen";
    match std::net::TcpListener::bind(cfg.listen) {
        Ok(_) => found(Level::Ok, what, format!("{} can be bound", cfg.listen)),
        Err(e) => match running_daemon(&cfg.instance) {
            Some(pid) if e.kind() == std::io::ErrorKind::AddrInUse => found(
                Level::Ok,
                what,
                format!(
                    "{} is in use by the running isoboxd of instance {} (pid {pid})",
                    cfg.listen, cfg.instance
                ),
            ),
            _ => found(
                Level::Fail,
                what,
                format!("{} cannot be bound: {e} (set ISOBOX_LISTEN)", cfg.listen),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runsc_dates_are_read_from_both_spellings() {
        assert_eq!(runsc_date("runsc version 0.0~20221219.0"), Some(20_221_219));
        assert_eq!(
            runsc_date("runsc version release-20240729.0"),
            Some(20_240_729)
        );
        assert_eq!(runsc_date(TESTED_RUNSC), Some(20_240_729));
        assert_eq!(runsc_date("runsc version 0.0~202212191.0"), None);
        assert_eq!(runsc_date("runsc version dev"), None);
    }

    #[test]
    fn a_fail_means_the_daemon_could_not_serve() {
        let ok = found(Level::Ok, "root", "running as root");
        let warn = found(Level::Warn, "mkfs", "missing");
        let fail = found(Level::Fail, "runsc", "/nope: not found");
        let (text, serves) = render(&[ok.clone(), warn.clone()]);
        assert!(serves);
        assert!(
            text.starts_with("ok    root       running as root\nwarn  mkfs       missing\n"),
            "{text}"
        );
        assert!(
            text.ends_with("result: isoboxd can serve on this host (1 warning)\n"),
            "{text}"
        );
        let (text, serves) = render(&[ok, warn, fail]);
        assert!(!serves);
        assert!(
            text.contains("FAIL  runsc      /nope: not found\n"),
            "{text}"
        );
        assert!(
            text.ends_with("result: isoboxd could not serve on this host (1 failure, 1 warning)\n"),
            "{text}"
        );
    }

    #[test]
    fn cgroups_found_or_not_on_a_fixture() {
        let dir = std::env::temp_dir().join(format!("isobox-check-cg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(cgroups(&dir).level, Level::Fail);
        std::fs::write(dir.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let f = cgroups(&dir);
        assert_eq!(
            (f.level, f.detail.as_str()),
            (Level::Ok, "v2 with memory, cpu and pids")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn overlay_found_listed_as_a_module_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("isobox-check-ovl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fs = dir.join("filesystems");
        std::fs::write(&fs, "nodev\ttmpfs\nnodev\toverlay\n").unwrap();
        assert_eq!(overlay(&fs, &dir).level, Level::Ok);
        std::fs::write(&fs, "nodev\ttmpfs\n\text4\n").unwrap();
        assert_eq!(overlay(&fs, &dir).level, Level::Fail);
        std::fs::create_dir_all(dir.join("kernel/fs/overlayfs")).unwrap();
        let f = overlay(&fs, &dir);
        assert_eq!(
            (f.level, f.detail.as_str()),
            (Level::Ok, "overlayfs as a module, loaded at the first run")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn root_images_off_found_or_missing() {
        let dir = Path::new("/var/lib/isobox/images");
        let here = std::env::current_exe().unwrap();
        assert_eq!(root_images(false, dir, &here).level, Level::Ok);
        let f = root_images(true, dir, &here);
        assert_eq!(f.level, Level::Ok);
        assert!(
            f.detail.ends_with("root images in /var/lib/isobox/images"),
            "{}",
            f.detail
        );
        let f = root_images(true, dir, Path::new("/nonexistent/mkfs.erofs"));
        assert_eq!(f.level, Level::Warn);
        assert!(
            f.detail.contains("apt-get install erofs-utils"),
            "{}",
            f.detail
        );
    }

    #[test]
    fn sizes_read_as_a_person_would() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 30), "3.0 GiB");
        assert_eq!(human(1536 << 20), "1.5 GiB");
    }
}

//! What a jailed child (`super::jail_on_spawn`) sees of the host's files: a mount
//! namespace of its own whose root is an empty, read-only tmpfs holding the system's
//! programs and libraries (`/usr`, and `/bin`, `/lib*`, `/sbin` as the host has them:
//! links or read-only binds), its own executable, what it is given (each bound at its
//! own path, read-only or writable), and a `/proc` of its own that shows only its
//! user's processes. Nothing else of the host is there: not the daemon's data (the
//! sessions' workspaces, the volumes, the store, other runs' directories), not `/tmp`,
//! `/dev/shm`, `/etc` or `/home`.
//!
//! Everything is worked out here, in the parent; the child only makes the calls
//! ([`View::enter`]), with no allocation.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where the host's root is while the view is made (it is gone once made).
const OLD_ROOT: &CStr = c"/.isobox-host";
/// The new root, before it is the root: a tmpfs of the child's namespace mounted on
/// the host's `/tmp` (any directory would do; the host's own `/tmp` is reached through
/// [`OLD_ROOT`] once the tmpfs is the root).
const STAGE: &CStr = c"/tmp";
/// [`OLD_ROOT`] before the pivot: in [`STAGE`].
const STAGED_OLD_ROOT: &CStr = c"/tmp/.isobox-host";

/// Read-only, programs may run from it.
const EXEC: libc::c_ulong = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
/// Read-only, nothing runs from it.
const READ: libc::c_ulong = EXEC | libc::MS_NOEXEC;
/// Writable, nothing runs from it.
const WRITE: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;

/// How a path is given to the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read-only, nothing runs from it.
    Read,
    /// Read-only, and its files may be mapped to run (compiled code that is loaded
    /// rather than run as a program: a wasmtime snapshot).
    Exec,
    /// Writable, nothing runs from it.
    Write,
}

/// One bind: the host's path (under [`OLD_ROOT`]), where it goes, its flags.
#[derive(Debug)]
struct Bind {
    from: CString,
    to: CString,
    flags: libc::c_ulong,
}

/// A child's view of the host's files, made in the parent, entered in the child.
#[derive(Debug)]
pub struct View {
    /// Directories to make in the new root, parents first.
    dirs: Vec<CString>,
    /// Empty files to make in the new root (where files are bound).
    files: Vec<CString>,
    /// Symbolic links (target, link) as the host has them.
    links: Vec<(CString, CString)>,
    binds: Vec<Bind>,
    /// Paths made so far, directories bound so far (what is under one exists), and
    /// the links' paths.
    made: Vec<PathBuf>,
    bound: Vec<Bound>,
    linked: Vec<PathBuf>,
    /// `/proc`'s options.
    proc_options: &'static CStr,
}

/// A directory bound: where, how, and the device of its filesystem.
#[derive(Debug, Clone)]
struct Bound {
    path: PathBuf,
    flags: libc::c_ulong,
    dev: u64,
}

/// `/proc` showing only the child's user's processes (`hidepid=2`) where each mount of
/// it has its own options (Linux 5.8 on); before, the option would change the host's
/// `/proc` too, so the child's shows every process.
fn proc_options() -> &'static CStr {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    if (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (5, 8) {
        c"hidepid=2"
    } else {
        c""
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a path"))
}

fn cpath(p: &Path) -> io::Result<CString> {
    cstring(p.as_os_str().as_bytes())
}

impl View {
    /// The system's programs and libraries (what a dynamically linked `exe` needs to
    /// start) and `exe` itself.
    ///
    /// # Errors
    /// A path that cannot be read or is not absolute.
    pub fn new(exe: &Path) -> io::Result<View> {
        let mut v = View {
            dirs: Vec::new(),
            files: Vec::new(),
            links: Vec::new(),
            binds: Vec::new(),
            made: vec![PathBuf::from("/")],
            bound: Vec::new(),
            linked: Vec::new(),
            proc_options: proc_options(),
        };
        v.add(Path::new("/usr"), EXEC)?;
        for top in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
            let p = Path::new(top);
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_symlink() => {
                    let target = std::fs::read_link(p)?;
                    v.links.push((cpath(&target)?, cpath(p)?));
                    v.linked.push(p.to_path_buf());
                }
                Ok(m) if m.is_dir() => v.add(p, EXEC)?,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        v.add(exe, EXEC)?;
        Ok(v)
    }

    /// Gives the child `path` (a directory or a file, which must exist), at the same
    /// path.
    ///
    /// # Errors
    /// A path that cannot be read, or is not a plain absolute path (no `.` or `..`).
    pub fn give(&mut self, path: &Path, access: Access) -> io::Result<()> {
        self.add(
            path,
            match access {
                Access::Read => READ,
                Access::Exec => EXEC,
                Access::Write => WRITE,
            },
        )
    }

    fn add(&mut self, given: &Path, flags: libc::c_ulong) -> io::Result<()> {
        let invalid = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: {why}", given.display()),
            )
        };
        if !given.is_absolute()
            || given.parent().is_none()
            || given.components().any(|c| {
                !matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            })
        {
            return Err(invalid("not a plain absolute path below /"));
        }
        if given
            .as_os_str()
            .as_bytes()
            .starts_with(OLD_ROOT.to_bytes())
            || given.starts_with("/proc")
        {
            return Err(invalid("reserved"));
        }
        let meta = std::fs::metadata(given)?;
        // The source: where it really is. Links on the way are resolved here, on the
        // host; after the pivot, a link's absolute target would be looked up in the
        // new root.
        let real = std::fs::canonicalize(given)?;
        // Where the child finds it: where it was given, unless under one of the host's
        // top-level links made here (`/bin` to `usr/bin`, say), which the child's
        // lookup follows: then where it really is.
        let at = if self.linked.iter().any(|l| given.starts_with(l)) {
            real.clone()
        } else {
            given.to_path_buf()
        };
        // Binds are made in order: nothing may hide one made before it.
        if self
            .bound
            .iter()
            .any(|b| b.path.starts_with(&at) && b.path != at)
        {
            return Err(invalid("a path under it was given before it"));
        }
        let parent = self
            .bound
            .iter()
            .filter(|b| at.starts_with(&b.path) && at != b.path)
            .max_by_key(|b| b.path.as_os_str().len())
            .cloned();
        match parent {
            // Under a bound directory it is there already, unless it is on a
            // filesystem mounted below that directory, which a bind does not take
            // along: that mount is bound first, as its parent is.
            Some(p) if meta.dev() != p.dev => {
                let mount = at
                    .ancestors()
                    .take_while(|a| *a != p.path)
                    .filter(|a| std::fs::metadata(a).is_ok_and(|m| m.dev() == meta.dev()))
                    .last()
                    .map(Path::to_path_buf);
                if let Some(m) = mount.filter(|m| *m != at) {
                    let real = std::fs::canonicalize(&m)?;
                    self.push_bind(&m, &real, p.flags, Some(meta.dev()))?;
                }
            }
            Some(_) => {}
            None => {
                let mut dirs: Vec<&Path> = at.ancestors().skip(1).collect();
                dirs.reverse();
                for d in dirs {
                    if !self.made.iter().any(|m| m == d) {
                        self.dirs.push(cpath(d)?);
                        self.made.push(d.to_path_buf());
                    }
                }
                if !self.made.contains(&at) {
                    if meta.is_dir() {
                        self.dirs.push(cpath(&at)?);
                    } else {
                        self.files.push(cpath(&at)?);
                    }
                    self.made.push(at.clone());
                }
            }
        }
        self.push_bind(&at, &real, flags, meta.is_dir().then_some(meta.dev()))
    }

    /// A bind of `real` (the host's) at `at` (the child's); a directory's (`dir`: its
    /// filesystem's device) is recorded as bound.
    fn push_bind(
        &mut self,
        at: &Path,
        real: &Path,
        flags: libc::c_ulong,
        dir: Option<u64>,
    ) -> io::Result<()> {
        let mut from = OLD_ROOT.to_bytes().to_vec();
        from.extend_from_slice(real.as_os_str().as_bytes());
        self.binds.push(Bind {
            from: cstring(&from)?,
            to: cpath(at)?,
            flags,
        });
        if let Some(dev) = dir {
            self.bound.push(Bound {
                path: at.to_path_buf(),
                flags,
                dev,
            });
        }
        Ok(())
    }

    /// In the child, root in the initial user namespace, before it drops its
    /// credentials: a new mount namespace, seeing only this view. Makes only system
    /// calls (async-signal-safe), allocates nothing.
    ///
    /// # Errors
    /// The first call that failed.
    pub fn enter(&self) -> io::Result<()> {
        use crate::syscall;
        let null = std::ptr::null::<libc::c_char>();
        let none = std::ptr::null::<libc::c_void>();
        // The view's directories as asked (0755), whatever the daemon's umask; the
        // child's own is given back below.
        // SAFETY: umask only swaps the process's mask.
        let umask = unsafe { libc::umask(0) };
        syscall!(unshare(libc::CLONE_NEWNS))?;
        // Nothing done here reaches the host's namespace, nor anything of it here.
        syscall!(mount(
            null,
            c"/".as_ptr(),
            null,
            libc::MS_REC | libc::MS_PRIVATE,
            none
        ))?;
        syscall!(mount(
            c"isobox-jail".as_ptr(),
            STAGE.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"mode=0755,size=64k,nr_inodes=1024"
                .as_ptr()
                .cast::<libc::c_void>()
        ))?;
        syscall!(mkdir(STAGED_OLD_ROOT.as_ptr(), 0o700))?;
        syscall!(syscall(
            libc::SYS_pivot_root,
            STAGE.as_ptr(),
            STAGED_OLD_ROOT.as_ptr()
        ))?;
        syscall!(chdir(c"/".as_ptr()))?;
        for d in &self.dirs {
            match syscall!(mkdir(d.as_ptr(), 0o755)) {
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                r => {
                    r?;
                }
            }
        }
        for f in &self.files {
            let fd = syscall!(open(
                f.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o444
            ))?;
            syscall!(close(fd))?;
        }
        for (target, link) in &self.links {
            syscall!(symlink(target.as_ptr(), link.as_ptr()))?;
        }
        for b in &self.binds {
            syscall!(mount(
                b.from.as_ptr(),
                b.to.as_ptr(),
                null,
                libc::MS_BIND,
                none
            ))?;
            syscall!(mount(
                null,
                b.to.as_ptr(),
                null,
                libc::MS_BIND | libc::MS_REMOUNT | b.flags,
                none
            ))?;
        }
        syscall!(mkdir(c"/proc".as_ptr(), 0o555))?;
        // The host's processes, but only the child's user's are there (hidepid=2).
        syscall!(mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            self.proc_options.as_ptr().cast::<libc::c_void>()
        ))?;
        syscall!(umount2(OLD_ROOT.as_ptr(), libc::MNT_DETACH))?;
        syscall!(rmdir(OLD_ROOT.as_ptr()))?;
        syscall!(mount(
            null,
            c"/".as_ptr(),
            null,
            libc::MS_REMOUNT
                | libc::MS_BIND
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC,
            none
        ))?;
        // SAFETY: as above.
        unsafe { libc::umask(umask) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A uid of the test's alone (Debian's reserved range; no isobox process has it),
    /// so the child's `/proc` shows its own processes only.
    const UID: u32 = 65531;

    #[test]
    fn test_a_jailed_child_sees_only_its_view() {
        if crate::sys::euid() != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let base = std::env::temp_dir().join(format!("isobox-jail-test-{}", std::process::id()));
        let (ro, rw, hidden) = (base.join("ro"), base.join("rw"), base.join("hidden"));
        for d in [&ro, &rw, &hidden] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(ro.join("f"), "given").unwrap();
        std::fs::write(hidden.join("f"), "secret").unwrap();
        std::os::unix::fs::chown(&rw, Some(UID), Some(UID)).unwrap();
        std::os::unix::fs::chown(&ro, Some(UID), Some(UID)).unwrap();
        // Given through a link with an absolute target, which the child never sees.
        let (target, link) = (base.join("target"), base.join("link"));
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("f"), "through a link").unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let mut view = View::new(Path::new("/bin/sh")).unwrap();
        view.give(&ro, Access::Read).unwrap();
        view.give(&rw, Access::Write).unwrap();
        view.give(&link, Access::Read).unwrap();
        // Nothing given may hide what was given before it, nor be the root.
        for (bad, access) in [(&base, Access::Read), (&PathBuf::from("/"), Access::Read)] {
            let e = view.give(bad, access).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}: {e}");
        }
        let script = format!(
            "ls -A /; echo ---; cat {ro}/f; echo; echo ---; \
             cat {link}/f; echo; echo ---; \
             (echo x > {ro}/g) 2>/dev/null && echo ro-written || echo ro-refused; \
             (echo x > {rw}/g) && echo rw-written; \
             cat {hidden}/f 2>/dev/null || echo hidden-absent; \
             ls -A {base}; echo ---; \
             (: > /x) 2>/dev/null && echo root-written || echo root-refused; \
             ls /proc | grep -c '^[0-9]'; echo ---; cat /proc/self/mountinfo",
            ro = ro.display(),
            rw = rw.display(),
            hidden = hidden.display(),
            base = base.display(),
            link = link.display(),
        );
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(&script)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let theirs = std::os::fd::OwnedFd::from(theirs);
        // A umask that would close the view's directories to the child, had they been
        // made under it.
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: umask is async-signal-safe and only swaps the child's mask.
            unsafe {
                cmd.pre_exec(|| {
                    libc::umask(0o077);
                    Ok(())
                });
            }
        }
        crate::sys::jail_on_spawn(&mut cmd, &[], &theirs, UID, view);
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let parts: Vec<&str> = stdout.split("---\n").collect();
        assert_eq!(parts.len(), 6, "{stdout}");
        // The root: the system's directories as the host has them, /proc, and the
        // given paths' first component; nothing else (no /etc, /home, /var, /dev).
        let mut want: Vec<String> = ["bin", "sbin", "lib", "lib32", "lib64", "libx32"]
            .into_iter()
            .filter(|n| Path::new("/").join(n).symlink_metadata().is_ok())
            .map(String::from)
            .collect();
        want.extend(["proc", "usr"].map(String::from));
        want.push(
            base.components()
                .nth(1)
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .into_owned(),
        );
        want.sort();
        want.dedup();
        let mut root: Vec<&str> = parts[0].lines().collect();
        root.sort_unstable();
        assert_eq!(root, want, "{stdout}");
        assert_eq!(parts[1], "given\n");
        assert_eq!(parts[2], "through a link\n");
        // Read-only where given so, writable where given so, hidden what was not given.
        assert_eq!(
            parts[3].lines().collect::<Vec<_>>(),
            [
                "ro-refused",
                "rw-written",
                "hidden-absent",
                "link",
                "ro",
                "rw"
            ],
            "{stdout}"
        );
        assert_eq!(std::fs::read_to_string(rw.join("g")).unwrap(), "x\n");
        assert!(!ro.join("g").exists());
        let (refused, mountinfo) = parts[4..].split_first().unwrap();
        let mut lines = refused.lines();
        assert_eq!(lines.next(), Some("root-refused"), "{stdout}");
        // Only its own processes: the shell and ls (grep may not have started yet).
        let pids: u32 = lines.next().unwrap().trim().parse().unwrap();
        assert!((1..=3).contains(&pids), "{stdout}");
        // Its mounts: the root, /usr, the shell's binary, the given two and /proc, with
        // their flags.
        let mounts: Vec<(String, String)> = mountinfo[0]
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f[4].to_string(), f[5].to_string())
            })
            .collect();
        let flags = |at: &Path| -> Vec<String> {
            let at = at.to_str().unwrap();
            mounts
                .iter()
                .filter(|(p, _)| p == at)
                .map(|(_, o)| o.clone())
                .collect()
        };
        let has = |at: &Path, opts: &[&str]| {
            let f = flags(at);
            assert_eq!(f.len(), 1, "{at:?}: {mounts:?}");
            let mut got: Vec<&str> = f[0]
                .split(',')
                .filter(|o| ["ro", "rw", "nosuid", "nodev", "noexec"].contains(o))
                .collect();
            got.sort_unstable();
            let mut want = opts.to_vec();
            want.sort_unstable();
            assert_eq!(got, want, "{at:?}");
        };
        has(Path::new("/"), &["ro", "nosuid", "nodev", "noexec"]);
        has(Path::new("/usr"), &["ro", "nosuid", "nodev"]);
        has(&ro, &["ro", "nosuid", "nodev", "noexec"]);
        has(&rw, &["rw", "nosuid", "nodev", "noexec"]);
        has(&link, &["ro", "nosuid", "nodev", "noexec"]);
        has(Path::new("/proc"), &["rw", "nosuid", "nodev", "noexec"]);
        let dash = std::fs::canonicalize("/bin/sh").unwrap();
        has(&dash, &["ro", "nosuid", "nodev"]);
        let proc_line = mountinfo[0]
            .lines()
            .find(|l| l.split_whitespace().nth(4) == Some("/proc"));
        let proc_line = proc_line.unwrap();
        assert!(
            proc_line.contains("hidepid=invisible") || proc_line.contains("hidepid=2"),
            "{proc_line}"
        );
        // Where the host's top directories are directories, not links, they are bound.
        let top_dirs = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
            .into_iter()
            .filter(|p| Path::new(p).symlink_metadata().is_ok_and(|m| m.is_dir()))
            .count();
        assert_eq!(mounts.len(), 7 + top_dirs, "{mounts:?}");
        std::fs::remove_dir_all(&base).unwrap();
    }
}

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
    bound: Vec<PathBuf>,
    linked: Vec<PathBuf>,
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

    fn add(&mut self, path: &Path, flags: libc::c_ulong) -> io::Result<()> {
        let invalid = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: {why}", path.display()),
            )
        };
        if !path.is_absolute()
            || path.components().any(|c| {
                !matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            })
        {
            return Err(invalid("not a plain absolute path"));
        }
        if path.as_os_str().as_bytes().starts_with(OLD_ROOT.to_bytes()) || path.starts_with("/proc")
        {
            return Err(invalid("reserved"));
        }
        let is_dir = std::fs::metadata(path)?.is_dir();
        // Under a link of the host's made here (`/bin` to `usr/bin`, say), it is bound
        // where the link leads: the child's path goes there too.
        let canonical;
        let path = if self.linked.iter().any(|l| path.starts_with(l)) {
            canonical = std::fs::canonicalize(path)?;
            canonical.as_path()
        } else {
            path
        };
        // What is under a bound directory is there already (and may be bound over).
        let under = self.bound.iter().any(|b| path.starts_with(b) && path != b);
        if !under {
            let mut dirs: Vec<&Path> = path.ancestors().skip(1).collect();
            dirs.reverse();
            for d in dirs {
                if !self.made.iter().any(|m| m == d) {
                    self.dirs.push(cpath(d)?);
                    self.made.push(d.to_path_buf());
                }
            }
            if !self.made.iter().any(|m| m == path) {
                if is_dir {
                    self.dirs.push(cpath(path)?);
                } else {
                    self.files.push(cpath(path)?);
                }
                self.made.push(path.to_path_buf());
            }
        }
        let mut from = OLD_ROOT.to_bytes().to_vec();
        from.extend_from_slice(path.as_os_str().as_bytes());
        self.binds.push(Bind {
            from: cstring(&from)?,
            to: cpath(path)?,
            flags,
        });
        if is_dir {
            self.bound.push(path.to_path_buf());
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
            c"hidepid=2".as_ptr().cast::<libc::c_void>()
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

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
        std::os::unix::fs::chown(&rw, Some(crate::sys::NOBODY), Some(crate::sys::NOBODY)).unwrap();
        std::os::unix::fs::chown(&ro, Some(crate::sys::NOBODY), Some(crate::sys::NOBODY)).unwrap();
        let mut view = View::new(Path::new("/bin/sh")).unwrap();
        view.give(&ro, Access::Read).unwrap();
        view.give(&rw, Access::Write).unwrap();
        let script = format!(
            "ls -A /; echo ---; cat {ro}/f; echo; echo ---; \
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
        );
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(&script)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let theirs = std::os::fd::OwnedFd::from(theirs);
        crate::sys::jail_on_spawn(&mut cmd, &[], &theirs, crate::sys::NOBODY, view);
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let parts: Vec<&str> = stdout.split("---\n").collect();
        assert_eq!(parts.len(), 5, "{stdout}");
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
        // Read-only where given so, writable where given so, hidden what was not given.
        assert_eq!(
            parts[2].lines().collect::<Vec<_>>(),
            ["ro-refused", "rw-written", "hidden-absent", "ro", "rw"],
            "{stdout}"
        );
        assert_eq!(std::fs::read_to_string(rw.join("g")).unwrap(), "x\n");
        assert!(!ro.join("g").exists());
        let (refused, mountinfo) = parts[3..].split_first().unwrap();
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
        assert_eq!(mounts.len(), 6 + top_dirs, "{mounts:?}");
        std::fs::remove_dir_all(&base).unwrap();
    }
}

//! inotify: an instance, its watches and its events, for the init's `fs/watch`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A file was created in a watched directory.
pub const IN_CREATE: u32 = libc::IN_CREATE;
/// A file was written.
pub const IN_MODIFY: u32 = libc::IN_MODIFY;
/// A file was removed from a watched directory.
pub const IN_DELETE: u32 = libc::IN_DELETE;
/// A file was moved out of a watched directory.
pub const IN_MOVED_FROM: u32 = libc::IN_MOVED_FROM;
/// A file was moved into a watched directory.
pub const IN_MOVED_TO: u32 = libc::IN_MOVED_TO;
/// The watched directory itself was removed.
pub const IN_DELETE_SELF: u32 = libc::IN_DELETE_SELF;
/// The watch is gone (its directory removed, or it was removed).
pub const IN_IGNORED: u32 = libc::IN_IGNORED;
/// The event is about a directory.
pub const IN_ISDIR: u32 = libc::IN_ISDIR;
/// Events were lost: the queue overflowed.
pub const IN_Q_OVERFLOW: u32 = libc::IN_Q_OVERFLOW;
/// What `fs/watch` reports.
pub const WATCH_MASK: u32 =
    IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The watch it came from.
    pub wd: i32,
    /// What happened (`IN_*`).
    pub mask: u32,
    /// Pairs a `IN_MOVED_FROM` with its `IN_MOVED_TO`.
    pub cookie: u32,
    /// The name in the watched directory (empty for the directory itself).
    pub name: Vec<u8>,
}

/// A non-blocking, close-on-exec inotify instance.
pub struct Inotify {
    fd: OwnedFd,
}

impl Inotify {
    /// A new instance.
    ///
    /// # Errors
    /// `inotify_init1` failures (`EMFILE`: too many instances).
    pub fn new() -> io::Result<Inotify> {
        let fd = crate::syscall!(inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC))?;
        // SAFETY: the kernel just returned this fd; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Inotify { fd })
    }

    /// Its fd (to poll).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Watches `path` for `mask`; its watch descriptor.
    ///
    /// # Errors
    /// `EACCES` when the caller may not read `path`; `inotify_add_watch` failures
    /// (`ENOENT`, `ENOSPC`: too many watches).
    pub fn add(&self, path: &Path, mask: u32) -> io::Result<i32> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // Linux lets only a reader watch a file; gVisor does not check: ask first (as
        // the calling thread's real user).
        crate::syscall!(access(c.as_ptr(), libc::R_OK))?;
        crate::syscall!(inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), mask))
    }

    /// Reads the events waiting (none when there are none).
    ///
    /// # Errors
    /// `read` failures other than `EAGAIN`.
    pub fn read(&self, buf: &mut Vec<u8>) -> io::Result<Vec<Event>> {
        buf.resize(64 << 10, 0);
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Vec::new()),
                _ => Err(e),
            };
        }
        Ok(parse(&buf[..usize::try_from(n).unwrap_or(0)]))
    }
}

/// Events from what `read` returned (a truncated last one is dropped).
pub fn parse(mut b: &[u8]) -> Vec<Event> {
    let mut out = Vec::new();
    while b.len() >= 16 {
        let word = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (wd, mask, cookie, len) = (word(0) as i32, word(4), word(8), word(12) as usize);
        let Some(name) = b.get(16..16 + len) else {
            break;
        };
        let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        out.push(Event {
            wd,
            mask,
            cookie,
            name: name[..end].to_vec(),
        });
        b = &b[16 + len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_events_of_a_directory() {
        let dir = std::env::temp_dir().join(format!("isobox-inotify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ino = Inotify::new().unwrap();
        let wd = ino.add(&dir, WATCH_MASK).unwrap();
        std::fs::write(dir.join("a"), b"x").unwrap();
        std::fs::rename(dir.join("a"), dir.join("b")).unwrap();
        std::fs::remove_file(dir.join("b")).unwrap();
        let mut buf = Vec::new();
        let ev = ino.read(&mut buf).unwrap();
        let kinds: Vec<(u32, &[u8])> = ev
            .iter()
            .map(|e| (e.mask & !IN_ISDIR, e.name.as_slice()))
            .collect();
        assert_eq!(
            kinds,
            [
                (IN_CREATE, b"a".as_slice()),
                (IN_MODIFY, b"a"),
                (IN_MOVED_FROM, b"a"),
                (IN_MOVED_TO, b"b"),
                (IN_DELETE, b"b")
            ]
        );
        assert!(ev.iter().all(|e| e.wd == wd));
        assert_eq!(ev[2].cookie, ev[3].cookie);
        assert!(ino.read(&mut buf).unwrap().is_empty());
        assert_eq!(parse(&[1, 2, 3]), []);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

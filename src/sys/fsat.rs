//! Directory-fd-relative file system calls (`openat2` and the `*at` family).
//!
//! These are the raw building blocks `workspace::fs` uses to touch a session workspace
//! without ever leaving it: every path is resolved relative to a directory fd, and the
//! caller picks the `RESOLVE_*` / `AT_*` flags that confine it. Nothing here interprets
//! paths; it only wraps the calls safely and returns `io::Result`.

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// How many times `openat2` is retried on `EAGAIN` (a concurrent rename made the kernel
/// unsure a `..` stayed beneath the root) or `EINTR` before giving up.
const OPENAT2_RETRIES: usize = 64;

/// Size of the buffer handed to `getdents64`.
const DIRENT_BUF: usize = 64 * 1024;

/// `struct open_how` from `linux/openat2.h` (version 0, 24 bytes).
///
/// Defined here because `libc::open_how` is `#[non_exhaustive]` and cannot be built
/// with a struct literal.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// The parts of a `struct stat` the workspace code needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    /// `st_mode`: file type (`S_IFMT` bits) and permission bits.
    pub mode: u32,
    /// `st_size` in bytes (never negative).
    pub size: u64,
    /// `st_mtime`: seconds since the Unix epoch (may be negative).
    pub mtime_sec: i64,
    /// `st_mtime_nsec`: nanoseconds within the second.
    pub mtime_nsec: i64,
    /// `st_dev`: the device the file lives on.
    pub dev: u64,
    /// `st_ino`: the inode number.
    pub ino: u64,
    /// `st_uid`: the owner.
    pub uid: u32,
    /// `st_gid`: the group.
    pub gid: u32,
}

impl FileStat {
    fn from_raw(st: &libc::stat) -> Self {
        Self {
            mode: st.st_mode,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime_sec: st.st_mtime,
            mtime_nsec: st.st_mtime_nsec,
            dev: st.st_dev,
            ino: st.st_ino,
            uid: st.st_uid,
            gid: st.st_gid,
        }
    }

    /// The file-type bits (`mode & S_IFMT`), to compare with `libc::S_IFREG` and friends.
    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    /// Whether this is a regular file.
    pub fn is_file(&self) -> bool {
        self.file_type() == libc::S_IFREG
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }

    /// Whether this is a symbolic link (only possible from `fstatat(AT_SYMLINK_NOFOLLOW)`).
    pub fn is_symlink(&self) -> bool {
        self.file_type() == libc::S_IFLNK
    }
}

/// `openat2(2)`: opens `path` relative to `dir` with `flags`, `mode` and `resolve`
/// (`RESOLVE_*` bits). `O_CLOEXEC` is always added.
///
/// Retried on `EAGAIN` and `EINTR` a bounded number of times.
///
/// # Errors
/// Whatever the kernel reports (`EXDEV` when resolution would leave `dir` under
/// `RESOLVE_BENEATH`, `ELOOP`, `ENOENT`, `ENOTDIR`, ...).
pub fn openat2(
    dir: BorrowedFd<'_>,
    path: &CStr,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let how = OpenHow {
        // The flags are a bit set; reinterpreting the sign bit is intended.
        flags: u64::from((flags | libc::O_CLOEXEC) as u32),
        mode: u64::from(mode),
        resolve,
    };
    let mut last = io::Error::from_raw_os_error(libc::EAGAIN);
    for _ in 0..OPENAT2_RETRIES {
        // SAFETY: `path` is a valid NUL-terminated string and `how` a valid open_how of the
        // size we pass; both outlive the call, and the kernel only reads them.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                path.as_ptr(),
                std::ptr::from_ref(&how),
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd >= 0 {
            let fd = i32::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
            // SAFETY: the kernel just returned this fd to us; nothing else owns it.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => last = err,
            _ => return Err(err),
        }
    }
    Err(last)
}

/// `mkdirat(2)`: creates the directory `name` in `dir` (subject to the umask).
///
/// # Errors
/// `EEXIST` when anything (even a dangling symlink) already has that name, and the usual.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    crate::syscall!(mkdirat(
        dir.as_raw_fd(),
        name.as_ptr(),
        mode as libc::mode_t
    ))?;
    Ok(())
}

/// `unlinkat(2)`: removes `name` from `dir`; `flags` is `0` or `libc::AT_REMOVEDIR`.
///
/// Never follows a symlink: a symlink named `name` is itself removed.
///
/// # Errors
/// `EISDIR` for a directory without `AT_REMOVEDIR`, `ENOTEMPTY`, `ENOENT`, ...
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<()> {
    crate::syscall!(unlinkat(dir.as_raw_fd(), name.as_ptr(), flags))?;
    Ok(())
}

/// `renameat(2)`: atomically renames `old` in `old_dir` to `new` in `new_dir`, replacing
/// `new` if it exists (a symlink named `new` is replaced, not followed).
///
/// # Errors
/// `EISDIR` when `new` is a directory and `old` is not, `ENOENT`, `EXDEV`, ...
pub fn renameat(
    old_dir: BorrowedFd<'_>,
    old: &CStr,
    new_dir: BorrowedFd<'_>,
    new: &CStr,
) -> io::Result<()> {
    crate::syscall!(renameat(
        old_dir.as_raw_fd(),
        old.as_ptr(),
        new_dir.as_raw_fd(),
        new.as_ptr()
    ))?;
    Ok(())
}

/// `fchown(2)`: sets owner and group of the open file `fd` (not an `O_PATH` fd).
///
/// # Errors
/// `EPERM` without the privilege, `EBADF` for an `O_PATH` fd, ...
pub fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    crate::syscall!(fchown(fd.as_raw_fd(), uid, gid))?;
    Ok(())
}

/// `fchmod(2)`: sets the permission bits of the open file `fd` (not an `O_PATH` fd).
///
/// # Errors
/// `EPERM`, `EBADF` for an `O_PATH` fd, ...
pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    crate::syscall!(fchmod(fd.as_raw_fd(), mode as libc::mode_t))?;
    Ok(())
}

/// `fstatat(2)`: stats `name` in `dir`. Pass `libc::AT_SYMLINK_NOFOLLOW` to stat a
/// symlink itself rather than its target.
///
/// # Errors
/// `ENOENT`, `ENOTDIR`, ...
pub fn fstatat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<FileStat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    crate::syscall!(fstatat(
        dir.as_raw_fd(),
        name.as_ptr(),
        st.as_mut_ptr(),
        flags
    ))?;
    // SAFETY: fstatat succeeded, so the kernel filled in the whole struct.
    let st = unsafe { st.assume_init() };
    Ok(FileStat::from_raw(&st))
}

/// `fstat(2)`: stats the open file `fd` (works on `O_PATH` fds too).
///
/// # Errors
/// `EBADF` and the like.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<FileStat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    crate::syscall!(fstat(fd.as_raw_fd(), st.as_mut_ptr()))?;
    // SAFETY: fstat succeeded, so the kernel filled in the whole struct.
    let st = unsafe { st.assume_init() };
    Ok(FileStat::from_raw(&st))
}

/// Clears `O_NONBLOCK` on `fd` (used after opening with `O_NONBLOCK` so a FIFO can't block
/// the open, once the fd is known to be a regular file).
///
/// # Errors
/// When `fcntl` fails.
pub fn clear_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    let flags = crate::syscall!(fcntl(raw, libc::F_GETFL))?;
    if flags & libc::O_NONBLOCK != 0 {
        crate::syscall!(fcntl(raw, libc::F_SETFL, flags & !libc::O_NONBLOCK))?;
    }
    Ok(())
}

/// Fills `buf` with random bytes from `getrandom(2)`.
///
/// # Errors
/// When the kernel refuses (it never returns short reads for small buffers).
pub fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is a valid writable buffer of `rest.len()` bytes for the call.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(err);
        }
        filled += usize::try_from(n).unwrap_or(0);
    }
    Ok(())
}

/// Reads every entry of the directory open as `dir` (an fd opened for reading with
/// `O_DIRECTORY`, not `O_PATH`) with `getdents64(2)`, calling `f(name, d_type)` for each
/// entry other than `.` and `..`. `d_type` is one of `libc::DT_*` and may be
/// `DT_UNKNOWN` on file systems that do not fill it in.
///
/// The fd's position is reset to the start first, so the same fd can be read again.
/// `f` returns `Ok(true)` to continue, `Ok(false)` to stop early, or an error that is
/// passed back to the caller.
///
/// # Errors
/// `ENOTDIR`, `EBADF` (e.g. an `O_PATH` fd), or the error `f` returned.
pub fn read_dir(
    dir: BorrowedFd<'_>,
    mut f: impl FnMut(&[u8], u8) -> io::Result<bool>,
) -> io::Result<()> {
    let raw = dir.as_raw_fd();
    crate::syscall!(lseek(raw, 0, libc::SEEK_SET))?;
    let mut buf = vec![0u8; DIRENT_BUF];
    loop {
        // SAFETY: `buf` is a valid writable buffer of `buf.len()` bytes for the call.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                raw,
                buf.as_mut_ptr(),
                buf.len() as libc::c_uint,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(err);
        }
        let n = usize::try_from(n).unwrap_or(0).min(buf.len());
        if n == 0 {
            return Ok(());
        }
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        let mut pos = 0;
        while pos + 19 <= n {
            let reclen = usize::from(u16::from_ne_bytes([buf[pos + 16], buf[pos + 17]]));
            if reclen < 19 || pos + reclen > n {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "malformed getdents64 record",
                ));
            }
            let d_type = buf[pos + 18];
            let raw_name = &buf[pos + 19..pos + reclen];
            let len = raw_name
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(raw_name.len());
            let name = &raw_name[..len];
            pos += reclen;
            if name == b"." || name == b".." || name.is_empty() {
                continue;
            }
            if !f(name, d_type)? {
                return Ok(());
            }
        }
    }
}

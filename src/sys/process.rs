//! What `isobox-init` (a long-lived sandbox's pid 1) needs from the kernel: its control
//! socket (fd 0), reaping every child, terminals, and signalling process groups.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Takes fd 0 as this process's own socket (the init's control channel: the daemon
/// donates one end of a socket pair as the sandbox's stdin).
///
/// # Errors
/// `NotConnected` when fd 0 is not a socket.
pub fn take_stdin_socket() -> io::Result<std::os::unix::net::UnixStream> {
    let mut ty: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: fd 0 is a plain int; `ty` and `len` are valid for writes of their size.
    let r = unsafe {
        libc::getsockopt(
            0,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotConnected,
            "fd 0 is not the control socket",
        ));
    }
    // SAFETY: fd 0 is open (getsockopt succeeded on it) and nothing else in this process
    // uses it: the init never reads stdin otherwise, and takes it once, at start.
    Ok(unsafe { std::os::unix::net::UnixStream::from_raw_fd(0) })
}

/// Makes this process the reaper of its descendants' orphans (a sandbox's init is pid
/// 1 and reaps them anyway; on a host, where the tests run it, they come back to it too).
///
/// # Errors
/// What `prctl` said.
pub fn become_subreaper() -> io::Result<()> {
    crate::syscall!(prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)).map(drop)
}

/// How a reaped child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// Its pid.
    pub pid: i32,
    /// The exit code, or 128 + the signal.
    pub code: i32,
    /// The signal that ended it.
    pub signal: Option<i32>,
}

/// Reaps one child that has ended, if any (never blocks). An init reaps every
/// process, its own children and the orphans it inherits.
pub fn reap_any() -> Option<Reaped> {
    let mut status: libc::c_int = 0;
    // SAFETY: `status` is valid for writes; WNOHANG makes this never block.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    if pid <= 0 {
        return None;
    }
    let (code, signal) = if libc::WIFEXITED(status) {
        (libc::WEXITSTATUS(status), None)
    } else if libc::WIFSIGNALED(status) {
        let s = libc::WTERMSIG(status);
        (128 + s, Some(s))
    } else {
        (128 + libc::SIGKILL, Some(libc::SIGKILL))
    };
    Some(Reaped { pid, code, signal })
}

/// Sends `signal` to every process of group `pgid` (a process started by the init
/// leads its own group). A group already gone is not an error.
///
/// # Errors
/// Any error other than `ESRCH`; `InvalidInput` for a group id under 2 (0 and 1 would
/// mean our own group and init's).
pub fn signal_group(pgid: i32, signal: i32) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    match crate::syscall!(kill(-pgid, signal)) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether any process is left in group `pgid` (signal 0 reaches it).
pub fn group_exists(pgid: i32) -> bool {
    pgid > 1 && crate::syscall!(kill(-pgid, 0)).is_ok()
}

/// (used, total) bytes of the filesystem holding `path`, as `statvfs` counts them.
///
/// # Errors
/// What `statvfs` said.
pub fn disk_usage(path: &str) -> io::Result<(u64, u64)> {
    let c =
        std::ffi::CString::new(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: zeroed is a valid statvfs (plain integers).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated string and `st` is valid for writes, for the call.
    crate::syscall!(statvfs(c.as_ptr(), &mut st))?;
    let frsize = st.f_frsize;
    let total = st.f_blocks.saturating_mul(frsize);
    let free = st.f_bfree.saturating_mul(frsize);
    Ok((total.saturating_sub(free), total))
}

/// Free bytes (as root may use them) of the filesystem holding the open file `fd`.
///
/// # Errors
/// What `fstatvfs` said.
pub fn free_bytes(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: zeroed is a valid statvfs (plain integers).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor and `st` is valid for writes, for the call.
    crate::syscall!(fstatvfs(fd.as_raw_fd(), &mut st))?;
    Ok(st.f_bfree.saturating_mul(st.f_frsize))
}

/// A new terminal of `cols` x `rows`: (controller, the side a program gets).
///
/// # Errors
/// When `openpty` fails (no `/dev/ptmx`).
pub fn open_pty(cols: u16, rows: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut controller: libc::c_int = -1;
    let mut device: libc::c_int = -1;
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: the two ints are valid for writes; name and termios are null (allowed),
    // `ws` is a valid winsize for the call.
    let r = unsafe {
        libc::openpty(
            &mut controller,
            &mut device,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openpty succeeded: both fds are new and ours alone.
    let (c, d) = unsafe {
        (
            OwnedFd::from_raw_fd(controller),
            OwnedFd::from_raw_fd(device),
        )
    };
    // Neither may leak into a program the init starts later (the device reaches its
    // own program as stdin, stdout and stderr, which are dups).
    for fd in [&c, &d] {
        crate::syscall!(fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC))?;
    }
    Ok((c, d))
}

/// Sets a terminal's size (the program gets SIGWINCH).
///
/// # Errors
/// What `ioctl(TIOCSWINSZ)` said.
pub fn set_pty_size(controller: BorrowedFd<'_>, cols: u16, rows: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    crate::syscall!(ioctl(controller.as_raw_fd(), libc::TIOCSWINSZ, &ws)).map(drop)
}

/// Makes the calling thread, and it alone, act as `uid` (and group `uid`, with no
/// supplementary groups) for good: the raw system calls change one thread's
/// credentials, where libc's wrappers change every thread's. For a thread that does
/// file operations on a user's behalf while the rest of the process stays root.
///
/// # Errors
/// `setgroups`, `setresgid` or `setresuid` failures (`EPERM` without the capabilities).
pub fn become_user_on_this_thread(uid: u32) -> io::Result<()> {
    let gid: libc::gid_t = uid;
    // SAFETY: raw system calls with plain integer arguments and one valid gid pointer.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 1usize, &gid as *const libc::gid_t) != 0
            || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
            || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The characters that make the terminal behind `controller` signal its foreground
/// process group (`VINTR` → `SIGINT`, `VQUIT` → `SIGQUIT`, `VSUSP` → `SIGTSTP`), as its
/// termios set them; none when `ISIG` is off (a program in raw mode turned it off) or
/// a character is disabled.
///
/// # Errors
/// `tcgetattr` failures.
pub fn pty_signal_chars(controller: BorrowedFd<'_>) -> io::Result<Vec<(u8, i32)>> {
    // SAFETY: termios is plain data; all zeroes is a valid value to be overwritten.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    crate::syscall!(tcgetattr(controller.as_raw_fd(), &mut t))?;
    if t.c_lflag & libc::ISIG == 0 {
        return Ok(Vec::new());
    }
    Ok([
        (libc::VINTR, libc::SIGINT),
        (libc::VQUIT, libc::SIGQUIT),
        (libc::VSUSP, libc::SIGTSTP),
    ]
    .into_iter()
    .map(|(i, sig)| (t.c_cc[i], sig))
    .filter(|&(c, _)| c != 0)
    .collect())
}

/// The foreground process group of the terminal behind `controller`.
///
/// # Errors
/// `tcgetpgrp` failures (no controlling process yet).
pub fn pty_foreground(controller: BorrowedFd<'_>) -> io::Result<i32> {
    crate::syscall!(tcgetpgrp(controller.as_raw_fd()))
}

/// Makes `cmd`'s child lead a new session (and so a new process group) whose
/// controlling terminal is its stdin: the caller gives it a terminal's device as
/// stdin, stdout and stderr.
pub fn spawn_with_terminal(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec, after stdio is in place, and only
    // makes async-signal-safe system calls (setsid, ioctl); it allocates nothing and
    // takes no lock.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

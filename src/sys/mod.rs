//! All raw libc calls live here, behind safe functions returning `io::Result`.
//!
//! Nothing outside `sys/` calls `libc` directly in an `unsafe` block.

pub mod alloc;
pub mod crash;
pub mod fsat;
pub mod inotify;
pub mod jail;
pub mod loopdev;
pub mod mountinfo;
pub mod netlink;
pub mod process;
pub mod seccomp;

/// The overflow uid and gid ("nobody"): every sandboxed program runs as it, so it
/// also owns every workspace and volume the programs write.
pub const NOBODY: u32 = 65534;

/// The uid and gid of eryx environment builds (`wasm::build`): not [`WASM_WORKER`]'s,
/// so a WebAssembly worker can never write into a build going on. Debian reserves
/// 65000–65533 and allocates none of them to users or packages.
pub const BUILDER: u32 = 65533;

/// The uid and gid of the WebAssembly workers (`wasm`), which run untrusted guest code
/// on the host: not [`NOBODY`], whose host processes are gVisor's own on a root image
/// (runsc without directfs runs its sandbox process and stubs as nobody), so a worker
/// can reach none of their `/proc` (a sandbox's memory and descriptors), nor they its.
pub const WASM_WORKER: u32 = 65532;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Calls a libc function and turns `-1` into `io::Error::last_os_error()`.
#[macro_export]
macro_rules! syscall {
    ($fn: ident ( $($arg: expr),* $(,)* ) ) => {{
        #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
        // SAFETY: each call site passes plain values or pointers valid for the call.
        let res = unsafe { libc::$fn($($arg, )*) };
        if res == -1 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(res)
        }
    }};
}

/// Opens a pidfd for `pid` (Linux 5.3+). The fd becomes readable when the process exits.
///
/// # Errors
/// Fails when the process is gone or the kernel lacks `pidfd_open`.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: pidfd_open takes a pid and flags, touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends `signal` to the process `pid`. A process that is already gone is not an error.
///
/// # Errors
/// Any error other than `ESRCH`.
pub fn kill(pid: i32, signal: i32) -> io::Result<()> {
    if pid <= 0 {
        // kill(0 or negative) would signal process groups, never what we mean.
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    match syscall!(kill(pid, signal)) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sends `signal` to every process of group `pgid` (the tests' fake backend: a run's
/// shell and what it started; the WebAssembly worker). A group that is already gone is
/// not an error.
///
/// # Errors
/// Any error other than `ESRCH`; `InvalidInput` for a group id under 2 (0 and 1 would
/// mean our own group and init's).
pub fn kill_group(pgid: i32, signal: i32) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    match syscall!(kill(-pgid, signal)) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Puts an fd into non-blocking mode.
///
/// # Errors
/// When `fcntl` fails.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    let flags = syscall!(fcntl(raw, libc::F_GETFL))?;
    syscall!(fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK))?;
    Ok(())
}

/// The destination a connection had before netfilter redirected it to us
/// (`SO_ORIGINAL_DST`; IPv4 only).
///
/// # Errors
/// When the socket has no such destination (it was not redirected) or is not IPv4.
pub fn original_dst(fd: BorrowedFd<'_>) -> io::Result<std::net::SocketAddrV4> {
    /// `SO_ORIGINAL_DST` (linux/netfilter_ipv4.h).
    const SO_ORIGINAL_DST: libc::c_int = 80;
    // SAFETY: an all-zero sockaddr_in is a valid value.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    syscall!(getsockopt(
        fd.as_raw_fd(),
        libc::SOL_IP,
        SO_ORIGINAL_DST,
        std::ptr::addr_of_mut!(sa).cast(),
        &mut len
    ))?;
    if sa.sin_family != libc::AF_INET as libc::sa_family_t {
        return Err(io::Error::other("not an IPv4 destination"));
    }
    Ok(std::net::SocketAddrV4::new(
        u32::from_be(sa.sin_addr.s_addr).into(),
        u16::from_be(sa.sin_port),
    ))
}

/// Takes an exclusive `flock` on `file` without waiting. `Ok(false)`: another open
/// file description holds it (a lock dies with its holder's last descriptor, so a
/// crashed holder never leaves it behind).
///
/// # Errors
/// Any failure other than the lock being held.
pub fn try_lock_exclusive(file: &std::fs::File) -> io::Result<bool> {
    match syscall!(flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB)) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes a FIFO at `path` (mode `mode`, less the umask) and opens its reading end,
/// without blocking (no writer is needed) and close-on-exec. While no writer has it
/// open a read gives 0 (EOF); epoll reports it only once a writer wrote or came and went.
///
/// # Errors
/// `mkfifo`'s or `open`'s.
pub fn fifo_reader(path: &std::path::Path, mode: u32) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    syscall!(mkfifo(c.as_ptr(), mode as libc::mode_t))?;
    let fd = syscall!(open(
        c.as_ptr(),
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW
    ))?;
    // SAFETY: `open` just returned this fd; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The host's `CLOCK_MONOTONIC` now, in nanoseconds (the clock `Instant` reads).
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The CPU time the calling thread has used, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let _ = unsafe { libc::clock_gettime(clock, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Shuts the writing half of a socket (the peer reads EOF while we may still read); on
/// anything but a socket it does nothing.
pub fn shutdown_write(fd: BorrowedFd<'_>) {
    // SAFETY: plain syscall on a borrowed fd; ENOTSOCK on a pipe is the expected no-op.
    let _ = unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) };
}

/// Lowers the calling thread's CPU priority (used by background refill work).
///
/// # Errors
/// When `setpriority` fails.
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let tid = libc::id_t::try_from(tid).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    syscall!(setpriority(libc::PRIO_PROCESS, tid, nice))?;
    Ok(())
}

/// The effective user id of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The number of open fds of this process (for health figures and leak tests).
pub fn open_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Resident set size of this process in bytes, from `/proc/self/statm`.
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

/// Total physical memory of the host in bytes.
pub fn host_memory_bytes() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Writes "0" to an already-open `cgroup.procs` fd, moving the calling process into that cgroup.
///
/// Async-signal-safe: meant for `pre_exec`, so it allocates nothing and takes no lock.
///
/// # Errors
/// When the write fails.
pub fn join_cgroup_in_child(procs_fd: i32) -> io::Result<()> {
    let buf = b"0";
    // SAFETY: buf is a valid 1-byte buffer for the duration of the call.
    syscall!(write(procs_fd, buf.as_ptr().cast(), 1))?;
    Ok(())
}

/// Sets the calling process to be killed when its parent thread exits.
///
/// Async-signal-safe: meant for `pre_exec`.
///
/// # Errors
/// When `prctl` fails.
pub fn die_with_parent() -> io::Result<()> {
    syscall!(prctl(
        libc::PR_SET_PDEATHSIG,
        libc::SIGKILL as libc::c_ulong,
        0,
        0,
        0
    ))?;
    Ok(())
}

/// Makes the calling process a new process-group leader (async-signal-safe).
///
/// # Errors
/// When `setpgid` fails.
pub fn new_process_group() -> io::Result<()> {
    syscall!(setpgid(0, 0))?;
    Ok(())
}

/// [`die_with_parent_on_spawn`] for a `runsc` that sets up gVisor's netstack from a
/// network namespace: the child also gets the mount namespace of
/// [`netlink::hide_proc_sys_net_in_child`].
pub fn die_with_parent_on_spawn_netstack(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure only calls async-signal-safe functions (prctl, setpgid,
    // unshare, mount on static strings); it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(|| {
            die_with_parent()?;
            new_process_group()?;
            netlink::hide_proc_sys_net_in_child()
        });
    }
}

/// Caps glibc's malloc arenas (by default 8 per core, each keeping freed memory). Call
/// before other threads exist.
pub fn limit_malloc_arenas(n: i32) {
    // SAFETY: mallopt takes two integers and touches no memory of ours.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, n);
    }
}

/// Ends the process at once with `code`, after flushing stdout, without running
/// `exit`'s handlers. For the very end of `main`, once everything the daemon owns has
/// been dropped and its writes are durable: threads that were never joined (a loop
/// blocked on a model's answer, a finished transfer's) may still be unwinding then,
/// and `exit` would tear the process's globals down under them.
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: _exit takes an integer and does not return.
    unsafe { libc::_exit(code) }
}

/// Gives memory glibc holds free (in every arena) back to the kernel.
pub fn malloc_trim() {
    // SAFETY: malloc_trim takes an integer; it only releases free heap pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes a command's child die with the spawning thread and lead its own process group.
pub fn die_with_parent_on_spawn(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure only calls async-signal-safe functions (prctl, setpgid); it
    // allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(|| {
            die_with_parent()?;
            new_process_group()
        });
    }
}

/// A sealed in-memory file holding `bytes` (`memfd_create`, close-on-exec): it can
/// never be written, grown or shrunk again, by anyone.
///
/// # Errors
/// `memfd_create`'s, the write's, or `fcntl`'s.
pub fn sealed_memfd(name: &std::ffi::CStr, bytes: &[u8]) -> io::Result<OwnedFd> {
    let fd = memfd(name, bytes, libc::MFD_ALLOW_SEALING)?;
    syscall!(fcntl(
        fd.as_raw_fd(),
        libc::F_ADD_SEALS,
        libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL
    ))?;
    Ok(fd)
}

/// An in-memory file holding `bytes` (`memfd_create`, close-on-exec), its offset back
/// at 0, so whoever is given it reads `bytes` from the start.
///
/// # Errors
/// `memfd_create`'s, the write's or the seek's.
pub fn memfd_with(name: &std::ffi::CStr, bytes: &[u8]) -> io::Result<OwnedFd> {
    memfd(name, bytes, 0)
}

fn memfd(name: &std::ffi::CStr, bytes: &[u8], flags: libc::c_uint) -> io::Result<OwnedFd> {
    use std::io::{Seek, Write};
    let raw = syscall!(memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | flags))?;
    // SAFETY: memfd_create just returned this descriptor, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes)?;
    f.rewind()?;
    Ok(OwnedFd::from(f))
}

/// A new open file description of `fd`'s file, read-only and close-on-exec (through
/// `/proc/self/fd`): its own offset, shared with no other holder.
///
/// # Errors
/// The open's.
pub fn reopen_read_only(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let f = std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    Ok(OwnedFd::from(f))
}

/// Lets the child of `cmd` inherit `fds` (close-on-exec cleared in the child only, so
/// no other thread's child gets them), at the same numbers. They must stay open until
/// `cmd` is spawned.
pub fn inherit_on_spawn(cmd: &mut std::process::Command, fds: &[BorrowedFd<'_>]) {
    use std::os::unix::process::CommandExt;
    let fds: Vec<i32> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    // SAFETY: the closure only calls fcntl (async-signal-safe) on integers it owns; it
    // allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            for fd in &fds {
                syscall!(fcntl(*fd, libc::F_SETFD, 0))?;
            }
            Ok(())
        });
    }
}

/// Jails a worker started by `cmd` (the WebAssembly engine's): in the child, before it
/// runs, it joins the cgroups whose `cgroup.procs` are `procs`, dies with the spawning
/// thread, leads its own process group, gets network, IPC and UTS namespaces of its
/// own (no network at all: a new network namespace has only a down loopback), sees
/// only `view` of the host's files (a mount namespace of its own: [`jail::View`]),
/// gets `sock` as fd 3, drops to `uid`/`gid` with no supplementary groups, may gain no
/// privileges, and dumps no core.
///
/// The fds must stay open until `cmd` is spawned.
pub fn jail_on_spawn(
    cmd: &mut std::process::Command,
    procs: &[OwnedFd],
    sock: &OwnedFd,
    id: u32,
    view: jail::View,
) {
    use std::os::unix::process::CommandExt;
    let procs: Vec<i32> = procs.iter().map(AsRawFd::as_raw_fd).collect();
    let sock = sock.as_raw_fd();
    // SAFETY: the closure only calls async-signal-safe functions (write, prctl,
    // setpgid, unshare, mount, mkdir, open, close, symlink, pivot_root, chdir, umount2,
    // rmdir, dup2, fcntl, setgroups, setgid, setuid, setrlimit) on values it owns; it
    // allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            for fd in &procs {
                join_cgroup_in_child(*fd)?;
            }
            die_with_parent()?;
            new_process_group()?;
            syscall!(unshare(
                libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS
            ))?;
            view.enter()?;
            if sock == 3 {
                syscall!(fcntl(3, libc::F_SETFD, 0))?;
            } else {
                syscall!(dup2(sock, 3))?;
            }
            let core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            syscall!(setrlimit(libc::RLIMIT_CORE, &core))?;
            syscall!(setgroups(0, std::ptr::null()))?;
            syscall!(setgid(id))?;
            syscall!(setuid(id))?;
            // The kernel clears the parent-death signal when credentials change:
            // set again, or a worker outlives a daemon killed with SIGKILL.
            die_with_parent()?;
            syscall!(prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            Ok(())
        });
    }
}

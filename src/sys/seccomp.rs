//! A seccomp-BPF allowlist for one thread, in the manner of Firecracker's seccompiler:
//! the list lives in `seccomp/<arch>.json`, one entry per syscall with the reason it is
//! needed, and is compiled into a classic-BPF program at startup.
//!
//! The filter is installed without `SECCOMP_FILTER_FLAG_TSYNC`, so it binds only the
//! calling thread (and threads it would create). A syscall off the list fails with
//! `EPERM` rather than killing the process: the caller sees an error and logs it.

use std::io;

/// The reactor's allowlist, built into the binary.
pub const REACTOR_ALLOWLIST: &str = include_str!("../../seccomp/x86_64.json");

#[derive(serde::Deserialize)]
struct Allowlist {
    allow: Vec<Entry>,
}

#[derive(serde::Deserialize)]
struct Entry {
    name: String,
}

/// The syscall number of `name` on this architecture.
pub fn syscall_nr(name: &str) -> Option<i64> {
    Some(match name {
        "epoll_wait" => libc::SYS_epoll_wait,
        "epoll_pwait" => libc::SYS_epoll_pwait,
        "epoll_ctl" => libc::SYS_epoll_ctl,
        "accept4" => libc::SYS_accept4,
        "read" => libc::SYS_read,
        "readv" => libc::SYS_readv,
        "write" => libc::SYS_write,
        "writev" => libc::SYS_writev,
        "recvfrom" => libc::SYS_recvfrom,
        "sendto" => libc::SYS_sendto,
        "shutdown" => libc::SYS_shutdown,
        "setsockopt" => libc::SYS_setsockopt,
        "getsockopt" => libc::SYS_getsockopt,
        "getsockname" => libc::SYS_getsockname,
        "getpeername" => libc::SYS_getpeername,
        "close" => libc::SYS_close,
        "fcntl" => libc::SYS_fcntl,
        "ioctl" => libc::SYS_ioctl,
        "openat" => libc::SYS_openat,
        "newfstatat" => libc::SYS_newfstatat,
        "statx" => libc::SYS_statx,
        "fstat" => libc::SYS_fstat,
        "lseek" => libc::SYS_lseek,
        "getdents64" => libc::SYS_getdents64,
        "mmap" => libc::SYS_mmap,
        "munmap" => libc::SYS_munmap,
        "mremap" => libc::SYS_mremap,
        "madvise" => libc::SYS_madvise,
        "mprotect" => libc::SYS_mprotect,
        "brk" => libc::SYS_brk,
        "futex" => libc::SYS_futex,
        "sched_yield" => libc::SYS_sched_yield,
        "clock_gettime" => libc::SYS_clock_gettime,
        "getrandom" => libc::SYS_getrandom,
        "getpid" => libc::SYS_getpid,
        "gettid" => libc::SYS_gettid,
        "rt_sigreturn" => libc::SYS_rt_sigreturn,
        "rt_sigprocmask" => libc::SYS_rt_sigprocmask,
        "sigaltstack" => libc::SYS_sigaltstack,
        "exit" => libc::SYS_exit,
        "exit_group" => libc::SYS_exit_group,
        "restart_syscall" => libc::SYS_restart_syscall,
        _ => return None,
    })
}

/// Parses an allowlist document into syscall numbers.
///
/// # Errors
/// A message naming an unknown syscall or the JSON error.
pub fn parse_allowlist(json: &str) -> Result<Vec<i64>, String> {
    let list: Allowlist =
        serde_json::from_str(json).map_err(|e| format!("seccomp allowlist: {e}"))?;
    list.allow
        .iter()
        .map(|e| {
            syscall_nr(&e.name)
                .ok_or_else(|| format!("seccomp allowlist: unknown syscall {}", e.name))
        })
        .collect()
}

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Compiles the program: check the architecture, then allow each listed number.
pub fn compile(allowed: &[i64]) -> Vec<libc::sock_filter> {
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let jeq = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    let deny = SECCOMP_RET_ERRNO | (libc::EPERM as u32);
    let mut p = vec![
        // struct seccomp_data { int nr; __u32 arch; ... }: arch at offset 4.
        stmt(ld, 4),
        jump(jeq, AUDIT_ARCH_X86_64, 1, 0),
        stmt(ret, deny),
        stmt(ld, 0),
    ];
    let n = allowed.len();
    for (i, nr) in allowed.iter().enumerate() {
        // Jump over the remaining comparisons and the deny to the allow at the end.
        let to_allow = u8::try_from(n - i).unwrap_or(u8::MAX);
        p.push(jump(jeq, *nr as u32, to_allow, 0));
    }
    p.push(stmt(ret, deny));
    p.push(stmt(ret, SECCOMP_RET_ALLOW));
    p
}

/// Installs `allowed` as the calling thread's filter (sets no_new_privs first).
///
/// # Errors
/// When the kernel refuses the program.
pub fn install_thread_filter(allowed: &[i64]) -> io::Result<()> {
    if allowed.len() > 250 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "allowlist too long for 8-bit jumps",
        ));
    }
    let prog = compile(allowed);
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).unwrap_or(u16::MAX),
        filter: prog.as_ptr().cast_mut(),
    };
    crate::syscall!(prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    // SAFETY: fprog points at `prog`, which outlives the call; the kernel copies it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &fprog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_reactor_allowlist_parses() {
        let nrs = parse_allowlist(REACTOR_ALLOWLIST).unwrap();
        assert!(nrs.contains(&libc::SYS_epoll_wait));
        assert!(!nrs.contains(&libc::SYS_execve), "the reactor never execs");
        assert!(!nrs.contains(&libc::SYS_clone), "nor forks");
    }

    #[test]
    fn test_forbidden_syscall_refused_on_filtered_thread_only() {
        let h = std::thread::spawn(|| {
            let nrs = parse_allowlist(REACTOR_ALLOWLIST).unwrap();
            install_thread_filter(&nrs).unwrap();
            // SAFETY: getpid/getppid take no arguments.
            let pid = unsafe { libc::syscall(libc::SYS_getpid) };
            // SAFETY: as above.
            let ppid = unsafe { libc::syscall(libc::SYS_getppid) };
            let err = io::Error::last_os_error().raw_os_error();
            (pid, ppid, err)
        });
        let (pid, ppid, err) = h.join().unwrap();
        assert!(pid > 0, "an allowed syscall works");
        assert_eq!(
            (ppid, err),
            (-1, Some(libc::EPERM)),
            "a forbidden one fails with EPERM"
        );
        // SAFETY: getppid takes no arguments; this thread has no filter.
        let ppid_here = unsafe { libc::syscall(libc::SYS_getppid) };
        assert!(ppid_here > 0, "other threads are not filtered");
    }
}

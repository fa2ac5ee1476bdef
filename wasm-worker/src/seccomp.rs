//! The worker's own seccomp filter, installed once the engine is loaded and before the
//! first run (for every thread, `SECCOMP_FILTER_FLAG_TSYNC`): a denylist of what an
//! engine escape would reach for and the engine never needs. No sockets (fd 3, the
//! daemon's, is already open), no exec, no new processes (threads only: `clone3` is
//! answered `ENOSYS` so glibc falls back to `clone`, whose flags a filter can read, and
//! a `clone` without `CLONE_THREAD` fails), no ptrace or cross-process memory, no
//! signal to another process (`tgkill` to its own threads only), no namespaces, mounts
//! (old API or new), modules, keys, BPF, perf, io_uring or userfaultfd, no identity
//! changes, no x32 call. Everything else wasmtime and tokio use (mmap, mprotect,
//! memfd, signal handlers, futexes, epoll) stays allowed. A denied call fails with
//! `EPERM`; another architecture's call kills the process.

/// What is denied (x86_64 numbers).
const DENIED: &[libc::c_long] = &[
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_setns,
    libc::SYS_unshare,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_mknod,
    libc::SYS_mknodat,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_modify_ldt,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_fanotify_init,
    libc::SYS_personality,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setgroups,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_capset,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    // Signals to other processes (workers of other jobs run as the same user);
    // `tgkill` is allowed to this process only (`abort` raises with it).
    libc::SYS_kill,
    libc::SYS_tkill,
    libc::SYS_pidfd_send_signal,
    libc::SYS_rt_sigqueueinfo,
    libc::SYS_rt_tgsigqueueinfo,
    // The new mount API.
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
];

/// x32 calls are x86_64 calls with this bit set in their number: a denylist of x86_64
/// numbers would not see them, so every one is refused.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const FLAG_TSYNC: libc::c_ulong = 1;

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The program (see the module's comment).
fn program() -> Vec<libc::sock_filter> {
    let ld = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let jset = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
    let jge = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
    // This process: `tgkill` may signal only its own threads.
    let pid = std::process::id();
    let ret = libc::BPF_RET | libc::BPF_K;
    let eperm = RET_ERRNO | libc::EPERM as u32;
    let n = DENIED.len();
    let mut p = vec![
        // struct seccomp_data { int nr; __u32 arch; __u64 ip; __u64 args[6]; }
        stmt(ld, 4),
        jump(jeq, AUDIT_ARCH_X86_64, 1, 0),
        stmt(ret, RET_KILL_PROCESS),
        stmt(ld, 0),
        jump(jge, X32_SYSCALL_BIT, 0, 1),
        stmt(ret, eperm),
        jump(jeq, libc::SYS_clone3 as u32, 0, 1),
        stmt(ret, RET_ERRNO | libc::ENOSYS as u32),
        // clone: allowed only with CLONE_THREAD in its flags (args[0]'s low word).
        jump(jeq, libc::SYS_clone as u32, 0, 4),
        stmt(ld, 16),
        jump(jset, libc::CLONE_THREAD as u32, 0, 1),
        stmt(ret, RET_ALLOW),
        stmt(ret, eperm),
        // tgkill: allowed only with this process as its tgid (args[0]'s low word).
        stmt(ld, 0),
        jump(jeq, libc::SYS_tgkill as u32, 0, 4),
        stmt(ld, 16),
        jump(jeq, pid, 0, 1),
        stmt(ret, RET_ALLOW),
        stmt(ret, eperm),
        stmt(ld, 0),
    ];
    for (i, nr) in DENIED.iter().enumerate() {
        // To the EPERM after the final allow.
        let to_deny = u8::try_from(n - i).unwrap_or(u8::MAX);
        p.push(jump(jeq, *nr as u32, to_deny, 0));
    }
    p.push(stmt(ret, RET_ALLOW));
    p.push(stmt(ret, eperm));
    p
}

/// Makes the process not dumpable: its `/proc/PID` entries become root's, so no other
/// process of its uid (another worker, serving other tenants) can open its memory or
/// descriptors, whatever the host's ptrace policy; and it leaves no core. (Every exec
/// makes a process dumpable again: set here, by the process itself.)
pub fn not_dumpable() -> Result<(), String> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(format!("not dumpable: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Installs the filter on every thread of the process.
pub fn install() -> Result<(), String> {
    assert!(DENIED.len() < 250, "8-bit jumps");
    let prog = program();
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).unwrap_or(u16::MAX),
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fprog points at `prog`, which outlives the call; the kernel copies it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            FLAG_TSYNC,
            &fprog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(format!(
            "installing the seccomp filter: {} (rc {rc})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// `isobox-wasm selftest`: installs the filter and tries what it must refuse and what
/// it must let through; prints one `name=result` line each (`EPERM`, `ENOSYS`, `ok`).
pub fn selftest() -> Result<(), String> {
    install()?;
    // Each call's errno is read right after it.
    let outcome = |rc: libc::c_long| {
        if rc >= 0 {
            "ok".to_string()
        } else {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EPERM) => "EPERM".into(),
                Some(libc::ENOSYS) => "ENOSYS".into(),
                Some(e) => format!("errno {e}"),
                None => "?".into(),
            }
        }
    };
    // SAFETY (every call below): plain integers or a valid NUL-terminated path and
    // null vectors; nothing that succeeds leaves anything the exit does not clean up.
    let tries = [
        (
            "socket_inet",
            outcome(unsafe {
                libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0)
            }),
        ),
        (
            "socket_unix",
            outcome(unsafe {
                libc::syscall(libc::SYS_socket, libc::AF_UNIX, libc::SOCK_STREAM, 0)
            }),
        ),
        ("fork", outcome(unsafe { libc::syscall(libc::SYS_fork) })),
        (
            "execve",
            outcome(unsafe {
                libc::syscall(
                    libc::SYS_execve,
                    c"/bin/true".as_ptr(),
                    std::ptr::null::<*const libc::c_char>(),
                    std::ptr::null::<*const libc::c_char>(),
                )
            }),
        ),
        (
            "unshare",
            outcome(unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNET) }),
        ),
        (
            "ptrace",
            outcome(unsafe { libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0) }),
        ),
        (
            "clone3",
            outcome(unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0) }),
        ),
        // Signal 0 only asks whether the target exists.
        (
            "kill_init",
            outcome(unsafe { libc::syscall(libc::SYS_kill, 1, 0) }),
        ),
        (
            "tgkill_init",
            outcome(unsafe { libc::syscall(libc::SYS_tgkill, 1, 1, 0) }),
        ),
        (
            "tgkill_self",
            outcome(unsafe {
                libc::syscall(
                    libc::SYS_tgkill,
                    libc::getpid(),
                    libc::syscall(libc::SYS_gettid),
                    0,
                )
            }),
        ),
        (
            "x32_getpid",
            outcome(unsafe {
                libc::syscall(libc::SYS_getpid | libc::c_long::from(X32_SYSCALL_BIT))
            }),
        ),
        (
            "fsopen",
            outcome(unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 0) }),
        ),
    ];
    for (name, result) in tries {
        println!("{name}={result}");
    }
    let thread = std::thread::spawn(|| 7)
        .join()
        .map(|v| v == 7)
        .unwrap_or(false);
    println!("thread={}", if thread { "ok" } else { "failed" });
    let mem = vec![1u8; 64 << 20];
    println!(
        "alloc={}",
        if mem[mem.len() - 1] == 1 {
            "ok"
        } else {
            "failed"
        }
    );
    Ok(())
}

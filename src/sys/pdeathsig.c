/*
 * isobox-pdeathsig PPID PROGRAM ARG...: the daemon's way to start `runsc run` without
 * fork(). A pre_exec hook (PR_SET_PDEATHSIG, setpgid) makes Rust's Command fork the
 * whole daemon, and copying then discarding its page tables cost ~4 ms of CPU per run;
 * without a hook Command uses posix_spawn (vfork-like, and the process group through
 * posix_spawnattr), and this program does the one thing posix_spawn cannot: it asks to
 * be SIGKILLed when the thread that spawned it ends (so `runsc run`, and with it the
 * attached sandbox, dies with a crashed daemon), makes sure that thread's process,
 * PPID, is still its parent (else it was orphaned before asking, and exits 125), then
 * execs PROGRAM with ARG... and the environment as given (127 when that fails, with a
 * line on stderr).
 *
 * No libc: static, x86-64 Linux syscalls; build.rs compiles it, isoboxd embeds it
 * (`sys::PDEATHSIG_HELPER`) and writes it under /run/isobox/INSTANCE at startup. Other
 * architectures keep the pre_exec hook.
 */
#if !defined(__x86_64__) || !defined(__linux__)
#error "isobox-pdeathsig is written for Linux on x86-64"
#endif

static long sys5(long n, long a, long b, long c, long d, long e)
{
    long r;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return r;
}

enum { SYS_write = 1, SYS_execve = 59, SYS_exit = 60, SYS_getppid = 110, SYS_prctl = 157 };
enum { PR_SET_PDEATHSIG = 1, SIGKILL = 9 };

__attribute__((noreturn)) static void quit(int code)
{
    for (;;)
        sys5(SYS_exit, code, 0, 0, 0, 0);
}

static void say(const char *s)
{
    long n = 0;
    while (s[n])
        n++;
    while (n > 0) {
        long w = sys5(SYS_write, 2, (long)s, n, 0, 0);
        if (w <= 0)
            return;
        s += w;
        n -= w;
    }
}

__attribute__((noreturn, used)) void isobox_pdeathsig(long *sp)
{
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    char **envp = argv + argc + 1;
    if (argc < 3) {
        say("usage: isobox-pdeathsig PPID PROGRAM [ARG...]\n");
        quit(125);
    }
    long ppid = 0;
    for (const char *p = argv[1]; *p; p++) {
        if (*p < '0' || *p > '9' || ppid > 100000000L) {
            say("isobox-pdeathsig: PPID is not a process id\n");
            quit(125);
        }
        ppid = ppid * 10 + (*p - '0');
    }
    if (sys5(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) {
        say("isobox-pdeathsig: prctl(PR_SET_PDEATHSIG) failed\n");
        quit(125);
    }
    /* Orphaned before the prctl: the signal will never come, so do not run at all. */
    if (sys5(SYS_getppid, 0, 0, 0, 0, 0) != ppid)
        quit(125);
    sys5(SYS_execve, (long)argv[2], (long)(argv + 2), (long)envp, 0, 0);
    say("isobox-pdeathsig: cannot execute ");
    say(argv[2]);
    say("\n");
    quit(127);
}

/* The kernel starts us with argc, argv and envp on the stack. */
__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n"
        "  call isobox_pdeathsig\n");

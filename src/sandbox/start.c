/*
 * isobox-start: the first program of a cold run inside gVisor (`sandbox::start`) where
 * the start hook (`started.c`, run by runsc on the host) cannot be used: a hook that
 * failed its checks, or was given up. Writes the start frame to stderr, then execs argv[1..] with the environment it was
 * given. It stands where `/bin/sh -c 'printf FRAME >&2; exec "$@"'` stood: the same
 * frame, the same exec, without loading a dynamically linked shell first (about 10 ms
 * of CPU less per cold start on gVisor's ptrace platform; bench/README.md).
 *
 * No libc: static, position-dependent, raw Linux x86-64 syscalls. build.rs compiles it
 * with the C compiler the build already uses (LMDB's); isoboxd embeds the result and
 * copies it into such a run's root overlay at /opt/isobox/start. Other architectures
 * keep the shell.
 *
 * When the exec fails it says so on stderr (after the frame, so as the program's own
 * output, as the shell's "not found" was) and exits 127, as the shell did.
 */
#include "nolibc.h"

enum { SYS_write = 1, SYS_execve = 59, SYS_exit = 60 };

static void put(const char *s, long n)
{
    while (n > 0) {
        long w = sys3(SYS_write, 2, (long)s, n);
        if (w <= 0)
            return;
        s += w;
        n -= w;
    }
}

static long len(const char *s)
{
    long n = 0;
    while (s[n])
        n++;
    return n;
}

static const char frame[] = "\036ISOBOX-START\n";

__attribute__((noreturn, used)) void program_main(long *sp)
{
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    char **envp = argv + argc + 1;
    put(frame, sizeof frame - 1);
    if (argc >= 2) {
        long e = -sys3(SYS_execve, (long)argv[1], (long)(argv + 1), (long)envp);
        /* "isobox-start: exec PROGRAM: errno N" */
        char num[24];
        int i = sizeof num;
        num[--i] = '\n';
        do {
            num[--i] = (char)('0' + e % 10);
            e /= 10;
        } while (e > 0 && i > 0);
        put("isobox-start: exec ", 19);
        put(argv[1], len(argv[1]));
        put(": errno ", 8);
        put(num + i, (long)sizeof num - i);
    }
    for (;;)
        sys3(SYS_exit, 127, 0, 0);
}

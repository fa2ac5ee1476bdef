/*
 * isobox-started: the poststart hook of a cold run on gVisor (`sandbox::start`).
 * `runsc run` executes it on the host once the sandbox's program has started (OCI
 * `hooks.poststart`), as `isobox-started FIFO`. It writes the host's CLOCK_MONOTONIC
 * time (8 bytes, little-endian nanoseconds) into FIFO, whose reading end isoboxd holds
 * open, and exits 0 (1 when it could not). That is the start signal: isoboxd tells "the
 * sandbox never started" from "the program ran" by it, and counts the program's time
 * from it. Nothing runs inside the sandbox for it (the frame program it replaces was
 * an exec inside gVisor: about 10 ms of CPU a cold start on the ptrace platform).
 *
 * The FIFO is opened without blocking (no reader: fail at once, ENXIO) and without
 * following a link; the write is one of 8 bytes, atomic on a pipe.
 *
 * No libc: static, position-dependent, raw Linux x86-64 syscalls, like isobox-start.
 * build.rs compiles it; isoboxd embeds it and writes it into its data directory.
 */
#include "nolibc.h"

enum {
    SYS_write = 1,
    SYS_open = 2,
    SYS_exit = 60,
    SYS_clock_gettime = 228,
    CLOCK_MONOTONIC = 1,
    O_WRONLY = 01,
    O_NONBLOCK = 04000,
    O_NOFOLLOW = 0400000,
    O_CLOEXEC = 02000000,
};

struct timespec64 {
    long sec;
    long nsec;
};

__attribute__((noreturn, used)) void program_main(long *sp)
{
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    long code = 1;
    if (argc >= 2) {
        long fd = sys3(SYS_open, (long)argv[1], O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
        struct timespec64 ts;
        if (fd >= 0 && sys3(SYS_clock_gettime, CLOCK_MONOTONIC, (long)&ts, 0) == 0) {
            unsigned long ns = (unsigned long)ts.sec * 1000000000UL + (unsigned long)ts.nsec;
            unsigned char b[8];
            for (int i = 0; i < 8; i++)
                b[i] = (unsigned char)(ns >> (8 * i));
            if (sys3(SYS_write, fd, (long)b, 8) == 8)
                code = 0;
        }
    }
    for (;;)
        sys3(SYS_exit, code, 0, 0);
}

/*
 * isobox-start: the first program of a cold run inside gVisor (`sandbox::start`), in
 * two forms.
 *
 * `isobox-start PROGRAM ARGS...` stands where the start hook (`started.c`, run by runsc
 * on the host) cannot be used: a hook that failed its checks, or was given up. Writes
 * the start frame to stderr, then execs PROGRAM with ARGS and the environment it was
 * given. It stands where `/bin/sh -c 'printf FRAME >&2; exec "$@"'` stood: the same
 * frame, the same exec, without loading a dynamically linked shell first (about 10 ms
 * of CPU less per cold start on gVisor's ptrace platform; bench/README.md). isoboxd
 * copies it into such a run's root overlay at /opt/isobox/start.
 *
 * `isobox-start --unpack UID PROGRAM ARGS...` is the first program of a run whose root
 * is its runtime's EROFS image (`sandbox::image`): runsc starts it from a host file
 * (`--exec-fd`), as root with only CAP_SETUID, CAP_SETGID and CAP_SETPCAP (and
 * CAP_SYS_ADMIN when the run has a network), its working
 * directory an empty tmpfs of gVisor's (mode 1777) and the program's files on fd 3
 * (`--pass-fd`) in isoboxd's workspace archive:
 *
 *     "ISOBOXW1", then entries until the end byte 0:
 *       'r' u16le SIZE DATA                a networked run's /etc/resolv.conf (first)
 *       'd' u16le LEN PATH                 a directory, mode 0755
 *       'f' u16le LEN PATH u64le SIZE DATA a file, mode 0644
 *
 * A networked run's resolvers come first: it writes them into a file of the working
 * directory, binds that over the image's /etc/resolv.conf, read-only, nosuid, nodev,
 * noexec (as the tree's bind from the host was), and unlinks the file (the mount keeps
 * it). Then, whatever came first, it keeps only CAP_SETUID, CAP_SETGID and
 * CAP_SETPCAP, in every set, before it reads anything of the program's.
 *
 * PATHs are relative, with no empty, `.` or `..` component (isoboxd made them so and
 * this checks again), every directory before what is in it. It writes them into the
 * working directory owned by root, as the host workspace has them (the program can add
 * files beside them, but not change, remove or rename them), closes fd 3, drops to
 * UID:UID with no supplementary group and every capability gone from all its sets
 * (the bounding set emptied first), and only then writes the frame and execs PROGRAM,
 * from a thread made after the drop (gVisor counts a task against RLIMIT_NPROC under
 * the uid it was made with, so the program, pid 1 after the exec, counts as the user's
 * as on a run that starts as it). Any failure before the frame says why on stderr and
 * exits 126: to isoboxd the sandbox never started.
 *
 * `isobox-start --boot UID PROGRAM ARGS...` is the same for a networked pooled sandbox
 * on an image, whose harness (PROGRAM) says itself when it is ready: everything as
 * above (its archive holds the resolvers and no file), but no frame.
 *
 * When the exec fails it says so on stderr (after the frame, so as the program's own
 * output, as the shell's "not found" was) and exits 127, as the shell did.
 *
 * No libc: static, position-dependent, raw Linux x86-64 syscalls. build.rs compiles it
 * with the C compiler the build already uses (LMDB's); isoboxd embeds the result.
 * Other architectures keep the shell, and have no image runs.
 */
#include "nolibc.h"

enum {
    SYS_read = 0,
    SYS_write = 1,
    SYS_open = 2,
    SYS_close = 3,
    SYS_execve = 59,
    SYS_exit = 60,
    SYS_mkdir = 83,
    SYS_umask = 95,
    SYS_setresuid = 117,
    SYS_setresgid = 119,
    SYS_getresuid = 118,
    SYS_getresgid = 120,
    SYS_setgroups = 116,
    SYS_prctl = 157,
    SYS_pause = 34,
    SYS_clone = 56,
    SYS_exit_group = 231,
    SYS_unlink = 87,
    SYS_capget = 125,
    SYS_capset = 126,
    SYS_mount = 165,
    MS_RDONLY = 1,
    MS_NOSUID = 2,
    MS_NODEV = 4,
    MS_NOEXEC = 8,
    MS_REMOUNT = 32,
    MS_BIND = 4096,
    CAP_SETGID = 6,
    CAP_SETUID = 7,
    CAP_SETPCAP = 8,
    CAP_SYS_ADMIN = 21,
    MAX_RESOLV_CONF = 4096,
    PR_CAPBSET_DROP = 24,
    PR_CAPBSET_READ = 23,
    O_WRONLY = 01,
    O_CREAT = 0100,
    O_EXCL = 0200,
    O_NOFOLLOW = 0400000,
    O_CLOEXEC = 02000000,
    EINTR = 4,
    ARCHIVE_FD = 3,
    /* CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM */
    THREAD_FLAGS = 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x40000,
};

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

/* Whether a and b are the same string. */
static int same(const char *a, const char *b)
{
    while (*a && *a == *b) {
        a++;
        b++;
    }
    return *a == *b;
}

static const char frame[] = "\036ISOBOX-START\n";

/* Says "isobox-start: WHAT" (and ": errno N" when e > 0) on stderr. */
static void say(const char *what, long e)
{
    put("isobox-start: ", 14);
    put(what, len(what));
    if (e > 0) {
        char num[24];
        int i = sizeof num;
        do {
            num[--i] = (char)('0' + e % 10);
            e /= 10;
        } while (e > 0 && i > 0);
        put(": errno ", 8);
        put(num + i, (long)sizeof num - i);
    }
    put("\n", 1);
}

__attribute__((noreturn)) static void fail(const char *what, long e)
{
    say(what, e);
    for (;;)
        sys3(SYS_exit, 126, 0, 0);
}

/* The archive on fd 3, read through one buffer. */
static char buf[1 << 16];
static long have, at;

static int fill(void)
{
    if (at < have)
        return 1;
    long n;
    do
        n = sys3(SYS_read, ARCHIVE_FD, (long)buf, sizeof buf);
    while (n == -EINTR);
    if (n < 0)
        fail("reading the workspace archive", -n);
    have = n;
    at = 0;
    return n > 0;
}

static void get(char *dst, long n)
{
    while (n > 0) {
        if (!fill())
            fail("the workspace archive ends early", 0);
        long k = have - at;
        if (k > n)
            k = n;
        for (long i = 0; i < k; i++)
            dst[i] = buf[at + i];
        at += k;
        dst += k;
        n -= k;
    }
}

static unsigned long le(int bytes)
{
    unsigned char b[8];
    get((char *)b, bytes);
    unsigned long v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

/* Relative, no empty, "." or ".." component, no NUL. */
static int plain(const char *p, long n)
{
    if (n == 0 || p[0] == '/')
        return 0;
    long start = 0;
    for (long i = 0; i <= n; i++) {
        if (i < n && p[i] == 0)
            return 0;
        if (i == n || p[i] == '/') {
            long c = i - start;
            if (c == 0 || (c == 1 && p[start] == '.') ||
                (c == 2 && p[start] == '.' && p[start + 1] == '.'))
                return 0;
            start = i + 1;
        }
    }
    return 1;
}

/* Makes `path` (mode 0644, a new file) with the archive's next `size` bytes. */
static void write_file(const char *path, unsigned long size)
{
    long fd = sys3(SYS_open, (long)path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        fail("making a file of the workspace", -fd);
    while (size > 0) {
        if (!fill())
            fail("the workspace archive ends early", 0);
        long k = have - at;
        if ((unsigned long)k > size)
            k = (long)size;
        long w = sys3(SYS_write, fd, (long)(buf + at), k);
        if (w == -EINTR)
            continue;
        if (w <= 0)
            fail("writing a file of the workspace", w < 0 ? -w : 0);
        at += w;
        size -= (unsigned long)w;
    }
    sys3(SYS_close, fd, 0, 0);
}

struct cap_header {
    unsigned int version;
    int pid;
};
struct cap_data {
    unsigned int effective, permitted, inheritable;
};

/* Binds the archive's next `size` bytes read-only over /etc/resolv.conf. */
static void bind_resolv_conf(unsigned long size)
{
    static const char tmp[] = ".isobox-resolv.conf", dest[] = "/etc/resolv.conf";
    if (size > MAX_RESOLV_CONF)
        fail("the resolv.conf in the workspace archive is too long", 0);
    write_file(tmp, size);
    long r;
    if ((r = sys5(SYS_mount, (long)tmp, (long)dest, 0, MS_BIND, 0)) < 0)
        fail("binding /etc/resolv.conf", -r);
    if ((r = sys5(SYS_mount, 0, (long)dest, 0,
                  MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, 0)) < 0)
        fail("making /etc/resolv.conf read-only", -r);
    if ((r = sys3(SYS_unlink, (long)tmp, 0, 0)) < 0)
        fail("removing the resolv.conf file", -r);
}

/* Keeps only CAP_SETGID, CAP_SETUID and CAP_SETPCAP (for the drop), whatever runsc
 * gave: CAP_SYS_ADMIN (a networked run's, for its resolv.conf) is gone from every set
 * before anything of the program's is read. */
static void keep_only_id_caps(void)
{
    long r;
    if ((r = sys3(SYS_prctl, PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0)) < 0)
        fail("dropping CAP_SYS_ADMIN from the bounding set", -r);
    /* _LINUX_CAPABILITY_VERSION_3: two 32-bit halves. */
    struct cap_header h = {0x20080522, 0};
    unsigned int keep = 1u << CAP_SETGID | 1u << CAP_SETUID | 1u << CAP_SETPCAP;
    struct cap_data d[2] = {{keep, keep, 0}, {0, 0, 0}};
    if ((r = sys3(SYS_capset, (long)&h, (long)d, 0)) < 0)
        fail("dropping CAP_SYS_ADMIN", -r);
    struct cap_data got[2];
    if ((r = sys3(SYS_capget, (long)&h, (long)got, 0)) < 0)
        fail("reading back the capabilities", -r);
    if (got[0].effective != keep || got[0].permitted != keep || got[0].inheritable != 0 ||
        got[1].effective || got[1].permitted || got[1].inheritable)
        fail("CAP_SYS_ADMIN is still held", 0);
}

static void unpack(void)
{
    static char path[4096];
    char magic[8];
    get(magic, 8);
    static const char want[8] = "ISOBOXW1";
    for (int i = 0; i < 8; i++)
        if (magic[i] != want[i])
            fail("not a workspace archive", 0);
    long old = sys3(SYS_umask, 0, 0, 0);
    char kind;
    get(&kind, 1);
    if (kind == 'r') {
        bind_resolv_conf(le(2));
        get(&kind, 1);
    }
    keep_only_id_caps();
    for (;; get(&kind, 1)) {
        if (kind == 0)
            break;
        if (kind == 'r')
            fail("resolv.conf is not the workspace archive's first entry", 0);
        long n = (long)le(2);
        if (n >= (long)sizeof path)
            fail("a path in the workspace archive is too long", 0);
        get(path, n);
        path[n] = 0;
        if (!plain(path, n))
            fail("a path in the workspace archive is not plain", 0);
        if (kind == 'd') {
            long r = sys3(SYS_mkdir, (long)path, 0755, 0);
            if (r < 0)
                fail("making a directory of the workspace", -r);
        } else if (kind == 'f') {
            unsigned long size = le(8);
            write_file(path, size);
        } else {
            fail("an unknown entry in the workspace archive", 0);
        }
    }
    sys3(SYS_umask, old, 0, 0);
    sys3(SYS_close, ARCHIVE_FD, 0, 0);
}

static long number(const char *s)
{
    long v = 0;
    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
        /* A uid is 32 bits, and (uid_t)-1 means "unchanged" to setresuid. */
        if (v > 0xfffffffe)
            return -1;
    }
    return v;
}

/* Becomes `id`:`id` for good, with no group besides and no capability left. */
static void drop_to(long id)
{
    long r;
    if ((r = sys3(SYS_setgroups, 0, 0, 0)) < 0)
        fail("setgroups", -r);
    if ((r = sys3(SYS_setresgid, id, id, id)) < 0)
        fail("setresgid", -r);
    for (long cap = 0; cap < 64; cap++) {
        if (sys3(SYS_prctl, PR_CAPBSET_READ, cap, 0) < 0)
            break;
        if ((r = sys3(SYS_prctl, PR_CAPBSET_DROP, cap, 0)) < 0)
            fail("dropping the capability bounding set", -r);
    }
    /* All three ids nonzero: the kernel clears the permitted, effective and ambient
     * sets (the inheritable one was given empty). */
    if ((r = sys3(SYS_setresuid, id, id, id)) < 0)
        fail("setresuid", -r);
    unsigned int u[3], g[3];
    if (sys3(SYS_getresuid, (long)&u[0], (long)&u[1], (long)&u[2]) < 0 ||
        sys3(SYS_getresgid, (long)&g[0], (long)&g[1], (long)&g[2]) < 0)
        fail("reading back the ids", 0);
    for (int i = 0; i < 3; i++)
        if (u[i] != (unsigned int)id || g[i] != (unsigned int)id)
            fail("the ids did not change", 0);
}

/* The program to exec, and how (`exec_program`). */
static char **prog_argv, **prog_envp;
/* Whether the frame goes before it (not for `--boot`). */
static int framed = 1;

/* Writes the frame and execs `prog_argv`; on failure says so (after the frame, as the
 * program's own output, as the shell's "not found" was) and ends the whole process
 * with 127, as the shell did. */
__attribute__((noreturn, used)) static void exec_program(void)
{
    if (framed)
        put(frame, sizeof frame - 1);
    if (prog_argv[0]) {
        long e = -sys3(SYS_execve, (long)prog_argv[0], (long)prog_argv, (long)prog_envp);
        /* "isobox-start: exec PROGRAM: errno N" */
        char num[24];
        int i = sizeof num;
        num[--i] = '\n';
        do {
            num[--i] = (char)('0' + e % 10);
            e /= 10;
        } while (e > 0 && i > 0);
        put("isobox-start: exec ", 19);
        put(prog_argv[0], len(prog_argv[0]));
        put(": errno ", 8);
        put(num + i, (long)sizeof num - i);
    }
    for (;;)
        sys3(SYS_exit_group, 127, 0, 0);
}

static char thread_stack[16384] __attribute__((aligned(16)));

/* A thread of this process (its credentials copied from the caller's as they are now)
 * that runs `exec_program` on its own stack. */
static long exec_in_thread(void)
{
    long r;
    register long ctid __asm__("r10") = 0;
    register long tls __asm__("r8") = 0;
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     /* The new thread: rsp is the top of thread_stack, 16-aligned. */
                     "call *%%rbx\n\t"
                     "ud2\n"
                     "1:\n\t"
                     : "=a"(r)
                     : "0"((long)SYS_clone), "D"((long)THREAD_FLAGS),
                       "S"(thread_stack + sizeof thread_stack), "d"(0L), "r"(ctid), "r"(tls),
                       "b"(exec_program)
                     : "rcx", "r11", "memory");
    return r;
}

__attribute__((noreturn, used)) void program_main(long *sp)
{
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    char **envp = argv + argc + 1;
    int booting = argc >= 2 && same(argv[1], "--boot");
    int unpacking = booting || (argc >= 2 && same(argv[1], "--unpack"));
    framed = !booting;
    prog_envp = envp;
    if (!unpacking) {
        prog_argv = argv + 1;
        exec_program();
    }
    long id = argc >= 3 ? number(argv[2]) : -1;
    if (id <= 0 || argc < 4)
        fail("usage: isobox-start --unpack|--boot UID PROGRAM [ARGS...]", 0);
    prog_argv = argv + 3;
    unpack();
    drop_to(id);
    /* gVisor counts a task against RLIMIT_NPROC under the real uid it was made with
     * and never moves it: this one was made as root. The program is made to count as
     * the sandbox user's, as on a run that starts as it: a thread made now (with this
     * task's credentials, the user's) execs it, and an exec from a thread takes over
     * the process, pid 1 included, and ends this task. */
    long t = exec_in_thread();
    if (t < 0)
        fail("starting the exec thread", -t);
    for (;;)
        sys3(SYS_pause, 0, 0, 0);
}

/*
 * What isoboxd's static programs without libc share (start.c, started.c): raw x86-64
 * Linux syscalls (three and five arguments), and the entry point. The kernel starts a program with argc,
 * argv and envp on the stack; `_start` hands that stack to the program's
 * `program_main`, aligned as the ABI wants, which must not return.
 */
#if !defined(__x86_64__) || !defined(__linux__)
#error "isoboxd's static programs are written for Linux on x86-64"
#endif

static long sys3(long n, long a, long b, long c)
{
    long r;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(n), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return r;
}

/* Five arguments: the fourth and fifth go in r10 and r8. */
__attribute__((unused)) static long sys5(long n, long a, long b, long c, long d, long e)
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

__attribute__((noreturn, used)) void program_main(long *sp);

__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n"
        "  call program_main\n");

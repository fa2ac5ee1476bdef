//! A last word from a crashing daemon: on SIGSEGV, SIGBUS, SIGILL or SIGFPE, the
//! thread, the fault address and a raw backtrace go to stderr (the daemon's log)
//! before the signal takes the process down as it would have anyway.
//!
//! Without it a crash leaves only "exited with signal 11", with no hint of the thread
//! or the code: every line below is something a person reading the log needs to find
//! the fault (`addr2line -f -e isoboxd 0x…` turns each `isoboxd(+0x…)` frame into a
//! function and a line, as the binary keeps its symbols).
//!
//! The handler is installed with `SA_RESETHAND`: the kernel puts the default action
//! back as it delivers the signal, so the handler needs no `sigaction` call to let the
//! fault kill the process afterwards (the reactor thread's seccomp filter refuses
//! `rt_sigaction`; a handler relying on it would re-enter forever there). It then
//! calls the handler that was there before (Rust's own, which names a thread that
//! overflowed its stack) and returns: the faulting instruction runs again and the
//! default action ends the process with the same signal, and a core dump where the
//! host keeps them.
//!
//! Everything the handler does is async-signal-safe except `backtrace`, whose one
//! unsafe step (loading libgcc's unwinder) is done by [`install`] beforehand.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The signals reported.
const SIGNALS: [libc::c_int; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];

/// Frames printed at most.
const MAX_FRAMES: usize = 64;

/// The action each signal had before [`install`] (a `sigaction` copied bit for bit),
/// indexed as [`SIGNALS`]; 0 when none was saved.
static PREVIOUS: [AtomicUsize; 4] = [
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
];

extern "C" {
    // glibc's <execinfo.h>; the libc crate does not declare them.
    fn backtrace(buffer: *mut *mut libc::c_void, size: libc::c_int) -> libc::c_int;
    fn backtrace_symbols_fd(buffer: *const *mut libc::c_void, size: libc::c_int, fd: libc::c_int);
}

/// Installs the reporter for every signal of [`SIGNALS`]. Call in `main` before other
/// threads exist and after Rust's runtime has installed its own handlers (it has, by
/// the time `main` runs), so that theirs is the one chained to.
///
/// # Errors
/// When `sigaction` refuses.
pub fn install() -> std::io::Result<()> {
    // The first `backtrace` loads libgcc_s (with `dlopen` and `malloc`, neither
    // async-signal-safe): do it here, where that is harmless.
    let mut warm = [std::ptr::null_mut::<libc::c_void>(); 4];
    // SAFETY: the buffer holds the 4 entries it is said to.
    unsafe { backtrace(warm.as_mut_ptr(), warm.len() as libc::c_int) };
    for (i, &sig) in SIGNALS.iter().enumerate() {
        // SAFETY: an all-zero sigaction is a valid value (no handler, no flags).
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = report as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESETHAND;
        // SAFETY: `sa_mask` is a valid sigset_t to empty.
        unsafe { libc::sigemptyset(&mut new.sa_mask) };
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        crate::syscall!(sigaction(sig, &new, &mut old))?;
        if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
            // Kept for the process's lifetime: the handler may run at any time.
            PREVIOUS[i].store(Box::into_raw(Box::new(old)) as usize, Ordering::Release);
        }
    }
    Ok(())
}

/// Writes `bytes` to stderr, ignoring failure (there is nowhere else to say it).
fn say(bytes: &[u8]) {
    // SAFETY: the pointer and length are the slice's.
    let _ = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

/// `n` in hexadecimal into `buf`, returning the digits used (no allocation).
fn hex(mut n: usize, buf: &mut [u8; 18]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    i -= 1;
    buf[i] = b'x';
    i -= 1;
    buf[i] = b'0';
    &buf[i..]
}

/// `n` in decimal into `buf`.
fn dec(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

extern "C" fn report(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let name = match sig {
        libc::SIGSEGV => &b"SIGSEGV"[..],
        libc::SIGBUS => b"SIGBUS",
        libc::SIGILL => b"SIGILL",
        _ => b"SIGFPE",
    };
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let mut comm = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes and a NUL into the 17-byte buffer;
    // under the reactor's seccomp filter it fails and the buffer stays empty.
    unsafe { libc::prctl(libc::PR_GET_NAME, comm.as_mut_ptr()) };
    let comm_len = comm.iter().position(|&b| b == 0).unwrap_or(16);
    // SAFETY: gettid has no failure mode.
    let tid = unsafe { libc::gettid() } as u64;
    let (mut h, mut d) = ([0u8; 18], [0u8; 20]);
    say(b"isoboxd: fatal ");
    say(name);
    say(b" (fault address ");
    say(hex(addr, &mut h));
    say(b") in thread '");
    say(&comm[..comm_len]);
    say(b"' tid ");
    say(dec(tid, &mut d));
    say(b"; backtrace (addr2line -f -e isoboxd +OFFSET):\n");
    let mut frames = [std::ptr::null_mut::<libc::c_void>(); MAX_FRAMES];
    // SAFETY: the buffer holds MAX_FRAMES entries; libgcc_s was loaded by `install`.
    let n = unsafe { backtrace(frames.as_mut_ptr(), MAX_FRAMES as libc::c_int) };
    // SAFETY: the first `n` entries were filled; backtrace_symbols_fd only writes to fd 2.
    unsafe { backtrace_symbols_fd(frames.as_ptr(), n, 2) };
    let i = SIGNALS.iter().position(|&s| s == sig).unwrap_or(0);
    let prev = PREVIOUS[i].load(Ordering::Acquire) as *const libc::sigaction;
    if !prev.is_null() {
        // SAFETY: set once by `install` from a leaked Box, never freed.
        let prev = unsafe { &*prev };
        if prev.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: an SA_SIGINFO handler takes these three arguments; the pointer
            // is the handler Rust's runtime installed.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(prev.sa_sigaction) };
            f(sig, info, ctx);
        } else {
            // SAFETY: a handler without SA_SIGINFO takes the signal number only.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev.sa_sigaction) };
            f(sig);
        }
    }
    // Returning runs the faulting instruction again under the default action.
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Runs this test binary again as a child that only runs `name` with
    /// `ISOBOX_CRASH_CHILD` set; returns its status and stderr.
    fn child(name: &str) -> (std::process::ExitStatus, String) {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env("ISOBOX_CRASH_CHILD", "1")
            .output()
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Faults on a real unmapped address (a raised signal would not fault again).
    fn fault() {
        // SAFETY: none; the point is the fault. Address 8 is in the never-mapped
        // first page (vm.mmap_min_addr), so the store traps.
        unsafe { std::ptr::write_volatile(std::hint::black_box(8usize) as *mut u8, 1) };
    }

    #[test]
    fn crash_child_plain() {
        if std::env::var_os("ISOBOX_CRASH_CHILD").is_none() {
            return;
        }
        install().unwrap();
        std::thread::Builder::new()
            .name("isobox-crashy".into())
            .spawn(fault)
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn crash_child_under_the_reactor_filter() {
        if std::env::var_os("ISOBOX_CRASH_CHILD").is_none() {
            return;
        }
        install().unwrap();
        std::thread::spawn(|| {
            let nrs = crate::sys::seccomp::parse_allowlist(crate::sys::seccomp::REACTOR_ALLOWLIST)
                .unwrap();
            crate::sys::seccomp::install_thread_filter(&nrs).unwrap();
            fault();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_fault_is_reported_then_kills_with_its_own_signal() {
        use std::os::unix::process::ExitStatusExt;
        let (status, err) = child("sys::crash::tests::crash_child_plain");
        assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status:?}\n{err}");
        assert!(
            err.contains(
                "isoboxd: fatal SIGSEGV (fault address 0x8) in thread 'isobox-crashy' tid "
            ),
            "{err}"
        );
        // At least the handler's own frame and the faulting function's, each with the
        // module offset addr2line needs.
        let frames = err
            .lines()
            .filter(|l| l.contains("(+0x") || l.contains("+0x"))
            .count();
        assert!(frames >= 3, "{err}");
        // A thread whose seccomp filter refuses rt_sigaction still dies at once (the
        // default action was restored by the kernel, not by a call it refuses) rather
        // than faulting forever.
        let t = std::time::Instant::now();
        let (status, err) = child("sys::crash::tests::crash_child_under_the_reactor_filter");
        assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status:?}\n{err}");
        assert!(
            err.contains("isoboxd: fatal SIGSEGV (fault address 0x8) in thread '"),
            "{err}"
        );
        assert!(t.elapsed() < std::time::Duration::from_secs(20));
    }

    #[test]
    fn numbers_are_written_without_allocating() {
        let (mut h, mut d) = ([0u8; 18], [0u8; 20]);
        assert_eq!(hex(0, &mut h), b"0x0");
        assert_eq!(hex(0xdead_beef, &mut h), b"0xdeadbeef");
        assert_eq!(hex(usize::MAX, &mut h), b"0xffffffffffffffff");
        assert_eq!(dec(0, &mut d), b"0");
        assert_eq!(dec(u64::MAX, &mut d), b"18446744073709551615");
    }
}

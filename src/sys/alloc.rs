//! The daemon's allocator: jemalloc (the global allocator of `isoboxd`, set in
//! `main.rs`), tuned to give freed memory back to the kernel within about a second.
//!
//! Why not glibc's malloc: under connection churn its arenas kept freed memory that
//! later allocations did not reuse, so the daemon's anonymous memory grew with every
//! burst of connections (about 40 B per connection, round after round, while the bytes
//! in use stayed flat; `bench/README.md`, "Connection churn"). jemalloc's size-classed
//! slabs do not fragment that way. Freed pages go back after [`DECAY_MS`]: jemalloc
//! checks as it allocates, and [`purge_decayed`] (called every second by the daemon's
//! housekeeping) does it while the daemon is idle.
//!
//! No jemalloc background thread: with one (session 12), isoboxd twice died of SIGSEGV,
//! at a shutdown and in the library's tests while the loop tests forked, and never
//! without it. A thread jemalloc makes itself, outside Rust, beside a process that forks
//! constantly, is not worth a second's idle purge that a timer we already have can do.
//!
//! C libraries in the daemon (LMDB) still call glibc's `malloc`; `limit_malloc_arenas`
//! and `malloc_trim` (in `sys`) keep that side small.

/// How long freed ("dirty") pages stay resident before jemalloc returns them (its
/// default is 10 s; a shorter delay costs a few more `madvise` calls, never a wrong
/// result).
const DECAY_MS: isize = 1000;

/// jemalloc's second stage: pages given back with `MADV_FREE`, which stay in the
/// process's resident memory until the kernel needs them. 0 skips it: dirty pages go
/// back with `MADV_DONTNEED` at once, and RSS falls when they do (jemalloc 5.3's
/// default on Linux, set anyway so a build with another default does the same).
const MUZZY_DECAY_MS: isize = 0;

/// Sets the decay of freed pages for the arenas there are and those to come. Call at
/// the start of `main`, before other threads exist.
pub fn tune_allocator() -> Result<(), String> {
    use tikv_jemalloc_ctl::{arenas, raw};
    let set = |key: String, ms: isize| {
        let name = format!("{key}\0");
        // SAFETY: every decay key is jemalloc's `ssize_t`, which `isize` is, and the
        // name ends with the NUL `raw::write` requires.
        unsafe { raw::write(name.as_bytes(), ms) }.map_err(|e| format!("jemalloc {key}: {e}"))
    };
    // The default for arenas made from now on...
    set("arenas.dirty_decay_ms".into(), DECAY_MS)?;
    set("arenas.muzzy_decay_ms".into(), MUZZY_DECAY_MS)?;
    // ...and each arena made already: arena 0 at least (jemalloc has no "every arena"
    // form of these keys; an index not made yet answers an error, and gets the default
    // when it is made).
    let narenas = arenas::narenas::read().map_err(|e| format!("jemalloc arenas.narenas: {e}"))?;
    for i in 0..narenas {
        let made = set(format!("arena.{i}.dirty_decay_ms"), DECAY_MS).is_ok();
        if made {
            set(format!("arena.{i}.muzzy_decay_ms"), MUZZY_DECAY_MS)?;
        } else if i == 0 {
            return Err("jemalloc: arena 0 would not take a decay time".into());
        }
    }
    Ok(())
}

/// Gives back, in every arena, the freed pages whose decay time has passed (what a
/// jemalloc background thread would do). Cheap when there are none; no syscall but
/// `madvise`, so it may run on the reactor thread under its seccomp filter.
pub fn purge_decayed() {
    // "arena.<MALLCTL_ARENAS_ALL>.decay", a command that takes and gives nothing.
    let name = b"arena.4096.decay\0";
    // SAFETY: the name ends with NUL; a void command is called with null pointers and
    // a zero length, as jemalloc's mallctl(3) says.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

/// jemalloc's own figures: bytes the daemon's Rust code has allocated and not freed,
/// and bytes of pages jemalloc holds resident (those, plus its metadata). What C code
/// allocates with glibc's malloc (LMDB) and thread stacks are in neither. `None` if
/// jemalloc would not say.
pub fn heap_figures() -> Option<(u64, u64)> {
    use tikv_jemalloc_ctl::{epoch, stats};
    // The statistics are a snapshot taken when the epoch advances.
    epoch::advance().ok()?;
    let allocated = stats::allocated::read().ok()?;
    let resident = stats::resident::read().ok()?;
    Some((allocated as u64, resident as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decay_and_the_background_thread_are_set_and_read_back() {
        tune_allocator().unwrap();
        // SAFETY: `ssize_t` keys read as `isize`.
        let dirty: isize =
            unsafe { tikv_jemalloc_ctl::raw::read(b"arenas.dirty_decay_ms\0") }.unwrap();
        assert_eq!(dirty, DECAY_MS);
        // SAFETY: as above.
        let muzzy: isize =
            unsafe { tikv_jemalloc_ctl::raw::read(b"arena.0.muzzy_decay_ms\0") }.unwrap();
        assert_eq!(muzzy, MUZZY_DECAY_MS);
        // SAFETY: as above.
        let arena0: isize =
            unsafe { tikv_jemalloc_ctl::raw::read(b"arena.0.dirty_decay_ms\0") }.unwrap();
        assert_eq!(arena0, DECAY_MS);
        assert!(!tikv_jemalloc_ctl::background_thread::read().unwrap());
        purge_decayed();
        let (allocated, resident) = heap_figures().unwrap();
        assert!(
            resident > 0 && allocated <= resident,
            "{allocated} {resident}"
        );
    }
}

//! The daemon's allocator: jemalloc (the global allocator of `isoboxd`, set in
//! `main.rs`), tuned to give freed memory back to the kernel within about a second.
//!
//! Why not glibc's malloc: under connection churn its arenas kept freed memory that
//! later allocations did not reuse, so the daemon's anonymous memory grew with every
//! burst of connections (about 40 B per connection, round after round, while the bytes
//! in use stayed flat; `bench/README.md`, "Connection churn"). jemalloc's size-classed
//! slabs do not fragment that way, and its background thread returns dirty pages after
//! [`DECAY_MS`] even while the daemon is idle.
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

/// Sets the decay of freed pages for the arenas there are and those to come, and starts
/// one background thread that purges them. Call at the start of `main`, before other
/// threads exist (the thread must not be started under a seccomp filter).
pub fn tune_allocator() -> Result<(), String> {
    use tikv_jemalloc_ctl::{arenas, background_thread, max_background_threads, raw};
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
    max_background_threads::write(1)
        .map_err(|e| format!("jemalloc max_background_threads: {e}"))?;
    background_thread::write(true).map_err(|e| format!("jemalloc background_thread: {e}"))?;
    Ok(())
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
        assert!(tikv_jemalloc_ctl::background_thread::read().unwrap());
        assert_eq!(
            tikv_jemalloc_ctl::max_background_threads::read().unwrap(),
            1
        );
        let (allocated, resident) = heap_figures().unwrap();
        assert!(
            resident > 0 && allocated <= resident,
            "{allocated} {resident}"
        );
    }
}

//! The one place the LMDB environment is opened (heed's `open` is `unsafe`: the same
//! file must not be opened twice in one process, which [`open`] guarantees by being
//! called once per daemon, on its own data directory), and where its commits stop
//! syncing ([`commit_without_sync`]).

use heed::{Env, EnvOpenOptions, WithoutTls};
use std::path::Path;

/// Virtual size of the memory map. LMDB only uses what it needs; this bounds the file.
pub const MAP_SIZE_BYTES: usize = 4 << 30;
/// Named databases the environment may hold.
pub const MAX_DBS: u32 = 32;

/// Opens (creating when missing) the environment in `dir`.
///
/// # Errors
/// When the directory cannot be created or LMDB refuses the files.
pub fn open(dir: &Path) -> Result<Env<WithoutTls>, heed::Error> {
    std::fs::create_dir_all(dir)?;
    // Reader slots belong to read transactions, not to threads (LMDB's MDB_NOTLS). With
    // thread-local slots, every thread that ever read holds a slot until it exits, and
    // its exit runs LMDB's destructor on that slot, in the lock file's memory map: a
    // thread ending while another drops the last handle (unmapping the lock file)
    // crashed the process with SIGSEGV in `mdb_env_reader_dest`. Without TLS a slot is
    // taken at `read_txn` and given back when the transaction ends: one uncontended
    // lock of the reader table per read, and no thread-exit hook at all.
    let mut opts = EnvOpenOptions::new().read_txn_without_tls();
    opts.map_size(MAP_SIZE_BYTES)
        .max_dbs(MAX_DBS)
        .max_readers(126);
    // SAFETY: heed requires that an environment is not opened twice in one process and
    // that the files are not truncated behind its back. The daemon opens its data
    // directory once, at startup (the instance name, which is unique per host, owns the
    // directory), and nothing else writes those files.
    unsafe { opts.open(dir) }
}

/// From here on LMDB's commits do not sync (`MDB_NOSYNC`): the writer makes each one
/// durable through the write-ahead log before it answers, and checkpoints sync the
/// data file (see `wal`).
///
/// # Errors
/// When LMDB refuses the flag.
pub fn commit_without_sync(env: &Env<WithoutTls>) -> Result<(), heed::Error> {
    // SAFETY: heed marks NO_SYNC unsafe because a commit is then not durable on its
    // own, and LMDB's file may be left inconsistent by a power cut. Here no commit is
    // answered before its changes are synced to the write-ahead log, and recovery
    // writes back the meta pages of a synced checkpoint whose pages a read transaction
    // kept from reuse, then replays the log: what LMDB alone would lose is restored.
    unsafe { env.set_flags(heed::EnvFlags::NO_SYNC, heed::FlagSetMode::Enable) }
}

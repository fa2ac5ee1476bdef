//! The one place the LMDB environment is opened (heed's `open` is `unsafe`: the same
//! file must not be opened twice in one process, which [`open`] guarantees by being
//! called once per daemon, on its own data directory).

use heed::{Env, EnvOpenOptions};
use std::path::Path;

/// Virtual size of the memory map. LMDB only uses what it needs; this bounds the file.
pub const MAP_SIZE_BYTES: usize = 4 << 30;
/// Named databases the environment may hold.
pub const MAX_DBS: u32 = 32;

/// Opens (creating when missing) the environment in `dir`.
///
/// # Errors
/// When the directory cannot be created or LMDB refuses the files.
pub fn open(dir: &Path) -> Result<Env, heed::Error> {
    std::fs::create_dir_all(dir)?;
    let mut opts = EnvOpenOptions::new();
    opts.map_size(MAP_SIZE_BYTES)
        .max_dbs(MAX_DBS)
        .max_readers(126);
    // SAFETY: heed requires that an environment is not opened twice in one process and
    // that the files are not truncated behind its back. The daemon opens its data
    // directory once, at startup (the instance name, which is unique per host, owns the
    // directory), and nothing else writes those files.
    unsafe { opts.open(dir) }
}

//! Session workspace images: an ext4 filesystem in a sparse file, loop-mounted on
//! the host while its session is in use.
//!
//! It stays one file: creating, mounting, trimming and unmounting an image and the
//! sweep of stale mounts share the layout choices and the busy-retry rules.
//!
//! The kernel enforces the quota: the filesystem is sized so that a file writer gets
//! at least the quota (and at most about 1 % more) before `ENOSPC`, and its inode
//! count bounds the number of files. Images at rest are plain unmounted files.
//!
//! Layout choices (see [`create`]): 4 KiB blocks, 256-byte inodes, no root-reserved
//! blocks, a small journal for crash durability, no `resize_inode` (its reserved
//! descriptor blocks cost up to 4 MiB per image; the kernel can still grow the
//! filesystem online by switching to `meta_bg`), and the root directory owned by
//! `65534:65534`. Nothing is zeroed at creation: the file is freshly sparse, so
//! the inode tables and journal already read as zeros, and [`mount`] passes
//! `noinit_itable` so the kernel does not write those zeros later either.
//!
//! Mounts use a loop device bound with `LO_FLAGS_AUTOCLEAR` (released by the kernel
//! at unmount) and `LO_FLAGS_DIRECT_IO` when the host filesystem supports it (so
//! file data is not cached twice).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::sys::loopdev;

/// Smallest quota [`create`] accepts (the journal needs a filesystem of some size).
pub const MIN_SIZE_BYTES: u64 = 8 << 20;
/// Largest quota [`create`] accepts.
pub const MAX_SIZE_BYTES: u64 = 16 << 40;
/// Smallest inode count [`create`] accepts.
pub const MIN_INODES: u64 = 16;
/// Largest inode count [`create`] accepts (ext4 counts inodes in 32 bits).
pub const MAX_INODES: u64 = (u32::MAX as u64) / 2;
/// Owner (uid and gid) of the workspace root directory: `nobody`.
pub const ROOT_OWNER: u32 = 65534;

/// Filesystem block size.
const BLOCK: u64 = 4096;
/// Inode size in bytes.
const INODE_SIZE: u64 = 256;
/// Inodes mke2fs reserves (1..=10); the root directory is one of them.
const RESERVED_INODES: u64 = 10;
/// Where mkfs.ext4 is looked for (no `PATH` search).
const MKFS_CANDIDATES: [&str; 3] = [
    "/usr/sbin/mkfs.ext4",
    "/sbin/mkfs.ext4",
    "/usr/bin/mkfs.ext4",
];
/// Volume label of every workspace filesystem.
const LABEL: &str = "isobox";
/// Filesystem options of every mount.
const MOUNT_DATA: &str = "errors=remount-ro,noinit_itable";
/// Attempts at binding a free loop device (others may take the one we were offered).
const LOOP_ATTEMPTS: u32 = 8;
/// mkfs runs at most this many times while sizing the image.
const SIZING_ROUNDS: u32 = 4;

/// Errors of workspace image operations. Each names the path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A size or inode count out of range.
    #[error("workspace image {path}: {detail}")]
    Invalid {
        /// The image.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// Creating, sizing or syncing the image file failed.
    #[error("create {path}: {source}")]
    Create {
        /// The image.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// mkfs.ext4 is missing, failed, or produced an unusable filesystem.
    #[error("mkfs.ext4 {path}: {detail}")]
    Mkfs {
        /// The image.
        path: PathBuf,
        /// mkfs output or what went wrong.
        detail: String,
    },
    /// Preparing the mount point failed (it is not a directory, cannot be created...).
    #[error("mount point {path}: {source}")]
    MountPoint {
        /// The mount point.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The mount point already has something mounted on it.
    #[error("mount point {path}: already mounted")]
    AlreadyMounted {
        /// The mount point.
        path: PathBuf,
    },
    /// Opening the image or binding it to a loop device failed.
    #[error("loop device for {path}: {source}")]
    Loop {
        /// The image.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// `mount(2)` failed (e.g. `EINVAL` for a corrupt image); nothing was left bound.
    #[error("mount {path} on {mountpoint}: {source}")]
    Mount {
        /// The image.
        path: PathBuf,
        /// The mount point.
        mountpoint: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The filesystem is in use (`EBUSY`); retry later or use [`unmount_lazy`].
    #[error("unmount {path}: busy")]
    Busy {
        /// The mount point.
        path: PathBuf,
    },
    /// Nothing is mounted at the path.
    #[error("unmount {path}: not mounted")]
    NotMounted {
        /// The mount point.
        path: PathBuf,
    },
    /// `umount2(2)` failed otherwise.
    #[error("unmount {path}: {source}")]
    Unmount {
        /// The mount point.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// `statvfs` or `FITRIM` on the mounted filesystem failed.
    #[error("statfs {path}: {source}")]
    Stat {
        /// The mount point.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// Space and inode use of a mounted workspace, from `statvfs` (what `df` shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Filesystem size without its fixed metadata (`df` "Size"): about the quota plus
    /// the kernel's small emergency reserve (2 %, at most 16 MiB).
    pub total_bytes: u64,
    /// Bytes in use by files, directories and their metadata.
    pub used_bytes: u64,
    /// Bytes a writer can still use before `ENOSPC`.
    pub avail_bytes: u64,
    /// Inodes in the filesystem (including the 10 reserved ones).
    pub inodes_total: u64,
    /// Inodes free: how many more files, directories or symlinks can be created.
    pub inodes_free: u64,
}

/// A successful [`mount`]. Plain data: dropping it does not unmount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    /// Where the filesystem is mounted.
    pub mountpoint: PathBuf,
    /// The loop device (`/dev/loopN`); the kernel releases it at unmount.
    pub loop_device: PathBuf,
    /// Whether the loop device does direct I/O on the image (no double caching).
    pub direct_io: bool,
}

fn create_err(path: &Path) -> impl FnOnce(io::Error) -> ImageError + '_ {
    move |source| ImageError::Create {
        path: path.to_path_buf(),
        source,
    }
}

/// Removes the image on drop unless disarmed: `create` leaves nothing on failure.
struct RemoveOnDrop<'a> {
    path: &'a Path,
    armed: bool,
}

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = fs::remove_file(self.path) {
                log::warn!("removing partial image {}: {e}", self.path.display());
            }
        }
    }
}

/// Journal size in MiB: 4 MiB (the jbd2 minimum at 4 KiB blocks) up to 1 GiB
/// quotas, then quota/256, at most 64 MiB. Journal blocks cost host disk only once
/// written, so a larger journal just eases metadata-heavy workloads.
fn journal_mib(size_bytes: u64) -> u64 {
    (size_bytes >> 28).clamp(4, 64)
}

/// The kernel's emergency reserve (`ext4_calculate_resv_clusters`): 2 % of the
/// blocks, at most 4096. Writers cannot use it; `statvfs` leaves it out of `f_bavail`.
fn kernel_reserve_blocks(blocks: u64) -> u64 {
    (blocks / 50).min(4096)
}

/// Blocks a file writer needs beyond the data: a few for directory and extent-tree
/// blocks plus 0.05 % for extent index blocks of large files.
fn margin_blocks(data_blocks: u64) -> u64 {
    8 + data_blocks / 2048
}

/// First guess of the image size in blocks for `target` writable blocks: the journal,
/// the inode tables (inodes per group rounded up to whole table blocks), bitmaps and
/// descriptors (about 2.25 blocks per 128 MiB group, measured), a few fixed blocks,
/// and the kernel reserve on top. Usually within the sizing tolerance.
fn estimate_blocks(target: u64, journal_mib: u64, inodes: u64) -> u64 {
    let journal = (journal_mib << 20) / BLOCK;
    let inodes_per_block = BLOCK / INODE_SIZE;
    let groups = (target + journal + inodes.div_ceil(inodes_per_block)).div_ceil(32768);
    let per_group = inodes.div_ceil(groups).next_multiple_of(inodes_per_block);
    let itable = groups * per_group / inodes_per_block;
    let base = target + journal + itable + 16 + 2 * groups + groups / 4;
    base + base.div_ceil(49).min(4096)
}

/// Block and inode counts read from an ext4 superblock.
#[derive(Debug, Clone, Copy)]
struct Superblock {
    blocks: u64,
    free_blocks: u64,
    inodes: u64,
}

fn le32(b: &[u8], off: usize) -> u64 {
    u64::from(u32::from_le_bytes([
        b[off],
        b[off + 1],
        b[off + 2],
        b[off + 3],
    ]))
}

/// Reads the primary superblock (at byte 1024) of the image.
fn read_superblock(file: &File) -> io::Result<Superblock> {
    const INCOMPAT_64BIT: u64 = 0x80;
    let mut sb = [0u8; 1024];
    file.read_exact_at(&mut sb, 1024)?;
    if u16::from_le_bytes([sb[56], sb[57]]) != 0xEF53 {
        return Err(io::Error::new(ErrorKind::InvalidData, "no ext4 superblock"));
    }
    let block_size = 1024u64 << le32(&sb, 24).min(6);
    if block_size != BLOCK {
        return Err(io::Error::new(
            ErrorKind::InvalidData,
            format!("block size {block_size}"),
        ));
    }
    let wide = le32(&sb, 0x60) & INCOMPAT_64BIT != 0;
    let hi = |off| if wide { le32(&sb, off) << 32 } else { 0 };
    Ok(Superblock {
        blocks: le32(&sb, 4) | hi(0x150),
        free_blocks: le32(&sb, 12) | hi(0x158),
        inodes: le32(&sb, 0),
    })
}

/// The mkfs.ext4 workspaces and volumes are made with, if installed.
pub fn find_mkfs() -> Option<&'static str> {
    MKFS_CANDIDATES.into_iter().find(|p| Path::new(p).is_file())
}

/// Runs mkfs.ext4 on the (sparse, zero) image with a fixed argv, no shell.
fn run_mkfs(mkfs: &str, image: &Path, inodes: u64, journal_mib: u64) -> Result<(), ImageError> {
    let mkfs_err = |detail: String| ImageError::Mkfs {
        path: image.to_path_buf(),
        detail,
    };
    let output = Command::new(mkfs)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args([
            "-q",
            "-F",
            "-b",
            "4096",
            "-I",
            "256",
            "-m",
            "0",
            "-O",
            "^resize_inode",
        ])
        .arg("-N")
        .arg(inodes.to_string())
        .arg("-J")
        .arg(format!("size={journal_mib}"))
        .args(["-L", LABEL, "-E"])
        .arg(format!(
            "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner={ROOT_OWNER}:{ROOT_OWNER}"
        ))
        .arg("--")
        .arg(image)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| mkfs_err(format!("spawn {mkfs}: {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stdout));
    let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let text: String = text.chars().take(500).collect();
    Err(mkfs_err(format!("{}: {text}", output.status)))
}

/// Creates the workspace image `image`: a new sparse file (mode 0600, `O_EXCL`)
/// holding an ext4 filesystem where a file writer gets at least `size_bytes` of data
/// (and less than 1 % more) and at least `inodes` files, directories and symlinks
/// (rounded up to fill inode-table blocks: a multiple of 16 per 128 MiB block group,
/// so at least 8192 at 64 GiB). The root directory is owned by `65534:65534`.
///
/// The image file is `size_bytes` plus the journal (4 to 64 MiB, see
/// `journal_mib`), the inode tables (256 bytes per inode), the kernel's emergency
/// reserve (2 %, at most 16 MiB) and a few blocks of bitmaps and descriptors; only
/// the blocks written count on the host disk (about 100 KiB to 1 MiB when new).
/// mkfs.ext4 runs once or twice: the second run corrects the size by the overhead
/// the first one measured from the superblock. The file and its directory entry are
/// fsynced before returning.
///
/// # Errors
/// [`ImageError::Invalid`] for a size or inode count out of range,
/// [`ImageError::Create`] when the file exists or cannot be written,
/// [`ImageError::Mkfs`] when mkfs.ext4 is missing or fails. On any error the partial
/// image is removed (an image that already existed is left alone).
pub fn create(image: &Path, size_bytes: u64, inodes: u64) -> Result<(), ImageError> {
    let invalid = |detail: String| ImageError::Invalid {
        path: image.to_path_buf(),
        detail,
    };
    if !(MIN_SIZE_BYTES..=MAX_SIZE_BYTES).contains(&size_bytes) {
        return Err(invalid(format!(
            "size {size_bytes} outside {MIN_SIZE_BYTES}..={MAX_SIZE_BYTES}"
        )));
    }
    if !(MIN_INODES..=MAX_INODES).contains(&inodes) {
        return Err(invalid(format!(
            "inode count {inodes} outside {MIN_INODES}..={MAX_INODES}"
        )));
    }
    let mkfs = find_mkfs().ok_or_else(|| ImageError::Mkfs {
        path: image.to_path_buf(),
        detail: format!("not found in {}", MKFS_CANDIDATES.join(", ")),
    })?;

    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(image)
        .map_err(create_err(image))?;
    let mut guard = RemoveOnDrop {
        path: image,
        armed: true,
    };

    let journal = journal_mib(size_bytes);
    // The user's inodes plus the reserved ones (lost+found is removed at mount).
    let mkfs_inodes = inodes + RESERVED_INODES;
    let data_blocks = size_bytes.div_ceil(BLOCK);
    let target = data_blocks + margin_blocks(data_blocks);
    let mut blocks = estimate_blocks(target, journal, mkfs_inodes);
    // Accept up to this many blocks above the target without another mkfs run.
    let tolerance = 16 + target / 1024;

    let mut avail = 0;
    for round in 0..SIZING_ROUNDS {
        // Back to all-zero sparse: mkfs writes only what it must.
        file.set_len(0).map_err(create_err(image))?;
        file.set_len(blocks * BLOCK).map_err(create_err(image))?;
        run_mkfs(mkfs, image, mkfs_inodes, journal)?;
        let sb = read_superblock(&file).map_err(|e| ImageError::Mkfs {
            path: image.to_path_buf(),
            detail: format!("reading the new superblock: {e}"),
        })?;
        if sb.inodes < mkfs_inodes {
            return Err(ImageError::Mkfs {
                path: image.to_path_buf(),
                detail: format!("made {} inodes, wanted {mkfs_inodes}", sb.inodes),
            });
        }
        avail = sb
            .free_blocks
            .saturating_sub(kernel_reserve_blocks(sb.blocks));
        log::debug!(
            "sizing {} round {round}: {} blocks, {avail} available, target {target}",
            image.display(),
            sb.blocks
        );
        if avail >= target && avail - target <= tolerance {
            break;
        }
        if avail < target {
            let deficit = target - avail;
            // The kernel reserve grows by 2 % of what we add while below its cap.
            let extra = if blocks / 50 < 4096 {
                deficit.div_ceil(49)
            } else {
                0
            };
            blocks += deficit + extra;
        } else if round + 1 < SIZING_ROUNDS {
            blocks -= (avail - target) - (avail - target) / 50;
        }
    }
    if avail < target {
        return Err(ImageError::Mkfs {
            path: image.to_path_buf(),
            detail: format!("{avail} blocks available after {SIZING_ROUNDS} runs, wanted {target}"),
        });
    }
    file.sync_all().map_err(create_err(image))?;
    drop(file);
    sync_parent(image).map_err(create_err(image))?;
    guard.armed = false;
    Ok(())
}

/// Fsyncs the directory holding `path` so a new entry survives a crash.
fn sync_parent(path: &Path) -> io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

/// Creates `mountpoint` (mode 0700, and missing parents) unless it exists, and checks
/// it is a directory with nothing mounted on it.
fn prepare_mountpoint(mountpoint: &Path) -> Result<(), ImageError> {
    let mp_err = |source| ImageError::MountPoint {
        path: mountpoint.to_path_buf(),
        source,
    };
    match DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(mountpoint)
    {
        Ok(()) => {}
        Err(e) => return Err(mp_err(e)),
    }
    let meta = fs::symlink_metadata(mountpoint).map_err(mp_err)?;
    if !meta.is_dir() {
        return Err(mp_err(io::Error::from(ErrorKind::NotADirectory)));
    }
    if is_mounted(mountpoint) {
        return Err(ImageError::AlreadyMounted {
            path: mountpoint.to_path_buf(),
        });
    }
    Ok(())
}

/// Binds `backing` to a free loop device. Returns the device number, its open fd and
/// whether direct I/O is on.
fn attach(image: &Path, backing: &File) -> io::Result<(u32, File, bool)> {
    let mut last = io::Error::from(ErrorKind::ResourceBusy);
    for attempt in 0..LOOP_ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(u64::from(attempt)));
        }
        let n = loopdev::get_free()?;
        let dev = match loopdev::open_device(n) {
            Ok(f) => f,
            // The node vanished or is not there yet: another process's doing.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENXIO)) => {
                last = e;
                continue;
            }
            Err(e) => return Err(e),
        };
        let name = image.as_os_str();
        let mut flags = loopdev::LO_FLAGS_AUTOCLEAR | loopdev::LO_FLAGS_DIRECT_IO;
        let mut res = loopdev::configure(dev.as_fd(), backing.as_fd(), flags, BLOCK as u32, name);
        if matches!(&res, Err(e) if e.raw_os_error() == Some(libc::EINVAL)) {
            // The host filesystem cannot do direct I/O at this block size.
            flags = loopdev::LO_FLAGS_AUTOCLEAR;
            res = loopdev::configure(dev.as_fd(), backing.as_fd(), flags, 0, name);
        }
        match res {
            Ok(()) => {
                let direct_io =
                    loopdev::flags(dev.as_fd()).is_ok_and(|f| f & loopdev::LO_FLAGS_DIRECT_IO != 0);
                return Ok((n, dev, direct_io));
            }
            // Someone bound the device between GET_FREE and CONFIGURE: ask again.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// Mounts the workspace image `image` on `mountpoint` (created with mode 0700 if
/// missing): binds a free loop device with autoclear (retrying when another process
/// takes the offered device), mounts ext4 with `nosuid,nodev,noatime` and
/// `errors=remount-ro,noinit_itable`, then closes the loop fd so the kernel releases
/// the device at unmount. An unclean filesystem (after a crash) has its journal
/// replayed by the kernel here. An empty `lost+found` is removed (users should not
/// see it); one with content is kept.
///
/// # Errors
/// [`ImageError::MountPoint`] / [`ImageError::AlreadyMounted`] for a bad mount
/// point, [`ImageError::Loop`] when the image cannot be opened or bound,
/// [`ImageError::Mount`] when `mount(2)` fails (a corrupt image: `EINVAL`/`EUCLEAN`).
/// On error no loop device stays bound and nothing is mounted.
pub fn mount(image: &Path, mountpoint: &Path) -> Result<Mounted, ImageError> {
    prepare_mountpoint(mountpoint)?;
    let loop_err = |source| ImageError::Loop {
        path: image.to_path_buf(),
        source,
    };
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(image)
        .map_err(loop_err)?;
    let meta = backing.metadata().map_err(loop_err)?;
    if !meta.is_file() || meta.len() < BLOCK || meta.len() % BLOCK != 0 {
        return Err(loop_err(io::Error::new(
            ErrorKind::InvalidInput,
            "not a workspace image",
        )));
    }
    let (n, dev, direct_io) = attach(image, &backing).map_err(loop_err)?;
    // The loop device holds its own reference to the image.
    drop(backing);
    let loop_device = loopdev::device_path(n);
    // Not `noexec`: gVisor maps the sandbox's executables from the host file, and a
    // binary built or copied into the workspace must run there (it crashed with SIGSEGV
    // under noexec). The host never executes anything in a workspace.
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    if let Err(source) = loopdev::mount(&loop_device, mountpoint, "ext4", flags, MOUNT_DATA) {
        // Detach now; with autoclear the kernel also would at our close.
        if let Err(e) = loopdev::clear(dev.as_fd()) {
            log::warn!("releasing {}: {e}", loop_device.display());
        }
        drop(dev);
        return Err(ImageError::Mount {
            path: image.to_path_buf(),
            mountpoint: mountpoint.to_path_buf(),
            source,
        });
    }
    // The mounted filesystem now holds the device; autoclear fires at unmount.
    drop(dev);
    match fs::remove_dir(mountpoint.join("lost+found")) {
        Ok(()) => {}
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DirectoryNotEmpty) => {}
        Err(e) => log::warn!("removing {}/lost+found: {e}", mountpoint.display()),
    }
    Ok(Mounted {
        mountpoint: mountpoint.to_path_buf(),
        loop_device,
        direct_io,
    })
}

fn umount(mountpoint: &Path, flags: libc::c_int) -> Result<(), ImageError> {
    match loopdev::umount2(mountpoint, flags | libc::UMOUNT_NOFOLLOW) {
        Ok(()) => Ok(()),
        Err(e) => Err(match e.raw_os_error() {
            Some(libc::EBUSY) => ImageError::Busy {
                path: mountpoint.to_path_buf(),
            },
            Some(libc::EINVAL | libc::ENOENT) => ImageError::NotMounted {
                path: mountpoint.to_path_buf(),
            },
            _ => ImageError::Unmount {
                path: mountpoint.to_path_buf(),
                source: e,
            },
        }),
    }
}

/// Unmounts the workspace at `mountpoint` (syncing it); the kernel then releases
/// its loop device. Does not detach a busy filesystem.
///
/// # Errors
/// [`ImageError::Busy`] when files are still open or a process has its cwd there
/// (retry later); [`ImageError::NotMounted`] when nothing is mounted there;
/// [`ImageError::Unmount`] otherwise.
pub fn unmount(mountpoint: &Path) -> Result<(), ImageError> {
    umount(mountpoint, 0)
}

/// Detaches the workspace at `mountpoint` even when busy (`MNT_DETACH`): it leaves
/// the mount table now and the kernel unmounts it, and releases the loop device, once
/// the last user is gone. For shutdown and the startup sweep.
///
/// # Errors
/// [`ImageError::NotMounted`] when nothing is mounted there; [`ImageError::Unmount`]
/// otherwise.
pub fn unmount_lazy(mountpoint: &Path) -> Result<(), ImageError> {
    umount(mountpoint, libc::MNT_DETACH)
}

pub use crate::sys::mountinfo::{is_mounted, mounts_under};

/// Space and inode use of the workspace mounted at `mountpoint` (`statvfs`).
///
/// # Errors
/// [`ImageError::Stat`] when `statvfs` fails.
pub fn usage(mountpoint: &Path) -> Result<Usage, ImageError> {
    let st = loopdev::statvfs(mountpoint).map_err(|source| ImageError::Stat {
        path: mountpoint.to_path_buf(),
        source,
    })?;
    Ok(Usage {
        total_bytes: st.blocks * st.block_size,
        used_bytes: st.blocks.saturating_sub(st.blocks_free) * st.block_size,
        avail_bytes: st.blocks_avail * st.block_size,
        inodes_total: st.files,
        inodes_free: st.files_free,
    })
}

/// Returns the free blocks of the workspace mounted at `mountpoint` to the host by
/// punching holes in its image (`FITRIM`), so [`allocated_bytes`] drops after files
/// were deleted. Returns the bytes trimmed. Worth calling before [`unmount`].
///
/// # Errors
/// [`ImageError::Stat`] when the mount point cannot be opened or `FITRIM` fails.
pub fn trim(mountpoint: &Path) -> Result<u64, ImageError> {
    let stat_err = |source| ImageError::Stat {
        path: mountpoint.to_path_buf(),
        source,
    };
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(mountpoint)
        .map_err(stat_err)?;
    loopdev::fitrim(dir.as_fd()).map_err(stat_err)
}

/// Bytes an unprivileged writer could still use on the host filesystem holding `path`
/// (`statvfs` `f_bavail`), e.g. the data directory before creating another image.
///
/// # Errors
/// [`ImageError::Stat`] when `statvfs` fails.
pub fn free_bytes(path: &Path) -> Result<u64, ImageError> {
    let st = loopdev::statvfs(path).map_err(|source| ImageError::Stat {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(st.blocks_avail.saturating_mul(st.block_size))
}

/// Bytes the image file really occupies on the host disk (`st_blocks * 512`), for
/// a global storage ceiling. Much less than its length while sparse.
///
/// # Errors
/// The image cannot be `lstat`ed.
pub fn allocated_bytes(image: &Path) -> io::Result<u64> {
    Ok(fs::symlink_metadata(image)?.blocks() * 512)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Instant;

    const MIB: u64 = 1 << 20;

    /// A unique temp dir; on drop, lazily unmounts everything under it and removes it.
    struct TestDir(PathBuf);

    impl TestDir {
        fn new(name: &str) -> TestDir {
            static SEQ: AtomicU32 = AtomicU32::new(0);
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            let dir = PathBuf::from(format!(
                "/tmp/isobox-image-test-{}-{seq}-{name}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir(&dir).unwrap();
            TestDir(dir)
        }

        fn path(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            for mp in mounts_under(&self.0) {
                let _ = unmount_lazy(&mp);
            }
            if let Err(e) = fs::remove_dir_all(&self.0) {
                eprintln!("cleanup {}: {e}", self.0.display());
            }
        }
    }

    /// Loop devices whose backing file is `image` (from sysfs).
    fn loops_backed_by(image: &Path) -> Vec<String> {
        let mut found = Vec::new();
        for entry in fs::read_dir("/sys/block").unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                continue;
            }
            if let Ok(b) = fs::read_to_string(entry.path().join("loop/backing_file")) {
                let b = b.trim_end_matches('\n');
                if Path::new(b.trim_end_matches(" (deleted)")) == image {
                    found.push(name);
                }
            }
        }
        found
    }

    /// Waits (up to 2 s) until no loop device is backed by `image`.
    fn assert_no_loop(image: &Path) {
        let start = Instant::now();
        while !loops_backed_by(image).is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "loop still bound: {:?}",
                loops_backed_by(image)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Writes 1 MiB chunks to a new file until ENOSPC; returns the bytes written.
    fn fill(path: &Path) -> u64 {
        let mut f = File::create(path).unwrap();
        let buf = vec![0x5au8; MIB as usize];
        let mut written = 0u64;
        loop {
            match f.write(&buf) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("write: {e}"),
            }
        }
        written
    }

    /// Unmounts, retrying while busy: something else (udev probing a loop device, a
    /// child another test forked before its exec) can hold the filesystem for a moment;
    /// the daemon retries a busy unmount, and so do the tests.
    fn unmount_settled(mp: &Path) {
        let start = Instant::now();
        loop {
            match unmount(mp) {
                Ok(()) => return,
                Err(ImageError::Busy { .. }) if start.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("unmount: {e}"),
            }
        }
    }

    fn check_fill(mp: &Path, size: u64) -> u64 {
        let t = Instant::now();
        let file = mp.join("big");
        let written = fill(&file);
        eprintln!(
            "quota {} MiB: wrote {written} bytes (+{:.3} %) in {:?}",
            size / MIB,
            (written as f64 / size as f64 - 1.0) * 100.0,
            t.elapsed()
        );
        assert!(written >= size, "wrote {written} < quota {size}");
        assert!(
            written <= size + size * 3 / 100,
            "wrote {written}, quota {size}"
        );
        fs::remove_file(&file).unwrap();
        written
    }

    #[test]
    fn small_image_quota_inodes_owner_and_release() {
        let dir = TestDir::new("small");
        let (img, mp) = (dir.path("ws.img"), dir.path("mnt"));
        let (size, inodes) = (16 * MIB, 1000);
        let t = Instant::now();
        create(&img, size, inodes).unwrap();
        let t_create = t.elapsed();
        let alloc = allocated_bytes(&img).unwrap();
        assert!(alloc < MIB, "new image allocates {alloc}");
        assert_eq!(
            fs::metadata(&img).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let t = Instant::now();
        let m = mount(&img, &mp).unwrap();
        let t_mount = t.elapsed();
        eprintln!(
            "16 MiB: len {} create {t_create:?} mount {t_mount:?} alloc {alloc} dio {}",
            fs::metadata(&img).unwrap().len(),
            m.direct_io
        );
        assert!(is_mounted(&mp));
        let root = fs::metadata(&mp).unwrap();
        assert_eq!((root.uid(), root.gid()), (ROOT_OWNER, ROOT_OWNER));
        assert_eq!(fs::read_dir(&mp).unwrap().count(), 0, "root not empty");
        let u = usage(&mp).unwrap();
        eprintln!("16 MiB usage: {u:?}");
        assert_eq!(free_bytes(&mp).unwrap(), u.avail_bytes);
        assert!(free_bytes(&dir.0).unwrap() > size);
        assert!(matches!(
            free_bytes(&dir.path("nope")),
            Err(ImageError::Stat { .. })
        ));
        assert!(u.avail_bytes >= size && u.avail_bytes <= size + size / 100);

        check_fill(&mp, size);

        // Inode bound: at least `inodes` files, not many more.
        let files = mp.join("f");
        fs::create_dir(&files).unwrap();
        let mut created = 1u64; // the directory
        loop {
            match File::create(files.join(created.to_string())) {
                Ok(_) => created += 1,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("create: {e}"),
            }
        }
        eprintln!("16 MiB: {created} inodes usable, asked {inodes}");
        assert!(
            created >= inodes && created <= inodes + 32,
            "{created} inodes"
        );
        assert_eq!(usage(&mp).unwrap().inodes_free, 0);
        fs::remove_dir_all(&files).unwrap();

        // Busy: an open file blocks a plain unmount.
        let open = File::create(mp.join("open")).unwrap();
        assert!(matches!(unmount(&mp), Err(ImageError::Busy { .. })));
        drop(open);
        unmount_settled(&mp);
        assert!(!is_mounted(&mp));
        assert!(matches!(unmount(&mp), Err(ImageError::NotMounted { .. })));
        // Autoclear released the device (another process may have taken it since).
        let n = m
            .loop_device
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let backing = format!("/sys/block/{n}/loop/backing_file");
        let start = Instant::now();
        while fs::read_to_string(&backing).is_ok_and(|b| Path::new(b.trim_end()) == img) {
            assert!(start.elapsed() < Duration::from_secs(2), "{n} not released");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_no_loop(&img);
    }

    #[test]
    fn journal_replay_after_simulated_crash() {
        let dir = TestDir::new("crash");
        let (img, mp) = (dir.path("ws.img"), dir.path("mnt"));
        create(&img, 16 * MIB, 256).unwrap();
        mount(&img, &mp).unwrap();
        let mut f = File::create(mp.join("synced")).unwrap();
        f.write_all(b"durable").unwrap();
        f.sync_all().unwrap();
        drop(f);
        File::open(&mp).unwrap().sync_all().unwrap();
        fs::create_dir(mp.join("unsynced")).unwrap();
        // Like a host crash: the filesystem stops without flushing its journal.
        let root = File::open(&mp).unwrap();
        loopdev::ext4_shutdown_nologflush(root.as_fd()).unwrap();
        drop(root);
        assert!(fs::write(mp.join("late"), b"x").is_err());
        unmount_settled(&mp);
        assert_no_loop(&img);
        mount(&img, &mp).unwrap();
        assert_eq!(fs::read(mp.join("synced")).unwrap(), b"durable");
        fs::write(mp.join("late"), b"x").unwrap();
        unmount_settled(&mp);
    }

    #[test]
    fn large_image_quota() {
        let dir = TestDir::new("large");
        let (img, mp) = (dir.path("ws.img"), dir.path("mnt"));
        let size = 512 * MIB;
        let t = Instant::now();
        create(&img, size, 4096).unwrap();
        let t_create = t.elapsed();
        let t = Instant::now();
        mount(&img, &mp).unwrap();
        eprintln!(
            "512 MiB: len {} create {t_create:?} mount {:?} alloc {}",
            fs::metadata(&img).unwrap().len(),
            t.elapsed(),
            allocated_bytes(&img).unwrap()
        );
        eprintln!("512 MiB usage: {:?}", usage(&mp).unwrap());
        check_fill(&mp, size);
        unmount_settled(&mp);
        assert_no_loop(&img);
    }

    #[test]
    fn overhead_at_4g_and_64g() {
        let dir = TestDir::new("sizes");
        for (name, size) in [("4g", 4u64 << 30), ("64g", 64 << 30)] {
            let (img, mp) = (dir.path(name), dir.path(&format!("{name}.mnt")));
            let t = Instant::now();
            create(&img, size, 4096).unwrap();
            let t_create = t.elapsed();
            let t = Instant::now();
            mount(&img, &mp).unwrap();
            let t_mount = t.elapsed();
            let u = usage(&mp).unwrap();
            let len = fs::metadata(&img).unwrap().len();
            let alloc = allocated_bytes(&img).unwrap();
            eprintln!(
                "{name}: len {len} (+{:.2} %) avail {} (+{:.3} %) create {t_create:?} \
                 mount {t_mount:?} alloc {alloc} inodes {}",
                (len as f64 / size as f64 - 1.0) * 100.0,
                u.avail_bytes,
                (u.avail_bytes as f64 / size as f64 - 1.0) * 100.0,
                u.inodes_total
            );
            assert!(u.avail_bytes >= size && u.avail_bytes <= size + size / 100);
            assert!(alloc < 4 * MIB, "new image allocates {alloc}");
            unmount_settled(&mp);
            fs::remove_file(&img).unwrap();
        }
    }

    #[test]
    fn remount_keeps_data_and_trim_frees_space() {
        let dir = TestDir::new("remount");
        let (img, mp) = (dir.path("ws.img"), dir.path("a/b/mnt"));
        create(&img, 32 * MIB, 256).unwrap();
        mount(&img, &mp).unwrap();
        assert_eq!(fs::metadata(&mp).unwrap().uid(), ROOT_OWNER);
        fs::create_dir(mp.join("sub")).unwrap();
        fs::write(mp.join("sub/data"), b"persist me").unwrap();
        fs::write(mp.join("bulk"), vec![7u8; 8 * MIB as usize]).unwrap();
        unmount_settled(&mp);
        let mode = fs::metadata(dir.path("a")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let full = allocated_bytes(&img).unwrap();
        assert!(full >= 8 * MIB, "allocated {full}");

        mount(&img, &mp).unwrap();
        assert_eq!(fs::read(mp.join("sub/data")).unwrap(), b"persist me");
        assert_eq!(fs::metadata(mp.join("bulk")).unwrap().len(), 8 * MIB);
        fs::remove_file(mp.join("bulk")).unwrap();
        File::open(&mp).unwrap().sync_all().unwrap();
        let trimmed = trim(&mp).unwrap();
        unmount_settled(&mp);
        let after = allocated_bytes(&img).unwrap();
        eprintln!("trim: {trimmed} bytes, allocated {full} -> {after}");
        assert!(after + 7 * MIB <= full, "allocated {full} -> {after}");
        assert!(matches!(
            create(&img, 32 * MIB, 256),
            Err(ImageError::Create { .. })
        ));
        assert!(img.exists(), "create removed an existing image");
    }

    #[test]
    fn mount_table_queries() {
        let dir = TestDir::new("table");
        let (img1, img2) = (dir.path("one.img"), dir.path("two.img"));
        create(&img1, 8 * MIB, 64).unwrap();
        create(&img2, 8 * MIB, 64).unwrap();
        let outer = dir.path("x y");
        let prefix_twin = dir.path("x");
        fs::create_dir(&prefix_twin).unwrap();
        mount(&img1, &outer).unwrap();
        let inner = outer.join("nested");
        mount(&img2, &inner).unwrap();
        assert!(is_mounted(&outer) && is_mounted(&inner));
        assert!(!is_mounted(&prefix_twin), "prefix must not match");
        assert!(!is_mounted(&dir.0));
        assert!(matches!(
            mount(&img1, &outer),
            Err(ImageError::AlreadyMounted { .. })
        ));
        assert_eq!(mounts_under(&dir.0), vec![inner.clone(), outer.clone()]);
        assert_eq!(mounts_under(&outer), vec![inner.clone()]);
        assert!(mounts_under(&inner).is_empty());
        assert!(matches!(unmount(&outer), Err(ImageError::Busy { .. })));
        unmount_lazy(&outer).unwrap();
        assert!(mounts_under(&dir.0).is_empty());
        assert_no_loop(&img1);
        assert_no_loop(&img2);
    }

    #[test]
    fn corrupt_image_leaves_nothing_bound() {
        let dir = TestDir::new("corrupt");
        let (img, mp) = (dir.path("zero.img"), dir.path("mnt"));
        File::create(&img).unwrap().set_len(16 * MIB).unwrap();
        let err = mount(&img, &mp).unwrap_err();
        assert!(matches!(err, ImageError::Mount { .. }), "{err}");
        assert!(err.to_string().contains("zero.img"), "{err}");
        assert!(!is_mounted(&mp));
        assert_no_loop(&img);
    }

    #[test]
    fn create_validates_and_cleans_up() {
        let dir = TestDir::new("invalid");
        let img = dir.path("ws.img");
        assert!(matches!(
            create(&img, MIB, 64),
            Err(ImageError::Invalid { .. })
        ));
        assert!(matches!(
            create(&img, 16 * MIB, 1),
            Err(ImageError::Invalid { .. })
        ));
        assert!(!img.exists());
        assert!(matches!(
            create(&dir.path("missing/ws.img"), 16 * MIB, 64),
            Err(ImageError::Create { .. })
        ));
    }

    #[test]
    fn many_inodes_in_a_small_quota() {
        let dir = TestDir::new("inodes");
        let (img, mp) = (dir.path("ws.img"), dir.path("mnt"));
        let (size, inodes) = (16 * MIB, 100_000);
        create(&img, size, inodes).unwrap();
        mount(&img, &mp).unwrap();
        let u = usage(&mp).unwrap();
        eprintln!(
            "16 MiB, 100k inodes: len {} {u:?}",
            fs::metadata(&img).unwrap().len()
        );
        assert!(u.avail_bytes >= size && u.avail_bytes <= size + size / 100);
        assert!(u.inodes_free >= inodes);
        assert!(allocated_bytes(&img).unwrap() < MIB);
        unmount_settled(&mp);
    }
}

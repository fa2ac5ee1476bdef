//! Loop devices, ext4 mounts and filesystem statistics: the raw calls behind
//! `workspace::image`.
//!
//! Every `unsafe` block of the workspace image code lives here; each wrapper is safe
//! and returns `io::Result`. The loop ABI (`struct loop_info64`, `struct loop_config`
//! and the ioctl numbers) is copied from `<linux/loop.h>` because `libc` lacks it.

use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// `LOOP_CLR_FD`: detach the backing file (deferred to the last close).
const LOOP_CLR_FD: libc::Ioctl = 0x4C01;
/// `LOOP_GET_STATUS64`: read `struct loop_info64`.
const LOOP_GET_STATUS64: libc::Ioctl = 0x4C05;
/// `LOOP_CONFIGURE` (Linux 5.8+): attach a backing file and set status in one call.
const LOOP_CONFIGURE: libc::Ioctl = 0x4C0A;
/// `LOOP_CTL_GET_FREE`: find or create an unbound loop device, returns its number.
const LOOP_CTL_GET_FREE: libc::Ioctl = 0x4C82;
/// `FITRIM`: `_IOWR('X', 121, struct fstrim_range)`.
const FITRIM: libc::Ioctl = 0xC018_5879;

/// `LO_FLAGS_READ_ONLY`: the loop device rejects writes.
pub const LO_FLAGS_READ_ONLY: u32 = 1;
/// `LO_FLAGS_AUTOCLEAR`: the device detaches itself when its last opener (e.g. the
/// mounted filesystem) closes it.
pub const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// `LO_FLAGS_DIRECT_IO`: the device reads and writes the backing file with
/// `O_DIRECT`, so its data is not cached twice.
pub const LO_FLAGS_DIRECT_IO: u32 = 16;

/// `LO_NAME_SIZE` from `<linux/loop.h>`.
const LO_NAME_SIZE: usize = 64;
/// `LO_KEY_SIZE` from `<linux/loop.h>`.
const LO_KEY_SIZE: usize = 32;

/// `struct loop_info64` from `<linux/loop.h>` (232 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

/// `struct loop_config` from `<linux/loop.h>` (304 bytes).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// `struct fstrim_range` from `<linux/fs.h>`.
#[repr(C)]
struct FstrimRange {
    start: u64,
    len: u64,
    minlen: u64,
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);
const _: () = assert!(std::mem::size_of::<FstrimRange>() == 24);

impl LoopInfo64 {
    fn zeroed() -> Self {
        LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; LO_NAME_SIZE],
            lo_crypt_name: [0; LO_NAME_SIZE],
            lo_encrypt_key: [0; LO_KEY_SIZE],
            lo_init: [0; 2],
        }
    }
}

/// Asks `/dev/loop-control` for a free loop device (the kernel creates one if none
/// is free) and returns its number `N` (`/dev/loopN`).
///
/// The device is not reserved: another process may bind it before we do, in which
/// case [`configure`] fails with `EBUSY` and the caller asks again.
///
/// # Errors
/// Opening `/dev/loop-control` or the ioctl fails (no loop driver, no privilege).
pub fn get_free() -> io::Result<u32> {
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/loop-control")?;
    let n = crate::syscall!(ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE))?;
    u32::try_from(n).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// The device node of loop device `n`: `/dev/loopN`.
pub fn device_path(n: u32) -> PathBuf {
    PathBuf::from(format!("/dev/loop{n}"))
}

/// Opens `/dev/loopN` read-write with `O_CLOEXEC`.
///
/// # Errors
/// The node does not exist or cannot be opened.
pub fn open_device(n: u32) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(device_path(n))
}

/// Binds `backing` to the loop device `loop_fd` with `LOOP_CONFIGURE`.
///
/// `flags` are `LO_FLAGS_*` bits, `block_size` the logical block size (0 = kernel
/// default), and `file_name` is recorded in `lo_file_name` (truncated to 63 bytes)
/// so the device can be identified.
///
/// # Errors
/// `EBUSY` when the device is already bound (a race with another process);
/// `EINVAL` for flags or a block size the kernel or backing file rejects.
pub fn configure(
    loop_fd: BorrowedFd<'_>,
    backing: BorrowedFd<'_>,
    flags: u32,
    block_size: u32,
    file_name: &OsStr,
) -> io::Result<()> {
    let backing = u32::try_from(backing.as_raw_fd())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut info = LoopInfo64::zeroed();
    info.lo_flags = flags;
    let name = file_name.as_bytes();
    let len = name.len().min(LO_NAME_SIZE - 1);
    info.lo_file_name[..len].copy_from_slice(&name[..len]);
    let config = LoopConfig {
        fd: backing,
        block_size,
        info,
        reserved: [0; 8],
    };
    let config_ptr: *const LoopConfig = &config;
    crate::syscall!(ioctl(loop_fd.as_raw_fd(), LOOP_CONFIGURE, config_ptr))?;
    Ok(())
}

/// Detaches the loop device's backing file (`LOOP_CLR_FD`). The kernel defers the
/// detach until the last opener closes the device.
///
/// # Errors
/// `ENXIO` when the device is not bound.
pub fn clear(loop_fd: BorrowedFd<'_>) -> io::Result<()> {
    crate::syscall!(ioctl(loop_fd.as_raw_fd(), LOOP_CLR_FD, 0 as libc::c_ulong))?;
    Ok(())
}

/// Returns the `LO_FLAGS_*` bits the loop device currently has (`LOOP_GET_STATUS64`),
/// e.g. to learn whether `LO_FLAGS_DIRECT_IO` took effect.
///
/// # Errors
/// `ENXIO` when the device is not bound.
pub fn flags(loop_fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut info = LoopInfo64::zeroed();
    let info_ptr: *mut LoopInfo64 = &mut info;
    crate::syscall!(ioctl(loop_fd.as_raw_fd(), LOOP_GET_STATUS64, info_ptr))?;
    Ok(info.lo_flags)
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn cpath(path: &Path) -> io::Result<CString> {
    cstring(path.as_os_str().as_bytes())
}

/// `mount(2)`: mounts `source` (a block device) of type `fstype` on `target` with
/// `MS_*` `flags` and the filesystem option string `data`.
///
/// # Errors
/// Any `mount(2)` error (`EINVAL` for a bad superblock or option, `EBUSY`, ...).
pub fn mount(
    source: &Path,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let source = cpath(source)?;
    let target = cpath(target)?;
    let fstype = cstring(fstype.as_bytes())?;
    let data = cstring(data.as_bytes())?;
    crate::syscall!(mount(
        source.as_ptr(),
        target.as_ptr(),
        fstype.as_ptr(),
        flags,
        data.as_ptr().cast::<libc::c_void>(),
    ))?;
    Ok(())
}

/// `lsetxattr(2)`: sets the extended attribute `name` of `path` (not following a final
/// symlink) to `value`.
///
/// # Errors
/// Any `lsetxattr(2)` error (`ENOTSUP` where the filesystem has no such namespace).
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let path = cpath(path)?;
    let name = cstring(name.as_bytes())?;
    crate::syscall!(lsetxattr(
        path.as_ptr(),
        name.as_ptr(),
        value.as_ptr().cast::<libc::c_void>(),
        value.len(),
        0,
    ))?;
    Ok(())
}

/// `umount2(2)` with `MNT_*`/`UMOUNT_*` `flags`.
///
/// # Errors
/// `EBUSY` when the filesystem is in use (without `MNT_DETACH`), `EINVAL` when
/// `target` is not a mount point.
pub fn umount2(target: &Path, flags: libc::c_int) -> io::Result<()> {
    let target = cpath(target)?;
    crate::syscall!(umount2(target.as_ptr(), flags))?;
    Ok(())
}

/// Filesystem statistics from `statvfs(3)`, in plain integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStat {
    /// Fundamental block size (`f_frsize`), the unit of the block counts.
    pub block_size: u64,
    /// Size of the filesystem in blocks (`f_blocks`).
    pub blocks: u64,
    /// Free blocks (`f_bfree`).
    pub blocks_free: u64,
    /// Blocks free to unprivileged writers (`f_bavail`).
    pub blocks_avail: u64,
    /// Inodes (`f_files`).
    pub files: u64,
    /// Free inodes (`f_ffree`).
    pub files_free: u64,
}

/// `statvfs(3)` on `path`.
///
/// # Errors
/// `path` cannot be resolved.
pub fn statvfs(path: &Path) -> io::Result<FsStat> {
    let path = cpath(path)?;
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
    let mut buf: libc::statvfs = unsafe { std::mem::zeroed() };
    let buf_ptr: *mut libc::statvfs = &mut buf;
    crate::syscall!(statvfs(path.as_ptr(), buf_ptr))?;
    #[allow(clippy::useless_conversion)] // the field types differ between targets.
    Ok(FsStat {
        block_size: u64::from(buf.f_frsize),
        blocks: u64::from(buf.f_blocks),
        blocks_free: u64::from(buf.f_bfree),
        blocks_avail: u64::from(buf.f_bavail),
        files: u64::from(buf.f_files),
        files_free: u64::from(buf.f_ffree),
    })
}

/// `FITRIM` on the filesystem holding `dir` (an open directory): discards every free
/// range, which on a loop device punches holes in the backing file. Returns the number
/// of bytes the kernel reports as trimmed.
///
/// # Errors
/// `EOPNOTSUPP` when the device does not support discard.
pub fn fitrim(dir: BorrowedFd<'_>) -> io::Result<u64> {
    let mut range = FstrimRange {
        start: 0,
        len: u64::MAX,
        minlen: 0,
    };
    let range_ptr: *mut FstrimRange = &mut range;
    crate::syscall!(ioctl(dir.as_raw_fd(), FITRIM, range_ptr))?;
    Ok(range.len)
}

/// `EXT4_IOC_SHUTDOWN` with `EXT4_GOING_FLAGS_NOLOGFLUSH` on the filesystem holding
/// `fd`: every later operation fails and the journal is not flushed, as in a crash.
#[cfg(test)]
pub(crate) fn ext4_shutdown_nologflush(fd: BorrowedFd<'_>) -> io::Result<()> {
    /// `_IOR('X', 125, __u32)`.
    const EXT4_IOC_SHUTDOWN: libc::Ioctl = 0x8004_587D;
    const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 2;
    let flags = EXT4_GOING_FLAGS_NOLOGFLUSH;
    let flags_ptr: *const u32 = &flags;
    crate::syscall!(ioctl(fd.as_raw_fd(), EXT4_IOC_SHUTDOWN, flags_ptr))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statvfs_root() {
        let st = statvfs(Path::new("/")).unwrap();
        assert!(st.block_size > 0 && st.blocks > 0);
        assert!(st.blocks_avail <= st.blocks_free);
    }

    #[test]
    fn nul_in_path_is_invalid_input() {
        let err = umount2(Path::new("/tmp/a\0b"), 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}

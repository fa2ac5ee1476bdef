//! The mount table of this process (`/proc/self/mountinfo`): is a path a mount point,
//! and what is mounted under a directory. Used by the workspace images (their mounts
//! and the startup sweep) and by egress (the data directory's shared mount).

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Decodes the octal escapes (`\040` space, `\011` tab, `\012` newline, `\134`
/// backslash) the kernel writes in mountinfo paths.
fn unescape_mount_path(field: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let digits = field.get(i + 1..i + 4);
        if field[i] == b'\\' {
            if let Some(d) = digits.filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c))) {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                if let Ok(b) = u8::try_from(v) {
                    out.push(b);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(field[i]);
        i += 1;
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

/// Mount points listed in `mountinfo` content, in table order (field 5).
fn parse_mount_points(mountinfo: &[u8]) -> Vec<PathBuf> {
    mountinfo
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .map(unescape_mount_path)
        .collect()
}

/// Mount points of this process's mount namespace; empty if unreadable.
fn mount_points() -> Vec<PathBuf> {
    match fs::read("/proc/self/mountinfo") {
        Ok(content) => parse_mount_points(&content),
        Err(e) => {
            log::warn!("reading /proc/self/mountinfo: {e}");
            Vec::new()
        }
    }
}

/// `path` with symlinks resolved when it exists (mountinfo lists resolved paths).
fn resolved(path: &Path) -> PathBuf {
    fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Whether something is mounted exactly at `mountpoint` (a mount point field of
/// `/proc/self/mountinfo` equals the path; `/tmp/x` does not match `/tmp/xy` nor
/// `/tmp/x/y`). The path should be absolute; it is resolved first if it exists.
pub fn is_mounted(mountpoint: &Path) -> bool {
    let target = resolved(mountpoint);
    mount_points().contains(&target)
}

/// Every mount point strictly under `prefix` (not `prefix` itself), deepest first,
/// later mounts before earlier ones at equal depth (a point mounted twice appears
/// twice): the order to unmount them in. For the startup sweep of what a crashed
/// daemon left under its own data directory.
pub fn mounts_under(prefix: &Path) -> Vec<PathBuf> {
    let prefix = resolved(prefix);
    let mut found: Vec<PathBuf> = mount_points()
        .into_iter()
        .rev()
        .filter(|p| p.starts_with(&prefix) && *p != prefix)
        .collect();
    // Stable: keeps the reversed table order among equal depths.
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_parsing() {
        let info = b"36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 - ext3 /dev/root rw\n\
                     37 35 98:0 / /x\\134y\\011z rw - ext4 /dev/loop0 rw\n";
        assert_eq!(
            parse_mount_points(info),
            vec![PathBuf::from("/mnt/a b"), PathBuf::from("/x\\y\tz")]
        );
        assert_eq!(unescape_mount_path(b"/a\\9"), PathBuf::from("/a\\9"));
        assert_eq!(unescape_mount_path(b"/a\\0"), PathBuf::from("/a\\0"));
    }
}

//! Host-side file operations confined to a session workspace.
//!
//! It stays one file (~1,100 lines of code): every operation shares one confinement
//! discipline (an fd of the root, `openat2` with the same flags, the same rules for the
//! final component), and whoever checks that none escapes the workspace should read them
//! side by side.
//!
//! The sandboxed code owns the workspace and can change it while we work on it: it can
//! create symlinks pointing anywhere, swap a directory for a symlink mid-operation and
//! use any bytes in names. Every operation here therefore works from an fd of the
//! workspace root ([`Root`]) and never from a path string:
//!
//! * a request path is first [`normalize`]d lexically (leading `/` stripped, `.` and `..`
//!   collapsed without ever climbing above the root);
//! * it is then resolved by the kernel with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`: symlinks that stay inside the workspace
//!   are followed, any that would leave it (absolute ones, or relative ones climbing out)
//!   make the call fail with `EXDEV`, reported as [`FsError::InvalidPath`];
//! * operations on the final component that must not follow it (delete, create, rename,
//!   `lstat`) open the parent that way and act on the bare name with `*at` calls;
//! * recursive walks and deletes never follow symlinks at all: each subdirectory is opened
//!   from its parent's fd with `O_NOFOLLOW` and `RESOLVE_NO_SYMLINKS`, so swapping a
//!   directory for a symlink mid-walk makes the open fail instead of escaping
//!   (the CVE-2022-21658 class of races).

use std::collections::BinaryHeap;
use std::ffi::{CStr, CString};
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::sys::fsat::{self, FileStat};

/// Longest request path accepted by [`normalize`], in bytes.
pub const MAX_PATH_LEN: usize = 4096;
/// Longest single path component accepted by [`normalize`], in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Directory depth below which [`walk_files`] and [`tree_size`] stop descending.
pub const MAX_WALK_DEPTH: usize = 64;
/// Prefix of the temporary files [`create_upload`] writes before renaming into place.
pub const UPLOAD_TEMP_PREFIX: &str = ".isobox-upload-";

/// Directory fds [`remove`] keeps open at once; deeper subtrees are first moved up.
const MAX_HELD_DEPTH: usize = 64;
/// How often [`remove`] rescans a directory that refuses to become empty.
const MAX_REMOVE_PASSES: u32 = 16;
/// How often [`remove`] tolerates an entry flipping between directory and non-directory.
const MAX_REMOVE_FLIPS: u32 = 1024;
/// Prefix of the names deep subtrees get when [`remove`] moves them up.
const REMOVE_TEMP_PREFIX: &str = ".isobox-delete-";

/// Resolution confined to the directory fd, following only symlinks that stay beneath it.
const BENEATH: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_XDEV;
/// Resolution of a single name in a directory fd that follows no symlink at all.
const NO_SYMLINKS: u64 = BENEATH | libc::RESOLVE_NO_SYMLINKS;

/// Why a workspace operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The path is malformed, too long, or resolves outside the workspace.
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// Nothing exists at the path.
    #[error("not found")]
    NotFound,
    /// A directory was expected (the target or one of its parents) but something else is there.
    #[error("not a directory")]
    NotADirectory,
    /// A regular file was expected but the path names something else (directory, FIFO, ...).
    #[error("not a regular file")]
    NotAFile,
    /// The path names a directory where a file was expected (e.g. as an upload target).
    #[error("is a directory")]
    IsADirectory,
    /// The workspace is full (`ENOSPC`, `EDQUOT` or `EFBIG`).
    #[error("no space left in the workspace")]
    NoSpace,
    /// Any other I/O error.
    #[error("i/o error: {0}")]
    Io(io::Error),
}

impl From<io::Error> for FsError {
    fn from(e: io::Error) -> Self {
        map_io(e)
    }
}

/// Maps an I/O error from writing into the workspace: `ENOSPC`, `EDQUOT` and `EFBIG`
/// become [`FsError::NoSpace`], everything else [`FsError::Io`].
pub fn map_io(e: io::Error) -> FsError {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => FsError::NoSpace,
        _ => FsError::Io(e),
    }
}

/// Maps an error from resolving a path beneath the root.
fn map_resolve(e: io::Error) -> FsError {
    match e.raw_os_error() {
        Some(libc::ENOENT) => FsError::NotFound,
        Some(libc::ENOTDIR) => FsError::NotADirectory,
        Some(libc::EXDEV) => FsError::InvalidPath("path leaves the workspace".into()),
        Some(libc::ELOOP) => FsError::InvalidPath("too many levels of symbolic links".into()),
        Some(libc::ENAMETOOLONG) => FsError::InvalidPath("path is too long".into()),
        _ => map_io(e),
    }
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// A normalized path relative to the workspace root: a list of components, none of them
/// empty, `.`, `..`, containing `/` or NUL, or longer than [`MAX_NAME_LEN`].
/// No components means the root itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct RelPath {
    components: Vec<Vec<u8>>,
}

impl RelPath {
    /// The workspace root itself.
    pub fn root() -> Self {
        Self::default()
    }

    /// Whether this is the workspace root.
    pub fn is_root(&self) -> bool {
        self.components.is_empty()
    }

    /// The components, outermost first.
    pub fn components(&self) -> &[Vec<u8>] {
        &self.components
    }

    /// The last component, or `None` for the root.
    pub fn file_name(&self) -> Option<&[u8]> {
        self.components.last().map(Vec::as_slice)
    }

    /// The parent directory (the root is its own parent).
    pub fn parent(&self) -> RelPath {
        let n = self.components.len().saturating_sub(1);
        RelPath {
            components: self.components[..n].to_vec(),
        }
    }

    /// The path as bytes with `/` separators and no leading `/` (empty for the root).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.components.join(&b'/')
    }

    /// The path for responses: `/` followed by the components joined with `/`, invalid
    /// UTF-8 replaced by U+FFFD (JSON encoding escapes the rest). For logs use the
    /// [`fmt::Display`] impl, which escapes control characters and shows raw bytes.
    pub fn display(&self) -> String {
        let mut b =
            Vec::with_capacity(1 + self.components.iter().map(|c| c.len() + 1).sum::<usize>());
        b.push(b'/');
        b.extend_from_slice(&self.to_bytes());
        String::from_utf8_lossy(&b).into_owned()
    }

    /// The path as a C string for `openat2` (`.` for the root).
    fn to_cstring(&self) -> Result<CString, FsError> {
        if self.is_root() {
            return Ok(c".".to_owned());
        }
        CString::new(self.to_bytes())
            .map_err(|_| FsError::InvalidPath("path contains a NUL byte".into()))
    }
}

/// Shows the path as `/a/b` for logs and messages: invalid UTF-8 bytes appear as `\xNN`,
/// control characters and `\` escaped, so a hostile name cannot forge log lines.
impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            return f.write_str("/");
        }
        for c in &self.components {
            f.write_str("/")?;
            for chunk in c.utf8_chunks() {
                for ch in chunk.valid().chars() {
                    if ch.is_control() || ch == '\\' || ch == '"' {
                        write!(f, "{}", ch.escape_default())?;
                    } else {
                        write!(f, "{ch}")?;
                    }
                }
                for b in chunk.invalid() {
                    write!(f, "\\x{b:02x}")?;
                }
            }
        }
        Ok(())
    }
}

/// Normalizes a raw request path into a [`RelPath`] confined to the workspace.
///
/// Leading and repeated `/` are ignored, `.` is dropped and `..` removes the previous
/// component but never climbs above the root (`../../etc/passwd` → `etc/passwd`,
/// `a/../../b` → `b`). Empty, `.` and `/` name the root. Any other bytes, including
/// non-UTF-8 ones, are kept as they are so every name the sandbox created is addressable.
///
/// # Errors
/// [`FsError::InvalidPath`] for a NUL byte, a path over [`MAX_PATH_LEN`] bytes or a
/// component over [`MAX_NAME_LEN`] bytes.
pub fn normalize(raw: &[u8]) -> Result<RelPath, FsError> {
    if raw.contains(&0) {
        return Err(FsError::InvalidPath("path contains a NUL byte".into()));
    }
    if raw.len() > MAX_PATH_LEN {
        return Err(FsError::InvalidPath(format!(
            "path is longer than {MAX_PATH_LEN} bytes"
        )));
    }
    let mut components: Vec<Vec<u8>> = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        if c.len() > MAX_NAME_LEN {
            return Err(FsError::InvalidPath(format!(
                "path component is longer than {MAX_NAME_LEN} bytes"
            )));
        }
        match c {
            b"" | b"." => {}
            b".." => {
                components.pop();
            }
            _ => components.push(c.to_vec()),
        }
    }
    Ok(RelPath { components })
}

/// Turns one directory-entry name into a C string, refusing anything that is not a
/// single plain component.
fn name_cstring(name: &[u8]) -> Result<CString, FsError> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(FsError::InvalidPath("not a single path component".into()));
    }
    CString::new(name).map_err(|_| FsError::InvalidPath("path contains a NUL byte".into()))
}

/// An open handle on a workspace root; all operations resolve paths beneath it.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
}

impl Root {
    /// Opens the workspace directory at `path` (a trusted host path) as an `O_PATH` fd.
    /// The final component must be a directory, not a symlink.
    ///
    /// # Errors
    /// When the directory cannot be opened.
    pub fn open(path: &Path) -> io::Result<Root> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        Ok(Root {
            fd: OwnedFd::from(file),
        })
    }

    /// Wraps an already open directory fd (`O_PATH` is fine).
    pub fn from_fd(fd: OwnedFd) -> Root {
        Root { fd }
    }

    /// Opens `rel` beneath the root with `flags`, following only in-tree symlinks.
    fn resolve(&self, rel: &RelPath, flags: i32) -> Result<OwnedFd, FsError> {
        fsat::openat2(self.fd.as_fd(), &rel.to_cstring()?, flags, 0, BENEATH).map_err(map_resolve)
    }

    /// Opens the parent of `rel` (which must not be the root) and returns it with the
    /// final name.
    fn open_parent(&self, rel: &RelPath, flags: i32) -> Result<(OwnedFd, CString), FsError> {
        let name = rel
            .file_name()
            .ok_or_else(|| FsError::InvalidPath("the workspace root has no parent".into()))?;
        let name = name_cstring(name)?;
        let dir = self.resolve(&rel.parent(), flags | libc::O_DIRECTORY)?;
        Ok((dir, name))
    }
}

impl AsFd for Root {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn mtime(st: &FileStat) -> SystemTime {
    let nanos = Duration::from_nanos(u64::try_from(st.mtime_nsec).unwrap_or(0));
    let t = if st.mtime_sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(st.mtime_sec.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(st.mtime_sec.unsigned_abs()))
    };
    t.and_then(|t| t.checked_add(nanos)).unwrap_or(UNIX_EPOCH)
}

fn millis(st: &FileStat) -> u64 {
    mtime(st)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File {
        /// Size in bytes.
        size: u64,
        /// Last modification time.
        mtime: SystemTime,
    },
    /// A directory.
    Dir {
        /// Last modification time.
        mtime: SystemTime,
    },
    /// A symbolic link (only from [`lstat`]).
    Symlink,
    /// A FIFO, socket or device node.
    Other,
}

fn kind_of(st: &FileStat) -> Kind {
    match st.file_type() {
        libc::S_IFREG => Kind::File {
            size: st.size,
            mtime: mtime(st),
        },
        libc::S_IFDIR => Kind::Dir { mtime: mtime(st) },
        libc::S_IFLNK => Kind::Symlink,
        _ => Kind::Other,
    }
}

/// Stats `rel`, following symlinks that stay inside the workspace (as a GET serves them).
/// Never returns [`Kind::Symlink`]. Never opens the target for reading, so a FIFO cannot
/// block it.
///
/// # Errors
/// [`FsError::NotFound`] (also for a dangling symlink), [`FsError::InvalidPath`] for a
/// symlink leading out of the workspace or a symlink loop, [`FsError::NotADirectory`] when
/// a parent component is not a directory.
pub fn stat(root: &Root, rel: &RelPath) -> Result<Kind, FsError> {
    let fd = root.resolve(rel, libc::O_PATH)?;
    Ok(kind_of(&fsat::fstat(fd.as_fd())?))
}

/// Stats `rel` without following the final component (parents may be in-tree symlinks).
/// The root is always a [`Kind::Dir`].
///
/// # Errors
/// As [`stat`], except that a final symlink is reported as [`Kind::Symlink`].
pub fn lstat(root: &Root, rel: &RelPath) -> Result<Kind, FsError> {
    if rel.is_root() {
        return stat(root, rel);
    }
    let (dir, name) = root.open_parent(rel, libc::O_PATH)?;
    let st = fsat::fstatat(dir.as_fd(), &name, libc::AT_SYMLINK_NOFOLLOW).map_err(map_resolve)?;
    Ok(kind_of(&st))
}

/// One entry of a [`Listing`], describing the entry itself (a symlink is not followed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The name's exact bytes.
    pub name: Vec<u8>,
    /// Size in bytes for regular files, 0 for anything else.
    pub size: u64,
    /// Whether the entry is a directory (false for a symlink to one).
    pub dir: bool,
    /// Whether the entry is a symbolic link.
    pub symlink: bool,
    /// Last modification time of the entry itself.
    pub mod_time: SystemTime,
    /// The same in milliseconds since the Unix epoch (0 for earlier times).
    pub mod_time_ms: u64,
}

/// The result of [`list_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Entries sorted by name bytes, at most `max_entries` of them.
    pub entries: Vec<DirEntry>,
    /// Whether the directory had more entries than were returned.
    pub truncated: bool,
}

/// Lists the directory `rel` (following in-tree symlinks to reach it): the first
/// `max_entries` entries by name-byte order, without `.` and `..`.
///
/// All names are scanned but only the smallest `max_entries` are kept (a bounded heap),
/// and only those are stat'ed, so huge directories cost memory proportional to
/// `max_entries` only. Entries removed between the scan and the stat are skipped.
///
/// # Errors
/// [`FsError::NotADirectory`] when `rel` is not a directory, plus the resolution errors of
/// [`stat`].
pub fn list_dir(root: &Root, rel: &RelPath, max_entries: usize) -> Result<Listing, FsError> {
    let dir = root.resolve(rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let mut heap: BinaryHeap<Vec<u8>> = BinaryHeap::new();
    let mut total: usize = 0;
    fsat::read_dir(dir.as_fd(), |name, _| {
        total += 1;
        if heap.len() < max_entries {
            heap.push(name.to_vec());
        } else if let Some(mut top) = heap.peek_mut() {
            if name < top.as_slice() {
                top.clear();
                top.extend_from_slice(name);
            }
        }
        Ok(true)
    })
    .map_err(map_resolve)?;
    let truncated = total > heap.len();
    let names = heap.into_sorted_vec();
    let mut entries = Vec::with_capacity(names.len());
    for name in names {
        let cname = name_cstring(&name)?;
        let st = match fsat::fstatat(dir.as_fd(), &cname, libc::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(e) if errno(&e) == libc::ENOENT => continue,
            Err(e) => return Err(FsError::Io(e)),
        };
        entries.push(DirEntry {
            size: if st.is_file() { st.size } else { 0 },
            dir: st.is_dir(),
            symlink: st.is_symlink(),
            mod_time: mtime(&st),
            mod_time_ms: millis(&st),
            name,
        });
    }
    Ok(Listing { entries, truncated })
}

/// Opens a regular file for reading and returns it with its size. In-tree symlinks are
/// followed.
///
/// The path is first opened `O_PATH` and checked to be a regular file, so FIFOs and
/// device nodes are never opened; the real open then uses `O_NONBLOCK` (cleared
/// afterwards) and is checked again, so a FIFO swapped in between cannot block us either.
///
/// # Errors
/// [`FsError::NotAFile`] for anything but a regular file (directories included), plus
/// the resolution errors of [`stat`].
pub fn open_read(root: &Root, rel: &RelPath) -> Result<(File, u64), FsError> {
    let probe = root.resolve(rel, libc::O_PATH)?;
    if !fsat::fstat(probe.as_fd())?.is_file() {
        return Err(FsError::NotAFile);
    }
    drop(probe);
    let fd = root.resolve(rel, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY)?;
    let st = fsat::fstat(fd.as_fd())?;
    if !st.is_file() {
        return Err(FsError::NotAFile);
    }
    fsat::clear_nonblocking(fd.as_fd())?;
    Ok((File::from(fd), st.size))
}

fn random_name(prefix: &str) -> Result<CString, FsError> {
    let mut bytes = [0u8; 8];
    fsat::getrandom(&mut bytes).map_err(FsError::Io)?;
    let mut name = String::with_capacity(prefix.len() + 16);
    name.push_str(prefix);
    for b in bytes {
        name.push_str(&format!("{b:02x}"));
    }
    CString::new(name).map_err(|_| FsError::InvalidPath("bad temporary name".into()))
}

/// Opens the directory `rel`, creating missing components one at a time (mode 0755,
/// owned by `uid:gid`). Existing components may be in-tree symlinks to directories.
fn ensure_dir(root: &Root, rel: &RelPath, uid: u32, gid: u32) -> Result<OwnedFd, FsError> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY;
    match root.resolve(rel, flags) {
        Err(FsError::NotFound) => {}
        other => return other,
    }
    let mut cur = root.resolve(&RelPath::root(), flags)?;
    for i in 0..rel.components.len() {
        let prefix = RelPath {
            components: rel.components[..=i].to_vec(),
        };
        let name = name_cstring(&rel.components[i])?;
        let mut attempts = 0;
        cur = loop {
            match root.resolve(&prefix, flags) {
                Ok(fd) => break fd,
                Err(FsError::NotFound) => {}
                Err(e) => return Err(e),
            }
            attempts += 1;
            if attempts > 4 {
                // Something that is not a directory (a dangling symlink) keeps the name.
                return Err(FsError::NotADirectory);
            }
            match fsat::mkdirat(cur.as_fd(), &name, 0o755) {
                Ok(()) => {}
                Err(e) if errno(&e) == libc::EEXIST => continue,
                Err(e) => return Err(map_resolve(e)),
            }
            // Open exactly what we created (no symlink) to set owner and mode.
            match fsat::openat2(cur.as_fd(), &name, flags | libc::O_NOFOLLOW, 0, NO_SYMLINKS) {
                Ok(fd) => {
                    fsat::fchown(fd.as_fd(), uid, gid)?;
                    fsat::fchmod(fd.as_fd(), 0o755)?;
                    break fd;
                }
                Err(e) if matches!(errno(&e), libc::ENOENT | libc::ELOOP | libc::ENOTDIR) => {
                    continue
                }
                Err(e) => return Err(map_resolve(e)),
            }
        };
    }
    Ok(cur)
}

/// A file being uploaded into the workspace: written to a temporary name in the target
/// directory and renamed into place by [`Upload::commit`]. Dropping it without
/// committing removes the temporary file.
#[derive(Debug)]
pub struct Upload {
    dir: OwnedFd,
    tmp: CString,
    name: CString,
    file: File,
    done: bool,
}

impl Upload {
    /// The temporary file, to write the content into.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Flushes the file to disk and renames it onto the final name (replacing a file or a
    /// symlink there, never following it). Returns the size of the file.
    ///
    /// # Errors
    /// [`FsError::IsADirectory`] when a directory now has the final name,
    /// [`FsError::NoSpace`] when the flush hits the quota; the temporary file is removed
    /// on every error.
    pub fn commit(mut self) -> Result<u64, FsError> {
        self.file.flush().map_err(map_io)?;
        self.file.sync_all().map_err(map_io)?;
        let size = fsat::fstat(self.file.as_fd())?.size;
        match fsat::renameat(self.dir.as_fd(), &self.tmp, self.dir.as_fd(), &self.name) {
            Ok(()) => {
                self.done = true;
                // The new name is durable only once its directory is: a power loss
                // before that could lose a file already answered as written. The
                // rename is done either way, so a failure here is logged, not answered.
                let synced = fsat::openat2(
                    self.dir.as_fd(),
                    c".",
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    0,
                    NO_SYMLINKS,
                )
                .and_then(|d| File::from(d).sync_all());
                if let Err(e) = synced {
                    crate::error_limited!("upload: syncing the directory after the rename: {e}");
                }
                Ok(size)
            }
            Err(e) if matches!(errno(&e), libc::EISDIR | libc::ENOTEMPTY | libc::EEXIST) => {
                Err(FsError::IsADirectory)
            }
            Err(e) => Err(map_resolve(e)),
        }
    }

    /// Gives up the upload and removes the temporary file.
    pub fn abort(self) {}
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.done {
            let _ = fsat::unlinkat(self.dir.as_fd(), &self.tmp, 0);
        }
    }
}

/// Starts an upload to `rel`: creates missing parent directories (0755, `uid:gid`) and a
/// temporary file `.isobox-upload-<hex>` (0644, `uid:gid`) next to the target.
///
/// Parents are resolved beneath the root (in-tree symlinks followed); the final name is
/// never followed: committing replaces a symlink there rather than writing through it.
///
/// # Errors
/// [`FsError::InvalidPath`] for the root or a path leading outside,
/// [`FsError::NotADirectory`] when an existing parent is not a directory,
/// [`FsError::IsADirectory`] when `rel` is an existing directory.
pub fn create_upload(root: &Root, rel: &RelPath, uid: u32, gid: u32) -> Result<Upload, FsError> {
    let Some(name) = rel.file_name() else {
        return Err(FsError::InvalidPath(
            "cannot write to the workspace root".into(),
        ));
    };
    let name = name_cstring(name)?;
    let dir = ensure_dir(root, &rel.parent(), uid, gid)?;
    match fsat::fstatat(dir.as_fd(), &name, libc::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if st.is_dir() => return Err(FsError::IsADirectory),
        Ok(_) => {}
        Err(e) if errno(&e) == libc::ENOENT => {}
        Err(e) => return Err(map_resolve(e)),
    }
    let mut attempts = 0;
    let (tmp, fd) = loop {
        let tmp = random_name(UPLOAD_TEMP_PREFIX)?;
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW;
        match fsat::openat2(dir.as_fd(), &tmp, flags, 0o644, NO_SYMLINKS) {
            Ok(fd) => break (tmp, fd),
            Err(e) if errno(&e) == libc::EEXIST && attempts < 8 => attempts += 1,
            Err(e) => return Err(map_resolve(e)),
        }
    };
    let upload = Upload {
        dir,
        tmp,
        name,
        file: File::from(fd),
        done: false,
    };
    fsat::fchown(upload.file.as_fd(), uid, gid)?;
    fsat::fchmod(upload.file.as_fd(), 0o644)?;
    Ok(upload)
}

/// Writes `bytes` to `rel` atomically ([`create_upload`], write, [`Upload::commit`]) and
/// returns the number of bytes written.
///
/// # Errors
/// As [`create_upload`] and [`Upload::commit`]; [`FsError::NoSpace`] when the workspace
/// is full.
pub fn write_file(
    root: &Root,
    rel: &RelPath,
    bytes: &[u8],
    uid: u32,
    gid: u32,
) -> Result<u64, FsError> {
    let mut upload = create_upload(root, rel, uid, gid)?;
    upload.file().write_all(bytes).map_err(map_io)?;
    upload.commit()
}

/// Removes `rel`: a file, symlink (the link itself) or other non-directory is unlinked, a
/// directory is removed recursively without ever following a symlink
/// (see [`remove_all_at`]). In-tree symlinks in the parent components are followed.
///
/// # Errors
/// [`FsError::InvalidPath`] for the root or a path leading outside,
/// [`FsError::NotFound`] when nothing is there.
pub fn remove(root: &Root, rel: &RelPath) -> Result<(), FsError> {
    if rel.is_root() {
        return Err(FsError::InvalidPath(
            "cannot delete the workspace root".into(),
        ));
    }
    let (dir, name) = root.open_parent(rel, libc::O_PATH)?;
    match fsat::unlinkat(dir.as_fd(), &name, 0) {
        Ok(()) => Ok(()),
        Err(e) if errno(&e) == libc::EISDIR => remove_all_at(dir.as_fd(), name.as_bytes()),
        Err(e) => Err(map_resolve(e)),
    }
}

/// Removes the host directory (or file) at `path`, a trusted host path such as a whole
/// session directory, with the same symlink-safe recursion as [`remove`]. The parent
/// of `path` is resolved normally; nothing below it follows symlinks.
///
/// # Errors
/// [`FsError::NotFound`] when nothing is at `path`, [`FsError::InvalidPath`] when `path`
/// has no final component.
pub fn remove_host_path(path: &Path) -> Result<(), FsError> {
    use std::os::unix::ffi::OsStrExt;
    let name = path
        .file_name()
        .ok_or_else(|| FsError::InvalidPath("path has no final component".into()))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent = Root::open(parent).map_err(map_resolve)?;
    remove_all_at(parent.as_fd(), name.as_bytes())
}

/// One directory being emptied by [`remove_all_at`].
struct RmFrame {
    fd: OwnedFd,
    /// Its name in the parent frame's directory.
    name: CString,
    /// Subdirectory names still to handle.
    pending: Vec<Vec<u8>>,
    scanned: bool,
    passes: u32,
}

/// Unlinks every non-directory in `dir` and collects the subdirectory names in `pending`.
fn rm_scan(dir: BorrowedFd<'_>, pending: &mut Vec<Vec<u8>>) -> io::Result<()> {
    fsat::read_dir(dir, |name, d_type| {
        let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        let is_dir = match d_type {
            libc::DT_DIR => true,
            libc::DT_UNKNOWN => match fsat::fstatat(dir, &cname, libc::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st.is_dir(),
                Err(e) if errno(&e) == libc::ENOENT => return Ok(true),
                Err(e) => return Err(e),
            },
            _ => false,
        };
        if is_dir {
            pending.push(name.to_vec());
            return Ok(true);
        }
        match fsat::unlinkat(dir, &cname, 0) {
            Ok(()) => {}
            Err(e) if errno(&e) == libc::ENOENT => {}
            Err(e) if errno(&e) == libc::EISDIR => pending.push(name.to_vec()),
            Err(e) => return Err(e),
        }
        Ok(true)
    })
}

/// Removes the entry `name` of the directory `parent` whatever it is, recursively for a
/// directory, without following any symlink and without leaving `parent`'s subtree.
///
/// Every subdirectory is opened from its parent's fd by name with `O_NOFOLLOW` and
/// `RESOLVE_NO_SYMLINKS`, its entries are unlinked by name, and it is removed with
/// `unlinkat(AT_REMOVEDIR)`; an entry that turns from a directory into a symlink or file
/// is simply unlinked. The walk uses an explicit stack holding at most 64 directory fds:
/// deeper subtrees are renamed up into the directory being removed and handled from
/// there, so any depth works. Directories that keep refilling are rescanned a bounded
/// number of times.
///
/// # Errors
/// [`FsError::NotFound`] when `name` does not exist, [`FsError::InvalidPath`] when it is
/// not a single component, or the first I/O error (the tree is then partly removed).
pub fn remove_all_at(parent: BorrowedFd<'_>, name: &[u8]) -> Result<(), FsError> {
    let top = name_cstring(name)?;
    // Pending names in `parent` itself (only ever `name`).
    let mut base: Vec<Vec<u8>> = vec![name.to_vec()];
    let mut stack: Vec<RmFrame> = Vec::new();
    let mut flips = 0u32;
    let mut first = true;
    loop {
        let next = match stack.last_mut() {
            Some(frame) => {
                if !frame.scanned {
                    frame.scanned = true;
                    frame.passes += 1;
                    rm_scan(frame.fd.as_fd(), &mut frame.pending).map_err(map_io)?;
                }
                frame.pending.pop()
            }
            None => base.pop(),
        };
        let Some(sub) = next else {
            // Everything below the top frame is gone: remove the directory itself.
            let Some(mut frame) = stack.pop() else {
                return Ok(());
            };
            let dir = stack.last().map_or(parent, |f| f.fd.as_fd());
            match fsat::unlinkat(dir, &frame.name, libc::AT_REMOVEDIR) {
                Ok(()) => {}
                Err(e) if errno(&e) == libc::ENOENT => {}
                Err(e) if matches!(errno(&e), libc::ENOTEMPTY | libc::EEXIST) => {
                    if frame.passes >= MAX_REMOVE_PASSES {
                        return Err(FsError::Io(e));
                    }
                    frame.scanned = false;
                    stack.push(frame);
                }
                Err(e) if errno(&e) == libc::ENOTDIR => {
                    // Our directory was moved away and something else took its name.
                    match fsat::unlinkat(dir, &frame.name, 0) {
                        Err(e) if !matches!(errno(&e), libc::ENOENT | libc::EISDIR) => {
                            return Err(map_io(e));
                        }
                        _ => {}
                    }
                }
                Err(e) => return Err(map_io(e)),
            }
            continue;
        };
        let is_first = std::mem::take(&mut first);
        let csub = if is_first {
            top.clone()
        } else {
            name_cstring(&sub)?
        };
        let depth = stack.len();
        if depth >= MAX_HELD_DEPTH {
            // Too deep to hold another fd: move the subtree up into the top directory.
            let new = random_name(REMOVE_TEMP_PREFIX)?;
            let from = stack[depth - 1].fd.as_fd();
            let to = stack[0].fd.as_fd();
            match fsat::renameat(from, &csub, to, &new) {
                Ok(()) => stack[0].pending.push(new.into_bytes()),
                Err(e) if errno(&e) == libc::ENOENT => {}
                Err(e) => return Err(map_io(e)),
            }
            continue;
        }
        let dir = stack.last().map_or(parent, |f| f.fd.as_fd());
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        match fsat::openat2(dir, &csub, flags, 0, NO_SYMLINKS) {
            Ok(fd) => stack.push(RmFrame {
                fd,
                name: csub,
                pending: Vec::new(),
                scanned: false,
                passes: 0,
            }),
            Err(e) if errno(&e) == libc::ENOENT => {
                if is_first {
                    return Err(FsError::NotFound);
                }
            }
            Err(e) if matches!(errno(&e), libc::ENOTDIR | libc::ELOOP) => {
                // Not (or no longer) a directory: unlink whatever it is.
                match fsat::unlinkat(dir, &csub, 0) {
                    Ok(()) => {}
                    Err(e) if errno(&e) == libc::ENOENT => {}
                    Err(e) if errno(&e) == libc::EISDIR => {
                        flips += 1;
                        if flips > MAX_REMOVE_FLIPS {
                            return Err(FsError::Io(e));
                        }
                        match stack.last_mut() {
                            Some(f) => f.pending.push(sub),
                            None => base.push(sub),
                        }
                    }
                    Err(e) => return Err(map_io(e)),
                }
            }
            Err(e) => return Err(map_resolve(e)),
        }
    }
}

/// What [`walk_files`] yields for each entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkEntry {
    /// A directory (yielded before its contents).
    Dir {
        /// Last modification time.
        mtime: SystemTime,
    },
    /// A regular file (its open handle is passed alongside).
    File {
        /// Size in bytes at the time it was opened.
        size: u64,
        /// Last modification time.
        mtime: SystemTime,
        /// Permission bits (`mode & 0o7777`).
        mode: u32,
    },
}

/// Totals of a walk ([`tree_size`], [`walk_files`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeSize {
    /// Sum of the sizes of the regular files.
    pub bytes: u64,
    /// Number of regular files.
    pub files: u64,
    /// Number of directories (the walked directory itself not included).
    pub dirs: u64,
    /// Bytes of every entry's path below the walked directory (what an archive's
    /// names hold; a directory's trailing `/` included).
    pub name_bytes: u64,
    /// Whether the walk stopped early (entry limit, depth limit or an oversized
    /// directory); the totals then cover only part of the tree.
    pub truncated: bool,
}

/// The callback [`walk`] drives (type-erased so the walker is compiled once).
type WalkCallback<'a> = dyn FnMut(&[u8], WalkEntry, Option<File>) -> io::Result<()> + 'a;

struct WalkFrame {
    fd: OwnedFd,
    /// Path of this directory relative to the walk start, with a trailing `/` (empty at
    /// the start).
    prefix: Vec<u8>,
    /// Names still to visit, sorted descending so `pop` yields the smallest.
    names: Vec<Vec<u8>>,
}

/// Reads the names of `dir`, at most `cap` of them; returns them sorted descending and
/// whether the directory had more.
fn walk_names(dir: BorrowedFd<'_>, cap: usize) -> Result<(Vec<Vec<u8>>, bool), FsError> {
    let mut names = Vec::new();
    let mut more = false;
    fsat::read_dir(dir, |name, _| {
        if names.len() >= cap {
            more = true;
            return Ok(false);
        }
        names.push(name.to_vec());
        Ok(true)
    })
    .map_err(map_resolve)?;
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok((names, more))
}

/// Opens a regular file for reading by name in `dir` (no symlink followed, FIFOs never
/// block), or `None` if it is not (or no longer) a regular file.
fn open_child_file(dir: BorrowedFd<'_>, name: &CStr) -> Result<Option<(File, FileStat)>, FsError> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = match fsat::openat2(dir, name, flags, 0, NO_SYMLINKS) {
        Ok(fd) => fd,
        Err(e)
            if matches!(
                errno(&e),
                libc::ENOENT | libc::ELOOP | libc::ENXIO | libc::EISDIR
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(map_resolve(e)),
    };
    let st = fsat::fstat(fd.as_fd())?;
    if !st.is_file() {
        return Ok(None);
    }
    fsat::clear_nonblocking(fd.as_fd())?;
    Ok(Some((File::from(fd), st)))
}

fn walk(
    root: &Root,
    rel: &RelPath,
    max_entries: usize,
    open_files: bool,
    f: &mut WalkCallback<'_>,
) -> Result<TreeSize, FsError> {
    let mut totals = TreeSize::default();
    let probe = root.resolve(rel, libc::O_PATH)?;
    let st = fsat::fstat(probe.as_fd())?;
    drop(probe);
    if st.is_file() {
        // A single file: yield it under its own name.
        let name = rel.file_name().unwrap_or_default();
        if max_entries == 0 {
            totals.truncated = true;
            return Ok(totals);
        }
        let (file, st) = if open_files {
            let (file, size) = open_read(root, rel)?;
            (Some(file), FileStat { size, ..st })
        } else {
            (None, st)
        };
        totals.files = 1;
        totals.bytes = st.size;
        let entry = WalkEntry::File {
            size: st.size,
            mtime: mtime(&st),
            mode: st.mode & 0o7777,
        };
        f(name, entry, file).map_err(FsError::Io)?;
        return Ok(totals);
    }
    if !st.is_dir() {
        return Err(FsError::NotAFile);
    }
    let top = root.resolve(rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let (names, more) = walk_names(top.as_fd(), max_entries.saturating_add(1))?;
    totals.truncated |= more;
    let mut stack = vec![WalkFrame {
        fd: top,
        prefix: Vec::new(),
        names,
    }];
    let mut count: usize = 0;
    while let Some(frame) = stack.last_mut() {
        let Some(name) = frame.names.pop() else {
            stack.pop();
            continue;
        };
        let cname = name_cstring(&name)?;
        let dir = frame.fd.as_fd();
        let st = match fsat::fstatat(dir, &cname, libc::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(e) if errno(&e) == libc::ENOENT => continue,
            Err(e) => return Err(FsError::Io(e)),
        };
        if !st.is_dir() && !st.is_file() {
            continue; // symlinks, FIFOs, sockets, devices
        }
        if count >= max_entries {
            totals.truncated = true;
            break;
        }
        let mut path = frame.prefix.clone();
        path.extend_from_slice(&name);
        if st.is_file() {
            let (file, st) = if open_files {
                match open_child_file(dir, &cname)? {
                    Some((file, st)) => (Some(file), st),
                    None => continue,
                }
            } else {
                (None, st)
            };
            count += 1;
            totals.files += 1;
            totals.bytes = totals.bytes.saturating_add(st.size);
            totals.name_bytes += path.len() as u64;
            let entry = WalkEntry::File {
                size: st.size,
                mtime: mtime(&st),
                mode: st.mode & 0o7777,
            };
            f(&path, entry, file).map_err(FsError::Io)?;
            continue;
        }
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let sub = match fsat::openat2(dir, &cname, flags, 0, NO_SYMLINKS) {
            Ok(fd) => fd,
            Err(e) if matches!(errno(&e), libc::ENOENT | libc::ENOTDIR | libc::ELOOP) => continue,
            Err(e) => return Err(map_resolve(e)),
        };
        let st = fsat::fstat(sub.as_fd())?;
        count += 1;
        totals.dirs += 1;
        totals.name_bytes += path.len() as u64 + 1;
        let entry = WalkEntry::Dir { mtime: mtime(&st) };
        f(&path, entry, None).map_err(FsError::Io)?;
        if stack.len() >= MAX_WALK_DEPTH {
            totals.truncated = true;
            continue;
        }
        let cap = (max_entries - count).saturating_add(1);
        let (names, more) = walk_names(sub.as_fd(), cap)?;
        totals.truncated |= more;
        path.push(b'/');
        stack.push(WalkFrame {
            fd: sub,
            prefix: path,
            names,
        });
    }
    Ok(totals)
}

/// Counts the directories, regular files and file bytes under `rel` without following
/// any symlink below it (`rel` itself may be reached through in-tree symlinks), visiting
/// at most `max_entries` entries. Symlinks and special files are not counted. A regular
/// file `rel` counts as one file.
///
/// # Errors
/// The resolution errors of [`stat`]; [`FsError::NotAFile`] when `rel` is neither a
/// directory nor a regular file.
pub fn tree_size(root: &Root, rel: &RelPath, max_entries: usize) -> Result<TreeSize, FsError> {
    walk(root, rel, max_entries, false, &mut |_, _, _| Ok(()))
}

/// Walks `rel` depth-first in name-byte order, calling `f(path, entry, file)` for every
/// directory (before its contents, `file` is `None`) and every regular file (`file` is
/// the file opened for reading). `path` is relative to `rel` with `/` separators and no
/// trailing `/`; the walked directory itself is not yielded. If `rel` is a regular file
/// it is yielded alone under its own name.
///
/// Symlinks are never followed below `rel` and are skipped, as are FIFOs, sockets and
/// devices (files are opened `O_NOFOLLOW | O_NONBLOCK` and checked with `fstat`).
/// At most `max_entries` entries are yielded and directories deeper than
/// [`MAX_WALK_DEPTH`] are yielded but not entered; either sets `truncated`. A directory
/// with more names than the remaining budget also sets `truncated`, and which of its
/// entries are visited is then unspecified.
///
/// # Errors
/// As [`tree_size`]; an error returned by `f` stops the walk and is returned as
/// [`FsError::Io`].
pub fn walk_files<F>(
    root: &Root,
    rel: &RelPath,
    max_entries: usize,
    mut f: F,
) -> Result<TreeSize, FsError>
where
    F: FnMut(&[u8], WalkEntry, Option<File>) -> io::Result<()>,
{
    walk(root, rel, max_entries, true, &mut f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    static COUNTER: AtomicUsize = AtomicUsize::new(0);

    /// A unique directory under /tmp, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let n = COUNTER.fetch_add(1, Ordering::SeqCst);
            let p = PathBuf::from(format!(
                "/tmp/isobox-fs-test-{}-{tag}-{n}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir(&p).unwrap();
            TempDir(p)
        }
        fn path(&self, rel: &str) -> PathBuf {
            self.0.join(rel)
        }
        fn root(&self) -> Root {
            Root::open(&self.0).unwrap()
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// An outside directory with known files that tests check stays untouched.
    fn canary() -> TempDir {
        let c = TempDir::new("canary");
        std::fs::write(c.path("secret"), b"top secret").unwrap();
        std::fs::create_dir(c.path("inner")).unwrap();
        std::fs::write(c.path("inner/keep"), b"keep me").unwrap();
        c
    }

    fn assert_canary(c: &TempDir) {
        assert_eq!(std::fs::read(c.path("secret")).unwrap(), b"top secret");
        assert_eq!(std::fs::read(c.path("inner/keep")).unwrap(), b"keep me");
        let n = std::fs::read_dir(&c.0).unwrap().count();
        assert_eq!(n, 2, "canary gained or lost entries");
    }

    fn rp(s: &str) -> RelPath {
        normalize(s.as_bytes()).unwrap()
    }

    fn ids() -> (u32, u32) {
        // /proc/self is owned by our effective ids.
        let me = std::fs::metadata("/proc/self").unwrap();
        if me.uid() == 0 {
            (4242, 4243)
        } else {
            (me.uid(), me.gid())
        }
    }

    fn is_invalid(r: Result<impl fmt::Debug, FsError>) -> bool {
        matches!(r, Err(FsError::InvalidPath(_)))
    }

    fn temp_files(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(UPLOAD_TEMP_PREFIX))
            .collect()
    }

    #[test]
    fn normalize_table() {
        let ok: &[(&[u8], &[&[u8]])] = &[
            (b"../../etc/passwd", &[b"etc", b"passwd"]),
            (b"a/../../b", &[b"b"]),
            (b"//etc/passwd", &[b"etc", b"passwd"]),
            (b"/a/./b/", &[b"a", b"b"]),
            (b"a/b/../c", &[b"a", b"c"]),
            (b".", &[]),
            (b"", &[]),
            (b"/", &[]),
            (b"..", &[]),
            (b"\xff\xfe/x", &[b"\xff\xfe", b"x"]),
            (b"...", &[b"..."]),
        ];
        for (raw, want) in ok {
            let got = normalize(raw).unwrap();
            let want: Vec<Vec<u8>> = want.iter().map(|c| c.to_vec()).collect();
            assert_eq!(got.components(), want.as_slice(), "{raw:?}");
        }
        assert!(is_invalid(normalize(b"x\0y")));
        assert!(is_invalid(normalize(&[b'a'; 256])));
        assert!(normalize(&[b'a'; 255]).is_ok());
        let long: Vec<u8> = b"a/".repeat(2049);
        assert!(is_invalid(normalize(&long)));
        assert_eq!(rp("/").to_string(), "/");
        assert_eq!(rp("").display(), "/");
        assert_eq!(normalize(b"../a/\xff").unwrap().display(), "/a/\u{fffd}");
        assert_eq!(
            normalize(b"a/\xff\n\\").unwrap().to_string(),
            "/a/\\xff\\n\\\\"
        );
        assert_eq!(rp("a/b").to_bytes(), b"a/b");
        assert_eq!(rp("a/b").parent(), rp("a"));
    }

    #[test]
    fn escaping_symlinks_are_refused() {
        let ws = TempDir::new("escape");
        let c = canary();
        let root = ws.root();
        let sym =
            |target: &Path, name: &str| std::os::unix::fs::symlink(target, ws.path(name)).unwrap();
        sym(Path::new("/etc"), "etc");
        sym(Path::new("/"), "root");
        sym(Path::new("/etc/shadow"), "p");
        sym(&c.path("secret"), "abs");
        sym(&c.0, "absdir");
        let rel_target = format!("../../../../..{}", c.0.display());
        sym(Path::new(&rel_target), "rel");
        std::fs::create_dir(ws.path("d")).unwrap();
        std::os::unix::fs::symlink("../../..", ws.path("d/up")).unwrap();

        for p in [
            "etc/passwd",
            "p",
            "abs",
            "rel/secret",
            "root/etc/passwd",
            "d/up/etc/passwd",
        ] {
            assert!(is_invalid(open_read(&root, &rp(p))), "read {p}");
            assert!(is_invalid(stat(&root, &rp(p))), "stat {p}");
        }
        for p in ["etc", "root", "absdir", "rel", "d/up"] {
            assert!(is_invalid(list_dir(&root, &rp(p), 10)), "list {p}");
            assert!(is_invalid(tree_size(&root, &rp(p), 10)), "tree {p}");
        }
        let (uid, gid) = ids();
        for p in [
            "rel/new",
            "absdir/new",
            "etc/new",
            "root/tmp/new",
            "rel/x/y/new",
            "d/up/x",
        ] {
            assert!(
                is_invalid(write_file(&root, &rp(p), b"x", uid, gid)),
                "upload {p}"
            );
            assert!(is_invalid(remove(&root, &rp(p))), "remove {p}");
        }
        // The final symlink itself is not followed by lstat, upload or remove.
        assert_eq!(lstat(&root, &rp("p")).unwrap(), Kind::Symlink);
        write_file(&root, &rp("abs"), b"replaced", uid, gid).unwrap();
        assert_eq!(std::fs::read(ws.path("abs")).unwrap(), b"replaced");
        remove(&root, &rp("absdir")).unwrap();
        assert!(!ws.path("absdir").exists());
        assert!(is_invalid(remove(&root, &rp(""))));
        assert_canary(&c);
        assert!(Path::new("/etc/passwd").exists());
    }

    #[test]
    fn in_tree_symlinks_work() {
        let ws = TempDir::new("intree");
        let root = ws.root();
        std::fs::create_dir_all(ws.path("d/e")).unwrap();
        std::fs::write(ws.path("f.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink("../f.txt", ws.path("d/link")).unwrap();
        std::os::unix::fs::symlink("d", ws.path("alias")).unwrap();
        std::os::unix::fs::symlink("loop", ws.path("loop")).unwrap();
        std::os::unix::fs::symlink("nowhere", ws.path("dangling")).unwrap();

        let (mut f, size) = open_read(&root, &rp("d/link")).unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!((s.as_str(), size), ("hello", 5));
        assert!(matches!(
            stat(&root, &rp("alias/link")).unwrap(),
            Kind::File { size: 5, .. }
        ));
        let l = list_dir(&root, &rp("alias"), 10).unwrap();
        let names: Vec<&[u8]> = l.entries.iter().map(|e| e.name.as_slice()).collect();
        assert_eq!(names, [&b"e"[..], b"link"]);
        assert!(l.entries[1].symlink && !l.entries[1].dir);
        assert!(l.entries[0].dir);
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(l.entries[0].mod_time_ms.abs_diff(now_ms) < 60_000);
        assert!(is_invalid(stat(&root, &rp("loop"))));
        assert!(matches!(
            stat(&root, &rp("dangling")),
            Err(FsError::NotFound)
        ));
        assert!(matches!(
            stat(&root, &rp("missing")),
            Err(FsError::NotFound)
        ));
        assert!(matches!(
            list_dir(&root, &rp("f.txt"), 10),
            Err(FsError::NotADirectory)
        ));
        assert!(matches!(open_read(&root, &rp("d")), Err(FsError::NotAFile)));
        // Uploading through an in-tree symlinked parent lands in the real directory.
        let (uid, gid) = ids();
        write_file(&root, &rp("alias/e/new"), b"n", uid, gid).unwrap();
        assert_eq!(std::fs::read(ws.path("d/e/new")).unwrap(), b"n");
        // Removing through a symlinked parent removes the entry, not the link.
        remove(&root, &rp("alias/e")).unwrap();
        assert!(!ws.path("d/e").exists());
        assert!(ws.path("alias").symlink_metadata().is_ok());
    }

    #[test]
    fn fifo_is_not_a_file_and_does_not_block() {
        let ws = TempDir::new("fifo");
        let root = ws.root();
        let st = std::process::Command::new("mkfifo")
            .arg(ws.path("fifo"))
            .status()
            .unwrap();
        assert!(st.success());
        std::fs::write(ws.path("plain"), b"p").unwrap();
        let start = Instant::now();
        assert!(matches!(
            open_read(&root, &rp("fifo")),
            Err(FsError::NotAFile)
        ));
        assert_eq!(stat(&root, &rp("fifo")).unwrap(), Kind::Other);
        let mut seen = Vec::new();
        let t = walk_files(&root, &RelPath::root(), 100, |p, _, f| {
            seen.push((p.to_vec(), f.is_some()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![(b"plain".to_vec(), true)]);
        assert_eq!((t.files, t.bytes, t.truncated), (1, 1, false));
        let l = list_dir(&root, &RelPath::root(), 10).unwrap();
        assert_eq!(l.entries.len(), 2);
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn uploads() {
        let ws = TempDir::new("upload");
        let root = ws.root();
        let (uid, gid) = ids();

        let n = write_file(&root, &rp("a/b/c.txt"), b"hello", uid, gid).unwrap();
        assert_eq!(n, 5);
        assert_eq!(std::fs::read(ws.path("a/b/c.txt")).unwrap(), b"hello");
        for (p, mode) in [("a", 0o755), ("a/b", 0o755), ("a/b/c.txt", 0o644)] {
            let m = std::fs::metadata(ws.path(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (uid, gid), "{p}");
            assert_eq!(m.permissions().mode() & 0o7777, mode, "{p}");
        }
        // Commit replaces.
        let mut up = create_upload(&root, &rp("a/b/c.txt"), uid, gid).unwrap();
        up.file().write_all(b"second version").unwrap();
        assert_eq!(temp_files(&ws.path("a/b")).len(), 1);
        assert_eq!(up.commit().unwrap(), 14);
        assert_eq!(
            std::fs::read(ws.path("a/b/c.txt")).unwrap(),
            b"second version"
        );
        assert!(temp_files(&ws.path("a/b")).is_empty());
        // Abort and drop leave nothing behind.
        let mut up = create_upload(&root, &rp("a/new.txt"), uid, gid).unwrap();
        up.file().write_all(b"x").unwrap();
        up.abort();
        let up = create_upload(&root, &rp("a/new.txt"), uid, gid).unwrap();
        drop(up);
        assert!(temp_files(&ws.path("a")).is_empty());
        assert!(!ws.path("a/new.txt").exists());
        // Onto a directory.
        assert!(matches!(
            create_upload(&root, &rp("a/b"), uid, gid),
            Err(FsError::IsADirectory)
        ));
        let mut up = create_upload(&root, &rp("a/later"), uid, gid).unwrap();
        up.file().write_all(b"x").unwrap();
        std::fs::create_dir(ws.path("a/later")).unwrap();
        std::fs::write(ws.path("a/later/inside"), b"i").unwrap();
        assert!(matches!(up.commit(), Err(FsError::IsADirectory)));
        assert!(temp_files(&ws.path("a")).is_empty());
        // Through a file, at the root.
        assert!(matches!(
            write_file(&root, &rp("a/b/c.txt/x"), b"x", uid, gid),
            Err(FsError::NotADirectory)
        ));
        assert!(is_invalid(write_file(&root, &rp("/"), b"x", uid, gid)));
        // Through a dangling in-tree symlink parent.
        std::os::unix::fs::symlink("nowhere", ws.path("dl")).unwrap();
        assert!(matches!(
            write_file(&root, &rp("dl/x"), b"x", uid, gid),
            Err(FsError::NotADirectory)
        ));
        assert_eq!(
            map_io(io::Error::from_raw_os_error(libc::EDQUOT)).to_string(),
            "no space left in the workspace"
        );
    }

    #[test]
    fn remove_does_not_follow_symlinks() {
        let ws = TempDir::new("remove");
        let c = canary();
        let root = ws.root();
        std::fs::create_dir_all(ws.path("t/x/y")).unwrap();
        std::fs::write(ws.path("t/x/y/f"), b"f").unwrap();
        std::os::unix::fs::symlink(&c.0, ws.path("t/out")).unwrap();
        std::os::unix::fs::symlink(&c.0, ws.path("t/x/out")).unwrap();
        std::os::unix::fs::symlink(c.path("secret"), ws.path("t/x/y/s")).unwrap();
        std::fs::write(ws.path("file"), b"f").unwrap();
        remove(&root, &rp("t")).unwrap();
        assert!(!ws.path("t").exists());
        remove(&root, &rp("file")).unwrap();
        assert!(matches!(remove(&root, &rp("file")), Err(FsError::NotFound)));
        assert!(matches!(
            remove(&root, &rp("../..")),
            Err(FsError::InvalidPath(_))
        ));
        assert_canary(&c);
        assert_eq!(std::fs::read_dir(&ws.0).unwrap().count(), 0);
    }

    #[test]
    fn remove_deep_tree_and_host_path() {
        let ws = TempDir::new("deep");
        let mut p = ws.path("top");
        for _ in 0..(MAX_HELD_DEPTH * 2 + 5) {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("leaf"), b"x").unwrap();
        let root = ws.root();
        let t = tree_size(&root, &rp("top"), 10_000).unwrap();
        assert!(t.truncated);
        assert_eq!(t.dirs, MAX_WALK_DEPTH as u64);
        remove(&root, &rp("top")).unwrap();
        assert_eq!(std::fs::read_dir(&ws.0).unwrap().count(), 0);

        let c = canary();
        let s = TempDir::new("session");
        std::fs::create_dir_all(s.path("w/a")).unwrap();
        std::os::unix::fs::symlink(&c.0, s.path("w/a/out")).unwrap();
        remove_host_path(&s.0).unwrap();
        assert!(!s.0.exists());
        assert!(matches!(remove_host_path(&s.0), Err(FsError::NotFound)));
        assert_canary(&c);
    }

    #[test]
    fn remove_races_with_dir_symlink_swap() {
        let ws = TempDir::new("race");
        let c = canary();
        let root = ws.root();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let stop = stop.clone();
            let t = ws.path("t");
            let target = c.0.clone();
            std::thread::spawn(move || {
                let mut swaps = 0u32;
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i = (i + 1) % 4;
                    let (sub, aside) = (t.join(format!("sub{i}")), t.join(format!("aside{i}")));
                    if std::fs::create_dir(&sub).is_ok() {
                        let _ = std::fs::write(sub.join("f"), b"x");
                        let _ = std::fs::create_dir(sub.join("inner"));
                    }
                    let _ = std::fs::rename(&sub, &aside);
                    if std::os::unix::fs::symlink(&target, &sub).is_ok() {
                        swaps += 1;
                    }
                    std::thread::yield_now();
                    let _ = std::fs::remove_file(&sub);
                    let _ = std::fs::rename(&aside, &sub);
                }
                swaps
            })
        };
        let deadline = Instant::now() + Duration::from_millis(1000);
        let mut rounds = 0;
        while Instant::now() < deadline {
            let t = ws.path("t");
            let _ = std::fs::create_dir(&t);
            for i in 0..4 {
                let d = t.join(format!("d{i}"));
                let _ = std::fs::create_dir(&d);
                let _ = std::fs::write(d.join("f"), b"x");
                let _ = std::os::unix::fs::symlink(&c.0, d.join("out"));
            }
            let _ = remove(&root, &rp("t"));
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        assert!(rounds > 5 && swaps > 5, "rounds {rounds} swaps {swaps}");
        let _ = remove(&root, &rp("t"));
        assert_canary(&c);
    }

    #[test]
    fn big_directory_listing() {
        let ws = TempDir::new("big");
        let root = ws.root();
        let d = ws.path("many");
        std::fs::create_dir(&d).unwrap();
        for i in 0..20_000 {
            std::fs::File::create(d.join(format!("f{i:05}"))).unwrap();
        }
        let start = Instant::now();
        let l = list_dir(&root, &rp("many"), 1000).unwrap();
        let took = start.elapsed();
        assert!(l.truncated);
        assert_eq!(l.entries.len(), 1000);
        for (i, e) in l.entries.iter().enumerate() {
            assert_eq!(e.name, format!("f{i:05}").into_bytes());
        }
        assert!(took < Duration::from_secs(2), "took {took:?}");
        let all = list_dir(&root, &rp("many"), 20_000).unwrap();
        assert!(!all.truncated);
        assert_eq!(all.entries.len(), 20_000);
        let t = tree_size(&root, &rp("many"), 500).unwrap();
        assert!(t.truncated);
        assert_eq!(t.files, 500);
        remove(&root, &rp("many")).unwrap();
    }

    #[test]
    fn odd_names_round_trip() {
        let ws = TempDir::new("names");
        let root = ws.root();
        let names: [&[u8]; 5] = [b"a\nb", b"q\"uote", b"back\\slash", b"\xff\xfe", b" sp ace"];
        for n in names {
            let p = ws.0.join(std::ffi::OsStr::from_bytes(n));
            std::fs::write(&p, n).unwrap();
        }
        std::fs::create_dir(ws.0.join(std::ffi::OsStr::from_bytes(b"dir\xff"))).unwrap();
        std::fs::write(ws.0.join(std::ffi::OsStr::from_bytes(b"dir\xff/in")), b"in").unwrap();
        let l = list_dir(&root, &RelPath::root(), 100).unwrap();
        let mut want: Vec<Vec<u8>> = names.iter().map(|n| n.to_vec()).collect();
        want.push(b"dir\xff".to_vec());
        want.sort();
        let got: Vec<Vec<u8>> = l.entries.iter().map(|e| e.name.clone()).collect();
        assert_eq!(got, want);
        for n in names {
            let (mut f, size) = open_read(&root, &normalize(n).unwrap()).unwrap();
            let mut buf = Vec::new();
            f.read_to_end(&mut buf).unwrap();
            assert_eq!((buf.as_slice(), size), (n, n.len() as u64));
        }
        let mut seen = Vec::new();
        let t = walk_files(&root, &RelPath::root(), 100, |p, e, f| {
            seen.push((p.to_vec(), matches!(e, WalkEntry::Dir { .. }), f.is_some()));
            Ok(())
        })
        .unwrap();
        assert_eq!(t.files, 6);
        assert_eq!(t.dirs, 1);
        let paths: Vec<Vec<u8>> = seen.iter().map(|s| s.0.clone()).collect();
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(paths, sorted);
        assert!(seen.contains(&(b"dir\xff".to_vec(), true, false)));
        assert!(seen.contains(&(b"dir\xff/in".to_vec(), false, true)));
        // A single file walks as itself.
        let mut one = Vec::new();
        walk_files(&root, &normalize(b"dir\xff/in").unwrap(), 10, |p, _, _| {
            one.push(p.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(one, vec![b"in".to_vec()]);
    }
}

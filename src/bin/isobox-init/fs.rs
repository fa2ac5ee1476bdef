//! File operations ([`FsCall`]) on a thread of their own that acts as the sandbox's
//! user: the init stays root for what it must do (start processes as the user, signal
//! them), while every path the daemon names is resolved and checked with the user's
//! rights, as the user's own commands would see it. A slow operation (a large
//! recursive remove) blocks this thread only; the init's loop goes on serving
//! processes and learns of each answer through a waker.

use isobox::sandbox::wire::{FsCall, FsEntry, Reply, FS_LIST_ENTRIES};
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

/// Bytes of entries, as JSON, one `List` answer may carry (its frame is at most 1 MiB).
const LIST_BYTES: usize = 640 << 10;

/// What the thread is asked.
pub enum Job {
    /// A call from the daemon.
    Call(u32, FsCall),
    /// Put a written file in place: call id, temporary file, target.
    Commit(u32, PathBuf, PathBuf),
    /// Remove an abandoned write's temporary file.
    Discard(PathBuf),
}

/// A file `FsCall::Open` opened, handed to the init's loop with the answer.
pub enum Opened {
    /// Being read: `size` bytes are sent.
    Read {
        /// The file.
        file: File,
        /// Bytes to send.
        size: u64,
    },
    /// A watch: its inotify instance, its directories by watch descriptor.
    Watch(Box<super::watch::Watch>),
    /// Being written to `temp`, to become `target`.
    Write {
        /// The temporary file.
        file: File,
        /// Its path.
        temp: PathBuf,
        /// Where it goes on commit.
        target: PathBuf,
    },
}

/// An answer: the call id, the reply, and what an `Open` opened.
pub type Done = (u32, Reply, Option<Opened>);

/// The thread's two ends, as the init's loop holds them.
pub struct Fs {
    tx: mpsc::Sender<Job>,
    /// Answers, by call id.
    pub done: mpsc::Receiver<Done>,
}

impl Fs {
    /// Starts the thread: as `user` when given (else as the init), with relative paths
    /// taken from `home` (else the init's working directory). `waker` is woken after
    /// each answer.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start(user: Option<u32>, home: Option<String>, waker: mio::Waker) -> io::Result<Fs> {
        let (tx, jobs) = mpsc::channel::<Job>();
        let (answers, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("fs".into())
            .spawn(move || {
                let creds = match user {
                    Some(uid) => isobox::sys::process::become_user_on_this_thread(uid)
                        .map_err(|e| format!("file operations are unavailable: {e}")),
                    None => Ok(()),
                };
                let home = PathBuf::from(home.unwrap_or_else(|| ".".into()));
                while let Ok(job) = jobs.recv() {
                    let done = match (job, &creds) {
                        (Job::Discard(temp), _) => {
                            let _ = std::fs::remove_file(temp);
                            continue;
                        }
                        (Job::Call(id, _) | Job::Commit(id, ..), Err(e)) => {
                            (id, Reply::Error(e.clone()), None)
                        }
                        (Job::Call(id, FsCall::Open { path, write }), Ok(())) => {
                            match open(&home, id, &path, write) {
                                Ok((reply, opened)) => (id, reply, Some(opened)),
                                Err(r) => (id, r, None),
                            }
                        }
                        (Job::Call(id, FsCall::Watch { path, recursive }), Ok(())) => {
                            match super::watch::open(&home, &path, recursive) {
                                Ok(w) => (
                                    id,
                                    Reply::Ok(serde_json::json!({ "handle": id })),
                                    Some(Opened::Watch(Box::new(w))),
                                ),
                                Err(r) => (id, r, None),
                            }
                        }
                        (Job::Call(id, call), Ok(())) => (id, carry_out(&home, call), None),
                        (Job::Commit(id, temp, target), Ok(())) => {
                            (id, commit(&temp, &target), None)
                        }
                    };
                    if answers.send(done).is_err() {
                        break;
                    }
                    let _ = waker.wake();
                }
            })?;
        Ok(Fs { tx, done })
    }

    /// Queues a job (the daemon bounds how many it has in flight).
    pub fn submit(&self, job: Job) -> Result<(), String> {
        self.tx
            .send(job)
            .map_err(|_| "file operations are unavailable".to_string())
    }
}

/// Opens `path` for call `id`: to read (a regular file, symlinks followed) or to
/// write (a new temporary file beside it, with its mode if it exists).
fn open(home: &Path, id: u32, path: &[u8], write: bool) -> Result<(Reply, Opened), Reply> {
    let p = resolve(home, path)?;
    if !write {
        // Never blocking: a FIFO's open would wait for a writer, and this thread does
        // every file operation of the sandbox. Blocking again once it is known to be a
        // regular file.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&p)
            .map_err(|e| refused(&p, &e))?;
        let md = file.metadata().map_err(|e| refused(&p, &e))?;
        if md.is_dir() {
            return Err(bad(format!("{}: is a directory", p.display())));
        }
        if !md.is_file() {
            return Err(bad(format!("{}: is not a regular file", p.display())));
        }
        isobox::sys::fsat::clear_nonblocking(std::os::fd::AsFd::as_fd(&file))
            .map_err(|e| refused(&p, &e))?;
        let size = md.len();
        return Ok((
            Reply::Ok(serde_json::json!({ "handle": id, "size": size })),
            Opened::Read { file, size },
        ));
    }
    let mode = match std::fs::metadata(&p) {
        Ok(md) if md.is_dir() => return Err(bad(format!("{}: is a directory", p.display()))),
        Ok(md) => md.permissions().mode() & 0o7777,
        Err(_) => 0o644,
    };
    let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else {
        return Err(bad(format!("{}: is not a file's path", p.display())));
    };
    // Refused now, not at the rename after the whole body.
    if name.len() > 255 {
        return Err(refused(
            &p,
            &io::Error::from_raw_os_error(libc::ENAMETOOLONG),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| refused(dir, &e))?;
    // Of a fixed length, so any name the file system takes can be uploaded to.
    let temp = dir.join(format!(".isobox-upload-{id}"));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temp)
        .map_err(|e| refused(&p, &e))?;
    // The umask may have narrowed it.
    let _ = file.set_permissions(std::fs::Permissions::from_mode(mode));
    Ok((
        Reply::Ok(serde_json::json!({ "handle": id })),
        Opened::Write {
            file,
            temp,
            target: p,
        },
    ))
}

/// Puts a written file in place.
fn commit(temp: &Path, target: &Path) -> Reply {
    match std::fs::rename(temp, target) {
        Ok(()) => stat(target),
        Err(e) => {
            let _ = std::fs::remove_file(temp);
            refused(target, &e)
        }
    }
}

/// A refusal for a write that failed (no space, most likely) at `target`.
pub fn write_failed(target: &Path, e: &io::Error) -> Reply {
    refused(target, e)
}

/// A refusal for `path` from the file system's error, in words.
pub fn refused(path: &Path, e: &io::Error) -> Reply {
    let (status, why) = match e.raw_os_error().unwrap_or(0) {
        libc::ENOENT => (404, "no such file or directory".to_string()),
        libc::EACCES | libc::EPERM => (403, "permission denied".to_string()),
        libc::EROFS => (403, "read-only file system".to_string()),
        libc::EEXIST => (409, "already exists".to_string()),
        libc::ENOTEMPTY => (409, "the directory is not empty".to_string()),
        libc::EBUSY => (409, "busy (a mount point?)".to_string()),
        libc::EXDEV => (
            409,
            "is on another file system than the destination; copy it with a command".to_string(),
        ),
        libc::ENOTDIR => (400, "a part of the path is not a directory".to_string()),
        libc::EISDIR => (400, "is a directory".to_string()),
        libc::ELOOP => (400, "too many levels of symbolic links".to_string()),
        libc::ENAMETOOLONG => (400, "a name in the path is too long".to_string()),
        libc::EINVAL => (
            400,
            "invalid for this path (a directory into itself?)".to_string(),
        ),
        libc::ENOSPC | libc::EDQUOT => (413, "no space left in the sandbox".to_string()),
        _ => (409, e.to_string()),
    };
    Reply::Refused {
        status,
        message: format!("{}: {why}", path.display()),
    }
}

pub fn bad(message: String) -> Reply {
    Reply::Refused {
        status: 400,
        message,
    }
}

/// `path` resolved against `home` when relative; empty or with NUL refused.
pub fn resolve(home: &Path, path: &[u8]) -> Result<PathBuf, Reply> {
    if path.is_empty() {
        return Err(bad("path: must not be empty".into()));
    }
    if path.contains(&0) {
        return Err(bad("path: must not contain NUL".into()));
    }
    let p = Path::new(std::ffi::OsStr::from_bytes(path));
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        home.join(p)
    })
}

/// One entry as the protocol carries it.
pub fn entry(path: &Path, md: &Metadata) -> FsEntry {
    let ft = md.file_type();
    let kind = if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else {
        "other"
    };
    FsEntry {
        path: path.as_os_str().as_bytes().to_vec(),
        kind: kind.into(),
        size: md.len(),
        mode: md.mode() & 0o7777,
        mtime_ms: md.mtime().saturating_mul(1000) + md.mtime_nsec() / 1_000_000,
        target: ft
            .is_symlink()
            .then(|| std::fs::read_link(path).ok())
            .flatten()
            .map(|t| t.into_os_string().into_vec()),
    }
}

fn ok<T: serde::Serialize>(v: &T) -> Reply {
    Reply::Ok(serde_json::to_value(v).unwrap_or(serde_json::Value::Null))
}

fn stat(p: &Path) -> Reply {
    match std::fs::symlink_metadata(p) {
        Ok(md) => ok(&entry(p, &md)),
        Err(e) => refused(p, &e),
    }
}

/// Carries out one call.
pub fn carry_out(home: &Path, call: FsCall) -> Reply {
    match call {
        FsCall::Open { .. } | FsCall::Watch { .. } => {
            Reply::Error("answered by the file thread".into())
        }
        FsCall::Stat { path } => match resolve(home, &path) {
            Ok(p) => stat(&p),
            Err(r) => r,
        },
        FsCall::List { path, depth } => match resolve(home, &path) {
            Ok(p) => list(&p, depth.clamp(1, 5)),
            Err(r) => r,
        },
        FsCall::Mkdir { path, parents } => {
            let p = match resolve(home, &path) {
                Ok(p) => p,
                Err(r) => return r,
            };
            let r = if parents {
                std::fs::create_dir_all(&p)
            } else {
                std::fs::create_dir(&p)
            };
            match r {
                Ok(()) => stat(&p),
                Err(e) => refused(&p, &e),
            }
        }
        FsCall::Move {
            from,
            to,
            overwrite,
        } => {
            let (f, t) = match (resolve(home, &from), resolve(home, &to)) {
                (Ok(f), Ok(t)) => (f, t),
                (Err(r), _) | (_, Err(r)) => return r,
            };
            if let Err(e) = std::fs::symlink_metadata(&f) {
                return refused(&f, &e);
            }
            if !overwrite && std::fs::symlink_metadata(&t).is_ok() {
                return Reply::Refused {
                    status: 409,
                    message: format!(
                        "{}: already exists (set \"overwrite\": true to replace it)",
                        t.display()
                    ),
                };
            }
            match std::fs::rename(&f, &t) {
                Ok(()) => stat(&t),
                // Which side the error is about is not known: name both.
                Err(e) => match refused(&f, &e) {
                    Reply::Refused { status, message } => Reply::Refused {
                        status,
                        message: message.replacen(
                            &f.display().to_string(),
                            &format!("{} -> {}", f.display(), t.display()),
                            1,
                        ),
                    },
                    r => r,
                },
            }
        }
        FsCall::Remove {
            path,
            recursive,
            files_only,
        } => {
            let p = match resolve(home, &path) {
                Ok(p) => p,
                Err(r) => return r,
            };
            if p == Path::new("/") {
                return bad("path: refusing to remove /".into());
            }
            let md = match std::fs::symlink_metadata(&p) {
                Ok(md) => md,
                Err(e) => return refused(&p, &e),
            };
            let r = if md.is_dir() {
                if files_only {
                    return bad(format!(
                        "{}: is a directory (remove directories with fs/remove)",
                        p.display()
                    ));
                }
                if recursive {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_dir(&p)
                }
            } else {
                std::fs::remove_file(&p)
            };
            match r {
                Ok(()) => Reply::Ok(serde_json::Value::Null),
                Err(e) => refused(&p, &e),
            }
        }
    }
}

/// A directory's entries to `depth` levels, by path, not following symlinks; at most
/// [`FS_LIST_ENTRIES`] and [`LIST_BYTES`] of entries as the answer writes them (then
/// `truncated`).
fn list(dir: &Path, depth: u8) -> Reply {
    match std::fs::symlink_metadata(dir) {
        Ok(md) if md.is_dir() => {}
        Ok(_) => {
            return bad(format!("{}: is not a directory", dir.display()));
        }
        Err(e) => return refused(dir, &e),
    }
    let mut entries: Vec<FsEntry> = Vec::new();
    let mut bytes = 0usize;
    let mut truncated = false;
    // Depth-first, each directory's names sorted: the answer reads as a tree.
    let mut stack: Vec<(PathBuf, u8)> = vec![(dir.to_path_buf(), 1)];
    'walk: while let Some((d, level)) = stack.pop() {
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            // The top one was checked; a subdirectory the user cannot read is listed
            // without its contents.
            Err(e) if d == dir => return refused(dir, &e),
            Err(_) => continue,
        };
        let mut names: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        names.sort();
        let mut below = Vec::new();
        for p in names {
            let Ok(md) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let e = entry(&p, &md);
            // As the answer will carry it: escaping may make a name six times longer.
            bytes += serde_json::to_vec(&e).map_or(usize::MAX / 2, |v| v.len() + 1);
            if entries.len() >= FS_LIST_ENTRIES || bytes > LIST_BYTES {
                truncated = true;
                break 'walk;
            }
            if md.is_dir() && level < depth {
                below.push((p, level + 1));
            }
            entries.push(e);
        }
        stack.extend(below.into_iter().rev());
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Reply::Ok(serde_json::json!({ "entries": entries, "truncated": truncated }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "isobox-init-fs-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn status(r: &Reply) -> Option<u16> {
        match r {
            Reply::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }

    #[test]
    fn test_a_listing_of_names_that_grow_when_escaped_fits_its_frame() {
        // 1000 names of 200 bytes, 196 of them a control byte (six bytes each in
        // JSON): ~200 KB of names, ~1.2 MB of answer.
        let home = tmp();
        for i in 0..1000 {
            let name = format!("{i:04}{}", "\u{1}".repeat(196));
            std::fs::write(home.join(name), b"").unwrap();
        }
        let r = carry_out(
            &home,
            FsCall::List {
                path: home.display().to_string().into(),
                depth: 1,
            },
        );
        let frame = serde_json::to_vec(&r).unwrap();
        assert!(
            frame.len() <= isobox::sandbox::wire::MAX_FRAME_BYTES - 5,
            "{} bytes",
            frame.len()
        );
        let Reply::Ok(v) = r else { panic!("{r:?}") };
        let n = v["entries"].as_array().unwrap().len();
        assert_eq!(v["truncated"], true);
        // As many as fit: the budget is the escaped size, within one entry.
        assert!(n > 400 && n < 1000, "{n} entries");
        let _ = std::fs::remove_dir_all(&home);
    }

    #[test]
    fn test_a_name_that_is_not_utf8_is_listed_and_reached_as_bytes() {
        use std::os::unix::ffi::OsStrExt;
        let home = tmp();
        let mut odd = home.as_os_str().as_bytes().to_vec();
        odd.extend_from_slice(b"/a\xff\xfe");
        std::fs::write(std::ffi::OsStr::from_bytes(&odd), b"bytes").unwrap();
        let Reply::Ok(v) = carry_out(
            &home,
            FsCall::List {
                path: home.as_os_str().as_bytes().to_vec(),
                depth: 1,
            },
        ) else {
            panic!()
        };
        let entries: Vec<FsEntry> = serde_json::from_value(v["entries"].clone()).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!((&entries[0].path, entries[0].size), (&odd, 5));
        // Its bytes reach it: stat, move, remove.
        let Reply::Ok(v) = carry_out(&home, FsCall::Stat { path: odd.clone() }) else {
            panic!()
        };
        assert_eq!(serde_json::from_value::<FsEntry>(v).unwrap().path, odd);
        let mut moved = odd.clone();
        moved.push(0x80);
        let r = carry_out(
            &home,
            FsCall::Move {
                from: odd.clone(),
                to: moved.clone(),
                overwrite: false,
            },
        );
        assert!(matches!(r, Reply::Ok(_)), "{r:?}");
        assert_eq!(
            std::fs::read(std::ffi::OsStr::from_bytes(&moved)).unwrap(),
            b"bytes"
        );
        let r = carry_out(
            &home,
            FsCall::Remove {
                path: moved.clone(),
                recursive: false,
                files_only: true,
            },
        );
        assert_eq!(r, Reply::Ok(serde_json::Value::Null));
        assert_eq!(std::fs::read_dir(&home).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(&home);
    }

    #[test]
    fn test_operations_and_their_refusals() {
        let home = tmp();
        let h = home.display().to_string();
        // Relative paths are the home's.
        let r = carry_out(
            &home,
            FsCall::Mkdir {
                path: "a/b".into(),
                parents: true,
            },
        );
        let Reply::Ok(v) = r else { panic!("{r:?}") };
        assert_eq!(v["path"], format!("{h}/a/b"));
        assert_eq!(v["type"], "dir");
        std::fs::write(home.join("a/f.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink("f.txt", home.join("a/link")).unwrap();
        let Reply::Ok(v) = carry_out(
            &home,
            FsCall::Stat {
                path: format!("{h}/a/link").into(),
            },
        ) else {
            panic!()
        };
        assert_eq!(
            (v["type"].as_str(), v["target"].as_str()),
            (Some("symlink"), Some("f.txt"))
        );
        let Reply::Ok(v) = carry_out(
            &home,
            FsCall::List {
                path: h.clone().into(),
                depth: 1,
            },
        ) else {
            panic!()
        };
        let paths: Vec<&str> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect();
        assert_eq!(paths, [format!("{h}/a")]);
        let Reply::Ok(v) = carry_out(
            &home,
            FsCall::List {
                path: h.clone().into(),
                depth: 2,
            },
        ) else {
            panic!()
        };
        let paths: Vec<&str> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                format!("{h}/a"),
                format!("{h}/a/b"),
                format!("{h}/a/f.txt"),
                format!("{h}/a/link")
            ]
        );
        assert_eq!(v["truncated"], false);
        let f = v["entries"][2].clone();
        assert_eq!(
            (f["size"].as_u64(), f["type"].as_str()),
            (Some(5), Some("file"))
        );
        // Refusals carry their status.
        let mkdir = |path: &str, parents| {
            carry_out(
                &home,
                FsCall::Mkdir {
                    path: path.into(),
                    parents,
                },
            )
        };
        assert_eq!(status(&mkdir("a", false)), Some(409));
        assert!(matches!(mkdir("a", true), Reply::Ok(_)));
        assert_eq!(status(&mkdir("a/f.txt/x", true)), Some(400));
        assert_eq!(status(&mkdir("", true)), Some(400));
        assert_eq!(
            status(&carry_out(
                &home,
                FsCall::Stat {
                    path: "nope".into()
                }
            )),
            Some(404)
        );
        assert_eq!(
            status(&carry_out(
                &home,
                FsCall::List {
                    path: "a/f.txt".into(),
                    depth: 1
                }
            )),
            Some(400)
        );
        let mv = |from: &str, to: &str, overwrite| {
            carry_out(
                &home,
                FsCall::Move {
                    from: from.into(),
                    to: to.into(),
                    overwrite,
                },
            )
        };
        std::fs::write(home.join("g.txt"), b"g").unwrap();
        let r = mv("g.txt", "a/f.txt", false);
        assert_eq!(status(&r), Some(409), "{r:?}");
        assert!(matches!(mv("g.txt", "a/f.txt", true), Reply::Ok(_)));
        assert_eq!(std::fs::read(home.join("a/f.txt")).unwrap(), b"g");
        assert_eq!(status(&mv("g.txt", "h.txt", false)), Some(404));
        let rm = |path: &str, recursive, files_only| {
            carry_out(
                &home,
                FsCall::Remove {
                    path: path.into(),
                    recursive,
                    files_only,
                },
            )
        };
        assert_eq!(status(&rm("a", true, true)), Some(400));
        assert_eq!(status(&rm("a", false, false)), Some(409));
        assert!(matches!(rm("a/link", false, true), Reply::Ok(_)));
        assert!(
            home.join("a/f.txt").exists(),
            "a symlink is removed, not its target"
        );
        assert!(matches!(rm("a", true, false), Reply::Ok(_)));
        assert!(!home.join("a").exists());
        assert_eq!(status(&rm("/", true, false)), Some(400));
        let _ = std::fs::remove_dir_all(&home);
    }
}

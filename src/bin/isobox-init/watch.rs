//! `fs/watch`: a directory (and, recursively, those below it) watched with inotify.
//! The file thread opens a watch as the user (so only what the user may read is
//! watched); the init's loop reads its events and turns them into [`WatchEvent`]s:
//! `create`, `write` (consecutive writes to one file in one read are one), `remove`,
//! `rename` (a move within the watched tree, its two halves paired by cookie; a move
//! out of it is a `remove`, into it a `create`), and `overflow` when the kernel's
//! queue lost some. When the watched directory itself goes, the watch ends.

use super::fs::{bad, refused, resolve};
use super::Init;
use isobox::sandbox::wire::{Kind, Reply, WatchEvent, MAX_WATCH_DIRS};
use isobox::sys::inotify::{self as ino, Inotify};
use mio::unix::SourceFd;
use mio::{Interest, Token};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Watches at once (the daemon bounds its own well below).
const MAX_WATCHES: usize = 32;
/// Tokens of watches: this plus the handle (process tokens count up from small).
const TOKEN_BASE: usize = 1 << 40;

/// One watch.
pub struct Watch {
    ino: Inotify,
    /// Watched directories by watch descriptor.
    dirs: HashMap<i32, PathBuf>,
    root_wd: i32,
    recursive: bool,
}

/// Adds `dir` and (when `recursive`) every directory below it, not following
/// symlinks; false when that would pass [`MAX_WATCH_DIRS`].
fn add_tree(ino: &Inotify, dirs: &mut HashMap<i32, PathBuf>, dir: &Path, recursive: bool) -> bool {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if dirs.len() >= MAX_WATCH_DIRS {
            return false;
        }
        let Ok(wd) = ino.add(&d, ino::WATCH_MASK) else {
            continue; // gone meanwhile, or not the user's to read
        };
        if recursive {
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(e.path());
                    }
                }
            }
        }
        dirs.insert(wd, d);
    }
    true
}

/// Opens a watch of `path` (on the file thread, as the user).
pub fn open(home: &Path, path: &[u8], recursive: bool) -> Result<Watch, Reply> {
    let p = resolve(home, path)?;
    match std::fs::symlink_metadata(&p) {
        Ok(md) if md.is_dir() => {}
        Ok(_) => return Err(bad(format!("{}: is not a directory", p.display()))),
        Err(e) => return Err(refused(&p, &e)),
    }
    let ino = Inotify::new().map_err(|e| refused(&p, &e))?;
    let root_wd = ino.add(&p, ino::WATCH_MASK).map_err(|e| refused(&p, &e))?;
    let mut dirs = HashMap::new();
    dirs.insert(root_wd, p.clone());
    if recursive && !add_tree(&ino, &mut dirs, &p, true) {
        return Err(bad(format!(
            "{}: more than {MAX_WATCH_DIRS} directories to watch; watch a smaller tree",
            p.display()
        )));
    }
    Ok(Watch {
        ino,
        dirs,
        root_wd,
        recursive,
    })
}

/// The init's watches, by handle.
#[derive(Default)]
pub struct Watches {
    by_handle: HashMap<u32, Watch>,
}

/// The token of watch `handle`, if `t` is one.
pub fn handle_of(t: Token) -> Option<u32> {
    t.0.checked_sub(TOKEN_BASE)
        .and_then(|h| u32::try_from(h).ok())
}

/// The file thread opened watch `handle`: its fd joins the loop.
pub fn opened(init: &mut Init, handle: u32, w: Watch, reply: Reply) -> Reply {
    if init.watches.by_handle.len() >= MAX_WATCHES {
        return Reply::Error(format!("too many watches (limit {MAX_WATCHES})"));
    }
    let fd = w.ino.fd().as_raw_fd();
    let token = Token(TOKEN_BASE + handle as usize);
    if let Err(e) = init
        .poll
        .registry()
        .register(&mut SourceFd(&fd), token, Interest::READABLE)
    {
        return Reply::Error(format!("cannot watch: {e}"));
    }
    init.watches.by_handle.insert(handle, w);
    reply
}

/// `WatchEnd`: stops watch `handle`.
pub fn end(init: &mut Init, handle: u32) {
    if let Some(w) = init.watches.by_handle.remove(&handle) {
        let fd = w.ino.fd().as_raw_fd();
        let _ = init.poll.registry().deregister(&mut SourceFd(&fd));
    }
}

fn event(kind: &str, path: &Path, from: Option<&Path>, is_dir: bool) -> WatchEvent {
    WatchEvent {
        kind: kind.into(),
        path: path.as_os_str().as_bytes().to_vec(),
        from: from.map(|f| f.as_os_str().as_bytes().to_vec()),
        is_dir,
    }
}

/// Reads watch `handle`'s events and sends them; stops while the daemon is behind
/// (the kernel queues meanwhile, and says so when it overflows).
pub fn pump(init: &mut Init, handle: u32) {
    let mut buf = std::mem::take(&mut init.buf);
    loop {
        if init.backlogged() {
            break;
        }
        let Some(w) = init.watches.by_handle.get_mut(&handle) else {
            break;
        };
        let events = match w.ino.read(&mut buf) {
            Ok(ev) if ev.is_empty() => break,
            Ok(ev) => ev,
            Err(_) => break,
        };
        let (out, ended) = translate(w, &events);
        for e in &out {
            if let Ok(json) = serde_json::to_vec(e) {
                init.send(Kind::FsEvent, handle, &json);
            }
        }
        if ended {
            end(init, handle);
            init.send(Kind::FsEvent, handle, &[]);
            break;
        }
    }
    init.buf = buf;
}

/// Pumps every watch (the daemon caught up).
pub fn pump_all(init: &mut Init) {
    let handles: Vec<u32> = init.watches.by_handle.keys().copied().collect();
    for h in handles {
        pump(init, h);
    }
}

/// One read's events as the face reports them; true when the watch ended.
fn translate(w: &mut Watch, events: &[ino::Event]) -> (Vec<WatchEvent>, bool) {
    let mut out: Vec<WatchEvent> = Vec::new();
    let mut ended = false;
    let mut i = 0;
    while i < events.len() {
        let e = &events[i];
        i += 1;
        if e.mask & ino::IN_Q_OVERFLOW != 0 {
            out.push(WatchEvent {
                kind: "overflow".into(),
                path: Vec::new(),
                from: None,
                is_dir: false,
            });
            continue;
        }
        let Some(dir) = w.dirs.get(&e.wd).cloned() else {
            continue;
        };
        if e.mask & ino::IN_IGNORED != 0 {
            w.dirs.remove(&e.wd);
            if e.wd == w.root_wd {
                ended = true;
            }
            continue;
        }
        if e.mask & ino::IN_DELETE_SELF != 0 {
            if e.wd == w.root_wd {
                out.push(event("remove", &dir, None, true));
                ended = true;
            }
            continue;
        }
        let path = dir.join(std::ffi::OsStr::from_bytes_lossless(&e.name));
        let is_dir = e.mask & ino::IN_ISDIR != 0;
        if e.mask & ino::IN_CREATE != 0 {
            out.push(event("create", &path, None, is_dir));
            if is_dir && w.recursive {
                // Made after the watch began: watched from now on (by the init: the
                // user made it, so it is the user's to read).
                add_tree(&w.ino, &mut w.dirs, &path, true);
            }
        } else if e.mask & ino::IN_MODIFY != 0 {
            let same = out
                .last()
                .is_some_and(|l| l.kind == "write" && l.path == path.as_os_str().as_bytes());
            if !same {
                out.push(event("write", &path, None, is_dir));
            }
        } else if e.mask & ino::IN_DELETE != 0 {
            out.push(event("remove", &path, None, is_dir));
        } else if e.mask & ino::IN_MOVED_FROM != 0 {
            // Its other half, if it stayed in the tree, is next.
            let to = events.get(i).filter(|n| {
                n.mask & ino::IN_MOVED_TO != 0 && n.cookie == e.cookie && w.dirs.contains_key(&n.wd)
            });
            match to {
                Some(n) => {
                    i += 1;
                    let dest = w.dirs[&n.wd].join(std::ffi::OsStr::from_bytes_lossless(&n.name));
                    out.push(event("rename", &dest, Some(&path), is_dir));
                }
                None => out.push(event("remove", &path, None, is_dir)),
            }
        } else if e.mask & ino::IN_MOVED_TO != 0 {
            out.push(event("create", &path, None, is_dir));
            if is_dir && w.recursive {
                add_tree(&w.ino, &mut w.dirs, &path, true);
            }
        }
    }
    (out, ended)
}

/// Names are bytes.
trait FromBytes {
    fn from_bytes_lossless(b: &[u8]) -> &std::ffi::OsStr;
}

impl FromBytes for std::ffi::OsStr {
    fn from_bytes_lossless(b: &[u8]) -> &std::ffi::OsStr {
        std::os::unix::ffi::OsStrExt::from_bytes(b)
    }
}

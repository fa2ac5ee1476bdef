//! Files being transferred: opened (as the user) by the file thread, then read or
//! written here by the init's loop. A read sends `FileData` frames only within the
//! credit the daemon gave (`FileMore`), so a slow client never makes the init hold
//! more than that; an empty frame ends it. A write takes `FileData` frames into a
//! temporary file until `FileCommit` (a rename as the user, on the file thread) or
//! `FileClose` (it is removed).

use super::fs::{self, Job, Opened};
use super::Init;
use isobox::sandbox::wire::{Kind, Reply, MAX_DATA_BYTES};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;

/// Files open at once (the daemon bounds its transfers well below).
const MAX_OPEN: usize = 64;

enum OpenFile {
    Read {
        file: File,
        /// Bytes still to send.
        remaining: u64,
        /// Bytes the daemon allows now.
        credit: u64,
    },
    Write {
        file: File,
        temp: PathBuf,
        target: PathBuf,
        /// The first write that failed (then the rest is dropped).
        failed: Option<io::Error>,
    },
}

/// The open files, by handle.
#[derive(Default)]
pub struct Files {
    open: HashMap<u32, OpenFile>,
}

/// The file thread opened `handle`: it is kept (or, past the bound, closed and its
/// reply turned into a refusal).
pub fn opened(init: &mut Init, handle: u32, o: Opened, reply: Reply) -> Reply {
    let o = match o {
        Opened::Watch(w) => return super::watch::opened(init, handle, *w, reply),
        o => o,
    };
    if init.files.open.len() >= MAX_OPEN {
        if let Opened::Write { temp, .. } = o {
            let _ = init.fs.submit(Job::Discard(temp));
        }
        return Reply::Error(format!("too many open files (limit {MAX_OPEN})"));
    }
    let f = match o {
        Opened::Read { file, size } => OpenFile::Read {
            file,
            remaining: size,
            credit: 0,
        },
        Opened::Write { file, temp, target } => OpenFile::Write {
            file,
            temp,
            target,
            failed: None,
        },
        Opened::Watch(_) => return reply,
    };
    init.files.open.insert(handle, f);
    reply
}

/// Bytes for `handle` (being written); for any other handle, dropped.
pub fn data(init: &mut Init, handle: u32, bytes: &[u8]) {
    if let Some(OpenFile::Write { file, failed, .. }) = init.files.open.get_mut(&handle) {
        if failed.is_none() {
            if let Err(e) = file.write_all(bytes) {
                *failed = Some(e);
            }
        }
    }
}

/// `FileMore`: `handle` may send `bytes` more.
pub fn more(init: &mut Init, handle: u32, bytes: u64) -> Reply {
    match init.files.open.get_mut(&handle) {
        Some(OpenFile::Read { credit, .. }) => {
            *credit = credit.saturating_add(bytes);
            pump(init, handle);
            Reply::Ok(serde_json::Value::Null)
        }
        _ => Reply::Error(format!("no file being read: {handle}")),
    }
}

/// `FileCommit`: the reply now (a refusal), or none (the file thread's comes later).
pub fn commit(init: &mut Init, id: u32, handle: u32) -> Option<Reply> {
    match init.files.open.remove(&handle) {
        Some(OpenFile::Write {
            file,
            temp,
            target,
            failed,
        }) => {
            drop(file);
            if let Some(e) = failed {
                let _ = init.fs.submit(Job::Discard(temp));
                return Some(fs::write_failed(&target, &e));
            }
            init.fs
                .submit(Job::Commit(id, temp, target))
                .err()
                .map(Reply::Error)
        }
        Some(other) => {
            init.files.open.insert(handle, other);
            Some(Reply::Error(format!(
                "file {handle} is being read, not written"
            )))
        }
        None => Some(Reply::Error(format!("no such open file: {handle}"))),
    }
}

/// `FileClose`: forgets `handle` (an unfinished write's temporary file is removed).
pub fn close(init: &mut Init, handle: u32) {
    if let Some(OpenFile::Write { temp, .. }) = init.files.open.remove(&handle) {
        let _ = init.fs.submit(Job::Discard(temp));
    }
}

/// Sends what `handle`'s credit allows; at its end (or a read error, or a file that
/// shrank) an empty frame, and it is closed. Stops while the daemon is behind.
fn pump(init: &mut Init, handle: u32) {
    let mut buf = std::mem::take(&mut init.buf);
    loop {
        if init.backlogged() {
            break;
        }
        // Some(n): n bytes read; None: the end (or a read error, or a file that
        // shrank: the daemon, counting, then cuts its client off).
        let step = match init.files.open.get_mut(&handle) {
            Some(OpenFile::Read {
                file,
                remaining,
                credit,
            }) => {
                if *remaining == 0 {
                    None
                } else if *credit == 0 {
                    break;
                } else {
                    let want = (*credit).min(*remaining).min(MAX_DATA_BYTES as u64);
                    buf.resize(usize::try_from(want).unwrap_or(MAX_DATA_BYTES), 0);
                    match file.read(&mut buf) {
                        Ok(0) | Err(_) => None,
                        Ok(n) => {
                            *remaining -= n as u64;
                            *credit -= n as u64;
                            Some(n)
                        }
                    }
                }
            }
            _ => break,
        };
        match step {
            Some(n) => init.send(Kind::FileData, handle, &buf[..n]),
            None => {
                init.files.open.remove(&handle);
                init.send(Kind::FileData, handle, &[]);
                break;
            }
        }
    }
    init.buf = buf;
}

/// Pumps every file being read (the daemon caught up).
pub fn pump_all(init: &mut Init) {
    let handles: Vec<u32> = init.files.open.keys().copied().collect();
    for h in handles {
        pump(init, h);
    }
}

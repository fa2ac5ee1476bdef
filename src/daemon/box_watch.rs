//! `GET …/fs/watch?path=&recursive=`: an NDJSON stream of the changes init's inotify
//! watch sees in a directory (`create`, `write`, `remove`, `rename`), for as long as
//! the client stays. A client that falls behind loses events rather than grow the
//! daemon: they are counted and reported as one `overflow` line once it catches up.

use super::box_files::WaitKind;
use super::boxes::State;
use super::conn::Owner;
use super::Daemon;
use crate::http::limits::MAX_WRITE_BUFFER_BYTES;
use crate::sandbox::wire::{Call, FsCall, Reply, WatchEvent};
use crate::wbx::sandboxes::event_line;

/// Watches one sandbox has at once; the next gets 429.
pub const MAX_WATCHES: usize = 8;
/// Longest path an event may carry from init.
const MAX_EVENT_PATH: usize = 8192;

/// A client watching.
pub(crate) struct WatchSub {
    client: (usize, u64),
    /// Events dropped while it was behind.
    lost: u64,
}

impl Daemon {
    fn watches_full(&self, key: usize) -> bool {
        let b = &self.boxes.boxes[key];
        let opening =
            b.fs.values()
                .filter(|w| matches!(w.kind, WaitKind::Watch))
                .count();
        b.watches.len() + opening >= MAX_WATCHES
    }

    /// Starts watching; the stream's head follows the watch's opening.
    pub(super) fn file_watch(&mut self, ck: usize, key: usize, path: Vec<u8>, recursive: bool) {
        if self.boxes.boxes[key].state == State::Running && self.watches_full(key) {
            self.respond(
                ck,
                crate::wbx::error(
                    429,
                    &format!(
                        "too many watches in this sandbox (limit {MAX_WATCHES}); stop one first"
                    ),
                ),
            );
            return;
        }
        self.box_fs_as(ck, key, FsCall::Watch { path, recursive }, WaitKind::Watch);
    }

    /// init answered a `Watch`: the stream begins (or the refusal is the answer).
    pub(super) fn watch_opened(
        &mut self,
        key: usize,
        call_id: u32,
        client: (usize, u64),
        reply: Option<Reply>,
    ) {
        match reply {
            Some(Reply::Ok(v)) if v["handle"].as_u64() == Some(u64::from(call_id)) => {}
            Some(r @ (Reply::Refused { .. } | Reply::Error(_))) => {
                let call = FsCall::Watch {
                    path: Vec::new(),
                    recursive: false,
                };
                match crate::wbx::files::answer(&call, r) {
                    Some(resp) => self.box_answer(client, resp),
                    None => self.open_nonsense(key, client),
                }
                return;
            }
            _ => return self.open_nonsense(key, client),
        }
        if self
            .conns
            .get(client.0)
            .is_none_or(|c| c.serial != client.1)
        {
            self.box_call(key, &Call::WatchEnd { handle: call_id });
            return;
        }
        let serial = self.boxes.boxes[key].serial;
        self.conn_own(
            client.0,
            Owner::BoxWatch {
                key,
                serial,
                handle: call_id,
            },
        );
        self.conn_start_ndjson(client.0);
        self.conn_flush(client.0);
        self.boxes.boxes[key]
            .watches
            .insert(call_id, WatchSub { client, lost: 0 });
    }

    /// An `FsEvent` frame from init for watch `handle`.
    pub(super) fn watch_event(&mut self, key: usize, handle: u32, payload: &[u8]) {
        let Some(sub) = self.boxes.boxes[key].watches.get(&handle) else {
            return; // ended meanwhile
        };
        let (ck, cserial) = sub.client;
        let alive = self.conns.get(ck).is_some_and(|c| c.serial == cserial);
        if payload.is_empty() {
            // The watched directory is gone: so is the watch.
            self.boxes.boxes[key].watches.remove(&handle);
            if alive {
                self.finish_stream(ck, &event_line(&serde_json::json!({"type": "end"})));
                self.conn_resume(ck);
            }
            return;
        }
        let ev = match serde_json::from_slice::<WatchEvent>(payload) {
            Ok(e)
                if matches!(
                    e.kind.as_str(),
                    "create" | "write" | "remove" | "rename" | "overflow"
                ) && e.path.len() <= MAX_EVENT_PATH
                    && e.from.as_ref().is_none_or(|f| f.len() <= MAX_EVENT_PATH) =>
            {
                e
            }
            _ => return self.box_end(key, "its init sent a malformed file event"),
        };
        if !alive {
            self.boxes.boxes[key].watches.remove(&handle);
            self.box_call(key, &Call::WatchEnd { handle });
            return;
        }
        let behind = self.conns.get(ck).map_or(0, |c| c.http.pending_write());
        let Some(sub) = self.boxes.boxes[key].watches.get_mut(&handle) else {
            return;
        };
        if behind >= MAX_WRITE_BUFFER_BYTES {
            sub.lost += 1;
            return;
        }
        let lost = std::mem::take(&mut sub.lost);
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        if lost > 0 {
            c.http.send_chunk(&event_line(
                &serde_json::json!({"type": "overflow", "lost": lost}),
            ));
        }
        let line = if ev.kind == "overflow" {
            serde_json::json!({"type": "overflow"})
        } else {
            let mut v = serde_json::json!({"type": ev.kind, "is_dir": ev.is_dir});
            crate::wbx::files::put_path(&mut v, "path", &ev.path);
            if let Some(f) = ev.from {
                crate::wbx::files::put_path(&mut v, "from", &f);
            }
            v
        };
        c.http.send_chunk(&event_line(&line));
        self.conn_flush(ck);
    }

    /// A watching client left: init stops the watch.
    pub(crate) fn watch_client_left(&mut self, key: usize, serial: u64, handle: u32) {
        let Some(b) = self.boxes.boxes.get_mut(key).filter(|b| b.serial == serial) else {
            return;
        };
        if b.watches.remove(&handle).is_some() {
            self.box_call(key, &Call::WatchEnd { handle });
        }
    }

    /// Sandbox `key` ended: every watch's stream ends with an error line.
    pub(super) fn watches_fail_all(&mut self, key: usize, message: &str) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let subs: Vec<WatchSub> = b.watches.drain().map(|(_, s)| s).collect();
        let line = event_line(&serde_json::json!({"type": "error", "error": message}));
        for s in subs {
            let (ck, serial) = s.client;
            if self.conns.get(ck).is_some_and(|c| c.serial == serial) {
                self.finish_stream(ck, &line);
                self.conn_resume(ck);
            }
        }
    }
}

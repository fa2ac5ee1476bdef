//! File operations on a long-lived sandbox (`fs/list`, `fs/stat`, `fs/mkdir`,
//! `fs/move`, `fs/remove`): each is one call to the sandbox's init, which carries it
//! out as the sandbox's user on a thread of its own; the client waits for its answer
//! (bounded in time and in number per sandbox).

use super::boxes::{State, BOXES};
use super::Daemon;
use crate::http::Head;
use crate::reactor::Addr;
use crate::sandbox::wire::{self, Call, FsCall, Kind, Reply};
use std::time::{Duration, Instant};

/// Timers: the wait for init's answer to a file operation (the generation names it).
pub(super) const FS_DEADLINE: u16 = 5;
/// How long init may take to answer one (a large recursive remove included).
const FS_TIMEOUT: Duration = Duration::from_secs(60);
/// File operations waiting on one sandbox at once; the next gets 429.
pub const MAX_FS_CALLS: usize = 16;

/// What a client waiting on a file operation wants.
pub(crate) enum WaitKind {
    /// Its answer (as JSON).
    Answer,
    /// A download: the file opened, then its bytes.
    Download {
        /// `HEAD`: the head alone.
        head_only: bool,
    },
    /// An upload, at its head: the temporary file opened, then its body is read.
    Upload(Box<Head>),
    /// A watch: its stream, once init has it.
    Watch,
}

/// What an open or a watch whose client stopped waiting would hold in init, had init
/// carried it out after all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Abandoned {
    /// An open file (a download's, or an upload's temporary file).
    File,
    /// A watch.
    Watch,
}

/// Abandoned calls remembered per sandbox (init stuck that long on its file thread
/// has its handles' fate in its own hands).
const MAX_ABANDONED: usize = 256;

/// A client waiting for a file operation's answer.
pub(crate) struct FsWait {
    client: (usize, u64),
    call: FsCall,
    gen: u64,
    pub(super) kind: WaitKind,
}

impl Daemon {
    /// Sends file operation `call` to sandbox `key`'s init; the client waits.
    pub(super) fn box_fs(&mut self, ck: usize, key: usize, call: FsCall) {
        self.box_fs_as(ck, key, call, WaitKind::Answer);
    }

    /// A refusal before the call: an upload's unread body means the connection closes.
    fn fs_refuse(&mut self, ck: usize, kind: &WaitKind, resp: crate::http::Response) {
        match kind {
            WaitKind::Upload(head) if head.framing != crate::http::Framing::None => {
                self.respond_and_close(ck, resp)
            }
            _ => self.respond(ck, resp),
        }
    }

    /// Sends `call` for a client that wants `kind`.
    pub(super) fn box_fs_as(&mut self, ck: usize, key: usize, call: FsCall, kind: WaitKind) {
        let b = &self.boxes.boxes[key];
        if b.state != State::Running {
            let resp = crate::wbx::error(409, &format!("the sandbox is {}", b.state.name()));
            return self.fs_refuse(ck, &kind, resp);
        }
        if b.fs.len() >= MAX_FS_CALLS {
            let resp = crate::wbx::error(
                429,
                &format!("too many file operations waiting in this sandbox (limit {MAX_FS_CALLS}); retry when one is answered"),
            );
            return self.fs_refuse(ck, &kind, resp);
        }
        let Some(client) = self.box_wait(ck, key) else {
            return;
        };
        self.box_fs_send(key, client, &Call::Fs(call.clone()), call, kind);
    }

    /// Writes `wire_call` to init and waits for its reply, answered as `call`'s.
    pub(super) fn box_fs_send(
        &mut self,
        key: usize,
        client: (usize, u64),
        wire_call: &Call,
        call: FsCall,
        kind: WaitKind,
    ) {
        let b = &mut self.boxes.boxes[key];
        let call_id = b.take_call_id();
        // Paths are at most 4 KiB each: always within a frame.
        let _ = wire::encode_json(&mut b.wbuf, Kind::Call, call_id, wire_call);
        let gen = self.reactor.arm_new(
            Instant::now() + FS_TIMEOUT,
            Addr::new(BOXES, key, FS_DEADLINE),
        );
        if let Some(b) = self.boxes.boxes.get_mut(key) {
            b.fs.insert(
                call_id,
                FsWait {
                    client,
                    call,
                    gen,
                    kind,
                },
            );
        }
        self.box_flush(key);
    }

    /// init answered a call: true if it was a file operation's.
    pub(super) fn fs_reply(&mut self, key: usize, call_id: u32, payload: &[u8]) -> bool {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return false;
        };
        let Some(w) = b.fs.remove(&call_id) else {
            // Carried out after its client had its 502: what it opened is closed
            // (without this init held the file, an upload's temporary file or the
            // watch until its own limits refused every later one).
            let Some(what) = b.abandoned.remove(&call_id) else {
                return false;
            };
            if matches!(serde_json::from_slice::<Reply>(payload), Ok(Reply::Ok(_))) {
                let handle = call_id;
                let close = match what {
                    Abandoned::File => Call::FileClose { handle },
                    Abandoned::Watch => Call::WatchEnd { handle },
                };
                self.box_call(key, &close);
            }
            return true;
        };
        let reply = serde_json::from_slice::<Reply>(payload).ok();
        match w.kind {
            WaitKind::Download { head_only } => {
                self.download_opened(key, call_id, w.client, head_only, reply);
                return true;
            }
            WaitKind::Upload(head) => {
                self.upload_opened(key, call_id, w.client, head, reply);
                return true;
            }
            WaitKind::Watch => {
                self.watch_opened(key, call_id, w.client, reply);
                return true;
            }
            WaitKind::Answer => {}
        }
        let answer = reply.and_then(|r| crate::wbx::files::answer(&w.call, r));
        match answer {
            Some(resp) => self.box_answer(w.client, resp),
            None => {
                self.box_answer(
                    w.client,
                    crate::wbx::error(502, "the sandbox's init answered nonsense"),
                );
                self.box_end(key, "its init broke the protocol");
            }
        }
        true
    }

    /// Answers a waiting client with `resp` (an upload's, then closed).
    fn fs_answer(&mut self, w: FsWait, resp: crate::http::Response) {
        match &w.kind {
            WaitKind::Upload(head) => {
                let head = head.clone();
                self.upload_refuse(w.client, &head, resp);
            }
            _ => self.box_answer(w.client, resp),
        }
    }

    /// A file operation's wait ran out: the client gets 502; the sandbox goes on (a
    /// late answer is dropped).
    pub(super) fn fs_deadline(&mut self, key: usize, gen: u64) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let Some(&call) = b.fs.iter().find(|(_, w)| w.gen == gen).map(|(id, _)| id) else {
            return;
        };
        if b.state == State::Paused {
            // init is frozen with the rest: the wait goes on.
            let g = self.reactor.arm_new(
                Instant::now() + Duration::from_secs(1),
                Addr::new(BOXES, key, FS_DEADLINE),
            );
            if let Some(w) = self.boxes.boxes[key].fs.get_mut(&call) {
                w.gen = g;
            }
            return;
        }
        if let Some(w) = b.fs.remove(&call) {
            let what = match w.kind {
                WaitKind::Download { .. } | WaitKind::Upload(_) => Some(Abandoned::File),
                WaitKind::Watch => Some(Abandoned::Watch),
                WaitKind::Answer => None,
            };
            if let Some(what) = what.filter(|_| b.abandoned.len() < MAX_ABANDONED) {
                b.abandoned.insert(call, what);
            }
            self.fs_answer(
                w,
                crate::wbx::error(
                    502,
                    &format!(
                        "the sandbox's init did not answer the file operation in {} s",
                        FS_TIMEOUT.as_secs()
                    ),
                ),
            );
        }
    }

    /// Answers every waiting file operation of sandbox `key` (it ended).
    pub(super) fn fs_fail_all(&mut self, key: usize, status: u16, message: &str) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let waits: Vec<FsWait> = b.fs.drain().map(|(_, w)| w).collect();
        for w in waits {
            self.fs_answer(w, crate::wbx::error(status, message));
        }
    }
}

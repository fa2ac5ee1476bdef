//! File transfer for long-lived sandboxes (`GET`/`HEAD`/`PUT …/files?path=`): the
//! bytes go through the sandbox's init in `FileData` frames, never whole in memory on
//! either side.
//!
//! A download opens the file (as the user), answers the head with its size, then
//! forwards the frames init sends within the credit given with `FileMore`: at most
//! [`WINDOW`] bytes are ever on their way, and more is granted only as the client
//! takes them, so a slow client slows init, not the daemon's memory. Fewer bytes than
//! the head promised (the file shrank) cut the connection: a client never takes a
//! short body for a whole one.
//!
//! An upload is taken over at its head, before its body is read: init opens a
//! temporary file beside the target; the body is decoded as it arrives and sent as
//! frames while the sandbox's channel holds less than [`WINDOW`] (else reading the
//! client waits for the channel to drain); at its end `FileCommit` renames it into
//! place. A client that leaves, a body over the cap or a sandbox that ends leave no
//! temporary file behind.

use super::box_files::WaitKind;
use super::boxes::State;
use super::conn::{Owner, Phase};
use super::Daemon;
use crate::http::chunked::ChunkError;
use crate::http::conn::BodyState;
use crate::http::limits::MAX_WRITE_BUFFER_BYTES;
use crate::http::{Framing, Head, Params, Response};
use crate::sandbox::wire::{self, Call, FsCall, Kind, Reply};
use std::time::Duration;

/// Bytes of one transfer on their way between the daemon and init at most.
pub const WINDOW: u64 = 1 << 20;
/// Largest upload.
pub const MAX_UPLOAD_BYTES: usize = 100 << 20;
/// Transfers one sandbox has at once (downloads and uploads); the next gets 429.
pub const MAX_TRANSFERS: usize = 8;

/// A transfer under way, by its handle (the id of the call that opened it).
pub(crate) struct Xfer {
    /// Its client (key, serial).
    client: (usize, u64),
    /// A download: its size, bytes forwarded and credit granted so far.
    size: u64,
    received: u64,
    granted: u64,
    /// An upload (else a download).
    upload: bool,
}

impl Daemon {
    fn transfers_full(&self, key: usize) -> bool {
        let b = &self.boxes.boxes[key];
        let opening =
            b.fs.values()
                .filter(|w| matches!(w.kind, WaitKind::Download { .. } | WaitKind::Upload(_)))
                .count();
        b.transfers.len() + opening >= MAX_TRANSFERS
    }

    fn too_many_transfers() -> Response {
        crate::wbx::error(
            429,
            &format!("too many file transfers in this sandbox (limit {MAX_TRANSFERS}); retry when one ends"),
        )
    }

    /// `GET`/`HEAD …/files?path=`: opens the file; the answer follows its opening.
    pub(super) fn file_get(&mut self, ck: usize, key: usize, path: Vec<u8>, head_only: bool) {
        if self.boxes.boxes[key].state == State::Running && self.transfers_full(key) {
            self.respond(ck, Self::too_many_transfers());
            return;
        }
        self.box_fs_as(
            ck,
            key,
            FsCall::Open { path, write: false },
            WaitKind::Download { head_only },
        );
    }

    /// `PUT …/files?path=`, at its head: checks it and opens the temporary file; the
    /// body waits unread in the socket until then.
    pub(crate) fn file_put_begin(&mut self, ck: usize, head: Head, tenant: &str, params: &Params) {
        let refuse = |d: &mut Daemon, resp: Response| {
            if head.framing == Framing::None {
                d.respond(ck, resp);
            } else {
                d.respond_and_close(ck, resp);
            }
        };
        let (id, path) = match crate::wbx::files::put_target(&head, params) {
            Ok(t) => t,
            Err(resp) => return refuse(self, resp),
        };
        if let Framing::Length(n) = head.framing {
            if n > MAX_UPLOAD_BYTES as u64 {
                return refuse(self, upload_too_large());
            }
        }
        let Some(key) = self.boxes.find(tenant, &id) else {
            return refuse(self, crate::wbx::sandboxes::not_found());
        };
        let b = &self.boxes.boxes[key];
        if b.state != State::Running {
            let resp = crate::wbx::error(409, &format!("the sandbox is {}", b.state.name()));
            return refuse(self, resp);
        }
        if self.transfers_full(key) {
            return refuse(self, Self::too_many_transfers());
        }
        self.box_fs_as(
            ck,
            key,
            FsCall::Open { path, write: true },
            WaitKind::Upload(Box::new(head)),
        );
    }

    /// init answered an `Open`: the download starts (or its refusal is the answer).
    pub(super) fn download_opened(
        &mut self,
        key: usize,
        call_id: u32,
        client: (usize, u64),
        head_only: bool,
        reply: Option<Reply>,
    ) {
        let size = match reply {
            Some(Reply::Ok(v)) if v["handle"].as_u64() == Some(u64::from(call_id)) => {
                match v["size"].as_u64() {
                    Some(n) => n,
                    None => return self.open_nonsense(key, client),
                }
            }
            Some(r @ (Reply::Refused { .. } | Reply::Error(_))) => {
                let call = FsCall::Open {
                    path: Vec::new(),
                    write: false,
                };
                match crate::wbx::files::answer(&call, r) {
                    Some(resp) => self.box_answer(client, resp),
                    None => self.open_nonsense(key, client),
                }
                return;
            }
            _ => return self.open_nonsense(key, client),
        };
        let alive = self
            .conns
            .get(client.0)
            .is_some_and(|c| c.serial == client.1);
        if !alive || head_only || size == 0 {
            self.box_call(key, &Call::FileClose { handle: call_id });
            if alive {
                self.download_head(client.0, size);
                self.download_done(client.0);
            }
            return;
        }
        let serial = self.boxes.boxes[key].serial;
        self.download_head(client.0, size);
        self.conn_own(
            client.0,
            Owner::BoxFile {
                key,
                serial,
                handle: call_id,
            },
        );
        self.boxes.boxes[key].transfers.insert(
            call_id,
            Xfer {
                client,
                size,
                received: 0,
                granted: WINDOW,
                upload: false,
            },
        );
        self.box_call(
            key,
            &Call::FileMore {
                handle: call_id,
                bytes: WINDOW,
            },
        );
        self.conn_flush(client.0);
    }

    /// init answered an `Open` or `Watch` with nonsense: the client gets 502, the
    /// sandbox ends.
    pub(super) fn open_nonsense(&mut self, key: usize, client: (usize, u64)) {
        self.box_answer(
            client,
            crate::wbx::error(502, "the sandbox's init answered nonsense"),
        );
        self.box_end(key, "its init broke the protocol");
    }

    fn download_head(&mut self, ck: usize, size: u64) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let keep = c.http.keep_alive && !shutting_down;
        c.http.note_head(200);
        crate::http::response::write_head(
            &mut c.http.wbuf,
            200,
            &[
                ("Content-Type", "application/octet-stream".into()),
                ("Cache-Control", "no-store".into()),
            ],
            Some(usize::try_from(size).unwrap_or(usize::MAX)),
            keep,
        );
        if !keep {
            c.http.keep_alive = false;
        }
    }

    /// The whole body is queued: the connection reads heads again.
    fn download_done(&mut self, ck: usize) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.phase = Phase::Head;
        if !c.http.keep_alive || shutting_down {
            c.http.close_after_flush = true;
        }
        let t = Duration::from_millis(self.cfg.idle_timeout_ms);
        self.arm_conn(ck, t);
        self.conn_pump(ck);
    }

    /// A download's client must not take what it got for the whole file: cut it.
    fn download_cut(&mut self, ck: usize) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        crate::warn_limited!("conn={ck} download ended early; closing the connection");
        c.http.phase = Phase::Head;
        c.http.keep_alive = false;
        c.http.close_after_flush = true;
        self.conn_after_io(ck);
    }

    /// A `FileData` frame from init for handle `handle`.
    pub(super) fn file_data(&mut self, key: usize, handle: u32, payload: &[u8]) {
        let Some(x) = self.boxes.boxes[key].transfers.get_mut(&handle) else {
            return; // closed meanwhile
        };
        if x.upload {
            return self.box_end(key, "its init sent data for an upload");
        }
        // init is not trusted: what it sends past its credit would pile up in the
        // client's buffer, the daemon's memory.
        if x.received + payload.len() as u64 > x.granted {
            return self.box_end(key, "its init sent more file data than it was granted");
        }
        let (ck, cserial) = x.client;
        let alive = self.conns.get(ck).is_some_and(|c| c.serial == cserial);
        if payload.is_empty() || x.received + payload.len() as u64 > x.size {
            // The end before the size (the file shrank), or more than it: cut.
            let whole = payload.is_empty() && x.received == x.size;
            self.boxes.boxes[key].transfers.remove(&handle);
            if !payload.is_empty() {
                self.box_call(key, &Call::FileClose { handle });
            }
            if alive {
                if whole {
                    self.download_done(ck);
                } else {
                    self.download_cut(ck);
                }
            }
            return;
        }
        x.received += payload.len() as u64;
        let done = x.received == x.size;
        if !alive {
            return;
        }
        if let Some(c) = self.conns.get_mut(ck) {
            c.http.wbuf.extend_from_slice(payload);
        }
        if done {
            // init's empty frame follows; the client need not wait for it.
            self.boxes.boxes[key].transfers.remove(&handle);
            self.box_call(key, &Call::FileClose { handle });
            self.conn_flush(ck);
            self.download_done(ck);
            return;
        }
        self.conn_flush(ck);
        self.download_grant(key, handle);
    }

    /// Grants init more credit for `handle` when little is on its way and the client
    /// keeps up.
    fn download_grant(&mut self, key: usize, handle: u32) {
        let Some(x) = self
            .boxes
            .boxes
            .get_mut(key)
            .and_then(|b| b.transfers.get_mut(&handle))
        else {
            return;
        };
        let behind = self
            .conns
            .get(x.client.0)
            .filter(|c| c.serial == x.client.1)
            .map_or(usize::MAX, |c| c.http.pending_write());
        let on_way = x.granted.saturating_sub(x.received);
        let left = x.size.saturating_sub(x.received);
        if behind >= MAX_WRITE_BUFFER_BYTES / 2 || on_way >= WINDOW / 2 || on_way >= left {
            return;
        }
        let more = (WINDOW - on_way).min(left - on_way);
        x.granted += more;
        self.box_call(
            key,
            &Call::FileMore {
                handle,
                bytes: more,
            },
        );
    }

    /// A download's client took most of what was queued.
    pub(crate) fn file_drained(&mut self, key: usize, serial: u64, handle: u32) {
        if self
            .boxes
            .boxes
            .get(key)
            .is_some_and(|b| b.serial == serial)
        {
            self.download_grant(key, handle);
        }
    }

    /// A transfer's client left: init closes the file (an upload's temporary file is
    /// removed).
    pub(crate) fn file_client_left(&mut self, key: usize, serial: u64, handle: u32) {
        let Some(b) = self.boxes.boxes.get_mut(key).filter(|b| b.serial == serial) else {
            return;
        };
        if b.transfers.remove(&handle).is_some() {
            self.box_call(key, &Call::FileClose { handle });
        }
    }

    /// init answered an upload's `Open`: its body is read now.
    pub(super) fn upload_opened(
        &mut self,
        key: usize,
        call_id: u32,
        client: (usize, u64),
        head: Box<Head>,
        reply: Option<Reply>,
    ) {
        match reply {
            Some(Reply::Ok(v)) if v["handle"].as_u64() == Some(u64::from(call_id)) => {}
            Some(r @ (Reply::Refused { .. } | Reply::Error(_))) => {
                let call = FsCall::Open {
                    path: Vec::new(),
                    write: true,
                };
                match crate::wbx::files::answer(&call, r) {
                    Some(resp) => self.upload_refuse(client, &head, resp),
                    None => self.open_nonsense(key, client),
                }
                return;
            }
            _ => return self.open_nonsense(key, client),
        }
        let alive = self
            .conns
            .get(client.0)
            .is_some_and(|c| c.serial == client.1);
        if !alive {
            self.box_call(key, &Call::FileClose { handle: call_id });
            return;
        }
        let serial = self.boxes.boxes[key].serial;
        self.boxes.boxes[key].transfers.insert(
            call_id,
            Xfer {
                client,
                size: 0,
                received: 0,
                granted: 0,
                upload: true,
            },
        );
        let ck = client.0;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let state = match head.framing {
            Framing::None => BodyState::Length(0),
            Framing::Length(n) => BodyState::Length(n),
            Framing::Chunked => BodyState::Chunked(crate::http::chunked::ChunkedDecoder::new()),
        };
        if head.expect_continue && head.framing != Framing::None {
            c.http
                .wbuf
                .extend_from_slice(crate::http::response::CONTINUE);
        }
        c.http.phase = Phase::Owned(Owner::BoxUpload {
            key,
            serial,
            handle: call_id,
            state,
            path: head.query_param_bytes("path").unwrap_or_default(),
            waiting: false,
        });
        let t = Duration::from_millis(self.cfg.head_timeout_ms);
        self.arm_conn(ck, t);
        self.conn_pump(ck);
    }

    /// Answers an upload whose body may be unread (then the connection closes).
    pub(super) fn upload_refuse(&mut self, client: (usize, u64), head: &Head, resp: Response) {
        if self
            .conns
            .get(client.0)
            .is_some_and(|c| c.serial == client.1)
        {
            if head.framing == Framing::None {
                self.respond(client.0, resp);
                self.conn_pump(client.0);
            } else {
                self.respond_and_close(client.0, resp);
                self.conn_after_io(client.0);
            }
        }
    }

    /// Decodes the upload's body from the read buffer into frames for init while the
    /// sandbox's channel has room. True when it should be called again at once.
    pub(crate) fn advance_box_upload(&mut self, ck: usize) -> bool {
        let Some(c) = self.conns.get_mut(ck) else {
            return false;
        };
        let Phase::Owned(Owner::BoxUpload {
            key,
            serial,
            handle,
            state,
            waiting,
            ..
        }) = &mut c.http.phase
        else {
            return false;
        };
        let (key, serial, handle) = (*key, *serial, *handle);
        let Some(b) = self.boxes.boxes.get_mut(key).filter(|b| b.serial == serial) else {
            return false;
        };
        if b.wbuf.len() as u64 >= WINDOW {
            // The channel is full: nothing is read until box_flush finds it drained.
            *waiting = true;
            if !b.upload_waiting.contains(&(ck, c.serial)) {
                b.upload_waiting.push((ck, c.serial));
            }
            return false;
        }
        let mut buf = Vec::new();
        let before = c.http.rbuf.len();
        let room = usize::try_from(WINDOW).unwrap_or(usize::MAX) - b.wbuf.len();
        let fed = state.feed(&mut c.http.rbuf, &mut buf, MAX_UPLOAD_BYTES, room);
        let added = before.saturating_sub(c.http.rbuf.len());
        let progressed = added > 0;
        for part in buf.chunks(wire::MAX_DATA_BYTES) {
            let _ = wire::encode(&mut b.wbuf, Kind::FileData, handle, part);
        }
        let done = match fed {
            Ok(done) => done,
            Err(e) => {
                let resp = match e {
                    ChunkError::TooLarge => upload_too_large(),
                    e => crate::wbx::error(400, &format!("invalid request body: {e}")),
                };
                b.transfers.remove(&handle);
                self.box_call(key, &Call::FileClose { handle });
                self.respond_and_close(ck, resp);
                return false;
            }
        };
        self.box_flush(key);
        if progressed {
            self.arm_body(ck, added);
        }
        if !done {
            return progressed;
        }
        // The whole body is with init: put it in place; the client waits for that.
        let path = match self.conns.get(ck).map(|c| &c.http.phase) {
            Some(Phase::Owned(Owner::BoxUpload { path, .. })) => path.clone(),
            _ => Vec::new(),
        };
        if let Some(b) = self.boxes.boxes.get_mut(key) {
            b.transfers.remove(&handle);
        }
        self.conn_own(
            ck,
            Owner::BoxWait {
                key,
                serial,
                create: false,
            },
        );
        let Some(cserial) = self.conns.get(ck).map(|c| c.serial) else {
            return false;
        };
        self.box_fs_send(
            key,
            (ck, cserial),
            &Call::FileCommit { handle },
            FsCall::Stat { path },
            WaitKind::Answer,
        );
        false
    }

    /// Sandbox `key`'s channel drained: uploads waiting for room go on.
    pub(super) fn uploads_resume(&mut self, key: usize) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        if b.upload_waiting.is_empty() || b.wbuf.len() as u64 >= WINDOW / 2 {
            return;
        }
        let waiting = std::mem::take(&mut b.upload_waiting);
        for (ck, serial) in waiting {
            let Some(c) = self.conns.get_mut(ck).filter(|c| c.serial == serial) else {
                continue;
            };
            if let Phase::Owned(Owner::BoxUpload { waiting, .. }) = &mut c.http.phase {
                *waiting = false;
            }
            self.conn_pump(ck);
        }
    }

    /// Sandbox `key` ended: its downloads are cut, its uploads answered `status`.
    pub(super) fn transfers_fail_all(&mut self, key: usize, status: u16, message: &str) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let xfers: Vec<Xfer> = b.transfers.drain().map(|(_, x)| x).collect();
        b.upload_waiting.clear();
        for x in xfers {
            let (ck, serial) = x.client;
            if self.conns.get(ck).is_none_or(|c| c.serial != serial) {
                continue;
            }
            if x.upload {
                self.respond_and_close(ck, crate::wbx::error(status, message));
                self.conn_after_io(ck);
            } else {
                self.download_cut(ck);
            }
        }
    }
}

fn upload_too_large() -> Response {
    crate::wbx::error(
        413,
        &format!("an upload is at most {} MiB", MAX_UPLOAD_BYTES >> 20),
    )
}

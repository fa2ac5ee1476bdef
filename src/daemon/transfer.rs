//! Reactor glue for requests whose work is a pool job (session calls), for uploads
//! streamed to a file as they arrive, and for downloads forwarded from a transfer
//! thread's pipe.
//!
//! An upload body is decoded here and written to its temporary file by pool jobs, one
//! 256 KiB chunk at a time: while a chunk is being written, nothing more is read from
//! the client (the read-ahead bound pushes back), so the body is never held whole and
//! this thread never waits on a disk. Opening, the last write, `fsync`, rename and abort
//! run on the pool too. A download is produced by its own thread into a pipe registered here, with
//! the usual write-buffer backpressure: when the client does not read, the pipe is
//! not read, and the thread blocks.

use super::conn::{Owner, Phase};
use super::Daemon;
use crate::api::sessions::{self as sapi, XFER_OK};
use crate::api::{self, Download, Outcome, UploadTarget};
use crate::http::chunked::{ChunkError, ChunkedDecoder};
use crate::http::conn::BodyState;
use crate::http::limits::{MAX_WRITE_BUFFER_BYTES, UPLOAD_BODY_BYTES};
use crate::reactor::{Addr, Component, ComponentId, Done, Readiness};

/// Upload bytes gathered before a pool job writes them to the file.
pub const UPLOAD_CHUNK_BYTES: usize = 256 * 1024;
use crate::http::{Framing, Head, Params, Response};
use mio::unix::pipe;
use mio::{Interest, Token};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The transfer component: download pipes (key: the connection).
pub(crate) const TRANSFER: ComponentId = ComponentId(2);
/// The download's pipe.
const PIPE: u16 = 0;

/// Downloads on the loop.
pub(crate) struct Transfers;

impl Component<Daemon> for Transfers {
    fn name(&self) -> &'static str {
        "transfer"
    }

    fn ready(&self, d: &mut Daemon, ck: usize, what: u16, _: Readiness) {
        if what == PIPE {
            d.transfer_event(ck);
        }
    }

    fn timer(&self, _: &mut Daemon, _: usize, _: u16, _: u64) {}
}

/// Where an upload's body goes: a temporary file written by pool jobs, and what
/// happens on the pool once the body is whole. A workspace upload
/// ([`UploadTarget`]: a file of a session) and an eryx environment's packages
/// (`eryx_envs`) are both received this way.
pub trait UploadSink: Send {
    /// The file the body is written to.
    fn file(&mut self) -> &mut std::fs::File;
    /// Bytes the body may have (past them: refused with [`UploadSink::too_large`]).
    fn cap(&self) -> u64;
    /// The answer to a body over [`UploadSink::cap`].
    fn too_large(&self) -> Response;
    /// An error answer (made in the isobox face's shape) in the shape of the face
    /// the upload is on.
    fn shape(&self, resp: Response) -> Response {
        resp
    }
    /// The body is whole (on the pool): what the loop does next for connection `ck`
    /// (`serial`).
    fn commit(self: Box<Self>, ck: usize, serial: u64) -> Done<Daemon>;
    /// The upload is aborted (on the loop, before its file is removed on the pool):
    /// what it holds of its tenant's limits is given back at once.
    fn release(&mut self) {}
}

impl UploadSink for UploadTarget {
    fn file(&mut self) -> &mut std::fs::File {
        self.upload.file()
    }

    fn cap(&self) -> u64 {
        self.avail_bytes.min(UPLOAD_BODY_BYTES as u64)
    }

    fn too_large(&self) -> Response {
        if self.avail_bytes < UPLOAD_BODY_BYTES as u64 {
            Response::error(
                413,
                "quota_exceeded",
                Some("the upload is larger than the free space of the session's workspace"),
            )
        } else {
            too_large()
        }
    }

    fn commit(self: Box<Self>, ck: usize, serial: u64) -> Done<Daemon> {
        let resp = sapi::upload_commit(*self);
        let outcome = if resp.status >= 400 {
            Outcome::RespondClose(resp)
        } else {
            Outcome::Respond(resp)
        };
        Box::new(move |d: &mut Daemon| d.on_outcome(ck, serial, outcome))
    }
}

/// A download being forwarded.
pub struct Transfer {
    rx: pipe::Receiver,
    token: Token,
    /// Chunked framing (length unknown in advance).
    chunked: bool,
    /// Bytes still owed under `Content-Length`.
    remaining: u64,
    status: Arc<AtomicU8>,
}

impl Daemon {
    /// Hands a request's blocking work to the pool; the connection waits in `Job`.
    pub(crate) fn start_job(&mut self, ck: usize, job: api::Job) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.phase = Phase::Owned(Owner::Job);
        let serial = c.serial;
        let wrapped = Box::new(move || -> Done<Daemon> {
            let outcome = job();
            Box::new(move |d: &mut Daemon| d.on_outcome(ck, serial, outcome))
        });
        if self.reactor.submit(wrapped).is_err() {
            self.respond(
                ck,
                Response::error(503, "overloaded", Some("worker queue full"))
                    .with_header("Retry-After", "1"),
            );
        }
    }

    /// Starts work that answers on its own (a store write): the connection waits as for
    /// a job, and the answer comes back through the reactor's mailbox.
    pub(crate) fn start_deferred(&mut self, ck: usize, work: api::Deferred) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.phase = Phase::Owned(Owner::Job);
        let serial = c.serial;
        let mailbox = self.reactor.mailbox();
        work(Box::new(move |outcome| {
            mailbox.send(Box::new(move |d: &mut Daemon| {
                d.on_outcome(ck, serial, outcome);
            }));
        }));
    }

    /// Whether connection `ck` is still the one (by serial) in `phase`.
    pub(crate) fn conn_waiting(&self, ck: usize, serial: u64, upload: bool) -> bool {
        self.conns.get(ck).is_some_and(|c| {
            c.serial == serial
                && if upload {
                    matches!(c.owner(), Some(Owner::UploadWait { .. }))
                } else {
                    matches!(c.owner(), Some(Owner::Job))
                }
        })
    }

    /// A job's outcome. If the client left meanwhile, it is dropped (a lease it holds
    /// ends; a transfer thread sees its pipe closed).
    pub(crate) fn on_outcome(&mut self, ck: usize, serial: u64, outcome: Outcome) {
        // A kernel create holds a slot and a session: acted on even if the client left.
        if let Outcome::KernelCreated(created) = outcome {
            self.kernel_create(ck, serial, created);
            return;
        }
        if !self.conn_waiting(ck, serial, false) {
            return;
        }
        match outcome {
            Outcome::Respond(resp) => {
                self.respond(ck, resp);
                self.conn_pump(ck);
            }
            Outcome::RespondClose(resp) => {
                self.respond_and_close(ck, resp);
                self.conn_after_io(ck);
            }
            Outcome::Execute {
                plan,
                delivery,
                tenant,
            } => {
                self.start_run(ck, plan, delivery, &tenant);
                // A refusal (capacity, shutdown) or the SSE head is queued: send it.
                self.conn_after_io(ck);
            }
            Outcome::Download(d) => self.start_transfer(ck, *d),
            Outcome::KernelCreated(_) => {}
            Outcome::KernelStep {
                session,
                plan,
                code,
                delivery,
                tenant,
            } => {
                self.start_kernel_step(ck, serial, &session, plan, code, delivery, &tenant);
                self.conn_after_io(ck);
            }
            Outcome::KernelDelete { session } => {
                self.kernel_delete(ck, serial, &session);
                self.conn_after_io(ck);
            }
        }
    }

    // ---- uploads ----

    pub(crate) fn begin_upload(&mut self, ck: usize, head: Head, tenant: String, params: Params) {
        if let Framing::Length(n) = head.framing {
            if n > UPLOAD_BODY_BYTES as u64 {
                self.respond_and_close(ck, too_large());
                return;
            }
        }
        let job = match api::sessions::upload_begin(&mut self.app, &head, &tenant, &params) {
            Ok(j) => j,
            Err(resp) => {
                if head.framing == Framing::None {
                    self.respond(ck, resp);
                } else {
                    self.respond_and_close(ck, resp);
                }
                return;
            }
        };
        self.begin_upload_with(
            ck,
            head,
            Box::new(move || job().map(|t| t as Box<dyn UploadSink>)),
            |r| r,
        );
    }

    /// Runs `job` (which makes the upload's file) on the pool, then receives the body
    /// into it.
    pub(crate) fn begin_upload_with(
        &mut self,
        ck: usize,
        head: Head,
        job: Box<dyn FnOnce() -> Result<Box<dyn UploadSink>, Response> + Send>,
        shape: fn(Response) -> Response,
    ) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let serial = c.serial;
        c.http.phase = Phase::Owned(Owner::UploadWait {
            head: Box::new(head),
        });
        let wrapped = Box::new(move || -> Done<Daemon> {
            let result = job();
            Box::new(move |d: &mut Daemon| d.on_upload_ready(ck, serial, result))
        });
        if self.reactor.submit(wrapped).is_err() {
            self.respond_and_close(
                ck,
                shape(
                    Response::error(503, "overloaded", Some("worker queue full"))
                        .with_header("Retry-After", "1"),
                ),
            );
        }
    }

    /// The upload's file is open (or it was refused): now read the body, after the
    /// `100 Continue` when the client waits for one.
    pub(crate) fn on_upload_ready(
        &mut self,
        ck: usize,
        serial: u64,
        result: Result<Box<dyn UploadSink>, Response>,
    ) {
        if !self.conn_waiting(ck, serial, true) {
            if let Ok(t) = result {
                self.abort_upload(Some(t));
            }
            return;
        }
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let Phase::Owned(Owner::UploadWait { head }) =
            std::mem::replace(&mut c.http.phase, Phase::Owned(Owner::Job))
        else {
            return;
        };
        let target = match result {
            Ok(t) => t,
            Err(resp) => {
                if head.framing == Framing::None {
                    self.respond(ck, resp);
                    self.conn_pump(ck);
                } else {
                    self.respond_and_close(ck, resp);
                    self.conn_after_io(ck);
                }
                return;
            }
        };
        if let Framing::Length(n) = head.framing {
            if n > target.cap() {
                let resp = target.too_large();
                self.abort_upload(Some(target));
                self.respond_and_close(ck, resp);
                self.conn_after_io(ck);
                return;
            }
        }
        let state = match head.framing {
            Framing::None => BodyState::Length(0),
            Framing::Length(n) => BodyState::Length(n),
            Framing::Chunked => BodyState::Chunked(ChunkedDecoder::new()),
        };
        if head.expect_continue && head.framing != Framing::None {
            c.http
                .wbuf
                .extend_from_slice(crate::http::response::CONTINUE);
        }
        c.http.phase = Phase::Owned(Owner::Upload {
            state,
            target: Some(target),
            buf: Vec::new(),
        });
        let t = Duration::from_millis(self.cfg.head_timeout_ms);
        self.arm_conn(ck, t);
        self.conn_pump(ck);
    }

    /// Decodes body bytes from the read buffer and hands them to the pool in chunks of
    /// [`UPLOAD_CHUNK_BYTES`]; while a chunk is being written nothing more is consumed,
    /// so the read-ahead bound pushes back on the client. Always returns false: once the
    /// body is complete the connection waits in `Job` for the commit's outcome, which
    /// resumes parsing.
    pub(crate) fn advance_upload(&mut self, ck: usize) -> bool {
        let Some(c) = self.conns.get_mut(ck) else {
            return false;
        };
        let Phase::Owned(Owner::Upload { state, target, buf }) = &mut c.http.phase else {
            return false;
        };
        if target.is_none() {
            return false; // a chunk is being written
        }
        let mut err: Option<Response> = None;
        let before = c.http.rbuf.len();
        // The decoder counts a chunked body against the cap itself; the room bounds
        // what one pass decodes, so the chunk buffer stays near UPLOAD_CHUNK_BYTES.
        let room = UPLOAD_CHUNK_BYTES.saturating_sub(buf.len());
        let Some(sink) = target.as_ref() else {
            return false;
        };
        let cap = usize::try_from(sink.cap()).unwrap_or(usize::MAX);
        let done = match state.feed(&mut c.http.rbuf, buf, cap, room) {
            Ok(done) => done,
            Err(ChunkError::TooLarge) => {
                err = Some(sink.too_large());
                false
            }
            Err(e) => {
                err = Some(sink.shape(Response::error(400, "bad_request", Some(&e.to_string()))));
                false
            }
        };
        let added = before.saturating_sub(c.http.rbuf.len());
        let progressed = added > 0;
        if let Some(resp) = err {
            self.take_upload(ck);
            self.respond_and_close(ck, resp);
            return false;
        }
        if progressed {
            self.arm_body(ck, added);
        }
        let Some(c) = self.conns.get_mut(ck) else {
            return false;
        };
        let serial = c.serial;
        let Phase::Owned(Owner::Upload { target, buf, .. }) = &mut c.http.phase else {
            return false;
        };
        if done {
            let Phase::Owned(Owner::Upload {
                target: Some(t),
                buf,
                ..
            }) = std::mem::replace(&mut c.http.phase, Phase::Owned(Owner::Job))
            else {
                return false;
            };
            // The last chunk and the commit (fsync, rename) in one job.
            let job = Box::new(move || -> Done<Daemon> {
                let mut t = t;
                match t.file().write_all(&buf) {
                    Ok(()) => t.commit(ck, serial),
                    Err(e) => {
                        let resp = t.shape(write_error(&e));
                        drop(t);
                        let outcome = Outcome::RespondClose(resp);
                        Box::new(move |d: &mut Daemon| d.on_outcome(ck, serial, outcome))
                    }
                }
            });
            self.reactor.submit_must(job);
            return false;
        }
        if buf.len() >= UPLOAD_CHUNK_BYTES {
            let (Some(mut t), chunk) = (target.take(), std::mem::take(buf)) else {
                return false;
            };
            let job = Box::new(move || -> Done<Daemon> {
                let result = t
                    .file()
                    .write_all(&chunk)
                    .map_err(|e| t.shape(write_error(&e)));
                Box::new(move |d: &mut Daemon| d.on_upload_wrote(ck, serial, t, result))
            });
            self.reactor.submit_must(job);
        }
        false
    }

    /// A chunk of an upload was written (or failed).
    pub(crate) fn on_upload_wrote(
        &mut self,
        ck: usize,
        serial: u64,
        target: Box<dyn UploadSink>,
        result: Result<(), Response>,
    ) {
        let live = self.conns.get(ck).is_some_and(|c| {
            c.serial == serial && matches!(c.owner(), Some(Owner::Upload { target: None, .. }))
        });
        if !live {
            self.abort_upload(Some(target));
            return;
        }
        if let Err(resp) = result {
            self.abort_upload(Some(target));
            self.respond_and_close(ck, resp);
            self.conn_after_io(ck);
            return;
        }
        if let Some(Owner::Upload { target: slot, .. }) =
            self.conns.get_mut(ck).and_then(|c| c.owner_mut())
        {
            *slot = Some(target);
        }
        self.conn_pump(ck);
    }

    /// Takes the upload out of the connection (if it has one) and aborts it: a
    /// session's (its temporary file removed here) or a WBX sandbox's (init closes and
    /// removes its temporary file, and the sandbox's transfer slot is free again).
    pub(crate) fn take_upload(&mut self, ck: usize) {
        let (t, boxed) = match self.conns.get_mut(ck).and_then(|c| c.owner_mut()) {
            Some(Owner::Upload { target, .. }) => (target.take(), None),
            Some(Owner::BoxUpload {
                key,
                serial,
                handle,
                ..
            }) => (None, Some((*key, *serial, *handle))),
            _ => (None, None),
        };
        self.abort_upload(t);
        if let Some((key, serial, handle)) = boxed {
            self.file_client_left(key, serial, handle);
        }
    }

    /// Removes an unfinished upload's temporary file on the pool (never here: this
    /// thread may not unlink).
    pub(crate) fn abort_upload(&mut self, t: Option<Box<dyn UploadSink>>) {
        if let Some(mut t) = t {
            t.release();
            self.reactor.submit_must(Box::new(move || {
                drop(t);
                super::nothing()
            }));
        }
    }

    // ---- downloads ----

    fn start_transfer(&mut self, ck: usize, d: Download) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let keep = c.http.keep_alive && !shutting_down;
        let Download {
            head,
            length,
            rx,
            status,
        } = d;
        let mut headers = head.headers.clone();
        if length.is_none() {
            headers.push(("Transfer-Encoding", "chunked".into()));
        }
        headers.push(("Cache-Control", "no-store".into()));
        c.http.note_head(head.status);
        crate::http::response::write_head(
            &mut c.http.wbuf,
            head.status,
            &headers,
            length.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            keep,
        );
        let rx = match rx {
            Some(fd) if !c.http.head_only => fd,
            _ => {
                // HEAD: the head alone.
                c.http.phase = Phase::Head;
                if !keep {
                    c.http.close_after_flush = true;
                }
                let t = Duration::from_millis(self.cfg.idle_timeout_ms);
                self.arm_conn(ck, t);
                self.conn_pump(ck);
                return;
            }
        };
        let mut rx = pipe::Receiver::from(rx);
        if rx.set_nonblocking(true).is_err() {
            c.http.keep_alive = false;
            c.http.close_after_flush = true;
            c.http.phase = Phase::Head;
            self.conn_after_io(ck);
            return;
        }
        let token =
            match self
                .reactor
                .register(&mut rx, Addr::new(TRANSFER, ck, PIPE), Interest::READABLE)
            {
                Ok(t) => t,
                Err(e) => {
                    crate::error_limited!("op=register transfer err={e}");
                    if let Some(c) = self.conns.get_mut(ck) {
                        c.http.keep_alive = false;
                        c.http.close_after_flush = true;
                        c.http.phase = Phase::Head;
                    }
                    self.conn_after_io(ck);
                    return;
                }
            };
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.phase = Phase::Owned(Owner::Transfer(Box::new(Transfer {
            rx,
            token,
            chunked: length.is_none(),
            remaining: length.unwrap_or(0),
            status,
        })));
        let t = Duration::from_millis(self.cfg.idle_timeout_ms);
        self.arm_conn(ck, t);
        self.transfer_pump(ck);
    }

    /// Moves pipe bytes into the write buffer until the pipe is empty or the buffer full.
    pub(crate) fn transfer_pump(&mut self, ck: usize) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let Some(c) = self.conns.get_mut(ck) else {
                return;
            };
            if c.http.pending_write() >= MAX_WRITE_BUFFER_BYTES {
                break;
            }
            let Phase::Owned(Owner::Transfer(t)) = &mut c.http.phase else {
                return;
            };
            match t.rx.read(&mut buf) {
                Ok(0) => {
                    self.finish_transfer(ck);
                    return;
                }
                Ok(n) => {
                    if t.chunked {
                        crate::http::chunked::write_chunk(&mut c.http.wbuf, &buf[..n]);
                    } else {
                        let take = usize::try_from(t.remaining).unwrap_or(usize::MAX).min(n);
                        c.http.wbuf.extend_from_slice(&buf[..take]);
                        t.remaining -= take as u64;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.finish_transfer(ck);
                    return;
                }
            }
        }
        self.conn_flush(ck);
    }

    /// The pipe reached EOF: finish the response, or cut the connection if the thread
    /// failed or delivered less than promised (the client must not take a truncated
    /// body for a whole one).
    fn finish_transfer(&mut self, ck: usize) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let Phase::Owned(Owner::Transfer(t)) = std::mem::replace(&mut c.http.phase, Phase::Head)
        else {
            return;
        };
        let ok = t.status.load(Ordering::Acquire) == XFER_OK && (t.chunked || t.remaining == 0);
        let chunked = t.chunked;
        self.transfer_release(*t);
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        if ok {
            if chunked {
                c.http
                    .wbuf
                    .extend_from_slice(crate::http::chunked::LAST_CHUNK);
            }
            if !c.http.keep_alive || shutting_down {
                c.http.close_after_flush = true;
            }
            let t = Duration::from_millis(self.cfg.idle_timeout_ms);
            self.arm_conn(ck, t);
            self.conn_pump(ck);
        } else {
            crate::warn_limited!("conn={ck} download ended early; closing the connection");
            c.http.keep_alive = false;
            c.http.close_after_flush = true;
            self.conn_after_io(ck);
        }
    }

    /// Deregisters a transfer's pipe; dropping it tells the thread to stop.
    pub(crate) fn transfer_release(&mut self, mut t: Transfer) {
        self.reactor.deregister(&mut t.rx, t.token);
    }

    /// The transfer pipe of `ck` became readable.
    pub(crate) fn transfer_event(&mut self, ck: usize) {
        self.transfer_pump(ck);
        self.conn_after_io(ck);
    }
}

fn too_large() -> Response {
    Response::error(
        413,
        "payload_too_large",
        Some("an upload is at most 16 MiB"),
    )
}

fn write_error(e: &io::Error) -> Response {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => Response::error(
            413,
            "quota_exceeded",
            Some("the session's disk quota is exhausted"),
        ),
        _ => {
            crate::error_limited!("op=upload write err={e}");
            Response::error(500, "io_error", Some("writing the upload failed"))
        }
    }
}

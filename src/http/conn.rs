//! One client connection's HTTP/1.1 state machine, sans-IO: the read buffer and what
//! is parsed out of it (heads, bodies), the write buffer and what is framed into it
//! (responses, lazily encoded bodies, chunked SSE streams), and the decisions a
//! connection makes on its own (linger or close after a response, what its deadline
//! means in each phase). Bytes come in through any `Read` and go out through any
//! `Write`; nothing here knows a socket, a token or a timer wheel.
//!
//! It is generic over `R`, the face's route (what the body phase remembers for the
//! dispatch), and `W`, whoever the request is with once it is handed over (a run, a
//! pool job, an upload, a download, an agent loop, next a WebSocket): the connection
//! asks that owner only its [`Role`]. The owner answers through the response methods.
//!
//! Requests are served strictly one at a time, so pipelined requests are answered in
//! order: while an owner works on one, the next waits in the read buffer (at most
//! `MAX_READ_AHEAD_BYTES`). Reactor thread only.

use super::chunked::{chunk_head, write_chunk, ChunkError, ChunkedDecoder, LAST_CHUNK};
use super::lazy::LazyBody;
use super::limits::{MAX_HEAD_BYTES, MAX_READ_AHEAD_BYTES, MAX_WRITE_BUFFER_BYTES};
use super::parse::{find_head_end, parse_head};
use super::{Framing, Head, HttpError, Params, Request, Response};
use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

/// How long a closing connection keeps draining what the client still sends.
pub const LINGER: Duration = Duration::from_secs(2);
/// How much one read from a socket takes at most.
const READ_CHUNK: usize = 16 * 1024;

/// How the body being read is delimited.
pub enum BodyState {
    /// Bytes still expected.
    Length(u64),
    /// Chunked decoder.
    Chunked(ChunkedDecoder),
}

impl BodyState {
    /// The state for a request's framing (`None`: an empty body).
    pub fn of(framing: Framing) -> BodyState {
        match framing {
            Framing::None => BodyState::Length(0),
            Framing::Length(n) => BodyState::Length(n),
            Framing::Chunked => BodyState::Chunked(ChunkedDecoder::new()),
        }
    }

    /// Moves body bytes from the front of `rbuf` into `out`, at most `room` of them
    /// (a chunked body may go a few framing bytes past it), counting a chunked body
    /// against `cap`. True once the body is complete.
    ///
    /// # Errors
    /// What the chunked decoder found (`TooLarge` past `cap`).
    pub fn feed(
        &mut self,
        rbuf: &mut Vec<u8>,
        out: &mut Vec<u8>,
        cap: usize,
        room: usize,
    ) -> Result<bool, ChunkError> {
        match self {
            BodyState::Length(remaining) => {
                let take = usize::try_from(*remaining)
                    .unwrap_or(usize::MAX)
                    .min(rbuf.len())
                    .min(room);
                out.extend(rbuf.drain(..take));
                *remaining -= take as u64;
                Ok(*remaining == 0)
            }
            BodyState::Chunked(dec) => {
                // The decoder stops at the end of its input: bounding the input bounds
                // what it decodes.
                let upto = rbuf.len().min(room.saturating_add(64));
                let n = dec.feed(&rbuf[..upto], out, cap)?;
                rbuf.drain(..n);
                Ok(dec.is_done())
            }
        }
    }
}

/// How a request's owner relates to its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Works on the request and answers once (a pool job): a client that half-closed
    /// still gets the answer, and only the idle deadline applies meanwhile.
    Answers,
    /// Produces the response as it goes (a run, an SSE stream, a download): it ends
    /// when the client leaves, and a client that stops reading is dropped.
    Produces,
    /// Consumes the request body (an upload): it ends when the client leaves, and a
    /// stalled body gets 408. `reading`: it takes bytes now (else it waits for its
    /// last chunk to be written).
    Receives {
        /// It takes body bytes now.
        reading: bool,
    },
    /// Talks with the client for as long as the connection lasts (a WebSocket): it
    /// takes input always, ends when the client leaves, and a client that stops
    /// reading is dropped. `busy`: work is going on for it, so silence is not
    /// idleness (else the idle deadline closes it).
    Converses {
        /// Work is going on for it.
        busy: bool,
    },
}

/// What a connection owner tells the connection about itself.
pub trait Owner {
    /// How it relates to the connection.
    fn role(&self) -> Role;
}

/// Where a connection is in its request cycle.
pub enum Phase<R, W> {
    /// Waiting for (the rest of) a request head.
    Head,
    /// Reading a body.
    Body {
        /// The head.
        head: Box<Head>,
        /// Its route.
        route: R,
        /// The route's body cap.
        cap: usize,
        /// The path's parameters.
        params: Params,
        /// Tenant from admission.
        tenant: String,
        /// Framing state.
        state: BodyState,
        /// Decoded so far.
        body: Vec<u8>,
    },
    /// A JSON response body is being encoded as the socket drains (`lazy.rs`).
    Json(Box<LazyBody>),
    /// The request is with its owner, which answers through the response methods.
    Owned(W),
}

/// What [`Conn::next_head`] found.
#[derive(Debug)]
pub enum HeadStep {
    /// Nothing to parse yet.
    Wait,
    /// A head began: its deadline starts now; call again.
    Began,
    /// A complete head: route and admit it, then [`Conn::begin_body`] or answer.
    Head(Head),
    /// A head that cannot be served: `resp` is queued and the connection closes after.
    /// `err` is the parser's reason, for the log (`None`: only too long).
    Refused {
        /// The parser's reason.
        err: Option<HttpError>,
    },
}

/// What [`Conn::begin_body`] and [`Conn::advance_body`] found.
#[derive(Debug)]
pub enum BodyStep<R> {
    /// The body is not complete. `idle`: every byte read so far was consumed, so the
    /// body's idle deadline starts again.
    Wait {
        /// The body idle deadline starts again.
        idle: bool,
    },
    /// The request is complete: dispatch it (the connection is back in `Head`).
    Dispatch(R, Request),
    /// The body is larger than its route allows: answer `route`'s refusal and close.
    OverCap(R),
    /// The body's framing is broken: the 400 is queued; the connection closes after.
    Refused,
    /// The body's framing is broken, as this says: the caller answers 400 in
    /// `route`'s face's shape and closes the connection after.
    Malformed(R, String),
}

/// What to do after I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Nothing now.
    Stay,
    /// Close the connection (its owner, if any, is told by the caller).
    Close,
    /// Shut our side, drain what the client still sends for a while, then close.
    Linger,
}

/// What a connection's deadline means now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Not yet, or still making progress: wait this long again.
    Rearm(Duration),
    /// Close it (lingered enough, idle, or a client that stopped reading).
    Close,
    /// Close a connection whose head was not complete in time.
    HeadTimeout,
    /// Close one whose client stopped reading a response.
    Stalled,
    /// A request body (or upload) stalled: answer 408 and close.
    BodyTimeout,
}

/// A client connection's HTTP state.
pub struct Conn<R, W> {
    /// Bytes read and not parsed yet.
    pub rbuf: Vec<u8>,
    /// INVARIANT: `scan_from <= rbuf.len()`; head bytes before it hold no blank line.
    scan_from: usize,
    /// Bytes queued for the client.
    pub wbuf: Vec<u8>,
    /// INVARIANT: `wpos <= wbuf.len()`.
    wpos: usize,
    /// Where the request cycle is.
    pub phase: Phase<R, W>,
    /// Close once the write buffer is out.
    pub close_after_flush: bool,
    /// Response sent and our side shut down; reading and discarding what the client
    /// still sends (an unread body), so our close does not reset the connection and
    /// destroy the response before the client reads it.
    pub lingering: bool,
    /// The client closed its side (or the connection failed).
    pub read_eof: bool,
    /// When the head being read began.
    pub head_started: Option<Instant>,
    /// When bytes last went out.
    pub last_write: Instant,
    /// Keep-alive of the request being served.
    pub keep_alive: bool,
    /// The request being served is a HEAD.
    pub head_only: bool,
    /// Labels of the request being served, (face, method, route), for counting: set
    /// by the caller as it routes the head; `UNROUTED` until then.
    pub label: Label,
    /// Response heads queued and not yet taken by the caller, with their status.
    pub heads: Vec<(Label, u16)>,
    /// Bytes read from and written to the socket since the caller last took them.
    pub io_bytes: (u64, u64),
}

/// (face, method, route) of a request, as `/metrics` labels it.
pub type Label = (&'static str, &'static str, &'static str);

/// The labels of a request whose head did not parse.
pub const UNROUTED: Label = ("isobox", "other", "unmatched");

impl<R, W: Owner> Conn<R, W> {
    /// A fresh connection, waiting for a head.
    pub fn new(now: Instant) -> Conn<R, W> {
        Conn {
            rbuf: Vec::new(),
            scan_from: 0,
            wbuf: Vec::new(),
            wpos: 0,
            phase: Phase::Head,
            close_after_flush: false,
            lingering: false,
            read_eof: false,
            head_started: None,
            last_write: now,
            keep_alive: true,
            head_only: false,
            label: UNROUTED,
            heads: Vec::new(),
            io_bytes: (0, 0),
        }
    }

    /// Records a response head of `status` for the request being served.
    pub fn note_head(&mut self, status: u16) {
        // Bounded: the daemon takes them at every flush and at close; a pipelining
        // client that never reads stops being parsed once the write buffer is full.
        if self.heads.len() < 1024 {
            self.heads.push((self.label, status));
        }
    }

    /// Bytes queued and not yet written.
    pub fn pending_write(&self) -> usize {
        self.wbuf.len() - self.wpos
    }

    /// Takes the bytes queued and not yet written (the connection changes hands).
    pub fn take_pending_write(&mut self) -> Vec<u8> {
        let rest = self.wbuf.split_off(self.wpos);
        self.wbuf.clear();
        self.wpos = 0;
        rest
    }

    /// The write buffer is at its bound: produce nothing more for this client.
    pub fn write_full(&self) -> bool {
        self.pending_write() >= MAX_WRITE_BUFFER_BYTES
    }

    /// Whether the phase takes bytes from the read buffer now.
    pub fn takes_input(&self) -> bool {
        let takes = match &self.phase {
            Phase::Head | Phase::Body { .. } => true,
            Phase::Json(_) => false,
            Phase::Owned(w) => matches!(
                w.role(),
                Role::Receives { reading: true } | Role::Converses { .. }
            ),
        };
        takes && !self.close_after_flush
    }

    /// Idle between requests: nothing read, nothing to write.
    pub fn idle(&self) -> bool {
        matches!(self.phase, Phase::Head)
            && self.head_started.is_none()
            && self.rbuf.is_empty()
            && self.pending_write() == 0
    }

    /// Between requests with everything written.
    pub fn flushed(&self) -> bool {
        self.pending_write() == 0 && matches!(self.phase, Phase::Head)
    }

    /// Reads until WouldBlock, EOF or the read-ahead bound. True when it stopped at the
    /// bound (more may be waiting). A lingering connection's input is read and dropped
    /// (bounded per call, so its deadline gets a turn).
    pub fn read_from(&mut self, io: &mut impl Read) -> bool {
        // Through a scratch buffer of the thread's own, zeroed once: a fresh 16 KiB
        // array per call was a memset on every readable event (2 % of a memory-KV
        // GET's CPU). A stack buffer stands in should the scratch be taken (a nested
        // call) or gone (the thread ending).
        thread_local! {
            static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; READ_CHUNK].into_boxed_slice());
        }
        let read = SCRATCH
            .try_with(|s| {
                s.try_borrow_mut()
                    .ok()
                    .map(|mut buf| self.read_through(&mut *io, &mut buf))
            })
            .ok()
            .flatten();
        read.unwrap_or_else(|| self.read_through(io, &mut [0u8; READ_CHUNK]))
    }

    fn read_through(&mut self, io: &mut impl Read, buf: &mut [u8]) -> bool {
        let mut drained = 0usize;
        loop {
            if self.read_eof {
                return false;
            }
            if self.lingering {
                match io.read(buf) {
                    Ok(0) => self.read_eof = true,
                    Ok(n) if drained < MAX_READ_AHEAD_BYTES * 4 => {
                        self.io_bytes.0 += n as u64;
                        drained += n;
                        continue;
                    }
                    Ok(n) => self.io_bytes.0 += n as u64,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => self.read_eof = true,
                }
                return false;
            }
            let room = MAX_READ_AHEAD_BYTES.saturating_sub(self.rbuf.len());
            if room == 0 {
                return true;
            }
            let want = room.min(buf.len());
            match io.read(&mut buf[..want]) {
                Ok(0) => {
                    self.read_eof = true;
                    return false;
                }
                Ok(n) => {
                    self.io_bytes.0 += n as u64;
                    self.rbuf.extend_from_slice(&buf[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.read_eof = true;
                    return false;
                }
            }
        }
    }

    /// Writes what is queued (topping up a lazy body as the client takes it). False
    /// when the connection failed: it is then marked to close, and what was queued is
    /// dropped.
    pub fn write_to(&mut self, io: &mut impl Write, now: Instant) -> bool {
        loop {
            // A lazy body keeps at most half the write bound queued, topped up as the
            // socket takes it (written bytes are dropped first, so the buffer stays
            // within that bound plus one escape).
            if let Phase::Json(body) = &mut self.phase {
                let window = MAX_WRITE_BUFFER_BYTES / 2;
                if self.wbuf.len() - self.wpos < window {
                    self.wbuf.drain(..self.wpos);
                    self.wpos = 0;
                    body.fill(&mut self.wbuf, window);
                    if body.done() {
                        self.phase = Phase::Head;
                    }
                }
            }
            if self.wpos == self.wbuf.len() {
                break;
            }
            match io.write(&self.wbuf[self.wpos..]) {
                Ok(0) => return false,
                Ok(n) => {
                    self.wpos += n;
                    self.io_bytes.1 += n as u64;
                    self.last_write = now;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.read_eof = true;
                    self.close_after_flush = true;
                    self.wbuf.clear();
                    self.wpos = 0;
                    if matches!(self.phase, Phase::Json(_)) {
                        self.phase = Phase::Head;
                    }
                    return false;
                }
            }
        }
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
        } else if self.wpos > 64 * 1024 {
            self.wbuf.drain(..self.wpos);
            self.wpos = 0;
        }
        true
    }

    /// Parses the next head out of the read buffer (phase `Head` only).
    pub fn next_head(&mut self, now: Instant) -> HeadStep {
        if !matches!(self.phase, Phase::Head) {
            return HeadStep::Wait;
        }
        if self.head_started.is_none() {
            // RFC 9112 §2.2: ignore empty lines before a request line.
            let skip = self
                .rbuf
                .iter()
                .take_while(|&&b| b == b'\r' || b == b'\n')
                .count();
            self.rbuf.drain(..skip);
            if self.rbuf.is_empty() {
                return HeadStep::Wait;
            }
            self.head_started = Some(now);
            // Until this head is routed, what it gets (a 414, a 431) is unrouted.
            self.label = UNROUTED;
            return HeadStep::Began;
        }
        let Some(end) = find_head_end(&self.rbuf, self.scan_from) else {
            if self.rbuf.len() > MAX_HEAD_BYTES {
                // Still in the request line: the target is what is too long.
                let resp = if !self.rbuf.contains(&b'\n') {
                    Response::error(
                        414,
                        "uri_too_long",
                        Some("request target longer than 8 KiB"),
                    )
                } else {
                    Response::error(
                        431,
                        "header_too_large",
                        Some("request head larger than 16 KiB"),
                    )
                };
                self.respond_and_close(resp);
                return HeadStep::Refused { err: None };
            }
            self.scan_from = self.rbuf.len();
            return HeadStep::Wait;
        };
        let parsed = parse_head(&self.rbuf[..end]);
        self.rbuf.drain(..end);
        self.scan_from = 0;
        self.head_started = None;
        self.label = UNROUTED;
        match parsed {
            Ok(head) => {
                self.keep_alive = head.keep_alive;
                self.head_only = head.method == "HEAD";
                HeadStep::Head(head)
            }
            Err(e) => {
                let code = match e.status() {
                    431 => "header_too_large",
                    414 => "uri_too_long",
                    505 => "http_version_not_supported",
                    501 => "not_implemented",
                    417 => "expectation_failed",
                    _ => "bad_request",
                };
                self.respond_and_close(Response::error(e.status(), code, Some(&e.to_string())));
                HeadStep::Refused { err: Some(e) }
            }
        }
    }

    /// Answers a head that will not be served: as is when it has no body, else with a
    /// close (not worth reading a body nobody will use).
    pub fn refuse_head(&mut self, head: &Head, resp: Response, shutting_down: bool) {
        if head.framing == Framing::None {
            self.respond(resp, shutting_down);
        } else {
            self.respond_and_close(resp);
        }
    }

    /// The cap of the body being read, when it is larger than
    /// [`super::limits::LARGE_BODY_BYTES`] (0 otherwise): what it may still grow to,
    /// counted against the daemon's budget for large bodies.
    pub fn large_body_reserved(&self) -> usize {
        match &self.phase {
            Phase::Body { cap, .. } if *cap > super::limits::LARGE_BODY_BYTES => *cap,
            _ => 0,
        }
    }

    /// A routed, admitted head: read its body (up to `cap`), or dispatch it at once.
    pub fn begin_body(
        &mut self,
        head: Head,
        route: R,
        cap: usize,
        params: Params,
        tenant: String,
    ) -> BodyStep<R> {
        let state = match head.framing {
            Framing::None => {
                return BodyStep::Dispatch(
                    route,
                    Request {
                        head,
                        body: Vec::new(),
                        tenant,
                        params,
                    },
                )
            }
            // Refused before any `100 Continue`, so a polite client sends nothing.
            Framing::Length(n) if n > cap as u64 => return BodyStep::OverCap(route),
            f => BodyState::of(f),
        };
        if head.expect_continue {
            self.wbuf.extend_from_slice(super::response::CONTINUE);
        }
        self.phase = Phase::Body {
            head: Box::new(head),
            route,
            cap,
            params,
            tenant,
            state,
            body: Vec::new(),
        };
        BodyStep::Wait { idle: true }
    }

    /// Moves body bytes out of the read buffer (phase `Body` only).
    pub fn advance_body(&mut self) -> BodyStep<R> {
        let Phase::Body {
            state, body, cap, ..
        } = &mut self.phase
        else {
            return BodyStep::Wait { idle: false };
        };
        let done = match state.feed(&mut self.rbuf, body, *cap, usize::MAX) {
            Ok(done) => done,
            Err(ChunkError::TooLarge) => {
                let Phase::Body { route, .. } = std::mem::replace(&mut self.phase, Phase::Head)
                else {
                    return BodyStep::Refused;
                };
                return BodyStep::OverCap(route);
            }
            Err(e) => {
                let Phase::Body { route, .. } = std::mem::replace(&mut self.phase, Phase::Head)
                else {
                    return BodyStep::Refused;
                };
                return BodyStep::Malformed(route, e.to_string());
            }
        };
        if !done {
            return BodyStep::Wait {
                idle: self.rbuf.is_empty(),
            };
        }
        let Phase::Body {
            head,
            route,
            params,
            body,
            tenant,
            ..
        } = std::mem::replace(&mut self.phase, Phase::Head)
        else {
            return BodyStep::Refused;
        };
        BodyStep::Dispatch(
            route,
            Request {
                head: *head,
                body,
                tenant,
                params,
            },
        )
    }

    /// Whether the next response keeps the connection open.
    fn keeps(&self, shutting_down: bool) -> bool {
        self.keep_alive && !shutting_down
    }

    /// Queues a complete response; the connection goes back to reading heads.
    pub fn respond(&mut self, resp: Response, shutting_down: bool) {
        self.note_head(resp.status);
        let keep = self.keeps(shutting_down);
        resp.write_to(&mut self.wbuf, self.head_only, keep);
        self.phase = Phase::Head;
        if !keep {
            self.close_after_flush = true;
        }
    }

    /// Queues a response and closes after it.
    pub fn respond_and_close(&mut self, resp: Response) {
        self.keep_alive = false;
        self.respond(resp, true);
    }

    /// A 200 JSON response whose body is encoded as the socket drains.
    pub fn respond_lazy(&mut self, body: LazyBody, shutting_down: bool) {
        self.note_head(200);
        let keep = self.keeps(shutting_down);
        super::response::write_head(
            &mut self.wbuf,
            200,
            &[("Content-Type", "application/json".into())],
            Some(body.len()),
            keep,
        );
        if self.head_only {
            self.phase = Phase::Head;
        } else {
            self.queue_lazy(body);
        }
        if !keep {
            self.close_after_flush = true;
        }
    }

    /// Queues the first window of `body`; the rest follows as the socket drains.
    fn queue_lazy(&mut self, mut body: LazyBody) {
        let upto = self.wbuf.len() - self.wpos + MAX_WRITE_BUFFER_BYTES / 2;
        body.fill(&mut self.wbuf, self.wpos + upto);
        self.phase = if body.done() {
            Phase::Head
        } else {
            Phase::Json(Box::new(body))
        };
    }

    /// Queues the head of an SSE response (chunked; kept alive unless the client or a
    /// shutdown says otherwise). The phase stays the owner's.
    pub fn start_sse(&mut self, shutting_down: bool) {
        self.start_sse_with(shutting_down, &[]);
    }

    /// [`Conn::start_sse`] with `extra` headers.
    pub fn start_sse_with(&mut self, shutting_down: bool, extra: &[(&'static str, String)]) {
        self.note_head(200);
        let keep = self.keeps(shutting_down);
        super::sse::write_head(&mut self.wbuf, keep, extra);
        if !keep {
            self.close_after_flush = true;
        }
    }

    /// Queues the head of an NDJSON response (one JSON object a line, chunked, as the
    /// lines come). The phase stays the owner's. For `HEAD` the head is all: the
    /// connection closes after it (a stream's end is not known), and the lines queued
    /// later go nowhere.
    pub fn start_ndjson(&mut self, shutting_down: bool) {
        self.note_head(200);
        let keep = self.keeps(shutting_down) && !self.head_only;
        let headers = [
            ("Content-Type", "application/x-ndjson".to_string()),
            ("Cache-Control", "no-cache".to_string()),
            ("X-Accel-Buffering", "no".to_string()),
            ("Transfer-Encoding", "chunked".to_string()),
        ];
        super::response::write_head(&mut self.wbuf, 200, &headers, None, keep);
        if !keep {
            self.close_after_flush = true;
        }
    }

    /// Queues one chunk of a chunked response (none for `HEAD`).
    pub fn send_chunk(&mut self, payload: &[u8]) {
        if !self.head_only {
            write_chunk(&mut self.wbuf, payload);
        }
    }

    /// Queues an SSE event as one chunk.
    pub fn send_event(&mut self, event: &str, data: &str) {
        let mut frame = Vec::new();
        super::sse::write_event(&mut frame, event, data);
        self.send_chunk(&frame);
    }

    /// Queues an SSE comment (a keep-alive) as one chunk.
    pub fn send_comment(&mut self, text: &str) {
        let mut frame = Vec::new();
        super::sse::write_comment(&mut frame, text);
        self.send_chunk(&frame);
    }

    /// Ends a chunked stream with `last` (its final event) and the terminating chunk;
    /// the connection reads heads again.
    pub fn finish_stream(&mut self, last: &[u8], shutting_down: bool) {
        self.send_chunk(last);
        if !self.head_only {
            self.wbuf.extend_from_slice(LAST_CHUNK);
        }
        self.phase = Phase::Head;
        if !self.keeps(shutting_down) {
            self.close_after_flush = true;
        }
    }

    /// Ends an SSE stream with a `done` event whose data is `json`, encoded as the
    /// socket drains like a JSON response, then the last chunk.
    pub fn finish_stream_lazy(&mut self, json: LazyBody, id: Option<u64>, shutting_down: bool) {
        let prefix = match id {
            Some(id) => format!("id: {id}\nevent: done\ndata: ").into_bytes(),
            None => b"event: done\ndata: ".to_vec(),
        };
        let event_len = prefix.len() + json.len() + 2;
        let body = json.wrapped(
            [&chunk_head(event_len)[..], &prefix].concat(),
            [&b"\n\n\r\n"[..], LAST_CHUNK].concat(),
        );
        self.queue_lazy(body);
        if !self.keeps(shutting_down) {
            self.close_after_flush = true;
        }
    }

    /// After I/O: whether the connection stays, closes, or lingers.
    pub fn after_io(&self) -> After {
        let gone = self.read_eof;
        match &self.phase {
            Phase::Owned(w) => match w.role() {
                // A client that half-closed after its request still gets the answer of a
                // pool job (a failed write closes the connection then).
                Role::Answers => After::Stay,
                // Lingering after its close frame: the linger's own deadline ends it.
                Role::Converses { .. } if self.lingering && !gone => After::Stay,
                Role::Converses { .. } if gone => After::Close,
                // It said its last (a close frame): out, then a linger.
                Role::Converses { .. } if self.close_after_flush && self.pending_write() == 0 => {
                    After::Linger
                }
                Role::Converses { .. } => After::Stay,
                Role::Produces | Role::Receives { .. } if gone => After::Close,
                Role::Produces | Role::Receives { .. } => After::Stay,
            },
            // A client that half-closed still gets the rest of the body (a failed write
            // ends the body and closes).
            Phase::Json(_) => After::Stay,
            _ if self.lingering && !gone => After::Stay,
            // Half-close and drain for a moment (bounded by LINGER): closing with
            // unread input would send a reset that can destroy our response.
            _ if self.pending_write() == 0 && self.close_after_flush && !gone => After::Linger,
            _ if self.pending_write() == 0 && (self.close_after_flush || gone) => After::Close,
            _ => After::Stay,
        }
    }

    /// Starts lingering: what was read is dropped; what comes is read and dropped.
    pub fn begin_linger(&mut self) {
        self.lingering = true;
        self.rbuf.clear();
    }

    /// What the connection's deadline means now that it has passed. `idle` is the idle
    /// timeout (also the write-stall bound).
    pub fn expired(&self, now: Instant, idle: Duration) -> Expired {
        if self.lingering {
            return Expired::Close;
        }
        let since_write = now.saturating_duration_since(self.last_write);
        let stalled = self.pending_write() > 0 && since_write >= idle;
        match &self.phase {
            // A response still being taken, slowly but steadily: the stall counts from
            // the last write, not from the response's start.
            Phase::Head if self.pending_write() > 0 && since_write < idle => {
                Expired::Rearm(idle - since_write)
            }
            Phase::Head if self.head_started.is_some() => Expired::HeadTimeout,
            Phase::Head => Expired::Close,
            Phase::Body { .. } => Expired::BodyTimeout,
            Phase::Owned(w) => match w.role() {
                Role::Receives { .. } => Expired::BodyTimeout,
                Role::Converses { .. } if stalled => Expired::Stalled,
                Role::Converses { busy: true } => Expired::Rearm(idle),
                // A long message still being taken, steadily: not idle yet.
                Role::Converses { busy: false }
                    if self.pending_write() > 0 && since_write < idle =>
                {
                    Expired::Rearm(idle - since_write)
                }
                Role::Converses { busy: false } => Expired::Close,
                Role::Answers => Expired::Rearm(idle),
                Role::Produces if stalled => Expired::Stalled,
                Role::Produces => Expired::Rearm(idle),
            },
            Phase::Json(_) if stalled => Expired::Stalled,
            Phase::Json(_) => Expired::Rearm(idle),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An owner standing in for a run, a pool job or an upload.
    #[derive(Debug, PartialEq)]
    struct Fake(Role);

    impl Owner for Fake {
        fn role(&self) -> Role {
            self.0
        }
    }

    type C = Conn<&'static str, Fake>;

    /// A peer that has `input` to give, then would block; takes at most `take` bytes
    /// per write, `budget` in all, then would block.
    struct Peer {
        input: Vec<u8>,
        eof: bool,
        out: Vec<u8>,
        take: usize,
        budget: usize,
    }

    impl Peer {
        fn new(input: &[u8]) -> Peer {
            Peer {
                input: input.to_vec(),
                eof: false,
                out: Vec::new(),
                take: usize::MAX,
                budget: usize::MAX,
            }
        }
    }

    impl Read for Peer {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.input.is_empty() {
                return if self.eof {
                    Ok(0)
                } else {
                    Err(io::ErrorKind::WouldBlock.into())
                };
            }
            let n = buf.len().min(self.input.len());
            buf[..n].copy_from_slice(&self.input[..n]);
            self.input.drain(..n);
            Ok(n)
        }
    }

    impl Write for Peer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(self.take).min(self.budget);
            if n == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.budget -= n;
            self.out.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Parses the next head, skipping the `Began` step.
    fn head(c: &mut C, now: Instant) -> HeadStep {
        match c.next_head(now) {
            HeadStep::Began => c.next_head(now),
            s => s,
        }
    }

    fn text(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    #[test]
    fn test_pipelined_requests_come_out_one_at_a_time_in_order() {
        let now = Instant::now();
        let mut c = C::new(now);
        let mut p = Peer::new(
            b"\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyzGET /c HTTP/1.1\r\nHost: x\r\n\r\n",
        );
        assert!(!c.read_from(&mut p));
        let HeadStep::Head(h) = head(&mut c, now) else {
            panic!("no head")
        };
        assert_eq!((h.method.as_str(), h.path.as_str()), ("GET", "/a"));
        let BodyStep::Dispatch(r, req) = c.begin_body(h, "a", 10, Params::default(), "t".into())
        else {
            panic!("GET has no body")
        };
        assert_eq!((r, req.body.len()), ("a", 0));
        // While the first is with its owner, nothing more is parsed.
        c.phase = Phase::Owned(Fake(Role::Produces));
        assert!(matches!(c.next_head(now), HeadStep::Wait));
        c.respond(Response::no_content(), false);
        let HeadStep::Head(h) = head(&mut c, now) else {
            panic!("no second head")
        };
        assert!(matches!(
            c.begin_body(h, "b", 10, Params::default(), "t".into()),
            BodyStep::Wait { .. }
        ));
        let BodyStep::Dispatch(r, req) = c.advance_body() else {
            panic!("body complete")
        };
        assert_eq!((r, req.body.as_slice()), ("b", &b"xyz"[..]));
        let HeadStep::Head(h) = head(&mut c, now) else {
            panic!("no third head")
        };
        assert_eq!(h.path, "/c");
        assert!(c.rbuf.is_empty());
    }

    #[test]
    fn test_a_stream_for_head_is_its_head_alone_then_close() {
        let now = Instant::now();
        for (method, want_body) in [("GET", true), ("HEAD", false)] {
            let mut c = C::new(now);
            let mut p = Peer::new(format!("{method} /s HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
            c.read_from(&mut p);
            let HeadStep::Head(h) = head(&mut c, now) else {
                panic!("no head")
            };
            let BodyStep::Dispatch(..) = c.begin_body(h, "s", 10, Params::default(), "t".into())
            else {
                panic!("no dispatch")
            };
            c.phase = Phase::Owned(Fake(Role::Produces));
            c.start_ndjson(false);
            c.send_chunk(b"{}\n");
            c.finish_stream(b"{\"type\":\"end\"}\n", false);
            let out = String::from_utf8(c.wbuf.clone()).unwrap();
            assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
            assert_eq!(out.contains("{}"), want_body, "{method}: {out}");
            assert_eq!(out.ends_with("0\r\n\r\n"), want_body, "{method}: {out}");
            assert_eq!(
                out.contains("Connection: close"),
                !want_body,
                "{method}: {out}"
            );
            assert_eq!(c.close_after_flush, !want_body);
        }
    }

    #[test]
    fn test_a_head_in_pieces_waits_then_parses() {
        let now = Instant::now();
        let mut c = C::new(now);
        c.rbuf.extend_from_slice(b"GET / HT");
        assert!(matches!(c.next_head(now), HeadStep::Began));
        assert_eq!(c.head_started, Some(now));
        assert!(matches!(c.next_head(now), HeadStep::Wait));
        c.rbuf.extend_from_slice(b"TP/1.1\r\nHost: x\r\n\r\n");
        assert!(matches!(c.next_head(now), HeadStep::Head(_)));
        assert_eq!(c.head_started, None);
    }

    #[test]
    fn test_oversized_heads_are_414_or_431_and_close() {
        let now = Instant::now();
        let mut c = C::new(now);
        c.rbuf = vec![b'a'; MAX_HEAD_BYTES + 1];
        assert!(matches!(head(&mut c, now), HeadStep::Refused { err: None }));
        assert!(
            text(&c.wbuf).starts_with("HTTP/1.1 414 "),
            "{}",
            text(&c.wbuf)
        );
        assert!(c.close_after_flush && !c.takes_input());
        let mut c = C::new(now);
        c.rbuf = b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec();
        c.rbuf.extend(std::iter::repeat_n(b'h', MAX_HEAD_BYTES));
        assert!(matches!(head(&mut c, now), HeadStep::Refused { err: None }));
        assert!(text(&c.wbuf).starts_with("HTTP/1.1 431 "));
        // At the bound it is still waiting for the rest.
        let mut c = C::new(now);
        c.rbuf = vec![b'a'; MAX_HEAD_BYTES];
        assert!(matches!(head(&mut c, now), HeadStep::Wait));
    }

    #[test]
    fn test_a_malformed_head_is_answered_with_its_status_and_closed() {
        let now = Instant::now();
        let mut c = C::new(now);
        c.rbuf = b"GET / HTTP/2.0\r\n\r\n".to_vec();
        let HeadStep::Refused { err: Some(e) } = head(&mut c, now) else {
            panic!("refused")
        };
        assert_eq!(e, HttpError::Version);
        let out = text(&c.wbuf);
        assert!(out.starts_with("HTTP/1.1 505 "), "{out}");
        assert!(out.contains("http_version_not_supported"), "{out}");
        assert!(
            out.to_ascii_lowercase().contains("connection: close"),
            "{out}"
        );
    }

    #[test]
    fn test_body_caps_at_below_and_above() {
        let now = Instant::now();
        for (len, over) in [(9u64, false), (10, false), (11, true)] {
            let mut c = C::new(now);
            c.rbuf =
                format!("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n").into_bytes();
            c.rbuf.extend(std::iter::repeat_n(b'x', len as usize));
            let HeadStep::Head(h) = head(&mut c, now) else {
                panic!()
            };
            match c.begin_body(h, "r", 10, Params::default(), String::new()) {
                BodyStep::OverCap("r") => assert!(over, "{len}"),
                BodyStep::Wait { .. } => {
                    assert!(!over, "{len}");
                    let BodyStep::Dispatch(_, req) = c.advance_body() else {
                        panic!()
                    };
                    assert_eq!(req.body.len() as u64, len);
                }
                s => panic!("{s:?}"),
            }
        }
        // A chunked body is counted as it is decoded.
        let mut c = C::new(now);
        c.rbuf = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n5\r\nghijk\r\n0\r\n\r\n"
            .to_vec();
        let HeadStep::Head(h) = head(&mut c, now) else {
            panic!()
        };
        assert!(matches!(
            c.begin_body(h, "r", 10, Params::default(), String::new()),
            BodyStep::Wait { .. }
        ));
        assert!(matches!(c.advance_body(), BodyStep::OverCap("r")));
        assert!(matches!(c.phase, Phase::Head));
    }

    #[test]
    fn test_chunked_body_in_pieces_and_broken_framing() {
        let now = Instant::now();
        let mut c = C::new(now);
        c.rbuf =
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n3\r\nab"
                .to_vec();
        let HeadStep::Head(h) = head(&mut c, now) else {
            panic!()
        };
        assert!(matches!(
            c.begin_body(h, "r", 100, Params::default(), String::new()),
            BodyStep::Wait { .. }
        ));
        assert_eq!(c.wbuf, super::super::response::CONTINUE);
        assert!(matches!(c.advance_body(), BodyStep::Wait { idle: true }));
        c.rbuf.extend_from_slice(b"c\r\n0\r\n\r\n");
        let BodyStep::Dispatch(_, req) = c.advance_body() else {
            panic!()
        };
        assert_eq!(req.body, b"abc");
        let mut c = C::new(now);
        c.rbuf = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec();
        let HeadStep::Head(h) = head(&mut c, now) else {
            panic!()
        };
        c.begin_body(h, "r", 100, Params::default(), String::new());
        let BodyStep::Malformed("r", why) = c.advance_body() else {
            panic!()
        };
        assert!(why.contains("chunk"), "{why}");
    }

    #[test]
    fn test_read_ahead_is_bounded() {
        let now = Instant::now();
        let mut c = C::new(now);
        let mut p = Peer::new(&vec![b'x'; MAX_READ_AHEAD_BYTES + 10]);
        assert!(c.read_from(&mut p), "stopped at the bound");
        assert_eq!(c.rbuf.len(), MAX_READ_AHEAD_BYTES);
        c.rbuf.drain(..100);
        assert!(!c.read_from(&mut p));
        assert_eq!(c.rbuf.len(), MAX_READ_AHEAD_BYTES - 90);
        p.eof = true;
        assert!(!c.read_from(&mut p));
        assert!(c.read_eof);
    }

    #[test]
    fn test_a_lazy_body_is_encoded_as_the_client_takes_it() {
        let now = Instant::now();
        let mut c = C::new(now);
        let big = "y".repeat(MAX_WRITE_BUFFER_BYTES * 3);
        let body = crate::http::lazy::Deferred::new().body(&serde_json::json!({ "s": big }));
        let total = body.len();
        c.respond_lazy(body, false);
        assert!(matches!(c.phase, Phase::Json(_)));
        // Never more than the bound queued, however large the body.
        assert!(c.wbuf.len() <= MAX_WRITE_BUFFER_BYTES, "{}", c.wbuf.len());
        let mut p = Peer::new(b"");
        p.take = 4096;
        p.budget = 100_000;
        assert!(c.write_to(&mut p, now));
        assert!(c.pending_write() <= MAX_WRITE_BUFFER_BYTES);
        assert!(!matches!(c.after_io(), After::Close | After::Linger));
        p.budget = usize::MAX;
        while !matches!(c.phase, Phase::Head) || c.pending_write() > 0 {
            assert!(c.write_to(&mut p, now));
        }
        let out = text(&p.out);
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {total}")), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["s"].as_str().map(str::len), Some(big.len()));
        assert_eq!(c.after_io(), After::Stay);
    }

    #[test]
    fn test_sse_stream_framing_and_finish() {
        let now = Instant::now();
        let mut c = C::new(now);
        c.phase = Phase::Owned(Fake(Role::Produces));
        c.start_sse(false);
        c.send_event("stdout", r#"{"chunk":"a"}"#);
        c.send_comment("keep-alive");
        let mut last = Vec::new();
        crate::http::sse::write_event(&mut last, "error", "{}");
        c.finish_stream(&last, false);
        let mut p = Peer::new(b"");
        assert!(c.write_to(&mut p, now));
        let out = text(&p.out);
        assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
        assert!(out.contains("text/event-stream"), "{out}");
        assert!(
            out.contains("event: stdout\ndata: {\"chunk\":\"a\"}\n\n"),
            "{out}"
        );
        assert!(out.contains(": keep-alive\n\n"), "{out}");
        assert!(out.ends_with("0\r\n\r\n"), "{out}");
        assert!(matches!(c.phase, Phase::Head));
        assert!(!c.close_after_flush);
        // During a shutdown the stream says close and the connection closes after it.
        let mut c = C::new(now);
        c.start_sse(true);
        assert!(c.close_after_flush);
    }

    #[test]
    fn test_after_io_by_role_and_linger() {
        let now = Instant::now();
        for (role, gone, want) in [
            (Role::Answers, true, After::Stay),
            (Role::Produces, true, After::Close),
            (Role::Produces, false, After::Stay),
            (Role::Receives { reading: true }, true, After::Close),
        ] {
            let mut c = C::new(now);
            c.phase = Phase::Owned(Fake(role));
            c.read_eof = gone;
            assert_eq!(c.after_io(), want, "{role:?} gone={gone}");
        }
        let mut c = C::new(now);
        c.respond_and_close(Response::no_content());
        assert_eq!(c.after_io(), After::Stay, "the response is not out yet");
        assert!(c.write_to(&mut Peer::new(b""), now));
        assert_eq!(c.after_io(), After::Linger);
        c.begin_linger();
        let mut p = Peer::new(&vec![b'z'; 1000]);
        assert!(!c.read_from(&mut p));
        assert!(c.rbuf.is_empty(), "lingering input is dropped");
        assert_eq!(c.after_io(), After::Stay);
        p.eof = true;
        c.read_from(&mut p);
        assert_eq!(c.after_io(), After::Close);
    }

    #[test]
    fn test_deadlines_by_phase() {
        let t0 = Instant::now();
        let idle = Duration::from_secs(10);
        let later = t0 + Duration::from_secs(4);
        let much_later = t0 + Duration::from_secs(30);
        let mut c = C::new(t0);
        assert_eq!(c.expired(later, idle), Expired::Close);
        c.head_started = Some(t0);
        assert_eq!(c.expired(later, idle), Expired::HeadTimeout);
        c.head_started = None;
        // A slow but steady reader of a finished response is given the rest of `idle`.
        c.wbuf = b"pending".to_vec();
        assert_eq!(
            c.expired(later, idle),
            Expired::Rearm(Duration::from_secs(6))
        );
        c.phase = Phase::Owned(Fake(Role::Produces));
        assert_eq!(c.expired(later, idle), Expired::Rearm(idle));
        assert_eq!(c.expired(much_later, idle), Expired::Stalled);
        c.phase = Phase::Owned(Fake(Role::Answers));
        assert_eq!(c.expired(much_later, idle), Expired::Rearm(idle));
        c.phase = Phase::Owned(Fake(Role::Receives { reading: false }));
        assert_eq!(c.expired(later, idle), Expired::BodyTimeout);
        c.lingering = true;
        assert_eq!(c.expired(later, idle), Expired::Close);
    }

    #[test]
    fn test_a_failed_write_drops_the_queue_and_closes() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let now = Instant::now();
        let mut c = C::new(now);
        c.respond(Response::no_content(), false);
        assert!(!c.write_to(&mut Broken, now));
        assert_eq!(c.pending_write(), 0);
        assert!(c.read_eof && c.close_after_flush);
        assert_eq!(c.after_io(), After::Close);
    }

    #[test]
    fn test_head_requests_get_no_body_and_keep_alive_follows_the_client() {
        let now = Instant::now();
        let mut c = C::new(now);
        c.rbuf = b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        let HeadStep::Head(_) = head(&mut c, now) else {
            panic!()
        };
        c.respond(Response::bytes(200, "text/plain", b"hello".to_vec()), false);
        let out = text(&c.wbuf);
        assert!(
            out.contains("Content-Length: 5") && out.ends_with("\r\n\r\n"),
            "{out}"
        );
        assert!(!c.close_after_flush);
        let mut c = C::new(now);
        c.rbuf = b"GET / HTTP/1.0\r\n\r\n".to_vec();
        let HeadStep::Head(_) = head(&mut c, now) else {
            panic!()
        };
        c.respond(Response::no_content(), false);
        assert!(c.close_after_flush, "HTTP/1.0 without keep-alive closes");
    }
}

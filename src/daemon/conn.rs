//! One client connection: read buffer, HTTP state machine, write buffer, deadlines.
//!
//! It stays one file for now (~940 lines of code): the read and the write side share
//! the phase machine and the deadlines. Issue 20 moves it to `http/conn.rs` behind a
//! handler seam, where it splits along that seam.
//!
//! Requests on a connection are served strictly one at a time, so pipelined requests
//! are answered in order: while a run answers one, the next waits in the read buffer
//! (at most `MAX_READ_AHEAD_BYTES`). Reactor thread only.

use super::Daemon;
use crate::api::routes::{Handler, Spec};
use crate::api::{self, Action};
use crate::http::chunked::{chunk_head, ChunkError, ChunkedDecoder, LAST_CHUNK};
use crate::http::limits::{MAX_HEAD_BYTES, MAX_READ_AHEAD_BYTES, MAX_WRITE_BUFFER_BYTES};
use crate::http::parse::{find_head_end, parse_head};
use crate::http::Params;
use crate::http::{Framing, Head, Request, Response};
use crate::reactor::{Addr, Component, ComponentId, Readiness};
use mio::net::TcpListener;
use mio::net::TcpStream;
use mio::{Interest, Token};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The HTTP component: the listener and every client connection.
pub(crate) const HTTP: ComponentId = ComponentId(1);
/// A connection's socket (key: the connection).
const SOCKET: u16 = 0;
/// The listening socket (key 0).
pub(crate) const LISTENER: u16 = 1;
/// Timers: a connection's deadline (head, idle or write stall).
const DEADLINE: u16 = 0;
/// Timers: retry accepting after EMFILE.
const ACCEPT: u16 = 1;

/// Connections on the loop.
pub(crate) struct Http;

impl Component<Daemon> for Http {
    fn name(&self) -> &'static str {
        "http"
    }

    fn ready(&self, d: &mut Daemon, ck: usize, what: u16, r: Readiness) {
        match what {
            SOCKET => d.conn_event(ck, r.readable, r.writable),
            LISTENER => d.accept(),
            _ => {}
        }
    }

    fn timer(&self, d: &mut Daemon, ck: usize, what: u16, gen: u64) {
        match what {
            DEADLINE => d.conn_timer(ck, gen),
            ACCEPT => d.accept(),
            _ => {}
        }
    }
}

/// How the body being read is delimited.
pub enum BodyState {
    /// Bytes still expected.
    Length(u64),
    /// Chunked decoder.
    Chunked(ChunkedDecoder),
}

/// Where a connection is in its request cycle.
pub enum Phase {
    /// Waiting for (the rest of) a request head.
    Head,
    /// Reading a body.
    Body {
        /// The head.
        head: Box<Head>,
        /// Its route's row.
        route: &'static Spec,
        /// The path's parameters.
        params: Params,
        /// Tenant from admission.
        tenant: String,
        /// Framing state.
        state: BodyState,
        /// Decoded so far.
        body: Vec<u8>,
    },
    /// A run will answer with one JSON response.
    Busy {
        /// Run key.
        run: usize,
    },
    /// A run is streaming SSE.
    Stream {
        /// Run key.
        run: usize,
    },
    /// A pool job works on this request (its outcome comes back as a completion).
    Job,
    /// An upload's session check runs; the body waits unread in the socket.
    UploadWait {
        /// The head.
        head: Box<Head>,
    },
    /// An upload's body is being received; the pool writes it to its temporary file
    /// in chunks (this thread never writes to disk).
    Upload {
        /// Framing state.
        state: BodyState,
        /// The file being written; `None` while a pool job is writing a chunk to it.
        target: Option<Box<api::UploadTarget>>,
        /// Decoded bytes not yet handed to the pool.
        buf: Vec<u8>,
    },
    /// A response body is being forwarded from a transfer thread's pipe.
    Transfer(Box<super::transfer::Transfer>),
    /// A JSON response body is being encoded as the socket drains (`http/lazy.rs`).
    Json(Box<crate::http::lazy::LazyBody>),
    /// An agent loop streams SSE from its thread, which stops once `cancel` is set.
    Agent {
        /// The loop's id (its keep-alive timer names it).
        id: u64,
        /// Tells the loop's thread to stop.
        cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
        /// Last time an event or keep-alive went out.
        last_event: Instant,
        /// Model calls the loop has made (for the `done` a shutdown sends for it).
        iterations: std::sync::Arc<std::sync::atomic::AtomicU32>,
    },
}

/// A client connection.
pub struct Conn {
    pub(crate) stream: TcpStream,
    pub(crate) token: Token,
    pub(crate) serial: u64,
    pub(crate) peer: SocketAddr,
    pub(crate) rbuf: Vec<u8>,
    /// INVARIANT: `scan_from <= rbuf.len()`; head bytes before it hold no blank line.
    pub(crate) scan_from: usize,
    pub(crate) wbuf: Vec<u8>,
    /// INVARIANT: `wpos <= wbuf.len()`.
    pub(crate) wpos: usize,
    pub(crate) phase: Phase,
    pub(crate) timer_gen: u64,
    /// The current deadline (head, body, idle or write stall).
    pub(crate) deadline: Instant,
    /// Deadline of the live wheel entry, if one is scheduled.
    pub(crate) scheduled: Option<Instant>,
    pub(crate) close_after_flush: bool,
    /// Response sent and our side shut down; reading and discarding what the client
    /// still sends (an unread body), so our close does not reset the connection and
    /// destroy the response before the client reads it.
    pub(crate) lingering: bool,
    pub(crate) read_eof: bool,
    pub(crate) head_started: Option<Instant>,
    pub(crate) last_write: Instant,
    /// Keep-alive of the request being served.
    pub(crate) keep_alive: bool,
    /// Method of the request being served was HEAD.
    pub(crate) head_only: bool,
}

impl Conn {
    /// Bytes queued and not yet written.
    pub fn pending_write(&self) -> usize {
        self.wbuf.len() - self.wpos
    }
}

impl Daemon {
    /// Connection `ck` waits for run `rk`: for its JSON result, or, as SSE, with the
    /// head sent at once.
    pub(crate) fn conn_wait_for_run(&mut self, ck: usize, rk: usize, stream: bool) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        if stream {
            c.phase = Phase::Stream { run: rk };
            start_sse(c, shutting_down);
        } else {
            c.phase = Phase::Busy { run: rk };
        }
    }

    /// Queues one SSE event on `ck`'s stream and tries to write it. True when the
    /// client is this far behind: the producer should pause.
    pub(crate) fn conn_send_event(&mut self, ck: usize, event: &str, data: &str) -> bool {
        let mut frame = Vec::new();
        crate::http::sse::write_event(&mut frame, event, data);
        self.conn_send_chunked(ck, &frame);
        self.conns
            .get(ck)
            .is_some_and(|c| c.pending_write() >= MAX_WRITE_BUFFER_BYTES)
    }

    /// Queues an SSE comment (a keep-alive) on `ck`'s stream.
    pub(crate) fn conn_send_comment(&mut self, ck: usize, text: &str) {
        let mut frame = Vec::new();
        crate::http::sse::write_comment(&mut frame, text);
        self.conn_send_chunked(ck, &frame);
    }
}

/// Queues the head of an SSE response (chunked; kept alive unless the client or a
/// shutdown says otherwise) on `c`.
pub(crate) fn start_sse(c: &mut Conn, shutting_down: bool) {
    let keep = c.keep_alive && !shutting_down;
    crate::http::sse::write_head(&mut c.wbuf, keep);
    if !keep {
        c.close_after_flush = true;
    }
}

impl Daemon {
    /// Accepts every pending connection.
    fn accept(&mut self) {
        loop {
            let Some((listener, _)) = &self.listener else {
                return;
            };
            match TcpListener::accept(listener) {
                Ok((stream, peer)) => self.add_conn(stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE/ENFILE: the pending connection stays queued; retry shortly
                    // instead of spinning on an edge that will not re-fire.
                    crate::error_limited!("op=accept err={e}");
                    self.reactor.arm(
                        Instant::now() + Duration::from_millis(50),
                        Addr::new(HTTP, 0, ACCEPT),
                        0,
                    );
                    return;
                }
            }
        }
    }

    pub(crate) fn add_conn(&mut self, mut stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let client = crate::admission::ratelimit::client_key(peer.ip());
        let per_ip = self.conns_per_ip.get(&client).copied().unwrap_or(0);
        let refuse = if self.app.shutting_down {
            Some("shutting down")
        } else if self.conns.len() >= self.cfg.max_connections {
            Some("too many open connections")
        } else if per_ip >= self.cfg.max_connections_per_ip {
            Some("too many open connections from this address")
        } else {
            None
        };
        if let Some(reason) = refuse {
            // Refuse cleanly: one best-effort 503 on the fresh socket, then close.
            let mut out = Vec::new();
            Response::error(503, "unavailable", Some(reason))
                .with_header("Retry-After", "1")
                .write_to(&mut out, false, false);
            let _ = stream.write(&out);
            crate::warn_limited!("conn refused peer={peer} reason={reason}");
            return;
        }
        self.conn_serial += 1;
        *self.conns_per_ip.entry(client).or_insert(0) += 1;
        let entry = self.conns.vacant_entry();
        let ck = entry.key();
        let token = match self.reactor.register(
            &mut stream,
            Addr::new(HTTP, ck, SOCKET),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            Ok(t) => t,
            Err(e) => {
                crate::error_limited!("op=register conn err={e}");
                return;
            }
        };
        entry.insert(Conn {
            stream,
            token,
            serial: self.conn_serial,
            peer,
            rbuf: Vec::new(),
            scan_from: 0,
            wbuf: Vec::new(),
            wpos: 0,
            phase: Phase::Head,
            timer_gen: 0,
            deadline: Instant::now(),
            scheduled: None,
            close_after_flush: false,
            lingering: false,
            read_eof: false,
            head_started: None,
            last_write: Instant::now(),
            keep_alive: true,
            head_only: false,
        });
        self.arm_conn(ck, Duration::from_millis(self.cfg.idle_timeout_ms));
        log::debug!("conn={ck} peer={peer} accepted");
    }

    /// Sets the connection's deadline. At most one wheel entry per connection is live:
    /// a later deadline reuses the entry already scheduled (it re-arms itself when it
    /// fires early), so a busy keep-alive connection does not pile entries up.
    pub(crate) fn arm_conn(&mut self, ck: usize, after: Duration) {
        let deadline = Instant::now() + after;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.deadline = deadline;
        if c.scheduled.is_some_and(|at| at <= deadline) {
            return;
        }
        let gen = self
            .reactor
            .arm_new(deadline, Addr::new(HTTP, ck, DEADLINE));
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.timer_gen = gen;
        c.scheduled = Some(deadline);
    }

    pub(crate) fn conn_event(&mut self, ck: usize, readable: bool, writable: bool) {
        // A lazy body holds pipelined requests back too: once it is out, parse them.
        let was_full = self.conns.get(ck).is_some_and(|c| {
            c.pending_write() >= MAX_WRITE_BUFFER_BYTES || matches!(c.phase, Phase::Json(_))
        });
        if writable {
            self.conn_flush(ck);
            if self
                .conns
                .get(ck)
                .is_some_and(|c| matches!(c.phase, Phase::Transfer(_)))
            {
                self.transfer_pump(ck);
            }
        }
        // Requests already read may have been held back while the write buffer was full:
        // once it drains, parse them (edge-triggered: no new readable edge will come).
        if readable || was_full {
            self.conn_pump(ck);
        } else {
            self.conn_after_io(ck);
        }
    }

    /// Reads and advances until the socket is drained or the phase stops taking input.
    pub(crate) fn conn_pump(&mut self, ck: usize) {
        loop {
            let full = self.conn_read(ck);
            let before = self.conns.get(ck).map(|c| c.rbuf.len());
            self.conn_advance(ck);
            let blocked = self
                .conns
                .get(ck)
                .is_some_and(|c| c.pending_write() >= MAX_WRITE_BUFFER_BYTES);
            // Write as we go: pipelined requests stop being parsed while the write buffer
            // is full, and a write the kernel takes at once brings no writable edge later.
            let was_lazy = self.conn_is_lazy(ck);
            self.conn_flush(ck);
            let Some(c) = self.conns.get(ck) else { return };
            // A lazy body that just finished held requests back as a full buffer does.
            let lazy_done = was_lazy && !matches!(c.phase, Phase::Json(_));
            // An upload whose chunk is being written takes nothing until it is back.
            let takes_input = matches!(
                c.phase,
                Phase::Head
                    | Phase::Body { .. }
                    | Phase::Upload {
                        target: Some(_),
                        ..
                    }
            ) && !c.close_after_flush;
            let progressed = before.is_some_and(|b| b != c.rbuf.len());
            let held_back = (progressed || blocked || lazy_done) && !c.rbuf.is_empty();
            if !((full || held_back) && takes_input && c.pending_write() < MAX_WRITE_BUFFER_BYTES) {
                break;
            }
        }
        self.conn_after_io(ck);
    }

    /// Reads until WouldBlock, EOF or the read-ahead bound. Returns true when it stopped
    /// at the bound (more may be waiting in the socket).
    fn conn_read(&mut self, ck: usize) -> bool {
        let Some(c) = self.conns.get_mut(ck) else {
            return false;
        };
        let mut buf = [0u8; 16 * 1024];
        let mut drained = 0usize;
        loop {
            if c.read_eof {
                return false;
            }
            if c.lingering {
                match c.stream.read(&mut buf) {
                    Ok(0) => c.read_eof = true,
                    // Bounded per event: the LINGER timer must get its turn.
                    Ok(n) if drained < MAX_READ_AHEAD_BYTES * 4 => {
                        drained += n;
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => c.read_eof = true,
                }
                return false;
            }
            let room = MAX_READ_AHEAD_BYTES.saturating_sub(c.rbuf.len());
            if room == 0 {
                return true;
            }
            let want = room.min(buf.len());
            match c.stream.read(&mut buf[..want]) {
                Ok(0) => {
                    c.read_eof = true;
                    return false;
                }
                Ok(n) => c.rbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    c.read_eof = true;
                    return false;
                }
            }
        }
    }

    /// Parses and dispatches as many requests as the buffer and phase allow.
    fn conn_advance(&mut self, ck: usize) {
        loop {
            let Some(c) = self.conns.get_mut(ck) else {
                return;
            };
            if c.close_after_flush || c.pending_write() >= MAX_WRITE_BUFFER_BYTES {
                return;
            }
            match &mut c.phase {
                Phase::Busy { .. }
                | Phase::Stream { .. }
                | Phase::Job
                | Phase::UploadWait { .. }
                | Phase::Transfer(_)
                | Phase::Json(_)
                | Phase::Agent { .. } => return,
                Phase::Upload { .. } => {
                    if !self.advance_upload(ck) {
                        return;
                    }
                }
                Phase::Head => {
                    if c.head_started.is_none() {
                        // RFC 9112 §2.2: ignore empty lines before a request line.
                        let skip = c
                            .rbuf
                            .iter()
                            .take_while(|&&b| b == b'\r' || b == b'\n')
                            .count();
                        c.rbuf.drain(..skip);
                        if c.rbuf.is_empty() {
                            return;
                        }
                        c.head_started = Some(Instant::now());
                        let t = Duration::from_millis(self.cfg.head_timeout_ms);
                        self.arm_conn(ck, t);
                        continue;
                    }
                    let Some(end) = find_head_end(&c.rbuf, c.scan_from) else {
                        if c.rbuf.len() > MAX_HEAD_BYTES {
                            // Still in the request line: the target is what is too long.
                            let resp = if !c.rbuf.contains(&b'\n') {
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
                            self.respond_and_close(ck, resp);
                            return;
                        }
                        c.scan_from = c.rbuf.len();
                        return;
                    };
                    let parsed = parse_head(&c.rbuf[..end]);
                    c.rbuf.drain(..end);
                    c.scan_from = 0;
                    c.head_started = None;
                    match parsed {
                        Err(e) => {
                            crate::warn_limited!("conn={ck} peer={} bad request: {e}", c.peer);
                            let code = match e.status() {
                                431 => "header_too_large",
                                414 => "uri_too_long",
                                505 => "http_version_not_supported",
                                501 => "not_implemented",
                                417 => "expectation_failed",
                                _ => "bad_request",
                            };
                            self.respond_and_close(
                                ck,
                                Response::error(e.status(), code, Some(&e.to_string())),
                            );
                            return;
                        }
                        Ok(head) => self.start_request(ck, head),
                    }
                }
                Phase::Body { .. } => {
                    if !self.advance_body(ck) {
                        return;
                    }
                }
            }
        }
    }

    fn start_request(&mut self, ck: usize, head: Head) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.keep_alive = head.keep_alive;
        c.head_only = head.method == "HEAD";
        let (route, params) = match api::resolve(&head.method, &head.path) {
            Ok(r) => r,
            Err(e) => {
                let resp = api::error::route_error(e);
                if head.framing == Framing::None {
                    self.respond(ck, resp);
                } else {
                    // Not worth reading a body nobody will use.
                    self.respond_and_close(ck, resp);
                }
                return;
            }
        };
        let peer = c.peer.ip();
        let tenant = match self
            .admission
            .check(route.class, &head, peer, Instant::now())
        {
            crate::admission::Verdict::Allow { tenant } => tenant,
            crate::admission::Verdict::Deny(resp) => {
                if head.framing == Framing::None {
                    self.respond(ck, resp);
                } else {
                    self.respond_and_close(ck, resp);
                }
                return;
            }
        };
        if let Handler::Upload = route.handler {
            self.begin_upload(ck, head, tenant, params);
            return;
        }
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let cap = route.body_cap;
        let state = match head.framing {
            Framing::None => {
                self.dispatch(
                    ck,
                    route,
                    Request {
                        head,
                        body: Vec::new(),
                        tenant,
                        params,
                    },
                );
                return;
            }
            Framing::Length(n) if n > cap as u64 => {
                // Refused before any `100 Continue`, so a polite client sends nothing.
                self.respond_and_close(ck, route.over_cap());
                return;
            }
            Framing::Length(n) => BodyState::Length(n),
            Framing::Chunked => BodyState::Chunked(ChunkedDecoder::new()),
        };
        if head.expect_continue {
            c.wbuf.extend_from_slice(crate::http::response::CONTINUE);
        }
        c.phase = Phase::Body {
            head: Box::new(head),
            route,
            params,
            tenant,
            state,
            body: Vec::new(),
        };
        let t = Duration::from_millis(self.cfg.head_timeout_ms);
        self.arm_conn(ck, t);
    }

    /// Moves body bytes out of the read buffer. Returns true when the request was
    /// dispatched (the caller may continue with the next one).
    fn advance_body(&mut self, ck: usize) -> bool {
        let Some(c) = self.conns.get_mut(ck) else {
            return false;
        };
        let Phase::Body {
            route, state, body, ..
        } = &mut c.phase
        else {
            return false;
        };
        let route: &'static Spec = route;
        let cap = route.body_cap;
        let done = match state {
            BodyState::Length(remaining) => {
                let take = usize::try_from(*remaining)
                    .unwrap_or(usize::MAX)
                    .min(c.rbuf.len());
                body.extend(c.rbuf.drain(..take));
                *remaining -= take as u64;
                *remaining == 0
            }
            BodyState::Chunked(dec) => match dec.feed(&c.rbuf, body, cap) {
                Ok(n) => {
                    c.rbuf.drain(..n);
                    dec.is_done()
                }
                Err(ChunkError::TooLarge) => {
                    self.respond_and_close(ck, route.over_cap());
                    return false;
                }
                Err(e) => {
                    self.respond_and_close(
                        ck,
                        Response::error(400, "bad_request", Some(&e.to_string())),
                    );
                    return false;
                }
            },
        };
        if !done {
            if !c.rbuf.is_empty() {
                return false;
            }
            // Body idle deadline, re-armed on progress.
            let t = Duration::from_millis(self.cfg.head_timeout_ms);
            self.arm_conn(ck, t);
            return false;
        }
        let Phase::Body {
            head,
            route,
            params,
            body,
            tenant,
            ..
        } = std::mem::replace(&mut c.phase, Phase::Head)
        else {
            return false;
        };
        self.dispatch(
            ck,
            route,
            Request {
                head: *head,
                body,
                tenant,
                params,
            },
        );
        true
    }

    fn dispatch(&mut self, ck: usize, route: &'static Spec, req: Request) {
        log::debug!("conn={ck} {} {}", req.head.method, req.head.path);
        let Handler::Request(handle) = route.handler else {
            // Uploads are taken over at their head and never reach here.
            self.respond(ck, Response::error(500, "internal_error", None));
            return;
        };
        match handle(&mut self.app, &req) {
            Action::Respond(resp) => self.respond(ck, resp),
            Action::Agent(start) => self.agent_start(ck, start),
            Action::Execute { plan, stream } => self.start_run(ck, plan, stream),
            Action::Job(job) => self.start_job(ck, job),
        }
    }

    /// Queues a complete response; the connection goes back to reading heads.
    pub(crate) fn respond(&mut self, ck: usize, resp: Response) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let keep_alive = c.keep_alive && !shutting_down;
        resp.write_to(&mut c.wbuf, c.head_only, keep_alive);
        c.phase = Phase::Head;
        if !keep_alive {
            c.close_after_flush = true;
        }
        let t = Duration::from_millis(self.cfg.idle_timeout_ms);
        self.arm_conn(ck, t);
    }

    /// A 200 JSON response whose body is encoded as the socket drains.
    pub(crate) fn respond_lazy(&mut self, ck: usize, body: crate::http::lazy::LazyBody) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let keep_alive = c.keep_alive && !shutting_down;
        crate::http::response::write_head(
            &mut c.wbuf,
            200,
            &[("Content-Type", "application/json".into())],
            Some(body.len()),
            keep_alive,
        );
        if c.head_only {
            c.phase = Phase::Head;
        } else {
            queue_lazy(c, body);
        }
        if !keep_alive {
            c.close_after_flush = true;
        }
        let t = Duration::from_millis(self.cfg.idle_timeout_ms);
        self.arm_conn(ck, t);
    }

    /// Ends an SSE stream with a `done` event whose data is `json`, encoded as the
    /// socket drains like a JSON response, then the last chunk.
    pub(crate) fn finish_stream_lazy(&mut self, ck: usize, json: crate::http::lazy::LazyBody) {
        let prefix = b"event: done\ndata: ";
        let event_len = prefix.len() + json.len() + 2;
        let body = json.wrapped(
            [&chunk_head(event_len)[..], prefix].concat(),
            [&b"\n\n\r\n"[..], LAST_CHUNK].concat(),
        );
        let idle = Duration::from_millis(self.cfg.idle_timeout_ms);
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        queue_lazy(c, body);
        if !c.keep_alive || shutting_down {
            c.close_after_flush = true;
        }
        self.arm_conn(ck, idle);
        self.conn_flush(ck);
    }

    pub(crate) fn respond_and_close(&mut self, ck: usize, resp: Response) {
        if let Some(c) = self.conns.get_mut(ck) {
            c.keep_alive = false;
        }
        self.respond(ck, resp);
    }

    /// Writes what is queued. Returns false when the connection failed.
    pub(crate) fn conn_flush(&mut self, ck: usize) -> bool {
        let Some(c) = self.conns.get_mut(ck) else {
            return false;
        };
        loop {
            // A lazy body keeps at most half the write bound queued, topped up as the
            // socket takes it (written bytes are dropped first, so the buffer stays
            // within that bound plus one escape).
            if let Phase::Json(body) = &mut c.phase {
                let window = MAX_WRITE_BUFFER_BYTES / 2;
                if c.wbuf.len() - c.wpos < window {
                    c.wbuf.drain(..c.wpos);
                    c.wpos = 0;
                    body.fill(&mut c.wbuf, window);
                    if body.done() {
                        c.phase = Phase::Head;
                    }
                }
            }
            if c.wpos == c.wbuf.len() {
                break;
            }
            match c.stream.write(&c.wbuf[c.wpos..]) {
                Ok(0) => return false,
                Ok(n) => {
                    c.wpos += n;
                    c.last_write = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    c.read_eof = true;
                    c.close_after_flush = true;
                    c.wbuf.clear();
                    c.wpos = 0;
                    if matches!(c.phase, Phase::Json(_)) {
                        c.phase = Phase::Head;
                    }
                    return false;
                }
            }
        }
        if c.wpos == c.wbuf.len() {
            c.wbuf.clear();
            c.wpos = 0;
        } else if c.wpos > 64 * 1024 {
            c.wbuf.drain(..c.wpos);
            c.wpos = 0;
        }
        if let Phase::Stream { run } = c.phase {
            if c.pending_write() < MAX_WRITE_BUFFER_BYTES / 2 {
                self.run_resume(run);
            }
        }
        true
    }

    fn conn_is_lazy(&self, ck: usize) -> bool {
        self.conns
            .get(ck)
            .is_some_and(|c| matches!(c.phase, Phase::Json(_)))
    }

    /// After I/O: flush, then close when finished or when the peer left.
    pub(crate) fn conn_after_io(&mut self, ck: usize) {
        let was_lazy = self.conn_is_lazy(ck);
        self.conn_flush(ck);
        let Some(c) = self.conns.get(ck) else { return };
        if was_lazy && matches!(c.phase, Phase::Head) && !c.rbuf.is_empty() {
            // The lazy body is out: requests pipelined behind it are parsed now (no
            // readable edge will come for bytes already read).
            self.conn_pump(ck);
            return;
        }
        let gone = c.read_eof;
        match c.phase {
            Phase::Busy { run } | Phase::Stream { run } if gone => {
                // The client hung up mid-run: the run is cancelled and its sandbox killed.
                log::info!("conn={ck} client disconnected during run");
                self.run_cancel(run);
                self.close_conn(ck);
            }
            Phase::Busy { .. } | Phase::Stream { .. } => {}
            Phase::Agent { .. } if gone => {
                log::info!("conn={ck} client disconnected during an agent loop");
                self.close_conn(ck);
            }
            Phase::Agent { .. } => {}
            // A client that half-closed still gets the rest of the body (a failed write
            // ends the body and closes).
            Phase::Json(_) => {}
            // A client that half-closed after its request still gets the answer of a
            // pool job (a failed write closes the connection then); an upload or a
            // download ends with its peer.
            Phase::Job | Phase::UploadWait { .. } => {}
            Phase::Upload { .. } | Phase::Transfer(_) if gone => self.close_conn(ck),
            _ if c.lingering && !gone => {}
            _ if c.pending_write() == 0 && c.close_after_flush && !gone => {
                // Half-close and drain for a moment (bounded by LINGER): closing with
                // unread input would send a reset that can destroy our response.
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
                if let Some(c) = self.conns.get_mut(ck) {
                    c.lingering = true;
                    c.rbuf.clear();
                }
                self.arm_conn(ck, LINGER);
                self.conn_read(ck);
                if self.conns.get(ck).is_some_and(|c| c.read_eof) {
                    self.close_conn(ck);
                }
            }
            _ if c.pending_write() == 0 && (c.close_after_flush || gone) => self.close_conn(ck),
            _ => {}
        }
    }

    pub(crate) fn close_conn(&mut self, ck: usize) {
        if !self.conns.contains(ck) {
            return;
        }
        let mut c = self.conns.remove(ck);
        let client = crate::admission::ratelimit::client_key(c.peer.ip());
        if let Some(n) = self.conns_per_ip.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                self.conns_per_ip.remove(&client);
            }
        }
        self.reactor.deregister(&mut c.stream, c.token);
        match std::mem::replace(&mut c.phase, Phase::Head) {
            Phase::Busy { run } | Phase::Stream { run } => self.run_cancel(run),
            Phase::Upload { target, .. } => self.abort_upload(target),
            Phase::Transfer(t) => self.transfer_release(*t),
            Phase::Agent { cancel, .. } => {
                cancel.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            _ => {}
        }
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
        log::debug!("conn={ck} closed");
    }

    pub(crate) fn conn_timer(&mut self, ck: usize, gen: u64) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        if c.timer_gen != gen {
            return;
        }
        c.scheduled = None;
        let now = Instant::now();
        if now < c.deadline {
            // The deadline moved later since this entry was scheduled.
            let left = c.deadline - now;
            self.arm_conn(ck, left);
            return;
        }
        let Some(c) = self.conns.get(ck) else { return };
        if c.lingering {
            self.close_conn(ck);
            return;
        }
        let idle = Duration::from_millis(self.cfg.idle_timeout_ms);
        match &c.phase {
            // A response still being taken, slowly but steadily: the stall counts from
            // the last write, not from the response's start.
            Phase::Head if c.pending_write() > 0 && c.last_write.elapsed() < idle => {
                let left = idle - c.last_write.elapsed();
                self.arm_conn(ck, left);
            }
            Phase::Head if c.head_started.is_some() => {
                crate::warn_limited!(
                    "conn={ck} peer={} request head not complete in time",
                    c.peer
                );
                self.close_conn(ck);
            }
            Phase::Head => self.close_conn(ck),
            Phase::Body { .. } | Phase::Upload { .. } => {
                crate::warn_limited!("conn={ck} peer={} request body stalled", c.peer);
                self.take_upload(ck);
                self.respond_and_close(
                    ck,
                    Response::error(
                        408,
                        "request_timeout",
                        Some("request body not received in time"),
                    ),
                );
                self.conn_after_io(ck);
                // If the client does not read the 408 either, drop it at the next deadline.
                let t = Duration::from_millis(self.cfg.idle_timeout_ms);
                self.arm_conn(ck, t);
            }
            Phase::Job | Phase::UploadWait { .. } => {
                let idle = Duration::from_millis(self.cfg.idle_timeout_ms);
                self.arm_conn(ck, idle);
            }
            Phase::Stream { .. }
            | Phase::Busy { .. }
            | Phase::Transfer(_)
            | Phase::Json(_)
            | Phase::Agent { .. } => {
                let idle = Duration::from_millis(self.cfg.idle_timeout_ms);
                if c.pending_write() > 0 && c.last_write.elapsed() >= idle {
                    crate::warn_limited!("conn={ck} peer={} stopped reading; dropping", c.peer);
                    self.close_conn(ck);
                } else {
                    self.arm_conn(ck, idle);
                }
            }
        }
    }

    pub(crate) fn close_idle_conns(&mut self) {
        let idle: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                matches!(c.phase, Phase::Head)
                    && c.head_started.is_none()
                    && c.rbuf.is_empty()
                    && c.pending_write() == 0
            })
            .map(|(k, _)| k)
            .collect();
        for ck in idle {
            self.close_conn(ck);
        }
    }

    /// Closes every connection not waiting for a run (uploads, downloads, pool jobs,
    /// bodies, unread responses) at the end of the shutdown grace. Runs end by being
    /// killed, and their connections then.
    pub(crate) fn close_unfinished_conns(&mut self) {
        let stuck: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| !matches!(c.phase, Phase::Busy { .. } | Phase::Stream { .. }))
            .map(|(k, _)| k)
            .collect();
        for ck in stuck {
            self.close_conn(ck);
        }
    }

    pub(crate) fn conns_all_flushed(&self) -> bool {
        self.conns
            .iter()
            .all(|(_, c)| c.pending_write() == 0 && matches!(c.phase, Phase::Head))
    }
}

/// Queues the first window of `body`; the rest follows as the socket drains.
fn queue_lazy(c: &mut Conn, mut body: crate::http::lazy::LazyBody) {
    let upto = c.wbuf.len() - c.wpos + MAX_WRITE_BUFFER_BYTES / 2;
    body.fill(&mut c.wbuf, c.wpos + upto);
    c.phase = if body.done() {
        Phase::Head
    } else {
        Phase::Json(Box::new(body))
    };
}

/// How long a closing connection keeps draining what the client still sends.
const LINGER: Duration = Duration::from_secs(2);

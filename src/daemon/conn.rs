//! Client connections on the loop: the listener, each connection's socket and deadline,
//! and the glue between its HTTP state machine (`http::conn`, which parses, frames
//! and decides on its own) and the rest of the daemon: routing and admission of a
//! head, the handler's dispatch, and who owns a request once it is handed over (an
//! [`Owner`]: a run, a pool job, an upload, a download, an agent loop).
//!
//! It stays one file (about 620 lines of code): a socket's life, a head's routing and
//! admission, and the hand-over to an owner are the one path every request takes, and
//! every owner a connection can have is listed in one enum here.
//!
//! Requests on a connection are served strictly one at a time, so pipelined requests
//! are answered in order. Reactor thread only.

use super::faces::Routed;
use super::Daemon;
use crate::api::routes::{Handler, Spec};
use crate::api::Action;
use crate::http::conn::{self as hc, After, BodyState, BodyStep, Expired, HeadStep, Role};
use crate::http::limits::MAX_WRITE_BUFFER_BYTES;
use crate::http::{Head, Request, Response};
use crate::reactor::{Addr, Component, ComponentId, Readiness};
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Token};
use std::io::{self, Write};
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
/// Timers: go on reading a connection that had more to read after its share of a turn,
/// on the next turn (`Reactor::soon`; the generation is the connection's serial).
const PUMP: u16 = 2;
/// Reads of a full read buffer one connection gets in one turn of the loop (64 KiB
/// each): a client that sends as fast as it is read (a flood of pings, say) would
/// otherwise hold the loop, and every other connection, until its socket ran dry.
const PUMP_ROUNDS: usize = 4;
/// A request body (an upload too) must arrive at this rate on average, beyond the
/// first `ISOBOX_HEAD_TIMEOUT_MS`: each byte buys that much more time. Without it a
/// body trickled one byte per (head timeout − 1 s) would hold its connection forever.
pub(crate) const MIN_BODY_RATE: f64 = 1024.0;

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
            PUMP if d.conns.get(ck).is_some_and(|c| c.serial == gen) => d.conn_pump(ck),
            _ => {}
        }
    }
}

/// Who a request is with once its connection handed it over.
pub enum Owner {
    /// A run answers: with one JSON body, or (`stream`) as SSE.
    Run {
        /// Run key.
        run: usize,
        /// SSE.
        stream: bool,
    },
    /// A pool job works on it (its outcome comes back as a continuation).
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
        target: Option<Box<dyn super::transfer::UploadSink>>,
        /// Decoded bytes not yet handed to the pool.
        buf: Vec<u8>,
    },
    /// A response body is being forwarded from a transfer thread's pipe.
    Transfer(Box<super::transfer::Transfer>),
    /// A long-lived sandbox answers once: its creation (after its init's hello) or its
    /// removal.
    BoxWait {
        /// The sandbox's key.
        key: usize,
        /// Its serial.
        serial: u64,
        /// It is being created for this client (which, leaving, ends it: nobody else
        /// has its id).
        create: bool,
    },
    /// A command in a long-lived sandbox: one JSON answer at its end, or NDJSON.
    BoxCmd {
        /// The sandbox's key.
        key: usize,
        /// Its serial.
        serial: u64,
        /// The call that started the command.
        call: u32,
    },
    /// A download from a long-lived sandbox: its bytes as init sends them.
    BoxFile {
        /// The sandbox's key.
        key: usize,
        /// Its serial.
        serial: u64,
        /// The open file's handle.
        handle: u32,
    },
    /// An upload to a long-lived sandbox: its body, decoded as it arrives, goes to
    /// init as frames.
    BoxUpload {
        /// The sandbox's key.
        key: usize,
        /// Its serial.
        serial: u64,
        /// The open file's handle.
        handle: u32,
        /// Framing state.
        state: BodyState,
        /// The path as asked (for the answer).
        path: Vec<u8>,
        /// Waiting for room on the sandbox's channel: nothing is read meanwhile.
        waiting: bool,
    },
    /// A client watching a directory in a long-lived sandbox (NDJSON).
    BoxWatch {
        /// The sandbox's key.
        key: usize,
        /// Its serial.
        serial: u64,
        /// The watch's handle.
        handle: u32,
    },
    /// A many-input request's runs answer: every result at the end, or SSE.
    Batch {
        /// The batch's key.
        batch: usize,
        /// Its serial.
        serial: u64,
    },
    /// A client following a recorded run's events (SSE), from event `next` on.
    RunEvents {
        /// The record's key.
        rec: usize,
        /// Its serial.
        serial: u64,
        /// Index of the next event to write.
        next: usize,
    },
    /// A client waiting for a recorded run's end (`?wait=`).
    RunWait {
        /// The record's key.
        rec: usize,
        /// Its serial.
        serial: u64,
        /// Its deadline timer's generation.
        gen: u64,
    },
    /// A client streaming a background process (NDJSON).
    BoxProc {
        /// The sandbox's key.
        key: usize,
        /// Its serial.
        serial: u64,
        /// The process.
        pid: u32,
        /// Which of its streaming clients this is.
        sub: u64,
    },
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
    /// The eryx face's WebSocket (`/eryx/v1/stream`), after its upgrade.
    Ws(Box<super::eryx::WsState>),
    /// A WebSocket on a background process's terminal (`…/process/{pid}/ws`).
    BoxTerm(Box<super::box_term::TermState>),
}

impl hc::Owner for Owner {
    fn role(&self) -> Role {
        match self {
            Owner::Run { .. }
            | Owner::Transfer(_)
            | Owner::Agent { .. }
            | Owner::BoxCmd { .. }
            | Owner::BoxFile { .. }
            | Owner::BoxWatch { .. }
            | Owner::BoxProc { .. }
            | Owner::RunEvents { .. }
            | Owner::Batch { .. } => Role::Produces,
            // Like a pool job: a client that half-closed still gets the answer.
            Owner::RunWait { .. } => Role::Answers,
            Owner::BoxUpload { waiting, .. } => Role::Receives { reading: !waiting },
            // A creator that hangs up leaves a sandbox whose id nobody has: its end is
            // noticed (and the sandbox ended), as a run's client's is.
            Owner::BoxWait { create: true, .. } => Role::Produces,
            Owner::Job | Owner::UploadWait { .. } | Owner::BoxWait { .. } => Role::Answers,
            Owner::Ws(w) => Role::Converses { busy: w.busy() },
            // Attached: quiet is a person thinking, not a dead client; a quiet
            // connection is pinged, and closed only if the ping goes unanswered.
            Owner::BoxTerm(t) => Role::Converses { busy: !t.pinged },
            Owner::Upload { target, .. } => Role::Receives {
                reading: target.is_some(),
            },
        }
    }
}

/// A connection's HTTP state, with the faces' routes and the daemon's owners.
pub type HttpConn = hc::Conn<Routed, Owner>;
/// Where a connection is.
pub type Phase = hc::Phase<Routed, Owner>;

/// A client connection: its socket, its HTTP state and its deadline.
pub struct Client {
    pub(crate) stream: TcpStream,
    pub(crate) token: Token,
    pub(crate) serial: u64,
    pub(crate) peer: SocketAddr,
    /// The address the current request is accounted to (the peer, or the client
    /// behind a trusted proxy), as the rate limiter keys it.
    pub(crate) client: std::net::IpAddr,
    pub(crate) http: HttpConn,
    pub(crate) timer_gen: u64,
    /// The current deadline (head, body, idle or write stall).
    pub(crate) deadline: Instant,
    /// Deadline of the live wheel entry, if one is scheduled.
    pub(crate) scheduled: Option<Instant>,
    /// When the body being read began to arrive, and its bytes so far (the body's
    /// minimum rate, `MIN_BODY_RATE`).
    pub(crate) body_since: Option<Instant>,
    pub(crate) body_bytes: u64,
}

impl Client {
    /// The owner of the request being served, if it was handed over.
    pub(crate) fn owner(&self) -> Option<&Owner> {
        match &self.http.phase {
            hc::Phase::Owned(w) => Some(w),
            _ => None,
        }
    }

    /// The owner, to change it.
    pub(crate) fn owner_mut(&mut self) -> Option<&mut Owner> {
        match &mut self.http.phase {
            hc::Phase::Owned(w) => Some(w),
            _ => None,
        }
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
        } else if self.conns.len() + self.proxies.len() >= self.cfg.max_connections {
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
            crate::warn_limited!(client = peer.ip(); "conn refused peer={peer} reason={reason}");
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
                self.conn_uncount(peer);
                return;
            }
        };
        let now = Instant::now();
        entry.insert(Client {
            stream,
            token,
            serial: self.conn_serial,
            peer,
            client: crate::admission::ratelimit::client_key(peer.ip()),
            http: HttpConn::new(now),
            timer_gen: 0,
            deadline: now,
            scheduled: None,
            body_since: None,
            body_bytes: 0,
        });
        self.arm_conn(ck, Duration::from_millis(self.cfg.idle_timeout_ms));
        log::debug!("conn={ck} peer={peer} accepted");
    }

    /// Forgets one open connection of `peer`'s address.
    pub(crate) fn conn_uncount(&mut self, peer: SocketAddr) {
        let client = crate::admission::ratelimit::client_key(peer.ip());
        if let Some(n) = self.conns_per_ip.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                self.conns_per_ip.remove(&client);
            }
        }
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

    /// The body's deadline after `added` more bytes of it arrived: the head timeout from
    /// now (no byte for that long stalls it), but never later than the head timeout
    /// plus one second per `MIN_BODY_RATE` bytes from its first byte.
    pub(crate) fn arm_body(&mut self, ck: usize, added: usize) {
        let t = Duration::from_millis(self.cfg.head_timeout_ms);
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let now = Instant::now();
        let since = *c.body_since.get_or_insert(now);
        c.body_bytes = c.body_bytes.saturating_add(added as u64);
        let budget = t + Duration::from_secs_f64(c.body_bytes as f64 / MIN_BODY_RATE);
        let at = (now + t).min(since + budget);
        self.arm_conn(ck, at.saturating_duration_since(now));
    }

    /// Arms the idle deadline.
    pub(crate) fn arm_idle(&mut self, ck: usize) {
        self.arm_conn(ck, Duration::from_millis(self.cfg.idle_timeout_ms));
    }

    pub(crate) fn conn_event(&mut self, ck: usize, readable: bool, writable: bool) {
        // A lazy body holds pipelined requests back too: once it is out, parse them.
        let was_full = self
            .conns
            .get(ck)
            .is_some_and(|c| c.http.write_full() || matches!(c.http.phase, Phase::Json(_)));
        if writable {
            self.conn_flush(ck);
            if self
                .conns
                .get(ck)
                .is_some_and(|c| matches!(c.owner(), Some(Owner::Transfer(_))))
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

    /// Reads and advances until the socket is drained, the phase stops taking input, or
    /// the connection has had its share of this turn ([`PUMP_ROUNDS`]; it goes on at
    /// the next).
    pub(crate) fn conn_pump(&mut self, ck: usize) {
        let mut rounds = 0;
        loop {
            let Some(c) = self.conns.get_mut(ck) else {
                return;
            };
            let full = c.http.read_from(&mut c.stream);
            rounds += usize::from(full);
            let before = c.http.rbuf.len();
            self.conn_advance(ck);
            let blocked = self.conns.get(ck).is_some_and(|c| c.http.write_full());
            // Write as we go: pipelined requests stop being parsed while the write buffer
            // is full, and a write the kernel takes at once brings no writable edge later.
            let was_lazy = self.conn_is_lazy(ck);
            self.conn_flush(ck);
            let Some(c) = self.conns.get(ck) else { return };
            // A lazy body that just finished held requests back as a full buffer does.
            let lazy_done = was_lazy && !matches!(c.http.phase, Phase::Json(_));
            let progressed = before != c.http.rbuf.len();
            let held_back = (progressed || blocked || lazy_done) && !c.http.rbuf.is_empty();
            if !((full || held_back) && c.http.takes_input() && !c.http.write_full()) {
                break;
            }
            if rounds >= PUMP_ROUNDS {
                // Its share of this turn: the rest on the next (the socket's edge has
                // fired already and will not again while it is not drained).
                let serial = c.serial;
                self.reactor.soon(Addr::new(HTTP, ck, PUMP), serial);
                break;
            }
        }
        self.conn_after_io(ck);
    }

    /// Parses and dispatches as many requests as the buffer and phase allow.
    fn conn_advance(&mut self, ck: usize) {
        loop {
            let Some(c) = self.conns.get_mut(ck) else {
                return;
            };
            if c.http.close_after_flush || c.http.write_full() {
                return;
            }
            match &c.http.phase {
                Phase::Owned(Owner::Upload { .. }) => {
                    if !self.advance_upload(ck) {
                        return;
                    }
                }
                Phase::Owned(Owner::BoxUpload { .. }) => {
                    if !self.advance_box_upload(ck) {
                        return;
                    }
                }
                Phase::Owned(Owner::Ws(_) | Owner::BoxTerm(_)) => {
                    if !self.ws_pump(ck) {
                        return;
                    }
                }
                Phase::Owned(_) | Phase::Json(_) => return,
                Phase::Head => match c.http.next_head(Instant::now()) {
                    HeadStep::Wait => return,
                    HeadStep::Began => {
                        let t = Duration::from_millis(self.cfg.head_timeout_ms);
                        self.arm_conn(ck, t);
                    }
                    HeadStep::Refused { err } => {
                        if let Some(e) = err {
                            crate::warn_limited!(client = c.peer.ip(); "conn={ck} peer={} bad request: {e}", c.peer);
                        }
                        // The refusal gets the idle deadline to be read, as any response.
                        self.arm_idle(ck);
                        return;
                    }
                    HeadStep::Head(head) => self.start_request(ck, head),
                },
                Phase::Body { .. } => {
                    let before = c.http.rbuf.len();
                    let step = c.http.advance_body();
                    let added = before.saturating_sub(c.http.rbuf.len());
                    if !self.body_step(ck, step, added) {
                        return;
                    }
                }
            }
        }
    }

    /// Routes and admits a head; then its body is read, or it is dispatched at once.
    fn start_request(&mut self, ck: usize, head: Head) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.body_since = None;
        c.body_bytes = 0;
        // A sandbox's public URL never reaches the API: the connection goes to the proxy.
        if super::proxy::public_host(head.header("host"), &self.public.domain)
            != super::proxy::PublicHost::No
        {
            self.proxy_take(ck, head);
            return;
        }
        c.http.label = (
            Routed::face_of(&head.path),
            crate::metrics::method_label(&head.method),
            "unmatched",
        );
        let (route, params) = match Routed::resolve(&head.method, &head.path) {
            Ok(r) => r,
            Err(resp) => {
                c.http.refuse_head(&head, resp, shutting_down);
                return;
            }
        };
        let (face, pattern) = route.label();
        c.http.label = (face, c.http.label.1, pattern);
        let peer = c.peer.ip();
        let tenant = match self
            .admission
            .check(route.class(), &head, peer, Instant::now())
        {
            crate::admission::Verdict::Allow { tenant } => tenant,
            crate::admission::Verdict::Deny(resp) => {
                let resp = route.shaped(resp, head.header("authorization"));
                c.http.refuse_head(&head, resp, shutting_down);
                return;
            }
        };
        c.client = crate::admission::ratelimit::client_key(self.admission.client_ip(&head, peer));
        if let Routed::Isobox(Spec {
            handler: Handler::Upload,
            ..
        }) = route
        {
            self.begin_upload(ck, head, tenant, params);
            return;
        }
        if let Routed::Eryx(spec) = route {
            if spec.id == crate::eryx::Route::Environments && head.method == "POST" {
                self.eryx_env_upload_begin(ck, head, tenant);
                return;
            }
        }
        if let Routed::Wbx(spec) = route {
            if spec.id == crate::wbx::routes::Route::Files && head.method == "PUT" {
                self.file_put_begin(ck, head, &tenant, &params);
                return;
            }
        }
        let cap = route.body_cap();
        if cap > crate::http::limits::LARGE_BODY_BYTES && head.framing != crate::http::Framing::None
        {
            // Large bodies are held whole until parsed: all of them together within a
            // budget, so slow senders cannot pin the daemon's memory.
            let held: usize = self
                .conns
                .iter()
                .map(|(_, c)| c.http.large_body_reserved())
                .sum();
            if held + cap > crate::http::limits::LARGE_BODIES_BUDGET {
                let resp = route.busy_bodies();
                if let Some(c) = self.conns.get_mut(ck) {
                    c.http.refuse_head(&head, resp, shutting_down);
                }
                return;
            }
        }
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        let before = c.http.rbuf.len();
        let step = c.http.begin_body(head, route, cap, params, tenant);
        let added = self
            .conns
            .get(ck)
            .map_or(0, |c| before.saturating_sub(c.http.rbuf.len()));
        self.body_step(ck, step, added);
    }

    /// Acts on what the body reader found. True when a request was dispatched (the
    /// caller may go on with the next one).
    fn body_step(&mut self, ck: usize, step: BodyStep<Routed>, added: usize) -> bool {
        match step {
            BodyStep::Wait { idle } => {
                if idle {
                    // The body's deadlines, moved on by progress (within its rate).
                    self.arm_body(ck, added);
                }
                false
            }
            BodyStep::Dispatch(route, req) => {
                self.dispatch(ck, route, req);
                true
            }
            BodyStep::OverCap(route) => {
                self.respond_and_close(ck, route.over_cap());
                false
            }
            BodyStep::Refused => {
                self.arm_idle(ck);
                false
            }
            BodyStep::Malformed(route, why) => {
                // In the face's shape: a client of any face reads its own errors.
                let resp = route.shaped(Response::error(400, "bad_request", Some(&why)), None);
                self.respond_and_close(ck, resp);
                self.arm_idle(ck);
                false
            }
        }
    }

    fn dispatch(&mut self, ck: usize, route: Routed, req: Request) {
        log::debug!("conn={ck} {} {}", req.head.method, req.head.path);
        let route = match route {
            Routed::Isobox(r) => r,
            Routed::Wbx(spec) => {
                match crate::wbx::routes::handle(spec, &req, &self.app.runtimes, &self.cfg.wbx) {
                    crate::wbx::routes::Asked::Respond(resp) => self.respond(ck, resp),
                    crate::wbx::routes::Asked::Op(op) => self.box_op(ck, req.tenant, op),
                    crate::wbx::routes::Asked::Job(op) => self.job_op(ck, req.tenant, op),
                }
                return;
            }
            Routed::Eryx(spec) => {
                self.eryx_request(ck, spec, req);
                return;
            }
        };
        let Handler::Request(handle) = route.handler else {
            // Uploads are taken over at their head and never reach here.
            self.respond(ck, Response::error(500, "internal_error", None));
            return;
        };
        match handle(&mut self.app, &req) {
            Action::Respond(resp) => self.respond(ck, resp),
            Action::Agent(start) => self.agent_start(ck, start),
            Action::Execute {
                plan,
                delivery,
                tenant,
            } => self.start_run(ck, plan, delivery, &tenant),
            Action::Run(op) => self.record_op(ck, op),
            Action::ExecuteMany {
                plan,
                inputs,
                stream,
                shared,
            } => self.start_batch(ck, plan, inputs, stream, shared),
            Action::Job(job) => self.start_job(ck, job),
            Action::Deferred(work) => self.start_deferred(ck, work),
        }
    }

    /// Hands connection `ck`'s request to `owner`.
    pub(crate) fn conn_own(&mut self, ck: usize, owner: Owner) {
        if let Some(c) = self.conns.get_mut(ck) {
            c.http.phase = Phase::Owned(owner);
        }
    }

    /// Queues a complete response; the connection goes back to reading heads.
    pub(crate) fn respond(&mut self, ck: usize, resp: Response) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.respond(resp, shutting_down);
        self.arm_idle(ck);
    }

    /// A 200 JSON response whose body is encoded as the socket drains.
    pub(crate) fn respond_lazy(&mut self, ck: usize, body: crate::http::lazy::LazyBody) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.respond_lazy(body, shutting_down);
        self.arm_idle(ck);
    }

    /// Ends an SSE stream with a `done` event whose data is `json`, encoded as the
    /// socket drains like a JSON response, then the last chunk.
    pub(crate) fn finish_stream_lazy(
        &mut self,
        ck: usize,
        json: crate::http::lazy::LazyBody,
        id: Option<u64>,
    ) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.finish_stream_lazy(json, id, shutting_down);
        self.arm_idle(ck);
        self.conn_flush(ck);
    }

    /// Sends the last event and the terminating chunk; the connection reads heads again.
    pub(crate) fn finish_stream(&mut self, ck: usize, frame: &[u8]) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.finish_stream(frame, shutting_down);
        self.conn_flush(ck);
        self.arm_idle(ck);
    }

    pub(crate) fn respond_and_close(&mut self, ck: usize, resp: Response) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.respond_and_close(resp);
        self.arm_idle(ck);
    }

    /// Connection `ck` waits for run `rk`: for its JSON result, or, as SSE, with the
    /// head sent at once.
    pub(crate) fn conn_wait_for_run(&mut self, ck: usize, rk: usize, stream: bool) {
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.phase = Phase::Owned(Owner::Run { run: rk, stream });
        if stream {
            c.http.start_sse(shutting_down);
        }
    }

    /// Starts an NDJSON response on `ck` (its owner stays).
    pub(crate) fn conn_start_ndjson(&mut self, ck: usize) {
        let shutting_down = self.app.shutting_down;
        if let Some(c) = self.conns.get_mut(ck) {
            c.http.start_ndjson(shutting_down);
        }
    }

    /// Starts an SSE response on `ck` (its owner stays).
    pub(crate) fn conn_start_sse(&mut self, ck: usize) {
        self.conn_start_sse_with(ck, &[]);
    }

    /// Starts an SSE response on `ck` with `extra` headers (its owner stays).
    pub(crate) fn conn_start_sse_with(&mut self, ck: usize, extra: &[(&'static str, String)]) {
        let shutting_down = self.app.shutting_down;
        if let Some(c) = self.conns.get_mut(ck) {
            c.http.start_sse_with(shutting_down, extra);
        }
    }

    /// Queues a framed SSE event on `ck`'s stream and tries to write it. True when the
    /// client is this far behind: the producer should pause.
    pub(crate) fn conn_send_sse(&mut self, ck: usize, frame: &[u8]) -> bool {
        let Some(c) = self.conns.get_mut(ck) else {
            return false;
        };
        c.http.send_chunk(frame);
        self.conn_flush(ck);
        self.conns.get(ck).is_some_and(|c| c.http.write_full())
    }

    /// Queues one SSE event on `ck`'s stream and tries to write it. True when the
    /// client is this far behind: the producer should pause.
    pub(crate) fn conn_send_event(&mut self, ck: usize, event: &str, data: &str) -> bool {
        let Some(c) = self.conns.get_mut(ck) else {
            return false;
        };
        c.http.send_event(event, data);
        self.conn_flush(ck);
        self.conns.get(ck).is_some_and(|c| c.http.write_full())
    }

    /// Queues an SSE comment (a keep-alive) on `ck`'s stream.
    pub(crate) fn conn_send_comment(&mut self, ck: usize, text: &str) {
        if let Some(c) = self.conns.get_mut(ck) {
            c.http.send_comment(text);
            self.conn_flush(ck);
        }
    }

    /// Queues one chunk of a chunked response (an agent loop's frame) and tries to
    /// write it.
    pub(crate) fn conn_send_chunked(&mut self, ck: usize, payload: &[u8]) {
        if let Some(c) = self.conns.get_mut(ck) {
            c.http.send_chunk(payload);
            self.conn_flush(ck);
        }
    }

    /// A connection whose run ended serves its next (pipelined) request.
    pub(crate) fn conn_resume(&mut self, ck: usize) {
        self.conn_pump(ck);
    }

    /// Writes what is queued, and nothing else. Returns false when the connection
    /// failed.
    pub(crate) fn conn_write(&mut self, ck: usize) -> bool {
        let Some(c) = self.conns.get_mut(ck) else {
            return false;
        };
        let written = c.http.write_to(&mut c.stream, Instant::now());
        tally(&mut self.app.metrics, &mut c.http);
        written
    }

    /// Writes what is queued; a producer whose client drained makes more. Returns false
    /// when the connection failed.
    pub(crate) fn conn_flush(&mut self, ck: usize) -> bool {
        if !self.conn_write(ck) {
            return false;
        }
        let Some(c) = self.conns.get(ck) else {
            return false;
        };
        let drained = c.http.pending_write() < MAX_WRITE_BUFFER_BYTES / 2;
        match c.owner() {
            Some(&Owner::Run { run, stream: true }) if drained => self.run_resume(run),
            Some(&Owner::BoxCmd { key, serial, call }) if drained => {
                self.exec_drained(key, serial, call)
            }
            Some(&Owner::BoxProc {
                key,
                serial,
                pid,
                sub,
            }) if drained => self.proc_drained(key, serial, pid, sub),
            Some(Owner::BoxTerm(t)) if drained => {
                let (key, serial, pid, sub) = (t.key, t.serial, t.pid, t.sub);
                self.proc_drained(key, serial, pid, sub);
            }
            Some(&Owner::BoxFile {
                key,
                serial,
                handle,
            }) if drained => self.file_drained(key, serial, handle),
            Some(Owner::RunEvents { .. }) if drained => self.record_pump(ck),
            Some(&Owner::Batch { batch, serial }) if drained => self.batch_resume(batch, serial),
            _ => {}
        }
        true
    }

    fn conn_is_lazy(&self, ck: usize) -> bool {
        self.conns
            .get(ck)
            .is_some_and(|c| matches!(c.http.phase, Phase::Json(_)))
    }

    /// After I/O: flush, then close when finished or when the peer left.
    pub(crate) fn conn_after_io(&mut self, ck: usize) {
        let was_lazy = self.conn_is_lazy(ck);
        self.conn_flush(ck);
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        if was_lazy && matches!(c.http.phase, Phase::Head) && !c.http.rbuf.is_empty() {
            // The lazy body is out: requests pipelined behind it are parsed now (no
            // readable edge will come for bytes already read).
            self.conn_pump(ck);
            return;
        }
        match c.http.after_io() {
            After::Stay => {}
            After::Close => {
                match c.owner() {
                    // The run is cancelled and its sandbox killed by the close.
                    Some(Owner::Run { .. }) => {
                        log::info!("conn={ck} client disconnected during run")
                    }
                    Some(Owner::Agent { .. }) => {
                        log::info!("conn={ck} client disconnected during an agent loop")
                    }
                    _ => {}
                }
                self.close_conn(ck);
            }
            After::Linger => {
                // Half-close and drain for a moment (bounded by LINGER): closing with
                // unread input would send a reset that can destroy our response.
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
                c.http.begin_linger();
                c.http.read_from(&mut c.stream);
                let gone = c.http.read_eof;
                self.arm_conn(ck, hc::LINGER);
                if gone {
                    self.close_conn(ck);
                }
            }
        }
    }

    pub(crate) fn close_conn(&mut self, ck: usize) {
        let Some(mut c) = self.conns.try_remove(ck) else {
            return;
        };
        tally(&mut self.app.metrics, &mut c.http);
        self.conn_uncount(c.peer);
        self.reactor.deregister(&mut c.stream, c.token);
        match std::mem::replace(&mut c.http.phase, Phase::Head) {
            Phase::Owned(Owner::Run { run, .. }) => self.run_cancel(run),
            Phase::Owned(Owner::Batch { batch, serial }) => self.batch_cancel(batch, serial),
            Phase::Owned(
                Owner::RunEvents { rec, serial, .. } | Owner::RunWait { rec, serial, .. },
            ) => self.record_reader_closed(ck, c.serial, rec, serial),
            Phase::Owned(Owner::Upload { target, .. }) => self.abort_upload(target),
            Phase::Owned(Owner::Transfer(t)) => self.transfer_release(*t),
            Phase::Owned(Owner::Agent { cancel, .. }) => {
                cancel.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            Phase::Owned(Owner::Ws(w)) => self.ws_closed(*w),
            Phase::Owned(Owner::BoxTerm(t)) => self.proc_unsubscribe(t.key, t.serial, t.pid, t.sub),
            Phase::Owned(Owner::BoxCmd { key, serial, call }) => {
                self.exec_cancel(key, serial, call)
            }
            Phase::Owned(Owner::BoxProc {
                key,
                serial,
                pid,
                sub,
            }) => self.proc_unsubscribe(key, serial, pid, sub),
            Phase::Owned(
                Owner::BoxFile {
                    key,
                    serial,
                    handle,
                }
                | Owner::BoxUpload {
                    key,
                    serial,
                    handle,
                    ..
                },
            ) => self.file_client_left(key, serial, handle),
            Phase::Owned(Owner::BoxWatch {
                key,
                serial,
                handle,
            }) => self.watch_client_left(key, serial, handle),
            Phase::Owned(Owner::BoxWait {
                key,
                serial,
                create: true,
            }) => self.box_creator_left(key, serial),
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
        let idle = Duration::from_millis(self.cfg.idle_timeout_ms);
        let peer = c.peer;
        match c.http.expired(now, idle) {
            Expired::Rearm(after) => {
                self.term_ping(ck);
                self.arm_conn(ck, after);
            }
            Expired::Close => {
                self.ws_goodbye(ck, 1001, "idle");
                self.close_conn(ck);
            }
            Expired::HeadTimeout => {
                crate::warn_limited!(client = peer.ip(); "conn={ck} peer={peer} request head not complete in time");
                self.close_conn(ck);
            }
            Expired::Stalled => {
                crate::warn_limited!(client = peer.ip(); "conn={ck} peer={peer} stopped reading; dropping");
                self.close_conn(ck);
            }
            Expired::BodyTimeout => {
                crate::warn_limited!(client = peer.ip(); "conn={ck} peer={peer} request body stalled");
                let resp = Response::error(
                    408,
                    "request_timeout",
                    Some("request body not received in time"),
                );
                // In the face's shape: the route's, or the WBX face's for a file upload.
                let resp = match self.conns.get(ck).map(|c| &c.http.phase) {
                    Some(Phase::Body { route, .. }) => route.shaped(resp, None),
                    Some(Phase::Owned(Owner::BoxUpload { .. })) => crate::wbx::reshape(resp),
                    // A file upload: its face's (an eryx environment's, the sessions').
                    Some(Phase::Owned(Owner::Upload {
                        target: Some(t), ..
                    })) => t.shape(resp),
                    _ => resp,
                };
                self.take_upload(ck);
                self.respond_and_close(ck, resp);
                self.conn_after_io(ck);
                // If the client does not read the 408 either, drop it at the next deadline.
                self.arm_idle(ck);
            }
        }
    }

    pub(crate) fn close_idle_conns(&mut self) {
        let idle: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.http.idle() || matches!(c.owner(), Some(Owner::Ws(w)) if !w.busy()))
            .map(|(k, _)| k)
            .collect();
        for ck in idle {
            self.ws_goodbye(ck, 1001, "the server is shutting down");
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
            .filter(|(_, c)| !matches!(c.owner(), Some(Owner::Run { .. } | Owner::Batch { .. })))
            .map(|(k, _)| k)
            .collect();
        for ck in stuck {
            self.ws_goodbye(ck, 1001, "the server is shutting down");
            self.close_conn(ck);
        }
    }

    pub(crate) fn conns_all_flushed(&self) -> bool {
        self.conns.iter().all(|(_, c)| c.http.flushed())
    }
}

/// Moves a connection's counted heads and bytes into the metrics.
fn tally<R, W: crate::http::conn::Owner>(
    m: &mut crate::metrics::Metrics,
    http: &mut crate::http::conn::Conn<R, W>,
) {
    for ((face, method, route), status) in http.heads.drain(..) {
        m.response(face, method, route, status);
    }
    let (r, w) = std::mem::take(&mut http.io_bytes);
    m.bytes_in += r;
    m.bytes_out += w;
}

//! The eryx face's requests on the loop: a checked run goes to the WebAssembly engine
//! (`wasm::Engine`, a supervisor thread and its jailed worker) and its answer comes back
//! through the mailbox to the connection that asked, if it is still there. A tenant
//! has at most `ISOBOX_ERYX_CONCURRENCY` runs going: past that, 429 at once (the
//! document: requests do not queue). A client that leaves does not stop its run; the
//! run still counts until it ends.
//!
//! `/v1/stream` is a WebSocket on the loop (`http::ws` frames it): one run at a time
//! per connection, its callback calls sent to the client as `callback` messages and
//! the client's `callback_response`s sent back to the engine by call. A client that
//! leaves mid-run leaves the run going: its calls waiting and to come fail at once in
//! Python (`RuntimeError`), so the run ends soon, and its units count as any run's.

use super::conn::Owner;
use super::Daemon;
use crate::eryx::{self, Route, Spec};
use crate::http::ws::{self, Message};
use crate::http::{Request, Response};
use crate::wasm::{Call, Failure, RunAnswer, RunRequest};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Instant;

/// A WebSocket connection of the eryx face.
#[derive(Debug)]
pub struct WsState {
    dec: ws::Decoder,
    /// Whose runs these are.
    tenant: String,
    /// The engine's id of the run going, if one is.
    pub run: Option<u64>,
    /// A session run is being started (its state read): the connection is busy.
    pub starting: bool,
    /// Calls sent to the client and not answered: `call_id` → the engine's call.
    calls: HashMap<String, u64>,
}

impl WsState {
    /// Whether a run is going or being started on this connection.
    pub fn busy(&self) -> bool {
        self.run.is_some() || self.starting
    }
}

/// Why no run starts when the engine is off.
const ENGINE_OFF: &str = "Python in WebAssembly is off on this server (ISOBOX_WASM_WORKER=off)";

/// Why a client's calls fail once it is gone.
const CLIENT_GONE: &str = "The client disconnected";

/// Bytes queued for a client past which a new call fails at once instead of adding
/// to them (a client that does not read cannot make the daemon hold its calls).
const CALL_BACKLOG_BYTES: usize = 8 << 20;

impl Daemon {
    /// A complete request on the eryx face.
    pub(crate) fn eryx_request(&mut self, ck: usize, spec: &Spec, req: Request) {
        match spec.id {
            Route::Execute => self.eryx_execute(ck, req),
            Route::Stream => self.eryx_stream_open(ck, &req),
            Route::Sessions => self.eryx_session_create(ck, &req),
            Route::Session => self.eryx_session_delete(ck, &req),
            Route::SessionExecute => self.eryx_session_execute(ck, &req),
            Route::Environments => self.eryx_env_request(ck, &req, false),
            Route::Environment => self.eryx_env_request(ck, &req, true),
        }
    }

    /// The engine, or the 503 that says it is off.
    pub(crate) fn eryx_off(&self) -> Option<Response> {
        self.wasm
            .is_none()
            .then(|| eryx::error(503, "unavailable", ENGINE_OFF))
    }

    /// `GET /v1/stream`: the upgrade (admission, the key and the rate, is done).
    fn eryx_stream_open(&mut self, ck: usize, req: &Request) {
        if let Some(resp) = self.eryx_off() {
            self.respond(ck, resp);
            return;
        }
        if self.app.shutting_down {
            self.respond(
                ck,
                eryx::error(503, "unavailable", "The server is shutting down"),
            );
            return;
        }
        let accept = match ws::check_upgrade(&req.head) {
            Ok(a) => a,
            Err(r) => {
                let resp = ws::refusal(&r, eryx::error(r.status, "invalid_request", r.message));
                self.respond(ck, resp);
                return;
            }
        };
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.note_head(101);
        c.http.wbuf.extend_from_slice(&ws::handshake(&accept));
        c.http.phase = super::conn::Phase::Owned(Owner::Ws(Box::new(WsState {
            dec: ws::Decoder::new(eryx::STREAM_MESSAGE_BYTES),
            tenant: req.tenant.clone(),
            run: None,
            starting: false,
            calls: HashMap::new(),
        })));
        log::debug!("conn={ck} eryx stream open");
        self.arm_idle(ck);
    }

    /// Takes the client's frames out of the read buffer and acts on each message.
    /// True when the caller may go on (the phase changed); false to wait for bytes.
    /// Reads the messages waiting on a WebSocket (an eryx stream or a process's
    /// terminal, `box_term.rs`): Ping, Pong and Close are answered here, alike for both,
    /// the rest go to the owner's handler; a protocol error closes with its code. False
    /// when nothing more can be done now.
    pub(crate) fn ws_pump(&mut self, ck: usize) -> bool {
        loop {
            let Some(c) = self.conns.get_mut(ck) else {
                return false;
            };
            if c.http.close_after_flush || c.http.write_full() {
                return false;
            }
            let http = &mut c.http;
            let (dec, term) = match &mut http.phase {
                super::conn::Phase::Owned(Owner::Ws(w)) => (&mut w.dec, false),
                super::conn::Phase::Owned(Owner::BoxTerm(t)) => (&mut t.dec, true),
                _ => return true,
            };
            let next = dec.next(&mut http.rbuf);
            let mid = dec.mid_message();
            match next {
                Ok(None) => return false,
                Ok(Some(m)) => {
                    let Some(m) = self.ws_control(ck, m, mid) else {
                        continue;
                    };
                    if term {
                        self.term_message(ck, m);
                    } else {
                        self.ws_message(ck, m);
                    }
                }
                Err(e) => {
                    let peer = c.peer;
                    let what = if term {
                        "terminal websocket"
                    } else {
                        "websocket"
                    };
                    crate::warn_limited!(client = peer.ip(); "conn={ck} peer={peer} {what}: {e}");
                    self.ws_close(ck, e.close_code(), &e.to_string());
                    return false;
                }
            }
        }
    }

    /// What every WebSocket does alike with a message: it is a sign of life (a ping
    /// too, but not while a fragmented message is held half-read: pings must not keep
    /// its bytes forever); a Ping is answered, a Pong taken, a Close echoed (RFC 6455
    /// §5.5.1). The rest is the owner's.
    fn ws_control(&mut self, ck: usize, m: Message, mid: bool) -> Option<Message> {
        if !(mid && matches!(m, Message::Ping(_) | Message::Pong(_))) {
            if let Some(Owner::BoxTerm(t)) = self.conns.get_mut(ck).and_then(|c| c.owner_mut()) {
                t.pinged = false;
            }
            self.arm_idle(ck);
        }
        match m {
            Message::Ping(p) => {
                if let Some(c) = self.conns.get_mut(ck) {
                    ws::write_pong(&mut c.http.wbuf, &p);
                }
                None
            }
            Message::Pong(_) => None,
            Message::Close(code) => {
                self.ws_close(ck, code.map_or(1000, |(c, _)| c), "");
                None
            }
            m => Some(m),
        }
    }

    /// Queues a close frame; the connection ends once it is out.
    fn ws_close(&mut self, ck: usize, code: u16, reason: &str) {
        if let Some(c) = self.conns.get_mut(ck) {
            ws::write_close(&mut c.http.wbuf, code, reason);
            c.http.close_after_flush = true;
        }
    }

    /// Tells a WebSocket why it is closed (best effort: what the socket takes now),
    /// unless it already said its last. For a closing path that drops the connection.
    pub(crate) fn ws_goodbye(&mut self, ck: usize, code: u16, reason: &str) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        if !matches!(c.owner(), Some(Owner::Ws(_) | Owner::BoxTerm(_)))
            || c.http.close_after_flush
            || c.http.lingering
        {
            return;
        }
        ws::write_close(&mut c.http.wbuf, code, reason);
        c.http.close_after_flush = true;
        self.conn_write(ck);
    }

    /// Queues a text message.
    fn ws_send(&mut self, ck: usize, text: &str) {
        if let Some(c) = self.conns.get_mut(ck) {
            ws::write_text(&mut c.http.wbuf, text);
        }
    }

    /// A data message of an eryx stream (`ws_pump` took the control ones).
    fn ws_message(&mut self, ck: usize, m: Message) {
        let text = match m {
            Message::Text(t) => t,
            Message::Ping(_) | Message::Pong(_) | Message::Close(_) => return,
            Message::Binary(_) => {
                if !self.ws_busy(ck) {
                    self.ws_send(
                        ck,
                        &eryx::ws_error("invalid_request", "Messages are JSON text, not binary"),
                    );
                }
                return;
            }
        };
        let busy = self.ws_busy(ck);
        let o = match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(o)) => o,
            Ok(_) | Err(_) if busy => return,
            Ok(_) => {
                self.ws_send(
                    ck,
                    &eryx::ws_error("invalid_request", "A message must be a JSON object"),
                );
                return;
            }
            Err(e) => {
                self.ws_send(
                    ck,
                    &eryx::ws_error("invalid_request", &format!("The message is not JSON: {e}")),
                );
                return;
            }
        };
        match (o.get("type").and_then(Value::as_str), busy) {
            (Some("callback_response"), true) => self.ws_callback_response(ck, &o),
            // Mid-run, anything else is ignored (the document).
            (_, true) => {}
            (Some("execute"), false) => self.ws_execute(ck, &o),
            // An answer with no run going: late, for a run that ended.
            (Some("callback_response"), false) => {}
            (t, false) => {
                let shown: String = t.unwrap_or("").chars().take(64).collect();
                let msg = if t.is_some() {
                    format!("Unknown message type {shown:?}: send execute or callback_response")
                } else {
                    "A message needs a string `type`".to_string()
                };
                self.ws_send(ck, &eryx::ws_error("invalid_request", &msg));
            }
        }
    }

    fn ws_busy(&self, ck: usize) -> bool {
        matches!(self.conns.get(ck).and_then(|c| c.owner()), Some(Owner::Ws(w)) if w.busy())
    }

    /// An `execute` on an idle connection: counted against the rate, checked, and
    /// started unless the tenant is at its concurrency limit.
    fn ws_execute(&mut self, ck: usize, o: &serde_json::Map<String, Value>) {
        let Some(c) = self.conns.get(ck) else {
            return;
        };
        let (client, serial) = (c.client, c.serial);
        let Some(Owner::Ws(w)) = c.owner() else {
            return;
        };
        let tenant = w.tenant.clone();
        // A key removed by a reload stops working on connections opened with it too.
        if !self.admission.tenant_active(&tenant) {
            self.ws_send(
                ck,
                &eryx::ws_error("invalid_key", "The key of this connection was revoked"),
            );
            self.ws_close(ck, 1008, "the key was revoked");
            return;
        }
        if self.app.shutting_down {
            self.ws_send(
                ck,
                &eryx::ws_error("unavailable", "The server is shutting down"),
            );
            self.ws_close(ck, 1001, "the server is shutting down");
            return;
        }
        if let Err(wait) = self
            .admission
            .charge_tenant(&tenant, client, Instant::now())
        {
            let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
            self.ws_send(
                ck,
                &eryx::ws_error(
                    "rate_limit_exceeded",
                    &format!("Too many requests; retry after {secs} s"),
                ),
            );
            return;
        }
        let ex = match eryx::parse_stream_execute(o, self.eryx_limits()) {
            Ok(ex) => ex,
            Err(r) => {
                self.ws_send(ck, &r.message());
                return;
            }
        };
        let (done, calls) = (self.reactor.mailbox(), self.reactor.mailbox());
        let t = tenant.clone();
        let reply: crate::wasm::Reply = Box::new(move |res| {
            done.send(Box::new(move |d: &mut Daemon| {
                d.eryx_ws_done(ck, serial, &t, res);
            }));
        });
        let sink: crate::wasm::CallSink = Box::new(move |call| {
            calls.send(Box::new(move |d: &mut Daemon| {
                d.eryx_ws_call(ck, serial, call);
            }));
        });
        let started = if ex.session_id.is_some() {
            let refused = self.eryx_session_run(
                &tenant,
                ex,
                reply,
                Some(sink),
                Box::new(move |d, started| d.eryx_ws_started(ck, serial, started)),
            );
            match refused {
                Ok(()) => {
                    // Busy until the run starts (its state is being read).
                    if let Some(Owner::Ws(w)) = self.conns.get_mut(ck).and_then(|c| c.owner_mut()) {
                        w.starting = true;
                    }
                    return;
                }
                Err(r) => Err(r),
            }
        } else {
            let mut ex = ex;
            self.eryx_env_for_run(&tenant, ex.environment_name())
                .and_then(|env| {
                    ex.env = env;
                    self.eryx_start(&tenant, ex, None, reply, Some(sink))
                })
        };
        match started {
            Ok(id) => {
                if let Some(Owner::Ws(w)) = self.conns.get_mut(ck).and_then(|c| c.owner_mut()) {
                    w.run = Some(id);
                }
            }
            Err(r) => self.ws_send(ck, &r.message()),
        }
    }

    /// A session run on a WebSocket started (its id), or did not (why, sent to the
    /// client), once its state was read.
    fn eryx_ws_started(&mut self, ck: usize, serial: u64, started: Result<u64, eryx::Rejection>) {
        let Some(c) = self.conns.get_mut(ck).filter(|c| c.serial == serial) else {
            return;
        };
        let closing = c.http.close_after_flush || c.http.lingering;
        let Some(Owner::Ws(w)) = c.owner_mut() else {
            return;
        };
        w.starting = false;
        match started {
            Ok(id) => w.run = Some(id),
            Err(r) if !closing => {
                self.ws_send(ck, &r.message());
                self.conn_flush(ck);
            }
            Err(_) => {}
        }
    }

    /// The connection's WebSocket state if it is still `serial`'s and runs `run`.
    fn ws_of(&mut self, ck: usize, serial: u64, run: u64) -> Option<&mut WsState> {
        let c = self.conns.get_mut(ck).filter(|c| c.serial == serial)?;
        if c.http.close_after_flush {
            return None;
        }
        match c.owner_mut() {
            Some(Owner::Ws(w)) if w.run == Some(run) => Some(w),
            _ => None,
        }
    }

    /// A run called one of its callbacks: the client is asked, or, gone, the call
    /// fails at once.
    fn eryx_ws_call(&mut self, ck: usize, serial: u64, call: Call) {
        let backlog = self.conns.get(ck).map_or(0, |c| c.http.pending_write());
        let refused = if !call.args.is_object() {
            // Only reachable by going around the callback functions.
            Some("A callback takes keyword arguments only")
        } else if backlog > CALL_BACKLOG_BYTES {
            Some("The client is not reading its messages")
        } else {
            None
        };
        let call_id = match self.ws_of(ck, serial, call.run) {
            // The worker bounds a run's calls; this bounds what one connection holds
            // should it not.
            Some(w)
                if refused.is_none() && w.calls.len() < 2 * crate::wasm::MAX_CALLBACKS as usize =>
            {
                let id = call_id();
                w.calls.insert(id.clone(), call.call);
                Some(id)
            }
            _ => None,
        };
        let Some(call_id) = call_id else {
            if let Some(e) = &self.wasm {
                let why = refused.unwrap_or(CLIENT_GONE);
                e.answer(call.run, call.call, Err(why.into()));
            }
            return;
        };
        let msg = json!({
            "type": "callback",
            "call_id": call_id,
            "name": call.name,
            "args": call.args,
        });
        self.ws_send(ck, &msg.to_string());
        self.conn_flush(ck);
    }

    /// The client's answer to a call.
    fn ws_callback_response(&mut self, ck: usize, v: &serde_json::Map<String, Value>) {
        let Some(Owner::Ws(w)) = self.conns.get_mut(ck).and_then(|c| c.owner_mut()) else {
            return;
        };
        let (Some(run), Some(call)) = (
            w.run,
            v.get("call_id")
                .and_then(Value::as_str)
                .and_then(|id| w.calls.remove(id)),
        ) else {
            // An unknown or already answered call_id: nothing waits for it.
            return;
        };
        let result = match v.get("error") {
            None | Some(Value::Null) => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
            Some(Value::String(e)) => Err(e.clone()),
            Some(other) => Err(other.to_string()),
        };
        if let Some(e) = &self.wasm {
            e.answer(run, call, result);
        }
    }

    /// A WebSocket run ended: its tenant's count goes down, and its client, if still
    /// there, gets `completed` (or `error`, when the engine failed it).
    fn eryx_ws_done(
        &mut self,
        ck: usize,
        serial: u64,
        tenant: &str,
        res: Result<RunAnswer, Failure>,
    ) {
        self.eryx_uncount(tenant);
        let shutting_down = self.app.shutting_down;
        let Some(c) = self.conns.get_mut(ck).filter(|c| c.serial == serial) else {
            return;
        };
        // After our close frame nothing more may be sent (RFC 6455 §5.5.1).
        let closing = c.http.close_after_flush || c.http.lingering;
        let Some(Owner::Ws(w)) = c.owner_mut() else {
            return;
        };
        w.run = None;
        w.calls.clear();
        if closing {
            return;
        }
        let msg = match res {
            Ok(a) => eryx::ws_completed(&a),
            Err(f) => eryx::Rejection::of_failure(&f).message(),
        };
        self.ws_send(ck, &msg);
        if shutting_down {
            self.ws_close(ck, 1001, "the server is shutting down");
            self.conn_after_io(ck);
            return;
        }
        self.arm_idle(ck);
        // Messages that came mid-run were read and ignored; what is buffered now is
        // the next run's.
        self.conn_pump(ck);
    }

    /// A WebSocket connection closed: the calls it was asked fail at once in Python;
    /// its run goes on (the document) and ends as runs do.
    pub(crate) fn ws_closed(&mut self, w: WsState) {
        let (Some(run), Some(e)) = (w.run, &self.wasm) else {
            return;
        };
        log::info!("eryx stream: client left during run {run}");
        for call in w.calls.into_values() {
            e.answer(run, call, Err(CLIENT_GONE.into()));
        }
    }

    pub(crate) fn eryx_uncount(&mut self, tenant: &str) {
        if let Some(n) = self.eryx_running.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.eryx_running.remove(tenant);
            }
        }
    }

    fn eryx_execute(&mut self, ck: usize, req: Request) {
        if let Some(resp) = self.eryx_off() {
            self.respond(ck, resp);
            return;
        }
        let mut ex = match eryx::parse_execute(&req, self.eryx_limits()) {
            Ok(ex) => ex,
            Err(resp) => {
                self.respond(ck, resp);
                return;
            }
        };
        match self.eryx_env_for_run(&req.tenant, ex.environment_name()) {
            Ok(env) => ex.env = env,
            Err(r) => {
                self.respond(ck, r.response());
                return;
            }
        }
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        let mailbox = self.reactor.mailbox();
        let tenant = req.tenant.clone();
        let started = self.eryx_start(
            &req.tenant,
            ex,
            None,
            Box::new(move |res| {
                mailbox.send(Box::new(move |d: &mut Daemon| {
                    d.eryx_answer(ck, serial, &tenant, res);
                }));
            }),
            None,
        );
        match started {
            Ok(_) => self.conn_own(ck, Owner::Job),
            Err(r) => self.respond(ck, r.response()),
        }
    }

    /// The server's limits on one run.
    pub(crate) fn eryx_limits(&self) -> eryx::Limits {
        eryx::Limits {
            timeout_ms: self.cfg.eryx.timeout_ms,
            fuel: self.cfg.eryx.fuel_limit,
        }
    }

    /// Whether `tenant` may start one more run (the document: past its concurrency
    /// limit, refused at once, never queued).
    ///
    /// # Errors
    /// 429 `concurrency_limit`.
    pub(crate) fn eryx_room(&self, tenant: &str) -> Result<(), eryx::Rejection> {
        let limit = self.cfg.eryx.concurrency;
        if self.eryx_running.get(tenant).copied().unwrap_or(0) >= limit {
            return Err(eryx::Rejection::new(
                429,
                "concurrency_limit",
                format!("Too many concurrent executions (limit: {limit})"),
            ));
        }
        Ok(())
    }

    /// Starts a checked run for `tenant` unless it is at its concurrency limit; the
    /// run counts until `reply` is called. `session`: a session's run, with the state
    /// its last kept run left. Its id, for answering its calls.
    pub(crate) fn eryx_start(
        &mut self,
        tenant: &str,
        ex: eryx::Execute,
        session: Option<Option<Vec<u8>>>,
        reply: crate::wasm::Reply,
        calls: Option<crate::wasm::CallSink>,
    ) -> Result<u64, eryx::Rejection> {
        if self.wasm.is_none() {
            return Err(eryx::Rejection::new(503, "unavailable", ENGINE_OFF));
        }
        self.eryx_room(tenant)?;
        *self.eryx_running.entry(tenant.to_string()).or_default() += 1;
        self.eryx_launch(tenant, ex, session, reply, calls)
    }

    /// Starts a run already counted against `tenant`'s concurrency (its count goes
    /// down when `reply` is called; here, at once, when the engine is off). Its id.
    pub(crate) fn eryx_launch(
        &mut self,
        tenant: &str,
        ex: eryx::Execute,
        session: Option<Option<Vec<u8>>>,
        reply: crate::wasm::Reply,
        calls: Option<crate::wasm::CallSink>,
    ) -> Result<u64, eryx::Rejection> {
        let Some(engine) = &self.wasm else {
            self.eryx_uncount(tenant);
            return Err(eryx::Rejection::new(503, "unavailable", ENGINE_OFF));
        };
        let req = RunRequest {
            code: ex.code,
            timeout_ms: ex.timeout_ms,
            fuel: ex.fuel,
            memory_bytes: self.cfg.eryx.memory_bytes,
            callbacks: ex.callbacks,
            callback_timeout_ms: self.cfg.eryx.callback_timeout_ms,
            session,
            env: ex.env,
        };
        Ok(engine.run(req, reply, calls))
    }

    /// A run's end: its tenant's count goes down, and its client, if still there, gets
    /// the answer.
    pub(crate) fn eryx_answer(
        &mut self,
        ck: usize,
        serial: u64,
        tenant: &str,
        res: Result<RunAnswer, Failure>,
    ) {
        self.eryx_uncount(tenant);
        if !self.conn_waiting(ck, serial, false) {
            return;
        }
        let resp = match res {
            Ok(a) => Response::json(200, &eryx::run_json(&a)),
            Err(f) => eryx::Rejection::of_failure(&f).response(),
        };
        self.respond(ck, resp);
        self.conn_pump(ck);
    }
}

/// A call's id for the client: 128 random bits in hex (the client names the call
/// by it; nothing else about the run can be read from it).
fn call_id() -> String {
    static FALLBACK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut b = [0u8; 16];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).is_err() {
        // Never seen; still unique on this daemon.
        let n = FALLBACK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return format!("{n:032x}");
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

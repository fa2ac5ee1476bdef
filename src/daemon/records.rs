//! Run records: what a streamed or detached run said, kept so that a client whose
//! connection dropped reconnects and gets what it missed, then the live rest, and so
//! that a detached run is read after it ended (`/v1/runs/{id}`, `api::runs`).
//!
//! A record is the run's events in order — each `stdout`/`stderr` chunk and the final
//! `done` (or `error`) — numbered from 1; the number is the SSE `id:`. Its run writes it
//! through a [`RecordSink`], which also streams to the client that started the run
//! (when it streams and has not left). Readers of the record are connections that
//! follow it (`Owner::RunEvents`, a cursor into the events, written as the socket
//! drains) or wait for its end (`Owner::RunWait`, with a deadline timer here).
//!
//! Bounds: a run's events are bounded by its output caps (two streams of at most
//! `outputBytes` each, and the result holding them once more), and live runs by the
//! execution slots. Ended runs' records are kept `run_retain_s` seconds, and while
//! all records hold more than `run_retain_bytes`, the oldest ended ones go first; a
//! live run's record, and the newest ended one, are never dropped for bytes. Reactor
//! thread only.

use super::conn::Owner;
use super::sink::{Ended, Sink, Stream};
use super::Daemon;
use crate::api::execute::ExecuteResponse;
use crate::api::runs::{not_found, RunOp, RunVerb};
use crate::http::sse::write_event_id;
use crate::http::Response;
use crate::reactor::{Addr, Component, ComponentId, Readiness};
use slab::Slab;
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// The records component (timers only; key: a waiting connection).
pub(crate) const RECORDS: ComponentId = ComponentId(10);
/// Timers: a waiting client's deadline (generation: the connection's serial).
const WAIT: u16 = 0;

/// What a record counts for itself besides its events' text (its id, tenant, the
/// event headers), so that many tiny records are bounded too.
const RECORD_OVERHEAD: usize = 512;
/// What each event counts besides its data.
/// What each event counts besides its text: its slot, its string's allocation, the
/// list's growth (a program flushing a byte at a time makes many small ones).
const EVENT_OVERHEAD: usize = 96;
/// Most connections following or waiting on one record at once.
pub(crate) const MAX_READERS: usize = 16;

/// The records component.
pub(crate) struct Records;

impl Component<Daemon> for Records {
    fn name(&self) -> &'static str {
        "records"
    }

    fn ready(&self, _: &mut Daemon, _: usize, _: u16, _: Readiness) {}

    fn timer(&self, d: &mut Daemon, ck: usize, what: u16, gen: u64) {
        if what == WAIT {
            d.record_wait_over(ck, gen);
        }
    }
}

/// Where a recorded run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Starting or running.
    Running,
    /// Ended with a result.
    Done,
    /// Ended with a result after it was cancelled (its client left, `…/cancel`, or the
    /// daemon stopped).
    Cancelled,
    /// Ended without a result (the sandbox did not start, the daemon was stopping).
    Failed,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Done => "done",
            Status::Cancelled => "cancelled",
            Status::Failed => "failed",
        }
    }
}

/// One event; its id is its index + 1. Kept as the run gave it (text, the result
/// object), never as escaped JSON: a chunk of control characters would take six times
/// its size. Its frame is made when it is written.
enum Event {
    /// A `stdout` or `stderr` chunk.
    Output(Stream, String),
    /// The `done` event: the result.
    Done(Box<ExecuteResponse>),
    /// The `error` event: `<code>: <detail>`.
    Error(String),
}

impl Event {
    /// What it counts against the budget: its text, plus [`EVENT_OVERHEAD`].
    fn bytes(&self) -> usize {
        EVENT_OVERHEAD
            + match self {
                Event::Output(_, text) | Event::Error(text) => text.len(),
                Event::Done(b) => {
                    let run = b.run.stdout.len() + b.run.stderr.len();
                    let compile = b
                        .compile
                        .as_ref()
                        .map_or(0, |c| c.stdout.len() + c.stderr.len());
                    let artifacts: usize = b
                        .artifacts
                        .iter()
                        .map(|a| match a {
                            crate::sandbox::plan::Artifact::Png { data_b64 } => data_b64.len(),
                            crate::sandbox::plan::Artifact::Html { data } => data.len(),
                        })
                        .sum();
                    run + compile + artifacts + 512
                }
            }
    }

    /// Its SSE frame with id `seq` (`Done`: see [`Daemon::record_finish_reader`]).
    fn frame(&self, seq: usize) -> Vec<u8> {
        let (kind, data) = match self {
            Event::Output(stream, text) => (
                stream.name(),
                serde_json::json!({ "chunk": text }).to_string(),
            ),
            Event::Error(msg) => ("error", serde_json::json!({ "error": msg }).to_string()),
            Event::Done(b) => ("done", serde_json::to_string(b).unwrap_or_default()),
        };
        let mut f = Vec::with_capacity(data.len() + 40);
        write_event_id(&mut f, Some(seq as u64), kind, &data);
        f
    }
}

/// One run's record.
pub(crate) struct Record {
    id: String,
    tenant: String,
    serial: u64,
    language: String,
    detached: bool,
    /// When the run was admitted (Unix ms).
    created_ms: u64,
    status: Status,
    ended: Option<Instant>,
    events: Vec<Event>,
    /// What it counts against `run_retain_bytes`.
    bytes: usize,
    /// The run (key, serial) while it lives: what `…/cancel` stops.
    run: Option<(usize, u64)>,
    /// Connections (key, serial) following or waiting on it.
    readers: Vec<(usize, u64)>,
}

/// Every record.
#[derive(Default)]
pub(crate) struct Table {
    records: Slab<Record>,
    by_id: HashMap<String, usize>,
    /// Ended records (key, serial), oldest end first.
    ended: VecDeque<(usize, u64)>,
    bytes: usize,
    serial: u64,
}

impl Table {
    fn get(&self, key: usize, serial: u64) -> Option<&Record> {
        self.records.get(key).filter(|r| r.serial == serial)
    }

    fn get_mut(&mut self, key: usize, serial: u64) -> Option<&mut Record> {
        self.records.get_mut(key).filter(|r| r.serial == serial)
    }

    /// Records kept now, and the bytes they count (for `/metrics`).
    fn figures(&self) -> (usize, usize) {
        (self.records.len(), self.bytes)
    }
}

/// A run's sink when it is recorded: every event goes into its record (and to the
/// record's followers), and live to the client that started it while it is there.
pub(crate) struct RecordSink {
    rec: usize,
    serial: u64,
    /// The streaming client (connection key, serial); `None` when detached or gone.
    client: Cell<Option<(usize, u64)>>,
}

impl RecordSink {
    /// The client, if it is still the connection that asked.
    fn client(&self, d: &Daemon) -> Option<usize> {
        let (ck, cs) = self.client.get()?;
        d.conns
            .get(ck)
            .is_some_and(|c| c.serial == cs)
            .then_some(ck)
    }
}

impl Sink for RecordSink {
    fn attach(&self, d: &mut Daemon, rk: usize) {
        let run_serial = d.runs.get(rk).map(|r| r.serial);
        let mut id = None;
        if let Some(r) = d.records.get_mut(self.rec, self.serial) {
            r.run = run_serial.map(|s| (rk, s));
            id = Some(r.id.clone());
        }
        if let (Some(ck), Some(id)) = (self.client(d), id) {
            d.conn_own(
                ck,
                Owner::Run {
                    run: rk,
                    stream: true,
                },
            );
            d.conn_start_sse_with(ck, &[("X-Run-Id", id)]);
        }
    }

    fn live(&self) -> bool {
        true
    }

    fn output(&self, d: &mut Daemon, stream: Stream, text: &str) -> bool {
        let seq = d.record_push(self.rec, self.serial, Event::Output(stream, text.into()));
        match (self.client(d), seq) {
            (Some(ck), Some(seq)) => {
                let mut f = Vec::with_capacity(text.len() + 48);
                let data = serde_json::json!({ "chunk": text }).to_string();
                write_event_id(&mut f, Some(seq as u64), stream.name(), &data);
                d.conn_send_sse(ck, &f)
            }
            _ => false,
        }
    }

    fn keepalive(&self, d: &mut Daemon) {
        if let Some(ck) = self.client(d) {
            d.conn_send_comment(ck, "keep-alive");
        }
        d.record_keepalive(self.rec, self.serial);
    }

    fn result(&self, d: &mut Daemon, body: ExecuteResponse, ended: Ended) {
        let status = if ended.cancelled {
            Status::Cancelled
        } else {
            Status::Done
        };
        // The client's copy is escaped as its socket drains (`http/lazy.rs`).
        let lazy = self.client(d).map(|_| body.clone().into_lazy());
        let seq = d.record_end(self.rec, self.serial, Event::Done(Box::new(body)), status);
        if let (Some(ck), Some(lazy)) = (self.client(d), lazy) {
            d.finish_stream_lazy(ck, lazy, seq.map(|s| s as u64));
            d.conn_resume(ck);
        }
    }

    fn refused(&self, d: &mut Daemon, resp: Response) {
        let (code, msg) = super::sink::refusal_message(&resp);
        // Cancelled before it started: no result, but cancelled, not failed.
        let status = if code == "cancelled" {
            Status::Cancelled
        } else {
            Status::Failed
        };
        let seq = d.record_end(self.rec, self.serial, Event::Error(msg.clone()), status);
        let frame = seq.map(|seq| Event::Error(msg).frame(seq));
        let Some(ck) = self.client(d) else { return };
        let streaming = d
            .conns
            .get(ck)
            .is_some_and(|c| matches!(c.owner(), Some(Owner::Run { stream: true, .. })));
        match frame {
            // The head already said 200: the refusal is the stream's `error` event.
            Some(frame) if streaming => d.finish_stream(ck, &frame),
            _ => d.respond(ck, resp),
        }
        d.conn_resume(ck);
    }

    fn client_left(&self) -> bool {
        self.client.set(None);
        true
    }
}

impl Daemon {
    /// A new record for a run of `language` started by `tenant`, and its sink; the
    /// streaming client `client` (connection key and serial), if any. `None` when the
    /// system's random source failed (the id must be unguessable).
    pub(crate) fn record_open(
        &mut self,
        tenant: &str,
        language: &str,
        detached: bool,
        client: Option<(usize, u64)>,
    ) -> Option<(String, RecordSink)> {
        let id = format!("run_{}", super::boxes::random_hex()?);
        let t = &mut self.records;
        t.serial += 1;
        let serial = t.serial;
        let bytes = RECORD_OVERHEAD + tenant.len() + language.len();
        let key = t.records.insert(Record {
            id: id.clone(),
            tenant: tenant.to_string(),
            serial,
            language: language.to_string(),
            detached,
            created_ms: super::boxes::now_ms(),
            status: Status::Running,
            ended: None,
            events: Vec::new(),
            bytes,
            run: None,
            readers: Vec::new(),
        });
        t.bytes += bytes;
        t.by_id.insert(id.clone(), key);
        self.app.metrics.records = self.records.figures();
        let sink = RecordSink {
            rec: key,
            serial,
            client: Cell::new(client),
        };
        Some((id, sink))
    }

    /// Forgets a record whose run never started (it was refused before it existed).
    pub(crate) fn record_discard(&mut self, rec: &RecordSink) {
        self.record_remove(rec.rec, rec.serial);
    }

    /// Appends an event and moves the readers along; its id, or `None` when the record
    /// is gone or has ended.
    fn record_push(&mut self, rec: usize, serial: u64, ev: Event) -> Option<usize> {
        let seq = self.record_append(rec, serial, ev)?;
        self.record_pump_all(rec, serial);
        Some(seq)
    }

    /// Appends an event (the readers are not moved).
    fn record_append(&mut self, rec: usize, serial: u64, ev: Event) -> Option<usize> {
        let t = &mut self.records;
        let r = t
            .get_mut(rec, serial)
            .filter(|r| r.status == Status::Running)?;
        let n = ev.bytes();
        r.bytes += n;
        r.events.push(ev);
        let seq = r.events.len();
        t.bytes += n;
        self.app.metrics.records = self.records.figures();
        Some(seq)
    }

    /// Appends the last event and ends the record: followers get the rest and their
    /// stream ends, waiters get their answer. The last event's id, as `record_push`.
    fn record_end(&mut self, rec: usize, serial: u64, ev: Event, status: Status) -> Option<usize> {
        // Appended only: the readers move once it has ended, so that they write the
        // last event as the stream's end (a result escaped as the socket drains).
        let f = self.record_append(rec, serial, ev);
        let t = &mut self.records;
        let r = t.get_mut(rec, serial)?;
        r.status = status;
        r.ended = Some(Instant::now());
        r.run = None;
        t.ended.push_back((rec, serial));
        // Every reader: followers write the last event and end; waiters are answered.
        self.record_pump_all(rec, serial);
        self.records_trim();
        f
    }

    /// A keep-alive comment to followers that have everything so far.
    fn record_keepalive(&mut self, rec: usize, serial: u64) {
        let Some(r) = self.records.get(rec, serial) else {
            return;
        };
        let n = r.events.len();
        let readers = r.readers.clone();
        for (ck, cs) in readers {
            let caught_up = self.conns.get(ck).is_some_and(|c| {
                c.serial == cs
                    && matches!(c.owner(), Some(Owner::RunEvents { next, .. }) if *next >= n)
            });
            if caught_up {
                self.conn_send_comment(ck, "keep-alive");
            }
        }
    }

    /// Moves every reader of a record along (after an event, or at its end).
    fn record_pump_all(&mut self, rec: usize, serial: u64) {
        let Some(r) = self.records.get(rec, serial) else {
            return;
        };
        for (ck, _) in r.readers.clone() {
            self.record_pump(ck);
        }
    }

    /// Writes what a follower has not had yet, as far as its socket takes it; ends its
    /// stream with the last event of an ended record. Answers a waiter whose record
    /// ended.
    pub(crate) fn record_pump(&mut self, ck: usize) {
        loop {
            let Some(c) = self.conns.get(ck) else { return };
            let (rec, serial, next) = match c.owner() {
                Some(&Owner::RunEvents { rec, serial, next }) => (rec, serial, next),
                Some(&Owner::RunWait { rec, serial, .. }) => {
                    let ended = self
                        .records
                        .get(rec, serial)
                        .is_none_or(|r| r.status != Status::Running);
                    if ended {
                        self.record_answer_waiter(ck, rec, serial);
                    }
                    return;
                }
                _ => return,
            };
            let Some(r) = self.records.get(rec, serial) else {
                return;
            };
            let ended = r.status != Status::Running;
            let total = r.events.len();
            let Some(c) = self.conns.get_mut(ck) else {
                return;
            };
            let mut at = next;
            while at < total && !(ended && at.saturating_add(1) == total) && !c.http.write_full() {
                c.http.send_chunk(&r.events[at].frame(at + 1));
                at += 1;
            }
            if ended && at.saturating_add(1) >= total {
                // The last event (none when the reader had them all) ends the stream:
                // a result is escaped as the socket drains, like the client's own.
                let last = match r.events.get(at).filter(|_| at < total) {
                    Some(Event::Done(b)) => Err((b.as_ref().clone().into_lazy(), at + 1)),
                    Some(ev) => Ok(ev.frame(at + 1)),
                    None => Ok(Vec::new()),
                };
                self.record_unread(ck, rec, serial);
                match last {
                    Ok(frame) => self.finish_stream(ck, &frame),
                    Err((lazy, seq)) => self.finish_stream_lazy(ck, lazy, Some(seq as u64)),
                }
                self.conn_resume(ck);
                return;
            }
            if let Some(Owner::RunEvents { next, .. }) = c.owner_mut() {
                *next = at;
            }
            if !self.conn_write(ck) {
                return;
            }
            // Go on while events are left and the socket took what was queued; else
            // the drain (`conn_flush`) or the next event calls again.
            let drained = self.conns.get(ck).is_some_and(|c| {
                c.http.pending_write() < crate::http::limits::MAX_WRITE_BUFFER_BYTES / 2
            });
            if at >= total || !drained {
                return;
            }
        }
    }

    /// Drops `ck` from a record's readers.
    fn record_unread(&mut self, ck: usize, rec: usize, serial: u64) {
        let cs = self.conns.get(ck).map(|c| c.serial);
        if let Some(r) = self.records.get_mut(rec, serial) {
            r.readers.retain(|&(k, s)| !(k == ck && Some(s) == cs));
        }
    }

    /// A following or waiting connection closed.
    pub(crate) fn record_reader_closed(&mut self, ck: usize, cs: u64, rec: usize, serial: u64) {
        if let Some(r) = self.records.get_mut(rec, serial) {
            r.readers.retain(|&(k, s)| !(k == ck && s == cs));
        }
    }

    /// Answers a waiter with the record as it is now.
    fn record_answer_waiter(&mut self, ck: usize, rec: usize, serial: u64) {
        self.record_unread(ck, rec, serial);
        let answer = match self.records.get(rec, serial) {
            Some(r) => record_response(r, 200),
            None => RecordAnswer::Small(not_found()),
        };
        self.record_respond(ck, answer);
        self.conn_resume(ck);
    }

    /// A waiter's time is up: it gets the record as it is (a timer of an earlier wait
    /// on the same connection finds another generation, and does nothing).
    fn record_wait_over(&mut self, ck: usize, gen: u64) {
        let Some(c) = self.conns.get(ck) else {
            return;
        };
        if let Some(&Owner::RunWait {
            rec,
            serial,
            gen: g,
        }) = c.owner()
        {
            if g == gen {
                self.record_answer_waiter(ck, rec, serial);
            }
        }
    }

    /// Carries out a request on a recorded run.
    pub(crate) fn record_op(&mut self, ck: usize, op: RunOp) {
        // A record past its time is gone now, not at the next housekeeping tick.
        self.records_trim();
        let found = self
            .records
            .by_id
            .get(&op.id)
            .copied()
            .and_then(|k| self.records.records.get(k).map(|r| (k, r)))
            .filter(|(_, r)| r.tenant == op.tenant)
            .map(|(k, r)| (k, r.serial));
        let Some((rec, serial)) = found else {
            self.respond(ck, not_found());
            return;
        };
        let Some(r) = self.records.get(rec, serial) else {
            return;
        };
        let Some(cs) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        match op.verb {
            RunVerb::Get { wait_ms } => {
                if wait_ms == 0 || r.status != Status::Running {
                    let answer = record_response(r, 200);
                    self.record_respond(ck, answer);
                    return;
                }
                if r.readers.len() >= MAX_READERS {
                    self.respond(ck, too_many_readers());
                    return;
                }
                if let Some(r) = self.records.get_mut(rec, serial) {
                    r.readers.push((ck, cs));
                }
                let at = Instant::now() + Duration::from_millis(wait_ms);
                let gen = self.reactor.arm_new(at, Addr::new(RECORDS, ck, WAIT));
                self.conn_own(ck, Owner::RunWait { rec, serial, gen });
            }
            RunVerb::Events { after } => {
                // An `after` past the events so far: the events with a greater id.
                if r.readers.len() >= MAX_READERS {
                    self.respond(ck, too_many_readers());
                    return;
                }
                let id = r.id.clone();
                if self.conns.get(ck).is_some_and(|c| c.http.head_only) {
                    // `HEAD`: the head is the whole answer, whether the run lives or not.
                    self.conn_start_sse_with(ck, &[("X-Run-Id", id)]);
                    self.finish_stream(ck, b"");
                    return;
                }
                if let Some(r) = self.records.get_mut(rec, serial) {
                    r.readers.push((ck, cs));
                }
                self.conn_own(
                    ck,
                    Owner::RunEvents {
                        rec,
                        serial,
                        next: usize::try_from(after).unwrap_or(usize::MAX),
                    },
                );
                self.conn_start_sse_with(ck, &[("X-Run-Id", id)]);
                self.record_pump(ck);
            }
            RunVerb::Cancel => {
                let run = r.run;
                let step = run.is_some_and(|(rk, rs)| {
                    self.runs
                        .get(rk)
                        .is_some_and(|x| x.serial == rs && x.kernel.is_some())
                });
                if step {
                    // The kernel runs one step at a time in one interpreter: there is no
                    // stopping a step but ending the kernel.
                    self.respond(
                        ck,
                        Response::error(
                            409,
                            "not_cancellable",
                            Some("a kernel session's step cannot be cancelled: it ends by itself or at its wall time (which ends the kernel); DELETE the session to end it now"),
                        ),
                    );
                    return;
                }
                let status = if r.status == Status::Running {
                    202
                } else {
                    200
                };
                let answer = record_response(r, status);
                if let Some((rk, rs)) = run {
                    if self.runs.get(rk).is_some_and(|x| x.serial == rs) {
                        self.run_stop(rk);
                    }
                }
                self.record_respond(ck, answer);
            }
        }
    }

    /// Sends a record's answer.
    fn record_respond(&mut self, ck: usize, answer: RecordAnswer) {
        match answer {
            RecordAnswer::Small(resp) => self.respond(ck, resp),
            RecordAnswer::Lazy(body) => self.respond_lazy(ck, body),
        }
    }

    /// Drops expired records and, while over the byte budget, the oldest ended ones
    /// (housekeeping, and after each end).
    pub(crate) fn records_trim(&mut self) {
        let keep = Duration::from_secs(self.cfg.run_retain_s);
        let budget = self.cfg.run_retain_bytes;
        while let Some(&(rec, serial)) = self.records.ended.front() {
            let Some(r) = self.records.get(rec, serial) else {
                self.records.ended.pop_front();
                continue;
            };
            let expired = r.ended.is_some_and(|e| e.elapsed() >= keep);
            // Over the budget, the newest ended record stays whatever its size (one run's
            // record is bounded by its output caps): a detached run's result is always
            // readable until another run ends or its time is up.
            let over = self.records.bytes > budget && self.records.ended.len() > 1;
            if !expired && !over {
                break;
            }
            self.records.ended.pop_front();
            self.record_remove(rec, serial);
        }
    }

    /// Removes a record; a follower still reading it gets an `error` event.
    fn record_remove(&mut self, rec: usize, serial: u64) {
        if self.records.get(rec, serial).is_none() {
            return;
        }
        let r = self.records.records.remove(rec);
        self.records.by_id.remove(&r.id);
        self.records.bytes = self.records.bytes.saturating_sub(r.bytes);
        self.app.metrics.records = self.records.figures();
        for (ck, cs) in r.readers {
            let Some(c) = self.conns.get(ck).filter(|c| c.serial == cs) else {
                continue;
            };
            match c.owner() {
                Some(Owner::RunEvents { .. }) => {
                    let mut f = Vec::new();
                    let data = serde_json::json!({
                        "error": "run_expired: the run's record was dropped (retention) before this reader had every event"
                    });
                    crate::http::sse::write_event(&mut f, "error", &data.to_string());
                    self.finish_stream(ck, &f);
                    self.conn_resume(ck);
                }
                Some(Owner::RunWait { .. }) => {
                    self.respond(ck, not_found());
                    self.conn_resume(ck);
                }
                _ => {}
            }
        }
    }
}

fn too_many_readers() -> Response {
    Response::error(
        429,
        "too_many_readers",
        Some(&format!(
            "at most {MAX_READERS} connections may follow or wait on one run"
        )),
    )
    .with_header("Retry-After", "1")
}

/// `GET /v1/runs/{id}`'s body: the record's state, and its result (the `done` event's
/// object) or its error once it ended.
/// What `GET /v1/runs/{id}` answers: the record's state, and its result or error.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RecordView<'a> {
    id: &'a str,
    status: &'static str,
    language: &'a str,
    detached: bool,
    created_at: String,
    events: usize,
    events_url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<ExecuteResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

/// A record's answer: small, or (with a result) a body escaped as the socket drains,
/// like `/execute`'s (catalogue H12: a result of control bytes is six times larger
/// escaped).
enum RecordAnswer {
    Small(Response),
    Lazy(crate::http::lazy::LazyBody),
}

fn record_response(r: &Record, status: u16) -> RecordAnswer {
    let ended = r.events.last().filter(|_| r.status != Status::Running);
    let mut view = RecordView {
        id: &r.id,
        status: r.status.name(),
        language: &r.language,
        detached: r.detached,
        created_at: crate::api::sessions::rfc3339(r.created_ms),
        events: r.events.len(),
        events_url: format!("/v1/runs/{}/events", r.id),
        result: None,
        error: None,
    };
    match ended {
        Some(Event::Done(b)) if status == 200 => {
            let mut d = crate::http::lazy::Deferred::new();
            let mut result = b.as_ref().clone();
            result.defer(&mut d);
            view.result = Some(result);
            RecordAnswer::Lazy(d.body(&view))
        }
        Some(Event::Error(msg)) => {
            view.error = Some(msg);
            RecordAnswer::Small(Response::json(status, &view))
        }
        _ => RecordAnswer::Small(Response::json(status, &view)),
    }
}

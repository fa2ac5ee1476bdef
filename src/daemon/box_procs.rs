//! Background processes and terminals in long-lived sandboxes: started with a
//! `spawn` call marked background, whose output the sandbox's init keeps in a ring (the
//! last 1 MiB per stream, in the sandbox's own memory) and forwards only while some
//! client streams it. A client attaching gets the ring first (`Replay` frames of its
//! `Watch` call), then live output, then the exit; several may stream one process. A
//! stream whose client falls behind holds the process's output (it blocks on its
//! pipes, as a command's does) until the client catches up.
//!
//! The daemon keeps each process's facts (tag, command, terminal, start, exit) for the
//! list and detail endpoints; ended ones are kept ([`MAX_ENDED`]) with their rings
//! until the oldest is forgotten (`Forget`), or until a `DELETE`.

use super::boxes::{State, BOXES};
use super::conn::Owner;
use super::Daemon;
use crate::http::sse::take_utf8;
use crate::http::Response;
use crate::reactor::Addr;
use crate::sandbox::wire::{self, Call, Exited, Kind, Reply, Stream};
use crate::wbx::processes::{
    self as wp, Input, ProcOp, Start, MAX_ENDED, MAX_RUNNING, MAX_STREAMS,
};
use crate::wbx::sandboxes::event_line;
use crate::wbx::terminal;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// Timers: the wait for the init's answer to a process's spawn or watch (the
/// generation names the call).
pub(super) const PROC_CALL_DEADLINE: u16 = 3;
/// Timers: the wait for a `DELETE`d process to end (the generation names it).
pub(super) const PROC_KILL_DEADLINE: u16 = 4;
/// How long init may take to answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A streaming client this far behind holds the process's output.
const HOLD_BYTES: usize = 1 << 20;

/// A client streaming a process.
struct Sub {
    id: u64,
    /// Its connection (key, serial).
    client: (usize, u64),
    /// Incomplete UTF-8 characters held back, per stream.
    utf8: [Vec<u8>; 2],
    /// Per stream, the offset it asked to start at: bytes before it are not sent.
    from: [u64; 2],
    /// Its connection holds more than [`HOLD_BYTES`] not yet sent.
    behind: bool,
    /// A WebSocket (`…/ws`, binary output messages) rather than an NDJSON stream.
    ws: bool,
}

/// One background process.
pub(crate) struct Proc {
    tag: Option<String>,
    cmd: String,
    pty: Option<(u16, u16)>,
    /// Started with stdin and its end not sent.
    stdin: bool,
    started_ms: u64,
    started: Instant,
    /// How it ended, when (Unix ms), its duration, and its place among the ended.
    ended: Option<(Exited, u64, u64, u64)>,
    subs: Vec<Sub>,
    /// `Watch` calls on their way for it.
    watching: usize,
    /// init forwards its output.
    watched: bool,
    /// init holds its output (a client is behind).
    held: bool,
    /// `DELETE`d: gone for clients; forgotten once it ends.
    killed: bool,
    /// The `DELETE` waiting for it to end (its client) and its timer's generation.
    deleter: Option<((usize, u64), u64)>,
}

impl Proc {
    fn view(&self, pid: u32) -> wp::View<'_> {
        wp::View {
            pid,
            tag: self.tag.as_deref(),
            cmd: &self.cmd,
            pty: self.pty,
            stdin: self.stdin && self.ended.is_none(),
            started_ms: self.started_ms,
            ended: self.ended.map(|(e, at, _, _)| (e.code, e.signal, at)),
        }
    }
}

/// A call to init about a process that someone waits on.
enum Pending {
    /// A start: its client and what it asked.
    Start {
        client: (usize, u64),
        start: Box<Start>,
        gen: u64,
        /// When init was asked: the process's `duration_ms` counts from here, so it is
        /// never shorter than the process ran.
        asked: Instant,
    },
    /// A client attaching to `pid`: it gets the replay, then joins.
    Watch { pid: u32, sub: Sub, gen: u64 },
}

impl Pending {
    fn gen(&self) -> u64 {
        match self {
            Pending::Start { gen, .. } | Pending::Watch { gen, .. } => *gen,
        }
    }
}

/// A sandbox's background processes.
#[derive(Default)]
pub(crate) struct Procs {
    list: BTreeMap<u32, Proc>,
    /// Calls waited on, by call id.
    pending: HashMap<u32, Pending>,
    next_sub: u64,
    ended_seq: u64,
}

impl Procs {
    /// Whether `pid` names a running background process.
    pub(super) fn running(&self, pid: u32) -> bool {
        self.list.get(&pid).is_some_and(|p| p.ended.is_none())
    }

    /// Whether `pid` is a background process (frames about it are its).
    pub(super) fn has(&self, pid: u32) -> bool {
        self.list.contains_key(&pid)
    }

    fn visible(&self, pid: u32) -> Option<&Proc> {
        self.list.get(&pid).filter(|p| !p.killed)
    }
}

fn exit_event(e: &Exited, duration_ms: u64) -> serde_json::Value {
    serde_json::json!({
        "type": "exit",
        "exit_code": e.code,
        "signal": e.signal.map(wp::signal_name),
        "duration_ms": duration_ms,
    })
}

/// The NDJSON line of output `data` at `offset` in stream `idx` for `sub`: bytes before
/// its `from` are skipped, an incomplete character is held back; `None` when there is
/// nothing to say. The line's `offset` is the stream's offset after its bytes: where a
/// client that reconnects asks to start.
fn sub_line(sub: &mut Sub, idx: usize, offset: u64, data: &[u8]) -> Option<Vec<u8>> {
    let skip = usize::try_from(sub.from[idx].saturating_sub(offset))
        .unwrap_or(usize::MAX)
        .min(data.len());
    if sub.ws {
        // Bytes as they came: a terminal decodes its own UTF-8, across messages.
        let mut frame = Vec::new();
        if skip < data.len() {
            crate::wbx::terminal::output_frame(&mut frame, idx == 1, &data[skip..]);
        }
        return (!frame.is_empty()).then_some(frame);
    }
    sub.utf8[idx].extend_from_slice(&data[skip..]);
    let text = take_utf8(&mut sub.utf8[idx], false);
    if text.is_empty() {
        return None;
    }
    // Saturating: the offsets come from inside the sandbox, and are not trusted.
    let end = offset
        .saturating_add(data.len() as u64)
        .saturating_sub(sub.utf8[idx].len() as u64);
    let name = if idx == 0 { "stdout" } else { "stderr" };
    Some(event_line(
        &serde_json::json!({"type": name, "data": text, "offset": end}),
    ))
}

impl Daemon {
    fn sub_alive(&self, client: (usize, u64)) -> bool {
        self.conns
            .get(client.0)
            .is_some_and(|c| c.serial == client.1)
    }

    /// Carries out a process endpoint's request on sandbox `key`.
    pub(super) fn proc_op(&mut self, ck: usize, key: usize, op: ProcOp) {
        let Some(b) = self.boxes.boxes.get(key) else {
            return;
        };
        let state = b.state;
        match op {
            ProcOp::List => {
                let list: Vec<serde_json::Value> = b
                    .procs
                    .list
                    .iter()
                    .filter(|(_, p)| !p.killed)
                    .map(|(&pid, p)| wp::process_json(&p.view(pid)))
                    .collect();
                self.respond(
                    ck,
                    Response::json(200, &serde_json::json!({ "processes": list })),
                );
                return;
            }
            ProcOp::Get(pid) => {
                let resp = match b.procs.visible(pid) {
                    Some(p) => Response::json(200, &wp::process_json(&p.view(pid))),
                    None => wp::no_such_process(pid),
                };
                self.respond(ck, resp);
                return;
            }
            _ => {}
        }
        if state != State::Running {
            self.respond(
                ck,
                crate::wbx::error(409, &format!("the sandbox is {}", state.name())),
            );
            return;
        }
        match op {
            ProcOp::Start(s) => self.proc_start(ck, key, s),
            ProcOp::Kill(pid) => self.proc_kill(ck, key, pid),
            ProcOp::Stream(pid, from) => self.proc_stream(ck, key, pid, from, None),
            ProcOp::Attach(pid, a) => self.proc_stream(ck, key, pid, [0, 0], Some(&a)),
            ProcOp::Stdin(pid, input) => self.proc_stdin(ck, key, pid, input),
            ProcOp::Signal(pid, sig) => {
                let r = self
                    .init_room(key, pid, terminal::CONTROL_BYTES)
                    .and_then(|()| self.proc_signal(key, pid, sig));
                self.respond(ck, r.map_or_else(|e| e, |()| Response::no_content()));
            }
            ProcOp::Resize(pid, cols, rows) => {
                let r = self
                    .init_room(key, pid, terminal::CONTROL_BYTES)
                    .and_then(|()| self.proc_resize(key, pid, cols, rows));
                self.respond(ck, r.map_or_else(|e| e, |()| Response::no_content()));
            }
            ProcOp::List | ProcOp::Get(_) => {}
        }
    }

    /// `POST …/env`: variables for every later command and process.
    pub(super) fn box_env(&mut self, ck: usize, key: usize, env: Vec<(String, String)>) {
        let state = self.boxes.boxes[key].state;
        if state != State::Running {
            self.respond(
                ck,
                crate::wbx::error(409, &format!("the sandbox is {}", state.name())),
            );
            return;
        }
        let b = &mut self.boxes.boxes[key];
        let new = env
            .iter()
            .filter(|(k, _)| !b.env_names.contains_key(k))
            .count();
        let has = b.env_names.len();
        let mut sizes = b.env_names.clone();
        sizes.extend(crate::wbx::sandboxes::env_sizes(&env));
        let bytes: usize = sizes.values().sum();
        let refusal = if has + new > crate::wbx::sandboxes::MAX_ENV {
            Some(format!(
                "env: a sandbox has at most {} variables; it has {has} and this adds {new}",
                crate::wbx::sandboxes::MAX_ENV,
            ))
        } else if bytes > crate::wbx::sandboxes::MAX_SANDBOX_ENV_BYTES {
            Some(format!(
                "env: a sandbox's variables take at most {} bytes together (names and values); with these they would take {bytes}",
                crate::wbx::sandboxes::MAX_SANDBOX_ENV_BYTES,
            ))
        } else {
            None
        };
        if let Some(why) = refusal {
            self.respond(ck, crate::wbx::error(400, &why));
            return;
        }
        b.env_names = sizes;
        // Within the route's 64 KiB body: within a frame.
        self.box_call(key, &Call::Env { env });
        self.respond(ck, Response::no_content());
    }

    /// Ok when `pid` is a process of sandbox `key` that still runs.
    fn proc_running(&self, key: usize, pid: u32) -> Result<(), Response> {
        match self.boxes.boxes[key].procs.visible(pid) {
            None => Err(wp::no_such_process(pid)),
            Some(p) if p.ended.is_some() => {
                Err(crate::wbx::error(409, &format!("process {pid} has exited")))
            }
            Some(_) => Ok(()),
        }
    }

    fn proc_start(&mut self, ck: usize, key: usize, start: Box<Start>) {
        let Some(cserial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        let b = &mut self.boxes.boxes[key];
        let running = b.procs.list.values().filter(|p| p.ended.is_none()).count()
            + b.procs
                .pending
                .values()
                .filter(|p| matches!(p, Pending::Start { .. }))
                .count();
        if running >= MAX_RUNNING {
            self.respond(
                ck,
                crate::wbx::error(
                    429,
                    &format!("too many background processes in this sandbox (limit {MAX_RUNNING}); stop one first"),
                ),
            );
            return;
        }
        let call_id = b.take_call_id();
        let call = Call::Spawn {
            cmd: start.cmd.clone(),
            cwd: start.cwd.clone(),
            env: start.env.clone(),
            stdin: start.stdin,
            pty: start.pty,
            background: true,
        };
        if wire::encode_json(&mut b.wbuf, Kind::Call, call_id, &call).is_err() {
            self.respond(
                ck,
                crate::wbx::error(
                    400,
                    "cmd, cwd and env together are too large: at most 1 MiB as JSON",
                ),
            );
            return;
        }
        let gen = self.reactor.arm_new(
            Instant::now() + CALL_TIMEOUT,
            Addr::new(BOXES, key, PROC_CALL_DEADLINE),
        );
        let b = &mut self.boxes.boxes[key];
        b.procs.pending.insert(
            call_id,
            Pending::Start {
                client: (ck, cserial),
                start,
                gen,
                asked: Instant::now(),
            },
        );
        let serial = b.serial;
        self.conn_own(
            ck,
            Owner::BoxWait {
                key,
                serial,
                create: false,
            },
        );
        self.box_flush(key);
    }

    /// `DELETE …/process/{pid}`: a running one is killed with its process group and
    /// answered once it has ended (so a start right after it finds its slot free), then
    /// forgotten; an ended one is forgotten now.
    fn proc_kill(&mut self, ck: usize, key: usize, pid: u32) {
        let Some(cserial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        let b = &mut self.boxes.boxes[key];
        let serial = b.serial;
        let Some(p) = b.procs.list.get_mut(&pid).filter(|p| !p.killed) else {
            self.respond(ck, wp::no_such_process(pid));
            return;
        };
        if p.ended.is_some() {
            b.procs.list.remove(&pid);
            self.box_call(key, &Call::Forget { pid });
            self.respond(ck, Response::no_content());
        } else {
            let gen = self.reactor.arm_new(
                Instant::now() + CALL_TIMEOUT,
                Addr::new(BOXES, key, PROC_KILL_DEADLINE),
            );
            let Some(p) = self.boxes.boxes[key].procs.list.get_mut(&pid) else {
                return;
            };
            p.killed = true;
            p.deleter = Some(((ck, cserial), gen));
            let held = std::mem::replace(&mut p.held, false);
            self.box_kill(key, pid, held);
            self.conn_own(
                ck,
                Owner::BoxWait {
                    key,
                    serial,
                    create: false,
                },
            );
        }
    }

    /// A `DELETE`d process has not ended in [`CALL_TIMEOUT`] after `SIGKILL` (it may be
    /// stuck in the kernel): the client learns so; it stays hidden and is forgotten
    /// when it ends.
    pub(super) fn proc_kill_deadline(&mut self, key: usize, gen: u64) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let paused = b.state == State::Paused;
        let Some((&pid, p)) = b
            .procs
            .list
            .iter_mut()
            .find(|(_, p)| p.deleter.is_some_and(|(_, g)| g == gen))
        else {
            return;
        };
        if paused {
            // Frozen with the rest: the wait goes on.
            let later = Instant::now() + Duration::from_secs(1);
            let g = self
                .reactor
                .arm_new(later, Addr::new(BOXES, key, PROC_KILL_DEADLINE));
            if let Some(p) = self.boxes.boxes[key].procs.list.get_mut(&pid) {
                if let Some((_, gen)) = &mut p.deleter {
                    *gen = g;
                }
            }
            return;
        }
        let Some((client, _)) = p.deleter.take() else {
            return;
        };
        log::warn!(
            "sandbox={} process={pid} has not ended {} s after SIGKILL",
            b.id,
            CALL_TIMEOUT.as_secs()
        );
        self.proc_answer(
            client,
            crate::wbx::error(
                502,
                &format!(
                    "process {pid} was sent SIGKILL but has not ended after {} s",
                    CALL_TIMEOUT.as_secs()
                ),
            ),
        );
    }

    fn proc_stdin(&mut self, ck: usize, key: usize, pid: u32, input: Input) {
        let r = self
            .init_room(key, pid, input.data.len().max(terminal::CONTROL_BYTES))
            .and_then(|()| self.proc_input(key, pid, input.data.into_bytes(), input.eof));
        self.respond(ck, r.map_or_else(|e| e, |()| Response::no_content()));
    }

    /// Whether a request may queue `len` more bytes for the sandbox's init: not while
    /// what was queued before still waits in the daemon past the terminal's backlog
    /// (`terminal::input_fits`, 1 MiB) beside an upload's window (1 MiB, which the same
    /// buffer carries: an upload in flight must not refuse a Ctrl-C), so requests sent
    /// faster than init takes them (pipelined, or to a sandbox whose init is stalled)
    /// cannot grow the daemon's memory. When nothing waits, one request may carry its
    /// whole body (2 MiB). An unknown or ended process is said first (404, 409). 429
    /// with `Retry-After`, the WBX document's "a limit was reached … retry later".
    fn init_room(&self, key: usize, pid: u32, len: usize) -> Result<(), Response> {
        self.proc_running(key, pid)?;
        let waiting = self.boxes.boxes[key].wbuf.len();
        let upload = usize::try_from(super::box_transfer::WINDOW).unwrap_or(usize::MAX);
        if waiting <= upload {
            return Ok(());
        }
        terminal::input_fits(waiting - upload, len)
            .map_err(|e| crate::wbx::error(429, &e).with_header("Retry-After", "1"))
    }

    /// Writes `data` to process `pid`'s input, then ends it if `eof` (a terminal gets
    /// Ctrl-D instead, and stays open).
    pub(super) fn proc_input(
        &mut self,
        key: usize,
        pid: u32,
        mut data: Vec<u8>,
        eof: bool,
    ) -> Result<(), Response> {
        self.proc_running(key, pid)?;
        let b = &mut self.boxes.boxes[key];
        let Some(p) = b.procs.list.get_mut(&pid) else {
            return Err(wp::no_such_process(pid));
        };
        if !p.stdin {
            let msg = if p.pty.is_some() {
                format!("process {pid}'s input has ended")
            } else {
                format!("process {pid} was started without stdin (or its input has ended)")
            };
            return Err(crate::wbx::error(409, &msg));
        }
        let pty = p.pty.is_some();
        if eof && !pty {
            p.stdin = false;
        }
        if eof && pty {
            data.push(0x04);
        }
        for part in data.chunks(wire::MAX_DATA_BYTES) {
            // A part is at most MAX_DATA_BYTES: always within a frame.
            let _ = wire::encode(&mut b.wbuf, Kind::Input, pid, part);
        }
        if eof && !pty {
            let _ = wire::encode(&mut b.wbuf, Kind::Input, pid, &[]);
        }
        self.box_flush(key);
        Ok(())
    }

    /// A terminal's new size.
    pub(super) fn proc_resize(
        &mut self,
        key: usize,
        pid: u32,
        cols: u16,
        rows: u16,
    ) -> Result<(), Response> {
        self.proc_running(key, pid)?;
        let Some(p) = self.boxes.boxes[key].procs.list.get_mut(&pid) else {
            return Err(wp::no_such_process(pid));
        };
        if p.pty.is_none() {
            return Err(crate::wbx::error(
                409,
                &format!("process {pid} has no terminal"),
            ));
        }
        p.pty = Some((cols, rows));
        self.box_call(key, &Call::Resize { pid, cols, rows });
        Ok(())
    }

    /// Sends signal `sig` to process `pid`.
    pub(super) fn proc_signal(&mut self, key: usize, pid: u32, sig: i32) -> Result<(), Response> {
        self.proc_running(key, pid)?;
        self.box_call(key, &Call::Signal { pid, signal: sig });
        Ok(())
    }

    /// `GET …/process/{pid}/stream`: the head now, then the ring, live output, the exit;
    /// `…/ws` (`attach`): the same as WebSocket messages, and input back.
    fn proc_stream(
        &mut self,
        ck: usize,
        key: usize,
        pid: u32,
        from: [u64; 2],
        attach: Option<&crate::wbx::terminal::Attach>,
    ) {
        let Some(cserial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        let b = &mut self.boxes.boxes[key];
        let Some(p) = b.procs.visible(pid) else {
            self.respond(ck, wp::no_such_process(pid));
            return;
        };
        if p.subs.len() + p.watching >= MAX_STREAMS {
            self.respond(
                ck,
                crate::wbx::error(
                    429,
                    &format!("too many clients streaming process {pid} (limit {MAX_STREAMS})"),
                ),
            );
            return;
        }
        let call_id = b.take_call_id();
        // A few bytes: always within a frame.
        let _ = wire::encode_json(&mut b.wbuf, Kind::Call, call_id, &Call::Watch { pid });
        b.procs.next_sub += 1;
        let sub = Sub {
            id: b.procs.next_sub,
            client: (ck, cserial),
            utf8: Default::default(),
            from,
            behind: false,
            ws: attach.is_some(),
        };
        let sub_id = sub.id;
        if let Some(p) = b.procs.list.get_mut(&pid) {
            p.watching += 1;
        }
        let serial = b.serial;
        let gen = self.reactor.arm_new(
            Instant::now() + CALL_TIMEOUT,
            Addr::new(BOXES, key, PROC_CALL_DEADLINE),
        );
        self.boxes.boxes[key]
            .procs
            .pending
            .insert(call_id, Pending::Watch { pid, sub, gen });
        match attach {
            Some(a) => self.term_open(ck, key, serial, pid, sub_id, a),
            None => {
                self.conn_own(
                    ck,
                    Owner::BoxProc {
                        key,
                        serial,
                        pid,
                        sub: sub_id,
                    },
                );
                self.conn_start_ndjson(ck);
            }
        }
        self.box_flush(key);
    }

    /// init answered a call: true if it was a process's.
    pub(super) fn proc_reply(&mut self, key: usize, call_id: u32, payload: &[u8]) -> bool {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return false;
        };
        let Some(pending) = b.procs.pending.remove(&call_id) else {
            return false;
        };
        let reply: Option<Reply> = serde_json::from_slice(payload).ok();
        match pending {
            Pending::Start {
                client,
                start,
                asked,
                ..
            } => self.proc_started(key, client, *start, asked, reply),
            Pending::Watch { pid, sub, .. } => self.proc_watched(key, pid, sub, reply),
        }
        true
    }

    fn proc_answer(&mut self, client: (usize, u64), resp: Response) {
        if self.sub_alive(client) {
            self.respond(client.0, resp);
            self.conn_resume(client.0);
        }
    }

    fn proc_started(
        &mut self,
        key: usize,
        client: (usize, u64),
        start: Start,
        asked: Instant,
        reply: Option<Reply>,
    ) {
        let pid = match reply {
            Some(Reply::Ok(v)) => v["pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
            Some(Reply::Error(e)) => {
                self.proc_answer(client, crate::wbx::error(400, &e));
                return;
            }
            // Refused is for file operations only.
            Some(Reply::Refused { .. }) | None => None,
        };
        let b = &mut self.boxes.boxes[key];
        let Some(pid) = pid.filter(|&p| !b.procs.running(p) && !b.execs.has(p)) else {
            // No pid, or one that names a running process: init is not telling the truth.
            self.proc_answer(
                client,
                crate::wbx::error(502, "the sandbox's init answered nonsense"),
            );
            self.box_end(key, "its init broke the protocol");
            return;
        };
        if b.procs.list.remove(&pid).is_some() {
            // An ended process's pid, used again: its ring goes.
            self.box_call(key, &Call::Forget { pid });
        }
        let b = &mut self.boxes.boxes[key];
        b.procs.list.insert(
            pid,
            Proc {
                tag: start.tag,
                cmd: start.cmd,
                pty: start.pty,
                stdin: start.stdin || start.pty.is_some(),
                started_ms: super::boxes::now_ms(),
                started: asked,
                ended: None,
                subs: Vec::new(),
                watching: 0,
                watched: false,
                held: false,
                killed: false,
                deleter: None,
            },
        );
        log::info!("sandbox={} process={pid} started", b.id);
        self.proc_answer(
            client,
            Response::json(200, &serde_json::json!({ "pid": pid })),
        );
    }

    fn proc_watched(&mut self, key: usize, pid: u32, mut sub: Sub, reply: Option<Reply>) {
        let b = &mut self.boxes.boxes[key];
        if let Some(p) = b.procs.list.get_mut(&pid) {
            p.watching = p.watching.saturating_sub(1);
        }
        let alive = self.sub_alive(sub.client);
        let b = &mut self.boxes.boxes[key];
        match reply {
            Some(Reply::Ok(v)) if v["exited"].is_null() => {
                let Some(p) = b.procs.list.get_mut(&pid) else {
                    if alive {
                        let e = serde_json::json!({"type": "error", "error": format!("no such process: {pid}")});
                        self.sub_end(&mut sub, &e);
                    }
                    return;
                };
                p.watched = true;
                if alive {
                    p.subs.push(sub);
                }
                self.proc_unwatch_if_unwanted(key, pid);
            }
            Some(Reply::Ok(v)) => {
                let exited: Option<Exited> = serde_json::from_value(v["exited"].clone()).ok();
                let duration = b
                    .procs
                    .list
                    .get(&pid)
                    .and_then(|p| p.ended)
                    .map_or(0, |(_, _, d, _)| d);
                self.proc_unwatch_if_unwanted(key, pid);
                if alive {
                    let e = exited.unwrap_or(Exited {
                        code: 128 + libc::SIGKILL,
                        signal: Some(libc::SIGKILL),
                    });
                    self.sub_end(&mut sub, &exit_event(&e, duration));
                }
            }
            Some(Reply::Error(e)) => {
                self.proc_unwatch_if_unwanted(key, pid);
                if alive {
                    self.sub_end(&mut sub, &serde_json::json!({"type": "error", "error": e}));
                }
            }
            Some(Reply::Refused { .. }) | None => {
                if alive {
                    let e = serde_json::json!({"type": "error", "error": "the sandbox's init answered nonsense"});
                    self.sub_end(&mut sub, &e);
                }
                self.box_end(key, "its init broke the protocol");
            }
        }
    }

    /// Sends what a subscriber's UTF-8 buffers hold (at a stream's end).
    fn sub_flush_utf8(&mut self, sub: &mut Sub) {
        for (idx, name) in [(0, "stdout"), (1, "stderr")] {
            let text = take_utf8(&mut sub.utf8[idx], true);
            if !text.is_empty() {
                let line = event_line(&serde_json::json!({"type": name, "data": text}));
                self.conn_send_chunked(sub.client.0, &line);
            }
        }
    }

    /// Queues a subscriber's output (a chunk of NDJSON, or a WebSocket message).
    fn sub_send(&mut self, client: (usize, u64), ws: bool, bytes: &[u8]) {
        if ws {
            self.term_send(client.0, bytes);
        } else {
            self.conn_send_chunked(client.0, bytes);
        }
    }

    /// A subscriber's last word, `event` (an exit or an error): the end of its NDJSON
    /// stream (the connection reads requests again), or of its WebSocket.
    fn sub_end(&mut self, sub: &mut Sub, event: &serde_json::Value) {
        let ck = sub.client.0;
        if sub.ws {
            let code = if event["type"] == "exit" { 1000 } else { 1011 };
            self.term_end(ck, &event.to_string(), code);
            return;
        }
        self.sub_flush_utf8(sub);
        self.finish_stream(ck, &event_line(event));
        self.conn_resume(ck);
    }

    /// A piece of a process's ring for the `Watch` call `call_id`.
    pub(super) fn proc_replay(&mut self, key: usize, call_id: u32, payload: &[u8]) {
        let Some((stream, offset, data)) = crate::sandbox::wire::parse_output(payload) else {
            return;
        };
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let Some(Pending::Watch { sub, .. }) = b.procs.pending.get_mut(&call_id) else {
            // A replay for no watch: dropped (the daemon asked for none).
            return;
        };
        let idx = usize::from(stream == Stream::Stderr);
        let line = sub_line(sub, idx, offset, data);
        let (client, ws) = (sub.client, sub.ws);
        let Some(line) = line.filter(|_| self.sub_alive(client)) else {
            return;
        };
        self.sub_send(client, ws, &line);
    }

    /// A background process's output: to every client streaming it.
    pub(super) fn proc_output(&mut self, key: usize, pid: u32, payload: &[u8]) {
        let Some((stream, offset, data)) = crate::sandbox::wire::parse_output(payload) else {
            return;
        };
        let idx = usize::from(stream == Stream::Stderr);
        let Some(p) = self
            .boxes
            .boxes
            .get_mut(key)
            .and_then(|b| b.procs.list.get_mut(&pid))
        else {
            return;
        };
        let mut sends = Vec::new();
        for sub in &mut p.subs {
            if let Some(line) = sub_line(sub, idx, offset, data) {
                sends.push((sub.id, sub.client, sub.ws, line));
            }
        }
        let mut behind = Vec::new();
        for (id, client, ws, line) in sends {
            if !self.sub_alive(client) {
                continue;
            }
            self.sub_send(client, ws, &line);
            if self
                .conns
                .get(client.0)
                .is_some_and(|c| c.http.pending_write() >= HOLD_BYTES)
            {
                behind.push(id);
            }
        }
        if behind.is_empty() {
            return;
        }
        let Some(p) = self
            .boxes
            .boxes
            .get_mut(key)
            .and_then(|b| b.procs.list.get_mut(&pid))
        else {
            return;
        };
        for sub in &mut p.subs {
            if behind.contains(&sub.id) {
                sub.behind = true;
            }
        }
        if p.ended.is_none() && !std::mem::replace(&mut p.held, true) {
            self.box_call(key, &Call::Hold { pid });
        }
    }

    /// A background process ended: its streams end with its exit; it is kept (or
    /// forgotten, if deleted).
    pub(super) fn proc_exit(&mut self, key: usize, pid: u32, payload: &[u8]) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let Some(p) = b.procs.list.get_mut(&pid) else {
            return;
        };
        if p.ended.is_some() {
            // A second exit for one process: init is not telling the truth.
            self.box_end(key, "its init broke the protocol");
            return;
        }
        let exited: Exited = serde_json::from_slice(payload).unwrap_or(Exited {
            code: 128 + libc::SIGKILL,
            signal: Some(libc::SIGKILL),
        });
        b.procs.ended_seq += 1;
        let duration = u64::try_from(p.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        p.ended = Some((exited, super::boxes::now_ms(), duration, b.procs.ended_seq));
        p.held = false;
        p.watched = false;
        let subs = std::mem::take(&mut p.subs);
        let killed = p.killed;
        let deleter = p.deleter.take();
        log::info!("sandbox={} process={pid} exited code={}", b.id, exited.code);
        for mut sub in subs {
            if self.sub_alive(sub.client) {
                self.sub_end(&mut sub, &exit_event(&exited, duration));
            }
        }
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let mut forget = Vec::new();
        if killed {
            b.procs.list.remove(&pid);
            forget.push(pid);
        }
        // The oldest ended ones beyond the bound are forgotten.
        loop {
            let ended: Vec<(u64, u32)> = b
                .procs
                .list
                .iter()
                .filter_map(|(&pid, p)| p.ended.map(|(_, _, _, seq)| (seq, pid)))
                .collect();
            if ended.len() <= MAX_ENDED {
                break;
            }
            let Some(&(_, oldest)) = ended.iter().min() else {
                break;
            };
            b.procs.list.remove(&oldest);
            forget.push(oldest);
        }
        for pid in forget {
            self.box_call(key, &Call::Forget { pid });
        }
        if let Some((client, _)) = deleter {
            self.proc_answer(client, Response::no_content());
        }
    }

    /// A streaming client left.
    pub(crate) fn proc_unsubscribe(&mut self, key: usize, serial: u64, pid: u32, sub: u64) {
        let Some(b) = self.boxes.boxes.get_mut(key).filter(|b| b.serial == serial) else {
            return;
        };
        // Still attaching: its watch's answer finds it gone.
        if let Some(p) = b.procs.list.get_mut(&pid) {
            p.subs.retain(|s| s.id != sub);
        }
        self.proc_release_if_caught_up(key, pid);
        self.proc_unwatch_if_unwanted(key, pid);
    }

    /// A streaming client took most of what was queued for it.
    pub(crate) fn proc_drained(&mut self, key: usize, serial: u64, pid: u32, sub: u64) {
        let Some(p) = self
            .boxes
            .boxes
            .get_mut(key)
            .filter(|b| b.serial == serial)
            .and_then(|b| b.procs.list.get_mut(&pid))
        else {
            return;
        };
        if let Some(s) = p.subs.iter_mut().find(|s| s.id == sub) {
            s.behind = false;
        }
        self.proc_release_if_caught_up(key, pid);
    }

    fn proc_release_if_caught_up(&mut self, key: usize, pid: u32) {
        let Some(p) = self
            .boxes
            .boxes
            .get_mut(key)
            .and_then(|b| b.procs.list.get_mut(&pid))
        else {
            return;
        };
        if p.held && !p.subs.iter().any(|s| s.behind) {
            p.held = false;
            self.box_call(key, &Call::Release { pid });
        }
    }

    /// Nobody streams a watched process any more: init stops forwarding it.
    fn proc_unwatch_if_unwanted(&mut self, key: usize, pid: u32) {
        let Some(p) = self
            .boxes
            .boxes
            .get_mut(key)
            .and_then(|b| b.procs.list.get_mut(&pid))
        else {
            return;
        };
        if p.watched && p.subs.is_empty() && p.watching == 0 && p.ended.is_none() {
            p.watched = false;
            p.held = false;
            self.box_call(key, &Call::Unwatch { pid });
        }
    }

    /// init did not answer a process call in time: the sandbox is wedged.
    pub(super) fn proc_deadline(&mut self, key: usize, gen: u64) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let Some(&call) = b
            .procs
            .pending
            .iter()
            .find(|(_, p)| p.gen() == gen)
            .map(|(c, _)| c)
        else {
            return;
        };
        if b.state == State::Paused {
            // init is frozen with the rest: the wait goes on.
            let later = Instant::now() + Duration::from_secs(1);
            let g = self
                .reactor
                .arm_new(later, Addr::new(BOXES, key, PROC_CALL_DEADLINE));
            match self.boxes.boxes[key].procs.pending.get_mut(&call) {
                Some(Pending::Start { gen, .. } | Pending::Watch { gen, .. }) => *gen = g,
                None => {}
            }
            return;
        }
        self.box_end(key, "its init did not answer");
    }

    /// Fails every waiting process request and stream of sandbox `key` (it ended).
    pub(super) fn proc_fail_all(&mut self, key: usize, status: u16, message: &str) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let pending: Vec<Pending> = b.procs.pending.drain().map(|(_, p)| p).collect();
        let mut subs: Vec<Sub> = Vec::new();
        // A process being deleted ended with its sandbox: its DELETE succeeded.
        let mut deleters: Vec<(usize, u64)> = Vec::new();
        for p in b.procs.list.values_mut() {
            subs.append(&mut p.subs);
            deleters.extend(p.deleter.take().map(|(c, _)| c));
        }
        for client in deleters {
            self.proc_answer(client, Response::no_content());
        }
        for p in pending {
            match p {
                Pending::Start { client, .. } => {
                    self.proc_answer(client, crate::wbx::error(status, message))
                }
                Pending::Watch { sub, .. } => subs.push(sub),
            }
        }
        let e = serde_json::json!({"type": "error", "error": message});
        for mut sub in subs {
            if self.sub_alive(sub.client) {
                self.sub_end(&mut sub, &e);
            }
        }
    }
}

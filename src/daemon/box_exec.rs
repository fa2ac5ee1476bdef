//! Commands in long-lived sandboxes: `exec` (answered once the command ends, output
//! capped per stream) and `exec/stream` (NDJSON events as it runs). A command is a
//! `spawn` call to the sandbox's init, then its output and exit frames; its time limit
//! is a timer here that has init kill its process group; a client that leaves kills it
//! too.

use super::boxes::{State, BOXES, EXEC_DEADLINE};
use super::conn::Owner;
use super::Daemon;
use crate::http::sse::take_utf8;
use crate::http::Response;
use crate::reactor::Addr;
use crate::sandbox::wire::{self, Call, Exited, Kind, Reply, Stream};
use crate::wbx::sandboxes::{event_line, Exec, ExecResult, EXEC_OUTPUT_BYTES};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long init may take to answer a spawn, or to report the exit of a command it
/// was told to kill.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A streaming client this far behind has its command's output held by init (the
/// command blocks on its pipes; the sandbox's other commands go on): released once
/// the client has taken most of it.
const HOLD_BYTES: usize = 1 << 20;

/// A command's output stream as it is kept and streamed.
#[derive(Default)]
struct Out {
    kept: Vec<u8>,
    truncated: bool,
    /// An incomplete UTF-8 character held back from the stream.
    pending: Vec<u8>,
}

/// One command, from its spawn call to its exit.
pub(super) struct Cmd {
    /// The client: its connection (key, serial); `None` once it left.
    client: Option<(usize, u64)>,
    /// NDJSON events (else one JSON answer at the end).
    stream: bool,
    out: [Out; 2],
    started: Instant,
    timeout_ms: u64,
    timed_out: bool,
    /// What to write to its stdin once it runs (then its end).
    stdin: Option<String>,
    /// Its pid in the sandbox, once init answered.
    pid: Option<u32>,
    /// Its time limit's timer generation.
    gen: u64,
    /// The call that started it (what its connection's owner names).
    call: u32,
    /// Its output is held by init (its streaming client is behind).
    held: bool,
}

/// A sandbox's commands: by the call that started them until init answers, then by pid.
#[derive(Default)]
pub(crate) struct Execs {
    calls: HashMap<u32, Cmd>,
    running: HashMap<u32, Cmd>,
}

impl Execs {
    /// Whether `pid` is a running command.
    pub(super) fn has(&self, pid: u32) -> bool {
        self.running.contains_key(&pid)
    }
}

impl Daemon {
    /// Starts `exec` in sandbox `key` for connection `ck`.
    pub(super) fn exec_start(&mut self, ck: usize, key: usize, exec: Exec, stream: bool) {
        let Some(cserial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        if b.state != State::Running {
            let state = b.state.name();
            self.respond(
                ck,
                crate::wbx::error(409, &format!("the sandbox is {state}")),
            );
            return;
        }
        let call_id = b.take_call_id();
        let Exec {
            cmd,
            cwd,
            env,
            timeout_ms,
            stdin,
        } = exec;
        let call = Call::Spawn {
            cmd,
            cwd,
            env,
            stdin: stdin.is_some(),
            pty: None,
            background: false,
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
        // init answers a spawn at once; one that does not within this is wedged.
        let gen = self.reactor.arm_new(
            Instant::now() + CALL_TIMEOUT,
            Addr::new(BOXES, key, EXEC_DEADLINE),
        );
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        b.execs.calls.insert(
            call_id,
            Cmd {
                client: Some((ck, cserial)),
                stream,
                out: Default::default(),
                started: Instant::now(),
                timeout_ms,
                timed_out: false,
                stdin,
                pid: None,
                gen,
                call: call_id,
                held: false,
            },
        );
        self.conn_own(
            ck,
            Owner::BoxCmd {
                key,
                serial: self.boxes.boxes[key].serial,
                call: call_id,
            },
        );
        self.box_flush(key);
    }

    /// init answered a call: a command's spawn.
    pub(super) fn exec_reply(&mut self, key: usize, call_id: u32, payload: &[u8]) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let Some(mut cmd) = b.execs.calls.remove(&call_id) else {
            // A reply to a call not made (or a signal's): nothing waits on it.
            return;
        };
        let reply: Result<Reply, _> = serde_json::from_slice(payload);
        let pid = match reply {
            Ok(Reply::Ok(v)) => v["pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
            Ok(Reply::Error(e)) => {
                self.exec_refuse(cmd, 400, &e);
                return;
            }
            // Refused is for file operations only.
            Ok(Reply::Refused { .. }) | Err(_) => None,
        };
        let Some(pid) = pid else {
            self.exec_refuse(cmd, 502, "the sandbox's init answered nonsense");
            self.box_end(key, "its init broke the protocol");
            return;
        };
        if b.execs.running.contains_key(&pid) || b.procs.running(pid) {
            // A pid that already names a running command: init is not telling the truth.
            self.exec_refuse(cmd, 502, "the sandbox's init answered nonsense");
            self.box_end(key, "its init broke the protocol");
            return;
        }
        cmd.pid = Some(pid);
        // `started` stays when the spawn was asked for: the process ran from some time
        // after it, so `duration_ms` is never shorter than the command took (stamped
        // here, a reply that waited on a busy host made a 300 ms command 298 ms). Its
        // time limit counts from now, when it surely runs.
        let spawned = Instant::now();
        // The spawn's answer timer no longer names it.
        cmd.gen = 0;
        if let Some(input) = cmd.stdin.take() {
            for part in input.as_bytes().chunks(wire::MAX_DATA_BYTES) {
                // A part is at most MAX_DATA_BYTES: always within a frame.
                let _ = wire::encode(&mut b.wbuf, Kind::Input, pid, part);
            }
            let _ = wire::encode(&mut b.wbuf, Kind::Input, pid, &[]);
        }
        if cmd.timeout_ms > 0 {
            // No time limit outlives the longest lifetime a sandbox may have.
            let ms = cmd
                .timeout_ms
                .min(self.cfg.wbx.max_timeout_s.saturating_mul(1000));
            let at = spawned + Duration::from_millis(ms);
            cmd.gen = self
                .reactor
                .arm_new(at, Addr::new(BOXES, key, EXEC_DEADLINE));
        }
        let (client, stream) = (cmd.client, cmd.stream);
        b.execs.running.insert(pid, cmd);
        if let (Some((ck, cserial)), true) = (client, stream) {
            if self.conns.get(ck).is_some_and(|c| c.serial == cserial) {
                // The head goes out once the command runs: a refusal keeps its status.
                self.conn_start_ndjson(ck);
                let line = event_line(&serde_json::json!({"type": "start", "pid": pid}));
                self.conn_send_chunked(ck, &line);
            }
        }
        // The client may have left while init started it.
        if client.is_none() {
            self.exec_signal(key, pid, libc::SIGKILL);
        }
        self.box_flush(key);
    }

    /// A command's output.
    pub(super) fn exec_output(&mut self, key: usize, pid: u32, payload: &[u8]) {
        let Some((stream, offset, data)) = crate::sandbox::wire::parse_output(payload) else {
            return;
        };
        let idx = usize::from(stream == Stream::Stderr);
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let Some(cmd) = b.execs.running.get_mut(&pid) else {
            // A process no client waits for (its client left): dropped.
            return;
        };
        let out = &mut cmd.out[idx];
        if cmd.stream {
            let Some((ck, cserial)) = cmd.client else {
                return;
            };
            out.pending.extend_from_slice(data);
            let text = take_utf8(&mut out.pending, false);
            if text.is_empty() {
                return;
            }
            let name = if idx == 0 { "stdout" } else { "stderr" };
            // The stream's offset after this line's bytes (held-back ones excluded).
            // Saturating: the offsets come from inside the sandbox, and are not trusted.
            let end = offset
                .saturating_add(data.len() as u64)
                .saturating_sub(out.pending.len() as u64);
            let line = event_line(&serde_json::json!({"type": name, "data": text, "offset": end}));
            if self.conns.get(ck).is_some_and(|c| c.serial == cserial) {
                self.conn_send_chunked(ck, &line);
                // A client this far behind: init holds this command's output (it blocks
                // on its pipes) until the client has taken most of it; the sandbox's
                // other commands go on.
                let behind = self
                    .conns
                    .get(ck)
                    .is_some_and(|c| c.http.pending_write() >= HOLD_BYTES);
                let hold = behind
                    && self
                        .boxes
                        .boxes
                        .get_mut(key)
                        .and_then(|b| b.execs.running.get_mut(&pid))
                        .is_some_and(|c| !std::mem::replace(&mut c.held, true));
                if hold {
                    self.box_call(key, &Call::Hold { pid });
                }
            }
        } else {
            let room = EXEC_OUTPUT_BYTES.saturating_sub(out.kept.len());
            let keep = room.min(data.len());
            out.kept.extend_from_slice(&data[..keep]);
            if keep < data.len() {
                out.truncated = true;
            }
        }
    }

    /// The streaming client of command `call` took most of what was queued: a held
    /// command's output flows again.
    pub(crate) fn exec_drained(&mut self, key: usize, serial: u64, call: u32) {
        let Some(b) = self.boxes.boxes.get_mut(key).filter(|b| b.serial == serial) else {
            return;
        };
        let Some((&pid, cmd)) = b.execs.running.iter_mut().find(|(_, c)| c.call == call) else {
            return;
        };
        if std::mem::replace(&mut cmd.held, false) {
            self.box_call(key, &Call::Release { pid });
        }
    }

    /// A command ended.
    pub(super) fn exec_exit(&mut self, key: usize, pid: u32, payload: &[u8]) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let Some(mut cmd) = b.execs.running.remove(&pid) else {
            return;
        };
        let exited: Exited = serde_json::from_slice(payload).unwrap_or(Exited {
            code: 128 + libc::SIGKILL,
            signal: Some(libc::SIGKILL),
        });
        let Some((ck, cserial)) = cmd.client else {
            return;
        };
        if self.conns.get(ck).is_none_or(|c| c.serial != cserial) {
            return;
        }
        let duration_ms = u64::try_from(cmd.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let exit_code = if cmd.timed_out {
            128 + libc::SIGKILL
        } else {
            exited.code
        };
        if cmd.stream {
            for (idx, name) in [(0, "stdout"), (1, "stderr")] {
                let text = take_utf8(&mut cmd.out[idx].pending, true);
                if !text.is_empty() {
                    let line = event_line(&serde_json::json!({"type": name, "data": text}));
                    self.conn_send_chunked(ck, &line);
                }
            }
            let last = event_line(&serde_json::json!({
                "type": "exit",
                "exit_code": exit_code,
                "duration_ms": duration_ms,
                "timed_out": cmd.timed_out,
            }));
            self.finish_stream(ck, &last);
        } else {
            let [o, e] = cmd.out;
            let result = ExecResult {
                exit_code,
                stdout: String::from_utf8_lossy(&o.kept).into_owned(),
                stderr: String::from_utf8_lossy(&e.kept).into_owned(),
                duration_ms,
                timed_out: cmd.timed_out,
                truncated: o.truncated || e.truncated,
            };
            self.respond(ck, Response::json(200, &result));
        }
        self.conn_resume(ck);
    }

    /// A command's time limit passed: init kills its process group; its exit says
    /// `timed_out`.
    pub(super) fn exec_deadline(&mut self, key: usize, gen: u64) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        if b.state == State::Paused {
            // Nothing runs while paused, the init included: the limit waits.
            let later = Instant::now() + Duration::from_secs(1);
            let cmd = b
                .execs
                .calls
                .values_mut()
                .chain(b.execs.running.values_mut())
                .find(|c| c.gen == gen && gen != 0);
            if let Some(cmd) = cmd {
                cmd.gen = self
                    .reactor
                    .arm_new(later, Addr::new(BOXES, key, EXEC_DEADLINE));
            }
            return;
        }
        if let Some(&call) = b
            .execs
            .calls
            .iter()
            .find(|(_, c)| c.gen == gen)
            .map(|(id, _)| id)
        {
            // No answer to a spawn: the init is wedged (out of memory, or killed).
            if let Some(cmd) = b.execs.calls.remove(&call) {
                self.exec_refuse(cmd, 502, "the sandbox's init did not answer");
            }
            self.box_end(key, "its init did not answer");
            return;
        }
        let Some((&pid, cmd)) = b
            .execs
            .running
            .iter_mut()
            .find(|(_, c)| c.gen == gen && gen != 0)
        else {
            return;
        };
        if cmd.timed_out {
            // Killed a while ago and no exit reported: the init is wedged.
            if let Some(cmd) = b.execs.running.remove(&pid) {
                self.exec_refuse(cmd, 502, "the sandbox's init did not answer");
            }
            self.box_end(key, "its init did not answer");
            return;
        }
        cmd.timed_out = true;
        let held = std::mem::replace(&mut cmd.held, false);
        cmd.gen = self.reactor.arm_new(
            Instant::now() + CALL_TIMEOUT,
            Addr::new(BOXES, key, EXEC_DEADLINE),
        );
        self.box_kill(key, pid, held);
    }

    fn exec_signal(&mut self, key: usize, pid: u32, signal: i32) {
        self.box_call(key, &Call::Signal { pid, signal });
    }

    /// Has init kill process `pid`'s group; one whose output was `held` gets it
    /// released too, since its exit comes only after its output.
    pub(super) fn box_kill(&mut self, key: usize, pid: u32, held: bool) {
        self.exec_signal(key, pid, libc::SIGKILL);
        if held {
            self.box_call(key, &Call::Release { pid });
        }
    }

    /// Sends init a call nobody waits on (a signal, a hold or a release: init's reply
    /// is dropped, as for any call not waited on).
    pub(super) fn box_call(&mut self, key: usize, call: &Call) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let call_id = b.take_call_id();
        // These calls are a few bytes: always within a frame.
        let _ = wire::encode_json(&mut b.wbuf, Kind::Call, call_id, call);
        self.box_flush(key);
    }

    /// The client of command `call` left: it is killed (its output is dropped).
    pub(crate) fn exec_cancel(&mut self, key: usize, serial: u64, call: u32) {
        let Some(b) = self.boxes.boxes.get_mut(key).filter(|b| b.serial == serial) else {
            return;
        };
        if let Some(cmd) = b.execs.calls.get_mut(&call) {
            // Not started yet: killed once init says its pid.
            cmd.client = None;
            return;
        }
        let Some((&pid, cmd)) = b.execs.running.iter_mut().find(|(_, c)| c.call == call) else {
            return;
        };
        cmd.client = None;
        let held = std::mem::replace(&mut cmd.held, false);
        self.box_kill(key, pid, held);
    }

    /// Answers a command that could not start.
    fn exec_refuse(&mut self, cmd: Cmd, status: u16, message: &str) {
        let Some((ck, cserial)) = cmd.client else {
            return;
        };
        if self.conns.get(ck).is_none_or(|c| c.serial != cserial) {
            return;
        }
        if cmd.stream && cmd.pid.is_some() {
            // The stream began: the end is an `error` line.
            let line = event_line(&serde_json::json!({"type": "error", "error": message}));
            self.finish_stream(ck, &line);
        } else {
            self.respond(ck, crate::wbx::error(status, message));
        }
        self.conn_resume(ck);
    }

    /// Fails every command of sandbox `key` (it ended).
    pub(super) fn exec_fail_all(&mut self, key: usize, status: u16, message: &str) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let cmds: Vec<Cmd> = b
            .execs
            .calls
            .drain()
            .map(|(_, c)| c)
            .chain(b.execs.running.drain().map(|(_, c)| c))
            .collect();
        for c in cmds {
            self.exec_refuse(c, status, message);
        }
    }
}

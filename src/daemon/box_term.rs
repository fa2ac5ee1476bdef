//! A background process's terminal over a WebSocket (`GET …/process/{pid}/ws`, the
//! protocol in `wbx::terminal`): one more subscriber of the process's output, as an
//! NDJSON `stream` client is (the ring first, then live output, the same hold when
//! the client falls behind), whose connection also carries input, resizes and signals
//! back. A quiet connection is not closed (a terminal waits for its person): after
//! the idle time it is pinged, and closed only when the next idle time passes with no
//! answer (a half-open connection, a laptop asleep). A client that stops reading holds
//! the output as a `stream` client does, and is dropped when its writes stall.

use super::boxes::State;
use super::conn::{Owner, Phase};
use super::Daemon;
use crate::http::ws::{self, Message};
use crate::http::Response;
use crate::wbx::terminal::{self, Attach, Incoming};

/// A connection attached to a process's terminal.
#[derive(Debug)]
pub struct TermState {
    pub(crate) dec: ws::Decoder,
    /// The sandbox's key and serial.
    pub key: usize,
    /// Its serial.
    pub serial: u64,
    /// The process.
    pub pid: u32,
    /// Its subscriber id among the process's streaming clients.
    pub sub: u64,
    /// A ping went out after a quiet idle time and nothing came back since.
    pub pinged: bool,
}

/// The message of a WBX error response (`{"error": "…"}`).
fn message_of(resp: &Response) -> String {
    serde_json::from_slice::<serde_json::Value>(&resp.body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("refused ({})", resp.status))
}

impl Daemon {
    /// Answers the upgrade and hands the connection to the terminal.
    pub(super) fn term_open(
        &mut self,
        ck: usize,
        key: usize,
        serial: u64,
        pid: u32,
        sub: u64,
        a: &Attach,
    ) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        c.http.note_head(101);
        let protocol = a.protocol.then_some(terminal::PROTOCOL);
        c.http
            .wbuf
            .extend_from_slice(&ws::handshake_with(&a.accept, protocol));
        c.http.phase = Phase::Owned(Owner::BoxTerm(Box::new(TermState {
            dec: ws::Decoder::new(terminal::MAX_MESSAGE_BYTES),
            key,
            serial,
            pid,
            sub,
            pinged: false,
        })));
        log::debug!("conn={ck} terminal attached to process {pid}");
        self.arm_idle(ck);
        self.conn_flush(ck);
    }

    /// Queues a message already framed and writes what the socket takes.
    pub(super) fn term_send(&mut self, ck: usize, frame: &[u8]) {
        if let Some(c) = self.conns.get_mut(ck) {
            if c.http.close_after_flush {
                return;
            }
            c.http.wbuf.extend_from_slice(frame);
            self.conn_flush(ck);
        }
    }

    /// The terminal's last word: an event, then a close with `code`.
    pub(super) fn term_end(&mut self, ck: usize, event: &str, code: u16) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        if c.http.close_after_flush {
            return;
        }
        ws::write_text(&mut c.http.wbuf, event);
        ws::write_close(&mut c.http.wbuf, code, "");
        c.http.close_after_flush = true;
        // Closes once written (no readable or writable edge may come to do it).
        self.conn_after_io(ck);
    }

    /// The idle time passed on a terminal with nothing from its client: a ping (the
    /// next idle time without an answer closes it, `TermState::pinged`).
    pub(crate) fn term_ping(&mut self, ck: usize) {
        let Some(c) = self.conns.get_mut(ck) else {
            return;
        };
        if c.http.close_after_flush {
            return;
        }
        let Phase::Owned(Owner::BoxTerm(t)) = &mut c.http.phase else {
            return;
        };
        t.pinged = true;
        ws::write_frame(&mut c.http.wbuf, 9, b"isobox");
        self.conn_flush(ck);
    }

    fn term_event(&mut self, ck: usize, event: &str) {
        if let Some(c) = self.conns.get_mut(ck) {
            ws::write_text(&mut c.http.wbuf, event);
        }
    }

    /// A data message of a terminal (`eryx.rs::ws_pump` took the control ones).
    pub(crate) fn term_message(&mut self, ck: usize, m: Message) {
        let Some(Owner::BoxTerm(t)) = self.conns.get(ck).and_then(|c| c.owner()) else {
            return;
        };
        let (key, serial, pid) = (t.key, t.serial, t.pid);
        let asked = match m {
            Message::Binary(data) => Incoming::Input(data),
            Message::Text(t) => match terminal::incoming(&t) {
                Ok(i) => i,
                Err(e) => {
                    self.term_event(ck, &terminal::error_event(&e));
                    return;
                }
            },
            Message::Ping(_) | Message::Pong(_) | Message::Close(_) => return,
        };
        if let Incoming::Ping = asked {
            self.term_event(ck, r#"{"type":"pong"}"#);
            return;
        }
        let state = match self.boxes.boxes.get(key).filter(|b| b.serial == serial) {
            Some(b) => b.state,
            // The sandbox is gone: its end closed this connection already.
            None => return,
        };
        // Everything but a ping queues bytes for the sandbox's init: each is refused
        // while what was queued before is not taken (a client sending resizes or
        // signals as fast as it can must not grow the daemon's buffer either).
        let waiting = self.boxes.boxes[key].wbuf.len();
        let queued = match &asked {
            Incoming::Input(data) => data.len(),
            _ => terminal::CONTROL_BYTES,
        };
        let r = if let Err(e) = terminal::input_fits(waiting, queued) {
            Err(crate::wbx::error(429, &e))
        } else if state == State::Running {
            match asked {
                Incoming::Input(data) => self.proc_input(key, pid, data, false),
                Incoming::Eof => self.proc_input(key, pid, Vec::new(), true),
                Incoming::Resize(cols, rows) => self.proc_resize(key, pid, cols, rows),
                Incoming::Signal(sig) => self.proc_signal(key, pid, sig),
                Incoming::Ping => Ok(()),
            }
        } else {
            Err(crate::wbx::error(
                409,
                &format!("the sandbox is {}", state.name()),
            ))
        };
        if let Err(resp) = r {
            self.term_event(ck, &terminal::error_event(&message_of(&resp)));
        }
    }
}

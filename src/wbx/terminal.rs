//! A process's terminal over a WebSocket: `GET …/process/{pid}/ws`, an isobox extension
//! beside the WBX face (its document has only the NDJSON `stream` and the `stdin`,
//! `resize` and `signal` requests, which a browser's terminal would need four
//! connections and a request per keystroke for).
//!
//! Server to client:
//! - a binary message is output: its first byte the stream (1 stdout, 2 stderr), the
//!   rest the bytes as the process wrote them (a terminal's output is all stdout);
//! - a text message is an event: `{"type":"exit","exit_code":…,"signal":…,
//!   "duration_ms":…}` (then a close with 1000), or `{"type":"error","error":…}` (a
//!   message the client sent was refused; the connection stays, unless it says the
//!   process is gone, when a close with 1011 follows).
//!
//! Client to server:
//! - a binary message is input, bytes as they are (keystrokes);
//! - a text message is a JSON object: `{"type":"stdin","data":"…"}`,
//!   `{"type":"resize","cols":…,"rows":…}`, `{"type":"signal","signal":"SIGINT"}`,
//!   `{"type":"eof"}` (a terminal gets Ctrl-D; a pipe is closed), `{"type":"ping"}`
//!   (answered `{"type":"pong"}`).
//!
//! The output so far (what the sandbox keeps, the last 1 MiB per stream) comes first,
//! all of it: output messages carry no offsets, so there is nothing to resume from (a
//! client that needs exact resumption uses `stream`). A browser cannot set
//! headers on a WebSocket: it offers the subprotocol `isobox.terminal` (chosen in the
//! answer) and its key as `isobox.bearer.<base64url>` (never sent back).

use super::error;
use super::processes::{self, ProcOp, MAX_TERMINAL_SIDE};
use super::sandboxes::Op;
use crate::http::ws;
use crate::http::{Request, Response};
use serde_json::Value;

/// The subprotocol this endpoint speaks, chosen when offered.
pub const PROTOCOL: &str = "isobox.terminal";

/// Largest message a client may send (input or a control message).
pub const MAX_MESSAGE_BYTES: usize = 64 << 10;

/// Stream byte of stdout output.
pub const STDOUT: u8 = 1;
/// Stream byte of stderr output.
pub const STDERR: u8 = 2;

/// What the upgrade was asked with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attach {
    /// `Sec-WebSocket-Accept`.
    pub accept: String,
    /// Whether to answer with [`PROTOCOL`].
    pub protocol: bool,
}

/// `GET …/process/{pid}/ws`: checks the upgrade.
///
/// # Errors
/// 426 (with `Upgrade` and `Sec-WebSocket-Version`) for a request that is no
/// WebSocket upgrade, 400 for a bad key, in the face's shape.
pub fn attach(req: &Request, id: String, pid: u32) -> Result<Op, Response> {
    let accept =
        ws::check_upgrade(&req.head).map_err(|r| ws::refusal(&r, error(r.status, r.message)))?;
    Ok(Op::Proc(
        id,
        ProcOp::Attach(
            pid,
            Box::new(Attach {
                accept,
                protocol: ws::offered(&req.head, PROTOCOL),
            }),
        ),
    ))
}

/// A message from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// Bytes for the process's input.
    Input(Vec<u8>),
    /// End of input.
    Eof,
    /// A terminal's new size: cols, rows.
    Resize(u16, u16),
    /// A signal's number.
    Signal(i32),
    /// Answered with a pong message.
    Ping,
}

/// Reads a client's text message.
///
/// # Errors
/// What is wrong with it, in words for the `error` event.
pub fn incoming(text: &str) -> Result<Incoming, String> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| format!("the message is not JSON: {e}"))?;
    let Value::Object(o) = v else {
        return Err("a message must be a JSON object".into());
    };
    let t = o.get("type").and_then(Value::as_str).unwrap_or("");
    match t {
        "stdin" => match o.get("data") {
            Some(Value::String(s)) => Ok(Incoming::Input(s.as_bytes().to_vec())),
            _ => Err("stdin: data must be a string".into()),
        },
        "eof" => Ok(Incoming::Eof),
        "ping" => Ok(Incoming::Ping),
        "resize" => {
            let side = |name: &str| {
                o.get(name)
                    .and_then(Value::as_u64)
                    .filter(|n| (1..=MAX_TERMINAL_SIDE).contains(n))
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or_else(|| {
                        format!(
                            "resize: {name} must be a whole number from 1 to {MAX_TERMINAL_SIDE}"
                        )
                    })
            };
            Ok(Incoming::Resize(side("cols")?, side("rows")?))
        }
        "signal" => {
            let name = o.get("signal").and_then(Value::as_str).unwrap_or("");
            processes::signal_number(name)
                .map(Incoming::Signal)
                .ok_or_else(|| format!("signal: one of {}", processes::SIGNAL_NAMES.join(", ")))
        }
        "" => Err("a message needs a string `type`: stdin, resize, signal, eof or ping".into()),
        other => {
            let shown: String = other.chars().take(32).collect();
            Err(format!(
                "unknown message type {shown:?}: send stdin, resize, signal, eof or ping"
            ))
        }
    }
}

/// Bytes of input queued for a sandbox's init past which more is refused: the sandbox
/// is not taking it (init itself takes input as it comes and keeps what a process has
/// not read in the sandbox's own memory), and the daemon holds no more for it.
pub const INPUT_BACKLOG_BYTES: usize = 1 << 20;

/// What a control message (a resize, a signal, an end of input) is counted as
/// against [`INPUT_BACKLOG_BYTES`]: about the frame it queues.
pub const CONTROL_BYTES: usize = 64;

/// Whether `len` more bytes of input may be queued behind `waiting`.
///
/// # Errors
/// The `error` event's words when they may not.
pub fn input_fits(waiting: usize, len: usize) -> Result<(), String> {
    if waiting.saturating_add(len) > INPUT_BACKLOG_BYTES {
        return Err(format!(
            "input refused: the sandbox has not taken the {waiting} bytes sent before (at most {INPUT_BACKLOG_BYTES} wait)"
        ));
    }
    Ok(())
}

/// An output message: the stream's byte, then the bytes.
pub fn output_frame(out: &mut Vec<u8>, stderr: bool, data: &[u8]) {
    let mut payload = Vec::with_capacity(data.len() + 1);
    payload.push(if stderr { STDERR } else { STDOUT });
    payload.extend_from_slice(data);
    ws::write_binary(out, &payload);
}

/// An `error` event.
pub fn error_event(message: &str) -> String {
    serde_json::json!({"type": "error", "error": message}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages_are_read_strictly() {
        assert_eq!(
            incoming(r#"{"type":"stdin","data":"ls\n"}"#),
            Ok(Incoming::Input(b"ls\n".to_vec()))
        );
        assert_eq!(incoming(r#"{"type":"eof"}"#), Ok(Incoming::Eof));
        assert_eq!(incoming(r#"{"type":"ping"}"#), Ok(Incoming::Ping));
        assert_eq!(
            incoming(r#"{"type":"resize","cols":80,"rows":24}"#),
            Ok(Incoming::Resize(80, 24))
        );
        assert_eq!(
            incoming(r#"{"type":"resize","cols":1000,"rows":1}"#),
            Ok(Incoming::Resize(1000, 1))
        );
        assert_eq!(
            incoming(r#"{"type":"signal","signal":"sigint"}"#),
            Ok(Incoming::Signal(libc::SIGINT))
        );
        for (bad, says) in [
            ("nope", "not JSON"),
            ("[1]", "JSON object"),
            ("{}", "needs a string `type`"),
            (r#"{"type":"exec"}"#, "unknown message type \"exec\""),
            (r#"{"type":"stdin"}"#, "data must be a string"),
            (r#"{"type":"stdin","data":3}"#, "data must be a string"),
            (r#"{"type":"resize","cols":0,"rows":24}"#, "cols must be"),
            (r#"{"type":"resize","cols":1001,"rows":24}"#, "cols must be"),
            (r#"{"type":"resize","cols":80,"rows":-1}"#, "rows must be"),
            (r#"{"type":"resize","cols":80}"#, "rows must be"),
            (
                r#"{"type":"signal","signal":"SIGSTOP"}"#,
                "signal: one of SIGTERM",
            ),
        ] {
            let e = incoming(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn input_waits_up_to_its_bound() {
        assert_eq!(input_fits(0, INPUT_BACKLOG_BYTES), Ok(()));
        assert_eq!(input_fits(INPUT_BACKLOG_BYTES - 1, 1), Ok(()));
        assert_eq!(input_fits(INPUT_BACKLOG_BYTES, 0), Ok(()));
        let e = input_fits(INPUT_BACKLOG_BYTES, 1).unwrap_err();
        assert!(
            e.contains(&format!("the {INPUT_BACKLOG_BYTES} bytes sent before")),
            "{e}"
        );
        assert!(input_fits(1, INPUT_BACKLOG_BYTES).is_err());
        assert!(input_fits(usize::MAX, usize::MAX).is_err());
    }

    #[test]
    fn output_carries_its_stream_first() {
        let mut out = Vec::new();
        output_frame(&mut out, false, b"hi");
        assert_eq!(out, [0x82, 3, STDOUT, b'h', b'i']);
        out.clear();
        output_frame(&mut out, true, b"");
        assert_eq!(out, [0x82, 1, STDERR]);
    }
}

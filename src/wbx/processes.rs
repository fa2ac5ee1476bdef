//! Background processes and terminals of the WBX face: each request parsed and checked
//! into a [`ProcOp`], and the process object shaped as answered.
//!
//! A background process runs on after its request is answered; its output is kept in
//! the sandbox (the last 1 MiB per stream), so a client can attach later and get the
//! output so far, then live output, then its exit.

use super::error;
use super::sandboxes::{cmd_and_cwd, env_vars, Fields, Op};
use crate::http::{Request, Response};

/// Background processes running in one sandbox at once (and starting).
pub const MAX_RUNNING: usize = 32;
/// Ended background processes a sandbox keeps (their exit and output); the oldest is
/// forgotten first.
pub const MAX_ENDED: usize = 16;
/// Clients streaming one process at once.
pub const MAX_STREAMS: usize = 8;
/// Longest tag.
const MAX_TAG_BYTES: usize = 64;
/// A terminal's largest side.
pub const MAX_TERMINAL_SIDE: u64 = 1000;

/// A background process to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// Run by `/bin/sh -c`.
    pub cmd: String,
    /// The client's label for it.
    pub tag: Option<String>,
    /// A terminal of (cols, rows) instead of pipes.
    pub pty: Option<(u16, u16)>,
    /// Input can be sent (else its stdin is empty).
    pub stdin: bool,
    /// Working directory (default: the user's home).
    pub cwd: Option<String>,
    /// Variables on top of the sandbox's.
    pub env: Vec<(String, String)>,
}

/// Input for a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// Bytes to write (UTF-8 text, as JSON carries it).
    pub data: String,
    /// Then close its stdin (a terminal gets end-of-file, Ctrl-D, instead).
    pub eof: bool,
}

/// What a process endpoint asks.
#[derive(Debug)]
pub enum ProcOp {
    /// `POST …/process`.
    Start(Box<Start>),
    /// `GET …/process`.
    List,
    /// `GET …/process/{pid}`.
    Get(u32),
    /// `DELETE …/process/{pid}`: kill it and its children (its process group).
    Kill(u32),
    /// `GET …/process/{pid}/stream`, from these offsets of stdout and stderr on
    /// (`stdout_offset`, `stderr_offset`; 0: all the ring holds).
    Stream(u32, [u64; 2]),
    /// `POST …/process/{pid}/stdin`.
    Stdin(u32, Input),
    /// `POST …/process/{pid}/signal`: the signal's number.
    Signal(u32, i32),
    /// `POST …/process/{pid}/resize`: cols, rows.
    Resize(u32, u16, u16),
    /// `GET …/process/{pid}/ws`: a WebSocket on its terminal (`super::terminal`).
    Attach(u32, Box<super::terminal::Attach>),
}

/// The signals a client may send, by name.
const SIGNALS: [(&str, i32); 4] = [
    ("SIGTERM", libc::SIGTERM),
    ("SIGINT", libc::SIGINT),
    ("SIGHUP", libc::SIGHUP),
    ("SIGKILL", libc::SIGKILL),
];

/// A signal's name as processes report it (`SIGKILL`), or `SIG<n>` for one without.
pub fn signal_name(n: i32) -> String {
    let known = [
        ("SIGHUP", libc::SIGHUP),
        ("SIGINT", libc::SIGINT),
        ("SIGQUIT", libc::SIGQUIT),
        ("SIGILL", libc::SIGILL),
        ("SIGTRAP", libc::SIGTRAP),
        ("SIGABRT", libc::SIGABRT),
        ("SIGBUS", libc::SIGBUS),
        ("SIGFPE", libc::SIGFPE),
        ("SIGKILL", libc::SIGKILL),
        ("SIGUSR1", libc::SIGUSR1),
        ("SIGSEGV", libc::SIGSEGV),
        ("SIGUSR2", libc::SIGUSR2),
        ("SIGPIPE", libc::SIGPIPE),
        ("SIGALRM", libc::SIGALRM),
        ("SIGTERM", libc::SIGTERM),
        ("SIGXCPU", libc::SIGXCPU),
        ("SIGXFSZ", libc::SIGXFSZ),
        ("SIGSYS", libc::SIGSYS),
    ];
    known
        .iter()
        .find(|(_, v)| *v == n)
        .map_or_else(|| format!("SIG{n}"), |(name, _)| (*name).to_string())
}

/// A process id in a path: a positive decimal number. Anything else is no process.
pub fn parse_pid(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u32>()
        .ok()
        .filter(|&p| p > 0 && p <= i32::MAX as u32)
}

/// The offsets a stream starts at: `?stdout_offset=N&stderr_offset=M` (each a whole
/// number of bytes, default 0).
pub fn stream_offsets(req: &Request) -> Result<[u64; 2], Response> {
    let mut from = [0u64; 2];
    for (i, name) in ["stdout_offset", "stderr_offset"].iter().enumerate() {
        if let Some(v) = req.head.query_param(name).filter(|v| !v.is_empty()) {
            from[i] = v.parse::<u64>().map_err(|_| {
                error(
                    400,
                    &format!(
                        "{name}: a whole number of bytes (the offset of the last line received)"
                    ),
                )
            })?;
        }
    }
    Ok(from)
}

/// The 404 for a process the sandbox does not have (or no longer keeps).
pub fn no_such_process(pid: u32) -> Response {
    error(404, &format!("no such process: {pid}"))
}

/// `POST …/process`.
pub fn start(req: &Request, id: String) -> Result<Op, Response> {
    let f = Fields::of(req, &["cmd", "tag", "pty", "stdin", "cwd", "env"])?;
    let (cmd, cwd) = cmd_and_cwd(&f)?;
    let tag = f.string("tag")?;
    if let Some(t) = &tag {
        if t.len() > MAX_TAG_BYTES || t.chars().any(char::is_control) {
            return Err(error(
                400,
                &format!("tag: at most {MAX_TAG_BYTES} bytes, without control characters"),
            ));
        }
    }
    let stdin = boolean(&f, "stdin")?.unwrap_or(false);
    let pty = match f.0.get("pty").filter(|v| !v.is_null()) {
        None => None,
        Some(serde_json::Value::Object(m)) => {
            if let Some(k) = m.keys().find(|k| !["cols", "rows"].contains(&k.as_str())) {
                return Err(error(
                    400,
                    &format!("pty: unknown field `{k}`; it takes cols, rows"),
                ));
            }
            let side = |name: &str| -> Result<u16, Response> {
                m.get(name)
                    .and_then(serde_json::Value::as_u64)
                    .filter(|n| (1..=MAX_TERMINAL_SIDE).contains(n))
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or_else(|| {
                        error(
                            400,
                            &format!("pty.{name}: required, a whole number from 1 to {MAX_TERMINAL_SIDE}"),
                        )
                    })
            };
            Some((side("cols")?, side("rows")?))
        }
        Some(_) => {
            return Err(error(
                400,
                "pty: must be an object like {\"cols\": 120, \"rows\": 30}",
            ))
        }
    };
    let env = env_vars(f.strings("env")?)?;
    Ok(Op::Proc(
        id,
        ProcOp::Start(Box::new(Start {
            cmd,
            tag,
            pty,
            stdin,
            cwd,
            env,
        })),
    ))
}

fn boolean(f: &Fields, name: &str) -> Result<Option<bool>, Response> {
    if f.absent(name) {
        return Ok(None);
    }
    f.0[name]
        .as_bool()
        .map(Some)
        .ok_or_else(|| error(400, &format!("{name}: must be true or false")))
}

/// `POST …/process/{pid}/stdin`: `{"data": "…"}`, `{"eof": true}`, or both (the data,
/// then the end).
pub fn stdin(req: &Request, id: String, pid: u32) -> Result<Op, Response> {
    let f = Fields::of(req, &["data", "eof"])?;
    let data = f.string("data")?.unwrap_or_default();
    let eof = boolean(&f, "eof")?.unwrap_or(false);
    if data.is_empty() && !eof {
        return Err(error(
            400,
            "data: required (the text to send), unless eof is true",
        ));
    }
    Ok(Op::Proc(id, ProcOp::Stdin(pid, Input { data, eof })))
}

/// `POST …/process/{pid}/signal`.
pub fn signal(req: &Request, id: String, pid: u32) -> Result<Op, Response> {
    let f = Fields::of(req, &["signal"])?;
    let names = SIGNAL_NAMES.join(", ");
    let Some(name) = f.string("signal")? else {
        return Err(error(400, &format!("signal: required, one of {names}")));
    };
    match signal_number(&name) {
        Some(num) => Ok(Op::Proc(id, ProcOp::Signal(pid, num))),
        None => Err(error(
            400,
            &format!("signal: {name:?} is not one of {names}"),
        )),
    }
}

/// The signals a client may send, by name.
pub const SIGNAL_NAMES: [&str; 4] = [SIGNALS[0].0, SIGNALS[1].0, SIGNALS[2].0, SIGNALS[3].0];

/// The number of a signal a client may send, by its name in any case, with or without
/// `SIG`.
pub fn signal_number(name: &str) -> Option<i32> {
    let want = name.to_ascii_uppercase();
    let want = if want.starts_with("SIG") {
        want
    } else {
        format!("SIG{want}")
    };
    SIGNALS
        .iter()
        .find(|(n, _)| *n == want)
        .map(|&(_, num)| num)
}

/// `POST …/process/{pid}/resize`.
pub fn resize(req: &Request, id: String, pid: u32) -> Result<Op, Response> {
    let f = Fields::of(req, &["cols", "rows"])?;
    let side = |name: &str| -> Result<u16, Response> {
        let what = format!("a whole number from 1 to {MAX_TERMINAL_SIDE}");
        match f.whole(name, &what)? {
            Some(n) if (1..=MAX_TERMINAL_SIDE).contains(&n) => {
                Ok(u16::try_from(n).unwrap_or(u16::MAX))
            }
            _ => Err(error(400, &format!("{name}: required, {what}"))),
        }
    };
    Ok(Op::Proc(
        id,
        ProcOp::Resize(pid, side("cols")?, side("rows")?),
    ))
}

/// `POST …/env`.
pub fn env(req: &Request, id: String) -> Result<Op, Response> {
    let f = Fields::of(req, &["env"])?;
    if f.absent("env") {
        return Err(error(400, "env: required, an object of variables"));
    }
    Ok(Op::Env(id, env_vars(f.strings("env")?)?))
}

/// What the process object holds.
pub struct View<'a> {
    /// Its pid in the sandbox.
    pub pid: u32,
    /// The client's label.
    pub tag: Option<&'a str>,
    /// Its command line.
    pub cmd: &'a str,
    /// Its terminal (cols, rows), if it has one.
    pub pty: Option<(u16, u16)>,
    /// Input can still be sent.
    pub stdin: bool,
    /// Started, Unix ms.
    pub started_ms: u64,
    /// How it ended (exit code, signal) and when (Unix ms).
    pub ended: Option<(i32, Option<i32>, u64)>,
}

/// The process object.
pub fn process_json(v: &View<'_>) -> serde_json::Value {
    let (state, exit_code, signal, ended_at) = match v.ended {
        None => ("running", None, None, None),
        Some((code, sig, at)) => (
            "exited",
            Some(code),
            sig.map(signal_name),
            Some(super::timestamp(at)),
        ),
    };
    serde_json::json!({
        "pid": v.pid,
        "tag": v.tag,
        "cmd": v.cmd,
        "pty": v.pty.map(|(cols, rows)| serde_json::json!({"cols": cols, "rows": rows})),
        "stdin": v.stdin,
        "state": state,
        "exit_code": exit_code,
        "signal": signal,
        "started_at": super::timestamp(v.started_ms),
        "ended_at": ended_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Params;

    fn req(body: &str) -> Request {
        Request {
            head: crate::http::parse::parse_head(b"POST / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap(),
            body: body.as_bytes().to_vec(),
            tenant: "t".into(),
            params: Params::default(),
        }
    }

    fn message(r: Response) -> String {
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        v["error"].as_str().unwrap().to_string()
    }

    #[test]
    fn test_pids_in_paths() {
        assert_eq!(parse_pid("123"), Some(123));
        assert_eq!(parse_pid("2147483647"), Some(i32::MAX as u32));
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            "1.0",
            "2147483648",
            "99999999999",
            "1a",
            " 1",
        ] {
            assert_eq!(parse_pid(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn test_start_fields() {
        let Ok(Op::Proc(_, ProcOp::Start(s))) = start(
            &req(r#"{"cmd":"python3 -i","tag":"py","pty":{"cols":120,"rows":30},"stdin":true}"#),
            "sb".into(),
        ) else {
            panic!()
        };
        assert_eq!(
            (s.tag.as_deref(), s.pty, s.stdin),
            (Some("py"), Some((120, 30)), true)
        );
        for (body, msg) in [
            (r#"{}"#, "cmd: required"),
            (
                r#"{"cmd":"x","pty":{"cols":0,"rows":30}}"#,
                "pty.cols: required, a whole number from 1 to 1000",
            ),
            (
                r#"{"cmd":"x","pty":{"cols":1001,"rows":30}}"#,
                "pty.cols: required, a whole number from 1 to 1000",
            ),
            (
                r#"{"cmd":"x","pty":{"cols":80}}"#,
                "pty.rows: required, a whole number from 1 to 1000",
            ),
            (
                r#"{"cmd":"x","pty":{"cols":80,"rows":24,"x":1}}"#,
                "pty: unknown field `x`; it takes cols, rows",
            ),
            (
                r#"{"cmd":"x","pty":true}"#,
                "pty: must be an object like {\"cols\": 120, \"rows\": 30}",
            ),
            (
                r#"{"cmd":"x","stdin":"yes"}"#,
                "stdin: must be true or false",
            ),
            (
                r#"{"cmd":"x","tag":"a\nb"}"#,
                "tag: at most 64 bytes, without control characters",
            ),
        ] {
            match start(&req(body), "sb".into()) {
                Err(r) => assert_eq!((r.status, message(r)), (400, msg.to_string()), "{body}"),
                Ok(op) => panic!("{body}: {op:?}"),
            }
        }
        let tag = "t".repeat(64);
        assert!(start(
            &req(&format!(r#"{{"cmd":"x","tag":"{tag}"}}"#)),
            "sb".into()
        )
        .is_ok());
        assert!(start(
            &req(&format!(r#"{{"cmd":"x","tag":"{tag}t"}}"#)),
            "sb".into()
        )
        .is_err());
        assert!(start(
            &req(r#"{"cmd":"x","pty":{"cols":1000,"rows":1}}"#),
            "sb".into()
        )
        .is_ok());
    }

    #[test]
    fn test_signals_stdin_resize_env() {
        for (name, num) in [("SIGTERM", 15), ("sigint", 2), ("HUP", 1), ("SIGKILL", 9)] {
            assert!(
                matches!(signal(&req(&format!(r#"{{"signal":"{name}"}}"#)), "s".into(), 1), Ok(Op::Proc(_, ProcOp::Signal(1, n))) if n == num),
                "{name}"
            );
        }
        let r = signal(&req(r#"{"signal":"SIGSTOP"}"#), "s".into(), 1).unwrap_err();
        assert_eq!(
            message(r),
            "signal: \"SIGSTOP\" is not one of SIGTERM, SIGINT, SIGHUP, SIGKILL"
        );
        assert!(matches!(
            stdin(&req(r#"{"eof":true}"#), "s".into(), 1),
            Ok(Op::Proc(_, ProcOp::Stdin(1, Input { eof: true, .. })))
        ));
        assert_eq!(
            message(stdin(&req(r#"{"data":""}"#), "s".into(), 1).unwrap_err()),
            "data: required (the text to send), unless eof is true"
        );
        assert!(matches!(
            resize(&req(r#"{"cols":160,"rows":40}"#), "s".into(), 1),
            Ok(Op::Proc(_, ProcOp::Resize(1, 160, 40)))
        ));
        assert_eq!(
            message(resize(&req(r#"{"cols":160}"#), "s".into(), 1).unwrap_err()),
            "rows: required, a whole number from 1 to 1000"
        );
        assert_eq!(
            message(env(&req(r#"{}"#), "s".into()).unwrap_err()),
            "env: required, an object of variables"
        );
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(64), "SIG64");
    }
}

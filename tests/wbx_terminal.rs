//! A process's terminal over a WebSocket (`GET /wbx/v1/sandboxes/{id}/process/{pid}/ws`,
//! an isobox extension beside the WBX face), against the real daemon with real runsc:
//! a real client (`tests/python/terminal_ws.py`, the `websockets` package) types into
//! an interactive bash, resizes it, interrupts it, attaches twice, ends it; a process
//! without a terminal keeps stdout and stderr apart; keys come as a subprotocol (as a
//! browser must send them) or a header; the message size and clients-per-process
//! limits at and above their bounds; a paused sandbox refuses input and a deleted one
//! ends its terminals. Requests that are no upgrade, and unknown processes, get the
//! face's errors.

mod common;
use common::wbx::{err, wbx};
use common::Daemon;
use serde_json::{json, Value};

const KEY: &str = "terminal-test-key";

fn daemon() -> Daemon {
    let d = Daemon::start_with(&[("ISOBOX_API_KEYS", KEY)]);
    d.wait_ready();
    d
}

fn sandbox(d: &Daemon) -> String {
    let body = json!({"template": "base", "network": {"mode": "none"}});
    let r = wbx(d, "POST", "/v1/sandboxes", Some(KEY), Some(&body));
    assert_eq!(r.status, 201, "{}\nlog:\n{}", r.text(), d.log());
    r.json()["id"].as_str().unwrap().to_string()
}

fn start(d: &Daemon, id: &str, body: &Value) -> u64 {
    let r = wbx(
        d,
        "POST",
        &format!("/v1/sandboxes/{id}/process"),
        Some(KEY),
        Some(body),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["pid"].as_u64().unwrap()
}

/// An interactive bash on a terminal, its prompt `ready> `, without job control (as
/// the UI's console starts it: gVisor tells a terminal's foreground process group
/// only inside its session, so Ctrl-C reaches the shell's own group, and a job of a
/// shell with job control would not get it).
fn bash(d: &Daemon, id: &str) -> u64 {
    start(
        d,
        id,
        &json!({"cmd": "PS1='ready> ' PROMPT_COMMAND='set +m; unset PROMPT_COMMAND' exec bash --noprofile --norc -i", "pty": {"cols": 80, "rows": 24}}),
    )
}

/// What a command's output shows after the terminal's echo of the command line.
fn after<'a>(v: &'a Value, field: &str, cmd: &str) -> &'a str {
    let s = v[field].as_str().unwrap_or_else(|| panic!("{field}: {v}"));
    let at = s
        .find(cmd)
        .unwrap_or_else(|| panic!("{field} has no echo of {cmd:?}: {s:?}"));
    &s[at + cmd.len()..]
}

fn scenario(d: &Daemon, id: &str, pid: u64, name: &str) -> Value {
    scenario_env(d, id, pid, name, &[])
}

fn scenario_env(d: &Daemon, id: &str, pid: u64, name: &str, env: &[(&str, &str)]) -> Value {
    let base = format!("http://{}/wbx", d.addr);
    let pid = pid.to_string();
    common::python_client(
        d,
        "terminal_ws.py",
        name,
        &[&base, id, &pid, name, KEY],
        env,
    )
}

fn error_event(v: &Value, says: &str) {
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(e.contains(says), "{e:?} should say {says:?}");
}

#[test]
fn test_a_browser_terminal_types_resizes_interrupts_and_ends() {
    let d = daemon();
    let id = sandbox(&d);
    let pid = bash(&d, &id);
    let v = scenario(&d, &id, pid, "shell");
    assert_eq!(v["subprotocol"], "isobox.terminal", "{v}");
    // (bash frames a command's run with bracketed-paste switches, ESC [?2004l.)
    let echo = after(&v, "echo", "echo hi\r\n");
    assert!(
        echo.contains("\rhi\r\n") || echo.starts_with("hi\r\n"),
        "{echo:?}"
    );
    let size = after(&v, "size", "stty size\r\n");
    assert!(size.contains("30 100\r\n"), "{size:?}");
    error_event(&v["bad_json"], "not JSON");
    error_event(
        &v["bad_resize"],
        "cols must be a whole number from 1 to 1000",
    );
    error_event(&v["bad_type"], "unknown message type \"launch\"");
    error_event(
        &v["bad_signal"],
        "signal: one of SIGTERM, SIGINT, SIGHUP, SIGKILL",
    );
    assert_eq!(v["pong"], json!({"type": "pong"}));
    assert_eq!(v["ping_frame_answered"], true);
    let utf8 = after(&v, "utf8", "echo \u{e9}t\u{e9}\r\n");
    assert!(utf8.contains("\u{e9}t\u{e9}\r\n"), "{utf8:?}");
    // The second client got the earlier output before the live line.
    assert!(v["replay"].as_str().unwrap().contains("hi\r\n"), "{v}");
    assert!(v["live_first"].as_str().unwrap().ends_with("both\r\n"));
    assert!(v["live_second"].as_str().unwrap().ends_with("both\r\n"));
    for (exit, close) in [("exit", "close"), ("exit_second", "close_second")] {
        assert_eq!(v[exit]["type"], "exit", "{v}");
        assert_eq!(v[exit]["exit_code"], 0, "{v}");
        assert!(v[exit]["signal"].is_null(), "{v}");
        assert!(v[exit]["duration_ms"].as_u64().is_some(), "{v}");
        assert_eq!(v[close], 1000, "{v}");
    }
    // A terminal writes everything to one stream.
    assert_eq!(v["streams"], json!([1]), "{v}");
    assert_eq!(v["after_exit"]["type"], "exit", "{v}");
    assert_eq!(v["after_exit_close"], 1000, "{v}");
    assert_eq!(v["after_exit_output_has_hi"], true, "{v}");
    // The ended process is still listed, with the exit the terminals saw.
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/sandboxes/{id}/process/{pid}"),
        Some(KEY),
        None,
    );
    assert_eq!(r.json()["exit_code"], 0, "{}", r.text());
    let r = wbx(
        &d,
        "DELETE",
        &format!("/v1/sandboxes/{id}"),
        Some(KEY),
        None,
    );
    assert_eq!(r.status, 204);
    d.stop();
}

#[test]
fn test_a_process_without_terminal_keys_limits_and_errors() {
    let d = daemon();
    let id = sandbox(&d);
    let pid = start(
        &d,
        &id,
        &json!({"cmd": "read x; echo \"out:$x\"; echo \"err:$x\" >&2", "stdin": true}),
    );
    let v = scenario(&d, &id, pid, "pipes");
    // Not offered, not chosen.
    assert!(v["subprotocol"].is_null(), "{v}");
    error_event(&v["resize"], &format!("process {pid} has no terminal"));
    assert_eq!(v["stdout"], "out:abc\n");
    assert_eq!(v["stderr"], "err:abc\n");
    assert_eq!(v["exit"]["exit_code"], 0, "{v}");
    assert_eq!(v["close"], 1000);
    assert_eq!(v["streams"], json!([1, 2]), "{v}");

    let sink = start(&d, &id, &json!({"cmd": "cat >/dev/null", "stdin": true}));
    let v = scenario(&d, &id, sink, "refusals");
    assert_eq!(v["no_key"], 401, "{v}");
    assert_eq!(v["wrong_key"], 401, "{v}");
    assert_eq!(v["wrong_header"], 401, "{v}");
    assert_eq!(v["at_bound"], json!({"type": "pong"}), "{v}");
    assert_eq!(v["above_bound_close"], 1009, "{v}");
    assert_eq!(v["eight"], 8, "{v}");
    assert_eq!(v["ninth"], 429, "{v}");
    assert_eq!(
        v["ninth_body"],
        json!({"error": format!("too many clients streaming process {sink} (limit 8)")})
    );

    // Not an upgrade: 426 saying what would work, in the face's shape.
    let ws = format!("/v1/sandboxes/{id}/process/{sink}/ws");
    let r = wbx(&d, "GET", &ws, Some(KEY), None);
    assert_eq!(r.status, 426, "{}", r.text());
    assert_eq!(r.header("upgrade"), Some("websocket"));
    assert!(err(&r).contains("WebSocket"), "{}", r.text());
    // An upgrade to a process that is not there; to a sandbox that is not there.
    let upgrade = |path: &str| {
        let raw = common::ws_upgrade(
            &format!("/wbx{path}"),
            &format!("Authorization: Bearer {KEY}\r\n"),
        );
        common::raw_exchange(d.addr, raw.as_bytes())
            .pop()
            .expect("an answer")
    };
    let r = upgrade(&format!("/v1/sandboxes/{id}/process/999999/ws"));
    assert_eq!((r.status, err(&r)), (404, "no such process: 999999".into()));
    let r = upgrade("/v1/sandboxes/sb_nothere/process/1/ws");
    assert_eq!(r.status, 404, "{}", r.text());
    let r = wbx(
        &d,
        "DELETE",
        &format!("/v1/sandboxes/{id}"),
        Some(KEY),
        None,
    );
    assert_eq!(r.status, 204);
    d.stop();
}

#[test]
fn test_a_paused_sandbox_refuses_input_and_a_deleted_one_ends_its_terminal() {
    let d = daemon();
    let id = sandbox(&d);
    let pid = bash(&d, &id);
    let v = scenario(&d, &id, pid, "lifecycle");
    assert_eq!(v["pause"], 200, "{v}");
    error_event(&v["paused_input"], "the sandbox is paused");
    assert_eq!(v["resume"], 200, "{v}");
    assert!(
        v["resumed"].as_str().unwrap().contains("resumed\r\n"),
        "{v}"
    );
    assert_eq!(v["delete"], 204, "{v}");
    assert_eq!(v["deleted_event"]["type"], "error", "{v}");
    assert_eq!(v["deleted_close"], 1011, "{v}");
    d.stop();
}

/// Reads one server frame (unmasked) from `s`: (opcode, payload).
fn read_frame(s: &mut std::net::TcpStream) -> Option<(u8, Vec<u8>)> {
    use std::io::Read;
    let mut h = [0u8; 2];
    s.read_exact(&mut h).ok()?;
    let mut len = u64::from(h[1] & 0x7f);
    if len == 126 {
        let mut b = [0u8; 2];
        s.read_exact(&mut b).ok()?;
        len = u64::from(u16::from_be_bytes(b));
    } else if len == 127 {
        let mut b = [0u8; 8];
        s.read_exact(&mut b).ok()?;
        len = u64::from_be_bytes(b);
    }
    let mut p = vec![0u8; usize::try_from(len).ok()?];
    s.read_exact(&mut p).ok()?;
    Some((h[0] & 0x0f, p))
}

#[test]
fn test_a_quiet_terminal_is_pinged_and_kept_and_a_silent_client_is_dropped() {
    use std::io::{BufRead, Write};
    use std::time::{Duration, Instant};
    // A short idle time, so that both outcomes show within seconds.
    let d = Daemon::start_with(&[("ISOBOX_API_KEYS", KEY), ("ISOBOX_IDLE_TIMEOUT_MS", "1000")]);
    d.wait_ready();
    let id = sandbox(&d);
    let pid = start(&d, &id, &json!({"cmd": "cat >/dev/null", "stdin": true}));
    // A client that answers pings (the websockets package does): still there after
    // five idle times of silence, and working.
    let v = scenario_env(&d, &id, pid, "quiet", &[("QUIET_SECONDS", "5")]);
    assert_eq!(v["after_quiet"], json!({"type": "pong"}), "{v}");
    // A client that never answers: pinged once the idle time passes, then closed
    // with 1001 when the next one passes without a word.
    let mut s = std::net::TcpStream::connect(d.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = common::ws_upgrade(
        &format!("/wbx/v1/sandboxes/{id}/process/{pid}/ws"),
        &format!("Authorization: Bearer {KEY}\r\n"),
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 101"), "{line}");
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        assert!(
            !line
                .to_ascii_lowercase()
                .starts_with("sec-websocket-protocol"),
            "{line}"
        );
    }
    let t0 = Instant::now();
    let mut s = r.into_inner();
    let (op, _) = read_frame(&mut s).expect("a ping");
    assert_eq!(op, 9, "a ping first");
    let pinged = t0.elapsed();
    assert!(
        pinged >= Duration::from_millis(800),
        "pinged after {pinged:?}"
    );
    let (op, p) = read_frame(&mut s).expect("a close");
    assert_eq!((op, u16::from_be_bytes([p[0], p[1]])), (8, 1001));
    assert!(t0.elapsed() >= pinged + Duration::from_millis(800));
    assert!(read_frame(&mut s).is_none(), "then the connection ends");
    // The protocol's rules on raw frames, as on the eryx stream (one decoder and one
    // pump serve both): an unmasked frame is 1002, text that is not UTF-8 is 1007,
    // a ping of 126 bytes is 1002; each closes the connection, and the process lives on.
    let masked = |op: u8, payload: &[u8]| {
        let mut f = vec![0x80 | op, 0x80 | u8::try_from(payload.len()).unwrap()];
        let key = [1u8, 2, 3, 4];
        f.extend_from_slice(&key);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        f
    };
    let mut ping126 = vec![0x89, 0xfe, 0x00, 126, 1, 2, 3, 4];
    ping126.extend(std::iter::repeat_n(0u8, 126));
    for (frame, code) in [
        (b"\x81\x05hello".to_vec(), 1002),
        (masked(0x1, b"\xff\xfe"), 1007),
        (ping126, 1002),
    ] {
        let mut s = raw_terminal(&d, &id, pid);
        s.write_all(&frame).unwrap();
        let (op, p) = read_frame(&mut s).expect("a close");
        assert_eq!(
            (op, u16::from_be_bytes([p[0], p[1]])),
            (8, code),
            "{frame:02x?}"
        );
        assert!(read_frame(&mut s).is_none(), "then the connection ends");
    }
    let p = wbx(
        &d,
        "GET",
        &format!("/v1/sandboxes/{id}/process/{pid}"),
        Some(KEY),
        None,
    );
    assert_eq!(p.json()["state"], "running", "{}", p.text());
    let r = wbx(
        &d,
        "DELETE",
        &format!("/v1/sandboxes/{id}"),
        Some(KEY),
        None,
    );
    assert_eq!(r.status, 204);
    d.stop();
}

/// A raw WebSocket on process `pid`'s terminal, its 101 read.
fn raw_terminal(d: &Daemon, id: &str, pid: u64) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(d.addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let req = common::ws_upgrade(
        &format!("/wbx/v1/sandboxes/{id}/process/{pid}/ws"),
        &format!("Authorization: Bearer {KEY}\r\n"),
    );
    s.write_all(req.as_bytes()).unwrap();
    let head = common::read_head(&mut s);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s
}

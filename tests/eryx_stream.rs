//! The eryx face's WebSocket, `/eryx/v1/stream` (eryx-api.md, *Callbacks*): the
//! document's example client run unchanged (only its base URL set), callbacks
//! gathered and answered in any order, 100 calls and the 101st, the callback timeout,
//! `TypeError` and `NameError`, errors answered, messages mid-run ignored, bad messages
//! answered with `error` on a connection that stays open, a client that leaves
//! mid-run, the concurrency and rate limits, authentication on the upgrade, and the
//! protocol's own rules (masking, sizes, ping, close) on raw frames.

mod common;
use common::{Daemon, RawWs};
use serde_json::Value;
use std::io::Write;
use std::time::Duration;

const KEY: &str = "eryx_streamkey";

fn ws_url(d: &Daemon) -> String {
    format!("ws://{}/eryx/v1/stream", d.addr)
}

/// Runs a scenario of `tests/python/eryx_ws.py` against `d`: what it saw.
fn scenario(d: &Daemon, name: &str, key: Option<&str>) -> Value {
    let url = ws_url(d);
    let mut args = vec![url.as_str(), name];
    args.extend(key);
    common::python_client(d, "eryx_ws.py", name, &args, &[])
}

/// A completed run's fields, exactly the document's.
fn completed(v: &Value, status: &str) {
    assert_eq!(v["type"], "completed", "{v}");
    assert_eq!(v["status"], status, "{v}");
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    let want: &[&str] = if status == "success" {
        &["compute_units", "status", "stderr", "stdout", "type"]
    } else {
        &[
            "compute_units",
            "error",
            "status",
            "stderr",
            "stdout",
            "type",
        ]
    };
    assert_eq!(keys, want, "{v}");
    assert!(v["compute_units"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn test_the_documents_example_client_runs_unchanged() {
    let d = Daemon::start_with(&[("ISOBOX_API_KEYS", KEY)]);
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/seeds/eryx-api.md"
    ))
    .or_else(|_| std::fs::read_to_string("/work/shared/seeds/eryx-api.md"))
    .ok();
    // The document's client as the document shows it; the copy in this repository
    // is checked against the document when the document is there.
    let ours = include_str!("python/eryx_doc_client.py");
    if let Some(doc) = doc {
        let start = doc.find("### Example client").unwrap();
        let block = &doc[start..];
        let code_start = block.find("```python\n").unwrap() + "```python\n".len();
        let code_end = block[code_start..].find("```").unwrap();
        assert_eq!(&block[code_start..code_start + code_end], ours);
    }
    // Only its base URL changes, as for any client of the document.
    let client = ours.replace("wss://api.dev.eryx.run", &format!("ws://{}/eryx", d.addr));
    assert_ne!(client, ours);
    // The client, run as its document shows: Python with the key in its environment.
    let run_client = |code: &str, key: &str| {
        std::process::Command::new(common::test_python())
            .arg("-c")
            .arg(code)
            .env("ERYX_API_KEY", key)
            .output()
            .unwrap()
    };
    let out = run_client(&client, KEY);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}\nlog:\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    // print(status, stdout, error): the run's own output ends in a newline.
    assert_eq!(stdout, "success Hello, Ada\n \n");

    // The same client, other code: a call with arguments near their bound and 3 MB of
    // output. That client takes messages of up to 1 MiB (the `websockets` default):
    // each message fits, the output cut and saying so, and the client runs to its end.
    let big = client.replace(
        "user = await get_user(id=123)",
        "user = await get_user(id=123, pad='y' * ((1 << 20) - 5000))\nprint('x' * 3000000)",
    );
    assert_ne!(big, client);
    let out = run_client(&big, KEY);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\nlog:\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    assert!(
        stdout.starts_with("success xxxx"),
        "{}",
        &stdout[..100.min(stdout.len())]
    );
    assert!(
        stdout.contains(
            "[output cut to fit a 1 MiB WebSocket message; POST /v1/execute returns it whole]"
        ),
        "{}",
        &stdout[stdout.len().saturating_sub(300)..]
    );

    // The same client with a wrong key: the upgrade is refused, in the face's shape.
    let out = run_client(&client, "eryx_wrong");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("HTTP 401"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (auth, code) in [
        (None, "missing_auth"),
        (Some("Basic abc"), "invalid_auth"),
        (Some("Bearer eryx_wrong"), "invalid_key"),
    ] {
        let (status, body) = upgrade_refused(&d, auth);
        assert_eq!(status, 401);
        assert_eq!(body["error"]["code"], code, "{body}");
    }
    d.stop();
}

/// Sends an upgrade with `auth` and reads the refusal: its status and JSON body.
fn upgrade_refused(d: &Daemon, auth: Option<&str>) -> (u16, Value) {
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    let req = common::ws_upgrade("/eryx/v1/stream", &auth);
    let r = common::raw_exchange(d.addr, req.as_bytes());
    (r[0].status, r[0].json())
}

#[test]
fn test_a_session_over_the_websocket_with_callbacks() {
    let d = Daemon::start();
    let v = scenario(&d, "session", None);
    // A callback's answer kept as session state; the callback itself is not.
    completed(&v["first"], "success");
    completed(&v["second"], "success");
    assert_eq!(v["second"]["stdout"], "Ada 7 False\n", "{v}");
    // An unknown session and another environment: `error`, and the connection runs
    // the next execute.
    assert_eq!(v["unknown"]["type"], "error", "{v}");
    assert_eq!(v["unknown"]["code"], "not_found", "{v}");
    assert_eq!(v["other_env"]["type"], "error", "{v}");
    assert_eq!(v["other_env"]["code"], "invalid_request", "{v}");
    completed(&v["after"], "success");
    assert_eq!(v["after"]["stdout"], "3\n");
    // The same state over HTTP.
    assert_eq!(v["http"]["stdout"], "Ada\n", "{v}");
    d.stop();
}

#[test]
fn test_callbacks_in_any_order_limits_errors_and_bad_messages() {
    let d = Daemon::start_with(&[("ISOBOX_ERYX_CALLBACK_TIMEOUT_MS", "1500")]);
    let v = scenario(&d, "callbacks", None);

    completed(&v["gather"], "success");
    assert_eq!(v["gather"]["stdout"], "[0, 2, 4, 6, 8]\n");
    let xs: Vec<u64> = v["gather_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["x"].as_u64().unwrap())
        .collect();
    let mut sorted = xs.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![0, 1, 2, 3, 4], "{xs:?}");
    assert_eq!(v["gather_ids_unique"], true);

    // JSON comes back as Python values; waiting a second costs no compute units.
    completed(&v["fast"], "success");
    completed(&v["slow"], "success");
    assert_eq!(
        v["fast"]["stdout"],
        "{'k': 'a', 'n': [1, 2.5, None, True]}\n"
    );
    assert_eq!(v["fast"]["compute_units"], v["slow"]["compute_units"]);
    assert!(v["slow_wall_s"].as_f64().unwrap() >= 1.0);

    // 100 calls, then the 101st raises RuntimeError and never reaches the client.
    completed(&v["hundred"], "success");
    assert_eq!(
        v["hundred"]["stdout"],
        "101st: Callback limit exceeded (100 invocations)\n"
    );
    assert_eq!(v["hundred_calls"], 100);

    completed(&v["positional"], "error");
    assert!(
        v["positional"]["error"]
            .as_str()
            .unwrap()
            .ends_with("TypeError: get_user() takes 0 positional arguments but 1 was given\n"),
        "{}",
        v["positional"]
    );
    assert_eq!(v["positional_calls"], 0);

    completed(&v["unlisted"], "error");
    assert!(
        v["unlisted"]["error"]
            .as_str()
            .unwrap()
            .contains("NameError: name 'send_email' is not defined"),
        "{}",
        v["unlisted"]
    );

    // An error answer raises RuntimeError with its message; the traceback shows the
    // code's own line, not the callback machinery.
    completed(&v["error_answer"], "error");
    let tb = v["error_answer"]["error"].as_str().unwrap();
    assert_eq!(
        tb,
        "Traceback (most recent call last):\n  File \"<user>\", line 5, in <module>\nRuntimeError: No such user\n"
    );

    completed(&v["unanswered"], "error");
    assert!(
        v["unanswered"]["error"]
            .as_str()
            .unwrap()
            .ends_with("RuntimeError: get_user() got no answer within 1.5 s\n"),
        "{}",
        v["unanswered"]
    );
    let waited = v["unanswered_wall_s"].as_f64().unwrap();
    assert!((1.4..10.0).contains(&waited), "{waited}");

    completed(&v["noisy"], "success");
    assert_eq!(v["noisy"]["stdout"], "7\n");
    completed(&v["after_noisy"], "success");
    assert_eq!(v["after_noisy"]["stdout"], "next\n");
    assert_eq!(v["extra"], Value::Null, "{}", v["extra"]);

    let errors = v["errors"].as_array().unwrap();
    let codes: Vec<&str> = errors
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "error", "{e}");
            assert!(!e["message"].as_str().unwrap().is_empty(), "{e}");
            e["code"].as_str().unwrap()
        })
        .collect();
    let mut want = vec!["invalid_request"; 10];
    want.extend([
        "not_found",
        "invalid_request",
        "not_found",
        "invalid_request",
    ]);
    assert_eq!(codes, want, "{errors:?}");
    assert_eq!(errors[10]["message"], "No such session: s1");

    completed(&v["hundred_listed"], "success");
    assert_eq!(v["hundred_listed"]["stdout"], "f99\n");
    assert_eq!(d.get("/healthz").status, 200);
    d.stop();
}

#[test]
fn test_a_client_that_leaves_mid_run_and_the_concurrency_limit() {
    // A long callback timeout: the run of a client that left must end well before it.
    let d = Daemon::start_with(&[
        ("ISOBOX_ERYX_CONCURRENCY", "1"),
        ("ISOBOX_ERYX_CALLBACK_TIMEOUT_MS", "60000"),
    ]);
    let v = scenario(&d, "concurrency", None);
    assert_eq!(v["b"]["type"], "error", "{v}");
    assert_eq!(v["b"]["code"], "concurrency_limit");
    assert_eq!(
        v["b"]["message"],
        "Too many concurrent executions (limit: 1)"
    );
    completed(&v["a"], "success");
    assert_eq!(v["a"]["stdout"], "done\n");
    completed(&v["b_after"], "success");

    let v = scenario(&d, "disconnect", None);
    assert_eq!(v["first"], "callback");
    completed(&v["after"], "success");
    assert_eq!(v["after"]["stdout"], "after\n");
    let waited = v["waited_s"].as_f64().unwrap();
    assert!(waited < 20.0, "the left run held its slot {waited} s");
    // The left run went on: its first call failed at once, it printed, called again
    // (which failed too) and ended as an error.
    let log = d.log();
    assert!(log.contains("client left during run"), "{log}");
    assert_eq!(d.get("/healthz").status, 200);
    d.stop();
}

#[test]
fn test_each_execute_counts_against_the_rate() {
    // The upgrade takes one token, each execute one more: 1 + 2 fit a burst of 3 (the
    // face's bucket: per tenant, and without keys per client address).
    let d = Daemon::start_with(&[
        ("ISOBOX_ERYX_RATE_PER_MIN", "1"),
        ("ISOBOX_ERYX_RATE_BURST", "3"),
    ]);
    let v = scenario(&d, "rate", None);
    let runs = v.as_array().unwrap();
    completed(&runs[0], "success");
    completed(&runs[1], "success");
    for r in &runs[2..] {
        assert_eq!(r["type"], "error", "{r}");
        assert_eq!(r["code"], "rate_limit_exceeded", "{r}");
    }
    // And a new connection is refused at its upgrade, with Retry-After.
    let req = common::ws_upgrade("/eryx/v1/stream", "");
    let r = common::raw_exchange(d.addr, req.as_bytes());
    assert_eq!(r[0].status, 429);
    assert_eq!(r[0].json()["error"]["code"], "rate_limit_exceeded");
    assert!(r[0].header("retry-after").is_some());
    d.stop();
}

/// A raw client of the stream: the handshake done (RFC 6455's own example key and
/// answer checked), frames by hand.
fn raw(d: &Daemon) -> RawWs {
    RawWs::open(d.addr, "/eryx/v1/stream", "")
}

#[test]
fn test_the_protocols_rules_on_raw_frames() {
    let d = Daemon::start_with(&[("ISOBOX_IDLE_TIMEOUT_MS", "2000")]);
    // A ping is answered with its payload; a run split over fragments, with a ping
    // between them, runs.
    let mut c = raw(&d);
    c.send(0x89, b"hi", false);
    assert_eq!(c.recv(), Some((10, b"hi".to_vec())));
    let msg = br#"{"type": "execute", "code": "print('frag' + 'mented')"}"#;
    c.send(0x01, &msg[..10], false);
    c.send(0x89, b"", false);
    c.send(0x80, &msg[10..], false);
    assert_eq!(c.recv(), Some((10, Vec::new())));
    let (op, p) = c.recv().unwrap();
    assert_eq!(op, 1);
    let v: Value = serde_json::from_slice(&p).unwrap();
    completed(&v, "success");
    assert_eq!(v["stdout"], "fragmented\n");
    // The close handshake: the code echoed, then the end.
    c.send(0x88, &1000u16.to_be_bytes(), false);
    assert_eq!(c.close_code(), Some(1000));
    c.ends();

    // A message of exactly the cap is read (and refused as JSON); one byte more
    // closes with 1009 from its header alone.
    let cap = 4 << 20;
    let mut c = raw(&d);
    c.send(0x81, &vec![b' '; cap], false);
    let (op, p) = c.recv().unwrap();
    assert_eq!(op, 1);
    let v: Value = serde_json::from_slice(&p).unwrap();
    assert_eq!(v["type"], "error", "{v}");
    let mut f = vec![0x81u8, 0x80 | 127];
    f.extend_from_slice(&((cap + 1) as u64).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0]);
    c.s.write_all(&f).unwrap();
    assert_eq!(c.close_code(), Some(1009));
    c.ends();

    // Each broken frame gets a close frame with its code and nothing else, then the
    // connection ends.
    for (first, payload, unmasked, code) in [
        (0x81u8, &br#"{"type":"execute"}"#[..], true, 1002u16),
        (0xC1, &b"{}"[..], false, 1002),
        (0x83, &b""[..], false, 1002),
        (0x81, &[0xff, 0xfe][..], false, 1007),
        (0x80, &b"x"[..], false, 1002),
        (0x88, &[0x03, 0xed][..], false, 1002),
        (0x88, &[0x03][..], false, 1002),
        (0x09, &b""[..], false, 1002),
    ] {
        let mut c = raw(&d);
        c.send(first, payload, unmasked);
        let (op, p) = c.recv().expect("a close frame");
        assert_eq!(op, 8, "{first:x} {payload:?}: {p:?}");
        assert_eq!(
            u16::from_be_bytes([p[0], p[1]]),
            code,
            "{first:x} {payload:?}"
        );
        c.ends();
    }

    // A connection with no run and no frame is closed at the idle deadline, told so.
    let mut c = raw(&d);
    let t0 = std::time::Instant::now();
    assert_eq!(c.close_code(), Some(1001));
    assert!(
        t0.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    c.ends();

    // Not an upgrade, or the wrong version: 426 with what would work.
    let r = common::raw_exchange(
        d.addr,
        b"GET /eryx/v1/stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r[0].status, 426);
    assert_eq!(r[0].json()["error"]["code"], "invalid_request");
    assert_eq!(r[0].header("upgrade"), Some("websocket"));
    let r = common::raw_exchange(
        d.addr,
        b"GET /eryx/v1/stream HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 8\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    );
    assert_eq!(r[0].status, 426);
    assert_eq!(r[0].header("sec-websocket-version"), Some("13"));
    let r = common::raw_exchange(
        d.addr,
        b"POST /eryx/v1/stream HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(r[0].status, 405);
    assert_eq!(d.get("/healthz").status, 200);

    // At shutdown an idle connection is told why (1001) and ends; the daemon stops.
    let mut c = raw(&d);
    c.send(0x89, b"x", false);
    assert_eq!(c.recv(), Some((10, b"x".to_vec())));
    let stopper = std::thread::spawn(move || d.stop());
    assert_eq!(c.close_code(), Some(1001));
    c.ends();
    stopper.join().unwrap();
}

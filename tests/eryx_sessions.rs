//! The eryx face's sessions (`/eryx/v1/sessions`, eryx-api.md, *Sessions*), on the real
//! daemon and the real `isobox-wasm` worker: the document's example; variables,
//! functions, classes, instances and imports kept between runs and across a daemon
//! restart (LMDB); a failed run keeping the changes made before its exception; runs
//! stopped by a limit keeping none; values that cannot be saved named in
//! `unsaved_variables`; the 1 MB state cap at, below and above its bound; state that
//! cannot be restored; one run at a time (409 `session_busy`); expiry; the per-tenant
//! session limit (429 `session_limit`); sessions of another tenant; the environment
//! rules; and bad requests in the document's error shape.

mod common;
use common::{Daemon, Resp};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn headers(key: Option<&str>) -> Vec<(&'static str, String)> {
    let mut h = vec![("Content-Type", "application/json".to_string())];
    if let Some(k) = key {
        h.push(("Authorization", format!("Bearer {k}")));
    }
    h
}

fn send(d: &Daemon, method: &str, path: &str, key: Option<&str>, body: &str) -> Resp {
    let h = headers(key);
    let h: Vec<(&str, &str)> = h.iter().map(|(n, v)| (*n, v.as_str())).collect();
    d.request(method, path, &h, body.as_bytes())
}

/// A new session (201): its body, checked field for field.
fn create(d: &Daemon, key: Option<&str>, body: &str) -> Value {
    let r = send(d, "POST", "/eryx/v1/sessions", key, body);
    assert_eq!(r.status, 201, "{}\nlog:\n{}", r.text(), d.log());
    let v = r.json();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["environment", "expires_at", "id", "ttl_secs"], "{v}");
    // A version 4 UUID, as the document shows them.
    let id = v["id"].as_str().unwrap();
    assert_eq!(id.len(), 36, "{v}");
    assert_eq!(id.as_bytes()[14], b'4', "{v}");
    assert_eq!(id.chars().filter(|c| *c == '-').count(), 4, "{v}");
    // RFC 3339 in UTC, to the second: 2026-11-02T22:00:00Z.
    let at = v["expires_at"].as_str().unwrap();
    assert_eq!((at.len(), &at[10..11], &at[19..]), (20, "T", "Z"), "{v}");
    v
}

/// A run in session `id`: the response (200 unless the request was refused).
fn exec(d: &Daemon, id: &str, key: Option<&str>, body: Value) -> Resp {
    send(
        d,
        "POST",
        &format!("/eryx/v1/sessions/{id}/execute"),
        key,
        &body.to_string(),
    )
}

/// A run that must be answered 200: its body.
fn step(d: &Daemon, id: &str, code: &str) -> Value {
    let r = exec(d, id, None, json!({ "code": code }));
    assert_eq!(r.status, 200, "{}\nlog:\n{}", r.text(), d.log());
    r.json()
}

/// A run that must succeed: its stdout.
fn ok(d: &Daemon, id: &str, code: &str) -> String {
    let v = step(d, id, code);
    assert_eq!(v["status"], "success", "{code}: {v}");
    v["stdout"].as_str().unwrap().to_string()
}

/// `{"error": {"code", "message"}}` and nothing else: status and code.
fn refusal(r: &Resp) -> (u16, String) {
    let v = r.json();
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
    assert_eq!(v["error"].as_object().map(|o| o.len()), Some(2), "{v}");
    assert!(!v["error"]["message"].as_str().unwrap().is_empty(), "{v}");
    (r.status, v["error"]["code"].as_str().unwrap().to_string())
}

#[test]
fn test_state_is_kept_between_runs_and_across_a_restart() {
    let mut d = Daemon::start();
    d.wait_ready();
    // The document's example, with no body at all.
    let s = create(&d, None, "");
    assert_eq!(s["environment"], "python");
    assert_eq!(s["ttl_secs"], 3600);
    let id = s["id"].as_str().unwrap().to_string();
    let v = step(&d, &id, "x = 21");
    assert_eq!(v["status"], "success", "{v}");
    assert_eq!(
        v.as_object().unwrap().len(),
        4,
        "no unsaved_variables when none: {v}"
    );
    assert_eq!(ok(&d, &id, "print(x * 2)"), "42\n");
    // Functions, classes, instances, closures, imports, shared objects: as in a notebook.
    ok(
        &d,
        &id,
        "import math, collections\n\
         from decimal import Decimal\n\
         scale = 3\n\
         def f(a):\n    return a * scale + helper()\n\
         def helper():\n    return 1\n\
         class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n    def norm(self):\n        return math.hypot(self.x, self.y)\n\
         p = Point(3, 4)\n\
         def counter():\n    n = [0]\n    def inc():\n        n[0] += 1\n        return n[0]\n    return inc\n\
         inc = counter()\n\
         shared = [1, 2]\n\
         both = {'a': shared, 'b': shared}\n\
         c = collections.Counter('abca')\n\
         money = Decimal('1.10')",
    );
    // A later run sees a name defined after the function (its globals are the
    // session's), changes kept by the previous run, and shared objects still shared.
    assert_eq!(
        ok(
            &d,
            &id,
            "scale = 10\nprint(f(2), p.norm(), isinstance(p, Point), inc(), inc())\n\
             both['a'].append(3)\nprint(both['b'], c['a'], money * 2, math.pi > 3)"
        ),
        "21 5.0 True 1 2\n[1, 2, 3] 2 2.20 True\n"
    );
    assert_eq!(
        ok(&d, &id, "print(inc(), both['b'] is both['a'])"),
        "3 True\n"
    );
    // Imported functions and classes are the modules' own after a restore: they keep
    // their modules' globals (a dataclass needs `dataclasses`' helpers, `dumps` its
    // encoder), and the module's classes are not changed for the session.
    ok(
        &d,
        &id,
        "from dataclasses import dataclass\nfrom json import dumps\nfrom pathlib import PurePosixPath",
    );
    assert_eq!(
        ok(
            &d,
            &id,
            "@dataclass\nclass Q:\n    x: int\nprint(Q(1), dumps({'a': 1}), PurePosixPath('/a/b').name)\n\
             import pathlib\nprint(pathlib.PurePosixPath is PurePosixPath)"
        ),
        "Q(x=1) {\"a\": 1} b\nTrue\n"
    );
    assert_eq!(ok(&d, &id, "print(Q(2) == Q(2), dumps([1]))"), "True [1]\n");
    // Durable: a restart of the daemon (same instance, same data) keeps the session,
    // its expiry and its state.
    d.stop_keep_data();
    let d = Daemon::start_with(&[("ISOBOX_INSTANCE", &d.instance.clone())]);
    d.wait_ready();
    assert_eq!(
        ok(&d, &id, "print(x, f(1), p.norm(), inc(), both['a'])"),
        "21 11 5.0 4 [1, 2, 3]\n"
    );
    // Deleted: 204, then gone for every route.
    let r = send(&d, "DELETE", &format!("/eryx/v1/sessions/{id}"), None, "");
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(r.body.is_empty());
    let r = exec(&d, &id, None, json!({"code": "print(x)"}));
    assert_eq!(refusal(&r), (404, "not_found".into()));
    let r = send(&d, "DELETE", &format!("/eryx/v1/sessions/{id}"), None, "");
    assert_eq!(refusal(&r), (404, "not_found".into()));
    // Sessions are separate: a new one sees nothing of another.
    let other = create(&d, None, "{}");
    let other = other["id"].as_str().unwrap();
    let v = step(&d, other, "print(x)");
    assert_eq!(v["status"], "error", "{v}");
    assert!(v["error"].as_str().unwrap().contains("NameError"), "{v}");
    d.stop();
}

#[test]
fn test_failed_runs_limits_unsaved_values_the_cap_and_bad_state() {
    let d = Daemon::start_with(&[("ISOBOX_ERYX_TIMEOUT_S", "5")]);
    d.wait_ready();
    let id = create(&d, None, "")["id"].as_str().unwrap().to_string();
    ok(&d, &id, "a = 1");
    // An exception keeps what the code did before it.
    let v = step(
        &d,
        &id,
        "a = 2\nb = 'kept'\nraise ValueError('late')\nc = 3",
    );
    assert_eq!(v["status"], "error", "{v}");
    assert!(
        v["error"].as_str().unwrap().ends_with("ValueError: late\n"),
        "{v}"
    );
    assert_eq!(
        ok(&d, &id, "print(a, b, 'c' in globals())"),
        "2 kept False\n"
    );
    // A run stopped by a limit keeps none of its changes: time, compute units, memory.
    for (body, status) in [
        (
            json!({"code": "a = 'timeout'\nwhile True:\n    pass", "timeout_secs": 1}),
            "timeout",
        ),
        (
            json!({"code": "a = 'fuel'\nwhile True:\n    pass", "fuel_limit": 200_000_000}),
            "resource_limit",
        ),
        (
            json!({"code": "a = 'memory'\nbig = [0] * 100_000_000"}),
            "resource_limit",
        ),
    ] {
        let r = exec(&d, &id, None, body.clone());
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["status"], status, "{body}: {v}");
        assert!(v["compute_units"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(ok(&d, &id, "print(a)"), "2\n", "after {body}");
    }
    // Values that cannot be saved are named, and later runs do not see them; the
    // rest of the run's changes are kept.
    let v = step(
        &d,
        &id,
        "import sys\ngen = (i for i in range(3))\nframe = sys._getframe()\nfine = [1]",
    );
    assert_eq!(v["status"], "success", "{v}");
    let mut unsaved: Vec<&str> = v["unsaved_variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    unsaved.sort_unstable();
    assert_eq!(unsaved, ["frame", "gen"], "{v}");
    assert_eq!(
        ok(
            &d,
            &id,
            "print(fine, 'gen' in globals(), 'frame' in globals())"
        ),
        "[1] False False\n"
    );
    // Saved state can be up to 1 MB (1,048,576 bytes as dill writes it): exactly at
    // the bound is kept, one byte over keeps none of the run's changes. What a
    // namespace holding `blob` costs beside it is measured first, in a plain run whose
    // namespace is a fresh session's (the modules imported into it are saved too).
    let measure = [
        "import dill",
        "ns = {k: v for k, v in globals().items() if not (k.startswith('__') and k.endswith('__')) and not k.startswith(('_eryx_', '_isobox_'))}",
        "ns['blob'] = b'x' * 5000",
        "print(len(dill.dumps(ns, recurse=True)) - 5000)",
    ]
    .join("\n");
    let r = d.request(
        "POST",
        "/eryx/v1/execute",
        &[("Content-Type", "application/json")],
        json!({ "code": measure }).to_string().as_bytes(),
    );
    let overhead: usize = r.json()["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    let at = (1 << 20) - overhead;
    for (n, kept) in [(at - 1, true), (at, true), (at + 1, false)] {
        let s = create(&d, None, "")["id"].as_str().unwrap().to_string();
        ok(&d, &s, "blob = b''");
        let v = step(&d, &s, &format!("blob = b'x' * {n}\nprint('ran')"));
        if kept {
            assert_eq!(v["status"], "success", "{n}: {v}");
            assert_eq!(ok(&d, &s, "print(len(blob))"), format!("{n}\n"));
        } else {
            assert_eq!(v["status"], "resource_limit", "{n}: {v}");
            assert_eq!(v["stdout"], "", "{v}");
            let e = v["error"].as_str().unwrap();
            assert!(
                e.contains("1048576") && e.contains("None of this run's changes were kept"),
                "{e}"
            );
            assert_eq!(ok(&d, &s, "print(len(blob))"), "0\n");
        }
    }
    // State that cannot be restored: every later run in the session ends with an
    // error starting as the document says, and runs no code.
    let bad = create(&d, None, "")["id"].as_str().unwrap().to_string();
    ok(
        &d,
        &bad,
        "def boom():\n    raise RuntimeError('cannot come back')\n\
         class Fragile:\n    def __reduce__(self):\n        return (boom, ())\n\
         f = Fragile()",
    );
    for _ in 0..2 {
        let v = step(&d, &bad, "print('never')");
        assert_eq!(v["status"], "error", "{v}");
        assert_eq!(v["stdout"], "", "{v}");
        let e = v["error"].as_str().unwrap();
        assert!(e.starts_with("Failed to restore session state"), "{e}");
        assert!(e.contains("cannot come back"), "{e}");
    }
    // The session can still be deleted.
    let r = send(&d, "DELETE", &format!("/eryx/v1/sessions/{bad}"), None, "");
    assert_eq!(r.status, 204);
    // Objects run code while they are saved: that code is bounded by the run's own
    // compute units (with a floor), not free for ever, and the run keeps nothing.
    let spin = create(&d, None, "")["id"].as_str().unwrap().to_string();
    ok(&d, &spin, "kept = 1");
    let t0 = Instant::now();
    let r = exec(
        &d,
        &spin,
        None,
        json!({"code": "kept = 2\nclass Spin:\n    def __reduce__(self):\n        while True:\n            pass\ns = Spin()", "fuel_limit": 100_000_000}),
    );
    let v = r.json();
    assert_eq!(v["status"], "error", "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains("could not be saved") && e.contains("2000000000"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(ok(&d, &spin, "print(kept)"), "1\n");
    // What the code can reach of the answer is bounded in the worker too: a name of
    // 3 million characters that cannot be saved, output pushed past the capture's cap.
    let v = step(&d, &spin, "globals()['n' * 3_000_000] = (i for i in ())");
    assert_eq!(v["status"], "success", "{v}");
    let names = v["unsaved_variables"].as_array().unwrap();
    assert_eq!(names.len(), 1, "{v}");
    assert!(
        names[0].as_str().unwrap().len() < 400,
        "{}",
        names[0].as_str().unwrap().len()
    );
    let v = step(
        &d,
        &spin,
        "import sys\nsys.stdout.parts.append('x' * 8_000_000)",
    );
    assert_eq!(v["status"], "success", "{}", &v.to_string()[..200]);
    let out = v["stdout"].as_str().unwrap();
    assert!(out.len() < 1_100_000, "{}", out.len());
    assert!(
        out.ends_with("[output truncated at 1048576 characters]\n"),
        "{}",
        &out[out.len() - 80..]
    );
    d.stop();
}

#[test]
fn test_one_run_at_a_time_expiry_and_the_session_limit() {
    let d = Daemon::start_with(&[
        ("ISOBOX_API_KEYS", "eryx_alpha,eryx_beta"),
        ("ISOBOX_ERYX_SESSIONS", "2"),
    ]);
    d.wait_ready();
    let alpha = Some("eryx_alpha");
    let id = create(&d, alpha, "")["id"].as_str().unwrap().to_string();
    // One run at a time: a second run while the first goes is 409 session_busy; the
    // first finishes, and its state is there for the next.
    let addr = d.addr;
    let path = format!("/eryx/v1/sessions/{id}/execute");
    let slow = std::thread::spawn(move || {
        let body = json!({"code": "import time\ntime.sleep(1.5)\nslow = 'done'"}).to_string();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer eryx_alpha\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        common::raw_exchange(addr, req.as_bytes())
    });
    std::thread::sleep(Duration::from_millis(500));
    let r = exec(&d, &id, alpha, json!({"code": "print(1)"}));
    assert_eq!(refusal(&r), (409, "session_busy".into()));
    let first = slow.join().unwrap();
    assert_eq!(first[0].status, 200, "{}", first[0].text());
    assert_eq!(first[0].json()["status"], "success");
    let r = exec(&d, &id, alpha, json!({"code": "print(slow)"}));
    assert_eq!(r.json()["stdout"], "done\n", "{}", r.text());
    // A session deleted during a run: 204 at once; the run is answered as it is, the
    // session is gone after it (its state is not brought back), and the tenant's
    // concurrency and session counts come back.
    let doomed = create(&d, alpha, "")["id"].as_str().unwrap().to_string();
    let path = format!("/eryx/v1/sessions/{doomed}/execute");
    let running = std::thread::spawn(move || {
        let body = json!({"code": "import time\ntime.sleep(1.5)\nlate = 1"}).to_string();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer eryx_alpha\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        common::raw_exchange(addr, req.as_bytes())
    });
    std::thread::sleep(Duration::from_millis(500));
    let r = send(
        &d,
        "DELETE",
        &format!("/eryx/v1/sessions/{doomed}"),
        alpha,
        "",
    );
    assert_eq!(r.status, 204, "{}", r.text());
    let r = exec(&d, &doomed, alpha, json!({"code": "print(1)"}));
    assert_eq!(refusal(&r), (404, "not_found".into()));
    let answered = running.join().unwrap();
    assert_eq!(answered[0].status, 200, "{}", answered[0].text());
    assert_eq!(answered[0].json()["status"], "success");
    let r = exec(&d, &doomed, alpha, json!({"code": "print(late)"}));
    assert_eq!(refusal(&r), (404, "not_found".into()));
    // Another tenant's session does not exist for this one.
    let beta = Some("eryx_beta");
    let r = exec(&d, &id, beta, json!({"code": "print(slow)"}));
    assert_eq!(refusal(&r), (404, "not_found".into()));
    let r = send(&d, "DELETE", &format!("/eryx/v1/sessions/{id}"), beta, "");
    assert_eq!(refusal(&r), (404, "not_found".into()));
    // The limit on unexpired sessions is per tenant: alpha's second is its last.
    let second = create(&d, alpha, r#"{"ttl_secs": 1}"#);
    assert_eq!(second["ttl_secs"], 1);
    let r = send(&d, "POST", "/eryx/v1/sessions", alpha, "");
    assert_eq!(refusal(&r), (429, "session_limit".into()));
    create(&d, beta, "");
    // A session expires ttl_secs after its last run (or its creation): then it is
    // gone, and its place is free again.
    let second = second["id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(1500));
    let r = exec(&d, &second, alpha, json!({"code": "print(1)"}));
    assert_eq!(refusal(&r), (404, "not_found".into()));
    create(&d, alpha, "");
    // The sweep deletes expired sessions from the store too.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log().contains("expired, deleted") {
        assert!(Instant::now() < deadline, "no sweep; log:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // ttl_secs at and past its bounds, and the rest of the create's rules.
    let r = send(&d, "DELETE", &format!("/eryx/v1/sessions/{id}"), alpha, "");
    assert_eq!(r.status, 204);
    let day = create(&d, beta, r#"{"ttl_secs": 86400, "environment": "python"}"#);
    assert_eq!(day["ttl_secs"], 86400);
    for (ct, body, want) in [
        (
            "application/json",
            r#"{"ttl_secs": 86401}"#,
            (422, "invalid_request"),
        ),
        (
            "application/json",
            r#"{"ttl_secs": 0}"#,
            (422, "invalid_request"),
        ),
        (
            "application/json",
            r#"{"ttl_secs": "60"}"#,
            (422, "invalid_request"),
        ),
        (
            "application/json",
            r#"{"environment": 3}"#,
            (422, "invalid_request"),
        ),
        (
            "application/json",
            r#"{"environment": "nope"}"#,
            (404, "not_found"),
        ),
        ("application/json", "{", (400, "invalid_request")),
        ("application/json", "[]", (400, "invalid_request")),
        ("text/plain", r#"{"ttl_secs": 5}"#, (415, "invalid_request")),
    ] {
        let r = d.request(
            "POST",
            "/eryx/v1/sessions",
            &[("Content-Type", ct), ("Authorization", "Bearer eryx_alpha")],
            body.as_bytes(),
        );
        assert_eq!(refusal(&r), (want.0, want.1.to_string()), "{ct} {body}");
    }
    // In a session, a run may repeat the session's environment, not name another;
    // its body is checked as any execute's.
    let s = create(&d, alpha, r#"{"environment": "python"}"#);
    let s = s["id"].as_str().unwrap();
    let r = exec(
        &d,
        s,
        alpha,
        json!({"code": "print(1)", "environment": "python"}),
    );
    assert_eq!(r.json()["stdout"], "1\n", "{}", r.text());
    let r = exec(
        &d,
        s,
        alpha,
        json!({"code": "print(1)", "environment": "other"}),
    );
    assert_eq!(refusal(&r), (422, "invalid_request".into()));
    let r = exec(&d, s, alpha, json!({"timeout_secs": 1}));
    assert_eq!(refusal(&r), (422, "invalid_request".into()));
    // Methods and keys.
    let r = send(&d, "GET", "/eryx/v1/sessions", alpha, "");
    assert_eq!(refusal(&r), (405, "invalid_request".into()));
    let r = send(&d, "GET", &format!("/eryx/v1/sessions/{s}"), alpha, "");
    assert_eq!(refusal(&r), (405, "invalid_request".into()));
    let r = send(&d, "POST", "/eryx/v1/sessions", None, "");
    assert_eq!(refusal(&r), (401, "missing_auth".into()));
    let r = send(&d, "POST", "/eryx/v1/sessions", Some("eryx_wrong"), "");
    assert_eq!(refusal(&r), (401, "invalid_key".into()));
    d.stop();
}

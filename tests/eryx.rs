//! The eryx face (`/eryx`, eryx-api.md): Python in WebAssembly, run by the real
//! `isobox-wasm` worker (eryx on wasmtime) that the real daemon starts jailed.
//! Compute units, the time, fuel and memory limits at and around their bounds, the
//! document's error codes, per-tenant concurrency, what sandboxed code cannot do, the
//! worker's jail, a worker killed mid-run, and nothing left behind.

mod common;
use common::{Daemon, Resp};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn execute(d: &Daemon, body: &Value, key: Option<&str>) -> Resp {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut h: Vec<(&str, &str)> = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        h.push(("Authorization", a));
    }
    d.request("POST", "/eryx/v1/execute", &h, body.to_string().as_bytes())
}

/// A run that must be answered 200: its body.
fn run(d: &Daemon, body: Value) -> Value {
    let r = execute(d, &body, None);
    assert_eq!(r.status, 200, "{}\nlog:\n{}", r.text(), d.log());
    r.json()
}

/// `{"error": {"code", "message"}}` and nothing else: the code.
fn code(r: &Resp) -> String {
    let v = r.json();
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
    assert_eq!(v["error"].as_object().map(|o| o.len()), Some(2), "{v}");
    assert!(!v["error"]["message"].as_str().unwrap().is_empty(), "{v}");
    v["error"]["code"].as_str().unwrap().to_string()
}

/// `code` run on a connection of its own, in a thread: its answers when it ends.
fn in_background(d: &Daemon, code: &str, key: Option<&str>) -> std::thread::JoinHandle<Vec<Resp>> {
    body_in_background(d, &json!({ "code": code }), key)
}

/// A run of request `body` on a connection of its own, in a thread.
fn body_in_background(
    d: &Daemon,
    body: &Value,
    key: Option<&str>,
) -> std::thread::JoinHandle<Vec<Resp>> {
    let addr = d.addr;
    let body = body.to_string();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let req = format!(
        "POST /eryx/v1/execute HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    std::thread::spawn(move || common::raw_exchange(addr, req.as_bytes()))
}

/// The workers of this daemon: their pids, from their cgroups under the daemon's
/// slice.
fn worker_pids(d: &Daemon) -> Vec<u32> {
    let slice = std::path::PathBuf::from("/sys/fs/cgroup/pids").join(&d.instance);
    let mut out = Vec::new();
    for e in std::fs::read_dir(&slice).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with("wasm-worker-") {
            let procs = std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
            out.extend(
                procs
                    .lines()
                    .next()
                    .and_then(|l| l.trim().parse::<u32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out
}

/// A request sent from local address `from` (all of 127/8 is this host's): its status
/// and its JSON body (null when it has none).
fn from_address(
    d: &Daemon,
    from: &str,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-s", "-o", "-", "-w", "\n%{http_code}", "--interface", from])
        .args(["-X", method, "-H", "Content-Type: application/json"]);
    if let Some(k) = key {
        cmd.args(["-H", &format!("Authorization: Bearer {k}")]);
    }
    cmd.args(["--data-binary", body, &format!("http://{}{path}", d.addr)]);
    let out = cmd.output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (
        status.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

#[test]
fn test_the_request_rate_is_per_org_and_per_address_without_a_key() {
    let d = Daemon::start_with(&[
        ("ISOBOX_API_KEYS", "eryx_alpha,eryx_beta"),
        ("ISOBOX_ERYX_RATE_PER_MIN", "1"),
        ("ISOBOX_ERYX_RATE_BURST", "2"),
        ("ISOBOX_RATE_PER_MIN", "1"),
        ("ISOBOX_RATE_BURST", "1"),
    ]);
    d.wait_ready();
    let run = r#"{"code": "print(1)"}"#;
    let post = |from: &str, path: &str, key: Option<&str>, body: &str| {
        from_address(&d, from, "POST", path, key, body)
    };
    // One org's requests from two addresses spend one bucket (a burst of 2): the third,
    // from a third address, is refused with the document's code.
    let alpha = Some("eryx_alpha");
    assert_eq!(post("127.0.0.2", "/eryx/v1/execute", alpha, run).0, 200);
    assert_eq!(post("127.0.0.3", "/eryx/v1/sessions", alpha, "").0, 201);
    let (status, v) = post("127.0.0.4", "/eryx/v1/execute", alpha, run);
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    // Another org has its own, from that same address.
    let (status, v) = post("127.0.0.4", "/eryx/v1/execute", Some("eryx_beta"), run);
    assert_eq!((status, &v["stdout"]), (200, &json!("1\n")), "{v}");
    // Without a valid key the address pays (so guessing keys is limited): two
    // refusals fill its bucket, the third is 429; another address is not held up.
    for _ in 0..2 {
        let (status, v) = post("127.0.0.5", "/eryx/v1/execute", Some("eryx_wrong"), run);
        assert_eq!((status, &v["error"]["code"]), (401, &json!("invalid_key")));
    }
    let (status, v) = post("127.0.0.5", "/eryx/v1/execute", None, run);
    assert_eq!(
        (status, &v["error"]["code"]),
        (429, &json!("rate_limit_exceeded"))
    );
    let (status, v) = post("127.0.0.6", "/eryx/v1/execute", None, run);
    assert_eq!((status, &v["error"]["code"]), (401, &json!("missing_auth")));
    // The other faces' per-client bucket (a burst of 1 here) is not the eryx face's:
    // the first address still has its token.
    let (status, v) = post("127.0.0.2", "/v1/volumes", alpha, r#"{"name": "v"}"#);
    assert_eq!(status, 201, "{v}");
    d.stop();
}

#[test]
fn test_the_documents_examples_compute_units_and_outcomes() {
    let d = Daemon::start();
    d.wait_ready();
    // The quick start, field for field.
    let v = run(&d, json!({"code": "print(1 + 1)"}));
    assert_eq!(v["stdout"], "2\n", "{v}");
    assert_eq!(v["stderr"], "");
    assert_eq!(v["status"], "success");
    assert_eq!(v.as_object().unwrap().len(), 4, "{v}");
    let units = v["compute_units"].as_u64().unwrap();
    assert!(units > 1000, "{v}");
    // The same code uses the same units, every time.
    for _ in 0..4 {
        let again = run(&d, json!({"code": "print(1 + 1)"}));
        assert_eq!(again["compute_units"].as_u64(), Some(units), "{again}");
    }
    let v = run(
        &d,
        json!({"code": "import math\nprint(math.factorial(20))"}),
    );
    assert_eq!(v["stdout"], "2432902008176640000\n", "{v}");
    // More work, more units.
    let v = run(
        &d,
        json!({"code": "s = 0\nfor i in range(100000):\n    s += i\nprint(s)"}),
    );
    assert_eq!(v["stdout"], "4999950000\n", "{v}");
    assert!(v["compute_units"].as_u64().unwrap() > units * 2, "{v}");
    // An exception: 200, status error, the traceback with the user's own line
    // numbers, no output, and the units it used.
    let v = run(
        &d,
        json!({"code": "print('before')\n\nraise ValueError(\"bad input\")"}),
    );
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(
        (v["stdout"].as_str(), v["stderr"].as_str()),
        (Some(""), Some(""))
    );
    let err = v["error"].as_str().unwrap();
    assert!(
        err.starts_with("Traceback (most recent call last):\n"),
        "{err}"
    );
    assert!(err.contains("line 3"), "{err}");
    assert!(err.ends_with("ValueError: bad input\n"), "{err}");
    assert!(!err.contains("isobox"), "the wrapper shows: {err}");
    assert!(v["compute_units"].as_u64().unwrap() > 0, "{v}");
    // A syntax error is an error too.
    let v = run(&d, json!({"code": "def f(:\n  pass"}));
    assert_eq!(v["status"], "error");
    assert!(v["error"].as_str().unwrap().contains("SyntaxError"), "{v}");
    // Top-level await, stderr, sys.exit(0) as success.
    let v = run(
        &d,
        json!({"code": "import asyncio, sys\nasync def two(x):\n    await asyncio.sleep(0)\n    return 2 * x\nprint(await asyncio.gather(two(1), two(2)))\nprint('warn', file=sys.stderr)\nsys.exit(0)"}),
    );
    assert_eq!(
        (
            v["status"].as_str(),
            v["stdout"].as_str(),
            v["stderr"].as_str()
        ),
        (Some("success"), Some("[2, 4]\n"), Some("warn\n")),
        "{v}"
    );
    let v = run(&d, json!({"code": "import sys\nsys.exit(3)"}));
    assert_eq!(v["status"], "error", "{v}");
    // Each run starts fresh.
    run(&d, json!({"code": "leftover = 1"}));
    let v = run(&d, json!({"code": "print(leftover)"}));
    assert!(v["error"].as_str().unwrap().contains("NameError"), "{v}");
    // eryx's line tracer is off for the code (compute units measure the code, not it),
    // and nothing of the wrapper is left in the namespace.
    let v = run(
        &d,
        json!({"code": "import sys\nprint(sys.gettrace(), sys._getframe().f_trace)\nprint(sorted(k for k in globals() if 'isobox' in k))"}),
    );
    assert_eq!(v["stdout"], "None None\n[]\n", "{v}");
    // Unicode both ways.
    let v = run(&d, json!({"code": "print('héllo ✓', len('✓'))"}));
    assert_eq!(v["stdout"], "héllo ✓ 1\n");
    // Text that is not valid Unicode (a lone surrogate, as surrogateescape makes from
    // bytes) is shown escaped: an exception stays an error and output is kept. Both
    // were once a "success" with nothing in it.
    let v = run(&d, json!({"code": "raise ValueError('\\udcff')"}));
    assert_eq!(v["status"], "error", "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .ends_with("ValueError: \\udcff\n"),
        "{v}"
    );
    let v = run(
        &d,
        json!({"code": "print('a')\nprint(b'\\xff'.decode('utf-8', 'surrogateescape'))"}),
    );
    assert_eq!(
        (v["status"].as_str(), v["stdout"].as_str()),
        (Some("success"), Some("a\n\\udcff\n")),
        "{v}"
    );
    // A run that ends in the engine (os._exit is WASI's exit) is counted like any
    // other: once 0, so a loop before it was free.
    let v = run(
        &d,
        json!({"code": "s = 0\nfor i in range(200000):\n    s += i\nimport os\nos._exit(0)"}),
    );
    assert_eq!(v["status"], "error", "{v}");
    assert!(v["compute_units"].as_u64().unwrap() > 2 * units, "{v}");
    d.stop();
}

/// Runs on one worker process: each keeps its own time limit in real time (eryx's
/// counts ticks of the one engine's epoch, which every run's ticker advanced: with
/// three runs on a worker, each ended after a third of its limit), and a worker takes
/// only as many runs as its memory share holds: the rest wait for room, then 503.
#[test]
fn test_runs_on_one_worker_keep_their_own_time_and_its_room() {
    // One worker of 256 MiB: room for two runs of 64 MiB beside the engine's 128.
    let d = Daemon::start_with(&[
        ("ISOBOX_WASM_THREADS", "1"),
        ("ISOBOX_WASM_WORKER_MEMORY_MB", "256"),
        ("ISOBOX_ERYX_TIMEOUT_S", "30"),
    ]);
    d.wait_ready();
    run(&d, json!({"code": "pass"}));
    let go = |body: Value| body_in_background(&d, &body, None);
    // Two runs of 6 s with a limit of 8 s, side by side on the one worker.
    let sleeper = json!({"code": "import time\ntime.sleep(6)\nprint('woke')", "timeout_secs": 8});
    let runs: Vec<_> = (0..2).map(|_| go(sleeper.clone())).collect();
    for r in runs {
        let r = r.join().unwrap().remove(0);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            (r.json()["status"].as_str(), r.json()["stdout"].as_str()),
            (Some("success"), Some("woke\n")),
            "{}",
            r.text()
        );
    }
    // Three at once: the third waits for room (it starts only once one has ended).
    let timed = json!({"code": "import time\nt = time.time()\ntime.sleep(2)\nprint(t)"});
    let runs: Vec<_> = (0..3).map(|_| go(timed.clone())).collect();
    let mut starts: Vec<f64> = runs
        .into_iter()
        .map(|r| {
            let r = r.join().unwrap().remove(0);
            assert_eq!(r.json()["status"], "success", "{}", r.text());
            r.json()["stdout"].as_str().unwrap().trim().parse().unwrap()
        })
        .collect();
    starts.sort_by(f64::total_cmp);
    assert!(
        starts[2] - starts[0] >= 1.5,
        "the third ran beside the others: {starts:?}"
    );
    // Runs that hold the room past the wait: the one waiting is 503, at capacity.
    let long = json!({"code": "import time\ntime.sleep(14)", "timeout_secs": 20});
    let runs: Vec<_> = (0..3).map(|_| go(long.clone())).collect();
    let mut statuses: Vec<u16> = Vec::new();
    for r in runs {
        let r = r.join().unwrap().remove(0);
        if r.status == 503 {
            assert_eq!(code(&r), "unavailable");
            assert!(
                r.json()["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("at capacity"),
                "{}",
                r.text()
            );
        } else {
            assert_eq!(r.json()["status"], "success", "{}", r.text());
        }
        statuses.push(r.status);
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 503]);
    // The worker lived through it all: the same one answers.
    run(&d, json!({"code": "pass"}));
    d.stop();
}

#[test]
fn test_fuel_time_and_memory_limits_at_their_bounds() {
    let d = Daemon::start_with(&[("ISOBOX_ERYX_TIMEOUT_S", "3")]);
    d.wait_ready();
    let code = "print(sum(range(1000)))";
    let units = run(&d, json!({"code": code}))["compute_units"]
        .as_u64()
        .unwrap();
    // At the bound and above it: success with the same units; below: resource_limit.
    // (The engine checks fuel at its own granularity: a limit a few units short of
    // what a run needs may still see it through.)
    for (limit, status) in [
        (units, "success"),
        (units + 1, "success"),
        (units / 100 * 99, "resource_limit"),
        (units / 2, "resource_limit"),
    ] {
        let v = run(&d, json!({"code": code, "fuel_limit": limit}));
        assert_eq!(v["status"], status, "fuel_limit {limit} of {units}: {v}");
        if status == "success" {
            assert_eq!(v["compute_units"].as_u64(), Some(units), "{v}");
            assert_eq!(v["stdout"], "499500\n");
        } else {
            assert_eq!(v["stdout"], "", "{v}");
            let used = v["compute_units"].as_u64().unwrap();
            assert!(
                used <= limit && used + 10_000 >= limit,
                "{used} of {limit}: {v}"
            );
        }
    }
    // Time: the request's own limit, and the server's cap over a larger one.
    let t0 = Instant::now();
    let v = run(
        &d,
        json!({"code": "while True:\n    pass", "timeout_secs": 1}),
    );
    assert_eq!(v["status"], "timeout", "{v}");
    assert!(v["error"].as_str().unwrap().contains("time limit"), "{v}");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // A run that times out reports the units it used (the document: "accurate to
    // within a few million"), a loop that calls nothing included: a second of it is
    // far more than the run's start.
    assert!(
        v["compute_units"].as_u64().unwrap() > 50 * units,
        "{units} per start: {v}"
    );
    // The same work, then a wait past the limit: the units of the work, within a
    // million or two of the same work followed by no wait.
    let work = "s = 0\nfor i in range(200000):\n    s += i\nimport time\ntime.sleep";
    let done = run(&d, json!({ "code": format!("{work}(0)") }));
    assert_eq!(done["status"], "success", "{done}");
    let cut = run(
        &d,
        json!({ "code": format!("{work}(10)"), "timeout_secs": 1 }),
    );
    assert_eq!(cut["status"], "timeout", "{cut}");
    let (a, b) = (
        done["compute_units"].as_i64().unwrap(),
        cut["compute_units"].as_i64().unwrap(),
    );
    assert!((a - b).abs() < 2_000_000, "{a} and {b}");
    let t0 = Instant::now();
    let v = run(
        &d,
        json!({"code": "import time\ntime.sleep(30)", "timeout_secs": 100}),
    );
    assert_eq!(v["status"], "timeout", "{v}");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(2900) && took < Duration::from_secs(6),
        "capped at 3 s: {took:?}"
    );
    // Memory: 64 MB by default. Under it works; over it is MemoryError, reported as
    // resource_limit.
    let v = run(
        &d,
        json!({"code": "b = bytearray(32 * 1024 * 1024)\nprint(len(b))"}),
    );
    assert_eq!(v["stdout"], "33554432\n", "{v}");
    let v = run(
        &d,
        json!({"code": "b = bytearray(200 * 1024 * 1024)\nprint(len(b))"}),
    );
    assert_eq!(v["status"], "resource_limit", "{v}");
    assert!(v["error"].as_str().unwrap().contains("MemoryError"), "{v}");
    // And the worker is fine afterwards.
    assert_eq!(run(&d, json!({"code": "print(7)"}))["stdout"], "7\n");
    d.stop();
}

#[test]
fn test_errors_auth_and_per_tenant_concurrency() {
    let d = Daemon::start_with(&[
        ("ISOBOX_API_KEYS", "eryx_alpha,eryx_beta"),
        ("ISOBOX_ERYX_CONCURRENCY", "1"),
    ]);
    d.wait_ready();
    let ok = json!({"code": "print(1)"});
    // Auth, as the document spells it.
    let r = execute(&d, &ok, None);
    assert_eq!((r.status, code(&r)), (401, "missing_auth".into()));
    let r = d.request(
        "POST",
        "/eryx/v1/execute",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", "Basic YTpi"),
        ],
        ok.to_string().as_bytes(),
    );
    assert_eq!((r.status, code(&r)), (401, "invalid_auth".into()));
    let r = execute(&d, &ok, Some("eryx_wrong"));
    assert_eq!((r.status, code(&r)), (401, "invalid_key".into()));
    let r = execute(&d, &ok, Some("eryx_alpha"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["stdout"], "1\n");
    // Bad requests.
    let h = [("Authorization", "Bearer eryx_alpha")];
    let r = d.request("POST", "/eryx/v1/execute", &h, ok.to_string().as_bytes());
    assert_eq!((r.status, code(&r)), (415, "invalid_request".into()));
    for (body, status, want) in [
        ("{", 400, "invalid_request"),
        ("{}", 422, "invalid_request"),
        (r#"{"code": 5}"#, 422, "invalid_request"),
        (
            r#"{"code": "x", "timeout_secs": 0}"#,
            422,
            "invalid_request",
        ),
        (
            r#"{"code": "x", "environment": "templating"}"#,
            404,
            "not_found",
        ),
    ] {
        let r = d.request(
            "POST",
            "/eryx/v1/execute",
            &[
                ("Authorization", "Bearer eryx_alpha"),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        );
        assert_eq!((r.status, code(&r)), (status, want.into()), "{body}");
    }
    // A body whose chunked framing breaks: the document's shape too (it was the
    // isobox face's `{"error": "bad_request", "detail"}`), and the connection closes.
    let r = common::raw_exchange(
        d.addr,
        b"POST /eryx/v1/execute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer eryx_alpha\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    );
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].status, code(&r[0])), (400, "invalid_request".into()));
    let r = d.request("GET", "/eryx/v1/execute", &h, b"");
    assert_eq!((r.status, code(&r)), (405, "invalid_request".into()));
    // The stream is a WebSocket (tests/eryx_stream.rs); a plain GET is told so.
    let r = d.request("GET", "/eryx/v1/stream", &h, b"");
    assert_eq!((r.status, code(&r)), (426, "invalid_request".into()));
    assert_eq!(r.header("upgrade"), Some("websocket"));
    // An environment is uploaded as a multipart form (eryx_envs.rs), not as JSON.
    let r = d.request("POST", "/eryx/v1/environments", &h, b"{}");
    assert_eq!((r.status, code(&r)), (415, "invalid_request".into()));
    // The body cap: 1 MiB of code is refused, just under it runs.
    let big = "#".repeat(1 << 20);
    let r = execute(&d, &json!({"code": big}), Some("eryx_alpha"));
    assert_eq!((r.status, code(&r)), (413, "invalid_request".into()));
    let under = format!("{}\nprint('ok')", "#".repeat((1 << 20) - 100));
    let r = execute(&d, &json!({"code": under}), Some("eryx_alpha"));
    assert_eq!((r.status, r.json()["stdout"].as_str()), (200, Some("ok\n")));
    // One run at a time for alpha: a second is refused at once, beta is not held up,
    // and alpha's next run works once the first ended.
    let slow = in_background(
        &d,
        "import time\ntime.sleep(2)\nprint('slept')",
        Some("eryx_alpha"),
    );
    std::thread::sleep(Duration::from_millis(700));
    let t0 = Instant::now();
    let r = execute(&d, &ok, Some("eryx_alpha"));
    assert_eq!((r.status, code(&r)), (429, "concurrency_limit".into()));
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("limit: 1"));
    assert!(t0.elapsed() < Duration::from_millis(500), "not queued");
    let r = execute(&d, &ok, Some("eryx_beta"));
    assert_eq!((r.status, r.json()["stdout"].as_str()), (200, Some("1\n")));
    let answers = slow.join().unwrap();
    assert_eq!(answers.len(), 1);
    assert_eq!(
        answers[0].json()["stdout"],
        "slept\n",
        "{}",
        answers[0].text()
    );
    let r = execute(&d, &ok, Some("eryx_alpha"));
    assert_eq!(r.status, 200, "{}", r.text());
    d.stop();
}

#[test]
fn test_what_sandboxed_code_cannot_do_ends_in_a_status() {
    let d = Daemon::start();
    d.wait_ready();
    for (what, code, want) in [
        ("a socket", "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.connect(('127.0.0.1', 8090))", "PermissionError"),
        ("a file write", "open('/tmp/x', 'w').write('x')", "Error"),
        ("/proc", "print(open('/proc/self/status').read())", "Error"),
        ("os.system", "import os\nprint(os.system('id'))", "Error"),
        ("subprocess", "import subprocess\nsubprocess.run(['id'])", "Error"),
        ("ctypes", "import ctypes\nctypes.CDLL(None)", "Error"),
        ("a native module", "import numpy", "ModuleNotFoundError"),
        ("deep recursion", "def f(n):\n    return f(n + 1)\nf(0)", "RecursionError"),
    ] {
        let v = run(&d, json!({"code": code}));
        assert_eq!(v["status"], "error", "{what}: {v}");
        assert!(v["error"].as_str().unwrap().contains(want), "{what}: {v}");
        assert_eq!(v["stdout"], "", "{what}: {v}");
    }
    let v = run(&d, json!({"code": "x = bytearray(1 << 30)"}));
    assert_eq!(v["status"], "resource_limit", "{v}");
    // Raw writes to fd 1 and 2 go nowhere the daemon reads: not into its log.
    let v = run(
        &d,
        json!({"code": "import os\nos.write(2, b'INJECTED-LINE\\n')\nprint('fine')"}),
    );
    assert_eq!(v["status"], "success", "{v}");
    assert!(!d.log().contains("INJECTED-LINE"), "{}", d.log());
    assert_eq!(run(&d, json!({"code": "print(7)"}))["stdout"], "7\n");
    d.stop();
}

#[test]
fn test_the_worker_is_jailed_and_a_killed_worker_fails_only_its_runs() {
    let d = Daemon::start();
    d.wait_ready();
    assert_eq!(run(&d, json!({"code": "print(1)"}))["stdout"], "1\n");
    // ISOBOX_WASM_THREADS (2) worker processes, each jailed the same way.
    let pids = worker_pids(&d);
    assert_eq!(pids.len(), 2, "{pids:?}");
    // The first run went to the first worker ready; the other may still be loading:
    // its filter goes on before it says it is ready.
    let filtered = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
            s.lines()
                .any(|l| l.split_whitespace().eq(["Seccomp:", "2"]))
        })
    };
    let t0 = Instant::now();
    while !pids.iter().all(filtered) && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    for pid in &pids {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        };
        // Its own uid, not nobody's (gVisor's processes on a root image run as nobody).
        assert_eq!(field("Uid:"), "65532 65532 65532 65532", "{status}");
        assert_eq!(field("Gid:"), "65532 65532 65532 65532", "{status}");
        assert_eq!(field("Groups:"), "", "{status}");
        assert_eq!(field("NoNewPrivs:"), "1", "{status}");
        assert_eq!(field("CapEff:"), "0000000000000000", "{status}");
        // Its own seccomp filter (mode 2), installed on every thread before the first run.
        assert_eq!(field("Seccomp:"), "2", "{status}");
        let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/net")).unwrap();
        assert_ne!(
            ns(&pid.to_string()),
            ns("self"),
            "its own network namespace"
        );
        assert_sees_only_its_view(&d, *pid);
    }
    // Each in a cgroup of its own with its share of ISOBOX_WASM_WORKER_MEMORY_MB.
    let cgroups = || -> Vec<std::path::PathBuf> {
        std::path::PathBuf::from("/sys/fs/cgroup/memory")
            .join(&d.instance)
            .read_dir()
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("wasm-worker-"))
            .map(|e| e.path())
            .collect()
    };
    let mems = cgroups();
    assert_eq!(mems.len(), 2, "{mems:?}");
    for mem in &mems {
        let cap: u64 = std::fs::read_to_string(mem.join("memory.limit_in_bytes"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(cap, 512 << 20);
    }
    // Two runs at once go to the two workers. kill -9 of one mid-run: its run gets
    // 500 internal_error, the other run finishes on the other worker, and the next
    // run works.
    let sleeper = "import time\ntime.sleep(4)\nprint('survived')";
    let first = in_background(&d, sleeper, None);
    std::thread::sleep(Duration::from_millis(300));
    let second = in_background(&d, sleeper, None);
    std::thread::sleep(Duration::from_millis(800));
    let t0 = Instant::now();
    unsafe_free_kill(pids[0]);
    let mut answers = [
        first.join().unwrap().remove(0),
        second.join().unwrap().remove(0),
    ];
    answers.sort_by_key(|a| a.status);
    assert_eq!(answers[0].status, 200, "{}", answers[0].text());
    assert_eq!(answers[0].json()["stdout"], "survived\n");
    assert_eq!(answers[1].status, 500, "{}", answers[1].text());
    assert_eq!(code(&answers[1]), "internal_error");
    assert!(t0.elapsed() < Duration::from_secs(8));
    assert_eq!(run(&d, json!({"code": "print(2)"}))["stdout"], "2\n");
    let again = worker_pids(&d);
    assert_eq!(again.len(), 2, "{again:?}");
    assert!(!again.contains(&pids[0]), "{again:?}");
    assert!(
        again.contains(&pids[1]),
        "the other worker was left alone: {again:?}"
    );
    // Nothing left: the killed worker's cgroup is gone now, the others with the daemon.
    assert_eq!(cgroups().len(), 2);
    d.stop();
    for pid in again {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "a worker outlived the daemon"
        );
    }
}

/// A worker's files: a mount namespace of its own whose root holds the system's
/// programs and libraries, the worker itself, the snapshot cache and the uploaded
/// environments (all read-only) and a `/proc` showing only its user's processes; none
/// of the daemon's data (its store, sessions, volumes, runs) nor the host's `/tmp`,
/// `/etc` or `/dev`.
fn assert_sees_only_its_view(d: &Daemon, pid: u32) {
    // Not noexec: the snapshots there are compiled code, mapped executable.
    common::assert_jailed_mounts(
        pid,
        &[
            ("/var/cache/isobox/wasm".into(), "ro,nosuid,nodev"),
            (
                d.data_dir.join("eryx-envs").display().to_string(),
                "ro,nosuid,nodev",
            ),
        ],
    );
    // Seen from the host through its root: of the daemon's data directory only the
    // environments, though the store, the runs and the rest are there.
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    let inside = |p: &std::path::Path| root.join(p.strip_prefix("/").unwrap());
    let listed = |p: &std::path::Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert!(listed(&d.data_dir).len() > 1, "{:?}", listed(&d.data_dir));
    assert_eq!(listed(&inside(&d.data_dir)), ["eryx-envs"]);
    for hidden in ["/etc", "/dev", "/home", "/root", "/run", "/var/lib", "/sys"] {
        assert!(
            !inside(std::path::Path::new(hidden)).exists(),
            "{hidden} is in the worker's view"
        );
    }
}

/// SIGKILL through kill(1): the test needs no unsafe code of its own.
fn unsafe_free_kill(pid: u32) {
    let ok = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

/// The worker's seccomp filter, tried by the worker itself (`isobox-wasm selftest`):
/// sockets, fork, exec, namespaces, ptrace, signals to other processes, x32 calls and
/// the new mount API refused; threads, memory and signals to itself fine; `clone3`
/// answered ENOSYS so threads go through `clone`, whose flags it checks.
#[test]
fn test_the_workers_seccomp_filter_refuses_what_an_escape_needs() {
    let worker = std::path::Path::new(env!("CARGO_BIN_EXE_isoboxd")).with_file_name("isobox-wasm");
    let out = std::process::Command::new(&worker)
        .arg("selftest")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "socket_inet=EPERM",
            "socket_unix=EPERM",
            "fork=EPERM",
            "execve=EPERM",
            "unshare=EPERM",
            "ptrace=EPERM",
            "clone3=ENOSYS",
            "kill_init=EPERM",
            "tgkill_init=EPERM",
            "tgkill_self=ok",
            "x32_getpid=EPERM",
            "fsopen=EPERM",
            "thread=ok",
            "alloc=ok",
        ],
        "{text}"
    );
}

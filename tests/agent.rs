//! The server-side agent against the real daemon: a local OpenAI-compatible server
//! started here replays scripted streamed completions; tools run in a real kernel
//! session (real gVisor, cgroups, LMDB); the client reads the SSE stream as a browser
//! would. Every connection goes to 127.0.0.1.

mod common;
#[path = "common/fakemodel.rs"]
mod fakemodel;

use common::session::Session;
use common::sse::events;
use common::{Daemon, Resp};
use fakemodel::{call, say, Fake, Reply};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEY: &str = "sk-test-9f8e7d6c5b4a39281706";

fn agent_daemon(fake: &Fake, extra: &[(&str, &str)]) -> Daemon {
    let base = fake.base();
    let search = format!("http://{}/html/", fake.addr);
    let mut env = vec![
        ("ISOBOX_AI_BASE", base.as_str()),
        ("ISOBOX_AI_KEY", KEY),
        ("ISOBOX_AI_MODEL", "test-model"),
        ("ISOBOX_AI_SEARCH_URL", search.as_str()),
        ("ISOBOX_AI_RATE_PER_MIN", "1000"),
        ("ISOBOX_LOG", "debug"),
    ];
    env.extend_from_slice(extra);
    let d = Daemon::start_with(&env);
    d.wait_ready();
    d
}

fn post_agent(d: &Daemon, body: &Value) -> Resp {
    d.request(
        "POST",
        "/v1/agent",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

fn names(ev: &[(String, Value)]) -> Vec<&str> {
    ev.iter().map(|(n, _)| n.as_str()).collect()
}

fn run(d: &Daemon, s: &Session, text: &str, max_iters: Option<u32>) -> Vec<(String, Value)> {
    let mut body = json!({
        "messages": [{"role": "user", "content": text}],
        "session": {"id": s.id, "token": s.token},
    });
    if let Some(m) = max_iters {
        body["maxIters"] = m.into();
    }
    events(&post_agent(d, &body))
}

fn assert_key_hidden(d: &Daemon, texts: &[&str]) {
    for t in texts {
        assert!(!t.contains(KEY), "the model key leaked: {t}");
    }
    assert!(!d.log().contains(KEY), "the model key is in the log");
}

#[test]
fn test_probe_and_disabled() {
    let d = Daemon::start();
    let r = d.get("/v1/agent");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"enabled": false}));
    let r = post_agent(
        &d,
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 501, "{}", r.text());
    assert_eq!(r.json()["error"], "agent_disabled");
    d.stop();

    // On: the probe names the model and calls nobody; keys guard POST, not the probe.
    let fake = Fake::start(vec![]);
    let d = agent_daemon(&fake, &[("ISOBOX_API_KEYS", "client-key-1")]);
    let r = d.get("/v1/agent");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"enabled": true, "model": "test-model"}));
    assert!(
        fake.seen().is_empty(),
        "the probe must not call the upstream"
    );
    let r = post_agent(
        &d,
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    // Malformed bodies: 400 before any stream.
    let bad = |body: &[u8]| d.request("POST", "/v1/agent", &[("X-API-Key", "client-key-1")], body);
    for body in [
        &b"{not json"[..],
        br#"{"messages": "hi"}"#,
        br#"{"messages": []}"#,
        br#"{"messages": [{"role": "wizard", "content": "x"}]}"#,
        br#"{"messages": [{"role": "user", "content": "x"}], "extra": 1}"#,
        br#"{"messages": [{"role": "user", "content": "x"}], "session": {"id": 5}}"#,
    ] {
        let r = bad(body);
        assert_eq!(
            r.status,
            400,
            "{}: {}",
            String::from_utf8_lossy(body),
            r.text()
        );
        assert_eq!(r.json()["error"], "invalid_json");
    }
    // The 1 MiB body cap: at the cap it is read (and found to lack a session), above it 413.
    let pad = |n: usize| {
        let mut b = br#"{"messages":[{"role":"user","content":""#.to_vec();
        let tail = br#""}]}"#;
        b.resize(n - tail.len(), b'x');
        b.extend_from_slice(tail);
        b
    };
    let r = bad(&pad(1 << 20));
    let ev = events(&r);
    assert_eq!(names(&ev), ["error", "done"]);
    assert_eq!(ev[0].1["code"], "session_required");
    let r = bad(&pad((1 << 20) + 1));
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(fake.seen().is_empty());
    d.stop();

    // The public demo's setup (keys only on memory routes): the agent still needs one.
    let d = agent_daemon(
        &fake,
        &[
            ("ISOBOX_API_KEYS", "client-key-1"),
            ("ISOBOX_MEMORY_REQUIRE_KEY", "1"),
        ],
    );
    assert_eq!(d.get("/v1/agent").status, 200);
    let r = post_agent(
        &d,
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(
        d.get("/runtimes").status,
        200,
        "other routes stay open there"
    );
    d.stop();
}

#[test]
fn test_tool_loop_event_sequence() {
    let fake = Fake::start(vec![
        call(
            "Let me compute.",
            &[("c1", "run_python", json!({"code": "x = 6*7\nprint(x)"}))],
        ),
        call(
            "",
            &[
                (
                    "c2",
                    "run_shell",
                    json!({"command": "echo from-bash; cd /tmp && pwd; nosuchcmd"}),
                ),
                (
                    "c3",
                    "run_python",
                    json!({"code": "import os; print(x + 1, os.getcwd())"}),
                ),
            ],
        ),
        say("The answer is 42."),
    ]);
    let d = agent_daemon(&fake, &[]);
    let s = Session::kernel(&d);
    let started = Instant::now();
    let r = post_agent(
        &d,
        &json!({
            "messages": [{"role": "user", "content": "what is 6*7?"}],
            "session": {"id": s.id, "token": s.token},
        }),
    );
    let ev = events(&r);
    assert_eq!(
        names(&ev),
        [
            "token",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "token",
            "token",
            "token",
            "token",
            "done"
        ],
        "{ev:?}"
    );
    assert_eq!(ev[0].1, json!({"text": "Let me compute."}));
    assert_eq!(
        ev[1].1,
        json!({"id": "c1", "name": "run_python", "arguments": "{\"code\":\"x = 6*7\\nprint(x)\"}"})
    );
    let r1 = &ev[2].1;
    assert_eq!(r1["id"], "c1");
    assert_eq!(r1["stdout"], "42\n");
    assert_eq!(r1["stderr"], "");
    assert_eq!(r1["exitCode"], 0);
    assert_eq!(r1["truncated"], false);
    assert!(r1["durationMs"].as_u64().is_some());
    assert!(
        r1.get("artifacts").is_none(),
        "no artifacts, no field: {r1}"
    );
    assert_eq!(ev[3].1["name"], "run_shell");
    let r2 = &ev[4].1;
    assert_eq!(r2["id"], "c2");
    assert_eq!(r2["stdout"], "from-bash\n/tmp\n");
    assert!(
        r2["stderr"]
            .as_str()
            .unwrap()
            .contains("nosuchcmd: command not found"),
        "{r2}"
    );
    assert_eq!(r2["exitCode"], 127, "bash's real exit status: {r2}");
    // The kernel kept x; the shell's cd was its own.
    assert_eq!(ev[6].1["stdout"], "43 /workspace\n");
    let text: String = ev[7..11]
        .iter()
        .map(|(_, v)| v["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "The answer is 42.");
    assert_eq!(ev[11].1, json!({"finishReason": "stop", "iterations": 3}));

    // What the model was sent.
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 3);
    assert_eq!(fake.unused(), 0);
    for (i, seen) in fake.seen().iter().enumerate() {
        assert_eq!(seen.path, "/v1/chat/completions", "request {i}");
        assert_eq!(
            seen.authorization.as_deref(),
            Some(&*format!("Bearer {KEY}"))
        );
    }
    let first = &reqs[0];
    assert_eq!(first["model"], "test-model");
    assert_eq!(first["stream"], true);
    let tools: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["run_python", "run_shell", "web_search"]);
    let msgs = first["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["role"], "system");
    assert_eq!(msgs[1], json!({"role": "user", "content": "what is 6*7?"}));
    let msgs = reqs[1]["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 4);
    assert_eq!(msgs[2]["role"], "assistant");
    assert_eq!(msgs[2]["content"], "Let me compute.");
    assert_eq!(msgs[2]["tool_calls"][0]["id"], "c1");
    assert_eq!(msgs[2]["tool_calls"][0]["function"]["name"], "run_python");
    assert_eq!(msgs[3]["role"], "tool");
    assert_eq!(msgs[3]["tool_call_id"], "c1");
    let fed: Value = serde_json::from_str(msgs[3]["content"].as_str().unwrap()).unwrap();
    assert_eq!(fed["stdout"], "42\n");
    assert_eq!(fed["exitCode"], 0);
    let msgs = reqs[2]["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 7);
    assert_eq!(msgs[4]["role"], "assistant");
    assert_eq!(msgs[4]["content"], Value::Null);
    assert_eq!(msgs[5]["tool_call_id"], "c2");
    assert_eq!(msgs[6]["tool_call_id"], "c3");
    let fed: Value = serde_json::from_str(msgs[5]["content"].as_str().unwrap()).unwrap();
    assert_eq!(fed["exitCode"], 127);
    assert!(started.elapsed() < Duration::from_secs(60));

    // The session is the client's again: the loop's state is there.
    assert_eq!(s.step(&d, "print(x)")["run"]["stdout"], "42\n");
    assert_key_hidden(&d, &[&r.text()]);
    d.stop();
}

#[test]
fn test_cut_artifacts_shell_timeout_and_max_iterations() {
    let fake = Fake::start(vec![
        call(
            "",
            &[
                (
                    "big",
                    "run_python",
                    json!({"code": "print('a' * 40000); import sys; print('e' * 3000, file=sys.stderr)"}),
                ),
                (
                    "fig",
                    "run_python",
                    json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nprint('plotted')"}),
                ),
            ],
        ),
        call(
            "",
            &[
                (
                    "slow",
                    "run_shell",
                    json!({"command": "echo start; sleep 30; echo never"}),
                ),
                ("after", "run_python", json!({"code": "print('alive')"})),
                ("bad", "run_python", json!({"nope": 1})),
                ("who", "no_such_tool", json!({})),
            ],
        ),
        // maxIters is 2: this one is never asked for.
        say("unreachable"),
    ]);
    let d = agent_daemon(&fake, &[("ISOBOX_AI_SHELL_WALL_SEC", "2")]);
    let s = Session::kernel(&d);
    let ev = run(&d, &s, "go", Some(2));
    assert_eq!(
        names(&ev),
        [
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "done"
        ],
        "{ev:?}"
    );
    // 16 KiB of stdout+stderr at most, stderr keeping its share; the rest is cut.
    let big = &ev[1].1;
    let (o, e) = (
        big["stdout"].as_str().unwrap().len(),
        big["stderr"].as_str().unwrap().len(),
    );
    assert_eq!(big["truncated"], true);
    assert_eq!(o + e, 16 * 1024, "{o} + {e}");
    assert_eq!(e, 3001, "a short stderr is kept whole");
    assert!(big["stdout"].as_str().unwrap().bytes().all(|b| b == b'a'));
    // The figure goes to the client, not to the model.
    let fig = &ev[3].1;
    assert_eq!(fig["stdout"], "plotted\n");
    let arts = fig["artifacts"].as_array().expect("artifacts");
    assert_eq!(arts.len(), 1);
    assert_eq!(arts[0]["type"], "image/png");
    assert!(arts[0]["dataB64"]
        .as_str()
        .unwrap()
        .starts_with("iVBORw0KGgo"));
    // Killed in place at its wall; the kernel lives on.
    let slow = &ev[5].1;
    assert_eq!(slow["exitCode"], 124, "{slow}");
    assert_eq!(slow["stdout"], "start\n");
    assert!(
        slow["stderr"]
            .as_str()
            .unwrap()
            .contains("[shell timed out after 2s]"),
        "{slow}"
    );
    assert!(slow["durationMs"].as_u64().unwrap() < 10_000);
    assert_eq!(ev[7].1["stdout"], "alive\n");
    assert_eq!(ev[9].1["exitCode"], 1);
    assert!(
        ev[9].1["stderr"].as_str().unwrap().contains("\"code\""),
        "{}",
        ev[9].1
    );
    assert_eq!(ev[11].1["exitCode"], 1);
    assert!(ev[11].1["stderr"]
        .as_str()
        .unwrap()
        .contains("no such tool"));
    assert_eq!(
        ev[12].1,
        json!({"finishReason": "max_iterations", "iterations": 2})
    );

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "maxIters bounds the model calls");
    let msgs = reqs[1]["messages"].as_array().unwrap();
    let fed = msgs[3]["content"].as_str().unwrap();
    let fedv: Value = serde_json::from_str(fed).unwrap();
    assert_eq!(fedv["truncated"], true);
    assert_eq!(
        fedv["stdout"].as_str().unwrap().len() + fedv["stderr"].as_str().unwrap().len(),
        16 * 1024
    );
    let fed_fig = msgs[4]["content"].as_str().unwrap();
    assert!(
        !fed_fig.contains("iVBOR") && !fed_fig.contains("dataB64"),
        "{fed_fig}"
    );

    // maxIters above the operator's ceiling is clamped to it (8 by default) and 0 to 1.
    let fake2 = Fake::start(
        (0..10)
            .map(|i| {
                call(
                    "",
                    &[("l", "run_python", json!({"code": format!("print({i})")}))],
                )
            })
            .collect(),
    );
    let d2 = agent_daemon(&fake2, &[("ISOBOX_AI_MAX_ITERS", "3")]);
    let s2 = Session::kernel(&d2);
    let ev = run(&d2, &s2, "loop", Some(50));
    assert_eq!(
        ev.last().unwrap().1,
        json!({"finishReason": "max_iterations", "iterations": 3})
    );
    assert_eq!(fake2.requests().len(), 3);
    let ev = run(&d2, &s2, "loop", Some(0));
    assert_eq!(
        ev.last().unwrap().1,
        json!({"finishReason": "max_iterations", "iterations": 1})
    );
    assert_eq!(fake2.requests().len(), 4);
    d2.stop();
    d.stop();
}

#[test]
fn test_kernel_dead_and_session_errors() {
    let fake = Fake::start(vec![
        call(
            "",
            &[(
                "sleepy",
                "run_python",
                json!({"code": "print('zz', flush=True)\nimport time\ntime.sleep(60)"}),
            )],
        ),
        say("never asked"),
    ]);
    let d = agent_daemon(&fake, &[("ISOBOX_AI_PYTHON_WALL_SEC", "2")]);
    let s = Session::kernel(&d);
    let ev = run(&d, &s, "sleep", None);
    assert_eq!(
        names(&ev),
        ["tool_call", "tool_result", "error", "done"],
        "{ev:?}"
    );
    assert_eq!(ev[1].1["exitCode"], 137);
    assert_eq!(ev[1].1["stdout"], "zz\n");
    assert_eq!(ev[2].1["code"], "kernel_dead");
    assert!(
        ev[2].1["message"].as_str().unwrap().contains("wall time"),
        "{}",
        ev[2].1
    );
    assert_eq!(ev[3].1, json!({"finishReason": "error", "iterations": 1}));
    assert_eq!(
        fake.requests().len(),
        1,
        "the loop stops; the model is not asked again"
    );

    // The next loop on the dead kernel stops at its first tool call.
    let fake_calls = Fake::start(vec![call("", &[("a", "run_python", json!({"code": "1"}))])]);
    let d2 = agent_daemon(&fake_calls, &[]);
    let s2 = Session::kernel(&d2);
    assert_eq!(s2.delete(&d2).status, 204);
    let ev = run(&d2, &s2, "x", None);
    assert_eq!(names(&ev), ["error", "done"], "{ev:?}");
    assert_eq!(
        ev[0].1["code"], "session_invalid",
        "a deleted session: {ev:?}"
    );

    // Session errors: missing, wrong token, not a kernel.
    let ev = events(&post_agent(
        &d2,
        &json!({"messages": [{"role": "user", "content": "x"}]}),
    ));
    assert_eq!(names(&ev), ["error", "done"]);
    assert_eq!(ev[0].1["code"], "session_required");
    assert_eq!(ev[1].1, json!({"finishReason": "error", "iterations": 0}));
    let s3 = Session::kernel(&d2);
    let wrong = Session {
        token: "not-the-token".into(),
        ..s3.clone()
    };
    let ev = run(&d2, &wrong, "x", None);
    assert_eq!(ev[0].1["code"], "session_invalid");
    let fs_session = Session::create(&d2, &json!({"runtime": "python"}));
    let ev = run(&d2, &fs_session, "x", None);
    assert_eq!(ev[0].1["code"], "session_invalid");
    assert!(
        ev[0].1["message"].as_str().unwrap().contains("kernel"),
        "{ev:?}"
    );
    assert!(
        fake_calls.requests().is_empty(),
        "no model call without a usable session"
    );
    d2.stop();
    d.stop();
}

#[test]
fn test_upstream_errors_hangs_and_key_hygiene() {
    let fake = Fake::start(vec![
        Reply::Status(500, "upstream broke; you sent {auth}".into()),
        Reply::Hang,
        Reply::Cut(vec![json!({"choices": [{"delta": {"content": "half"}}]})]),
        Reply::Stream(vec![json!({"error": {"message": "rate limit reached"}})]),
    ]);
    let d = agent_daemon(
        &fake,
        &[("ISOBOX_AI_TIMEOUT_SEC", "2"), ("ISOBOX_KERNELS_MAX", "1")],
    );
    let s = Session::kernel(&d);
    let r500 = post_agent(
        &d,
        &json!({"messages": [{"role": "user", "content": "x"}], "session": {"id": s.id, "token": s.token}}),
    );
    let ev = events(&r500);
    assert_eq!(names(&ev), ["error", "done"], "{ev:?}");
    assert_eq!(ev[0].1["code"], "upstream_error");
    let msg = ev[0].1["message"].as_str().unwrap();
    assert!(msg.contains("500"), "{msg}");
    assert!(
        msg.contains("[redacted]"),
        "the key echoed by the upstream is scrubbed: {msg}"
    );
    assert_eq!(ev[1].1, json!({"finishReason": "error", "iterations": 1}));

    // A hanging upstream: upstream_error after the timeout. Meanwhile the one loop slot
    // (ISOBOX_KERNELS_MAX=1) is taken: a second loop gets 429.
    let d_ref = &d;
    let hung = std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let t = Instant::now();
            (run(d_ref, &s, "x", None), t.elapsed())
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while fake.seen().len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let r = post_agent(
            d_ref,
            &json!({"messages": [{"role": "user", "content": "y"}], "session": {"id": s.id, "token": s.token}}),
        );
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.json()["error"], "too_many_agents");
        assert!(r.header("retry-after").is_some());
        h.join().unwrap()
    });
    let (ev, took) = hung;
    assert_eq!(names(&ev), ["error", "done"], "{ev:?}");
    assert_eq!(ev[0].1["code"], "upstream_error");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(15),
        "{took:?}"
    );

    // A stream that ends without finishing, and an error object in the stream.
    let ev = run(&d, &s, "x", None);
    assert_eq!(names(&ev), ["token", "error", "done"], "{ev:?}");
    assert!(
        ev[1].1["message"]
            .as_str()
            .unwrap()
            .contains("ended before"),
        "{ev:?}"
    );
    let ev = run(&d, &s, "x", None);
    assert_eq!(names(&ev), ["error", "done"], "{ev:?}");
    assert!(ev[0].1["message"]
        .as_str()
        .unwrap()
        .contains("rate limit reached"));

    // Unreachable upstream.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let gone = Fake {
        addr: closed,
        script: Arc::new(Mutex::new(VecDeque::new())),
        seen: Arc::new(Mutex::new(Vec::new())),
    };
    let d2 = agent_daemon(&gone, &[]);
    let s2 = Session::kernel(&d2);
    let ev = run(&d2, &s2, "x", None);
    assert_eq!(ev[0].1["code"], "upstream_error");
    assert!(ev[0].1["message"]
        .as_str()
        .unwrap()
        .contains("could not be reached"));
    // The daemon still serves, and the key is in no answer and no log line.
    assert_eq!(d.get("/healthz").status, 200);
    assert_key_hidden(&d, &[&r500.text(), &d.get("/v1/agent").text()]);
    assert_key_hidden(&d2, &[]);
    d2.stop();
    d.stop();
}

#[test]
fn test_web_search_rate_limit_and_disconnect() {
    let page = r##"<div class="result"><a rel="nofollow" class="result__a" href="//duckduckgo.com/l/?uddg=https%3A%2F%2Fgvisor.dev%2Fdocs%2F&amp;rut=x">gVisor <b>docs</b></a>
<a class="result__snippet" href="#">An application kernel for containers.</a></div>
<div class="result"><a rel="nofollow" class="result__a" href="https://example.org/isobox">isobox &amp; friends</a></div>"##;
    let fake = Fake::start(vec![
        call(
            "",
            &[(
                "s1",
                "web_search",
                json!({"query": "gvisor sandbox", "max_results": 5}),
            )],
        ),
        Reply::Html(page.into()),
        say("found it"),
        // Second loop: the client leaves while the model "thinks".
        Reply::Hang,
    ]);
    let d = agent_daemon(&fake, &[("ISOBOX_AI_TIMEOUT_SEC", "3")]);
    let s = Session::kernel(&d);
    let ev = run(&d, &s, "search", None);
    assert_eq!(
        names(&ev),
        ["tool_call", "tool_result", "token", "token", "done"],
        "{ev:?}"
    );
    let res = &ev[1].1;
    assert_eq!(res["exitCode"], 0, "{res}");
    assert_eq!(
        res["stdout"],
        "1. gVisor docs\n   https://gvisor.dev/docs/\n   An application kernel for containers.\n\
         2. isobox & friends\n   https://example.org/isobox\n"
    );
    let searched = fake
        .seen()
        .into_iter()
        .find(|s| s.path.starts_with("/html/"))
        .unwrap();
    assert_eq!(searched.path, "/html/?q=gvisor%20sandbox");
    assert_eq!(
        searched.authorization, None,
        "the model key never goes to the search engine"
    );

    // A client that leaves mid-loop: the loop stops; nothing more is asked of the model.
    let mut c = d.connect();
    let body = json!({"messages": [{"role": "user", "content": "x"}], "session": {"id": s.id, "token": s.token}}).to_string();
    write!(
        c,
        "POST /v1/agent HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.requests().len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(c);
    // Past the upstream read timeout the abandoned loop's thread has noticed.
    std::thread::sleep(Duration::from_secs(4));
    let asked = fake.seen().len();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        fake.seen().len(),
        asked,
        "the abandoned loop made no further calls"
    );
    // The kernel is free for its session.
    assert_eq!(
        s.step(&d, "print('still here')")["run"]["stdout"],
        "still here\n"
    );
    d.stop();

    // Search unreachable: a tool error, not made-up results. Search off: not offered.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let fake = Fake::start(vec![
        call("", &[("s2", "web_search", json!({"query": "x"}))]),
        say("ok"),
    ]);
    let search = format!("http://{closed}/html/");
    let d = agent_daemon(&fake, &[("ISOBOX_AI_SEARCH_URL", &search)]);
    let s = Session::kernel(&d);
    let ev = run(&d, &s, "search", None);
    assert_eq!(ev[1].1["exitCode"], 1);
    assert!(
        ev[1].1["stderr"]
            .as_str()
            .unwrap()
            .contains("could not be reached"),
        "{ev:?}"
    );
    assert_eq!(ev[1].1["stdout"], "");
    d.stop();
    let fake = Fake::start(vec![
        call("", &[("s3", "web_search", json!({"query": "x"}))]),
        say("ok"),
    ]);
    let d = agent_daemon(
        &fake,
        &[("ISOBOX_AI_SEARCH", "off"), ("ISOBOX_AI_RATE_PER_MIN", "3")],
    );
    let s = Session::kernel(&d);
    let ev = run(&d, &s, "search", None);
    assert!(
        ev[1].1["stderr"].as_str().unwrap().contains("no such tool"),
        "{ev:?}"
    );
    let tools = fake.requests()[0]["tools"].as_array().unwrap().len();
    assert_eq!(tools, 2);
    // The per-client loop limit (3 a minute here; that loop was the first): two more
    // starts, then 429. The general /execute bucket is not this one.
    for _ in 0..2 {
        let r = post_agent(&d, &json!({"messages": [{"role": "user", "content": "x"}]}));
        assert_eq!(events(&r)[0].1["code"], "session_required");
    }
    let r = post_agent(&d, &json!({"messages": [{"role": "user", "content": "x"}]}));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"], "rate_limited");
    assert!(r.header("retry-after").is_some());
    assert_eq!(s.step(&d, "print(1)")["run"]["stdout"], "1\n");
    d.stop();
}

#[test]
fn test_shutdown_ends_running_loops_at_once() {
    let fake = Fake::start(vec![Reply::Hang]);
    let d = agent_daemon(&fake, &[("ISOBOX_SHUTDOWN_GRACE_MS", "20000")]);
    let s = Session::kernel(&d);
    let mut c = d.connect();
    let body = json!({"messages": [{"role": "user", "content": "x"}],
        "session": {"id": s.id, "token": s.token}})
    .to_string();
    write!(
        c,
        "POST /v1/agent HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.requests().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fake.requests().len(), 1);
    // The model is "thinking" (the upstream never answers): a SIGTERM ends the stream
    // with shutting_down at once, and the daemon exits long before its 20 s grace.
    let t = Instant::now();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(c);
        common::read_response(&mut r, false)
    });
    d.stop();
    let took = t.elapsed();
    let r = reader
        .join()
        .unwrap()
        .expect("the stream ended with a response");
    let ev = events(&r);
    assert_eq!(names(&ev), ["error", "done"], "{ev:?}");
    assert_eq!(ev[0].1["code"], "shutting_down");
    assert_eq!(ev[1].1, json!({"finishReason": "error", "iterations": 1}));
    assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
}

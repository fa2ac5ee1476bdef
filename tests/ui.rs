//! The web UI (`GET /`) in a real browser: the real daemon (with an API key configured)
//! serves the page, and node scripts drive Debian's headless Chromium through it with
//! playwright-core:
//! - `tests/ui/notebook.test.mjs`: notebook cells on a kernel session, streaming,
//!   artifacts, one-shot runs, the file panel, the chat pane against a fake model
//!   endpoint (browser-direct) and a mocked `/v1/agent`, the key field, a narrow screen;
//! - `tests/ui/console.test.mjs`: the Sandboxes view: create, a terminal (xterm.js on
//!   the process WebSocket) typed into and resized with the window, the file browser
//!   (upload, download byte-identical, the live `fs/watch` feed, delete), pause,
//!   resume, extend, delete; the Jobs view (a failing job's tests in its digest
//!   table, its receipt's signature checked, a result file, retry, cancel; a batch's
//!   graph with the failed job and its cancelled dependant); the
//!   WebAssembly playground (compute units, a session, a unit limit); the Metrics
//!   view's charts moving while runs happen;
//! - `tests/ui/agent.test.mjs`: the chat in server-agent mode against the daemon's real
//!   agent, whose OpenAI-compatible upstream is a scripted fake model server started
//!   here (tool calls run in the page's own kernel session).
//!
//! Needs `node`, `/usr/bin/chromium` and `tests/ui/node_modules` (`make test` installs
//! all three); without them these tests FAIL, they never skip. The two browser runs
//! take turns (timing checks in the notebook script should not share 2 cores with a
//! second browser).

mod common;
#[path = "common/fakemodel.rs"]
mod fakemodel;

use common::Daemon;
use fakemodel::{call, say_paced, Fake, Reply};
use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

const KEY: &str = "ui-test-key";

/// One browser at a time.
static BROWSER: Mutex<()> = Mutex::new(());

fn one_browser() -> MutexGuard<'static, ()> {
    // A failed test poisons the lock; the next one may still run.
    BROWSER.lock().unwrap_or_else(|e| e.into_inner())
}

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The node binary and the browser, checked up front so a missing one is one clear failure.
fn prerequisites() -> (String, String) {
    let node = std::env::var("ISOBOX_TEST_NODE").unwrap_or_else(|_| "node".into());
    match Command::new(&node).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => panic!(
            "`{node}` does not run: the UI test needs Node.js (Debian packages nodejs and npm; \
             `make deps` installs them)"
        ),
    }
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: the UI test needs Debian's chromium package \
         (`apt-get install --no-install-recommends chromium`; `make deps` installs it)"
    );
    let pw = manifest().join("tests/ui/node_modules/playwright-core/package.json");
    assert!(
        pw.exists(),
        "{} is missing: run `npm ci --prefix tests/ui` (`make test-ui-deps` does)",
        pw.display()
    );
    (node, chromium)
}

/// Reads a child's pipe to the end on a thread.
fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Runs `node tests/ui/<script> http://<daemon>` with these extra environment
/// variables (and `ISOBOX_UI_ARTIFACTS`), prints its output, and fails the test (with
/// its output and the daemon's log) unless it exits 0. Returns its stdout.
fn run_browser(d: &Daemon, node: &str, script: &str, env: &[(&str, &str)]) -> String {
    let started = Instant::now();
    let mut cmd = Command::new(node);
    cmd.arg(manifest().join("tests/ui").join(script))
        .arg(format!("http://{}", d.addr))
        .env(
            "ISOBOX_UI_ARTIFACTS",
            manifest().join("target/ui-artifacts"),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start node");
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    // The scripts have their own ceilings (100 s, 60 s); this one only guards against a
    // wedged node.
    let deadline = started + Duration::from_secs(150);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    println!(
        "browser test {script} ({:.1} s):\n{out}{err}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "the browser test {script} failed ({status:?}):\n--- stdout\n{out}\n--- stderr\n{err}\n--- isoboxd log\n{}",
        d.log()
    );
    out
}

/// No kernel and no session workspace is left (waits a bounded while for the page's
/// DELETEs to land).
fn assert_sessions_ended(d: &Daemon) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let used = d.get("/healthz").json()["kernels"]["used"].as_u64();
        let sessions = std::fs::read_dir(d.data_dir.join("sessions"))
            .map(|r| r.count())
            .unwrap_or(0);
        if used == Some(0) && sessions == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left by the page: {used:?} kernels, {sessions} session workspaces\nlog:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn test_notebook_in_a_real_browser() {
    let (node, chromium) = prerequisites();
    let _turn = one_browser();
    let d = Daemon::start_with(&[("ISOBOX_API_KEYS", KEY)]);
    d.wait_ready();
    // The page itself needs no key (the API behind it does) and carries its policy.
    let page = d.get("/");
    assert_eq!(page.status, 200, "{}", page.text());
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(
        page.header("content-security-policy")
            .is_some_and(|c| c.contains("default-src 'none'")),
        "{:?}",
        page.headers
    );
    assert!(page.text().len() < 60 * 1024, "the page stays small");
    assert_eq!(d.get("/runtimes").status, 401);

    let artifacts: PathBuf = manifest().join("target/ui-artifacts");
    let shot = artifacts.join("notebook.png");
    let _ = std::fs::remove_file(&shot);
    run_browser(
        &d,
        &node,
        "notebook.test.mjs",
        &[("CHROMIUM", &chromium), ("ISOBOX_UI_KEY", KEY)],
    );
    let png = std::fs::read(&shot).expect("the screenshot was saved");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG screenshot");
    // The page ended its kernel sessions (End session, and the ended kernel it replaced):
    // no kernel, no workspace is left.
    assert_sessions_ended(&d);
    d.assert_clean();
    d.stop();
}

/// The Sandboxes view: a sandbox created from the page, a terminal typed into and
/// resized, files uploaded, downloaded and watched, pause, resume, extend, delete
/// (tests/ui/console.test.mjs).
#[test]
fn test_console_sandboxes_and_terminal_in_a_real_browser() {
    let (node, chromium) = prerequisites();
    let _turn = one_browser();
    let d = Daemon::start_with(&[("ISOBOX_API_KEYS", KEY)]);
    d.wait_ready();
    // The page's scripts are served from the binary, with the page's policy; a
    // name that is not one of them is a 404.
    for (file, ctype) in [
        ("app.js", "text/javascript; charset=utf-8"),
        ("console.js", "text/javascript; charset=utf-8"),
        ("xterm.js", "text/javascript; charset=utf-8"),
        ("addon-fit.js", "text/javascript; charset=utf-8"),
        ("xterm.css", "text/css; charset=utf-8"),
        ("editor.js", "text/javascript; charset=utf-8"),
    ] {
        let r = d.get(&format!("/ui/{file}"));
        assert_eq!(r.status, 200, "/ui/{file}: {}", r.text());
        assert_eq!(r.header("content-type"), Some(ctype), "/ui/{file}");
        assert!(
            r.header("content-security-policy")
                .is_some_and(|c| c.contains("script-src 'self';")),
            "/ui/{file}"
        );
    }
    let vendored =
        std::fs::read(manifest().join("ui/vendor/node_modules/@xterm/xterm/lib/xterm.js"))
            .expect("make ui-vendor fetched xterm.js");
    assert_eq!(
        d.get("/ui/xterm.js").body,
        vendored,
        "served as fetched from npm"
    );
    // The editor as bundled by `make ui-vendor`, its licences kept at its top.
    let editor = d.get("/ui/editor.js");
    assert_eq!(
        editor.body,
        std::fs::read(manifest().join("ui/vendor/dist/editor.js"))
            .expect("make ui-vendor bundled the editor"),
    );
    let head = String::from_utf8_lossy(&editor.body[..editor.body.len().min(4096)]).to_string();
    assert!(
        head.starts_with("/*! isobox web UI code editor")
            && head.contains("@codemirror/view@")
            && head.contains("MIT License"),
        "{head}"
    );
    for missing in ["nope.js", "..%2Findex.html", "xterm.js.map"] {
        assert_eq!(d.get(&format!("/ui/{missing}")).status, 404, "{missing}");
    }
    let shot = manifest().join("target/ui-artifacts/console.png");
    let _ = std::fs::remove_file(&shot);
    run_browser(
        &d,
        &node,
        "console.test.mjs",
        &[("CHROMIUM", &chromium), ("ISOBOX_UI_KEY", KEY)],
    );
    let png = std::fs::read(&shot).expect("the screenshot was saved");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG screenshot");
    // The page deleted its sandbox: nothing is left but the eryx face's two workers,
    // which live as long as the daemon (`stop` checks that they go with it).
    let left = wbx_list(&d);
    assert_eq!(left, json!([]), "sandboxes left by the page");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<String> = d
            .leftovers()
            .into_iter()
            .filter(|l| !l.contains("/wasm-worker-"))
            .collect();
        let idle = d.get("/healthz").json()["inFlight"] == 0;
        if left.is_empty() && idle {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: {left:?}\nlog:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    d.stop();
}

fn wbx_list(d: &Daemon) -> Value {
    let auth = format!("Bearer {KEY}");
    let r = d.request("GET", "/wbx/v1/sandboxes", &[("Authorization", &auth)], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["sandboxes"].clone()
}

// ---------- the chat against the real server-side agent ----------

/// The model key the daemon's agent sends upstream: it must never reach the browser.
const AI_KEY: &str = "sk-ui-agent-7f3e9d1c5b2a4e6f8091";
const MODEL: &str = "fake-agent-model";
/// The user's two chat messages (tests/ui/agent.test.mjs sends the same).
const ASK1: &str = "What is 6*7? Use Python, then try the shell.";
const ASK2: &str = "And once more?";
/// The first tool call: a figure, kernel state the notebook reads later, a file for the
/// file panel, and a line of output.
const PY_CODE: &str = "import matplotlib.pyplot as plt\n\
plt.plot([1, 2, 3], [1, 4, 9])\n\
answer = 6 * 7\n\
open(\"agent-note.txt\", \"w\").write(str(answer))\n\
print(\"six times seven is\", answer)";
const SH_CODE: &str = "echo from-shell; exit 3";

/// A tool message's content: the JSON result the agent fed the model.
fn fed(msg: &Value) -> Value {
    assert_eq!(msg["role"], "tool", "{msg}");
    let content = msg["content"].as_str().expect("a text content");
    serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content}"))
}

#[test]
fn test_chat_with_the_real_server_agent() {
    let (node, chromium) = prerequisites();
    let _turn = one_browser();
    let fake = Fake::start(vec![
        // The first message: text and a Python step, a shell step, a streamed answer.
        call(
            "Let me compute that in Python.",
            &[("call_py", "run_python", json!({ "code": PY_CODE }))],
        ),
        call(
            "",
            &[("call_sh", "run_shell", json!({ "command": SH_CODE }))],
        ),
        say_paced(
            "The answer is 42; the shell step exited with code 3.",
            Duration::from_millis(150),
        ),
        // The second message: the upstream fails, echoing the key it was sent.
        Reply::Status(500, "upstream overloaded; you sent {auth}".into()),
    ]);
    let base = fake.base();
    let d = Daemon::start_with(&[
        ("ISOBOX_API_KEYS", KEY),
        ("ISOBOX_AI_BASE", &base),
        ("ISOBOX_AI_MODEL", MODEL),
        ("ISOBOX_AI_KEY", AI_KEY),
        // Only the two tools the script uses; nothing leaves 127.0.0.1.
        ("ISOBOX_AI_SEARCH", "off"),
        ("ISOBOX_LOG", "debug"),
    ]);
    d.wait_ready();
    assert_eq!(
        d.get("/v1/agent").json(),
        json!({"enabled": true, "model": MODEL})
    );

    let shot = manifest().join("target/ui-artifacts/agent.png");
    let _ = std::fs::remove_file(&shot);
    let started = Instant::now();
    let out = run_browser(
        &d,
        &node,
        "agent.test.mjs",
        &[
            ("CHROMIUM", &chromium),
            ("ISOBOX_UI_KEY", KEY),
            ("ISOBOX_UI_MODEL", MODEL),
            ("ISOBOX_UI_SECRET", AI_KEY),
        ],
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the agent browser test took {:?}",
        started.elapsed()
    );
    let png = std::fs::read(&shot).expect("the screenshot was saved");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG screenshot");
    // The script scanned what the browser received for the model key (and found none).
    let scan = out
        .lines()
        .find_map(|l| l.strip_prefix("key scan: "))
        .expect("the script reports its key scan");
    assert!(scan.ends_with(" 0 hits"), "{scan}");

    // What the model endpoint was sent: four completions, each with the model key.
    let seen = fake.seen();
    assert_eq!(seen.len(), 4, "four model requests");
    assert_eq!(fake.unused(), 0);
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.path, "/v1/chat/completions", "request {i}");
        assert_eq!(
            s.authorization.as_deref(),
            Some(&*format!("Bearer {AI_KEY}")),
            "request {i}"
        );
        assert_eq!(s.body["model"], MODEL, "request {i}");
        assert_eq!(s.body["stream"], true, "request {i}");
    }
    let msgs = |i: usize| seen[i].body["messages"].as_array().unwrap().clone();
    let tools: Vec<&str> = seen[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["run_python", "run_shell"]);
    // 1: the system prompt and the user's message, as the page sent it.
    let m = msgs(0);
    assert_eq!(m.len(), 2, "{m:?}");
    assert_eq!(m[0]["role"], "system");
    assert_eq!(m[1], json!({"role": "user", "content": ASK1}));
    // 2: + the assistant's text and call, and the Python result (without the figure).
    let m = msgs(1);
    assert_eq!(m.len(), 4, "{m:?}");
    assert_eq!(m[2]["role"], "assistant");
    assert_eq!(m[2]["content"], "Let me compute that in Python.");
    assert_eq!(m[2]["tool_calls"][0]["id"], "call_py");
    assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "run_python");
    assert_eq!(m[3]["tool_call_id"], "call_py");
    let content = m[3]["content"].as_str().unwrap();
    assert!(content.contains("six times seven is 42"), "{content}");
    assert!(
        !content.contains("iVBOR"),
        "the figure is not fed to the model"
    );
    let py = fed(&m[3]);
    assert_eq!(py["stdout"], "six times seven is 42\n", "{py}");
    assert_eq!(py["exitCode"], 0, "{py}");
    // 3: + the shell call and its result, exit code 3.
    let m = msgs(2);
    assert_eq!(m.len(), 6, "{m:?}");
    assert_eq!(m[4]["tool_calls"][0]["function"]["name"], "run_shell");
    assert_eq!(m[5]["tool_call_id"], "call_sh");
    let sh = fed(&m[5]);
    assert_eq!(sh["exitCode"], 3, "{sh}");
    assert_eq!(sh["stdout"], "from-shell\n", "{sh}");
    // 4: the second message with the history the page kept: its text, not the tools.
    let m = msgs(3);
    assert_eq!(m.len(), 4, "{m:?}");
    assert_eq!(m[1], json!({"role": "user", "content": ASK1}));
    assert_eq!(m[2]["role"], "assistant");
    let said = m[2]["content"].as_str().unwrap();
    assert!(
        said.starts_with("Let me compute that in Python.")
            && said.ends_with("The answer is 42; the shell step exited with code 3."),
        "{said}"
    );
    assert_eq!(m[3], json!({"role": "user", "content": ASK2}));

    // The model key is in no log line (debug level), as in no response (the script).
    let log = d.log();
    assert!(log.contains(" DEBUG "), "a debug-level log:\n{log}");
    assert!(!log.contains(AI_KEY), "the model key is in the log:\n{log}");

    assert_sessions_ended(&d);
    d.assert_clean();
    d.stop();
}

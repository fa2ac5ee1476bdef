//! POST /execute against real gVisor: runtimes, stdin/args, files, limits and their
//! clamping, honest results (timeout, OOM, truncation), isolation, cleanup.

mod common;
use common::session::Session;
use common::{merged, processes_naming, watched_run, Daemon};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const PY: &str = "python-slim";

fn run(d: &Daemon, code: &str, extra: Value) -> Value {
    d.execute(merged(
        json!({"language": PY, "code": code, "network": false}),
        extra,
    ))
}

fn hello_for(language: &str) -> Option<&'static str> {
    Some(match language {
        "python" | "python-slim" => "print('hello')",
        "javascript" => "console.log('hello')",
        "typescript" => "const x: string = 'hello';\nconsole.log(x);",
        "ruby" => "puts 'hello'",
        "go" => "package main\nimport \"fmt\"\nfunc main() { fmt.Println(\"hello\") }\n",
        "rust" => "fn main() { println!(\"hello\"); }\n",
        _ => return None,
    })
}

/// The installed versions of `language` in `GET /runtimes`, the default first.
fn versions_of(runtimes: &Value, language: &str) -> Vec<String> {
    let mut v: Vec<(bool, String)> = runtimes
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["language"] == language)
        .map(|r| {
            (
                !r["default"].as_bool().unwrap(),
                r["version"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    assert!(
        !v.is_empty() && !v[0].0,
        "{language}: one default in {runtimes}"
    );
    assert!(
        v.iter().skip(1).all(|(other, _)| *other),
        "{language}: one default"
    );
    v.into_iter().map(|(_, v)| v).collect()
}

#[test]
fn test_hello_world_in_every_installed_runtime_and_aliases() {
    let d = Daemon::start();
    d.wait_ready();
    let runtimes = d.get("/runtimes").json();
    for rt in runtimes.as_array().unwrap() {
        let lang = rt["language"].as_str().unwrap();
        let code = hello_for(lang).unwrap_or_else(|| panic!("no hello world for {lang}"));
        let version = rt["version"].as_str().unwrap();
        // The default by name and alias, with no version; every version pinned, by
        // itself and by its major.minor (which names the newest of that line: here the
        // only one).
        let minor: String = version.split('.').take(2).collect::<Vec<_>>().join(".");
        let mut asks: Vec<(String, Option<&str>)> = vec![(lang.to_string(), Some(version))];
        if minor != version {
            asks.push((lang.to_string(), Some(&minor)));
        }
        if rt["default"] == true {
            asks.push((lang.to_string(), None));
            if let Some(alias) = rt["aliases"].as_array().unwrap().first() {
                asks.push((alias.as_str().unwrap().to_string(), None));
            }
        }
        for (name, pin) in asks {
            let mut body = json!({"language": name, "code": code, "network": false});
            if let Some(p) = pin {
                body["version"] = json!(p);
            }
            let r = d.execute(body);
            assert_eq!(r["language"], lang, "{name} {pin:?}");
            assert_eq!(r["version"], version, "{name} {pin:?}: {r}");
            assert_eq!(r["backend"], "gvisor");
            assert_eq!(r["run"]["stdout"], "hello\n", "{lang} {version}: {r}");
            assert_eq!(r["run"]["exitCode"], 0, "{lang} {version}: {r}");
            assert_eq!(r["run"]["network"], false);
            assert!(
                r.get("warning").is_none(),
                "no warning when network was not requested"
            );
            assert_eq!(
                r.get("compile").is_some(),
                rt["compiled"].as_bool().unwrap(),
                "{lang}: compile stage only for compiled runtimes"
            );
        }
    }
    // `make test` builds the newer versions: two of each of these, the default older.
    for lang in ["python", "python-slim", "javascript", "go", "rust"] {
        let v = versions_of(&runtimes, lang);
        assert_eq!(v.len(), 2, "{lang}: {v:?}");
        let num = |s: &str| -> Vec<u64> { s.split('.').map(|c| c.parse().unwrap()).collect() };
        assert!(
            num(&v[0]) < num(&v[1]),
            "{lang}: the default is the older: {v:?}"
        );
    }
    let py = versions_of(&runtimes, PY);
    assert!(
        py[0].starts_with("3.13.") && py[1].starts_with("3.14."),
        "{py:?}"
    );
    let ran = |version: &str| -> Value {
        let r = d.execute(json!({"language": PY, "version": version, "code": "import sys; print(sys.version_info[:2])", "network": false}));
        assert_eq!(r["run"]["exitCode"], 0, "{version}: {r}");
        json!([r["version"], r["run"]["stdout"]])
    };
    let v313 = json!([py[0], "(3, 13)\n"]);
    let v314 = json!([py[1], "(3, 14)\n"]);
    // A prefix pins the newest it names; a client of the seed document's forms
    // ("3.14.5" for python-slim, "3.14-agent") the version its digits name, shortened
    // at dots, else the default.
    assert_eq!(ran("3"), v314);
    assert_eq!(ran("3.14"), v314);
    assert_eq!(ran("3.13"), v313);
    assert_eq!(ran(&py[0]), v313);
    assert_eq!(ran("3.14.5"), v314);
    assert_eq!(ran("3.13.0"), v313);
    assert_eq!(ran("3.12"), v313);
    // Anything else is refused, naming the versions there are.
    for bad in ["0.0.1", "3.14.5-agent", "2.7", "4", "3.14.x"] {
        let r = d.post_json(
            "/execute",
            &json!({"language": PY, "version": bad, "code": "print(1)"}),
        );
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(r.json()["error"], "unknown_version");
        let detail = r.json()["detail"].as_str().unwrap().to_string();
        assert!(
            detail.contains(&format!("it has \"{}\", \"{}\"", py[0], py[1]))
                && detail.contains("\"3.*\""),
            "{detail}"
        );
    }
    // javascript's seed form "node-26": no Node 26 here, so the default.
    let js = versions_of(&runtimes, "javascript");
    let r = d.execute(json!({"language": "js", "version": "node-26", "code": "console.log(process.versions.node)", "network": false}));
    assert_eq!(r["version"], js[0], "{r}");
    assert_eq!(r["run"]["stdout"], format!("{}\n", js[0]), "{r}");
    d.assert_clean();
    d.stop();
}

/// A session has a version (the default, or `version` at create): a filesystem
/// session's step runs it unless it names another, a kernel session's always runs the
/// kernel's: a client's form (`3.14-agent`, which seed clients send on every request)
/// is the kernel's, another version number is refused.
#[test]
fn test_session_steps_and_versions() {
    let d = Daemon::start();
    d.wait_ready();
    let py = versions_of(&d.get("/runtimes").json(), "python");
    let code = "import sys; print(sys.version_info[:2])";
    let ran = |v: &Value| json!([v["version"], v["run"]["stdout"]]);
    let fs = Session::create(&d, &json!({"runtime": "python", "network": false}));
    let v = fs.step_with(&d, &json!({"code": code, "version": "3.14"}));
    assert_eq!(ran(&v), json!([py[1], "(3, 14)\n"]), "{v}");
    let v = fs.step_with(&d, &json!({"code": code}));
    assert_eq!(ran(&v), json!([py[0], "(3, 13)\n"]), "{v}");
    let k = Session::create(
        &d,
        &json!({"runtime": "python", "type": "kernel", "network": false}),
    );
    let v = k.step_with(&d, &json!({"code": code, "version": "3.14-agent"}));
    assert_eq!(ran(&v), json!([py[0], "(3, 13)\n"]), "{v}");
    for pinned in [py[1].as_str(), "3.14", "3"] {
        let r = k.exec(&d, &json!({"code": code, "version": pinned}));
        assert_eq!(r.status, 400, "{pinned}: {}", r.text());
        assert_eq!(r.json()["error"], "unknown_version");
        assert_eq!(
            r.json()["detail"],
            format!(
                "version: kernel sessions run python {}; omit version",
                py[0]
            )
        );
    }
    let v = k.step_with(&d, &json!({"code": code, "version": py[0]}));
    assert_eq!(ran(&v), json!([py[0], "(3, 13)\n"]), "{v}");
    assert_eq!(k.created["version"], py[0]);
    // A session created with a version: its kernel, and its steps by default, run it.
    let k = Session::create(
        &d,
        &json!({"runtime": "python", "type": "kernel", "network": false, "version": "3.14"}),
    );
    assert_eq!(k.created["version"], py[1]);
    let v = k.step_with(&d, &json!({"code": "import sys; x = sys.version_info[:2]"}));
    assert_eq!(v["run"]["exitCode"], 0, "{v}");
    let v = k.step_with(&d, &json!({"code": "print(x)", "version": "3.14-agent"}));
    assert_eq!(ran(&v), json!([py[1], "(3, 14)\n"]), "{v}");
    let r = k.exec(&d, &json!({"code": code, "version": "3.13"}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        r.json()["detail"],
        format!(
            "version: kernel sessions run python {}; omit version",
            py[1]
        )
    );
    let fs = Session::create(
        &d,
        &json!({"runtime": "python", "network": false, "version": py[1]}),
    );
    assert_eq!(fs.created["version"], py[1]);
    let v = fs.step_with(&d, &json!({"code": code}));
    assert_eq!(ran(&v), json!([py[1], "(3, 14)\n"]), "{v}");
    let v = fs.step_with(&d, &json!({"code": code, "version": "3.13"}));
    assert_eq!(ran(&v), json!([py[0], "(3, 13)\n"]), "{v}");
    // An unknown version at create is refused, naming the versions.
    let r = d.post_json(
        "/v1/sessions",
        &json!({"runtime": "python", "version": "2.7"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"], "unknown_version");
    assert_eq!(
        r.json()["detail"],
        format!(
            "version: \"2.7\" is not a version of \"python\"; it has \"{}\", \"{}\"; see GET /runtimes",
            py[0], py[1]
        )
    );
    d.stop();
}

/// What is new in one version runs there and fails cleanly on the other: Python 3.14's
/// template strings (PEP 750) and 3.13's `ast.Num` (removed in 3.14); Node 24's
/// `RegExp.escape`; Go 1.26's `new(expr)`.
#[test]
fn test_each_version_runs_what_is_new_in_it() {
    let d = Daemon::start();
    d.wait_ready();
    let runtimes = d.get("/runtimes").json();
    let check = |lang: &str, code: &str, new_ok: &str, old_fails: &str| {
        let v = versions_of(&runtimes, lang);
        let newer =
            d.execute(json!({"language": lang, "version": v[1], "code": code, "network": false}));
        let older =
            d.execute(json!({"language": lang, "version": v[0], "code": code, "network": false}));
        (newer, older, new_ok.to_string(), old_fails.to_string())
    };
    let stage = |r: &Value| -> Value {
        if r["compile"]["exitCode"].as_i64().is_some_and(|c| c != 0) {
            r["compile"].clone()
        } else {
            r["run"].clone()
        }
    };
    for (lang, code, new_out, old_err) in [
        (
            "python",
            "name = 'x'\nt = t'hi {name}'\nprint(type(t).__name__, t.strings, t.values)",
            "Template ('hi ', '') ('x',)\n",
            "SyntaxError",
        ),
        (
            "python-slim",
            "name = 'x'\nt = t'hi {name}'\nprint(type(t).__name__, t.strings, t.values)",
            "Template ('hi ', '') ('x',)\n",
            "SyntaxError",
        ),
        (
            "javascript",
            "console.log(RegExp.escape('a.b'))",
            "\\x61\\.b\n",
            "TypeError",
        ),
        (
            "go",
            "package main\nimport \"fmt\"\nfunc main() { p := new(42); fmt.Println(*p) }\n",
            "42\n",
            "main.go",
        ),
    ] {
        let (newer, older, new_ok, old_fails) = check(lang, code, new_out, old_err);
        assert_eq!(newer["run"]["stdout"], new_ok, "{lang} newer: {newer}");
        assert_eq!(newer["run"]["exitCode"], 0, "{lang} newer: {newer}");
        let s = stage(&older);
        assert_ne!(s["exitCode"], 0, "{lang} older: {older}");
        assert!(
            s["stderr"].as_str().unwrap().contains(&old_fails),
            "{lang} older: {older}"
        );
        assert_eq!(older["run"]["stdout"], "", "{lang} older: {older}");
    }
    // 3.13's ast.Num, gone in 3.14: the other way round.
    let v = versions_of(&runtimes, "python");
    let code = "import warnings; warnings.simplefilter('ignore')\nimport ast\nprint(ast.Num(1).n)";
    let older =
        d.execute(json!({"language": "python", "version": v[0], "code": code, "network": false}));
    assert_eq!(
        (
            older["run"]["stdout"].as_str(),
            older["run"]["exitCode"].as_i64()
        ),
        (Some("1\n"), Some(0)),
        "{older}"
    );
    let newer =
        d.execute(json!({"language": "python", "version": v[1], "code": code, "network": false}));
    assert_eq!(newer["run"]["exitCode"], 1, "{newer}");
    assert!(
        newer["run"]["stderr"]
            .as_str()
            .unwrap()
            .contains("AttributeError"),
        "{newer}"
    );
    d.assert_clean();
    d.stop();
}

#[test]
fn test_stdin_args_files_exits_and_network_warning() {
    let d = Daemon::start();
    // args arrive literally: no shell between.
    let args = json!([
        "a b",
        "it's \"quoted\"",
        "$(touch /tmp/pwned)",
        "`id`",
        "*",
        ""
    ]);
    let r = run(&d, "import sys,os\nprint(sys.argv[1:])\nprint(os.path.exists('/tmp/pwned'))\nprint(sys.stdin.read())", json!({"args": args, "stdin": "line1\nline2"}));
    let expected = format!(
        "{}\nFalse\nline1\nline2\n",
        "['a b', 'it\\'s \"quoted\"', '$(touch /tmp/pwned)', '`id`', '*', '']"
    );
    assert_eq!(r["run"]["stdout"], expected);
    // Multi-file programs, base64 and hex; the first file is the entry without `code`.
    let r = d.execute(json!({"language": PY, "network": false, "files": [
        {"name": "app.py", "content": "from pkg import mod\nprint(mod.X, open('data.bin','rb').read())"},
        {"name": "pkg/__init__.py", "content": ""},
        {"name": "pkg/mod.py", "content": "WD0gNDI=", "encoding": "base64"},
        {"name": "data.bin", "content": "00ff41", "encoding": "hex"}
    ]}));
    assert_eq!(r["run"]["stdout"], "42 b'\\x00\\xffA'\n", "{r}");
    // Non-zero exits and stderr.
    let r = run(
        &d,
        "import sys\nprint('oops', file=sys.stderr)\nsys.exit(3)",
        json!({}),
    );
    assert_eq!(
        (r["run"]["exitCode"].as_i64(), r["run"]["stderr"].as_str()),
        (Some(3), Some("oops\n"))
    );
    let r = run(&d, "raise ValueError('boom')", json!({}));
    assert_eq!(r["run"]["exitCode"], 1);
    assert!(r["run"]["stderr"]
        .as_str()
        .unwrap()
        .contains("ValueError: boom"));
    let r = run(
        &d,
        "import os,signal\nos.kill(os.getpid(), signal.SIGSEGV)",
        json!({}),
    );
    assert_eq!(r["run"]["exitCode"], 139);
    assert_eq!(r["run"]["timedOut"], false);
    // Network requested (or defaulted on) but not applied: run.network false + warning.
    for body in [
        json!({"language": PY, "code": "print(1)"}),
        json!({"language": PY, "code": "print(1)", "network": true}),
    ] {
        let r = d.execute(body);
        assert_eq!(r["run"]["network"], false);
        assert_eq!(r["warning"], "network requested but currently unavailable (egress firewall not verified); ran with network OFF");
    }
    d.assert_clean();
    d.stop();
}

#[test]
fn test_request_errors() {
    let d = Daemon::start();
    let cases = [
        (json!({"code": "print(1)"}), "language_required", None),
        (
            json!({"language": "", "code": "print(1)"}),
            "language_required",
            None,
        ),
        (
            json!({"language": "cobol", "code": "x"}),
            "unknown_language",
            Some("\"cobol\" is not a known runtime; see GET /runtimes"),
        ),
        (
            json!({"language": PY}),
            "no_source",
            Some("provide `code` or `files`"),
        ),
        (
            json!({"language": PY, "files": []}),
            "no_source",
            Some("provide `code` or `files`"),
        ),
        (
            json!({"language": PY, "code": "x", "bogus": 1}),
            "invalid_json",
            None,
        ),
        (json!({"language": PY, "code": 5}), "invalid_json", None),
        (
            json!({"language": PY, "code": "x", "limits": {"wallTimeMs": "NaN"}}),
            "invalid_json",
            None,
        ),
        (
            json!({"language": PY, "files": [{"name": "../x.py", "content": ""}]}),
            "invalid_file",
            None,
        ),
        (
            json!({"language": PY, "files": [{"name": "/etc/passwd", "content": ""}]}),
            "invalid_file",
            None,
        ),
        (
            json!({"language": PY, "files": [{"name": "a.py", "content": "!!", "encoding": "base64"}]}),
            "invalid_file",
            None,
        ),
        (
            json!({"language": PY, "files": [{"name": "a.py", "content": "zz", "encoding": "hex"}]}),
            "invalid_file",
            None,
        ),
        (
            json!({"language": PY, "files": [{"name": "a.py", "content": "", "encoding": "rot13"}]}),
            "invalid_file",
            None,
        ),
    ];
    for (body, code, detail) in cases {
        let r = d.post_json("/execute", &body);
        assert_eq!(r.status, 400, "{body}");
        let j = r.json();
        assert_eq!(j["error"], code, "{body}: {j}");
        if let Some(detail) = detail {
            assert_eq!(j["detail"], detail);
        }
    }
    let r = d.post_json("/execute", &json!({"language": PY, "files": [{"name": "ok.py", "content": ""}, {"name": "a\\b", "content": ""}]}));
    assert!(
        r.json()["detail"].as_str().unwrap().starts_with("files[1]"),
        "detail names the file: {}",
        r.text()
    );
    for bad in ["{", "[", "null", "\"x\"", &"[".repeat(100_000)] {
        let r = d.request("POST", "/execute", &[], bad.as_bytes());
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (400, Some("invalid_json")),
            "{}",
            &bad[..bad.len().min(20)]
        );
    }
    assert_eq!(
        d.get("/healthz").json()["counters"]["runsTotal"],
        0,
        "no sandbox was started"
    );
    d.stop();
}

#[test]
fn test_timeout_oom_truncation_and_flood() {
    let d = Daemon::start();
    let t0 = Instant::now();
    let r = run(
        &d,
        "while True: pass",
        json!({"limits": {"wallTimeMs": 500}}),
    );
    assert_eq!(
        (
            r["run"]["exitCode"].as_i64(),
            r["run"]["timedOut"].as_bool(),
            r["run"]["oomKilled"].as_bool()
        ),
        (Some(137), Some(true), Some(false)),
        "{r}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    // Output printed before a timeout kill is kept (line-buffered or unbuffered).
    let r = run(
        &d,
        "print('before')\nimport time\ntime.sleep(100)",
        json!({"limits": {"wallTimeMs": 300}}),
    );
    assert_eq!(
        (r["run"]["stdout"].as_str(), r["run"]["timedOut"].as_bool()),
        (Some("before\n"), Some(true))
    );
    // A stopped process group still dies at the wall time.
    let r = run(&d, "import os,signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nos.kill(0, signal.SIGSTOP)", json!({"limits": {"wallTimeMs": 300}}));
    assert_eq!(r["run"]["timedOut"], true);
    // 1 GiB under a 64 MiB limit: OOM, read from the cgroup.
    let r = run(
        &d,
        "b = bytearray(1 << 30)\nprint(len(b))",
        json!({"limits": {"memoryBytes": 67108864}}),
    );
    assert_eq!(
        (
            r["run"]["exitCode"].as_i64(),
            r["run"]["oomKilled"].as_bool(),
            r["run"]["timedOut"].as_bool()
        ),
        (Some(137), Some(true), Some(false)),
        "{r}"
    );
    let r = run(
        &d,
        "b=[]\nwhile True: b.append(bytearray(8 << 20))",
        json!({"limits": {"memoryBytes": 67108864}}),
    );
    assert_eq!(r["run"]["oomKilled"], true, "{r}");
    // A program SIGKILLed by itself is not an OOM.
    let r = run(
        &d,
        "import os,signal\nos.kill(os.getpid(), signal.SIGKILL)",
        json!({}),
    );
    assert_eq!(
        (
            r["run"]["exitCode"].as_i64(),
            r["run"]["oomKilled"].as_bool(),
            r["run"]["timedOut"].as_bool()
        ),
        (Some(137), Some(false), Some(false))
    );
    // 10 MiB printed, 4096 kept per stream, truncated; the program finishes normally.
    let r = run(
        &d,
        "import sys\nsys.stdout.write('x' * (10 << 20))\nsys.stderr.write('e' * 5000)",
        json!({"limits": {"outputBytes": 4096}}),
    );
    assert_eq!(r["run"]["stdout"].as_str().unwrap().len(), 4096);
    assert_eq!(r["run"]["stderr"].as_str().unwrap().len(), 4096);
    assert_eq!(
        (
            r["run"]["truncated"].as_bool(),
            r["run"]["exitCode"].as_i64()
        ),
        (Some(true), Some(0))
    );
    // Exactly at the cap is not truncated.
    let r = run(
        &d,
        "import sys\nsys.stdout.write('y' * 4096)",
        json!({"limits": {"outputBytes": 4096}}),
    );
    assert_eq!(
        (
            r["run"]["stdout"].as_str().unwrap().len(),
            r["run"]["truncated"].as_bool()
        ),
        (4096, Some(false))
    );
    // An endless flood is killed once it wrote 16 MiB past the cap, long before the wall time.
    let t0 = Instant::now();
    let r = run(
        &d,
        "while True: print('Piston is secure' * 100)",
        json!({"limits": {"outputBytes": 1024, "wallTimeMs": 20000}}),
    );
    assert_eq!(r["run"]["truncated"], true);
    assert_eq!(r["run"]["timedOut"], false);
    assert_eq!(r["run"]["exitCode"], 137);
    assert_eq!(r["run"]["stdout"].as_str().unwrap().len(), 1024);
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "flood killed early: {:?}",
        t0.elapsed()
    );
    // Both streams drain concurrently: 2 MB on stderr does not deadlock.
    let r = run(
        &d,
        "import os\nos.write(2, b'e' * 2_000_000)\nprint('done')",
        json!({"limits": {"outputBytes": 262144}}),
    );
    assert_eq!(
        (r["run"]["stdout"].as_str(), r["run"]["timedOut"].as_bool()),
        (Some("done\n"), Some(false))
    );
    // Invalid UTF-8 becomes U+FFFD in valid JSON.
    let r = run(
        &d,
        "import sys\nsys.stdout.buffer.write(b'a\\xff\\xfe\\x00b')",
        json!({}),
    );
    assert_eq!(r["run"]["stdout"], "a\u{FFFD}\u{FFFD}\u{0}b");
    let h = d.get("/healthz").json();
    assert_eq!(h["counters"]["runsOomKilled"], 2);
    d.assert_clean();
    d.stop();
}

#[test]
fn test_isolation_fork_bomb_and_background_processes() {
    let d = Daemon::start();
    // Fork bomb with pids 16: contained by RLIMIT_NPROC inside the sandbox.
    let r = run(&d, "import os\nn=0\nfor _ in range(40):\n try:\n  if os.fork()==0:\n   import time; time.sleep(3); os._exit(0)\n  n+=1\n except OSError: pass\nprint(n)", json!({"limits": {"pids": 16, "wallTimeMs": 15000}}));
    let forked: i64 = r["run"]["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or(-1);
    assert!((1..16).contains(&forked), "forks capped below 16: {r}");
    let r = run(
        &d,
        "import os\nwhile True:\n try: os.fork()\n except OSError: pass",
        json!({"limits": {"pids": 16, "wallTimeMs": 2000}}),
    );
    assert_eq!(r["run"]["timedOut"], true, "{r}\nLOG:\n{}", d.log());
    assert_eq!(
        run(&d, "print(1)", json!({}))["run"]["stdout"],
        "1\n",
        "daemon healthy after the bomb"
    );
    // Writing to / fails (EACCES on the runtime's tree, EROFS on its root image, as
    // Linux says for a read-only root); /tmp and the working directory are writable.
    let r = run(&d, "import errno, os\nfor p in ['/x', '/etc/x', '/usr/x']:\n try: open(p,'w'); print('wrote', p)\n except OSError as e: print('refused' if e.errno in (errno.EACCES, errno.EROFS) else e)\nopen('/tmp/t','w').write('1'); open('w.txt','w').write('2'); print(os.getcwd(), os.getuid())", json!({}));
    assert_eq!(
        r["run"]["stdout"], "refused\nrefused\nrefused\n/workspace 65534\n",
        "{r}"
    );
    // The working directory is capped at memoryBytes.
    let r = run(&d, "f=open('big','wb')\ntry:\n for _ in range(100): f.write(b'x'*(1<<20)); f.flush()\nexcept OSError as e: print('ENOSPC' if e.errno==28 else e)", json!({"limits": {"memoryBytes": 33554432}}));
    assert!(
        r["run"]["stdout"] == "ENOSPC\n" || r["run"]["oomKilled"] == true,
        "{r}"
    );
    // The host's files are not visible.
    let canary = std::env::temp_dir().join(format!("hostcanary-{}", std::process::id()));
    std::fs::write(&canary, "secret-canary").unwrap();
    let r = run(&d, &format!("import os\nprint(os.path.exists({:?}), os.path.exists('/work'), os.path.exists('/root/.cargo'), os.path.exists({:?}))", canary.display().to_string(), d.data_dir.display().to_string()), json!({}));
    assert_eq!(r["run"]["stdout"], "False False False False\n");
    std::fs::remove_file(&canary).unwrap();
    // A background process left running does not outlive the run.
    let t0 = Instant::now();
    let r = run(&d, "import os,time\nif os.fork()==0:\n os.setsid()\n if os.fork()==0:\n  while True: time.sleep(.1)\n os._exit(0)\nprint('parent exits')", json!({}));
    assert_eq!(r["run"]["stdout"], "parent exits\n");
    assert_eq!(r["run"]["timedOut"], false);
    assert!(t0.elapsed() < Duration::from_secs(8));
    d.assert_clean();
    d.stop();
}

/// The program's files are listed as what they are (gVisor reports a file bound over a
/// mount point it made itself as a directory, so the workspace is the run's own tmpfs
/// holding them instead of a bind per file), and they are root's: the program adds files
/// beside them but cannot change, remove or rename them.
#[test]
fn test_the_workspace_lists_its_files_as_files_and_keeps_them() {
    let d = Daemon::start();
    let code = [
        "import os",
        "def tried(f):",
        "    try:",
        "        f(); return 'ok'",
        "    except OSError as e:",
        "        return type(e).__name__",
        "print(sorted((e.name, e.is_file(), e.is_dir()) for e in os.scandir('.')))",
        "print(sorted(os.path.join(r, f) for r, _, fs in os.walk('.') for f in fs))",
        "print(tried(lambda: open('helper.py', 'a')), tried(lambda: os.remove('helper.py')), tried(lambda: os.rename('data', 'moved')), tried(lambda: open('data/new', 'w')), tried(lambda: os.chmod('helper.py', 0o666)))",
        "open('out.txt', 'w').write('mine'); os.mkdir('newdir'); open('newdir/x', 'w').write('x')",
        "print(open('out.txt').read(), os.listdir('newdir'), open('data/in.txt').read(), os.stat('.').st_mode & 0o7777 == 0o1777)",
    ]
    .join("\n");
    let r = run(
        &d,
        &code,
        json!({"files": [{"name": "helper.py", "content": "X = 1"}, {"name": "data/in.txt", "content": "in"}]}),
    );
    assert_eq!(
        r["run"]["stdout"],
        "[('data', False, True), ('helper.py', True, False), ('main.py', True, False)]\n\
['./data/in.txt', './helper.py', './main.py']\n\
PermissionError PermissionError PermissionError PermissionError PermissionError\n\
mine ['x'] in True\n",
        "{r}"
    );
    assert_eq!(r["run"]["exitCode"], 0, "{r}");
    d.assert_clean();
    d.stop();
}

#[test]
fn test_clamping_at_both_ends() {
    let d = Daemon::start_with(&[("ISOBOX_MAX_CONCURRENT", "8")]);
    let probe = "import resource\nm=[l for l in open('/proc/meminfo') if l.startswith('MemTotal')][0].split()[1]\nprint(m, resource.getrlimit(resource.RLIMIT_NPROC)[0])";
    let overhead_kib = 32 * 1024;
    for (mem, pids, want_mem, want_pids) in [
        (0.0, -5.0, 8 * 1024, 1),
        (1e20, 1e9, 512 * 1024, 256),
        (134217728.0, 64.0, 128 * 1024, 64),
    ] {
        let r = run(
            &d,
            probe,
            json!({"limits": {"memoryBytes": mem, "pids": pids}}),
        );
        assert_eq!(
            r["run"]["stdout"],
            format!("{} {}\n", want_mem + overhead_kib, want_pids),
            "{r}"
        );
    }
    // outputBytes: below the minimum keeps 1024, above the maximum keeps 262144.
    for (asked, kept) in [(1.0, 1024), (-1.0, 1024), (1e12, 262144)] {
        let r = run(
            &d,
            "print('z' * 300000, end='')",
            json!({"limits": {"outputBytes": asked}}),
        );
        assert_eq!(
            r["run"]["stdout"].as_str().unwrap().len(),
            kept,
            "outputBytes {asked}"
        );
    }
    // wallTimeMs: 0 is never unlimited; it becomes 100 ms (plus the boot grace).
    let t0 = Instant::now();
    let r = run(
        &d,
        "import time\ntime.sleep(60)",
        json!({"limits": {"wallTimeMs": 0}}),
    );
    assert_eq!(r["run"]["timedOut"], true);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // cpus: the cgroup quota is written clamped (read on the host while the run sleeps).
    for (cpus, quota) in [(0.0, 10_000), (64.0, 200_000)] {
        // Earlier runs' cgroups are removed after their responses: wait until none is left.
        d.assert_clean();
        let d2 = &d;
        let handle = std::thread::scope(|s| {
            let h = s.spawn(move || {
                run(
                    d2,
                    "import time\ntime.sleep(1.5)",
                    json!({"limits": {"cpus": cpus}}),
                )
            });
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut seen = None;
            while seen.is_none() && Instant::now() < deadline {
                let slice = std::path::Path::new("/sys/fs/cgroup/cpu").join(&d2.instance);
                for e in std::fs::read_dir(&slice).into_iter().flatten().flatten() {
                    if let Ok(q) = std::fs::read_to_string(e.path().join("cpu.cfs_quota_us")) {
                        seen = q.trim().parse::<i64>().ok();
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            h.join().unwrap();
            seen
        });
        assert_eq!(handle, Some(quota), "cpus {cpus}");
    }
    // wallTimeMs above the maximum is 20 s: a 25 s sleep is cut at ~21 s.
    let t0 = Instant::now();
    let r = run(
        &d,
        "import time\ntime.sleep(25)\nprint('not reached')",
        json!({"limits": {"wallTimeMs": 1e12}}),
    );
    assert_eq!(r["run"]["timedOut"], true);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(20) && took < Duration::from_secs(24),
        "{took:?}"
    );
    d.assert_clean();
    d.stop();
}

#[test]
fn test_parallel_runs_all_correct() {
    let d = Daemon::start_with(&[("ISOBOX_MAX_CONCURRENT", "8")]);
    d.wait_ready();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let d = &d;
                s.spawn(move || {
                    run(
                        d,
                        &format!("import sys\nprint({i} * 7)\nprint('e{i}', file=sys.stderr)"),
                        json!({}),
                    )
                })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            let r = h.join().unwrap();
            assert_eq!(r["run"]["stdout"], format!("{}\n", i * 7));
            assert_eq!(r["run"]["stderr"], format!("e{i}\n"));
        }
    });
    d.assert_clean();
    d.stop();
}

#[test]
fn test_capacity_cap_answers_429_and_frees_slots() {
    let d = Daemon::start_with(&[("ISOBOX_MAX_CONCURRENT", "2")]);
    d.wait_ready();
    std::thread::scope(|s| {
        let long: Vec<_> = (0..2)
            .map(|_| {
                let d = &d;
                s.spawn(move || run(d, "import time\ntime.sleep(2)\nprint('ok')", json!({})))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while d.get("/healthz").json()["inFlight"] != 2 {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(20));
        }
        let t0 = Instant::now();
        let r = d.post_json(
            "/execute",
            &json!({"language": PY, "code": "print(1)", "network": false}),
        );
        assert!(t0.elapsed() < Duration::from_millis(500), "refused at once");
        assert_eq!(r.status, 429);
        assert_eq!(
            r.json(),
            json!({"error": "capacity", "detail": "no free execution slot"})
        );
        assert!(r.header("retry-after").is_some());
        for h in long {
            assert_eq!(h.join().unwrap()["run"]["stdout"], "ok\n");
        }
    });
    assert_eq!(run(&d, "print(2)", json!({}))["run"]["stdout"], "2\n");
    assert_eq!(d.get("/healthz").json()["inFlight"], 0);
    d.assert_clean();
    d.stop();
}

#[test]
fn test_python_batteries_importable_and_matplotlib_headless() {
    let d = Daemon::start();
    let code = "import requests, httpx, bs4, lxml, pandas, numpy, matplotlib, yt_dlp\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.savefig('/tmp/p.png')\nimport os\nprint(numpy.arange(10).sum(), pandas.DataFrame({'a': [1, 2]}).a.sum(), os.path.getsize('/tmp/p.png') > 1000, bs4.BeautifulSoup('<b>x</b>', 'lxml').b.text)";
    let r = d.execute(json!({"language": "python", "network": false, "code": code}));
    assert_eq!(r["run"]["stdout"], "45 3 True x\n", "{r}");
    assert_eq!(r["run"]["exitCode"], 0);
    // matplotlib finds the font list built into the image in its fresh cache directory
    // instead of rebuilding it (0.3-0.5 s per plotting run before).
    let code = "import logging, sys\nlg = logging.getLogger('matplotlib.font_manager')\nlg.addHandler(logging.StreamHandler(sys.stdout)); lg.setLevel(logging.DEBUG)\nimport matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.savefig('/tmp/p.png')";
    let r = d.execute(json!({"language": "python", "network": false, "code": code}));
    let out = r["run"]["stdout"].as_str().unwrap();
    assert!(
        out.starts_with("Using fontManager instance from /tmp/.cache/matplotlib/fontlist-v"),
        "{r}"
    );
    assert!(!out.contains("generated new fontManager"), "{r}");
    assert_eq!(r["run"]["stderr"], "", "{r}");
    // yt-dlp is PyPI's (pinned in runtimes/rootfs/python.fetch), not Debian's, and its
    // command works.
    let code = "import subprocess, yt_dlp, yt_dlp.version\nprint('/'.join(yt_dlp.__file__.split('/')[:4]))\nprint(subprocess.run(['yt-dlp', '--version'], capture_output=True, text=True).stdout.strip() == yt_dlp.version.__version__)";
    let r = d.execute(json!({"language": "python", "network": false, "code": code}));
    assert_eq!(r["run"]["stdout"], "/usr/local/lib\nTrue\n", "{r}");
    d.stop();
}

#[test]
fn test_broken_descriptor_stops_startup_naming_file_and_line() {
    let dir = std::env::temp_dir().join(format!("isobox-badrt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("broken.toml"),
        "language = \"x\"\naliases = [\"y\"\nrootfs = 3\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_isoboxd"))
        .env("ISOBOX_RUNTIMES_DIR", &dir)
        .env("ISOBOX_LISTEN", "127.0.0.1:0")
        .env(
            "ISOBOX_INSTANCE",
            format!("isobox-t{}-badrt", std::process::id()),
        )
        .env("ISOBOX_DATA_DIR", dir.join("data"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("broken.toml:3:"), "names file and line: {err}");
}

/// Every entry of a tree, not following links: path, kind, size, mode and mtime.
fn tree_state(root: &std::path::Path) -> std::collections::BTreeMap<String, String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let m = e.path().symlink_metadata().unwrap();
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            out.insert(
                rel,
                format!(
                    "{:o} {} {}.{}",
                    m.mode(),
                    m.len(),
                    m.mtime(),
                    m.mtime_nsec()
                ),
            );
            if m.is_dir() {
                stack.push(e.path());
            }
        }
        let m = dir.symlink_metadata().unwrap();
        out.insert(
            format!("{}/.", dir.strip_prefix(root).unwrap().display()),
            format!("{}.{}", m.mtime(), m.mtime_nsec()),
        );
    }
    out
}

/// Issue 21 item 5: runsc makes the mount points of a run's binds inside the root it is
/// given, so with the shared tree as root a request's file layout (`main.rb/x`) was left
/// behind in it and broke every later cold run of that runtime for every tenant. A run
/// now has the tree itself as its root only when every mount point is already in it,
/// and an overlay of its own otherwise: hostile layouts in every interpreted runtime,
/// writes to the root from inside, a session step with a volume, pooled sandboxes'
/// preload binds and a long-lived sandbox's init bind leave every shared tree exactly as
/// it was, and later runs see what they always saw.
#[test]
fn test_a_run_never_writes_the_shared_root_filesystems() {
    let rootfs = std::path::Path::new("/var/lib/isobox/rootfs");
    let trees: Vec<std::path::PathBuf> = std::fs::read_dir(rootfs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join(".isobox/stamp").exists())
        .collect();
    assert!(trees.len() >= 2, "{trees:?}");
    let before: Vec<_> = trees.iter().map(|t| tree_state(t)).collect();

    // Pools with preload binds (/opt/isobox-warm) for node and ruby; pools off for the
    // Python runtimes so their runs are cold (per-file binds under /workspace).
    // Without root images: this is about the trees as roots (runs on an image never see
    // the tree; `test_a_cold_run_on_a_root_image_has_no_gofer_and_its_files_as_given`).
    let d = Daemon::start_with(&[
        ("ISOBOX_WARM_POOL", "javascript=1,ruby=1"),
        ("ISOBOX_ROOT_IMAGES", "off"),
    ]);
    d.wait_ready();
    let cold = json!({"memoryBytes": 200_000_000});
    for (lang, entry, normal) in [
        ("python-slim", "main.py", "print('ok')"),
        ("python", "main.py", "print('ok')"),
        ("ruby", "main.rb", "puts 'ok'"),
        ("javascript", "main.js", "console.log('ok')"),
    ] {
        // The entry's own name as a directory, a deep tree, a dotfile.
        let hostile = d.execute(json!({"language": lang, "network": false, "limits": cold,
        "files": [
            {"name": format!("{entry}/x"), "content": "x"},
            {"name": "a/b/c/d/e.txt", "content": "deep"},
            {"name": ".hidden", "content": "h"},
        ]}));
        assert!(
            hostile["run"]["exitCode"].as_i64().is_some(),
            "{lang}: {hostile}"
        );
        // The next cold run of that runtime, by anyone, still has its entry as a file.
        let r =
            d.execute(json!({"language": lang, "network": false, "limits": cold, "code": normal}));
        assert_eq!(
            (r["run"]["stdout"].as_str(), r["run"]["exitCode"].as_i64()),
            (Some("ok\n"), Some(0)),
            "{lang}: {r}"
        );
        // And sees none of the hostile run's names in its /workspace.
        let ls = d.execute(
            json!({"language": "python-slim", "network": false, "limits": cold,
            "code": "import os; print(sorted(os.listdir('.')))"}),
        );
        assert_eq!(ls["run"]["stdout"], "['main.py']\n", "{ls}");
    }
    // Pooled runs (default limits), served from sandboxes booted with the preload bind.
    for (lang, code) in [("javascript", "console.log('ok')"), ("ruby", "puts 'ok'")] {
        let r = d.execute(json!({"language": lang, "network": false, "code": code}));
        assert_eq!(r["run"]["stdout"], "ok\n", "{lang}: {r}");
    }
    // A cold run sees the shared tree itself as its root when every mount point is in
    // it: it cannot write there, nor anywhere outside /workspace and /tmp.
    let w = d.execute(
        json!({"language": "python-slim", "network": false, "code": r#"
import os
for p in ["/x", "/etc/x", "/workspace/../opt/x", "/usr/lib/x", "/etc/resolv.conf"]:
    try:
        open(p, "a").write("x")
        print("wrote", p)
    except OSError as e:
        print(p, e.strerror)
for p in ["/x-dir", "/opt/d"]:
    try:
        os.mkdir(p)
        print("made", p)
    except OSError as e:
        print(p, e.strerror)
open("/workspace/mine", "w").write("ok"); open("/tmp/mine", "w").write("ok")
print(sorted(os.listdir("/workspace")))
"#}),
    );
    let out = w["run"]["stdout"].as_str().unwrap_or_default();
    assert!(
        !out.contains("wrote") && !out.contains("made") && out.ends_with("['main.py', 'mine']\n"),
        "{w}"
    );
    let refused = out
        .lines()
        .filter(|l| l.ends_with("Read-only file system") || l.ends_with("Permission denied"))
        .count();
    assert_eq!(refused, 7, "{w}");
    // While a cold run runs, its bundle has its workspace tmpfs mounted and no root
    // overlay (every mount point is in the tree); a long-lived sandbox's writable root
    // has one (below).
    let runs = d.data_dir.join("runs");
    // (mount point, filesystem) under `dir`'s bundles of `kind` (`r` a run, `b` a
    // long-lived sandbox; pooled ones, `w`, come and go meanwhile).
    let mounts_under = |dir: &std::path::Path, kind: char| -> Vec<(String, String)> {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let sep = f.iter().position(|x| *x == "-")?;
                let bundle = f[4].strip_prefix(dir.to_str()?)?.split('/').nth(1)?;
                bundle
                    .rsplit('-')
                    .next()
                    .is_some_and(|k| k.starts_with(kind))
                    .then(|| (f[4].to_string(), f[sep + 1].to_string()))
            })
            .collect()
    };
    // The run marks its own workspace, so its bundle is found (not another's).
    let body = json!({"language": "python-slim", "network": false,
        "code": "open('tree-root-mark', 'w').write('1'); import time; time.sleep(3)"});
    let (bundle, seen, config) = std::thread::scope(|sc| {
        let sleeper = sc.spawn(|| d.post_json("/execute", &body));
        let t = Instant::now();
        let bundle = loop {
            let found = std::fs::read_dir(&runs)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .find(|b| b.join("files/tree-root-mark").exists());
            if let Some(b) = found {
                break b;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "{}", d.log());
            std::thread::sleep(Duration::from_millis(20));
        };
        // Every mount of that bundle, while its program runs.
        let prefix = format!("{}/", bundle.display());
        let seen: Vec<(String, String)> = mounts_under(&runs, 'r')
            .into_iter()
            .filter(|(at, _)| at.starts_with(&prefix))
            .collect();
        let config: Value =
            serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
        assert_eq!(sleeper.join().unwrap().status, 200);
        (bundle, seen, config)
    });
    assert_eq!(
        seen,
        vec![(format!("{}/files", bundle.display()), "tmpfs".to_string())]
    );
    assert_eq!(
        config["root"],
        json!({"path": "/var/lib/isobox/rootfs/python-slim", "readonly": true})
    );
    // A session step with a volume: its workspace and /memory are binds too.
    let v = d.request("POST", "/v1/volumes", &[], br#"{"name": "tree"}"#);
    assert_eq!(v.status, 201, "{}", v.text());
    let vid = v.json()["id"].as_str().unwrap().to_string();
    let s = Session::create(&d, &json!({"runtime": "python-slim", "volumeId": vid}));
    let r = s.step_with(
        &d,
        &json!({"network": false, "code": "open('/memory/m', 'w').write('1'); open('w', 'w').write('2'); print(open('/memory/m').read() + open('w').read())"}),
    );
    assert_eq!(r["run"]["stdout"], "12\n", "{r}");
    assert_eq!(s.delete(&d).status, 204);
    // A long-lived sandbox: its init is bound at /opt/isobox/init.
    let id = d.wbx_sandbox();
    let own: Vec<String> = mounts_under(&runs, 'b')
        .into_iter()
        .map(|(at, fs)| format!("{fs} {at}"))
        .collect();
    assert!(
        own.iter()
            .any(|m| m.starts_with("overlay ") && m.ends_with("/root")),
        "{own:?}"
    );
    d.wbx_exec(&id, "touch /opt/mine /workspace-nope 2>/dev/null; ls /opt");
    assert_eq!(
        d.request("DELETE", &format!("/wbx/v1/sandboxes/{id}"), &[], b"")
            .status,
        204
    );
    d.stop();

    for (t, b) in trees.iter().zip(&before) {
        let after = tree_state(t);
        let added: Vec<&String> = after.keys().filter(|k| !b.contains_key(*k)).collect();
        let changed: Vec<&String> = after
            .iter()
            .filter(|(k, v)| b.get(*k).is_some_and(|bv| bv != *v))
            .map(|(k, _)| k)
            .collect();
        let removed: Vec<&String> = b.keys().filter(|k| !after.contains_key(*k)).collect();
        assert!(
            added.is_empty() && changed.is_empty() && removed.is_empty(),
            "{} was written: added {added:?}, changed {changed:?}, removed {removed:?}",
            t.display()
        );
    }
}

/// How a cold run's start is heard: on x86-64, runsc's poststart hook on the host
/// (`isobox-started` in the data directory; nothing extra in the sandbox's root), and,
/// where the hook cannot be installed, the frame program inside the sandbox. Either
/// way stderr written first is the program's and its time counts from its start.
#[test]
fn test_the_start_is_heard_from_a_hook_on_the_host_or_else_from_the_frame() {
    use std::os::unix::fs::PermissionsExt;
    let code = "import os, sys, time\nsys.stderr.write('first\\n'); sys.stderr.flush()\ntime.sleep(0.3)\nprint(os.path.exists('/opt/isobox/start'))";
    let x86 = cfg!(target_arch = "x86_64");
    let check = |d: &Daemon, framed: bool| {
        for _ in 0..3 {
            let r = run(d, code, json!({}));
            let run = &r["run"];
            assert_eq!(run["stderr"], "first\n", "{r}");
            assert_eq!(run["exitCode"], 0, "{r}");
            if x86 {
                let expected = if framed { "True\n" } else { "False\n" };
                assert_eq!(run["stdout"], expected, "framed: {framed}: {r}");
            }
            let ms = run["durationMs"].as_u64().unwrap();
            // From the program's start (not the boot, ~0.2-0.3 s more) to its exit.
            assert!((300..5000).contains(&ms), "durationMs {ms}: {r}");
        }
    };
    // Runs on the trees (a run on a root image signals with the frame, from
    // isobox-start --unpack, and has no /opt/isobox/start in its root).
    let d = Daemon::start_with(&[("ISOBOX_ROOT_IMAGES", "off")]);
    let hook = d.data_dir.join("isobox-started");
    if x86 {
        let mode = std::fs::metadata(&hook)
            .expect("the hook installed")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o555);
    }
    check(&d, false);
    d.assert_clean();
    d.stop();
    // The hook's place is taken (a directory with something in it): the frame it is.
    let instance = format!("isobox-t{}-framed", std::process::id());
    let data = std::env::temp_dir().join(&instance);
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(data.join("isobox-started/taken")).unwrap();
    let d = Daemon::start_with(&[
        ("ISOBOX_INSTANCE", &instance),
        ("ISOBOX_ROOT_IMAGES", "off"),
    ]);
    check(&d, true);
    if x86 {
        let log = d.log();
        assert!(
            log.contains("start hook") && log.contains("does not work"),
            "{log}"
        );
    }
    d.assert_clean();
    d.stop();
    let _ = std::fs::remove_dir_all(&data);
}

/// A runsc that does not run OCI hooks (stood in for by a wrapper that takes them out
/// of the spec) cannot tell isoboxd a cold run started: the startup probe finds it,
/// says so in the log, and cold runs use the frame from then on.
#[cfg(target_arch = "x86_64")]
#[test]
fn test_a_runsc_that_runs_no_hooks_is_found_by_the_probe_and_the_frame_used() {
    let dir = std::env::temp_dir().join(format!("isobox-nohooks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let wrapper = dir.join("runsc");
    std::fs::write(
        &wrapper,
        "#!/bin/sh\nprev=\nfor a in \"$@\"; do\n  if [ \"$prev\" = --bundle ]; then\n    python3 -c 'import json,sys; p=sys.argv[1]+\"/config.json\"; c=json.load(open(p)); c.pop(\"hooks\",None); json.dump(c,open(p,\"w\"))' \"$a\"\n  fi\n  prev=$a\ndone\nexec /usr/bin/runsc \"$@\"\n",
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&wrapper)
        .status()
        .unwrap();
    let d = Daemon::start_with(&[
        ("ISOBOX_RUNSC", wrapper.to_str().unwrap()),
        ("ISOBOX_ROOT_IMAGES", "off"),
    ]);
    d.wait_ready();
    let log = d.log();
    assert!(log.contains("did not run its poststart hook"), "{log}");
    let code =
        "import os, sys\nsys.stderr.write('e\\n')\nprint(os.path.exists('/opt/isobox/start'))";
    for _ in 0..2 {
        let r = run(&d, code, json!({}));
        assert_eq!(
            (r["run"]["stdout"].as_str(), r["run"]["stderr"].as_str()),
            (Some("True\n"), Some("e\n")),
            "{r}"
        );
    }
    d.assert_clean();
    d.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 28 item 2: a cold one-off run with no network whose runtime's tree has its
/// EROFS image is started without a gofer: the image is its root, mounted inside
/// gVisor, `/workspace` is gVisor's own tmpfs, and `isobox-start --unpack` (started by
/// runsc from a host file) writes the files into it as root's, drops to nobody with no
/// capability in any set, and execs the program. The program sees what a run on the
/// tree sees: its files, owned by root and kept from it, stdin, a root it cannot write,
/// no extra descriptor. A daemon that cannot make images runs on the tree and says why.
#[test]
fn test_a_cold_run_on_a_root_image_has_no_gofer_and_its_files_as_given() {
    let d = Daemon::start_with(&[("ISOBOX_WARM_POOL", "off")]);
    // The tree's first run asks for its image (made once a host, then shared by every
    // daemon): runs use the tree until it is ready.
    let t = Instant::now();
    let health = loop {
        let r = run(&d, "print(1)", json!({}));
        assert_eq!(
            (r["run"]["stdout"].as_str(), r["run"]["exitCode"].as_i64()),
            (Some("1\n"), Some(0)),
            "{r}"
        );
        let h = d.get("/healthz").json();
        let state = h["rootImages"]["trees"][PY]["state"].clone();
        if state == "ready" {
            break h;
        }
        assert_eq!(state, "building", "{h}");
        assert!(t.elapsed() < Duration::from_secs(180), "{h}\n{}", d.log());
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(health["rootImages"]["state"], "on", "{health}");
    let images = std::path::PathBuf::from(health["rootImages"]["dir"].as_str().unwrap());
    let code = r#"
import errno, os, sys, time
st = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
print({k: st[k] for k in ('Uid', 'Gid', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd')})
print(os.getgroups())
try:
    os.fstat(3); print('fd 3 open')
except OSError as e:
    print('fd 3', errno.errorcode[e.errno])
print(sorted((e.name, e.is_file(), e.is_dir()) for e in os.scandir('.')))
print(open('data/in.txt').read(), sys.stdin.read())
def tried(f):
    try:
        f(); return 'ok'
    except OSError as e:
        return 'refused' if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else errno.errorcode[e.errno]
print(tried(lambda: open('main.py', 'a')), tried(lambda: os.remove('data/in.txt')), tried(lambda: os.rename('data', 'd2')),
      tried(lambda: open('data/new', 'w')), tried(lambda: open('/usr/x', 'w')), tried(lambda: open('/etc/passwd', 'a')),
      tried(lambda: os.setuid(0)), tried(lambda: open('mine', 'w').write('m')))
print(oct(os.stat('.').st_mode & 0o7777), os.stat('main.py').st_uid, oct(os.stat('main.py').st_mode & 0o777), oct(os.stat('data').st_mode & 0o777), os.stat('mine').st_uid)
sys.stdout.flush()
time.sleep(2)
"#;
    let body = json!({"language": PY, "network": false, "code": code, "stdin": "from stdin",
        "files": [{"name": "data/in.txt", "content": "in"}]});
    let common::Watched {
        result: r,
        config,
        procs,
        host_procs,
    } = watched_run(&d, &body);
    assert!(!procs.iter().any(|p| p.contains("gofer")), "{procs:?}");
    // On the host, the sandbox process and its stubs are nobody with no capability
    // (runsc without directfs): the loader's capabilities are gVisor's alone.
    common::assert_no_host_privilege(&host_procs);
    let image = config["annotations"]["dev.gvisor.spec.rootfs.source"]
        .as_str()
        .unwrap_or_default();
    assert!(
        image.starts_with(images.to_str().unwrap())
            && image.contains("/python-slim.")
            && image.ends_with(".erofs"),
        "{config}"
    );
    assert_eq!(
        config["annotations"]["dev.gvisor.spec.rootfs.type"],
        "erofs"
    );
    assert_eq!(config["root"]["readonly"], true);
    assert_eq!(
        common::spec_mounts(&config),
        [
            ("/proc", "proc"),
            ("/tmp", "tmpfs"),
            ("/workspace", "tmpfs")
        ],
        "{config}"
    );
    assert_eq!(
        config["process"]["args"],
        json!([
            "/opt/isobox/start",
            "--unpack",
            "65534",
            "/usr/bin/python3",
            "main.py"
        ]),
        "{config}"
    );
    assert_eq!(
        r["run"]["stdout"],
        "{'Uid': '65534\\t65534\\t65534\\t65534', 'Gid': '65534\\t65534\\t65534\\t65534', 'CapInh': '0000000000000000', 'CapPrm': '0000000000000000', 'CapEff': '0000000000000000', 'CapBnd': '0000000000000000'}\n\
[]\n\
fd 3 EBADF\n\
[('data', False, True), ('main.py', True, False)]\n\
in from stdin\n\
refused refused refused refused refused refused refused ok\n\
0o1777 0 0o644 0o755 65534\n",
        "{r}"
    );
    assert_eq!(
        (r["run"]["stderr"].as_str(), r["run"]["exitCode"].as_i64()),
        (Some(""), Some(0)),
        "{r}"
    );
    let ms = r["run"]["durationMs"].as_u64().unwrap();
    assert!((2000..10_000).contains(&ms), "{r}");
    d.assert_clean();
    d.stop();

    // A pooled sandbox (booted before its program; its harness writes the files) is on
    // the image too, as the user from its start, with no gofer; a run it serves sees
    // its files as a pooled run does.
    let d = Daemon::start_with(&[("ISOBOX_WARM_POOL", "python-slim=1")]);
    let runs = d.data_dir.join("runs");
    let t = Instant::now();
    let (bundle, config, procs) = loop {
        let pooled = std::fs::read_dir(&runs)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|b| b.to_string_lossy().ends_with("-w1."));
        if let Some(b) = pooled.filter(|b| b.join("config.json").is_file()) {
            let config: Value =
                serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
            let procs = processes_naming(&b);
            if procs.iter().any(|p| p == "runsc-sandbox") {
                break (b, config, procs);
            }
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!procs.iter().any(|p| p.contains("gofer")), "{procs:?}");
    assert!(
        config["annotations"]["dev.gvisor.spec.rootfs.source"]
            .as_str()
            .is_some_and(|i| i.contains("/python-slim.") && i.ends_with(".erofs")),
        "{config}"
    );
    assert_eq!(
        config["process"]["user"],
        json!({"uid": 65534, "gid": 65534})
    );
    assert_eq!(config["process"]["capabilities"]["bounding"], json!([]));
    assert!(
        config["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["type"] != "bind"),
        "{config}"
    );
    while d.get("/healthz").json()["warmPool"]["runtimes"][PY]["ready"] != 1 {
        assert!(t.elapsed() < Duration::from_secs(60), "{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its harness waits: on the host, nobody with no capability (runsc without
    // directfs), as a cold run on an image.
    common::assert_no_host_privilege(&common::sandbox_host_processes(&bundle));
    let r = d.execute(json!({"language": PY, "network": false,
        "code": "import os; print(sorted(os.listdir('.')), open('data/in.txt').read(), os.getuid())",
        "files": [{"name": "data/in.txt", "content": "in"}]}));
    assert_eq!(r["run"]["stdout"], "['data', 'main.py'] in 65534\n", "{r}");
    assert_eq!(d.get("/healthz").json()["warmPool"]["hits"], 1);
    d.assert_clean_except_pool();
    d.stop();

    // Where no image can be made, runs use the tree; /healthz says why.
    let d = Daemon::start_with(&[
        ("ISOBOX_WARM_POOL", "off"),
        ("ISOBOX_IMAGE_DIR", "/proc/isobox-no-images"),
    ]);
    let t = Instant::now();
    loop {
        let r = run(&d, "import os; print(sorted(os.listdir('.')))", json!({}));
        assert_eq!(r["run"]["stdout"], "['main.py']\n", "{r}");
        let h = d.get("/healthz").json();
        let tree = &h["rootImages"]["trees"][PY];
        if tree["state"] == "off" {
            assert!(
                tree["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("/proc/isobox-no-images"),
                "{h}"
            );
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{h}");
        std::thread::sleep(Duration::from_millis(100));
    }
    d.assert_clean();
    d.stop();
}

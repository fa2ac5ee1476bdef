//! Many inputs, one request: `POST /execute` with `inputs` runs the code once per input,
//! each in its own sandbox with its own stdin, args and outcome, and answers every
//! result in input order (JSON, or SSE whose events carry the input's index); with
//! `"sharedSandbox": true`, one after another in one sandbox, a compiled runtime built
//! once. Real daemon, real sandboxes.

mod common;
use common::session::Session;
use common::sse::Stream;
use common::Daemon;
use serde_json::{json, Value};

fn post(d: &Daemon, body: &Value) -> common::Resp {
    d.request(
        "POST",
        "/execute",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

fn many(code: &str, inputs: Value) -> Value {
    json!({"language": "python-slim", "network": false, "code": code, "inputs": inputs})
}

/// 64 inputs of `print(input(), sys.argv[1:])` with `extra` merged into the body, each
/// input's second arg `arg` (which Python prints as `shown`): 64 results in order, each
/// the `run` object a single run answers (its keys and limits). Returns the answer.
fn sixty_four_in_order(d: &Daemon, extra: Value, arg: &str, shown: &str) -> Value {
    let inputs: Vec<Value> = (0..64)
        .map(|i| json!({"stdin": format!("in{i}\n"), "args": [format!("a{i}"), arg]}))
        .collect();
    let body = merge(
        many("import sys\nprint(input(), sys.argv[1:])", json!(inputs)),
        extra,
    );
    let r = post(d, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["language"], "python-slim");
    assert_eq!(v["backend"], "gvisor");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 64);
    let single = d.execute(json!({"language": "python-slim", "network": false, "code": "1"}));
    let keys = |o: &Value| o.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    for (i, res) in results.iter().enumerate() {
        assert_eq!(
            res["stdout"],
            format!("in{i} ['a{i}', {shown}]\n"),
            "input {i}: {res}"
        );
        assert_eq!(res["exitCode"], 0);
        assert_eq!(res["limits"], single["run"]["limits"]);
        assert_eq!(keys(res), keys(&single["run"]));
    }
    v
}

#[test]
fn test_sixty_four_inputs_give_sixty_four_results_in_order() {
    let d = Daemon::start();
    sixty_four_in_order(&d, json!({}), "b c", "'b c'");
    d.assert_clean();
}

#[test]
fn test_an_input_that_times_out_or_runs_out_of_memory_leaves_the_others_intact() {
    let d = Daemon::start();
    let code = "import sys,time\nw = input()\nif w == 'sleep': time.sleep(30)\nif w == 'eat':\n b = []\n while True: b.append(bytearray(8 << 20))\nif w == 'fail': sys.exit(3)\nprint('ok', w)";
    let mut body = many(
        code,
        json!([{"stdin": "a"}, {"stdin": "sleep"}, {"stdin": "eat"}, {"stdin": "fail"}, {"stdin": "b"}]),
    );
    body["limits"] = json!({"wallTimeMs": 1500, "memoryBytes": 67108864});
    let r = post(&d, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let res = r.json()["results"].as_array().unwrap().clone();
    assert_eq!(res.len(), 5);
    assert_eq!(
        (res[0]["stdout"].clone(), res[0]["exitCode"].clone()),
        (json!("ok a\n"), json!(0))
    );
    assert_eq!(res[1]["timedOut"], true, "{}", res[1]);
    assert_eq!(res[1]["exitCode"], 137);
    assert_eq!(res[2]["oomKilled"], true, "{}", res[2]);
    assert_eq!(res[3]["exitCode"], 3, "{}", res[3]);
    assert_eq!(
        (res[4]["stdout"].clone(), res[4]["exitCode"].clone()),
        (json!("ok b\n"), json!(0))
    );
    // Each had the request's limits.
    for r in &res {
        assert_eq!(r["limits"]["wallTimeMs"], 1500);
        assert_eq!(r["limits"]["memoryBytes"], 67108864);
    }
    d.assert_clean();
}

#[test]
fn test_a_streamed_many_input_request_says_each_inputs_index() {
    let d = Daemon::start();
    let mut s = Stream::execute(
        &d,
        &many(
            "import sys\nw = input()\nprint('out', w, flush=True)\nprint('err', w, file=sys.stderr)",
            json!([{"stdin": "x"}, {"stdin": "y"}, {"stdin": "z"}]),
        ),
    );
    while s.more() {}
    let done = s.done.clone().expect("done");
    let results = done["results"].as_array().unwrap();
    for (i, w) in ["x", "y", "z"].iter().enumerate() {
        let out: String = s
            .events
            .iter()
            .filter(|(_, n, v)| n == "stdout" && v["index"] == i)
            .map(|(_, _, v)| v["chunk"].as_str().unwrap())
            .collect();
        assert_eq!(out, format!("out {w}\n"), "{}", s.text);
        let err: String = s
            .events
            .iter()
            .filter(|(_, n, v)| n == "stderr" && v["index"] == i)
            .map(|(_, _, v)| v["chunk"].as_str().unwrap())
            .collect();
        assert_eq!(err, format!("err {w}\n"));
        // One `result` event per input, before `done`, carrying its index.
        let ended: Vec<&Value> = s
            .events
            .iter()
            .filter(|(_, n, v)| n == "result" && v["index"] == i)
            .map(|(_, _, v)| v)
            .collect();
        assert_eq!(ended.len(), 1);
        // Its outcome, without the output its stdout/stderr events carried.
        assert_eq!(ended[0]["exitCode"], results[i]["exitCode"]);
        assert_eq!(ended[0]["durationMs"], results[i]["durationMs"]);
        assert!(ended[0].get("stdout").is_none(), "{}", ended[0]);
        assert_eq!(results[i]["stdout"], format!("out {w}\n"));
    }
    assert_eq!(s.events.last().unwrap().1, "done");
    d.assert_clean();
}

#[test]
fn test_a_batch_leaves_slots_for_others_and_its_client_leaving_cancels_it() {
    // Two slots: a batch runs one input at a time, so a single run still gets in.
    let d = Daemon::start_with(&[("ISOBOX_MAX_CONCURRENT", "2")]);
    let mut s = Stream::execute(
        &d,
        &many(
            "import time\nprint('started', flush=True)\ntime.sleep(20)",
            json!([{}, {}, {}, {}]),
        ),
    );
    s.wait_line("started");
    let one = d.execute(json!({"language": "python-slim", "network": false, "code": "print(7)"}));
    assert_eq!(one["run"]["stdout"], "7\n", "{one}");
    // The client leaves: every input is cancelled, none more starts.
    drop(s);
    d.assert_clean();
    let h = d.get("/healthz").json();
    assert_eq!(h["counters"]["runsCancelled"], 1, "{h}");
}

#[test]
fn test_bad_inputs_are_refused_with_what_is_wrong() {
    let d = Daemon::start();
    let too_many: Vec<Value> = (0..65).map(|_| json!({})).collect();
    let cases = [
        (many("1", json!([])), "inputs: 1 to 64"),
        (many("1", json!(too_many)), "inputs: 1 to 64"),
        (
            merge(many("1", json!([{}])), json!({"stdin": "x"})),
            "each input gives its own",
        ),
        (
            merge(many("1", json!([{}])), json!({"args": ["x"]})),
            "each input gives its own",
        ),
        (
            merge(many("1", json!([{}])), json!({"detach": true})),
            "detach",
        ),
        (
            many("1", json!([{"args": ["a\u{0}b"]}])),
            "inputs[0].args may not contain NUL",
        ),
        (many("1", json!([{"stdin": 5}])), "inputs[0].stdin"),
        (many("1", json!([{"env": {}}])), "env"),
        (many("1", json!({"stdin": "x"})), "inputs"),
        (
            json!({"language": "python-slim", "code": "1", "sharedSandbox": true}),
            "sharedSandbox: only with inputs",
        ),
        (
            merge(many("1", json!([{}])), json!({"sharedSandbox": "yes"})),
            "sharedSandbox",
        ),
    ];
    for (body, says) in cases {
        let r = post(&d, &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"], "invalid_json");
        assert!(r.text().contains(says), "{body}: {}", r.text());
    }
    // At the bound: 64 inputs are taken (the first test runs them); a session step
    // runs once.
    let s = Session::create(&d, &json!({"runtime": "python-slim", "network": false}));
    let r = s.exec(&d, &json!({"code": "1", "inputs": [{}]}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("inputs: a session step runs once"),
        "{}",
        r.text()
    );
    // Nothing was started by any of these.
    assert_eq!(d.get("/healthz").json()["counters"]["runsTotal"], 0);
}

fn shared(code: &str, inputs: Value) -> Value {
    merge(many(code, inputs), json!({"sharedSandbox": true}))
}

#[test]
fn test_sixty_four_inputs_in_one_shared_sandbox_boot_it_once() {
    let d = Daemon::start();
    // Args reach the program as words, whatever quotes or `$` they hold.
    let v = sixty_four_in_order(
        &d,
        json!({"sharedSandbox": true}),
        "it's $HOME",
        "\"it's $HOME\"",
    );
    assert_eq!(v["shared"], json!({"sandboxes": 1, "builds": 0}), "{v}");
    let h = d.get("/healthz").json();
    assert_eq!(h["counters"]["runsTotal"], 65, "{h}");
    d.assert_clean();
}

#[test]
fn test_in_a_shared_sandbox_each_input_has_its_own_outcome_and_nothing_left_by_the_last() {
    let d = Daemon::start();
    // `procs` lists the processes it sees (pid 1 is the sandbox's init); `stray`
    // leaves a process behind that has left its group; `tmp` shows the inputs share /tmp.
    let code = "import os,sys,time\nw = input()\nprocs = lambda: len([p for p in os.listdir('/proc') if p.isdigit()])\nif w == 'sleep': time.sleep(30)\nif w == 'eat':\n b = []\n while True: b.append(bytearray(8 << 20))\nif w == 'fail': sys.exit(3)\nif w == 'stray':\n if os.fork() == 0:\n  os.setsid(); time.sleep(100)\n time.sleep(0.2)\nprint(w, os.getuid(), os.getcwd(), os.environ['HOME'], procs(), os.path.exists('/tmp/mark'))\nopen('/tmp/mark', 'w').close()";
    let mut body = shared(
        code,
        json!([{"stdin": "a"}, {"stdin": "sleep"}, {"stdin": "b"}, {"stdin": "eat"}, {"stdin": "fail"}, {"stdin": "stray"}, {"stdin": "c"}]),
    );
    body["limits"] = json!({"wallTimeMs": 1500, "memoryBytes": 67108864});
    let r = post(&d, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let res = v["results"].as_array().unwrap().clone();
    assert_eq!(res.len(), 7);
    // The program sees what a run of its own sees: nobody, /workspace, HOME=/tmp.
    let alone = d.execute(json!({"language": "python-slim", "network": false,
        "code": "import os\nprint(os.getuid(), os.getcwd(), os.environ['HOME'])"}));
    let who = alone["run"]["stdout"].as_str().unwrap().trim().to_string();
    assert_eq!(res[0]["stdout"], format!("a {who} 2 False\n"), "{}", res[0]);
    assert_eq!(
        (res[1]["timedOut"].clone(), res[1]["exitCode"].clone()),
        (json!(true), json!(137)),
        "{}",
        res[1]
    );
    assert_eq!(res[1]["oomKilled"], false);
    assert!(res[1]["durationMs"].as_u64().unwrap() >= 1500, "{}", res[1]);
    // After a time limit the sandbox goes on: same /tmp.
    assert_eq!(res[2]["stdout"], format!("b {who} 2 True\n"), "{}", res[2]);
    assert_eq!(
        (res[3]["oomKilled"].clone(), res[3]["exitCode"].clone()),
        (json!(true), json!(137)),
        "{}",
        res[3]
    );
    assert_eq!(res[3]["timedOut"], false);
    assert_eq!(res[4]["exitCode"], 3, "{}", res[4]);
    // (`fail` exits before it prints.)
    assert_eq!(res[4]["stdout"], "", "{}", res[4]);
    // A fresh sandbox after the memory kill: /tmp is new; `stray` sees its child.
    assert_eq!(
        res[5]["stdout"],
        format!("stray {who} 3 False\n"),
        "{}",
        res[5]
    );
    // What the last input left running is gone before the next starts.
    assert_eq!(res[6]["stdout"], format!("c {who} 2 True\n"), "{}", res[6]);
    for r in &res {
        assert_eq!(r["limits"]["memoryBytes"], 67108864, "{r}");
    }
    assert_eq!(v["shared"], json!({"sandboxes": 2, "builds": 0}), "{v}");
    let h = d.get("/healthz").json();
    assert_eq!(h["counters"]["runsTimedOut"], 1, "{h}");
    assert_eq!(h["counters"]["runsOomKilled"], 1, "{h}");
    d.assert_clean();
}

#[test]
fn test_a_compiled_runtime_builds_once_in_a_shared_sandbox() {
    let d = Daemon::start();
    // Each input prints the build's binary's modification time: one build, one time.
    let code = "package main\nimport (\"bufio\"; \"fmt\"; \"os\")\nfunc main() {\n s, _ := bufio.NewReader(os.Stdin).ReadString('\\n')\n st, _ := os.Stat(\"/tmp/main\")\n fmt.Println(s, os.Args[1:], st.ModTime().UnixNano())\n}\n";
    let body = json!({"language": "go", "network": false, "sharedSandbox": true, "code": code,
        "inputs": [{"stdin": "x\n", "args": ["1"]}, {"stdin": "y\n"}, {"stdin": "z\n", "args": ["a b"]}]});
    let r = post(&d, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["shared"], json!({"sandboxes": 1, "builds": 1}), "{v}");
    let res = v["results"].as_array().unwrap();
    let built: Vec<&str> = res
        .iter()
        .map(|r| {
            r["stdout"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .last()
                .unwrap()
        })
        .collect();
    assert_eq!(built[0], built[1], "{v}");
    assert_eq!(built[1], built[2], "{v}");
    for (r, (s, a)) in res.iter().zip([("x", "[1]"), ("y", "[]"), ("z", "[a b]")]) {
        assert!(
            r["stdout"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{s}\n {a} ")),
            "{r}"
        );
        assert_eq!(r["exitCode"], 0);
        // Every input carries the one build's outcome.
        assert_eq!(r["compile"], res[0]["compile"]);
        assert_eq!(r["compile"]["exitCode"], 0);
    }
    // A build that fails: every input gets its outcome, as each would alone.
    let mut bad = body.clone();
    bad["code"] = json!("package main\nfunc main() { x }\n");
    let v = post(&d, &bad).json();
    assert_eq!(v["shared"], json!({"sandboxes": 1, "builds": 1}), "{v}");
    let alone = d.execute(
        json!({"language": "go", "network": false, "code": "package main\nfunc main() { x }\n"}),
    );
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["exitCode"], alone["run"]["exitCode"], "{r}");
        assert_eq!(r["stderr"], alone["run"]["stderr"], "{r}");
        assert_eq!(r["compile"]["exitCode"], alone["compile"]["exitCode"]);
        assert!(
            r["compile"]["stderr"]
                .as_str()
                .unwrap()
                .contains("undefined: x"),
            "{r}"
        );
    }
    d.assert_clean();
}

#[test]
fn test_a_shared_sandbox_streams_each_index_and_holds_one_slot_until_its_client_leaves() {
    let d = Daemon::start_with(&[("ISOBOX_MAX_CONCURRENT", "1")]);
    let mut s = Stream::execute(
        &d,
        &shared(
            "import sys\nw = input()\nprint('out', w, flush=True)\nprint('err', w, file=sys.stderr)",
            json!([{"stdin": "x"}, {"stdin": "y"}]),
        ),
    );
    while s.more() {}
    let done = s.done.clone().expect("done");
    assert_eq!(done["shared"]["sandboxes"], 1, "{done}");
    for (i, w) in ["x", "y"].iter().enumerate() {
        for (name, what) in [("stdout", "out"), ("stderr", "err")] {
            let text: String = s
                .events
                .iter()
                .filter(|(_, n, v)| n == name && v["index"] == i)
                .map(|(_, _, v)| v["chunk"].as_str().unwrap())
                .collect();
            assert_eq!(text, format!("{what} {w}\n"), "{}", s.text);
        }
        let ended = s
            .events
            .iter()
            .filter(|(_, n, v)| n == "result" && v["index"] == i)
            .count();
        assert_eq!(ended, 1, "{}", s.text);
    }
    // While a shared batch runs it holds the one slot; its client leaving ends it.
    let mut s = Stream::execute(
        &d,
        &shared(
            "import time\nprint('started', flush=True)\ntime.sleep(20)",
            json!([{}, {}, {}]),
        ),
    );
    s.wait_line("started");
    let r = post(
        &d,
        &json!({"language": "python-slim", "network": false, "code": "print(7)"}),
    );
    assert_eq!(r.status, 429, "{}", r.text());
    drop(s);
    d.assert_clean();
    let one = d.execute(json!({"language": "python-slim", "network": false, "code": "print(7)"}));
    assert_eq!(one["run"]["stdout"], "7\n", "{one}");
    let h = d.get("/healthz").json();
    assert_eq!(h["counters"]["runsCancelled"], 1, "{h}");
}

#[test]
fn test_a_shared_sandbox_has_the_runs_shutdown_grace_and_its_client_an_answer() {
    let d = Daemon::start_with(&[("ISOBOX_SHUTDOWN_GRACE_MS", "2000")]);
    let mut s = Stream::execute(
        &d,
        &shared(
            "import time\nprint('started', flush=True)\ntime.sleep(60)",
            json!([{}, {}, {}]),
        ),
    );
    s.wait_line("started");
    std::process::Command::new("kill")
        .args(["-TERM", &d.pid().to_string()])
        .status()
        .unwrap();
    while s.more() {}
    let done = s.done.clone().expect("done");
    let res = done["results"].as_array().unwrap();
    // The running input is killed at the grace's end, as a run is; the rest never start.
    assert_eq!(res[0]["exitCode"], 137, "{done}");
    assert_eq!(res[0]["stdout"], "started\n", "{done}");
    for r in &res[1..] {
        assert_eq!(r["error"], "shutting_down", "{done}");
    }
    d.stop();
}

fn merge(mut a: Value, b: Value) -> Value {
    for (k, v) in b.as_object().unwrap() {
        a[k] = v.clone();
    }
    a
}

//! Many inputs, one request: `POST /execute` with `inputs` runs the code once per input,
//! each in its own sandbox with its own stdin, args and outcome, and answers every
//! result in input order (JSON, or SSE whose events carry the input's index). Real
//! daemon, real sandboxes.

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

#[test]
fn test_sixty_four_inputs_give_sixty_four_results_in_order() {
    let d = Daemon::start();
    let inputs: Vec<Value> = (0..64)
        .map(|i| json!({"stdin": format!("in{i}\n"), "args": [format!("a{i}"), "b c"]}))
        .collect();
    let r = post(
        &d,
        &many("import sys\nprint(input(), sys.argv[1:])", json!(inputs)),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["language"], "python-slim");
    assert_eq!(v["backend"], "gvisor");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 64);
    // Each is a `run` object as a single run answers it.
    let single = d.execute(json!({"language": "python-slim", "network": false, "code": "1"}));
    let keys = |o: &Value| o.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    for (i, res) in results.iter().enumerate() {
        assert_eq!(
            res["stdout"],
            format!("in{i} ['a{i}', 'b c']\n"),
            "input {i}: {res}"
        );
        assert_eq!(res["exitCode"], 0);
        assert_eq!(keys(res), keys(&single["run"]));
    }
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

fn merge(mut a: Value, b: Value) -> Value {
    for (k, v) in b.as_object().unwrap() {
        a[k] = v.clone();
    }
    a
}

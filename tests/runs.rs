//! Recorded runs (`/v1/runs/{id}`): a streamed run's events carry ids and a client
//! that lost its stream resumes with `Last-Event-ID` (or `?after=`) and gets every
//! byte exactly once; a detached run (`"detach": true`) answers 202 and is read after
//! it ended, waited on, or cancelled; records go after their retention (seconds, and
//! bytes oldest-first); a run is only its tenant's. Real daemon, real sandboxes, raw
//! sockets.

mod common;
use common::session::Session;
use common::sse::Stream;
use common::Daemon;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn post(d: &Daemon, path: &str, headers: &[(&str, &str)], body: &Value) -> common::Resp {
    let mut h = vec![("Content-Type", "application/json")];
    h.extend_from_slice(headers);
    d.request("POST", path, &h, body.to_string().as_bytes())
}

/// `POST /execute` with `"detach": true`; asserts the 202 and returns the run's id.
fn detach(d: &Daemon, headers: &[(&str, &str)], body: Value) -> String {
    let mut body = body;
    body["detach"] = json!(true);
    let r = post(d, "/execute", headers, &body);
    assert_eq!(r.status, 202, "{}", r.text());
    let v = r.json();
    let id = v["id"].as_str().expect("an id").to_string();
    assert!(
        id.starts_with("run_") && id.len() == 28,
        "ids are run_ and 24 hex digits: {id}"
    );
    assert_eq!(v["status"], "running");
    assert_eq!(v["url"], format!("/v1/runs/{id}"));
    assert_eq!(v["eventsUrl"], format!("/v1/runs/{id}/events"));
    assert_eq!(
        r.header("location"),
        Some(format!("/v1/runs/{id}").as_str())
    );
    id
}

/// `GET /v1/runs/{id}[?wait=S]` with `headers`.
fn get_run(d: &Daemon, id: &str, wait: u64, headers: &[(&str, &str)]) -> common::Resp {
    d.request("GET", &format!("/v1/runs/{id}?wait={wait}"), headers, b"")
}

/// The record once its run ended (waiting up to 60 s for it).
fn ended(d: &Daemon, id: &str) -> Value {
    let r = get_run(d, id, 60, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_ne!(v["status"], "running", "{v}");
    v
}

fn python(code: &str) -> Value {
    json!({"language": "python-slim", "network": false, "code": code})
}

/// A program that prints numbered lines with pauses, so a reader can drop between them.
const PACED: &str = "import sys,time\nfor i in range(40):\n print('line-%02d' % i + 'x' * 200, flush=True)\n if i % 4 == 3: time.sleep(0.3)\nprint('to stderr', file=sys.stderr)";

fn paced_stdout() -> String {
    (0..40)
        .map(|i| format!("line-{i:02}{}\n", "x".repeat(200)))
        .collect()
}

/// The chunks of `stream`'s output events, in order, with their ids.
fn chunks(events: &[(Option<u64>, String, Value)], stream: &str) -> String {
    events
        .iter()
        .filter(|(_, n, _)| n == stream)
        .map(|(_, _, v)| v["chunk"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn test_a_dropped_stream_resumed_with_last_event_id_gets_every_byte_once_in_order() {
    let d = Daemon::start();
    let id = detach(&d, &[], python(PACED));
    // A first reader takes a few events, then its connection drops.
    let mut first = Stream::get(&d, &format!("/v1/runs/{id}/events"), &[]);
    assert_eq!(first.run_id.as_deref(), Some(id.as_str()));
    while first.events.len() < 3 {
        assert!(first.more(), "the stream ended early: {}", first.text);
    }
    let seen = first.events.clone();
    let last = seen.last().unwrap().0.expect("events carry ids");
    drop(first);
    // The run goes on (~3 s of pauses): the second reader follows it live.
    assert_eq!(get_run(&d, &id, 0, &[]).json()["status"], "running");
    // The second resumes after the last event it had, by header.
    let mut second = Stream::get(
        &d,
        &format!("/v1/runs/{id}/events"),
        &[("Last-Event-ID", &last.to_string())],
    );
    while second.more() {}
    let done = second
        .done
        .clone()
        .expect("the resumed stream ends with done");
    let all: Vec<_> = seen.iter().chain(second.events.iter()).cloned().collect();
    // Ids are 1, 2, 3, … with no gap and no repeat across both connections.
    let ids: Vec<u64> = all.iter().map(|(i, _, _)| i.expect("an id")).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "{ids:?}");
    // Every byte once, in order: the chunks join to exactly what the program wrote.
    assert_eq!(chunks(&all, "stdout"), paced_stdout());
    assert_eq!(chunks(&all, "stderr"), "to stderr\n");
    assert_eq!(done["run"]["stdout"], paced_stdout());
    assert_eq!(done["run"]["exitCode"], 0);
    assert_eq!(all.last().unwrap().1, "done");
    // `?after=` is the same resume; after the last event of an ended run the stream
    // ends at once with nothing.
    let n = ids.len() as u64;
    let mut third = Stream::get(&d, &format!("/v1/runs/{id}/events?after={}", n - 1), &[]);
    while third.more() {}
    assert_eq!(third.events.len(), 1, "{}", third.text);
    assert_eq!(third.events[0].0, Some(n));
    assert_eq!(third.events[0].2, done);
    let mut none = Stream::get(&d, &format!("/v1/runs/{id}/events?after={n}"), &[]);
    while none.more() {}
    assert!(none.events.is_empty(), "{}", none.text);
    // From the start, the whole record again, identical.
    let mut again = Stream::get(&d, &format!("/v1/runs/{id}/events"), &[]);
    while again.more() {}
    assert_eq!(again.events, all);
    d.assert_clean();
}

#[test]
fn test_a_streamed_run_whose_client_left_is_cancelled_and_its_record_says_so() {
    let d = Daemon::start();
    let mut s = Stream::execute(
        &d,
        &python("import time\nprint('first', flush=True)\ntime.sleep(60)"),
    );
    let id = s
        .run_id
        .clone()
        .expect("a streamed run says its id (X-Run-Id)");
    s.wait_line("first");
    assert_eq!(s.events[0].0, Some(1), "SSE events carry ids");
    let first = s.events[0].clone();
    drop(s);
    // As before: the disconnect cancels the run. What happened stays readable.
    let v = ended(&d, &id);
    assert_eq!(v["status"], "cancelled", "{v}");
    assert_eq!(v["detached"], false);
    assert_eq!(v["result"]["run"]["exitCode"], 137, "{v}");
    assert_eq!(v["result"]["run"]["stdout"], "first\n");
    // The events it missed: none but the end; from the start, the one it saw first.
    let mut r = Stream::get(&d, &format!("/v1/runs/{id}/events"), &[]);
    while r.more() {}
    assert_eq!(r.events[0], first);
    assert_eq!(r.events.last().unwrap().1, "done");
    assert_eq!(r.events.last().unwrap().2, v["result"]);
    d.assert_clean();
}

#[test]
fn test_a_detached_run_is_read_after_it_ended_waited_on_and_cancelled() {
    let d = Daemon::start();
    // Its stdin and args are the request's, as for any run.
    let id = detach(
        &d,
        &[],
        json!({"language": "python-slim", "network": false, "stdin": "from stdin",
               "args": ["a1"], "code": "import sys,time\ntime.sleep(1)\nprint(input(), sys.argv[1])"}),
    );
    let now = get_run(&d, &id, 0, &[]).json();
    assert_eq!(now["status"], "running", "{now}");
    assert_eq!(now["detached"], true);
    assert_eq!(now["language"], "python-slim");
    assert!(now.get("result").is_none(), "{now}");
    // A wait answers when the run ends.
    let v = ended(&d, &id);
    assert_eq!(v["status"], "done", "{v}");
    assert_eq!(v["result"]["run"]["stdout"], "from stdin a1\n");
    assert_eq!(v["result"]["run"]["exitCode"], 0);
    assert_eq!(v["result"]["language"], "python-slim");
    assert_eq!(v["events"], 2, "one stdout event and done: {v}");
    // And again later: the same.
    assert_eq!(get_run(&d, &id, 0, &[]).json(), v);
    let m = d.get("/metrics").text();
    assert!(m.contains("\nisobox_run_records 1\n"), "{m}");

    // Cancelled by request: 202, then the record says cancelled; again: 200.
    let id = detach(
        &d,
        &[],
        python("import time\nprint('up', flush=True)\ntime.sleep(60)"),
    );
    let mut follow = Stream::get(&d, &format!("/v1/runs/{id}/events"), &[]);
    follow.wait_line("up");
    let r = post(&d, &format!("/v1/runs/{id}/cancel"), &[], &json!({}));
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["id"], id.as_str());
    let v = ended(&d, &id);
    assert_eq!(v["status"], "cancelled", "{v}");
    assert_eq!(v["result"]["run"]["exitCode"], 137);
    // The follower got the end too.
    let done = follow.finish();
    assert_eq!(done, v["result"]);
    let r = post(&d, &format!("/v1/runs/{id}/cancel"), &[], &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "cancelled");
    d.assert_clean();
}

#[test]
fn test_session_steps_are_recorded_and_can_be_detached_filesystem_and_kernel() {
    let d = Daemon::start();
    let s = Session::create(&d, &json!({"runtime": "python-slim", "network": false}));
    let r = s.exec(
        &d,
        &json!({"detach": true, "code": "open('kept.txt','w').write('k')\nprint('stepped')"}),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let v = ended(&d, &id);
    assert_eq!(v["result"]["run"]["stdout"], "stepped\n", "{v}");
    assert_eq!(s.fs(&d, "GET", "path=kept.txt", b"").text(), "k");
    // A kernel's step, detached: answered 202 at once, read when it ended; the kernel
    // keeps what it set.
    let k = Session::kernel(&d);
    let r = k.exec(
        &d,
        &json!({"detach": true, "code": "import time\nx = 41\ntime.sleep(1)\nprint('kernel step')"}),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    // It cannot be cancelled (only ending the kernel stops a step): 409, and it goes on.
    let c = post(&d, &format!("/v1/runs/{id}/cancel"), &[], &json!({}));
    assert_eq!(c.status, 409, "{}", c.text());
    assert_eq!(c.json()["error"], "not_cancellable");
    let v = ended(&d, &id);
    assert_eq!(v["status"], "done", "{v}");
    assert_eq!(v["result"]["run"]["stdout"], "kernel step\n", "{v}");
    let r = k.exec(&d, &json!({"code": "print(x + 1)"}));
    assert_eq!(r.json()["run"]["stdout"], "42\n", "{}", r.text());
    // A streamed kernel step has an id and ids on its events; its client leaving does
    // not end it (the kernel runs it through), and its record has all of it, done.
    let mut st = k.stream(
        &d,
        &json!({"code": "import time\nprint('a', flush=True)\ntime.sleep(1.5)\nx = 100\nprint('b')"}),
    );
    let id = st
        .run_id
        .clone()
        .expect("a streamed kernel step has X-Run-Id");
    st.wait_line("a");
    assert_eq!(st.events[0].0, Some(1), "{}", st.text);
    drop(st);
    let v = ended(&d, &id);
    assert_eq!(v["status"], "done", "{v}");
    assert_eq!(v["result"]["run"]["stdout"], "a\nb\n", "{v}");
    let mut again = Stream::get(&d, &format!("/v1/runs/{id}/events"), &[]);
    while again.more() {}
    assert_eq!(chunks(&again.events, "stdout"), "a\nb\n");
    let r = k.exec(&d, &json!({"code": "print(x)"}));
    assert_eq!(r.json()["run"]["stdout"], "100\n", "{}", r.text());
    // A step the kernel cannot take now is refused before any record exists.
    let busy = k.exec(
        &d,
        &json!({"detach": true, "code": "import time\ntime.sleep(2)"}),
    );
    assert_eq!(busy.status, 202, "{}", busy.text());
    let r = k.exec(&d, &json!({"detach": true, "code": "1"}));
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["error"], "session_busy", "{}", r.text());
    ended(&d, busy.json()["id"].as_str().unwrap());
}

#[test]
fn test_records_go_after_their_seconds_and_oldest_first_past_their_bytes() {
    // 64 KiB of records (the least allowed), kept 3 s.
    let d = Daemon::start_with(&[
        ("ISOBOX_RUN_RETAIN_BYTES", "65536"),
        ("ISOBOX_RUN_RETAIN_S", "3"),
    ]);
    // ~20 KiB of output: its chunks and its result hold it twice (~41 KiB a record).
    let big = python("print('y' * 20000)");
    let a = detach(&d, &[], big.clone());
    ended(&d, &a);
    // Below the budget: kept.
    assert_eq!(get_run(&d, &a, 0, &[]).status, 200);
    let b = detach(&d, &[], big.clone());
    ended(&d, &b);
    // Measured from when its end was seen (after the end itself): a lower bound.
    let t_b = Instant::now();
    // Past the budget: the oldest ended record went, the newer one stays.
    let gone = get_run(&d, &a, 0, &[]);
    assert_eq!(gone.status, 404, "{}", gone.text());
    assert_eq!(gone.json()["error"], "run_not_found");
    assert_eq!(get_run(&d, &b, 0, &[]).status, 200);
    let m = d.get("/metrics").text();
    let bytes: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("isobox_run_record_bytes "))
        .unwrap()
        .parse()
        .unwrap();
    assert!((40_000..=65_536).contains(&bytes), "{bytes}");
    // Seconds: b is gone once 3 s passed since its end (and not before: a lower bound).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = get_run(&d, &b, 0, &[]);
        if r.status == 404 {
            break;
        }
        assert_eq!(r.status, 200);
        assert!(
            Instant::now() < deadline,
            "the record outlived its retention"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        t_b.elapsed() >= Duration::from_secs(3),
        "gone after {:?}",
        t_b.elapsed()
    );
    // A live run's record is never dropped, whatever the budget: a follower gets all of
    // a run whose events alone exceed it; and the newest ended record stays readable.
    let c = detach(
        &d,
        &[],
        python("import time\nfor i in range(4):\n print('z' * 30000, flush=True); time.sleep(0.2)"),
    );
    let mut f = Stream::get(&d, &format!("/v1/runs/{c}/events"), &[]);
    while f.more() {}
    let want: String = "z".repeat(30000) + "\n";
    let want: String = want.repeat(4).chars().take(65536).collect();
    assert_eq!(chunks(&f.events, "stdout"), want);
    let done = &f.events.last().unwrap();
    assert_eq!(done.1, "done", "{done:?}");
    assert_eq!(done.2["run"]["truncated"], true);
    let v = get_run(&d, &c, 0, &[]).json();
    assert_eq!(v["result"], done.2, "{v}");
    d.assert_clean();
}

#[test]
fn test_bad_run_requests_get_clear_errors_and_a_run_is_its_tenants_only() {
    let d = Daemon::start_with(&[("ISOBOX_API_KEYS", "key-of-alice,key-of-bob")]);
    let alice = [("X-API-Key", "key-of-alice")];
    let bob = [("X-API-Key", "key-of-bob")];
    let id = detach(
        &d,
        &alice,
        python("import time\ntime.sleep(2)\nprint('hi')"),
    );
    // Another key sees nothing: not the record, its events, nor its cancel.
    for r in [
        get_run(&d, &id, 0, &bob),
        d.request("GET", &format!("/v1/runs/{id}/events"), &bob, b""),
        post(&d, &format!("/v1/runs/{id}/cancel"), &bob, &json!({})),
    ] {
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.json()["error"], "run_not_found");
    }
    // No key at all: 401, as everywhere with keys.
    assert_eq!(get_run(&d, &id, 0, &[]).status, 401);
    for (path, code) in [
        (format!("/v1/runs/{id}?wait=61"), "invalid_query"),
        (format!("/v1/runs/{id}?wait=soon"), "invalid_query"),
        (format!("/v1/runs/{id}/events?after=-1"), "invalid_query"),
        (
            "/v1/runs/run_000000000000000000000000".to_string(),
            "run_not_found",
        ),
        (format!("/v1/runs/{}", "x".repeat(65)), "run_not_found"),
    ] {
        let r = d.request("GET", &path, &alice, b"");
        assert_eq!(r.json()["error"], code, "{path}: {}", r.text());
        assert_eq!(r.status, if code == "run_not_found" { 404 } else { 400 });
    }
    let r = d.request(
        "GET",
        &format!("/v1/runs/{id}/events"),
        &[alice[0], ("Last-Event-ID", "three")],
        b"",
    );
    assert_eq!(
        (r.status, r.json()["error"].clone()),
        (400, json!("invalid_query"))
    );
    assert!(r.text().contains("Last-Event-ID"), "{}", r.text());
    // `after` wins over the header, but a header that is no event id is still refused.
    let r = d.request(
        "GET",
        &format!("/v1/runs/{id}/events?after=1"),
        &[alice[0], ("Last-Event-ID", "\\,7e>!d")],
        b"",
    );
    assert_eq!(
        (r.status, r.json()["error"].clone()),
        (400, json!("invalid_query"))
    );
    // `detach` must be a boolean; the 400 says so.
    let mut body = python("print(1)");
    body["detach"] = json!("yes");
    let r = post(&d, "/execute", &alice, &body);
    assert_eq!(r.status, 400);
    assert!(r.text().contains("detach"), "{}", r.text());
    // The owner still reads it, at the wait bound exactly.
    let v = get_run(&d, &id, 60, &alice).json();
    assert_eq!(v["result"]["run"]["stdout"], "hi\n", "{v}");
    // An `after` past its events: the events with a greater id (none: it ended).
    let r = d.request(
        "GET",
        &format!("/v1/runs/{id}/events?after=99"),
        &alice,
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!r.text().contains("event:"), "{}", r.text());
    d.assert_clean();
}

#[test]
fn test_at_most_sixteen_readers_follow_one_run() {
    let d = Daemon::start();
    let id = detach(
        &d,
        &[],
        python("import time\nprint('go', flush=True)\ntime.sleep(60)"),
    );
    let path = format!("/v1/runs/{id}/events");
    let mut readers: Vec<Stream> = (0..16).map(|_| Stream::get(&d, &path, &[])).collect();
    for r in readers.iter_mut() {
        r.wait_line("go");
    }
    let r = d.request("GET", &path, &[], b"");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"], "too_many_readers");
    assert!(r.header("retry-after").is_some());
    // One leaves: there is room again (once the daemon has seen it go).
    readers.pop();
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        let s = d.send("GET", &path, &[], b"");
        let mut r = std::io::BufReader::new(s);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut r, &mut line).unwrap();
        if line.contains(" 200 ") {
            break r;
        }
        assert!(line.contains(" 429 "), "{line}");
        assert!(Instant::now() < deadline, "no room after a reader left");
        std::thread::sleep(Duration::from_millis(100));
    };
    let r = post(&d, &format!("/v1/runs/{id}/cancel"), &[], &json!({}));
    assert_eq!(r.status, 202);
    for r in readers {
        assert_eq!(r.finish()["run"]["exitCode"], 137);
    }
    drop(again);
    d.assert_clean();
}

#[test]
fn test_cancels_waits_and_odd_cursors() {
    let d = Daemon::start();
    // Cancelled at once, while its sandbox boots: cancelled, never "failed".
    let id = detach(&d, &[], python("import time\ntime.sleep(30)"));
    let r = post(&d, &format!("/v1/runs/{id}/cancel"), &[], &json!({}));
    assert_eq!(r.status, 202, "{}", r.text());
    let v = ended(&d, &id);
    assert_eq!(v["status"], "cancelled", "{v}");
    match v.get("result") {
        Some(res) => assert_eq!(res["run"]["exitCode"], 137, "{v}"),
        None => assert!(v["error"].as_str().unwrap().starts_with("cancelled"), "{v}"),
    }
    // A wait that runs out answers with the run still running, not before its time.
    let long = detach(
        &d,
        &[],
        python("import time\nprint('up', flush=True)\ntime.sleep(30)"),
    );
    let t = Instant::now();
    let v = get_run(&d, &long, 1, &[]).json();
    assert_eq!(v["status"], "running", "{v}");
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    // Two waits on one keep-alive connection: the first's deadline does not cut the
    // second short.
    let short = detach(&d, &[], python("print(1)"));
    let mut s = d.connect();
    let mut rd = std::io::BufReader::new(s.try_clone().unwrap());
    std::io::Write::write_all(
        &mut s,
        format!("GET /v1/runs/{short}?wait=2 HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let first = common::read_response(&mut rd, false).unwrap();
    assert_eq!(first.json()["status"], "done", "{}", first.text());
    let t = Instant::now();
    std::io::Write::write_all(
        &mut s,
        format!("GET /v1/runs/{long}?wait=4 HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let second = common::read_response(&mut rd, false).unwrap();
    assert_eq!(second.json()["status"], "running");
    assert!(
        t.elapsed() >= Duration::from_millis(3800),
        "answered after {:?}",
        t.elapsed()
    );
    // Cursors at the edges: 19 digits are a cursor (nothing after it), 20 are not.
    let r = d.request(
        "GET",
        &format!("/v1/runs/{short}/events?after=9999999999999999999"),
        &[],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!r.text().contains("event:"), "{}", r.text());
    let r = d.request(
        "GET",
        &format!("/v1/runs/{short}/events?after=18446744073709551615"),
        &[],
        b"",
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = post(&d, &format!("/v1/runs/{long}/cancel"), &[], &json!({}));
    assert_eq!(r.status, 202);
    assert_eq!(ended(&d, &long)["status"], "cancelled");
    d.assert_clean();
}

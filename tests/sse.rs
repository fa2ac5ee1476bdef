//! Streaming /execute over SSE, checked with a real SSE client (Python httpx-sse from
//! PyPI, installed by `make test`) and with raw sockets for framing, backpressure and
//! disconnects.

mod common;
use common::{read_response, test_python, Daemon};
use serde_json::{json, Value};
use std::io::{BufReader, Write};
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs the SSE client; returns (status line object, events).
fn sse(d: &Daemon, body: &Value, extra: &[&str]) -> (Value, Vec<Value>) {
    let out = Command::new(test_python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/sse_client.py"
        ))
        .arg(format!("http://{}/execute", d.addr))
        .arg(body.to_string())
        .args(extra)
        .output()
        .expect("run the SSE client (make test installs its venv)");
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect::<Vec<_>>();
    let head = lines.remove(0);
    (head, lines)
}

fn body(code: &str, limits: Value) -> Value {
    json!({"language": "python-slim", "network": false, "code": code, "limits": limits})
}

#[test]
fn test_spec_example_streams_three_events_with_gaps() {
    let d = Daemon::start();
    let (head, events) = sse(
        &d,
        &body(
            "import time\nfor i in range(3):\n print(i,flush=True);time.sleep(.3)",
            json!({}),
        ),
        &[],
    );
    assert_eq!(head["status"], 200);
    assert!(head["contentType"]
        .as_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let out: Vec<&Value> = events.iter().filter(|e| e["event"] == "stdout").collect();
    assert_eq!(
        out.iter()
            .map(|e| e["data"]["chunk"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["0\n", "1\n", "2\n"],
        "{events:?}"
    );
    for w in out.windows(2) {
        let gap = w[1]["t"].as_f64().unwrap() - w[0]["t"].as_f64().unwrap();
        assert!(gap > 0.2, "gap preserved: {gap}");
    }
    let done = events.last().unwrap();
    assert_eq!(done["event"], "done");
    // `done` is exactly the non-streaming response.
    assert_eq!(done["data"]["run"]["stdout"], "0\n1\n2\n");
    assert_eq!(done["data"]["run"]["exitCode"], 0);
    let keys: Vec<&String> = done["data"].as_object().unwrap().keys().collect();
    assert_eq!(keys, vec!["backend", "language", "run", "version"]);
    let sync = d.execute(body("print('x')", json!({})));
    let sync_keys: Vec<&String> = sync["run"].as_object().unwrap().keys().collect();
    let stream_keys: Vec<&String> = done["data"]["run"].as_object().unwrap().keys().collect();
    assert_eq!(sync_keys, stream_keys);
    d.assert_clean();
    d.stop();
}

#[test]
fn test_interleaved_streams_timeout_and_utf8() {
    let d = Daemon::start();
    let (_, events) = sse(&d, &body("import sys,time\nfor i in range(3):\n print('o%d' % i, flush=True); time.sleep(.1)\n print('e%d' % i, file=sys.stderr, flush=True); time.sleep(.1)", json!({})), &[]);
    let seq: Vec<String> = events
        .iter()
        .filter(|e| e["event"] != "done")
        .map(|e| {
            format!(
                "{}:{}",
                e["event"].as_str().unwrap(),
                e["data"]["chunk"].as_str().unwrap().trim()
            )
        })
        .collect();
    assert_eq!(
        seq,
        vec![
            "stdout:o0",
            "stderr:e0",
            "stdout:o1",
            "stderr:e1",
            "stdout:o2",
            "stderr:e2"
        ]
    );
    // A run that times out ends with `done` carrying timedOut. Its wall time leaves the
    // interpreter room to start and print first on a loaded host (300 ms did not: CI
    // saw the kill come before `start`).
    let (_, events) = sse(
        &d,
        &body(
            "print('start', flush=True)\nwhile True: pass",
            json!({"wallTimeMs": 2000}),
        ),
        &[],
    );
    assert_eq!(events[0]["data"]["chunk"], "start\n", "{events:?}");
    let done = events.last().unwrap();
    assert_eq!(
        (
            done["event"].as_str(),
            done["data"]["run"]["timedOut"].as_bool(),
            done["data"]["run"]["exitCode"].as_i64()
        ),
        (Some("done"), Some(true), Some(137))
    );
    // A character split across writes is never emitted broken; invalid bytes become U+FFFD.
    let (_, events) = sse(&d, &body("import sys,time\nsys.stdout.buffer.write(b'a\\xe2\\x82'); sys.stdout.flush(); time.sleep(.3)\nsys.stdout.buffer.write(b'\\xac \\xff!\\n'); sys.stdout.flush()", json!({})), &[]);
    let chunks: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "stdout")
        .map(|e| e["data"]["chunk"].as_str().unwrap())
        .collect();
    assert_eq!(chunks.concat(), "a\u{20ac} \u{FFFD}!\n");
    assert!(
        chunks
            .iter()
            .all(|c| !c.contains('\u{FFFD}') || c.contains('!')),
        "{chunks:?}"
    );
    assert_eq!(
        chunks[0], "a",
        "the partial character waits for its last byte: {chunks:?}"
    );
    // Truncation is the same as in the buffered path.
    let (_, events) = sse(
        &d,
        &body(
            "import sys\nsys.stdout.write('x' * 100000)",
            json!({"outputBytes": 4096}),
        ),
        &[],
    );
    let streamed: usize = events
        .iter()
        .filter(|e| e["event"] == "stdout")
        .map(|e| e["data"]["chunk"].as_str().unwrap().len())
        .sum();
    assert_eq!(streamed, 4096);
    assert_eq!(events.last().unwrap()["data"]["run"]["truncated"], true);
    d.assert_clean();
    d.stop();
}

#[test]
fn test_disconnect_kills_the_run() {
    let d = Daemon::start();
    let t0 = Instant::now();
    let (_, events) = sse(
        &d,
        &body(
            "import time\nprint('first', flush=True)\ntime.sleep(30)",
            json!({"wallTimeMs": 20000}),
        ),
        &["first"],
    );
    assert_eq!(events.len(), 1);
    // The sandbox is gone and the slot free long before the 20 s wall time.
    d.assert_clean();
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let h = d.get("/healthz").json();
    assert_eq!(h["counters"]["runsCancelled"], 1);
    assert_eq!(h["inFlight"], 0);
    d.stop();
}

#[test]
fn test_query_stream_framing_keepalive_and_reuse() {
    let d = Daemon::start_with(&[("ISOBOX_SSE_KEEPALIVE_MS", "300")]);
    // `?stream=1` with no Accept header; raw bytes to check the framing itself.
    let mut s = d.connect();
    let b = body(
        "import sys, time\nsys.stdout.write('a\\nb\\n'); sys.stdout.flush()\ntime.sleep(1)",
        json!({}),
    )
    .to_string();
    write!(
        s,
        "POST /execute?stream=1 HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r, false).unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let text = resp.text();
    assert!(
        text.contains("event: stdout\ndata: {\"chunk\":\"a\\nb\\n\"}\n\n"),
        "{text}"
    );
    assert!(
        text.contains("\n: keep-alive\n\n") || text.starts_with(": keep-alive"),
        "comment keep-alive during a silent second: {text}"
    );
    assert!(text.contains("event: done\ndata: {"), "{text}");
    // The connection is reusable after the stream (chunked framing).
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut r, false).unwrap().status, 200);
    d.assert_clean();
    d.stop();
}

#[test]
fn test_slow_reader_is_bounded_by_backpressure() {
    let d = Daemon::start();
    // 2 × 256 KiB of control bytes: within the caps, but ~3 MB once JSON-escaped (\u0001).
    let code = "import sys\nfor _ in range(64):\n sys.stdout.write('\\x01' * 4096); sys.stderr.write('\\x01' * 4096)\nsys.stdout.flush(); sys.stderr.flush()";
    let b = body(code, json!({"outputBytes": 262144, "wallTimeMs": 2000}));
    // A client that reads: the program finishes at once and everything arrives.
    let (_, events) = sse(&d, &b, &[]);
    let done = &events.last().unwrap()["data"]["run"];
    assert_eq!(
        (done["timedOut"].as_bool(), done["truncated"].as_bool()),
        (Some(false), Some(false)),
        "{done}"
    );
    // A client that stops reading (4 KiB receive buffer) for 4 s, then drains: the
    // daemon queues at most 256 KiB for it beyond the kernel's socket buffer (then stops
    // reading the sandbox), its memory stays flat, and nothing is lost or reordered.
    let out = Command::new(test_python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/slow_client.py"
        ))
        .args([
            d.addr.ip().to_string(),
            d.addr.port().to_string(),
            b.to_string(),
            "4".into(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["chunkBytes"], 2 * 262144, "every queued byte arrives");
    assert_eq!(r["doneRun"]["exitCode"], 0);
    let h = d.get("/healthz").json();
    assert!(
        h["rssBytes"].as_u64().unwrap() < 64 << 20,
        "daemon memory stayed bounded: {h}"
    );
    d.assert_clean();
    d.stop();
}

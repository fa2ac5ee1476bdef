//! What a new user trips on (issue 27), driven as that user would: bodies that are not
//! objects, errors that must read as sentences, the seed document's version strings,
//! `network` at a filesystem session's create, and the limits a run actually had.

mod common;
use common::session::Session;
use common::Daemon;
use serde_json::{json, Value};

fn post(d: &Daemon, path: &str, body: &[u8]) -> (u16, Value) {
    let r = d.request("POST", path, &[("Content-Type", "application/json")], body);
    (r.status, r.json())
}

#[test]
fn test_bodies_must_be_objects_and_errors_read_as_sentences() {
    let d = Daemon::start();
    // Arrays were taken as positional structs: this ran code, and created a volume.
    for (path, body) in [
        (
            "/execute",
            &br#"["python-slim",null,"print(1)",null,null,null,null,false]"#[..],
        ),
        ("/v1/volumes", br#"["arr"]"#),
        ("/v1/sessions", br#"["python"]"#),
    ] {
        let (status, v) = post(&d, path, body);
        assert_eq!(status, 400, "{path}: {v}");
        assert_eq!(v["error"], "invalid_json", "{path}: {v}");
        assert_eq!(
            v["detail"], "the body must be a JSON object ({...}), not a list",
            "{path}"
        );
    }
    let r = d.get("/v1/volumes");
    assert_eq!(r.json()["volumes"], json!([]), "{}", r.text());
    // Nested objects too, and each message names the field in words.
    for (body, detail) in [
        (&br#""#[..], "the body is empty; send a JSON object"),
        (
            br#"{"language":"python-slim","code":"print(1)","limits":[1000]}"#,
            "limits must be an object of limits (memoryBytes, cpus, pids, outputBytes, wallTimeMs), not a list",
        ),
        (
            br#"{"language":"python-slim","code":"print(1)","limits":{"wallTimeMs":"5s"}}"#,
            "limits.wallTimeMs must be a number of milliseconds, not a string",
        ),
        (
            br#"{"language":"python-slim","files":[["a.py","print(1)"]]}"#,
            "files[0] must be an object {\"name\", \"content\", \"encoding\"}, not a list",
        ),
        (
            br#"{"language":"python-slim","files":[{"content":"print(1)"}]}"#,
            "files[0].name is required: a relative file name, a string",
        ),
        (
            br#"{"language":"python-slim","code":"print(1)","network":"no"}"#,
            "network must be true or false, not a string",
        ),
        (
            br#"{"language":"python-slim","code":"print(1)","limits":{"wallTime":5}}"#,
            "unknown field \"wallTime\" in limits; it takes memoryBytes, cpus, pids, outputBytes, wallTimeMs",
        ),
        (
            br#"{"language":"python-slim","code":"print(1)",}"#,
            "the body is not valid JSON: a comma before a closing } or ] (JSON allows no trailing comma) (line 1, column 45)",
        ),
        (
            br#"{"language":"python-slim","code":"print(1)""#,
            "the body is not valid JSON: it ends before the JSON is complete (an unclosed {, [ or value?) (line 1, column 43)",
        ),
        (
            br#"{"language":"python-slim","code":"print(1)","code":"print(2)"}"#,
            "the body is not usable: the key \"code\" appears twice in one object (line 1, column 50)",
        ),
    ] {
        let (status, v) = post(&d, "/execute", body);
        assert_eq!(
            (status, v["error"].as_str(), v["detail"].as_str()),
            (400, Some("invalid_json"), Some(detail)),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    let (status, v) = post(&d, "/v1/sessions", br#"{"runtime":"python","ttlSec":"1h"}"#);
    assert_eq!(
        (status, v["detail"].as_str()),
        (
            400,
            Some("ttlSec must be a whole number of seconds, not a string")
        )
    );
    let (status, v) = post(&d, "/v1/volumes", br#"{"name":7}"#);
    assert_eq!(
        (status, v["detail"].as_str()),
        (
            400,
            Some("name must be a name, a string of 1 to 128 bytes, not 7")
        )
    );
    // The WBX face: its own error shape, the same rules.
    let r = d.request(
        "POST",
        "/wbx/v1/sandboxes",
        &[],
        br#"{"template":"base","template":"base"}"#,
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"],
        "invalid request body: the body is not usable: the key \"template\" appears twice in one object (line 1, column 29)"
    );
    d.assert_clean();
    d.stop();
}

#[test]
fn test_seed_clients_network_at_create_and_applied_limits() {
    let d = Daemon::start();
    // A filesystem session takes `network` at create as its steps' default.
    let s = Session::create(&d, &json!({"runtime": "python-slim", "network": false}));
    let v = s.step_with(&d, &json!({"code": "print(1)"}));
    assert_eq!(v["run"]["stdout"], "1\n", "{v}");
    assert_eq!(v["run"]["network"], false, "{v}");
    assert!(v.get("warning").is_none(), "network off was asked for: {v}");
    assert_eq!(s.delete(&d).status, 204);
    // Limits are clamped, never refused, and the answer says what was applied.
    let v = d.execute(json!({
        "language": "python-slim", "code": "print(1)", "network": false,
        "limits": {"memoryBytes": 1e12, "cpus": 99, "pids": 300, "outputBytes": 1, "wallTimeMs": 1500.7}
    }));
    assert_eq!(v["run"]["stdout"], "1\n", "{v}");
    assert_eq!(
        v["run"]["limits"],
        json!({"memoryBytes": 512 << 20, "cpus": 2.0, "pids": 256, "outputBytes": 1024, "wallTimeMs": 1500}),
        "{v}"
    );
    let v = d.execute(json!({"language": "python-slim", "code": "print(1)", "network": false}));
    assert_eq!(
        v["run"]["limits"],
        json!({"memoryBytes": 256 << 20, "cpus": 1.0, "pids": 128, "outputBytes": 65536, "wallTimeMs": 10000}),
        "{v}"
    );
    d.assert_clean();
    d.stop();
}

#[test]
fn test_a_flood_of_malformed_requests_cannot_flood_the_log() {
    let d = Daemon::start();
    for _ in 0..100 {
        let rs = common::raw_exchange(d.addr, b"GARBAGE\r\n\r\n");
        assert_eq!(rs.len(), 1);
        assert_eq!(rs[0].status, 400);
    }
    // One client causes at most 5 limited lines per 10-second window (the flood may
    // straddle two windows); the rest are counted, not written.
    let lines = d.log().matches("bad request").count();
    assert!((1..=10).contains(&lines), "{lines} lines:\n{}", d.log());
    let h = d.get("/healthz").json();
    let suppressed = h["counters"]["logLinesSuppressed"].as_u64().unwrap();
    assert!(suppressed >= 90, "{h}");
    assert_eq!(d.get("/healthz").status, 200);
    d.stop();
}

//! `POST /eryx/v1/execute` and `POST /eryx/v1/sessions` bodies: `parse_execute` and
//! `parse_new_session` never panic, and what they accept is within the tenant's limits.
//!
//! The first byte picks the Content-Type (JSON, JSON with a charset, or not JSON); the
//! rest is the body. A session create must
//! accept an empty body, and give a TTL of 1 s to a day. On `Ok`: the code is the body's `code` string, the time and
//! compute-unit limits are at least 1 and never above the tenant's. On `Err`: one of
//! the statuses the document names, and a body that is exactly
//! `{"error": {"code", "message"}}` with one of its codes.
#![no_main]

use isobox::eryx::{parse_execute, parse_new_session, Limits, MAX_SESSION_TTL_SECS};
use isobox::http::{parse::parse_head, Request};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    timeout_ms: 30_000,
    fuel: 20_000_000_000,
};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let ct = match pick % 3 {
        0 => "application/json",
        1 => "Application/JSON; charset=utf-8",
        _ => "text/plain",
    };
    let head = format!("POST /v1/execute HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\n\r\n");
    let req = Request {
        head: parse_head(head.as_bytes()).expect("a valid head"),
        body: body.to_vec(),
        tenant: "t".into(),
        params: Default::default(),
    };
    check_error_or(parse_new_session(&req), |s| {
        assert!((1..=MAX_SESSION_TTL_SECS).contains(&s.ttl_secs), "{s:?}");
        // The body's string, or `python` when it names none (whether it exists is
        // the daemon's to say).
        let named = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("environment").and_then(|e| e.as_str().map(String::from)));
        assert_eq!(s.environment, named.unwrap_or_else(|| "python".into()));
        if !body.iter().all(u8::is_ascii_whitespace) {
            assert!(pick % 3 != 2, "accepted a body without a JSON content type");
        }
    });
    match parse_execute(&req, LIMITS) {
        Ok(ex) => {
            if let Some(e) = &ex.environment {
                assert!(ex.check_environment(e).is_ok(), "{ex:?}");
            }
            assert!(pick % 3 != 2, "accepted without a JSON content type");
            let v: serde_json::Value = serde_json::from_slice(body).expect("accepted non-JSON");
            assert_eq!(v["code"].as_str(), Some(ex.code.as_str()));
            assert!((1..=LIMITS.timeout_ms).contains(&ex.timeout_ms), "{ex:?}");
            assert!((1..=LIMITS.fuel).contains(&ex.fuel), "{ex:?}");
        }
        Err(resp) => check_error(&resp),
    }
});

fn check_error_or<T>(r: Result<T, isobox::http::Response>, ok: impl FnOnce(T)) {
    match r {
        Ok(t) => ok(t),
        Err(resp) => check_error(&resp),
    }
}

/// One of the statuses the document names, and exactly its error shape.
fn check_error(resp: &isobox::http::Response) {
    assert!([400, 415, 422].contains(&resp.status), "{}", resp.status);
    let v: serde_json::Value = serde_json::from_slice(&resp.body).expect("a JSON error");
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
    let e = &v["error"];
    assert_eq!(e.as_object().map(|o| o.len()), Some(2), "{v}");
    assert_eq!(e["code"], "invalid_request", "{v}");
    assert!(!e["message"].as_str().unwrap_or("").is_empty(), "{v}");
}

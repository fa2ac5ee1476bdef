//! Admission against the real daemon: API keys (both header forms, key file reloaded
//! on SIGHUP, refusal to start without keys when required), per-client rate limits that
//! spoofed headers cannot escape, the global concurrency cap and exact slot accounting,
//! and readiness following the protective slice's memory cap.

mod common;
use common::Daemon;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn exec_body() -> Value {
    json!({"language": "python-slim", "network": false, "code": "print(7)"})
}

#[test]
fn test_api_keys_both_forms_open_routes_and_no_secret_in_logs() {
    let d = Daemon::start_with(&[
        ("ISOBOX_API_KEYS", "s3cret-key-one,s3cret-key-two"),
        ("ISOBOX_REQUIRE_AUTH", "1"),
    ]);
    d.wait_ready();
    let body = exec_body().to_string();
    for (h, v) in [
        ("X-API-Key", "wrong"),
        ("Authorization", "Bearer wrong"),
        ("Authorization", "Bearer "),
        ("Authorization", "Basic s3cret-key-one"),
    ] {
        let r = d.request("POST", "/execute", &[(h, v)], body.as_bytes());
        assert_eq!(r.status, 401, "{h}: {v}");
        assert_eq!(r.json(), json!({"error": "unauthorized"}));
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    }
    let r = d.request("POST", "/execute", &[], body.as_bytes());
    assert_eq!(r.status, 401);
    assert_eq!(d.request("GET", "/runtimes", &[], b"").status, 401);
    // Optional whitespace around a header value is not part of it (RFC 9110 §5.5); a NUL
    // inside is a malformed request.
    assert_eq!(
        d.request("GET", "/runtimes", &[("X-API-Key", "s3cret-key-one ")], b"")
            .status,
        200
    );
    assert_eq!(
        d.request(
            "GET",
            "/runtimes",
            &[("X-API-Key", "s3cret-key-one\0")],
            b""
        )
        .status,
        400
    );
    assert_eq!(
        d.get("/healthz").json()["counters"]["runsTotal"],
        0,
        "no sandbox for a refused request"
    );
    // Right keys, both forms.
    let r = d.request(
        "POST",
        "/execute",
        &[("X-API-Key", "s3cret-key-one")],
        body.as_bytes(),
    );
    assert_eq!(
        (r.status, r.json()["run"]["stdout"].as_str()),
        (200, Some("7\n"))
    );
    let r = d.request(
        "POST",
        "/execute",
        &[("Authorization", "Bearer s3cret-key-two")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        d.request("GET", "/runtimes", &[("X-API-Key", "s3cret-key-two")], b"")
            .status,
        200
    );
    // Two different keys at once are ambiguous.
    let r = d.request(
        "POST",
        "/execute",
        &[
            ("X-API-Key", "s3cret-key-one"),
            ("Authorization", "Bearer s3cret-key-two"),
        ],
        body.as_bytes(),
    );
    assert_eq!(r.status, 400);
    // Health, readiness and the docs stay open.
    for p in ["/healthz", "/readyz", "/llms.txt", "/openapi.yaml"] {
        assert_eq!(d.get(p).status, 200, "{p}");
    }
    let log = d.log();
    assert!(!log.contains("s3cret"), "a key appeared in the log");
    d.assert_clean();
    d.stop();
}

#[test]
fn test_key_file_reloads_on_sighup_and_required_auth() {
    let dir = std::env::temp_dir().join(format!("isobox-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys");
    std::fs::write(&file, "first-key\n").unwrap();
    let d = Daemon::start_with(&[
        ("ISOBOX_API_KEYS_FILE", file.to_str().unwrap()),
        ("ISOBOX_REQUIRE_AUTH", "1"),
    ]);
    let get = |k: &str| {
        d.request("GET", "/runtimes", &[("X-API-Key", k)], b"")
            .status
    };
    assert_eq!((get("first-key"), get("second-key")), (200, 401));
    std::fs::write(&file, "# rotated\nsecond-key\n").unwrap();
    std::process::Command::new("kill")
        .args(["-HUP", &d.pid().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while get("second-key") != 200 {
        assert!(Instant::now() < deadline, "reload not applied");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get("first-key"), 401);
    d.stop();
    // ISOBOX_REQUIRE_AUTH=1 with no keys: refuses to start, saying why.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_isoboxd"))
        .env("ISOBOX_REQUIRE_AUTH", "1")
        .env("ISOBOX_LISTEN", "127.0.0.1:0")
        .env(
            "ISOBOX_INSTANCE",
            format!("isobox-t{}-noauth", std::process::id()),
        )
        .env("ISOBOX_DATA_DIR", dir.join("data"))
        .env_remove("ISOBOX_API_KEYS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ISOBOX_REQUIRE_AUTH=1 but no API keys"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_rate_limit_burst_retry_after_and_spoofed_headers() {
    let d = Daemon::start_with(&[("ISOBOX_RATE_PER_MIN", "60"), ("ISOBOX_RATE_BURST", "3")]);
    // Requests with no language are cheap (400, no sandbox) but still take a token.
    let cheap = |extra: &[(&str, &str)]| d.request("POST", "/execute", extra, b"{}").status;
    for _ in 0..3 {
        assert_eq!(cheap(&[]), 400);
    }
    let r = d.request("POST", "/execute", &[], b"{}");
    assert_eq!(r.status, 429);
    assert_eq!(r.json(), json!({"error": "rate_limited"}));
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(wait, 1, "one token per second");
    // A spoofed header never buys a fresh bucket.
    for (h, v) in [
        ("X-Forwarded-For", "1.2.3.4"),
        ("X-Real-IP", "1.2.3.5"),
        ("True-Client-IP", "1.2.3.6"),
        ("Forwarded", "for=1.2.3.7"),
    ] {
        assert_eq!(cheap(&[(h, v)]), 429, "{h}");
    }
    // Waiting Retry-After admits the next request.
    std::thread::sleep(Duration::from_millis(wait * 1000 + 50));
    assert_eq!(cheap(&[]), 400);
    // Other routes are not rate limited.
    for _ in 0..20 {
        assert_eq!(d.get("/runtimes").status, 200);
    }
    d.stop();
}

#[test]
fn test_trusted_proxy_forwarded_for_separates_clients() {
    let d = Daemon::start_with(&[
        ("ISOBOX_RATE_PER_MIN", "1"),
        ("ISOBOX_RATE_BURST", "2"),
        ("ISOBOX_TRUSTED_PROXIES", "127.0.0.0/8"),
    ]);
    let st = |xff: &str| {
        d.request("POST", "/execute", &[("X-Forwarded-For", xff)], b"{}")
            .status
    };
    assert_eq!(
        (st("203.0.113.1"), st("203.0.113.1"), st("203.0.113.1")),
        (400, 400, 429)
    );
    assert_eq!(
        st("203.0.113.2"),
        400,
        "another client behind the proxy has its own bucket"
    );
    // The right-most untrusted entry counts: a client cannot prepend its way out.
    assert_eq!(st("198.51.100.9, 203.0.113.1"), 429);
    d.stop();
}

#[test]
fn test_capacity_and_exact_slot_accounting() {
    let d = Daemon::start_with(&[
        ("ISOBOX_RATE_PER_MIN", "100000"),
        ("ISOBOX_RATE_BURST", "1000"),
    ]);
    d.wait_ready();
    // 4 long runs hold the 4 default slots; the fifth gets 429 capacity at once, and is
    // admitted after one finishes.
    std::thread::scope(|s| {
        let long: Vec<_> = (0..4)
            .map(|i| {
                let d = &d;
                s.spawn(move || d.execute(json!({"language": "python-slim", "network": false, "code": format!("import time\ntime.sleep({})\nprint('ok')", 2 + i)})))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(15);
        while d.get("/healthz").json()["inFlight"] != 4 {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(20));
        }
        let r = d.post_json("/execute", &exec_body());
        assert_eq!(r.status, 429);
        assert_eq!(
            r.json(),
            json!({"error": "capacity", "detail": "no free execution slot"})
        );
        assert!(r.header("retry-after").is_some());
        while d.get("/healthz").json()["inFlight"] == 4 {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(d.execute(exec_body())["run"]["stdout"], "7\n");
        for h in long {
            assert_eq!(h.join().unwrap()["run"]["stdout"], "ok\n");
        }
    });
    // 100 runs mixing successes, errors, timeouts, OOMs and client disconnects: every
    // slot comes back.
    std::thread::scope(|s| {
        for w in 0..4 {
            let d = &d;
            s.spawn(move || {
                for i in 0..25 {
                    let kind = (w * 25 + i) % 5;
                    let (code, limits) = match kind {
                        0 => ("print(1)", json!({})),
                        1 => ("raise SystemExit(3)", json!({})),
                        2 => ("while True: pass", json!({"wallTimeMs": 100})),
                        3 => ("b = bytearray(1 << 30)", json!({"memoryBytes": 33554432})),
                        _ => ("import time\ntime.sleep(30)", json!({})),
                    };
                    let body = json!({"language": "python-slim", "network": false, "code": code, "limits": limits}).to_string();
                    if kind == 4 {
                        // Disconnect mid-run.
                        use std::io::Write;
                        let mut s = d.connect();
                        write!(s, "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
                        std::thread::sleep(Duration::from_millis(300));
                        drop(s);
                        continue;
                    }
                    loop {
                        let r = d.request("POST", "/execute", &[], body.as_bytes());
                        if r.status == 429 {
                            std::thread::sleep(Duration::from_millis(100));
                            continue;
                        }
                        assert_eq!(r.status, 200, "{}", r.text());
                        let run = &r.json()["run"];
                        match kind {
                            0 => assert_eq!(run["stdout"], "1\n"),
                            1 => assert_eq!(run["exitCode"], 3),
                            2 => assert_eq!(run["timedOut"], true),
                            3 => assert_eq!(run["oomKilled"], true),
                            _ => {}
                        }
                        break;
                    }
                }
            });
        }
    });
    d.assert_clean();
    let h = d.get("/healthz").json();
    assert_eq!(h["inFlight"], 0);
    let c = &h["counters"];
    assert_eq!(c["runsTimedOut"], 20, "{h}");
    assert_eq!(c["runsOomKilled"], 20, "{h}");
    assert!(c["runsCancelled"].as_u64().unwrap() <= 20, "{h}");
    d.stop();
}

#[test]
fn test_readiness_follows_the_slice_cap() {
    let d = Daemon::start();
    d.wait_ready();
    let file = std::path::Path::new("/sys/fs/cgroup/memory")
        .join(&d.instance)
        .join("memory.limit_in_bytes");
    let v2 = std::path::Path::new("/sys/fs/cgroup")
        .join(&d.instance)
        .join("memory.max");
    let (path, unlimited) = if file.exists() {
        (file, "-1")
    } else {
        (v2, "max")
    };
    let cap = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, unlimited).unwrap();
    let r = d.get("/readyz");
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["ready"], false);
    assert!(
        r.json()["reason"]
            .as_str()
            .unwrap()
            .contains("no memory cap"),
        "{}",
        r.text()
    );
    std::fs::write(&path, cap.trim()).unwrap();
    assert_eq!(d.get("/readyz").status, 200);
    d.stop();
}

/// The public demo's setup (the spec): with keys configured and
/// `ISOBOX_MEMORY_REQUIRE_KEY=1`, only memory and volumes need a key; a request without
/// one elsewhere is the shared public tenant; a key that is presented must be valid;
/// `ISOBOX_MEMORY_REQUIRE_KEY=1` without keys refuses to start. (Without that flag, keys
/// are required everywhere: the tests above.)
#[test]
fn test_memory_only_keys_demo_mode() {
    let d = Daemon::start_with(&[
        ("ISOBOX_API_KEYS", "opt-key-one"),
        ("ISOBOX_MEMORY_REQUIRE_KEY", "1"),
    ]);
    d.wait_ready();
    assert!(
        d.log()
            .contains("required on /v1/memory and /v1/volumes only"),
        "{}",
        d.log()
    );
    assert_eq!(d.request("GET", "/runtimes", &[], b"").status, 200);
    let r = d.request("POST", "/execute", &[], exec_body().to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        d.request("GET", "/runtimes", &[("X-API-Key", "opt-key-one")], b"")
            .status,
        200
    );
    let r = d.request("GET", "/runtimes", &[("X-API-Key", "not-a-key")], b"");
    assert_eq!(
        r.status, 401,
        "a wrong key never falls back to the public tenant"
    );
    // Memory needs the key; sessions stay open.
    assert_eq!(
        d.request(
            "PUT",
            "/v1/memory/t/k",
            &[("X-API-Key", "opt-key-one")],
            b"keyed"
        )
        .status,
        204
    );
    assert_eq!(d.request("GET", "/v1/memory/t/k", &[], b"").status, 401);
    assert_eq!(d.request("GET", "/v1/volumes", &[], b"").status, 401);
    let r = d.request("POST", "/v1/sessions", &[], br#"{"runtime":"python-slim"}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    d.stop();
    let dir = std::env::temp_dir().join(format!("isobox-t{}-memkey", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_isoboxd"))
        .env("ISOBOX_MEMORY_REQUIRE_KEY", "1")
        .env("ISOBOX_LISTEN", "127.0.0.1:0")
        .env(
            "ISOBOX_INSTANCE",
            format!("isobox-t{}-memkey", std::process::id()),
        )
        .env("ISOBOX_DATA_DIR", &dir)
        .env_remove("ISOBOX_API_KEYS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("ISOBOX_MEMORY_REQUIRE_KEY=1 but no API keys"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

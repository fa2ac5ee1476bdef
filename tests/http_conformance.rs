//! HTTP/1.1 conformance of the real daemon over raw TCP: keep-alive, pipelining,
//! chunked bodies, 100-continue, HEAD, every limit just below and just above its bound,
//! malformed input, byte-by-byte splits, timeouts and the connection cap. After each bad
//! request the daemon must answer the next client normally.

mod common;
use common::{closed_within, raw_exchange, read_response, Daemon};
use std::io::{BufReader, Write};
use std::time::{Duration, Instant};

fn healthy(d: &Daemon) {
    let r = d.get("/healthz");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "ok");
}

#[test]
fn test_keepalive_pipelining_and_split_writes() {
    let d = Daemon::start();
    // Three requests in one write, answered in order on one connection.
    let mut s = d.connect();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /runtimes HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let a = read_response(&mut r, false).unwrap();
    let b = read_response(&mut r, false).unwrap();
    let c = read_response(&mut r, false).unwrap();
    assert_eq!((a.status, b.status, c.status), (200, 200, 404));
    assert_eq!(a.json()["status"], "ok");
    assert!(b.json().is_array());
    assert_eq!(c.json(), serde_json::json!({"error": "not_found"}));
    assert_eq!(a.header("connection"), Some("keep-alive"));
    // The same connection keeps serving.
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut r, false).unwrap().status, 200);

    // One request split byte by byte across writes.
    let mut s = d.connect();
    let req = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    for b in req.iter() {
        s.write_all(&[*b]).unwrap();
        s.flush().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let r = read_response(&mut BufReader::new(s), false).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));

    // Leading empty lines are ignored; bare LF parses like CRLF.
    let rs = raw_exchange(d.addr, b"\r\n\r\nGET /healthz HTTP/1.1\nHost: x\n\n");
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].status, 200);
    healthy(&d);
    d.stop();
}

#[test]
fn test_chunked_bodies_expect_continue_head_and_get_body() {
    let d = Daemon::start();
    // Chunked body, decoded: the handler sees the JSON and answers language_required.
    let rs = raw_exchange(d.addr, b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\n{\"cod\r\n7\r\ne\":\"1\"}\r\n0\r\nX-Trailer: y\r\n\r\n");
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].status, 400);
    assert_eq!(
        rs[0].json(),
        serde_json::json!({"error": "language_required"})
    );

    // Expect: 100-continue: interim 100, then the final answer after the body.
    let mut s = d.connect();
    let body = br#"{"language":"cobol","code":"x"}"#;
    write!(
        s,
        "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut r, &mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 100 Continue"), "{line}");
    let mut blank = String::new();
    std::io::BufRead::read_line(&mut r, &mut blank).unwrap();
    s.write_all(body).unwrap();
    let resp = read_response(&mut r, false).unwrap();
    assert_eq!(resp.status, 400);
    assert_eq!(
        resp.json(),
        serde_json::json!({"error":"unknown_language","detail":"\"cobol\" is not a known runtime; see GET /runtimes"})
    );

    // Expect: 100-continue with a body over the cap: refused before any 100.
    let mut s = d.connect();
    write!(
        s,
        "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        256 * 1024 + 1
    )
    .unwrap();
    let resp = read_response(&mut BufReader::new(s), false).unwrap();
    assert_eq!(resp.status, 400);
    assert_eq!(resp.json()["error"], "invalid_json");

    // HEAD: headers with the GET's length, no body bytes; the connection stays in sync.
    let mut s = d.connect();
    s.write_all(
        b"HEAD /llms.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let h = read_response(&mut r, true).unwrap();
    assert_eq!(h.status, 200);
    let len: usize = h.header("content-length").unwrap().parse().unwrap();
    assert!(len > 100);
    assert_eq!(read_response(&mut r, false).unwrap().status, 200);

    // A GET with a body: the body is consumed, the next request parses cleanly.
    let rs = raw_exchange(d.addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(rs.len(), 2);
    assert_eq!(rs[0].status, 200);
    assert!(rs[1].status == 200 || rs[1].status == 503);
    assert!(rs[1].json().get("ready").is_some());
    d.stop();
}

#[test]
fn test_limits_just_below_and_above() {
    let d = Daemon::start();
    // Head: 16 KiB is accepted, one byte more is 431.
    let head_with = |total: usize| {
        let base = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: \r\n\r\n";
        format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(total - base.len())
        )
    };
    let at = raw_exchange(d.addr, head_with(16 * 1024).as_bytes());
    assert_eq!(at[0].status, 200);
    let over = raw_exchange(d.addr, head_with(16 * 1024 + 1).as_bytes());
    assert_eq!(over.len(), 1);
    assert_eq!(over[0].status, 431);
    assert_eq!(over[0].json()["error"], "header_too_large");
    // The limit holds across read boundaries (no terminator ever sent).
    let mut s = d.connect();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX: ").unwrap();
    s.write_all(&vec![b'a'; 7000]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    s.write_all(&vec![b'a'; 12000]).unwrap();
    let r = read_response(&mut BufReader::new(s), false).unwrap();
    assert_eq!(r.status, 431);

    // /execute body: exactly 256 KiB is read and parsed; one byte more is invalid_json.
    let body_of = |size: usize| {
        let base = r#"{"language":"cobol","code":""}"#;
        format!(
            r#"{{"language":"cobol","code":"{}"}}"#,
            "x".repeat(size - base.len())
        )
    };
    let at = d.request("POST", "/execute", &[], body_of(256 * 1024).as_bytes());
    assert_eq!(at.status, 400);
    assert_eq!(
        at.json()["error"],
        "unknown_language",
        "a 256 KiB body is accepted"
    );
    let over = d.request("POST", "/execute", &[], body_of(256 * 1024 + 1).as_bytes());
    assert_eq!(over.status, 400);
    assert_eq!(over.json()["error"], "invalid_json");
    assert!(over.json()["detail"].as_str().unwrap().contains("256 KiB"));
    // Chunked over the cap: the same answer.
    let mut chunked =
        b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let big = body_of(256 * 1024 + 1);
    chunked.extend_from_slice(format!("{:x}\r\n", big.len()).as_bytes());
    chunked.extend_from_slice(big.as_bytes());
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let rs = raw_exchange(d.addr, &chunked);
    assert_eq!(rs[0].status, 400);
    assert_eq!(rs[0].json()["error"], "invalid_json");

    // Other routes: 64 KiB is fine, more is 413.
    let ok = d.request("GET", "/healthz", &[], &vec![b'a'; 64 * 1024]);
    assert_eq!(ok.status, 200);
    let big = d.request("GET", "/healthz", &[], &vec![b'a'; 64 * 1024 + 1]);
    assert_eq!(big.status, 413);
    assert_eq!(big.json()["error"], "payload_too_large");

    // URI: 8 KiB fine (404), longer is 414.
    let rs = raw_exchange(
        d.addr,
        format!(
            "GET /{} HTTP/1.1\r\nHost: x\r\n\r\n",
            "a".repeat(8 * 1024 - 1)
        )
        .as_bytes(),
    );
    assert_eq!(rs[0].status, 404);
    let rs = raw_exchange(
        d.addr,
        format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(8 * 1024)).as_bytes(),
    );
    assert_eq!(rs[0].status, 414);

    // 100 header fields are fine, 101 are 431.
    let many = |n: usize| {
        let mut s = String::from("GET /healthz HTTP/1.1\r\nHost: x\r\n");
        for i in 0..n - 1 {
            s.push_str(&format!("X-{i}: 1\r\n"));
        }
        s + "\r\n"
    };
    assert_eq!(raw_exchange(d.addr, many(100).as_bytes())[0].status, 200);
    assert_eq!(raw_exchange(d.addr, many(101).as_bytes())[0].status, 431);
    healthy(&d);
    d.stop();
}

#[test]
fn test_malformed_requests_get_errors_and_daemon_keeps_serving() {
    let d = Daemon::start();
    let cases: &[(&[u8], u16)] = &[
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n", 505),
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400),
        (b"GET http://evil/ HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"CONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX\xff: 1\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n", 400),
        (b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello", 400),
        (b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n", 400),
        (b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 400),
        (b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\nhello!", 400),
        (b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n", 400),
        (b"POST /execute HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        (b"POST /execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nf0000000000000003\r\nabc\r\n0\r\n\r\nGET /sneaky HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n", 417),
        (b"get /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 405),
    ];
    for (bytes, status) in cases {
        let rs = raw_exchange(d.addr, bytes);
        assert_eq!(
            rs.len(),
            1,
            "exactly one response to {:?}",
            String::from_utf8_lossy(bytes)
        );
        assert_eq!(
            rs[0].status,
            *status,
            "{:?}: {}",
            String::from_utf8_lossy(bytes),
            rs[0].text()
        );
        let j = rs[0].json();
        assert!(
            j["error"].is_string(),
            "JSON error body for {:?}",
            String::from_utf8_lossy(bytes)
        );
        healthy(&d);
    }
    // Request smuggling: CL + TE is refused, the connection closed, the smuggled GET
    // never answered.
    let rs = raw_exchange(d.addr, b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].status, 400);
    assert_eq!(rs[0].header("connection"), Some("close"));
    // A valid request followed by garbage: one 200, then one 400, then close.
    let rs = raw_exchange(
        d.addr,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\r\n\r\n",
    );
    assert_eq!(
        rs.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![200, 400]
    );

    // Unknown path and wrong method.
    let r = d.get("/nope");
    assert_eq!(
        (r.status, r.json()),
        (404, serde_json::json!({"error": "not_found"}))
    );
    let r = d.get("/execute");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    assert_eq!(r.json()["error"], "method_not_allowed");
    let r = d.request("DELETE", "/healthz", &[], b"");
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    healthy(&d);
    d.stop();
}

#[test]
fn test_timeouts_and_connection_cap() {
    let d = Daemon::start_with(&[
        ("ISOBOX_HEAD_TIMEOUT_MS", "600"),
        ("ISOBOX_IDLE_TIMEOUT_MS", "800"),
        ("ISOBOX_MAX_CONNECTIONS", "4"),
    ]);
    // Slowloris: a head trickled a byte at a time is cut at the total deadline, not reset
    // by each byte.
    let mut s = d.connect();
    let t0 = Instant::now();
    let mut closed = false;
    for b in
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            .iter()
    {
        if s.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        if t0.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    assert!(
        closed || closed_within(&mut s, Duration::from_secs(2)),
        "slow head not cut"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "cut at the head deadline: {:?}",
        t0.elapsed()
    );

    // Idle keep-alive connection is closed after the idle timeout, not before.
    let mut s = d.connect();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r, false).unwrap().status, 200);
    assert!(
        !closed_within(&mut s, Duration::from_millis(300)),
        "closed too early"
    );
    assert!(
        closed_within(&mut s, Duration::from_secs(3)),
        "idle connection not closed"
    );

    // Connection cap: 4 open, the 5th is refused with 503 and closed; after closing one,
    // a new client is served.
    let held: Vec<_> = (0..4).map(|_| d.connect()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut fifth = d.connect();
    let r = read_response(&mut BufReader::new(fifth.try_clone().unwrap()), false).unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"], "unavailable");
    assert!(closed_within(&mut fifth, Duration::from_secs(2)));
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    healthy(&d);
    d.stop();
}

#[test]
fn test_health_readiness_runtimes_and_docs() {
    let d = Daemon::start();
    d.wait_ready();
    let h = d.get("/healthz");
    assert_eq!(h.header("content-type"), Some("application/json"));
    let j = h.json();
    assert_eq!(j["status"], "ok");
    assert!(j["version"].is_string());
    let r = d.get("/readyz");
    assert_eq!(r.status, 200);
    // The suite's daemons run with ISOBOX_EGRESS=off (tests/common).
    assert_eq!(
        r.json(),
        serde_json::json!({"ready": true, "backend": "gvisor", "egress": {"state": "off"}})
    );
    assert_eq!(j["egress"], serde_json::json!({"state": "off"}));
    let rt = d.get("/runtimes").json();
    let list = rt.as_array().unwrap();
    assert!(!list.is_empty(), "at least one runtime is installed");
    for r in list {
        assert_eq!(r["backend"], "gvisor");
        assert!(r["version"].as_str().is_some_and(|v| !v.is_empty()));
        assert!(r["aliases"].is_array());
        assert!(r["compiled"].is_boolean());
    }
    let llms = d.get("/llms.txt");
    assert!(llms
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    assert!(llms.text().starts_with("# isobox"));
    let oa = d.get("/openapi.yaml");
    assert_eq!(oa.header("content-type"), Some("application/yaml"));
    assert!(oa.text().starts_with("openapi: 3.1"));
    d.stop();
}

/// A client that reads a result slowly but steadily is never cut off: the idle
/// (write-stall) timeout counts from the last byte it took, not from the response's
/// start. A ~280 KB result is read through a 4 KiB receive buffer at ~64 KB/s with a 1 s
/// idle timeout, so its last 128 KiB window alone takes ~2 s; it must arrive whole.
#[test]
fn test_slow_steady_reader_gets_the_whole_result() {
    use std::os::fd::FromRawFd;
    let d = Daemon::start_with(&[("ISOBOX_IDLE_TIMEOUT_MS", "1000")]);
    let body = serde_json::json!({
        "language": "python-slim", "network": false,
        "code": "import sys\nsys.stdout.write('x'*140000); sys.stderr.write('y'*140000)",
        "limits": {"outputBytes": 262144}
    })
    .to_string();
    // A small receive buffer, set before connecting so the window stays small.
    let addr = match d.addr {
        std::net::SocketAddr::V4(a) => a,
        other => panic!("IPv4 expected: {other}"),
    };
    // SAFETY: plain socket calls on a fresh fd, owned by the TcpStream afterwards.
    let mut s = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let size: libc::c_int = 4096;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: addr.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*addr.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let r = libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
        std::net::TcpStream::from_raw_fd(fd)
    };
    write!(
        s,
        "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 8 * 1024];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    loop {
        // 8 KiB per 125 ms: ~64 KB/s, never pausing for a whole second.
        std::thread::sleep(Duration::from_millis(125));
        match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("read after {} bytes: {e}", got.len()),
        }
    }
    let took = t0.elapsed();
    let text = String::from_utf8_lossy(&got);
    let (head, json) = text.split_once("\r\n\r\n").expect("a response head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("Content-Length")
        .parse()
        .unwrap();
    assert_eq!(
        json.len(),
        len,
        "cut off after {} of {len} body bytes ({took:?})",
        json.len()
    );
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(v["run"]["stdout"].as_str().unwrap().len(), 140_000);
    assert_eq!(v["run"]["stderr"].as_str().unwrap().len(), 140_000);
    assert!(
        took > Duration::from_millis(2000),
        "read too fast to test: {took:?}"
    );
    healthy(&d);
}

/// Issue 26, item 6: a body trickled just faster than the idle deadline (one byte per
/// 0.5 s against a 1 s head timeout) used to keep its connection forever, each byte
/// restarting the deadline. A body must average 1 KiB/s beyond its first head
/// timeout: the trickle gets 408 within about a second of that; a slow but steady
/// body (4 KiB/s, longer than the timeout) and a pause shorter than it are served. The
/// same for uploads (a session file, a long-lived sandbox's file).
#[test]
fn test_a_trickled_body_gets_408_and_a_steady_one_is_served() {
    let d = Daemon::start_with(&[("ISOBOX_HEAD_TIMEOUT_MS", "1000")]);
    d.wait_ready();
    // Returns the status and when it came, trickling `total` bytes of `head`'s body
    // `per` bytes at a time every `every`, for at most 8 s.
    let trickle = |head: String, total: usize, per: usize, every: Duration| -> (u16, Duration) {
        let mut s = d.connect();
        s.write_all(head.as_bytes()).unwrap();
        let t0 = Instant::now();
        let mut sent = 0;
        while sent < total && t0.elapsed() < Duration::from_secs(8) {
            let n = per.min(total - sent);
            if s.write_all(&vec![b' '; n]).is_err() {
                break;
            }
            sent += n;
            std::thread::sleep(every);
            // A 408 may already be waiting: stop sending once the server answered.
            s.set_nonblocking(true).unwrap();
            let mut peek = [0u8; 1];
            let answered = matches!(s.peek(&mut peek), Ok(n) if n > 0);
            s.set_nonblocking(false).unwrap();
            if answered {
                break;
            }
        }
        let r = read_response(&mut BufReader::new(s), false).expect("an answer");
        (r.status, t0.elapsed())
    };
    let post = |path: &str, len: usize| {
        format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n")
    };
    // The trickle: 1 byte per 500 ms, never idle for the 1 s timeout.
    let (status, at) = trickle(post("/execute", 100), 100, 1, Duration::from_millis(500));
    assert_eq!(status, 408, "after {at:?}");
    assert!(
        at < Duration::from_secs(4),
        "cut by the rate, not by a total: {at:?}"
    );
    // Steady 4 KiB/s for 3 s (well over the head timeout): served (an /execute body of
    // blanks is refused as JSON, 400, not as time).
    let (status, at) = trickle(
        post("/execute", 12 * 1024),
        12 * 1024,
        1024,
        Duration::from_millis(250),
    );
    assert_eq!(status, 400, "after {at:?}");
    assert!(at >= Duration::from_secs(2), "{at:?}");
    // Uploads: a session file and a long-lived sandbox's file, trickled.
    let s = d.request("POST", "/v1/sessions", &[], br#"{"runtime":"python-slim"}"#);
    assert_eq!(s.status, 201, "{}", s.text());
    let v = s.json();
    let (id, token) = (v["id"].as_str().unwrap(), v["token"].as_str().unwrap());
    let head = format!(
        "PUT /v1/sessions/{id}/fs?path=slow.txt HTTP/1.1\r\nHost: x\r\nX-Session-Token: {token}\r\nContent-Length: 100\r\n\r\n"
    );
    let (status, at) = trickle(head, 100, 1, Duration::from_millis(500));
    assert_eq!(status, 408, "session upload after {at:?}");
    let sb = d.request("POST", "/wbx/v1/sandboxes", &[], b"{}");
    assert_eq!(sb.status, 201, "{}", sb.text());
    let sid = sb.json()["id"].as_str().unwrap().to_string();
    let head = format!("PUT /wbx/v1/sandboxes/{sid}/files?path=slow.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n");
    let (status, at) = trickle(head, 100, 1, Duration::from_millis(500));
    assert_eq!(status, 408, "sandbox upload after {at:?}");
    assert_eq!(
        d.request("DELETE", &format!("/wbx/v1/sandboxes/{sid}"), &[], b"")
            .status,
        204
    );
    assert_eq!(
        d.request(
            "DELETE",
            &format!("/v1/sessions/{id}"),
            &[("X-Session-Token", token)],
            b""
        )
        .status,
        204
    );
}

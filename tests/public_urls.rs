//! Public URLs of long-lived sandboxes (`GET /wbx/v1/sandboxes/{id}/url?port=` and the
//! proxy behind `<port>-<id>.<domain>`), against the real daemon with real runsc and
//! its own network namespace (egress on, as in production): apps started in a sandbox
//! reached the way a browser or a program would, with the header and with the cookie
//! flow, a WebSocket echo through the proxy, and everything that must not be reachable.

mod common;
#[path = "common/fakenet.rs"]
mod fakenet;

use common::{read_response, Daemon, Resp};
use fakenet::{FakeNet, DNS};
use serde_json::{json, Value};
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// An app for the tests: echoes each request as JSON (its method, path, headers and
/// the body's length and SHA-256; chunked request bodies decoded), answers `/chunked`
/// in chunks, `/big?n=` with n bytes, and echoes WebSocket text frames.
const APP: &str = r#"
import base64, hashlib, json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def reply(self, body):
        heads = {}
        for k, v in self.headers.items():
            heads.setdefault(k.lower(), []).append(v)
        out = json.dumps({"method": self.command, "path": self.path, "headers": heads,
                          "body_len": len(body),
                          "body_sha256": hashlib.sha256(body).hexdigest()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("Set-Cookie", "app_session=xyz; Path=/")
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        if self.path.startswith("/chunked"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"one,", b"two,", b"three"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path.startswith("/big"):
            n = int(self.path.split("n=")[1])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            chunk = bytes(range(256)) * 256
            while n > 0:
                self.wfile.write(chunk[:n])
                n -= min(n, len(chunk))
            return
        self.reply(b"")

    def do_POST(self):
        self.reply(self.body())

    do_PUT = do_POST

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while True:
            h = self.rfile.read(2)
            if len(h) < 2:
                return
            op, n = h[0] & 0x0F, h[1] & 0x7F
            if n == 126:
                n = int.from_bytes(self.rfile.read(2), "big")
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if op == 8:
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            reply = b"echo: " + data
            self.wfile.write(bytes([0x81, len(reply)]) + reply)
            self.wfile.flush()

ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"#;

fn wbx(d: &Daemon, method: &str, path: &str, body: Option<&Value>) -> Resp {
    let b = body.map(|b| b.to_string()).unwrap_or_default();
    d.request(
        method,
        &format!("/wbx{path}"),
        &[("Content-Type", "application/json")],
        b.as_bytes(),
    )
}

fn create(d: &Daemon, body: &Value) -> String {
    let r = wbx(d, "POST", "/v1/sandboxes", Some(body));
    assert_eq!(r.status, 201, "{}\nlog:\n{}", r.text(), d.log());
    r.json()["id"].as_str().unwrap().to_string()
}

fn exec(d: &Daemon, id: &str, cmd: &str) -> Value {
    let r = wbx(
        d,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(&json!({ "cmd": cmd })),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Starts [`APP`] in sandbox `id`, listening on `addr`:`port`, in the background.
fn start_app(d: &Daemon, id: &str, addr: &str, port: u16) {
    let r = d.request(
        "PUT",
        &format!("/wbx/v1/sandboxes/{id}/files?path=/home/user/app.py"),
        &[],
        APP.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    exec(
        d,
        id,
        &format!("nohup python3 /home/user/app.py {addr} {port} >/tmp/app-{port}.log 2>&1 &"),
    );
}

/// The error message of a WBX error (checking the shape `{"error": "..."}`).
fn err(r: &Resp) -> String {
    let v = r.json();
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
    v["error"].as_str().expect("a message").to_string()
}

/// Writes one raw request to the daemon (from its namespace) and reads the answer.
#[track_caller]
fn raw(d: &Daemon, s: &mut TcpStream, req: &[u8], head_only: bool) -> Resp {
    s.write_all(req).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    match read_response(&mut r, head_only) {
        Some(r) => r,
        // At the caller's line (track_caller): which request had none.
        None => panic!("no answer; log:\n{}", d.log()),
    }
}

/// A request to a public host on a fresh connection, `Connection: close`.
#[track_caller]
fn get(d: &Daemon, host: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    raw(d, &mut d.connect(), req.as_bytes(), false)
}

/// The host part of a URL (`http://HOST/…`).
fn host_of(url: &str) -> String {
    url.strip_prefix("http://")
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("an http URL: {url}"))
        .to_string()
}

/// Polls `host` until it answers 200 (the app is up).
fn wait_up(d: &Daemon, host: &str, token: &str) {
    let t0 = Instant::now();
    loop {
        let r = get(d, host, "/", &[("X-WBX-Token", token)]);
        if r.status == 200 {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{host} never came up: {} {}\nlog:\n{}",
            r.status,
            r.text(),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn test_apps_behind_public_urls_header_cookie_websocket_and_isolation() {
    let fake = FakeNet::new();
    let d = Daemon::start_in_netns(
        &fake.harness,
        &[
            ("ISOBOX_NET_DNS", DNS),
            ("ISOBOX_HEAD_TIMEOUT_MS", "2000"),
            ("ISOBOX_IDLE_TIMEOUT_MS", "15000"),
        ],
    );
    d.wait_ready();
    let a = create(&d, &json!({"template": "base"}));
    let b = create(&d, &json!({}));

    // The URL, as the document shows it: one token per sandbox, the same on every call.
    let r = wbx(&d, "GET", &format!("/v1/sandboxes/{a}/url?port=8000"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    let u = r.json();
    let keys: Vec<&String> = u.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["token", "url", "url_with_token"], "{u}");
    let (url, token) = (u["url"].as_str().unwrap(), u["token"].as_str().unwrap());
    let hex = a.strip_prefix("sb_").unwrap();
    assert_eq!(
        url,
        format!("http://8000-sb-{hex}.localhost:{}/", d.addr.port()),
        "<port>-<id>.localhost:<daemon port>, no DNS needed"
    );
    assert_eq!(u["url_with_token"], format!("{url}?wbx_token={token}"));
    assert!(
        token.len() >= 43
            && token
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'),
        "{token}"
    );
    let again = wbx(&d, "GET", &format!("/v1/sandboxes/{a}/url?port=8001"), None).json();
    assert_eq!(again["token"], token, "one token per sandbox");
    let tb = wbx(&d, "GET", &format!("/v1/sandboxes/{b}/url?port=8000"), None).json();
    assert_ne!(tb["token"], token, "each sandbox has its own");
    assert!(!d.log().contains(token), "the token is never logged");
    // Bad ports and unknown sandboxes.
    for (q, want) in [
        ("", "port: required"),
        ("?port=0", "port: must be a port number from 1 to 65535"),
        ("?port=65536", "port: must be a port number from 1 to 65535"),
        ("?port=http", "port: must be a port number from 1 to 65535"),
    ] {
        let r = wbx(&d, "GET", &format!("/v1/sandboxes/{a}/url{q}"), None);
        assert_eq!(r.status, 400, "{q}: {}", r.text());
        assert!(err(&r).contains(want), "{q}: {}", r.text());
    }
    let r = wbx(
        &d,
        "GET",
        "/v1/sandboxes/sb_000000000000000000000000/url?port=80",
        None,
    );
    assert_eq!(r.status, 404, "{}", r.text());
    let none = create(&d, &json!({"network": {"mode": "none"}}));
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/sandboxes/{none}/url?port=8000"),
        None,
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(err(&r).contains("network.mode none"), "{}", r.text());

    // The document's own example: python3 -m http.server started in the background.
    exec(
        &d,
        &a,
        "mkdir -p /home/user/site && echo 'hello from the sandbox' > /home/user/site/hello.txt",
    );
    exec(
        &d,
        &a,
        "cd /home/user/site && nohup python3 -m http.server 8000 >/tmp/srv.log 2>&1 &",
    );
    start_app(&d, &a, "0.0.0.0", 8001);
    start_app(&d, &a, "127.0.0.1", 8002);
    let host = host_of(url);
    wait_up(&d, &host, token);
    // Each app is its own process: the one on 8001 may still be importing when
    // the http.server on 8000 already answers.
    wait_up(&d, &host.replacen("8000-", "8001-", 1), token);

    // With the header.
    let r = get(&d, &host, "/hello.txt", &[("X-WBX-Token", token)]);
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "hello from the sandbox\n")
    );
    // Without it, or with a wrong one, or another sandbox's: an error page, no app.
    for t in [None, Some("wrong"), Some(tb["token"].as_str().unwrap())] {
        let h: Vec<(&str, &str)> = t.map(|t| ("X-WBX-Token", t)).into_iter().collect();
        let r = get(&d, &host, "/hello.txt", &h);
        assert_eq!(r.status, 401, "{t:?}: {}", r.text());
        assert!(r.header("content-type").unwrap().starts_with("text/html"));
        assert!(
            r.text().contains("token") && !r.text().contains("hello from"),
            "{}",
            r.text()
        );
    }
    // The cookie flow: the token moves into a cookie for this host and out of the URL.
    let r = get(
        &d,
        &host,
        &format!("/hello.txt?x=1&wbx_token={token}&y=2"),
        &[],
    );
    assert_eq!(r.status, 302, "{}", r.text());
    assert_eq!(
        r.header("location"),
        Some(format!("http://{host}/hello.txt?x=1&y=2").as_str())
    );
    let cookie = r.header("set-cookie").unwrap().to_string();
    assert_eq!(
        cookie,
        format!("wbx_token={token}; Path=/; HttpOnly; SameSite=Lax")
    );
    let r = get(
        &d,
        &host,
        "/hello.txt?x=1&y=2",
        &[("Cookie", &format!("wbx_token={token}"))],
    );
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "hello from the sandbox\n")
    );
    let r = get(&d, &host, "/?wbx_token=nope", &[]);
    assert_eq!(
        r.status, 401,
        "a wrong token in a link is refused, not redirected"
    );

    // What the app gets: the client's address, its own Authorization and cookies;
    // never our token, header or cookie.
    let app = host.replacen("8000-", "8001-", 1);
    let r = get(
        &d,
        &app,
        "/echo?q=1",
        &[
            ("X-WBX-Token", token),
            ("Authorization", "Bearer the-apps-own"),
            (
                "Cookie",
                &format!("session=abc; wbx_token={token}; theme=dark"),
            ),
            ("X-Forwarded-For", "203.0.113.50"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("set-cookie"),
        Some("app_session=xyz; Path=/"),
        "the app's own cookies come back"
    );
    let e = r.json();
    assert!(
        !r.text().contains(token),
        "the app never sees the token: {e}"
    );
    assert_eq!(e["path"], "/echo?q=1");
    assert_eq!(
        e["headers"]["authorization"],
        json!(["Bearer the-apps-own"])
    );
    assert_eq!(e["headers"]["cookie"], json!(["session=abc; theme=dark"]));
    // The client is no trusted proxy: its own claim of an address is dropped, so an
    // app that believes the first entry sees the real one.
    assert_eq!(e["headers"]["x-forwarded-for"], json!(["127.0.0.1"]));
    assert_eq!(e["headers"]["x-forwarded-proto"], json!(["http"]));
    assert_eq!(e["headers"]["host"], json!([app]));
    assert!(e["headers"].get("x-wbx-token").is_none(), "{e}");

    // Bodies both ways, chunked and not, several requests on one connection.
    let mut s = d.connect();
    let body = vec![b'z'; 3 << 20];
    let head = format!(
        "POST /up HTTP/1.1\r\nHost: {app}\r\nX-WBX-Token: {token}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut req = head.into_bytes();
    req.extend_from_slice(&body);
    let r = raw(&d, &mut s, &req, false);
    assert_eq!(r.status, 200, "{}", r.text());
    let e = r.json();
    assert_eq!(e["body_len"], 3 << 20);
    let chunked = format!(
        "PUT /up HTTP/1.1\r\nHost: {app}\r\nX-WBX-Token: {token}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    );
    let r = raw(&d, &mut s, chunked.as_bytes(), false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["body_len"], 11);
    // A body that breaks its chunked framing: 400 (the client's fault), one answer,
    // the connection closed. It once sent the daemon's loop round forever, queueing a
    // page and a log line on each pass, every face stalled.
    {
        let mut bad = d.connect();
        bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = format!(
            "POST /up HTTP/1.1\r\nHost: {app}\r\nX-WBX-Token: {token}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        );
        let r = raw(&d, &mut bad, req.as_bytes(), false);
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.text().contains("malformed request body"), "{}", r.text());
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut bad, &mut rest).unwrap();
        assert!(
            rest.is_empty(),
            "one answer only: {}",
            String::from_utf8_lossy(&rest)
        );
        // The daemon serves on: its API and the app on the kept connection.
        assert_eq!(d.get("/healthz").status, 200);
        let r = raw(&d, &mut s, chunked.as_bytes(), false);
        assert_eq!(r.json()["body_len"], 11);
    }
    let r = raw(
        &d,
        &mut s,
        format!("GET /chunked HTTP/1.1\r\nHost: {app}\r\nX-WBX-Token: {token}\r\n\r\n").as_bytes(),
        false,
    );
    assert_eq!((r.status, r.text().as_str()), (200, "one,two,three"));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    let n = 5 << 20;
    let r = raw(
        &d,
        &mut s,
        format!("GET /big?n={n} HTTP/1.1\r\nHost: {app}\r\nX-WBX-Token: {token}\r\n\r\n")
            .as_bytes(),
        false,
    );
    assert_eq!((r.status, r.body.len()), (200, n));
    assert!(r
        .body
        .chunks(256)
        .all(|c| c.iter().enumerate().all(|(i, &b)| b as usize == i)));
    // One connection, two sandboxes' ports: each request goes where its Host says.
    let r = raw(
        &d,
        &mut s,
        format!("GET /hello.txt HTTP/1.1\r\nHost: {host}\r\nX-WBX-Token: {token}\r\n\r\n")
            .as_bytes(),
        false,
    );
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "hello from the sandbox\n")
    );
    // HEAD: the head alone.
    let r = raw(
        &d,
        &mut s,
        format!("HEAD /hello.txt HTTP/1.1\r\nHost: {host}\r\nX-WBX-Token: {token}\r\n\r\n")
            .as_bytes(),
        true,
    );
    assert_eq!((r.status, r.header("content-length")), (200, Some("23")));
    drop(s);

    // A WebSocket through the proxy.
    let mut ws = d.connect();
    let handshake = format!(
        "GET /chat HTTP/1.1\r\nHost: {app}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Cookie: wbx_token={token}\r\n\r\n"
    );
    ws.write_all(handshake.as_bytes()).unwrap();
    let head = common::read_head(&mut ws);
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    for msg in ["hello through the proxy", "and again"] {
        let mask = [1u8, 2, 3, 4];
        let mut frame = vec![0x81, 0x80 | msg.len() as u8];
        frame.extend_from_slice(&mask);
        frame.extend(msg.bytes().enumerate().map(|(i, c)| c ^ mask[i % 4]));
        ws.write_all(&frame).unwrap();
        let mut h = [0u8; 2];
        ws.read_exact(&mut h).unwrap();
        let mut payload = vec![0u8; usize::from(h[1])];
        ws.read_exact(&mut payload).unwrap();
        assert_eq!(
            (h[0], String::from_utf8(payload).unwrap()),
            (0x81, format!("echo: {msg}"))
        );
    }
    ws.write_all(&[0x88, 0x80, 0, 0, 0, 0]).unwrap();
    let mut rest = Vec::new();
    ws.read_to_end(&mut rest).unwrap();
    assert_eq!(
        rest,
        [0x88, 0x00],
        "the close frame, then the end of the pipe"
    );

    // Another page under the public domain (another sandbox's app) cannot use this
    // address's cookie in the user's browser to open a WebSocket or post: the cookie
    // alone admits such a request only from this address's own pages. The header's
    // token is the client's own choice: admitted from anywhere.
    let foreign = "http://8000-sb-000000000000000000000000.localhost";
    let upgrade = |origin: &str, extra: &str| {
        let mut ws = d.connect();
        write!(
            ws,
            "GET /chat HTTP/1.1\r\nHost: {app}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             Origin: {origin}\r\n{extra}\r\n"
        )
        .unwrap();
        let head = common::read_head(&mut ws);
        head.split(' ').nth(1).unwrap().to_string()
    };
    let cookie = format!("Cookie: wbx_token={token}\r\n");
    assert_eq!(upgrade(foreign, &cookie), "403");
    assert_eq!(upgrade("null", &cookie), "403");
    assert_eq!(upgrade(&format!("http://{app}"), &cookie), "101");
    assert_eq!(
        upgrade(foreign, &format!("X-WBX-Token: {token}\r\n")),
        "101"
    );
    let post = |headers: &[(&str, &str)]| {
        let mut req = format!(
            "POST /up HTTP/1.1\r\nHost: {app}\r\nConnection: close\r\nContent-Length: 2\r\n"
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\nhi");
        raw(&d, &mut d.connect(), req.as_bytes(), false).status
    };
    let c = format!("wbx_token={token}");
    assert_eq!(post(&[("Cookie", &c), ("Origin", foreign)]), 403);
    assert_eq!(
        post(&[("Cookie", &c), ("Sec-Fetch-Site", "same-site")]),
        403
    );
    assert_eq!(
        post(&[("Cookie", &c), ("Sec-Fetch-Site", "same-origin")]),
        200
    );
    assert_eq!(post(&[("Cookie", &c)]), 200);
    assert_eq!(post(&[("X-WBX-Token", token), ("Origin", foreign)]), 200);
    // A link followed from another site (a GET) is let in, as links must be.
    let r = get(
        &d,
        &app,
        "/echo",
        &[("Cookie", &c), ("Sec-Fetch-Site", "cross-site")],
    );
    assert_eq!(r.status, 200);

    // A WebSocket client cannot follow the cookie flow's redirect: a link's token is
    // taken as it is for an upgrade (and not passed on).
    let mut ws = d.connect();
    write!(
        ws,
        "GET /chat?wbx_token={token} HTTP/1.1\r\nHost: {app}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    let mut line = [0u8; 13];
    ws.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"HTTP/1.1 101 ");
    drop(ws);
    // The redirect stays on this host whatever the path looks like (`//elsewhere` is a
    // path here, not another site).
    let r = get(
        &d,
        &host,
        &format!("//evil.example/x?wbx_token={token}"),
        &[],
    );
    assert_eq!(r.status, 302, "{}", r.text());
    assert_eq!(
        r.header("location"),
        Some(format!("http://{host}//evil.example/x").as_str())
    );
    // Another app under the domain can set a domain-wide `wbx_token` cookie: it does
    // not lock this sandbox's users out.
    let r = get(
        &d,
        &host,
        "/hello.txt",
        &[("Cookie", &format!("wbx_token=planted; wbx_token={token}"))],
    );
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "hello from the sandbox\n")
    );
    // A client that half-closes after its request still gets the whole answer.
    let mut s = d.connect();
    write!(
        s,
        "GET /big?n={} HTTP/1.1\r\nHost: {app}\r\nX-WBX-Token: {token}\r\n\r\n",
        2 << 20
    )
    .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let r = read_response(&mut BufReader::new(s), false).expect("the whole answer");
    assert_eq!((r.status, r.body.len()), (200, 2 << 20));
    // A client that sends requests and never reads the answers (the proxy's own pages
    // here, no token needed) is not read on once 256 KiB of answers wait for it: its
    // writes stall, and the daemon's memory does not grow with them.
    let rss = |pid: u32| -> u64 {
        let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        st.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap()
    };
    let before = rss(d.pid());
    let mut s = d.connect();
    s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").repeat(256);
    let mut sent = 0usize;
    while sent < (64 << 20) {
        match s.write(req.as_bytes()) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    assert!(
        sent < (64 << 20),
        "the daemon kept reading a client that reads nothing"
    );
    let grew = rss(d.pid()).saturating_sub(before);
    assert!(grew < 16 * 1024, "RSS grew by {grew} KiB");
    // It can still read what it asked for.
    let r = read_response(&mut BufReader::new(s.try_clone().unwrap()), false).unwrap();
    assert_eq!(r.status, 401);
    drop(s);
    // A head begun and not finished is cut at the head timeout (2 s here), as on the
    // API, however its bytes trickle.
    let mut s = d.connect();
    let r = raw(
        &d,
        &mut s,
        format!("GET /hello.txt HTTP/1.1\r\nHost: {host}\r\nX-WBX-Token: {token}\r\n\r\n")
            .as_bytes(),
        false,
    );
    assert_eq!(r.status, 200);
    let t0 = Instant::now();
    let mut cut = false;
    let slow = b"GET /hello.txt HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for b in slow.iter().cycle().take(40) {
        // Closed by the daemon: EOF to read, or the write fails.
        s.set_nonblocking(true).unwrap();
        let mut one = [0u8; 1];
        let eof = matches!(s.peek(&mut one), Ok(0));
        s.set_nonblocking(false).unwrap();
        if eof || s.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        cut && t0.elapsed() < Duration::from_secs(5),
        "a trickled head on a proxied connection was not cut: {:?}",
        t0.elapsed()
    );

    // Nothing else is reachable: a port nobody listens on, an app on 127.0.0.1 only,
    // another sandbox with this one's token, a name that is no sandbox.
    let r = get(
        &d,
        &host.replacen("8000-", "8009-", 1),
        "/",
        &[("X-WBX-Token", token)],
    );
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(
        r.text().contains("Nothing listens on port 8009"),
        "{}",
        r.text()
    );
    // The app on 127.0.0.1:8002 does listen (seen from inside), so the 502 below
    // is the address, not a slow start.
    let seen = exec(
        &d,
        &a,
        "python3 -c 'import socket,time\nfor _ in range(150):\n    try:\n        socket.create_connection((\"127.0.0.1\", 8002), 1).close(); print(\"up\"); break\n    except OSError: time.sleep(0.1)'",
    );
    assert_eq!(seen["stdout"], "up\n", "{seen}");
    let r = get(
        &d,
        &host.replacen("8000-", "8002-", 1),
        "/",
        &[("X-WBX-Token", token)],
    );
    assert_eq!(
        r.status,
        502,
        "127.0.0.1 inside the sandbox is not its address: {}",
        r.text()
    );
    let other = host.replacen(hex, b.strip_prefix("sb_").unwrap(), 1);
    let r = get(&d, &other, "/hello.txt", &[("X-WBX-Token", token)]);
    assert_eq!(r.status, 401, "{}", r.text());
    let r = get(
        &d,
        &other,
        "/hello.txt",
        &[("X-WBX-Token", tb["token"].as_str().unwrap())],
    );
    assert_eq!(r.status, 502, "B has no app: {}", r.text());
    let r = get(
        &d,
        &format!("8000-sb-{}.localhost", "0".repeat(24)),
        "/",
        &[],
    );
    assert_eq!(
        r.status, 401,
        "no token, no answer about which sandboxes exist"
    );
    let r = get(&d, "8000-nonsense.localhost", "/", &[]);
    assert_eq!(r.status, 404, "{}", r.text());
    // The API beside it, on the same port, is untouched.
    let r = d.get("/healthz");
    assert_eq!(r.status, 200);

    // Paused: an error page; resumed: the app again; deleted: gone.
    let r = wbx(&d, "POST", &format!("/v1/sandboxes/{a}/pause"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(&d, &host, "/hello.txt", &[("X-WBX-Token", token)]);
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("paused"), "{}", r.text());
    let r = wbx(&d, "POST", &format!("/v1/sandboxes/{a}/resume"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(&d, &host, "/hello.txt", &[("X-WBX-Token", token)]);
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "hello from the sandbox\n")
    );
    // A keep-alive connection left idle after its request is closed after the idle
    // timeout (ISOBOX_IDLE_TIMEOUT_MS, 15 s here, so that the delete below stays well
    // within it under load), not after the 10 minutes that a request in flight has
    // (its timer was not moved nearer once the request ended). Just before the delete
    // check, which opens its connection afterwards: it idles every connection kept.
    {
        let mut idle = d.connect();
        let req = format!("GET /echo HTTP/1.1\r\nHost: {app}\r\nX-WBX-Token: {token}\r\n\r\n");
        assert_eq!(raw(&d, &mut idle, req.as_bytes(), false).status, 200);
        idle.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut idle, &mut rest)
            .expect("closed by the daemon within the idle timeout");
        assert!(rest.is_empty());
    }
    // A keep-alive connection open when the sandbox is deleted is closed with it.
    let mut s = d.connect();
    let r = raw(
        &d,
        &mut s,
        format!("GET /hello.txt HTTP/1.1\r\nHost: {host}\r\nX-WBX-Token: {token}\r\n\r\n")
            .as_bytes(),
        false,
    );
    assert_eq!(r.status, 200);
    let r = wbx(&d, "DELETE", &format!("/v1/sandboxes/{a}"), None);
    assert_eq!(r.status, 204, "{}", r.text());
    let r = raw(
        &d,
        &mut s,
        format!("GET /hello.txt HTTP/1.1\r\nHost: {host}\r\nX-WBX-Token: {token}\r\n\r\n")
            .as_bytes(),
        false,
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("ended or does not exist"), "{}", r.text());
    for id in [&b, &none] {
        assert_eq!(
            wbx(&d, "DELETE", &format!("/v1/sandboxes/{id}"), None).status,
            204
        );
    }
}

#[test]
fn test_no_public_urls_without_sandbox_networking() {
    // The suite's default daemon runs with ISOBOX_EGRESS=off: sandboxes have no link.
    let d = Daemon::start();
    d.wait_ready();
    let id = create(&d, &json!({}));
    let r = wbx(
        &d,
        "GET",
        &format!("/v1/sandboxes/{id}/url?port=8000"),
        None,
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(err(&r).contains("ISOBOX_EGRESS=off"), "{}", r.text());
    assert_eq!(
        wbx(&d, "DELETE", &format!("/v1/sandboxes/{id}"), None).status,
        204
    );
}

/// Connections to apps take at most three quarters of `ISOBOX_MAX_CONNECTIONS`, so
/// the API keeps the rest: with 8, six kept-alive connections to an app are served
/// (the bound), a seventh request on a new connection gets the proxy's `503` page,
/// and the API answers meanwhile; once one of the six closes, a new one is served.
#[test]
fn test_connections_to_apps_leave_the_api_room() {
    let fake = FakeNet::new();
    let d = Daemon::start_in_netns(
        &fake.harness,
        &[("ISOBOX_NET_DNS", DNS), ("ISOBOX_MAX_CONNECTIONS", "8")],
    );
    d.wait_ready();
    let a = create(&d, &json!({"template": "base"}));
    let u = wbx(&d, "GET", &format!("/v1/sandboxes/{a}/url?port=8001"), None).json();
    let (host, token) = (
        host_of(u["url"].as_str().unwrap()),
        u["token"].as_str().unwrap().to_string(),
    );
    start_app(&d, &a, "0.0.0.0", 8001);
    wait_up(&d, &host, &token);
    let keep = format!("GET /x HTTP/1.1\r\nHost: {host}\r\nX-WBX-Token: {token}\r\n\r\n");
    let mut held: Vec<TcpStream> = Vec::new();
    for i in 0..6 {
        let mut s = d.connect();
        let r = raw(&d, &mut s, keep.as_bytes(), false);
        assert_eq!(r.status, 200, "connection {i}: {}", r.text());
        held.push(s);
    }
    let r = get(&d, &host, "/x", &[("X-WBX-Token", &token)]);
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.text().contains("Too many connections to sandboxes' apps"),
        "{}",
        r.text()
    );
    // The API answers, and the six are still served.
    assert_eq!(d.request("GET", "/healthz", &[], b"").status, 200);
    assert_eq!(raw(&d, &mut held[0], keep.as_bytes(), false).status, 200);
    drop(held.pop());
    // The daemon notices the close on its next turn.
    let t0 = Instant::now();
    loop {
        let r = get(&d, &host, "/x", &[("X-WBX-Token", &token)]);
        if r.status == 200 {
            break;
        }
        assert!(
            r.status == 503 && t0.elapsed() < Duration::from_secs(10),
            "{} {}",
            r.status,
            r.text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(held);
    assert_eq!(
        wbx(&d, "DELETE", &format!("/v1/sandboxes/{a}"), None).status,
        204
    );
}

//! Helpers of the WBX face's job and batch tests: requests under `/wbx`, the error
//! shape, polling a job to its end, and a loopback webhook receiver with the
//! document's own signature check.

use super::{Daemon, Resp};
use serde_json::Value;
use std::time::{Duration, Instant};

pub fn wbx(d: &Daemon, method: &str, path: &str, key: Option<&str>, body: Option<&Value>) -> Resp {
    wbx_h(d, method, path, key, body, &[])
}

pub fn wbx_h(
    d: &Daemon,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
    extra: &[(&str, &str)],
) -> Resp {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut h: Vec<(&str, &str)> = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        h.push(("Authorization", a));
    }
    h.extend_from_slice(extra);
    let b = body.map(|b| b.to_string()).unwrap_or_default();
    d.request(method, &format!("/wbx{path}"), &h, b.as_bytes())
}

/// The error message of a WBX error, checking the shape: exactly `{"error": "..."}`.
pub fn err(r: &Resp) -> String {
    let v = r.json();
    assert_eq!(
        v.as_object().map(|o| o.len()),
        Some(1),
        "the WBX error shape is {{\"error\": \"message\"}}: {v}"
    );
    v["error"].as_str().expect("a message").to_string()
}

pub fn submit(d: &Daemon, key: Option<&str>, body: &Value) -> Value {
    let r = wbx(d, "POST", "/v1/jobs", key, Some(body));
    assert_eq!(r.status, 202, "{}\nlog:\n{}", r.text(), d.log());
    let v = r.json();
    assert!(
        v["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("job_") && i.len() == 28),
        "{v}"
    );
    v
}

pub const FINISHED: &[&str] = &["completed", "failed", "cancelled", "expired"];

/// Polls the job until it has finished.
pub fn finished(d: &Daemon, key: Option<&str>, id: &str, within: Duration) -> Value {
    let t = Instant::now();
    loop {
        let r = wbx(d, "GET", &format!("/v1/jobs/{id}"), key, None);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        if FINISHED.contains(&v["status"].as_str().unwrap_or("")) {
            return v;
        }
        assert!(
            t.elapsed() < within,
            "job {id} did not finish within {within:?}: {v}\nlog:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn until_status(d: &Daemon, key: Option<&str>, id: &str, status: &str) -> Value {
    let t = Instant::now();
    loop {
        let v = wbx(d, "GET", &format!("/v1/jobs/{id}"), key, None).json();
        if v["status"] == status {
            return v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "job {id} never became {status}: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect()
}

/// One request a receiver got: its head's lines and its body.
pub type Got = (Vec<String>, Vec<u8>);

/// A webhook receiver on loopback: with `hold_first`, the first request is held
/// unanswered (its sender is killed meanwhile); every other one is answered 200.
pub fn receiver(hold_first: bool) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<Got>>>) {
    use std::io::{BufRead, Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let got: std::sync::Arc<std::sync::Mutex<Vec<Got>>> = Default::default();
    let g = std::sync::Arc::clone(&got);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let g = std::sync::Arc::clone(&g);
            std::thread::spawn(move || {
                let mut r = std::io::BufReader::new(s.try_clone().unwrap());
                let mut head = Vec::new();
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end().to_string();
                    if line.is_empty() {
                        break;
                    }
                    head.push(line);
                }
                let len: usize = head
                    .iter()
                    .find_map(|h| {
                        h.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                let mut body = vec![0u8; len];
                r.read_exact(&mut body).unwrap();
                let first = {
                    let mut g = g.lock().unwrap();
                    g.push((head, body));
                    g.len() == 1
                };
                let mut s = s;
                if first && hold_first {
                    std::thread::sleep(Duration::from_secs(60));
                } else {
                    let _ = s.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                }
            });
        }
    });
    (port, got)
}

/// Waits up to 60 s until the receiver `got` has had `n` requests.
pub fn until_delivered(d: &Daemon, got: &std::sync::Mutex<Vec<Got>>, n: usize) {
    let t = Instant::now();
    while got.lock().unwrap().len() < n {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{} of {n} deliveries\n{}",
            got.lock().unwrap().len(),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn header<'a>(head: &'a [String], name: &str) -> &'a str {
    head.iter()
        .find_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
        .unwrap_or_else(|| panic!("no {name} in {head:?}"))
}

/// The document's own verification snippet, unchanged, run on a delivery.
pub const VERIFY: &str = r#"import hashlib, hmac, time

def verify(secret: str, body: bytes, header: str) -> bool:
    parts = dict(p.split("=", 1) for p in header.split(","))
    if abs(time.time() - int(parts["t"])) > 300:
        return False
    mac = hmac.new(secret.encode(), parts["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac, parts["v1"])
"#;

pub fn verifies(secret: &str, body: &[u8], sig: &str) -> bool {
    let path = std::env::temp_dir().join(format!(
        "isobox-hook-{}-{}",
        std::process::id(),
        sig.len() + body.len()
    ));
    std::fs::write(&path, body).unwrap();
    let script = format!(
        "{VERIFY}\nimport sys\nprint(verify(sys.argv[1], open(sys.argv[2], 'rb').read(), sys.argv[3]))\n"
    );
    let out = std::process::Command::new(super::test_python())
        .args(["-c", &script, secret, path.to_str().unwrap(), sig])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim() == "True"
}

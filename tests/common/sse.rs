//! Server-sent events as the daemon frames them (`src/http/sse.rs`): `event: NAME`, one
//! `data:` line per line of a JSON payload, a blank line; `: ...` comments keep a
//! silent stream alive. Read a finished stream whole ([`events`]) or one as it arrives
//! ([`Stream`]).

use super::{Daemon, Resp};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

/// One event block's name and data (its `data:` lines joined by `\n`, parsed as JSON;
/// a panic if they are not JSON); `None` for a block with no `event:` line (a
/// keep-alive comment).
fn parse_event(block: &str) -> Option<(String, Value)> {
    let mut name = None;
    let mut data: Vec<&str> = Vec::new();
    for line in block.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = Some(n.to_string());
        } else if let Some(d) = line.strip_prefix("data: ") {
            data.push(d);
        }
    }
    let name = name?;
    let data = data.join("\n");
    let v = serde_json::from_str(&data)
        .unwrap_or_else(|e| panic!("event {name}: data is not JSON ({e}): {data:?}"));
    Some((name, v))
}

/// The events of a finished stream, (name, data) in order; asserts it is a 200
/// `text/event-stream`.
pub fn events(r: &Resp) -> Vec<(String, Value)> {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    r.text().split("\n\n").filter_map(parse_event).collect()
}

/// A streamed (SSE) POST whose output can be watched while it runs.
pub struct Stream {
    r: BufReader<TcpStream>,
    chunked: bool,
    /// Text read but not yet a whole event.
    pending: String,
    /// Every byte of the stream read so far, as text (for failure messages).
    pub text: String,
    /// The `stdout` and `stderr` events' chunks, joined.
    pub stdout: String,
    pub stderr: String,
    /// The `done` event's data, once read.
    pub done: Option<Value>,
    /// Every event read: its `id:` (if it had one), name and data.
    pub events: Vec<(Option<u64>, String, Value)>,
    /// The `X-Run-Id` header, when the stream is a recorded run's.
    pub run_id: Option<String>,
}

impl Stream {
    /// A streamed `POST /execute` with `body`.
    pub fn execute(d: &Daemon, body: &Value) -> Stream {
        Self::post(d, "/execute", &[], body)
    }

    /// `POST path` with `Accept: text/event-stream`, `headers` and the JSON `body`;
    /// asserts the answer starts 200.
    pub fn post(d: &Daemon, path: &str, headers: &[(&str, &str)], body: &Value) -> Stream {
        Self::open(d, "POST", path, headers, Some(body))
    }

    /// `GET path` (a recorded run's events) with `headers`; asserts the answer starts 200.
    pub fn get(d: &Daemon, path: &str, headers: &[(&str, &str)]) -> Stream {
        Self::open(d, "GET", path, headers, None)
    }

    fn open(
        d: &Daemon,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Stream {
        let mut s = d.connect();
        let mut head =
            format!("{method} {path} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        match body {
            Some(body) => {
                let b = body.to_string();
                write!(
                    s,
                    "{head}Content-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{b}",
                    b.len()
                )
                .unwrap();
            }
            None => write!(s, "{head}Connection: close\r\n\r\n").unwrap(),
        }
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.contains(" 200 "), "SSE status: {line}");
        let mut chunked = false;
        let mut run_id = None;
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let l = h.to_ascii_lowercase();
            if l.starts_with("transfer-encoding:") && l.contains("chunked") {
                chunked = true;
            }
            if l.starts_with("x-run-id:") {
                run_id = Some(h["x-run-id:".len()..].trim().to_string());
            }
        }
        Stream {
            r,
            chunked,
            pending: String::new(),
            text: String::new(),
            stdout: String::new(),
            stderr: String::new(),
            done: None,
            events: Vec::new(),
            run_id,
        }
    }

    /// Reads more of the stream; false at its end.
    pub fn more(&mut self) -> bool {
        let mut data = Vec::new();
        if self.chunked {
            let mut size = String::new();
            if self.r.read_line(&mut size).unwrap_or(0) == 0 {
                return false;
            }
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut c = vec![0; n + 2];
            self.r.read_exact(&mut c).unwrap();
            if n == 0 {
                return false;
            }
            data.extend_from_slice(&c[..n]);
        } else {
            let mut c = [0u8; 4096];
            match self.r.read(&mut c) {
                Ok(0) | Err(_) => return false,
                Ok(n) => data.extend_from_slice(&c[..n]),
            }
        }
        let text = String::from_utf8_lossy(&data);
        self.text.push_str(&text);
        self.pending.push_str(&text);
        while let Some(i) = self.pending.find("\n\n") {
            let block: String = self.pending.drain(..i + 2).collect();
            let Some((name, p)) = parse_event(&block) else {
                continue;
            };
            let id = block
                .lines()
                .find_map(|l| l.strip_prefix("id: "))
                .map(|i| i.parse::<u64>().expect("a numeric event id"));
            self.events.push((id, name.clone(), p.clone()));
            let chunk = || {
                p["chunk"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name} event without a chunk: {p}"))
            };
            match name.as_str() {
                "stdout" => self.stdout.push_str(chunk()),
                "stderr" => self.stderr.push_str(chunk()),
                "done" => self.done = Some(p.clone()),
                _ => {}
            }
        }
        true
    }

    /// Reads until stdout has a line starting with `prefix`; returns the rest of it.
    pub fn wait_line(&mut self, prefix: &str) -> String {
        loop {
            if let Some(l) = self.stdout.lines().find_map(|l| l.strip_prefix(prefix)) {
                if self.stdout.contains(&format!("{prefix}{l}\n")) {
                    return l.to_string();
                }
            }
            assert!(
                self.more(),
                "stream ended before {prefix:?}: {}",
                self.stdout
            );
        }
    }

    /// Reads to the end; the `done` event's data (the non-streaming response).
    pub fn finish(mut self) -> Value {
        while self.done.is_none() && self.more() {}
        self.done.expect("no done event")
    }

    /// Reads to the end: stdout and stderr joined, and the `done` event's data.
    pub fn outputs(mut self) -> (String, String, Value) {
        while self.more() {}
        let done = self
            .done
            .unwrap_or_else(|| panic!("no done event: {}", self.text));
        (self.stdout, self.stderr, done)
    }
}

//! A scripted OpenAI-compatible server on 127.0.0.1 for the agent's tests (agent.rs and
//! ui.rs): each request gets the next reply of its script; past the script, 599. It
//! records what it received (path, Authorization, JSON body).
#![allow(dead_code)]

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One scripted answer of the fake model endpoint.
pub enum Reply {
    /// 200 `text/event-stream` with these `data:` payloads, then `[DONE]`.
    Stream(Vec<Value>),
    /// The same without `[DONE]` (and without a finish reason: a cut stream).
    Cut(Vec<Value>),
    /// As `Stream`, the payloads this far apart (a client can watch the text grow).
    Paced(Vec<Value>, Duration),
    /// This status and body (the body may quote the request's Authorization).
    Status(u16, String),
    /// Headers, then silence.
    Hang,
    /// 200 with an HTML page (the web-search endpoint).
    Html(String),
}

/// What the fake endpoint received.
#[derive(Clone)]
pub struct Seen {
    pub path: String,
    pub authorization: Option<String>,
    pub body: Value,
}

pub struct Fake {
    pub addr: SocketAddr,
    pub script: Arc<Mutex<VecDeque<Reply>>>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Fake {
    pub fn start(script: Vec<Reply>) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s2, seen2) = (Arc::clone(&script), Arc::clone(&seen));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (s3, seen3) = (Arc::clone(&s2), Arc::clone(&seen2));
                std::thread::spawn(move || serve(conn, &s3, &seen3));
            }
        });
        Fake { addr, script, seen }
    }

    /// Scripted replies not yet given.
    pub fn unused(&self) -> usize {
        self.script.lock().unwrap().len()
    }

    pub fn base(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn requests(&self) -> Vec<Value> {
        self.seen()
            .into_iter()
            .filter(|s| s.path.ends_with("/chat/completions"))
            .map(|s| s.body)
            .collect()
    }
}

fn serve(mut conn: TcpStream, script: &Mutex<VecDeque<Reply>>, seen: &Mutex<Vec<Seen>>) {
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let (mut len, mut auth) = (0usize, None);
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        match k.to_ascii_lowercase().as_str() {
            "content-length" => len = v.trim().parse().unwrap(),
            "authorization" => auth = Some(v.trim().to_string()),
            _ => {}
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    seen.lock().unwrap().push(Seen {
        path,
        authorization: auth.clone(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    });
    let reply = script.lock().unwrap().pop_front();
    let _ = match reply {
        Some(r @ (Reply::Stream(_) | Reply::Cut(_) | Reply::Paced(..))) => {
            let gap = Duration::from_millis(20);
            let (chunks, done, gap) = match r {
                Reply::Stream(c) => (c, true, gap),
                Reply::Cut(c) => (c, false, gap),
                Reply::Paced(c, g) => (c, true, g),
                _ => unreachable!(),
            };
            let mut out = String::from(
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
            );
            conn.write_all(out.as_bytes()).unwrap();
            for c in chunks {
                out = format!("data: {c}\n\n");
                let _ = conn.write_all(out.as_bytes());
                std::thread::sleep(gap);
            }
            if done {
                conn.write_all(b": done\n\ndata: [DONE]\n\n")
            } else {
                Ok(())
            }
        }
        Some(Reply::Status(code, text)) => {
            let text = text.replace("{auth}", auth.as_deref().unwrap_or(""));
            conn.write_all(
                format!(
                    "HTTP/1.1 {code} Oops\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                )
                .as_bytes(),
            )
        }
        Some(Reply::Hang) => {
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
            );
            std::thread::sleep(Duration::from_secs(60));
            Ok(())
        }
        Some(Reply::Html(page)) => conn.write_all(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            )
            .as_bytes(),
        ),
        None => conn.write_all(b"HTTP/1.1 599 Script Ended\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    };
}

/// A completion that says `text`, a word per delta, `gap` apart, and stops.
pub fn say_paced(text: &str, gap: Duration) -> Reply {
    match say(text) {
        Reply::Stream(chunks) => Reply::Paced(chunks, gap),
        other => other,
    }
}

/// A completion that says `text` (in a few deltas) and stops.
pub fn say(text: &str) -> Reply {
    let mut chunks: Vec<Value> = text
        .split_inclusive(' ')
        .map(|w| json!({"choices": [{"index": 0, "delta": {"content": w}}]}))
        .collect();
    chunks.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
    Reply::Stream(chunks)
}

/// A completion that asks for these tools (arguments sent in two deltas each).
pub fn call(text: &str, calls: &[(&str, &str, Value)]) -> Reply {
    let mut chunks = Vec::new();
    if !text.is_empty() {
        chunks.push(
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]}),
        );
    }
    for (i, (id, name, args)) in calls.iter().enumerate() {
        let args = args.to_string();
        let (a, b) = args.split_at(args.len() / 2);
        chunks.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": a}}]}}]}));
        chunks.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, "function": {"arguments": b}}]}}]}));
    }
    chunks.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}));
    Reply::Stream(chunks)
}

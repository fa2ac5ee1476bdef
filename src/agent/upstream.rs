//! The agent's OpenAI-compatible upstream: one streamed chat completion per call
//! (`POST {base}/chat/completions` with `stream: true`), its server-sent chunks read
//! as they arrive, text deltas handed on at once, tool-call deltas put together.
//!
//! Blocking, on the agent's own thread, with connect, read and overall timeouts. The
//! key goes only into the `Authorization` header; anything the upstream says back is
//! scrubbed of it before it can reach a client or a log.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A completion's text beyond this fails the call (a runaway upstream).
pub const MAX_TEXT_BYTES: usize = 1 << 20;
/// Tool calls in one completion.
pub const MAX_TOOL_CALLS: usize = 16;
/// The arguments of one completion's tool calls together.
pub const MAX_ARGUMENT_BYTES: usize = 1 << 20;
/// A tool call's name and id.
const MAX_NAME_BYTES: usize = 256;
/// One line of the event stream.
const MAX_LINE_BYTES: usize = 4 << 20;
/// One completion, start to end.
const MAX_COMPLETION_TIME: Duration = Duration::from_secs(15 * 60);

/// A tool call the model made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCall {
    /// The model's id for it (echoed in the tool message).
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// Its arguments: a JSON document as text, as the model wrote it.
    pub arguments: String,
}

/// What one completion produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// The assistant's text.
    pub text: String,
    /// The tools it asked for, in order.
    pub tool_calls: Vec<ToolCall>,
}

/// The connection settings of one loop.
pub struct Upstream {
    agent: ureq::Agent,
    url: String,
    key: Option<String>,
    model: String,
}

/// Why a completion failed: the message is safe to show (the key is scrubbed).
#[derive(Debug)]
pub struct UpstreamError(pub String);

impl Upstream {
    /// A client for `{base}/chat/completions`, silent for at most `timeout`.
    pub fn new(base: &str, key: Option<&str>, model: &str, timeout: Duration) -> Upstream {
        Upstream {
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(10))
                .timeout_read(timeout)
                .timeout_write(Duration::from_secs(30))
                .redirects(0)
                .user_agent(concat!("isoboxd/", env!("CARGO_PKG_VERSION")))
                .build(),
            url: format!("{base}/chat/completions"),
            key: key.map(str::to_string),
            model: model.to_string(),
        }
    }

    /// Replaces the key wherever it appears in `s`.
    pub fn scrub(&self, s: &str) -> String {
        match &self.key {
            Some(k) if !k.is_empty() => s.replace(k.as_str(), "[redacted]"),
            _ => s.to_string(),
        }
    }

    /// Runs one streamed completion over `messages`, calling `on_text` with each text
    /// delta as it arrives. Stops early (with an error) once `cancel` is set.
    ///
    /// # Errors
    /// [`UpstreamError`]: unreachable, a non-2xx answer, a timeout, a malformed or
    /// oversized stream, or an error object in the stream.
    pub fn complete(
        &self,
        messages: &[Value],
        tools: &Value,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Completion, UpstreamError> {
        let mut body = serde_json::json!({
            "model": self.model,
            "messages": messages,
            "stream": true,
        });
        if tools.as_array().is_some_and(|t| !t.is_empty()) {
            body["tools"] = tools.clone();
        }
        let mut req = self
            .agent
            .post(&self.url)
            .set("Content-Type", "application/json")
            .set("Accept", "text/event-stream");
        if let Some(k) = &self.key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        let resp = match req.send_string(&body.to_string()) {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                // Its reason helps ("model not found", "quota exceeded"): the start of
                // the body, scrubbed of the key before it is cut (a key straddling the
                // cut must not leave a prefix behind).
                let mut raw = Vec::new();
                let _ = r.into_reader().take(2048).read_to_end(&mut raw);
                let text = self.scrub(&String::from_utf8_lossy(&raw));
                let text: String = text.trim().chars().take(500).collect();
                return Err(self.err(&format!(
                    "the model endpoint answered {code}{}{text}",
                    if text.is_empty() { "" } else { ": " },
                )));
            }
            Err(ureq::Error::Transport(t)) => {
                // Its kind and message, not its Display: that starts with the URL, which
                // may carry credentials or name an internal host.
                let cause = std::error::Error::source(&t)
                    .map(|s| format!(" ({s})"))
                    .unwrap_or_default();
                return Err(self.err(&format!(
                    "the model endpoint could not be reached: {}{}{cause}",
                    t.kind(),
                    t.message().map(|m| format!(": {m}")).unwrap_or_default()
                )));
            }
        };
        let streamed = resp.content_type().starts_with("text/event-stream");
        let mut reader = BufReader::new(resp.into_reader());
        if !streamed {
            // An endpoint that ignores `stream` answers one JSON document.
            let mut buf = Vec::new();
            reader
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_to_end(&mut buf)
                .map_err(|e| self.err(&format!("reading the model's answer failed: {e}")))?;
            let v: Value = serde_json::from_slice(&buf)
                .map_err(|_| self.err("the model's answer is neither an event stream nor JSON"))?;
            let c = whole_completion(&v).map_err(|m| self.err(&m))?;
            if !c.text.is_empty() {
                on_text(&c.text);
            }
            return Ok(c);
        }
        let started = Instant::now();
        let mut acc = Accumulator::default();
        let mut line = Vec::new();
        loop {
            if cancel.load(Ordering::Relaxed) {
                return Err(UpstreamError("cancelled".into()));
            }
            if started.elapsed() > MAX_COMPLETION_TIME {
                return Err(self.err("the completion took longer than 15 minutes"));
            }
            line.clear();
            let more = read_line(&mut reader, &mut line)
                .map_err(|e| self.err(&format!("reading the model's stream failed: {e}")))?;
            if !more {
                break;
            }
            let Some(data) = line.strip_prefix(b"data:") else {
                // Comments, `event:`, `id:`, blank lines: nothing for us.
                continue;
            };
            let data = std::str::from_utf8(data)
                .map_err(|_| self.err("the model's stream is not UTF-8"))?
                .trim();
            if data == "[DONE]" {
                acc.done = true;
                break;
            }
            if data.is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(data)
                .map_err(|_| self.err("the model's stream carried a malformed chunk"))?;
            let text = acc.chunk(&v).map_err(|m| self.err(&m))?;
            if !text.is_empty() {
                on_text(&text);
            }
        }
        if !acc.done && !acc.finished {
            return Err(self.err("the model's stream ended before the completion did"));
        }
        acc.finish().map_err(|m| self.err(&m))
    }

    fn err(&self, msg: &str) -> UpstreamError {
        UpstreamError(self.scrub(msg))
    }
}

/// Reads one line (without its end) into `out`; false at the end of the stream.
fn read_line<R: BufRead>(r: &mut R, out: &mut Vec<u8>) -> std::io::Result<bool> {
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(!out.is_empty());
        }
        match memchr::memchr(b'\n', buf) {
            Some(i) => {
                out.extend_from_slice(&buf[..i]);
                r.consume(i + 1);
                if out.last() == Some(&b'\r') {
                    out.pop();
                }
                return Ok(true);
            }
            None => {
                let n = buf.len();
                out.extend_from_slice(buf);
                r.consume(n);
            }
        }
        if out.len() > MAX_LINE_BYTES {
            return Err(std::io::Error::other("a line of the stream exceeds 4 MiB"));
        }
    }
}

/// Puts a completion together from its chunks.
#[derive(Default)]
struct Accumulator {
    text: String,
    calls: Vec<ToolCall>,
    argument_bytes: usize,
    finished: bool,
    done: bool,
}

impl Accumulator {
    /// Takes one chunk; returns its text delta.
    fn chunk(&mut self, v: &Value) -> Result<String, String> {
        if let Some(e) = v.get("error") {
            let msg = e["message"]
                .as_str()
                .map_or_else(|| e.to_string(), str::to_string);
            return Err(format!("the model endpoint reported an error: {msg}"));
        }
        let Some(choice) = v["choices"].as_array().and_then(|c| c.first()) else {
            // Usage-only and keep-alive chunks have no choice.
            return Ok(String::new());
        };
        if choice["finish_reason"].is_string() {
            self.finished = true;
        }
        let delta = &choice["delta"];
        let text = delta["content"].as_str().unwrap_or_default().to_string();
        if self.text.len() + text.len() > MAX_TEXT_BYTES {
            return Err("the model's answer exceeds 1 MiB".into());
        }
        self.text.push_str(&text);
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = tc["index"]
                .as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .unwrap_or(self.calls.len().saturating_sub(1));
            if index >= MAX_TOOL_CALLS {
                return Err(format!(
                    "the model asked for more than {MAX_TOOL_CALLS} tool calls"
                ));
            }
            while self.calls.len() <= index {
                self.calls.push(ToolCall::default());
            }
            let call = &mut self.calls[index];
            if let Some(id) = tc["id"].as_str() {
                call.id = id.to_string();
            }
            let f = &tc["function"];
            if let Some(n) = f["name"].as_str() {
                call.name.push_str(n);
            }
            if call.id.len() > MAX_NAME_BYTES || call.name.len() > MAX_NAME_BYTES {
                return Err("a tool call's name or id exceeds 256 bytes".into());
            }
            if let Some(a) = f["arguments"].as_str() {
                self.argument_bytes += a.len();
                if self.argument_bytes > MAX_ARGUMENT_BYTES {
                    return Err("the tool calls' arguments exceed 1 MiB".into());
                }
                call.arguments.push_str(a);
            }
        }
        Ok(text)
    }

    fn finish(self) -> Result<Completion, String> {
        let mut tool_calls = Vec::new();
        for (i, mut c) in self.calls.into_iter().enumerate() {
            if c.name.is_empty() {
                return Err("the model sent a tool call without a name".into());
            }
            if c.id.is_empty() {
                c.id = format!("call_{i}");
            }
            tool_calls.push(c);
        }
        Ok(Completion {
            text: self.text,
            tool_calls,
        })
    }
}

/// A non-streamed completion (`choices[0].message`).
fn whole_completion(v: &Value) -> Result<Completion, String> {
    if let Some(e) = v.get("error") {
        let msg = e["message"]
            .as_str()
            .map_or_else(|| e.to_string(), str::to_string);
        return Err(format!("the model endpoint reported an error: {msg}"));
    }
    let Some(m) = v["choices"]
        .as_array()
        .and_then(|c| c.first())
        .map(|c| &c["message"])
    else {
        return Err("the model's answer has no choices".into());
    };
    let mut acc = Accumulator::default();
    let mut calls = Vec::new();
    for (i, tc) in m["tool_calls"].as_array().into_iter().flatten().enumerate() {
        let mut tc = tc.clone();
        tc["index"] = i.into();
        calls.push(tc);
    }
    let delta = serde_json::json!({"content": m["content"], "tool_calls": calls});
    acc.chunk(&serde_json::json!({"choices": [{"delta": delta}]}))?;
    acc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn test_tool_call_deltas_are_joined_by_index() {
        let mut a = Accumulator::default();
        let chunks = [
            json!({"choices":[{"delta":{"role":"assistant","content":"Let me "}}]}),
            json!({"choices":[{"delta":{"content":"check."}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"run_","arguments":""}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"python","arguments":"{\"code\":"}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":1,"id":"c2","function":{"name":"run_shell","arguments":"{\"command\":\"ls\"}"}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"print(1)\"}"}}]}}]}),
            json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
        ];
        let mut text = String::new();
        for c in &chunks {
            text.push_str(&a.chunk(c).unwrap());
        }
        assert!(a.finished);
        let c = a.finish().unwrap();
        assert_eq!(text, "Let me check.");
        assert_eq!(c.text, "Let me check.");
        assert_eq!(
            c.tool_calls,
            vec![
                ToolCall {
                    id: "c1".into(),
                    name: "run_python".into(),
                    arguments: "{\"code\":\"print(1)\"}".into()
                },
                ToolCall {
                    id: "c2".into(),
                    name: "run_shell".into(),
                    arguments: "{\"command\":\"ls\"}".into()
                },
            ]
        );
    }

    #[test]
    fn test_bounds_and_errors() {
        let mut a = Accumulator::default();
        let e = a
            .chunk(&json!({"choices":[{"delta":{"tool_calls":[{"index":16,"function":{"name":"x"}}]}}]}))
            .unwrap_err();
        assert!(e.contains("more than 16"), "{e}");
        let mut a = Accumulator::default();
        let big = "x".repeat(MAX_TEXT_BYTES);
        a.chunk(&json!({"choices":[{"delta":{"content":big}}]}))
            .unwrap();
        assert!(a
            .chunk(&json!({"choices":[{"delta":{"content":"y"}}]}))
            .is_err());
        let mut a = Accumulator::default();
        let e = a.chunk(&json!({"error":{"message":"quota"}})).unwrap_err();
        assert!(e.ends_with("quota"), "{e}");
        let mut a = Accumulator::default();
        a.chunk(&json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}))
            .unwrap();
        assert!(a.finish().is_err(), "a nameless call is refused");
        // No id: one is made up, so the tool message can still refer to it.
        let mut a = Accumulator::default();
        a.chunk(&json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"run_python","arguments":"{}"}}]}}]}))
            .unwrap();
        assert_eq!(a.finish().unwrap().tool_calls[0].id, "call_0");
    }

    #[test]
    fn test_whole_json_answer() {
        let v = json!({"choices":[{"message":{"role":"assistant","content":null,
            "tool_calls":[{"id":"a","type":"function","function":{"name":"run_python","arguments":"{}"}}]}}]});
        let c = whole_completion(&v).unwrap();
        assert_eq!(c.text, "");
        assert_eq!(c.tool_calls[0].name, "run_python");
        assert!(whole_completion(&json!({"nope":1})).is_err());
    }

    #[test]
    fn test_read_line_bounds_and_crlf() {
        let mut r = BufReader::new(&b"data: a\r\n\ndata: b"[..]);
        let mut l = Vec::new();
        assert!(read_line(&mut r, &mut l).unwrap());
        assert_eq!(l, b"data: a");
        l.clear();
        assert!(read_line(&mut r, &mut l).unwrap());
        assert_eq!(l, b"");
        l.clear();
        assert!(read_line(&mut r, &mut l).unwrap());
        assert_eq!(l, b"data: b");
        l.clear();
        assert!(!read_line(&mut r, &mut l).unwrap());
        let huge = vec![b'x'; MAX_LINE_BYTES + 10];
        let mut r = BufReader::new(&huge[..]);
        let mut l = Vec::new();
        assert!(read_line(&mut r, &mut l).is_err());
    }

    #[test]
    fn test_scrub_removes_the_key() {
        let u = Upstream::new(
            "http://127.0.0.1:1",
            Some("sk-secret"),
            "m",
            Duration::from_secs(1),
        );
        assert_eq!(u.scrub("bad key sk-secret!"), "bad key [redacted]!");
    }
}

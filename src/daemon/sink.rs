//! Where a run's output and its end go: a [`Sink`]. A run (or a kernel step) reads its
//! pipes, caps and decodes what it reads, and hands whole UTF-8 text to its sink; it
//! never frames bytes for a wire. Today's sinks: an HTTP response (`HttpSink`: one JSON
//! body, or SSE events as output comes; the framing is `http`'s), an agent loop's
//! thread (`agent::AgentSink`), and a run's record (`records::RecordSink`: events with
//! ids, streamed live and kept for clients that reconnect or read a detached run).
//! A WebSocket, a job's log and a process's ring buffer are sinks to come; each is a
//! new implementation, and the run does not change.
//!
//! Sinks hold addresses (a connection's key and serial, a channel), never the thing
//! itself, so the run keeps an `Rc` of its sink and calls it with the whole daemon.
//! Reactor thread only.

use super::Daemon;
use crate::api::execute::ExecuteResponse;
use crate::http::Response;

/// Which of a run's output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    /// The program's stdout.
    Stdout,
    /// The program's stderr.
    Stderr,
}

impl Stream {
    /// By capture index: 0 is stdout, 1 is stderr.
    pub(crate) fn of(idx: usize) -> Stream {
        if idx == 0 {
            Stream::Stdout
        } else {
            Stream::Stderr
        }
    }

    /// The name output of this stream goes by (an SSE event's).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// How a run with a result ended, besides the result.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ended {
    /// A kernel step's kernel lives on.
    pub(crate) kernel_alive: bool,
    /// It was cancelled (its client left, it was cancelled by request, or the daemon
    /// stopped it).
    pub(crate) cancelled: bool,
}

/// A refusal as a stream's `error` event says it: (its code, `"<code>: <detail>"`).
pub(crate) fn refusal_message(resp: &Response) -> (String, String) {
    let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap_or_default();
    let code = v["error"].as_str().unwrap_or("error").to_string();
    let msg = match v["detail"].as_str() {
        Some(d) => format!("{code}: {d}"),
        None => code.clone(),
    };
    (code, msg)
}

/// What a run's consumer is.
pub(crate) trait Sink {
    /// Run `rk` now works for this consumer (an HTTP connection waits on it).
    fn attach(&self, _d: &mut Daemon, _rk: usize) {}

    /// Whether it takes output as it comes (else the result carries all of it).
    fn live(&self) -> bool {
        false
    }

    /// Output, in whole UTF-8 characters. True when the consumer is full: the run stops
    /// reading its pipes (so the program blocks on them) until the consumer drains and
    /// calls `run_resume`.
    fn output(&self, _d: &mut Daemon, _stream: Stream, _text: &str) -> bool {
        false
    }

    /// A live consumer's stream has been quiet for a keep-alive interval.
    fn keepalive(&self, _d: &mut Daemon) {}

    /// The run's result, and how it ended.
    fn result(&self, d: &mut Daemon, body: ExecuteResponse, ended: Ended);

    /// The run ended without a result, with this refusal (a 500 when the sandbox did
    /// not start, a kernel that is dead or busy, a full daemon).
    fn refused(&self, d: &mut Daemon, resp: Response);

    /// The client that started the run left (the run is cancelled). True when this
    /// sink still takes the run's end (a record); false drops it.
    fn client_left(&self) -> bool {
        false
    }
}

/// An HTTP client waiting on connection `conn` (of `serial`): one JSON body, or SSE.
pub(crate) struct HttpSink {
    pub(crate) conn: usize,
    pub(crate) serial: u64,
    /// SSE: output as events, the result as `done`, a refusal as `error`.
    pub(crate) stream: bool,
}

impl HttpSink {
    /// The connection, if it is still the one that asked.
    fn conn(&self, d: &Daemon) -> Option<usize> {
        d.conns
            .get(self.conn)
            .is_some_and(|c| c.serial == self.serial)
            .then_some(self.conn)
    }
}

impl Sink for HttpSink {
    fn attach(&self, d: &mut Daemon, rk: usize) {
        if let Some(ck) = self.conn(d) {
            d.conn_wait_for_run(ck, rk, self.stream);
        }
    }

    fn live(&self) -> bool {
        self.stream
    }

    fn output(&self, d: &mut Daemon, stream: Stream, text: &str) -> bool {
        let Some(ck) = self.conn(d).filter(|_| self.stream) else {
            return false;
        };
        let data = serde_json::json!({ "chunk": text }).to_string();
        d.conn_send_event(ck, stream.name(), &data)
    }

    fn keepalive(&self, d: &mut Daemon) {
        if let Some(ck) = self.conn(d).filter(|_| self.stream) {
            d.conn_send_comment(ck, "keep-alive");
        }
    }

    fn result(&self, d: &mut Daemon, body: ExecuteResponse, _: Ended) {
        let Some(ck) = self.conn(d) else { return };
        if self.stream {
            // One `data:` line: serialised JSON holds no raw line breaks.
            d.finish_stream_lazy(ck, body.into_lazy(), None);
        } else {
            d.respond_lazy(ck, body.into_lazy());
        }
        d.conn_resume(ck);
    }

    fn refused(&self, d: &mut Daemon, resp: Response) {
        let Some(ck) = self.conn(d) else { return };
        // Refused before `attach` (a kernel step its kernel cannot take), no head has
        // gone out: the refusal is the response, with its own status.
        let streaming = d.conns.get(ck).is_some_and(|c| {
            matches!(
                c.owner(),
                Some(super::conn::Owner::Run { stream: true, .. })
            )
        });
        if streaming {
            // The head already said 200: the refusal is an `error` event,
            // `{"error": "<code>: <detail>"}`.
            let (_, msg) = refusal_message(&resp);
            let mut frame = Vec::new();
            crate::http::sse::write_event(
                &mut frame,
                "error",
                &serde_json::json!({ "error": msg }).to_string(),
            );
            d.finish_stream(ck, &frame);
        } else {
            d.respond(ck, resp);
        }
        d.conn_resume(ck);
    }
}

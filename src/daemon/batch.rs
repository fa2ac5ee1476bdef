//! Many inputs, one request: `POST /execute` with `inputs` runs the same code once per
//! input — each in its own fresh sandbox, with the request's limits, its own stdin and
//! args, and its own outcome — and answers every result in input order (JSON), or
//! streams each input's output with its index and each result as it comes (SSE).
//!
//! Admission: the request spends one token of the rate limit, like any `/execute`;
//! each input holds an execution slot while it runs. The request is admitted when a
//! slot is free, and runs at most as many inputs at once as there were free slots then,
//! and never more than half of all slots (at least one), so a batch leaves room for
//! others; as an input ends, its slot goes to the batch's next input.
//!
//! With `"sharedSandbox": true` the inputs run one after another in one sandbox
//! instead (`shared.rs`).
//!
//! A client that leaves cancels every input. Reactor thread only.

pub(super) mod shared;

use super::conn::Owner;
use super::sink::{Ended, Sink, Stream};
use super::Daemon;
use crate::api::execute::{ExecuteResponse, Input};
use crate::http::Response;
use crate::sandbox::plan::ExecPlan;
use std::rc::Rc;

/// One request's inputs on their way.
pub(crate) struct Batch {
    serial: u64,
    /// The client (connection key, serial).
    conn: (usize, u64),
    stream: bool,
    /// The request's plan; each input's run is a copy with its stdin and args.
    plan: Box<ExecPlan>,
    inputs: Vec<Input>,
    /// The next input to start.
    next: usize,
    /// Inputs running now.
    running: usize,
    /// Most inputs running at once.
    width: usize,
    /// Each input's result object once it ended (in input order).
    results: Vec<Option<serde_json::Value>>,
    /// `warning` of the response (network asked for but not applied).
    warning: Option<&'static str>,
    /// The runs of its inputs, for cancelling.
    runs: Vec<(usize, u64)>,
    /// Runs paused because the client is behind.
    paused: bool,
    /// Every input in one sandbox, one after another (`"sharedSandbox": true`).
    shared: Option<Box<shared::Shared>>,
}

/// The sink of one input's run: its output and result go to the batch.
struct InputSink {
    batch: usize,
    serial: u64,
    index: usize,
    stream: bool,
}

impl Sink for InputSink {
    fn live(&self) -> bool {
        self.stream
    }

    fn output(&self, d: &mut Daemon, stream: Stream, text: &str) -> bool {
        d.batch_output(self.batch, self.serial, self.index, stream, text)
    }

    fn keepalive(&self, d: &mut Daemon) {
        if let Some(ck) = d.batch_client(self.batch, self.serial) {
            d.conn_send_comment(ck, "keep-alive");
        }
    }

    fn result(&self, d: &mut Daemon, body: ExecuteResponse, _: Ended) {
        let mut item = serde_json::to_value(&body.run).unwrap_or_default();
        if let Some(c) = &body.compile {
            item["compile"] = serde_json::to_value(c).unwrap_or_default();
        }
        d.batch_ended(
            self.batch,
            self.serial,
            self.index,
            item,
            body.warning,
            true,
        );
    }

    fn refused(&self, d: &mut Daemon, resp: Response) {
        // Its run had started: it held one of the batch's places.
        d.batch_refused(self.batch, self.serial, self.index, &resp, true);
    }
}

impl Daemon {
    /// Starts a many-input request on connection `ck`: refused as a run would be when
    /// no slot is free; otherwise its first inputs start.
    pub(crate) fn start_batch(
        &mut self,
        ck: usize,
        plan: Box<ExecPlan>,
        inputs: Vec<Input>,
        stream: bool,
        shared: bool,
    ) {
        if shared && self.box_init_missing() {
            // A shared sandbox is a long-lived one: refused before anything runs.
            let resp = Response::error(503, "unavailable", Some(super::boxes::INIT_MISSING));
            self.respond(ck, resp);
            return;
        }
        if !self.run_admit(ck) {
            return;
        }
        let Some(cs) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        let slots = &self.app.runs;
        let free = slots.max().saturating_sub(slots.used());
        let width = if shared {
            1
        } else {
            free.min((slots.max() / 2).max(1)).min(inputs.len()).max(1)
        };
        self.batch_serial += 1;
        let serial = self.batch_serial;
        let n = inputs.len();
        let key = self.batches.insert(Batch {
            serial,
            conn: (ck, cs),
            stream,
            plan,
            inputs,
            next: 0,
            running: 0,
            width,
            results: vec![None; n],
            warning: None,
            runs: Vec::new(),
            paused: false,
            shared: shared.then(Box::default),
        });
        self.conn_own(ck, Owner::Batch { batch: key, serial });
        if stream {
            self.conn_start_sse(ck);
        }
        if shared {
            log::info!("batch={serial} inputs={n} in one shared sandbox");
            self.shared_start(key, serial);
        } else {
            log::info!("batch={serial} inputs={n} width={width}");
            self.batch_fill(key, serial);
        }
    }

    /// Starts inputs while the batch has room and a slot is free.
    fn batch_fill(&mut self, key: usize, serial: u64) {
        loop {
            let Some(b) = self.batches.get(key).filter(|b| b.serial == serial) else {
                return;
            };
            if b.next >= b.inputs.len() || b.running >= b.width {
                break;
            }
            let (index, running) = (b.next, b.running);
            let slot_free = self.app.runs.used() < self.app.runs.max();
            if !slot_free || self.app.shutting_down {
                // No slot (the daemon is stopping, or taken since): the batch's next run
                // to end hands its slot on; with none running, this input is refused.
                if running > 0 {
                    break;
                }
                let Some(refusal) = self.admit_refusal() else {
                    break;
                };
                if let Some(b) = self.batches.get_mut(key) {
                    b.next += 1;
                }
                self.batch_refused(key, serial, index, &refusal, false);
                continue;
            }
            let Some(b) = self.batches.get(key) else {
                return;
            };
            let mut plan = b.plan.clone();
            plan.stdin = b.inputs[index].stdin.clone();
            plan.args = b.inputs[index].args.clone();
            let stream = b.stream;
            if let Some(b) = self.batches.get_mut(key) {
                b.next += 1;
                b.running += 1;
            }
            let sink: Rc<dyn Sink> = Rc::new(InputSink {
                batch: key,
                serial,
                index,
                stream,
            });
            match self.launch_run(plan, sink) {
                Some(rk) => {
                    let rs = self.runs.get(rk).map_or(0, |r| r.serial);
                    if let Some(b) = self.batches.get_mut(key) {
                        b.runs.push((rk, rs));
                    }
                }
                None => {
                    if let Some(b) = self.batches.get_mut(key) {
                        b.running -= 1;
                    }
                    let resp = Response::error(503, "overloaded", Some("worker queue full"));
                    self.batch_refused(key, serial, index, &resp, false);
                }
            }
        }
        self.batch_check_done(key, serial);
    }

    /// The batch's client connection, if it is still there.
    fn batch_client(&self, key: usize, serial: u64) -> Option<usize> {
        let (ck, cs) = self.batches.get(key).filter(|b| b.serial == serial)?.conn;
        self.conns
            .get(ck)
            .is_some_and(|c| c.serial == cs)
            .then_some(ck)
    }

    /// An input's output, as an SSE event with its index. True when the client is
    /// behind (the input's run pauses; `batch_resume` goes on).
    fn batch_output(
        &mut self,
        key: usize,
        serial: u64,
        index: usize,
        stream: Stream,
        text: &str,
    ) -> bool {
        let Some(ck) = self.batch_client(key, serial) else {
            return false;
        };
        let data = serde_json::json!({ "index": index, "chunk": text }).to_string();
        let full = self.conn_send_event(ck, stream.name(), &data);
        if full {
            if let Some(b) = self.batches.get_mut(key) {
                b.paused = true;
            }
        }
        full
    }

    /// The client drained: the batch's paused runs read again.
    pub(crate) fn batch_resume(&mut self, key: usize, serial: u64) {
        let Some(b) = self
            .batches
            .get_mut(key)
            .filter(|b| b.serial == serial && b.paused)
        else {
            return;
        };
        b.paused = false;
        for (rk, rs) in b.runs.clone() {
            if self.runs.get(rk).is_some_and(|r| r.serial == rs) {
                self.run_resume(rk);
            }
        }
        self.shared_release(key, serial);
    }

    /// Input `index` got no result: its entry is the refusal's `{"error", "detail"}`
    /// (`launched`: its run had started, and held one of the batch's places).
    fn batch_refused(
        &mut self,
        key: usize,
        serial: u64,
        index: usize,
        resp: &Response,
        launched: bool,
    ) {
        let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap_or_default();
        let item = serde_json::json!({ "error": v["error"], "detail": v["detail"] });
        self.batch_ended(key, serial, index, item, None, launched);
    }

    /// Input `index` ended with `item` (its `run` object, or its refusal).
    fn batch_ended(
        &mut self,
        key: usize,
        serial: u64,
        index: usize,
        item: serde_json::Value,
        warning: Option<&'static str>,
        launched: bool,
    ) {
        let Some(b) = self.batches.get_mut(key).filter(|b| b.serial == serial) else {
            return;
        };
        if launched {
            b.running = b.running.saturating_sub(1);
        }
        if warning.is_some() {
            b.warning = warning;
        }
        // The `result` event is the input's outcome without its output (which went out
        // as its `stdout`/`stderr` events): a few hundred bytes, whatever the output.
        let event = b.stream.then(|| without_output(&item, index));
        b.results[index] = Some(item);
        if let (Some(event), Some(ck)) = (event, self.batch_client(key, serial)) {
            self.conn_send_event(ck, "result", &event.to_string());
        }
        if launched {
            self.batch_fill(key, serial);
        } else {
            self.batch_check_done(key, serial);
        }
    }

    /// Answers once every input has its result.
    fn batch_check_done(&mut self, key: usize, serial: u64) {
        let Some(b) = self.batches.get(key).filter(|b| b.serial == serial) else {
            return;
        };
        if b.results.iter().any(Option::is_none) {
            return;
        }
        let b = self.batches.remove(key);
        if let Some(sh) = &b.shared {
            self.shared_finish(sh, &b.plan.runtime.desc.language);
        }
        // Outputs are escaped as the socket drains (`http/lazy.rs`): 64 inputs of
        // control bytes would be ~190 MB escaped at once.
        let mut lazy = crate::http::lazy::Deferred::new();
        let mut results: Vec<serde_json::Value> = b.results.into_iter().flatten().collect();
        for r in &mut results {
            for k in ["stdout", "stderr"] {
                if let Some(serde_json::Value::String(s)) = r.get_mut(k) {
                    lazy.take(s);
                }
                if let Some(serde_json::Value::String(s)) =
                    r.get_mut("compile").and_then(|c| c.get_mut(k))
                {
                    lazy.take(s);
                }
            }
        }
        let mut body = serde_json::json!({
            "language": b.plan.runtime.desc.language,
            "version": b.plan.runtime.version.clone().unwrap_or_default(),
            "backend": "gvisor",
            "results": results,
        });
        if let Some(w) = b.warning {
            body["warning"] = serde_json::json!(w);
        }
        if let Some(sh) = &b.shared {
            body["shared"] = serde_json::json!({"sandboxes": sh.sandboxes, "builds": sh.builds});
        }
        let (ck, cs) = b.conn;
        if self.conns.get(ck).is_none_or(|c| c.serial != cs) {
            return;
        }
        let body = lazy.body(&body);
        if b.stream {
            self.finish_stream_lazy(ck, body, None);
        } else {
            self.respond_lazy(ck, body);
        }
        self.conn_resume(ck);
    }

    /// The client left: every input still running is cancelled, none more starts.
    pub(crate) fn batch_cancel(&mut self, key: usize, serial: u64) {
        if self.batches.get(key).is_none_or(|b| b.serial != serial) {
            return;
        }
        let b = self.batches.remove(key);
        log::info!("batch={serial} cancelled: its client left");
        if let Some(sh) = &b.shared {
            self.shared_finish(sh, &b.plan.runtime.desc.language);
        }
        for (rk, rs) in b.runs {
            if self.runs.get(rk).is_some_and(|r| r.serial == rs) {
                self.run_cancel(rk);
            }
        }
    }
}

/// An input's entry without its outputs (its own and its build's), with its index.
fn without_output(item: &serde_json::Value, index: usize) -> serde_json::Value {
    type Map = serde_json::Map<String, serde_json::Value>;
    fn strip(o: &Map) -> Map {
        o.iter()
            .filter(|(k, _)| !matches!(k.as_str(), "stdout" | "stderr"))
            .map(|(k, v)| match (k.as_str(), v.as_object()) {
                ("compile", Some(c)) => (k.clone(), strip(c).into()),
                _ => (k.clone(), v.clone()),
            })
            .collect()
    }
    let mut event = item.as_object().map(strip).unwrap_or_default();
    event.insert("index".into(), index.into());
    event.into()
}

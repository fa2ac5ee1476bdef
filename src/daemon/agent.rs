//! The reactor's side of agent loops: starting one on a connection, forwarding its
//! frames to the client, running its tool steps in the session's kernel, and ending
//! its stream. Reactor thread only.

use super::conn::Owner;
use super::sink::Sink;
use super::Daemon;
use crate::agent::{AgentMsg, AgentStart, Loop, Outbox, StepReply};
use crate::http::Response;
use crate::reactor::{Addr, Component, ComponentId, Readiness};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A client this far behind on a loop's stream is dropped (the loop then stops): well
/// above the largest single frame (a `tool_result` with 8 artifacts of 2 MiB). A client
/// that reads nothing at all is dropped sooner, by the connection's write-stall timer.
const MAX_AGENT_BACKLOG_BYTES: usize = 64 << 20;

/// The agent component: its loops' keep-alive timers (key: the loop's connection).
pub(crate) const AGENT: ComponentId = ComponentId(5);
/// Timers: a loop's keep-alive comment (the generation is the loop's id).
const KEEPALIVE: u16 = 0;

/// Agent loops on the loop.
pub(crate) struct Agents;

impl Component<Daemon> for Agents {
    fn name(&self) -> &'static str {
        "agent"
    }

    fn ready(&self, _: &mut Daemon, _: usize, _: u16, _: Readiness) {}

    fn timer(&self, d: &mut Daemon, ck: usize, what: u16, id: u64) {
        if what == KEEPALIVE {
            d.agent_keepalive(ck, id);
        }
    }
}

/// A tool step's consumer: the loop's thread, waiting on a channel for the result.
struct AgentSink {
    reply: crossbeam_channel::Sender<StepReply>,
}

impl Sink for AgentSink {
    fn result(
        &self,
        _: &mut Daemon,
        body: crate::api::execute::ExecuteResponse,
        ended: super::sink::Ended,
    ) {
        let _ = self.reply.send(StepReply::Ran {
            result: Box::new(body),
            kernel_alive: ended.kernel_alive,
        });
    }

    fn refused(&self, _: &mut Daemon, resp: Response) {
        let _ = self.reply.send(StepReply::Refused(resp));
    }
}

impl Daemon {
    /// Starts a checked loop on connection `ck`: the SSE head goes out, the loop's
    /// thread starts. Past the cap of loops at once: 429.
    pub(crate) fn agent_start(&mut self, ck: usize, start: Box<AgentStart>) {
        let max = Self::agents_max(&self.cfg);
        if self.app.shutting_down {
            self.respond(
                ck,
                Response::error(503, "shutting_down", Some("isoboxd is shutting down"))
                    .with_header("Retry-After", "5"),
            );
            return;
        }
        // Loops are counted by their streams (one ends the moment its `done` is sent);
        // threads by the loops still on them (a cancelled one may be finishing a read).
        let live = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.owner(), Some(Owner::Agent { .. })))
            .count();
        if live >= max || self.agent.running.load(Ordering::Acquire) >= 2 * max {
            self.respond(
                ck,
                Response::error(
                    429,
                    "too_many_agents",
                    Some(&format!("{max} agent loops are running; retry shortly")),
                )
                .with_header("Retry-After", "5"),
            );
            return;
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let iterations = Arc::new(AtomicU32::new(0));
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        self.agent_serial += 1;
        let id = self.agent_serial;
        self.conn_own(
            ck,
            Owner::Agent {
                id,
                cancel: Arc::clone(&cancel),
                last_event: Instant::now(),
                iterations: Arc::clone(&iterations),
            },
        );
        self.conn_start_sse(ck);
        self.agent.running.fetch_add(1, Ordering::AcqRel);
        let lp = Loop {
            shared: Arc::clone(&self.agent),
            start,
            out: self.agent_outbox(ck, serial),
            cancel,
            iterations,
        };
        let handed = match &self.agent_threads {
            Some(t) => t.submit(lp).map_err(|lp| {
                // Never counted by a thread: uncount it here.
                lp.shared.running.fetch_sub(1, Ordering::AcqRel);
            }),
            None => {
                self.agent.running.fetch_sub(1, Ordering::AcqRel);
                Err(())
            }
        };
        if handed.is_err() {
            log::error!("conn={ck} op=start-agent err=no agent thread free");
            let frame = crate::agent::fail_frames("internal", "the agent could not start", 0);
            self.finish_stream(ck, &frame);
            self.conn_after_io(ck);
            return;
        }
        self.conn_flush(ck);
        let idle = Duration::from_millis(self.cfg.idle_timeout_ms);
        self.arm_conn(ck, idle);
        self.arm_agent_keepalive(ck, id);
    }

    /// Where the loop on connection `(ck, serial)` sends its messages: the reactor's
    /// mailbox, which wakes it.
    fn agent_outbox(&self, ck: usize, serial: u64) -> Outbox {
        let mailbox = self.reactor.mailbox();
        Outbox {
            deliver: Box::new(move |msg| {
                mailbox.send(Box::new(move |d: &mut Daemon| d.agent_msg(ck, serial, msg)))
            }),
            conn: (ck, serial),
        }
    }

    /// Loops at once: one per kernel slot (each drives its own kernel session).
    pub(crate) fn agents_max(cfg: &crate::config::Config) -> usize {
        cfg.kernels_max.max(1)
    }

    /// Whether `ck` is still the client of the loop that sent a message.
    fn agent_live(&self, ck: usize, serial: u64) -> bool {
        self.conns
            .get(ck)
            .is_some_and(|c| c.serial == serial && matches!(c.owner(), Some(Owner::Agent { .. })))
    }

    /// A message from a loop's thread.
    pub(crate) fn agent_msg(&mut self, ck: usize, serial: u64, msg: AgentMsg) {
        let live = self.agent_live(ck, serial);
        match msg {
            AgentMsg::Event(frame) if live => {
                self.conn_send_chunked(ck, &frame);
                if let Some(c) = self.conns.get_mut(ck) {
                    if let Some(Owner::Agent { last_event, .. }) = c.owner_mut() {
                        *last_event = Instant::now();
                    }
                    if c.http.pending_write() > MAX_AGENT_BACKLOG_BYTES {
                        crate::warn_limited!("conn={ck} agent client stopped reading; dropping");
                        self.close_conn(ck);
                        return;
                    }
                }
                self.conn_after_io(ck);
            }
            AgentMsg::End(frame) if live => {
                self.finish_stream(ck, &frame);
                self.conn_after_io(ck);
                self.conn_resume(ck);
            }
            AgentMsg::Event(_) | AgentMsg::End(_) => {}
            AgentMsg::Step {
                session,
                plan,
                code,
                reply,
            } => {
                if !live {
                    let _ = reply.send(StepReply::Refused(Response::error(
                        503,
                        "client_closed",
                        None,
                    )));
                    return;
                }
                let sink = AgentSink { reply };
                self.kernel_step(std::rc::Rc::new(sink), &session, plan, code);
            }
        }
    }

    fn arm_agent_keepalive(&mut self, ck: usize, id: u64) {
        let every = Duration::from_millis(self.cfg.sse_keepalive_ms);
        let Some(Owner::Agent { last_event, .. }) = self.conns.get(ck).and_then(|c| c.owner())
        else {
            return;
        };
        let at = *last_event + every;
        self.reactor.arm(at, Addr::new(AGENT, ck, KEEPALIVE), id);
    }

    /// A comment on a loop's stream when it has been silent a whole interval (the
    /// model thinking, a long tool step), so proxies keep it open.
    pub(crate) fn agent_keepalive(&mut self, ck: usize, id: u64) {
        // Only the loop that armed it: one pending timer per loop.
        let mine = matches!(
            self.conns.get(ck).and_then(|c| c.owner()),
            Some(Owner::Agent { id: i, .. }) if *i == id
        );
        if !mine {
            return;
        }
        let every = Duration::from_millis(self.cfg.sse_keepalive_ms);
        let silent = matches!(
            self.conns.get(ck).and_then(|c| c.owner()),
            Some(Owner::Agent { last_event, .. }) if last_event.elapsed() + Duration::from_millis(5) >= every
        );
        if silent {
            self.conn_send_comment(ck, "keep-alive");
            if let Some(Owner::Agent { last_event, .. }) =
                self.conns.get_mut(ck).and_then(|c| c.owner_mut())
            {
                *last_event = Instant::now();
            }
            self.conn_after_io(ck);
        }
        self.arm_agent_keepalive(ck, id);
    }
}

impl Daemon {
    /// At shutdown: every loop is told to stop and its stream ends now with
    /// `error: shutting_down` (a loop waiting on its model would otherwise hold the
    /// shutdown for the whole grace). A tool step already in a kernel ends with the runs.
    pub(crate) fn agent_stop_all(&mut self) {
        let loops: Vec<(usize, u32)> = self
            .conns
            .iter()
            .filter_map(|(ck, c)| match c.owner() {
                Some(Owner::Agent {
                    cancel, iterations, ..
                }) => {
                    cancel.store(true, Ordering::Relaxed);
                    Some((ck, iterations.load(Ordering::Relaxed)))
                }
                _ => None,
            })
            .collect();
        for (ck, n) in loops {
            let frame = crate::agent::fail_frames("shutting_down", "isoboxd is shutting down", n);
            self.finish_stream(ck, &frame);
            self.conn_after_io(ck);
        }
    }
}

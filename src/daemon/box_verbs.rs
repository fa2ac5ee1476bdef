//! Pausing, resuming and measuring long-lived sandboxes: the backend's `pause`,
//! `resume` and `stats` verbs on the pool, and the init's disk figures.
//!
//! A pause stops the whole sandbox (`runsc pause`): its memory stays, nothing in it
//! runs, its lifetime does not pass (what was left is kept and counted again from the
//! resume), and a command's time limit waits too. Commands cannot start while it is
//! paused (409).

use super::boxes::{now_ms, State, BOXES};
use super::conn::Owner;
use super::Daemon;
use crate::http::Response;
use crate::reactor::{Addr, Done};
use crate::sandbox::wire::{self, Call, Kind, Reply};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Timers: a metrics request's wait for the init's answer.
pub(super) const METRICS_DEADLINE: u16 = 2;
/// How long the init may take to give its disk figures.
const METRICS_TIMEOUT: Duration = Duration::from_secs(5);

/// A metrics request waiting for the init's disk figures.
pub(crate) struct MetricsWait {
    client: (usize, u64),
    gen: u64,
}

impl Daemon {
    /// The client `ck` is answered by a continuation: it waits (half-closed or not).
    pub(super) fn box_wait(&mut self, ck: usize, key: usize) -> Option<(usize, u64)> {
        let serial = self.boxes.boxes.get(key)?.serial;
        let cserial = self.conns.get(ck)?.serial;
        self.conn_own(
            ck,
            Owner::BoxWait {
                key,
                serial,
                create: false,
            },
        );
        Some((ck, cserial))
    }

    pub(super) fn box_answer(&mut self, client: (usize, u64), resp: Response) {
        let (ck, cserial) = client;
        if self.conns.get(ck).is_some_and(|c| c.serial == cserial) {
            self.respond(ck, resp);
            self.conn_resume(ck);
        }
    }

    fn wrong_state(&mut self, ck: usize, key: usize) {
        let b = &self.boxes.boxes[key];
        let msg = if b.verb_busy {
            "the sandbox is being paused or resumed".to_string()
        } else {
            format!("the sandbox is {}", b.state.name())
        };
        self.respond(ck, crate::wbx::error(409, &msg));
    }

    /// `POST …/pause`: a running sandbox stops.
    pub(super) fn box_pause(&mut self, ck: usize, key: usize) {
        let b = &self.boxes.boxes[key];
        if b.state != State::Running || b.verb_busy {
            self.wrong_state(ck, key);
            return;
        }
        let Some(client) = self.box_wait(ck, key) else {
            return;
        };
        let b = &mut self.boxes.boxes[key];
        // Paused from now for every client: no command starts meanwhile.
        b.state = State::Paused;
        b.verb_busy = true;
        b.remaining = b.deadline.saturating_duration_since(Instant::now());
        let (serial, container) = (b.serial, b.container.clone());
        let backend = Arc::clone(&self.backend);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let r = backend.pause(&container);
            Box::new(move |d: &mut Daemon| d.box_paused(key, serial, client, r))
        }));
    }

    fn box_paused(
        &mut self,
        key: usize,
        serial: u64,
        client: (usize, u64),
        r: Result<(), crate::sandbox::SandboxError>,
    ) {
        let Some(b) = self.boxes.boxes.get_mut(key).filter(|b| b.serial == serial) else {
            self.box_answer(client, crate::wbx::sandboxes::not_found());
            return;
        };
        b.verb_busy = false;
        if b.state != State::Paused {
            // Ended meanwhile.
            self.box_answer(client, crate::wbx::sandboxes::not_found());
            return;
        }
        match r {
            Ok(()) => {
                log::info!("sandbox={} paused", b.id);
                let v = self.box_json(&self.boxes.boxes[key]);
                self.box_answer(client, Response::json(200, &v));
            }
            Err(e) => {
                crate::error_limited!("sandbox={} op=pause err={e}", b.id);
                b.state = State::Running;
                b.deadline = Instant::now() + b.remaining;
                self.box_arm(key);
                self.box_answer(
                    client,
                    crate::wbx::error(502, "the sandbox could not be paused; see the daemon log"),
                );
            }
        }
    }

    /// `POST …/resume`: a paused sandbox continues, with the lifetime it had left.
    pub(super) fn box_resume_op(&mut self, ck: usize, key: usize) {
        let b = &self.boxes.boxes[key];
        if b.state != State::Paused || b.verb_busy {
            self.wrong_state(ck, key);
            return;
        }
        let Some(client) = self.box_wait(ck, key) else {
            return;
        };
        let b = &mut self.boxes.boxes[key];
        b.verb_busy = true;
        let (serial, container) = (b.serial, b.container.clone());
        let backend = Arc::clone(&self.backend);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let r = backend.resume(&container);
            Box::new(move |d: &mut Daemon| d.box_resumed(key, serial, client, r))
        }));
    }

    fn box_resumed(
        &mut self,
        key: usize,
        serial: u64,
        client: (usize, u64),
        r: Result<(), crate::sandbox::SandboxError>,
    ) {
        let Some(b) = self.boxes.boxes.get_mut(key).filter(|b| b.serial == serial) else {
            self.box_answer(client, crate::wbx::sandboxes::not_found());
            return;
        };
        b.verb_busy = false;
        if b.state != State::Paused {
            self.box_answer(client, crate::wbx::sandboxes::not_found());
            return;
        }
        match r {
            Ok(()) => {
                b.state = State::Running;
                b.deadline = Instant::now() + b.remaining;
                b.expires_ms =
                    now_ms() + u64::try_from(b.remaining.as_millis()).unwrap_or(u64::MAX);
                log::info!("sandbox={} resumed", b.id);
                self.box_arm(key);
                // What init said just before the pause, and commands' output since, is
                // read now (edge-triggered: it brings no new event).
                self.box_read(key);
                let v = self.box_json(&self.boxes.boxes[key]);
                self.box_answer(client, Response::json(200, &v));
            }
            Err(e) => {
                crate::error_limited!("sandbox={} op=resume err={e}", b.id);
                self.box_answer(
                    client,
                    crate::wbx::error(502, "the sandbox could not be resumed; see the daemon log"),
                );
            }
        }
    }

    /// `GET …/metrics`: CPU and memory from the sandbox's cgroup (on the pool), disk
    /// from its init (none while paused: nothing in it answers).
    pub(super) fn box_metrics(&mut self, ck: usize, key: usize) {
        let b = &self.boxes.boxes[key];
        match b.state {
            State::Paused => {
                let Some(client) = self.box_wait(ck, key) else {
                    return;
                };
                self.metrics_measure(key, client, serde_json::Value::Null);
            }
            State::Running => {
                let Some(client) = self.box_wait(ck, key) else {
                    return;
                };
                let b = &mut self.boxes.boxes[key];
                let call_id = b.take_call_id();
                let _ = wire::encode_json(&mut b.wbuf, Kind::Call, call_id, &Call::Disk {});
                let gen = self.reactor.arm_new(
                    Instant::now() + METRICS_TIMEOUT,
                    Addr::new(BOXES, key, METRICS_DEADLINE),
                );
                if let Some(b) = self.boxes.boxes.get_mut(key) {
                    b.metrics.insert(call_id, MetricsWait { client, gen });
                }
                self.box_flush(key);
            }
            _ => self.wrong_state(ck, key),
        }
    }

    /// init answered a call: true if it was a metrics request's.
    pub(super) fn metrics_reply(&mut self, key: usize, call_id: u32, payload: &[u8]) -> bool {
        let Some(w) = self
            .boxes
            .boxes
            .get_mut(key)
            .and_then(|b| b.metrics.remove(&call_id))
        else {
            return false;
        };
        let disk = match serde_json::from_slice::<Reply>(payload) {
            Ok(Reply::Ok(v)) => v,
            _ => serde_json::Value::Null,
        };
        self.metrics_measure(key, w.client, disk);
        true
    }

    /// A metrics request's wait for the init ran out: answered without disk figures.
    pub(super) fn metrics_deadline(&mut self, key: usize, gen: u64) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let Some(&call) = b
            .metrics
            .iter()
            .find(|(_, w)| w.gen == gen)
            .map(|(id, _)| id)
        else {
            return;
        };
        if let Some(w) = b.metrics.remove(&call) {
            self.metrics_measure(key, w.client, serde_json::Value::Null);
        }
    }

    /// Answers every waiting metrics request of sandbox `key` (it ended).
    pub(super) fn metrics_fail_all(&mut self, key: usize, status: u16, message: &str) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let waits: Vec<MetricsWait> = b.metrics.drain().map(|(_, w)| w).collect();
        for w in waits {
            self.box_answer(w.client, crate::wbx::error(status, message));
        }
    }

    /// Reads the cgroup on the pool, then answers with everything.
    fn metrics_measure(&mut self, key: usize, client: (usize, u64), disk: serde_json::Value) {
        let Some(b) = self.boxes.boxes.get(key) else {
            return;
        };
        let Some(cg) = b.cgroup.clone() else {
            self.box_answer(client, crate::wbx::error(409, "the sandbox is starting"));
            return;
        };
        let (alive, class) = (b.created_ms, b.class);
        let backend = Arc::clone(&self.backend);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let u = backend.stats(&cg);
            Box::new(move |d: &mut Daemon| {
                let body = crate::wbx::sandboxes::metrics_json(class, &u, alive, now_ms(), &disk);
                d.box_answer(client, Response::json(200, &body));
            })
        }));
    }
}

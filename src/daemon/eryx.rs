//! The eryx face's requests on the loop: a checked run goes to the WebAssembly engine
//! (`wasm::Engine`, a supervisor thread and its jailed worker) and its answer comes back
//! through the mailbox to the connection that asked, if it is still there. A tenant
//! has at most `ISOBOX_ERYX_CONCURRENCY` runs going: past that, 429 at once (the
//! document: requests do not queue). A client that leaves does not stop its run; the
//! run still counts until it ends.

use super::conn::Owner;
use super::Daemon;
use crate::eryx::{self, Route, Spec};
use crate::http::{Request, Response};
use crate::wasm::{Failure, RunAnswer, RunRequest};

impl Daemon {
    /// A complete request on the eryx face.
    pub(crate) fn eryx_request(&mut self, ck: usize, spec: &Spec, req: Request) {
        match spec.id {
            Route::Execute => self.eryx_execute(ck, req),
        }
    }

    fn eryx_execute(&mut self, ck: usize, req: Request) {
        if self.wasm.is_none() {
            self.respond(
                ck,
                eryx::error(
                    503,
                    "unavailable",
                    "Python in WebAssembly is off on this server (ISOBOX_WASM_WORKER=off)",
                ),
            );
            return;
        }
        let limits = eryx::Limits {
            timeout_ms: self.cfg.eryx.timeout_ms,
            fuel: self.cfg.eryx.fuel_limit,
        };
        let ex = match eryx::parse_execute(&req, limits) {
            Ok(ex) => ex,
            Err(resp) => {
                self.respond(ck, resp);
                return;
            }
        };
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        let limit = self.cfg.eryx.concurrency;
        let running = self.eryx_running.entry(req.tenant.clone()).or_default();
        if *running >= limit {
            self.respond(
                ck,
                eryx::error(
                    429,
                    "concurrency_limit",
                    &format!("Too many concurrent executions (limit: {limit})"),
                ),
            );
            return;
        }
        *running += 1;
        self.conn_own(ck, Owner::Job);
        let mailbox = self.reactor.mailbox();
        let tenant = req.tenant;
        let Some(engine) = &self.wasm else {
            return;
        };
        engine.run(
            RunRequest {
                code: ex.code,
                timeout_ms: ex.timeout_ms,
                fuel: ex.fuel,
                memory_bytes: self.cfg.eryx.memory_bytes,
            },
            Box::new(move |res| {
                mailbox.send(Box::new(move |d: &mut Daemon| {
                    d.eryx_answer(ck, serial, &tenant, res);
                }));
            }),
        );
    }

    /// A run's end: its tenant's count goes down, and its client, if still there, gets
    /// the answer.
    fn eryx_answer(
        &mut self,
        ck: usize,
        serial: u64,
        tenant: &str,
        res: Result<RunAnswer, Failure>,
    ) {
        if let Some(n) = self.eryx_running.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.eryx_running.remove(tenant);
            }
        }
        if !self.conn_waiting(ck, serial, false) {
            return;
        }
        let resp = match res {
            Ok(a) => Response::json(200, &eryx::run_json(&a)),
            Err(Failure::Unavailable(m)) => eryx::error(503, "unavailable", &m),
            Err(e @ Failure::Crashed(_)) => eryx::error(500, "internal_error", &e.to_string()),
        };
        self.respond(ck, resp);
        self.conn_pump(ck);
    }
}

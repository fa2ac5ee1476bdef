//! The eryx face's sessions on the loop (`/eryx/v1/sessions`): Python state kept
//! between runs. The loop keeps every session's record in a map (who owns it, its
//! environment and expiry, whether a run is going in it), mirrored in LMDB
//! (`store::eryx`); the state itself, up to 1 MB a session, lives only in LMDB and is
//! read on the pool when a run starts.
//!
//! A run in a session: checked here (the tenant's, unexpired, not busy: 409
//! `session_busy`; the environment its own), its state read on the pool, the run
//! started with it; the worker restores it before the code and answers the state to
//! keep after it. That state and the session's new expiry are written in one durable
//! transaction before the client gets its answer, and the session stays busy until
//! then, so the next run always starts from the last one's state. A session deleted
//! during a run is not brought back by it. Expired sessions are deleted by the
//! housekeeping sweep; a restart loads the records again (state and all).

use super::Daemon;
use crate::api::Outcome;
use crate::eryx::{self, Execute, Rejection};
use crate::http::{Request, Response};
use crate::store::eryx::EryxSessionRecord;
use crate::wasm::{CallSink, Failure, Reply, RunAnswer};
use crate::workspace::now_ms;
use std::collections::HashMap;
use std::sync::Arc;

/// A session as the loop knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EryxSession {
    /// Owning tenant.
    pub tenant: String,
    /// The environment its runs use.
    pub environment: String,
    /// Idle time after a run before it expires.
    pub ttl_secs: u64,
    /// When it expires, Unix milliseconds.
    pub expires_at_ms: u64,
    /// A run is starting or going in it (until its state is durable).
    pub busy: bool,
    /// Its delete is being written: gone for every request, kept here until the
    /// delete is durable (if it fails, the session is still there, busy or not).
    pub deleting: bool,
}

/// Sessions by id.
pub type Registry = HashMap<String, EryxSession>;

/// What a session run's starter is told: the run's id, or why it did not start.
pub(crate) type Started = Box<dyn FnOnce(&mut Daemon, Result<u64, Rejection>) + Send>;

/// The registry as the store holds it (at start; expired sessions go at the first
/// sweep).
pub fn load(store: &crate::store::Store) -> Registry {
    match store.eryx_sessions() {
        Ok(all) => all
            .into_iter()
            .map(|(id, r)| {
                let s = EryxSession {
                    tenant: r.tenant,
                    environment: r.environment,
                    ttl_secs: r.ttl_secs,
                    expires_at_ms: r.expires_at_ms,
                    busy: false,
                    deleting: false,
                };
                (id, s)
            })
            .collect(),
        Err(e) => {
            log::error!("eryx sessions: reading the store: {e}");
            Registry::new()
        }
    }
}

impl Daemon {
    /// `POST /v1/sessions`.
    pub(crate) fn eryx_session_create(&mut self, ck: usize, req: &Request) {
        let new = match eryx::parse_new_session(req) {
            Ok(n) => n,
            Err(resp) => {
                self.respond(ck, resp);
                return;
            }
        };
        if !self.eryx_env_exists(&req.tenant, &new.environment) {
            self.respond(
                ck,
                super::eryx_envs::no_environment(&new.environment).response(),
            );
            return;
        }
        let now = now_ms();
        let limit = self.cfg.eryx.sessions;
        let live = self
            .eryx_sessions
            .values()
            .filter(|s| s.tenant == req.tenant && s.expires_at_ms > now && !s.deleting)
            .count();
        if live >= limit {
            self.respond(
                ck,
                eryx::error(
                    429,
                    "session_limit",
                    &format!("Your org already has {live} unexpired sessions (limit: {limit})"),
                ),
            );
            return;
        }
        let Some(id) = eryx::new_session_id() else {
            self.respond(
                ck,
                eryx::error(500, "internal_error", "No random bytes for a session id"),
            );
            return;
        };
        let rec = EryxSessionRecord {
            tenant: req.tenant.clone(),
            environment: new.environment,
            ttl_secs: new.ttl_secs,
            created_at_ms: now,
            expires_at_ms: now.saturating_add(new.ttl_secs.saturating_mul(1000)),
        };
        // In the map at once, so the tenant's count holds while the write is durable.
        self.eryx_sessions.insert(
            id.clone(),
            EryxSession {
                tenant: rec.tenant.clone(),
                environment: rec.environment.clone(),
                ttl_secs: rec.ttl_secs,
                expires_at_ms: rec.expires_at_ms,
                busy: false,
                deleting: false,
            },
        );
        let body = eryx::session_json(&id, &rec.environment, rec.ttl_secs, rec.expires_at_ms);
        let tenant = rec.tenant.clone();
        self.eryx_later(ck, move |d, serial| {
            let mailbox = d.reactor.mailbox();
            d.app
                .sessions
                .store()
                .insert_eryx_session_then(&id.clone(), &rec, move |r| {
                    mailbox.send(Box::new(move |d: &mut Daemon| {
                        let resp = match r {
                            Ok(true) => {
                                log::info!("eryx session {id} created tenant={tenant}");
                                Response::json(201, &body)
                            }
                            Ok(false) | Err(_) => {
                                if let Err(e) = r {
                                    log::error!("eryx session {id}: storing it: {e}");
                                }
                                d.eryx_sessions.remove(&id);
                                store_refusal()
                            }
                        };
                        d.on_outcome(ck, serial, Outcome::Respond(resp));
                    }));
                });
        });
    }

    /// `DELETE /v1/sessions/{id}`: 204 once it is gone for good. A run going in it
    /// goes on; its state is not kept.
    pub(crate) fn eryx_session_delete(&mut self, ck: usize, req: &Request) {
        let id = req.params.get("id").unwrap_or_default().to_string();
        if self.eryx_session_of(&req.tenant, &id).is_none() {
            self.respond(ck, eryx::no_session(&id).response());
            return;
        }
        if let Some(s) = self.eryx_sessions.get_mut(&id) {
            s.deleting = true;
        }
        self.eryx_later(ck, move |d, serial| {
            let mailbox = d.reactor.mailbox();
            d.app
                .sessions
                .store()
                .delete_eryx_sessions_then(vec![id.clone()], move |r| {
                    mailbox.send(Box::new(move |d: &mut Daemon| {
                        let resp = match r {
                            Ok(_) => {
                                log::info!("eryx session {id} deleted");
                                d.eryx_sessions.remove(&id);
                                Response::no_content()
                            }
                            Err(e) => {
                                log::error!("eryx session {id}: deleting it: {e}");
                                // Still there: it stays usable (a run going in it
                                // keeps it busy until it ends, as before).
                                if let Some(s) = d.eryx_sessions.get_mut(&id) {
                                    s.deleting = false;
                                }
                                store_refusal()
                            }
                        };
                        d.on_outcome(ck, serial, Outcome::Respond(resp));
                    }));
                });
        });
    }

    /// `POST /v1/sessions/{id}/execute`.
    pub(crate) fn eryx_session_execute(&mut self, ck: usize, req: &Request) {
        if let Some(resp) = self.eryx_off() {
            self.respond(ck, resp);
            return;
        }
        let mut ex = match eryx::parse_execute(req, self.eryx_limits()) {
            Ok(ex) => ex,
            Err(resp) => {
                self.respond(ck, resp);
                return;
            }
        };
        ex.session_id = req.params.get("id").map(str::to_string);
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        let mailbox = self.reactor.mailbox();
        let tenant = req.tenant.clone();
        let t = tenant.clone();
        let refused = self.eryx_session_run(
            &tenant,
            ex,
            Box::new(move |res| {
                mailbox.send(Box::new(move |d: &mut Daemon| {
                    d.eryx_answer(ck, serial, &t, res);
                }));
            }),
            None,
            Box::new(move |d, started| {
                if let Err(r) = started {
                    d.on_outcome(ck, serial, Outcome::Respond(r.response()));
                }
            }),
        );
        match refused {
            Ok(()) => self.conn_own(ck, super::conn::Owner::Job),
            Err(r) => self.respond(ck, r.response()),
        }
    }

    /// The tenant's unexpired session `id`.
    fn eryx_session_of(&self, tenant: &str, id: &str) -> Option<&EryxSession> {
        let now = now_ms();
        self.eryx_sessions
            .get(id)
            .filter(|s| s.tenant == tenant && s.expires_at_ms > now && !s.deleting)
    }

    /// Starts a checked run in its session (`ex.session_id`), for either face: the
    /// session must be the tenant's and unexpired (404), idle (409 `session_busy`), of
    /// the environment the run names (422), and the tenant under its concurrency
    /// limit (429). Refused at once, or accepted: then, once its state is read,
    /// `started` is told the run's id or why it did not start after all, and `reply`
    /// gets the run's answer once the state it leaves is durable.
    ///
    /// # Errors
    /// The refusal, before anything started.
    pub(crate) fn eryx_session_run(
        &mut self,
        tenant: &str,
        ex: Execute,
        reply: Reply,
        calls: Option<CallSink>,
        started: Started,
    ) -> Result<(), Rejection> {
        let sid = ex.session_id.clone().unwrap_or_default();
        let checked = match self.eryx_session_of(tenant, &sid) {
            None => Err(eryx::no_session(&sid)),
            Some(s) if s.busy => Err(Rejection::new(
                409,
                "session_busy",
                "Another run is going in this session",
            )),
            Some(s) => ex
                .check_environment(&s.environment)
                .map(|()| s.environment.clone()),
        }
        .and_then(|env| self.eryx_env_for_run(tenant, &env))
        .and_then(|env| self.eryx_room(tenant).map(|()| env));
        let mut ex = ex;
        ex.env = checked?;
        if let Some(s) = self.eryx_sessions.get_mut(&sid) {
            s.busy = true;
        }
        // Counted from here, its state's read included: a tenant has at most its
        // concurrency limit of runs starting or going.
        *self.eryx_running.entry(tenant.to_string()).or_default() += 1;
        let sessions = Arc::clone(&self.app.sessions);
        let tenant = tenant.to_string();
        let id = sid.clone();
        let job = Box::new(move || -> crate::reactor::Done<Daemon> {
            let state = sessions.store().eryx_state(&id);
            Box::new(move |d: &mut Daemon| {
                d.eryx_session_loaded(&tenant, ex, state, reply, calls, started);
            })
        });
        // Must run: the session is busy until it does (a tenant has at most its
        // concurrency limit of these waiting).
        self.reactor.submit_must(job);
        Ok(())
    }

    /// A session run's state is read: the run starts with it.
    fn eryx_session_loaded(
        &mut self,
        tenant: &str,
        ex: Execute,
        state: Result<Option<Vec<u8>>, crate::store::StoreError>,
        reply: Reply,
        calls: Option<CallSink>,
        started: Started,
    ) {
        let sid = ex.session_id.clone().unwrap_or_default();
        let free = |d: &mut Daemon| {
            if let Some(s) = d.eryx_sessions.get_mut(&sid) {
                s.busy = false;
            }
        };
        if self.eryx_sessions.get(&sid).is_none_or(|s| s.deleting) {
            // Deleted while its state was read.
            free(self);
            self.eryx_uncount(tenant);
            started(self, Err(eryx::no_session(&sid)));
            return;
        }
        let state = match state {
            Ok(s) => s,
            Err(e) => {
                log::error!("eryx session {sid}: reading its state: {e}");
                free(self);
                self.eryx_uncount(tenant);
                started(
                    self,
                    Err(Rejection::new(
                        500,
                        "internal_error",
                        "The session's state could not be read",
                    )),
                );
                return;
            }
        };
        let mailbox = self.reactor.mailbox();
        let id = sid.clone();
        let wrapped: Reply = Box::new(move |res| {
            mailbox.send(Box::new(move |d: &mut Daemon| {
                d.eryx_session_ran(id, res, reply);
            }));
        });
        match self.eryx_launch(tenant, ex, Some(state), wrapped, calls) {
            Ok(run) => started(self, Ok(run)),
            Err(r) => {
                free(self);
                started(self, Err(r));
            }
        }
    }

    /// A session run ended: the state it leaves and the session's new expiry are made
    /// durable, then its client is answered and the session is free again.
    fn eryx_session_ran(&mut self, sid: String, res: Result<RunAnswer, Failure>, reply: Reply) {
        let now = now_ms();
        let Some(s) = self.eryx_sessions.get_mut(&sid).filter(|s| !s.deleting) else {
            // Deleted (or being deleted) during the run: answered as it is; nothing
            // is kept.
            if let Some(s) = self.eryx_sessions.get_mut(&sid) {
                s.busy = false;
            }
            reply(res.map(|mut a| {
                a.state = None;
                a
            }));
            return;
        };
        let expires = now.saturating_add(s.ttl_secs.saturating_mul(1000));
        s.expires_at_ms = expires;
        let (bytes, mut res) = match res {
            Ok(mut a) => (a.state.take(), Ok(a)),
            Err(f) => (None, Err(f)),
        };
        let mailbox = self.reactor.mailbox();
        self.app
            .sessions
            .store()
            .keep_eryx_run_then(&sid.clone(), expires, bytes, move |r| {
                mailbox.send(Box::new(move |d: &mut Daemon| {
                    if let Some(s) = d.eryx_sessions.get_mut(&sid) {
                        s.busy = false;
                    }
                    if let Err(e) = r {
                        log::error!("eryx session {sid}: storing its state: {e}");
                        res = Err(Failure::Lost(
                            "The session's state could not be stored; the run's changes were not kept"
                                .into(),
                        ));
                    }
                    reply(res);
                }));
            });
    }

    /// Deletes sessions past their expiry that no run holds (housekeeping).
    pub(crate) fn eryx_sessions_sweep(&mut self) {
        let now = now_ms();
        let gone: Vec<String> = self
            .eryx_sessions
            .iter()
            .filter(|(_, s)| !s.busy && !s.deleting && s.expires_at_ms <= now)
            .map(|(id, _)| id.clone())
            .collect();
        if gone.is_empty() {
            return;
        }
        for id in &gone {
            self.eryx_sessions.remove(id);
        }
        let n = gone.len();
        self.app
            .sessions
            .store()
            .delete_eryx_sessions_then(gone, move |r| match r {
                Ok(_) => log::info!("eryx sessions: {n} expired, deleted"),
                Err(e) => log::error!("eryx sessions: deleting {n} expired: {e}"),
            });
    }

    /// Runs `f` with the connection waiting for its answer (a store write that answers
    /// through the mailbox; `serial` tells `on_outcome` it is still the one).
    fn eryx_later(&mut self, ck: usize, f: impl FnOnce(&mut Daemon, u64)) {
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        self.conn_own(ck, super::conn::Owner::Job);
        f(self, serial);
    }
}

/// The answer when the store refused a session's write.
fn store_refusal() -> Response {
    eryx::error(
        503,
        "unavailable",
        "The session store is busy; retry shortly",
    )
}

//! Batches on the job queue (`/v1/batches…`): a batch's jobs are ordinary jobs of the
//! queue that carry their batch's id, its index, and the ids of the jobs of it they
//! wait for. The queue starts one only when each of those has completed and fewer
//! than the batch's `max_concurrency` of its jobs are running; a job whose dependency
//! ended any other way is cancelled with `dependency_failed` (and so on down the
//! graph). When the last job's end is written, the batch's end is written with its
//! `batch.finished` event in one transaction.
//!
//! Everything here is on the loop but the reads, which go to the pool with the live
//! records of the batch's jobs taken along (fresher than the store's).

use super::*;
use crate::store::batches::{BatchRecord, BatchSubmitted};
use crate::wbx::batches::{self as wb, BatchSubmit};

/// A batch whose jobs have not all ended.
pub(crate) struct LiveBatch {
    pub(super) rec: BatchRecord,
    /// Its jobs whose end is written, with the state they ended in.
    pub(super) ended: HashMap<String, String>,
    /// Its end is being written.
    pub(super) ending: bool,
}

/// A batch as read: its record, and each job's (`None`: past its retention).
type View = (BatchRecord, Vec<(String, Option<JobRecord>)>);

/// The live batches among `batches`, with what the jobs' records say has ended (a job
/// whose record is gone counts as failed: it cannot complete any more).
pub(super) fn load_batches(
    batches: Vec<(String, BatchRecord)>,
    ended: &HashMap<String, String>,
    live: &HashSet<String>,
) -> HashMap<String, LiveBatch> {
    batches
        .into_iter()
        .filter(|(_, b)| b.status == "running")
        .map(|(id, rec)| {
            let ended = rec
                .jobs
                .iter()
                .filter(|j| !live.contains(*j))
                .map(|j| {
                    let s = ended.get(j).cloned().unwrap_or_else(|| "failed".into());
                    (j.clone(), s)
                })
                .collect();
            let b = LiveBatch {
                rec,
                ended,
                ending: false,
            };
            (id, b)
        })
        .collect()
}

impl Daemon {
    /// `POST /v1/batches`: checked as a whole (each job as `POST /v1/jobs` checks it,
    /// the sum of their worst cases against `max_total_cost` and the budget), then
    /// stored as a whole, then queued.
    pub(super) fn job_batch_submit(&mut self, ck: usize, tenant: String, b: BatchSubmit) {
        let Some(serial) = self.submit_begin(ck) else {
            return;
        };
        let Some(key) = b.idempotency_key.clone() else {
            self.job_batch_submit_checked(ck, serial, tenant, b);
            return;
        };
        // A resend of an accepted batch is that batch, whatever the limits and the
        // budget say now (its own jobs count in them): looked up before they are
        // checked, as a job's key is.
        let sessions = Arc::clone(&self.app.sessions);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let found = sessions.store().batch_by_idempotency_key(&tenant, &key);
            Box::new(move |d: &mut Daemon| match found {
                Ok(Some(eid)) => d.answer_batch(ck, serial, tenant, eid, 202),
                Ok(None) => d.job_batch_submit_checked(ck, serial, tenant, b),
                Err(e) => {
                    log::error!("jobs: looking up a batch's idempotency key: {e}");
                    d.on_outcome(ck, serial, Outcome::Respond(store_refusal()));
                }
            })
        }));
    }

    /// Answers request `(ck, serial)` with batch `id` as it is now, with `status`
    /// (a resent submit's 202, a cancel's 200).
    fn answer_batch(&mut self, ck: usize, serial: u64, tenant: String, id: String, status: u16) {
        self.job_batch_view(tenant, id.clone(), move |d, v| {
            let resp = match v {
                Ok(Some((rec, jobs))) => {
                    let prices = d.prices();
                    let body = wb::summary_json(&id, &rec, &jobs, &prices, now_ms());
                    Response::json(status, &body)
                }
                Ok(None) => wb::not_found(),
                Err(_) => store_refusal(),
            };
            d.on_outcome(ck, serial, Outcome::Respond(resp));
        });
    }

    /// A batch without a known idempotency key: checked, then stored whole.
    fn job_batch_submit_checked(&mut self, ck: usize, serial: u64, tenant: String, b: BatchSubmit) {
        let answer =
            |d: &mut Daemon, resp: Response| d.on_outcome(ck, serial, Outcome::Respond(resp));
        let n = b.jobs.len();
        if let Some(resp) = self.job_admission(&tenant, n) {
            answer(self, resp);
            return;
        }
        let prices = self.prices();
        let mut b = b;
        for (i, (s, _)) in b.jobs.iter_mut().enumerate() {
            if let Err(c) = self.job_class(&tenant, &mut s.spec, &prices) {
                let field = format!("jobs[{i}].compute_class");
                answer(self, crate::wbx::compute::not_offered(&field, &c));
                return;
            }
        }
        let mut total = 0i128;
        for (i, (s, _)) in b.jobs.iter().enumerate() {
            let worst = worst_case(&s.spec, &prices);
            if let Some(why) = max_cost_refusal(&s.spec, worst, &prices) {
                answer(self, crate::wbx::error(400, &format!("jobs[{i}].{why}")));
                return;
            }
            total = total.saturating_add(worst);
        }
        if let Some(max) = b.max_total_cost {
            if total > max {
                let why = format!(
                    "max_total_cost: the batch's {n} jobs could cost up to {} together (each job's worst case: every attempt for its whole time limit and a {RESERVE_S} s reserve each), over {}; lower their timeout_s or raise max_total_cost",
                    prices.show(crate::jobs::Money(total)),
                    prices.show(crate::jobs::Money(max))
                );
                answer(self, crate::wbx::error(400, &why));
                return;
            }
        }
        if let Some(why) = self.budget_refusal(&tenant, total) {
            answer(self, crate::wbx::error(402, &why));
            return;
        }
        let random = || super::super::boxes::random_hex();
        let Some(bid) = random().map(|h| format!("bat_{h}")) else {
            answer(
                self,
                crate::wbx::error(503, "the system's random source failed; retry"),
            );
            return;
        };
        let Some(ids) = (0..n)
            .map(|_| random().map(|h| format!("job_{h}")))
            .collect::<Option<Vec<String>>>()
        else {
            answer(
                self,
                crate::wbx::error(503, "the system's random source failed; retry"),
            );
            return;
        };
        let now = now_ms();
        let mut jobs = Vec::with_capacity(n);
        for (i, (s, deps)) in b.jobs.into_iter().enumerate() {
            let (key, sealed) = if s.env.is_empty() {
                (None, None)
            } else {
                match crate::jobs::seal(&s.env) {
                    Ok((k, sealed)) => (Some(k), Some(sealed)),
                    Err(e) => {
                        log::error!("jobs: sealing env values: {e}");
                        answer(self, store_refusal());
                        return;
                    }
                }
            };
            let mut spec = s.spec;
            for input in &mut spec.inputs {
                if let Some(x) = input.from_index {
                    input.job_id.clone_from(&ids[x as usize]);
                }
            }
            let rec = JobRecord {
                tenant: tenant.clone(),
                status: "queued".into(),
                spec,
                sealed_env: sealed,
                created_ms: now,
                batch: Some(bid.clone()),
                batch_index: i as u32,
                depends_on: deps.iter().map(|&d| ids[d].clone()).collect(),
                ..JobRecord::default()
            };
            jobs.push((ids[i].clone(), rec, key));
        }
        let rec = BatchRecord {
            tenant: tenant.clone(),
            name: b.name,
            jobs: ids,
            max_concurrency: b.max_concurrency,
            max_total_cost: b.max_total_cost,
            idempotency_key: b.idempotency_key,
            webhook_url: b.webhook_url,
            created_ms: now,
            status: "running".into(),
            ..BatchRecord::default()
        };
        self.jobs.pending_add(&tenant, n, total);
        let mailbox = self.reactor.mailbox();
        self.app
            .sessions
            .store()
            .submit_batch_then(&bid.clone(), rec, jobs, move |r| {
                mailbox.send(Box::new(move |d: &mut Daemon| {
                    d.jobs.pending_done(&tenant, n, total);
                    match r {
                        Ok(BatchSubmitted::New(rec, stored)) => {
                            log::info!(
                                "batch {bid} accepted tenant={tenant} jobs={}",
                                stored.len()
                            );
                            let prices = d.prices();
                            let view: Vec<(String, Option<JobRecord>)> = rec
                                .jobs
                                .iter()
                                .cloned()
                                .zip(stored.iter().cloned().map(Some))
                                .collect();
                            let body = wb::summary_json(&bid, &rec, &view, &prices, now_ms());
                            for (jid, jrec) in rec.jobs.iter().zip(stored) {
                                d.jobs.serial += 1;
                                let key = d.jobs.live.insert(Live::new(
                                    d.jobs.serial,
                                    jid.clone(),
                                    jrec,
                                    Vec::new(),
                                ));
                                d.jobs.by_id.insert(jid.clone(), key);
                                d.jobs.queue.push_back(key);
                            }
                            d.jobs.batches.insert(
                                bid,
                                LiveBatch {
                                    rec: *rec,
                                    ended: HashMap::new(),
                                    ending: false,
                                },
                            );
                            d.job_pump();
                            d.on_outcome(ck, serial, Outcome::Respond(Response::json(202, &body)));
                        }
                        // The same key: the same batch, as it is now.
                        Ok(BatchSubmitted::Existing(eid, _)) => {
                            d.answer_batch(ck, serial, tenant, eid, 202);
                        }
                        Ok(BatchSubmitted::Refused(why)) => {
                            d.on_outcome(ck, serial, Outcome::Respond(crate::wbx::error(400, &why)))
                        }
                        Err(e) => {
                            log::error!("jobs: storing batch {bid}: {e}");
                            d.on_outcome(ck, serial, Outcome::Respond(store_refusal()));
                        }
                    }
                }));
            });
    }

    /// Reads batch `bid` of `tenant` with its jobs (on the pool; live records taken
    /// along), then `then` on the loop with it (`Ok(None)`: not the tenant's, or not
    /// at all).
    pub(super) fn job_batch_view(
        &mut self,
        tenant: String,
        bid: String,
        then: impl FnOnce(&mut Daemon, Result<Option<View>, String>) + Send + 'static,
    ) {
        let live_batch = self.jobs.batches.get(&bid).map(|b| b.rec.clone());
        let mut live_jobs: HashMap<String, JobRecord> = HashMap::new();
        if let Some(rec) = &live_batch {
            for jid in &rec.jobs {
                if let Some(j) = self
                    .jobs
                    .by_id
                    .get(jid)
                    .and_then(|&k| self.jobs.live.get(k))
                {
                    live_jobs.insert(jid.clone(), j.rec.clone());
                }
            }
        }
        let sessions = Arc::clone(&self.app.sessions);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let store = sessions.store();
            let read = || -> Result<Option<View>, crate::store::StoreError> {
                let rec = match live_batch {
                    Some(r) => Some(r),
                    None => store.batch(&bid)?,
                };
                let Some(rec) = rec.filter(|r| r.tenant == tenant) else {
                    return Ok(None);
                };
                let mut jobs = Vec::with_capacity(rec.jobs.len());
                for jid in &rec.jobs {
                    let r = match live_jobs.remove(jid) {
                        Some(r) => Some(r),
                        None => store.job(jid)?,
                    };
                    jobs.push((jid.clone(), r));
                }
                Ok(Some((rec, jobs)))
            };
            let r = read().map_err(|e| {
                log::error!("jobs: reading batch {bid}: {e}");
                e.to_string()
            });
            Box::new(move |d: &mut Daemon| then(d, r))
        }));
    }

    /// `GET /v1/batches/{id}` and `…/report`.
    pub(super) fn job_batch_read(
        &mut self,
        ck: usize,
        tenant: String,
        id: String,
        report: Option<bool>,
    ) {
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        self.conn_own(ck, Owner::Job);
        self.job_batch_view(tenant, id.clone(), move |d, v| {
            let prices = d.prices();
            let now = now_ms();
            let resp = match (v, report) {
                (Ok(Some((rec, jobs))), None) => {
                    Response::json(200, &wb::summary_json(&id, &rec, &jobs, &prices, now))
                }
                (Ok(Some((rec, jobs))), Some(false)) => {
                    Response::json(200, &wb::report_json(&id, &rec, &jobs, &prices, now))
                }
                (Ok(Some((_, jobs))), Some(true)) => {
                    let csv = wb::report_csv(&jobs, &prices, now).into_bytes();
                    Response::bytes(200, "text/csv; charset=utf-8", csv).with_header(
                        "Content-Disposition",
                        format!("attachment; filename=\"{id}.csv\""),
                    )
                }
                (Ok(None), _) => wb::not_found(),
                (Err(_), _) => store_refusal(),
            };
            d.on_outcome(ck, serial, Outcome::Respond(resp));
        });
    }

    /// `POST /v1/batches/{id}/cancel`: its record says so (durably) and every job of
    /// it that has not finished is cancelled; the answer is its summary then.
    pub(super) fn job_batch_cancel(&mut self, ck: usize, tenant: String, id: String) {
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        if self
            .jobs
            .batches
            .get(&id)
            .is_none_or(|b| b.rec.tenant != tenant)
        {
            // Not live: finished, or not there.
            self.conn_own(ck, Owner::Job);
            self.job_batch_view(tenant, id, move |d, v| {
                let resp = match v {
                    Ok(Some((rec, _))) => crate::wbx::error(
                        409,
                        &format!("the batch has already finished ({})", rec.status),
                    ),
                    Ok(None) => wb::not_found(),
                    Err(_) => store_refusal(),
                };
                d.on_outcome(ck, serial, Outcome::Respond(resp));
            });
            return;
        };
        self.conn_own(ck, Owner::Job);
        let Some(b) = self.jobs.batches.get_mut(&id) else {
            return;
        };
        if b.ending {
            // Every job has ended; its end is being written.
            let resp = crate::wbx::error(
                409,
                "the batch has already finished (its end is being written)",
            );
            self.on_outcome(ck, serial, Outcome::Respond(resp));
            return;
        }
        b.rec.cancelled = true;
        let rec = b.rec.clone();
        log::info!("batch {id} cancelled by its tenant");
        for jid in &rec.jobs {
            if let Some(&jk) = self.jobs.by_id.get(jid) {
                let e = JobError {
                    code: "cancelled".into(),
                    message: format!(
                        "cancelled with its batch {id} (POST /v1/batches/{{id}}/cancel)"
                    ),
                    kind: "job".into(),
                };
                self.job_cancel_quietly(jk, e, "its batch was cancelled");
            }
        }
        let mailbox = self.reactor.mailbox();
        self.app
            .sessions
            .store()
            .put_batch_then(&id.clone(), &rec, None, move |r| {
                mailbox.send(Box::new(move |d: &mut Daemon| {
                    if let Err(e) = r {
                        log::error!("jobs: writing the cancel of batch {id}: {e}");
                        d.on_outcome(ck, serial, Outcome::Respond(store_refusal()));
                        return;
                    }
                    d.answer_batch(ck, serial, tenant, id, 200);
                }));
            });
    }

    /// Job `jid` of batch `bid` has its end written, as `status`: its dependants go
    /// if it did not complete, and the batch ends with its last job.
    pub(super) fn job_batch_job_ended(&mut self, bid: &str, jid: &str, status: &str) {
        let Some(b) = self.jobs.batches.get_mut(bid) else {
            return;
        };
        b.ended.insert(jid.to_string(), status.to_string());
        if status != "completed" {
            self.job_batch_cascade(bid);
        }
        self.job_batch_maybe_end(bid);
    }

    /// Cancels each queued job of batch `bid` that waits for a job of it that ended
    /// without completing (`dependency_failed`); their ends bring their own
    /// dependants here in turn.
    fn job_batch_cascade(&mut self, bid: &str) {
        let Some(b) = self.jobs.batches.get(bid) else {
            return;
        };
        let mut doomed = Vec::new();
        for jid in &b.rec.jobs {
            let Some(j) = self
                .jobs
                .by_id
                .get(jid)
                .and_then(|&k| self.jobs.live.get(k).map(|j| (k, j)))
            else {
                continue;
            };
            let (jk, j) = j;
            if j.phase != Phase::Queued || j.cancelled {
                continue;
            }
            let failed = j.rec.depends_on.iter().find_map(|d| {
                b.ended
                    .get(d)
                    .filter(|s| *s != "completed")
                    .map(|s| (d.clone(), s.clone()))
            });
            if let Some((dep, st)) = failed {
                doomed.push((jk, dep, st));
            }
        }
        for (jk, dep, st) in doomed {
            let e = JobError {
                code: "dependency_failed".into(),
                message: format!(
                    "job {dep} of its batch did not complete ({st}), so this job did not run"
                ),
                kind: "job".into(),
            };
            self.job_cancel_quietly(jk, e, "a job it depends on did not complete");
        }
    }

    /// When every job of batch `bid` has ended: its end (status, time, and its
    /// `batch.finished` in the outbox) is written; then the waits on it hear.
    pub(super) fn job_batch_maybe_end(&mut self, bid: &str) {
        let webhooks = self.webhooks.is_some();
        let Some(b) = self.jobs.batches.get_mut(bid) else {
            return;
        };
        if b.ending || b.ended.len() < b.rec.jobs.len() {
            return;
        }
        b.ending = true;
        let statuses: Vec<&str> = b
            .rec
            .jobs
            .iter()
            .map(|j| b.ended.get(j).map_or("failed", String::as_str))
            .collect();
        // The live record keeps `running` until the end is written (a failed write is
        // tried again, with its event).
        let status = wb::final_status(&b.rec, &statuses).to_string();
        let ended_ms = now_ms();
        let tenant = b.rec.tenant.clone();
        let bid = bid.to_string();
        self.job_batch_view(tenant, bid.clone(), move |d, v| {
            let (mut rec, jobs) = match v {
                Ok(Some(v)) => v,
                _ => {
                    // Tried again at the next sweep.
                    if let Some(b) = d.jobs.batches.get_mut(&bid) {
                        b.ending = false;
                    }
                    return;
                }
            };
            rec.status = status;
            rec.ended_ms = Some(ended_ms);
            let prices = d.prices();
            let now = now_ms();
            let event = rec.webhook_url.clone().filter(|_| webhooks).map(|url| {
                crate::store::webhooks::OutboxEvent {
                    tenant: rec.tenant.clone(),
                    event: "batch.finished".into(),
                    url,
                    body: wb::finished_event(&bid, &rec, &jobs, &prices, now),
                    created_ms: now,
                    state: "pending".into(),
                    attempts: 0,
                    next_ms: now,
                    last_error: None,
                    delivered_ms: None,
                }
            });
            let has_event = event.is_some();
            let status = rec.status.clone();
            let mailbox = d.reactor.mailbox();
            d.app
                .sessions
                .store()
                .put_batch_then(&bid.clone(), &rec, event, move |r| {
                    mailbox.send(Box::new(move |d: &mut Daemon| {
                        if let Err(e) = r {
                            log::error!("jobs: writing the end of batch {bid}: {e}");
                            if let Some(b) = d.jobs.batches.get_mut(&bid) {
                                b.ending = false;
                            }
                            return;
                        }
                        if has_event {
                            if let Some(w) = &d.webhooks {
                                w.nudge();
                            }
                        }
                        log::info!("batch {bid} {status}");
                        d.jobs.batches.remove(&bid);
                        d.job_waiters_see(&bid, &status);
                    }));
                });
        });
    }

    /// At start and at each sweep: what a stop interrupted (a cascade, a batch's end)
    /// is carried on.
    pub(crate) fn job_batches_resume(&mut self) {
        // A queued job of a batch this daemon does not hold (its record unreadable)
        // cannot be ordered: it fails rather than run out of order; so does a job of
        // a cancelled batch that a stop brought back to the queue.
        let mut doomed = Vec::new();
        for (jk, j) in self.jobs.live.iter() {
            let Some(bid) = &j.rec.batch else {
                continue;
            };
            if j.phase != Phase::Queued || j.cancelled {
                continue;
            }
            match self.jobs.batches.get(bid) {
                None => doomed.push((jk, JobError {
                    code: "batch_lost".into(),
                    message: format!("its batch {bid} could not be read, so its order is unknown; it did not run"),
                    kind: "system".into(),
                })),
                Some(b) if b.rec.cancelled => doomed.push((jk, JobError {
                    code: "cancelled".into(),
                    message: format!("cancelled with its batch {bid} (POST /v1/batches/{{id}}/cancel)"),
                    kind: "job".into(),
                })),
                Some(_) => {}
            }
        }
        for (jk, e) in doomed {
            if e.kind == "system" {
                let Some(j) = self.jobs.live.get_mut(jk) else {
                    continue;
                };
                let js = j.serial;
                j.rec.error = Some(e);
                j.rec.status = "failed".into();
                self.jobs.queue.retain(|&k| k != jk);
                self.job_end(jk, js);
            } else {
                self.job_cancel_quietly(jk, e, "its batch was cancelled");
            }
        }
        let ids: Vec<String> = self.jobs.batches.keys().cloned().collect();
        for bid in ids {
            self.job_batch_cascade(&bid);
            self.job_batch_maybe_end(&bid);
        }
    }

    /// Whether queued job `j` must wait for its batch: a job it depends on has not
    /// completed, or `busy` (its batch's jobs running) is at its batch's
    /// `max_concurrency`.
    pub(super) fn job_batch_holds(&self, j: &Live, busy: &HashMap<&str, u32>) -> bool {
        let Some(bid) = &j.rec.batch else {
            return false;
        };
        // Fail closed: a batch not held, or cancelled, starts nothing more.
        let Some(b) = self.jobs.batches.get(bid) else {
            return true;
        };
        b.rec.cancelled
            || busy.get(bid.as_str()).copied().unwrap_or(0) >= b.rec.max_concurrency
            || j.rec
                .depends_on
                .iter()
                .any(|d| b.ended.get(d).map(String::as_str) != Some("completed"))
    }
}

//! Background jobs (the WBX face's `/v1/jobs`): a durable queue in LMDB, each job run
//! as `/bin/sh -c` in a fresh long-lived sandbox of its template (`boxes.rs`, owned by
//! the job and found by nobody else), its output redacted into a log on disk, its
//! result files saved through the sandbox's init, then the sandbox removed.
//!
//! A job's life: `queued` (committed before the 202) → `starting` (committed before
//! its sandbox boots) → `running` → `uploading_artifacts` → `completed`, `failed`,
//! `expired` or `cancelled` (committed with its key deleted, so its env values are
//! unreadable from then on). A sandbox lost on our side (its init died, it did not
//! boot) is a `system` failure: retried in a fresh sandbox, once the old one is gone,
//! as `retry` asks, else `failed`. One job has at most one sandbox at any time: a next
//! attempt starts only after the previous sandbox was removed.
//!
//! A daemon that stops (or crashes) loses its sandboxes; the startup sweep removes
//! them before [`load`] reads the jobs, so every job that was starting, running or
//! saving is recovered there: retried if its `retry` allows another attempt, else
//! failed with `sandbox_lost`. Queued jobs stay queued, in their order.
//!
//! Disk writes (the log, result files) happen on one thread per running job, never on
//! the loop; they are acknowledged back, and a process whose output runs ahead of the
//! disk is held by init, as a slow streaming client holds a command.

use super::boxes::{BoxOwner, InternalBoot};
use super::conn::Owner;
use super::Daemon;
use crate::api::Outcome;
use crate::config::WbxJobs;
use crate::http::Response;
use crate::jobs::{Pattern, Redactor};
use crate::reactor::{Addr, Component, ComponentId, Done, Readiness};
use crate::sandbox::wire::{self, Call, Exited, FsCall, FsEntry, Kind, Reply};
use crate::store::jobs::{Artifact, Attempt, JobError, JobRecord, Skipped, Submitted, TestResults};
use crate::store::Store;
use crate::wbx::jobs::{self as wj, JobOp, Prices};
use crate::wbx::sandboxes::{self as wsb, Create};
use slab::Slab;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod batches;
mod wasi;

/// The jobs component (key: the live job).
pub(crate) const JOBS: ComponentId = ComponentId(11);
/// Its one timer per job: the spawn's answer, the time limit, the kill's grace, or the
/// saving's deadline (the generation names which is current).
const DEADLINE: u16 = 0;
/// A wait's time limit (key: the waiter).
const WAIT: u16 = 1;
/// Waits held at once, all tenants together, and per tenant.
const MAX_WAITERS: usize = 1024;
const MAX_WAITERS_PER_TENANT: usize = 64;

/// Jobs' files under the data directory: `<id>/log`, `<id>/a<N>` (result files), and
/// the receipts' signing key.
pub(crate) const JOBS_DIR: &str = "jobs";
const RECEIPT_KEY_FILE: &str = "receipt-key.pk8";
/// A job's staged inputs, in its directory, bound read-only at `HOME/input`.
const INPUT_DIR: &str = "input";
/// The working directory of a job's command (the sandbox user's home).
const HOME: &str = crate::wbx::jobs::JOB_HOME;
/// How long init may take to answer a spawn.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// After the time limit's kill, how long before the sandbox itself is ended.
const KILL_GRACE: Duration = Duration::from_secs(10);
/// How long a read of a job whose end is being written waits for it: past this (a
/// slow disk) it is answered 503 to retry, as while the store refuses the end.
const END_READ_WAIT: Duration = Duration::from_secs(30);
/// How long a job's log writer may take to sync its log at the end: past this (a
/// writer stuck on its disk) the end is written without the log's size and digest, as
/// when the log could not be written at all, so the job frees its slot.
const END_LOG_WAIT: Duration = Duration::from_secs(600);
/// How long saving the result files may take.
const SAVE_TIMEOUT: Duration = Duration::from_secs(600);
/// The sandbox outlives the job's time limit by this (its boot and the saving).
const SANDBOX_EXTRA_S: u64 = 900;
/// Directories the saving looks through at most.
const MAX_LISTED_DIRS: usize = 5000;
/// Log bytes on their way to the disk before the process is held, and after which it
/// is let go again.
const LOG_HOLD_BYTES: u64 = 8 << 20;
const LOG_RELEASE_BYTES: u64 = 1 << 20;
/// Credit given to init for a result file at once.
const WINDOW: u64 = 1 << 20;
/// How often finished jobs past their retention are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Jobs on the loop.
pub(crate) struct Jobs;

impl Component<Daemon> for Jobs {
    fn name(&self) -> &'static str {
        "jobs"
    }

    fn ready(&self, _: &mut Daemon, _: usize, _: u16, _: Readiness) {}

    fn timer(&self, d: &mut Daemon, key: usize, what: u16, gen: u64) {
        match what {
            DEADLINE => d.job_timer(key, gen),
            WAIT => d.job_wait_timeout(key, gen),
            _ => {}
        }
    }
}

/// Where a live job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for capacity.
    Queued,
    /// Its `starting` record is being written, or its sandbox boots, or init has not
    /// answered the spawn yet.
    Starting,
    /// The command runs (or was killed at its time limit and has not exited yet).
    Running,
    /// Its result files are being saved.
    Saving,
    /// Its end is being written; its sandbox is being removed.
    Ending,
}

/// The signing key of receipts.
pub(crate) struct Signer {
    pair: ring::signature::Ed25519KeyPair,
}

impl Signer {
    fn public_key(&self) -> String {
        use base64::Engine as _;
        use ring::signature::KeyPair as _;
        base64::engine::general_purpose::STANDARD.encode(self.pair.public_key().as_ref())
    }
}

/// The component's state.
pub(crate) struct Table {
    live: Slab<Live>,
    by_id: HashMap<String, usize>,
    /// Live keys waiting to start, in the order they were accepted.
    queue: VecDeque<usize>,
    serial: u64,
    /// Stored result-file bytes per tenant.
    tenant_bytes: HashMap<String, u64>,
    /// Bytes of finished jobs' records (and webhook events) in the store, per tenant.
    tenant_records: HashMap<String, u64>,
    /// Bytes the store holds (its pages in use), as last measured by the sweep.
    store_used: u64,
    /// Submits being written, per tenant (they count against its cap).
    pending: HashMap<String, usize>,
    dir: PathBuf,
    signer: Option<Arc<Signer>>,
    sweeping: bool,
    next_sweep: Instant,
    /// Clients waiting for jobs to finish (`POST /v1/jobs/wait`), and by job id.
    waiters: Slab<Waiter>,
    waiting_on: HashMap<String, Vec<usize>>,
    /// Tenants' budgets, and what was spent per period key (`store::budget::periods`)
    /// of the current month and day (loaded at start, added to as jobs end).
    budgets: HashMap<String, crate::store::budget::Budget>,
    /// `PUT /v1/budget`s by tenant, one written at a time (the first is being written):
    /// each merges its change into what the one before it stored.
    budget_puts: HashMap<String, VecDeque<(usize, u64, wj::BudgetChange)>>,
    spent: HashMap<Vec<u8>, i128>,
    /// Worst cases of submits being written, per tenant.
    pending_reserved: HashMap<String, i128>,
    /// Batches whose jobs have not all ended.
    batches: HashMap<String, batches::LiveBatch>,
    /// Tenants' default compute classes (loaded at start).
    pub(super) compute_prefs: HashMap<String, &'static crate::wbx::compute::Class>,
    /// WebAssembly jobs whose process runs (the daemon's stop waits for them).
    pub(crate) wasi_running: usize,
    /// The uids those processes run as (each its own).
    pub(crate) wasi_uids: HashSet<u32>,
}

impl Table {
    /// A submit of `jobs` jobs whose worst cases total `worst` is being written for
    /// `tenant`: until it is, they count against its cap and its budget.
    fn pending_add(&mut self, tenant: &str, jobs: usize, worst: i128) {
        *self.pending.entry(tenant.to_string()).or_default() += jobs;
        *self.pending_reserved.entry(tenant.to_string()).or_default() += worst;
    }

    /// That submit's write is over (its jobs are live now, or were not stored).
    fn pending_done(&mut self, tenant: &str, jobs: usize, worst: i128) {
        if let Some(n) = self.pending.get_mut(tenant) {
            *n = n.saturating_sub(jobs);
        }
        if let Some(r) = self.pending_reserved.get_mut(tenant) {
            *r -= worst;
        }
    }
}

/// Start and upload reserve of an attempt in a job's worst case, seconds.
const RESERVE_S: u64 = 60;

/// One `POST /v1/jobs/wait`, held on the loop until its condition holds or its time
/// is up: no thread and no polling.
struct Waiter {
    client: (usize, u64),
    tenant: String,
    all: bool,
    /// Each job: its id, state, and whether its end is written.
    items: Vec<(String, String, bool)>,
    gen: u64,
}

/// A `POST /v1/jobs/wait` as asked: its client, tenant, ids, `until: "all"` and
/// time.
struct WaitAsk {
    client: (usize, u64),
    tenant: String,
    ids: Vec<String>,
    all: bool,
    timeout_s: u64,
}

/// One unfinished job.
struct Live {
    serial: u64,
    id: String,
    rec: JobRecord,
    /// Its env values (opened from the sealed record; never written out).
    env: Vec<(String, String)>,
    phase: Phase,
    /// Its sandbox (key, serial) while it has one.
    sbx: Option<(usize, u64)>,
    /// The spawn call, and the command's pid in the sandbox once init answered.
    call: u32,
    pid: Option<u32>,
    /// The current timer's generation.
    gen: u64,
    /// When the command started.
    ran: Option<Instant>,
    timed_out: bool,
    cancelled: bool,
    writer: Option<LogWriter>,
    /// Its log's redactor: stdout and stderr go into the log interleaved as they
    /// come, so they pass one redactor in that order (a value split across the two
    /// is still caught).
    redact: Redactor,
    /// Log bytes kept this attempt, and on their way to the disk.
    logged: u64,
    unacked: u64,
    held: bool,
    exit: Option<i32>,
    save: Option<Save>,
    /// Clients waiting for its cancellation to be written.
    cancel_waiters: Vec<(usize, u64)>,
    /// Reads of it that came while its end was being written (its log synced, its
    /// test results read, its record committed): answered once it is, so nobody
    /// sees it ended without what its end says (see [`Daemon::job_read`]).
    end_readers: Vec<EndReader>,
    /// When its end began to be written (its phase became `Ending`).
    ending_since: Option<Instant>,
    /// The command's run time this attempt, milliseconds.
    run_ms: u64,
    /// Its end is written (it leaves once its sandbox is gone too).
    written: bool,
    /// Which writer `writer` is (acknowledgements of an earlier one are ignored).
    writer_gen: u64,
    /// Result files opened on the writer so far (its acknowledgements name the one).
    files_opened: u64,
    /// Retries of a failed write of its end.
    end_retries: u32,
    /// Why it was cancelled (its error once it ends `cancelled`).
    cancel_error: Option<JobError>,
    /// A WebAssembly job's run: set to kill it (cancel, the daemon's stop, its log
    /// lost).
    wasi_stop: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The uid its run has.
    wasi_uid: Option<u32>,
}

/// A read of a job waiting for its end to be written (see [`Daemon::job_read`]).
struct EndReader {
    ck: usize,
    serial: u64,
    tenant: String,
    op: JobOp,
}

/// The saving of result files.
#[derive(Default)]
struct Save {
    patterns: Vec<Pattern>,
    /// Directories to list (relative to the home), and the one being listed.
    dirs: VecDeque<String>,
    listing: Option<u32>,
    visited: HashSet<String>,
    /// Files that matched, by name, with the size listed.
    found: BTreeMap<String, u64>,
    /// Files still to fetch.
    todo: VecDeque<(String, u64)>,
    cur: Option<Fetch>,
    saved: Vec<Artifact>,
    skipped: Vec<Skipped>,
    bytes: u64,
    next_file: u32,
    /// Files not saved past the ones `skipped` lists.
    more_skipped: u64,
    /// What matching names against the patterns may still cost (steps).
    match_budget: u64,
}

impl Save {
    /// Lists a file that was not saved (past [`MAX_SKIPPED`], only counts it).
    fn skip(&mut self, s: Skipped) {
        if self.skipped.len() < MAX_SKIPPED {
            self.skipped.push(s);
        } else {
            self.more_skipped += 1;
        }
    }
}

/// One result file on its way.
struct Fetch {
    /// Which file opened on the writer it is.
    fid: u64,
    name: String,
    /// The open call, then its handle (the same id).
    call: u32,
    opened: bool,
    size: u64,
    received: u64,
    granted: u64,
    acked: u64,
    file: String,
}

/// The thread writing one attempt's log and result files.
struct LogWriter {
    tx: crossbeam_channel::Sender<Msg>,
}

enum Msg {
    Log(Vec<u8>),
    Open(PathBuf),
    Data(Vec<u8>),
    Close,
    Discard,
    Finish,
}

/// Bytes of a log's end read for its test results and digest (a log may be 64 MiB;
/// frameworks sum up at the end).
const DIGEST_BYTES: u64 = 8 << 20;

/// Most entries `skipped` lists; past it one entry counts the rest.
const MAX_SKIPPED: usize = 1000;
/// Matched files looked at past the number that may be saved.
const MAX_FOUND_EXTRA: usize = 1000;

/// A read of a job whose end is still being written, past [`END_READ_WAIT`].
fn end_pending() -> Response {
    crate::wbx::error(
        503,
        "the job has ended and its end is still being written; retry in a few seconds",
    )
    .with_header("Retry-After", "5")
}

/// The answer when the store refused a write.
fn store_refusal() -> Response {
    crate::wbx::error(503, "the job could not be stored; retry in a few seconds")
        .with_header("Retry-After", "2")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn now_ms() -> u64 {
    crate::workspace::now_ms()
}

/// The receipts' key under `dir`, made on first use (mode 0600).
fn signer(dir: &Path) -> Option<Signer> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(RECEIPT_KEY_FILE);
    let pk8 = match std::fs::read(&path) {
        Ok(b) => b,
        Err(_) => {
            let rng = ring::rand::SystemRandom::new();
            let doc = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).ok()?;
            let tmp = dir.join(format!("{RECEIPT_KEY_FILE}.tmp"));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .ok()?;
            f.write_all(doc.as_ref()).ok()?;
            f.sync_all().ok()?;
            std::fs::rename(&tmp, &path).ok()?;
            doc.as_ref().to_vec()
        }
    };
    match ring::signature::Ed25519KeyPair::from_pkcs8(&pk8) {
        Ok(pair) => Some(Signer { pair }),
        Err(_) => {
            log::error!(
                "jobs: {} is not an Ed25519 key; receipts are unsigned until it is removed",
                path.display()
            );
            None
        }
    }
}

/// Reads the jobs at start: recovers those a stopped daemon left starting, running or
/// saving (their sandboxes were swept before this), queues the queued, removes job
/// directories with no record.
/// The prices of `cfg`.
pub(crate) fn prices_of(cfg: &WbxJobs) -> Prices {
    let rate = |v: crate::jobs::Money, g: crate::jobs::Money| crate::wbx::compute::Rate {
        vcpu_s: v.0,
        gb_s: g.0,
    };
    Prices {
        currency: cfg.currency.clone(),
        base: rate(cfg.price_vcpu_s, cfg.price_gb_s),
        own: cfg
            .class_prices
            .iter()
            .map(|p| (p.class, rate(p.vcpu_s, p.gb_s)))
            .collect(),
    }
}

/// A job's `job.finished` event, when it has a webhook and webhooks are on.
fn finished_event(
    id: &str,
    rec: &JobRecord,
    prices: &Prices,
    webhooks: bool,
) -> Option<crate::store::webhooks::OutboxEvent> {
    let url = rec.spec.webhook_url.clone().filter(|_| webhooks)?;
    let now = now_ms();
    Some(crate::store::webhooks::OutboxEvent {
        tenant: rec.tenant.clone(),
        event: "job.finished".into(),
        url,
        body: wj::finished_event(id, rec, prices, now),
        created_ms: now,
        state: "pending".into(),
        attempts: 0,
        next_ms: now,
        last_error: None,
        delivered_ms: None,
    })
}

pub(crate) fn load(store: &Store, data_dir: &Path, prices: &Prices, webhooks: bool) -> Table {
    let dir = data_dir.join(JOBS_DIR);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        log::error!("jobs: creating {}: {e}", dir.display());
    }
    let mut t = Table {
        live: Slab::new(),
        by_id: HashMap::new(),
        queue: VecDeque::new(),
        serial: 0,
        tenant_bytes: HashMap::new(),
        tenant_records: HashMap::new(),
        store_used: 0,
        pending: HashMap::new(),
        signer: signer(&dir).map(Arc::new),
        dir,
        sweeping: false,
        next_sweep: Instant::now(),
        waiters: Slab::new(),
        waiting_on: HashMap::new(),
        budgets: HashMap::new(),
        budget_puts: HashMap::new(),
        spent: HashMap::new(),
        pending_reserved: HashMap::new(),
        batches: HashMap::new(),
        compute_prefs: HashMap::new(),
        wasi_running: 0,
        wasi_uids: HashSet::new(),
    };
    match store.budgets() {
        Ok(b) => t.budgets = b.into_iter().collect(),
        Err(e) => log::error!("jobs: reading budgets: {e}"),
    }
    match store.compute_prefs() {
        Ok(p) => {
            for (tenant, name) in p {
                match crate::wbx::compute::class(&name) {
                    Some(c) => {
                        t.compute_prefs.insert(tenant, c);
                    }
                    None => log::error!("jobs: {tenant}'s default compute class {name:?} is no class; economy is used"),
                }
            }
        }
        Err(e) => log::error!("jobs: reading compute preferences: {e}"),
    }
    let mut all = match store.all_jobs() {
        Ok(a) => a,
        Err(e) => {
            log::error!("jobs: reading the store: {e}");
            return t;
        }
    };
    all.sort_by_key(|(_, r)| r.seq);
    let mut tenants: HashSet<String> = t.budgets.keys().cloned().collect();
    tenants.extend(all.iter().map(|(_, r)| r.tenant.clone()));
    // By key, not by decoded record: a record this version cannot read keeps its files.
    let ids: HashSet<String> = match store.job_ids() {
        Ok(ids) => ids.into_iter().collect(),
        Err(e) => {
            log::error!("jobs: reading the store: {e}");
            return t;
        }
    };
    if let Ok(entries) = std::fs::read_dir(&t.dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if wj::valid_id(&name) && !ids.contains(&name) {
                log::info!("jobs: removing {name}, which has no record");
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let mut recovered = 0;
    // How each finished job ended, and which are live, for their batches.
    let mut ended: HashMap<String, String> = HashMap::new();
    for (id, mut rec) in all {
        // No job runs yet: a staged `input/` is from before the stop (each attempt
        // stages its own).
        let _ = std::fs::remove_dir_all(t.dir.join(&id).join(INPUT_DIR));
        if rec.finished() {
            *t.tenant_bytes.entry(rec.tenant.clone()).or_default() += stored_bytes(&rec);
            *t.tenant_records.entry(rec.tenant.clone()).or_default() += record_bytes(&rec);
            ended.insert(id, rec.status);
            continue;
        }
        let env = match (&rec.sealed_env, store.job_key(&id)) {
            (None, _) => Some(Vec::new()),
            (Some(sealed), Ok(Some(key))) => crate::jobs::open(&key, sealed),
            (Some(_), _) => None,
        };
        let was = rec.status.clone();
        let mut drop_key = false;
        if env.is_none() {
            fail(
                &mut rec,
                "sandbox_lost",
                "its env values could not be opened after a restart",
                "system",
            );
            drop_key = true;
        } else if was != "queued" {
            // Its sandbox died with the daemon: the sweep removed it.
            recovered += 1;
            let now = now_ms();
            let lost = JobError {
                code: "sandbox_lost".into(),
                message: "the daemon stopped while the job ran (a restart or a crash); its sandbox was removed at startup".into(),
                kind: "system".into(),
            };
            if rec.attempt < rec.spec.retry.max_attempts {
                rec.attempts.push(Attempt {
                    started_ms: rec.started_ms.unwrap_or(now),
                    ended_ms: now,
                    error: Some(lost),
                });
                rec.status = "queued".into();
                rec.started_ms = None;
            } else {
                rec.ended_ms = Some(now);
                rec.error = Some(lost);
                rec.status = "failed".into();
                rec.sealed_env = None;
                drop_key = true;
            }
        }
        if rec.status != was {
            let (i, r) = (id.clone(), rec.clone());
            let (tx, rx) = crossbeam_channel::bounded(1);
            if rec.finished() {
                // Its end, with its `job.finished`: no crash loses the event.
                let event = finished_event(&i, &r, prices, webhooks);
                let cost = prices.cost(&r.spec, r.billed_ms).0;
                store.end_job_then(&i, &r, event, cost, move |res| {
                    let _ = tx.send(res);
                });
            } else {
                store.put_job_then(&i, &r, drop_key, move |res| {
                    let _ = tx.send(res);
                });
            }
            match rx.recv() {
                Ok(Ok(_)) => log::info!(
                    "jobs: {id} was {was} when the daemon stopped; now {}",
                    rec.status
                ),
                Ok(Err(e)) => log::error!("jobs: recovering {id}: {e}"),
                Err(_) => log::error!("jobs: recovering {id}: the writer stopped"),
            }
        }
        if rec.finished() {
            // Ended by this recovery: counted as every finished job is.
            *t.tenant_bytes.entry(rec.tenant.clone()).or_default() += stored_bytes(&rec);
            *t.tenant_records.entry(rec.tenant.clone()).or_default() += record_bytes(&rec);
            ended.insert(id, rec.status);
            continue;
        }
        t.serial += 1;
        // Its env values are opened again when it starts (a queued job keeps none).
        let key = t
            .live
            .insert(Live::new(t.serial, id.clone(), rec, Vec::new()));
        t.by_id.insert(id, key);
        t.queue.push_back(key);
    }
    match store.all_batches() {
        Ok(all) => {
            let live: HashSet<String> = t.by_id.keys().cloned().collect();
            t.batches = batches::load_batches(all, &ended, &live);
        }
        Err(e) => log::error!("jobs: reading batches: {e}"),
    }
    // What each known tenant spent this month and today.
    let now = now_ms();
    for tenant in tenants {
        let (m, d) = crate::store::budget::periods(&tenant, now);
        if let Ok(v) = store.spend(&[m.clone(), d.clone()]) {
            t.spent.insert(m, v[0]);
            t.spent.insert(d, v[1]);
        }
    }
    if recovered > 0 {
        log::info!("jobs: {recovered} recovered after a stop");
    }
    t
}

/// Why a job whose worst case is `worst` (every attempt for its whole time limit, and
/// a start and upload reserve each) is over its own `max_cost`: with the longest time
/// limit that fits.
pub(super) fn max_cost_refusal(
    spec: &crate::store::jobs::JobSpec,
    worst: i128,
    prices: &Prices,
) -> Option<String> {
    let max = spec.max_cost?;
    if worst <= max {
        return None;
    }
    let per_s = prices.cost(spec, 1000).0.max(1);
    let attempts = i128::from(spec.retry.max_attempts.max(1));
    let fits = (max / (per_s * attempts)) - i128::from(RESERVE_S);
    Some(if fits >= 1 {
        format!(
            "max_cost: this job could cost up to {} ({} attempts of {} s and a {RESERVE_S} s reserve each); the longest time limit that fits is timeout_s {fits}",
            prices.show(crate::jobs::Money(worst)),
            attempts,
            spec.timeout_s
        )
    } else {
        format!(
            "max_cost: this job could cost up to {}; no time limit fits {} with {} attempts",
            prices.show(crate::jobs::Money(worst)),
            prices.show(crate::jobs::Money(max)),
            attempts
        )
    })
}

/// A job's staged inputs: their directory, and each file's size and SHA-256.
type Staged = (PathBuf, Vec<(u64, String)>);

/// Copies a job's inputs from their jobs' result files into its fresh `input/`
/// directory (world-readable, as the sandbox's user reads them through a read-only
/// bind), checking each file's SHA-256 against its job's record and against what was
/// recorded when this job was accepted. Pool threads only.
fn stage_inputs(
    store: &Store,
    jobs_dir: &Path,
    id: &str,
    inputs: &[crate::store::jobs::InputFile],
) -> Result<Staged, JobError> {
    use std::io::Read as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let err = |code: &str, message: String, kind: &str| JobError {
        code: code.into(),
        message,
        kind: kind.into(),
    };
    let system = |what: String| err("sandbox_lost", what, "system");
    let dir = jobs_dir.join(id).join(INPUT_DIR);
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(system(format!("its inputs could not be staged: {e}")))
        }
        _ => {}
    }
    let mkdir = |d: &Path| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(d)
            .map_err(|e| system(format!("its inputs could not be staged: {e}")))
    };
    mkdir(&dir)?;
    let mut total = 0u64;
    let mut staged = Vec::with_capacity(inputs.len());
    for (i, input) in inputs.iter().enumerate() {
        let src = store
            .job(&input.job_id)
            .map_err(|e| system(format!("reading job {}: {e}", input.job_id)))?;
        let Some(a) = src
            .as_ref()
            .and_then(|r| r.artifacts.iter().find(|a| a.name == input.name))
        else {
            return Err(err(
                "input_missing",
                format!(
                    "inputs[{i}]: job {} or its result file {:?} is gone (past its retention)",
                    input.job_id, input.name
                ),
                "job",
            ));
        };
        if input.sha256.as_ref().is_some_and(|s| *s != a.sha256) {
            return Err(system(format!(
                "inputs[{i}]: the result file {:?} of job {} is not the one recorded when this job was accepted",
                input.name, input.job_id
            )));
        }
        total = total.saturating_add(a.size);
        if total > crate::store::jobs::MAX_INPUT_BYTES {
            return Err(err(
                "inputs_too_large",
                format!(
                    "inputs: {total} bytes or more in all; at most {} bytes (64 MiB)",
                    crate::store::jobs::MAX_INPUT_BYTES
                ),
                "job",
            ));
        }
        let target = dir.join(&input.dest);
        if let Some(parent) = target.parent() {
            mkdir(parent)?;
        }
        let copy = || -> std::io::Result<String> {
            let mut from = std::fs::File::open(jobs_dir.join(&input.job_id).join(&a.file))?;
            let mut to = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&target)?;
            let mut h = ring::digest::Context::new(&ring::digest::SHA256);
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = from.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
                to.write_all(&buf[..n])?;
            }
            Ok(hex(h.finish().as_ref()))
        };
        let sha = copy().map_err(|e| {
            system(format!(
                "inputs[{i}]: copying {:?} of job {}: {e}",
                input.name, input.job_id
            ))
        })?;
        if sha != a.sha256 {
            return Err(system(format!(
                "inputs[{i}]: the result file {:?} of job {} does not match its SHA-256",
                input.name, input.job_id
            )));
        }
        staged.push((a.size, sha));
    }
    Ok((dir, staged))
}

/// What a finished job keeps on disk, against its tenant's stored results: its result
/// files, its log, and its command.
fn stored_bytes(rec: &JobRecord) -> u64 {
    rec.artifacts.iter().map(|a| a.size).sum::<u64>()
        + rec.log_bytes
        + rec.spec.command.len() as u64
        + rec
            .spec
            .wasm
            .as_ref()
            .map_or(0, |w| w.module_bytes + w.stdin_bytes)
}

/// What a finished job keeps in the store, against its tenant's records: the record as
/// written (its command, result files' and skipped files' names, test results…), and
/// as much again for its webhook event (the job's JSON), if it has one.
fn record_bytes(rec: &JobRecord) -> u64 {
    let record = serde_json::to_vec(rec).map_or(0, |v| v.len() as u64);
    if rec.spec.webhook_url.is_some() {
        record * 2
    } else {
        record
    }
}

/// The store's share job submits may fill: past it they are refused, so the rest
/// stays for what must be written (jobs' ends, sessions, KV, volumes).
const STORE_SUBMIT_SHARE_PCT: u64 = 75;

/// Why no job may be submitted while the store holds `used` bytes: past
/// [`STORE_SUBMIT_SHARE_PCT`] of its map.
fn store_full(used: u64, retention_s: u64) -> Option<String> {
    let map = crate::store::env::MAP_SIZE_BYTES as u64;
    (used >= map / 100 * STORE_SUBMIT_SHARE_PCT).then(|| {
        format!("limit reached: the server's store is {} % full ({used} of {map} bytes); jobs are refused past {STORE_SUBMIT_SHARE_PCT} % until finished ones are removed ({retention_s} s after their end)", (used * 100 + map / 2) / map)
    })
}

/// The error of a job cancelled by its own `POST …/cancel`.
fn cancelled() -> JobError {
    JobError {
        code: "cancelled".into(),
        message: "cancelled by POST /v1/jobs/{id}/cancel".into(),
        kind: "job".into(),
    }
}

fn fail(rec: &mut JobRecord, code: &str, message: &str, kind: &str) {
    rec.status = "failed".into();
    rec.ended_ms = Some(now_ms());
    rec.error = Some(JobError {
        code: code.into(),
        message: message.into(),
        kind: kind.into(),
    });
    rec.sealed_env = None;
}

impl Live {
    fn new(serial: u64, id: String, rec: JobRecord, env: Vec<(String, String)>) -> Live {
        let values: Vec<&str> = env.iter().map(|(_, v)| v.as_str()).collect();
        Live {
            serial,
            id,
            rec,
            redact: Redactor::new(values),
            env,
            phase: Phase::Queued,
            sbx: None,
            call: 0,
            pid: None,
            gen: 0,
            ran: None,
            timed_out: false,
            cancelled: false,
            writer: None,
            logged: 0,
            unacked: 0,
            held: false,
            exit: None,
            save: None,
            cancel_waiters: Vec::new(),
            end_readers: Vec::new(),
            ending_since: None,
            run_ms: 0,
            written: false,
            writer_gen: 0,
            files_opened: 0,
            end_retries: 0,
            cancel_error: None,
            wasi_stop: None,
            wasi_uid: None,
        }
    }
}

impl Daemon {
    fn job(&mut self, jk: usize, js: u64) -> Option<&mut Live> {
        self.jobs.live.get_mut(jk).filter(|j| j.serial == js)
    }

    fn prices(&self) -> Prices {
        prices_of(&self.cfg.wbx.jobs)
    }

    /// The compute class `asked` (`""`: none) resolves to for `tenant`: the one asked
    /// for, else the tenant's default, else economy. `Err` when this server does not
    /// offer it.
    pub(super) fn compute_class(
        &self,
        tenant: &str,
        asked: &str,
    ) -> Result<&'static crate::wbx::compute::Class, crate::wbx::compute::Refused> {
        let (c, by_default) = match crate::wbx::compute::class(asked).filter(|_| !asked.is_empty())
        {
            Some(c) => (c, false),
            None => (self.tenant_class(tenant), true),
        };
        match self.class_not_offered(c) {
            None => Ok(c),
            Some(why) => Err(crate::wbx::compute::Refused {
                class: c,
                by_default,
                why,
            }),
        }
    }

    /// `tenant`'s default class (economy unless it set one).
    fn tenant_class(&self, tenant: &str) -> &'static crate::wbx::compute::Class {
        self.jobs
            .compute_prefs
            .get(tenant)
            .copied()
            .unwrap_or_else(crate::wbx::compute::default_class)
    }

    /// Why this server does not offer class `c` (`None`: it does).
    pub(super) fn class_not_offered(&self, c: &crate::wbx::compute::Class) -> Option<String> {
        crate::wbx::compute::why_not_offered(c, &self.cfg.wbx.jobs.classes, self.cfg.wbx.max_mem_mb)
    }

    /// Fixes a job's class and its rate as it is accepted (see [`Self::compute_class`]).
    /// `Err` when the class is not offered.
    pub(super) fn job_class(
        &self,
        tenant: &str,
        spec: &mut crate::store::jobs::JobSpec,
        prices: &Prices,
    ) -> Result<(), crate::wbx::compute::Refused> {
        let c = self.compute_class(tenant, &spec.compute_class)?;
        spec.compute_class = c.name.to_string();
        spec.class_rate = Some(prices.rate(c));
        Ok(())
    }

    /// Carries out a jobs request.
    pub(crate) fn job_op(&mut self, ck: usize, tenant: String, op: JobOp) {
        match op {
            JobOp::Submit(s) => self.job_submit(ck, tenant, *s, None),
            JobOp::SubmitBatch(b) => self.job_batch_submit(ck, tenant, *b),
            JobOp::BatchGet(id) => self.job_batch_read(ck, tenant, id, None),
            JobOp::BatchReport { id, csv } => self.job_batch_read(ck, tenant, id, Some(csv)),
            JobOp::BatchCancel(id) => self.job_batch_cancel(ck, tenant, id),
            JobOp::Cancel(id) => self.job_cancel(ck, &tenant, &id),
            JobOp::Retry(id, env) => self.job_retry(ck, tenant, id, env),
            JobOp::Wait {
                ids,
                all,
                timeout_s,
            } => self.job_wait(ck, tenant, ids, all, timeout_s),
            JobOp::Budget(change) => self.job_budget(ck, tenant, change),
            JobOp::ComputePrefs(change) => self.compute_prefs(ck, tenant, change),
            JobOp::WebhookSecret(rotate) => {
                let sessions = Arc::clone(&self.app.sessions);
                self.start_job(
                    ck,
                    Box::new(move || {
                        let store = sessions.store();
                        let r = crate::webhooks::new_secret()
                            .ok_or_else(|| "the system's random source failed".to_string())
                            .and_then(|fresh| {
                                store
                                    .set_webhook_secret(&tenant, &fresh, rotate)
                                    .map_err(|e| e.to_string())
                            });
                        Outcome::Respond(match r {
                            Ok(secret) => {
                                Response::json(200, &serde_json::json!({ "secret": secret }))
                            }
                            Err(e) => {
                                log::error!("webhooks: the secret of {tenant}: {e}");
                                store_refusal()
                            }
                        })
                    }),
                );
            }
            JobOp::ReceiptKey => {
                let resp = match &self.jobs.signer {
                    Some(s) => Response::json(
                        200,
                        &serde_json::json!({"algorithm": "Ed25519", "public_key": s.public_key(), "encoding": "base64 of the raw 32-byte key"}),
                    ),
                    None => crate::wbx::error(503, "this server has no receipt key (see its log)"),
                };
                self.respond(ck, resp);
            }
            other => self.job_read(ck, tenant, other),
        }
    }

    /// Reads on the pool: the live record where the job is live (fresher than the
    /// store's), else the store's.
    fn job_read(&mut self, ck: usize, tenant: String, op: JobOp) {
        let id = match &op {
            JobOp::Get(i)
            | JobOp::Summary(i)
            | JobOp::Receipt(i)
            | JobOp::Artifacts(i)
            | JobOp::Logs { id: i, .. }
            | JobOp::Artifact { id: i, .. } => Some(i.clone()),
            _ => None,
        };
        let jk = id.as_ref().and_then(|i| self.jobs.by_id.get(i).copied());
        let live = jk.and_then(|k| self.jobs.live.get(k));
        let ending =
            live.filter(|j| j.phase == Phase::Ending && !j.written && j.rec.tenant == tenant);
        if let (Some(jk), Some(j)) = (jk, ending) {
            // Its record already says it ended, but its log's size, digest and test
            // results, and its durable end, are a moment away: the read waits for them
            // (a receipt signed now would lack its log's digest), for a while.
            if self.app.shutting_down {
                self.respond(ck, super::boxes::shutting_down());
                return;
            }
            if j.end_retries > 0 {
                self.respond(ck, store_refusal());
                return;
            }
            if j.ending_since.is_some_and(|t| t.elapsed() >= END_READ_WAIT) {
                self.respond(ck, end_pending());
                return;
            }
            let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
                return;
            };
            self.conn_own(ck, Owner::Job);
            if let Some(j) = self.jobs.live.get_mut(jk) {
                j.end_readers.push(EndReader {
                    ck,
                    serial,
                    tenant,
                    op,
                });
            }
            return;
        }
        let live = live.map(|j| j.rec.clone());
        let sessions = Arc::clone(&self.app.sessions);
        let prices = self.prices();
        let dir = self.jobs.dir.clone();
        let signer = self.jobs.signer.clone();
        let isolation = format!("gVisor (runsc, platform {})", self.cfg.platform);
        let job: crate::api::Job = Box::new(move || {
            let store = sessions.store();
            let found = |id: &str| -> Result<JobRecord, Response> {
                let rec = match live {
                    Some(r) => Some(r),
                    None => store.job(id).map_err(|e| {
                        log::error!("jobs: reading {id}: {e}");
                        store_refusal()
                    })?,
                };
                rec.filter(|r| r.tenant == tenant).ok_or_else(wj::not_found)
            };
            let r = read_op(
                store,
                &op,
                &tenant,
                found,
                &prices,
                &dir,
                signer.as_deref(),
                &isolation,
                &sessions,
            );
            match r {
                Ok(o) => o,
                Err(resp) => Outcome::Respond(resp),
            }
        });
        self.start_job(ck, job);
    }

    /// Whether `tenant` may add `adding` jobs: its stored results under their cap, its
    /// unfinished jobs under theirs. The refusal, else `None`.
    pub(super) fn job_admission(&self, tenant: &str, adding: usize) -> Option<Response> {
        let c = &self.cfg.wbx.jobs;
        if let Some(why) = store_full(self.jobs.store_used, c.retention_s) {
            return Some(crate::wbx::error(429, &why));
        }
        let records = self.jobs.tenant_records.get(tenant).copied().unwrap_or(0);
        if records >= c.records_tenant_bytes {
            return Some(crate::wbx::error(
                429,
                &format!("limit reached: this tenant's finished jobs' records ({records} bytes) fill its {} bytes (ISOBOX_WBX_JOB_RECORDS_TENANT_MB); they are removed {} s after their jobs end", c.records_tenant_bytes, c.retention_s),
            ));
        }
        let used = self.jobs.tenant_bytes.get(tenant).copied().unwrap_or(0);
        if used >= c.artifact_tenant_bytes {
            let resp = crate::wbx::error(
                429,
                &format!("limit reached: this tenant's stored job results and logs ({used} bytes) fill its {} bytes (ISOBOX_WBX_ARTIFACT_TENANT_MB); they are removed {} s after their jobs end", c.artifact_tenant_bytes, c.retention_s),
            );
            return Some(resp);
        }
        let unfinished = self
            .jobs
            .live
            .iter()
            .filter(|(_, j)| j.rec.tenant == *tenant)
            .count()
            + self.jobs.pending.get(tenant).copied().unwrap_or(0);
        let cap = self.cfg.wbx.jobs.per_tenant;
        if unfinished + adding > cap {
            return Some(crate::wbx::error(
                429,
                &format!("limit reached: at most {cap} unfinished jobs at once (ISOBOX_WBX_JOBS_PER_TENANT); {unfinished} are, and this adds {adding}; wait for some to finish"),
            ));
        }
        None
    }

    /// Takes a submit's connection (owned from here, a retry's already is: every answer
    /// goes through `on_outcome`) and refuses it while the daemon stops; the
    /// connection's serial to go on with.
    pub(super) fn submit_begin(&mut self, ck: usize) -> Option<u64> {
        let serial = self.conns.get(ck).map(|c| c.serial)?;
        self.conn_own(ck, Owner::Job);
        if self.app.shutting_down {
            self.on_outcome(ck, serial, Outcome::Respond(super::boxes::shutting_down()));
            return None;
        }
        Some(serial)
    }

    /// `POST /v1/jobs` (and a retry's new job).
    fn job_submit(&mut self, ck: usize, tenant: String, s: wj::Submit, retry_of: Option<String>) {
        let Some(serial) = self.submit_begin(ck) else {
            return;
        };
        let Some(key) = s.spec.idempotency_key.clone() else {
            self.job_submit_checked(ck, serial, tenant, s, retry_of);
            return;
        };
        // A resend of an accepted job is that job, whatever the limits and the budget
        // say now (the job itself counts in them): its key is looked up before they
        // are checked. (The store looks again as it commits, for concurrent sends.)
        let sessions = Arc::clone(&self.app.sessions);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let found = sessions.store().job_by_idempotency_key(&tenant, &key);
            Box::new(move |d: &mut Daemon| match found {
                Ok(Some((eid, er))) => {
                    let resp = d.existing_job(&eid, er);
                    d.on_outcome(ck, serial, Outcome::Respond(resp));
                }
                Ok(None) => d.job_submit_checked(ck, serial, tenant, s, retry_of),
                Err(e) => {
                    log::error!("jobs: looking up an idempotency key: {e}");
                    d.on_outcome(ck, serial, Outcome::Respond(store_refusal()));
                }
            })
        }));
    }

    /// The `202` for a submit whose idempotency key names job `eid`: the job as it is
    /// now (its live record while it runs).
    fn existing_job(&self, eid: &str, stored: JobRecord) -> Response {
        let live = self
            .jobs
            .by_id
            .get(eid)
            .and_then(|&k| self.jobs.live.get(k));
        // While its end is being written the store's record is what holds.
        let rec = live
            .filter(|j| j.written || j.phase != Phase::Ending)
            .map_or(&stored, |j| &j.rec);
        Response::json(202, &wj::job_json(eid, rec, &self.prices(), now_ms()))
    }

    /// A submit without a known idempotency key: checked against the class, the
    /// limits, `max_cost` and the budget, then committed.
    fn job_submit_checked(
        &mut self,
        ck: usize,
        serial: u64,
        tenant: String,
        s: wj::Submit,
        retry_of: Option<String>,
    ) {
        let answer =
            |d: &mut Daemon, resp: Response| d.on_outcome(ck, serial, Outcome::Respond(resp));
        let prices = self.prices();
        let mut s = s;
        if s.spec.wasm.is_some() {
            // No class: 1 vCPU and its memory limit at the economy rate, whatever the
            // tenant's default class is.
            let c = crate::wbx::compute::default_class();
            s.spec.compute_class = c.name.to_string();
            s.spec.class_rate = Some(prices.rate(c));
        } else if let Err(c) = self.job_class(&tenant, &mut s.spec, &prices) {
            answer(self, crate::wbx::compute::not_offered("compute_class", &c));
            return;
        }
        if let Some(w) = &s.spec.wasm {
            if let Some(why) = wasi::wasi_refusal(self) {
                answer(self, crate::wbx::error(503, why));
                return;
            }
            if let Some(resp) = self.wasi_bytes_refusal(&tenant, w.module_bytes + w.stdin_bytes) {
                answer(self, resp);
                return;
            }
        }
        let worst = worst_case(&s.spec, &prices);
        if let Some(resp) = self.job_admission(&tenant, 1) {
            answer(self, resp);
            return;
        }
        if let Some(why) = max_cost_refusal(&s.spec, worst, &prices) {
            answer(self, crate::wbx::error(400, &why));
            return;
        }
        if let Some(why) = self.budget_refusal(&tenant, worst) {
            answer(self, crate::wbx::error(402, &why));
            return;
        }
        let Some(hex_id) = super::boxes::random_hex() else {
            answer(
                self,
                crate::wbx::error(503, "the system's random source failed; retry"),
            );
            return;
        };
        let id = format!("job_{hex_id}");
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
        let rec = JobRecord {
            tenant: tenant.clone(),
            status: "queued".into(),
            spec: s.spec,
            sealed_env: sealed,
            retry_of,
            created_ms: now_ms(),
            // Nothing has happened to it yet.
            ..JobRecord::default()
        };
        self.jobs.pending_add(&tenant, 1, worst);
        // Its env values are not kept while it waits: its start opens them again.
        drop(s.env);
        if s.wasm_bytes.is_none() && s.wasm_from.is_none() {
            self.job_submit_store(ck, serial, tenant, id, rec, key, worst, false);
            return;
        }
        // A WebAssembly job's module and stdin are files beside its record, written
        // (and synced) before the record is: a crash in between leaves a directory
        // without a record, which the next start removes.
        let dir = self.jobs.dir.clone();
        let (bytes, from) = (s.wasm_bytes, s.wasm_from);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let r = write_wasm_files(&dir, &id, bytes.as_ref(), from.as_deref());
            if r.is_err() {
                // Half written (a full disk): nothing of it stays.
                let _ = std::fs::remove_dir_all(dir.join(&id));
            }
            Box::new(move |d: &mut Daemon| match r {
                Ok(()) => d.job_submit_store(ck, serial, tenant, id, rec, key, worst, true),
                Err(e) => {
                    log::error!("jobs: {id}: writing its module: {e}");
                    d.jobs.pending_done(&tenant, 1, worst);
                    d.on_outcome(ck, serial, Outcome::Respond(store_refusal()));
                }
            })
        }));
    }

    /// Commits a new job's record (`files`: its directory holds its WebAssembly files
    /// already, removed unless it is committed as a new job).
    #[allow(clippy::too_many_arguments)]
    fn job_submit_store(
        &mut self,
        ck: usize,
        serial: u64,
        tenant: String,
        id: String,
        rec: JobRecord,
        key: Option<[u8; 32]>,
        worst: i128,
        files: bool,
    ) {
        let mailbox = self.reactor.mailbox();
        self.app
            .sessions
            .store()
            .submit_job_then(&id.clone(), rec, key, move |r| {
                mailbox.send(Box::new(move |d: &mut Daemon| {
                    d.jobs.pending_done(&tenant, 1, worst);
                    let prices = d.prices();
                    let resp = match r {
                        Ok((Submitted::New, rec)) => {
                            log::info!(
                                "job {id} accepted tenant={} template={}",
                                rec.tenant,
                                rec.spec.template
                            );
                            let body = wj::job_json(&id, &rec, &prices, now_ms());
                            d.jobs.serial += 1;
                            let key = d.jobs.live.insert(Live::new(
                                d.jobs.serial,
                                id.clone(),
                                rec,
                                Vec::new(),
                            ));
                            d.jobs.by_id.insert(id, key);
                            d.jobs.queue.push_back(key);
                            d.job_pump();
                            Response::json(202, &body)
                        }
                        // The same key: the same job, as it is now.
                        Ok((Submitted::Existing(eid, er), _)) => {
                            d.job_files_drop(files, &id);
                            d.existing_job(&eid, *er)
                        }
                        Ok((Submitted::Refused(why), _)) => {
                            d.job_files_drop(files, &id);
                            crate::wbx::error(400, &why)
                        }
                        Err(e) => {
                            log::error!("jobs: storing {id}: {e}");
                            d.job_files_drop(files, &id);
                            store_refusal()
                        }
                    };
                    d.on_outcome(ck, serial, Outcome::Respond(resp));
                }));
            });
    }

    /// Removes the directory of a job that was not committed (when `files` made one).
    fn job_files_drop(&mut self, files: bool, id: &str) {
        if !files {
            return;
        }
        let dir = self.jobs.dir.join(id);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let _ = std::fs::remove_dir_all(&dir);
            Box::new(|_: &mut Daemon| {})
        }));
    }

    /// `POST /v1/jobs/{id}/retry`: a new job with the same inputs and the env values
    /// sent again.
    fn job_retry(&mut self, ck: usize, tenant: String, id: String, env: Vec<(String, String)>) {
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        self.conn_own(ck, Owner::Job);
        let live = self
            .jobs
            .by_id
            .get(&id)
            .and_then(|&k| self.jobs.live.get(k))
            .map(|j| j.rec.clone());
        if let Some(rec) = live {
            self.job_retry_with((ck, serial), tenant, id, env, Ok(Some(rec)));
            return;
        }
        let sessions = Arc::clone(&self.app.sessions);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let rec = sessions.store().job(&id).map_err(|e| e.to_string());
            Box::new(move |d: &mut Daemon| d.job_retry_with((ck, serial), tenant, id, env, rec))
        }));
    }

    fn job_retry_with(
        &mut self,
        client: (usize, u64),
        tenant: String,
        id: String,
        env: Vec<(String, String)>,
        rec: Result<Option<JobRecord>, String>,
    ) {
        let (ck, serial) = client;
        if !self.conn_waiting(ck, serial, false) {
            return;
        }
        let answer =
            |d: &mut Daemon, resp: Response| d.on_outcome(ck, serial, Outcome::Respond(resp));
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                log::error!("jobs: reading {id}: {e}");
                answer(self, store_refusal());
                return;
            }
        };
        let Some(rec) = rec.filter(|r| r.tenant == tenant) else {
            answer(self, wj::not_found());
            return;
        };
        let missing: Vec<&str> = rec
            .spec
            .env_names
            .iter()
            .filter(|n| !env.iter().any(|(k, _)| k == *n))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            let resp = crate::wbx::error(
                400,
                &format!(
                    "env: env values are not stored; send them again: {{\"env\": {{…}}}} with {}",
                    missing.join(", ")
                ),
            );
            answer(self, resp);
            return;
        }
        let mut spec = rec.spec.clone();
        spec.idempotency_key = None;
        // A new job: its class stays (a job from before classes was economy), its rate
        // is the price list's now.
        if spec.compute_class.is_empty() {
            spec.compute_class = crate::wbx::compute::DEFAULT.to_string();
        }
        spec.class_rate = None;
        // A job of a batch retried stands alone: its inputs name their jobs by id, and
        // are checked again as for any new job.
        for input in &mut spec.inputs {
            input.from_index = None;
        }
        spec.env_names = env.iter().map(|(k, _)| k.clone()).collect();
        spec.env_sha256 = (!env.is_empty()).then(|| crate::jobs::env_sha256(&env));
        let wasm_from = spec.wasm.is_some().then(|| id.clone());
        let submit = wj::Submit {
            spec,
            env,
            wasm_bytes: None,
            wasm_from,
        };
        self.job_submit(ck, tenant, submit, Some(id));
    }

    /// `POST /v1/jobs/{id}/cancel`.
    fn job_cancel(&mut self, ck: usize, tenant: &str, id: &str) {
        let Some(&jk) = self.jobs.by_id.get(id) else {
            // Not live: finished, or not there (read on the pool).
            let (sessions, id, tenant) = (
                Arc::clone(&self.app.sessions),
                id.to_string(),
                tenant.to_string(),
            );
            self.start_job(
                ck,
                Box::new(move || {
                    let resp = match sessions.store().job(&id) {
                        Ok(Some(r)) if r.tenant == tenant => crate::wbx::error(
                            409,
                            &format!("the job has already finished ({})", r.status),
                        ),
                        Ok(_) => wj::not_found(),
                        Err(e) => {
                            log::error!("jobs: reading {id}: {e}");
                            store_refusal()
                        }
                    };
                    Outcome::Respond(resp)
                }),
            );
            return;
        };
        if self
            .jobs
            .live
            .get(jk)
            .is_none_or(|j| j.rec.tenant != tenant)
        {
            self.respond(ck, wj::not_found());
            return;
        }
        if let Some(j) = self
            .jobs
            .live
            .get(jk)
            .filter(|j| j.written || j.rec.finished())
        {
            // Ended (its end being written, or its sandbox being removed).
            let resp = crate::wbx::error(
                409,
                &format!("the job has already finished ({})", j.rec.status),
            );
            self.respond(ck, resp);
            return;
        }
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        self.conn_own(ck, Owner::Job);
        let Some(j) = self.jobs.live.get_mut(jk) else {
            return;
        };
        j.cancel_waiters.push((ck, serial));
        if j.cancelled {
            return;
        }
        log::info!("job {id} cancelled by its tenant");
        self.job_cancel_quietly(jk, cancelled(), "its job was cancelled");
    }

    /// Cancels live job `jk` (once; not after its end) with error `e`: a queued job
    /// ends at once, a running one when its sandbox (ended for `why`) is gone.
    fn job_cancel_quietly(&mut self, jk: usize, e: JobError, why: &str) {
        let Some(j) = self.jobs.live.get_mut(jk) else {
            return;
        };
        if j.cancelled || j.written || j.rec.finished() {
            return;
        }
        j.cancelled = true;
        // Kept apart until its end: a job cancelled while its files are saved, or
        // whose command exits meanwhile, ends `cancelled` all the same.
        j.cancel_error = Some(e);
        let js = j.serial;
        match (j.phase, j.sbx) {
            (Phase::Queued, _) => {
                self.jobs.queue.retain(|&k| k != jk);
                self.job_end(jk, js);
            }
            (Phase::Ending, _) => {}
            (_, Some((key, _))) => self.box_end(key, why),
            // A WebAssembly job's process: its thread kills it and reports.
            (_, None) if j.wasi_stop.is_some() => {
                if let Some(stop) = &j.wasi_stop {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            // Its starting record is being written: the boot sees the cancel.
            (_, None) => {}
        }
    }

    /// Starts queued jobs while there is room.
    pub(crate) fn job_pump(&mut self) {
        if self.app.shutting_down {
            return;
        }
        loop {
            let running = self
                .jobs
                .live
                .iter()
                .filter(|(_, j)| j.phase != Phase::Queued)
                .count();
            if running >= self.cfg.wbx.jobs.running
                || self.boxes.on_server() >= self.cfg.wbx.max_total
            {
                return;
            }
            // The tenant with the fewest jobs running goes next (in the order its jobs
            // were accepted): one tenant's thousand queued jobs do not starve another's.
            let mut busy: HashMap<&str, usize> = HashMap::new();
            let mut batch_busy: HashMap<&str, u32> = HashMap::new();
            for (_, j) in self
                .jobs
                .live
                .iter()
                .filter(|(_, j)| j.phase != Phase::Queued)
            {
                *busy.entry(j.rec.tenant.as_str()).or_default() += 1;
                if let Some(b) = &j.rec.batch {
                    *batch_busy.entry(b.as_str()).or_default() += 1;
                }
            }
            // A job of a batch waits for the jobs it depends on, and for room in its
            // batch's max_concurrency.
            let next = self
                .jobs
                .queue
                .iter()
                .enumerate()
                .filter_map(|(i, &k)| self.jobs.live.get(k).map(|j| (i, j)))
                .filter(|(_, j)| !self.job_batch_holds(j, &batch_busy))
                .min_by_key(|(i, j)| (busy.get(j.rec.tenant.as_str()).copied().unwrap_or(0), *i))
                .map(|(i, _)| i);
            let Some(jk) = next.and_then(|i| self.jobs.queue.remove(i)) else {
                return;
            };
            self.job_start(jk);
        }
    }

    /// Starts the job's next attempt: its env values opened on the pool (a queued
    /// job does not keep them in memory), then [`Daemon::job_start_with`].
    fn job_start(&mut self, jk: usize) {
        let Some(j) = self.jobs.live.get_mut(jk) else {
            return;
        };
        j.phase = Phase::Starting;
        let js = j.serial;
        match (j.rec.sealed_env.clone(), j.env.is_empty()) {
            (Some(sealed), true) => {
                let id = j.id.clone();
                let sessions = Arc::clone(&self.app.sessions);
                self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
                    let env = match sessions.store().job_key(&id) {
                        Ok(Some(key)) => crate::jobs::open(&key, &sealed)
                            .ok_or_else(|| "its env values did not open".to_string()),
                        Ok(None) => Err("the key of its env values is gone".to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    Box::new(move |d: &mut Daemon| d.job_start_with(jk, js, env))
                }));
            }
            _ => {
                let env = Ok(std::mem::take(&mut j.env));
                self.job_start_with(jk, js, env);
            }
        }
    }

    /// With its env values: its log's writer (one per job, for every attempt), its
    /// `starting` record written, then its sandbox booted.
    fn job_start_with(&mut self, jk: usize, js: u64, env: Result<Vec<(String, String)>, String>) {
        let dir = self.jobs.dir.clone();
        let mailbox = self.reactor.mailbox();
        let Some(j) = self.job(jk, js) else {
            return;
        };
        let env = match env {
            Ok(e) => e,
            Err(why) => {
                log::error!("jobs: {}: {why}", j.id);
                fail(
                    &mut j.rec,
                    "sandbox_lost",
                    &format!("the job could not start: {why}"),
                    "system",
                );
                self.job_end(jk, js);
                return;
            }
        };
        if j.cancelled {
            self.job_end(jk, js);
            return;
        }
        j.redact = Redactor::new(env.iter().map(|(_, v)| v.as_str()));
        j.env = env;
        j.rec.attempt += 1;
        j.rec.status = "starting".into();
        j.rec.started_ms = Some(now_ms());
        j.rec.ended_ms = None;
        j.rec.exit_code = None;
        j.rec.error = None;
        j.timed_out = false;
        j.exit = None;
        j.pid = None;
        j.logged = 0;
        j.held = false;
        j.run_ms = 0;
        j.ran = None;
        if j.writer.is_none() {
            // Messages wait in the channel until the thread is up (it is started on
            // the pool: this thread may not make files or threads).
            let (tx, rx) = crossbeam_channel::unbounded::<Msg>();
            j.writer_gen += 1;
            j.unacked = 0;
            let wgen = j.writer_gen;
            j.writer = Some(LogWriter { tx });
            let (id, job_dir) = (j.id.clone(), dir.join(&j.id));
            self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
                let r = start_writer(&job_dir, (jk, js, wgen), rx, mailbox);
                Box::new(move |d: &mut Daemon| {
                    if let Err(e) = r {
                        log::error!("jobs: {id}: its log: {e}");
                        d.job_writer_lost(jk, js, wgen);
                    }
                })
            }));
        }
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if j.rec.attempt > 1 {
            let why = j
                .rec
                .attempts
                .last()
                .and_then(|a| a.error.as_ref())
                .map_or(String::new(), |e| format!(": {}", e.message));
            let note = format!(
                "\n[wbx] attempt {} of {} (the previous one failed on our side{why})\n",
                j.rec.attempt, j.rec.spec.retry.max_attempts
            );
            self.job_note(jk, js, &note);
        }
        let Some(j) = self.job(jk, js) else {
            return;
        };
        let (id, rec) = (j.id.clone(), j.rec.clone());
        let mailbox = self.reactor.mailbox();
        self.app
            .sessions
            .store()
            .put_job_then(&id.clone(), &rec, false, move |r| {
                mailbox.send(Box::new(move |d: &mut Daemon| {
                    if let Err(e) = &r {
                        log::error!("jobs: {id}: writing its start: {e}");
                    }
                    d.job_boot(jk, js, r.is_ok());
                }));
            });
    }

    /// Its `starting` record is durable (`stored`): boot its sandbox.
    fn job_boot(&mut self, jk: usize, js: u64, stored: bool) {
        let runtimes = Arc::clone(&self.app.runtimes);
        if self.app.shutting_down {
            // Its record says `starting`: the next start recovers it.
            return;
        }
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if j.cancelled || !stored {
            // Cancelled while its start was written; or the store failed: it did not
            // start, and waits for the next turn.
            if !stored && !j.cancelled {
                j.phase = Phase::Queued;
                j.rec.attempt -= 1;
                j.rec.status = "queued".into();
                self.jobs.queue.push_front(jk);
                return;
            }
            self.job_end(jk, js);
            return;
        }
        if j.rec.spec.wasm.is_some() {
            if j.rec.spec.inputs.is_empty() {
                self.job_boot_wasi(jk, js, Ok(None));
                return;
            }
            let (id, inputs) = (j.id.clone(), j.rec.spec.inputs.clone());
            let (sessions, dir) = (Arc::clone(&self.app.sessions), self.jobs.dir.clone());
            self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
                let r = stage_inputs(sessions.store(), &dir, &id, &inputs).map(Some);
                Box::new(move |d: &mut Daemon| d.job_boot_wasi(jk, js, r))
            }));
            return;
        }
        let template = j.rec.spec.template.clone();
        let Some((_, runtime, _)) = wsb::templates(&runtimes)
            .into_iter()
            .find(|(n, _, _)| *n == template)
        else {
            fail(
                &mut j.rec,
                "template_gone",
                &format!("the template {template:?} is not on this server any more"),
                "job",
            );
            self.job_end(jk, js);
            return;
        };
        let network = match wsb::network(Some(&j.rec.spec.network)) {
            Ok(n) => n,
            Err(_) => {
                fail(
                    &mut j.rec,
                    "bad_network",
                    "its network policy no longer parses on this server",
                    "job",
                );
                self.job_end(jk, js);
                return;
            }
        };
        let create = Create {
            template,
            runtime,
            timeout_s: j.rec.spec.timeout_s + SANDBOX_EXTRA_S,
            env: Vec::new(),
            metadata: Default::default(),
            network,
            compute_class: Some(crate::wbx::compute::of_job(&j.rec.spec)),
        };
        if j.rec.spec.inputs.is_empty() {
            self.job_boot_sandbox(jk, js, create, Ok(None));
            return;
        }
        // Its inputs are copied (and their SHA-256 checked again) on the pool first.
        let (id, inputs) = (j.id.clone(), j.rec.spec.inputs.clone());
        let (sessions, dir) = (Arc::clone(&self.app.sessions), self.jobs.dir.clone());
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let r = stage_inputs(sessions.store(), &dir, &id, &inputs).map(Some);
            Box::new(move |d: &mut Daemon| d.job_boot_sandbox(jk, js, create, r))
        }));
    }

    /// Takes its staged inputs: their directory (`None`: it has none), each input's size
    /// and SHA-256 recorded (a batch's `from_index` inputs had none until now: their
    /// jobs had not finished). When they could not be staged the job has failed (its
    /// inputs' fault) or is lost (ours), and this answers `None`; so it does for a job
    /// cancelled meanwhile, which ends here.
    fn job_staged(
        &mut self,
        jk: usize,
        js: u64,
        staged: Result<Option<Staged>, JobError>,
    ) -> Option<Option<PathBuf>> {
        let j = self.job(jk, js)?;
        if j.cancelled {
            self.job_end(jk, js);
            return None;
        }
        match staged {
            Ok(None) => Some(None),
            Ok(Some((dir, files))) => {
                for (input, (size, sha)) in j.rec.spec.inputs.iter_mut().zip(files) {
                    input.size = Some(size);
                    input.sha256 = Some(sha);
                }
                Some(Some(dir))
            }
            Err(e) => {
                let note = format!("[wbx] {}\n", e.message);
                if e.kind == "system" {
                    self.job_lost(jk, js, &e.message);
                } else {
                    j.rec.error = Some(e);
                    j.rec.status = "failed".into();
                    self.job_note(jk, js, &note);
                    self.job_end(jk, js);
                }
                None
            }
        }
    }

    /// Boots its sandbox, with its staged inputs (or why they could not be).
    fn job_boot_sandbox(
        &mut self,
        jk: usize,
        js: u64,
        create: Create,
        staged: Result<Option<Staged>, JobError>,
    ) {
        if self.app.shutting_down {
            return;
        }
        let Some(input) = self.job_staged(jk, js, staged) else {
            return;
        };
        let ro_binds = match input {
            Some(dir) => vec![(dir, format!("{HOME}/{INPUT_DIR}"))],
            None => Vec::new(),
        };
        let Some(j) = self.job(jk, js) else {
            return;
        };
        let tenant = j.rec.tenant.clone();
        if self.box_init_missing() {
            self.job_lost(jk, js, super::boxes::INIT_MISSING);
            return;
        }
        if ro_binds.is_empty() {
            // Nothing to bind at boot: a sandbox of the warm pool serves, and its
            // command starts at once.
            let owner = BoxOwner::Job(jk, js);
            if let Some(key) = self.box_take_for_job(tenant.clone(), &create, owner) {
                let bserial = self.boxes.boxes[key].serial;
                if let Some(j) = self.job(jk, js) {
                    j.sbx = Some((key, bserial));
                }
                self.job_ready(jk, js, key);
                return;
            }
        }
        let boot = InternalBoot {
            owner: BoxOwner::Job(jk, js),
            limits: super::boxes::wbx_limits(
                create
                    .compute_class
                    .unwrap_or_else(crate::wbx::compute::default_class),
            ),
            files: Vec::new(),
            ro_binds,
        };
        match self.box_boot(None, tenant, create, Some(boot)) {
            Ok(key) => {
                let bserial = self.boxes.boxes[key].serial;
                if let Some(j) = self.job(jk, js) {
                    j.sbx = Some((key, bserial));
                }
            }
            Err(_) => self.job_lost(
                jk,
                js,
                "its sandbox could not be started: the daemon is overloaded",
            ),
        }
    }

    /// Its sandbox said hello: start the command.
    pub(super) fn job_ready(&mut self, jk: usize, js: u64, key: usize) {
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if j.sbx.map(|s| s.0) != Some(key) {
            return;
        }
        let call = Call::Spawn {
            cmd: j.rec.spec.command.clone(),
            cwd: Some(HOME.to_string()),
            env: j.env.clone(),
            stdin: false,
            pty: None,
            background: false,
        };
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let call_id = b.take_call_id();
        if wire::encode_json(&mut b.wbuf, Kind::Call, call_id, &call).is_err() {
            if let Some(j) = self.job(jk, js) {
                fail(
                    &mut j.rec,
                    "command_too_large",
                    "the command and its env are larger than a sandbox call takes (1 MiB)",
                    "job",
                );
            }
            self.box_end(key, "its job's command was too large");
            return;
        }
        self.box_flush(key);
        let gen = self
            .reactor
            .arm_new(Instant::now() + CALL_TIMEOUT, Addr::new(JOBS, jk, DEADLINE));
        if let Some(j) = self.job(jk, js) {
            j.call = call_id;
            j.gen = gen;
        }
    }

    /// A frame of its sandbox's init.
    pub(super) fn job_frame(&mut self, jk: usize, js: u64, key: usize, f: &wire::Frame) {
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if j.sbx.map(|s| s.0) != Some(key) {
            return;
        }
        match f.kind {
            Kind::Reply if j.pid.is_none() && f.channel == j.call && j.phase == Phase::Starting => {
                self.job_spawned(jk, js, key, &f.payload)
            }
            Kind::Output if Some(f.channel) == j.pid => self.job_output(jk, js, &f.payload),
            Kind::Exit if Some(f.channel) == j.pid && j.exit.is_none() => {
                let exited: Exited = serde_json::from_slice(&f.payload).unwrap_or(Exited {
                    code: 128 + libc::SIGKILL,
                    signal: Some(libc::SIGKILL),
                });
                self.job_exited(jk, js, key, exited.code);
            }
            Kind::Reply if j.phase == Phase::Saving => {
                self.save_reply(jk, js, key, f.channel, &f.payload)
            }
            Kind::FileData if j.phase == Phase::Saving => {
                self.save_data(jk, js, key, f.channel, &f.payload)
            }
            // Answers to holds, releases and signals: nothing waits on them.
            _ => {}
        }
    }

    fn job_spawned(&mut self, jk: usize, js: u64, key: usize, payload: &[u8]) {
        let pid = match serde_json::from_slice::<Reply>(payload) {
            Ok(Reply::Ok(v)) => v["pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
            Ok(Reply::Error(e)) => {
                let msg = format!("the command could not be started: {e}");
                if let Some(j) = self.job(jk, js) {
                    fail(&mut j.rec, "start_failed", &msg, "job");
                }
                self.job_note(jk, js, &format!("[wbx] {msg}\n"));
                self.box_end(key, "its job's command could not start");
                return;
            }
            _ => None,
        };
        let Some(pid) = pid else {
            self.box_end(key, "its init broke the protocol");
            return;
        };
        let Some(j) = self.job(jk, js) else {
            return;
        };
        j.pid = Some(pid);
        j.phase = Phase::Running;
        j.ran = Some(Instant::now());
        j.rec.status = "running".into();
        let limit = Duration::from_secs(j.rec.spec.timeout_s);
        let gen = self
            .reactor
            .arm_new(Instant::now() + limit, Addr::new(JOBS, jk, DEADLINE));
        if let Some(j) = self.job(jk, js) {
            j.gen = gen;
        }
        self.job_store(jk, js, false);
    }

    /// Queues the job's record for the writer (its state moved on); nothing waits on it
    /// (its end is written with [`Daemon::job_finish`], which waits).
    fn job_store(&mut self, jk: usize, js: u64, drop_key: bool) {
        let Some(j) = self.job(jk, js) else {
            return;
        };
        let (id, rec) = (j.id.clone(), j.rec.clone());
        self.app
            .sessions
            .store()
            .put_job_then(&id.clone(), &rec, drop_key, move |r| {
                if let Err(e) = r {
                    log::error!("jobs: {id}: writing its state: {e}");
                }
            });
    }

    /// Output of the command: redacted, into the log up to its cap.
    fn job_output(&mut self, jk: usize, js: u64, payload: &[u8]) {
        let cap = self.cfg.wbx.jobs.log_bytes;
        let Some((stream, _, data)) = wire::parse_output(payload) else {
            return;
        };
        let _ = stream;
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if j.logged >= cap {
            // Past the cap nothing is kept: nothing to redact either.
            j.rec.log_dropped += data.len() as u64;
            return;
        }
        let out = j.redact.push(data);
        j.log(out, cap);
        if j.unacked > LOG_HOLD_BYTES && !j.held {
            if let (Some(pid), Some((key, _))) = (j.pid, j.sbx) {
                j.held = true;
                self.box_call(key, &Call::Hold { pid });
            }
        }
    }

    /// Writes a line of our own into the job's log.
    fn job_note(&mut self, jk: usize, js: u64, note: &str) {
        if let Some(j) = self.job(jk, js) {
            if let Some(w) = &j.writer {
                j.unacked += note.len() as u64;
                let _ = w.tx.send(Msg::Log(note.as_bytes().to_vec()));
            }
        }
    }

    /// Writer `wgen` could not start (its directory or log could not be made): a
    /// failure on our side. A running attempt is lost (retried as `retry` asks); an
    /// ending job is written without a log.
    fn job_writer_lost(&mut self, jk: usize, js: u64, wgen: u64) {
        let Some(j) = self.job(jk, js).filter(|j| j.writer_gen == wgen) else {
            return;
        };
        j.writer = None;
        j.unacked = 0;
        j.held = false;
        let (phase, written, sbx) = (j.phase, j.written, j.sbx);
        match (phase, sbx) {
            (Phase::Ending, _) if !written => self.job_finish(jk, js, None),
            (Phase::Starting | Phase::Running | Phase::Saving, Some((key, _))) => {
                self.box_end(key, "its job's log could not be written")
            }
            // A WebAssembly job's run: killed; its end sees the lost log.
            (Phase::Running, None) => {
                if let Some(stop) = self.job(jk, js).and_then(|j| j.wasi_stop.clone()) {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            _ => {}
        }
    }

    /// Writer `wgen` wrote `n` log bytes.
    fn job_log_acked(&mut self, jk: usize, js: u64, wgen: u64, n: u64) {
        let Some(j) = self.job(jk, js).filter(|j| j.writer_gen == wgen) else {
            return;
        };
        j.unacked = j.unacked.saturating_sub(n);
        if j.held && j.unacked < LOG_RELEASE_BYTES {
            j.held = false;
            if let (Some(pid), Some((key, _))) = (j.pid, j.sbx) {
                self.box_call(key, &Call::Release { pid });
            }
        }
    }

    /// The command exited: measure, then save its result files.
    fn job_exited(&mut self, jk: usize, js: u64, key: usize, code: i32) {
        let cap = self.cfg.wbx.jobs.log_bytes;
        let Some(j) = self.job(jk, js) else {
            return;
        };
        j.exit = Some(code);
        j.rec.exit_code = Some(code);
        j.run_ms = j.ran.map_or(0, |t| {
            u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
        });
        let rest = j.redact.finish();
        j.log(rest, cap);
        if j.rec.log_dropped > 0 {
            let note = format!(
                "\n[wbx] the log keeps {cap} bytes of output; {} more were dropped\n",
                j.rec.log_dropped
            );
            if let Some(w) = &j.writer {
                j.unacked += note.len() as u64;
                let _ = w.tx.send(Msg::Log(note.into_bytes()));
            }
        }
        // Its sandbox's cgroup: CPU time and peak memory of everything in it (the
        // command, init and gVisor's own processes).
        // Read before the saving starts, so the receipt has them.
        let Some(cg) = self.boxes.boxes.get(key).and_then(|b| b.cgroup.clone()) else {
            self.job_save(jk, js, key);
            return;
        };
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let u = cg.usage();
            let cpu = (u.cpu_ns > 0).then_some(u.cpu_ns / 1_000_000);
            let peak = cg.peak_memory_bytes();
            Box::new(move |d: &mut Daemon| {
                let Some(j) = d.job(jk, js) else {
                    return;
                };
                j.rec.cpu_ms = cpu;
                j.rec.peak_memory_bytes = peak;
                if j.phase == Phase::Running && j.sbx.map(|s| s.0) == Some(key) {
                    d.job_save(jk, js, key);
                }
            })
        }));
    }

    /// Lists what the patterns could match, then fetches the matches one by one.
    fn job_save(&mut self, jk: usize, js: u64, key: usize) {
        let Some(j) = self.job(jk, js) else {
            return;
        };
        j.phase = Phase::Saving;
        j.rec.status = "uploading_artifacts".into();
        let mut patterns = Vec::new();
        for p in j
            .rec
            .spec
            .artifacts
            .iter()
            .chain(&j.rec.spec.required_artifacts)
        {
            if let Ok(p) = Pattern::parse(p) {
                patterns.push(p);
            }
        }
        let mut save = Save {
            patterns,
            match_budget: crate::jobs::MATCH_BUDGET,
            ..Save::default()
        };
        for p in &save.patterns {
            let (base, _) = p.base();
            if save.visited.insert(base.to_string()) {
                save.dirs.push_back(base.to_string());
            }
        }
        j.save = Some(save);
        let gen = self
            .reactor
            .arm_new(Instant::now() + SAVE_TIMEOUT, Addr::new(JOBS, jk, DEADLINE));
        if let Some(j) = self.job(jk, js) {
            j.gen = gen;
        }
        self.job_store(jk, js, false);
        self.save_next(jk, js, key);
    }

    /// Sends `call` to sandbox `key`'s init; its call id (`None`: the sandbox is gone).
    /// A file call is a few hundred bytes: always within a frame.
    fn job_box_call(&mut self, key: usize, call: &Call) -> Option<u32> {
        let b = self.boxes.boxes.get_mut(key)?;
        let call_id = b.take_call_id();
        let _ = wire::encode_json(&mut b.wbuf, Kind::Call, call_id, call);
        self.box_flush(key);
        Some(call_id)
    }

    /// The saving's next step: a directory to list, a file to fetch, or the end.
    fn save_next(&mut self, jk: usize, js: u64, key: usize) {
        let c = self.cfg.wbx.jobs.clone();
        let tenant_used = {
            let Some(j) = self.job(jk, js) else {
                return;
            };
            j.rec.tenant.clone()
        };
        let tenant_used = self
            .jobs
            .tenant_bytes
            .get(&tenant_used)
            .copied()
            .unwrap_or(0);
        let Some(j) = self.job(jk, js) else {
            return;
        };
        let Some(save) = j.save.as_mut() else {
            return;
        };
        if save.listing.is_some() || save.cur.is_some() {
            return;
        }
        if let Some(dir) = save.dirs.pop_front() {
            let path = if dir.is_empty() {
                HOME.to_string()
            } else {
                format!("{HOME}/{dir}")
            };
            let list = FsCall::List {
                path: path.into_bytes(),
                depth: 1,
            };
            let Some(call_id) = self.job_box_call(key, &Call::Fs(list)) else {
                return;
            };
            if let Some(save) = self.job(jk, js).and_then(|j| j.save.as_mut()) {
                save.listing = Some(call_id);
            }
            return;
        }
        if save.todo.is_empty() && !save.found.is_empty() {
            save.todo = std::mem::take(&mut save.found).into_iter().collect();
        }
        while let Some((name, size)) = save.todo.pop_front() {
            let skip = if save.saved.len() >= c.artifact_files {
                Some(format!(
                    "over the limit of {} result files per job",
                    c.artifact_files
                ))
            } else {
                size_refusal(&c, size, save.bytes, tenant_used)
            };
            if let Some(reason) = skip {
                save.skip(Skipped { name, reason });
                continue;
            }
            let file = format!("a{}", save.next_file);
            save.next_file += 1;
            let open = Call::Fs(FsCall::Open {
                path: format!("{HOME}/{name}").into_bytes(),
                write: false,
            });
            let Some(call_id) = self.job_box_call(key, &open) else {
                return;
            };
            if let Some(save) = self.job(jk, js).and_then(|j| j.save.as_mut()) {
                save.cur = Some(Fetch {
                    fid: 0,
                    name,
                    call: call_id,
                    opened: false,
                    size: 0,
                    received: 0,
                    granted: 0,
                    acked: 0,
                    file,
                });
            }
            return;
        }
        // Everything is saved or skipped.
        self.job_saved(jk, js);
    }

    /// A reply during the saving: a listing, or a file opened.
    fn save_reply(&mut self, jk: usize, js: u64, key: usize, channel: u32, payload: &[u8]) {
        let c = self.cfg.wbx.jobs.clone();
        let found_cap = c.artifact_files + MAX_FOUND_EXTRA;
        let tenant = match self.job(jk, js) {
            Some(j) => j.rec.tenant.clone(),
            None => return,
        };
        let tenant_used = self.jobs.tenant_bytes.get(&tenant).copied().unwrap_or(0);
        let dir_writer = self.jobs.dir.clone();
        let Some(j) = self.job(jk, js) else {
            return;
        };
        let job_dir = dir_writer.join(&j.id);
        let Some(save) = j.save.as_mut() else {
            return;
        };
        let reply = serde_json::from_slice::<Reply>(payload).ok();
        if save.listing == Some(channel) {
            save.listing = None;
            if let Some(Reply::Ok(v)) = reply {
                let entries: Vec<FsEntry> =
                    serde_json::from_value(v["entries"].clone()).unwrap_or_default();
                if v["truncated"].as_bool() == Some(true) {
                    save.skip(Skipped {
                        name: entries
                            .first()
                            .map(|e| String::from_utf8_lossy(&e.path))
                            .and_then(|p| p.rsplit_once('/').map(|(d, _)| rel(d)))
                            .unwrap_or_default(),
                        reason: format!(
                            "a directory of more than {} entries: only the first were looked at",
                            wire::FS_LIST_ENTRIES
                        ),
                    });
                }
                for e in entries {
                    let utf8 = std::str::from_utf8(&e.path).is_ok();
                    let name = rel(&String::from_utf8_lossy(&e.path));
                    if name.is_empty() {
                        continue;
                    }
                    let mut matched = Some(false);
                    for p in &save.patterns {
                        matched = p.matches_within(&name, &mut save.match_budget);
                        if matched != Some(false) {
                            break;
                        }
                    }
                    let Some(matched) = matched else {
                        // Hostile patterns, or a tree too deep for them: what is left
                        // is not looked through (the loop's time is everyone's).
                        save.skip(Skipped {
                            name,
                            reason: format!("not looked through, nor anything after it: matching the result-file patterns took more than {} steps", crate::jobs::MATCH_BUDGET),
                        });
                        save.dirs.clear();
                        break;
                    };
                    if !utf8 {
                        // A result file's name is text in every answer and URL.
                        if matched {
                            save.skip(Skipped {
                                name,
                                reason: "its name is not UTF-8 (shown with U+FFFD): not saved"
                                    .into(),
                            });
                        }
                        continue;
                    }
                    match e.kind.as_str() {
                        "file" if matched => {
                            if save.found.len() < found_cap {
                                save.found.insert(name, e.size);
                            } else {
                                save.more_skipped += 1;
                            }
                        }
                        "dir" => {
                            let descend = save.found.len() < found_cap
                                && save.patterns.iter().any(|p| could_hold(p, &name));
                            if descend && !save.visited.contains(&name) {
                                if save.visited.len() >= MAX_LISTED_DIRS {
                                    save.skip(Skipped {
                                        name,
                                        reason: format!("not looked through: more than {MAX_LISTED_DIRS} directories matched the patterns"),
                                    });
                                } else {
                                    save.visited.insert(name.clone());
                                    save.dirs.push_back(name);
                                }
                            }
                        }
                        _ if matched => save.skip(Skipped {
                            name,
                            reason: "not a regular file (a symbolic link, a socket or a device): not saved".into(),
                        }),
                        _ => {}
                    }
                }
            }
            // A pattern's directory that does not exist matches nothing.
            self.save_next(jk, js, key);
            return;
        }
        let Some(cur) = save.cur.as_mut().filter(|f| f.call == channel && !f.opened) else {
            return;
        };
        let size = match reply {
            Some(Reply::Ok(v)) => v["size"].as_u64(),
            Some(Reply::Refused { message, .. }) | Some(Reply::Error(message)) => {
                let name = cur.name.clone();
                save.cur = None;
                save.skip(Skipped {
                    name,
                    reason: format!("could not be opened: {message}"),
                });
                self.save_next(jk, js, key);
                return;
            }
            None => None,
        };
        let Some(size) = size else {
            self.box_end(key, "its init broke the protocol");
            return;
        };
        cur.opened = true;
        cur.size = size;
        if let Some(reason) = size_refusal(&c, size, save.bytes, tenant_used) {
            let name = cur.name.clone();
            save.cur = None;
            save.skip(Skipped { name, reason });
            self.box_call(key, &Call::FileClose { handle: channel });
            self.save_next(jk, js, key);
            return;
        }
        let path = job_dir.join(&cur.file);
        let grant = size.min(WINDOW);
        cur.granted = grant;
        if let Some(w) = &j.writer {
            j.files_opened += 1;
            cur.fid = j.files_opened;
            let _ = w.tx.send(Msg::Open(path));
            if size == 0 {
                let _ = w.tx.send(Msg::Close);
            }
        } else {
            let name = cur.name.clone();
            save.cur = None;
            save.skip(Skipped {
                name,
                reason: "could not be stored: the job's directory could not be written".into(),
            });
            self.box_call(key, &Call::FileClose { handle: channel });
            self.save_next(jk, js, key);
            return;
        }
        if size == 0 {
            self.box_call(key, &Call::FileClose { handle: channel });
        } else {
            self.box_call(
                key,
                &Call::FileMore {
                    handle: channel,
                    bytes: grant,
                },
            );
        }
    }

    /// Bytes of the file being fetched.
    fn save_data(&mut self, jk: usize, js: u64, key: usize, handle: u32, payload: &[u8]) {
        let Some(j) = self.job(jk, js) else {
            return;
        };
        let Some(save) = j.save.as_mut() else {
            return;
        };
        let Some(cur) = save.cur.as_mut().filter(|f| f.call == handle && f.opened) else {
            return;
        };
        if cur.received + payload.len() as u64 > cur.granted {
            // More than it was let send: it does not keep to the protocol.
            self.box_end(key, "its init sent more file data than it was granted");
            return;
        }
        let over = cur.received + payload.len() as u64 > cur.size;
        if payload.is_empty() || over {
            if cur.received == cur.size && !over {
                // init's end after the last bytes: already closed.
                return;
            }
            let name = cur.name.clone();
            save.cur = None;
            save.skip(Skipped {
                name,
                reason: "changed while it was being saved".into(),
            });
            if let Some(w) = &j.writer {
                let _ = w.tx.send(Msg::Discard);
            }
            if over {
                self.box_call(key, &Call::FileClose { handle });
            }
            self.save_next(jk, js, key);
            return;
        }
        cur.received += payload.len() as u64;
        let done = cur.received == cur.size;
        if let Some(w) = &j.writer {
            let _ = w.tx.send(Msg::Data(payload.to_vec()));
            if done {
                let _ = w.tx.send(Msg::Close);
            }
        }
        if done {
            self.box_call(key, &Call::FileClose { handle });
        }
    }

    /// Writer `wgen` wrote `n` bytes of its file `fid`: if that is the file being
    /// fetched, give init more credit.
    fn job_data_acked(&mut self, jk: usize, js: u64, wgen: u64, fid: u64, n: u64) {
        let Some(j) = self.job(jk, js).filter(|j| j.writer_gen == wgen) else {
            return;
        };
        let Some((key, _)) = j.sbx else {
            return;
        };
        let Some(cur) = j
            .save
            .as_mut()
            .and_then(|s| s.cur.as_mut())
            .filter(|c| c.fid == fid)
        else {
            return;
        };
        cur.acked = (cur.acked + n).min(cur.granted);
        if cur.granted < cur.size && cur.granted.saturating_sub(cur.acked) <= WINDOW / 2 {
            let more = (cur.size - cur.granted).min(WINDOW);
            cur.granted += more;
            let handle = cur.call;
            self.box_call(
                key,
                &Call::FileMore {
                    handle,
                    bytes: more,
                },
            );
        }
    }

    /// Writer `wgen` stored its file `fid` (or failed to).
    fn job_file_stored(
        &mut self,
        jk: usize,
        js: u64,
        wgen: u64,
        fid: u64,
        stored: Result<(u64, String), String>,
    ) {
        let Some(j) = self.job(jk, js).filter(|j| j.writer_gen == wgen) else {
            return;
        };
        let key = j.sbx.map(|s| s.0);
        let Some(save) = j.save.as_mut() else {
            return;
        };
        if save.cur.as_ref().is_none_or(|c| c.fid != fid) {
            return;
        }
        let Some(cur) = save.cur.take() else {
            return;
        };
        match stored {
            Ok((size, sha256)) => {
                save.bytes += size;
                save.saved.push(Artifact {
                    name: cur.name,
                    size,
                    sha256,
                    file: cur.file,
                });
            }
            Err(e) => save.skip(Skipped {
                name: cur.name,
                reason: format!("could not be stored: {e}"),
            }),
        }
        match key {
            Some(key) => self.save_next(jk, js, key),
            None => self.job_saved(jk, js),
        }
    }

    /// The saving is over (or cut short): decide the outcome and end the job.
    fn job_saved(&mut self, jk: usize, js: u64) {
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if j.phase == Phase::Ending {
            return;
        }
        if let Some(mut save) = j.save.take() {
            if let Some(cur) = save.cur.take() {
                save.skip(Skipped {
                    name: cur.name,
                    reason: "not saved: the sandbox ended while it was being saved".into(),
                });
                if let Some(w) = &j.writer {
                    let _ = w.tx.send(Msg::Discard);
                }
            }
            let rest: Vec<(String, u64)> = save
                .todo
                .drain(..)
                .chain(std::mem::take(&mut save.found))
                .collect();
            for (name, _) in rest {
                save.skip(Skipped {
                    name,
                    reason:
                        "not saved: saving the result files took too long, or the sandbox ended"
                            .into(),
                });
            }
            if save.more_skipped > 0 {
                save.skipped.push(Skipped {
                    name: String::new(),
                    reason: format!(
                        "{} more files matched and were not saved (over the limits)",
                        save.more_skipped
                    ),
                });
            }
            j.rec.artifacts = save.saved;
            j.rec.skipped = save.skipped;
        }
        let code = j.exit.unwrap_or(-1);
        if j.rec.error.is_none() {
            // Within a budget of its own (the loop's time is everyone's): a required
            // pattern not confirmed within it counts as missing, saying why.
            let mut budget = crate::jobs::MATCH_BUDGET;
            let mut missing: Vec<String> = Vec::new();
            for r in &j.rec.spec.required_artifacts {
                let Ok(p) = Pattern::parse(r) else {
                    missing.push(r.clone());
                    continue;
                };
                let mut found = false;
                for a in &j.rec.artifacts {
                    match p.matches_within(&a.name, &mut budget) {
                        Some(true) => {
                            found = true;
                            break;
                        }
                        Some(false) => {}
                        None => break,
                    }
                }
                if !found {
                    missing.push(if budget == 0 {
                        format!(
                            "{r} (not checked: matching took more than {} steps)",
                            crate::jobs::MATCH_BUDGET
                        )
                    } else {
                        r.clone()
                    });
                }
            }
            if j.cancelled {
                j.rec.status = "cancelled".into();
                j.rec.error = Some(j.cancel_error.take().unwrap_or_else(cancelled));
            } else if j.timed_out {
                j.rec.status = "expired".into();
                j.rec.error = Some(JobError {
                    code: "timeout".into(),
                    message: format!(
                        "the time limit of {} s was reached; files written so far were saved",
                        j.rec.spec.timeout_s
                    ),
                    kind: "job".into(),
                });
            } else if code != 0 {
                j.rec.status = "failed".into();
                j.rec.error = Some(JobError {
                    code: "nonzero_exit".into(),
                    message: format!("the command exited with code {code}"),
                    kind: "job".into(),
                });
            } else if !missing.is_empty() {
                j.rec.status = "failed".into();
                j.rec.error = Some(JobError {
                    code: "missing_artifacts".into(),
                    message: format!(
                        "required result files were not saved: {}",
                        missing.join(", ")
                    ),
                    kind: "job".into(),
                });
            } else {
                j.rec.status = "completed".into();
            }
        } else {
            j.rec.status = "failed".into();
        }
        j.rec.billed_ms += j.run_ms;
        self.job_end(jk, js);
    }

    /// Ends the job: its sandbox goes, its log is synced, then its end is written with
    /// its key deleted; only then do cancellers hear, and it leaves the table.
    fn job_end(&mut self, jk: usize, js: u64) {
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if j.phase == Phase::Ending {
            return;
        }
        if j.exit.is_none() && j.run_ms == 0 {
            j.run_ms = j.ran.map_or(0, |t| {
                u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
            });
        }
        if j.cancelled && !j.rec.finished() {
            j.rec.status = "cancelled".into();
            // Its cancel's error says who cancelled it.
            j.rec.error = Some(j.cancel_error.take().unwrap_or_else(cancelled));
            j.rec.billed_ms += j.run_ms;
        }
        j.phase = Phase::Ending;
        j.ending_since = Some(Instant::now());
        j.rec.ended_ms = Some(now_ms());
        j.rec.sealed_env = None;
        let sbx = j.sbx;
        let writer = j.writer.take();
        // Its one timer from now on: the bound on its readers' wait (an earlier one, a
        // time limit or a call's, is stale; it must not write the end before its log).
        let gen = self.reactor.arm_new(
            Instant::now() + END_READ_WAIT,
            Addr::new(JOBS, jk, DEADLINE),
        );
        if let Some(j) = self.job(jk, js) {
            j.gen = gen;
        }
        if let Some((key, _)) = sbx {
            self.box_end(key, "its job ended");
        }
        match writer {
            Some(w) => {
                let _ = w.tx.send(Msg::Finish);
            }
            None => self.job_finish(jk, js, None),
        }
    }

    /// The log is synced (its size and SHA-256): write the end.
    fn job_finish(&mut self, jk: usize, js: u64, log: Option<(u64, String, Vec<TestResults>)>) {
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if let Some((bytes, sha, results)) = log {
            j.rec.log_bytes = bytes;
            j.rec.log_sha256 = Some(sha);
            j.rec.test_results = results;
        }
        let (id, rec) = (j.id.clone(), j.rec.clone());
        let prices = self.prices();
        // Its `job.finished` goes into the outbox in the transaction of its end (when
        // webhooks are on and their thread runs).
        let event = finished_event(&id, &rec, &prices, self.webhooks.is_some());
        let has_event = event.is_some();
        let cost = prices.cost(&rec.spec, rec.billed_ms).0;
        let mailbox = self.reactor.mailbox();
        self.app
            .sessions
            .store()
            .end_job_then(&id.clone(), &rec, event, cost, move |r| {
                mailbox.send(Box::new(move |d: &mut Daemon| {
                    if let Err(e) = &r {
                        log::error!("jobs: {id}: writing its end: {e}");
                    }
                    if has_event && r.is_ok() {
                        if let Some(w) = &d.webhooks {
                            w.nudge();
                        }
                    }
                    d.job_done(jk, js, r.is_ok());
                }));
            });
    }

    /// Its end is durable: answer its cancellers, forget it, start the next.
    fn job_done(&mut self, jk: usize, js: u64, stored: bool) {
        let prices = self.prices();
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if !stored {
            // Written again, and again, until it is: until then the store says it
            // runs, and its key still opens its env values. Its readers hear the
            // store's trouble now rather than wait for that.
            let readers = std::mem::take(&mut j.end_readers);
            j.end_retries += 1;
            let wait = Duration::from_secs(1u64 << j.end_retries.min(5));
            let gen = self
                .reactor
                .arm_new(Instant::now() + wait, Addr::new(JOBS, jk, DEADLINE));
            if let Some(j) = self.job(jk, js) {
                j.gen = gen;
            }
            for r in readers {
                self.on_outcome(r.ck, r.serial, Outcome::Respond(store_refusal()));
            }
            return;
        }
        j.written = true;
        let waiters = std::mem::take(&mut j.cancel_waiters);
        let readers = std::mem::take(&mut j.end_readers);
        let body = wj::job_json(&j.id, &j.rec, &prices, now_ms());
        log::info!(
            "job {} {} (exit {:?}, {} result files)",
            j.id,
            j.rec.status,
            j.rec.exit_code,
            j.rec.artifacts.len()
        );
        let bytes = stored_bytes(&j.rec);
        let records = record_bytes(&j.rec);
        let tenant = j.rec.tenant.clone();
        let gone = j.sbx.is_none();
        for (ck, serial) in waiters {
            self.on_outcome(ck, serial, Outcome::Respond(Response::json(200, &body)));
        }
        self.job_reads_again(readers);
        *self.jobs.tenant_bytes.entry(tenant.clone()).or_default() += bytes;
        *self.jobs.tenant_records.entry(tenant.clone()).or_default() += records;
        if let Some(j) = self.job(jk, js) {
            // Its actual cost replaces its reservation (it leaves the live jobs).
            let cost = prices.cost(&j.rec.spec, j.rec.billed_ms).0;
            let (m, d) = crate::store::budget::periods(&tenant, j.rec.ended_ms.unwrap_or(0));
            *self.jobs.spent.entry(m).or_default() += cost;
            *self.jobs.spent.entry(d).or_default() += cost;
        }
        if let Some(j) = self.job(jk, js) {
            let (id, status, batch) = (j.id.clone(), j.rec.status.clone(), j.rec.batch.clone());
            self.job_waiters_see(&id, &status);
            if let Some(bid) = batch {
                self.job_batch_job_ended(&bid, &id, &status);
            }
        }
        if gone {
            self.job_forget(jk);
        }
        self.job_pump();
    }

    fn job_forget(&mut self, jk: usize) {
        if let Some(j) = self.jobs.live.try_remove(jk) {
            if !j.rec.spec.inputs.is_empty() {
                let staged = self.jobs.dir.join(&j.id).join(INPUT_DIR);
                self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
                    let _ = std::fs::remove_dir_all(staged);
                    Box::new(|_: &mut Daemon| {})
                }));
            }
            if self.jobs.by_id.get(&j.id) == Some(&jk) {
                self.jobs.by_id.remove(&j.id);
            }
            // Nobody is left waiting: a cancel that came after the end was written
            // heard 409 at once; this is for any other way in.
            for (ck, serial) in j.cancel_waiters {
                let resp = crate::wbx::error(
                    409,
                    &format!("the job has already finished ({})", j.rec.status),
                );
                self.on_outcome(ck, serial, Outcome::Respond(resp));
            }
            // Reads wait only until its end is written, so none should be left; any
            // that are read the store now.
            self.job_reads_again(j.end_readers);
        }
        self.jobs.queue.retain(|&k| k != jk);
    }

    /// Reads that waited for a job's end to be written, made now (on a connection
    /// that still waits for them).
    fn job_reads_again(&mut self, readers: Vec<EndReader>) {
        for r in readers {
            if self.conns.get(r.ck).is_some_and(|c| c.serial == r.serial) {
                self.job_read(r.ck, r.tenant, r.op);
            }
        }
    }

    /// Its sandbox is gone (removed: its processes and memory are).
    pub(super) fn job_box_gone(
        &mut self,
        jk: usize,
        js: u64,
        sbx: (usize, u64),
        oom_killed: bool,
        why: &str,
    ) {
        if self.app.shutting_down {
            // The next start recovers it (its record says where it was).
            return;
        }
        let Some(j) = self.job(jk, js) else {
            return;
        };
        if j.sbx != Some(sbx) {
            return;
        }
        j.sbx = None;
        match j.phase {
            Phase::Ending => {
                // It leaves once its end is written too (then, or in `job_done`).
                if j.written {
                    self.job_forget(jk);
                    self.job_pump();
                }
            }
            Phase::Saving => {
                // Cut short: what was saved is kept.
                self.job_saved(jk, js);
            }
            Phase::Queued => {}
            Phase::Starting | Phase::Running => {
                if j.cancelled {
                    self.job_end(jk, js);
                } else if j.timed_out {
                    // Killed at its limit and gone before its exit was heard: it ran
                    // until now, and is billed so (its files went with its sandbox).
                    if j.run_ms == 0 {
                        j.run_ms = j.ran.map_or(0, |t| {
                            u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
                        });
                    }
                    // Its limit, not the kill's grace or the teardown.
                    j.run_ms = j.run_ms.min(j.rec.spec.timeout_s.saturating_mul(1000));
                    j.save = Some(Save::default());
                    self.job_saved(jk, js);
                } else if oom_killed {
                    let class = crate::wbx::compute::of_job(&j.rec.spec);
                    j.run_ms = j
                        .ran
                        .map_or(0, |t| u64::try_from(t.elapsed().as_millis()).unwrap_or(0));
                    j.rec.billed_ms += j.run_ms;
                    j.run_ms = 0;
                    fail(
                        &mut j.rec,
                        "out_of_memory",
                        &format!(
                            "the sandbox ran out of memory ({} MiB, the {} class) and was stopped",
                            class.mem_mb, class.name
                        ),
                        "job",
                    );
                    self.job_note(
                        jk,
                        js,
                        "\n[wbx] the sandbox ran out of memory and was stopped\n",
                    );
                    self.job_end(jk, js);
                } else if j.rec.error.is_some() {
                    // Failed on its own (too large, could not start): it ends so.
                    self.job_end(jk, js);
                } else {
                    let why = format!("its sandbox was lost: {why}");
                    self.job_lost(jk, js, &why);
                }
            }
        }
    }

    /// A failure on our side: retried in a fresh sandbox if its `retry` allows another
    /// attempt, else failed.
    fn job_lost(&mut self, jk: usize, js: u64, why: &str) {
        let Some(j) = self.job(jk, js) else {
            return;
        };
        log::warn!("job {}: {why}", j.id);
        // What this attempt ran is not charged: it is credited as the job's refund.
        let ran_ms = if j.run_ms > 0 {
            j.run_ms
        } else {
            j.ran.map_or(0, |t| {
                u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
            })
        };
        j.rec.refunded_ms = j.rec.refunded_ms.saturating_add(ran_ms);
        // Credited, so never billed: not if the job is cancelled before its next
        // attempt runs either.
        j.ran = None;
        j.run_ms = 0;
        let err = JobError {
            code: "sandbox_lost".into(),
            message: why.to_string(),
            kind: "system".into(),
        };
        if j.rec.attempt < j.rec.spec.retry.max_attempts && j.sbx.is_none() {
            let now = now_ms();
            j.rec.attempts.push(Attempt {
                started_ms: j.rec.started_ms.unwrap_or(now),
                ended_ms: now,
                error: Some(err),
            });
            j.rec.status = "queued".into();
            j.rec.exit_code = None;
            j.phase = Phase::Queued;
            j.run_ms = 0;
            // The writer stays: one per job, so attempts append to one log in order.
            self.job_note(jk, js, &format!("\n[wbx] {why}\n"));
            self.job_store(jk, js, false);
            self.jobs.queue.push_front(jk);
            self.job_pump();
        } else {
            j.rec.error = Some(err);
            j.rec.status = "failed".into();
            self.job_note(jk, js, &format!("\n[wbx] {why}\n"));
            self.job_end(jk, js);
        }
    }

    /// The job's timer: the spawn was not answered, the time limit, the kill's grace,
    /// or the saving's deadline; once it ends, the bound on its readers' wait, then on
    /// its log's sync, or the retry of its end's write.
    fn job_timer(&mut self, jk: usize, gen: u64) {
        let Some(j) = self.jobs.live.get_mut(jk).filter(|j| j.gen == gen) else {
            return;
        };
        let js = j.serial;
        if j.phase == Phase::Ending && !j.written {
            if j.end_retries == 0 {
                let since = j.ending_since.unwrap_or_else(Instant::now);
                if since.elapsed() >= END_LOG_WAIT {
                    // Its writer never said its log is synced: the end is written
                    // without it (a late word from that writer is ignored).
                    crate::error_limited!(
                        "jobs: {}: its log was not synced within {} s; ending it without",
                        j.id,
                        END_LOG_WAIT.as_secs()
                    );
                    j.writer_gen += 1;
                    self.job_finish(jk, js, None);
                    return;
                }
                // Its end is still being written (a slow disk): its readers stop
                // waiting, and the log gets until its bound.
                let readers = std::mem::take(&mut j.end_readers);
                let gen = self
                    .reactor
                    .arm_new(since + END_LOG_WAIT, Addr::new(JOBS, jk, DEADLINE));
                if let Some(j) = self.job(jk, js) {
                    j.gen = gen;
                }
                for r in readers {
                    self.on_outcome(r.ck, r.serial, Outcome::Respond(end_pending()));
                }
                return;
            }
            // Its end's write failed: again.
            self.job_finish(jk, js, None);
            return;
        }
        let Some((key, _)) = j.sbx else {
            return;
        };
        match j.phase {
            Phase::Starting => {
                self.box_end(key, "its init did not start the job's command in time")
            }
            // It exited in time; its usage is being read.
            Phase::Running if j.exit.is_some() => {}
            Phase::Running if !j.timed_out => {
                j.timed_out = true;
                if let Some(pid) = j.pid {
                    let held = std::mem::replace(&mut j.held, false);
                    let limit = j.rec.spec.timeout_s;
                    self.job_note(jk, js, &format!("\n[wbx] the time limit of {limit} s was reached: the command was killed\n"));
                    self.box_kill(key, pid, held);
                }
                let gen = self
                    .reactor
                    .arm_new(Instant::now() + KILL_GRACE, Addr::new(JOBS, jk, DEADLINE));
                if let Some(j) = self.job(jk, js) {
                    j.gen = gen;
                }
            }
            Phase::Running => self.box_end(key, "its job's command did not exit after its kill"),
            Phase::Saving => {
                // Whatever is not saved by now is skipped.
                self.box_end(key, "saving its job's result files took too long");
            }
            Phase::Queued | Phase::Ending => {}
        }
    }

    /// What `tenant` spent this month and today, what its unfinished jobs hold, and
    /// its limits.
    fn budget_state(&self, tenant: &str) -> (i128, i128, i128, crate::store::budget::Budget) {
        let prices = self.prices();
        let (m, d) = crate::store::budget::periods(tenant, now_ms());
        let reserved: i128 = self
            .jobs
            .live
            .iter()
            .filter(|(_, j)| j.rec.tenant == tenant && !j.written)
            .map(|(_, j)| worst_case(&j.rec.spec, &prices))
            .sum::<i128>()
            + self.jobs.pending_reserved.get(tenant).copied().unwrap_or(0);
        (
            self.jobs.spent.get(&m).copied().unwrap_or(0),
            self.jobs.spent.get(&d).copied().unwrap_or(0),
            reserved,
            self.jobs.budgets.get(tenant).copied().unwrap_or_default(),
        )
    }

    /// Why a job whose worst case is `worst` does not fit `tenant`'s budget.
    fn budget_refusal(&self, tenant: &str, worst: i128) -> Option<String> {
        let (month, day, reserved, b) = self.budget_state(tenant);
        let prices = self.prices();
        let show = |v: i128| prices.show(crate::jobs::Money(v));
        for (limit, spent, what) in [
            (b.monthly_limit, month, "monthly"),
            (b.daily_limit, day, "daily"),
        ] {
            if let Some(limit) = limit {
                if spent + reserved + worst > limit {
                    return Some(format!(
                        "budget_exceeded: this job could cost up to {}; the {what} limit is {}, {} spent and {} held by unfinished jobs (PUT /v1/budget raises it)",
                        show(worst),
                        show(limit),
                        show(spent),
                        show(reserved)
                    ));
                }
            }
        }
        None
    }

    /// `GET /v1/budget`'s answer.
    fn budget_json(&self, tenant: &str) -> serde_json::Value {
        let (month, day, reserved, b) = self.budget_state(tenant);
        let prices = self.prices();
        let show = |v: i128| prices.show(crate::jobs::Money(v));
        let amount = |v: Option<i128>| v.map(|v| crate::jobs::Money(v).display());
        let left = |limit: Option<i128>, spent: i128| {
            limit.map(|l| crate::jobs::Money((l - spent - reserved).max(0)).display())
        };
        let alert = b.alert_pct.is_some_and(|p| {
            [(b.monthly_limit, month), (b.daily_limit, day)]
                .iter()
                .any(|(l, s)| l.is_some_and(|l| l > 0 && (s + reserved) * 100 >= l * i128::from(p)))
        });
        serde_json::json!({
            "currency": self.cfg.wbx.jobs.currency,
            "monthly_limit": amount(b.monthly_limit),
            "daily_limit": amount(b.daily_limit),
            "alert_pct": b.alert_pct,
            "spent_this_month": show(month),
            "spent_today": show(day),
            "reserved": show(reserved),
            "left_this_month": left(b.monthly_limit, month),
            "left_today": left(b.daily_limit, day),
            "alert": alert,
        })
    }

    /// `GET /v1/compute/preferences`'s body for `tenant`.
    fn compute_prefs_json(&self, tenant: &str) -> serde_json::Value {
        let prices = self.prices();
        crate::wbx::compute::preferences_json(
            self.tenant_class(tenant),
            |c| self.class_not_offered(c),
            |c| prices.rate(c),
            &prices.currency,
        )
    }

    /// `GET`/`PUT /v1/compute/preferences`: a default that is not offered is 403; the
    /// change is durable before it is answered.
    fn compute_prefs(
        &mut self,
        ck: usize,
        tenant: String,
        change: Option<Option<&'static crate::wbx::compute::Class>>,
    ) {
        let Some(class) = change else {
            let v = self.compute_prefs_json(&tenant);
            self.respond(ck, Response::json(200, &v));
            return;
        };
        if let Some((c, why)) = class.and_then(|c| self.class_not_offered(c).map(|w| (c, w))) {
            let refused = crate::wbx::compute::Refused {
                class: c,
                by_default: false,
                why,
            };
            let resp = crate::wbx::compute::not_offered("default_compute_class", &refused);
            self.respond(ck, resp);
            return;
        }
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        self.conn_own(ck, Owner::Job);
        let sessions = Arc::clone(&self.app.sessions);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let r = sessions
                .store()
                .put_compute_pref(&tenant, class.map(|c| c.name));
            Box::new(move |d: &mut Daemon| {
                let resp = match r {
                    Ok(()) => {
                        match class {
                            Some(c) => d.jobs.compute_prefs.insert(tenant.clone(), c),
                            None => d.jobs.compute_prefs.remove(&tenant),
                        };
                        Response::json(200, &d.compute_prefs_json(&tenant))
                    }
                    Err(e) => {
                        log::error!("jobs: storing {tenant}'s compute preferences: {e}");
                        store_refusal()
                    }
                };
                d.on_outcome(ck, serial, Outcome::Respond(resp));
            })
        }));
    }

    /// `GET`/`PUT /v1/budget`.
    fn job_budget(&mut self, ck: usize, tenant: String, change: Option<wj::BudgetChange>) {
        let Some(change) = change else {
            let v = self.budget_json(&tenant);
            self.respond(ck, Response::json(200, &v));
            return;
        };
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        self.conn_own(ck, Owner::Job);
        let queue = self.jobs.budget_puts.entry(tenant.clone()).or_default();
        queue.push_back((ck, serial, change));
        if queue.len() == 1 {
            self.budget_put_next(tenant);
        }
    }

    /// Writes the first waiting `PUT /v1/budget` of `tenant`, merged into the budget as
    /// stored now; when it is written, the next. (Merged at arrival, two at once both
    /// started from the old budget and the second to be written lost the first's
    /// change, though both were answered 200.)
    fn budget_put_next(&mut self, tenant: String) {
        let Some(&(ck, serial, change)) =
            self.jobs.budget_puts.get(&tenant).and_then(|q| q.front())
        else {
            self.jobs.budget_puts.remove(&tenant);
            return;
        };
        let mut b = self.jobs.budgets.get(&tenant).copied().unwrap_or_default();
        if let Some(m) = change.monthly {
            b.monthly_limit = m;
        }
        if let Some(d) = change.daily {
            b.daily_limit = d;
        }
        if let Some(a) = change.alert_pct {
            b.alert_pct = a;
        }
        let sessions = Arc::clone(&self.app.sessions);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let r = sessions.store().put_budget(&tenant, &b);
            Box::new(move |d: &mut Daemon| {
                let resp = match r {
                    Ok(()) => {
                        d.jobs.budgets.insert(tenant.clone(), b);
                        Response::json(200, &d.budget_json(&tenant))
                    }
                    Err(e) => {
                        log::error!("jobs: storing {tenant}'s budget: {e}");
                        store_refusal()
                    }
                };
                d.on_outcome(ck, serial, Outcome::Respond(resp));
                let more = d.jobs.budget_puts.get_mut(&tenant).is_some_and(|q| {
                    q.pop_front();
                    !q.is_empty()
                });
                if more {
                    d.budget_put_next(tenant);
                } else {
                    d.jobs.budget_puts.remove(&tenant);
                }
            })
        }));
    }

    /// `POST /v1/jobs/wait`: the jobs that are not live are read on the pool (they have
    /// finished, or are not there); then the wait is answered, or held.
    fn job_wait(&mut self, ck: usize, tenant: String, ids: Vec<String>, all: bool, timeout_s: u64) {
        let held = self
            .jobs
            .waiters
            .iter()
            .filter(|(_, w)| w.tenant == tenant)
            .count();
        if self.jobs.waiters.len() >= MAX_WAITERS || held >= MAX_WAITERS_PER_TENANT {
            self.respond(
                ck,
                crate::wbx::error(
                    429,
                    &format!("too many waits at once (at most {MAX_WAITERS_PER_TENANT} per tenant); retry in a second"),
                )
                .with_header("Retry-After", "1"),
            );
            return;
        }
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        self.conn_own(ck, Owner::Job);
        let ask = WaitAsk {
            client: (ck, serial),
            tenant,
            ids,
            all,
            timeout_s,
        };
        self.job_wait_read(ask, false);
    }

    /// Reads every id of a wait on the pool (a live job may end and leave before the
    /// answer comes back; the live record is preferred where there is one), then
    /// [`Daemon::job_wait_start`]. `again`: the second read.
    fn job_wait_read(&mut self, ask: WaitAsk, again: bool) {
        let absent: Vec<String> = ask.ids.clone();
        let sessions = Arc::clone(&self.app.sessions);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let store = sessions.store();
            // Each id as stored: its tenant, its state, and whether it has finished.
            let read: Result<HashMap<String, (String, String, bool)>, String> = absent
                .iter()
                .filter_map(|id| {
                    let r = if id.starts_with("bat_") {
                        store.batch(id).map(|b| {
                            b.map(|b| {
                                let done = b.status != "running";
                                (b.tenant, b.status, done)
                            })
                        })
                    } else {
                        store.job(id).map(|r| {
                            r.map(|r| {
                                let done = r.finished();
                                (r.tenant, r.status, done)
                            })
                        })
                    };
                    match r {
                        Ok(Some(v)) => Some(Ok((id.clone(), v))),
                        Ok(None) => None,
                        Err(e) => Some(Err(e.to_string())),
                    }
                })
                .collect();
            Box::new(move |d: &mut Daemon| d.job_wait_start(ask, read, again))
        }));
    }

    fn job_wait_start(
        &mut self,
        ask: WaitAsk,
        read: Result<HashMap<String, (String, String, bool)>, String>,
        again: bool,
    ) {
        let (ck, serial) = ask.client;
        if self.app.shutting_down {
            self.on_outcome(ck, serial, Outcome::Respond(super::boxes::shutting_down()));
            return;
        }
        let read = match read {
            Ok(r) => r,
            Err(e) => {
                log::error!("jobs: reading for a wait: {e}");
                self.on_outcome(ck, serial, Outcome::Respond(store_refusal()));
                return;
            }
        };
        let mut items = Vec::new();
        // Read unfinished but no longer live: it ended between the read and now (every
        // unfinished job and batch is live), after the waits on it were told.
        let mut stale = false;
        for id in &ask.ids {
            let live = self
                .jobs
                .by_id
                .get(id)
                .and_then(|&k| self.jobs.live.get(k))
                .filter(|j| j.rec.tenant == ask.tenant)
                .map(|j| (j.rec.status.clone(), j.written));
            // A live batch is running (its end, once written, is the store's).
            let live = live.or_else(|| {
                self.jobs
                    .batches
                    .get(id)
                    .filter(|b| b.rec.tenant == ask.tenant)
                    .map(|b| (b.rec.status.clone(), false))
            });
            let is_live = live.is_some();
            let item = live.or_else(|| {
                read.get(id)
                    .filter(|(t, _, _)| *t == ask.tenant)
                    .map(|(_, status, done)| (status.clone(), *done))
            });
            stale |= !is_live && item.as_ref().is_some_and(|(_, done)| !done);
            match item {
                Some((status, done)) => items.push((id.clone(), status, done)),
                None => {
                    let what = if id.starts_with("bat_") {
                        "batch"
                    } else {
                        "job"
                    };
                    let resp = crate::wbx::error(404, &format!("{what} not found: {id}"));
                    self.on_outcome(ck, serial, Outcome::Respond(resp));
                    return;
                }
            }
        }
        if stale && !again {
            self.job_wait_read(ask, true);
            return;
        }
        let WaitAsk {
            client,
            tenant,
            ids,
            all,
            timeout_s,
        } = ask;
        let body = wj::wait_json(&items, all);
        if body["done"] == true || timeout_s == 0 {
            self.on_outcome(ck, serial, Outcome::Respond(Response::json(200, &body)));
            return;
        }
        let key = self.jobs.waiters.insert(Waiter {
            client,
            tenant,
            all,
            items,
            gen: 0,
        });
        let gen = self.reactor.arm_new(
            Instant::now() + Duration::from_secs(timeout_s),
            Addr::new(JOBS, key, WAIT),
        );
        self.jobs.waiters[key].gen = gen;
        for id in ids {
            self.jobs.waiting_on.entry(id).or_default().push(key);
        }
    }

    /// Job `id`'s end is written: the waits on it look again.
    fn job_waiters_see(&mut self, id: &str, status: &str) {
        let Some(keys) = self.jobs.waiting_on.get(id).cloned() else {
            return;
        };
        for key in keys {
            let Some(w) = self.jobs.waiters.get_mut(key) else {
                continue;
            };
            for item in w.items.iter_mut().filter(|i| i.0 == id) {
                item.1 = status.to_string();
                item.2 = true;
            }
            let body = wj::wait_json(&w.items, w.all);
            if body["done"] == true {
                self.job_wait_answer(key, &body);
            }
        }
    }

    /// The daemon stops: every wait is answered now (503, as for a restart).
    pub(crate) fn job_waits_end(&mut self) {
        let readers: Vec<EndReader> = self
            .jobs
            .live
            .iter_mut()
            .flat_map(|(_, j)| std::mem::take(&mut j.end_readers))
            .collect();
        for r in readers {
            self.on_outcome(
                r.ck,
                r.serial,
                Outcome::Respond(super::boxes::shutting_down()),
            );
        }
        let keys: Vec<usize> = self.jobs.waiters.iter().map(|(k, _)| k).collect();
        for key in keys {
            if let Some(w) = self.jobs.waiters.try_remove(key) {
                let (ck, serial) = w.client;
                self.on_outcome(ck, serial, Outcome::Respond(super::boxes::shutting_down()));
            }
        }
        self.jobs.waiting_on.clear();
    }

    /// A wait's time is up: it answers with `done: false`.
    fn job_wait_timeout(&mut self, key: usize, gen: u64) {
        let Some(w) = self.jobs.waiters.get(key).filter(|w| w.gen == gen) else {
            return;
        };
        // Each job's state as it is now (a queued one may run by now).
        let items: Vec<(String, String, bool)> = w
            .items
            .iter()
            .map(|(id, status, done)| {
                let now = self
                    .jobs
                    .by_id
                    .get(id)
                    .and_then(|&k| self.jobs.live.get(k))
                    .map_or_else(|| status.clone(), |j| j.rec.status.clone());
                (id.clone(), now, *done)
            })
            .collect();
        let body = wj::wait_json(&items, w.all);
        self.job_wait_answer(key, &body);
    }

    fn job_wait_answer(&mut self, key: usize, body: &serde_json::Value) {
        let Some(w) = self.jobs.waiters.try_remove(key) else {
            return;
        };
        for (id, _, _) in &w.items {
            if let Some(keys) = self.jobs.waiting_on.get_mut(id) {
                keys.retain(|&k| k != key);
                if keys.is_empty() {
                    self.jobs.waiting_on.remove(id);
                }
            }
        }
        let (ck, serial) = w.client;
        self.on_outcome(ck, serial, Outcome::Respond(Response::json(200, body)));
    }

    /// Housekeeping: finished jobs past their retention go, with their files.
    pub(crate) fn jobs_sweep(&mut self) {
        let now = Instant::now();
        if self.jobs.sweeping || now < self.jobs.next_sweep {
            return;
        }
        // A batch end whose write failed is tried again.
        self.job_batches_resume();
        self.jobs.next_sweep = now + SWEEP_EVERY;
        let sessions = Arc::clone(&self.app.sessions);
        let dir = self.jobs.dir.clone();
        let keep_ms = self.cfg.wbx.jobs.retention_s.saturating_mul(1000);
        // A job of a batch that still runs is kept with it: its state (and files) are
        // what its dependants wait on, however long the batch takes.
        let running: HashSet<String> = self.jobs.batches.keys().cloned().collect();
        let job = Box::new(move || -> Done<Daemon> {
            let store = sessions.store();
            let cutoff = now_ms().saturating_sub(keep_ms);
            let mut freed: Vec<(String, u64, u64)> = Vec::new();
            match store.all_jobs() {
                Ok(all) => {
                    for (id, rec) in all {
                        if !rec.finished()
                            || rec.ended_ms.is_none_or(|e| e > cutoff)
                            || rec.batch.as_ref().is_some_and(|b| running.contains(b))
                        {
                            continue;
                        }
                        let r: Result<bool, crate::store::StoreError> = {
                            let (tx, rx) = crossbeam_channel::bounded(1);
                            store.delete_job_then(&id, &rec, move |r| {
                                let _ = tx.send(r);
                            });
                            rx.recv().unwrap_or(Ok(false))
                        };
                        match r {
                            Ok(_) => {
                                let _ = std::fs::remove_dir_all(dir.join(&id));
                                let (bytes, records) = (stored_bytes(&rec), record_bytes(&rec));
                                freed.push((rec.tenant, bytes, records));
                                log::info!("job {id} removed: past its retention");
                            }
                            Err(e) => log::error!("jobs: removing {id}: {e}"),
                        }
                    }
                }
                Err(e) => log::error!("jobs: reading the store: {e}"),
            }
            // A batch goes with its jobs' retention, counted from its end.
            match store.all_batches() {
                Ok(all) => {
                    for (id, rec) in all {
                        if rec.ended_ms.is_none_or(|e| e > cutoff) {
                            continue;
                        }
                        let (tx, rx) = crossbeam_channel::bounded(1);
                        store.delete_batch_then(&id, &rec, move |r| {
                            let _ = tx.send(r);
                        });
                        match rx.recv().unwrap_or(Ok(false)) {
                            Ok(_) => log::info!("batch {id} removed: past its retention"),
                            Err(e) => log::error!("jobs: removing batch {id}: {e}"),
                        }
                    }
                }
                Err(e) => log::error!("jobs: reading batches: {e}"),
            }
            // What the store holds now, its free pages not counted.
            let used = store.used_bytes();
            Box::new(move |d: &mut Daemon| {
                d.jobs.sweeping = false;
                match used {
                    Ok(u) => d.jobs.store_used = u,
                    Err(e) => log::error!("jobs: measuring the store: {e}"),
                }
                for (t, b, r) in freed {
                    if let Some(n) = d.jobs.tenant_bytes.get_mut(&t) {
                        *n = n.saturating_sub(b);
                    }
                    if let Some(n) = d.jobs.tenant_records.get_mut(&t) {
                        *n = n.saturating_sub(r);
                    }
                }
            })
        });
        if self.reactor.submit(job).is_ok() {
            self.jobs.sweeping = true;
        }
    }
}

impl Live {
    /// Puts `out` into the log, up to the cap; the rest is counted as dropped.
    fn log(&mut self, out: Vec<u8>, cap: u64) {
        if out.is_empty() {
            return;
        }
        let room = cap.saturating_sub(self.logged);
        let keep = (out.len() as u64).min(room) as usize;
        self.rec.log_dropped += (out.len() - keep) as u64;
        if keep == 0 {
            return;
        }
        self.logged += keep as u64;
        let mut out = out;
        out.truncate(keep);
        if let Some(w) = &self.writer {
            // Counted only while a writer will acknowledge it.
            self.unacked += keep as u64;
            let _ = w.tx.send(Msg::Log(out));
        }
    }
}

/// A job's worst-case cost: every attempt for its whole time limit, with a start and
/// upload reserve each, at the prices now.
/// Writes a WebAssembly job's module and stdin into its new directory `dir/id` (from
/// `bytes`, or copied from job `from`'s directory), each synced, then the directory.
fn write_wasm_files(
    dir: &Path,
    id: &str,
    bytes: Option<&wj::WasmBytes>,
    from: Option<&str>,
) -> std::io::Result<()> {
    use crate::store::jobs::{WASM_MODULE_FILE, WASM_STDIN_FILE};
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let jd = dir.join(id);
    std::fs::DirBuilder::new().mode(0o700).create(&jd)?;
    for name in [WASM_MODULE_FILE, WASM_STDIN_FILE] {
        let content = match (bytes, from) {
            (Some(b), _) if name == WASM_MODULE_FILE => b.module.clone(),
            (Some(b), _) => b.stdin.clone(),
            (None, Some(f)) => match std::fs::read(dir.join(f).join(name)) {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            },
            (None, None) => continue,
        };
        if content.is_empty() {
            continue;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .custom_flags(libc::O_NOFOLLOW)
            .open(jd.join(name))?;
        f.write_all(&content)?;
        f.sync_all()?;
    }
    std::fs::File::open(&jd)?.sync_all()?;
    std::fs::File::open(dir)?.sync_all()
}

fn worst_case(spec: &crate::store::jobs::JobSpec, prices: &Prices) -> i128 {
    let attempts = u64::from(spec.retry.max_attempts.max(1));
    prices
        .cost(
            spec,
            attempts
                .saturating_mul(spec.timeout_s + RESERVE_S)
                .saturating_mul(1000),
        )
        .0
}

/// A job's path as its own name: relative to the home.
fn rel(path: &str) -> String {
    path.strip_prefix(HOME)
        .map(|r| r.trim_start_matches('/'))
        .unwrap_or(path)
        .to_string()
}

/// Whether directory `dir` (relative) may hold a match of `p`.
fn could_hold(p: &Pattern, dir: &str) -> bool {
    let (base, depth) = p.base();
    let under = if base.is_empty() {
        Some(dir)
    } else if dir == base {
        Some("")
    } else {
        dir.strip_prefix(&format!("{base}/"))
    };
    let Some(rest) = under else {
        // Above the base: on the way to it.
        return base.starts_with(&format!("{dir}/"));
    };
    let level = rest.split('/').filter(|s| !s.is_empty()).count();
    depth.is_none_or(|d| level < d)
}

/// Why a file of `size` bytes cannot be saved now (`None`: it can).
fn size_refusal(c: &WbxJobs, size: u64, job_bytes: u64, tenant_bytes: u64) -> Option<String> {
    if size > c.artifact_file_bytes {
        Some(format!(
            "{size} bytes: larger than the limit of {} bytes per result file",
            c.artifact_file_bytes
        ))
    } else if job_bytes + size > c.artifact_job_bytes {
        Some(format!(
            "{size} bytes: over the limit of {} bytes of result files per job",
            c.artifact_job_bytes
        ))
    } else if tenant_bytes + job_bytes + size > c.artifact_tenant_bytes {
        Some(format!(
            "{size} bytes: over the limit of {} bytes of stored result files per tenant (ISOBOX_WBX_ARTIFACT_TENANT_MB)",
            c.artifact_tenant_bytes
        ))
    } else {
        None
    }
}

/// Starts the thread that writes one attempt's log (appended to what earlier attempts
/// wrote) and its result files, acknowledging each write to the loop.
fn start_writer(
    dir: &Path,
    owner: (usize, u64, u64),
    rx: crossbeam_channel::Receiver<Msg>,
    mailbox: crate::reactor::Mailbox<Daemon>,
) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let log_path = dir.join("log");
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .mode(0o600)
        .open(&log_path)?;
    let (jk, js, wgen) = owner;
    std::thread::Builder::new()
        .name("isobox-joblog".into())
        .spawn(move || {
            // The log's digest covers earlier attempts' output too.
            let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
            let mut size = 0u64;
            if let Ok(mut f) = std::fs::File::open(&log_path) {
                let mut buf = vec![0u8; 64 << 10];
                while let Ok(n) = std::io::Read::read(&mut f, &mut buf) {
                    if n == 0 {
                        break;
                    }
                    digest.update(&buf[..n]);
                    size += n as u64;
                }
            }
            let mut art: Option<(PathBuf, std::fs::File, ring::digest::Context, u64)> = None;
            // Which file opened here this is (the loop counts the same).
            let mut fid = 0u64;
            let mut art_err: Option<String> = None;
            let send = |f: Box<dyn FnOnce(&mut Daemon) + Send>| {
                mailbox.send(f);
            };
            for msg in rx {
                match msg {
                    Msg::Log(b) => {
                        if log.write_all(&b).is_ok() {
                            digest.update(&b);
                            size += b.len() as u64;
                        }
                        let n = b.len() as u64;
                        send(Box::new(move |d: &mut Daemon| {
                            d.job_log_acked(jk, js, wgen, n)
                        }));
                    }
                    Msg::Open(path) => {
                        fid += 1;
                        art_err = None;
                        art = match std::fs::OpenOptions::new()
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .mode(0o600)
                            .open(&path)
                        {
                            Ok(f) => Some((
                                path,
                                f,
                                ring::digest::Context::new(&ring::digest::SHA256),
                                0,
                            )),
                            Err(e) => {
                                art_err = Some(e.to_string());
                                None
                            }
                        };
                    }
                    Msg::Data(b) => {
                        let n = b.len() as u64;
                        if let Some((_, f, d, s)) = art.as_mut() {
                            match f.write_all(&b) {
                                Ok(()) => {
                                    d.update(&b);
                                    *s += n;
                                }
                                Err(e) => art_err = Some(e.to_string()),
                            }
                        }
                        send(Box::new(move |d: &mut Daemon| {
                            d.job_data_acked(jk, js, wgen, fid, n)
                        }));
                    }
                    Msg::Close => {
                        let r = match (art.take(), art_err.take()) {
                            (Some((path, f, d, s)), None) => match f.sync_all() {
                                Ok(()) => Ok((s, hex(d.finish().as_ref()))),
                                Err(e) => {
                                    let _ = std::fs::remove_file(&path);
                                    Err(e.to_string())
                                }
                            },
                            (Some((path, _, _, _)), Some(e)) => {
                                let _ = std::fs::remove_file(&path);
                                Err(e)
                            }
                            (None, e) => Err(e.unwrap_or_else(|| "no file was open".into())),
                        };
                        send(Box::new(move |d: &mut Daemon| {
                            d.job_file_stored(jk, js, wgen, fid, r)
                        }));
                    }
                    Msg::Discard => {
                        if let Some((path, _, _, _)) = art.take() {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                    Msg::Finish => {
                        if let Some((path, _, _, _)) = art.take() {
                            let _ = std::fs::remove_file(&path);
                        }
                        let _ = log.sync_all();
                        let sha = hex(digest.finish().as_ref());
                        // The test results of its log's end (where frameworks sum up).
                        let results = crate::jobs::digest::test_results(&String::from_utf8_lossy(
                            &read_end(&log_path, size, DIGEST_BYTES),
                        ));
                        send(Box::new(move |d: &mut Daemon| {
                            if d.job(jk, js)
                                .is_some_and(|j| j.phase == Phase::Ending && j.writer_gen == wgen)
                            {
                                d.job_finish(jk, js, Some((size, sha, results)));
                            }
                        }));
                        return;
                    }
                }
            }
        })?;
    Ok(())
}

/// A read request, on the pool.
#[allow(clippy::too_many_arguments)]
fn read_op(
    store: &Store,
    op: &JobOp,
    tenant: &str,
    found: impl FnOnce(&str) -> Result<JobRecord, Response>,
    prices: &Prices,
    dir: &Path,
    signer: Option<&Signer>,
    isolation: &str,
    sessions: &Arc<crate::workspace::Sessions>,
) -> Result<Outcome, Response> {
    let now = now_ms();
    let ok = |v: serde_json::Value| Ok(Outcome::Respond(Response::json(200, &v)));
    match op {
        JobOp::List {
            status,
            limit,
            cursor,
        } => {
            let (page, more) = store
                .jobs_of(tenant, *cursor, *limit, |r| {
                    status.as_ref().is_none_or(|s| *s == r.status)
                })
                .map_err(|e| {
                    log::error!("jobs: listing: {e}");
                    store_refusal()
                })?;
            let next = more
                .then(|| page.last().map(|(_, r)| r.seq.to_string()))
                .flatten();
            let jobs: Vec<serde_json::Value> = page
                .iter()
                .map(|(id, r)| wj::job_json(id, r, prices, now))
                .collect();
            ok(serde_json::json!({"jobs": jobs, "next_cursor": next}))
        }
        JobOp::Get(id) => {
            let mut v = wj::job_json(id, &found(id)?, prices, now);
            if let Ok(Some(ev)) = store.outbox_event(id) {
                v["webhook"] = wj::webhook_json(&ev);
            }
            ok(v)
        }
        JobOp::Summary(id) => {
            let rec = found(id)?;
            let lines = last_lines(&dir.join(id).join("log"), wj::SUMMARY_LINES);
            ok(wj::summary_json(id, &rec, prices, now, &lines))
        }
        JobOp::Artifacts(id) => ok(wj::artifacts_json(id, &found(id)?)),
        JobOp::Receipt(id) => {
            let rec = found(id)?;
            if !rec.finished() {
                return Err(crate::wbx::error(
                    409,
                    &format!(
                        "the job has not finished ({}): its receipt is written when it ends",
                        rec.status
                    ),
                ));
            }
            let body = wj::receipt_json(id, &rec, prices, isolation);
            let mut v = body.clone();
            if let Some(s) = signer {
                use base64::Engine as _;
                let signed = serde_json::to_string(&body).unwrap_or_default();
                let sig = s.pair.sign(signed.as_bytes());
                v["signature"] = serde_json::json!({
                    "algorithm": "Ed25519",
                    "public_key": s.public_key(),
                    "signed": signed,
                    "value": base64::engine::general_purpose::STANDARD.encode(sig.as_ref()),
                });
            }
            ok(v)
        }
        JobOp::Logs {
            id,
            offset,
            limit,
            mode,
        } => {
            let rec = found(id)?;
            let path = dir.join(id).join("log");
            let size = std::fs::metadata(&path).map_or(0, |m| m.len());
            if let Some((mode, max_chars)) = mode {
                let lines = count_lines(&path);
                if *mode == wj::LogMode::Tail {
                    let text = read_tail(&path, size, *max_chars);
                    return ok(serde_json::json!({
                        "mode": "tail", "status": rec.status, "exit_code": rec.exit_code,
                        "lines": lines, "size": size, "text": text,
                    }));
                }
                let end = read_end(&path, size, DIGEST_BYTES);
                let (text, results) = crate::jobs::digest::digest(
                    &String::from_utf8_lossy(&end),
                    *mode == wj::LogMode::Errors,
                    *max_chars,
                );
                return ok(serde_json::json!({
                    "mode": if *mode == wj::LogMode::Errors { "errors" } else { "summary" },
                    "status": rec.status, "exit_code": rec.exit_code,
                    "lines": lines, "size": size, "text": text, "test_results": results,
                }));
            }
            let start = if *offset < 0 {
                size.saturating_sub(offset.unsigned_abs())
            } else {
                (*offset as u64).min(size)
            };
            let len = (size - start).min(*limit);
            let mut buf = vec![0u8; len as usize];
            if len > 0 {
                use std::os::unix::fs::FileExt as _;
                let f = std::fs::File::open(&path).map_err(|e| {
                    log::error!("jobs: reading {id}'s log: {e}");
                    crate::wbx::error(500, "the job's log could not be read")
                })?;
                let n = f.read_at(&mut buf, start).unwrap_or(0);
                buf.truncate(n);
            }
            let end = start + buf.len() as u64;
            let mut resp = Response::bytes(200, "text/plain; charset=utf-8", buf);
            resp = resp
                .with_header("X-Log-Offset", start.to_string())
                .with_header("X-Log-Next-Offset", end.to_string())
                .with_header("X-Log-Size", size.to_string())
                .with_header("X-Job-Status", rec.status);
            Ok(Outcome::Respond(resp))
        }
        JobOp::Artifact {
            id,
            name,
            head_only,
        } => {
            let rec = found(id)?;
            let Some(a) = rec.artifacts.iter().find(|a| a.name == *name) else {
                return Err(crate::wbx::error(
                    404,
                    &format!("no such result file: {name}"),
                ));
            };
            let path = dir.join(id).join(&a.file);
            let file = std::fs::File::open(&path).map_err(|e| {
                log::error!("jobs: {id}: opening {}: {e}", a.file);
                crate::wbx::error(
                    404,
                    &format!("no such result file: {name} (its file is gone)"),
                )
            })?;
            let size = a.size;
            let short = name.rsplit('/').next().unwrap_or(name);
            let head =
                crate::api::sessions::download_head("application/octet-stream", short.as_bytes())
                    .with_header("X-Content-SHA256", a.sha256.clone());
            if *head_only {
                return Ok(Outcome::Download(Box::new(crate::api::Download {
                    head,
                    length: Some(size),
                    rx: None,
                    status: Arc::new(std::sync::atomic::AtomicU8::new(
                        crate::api::sessions::XFER_OK,
                    )),
                })));
            }
            let slot = sessions.transfer_slot().map_err(|_| {
                crate::wbx::error(
                    429,
                    "too many downloads at once on this server; retry in a second",
                )
                .with_header("Retry-After", "1")
            })?;
            crate::api::sessions::spawn_transfer(head, Some(size), move |w| {
                let _slot = slot;
                let mut file = file;
                let n = std::io::copy(&mut std::io::Read::take(&mut file, size), w)?;
                if n != size {
                    return Err(std::io::Error::other("result file shrank while being sent"));
                }
                Ok(())
            })
        }
        JobOp::Stats(days) => {
            let since = now.saturating_sub(days * 86_400_000);
            let (jobs, _) = store
                .jobs_of(tenant, None, usize::MAX, |r| r.created_ms >= since)
                .map_err(|e| {
                    log::error!("jobs: stats: {e}");
                    store_refusal()
                })?;
            ok(stats_json(*days, &jobs, prices))
        }
        JobOp::BatchList { limit, cursor } => {
            let (page, more) = store.batches_of(tenant, *cursor, *limit).map_err(|e| {
                log::error!("jobs: listing batches: {e}");
                store_refusal()
            })?;
            let next = more
                .then(|| page.last().map(|(_, r)| r.seq.to_string()))
                .flatten();
            let items: Vec<serde_json::Value> = page
                .iter()
                .map(|(id, r)| crate::wbx::batches::list_item(id, r))
                .collect();
            ok(serde_json::json!({"batches": items, "next_cursor": next}))
        }
        _ => Err(crate::wbx::error(500, "not a read")),
    }
}

/// `GET /v1/jobs/stats`: per template and compute class, cost per completed job,
/// success rate, durations.
fn stats_json(days: u64, jobs: &[(String, JobRecord)], prices: &Prices) -> serde_json::Value {
    let mut by: BTreeMap<(&str, &str), Vec<&JobRecord>> = BTreeMap::new();
    for (_, r) in jobs {
        let class = prices.of(&r.spec).0.name;
        // WebAssembly jobs have no template: their row is the runtime's.
        let template = if r.spec.wasm.is_some() {
            wj::RUNTIME_WASI
        } else {
            r.spec.template.as_str()
        };
        by.entry((template, class)).or_default().push(r);
    }
    let rows: Vec<serde_json::Value> = by
        .into_iter()
        .map(|((template, class), rs)| {
            let finished: Vec<&&JobRecord> = rs.iter().filter(|r| r.finished()).collect();
            let completed = finished.iter().filter(|r| r.status == "completed").count();
            let cost = crate::jobs::Money(rs.iter().map(|r| prices.cost(&r.spec, r.billed_ms).0).sum());
            let mut durs: Vec<u64> = finished
                .iter()
                .filter_map(|r| wj::duration_ms(r, r.ended_ms.unwrap_or(0)))
                .collect();
            durs.sort_unstable();
            let pct = |p: usize| -> serde_json::Value {
                if durs.is_empty() {
                    return serde_json::Value::Null;
                }
                let i = ((durs.len() * p).div_ceil(100)).saturating_sub(1).min(durs.len() - 1);
                serde_json::json!(durs[i] as f64 / 1000.0)
            };
            serde_json::json!({
                "template": template,
                "compute_class": class,
                "jobs": rs.len(),
                "finished": finished.len(),
                "completed": completed,
                "success_rate": if finished.is_empty() { serde_json::Value::Null } else { serde_json::json!(completed as f64 / finished.len() as f64) },
                "cost": prices.show(cost),
                "cost_per_completed_job": if completed == 0 { serde_json::Value::Null } else { serde_json::json!(prices.show(crate::jobs::Money(cost.0 / completed as i128))) },
                "duration_p50_s": pct(50),
                "duration_p95_s": pct(95),
            })
        })
        .collect();
    serde_json::json!({"days": days, "by_template": rows})
}

/// The last `n` lines of a log (at most its last 64 KiB), lossily decoded.
fn last_lines(path: &Path, n: usize) -> Vec<String> {
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    let text = read_tail(path, size, 64 << 10);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.chars().take(500).collect())
        .collect()
}

/// The last `max` bytes of a file of `size` bytes.
fn read_end(path: &Path, size: u64, max: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt as _;
    let want = max.min(size);
    let mut buf = vec![0u8; usize::try_from(want).unwrap_or(0)];
    match std::fs::File::open(path).and_then(|f| f.read_exact_at(&mut buf, size - want)) {
        Ok(()) => buf,
        Err(_) => Vec::new(),
    }
}

/// The log's last `max_chars` characters (read from its last `4 × max_chars` bytes).
fn read_tail(path: &Path, size: u64, max_chars: usize) -> String {
    use std::os::unix::fs::FileExt as _;
    let want = (max_chars as u64 * 4).min(size);
    let mut buf = vec![0u8; want as usize];
    let n = std::fs::File::open(path)
        .and_then(|f| f.read_at(&mut buf, size - want))
        .unwrap_or(0);
    buf.truncate(n);
    let s = String::from_utf8_lossy(&buf);
    let count = s.chars().count();
    s.chars().skip(count.saturating_sub(max_chars)).collect()
}

fn count_lines(path: &Path) -> u64 {
    let mut n = 0u64;
    if let Ok(mut f) = std::fs::File::open(path) {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(k) = std::io::Read::read(&mut f, &mut buf) {
            if k == 0 {
                break;
            }
            n += memchr::memchr_iter(b'\n', &buf[..k]).count() as u64;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_submits_stop_at_three_quarters_of_the_store() {
        let map = crate::store::env::MAP_SIZE_BYTES as u64;
        let bound = map / 100 * 75;
        assert_eq!(super::store_full(bound - 1, 86_400), None);
        let at = super::store_full(bound, 86_400).unwrap();
        assert_eq!(
            at,
            format!("limit reached: the server's store is 75 % full ({bound} of {map} bytes); jobs are refused past 75 % until finished ones are removed (86400 s after their end)")
        );
        assert!(super::store_full(map, 86_400)
            .unwrap()
            .contains("is 100 % full"));
    }

    #[test]
    fn test_directories_are_looked_through_only_where_a_pattern_can_match() {
        let p = |s: &str| Pattern::parse(s).unwrap();
        assert!(could_hold(&p("output/"), "output"));
        assert!(could_hold(&p("output/"), "output/a/b"));
        assert!(!could_hold(&p("output/"), "node_modules"));
        assert!(could_hold(&p("a/b/*.txt"), "a"));
        assert!(could_hold(&p("a/b/*.txt"), "a/b"));
        assert!(!could_hold(&p("a/b/*.txt"), "a/b/c"));
        assert!(!could_hold(&p("*.csv"), "d"));
        assert!(could_hold(&p("**/*.csv"), "d/e/f"));
        assert_eq!(rel("/home/user/output/a.csv"), "output/a.csv");
    }
}

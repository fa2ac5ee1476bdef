//! The WBX face's background jobs in LMDB: id → JSON record (`jobs`), a per-tenant
//! index in submission order for listing newest first (`job_index`: `tenant \0 seq` →
//! id), idempotency keys (`job_idem`: `tenant \0 key` → id) and each unfinished job's
//! secret key (`job_keys`: id → the 32 bytes that open its sealed env values; deleted
//! in the transaction that ends the job, so its env values are unreadable from then on).
//!
//! A job is acknowledged only once its record, index entry, key and idempotency entry
//! are committed together, and two submits with one key in one tenant find each other
//! here, inside the writer's serial transactions: one job per key, also under concurrent
//! submits.

use super::{decode, encode, Store, StoreError};
use serde::{Deserialize, Serialize};

/// Bytes of a job's secret key.
pub const JOB_KEY_BYTES: usize = 32;

/// The sealed form of a job's env values: which key opens them is the job's.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Sealed {
    /// The AEAD nonce, hex.
    pub nonce: String,
    /// ChaCha20-Poly1305 of the JSON of the values, with its tag, base64.
    pub data: String,
}

/// `retry` as asked.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct RetryPolicy {
    /// Attempts in all, at least 1.
    pub max_attempts: u32,
}

/// One result file of an earlier job that a job is given (`inputs`), found in
/// `input/` of its working directory.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct InputFile {
    /// The job it comes from (in a batch, the id `from_index` named).
    pub job_id: String,
    /// In a batch: the index of that job in the batch, as asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_index: Option<u32>,
    /// Its result file's name.
    pub name: String,
    /// Its path under `input/` (`as`; by default the name's last part).
    #[serde(rename = "as")]
    pub dest: String,
    /// Bytes, as recorded when the job was accepted (`None`: its job had not
    /// finished then, in a batch).
    pub size: Option<u64>,
    /// SHA-256, hex, as recorded when the job was accepted.
    pub sha256: Option<String>,
}

/// Most files in `inputs`.
pub const MAX_INPUTS: usize = 32;
/// Most bytes of a job's inputs together.
pub const MAX_INPUT_BYTES: u64 = 64 << 20;

/// What a job asked for, as stored (env values only sealed). A field a later version
/// adds reads as its default in a record this version wrote.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct JobSpec {
    /// Run with `/bin/sh -c` in the user's home.
    pub command: String,
    /// Template name.
    pub template: String,
    /// Time limit of an attempt, seconds.
    pub timeout_s: u64,
    /// Result-file patterns, relative to the working directory.
    pub artifacts: Vec<String>,
    /// Paths that must be among the saved files.
    pub required_artifacts: Vec<String>,
    /// The env's names (the values are sealed).
    pub env_names: Vec<String>,
    /// SHA-256 of the env values (of the JSON object of names to values, sorted),
    /// hex; `None` without env.
    pub env_sha256: Option<String>,
    /// `network` as given (validated), re-read at each start.
    pub network: serde_json::Value,
    /// Retries of system failures.
    pub retry: RetryPolicy,
    /// The client's idempotency key.
    pub idempotency_key: Option<String>,
    /// `optimize_for` (or `placement`) as given.
    pub optimize_for: Option<String>,
    /// Where `job.finished` is sent.
    pub webhook_url: Option<String>,
    /// `max_cost`, billionths of the currency.
    pub max_cost: Option<i128>,
    /// Files of earlier jobs it is given.
    pub inputs: Vec<InputFile>,
    /// Its compute class, resolved at accept (`""` in records from before classes:
    /// economy).
    pub compute_class: String,
    /// Its class's rate, fixed at accept (`None` before classes: the list now).
    pub class_rate: Option<ClassRate>,
    /// A WebAssembly job (`"runtime": "wasi"`): its module and how it runs (`command`
    /// and `template` are then empty). `None`: a job in a sandbox.
    pub wasm: Option<WasmSpec>,
}

/// A WebAssembly job's module, arguments, memory and stdin. The module's and stdin's
/// bytes are files in the job's directory ([`WASM_MODULE_FILE`], [`WASM_STDIN_FILE`]),
/// not in its record; a module named by an input is read from the input at the start.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct WasmSpec {
    /// The inline module's SHA-256, hex (its bytes: the job directory's
    /// [`WASM_MODULE_FILE`]); `None` when `module_input` names it.
    pub module_sha256: Option<String>,
    /// Bytes of the inline module.
    pub module_bytes: u64,
    /// The path under `/input` of the input that is the module.
    pub module_input: Option<String>,
    /// Arguments after `argv[0]`.
    pub args: Vec<String>,
    /// Memory limit, MiB.
    pub memory_mb: u64,
    /// Bytes of stdin (the job directory's [`WASM_STDIN_FILE`] when not 0).
    pub stdin_bytes: u64,
}

/// The inline module's file in a job's directory.
pub const WASM_MODULE_FILE: &str = "module.wasm";
/// The stdin's file in a job's directory.
pub const WASM_STDIN_FILE: &str = "stdin";

/// A compute class's price per vCPU-second and GB-second, billionths of the currency.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClassRate {
    /// Per vCPU-second.
    pub vcpu_s: i128,
    /// Per GB-second.
    pub gb_s: i128,
}

/// A job's error, as the document names one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobError {
    /// `nonzero_exit`, `timeout`, `missing_artifacts`, `out_of_memory`, `cancelled`,
    /// `sandbox_lost`, `capacity`, `artifact_error`.
    pub code: String,
    /// In words.
    pub message: String,
    /// `job` (the job's own doing) or `system` (ours: retried when asked).
    pub kind: String,
}

/// One saved result file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Artifact {
    /// Its path relative to the working directory.
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// SHA-256, hex.
    pub sha256: String,
    /// The file under the job's directory (`a<N>`).
    pub file: String,
}

/// A file that matched a pattern and was not saved.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Skipped {
    /// Its path relative to the working directory.
    pub name: String,
    /// Why.
    pub reason: String,
}

/// One attempt's end.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Attempt {
    /// Unix milliseconds.
    pub started_ms: u64,
    /// Unix milliseconds.
    pub ended_ms: u64,
    /// Its error (`None`: it ran to its end).
    pub error: Option<JobError>,
}

/// One test failure.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Failure {
    /// The test's name as the framework writes it.
    pub name: String,
    /// Its file, where the output says.
    pub file: Option<String>,
    /// The first line(s) of why.
    pub message: String,
}

/// One framework's results in a log.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TestResults {
    /// `pytest`, `go test`, `cargo test`, `jest`, `vitest`, `mocha`, `phpunit` or `junit`.
    pub framework: String,
    /// Tests that passed (`None`: the output does not say, as `go test` without `-v`
    /// or a Gradle test task that passed).
    pub passed: Option<u64>,
    /// Tests that failed (errors included).
    pub failed: u64,
    /// Tests skipped (ignored, pending).
    pub skipped: u64,
    /// All of them (`None` when `passed` is).
    pub total: Option<u64>,
    /// The failures, at most `jobs::digest::MAX_FAILURES`.
    pub failures: Vec<Failure>,
}

/// One job, as stored (missing fields read as their defaults, as in [`JobSpec`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct JobRecord {
    /// Owning tenant.
    pub tenant: String,
    /// Submission order (the listing's cursor).
    pub seq: u64,
    /// The document's state.
    pub status: String,
    /// What it asked for.
    pub spec: JobSpec,
    /// Its env values, sealed (removed when it ends).
    pub sealed_env: Option<Sealed>,
    /// The job this one retries (`POST …/retry`).
    pub retry_of: Option<String>,
    /// Unix milliseconds.
    pub created_ms: u64,
    /// The current (or last) attempt's start.
    pub started_ms: Option<u64>,
    /// When it ended.
    pub ended_ms: Option<u64>,
    /// Attempts started.
    pub attempt: u32,
    /// Attempts that ended before the last.
    pub attempts: Vec<Attempt>,
    /// The command's exit code.
    pub exit_code: Option<i32>,
    /// Why it failed (or why it was cancelled, or expired).
    pub error: Option<JobError>,
    /// Saved result files.
    pub artifacts: Vec<Artifact>,
    /// Result files not saved.
    pub skipped: Vec<Skipped>,
    /// The log's size and SHA-256, once it ended.
    pub log_bytes: u64,
    /// Hex; `None` until it ended.
    pub log_sha256: Option<String>,
    /// Output the log did not keep (past its cap).
    pub log_dropped: u64,
    /// CPU time of its sandbox's cgroup, milliseconds (`None`: not measured).
    pub cpu_ms: Option<u64>,
    /// Peak memory of its sandbox's cgroup (`None`: not measured).
    pub peak_memory_bytes: Option<u64>,
    /// Run time billed, milliseconds (every attempt's).
    pub billed_ms: u64,
    /// Run time of attempts that failed on our side (`"kind": "system"`),
    /// milliseconds: never charged; shown as the job's `refund`.
    pub refunded_ms: u64,
    /// Test results recognised in its log when it ended.
    pub test_results: Vec<TestResults>,
    /// The batch it belongs to.
    pub batch: Option<String>,
    /// Its index in that batch's `jobs`.
    pub batch_index: u32,
    /// Jobs of its batch that must complete before it starts.
    pub depends_on: Vec<String>,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy { max_attempts: 1 }
    }
}

impl JobRecord {
    /// Whether it has ended (completed, failed, cancelled, expired).
    pub fn finished(&self) -> bool {
        matches!(
            self.status.as_str(),
            "completed" | "failed" | "cancelled" | "expired"
        )
    }
}

/// What a submit found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// The job was stored.
    New,
    /// The tenant's idempotency key names this earlier job.
    Existing(String, Box<JobRecord>),
    /// Its `inputs` name no file it can have: why (nothing was stored).
    Refused(String),
}

pub(super) fn scoped(tenant: &str, tail: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(tenant.len() + 1 + tail.len());
    k.extend_from_slice(tenant.as_bytes());
    k.push(0);
    k.extend_from_slice(tail);
    k
}

pub(super) fn index_key(tenant: &str, seq: u64) -> Vec<u8> {
    scoped(tenant, &seq.to_be_bytes())
}

pub(super) const SEQ: &str = "job_seq";

/// The next number of the shared sequence of jobs and batches.
pub(super) fn next_seq(
    t: &super::Tables,
    wtxn: &mut super::table::WriteTxn<'_, '_>,
) -> Result<u64, StoreError> {
    let seq = t
        .meta
        .get(wtxn, SEQ)?
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_le_bytes)
        + 1;
    t.meta.put(wtxn, SEQ, &seq.to_le_bytes())?;
    Ok(seq)
}

/// Records a new job: its record with the next sequence number, its index entry, its
/// key (`rec.seq` is set).
pub(super) fn insert_job(
    t: &super::Tables,
    wtxn: &mut super::table::WriteTxn<'_, '_>,
    id: &str,
    rec: &mut JobRecord,
    key: Option<[u8; JOB_KEY_BYTES]>,
) -> Result<(), StoreError> {
    rec.seq = next_seq(t, wtxn)?;
    let bytes = encode(id, &*rec)?;
    t.jobs.put(wtxn, id, &bytes)?;
    t.job_index
        .put(wtxn, &index_key(&rec.tenant, rec.seq), id.as_bytes())?;
    if let Some(k) = key {
        t.job_keys.put(wtxn, id, &k)?;
    }
    Ok(())
}

/// Checks each input that names a job (not a batch's `from_index`) against that job
/// as it is now: the tenant's, finished, with that result file; records its size and
/// SHA-256. `Ok(Err(why))`: refused.
pub(super) fn resolve_inputs(
    t: &super::Tables,
    wtxn: &heed::RoTxn<'_, heed::WithoutTls>,
    tenant: &str,
    inputs: &mut [InputFile],
) -> Result<Result<(), String>, StoreError> {
    let mut total = 0u64;
    for (i, input) in inputs.iter_mut().enumerate() {
        if input.from_index.is_some() {
            continue;
        }
        let src: Option<JobRecord> = match t.jobs.get(wtxn, &input.job_id)? {
            Some(b) => Some(decode(&input.job_id, b)?),
            None => None,
        };
        let Some(src) = src.filter(|r| r.tenant == tenant) else {
            return Ok(Err(format!(
                "inputs[{i}]: no job {} of yours (only your own jobs can be used; finished jobs are kept for their retention)",
                input.job_id
            )));
        };
        if !src.finished() {
            return Ok(Err(format!(
                "inputs[{i}]: job {} has not finished ({}); wait for it (POST /v1/jobs/wait), or submit both in one batch with from_index",
                input.job_id, src.status
            )));
        }
        let Some(a) = src.artifacts.iter().find(|a| a.name == input.name) else {
            let names: Vec<&str> = src
                .artifacts
                .iter()
                .take(10)
                .map(|a| a.name.as_str())
                .collect();
            return Ok(Err(format!(
                "inputs[{i}]: job {} has no result file {:?} (it has {}: {:?})",
                input.job_id,
                input.name,
                src.artifacts.len(),
                names
            )));
        };
        total = total.saturating_add(a.size);
        input.size = Some(a.size);
        input.sha256 = Some(a.sha256.clone());
    }
    if total > MAX_INPUT_BYTES {
        return Ok(Err(format!(
            "inputs: {total} bytes in all; at most {MAX_INPUT_BYTES} bytes (64 MiB)"
        )));
    }
    Ok(Ok(()))
}

impl Store {
    /// Stores a new job with its key, index entry and idempotency entry in one
    /// transaction, giving it the next sequence number; or finds the job the
    /// tenant's idempotency key already names.
    pub fn submit_job_then(
        &self,
        id: &str,
        mut rec: JobRecord,
        key: Option<[u8; JOB_KEY_BYTES]>,
        then: impl FnOnce(Result<(Submitted, JobRecord), StoreError>) + Send + 'static,
    ) {
        let id = id.to_string();
        let weight = rec.spec.command.len() + 4096;
        self.write_then(
            weight,
            move |t, wtxn| {
                let idem = rec
                    .spec
                    .idempotency_key
                    .as_ref()
                    .map(|k| scoped(&rec.tenant, k.as_bytes()));
                if let Some(ik) = &idem {
                    if let Some(existing) = t.job_idem.get(wtxn, ik)? {
                        let eid = String::from_utf8_lossy(existing).into_owned();
                        if let Some(bytes) = t.jobs.get(wtxn, &eid)? {
                            let er: JobRecord = decode(&eid, bytes)?;
                            return Ok((Submitted::Existing(eid, Box::new(er)), rec));
                        }
                    }
                }
                let tenant = rec.tenant.clone();
                if let Err(why) = resolve_inputs(t, wtxn, &tenant, &mut rec.spec.inputs)? {
                    return Ok((Submitted::Refused(why), rec));
                }
                insert_job(t, wtxn, &id, &mut rec, key)?;
                if let Some(ik) = &idem {
                    t.job_idem.put(wtxn, ik, id.as_bytes())?;
                }
                Ok((Submitted::New, rec))
            },
            then,
        );
    }

    /// Writes job `id`'s record while it exists (`false` when it does not). With
    /// `drop_key`, its secret key goes in the same transaction.
    pub fn put_job_then(
        &self,
        id: &str,
        rec: &JobRecord,
        drop_key: bool,
        then: impl FnOnce(Result<bool, StoreError>) + Send + 'static,
    ) {
        let bytes = match encode(id, rec) {
            Ok(b) => b,
            Err(e) => return then(Err(e)),
        };
        let id = id.to_string();
        self.write_then(
            bytes.len(),
            move |t, wtxn| {
                if t.jobs.get(wtxn, &id)?.is_none() {
                    return Ok(false);
                }
                t.jobs.put(wtxn, &id, &bytes)?;
                if drop_key {
                    t.job_keys.delete(wtxn, &id)?;
                }
                Ok(true)
            },
            then,
        );
    }

    /// Removes job `id` and everything of it (retention's end).
    pub fn delete_job_then(
        &self,
        id: &str,
        rec: &JobRecord,
        then: impl FnOnce(Result<bool, StoreError>) + Send + 'static,
    ) {
        let id = id.to_string();
        let index = index_key(&rec.tenant, rec.seq);
        let idem = rec
            .spec
            .idempotency_key
            .as_ref()
            .map(|k| scoped(&rec.tenant, k.as_bytes()));
        self.write_then(
            0,
            move |t, wtxn| {
                let existed = t.jobs.delete(wtxn, &id)?;
                t.job_index.delete(wtxn, &index)?;
                if let Some(ik) = idem {
                    // Only while it still names this job.
                    if t.job_idem.get(wtxn, &ik)? == Some(id.as_bytes()) {
                        t.job_idem.delete(wtxn, &ik)?;
                    }
                }
                t.job_keys.delete(wtxn, &id)?;
                t.webhook_outbox.delete(wtxn, &id)?;
                Ok(existed)
            },
            then,
        );
    }

    /// Job `id`'s record.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors or a corrupt record.
    pub fn job(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let rtxn = self.env.read_txn()?;
        match self.jobs.get(&rtxn, id)? {
            Some(b) => Ok(Some(decode(id, b)?)),
            None => Ok(None),
        }
    }

    /// The job `tenant`'s idempotency key names, with its record.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors or a corrupt record.
    pub fn job_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<(String, JobRecord)>, StoreError> {
        let rtxn = self.env.read_txn()?;
        let Some(id) = self.job_idem.get(&rtxn, &scoped(tenant, key.as_bytes()))? else {
            return Ok(None);
        };
        let id = String::from_utf8_lossy(id).into_owned();
        match self.jobs.get(&rtxn, &id)? {
            Some(b) => Ok(Some((id.clone(), decode(&id, b)?))),
            None => Ok(None),
        }
    }

    /// Job `id`'s secret key, while it has one.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn job_key(&self, id: &str) -> Result<Option<[u8; JOB_KEY_BYTES]>, StoreError> {
        let rtxn = self.env.read_txn()?;
        Ok(self
            .job_keys
            .get(&rtxn, id)?
            .and_then(|b| <[u8; JOB_KEY_BYTES]>::try_from(b).ok()))
    }

    /// `tenant`'s jobs newest first, before sequence number `before` (exclusive;
    /// `None`: from the newest), those `keep` accepts, at most `limit`; and whether
    /// more follow.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn jobs_of(
        &self,
        tenant: &str,
        before: Option<u64>,
        limit: usize,
        keep: impl Fn(&JobRecord) -> bool,
    ) -> Result<(Vec<(String, JobRecord)>, bool), StoreError> {
        self.page_of(
            &self.job_index,
            &self.jobs,
            "job",
            tenant,
            before,
            limit,
            keep,
        )
    }

    /// Every job's id (those whose record does not decode too).
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn job_ids(&self) -> Result<Vec<String>, StoreError> {
        let rtxn = self.env.read_txn()?;
        let mut out = Vec::new();
        for item in self.jobs.iter(&rtxn)? {
            let (id, _) = item?;
            out.push(id.to_string());
        }
        Ok(out)
    }

    /// Every job (id, record). Corrupt records are logged and skipped.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn all_jobs(&self) -> Result<Vec<(String, JobRecord)>, StoreError> {
        self.all_records(&self.jobs, "job")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::wait;

    pub(crate) fn record(tenant: &str, key: Option<&str>) -> JobRecord {
        JobRecord {
            tenant: tenant.into(),
            status: "queued".into(),
            spec: JobSpec {
                command: "true".into(),
                template: "base".into(),
                timeout_s: 60,
                network: serde_json::json!({"mode": "none"}),
                idempotency_key: key.map(str::to_string),
                ..JobSpec::default()
            },
            created_ms: 1,
            ..JobRecord::default()
        }
    }

    #[test]
    fn test_jobs_list_newest_first_per_tenant_and_keys_find_their_job() {
        let dir = std::env::temp_dir().join(format!("isobox-store-jobs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let s = Store::open(&dir).unwrap();
        for i in 0..5 {
            let tenant = if i % 2 == 0 { "a" } else { "b" };
            let r = wait(|t| {
                s.submit_job_then(
                    &format!("job_{i}"),
                    record(tenant, None),
                    Some([i as u8; 32]),
                    t,
                )
            });
            assert_eq!(r.unwrap().0, Submitted::New);
        }
        let (a, more) = s.jobs_of("a", None, 10, |_| true).unwrap();
        let ids: Vec<&str> = a.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(ids, ["job_4", "job_2", "job_0"]);
        assert!(!more);
        let (page, more) = s.jobs_of("a", None, 2, |_| true).unwrap();
        assert_eq!(page.len(), 2);
        assert!(more);
        let (rest, _) = s.jobs_of("a", Some(page[1].1.seq), 2, |_| true).unwrap();
        assert_eq!(rest[0].0, "job_0");
        // One job per idempotency key in a tenant; another tenant's key is its own.
        let first = wait(|t| s.submit_job_then("job_k1", record("a", Some("k")), None, t));
        assert_eq!(first.unwrap().0, Submitted::New);
        let again = wait(|t| s.submit_job_then("job_k2", record("a", Some("k")), None, t)).unwrap();
        assert!(matches!(again.0, Submitted::Existing(ref id, _) if id == "job_k1"));
        assert!(s.job("job_k2").unwrap().is_none());
        let other = wait(|t| s.submit_job_then("job_k3", record("b", Some("k")), None, t));
        assert_eq!(other.unwrap().0, Submitted::New);
        // Ending a job drops its key with the same write.
        assert_eq!(s.job_key("job_1").unwrap(), Some([1u8; 32]));
        let mut r = s.job("job_1").unwrap().unwrap();
        r.status = "completed".into();
        assert!(wait(|t| s.put_job_then("job_1", &r, true, t)).unwrap());
        assert_eq!(s.job_key("job_1").unwrap(), None);
        assert_eq!(s.job("job_1").unwrap().unwrap().status, "completed");
        // Deleting frees the key for a new job.
        let k1 = s.job("job_k1").unwrap().unwrap();
        assert!(wait(|t| s.delete_job_then("job_k1", &k1, t)).unwrap());
        let fresh = wait(|t| s.submit_job_then("job_k4", record("a", Some("k")), None, t));
        assert_eq!(fresh.unwrap().0, Submitted::New);
        drop(s);
        // Everything is there after a reopen.
        let s = Store::open(&dir).unwrap();
        assert_eq!(s.all_jobs().unwrap().len(), 7);
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

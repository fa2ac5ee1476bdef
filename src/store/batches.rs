//! The WBX face's batches in LMDB: id → JSON record (`batches`) and a per-tenant index
//! in submission order (`batch_index`: `tenant \0 seq` → id; the sequence is the one
//! jobs use). A batch's idempotency key shares `job_idem` under its own prefix byte
//! (`tenant \0 \x01 key`: a job's key is printable ASCII, so the two never meet).
//!
//! A batch is accepted as a whole or not at all: its record, every job's record, index
//! entry and key, and the idempotency entry are committed in one transaction.

use super::jobs::{insert_job, resolve_inputs, scoped, JobRecord, JOB_KEY_BYTES};
use super::webhooks::OutboxEvent;
use super::{decode, encode, Store, StoreError};
use serde::{Deserialize, Serialize};

/// One batch, as stored (missing fields read as their defaults).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct BatchRecord {
    /// Owning tenant.
    pub tenant: String,
    /// Submission order (shared with jobs; the listing's cursor).
    pub seq: u64,
    /// `name` as given.
    pub name: Option<String>,
    /// Its jobs' ids, in the order given (`from_index` and `depends_on` count here).
    pub jobs: Vec<String>,
    /// Jobs of it running at once, at most.
    pub max_concurrency: u32,
    /// `max_total_cost`, billionths of the currency.
    pub max_total_cost: Option<i128>,
    /// The client's idempotency key.
    pub idempotency_key: Option<String>,
    /// Where `batch.finished` is sent.
    pub webhook_url: Option<String>,
    /// Unix milliseconds.
    pub created_ms: u64,
    /// When its last job ended.
    pub ended_ms: Option<u64>,
    /// `running` until its last job ended, then `completed`, `partial`, `failed` or
    /// `cancelled`.
    pub status: String,
    /// `POST …/cancel` was asked.
    pub cancelled: bool,
}

/// One job of a new batch: its id, its record, its key.
pub type NewJob = (String, JobRecord, Option<[u8; JOB_KEY_BYTES]>);

/// What a batch submit found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchSubmitted {
    /// The batch and its jobs were stored (the records with their sequence numbers).
    New(Box<BatchRecord>, Vec<JobRecord>),
    /// The tenant's idempotency key names this earlier batch.
    Existing(String, Box<BatchRecord>),
    /// A job's `inputs` name no file it can have: why (nothing was stored).
    Refused(String),
}

fn idem_key(tenant: &str, key: &str) -> Vec<u8> {
    let mut tail = Vec::with_capacity(key.len() + 1);
    tail.push(1);
    tail.extend_from_slice(key.as_bytes());
    scoped(tenant, &tail)
}

impl Store {
    /// Stores batch `id` and all its jobs in one transaction; or finds the batch the
    /// tenant's idempotency key already names.
    pub fn submit_batch_then(
        &self,
        id: &str,
        mut rec: BatchRecord,
        mut jobs: Vec<NewJob>,
        then: impl FnOnce(Result<BatchSubmitted, StoreError>) + Send + 'static,
    ) {
        let id = id.to_string();
        let weight = 4096
            + jobs
                .iter()
                .map(|(_, r, _)| r.spec.command.len() + 1024)
                .sum::<usize>();
        self.write_then(
            weight,
            move |t, wtxn| {
                let idem = rec
                    .idempotency_key
                    .as_ref()
                    .map(|k| idem_key(&rec.tenant, k));
                if let Some(ik) = &idem {
                    if let Some(existing) = t.job_idem.get(wtxn, ik)? {
                        let eid = String::from_utf8_lossy(existing).into_owned();
                        if let Some(bytes) = t.batches.get(wtxn, &eid)? {
                            let er: BatchRecord = decode(&eid, bytes)?;
                            return Ok(BatchSubmitted::Existing(eid, Box::new(er)));
                        }
                    }
                }
                for (i, (_, job, _)) in jobs.iter_mut().enumerate() {
                    if let Err(why) = resolve_inputs(t, wtxn, &rec.tenant, &mut job.spec.inputs)? {
                        return Ok(BatchSubmitted::Refused(format!("jobs[{i}].{why}")));
                    }
                }
                rec.seq = super::jobs::next_seq(t, wtxn)?;
                t.batches.put(wtxn, &id, &encode(&id, &rec)?)?;
                t.batch_index.put(
                    wtxn,
                    &super::jobs::index_key(&rec.tenant, rec.seq),
                    id.as_bytes(),
                )?;
                if let Some(ik) = &idem {
                    t.job_idem.put(wtxn, ik, id.as_bytes())?;
                }
                let mut out = Vec::with_capacity(jobs.len());
                for (jid, mut job, key) in jobs {
                    insert_job(t, wtxn, &jid, &mut job, key)?;
                    out.push(job);
                }
                Ok(BatchSubmitted::New(Box::new(rec), out))
            },
            then,
        );
    }

    /// Writes batch `id`'s record (while it exists) and, with it, `event` into the
    /// outbox: one transaction. `false` when the batch is gone.
    pub fn put_batch_then(
        &self,
        id: &str,
        rec: &BatchRecord,
        event: Option<OutboxEvent>,
        then: impl FnOnce(Result<bool, StoreError>) + Send + 'static,
    ) {
        let (bytes, ev) = match super::encode_with_event(id, rec, event.as_ref()) {
            Ok(b) => b,
            Err(e) => return then(Err(e)),
        };
        let id = id.to_string();
        self.write_then(
            bytes.len() + ev.as_ref().map_or(0, Vec::len),
            move |t, wtxn| {
                if t.batches.get(wtxn, &id)?.is_none() {
                    return Ok(false);
                }
                t.batches.put(wtxn, &id, &bytes)?;
                if let Some(ev) = &ev {
                    t.webhook_outbox.put(wtxn, &id, ev)?;
                }
                Ok(true)
            },
            then,
        );
    }

    /// Removes batch `id` (retention's end; its jobs go on their own).
    pub fn delete_batch_then(
        &self,
        id: &str,
        rec: &BatchRecord,
        then: impl FnOnce(Result<bool, StoreError>) + Send + 'static,
    ) {
        let id = id.to_string();
        let index = super::jobs::index_key(&rec.tenant, rec.seq);
        let idem = rec
            .idempotency_key
            .as_ref()
            .map(|k| idem_key(&rec.tenant, k));
        self.write_then(
            0,
            move |t, wtxn| {
                let existed = t.batches.delete(wtxn, &id)?;
                t.batch_index.delete(wtxn, &index)?;
                if let Some(ik) = idem {
                    if t.job_idem.get(wtxn, &ik)? == Some(id.as_bytes()) {
                        t.job_idem.delete(wtxn, &ik)?;
                    }
                }
                t.webhook_outbox.delete(wtxn, &id)?;
                Ok(existed)
            },
            then,
        );
    }

    /// The id of the batch `tenant`'s idempotency key names.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn batch_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        let rtxn = self.env.read_txn()?;
        let id = self.job_idem.get(&rtxn, &idem_key(tenant, key))?;
        Ok(id.map(|id| String::from_utf8_lossy(id).into_owned()))
    }

    /// Batch `id`'s record.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors or a corrupt record.
    pub fn batch(&self, id: &str) -> Result<Option<BatchRecord>, StoreError> {
        let rtxn = self.env.read_txn()?;
        match self.batches.get(&rtxn, id)? {
            Some(b) => Ok(Some(decode(id, b)?)),
            None => Ok(None),
        }
    }

    /// `tenant`'s batches newest first, before sequence number `before` (exclusive),
    /// at most `limit`; and whether more follow.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn batches_of(
        &self,
        tenant: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<(Vec<(String, BatchRecord)>, bool), StoreError> {
        self.page_of(
            &self.batch_index,
            &self.batches,
            "batch",
            tenant,
            before,
            limit,
            |_| true,
        )
    }

    /// Every batch (id, record). Corrupt records are logged and skipped.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn all_batches(&self) -> Result<Vec<(String, BatchRecord)>, StoreError> {
        self.all_records(&self.batches, "batch")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::jobs::tests::record;
    use crate::store::jobs::{Artifact, InputFile, Submitted};
    use crate::store::wait;

    fn batch(tenant: &str, key: Option<&str>, jobs: &[&str]) -> BatchRecord {
        BatchRecord {
            tenant: tenant.into(),
            jobs: jobs.iter().map(|s| s.to_string()).collect(),
            max_concurrency: 10,
            idempotency_key: key.map(str::to_string),
            status: "running".into(),
            created_ms: 1,
            ..BatchRecord::default()
        }
    }

    #[test]
    fn test_a_batch_is_stored_whole_or_not_at_all_and_keys_find_it() {
        let dir = std::env::temp_dir().join(format!("isobox-store-batches-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let s = Store::open(&dir).unwrap();
        // A finished job with one result file, to take as an input.
        let mut done = record("a", None);
        done.status = "completed".into();
        done.artifacts.push(Artifact {
            name: "out/x.csv".into(),
            size: 3,
            sha256: "ab".repeat(32),
            file: "a0".into(),
        });
        let r = wait(|t| s.submit_job_then("job_src", done, None, t)).unwrap();
        assert_eq!(r.0, Submitted::New);
        let input = |job: &str, name: &str| InputFile {
            job_id: job.into(),
            name: name.into(),
            dest: "x.csv".into(),
            ..InputFile::default()
        };
        // A job whose input names a missing file: nothing of the batch is stored.
        let mut bad = record("a", None);
        bad.spec.inputs.push(input("job_src", "out/nope.csv"));
        let jobs = vec![
            ("job_b0".to_string(), record("a", None), None),
            ("job_b1".to_string(), bad, None),
        ];
        let r = wait(|t| {
            s.submit_batch_then(
                "bat_1",
                batch("a", Some("k"), &["job_b0", "job_b1"]),
                jobs,
                t,
            )
        });
        match r.unwrap() {
            BatchSubmitted::Refused(why) => {
                assert!(
                    why.starts_with("jobs[1].inputs[0]: job job_src has no result file"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(s.job("job_b0").unwrap().is_none());
        assert!(s.batch("bat_1").unwrap().is_none());
        // Another tenant's job cannot be taken.
        let mut foreign = record("b", None);
        foreign.spec.inputs.push(input("job_src", "out/x.csv"));
        let r = wait(|t| s.submit_job_then("job_f", foreign, None, t)).unwrap();
        assert!(matches!(r.0, Submitted::Refused(ref w) if w.contains("no job job_src of yours")));
        // The good batch: stored whole, its input resolved, found again by its key.
        let mut good = record("a", None);
        good.spec.inputs.push(input("job_src", "out/x.csv"));
        good.batch = Some("bat_2".into());
        let jobs = vec![
            ("job_g0".to_string(), record("a", None), Some([7u8; 32])),
            ("job_g1".to_string(), good, None),
        ];
        let r = wait(|t| {
            s.submit_batch_then(
                "bat_2",
                batch("a", Some("k"), &["job_g0", "job_g1"]),
                jobs,
                t,
            )
        });
        let BatchSubmitted::New(b, stored) = r.unwrap() else {
            panic!("not new")
        };
        assert_eq!(stored.len(), 2);
        assert!(stored[0].seq < stored[1].seq && b.seq < stored[0].seq);
        let g1 = s.job("job_g1").unwrap().unwrap();
        assert_eq!(g1.spec.inputs[0].size, Some(3));
        assert_eq!(
            g1.spec.inputs[0].sha256.as_deref(),
            Some("ab".repeat(32).as_str())
        );
        assert_eq!(s.job_key("job_g0").unwrap(), Some([7u8; 32]));
        let again =
            wait(|t| s.submit_batch_then("bat_3", batch("a", Some("k"), &[]), Vec::new(), t));
        assert!(matches!(again.unwrap(), BatchSubmitted::Existing(ref id, _) if id == "bat_2"));
        // A job's key and a batch's key of the same text do not meet.
        let j = wait(|t| s.submit_job_then("job_k", record("a", Some("k")), None, t)).unwrap();
        assert_eq!(j.0, Submitted::New);
        let (list, more) = s.batches_of("a", None, 10).unwrap();
        assert_eq!((list.len(), more), (1, false));
        assert!(s.batches_of("b", None, 10).unwrap().0.is_empty());
        // Its end, then its removal.
        let mut end = s.batch("bat_2").unwrap().unwrap();
        end.status = "completed".into();
        assert!(wait(|t| s.put_batch_then("bat_2", &end, None, t)).unwrap());
        assert_eq!(s.batch("bat_2").unwrap().unwrap().status, "completed");
        assert!(wait(|t| s.delete_batch_then("bat_2", &end, t)).unwrap());
        assert!(s.batch("bat_2").unwrap().is_none());
        assert!(s.batches_of("a", None, 10).unwrap().0.is_empty());
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

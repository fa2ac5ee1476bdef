//! Durable state in one LMDB environment (heed): the session registry, memory KV and
//! volumes. Every write goes through the one [`writer`] thread, which commits the
//! writes that arrive together in one transaction (group commit) and answers each only
//! after that commit is synced: an answer means durable. Reads open their own read
//! transaction on the caller's thread. Blocking calls run on the worker pool, never on
//! the reactor thread; the reactor uses the `*_then` forms, which never wait.

pub mod batches;
pub mod budget;
pub mod env;
pub mod eryx;
pub mod jobs;
pub mod kv;
pub mod volumes;
pub mod webhooks;
pub mod writer;

use heed::types::{Bytes, Str};
use heed::{Database, Env, RwTxn, WithoutTls};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// LMDB refused.
    #[error("lmdb: {0}")]
    Lmdb(#[from] heed::Error),
    /// The write succeeded on its own but its batch did not become durable.
    #[error("{}", .0.0)]
    Write(writer::WriteFailed),
    /// The writer's queue is full (the caller answers 503).
    #[error("the state store is busy: too many writes waiting")]
    Busy,
    /// A record did not decode.
    #[error("corrupt record {key}: {source}")]
    Corrupt {
        /// Its key.
        key: String,
        /// Cause.
        source: serde_json::Error,
    },
}

/// Schema version written at open; a future layout migrates from it.
pub const SCHEMA_VERSION: u32 = 1;

/// One filesystem session, as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    /// Owning tenant (`public` or `key-<hex>`).
    pub tenant: String,
    /// SHA-256 of the capability token, hex.
    pub token_sha256: String,
    /// Runtime name.
    pub runtime: String,
    /// `filesystem` or `kernel`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Creation time, Unix milliseconds.
    pub created_at_ms: u64,
    /// Idle time after which the session is reaped, seconds.
    pub ttl_sec: u64,
    /// Last time a call used it, Unix milliseconds.
    pub last_used_ms: u64,
    /// Disk quota of its workspace.
    pub quota_bytes: u64,
    /// The volume it holds read-write at `/memory`, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    /// Network of its steps when a step does not say (`network` at create); absent:
    /// on, as for `/execute`. A kernel session's is fixed for the kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
    /// The version of `runtime` its steps (and its kernel) run, as `GET /runtimes` lists
    /// it; absent (records of before): the runtime's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl SessionRecord {
    /// When it expires, Unix milliseconds.
    pub fn expires_at_ms(&self) -> u64 {
        self.last_used_ms
            .saturating_add(self.ttl_sec.saturating_mul(1000))
    }
}

/// The environment and its tables: what reads use, and what a write is given.
pub struct Tables {
    /// Private to `store`: only the writer opens write transactions.
    env: Env<WithoutTls>,
    sessions: Database<Str, Bytes>,
    /// Memory KV values: `tenant \0 namespace \0 key` → header + value (see `kv`).
    kv: Database<Bytes, Bytes>,
    /// Expiry index: `expires_at_ms (big-endian u64) ++ kv key` → empty.
    kv_exp: Database<Bytes, Bytes>,
    /// Per-tenant KV usage: tenant → `bytes u64 LE ++ keys u64 LE`.
    kv_usage: Database<Bytes, Bytes>,
    /// Meta values (schema version, the KV version counter).
    meta: Database<Str, Bytes>,
    /// Volumes: id → JSON record.
    volumes: Database<Str, Bytes>,
    /// The eryx face's sessions: id → JSON record.
    eryx_sessions: Database<Str, Bytes>,
    /// The eryx face's session state: id → dill's bytes.
    eryx_state: Database<Str, Bytes>,
    /// The eryx face's uploaded environments: id → JSON record.
    eryx_envs: Database<Str, Bytes>,
    /// The WBX face's jobs: id → JSON record.
    jobs: Database<Str, Bytes>,
    /// Jobs by tenant in submission order: `tenant \0 seq (u64 BE)` → id.
    job_index: Database<Bytes, Bytes>,
    /// Idempotency keys: `tenant \0 key` → id.
    job_idem: Database<Bytes, Bytes>,
    /// Unfinished jobs' secret keys: id → 32 bytes.
    job_keys: Database<Str, Bytes>,
    /// Tenants' webhook signing secrets: tenant → secret.
    webhook_secrets: Database<Str, Bytes>,
    /// Webhook events and their deliveries: event id → JSON.
    webhook_outbox: Database<Str, Bytes>,
    /// Tenants' budgets: tenant → JSON.
    budgets: Database<Str, Bytes>,
    /// Spend per tenant and UTC month or day: `tenant \0 period` → i128 LE.
    spend: Database<Bytes, Bytes>,
    /// The WBX face's batches: id → JSON record.
    batches: Database<Str, Bytes>,
    /// Batches by tenant in submission order: `tenant \0 seq (u64 BE)` → id.
    batch_index: Database<Bytes, Bytes>,
    /// Tenants' default compute classes: tenant → the class's name.
    compute_prefs: Database<Str, Bytes>,
}

/// The tables and the writer thread. Reads go to [`Tables`] (through `Deref`).
pub struct Store {
    // Declared first: dropped first, so the writer finishes its queue while the
    // environment is still open.
    writer: writer::Writer,
    tables: Arc<Tables>,
}

impl std::ops::Deref for Store {
    type Target = Tables;
    fn deref(&self) -> &Tables {
        &self.tables
    }
}

impl Store {
    /// Opens the environment under `dir` and its tables, and starts the writer.
    ///
    /// # Errors
    /// [`StoreError`] when LMDB cannot open or create them.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let env = env::open(dir)?;
        let mut wtxn = env.write_txn()?;
        let meta: Database<Str, Bytes> = env.create_database(&mut wtxn, Some("meta"))?;
        if meta.get(&wtxn, "schema")?.is_none() {
            meta.put(&mut wtxn, "schema", &SCHEMA_VERSION.to_le_bytes())?;
        }
        let sessions = env.create_database(&mut wtxn, Some("sessions"))?;
        let kv = env.create_database(&mut wtxn, Some("kv"))?;
        let kv_exp = env.create_database(&mut wtxn, Some("kv_exp"))?;
        let kv_usage = env.create_database(&mut wtxn, Some("kv_usage"))?;
        let volumes = env.create_database(&mut wtxn, Some("volumes"))?;
        let eryx_sessions = env.create_database(&mut wtxn, Some("eryx_sessions"))?;
        let eryx_state = env.create_database(&mut wtxn, Some("eryx_state"))?;
        let eryx_envs = env.create_database(&mut wtxn, Some("eryx_envs"))?;
        let jobs = env.create_database(&mut wtxn, Some("jobs"))?;
        let job_index = env.create_database(&mut wtxn, Some("job_index"))?;
        let job_idem = env.create_database(&mut wtxn, Some("job_idem"))?;
        let job_keys = env.create_database(&mut wtxn, Some("job_keys"))?;
        let webhook_secrets = env.create_database(&mut wtxn, Some("webhook_secrets"))?;
        let webhook_outbox = env.create_database(&mut wtxn, Some("webhook_outbox"))?;
        let budgets = env.create_database(&mut wtxn, Some("budgets"))?;
        let spend = env.create_database(&mut wtxn, Some("spend"))?;
        let batches = env.create_database(&mut wtxn, Some("batches"))?;
        let batch_index = env.create_database(&mut wtxn, Some("batch_index"))?;
        let compute_prefs = env.create_database(&mut wtxn, Some("compute_prefs"))?;
        wtxn.commit()?;
        let tables = Arc::new(Tables {
            env,
            sessions,
            kv,
            kv_exp,
            kv_usage,
            meta,
            volumes,
            eryx_sessions,
            eryx_state,
            eryx_envs,
            jobs,
            job_index,
            job_idem,
            job_keys,
            webhook_secrets,
            webhook_outbox,
            budgets,
            spend,
            batches,
            batch_index,
            compute_prefs,
        });
        let writer = writer::Writer::start(Arc::clone(&tables))
            .map_err(|e| StoreError::Lmdb(heed::Error::Io(e)))?;
        Ok(Store { writer, tables })
    }

    /// Runs `f` in the writer's next batch and waits until that batch is durable.
    /// Worker threads only: it blocks for a sync.
    ///
    /// # Errors
    /// What `f` returns, or [`StoreError::Write`] when the batch did not commit.
    pub fn write<R, E, F>(&self, weight: usize, f: F) -> Result<R, E>
    where
        F: FnOnce(&Tables, &mut RwTxn<'_>) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let q = writer::Queued::new(weight, f, move |r| {
            let _ = tx.send(r);
        });
        if self.writer.submit(q).is_err() {
            return Err(E::from(StoreError::Write(writer::WriteFailed(
                "the writer has stopped".into(),
            ))));
        }
        rx.recv().unwrap_or_else(|_| {
            Err(E::from(StoreError::Write(writer::WriteFailed(
                "the writer dropped the write".into(),
            ))))
        })
    }

    /// Queues `f` for the writer's next batch without waiting; `then` gets its result
    /// once the batch is durable, on the writer thread (it must only hand it on). When
    /// the queue is full, `then` gets [`StoreError::Busy`] at once, on this thread.
    pub fn write_then<R, E, F, T>(&self, weight: usize, f: F, then: T)
    where
        F: FnOnce(&Tables, &mut RwTxn<'_>) -> Result<R, E> + Send + 'static,
        T: FnOnce(Result<R, E>) + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let q = writer::Queued::new(weight, f, then);
        if let Err(q) = self.writer.try_submit(q) {
            q.refuse(StoreError::Busy);
        }
    }

    /// The writer's counters: commits, writes, largest batch.
    pub fn writer_stats(&self) -> (u64, u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.writer.stats;
        (
            s.commits.load(Relaxed),
            s.writes.load(Relaxed),
            s.max_batch.load(Relaxed),
        )
    }

    /// Inserts a new session; fails when the id exists (ids are random: never expected).
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn insert_session(&self, id: &str, rec: &SessionRecord) -> Result<bool, StoreError> {
        let bytes = encode(id, rec)?;
        let id = id.to_string();
        self.write(bytes.len(), move |t, wtxn| {
            if t.sessions.get(wtxn, &id)?.is_some() {
                return Ok(false);
            }
            t.sessions.put(wtxn, &id, &bytes)?;
            Ok(true)
        })
    }

    /// Updates `last_used_ms` of a session (no-op when it is gone).
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn touch_session(&self, id: &str, now_ms: u64) -> Result<(), StoreError> {
        let id = id.to_string();
        self.write(0, move |t, wtxn| {
            let Some(bytes) = t.sessions.get(wtxn, &id)? else {
                return Ok(());
            };
            let mut rec: SessionRecord = decode(&id, bytes)?;
            rec.last_used_ms = rec.last_used_ms.max(now_ms);
            let bytes = encode(&id, &rec)?;
            t.sessions.put(wtxn, &id, &bytes)?;
            Ok(())
        })
    }

    /// Deletes a session record, releasing the volume it holds in the same
    /// transaction. Returns whether it existed.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(0, move |t, wtxn| {
            let Some(bytes) = t.sessions.get(wtxn, &id)? else {
                return Ok(false);
            };
            let rec: SessionRecord = decode(&id, bytes)?;
            if let Some(vid) = &rec.volume_id {
                if let Some(vb) = t.volumes.get(wtxn, vid)? {
                    let mut v: volumes::VolumeRecord = decode(vid, vb)?;
                    if v.held_by.as_deref() == Some(id.as_str()) {
                        v.held_by = None;
                        let b = encode(vid, &v)?;
                        t.volumes.put(wtxn, vid, &b)?;
                    }
                }
            }
            t.sessions.delete(wtxn, &id)?;
            Ok(true)
        })
    }
}

impl Tables {
    /// Reads one session.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors or a corrupt record.
    pub fn session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let rtxn = self.env.read_txn()?;
        let Some(bytes) = self.sessions.get(&rtxn, id)? else {
            return Ok(None);
        };
        decode(id, bytes).map(Some)
    }

    /// Every session (id, record). Corrupt records are logged and skipped.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn sessions(&self) -> Result<Vec<(String, SessionRecord)>, StoreError> {
        let rtxn = self.env.read_txn()?;
        let mut out = Vec::new();
        for item in self.sessions.iter(&rtxn)? {
            let (id, bytes) = item?;
            match decode(id, bytes) {
                Ok(rec) => out.push((id.to_string(), rec)),
                Err(e) => log::error!("store: {e}"),
            }
        }
        Ok(out)
    }

    /// Number of sessions.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn session_count(&self) -> Result<u64, StoreError> {
        let rtxn = self.env.read_txn()?;
        Ok(self.sessions.len(&rtxn)?)
    }
}

impl Tables {
    /// `tenant`'s records of `db` newest first through `index` (`tenant \0 seq` → id),
    /// before sequence number `before` (exclusive; `None`: from the newest), those
    /// `keep` accepts, at most `limit`; and whether more follow. One that does not
    /// decode is logged (as a `what`) and skipped.
    #[allow(clippy::too_many_arguments)]
    fn page_of<T: serde::de::DeserializeOwned>(
        &self,
        index: &Database<Bytes, Bytes>,
        db: &Database<Str, Bytes>,
        what: &str,
        tenant: &str,
        before: Option<u64>,
        limit: usize,
        keep: impl Fn(&T) -> bool,
    ) -> Result<(Vec<(String, T)>, bool), StoreError> {
        use std::ops::Bound;
        let rtxn = self.env.read_txn()?;
        let lo = jobs::index_key(tenant, 0);
        let hi = jobs::index_key(tenant, before.unwrap_or(u64::MAX));
        let range = (
            Bound::Included(lo.as_slice()),
            Bound::Excluded(hi.as_slice()),
        );
        let mut out = Vec::new();
        for item in index.rev_range(&rtxn, &range)? {
            let (_, id) = item?;
            let id = String::from_utf8_lossy(id).into_owned();
            let Some(bytes) = db.get(&rtxn, &id)? else {
                continue;
            };
            let rec: T = match decode(&id, bytes) {
                Ok(r) => r,
                Err(e) => {
                    log::error!("store: {what}: {e}");
                    continue;
                }
            };
            if !keep(&rec) {
                continue;
            }
            if out.len() == limit {
                return Ok((out, true));
            }
            out.push((id, rec));
        }
        Ok((out, false))
    }

    /// Every record of `db` (id, record); one that does not decode is logged (as a
    /// `what`) and skipped.
    fn all_records<T: serde::de::DeserializeOwned>(
        &self,
        db: &Database<Str, Bytes>,
        what: &str,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let rtxn = self.env.read_txn()?;
        let mut out = Vec::new();
        for item in db.iter(&rtxn)? {
            let (id, bytes) = item?;
            match decode(id, bytes) {
                Ok(rec) => out.push((id.to_string(), rec)),
                Err(e) => log::error!("store: {what}: {e}"),
            }
        }
        Ok(out)
    }
}

fn decode<T: serde::de::DeserializeOwned>(id: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt {
        key: id.to_string(),
        source,
    })
}

/// A record and the outbox event written with it, encoded.
fn encode_with_event<T: Serialize>(
    id: &str,
    rec: &T,
    event: Option<&webhooks::OutboxEvent>,
) -> Result<(Vec<u8>, Option<Vec<u8>>), StoreError> {
    Ok((encode(id, rec)?, event.map(|e| encode(id, e)).transpose()?))
}

/// Waits for the result a `…_then` write hands its callback (tests).
#[cfg(test)]
pub(crate) fn wait<T: Send + 'static>(f: impl FnOnce(Box<dyn FnOnce(T) + Send>)) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    f(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    rx.recv().unwrap()
}

fn encode<T: Serialize>(id: &str, rec: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(rec).map_err(|source| StoreError::Corrupt {
        key: id.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(tenant: &str) -> SessionRecord {
        SessionRecord {
            tenant: tenant.into(),
            token_sha256: "00".repeat(32),
            runtime: "python".into(),
            kind: "filesystem".into(),
            created_at_ms: 1,
            ttl_sec: 10,
            last_used_ms: 1000,
            quota_bytes: 1 << 20,
            volume_id: None,
            network: None,
            version: None,
        }
    }

    #[test]
    fn test_sessions_roundtrip_and_reopen() {
        let dir = std::env::temp_dir().join(format!("isobox-store-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let s = Store::open(&dir).unwrap();
            assert!(s.insert_session("a", &rec("public")).unwrap());
            assert!(!s.insert_session("a", &rec("other")).unwrap());
            s.touch_session("a", 5000).unwrap();
            s.touch_session("a", 10).unwrap();
            let got = s.session("a").unwrap().unwrap();
            assert_eq!(got.tenant, "public");
            assert_eq!(got.last_used_ms, 5000);
            assert_eq!(got.expires_at_ms(), 15_000);
            assert_eq!(s.session_count().unwrap(), 1);
        }
        // Durable across a reopen (what a daemon restart does).
        let s = Store::open(&dir).unwrap();
        assert_eq!(s.sessions().unwrap().len(), 1);
        assert!(s.delete_session("a").unwrap());
        assert!(!s.delete_session("a").unwrap());
        assert!(s.session("a").unwrap().is_none());
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

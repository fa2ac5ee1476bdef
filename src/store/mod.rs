//! Durable state in one LMDB environment (heed): the session registry, memory KV,
//! volumes, jobs, batches, webhooks, eryx state. Every write goes through the one
//! [`writer`] thread, which commits the writes that arrive together in one transaction
//! (group commit) and answers each only after that commit's changes are synced to the
//! write-ahead log ([`wal`]): an answer means durable, across a power cut too. Reads open their own read
//! transaction on the caller's thread. Blocking calls run on the worker pool, never on
//! the reactor thread; the reactor uses the `*_then` forms, which never wait.

pub mod batches;
pub mod budget;
pub mod env;
pub mod eryx;
pub mod jobs;
pub mod kv;
pub mod table;
pub mod volumes;
pub mod wal;
pub mod webhooks;
pub mod writer;

use heed::types::{Bytes, Str};
use heed::{Database, Env, WithoutTls};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use table::{Table, WriteTxn};

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
    sessions: Table<Str, Bytes>,
    /// Memory KV values: `tenant \0 namespace \0 key` → header + value (see `kv`).
    kv: Table<Bytes, Bytes>,
    /// Expiry index: `expires_at_ms (big-endian u64) ++ kv key` → empty.
    kv_exp: Table<Bytes, Bytes>,
    /// Per-tenant KV usage: tenant → `bytes u64 LE ++ keys u64 LE`.
    kv_usage: Table<Bytes, Bytes>,
    /// Meta values (schema version, the KV version counter).
    meta: Table<Str, Bytes>,
    /// Volumes: id → JSON record.
    volumes: Table<Str, Bytes>,
    /// The eryx face's sessions: id → JSON record.
    eryx_sessions: Table<Str, Bytes>,
    /// The eryx face's session state: id → dill's bytes.
    eryx_state: Table<Str, Bytes>,
    /// The eryx face's uploaded environments: id → JSON record.
    eryx_envs: Table<Str, Bytes>,
    /// The WBX face's jobs: id → JSON record.
    jobs: Table<Str, Bytes>,
    /// Jobs by tenant in submission order: `tenant \0 seq (u64 BE)` → id.
    job_index: Table<Bytes, Bytes>,
    /// Idempotency keys: `tenant \0 key` → id.
    job_idem: Table<Bytes, Bytes>,
    /// Unfinished jobs' secret keys: id → 32 bytes.
    job_keys: Table<Str, Bytes>,
    /// Tenants' webhook signing secrets: tenant → secret.
    webhook_secrets: Table<Str, Bytes>,
    /// Webhook events and their deliveries: event id → JSON.
    webhook_outbox: Table<Str, Bytes>,
    /// Tenants' budgets: tenant → JSON.
    budgets: Table<Str, Bytes>,
    /// Spend per tenant and UTC month or day: `tenant \0 period` → i128 LE.
    spend: Table<Bytes, Bytes>,
    /// The WBX face's batches: id → JSON record.
    batches: Table<Str, Bytes>,
    /// Batches by tenant in submission order: `tenant \0 seq (u64 BE)` → id.
    batch_index: Table<Bytes, Bytes>,
    /// Tenants' default compute classes: tenant → the class's name.
    compute_prefs: Table<Str, Bytes>,
}

/// The tables and the writer thread. Reads go to [`Tables`] (through `Deref`).
pub struct Store {
    // Declared first: dropped first, so the writer finishes its queue while the
    // environment is still open.
    writer: writer::Writer,
    tables: Arc<Tables>,
    /// The exclusive `flock` on the directory, dropped last.
    _lock: std::fs::File,
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
        Store::open_with(dir, writer::CHECKPOINT_EVERY, false)
    }

    /// [`Store::open`] with checkpoints `every` so long apart while there are records;
    /// `hold_confirms` (tests): checkpoints begin and are confirmed only when the writer
    /// needs one (as if the power always went before the sync thread confirmed them).
    pub(crate) fn open_with(
        dir: &Path,
        every: std::time::Duration,
        hold_confirms: bool,
    ) -> Result<Store, StoreError> {
        let io = |e: std::io::Error| StoreError::Lmdb(heed::Error::Io(e));
        // One process at a time: recovery writes into data.mdb before LMDB's own locks
        // are taken. The lock goes with the store (or the process).
        std::fs::create_dir_all(dir).map_err(io)?;
        let lock = std::fs::File::open(dir).map_err(io)?;
        if !crate::sys::try_lock_exclusive(&lock).map_err(io)? {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                format!("{} is in use by another process", dir.display()),
            )));
        }
        // Before LMDB reads its meta pages: back to the log's checkpoint, if the daemon
        // did not close the store cleanly.
        let recovered = wal::recover(dir).map_err(io)?;
        let env = env::open(dir)?;
        // Pins the checkpoint until the replay below is synced and a new log begins.
        let base = env.clone().static_read_txn()?;
        let mut wtxn = env.write_txn()?;
        table::replay(&env, &mut wtxn, recovered.txnid, &recovered.records)?;
        let meta: Database<Str, Bytes> = env.create_database(&mut wtxn, Some("meta"))?;
        if meta.get(&wtxn, "schema")?.is_none() {
            meta.put(&mut wtxn, "schema", &SCHEMA_VERSION.to_le_bytes())?;
        }
        macro_rules! table {
            ($name:literal) => {
                Table::new(env.create_database(&mut wtxn, Some($name))?, $name)
            };
        }
        let sessions = table!("sessions");
        let kv = table!("kv");
        let kv_exp = table!("kv_exp");
        let kv_usage = table!("kv_usage");
        let volumes = table!("volumes");
        let eryx_sessions = table!("eryx_sessions");
        let eryx_state = table!("eryx_state");
        let eryx_envs = table!("eryx_envs");
        let jobs = table!("jobs");
        let job_index = table!("job_index");
        let job_idem = table!("job_idem");
        let job_keys = table!("job_keys");
        let webhook_secrets = table!("webhook_secrets");
        let webhook_outbox = table!("webhook_outbox");
        let budgets = table!("budgets");
        let spend = table!("spend");
        let batches = table!("batches");
        let batch_index = table!("batch_index");
        let compute_prefs = table!("compute_prefs");
        wtxn.commit()?;
        env.force_sync()?;
        // The log's first checkpoint is this state, synced above; from here on LMDB
        // commits without syncing and the log makes each batch durable.
        let pin = env.clone().static_read_txn()?;
        let log = wal::Wal::start(
            dir,
            &recovered,
            pin.id() as u64,
            env.stat().page_size as usize,
        )
        .map_err(io)?;
        drop(base);
        env::commit_without_sync(&env)?;
        let meta = Table::new(meta, "meta");
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
        let writer = writer::Writer::start(Arc::clone(&tables), log, pin, every, hold_confirms)
            .map_err(io)?;
        Ok(Store {
            writer,
            tables,
            _lock: lock,
        })
    }

    /// Runs `f` in the writer's next batch and waits until that batch is durable.
    /// Worker threads only: it blocks for a sync.
    ///
    /// # Errors
    /// What `f` returns, or [`StoreError::Write`] when the batch did not commit.
    pub fn write<R, E, F>(&self, weight: usize, f: F) -> Result<R, E>
    where
        F: FnOnce(&Tables, &mut WriteTxn<'_, '_>) -> Result<R, E> + Send + 'static,
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
        F: FnOnce(&Tables, &mut WriteTxn<'_, '_>) -> Result<R, E> + Send + 'static,
        T: FnOnce(Result<R, E>) + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let q = writer::Queued::new(weight, f, then);
        if let Err(q) = self.writer.try_submit(q) {
            q.refuse(StoreError::Busy);
        }
    }

    /// Checkpoints completed since open (see [`wal`]).
    pub fn checkpoints(&self) -> u64 {
        self.writer
            .stats
            .checkpoints
            .load(std::sync::atomic::Ordering::Relaxed)
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
    /// Bytes of the environment's pages in use (its free pages not counted): how full
    /// its map ([`env::MAP_SIZE_BYTES`]) is.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn used_bytes(&self) -> Result<u64, StoreError> {
        Ok(self.env.non_free_pages_size()?)
    }

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

    pub(super) fn rec(tenant: &str) -> SessionRecord {
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

#[cfg(test)]
mod durability_tests {
    use super::kv::Precondition;
    use super::*;
    use std::collections::BTreeMap;
    use std::time::Duration;

    const NOW: u64 = 1_700_000_000_000;
    const HOUR: Duration = Duration::from_secs(3600);

    fn put(s: &Store, k: &str, v: &[u8]) {
        s.kv_put("public", "d", k, v, None, Precondition::None, NOW)
            .unwrap();
    }

    fn check(s: &Store, want: &BTreeMap<String, Vec<u8>>, gone: &[String], sessions: usize) {
        for (k, v) in want {
            let got = s.kv_get("public", "d", k, NOW).unwrap();
            assert_eq!(got.map(|e| e.value).as_ref(), Some(v), "{k}");
        }
        for k in gone {
            assert!(s.kv_get("public", "d", k, NOW).unwrap().is_none(), "{k}");
        }
        let bytes: u64 = want.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
        assert_eq!(s.kv_usage("public").unwrap(), (bytes, want.len() as u64));
        assert_eq!(s.sessions().unwrap().len(), sessions);
    }

    /// The store's files in `live` as they are now (the page cache: what a `kill -9`
    /// leaves), copied into `to`.
    fn copy_store(live: &Path, to: &Path) -> std::path::PathBuf {
        std::fs::create_dir_all(to).unwrap();
        for f in ["wal-0", "wal-1", "data.mdb"] {
            if live.join(f).exists() {
                std::fs::copy(live.join(f), to.join(f)).unwrap();
            }
        }
        to.to_path_buf()
    }

    /// The worst a power loss can leave: every page written since the last sync is
    /// either its old content, its new one, or (past the old end of the file) garbage;
    /// only the log's synced bytes are sure. Here the meta pages are always the new
    /// ones (pointing at pages that may not have made it), the case LMDB alone cannot
    /// survive without its syncs.
    #[test]
    fn test_a_power_loss_after_answered_writes_loses_none_of_them() {
        power_loss("one", HOUR, false);
    }

    /// The same with a checkpoint begun and never confirmed: the answered writes are
    /// in two logs, the newer one's base not synced; recovery goes back to the older
    /// one's and replays both.
    #[test]
    fn test_a_power_loss_before_a_checkpoint_is_confirmed_loses_no_answered_write() {
        power_loss("two", Duration::from_millis(1), true);
    }

    fn power_loss(name: &str, every: Duration, hold_confirms: bool) {
        let base =
            std::env::temp_dir().join(format!("isobox-store-power-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let live = base.join("live");
        let mut want = BTreeMap::new();
        let mut gone = Vec::new();
        {
            let s = Store::open_with(&live, HOUR, false).unwrap();
            for i in 0..300usize {
                let (k, v) = (format!("k{i:04}"), vec![(i % 251) as u8; 100 + i % 700]);
                put(&s, &k, &v);
                want.insert(k, v);
            }
        }
        // Closed cleanly: this is on disk, synced.
        let synced = std::fs::read(live.join("data.mdb")).unwrap();
        let s = Store::open_with(&live, every, hold_confirms).unwrap();
        for i in 0..600usize {
            match i % 3 {
                0 => {
                    let (k, v) = (format!("n{i:04}"), vec![7u8; 50 + i]);
                    put(&s, &k, &v);
                    want.insert(k, v);
                }
                1 => {
                    let k = format!("k{:04}", (i * 7) % 300);
                    if want.contains_key(&k) {
                        let v = vec![(i % 13) as u8; 300 + i % 900];
                        put(&s, &k, &v);
                        want.insert(k, v);
                    }
                }
                _ => {
                    let k = format!("k{:04}", (i * 13) % 300);
                    if want.remove(&k).is_some() {
                        assert!(s
                            .kv_delete("public", "d", &k, Precondition::None, NOW)
                            .unwrap());
                        gone.push(k);
                    }
                }
            }
        }
        let mut rec = tests::rec("public");
        rec.last_used_ms = 77;
        assert!(s.insert_session("s1", &rec).unwrap());
        // Nothing of this was checkpointed: it is all in the log.
        let (commits, _, _) = s.writer_stats();
        assert!(commits > 450, "{commits}");
        let now = std::fs::read(live.join("data.mdb")).unwrap();
        let logs: Vec<Option<Vec<u8>>> = (0..2)
            .map(|i| std::fs::read(live.join(format!("wal-{i}"))).ok())
            .collect();
        assert_eq!(s.checkpoints(), 0);
        drop(s);
        // With a checkpoint begun, both files hold records (past the header, its metas
        // and the confirmation's 4 KiB).
        let with_records = logs.iter().flatten().filter(|l| l.len() > 16384).count();
        assert_eq!(with_records, if hold_confirms { 2 } else { 1 });
        assert!(now.len() > synced.len() && now != synced);
        let psize = 4096;
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..6 {
            let dir = base.join(format!("crash-{round}"));
            std::fs::create_dir_all(&dir).unwrap();
            for (i, l) in logs.iter().enumerate() {
                if let Some(l) = l {
                    std::fs::write(dir.join(format!("wal-{i}")), l).unwrap();
                }
            }
            let mut disk = now.clone();
            for (p, page) in disk.chunks_mut(psize).enumerate().skip(2) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Round 0: nothing since the sync made it; round 1: everything did.
                let pick = match round {
                    0 => 0,
                    1 => 1,
                    _ => rng % 2,
                };
                if pick == 0 {
                    match synced.get(p * psize..(p + 1) * psize) {
                        Some(old) => page.copy_from_slice(old),
                        None => page.fill(0xab),
                    }
                }
            }
            std::fs::write(dir.join("data.mdb"), &disk).unwrap();
            let s = Store::open_with(&dir, HOUR, false).unwrap();
            check(&s, &want, &gone, 1);
            assert_eq!(s.session("s1").unwrap().unwrap().last_used_ms, 77);
            // And it goes on from there: a write, a clean close, a reopen.
            put(&s, "after", b"x");
            drop(s);
            let s = Store::open_with(&dir, HOUR, false).unwrap();
            let mut w = want.clone();
            w.insert("after".into(), b"x".to_vec());
            check(&s, &w, &gone, 1);
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// A batch larger than a whole log file: the log is emptied by a checkpoint first
    /// and grows past its size for that one record; it is as durable as any, and the
    /// file shrinks back when its next turn begins. A second store on the same
    /// directory is refused while the first is open.
    #[test]
    fn test_a_batch_larger_than_the_log_and_one_store_per_directory() {
        let base = std::env::temp_dir().join(format!("isobox-store-big-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let live = base.join("live");
        let s = Store::open_with(&live, HOUR, false).unwrap();
        let Err(e) = Store::open_with(&live, HOUR, false) else {
            panic!("a second store opened the same directory");
        };
        assert!(e.to_string().contains("in use by another process"), "{e}");
        put(&s, "small", b"1");
        let big = vec![0x5au8; (wal::CAPACITY + (1 << 20)) as usize];
        let b2 = big.clone();
        s.write(big.len(), move |t, wtxn| -> Result<(), StoreError> {
            t.meta.put(wtxn, "big", &b2)?;
            Ok(())
        })
        .unwrap();
        put(&s, "after", b"2");
        // At least the checkpoint that made room (the log's size then begins another).
        assert!(s.checkpoints() >= 1);
        let crashed = copy_store(&live, &base.join("crashed"));
        let grown = (0..2)
            .map(|i| {
                std::fs::metadata(live.join(format!("wal-{i}")))
                    .unwrap()
                    .len()
            })
            .max()
            .unwrap();
        assert!(grown > wal::CAPACITY, "{grown}");
        drop(s);
        let s = Store::open_with(&crashed, HOUR, false).unwrap();
        let rtxn = s.env.read_txn().unwrap();
        assert!(s.meta.get(&rtxn, "big").unwrap() == Some(&big[..]));
        drop(rtxn);
        let mut want = BTreeMap::new();
        want.insert("small".to_string(), b"1".to_vec());
        want.insert("after".to_string(), b"2".to_vec());
        check(&s, &want, &[], 0);
        // Two checkpoints (the next turn of each file) and the grown one is back.
        put(&s, "x", b"3");
        drop(s);
        let s = Store::open_with(&crashed, Duration::from_millis(1), false).unwrap();
        for i in 0..3 {
            put(&s, &format!("y{i}"), b"4");
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(s);
        for i in 0..2 {
            let len = std::fs::metadata(crashed.join(format!("wal-{i}")))
                .unwrap()
                .len();
            assert!(len <= wal::CAPACITY, "wal-{i}: {len}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// A log whose checkpoint was never confirmed needs the log before it; without
    /// it the store refuses to open (saying what to do) rather than trust pages that
    /// may never have reached the disk.
    #[test]
    fn test_an_unconfirmed_log_without_the_one_before_is_refused() {
        let base = std::env::temp_dir().join(format!("isobox-store-orphan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let live = base.join("live");
        let s = Store::open_with(&live, Duration::from_millis(1), true).unwrap();
        for i in 0..50 {
            put(&s, &format!("k{i}"), b"v");
        }
        let crashed = copy_store(&live, &base.join("crashed"));
        drop(s);
        // The newer log is the one with the higher generation: drop the other.
        let gen = |f: &str| {
            let b = std::fs::read(crashed.join(f)).unwrap();
            u64::from_le_bytes(b[16..24].try_into().unwrap())
        };
        let older = if gen("wal-0") < gen("wal-1") {
            "wal-0"
        } else {
            "wal-1"
        };
        std::fs::remove_file(crashed.join(older)).unwrap();
        let Err(e) = Store::open_with(&crashed, HOUR, false) else {
            panic!("opened on an unconfirmed checkpoint");
        };
        assert!(e.to_string().contains("cannot be recovered"), "{e}");
        assert!(e.to_string().contains("move"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Checkpoints in the background while writes go on, from many threads; then the
    /// files as a `kill -9` leaves them (the page cache is kept, the writer did not
    /// close the log) open to every answered write.
    #[test]
    fn test_background_checkpoints_under_concurrent_writes_and_a_crash_after_them() {
        let base = std::env::temp_dir().join(format!("isobox-store-ckpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let live = base.join("live");
        let s = Store::open_with(&live, Duration::from_millis(2), false).unwrap();
        std::thread::scope(|sc| {
            for th in 0..6 {
                let s = &s;
                sc.spawn(move || {
                    for i in 0..150usize {
                        let k = format!("t{th}-{:03}", i % 90);
                        put(s, &k, &vec![(th * 31 + i) as u8; 64 + (i * 37) % 3000]);
                        if i % 10 == 9 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                });
            }
        });
        let mut want = BTreeMap::new();
        for th in 0..6usize {
            for i in 60..150usize {
                want.insert(
                    format!("t{th}-{:03}", i % 90),
                    vec![(th * 31 + i) as u8; 64 + (i * 37) % 3000],
                );
            }
        }
        check(&s, &want, &[], 0);
        assert!(s.checkpoints() >= 3, "{}", s.checkpoints());
        // A last batch, logged and maybe not yet checkpointed.
        put(&s, "last", b"1");
        want.insert("last".into(), b"1".to_vec());
        let crashed = copy_store(&live, &base.join("crashed"));
        drop(s);
        let s = Store::open_with(&crashed, HOUR, false).unwrap();
        check(&s, &want, &[], 0);
        drop(s);
        std::fs::remove_dir_all(&base).unwrap();
    }
}

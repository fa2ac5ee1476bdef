//! The eryx face's sessions in LMDB: id → JSON record (`eryx_sessions`), and the
//! Python state a session's last kept run left (`eryx_state`: id → dill's bytes, at
//! most `wasm::frame::STATE_BYTES`). A run's state and its session's new expiry are
//! written in one transaction, and only while the session still exists, so a session
//! deleted during a run never comes back with that run's state.
//!
//! Uploaded environments (`eryx_envs`: id → JSON record): what was uploaded and how
//! its build went. The packages themselves are files under the data directory
//! (`daemon::eryx_envs`).

use super::{decode, encode, Store, StoreError, Tables};
use serde::{Deserialize, Serialize};

/// One eryx session, as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EryxSessionRecord {
    /// Owning tenant.
    pub tenant: String,
    /// The environment its runs use.
    pub environment: String,
    /// Idle time after its last run before it expires, seconds.
    pub ttl_secs: u64,
    /// Creation time, Unix milliseconds.
    pub created_at_ms: u64,
    /// When it expires, Unix milliseconds.
    pub expires_at_ms: u64,
}

/// One uploaded environment, as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EryxEnvRecord {
    /// Owning tenant.
    pub tenant: String,
    /// Its name, unique in the tenant.
    pub name: String,
    /// `building`, `ready` or `failed`.
    pub status: String,
    /// Modules imported into its snapshot.
    pub imports: Vec<String>,
    /// The packages' names as uploaded.
    pub packages: Vec<String>,
    /// Why its last build failed.
    #[serde(default)]
    pub error: Option<String>,
    /// The snapshot its last good build made (its name says which engine and CPU it
    /// is for).
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Unix milliseconds.
    pub created_at_ms: u64,
    /// Unix milliseconds.
    pub updated_at_ms: u64,
}

impl Store {
    /// Writes environment `id`'s record; with `new`, only if no record has that id
    /// (`false` then). Without `new`, only if the record still exists (`false` when it
    /// was deleted meanwhile).
    pub fn put_eryx_env_then(
        &self,
        id: &str,
        rec: &EryxEnvRecord,
        new: bool,
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
                if t.eryx_envs.get(wtxn, &id)?.is_some() == new {
                    return Ok(false);
                }
                t.eryx_envs.put(wtxn, &id, &bytes)?;
                Ok(true)
            },
            then,
        );
    }

    /// Deletes environment `id`'s record; whether it existed.
    pub fn delete_eryx_env_then(
        &self,
        id: &str,
        then: impl FnOnce(Result<bool, StoreError>) + Send + 'static,
    ) {
        let id = id.to_string();
        self.write_then(0, move |t, wtxn| Ok(t.eryx_envs.delete(wtxn, &id)?), then);
    }

    /// Inserts a new session; `false` when the id exists (ids are random: never
    /// expected).
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn insert_eryx_session_then(
        &self,
        id: &str,
        rec: &EryxSessionRecord,
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
                if t.eryx_sessions.get(wtxn, &id)?.is_some() {
                    return Ok(false);
                }
                t.eryx_sessions.put(wtxn, &id, &bytes)?;
                Ok(true)
            },
            then,
        );
    }

    /// A run in session `id` ended: its new expiry, and the state to keep when the run's
    /// changes are kept (`None`: the state stays). `Ok(false)`: the session is gone
    /// (deleted or expired meanwhile), and nothing is written.
    pub fn keep_eryx_run_then(
        &self,
        id: &str,
        expires_at_ms: u64,
        state: Option<Vec<u8>>,
        then: impl FnOnce(Result<bool, StoreError>) + Send + 'static,
    ) {
        let id = id.to_string();
        let weight = state.as_ref().map_or(0, Vec::len);
        self.write_then(
            weight,
            move |t, wtxn| {
                let Some(bytes) = t.eryx_sessions.get(wtxn, &id)? else {
                    return Ok(false);
                };
                let mut rec: EryxSessionRecord = decode(&id, bytes)?;
                rec.expires_at_ms = expires_at_ms;
                let bytes = encode(&id, &rec)?;
                t.eryx_sessions.put(wtxn, &id, &bytes)?;
                if let Some(state) = state {
                    t.eryx_state.put(wtxn, &id, &state)?;
                }
                Ok(true)
            },
            then,
        );
    }

    /// Deletes sessions and their state; how many existed.
    pub fn delete_eryx_sessions_then(
        &self,
        ids: Vec<String>,
        then: impl FnOnce(Result<usize, StoreError>) + Send + 'static,
    ) {
        self.write_then(
            0,
            move |t, wtxn| {
                let mut n = 0;
                for id in &ids {
                    if t.eryx_sessions.delete(wtxn, id)? {
                        n += 1;
                    }
                    t.eryx_state.delete(wtxn, id)?;
                }
                Ok(n)
            },
            then,
        );
    }
}

impl Tables {
    /// Every uploaded environment (id, record). Corrupt records are logged and
    /// skipped.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn eryx_envs(&self) -> Result<Vec<(String, EryxEnvRecord)>, StoreError> {
        self.all_records(&self.eryx_envs, "eryx environment")
    }

    /// Every eryx session (id, record). Corrupt records are logged and skipped.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn eryx_sessions(&self) -> Result<Vec<(String, EryxSessionRecord)>, StoreError> {
        self.all_records(&self.eryx_sessions, "eryx session")
    }

    /// The state session `id`'s last kept run left, if any.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn eryx_state(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let rtxn = self.env.read_txn()?;
        Ok(self.eryx_state.get(&rtxn, id)?.map(<[u8]>::to_vec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::wait;

    #[test]
    fn test_eryx_sessions_keep_their_state_across_a_reopen_and_die_with_it() {
        let dir = std::env::temp_dir().join(format!("isobox-store-eryx-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rec = EryxSessionRecord {
            tenant: "public".into(),
            environment: "python".into(),
            ttl_secs: 60,
            created_at_ms: 1,
            expires_at_ms: 60_001,
        };
        {
            let s = Store::open(&dir).unwrap();
            assert!(wait(|t| s.insert_eryx_session_then("a", &rec, t)).unwrap());
            assert!(!wait(|t| s.insert_eryx_session_then("a", &rec, t)).unwrap());
            assert!(wait(|t| s.keep_eryx_run_then("a", 90_000, Some(b"one".to_vec()), t)).unwrap());
            // A run that keeps nothing moves the expiry only.
            assert!(wait(|t| s.keep_eryx_run_then("a", 95_000, None, t)).unwrap());
            // A session that is gone gets no state.
            assert!(!wait(|t| s.keep_eryx_run_then("b", 1, Some(b"x".to_vec()), t)).unwrap());
            assert_eq!(s.eryx_state("b").unwrap(), None);
        }
        let s = Store::open(&dir).unwrap();
        let all = s.eryx_sessions().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].1.expires_at_ms, 95_000);
        assert_eq!(s.eryx_state("a").unwrap().as_deref(), Some(&b"one"[..]));
        assert_eq!(
            wait(|t| s.delete_eryx_sessions_then(vec!["a".into(), "b".into()], t)).unwrap(),
            1
        );
        assert!(s.eryx_sessions().unwrap().is_empty());
        assert_eq!(s.eryx_state("a").unwrap(), None);
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Volumes in LMDB: id → JSON record, and the hold a session has on one. Holding and
//! releasing happen in the same transaction as the session's insert and delete, so a
//! crash can never leave a volume held by a session that does not exist.

use super::{decode, encode, SessionRecord, Store, StoreError, Tables};
use serde::{Deserialize, Serialize};

/// One volume, as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRecord {
    /// Owning tenant.
    pub tenant: String,
    /// Its name (free text, not unique).
    pub name: String,
    /// Creation time, Unix milliseconds.
    pub created_at_ms: u64,
    /// Disk quota.
    pub quota_bytes: u64,
    /// The session holding it read-write, if any.
    #[serde(default)]
    pub held_by: Option<String>,
}

/// Why a session could not take a volume.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    /// No such volume for this tenant.
    #[error("volume not found")]
    NotFound,
    /// Another session holds it.
    #[error("the volume is attached to another session")]
    Held,
    /// LMDB failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Store {
    /// Inserts a new volume.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn insert_volume(&self, id: &str, rec: &VolumeRecord) -> Result<bool, StoreError> {
        let bytes = encode(id, rec)?;
        let id = id.to_string();
        self.write(bytes.len(), move |t, wtxn| {
            if t.volumes.get(wtxn, &id)?.is_some() {
                return Ok(false);
            }
            t.volumes.put(wtxn, &id, &bytes)?;
            Ok(true)
        })
    }

    /// Deletes a volume unless a session holds it. `Ok(None)`: no such volume;
    /// `Ok(Some(false))`: held; `Ok(Some(true))`: deleted.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn delete_volume(&self, id: &str) -> Result<Option<bool>, StoreError> {
        let id = id.to_string();
        self.write(0, move |t, wtxn| {
            let Some(bytes) = t.volumes.get(wtxn, &id)? else {
                return Ok(None);
            };
            let rec: VolumeRecord = decode(&id, bytes)?;
            if rec.held_by.is_some() {
                return Ok(Some(false));
            }
            t.volumes.delete(wtxn, &id)?;
            Ok(Some(true))
        })
    }

    /// Inserts a session and, when it names a volume, takes that volume (it must be the
    /// same tenant's and free), all in one transaction.
    ///
    /// # Errors
    /// [`HoldError`].
    pub fn insert_session_holding(&self, id: &str, rec: &SessionRecord) -> Result<bool, HoldError> {
        let bytes = encode(id, rec)?;
        let (id, rec) = (id.to_string(), rec.clone());
        self.write(bytes.len(), move |t, wtxn| {
            if t.sessions
                .get(wtxn, &id)
                .map_err(StoreError::from)?
                .is_some()
            {
                return Ok(false);
            }
            if let Some(vid) = &rec.volume_id {
                let vbytes = t
                    .volumes
                    .get(wtxn, vid)
                    .map_err(StoreError::from)?
                    .ok_or(HoldError::NotFound)?;
                let mut vrec: VolumeRecord = decode(vid, vbytes)?;
                if vrec.tenant != rec.tenant {
                    return Err(HoldError::NotFound);
                }
                if vrec.held_by.is_some() {
                    return Err(HoldError::Held);
                }
                vrec.held_by = Some(id.clone());
                let vb = encode(vid, &vrec)?;
                t.volumes.put(wtxn, vid, &vb).map_err(StoreError::from)?;
            }
            t.sessions
                .put(wtxn, &id, &bytes)
                .map_err(StoreError::from)?;
            Ok(true)
        })
    }

    /// Releases holds whose session no longer exists (startup repair; normally the
    /// session delete releases its volume in the same transaction). Returns how many.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn release_orphan_holds(&self) -> Result<usize, StoreError> {
        self.write(0, |t, wtxn| {
            let mut fixes = Vec::new();
            for item in t.volumes.iter(wtxn)? {
                let (vid, bytes) = item?;
                let rec: VolumeRecord = decode(vid, bytes)?;
                if let Some(sid) = &rec.held_by {
                    if t.sessions.get(wtxn, sid)?.is_none() {
                        fixes.push((vid.to_string(), rec));
                    }
                }
            }
            let n = fixes.len();
            for (vid, mut rec) in fixes {
                rec.held_by = None;
                let b = encode(&vid, &rec)?;
                t.volumes.put(wtxn, &vid, &b)?;
            }
            Ok(n)
        })
    }
}

impl Tables {
    /// Reads one volume.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors or a corrupt record.
    pub fn volume(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        let rtxn = self.env.read_txn()?;
        self.volumes
            .get(&rtxn, id)?
            .map(|b| decode(id, b))
            .transpose()
    }

    /// Every volume (id, record).
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn volumes(&self) -> Result<Vec<(String, VolumeRecord)>, StoreError> {
        let rtxn = self.env.read_txn()?;
        let mut out = Vec::new();
        for item in self.volumes.iter(&rtxn)? {
            let (id, bytes) = item?;
            match decode(id, bytes) {
                Ok(rec) => out.push((id.to_string(), rec)),
                Err(e) => log::error!("store: {e}"),
            }
        }
        Ok(out)
    }
}

//! Webhooks in LMDB: each tenant's signing secret (`webhook_secrets`: tenant → the
//! secret; it must be readable, since every delivery is signed with it, so it is kept
//! as it is, in the data directory only root reads), and the outbox
//! (`webhook_outbox`: event id → JSON [`OutboxEvent`]). An event is put in the
//! outbox in the transaction that writes its job's end, so no crash loses one; it
//! leaves the outbox with its job.

use super::jobs::JobRecord;
use super::{decode, encode, Store, StoreError};
use serde::{Deserialize, Serialize};

/// One event and where its delivery stands.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct OutboxEvent {
    /// Whose (its deliveries are signed with this tenant's secret).
    pub tenant: String,
    /// `job.finished`.
    pub event: String,
    /// Where to.
    pub url: String,
    /// The exact body every delivery sends.
    pub body: String,
    /// Unix milliseconds.
    pub created_ms: u64,
    /// `pending`, `delivered` or `failed` (every retry used).
    pub state: String,
    /// Deliveries tried.
    pub attempts: u32,
    /// When the next is due (pending), Unix milliseconds.
    pub next_ms: u64,
    /// Why the last one did not count.
    pub last_error: Option<String>,
    /// When it was delivered.
    pub delivered_ms: Option<u64>,
}

impl Store {
    /// Writes job `id`'s end (its key deleted) and, with it, `event` into the outbox
    /// and `cost` (billionths) into its tenant's spend of the month and day it ended:
    /// one transaction. `false` when the job's record is gone.
    pub fn end_job_then(
        &self,
        id: &str,
        rec: &JobRecord,
        event: Option<OutboxEvent>,
        cost: i128,
        then: impl FnOnce(Result<bool, StoreError>) + Send + 'static,
    ) {
        let (month, day) = super::budget::periods(&rec.tenant, rec.ended_ms.unwrap_or(0));
        let (bytes, ev) = match super::encode_with_event(id, rec, event.as_ref()) {
            Ok(b) => b,
            Err(e) => return then(Err(e)),
        };
        let id = id.to_string();
        self.write_then(
            bytes.len() + ev.as_ref().map_or(0, Vec::len),
            move |t, wtxn| {
                if t.jobs.get(wtxn, &id)?.is_none() {
                    return Ok(false);
                }
                t.jobs.put(wtxn, &id, &bytes)?;
                t.job_keys.delete(wtxn, &id)?;
                if let Some(ev) = &ev {
                    t.webhook_outbox.put(wtxn, &id, ev)?;
                }
                if cost != 0 {
                    super::budget::add_spend(t, wtxn, &month, cost)?;
                    super::budget::add_spend(t, wtxn, &day, cost)?;
                }
                Ok(true)
            },
            then,
        );
    }

    /// Every event in the outbox. Corrupt ones are logged and skipped.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn outbox(&self) -> Result<Vec<(String, OutboxEvent)>, StoreError> {
        self.all_records(&self.webhook_outbox, "webhook event")
    }

    /// Event `id`, if it is in the outbox.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors or a corrupt record.
    pub fn outbox_event(&self, id: &str) -> Result<Option<OutboxEvent>, StoreError> {
        let rtxn = self.env.read_txn()?;
        match self.webhook_outbox.get(&rtxn, id)? {
            Some(b) => Ok(Some(decode(id, b)?)),
            None => Ok(None),
        }
    }

    /// Writes event `id`'s state (a worker thread: it waits for the commit).
    ///
    /// # Errors
    /// [`StoreError`] when it did not become durable.
    pub fn put_outbox_event(&self, id: &str, ev: &OutboxEvent) -> Result<(), StoreError> {
        let bytes = encode(id, ev)?;
        let id = id.to_string();
        self.write(bytes.len(), move |t, wtxn| {
            // Only while it is there: its job may have been removed meanwhile.
            if t.webhook_outbox.get(wtxn, &id)?.is_some() {
                t.webhook_outbox.put(wtxn, &id, &bytes)?;
            }
            Ok(())
        })
    }

    /// Removes event `id` (its job left).
    pub fn delete_outbox_event_then(
        &self,
        id: &str,
        then: impl FnOnce(Result<bool, StoreError>) + Send + 'static,
    ) {
        let id = id.to_string();
        self.write_then(
            0,
            move |t, wtxn| Ok(t.webhook_outbox.delete(wtxn, &id)?),
            then,
        );
    }

    /// `tenant`'s signing secret, if it has one.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn webhook_secret(&self, tenant: &str) -> Result<Option<String>, StoreError> {
        let rtxn = self.env.read_txn()?;
        Ok(self
            .webhook_secrets
            .get(&rtxn, tenant)?
            .map(|b| String::from_utf8_lossy(b).into_owned()))
    }

    /// Gives `tenant` the secret `fresh`: always with `replace` (a rotation), else only
    /// when it has none. The secret it has afterwards (a worker thread: it waits).
    ///
    /// # Errors
    /// [`StoreError`] when it did not become durable.
    pub fn set_webhook_secret(
        &self,
        tenant: &str,
        fresh: &str,
        replace: bool,
    ) -> Result<String, StoreError> {
        let (tenant, fresh) = (tenant.to_string(), fresh.to_string());
        self.write(fresh.len(), move |t, wtxn| {
            if !replace {
                if let Some(old) = t.webhook_secrets.get(wtxn, &tenant)? {
                    return Ok(String::from_utf8_lossy(old).into_owned());
                }
            }
            t.webhook_secrets.put(wtxn, &tenant, fresh.as_bytes())?;
            Ok(fresh)
        })
    }
}

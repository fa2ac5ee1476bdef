//! Budgets in LMDB: each tenant's limits (`budgets`: tenant → JSON [`Budget`]) and
//! what its jobs cost per UTC calendar month and day (`spend`: `tenant \0 2026-12` and
//! `tenant \0 2026-12-04` → billionths of the currency, i128 little-endian). A job's
//! cost is added in the transaction that writes its end (`Store::end_job_then`).
//! Beside them, each tenant's default compute class (`compute_prefs`: tenant → name).

use super::table::WriteTxn;
use super::{decode, encode, Store, StoreError, Tables};
use serde::{Deserialize, Serialize};

/// A tenant's limits, in billionths of the currency (`None`: no limit).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Budget {
    /// Per UTC calendar month.
    pub monthly_limit: Option<i128>,
    /// Per UTC calendar day.
    pub daily_limit: Option<i128>,
    /// Percentage of a limit at which the answer says so.
    pub alert_pct: Option<u32>,
}

/// The spend keys of `tenant` at Unix milliseconds `ms`: its month's and its day's.
pub fn periods(tenant: &str, ms: u64) -> (Vec<u8>, Vec<u8>) {
    let t = jiff::civil::DateTime::constant(1970, 1, 1, 0, 0, 0, 0)
        .saturating_add(std::time::Duration::from_millis(ms));
    let key = |p: String| {
        let mut k = tenant.as_bytes().to_vec();
        k.push(0);
        k.extend_from_slice(p.as_bytes());
        k
    };
    (
        key(format!("{:04}-{:02}", t.year(), t.month())),
        key(format!("{:04}-{:02}-{:02}", t.year(), t.month(), t.day())),
    )
}

/// Adds `amount` to the spend under `key` (in a write transaction).
pub(super) fn add_spend(
    t: &Tables,
    wtxn: &mut WriteTxn<'_, '_>,
    key: &[u8],
    amount: i128,
) -> Result<(), StoreError> {
    let old = t
        .spend
        .get(wtxn, key)?
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
        .map_or(0, i128::from_le_bytes);
    t.spend.put(wtxn, key, &(old + amount).to_le_bytes())?;
    Ok(())
}

impl Store {
    /// Writes `tenant`'s limits (a worker thread: it waits for the commit).
    ///
    /// # Errors
    /// [`StoreError`] when it did not become durable.
    pub fn put_budget(&self, tenant: &str, b: &Budget) -> Result<(), StoreError> {
        let bytes = encode(tenant, b)?;
        let tenant = tenant.to_string();
        self.write(bytes.len(), move |t, wtxn| {
            t.budgets.put(wtxn, &tenant, &bytes)?;
            Ok(())
        })
    }

    /// Every tenant's limits.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn budgets(&self) -> Result<Vec<(String, Budget)>, StoreError> {
        let rtxn = self.env.read_txn()?;
        let mut out = Vec::new();
        for item in self.budgets.iter(&rtxn)? {
            let (tenant, bytes) = item?;
            out.push((tenant.to_string(), decode(tenant, bytes)?));
        }
        Ok(out)
    }

    /// Writes `tenant`'s default compute class (`None`: the server's default) (a
    /// worker thread: it waits for the commit).
    ///
    /// # Errors
    /// [`StoreError`] when it did not become durable.
    pub fn put_compute_pref(&self, tenant: &str, class: Option<&str>) -> Result<(), StoreError> {
        let tenant = tenant.to_string();
        let class = class.map(str::to_string);
        self.write(tenant.len() + 16, move |t, wtxn| {
            match class {
                Some(c) => t.compute_prefs.put(wtxn, &tenant, c.as_bytes())?,
                None => {
                    t.compute_prefs.delete(wtxn, &tenant)?;
                }
            }
            Ok(())
        })
    }

    /// Every tenant's default compute class, as stored.
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn compute_prefs(&self) -> Result<Vec<(String, String)>, StoreError> {
        let rtxn = self.env.read_txn()?;
        let mut out = Vec::new();
        for item in self.compute_prefs.iter(&rtxn)? {
            let (tenant, bytes) = item?;
            out.push((
                tenant.to_string(),
                String::from_utf8_lossy(bytes).into_owned(),
            ));
        }
        Ok(out)
    }

    /// What was spent under each of `keys` ([`periods`]).
    ///
    /// # Errors
    /// [`StoreError`] on LMDB errors.
    pub fn spend(&self, keys: &[Vec<u8>]) -> Result<Vec<i128>, StoreError> {
        let rtxn = self.env.read_txn()?;
        keys.iter()
            .map(|k| {
                Ok(self
                    .spend
                    .get(&rtxn, k)?
                    .and_then(|b| <[u8; 16]>::try_from(b).ok())
                    .map_or(0, i128::from_le_bytes))
            })
            .collect()
    }
}

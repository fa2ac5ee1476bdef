//! The only way a write changes a table: [`Table::put`] and [`Table::delete`] on a
//! [`WriteTxn`], which apply the change to LMDB and append it to the batch's log record
//! (see [`super::wal`]). A write is given a `WriteTxn`, never heed's `RwTxn`, so a change
//! that bypasses the log does not compile: the log can be replayed onto the last
//! checkpoint and give exactly what the writes did.
//!
//! A record is a sequence of changes, each `kind u8` (1 put, 2 delete), the table's
//! name (`len u8`, bytes), the key (`len u32 LE`, bytes) and, for a put, the value
//! (`len u32 LE`, bytes).

use heed::types::Bytes;
use heed::{BytesEncode, Database, RoTxn, RwTxn, WithoutTls};

/// A change's kind in a log record.
pub(crate) const PUT: u8 = 1;
/// A delete in a log record.
pub(crate) const DEL: u8 = 2;

/// A named LMDB database whose writes are logged. Reads go through `Deref` to heed's
/// `Database`, unchanged.
pub struct Table<KC, DC> {
    db: Database<KC, DC>,
    name: &'static str,
}

impl<KC, DC> Table<KC, DC> {
    /// `db`, opened under `name` (what the log records and replay opens again).
    pub(crate) fn new(db: Database<KC, DC>, name: &'static str) -> Table<KC, DC> {
        Table { db, name }
    }
}

impl<KC, DC> std::ops::Deref for Table<KC, DC> {
    type Target = Database<KC, DC>;
    fn deref(&self) -> &Database<KC, DC> {
        &self.db
    }
}

/// A write's view of its (nested) transaction: reads through `Deref`, changes through
/// [`Table`] only, each recorded.
pub struct WriteTxn<'t, 'p> {
    txn: &'t mut RwTxn<'p>,
    log: &'t mut Vec<u8>,
}

impl<'t, 'p> WriteTxn<'t, 'p> {
    /// Wraps `txn`; its changes are appended to `log`.
    pub(crate) fn new(txn: &'t mut RwTxn<'p>, log: &'t mut Vec<u8>) -> WriteTxn<'t, 'p> {
        WriteTxn { txn, log }
    }
}

impl<'p> std::ops::Deref for WriteTxn<'_, 'p> {
    type Target = RoTxn<'p, WithoutTls>;
    fn deref(&self) -> &RoTxn<'p, WithoutTls> {
        self.txn
    }
}

fn encode<'a, C: BytesEncode<'a>>(item: &'a C::EItem) -> heed::Result<std::borrow::Cow<'a, [u8]>> {
    C::bytes_encode(item).map_err(heed::Error::Encoding)
}

fn push_len(log: &mut Vec<u8>, n: usize) -> heed::Result<()> {
    let n = u32::try_from(n).map_err(|_| heed::Error::Mdb(heed::MdbError::BadValSize))?;
    log.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

impl<KC, DC> Table<KC, DC> {
    fn raw(&self) -> Database<Bytes, Bytes> {
        self.db.remap_types::<Bytes, Bytes>()
    }

    fn record(
        &self,
        log: &mut Vec<u8>,
        kind: u8,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> heed::Result<()> {
        log.push(kind);
        log.push(self.name.len() as u8);
        log.extend_from_slice(self.name.as_bytes());
        push_len(log, key.len())?;
        log.extend_from_slice(key);
        if let Some(v) = value {
            push_len(log, v.len())?;
            log.extend_from_slice(v);
        }
        Ok(())
    }

    /// Puts `key` → `value`, and records it.
    ///
    /// # Errors
    /// What LMDB or the codecs refuse; nothing is recorded then.
    pub fn put<'a>(
        &self,
        txn: &mut WriteTxn<'_, '_>,
        key: &'a KC::EItem,
        value: &'a DC::EItem,
    ) -> heed::Result<()>
    where
        KC: BytesEncode<'a>,
        DC: BytesEncode<'a>,
    {
        let (k, v) = (encode::<KC>(key)?, encode::<DC>(value)?);
        let mark = txn.log.len();
        self.record(txn.log, PUT, &k, Some(&v))?;
        self.raw()
            .put(txn.txn, &k, &v)
            .inspect_err(|_| txn.log.truncate(mark))
    }

    /// Deletes `key`, and records it; whether it was there.
    ///
    /// # Errors
    /// What LMDB or the key's codec refuse; nothing is recorded then.
    pub fn delete<'a>(&self, txn: &mut WriteTxn<'_, '_>, key: &'a KC::EItem) -> heed::Result<bool>
    where
        KC: BytesEncode<'a>,
    {
        let k = encode::<KC>(key)?;
        let existed = self.raw().delete(txn.txn, &k)?;
        if existed {
            self.record(txn.log, DEL, &k, None)?;
        }
        Ok(existed)
    }
}

fn take<'a>(p: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    (p.len() >= n).then(|| {
        let (a, b) = p.split_at(n);
        *p = b;
        a
    })
}

fn take_len<'a>(p: &mut &'a [u8]) -> Option<&'a [u8]> {
    let n = u32::from_le_bytes(take(p, 4)?.try_into().ok()?) as usize;
    take(p, n)
}

/// Applies the logged batches after transaction `after` (`(txnid, record)` each, in
/// order) in `wtxn`: what recovery does after putting LMDB back to that checkpoint.
///
/// # Errors
/// LMDB's, or a record that passed its CRC and still does not parse (a bug: the daemon
/// then refuses to start rather than guess).
pub(crate) fn replay(
    env: &heed::Env<WithoutTls>,
    wtxn: &mut RwTxn<'_>,
    after: u64,
    records: &[super::wal::Record],
) -> heed::Result<()> {
    let bad = || {
        heed::Error::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the write-ahead log holds a record that does not parse",
        ))
    };
    let mut dbs: std::collections::HashMap<Vec<u8>, Database<Bytes, Bytes>> =
        std::collections::HashMap::new();
    for (_, rec) in records.iter().filter(|(id, _)| *id > after) {
        let mut p = &rec[..];
        while let Some(kind) = take(&mut p, 1) {
            let name_len = take(&mut p, 1).ok_or_else(bad)?[0] as usize;
            let name = take(&mut p, name_len).ok_or_else(bad)?;
            let key = take_len(&mut p).ok_or_else(bad)?;
            let db = match dbs.get(name) {
                Some(db) => *db,
                None => {
                    let n = std::str::from_utf8(name).map_err(|_| bad())?;
                    let db = env.create_database::<Bytes, Bytes>(wtxn, Some(n))?;
                    dbs.insert(name.to_vec(), db);
                    db
                }
            };
            match kind[0] {
                PUT => db.put(wtxn, key, take_len(&mut p).ok_or_else(bad)?)?,
                DEL => {
                    db.delete(wtxn, key)?;
                }
                _ => return Err(bad()),
            }
        }
    }
    Ok(())
}

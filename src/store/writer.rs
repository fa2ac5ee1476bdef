//! The one writer: every durable write of the daemon goes through this thread, and the
//! writes that queue up while a batch is being made durable share the next one (group
//! commit, as Redis's `appendfsync always` does once per event-loop pass).
//!
//! A write is a closure run on the writer thread inside a nested transaction of the
//! batch's transaction, through a [`WriteTxn`] that records its changes, so a write that
//! returns `Err` undoes only its own changes (and its record). After the last write of a
//! batch its changes are appended to the write-ahead log and synced ([`super::wal`]),
//! then the batch commits to LMDB without a sync (so readers see only durable writes);
//! only then does each write's `then` run: with the write's own result, or with the
//! failure for a write that had succeeded (the batch could not begin, or no checkpoint
//! could make room in the log: then nothing of it happened). So an answer still means
//! "durable"; a failed sync stops the daemon instead of answering. Writes apply in the order they were queued; a
//! connection (and a worker) queues its next write only after its previous one
//! answered, so order per connection and per key is kept.
//!
//! Checkpoints: every [`CHECKPOINT_EVERY`] while records come in, the writer begins one
//! (the next log's header, a pin on the last commit; no flush) and the sync thread
//! syncs LMDB's data file and confirms it; the old pin goes when it is confirmed.
//!
//! `then` runs on the writer thread: it hands the result on (a channel, the reactor's
//! mailbox) and never waits or writes itself.
//!
//! Bounds: at most [`MAX_QUEUED`] writes wait (beyond it the non-blocking submit fails
//! and the caller answers 503); a batch takes at most [`MAX_BATCH`] writes and about
//! [`MAX_BATCH_WEIGHT`] bytes of values, far inside what one LMDB transaction may dirty.

use super::table::WriteTxn;
use super::wal::{Confirm, Wal};
use super::{StoreError, Tables};
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use heed::{RoTxn, WithoutTls};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Writes that may wait for the writer.
pub const MAX_QUEUED: usize = 4096;
/// Writes in one commit at most.
pub const MAX_BATCH: usize = 1024;
/// Value bytes in one commit, about (a single write may be larger): well inside one
/// log file (`wal::CAPACITY`), so a batch of large values does not force a checkpoint
/// (an fsync of the data file) and a log twice its size on every turn.
pub const MAX_BATCH_WEIGHT: usize = 8 << 20;

/// How long after a checkpoint began the next one is due, while there are records
/// (the daemon's; tests may choose another).
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(5);
/// A checkpoint begins once the log holds this many bytes of records, whenever due.
const CHECKPOINT_BYTES: u64 = 8 << 20;
/// How long the idle writer waits when no checkpoint is due (any write wakes it).
const IDLE: Duration = Duration::from_secs(3600);

/// Why a write did not become durable although it succeeded on its own.
#[derive(Debug, Clone)]
pub struct WriteFailed(pub String);

/// How a write refused for want of disk begins its reason.
const DISK_FULL: &str = "the disk holding the state store is full";

/// Free bytes the state store's disk keeps beside what a batch needs: LMDB's commit
/// writes the pages a batch dirtied (and may grow its file) after the batch is in the
/// log, where a failure can only stop the daemon; so a batch that might not fit is
/// refused before.
const DISK_RESERVE: u64 = 64 << 20;

impl WriteFailed {
    /// Whether the write was refused because the state store's disk is (nearly) full.
    pub fn disk_full(&self) -> bool {
        self.0.starts_with(DISK_FULL)
    }
}

/// One queued write, its closure and result erased.
pub(crate) trait Write: Send {
    /// Runs the write in `txn`; whether to keep its changes.
    fn apply(&mut self, t: &Tables, txn: &mut WriteTxn<'_, '_>) -> bool;
    /// Records a failure of the machinery around it (nested begin or merge).
    fn fail(&mut self, why: WriteFailed);
    /// Delivers the result; `failed` is the batch's commit failure, if any.
    fn finish(self: Box<Self>, failed: Option<&WriteFailed>);
    /// Delivers `e` without ever running the write.
    fn refuse(self: Box<Self>, e: StoreError);
}

struct Op<F, T, R, E> {
    f: Option<F>,
    then: T,
    result: Option<Result<R, E>>,
}

impl<F, T, R, E> Write for Op<F, T, R, E>
where
    F: FnOnce(&Tables, &mut WriteTxn<'_, '_>) -> Result<R, E> + Send,
    T: FnOnce(Result<R, E>) + Send,
    R: Send,
    E: From<StoreError> + Send,
{
    fn apply(&mut self, t: &Tables, txn: &mut WriteTxn<'_, '_>) -> bool {
        let Some(f) = self.f.take() else {
            return false;
        };
        let r = f(t, txn);
        let keep = r.is_ok();
        self.result = Some(r);
        keep
    }

    fn fail(&mut self, why: WriteFailed) {
        self.f = None;
        self.result = Some(Err(E::from(StoreError::Write(why))));
    }

    fn finish(self: Box<Self>, failed: Option<&WriteFailed>) {
        let r = match (self.result, failed) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), None) => Ok(v),
            (_, Some(why)) => Err(E::from(StoreError::Write(why.clone()))),
            (None, None) => Err(E::from(StoreError::Write(WriteFailed(
                "the write was never applied".into(),
            )))),
        };
        (self.then)(r);
    }

    fn refuse(self: Box<Self>, e: StoreError) {
        (self.then)(Err(E::from(e)));
    }
}

/// A write with the bytes it adds (for the batch bound).
pub(crate) struct Queued {
    weight: usize,
    write: Box<dyn Write>,
}

impl Queued {
    pub(crate) fn new<F, T, R, E>(weight: usize, f: F, then: T) -> Queued
    where
        F: FnOnce(&Tables, &mut WriteTxn<'_, '_>) -> Result<R, E> + Send + 'static,
        T: FnOnce(Result<R, E>) + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        Queued {
            weight,
            write: Box::new(Op {
                f: Some(f),
                then,
                result: None,
            }),
        }
    }
}

impl Queued {
    /// Answers the write with `e` without running it.
    pub(crate) fn refuse(self, e: StoreError) {
        self.write.refuse(e);
    }
}

/// Counters of the writer, for `/healthz` and the tests.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Batches committed (one sync each).
    pub commits: AtomicU64,
    /// Writes that went into them.
    pub writes: AtomicU64,
    /// The largest batch so far.
    pub max_batch: AtomicU64,
    /// Checkpoints completed (LMDB's data file synced, the log started afresh).
    pub checkpoints: AtomicU64,
}

/// The writer thread's handle.
pub(crate) struct Writer {
    tx: Option<Sender<Queued>>,
    thread: Option<JoinHandle<()>>,
    pub(crate) stats: Arc<WriterStats>,
}

impl Writer {
    /// Starts the thread over `tables`, logging to `wal`, with `pin` the read
    /// transaction on the log's checkpoint and checkpoints `every` so long apart;
    /// `hold_confirms` (tests): the sync thread leaves every confirmation to the writer,
    /// which runs it only when it needs one (an oversized batch, the close).
    pub(crate) fn start(
        tables: Arc<Tables>,
        wal: Wal,
        pin: RoTxn<'static, WithoutTls>,
        every: Duration,
        hold_confirms: bool,
    ) -> std::io::Result<Writer> {
        let (tx, rx) = bounded::<Queued>(MAX_QUEUED);
        let stats = Arc::new(WriterStats::default());
        let st = Arc::clone(&stats);
        let (sync_tx, sync_rx) = bounded::<Confirm>(1);
        let (done_tx, done_rx) = bounded::<(Confirm, Option<std::io::Result<()>>)>(1);
        let syncer = std::thread::Builder::new()
            .name("isobox-sync".into())
            .spawn(move || {
                while let Ok(c) = sync_rx.recv() {
                    // Tests: the confirmation is handed back not run (as if the
                    // power went before it), until the writer runs it itself.
                    let r = (!hold_confirms).then(|| c.run());
                    if done_tx.send((c, r)).is_err() {
                        return;
                    }
                }
            })?;
        let thread = std::thread::Builder::new()
            .name("isobox-writer".into())
            .spawn(move || {
                let mut d = Durable {
                    wal,
                    pin,
                    pending: None,
                    last: Instant::now(),
                    every,
                    stats: Arc::clone(&st),
                    sync_tx,
                    done_rx,
                };
                run(&tables, &rx, &st, &mut d);
                d.shut(&tables);
                drop(d);
                let _ = syncer.join();
            })?;
        Ok(Writer {
            tx: Some(tx),
            thread: Some(thread),
            stats,
        })
    }

    /// Queues without waiting; gives the write back when the queue is full.
    pub(crate) fn try_submit(&self, q: Queued) -> Result<(), Queued> {
        match &self.tx {
            Some(tx) => tx.try_send(q).map_err(|e| match e {
                TrySendError::Full(q) | TrySendError::Disconnected(q) => q,
            }),
            None => Err(q),
        }
    }

    /// Queues, waiting for room (worker threads only, never the reactor).
    pub(crate) fn submit(&self, q: Queued) -> Result<(), Queued> {
        match &self.tx {
            Some(tx) => tx.send(q).map_err(|e| e.0),
            None => Err(q),
        }
    }
}

impl Drop for Writer {
    /// Lets the thread finish every queued write and close the log cleanly, then
    /// waits for it.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A checkpoint begun and not yet confirmed.
struct Pending {
    /// The read transaction on its commit.
    pin: RoTxn<'static, WithoutTls>,
    /// Its confirmation when it is not on the sync thread (held back, in tests).
    held: Option<Confirm>,
}

/// The log and its checkpoints, owned by the writer thread.
struct Durable {
    wal: Wal,
    /// A read transaction on the confirmed checkpoint: LMDB reuses none of its pages.
    pin: RoTxn<'static, WithoutTls>,
    pending: Option<Pending>,
    /// When the last checkpoint began.
    last: Instant,
    /// How long after it the next is due, while there are records.
    every: Duration,
    stats: Arc<WriterStats>,
    sync_tx: Sender<Confirm>,
    done_rx: Receiver<(Confirm, Option<std::io::Result<()>>)>,
}

/// A sync of the log or of LMDB's data file failed. After a failed `fsync` Linux may
/// have dropped the pages it could not write and reports the error once: a retry can
/// succeed with the data lost, so nothing written since can be vouched for. Like
/// PostgreSQL (`data_sync_retry = off`) and Redis (`appendfsync always`), the daemon
/// stops here, answering nothing more; the next start recovers from what is on disk
/// (the last confirmed checkpoint and the log), and the writes in flight, never
/// answered, may or may not be there.
fn fatal(what: &str, e: &std::io::Error) -> ! {
    log::error!(
        "store: {what} failed: {e}; stopping the daemon (a restart recovers from the disk)"
    );
    eprintln!("isoboxd: store: {what} failed: {e}; stopping");
    std::process::abort();
}

impl Durable {
    /// When the next checkpoint is due: none pending and records logged.
    fn due(&self) -> Option<Instant> {
        (self.pending.is_none() && self.wal.used() > 0).then(|| self.last + self.every)
    }

    /// Begins a checkpoint at LMDB's last commit (see [`Wal::begin`]), pinned; returns
    /// its confirmation, which the caller runs or hands to the sync thread. An error
    /// leaves the log as it was (a header begun in the retired file is not used).
    fn start(&mut self, t: &Tables, clean: bool) -> Result<Confirm, String> {
        let pin = t
            .env
            .clone()
            .static_read_txn()
            .map_err(|e| format!("lmdb read transaction: {e}"))?;
        let metas = self
            .wal
            .metas()
            .map_err(|e| format!("reading LMDB's meta pages: {e}"))?;
        let c = self
            .wal
            .begin(pin.id() as u64, &metas, clean)
            .map_err(|e| format!("writing the write-ahead log's header: {e}"))?;
        self.pending = Some(Pending { pin, held: None });
        self.last = Instant::now();
        Ok(c)
    }

    /// Begins a checkpoint, confirmed on the sync thread.
    fn begin(&mut self, t: &Tables) {
        match self.start(t, false) {
            Ok(c) => {
                if let Err(e) = self.sync_tx.send(c) {
                    if let Some(p) = &mut self.pending {
                        p.held = Some(e.0);
                    }
                }
            }
            Err(e) => log::error!("store: checkpoint: {e}"),
        }
    }

    /// The sync thread's answer for the pending checkpoint.
    fn end(&mut self, c: Confirm, r: Option<std::io::Result<()>>) {
        match r {
            Some(Ok(())) => self.confirmed(),
            Some(Err(e)) => fatal("a checkpoint's sync", &e),
            None => {
                if let Some(p) = &mut self.pending {
                    p.held = Some(c);
                }
            }
        }
    }

    /// The pending checkpoint is confirmed: the old pin goes.
    fn confirmed(&mut self) {
        if let Some(p) = self.pending.take() {
            self.pin = p.pin;
            self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The pending checkpoint confirmed, here, waiting for the sync thread if it has it.
    fn settle(&mut self) {
        let Some(p) = &mut self.pending else {
            return;
        };
        let c = match p.held.take() {
            Some(c) => c,
            None => match self.done_rx.recv() {
                Ok((_, Some(Ok(())))) => return self.confirmed(),
                Ok((_, Some(Err(e)))) => fatal("a checkpoint's sync", &e),
                Ok((c, None)) => c,
                Err(_) => fatal("the sync thread", &std::io::Error::other("it is gone")),
            },
        };
        if let Err(e) = c.run() {
            fatal("a checkpoint's sync", &e);
        }
        self.confirmed();
    }

    /// A whole checkpoint here, at LMDB's last commit (after the pending one, if any):
    /// everything committed is durable and the log empty when it returns `Ok`.
    fn now(&mut self, t: &Tables, clean: bool) -> Result<(), String> {
        self.settle();
        let c = self.start(t, clean)?;
        if let Some(p) = &mut self.pending {
            p.held = Some(c);
        }
        self.settle();
        Ok(())
    }

    /// Makes the changes `rec` of the batch about to commit as `txnid` durable, before
    /// the commit makes them visible. When the log has no room left for them, a
    /// checkpoint at the last commit first empties it (the log grows past its usual
    /// size for a record larger than a whole file).
    fn log(&mut self, t: &Tables, txnid: u64, rec: &[u8]) -> Result<(), WriteFailed> {
        let need = DISK_RESERVE.saturating_add(4 * rec.len() as u64);
        match self.wal.free_bytes() {
            Ok(free) if free < need => {
                crate::error_limited!("store: {DISK_FULL}: {free} bytes free, a batch needs {need}; writes are refused");
                return Err(WriteFailed(format!(
                    "{DISK_FULL} ({free} bytes free; a write needs {need}): nothing was written"
                )));
            }
            Ok(_) => {}
            Err(e) => log::warn!("store: the disk's free space is unknown: {e}"),
        }
        if self.wal.used() > 0 && !self.wal.fits(rec.len()) {
            self.now(t, false)
                .map_err(|e| WriteFailed(format!("the state store could not checkpoint: {e}")))?;
        }
        // Room for the record first (zeroed and synced ahead): failing here leaves the
        // log as it was, so the batch fails and the daemon goes on.
        if let Err(e) = self.wal.reserve(rec.len()) {
            return Err(WriteFailed(if e.raw_os_error() == Some(libc::ENOSPC) {
                format!("{DISK_FULL}: growing the write-ahead log: {e}")
            } else {
                format!("growing the write-ahead log: {e}")
            }));
        }
        if let Err(e) = self.wal.append(txnid, rec) {
            fatal("appending to the write-ahead log", &e);
        }
        Ok(())
    }

    /// After the last write: the pending checkpoint, then a clean one.
    fn shut(&mut self, t: &Tables) {
        if let Err(e) = self.now(t, true) {
            log::error!("store: the closing checkpoint: {e}");
        }
    }
}

fn run(t: &Tables, rx: &Receiver<Queued>, stats: &WriterStats, d: &mut Durable) {
    let mut carry: Option<Queued> = None;
    let mut batch: Vec<Box<dyn Write>> = Vec::with_capacity(64);
    let mut log: Vec<u8> = Vec::with_capacity(64 << 10);
    loop {
        let first = match carry.take() {
            Some(q) => q,
            None => loop {
                let wait = d
                    .due()
                    .map_or(IDLE, |at| at.saturating_duration_since(Instant::now()));
                crossbeam_channel::select! {
                    recv(rx) -> m => match m {
                        Ok(q) => break q,
                        Err(_) => return,
                    },
                    recv(d.done_rx) -> r => match r {
                        Ok((c, r)) => d.end(c, r),
                        Err(_) => fatal("the sync thread", &std::io::Error::other("it is gone")),
                    },
                    default(wait) => {
                        if d.due().is_some_and(|at| at <= Instant::now()) {
                            d.begin(t);
                        }
                    },
                }
            },
        };
        let mut weight = first.weight;
        let mut queued = vec![first];
        while queued.len() < MAX_BATCH && weight < MAX_BATCH_WEIGHT {
            match rx.try_recv() {
                Ok(q) if weight + q.weight > MAX_BATCH_WEIGHT => {
                    carry = Some(q);
                    break;
                }
                Ok(q) => {
                    weight += q.weight;
                    queued.push(q);
                }
                Err(_) => break,
            }
        }
        batch.extend(queued.into_iter().map(|q| q.write));
        log.clear();
        let failed = commit_batch(t, &mut batch, &mut log, d).err();
        if log.capacity() > 1 << 20 {
            log = Vec::with_capacity(64 << 10);
        }
        stats.commits.fetch_add(1, Ordering::Relaxed);
        stats
            .writes
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        stats
            .max_batch
            .fetch_max(batch.len() as u64, Ordering::Relaxed);
        if let Some(why) = &failed {
            log::error!(
                "store: a commit of {} writes failed: {}",
                batch.len(),
                why.0
            );
        }
        // One wake of the loop that takes the answers, not one per write.
        crate::reactor::wake::hold(|| {
            for w in batch.drain(..) {
                w.finish(failed.as_ref());
            }
        });
        if let Ok((c, r)) = d.done_rx.try_recv() {
            d.end(c, r);
        }
        if d.due()
            .is_some_and(|at| at <= Instant::now() || d.wal.used() >= CHECKPOINT_BYTES)
        {
            d.begin(t);
        }
    }
}

/// Applies every write of `batch` in one transaction, makes the changes of the writes
/// that kept theirs (`log`) durable in the write-ahead log, then commits to LMDB
/// without a sync: readers see a batch only once it is durable. `Err`: nothing of the
/// batch happened.
fn commit_batch(
    t: &Tables,
    batch: &mut [Box<dyn Write>],
    log: &mut Vec<u8>,
    d: &mut Durable,
) -> Result<(), WriteFailed> {
    let mut txn = t
        .env
        .write_txn()
        .map_err(|e| WriteFailed(format!("lmdb write transaction: {e}")))?;
    let txnid = txn.id() as u64;
    for w in batch.iter_mut() {
        let mut child = match t.env.nested_write_txn(&mut txn) {
            Ok(c) => c,
            Err(e) => {
                w.fail(WriteFailed(format!("lmdb nested transaction: {e}")));
                continue;
            }
        };
        let mark = log.len();
        if w.apply(t, &mut WriteTxn::new(&mut child, log)) {
            if let Err(e) = child.commit() {
                log.truncate(mark);
                w.fail(WriteFailed(format!("lmdb nested commit: {e}")));
            }
        } else {
            log.truncate(mark);
            child.abort();
        }
    }
    if log.is_empty() {
        // Nothing changed: nothing to make durable or visible.
        txn.abort();
        return Ok(());
    }
    // Dropping `txn` on an error here aborts it.
    d.log(t, txnid, log)?;
    if let Err(e) = txn.commit() {
        // Its changes are in the log: a restart would apply what this answer calls
        // failed, and LMDB's state in memory is no longer known.
        fatal(
            "an LMDB commit after its changes were logged",
            &std::io::Error::other(e.to_string()),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::kv::{KvError, Precondition};
    use super::super::Store;
    use super::*;
    use crossbeam_channel::{unbounded, Receiver};
    use std::path::PathBuf;

    struct Temp {
        store: Option<Store>,
        dir: PathBuf,
    }

    impl Drop for Temp {
        fn drop(&mut self) {
            self.store.take();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn open(name: &str) -> Temp {
        let dir =
            std::env::temp_dir().join(format!("isobox-writer-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Temp {
            store: Some(Store::open(&dir).unwrap()),
            dir,
        }
    }

    /// Queues a write that holds the writer until `go` is sent; returns once the
    /// writer is inside it (so everything queued next waits for the following commit).
    fn hold_writer(s: &Store) -> crossbeam_channel::Sender<()> {
        let (entered_tx, entered) = unbounded::<()>();
        let (go, go_rx) = unbounded::<()>();
        s.write_then(
            0,
            move |_t: &Tables, _txn: &mut WriteTxn<'_, '_>| -> Result<(), StoreError> {
                entered_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Ok(())
            },
            |r| r.unwrap(),
        );
        entered.recv().unwrap();
        go
    }

    fn put_then(
        s: &Store,
        key: &str,
        value: &str,
        cond: Precondition,
        done: &crossbeam_channel::Sender<(String, Result<String, KvError>)>,
    ) {
        let (done, k) = (done.clone(), key.to_string());
        s.kv_put_then(
            "public",
            "w",
            key,
            value.as_bytes().to_vec(),
            None,
            cond,
            1_000,
            move |r| {
                let _ = done.send((k, r.map(|p| p.etag)));
            },
        );
    }

    fn collect(
        rx: &Receiver<(String, Result<String, KvError>)>,
        n: usize,
    ) -> Vec<(String, Result<String, KvError>)> {
        (0..n).map(|_| rx.recv().unwrap()).collect()
    }

    #[test]
    fn test_writes_queued_during_a_commit_share_the_next_one_and_keep_their_order() {
        let t = open("group");
        let s = t.store.as_ref().unwrap();
        let (done, rx) = unbounded();
        let go = hold_writer(s);
        for i in 0..48 {
            put_then(
                s,
                &format!("k{i}"),
                &format!("v{i}"),
                Precondition::None,
                &done,
            );
        }
        // The same key twice in one batch: the later write wins, with the later ETag.
        put_then(s, "same", "first", Precondition::None, &done);
        put_then(s, "same", "second", Precondition::None, &done);
        go.send(()).unwrap();
        let got = collect(&rx, 50);
        // Answers come in queue order, each with a strictly larger version.
        let etags: Vec<String> = got
            .iter()
            .map(|(_, r)| r.as_ref().unwrap().clone())
            .collect();
        let mut sorted = etags.clone();
        sorted.sort();
        assert_eq!(etags, sorted);
        assert_eq!(got[48].0, "same");
        let e = s.kv_get("public", "w", "same", 1_000).unwrap().unwrap();
        assert_eq!(
            (e.value.as_slice(), e.etag.as_str()),
            (&b"second"[..], etags[49].as_str())
        );
        for i in 0..48 {
            let e = s
                .kv_get("public", "w", &format!("k{i}"), 1_000)
                .unwrap()
                .unwrap();
            assert_eq!(e.value, format!("v{i}").as_bytes());
        }
        // The holder's commit, then one commit for the 50 writes queued behind it.
        assert_eq!(s.writer_stats(), (2, 51, 50));
    }

    #[test]
    fn test_a_refused_write_is_undone_alone() {
        let t = open("undo");
        let s = t.store.as_ref().unwrap();
        let (done, rx) = unbounded();
        let go = hold_writer(s);
        put_then(s, "a", "1", Precondition::None, &done);
        // Writes something, then fails: none of it may stay.
        let (fail_tx, fail_rx) = unbounded();
        s.write_then(
            0,
            |t: &Tables, txn: &mut WriteTxn<'_, '_>| -> Result<(), StoreError> {
                t.meta.put(txn, "half-done", b"x")?;
                Err(StoreError::Busy)
            },
            move |r| fail_tx.send(r.is_err()).unwrap(),
        );
        // A precondition that cannot hold: refused, nothing written.
        put_then(
            s,
            "b",
            "2",
            Precondition::IfMatch(vec!["\"0000000000000063\"".into()]),
            &done,
        );
        put_then(s, "c", "3", Precondition::None, &done);
        go.send(()).unwrap();
        let got = collect(&rx, 3);
        assert!(fail_rx.recv().unwrap());
        assert!(got[0].1.is_ok() && got[2].1.is_ok());
        assert!(matches!(got[1].1, Err(KvError::PreconditionFailed)));
        let rtxn = s.env.read_txn().unwrap();
        assert!(s.meta.get(&rtxn, "half-done").unwrap().is_none());
        drop(rtxn);
        assert!(s.kv_get("public", "w", "b", 1_000).unwrap().is_none());
        assert_eq!(
            s.kv_get("public", "w", "c", 1_000).unwrap().unwrap().value,
            b"3"
        );
        // The quota's usage record counts exactly a and c.
        assert_eq!(s.kv_usage("public").unwrap(), (4, 2));
        assert_eq!(s.writer_stats().0, 2);
    }

    #[test]
    fn test_a_full_queue_refuses_at_once_and_loses_nothing_queued() {
        let t = open("full");
        let s = t.store.as_ref().unwrap();
        let (done, rx) = unbounded();
        let go = hold_writer(s);
        for i in 0..MAX_QUEUED {
            put_then(s, &format!("q{i}"), "v", Precondition::None, &done);
        }
        // At the bound: refused on this thread, before anything else answers.
        put_then(s, "over", "v", Precondition::None, &done);
        let (k, r) = rx.try_recv().unwrap();
        assert_eq!(k, "over");
        assert!(matches!(r, Err(KvError::Store(StoreError::Busy))));
        go.send(()).unwrap();
        let got = collect(&rx, MAX_QUEUED);
        assert!(got.iter().all(|(_, r)| r.is_ok()));
        assert_eq!(s.kv_usage("public").unwrap().1, MAX_QUEUED as u64);
        // 4096 writes behind the holder: at most MAX_BATCH per commit.
        let (commits, writes, largest) = s.writer_stats();
        assert_eq!((writes, largest), (MAX_QUEUED as u64 + 1, MAX_BATCH as u64));
        assert_eq!(commits, 1 + (MAX_QUEUED / MAX_BATCH) as u64);
        // Below the bound again once drained.
        put_then(s, "after", "v", Precondition::None, &done);
        assert!(rx.recv().unwrap().1.is_ok());
    }

    #[test]
    fn test_blocking_writes_from_many_threads_all_land() {
        let t = open("threads");
        let s = t.store.as_ref().unwrap();
        std::thread::scope(|sc| {
            for th in 0..8 {
                sc.spawn(move || {
                    for i in 0..50 {
                        s.kv_put(
                            "public",
                            "w",
                            &format!("t{th}-{i}"),
                            b"x",
                            None,
                            Precondition::None,
                            1_000,
                        )
                        .unwrap();
                    }
                });
            }
        });
        assert_eq!(s.kv_usage("public").unwrap().1, 400);
        assert_eq!(s.writer_stats().1, 400);
    }
}

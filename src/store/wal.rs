//! The write-ahead log that makes a batch durable with one small flush.
//!
//! LMDB makes a commit durable with two flushes of every page the commit dirtied (its
//! data pages, then its meta page): for a batch of a few 100-byte KV writes that is ~15
//! scattered pages and 3–4× the time of one flush of a ~2 KiB append. So the writer
//! makes each batch durable by appending its changes (recorded by [`super::table`]) to
//! this log and `fdatasync`ing the log, then commits it to LMDB *without* syncing: a
//! batch is visible to readers only once it is durable, and answered after that. Every
//! few milliseconds while writes come in (and whenever the log fills) a checkpoint syncs
//! LMDB's data file in the background and starts the log afresh.
//!
//! A failed sync (of the log or of LMDB's data file) stops the daemon: after a failed
//! `fsync` Linux may have dropped the pages it could not write and reports it once, so
//! a retry proves nothing (PostgreSQL's and Redis's rule too). The next start recovers
//! from what is on disk.
//!
//! Why this survives a power loss and not only a process crash: LMDB without syncs may
//! have its meta page reach the disk before the pages it points to. So the log's header
//! holds a copy of LMDB's two meta pages as they were at the last checkpoint `C`, whose
//! pages are all on disk (synced), and the writer keeps a read transaction open on `C`
//! until the next checkpoint's header is durable, so LMDB never reuses (overwrites) a
//! page of `C`'s tree. Recovery writes those meta pages back (LMDB is then exactly at
//! `C`, whatever else reached the disk) and replays the log's records after `C`: every
//! batch that was answered. A record torn by the crash fails its CRC and ends the log;
//! its batch was never answered.
//!
//! Two files, `wal-0` and `wal-1`, take turns, and a checkpoint costs the writer no
//! flush: it writes the other file's header (its generation one higher, the meta pages
//! of LMDB's last commit `K`, a read transaction pinning `K`) and appends from then on
//! to that file; the sync thread then syncs LMDB's data file, and only after that writes
//! the header's *confirmation* (synced). Until it is confirmed, a log depends on the one
//! before it: recovery restores the older log's meta pages and replays both. Once it is
//! confirmed, it stands alone: recovery restores its own meta pages (`K`, synced), the
//! old pin goes, and the older file may be reused by the next checkpoint (which begins
//! only then). The files grow, by zeroed chunks written and synced ahead of the records
//! (so a record's flush never has to update the file's size), to at most [`CAPACITY`]
//! each; when a batch's record does not fit in the room left, a checkpoint empties the
//! log first (and a record larger than a whole file grows it, for that turn).
//! Opening the store starts a new log with a fresh file renamed into place.
//!
//! Layout: a header of [`HEADER_LEN`] bytes (magic, version, flags, generation, the
//! checkpoint's transaction id, the meta pages' length, a CRC over all of it and the
//! meta pages), LMDB's two meta pages, the confirmation (magic, generation, transaction
//! id, CRC) on its own 4 KiB, then records: each a 32-byte head (magic, payload length,
//! generation, transaction id, CRC over the head's fields and the payload) and the
//! payload. A record or confirmation of another generation (left from the file's
//! previous turn) counts as absent.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Most bytes one log file grows to.
pub const CAPACITY: u64 = 32 << 20;
/// The log file grows by this much at a time (zeroed and synced ahead of records).
const CHUNK: u64 = 1 << 20;
/// Bytes of the header before the meta pages.
pub const HEADER_LEN: u64 = 4096;
const MAGIC: &[u8; 8] = b"ISOBXWAL";
const VERSION: u32 = 1;
const REC_MAGIC: u32 = 0x5741_4c52;
const REC_HEAD: u64 = 32;
/// The header's flag for "LMDB was synced and closed after it": nothing to restore.
const CLEAN: u32 = 1;

/// One logged batch: the LMDB transaction it committed as, and its changes.
pub(crate) type Record = (u64, Vec<u8>);

/// What a valid log file holds.
#[derive(Debug)]
pub(crate) struct Header {
    pub gen: u64,
    pub txnid: u64,
    pub clean: bool,
    /// LMDB's meta pages 0 and 1 at the checkpoint.
    pub metas: Vec<u8>,
}

fn header_bytes(gen: u64, txnid: u64, clean: bool, metas: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN as usize + metas.len());
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&(if clean { CLEAN } else { 0 }).to_le_bytes());
    h.extend_from_slice(&gen.to_le_bytes());
    h.extend_from_slice(&txnid.to_le_bytes());
    h.extend_from_slice(&(metas.len() as u32).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&h);
    crc.update(metas);
    h.extend_from_slice(&crc.finalize().to_le_bytes());
    h.resize(HEADER_LEN as usize, 0);
    h.extend_from_slice(metas);
    h
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// Reads `path`'s header; `None` when the file is missing, short or its header does not
/// check (never written whole).
fn read_header(f: &File) -> io::Result<Option<Header>> {
    let mut h = vec![0u8; HEADER_LEN as usize];
    if read_full_at(f, &mut h, 0)? < h.len() || &h[..8] != MAGIC || u32_at(&h, 8) != VERSION {
        return Ok(None);
    }
    let metas_len = u32_at(&h, 32) as usize;
    if metas_len == 0 || metas_len > 1 << 20 {
        return Ok(None);
    }
    let mut metas = vec![0u8; metas_len];
    if read_full_at(f, &mut metas, HEADER_LEN)? < metas_len {
        return Ok(None);
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&h[..36]);
    crc.update(&metas);
    if crc.finalize() != u32_at(&h, 36) {
        return Ok(None);
    }
    Ok(Some(Header {
        gen: u64_at(&h, 16),
        txnid: u64_at(&h, 24),
        clean: u32_at(&h, 12) & CLEAN != 0,
        metas,
    }))
}

fn read_full_at(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn confirm_at(metas_len: usize) -> u64 {
    (HEADER_LEN + metas_len as u64).div_ceil(4096) * 4096
}

fn records_start(metas_len: usize) -> u64 {
    confirm_at(metas_len) + 4096
}

const CONFIRM_MAGIC: &[u8; 8] = b"ISOBXOK1";

fn confirm_bytes(gen: u64, txnid: u64) -> [u8; 32] {
    let mut c = [0u8; 32];
    c[..8].copy_from_slice(CONFIRM_MAGIC);
    c[8..16].copy_from_slice(&gen.to_le_bytes());
    c[16..24].copy_from_slice(&txnid.to_le_bytes());
    let crc = crc32fast::hash(&c[..24]);
    c[24..28].copy_from_slice(&crc.to_le_bytes());
    c
}

/// Whether `h`'s confirmation is in `f`.
fn confirmed(f: &File, h: &Header) -> io::Result<bool> {
    let mut c = [0u8; 32];
    Ok(
        read_full_at(f, &mut c, confirm_at(h.metas.len()))? == c.len()
            && c == confirm_bytes(h.gen, h.txnid),
    )
}

fn record_head(gen: u64, txnid: u64, payload: &[u8]) -> [u8; REC_HEAD as usize] {
    let mut h = [0u8; REC_HEAD as usize];
    h[0..4].copy_from_slice(&REC_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[8..16].copy_from_slice(&gen.to_le_bytes());
    h[16..24].copy_from_slice(&txnid.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&h[..24]);
    crc.update(payload);
    h[24..28].copy_from_slice(&crc.finalize().to_le_bytes());
    h
}

/// The records of generation `gen` from `from` on, in order, until the first that is
/// missing, torn or of another generation: `(txnid, payload)` each, and where they end.
fn read_records(f: &File, gen: u64, from: u64, to: u64) -> io::Result<(Vec<Record>, u64)> {
    let mut out = Vec::new();
    let mut off = from;
    let mut head = [0u8; REC_HEAD as usize];
    while off + REC_HEAD <= to {
        if read_full_at(f, &mut head, off)? < head.len() || u32_at(&head, 0) != REC_MAGIC {
            break;
        }
        let len = u64::from(u32_at(&head, 4));
        if u64_at(&head, 8) != gen || off + REC_HEAD + len > to {
            break;
        }
        let mut payload = vec![0u8; len as usize];
        if read_full_at(f, &mut payload, off + REC_HEAD)? < payload.len() {
            break;
        }
        let txnid = u64_at(&head, 16);
        if record_head(gen, txnid, &payload) != head {
            break;
        }
        out.push((txnid, payload));
        off += REC_HEAD + len;
    }
    Ok((out, off))
}

/// Zeroes `f` from `from` up to at least `end` (a chunk at a time, at most to
/// [`CAPACITY`]), synced with its size, so that writing a record there changes no
/// metadata. Returns the new end.
fn zero_to(f: &File, from: u64, end: u64) -> io::Result<u64> {
    let to = end
        .div_ceil(CHUNK)
        .saturating_mul(CHUNK)
        .min(CAPACITY)
        .max(end);
    let zeros = vec![0u8; CHUNK as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(CHUNK) as usize;
        f.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    f.sync_all()?;
    Ok(to)
}

/// LMDB's two meta pages (pages 0 and 1 of `psize` bytes) as `data` holds them now.
fn read_metas(data: &File, psize: usize) -> io::Result<Vec<u8>> {
    let mut m = vec![0u8; 2 * psize];
    if read_full_at(data, &mut m, 0)? < m.len() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "data.mdb is shorter than its meta pages",
        ));
    }
    Ok(m)
}

fn log_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("wal-{i}"))
}

fn open_log(dir: &Path, i: usize) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(log_path(dir, i))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What recovery found, before LMDB is opened.
pub(crate) struct Recovered {
    /// The log's generation (0: there was none).
    pub gen: u64,
    /// Which file it is.
    pub cur: usize,
    /// The checkpoint LMDB was put back to (0: none).
    pub txnid: u64,
    /// The answered batches after it, to replay in order.
    pub records: Vec<Record>,
}

/// Reads the log in `dir` and, unless its header says LMDB was closed cleanly after it,
/// writes the meta pages of its base (its own if confirmed, else the log's before it)
/// back into `data.mdb`, synced: LMDB then opens exactly at that checkpoint, and the
/// records to replay are those of the base's log and, unconfirmed, the newer one's.
/// Call before opening the environment.
pub(crate) fn recover(dir: &Path) -> io::Result<Recovered> {
    let mut logs: Vec<(usize, Header, File)> = Vec::new();
    for i in 0..2 {
        if !log_path(dir, i).exists() {
            continue;
        }
        let f = open_log(dir, i)?;
        if let Some(h) = read_header(&f)? {
            logs.push((i, h, f));
        }
    }
    logs.sort_by_key(|l| std::cmp::Reverse(l.1.gen));
    let data = dir.join("data.mdb");
    let Some((cur, best, f)) = logs.first() else {
        return Ok(Recovered {
            gen: 0,
            cur: 1,
            txnid: 0,
            records: Vec::new(),
        });
    };
    let done = Recovered {
        gen: best.gen,
        cur: *cur,
        txnid: 0,
        records: Vec::new(),
    };
    let ok = confirmed(f, best)?;
    if ok && best.clean {
        return Ok(done);
    }
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the state store's write-ahead log cannot be recovered: {why} (move {} aside to start with an empty store)", dir.display()),
        )
    };
    if !data.exists() {
        return Err(bad("data.mdb is missing beside it"));
    }
    // A confirmed log stands alone; an unconfirmed one continues the confirmed one
    // before it, whose checkpoint is the base.
    let chain: Vec<&(usize, Header, File)> = if ok {
        vec![&logs[0]]
    } else {
        match logs.get(1) {
            Some(prev) if prev.1.gen + 1 == best.gen && confirmed(&prev.2, &prev.1)? => {
                vec![prev, &logs[0]]
            }
            _ => {
                return Err(bad(
                    "its last checkpoint was never confirmed and the log before it is gone",
                ))
            }
        }
    };
    let base = &chain[0].1;
    let mut records = Vec::new();
    for (_, h, f) in &chain {
        let len = f.metadata()?.len();
        records.extend(read_records(f, h.gen, records_start(h.metas.len()), len)?.0);
    }
    let d = OpenOptions::new().write(true).open(&data)?;
    d.write_all_at(&base.metas, 0)?;
    d.sync_data()?;
    log::info!(
        "store: recovering from the write-ahead log: back to transaction {}, {} batches to replay",
        base.txnid,
        records.len()
    );
    Ok(Recovered {
        gen: best.gen,
        cur: *cur,
        txnid: base.txnid,
        records,
    })
}

/// The second half of a checkpoint, for the sync thread: LMDB's data file synced, then
/// the new log's header, then its confirmation, synced.
pub(crate) struct Confirm {
    data: File,
    log: File,
    at: u64,
    bytes: [u8; 32],
}

impl Confirm {
    /// Does it. An error is final: a failed sync must not be retried (the writer stops
    /// the daemon).
    pub(crate) fn run(&self) -> io::Result<()> {
        self.data.sync_data()?;
        self.log.sync_data()?;
        self.log.write_all_at(&self.bytes, self.at)?;
        self.log.sync_data()
    }
}

/// The open log: the current file, where the next record goes, and LMDB's data file
/// (for its meta pages and its sync).
pub(crate) struct Wal {
    dir: PathBuf,
    file: File,
    cur: usize,
    gen: u64,
    /// Where the next record goes.
    off: u64,
    /// Bytes of the file known to be allocated and zeroed.
    zeroed: u64,
    data: File,
    psize: usize,
}

impl Wal {
    /// Starts a log after recovery (`r`), with LMDB synced at transaction `txnid` and
    /// `psize` its page size: a new file, confirmed, renamed over the one `r` did not
    /// use (which an unconfirmed log still depended on until then).
    pub(crate) fn start(dir: &Path, r: &Recovered, txnid: u64, psize: usize) -> io::Result<Wal> {
        let data = File::open(dir.join("data.mdb"))?;
        let m = read_metas(&data, psize)?;
        let (cur, gen) = (1 - r.cur, r.gen + 1);
        let mut buf = header_bytes(gen, txnid, false, &m);
        buf.resize(confirm_at(m.len()) as usize, 0);
        buf.extend_from_slice(&confirm_bytes(gen, txnid));
        buf.resize(records_start(m.len()) as usize, 0);
        let fresh = dir.join("wal-new");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&fresh)?;
        f.write_all_at(&buf, 0)?;
        f.sync_all()?;
        std::fs::rename(&fresh, log_path(dir, cur))?;
        // The other file exists from here on, its name durable with this one's: a
        // checkpoint's records may go there before anything syncs the directory again.
        drop(open_log(dir, 1 - cur)?);
        sync_dir(dir)?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            file: f,
            cur,
            gen,
            off: buf.len() as u64,
            zeroed: buf.len() as u64,
            data,
            psize,
        })
    }

    /// Begins a checkpoint at transaction `txnid` (LMDB's last commit, pinned by the
    /// caller), whose meta pages are `metas`: the other file's header, and records go
    /// there from now on. The current log must be confirmed. The caller runs the
    /// returned [`Confirm`] (on the sync thread) before the next `begin`.
    pub(crate) fn begin(&mut self, txnid: u64, metas: &[u8], clean: bool) -> io::Result<Confirm> {
        let next = 1 - self.cur;
        let gen = self.gen + 1;
        let f = open_log(&self.dir, next)?;
        let mut buf = header_bytes(gen, txnid, clean, metas);
        // A confirmation of the file's last turn must not stand for this one.
        buf.resize(records_start(metas.len()) as usize, 0);
        f.write_all_at(&buf, 0)?;
        let mut zeroed = f.metadata()?.len();
        if zeroed > CAPACITY {
            // Grown past its size for one large record in its last turn.
            f.set_len(CAPACITY)?;
            zeroed = CAPACITY;
        }
        let confirm = Confirm {
            data: self.data.try_clone()?,
            log: f.try_clone()?,
            at: confirm_at(metas.len()),
            bytes: confirm_bytes(gen, txnid),
        };
        self.file = f;
        self.cur = next;
        self.gen = gen;
        self.off = buf.len() as u64;
        self.zeroed = zeroed;
        Ok(confirm)
    }

    /// LMDB's two meta pages as they are now (from the page cache).
    pub(crate) fn metas(&self) -> io::Result<Vec<u8>> {
        read_metas(&self.data, self.psize)
    }

    /// Bytes of records since the current header.
    pub(crate) fn used(&self) -> u64 {
        self.off - records_start(2 * self.psize)
    }

    /// Whether a record of `len` bytes fits in what is left of [`CAPACITY`].
    pub(crate) fn fits(&self, len: usize) -> bool {
        self.off + REC_HEAD + len as u64 <= CAPACITY
    }

    /// Makes room for a record of `len` bytes at the log's end (zeroed and synced):
    /// on an error nothing of the log changed but its file's length.
    pub(crate) fn reserve(&mut self, len: usize) -> io::Result<()> {
        let end = self.off + REC_HEAD + len as u64;
        if end > self.zeroed {
            self.zeroed = zero_to(&self.file, self.zeroed, end)?;
        }
        Ok(())
    }

    /// Free bytes of the disk that holds the log (and LMDB's data file beside it).
    pub(crate) fn free_bytes(&self) -> io::Result<u64> {
        crate::sys::process::free_bytes(std::os::fd::AsFd::as_fd(&self.file))
    }

    /// Appends the record of the batch about to commit as `txnid` and syncs it. Past
    /// [`CAPACITY`] when the caller found no room in an empty log (one record larger
    /// than a file).
    ///
    /// # Errors
    /// The write's or the sync's (the caller stops the daemon), or a payload of 4 GiB
    /// or more.
    pub(crate) fn append(&mut self, txnid: u64, payload: &[u8]) -> io::Result<()> {
        if u32::try_from(payload.len()).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a batch of 4 GiB or more",
            ));
        }
        self.reserve(payload.len())?;
        let end = self.off + REC_HEAD + payload.len() as u64;
        let head = record_head(self.gen, txnid, payload);
        let mut buf = Vec::with_capacity(head.len() + payload.len());
        buf.extend_from_slice(&head);
        buf.extend_from_slice(payload);
        self.file.write_all_at(&buf, self.off)?;
        self.file.sync_data()?;
        self.off = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_header_and_records_read_back_and_a_torn_one_ends_the_log() {
        let dir = std::env::temp_dir().join(format!("isobox-wal-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let metas = vec![7u8; 8192];
        let f = open_log(&dir, 0).unwrap();
        assert!(read_header(&f).unwrap().is_none());
        f.write_all_at(&header_bytes(5, 40, false, &metas), 0)
            .unwrap();
        let h = read_header(&f).unwrap().unwrap();
        assert_eq!(
            (h.gen, h.txnid, h.clean, h.metas.len()),
            (5, 40, false, 8192)
        );
        let start = records_start(8192);
        assert_eq!(start, 16384);
        // Not confirmed until its confirmation is there, for its own generation.
        assert!(!confirmed(&f, &h).unwrap());
        f.write_all_at(&confirm_bytes(4, 40), confirm_at(8192))
            .unwrap();
        assert!(!confirmed(&f, &h).unwrap());
        f.write_all_at(&confirm_bytes(5, 40), confirm_at(8192))
            .unwrap();
        assert!(confirmed(&f, &h).unwrap());
        let mut off = start;
        for (id, p) in [(41u64, &b"one"[..]), (42, b""), (43, &[9u8; 5000][..])] {
            let mut b = record_head(5, id, p).to_vec();
            b.extend_from_slice(p);
            f.write_all_at(&b, off).unwrap();
            off += b.len() as u64;
        }
        let (recs, end) = read_records(&f, 5, start, off).unwrap();
        assert_eq!(end, off);
        assert_eq!(recs.iter().map(|r| r.0).collect::<Vec<_>>(), [41, 42, 43]);
        assert_eq!(recs[2].1, vec![9u8; 5000]);
        // Another generation's records: not this log's.
        assert!(read_records(&f, 6, start, off).unwrap().0.is_empty());
        // A byte of the last payload flipped: the log ends before it.
        f.write_all_at(&[0], off - 1).unwrap();
        let (recs, end) = read_records(&f, 5, start, off).unwrap();
        assert_eq!((recs.len(), end), (2, off - 5000 - REC_HEAD));
        // A flipped bit in the metas: the header is not valid.
        f.write_all_at(&[6], HEADER_LEN + 100).unwrap();
        assert!(read_header(&f).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

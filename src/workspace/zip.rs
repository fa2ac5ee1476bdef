//! Streaming ZIP writer for downloading a workspace directory tree as
//! `application/zip`.
//!
//! It stays one file: the writer's state machine, its poisoning and the no-ZIP64 bounds
//! are checked together.
//!
//! The archive is produced strictly front to back into any [`Write`] (a pipe,
//! a socket, ...); nothing is ever sought or rewritten. To make that possible
//! every file entry sets general-purpose flag bit 3: its local header carries
//! zero CRC/sizes and the real values follow the compressed data in a data
//! descriptor (with the optional `0x08074b50` signature). The central
//! directory and the end-of-central-directory record are written by
//! [`ZipStreamWriter::finish`].
//!
//! * Files are deflate-compressed (flate2, level 1); directories are stored
//!   entries named with a trailing `/` and no data.
//! * "Version made by" is 3 (Unix), so the Unix mode in the high 16 bits of
//!   the external attributes is honoured by `unzip`. File modes are reduced to
//!   the permission bits (`& 0o777`, no setuid/setgid/sticky) and always typed
//!   as regular files, so an archive can never contain a symlink or device.
//! * Modification times go into the DOS date/time fields (UTC, clamped to
//!   1980-01-01 ..= 2107-12-31) and into an extended-timestamp extra field
//!   (`0x5455`, Unix seconds), the latter only when the time fits in a
//!   non-negative `i32` (1970 ..= 2038-01-19).
//! * Names are raw bytes and validated against path traversal ("Zip Slip"),
//!   see [`ZipStreamWriter::start_file`]. The UTF-8 flag (bit 11) is set only
//!   when a name is valid UTF-8.
//!
//! # Limits (no ZIP64)
//!
//! ZIP64 is deliberately not implemented; callers cap archives far below the
//! classic limits (256 MiB). Instead the writer refuses cleanly with
//! [`ZipError::TooLarge`] when an archive would need ZIP64:
//!
//! * more than [`MAX_ENTRIES`] (65 534) entries (`0xFFFF` is the ZIP64
//!   sentinel, so it is not used either);
//! * a file whose uncompressed or compressed size exceeds [`MAX_SIZE`]
//!   (`0xFFFF_FFFE` bytes, i.e. 4 GiB − 2);
//! * a local header or the central directory starting beyond [`MAX_SIZE`],
//!   or a central directory larger than that.
//!
//! # Errors and poisoning
//!
//! Misuse ([`ZipError::State`]) and rejected names ([`ZipError::BadName`])
//! leave the writer usable. Any I/O error, and any size limit hit while a
//! file's data is being written, *poisons* the writer: the output is then a
//! truncated archive and every further call fails with [`ZipError::State`].
//! The caller is expected to abort the download in that case.
//!
//! # Why not the `zip` crate
//!
//! `zip` 9.8's streaming writer (`ZipWriter::new_stream`) was tried in its
//! place and does not fit: `add_directory` takes a `String`, and a directory
//! entry started through the raw-name `start_file_with_options` is closed by
//! seeking back to patch its local header, which fails on a pipe, so a
//! directory whose name is not UTF-8 could not be written; the UTF-8 flag is
//! set only for non-ASCII names; and dropping an unfinished writer writes a
//! valid central directory, so a download cut short would read as complete.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use flate2::write::DeflateEncoder;
use flate2::Compression;

/// Maximum number of entries (files + directories) in one archive.
pub const MAX_ENTRIES: usize = 0xFFFE;

/// The most bytes all entry names of one archive may take together. Each name is kept
/// once until the central directory is written (a digest stands for it in the
/// duplicate check), so this bounds a transfer's memory: 65 534 entries at 16 KiB paths
/// would otherwise hold a gigabyte.
pub const MAX_NAME_BYTES: usize = 8 << 20;

/// Maximum value of any 32-bit size or offset field (`0xFFFF_FFFF` is the
/// ZIP64 sentinel and is never written).
pub const MAX_SIZE: u64 = 0xFFFF_FFFE;

/// Deflate level used for file contents (fast; CPU matters more than ratio).
const DEFLATE_LEVEL: u32 = 1;

const SIG_LOCAL: u32 = 0x0403_4b50;
const SIG_CENTRAL: u32 = 0x0201_4b50;
const SIG_DESCRIPTOR: u32 = 0x0807_4b50;
const SIG_EOCD: u32 = 0x0605_4b50;

/// "Version made by": upper byte 3 = Unix, lower byte 20 = spec 2.0.
const VERSION_MADE_BY: u16 = (3 << 8) | 20;
/// "Version needed to extract": 2.0 (deflate, directories).
const VERSION_NEEDED: u16 = 20;

const FLAG_DATA_DESCRIPTOR: u16 = 1 << 3;
const FLAG_UTF8: u16 = 1 << 11;

const METHOD_STORED: u16 = 0;
const METHOD_DEFLATE: u16 = 8;

const S_IFREG: u32 = 0o100_000;
const S_IFDIR: u32 = 0o040_000;
const DIR_MODE: u32 = 0o755;
const DOS_ATTR_READONLY: u32 = 0x01;
const DOS_ATTR_DIR: u32 = 0x10;
const DOS_ATTR_ARCHIVE: u32 = 0x20;

const EXTRA_EXT_TIMESTAMP: u16 = 0x5455;

/// Size of the buffer [`ZipStreamWriter::add_file`] reads through.
const READ_CHUNK: usize = 64 * 1024;

/// Errors from [`ZipStreamWriter`].
#[derive(Debug, thiserror::Error)]
pub enum ZipError {
    /// Writing to the underlying sink (or, in [`ZipStreamWriter::add_file`],
    /// reading the source) failed.
    #[error("zip i/o error: {0}")]
    Io(#[from] io::Error),
    /// An entry name was rejected (empty, absolute, `.`/`..` component, NUL,
    /// backslash, empty component, duplicate, or too long).
    #[error("bad zip entry name: {0}")]
    BadName(String),
    /// The archive would need ZIP64, which is not supported.
    #[error("zip archive too large: {0}")]
    TooLarge(&'static str),
    /// The writer was used out of order, or is poisoned by an earlier error.
    #[error("zip writer misuse: {0}")]
    State(&'static str),
}

/// `Write` adapter counting the bytes that reached the inner writer.
struct CountingWriter<W> {
    inner: W,
    count: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Metadata of a finished entry, kept for the central directory.
struct Entry {
    name: Vec<u8>,
    flags: u16,
    method: u16,
    dos_time: u16,
    dos_date: u16,
    unix_mtime: Option<u32>,
    crc: u32,
    compressed: u32,
    uncompressed: u32,
    external_attr: u32,
    offset: u32,
}

/// A file whose data is currently being written.
struct OpenFile {
    entry: Entry,
    hasher: crc32fast::Hasher,
    uncompressed: u64,
    /// Output byte count right after the local header (data starts here).
    data_start: u64,
}

enum State {
    Idle,
    InFile(Box<OpenFile>),
    Poisoned,
}

/// Streaming ZIP archive writer over a non-seekable [`Write`].
///
/// Usage: any sequence of [`add_dir`](Self::add_dir),
/// [`add_file`](Self::add_file) or [`start_file`](Self::start_file) /
/// [`write_data`](Self::write_data) (or [`Write::write`]) /
/// [`finish_file`](Self::finish_file), then [`finish`](Self::finish).
/// Wrap `w` in a `BufWriter` if it is unbuffered: headers are written as
/// individual small writes.
pub struct ZipStreamWriter<W: Write> {
    out: CountingWriter<W>,
    entries: Vec<Entry>,
    /// Digests of the names (without trailing `/`) already used, to refuse duplicates
    /// without keeping each name a second time.
    names: HashSet<[u8; 16]>,
    /// Bytes of the entries' names so far.
    name_bytes: usize,
    state: State,
    /// Created on the first file, reused (reset) for later files.
    encoder: Option<DeflateEncoder<Vec<u8>>>,
    read_buf: Vec<u8>,
}

/// What stands for a name in the duplicate check: 128 bits of its SHA-256.
fn name_digest(name: &[u8]) -> [u8; 16] {
    let d = ring::digest::digest(&ring::digest::SHA256, name);
    let mut out = [0u8; 16];
    out.copy_from_slice(&d.as_ref()[..16]);
    out
}

impl<W: Write> ZipStreamWriter<W> {
    /// Creates a writer producing an archive into `w`. Nothing is written
    /// until the first entry is added.
    pub fn new(w: W) -> Self {
        ZipStreamWriter {
            out: CountingWriter { inner: w, count: 0 },
            entries: Vec::new(),
            names: HashSet::new(),
            name_bytes: 0,
            state: State::Idle,
            encoder: None,
            read_buf: Vec::new(),
        }
    }

    /// Total number of bytes handed to the underlying writer so far.
    ///
    /// Compressed data still buffered inside the deflate encoder (at most a
    /// few tens of KiB) is only counted once it is emitted.
    pub fn bytes_written(&self) -> u64 {
        self.out.count
    }

    /// Adds a directory entry (stored, no data). A trailing `/` is appended
    /// to `name` if missing; the name is validated like in
    /// [`start_file`](Self::start_file). The directory gets mode `0o755`.
    pub fn add_dir(&mut self, name: &[u8], mtime: SystemTime) -> Result<(), ZipError> {
        self.check_idle()?;
        let base = name.strip_suffix(b"/").unwrap_or(name);
        validate_name(base)?;
        let mut full = base.to_vec();
        full.push(b'/');
        self.check_new_entry(base, &full)?;

        let (dos_time, dos_date) = dos_date_time(mtime);
        let entry = Entry {
            flags: utf8_flag(&full),
            method: METHOD_STORED,
            dos_time,
            dos_date,
            unix_mtime: unix_mtime_u32(mtime),
            crc: 0,
            compressed: 0,
            uncompressed: 0,
            external_attr: ((S_IFDIR | DIR_MODE) << 16) | DOS_ATTR_DIR,
            offset: self.entry_offset()?,
            name: full,
        };
        self.guard(|w| w.write_local_header(&entry))?;
        self.names.insert(name_digest(base));
        self.name_bytes += entry.name.len();
        self.entries.push(entry);
        Ok(())
    }

    /// Starts a file entry; write its contents with
    /// [`write_data`](Self::write_data) (or [`Write`]) and close it with
    /// [`finish_file`](Self::finish_file).
    ///
    /// `name` must be a relative path of raw bytes with `/` separators. It is
    /// rejected with [`ZipError::BadName`] if it is empty, starts or ends
    /// with `/`, has an empty, `.` or `..` component, contains NUL or `\`,
    /// repeats an earlier entry's name, or is longer than 65 535 bytes.
    /// Only the permission bits of `unix_mode` (`& 0o777`) are kept; the
    /// entry is always a regular file.
    pub fn start_file(
        &mut self,
        name: &[u8],
        mtime: SystemTime,
        unix_mode: u32,
    ) -> Result<(), ZipError> {
        self.check_idle()?;
        validate_name(name)?;
        self.check_new_entry(name, name)?;

        let perm = unix_mode & 0o777;
        let mut dos_attr = DOS_ATTR_ARCHIVE;
        if perm & 0o200 == 0 {
            dos_attr |= DOS_ATTR_READONLY;
        }
        let (dos_time, dos_date) = dos_date_time(mtime);
        let entry = Entry {
            flags: FLAG_DATA_DESCRIPTOR | utf8_flag(name),
            method: METHOD_DEFLATE,
            dos_time,
            dos_date,
            unix_mtime: unix_mtime_u32(mtime),
            crc: 0,
            compressed: 0,
            uncompressed: 0,
            external_attr: ((S_IFREG | perm) << 16) | dos_attr,
            offset: self.entry_offset()?,
            name: name.to_vec(),
        };
        self.guard(|w| {
            match &mut w.encoder {
                // The previous stream was finished in finish_file; this only
                // resets the compressor state.
                Some(enc) => {
                    enc.reset(Vec::new())?;
                }
                None => {
                    w.encoder = Some(DeflateEncoder::new(
                        Vec::new(),
                        Compression::new(DEFLATE_LEVEL),
                    ))
                }
            }
            w.write_local_header(&entry)
        })?;
        self.names.insert(name_digest(name));
        self.name_bytes += name.len();
        self.state = State::InFile(Box::new(OpenFile {
            entry,
            hasher: crc32fast::Hasher::new(),
            uncompressed: 0,
            data_start: self.out.count,
        }));
        Ok(())
    }

    /// Appends `data` to the file opened by [`start_file`](Self::start_file).
    pub fn write_data(&mut self, data: &[u8]) -> Result<(), ZipError> {
        let file = match &mut self.state {
            State::InFile(f) => f,
            State::Idle => return Err(ZipError::State("no file is open")),
            State::Poisoned => return Err(poisoned()),
        };
        if file.uncompressed + data.len() as u64 > MAX_SIZE {
            self.state = State::Poisoned;
            return Err(ZipError::TooLarge("file exceeds 4 gib (zip64 unsupported)"));
        }
        file.hasher.update(data);
        file.uncompressed += data.len() as u64;
        self.guard(|w| {
            let enc = w
                .encoder
                .as_mut()
                .ok_or(ZipError::State("encoder missing"))?;
            enc.write_all(data)?;
            let buf = enc.get_mut();
            if !buf.is_empty() {
                w.out.write_all(buf)?;
                buf.clear();
            }
            Ok(())
        })
    }

    /// Closes the current file: flushes the compressed stream and writes the
    /// data descriptor (CRC-32 and sizes).
    pub fn finish_file(&mut self) -> Result<(), ZipError> {
        match &self.state {
            State::InFile(_) => {}
            State::Idle => return Err(ZipError::State("no file is open")),
            State::Poisoned => return Err(poisoned()),
        }
        self.guard(|w| {
            let enc = w
                .encoder
                .as_mut()
                .ok_or(ZipError::State("encoder missing"))?;
            enc.try_finish()?;
            let buf = enc.get_mut();
            w.out.write_all(buf)?;
            buf.clear();

            let State::InFile(file) = std::mem::replace(&mut w.state, State::Poisoned) else {
                return Err(ZipError::State("no file is open"));
            };
            let mut file = *file;
            let compressed = w.out.count - file.data_start;
            if compressed > MAX_SIZE {
                return Err(ZipError::TooLarge(
                    "compressed file exceeds 4 gib (zip64 unsupported)",
                ));
            }
            file.entry.crc = file.hasher.finalize();
            file.entry.compressed = to_u32(compressed)?;
            file.entry.uncompressed = to_u32(file.uncompressed)?;

            let mut dd = Vec::with_capacity(16);
            put_u32(&mut dd, SIG_DESCRIPTOR);
            put_u32(&mut dd, file.entry.crc);
            put_u32(&mut dd, file.entry.compressed);
            put_u32(&mut dd, file.entry.uncompressed);
            w.out.write_all(&dd)?;

            w.entries.push(file.entry);
            w.state = State::Idle;
            Ok(())
        })
    }

    /// Convenience: adds a whole file read from `reader` (see
    /// [`start_file`](Self::start_file) for `name` and `unix_mode`).
    /// Returns the number of (uncompressed) bytes stored. A read error
    /// poisons the writer, as the entry is then incomplete.
    pub fn add_file(
        &mut self,
        name: &[u8],
        mtime: SystemTime,
        unix_mode: u32,
        reader: &mut impl Read,
    ) -> Result<u64, ZipError> {
        self.start_file(name, mtime, unix_mode)?;
        let mut buf = std::mem::take(&mut self.read_buf);
        buf.resize(READ_CHUNK, 0);
        let result = self.copy_from(reader, &mut buf);
        self.read_buf = buf;
        let total = result?;
        self.finish_file()?;
        Ok(total)
    }

    /// Writes the central directory and end-of-central-directory record,
    /// flushes and returns the underlying writer. Fails with
    /// [`ZipError::State`] if a file is still open.
    pub fn finish(mut self) -> Result<W, ZipError> {
        self.check_idle()?;
        let cd_start = self.out.count;
        if cd_start > MAX_SIZE {
            return Err(ZipError::TooLarge(
                "archive exceeds 4 gib (zip64 unsupported)",
            ));
        }
        let mut cd = Vec::new();
        for e in &self.entries {
            let extra = timestamp_extra(e.unix_mtime);
            put_u32(&mut cd, SIG_CENTRAL);
            put_u16(&mut cd, VERSION_MADE_BY);
            put_u16(&mut cd, VERSION_NEEDED);
            put_u16(&mut cd, e.flags);
            put_u16(&mut cd, e.method);
            put_u16(&mut cd, e.dos_time);
            put_u16(&mut cd, e.dos_date);
            put_u32(&mut cd, e.crc);
            put_u32(&mut cd, e.compressed);
            put_u32(&mut cd, e.uncompressed);
            put_u16(&mut cd, to_u16(e.name.len())?);
            put_u16(&mut cd, to_u16(extra.len())?);
            put_u16(&mut cd, 0); // comment length
            put_u16(&mut cd, 0); // disk number start
            put_u16(&mut cd, 0); // internal attributes
            put_u32(&mut cd, e.external_attr);
            put_u32(&mut cd, e.offset);
            cd.extend_from_slice(&e.name);
            cd.extend_from_slice(&extra);
        }
        let cd_size = cd.len() as u64;
        if cd_size > MAX_SIZE {
            return Err(ZipError::TooLarge(
                "central directory exceeds 4 gib (zip64 unsupported)",
            ));
        }
        let count = to_u16(self.entries.len())?;
        put_u32(&mut cd, SIG_EOCD);
        put_u16(&mut cd, 0); // this disk
        put_u16(&mut cd, 0); // disk with central directory
        put_u16(&mut cd, count);
        put_u16(&mut cd, count);
        put_u32(&mut cd, to_u32(cd_size)?);
        put_u32(&mut cd, to_u32(cd_start)?);
        put_u16(&mut cd, 0); // comment length
        self.out.write_all(&cd)?;
        self.out.flush()?;
        Ok(self.out.inner)
    }

    // ---- internals -------------------------------------------------------

    fn copy_from(&mut self, reader: &mut impl Read, buf: &mut [u8]) -> Result<u64, ZipError> {
        let mut total = 0u64;
        loop {
            let n = match reader.read(buf) {
                Ok(0) => return Ok(total),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.state = State::Poisoned;
                    return Err(e.into());
                }
            };
            self.write_data(&buf[..n])?;
            total += n as u64;
        }
    }

    /// Runs `f`; an I/O or size error poisons the writer.
    fn guard(&mut self, f: impl FnOnce(&mut Self) -> Result<(), ZipError>) -> Result<(), ZipError> {
        let r = f(self);
        if matches!(r, Err(ZipError::Io(_) | ZipError::TooLarge(_))) {
            self.state = State::Poisoned;
        }
        r
    }

    fn check_idle(&self) -> Result<(), ZipError> {
        match self.state {
            State::Idle => Ok(()),
            State::InFile(_) => Err(ZipError::State("a file is still open")),
            State::Poisoned => Err(poisoned()),
        }
    }

    fn check_new_entry(&self, key: &[u8], full: &[u8]) -> Result<(), ZipError> {
        if full.len() > usize::from(u16::MAX) {
            return Err(bad_name(key, "longer than 65535 bytes"));
        }
        if self.names.contains(&name_digest(key)) {
            return Err(bad_name(key, "duplicate entry"));
        }
        if self.name_bytes + full.len() > MAX_NAME_BYTES {
            return Err(ZipError::TooLarge("entry names exceed 8 mib"));
        }
        if self.entries.len() >= MAX_ENTRIES {
            return Err(ZipError::TooLarge(
                "more than 65534 entries (zip64 unsupported)",
            ));
        }
        Ok(())
    }

    fn entry_offset(&self) -> Result<u32, ZipError> {
        if self.out.count > MAX_SIZE {
            return Err(ZipError::TooLarge(
                "archive exceeds 4 gib (zip64 unsupported)",
            ));
        }
        to_u32(self.out.count)
    }

    fn write_local_header(&mut self, e: &Entry) -> Result<(), ZipError> {
        let extra = timestamp_extra(e.unix_mtime);
        let mut h = Vec::with_capacity(30 + e.name.len() + extra.len());
        put_u32(&mut h, SIG_LOCAL);
        put_u16(&mut h, VERSION_NEEDED);
        put_u16(&mut h, e.flags);
        put_u16(&mut h, e.method);
        put_u16(&mut h, e.dos_time);
        put_u16(&mut h, e.dos_date);
        // CRC and sizes: zero for files (they follow in the data descriptor),
        // and genuinely zero for directories.
        put_u32(&mut h, 0);
        put_u32(&mut h, 0);
        put_u32(&mut h, 0);
        put_u16(&mut h, to_u16(e.name.len())?);
        put_u16(&mut h, to_u16(extra.len())?);
        h.extend_from_slice(&e.name);
        h.extend_from_slice(&extra);
        self.out.write_all(&h)?;
        Ok(())
    }
}

/// Writes file data; only valid between [`ZipStreamWriter::start_file`] and
/// [`ZipStreamWriter::finish_file`]. Non-I/O [`ZipError`]s are returned as
/// `io::Error`s wrapping them.
impl<W: Write> Write for ZipStreamWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_data(buf).map_err(|e| match e {
            ZipError::Io(e) => e,
            other => io::Error::other(other),
        })?;
        Ok(buf.len())
    }

    /// Flushes the underlying writer. Data still inside the deflate encoder
    /// is not forced out (that would change the compressed stream).
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn poisoned() -> ZipError {
    ZipError::State("writer is unusable after an earlier error")
}

fn bad_name(name: &[u8], why: &str) -> ZipError {
    ZipError::BadName(format!("\"{}\": {why}", name.escape_ascii()))
}

/// Rejects names that could escape the extraction directory or are
/// ambiguous (see [`ZipStreamWriter::start_file`]).
fn validate_name(name: &[u8]) -> Result<(), ZipError> {
    if name.is_empty() {
        return Err(bad_name(name, "empty name"));
    }
    if name.contains(&0) {
        return Err(bad_name(name, "contains nul"));
    }
    if name.contains(&b'\\') {
        return Err(bad_name(name, "contains backslash"));
    }
    if name[0] == b'/' {
        return Err(bad_name(name, "absolute path"));
    }
    for comp in name.split(|&b| b == b'/') {
        match comp {
            b"" => return Err(bad_name(name, "empty path component")),
            b"." | b".." => return Err(bad_name(name, "'.' or '..' component")),
            _ => {}
        }
    }
    Ok(())
}

fn utf8_flag(name: &[u8]) -> u16 {
    if std::str::from_utf8(name).is_ok() {
        FLAG_UTF8
    } else {
        0
    }
}

fn to_u32(v: u64) -> Result<u32, ZipError> {
    u32::try_from(v).map_err(|_| ZipError::TooLarge("value exceeds 32 bits (zip64 unsupported)"))
}

fn to_u16(v: usize) -> Result<u16, ZipError> {
    u16::try_from(v).map_err(|_| ZipError::TooLarge("value exceeds 16 bits"))
}

fn put_u16(buf: &mut Vec<u8>, v: u16) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

/// Seconds since the Unix epoch, floored, saturating.
fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => {
            let d = e.duration();
            let s = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            let s = if d.subsec_nanos() > 0 {
                s.saturating_add(1)
            } else {
                s
            };
            -s
        }
    }
}

/// Mtime for the extended-timestamp field, if it fits a non-negative `i32`
/// (readers disagree on whether the field is signed).
fn unix_mtime_u32(t: SystemTime) -> Option<u32> {
    let s = unix_secs(t);
    if (0..=i64::from(i32::MAX)).contains(&s) {
        u32::try_from(s).ok()
    } else {
        None
    }
}

/// Extended-timestamp extra field (0x5455) carrying only the mtime; the same
/// layout is valid in local and central headers.
fn timestamp_extra(mtime: Option<u32>) -> Vec<u8> {
    let Some(m) = mtime else {
        return Vec::new();
    };
    let mut v = Vec::with_capacity(9);
    put_u16(&mut v, EXTRA_EXT_TIMESTAMP);
    put_u16(&mut v, 5);
    v.push(1); // flags: mtime present
    put_u32(&mut v, m);
    v
}

/// DOS `(time, date)` of `t` in UTC, clamped to 1980-01-01 00:00:00 ..=
/// 2107-12-31 23:59:58 (2-second resolution).
fn dos_date_time(t: SystemTime) -> (u16, u16) {
    // 1980-01-01T00:00:00Z and 2107-12-31T23:59:58Z.
    const MIN: i64 = 315_532_800;
    const MAX: i64 = 4_354_819_198;
    let secs = unix_secs(t).clamp(MIN, MAX);
    let dt = jiff::civil::DateTime::constant(1970, 1, 1, 0, 0, 0, 0)
        .saturating_add(jiff::SignedDuration::from_secs(secs));
    // All components are in range after clamping, so the casts are lossless.
    let field = |v: i8| v as u16;
    let time = (field(dt.hour()) << 11) | (field(dt.minute()) << 5) | (field(dt.second()) / 2);
    let date = (((dt.year() - 1980) as u16) << 9) | (field(dt.month()) << 5) | field(dt.day());
    (time, date)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Unique scratch directory under /tmp, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
            let p = PathBuf::from(format!(
                "/tmp/isobox-zip-test-{}-{}-{nanos}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// One entry as seen by Python's `zipfile`.
    #[derive(Debug)]
    struct PyEntry {
        name: Vec<u8>,
        is_dir: bool,
        external_attr: u32,
        date_time: String,
        flag_bits: u16,
        compress_type: u16,
        file_size: u64,
        create_system: u32,
        extra: Vec<u8>,
        content: Vec<u8>,
    }

    const PY_CHECK: &str = r#"
import sys, zipfile, os
zf = zipfile.ZipFile(sys.argv[1])
bad = zf.testzip()
if bad is not None:
    sys.exit("testzip failed on %r" % bad)
out = sys.argv[2]
for i, info in enumerate(zf.infolist()):
    raw = info.orig_filename.encode('utf-8' if info.flag_bits & 0x800 else 'cp437')
    data = zf.read(info)
    with open(os.path.join(out, str(i)), 'wb') as f:
        f.write(data)
    print('\t'.join([str(i), raw.hex(), str(int(info.is_dir())), str(info.external_attr),
        '-'.join(map(str, info.date_time)), str(info.flag_bits), str(info.compress_type),
        str(info.file_size), str(info.create_system), info.extra.hex()]))
"#;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Writes `zip` to a temp file, runs `unzip -t` and the Python check,
    /// and returns the entries Python saw (with their contents).
    fn verify(zip: &[u8]) -> Vec<PyEntry> {
        let dir = Scratch::new();
        let path = dir.0.join("a.zip");
        fs::write(&path, zip).unwrap();

        let o = Command::new("unzip")
            .arg("-tq")
            .arg(&path)
            .output()
            .unwrap();
        // unzip exits with 1 ("warning") for a valid archive without entries.
        let empty_warning = o.status.code() == Some(1)
            && String::from_utf8_lossy(&o.stdout).contains("zipfile is empty");
        assert!(
            o.status.success() || (zip.len() == 22 && empty_warning),
            "unzip -t failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );

        let out = dir.0.join("out");
        fs::create_dir(&out).unwrap();
        let o = Command::new("python3")
            .arg("-c")
            .arg(PY_CHECK)
            .arg(&path)
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "python check failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                assert_eq!(f.len(), 10, "{l}");
                PyEntry {
                    name: unhex(f[1]),
                    is_dir: f[2] == "1",
                    external_attr: f[3].parse().unwrap(),
                    date_time: f[4].to_string(),
                    flag_bits: f[5].parse().unwrap(),
                    compress_type: f[6].parse().unwrap(),
                    file_size: f[7].parse().unwrap(),
                    create_system: f[8].parse().unwrap(),
                    extra: unhex(f[9]),
                    content: fs::read(out.join(f[0])).unwrap(),
                }
            })
            .collect()
    }

    /// 2021-03-04 05:06:08 UTC.
    fn t0() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_614_834_368)
    }

    fn prng_bytes(len: usize, mut seed: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            v.extend_from_slice(&seed.to_le_bytes());
        }
        v.truncate(len);
        v
    }

    fn zip_of(files: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut z = ZipStreamWriter::new(Vec::new());
        for (name, data) in files {
            z.add_file(name, t0(), 0o644, &mut &data[..]).unwrap();
        }
        z.finish().unwrap()
    }

    #[test]
    fn empty_archive() {
        let z = ZipStreamWriter::new(Vec::new());
        assert_eq!(z.bytes_written(), 0);
        let bytes = z.finish().unwrap();
        assert_eq!(bytes.len(), 22);
        assert!(verify(&bytes).is_empty());
    }

    #[test]
    fn one_empty_file() {
        let mut z = ZipStreamWriter::new(Vec::new());
        z.start_file(b"empty.txt", t0(), 0o100_640).unwrap();
        z.finish_file().unwrap();
        let written = z.bytes_written();
        let bytes = z.finish().unwrap();
        assert!(written > 0 && written < bytes.len() as u64);

        let e = verify(&bytes);
        assert_eq!(e.len(), 1);
        let e = &e[0];
        assert_eq!(e.name, b"empty.txt");
        assert!(!e.is_dir);
        assert!(e.content.is_empty());
        assert_eq!(e.file_size, 0);
        assert_eq!(e.external_attr >> 16, 0o100_640);
        assert_eq!(e.date_time, "2021-3-4-5-6-8");
        assert_eq!(e.flag_bits, FLAG_DATA_DESCRIPTOR | FLAG_UTF8);
        assert_eq!(e.compress_type, 8);
        assert_eq!(e.create_system, 3);
        let mut ut = vec![0x55, 0x54, 5, 0, 1];
        ut.extend_from_slice(&1_614_834_368u32.to_le_bytes());
        assert_eq!(e.extra, ut);
    }

    #[test]
    fn big_files_random_and_compressible() {
        let random = prng_bytes(5 << 20, 0x9E37_79B9_7F4A_7C15);
        let text: Vec<u8> = (0..)
            .flat_map(|i: u32| format!("line {} of a compressible file\n", i % 1000).into_bytes())
            .take(5 << 20)
            .collect();

        let mut z = ZipStreamWriter::new(Vec::new());
        assert_eq!(
            z.add_file(b"random.bin", t0(), 0o600, &mut &random[..])
                .unwrap(),
            5 << 20
        );
        // Exercise the `Write` impl with odd chunk sizes.
        z.start_file(b"text.txt", t0(), 0o644).unwrap();
        for chunk in text.chunks(12_345) {
            z.write_all(chunk).unwrap();
        }
        z.finish_file().unwrap();
        let bytes = z.finish().unwrap();
        // Incompressible data must not blow up much; text must compress well.
        assert!(bytes.len() < (5 << 20) + (5 << 20) / 10, "{}", bytes.len());

        let e = verify(&bytes);
        assert_eq!(e.len(), 2);
        assert!(e[0].content == random);
        assert!(e[1].content == text);
        assert_eq!(e[0].external_attr >> 16, 0o100_600);
    }

    #[test]
    fn nested_dirs_extract_with_modes_and_mtime() {
        let mut z = ZipStreamWriter::new(Vec::new());
        z.add_dir(b"a", t0()).unwrap();
        z.add_dir(b"a/b/", t0()).unwrap();
        z.add_dir(b"a/b/c", t0()).unwrap();
        z.add_file(
            b"a/b/c/run.sh",
            t0(),
            0o4755,
            &mut &b"#!/bin/sh\necho hi\n"[..],
        )
        .unwrap();
        z.add_file(b"a/ro.txt", t0(), 0o444, &mut &b"read only"[..])
            .unwrap();
        z.add_file(b"top.txt", t0(), 0o640, &mut &b"top"[..])
            .unwrap();
        let bytes = z.finish().unwrap();

        let e = verify(&bytes);
        let names: Vec<&[u8]> = e.iter().map(|e| e.name.as_slice()).collect();
        assert_eq!(
            names,
            [
                &b"a/"[..],
                b"a/b/",
                b"a/b/c/",
                b"a/b/c/run.sh",
                b"a/ro.txt",
                b"top.txt"
            ]
        );
        for d in &e[..3] {
            assert!(d.is_dir);
            assert_eq!(d.external_attr >> 16, 0o040_755);
            assert_eq!(d.external_attr & 0x10, 0x10);
            assert_eq!(d.compress_type, 0);
            assert_eq!(d.date_time, "2021-3-4-5-6-8");
        }
        // setuid is stripped; read-only files get the DOS read-only bit.
        assert_eq!(e[3].external_attr >> 16, 0o100_755);
        assert_eq!(e[4].external_attr & 1, 1);
        assert_eq!(e[3].content, b"#!/bin/sh\necho hi\n");

        // Real extraction restores modes and mtimes.
        let dir = Scratch::new();
        let zp = dir.0.join("x.zip");
        fs::write(&zp, &bytes).unwrap();
        let st = Command::new("unzip")
            .arg("-q")
            .arg(&zp)
            .arg("-d")
            .arg(dir.0.join("x"))
            .status()
            .unwrap();
        assert!(st.success());
        let x = dir.0.join("x");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&x.join("a/b/c/run.sh")), 0o755);
        assert_eq!(mode(&x.join("a/ro.txt")), 0o444);
        assert_eq!(mode(&x.join("top.txt")), 0o640);
        assert!(x.join("a/b/c").is_dir());
        assert_eq!(
            fs::metadata(x.join("top.txt")).unwrap().modified().unwrap(),
            t0()
        );
        assert_eq!(fs::read(x.join("top.txt")).unwrap(), b"top");
    }

    #[test]
    fn odd_names() {
        let names: [&[u8]; 5] = [
            b"with space.txt",
            b"new\nline",
            b"quote\"d",
            b"bad\xffname",
            "ünïcödé/ok".as_bytes(),
        ];
        let mut z = ZipStreamWriter::new(Vec::new());
        z.add_dir("ünïcödé".as_bytes(), t0()).unwrap();
        for (i, n) in names.iter().enumerate() {
            z.add_file(n, t0(), 0o644, &mut format!("content {i}").as_bytes())
                .unwrap();
        }
        let bytes = z.finish().unwrap();
        let e = verify(&bytes);
        assert_eq!(e.len(), 6);
        for (i, n) in names.iter().enumerate() {
            let got = &e[i + 1];
            assert_eq!(got.name, *n);
            assert_eq!(got.content, format!("content {i}").as_bytes());
            let utf8 = std::str::from_utf8(n).is_ok();
            assert_eq!(got.flag_bits & FLAG_UTF8 != 0, utf8, "{n:?}");
        }
    }

    #[test]
    fn thousand_small_files() {
        let mut z = ZipStreamWriter::new(Vec::new());
        z.add_dir(b"d", t0()).unwrap();
        for i in 0..1000 {
            let data = format!("file number {i}\n").repeat(i % 7);
            z.add_file(
                format!("d/f{i:04}.txt").as_bytes(),
                t0(),
                0o644,
                &mut data.as_bytes(),
            )
            .unwrap();
        }
        let bytes = z.finish().unwrap();
        let e = verify(&bytes);
        assert_eq!(e.len(), 1001);
        for (i, got) in e[1..].iter().enumerate() {
            assert_eq!(got.name, format!("d/f{i:04}.txt").as_bytes());
            assert_eq!(
                got.content,
                format!("file number {i}\n").repeat(i % 7).as_bytes()
            );
        }
    }

    #[test]
    fn zip_slip_names_refused() {
        let bad: [&[u8]; 12] = [
            b"../x", b"/abs", b"a/../b", b"a\\b", b"", b".", b"..", b"a/.", b"./a", b"a//b",
            b"a\0b", b"a/",
        ];
        let mut z = ZipStreamWriter::new(Vec::new());
        for n in bad {
            assert!(
                matches!(z.start_file(n, t0(), 0o644), Err(ZipError::BadName(_))),
                "{n:?}"
            );
        }
        for n in [&b"../x"[..], b"/abs", b"", b"/", b"a/../b/", b"a\\b/"] {
            assert!(
                matches!(z.add_dir(n, t0()), Err(ZipError::BadName(_))),
                "{n:?}"
            );
        }
        // Duplicates (including file vs. directory of the same name).
        z.add_file(b"x", t0(), 0o644, &mut &b""[..]).unwrap();
        assert!(matches!(z.add_dir(b"x", t0()), Err(ZipError::BadName(_))));
        assert!(matches!(
            z.start_file(b"x", t0(), 0o644),
            Err(ZipError::BadName(_))
        ));
        let long = vec![b'a'; 70_000];
        assert!(matches!(
            z.start_file(&long, t0(), 0o644),
            Err(ZipError::BadName(_))
        ));
        // Rejections do not poison the writer.
        let bytes = z.finish().unwrap();
        let e = verify(&bytes);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].name, b"x");
    }

    #[test]
    fn state_errors() {
        let mut z = ZipStreamWriter::new(Vec::new());
        assert!(matches!(z.finish_file(), Err(ZipError::State(_))));
        assert!(matches!(z.write_data(b"x"), Err(ZipError::State(_))));
        assert!(z.write(b"x").is_err());
        z.start_file(b"f", t0(), 0o644).unwrap();
        assert!(matches!(
            z.start_file(b"g", t0(), 0o644),
            Err(ZipError::State(_))
        ));
        assert!(matches!(z.add_dir(b"d", t0()), Err(ZipError::State(_))));
        z.write_data(b"data").unwrap();
        z.finish_file().unwrap();
        assert!(matches!(z.finish_file(), Err(ZipError::State(_))));
        let bytes = z.finish().unwrap();
        assert_eq!(verify(&bytes)[0].content, b"data");

        let mut z = ZipStreamWriter::new(Vec::new());
        z.start_file(b"f", t0(), 0o644).unwrap();
        assert!(matches!(z.finish(), Err(ZipError::State(_))));
    }

    /// A sink that fails after `limit` bytes.
    struct Failing {
        limit: usize,
        got: usize,
    }

    impl Write for Failing {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.got + buf.len() > self.limit {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "closed"));
            }
            self.got += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn io_error_poisons() {
        let mut z = ZipStreamWriter::new(Failing { limit: 100, got: 0 });
        let data = prng_bytes(200_000, 7);
        assert!(matches!(
            z.add_file(b"f", t0(), 0o644, &mut &data[..]),
            Err(ZipError::Io(_))
        ));
        assert!(matches!(z.add_dir(b"d", t0()), Err(ZipError::State(_))));
        assert!(matches!(z.finish(), Err(ZipError::State(_))));
    }

    #[test]
    fn size_limits_refused() {
        // A file reaching 4 GiB is refused and poisons the writer.
        let mut z = ZipStreamWriter::new(Vec::new());
        z.start_file(b"big", t0(), 0o644).unwrap();
        if let State::InFile(f) = &mut z.state {
            f.uncompressed = MAX_SIZE - 1;
        }
        z.write_data(b"x").unwrap();
        assert!(matches!(z.write_data(b"x"), Err(ZipError::TooLarge(_))));
        assert!(matches!(z.finish_file(), Err(ZipError::State(_))));

        // An entry starting beyond 4 GiB is refused without poisoning.
        let mut z = ZipStreamWriter::new(Vec::new());
        z.out.count = MAX_SIZE + 1;
        assert!(matches!(z.add_dir(b"d", t0()), Err(ZipError::TooLarge(_))));
        assert!(matches!(
            z.start_file(b"f", t0(), 0o644),
            Err(ZipError::TooLarge(_))
        ));
        assert!(matches!(z.finish(), Err(ZipError::TooLarge(_))));

        // Entry count limit.
        let mut z = ZipStreamWriter::new(Vec::new());
        for i in 0..MAX_ENTRIES {
            z.add_dir(format!("{i}").as_bytes(), t0()).unwrap();
        }
        assert!(matches!(
            z.add_dir(b"one-more", t0()),
            Err(ZipError::TooLarge(_))
        ));
        let bytes = z.finish().unwrap();
        let eocd = &bytes[bytes.len() - 22..];
        assert_eq!(&eocd[..4], &SIG_EOCD.to_le_bytes());
        assert_eq!(u16::from_le_bytes([eocd[10], eocd[11]]), 0xFFFE);
    }

    /// Issue 26 item 1: names are bounded as a whole (below and at `MAX_NAME_BYTES`
    /// they go in; one byte more is refused), and duplicates are still found through
    /// the digests.
    #[test]
    fn entry_names_are_bounded_together_and_kept_once() {
        let mut z = ZipStreamWriter::new(Vec::new());
        // 16 KiB paths, as 63 levels of 255-byte names give.
        let long = |i: usize| format!("{}/{i:08}", "d".repeat(16_000 - 9)).into_bytes();
        let per = long(0).len();
        let fit = MAX_NAME_BYTES / per;
        for i in 0..fit {
            z.start_file(&long(i), t0(), 0o644).unwrap();
            z.finish_file().unwrap();
        }
        assert_eq!(z.name_bytes, fit * per);
        // The same name again is a duplicate (found by digest), not a size error.
        assert!(matches!(
            z.start_file(&long(3), t0(), 0o644),
            Err(ZipError::BadName(_))
        ));
        let left = MAX_NAME_BYTES - z.name_bytes;
        let exact = vec![b'x'; left];
        z.add_file(&exact, t0(), 0o644, &mut &b""[..]).unwrap();
        assert_eq!(z.name_bytes, MAX_NAME_BYTES, "at the bound");
        assert!(matches!(
            z.add_dir(b"y", t0()),
            Err(ZipError::TooLarge("entry names exceed 8 mib"))
        ));
        // The archive still ends well.
        let bytes = z.finish().unwrap();
        assert_eq!(&bytes[bytes.len() - 22..][..4], &SIG_EOCD.to_le_bytes());
    }

    #[test]
    fn dos_time_clamping() {
        let at = |s: u64| dos_date_time(UNIX_EPOCH + Duration::from_secs(s));
        // 1980-01-01 00:00:00 and earlier (including pre-epoch).
        let min = (0u16, (1 << 5) | 1);
        assert_eq!(at(0), min);
        assert_eq!(dos_date_time(UNIX_EPOCH - Duration::from_secs(1000)), min);
        // 2107-12-31 23:59:58 and later.
        let max = ((23 << 11) | (59 << 5) | 29, (127 << 9) | (12 << 5) | 31);
        assert_eq!(at(4_354_819_199), max);
        assert_eq!(at(u64::MAX / 2), max);
        // 2000-02-29 12:34:56.
        assert_eq!(
            at(951_827_696),
            ((12 << 11) | (34 << 5) | 28, (20 << 9) | (2 << 5) | 29)
        );
        // Fixed instants (UTC) against their known DOS fields: the clamp edges
        // themselves, odd seconds (rounded down), leap days and 2100, a century
        // that is not a leap year.
        let dos = |y: u16, mo: u16, d: u16, h: u16, mi: u16, s: u16| {
            (
                (h << 11) | (mi << 5) | (s / 2),
                ((y - 1980) << 9) | (mo << 5) | d,
            )
        };
        for (secs, want) in [
            (315_532_800, dos(1980, 1, 1, 0, 0, 0)),
            (315_532_801, dos(1980, 1, 1, 0, 0, 0)),
            (315_532_799, dos(1980, 1, 1, 0, 0, 0)),
            (320_630_400, dos(1980, 2, 29, 0, 0, 0)),
            (1_709_251_199, dos(2024, 2, 29, 23, 59, 58)),
            (2_147_483_647, dos(2038, 1, 19, 3, 14, 6)),
            (4_107_542_399, dos(2100, 2, 28, 23, 59, 58)),
            (4_107_542_400, dos(2100, 3, 1, 0, 0, 0)),
            (4_354_819_198, dos(2107, 12, 31, 23, 59, 58)),
            (4_354_819_199, dos(2107, 12, 31, 23, 59, 58)),
        ] {
            assert_eq!(at(secs), want, "{secs}");
        }
        assert_eq!(dos(2107, 12, 31, 23, 59, 58), max);
        assert_eq!(dos(1980, 1, 1, 0, 0, 0), min);
        assert_eq!(
            unix_mtime_u32(UNIX_EPOCH + Duration::from_secs(1 << 31)),
            None
        );
        assert_eq!(unix_mtime_u32(UNIX_EPOCH - Duration::from_nanos(1)), None);
    }

    /// Output goes through a real pipe (cannot seek) read on another thread.
    #[test]
    fn non_seekable_pipe_sink() {
        let (mut rd, wr) = std::io::pipe().unwrap();
        let reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            rd.read_to_end(&mut v).unwrap();
            v
        });
        let data = prng_bytes(300_000, 42);
        let mut z = ZipStreamWriter::new(wr);
        z.add_dir(b"p", t0()).unwrap();
        z.add_file(b"p/r.bin", t0(), 0o644, &mut &data[..]).unwrap();
        z.add_file(b"p/e", t0(), 0o644, &mut &b""[..]).unwrap();
        let written = z.bytes_written();
        drop(z.finish().unwrap()); // closes the pipe
        let bytes = reader.join().unwrap();
        assert!(written < bytes.len() as u64);

        let e = verify(&bytes);
        assert_eq!(e.len(), 3);
        assert!(e[1].content == data);
        assert!(e[2].content.is_empty());

        // The same archive produced into an append-only sink is identical,
        // and bytes_written() reports it exactly after finish.
        struct AppendOnly(Vec<u8>);
        impl Write for AppendOnly {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut z = ZipStreamWriter::new(AppendOnly(Vec::new()));
        z.add_dir(b"p", t0()).unwrap();
        z.add_file(b"p/r.bin", t0(), 0o644, &mut &data[..]).unwrap();
        z.add_file(b"p/e", t0(), 0o644, &mut &b""[..]).unwrap();
        assert_eq!(z.bytes_written(), written);
        assert!(z.finish().unwrap().0 == bytes);
    }

    /// An archive streamed through a pipe, as a download is, reads back in
    /// Python's `zipfile` with its names (raw bytes, UTF-8 or not), contents,
    /// modes and types.
    #[test]
    fn pipe_archive_read_by_python() {
        let (mut rd, wr) = std::io::pipe().unwrap();
        let reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            rd.read_to_end(&mut v).unwrap();
            v
        });
        let big = prng_bytes(200_000, 3);
        let files: [(&[u8], u32, &[u8]); 4] = [
            (b"d/run.sh", 0o100_755, b"#!/bin/sh\n"),
            ("d/sub/ünï.txt".as_bytes(), 0o600, b"utf-8 name"),
            (b"d/raw\xfe.bin", 0o2644, &big),
            (b"empty", 0o444, b""),
        ];
        let mut z = ZipStreamWriter::new(io::BufWriter::new(wr));
        z.add_dir(b"d", t0()).unwrap();
        z.add_dir(b"d/sub/", t0()).unwrap();
        for (name, mode, data) in files {
            z.add_file(name, t0(), mode, &mut &data[..]).unwrap();
        }
        drop(z.finish().unwrap()); // flushes and closes the pipe
        let e = verify(&reader.join().unwrap());

        assert_eq!(e.len(), 6);
        for (got, name) in e[..2].iter().zip([&b"d/"[..], b"d/sub/"]) {
            assert_eq!(got.name, name);
            assert!(got.is_dir);
            assert_eq!(got.external_attr >> 16, 0o040_755);
            assert!(got.content.is_empty());
        }
        for (got, (name, mode, data)) in e[2..].iter().zip(files) {
            assert_eq!(got.name, name);
            assert!(!got.is_dir);
            assert_eq!(got.external_attr >> 16, 0o100_000 | (mode & 0o777));
            assert!(got.content == data, "{name:?}");
            assert_eq!(got.date_time, "2021-3-4-5-6-8");
        }
    }

    #[test]
    fn zip_of_helper_roundtrip() {
        let bytes = zip_of(&[(b"a", b"1"), (b"b", b"22")]);
        let e = verify(&bytes);
        assert_eq!(e[1].content, b"22");
    }
}

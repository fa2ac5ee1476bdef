//! Memory KV: per-tenant namespaces of opaque keys holding raw values, in LMDB.
//!
//! It stays one file: the layout, the quota accounting and every operation that must
//! keep the three tables consistent in one transaction are read together.
//!
//! Layout (all in the one environment; every operation is one LMDB transaction, and a
//! write answers only once the writer's batch holding it is committed):
//!
//! - `kv`: `tenant \0 namespace \0 key` → 32-byte header ++ raw value. The header is
//!   `version u64 BE, expires_at_ms u64 BE (0 = never), created_at_ms u64 BE,
//!   updated_at_ms u64 BE`. Neither tenant nor namespace nor key can contain NUL, so
//!   the two separators keep tenants and namespaces apart (`a` and `ab` included) and a
//!   namespace's keys form one contiguous range in byte order.
//! - `kv_exp`: `expires_at_ms u64 BE ++ kv key` → empty, only for entries with a TTL,
//!   maintained in the same transaction as the entry, so the purge walks expired
//!   entries oldest first without scanning the table.
//! - `kv_usage`: tenant → `bytes u64 LE ++ keys u64 LE`. `bytes` is the sum over the
//!   tenant's stored entries of **key bytes + value bytes** (namespace and header are
//!   not counted); updated in the same transaction as every change, so it always
//!   equals the sum of the stored sizes.
//! - `meta["kv_version"]`: u64 LE, the last version handed out. Every put takes the
//!   next one; the ETag is that version as a quoted strong tag of 16 hex digits.
//!
//! Expiry: an entry with `expires_at_ms <= now_ms` is absent for every operation at
//! once (reads, listings, preconditions). Until [`Store::kv_purge_expired`] (or a put or
//! delete of the same key) removes it, it still occupies its tenant's usage; a put that
//! would exceed the quota first purges that tenant's expired entries, so expired data
//! never causes a refusal.
//!
//! Key length: a stored LMDB key is up to `tenant + 2 + 64 + 512` bytes (+ 8 in
//! `kv_exp`), more than LMDB's default 511-byte limit, so the store needs LMDB built
//! with longer keys (heed's `longer-keys` feature: about 1 982 bytes with 4 KiB pages).
//! The limit is checked at run time: a key that does not fit is refused with
//! [`KvError::InvalidKey`] rather than an LMDB error.

use super::table::WriteTxn;
use super::{Store, StoreError, Tables};
use base64::Engine as _;
use heed::RoTxn;
use std::collections::HashMap;
use std::ops::Bound;

/// Longest namespace, bytes (1–64 bytes of `[A-Za-z0-9._-]`, not `.` or `..`).
pub const MAX_NAMESPACE_BYTES: usize = 64;
/// Longest key, bytes (UTF-8 without NUL or control characters below 0x20).
pub const MAX_KEY_BYTES: usize = 512;
/// Largest value, bytes (1 MiB).
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Per-tenant quota of stored key bytes + value bytes (10 MiB).
pub const TENANT_QUOTA_BYTES: u64 = 10 << 20;
/// Per-tenant quota of stored keys.
pub const TENANT_QUOTA_KEYS: u64 = 10_000;
/// Longest TTL, seconds (365 days).
pub const MAX_TTL_SEC: u64 = 365 * 86_400;
/// Most keys one listing page returns.
pub const MAX_LIST_LIMIT: usize = 1000;
/// Keys per listing page when the client gives no limit.
pub const DEFAULT_LIST_LIMIT: usize = 100;

/// Size of the record header: version, expires_at_ms, created_at_ms, updated_at_ms.
const HEADER_BYTES: usize = 32;
/// Meta key of the version counter.
const VERSION_KEY: &str = "kv_version";
/// Longest tenant name accepted (tenants come from admission, never from clients).
const MAX_TENANT_BYTES: usize = 255;
/// At most this many expiry-index entries are examined by the purge a put runs when it
/// would exceed the quota.
const QUOTA_PURGE_SCAN: usize = 100_000;
/// Longest cursor string: base64 of a [`MAX_KEY_BYTES`] key.
const MAX_CURSOR_CHARS: usize = MAX_KEY_BYTES.div_ceil(3) * 4;

/// A KV operation failed. Messages are lowercase and explicit: they become the HTTP
/// `detail`.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The namespace is not 1–64 bytes of `[A-Za-z0-9._-]` (or is `.` / `..`). 400.
    #[error("invalid namespace: {0}")]
    InvalidNamespace(String),
    /// The key (or list prefix) is empty, too long, or holds NUL / control characters. 400.
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// The value is larger than [`MAX_VALUE_BYTES`]. 413.
    #[error("value too large: the limit is {limit} bytes")]
    ValueTooLarge {
        /// The limit, bytes.
        limit: usize,
    },
    /// The TTL is 0 or longer than [`MAX_TTL_SEC`]. 400.
    #[error("invalid ttl: {0}")]
    InvalidTtl(String),
    /// The write would take the tenant over a quota; nothing was changed. 413.
    #[error(
        "quota exceeded: the tenant's {} would be {would_be}, the limit is {limit}",
        quota_noun(.what)
    )]
    Quota {
        /// `"bytes"` (key + value bytes) or `"keys"`.
        what: &'static str,
        /// The quota.
        limit: u64,
        /// Usage had the write gone through.
        would_be: u64,
    },
    /// `If-Match` / `If-None-Match` did not hold; nothing was changed. 412.
    #[error("precondition failed: the entity tag does not match the key's current state")]
    PreconditionFailed,
    /// The listing cursor is not one this listing handed out. 400.
    #[error("invalid cursor: pass back the cursor of a previous page of the same listing")]
    BadCursor,
    /// The store failed. 500.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn quota_noun(what: &str) -> &'static str {
    if what == "keys" {
        "stored keys"
    } else {
        "stored bytes (keys + values)"
    }
}

impl From<heed::Error> for KvError {
    fn from(e: heed::Error) -> KvError {
        KvError::Store(StoreError::Lmdb(e))
    }
}

/// A conditional-request precondition, from `If-Match` / `If-None-Match`.
///
/// Tags are compared by their opaque part: surrounding whitespace and quotes are
/// optional. `If-Match` uses the strong comparison (a `W/` tag never matches);
/// `If-None-Match` the weak one (`W/"x"` matches `"x"`). `*` matches any existing
/// (unexpired) entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Precondition {
    /// Unconditional.
    #[default]
    None,
    /// `If-Match`: the entry must exist and carry one of these tags (or `*`: just exist).
    IfMatch(Vec<String>),
    /// `If-None-Match`: the entry must not exist (`*`) or must carry none of these tags.
    IfNoneMatch(Vec<String>),
    /// Both fields: `If-Match` (the first) is evaluated first, then `If-None-Match`
    /// (RFC 9110 §13.2.2).
    Both(Vec<String>, Vec<String>),
}

impl Precondition {
    /// Whether the precondition holds for an entry whose current ETag is `current`
    /// (`None`: absent or expired). A GET whose `If-None-Match` does not hold is a 304.
    pub fn holds(&self, current: Option<&str>) -> bool {
        match self {
            Precondition::None => true,
            Precondition::IfMatch(tags) => if_match(tags, current),
            Precondition::IfNoneMatch(tags) => if_none_match(tags, current),
            Precondition::Both(m, n) => if_match(m, current) && if_none_match(n, current),
        }
    }

    /// Whether its `If-Match` part holds (true without one): a GET whose `If-Match`
    /// fails is a 412, one whose `If-None-Match` alone fails a 304.
    pub fn match_holds(&self, current: Option<&str>) -> bool {
        match self {
            Precondition::IfMatch(tags) | Precondition::Both(tags, _) => if_match(tags, current),
            Precondition::None | Precondition::IfNoneMatch(_) => true,
        }
    }
}

/// `If-Match`: strong comparison; `*` holds for any existing entry.
fn if_match(tags: &[String], current: Option<&str>) -> bool {
    current.is_some_and(|cur| {
        let (_, cur) = split_tag(cur);
        tags.iter().any(|t| {
            let (weak, t) = split_tag(t);
            t == "*" || (!weak && t == cur)
        })
    })
}

/// `If-None-Match`: weak comparison; `*` fails for any existing entry.
fn if_none_match(tags: &[String], current: Option<&str>) -> bool {
    current.is_none_or(|cur| {
        let (_, cur) = split_tag(cur);
        !tags.iter().any(|t| {
            let (_, t) = split_tag(t);
            t == "*" || t == cur
        })
    })
}

/// Splits an entity tag into (weak, opaque part without quotes).
fn split_tag(tag: &str) -> (bool, &str) {
    let t = tag.trim();
    let (weak, t) = match t.strip_prefix("W/") {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let t = t
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or(t);
    (weak, t)
}

/// Splits an `If-Match` / `If-None-Match` header value into its tags (`*`, `"x"`,
/// `W/"x"`), honouring commas inside quotes; empty members are dropped.
pub fn parse_etag_list(header: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in header.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ',' if !quoted => {
                let t = cur.trim();
                if !t.is_empty() {
                    out.push(t.to_string());
                }
                cur.clear();
            }
            _ => cur.push(c),
        }
    }
    let t = cur.trim();
    if !t.is_empty() {
        out.push(t.to_string());
    }
    out
}

/// Result of a successful [`Store::kv_put`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutOutcome {
    /// ETag of the stored value (a quoted strong tag).
    pub etag: String,
    /// When it expires, Unix milliseconds (`None`: never).
    pub expires_at_ms: Option<u64>,
    /// Whether the key was absent (or expired) before.
    pub created: bool,
}

/// One stored value, as [`Store::kv_get`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The raw value.
    pub value: Vec<u8>,
    /// Its ETag (a quoted strong tag).
    pub etag: String,
    /// When it expires, Unix milliseconds (`None`: never).
    pub expires_at_ms: Option<u64>,
}

/// One key of a listing page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedKey {
    /// The key.
    pub key: String,
    /// Size of its value, bytes.
    pub size: u64,
    /// Its ETag.
    pub etag: String,
    /// When it expires, Unix milliseconds (`None`: never).
    pub expires_at_ms: Option<u64>,
}

/// One page of [`Store::kv_list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// Keys in byte order.
    pub keys: Vec<ListedKey>,
    /// Opaque cursor of the next page; `None` when nothing follows.
    pub next_cursor: Option<String>,
}

/// Checks a namespace: 1–64 bytes of `[A-Za-z0-9._-]`, not `.` or `..`.
///
/// # Errors
/// [`KvError::InvalidNamespace`] saying what is wrong.
pub fn validate_namespace(ns: &str) -> Result<(), KvError> {
    if ns.is_empty() || ns.len() > MAX_NAMESPACE_BYTES {
        return Err(KvError::InvalidNamespace(format!(
            "a namespace is 1 to {MAX_NAMESPACE_BYTES} bytes, this one is {}",
            ns.len()
        )));
    }
    if ns == "." || ns == ".." {
        return Err(KvError::InvalidNamespace(format!(
            "a namespace may not be {ns:?}"
        )));
    }
    if let Some(c) = ns
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(KvError::InvalidNamespace(format!(
            "a namespace may only hold a-z, A-Z, 0-9, '.', '_' and '-', found {c:?}"
        )));
    }
    Ok(())
}

/// Checks a key: 1–512 bytes of UTF-8 without NUL or control characters below 0x20.
/// Anything else (`/`, `..`, spaces, any Unicode) is allowed: keys are opaque, never
/// paths.
///
/// # Errors
/// [`KvError::InvalidKey`] saying what is wrong.
pub fn validate_key(key: &str) -> Result<(), KvError> {
    if key.is_empty() {
        return Err(KvError::InvalidKey("a key may not be empty".into()));
    }
    check_key_text(key, "key")
}

/// Length and character checks shared by keys and list prefixes.
fn check_key_text(s: &str, what: &str) -> Result<(), KvError> {
    if s.len() > MAX_KEY_BYTES {
        return Err(KvError::InvalidKey(format!(
            "the {what} is {} bytes, the limit is {MAX_KEY_BYTES}",
            s.len()
        )));
    }
    if let Some(b) = s.bytes().find(|&b| b < 0x20) {
        return Err(KvError::InvalidKey(if b == 0 {
            format!("the {what} contains a nul byte")
        } else {
            format!("the {what} contains the control character 0x{b:02x}")
        }));
    }
    Ok(())
}

/// Tenants come from admission (`public`, `key-<hex>`); refuse anything that would
/// break the layout rather than trust it.
fn check_tenant(tenant: &str) -> Result<(), KvError> {
    if tenant.is_empty() || tenant.len() > MAX_TENANT_BYTES || tenant.contains('\0') {
        return Err(KvError::InvalidNamespace(format!(
            "invalid tenant name {tenant:?}"
        )));
    }
    Ok(())
}

fn expiry(ttl_sec: Option<u64>, now_ms: u64) -> Result<Option<u64>, KvError> {
    match ttl_sec {
        None => Ok(None),
        Some(0) => Err(KvError::InvalidTtl(
            "the ttl must be at least 1 second".into(),
        )),
        Some(t) if t > MAX_TTL_SEC => Err(KvError::InvalidTtl(format!(
            "the ttl is {t} seconds, the limit is {MAX_TTL_SEC} (365 days)"
        ))),
        Some(t) => Ok(Some(now_ms.saturating_add(t * 1000).max(1))),
    }
}

/// The quoted strong ETag of a version.
fn etag(version: u64) -> String {
    // By hand: `format!` with `{:016x}` was most of a GET's own formatting.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(18);
    s.push('"');
    for i in (0..16).rev() {
        s.push(char::from(HEX[((version >> (i * 4)) & 0xf) as usize]));
    }
    s.push('"');
    s
}

/// `tenant \0 namespace \0`.
fn ns_prefix(tenant: &str, ns: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(tenant.len() + ns.len() + 2 + MAX_KEY_BYTES);
    k.extend_from_slice(tenant.as_bytes());
    k.push(0);
    k.extend_from_slice(ns.as_bytes());
    k.push(0);
    k
}

fn db_key(tenant: &str, ns: &str, key: &str) -> Vec<u8> {
    let mut k = ns_prefix(tenant, ns);
    k.extend_from_slice(key.as_bytes());
    k
}

fn exp_key(expires_at_ms: u64, db_key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + db_key.len());
    k.extend_from_slice(&expires_at_ms.to_be_bytes());
    k.extend_from_slice(db_key);
    k
}

/// `(tenant, key)` of a db key.
fn split_db_key(db_key: &[u8]) -> Option<(&[u8], &[u8])> {
    let t = db_key.iter().position(|&b| b == 0)?;
    let rest = &db_key[t + 1..];
    let n = rest.iter().position(|&b| b == 0)?;
    Some((&db_key[..t], &rest[n + 1..]))
}

fn corrupt(key: &[u8], what: &str) -> KvError {
    use serde::de::Error as _;
    KvError::Store(StoreError::Corrupt {
        key: String::from_utf8_lossy(key).replace('\0', "/"),
        source: serde_json::Error::custom(what),
    })
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[derive(Debug, Clone, Copy)]
struct Header {
    version: u64,
    expires_at_ms: u64,
    created_at_ms: u64,
    updated_at_ms: u64,
}

impl Header {
    fn live(&self, now_ms: u64) -> bool {
        self.expires_at_ms == 0 || self.expires_at_ms > now_ms
    }

    fn expires(&self) -> Option<u64> {
        (self.expires_at_ms != 0).then_some(self.expires_at_ms)
    }

    fn encode(&self, value: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER_BYTES + value.len());
        for n in [
            self.version,
            self.expires_at_ms,
            self.created_at_ms,
            self.updated_at_ms,
        ] {
            v.extend_from_slice(&n.to_be_bytes());
        }
        v.extend_from_slice(value);
        v
    }

    fn decode<'a>(db_key: &[u8], rec: &'a [u8]) -> Result<(Header, &'a [u8]), KvError> {
        if rec.len() < HEADER_BYTES {
            return Err(corrupt(db_key, "kv record shorter than its header"));
        }
        let h = Header {
            version: be_u64(&rec[0..]),
            expires_at_ms: be_u64(&rec[8..]),
            created_at_ms: be_u64(&rec[16..]),
            updated_at_ms: be_u64(&rec[24..]),
        };
        Ok((h, &rec[HEADER_BYTES..]))
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Usage {
    bytes: u64,
    keys: u64,
}

impl Usage {
    /// Usage with `old` (size of the entry being replaced or removed, if any) taken out
    /// and `new` (size of the entry being written, if any) put in.
    fn replace(self, old: Option<u64>, new: Option<u64>) -> Usage {
        let mut u = self;
        if let Some(o) = old {
            u.bytes = u.bytes.saturating_sub(o);
            u.keys = u.keys.saturating_sub(1);
        }
        if let Some(n) = new {
            u.bytes = u.bytes.saturating_add(n);
            u.keys = u.keys.saturating_add(1);
        }
        u
    }

    /// The first quota this usage exceeds.
    fn over_quota(&self) -> Option<KvError> {
        if self.keys > TENANT_QUOTA_KEYS {
            Some(KvError::Quota {
                what: "keys",
                limit: TENANT_QUOTA_KEYS,
                would_be: self.keys,
            })
        } else if self.bytes > TENANT_QUOTA_BYTES {
            Some(KvError::Quota {
                what: "bytes",
                limit: TENANT_QUOTA_BYTES,
                would_be: self.bytes,
            })
        } else {
            None
        }
    }
}

/// An existing record: its header and value length.
type Existing = Option<(Header, u64)>;

fn encode_cursor(key: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.as_bytes())
}

fn decode_cursor(cursor: &str, prefix: &str) -> Result<String, KvError> {
    if cursor.len() > MAX_CURSOR_CHARS {
        return Err(KvError::BadCursor);
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor.trim_end_matches('='))
        .map_err(|_| KvError::BadCursor)?;
    let key = String::from_utf8(bytes).map_err(|_| KvError::BadCursor)?;
    if validate_key(&key).is_err() || !key.starts_with(prefix) {
        return Err(KvError::BadCursor);
    }
    Ok(key)
}

impl Store {
    /// Stores `value` under `tenant`/`ns`/`key`, replacing any previous value, with an
    /// optional TTL, if `cond` holds. An expired entry counts as absent and its space is
    /// reclaimed. Usage after the write must stay within [`TENANT_QUOTA_BYTES`] (key +
    /// value bytes) and [`TENANT_QUOTA_KEYS`]; replacing counts the difference.
    ///
    /// # Errors
    /// [`KvError::InvalidNamespace`], [`KvError::InvalidKey`], [`KvError::ValueTooLarge`],
    /// [`KvError::InvalidTtl`], [`KvError::PreconditionFailed`], [`KvError::Quota`]
    /// (nothing is changed on any of those), [`KvError::Store`].
    #[allow(clippy::too_many_arguments)]
    pub fn kv_put(
        &self,
        tenant: &str,
        ns: &str,
        key: &str,
        value: &[u8],
        ttl_sec: Option<u64>,
        cond: Precondition,
        now_ms: u64,
    ) -> Result<PutOutcome, KvError> {
        let (weight, op) = self.put_op(tenant, ns, key, value.to_vec(), ttl_sec, cond, now_ms)?;
        self.write(weight, op)
    }

    /// [`Store::kv_put`] without waiting: `then` gets the result, at once when the
    /// request is invalid or the writer's queue is full, otherwise from the writer
    /// thread once the write is durable.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_put_then(
        &self,
        tenant: &str,
        ns: &str,
        key: &str,
        value: Vec<u8>,
        ttl_sec: Option<u64>,
        cond: Precondition,
        now_ms: u64,
        then: impl FnOnce(Result<PutOutcome, KvError>) + Send + 'static,
    ) {
        match self.put_op(tenant, ns, key, value, ttl_sec, cond, now_ms) {
            Ok((weight, op)) => self.write_then(weight, op, then),
            Err(e) => then(Err(e)),
        }
    }

    /// Checks a put and makes the write that does it.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn put_op(
        &self,
        tenant: &str,
        ns: &str,
        key: &str,
        value: Vec<u8>,
        ttl_sec: Option<u64>,
        cond: Precondition,
        now_ms: u64,
    ) -> Result<
        (
            usize,
            impl FnOnce(&Tables, &mut WriteTxn<'_, '_>) -> Result<PutOutcome, KvError> + Send + 'static,
        ),
        KvError,
    > {
        check_tenant(tenant)?;
        validate_namespace(ns)?;
        validate_key(key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(KvError::ValueTooLarge {
                limit: MAX_VALUE_BYTES,
            });
        }
        let expires_at_ms = expiry(ttl_sec, now_ms)?;
        let dbk = db_key(tenant, ns, key);
        self.check_fits(&dbk)?;
        let (tenant, key_len) = (tenant.to_string(), key.len());
        let weight = dbk.len() + value.len();
        Ok((weight, move |t: &Tables, wtxn: &mut WriteTxn<'_, '_>| {
            t.put_in(
                wtxn,
                &tenant,
                &dbk,
                key_len,
                &value,
                expires_at_ms,
                &cond,
                now_ms,
            )
        }))
    }

    /// Deletes `tenant`/`ns`/`key` if `cond` holds. Returns whether a live entry
    /// existed (an expired one is removed too, but counts as absent).
    ///
    /// # Errors
    /// [`KvError::InvalidNamespace`], [`KvError::InvalidKey`],
    /// [`KvError::PreconditionFailed`] (nothing deleted), [`KvError::Store`].
    pub fn kv_delete(
        &self,
        tenant: &str,
        ns: &str,
        key: &str,
        cond: Precondition,
        now_ms: u64,
    ) -> Result<bool, KvError> {
        let op = self.delete_op(tenant, ns, key, cond, now_ms)?;
        self.write(0, op)
    }

    /// [`Store::kv_delete`] without waiting, as [`Store::kv_put_then`].
    pub fn kv_delete_then(
        &self,
        tenant: &str,
        ns: &str,
        key: &str,
        cond: Precondition,
        now_ms: u64,
        then: impl FnOnce(Result<bool, KvError>) + Send + 'static,
    ) {
        match self.delete_op(tenant, ns, key, cond, now_ms) {
            Ok(op) => self.write_then(0, op, then),
            Err(e) => then(Err(e)),
        }
    }

    /// Checks a delete and makes the write that does it.
    fn delete_op(
        &self,
        tenant: &str,
        ns: &str,
        key: &str,
        cond: Precondition,
        now_ms: u64,
    ) -> Result<
        impl FnOnce(&Tables, &mut WriteTxn<'_, '_>) -> Result<bool, KvError> + Send + 'static,
        KvError,
    > {
        check_tenant(tenant)?;
        validate_namespace(ns)?;
        validate_key(key)?;
        let dbk = db_key(tenant, ns, key);
        self.check_fits(&dbk)?;
        let (tenant, key_len) = (tenant.to_string(), key.len() as u64);
        Ok(move |t: &Tables, wtxn: &mut WriteTxn<'_, '_>| {
            let old = t.existing(wtxn, &dbk)?;
            let live = old.filter(|(h, _)| h.live(now_ms));
            if !cond.holds(live.map(|(h, _)| etag(h.version)).as_deref()) {
                return Err(KvError::PreconditionFailed);
            }
            if let Some((h, vlen)) = old {
                t.kv.delete(wtxn, &dbk)?;
                if h.expires_at_ms != 0 {
                    t.kv_exp.delete(wtxn, &exp_key(h.expires_at_ms, &dbk))?;
                }
                let usage = t.read_usage(wtxn, tenant.as_bytes())?;
                let after = usage.replace(Some(key_len + vlen), None);
                t.write_usage(wtxn, tenant.as_bytes(), after)?;
            }
            Ok(live.is_some())
        })
    }

    /// Removes up to `max` expired entries (oldest expiry first) in one transaction,
    /// fixing their tenants' usage. Returns how many were removed.
    ///
    /// # Errors
    /// [`KvError::Store`].
    pub fn kv_purge_expired(&self, now_ms: u64, max: usize) -> Result<usize, KvError> {
        if max == 0 {
            return Ok(0);
        }
        self.write(0, move |t, wtxn| {
            t.purge_in(wtxn, now_ms, max, None, None, usize::MAX)
        })
    }
}

impl Tables {
    /// Reads `tenant`/`ns`/`key`; `None` when absent or expired.
    ///
    /// # Errors
    /// [`KvError::InvalidNamespace`], [`KvError::InvalidKey`], [`KvError::Store`].
    pub fn kv_get(
        &self,
        tenant: &str,
        ns: &str,
        key: &str,
        now_ms: u64,
    ) -> Result<Option<Entry>, KvError> {
        check_tenant(tenant)?;
        validate_namespace(ns)?;
        validate_key(key)?;
        let dbk = db_key(tenant, ns, key);
        self.check_fits(&dbk)?;
        let rtxn = self.env.read_txn()?;
        let Some(rec) = self.kv.get(&rtxn, &dbk)? else {
            return Ok(None);
        };
        let (h, value) = Header::decode(&dbk, rec)?;
        if !h.live(now_ms) {
            return Ok(None);
        }
        Ok(Some(Entry {
            value: value.to_vec(),
            etag: etag(h.version),
            expires_at_ms: h.expires(),
        }))
    }

    /// Lists the live keys of `tenant`/`ns` that start with `prefix`, in byte order, at
    /// most `limit` (clamped to 1..=[`MAX_LIST_LIMIT`]) of them, starting strictly after
    /// the key `cursor` names. The cursor is base64url of the last key returned, so
    /// pages stay correct while keys come and go: a key present throughout is listed
    /// exactly once, and keys never repeat.
    ///
    /// # Errors
    /// [`KvError::InvalidNamespace`], [`KvError::InvalidKey`] (bad prefix),
    /// [`KvError::BadCursor`] (not base64url, not UTF-8, not a key under `prefix`),
    /// [`KvError::Store`].
    pub fn kv_list(
        &self,
        tenant: &str,
        ns: &str,
        prefix: &str,
        limit: usize,
        cursor: Option<&str>,
        now_ms: u64,
    ) -> Result<ListPage, KvError> {
        check_tenant(tenant)?;
        validate_namespace(ns)?;
        check_key_text(prefix, "prefix")?;
        let limit = limit.clamp(1, MAX_LIST_LIMIT);
        let base = ns_prefix(tenant, ns);
        let mut scope = base.clone();
        scope.extend_from_slice(prefix.as_bytes());
        let after = match cursor {
            Some(c) => {
                let key = decode_cursor(c, prefix)?;
                let mut k = base.clone();
                k.extend_from_slice(key.as_bytes());
                Some(k)
            }
            None => None,
        };
        let start = match &after {
            Some(k) => Bound::Excluded(k.as_slice()),
            None => Bound::Included(scope.as_slice()),
        };
        match start {
            Bound::Included(k) | Bound::Excluded(k) => self.check_fits(k)?,
            Bound::Unbounded => {}
        }
        let rtxn = self.env.read_txn()?;
        let mut keys = Vec::new();
        let mut more = false;
        for item in self.kv.range(&rtxn, &(start, Bound::Unbounded))? {
            let (k, rec) = item?;
            if !k.starts_with(&scope) {
                break;
            }
            let (h, value) = Header::decode(k, rec)?;
            if !h.live(now_ms) {
                continue;
            }
            if keys.len() == limit {
                more = true;
                break;
            }
            let key = std::str::from_utf8(&k[base.len()..])
                .map_err(|_| corrupt(k, "kv key is not utf-8"))?;
            keys.push(ListedKey {
                key: key.to_string(),
                size: value.len() as u64,
                etag: etag(h.version),
                expires_at_ms: h.expires(),
            });
        }
        let next_cursor = if more {
            keys.last().map(|k| encode_cursor(&k.key))
        } else {
            None
        };
        Ok(ListPage { keys, next_cursor })
    }

    /// A tenant's usage: (key + value bytes, keys), expired-but-unpurged entries
    /// included.
    ///
    /// # Errors
    /// [`KvError::Store`].
    pub fn kv_usage(&self, tenant: &str) -> Result<(u64, u64), KvError> {
        let rtxn = self.env.read_txn()?;
        let u = self.read_usage(&rtxn, tenant.as_bytes())?;
        Ok((u.bytes, u.keys))
    }

    /// Refuses db keys LMDB cannot hold (with the 8-byte expiry prefix).
    fn check_fits(&self, db_key: &[u8]) -> Result<(), KvError> {
        let max = self.env.max_key_size();
        if db_key.len() + 8 > max {
            return Err(KvError::InvalidKey(format!(
                "the key is too long for this store: tenant, namespace and key together \
                 may take {} bytes here (lmdb must be built with longer keys)",
                max.saturating_sub(10)
            )));
        }
        Ok(())
    }

    fn existing(&self, txn: &RoTxn, db_key: &[u8]) -> Result<Existing, KvError> {
        match self.kv.get(txn, db_key)? {
            Some(rec) => {
                let (h, v) = Header::decode(db_key, rec)?;
                Ok(Some((h, v.len() as u64)))
            }
            None => Ok(None),
        }
    }

    /// The put, inside `wtxn` (the caller commits, or drops it on error).
    #[allow(clippy::too_many_arguments)]
    fn put_in(
        &self,
        wtxn: &mut WriteTxn<'_, '_>,
        tenant: &str,
        db_key: &[u8],
        key_len: usize,
        value: &[u8],
        expires_at_ms: Option<u64>,
        cond: &Precondition,
        now_ms: u64,
    ) -> Result<PutOutcome, KvError> {
        let old = self.existing(wtxn, db_key)?;
        let live = old.filter(|(h, _)| h.live(now_ms));
        if !cond.holds(live.map(|(h, _)| etag(h.version)).as_deref()) {
            return Err(KvError::PreconditionFailed);
        }
        let old_size = old.map(|(_, vlen)| key_len as u64 + vlen);
        let new_size = (key_len + value.len()) as u64;
        let t = tenant.as_bytes();
        let mut after = self.read_usage(wtxn, t)?.replace(old_size, Some(new_size));
        if after.over_quota().is_some() {
            // Expired entries must not cause a refusal: reclaim this tenant's first
            // (all of it is rolled back with the refusal).
            let mut only = t.to_vec();
            only.push(0);
            let n = self.purge_in(
                wtxn,
                now_ms,
                usize::MAX,
                Some(&only),
                Some(db_key),
                QUOTA_PURGE_SCAN,
            )?;
            if n > 0 {
                after = self.read_usage(wtxn, t)?.replace(old_size, Some(new_size));
            }
            if let Some(e) = after.over_quota() {
                return Err(e);
            }
        }
        let version = self.next_version(wtxn)?;
        let h = Header {
            version,
            expires_at_ms: expires_at_ms.unwrap_or(0),
            created_at_ms: live.map_or(now_ms, |(h, _)| h.created_at_ms),
            updated_at_ms: now_ms,
        };
        if let Some((oh, _)) = old {
            if oh.expires_at_ms != 0 && oh.expires_at_ms != h.expires_at_ms {
                self.kv_exp
                    .delete(wtxn, &exp_key(oh.expires_at_ms, db_key))?;
            }
        }
        self.kv.put(wtxn, db_key, &h.encode(value))?;
        if h.expires_at_ms != 0 {
            self.kv_exp
                .put(wtxn, &exp_key(h.expires_at_ms, db_key), &[])?;
        }
        self.write_usage(wtxn, t, after)?;
        Ok(PutOutcome {
            etag: etag(version),
            expires_at_ms,
            created: live.is_none(),
        })
    }

    /// Removes expired entries inside `wtxn`: at most `max` of them, looking at most at
    /// `scan` index entries, only those under `only` (a `tenant \0` prefix) if given and
    /// never `skip`. Returns how many entries were removed.
    fn purge_in(
        &self,
        wtxn: &mut WriteTxn<'_, '_>,
        now_ms: u64,
        max: usize,
        only: Option<&[u8]>,
        skip: Option<&[u8]>,
        scan: usize,
    ) -> Result<usize, KvError> {
        let mut victims: Vec<Vec<u8>> = Vec::new();
        for (scanned, item) in self.kv_exp.iter(wtxn)?.enumerate() {
            if scanned >= scan || victims.len() >= max {
                break;
            }
            let (k, _) = item?;
            if k.len() < 8 {
                victims.push(k.to_vec()); // garbage: drop it
                continue;
            }
            if be_u64(k) > now_ms {
                break;
            }
            let dbk = &k[8..];
            if only.is_some_and(|p| !dbk.starts_with(p)) || skip == Some(dbk) {
                continue;
            }
            victims.push(k.to_vec());
        }
        let mut usage: HashMap<Vec<u8>, Usage> = HashMap::new();
        let mut removed = 0;
        for ek in &victims {
            self.kv_exp.delete(wtxn, ek)?;
            if ek.len() < 8 {
                continue;
            }
            let dbk = &ek[8..];
            let Some((h, vlen)) = self.existing(wtxn, dbk)? else {
                continue;
            };
            if h.expires_at_ms != be_u64(ek) {
                continue; // a stale index entry; the record has another expiry
            }
            let Some((tenant, key)) = split_db_key(dbk) else {
                return Err(corrupt(dbk, "kv key without its separators"));
            };
            self.kv.delete(wtxn, dbk)?;
            let u = match usage.get(tenant) {
                Some(u) => *u,
                None => self.read_usage(wtxn, tenant)?,
            };
            usage.insert(
                tenant.to_vec(),
                u.replace(Some(key.len() as u64 + vlen), None),
            );
            removed += 1;
        }
        for (t, u) in usage {
            self.write_usage(wtxn, &t, u)?;
        }
        Ok(removed)
    }

    fn next_version(&self, wtxn: &mut WriteTxn<'_, '_>) -> Result<u64, KvError> {
        let cur = match self.meta.get(wtxn, VERSION_KEY)? {
            Some(b) if b.len() == 8 => le_u64(b),
            Some(_) => return Err(corrupt(VERSION_KEY.as_bytes(), "bad kv version counter")),
            None => 0,
        };
        let next = cur + 1;
        self.meta.put(wtxn, VERSION_KEY, &next.to_le_bytes())?;
        Ok(next)
    }

    fn read_usage(&self, txn: &RoTxn, tenant: &[u8]) -> Result<Usage, KvError> {
        match self.kv_usage.get(txn, tenant)? {
            Some(b) if b.len() == 16 => Ok(Usage {
                bytes: le_u64(&b[0..]),
                keys: le_u64(&b[8..]),
            }),
            Some(_) => Err(corrupt(tenant, "bad kv usage record")),
            None => Ok(Usage::default()),
        }
    }

    fn write_usage(
        &self,
        wtxn: &mut WriteTxn<'_, '_>,
        tenant: &[u8],
        u: Usage,
    ) -> Result<(), KvError> {
        if u == Usage::default() {
            self.kv_usage.delete(wtxn, tenant)?;
        } else {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&u.bytes.to_le_bytes());
            b[8..].copy_from_slice(&u.keys.to_le_bytes());
            self.kv_usage.put(wtxn, tenant, &b)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    #[test]
    fn test_an_etag_is_the_version_in_sixteen_hex_digits_quoted() {
        for v in [0, 1, 0xa, 0xdead_beef, 1 << 63, u64::MAX - 1, u64::MAX] {
            assert_eq!(etag(v), format!("\"{v:016x}\""));
        }
        assert_eq!(etag(0x0123_4567_89ab_cdef), "\"0123456789abcdef\"");
    }

    /// A store in its own temp dir, removed on drop.
    struct TempStore {
        store: Option<Store>,
        dir: PathBuf,
    }

    impl std::ops::Deref for TempStore {
        type Target = Store;
        fn deref(&self) -> &Store {
            self.store.as_ref().unwrap()
        }
    }

    impl Drop for TempStore {
        fn drop(&mut self) {
            self.store.take();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn open(name: &str) -> TempStore {
        let dir =
            std::env::temp_dir().join(format!("isobox-kv-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).unwrap();
        TempStore {
            store: Some(store),
            dir,
        }
    }

    const T: &str = "public";
    const NOW: u64 = 1_700_000_000_000;

    fn put(s: &Store, t: &str, ns: &str, k: &str, v: &[u8]) -> PutOutcome {
        s.kv_put(t, ns, k, v, None, Precondition::None, NOW)
            .unwrap()
    }

    fn get(s: &Store, t: &str, ns: &str, k: &str) -> Option<Entry> {
        s.kv_get(t, ns, k, NOW).unwrap()
    }

    /// Many puts in one transaction (one fsync instead of thousands).
    fn put_many(s: &Store, t: &str, ns: &str, keys: &[String], v: &[u8]) {
        let (t, ns, keys, v) = (t.to_string(), ns.to_string(), keys.to_vec(), v.to_vec());
        s.write(0, move |tables, wtxn| -> Result<(), KvError> {
            for k in &keys {
                let dbk = db_key(&t, &ns, k);
                tables.put_in(wtxn, &t, &dbk, k.len(), &v, None, &Precondition::None, NOW)?;
            }
            Ok(())
        })
        .unwrap();
    }

    /// Every key of a namespace, paging through.
    fn list_all(s: &Store, t: &str, ns: &str, now: u64) -> Vec<ListedKey> {
        let mut out = Vec::new();
        let mut cursor = None;
        loop {
            let page = s
                .kv_list(t, ns, "", MAX_LIST_LIMIT, cursor.as_deref(), now)
                .unwrap();
            out.extend(page.keys);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return out,
            }
        }
    }

    fn version_of(etag: &str) -> u64 {
        assert!(etag.len() == 18 && etag.starts_with('"') && etag.ends_with('"'));
        u64::from_str_radix(&etag[1..17], 16).unwrap()
    }

    fn quota_err(e: KvError) -> (&'static str, u64, u64) {
        match e {
            KvError::Quota {
                what,
                limit,
                would_be,
            } => (what, limit, would_be),
            e => panic!("expected a quota error, got {e:?}"),
        }
    }

    fn exp_index_len(s: &Store) -> u64 {
        let rtxn = s.env.read_txn().unwrap();
        s.kv_exp.len(&rtxn).unwrap()
    }

    /// Usage equals the sum over stored records (expired ones included), for a tenant.
    fn assert_usage_consistent(s: &Store, t: &str) {
        let rtxn = s.env.read_txn().unwrap();
        let mut prefix = t.as_bytes().to_vec();
        prefix.push(0);
        let (mut bytes, mut keys) = (0u64, 0u64);
        for item in s.kv.prefix_iter(&rtxn, &prefix).unwrap() {
            let (k, rec) = item.unwrap();
            let (_, key) = split_db_key(k).unwrap();
            bytes += (key.len() + rec.len() - HEADER_BYTES) as u64;
            keys += 1;
        }
        drop(rtxn);
        assert_eq!(s.kv_usage(t).unwrap(), (bytes, keys), "usage of {t}");
    }

    #[test]
    fn test_roundtrip_etags_and_monotonic_versions() {
        let s = open("roundtrip");
        let p1 = put(&s, T, "ns", "k", b"one");
        assert!(p1.created);
        assert_eq!(p1.expires_at_ms, None);
        let e = get(&s, T, "ns", "k").unwrap();
        assert_eq!(e.value, b"one");
        assert_eq!(e.etag, p1.etag);
        assert_eq!(e.expires_at_ms, None);
        let p2 = put(&s, T, "ns", "k", b"two!");
        assert!(!p2.created);
        assert_ne!(p1.etag, p2.etag);
        assert!(version_of(&p2.etag) > version_of(&p1.etag));
        let p3 = put(&s, T, "ns", "other", b"");
        assert!(
            version_of(&p3.etag) > version_of(&p2.etag),
            "one global counter"
        );
        assert_eq!(get(&s, T, "ns", "other").unwrap().value, b"");
        assert_eq!(get(&s, T, "ns", "k").unwrap().value, b"two!");
        assert_eq!(s.kv_usage(T).unwrap(), (1 + 4 + 5, 2));
        assert!(s.kv_delete(T, "ns", "k", Precondition::None, NOW).unwrap());
        assert!(get(&s, T, "ns", "k").is_none());
        assert!(!s.kv_delete(T, "ns", "k", Precondition::None, NOW).unwrap());
        let p4 = put(&s, T, "ns", "k", b"again");
        assert!(p4.created);
        assert!(version_of(&p4.etag) > version_of(&p3.etag));
        assert!(s.kv_delete(T, "ns", "k", Precondition::None, NOW).unwrap());
        assert!(s
            .kv_delete(T, "ns", "other", Precondition::None, NOW)
            .unwrap());
        assert_eq!(s.kv_usage(T).unwrap(), (0, 0));
        let page = s.kv_list(T, "ns", "", 10, None, NOW).unwrap();
        assert!(page.keys.is_empty() && page.next_cursor.is_none());
    }

    #[test]
    fn test_ttl_expiry_purge_and_usage() {
        let s = open("ttl");
        let p = s
            .kv_put(
                T,
                "n",
                "tmp",
                b"soon gone",
                Some(10),
                Precondition::None,
                1_000,
            )
            .unwrap();
        assert_eq!(p.expires_at_ms, Some(11_000));
        let e = s.kv_get(T, "n", "tmp", 10_999).unwrap().unwrap();
        assert_eq!(e.expires_at_ms, Some(11_000));
        assert!(s.kv_get(T, "n", "tmp", 11_000).unwrap().is_none());
        assert_eq!(
            s.kv_list(T, "n", "", 10, None, 10_999).unwrap().keys.len(),
            1
        );
        assert!(s
            .kv_list(T, "n", "", 10, None, 11_000)
            .unwrap()
            .keys
            .is_empty());
        // Still occupying usage until purged.
        assert_eq!(s.kv_usage(T).unwrap(), (3 + 9, 1));
        assert_eq!(s.kv_purge_expired(10_999, 100).unwrap(), 0);
        assert_eq!(s.kv_purge_expired(11_000, 100).unwrap(), 1);
        assert_eq!(s.kv_usage(T).unwrap(), (0, 0));
        assert_eq!(exp_index_len(&s), 0);

        // An expired entry is absent for preconditions and reclaimed by the put.
        s.kv_put(
            T,
            "n",
            "k",
            b"old value",
            Some(1),
            Precondition::None,
            1_000,
        )
        .unwrap();
        let star = Precondition::IfNoneMatch(vec!["*".into()]);
        let p = s
            .kv_put(T, "n", "k", b"new", None, star.clone(), 2_000)
            .unwrap();
        assert!(p.created);
        assert_eq!(p.expires_at_ms, None);
        assert_eq!(s.kv_usage(T).unwrap(), (1 + 3, 1));
        assert_eq!(exp_index_len(&s), 0, "the old expiry is unindexed");
        assert_eq!(s.kv_purge_expired(u64::MAX, 100).unwrap(), 0);
        assert_eq!(
            s.kv_get(T, "n", "k", u64::MAX).unwrap().unwrap().value,
            b"new"
        );
        // Expired and deleted: reported absent, space reclaimed.
        s.kv_put(T, "n", "d", b"x", Some(1), Precondition::None, 1_000)
            .unwrap();
        assert!(!s.kv_delete(T, "n", "d", Precondition::None, 5_000).unwrap());
        assert_eq!(s.kv_usage(T).unwrap(), (1 + 3, 1));
        assert_eq!(exp_index_len(&s), 0);
        // Re-putting with a new TTL moves its index entry.
        s.kv_put(T, "n", "m", b"1", Some(5), Precondition::None, 1_000)
            .unwrap();
        s.kv_put(T, "n", "m", b"2", Some(50), Precondition::None, 1_000)
            .unwrap();
        assert_eq!(exp_index_len(&s), 1);
        assert_eq!(s.kv_purge_expired(10_000, 100).unwrap(), 0);
        assert_eq!(s.kv_get(T, "n", "m", 10_000).unwrap().unwrap().value, b"2");
        assert_eq!(s.kv_purge_expired(51_000, 100).unwrap(), 1);

        // The purge respects `max` and goes oldest first, across tenants.
        for i in 0..5u64 {
            let t = if i % 2 == 0 { "ta" } else { "tb" };
            s.kv_put(
                t,
                "n",
                &format!("e{i}"),
                b"vv",
                Some(i + 1),
                Precondition::None,
                0,
            )
            .unwrap();
        }
        assert_eq!(s.kv_purge_expired(10_000, 2).unwrap(), 2);
        assert!(s.kv_get("ta", "n", "e0", 0).unwrap().is_none());
        assert!(s.kv_get("tb", "n", "e1", 0).unwrap().is_none());
        assert!(s.kv_get("ta", "n", "e2", 0).unwrap().is_some());
        assert_eq!(s.kv_purge_expired(10_000, 0).unwrap(), 0);
        assert_eq!(s.kv_purge_expired(10_000, 100).unwrap(), 3);
        assert_eq!(s.kv_usage("ta").unwrap(), (0, 0));
        assert_eq!(s.kv_usage("tb").unwrap(), (0, 0));
        assert_usage_consistent(&s, T);

        // TTL bounds.
        for bad in [0, MAX_TTL_SEC + 1] {
            let e = s.kv_put(T, "n", "t", b"x", Some(bad), Precondition::None, NOW);
            assert!(matches!(e, Err(KvError::InvalidTtl(_))), "{bad}: {e:?}");
        }
        let p = s
            .kv_put(
                T,
                "n",
                "t",
                b"x",
                Some(MAX_TTL_SEC),
                Precondition::None,
                NOW,
            )
            .unwrap();
        assert_eq!(p.expires_at_ms, Some(NOW + MAX_TTL_SEC * 1000));
    }

    #[test]
    fn test_precondition_matrix() {
        let s = open("cond");
        let im = |v: &[&str]| Precondition::IfMatch(v.iter().map(|s| s.to_string()).collect());
        let inm = |v: &[&str]| Precondition::IfNoneMatch(v.iter().map(|s| s.to_string()).collect());
        let put_c = |k: &str, v: &[u8], c: Precondition| s.kv_put(T, "c", k, v, None, c, NOW);
        let pf = |r: Result<PutOutcome, KvError>| matches!(r, Err(KvError::PreconditionFailed));

        // Absent key: If-Match anything fails, If-None-Match anything passes.
        assert!(pf(put_c("k", b"x", im(&["*"]))));
        assert!(pf(put_c("k", b"x", im(&["\"0000000000000001\""]))));
        assert!(get(&s, T, "c", "k").is_none());
        let e1 = put_c("k", b"v1", inm(&["*"])).unwrap().etag;
        // Present: If-None-Match * fails, with a matching tag fails, with others passes.
        assert!(pf(put_c("k", b"x", inm(&["*"]))));
        assert!(pf(put_c("k", b"x", inm(&[&e1]))));
        assert!(pf(put_c("k", b"x", inm(&["\"nope\"", &e1]))));
        assert!(
            pf(put_c("k", b"x", inm(&[&format!("W/{e1}")]))),
            "weak comparison"
        );
        assert_eq!(get(&s, T, "c", "k").unwrap().value, b"v1");
        let e2 = put_c("k", b"v2", inm(&["\"nope\""])).unwrap().etag;
        // If-Match: the current tag (alone or in a list), or *.
        assert!(pf(put_c("k", b"x", im(&[&e1]))), "stale tag");
        assert!(
            pf(put_c("k", b"x", im(&[&format!("W/{e2}")]))),
            "strong comparison"
        );
        let e3 = put_c("k", b"v3", im(&[&e2])).unwrap().etag;
        let e4 = put_c("k", b"v4", im(&["\"nope\"", &e3])).unwrap().etag;
        let e5 = put_c("k", b"v5", im(&["*"])).unwrap().etag;
        assert!(pf(put_c("k", b"x", im(&[]))), "empty list matches nothing");
        assert_eq!(get(&s, T, "c", "k").unwrap().value, b"v5");
        // Quotes optional.
        let e6 = put_c("k", b"v6", im(&[e5.trim_matches('"')])).unwrap().etag;
        assert!(e4 != e5 && e5 != e6);
        // GET 304 logic.
        assert!(!inm(&[&e6]).holds(Some(&e6)));
        assert!(inm(&[&e5]).holds(Some(&e6)));
        assert!(inm(&["*"]).holds(None));
        // DELETE.
        let del = |c| s.kv_delete(T, "c", "k", c, NOW);
        assert!(matches!(del(im(&[&e5])), Err(KvError::PreconditionFailed)));
        assert!(matches!(del(inm(&["*"])), Err(KvError::PreconditionFailed)));
        assert!(get(&s, T, "c", "k").is_some());
        assert!(del(im(&["\"x\"", &e6])).unwrap());
        assert!(matches!(del(im(&["*"])), Err(KvError::PreconditionFailed)));
        assert!(!del(inm(&["*"])).unwrap());
        // Expired counts as absent.
        s.kv_put(T, "c", "t", b"x", Some(1), Precondition::None, 0)
            .unwrap();
        assert!(matches!(
            s.kv_put(T, "c", "t", b"y", None, im(&["*"]), 5_000),
            Err(KvError::PreconditionFailed)
        ));
        assert!(
            s.kv_put(T, "c", "t", b"y", None, inm(&["*"]), 5_000)
                .unwrap()
                .created
        );
        assert_usage_consistent(&s, T);
        // Header parsing.
        assert_eq!(
            parse_etag_list(" \"a\", W/\"b,c\" ,*,, "),
            ["\"a\"", "W/\"b,c\"", "*"]
        );
        assert!(parse_etag_list("  ").is_empty());
    }

    #[test]
    fn test_quota_bytes_at_below_and_above() {
        let s = open("qbytes");
        let mib = 1usize << 20;
        // Ten keys of 2 bytes + (1 MiB - 2) bytes each: exactly 10 MiB.
        for i in 0..9 {
            put(&s, T, "q", &format!("k{i}"), &vec![b'q'; mib - 2]);
            assert_eq!(s.kv_usage(T).unwrap().0, ((i + 1) * mib) as u64);
        }
        put(&s, T, "q", "k9", &vec![b'q'; mib - 2]);
        assert_eq!(s.kv_usage(T).unwrap(), (TENANT_QUOTA_BYTES, 10));
        // One byte more is refused, and nothing changes.
        let e = s
            .kv_put(T, "q", "x", b"", None, Precondition::None, NOW)
            .unwrap_err();
        assert!(e.to_string().contains("bytes"), "{e}");
        assert_eq!(
            quota_err(e),
            ("bytes", TENANT_QUOTA_BYTES, TENANT_QUOTA_BYTES + 1)
        );
        let e = s
            .kv_put(
                T,
                "q",
                "k0",
                &vec![b'r'; mib - 1],
                None,
                Precondition::None,
                NOW,
            )
            .unwrap_err();
        assert_eq!(
            quota_err(e),
            ("bytes", TENANT_QUOTA_BYTES, TENANT_QUOTA_BYTES + 1)
        );
        assert!(get(&s, T, "q", "x").is_none());
        assert_eq!(get(&s, T, "q", "k0").unwrap().value[0], b'q');
        assert_eq!(s.kv_usage(T).unwrap(), (TENANT_QUOTA_BYTES, 10));
        // Replacing within the quota works (same size, then smaller).
        put(&s, T, "q", "k0", &vec![b'r'; mib - 2]);
        assert_eq!(get(&s, T, "q", "k0").unwrap().value[0], b'r');
        put(&s, T, "q", "k0", &vec![b's'; mib - 12]);
        assert_eq!(s.kv_usage(T).unwrap(), (TENANT_QUOTA_BYTES - 10, 10));
        put(&s, T, "q", "x", b"123456789"); // 1 + 9: exactly full again
        assert_eq!(s.kv_usage(T).unwrap(), (TENANT_QUOTA_BYTES, 11));
        // Other tenants have their own quota.
        put(&s, "other", "q", "k0", &vec![b'o'; mib - 2]);
        // Expired entries never cause a refusal: the put reclaims them first.
        assert!(s.kv_delete(T, "q", "k9", Precondition::None, NOW).unwrap());
        s.kv_put(
            T,
            "q",
            "k9",
            &vec![b'q'; mib - 2],
            Some(1),
            Precondition::None,
            NOW,
        )
        .unwrap();
        let late = NOW + 5_000;
        s.kv_put(
            T,
            "q",
            "new",
            &vec![b'n'; mib - 3],
            None,
            Precondition::None,
            late,
        )
        .unwrap();
        assert!(s.kv_get(T, "q", "k9", late).unwrap().is_none());
        assert_eq!(s.kv_usage(T).unwrap(), (TENANT_QUOTA_BYTES, 11));
        assert_usage_consistent(&s, T);
        assert_usage_consistent(&s, "other");
    }

    #[test]
    fn test_quota_keys_at_below_and_above() {
        let s = open("qkeys");
        let keys: Vec<String> = (0..TENANT_QUOTA_KEYS).map(|i| format!("k{i:05}")).collect();
        put_many(&s, T, "a", &keys[..9_999], b"v");
        assert_eq!(s.kv_usage(T).unwrap(), (9_999 * 7, 9_999));
        put(&s, T, "b", &keys[9_999], b"v"); // the 10 000th, in another namespace
        assert_eq!(s.kv_usage(T).unwrap(), (10_000 * 7, 10_000));
        let e = s
            .kv_put(T, "a", "one-more", b"v", None, Precondition::None, NOW)
            .unwrap_err();
        assert!(e.to_string().contains("keys"), "{e}");
        assert_eq!(
            quota_err(e),
            ("keys", TENANT_QUOTA_KEYS, TENANT_QUOTA_KEYS + 1)
        );
        assert!(get(&s, T, "a", "one-more").is_none());
        // Replacing still works; after a delete a new key fits.
        put(&s, T, "a", "k00000", b"replaced");
        assert!(s
            .kv_delete(T, "a", "k00001", Precondition::None, NOW)
            .unwrap());
        put(&s, T, "a", "one-more", b"v");
        assert_eq!(s.kv_usage(T).unwrap().1, TENANT_QUOTA_KEYS);
        put(&s, "other", "a", "k", b"v");
        assert_usage_consistent(&s, T);
    }

    #[test]
    fn test_k2_concurrent_writers_respect_the_quota() {
        let s = open("k2");
        let refused = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for i in 0..50 {
                let s = &s;
                let refused = &refused;
                sc.spawn(move || {
                    let key = format!("key{i:02}");
                    let (used, _) = s.kv_usage(T).unwrap();
                    let share = (TENANT_QUOTA_BYTES - used) / 10;
                    let len = (share as usize)
                        .saturating_sub(key.len())
                        .min(MAX_VALUE_BYTES);
                    match s.kv_put(
                        T,
                        "k2",
                        &key,
                        &vec![i as u8; len],
                        None,
                        Precondition::None,
                        NOW,
                    ) {
                        Ok(_) => {}
                        Err(KvError::Quota { what: "bytes", .. }) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                });
            }
        });
        let listed = list_all(&s, T, "k2", NOW);
        let total: u64 = listed.iter().map(|k| k.key.len() as u64 + k.size).sum();
        assert!(total <= TENANT_QUOTA_BYTES, "{total}");
        assert_eq!(s.kv_usage(T).unwrap(), (total, listed.len() as u64));
        assert_eq!(listed.len() + refused.load(Ordering::Relaxed), 50);
        assert_usage_consistent(&s, T);
    }

    #[test]
    fn test_k5_concurrent_writers_one_key() {
        let s = open("k5");
        let values: Vec<Vec<u8>> = (0..100u32)
            .map(|i| {
                let mut v = vec![(i % 251) as u8; 64 << 10];
                v[..4].copy_from_slice(&i.to_be_bytes());
                v
            })
            .collect();
        let etags: Vec<String> = std::thread::scope(|sc| {
            let handles: Vec<_> = values
                .iter()
                .map(|v| {
                    let s = &s;
                    sc.spawn(move || put(s, T, "k5", "hot", v).etag)
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let e = get(&s, T, "k5", "hot").unwrap();
        assert_eq!(values.iter().filter(|v| **v == e.value).count(), 1);
        // The last writer wins: its tag is the highest.
        let last = etags.iter().max_by_key(|t| version_of(t)).unwrap();
        assert_eq!(&e.etag, last);
        let distinct: BTreeSet<_> = etags.iter().collect();
        assert_eq!(distinct.len(), 100);
        assert_eq!(s.kv_usage(T).unwrap(), (3 + (64 << 10), 1));
        assert_usage_consistent(&s, T);
    }

    #[test]
    fn test_pagination_while_keys_come_and_go() {
        let s = open("pages");
        let stable: Vec<String> = (0..1000).map(|i| format!("k{i:04}")).collect();
        put_many(&s, T, "p", &stable, b"v");
        put_many(
            &s,
            T,
            "p",
            &["a0".to_string(), "l0".to_string()],
            b"outside the prefix",
        );
        let stop = AtomicBool::new(false);
        let ops = AtomicUsize::new(0);
        let seen = std::thread::scope(|sc| {
            sc.spawn(|| {
                // Adds keys between (and around) the stable ones, then removes them.
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let add = format!("k{:04}x{n}", (n * 7) % 1000);
                    put(&s, T, "p", &add, b"churn");
                    if n >= 3 {
                        let old = format!("k{:04}x{}", ((n - 3) * 7) % 1000, n - 3);
                        assert!(s.kv_delete(T, "p", &old, Precondition::None, NOW).unwrap());
                    }
                    n += 1;
                    ops.store(n, Ordering::Release);
                }
            });
            let mut seen: Vec<String> = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let page = s.kv_list(T, "p", "k", 37, cursor.as_deref(), NOW).unwrap();
                assert!(page.keys.len() <= 37);
                seen.extend(page.keys.into_iter().map(|k| k.key));
                // Let the writer change something before the next page.
                let before = ops.load(Ordering::Acquire);
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                while ops.load(Ordering::Acquire) == before && std::time::Instant::now() < deadline
                {
                    std::thread::yield_now();
                }
                match page.next_cursor {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
            stop.store(true, Ordering::Relaxed);
            seen
        });
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "strictly increasing");
        let originals: Vec<&String> = seen.iter().filter(|k| k.len() == 5).collect();
        assert_eq!(
            originals,
            stable.iter().collect::<Vec<_>>(),
            "each once, in order"
        );
        assert!(seen.iter().all(|k| k.starts_with('k')));
        assert!(
            ops.load(Ordering::Relaxed) >= 27,
            "the writer ran between pages"
        );
        assert_usage_consistent(&s, T);
    }

    #[test]
    fn test_list_limits_prefix_and_cursors() {
        let s = open("list");
        for k in ["a", "ab", "abc", "b", "ba", "c"] {
            put(&s, T, "l", k, k.as_bytes());
        }
        let keys = |p: &ListPage| p.keys.iter().map(|k| k.key.clone()).collect::<Vec<_>>();
        let p = s.kv_list(T, "l", "a", 2, None, NOW).unwrap();
        assert_eq!(keys(&p), ["a", "ab"]);
        let c = p.next_cursor.unwrap();
        let p = s.kv_list(T, "l", "a", 2, Some(&c), NOW).unwrap();
        assert_eq!(keys(&p), ["abc"]);
        assert_eq!(p.next_cursor, None, "nothing after the page");
        assert_eq!(p.keys[0].size, 3);
        // Exactly `limit` keys left: no cursor.
        let p = s.kv_list(T, "l", "b", 2, None, NOW).unwrap();
        assert_eq!(
            (keys(&p), p.next_cursor),
            (vec!["b".into(), "ba".into()], None)
        );
        // Limit clamped to 1..=MAX.
        let p = s.kv_list(T, "l", "", 0, None, NOW).unwrap();
        assert_eq!(keys(&p), ["a"]);
        let p = s.kv_list(T, "l", "", 1_000_000, None, NOW).unwrap();
        assert_eq!(p.keys.len(), 6);
        // A cursor whose key was deleted still works.
        let p = s.kv_list(T, "l", "", 2, None, NOW).unwrap();
        assert!(s.kv_delete(T, "l", "ab", Precondition::None, NOW).unwrap());
        let p = s
            .kv_list(T, "l", "", 2, p.next_cursor.as_deref(), NOW)
            .unwrap();
        assert_eq!(keys(&p), ["abc", "b"]);
        // Expired keys are skipped, also when deciding whether a next page exists.
        s.kv_put(T, "l", "d", b"x", Some(1), Precondition::None, 0)
            .unwrap();
        let p = s.kv_list(T, "l", "c", 1, None, NOW).unwrap();
        assert_eq!((keys(&p), p.next_cursor), (vec!["c".into()], None));
        let p = s.kv_list(T, "l", "", 5, None, NOW).unwrap();
        assert_eq!(p.next_cursor, None);
        // Bad cursors.
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        for bad in [
            "!!!".to_string(),
            String::new(),
            b64(&[0xff, 0xfe]),
            b64(b"zzz"),
            b64(b"a\0b"),
            "A".repeat(2000),
        ] {
            let e = s.kv_list(T, "l", "a", 2, Some(&bad), NOW);
            assert!(matches!(e, Err(KvError::BadCursor)), "{bad:?}: {e:?}");
        }
        // Bad prefixes.
        for bad in ["a\0", "\n", &"p".repeat(513)] {
            let e = s.kv_list(T, "l", bad, 2, None, NOW);
            assert!(matches!(e, Err(KvError::InvalidKey(_))), "{e:?}");
        }
        assert!(matches!(
            s.kv_list(T, "..", "", 2, None, NOW),
            Err(KvError::InvalidNamespace(_))
        ));
    }

    #[test]
    fn test_k3_odd_keys_are_opaque() {
        let s = open("k3");
        let need = T.len() + 2 + MAX_NAMESPACE_BYTES + MAX_KEY_BYTES + 8;
        assert!(
            s.env.max_key_size() >= need,
            "lmdb keys are limited to {} bytes, {need} needed: enable heed's `longer-keys` feature",
            s.env.max_key_size()
        );
        let ns = "n".repeat(MAX_NAMESPACE_BYTES);
        let keys = [
            "../../etc/passwd".to_string(),
            "a/../../b".into(),
            ".".into(),
            "..".into(),
            "/".repeat(500),
            "k".repeat(MAX_KEY_BYTES),
            "é".repeat(MAX_KEY_BYTES / 2),
            "ключ 🙂\u{7f}".into(),
            "%2F%00".into(),
        ];
        for k in &keys {
            let p = put(&s, T, &ns, k, k.as_bytes());
            assert!(p.created, "{k}");
        }
        for k in &keys {
            assert_eq!(get(&s, T, &ns, k).unwrap().value, k.as_bytes(), "{k}");
        }
        let listed: Vec<String> = list_all(&s, T, &ns, NOW)
            .into_iter()
            .map(|k| k.key)
            .collect();
        let mut want = keys.to_vec();
        want.sort();
        assert_eq!(listed, want);
        // Cursors of the longest keys work too.
        let p = s.kv_list(T, &ns, "", 1, None, NOW).unwrap();
        let p = s
            .kv_list(T, &ns, "", 3, p.next_cursor.as_deref(), NOW)
            .unwrap();
        assert_eq!(p.keys.len(), 3);
        let long = "é".repeat(MAX_KEY_BYTES / 2);
        let p = s
            .kv_list(T, &ns, "", 3, Some(&encode_cursor(&long)), NOW)
            .unwrap();
        assert!(p.keys.is_empty() || p.keys[0].key > long);
        assert!(!std::path::Path::new("/etc/passwd.isobox").exists());
        assert_usage_consistent(&s, T);
    }

    #[test]
    fn test_bad_keys_namespaces_and_values_rejected() {
        let s = open("bad");
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        for k in [
            "",
            "a\0b",
            "\0",
            "a\nb",
            "tab\there",
            "\u{1f}",
            long.as_str(),
        ] {
            for e in [
                s.kv_put(T, "n", k, b"x", None, Precondition::None, NOW)
                    .map(|_| ()),
                s.kv_get(T, "n", k, NOW).map(|_| ()),
                s.kv_delete(T, "n", k, Precondition::None, NOW).map(|_| ()),
            ] {
                assert!(matches!(e, Err(KvError::InvalidKey(_))), "{k:?}: {e:?}");
            }
        }
        let long_ns = "n".repeat(MAX_NAMESPACE_BYTES + 1);
        for ns in [
            "",
            ".",
            "..",
            "a/b",
            "a b",
            "a\0b",
            "é",
            "ns%2F",
            long_ns.as_str(),
        ] {
            let e = s.kv_put(T, ns, "k", b"x", None, Precondition::None, NOW);
            assert!(
                matches!(e, Err(KvError::InvalidNamespace(_))),
                "{ns:?}: {e:?}"
            );
            assert!(validate_namespace(ns).is_err());
        }
        for ns in [
            "a",
            "A-Z_0.9",
            "...",
            ".a",
            &"n".repeat(MAX_NAMESPACE_BYTES),
        ] {
            validate_namespace(ns).unwrap();
        }
        let e = s.kv_put(
            T,
            "n",
            "v",
            &vec![0; MAX_VALUE_BYTES + 1],
            None,
            Precondition::None,
            NOW,
        );
        assert!(
            matches!(
                e,
                Err(KvError::ValueTooLarge {
                    limit: MAX_VALUE_BYTES
                })
            ),
            "{e:?}"
        );
        put(&s, T, "n", "v", &vec![0; MAX_VALUE_BYTES]);
        assert!(matches!(
            s.kv_put("bad\0tenant", "n", "k", b"x", None, Precondition::None, NOW),
            Err(KvError::InvalidNamespace(_))
        ));
        assert_eq!(s.kv_usage(T).unwrap(), (1 + MAX_VALUE_BYTES as u64, 1));
        // Messages are lowercase and explicit.
        let errs = [
            validate_key("").unwrap_err(),
            validate_key("a\0").unwrap_err(),
            validate_key(&long).unwrap_err(),
            validate_namespace("..").unwrap_err(),
            validate_namespace("a/b").unwrap_err(),
            KvError::ValueTooLarge { limit: 1 },
            KvError::InvalidTtl("x".into()),
            KvError::PreconditionFailed,
            KvError::BadCursor,
            KvError::Quota {
                what: "keys",
                limit: 1,
                would_be: 2,
            },
        ];
        for e in errs {
            let m = e.to_string();
            assert!(m.starts_with(|c: char| c.is_ascii_lowercase()), "{m}");
        }
        assert!(validate_key(&long).unwrap_err().to_string().contains("513"));
    }

    #[test]
    fn test_tenants_and_namespaces_isolated() {
        let s = open("iso");
        put(&s, "t1", "a", "k", b"t1-a");
        put(&s, "t2", "a", "k", b"t2-a");
        put(&s, "t1", "ab", "k", b"t1-ab");
        put(&s, "t1", "ab", "k2", b"t1-ab-2");
        put(&s, "t", "1", "k", b"t-1"); // `t` is a prefix of `t1`
        put(&s, "t1", "a", "b\u{7f}", b"t1-a-2");
        assert_eq!(get(&s, "t1", "a", "k").unwrap().value, b"t1-a");
        assert_eq!(get(&s, "t2", "a", "k").unwrap().value, b"t2-a");
        assert_eq!(get(&s, "t1", "ab", "k").unwrap().value, b"t1-ab");
        assert_eq!(get(&s, "t", "1", "k").unwrap().value, b"t-1");
        assert!(get(&s, "t2", "ab", "k").is_none());
        let names = |t: &str, ns: &str| -> Vec<String> {
            list_all(&s, t, ns, NOW)
                .into_iter()
                .map(|k| k.key)
                .collect()
        };
        assert_eq!(names("t1", "a"), ["b\u{7f}", "k"]);
        assert_eq!(names("t1", "ab"), ["k", "k2"]);
        assert_eq!(names("t2", "a"), ["k"]);
        assert_eq!(names("t", "1"), ["k"]);
        assert!(names("t2", "ab").is_empty());
        assert!(names("t", "a").is_empty());
        assert!(names("t3", "a").is_empty());
        // Prefixes spanning a separator find nothing.
        assert!(s
            .kv_list("t1", "a", "k2", 10, None, NOW)
            .unwrap()
            .keys
            .is_empty());
        // Deleting in one tenant leaves the other alone; usage is per tenant.
        assert!(s
            .kv_delete("t1", "a", "k", Precondition::None, NOW)
            .unwrap());
        assert_eq!(get(&s, "t2", "a", "k").unwrap().value, b"t2-a");
        assert_eq!(get(&s, "t1", "ab", "k").unwrap().value, b"t1-ab");
        let e = s
            .kv_put(
                "t2",
                "a",
                "k",
                b"x",
                None,
                Precondition::IfNoneMatch(vec!["*".into()]),
                NOW,
            )
            .unwrap_err();
        assert!(matches!(e, KvError::PreconditionFailed));
        assert_eq!(s.kv_usage("t2").unwrap(), (1 + 4, 1));
        assert_eq!(s.kv_usage("t").unwrap(), (1 + 3, 1));
        for t in ["t", "t1", "t2"] {
            assert_usage_consistent(&s, t);
        }
    }
}

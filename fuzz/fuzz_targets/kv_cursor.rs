//! Memory KV listings and conditional headers (`store::kv`).
//!
//! The cursor is decoded only inside `Store::kv_list` (`decode_cursor` is private), so
//! the target opens one real LMDB store per process (`OnceLock`, heed refuses a second
//! open of the same dir in one process) in `/tmp/isobox-fuzz-kv-<pid>/`, fills it once
//! with a few dozen keys (two tenants, overlapping namespaces, odd and 512-byte keys,
//! some with a TTL) and keeps a model of what it stored. The first input byte picks the
//! mode:
//!
//! * even — `kv_list(tenant, ns, prefix, limit, cursor, now)` with a fuzzed prefix,
//!   limit, cursor (raw text, or base64url of fuzzed text, optionally `=`-padded), clock
//!   and namespace. It must return `Ok` or `BadCursor` / `InvalidKey` /
//!   `InvalidNamespace` exactly when the prefix, cursor or namespace is invalid (never
//!   panic, never a store error); every key it returns starts with the prefix and sorts
//!   strictly after the decoded cursor; the page equals the model's (live keys of that
//!   tenant and namespace, byte order, `limit` clamped to `1..=MAX_LIST_LIMIT`, sizes,
//!   ETags, expiries), `next_cursor` is present exactly when more live keys follow; and
//!   following the cursors it hands out walks the rest of the listing, each key once.
//! * odd — `parse_etag_list` of a fuzzed header and `Precondition::holds` against a
//!   present or absent entry: members are non-empty and trimmed, re-joining them with
//!   `,` parses to the same list, without quotes the list is the comma split; `None`
//!   always holds; `If-Match` never holds for an absent entry and `If-None-Match` always
//!   does; `*` matches any existing entry (`If-Match: *` holds, `If-None-Match: *`
//!   does not); `If-Match` holding implies `If-None-Match` failing; and both agree with
//!   a reference of the documented comparison (strong for `If-Match`, weak for
//!   `If-None-Match`, quotes and surrounding whitespace optional).
//!
//! Stale dirs of earlier fuzzing processes (whose pid no longer exists) are removed
//! when a process opens its store: libFuzzer exits without running destructors.
#![no_main]

use base64::Engine as _;
use isobox::store::kv::{
    parse_etag_list, KvError, ListedKey, Precondition, MAX_KEY_BYTES, MAX_LIST_LIMIT,
};
use isobox::store::Store;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

const TENANT: &str = "key-0123abcd";
/// Another tenant whose keys must never show up.
const OTHER_TENANT: &str = "key-0123abcd0";
/// When the fixture was written, Unix ms.
const T0: u64 = 1_700_000_000_000;
/// Namespaces the fuzzer picks from: two populated ones where one is a prefix of the
/// other, an empty one and an invalid one.
const NAMESPACES: [&str; 4] = ["l", "lm", "void", ".."];
/// Clocks the fuzzer picks from: before, at, and after the TTLs run out.
const CLOCKS: [u64; 4] = [0, T0, T0 + 1_000, T0 + 90_000_000];
/// Longest cursor `kv_list` decodes: base64 of a `MAX_KEY_BYTES` key.
const MAX_CURSOR_CHARS: usize = MAX_KEY_BYTES.div_ceil(3) * 4;

/// One stored key as the model remembers it.
#[derive(Debug, Clone)]
struct Stored {
    size: u64,
    etag: String,
    expires_at_ms: Option<u64>,
}

struct Fixture {
    store: Store,
    /// `ns` → key → entry, for [`TENANT`] only.
    model: BTreeMap<&'static str, BTreeMap<String, Stored>>,
}

fn fixture_keys() -> Vec<(&'static str, String, Option<u64>)> {
    let mut v: Vec<(&'static str, String, Option<u64>)> = Vec::new();
    for k in [
        "a", "ab", "abc", "abd", "b", "ba", "c", "k/../x", "../../etc/passwd", "%2F%00", ".",
        "..", " ", "~", "\u{7f}", "é", "éa", "ключ 🙂", "🙂", "z\u{10ffff}", "a b", "a/b",
    ] {
        v.push(("l", k.to_string(), None));
    }
    v.push(("l", "k".repeat(MAX_KEY_BYTES), None));
    v.push(("l", "é".repeat(MAX_KEY_BYTES / 2), None));
    v.push(("l", "a".repeat(MAX_KEY_BYTES - 1) + "b", None));
    // TTLs: expired at T0 + 1 s, still live at T0 + 1 s but expired at T0 + 25 h.
    v.push(("l", "ab-ttl".into(), Some(1)));
    v.push(("l", "b-ttl".into(), Some(1)));
    v.push(("l", "zz-ttl".into(), Some(86_400)));
    v.push(("l", "zzz-ttl".into(), Some(1)));
    for k in ["a", "ab", "m", "lm-only"] {
        v.push(("lm", k.to_string(), None));
    }
    v
}

fn fixture() -> &'static Fixture {
    static FX: OnceLock<Fixture> = OnceLock::new();
    FX.get_or_init(|| {
        remove_stale_dirs();
        let dir = PathBuf::from(format!("/tmp/isobox-fuzz-kv-{}", std::process::id()));
        // A dir of a dead process that had our pid: start empty.
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).expect("open the fuzz store");
        let mut model: BTreeMap<&'static str, BTreeMap<String, Stored>> = BTreeMap::new();
        for (ns, key, ttl) in fixture_keys() {
            let value = format!("value of {key}");
            let out = store
                .kv_put(TENANT, ns, &key, value.as_bytes(), ttl, Precondition::None, T0)
                .unwrap_or_else(|e| panic!("fixture put {ns}/{key:?}: {e}"));
            assert!(out.created);
            assert_eq!(out.expires_at_ms, ttl.map(|t| T0 + t * 1000));
            model.entry(ns).or_default().insert(
                key,
                Stored {
                    size: value.len() as u64,
                    etag: out.etag,
                    expires_at_ms: out.expires_at_ms,
                },
            );
        }
        // Same names in another tenant whose name extends ours: must stay invisible.
        for ns in ["l", "lm", "void"] {
            for key in ["a", "ab", "b", "other"] {
                store
                    .kv_put(OTHER_TENANT, ns, key, b"other", None, Precondition::None, T0)
                    .expect("fixture put, other tenant");
            }
        }
        Fixture { store, model }
    })
}

/// Removes `/tmp/isobox-fuzz-kv-<pid>` dirs whose process is gone.
fn remove_stale_dirs() {
    let Ok(rd) = std::fs::read_dir("/tmp") else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("isobox-fuzz-kv-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The cursor's key, decoded as the listing documents it (base64url of a key under
/// the prefix); `None` for anything `kv_list` must refuse with `BadCursor`.
fn decode_cursor(cursor: &str, prefix: &str) -> Option<String> {
    if cursor.len() > MAX_CURSOR_CHARS {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor.trim_end_matches('='))
        .ok()?;
    let key = String::from_utf8(bytes).ok()?;
    let valid = !key.is_empty() && key.len() <= MAX_KEY_BYTES && !key.bytes().any(|b| b < 0x20);
    (valid && key.starts_with(prefix)).then_some(key)
}

fn prefix_valid(prefix: &str) -> bool {
    prefix.len() <= MAX_KEY_BYTES && !prefix.bytes().any(|b| b < 0x20)
}

/// The page the model predicts, and whether live keys follow it.
fn expected_page(
    fx: &Fixture,
    ns: &str,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
    now: u64,
) -> (Vec<ListedKey>, bool) {
    let limit = limit.clamp(1, MAX_LIST_LIMIT);
    let mut live = fx
        .model
        .get(ns)
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(prefix) && after.is_none_or(|a| k.as_str() > a))
        .filter(|(_, s)| s.expires_at_ms.is_none_or(|e| e > now))
        .map(|(k, s)| ListedKey {
            key: k.clone(),
            size: s.size,
            etag: s.etag.clone(),
            expires_at_ms: s.expires_at_ms,
        });
    let page: Vec<ListedKey> = live.by_ref().take(limit).collect();
    (page, live.next().is_some())
}

fn check_page(
    what: &str,
    keys: &[ListedKey],
    next: Option<&str>,
    want: &(Vec<ListedKey>, bool),
    prefix: &str,
    after: Option<&str>,
) {
    for k in keys {
        assert!(k.key.starts_with(prefix), "{what}: {:?} outside prefix {prefix:?}", k.key);
        if let Some(a) = after {
            assert!(k.key.as_str() > a, "{what}: {:?} not after the cursor {a:?}", k.key);
        }
    }
    assert!(
        keys.windows(2).all(|w| w[0].key < w[1].key),
        "{what}: keys not strictly increasing"
    );
    assert_eq!(keys, want.0.as_slice(), "{what}: page differs from the model");
    assert_eq!(next.is_some(), want.1, "{what}: next_cursor {next:?}");
    if let Some(c) = next {
        let last = &keys.last().expect("a next cursor after an empty page").key;
        assert_eq!(
            decode_cursor(c, prefix).as_deref(),
            Some(last.as_str()),
            "{what}: next_cursor {c:?} is not the last key"
        );
    }
}

fn fuzz_list(data: &[u8]) {
    let [flags, limit_b, plen, rest @ ..] = data else {
        return;
    };
    let fx = fixture();
    let ns = NAMESPACES[usize::from(flags >> 6)];
    let now = CLOCKS[usize::from((flags >> 4) & 3)];
    let limit = match limit_b {
        255 => usize::MAX,
        254 => MAX_LIST_LIMIT + 1,
        253 => MAX_LIST_LIMIT,
        b => usize::from(*b) % 40,
    };
    let plen = usize::from(*plen).min(rest.len());
    let prefix = String::from_utf8_lossy(&rest[..plen]).into_owned();
    let text = String::from_utf8_lossy(&rest[plen..]).into_owned();
    let cursor = (flags & 1 != 0).then(|| {
        let mut c = if flags & 2 != 0 {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text.as_bytes())
        } else {
            text.clone()
        };
        c.extend(std::iter::repeat_n('=', usize::from((flags >> 2) & 3)));
        c
    });

    let res = fx
        .store
        .kv_list(TENANT, ns, &prefix, limit, cursor.as_deref(), now);
    let after = cursor.as_deref().map(|c| decode_cursor(c, &prefix));
    let ns_ok = isobox::store::kv::validate_namespace(ns).is_ok();
    let page = match res {
        Err(KvError::InvalidNamespace(_)) if !ns_ok => return,
        Err(KvError::InvalidKey(_)) if ns_ok && !prefix_valid(&prefix) => return,
        Err(KvError::BadCursor) if ns_ok && prefix_valid(&prefix) && after == Some(None) => {
            return
        }
        Err(e) => panic!(
            "kv_list(ns {ns:?}, prefix {prefix:?}, cursor {cursor:?}, limit {limit}) failed: {e:?}"
        ),
        Ok(page) => page,
    };
    assert!(ns_ok, "invalid namespace {ns:?} listed");
    assert!(prefix_valid(&prefix), "invalid prefix {prefix:?} listed");
    let after: Option<String> = match after {
        None => None,
        Some(Some(k)) => Some(k),
        Some(None) => panic!("cursor {cursor:?} (prefix {prefix:?}) accepted"),
    };
    let want = expected_page(fx, ns, &prefix, after.as_deref(), limit, now);
    check_page(
        "first page",
        &page.keys,
        page.next_cursor.as_deref(),
        &want,
        &prefix,
        after.as_deref(),
    );

    // Following the cursors walks the rest, each key once, in order.
    let mut next = page.next_cursor;
    let mut last = page.keys.last().map(|k| k.key.clone());
    let mut pages = 0;
    while let Some(c) = next {
        pages += 1;
        assert!(pages <= 200, "cursor chain does not end");
        let p = fx
            .store
            .kv_list(TENANT, ns, &prefix, limit, Some(&c), now)
            .unwrap_or_else(|e| panic!("next page, cursor {c:?} it handed out: {e:?}"));
        let want = expected_page(fx, ns, &prefix, last.as_deref(), limit, now);
        check_page(
            "next page",
            &p.keys,
            p.next_cursor.as_deref(),
            &want,
            &prefix,
            last.as_deref(),
        );
        last = p.keys.last().map(|k| k.key.clone()).or(last);
        next = p.next_cursor;
    }
}

/// (weak, opaque part) of a tag as the documentation describes it.
fn opaque(tag: &str) -> (bool, &str) {
    let t = tag.trim();
    let (weak, t) = t.strip_prefix("W/").map_or((false, t), |r| (true, r));
    match t.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) => (weak, inner),
        None => (weak, t),
    }
}

fn fuzz_etags(data: &[u8]) {
    let [sel, rest @ ..] = data else {
        return;
    };
    const VERSIONS: [u64; 4] = [1, 0x2a, 0x0123_4567_89ab_cdef, u64::MAX];
    let current = VERSIONS
        .get(usize::from(*sel % 5))
        .map(|v| format!("\"{v:016x}\""));
    let header = String::from_utf8_lossy(rest);
    let tags = parse_etag_list(&header);

    for t in &tags {
        assert!(!t.is_empty(), "empty member of {header:?}");
        assert_eq!(t.trim(), t, "untrimmed member of {header:?}");
    }
    assert!(tags.len() <= header.matches(',').count() + 1);
    assert_eq!(
        parse_etag_list(&tags.join(",")),
        tags,
        "re-joined members of {header:?} parse differently"
    );
    if !header.contains('"') {
        let split: Vec<&str> = header.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        assert_eq!(tags, split, "unquoted {header:?}");
    }

    let if_match = Precondition::IfMatch(tags.clone());
    let if_none = Precondition::IfNoneMatch(tags.clone());
    assert!(Precondition::None.holds(current.as_deref()));
    assert!(!if_match.holds(None), "If-Match {tags:?} held for an absent entry");
    assert!(if_none.holds(None), "If-None-Match {tags:?} failed for an absent entry");
    let Some(cur) = current.as_deref() else {
        return;
    };
    let m = if_match.holds(Some(cur));
    let n = if_none.holds(Some(cur));
    if tags.iter().any(|t| t == "*") {
        assert!(m, "If-Match {tags:?} (with *) failed on an existing entry");
        assert!(!n, "If-None-Match {tags:?} (with *) held on an existing entry");
    }
    if tags.iter().any(|t| t == cur) {
        assert!(m, "If-Match {tags:?} failed on its own tag {cur}");
    }
    if tags.iter().any(|t| *t == format!("W/{cur}")) {
        assert!(!n, "If-None-Match {tags:?} held on the weak form of {cur}");
    }
    assert!(!(m && n), "both If-Match and If-None-Match {tags:?} held for {cur}");
    let (_, cur_op) = opaque(cur);
    let want_m = tags.iter().any(|t| {
        let (weak, op) = opaque(t);
        op == "*" || (!weak && op == cur_op)
    });
    let want_n = !tags.iter().any(|t| opaque(t).1 == "*" || opaque(t).1 == cur_op);
    assert_eq!(m, want_m, "If-Match {tags:?} against {cur}");
    assert_eq!(n, want_n, "If-None-Match {tags:?} against {cur}");
}

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((mode, rest)) if mode & 1 == 0 => fuzz_list(rest),
        Some((_, rest)) => fuzz_etags(rest),
        None => {}
    }
});

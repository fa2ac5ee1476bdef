//! Request heads: `find_head_end` then `parse_head`, never a panic.
//!
//! Properties:
//! - `find_head_end(buf, 0)` is the first blank line (the shortest prefix ending in
//!   `\n\n` or `\n\r\n`, which covers CRLF CRLF and mixed styles);
//! - scanning a growing buffer incrementally, each scan starting at the previous
//!   length (as the reactor does with `scan_from`), finds the same end: one byte per
//!   read (inputs up to 512 bytes), and reads ending at input-derived split points;
//! - when `parse_head` accepts, its fields hold the invariants the rest of the daemon
//!   relies on, httparse consumed exactly the delimited head (nothing after the
//!   blank line was silently dropped or read), and query components percent-decode
//!   exactly when every `%` has two hex digits after it.
#![no_main]

use isobox::http::limits::{MAX_HEADERS, MAX_HEAD_BYTES, MAX_URI_BYTES};
use isobox::http::parse::{find_head_end, parse_head};
use isobox::http::Framing;
use isobox_fuzz::{split_points, Rng};
use libfuzzer_sys::fuzz_target;

/// The obvious, slow definition of where a head ends.
fn reference_end(buf: &[u8]) -> Option<usize> {
    (1..=buf.len()).find(|&p| buf[..p].ends_with(b"\n\n") || buf[..p].ends_with(b"\n\r\n"))
}

/// `%XX` with two hex digits, `+` as space, UTF-8 result; nothing else.
fn strict_percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let h = b.get(i + 1..i + 3)?;
                if !h.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                out.push(u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn check_split_scan(buf: &[u8], whole: Option<usize>, rng: &mut Rng) {
    // The buffer grows to each split point in turn (a read each), then to the full input.
    let mut lens = split_points(rng, buf.len(), 3);
    lens.push(buf.len());
    let mut scanned = 0;
    for k in lens {
        if let Some(end) = find_head_end(&buf[..k], scanned) {
            assert!(end <= k, "end {end} past the buffer ({k})");
            assert_eq!(
                Some(end),
                whole,
                "incremental scan (prefix {k}, from {scanned}) disagrees with a whole scan"
            );
            return;
        }
        scanned = k;
    }
    assert_eq!(whole, None, "incremental scan never found the head end");
}

fn check_head(head_bytes: &[u8]) {
    let Ok(h) = parse_head(head_bytes) else {
        return;
    };
    assert!(head_bytes.len() <= MAX_HEAD_BYTES);
    assert!(!h.method.is_empty(), "empty method");
    assert!(h.path.starts_with('/'), "path {:?} not absolute", h.path);
    assert!(!h.path.contains('?'), "query left in path {:?}", h.path);
    let target_len = h.path.len() + h.query.as_ref().map_or(0, |q| q.len() + 1);
    assert!(
        target_len <= MAX_URI_BYTES,
        "target of {target_len} bytes accepted"
    );
    assert!(h.minor_version <= 1, "HTTP/1.{} accepted", h.minor_version);
    assert!(h.headers.len() <= MAX_HEADERS);
    for (name, value) in &h.headers {
        assert!(!name.is_empty());
        assert!(
            !name.bytes().any(|c| c.is_ascii_uppercase()),
            "name {name:?} not lower-cased"
        );
        assert!(
            !value.iter().any(|&c| (c < 0x20 && c != b'\t') || c == 0x7f),
            "control byte in {name}: {value:?}"
        );
        assert!(
            !value.first().is_some_and(|&c| c == b' ' || c == b'\t')
                && !value.last().is_some_and(|&c| c == b' ' || c == b'\t'),
            "untrimmed value of {name}: {value:?}"
        );
    }
    if h.minor_version == 1 {
        assert_eq!(
            h.header_count("host"),
            1,
            "HTTP/1.1 without exactly one Host"
        );
    }
    let te = h.header_count("transfer-encoding");
    let cl = h.header_count("content-length");
    assert!(
        te == 0 || cl == 0,
        "both Transfer-Encoding and Content-Length accepted"
    );
    match h.framing {
        Framing::Chunked => {
            assert_eq!(h.minor_version, 1, "chunked on HTTP/1.0");
            assert_eq!(te, 1);
        }
        Framing::Length(n) => {
            assert!(n > 0);
            assert_eq!(cl, 1);
            let v = h.header("content-length").expect("content-length is text");
            assert!(
                v.bytes().all(|c| c.is_ascii_digit()),
                "content-length {v:?}"
            );
            assert_eq!(v.parse::<u64>().ok(), Some(n));
        }
        Framing::None => {
            assert_eq!(te, 0);
            if let Some(v) = h.header("content-length") {
                assert!(
                    v.bytes().all(|c| c == b'0'),
                    "content-length {v:?} read as no body"
                );
            }
        }
    }
    if h.expect_continue {
        assert_eq!(h.minor_version, 1, "100-continue on HTTP/1.0");
    }
    if h.minor_version == 0 && h.header_count("connection") == 0 {
        assert!(!h.keep_alive, "HTTP/1.0 kept alive without asking");
    }
    // Query decoding never panics, and decodes exactly the well-formed escapes.
    if let Some(q) = h.query.as_deref() {
        for kv in q.split('&').take(8) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            for part in [k, v] {
                assert_eq!(
                    isobox::http::parse::percent_decode(part),
                    strict_percent_decode(part),
                    "percent_decode({part:?})"
                );
            }
            if let Some(key) = isobox::http::parse::percent_decode(k) {
                let _ = h.query_param(&key);
            }
        }
    }
    // httparse read exactly the head that find_head_end delimited.
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut storage);
    match req.parse(head_bytes) {
        Ok(httparse::Status::Complete(n)) => assert_eq!(
            n,
            head_bytes.len(),
            "httparse ended the head at {n}, not at the blank line ({})",
            head_bytes.len()
        ),
        other => panic!("parse_head accepted what httparse says is {other:?}"),
    }
}

/// The buffer grows one byte per read (a slow client): each scan starts where the last
/// one stopped, as the reactor's `scan_from` does.
fn check_bytewise_scan(buf: &[u8], whole: Option<usize>) {
    let mut scanned = 0;
    for k in 1..=buf.len() {
        if let Some(end) = find_head_end(&buf[..k], scanned) {
            assert_eq!(Some(end), whole, "byte-wise scan found {end} at prefix {k}");
            assert_eq!(end, k, "byte-wise scan found the end late");
            return;
        }
        scanned = k;
    }
    assert_eq!(whole, None, "byte-wise scan never found the head end");
}

fuzz_target!(|buf: &[u8]| {
    let whole = find_head_end(buf, 0);
    assert_eq!(
        whole,
        reference_end(buf),
        "find_head_end is not the first blank line"
    );
    if buf.len() <= 512 {
        // Each scan looks back only 3 bytes, so short inputs say all there is to say.
        check_bytewise_scan(buf, whole);
    }
    let mut rng = Rng::new(buf);
    check_split_scan(buf, whole, &mut rng);
    check_split_scan(buf, whole, &mut rng);
    if let Some(end) = whole {
        check_head(&buf[..end]);
    }
    // parse_head on any bytes at all (not cut at a blank line) must not panic either.
    let _ = parse_head(buf);
});

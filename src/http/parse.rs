//! Sans-IO request-head parsing on httparse, with the framing rules httparse leaves to us.
//!
//! httparse is lenient by design; this layer decides (RFC 9112): `Content-Length` with
//! `Transfer-Encoding` is rejected, as are repeated or malformed lengths, any transfer
//! coding but a lone `chunked`, `Transfer-Encoding` on HTTP/1.0, control bytes in header
//! values, a missing or repeated `Host` on HTTP/1.1. Bare LF line ends are parsed like
//! CRLF (httparse accepts them; so do we, consistently, in heads and chunked framing).

use super::limits::{MAX_HEADERS, MAX_HEAD_BYTES, MAX_URI_BYTES};
use memchr::memmem;

/// Why a head was refused; each maps to one status in [`HttpError::status`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// The head exceeded `MAX_HEAD_BYTES`.
    #[error("request head larger than {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    /// More than `MAX_HEADERS` header fields.
    #[error("more than {MAX_HEADERS} header fields")]
    TooManyHeaders,
    /// The request target exceeded `MAX_URI_BYTES`.
    #[error("request target longer than {MAX_URI_BYTES} bytes")]
    UriTooLong,
    /// Not HTTP/1.0 or HTTP/1.1.
    #[error("unsupported HTTP version")]
    Version,
    /// A transfer coding other than chunked.
    #[error("unsupported transfer coding")]
    UnsupportedCoding,
    /// An `Expect` other than 100-continue.
    #[error("unsupported expectation")]
    Expectation,
    /// Anything else malformed; the text says what.
    #[error("{0}")]
    Bad(&'static str),
    /// A head the public-URL proxy takes only if what it adds (`X-Forwarded-*`) still
    /// fits the bounds above; the text says which.
    #[error("{0}")]
    TooLargeToForward(&'static str),
}

impl HttpError {
    /// The status code this error is answered with.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::HeadTooLarge
            | HttpError::TooManyHeaders
            | HttpError::TooLargeToForward(_) => 431,
            HttpError::UriTooLong => 414,
            HttpError::Version => 505,
            HttpError::UnsupportedCoding => 501,
            HttpError::Expectation => 417,
            HttpError::Bad(_) => 400,
        }
    }
}

/// How the body of a request is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
}

/// A parsed request head.
#[derive(Debug, Clone)]
pub struct Head {
    /// The method token, as sent (methods are case-sensitive).
    pub method: String,
    /// The path part of the target, not percent-decoded.
    pub path: String,
    /// The query string without `?`, if any.
    pub query: Option<String>,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Header fields with lower-cased names, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Body framing.
    pub framing: Framing,
    /// Whether the connection stays open after the response.
    pub keep_alive: bool,
    /// Whether the client waits for `100 Continue`.
    pub expect_continue: bool,
}

impl Head {
    /// The first value of header `name` (lower-case), as text if it is valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// How many times header `name` occurs.
    pub fn header_count(&self, name: &str) -> usize {
        self.headers.iter().filter(|(n, _)| n == name).count()
    }

    /// The value of query parameter `key`, percent-decoded.
    pub fn query_param(&self, key: &str) -> Option<String> {
        let q = self.query.as_deref()?;
        q.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k)? == key)
                .then(|| percent_decode(v))
                .flatten()
        })
    }

    /// The raw bytes of query parameter `key`, percent-decoded (any bytes, not only
    /// UTF-8: file names made inside a sandbox can be anything).
    pub fn query_param_bytes(&self, key: &str) -> Option<Vec<u8>> {
        let q = self.query.as_deref()?;
        q.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k)? == key)
                .then(|| percent_decode_bytes(v))
                .flatten()
        })
    }
}

/// Percent-encodes every byte outside RFC 3986's unreserved ASCII: any bytes as a
/// query value (`+` too, which a query reads as a space).
pub fn percent_encode(b: &[u8]) -> String {
    percent_encode_keeping(b, b"")
}

/// [`percent_encode`] keeping `/`: a path of any bytes as a query value or a path's
/// segments.
pub fn percent_encode_path(b: &[u8]) -> String {
    percent_encode_keeping(b, b"/")
}

fn percent_encode_keeping(b: &[u8], keep: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for &c in b {
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') || keep.contains(&c)
        {
            s.push(char::from(c));
        } else {
            s.push_str(&format!("%{c:02X}"));
        }
    }
    s
}

/// Decodes `%XX` escapes and `+` in a query component; `None` when malformed or not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    String::from_utf8(percent_decode_bytes(s)?).ok()
}

/// Decodes the `%XX` escapes of a path segment (`+` stays `+`); `None` when one is
/// malformed.
pub fn percent_decode_path(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.extend_from_slice(&rest.as_bytes()[..i]);
        let hex = rest.get(i + 1..i + 3)?;
        if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        out.push(u8::from_str_radix(hex, 16).ok()?);
        rest = &rest[i + 3..];
    }
    out.extend_from_slice(rest.as_bytes());
    Some(out)
}

/// Decodes `%XX` escapes and `+` into raw bytes; `None` when an escape is malformed.
pub fn percent_decode_bytes(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                // from_str_radix alone would accept a sign ("%+f").
                if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
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
    Some(out)
}

/// Finds the end of a head in `buf`, scanning only from `scan_from` (so a growing head is
/// never rescanned from the start). Returns the length of the head including its blank line.
pub fn find_head_end(buf: &[u8], scan_from: usize) -> Option<usize> {
    let start = scan_from.saturating_sub(3);
    let hay = buf.get(start..)?;
    // The first blank line ends the head, whichever line-end style it uses.
    let crlf = memmem::find(hay, b"\r\n\r\n").map(|i| i + 4);
    let lf = memmem::find(hay, b"\n\n").map(|i| i + 2);
    let lfcrlf = memmem::find(hay, b"\n\r\n").map(|i| i + 3);
    [crlf, lf, lfcrlf]
        .into_iter()
        .flatten()
        .min()
        .map(|end| start + end)
}

/// Parses one complete head (`buf` ends with the blank line found by [`find_head_end`]).
///
/// # Errors
/// An [`HttpError`] naming what is wrong.
pub fn parse_head(buf: &[u8]) -> Result<Head, HttpError> {
    if buf.len() > MAX_HEAD_BYTES {
        return Err(HttpError::HeadTooLarge);
    }
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut storage);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(HttpError::Bad("incomplete request head")),
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::TooManyHeaders),
        Err(httparse::Error::Version) => return Err(HttpError::Version),
        Err(httparse::Error::HeaderName) => return Err(HttpError::Bad("invalid header name")),
        Err(httparse::Error::HeaderValue) => return Err(HttpError::Bad("invalid header value")),
        Err(httparse::Error::Token) => return Err(HttpError::Bad("invalid method")),
        Err(_) => return Err(HttpError::Bad("malformed request line")),
    }
    let method = req
        .method
        .ok_or(HttpError::Bad("missing method"))?
        .to_string();
    let target = req.path.ok_or(HttpError::Bad("missing request target"))?;
    let minor_version = req.version.ok_or(HttpError::Version)?;
    if target.len() > MAX_URI_BYTES {
        return Err(HttpError::UriTooLong);
    }
    // RFC 9112 §3.2: origin-form only; absolute-form, authority-form and `*` are refused.
    if !target.starts_with('/') {
        return Err(HttpError::Bad("request target must be an absolute path"));
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (target.to_string(), None),
    };
    let mut headers = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        // httparse lets obs-text and DEL through; we refuse control bytes except HTAB.
        if h.value
            .iter()
            .any(|&c| (c < 0x20 && c != b'\t') || c == 0x7f)
        {
            return Err(HttpError::Bad("control character in header value"));
        }
        headers.push((h.name.to_ascii_lowercase(), trim_ows(h.value).to_vec()));
    }
    let mut head = Head {
        method,
        path,
        query,
        minor_version,
        headers,
        framing: Framing::None,
        keep_alive: minor_version == 1,
        expect_continue: false,
    };
    if minor_version == 1 && head.header_count("host") != 1 {
        return Err(HttpError::Bad("HTTP/1.1 requires exactly one Host header"));
    }
    head.framing = framing(&head)?;
    for (name, value) in &head.headers {
        match name.as_str() {
            "connection" => {
                for token in value.split(|&c| c == b',').map(trim_ows) {
                    if token.eq_ignore_ascii_case(b"close") {
                        head.keep_alive = false;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") && minor_version == 0 {
                        head.keep_alive = true;
                    }
                }
            }
            "expect" => {
                if value.eq_ignore_ascii_case(b"100-continue") {
                    head.expect_continue = minor_version == 1;
                } else {
                    return Err(HttpError::Expectation);
                }
            }
            _ => {}
        }
    }
    Ok(head)
}

fn framing(head: &Head) -> Result<Framing, HttpError> {
    let te: Vec<&[u8]> = head
        .headers
        .iter()
        .filter(|(n, _)| n == "transfer-encoding")
        .map(|(_, v)| v.as_slice())
        .collect();
    let cl: Vec<&[u8]> = head
        .headers
        .iter()
        .filter(|(n, _)| n == "content-length")
        .map(|(_, v)| v.as_slice())
        .collect();
    if !te.is_empty() {
        // RFC 9112 §6.1: a message with both is a smuggling vector; refuse it outright.
        if !cl.is_empty() {
            return Err(HttpError::Bad("both Content-Length and Transfer-Encoding"));
        }
        if head.minor_version == 0 {
            return Err(HttpError::Bad("Transfer-Encoding on HTTP/1.0"));
        }
        if te.len() > 1 || te[0].contains(&b',') {
            return Err(HttpError::Bad(
                "only a single chunked transfer coding is accepted",
            ));
        }
        return if te[0].eq_ignore_ascii_case(b"chunked") {
            Ok(Framing::Chunked)
        } else {
            Err(HttpError::UnsupportedCoding)
        };
    }
    match cl.as_slice() {
        [] => Ok(Framing::None),
        [v] => parse_content_length(v).map(|n| {
            if n == 0 {
                Framing::None
            } else {
                Framing::Length(n)
            }
        }),
        _ => Err(HttpError::Bad("repeated Content-Length")),
    }
}

/// `1*DIGIT`, at most 18 digits so it cannot overflow; nothing else (no sign, no hex, no list).
fn parse_content_length(v: &[u8]) -> Result<u64, HttpError> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return Err(HttpError::Bad("invalid Content-Length"));
    }
    v.iter()
        .try_fold(0u64, |acc, &d| {
            acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
        .ok_or(HttpError::Bad("invalid Content-Length"))
}

fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|&c| c != b' ' && c != b'\t')
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(start, |i| i + 1);
    &v[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Head, HttpError> {
        let b = s.as_bytes();
        let end = find_head_end(b, 0).expect("complete head");
        parse_head(&b[..end])
    }

    #[test]
    fn test_any_path_survives_percent_encoding_as_a_query_value() {
        assert_eq!(percent_encode_path(b"a b/\xff\n"), "a%20b/%FF%0A");
        assert_eq!(percent_encode("a b&c/ü".as_bytes()), "a%20b%26c%2F%C3%BC");
        for p in [
            &b"/home/user/\xff\xfe"[..],
            b"a+b&c=d%e#f?g",
            b"/tmp/\x01\x7f\x80 ~-._",
            "/tmp/\u{17d}lu\u{165}ou\u{10d}k\u{fd}".as_bytes(),
        ] {
            let h = parse(&format!(
                "GET /f?x=1&path={}&y=2 HTTP/1.1\r\nHost: a\r\n\r\n",
                percent_encode_path(p)
            ))
            .unwrap();
            assert_eq!(h.query_param_bytes("path").as_deref(), Some(p));
        }
    }

    #[test]
    fn test_simple_get_keeps_alive() {
        let h = parse("GET /healthz?x=1 HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert_eq!(h.method, "GET");
        assert_eq!(h.path, "/healthz");
        assert_eq!(h.query.as_deref(), Some("x=1"));
        assert!(h.keep_alive);
        assert_eq!(h.framing, Framing::None);
    }

    #[test]
    fn test_bare_lf_parses_like_crlf() {
        let h = parse("GET /healthz HTTP/1.1\nHost: a\n\n").unwrap();
        assert_eq!(h.path, "/healthz");
    }

    #[test]
    fn test_cl_and_te_together_rejected() {
        let e = parse(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .unwrap_err();
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn test_bad_content_lengths_rejected() {
        for v in [
            "+5",
            "-1",
            "0x10",
            "5a",
            "1_0",
            "99999999999999999999",
            "foo",
            "5, 6",
            "",
        ] {
            let e = parse(&format!(
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {v}\r\n\r\n"
            ))
            .unwrap_err();
            assert_eq!(e, HttpError::Bad("invalid Content-Length"), "{v}");
        }
        let e =
            parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n")
                .unwrap_err();
        assert_eq!(e, HttpError::Bad("repeated Content-Length"));
    }

    #[test]
    fn test_transfer_codings() {
        let ok = parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap();
        assert_eq!(ok.framing, Framing::Chunked);
        for v in ["chunked, identity", "gzip, chunked"] {
            let e = parse(&format!(
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {v}\r\n\r\n"
            ))
            .unwrap_err();
            assert_eq!(e.status(), 400, "{v}");
        }
        for v in ["gzip", "xchunked"] {
            let e = parse(&format!(
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {v}\r\n\r\n"
            ))
            .unwrap_err();
            assert_eq!(e, HttpError::UnsupportedCoding, "{v}");
        }
        let e = parse("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap_err();
        assert_eq!(e, HttpError::Bad("Transfer-Encoding on HTTP/1.0"));
        let e = parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\x0b\r\n\r\n")
            .unwrap_err();
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn test_obs_fold_and_control_bytes_rejected() {
        assert!(parse("GET / HTTP/1.1\r\nHost: a\r\nX-A: a\r\n b\r\n\r\n").is_err());
        assert!(parse("GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n").is_err());
        assert!(parse("GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n").is_err());
        assert!(parse("GET / HTTP/1.1\r\nHost: a\r\nX: a\x7fb\r\n\r\n").is_err());
        assert!(parse("GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n").is_err());
    }

    #[test]
    fn test_targets_and_versions() {
        assert!(parse("GET http://evil/ HTTP/1.1\r\nHost: a\r\n\r\n").is_err());
        assert!(parse("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n").is_err());
        assert_eq!(
            parse("GET / HTTP/9.9\r\nHost: a\r\n\r\n").unwrap_err(),
            HttpError::Version
        );
        assert!(
            parse("GET / HTTP/1.1\r\n\r\n").is_err(),
            "HTTP/1.1 without Host"
        );
        let h = parse("GET / HTTP/1.0\r\n\r\n").unwrap();
        assert!(!h.keep_alive);
        let long = format!(
            "GET /{} HTTP/1.1\r\nHost: a\r\n\r\n",
            "a".repeat(MAX_URI_BYTES)
        );
        assert_eq!(parse(&long).unwrap_err(), HttpError::UriTooLong);
    }

    #[test]
    fn test_connection_close_and_expect() {
        let h = parse("POST / HTTP/1.1\r\nHost: a\r\nConnection: close\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n").unwrap();
        assert!(!h.keep_alive);
        assert!(h.expect_continue);
        assert_eq!(h.framing, Framing::Length(3));
        assert_eq!(
            parse("GET / HTTP/1.1\r\nHost: a\r\nExpect: foo\r\n\r\n").unwrap_err(),
            HttpError::Expectation
        );
    }

    #[test]
    fn test_find_head_end_resumes_scan() {
        let b = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest";
        for from in 0..=26 {
            assert_eq!(find_head_end(b, from), Some(27), "from {from}");
        }
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nHost: a\r\n", 0), None);
    }

    #[test]
    fn test_query_param_decodes() {
        let h = parse("GET /x?path=a%2Fb+c&format=zip HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert_eq!(h.query_param("path").as_deref(), Some("a/b c"));
        assert_eq!(h.query_param("format").as_deref(), Some("zip"));
        assert_eq!(h.query_param("nope"), None);
        // Found by fuzzing (fuzz/regressions/http_request/percent-plus-sign).
        assert_eq!(percent_decode("%+f"), None);
        assert_eq!(percent_decode("%2"), None);
    }
}

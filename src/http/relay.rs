//! An HTTP/1.1 relay between a client and an app's own server, sans-IO: what the
//! public-URL proxy speaks on both of its sockets.
//!
//! Requests are taken one at a time from the client, each head checked by the same
//! strict parser as the daemon's own requests (`parse::parse_head`: no smuggling
//! through `Content-Length` with `Transfer-Encoding`, no control bytes) and written
//! anew for the app; responses are read from the app, their heads parsed and written
//! anew for the client. Chunked bodies are decoded and encoded again in both
//! directions, so neither side ever sees framing the other side chose. A `101` answer
//! to an `Upgrade` request (WebSockets) turns the relay into a plain two-way pipe.
//!
//! Every buffer is bounded: the caller reads from a side only while [`Relay::room_from`]
//! allows, and the relay moves bytes across only while the other side's write buffer
//! has room. Nothing here knows a socket.

use super::chunked::{write_chunk, ChunkedDecoder, LAST_CHUNK};
use super::limits::{MAX_HEADERS, MAX_HEAD_BYTES};
use super::parse::{find_head_end, parse_head};
use super::{Framing, Head, HttpError};

/// Bytes queued toward either side before the relay stops reading the other.
pub const BUF_BYTES: usize = 256 * 1024;

/// Header fields [`Relay::forward`] may write beyond the client's own: Host, Cookie,
/// X-Forwarded-For, -Proto and -Host, the body's framing, Connection and Upgrade.
pub const ADDED_HEADERS: usize = 8;
/// Bytes it may add beyond the client's head and a second copy of its Host (in
/// X-Forwarded-Host): the field names, the client's address and the proto, a
/// Content-Length of 20 digits, `Connection: upgrade`.
pub const ADDED_HEAD_BYTES: usize = 256;

const TOO_MANY_TO_FORWARD: &str = "too many header fields to forward: with the proxy's own \
     (Host, X-Forwarded-For, -Proto, -Host, the framing) the app would get more than 100";
const TOO_LARGE_TO_FORWARD: &str = "request head too large to forward: with the proxy's own \
     fields (X-Forwarded-Host repeats Host) it would pass 16 KiB";
/// The largest response head an app may send (its cookies can be long).
pub const MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;
/// Header fields of a response.
const MAX_RESPONSE_HEADERS: usize = 128;

/// Hop-by-hop fields (RFC 9110 §7.6.1): they describe one connection, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// How a body is delimited, as the relay tracks it.
#[derive(Debug)]
enum Body {
    Length(u64),
    Chunked(ChunkedDecoder),
    /// Until the app closes (a response without a length).
    UntilClose,
}

#[derive(Debug)]
enum ReqPhase {
    /// Waiting for a head (or for the previous response to finish).
    Head,
    /// Forwarding the body of the request in flight.
    Body(Body),
    /// The request is out; its response is awaited.
    Sent,
    /// A two-way pipe.
    Tunnel,
}

#[derive(Debug)]
enum RespPhase {
    /// No request in flight.
    Idle,
    /// Waiting for the response head.
    Head,
    /// Forwarding the response body.
    Body(Body),
    /// A two-way pipe.
    Tunnel,
}

/// Why the relay gave up on the app's side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// The app's response could not be parsed or broke its own framing.
    #[error("the app sent a malformed response: {0}")]
    BadResponse(&'static str),
    /// The client's request body broke its framing.
    #[error("malformed request body: {0}")]
    BadRequestBody(&'static str),
}

/// What [`Relay::next_request`] found.
#[derive(Debug)]
pub enum Next {
    /// Nothing (yet): a head is incomplete, or a response is still in flight.
    Wait,
    /// A complete head: decide, then [`Relay::forward`] or [`Relay::answer`].
    Head(Box<Head>),
    /// A head that cannot be served: answer this status and close.
    Refused(HttpError),
}

/// What the caller adds to a forwarded request.
#[derive(Debug, Clone)]
pub struct Forwarded<'a> {
    /// The client's address (appended to `X-Forwarded-For`).
    pub client: &'a str,
    /// `http` or `https`, as the client reached the daemon.
    pub proto: &'a str,
    /// The request target to send (path and query, with whatever the proxy took out).
    pub target: &'a str,
    /// Request header fields (lower-case) the app must not see.
    pub strip: &'a [&'a str],
    /// The `Cookie` value to send instead of the client's (`None`: none at all).
    pub cookie: Option<&'a str>,
    /// The client is a proxy the daemon trusts: its `X-Forwarded-For` (and the
    /// client-address fields of other proxies) is kept, this hop added. Otherwise the
    /// client's own claims about its address are dropped: an app that believes the
    /// first entry must not see one the client made up.
    pub trusted: bool,
}

/// Fields other proxies and CDNs use for the client's address: what a client says
/// in them is its claim, kept only from a trusted proxy.
const CLIENT_ADDRESS_FIELDS: &[&str] = &[
    "x-real-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "fastly-client-ip",
];

/// The field names a `Connection` field lists (RFC 9110 §7.6.1: hop-by-hop too),
/// lower-case, without `close`, `keep-alive` and `upgrade` (handled on their own).
fn connection_named(fields: &[(String, Vec<u8>)]) -> Vec<String> {
    fields
        .iter()
        .filter(|(k, _)| k == "connection")
        .flat_map(|(_, v)| v.split(|&c| c == b','))
        .map(|t| String::from_utf8_lossy(t.trim_ascii()).to_ascii_lowercase())
        .filter(|t| !t.is_empty() && !matches!(t.as_str(), "close" | "keep-alive" | "upgrade"))
        .collect()
}

/// An app's `Set-Cookie` made host-only: its `Domain` attribute dropped, so that one
/// sandbox's app cannot set cookies for every address under the public domain (for
/// another's app, or enough of them to make every request's head too large).
fn host_only_cookie(v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    for (i, part) in v.split(|&c| c == b';').enumerate() {
        let name = part
            .split(|&c| c == b'=')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        if i > 0 && name.eq_ignore_ascii_case(b"domain") {
            continue;
        }
        if i > 0 {
            out.push(b';');
        }
        out.extend_from_slice(part);
    }
    out
}

/// One client connection's relay.
#[derive(Debug)]
pub struct Relay {
    /// Read from the client, not yet taken.
    pub from_client: Vec<u8>,
    /// Queued for the app.
    pub to_upstream: Vec<u8>,
    /// Read from the app, not yet taken.
    pub from_upstream: Vec<u8>,
    /// Queued for the client.
    pub to_client: Vec<u8>,
    req: ReqPhase,
    resp: RespPhase,
    /// INVARIANT: `scan_from <= from_client.len()`.
    scan_from: usize,
    head_only: bool,
    upgrade: bool,
    client_keep: bool,
    /// Close the client once `to_client` is out.
    pub close_client: bool,
    /// Close the client once the response in flight is complete.
    close_after_response: bool,
    /// The app's connection may carry the next request.
    upstream_keep: bool,
    /// Bytes of the current response already queued for the client.
    resp_started: bool,
    /// A framing error ended it: nothing more moves (the caller answers and closes).
    failed: bool,
    scratch: Vec<u8>,
}

impl Default for Relay {
    fn default() -> Self {
        Relay::new(Vec::new())
    }
}

impl Relay {
    /// A relay whose client already sent `from_client` (after a head taken elsewhere).
    pub fn new(from_client: Vec<u8>) -> Relay {
        Relay {
            from_client,
            to_upstream: Vec::new(),
            from_upstream: Vec::new(),
            to_client: Vec::new(),
            req: ReqPhase::Head,
            resp: RespPhase::Idle,
            scan_from: 0,
            head_only: false,
            upgrade: false,
            client_keep: true,
            close_client: false,
            close_after_response: false,
            upstream_keep: false,
            resp_started: false,
            failed: false,
            scratch: Vec::new(),
        }
    }

    /// How many bytes may be read from the client now.
    pub fn room_from_client(&self) -> usize {
        let cap = match self.req {
            // A head may be at most MAX_HEAD_BYTES; pipelined requests wait here.
            ReqPhase::Head | ReqPhase::Sent => MAX_HEAD_BYTES + 1,
            ReqPhase::Body(_) | ReqPhase::Tunnel => BUF_BYTES,
        };
        if self.close_client || self.to_upstream.len() >= BUF_BYTES {
            return 0;
        }
        // A client that does not read its answers gets no more of them: nothing more
        // is read from it until it takes what is queued (pipelined requests answered
        // by the proxy itself would otherwise queue pages without bound).
        if matches!(self.req, ReqPhase::Head | ReqPhase::Sent) && self.to_client.len() >= BUF_BYTES
        {
            return 0;
        }
        cap.saturating_sub(self.from_client.len())
    }

    /// How many bytes may be read from the app now.
    pub fn room_from_upstream(&self) -> usize {
        if self.failed || self.to_client.len() >= BUF_BYTES {
            return 0;
        }
        match self.resp {
            RespPhase::Head => {
                MAX_RESPONSE_HEAD_BYTES + 1
                    - self.from_upstream.len().min(MAX_RESPONSE_HEAD_BYTES + 1)
            }
            RespPhase::Body(_) | RespPhase::Tunnel => {
                BUF_BYTES.saturating_sub(self.from_upstream.len())
            }
            // Nothing is expected: what an app sends unasked is read (and found below).
            RespPhase::Idle => 4096usize.saturating_sub(self.from_upstream.len()),
        }
    }

    /// Whether what the app sent is all taken (or can go nowhere: the client's buffer
    /// has room and the rest is an incomplete head) — its end may be acted on.
    pub fn upstream_drained(&self) -> bool {
        self.from_upstream.is_empty() || self.to_client.len() < BUF_BYTES
    }

    /// Whether the relay is a two-way pipe now.
    pub fn is_tunnel(&self) -> bool {
        matches!(self.req, ReqPhase::Tunnel)
    }

    /// Whether no request is in flight (the app's connection is idle or absent).
    pub fn is_idle(&self) -> bool {
        matches!(self.req, ReqPhase::Head) && matches!(self.resp, RespPhase::Idle)
    }

    /// Whether the app's connection may carry the next request once this one is done.
    pub fn upstream_reusable(&self) -> bool {
        self.upstream_keep && self.is_idle() && self.from_upstream.is_empty()
    }

    /// The next request head, when no request is in flight.
    pub fn next_request(&mut self) -> Next {
        if !self.is_idle() || self.close_client || self.to_client.len() >= BUF_BYTES {
            return Next::Wait;
        }
        // RFC 9112 §2.2: empty lines before a request line are ignored.
        let skip = self
            .from_client
            .iter()
            .take_while(|&&c| c == b'\r' || c == b'\n')
            .count();
        if skip > 0 {
            self.from_client.drain(..skip);
            self.scan_from = 0;
        }
        let Some(end) = find_head_end(&self.from_client, self.scan_from) else {
            self.scan_from = self.from_client.len();
            if self.from_client.len() > MAX_HEAD_BYTES {
                return Next::Refused(HttpError::HeadTooLarge);
            }
            return Next::Wait;
        };
        let parsed = parse_head(&self.from_client[..end]);
        self.from_client.drain(..end);
        self.scan_from = 0;
        match parsed {
            // What `forward` adds must still fit the bounds, so the app never gets a
            // head that this daemon's own parser would refuse (431 instead).
            Ok(h) if h.headers.len() + ADDED_HEADERS > MAX_HEADERS => {
                Next::Refused(HttpError::TooLargeToForward(TOO_MANY_TO_FORWARD))
            }
            Ok(h)
                if end + h.header("host").map_or(0, str::len) + ADDED_HEAD_BYTES
                    > MAX_HEAD_BYTES =>
            {
                Next::Refused(HttpError::TooLargeToForward(TOO_LARGE_TO_FORWARD))
            }
            Ok(h) => Next::Head(Box::new(h)),
            Err(e) => Next::Refused(e),
        }
    }

    /// Queues a local answer (the proxy's own page, a redirect) to the request whose
    /// head was just taken. A request with a body is not read on: the client is closed
    /// after the answer.
    pub fn answer(&mut self, head: &Head, response: &[u8], keep: bool) {
        self.to_client.extend_from_slice(response);
        if !keep || !head.keep_alive || head.framing != Framing::None {
            self.close_client = true;
        }
    }

    /// Queues `head` for the app, rewritten: hop-by-hop fields and `strip` dropped,
    /// `X-Forwarded-*` added, `Connection: Upgrade` kept for an upgrade. Its body
    /// follows as the client sends it.
    pub fn forward(&mut self, head: &Head, f: &Forwarded<'_>) {
        let upgrade = head.header("connection").is_some_and(|c| {
            c.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        }) && head.header("upgrade").is_some();
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(head.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(f.target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        // Exactly one Host, the one the request was routed by (an HTTP/1.0 head may
        // carry none, or several).
        header(
            &mut out,
            "host",
            head.header("host").unwrap_or("").as_bytes(),
        );
        let mut xff: Option<Vec<u8>> = None;
        let named = connection_named(&head.headers);
        for (name, value) in &head.headers {
            let n = name.as_str();
            if n == "host"
                || HOP_BY_HOP.contains(&n)
                || named.iter().any(|c| c == n)
                || f.strip.contains(&n)
                || n == "cookie"
                || n == "content-length"
                || n.starts_with("x-forwarded-")
                || n == "forwarded"
                || (!f.trusted && CLIENT_ADDRESS_FIELDS.contains(&n))
            {
                if n == "x-forwarded-for" && f.trusted {
                    let v = xff.get_or_insert_with(Vec::new);
                    if !v.is_empty() {
                        v.extend_from_slice(b", ");
                    }
                    v.extend_from_slice(value);
                }
                continue;
            }
            header(&mut out, n, value);
        }
        if let Some(c) = f.cookie {
            header(&mut out, "cookie", c.as_bytes());
        }
        let mut v = xff.unwrap_or_default();
        if !v.is_empty() {
            v.extend_from_slice(b", ");
        }
        v.extend_from_slice(f.client.as_bytes());
        header(&mut out, "x-forwarded-for", &v);
        header(&mut out, "x-forwarded-proto", f.proto.as_bytes());
        if let Some(h) = head.header("host") {
            header(&mut out, "x-forwarded-host", h.as_bytes());
        }
        let body = match head.framing {
            // An empty body that said so keeps saying so: some apps answer a POST or
            // PUT without a length with 411.
            Framing::None if head.header("content-length").is_some() => {
                header(&mut out, "content-length", b"0");
                None
            }
            Framing::None => None,
            Framing::Length(n) => {
                header(&mut out, "content-length", n.to_string().as_bytes());
                Some(Body::Length(n))
            }
            Framing::Chunked => {
                header(&mut out, "transfer-encoding", b"chunked");
                Some(Body::Chunked(ChunkedDecoder::new()))
            }
        };
        if upgrade {
            header(&mut out, "connection", b"upgrade");
            if let Some(u) = head.header("upgrade") {
                header(&mut out, "upgrade", u.as_bytes());
            }
        }
        out.extend_from_slice(b"\r\n");
        self.to_upstream.extend_from_slice(&out);
        self.req = body.map_or(ReqPhase::Sent, ReqPhase::Body);
        self.resp = RespPhase::Head;
        self.head_only = head.method == "HEAD";
        self.upgrade = upgrade;
        self.client_keep = head.keep_alive;
        self.resp_started = false;
    }

    /// Moves what it can: request body bytes to the app, response heads and bodies to
    /// the client, everything both ways in a tunnel.
    ///
    /// # Errors
    /// A malformed response (nothing of it was sent yet when `resp_started()` is false:
    /// the caller may still answer with its own page) or request body.
    /// After an error the relay is spent: it reads and moves nothing more, and the
    /// bytes that broke the framing are dropped (a caller that pumps again gets `Ok`,
    /// never the same error once more).
    pub fn pump(&mut self) -> Result<(), RelayError> {
        if self.failed {
            return Ok(());
        }
        let r = self.pump_request().and_then(|()| loop {
            let before = (self.from_upstream.len(), self.to_client.len());
            self.pump_response()?;
            if before == (self.from_upstream.len(), self.to_client.len()) {
                break Ok(());
            }
        });
        if r.is_err() {
            self.failed = true;
            self.close_client = true;
            self.from_client.clear();
            self.scan_from = 0;
            self.from_upstream.clear();
            self.to_upstream.clear();
        }
        r
    }

    /// Whether any byte of the response in flight went to the client.
    pub fn resp_started(&self) -> bool {
        self.resp_started
    }

    fn pump_request(&mut self) -> Result<(), RelayError> {
        let room = BUF_BYTES.saturating_sub(self.to_upstream.len());
        if room == 0 || self.from_client.is_empty() {
            return Ok(());
        }
        match &mut self.req {
            ReqPhase::Tunnel => {
                let n = room.min(self.from_client.len());
                self.to_upstream.extend(self.from_client.drain(..n));
            }
            ReqPhase::Body(body) => {
                let done = move_body(
                    body,
                    &mut self.from_client,
                    &mut self.to_upstream,
                    &mut self.scratch,
                    room,
                )
                .map_err(RelayError::BadRequestBody)?;
                if done {
                    self.req = ReqPhase::Sent;
                }
            }
            ReqPhase::Head | ReqPhase::Sent => {}
        }
        Ok(())
    }

    fn pump_response(&mut self) -> Result<(), RelayError> {
        let room = BUF_BYTES.saturating_sub(self.to_client.len());
        match &mut self.resp {
            RespPhase::Idle => {
                if !self.from_upstream.is_empty() {
                    // An app that talks out of turn cannot be trusted with the next
                    // request: its connection is not reused.
                    self.from_upstream.clear();
                    self.upstream_keep = false;
                }
            }
            RespPhase::Tunnel => {
                let n = room.min(self.from_upstream.len());
                self.to_client.extend(self.from_upstream.drain(..n));
            }
            RespPhase::Head => self.response_head()?,
            RespPhase::Body(body) => {
                if room == 0 {
                    return Ok(());
                }
                let done = move_body(
                    body,
                    &mut self.from_upstream,
                    &mut self.to_client,
                    &mut self.scratch,
                    room,
                )
                .map_err(RelayError::BadResponse)?;
                if done {
                    self.response_done();
                }
            }
        }
        Ok(())
    }

    fn response_head(&mut self) -> Result<(), RelayError> {
        if self.from_upstream.is_empty() {
            return Ok(());
        }
        let mut storage = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
        let mut r = httparse::Response::new(&mut storage);
        let end = match r.parse(&self.from_upstream) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                if self.from_upstream.len() > MAX_RESPONSE_HEAD_BYTES {
                    return Err(RelayError::BadResponse("response head too large"));
                }
                return Ok(());
            }
            Err(httparse::Error::TooManyHeaders) => {
                return Err(RelayError::BadResponse("too many header fields"))
            }
            Err(_) => return Err(RelayError::BadResponse("malformed response head")),
        };
        let code = r.code.unwrap_or(0);
        let minor = r.version.unwrap_or(0);
        if !(100..=999).contains(&code) {
            return Err(RelayError::BadResponse("invalid status code"));
        }
        let reason = r.reason.unwrap_or("").to_string();
        if reason.bytes().any(|c| c < 0x20 && c != b'\t') {
            return Err(RelayError::BadResponse("control character in reason"));
        }
        let mut fields: Vec<(String, Vec<u8>)> = Vec::with_capacity(r.headers.len());
        for h in r.headers.iter() {
            if h.value
                .iter()
                .any(|&c| (c < 0x20 && c != b'\t') || c == 0x7f)
            {
                return Err(RelayError::BadResponse(
                    "control character in a header value",
                ));
            }
            fields.push((h.name.to_ascii_lowercase(), h.value.to_vec()));
        }
        self.from_upstream.drain(..end);
        let get = |n: &str| {
            fields
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.as_slice())
        };
        let conn_close = fields
            .iter()
            .filter(|(k, _)| k == "connection")
            .any(|(_, v)| {
                v.split(|&c| c == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
            });
        let mut out = Vec::with_capacity(256 + end);
        out.extend_from_slice(format!("HTTP/1.1 {code} {reason}\r\n").as_bytes());
        if code == 101 {
            if !self.upgrade {
                return Err(RelayError::BadResponse(
                    "101 to a request that asked no upgrade",
                ));
            }
            for (n, v) in &fields {
                if !HOP_BY_HOP.contains(&n.as_str()) || n == "upgrade" {
                    header(&mut out, n, v);
                }
            }
            header(&mut out, "connection", b"upgrade");
            out.extend_from_slice(b"\r\n");
            self.to_client.extend_from_slice(&out);
            self.resp_started = true;
            self.req = ReqPhase::Tunnel;
            self.resp = RespPhase::Tunnel;
            // What the client sent after its upgrade request is the tunnel's.
            return Ok(());
        }
        if code < 200 {
            // 100 Continue, 103 Early Hints: passed on; the final head follows.
            for (n, v) in &fields {
                if !HOP_BY_HOP.contains(&n.as_str()) {
                    header(&mut out, n, v);
                }
            }
            out.extend_from_slice(b"\r\n");
            self.to_client.extend_from_slice(&out);
            return Ok(());
        }
        let chunked = get("transfer-encoding").map(|te| {
            te.rsplit(|&c| c == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
        });
        let length = get("content-length").and_then(|v| {
            std::str::from_utf8(v)
                .ok()
                .filter(|s| !s.is_empty() && s.len() <= 18 && s.bytes().all(|c| c.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
        });
        let lengths = fields.iter().filter(|(k, _)| k == "content-length").count();
        let body = if self.head_only || code == 204 || code == 304 {
            None
        } else {
            match (chunked, length) {
                (Some(true), _) => Some(Body::Chunked(ChunkedDecoder::new())),
                // Any other coding: the body ends with the connection (RFC 9112 §6.3).
                (Some(false), _) => Some(Body::UntilClose),
                (None, Some(n)) if lengths == 1 => Some(Body::Length(n)),
                (None, None) if lengths == 0 => Some(Body::UntilClose),
                _ => return Err(RelayError::BadResponse("invalid Content-Length")),
            }
        };
        let named = connection_named(&fields);
        for (n, v) in &fields {
            if HOP_BY_HOP.contains(&n.as_str())
                || n == "content-length"
                || named.iter().any(|c| c == n)
            {
                continue;
            }
            if n == "set-cookie" {
                header(&mut out, n, &host_only_cookie(v));
                continue;
            }
            header(&mut out, n, v);
        }
        match &body {
            Some(Body::Chunked(_)) => header(&mut out, "transfer-encoding", b"chunked"),
            Some(Body::Length(n)) => header(&mut out, "content-length", n.to_string().as_bytes()),
            // The length of a HEAD answer or a 304 describes the resource: kept.
            None if length.is_some() && code != 204 => header(
                &mut out,
                "content-length",
                length.unwrap_or(0).to_string().as_bytes(),
            ),
            _ => {}
        }
        let until_close = matches!(body, Some(Body::UntilClose));
        self.upstream_keep = minor == 1 && !conn_close && !until_close;
        if until_close || !self.client_keep {
            self.close_after_response = true;
            header(&mut out, "connection", b"close");
        }
        out.extend_from_slice(b"\r\n");
        self.to_client.extend_from_slice(&out);
        self.resp_started = true;
        match body {
            None => self.response_done(),
            Some(b) => self.resp = RespPhase::Body(b),
        }
        Ok(())
    }

    fn response_done(&mut self) {
        self.resp = RespPhase::Idle;
        if std::mem::take(&mut self.close_after_response) {
            self.close_client = true;
        }
        if matches!(self.req, ReqPhase::Sent) {
            self.req = ReqPhase::Head;
        } else {
            // Answered before the request body was all sent: the rest cannot be told
            // from the next request, so both connections end here.
            self.req = ReqPhase::Head;
            self.close_client = true;
            self.upstream_keep = false;
        }
    }

    /// The app closed its side (or its connection failed). Returns true when the
    /// client must be closed once its bytes are out; false when the app's connection
    /// simply ends and the client goes on.
    ///
    /// # Errors
    /// The response was cut short before any byte of it reached the client (the
    /// caller answers with its own page).
    pub fn upstream_eof(&mut self) -> Result<bool, RelayError> {
        self.upstream_keep = false;
        match &mut self.resp {
            RespPhase::Idle => Ok(self.close_client),
            RespPhase::Body(Body::UntilClose) => {
                let rest = std::mem::take(&mut self.from_upstream);
                self.to_client.extend_from_slice(&rest);
                self.response_done();
                self.close_client = true;
                Ok(true)
            }
            RespPhase::Head if !self.resp_started => Err(RelayError::BadResponse(
                "the app closed the connection without answering",
            )),
            _ => {
                self.close_client = true;
                Ok(true)
            }
        }
    }
}

/// Appends `name: value`.
fn header(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Moves body bytes from `from` to `to` (at most about `room`), chunked bodies decoded
/// and encoded again. True once the body is complete.
fn move_body(
    body: &mut Body,
    from: &mut Vec<u8>,
    to: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
    room: usize,
) -> Result<bool, &'static str> {
    match body {
        Body::Length(left) => {
            let n = usize::try_from(*left)
                .unwrap_or(usize::MAX)
                .min(from.len())
                .min(room);
            to.extend(from.drain(..n));
            *left -= n as u64;
            Ok(*left == 0)
        }
        Body::UntilClose => {
            let n = from.len().min(room);
            to.extend(from.drain(..n));
            Ok(false)
        }
        Body::Chunked(dec) => {
            scratch.clear();
            let upto = from.len().min(room);
            let n = dec
                .feed(&from[..upto], scratch, usize::MAX)
                .map_err(|e| match e {
                    super::chunked::ChunkError::Malformed(m) => m,
                    super::chunked::ChunkError::TooLarge => "body too large",
                })?;
            from.drain(..n);
            write_chunk(to, scratch);
            if dec.is_done() {
                to.extend_from_slice(LAST_CHUNK);
                return Ok(true);
            }
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Head {
        parse_head(raw.as_bytes()).unwrap()
    }

    fn fwd<'a>(target: &'a str) -> Forwarded<'a> {
        Forwarded {
            client: "192.0.2.9",
            proto: "http",
            target,
            strip: &["x-wbx-token"],
            cookie: Some("app=1"),
            trusted: true,
        }
    }

    fn text(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    #[test]
    fn claims_and_fields_that_are_not_the_apps_are_dropped() {
        // From a client that is not a trusted proxy: its address claims go, this hop's
        // address is the only one; fields its Connection names go; an empty body that
        // said so keeps its length.
        let mut r = Relay::new(Vec::new());
        let h = head(
            "POST /a HTTP/1.1\r\nHost: h\r\nConnection: x-secret-hop\r\nX-Secret-Hop: 1\r\n\
             X-Forwarded-For: 10.9.9.9\r\nX-Real-IP: 10.9.9.9\r\nTrue-Client-IP: 10.9.9.9\r\n\
             Content-Length: 0\r\n\r\n",
        );
        r.forward(
            &h,
            &Forwarded {
                trusted: false,
                ..fwd("/a")
            },
        );
        let up = text(&r.to_upstream).to_ascii_lowercase();
        assert!(up.contains("x-forwarded-for: 192.0.2.9\r\n"), "{up}");
        assert!(up.contains("content-length: 0\r\n"), "{up}");
        for gone in ["10.9.9.9", "x-secret-hop", "x-real-ip", "true-client-ip"] {
            assert!(!up.contains(gone), "{gone} in {up}");
        }
        // The answer: its Set-Cookie made host-only, fields its Connection names gone.
        r.to_upstream.clear();
        r.from_upstream.extend_from_slice(
            b"HTTP/1.1 200 OK\r\nConnection: x-app-hop\r\nX-App-Hop: 1\r\n\
              Set-Cookie: s=1; Path=/; DOMAIN=.example.com; HttpOnly\r\n\
              Set-Cookie: t=2;domain=example.com\r\nSet-Cookie: domain=3; Secure\r\n\
              Content-Length: 0\r\n\r\n",
        );
        r.pump().unwrap();
        let down = text(&r.to_client);
        assert!(
            down.contains("set-cookie: s=1; Path=/; HttpOnly\r\n"),
            "{down}"
        );
        assert!(down.contains("set-cookie: t=2\r\n"), "{down}");
        // A cookie named `domain` is a cookie, not an attribute.
        assert!(down.contains("set-cookie: domain=3; Secure\r\n"), "{down}");
        assert!(!down.to_ascii_lowercase().contains("example.com"), "{down}");
        assert!(!down.to_ascii_lowercase().contains("x-app-hop"), "{down}");
    }

    #[test]
    fn a_relay_whose_framing_broke_moves_nothing_more() {
        // A request body that breaks its chunked framing: one error, then the relay is
        // spent (a caller that pumps again must not get the same error forever).
        let mut r = Relay::new(Vec::new());
        let h = head("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
        r.forward(&h, &fwd("/"));
        r.from_client
            .extend_from_slice(b"zz\r\nGET /next HTTP/1.1\r\nHost: h\r\n\r\n");
        assert!(matches!(r.pump(), Err(RelayError::BadRequestBody(_))));
        for _ in 0..3 {
            r.pump().unwrap();
        }
        assert!(r.from_client.is_empty() && r.to_upstream.is_empty());
        assert_eq!((r.room_from_client(), r.room_from_upstream()), (0, 0));
        assert!(matches!(r.next_request(), Next::Wait));
        assert!(r.close_client);
        // The same for an app's answer that breaks its framing.
        let mut r = Relay::new(Vec::new());
        r.forward(&head("GET / HTTP/1.1\r\nHost: h\r\n\r\n"), &fwd("/"));
        r.from_upstream
            .extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n");
        assert!(matches!(r.pump(), Err(RelayError::BadResponse(_))));
        r.from_upstream
            .extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: y\r\n\r\n");
        r.pump().unwrap();
        assert!(r.to_client.is_empty());
    }

    #[test]
    fn a_request_is_rewritten_and_its_response_passed_back() {
        let mut r = Relay::new(Vec::new());
        let h = head(
            "POST /a?x=1 HTTP/1.1\r\nHost: 8000-sb-1.localhost\r\nConnection: keep-alive, x-custom\r\n\
             X-WBX-Token: secret\r\nCookie: wbx_token=secret; app=1\r\nX-Forwarded-For: 10.9.9.9\r\n\
             Authorization: Bearer app\r\nContent-Length: 5\r\n\r\n",
        );
        r.forward(&h, &fwd("/a?x=1"));
        let up = text(&r.to_upstream);
        assert!(up.starts_with("POST /a?x=1 HTTP/1.1\r\n"), "{up}");
        for want in [
            "host: 8000-sb-1.localhost\r\n",
            "authorization: Bearer app\r\n",
            "cookie: app=1\r\n",
            "x-forwarded-for: 10.9.9.9, 192.0.2.9\r\n",
            "x-forwarded-proto: http\r\n",
            "x-forwarded-host: 8000-sb-1.localhost\r\n",
            "content-length: 5\r\n",
        ] {
            assert!(up.contains(want), "{want:?} in {up}");
        }
        for gone in ["secret", "connection", "keep-alive"] {
            assert!(!up.to_ascii_lowercase().contains(gone), "{gone} in {up}");
        }
        r.to_upstream.clear();
        r.from_client.extend_from_slice(b"hel");
        r.pump().unwrap();
        assert_eq!(r.to_upstream, b"hel");
        r.from_client.extend_from_slice(b"loGET / HTTP/1.1\r\n");
        r.pump().unwrap();
        assert_eq!(r.to_upstream, b"hello");
        // The next request waits until the response is done.
        assert!(matches!(r.next_request(), Next::Wait));
        r.from_upstream.extend_from_slice(
            b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\nX-App: 1\r\n\r\nok",
        );
        r.pump().unwrap();
        let down = text(&r.to_client);
        assert_eq!(
            down, "HTTP/1.1 200 OK\r\nx-app: 1\r\ncontent-length: 2\r\n\r\nok",
            "an HTTP/1.0 app's keep-alive is its own business"
        );
        assert!(!r.close_client && r.is_idle());
        assert!(!r.upstream_reusable(), "an HTTP/1.0 app closes");
        r.from_client.extend_from_slice(b"Host: h\r\n\r\n");
        assert!(matches!(r.next_request(), Next::Head(h) if h.path == "/"));
    }

    #[test]
    fn a_head_is_taken_only_if_what_the_relay_adds_still_fits_the_bounds() {
        // Taken and forwarded as a head our parser takes, or refused with 431.
        let check = |raw: &str, taken: bool, what: &str| {
            let mut r = Relay::new(Vec::new());
            r.from_client.extend_from_slice(raw.as_bytes());
            match r.next_request() {
                Next::Head(h) => {
                    assert!(taken, "{what}");
                    r.forward(&h, &fwd("/"));
                    parse_head(&r.to_upstream).expect("the app gets a head our parser takes");
                }
                Next::Refused(e @ HttpError::TooLargeToForward(_)) => {
                    assert!(!taken, "{what}");
                    assert_eq!(e.status(), 431);
                }
                _ => panic!("{what}"),
            }
        };
        let many = |n: usize| {
            let mut raw = String::from("GET / HTTP/1.1\r\nHost: h\r\n");
            for i in 0..n {
                raw.push_str(&format!("x-h{i}: v\r\n"));
            }
            raw.push_str("\r\n");
            raw
        };
        // Host and n more: forward adds X-Forwarded-For, -Proto, -Host, ...
        let most = MAX_HEADERS - ADDED_HEADERS - 1;
        for (n, taken) in [(most - 1, true), (most, true), (most + 1, false)] {
            check(&many(n), taken, &format!("{n} fields"));
        }
        // A head whose Host is long: its copy in X-Forwarded-Host must fit too.
        let sized = |pad: usize| {
            format!(
                "GET / HTTP/1.1\r\nHost: {}\r\nx-pad: {}\r\n\r\n",
                "h".repeat(4000),
                "p".repeat(pad)
            )
        };
        let base = sized(0).len() + 4000 + ADDED_HEAD_BYTES;
        let fits = MAX_HEAD_BYTES - base;
        for (pad, taken) in [(fits - 1, true), (fits, true), (fits + 1, false)] {
            check(&sized(pad), taken, &format!("pad {pad}"));
        }
    }

    #[test]
    fn chunked_bodies_are_framed_anew_both_ways() {
        let mut r = Relay::new(Vec::new());
        let h = head("PUT /u HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
        r.forward(&h, &fwd("/u"));
        assert!(text(&r.to_upstream).contains("transfer-encoding: chunked\r\n"));
        r.to_upstream.clear();
        // Bare LF framing and an extension from the client: the app gets clean CRLF.
        r.from_client
            .extend_from_slice(b"3;ext=1\nabc\n0\nX-Trailer: 1\n\n");
        r.pump().unwrap();
        assert_eq!(text(&r.to_upstream), "3\r\nabc\r\n0\r\n\r\n");
        r.from_upstream.extend_from_slice(
            b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        );
        r.pump().unwrap();
        assert_eq!(
            text(&r.to_client),
            "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
        );
        assert!(r.upstream_reusable() && !r.close_client);
    }

    #[test]
    fn a_response_without_length_ends_with_the_app_and_closes_the_client() {
        let mut r = Relay::new(Vec::new());
        r.forward(&head("GET / HTTP/1.1\r\nHost: h\r\n\r\n"), &fwd("/"));
        r.from_upstream
            .extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\npart");
        r.pump().unwrap();
        assert!(!r.close_client, "not before the body is out");
        assert!(text(&r.to_client).contains("connection: close\r\n"));
        r.from_upstream.extend_from_slice(b"-rest");
        assert!(r.upstream_eof().unwrap());
        assert!(text(&r.to_client).ends_with("\r\n\r\npart-rest"));
    }

    #[test]
    fn a_client_that_asks_to_close_gets_the_whole_body_first() {
        let mut r = Relay::new(Vec::new());
        r.forward(
            &head("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"),
            &fwd("/"),
        );
        r.from_upstream
            .extend_from_slice(b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\n");
        r.pump().unwrap();
        assert!(text(&r.to_client).ends_with("connection: close\r\n\r\n"));
        assert!(!r.close_client, "the body is still to come");
        r.from_upstream.extend_from_slice(b"body");
        r.pump().unwrap();
        assert!(r.close_client && text(&r.to_client).ends_with("\r\n\r\nbody"));
    }

    #[test]
    fn head_204_304_and_informational_answers_have_no_body() {
        for (method, status, len) in [("HEAD", 200, "7"), ("GET", 204, ""), ("GET", 304, "9")] {
            let mut r = Relay::new(Vec::new());
            r.forward(
                &head(&format!("{method} / HTTP/1.1\r\nHost: h\r\n\r\n")),
                &fwd("/"),
            );
            let cl = if len.is_empty() {
                String::new()
            } else {
                format!("Content-Length: {len}\r\n")
            };
            r.from_upstream.extend_from_slice(
                format!("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 {status} X\r\n{cl}\r\n").as_bytes(),
            );
            r.pump().unwrap();
            let down = text(&r.to_client);
            assert!(
                down.starts_with("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 "),
                "{down}"
            );
            assert!(r.is_idle() && r.upstream_reusable(), "{method} {status}");
            if !len.is_empty() {
                assert!(
                    down.contains(&format!("content-length: {len}\r\n")),
                    "{down}"
                );
            }
        }
    }

    #[test]
    fn an_upgrade_becomes_a_tunnel_and_only_when_asked() {
        let mut r = Relay::new(Vec::new());
        let h = head(
            "GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Key: k\r\nSec-WebSocket-Version: 13\r\n\r\n",
        );
        r.forward(&h, &fwd("/ws"));
        let up = text(&r.to_upstream);
        assert!(
            up.contains("connection: upgrade\r\nupgrade: websocket\r\n"),
            "{up}"
        );
        assert!(up.contains("sec-websocket-key: k\r\n"), "{up}");
        r.from_client.extend_from_slice(b"\x81\x80early");
        r.from_upstream.extend_from_slice(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: a\r\n\r\n\x81\x02hi",
        );
        r.pump().unwrap();
        assert!(r.is_tunnel());
        r.pump().unwrap();
        let down = text(&r.to_client);
        assert!(
            down.contains("upgrade: websocket\r\n") && down.contains("connection: upgrade\r\n")
        );
        assert!(down.ends_with("\r\n\r\n\u{81}\u{2}hi") || r.to_client.ends_with(b"\x81\x02hi"));
        assert!(r.to_upstream.ends_with(b"\x81\x80early"));

        let mut r = Relay::new(Vec::new());
        r.forward(&head("GET / HTTP/1.1\r\nHost: h\r\n\r\n"), &fwd("/"));
        r.from_upstream
            .extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\n\r\n");
        assert!(matches!(r.pump(), Err(RelayError::BadResponse(_))));
        assert!(
            !r.resp_started(),
            "the caller can still answer with its own page"
        );
    }

    #[test]
    fn malformed_or_oversized_responses_are_refused() {
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: a\x01b\r\n\r\n",
            b"NOT HTTP\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ] {
            let mut r = Relay::new(Vec::new());
            r.forward(&head("GET / HTTP/1.1\r\nHost: h\r\n\r\n"), &fwd("/"));
            r.from_upstream.extend_from_slice(bad);
            assert!(r.pump().is_err(), "{}", text(bad));
        }
        // An HTTP/1.0 head with two Hosts reaches the app with the first alone.
        let mut r = Relay::new(Vec::new());
        r.forward(
            &head("GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n"),
            &fwd("/"),
        );
        let up = text(&r.to_upstream);
        assert!(
            up.contains("host: a\r\n") && !up.contains("host: b"),
            "{up}"
        );
        let mut r = Relay::new(Vec::new());
        r.forward(&head("GET / HTTP/1.1\r\nHost: h\r\n\r\n"), &fwd("/"));
        r.from_upstream.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        r.from_upstream
            .extend(std::iter::repeat_n(b'a', MAX_RESPONSE_HEAD_BYTES));
        assert!(r.pump().is_err());
    }

    #[test]
    fn reading_stops_at_the_bounds() {
        let mut r = Relay::new(Vec::new());
        r.forward(
            &head("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10000000\r\n\r\n"),
            &fwd("/"),
        );
        r.to_upstream = vec![0; BUF_BYTES];
        assert_eq!(r.room_from_client(), 0, "the app is not taking its bytes");
        r.to_upstream.clear();
        assert_eq!(r.room_from_client(), BUF_BYTES);
        r.from_upstream
            .extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n");
        r.pump().unwrap();
        r.to_client = vec![0; BUF_BYTES];
        assert_eq!(
            r.room_from_upstream(),
            0,
            "the client is not taking its bytes"
        );
        // An early answer ends both connections (the rest of the body cannot be told
        // from a next request).
        let mut r = Relay::new(Vec::new());
        r.forward(
            &head("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n"),
            &fwd("/"),
        );
        r.from_upstream
            .extend_from_slice(b"HTTP/1.1 413 Too Large\r\nContent-Length: 0\r\n\r\n");
        r.pump().unwrap();
        assert!(r.close_client && !r.upstream_reusable());
        // Answers the proxy gives itself queue no further than the bound: the next
        // pipelined head waits, and nothing more is read, until the client reads.
        let mut r = Relay::new(Vec::new());
        let h = head("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        r.from_client
            .extend_from_slice(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        r.answer(&h, &vec![b'p'; BUF_BYTES], true);
        assert!(matches!(r.next_request(), Next::Wait));
        assert_eq!(r.room_from_client(), 0);
        r.to_client.clear();
        assert!(matches!(r.next_request(), Next::Head(_)));
        // A head too long is refused.
        let mut r = Relay::new(vec![b'a'; MAX_HEAD_BYTES + 1]);
        assert!(matches!(
            r.next_request(),
            Next::Refused(HttpError::HeadTooLarge)
        ));
    }

    #[test]
    fn a_truncated_answer_is_an_error_before_its_head_only() {
        let mut r = Relay::new(Vec::new());
        r.forward(&head("GET / HTTP/1.1\r\nHost: h\r\n\r\n"), &fwd("/"));
        assert!(r.upstream_eof().is_err());
        let mut r = Relay::new(Vec::new());
        r.forward(&head("GET / HTTP/1.1\r\nHost: h\r\n\r\n"), &fwd("/"));
        r.from_upstream
            .extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc");
        r.pump().unwrap();
        assert_eq!(r.upstream_eof(), Ok(true));
    }
}

//! Public URLs of long-lived sandboxes: a request whose `Host` is
//! `<port>-<id>.<ISOBOX_PUBLIC_DOMAIN>` leaves the API and goes, with its connection,
//! to that port on the sandbox's own address.
//!
//! A connection is handed over at its first such head: its socket moves from the HTTP
//! component to this one, and from then on every request on it is relayed
//! (`http::relay`: each head parsed and written anew, chunked bodies framed anew, a
//! `101` to an upgrade turns it into a pipe). Each request is authorised on its own, by
//! the sandbox's token (`X-WBX-Token`, the `wbx_token` cookie, or `?wbx_token=`, which a
//! redirect moves into a cookie for that host only), and is routed by its own `Host`;
//! neither the token nor the cookie reaches the app. The connection to the app is made
//! on the pool (the reactor's filter has no `connect`), kept while the app keeps it,
//! and made again when a request names another sandbox or port.
//!
//! Tokens are not stored: a sandbox's token is an HMAC of its id under a key the daemon
//! draws at start, so it is the same on every call and checked in constant time without
//! a lookup (a wrong token learns nothing about which sandboxes exist).

use super::boxes::State;
use super::Daemon;
use crate::http::relay::{Forwarded, Next, Relay, RelayError};
use crate::http::{Head, Response};
use crate::reactor::{Addr, Component, ComponentId, Done, Readiness};
use mio::net::TcpStream;
use mio::{Interest, Token};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

/// The proxy component.
pub(crate) const PROXY: ComponentId = ComponentId(8);
/// A proxied connection's client socket (key: the connection).
const CLIENT: u16 = 0;
/// Its connection to the app.
const UPSTREAM: u16 = 1;
/// Its connection to the app while it is being made.
const DIAL: u16 = 2;
/// Timer: the connection's idle deadline.
const DEADLINE: u16 = 0;

/// How long a connection to an app may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A request in flight, or a tunnel, with no byte either way for this long is closed.
pub(crate) const ACTIVE_IDLE: Duration = Duration::from_secs(600);
/// The cookie that carries a sandbox's token.
const COOKIE: &str = "wbx_token";
/// The header that carries it.
const HEADER: &str = "x-wbx-token";
/// What a request to a sandbox that is gone is told.
const GONE: (&str, &str) = (
    "Sandbox not found",
    "This sandbox has ended or does not exist.",
);

/// Proxied connections on the loop.
pub(crate) struct Proxies;

impl Component<Daemon> for Proxies {
    fn name(&self) -> &'static str {
        "proxy"
    }

    fn ready(&self, d: &mut Daemon, pk: usize, what: u16, r: Readiness) {
        match what {
            CLIENT => d.proxy_client_event(pk, r.readable),
            UPSTREAM => d.proxy_upstream_event(pk, r.readable),
            DIAL => d.proxy_dial_event(pk),
            _ => {}
        }
    }

    fn timer(&self, d: &mut Daemon, pk: usize, what: u16, gen: u64) {
        if what == DEADLINE {
            d.proxy_timer(pk, gen);
        }
    }
}

/// Where a request goes: a port of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The sandbox's key and serial.
    key: usize,
    serial: u64,
    /// Its address and the port.
    addr: Ipv4Addr,
    port: u16,
}

/// The connection to the app.
struct Upstream {
    stream: TcpStream,
    token: Token,
    target: Target,
    eof: bool,
}

/// A connection to the app being made, on the loop (non-blocking: a sandbox whose
/// port swallows connections holds nothing but this socket for its 5 s).
struct Dial {
    stream: TcpStream,
    token: Token,
    since: Instant,
}

/// One proxied client connection.
pub(crate) struct ProxyConn {
    client: TcpStream,
    token: Token,
    serial: u64,
    peer: SocketAddr,
    relay: Relay,
    up: Option<Upstream>,
    /// A head waiting for its connection to the app.
    connecting: Option<(Box<Head>, Target, String)>,
    /// That connection, while it is being made.
    dial: Option<Dial>,
    /// Connections to the app asked for so far (a socket the pool opened is taken
    /// only for the latest one).
    attempt: u64,
    client_eof: bool,
    /// The client's socket may have bytes to read (set by its readable edge, cleared
    /// by a read that found it drained): no read is tried otherwise.
    client_readable: bool,
    /// The same for the app's socket.
    up_readable: bool,
    /// When the head being read began (its bytes wait in the relay), for the head
    /// timeout.
    head_since: Option<Instant>,
    /// Our side is shut; what the client still sends is dropped until it closes.
    closing: bool,
    last_io: Instant,
    timer_gen: u64,
    /// When that timer fires.
    timer_at: Instant,
}

/// A host under the public domain, as `Host` names it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PublicHost {
    /// Not under the public domain: the API's.
    No,
    /// Under it, but no sandbox address.
    Malformed,
    /// `<port>-<id>`.
    Port(u16, String),
}

/// Whether a browser says another origin started the request: an `Origin` that is
/// not this address (`null` included), or a `Sec-Fetch-Site` other than
/// `same-origin` and `none`. A client that sends neither is no browser page.
fn cross_site(head: &Head, scheme: &str) -> bool {
    if let Some(origin) = head.header("origin") {
        let own = format!("{scheme}://{}", head.header("host").unwrap_or_default());
        return !origin.trim().eq_ignore_ascii_case(&own);
    }
    head.header("sec-fetch-site")
        .is_some_and(|s| !matches!(s.trim(), "same-origin" | "none"))
}

/// Reads `Host` against the public domain.
pub(crate) fn public_host(host: Option<&str>, domain: &str) -> PublicHost {
    let Some(host) = host else {
        return PublicHost::No;
    };
    let host = host.trim().to_ascii_lowercase();
    // An IPv6 literal is never under a domain.
    if host.starts_with('[') {
        return PublicHost::No;
    }
    let name = host.rsplit_once(':').map_or(host.as_str(), |(n, _)| n);
    let name = name.trim_end_matches('.');
    let Some(label) = name.strip_suffix(domain).and_then(|l| l.strip_suffix('.')) else {
        return PublicHost::No;
    };
    // Only `<digits>-…` is a sandbox address: other names under the domain (an
    // `api.` beside the sandboxes) stay the API's.
    let Some((port, id)) = label
        .split_once('-')
        .filter(|(p, _)| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
    else {
        return PublicHost::No;
    };
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 && !port.starts_with('0') => p,
        _ => return PublicHost::Malformed,
    };
    let id = id.replacen("sb-", "sb_", 1);
    if !crate::wbx::sandboxes::valid_id(&id) {
        return PublicHost::Malformed;
    }
    // What follows the name is a port or nothing: the Host goes to the app and into
    // the cookie flow's redirect as it came (`…:@evil.example` would send a browser
    // elsewhere).
    if let Some((_, after)) = host.rsplit_once(':') {
        if after.is_empty() || after.len() > 5 || !after.bytes().all(|c| c.is_ascii_digit()) {
            return PublicHost::Malformed;
        }
    }
    PublicHost::Port(port, id)
}

/// The query without `wbx_token`, and the token it carried.
fn take_token_param(query: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(q) = query else {
        return (None, None);
    };
    let mut token = None;
    let rest: Vec<&str> = q
        .split('&')
        .filter(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            if k == COOKIE {
                token = crate::http::parse::percent_decode(v);
                false
            } else {
                true
            }
        })
        .collect();
    let rest = (!rest.is_empty()).then(|| rest.join("&"));
    (rest, token)
}

/// The `Cookie` value without ours, and our cookie's value.
fn take_token_cookie(head: &Head) -> (Option<String>, Vec<String>) {
    let mut token = Vec::new();
    let mut rest: Vec<String> = Vec::new();
    for (n, v) in &head.headers {
        if n != "cookie" {
            continue;
        }
        for pair in String::from_utf8_lossy(v).split(';') {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            match pair.split_once('=') {
                // Every one is kept: an app on another host under the domain can set
                // a `wbx_token` for the whole domain, which must not lock this one out.
                Some((k, v)) if k.trim() == COOKIE => token.push(v.trim().to_string()),
                _ => rest.push(pair.to_string()),
            }
        }
    }
    let rest = (!rest.is_empty()).then(|| rest.join("; "));
    (rest, token)
}

/// A small HTML page of the proxy's own (an address that cannot be served).
fn page(status: u16, title: &str, text: &str, head_only: bool, keep: bool) -> Vec<u8> {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let body = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title></head>\n\
         <body style=\"font-family:sans-serif;max-width:40em;margin:4em auto\"><h1>{t}</h1>\n<p>{x}</p>\n\
         <p><small>isobox public URL</small></p></body></html>\n",
        t = esc(title),
        x = esc(text)
    );
    let mut out = Vec::new();
    Response::bytes(status, "text/html; charset=utf-8", body.into_bytes())
        .with_header("Cache-Control", "no-store")
        .write_to(&mut out, head_only, keep);
    out
}

impl Daemon {
    /// The token of sandbox `id`'s public URLs.
    pub(crate) fn url_token(&self, id: &str) -> String {
        use base64::Engine;
        let tag = ring::hmac::sign(&self.url_key, format!("wbx-url:{id}").as_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref())
    }

    /// The public URL of `port` in sandbox `id`.
    pub(crate) fn public_url(&self, port: u16, id: &str) -> String {
        let p = &self.public;
        let suffix = match p.port {
            Some(n) if n != 0 => format!(":{n}"),
            _ => String::new(),
        };
        format!(
            "{}://{port}-{}.{}{suffix}/",
            p.scheme,
            id.replacen('_', "-", 1),
            p.domain
        )
    }

    fn token_ok(&self, id: &str, given: Option<&str>) -> bool {
        let Some(given) = given else {
            return false;
        };
        let want = self.url_token(id);
        // Digests of equal length: the comparison's time says nothing about the token.
        let d = |s: &str| ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
        subtle::ConstantTimeEq::ct_eq(d(&want).as_ref(), d(given).as_ref()).into()
    }

    /// Takes connection `ck` over from the HTTP component, its head being for a public
    /// URL.
    pub(crate) fn proxy_take(&mut self, ck: usize, head: Head) {
        let Some(mut c) = self.conns.try_remove(ck) else {
            return;
        };
        self.reactor.deregister(&mut c.stream, c.token);
        let entry = self.proxies.vacant_entry();
        let pk = entry.key();
        let token = match self.reactor.register(
            &mut c.stream,
            Addr::new(PROXY, pk, CLIENT),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            Ok(t) => t,
            Err(e) => {
                crate::error_limited!("op=register proxy err={e}");
                self.conn_uncount(c.peer);
                return;
            }
        };
        self.proxy_serial += 1;
        let rbuf = std::mem::take(&mut c.http.rbuf);
        // An answer to an earlier request on the connection may still be going out.
        let pending = c.http.take_pending_write();
        entry.insert(ProxyConn {
            client: c.stream,
            token,
            serial: self.proxy_serial,
            peer: c.peer,
            relay: Relay::new(rbuf),
            up: None,
            connecting: None,
            dial: None,
            attempt: 0,
            client_eof: c.http.read_eof,
            client_readable: true,
            up_readable: true,
            head_since: None,
            closing: false,
            last_io: Instant::now(),
            timer_gen: 0,
            timer_at: Instant::now(),
        });
        self.proxies[pk].relay.to_client = pending;
        self.proxy_arm(pk);
        // Connections to apps (kept alive, WebSockets) take at most three quarters of
        // the daemon's connections: the API always has the rest.
        if self.proxies.len() > proxied_cap(self.cfg.max_connections) {
            let out = page(
                503,
                "Busy",
                "Too many connections to sandboxes' apps are open right now; retry in a second.",
                head.method == "HEAD",
                true,
            );
            self.proxies[pk].relay.answer(&head, &out, true);
        } else {
            self.proxy_request(pk, Box::new(head));
        }
        self.proxy_advance(pk);
    }

    /// When connection `p` is to be closed: lingering, a head begun and not complete
    /// within the head timeout (as on the API), idle between requests, or no byte
    /// either way for `ACTIVE_IDLE` while a request is in flight or in a tunnel.
    fn proxy_deadline(&self, p: &ProxyConn) -> Instant {
        if let Some(d) = &p.dial {
            d.since + CONNECT_TIMEOUT
        } else if p.closing {
            p.last_io + crate::http::conn::LINGER
        } else if p.relay.is_idle() && p.connecting.is_none() {
            match p.head_since {
                Some(t) => t + Duration::from_millis(self.cfg.head_timeout_ms),
                None => p.last_io + Duration::from_millis(self.cfg.idle_timeout_ms),
            }
        } else {
            p.last_io + ACTIVE_IDLE
        }
    }

    fn proxy_arm(&mut self, pk: usize) {
        let Some(p) = self.proxies.get(pk) else {
            return;
        };
        let at = self.proxy_deadline(p);
        let gen = self.reactor.arm_new(at, Addr::new(PROXY, pk, DEADLINE));
        if let Some(p) = self.proxies.get_mut(pk) {
            p.timer_gen = gen;
            p.timer_at = at;
        }
    }

    /// Arms the timer again when the connection's deadline came nearer (a request
    /// ended: an idle keep-alive connection has the idle timeout, not the 10 minutes
    /// of one in use).
    fn proxy_rearm_if_sooner(&mut self, pk: usize) {
        let Some(p) = self.proxies.get(pk) else {
            return;
        };
        // Sooner, or the timer already fired (a connect's timeout, whose answer left
        // the connection waiting for its next request).
        if self.proxy_deadline(p) < p.timer_at || p.timer_at <= Instant::now() {
            self.proxy_arm(pk);
        }
    }

    fn proxy_timer(&mut self, pk: usize, gen: u64) {
        let Some(p) = self.proxies.get(pk).filter(|p| p.timer_gen == gen) else {
            return;
        };
        let now = Instant::now();
        if p.dial
            .as_ref()
            .is_some_and(|d| now >= d.since + CONNECT_TIMEOUT)
        {
            self.proxy_drop_dial(pk);
            self.proxy_dialed(pk, Err(io::ErrorKind::TimedOut.into()));
            self.proxy_advance(pk);
        } else if p.closing || now >= self.proxy_deadline(p) {
            self.proxy_close(pk);
        } else {
            self.proxy_arm(pk);
        }
    }

    /// Decides what request `head` gets: an answer of the proxy's own, or the app.
    fn proxy_request(&mut self, pk: usize, head: Box<Head>) {
        if !self.proxies.contains(pk) {
            return;
        }
        let head_only = head.method == "HEAD";
        log::debug!("proxy={pk} {} {}", head.method, head.path);
        let answer = |d: &mut Daemon, status: u16, title: &str, text: &str| {
            let out = page(status, title, text, head_only, true);
            if let Some(p) = d.proxies.get_mut(pk) {
                p.relay.answer(&head, &out, true);
            }
        };
        if self.app.shutting_down {
            return answer(
                self,
                503,
                "Shutting down",
                "The service is restarting; retry in a few seconds.",
            );
        }
        let (port, id) =
            match public_host(head.header("host"), &self.public.domain) {
                PublicHost::Port(port, id) => (port, id),
                // A request on a proxied connection for the API: one connection, one role.
                PublicHost::No | PublicHost::Malformed => return answer(
                    self,
                    404,
                    "No such address",
                    "This is not a sandbox address: they look like <port>-<sandbox id>.<domain>.",
                ),
            };
        let (rest_query, query_token) = take_token_param(head.query.as_deref());
        let (rest_cookie, cookie_tokens) = take_token_cookie(&head);
        let header_token = head.header(HEADER).map(str::to_string);
        let upgrade = head.header("upgrade").is_some();
        if let Some(t) = query_token.as_ref().filter(|_| !upgrade) {
            if !self.token_ok(&id, Some(t)) {
                return answer(self, 401, "Wrong token", "The wbx_token in this link is not this sandbox's. Ask for its URL again (GET /v1/sandboxes/{id}/url?port=).");
            }
            // The token moves into a cookie for this host alone and out of the URL.
            // The location is absolute, on this very host: a path like `//elsewhere`
            // must not send the browser to another site.
            let location = format!(
                "{}://{}{}{}",
                self.public.scheme,
                head.header("host").unwrap_or_default(),
                head.path,
                rest_query
                    .as_ref()
                    .map(|q| format!("?{q}"))
                    .unwrap_or_default()
            );
            let secure = if self.public.scheme == "https" {
                "; Secure"
            } else {
                ""
            };
            let status = if matches!(head.method.as_str(), "GET" | "HEAD") {
                302
            } else {
                307
            };
            let mut out = Vec::new();
            Response::bytes(
                status,
                "text/plain; charset=utf-8",
                b"Redirecting\n".to_vec(),
            )
            .with_header("Location", location)
            .with_header(
                "Set-Cookie",
                format!("{COOKIE}={t}; Path=/; HttpOnly; SameSite=Lax{secure}"),
            )
            .with_header("Cache-Control", "no-store")
            .with_header("Referrer-Policy", "no-referrer")
            .write_to(&mut out, head_only, true);
            if let Some(p) = self.proxies.get_mut(pk) {
                p.relay.answer(&head, &out, true);
            }
            return;
        }
        // Each token checked once. A WebSocket client cannot follow a redirect: its
        // link's token is taken as it is.
        let valid = |d: &Daemon, t: Option<&String>| t.is_some_and(|t| d.token_ok(&id, Some(t)));
        let explicit =
            valid(self, header_token.as_ref()) || (upgrade && valid(self, query_token.as_ref()));
        if !explicit && !cookie_tokens.iter().any(|t| valid(self, Some(t))) {
            return answer(self, 401, "Token needed", "This address needs its sandbox's token: open the url_with_token link, or send the X-WBX-Token header.");
        }
        // The cookie rides along on requests any page under the public domain starts
        // (every sandbox's address is the same site): one sandbox's page could open a
        // WebSocket to, or post to, another's app in its user's browser. A request the
        // cookie alone lets in that changes things must come from this address itself.
        let unsafe_method = !matches!(head.method.as_str(), "GET" | "HEAD" | "OPTIONS");
        if !explicit && (upgrade || unsafe_method) && cross_site(&head, &self.public.scheme) {
            return answer(self, 403, "Cross-site request", "Another site's page started this request, and only this address's cookie let it in. Open the app from its own address, or send the X-WBX-Token header.");
        }
        let Some(key) = self.boxes.by_id_any(&id) else {
            return answer(self, 404, GONE.0, GONE.1);
        };
        let b = &self.boxes.boxes[key];
        let target = match b.state {
            State::Running => match b.net_addr() {
                Some(addr) => Target {
                    key,
                    serial: b.serial,
                    addr,
                    port,
                },
                None => {
                    return answer(self, 502, "No network", "This sandbox has no network (network mode none, or the server runs without sandbox networking), so none of its ports can be reached.")
                }
            },
            State::Paused => {
                return answer(self, 409, "Sandbox paused", "This sandbox is paused. Resume it (POST /v1/sandboxes/{id}/resume) and reload.")
            }
            State::Starting => {
                return answer(self, 503, "Sandbox starting", "This sandbox is still starting; retry in a moment.")
            }
            State::Ending => {
                return answer(self, 404, GONE.0, GONE.1)
            }
        };
        let target_path = match &rest_query {
            Some(q) => format!("{}?{q}", head.path),
            None => head.path.clone(),
        };
        let Some(p) = self.proxies.get_mut(pk) else {
            return;
        };
        let mut head = head;
        strip_our_cookie(&mut head, rest_cookie);
        p.connecting = Some((head, target.clone(), target_path));
        let reuse =
            p.up.as_ref()
                .is_some_and(|u| u.target == target && !u.eof && p.relay.upstream_reusable());
        if reuse {
            self.proxy_send(pk);
            return;
        }
        self.proxy_drop_upstream(pk);
        // Opened without blocking (on the pool: the loop's seccomp filter has no
        // socket or connect), then watched on the loop until it is made: a sandbox
        // whose port swallows connections holds only this socket, for at most
        // CONNECT_TIMEOUT, never a worker.
        let Some(p) = self.proxies.get_mut(pk) else {
            return;
        };
        p.attempt += 1;
        let (serial, attempt) = (p.serial, p.attempt);
        let to = SocketAddr::new(target.addr.into(), target.port);
        let job = Box::new(move || -> Done<Daemon> {
            let r = TcpStream::connect(to).and_then(|s| {
                s.set_nodelay(true)?;
                Ok(s)
            });
            Box::new(move |d: &mut Daemon| d.proxy_dial_opened(pk, serial, attempt, r))
        });
        if self.reactor.submit(job).is_err() {
            self.proxy_fail(
                pk,
                503,
                "Busy",
                "The server is overloaded; retry in a second.",
            );
        }
    }

    /// The pool opened the connection to the app (in progress): watched until it is
    /// made, if it is still this connection's latest request's.
    fn proxy_dial_opened(
        &mut self,
        pk: usize,
        serial: u64,
        attempt: u64,
        r: io::Result<TcpStream>,
    ) {
        let Some(p) = self
            .proxies
            .get(pk)
            .filter(|p| p.serial == serial && p.attempt == attempt && p.connecting.is_some())
        else {
            return;
        };
        debug_assert!(p.dial.is_none());
        let mut stream = match r {
            Ok(s) => s,
            Err(e) => {
                self.proxy_dialed(pk, Err(e));
                self.proxy_advance(pk);
                return;
            }
        };
        let token =
            match self
                .reactor
                .register(&mut stream, Addr::new(PROXY, pk, DIAL), Interest::WRITABLE)
            {
                Ok(t) => t,
                Err(e) => {
                    crate::error_limited!("op=register proxy dial err={e}");
                    self.proxy_fail(
                        pk,
                        502,
                        "Unreachable",
                        "The daemon could not watch the connection.",
                    );
                    self.proxy_advance(pk);
                    return;
                }
            };
        if let Some(p) = self.proxies.get_mut(pk) {
            p.dial = Some(Dial {
                stream,
                token,
                since: Instant::now(),
            });
        }
        self.proxy_arm(pk);
    }

    /// The connection being made is writable or failed: made, refused, or not yet
    /// (a spurious wake).
    fn proxy_dial_event(&mut self, pk: usize) {
        let Some(d) = self.proxies.get(pk).and_then(|p| p.dial.as_ref()) else {
            return;
        };
        let Some(r) = connect_outcome(&d.stream) else {
            return;
        };
        let Some(mut d) = self.proxies.get_mut(pk).and_then(|p| p.dial.take()) else {
            return;
        };
        self.reactor.deregister(&mut d.stream, d.token);
        self.proxy_dialed(pk, r.map(|()| d.stream));
        self.proxy_advance(pk);
    }

    /// Forgets the connection being made, if any.
    fn proxy_drop_dial(&mut self, pk: usize) {
        if let Some(mut d) = self.proxies.get_mut(pk).and_then(|p| p.dial.take()) {
            self.reactor.deregister(&mut d.stream, d.token);
        }
    }

    /// The connection to the app was made (or not): the head waiting goes out on it,
    /// or gets the proxy's page.
    fn proxy_dialed(&mut self, pk: usize, r: io::Result<TcpStream>) {
        log::debug!("proxy={pk} connected: {:?}", r.as_ref().map(|_| ()));
        let Some(p) = self.proxies.get(pk) else {
            return;
        };
        let Some((_, target, _)) = p.connecting.as_ref() else {
            return;
        };
        let target = target.clone();
        let alive = self
            .boxes
            .boxes
            .get(target.key)
            .is_some_and(|b| b.serial == target.serial && b.state == State::Running);
        let s = match r {
            Ok(s) if alive => s,
            Ok(_) => return self.proxy_fail(pk, 404, GONE.0, GONE.1),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                let text = format!("Nothing listens on port {} in this sandbox. Start the app there, listening on 0.0.0.0 (not only 127.0.0.1).", target.port);
                return self.proxy_fail(pk, 502, "Nothing listening", &text);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                ) =>
            {
                return self.proxy_fail(
                    pk,
                    504,
                    "No answer",
                    "The sandbox did not answer the connection in time.",
                )
            }
            Err(e) => {
                let text = format!("The sandbox could not be reached: {e}.");
                return self.proxy_fail(pk, 502, "Unreachable", &text);
            }
        };
        let mut stream = s;
        let token = match self.reactor.register(
            &mut stream,
            Addr::new(PROXY, pk, UPSTREAM),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            Ok(t) => t,
            Err(e) => {
                crate::error_limited!("op=register proxy upstream err={e}");
                return self.proxy_fail(
                    pk,
                    502,
                    "Unreachable",
                    "The daemon could not watch the connection.",
                );
            }
        };
        if let Some(p) = self.proxies.get_mut(pk) {
            p.up_readable = true;
            p.up = Some(Upstream {
                stream,
                token,
                target,
                eof: false,
            });
        }
        self.proxy_send(pk);
    }

    /// Forwards the head waiting in `connecting` (its cookies already without ours) on
    /// the connection to the app.
    fn proxy_send(&mut self, pk: usize) {
        let Some(p) = self.proxies.get_mut(pk) else {
            return;
        };
        let Some((head, _, target_path)) = p.connecting.take() else {
            return;
        };
        let client = p.peer.ip().to_string();
        let cookie_value = head.header("cookie").map(str::to_string);
        let trusted = self.admission.trusts(p.peer.ip());
        p.relay.forward(
            &head,
            &Forwarded {
                client: &client,
                proto: &self.public.scheme,
                target: &target_path,
                strip: &[HEADER],
                cookie: cookie_value.as_deref(),
                trusted,
            },
        );
        p.last_io = Instant::now();
    }

    /// Answers the waiting head with the proxy's page (and forgets the connection
    /// being made).
    fn proxy_fail(&mut self, pk: usize, status: u16, title: &str, text: &str) {
        self.proxy_drop_dial(pk);
        let Some(p) = self.proxies.get_mut(pk) else {
            return;
        };
        if let Some((head, _, _)) = p.connecting.take() {
            let out = page(status, title, text, head.method == "HEAD", true);
            p.relay.answer(&head, &out, true);
        }
        // The caller moves the connection on (from within `proxy_advance`, its loop
        // does: a call from here would recurse once per pipelined request).
    }

    fn proxy_drop_upstream(&mut self, pk: usize) {
        let Some(p) = self.proxies.get_mut(pk) else {
            return;
        };
        if let Some(mut u) = p.up.take() {
            self.reactor.deregister(&mut u.stream, u.token);
        }
        if let Some(p) = self.proxies.get_mut(pk) {
            p.up_readable = true;
            p.relay.from_upstream.clear();
            p.relay.to_upstream.clear();
        }
    }

    fn proxy_client_event(&mut self, pk: usize, readable: bool) {
        if readable {
            let Some(p) = self.proxies.get_mut(pk) else {
                return;
            };
            p.client_readable = true;
            if p.closing {
                // Drain what the client still sends, then close at its end.
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match p.client.read(&mut buf) {
                        Ok(0) => {
                            self.proxy_close(pk);
                            return;
                        }
                        Ok(_) => continue,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                        Err(_) => {
                            self.proxy_close(pk);
                            return;
                        }
                    }
                }
            }
        }
        self.proxy_advance(pk);
    }

    fn proxy_upstream_event(&mut self, pk: usize, readable: bool) {
        if readable {
            if let Some(p) = self.proxies.get_mut(pk) {
                p.up_readable = true;
            }
        }
        self.proxy_advance(pk);
    }

    /// Reads what both sides have room for, moves it across, writes what is queued,
    /// and takes the next request; until nothing moves.
    fn proxy_advance(&mut self, pk: usize) {
        self.proxy_advance_io(pk);
        self.proxy_rearm_if_sooner(pk);
    }

    fn proxy_advance_io(&mut self, pk: usize) {
        loop {
            let moved = self.proxy_io(pk);
            let Some(p) = self.proxies.get_mut(pk) else {
                return;
            };
            if p.closing {
                return;
            }
            if let Err(e) = p.relay.pump() {
                self.proxy_relay_error(pk, e);
                continue;
            }
            let mut progressed = moved;
            let Some(p) = self.proxies.get_mut(pk) else {
                return;
            };
            if p.connecting.is_none() {
                match p.relay.next_request() {
                    Next::Head(h) => {
                        progressed = true;
                        p.head_since = None;
                        self.proxy_request(pk, h);
                    }
                    Next::Refused(e) => {
                        let out = page(e.status(), "Bad request", &e.to_string(), false, false);
                        p.relay.to_client.extend_from_slice(&out);
                        p.relay.close_client = true;
                        progressed = true;
                    }
                    Next::Wait => {
                        // A head has begun: it has the head timeout to be complete.
                        if p.head_since.is_none()
                            && p.relay.is_idle()
                            && !p.relay.from_client.is_empty()
                        {
                            p.head_since = Some(Instant::now());
                            self.proxy_arm(pk);
                        }
                    }
                }
            }
            if !progressed && !self.proxy_after(pk) {
                return;
            }
        }
    }

    /// Checks for the end of the connection. False when nothing more is to be done now.
    fn proxy_after(&mut self, pk: usize) -> bool {
        let Some(p) = self.proxies.get_mut(pk) else {
            return false;
        };
        // What the app sent before its end is passed on first (unless the client
        // takes nothing more).
        let up_eof = p.up.as_ref().is_some_and(|u| u.eof) && p.relay.upstream_drained();
        if up_eof {
            if p.relay.is_tunnel() {
                // The app ended its side of the pipe: the client's side ends too once
                // everything is out.
                p.relay.close_client = true;
            } else {
                match p.relay.upstream_eof() {
                    Ok(_) => {}
                    Err(e) => {
                        self.proxy_relay_error(pk, e);
                        return true;
                    }
                }
            }
            self.proxy_drop_upstream(pk);
            return true;
        }
        let Some(p) = self.proxies.get_mut(pk) else {
            return false;
        };
        let idle = p.relay.is_idle() && p.connecting.is_none();
        if p.client_eof
            && (idle || p.relay.is_tunnel())
            && p.relay.from_client.is_empty()
            && (p.relay.is_tunnel() || p.relay.to_client.is_empty())
        {
            if p.relay.is_tunnel() {
                if let Some(u) = p.up.as_mut() {
                    if p.relay.to_upstream.is_empty() {
                        let _ = u.stream.shutdown(std::net::Shutdown::Write);
                    }
                }
                if !p.relay.to_client.is_empty() || p.up.is_some() {
                    return false;
                }
            }
            self.proxy_close(pk);
            return false;
        }
        if p.relay.close_client && p.relay.to_client.is_empty() && p.connecting.is_none() {
            if p.client_eof {
                self.proxy_close(pk);
                return false;
            }
            let _ = p.client.shutdown(std::net::Shutdown::Write);
            p.closing = true;
            p.relay.from_client.clear();
            self.proxy_drop_upstream(pk);
            self.proxy_arm(pk);
            return false;
        }
        // An app connection that cannot carry the next request (HTTP/1.0, `close`,
        // or an app talking out of turn) is let go at once, not read on.
        if idle && p.up.is_some() && !p.relay.upstream_reusable() {
            self.proxy_drop_upstream(pk);
            return true;
        }
        false
    }

    fn proxy_relay_error(&mut self, pk: usize, e: RelayError) {
        let Some(p) = self.proxies.get_mut(pk) else {
            return;
        };
        crate::warn_limited!(client = p.peer.ip(); "proxy peer={} {e}", p.peer);
        if !p.relay.resp_started() && !p.relay.is_tunnel() {
            // The client's own bytes broke its request: a 400; the app's: a 502.
            let (status, title) = match e {
                RelayError::BadRequestBody(_) => (400, "Bad request"),
                RelayError::BadResponse(_) => (502, "Bad answer"),
            };
            let out = page(status, title, &format!("{e}."), false, false);
            p.relay.to_client.extend_from_slice(&out);
        }
        p.relay.close_client = true;
        self.proxy_drop_upstream(pk);
    }

    /// One round of socket I/O on both sides. True when any byte moved.
    fn proxy_io(&mut self, pk: usize) -> bool {
        let Some(p) = self.proxies.get_mut(pk) else {
            return false;
        };
        let mut moved = false;
        // One scratch buffer for every connection (a fresh one would be zeroed on
        // every pass).
        let buf = &mut self.proxy_buf;
        if buf.is_empty() {
            buf.resize(64 * 1024, 0);
        }
        // Each side is read until it says it is drained (WouldBlock): a short read is
        // not enough, since a FIN that came with the last bytes brings no new edge and
        // must still be read as the end.
        let mut client_failed = false;
        if !p.client_eof && p.client_readable {
            let got = read_side(
                &mut p.client,
                buf,
                &mut p.relay,
                Relay::room_from_client,
                |r| &mut r.from_client,
            );
            moved |= got.moved;
            p.client_readable = !got.drained;
            p.client_eof |= got.eof;
        }
        match write_side(&mut p.client, &mut p.relay.to_client) {
            Some(m) => moved |= m,
            None => client_failed = true,
        }
        if let Some(u) = p.up.as_mut() {
            match write_side(&mut u.stream, &mut p.relay.to_upstream) {
                Some(m) => moved |= m,
                None => u.eof = true,
            }
            if !u.eof && p.up_readable {
                let got = read_side(
                    &mut u.stream,
                    buf,
                    &mut p.relay,
                    Relay::room_from_upstream,
                    |r| &mut r.from_upstream,
                );
                moved |= got.moved;
                p.up_readable = !got.drained;
                u.eof |= got.eof;
            }
        }
        if moved {
            p.last_io = Instant::now();
        }
        if client_failed {
            self.proxy_close(pk);
            return false;
        }
        moved
    }

    /// Closes a proxied connection and its connection to the app.
    pub(crate) fn proxy_close(&mut self, pk: usize) {
        log::debug!("proxy={pk} closed");
        let Some(mut p) = self.proxies.try_remove(pk) else {
            return;
        };
        self.reactor.deregister(&mut p.client, p.token);
        if let Some(mut u) = p.up.take() {
            self.reactor.deregister(&mut u.stream, u.token);
        }
        if let Some(mut d) = p.dial.take() {
            self.reactor.deregister(&mut d.stream, d.token);
        }
        self.conn_uncount(p.peer);
    }

    /// Sandbox `key` ended: connections to its ports end with it (its link is going
    /// away, and with it any answer).
    pub(crate) fn proxy_sandbox_ended(&mut self, key: usize, serial: u64) {
        let gone: Vec<usize> = self
            .proxies
            .iter()
            .filter(|(_, p)| {
                p.up.as_ref()
                    .map(|u| &u.target)
                    .into_iter()
                    .chain(p.connecting.as_ref().map(|c| &c.1))
                    .any(|t| t.key == key && t.serial == serial)
            })
            .map(|(k, _)| k)
            .collect();
        for pk in gone {
            let Some(p) = self.proxies.get_mut(pk) else {
                continue;
            };
            if p.connecting.is_some() {
                self.proxy_fail(pk, 404, GONE.0, GONE.1);
                self.proxy_advance(pk);
                continue;
            }
            if p.relay.is_idle() {
                self.proxy_drop_upstream(pk);
            } else {
                self.proxy_close(pk);
            }
        }
    }

    /// Closes every proxied connection (shutdown).
    pub(crate) fn proxy_close_all(&mut self) {
        let all: Vec<usize> = self.proxies.iter().map(|(k, _)| k).collect();
        for pk in all {
            self.proxy_close(pk);
        }
    }
}

/// What one side's reads found.
struct Got {
    /// Bytes came.
    moved: bool,
    /// The socket said WouldBlock: nothing more until its next readable edge.
    drained: bool,
    /// The peer closed its side (or the socket failed).
    eof: bool,
}

/// Reads `sock` into the relay buffer `into` picks, as far as `room` allows, until it
/// is drained, closed, or out of room.
fn read_side(
    sock: &mut TcpStream,
    buf: &mut [u8],
    relay: &mut Relay,
    room: fn(&Relay) -> usize,
    into: fn(&mut Relay) -> &mut Vec<u8>,
) -> Got {
    let mut got = Got {
        moved: false,
        drained: false,
        eof: false,
    };
    loop {
        let n = room(relay).min(buf.len());
        if n == 0 {
            return got;
        }
        match sock.read(&mut buf[..n]) {
            Ok(0) => got.eof = true,
            Ok(k) => {
                into(relay).extend_from_slice(&buf[..k]);
                got.moved = true;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => got.drained = true,
            // A connection still being made has nothing to read yet.
            Err(e) if e.kind() == io::ErrorKind::NotConnected => {}
            Err(_) => got.eof = true,
        }
        return got;
    }
}

/// Connections to apps the daemon holds at once, of its `max_connections`: three
/// quarters (at least one), so the API keeps the rest.
pub(crate) fn proxied_cap(max_connections: usize) -> usize {
    (max_connections * 3 / 4).max(1)
}

/// How a connection being made without blocking went, once its socket is writable or
/// failed: made, failed (why), or `None` when not yet (a spurious wake).
pub(crate) fn connect_outcome(s: &TcpStream) -> Option<io::Result<()>> {
    match s.take_error() {
        Ok(Some(e)) | Err(e) => Some(Err(e)),
        Ok(None) => match s.peer_addr() {
            Ok(_) => Some(Ok(())),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => None,
            Err(e) => Some(Err(e)),
        },
    }
}

/// Writes what `out` holds to `sock` until it is empty or the socket is full. Whether
/// bytes went out, or `None` when the socket failed.
pub(crate) fn write_side(sock: &mut TcpStream, out: &mut Vec<u8>) -> Option<bool> {
    let mut moved = false;
    while !out.is_empty() {
        match sock.write(out) {
            Ok(0) => return None,
            Ok(n) => {
                out.drain(..n);
                moved = true;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::NotConnected
                ) =>
            {
                break
            }
            Err(_) => return None,
        }
    }
    Some(moved)
}

/// Replaces `head`'s `Cookie` fields by `rest` (the client's cookies without ours).
fn strip_our_cookie(head: &mut Head, rest: Option<String>) {
    head.headers.retain(|(n, _)| n != "cookie");
    if let Some(r) = rest {
        head.headers.push(("cookie".into(), r.into_bytes()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_hosts_are_read_strictly() {
        let id = "sb_0123456789abcdef01234567";
        let p = |h: &str| public_host(Some(h), "localhost");
        assert_eq!(
            p("8000-sb-0123456789abcdef01234567.localhost:8090"),
            PublicHost::Port(8000, id.into())
        );
        assert_eq!(
            p("8000-SB_0123456789ABCDEF01234567.LOCALHOST."),
            PublicHost::Port(8000, id.into())
        );
        for no in [
            "localhost:8090",
            "127.0.0.1:8090",
            "[::1]:8090",
            "x.localhost.evil",
            "notlocalhost",
        ] {
            assert_eq!(p(no), PublicHost::No, "{no}");
        }
        for bad in [
            "0-sb-0123456789abcdef01234567.localhost",
            "08000-sb-0123456789abcdef01234567.localhost",
            "70000-sb-0123456789abcdef01234567.localhost",
            "8000-sb-0123.localhost",
            "8000-sb-0123456789abcdef01234567.a.localhost",
            "8000-nonsense.localhost",
            "8000-sb-0123456789abcdef01234567.localhost:@evil.example",
            "8000-sb-0123456789abcdef01234567.localhost:",
            "8000-sb-0123456789abcdef01234567.localhost:808080",
        ] {
            assert_eq!(p(bad), PublicHost::Malformed, "{bad}");
        }
        assert_eq!(public_host(None, "localhost"), PublicHost::No);
    }

    #[test]
    fn the_token_leaves_query_and_cookie() {
        assert_eq!(
            take_token_param(Some("a=1&wbx_token=t%2Bk&b=2")),
            (Some("a=1&b=2".into()), Some("t+k".into()))
        );
        assert_eq!(
            take_token_param(Some("wbx_token=t")),
            (None, Some("t".into()))
        );
        assert_eq!(take_token_param(Some("a=1")), (Some("a=1".into()), None));
        let head = crate::http::parse::parse_head(
            b"GET / HTTP/1.1\r\nHost: h\r\nCookie: a=1; wbx_token=tok; b=2\r\nCookie: c=3\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            take_token_cookie(&head),
            (Some("a=1; b=2; c=3".into()), vec!["tok".to_string()])
        );
    }
}

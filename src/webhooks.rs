//! Webhook delivery: a thread of its own (started before the loop's seccomp) that
//! sends the outbox's due events, one at a time, and writes down how each went.
//!
//! - A delivery counts only on a 2xx within [`TIMEOUT`]; otherwise it is tried again
//!   after 10 s, 1 min, 5 min, 30 min, 2 h, 6 h and 12 h ([`SCHEDULE`]), then given up
//!   (`failed`). The schedule is in the outbox, so it survives restarts; an event whose
//!   delivery was cut by a crash is sent again at the next start: at least once, always
//!   with the event's id.
//! - Every request is signed: `X-WBX-Signature: t=<unix>,v1=<hex HMAC-SHA256 of
//!   "<t>.<body>">` with the tenant's secret, plus `X-WBX-Event` and `X-WBX-Delivery`.
//! - Only public `https://` targets: the name is resolved here, every address is
//!   checked against the deny list (metadata, private, loopback, link-local… and the
//!   operator's `ISOBOX_EGRESS_DENY`), IPv6 is not used, and the connection goes to
//!   an address that passed, never one resolved again later (no DNS rebinding).
//!   Redirects are not followed. With `ISOBOX_WBX_WEBHOOK_LOOPBACK=1` (tests, local
//!   use), `http://` to a loopback address is allowed as well.

use crate::netfilter::Cidr;
use crate::store::webhooks::OutboxEvent;
use crate::workspace::Sessions;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// How long a target has to answer.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Waits before each retry, in order.
pub const SCHEDULE: [u64; 7] = [10, 60, 300, 1800, 7200, 21600, 43200];
/// Longest webhook URL.
pub const MAX_URL_BYTES: usize = 2048;

/// Where deliveries may go.
#[derive(Debug, Clone)]
pub struct Policy {
    /// `http://` to loopback allowed (`ISOBOX_WBX_WEBHOOK_LOOPBACK`).
    pub loopback: bool,
    /// The operator's extra denied ranges.
    pub deny: Vec<Cidr>,
}

impl Policy {
    /// Whether a connection to `ip` may be made.
    fn allows(&self, ip: IpAddr) -> bool {
        self.allows_with(ip, &[])
    }

    /// [`Policy::allows`], the host's own addresses `local` refused too (a public
    /// address of the host would reach its own services).
    fn allows_with(&self, ip: IpAddr, local: &[std::net::Ipv4Addr]) -> bool {
        match ip {
            IpAddr::V4(v4) => {
                if self.loopback && v4.is_loopback() {
                    return true;
                }
                !crate::netfilter::is_denied(v4)
                    && !self.deny.iter().any(|c| c.contains(v4))
                    && !local.contains(&v4)
            }
            IpAddr::V6(v6) => self.loopback && v6.is_loopback(),
        }
    }
}

/// Why a delivery did not count: what the tenant sees (`last_error`), and the details
/// for the daemon's log. A tenant learns neither the addresses its URL resolved to
/// nor how a connection failed: the daemon is no scanner of its own networks.
#[derive(Debug, Clone)]
pub struct Undelivered {
    /// For the tenant.
    pub public: String,
    /// For the log.
    pub detail: String,
}

fn undelivered(public: &str, detail: String) -> Undelivered {
    Undelivered {
        public: public.to_string(),
        detail,
    }
}

/// A target, as checked at a job's submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `https` or (loopback only) `http`.
    pub scheme: String,
    /// The host as written (a name or an address).
    pub host: String,
    /// The port.
    pub port: u16,
}

/// Checks a `webhook_url` at submit: a public `https://` URL (a literal address must
/// be one deliveries may reach), or, with the loopback setting, `http://` to
/// loopback.
///
/// # Errors
/// In words, for the 400.
pub fn check_url(raw: &str, policy: &Policy) -> Result<Target, String> {
    if raw.len() > MAX_URL_BYTES {
        return Err(format!("at most {MAX_URL_BYTES} bytes"));
    }
    let url = url::Url::parse(raw).map_err(|e| format!("not a URL ({e})"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("a URL with a user name or password is not accepted".into());
    }
    let host = url.host().ok_or("the URL has no host")?;
    let ip: Option<IpAddr> = match &host {
        url::Host::Ipv4(a) => Some(IpAddr::V4(*a)),
        url::Host::Ipv6(a) => Some(IpAddr::V6(*a)),
        url::Host::Domain(_) => None,
    };
    let loopback_name = matches!(&host, url::Host::Domain(d) if *d == "localhost");
    let is_loopback = ip.is_some_and(|i| i.is_loopback()) || loopback_name;
    match url.scheme() {
        "https" => {}
        "http" if policy.loopback && is_loopback => {}
        "http" => {
            return Err(
                "only https:// addresses are accepted (http:// only to loopback, with ISOBOX_WBX_WEBHOOK_LOOPBACK=1)"
                    .into(),
            )
        }
        other => return Err(format!("the scheme {other}:// is not accepted; use https://")),
    }
    if let Some(ip) = ip {
        if !policy.allows(ip) {
            return Err(format!(
                "{ip} is not a public address (private, loopback, link-local, metadata and other special ranges are refused)"
            ));
        }
    }
    Ok(Target {
        scheme: url.scheme().to_string(),
        host: url.host_str().unwrap_or("").to_string(),
        port: url.port_or_known_default().unwrap_or(443),
    })
}

/// `t=<t>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub fn signature(secret: &str, t: u64, body: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(t.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body.as_bytes());
    let tag = ctx.sign();
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("t={t},v1={hex}")
}

/// A fresh signing secret: `whsec_` and 48 hex digits.
pub fn new_secret() -> Option<String> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 24];
    ring::rand::SystemRandom::new().fill(&mut b).ok()?;
    Some(format!(
        "whsec_{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    ))
}

/// Sends `ev` once: `Ok(status)` for a 2xx, else why not. No connection is made to an
/// address the policy refuses, nor to one of the host's own.
pub fn deliver(
    ev: &OutboxEvent,
    id: &str,
    secret: &str,
    policy: &Policy,
) -> Result<u16, Undelivered> {
    let target = check_url(&ev.url, policy).map_err(|e| undelivered(&e, e.clone()))?;
    let addrs: Vec<SocketAddr> = (target.host.trim_matches(['[', ']']), target.port)
        .to_socket_addrs()
        .map_err(|e| undelivered(&format!("{} does not resolve", target.host), e.to_string()))?
        .collect();
    let local: Vec<std::net::Ipv4Addr> = crate::netfilter::rtnl::Rtnl::open()
        .and_then(|mut r| r.addrs())
        .map_err(|e| {
            undelivered(
                "the server could not check the address",
                format!("listing the host's addresses: {e}"),
            )
        })?
        .into_iter()
        .map(|a| a.addr)
        .collect();
    let allowed: Vec<SocketAddr> = addrs
        .iter()
        .copied()
        .filter(|a| policy.allows_with(a.ip(), &local))
        .collect();
    if allowed.is_empty() {
        return Err(undelivered(
            &format!(
                "{} resolves only to addresses deliveries may not reach: nothing was sent",
                target.host
            ),
            format!(
                "{} resolved to {}",
                target.host,
                addrs
                    .iter()
                    .map(|a| a.ip().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    // The connection goes to an address checked here, whatever the name resolves to
    // a moment later.
    let agent = ureq::AgentBuilder::new()
        .timeout(TIMEOUT)
        .timeout_connect(Duration::from_secs(5))
        .redirects(0)
        .resolver(move |_: &str| Ok(allowed.clone()))
        .build();
    let t = crate::workspace::now_ms() / 1000;
    let delivery = new_secret().map_or_else(|| "dlv".to_string(), |s| format!("dlv_{}", &s[6..30]));
    let r = agent
        .post(&ev.url)
        .set("Content-Type", "application/json")
        .set("User-Agent", "isobox-webhooks")
        .set("X-WBX-Signature", &signature(secret, t, &ev.body))
        .set("X-WBX-Event", &ev.event)
        .set("X-WBX-Delivery", &delivery)
        .set("X-WBX-Event-Id", id)
        .send_string(&ev.body);
    let answered = |code: u16| {
        undelivered(
            &format!("the target answered {code}"),
            format!("status {code}"),
        )
    };
    match r {
        Ok(resp) if (200..300).contains(&resp.status()) => Ok(resp.status()),
        Ok(resp) => Err(answered(resp.status())),
        Err(ureq::Error::Status(code, _)) => Err(answered(code)),
        Err(ureq::Error::Transport(t)) => Err(undelivered(
            "no answer within 10 s (the connection failed or timed out)",
            transport_detail(&t, &target),
        )),
    }
}

/// How a connection failed, for the log: never the URL (ureq's own words start with
/// it, and a webhook URL's path or query often is its secret), only its host and port.
fn transport_detail(t: &ureq::Transport, target: &Target) -> String {
    let mut s = format!("{}:{}: {}", target.host, target.port, t.kind());
    if let Some(m) = t.message() {
        s.push_str(": ");
        s.push_str(m);
    }
    if let Some(e) = std::error::Error::source(t) {
        s.push_str(": ");
        s.push_str(&e.to_string());
    }
    s
}

/// The delivery thread's handle: a nudge when an event was put in the outbox.
#[derive(Clone)]
pub struct Deliveries {
    wake: Sender<()>,
}

impl Deliveries {
    /// Starts the thread.
    ///
    /// # Errors
    /// When the thread cannot be made.
    pub fn start(sessions: Arc<Sessions>, policy: Policy) -> std::io::Result<Deliveries> {
        let (wake, rx) = crossbeam_channel::bounded(64);
        std::thread::Builder::new()
            .name("isobox-webhooks".into())
            .spawn(move || run(&sessions, &policy, &rx))?;
        Ok(Deliveries { wake })
    }

    /// An event is in the outbox: look now.
    pub fn nudge(&self) {
        let _ = self.wake.try_send(());
    }
}

fn run(sessions: &Sessions, policy: &Policy, wake: &Receiver<()>) {
    // Events whose new state could not be written: their backoff is kept here, so a
    // store that refuses writes does not make them be sent on every pass.
    let mut unwritten: std::collections::HashMap<String, OutboxEvent> = Default::default();
    loop {
        let store = sessions.store();
        let now = crate::workspace::now_ms();
        let mut events = match store.outbox() {
            Ok(e) => e,
            Err(e) => {
                log::error!("webhooks: reading the outbox: {e}");
                Vec::new()
            }
        };
        for (id, e) in events.iter_mut() {
            if let Some(kept) = unwritten.get(id) {
                *e = kept.clone();
            }
        }
        events.retain(|(_, e)| e.state == "pending");
        events.sort_by_key(|(_, e)| e.next_ms);
        let mut next = now + 60_000;
        for (id, mut ev) in events {
            if ev.next_ms > crate::workspace::now_ms() {
                next = next.min(ev.next_ms);
                continue;
            }
            let secret = match store.webhook_secret(&ev.tenant) {
                Ok(Some(s)) => s,
                Ok(None) => match new_secret()
                    .ok_or_else(|| "no randomness".to_string())
                    .and_then(|s| {
                        store
                            .set_webhook_secret(&ev.tenant, &s, false)
                            .map_err(|e| e.to_string())
                    }) {
                    Ok(s) => s,
                    Err(e) => {
                        log::error!("webhooks: a secret for {}: {e}", ev.tenant);
                        continue;
                    }
                },
                Err(e) => {
                    log::error!("webhooks: reading a secret: {e}");
                    continue;
                }
            };
            ev.attempts += 1;
            match deliver(&ev, &id, &secret, policy) {
                Ok(status) => {
                    log::info!(
                        "webhook {} {id} delivered ({status}) after {} attempts",
                        ev.event,
                        ev.attempts
                    );
                    ev.state = "delivered".into();
                    ev.delivered_ms = Some(crate::workspace::now_ms());
                    ev.last_error = None;
                }
                Err(why) => {
                    crate::warn_limited!(
                        "webhook {} {id}: attempt {} did not count: {} ({})",
                        ev.event,
                        ev.attempts,
                        why.public,
                        why.detail
                    );
                    ev.last_error = Some(why.public);
                    match SCHEDULE.get(ev.attempts as usize - 1) {
                        Some(wait) => {
                            ev.next_ms = crate::workspace::now_ms() + wait * 1000;
                            next = next.min(ev.next_ms);
                        }
                        None => ev.state = "failed".into(),
                    }
                }
            }
            match store.put_outbox_event(&id, &ev) {
                Ok(()) => {
                    unwritten.remove(&id);
                }
                Err(e) => {
                    log::error!("webhooks: writing {id}'s delivery: {e}");
                    unwritten.insert(id, ev);
                }
            }
        }
        let wait = next.saturating_sub(crate::workspace::now_ms()).max(50);
        match wake.recv_timeout(Duration::from_millis(wait)) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(loopback: bool) -> Policy {
        Policy {
            loopback,
            deny: vec!["203.0.113.0/24".parse().unwrap()],
        }
    }

    #[test]
    fn test_only_public_https_targets() {
        let p = policy(false);
        assert!(check_url("https://hooks.example.com/wbx", &p).is_ok());
        assert!(check_url("https://8.8.8.8/x", &p).is_ok());
        for bad in [
            "http://hooks.example.com/",
            "https://169.254.169.254/latest/meta-data",
            "https://10.0.0.1/",
            "https://127.0.0.1:8080/",
            "https://[::1]/",
            "https://203.0.113.7/",
            "https://user:pw@hooks.example.com/",
            "ftp://hooks.example.com/",
            "not a url",
        ] {
            assert!(check_url(bad, &p).is_err(), "{bad}");
        }
        let l = policy(true);
        assert!(check_url("http://127.0.0.1:8080/hook", &l).is_ok());
        assert!(check_url("http://localhost:8080/hook", &l).is_ok());
        assert!(check_url("http://10.0.0.1/", &l).is_err());
    }

    #[test]
    fn test_signature_is_the_documents() {
        // HMAC-SHA256 of "<t>.<body>", hex (checked against Python's hmac in
        // tests/wbx_jobs.rs with the document's own snippet).
        let s = signature("whsec_x", 1_700_000_000, "{}");
        assert!(s.starts_with("t=1700000000,v1="));
        assert_eq!(s.len(), "t=1700000000,v1=".len() + 64);
        assert_ne!(s, signature("whsec_y", 1_700_000_000, "{}"));
    }

    #[test]
    fn test_a_name_that_resolves_to_a_refused_address_gets_no_connection() {
        let ev = OutboxEvent {
            url: "https://localhost:1/".into(),
            body: "{}".into(),
            event: "job.finished".into(),
            ..Default::default()
        };
        let e = deliver(&ev, "job_x", "s", &policy(false)).unwrap_err();
        assert!(
            e.public
                .contains("resolves only to addresses deliveries may not reach"),
            "{e:?}"
        );
        // The tenant does not learn where the name points; the log does.
        assert!(
            !e.public.contains("127.0.0.1") && e.detail.contains("127.0.0.1"),
            "{e:?}"
        );
    }

    #[test]
    fn test_a_failed_connection_is_logged_without_the_urls_path_or_query() {
        // A loopback port nothing listens on (bound, then let go).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let ev = OutboxEvent {
            url: format!("http://127.0.0.1:{port}/hooks/T0SECRETPATH?token=S3CRET"),
            body: "{}".into(),
            event: "job.finished".into(),
            ..Default::default()
        };
        let e = deliver(&ev, "job_x", "s", &policy(true)).unwrap_err();
        assert_eq!(
            e.public,
            "no answer within 10 s (the connection failed or timed out)"
        );
        assert!(
            e.detail.starts_with(&format!("127.0.0.1:{port}: "))
                && e.detail.to_lowercase().contains("refused"),
            "{e:?}"
        );
        for secret in ["SECRETPATH", "S3CRET", "hooks", "http:"] {
            assert!(!e.detail.contains(secret), "{secret} in {e:?}");
        }
    }
}

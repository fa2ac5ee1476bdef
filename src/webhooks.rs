//! Webhook delivery: threads of their own (started before the loop's seccomp): a
//! scheduler that hands the outbox's due events to [`WORKERS`] senders and writes down
//! how each went.
//!
//! - Fair between tenants: at most [`PER_TENANT`] deliveries of a tenant are in flight,
//!   and the next due event goes to the tenant with the fewest in flight, then the one
//!   served longest ago; so a tenant whose target never answers (each attempt takes
//!   [`TIMEOUT`]) holds two senders, and the other tenants' events go out on time
//!   unless four such tenants hold them all. A name's resolution is bounded too
//!   ([`DNS_TIMEOUT`], at most [`MAX_RESOLVING`] at once).
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
use crossbeam_channel::{Receiver, Sender};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// How long a target has to answer.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Waits before each retry, in order.
pub const SCHEDULE: [u64; 7] = [10, 60, 300, 1800, 7200, 21600, 43200];
/// Longest webhook URL.
pub const MAX_URL_BYTES: usize = 2048;
/// Deliveries in flight at once.
pub const WORKERS: usize = 8;
/// Deliveries of one tenant in flight at once.
pub const PER_TENANT: usize = 2;
/// Names being resolved at once (a resolution past [`DNS_TIMEOUT`] goes on in its
/// thread until the system's resolver gives up).
pub const MAX_RESOLVING: usize = 16;
/// How long a target's name has to resolve.
pub const DNS_TIMEOUT: Duration = Duration::from_secs(5);

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
    let addrs: Vec<SocketAddr> = resolve(target.host.trim_matches(['[', ']']), target.port)
        .map_err(|e| undelivered(&format!("{} does not resolve", target.host), e.to_string()))?;
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

/// `host`'s addresses, within [`DNS_TIMEOUT`] (the system's resolver may take far
/// longer for a name whose servers do not answer; its thread is left to finish).
fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static RESOLVING: AtomicUsize = AtomicUsize::new(0);
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    if RESOLVING.fetch_add(1, Ordering::SeqCst) >= MAX_RESOLVING {
        RESOLVING.fetch_sub(1, Ordering::SeqCst);
        return Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "the resolver is busy with names that do not answer",
        ));
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    let name = host.to_string();
    let spawned = std::thread::Builder::new()
        .name("isobox-webhook-dns".into())
        .spawn(move || {
            let r = (name.as_str(), port)
                .to_socket_addrs()
                .map(Iterator::collect::<Vec<_>>);
            RESOLVING.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        RESOLVING.fetch_sub(1, Ordering::SeqCst);
        return Err(e);
    }
    rx.recv_timeout(DNS_TIMEOUT).unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {} s", DNS_TIMEOUT.as_secs()),
        ))
    })
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

/// The delivery threads' handle: a nudge when an event was put in the outbox.
#[derive(Clone)]
pub struct Deliveries {
    wake: Sender<()>,
}

/// An event handed to a sender (its attempt counted).
struct Task {
    id: String,
    ev: OutboxEvent,
    secret: String,
}

/// How a sender's attempt went.
struct Attempted {
    id: String,
    ev: OutboxEvent,
    result: Result<u16, Undelivered>,
}

impl Deliveries {
    /// Starts the scheduler and its senders.
    ///
    /// # Errors
    /// When a thread cannot be made.
    pub fn start(sessions: Arc<Sessions>, policy: Policy) -> std::io::Result<Deliveries> {
        let (wake, rx) = crossbeam_channel::bounded(64);
        let (task_tx, task_rx) = crossbeam_channel::bounded::<Task>(WORKERS);
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<Attempted>();
        let policy = Arc::new(policy);
        for n in 0..WORKERS {
            let (tasks, done, policy) = (task_rx.clone(), done_tx.clone(), Arc::clone(&policy));
            std::thread::Builder::new()
                .name(format!("isobox-webhook-{n}"))
                .spawn(move || {
                    for t in tasks {
                        let result = deliver(&t.ev, &t.id, &t.secret, &policy);
                        let a = Attempted {
                            id: t.id,
                            ev: t.ev,
                            result,
                        };
                        if done.send(a).is_err() {
                            return;
                        }
                    }
                })?;
        }
        std::thread::Builder::new()
            .name("isobox-webhooks".into())
            .spawn(move || run(&sessions, &rx, &task_tx, &done_rx))?;
        Ok(Deliveries { wake })
    }

    /// An event is in the outbox: look now.
    pub fn nudge(&self) {
        let _ = self.wake.try_send(());
    }
}

/// The tenant's signing secret, made on first use.
fn secret_for(store: &crate::store::Store, tenant: &str) -> Option<String> {
    match store.webhook_secret(tenant) {
        Ok(Some(s)) => Some(s),
        Ok(None) => match new_secret()
            .ok_or_else(|| "no randomness".to_string())
            .and_then(|s| {
                store
                    .set_webhook_secret(tenant, &s, false)
                    .map_err(|e| e.to_string())
            }) {
            Ok(s) => Some(s),
            Err(e) => {
                log::error!("webhooks: a secret for {tenant}: {e}");
                None
            }
        },
        Err(e) => {
            log::error!("webhooks: reading a secret: {e}");
            None
        }
    }
}

/// How many deliveries of `tenant` are in flight.
fn flying(in_flight: &std::collections::HashMap<String, String>, tenant: &str) -> usize {
    in_flight.values().filter(|t| *t == tenant).count()
}

/// Whether event `id` of `tenant` may be handed to a sender (when due).
fn may_go(in_flight: &std::collections::HashMap<String, String>, id: &str, tenant: &str) -> bool {
    !in_flight.contains_key(id) && flying(in_flight, tenant) < PER_TENANT
}

/// Which due event goes out next: none of a tenant with [`PER_TENANT`] in flight; of
/// the rest, the tenant with the fewest in flight, then the one served longest ago
/// (`served`: its last turn), then the event due first.
fn next_due(
    pending: &[(String, OutboxEvent)],
    in_flight: &std::collections::HashMap<String, String>,
    served: &std::collections::HashMap<String, u64>,
    now: u64,
) -> Option<usize> {
    pending
        .iter()
        .enumerate()
        .filter(|(_, (id, e))| e.next_ms <= now && may_go(in_flight, id, &e.tenant))
        .min_by_key(|(_, (_, e))| {
            (
                flying(in_flight, &e.tenant),
                served.get(&e.tenant).copied().unwrap_or(0),
                e.next_ms,
            )
        })
        .map(|(i, _)| i)
}

fn run(sessions: &Sessions, wake: &Receiver<()>, tasks: &Sender<Task>, done: &Receiver<Attempted>) {
    use std::collections::HashMap;
    // Events whose new state could not be written: their backoff is kept here, so a
    // store that refuses writes does not make them be sent on every pass.
    let mut unwritten: HashMap<String, OutboxEvent> = HashMap::new();
    // The outbox's pending events (read again at each nudge, and each minute: the
    // recovery at a start and the retention sweep change it without one).
    let mut pending: Vec<(String, OutboxEvent)> = Vec::new();
    let mut scan = true;
    let mut scanned = std::time::Instant::now();
    // Event id → tenant, for those with a sender.
    let mut in_flight: HashMap<String, String> = HashMap::new();
    // Tenant → its last turn.
    let mut served: HashMap<String, u64> = HashMap::new();
    let mut turn = 0u64;
    loop {
        let store = sessions.store();
        if scan || scanned.elapsed() >= Duration::from_secs(60) {
            scan = false;
            scanned = std::time::Instant::now();
            pending = match store.outbox() {
                Ok(e) => e,
                Err(e) => {
                    log::error!("webhooks: reading the outbox: {e}");
                    Vec::new()
                }
            };
            for (id, e) in &mut pending {
                if let Some(kept) = unwritten.get(id) {
                    *e = kept.clone();
                }
            }
            pending.retain(|(_, e)| e.state == "pending");
        }
        let now = crate::workspace::now_ms();
        while in_flight.len() < WORKERS {
            let Some(i) = next_due(&pending, &in_flight, &served, now) else {
                break;
            };
            let Some(secret) = secret_for(store, &pending[i].1.tenant) else {
                // Tried again in a minute (the store refused).
                pending[i].1.next_ms = now + 60_000;
                continue;
            };
            let (id, mut ev) = pending[i].clone();
            ev.attempts += 1;
            turn += 1;
            served.insert(ev.tenant.clone(), turn);
            in_flight.insert(id.clone(), ev.tenant.clone());
            if tasks.send(Task { id, ev, secret }).is_err() {
                return;
            }
        }
        // Woken by the next event that could go (or a sender's end, or a nudge).
        let next = if in_flight.len() >= WORKERS {
            u64::MAX
        } else {
            pending
                .iter()
                .filter(|(id, e)| may_go(&in_flight, id, &e.tenant))
                .map(|(_, e)| e.next_ms)
                .min()
                .unwrap_or(u64::MAX)
        }
        .min(now + 60_000);
        let wait = Duration::from_millis(next.saturating_sub(now).max(50));
        crossbeam_channel::select! {
            recv(wake) -> m => {
                if m.is_err() {
                    return;
                }
                // One read of the outbox for every nudge queued meanwhile.
                while wake.try_recv().is_ok() {}
                scan = true;
            }
            recv(done) -> a => {
                let Ok(Attempted { id, mut ev, result }) = a else {
                    return;
                };
                in_flight.remove(&id);
                match result {
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
                            Some(wait) => ev.next_ms = crate::workspace::now_ms() + wait * 1000,
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
                        unwritten.insert(id.clone(), ev.clone());
                    }
                }
                pending.retain(|(i, _)| *i != id);
                if ev.state == "pending" {
                    pending.push((id, ev));
                }
            }
            default(wait) => {}
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
    fn test_the_next_delivery_goes_to_the_tenant_with_fewest_in_flight_then_served_longest_ago() {
        let ev = |tenant: &str, next_ms: u64| OutboxEvent {
            tenant: tenant.into(),
            next_ms,
            state: "pending".into(),
            ..Default::default()
        };
        let pending = vec![
            ("a1".to_string(), ev("a", 10)),
            ("a2".to_string(), ev("a", 20)),
            ("a3".to_string(), ev("a", 25)),
            ("b1".to_string(), ev("b", 30)),
            ("c1".to_string(), ev("c", 500)),
        ];
        let mut in_flight = std::collections::HashMap::new();
        let mut served = std::collections::HashMap::new();
        // Nobody served yet: the one due first.
        assert_eq!(next_due(&pending, &in_flight, &served, 100), Some(0));
        // a was served: b's, though due later; c's is not due.
        served.insert("a".to_string(), 1);
        assert_eq!(next_due(&pending, &in_flight, &served, 100), Some(3));
        // b served after a: a's first again.
        served.insert("b".to_string(), 2);
        assert_eq!(next_due(&pending, &in_flight, &served, 100), Some(0));
        // The tenant with fewer in flight first, whoever was served last.
        in_flight.insert("a1".to_string(), "a".to_string());
        assert_eq!(next_due(&pending, &in_flight, &served, 100), Some(3));
        // Even: served longest ago (a, turn 1).
        in_flight.insert("b1".to_string(), "b".to_string());
        assert_eq!(next_due(&pending, &in_flight, &served, 100), Some(1));
        // A tenant at PER_TENANT gets no more; b has nothing else due.
        in_flight.insert("a2".to_string(), "a".to_string());
        assert_eq!(PER_TENANT, 2);
        assert_eq!(next_due(&pending, &in_flight, &served, 100), None);
        assert_eq!(next_due(&pending, &in_flight, &served, 500), Some(4));
        // One back: a may again.
        in_flight.remove("a1");
        assert_eq!(next_due(&pending, &in_flight, &served, 100), Some(0));
    }

    #[test]
    fn test_a_job_is_kept_past_its_last_retry() {
        // Its event goes with it: the least retention outlasts the whole schedule.
        let schedule: u64 = SCHEDULE.iter().sum();
        assert!(schedule < crate::config::MIN_JOB_RETENTION_S, "{schedule}");
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

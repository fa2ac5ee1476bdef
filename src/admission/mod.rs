//! Admission: the layer every request passes before its handler — API keys, per-client
//! rate limits, the client's tenant — and the slots a run or a kernel holds
//! (`slots`): whether one may start now is decided here and nowhere else.
//!
//! Route policy, by each route's [`Class`] (a column of the face's route table):
//! health, readiness, docs and the UI are always open; every other route needs a key
//! when keys are configured; routes that start sandboxes or create filesystems are
//! rate limited per client. Reactor thread only.

pub mod keys;
pub mod ratelimit;
pub mod slots;

pub use slots::{KernelAdmission, KernelSlots, Slots};

use crate::http::{Head, Response};
use keys::Key;
use ratelimit::RateLimiter;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Tenant of every request when no keys are configured.
pub const PUBLIC_TENANT: &str = "public";

/// Admission could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// `ISOBOX_REQUIRE_AUTH=1` without keys.
    #[error("{0}=1 but no API keys are configured (ISOBOX_API_KEYS or ISOBOX_API_KEYS_FILE)")]
    NoKeys(&'static str),
    /// The key file could not be read.
    #[error("reading ISOBOX_API_KEYS_FILE {path}: {source}")]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A CIDR did not parse.
    #[error("invalid CIDR {0:?} in ISOBOX_TRUSTED_PROXIES")]
    Cidr(String),
}

/// An address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n`, `x::/n` or a bare address.
    ///
    /// # Errors
    /// [`AdmissionError::Cidr`].
    pub fn parse(s: &str) -> Result<Cidr, AdmissionError> {
        let bad = || AdmissionError::Cidr(s.to_string());
        let (a, p) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = a.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(bad)?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }

    /// Whether `ip` is inside.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(self.prefix))
                };
                u32::from(a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(self.prefix))
                };
                u128::from(a) & mask == u128::from(b) & mask
            }
            _ => false,
        }
    }
}

/// Admission settings.
#[derive(Debug, Clone, Default)]
pub struct AdmissionConfig {
    /// Inline keys (comma-separated).
    pub api_keys: Option<crate::secret::Secret>,
    /// Key file, re-read on SIGHUP.
    pub api_keys_file: Option<PathBuf>,
    /// Every route (but the open ones) needs a key; refuse to start without keys.
    pub require_auth: bool,
    /// Memory and volume routes need a key; refuse to start without keys.
    pub memory_require_key: bool,
    /// Tokens per minute per client on rate-limited routes.
    pub rate_per_min: u32,
    /// Bucket size.
    pub rate_burst: u32,
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<Cidr>,
    /// Agent loops per minute per client (the bucket holds as many).
    pub ai_rate_per_min: u32,
    /// The key a scraper off this host presents to `GET /metrics`.
    pub metrics_key: Option<crate::secret::Secret>,
    /// Tokens per minute of each tenant's bucket on [`Class::Tenant`] routes (and of
    /// each client address's, for requests there without a valid key).
    pub tenant_rate_per_min: u32,
    /// That bucket's size.
    pub tenant_rate_burst: u32,
}

/// The admission state.
pub struct Admission {
    cfg: AdmissionConfig,
    keys: Vec<Key>,
    limiter: RateLimiter,
    /// The stricter per-client limit of agent loops (`ISOBOX_AI_RATE_PER_MIN`).
    ai_limiter: RateLimiter,
    /// [`Class::Tenant`]'s buckets: one per tenant (`ISOBOX_ERYX_RATE_PER_MIN`)…
    tenant_limiter: RateLimiter<String>,
    /// …and one per client address for requests without a valid key.
    anon_limiter: RateLimiter,
    /// SHA-256 of the metrics key (the key itself is not kept).
    metrics_digest: Option<[u8; 32]>,
}

/// What admission decided.
pub enum Verdict {
    /// Go ahead, as this tenant.
    Allow {
        /// Server-side tenant.
        tenant: String,
    },
    /// Answer this instead.
    Deny(Response),
}

impl Verdict {
    /// Whether the request may go ahead.
    pub fn is_allow(&self) -> bool {
        matches!(self, Verdict::Allow { .. })
    }
}

/// How admission treats a route; each row of a face's route table names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Health, readiness, docs, the UI, the agent's availability probe: never a key,
    /// never a rate limit.
    Open,
    /// A key when keys are configured (but in the open-demo setup, where only memory
    /// needs one).
    Keyed,
    /// Starts sandboxes or creates filesystems: [`Class::Keyed`], and the per-client rate.
    Starts,
    /// The tenant's durable memory and volumes: a key whenever keys are configured.
    Memory,
    /// Creates a volume: [`Class::Memory`], and the per-client rate.
    MemoryStarts,
    /// An agent loop, which spends the operator's model budget: a key whenever keys
    /// are configured, and the agent's own, stricter rate.
    Agent,
    /// `GET /metrics`: open to a client on this host (loopback, after trusted proxies'
    /// `X-Forwarded-For`); from anywhere else only with the metrics key
    /// (`ISOBOX_METRICS_KEY`), never with an API key; never a rate limit.
    Metrics,
    /// The eryx face, whose document limits requests per org: a key whenever keys are
    /// configured (as [`Class::Memory`]), and a bucket per tenant
    /// (`ISOBOX_ERYX_RATE_PER_MIN`) that every request spends, from whatever address;
    /// a request without a valid key spends its client address's bucket instead
    /// (the document: "rate limited per IP address instead"), before it is refused.
    Tenant,
}

impl Admission {
    /// Loads keys and checks the configuration.
    ///
    /// # Errors
    /// [`AdmissionError`] when keys are required but absent, or the file is unreadable.
    pub fn new(cfg: AdmissionConfig) -> Result<Admission, AdmissionError> {
        let keys = Self::load_keys(&cfg)?;
        if keys.is_empty() {
            if cfg.require_auth {
                return Err(AdmissionError::NoKeys("ISOBOX_REQUIRE_AUTH"));
            }
            if cfg.memory_require_key {
                return Err(AdmissionError::NoKeys("ISOBOX_MEMORY_REQUIRE_KEY"));
            }
        }
        let limiter = RateLimiter::new(cfg.rate_per_min, cfg.rate_burst);
        let ai_limiter = RateLimiter::new(cfg.ai_rate_per_min, cfg.ai_rate_per_min.max(1));
        let tenant_limiter = RateLimiter::new(cfg.tenant_rate_per_min, cfg.tenant_rate_burst);
        let anon_limiter = RateLimiter::new(cfg.tenant_rate_per_min, cfg.tenant_rate_burst);
        let metrics_digest = cfg
            .metrics_key
            .as_ref()
            .map(|k| keys::key_digest(k.expose()));
        Ok(Admission {
            cfg,
            keys,
            limiter,
            ai_limiter,
            tenant_limiter,
            anon_limiter,
            metrics_digest,
        })
    }

    fn load_keys(cfg: &AdmissionConfig) -> Result<Vec<Key>, AdmissionError> {
        let mut keys = cfg
            .api_keys
            .as_ref()
            .map(|s| keys::parse_list(s.expose()))
            .unwrap_or_default();
        if let Some(path) = &cfg.api_keys_file {
            keys.extend(
                keys::load_file(path).map_err(|source| AdmissionError::KeyFile {
                    path: path.clone(),
                    source,
                })?,
            );
        }
        Ok(keys)
    }

    /// Re-reads the key file (SIGHUP). On error the old keys stay.
    pub fn reload(&mut self) {
        match Self::load_keys(&self.cfg) {
            Ok(k) if k.is_empty() && (self.cfg.require_auth || self.cfg.memory_require_key) => {
                log::error!(
                    "key reload: no keys left; keeping the previous {}",
                    self.keys.len()
                )
            }
            Ok(k) => {
                log::info!("key reload: {} keys", k.len());
                self.keys = k;
            }
            Err(e) => log::error!("key reload failed, keeping the previous keys: {e}"),
        }
    }

    /// Whether keys are configured.
    pub fn keys_configured(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Whether `peer` is a proxy whose `X-Forwarded-For` is believed
    /// (`ISOBOX_TRUSTED_PROXIES`).
    pub fn trusts(&self, peer: IpAddr) -> bool {
        self.cfg.trusted_proxies.iter().any(|c| c.contains(peer))
    }

    /// The client address a request is accounted to: the peer, or behind a trusted
    /// proxy the right-most `X-Forwarded-For` entry that is not itself a trusted proxy.
    pub fn client_ip(&self, head: &Head, peer: IpAddr) -> IpAddr {
        client_ip(&self.cfg.trusted_proxies, head, peer)
    }

    /// Decides a request on a route of class `class` from its head (before its body is
    /// read).
    pub fn check(&mut self, class: Class, head: &Head, peer: IpAddr, now: Instant) -> Verdict {
        if class == Class::Open {
            return Verdict::Allow {
                tenant: PUBLIC_TENANT.to_string(),
            };
        }
        if class == Class::Metrics {
            return self.check_metrics(head, peer);
        }
        if class == Class::Tenant {
            return self.check_tenant(head, peer, now);
        }
        let limiter = match class {
            // Each loop may run a model for minutes: a stricter bucket of its own.
            Class::Agent => Some(&mut self.ai_limiter),
            Class::Starts | Class::MemoryStarts => Some(&mut self.limiter),
            Class::Open | Class::Keyed | Class::Memory | Class::Metrics | Class::Tenant => None,
        };
        if let Some(limiter) = limiter {
            let ip = client_ip(&self.cfg.trusted_proxies, head, peer);
            if let Err(wait) = limiter.check(ip, now) {
                return Verdict::Deny(rate_limited(wait));
            }
        }
        if self.keys.is_empty() {
            return Verdict::Allow {
                tenant: PUBLIC_TENANT.to_string(),
            };
        }
        // The spec: with keys configured, a missing key is a 401 — except in the public
        // demo's setup (ISOBOX_MEMORY_REQUIRE_KEY=1 without ISOBOX_REQUIRE_AUTH=1), where
        // only memory and volumes need one and everything else is open to the shared
        // public tenant. A key that is presented must be valid, always.
        // The agent spends the operator's model budget: with keys configured it always
        // needs one, as memory does.
        let key_required = self.cfg.require_auth
            || !self.cfg.memory_require_key
            || matches!(class, Class::Memory | Class::MemoryStarts | Class::Agent);
        match presented_key(head) {
            Err(resp) => Verdict::Deny(resp),
            Ok(None) if !key_required => Verdict::Allow {
                tenant: PUBLIC_TENANT.to_string(),
            },
            Ok(None) => Verdict::Deny(unauthorized()),
            Ok(Some(k)) => match keys::find(&self.keys, &k) {
                Some(key) => Verdict::Allow {
                    tenant: key.tenant.clone(),
                },
                None => Verdict::Deny(unauthorized()),
            },
        }
    }

    /// [`Class::Tenant`]: the key decides the bucket (its tenant's), and without a valid
    /// one the client address's bucket pays, so guessing keys is rate limited too.
    fn check_tenant(&mut self, head: &Head, peer: IpAddr, now: Instant) -> Verdict {
        let ip = client_ip(&self.cfg.trusted_proxies, head, peer);
        let (tenant, refusal) = if self.keys.is_empty() {
            (PUBLIC_TENANT.to_string(), None)
        } else {
            match presented_key(head) {
                Err(resp) => (PUBLIC_TENANT.to_string(), Some(resp)),
                Ok(None) => (PUBLIC_TENANT.to_string(), Some(unauthorized())),
                Ok(Some(k)) => match keys::find(&self.keys, &k) {
                    Some(key) => (key.tenant.clone(), None),
                    None => (PUBLIC_TENANT.to_string(), Some(unauthorized())),
                },
            }
        };
        if let Err(wait) = self.charge_tenant(&tenant, ip, now) {
            return Verdict::Deny(rate_limited(wait));
        }
        match refusal {
            Some(resp) => Verdict::Deny(resp),
            None => Verdict::Allow { tenant },
        }
    }

    /// [`Class::Metrics`]: this host, or the metrics key.
    fn check_metrics(&self, head: &Head, peer: IpAddr) -> Verdict {
        let allow = || Verdict::Allow {
            tenant: PUBLIC_TENANT.to_string(),
        };
        if client_ip(&self.cfg.trusted_proxies, head, peer)
            .to_canonical()
            .is_loopback()
        {
            return allow();
        }
        let Some(digest) = &self.metrics_digest else {
            return Verdict::Deny(Response::error(
                403,
                "forbidden",
                Some("metrics are served to clients on this host only; set ISOBOX_METRICS_KEY to scrape from elsewhere"),
            ));
        };
        match presented_key(head) {
            Err(resp) => Verdict::Deny(resp),
            Ok(Some(k)) if keys::digest_eq(digest, &k) => allow(),
            Ok(_) => Verdict::Deny(unauthorized()),
        }
    }

    /// Whether `tenant` may still act: with keys configured, some key of it is still
    /// loaded (a reload may have removed it); without keys, it is the public tenant.
    pub fn tenant_active(&self, tenant: &str) -> bool {
        if self.keys.is_empty() {
            return tenant == PUBLIC_TENANT;
        }
        self.keys.iter().any(|k| k.tenant == tenant)
    }

    /// Counts one more request of `tenant` against [`Class::Tenant`]'s rate, also
    /// outside any head (a WebSocket `execute`): the tenant's bucket, or for the public
    /// tenant (no key) the client address's; how long to wait when over it.
    ///
    /// # Errors
    /// The wait until the next request is allowed.
    pub fn charge_tenant(
        &mut self,
        tenant: &str,
        client: IpAddr,
        now: Instant,
    ) -> Result<(), Duration> {
        if tenant == PUBLIC_TENANT {
            self.anon_limiter.check(client, now)
        } else {
            self.tenant_limiter.check_key(tenant.to_string(), now)
        }
    }

    /// Periodic upkeep (bucket sweep).
    pub fn tick(&mut self, now: Instant) {
        self.limiter.sweep(now);
        self.ai_limiter.sweep(now);
        self.tenant_limiter.sweep(now);
        self.anon_limiter.sweep(now);
    }
}

/// The client address of a request: the peer, or behind a trusted proxy the right-most
/// `X-Forwarded-For` entry that is not itself a trusted proxy.
fn client_ip(trusted_proxies: &[Cidr], head: &Head, peer: IpAddr) -> IpAddr {
    let trusted = |ip: IpAddr| trusted_proxies.iter().any(|c| c.contains(ip));
    if !trusted(peer) {
        return peer;
    }
    let mut chain: Vec<IpAddr> = Vec::new();
    for (name, value) in &head.headers {
        if name == "x-forwarded-for" {
            for part in String::from_utf8_lossy(value).split(',') {
                match part.trim().parse::<IpAddr>() {
                    Ok(ip) => chain.push(ip),
                    // A malformed entry ends what can be believed.
                    Err(_) => chain.clear(),
                }
            }
        }
    }
    chain
        .into_iter()
        .rev()
        .find(|ip| !trusted(*ip))
        .unwrap_or(peer)
}

/// 429 with the seconds to wait.
fn rate_limited(wait: Duration) -> Response {
    let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
    Response::error(429, "rate_limited", None).with_header("Retry-After", secs.to_string())
}

fn unauthorized() -> Response {
    Response::error(401, "unauthorized", None).with_header("WWW-Authenticate", "Bearer")
}

/// The key a request presents: `X-API-Key: <key>` or `Authorization: Bearer <key>`.
/// Repeated headers, or both headers with different keys, are ambiguous: 400.
fn presented_key(head: &Head) -> Result<Option<String>, Response> {
    let ambiguous = || {
        Response::error(
            400,
            "ambiguous_credentials",
            Some("send one API key, in X-API-Key or Authorization: Bearer"),
        )
    };
    if head.header_count("x-api-key") > 1 || head.header_count("authorization") > 1 {
        return Err(ambiguous());
    }
    let x = head
        .headers
        .iter()
        .find(|(n, _)| n == "x-api-key")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    let bearer = head
        .headers
        .iter()
        .find(|(n, _)| n == "authorization")
        .map(|(_, v)| {
            let v = String::from_utf8_lossy(v).into_owned();
            // RFC 6750 §2.1: the scheme is case-insensitive; exactly one token follows.
            match v.split_once(' ') {
                Some((scheme, token))
                    if scheme.eq_ignore_ascii_case("bearer")
                        && !token.is_empty()
                        && !token.contains(' ') =>
                {
                    token.to_string()
                }
                // Not a usable bearer credential: compare something that can never match.
                _ => String::from("\u{0}invalid"),
            }
        });
    let proto = ws_bearer(head);
    let mut found: Option<String> = None;
    for k in [x, bearer, proto].into_iter().flatten() {
        match &found {
            Some(f) if *f != k => return Err(ambiguous()),
            Some(_) => {}
            None => found = Some(k),
        }
    }
    Ok(found)
}

/// Subprotocol prefix that carries a key on a WebSocket upgrade.
pub const WS_BEARER_PREFIX: &str = "isobox.bearer.";

/// A browser's WebSocket cannot send headers: on a WebSocket upgrade (only), its key
/// may come as the offered subprotocol `isobox.bearer.<the key in unpadded base64url>`
/// (a protocol is a token, which a key's characters need not be). Never chosen, so
/// never sent back. A value that does not decode to UTF-8 is a key that matches
/// nothing.
fn ws_bearer(head: &Head) -> Option<String> {
    use base64::Engine as _;
    let upgrade = head.header("upgrade").is_some_and(|v| {
        v.split(',')
            .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
    });
    if !upgrade {
        return None;
    }
    let mut keys = head
        .headers
        .iter()
        .filter(|(n, _)| n == "sec-websocket-protocol")
        .flat_map(|(_, v)| {
            String::from_utf8_lossy(v)
                .split(',')
                .filter_map(|t| t.trim().strip_prefix(WS_BEARER_PREFIX).map(str::to_string))
                .collect::<Vec<_>>()
        });
    let first = keys.next()?;
    if keys.next().is_some() {
        // Two keys in one offer: match nothing rather than choose.
        return Some(String::from("\u{0}invalid"));
    }
    Some(
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(first.trim_end_matches('='))
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_else(|| String::from("\u{0}invalid")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(headers: &[(&str, &str)]) -> Head {
        let mut s = String::from("POST /execute HTTP/1.1\r\nHost: x\r\n");
        for (k, v) in headers {
            s.push_str(&format!("{k}: {v}\r\n"));
        }
        s.push_str("\r\n");
        crate::http::parse::parse_head(s.as_bytes()).unwrap()
    }

    fn adm(keys: &str, trusted: &[&str]) -> Admission {
        Admission::new(AdmissionConfig {
            api_keys: Some(crate::secret::Secret::new(keys.into())),
            rate_per_min: 60,
            rate_burst: 100,
            trusted_proxies: trusted.iter().map(|c| Cidr::parse(c).unwrap()).collect(),
            require_auth: true,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn test_a_tenant_is_active_while_a_key_of_it_is_loaded() {
        let mut a = adm("k1,k2", &[]);
        let tenant = match a.check(
            Class::MemoryStarts,
            &head(&[("Authorization", "Bearer k1")]),
            "192.0.2.7".parse().unwrap(),
            Instant::now(),
        ) {
            Verdict::Allow { tenant } => tenant,
            Verdict::Deny(r) => panic!("{}", r.status),
        };
        assert!(a.tenant_active(&tenant));
        assert!(!a.tenant_active("someone-else"));
        assert!(!a.tenant_active(PUBLIC_TENANT));
        // A reload that drops the key: its tenant is no longer active.
        a.keys.retain(|k| k.tenant != tenant);
        assert!(!a.keys.is_empty());
        assert!(!a.tenant_active(&tenant));
        // No keys at all: only the public tenant.
        a.keys.clear();
        assert!(a.tenant_active(PUBLIC_TENANT));
        assert!(!a.tenant_active(&tenant));
    }

    #[test]
    fn test_metrics_open_to_this_host_and_elsewhere_only_with_its_key() {
        let verdict = |a: &mut Admission, h: &[(&str, &str)], ip: &str| match a.check(
            Class::Metrics,
            &head(h),
            ip.parse().unwrap(),
            Instant::now(),
        ) {
            Verdict::Allow { .. } => 200,
            Verdict::Deny(r) => r.status,
        };
        // No metrics key: this host only (an API key does not open it).
        let mut a = adm("k1", &["127.0.0.1/32"]);
        assert_eq!(verdict(&mut a, &[], "127.0.0.1"), 200);
        assert_eq!(verdict(&mut a, &[], "::1"), 200);
        assert_eq!(verdict(&mut a, &[], "::ffff:127.0.0.1"), 200);
        assert_eq!(verdict(&mut a, &[], "192.0.2.7"), 403);
        assert_eq!(verdict(&mut a, &[("X-API-Key", "k1")], "192.0.2.7"), 403);
        // Through a trusted proxy on this host, the client it names decides.
        assert_eq!(
            verdict(&mut a, &[("X-Forwarded-For", "192.0.2.7")], "127.0.0.1"),
            403
        );
        let key = "m-0123456789abcdef";
        let mut a = Admission::new(AdmissionConfig {
            api_keys: Some(crate::secret::Secret::new("k1".into())),
            metrics_key: Some(crate::secret::Secret::new(key.into())),
            require_auth: true,
            ..Default::default()
        })
        .unwrap();
        let bearer = format!("Bearer {key}");
        assert_eq!(
            verdict(&mut a, &[("Authorization", &bearer)], "192.0.2.7"),
            200
        );
        assert_eq!(verdict(&mut a, &[("X-API-Key", key)], "192.0.2.7"), 200);
        assert_eq!(verdict(&mut a, &[], "192.0.2.7"), 401);
        assert_eq!(
            verdict(
                &mut a,
                &[("Authorization", "Bearer m-0123456789abcdeF")],
                "192.0.2.7"
            ),
            401
        );
        assert_eq!(verdict(&mut a, &[("X-API-Key", "k1")], "192.0.2.7"), 401);
        assert_eq!(verdict(&mut a, &[], "127.0.0.1"), 200);
    }

    #[test]
    fn test_the_tenant_rate_is_per_key_from_any_address_and_per_address_without_one() {
        let mut a = Admission::new(AdmissionConfig {
            api_keys: Some(crate::secret::Secret::new("k1,k2".into())),
            rate_per_min: 60,
            rate_burst: 100,
            tenant_rate_per_min: 60,
            tenant_rate_burst: 2,
            ..Default::default()
        })
        .unwrap();
        let now = Instant::now();
        let mut status = |h: &[(&str, &str)], ip: &str| match a.check(
            Class::Tenant,
            &head(h),
            ip.parse().unwrap(),
            now,
        ) {
            Verdict::Allow { .. } => 200,
            Verdict::Deny(r) => r.status,
        };
        let k1 = [("Authorization", "Bearer k1")];
        // One key's bucket, whatever address it comes from.
        assert_eq!(status(&k1, "192.0.2.1"), 200);
        assert_eq!(status(&k1, "192.0.2.2"), 200);
        assert_eq!(status(&k1, "192.0.2.3"), 429);
        // Another key has its own.
        assert_eq!(status(&[("Authorization", "Bearer k2")], "192.0.2.3"), 200);
        // Without a valid key: the address's bucket pays, then the refusal.
        let bad = [("Authorization", "Bearer nope")];
        assert_eq!(status(&bad, "192.0.2.9"), 401);
        assert_eq!(status(&[], "192.0.2.9"), 401);
        assert_eq!(status(&bad, "192.0.2.9"), 429);
        assert_eq!(status(&bad, "192.0.2.10"), 401);
        // The per-client bucket of the other routes is untouched.
        assert!(a
            .check(
                Class::MemoryStarts,
                &head(&k1),
                "192.0.2.1".parse().unwrap(),
                now
            )
            .is_allow());
        // Without keys every client is the public tenant, limited per address.
        let mut open = Admission::new(AdmissionConfig {
            tenant_rate_per_min: 60,
            tenant_rate_burst: 1,
            ..Default::default()
        })
        .unwrap();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert!(open.check(Class::Tenant, &head(&[]), ip, now).is_allow());
        assert!(!open.check(Class::Tenant, &head(&[]), ip, now).is_allow());
        assert!(open
            .check(Class::Tenant, &head(&[]), "192.0.2.2".parse().unwrap(), now)
            .is_allow());
        assert!(open
            .charge_tenant(PUBLIC_TENANT, "192.0.2.3".parse().unwrap(), now)
            .is_ok());
        assert!(open
            .charge_tenant(PUBLIC_TENANT, "192.0.2.3".parse().unwrap(), now)
            .is_err());
    }

    #[test]
    fn test_keys_required_by_default() {
        let mut a = Admission::new(AdmissionConfig {
            api_keys: Some(crate::secret::Secret::new("k1".into())),
            rate_per_min: 60,
            rate_burst: 100,
            ..Default::default()
        })
        .unwrap();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        for r in [Class::Starts, Class::Memory, Class::Keyed, Class::Agent] {
            assert!(matches!(
                a.check(r, &head(&[]), ip, Instant::now()),
                Verdict::Deny(_)
            ));
        }
    }

    #[test]
    fn test_keys_optional_and_memory_required() {
        let mut a = Admission::new(AdmissionConfig {
            api_keys: Some(crate::secret::Secret::new("k1".into())),
            rate_per_min: 60,
            rate_burst: 100,
            memory_require_key: true,
            ..Default::default()
        })
        .unwrap();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let now = Instant::now();
        let mut check = |class: Class, h: &[(&str, &str)]| match a.check(class, &head(h), ip, now) {
            Verdict::Allow { tenant } => tenant,
            Verdict::Deny(r) => r.status.to_string(),
        };
        assert_eq!(check(Class::Starts, &[]), PUBLIC_TENANT);
        assert_eq!(check(Class::Keyed, &[]), PUBLIC_TENANT);
        assert!(check(Class::Starts, &[("X-API-Key", "k1")]).starts_with("key-"));
        assert_eq!(check(Class::Starts, &[("X-API-Key", "k2")]), "401");
        for r in [Class::Memory, Class::MemoryStarts] {
            assert_eq!(check(r, &[]), "401");
            assert!(check(r, &[("X-API-Key", "k1")]).starts_with("key-"));
        }
        // The agent spends the model budget: a key even in this setup.
        assert_eq!(check(Class::Agent, &[]), "401");
        assert!(matches!(
            Admission::new(AdmissionConfig {
                memory_require_key: true,
                ..Default::default()
            }),
            Err(AdmissionError::NoKeys("ISOBOX_MEMORY_REQUIRE_KEY"))
        ));
    }

    #[test]
    fn test_key_forms() {
        let mut a = adm("k1,k2", &[]);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let now = Instant::now();
        let status =
            |a: &mut Admission, h: &[(&str, &str)]| match a.check(Class::Starts, &head(h), ip, now)
            {
                Verdict::Allow { .. } => 200,
                Verdict::Deny(r) => r.status,
            };
        assert_eq!(status(&mut a, &[("X-API-Key", "k1")]), 200);
        assert_eq!(status(&mut a, &[("Authorization", "Bearer k2")]), 200);
        assert_eq!(status(&mut a, &[("Authorization", "bearer k2")]), 200);
        for bad in [
            vec![],
            vec![("X-API-Key", "k3")],
            vec![("Authorization", "Bearer ")],
            vec![("Authorization", "Bearer k1 x")],
            vec![("Authorization", "Basic k1")],
            vec![("Authorization", "k1")],
        ] {
            assert_eq!(status(&mut a, &bad), 401, "{bad:?}");
        }
        assert_eq!(
            status(
                &mut a,
                &[("X-API-Key", "k1"), ("Authorization", "Bearer k2")]
            ),
            400
        );
        assert_eq!(
            status(&mut a, &[("X-API-Key", "k1"), ("X-API-Key", "k1")]),
            400
        );
        assert_eq!(
            status(
                &mut a,
                &[("X-API-Key", "k1"), ("Authorization", "Bearer k1")]
            ),
            200
        );
        assert!(matches!(
            a.check(Class::Open, &head(&[]), ip, now),
            Verdict::Allow { .. }
        ));
        // A browser's WebSocket: the key as a subprotocol, base64url ("k2" is "azI"),
        // on an upgrade only.
        let proto = |v: &'static str| vec![("Upgrade", "websocket"), ("Sec-WebSocket-Protocol", v)];
        assert_eq!(
            status(&mut a, &[("Sec-WebSocket-Protocol", "isobox.bearer.azI")]),
            401,
            "not an upgrade"
        );
        assert_eq!(
            status(&mut a, &proto("isobox.terminal, isobox.bearer.azI")),
            200
        );
        assert_eq!(status(&mut a, &proto("isobox.bearer.azI")), 200);
        assert_eq!(status(&mut a, &proto("isobox.bearer.azI=")), 200);
        for bad in [
            "isobox.bearer.azM",
            "isobox.bearer.k2",
            "isobox.bearer.",
            "isobox.bearer.%%%",
            "isobox.bearer.azI, isobox.bearer.azE",
            "isobox.terminal, azI",
        ] {
            assert_eq!(status(&mut a, &proto(bad)), 401, "{bad}");
        }
        let both = |k: &'static str| {
            vec![
                ("X-API-Key", k),
                ("Upgrade", "websocket"),
                ("Sec-WebSocket-Protocol", "isobox.bearer.azI"),
            ]
        };
        assert_eq!(status(&mut a, &both("k1")), 400);
        assert_eq!(status(&mut a, &both("k2")), 200);
    }

    #[test]
    fn test_forwarded_for_only_from_trusted_proxies() {
        let a = adm("k", &["10.0.0.0/8"]);
        let h = head(&[
            ("X-Forwarded-For", "1.2.3.4, 10.1.1.1"),
            ("X-Real-IP", "9.9.9.9"),
        ]);
        assert_eq!(
            a.client_ip(&h, "10.0.0.5".parse().unwrap()),
            "1.2.3.4".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            a.client_ip(&h, "127.0.0.1".parse().unwrap()),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        let h = head(&[("X-Forwarded-For", "garbage, 10.1.1.1")]);
        assert_eq!(
            a.client_ip(&h, "10.0.0.5".parse().unwrap()),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn test_cidr() {
        let c = Cidr::parse("192.168.0.0/16").unwrap();
        assert!(c.contains("192.168.3.4".parse().unwrap()));
        assert!(!c.contains("192.169.0.1".parse().unwrap()));
        assert!(c.contains("::ffff:192.168.1.1".parse().unwrap()));
        assert!(Cidr::parse("1.2.3.4/33").is_err());
        assert!(Cidr::parse("fd00::/8")
            .unwrap()
            .contains("fd12::1".parse().unwrap()));
    }
}

//! Logging macros over the `log` facade.
//!
//! Paths a client or a sandbox can trigger use `warn_limited!` / `error_limited!`: a
//! call site logs at most [`PER_WINDOW`] lines in any [`WINDOW_SECS`]-second window,
//! and, when the line names the client (`warn_limited!(client = ip; ...)`), that client
//! causes at most [`PER_CLIENT_WINDOW`] such lines per window across every call site,
//! so a fuzzer or a hostile peer cannot flood the log. What is dropped is counted
//! ([`suppressed`], in `/healthz`), and the next line a call site logs says how many
//! of its lines were dropped before it.
//! Never log bodies, environment variables, keys, tokens or file contents.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Length of a limiter window, seconds.
pub const WINDOW_SECS: u64 = 10;
/// Lines one call site logs per window.
pub const PER_WINDOW: u64 = 5;
/// Limited lines one client causes per window, across call sites.
pub const PER_CLIENT_WINDOW: u32 = 5;
/// Clients tracked at once (a fixed table: two clients that share a slot share a budget).
const CLIENT_SLOTS: usize = 1024;

/// Lines dropped by every limiter since start.
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// Lines the limiters dropped since the daemon started.
pub fn suppressed() -> u64 {
    SUPPRESSED.load(Ordering::Relaxed)
}

fn window_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() / WINDOW_SECS)
        .unwrap_or(0)
}

/// Per-call-site limiter: at most [`PER_WINDOW`] lines per window.
pub struct CallsiteLimiter {
    /// The high 48 bits hold the window, the low 16 bits the lines logged in it.
    window: AtomicU64,
    /// Lines dropped since this site last logged.
    dropped: AtomicU64,
}

impl CallsiteLimiter {
    /// A limiter with nothing logged yet.
    pub const fn new() -> Self {
        CallsiteLimiter {
            window: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Whether one more line may be logged now (with the client it names, if any):
    /// `Some(n)` with the lines dropped here since the last one logged, or `None`.
    pub fn allow(&self, client: Option<IpAddr>) -> Option<u64> {
        self.allow_at(window_now(), client, &CLIENTS)
    }

    fn allow_at(&self, now: u64, client: Option<IpAddr>, clients: &Clients) -> Option<u64> {
        // The client's share first: a client over it does not use up the site's.
        let client_ok = client.is_none_or(|c| clients.allow(c, now));
        let site_ok = client_ok
            && loop {
                let cur = self.window.load(Ordering::Relaxed);
                let (win, count) = (cur >> 16, cur & 0xffff);
                let next = if win != now {
                    (now << 16) | 1
                } else if count >= PER_WINDOW {
                    break false;
                } else {
                    cur + 1
                };
                if self
                    .window
                    .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    break true;
                }
            };
        if !site_ok {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            SUPPRESSED.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.dropped.swap(0, Ordering::Relaxed))
    }
}

impl Default for CallsiteLimiter {
    fn default() -> Self {
        Self::new()
    }
}

/// What each client has caused in the current window, in a fixed table.
struct Clients(Mutex<Vec<(IpAddr, u64, u32)>>);

static CLIENTS: Clients = Clients(Mutex::new(Vec::new()));

impl Clients {
    fn allow(&self, ip: IpAddr, now: u64) -> bool {
        let Ok(mut t) = self.0.lock() else {
            return true;
        };
        if t.is_empty() {
            t.resize(CLIENT_SLOTS, (IpAddr::from([0, 0, 0, 0]), u64::MAX, 0));
        }
        let slot = {
            use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
            let h = BuildHasherDefault::<DefaultHasher>::default().hash_one(ip);
            usize::try_from(h % CLIENT_SLOTS as u64).unwrap_or(0)
        };
        let e = &mut t[slot];
        if e.0 != ip || e.1 != now {
            *e = (ip, now, 0);
        }
        if e.2 >= PER_CLIENT_WINDOW {
            return false;
        }
        e.2 += 1;
        true
    }
}

/// `" (N similar lines suppressed)"` after a line that follows dropped ones.
pub fn dropped_note(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} similar lines suppressed before this one)")
    }
}

/// One log line as a JSON object (`ISOBOX_LOG_FORMAT=json`): `ts` (RFC 3339, UTC,
/// milliseconds), `level` (`ERROR` … `TRACE`), `target` (the module) and `msg`, in that
/// order, on one line whatever the message holds (newlines and quotes are escaped).
pub fn json_line(ts: &str, level: ::log::Level, target: &str, msg: &str) -> String {
    // Keys written by hand keep their order; serde_json escapes each value.
    let q = |v: &str| serde_json::to_string(v).unwrap_or_default();
    format!(
        "{{\"ts\":{},\"level\":{},\"target\":{},\"msg\":{}}}",
        q(ts),
        q(level.as_str()),
        q(target),
        q(msg)
    )
}

/// A warning a peer could trigger: rate limited per call site, and per client when
/// it is named first (`warn_limited!(client = ip; "...")`).
#[macro_export]
macro_rules! warn_limited {
    (client = $ip:expr; $($arg:tt)*) => {{
        static LIMITER: $crate::log::CallsiteLimiter = $crate::log::CallsiteLimiter::new();
        if let Some(n) = LIMITER.allow(Some($ip)) {
            ::log::warn!("{}{}", format_args!($($arg)*), $crate::log::dropped_note(n));
        }
    }};
    ($($arg:tt)*) => {{
        static LIMITER: $crate::log::CallsiteLimiter = $crate::log::CallsiteLimiter::new();
        if let Some(n) = LIMITER.allow(None) {
            ::log::warn!("{}{}", format_args!($($arg)*), $crate::log::dropped_note(n));
        }
    }};
}

/// An error a peer could trigger: rate limited per call site.
#[macro_export]
macro_rules! error_limited {
    ($($arg:tt)*) => {{
        static LIMITER: $crate::log::CallsiteLimiter = $crate::log::CallsiteLimiter::new();
        if let Some(n) = LIMITER.allow(None) {
            ::log::error!("{}{}", format_args!($($arg)*), $crate::log::dropped_note(n));
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_call_site_logs_its_share_per_window_and_counts_the_rest() {
        let clients = Clients(Mutex::new(Vec::new()));
        let site = CallsiteLimiter::new();
        let before = suppressed();
        let got: Vec<Option<u64>> = (0..8).map(|_| site.allow_at(100, None, &clients)).collect();
        assert_eq!(
            got,
            [
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                None,
                None,
                None
            ]
        );
        assert!(suppressed() >= before + 3);
        // The next window: the first line says how many were dropped.
        assert_eq!(site.allow_at(101, None, &clients), Some(3));
        assert_eq!(site.allow_at(101, None, &clients), Some(0));
    }

    #[test]
    fn test_a_json_line_is_one_object_whatever_the_message_holds() {
        let msg = "two\nlines with \"quotes\", a tab\t, a \\ and \u{1b}[31m";
        let line = json_line(
            "2026-12-03T07:00:00.123Z",
            ::log::Level::Warn,
            "isobox::x",
            msg,
        );
        assert!(!line.contains('\n'), "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ts"], "2026-12-03T07:00:00.123Z");
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["target"], "isobox::x");
        assert_eq!(v["msg"], msg);
        assert_eq!(v.as_object().unwrap().len(), 4);
        assert!(line.starts_with("{\"ts\":"), "{line}");
    }

    #[test]
    fn test_one_client_cannot_use_every_call_site() {
        let clients = Clients(Mutex::new(Vec::new()));
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let sites: Vec<CallsiteLimiter> = (0..4).map(|_| CallsiteLimiter::new()).collect();
        // Client a gets PER_CLIENT_WINDOW lines in all, spread over the sites.
        let mut logged = 0;
        for s in &sites {
            for _ in 0..3 {
                logged += usize::from(s.allow_at(7, Some(a), &clients).is_some());
            }
        }
        assert_eq!(logged, PER_CLIENT_WINDOW as usize);
        // Client b still gets lines from a site with room left.
        assert!(sites[3].allow_at(7, Some(b), &clients).is_some());
        // A new window gives a its share again.
        assert!(sites[0].allow_at(8, Some(a), &clients).is_some());
    }
}

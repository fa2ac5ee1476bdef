//! Token buckets with a bounded table, keyed by client address or by tenant.
//!
//! Addresses are keyed by IPv4 address or IPv6 /64 (one host usually owns a whole /64).
//! A bucket that has refilled is indistinguishable from a new one, so such entries are
//! dropped by the sweep; when the table is still full the least recently seen entry
//! goes. A flood of distinct addresses therefore costs bounded memory.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Most clients tracked at once.
pub const MAX_CLIENTS: usize = 65_536;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// The limiter: one bucket per key (a client address, or a tenant).
#[derive(Debug)]
pub struct RateLimiter<K = IpAddr> {
    per_sec: f64,
    burst: f64,
    clients: HashMap<K, Bucket>,
    max_clients: usize,
}

/// The bucket key of an address: IPv4 as is, IPv6 by /64; v4-mapped v6 as v4.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl RateLimiter {
    /// Takes a token for `ip` (its address's bucket); `Err(retry_after)` when there is
    /// none.
    pub fn check(&mut self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        self.check_key(client_key(ip), now)
    }
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    /// `per_min` tokens per minute, at most `burst` saved up.
    pub fn new(per_min: u32, burst: u32) -> RateLimiter<K> {
        Self::with_capacity(per_min, burst, MAX_CLIENTS)
    }

    /// As `new`, with a custom table bound.
    pub fn with_capacity(per_min: u32, burst: u32, max_clients: usize) -> RateLimiter<K> {
        RateLimiter {
            per_sec: f64::from(per_min) / 60.0,
            burst: f64::from(burst.max(1)),
            clients: HashMap::new(),
            max_clients: max_clients.max(1),
        }
    }

    /// Takes a token for `key`; `Err(retry_after)` when there is none.
    pub fn check_key(&mut self, key: K, now: Instant) -> Result<(), Duration> {
        if !self.clients.contains_key(&key) && self.clients.len() >= self.max_clients {
            self.sweep(now);
            if self.clients.len() >= self.max_clients {
                // Evict the least recently seen eighth at once: one O(n) pass per n/8 new
                // clients instead of a full scan for every one (a flood of addresses
                // must not stall the event loop).
                let mut by_age: Vec<(Instant, &K)> =
                    self.clients.iter().map(|(k, b)| (b.last, k)).collect();
                let cut = (by_age.len() / 8).max(1);
                by_age.select_nth_unstable_by_key(cut - 1, |(t, _)| *t);
                let old: Vec<K> = by_age[..cut].iter().map(|(_, k)| (*k).clone()).collect();
                for k in &old {
                    self.clients.remove(k);
                }
            }
        }
        let (per_sec, burst) = (self.per_sec, self.burst);
        let b = self.clients.entry(key).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * per_sec).min(burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else if per_sec <= 0.0 {
            Err(Duration::from_secs(60))
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / per_sec))
        }
    }

    /// Drops buckets that have refilled completely.
    pub fn sweep(&mut self, now: Instant) {
        let (per_sec, burst) = (self.per_sec, self.burst);
        self.clients.retain(|_, b| {
            b.tokens + now.saturating_duration_since(b.last).as_secs_f64() * per_sec < burst
        });
    }

    /// Clients tracked now.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether no client is tracked.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_burst_then_refill() {
        let mut rl = RateLimiter::new(60, 3);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let t = Instant::now();
        for _ in 0..3 {
            assert!(rl.check(ip, t).is_ok());
        }
        let wait = rl.check(ip, t).unwrap_err();
        assert!(
            wait <= Duration::from_secs(1) && wait > Duration::from_millis(900),
            "{wait:?}"
        );
        assert!(rl.check(ip, t + Duration::from_millis(1001)).is_ok());
    }

    #[test]
    fn test_table_is_bounded_and_v6_grouped_by_64() {
        let mut rl = RateLimiter::with_capacity(60, 2, 100);
        let t = Instant::now();
        for i in 0..10_000u32 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(i));
            let _ = rl.check(ip, t);
        }
        assert!(rl.len() <= 100);
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::ffff:2".parse().unwrap();
        let mut rl = RateLimiter::new(60, 2);
        assert!(rl.check(a, t).is_ok());
        assert!(rl.check(b, t).is_ok());
        assert!(rl.check(a, t).is_err(), "one /64 shares a bucket");
    }

    #[test]
    fn test_buckets_by_tenant_are_separate_and_bounded() {
        let mut rl: RateLimiter<String> = RateLimiter::with_capacity(60, 1, 16);
        let t = Instant::now();
        assert!(rl.check_key("key-a".into(), t).is_ok());
        assert!(rl.check_key("key-a".into(), t).is_err());
        assert!(rl.check_key("key-b".into(), t).is_ok());
        for i in 0..1000 {
            let _ = rl.check_key(format!("key-{i}"), t);
        }
        assert!(rl.len() <= 16);
    }
}

//! Logging macros over the `log` facade.
//!
//! Paths a client or a sandbox can trigger use `warn_limited!`, which drops lines
//! from one call site beyond a few per second so a hostile peer cannot flood the log.
//! Never log bodies, environment variables, keys, tokens or file contents.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Per-call-site limiter: at most `PER_SECOND` lines in any one-second window.
pub struct CallsiteLimiter {
    window: AtomicU64,
}

const PER_SECOND: u64 = 5;

impl CallsiteLimiter {
    /// A limiter with nothing logged yet.
    pub const fn new() -> Self {
        CallsiteLimiter {
            window: AtomicU64::new(0),
        }
    }

    /// Whether one more line may be logged now.
    pub fn allow(&self) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // The high 48 bits hold the second, the low 16 bits the count in it.
        let cur = self.window.load(Ordering::Relaxed);
        let (sec, count) = (cur >> 16, cur & 0xffff);
        if sec != now {
            self.window.store((now << 16) | 1, Ordering::Relaxed);
            return true;
        }
        if count >= PER_SECOND {
            return false;
        }
        self.window.store(cur + 1, Ordering::Relaxed);
        true
    }
}

impl Default for CallsiteLimiter {
    fn default() -> Self {
        Self::new()
    }
}

/// A warning a peer could trigger: rate limited per call site.
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)*) => {{
        static LIMITER: $crate::log::CallsiteLimiter = $crate::log::CallsiteLimiter::new();
        if LIMITER.allow() { ::log::warn!($($arg)*); }
    }};
}

/// An error a peer could trigger: rate limited per call site.
#[macro_export]
macro_rules! error_limited {
    ($($arg:tt)*) => {{
        static LIMITER: $crate::log::CallsiteLimiter = $crate::log::CallsiteLimiter::new();
        if LIMITER.allow() { ::log::error!($($arg)*); }
    }};
}

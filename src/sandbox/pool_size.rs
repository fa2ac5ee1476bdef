//! How large each warm pool should be right now, from what arrives.
//!
//! A pool keeps at least its configured size (`ISOBOX_WARM_POOL`, its floor) and grows
//! up to its ceiling (`ISOBOX_WARM_POOL_MAX`) to the largest burst of the last window
//! (`ISOBOX_WARM_POOL_WINDOW_SEC`, a minute by default):
//! the most runs of that pool that arrived within one refill time (at least a second).
//! A burst that size then finds a sandbox for each of its runs, where a pool at its
//! floor would have served the first few and started the rest cold. Growth is paid in
//! refill CPU, so it is allowed only while the pools' refills over the last window
//! stayed within a budget (`ISOBOX_WARM_POOL_CPU`, a share of the host's CPUs). Above
//! it, pools refill to their floors only: under sustained load a refill costs what the
//! cold start it saves costs (bench/README.md, "restored from a checkpoint"), so a
//! larger pool would only spend the same CPU earlier.
//!
//! Pure bookkeeping: the caller passes the time, so the tests below need no clock.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How far back arrivals and refill CPU count unless configured.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
/// Arrivals kept per pool: at most this many of the window's (a bound on memory; past
/// ~17 runs a second a minute's window holds only the last 1024).
const KEPT: usize = 1024;
/// A burst is what arrives within one refill time, but never less than this.
pub const MIN_SPAN: Duration = Duration::from_secs(1);

/// The runs that arrived for one pool in the last window.
#[derive(Debug, Default)]
pub struct Demand {
    arrivals: VecDeque<Instant>,
    peak: usize,
}

impl Demand {
    /// A run of this pool arrived (hit or miss).
    pub fn arrive(&mut self, now: Instant, span: Duration, window: Duration) {
        self.arrivals.push_back(now);
        if self.arrivals.len() > KEPT {
            self.arrivals.pop_front();
        }
        self.refresh(now, span, window);
    }

    /// Forgets arrivals older than the window and recomputes the peak.
    pub fn refresh(&mut self, now: Instant, span: Duration, window: Duration) {
        while self
            .arrivals
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > window)
        {
            self.arrivals.pop_front();
        }
        let span = span.max(MIN_SPAN);
        // Two pointers over the arrivals (in order): the most within any `span`.
        let (mut peak, mut lo) = (0, 0);
        for hi in 0..self.arrivals.len() {
            while self.arrivals[hi].saturating_duration_since(self.arrivals[lo]) > span {
                lo += 1;
            }
            peak = peak.max(hi - lo + 1);
        }
        self.peak = peak;
    }

    /// The most runs that arrived within one span in the window.
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// Runs that arrived in the window.
    pub fn recent(&self) -> usize {
        self.arrivals.len()
    }

    /// When the last run arrived.
    pub fn last(&self) -> Option<Instant> {
        self.arrivals.back().copied()
    }
}

/// The refills' CPU over the last window against the budget.
#[derive(Debug)]
pub struct Budget {
    /// CPU-seconds per second the refills may average for pools to grow past their
    /// floors (0: pools never grow).
    per_sec: f64,
    /// How far back arrivals and refill CPU count.
    window: Duration,
    spent: VecDeque<(Instant, u64)>,
    spent_ns: u64,
}

impl Budget {
    /// A budget of `per_sec` CPU-seconds per second, over `window`.
    pub fn new(per_sec: f64, window: Duration) -> Budget {
        Budget {
            per_sec: per_sec.max(0.0),
            window: window.max(Duration::from_secs(1)),
            spent: VecDeque::new(),
            spent_ns: 0,
        }
    }

    /// A refill took `cpu_ns`. Refills of one second share an entry, so the window
    /// holds at most one per second of it (3600), however many refills it saw.
    pub fn spend(&mut self, now: Instant, cpu_ns: u64) {
        match self.spent.back_mut() {
            Some((t, ns)) if now.saturating_duration_since(*t) < Duration::from_secs(1) => {
                *ns = ns.saturating_add(cpu_ns);
            }
            _ => self.spent.push_back((now, cpu_ns)),
        }
        self.spent_ns = self.spent_ns.saturating_add(cpu_ns);
        self.refresh(now);
    }

    /// Forgets refills older than the window.
    pub fn refresh(&mut self, now: Instant) {
        while let Some((t, ns)) = self.spent.front().copied() {
            if now.saturating_duration_since(t) <= self.window {
                break;
            }
            self.spent.pop_front();
            self.spent_ns = self.spent_ns.saturating_sub(ns);
        }
    }

    /// CPU-seconds per second the refills may average.
    pub fn per_sec(&self) -> f64 {
        self.per_sec
    }

    /// CPU-seconds the refills took in the window.
    pub fn spent_secs(&self) -> f64 {
        self.spent_ns as f64 / 1e9
    }

    /// Whether pools may grow past their floors: a budget is set and the window's
    /// refills stayed within it.
    pub fn allows_growth(&self) -> bool {
        self.per_sec > 0.0 && self.spent_secs() <= self.per_sec * self.window.as_secs_f64()
    }

    /// How far back arrivals and refill CPU count.
    pub fn window(&self) -> Duration {
        self.window
    }
}

/// A pool's size now: the burst it saw, between its floor and its ceiling, or its
/// floor while growth is not allowed.
pub fn size(floor: usize, ceiling: usize, peak: usize, growth: bool) -> usize {
    if growth {
        peak.clamp(floor, ceiling.max(floor))
    } else {
        floor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const M: Duration = Duration::from_secs(60);

    #[test]
    fn the_peak_is_the_largest_burst_within_a_span_of_the_last_minute() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        assert_eq!((d.peak(), d.recent(), d.last()), (0, 0, None));
        // Four at once, then one every 2 s.
        for _ in 0..4 {
            d.arrive(t0, S, M);
        }
        assert_eq!(d.peak(), 4);
        for i in 1..=10 {
            d.arrive(t0 + 2 * i * S, S, M);
        }
        assert_eq!((d.peak(), d.recent()), (4, 14));
        // The span is the refill time when longer than a second: 2.5 s holds the
        // burst and the first steady one.
        d.refresh(t0 + 20 * S, Duration::from_millis(2500), M);
        assert_eq!(d.peak(), 5);
        // A minute after the burst it no longer counts: the steady ones, 1 per span.
        d.refresh(t0 + 61 * S, S, M);
        assert_eq!((d.peak(), d.recent()), (1, 10));
        d.refresh(t0 + 200 * S, S, M);
        assert_eq!((d.peak(), d.recent(), d.last()), (0, 0, None));
    }

    #[test]
    fn arrivals_kept_are_bounded() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        for i in 0..5000u32 {
            d.arrive(t0 + Duration::from_micros(u64::from(i)), S, M);
        }
        assert_eq!((d.recent(), d.peak()), (KEPT, KEPT));
    }

    #[test]
    fn growth_stops_above_the_budget_and_resumes_when_the_minute_has_passed() {
        let t0 = Instant::now();
        let mut b = Budget::new(0.5, M); // 30 CPU-s a minute
        assert!(b.allows_growth());
        for i in 0..200 {
            b.spend(t0 + Duration::from_millis(250 * i), 150_000_000); // 0.15 CPU-s each
        }
        // 200 × 0.15 = 30 CPU-s within 50 s: at the budget, still allowed.
        assert!((b.spent_secs() - 30.0).abs() < 1e-9);
        assert!(b.allows_growth());
        b.spend(t0 + Duration::from_millis(50_000), 1);
        assert!(!b.allows_growth(), "one nanosecond over");
        b.refresh(t0 + Duration::from_secs(111));
        assert!(b.allows_growth());
        assert_eq!(b.spent_secs(), 0.0);
        assert!(!Budget::new(0.0, M).allows_growth(), "no budget: no growth");
    }

    #[test]
    fn size_is_the_burst_between_floor_and_ceiling() {
        assert_eq!(size(1, 4, 0, true), 1);
        assert_eq!(size(1, 4, 3, true), 3);
        assert_eq!(size(1, 4, 9, true), 4);
        assert_eq!(size(1, 4, 9, false), 1);
        // A ceiling under the floor is the floor.
        assert_eq!(size(3, 2, 9, true), 3);
    }
}

//! A hashed timer wheel for the reactor's deadlines (head, idle, wall time, TTL).
//!
//! Ticks are `TICK` long; an entry lands in slot `deadline_tick % SLOTS` and fires
//! when the wheel's cursor passes it in the right round. Cancellation is lazy: the
//! owner keeps a generation number and ignores fires whose generation is stale.
//! Runs on the reactor thread only.

use std::time::{Duration, Instant};

/// Resolution of the wheel.
pub const TICK: Duration = Duration::from_millis(5);
const SLOTS: usize = 1024;

struct Entry<T> {
    deadline_tick: u64,
    value: T,
}

/// The wheel. `T` is what comes back when a deadline passes.
pub struct TimerWheel<T> {
    slots: Vec<Vec<Entry<T>>>,
    start: Instant,
    /// INVARIANT: every entry's `deadline_tick > cursor`.
    cursor: u64,
    len: usize,
}

impl<T> TimerWheel<T> {
    /// An empty wheel whose tick 0 is `now`.
    pub fn new(now: Instant) -> Self {
        TimerWheel {
            slots: (0..SLOTS).map(|_| Vec::new()).collect(),
            start: now,
            cursor: 0,
            len: 0,
        }
    }

    fn tick_of(&self, t: Instant) -> u64 {
        let nanos = t.saturating_duration_since(self.start).as_nanos();
        let tick = nanos.div_ceil(TICK.as_nanos());
        u64::try_from(tick).unwrap_or(u64::MAX)
    }

    /// Schedules `value` to come back from [`advance`](Self::advance) at or after `deadline`.
    pub fn insert(&mut self, deadline: Instant, value: T) {
        let tick = self.tick_of(deadline).max(self.cursor + 1);
        let slot = (tick % SLOTS as u64) as usize;
        self.slots[slot].push(Entry {
            deadline_tick: tick,
            value,
        });
        self.len += 1;
    }

    /// Number of pending entries, stale ones included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Moves the cursor to `now`, pushing every expired value into `out`.
    pub fn advance(&mut self, now: Instant, out: &mut Vec<T>) {
        let now_tick = self.tick_of(now).saturating_sub(1).max(self.cursor);
        if self.len == 0 {
            self.cursor = now_tick;
            return;
        }
        if now_tick - self.cursor >= SLOTS as u64 {
            // A long jump: sweep every slot once instead of walking tick by tick.
            for slot in &mut self.slots {
                Self::drain_due(slot, now_tick, out, &mut self.len);
            }
        } else {
            while self.cursor < now_tick {
                self.cursor += 1;
                let slot = (self.cursor % SLOTS as u64) as usize;
                Self::drain_due(&mut self.slots[slot], self.cursor, out, &mut self.len);
            }
        }
        self.cursor = now_tick;
    }

    fn drain_due(slot: &mut Vec<Entry<T>>, upto: u64, out: &mut Vec<T>, len: &mut usize) {
        let mut i = 0;
        while i < slot.len() {
            if slot[i].deadline_tick <= upto {
                out.push(slot.swap_remove(i).value);
                *len -= 1;
            } else {
                i += 1;
            }
        }
        // Give memory back after a burst. Every slot is drained each time the cursor
        // passes it (every `SLOTS` ticks), so no slot keeps more than twice what it
        // holds, whatever it held once: kept capacity would ratchet up slot by slot as
        // each one sees its own worst moment, and a daemon's memory with it.
        if slot.capacity() > 4 && slot.len() < slot.capacity() / 2 {
            slot.shrink_to(slot.len().max(4));
        }
    }

    /// How long the reactor may sleep before the next slot that holds anything.
    pub fn next_timeout(&self, now: Instant) -> Option<Duration> {
        if self.len == 0 {
            return None;
        }
        let first = (1..=SLOTS as u64)
            .find(|k| !self.slots[((self.cursor + k) % SLOTS as u64) as usize].is_empty())
            .map(|k| self.cursor + k)?;
        let due = self.start + TICK * u32::try_from(first).unwrap_or(u32::MAX);
        Some(due.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_fires_in_deadline_order_and_not_early() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0);
        w.insert(t0 + Duration::from_millis(50), 2);
        w.insert(t0 + Duration::from_millis(10), 1);
        w.insert(t0 + Duration::from_secs(60), 3);
        let mut out = Vec::new();
        w.advance(t0 + Duration::from_millis(9), &mut out);
        assert!(out.is_empty());
        w.advance(t0 + Duration::from_millis(11), &mut out);
        assert_eq!(out, vec![1]);
        w.advance(t0 + Duration::from_millis(55), &mut out);
        assert_eq!(out, vec![1, 2]);
        assert_eq!(w.len(), 1);
        // Beyond one revolution, found by the full sweep.
        w.advance(t0 + Duration::from_secs(61), &mut out);
        assert_eq!(out, vec![1, 2, 3]);
        assert!(w.is_empty());
    }

    #[test]
    fn test_next_timeout_points_at_first_entry() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0);
        assert_eq!(w.next_timeout(t0), None);
        w.insert(t0 + Duration::from_millis(100), ());
        let d = w.next_timeout(t0).unwrap();
        assert!(
            d >= Duration::from_millis(95) && d <= Duration::from_millis(105),
            "{d:?}"
        );
    }

    #[test]
    fn test_later_round_in_same_slot_does_not_fire_early() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0);
        let one_rev = TICK * SLOTS as u32;
        w.insert(t0 + one_rev + Duration::from_millis(10), 1);
        let mut out = Vec::new();
        w.advance(t0 + Duration::from_millis(20), &mut out);
        assert!(out.is_empty());
        w.advance(t0 + one_rev + Duration::from_millis(20), &mut out);
        assert_eq!(out, vec![1]);
    }

    #[test]
    fn test_slots_give_their_memory_back_after_a_burst() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0);
        // A burst: 20 000 deadlines a minute out (what 20 000 closed connections' idle
        // timers leave behind), ~12 rounds deep in every slot.
        for i in 0..20_000u64 {
            w.insert(t0 + Duration::from_secs(60) + TICK * (i % 4096) as u32, i);
        }
        let held = |w: &TimerWheel<u64>| w.slots.iter().map(Vec::capacity).sum::<usize>();
        assert!(held(&w) >= 20_000);
        let mut out = Vec::new();
        w.advance(t0 + Duration::from_secs(90), &mut out);
        assert_eq!(out.len(), 20_000);
        // Once they fired, every slot holds at most its floor again, not its high water.
        assert!(w.slots.iter().all(|s| s.capacity() <= 4), "{}", held(&w));
        // And a half-drained slot keeps at most twice what it holds.
        for i in 0..64u64 {
            w.insert(
                t0 + Duration::from_secs(91) + TICK * SLOTS as u32 * (i % 2) as u32,
                i,
            );
        }
        w.advance(t0 + Duration::from_secs(91) + TICK, &mut out);
        assert!(
            w.slots.iter().all(|s| s.capacity() <= (2 * s.len()).max(4)),
            "{}",
            held(&w)
        );
    }
}

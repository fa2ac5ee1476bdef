//! Slots: the bounded counts of what runs at once. Execution slots
//! (`ISOBOX_MAX_CONCURRENT`) are held by every run and every kernel step from its start
//! until its result is out; kernel slots (`ISOBOX_KERNELS_MAX`) by a kernel session's
//! interpreter from its create until it ends. Whether one may be taken now is decided
//! by [`Slots::refusal`], the one place that says 503 or 429 for them; a handler may
//! ask early (to spare the pool a job that could not start), and the daemon asks again
//! where it takes the slot, since another request may have taken the last one since.
//! Reactor thread only.

use crate::http::Response;

/// What the slots are for (it decides the refusal's words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// Running executions and kernel steps.
    Execution,
    /// Live kernels.
    Kernel,
}

/// A bounded count of slots in use.
#[derive(Debug)]
pub struct Slots {
    kind: SlotKind,
    max: usize,
    /// INVARIANT: `used <= max` whenever every take followed a `refusal` of `None`.
    used: usize,
    rejections: u64,
}

impl Slots {
    /// `max` slots for `kind`, none in use.
    pub fn new(kind: SlotKind, max: usize) -> Slots {
        Slots {
            kind,
            max,
            used: 0,
            rejections: 0,
        }
    }

    /// Slots in use.
    pub fn used(&self) -> usize {
        self.used
    }

    /// How many there are.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Requests refused because every slot was taken.
    pub fn rejections(&self) -> u64 {
        self.rejections
    }

    /// What a request that needs a slot gets now, if it cannot have one: 503
    /// `shutting_down` once a shutdown began; for execution slots 429 `capacity`, for
    /// kernel slots 501 `kernels_disabled` when there are none and 429
    /// `too_many_kernels` when all are taken. A refusal for want of a slot is counted.
    pub fn refusal(&mut self, shutting_down: bool) -> Option<Response> {
        if shutting_down {
            return Some(
                Response::error(503, "shutting_down", Some("isoboxd is shutting down"))
                    .with_header("Retry-After", "5"),
            );
        }
        if self.kind == SlotKind::Kernel && self.max == 0 {
            return Some(Response::error(
                501,
                "kernels_disabled",
                Some("kernel sessions are disabled on this server (ISOBOX_KERNELS_MAX=0)"),
            ));
        }
        if self.used < self.max {
            return None;
        }
        self.rejections += 1;
        Some(match self.kind {
            SlotKind::Execution => Response::error(429, "capacity", Some("no free execution slot"))
                .with_header("Retry-After", "1"),
            SlotKind::Kernel => Response::error(
                429,
                "too_many_kernels",
                Some(&format!(
                    "all {} kernel slots are in use; delete a kernel session or retry later",
                    self.max
                )),
            )
            .with_header("Retry-After", "5"),
        })
    }

    /// Takes a slot (after a `refusal` of `None`).
    pub fn take(&mut self) {
        debug_assert!(self.used < self.max, "a slot taken without a free one");
        self.used += 1;
    }

    /// Gives a slot back.
    pub fn give_back(&mut self) {
        debug_assert!(self.used > 0, "a slot given back that was not taken");
        self.used = self.used.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_execution_slots_below_at_and_above_the_cap() {
        let mut s = Slots::new(SlotKind::Execution, 2);
        assert!(s.refusal(false).is_none());
        s.take();
        assert!(s.refusal(false).is_none());
        s.take();
        let r = s.refusal(false).expect("full");
        assert_eq!(r.status, 429);
        assert_eq!(s.rejections(), 1);
        s.give_back();
        assert!(s.refusal(false).is_none());
        assert_eq!(s.used(), 1);
        // A shutdown refuses with 503 and is not a capacity rejection.
        assert_eq!(s.refusal(true).expect("stopping").status, 503);
        assert_eq!(s.rejections(), 1);
    }

    #[test]
    fn test_kernel_slots_none_one_and_full() {
        let mut off = Slots::new(SlotKind::Kernel, 0);
        assert_eq!(off.refusal(false).expect("off").status, 501);
        assert_eq!(off.rejections(), 0);
        let mut s = Slots::new(SlotKind::Kernel, 1);
        assert!(s.refusal(false).is_none());
        s.take();
        let r = s.refusal(false).expect("full");
        assert_eq!(r.status, 429);
        assert!(std::str::from_utf8(&r.body)
            .unwrap()
            .contains("too_many_kernels"));
        s.give_back();
        assert_eq!(s.used(), 0);
        assert!(s.refusal(false).is_none());
    }
}

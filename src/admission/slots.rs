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

/// What a kernel create may do now ([`KernelSlots::admit`]).
#[derive(Debug)]
pub enum KernelAdmission {
    /// A slot is free: take it.
    Free,
    /// Every slot is taken, but the kernel of this serial has been idle the longest,
    /// past the eviction age: end it (its slot is given back at once) and take its slot.
    Evict(u64),
    /// The answer to send.
    Refused(Response),
}

/// Who holds a kernel slot.
#[derive(Debug)]
struct Holder {
    tenant: String,
    client: Option<std::net::IpAddr>,
    /// Since when it has run no step (`None`: booting or in a step).
    idle_since: Option<std::time::Instant>,
}

/// The kernel slots and who holds them, so that no one client or tenant can hoard the
/// pool: each may hold at most its share, and when the pool is full a kernel idle
/// longer than the eviction age makes room for a new one (the longest idle first).
/// Reactor thread only.
#[derive(Debug)]
pub struct KernelSlots {
    slots: Slots,
    holders: std::collections::BTreeMap<u64, Holder>,
    per_client: usize,
    per_tenant: usize,
    evict_idle: std::time::Duration,
}

impl KernelSlots {
    /// `max` kernel slots, at most `per_client` per client address and `per_tenant`
    /// per tenant other than [`super::PUBLIC_TENANT`]; idle `evict_idle` makes a
    /// kernel evictable when the pool is full.
    pub fn new(
        max: usize,
        per_client: usize,
        per_tenant: usize,
        evict_idle: std::time::Duration,
    ) -> KernelSlots {
        KernelSlots {
            slots: Slots::new(SlotKind::Kernel, max),
            holders: std::collections::BTreeMap::new(),
            per_client,
            per_tenant,
            evict_idle,
        }
    }

    /// Slots in use.
    pub fn used(&self) -> usize {
        self.slots.used()
    }

    /// How many there are.
    pub fn max(&self) -> usize {
        self.slots.max()
    }

    /// Creates refused for want of a slot or over a share.
    pub fn rejections(&self) -> u64 {
        self.slots.rejections()
    }

    /// Whether a kernel for `tenant` from `client` (unknown: not checked yet, as a
    /// handler asks early) may start now, and how.
    pub fn admit(
        &mut self,
        tenant: &str,
        client: Option<std::net::IpAddr>,
        shutting_down: bool,
        now: std::time::Instant,
    ) -> KernelAdmission {
        if shutting_down || self.slots.max() == 0 {
            return self
                .slots
                .refusal(shutting_down)
                .map_or(KernelAdmission::Free, KernelAdmission::Refused);
        }
        let share = |n: usize, who: &str, setting: &str| {
            KernelAdmission::Refused(
                Response::error(
                    429,
                    "too_many_kernels",
                    Some(&format!(
                        "{who} holds {n} kernel sessions, its most ({setting}); delete one first"
                    )),
                )
                .with_header("Retry-After", "5"),
            )
        };
        if let Some(c) = client {
            let n = self
                .holders
                .values()
                .filter(|h| h.client == Some(c))
                .count();
            if n >= self.per_client {
                self.slots.rejections += 1;
                return share(n, "this client address", "ISOBOX_KERNELS_PER_CLIENT");
            }
        }
        if tenant != super::PUBLIC_TENANT {
            let n = self.holders.values().filter(|h| h.tenant == tenant).count();
            if n >= self.per_tenant {
                self.slots.rejections += 1;
                return share(n, "this API key", "ISOBOX_KERNELS_PER_TENANT");
            }
        }
        if self.slots.used() < self.slots.max() {
            return KernelAdmission::Free;
        }
        let longest_idle = self
            .holders
            .iter()
            .filter_map(|(s, h)| h.idle_since.map(|t| (t, *s)))
            .min();
        match longest_idle {
            Some((since, serial)) if now.saturating_duration_since(since) >= self.evict_idle => {
                KernelAdmission::Evict(serial)
            }
            _ => self
                .slots
                .refusal(false)
                .map_or(KernelAdmission::Free, KernelAdmission::Refused),
        }
    }

    /// Takes a slot for kernel `serial` (after [`admit`](Self::admit) said `Free`, or
    /// after the evicted kernel's [`give_back`](Self::give_back)).
    pub fn take(&mut self, serial: u64, tenant: &str, client: Option<std::net::IpAddr>) {
        self.slots.take();
        self.holders.insert(
            serial,
            Holder {
                tenant: tenant.to_string(),
                client,
                idle_since: None,
            },
        );
    }

    /// Gives back kernel `serial`'s slot; again (an evicted kernel's end) does nothing.
    pub fn give_back(&mut self, serial: u64) {
        if self.holders.remove(&serial).is_some() {
            self.slots.give_back();
        }
    }

    /// Kernel `serial` waits for a step since `now`.
    pub fn idle(&mut self, serial: u64, now: std::time::Instant) {
        if let Some(h) = self.holders.get_mut(&serial) {
            h.idle_since = Some(now);
        }
    }

    /// Kernel `serial` runs a step.
    pub fn busy(&mut self, serial: u64) {
        if let Some(h) = self.holders.get_mut(&serial) {
            h.idle_since = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_kernel_shares_and_eviction_of_the_longest_idle() {
        use std::net::{IpAddr, Ipv4Addr};
        use std::time::{Duration, Instant};
        let (a, b) = (
            Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
            Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))),
        );
        let t0 = Instant::now();
        let mut k = KernelSlots::new(3, 2, 2, Duration::from_secs(60));
        let free = |k: &mut KernelSlots, tenant: &str, c, at| {
            matches!(k.admit(tenant, c, false, at), KernelAdmission::Free)
        };
        assert!(free(&mut k, "public", a, t0));
        k.take(1, "public", a);
        assert!(free(&mut k, "public", a, t0));
        k.take(2, "public", a);
        // Client a is at its share (2): refused, though a slot is free; b is not.
        match k.admit("public", a, false, t0) {
            KernelAdmission::Refused(r) => {
                assert_eq!(r.status, 429);
                let body = String::from_utf8(r.body).unwrap();
                assert!(body.contains("ISOBOX_KERNELS_PER_CLIENT"), "{body}");
            }
            other => panic!("{other:?}"),
        }
        // Unknown client (the early check): only the pool and the tenant count.
        assert!(free(&mut k, "public", None, t0));
        assert!(free(&mut k, "public", b, t0));
        k.take(3, "key-x", b);
        // A tenant's share counts across addresses; the public tenant has none.
        let mut k2 = KernelSlots::new(4, 4, 1, Duration::from_secs(60));
        k2.take(7, "key-x", a);
        assert!(matches!(
            k2.admit("key-x", b, false, t0),
            KernelAdmission::Refused(_)
        ));
        assert!(free(&mut k2, "key-y", b, t0));
        // Full, nothing idle long enough: 429 too_many_kernels.
        k.idle(1, t0);
        k.idle(3, t0 + Duration::from_secs(10));
        let c = Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)));
        assert!(matches!(
            k.admit("public", c, false, t0 + Duration::from_secs(59)),
            KernelAdmission::Refused(_)
        ));
        // At the eviction age the longest idle goes (1, not 3); a busy one never.
        k.busy(3);
        match k.admit("public", c, false, t0 + Duration::from_secs(60)) {
            KernelAdmission::Evict(s) => assert_eq!(s, 1),
            other => panic!("{other:?}"),
        }
        k.give_back(1);
        k.give_back(1);
        assert_eq!(k.used(), 2);
        assert!(free(&mut k, "public", c, t0));
        // Shutting down is 503 whatever the shares.
        match k.admit("public", c, true, t0) {
            KernelAdmission::Refused(r) => assert_eq!(r.status, 503),
            other => panic!("{other:?}"),
        }
        assert_eq!(k.rejections(), 2);
    }

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

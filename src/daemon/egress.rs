//! Egress checks on the event loop: the netlink socket that announces nftables
//! changes, and the checks (and repairs) it, SIGHUP and a periodic timer ask for, run on
//! the pool one at a time. What a check does is `netfilter::Egress`'s.

use super::Daemon;
use crate::reactor::{Addr, Component, ComponentId, Done, Readiness};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The egress component: its one source is the nftables change monitor.
pub(crate) const EGRESS: ComponentId = ComponentId(6);
/// The monitor socket.
const MONITOR: u16 = 0;

/// Egress checks on the loop.
pub(crate) struct EgressChecks;

impl Component<Daemon> for EgressChecks {
    fn name(&self) -> &'static str {
        "egress"
    }

    fn ready(&self, d: &mut Daemon, _: usize, what: u16, _: Readiness) {
        if what != MONITOR {
            return;
        }
        if let Some(m) = &d.egress.monitor {
            let mut buf = [0u8; 8192];
            while m.recv(&mut buf).is_ok() {}
        }
        d.egress.dirty = true;
        d.start_egress_check(false);
    }

    fn timer(&self, _: &mut Daemon, _: usize, _: u16, _: u64) {}
}

/// Where the checks stand.
pub(crate) struct Checks {
    /// A check is queued or running.
    running: bool,
    /// A ruleset change was announced while a check ran: check again after it.
    dirty: bool,
    /// A SIGHUP repair came while a check ran: program again after it.
    repair: bool,
    /// When the next periodic check (and repair) is due.
    next: Instant,
    /// Subscribed to nftables changes.
    monitor: Option<crate::sys::netlink::NlSocket>,
}

impl Checks {
    /// Subscribes to nftables changes (when egress is on) and registers the socket.
    pub(crate) fn new(
        egress: &crate::netfilter::Egress,
        verify_sec: u64,
        reactor: &mut crate::reactor::Reactor<Daemon>,
    ) -> std::io::Result<Checks> {
        let monitor = if egress.enabled() {
            match egress.monitor() {
                Ok(s) => {
                    reactor.register(
                        &mut mio::unix::SourceFd(&std::os::fd::AsRawFd::as_raw_fd(s.fd())),
                        Addr::new(EGRESS, 0, MONITOR),
                        mio::Interest::READABLE,
                    )?;
                    Some(s)
                }
                Err(e) => {
                    // Periodic checks still run; changes are only seen later.
                    log::warn!("egress: cannot subscribe to nftables changes: {e}");
                    None
                }
            }
        } else {
            log::info!("egress: off (ISOBOX_EGRESS=off); every run is offline");
            None
        };
        Ok(Checks {
            running: false,
            dirty: false,
            repair: false,
            next: Instant::now() + Duration::from_secs(verify_sec),
            monitor,
        })
    }

    /// Whether housekeeping should start a check now.
    pub(crate) fn due(&self, now: Instant) -> bool {
        now >= self.next || self.dirty
    }
}

impl Daemon {
    /// Queues an egress check on the pool: `repair` programs the table first (SIGHUP);
    /// the periodic check re-programs only a table found wrong; a netlink change only
    /// reads it back. One at a time; a change seen meanwhile is checked after.
    pub(crate) fn start_egress_check(&mut self, repair: bool) {
        if !self.app.egress.enabled() || self.app.shutting_down {
            return;
        }
        let checks = &mut self.egress;
        if checks.running {
            checks.repair |= repair;
            checks.dirty = true;
            return;
        }
        let repair = repair || std::mem::take(&mut checks.repair);
        let now = Instant::now();
        let periodic = now >= checks.next;
        let egress = Arc::clone(&self.app.egress);
        let job = Box::new(move || -> Done<Daemon> {
            if repair {
                egress.program_and_verify();
            } else if periodic {
                egress.tick();
            } else {
                egress.verify();
            }
            Box::new(|d: &mut Daemon| d.egress_checked())
        });
        if self.reactor.submit(job).is_ok() {
            let checks = &mut self.egress;
            checks.running = true;
            checks.dirty = false;
            if periodic || repair {
                checks.next = now + Duration::from_secs(self.cfg.egress.verify_sec);
            }
        }
    }

    fn egress_checked(&mut self) {
        self.egress.running = false;
        self.app.metrics.egress_checks += 1;
        if matches!(
            self.app.egress.state(),
            crate::netfilter::State::Unverified(_)
        ) {
            self.app.metrics.egress_check_failures += 1;
        }
        self.warm_purge_stale();
        if self.egress.dirty {
            self.start_egress_check(false);
        }
    }
}

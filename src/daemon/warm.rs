//! The warm pool on the event loop: publishing its figures, refilling it, taking a
//! pooled sandbox for a run and giving back or purging what is stale. The pool itself
//! (what may be pooled, booting and claiming a sandbox) is `sandbox::warm`.

use super::Daemon;
use crate::reactor::Done;
use crate::sandbox::plan::ExecPlan;
use crate::sandbox::warm::{eligible, pool_of, WarmError, NET_SUFFIX, RETRY_AFTER_FAILURE};
use crate::sandbox::Spawned;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

impl Daemon {
    /// Publishes the pool's figures for `/healthz`.
    pub(crate) fn warm_publish(&mut self) {
        self.app.warm = self.warm.enabled().then(|| crate::api::WarmFigures {
            runtimes: self
                .warm
                .occupancy()
                .into_iter()
                .map(|o| {
                    (
                        o.pool,
                        crate::api::WarmPoolRuntime {
                            ready: o.ready,
                            target: o.target,
                            min: o.min,
                            max: o.max,
                            arrivals: o.arrivals,
                        },
                    )
                })
                .collect(),
            hits: self.warm.hits,
            misses: self.warm.misses,
            refills: self.warm.refills,
            refill_cpu_seconds: crate::api::cpu_seconds(self.warm.refill_cpu_ns),
            failures: self.warm.failures,
            exit_reports: self.warm.exit_reports,
            shrunk: self.warm.shrunk,
            refill_cpu_budget: self.warm.budget.per_sec(),
            refill_cpu_last_minute: self.warm.budget.spent_secs(),
            growth: self.warm.budget.allows_growth(),
        });
    }

    /// Once a second: the pools' demand and budget move on; a pool that shrank and sat
    /// idle for a minute gives back what it holds above its size.
    pub(crate) fn warm_upkeep(&mut self, now: Instant) {
        if !self.warm.enabled() {
            return;
        }
        self.warm.tick(now);
        let excess = self.warm.take_excess(now);
        for s in excess {
            let backend = Arc::clone(&self.backend);
            self.reactor.submit_must(Box::new(move || {
                crate::sandbox::warm::discard(&*backend, s);
                super::nothing()
            }));
        }
        self.warm_publish();
    }

    /// Starts a background boot if a pool is below its target (one at a time): first
    /// any pool below its configured size, then one below what it grew to, so a grown
    /// pool never keeps another from its own size.
    pub(crate) fn warm_fill(&mut self) {
        if self.app.shutting_down
            || !self.warm.enabled()
            || self.warm.booting.is_some()
            || self.app.probe != crate::api::ProbeState::Passed
        {
            return;
        }
        let now = Instant::now();
        let may = |o: &crate::sandbox::warm::Occupancy| {
            self.warm.retry_at.get(&o.pool).is_none_or(|t| now >= *t)
                // A networked sandbox only while egress is verified.
                && (!o.pool.ends_with(NET_SUFFIX)
                    || self.backend.egress().is_some_and(|e| e.verified()))
        };
        let pools = self.warm.occupancy();
        let next = pools
            .iter()
            .find(|o| o.ready < o.min && may(o))
            .or_else(|| pools.iter().find(|o| o.ready < o.target && may(o)));
        let Some(lang) = next.map(|o| o.pool.clone()) else {
            return;
        };
        let network = lang.ends_with(NET_SUFFIX);
        let runtime = lang.strip_suffix(NET_SUFFIX).unwrap_or(&lang);
        let Some(rt) = self.app.runtimes.resolve(runtime).cloned() else {
            return;
        };
        self.warm.serial += 1;
        let id = self.container_id("w", self.warm.serial);
        let backend = Arc::clone(&self.backend);
        let job_lang = lang.clone();
        let job = Box::new(move || -> Done<Daemon> {
            let result = crate::sandbox::warm::boot(&*backend, &id, rt, network).map(|s| {
                // What the boot cost, up to its harness's ready: the refill's CPU.
                let cpu = s.cgroup.usage().cpu_ns;
                (Box::new(s), cpu)
            });
            Box::new(move |d: &mut Daemon| d.warm_booted(job_lang, result))
        });
        if self.reactor.submit(job).is_ok() {
            self.warm.booting = Some(lang);
            self.warm.boot_started = Some(now);
        }
        self.warm_publish();
    }

    pub(crate) fn warm_booted(
        &mut self,
        runtime: String,
        result: Result<(Box<Spawned>, u64), WarmError>,
    ) {
        self.warm.booting = None;
        let cpu = result.as_ref().ok().map(|(_, cpu)| *cpu);
        self.warm.boot_ended(Instant::now(), cpu);
        match result {
            Ok((s, cpu_ns)) if !self.app.shutting_down && self.warm.target(&runtime) > 0 => {
                self.warm.refills += 1;
                self.warm.refill_cpu_ns = self.warm.refill_cpu_ns.saturating_add(cpu_ns);
                self.warm.ready.entry(runtime).or_default().push_back(s);
            }
            Ok((s, _)) => {
                let backend = Arc::clone(&self.backend);
                self.reactor.submit_must(Box::new(move || {
                    crate::sandbox::warm::discard(&*backend, *s);
                    super::nothing()
                }));
            }
            Err(e) => {
                self.warm.failures += 1;
                crate::warn_limited!("warm pool: booting a {runtime} sandbox failed: {e}");
                self.warm
                    .retry_at
                    .insert(runtime, Instant::now() + RETRY_AFTER_FAILURE);
            }
        }
        self.warm_publish();
        self.warm_fill();
    }

    /// A pooled sandbox for `plan`, if one may serve it; counts hits and misses.
    pub(crate) fn warm_take(&mut self, plan: &ExecPlan) -> Option<Box<Spawned>> {
        let lang = &plan.runtime.desc.language;
        // The pool holds the language's default version: a run that pins another goes
        // cold.
        if self.warm.target(lang) == 0
            || !eligible(plan)
            || !self.app.runtimes.is_default(&plan.runtime)
        {
            return None;
        }
        // The run gets network only if egress is verified now (as a cold run would);
        // then only a networked sandbox whose link no failed check has cut will do.
        let egress = self.backend.egress().cloned();
        let networked = plan.network_requested && egress.as_ref().is_some_and(|e| e.verified());
        let key = if networked {
            format!("{lang}{NET_SUFFIX}")
        } else {
            lang.clone()
        };
        self.warm.arrive(&key, Instant::now());
        let mut s = None;
        let mut stale = Vec::new();
        while let Some(c) = self.warm.ready.get_mut(&key).and_then(VecDeque::pop_front) {
            if !networked || egress.as_ref().is_some_and(|e| e.cuts() == c.net_cuts) {
                s = Some(c);
                break;
            }
            stale.push(c);
        }
        for c in stale {
            let backend = Arc::clone(&self.backend);
            self.reactor.submit_must(Box::new(move || {
                crate::sandbox::warm::discard(&*backend, *c);
                super::nothing()
            }));
        }
        if s.is_some() {
            self.warm.hits += 1;
        } else {
            self.warm.misses += 1;
        }
        self.warm_publish();
        s
    }

    /// Puts back a sandbox taken for a run that could not be queued.
    pub(crate) fn warm_put_back(&mut self, s: Box<Spawned>, runtime: &str) {
        self.warm.hits = self.warm.hits.saturating_sub(1);
        let key = pool_of(&s, runtime);
        self.warm.ready.entry(key).or_default().push_front(s);
        self.warm_publish();
    }

    /// Discards networked pooled sandboxes whose links a failed egress check cut (after
    /// every check), so the pool refills with working ones once egress is verified.
    pub(crate) fn warm_purge_stale(&mut self) {
        let Some(cuts) = self.backend.egress().map(|e| e.cuts()) else {
            return;
        };
        let mut stale = Vec::new();
        for (key, q) in self.warm.ready.iter_mut() {
            if key.ends_with(NET_SUFFIX) {
                let (keep, drop): (VecDeque<_>, VecDeque<_>) = std::mem::take(q)
                    .into_iter()
                    .partition(|s| s.net_cuts == cuts);
                *q = keep;
                stale.extend(drop);
            }
        }
        if stale.is_empty() {
            return;
        }
        for s in stale {
            let backend = Arc::clone(&self.backend);
            self.reactor.submit_must(Box::new(move || {
                crate::sandbox::warm::discard(&*backend, *s);
                super::nothing()
            }));
        }
        self.warm_publish();
        self.warm_fill();
    }

    /// Removes every pooled sandbox (shutdown).
    pub(crate) fn warm_drain(&mut self) {
        let all: Vec<Box<Spawned>> = self
            .warm
            .ready
            .values_mut()
            .flat_map(std::mem::take)
            .collect();
        for s in all {
            let backend = Arc::clone(&self.backend);
            self.reactor.submit_must(Box::new(move || {
                crate::sandbox::warm::discard(&*backend, *s);
                super::nothing()
            }));
        }
        self.warm_publish();
    }
}

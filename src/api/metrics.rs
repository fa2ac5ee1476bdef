//! `GET /metrics`: the daemon's figures in the Prometheus text exposition format.
//!
//! Served to clients on this host, and elsewhere only with `ISOBOX_METRICS_KEY`
//! (`admission::Class::Metrics`). Rendered on the reactor thread from what it keeps
//! anyway: nothing here reads a file or takes a lock but the store writer's counters.

use super::App;
use crate::http::Response;
use crate::metrics::Text;

/// The exposition format's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// isoboxd's own work around each sandbox, step by step (`sandbox::steps`).
fn sandbox_steps(t: &mut Text) {
    use crate::sandbox::steps::{Step, Totals, STEPS};
    let totals: Vec<(&str, Totals)> = Step::ALL
        .iter()
        .map(|&s| (s.label(), STEPS.totals(s)))
        .collect();
    // A family's name, help and value of a step's totals.
    type Family = (&'static str, &'static str, fn(&Totals) -> f64);
    let families: [Family; 3] = [
        (
            "isobox_sandbox_steps_total",
            "Steps isoboxd did around gVisor sandboxes (runs, session and kernel steps, long-lived and pooled sandboxes), by step: bundle_write, cgroup_create, network (a networked sandbox's lease; its release is not timed), spawn (runsc run forked and exec'd), reap, runsc_delete (only after a kill), state_files, bundle_remove, cgroup_remove (the removal after a failed start, and root image probes, are not counted).",
            |x| x.count as f64,
        ),
        (
            "isobox_sandbox_step_seconds_total",
            "Wall time of those steps, by step.",
            |x| x.wall_ns as f64 / 1e9,
        ),
        (
            "isobox_sandbox_step_cpu_seconds_total",
            "CPU time of the daemon's thread during those steps, by step (a spawn's is the parent's side of the fork; runsc's own CPU is the sandbox's).",
            |x| x.cpu_ns as f64 / 1e9,
        ),
    ];
    for (name, help, value) in families {
        t.family(name, "counter", help);
        for (l, x) in &totals {
            t.sample(name, &[("step", l)], value(x));
        }
    }
}

/// The whole exposition.
pub fn render(app: &App) -> String {
    let m = &app.metrics;
    let mut t = Text::default();
    t.family(
        "isobox_build_info",
        "gauge",
        "The isoboxd build (always 1).",
    );
    t.sample("isobox_build_info", &[("version", crate::VERSION)], 1);

    t.family(
        "isobox_runs_total",
        "counter",
        "Executions (runs, session steps, kernel steps) finished, by runtime and outcome: ok, error (non-zero exit or failed build), timeout, oom, truncated (output cut), cancelled (client left), failed (the sandbox did not start).",
    );
    for ((runtime, outcome), n) in &m.runs {
        t.sample(
            "isobox_runs_total",
            &[("runtime", runtime), ("outcome", outcome.label())],
            n,
        );
    }
    t.family(
        "isobox_run_duration_seconds",
        "histogram",
        "From an execution's admission (its slot taken) to its result, by runtime.",
    );
    for (runtime, h) in &m.run_seconds {
        t.histogram("isobox_run_duration_seconds", &[("runtime", runtime)], h);
    }
    t.family(
        "isobox_run_start_seconds",
        "histogram",
        "From an execution's admission to its program's start (after the build for compiled runtimes; a warm sandbox's claim), by runtime.",
    );
    for (runtime, h) in &m.start_seconds {
        t.histogram("isobox_run_start_seconds", &[("runtime", runtime)], h);
    }

    t.single(
        "isobox_slots_in_use",
        "gauge",
        "Execution slots held now (runs and kernel steps).",
        app.runs.used(),
    );
    t.single(
        "isobox_slots",
        "gauge",
        "Execution slots (ISOBOX_MAX_CONCURRENT).",
        app.runs.max(),
    );
    t.single(
        "isobox_capacity_rejections_total",
        "counter",
        "Requests refused with 429 capacity for want of a slot.",
        app.runs.rejections(),
    );
    t.single(
        "isobox_kernels_live",
        "gauge",
        "Kernel slots in use (kernels running, starting or being created).",
        app.kernels.used(),
    );
    t.single(
        "isobox_kernels",
        "gauge",
        "Kernel slots (ISOBOX_KERNELS_MAX; 0: kernel sessions off).",
        app.kernels.max(),
    );
    t.family(
        "isobox_sandboxes_live",
        "gauge",
        "Long-lived sandboxes (the /wbx face) now: owned by a tenant, or booted in the pool.",
    );
    t.sample(
        "isobox_sandboxes_live",
        &[("kind", "tenant")],
        m.sandboxes.0,
    );
    t.sample(
        "isobox_sandboxes_live",
        &[("kind", "pooled")],
        m.sandboxes.1,
    );
    t.single(
        "isobox_run_records",
        "gauge",
        "Records of streamed and detached runs kept for clients that reconnect.",
        m.records.0,
    );
    t.single(
        "isobox_run_record_bytes",
        "gauge",
        "Bytes those records count against ISOBOX_RUN_RETAIN_BYTES.",
        m.records.1,
    );

    warm_pools(app, &mut t);
    sandbox_steps(&mut t);

    t.family(
        "isobox_egress_state",
        "gauge",
        "Filtered egress: 1 for the current state (verified, unverified, off), 0 for the others.",
    );
    let now = match app.egress.state() {
        crate::netfilter::State::Off => "off",
        crate::netfilter::State::Verified => "verified",
        crate::netfilter::State::Unverified(_) => "unverified",
    };
    for s in ["verified", "unverified", "off"] {
        t.sample("isobox_egress_state", &[("state", s)], u8::from(s == now));
    }
    t.single(
        "isobox_egress_checks_total",
        "counter",
        "Checks of the nftables table and forwarding (periodic, on a change, on SIGHUP).",
        m.egress_checks,
    );
    t.single(
        "isobox_egress_check_failures_total",
        "counter",
        "Of which ended unverified (the table not as programmed, or forwarding off).",
        m.egress_check_failures,
    );

    t.family(
        "isobox_http_requests_total",
        "counter",
        "Responses to API requests by face (isobox, wbx), method, route (the route's path pattern; unmatched: no route) and status. Public-URL traffic is not counted here.",
    );
    for ((face, method, route, status), n) in &m.http {
        let status = status.to_string();
        t.sample(
            "isobox_http_requests_total",
            &[
                ("face", face),
                ("method", method),
                ("route", route),
                ("status", &status),
            ],
            n,
        );
    }
    t.single(
        "isobox_http_received_bytes_total",
        "counter",
        "Bytes read from API connections.",
        m.bytes_in,
    );
    t.single(
        "isobox_http_sent_bytes_total",
        "counter",
        "Bytes written to API connections.",
        m.bytes_out,
    );

    let (commits, writes, largest) = app.sessions.store().writer_stats();
    t.single(
        "isobox_store_commits_total",
        "counter",
        "State store commits (one write-ahead log sync each; concurrent writes share one).",
        commits,
    );
    t.single(
        "isobox_store_writes_total",
        "counter",
        "Writes those commits carried.",
        writes,
    );
    t.single(
        "isobox_store_largest_batch",
        "gauge",
        "The most writes one commit carried since start.",
        largest,
    );
    t.single(
        "isobox_store_checkpoints_total",
        "counter",
        "State store checkpoints (LMDB's data file synced, the write-ahead log started afresh).",
        app.sessions.store().checkpoints(),
    );
    t.single(
        "isobox_log_lines_suppressed_total",
        "counter",
        "Log lines a peer could cause that the rate limits dropped.",
        crate::log::suppressed(),
    );
    t.single(
        "process_open_fds",
        "gauge",
        "Open file descriptors of isoboxd (refreshed once a second).",
        app.process_figures.0,
    );
    t.single(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory of isoboxd (refreshed once a second).",
        app.process_figures.1,
    );
    t.finish()
}

fn warm_pools(app: &App, t: &mut Text) {
    let pool = app.warm.clone().unwrap_or_default();
    t.family(
        "isobox_warm_pool_ready",
        "gauge",
        "Pre-booted sandboxes waiting for a run, by runtime (ISOBOX_WARM_POOL).",
    );
    for (rt, w) in &pool.runtimes {
        t.sample("isobox_warm_pool_ready", &[("runtime", rt)], w.ready);
    }
    type Of = fn(&crate::api::WarmPoolRuntime) -> usize;
    let sizes: [(&str, &str, Of); 4] = [
        (
            "isobox_warm_pool_target",
            "What the pool refills to now: its largest burst of the last window, between its min and max, by runtime.",
            |w| w.target,
        ),
        (
            "isobox_warm_pool_min",
            "The pool's configured size (ISOBOX_WARM_POOL), by runtime.",
            |w| w.min,
        ),
        (
            "isobox_warm_pool_max",
            "The most the pool grows to (ISOBOX_WARM_POOL_MAX), by runtime.",
            |w| w.max,
        ),
        (
            "isobox_warm_pool_arrivals",
            "Runs the pool could serve that arrived in the last window, by runtime.",
            |w| w.arrivals,
        ),
    ];
    for (name, help, of) in sizes {
        t.family(name, "gauge", help);
        for (rt, w) in &pool.runtimes {
            t.sample(name, &[("runtime", rt)], of(w));
        }
    }
    for (name, help, v) in [
        (
            "isobox_warm_pool_hits_total",
            "Runs served by a pooled sandbox.",
            pool.hits,
        ),
        (
            "isobox_warm_pool_misses_total",
            "Runs of a pooled runtime that found its pool empty (they started cold).",
            pool.misses,
        ),
        (
            "isobox_warm_pool_refills_total",
            "Sandboxes booted into the pool.",
            pool.refills,
        ),
        (
            "isobox_warm_pool_failures_total",
            "Pool boots that failed.",
            pool.failures,
        ),
        (
            "isobox_warm_pool_shrunk_total",
            "Pooled sandboxes given back when their pool shrank and sat idle for a window.",
            pool.shrunk,
        ),
    ] {
        t.single(name, "counter", help, v);
    }
    t.single(
        "isobox_warm_pool_refill_cpu_seconds_total",
        "counter",
        "CPU-seconds the pool's boots took, each up to its interpreter's ready.",
        pool.refill_cpu_seconds,
    );
    t.single(
        "isobox_warm_pool_refill_cpu_budget",
        "gauge",
        "CPU-seconds per second refills may average over the window for pools to grow (ISOBOX_WARM_POOL_CPU).",
        pool.refill_cpu_budget,
    );
    t.single(
        "isobox_warm_pool_growth",
        "gauge",
        "1 while pools may grow past their min (the window's refills kept to the budget), else 0.",
        u8::from(pool.growth),
    );
    let wbx = app.wbx_warm.clone().unwrap_or_default();
    t.family(
        "isobox_wbx_warm_pool_ready",
        "gauge",
        "Long-lived sandboxes booted and waiting for a create, by template (ISOBOX_WBX_WARM_POOL).",
    );
    for (tpl, w) in &wbx.templates {
        t.sample("isobox_wbx_warm_pool_ready", &[("template", tpl)], w.ready);
    }
    t.family(
        "isobox_wbx_warm_pool_target",
        "gauge",
        "Configured pool size, by template.",
    );
    for (tpl, w) in &wbx.templates {
        t.sample(
            "isobox_wbx_warm_pool_target",
            &[("template", tpl)],
            w.target,
        );
    }
    for (name, help, v) in [
        (
            "isobox_wbx_warm_pool_hits_total",
            "Creates and jobs served by a pooled sandbox.",
            wbx.hits,
        ),
        (
            "isobox_wbx_warm_pool_misses_total",
            "Creates and jobs of a pooled template that found the pool empty.",
            wbx.misses,
        ),
        (
            "isobox_wbx_warm_pool_failures_total",
            "Pooled boots that failed.",
            wbx.failures,
        ),
    ] {
        t.single(name, "counter", help, v);
    }
    t.single(
        "isobox_wbx_warm_pool_refill_cpu_seconds_total",
        "counter",
        "CPU-seconds the pool's boots took, each up to its init's hello.",
        wbx.refill_cpu_seconds,
    );
}

/// `GET /metrics`.
pub fn metrics(app: &App) -> Response {
    Response::bytes(200, CONTENT_TYPE, render(app).into_bytes())
        .with_header("Cache-Control", "no-store")
}

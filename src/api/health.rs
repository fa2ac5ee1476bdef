//! `GET /healthz`, `GET /readyz`, `GET /runtimes`.

use super::{App, ProbeState};
use crate::http::Response;
use serde::Serialize;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Health<'a> {
    status: &'static str,
    version: &'static str,
    in_flight: usize,
    max_concurrent: usize,
    counters: CountersView<'a>,
    open_fds: usize,
    rss_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    heap: Option<Heap>,
    egress: serde_json::Value,
    store: StoreFigures,
    /// Kernel slot occupancy, when kernel sessions are enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    kernels: Option<Kernels>,
    /// Warm pool occupancy, hits and misses, when a pool is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    warm_pool: Option<&'a super::WarmFigures>,
    /// The WBX face's pool of ready sandboxes, when one is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    wbx_warm_pool: Option<&'a super::WbxWarmFigures>,
    /// The runtimes' root images: `off` with why, or where they are kept and each tree
    /// a cold run has asked for so far.
    root_images: serde_json::Value,
}

/// The run counters, then the capacity rejections the execution slots keep.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CountersView<'a> {
    #[serde(flatten)]
    runs: &'a super::Counters,
    /// Requests refused for lack of a slot.
    capacity_rejections: u64,
    /// Log lines the per-call-site and per-client limiters dropped (`log.rs`).
    log_lines_suppressed: u64,
}

/// The store writer's group commit since start.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StoreFigures {
    /// Commits (one log sync each).
    commits: u64,
    /// Writes they carried.
    writes: u64,
    /// The most writes one commit carried.
    largest_batch: u64,
    /// Checkpoints (LMDB's data file synced, the log started afresh).
    checkpoints: u64,
}

/// The allocator's own figures (`sys::alloc::heap_figures`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Heap {
    /// Bytes allocated and not yet freed.
    allocated_bytes: u64,
    /// Bytes of pages the allocator holds resident.
    resident_bytes: u64,
}

#[derive(Serialize)]
struct Kernels {
    used: usize,
    max: usize,
}

/// `{"state": "verified" | "unverified" | "off", "reason"?}`.
pub fn egress_json(app: &App) -> serde_json::Value {
    use crate::netfilter::State;
    match app.egress.state() {
        State::Off => serde_json::json!({"state": "off"}),
        State::Verified => serde_json::json!({"state": "verified"}),
        State::Unverified(why) => serde_json::json!({"state": "unverified", "reason": why}),
    }
}

/// Liveness: always 200 while the loop turns, with slot and run figures.
pub fn healthz(app: &App) -> Response {
    let (commits, writes, largest_batch) = app.sessions.store().writer_stats();
    Response::json(
        200,
        &Health {
            status: "ok",
            version: crate::VERSION,
            in_flight: app.runs.used(),
            max_concurrent: app.runs.max(),
            counters: CountersView {
                runs: &app.counters,
                capacity_rejections: app.runs.rejections(),
                log_lines_suppressed: crate::log::suppressed(),
            },
            open_fds: app.process_figures.0,
            rss_bytes: app.process_figures.1,
            heap: app
                .process_figures
                .2
                .map(|(allocated_bytes, resident_bytes)| Heap {
                    allocated_bytes,
                    resident_bytes,
                }),
            egress: egress_json(app),
            store: StoreFigures {
                commits,
                writes,
                largest_batch,
                checkpoints: app.sessions.store().checkpoints(),
            },
            kernels: (app.kernels.max() > 0).then_some(Kernels {
                used: app.kernels.used(),
                max: app.kernels.max(),
            }),
            warm_pool: app.warm.as_ref(),
            wbx_warm_pool: app.wbx_warm.as_ref(),
            root_images: root_images_json(app),
        },
    )
}

/// `{"state": "on", "dir", "trees": {name: {"state": "ready" | "building" | "off",
/// "reason"?}}}`, or `{"state": "off", "reason"}`.
fn root_images_json(app: &App) -> serde_json::Value {
    match &app.root_images {
        Some(i) => serde_json::json!({"state": "on", "dir": i.dir(), "trees": i.states()}),
        None if !app.cfg.root_images => {
            serde_json::json!({"state": "off", "reason": "ISOBOX_ROOT_IMAGES=off"})
        }
        None => {
            serde_json::json!({"state": "off", "reason": "no /usr/bin/mkfs.erofs (erofs-utils), no isobox-start in this build, or not the gVisor backend"})
        }
    }
}

/// Why the daemon is not ready, or `None` when it is.
pub fn not_ready_reason(app: &App) -> Option<String> {
    if app.shutting_down {
        return Some("shutting down".into());
    }
    let Some(h) = &app.cgroups else {
        return Some(format!(
            "no usable cgroup hierarchy: {}",
            app.cgroup_error.as_deref().unwrap_or("unknown")
        ));
    };
    match h.slice_memory_limit(&app.cfg.instance) {
        None => {
            return Some(format!(
                "protective cgroup slice `{}` ({}) has no memory cap; restart isoboxd or write the cap back",
                app.cfg.instance,
                h.version()
            ))
        }
        Some(n) if n > app.cfg.slice_memory_bytes => {
            return Some(format!("protective slice memory cap is {n}, above the configured {}", app.cfg.slice_memory_bytes))
        }
        Some(_) => {}
    }
    match &app.probe {
        ProbeState::Pending => Some("backend self-probe has not finished yet".into()),
        ProbeState::Failed(why) => Some(format!("backend self-probe failed: {why}")),
        ProbeState::Passed => None,
    }
}

/// Readiness per the spec: slice capped and backend healthy.
pub fn readyz(app: &App) -> Response {
    match not_ready_reason(app) {
        // Unverified egress does not make the daemon unready: runs still work, offline,
        // and say so; the state is here for operators and monitors.
        None => Response::json(
            200,
            &serde_json::json!({"ready": true, "backend": "gvisor", "egress": egress_json(app)}),
        ),
        Some(reason) => Response::json(
            503,
            &serde_json::json!({"ready": false, "reason": reason, "egress": egress_json(app)}),
        ),
    }
}

#[derive(Serialize)]
struct RuntimeInfo<'a> {
    language: &'a str,
    version: &'a str,
    aliases: &'a [String],
    compiled: bool,
    backend: &'static str,
    /// Whether a request that names no version runs this one (an isobox extension: a
    /// language may have several versions).
    default: bool,
}

/// The installed runtimes.
pub fn runtimes(app: &App) -> Response {
    let list: Vec<RuntimeInfo<'_>> = app
        .runtimes
        .installed()
        .map(|r| RuntimeInfo {
            language: &r.desc.language,
            version: r.version.as_deref().unwrap_or(""),
            aliases: &r.desc.aliases,
            compiled: r.desc.compiled,
            backend: "gvisor",
            default: app.runtimes.is_default(r),
        })
        .collect();
    Response::json(200, &list)
}

//! isobox: an HTTP daemon that runs untrusted code in gVisor sandboxes.
//!
//! The crate is organised as DESIGN.md describes: one reactor thread owns every
//! socket, pipe, pidfd and timer; a small worker pool does the blocking work. Imports
//! run one way, from `daemon` down to `sys` (`docs/ARCHITECTURE.md`; `make
//! check-modules` fails on a circle).

#![deny(unsafe_op_in_unsafe_fn)]

/// API keys, rate limits, route classes, and the execution and kernel slots.
pub mod admission;
/// The server-side agent: tool-calling loops on threads of their own.
pub mod agent;
/// The isobox face: its route table, handlers and error bodies.
pub mod api;
/// cgroups v1 and v2: the protective slice and each run's cgroup.
pub mod cgroup;
/// `isoboxd check`: what is missing or wrong on this host.
pub mod check;
/// Settings from flags and `ISOBOX_*` variables (clap), checked once.
pub mod config;
/// The reactor's host: every component on the loop; the top of the import graph.
pub mod daemon;
/// The eryx face (`/eryx`): Python in WebAssembly, its route table and error bodies.
pub mod eryx;
/// Sans-IO HTTP/1.1: the connection state machine, parsing, bodies, responses, SSE, limits.
pub mod http;
/// Background jobs' pieces off the loop: sealed env values, redaction, patterns, money.
pub mod jobs;
/// Rate-limited logging macros.
pub mod log;
/// Figures for `GET /metrics` that nothing else keeps, and their text exposition.
pub mod metrics;
/// Filtered egress: nftables and rtnetlink over netlink, fail-closed.
pub mod netfilter;
/// The event loop, feature-free: poll, tokens and timers naming components, worker pool.
pub mod reactor;
/// Path matching over a face's route table.
pub mod router;
/// Language runtime descriptors and their root filesystems.
pub mod runtimes;
/// Sandboxes: plans and results, the backend trait and gVisor, warm pool, kernel protocol.
pub mod sandbox;
/// A string whose `Debug` never shows it.
pub mod secret;
/// LMDB state: sessions, KV, volumes.
pub mod store;
/// All raw libc and FFI.
pub mod sys;
/// The WebAssembly engine: a supervisor of the jailed `isobox-wasm` worker.
pub mod wasm;
/// The WBX face (`/wbx`): long-lived sandboxes and commands, its routes and errors.
pub mod wbx;
/// Webhook delivery: the outbox's thread, signed requests to public https targets only.
pub mod webhooks;
/// Sessions' workspaces and volumes, the confined file API, zip downloads.
pub mod workspace;

/// The build-stamped version (`ISOBOX_BUILD_VERSION` at compile time), or `dev`.
pub const VERSION: &str = match option_env!("ISOBOX_BUILD_VERSION") {
    Some(v) => v,
    None => "dev",
};

//! isobox: an HTTP daemon that runs untrusted code in gVisor sandboxes.
//!
//! The crate is organised as DESIGN.md describes: one reactor thread owns every
//! socket, pipe, pidfd and timer; a small worker pool does the blocking work.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod admission;
pub mod agent;
pub mod api;
pub mod cgroup;
pub mod config;
pub mod daemon;
pub mod http;
pub mod log;
pub mod netfilter;
pub mod reactor;
pub mod router;
pub mod runtimes;
pub mod sandbox;
pub mod secret;
pub mod store;
pub mod sys;
pub mod workspace;

/// The build-stamped version (`ISOBOX_BUILD_VERSION` at compile time), or `dev`.
pub const VERSION: &str = match option_env!("ISOBOX_BUILD_VERSION") {
    Some(v) => v,
    None => "dev",
};
